/* text/tok_utf8.c — id lists, piece lists, lossy UTF-8 decoding and the character classes the tokenizer needs. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"

int idlist_push(struct idlist *l, int32_t id, struct err *err)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        int32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = id;
    return 0;
}

/* Returns room for n bytes that stays put until plist_free. */
static char *plist_room(struct plist *l, size_t n, struct err *err)
{
    if (l->n_blocks == 0 || l->block_used + n > l->block_size) {
        if (l->n_blocks == l->cap_blocks) {
            size_t cap = l->cap_blocks ? l->cap_blocks * 2 : 8;
            char **b = realloc(l->blocks, cap * sizeof *b);
            if (!b) {
                err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
                return NULL;
            }
            l->blocks = b;
            l->cap_blocks = cap;
        }
        size_t size = l->block_size ? l->block_size * 2 : 256;
        if (size > 65536)
            size = 65536;
        if (size < n)
            size = n;
        char *blk = malloc(size);
        if (!blk) {
            err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
            return NULL;
        }
        l->blocks[l->n_blocks++] = blk;
        l->block_size = size;
        l->block_used = 0;
    }
    char *p = l->blocks[l->n_blocks - 1] + l->block_used;
    l->block_used += n;
    return p;
}

int plist_push(struct plist *l, const char *s, size_t len, bool first, struct err *err)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        struct piece *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        l->v = v;
        l->cap = cap;
    }
    char *c = plist_room(l, len + 1, err);
    if (!c)
        return -INFERD_ENOMEM;
    if (len)
        memcpy(c, s, len);
    c[len] = 0;
    l->v[l->n++] = (struct piece){c, len, first};
    return 0;
}

void plist_free(struct plist *l)
{
    for (size_t i = 0; i < l->n_blocks; i++)
        free(l->blocks[i]);
    free(l->blocks);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static const char replacement_char[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* WHATWG / Rust maximal-subpart decoding: a truncated but otherwise valid
 * prefix of a sequence is replaced by one U+FFFD; the byte that broke it is
 * examined again as the start of the next sequence. */
int tok_utf8_lossy(const char *s, size_t len, struct strbuf *out, struct err *err)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0;
    int rc = tok_put(out, "", 0, err);
    while (rc == 0 && i < len) {
        uint8_t b = u[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF)
            need = 1;
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0)
                lo = 0xA0;
            if (b == 0xED)
                hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0)
                lo = 0x90;
            if (b == 0xF4)
                hi = 0x8F;
        } else
            need = 0;
        size_t k = 0;
        if (need) {
            for (k = 1; k <= need && i + k < len; k++) {
                uint8_t c = u[i + k];
                if (c < lo || c > hi)
                    break;
                lo = 0x80;
                hi = 0xBF;
            }
            if (k == need + 1) {
                i += k;
                continue;
            }
        } else
            k = 1;
        rc = tok_put(out, s + run, i - run, err);
        if (rc == 0)
            rc = tok_put(out, replacement_char, 3, err);
        i += k;
        run = i;
    }
    if (rc == 0)
        rc = tok_put(out, s + run, len - run, err);
    return rc;
}

uint32_t tok_utf8_next(const char *s, size_t len, size_t *i)
{
    const uint8_t *u = (const uint8_t *)s + *i;
    size_t left = len - *i;
    uint32_t cp;
    size_t n;
    if (u[0] < 0x80) {
        cp = u[0];
        n = 1;
    } else if ((u[0] & 0xE0) == 0xC0 && left >= 2) {
        cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        n = 2;
    } else if ((u[0] & 0xF0) == 0xE0 && left >= 3) {
        cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        n = 3;
    } else if ((u[0] & 0xF8) == 0xF0 && left >= 4) {
        cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
             ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
        n = 4;
    } else {
        cp = 0xFFFD;
        n = 1;
    }
    *i += n;
    return cp;
}

size_t tok_utf8_put(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

bool tok_is_whitespace(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool tok_is_alnum(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

bool tok_is_punct(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
               (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}
