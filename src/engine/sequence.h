/* engine/sequence.h — one request inside the engine: its tokens, KV blocks, sampler,
 * detokenizer and stop strings. Used only by the engine thread. */
#ifndef INFERD_ENGINE_SEQUENCE_H
#define INFERD_ENGINE_SEQUENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "kv/kv.h"
#include "text/tokenizer.h"

struct seq {
    struct gen_output *out;     /* one reference, dropped by seq_free */
    int32_t *tokens;            /* owned; prompt then generated, room for n_prompt + max_tokens */
    int n_prompt;
    int n_tokens;               /* prompt + generated so far */
    int n_computed;             /* leading tokens whose K/V are in the cache */
    int max_tokens;
    int logprobs;               /* -1: none */
    int32_t *eos_ids;           /* owned; n_eos */
    int n_eos;
    struct block_table blocks;
    struct sampler sampler;
    bool sampler_ready;
    struct detok *detok;        /* owned */
    struct stop_matcher *stop;  /* owned */
    uint64_t t_submit_ns, t_last_token_ns;
    uint64_t admit_order;       /* later admissions are preempted first */
};

/* The engine's side of struct gen_output (engine/gen_output.c). */
struct gen_output *gen_output_create(int n_prompt);
/* Appends text (and, for logprobs requests, token) under the lock, counts a
 * generated token when new_token, and wakes the reader; false when memory ran out. */
bool gen_output_publish(struct gen_output *o, const char *text, size_t len, bool new_token,
                        const struct gen_token *token);
void gen_output_finish(struct gen_output *o, enum gen_finish why, int error_code,
                       const char *error);

/* A sequence for p (copied), with a fresh gen_output holding two references
 * (the sequence's and the caller's). */
int seq_create(const struct gen_params *p, const struct tokenizer *tok, int n_vocab,
               struct seq **out, struct gen_output **output, struct err *err);

/* Returns the blocks to pool (when non-NULL) and drops the output reference. */
void seq_free(struct seq *s, struct kv_pool *pool);

/* Consumes the logits that predict the token after tokens[n_tokens - 1]:
 * samples it and publishes its text. Returns GEN_RUNNING, or why the
 * sequence is finished: GEN_FINISH_STOP (end-of-sequence token or stop
 * string) or GEN_FINISH_LENGTH (max_tokens reached or the context full). */
enum gen_finish seq_take_token(struct seq *s, const float *logits, int n_ctx, struct engine_metrics *metrics);

/* seq_take_token for a token the backend sampled: spec is what
 * sampler_fill_spec gave for this step, res the backend's result and
 * host_row the row's processed logits when res->need_host. */
enum gen_finish seq_take_result(struct seq *s, const struct sample_spec *spec,
                                const struct sample_result *res, const float *host_row, int n_ctx,
                                struct engine_metrics *metrics);

/* Publishes the held-back text (unless a stop string fired) and the finish reason. */
void seq_finish(struct seq *s, enum gen_finish why, int error_code, const char *error);

#endif
