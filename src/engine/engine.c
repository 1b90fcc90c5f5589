/* engine/engine.c — the engine thread: takes submitted requests off a queue, drives the
 * serving loop (engine/scheduler.h) step after step, shuts down with a grace period, and
 * publishes stats and metrics for any thread to read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/timer.h"
#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "model/lora.h"
#include "engine/turns.h"
#include "text/tokenizer.h"

/* A call into the engine thread (engine_close_session, engine_flush_cache),
 * answered between two steps. */
struct engine_call {
    const char *session_id;    /* borrowed from the caller, who waits; NULL: a flush */
    int timeout_ms;            /* a flush's */
    int result;                /* blocks released, or -1; a flush's return code */
    struct err err;            /* a flush's */
    struct kv_tier_stats tier; /* a flush's counters as it answered */
    int (*fn)(void *ctx, struct err *err); /* engine_run's, else NULL */
    void *ctx;
    bool done;
    struct engine_call *next;
};

struct engine {
    const struct model *model;     /* borrowed */
    const struct tokenizer *tok;   /* borrowed */
    struct engine_config cfg;
    struct sched sched;            /* engine thread only, but for its counters */
    bool sched_ready;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu: */
    struct seq **incoming;         /* owned array; max_queue */
    int n_incoming;
    bool stopping;
    uint64_t stop_deadline_ns;
    struct engine_call *calls;     /* waiting for the engine thread */
    pthread_cond_t call_cv;        /* signalled when calls are answered */
    pthread_mutex_t stats_mu;      /* guards the snapshot below */
    struct kv_prefix_stats cache_pub;
    struct kv_tier_stats tier_pub;
    struct kv_tier_config tier_cfg; /* the caller's, fingerprint completed */
    struct ckpt_store *ckpt;        /* owned; generation checkpoints, or NULL */
    struct spec_config spec_cfg;    /* the caller's, copied (cfg.spec points here) */
    uint64_t kv_bytes_pub;
    size_t block_bytes;

    atomic_int n_running_pub;
    atomic_int n_free_blocks_pub;
    atomic_int state;              /* 0 idle, 1 running, 2 stopping */
    atomic_uint_fast64_t requests_refused;
    atomic_uint_fast64_t requests_rejected;
    atomic_int n_waiting_pub;
    struct engine_metrics metrics;
};

/* What other threads may read of the engine thread's state: the prefix
 * cache's counters and the KV the running sequences hold. */
static void publish_stats(struct engine *e)
{
    struct sched *sc = &e->sched;
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(sc->kv, &st);
    struct kv_tier_stats tier;
    kv_manager_tier_stats(sc->kv, &tier);
    int held = kv_manager_total_blocks(sc->kv) - kv_manager_free_blocks(sc->kv) -
               (int)st.unreferenced_blocks;
    pthread_mutex_lock(&e->stats_mu);
    e->cache_pub = st;
    e->tier_pub = tier;
    e->kv_bytes_pub = (uint64_t)held * e->block_bytes;
    pthread_mutex_unlock(&e->stats_mu);
    atomic_store(&e->n_running_pub, sc->n_running);
    atomic_store(&e->n_waiting_pub, sc->n_waiting);
    atomic_store(&e->n_free_blocks_pub, kv_manager_free_blocks(sc->kv));
}

/* Answers the calls taken off the queue; only this thread touches the cache. */
static void answer_calls(struct engine *e, struct engine_call *calls)
{
    for (struct engine_call *c = calls; c; c = c->next) {
        if (c->fn) {
            c->result = c->fn(c->ctx, &c->err);
            continue;
        }
        if (c->session_id) {
            c->result = kv_manager_close_session(e->sched.kv, c->session_id);
            continue;
        }
        c->result = kv_manager_tier_flush(e->sched.kv, c->timeout_ms, &c->err);
        kv_manager_tier_stats(e->sched.kv, &c->tier);
    }
    pthread_mutex_lock(&e->mu);
    for (struct engine_call *c = calls; c; c = c->next)
        c->done = true;
    pthread_cond_broadcast(&e->call_cv);
    pthread_mutex_unlock(&e->mu);
}

/* The identity the prefix cache's namespace starts from: what decides the
 * K/V a token gets, so that other weights (or another tokenizer's ids) never
 * find these blocks. config.json's fields, every tensor's name, type, shape
 * and place (the safetensors headers), the files' sizes, the tokenizer's size. */
static uint64_t model_digest(const struct model *m, const struct tokenizer *tok)
{
    uint64_t h = HASH_FNV_OFFSET;
#define MIX(v) (h = hash_fnv1a_word(h, (uint64_t)(v)))
    const struct model_config *c = &m->config;
    for (const char *p = c->arch_name; *p; p++)
        MIX((unsigned char)*p);
    int ints[] = {c->arch, c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers,
                  c->n_heads, c->n_kv_heads, c->head_dim, c->max_position_embeddings,
                  c->sliding_window, c->rope_scaling, c->rope_original_max_position,
                  c->tie_word_embeddings, c->attention_bias, c->qk_norm, c->torch_dtype};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        MIX((uint32_t)ints[i]);
    float floats[] = {c->rms_norm_eps, c->rope_theta, c->rope_factor, c->rope_low_freq_factor,
                      c->rope_high_freq_factor};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        uint32_t bits;
        memcpy(&bits, &floats[i], sizeof bits);
        MIX(bits);
    }
    for (int i = 0; i < m->files.n_tensors; i++) {
        const struct st_tensor *t = &m->files.tensors[i];
        for (const char *p = t->name; p && *p; p++)
            MIX((unsigned char)*p);
        MIX(t->dtype);
        for (int d = 0; d < t->n_dims; d++)
            MIX(t->shape[d]);
        MIX(t->offset);
        MIX(t->nbytes);
        MIX(t->file_index);
    }
    for (int i = 0; i < m->files.n_files; i++)
        MIX(m->files.map_lens ? m->files.map_lens[i] : 0);
    MIX(m->backend->mode);
    MIX(tok ? tok_vocab_size(tok) : 0);
#undef MIX
    return h;
}

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    struct sched *sc = &e->sched;
    bool cache_on = kv_manager_prefix_enabled(sc->kv);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && e->n_incoming == 0 && !e->calls && sched_idle(sc)) {
            atomic_store(&e->state, 0);
            if (!cache_on) {
                pthread_cond_wait(&e->cv, &e->mu);
                continue;
            }
            /* idle: cached blocks go to the SSD tier's queue, a slice at a time
             * while nothing else comes */
            pthread_mutex_unlock(&e->mu);
            kv_manager_tier_poll(sc->kv, true);
            bool more = kv_manager_tier_unsaved(sc->kv) > 0;
            pthread_mutex_lock(&e->mu);
            if (e->stopping || e->n_incoming > 0 || e->calls)
                break;
            if (more)
                continue;
            /* idle sessions expire even while no request comes */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&e->cv, &e->mu, &until);
            pthread_mutex_unlock(&e->mu);
            kv_manager_tick(sc->kv, now_ns());
            kv_manager_tier_poll(sc->kv, true);
            publish_stats(e);
            pthread_mutex_lock(&e->mu);
        }
        struct engine_call *calls = e->calls;
        e->calls = NULL;
        for (int i = 0; i < e->n_incoming; i++)
            if (!sched_enqueue(sc, e->incoming[i], false)) {
                atomic_fetch_sub(&sc->counters.n_queued, 1);
                sched_retire(sc, e->incoming[i], GEN_FINISH_ERROR, INFERD_ENOMEM,
                             "out of memory while queueing");
            }
        e->n_incoming = 0;
        bool stopping = e->stopping;
        bool past_deadline = stopping && now_ns() >= e->stop_deadline_ns;
        pthread_mutex_unlock(&e->mu);

        atomic_store(&e->state, stopping ? 2 : 1);
        kv_manager_tick(sc->kv, now_ns());
        kv_manager_tier_poll(sc->kv, sched_idle(sc));
        sched_drop_cancelled(sc, past_deadline);
        if (stopping && sched_idle(sc)) {
            if (calls)
                answer_calls(e, calls);
            break;
        }
        sched_admit(sc);
        struct err err = {0};
        device_turns_take(e->cfg.turns, DEVICE_TURNS_ENGINE);
        int ran = sched_step(sc, &err);
        device_turns_give(e->cfg.turns);
        if (ran < 0)
            log_error("engine: forward step failed: %s", err.msg);
        /* nothing could run: what runs waits for blocks read from disk */
        if (ran == 0 && kv_manager_tier_busy(sc->kv))
            kv_manager_tier_wait(sc->kv, 5);
        /* After the step, so that a request its caller saw finish has
         * published all it will (its last token is computed in this step). */
        if (calls)
            answer_calls(e, calls);
        publish_stats(e);
    }
    struct kv_tier_stats tier;
    kv_manager_tier_stats(sc->kv, &tier);
    if (tier.enabled) {
        /* what the cache holds goes to disk within the grace left (at least a second) */
        uint64_t now = now_ns();
        int left = e->stop_deadline_ns > now ? (int)((e->stop_deadline_ns - now) / 1000000ull) : 0;
        struct err err = {0};
        if (kv_manager_tier_flush(sc->kv, left > 1000 ? left : 1000, &err) < 0)
            log_warn("engine: the SSD tier's last flush: %s", err.msg);
    }
    publish_stats(e);
    return NULL;
}

void engine_free(struct engine *e)
{
    if (!e)
        return;
    engine_shutdown(e, 0);
    free(e->incoming);
    if (e->sched_ready)
        sched_free(&e->sched);
    ckpt_store_close(e->ckpt);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->call_cv);
    pthread_mutex_destroy(&e->stats_mu);
    free(e);
}

int engine_create(const struct model *m, const struct tokenizer *tok,
                  const struct engine_config *cfg, struct engine **out, struct err *err)
{
    if (cfg->n_ctx < 2 || cfg->max_seqs < 1 || cfg->max_step_tokens < cfg->max_seqs ||
        cfg->max_queue < 1)
        return err_set(err, INFERD_EINVAL,
                       "engine: context %d, sequences %d, step tokens %d (at least one per "
                       "sequence) and queue %d must be positive",
                       cfg->n_ctx, cfg->max_seqs, cfg->max_step_tokens, cfg->max_queue);
    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return err_set(err, INFERD_ENOMEM, "out of memory for the engine");
    e->model = m;
    e->tok = tok;
    e->cfg = *cfg;
    if (cfg->spec) {
        e->spec_cfg = *cfg->spec;
        e->cfg.spec = &e->spec_cfg;
    }
    /* A memory budget that binds is the context kept; one that does not is dropped. */
    if (cfg->budget_ctx > 0 && cfg->budget_ctx < cfg->n_ctx)
        e->cfg.n_ctx = cfg->budget_ctx;
    else
        e->cfg.budget_ctx = 0;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->call_cv, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    histogram_init_latency(&e->metrics.ttft);
    histogram_init_latency(&e->metrics.queue_time);
    histogram_init_latency(&e->metrics.prefill_time);
    histogram_init_latency(&e->metrics.inter_token);
    struct kv_format format = kv_format_of_backend(m->backend);
    int block_size = cfg->kv_block_size > 0 ? cfg->kv_block_size : KV_BLOCK_SIZE_DEFAULT;
    e->block_bytes = kv_format_bytes_per_block(&m->config, &format, block_size);
    struct sched_config sc = {
        .n_ctx = e->cfg.n_ctx, .max_seqs = cfg->max_seqs, .max_step_tokens = cfg->max_step_tokens,
        .kv_blocks = cfg->kv_blocks, .block_size = cfg->kv_block_size,
        .kv_budget_bytes = cfg->kv_budget_bytes,
        .spec = cfg->spec && cfg->spec->kind != SPEC_NONE ? &e->spec_cfg : NULL,
        .prefix = {.max_bytes = cfg->prompt_cache_bytes, .retention = cfg->cache_retention,
                   .model_digest = model_digest(m, tok),
                   .session_idle_ns = (uint64_t)(cfg->session_idle_s > 0 ? cfg->session_idle_s
                                                                          : 0) * 1000000000ull}};
    /* Under a device pool, blocks leaving it stay in host memory (the
     * host-RAM tier), bounded like the pool's cache, before any disk. */
    size_t host_bytes = m->backend->copy_weights ? cfg->prompt_cache_bytes : 0;
    if (!cfg->tier && host_bytes > 0) {
        e->tier_cfg = (struct kv_tier_config){.host_bytes = host_bytes};
        sc.tier = &e->tier_cfg;
    }
    if (cfg->tier) {
        e->tier_cfg = *cfg->tier;
        e->tier_cfg.host_bytes = host_bytes;
        e->tier_cfg.store.fp.model_digest =
            hash_mix64(cfg->tier->store.fp.model_digest ^ sc.prefix.model_digest);
        e->tier_cfg.store.fp.block_size = block_size;
        struct ssd_fingerprint *fp = &e->tier_cfg.store.fp;
        if (!fp->kv_format[0] && format.quant)
            kv_format_name(&format, fp->kv_format, sizeof fp->kv_format);
        else if (!fp->kv_format[0])
            snprintf(fp->kv_format, sizeof fp->kv_format, "%s", dtype_name(format.dtype));
        if (!fp->backend_identity[0])
            snprintf(fp->backend_identity, sizeof fp->backend_identity, "%s-%s",
                     m->backend->ops->name, m->backend->mode == COMPUTE_EXACT ? "exact" : "fast");
        sc.tier = &e->tier_cfg;
    }
    int rc = sched_init(&e->sched, m, &sc, &e->metrics, err);
    if (rc == 0 && cfg->checkpoint_every > 0) {
        struct kv_tier_stats tier;
        kv_manager_tier_stats(e->sched.kv, &tier);
        char dir[4096];
        if (!tier.enabled || !tier.store.dir)
            rc = err_set(err, INFERD_EINVAL, "generation checkpoints need the SSD tier");
        else if (snprintf(dir, sizeof dir, "%s/checkpoints", tier.store.dir) >= (int)sizeof dir)
            rc = err_set(err, INFERD_EINVAL, "the SSD tier's directory path is too long");
        else if ((rc = ckpt_store_open(dir, &e->ckpt, err)) == 0) {
            e->sched.ckpt = e->ckpt;
            e->sched.ckpt_every = cfg->checkpoint_every;
        }
        if (rc < 0) {
            sched_free(&e->sched);
            engine_free(e);
            return rc;
        }
    }
    if (rc == 0) {
        e->sched_ready = true;
        e->cfg.kv_blocks = e->sched.cfg.kv_blocks;
        e->cfg.kv_block_size = e->sched.cfg.block_size;
        publish_stats(e); /* /stats shows the caches (the SSD tier's store) from the start */
        if (!(e->incoming = calloc((size_t)cfg->max_queue, sizeof *e->incoming)))
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the engine's buffers");
    }
    if (rc == 0 && pthread_create(&e->thread, NULL, engine_main, e) != 0)
        rc = err_set(err, INFERD_ENOMEM, "cannot start the engine thread");
    if (rc < 0) {
        engine_free(e);
        return rc;
    }
    atomic_store(&e->n_free_blocks_pub, kv_manager_free_blocks(e->sched.kv));
    e->thread_started = true;
    *out = e;
    return 0;
}

/* The refusals of a request that could never run, whatever else is running:
 * its prompt over the context (or the memory budget's), or its projected KV
 * alone over the KV budget. All -INFERD_ERANGE; the message names the numbers. */
static int check_fits(const struct engine *e, const struct gen_params *p, struct err *err)
{
    const struct engine_config *c = &e->cfg;
    if (c->budget_ctx > 0 && p->n_prompt >= c->budget_ctx)
        return err_set(err, INFERD_ERANGE,
                       "the prompt is %d tokens but the memory budget leaves room for %d "
                       "positions, which must include at least one generated token",
                       p->n_prompt, c->budget_ctx);
    if (p->embed && p->n_prompt > c->n_ctx)
        return err_set(err, INFERD_ERANGE,
                       "the input is %d tokens but the context holds %d", p->n_prompt, c->n_ctx);
    if (!p->embed && p->n_prompt >= c->n_ctx)
        return err_set(err, INFERD_ERANGE,
                       "the prompt is %d tokens but the context holds %d, which must leave "
                       "room for at least one generated token",
                       p->n_prompt, c->n_ctx);
    uint64_t need = sched_kv_bytes(&e->sched, p->n_prompt + p->max_tokens, 0);
    if (c->kv_budget_bytes > 0 && need > c->kv_budget_bytes)
        return err_set(err, INFERD_ERANGE,
                       "the request needs %llu bytes of KV cache (%d prompt + %d max_tokens "
                       "positions) but the KV budget is %llu bytes",
                       (unsigned long long)need, p->n_prompt, p->max_tokens,
                       (unsigned long long)c->kv_budget_bytes);
    return 0;
}

/* With checkpoints on, s (just created for p, not yet queued) is checkpointed,
 * and when p's checkpoint exists it goes on from there: its tokens are
 * replayed to the reader first. True when the replay itself ended the
 * generation (s was finished and freed here). */
static bool resume(struct engine *e, const struct gen_params *p, struct seq *s)
{
    s->ckpt = true;
    s->ckpt_key = ckpt_key_of(p);
    struct ckpt c;
    if (ckpt_store_load(e->ckpt, s->ckpt_key, p->n_prompt, &c) < 0)
        return false;
    int n = c.n_generated < p->max_tokens ? c.n_generated : p->max_tokens - 1;
    enum gen_finish why = n > 0 ? seq_replay(s, c.tokens, n, c.rng_state, e->cfg.n_ctx)
                                : GEN_RUNNING;
    ckpt_free(&c);
    ckpt_store_note_resumed(e->ckpt);
    log_info("engine: a generation resumes from its checkpoint after %d tokens", n);
    s->ckpt_saved = n;
    if (why == GEN_RUNNING)
        return false;
    /* never expected (a checkpoint is of a generation that went on) */
    ckpt_store_remove(e->ckpt, s->ckpt_key);
    seq_finish(s, why == GEN_FINISH_ERROR ? GEN_FINISH_ERROR : why, INFERD_EFORMAT,
               why == GEN_FINISH_ERROR ? "a checkpoint held a token outside the vocabulary" : NULL);
    seq_publish(s);
    seq_free(s, NULL);
    return true;
}

int engine_submit(struct engine *e, const struct gen_params *p, struct gen_output **out,
                  struct err *err)
{
    struct gen_params clamped = *p;
    if (p->n_adapters < 0 || p->n_adapters > LORA_MAX_STACK)
        return err_set(err, INFERD_EINVAL, "%d adapters stacked (at most %d)", p->n_adapters,
                       LORA_MAX_STACK);
    for (int i = 0; i < p->n_adapters; i++) {
        const struct lora_adapter *a = p->adapters[i];
        if (!a || a->be != e->model->backend || a->n_layers != e->model->config.n_layers)
            return err_set(err, INFERD_EINVAL, "adapter %d was not loaded for this model", i);
        /* the stack, in order, is part of the KV's identity (and a checkpoint's key) */
        clamped.cache_ns = hash_mix64(clamped.cache_ns ^ hash_fnv1a_word(a->digest, (uint64_t)i + 1));
    }
    if (p->n_prompt < e->cfg.n_ctx && clamped.max_tokens > e->cfg.n_ctx - p->n_prompt)
        clamped.max_tokens = e->cfg.n_ctx - p->n_prompt;
    if (p->embed) { /* no token is generated: one position of room is all the checks ask for */
        clamped.max_tokens = 1;
        clamped.no_speculation = true;
        clamped.grammar = NULL;
    }
    int fit = check_fits(e, &clamped, err);
    if (fit < 0) {
        atomic_fetch_add(&e->requests_rejected, 1);
        return fit;
    }
    struct seq *s;
    struct gen_output *o;
    int rc = seq_create(&clamped, e->tok, e->model->config.vocab_size, &s, &o, err);
    if (rc < 0)
        return rc;
    if (p->embed) {
        s->embed = true;
        o->n_embedding = e->model->config.hidden_size;
        if (!(o->embedding = calloc((size_t)o->n_embedding, sizeof(float)))) {
            seq_free(s, NULL);
            gen_output_release(o);
            return err_set(err, INFERD_ENOMEM, "out of memory for an embedding");
        }
    }
    if (e->ckpt && !p->embed && resume(e, &clamped, s)) {
        *out = o;
        return 0;
    }
    atomic_int *n_queued = &e->sched.counters.n_queued;
    pthread_mutex_lock(&e->mu);
    if (e->stopping)
        rc = err_set(err, INFERD_EBUSY, "the server is shutting down");
    else if (atomic_load(n_queued) >= e->cfg.max_queue || e->n_incoming >= e->cfg.max_queue)
        rc = err_set(err, INFERD_EBUSY, "%d requests are already waiting; try again later",
                     atomic_load(n_queued));
    if (rc == 0) {
        e->incoming[e->n_incoming++] = s;
        atomic_fetch_add(n_queued, 1);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc < 0) {
        atomic_fetch_add(&e->requests_rejected, 1);
        atomic_fetch_add(&e->requests_refused, 1);
        seq_free(s, NULL); /* drops the sequence's reference; the caller's remains */
        gen_output_release(o);
        return rc;
    }
    *out = o;
    return 0;
}

/* Queues call for the engine thread and waits for its answer; -INFERD_EBUSY
 * when the engine is stopping. */
static int call_engine(struct engine *e, struct engine_call *call, struct err *err)
{
    pthread_mutex_lock(&e->mu);
    if (e->stopping || !e->thread_started) {
        pthread_mutex_unlock(&e->mu);
        return err_set(err, INFERD_EBUSY, "the server is shutting down");
    }
    call->next = e->calls;
    e->calls = call;
    pthread_cond_signal(&e->cv);
    while (!call->done)
        pthread_cond_wait(&e->call_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int engine_close_session(struct engine *e, const char *session_id, int *blocks_released,
                         struct err *err)
{
    struct engine_call call = {.session_id = session_id, .result = -1};
    int rc = call_engine(e, &call, err);
    if (rc < 0)
        return rc;
    *blocks_released = call.result;
    return 0;
}

int engine_flush_cache(struct engine *e, int timeout_ms, struct kv_tier_stats *after,
                       struct err *err)
{
    struct engine_call call = {.timeout_ms = timeout_ms, .result = -1};
    int rc = call_engine(e, &call, err);
    if (rc < 0)
        return rc;
    if (after)
        *after = call.tier;
    if (call.result < 0)
        err_set(err, -call.result, "%s", call.err.msg);
    return call.result;
}

int engine_run(struct engine *e, int (*fn)(void *ctx, struct err *err), void *ctx,
               struct err *err)
{
    struct engine_call call = {.fn = fn, .ctx = ctx};
    int rc = call_engine(e, &call, err);
    if (rc < 0)
        return rc;
    if (call.result < 0)
        *err = call.err;
    return call.result;
}

void engine_shutdown(struct engine *e, int grace_ms)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    e->stop_deadline_ns = now_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) {
        pthread_join(e->thread, NULL);
        e->thread_started = false;
    }
}

static int by_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Median and p99 of the recent per-token mask times, in microseconds. */
static void mask_quantiles(const struct engine_metrics *m, struct engine_stats *out)
{
    uint64_t n = atomic_load(&m->grammar_masks);
    out->grammar_masks = n;
    out->grammar_forced_tokens = atomic_load(&m->grammar_forced);
    size_t k = n < ENGINE_MASK_WINDOW ? (size_t)n : ENGINE_MASK_WINDOW;
    uint32_t *v = k ? malloc(k * sizeof *v) : NULL;
    if (!v)
        return;
    for (size_t i = 0; i < k; i++)
        v[i] = atomic_load(&m->mask_ns[i]);
    qsort(v, k, sizeof *v, by_u32);
    out->grammar_mask_us_p50 = v[k / 2] * 1e-3;
    out->grammar_mask_us_p99 = v[(k * 99) / 100 < k ? (k * 99) / 100 : k - 1] * 1e-3;
    free(v);
}

void engine_get_stats(struct engine *e, struct engine_stats *out)
{
    static const char *states[] = {"idle", "running", "stopping"};
    const struct sched_counters *c = &e->sched.counters;
    memset(out, 0, sizeof *out);
    out->requests_admitted = atomic_load(&c->requests_admitted);
    out->requests_finished = atomic_load(&c->requests_finished);
    out->requests_cancelled = atomic_load(&c->requests_cancelled);
    out->requests_refused = atomic_load(&e->requests_refused);
    out->prompt_tokens = atomic_load(&c->prompt_tokens);
    out->generated_tokens = atomic_load(&c->generated_tokens);
    out->steps = atomic_load(&c->steps);
    out->preemptions = atomic_load(&c->preemptions);
    static const char *kinds[] = {"none", "two-model", "ngram", "callback"};
    const struct spec_config *spec = e->sched.spec ? e->cfg.spec : NULL;
    out->spec_kind = kinds[spec ? spec->kind : SPEC_NONE];
    out->spec_max_drafts = spec ? spec->num_draft_tokens : 0;
    out->spec_draft_vocab = spec && spec->kind == SPEC_TWO_MODEL
                                ? spec_drafter_head_rows(e->sched.spec)
                                : 0;
    out->spec_draft_vocab_auto = spec && spec->kind == SPEC_TWO_MODEL && spec->draft_vocab == 0;
    out->spec_drafted = atomic_load(&c->spec_drafted);
    out->spec_accepted = atomic_load(&c->spec_accepted);
    out->spec_verify_steps = atomic_load(&c->spec_verify_steps);
    out->spec_draft_steps = atomic_load(&c->spec_draft_steps);
    out->queued = atomic_load(&c->n_queued);
    out->running = atomic_load(&e->n_running_pub);
    out->kv_blocks_total = e->cfg.kv_blocks;
    out->kv_blocks_free = atomic_load(&e->n_free_blocks_pub);
    out->requests_rejected = atomic_load(&e->requests_rejected);
    out->waiting = atomic_load(&e->n_waiting_pub);
    struct kv_format format = kv_format_of_backend(e->model->backend);
    kv_format_name(&format, out->kv_quant, sizeof out->kv_quant);
    out->kv_bytes_per_token = kv_format_bytes_per_token(&e->model->config, &format);
    if (format.quant && format.quant->per_layer) {
        out->kv_quant_layers = e->model->config.n_layers;
        for (int l = 0; l < out->kv_quant_layers && l < KV_QUANT_MAX_LAYERS; l++)
            kv_format_layer_name(&format, l, out->kv_quant_layer[l], sizeof out->kv_quant_layer[l]);
    }
    pthread_mutex_lock(&e->stats_mu);
    out->prompt_cache = e->cache_pub;
    out->ssd_cache = e->tier_pub;
    if (e->ckpt) {
        struct ckpt_stats cs;
        ckpt_store_stats(e->ckpt, &cs);
        out->checkpoints = true;
        out->checkpoints_saved = cs.saved;
        out->checkpoints_resumed = cs.resumed;
        out->checkpoints_removed = cs.removed;
        out->checkpoints_failed = cs.failed;
    }
    out->kv_bytes = e->kv_bytes_pub;
    pthread_mutex_unlock(&e->stats_mu);
    out->kv_budget_bytes = 0;
    mask_quantiles(&e->metrics, out);
    int st = atomic_load(&e->state);
    out->state = states[st >= 0 && st <= 2 ? st : 0];
}

const struct engine_metrics *engine_metrics(const struct engine *e)
{
    return &e->metrics;
}

const struct engine_config *engine_config(const struct engine *e)
{
    return &e->cfg;
}
