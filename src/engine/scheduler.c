/* engine/scheduler.c — the engine thread: admits queued requests into the running set,
 * builds one batch per step (a token for every decoding sequence, prefill chunks in the
 * remaining budget), runs the forward pass and hands each sequence its logits (or, where
 * the backend samples, its token: then only token ids cross to the host). When KV
 * blocks run out, the latest-admitted sequence gives its blocks back and is recomputed later. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "engine/engine.h"
#include "engine/sequence.h"

#define ENGINE_BLOCK_SIZE 16

struct engine {
    const struct model *model;     /* borrowed */
    const struct tokenizer *tok;   /* borrowed */
    struct engine_config cfg;
    struct kv_pool *pool;          /* owned */
    struct forward_state *fwd;     /* owned */
    float *logits;                 /* owned; max_seqs rows of vocab_size */
    struct sample_spec *specs;     /* owned; max_seqs: the step's picks, for a sampling backend */
    struct sample_result *results; /* owned; max_seqs */
    struct batch_seq *batch_seqs;  /* owned; max_seqs */
    struct seq **batch_owner;      /* owned; max_seqs: which sequence each batch entry is */
    int *batch_chunk;              /* owned; max_seqs */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu: */
    struct seq **incoming;         /* owned array; max_queue */
    int n_incoming;
    bool stopping;
    uint64_t stop_deadline_ns;

    /* engine thread only: */
    struct seq **waiting;          /* owned array; FIFO, preempted sequences go first */
    int n_waiting, cap_waiting;
    struct seq **running;          /* owned array; max_seqs, in admission order */
    int n_running;
    uint64_t admissions;

    atomic_int n_queued;           /* submitted, never yet admitted */
    atomic_int n_running_pub;
    atomic_int n_free_blocks_pub;
    atomic_int state;              /* 0 idle, 1 running, 2 stopping */
    atomic_uint_fast64_t requests_admitted, requests_finished, requests_cancelled,
        requests_refused, prompt_tokens, generated_tokens, steps, preemptions;
    struct engine_metrics metrics;
};

static int blocks_for(int positions)
{
    return (positions + ENGINE_BLOCK_SIZE - 1) / ENGINE_BLOCK_SIZE;
}

static bool waiting_push(struct engine *e, struct seq *s, bool front)
{
    if (e->n_waiting == e->cap_waiting) {
        int cap = e->cap_waiting ? e->cap_waiting * 2 : 64;
        struct seq **grown = realloc(e->waiting, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        e->waiting = grown;
        e->cap_waiting = cap;
    }
    if (front) {
        memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
        e->waiting[0] = s;
    } else {
        e->waiting[e->n_waiting] = s;
    }
    e->n_waiting++;
    return true;
}

static void retire(struct engine *e, struct seq *s, enum gen_finish why, int error_code,
                   const char *error)
{
    /* Counted before the reader is told, so stats read after a finish include it. */
    if (why == GEN_FINISH_CANCELLED)
        atomic_fetch_add(&e->requests_cancelled, 1);
    else
        atomic_fetch_add(&e->requests_finished, 1);
    atomic_fetch_add(&e->generated_tokens, (uint64_t)(s->n_tokens - s->n_prompt));
    seq_finish(s, why, error_code, error);
    seq_free(s, e->pool);
}

static void running_remove(struct engine *e, int i)
{
    memmove(e->running + i, e->running + i + 1,
            (size_t)(e->n_running - i - 1) * sizeof *e->running);
    e->n_running--;
}

/* Gives the youngest running sequence's blocks back; it will be recomputed. */
static void preempt_youngest(struct engine *e)
{
    struct seq *s = e->running[e->n_running - 1];
    e->n_running--;
    atomic_fetch_add(&e->preemptions, 1);
    block_table_clear(e->pool, &s->blocks);
    s->n_computed = 0;
    if (!waiting_push(e, s, true))
        retire(e, s, GEN_FINISH_ERROR, INFERD_ENOMEM,
               "out of memory while requeueing a preempted request");
}

static void drop_cancelled(struct engine *e, bool cancel_all)
{
    for (int i = 0; i < e->n_running;) {
        struct seq *s = e->running[i];
        if (cancel_all || atomic_load(&s->out->cancel)) {
            running_remove(e, i);
            retire(e, s, GEN_FINISH_CANCELLED, 0, NULL);
        } else {
            i++;
        }
    }
    for (int i = 0; i < e->n_waiting;) {
        struct seq *s = e->waiting[i];
        if (cancel_all || atomic_load(&s->out->cancel)) {
            memmove(e->waiting + i, e->waiting + i + 1,
                    (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
            e->n_waiting--;
            if (s->admit_order == 0)
                atomic_fetch_sub(&e->n_queued, 1);
            retire(e, s, GEN_FINISH_CANCELLED, 0, NULL);
        } else {
            i++;
        }
    }
}

static void admit(struct engine *e)
{
    while (e->n_waiting > 0 && e->n_running < e->cfg.max_seqs) {
        struct seq *s = e->waiting[0];
        /* The whole prompt (and the first generated token) must fit now, so a
         * new sequence does not immediately push out the running ones. */
        if (e->pool->n_free < blocks_for(s->n_tokens + 1))
            break;
        memmove(e->waiting, e->waiting + 1, (size_t)(e->n_waiting - 1) * sizeof *e->waiting);
        e->n_waiting--;
        if (s->admit_order == 0) {
            atomic_fetch_sub(&e->n_queued, 1);
            atomic_fetch_add(&e->requests_admitted, 1);
            atomic_fetch_add(&e->prompt_tokens, (uint64_t)s->n_prompt);
        }
        s->admit_order = ++e->admissions;
        e->running[e->n_running++] = s;
    }
}

/* Fills e->batch_seqs; returns how many sequences take part. */
static int build_batch(struct engine *e)
{
    int budget = e->cfg.max_step_tokens;
    int n = 0;
    struct err err = {0};
    /* Oldest first, so that when blocks run short the youngest (not yet in
     * the batch) are the ones pushed back. */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        struct seq *s = e->running[i];
        int todo = s->n_tokens - s->n_computed;
        int chunk = todo < budget ? todo : budget;
        while (block_table_reserve(e->pool, &s->blocks, s->n_computed + chunk, &err) < 0) {
            if (e->n_running - 1 == i) {
                /* Nothing younger to push back: this one waits for blocks. */
                preempt_youngest(e);
                chunk = 0;
                break;
            }
            preempt_youngest(e);
        }
        if (chunk == 0)
            break;
        e->batch_owner[n] = s;
        e->batch_chunk[n] = chunk;
        e->batch_seqs[n] = (struct batch_seq){
            .tokens = s->tokens + s->n_computed,
            .n_tokens = chunk,
            .pos0 = s->n_computed,
            .block_ids = s->blocks.blocks,
            .n_block_ids = s->blocks.n_blocks,
            .no_logits = s->n_computed + chunk < s->n_tokens,
        };
        n++;
        budget -= chunk;
    }
    return n;
}

/* Fills a sample spec for every batch entry that gets a row; false when one
 * cannot be filled (out of memory), and the step then samples on the host. */
static bool fill_specs(struct engine *e, int n)
{
    int row = 0;
    for (int b = 0; b < n; b++) {
        struct seq *s = e->batch_owner[b];
        if (!e->batch_seqs[b].no_logits &&
            sampler_fill_spec(&s->sampler, s->logprobs, &e->specs[row++]) < 0)
            return false;
    }
    return true;
}

static void run_step(struct engine *e)
{
    int n = build_batch(e);
    if (n == 0)
        return;
    struct batch batch = {e->batch_seqs, n};
    struct err err = {0};
    bool on_backend = model_samples_on_backend(e->model) && fill_specs(e, n);
    int rc = on_backend ? model_forward_sampled(e->model, e->fwd, &e->pool->cache, &batch,
                                                e->specs, e->results, e->logits, &err)
                        : model_forward(e->model, e->fwd, &e->pool->cache, &batch, e->logits,
                                        &err);
    size_t vocab = (size_t)e->model->config.vocab_size;
    atomic_fetch_add(&e->steps, 1);
    size_t row = 0;
    for (int b = 0; b < n; b++) {
        struct seq *s = e->batch_owner[b];
        enum gen_finish why = GEN_RUNNING;
        if (rc < 0) {
            why = GEN_FINISH_ERROR;
        } else {
            s->n_computed += e->batch_chunk[b];
            if (!e->batch_seqs[b].no_logits && on_backend)
                why = seq_take_result(s, &e->specs[row], &e->results[row],
                                      e->logits + row * vocab, e->cfg.n_ctx, &e->metrics);
            else if (!e->batch_seqs[b].no_logits)
                why = seq_take_token(s, e->logits + row * vocab, e->cfg.n_ctx, &e->metrics);
            row += !e->batch_seqs[b].no_logits;
        }
        if (why != GEN_RUNNING) {
            for (int i = 0; i < e->n_running; i++)
                if (e->running[i] == s) {
                    running_remove(e, i);
                    break;
                }
            retire(e, s, why, rc < 0 ? err.code : 0, rc < 0 ? err.msg : NULL);
        }
    }
    if (rc < 0)
        log_error("engine: forward step failed: %s", err.msg);
}

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && e->n_incoming == 0 && e->n_waiting == 0 && e->n_running == 0) {
            atomic_store(&e->state, 0);
            pthread_cond_wait(&e->cv, &e->mu);
        }
        for (int i = 0; i < e->n_incoming; i++)
            if (!waiting_push(e, e->incoming[i], false)) {
                atomic_fetch_sub(&e->n_queued, 1);
                retire(e, e->incoming[i], GEN_FINISH_ERROR, INFERD_ENOMEM,
                       "out of memory while queueing");
            }
        e->n_incoming = 0;
        bool stopping = e->stopping;
        bool past_deadline = stopping && now_ns() >= e->stop_deadline_ns;
        pthread_mutex_unlock(&e->mu);

        atomic_store(&e->state, stopping ? 2 : 1);
        drop_cancelled(e, past_deadline);
        if (stopping && e->n_running == 0 && e->n_waiting == 0)
            break;
        admit(e);
        run_step(e);
        atomic_store(&e->n_running_pub, e->n_running);
        atomic_store(&e->n_free_blocks_pub, e->pool->n_free);
    }
    return NULL;
}

void engine_free(struct engine *e)
{
    if (!e)
        return;
    engine_shutdown(e, 0);
    free(e->incoming);
    free(e->waiting);
    free(e->running);
    free(e->batch_seqs);
    free(e->batch_owner);
    free(e->batch_chunk);
    free(e->logits);
    free(e->specs);
    free(e->results);
    forward_state_free(e->fwd);
    kv_pool_free(e->pool);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
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
    int min_blocks = blocks_for(cfg->n_ctx);
    if (e->cfg.kv_blocks == 0)
        e->cfg.kv_blocks = min_blocks * cfg->max_seqs;
    if (e->cfg.kv_blocks < min_blocks)
        e->cfg.kv_blocks = min_blocks;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    histogram_init_latency(&e->metrics.ttft);
    histogram_init_latency(&e->metrics.inter_token);
    size_t vocab = (size_t)m->config.vocab_size;
    int rc = kv_pool_create(m, m->backend, e->cfg.kv_blocks, ENGINE_BLOCK_SIZE, &e->pool, err);
    if (rc == 0)
        rc = forward_state_create(m, cfg->max_step_tokens, &e->fwd, err);
    if (rc == 0) {
        e->logits = malloc((size_t)cfg->max_seqs * vocab * sizeof(float));
        e->incoming = calloc((size_t)cfg->max_queue, sizeof *e->incoming);
        e->running = calloc((size_t)cfg->max_seqs, sizeof *e->running);
        e->batch_seqs = calloc((size_t)cfg->max_seqs, sizeof *e->batch_seqs);
        e->batch_owner = calloc((size_t)cfg->max_seqs, sizeof *e->batch_owner);
        e->batch_chunk = calloc((size_t)cfg->max_seqs, sizeof *e->batch_chunk);
        e->specs = calloc((size_t)cfg->max_seqs, sizeof *e->specs);
        e->results = calloc((size_t)cfg->max_seqs, sizeof *e->results);
        if (!e->logits || !e->incoming || !e->running || !e->batch_seqs || !e->batch_owner ||
            !e->batch_chunk || !e->specs || !e->results)
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the engine's buffers");
    }
    if (rc == 0 && pthread_create(&e->thread, NULL, engine_main, e) != 0)
        rc = err_set(err, INFERD_ENOMEM, "cannot start the engine thread");
    if (rc < 0) {
        engine_free(e);
        return rc;
    }
    atomic_store(&e->n_free_blocks_pub, e->pool->n_free);
    e->thread_started = true;
    *out = e;
    return 0;
}

int engine_submit(struct engine *e, const struct gen_params *p, struct gen_output **out,
                  struct err *err)
{
    if (p->n_prompt >= e->cfg.n_ctx)
        return err_set(err, INFERD_ERANGE,
                       "the prompt is %d tokens but the context holds %d, which must leave "
                       "room for at least one generated token",
                       p->n_prompt, e->cfg.n_ctx);
    struct gen_params clamped = *p;
    if (clamped.max_tokens > e->cfg.n_ctx - p->n_prompt)
        clamped.max_tokens = e->cfg.n_ctx - p->n_prompt;
    struct seq *s;
    struct gen_output *o;
    int rc = seq_create(&clamped, e->tok, e->model->config.vocab_size, &s, &o, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&e->mu);
    if (e->stopping)
        rc = err_set(err, INFERD_EBUSY, "the server is shutting down");
    else if (atomic_load(&e->n_queued) >= e->cfg.max_queue || e->n_incoming >= e->cfg.max_queue)
        rc = err_set(err, INFERD_EBUSY, "%d requests are already waiting; try again later",
                     atomic_load(&e->n_queued));
    if (rc == 0) {
        e->incoming[e->n_incoming++] = s;
        atomic_fetch_add(&e->n_queued, 1);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc < 0) {
        atomic_fetch_add(&e->requests_refused, 1);
        seq_free(s, NULL); /* drops the sequence's reference; the caller's remains */
        gen_output_release(o);
        return rc;
    }
    *out = o;
    return 0;
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

void engine_get_stats(struct engine *e, struct engine_stats *out)
{
    static const char *states[] = {"idle", "running", "stopping"};
    memset(out, 0, sizeof *out);
    out->requests_admitted = atomic_load(&e->requests_admitted);
    out->requests_finished = atomic_load(&e->requests_finished);
    out->requests_cancelled = atomic_load(&e->requests_cancelled);
    out->requests_refused = atomic_load(&e->requests_refused);
    out->prompt_tokens = atomic_load(&e->prompt_tokens);
    out->generated_tokens = atomic_load(&e->generated_tokens);
    out->steps = atomic_load(&e->steps);
    out->preemptions = atomic_load(&e->preemptions);
    out->queued = atomic_load(&e->n_queued);
    out->running = atomic_load(&e->n_running_pub);
    out->kv_blocks_total = e->cfg.kv_blocks;
    out->kv_blocks_free = atomic_load(&e->n_free_blocks_pub);
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
