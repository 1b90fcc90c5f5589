/* engine/engine.c — the engine thread: takes submitted requests off a queue, drives the
 * serving loop (engine/scheduler.h) step after step, shuts down with a grace period, and
 * publishes stats and metrics for any thread to read. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

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

    atomic_int n_running_pub;
    atomic_int n_free_blocks_pub;
    atomic_int state;              /* 0 idle, 1 running, 2 stopping */
    atomic_uint_fast64_t requests_refused;
    struct engine_metrics metrics;
};

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    struct sched *sc = &e->sched;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && e->n_incoming == 0 && sc->n_waiting == 0 && sc->n_running == 0) {
            atomic_store(&e->state, 0);
            pthread_cond_wait(&e->cv, &e->mu);
        }
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
        sched_drop_cancelled(sc, past_deadline);
        if (stopping && sc->n_running == 0 && sc->n_waiting == 0)
            break;
        sched_admit(sc);
        struct err err = {0};
        if (sched_step(sc, &err) < 0)
            log_error("engine: forward step failed: %s", err.msg);
        atomic_store(&e->n_running_pub, sc->n_running);
        atomic_store(&e->n_free_blocks_pub, kv_manager_free_blocks(sc->kv));
    }
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
    /* A memory budget that binds is the context kept; one that does not is dropped. */
    if (cfg->budget_ctx > 0 && cfg->budget_ctx < cfg->n_ctx)
        e->cfg.n_ctx = cfg->budget_ctx;
    else
        e->cfg.budget_ctx = 0;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    histogram_init_latency(&e->metrics.ttft);
    histogram_init_latency(&e->metrics.inter_token);
    struct sched_config sc = {.n_ctx = e->cfg.n_ctx, .max_seqs = cfg->max_seqs,
                              .max_step_tokens = cfg->max_step_tokens,
                              .kv_blocks = cfg->kv_blocks, .block_size = cfg->kv_block_size,
                              .kv_budget_bytes = cfg->kv_budget_bytes};
    int rc = sched_init(&e->sched, m, &sc, &e->metrics, err);
    if (rc == 0) {
        e->sched_ready = true;
        e->cfg.kv_blocks = e->sched.cfg.kv_blocks;
        e->cfg.kv_block_size = e->sched.cfg.block_size;
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
    if (p->n_prompt >= c->n_ctx)
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

int engine_submit(struct engine *e, const struct gen_params *p, struct gen_output **out,
                  struct err *err)
{
    struct gen_params clamped = *p;
    if (p->n_prompt < e->cfg.n_ctx && clamped.max_tokens > e->cfg.n_ctx - p->n_prompt)
        clamped.max_tokens = e->cfg.n_ctx - p->n_prompt;
    int fit = check_fits(e, &clamped, err);
    if (fit < 0)
        return fit;
    struct seq *s;
    struct gen_output *o;
    int rc = seq_create(&clamped, e->tok, e->model->config.vocab_size, &s, &o, err);
    if (rc < 0)
        return rc;
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
    out->queued = atomic_load(&c->n_queued);
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
