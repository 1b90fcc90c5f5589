/* engine/generate.c — single-sequence generation over the paged KV pool (CLI run, bench). */
#include "engine/generate.h"

#include <stdlib.h>

#define GENERATOR_BLOCK_SIZE 16

int generator_create(const struct model *m, int n_ctx, int max_chunk, struct generator **out,
                     struct err *err)
{
    if (n_ctx < 1 || max_chunk < 1)
        return err_set(err, INFERD_ERANGE, "context %d and chunk %d must be positive", n_ctx,
                       max_chunk);
    struct generator *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(err, INFERD_ENOMEM, "out of memory for a generator");
    g->model = m;
    g->n_ctx = n_ctx;
    g->max_chunk = max_chunk < n_ctx ? max_chunk : n_ctx;
    block_table_init(&g->blocks);
    int n_blocks = (n_ctx + GENERATOR_BLOCK_SIZE - 1) / GENERATOR_BLOCK_SIZE;
    int rc = kv_pool_create(m, m->backend, n_blocks, GENERATOR_BLOCK_SIZE, &g->pool, err);
    if (rc == 0)
        rc = forward_state_create(m, g->max_chunk, &g->state, err);
    if (rc == 0 && !(g->logits = malloc((size_t)m->config.vocab_size * sizeof(float))))
        rc = err_set(err, INFERD_ENOMEM, "out of memory for logits");
    if (rc < 0) {
        generator_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void generator_free(struct generator *g)
{
    if (!g)
        return;
    if (g->pool)
        block_table_clear(g->pool, &g->blocks);
    forward_state_free(g->state);
    kv_pool_free(g->pool);
    free(g->logits);
    free(g);
}

/* The last chunk's step when its prediction is picked on the backend:
 * sampled there, with only the result (and a row it hands back) copied. */
static int forward_picked(struct generator *g, struct batch *batch, struct sampler *s,
                          int32_t *token, bool *picked, struct err *err)
{
    struct sample_spec spec;
    struct sample_result res;
    if (sampler_fill_spec(s, -1, &spec) < 0) /* out of memory: the host picks instead */
        return model_forward(g->model, g->state, &g->pool->cache, batch, g->logits, err);
    int rc = model_forward_sampled(g->model, g->state, &g->pool->cache, batch, &spec, &res,
                                   g->logits, err);
    if (rc == 0) {
        *token = sampler_take_result(s, &spec, &res, g->logits);
        *picked = true;
    }
    return rc;
}

/* Feeds tokens in chunks; when s is given, picks the token after them into *token. */
static int feed(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                int32_t *token, struct err *err)
{
    if (n < 1)
        return err_set(err, INFERD_EINVAL, "nothing to feed");
    if (n > g->n_ctx - g->n_past)
        return err_set(err, INFERD_ERANGE,
                       "%d more tokens do not fit: %d of %d context positions are used", n,
                       g->n_past, g->n_ctx);
    int rc = block_table_reserve(g->pool, &g->blocks, g->n_past + n, err);
    if (rc < 0)
        return rc;
    bool picked = false;
    for (int done = 0; done < n;) {
        int chunk = n - done < g->max_chunk ? n - done : g->max_chunk;
        bool last = done + chunk == n;
        struct batch_seq seq = {
            .tokens = tokens + done,
            .n_tokens = chunk,
            .pos0 = g->n_past,
            .block_ids = g->blocks.blocks,
            .n_block_ids = g->blocks.n_blocks,
            .no_logits = !last, /* only the last chunk's prediction is read */
        };
        struct batch batch = {&seq, 1};
        if (last && s && model_samples_on_backend(g->model))
            rc = forward_picked(g, &batch, s, token, &picked, err);
        else
            rc = model_forward(g->model, g->state, &g->pool->cache, &batch, g->logits, err);
        if (rc < 0)
            return rc;
        g->n_past += chunk;
        done += chunk;
    }
    if (s && !picked)
        *token = sampler_pick(s, g->logits);
    return 0;
}

int generator_feed(struct generator *g, const int32_t *tokens, int n, struct err *err)
{
    return feed(g, tokens, n, NULL, NULL, err);
}

int generator_feed_pick(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                        int32_t *token, struct err *err)
{
    return feed(g, tokens, n, s, token, err);
}

void generator_reset(struct generator *g)
{
    block_table_clear(g->pool, &g->blocks);
    g->n_past = 0;
}
