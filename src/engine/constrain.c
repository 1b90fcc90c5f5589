/* engine/constrain.c — structured output inside the engine: shared, reference-counted grammars
 * and each sequence's matcher over them (masks, acceptance, stages, jump-forward). */
#include "engine/constrain.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "text/tokenizer.h"

struct gen_grammar {
    atomic_int refs;
    int n_stages;
    struct grammar *stages[GEN_GRAMMAR_MAX_STAGES]; /* owned */
    const struct grammar_vocab *vocab;               /* borrowed */
};

int gen_grammar_create(struct grammar *const *stages, int n, const struct grammar_vocab *vocab,
                       struct gen_grammar **out, struct err *err)
{
    *out = NULL;
    struct gen_grammar *g = NULL;
    int rc = 0;
    if (n < 1 || n > GEN_GRAMMAR_MAX_STAGES || !vocab) {
        rc = err_set(err, INFERD_EINVAL, "a constraint has 1 to %d stages and a vocabulary, got %d",
                     GEN_GRAMMAR_MAX_STAGES, n);
        goto fail;
    }
    if (!(g = calloc(1, sizeof *g))) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for a grammar");
        goto fail;
    }
    atomic_init(&g->refs, 1);
    g->n_stages = n;
    g->vocab = vocab;
    for (int i = 0; i < n; i++)
        g->stages[i] = stages[i];
    /* Every state's mask now, on the caller's thread: p99 mask time stays flat afterwards. */
    for (int i = 0; i < n && rc == 0; i++) {
        struct grammar_matcher *m = NULL;
        if ((rc = grammar_matcher_create(g->stages[i], vocab, &m, err)) == 0 &&
            (rc = grammar_matcher_prepare(m)) < 0)
            rc = err_set(err, -rc, "out of memory preparing a grammar's masks");
        grammar_matcher_free(m);
    }
    if (rc < 0) {
        gen_grammar_release(g);
        return rc;
    }
    *out = g;
    return 0;
fail:
    for (int i = 0; i < n && i < GEN_GRAMMAR_MAX_STAGES; i++)
        grammar_free(stages[i]);
    return rc;
}

void gen_grammar_retain(struct gen_grammar *g)
{
    atomic_fetch_add(&g->refs, 1);
}

void gen_grammar_release(struct gen_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    for (int i = 0; i < g->n_stages; i++)
        grammar_free(g->stages[i]);
    free(g);
}

/* ---- a sequence's position ------------------------------------------------------------ */

static int open_stage(struct constrain *c, int stage, struct err *err)
{
    struct grammar_matcher *m;
    int rc = grammar_matcher_create(c->g->stages[stage], c->g->vocab, &m, err);
    if (rc < 0)
        return rc;
    grammar_matcher_free(c->m);
    c->m = m;
    c->stage = stage;
    c->n_in_stage = 0;
    c->mask_ready = false;
    return 0;
}

int constrain_init(struct constrain *c, const struct gen_params *p, const struct tokenizer *tok,
                   int n_vocab, struct err *err)
{
    memset(c, 0, sizeof *c);
    if (!p->grammar)
        return 0;
    gen_grammar_retain(p->grammar);
    c->g = p->grammar;
    c->tok = tok;
    c->n_vocab = n_vocab;
    c->after_think = p->grammar_after_think;
    c->jump_forward = p->jump_forward && tok;
    if (!(c->mask = calloc(((size_t)n_vocab + 31) / 32, sizeof *c->mask))) {
        constrain_free(c);
        return err_set(err, INFERD_ENOMEM, "out of memory for a token mask");
    }
    int rc = open_stage(c, 0, err);
    if (rc < 0)
        constrain_free(c);
    return rc;
}

void constrain_free(struct constrain *c)
{
    grammar_matcher_free(c->m);
    free(c->mask);
    gen_grammar_release(c->g);
    memset(c, 0, sizeof *c);
}

static bool last_stage(const struct constrain *c)
{
    return c->stage == c->g->n_stages - 1;
}

bool constrain_accepting(const struct constrain *c)
{
    return last_stage(c) && grammar_matcher_is_accepting(c->m);
}

bool constrain_finished(const struct constrain *c)
{
    return last_stage(c) && grammar_matcher_is_finished(c->m);
}

/* A finished stage hands over to the next; false when that ran out of memory. */
static bool advance_stage(struct constrain *c)
{
    struct err err = {0};
    if (!last_stage(c) && grammar_matcher_is_finished(c->m))
        return open_stage(c, c->stage + 1, &err) == 0;
    return true;
}

int constrain_fill_mask(struct constrain *c, const int32_t *eos, int n_eos,
                        struct engine_metrics *metrics)
{
    uint64_t t0 = now_ns();
    int n_words = (c->n_vocab + 31) / 32;
    int n_tok = grammar_vocab_size(c->g->vocab);
    bool eos_ok = false;
    if (n_tok > c->n_vocab)
        n_tok = c->n_vocab; /* a model with fewer rows than the tokenizer: the rest never come */
    uint32_t *bits = c->mask;
    uint32_t *tmp = NULL;
    if (n_tok < grammar_vocab_size(c->g->vocab)) {
        tmp = calloc(((size_t)grammar_vocab_size(c->g->vocab) + 31) / 32, sizeof *tmp);
        if (!tmp)
            return -INFERD_ENOMEM;
        bits = tmp;
    }
    int rc = grammar_matcher_fill_mask(c->m, bits, &eos_ok);
    if (rc < 0) {
        free(tmp);
        return rc;
    }
    if (tmp) {
        memcpy(c->mask, tmp, (size_t)n_words * sizeof *c->mask);
        free(tmp);
    }
    /* Rows past the tokenizer's vocabulary are never allowed. */
    int full = n_tok / 32;
    if (n_tok % 32 && full < n_words)
        c->mask[full++] &= (1u << (n_tok % 32)) - 1;
    for (int w = full; w < n_words; w++)
        c->mask[w] = 0;
    eos_ok = eos_ok && last_stage(c);
    for (int i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < c->n_vocab) {
            uint32_t bit = 1u << (eos[i] & 31);
            c->mask[eos[i] >> 5] = eos_ok ? c->mask[eos[i] >> 5] | bit : c->mask[eos[i] >> 5] & ~bit;
        }
    uint32_t any = 0;
    for (int w = 0; w < n_words && !any; w++)
        any |= c->mask[w];
    c->any_allowed = any != 0;
    c->mask_ready = true;
    if (metrics) {
        uint64_t i = atomic_fetch_add(&metrics->grammar_masks, 1);
        uint64_t dt = now_ns() - t0;
        atomic_store(&metrics->mask_ns[i % ENGINE_MASK_WINDOW],
                     (uint32_t)(dt > UINT32_MAX ? UINT32_MAX : dt));
    }
    return 0;
}

int constrain_accept(struct constrain *c, int32_t token)
{
    int rc = grammar_matcher_accept_token(c->m, token);
    if (rc < 0)
        return -INFERD_EINVAL;
    c->n_in_stage++;
    c->mask_ready = false;
    return advance_stage(c) ? 0 : -INFERD_ENOMEM;
}

/* Accepts toks[0..n) one by one; on a refusal undoes those taken and returns false. */
static bool accept_all(struct constrain *c, const int32_t *toks, int n)
{
    for (int i = 0; i < n; i++)
        if (grammar_matcher_accept_token(c->m, toks[i]) < 0) {
            if (i > 0)
                grammar_matcher_rollback(c->m, i);
            return false;
        }
    c->n_in_stage += n;
    return true;
}

/* One jump within the current stage after token last (accepted in this stage's matcher when
 * last_here): fills res with the canonical tokens of bytes(last) + the forced bytes, or of the
 * forced bytes alone, and advances past them. *replaces: res[0] stands in last's place (last
 * was rolled back). Returns how many, 0 when nothing is forced or the jump did not take. */
static int jump_once(struct constrain *c, int32_t last, bool last_here, int32_t *res, int cap,
                     bool *replaces)
{
    char forced[256];
    *replaces = false;
    size_t n_forced = grammar_matcher_forced_bytes(c->m, forced, sizeof forced);
    if (n_forced == 0 || cap < 1)
        return 0;
    size_t last_len = 0;
    const char *last_bytes = last_here ? grammar_vocab_token(c->g->vocab, last, &last_len) : NULL;
    if (!last_bytes || last_len > 256)
        last_len = 0;
    char text[512];
    if (last_len)
        memcpy(text, last_bytes, last_len);
    memcpy(text + last_len, forced, n_forced);
    int32_t *ids = NULL;
    int n_ids = 0, n = 0;
    struct err err = {0};
    if (tok_encode(c->tok, text, last_len + n_forced, false, &ids, &n_ids, &err) < 0)
        return 0;
    if (last_len > 0 && n_ids > 0 && ids[0] == last) {
        /* last stands: the rest follows it */
        int k = n_ids - 1 < cap ? n_ids - 1 : cap;
        if (k > 0 && accept_all(c, ids + 1, k)) {
            memcpy(res, ids + 1, (size_t)k * sizeof *res);
            n = k;
        }
    } else if (last_len > 0) {
        /* the boundary tokenizes differently: last is rolled back and replaced */
        int k = n_ids < cap ? n_ids : cap;
        if (k > 0 && grammar_matcher_rollback(c->m, 1) == 0) {
            c->n_in_stage--;
            if (accept_all(c, ids, k)) {
                memcpy(res, ids, (size_t)k * sizeof *res);
                n = k;
                *replaces = true;
            } else if (grammar_matcher_accept_token(c->m, last) == 0) { /* back where it was */
                c->n_in_stage++;
            }
        }
    } else {
        int k = n_ids < cap ? n_ids : cap;
        if (k > 0 && accept_all(c, ids, k)) {
            memcpy(res, ids, (size_t)k * sizeof *res);
            n = k;
        }
    }
    free(ids);
    return n;
}

int constrain_jump(struct constrain *c, int32_t last, int32_t *out, int cap)
{
    out[0] = last;
    int n_out = 1;
    if (!c->jump_forward)
        return n_out;
    /* Several rounds: a stage the jump finished hands over to the next, which may force more. */
    for (int round = 0; round < GEN_GRAMMAR_MAX_STAGES * 2 && n_out < cap; round++) {
        int32_t res[CONSTRAIN_MAX_JUMP];
        bool replaces;
        bool boundary = round == 0 && c->n_in_stage > 0;
        int room = cap - n_out + (boundary ? 1 : 0);
        int got = jump_once(c, out[n_out - 1], boundary, res,
                            room < CONSTRAIN_MAX_JUMP ? room : CONSTRAIN_MAX_JUMP, &replaces);
        if (got == 0)
            break;
        int at = replaces ? n_out - 1 : n_out;
        memcpy(out + at, res, (size_t)got * sizeof *out);
        n_out = at + got;
        c->mask_ready = false;
        if (!advance_stage(c))
            break;
    }
    return n_out;
}
