/* engine/generate.h — one sequence generated start to finish on the caller's thread, through
 * the serving loop itself (same batches, forward calls, picks and KV bookkeeping as serve). */
#ifndef INFERD_ENGINE_GENERATE_H
#define INFERD_ENGINE_GENERATE_H

#include "engine/sampler.h"
#include "model/model.h"

struct sched;
struct seq;

struct generator {
    const struct model *model; /* borrowed */
    struct sched *sched;       /* owned; the serving loop, one sequence at most */
    struct seq *seq;           /* owned; the sequence fed so far */
    int n_ctx;                 /* positions the sequence can hold */
    const float *logits;       /* vocab_size floats: the last step's row for the sequence (not
                                  updated by a pick the backend made); borrowed from sched */
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

/* Forgets the sequence (blocks go back to the pool). After a failed feed the
 * sequence is forgotten too. */
void generator_reset(struct generator *g);

#endif
