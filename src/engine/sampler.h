/* engine/sampler.h — picks the next token from logits: greedy, temperature, top-k, top-p, min-p. */
#ifndef INFERD_ENGINE_SAMPLER_H
#define INFERD_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/err.h"

struct sampler_params {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint64_t seed;
};

struct sampler {
    struct sampler_params params;
    uint64_t rng_state;
    int n_vocab;
    float *probs;      /* owned; n_vocab */
    int32_t *order;    /* owned; n_vocab */
};

int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab, struct err *err);
void sampler_free(struct sampler *s);

/* The next token for one row of logits (not modified). Same seed and same
 * logits give the same sequence of tokens. */
int32_t sampler_pick(struct sampler *s, const float *logits);

/* Index of the largest logit (lowest index on ties). */
int32_t logits_argmax(const float *logits, int n);

#endif
