/* engine/sampler.h — picks the next token from logits: logit bias, repetition/presence/frequency
 * penalties, then greedy or temperature with top-k, top-p, min-p; reports OpenAI logprobs. */
#ifndef INFERD_ENGINE_SAMPLER_H
#define INFERD_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/err.h"

/* The most alternatives sampler_logprobs reports, as OpenAI's top_logprobs. */
#define SAMPLER_MAX_TOP_LOGPROBS 20

struct sampler_logit_bias {
    int32_t token; /* [0, n_vocab) */
    float bias;    /* [-100, 100]; added to the token's logit; entries for one token add up */
};

/* Zero in every new field means off, so `{.temperature = 0, .top_p = 1}` still
 * describes plain greedy decoding. */
struct sampler_params {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint64_t seed;
    /* Hugging Face semantics, over prompt and generated tokens: a seen token's
     * logit becomes logit > 0 ? logit / p : logit * p. (0, 10]; 0 or 1: off. */
    float repetition_penalty;
    /* OpenAI semantics, over generated tokens only: logit -= presence * (count > 0)
     * and logit -= frequency * count. [-2, 2]; 0: off. */
    float presence_penalty;
    float frequency_penalty;
    const struct sampler_logit_bias *logit_bias; /* copied by sampler_init */
    int n_logit_bias;
};

struct sampler {
    struct sampler_params params; /* params.logit_bias points at bias */
    uint64_t rng_state;
    int n_vocab;
    float *probs;                    /* owned; n_vocab */
    int32_t *order;                  /* owned; n_vocab */
    struct sampler_logit_bias *bias; /* owned; params.n_logit_bias entries */
    float *processed; /* owned; n_vocab logits after bias and penalties; NULL when both are off */
    /* Penalty state, NULL when every penalty is off: */
    int32_t *counts;   /* owned; n_vocab; times each token was generated */
    uint8_t *listed;   /* owned; n_vocab; 1 for the tokens in seen */
    int32_t *seen;     /* owned; n_vocab; distinct tokens the penalties touch, first seen first */
    int n_seen;
    const float *last; /* the logits the last pick chose from: processed or the caller's row */
};

/* Validates p (ranges above; logit bias ids in [0, n_vocab)) and allocates.
 * Returns 0, or -INFERD_ERANGE / -INFERD_EINVAL / -INFERD_ENOMEM with err
 * filled and s untouched or released. */
int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab, struct err *err);

/* Releases everything s owns; safe twice and on a zeroed struct. */
void sampler_free(struct sampler *s);

/* Records the prompt's tokens, which the repetition penalty (only) sees.
 * Call once after sampler_init. Ids outside the vocabulary are ignored. */
void sampler_observe_prompt(struct sampler *s, const int32_t *tokens, int n);

/* Records a generated token, which every penalty sees; the caller calls it
 * for each token it emits. Ids outside the vocabulary are ignored. */
void sampler_accept(struct sampler *s, int32_t token);

/* The next token for one row of logits (not modified). Processing order:
 * logit bias, repetition penalty, presence/frequency penalties, then
 * temperature, top-k, min-p, top-p. NaN logits count as -inf; the result is
 * always in [0, n_vocab). Same seed, parameters and logits give the same
 * sequence of tokens. */
int32_t sampler_pick(struct sampler *s, const float *logits);

struct token_logprob {
    int32_t token;
    float logprob;
};

/* Logprobs for the last sampler_pick, whose logits row must still be
 * unchanged: the log-softmax of the logits after bias and penalties but
 * before temperature and truncation (what OpenAI reports). Writes token's
 * logprob to *token_logprob and the top_n (clamped to [0,
 * SAMPLER_MAX_TOP_LOGPROBS]) most likely tokens to top, by logprob descending,
 * ties lower id first; tokens of probability zero (-inf or NaN logits) are
 * left out. Returns the number written to top, or -INFERD_EINVAL before any
 * pick or for a token outside the vocabulary. *token_logprob is -inf for a
 * token of probability zero; JSON writers must map that to a finite value. */
int sampler_logprobs(const struct sampler *s, int32_t token, int top_n, float *token_logprob,
                     struct token_logprob *top);

/* Index of the largest logit (lowest index on ties; NaN counts as -inf; 0
 * when no logit is above -inf). */
int32_t logits_argmax(const float *logits, int n);

#endif
