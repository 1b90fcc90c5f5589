/* engine/constrain.h — one sequence's structured output: its position in a shared gen_grammar
 * (a grammar_matcher per stage), the allowed-token mask it hands the sampler each step, EOS
 * only where the grammar accepts, and jump-forward over the text the grammar forces.
 * Used only by the thread that drives the serving loop (and seq_create before it).
 *
 * The mask covers the model's n_vocab output rows: bit t of word t >> 5 set when token t may
 * be picked. Tokens past the tokenizer's vocabulary and special tokens are never allowed; an
 * end-of-sequence id is allowed exactly where the last stage accepts.
 *
 * Jump-forward: after a picked token t is accepted, when the grammar forces bytes w, the
 * canonical tokens of bytes(t) + w (the tokenizer's own encoding, so the boundary with t is
 * re-tokenized) replace t: when they start with t, only the rest is appended; otherwise t is
 * rolled back (grammar_matcher_rollback) and all of them go out in its place. Tokens that the
 * grammar would not accept one by one (a canonical token it refuses) cancel the jump. */
#ifndef INFERD_ENGINE_CONSTRAIN_H
#define INFERD_ENGINE_CONSTRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "grammar/grammar.h"

/* The most tokens one jump appends. */
#define CONSTRAIN_MAX_JUMP 64

struct constrain {
    struct gen_grammar *g;          /* one reference; NULL: unconstrained */
    const struct tokenizer *tok;    /* borrowed; for jump-forward's canonical tokens */
    struct grammar_matcher *m;      /* owned; the current stage's position */
    int stage;
    int n_in_stage;                 /* tokens m accepted (what rollback may undo) */
    int n_vocab;                    /* the model's output rows (mask bits) */
    uint32_t *mask;                 /* owned; (n_vocab + 31) / 32 words, the next pick's */
    bool mask_ready;                /* mask holds the current position's */
    bool any_allowed;               /* the mask allows some token (or EOS) */
    bool after_think;               /* applies outside <think> only */
    bool jump_forward;
};

/* Takes a reference on p->grammar (nothing when it is NULL). */
int constrain_init(struct constrain *c, const struct gen_params *p, const struct tokenizer *tok,
                   int n_vocab, struct err *err);
void constrain_free(struct constrain *c);
static inline bool constrain_on(const struct constrain *c) { return c->g != NULL; }

/* Computes the mask of the next pick (eos ids allowed when the grammar accepts); the time it
 * took goes to metrics (may be NULL). -INFERD_ENOMEM only. */
int constrain_fill_mask(struct constrain *c, const int32_t *eos, int n_eos,
                        struct engine_metrics *metrics);

/* Advances by a picked token (moving to the next stage when the current one is finished).
 * -INFERD_EINVAL when the grammar does not allow it (state unchanged). */
int constrain_accept(struct constrain *c, int32_t token);

/* The grammar accepts here: the reply may end. */
bool constrain_accepting(const struct constrain *c);
/* The last stage is finished: nothing more may follow. */
bool constrain_finished(const struct constrain *c);

/* Jump-forward after token last was accepted: fills out (cap entries) with the tokens that go
 * out in last's place (out[0] == last when last stands; n_out 1 when nothing is forced) and
 * advances the matcher past all of them. Returns n_out (>= 1). */
int constrain_jump(struct constrain *c, int32_t last, int32_t *out, int cap);

#endif
