/* text/tok_internal.h — types shared by the tokenizer's parts (normalizers, pre-tokenizers, BPE, added tokens, decoders); not a public contract. */
#ifndef INFERD_TEXT_TOK_INTERNAL_H
#define INFERD_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <json-c/json.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/err.h"
#include "base/json.h"
#include "base/strbuf.h"

/* ---- byte buffers and id lists (tok_utf8.c) ---- */
/* Appends n bytes of s to b; the tokenizer's out-of-memory error when that fails. */
static inline int tok_put(struct strbuf *b, const void *s, size_t n, struct err *err)
{
    return strbuf_append(b, (const char *)s, n) ? 0
                                                : err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
}

struct idlist {
    int32_t *v; /* owned; n ids */
    size_t n, cap;
};
int idlist_push(struct idlist *l, int32_t id, struct err *err);

/* Rust String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD. */
int tok_utf8_lossy(const char *s, size_t len, struct strbuf *out, struct err *err);
/* Decodes the code point at s[*i] (valid UTF-8 assumed) and advances *i. */
uint32_t tok_utf8_next(const char *s, size_t len, size_t *i);
/* Encodes cp into out (4 bytes room); returns the byte count. */
size_t tok_utf8_put(uint32_t cp, char *out);
bool tok_is_whitespace(uint32_t cp); /* Rust char::is_whitespace (Unicode White_Space) */
bool tok_is_alnum(uint32_t cp);      /* Rust char::is_alphanumeric */
bool tok_is_punct(uint32_t cp);      /* Unicode P* or ASCII punctuation */

/* ---- patterns: a literal string or a JIT-compiled PCRE2 regex (pretokenize.c) ---- */
struct tok_pattern {
    char *str;        /* owned; the literal when re is NULL */
    size_t len;
    pcre2_code *re;   /* owned; NULL for a literal */
};
struct span {
    size_t start, end;
    bool is_match;
};
struct spanlist {
    struct span *v; /* owned */
    size_t n, cap;
};

/* Appends the span [s, e) (m: whether it was a match) to l. */
static inline int spanlist_push(struct spanlist *l, size_t s, size_t e, bool m, struct err *err)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        struct span *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (struct span){s, e, m};
    return 0;
}
/* Parses {"String": s} or {"Regex": r}; j is required. */
int tok_pattern_parse(const struct json_reader *j, struct tok_pattern *p, struct err *err);
int tok_pattern_compile_regex(const char *re, size_t len, struct tok_pattern *p, struct err *err);
void tok_pattern_free(struct tok_pattern *p);
/* Non-overlapping matches of p in s, as spans covering s, each marked match or not. */
int tok_pattern_find(const struct tok_pattern *p, const char *s, size_t len, struct spanlist *out,
                     struct err *err);

/* ---- pieces of text moving through the pipeline ---- */
struct piece {
    char *s;    /* len bytes + NUL, in one of the list's blocks */
    size_t len;
    bool first; /* starts at offset 0 of the original text (Metaspace prepend_scheme "first") */
};
/* Piece texts live in a few blocks that never move, so a word costs no malloc of its own. */
struct plist {
    struct piece *v; /* owned */
    size_t n, cap;
    char **blocks;   /* owned, each block owned */
    size_t n_blocks, cap_blocks;
    size_t block_used, block_size; /* of the last block */
};
int plist_push(struct plist *l, const char *s, size_t len, bool first, struct err *err);
void plist_free(struct plist *l);

/* ---- normalizers (normalize.c) ---- */
struct normalizer;
int normalizer_parse(const struct json_reader *j, struct normalizer **out, struct err *err);
/* Replaces *s with its normalized form. */
int normalizer_apply(const struct normalizer *n, struct strbuf *s, struct err *err);
void normalizer_free(struct normalizer *n);

/* ---- pre-tokenizers (pretokenize.c) ---- */
struct pretok;
int pretok_parse(const struct json_reader *j, struct pretok **out, struct err *err);
int pretok_apply(const struct pretok *p, struct plist *l, struct err *err);
void pretok_free(struct pretok *p);
/* GPT-2's byte<->unicode map. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 when cp is not in the map */

/* ---- BPE model (bpe.c) ---- */
struct bpe;
int bpe_parse(const struct json_reader *model, struct bpe **out, struct err *err);
int bpe_encode_word(const struct bpe *m, const char *s, size_t len, struct idlist *out,
                    struct err *err);
void bpe_free(struct bpe *m);
int32_t bpe_piece_to_id(const struct bpe *m, const char *s, size_t len);
const char *bpe_id_to_piece(const struct bpe *m, int32_t id);
int32_t bpe_max_id(const struct bpe *m);

/* ---- added tokens (added_tokens.c) ---- */
struct added_token {
    char *content; /* owned */
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
};
struct added_matcher;
/* Builds a leftmost-longest matcher over the tokens whose normalized flag equals
 * want_normalized; for normalized ones, norm (may be NULL) is applied to the content. */
int added_matcher_build(const struct added_token *toks, size_t n, bool want_normalized,
                        const struct normalizer *norm, struct added_matcher **out,
                        struct err *err);
void added_matcher_free(struct added_matcher *m);
bool added_matcher_empty(const struct added_matcher *m);
/* Splits s into spans: is_match spans carry the token index in *tok_idx (same order). */
int added_matcher_split(const struct added_matcher *m, const struct added_token *toks,
                        const char *s, size_t len, struct spanlist *out, struct idlist *tok_idx,
                        struct err *err);

/* ---- post-processors and decoders (postprocess.c, decoders.c) ---- */
struct postproc;
int postproc_parse(const struct json_reader *j, struct postproc **out, struct err *err);
int postproc_apply(const struct postproc *p, const struct idlist *in, struct idlist *out,
                   struct err *err);
void postproc_free(struct postproc *p);

struct decoder;
int decoder_parse(const struct json_reader *j, struct decoder **out, struct err *err);
/* Runs the decoder chain over pieces (replaced in place by its output). */
int decoder_apply(const struct decoder *d, struct plist *l, struct err *err);
void decoder_free(struct decoder *d);
/* Whether the chain joins runs of <0xNN> tokens (ByteFallback): such a run's text is
 * only final once the run ends. */
bool decoder_has_byte_fallback(const struct decoder *d);

/* ---- used by the streaming detokenizer (tokenizer.c) ---- */
struct tokenizer;
bool tok_decoder_joins_byte_runs(const struct tokenizer *tok);
bool tok_id_is_byte_token(const struct tokenizer *tok, int32_t id);

/* ---- reading tokenizer.json (tokenizer.c) ---- */
/* The "type" member of a component, which must be an object. */
int tok_json_type(const struct json_reader *j, const char **out);
/* An integer in [0, max] that indexes tables (ids, counts): anything else is a
 * malformed file, -INFERD_EFORMAT. present as for json_read_int64. */
int tok_json_index(const struct json_reader *j, const char *key, bool *present, int64_t max,
                   int64_t *out);
/* Sequence members: array key of j (required), each element parsed by parse
 * into (*subs)[i]; *subs is calloc'd and owned by the caller, and *n counts
 * the members parsed, so after an error the caller frees exactly those. */
int tok_json_components(const struct json_reader *j, const char *key,
                        int (*parse)(const struct json_reader *e, void **out, struct err *err),
                        void ***subs, size_t *n, struct err *err);
/* A string of exactly one character (after lossy UTF-8 decoding); dflt when absent. */
int tok_json_char(const struct json_reader *j, const char *key, const char *dflt, uint32_t *out,
                  struct err *err);

#endif
