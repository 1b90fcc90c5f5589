/* engine/generate.h — one sequence generated start to finish on the caller's thread, through
 * the serving loop itself (same batches, forward calls, picks and KV bookkeeping as serve). */
#ifndef INFERD_ENGINE_GENERATE_H
#define INFERD_ENGINE_GENERATE_H

#include "engine/sampler.h"
#include "engine/speculate.h"
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

/* generator_create with speculative decoding (spec: a checked configuration, or NULL). */
int generator_create_spec(const struct model *m, int n_ctx, int max_chunk,
                          const struct spec_config *spec, struct generator **out, struct err *err);

/* generator_feed_pick for a speculating generator, where one step may verify drafts and give
 * several tokens: picks[0..*n_picks) (room for 1 + SPEC_MAX_DRAFTS), in order. The last is
 * the next token to feed, as generator_feed_pick's *token; those before it are already in
 * the sequence. The caller calls sampler_accept for each as it wishes; penalties see them
 * only then, so a speculating generator's sampler should have none. */
int generator_feed_picks(struct generator *g, const int32_t *tokens, int n, struct sampler *s,
                         int32_t *picks, int *n_picks, struct err *err);

/* Drafts verified, drafts kept and verify steps of the sequence so far. */
void generator_spec_stats(const struct generator *g, uint64_t *drafted, uint64_t *accepted,
                          uint64_t *verify_steps);

/* Forgets the sequence (blocks go back to the pool). After a failed feed the
 * sequence is forgotten too. */
void generator_reset(struct generator *g);

#endif
