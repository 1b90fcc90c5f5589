/* engine/step.c — one step of the serving loop: the scheduler's batch through the model (or
 * through the backend's sampler, where it samples: then only token ids cross to the host),
 * each sequence's row handed to it, finished ones told and retired (or kept a step more to
 * compute their last token), and each reader woken once. */
#include "engine/scheduler.h"

/* Fills a sample spec for every batch entry that gets a row; false when one
 * cannot be filled (out of memory, or a driver that reads the logits itself),
 * and the step then leaves the logits on the host. */
static bool fill_specs(struct sched *sc, int n)
{
    int row = 0;
    for (int b = 0; b < n; b++) {
        struct seq *s = sc->batch_owner[b];
        if (sc->batch_seqs[b].no_logits)
            continue;
        if (!s->sampler || sampler_fill_spec(s->sampler, s->logprobs, &sc->specs[row++]) < 0)
            return false;
    }
    return true;
}

/* A step's host work while the device computes it: the batch's masks due
 * (structured output), then the picks' specs. */
struct step_picks {
    struct sched *sc;
    int n;
    bool on_backend; /* the rows were sampled on the device */
};

static int prepare_picks(void *ctx, bool sampled, struct err *err)
{
    (void)err;
    struct step_picks *p = ctx;
    for (int b = 0; b < p->n; b++)
        if (!p->sc->batch_owner[b]->finishing)
            seq_prepare_pick(p->sc->batch_owner[b], p->sc->metrics);
    p->on_backend = sampled && fill_specs(p->sc, p->n);
    return p->on_backend ? 0 : 1;
}

/* The row that predicts s's next token: picked by s's sampler, or left in
 * sc->logits for a detached sequence's driver when it has none. */
static enum gen_finish take_row(struct sched *sc, struct seq *s, size_t row, bool on_backend)
{
    float *logits = sc->logits + row * (size_t)sc->model->config.vocab_size;
    if (!s->sampler)
        return GEN_RUNNING;
    if (on_backend)
        return seq_take_result(s, &sc->specs[row], &sc->results[row], logits, sc->cfg.n_ctx,
                               sc->metrics);
    return seq_take_token(s, logits, sc->cfg.n_ctx, sc->metrics);
}

int sched_step(struct sched *sc, struct err *err)
{
    int n = sched_build_batch(sc);
    if (n == 0)
        return 0;
    struct batch batch = {sc->batch_seqs, n};
    struct kv_cache *cache = kv_manager_cache(sc->kv);
    struct step_picks picks = {.sc = sc, .n = n};
    struct forward_output out = {
        .host_rows = sc->logits,
        .specs = sc->specs,
        .results = sc->results,
        .before_rows = prepare_picks,
        .ctx = &picks,
    };
    int rc = model_forward_sampled(sc->model, sc->fwd, cache, &batch, &out, err);
    bool on_backend = picks.on_backend;
    atomic_fetch_add(&sc->counters.steps, 1);
    size_t row = 0;
    for (int b = 0; b < n; b++) {
        struct seq *s = sc->batch_owner[b];
        if (s->finishing) { /* its last token's K/V: now the whole sequence is published */
            if (rc >= 0)
                s->n_computed += sc->batch_chunk[b];
            sched_retire_finishing(sc, s, rc >= 0);
            continue;
        }
        enum gen_finish why = GEN_RUNNING;
        if (rc < 0) {
            why = GEN_FINISH_ERROR;
        } else {
            s->n_computed += sc->batch_chunk[b];
            sched_publish(sc, s);
            if (!sc->batch_seqs[b].no_logits)
                why = take_row(sc, s, row++, on_backend);
        }
        if (why == GEN_FINISH_STOP || why == GEN_FINISH_LENGTH) {
            sched_remove(sc, s);
            sched_finish(sc, s, why);
        } else if (why != GEN_RUNNING) {
            sched_remove(sc, s);
            sched_retire(sc, s, why, rc < 0 ? err->code : 0, rc < 0 ? err->msg : NULL);
        } else {
            sched_checkpoint(sc, s, false);
            seq_publish(s);
        }
    }
    return rc < 0 ? rc : n;
}
