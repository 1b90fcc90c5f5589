/* engine/generate.h — one sequence generated start to finish: chunked prefill, then token-by-token decode. */
#ifndef INFERD_ENGINE_GENERATE_H
#define INFERD_ENGINE_GENERATE_H

#include "engine/sampler.h"
#include "kv/kv.h"
#include "model/model.h"

struct generator {
    const struct model *model;   /* borrowed */
    struct kv_pool *pool;        /* owned */
    struct forward_state *state; /* owned */
    struct block_table blocks;
    int max_chunk;               /* prefill tokens per forward step */
    int n_ctx;                   /* positions the pool can hold */
    int n_past;                  /* positions already in the KV cache */
    float *logits;               /* owned; vocab_size floats, the last step's last row (not
                                    updated by a pick the backend made) */
};

/* A generator for contexts up to n_ctx tokens, prefilling max_chunk tokens per step. */
int generator_create(const struct model *m, int n_ctx, int max_chunk, struct generator **out,
                     struct err *err);
void generator_free(struct generator *g);

/* Appends tokens (a prompt, in chunks); afterwards g->logits predicts the next one. */
int generator_feed(struct generator *g, const int32_t *tokens, int n, struct err *err);

/* generator_feed, then the token that follows, picked by s into *token: on
 * the backend when it samples (only the token crosses to the host), else on
 * the host from g->logits. The caller calls sampler_accept as it wishes. */
int generator_feed_pick(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                        int32_t *token, struct err *err);

/* Forgets the sequence (blocks go back to the pool). */
void generator_reset(struct generator *g);

#endif
