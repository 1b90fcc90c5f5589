/* tests/unit/golden_support.h — the Hugging Face goldens (tests/goldens) and the parity checks every
 * backend runs against them: one-shot prefill, prefill then token-by-token decode, varlen batches. */
#ifndef INFERD_TEST_GOLDEN_SUPPORT_H
#define INFERD_TEST_GOLDEN_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kv/kv.h"
#include "model/model.h"

#define GOLDEN_BLOCK_SIZE 16
#define GOLDEN_MAX_FILES 64

struct golden_position {
    int argmax;
    double logsumexp, max_abs;
    int n_top;
    int top_ids[64];
    double top_logits[64];
};

struct golden_case {
    int32_t *tokens; /* owned; n_tokens */
    int n_tokens;
    struct golden_position *pos; /* owned; n_tokens */
};

struct golden {
    char name[128];      /* the mkmodel preset */
    char fnv[32];        /* of model.safetensors */
    char config_fnv[32]; /* of config.json */
    struct golden_case *cases; /* owned; n_cases */
    int n_cases;
};

/* Tolerances from the parity contract: exact mode must agree at every
 * position; fast mode (bf16 activations) within 2e-2 of max|logit| at every
 * position, and the same argmax on >= 99% of all the goldens' positions
 * together (bf16 rounding legitimately flips near-ties: the untied presets
 * have top-2 gaps down to 2e-4, so one model alone may lose two of 134). */
struct tolerance {
    double rel_logit;
    double min_argmax_agreement;
    /* Of a model that routes tokens to experts, the share of positions that
     * may exceed rel_logit: an expert choice whose router margin is below
     * bf16's rounding flips in fast mode (the tiny MoE preset has top-k
     * margins of 7e-4 on probabilities near 0.26, under bf16's 3.9e-3
     * relative step), a flipped expert moves that position's hidden state
     * by far more than rounding does, and every later position of the
     * sequence attends to it: one flip at position 15 of a 31-token case
     * puts the 16 positions from there on past rel_logit (16 of 134 on the
     * CPU). The argmax rule still holds for them. 0 for exact mode. */
    double routed_share_over;
};
extern const struct tolerance GOLDEN_EXACT, GOLDEN_FAST;

struct agreement {
    long positions, argmax_equal;
    double worst_rel; /* max over positions of max|delta| / max|logit| */
    double rel_limit; /* positions above it are counted in over */
    long over;
    char worst_where[160];
};

/* The source tree's goldens; INFERD_GOLDEN_DIR overrides it for a test
 * binary carried to another machine. */
const char *golden_dir(void);
/* Every .json file in golden_dir(): one per tiny model. */
int golden_list(char paths[][512], int max);
int golden_load(const char *path, struct golden *g);
void golden_free(struct golden *g);
/* Writes the golden's model into tmp, checks its bytes are the ones the
 * golden was made from, and puts its directory in dir. */
void golden_make_model(const struct golden *g, const char *tmp, char *dir, size_t cap);
/* Folds one row of logits into a's agreement with position p. */
void golden_compare_row(const float *logits, int vocab, const struct golden_position *p,
                        const char *what, int case_idx, int pos, struct agreement *a);

/* Makes the backend under test. */
typedef int (*golden_backend_fn)(enum compute_mode mode, struct backend **out, struct err *err);

struct golden_fixture {
    struct backend *be;
    struct model *model;
    struct kv_pool *pool;
    struct forward_state *state;
    float *logits; /* owned; max_tokens rows */
};

void golden_fixture_open(struct golden_fixture *f, golden_backend_fn make, const char *model_dir,
                         enum compute_mode mode, int max_tokens);
void golden_fixture_close(struct golden_fixture *f);
void golden_forward(struct golden_fixture *f, const struct batch *batch);

/* Every golden through the three runs on the backend make creates, held to
 * tol; label names the backend in the log. */
void golden_check_all(const char *label, golden_backend_fn make, enum compute_mode mode,
                      const struct tolerance *tol);

#endif
