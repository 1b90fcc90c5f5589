/* grammar/vocab.c — a tokenizer's vocabulary as raw bytes per token, sorted into a trie (preorder
 * with common-prefix lengths) for the mask engine's walks. */
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "grammar/gram_internal.h"
#include "text/tokenizer.h"

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->special);
    free(v->sorted);
    free(v->lcp);
    free(v);
}

int grammar_vocab_size(const struct grammar_vocab *v)
{
    return v->n_vocab;
}

const char *grammar_vocab_token(const struct grammar_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n_vocab)
        return NULL;
    return (const char *)vocab_tok(v, id, len);
}

struct tok_key {
    const uint8_t *p;
    size_t len;
    int32_t id;
};

static int cmp_tok(const void *a, const void *b)
{
    const struct tok_key *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Sorts, computes common prefixes and the first-byte index; v's bytes, off, special set. */
static int index_vocab(struct grammar_vocab *v, struct err *err)
{
    v->sorted = malloc(((size_t)v->n_vocab + 1) * sizeof *v->sorted);
    v->lcp = malloc(((size_t)v->n_vocab + 1) * sizeof *v->lcp);
    if (!v->sorted || !v->lcp)
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory for the vocabulary");
    int n = 0;
    uint64_t h = HASH_FNV_OFFSET;
    for (int32_t t = 0; t < v->n_vocab; t++) {
        size_t len;
        const uint8_t *p = vocab_tok(v, t, &len);
        h = hash_fnv1a_word(hash_fnv1a(h, p, len), len * 2 + v->special[t]);
        if (v->special[t] || !len)
            continue;
        if (len > 60000)
            return err_set(err, INFERD_EINVAL, "grammar: token %d is %zu bytes long", t, len);
        v->sorted[n++] = t;
        if ((int)len > v->max_len)
            v->max_len = (int)len;
    }
    v->digest = hash_mix64(h);
    v->n_sorted = n;
    struct tok_key *keys = malloc(((size_t)n + 1) * sizeof *keys);
    if (!keys)
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory for the vocabulary");
    for (int i = 0; i < n; i++) {
        keys[i].id = v->sorted[i];
        keys[i].p = vocab_tok(v, keys[i].id, &keys[i].len);
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_tok);
    for (int i = 0; i < n; i++)
        v->sorted[i] = keys[i].id;
    free(keys);
    for (int i = 0; i < n; i++) {
        size_t la, lb;
        const uint8_t *a = i ? vocab_tok(v, v->sorted[i - 1], &la) : NULL;
        const uint8_t *b = vocab_tok(v, v->sorted[i], &lb);
        size_t c = 0;
        if (a)
            while (c < la && c < lb && a[c] == b[c])
                c++;
        v->lcp[i] = (uint16_t)c;
    }
    int at = 0;
    for (int b = 0; b <= 256; b++) {
        while (at < n) {
            size_t len;
            const uint8_t *p = vocab_tok(v, v->sorted[at], &len);
            if (b < 256 && p[0] >= b)
                break;
            at++;
        }
        v->first[b] = at;
    }
    return 0;
}

int grammar_vocab_from_bytes(const char *const *tokens, const size_t *lens, int n_vocab,
                             const bool *special, struct grammar_vocab **out, struct err *err)
{
    *out = NULL;
    if (n_vocab <= 0)
        return err_set(err, INFERD_EINVAL, "grammar: an empty vocabulary");
    struct grammar_vocab *v = calloc(1, sizeof *v);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++)
        total += lens[i];
    if (v) {
        v->n_vocab = n_vocab;
        v->bytes = malloc(total + 1);
        v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
        v->special = calloc((size_t)n_vocab, sizeof *v->special);
    }
    if (!v || !v->bytes || !v->off || !v->special) {
        grammar_vocab_free(v);
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory for the vocabulary");
    }
    size_t at = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = at;
        if (lens[i])
            memcpy(v->bytes + at, tokens[i], lens[i]);
        at += lens[i];
        v->special[i] = special && special[i];
    }
    v->off[n_vocab] = at;
    int rc = index_vocab(v, err);
    if (rc) {
        grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* GPT-2's byte-level alphabet: byte b is shown as codepoint byte_cp(b). */
static uint32_t byte_cp(int b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    int n = 0;
    for (int k = 0; k < b; k++)
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF)))
            n++;
    return 256u + (uint32_t)n;
}

static uint32_t utf8_next(const uint8_t *s, size_t len, size_t *i)
{
    uint8_t c = s[*i];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n && *i + k < len; k++)
        cp = cp << 6 | (s[*i + k] & 0x3F);
    *i += (size_t)n;
    return cp;
}

static int hexv(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

enum vocab_style { STYLE_RAW, STYLE_BYTELEVEL, STYLE_SENTENCEPIECE };

/* The piece's raw bytes appended at out (room for 4 × its length). */
static size_t piece_bytes(const char *piece, enum vocab_style style, const int16_t *cp_byte,
                          bool special, char *out)
{
    size_t len = strlen(piece);
    const uint8_t *p = (const uint8_t *)piece;
    if (style == STYLE_SENTENCEPIECE && !special) {
        if (len == 6 && !memcmp(piece, "<0x", 3) && piece[5] == '>' && hexv(piece[3]) >= 0 &&
            hexv(piece[4]) >= 0) {
            out[0] = (char)(hexv(piece[3]) * 16 + hexv(piece[4]));
            return 1;
        }
        size_t n = 0;
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(piece + i, "\xE2\x96\x81", 3)) {
                out[n++] = ' ';
                i += 3;
            } else {
                out[n++] = piece[i++];
            }
        }
        return n;
    }
    if (style == STYLE_BYTELEVEL && !special) {
        /* a piece whose characters are not all in the byte alphabet passes as it is, as the
         * ByteLevel decoder does (added tokens written in plain text) */
        size_t n = 0;
        for (size_t i = 0; i < len;) {
            uint32_t cp = utf8_next(p, len, &i);
            if (cp >= 512 || cp_byte[cp] < 0) {
                memcpy(out, piece, len);
                return len;
            }
            out[n++] = (char)cp_byte[cp];
        }
        return n;
    }
    memcpy(out, piece, len);
    return len;
}

int grammar_vocab_create(const struct tokenizer *tok, struct grammar_vocab **out, struct err *err)
{
    *out = NULL;
    int n = tok_vocab_size(tok);
    if (n <= 0)
        return err_set(err, INFERD_EINVAL, "grammar: the tokenizer has no vocabulary");
    enum vocab_style style = STYLE_RAW;
    if (tok_piece_to_id(tok, "<0x0A>") >= 0)
        style = STYLE_SENTENCEPIECE;
    else if (tok_piece_to_id(tok, "\xC4\xA0") >= 0 || tok_piece_to_id(tok, "\xC4\x8A") >= 0)
        style = STYLE_BYTELEVEL; /* Ġ (space) or Ċ (newline) */
    int16_t cp_byte[512];
    for (int i = 0; i < 512; i++)
        cp_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        cp_byte[byte_cp(b)] = (int16_t)b;
    size_t total = 0;
    for (int32_t t = 0; t < n; t++) {
        const char *p = tok_id_to_piece(tok, t);
        total += p ? strlen(p) : 0;
    }
    char *buf = malloc(total + 1);
    const char **toks = malloc((size_t)n * sizeof *toks);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    bool *special = malloc((size_t)n * sizeof *special);
    int rc;
    if (!buf || !toks || !lens || !special) {
        rc = err_set(err, INFERD_ENOMEM, "grammar: out of memory for the vocabulary");
        goto out;
    }
    size_t at = 0;
    for (int32_t t = 0; t < n; t++) {
        const char *p = tok_id_to_piece(tok, t);
        special[t] = !p || tok_is_special(tok, t);
        toks[t] = buf + at;
        lens[t] = p ? piece_bytes(p, style, cp_byte, special[t], buf + at) : 0;
        at += lens[t];
    }
    rc = grammar_vocab_from_bytes(toks, lens, n, special, out, err);
out:
    free(buf);
    free(toks);
    free(lens);
    free(special);
    return rc;
}
