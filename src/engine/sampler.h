/* engine/sampler.h — picks the next token from logits: logit bias, repetition/presence/frequency
 * penalties over sliding windows, then greedy or temperature with top-k, top-p, min-p and XTC;
 * reports OpenAI logprobs.
 * The same picks can be made by a backend that samples where the logits are
 * (sampler_fill_spec, then sampler_take_result). */
#ifndef INFERD_ENGINE_SAMPLER_H
#define INFERD_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"

/* The most alternatives sampler_logprobs reports, as OpenAI's top_logprobs. */
#define SAMPLER_MAX_TOP_LOGPROBS 20

/* The most tokens XTC may be told never to remove (end-of-sequence ids, newline). */
#define SAMPLER_MAX_XTC_KEEP 16

struct sampler_logit_bias {
    int32_t token; /* [0, n_vocab) */
    float bias;    /* [-100, 100]; added to the token's logit; entries for one token add up
                      (summed first, in order, then added once) */
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
    /* Penalty windows, >= 0; 0: the penalty's whole history. Each penalty sees
     * only the last N tokens of its history: the repetition penalty the last N
     * of prompt then generated tokens (so the prompt's tail while fewer than N
     * were generated), presence and frequency the last N generated tokens. */
    int repetition_context_size;
    int presence_context_size;
    int frequency_context_size;
    /* XTC, "exclude top choices" (sampling picks only; greedy ignores it): with
     * probability xtc_probability per pick, decided by a number drawn from the
     * random stream before the pick's own, every candidate left after top-k,
     * min-p and top-p whose probability at temperature 1 (renormalized over
     * those candidates) is above xtc_threshold is removed, except the least
     * likely of them (and any that tie with it) and the xtc_keep tokens.
     * xtc_probability [0, 1], 0: off; xtc_threshold [0, 0.5]. */
    float xtc_probability;
    float xtc_threshold;
    int32_t xtc_keep[SAMPLER_MAX_XTC_KEEP]; /* ids never removed by XTC; outside the vocabulary:
                                               ignored */
    int n_xtc_keep;                         /* [0, SAMPLER_MAX_XTC_KEEP] */
};

struct sampler {
    struct sampler_params params; /* params.logit_bias points at bias */
    uint64_t rng_state;
    int n_vocab;
    float *probs;                    /* owned; n_vocab */
    int32_t *order;                  /* owned; n_vocab */
    /* owned; params.n_logit_bias entries: the request's entries merged, one
     * per token (ascending ids), biases summed in the request's order */
    struct sampler_logit_bias *bias;
    float *processed; /* owned; n_vocab logits after bias and penalties; NULL when both are off */
    /* Penalty state, NULL when every penalty is off: */
    int32_t *counts;   /* owned; n_vocab; times each token was generated within the frequency
                          window (the presence window when frequency is off) */
    int32_t *in_rep;   /* owned; n_vocab; occurrences within the repetition window; NULL when
                          the repetition penalty is off */
    int32_t *in_presence; /* owned; n_vocab; generated occurrences within the presence window
                             when it differs from frequency's (both on), else NULL */
    int32_t *ring;     /* owned; ring_cap: the last tokens the windows slide over (prompt tail,
                          then generated); NULL when no active penalty has a window */
    int ring_cap;
    int64_t n_pushed;  /* tokens pushed to ring: a token's position */
    int64_t n_prompt_pushed; /* of which prompt tokens (positions before the generated ones) */
    uint8_t *listed;   /* owned; n_vocab; SAMPLER_LISTED_* bits */
    int32_t *seen;     /* owned; n_vocab; distinct tokens the penalties touch, first seen first */
    int n_seen;
    const float *last; /* the logits the last pick chose from: processed or the caller's row */
    /* last is the caller's row, the n_changed tokens bias and penalties change in it (and
     * their processed values) in order and probs: a greedy pick takes them one by one, and
     * sampler_logprobs sets them in a copy when asked */
    bool last_sparse;
    int n_changed;
    /* sampler_skip_logprobs: no sampler_logprobs follows a pick */
    bool no_logprobs;
    /* owned, made on a greedy pick's first need; n_vocab: -inf at the tokens bias and
     * penalties change, 0 elsewhere (added to a row, it leaves the others' argmax) */
    float *skip;
    /* Backend picks (sampler_fill_spec / sampler_take_result): */
    struct sample_adjust *adjust; /* owned; adjust_cap entries, the last spec's list */
    int adjust_cap;
    struct sample_result result;  /* the last pick, when a backend made it (last is NULL then) */
    bool last_on_backend;
    /* Structured output (sampler_set_mask): borrowed; (n_vocab + 31) / 32 words, or NULL. */
    const uint32_t *mask;
};

#define SAMPLER_LISTED_SEEN 1u   /* in seen */
#define SAMPLER_LISTED_BIASED 2u /* has a logit_bias entry */

/* Validates p (ranges above; logit bias ids in [0, n_vocab)) and allocates.
 * Returns 0, or -INFERD_ERANGE / -INFERD_EINVAL / -INFERD_ENOMEM with err
 * filled and s untouched or released. */
int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab, struct err *err);

/* Releases everything s owns; safe twice and on a zeroed struct. */
void sampler_free(struct sampler *s);

/* Records the prompt's tokens, which the repetition penalty (only) sees
 * (only the last repetition_context_size of them when that is > 0).
 * Call once after sampler_init. Ids outside the vocabulary are ignored. */
void sampler_observe_prompt(struct sampler *s, const int32_t *tokens, int n);

/* Records a generated token, which every penalty sees; the caller calls it
 * for each token it emits. Ids outside the vocabulary are ignored. */
void sampler_accept(struct sampler *s, int32_t token);

/* The next token for one row of logits (not modified). Processing order:
 * logit bias, repetition penalty, presence/frequency penalties, then
 * temperature, top-k, min-p, top-p, XTC. NaN logits count as -inf; the result is
 * always in [0, n_vocab). Same seed, parameters and logits give the same
 * sequence of tokens. */
int32_t sampler_pick(struct sampler *s, const float *logits);

/* The distribution the next pick draws from, written to probs (n_vocab floats, summing to 1):
 * sampler_pick's processing of logits (bias, penalties, mask, temperature, top-k, min-p,
 * top-p; not XTC, which a verification pick never applies), renormalized over the kept
 * candidates, zero elsewhere; a point mass at the argmax for greedy picks. The random stream
 * does not move. Returns 0. */
int sampler_probs(struct sampler *s, const float *logits, float *probs);

/* A verification pick (speculative decoding) at a position where a drafter proposed draft,
 * drawn from distribution q (n_vocab floats; NULL: a point mass at draft, as for a
 * deterministic drafter). Greedy: the argmax, *accepted when it is the draft. Sampling, with
 * p the distribution sampler_probs describes: the draft is accepted with probability
 * min(1, p(draft) / q(draft)) (one number from the stream); else the token is drawn from
 * norm(max(0, p - q)) (a second number), so the pick follows p exactly whatever the drafter
 * did. XTC is not applied (a sequence with XTC does not speculate). sampler_logprobs then
 * reports for this row as after sampler_pick; the caller calls sampler_accept. */
int32_t sampler_pick_draft(struct sampler *s, const float *logits, int32_t draft, const float *q,
                           bool *accepted);

/* The allowed-token mask of the next picks (structured output): bit t of word t >> 5 set when
 * token t may be picked. The mask step runs after logit bias and penalties and before
 * temperature and truncation: every token whose bit is clear gets logit -inf, so it is never
 * picked and its logprob is -inf (a row with nothing allowed falls back to token 0, as a row
 * of -inf does). Borrowed: the caller keeps it unchanged until the pick is taken, and may
 * update it in place between picks; NULL turns it off. sampler_fill_spec passes it to a
 * backend (sample_spec.mask). Returns 0, or -INFERD_ENOMEM. */
int sampler_set_mask(struct sampler *s, const uint32_t *mask);

/* True when picks are greedy (temperature 0 or top_k 1): no random number is used. */
bool sampler_is_greedy(const struct sampler *s);

/* Describes the next pick for a backend's sample op: parameters, the sparse
 * per-token adjustments (logit bias and penalty state; spec->adjust points
 * into s, valid until the next call), n_top candidates for logprobs (clamped
 * to SAMPLER_MAX_TOP_LOGPROBS; -1: no logprobs at all), and, for sampling picks
 * only, the uniform number the host pick would draw next. The stream does
 * not move until sampler_take_result says the number was used, so greedy
 * picks and picks over rows with nothing above -inf leave it where it was,
 * as sampler_pick does (with XTC on, a sampling pick spends two numbers: the
 * XTC draw, then the pick's). Returns 0, or -INFERD_ENOMEM or
 * -INFERD_EUNSUPPORTED (then pick on the host with sampler_pick): the latter
 * when the pick is one a spec cannot describe — XTC fires on this pick, or
 * presence and frequency penalties both apply over different windows. */
int sampler_fill_spec(struct sampler *s, int n_top, struct sample_spec *spec);

/* The token of a backend pick made from spec (filled by sampler_fill_spec
 * for this pick) with result res. When res->need_host, host_row holds the
 * row's processed logits (which must stay unchanged until sampler_logprobs
 * is done) and the host finishes the pick with sampler_pick's exact code and
 * spec->u. Advances the random stream when the pick used it. The caller
 * still calls sampler_accept with the token. */
int32_t sampler_take_result(struct sampler *s, const struct sample_spec *spec,
                            const struct sample_result *res, const float *host_row);

struct token_logprob {
    int32_t token;
    float logprob;
};

/* The caller will not ask sampler_logprobs after its picks (a request without logprobs):
 * a greedy pick may then leave out the penalized tokens that cannot win instead of
 * computing every one, and sampler_logprobs after such a pick is -INFERD_EINVAL. */
void sampler_skip_logprobs(struct sampler *s);

/* Logprobs for the last sampler_pick, whose logits row must still be
 * unchanged: the log-softmax of the logits after bias and penalties but
 * before temperature and truncation (what OpenAI reports). Writes token's
 * logprob to *token_logprob and the top_n (clamped to [0,
 * SAMPLER_MAX_TOP_LOGPROBS]) most likely tokens to top, by logprob descending,
 * ties lower id first; tokens of probability zero (-inf or NaN logits) are
 * left out. Returns the number written to top, or -INFERD_EINVAL before any
 * pick or for a token outside the vocabulary. After a backend pick, the
 * numbers come from its result: token must be the pick or one of the
 * reported candidates (else -INFERD_EINVAL), and top holds at most the
 * result's candidates. *token_logprob is -inf for a
 * token of probability zero; JSON writers must map that to a finite value. */
int sampler_logprobs(struct sampler *s, int32_t token, int top_n, float *token_logprob,
                     struct token_logprob *top);

/* Index of the largest logit (lowest index on ties; NaN counts as -inf; 0
 * when no logit is above -inf). */
int32_t logits_argmax(const float *logits, int n);

#endif
