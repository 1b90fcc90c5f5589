/* engine/generate.c — single-sequence generation for `inferd run` and `inferd bench`: the
 * serving loop (engine/scheduler.h) driven step by step on the caller's thread, no engine
 * thread in between. */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "engine/scheduler.h"

int generator_create(const struct model *m, int n_ctx, int max_chunk, struct generator **out,
                     struct err *err)
{
    return generator_create_spec(m, n_ctx, max_chunk, NULL, out, err);
}

int generator_create_spec(const struct model *m, int n_ctx, int max_chunk,
                          const struct spec_config *spec, struct generator **out, struct err *err)
{
    if (n_ctx < 1 || max_chunk < 1)
        return err_set(err, INFERD_ERANGE, "context %d and chunk %d must be positive", n_ctx,
                       max_chunk);
    struct generator *g = calloc(1, sizeof *g);
    if (!g || !(g->sched = calloc(1, sizeof *g->sched))) {
        free(g);
        return err_set(err, INFERD_ENOMEM, "out of memory for a generator");
    }
    g->model = m;
    g->n_ctx = n_ctx;
    /* One sequence; the pool holds its whole context and the position the
     * admission rule keeps free for the token after it. */
    struct sched_config cfg = {
        .n_ctx = n_ctx,
        .max_seqs = 1,
        .max_step_tokens = max_chunk < n_ctx ? max_chunk : n_ctx,
        .kv_blocks = kv_blocks_for(n_ctx + 1, KV_BLOCK_SIZE_DEFAULT),
        .spec = spec,
    };
    int rc = sched_init(g->sched, m, &cfg, NULL, err);
    if (rc < 0) {
        free(g->sched);
        free(g);
        return rc;
    }
    g->logits = g->sched->logits;
    if ((rc = seq_create_detached(n_ctx, &g->seq, err)) < 0) {
        generator_free(g);
        return rc;
    }
    spec_seq_init(g->sched->spec, g->seq, true);
    *out = g;
    return 0;
}

void generator_free(struct generator *g)
{
    if (!g)
        return;
    if (g->seq) {
        sched_remove(g->sched, g->seq);
        spec_seq_release(g->sched->spec, g->seq);
        seq_free(g->seq, g->sched->kv);
    }
    sched_free(g->sched);
    free(g->sched);
    free(g);
}

void generator_reset(struct generator *g)
{
    sched_remove(g->sched, g->seq);
    kv_manager_free(g->sched->kv, &g->seq->kv);
    spec_seq_release(g->sched->spec, g->seq);
    g->seq->n_tokens = g->seq->n_computed = 0;
}

/* Appends tokens and steps until their K/V are in the cache; the last step
 * picks with s (NULL: leaves the logits). */
static int feed(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                int32_t *picks, int *n_picks, struct err *err)
{
    struct seq *q = g->seq;
    if (n < 1)
        return err_set(err, INFERD_EINVAL, "nothing to feed");
    if (n > g->n_ctx - q->n_tokens)
        return err_set(err, INFERD_ERANGE,
                       "%d more tokens do not fit: %d of %d context positions are used", n,
                       q->n_tokens, g->n_ctx);
    memcpy(q->tokens + q->n_tokens, tokens, (size_t)n * sizeof *tokens);
    q->n_tokens += n;
    q->sampler = s;
    if (g->sched->n_running == 0) {
        if (!sched_enqueue(g->sched, q, false)) {
            generator_reset(g);
            return err_set(err, INFERD_ENOMEM, "out of memory for a generator's queue");
        }
        sched_admit(g->sched);
    }
    q->spec.n_emitted = 0;
    while (q->n_computed < q->n_tokens) {
        int rc = sched_step(g->sched, err);
        if (rc == 0) /* not scheduled: never expected, as the pool fits the whole context */
            rc = err_set(err, INFERD_ENOMEM, "the KV pool cannot hold %d positions", q->n_tokens);
        if (rc < 0) {
            generator_reset(g);
            return rc;
        }
    }
    if (s && q->spec.n_emitted > 0) {
        memcpy(picks, q->spec.emitted, (size_t)q->spec.n_emitted * sizeof *picks);
        *n_picks = q->spec.n_emitted;
    } else if (s) {
        picks[0] = q->last_pick;
        *n_picks = 1;
    }
    return 0;
}

int generator_feed(struct generator *g, const int32_t *tokens, int n, struct err *err)
{
    return feed(g, tokens, n, NULL, NULL, NULL, err);
}

int generator_feed_pick(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                        int32_t *token, struct err *err)
{
    int32_t picks[1 + SPEC_MAX_DRAFTS];
    int n_picks = 0;
    int rc = feed(g, tokens, n, s, picks, &n_picks, err);
    if (rc == 0) /* the next token to feed (a speculating step's earlier picks are dropped) */
        *token = picks[n_picks - 1];
    return rc;
}

int generator_feed_picks(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                         int32_t *picks, int *n_picks, struct err *err)
{
    return feed(g, tokens, n, s, picks, n_picks, err);
}

void generator_spec_stats(const struct generator *g, uint64_t *drafted, uint64_t *accepted,
                          uint64_t *verify_steps)
{
    *drafted = g->seq->spec.drafted;
    *accepted = g->seq->spec.accepted;
    *verify_steps = g->seq->spec.verify_steps;
}
