/* grammar/gram_internal.h — what the grammar module's parts share (the expression builder the
 * front ends write, the compiled automaton the matcher reads); not a public contract. */
#ifndef INFERD_GRAMMAR_GRAM_INTERNAL_H
#define INFERD_GRAMMAR_GRAM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

/* ---- expressions (build.c): what front ends produce -------------------------
 *
 * Nodes live in arrays owned by the builder and are named by index. A rule is a name and an
 * expression; expressions refer to rules by id, so a rule may be used before it is defined
 * (recursion). Codepoint classes become UTF-8 byte automata when compiled. */

enum gx_kind {
    GX_EMPTY,   /* the empty string */
    GX_BYTES,   /* a literal: bytes[off .. off+n) */
    GX_CLASS,   /* one codepoint in ranges cps[off .. off+2n) (lo, hi pairs) */
    GX_BCLASS,  /* one byte in ranges cps[off .. off+2n) (lo, hi ≤ 255) */
    GX_SEQ,     /* kids[off .. off+n) one after another */
    GX_ALT,     /* one of kids[off .. off+n) */
    GX_REPEAT,  /* kids[off] between min and max times (max < 0: unbounded) */
    GX_RULE,    /* a call of rule off */
};

struct gx {
    int kind;
    int n, off;
    int min, max;
};

struct grule {
    char *name;   /* owned */
    int expr;     /* -1 until defined */
};

struct gbuild {
    struct gx *x;          /* owned; nodes */
    int nx, capx;
    int *kids;             /* owned */
    int nkids, capkids;
    char *bytes;           /* owned */
    size_t nbytes, capbytes;
    uint32_t *cps;         /* owned */
    int ncps, capcps;
    struct grule *rules;   /* owned */
    int nrules, caprules;
    size_t max_states;     /* the compile limit; expressions are bounded by it too */
    bool oom;              /* an allocation failed: every later node is -1 */
    bool too_big;          /* the expression outgrew the limit */
};

void gb_init(struct gbuild *b, const struct grammar_options *o);
void gb_free(struct gbuild *b);
/* Node constructors return the node's index, or -1 after a failure (oom/too_big set); a -1
 * argument propagates, so callers check once at the end. */
int gb_empty(struct gbuild *b);
int gb_bytes(struct gbuild *b, const char *s, size_t n);
int gb_str(struct gbuild *b, const char *s);
int gb_class(struct gbuild *b, const uint32_t *ranges, int n_ranges); /* codepoints, lo/hi pairs */
int gb_bclass(struct gbuild *b, const uint32_t *ranges, int n_ranges); /* bytes, lo/hi pairs */
int gb_char(struct gbuild *b, uint32_t lo, uint32_t hi);              /* one codepoint range */
int gb_seq(struct gbuild *b, const int *kids, int n);
int gb_alt(struct gbuild *b, const int *kids, int n);
int gb_seq2(struct gbuild *b, int a, int c);
int gb_alt2(struct gbuild *b, int a, int c);
int gb_repeat(struct gbuild *b, int kid, int min, int max);
int gb_call(struct gbuild *b, int rule);
/* A new rule (name copied); returns its id or -1. */
int gb_rule(struct gbuild *b, const char *name, size_t name_len);
/* The id of the rule named so, or -1. */
int gb_find_rule(const struct gbuild *b, const char *name, size_t name_len);
void gb_define(struct gbuild *b, int rule, int expr);
/* Sorts and merges codepoint ranges (n pairs in place); returns the new count. */
int gb_normalize_ranges(uint32_t *r, int n);
/* The complement of normalized ranges within [0, max] (surrogates excluded when max > 0xFF);
 * out has room for n + 1 pairs; returns the count. */
int gb_complement_ranges(const uint32_t *r, int n, uint32_t max, uint32_t *out);
/* The error for a failed builder (oom or too big), as err_set does. */
int gb_fail(const struct gbuild *b, struct err *err);

/* A regular expression as an expression (regex.c). json: the pattern constrains a JSON
 * string's decoded text, so characters JSON must escape are written as their escapes, and
 * an unanchored side is padded with any characters (JSON Schema's search semantics); without
 * json the pattern must match the whole input. Errors name the byte offset. */
int rx_parse(struct gbuild *b, const char *re, size_t len, bool json, int *expr, struct err *err);
/* One character of a JSON string's contents from the codepoint ranges r (n pairs, normalized):
 * plain characters as themselves, the ones JSON must escape as escapes (regex.c). */
int rx_json_class(struct gbuild *b, const uint32_t *r, int n);

/* Compiles the builder's rules (root rule root) into a grammar (compile.c). */
int gb_compile(struct gbuild *b, int root, struct grammar **out, struct err *err);

/* ---- the compiled automaton (compile.c), read by the matcher ------------------ */

enum {
    GS_FINAL = 1,  /* the rule may end here */
    GS_CALLS = 2,  /* has call edges */
    GS_BYTES = 4,  /* has byte edges */
};

struct gcall {
    int32_t rule, ret; /* callee, and the state to continue in after it */
};

struct mask_cache;

struct grammar {
    int n_states, n_rules, root;
    int32_t *state_rule;    /* owned; n_states */
    uint8_t *flags;         /* owned; n_states, GS_* */
    int32_t *trans_off;     /* owned; n_states: where the state's row starts in trans */
    int32_t *trans;         /* owned; a row per state: next state per byte class, -1 none */
    uint8_t *classmap;      /* owned; n_rules × 256: byte → class within the rule */
    int32_t *call_off;      /* owned; n_states + 1 */
    struct gcall *calls;    /* owned */
    int32_t *rule_start;    /* owned; n_rules */
    uint16_t *rule_nclass;  /* owned; n_rules */
    uint64_t digest;
    /* The mask cache of the first vocabulary used with the grammar (mask.c). */
    pthread_mutex_t cache_lock;
    _Atomic(struct mask_cache *) cache; /* owned */
};

static inline int32_t gram_next(const struct grammar *g, int32_t s, uint8_t byte)
{
    return g->trans[g->trans_off[s] + g->classmap[(size_t)g->state_rule[s] * 256 + byte]];
}

/* ---- vocabularies (vocab.c) ------------------------------------------------ */

struct grammar_vocab {
    int n_vocab;
    char *bytes;           /* owned; every token's bytes, back to back */
    size_t *off;           /* owned; n_vocab + 1 */
    bool *special;         /* owned; n_vocab */
    /* The tokens that can ever be allowed (not special, not empty), sorted by their bytes:
     * a trie in preorder. */
    int32_t *sorted;       /* owned; n_sorted ids */
    uint16_t *lcp;         /* owned; common prefix with the previous sorted token (capped) */
    int n_sorted;
    int first[257];        /* sorted tokens starting with byte b: [first[b], first[b+1]) */
    int max_len;
    uint64_t digest;
};

static inline const uint8_t *vocab_tok(const struct grammar_vocab *v, int32_t id, size_t *len)
{
    *len = v->off[id + 1] - v->off[id];
    return (const uint8_t *)v->bytes + v->off[id];
}

/* ---- stacks and positions (matcher.c), shared with the mask engine ------------- */

#define GSS_NIL 0   /* the bottom of a real stack: popping it accepts */
#define GSS_SENT 1  /* the bottom of a cache walk's stack: popping it leaves the rule */

/* Hash-consed stack frames: (return state, parent). Frames are freed in the reverse order of
 * their creation only (gss_truncate), which keeps each bucket's chain a stack. */
struct gss {
    int32_t *ret, *parent, *next; /* owned; per frame */
    int n, cap;
    int32_t *bucket;              /* owned; nb heads */
    int nb;
};

struct gelem {
    int32_t state, stack;
};

/* A position: the pairs that can read a byte, and whether the grammar may end here (or, in
 * a cache walk, whether the walked rule ended). */
struct gset {
    struct gelem *e; /* owned */
    int n, cap;
    bool accepting;  /* popped GSS_NIL */
    bool ended;      /* popped GSS_SENT */
};

int gss_init(struct gss *s);
void gss_free(struct gss *s);
void gss_truncate(struct gss *s, int n);
void gset_free(struct gset *s);
int gset_reserve(struct gset *s, int n);
int gset_copy(struct gset *dst, const struct gset *src);

/* Scratch space for closures. */
struct gwork {
    struct gelem *todo, *seen; /* owned */
    int cap_todo, cap_seen;
};
void gwork_free(struct gwork *w);

/* Sets out to the closure of the pairs seeds[0..n). -INFERD_ENOMEM, or -INFERD_ERANGE when a
 * position grows past its limit. */
int gram_close(const struct grammar *g, struct gss *gss, struct gwork *w, const struct gelem *seeds,
               int n, struct gset *out);
/* out = in after reading byte (out != in). */
int gram_step(const struct grammar *g, struct gss *gss, struct gwork *w, const struct gset *in,
              uint8_t byte, struct gset *out);

/* ---- the mask engine (mask.c) ---------------------------------------------------- */

/* Positions along a walk down the vocabulary trie, one per depth. */
struct gwalk {
    struct gset *lvl; /* owned; n_lvl */
    bool *endacc;     /* owned; n_lvl: the rule ended at this depth or before */
    int n_lvl;
};
void gwalk_free(struct gwalk *k);

/* The cache of one grammar for one vocabulary; NULL when memory runs out. */
struct mask_cache *mask_cache_create(const struct grammar *g, const struct grammar_vocab *v);
void mask_cache_free(struct mask_cache *c);
/* Computes every state's entry now (so no mask waits for one). */
int mask_cache_fill(const struct grammar *g, struct mask_cache *c);
/* Whether c was made for v. */
bool mask_cache_for(const struct mask_cache *c, const struct grammar_vocab *v);
/* ORs into bits the tokens allowed from the pair e (whose state reads bytes): the state's
 * context-independent tokens when add_accepted (a caller doing several pairs of one state
 * asks once), and those of its uncertain tokens the real stack accepts. Pushes frames on
 * gss; the caller truncates. */
int mask_add_elem(const struct grammar *g, const struct grammar_vocab *v, struct mask_cache *c,
                  struct gss *gss, struct gwork *w, struct gwalk *wk, struct gelem e,
                  bool add_accepted, uint32_t *bits);

#endif
