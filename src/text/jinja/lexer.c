/* text/jinja/lexer.c — splits template source into text and tag tokens, applying
 * transformers' whitespace rules (trim_blocks, lstrip_blocks, -/+ markers), comments and raw blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

struct lexer {
    struct arena *a;
    const char *src;
    size_t len;
    struct token *v; /* malloc'd while lexing, copied into the arena at the end */
    size_t n, cap;
    size_t lc_off; /* position tracking: offsets only move forward */
    int lc_line, lc_col;
    struct err *err;
};

static void lc_at(struct lexer *lx, size_t off, int *line, int *col)
{
    if (off < lx->lc_off) { /* rare: restart */
        lx->lc_off = 0;
        lx->lc_line = 1;
        lx->lc_col = 1;
    }
    while (lx->lc_off < off && lx->lc_off < lx->len) {
        if (lx->src[lx->lc_off] == '\n') {
            lx->lc_line++;
            lx->lc_col = 1;
        } else if (((unsigned char)lx->src[lx->lc_off] & 0xC0) != 0x80) {
            lx->lc_col++;
        }
        lx->lc_off++;
    }
    *line = lx->lc_line;
    *col = lx->lc_col;
}

static int lex_error(struct lexer *lx, size_t off, const char *msg)
{
    int line, col;
    lc_at(lx, off, &line, &col);
    return err_set(lx->err, INFERD_EFORMAT, "template line %d, column %d: %s", line, col, msg);
}

static struct token *push(struct lexer *lx, enum tok_kind kind, size_t off)
{
    if (lx->n == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 64;
        struct token *nv = realloc(lx->v, nc * sizeof(*nv));
        if (!nv)
            return NULL;
        lx->v = nv;
        lx->cap = nc;
    }
    struct token *t = &lx->v[lx->n++];
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    lc_at(lx, off, &t->line, &t->col);
    return t;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool starts(const struct lexer *lx, size_t i, const char *s)
{
    size_t n = strlen(s);
    return i + n <= lx->len && memcmp(lx->src + i, s, n) == 0;
}

static int emit_text(struct lexer *lx, size_t off, size_t n)
{
    if (n == 0)
        return 0;
    struct token *t = push(lx, T_TEXT, off);
    if (!t)
        return err_set(lx->err, INFERD_ENOMEM, "template: out of memory");
    t->s = lx->src + off;
    t->n = n;
    return 0;
}

static void put_utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xC0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Lexes a quoted string starting at *i; decodes Python escapes. */
static int lex_string(struct lexer *lx, size_t *i)
{
    size_t start = *i;
    char q = lx->src[start];
    size_t j = start + 1;
    while (j < lx->len && lx->src[j] != q) {
        if (lx->src[j] == '\\')
            j++;
        j++;
    }
    if (j >= lx->len)
        return lex_error(lx, start, "unterminated string");
    char *o = jinja_arena_alloc(lx->a, (j - start) * 2 + 8);
    if (!o)
        return err_set(lx->err, INFERD_ENOMEM, "template: out of memory");
    size_t k = 0;
    for (size_t p = start + 1; p < j; p++) {
        char c = lx->src[p];
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        char e = lx->src[++p];
        int nhex = 0;
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '0': o[k++] = '\0'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default: o[k++] = '\\'; o[k++] = e; break;
        }
        if (nhex) {
            uint32_t cp = 0;
            bool ok = p + nhex < j;
            for (int h = 1; ok && h <= nhex; h++) {
                int hv = hexval(lx->src[p + h]);
                if (hv < 0)
                    ok = false;
                else
                    cp = cp * 16 + (uint32_t)hv;
            }
            if (!ok || cp > 0x10FFFF)
                return lex_error(lx, p - 1, "bad escape in string");
            p += nhex;
            put_utf8(o, &k, cp);
        }
    }
    o[k] = 0;
    struct token *t = push(lx, T_STRING, start);
    if (!t)
        return err_set(lx->err, INFERD_ENOMEM, "template: out of memory");
    t->s = o;
    t->n = k;
    *i = j + 1;
    return 0;
}

static const char *const OPS[] = {
    "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
    "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", NULL,
};

/* Tokenizes the inside of a tag from *i up to its end marker; returns the strip sign of the end ('-', '+' or 0). */
static int lex_tag(struct lexer *lx, size_t *i, char closer, size_t tag_off, char *end_sign)
{
    int balance = 0;
    size_t p = *i;
    for (;;) {
        while (p < lx->len && is_space(lx->src[p]))
            p++;
        if (p >= lx->len)
            return lex_error(lx, tag_off, closer == '}' ? "unclosed '{{'" : "unclosed '{%'");
        char c = lx->src[p];
        if (balance == 0) {
            char endm[4] = {closer, '}', 0, 0};
            char endm_m[4] = {'-', closer, '}', 0};
            char endm_p[4] = {'+', closer, '}', 0};
            if (starts(lx, p, endm_m) || starts(lx, p, endm_p)) {
                *end_sign = c;
                *i = p + 3;
                break;
            }
            if (starts(lx, p, endm)) {
                *end_sign = 0;
                *i = p + 2;
                break;
            }
        }
        if (is_alpha(c)) {
            size_t s = p;
            while (p < lx->len && (is_alpha(lx->src[p]) || is_digit(lx->src[p])))
                p++;
            struct token *t = push(lx, T_NAME, s);
            if (!t)
                return err_set(lx->err, INFERD_ENOMEM, "template: out of memory");
            t->s = lx->src + s;
            t->n = p - s;
        } else if (is_digit(c)) {
            size_t s = p;
            bool is_f = false;
            while (p < lx->len && (is_digit(lx->src[p]) || lx->src[p] == '_'))
                p++;
            if (p + 1 < lx->len && lx->src[p] == '.' && is_digit(lx->src[p + 1])) {
                is_f = true;
                p++;
                while (p < lx->len && (is_digit(lx->src[p]) || lx->src[p] == '_'))
                    p++;
            }
            if (p < lx->len && (lx->src[p] == 'e' || lx->src[p] == 'E')) {
                size_t q = p + 1;
                if (q < lx->len && (lx->src[q] == '+' || lx->src[q] == '-'))
                    q++;
                if (q < lx->len && is_digit(lx->src[q])) {
                    is_f = true;
                    p = q;
                    while (p < lx->len && is_digit(lx->src[p]))
                        p++;
                }
            }
            char buf[128];
            size_t k = 0;
            for (size_t q = s; q < p && k < sizeof(buf) - 1; q++)
                if (lx->src[q] != '_')
                    buf[k++] = lx->src[q];
            buf[k] = 0;
            struct token *t = push(lx, is_f ? T_FLOAT : T_INT, s);
            if (!t)
                return err_set(lx->err, INFERD_ENOMEM, "template: out of memory");
            t->s = lx->src + s;
            t->n = p - s;
            if (is_f) {
                t->fval = strtod(buf, NULL);
            } else {
                unsigned long long u = strtoull(buf, NULL, 10);
                if (k > 19 || u > (unsigned long long)INT64_MAX)
                    return lex_error(lx, s, "integer literal too large");
                t->ival = (int64_t)u;
            }
        } else if (c == '\'' || c == '"') {
            int rc = lex_string(lx, &p);
            if (rc)
                return rc;
        } else {
            const char *op = NULL;
            for (int k = 0; OPS[k]; k++)
                if (starts(lx, p, OPS[k])) {
                    op = OPS[k];
                    break;
                }
            if (!op) {
                char m[64];
                snprintf(m, sizeof m, "unexpected character '%c'", c);
                return lex_error(lx, p, m);
            }
            if (op[0] == '(' || op[0] == '[' || op[0] == '{')
                balance++;
            else if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && balance > 0)
                balance--;
            struct token *t = push(lx, T_OP, p);
            if (!t)
                return err_set(lx->err, INFERD_ENOMEM, "template: out of memory");
            t->s = op;
            t->n = strlen(op);
            p += t->n;
        }
    }
    return 0;
}

/* After a block or comment end: '-' eats all whitespace, trim_blocks eats one newline. */
static size_t after_end(struct lexer *lx, size_t p, char sign, bool trim, bool *line_starting)
{
    size_t s = p;
    if (sign == '-') {
        while (p < lx->len && is_space(lx->src[p]))
            p++;
    } else if (trim && sign != '+') {
        if (p < lx->len && lx->src[p] == '\n')
            p++;
    }
    *line_starting = p > s ? lx->src[p - 1] == '\n' : false;
    return p;
}

/* Is src[p..] "{%[-+]? raw [-+]?%}"?  Sets *end past it and *sign to the closing sign. */
static bool match_word_tag(struct lexer *lx, size_t p, const char *word, size_t *end, char *open_sign,
                           char *close_sign)
{
    if (!starts(lx, p, "{%"))
        return false;
    p += 2;
    *open_sign = 0;
    if (p < lx->len && (lx->src[p] == '-' || lx->src[p] == '+'))
        *open_sign = lx->src[p++];
    while (p < lx->len && is_space(lx->src[p]))
        p++;
    if (!starts(lx, p, word))
        return false;
    p += strlen(word);
    if (p < lx->len && (is_alpha(lx->src[p]) || is_digit(lx->src[p])))
        return false;
    while (p < lx->len && is_space(lx->src[p]))
        p++;
    *close_sign = 0;
    if (p < lx->len && (lx->src[p] == '-' || lx->src[p] == '+'))
        *close_sign = lx->src[p++];
    if (!starts(lx, p, "%}"))
        return false;
    *end = p + 2;
    return true;
}

int jinja_lex(struct arena *a, const char *src, size_t len, struct token_list *out, struct err *err)
{
    struct lexer lx = {.a = a, .src = src, .len = len, .lc_line = 1, .lc_col = 1, .err = err};
    size_t pos = 0;
    bool line_starting = true;
    int rc = 0;
    while (pos < len) {
        size_t j = pos;
        while (j + 1 < len && !(src[j] == '{' && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')))
            j++;
        if (j + 1 >= len) {
            rc = emit_text(&lx, pos, len - pos);
            if (rc)
                goto fail;
            break;
        }
        char opener = src[j + 1];
        size_t k = j + 2;
        char sign = 0;
        if (k < len && (src[k] == '-' || src[k] == '+'))
            sign = src[k];
        size_t tend = j;
        if (sign == '-') {
            while (tend > pos && is_space(src[tend - 1]))
                tend--;
        } else if (sign != '+' && opener != '{') {
            size_t l_pos = tend;
            while (l_pos > pos && src[l_pos - 1] != '\n')
                l_pos--;
            bool has_nl = l_pos > pos;
            if (has_nl || line_starting) {
                bool blank = true;
                for (size_t q = l_pos; q < tend; q++)
                    if (src[q] != ' ' && src[q] != '\t')
                        blank = false;
                if (blank)
                    tend = l_pos;
            }
        }
        rc = emit_text(&lx, pos, tend - pos);
        if (rc)
            goto fail;
        if (sign)
            k++;
        if (opener == '#') {
            size_t q = k;
            while (q + 1 < len && !(src[q] == '#' && src[q + 1] == '}'))
                q++;
            if (q + 1 >= len) {
                rc = lex_error(&lx, j, "unclosed comment");
                goto fail;
            }
            char es = q > k && (src[q - 1] == '-' || src[q - 1] == '+') ? src[q - 1] : 0;
            pos = after_end(&lx, q + 2, es, true, &line_starting);
            continue;
        }
        size_t raw_end;
        char os, cs;
        if (opener == '%' && match_word_tag(&lx, j, "raw", &raw_end, &os, &cs)) {
            /* Jinja applies no trim_blocks after {% raw %}; only '-' strips what follows */
            bool raw_ls;
            size_t body = after_end(&lx, raw_end, cs, false, &raw_ls);
            size_t q = body, e_end = 0;
            char eos = 0, ecs = 0;
            while (q < len && !(src[q] == '{' && match_word_tag(&lx, q, "endraw", &e_end, &eos, &ecs)))
                q++;
            if (q >= len) {
                rc = lex_error(&lx, j, "missing endraw");
                goto fail;
            }
            size_t bend = q;
            if (eos == '-') {
                while (bend > body && is_space(src[bend - 1]))
                    bend--;
            } else if (eos != '+') { /* lstrip_blocks before {% endraw %} */
                size_t l_pos = bend;
                while (l_pos > body && src[l_pos - 1] != '\n')
                    l_pos--;
                if (l_pos > body || raw_ls) {
                    bool blank = true;
                    for (size_t b = l_pos; b < bend; b++)
                        if (src[b] != ' ' && src[b] != '\t')
                            blank = false;
                    if (blank)
                        bend = l_pos;
                }
            }
            rc = emit_text(&lx, body, bend - body);
            if (rc)
                goto fail;
            pos = after_end(&lx, e_end, ecs, true, &line_starting);
            continue;
        }
        struct token *t = push(&lx, opener == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, j);
        if (!t) {
            rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
            goto fail;
        }
        char end_sign = 0;
        size_t p = k;
        rc = lex_tag(&lx, &p, opener == '{' ? '}' : '%', j, &end_sign);
        if (rc)
            goto fail;
        t = push(&lx, opener == '{' ? T_VAR_END : T_BLOCK_END, p - 2);
        if (!t) {
            rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
            goto fail;
        }
        pos = after_end(&lx, p, end_sign, opener == '%', &line_starting);
    }
    if (!push(&lx, T_EOF, len)) {
        rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
        goto fail;
    }
    out->v = jinja_arena_alloc(a, lx.n * sizeof(struct token));
    if (!out->v) {
        rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
        goto fail;
    }
    memcpy(out->v, lx.v, lx.n * sizeof(struct token));
    out->n = lx.n;
    free(lx.v);
    return 0;
fail:
    free(lx.v);
    return rc;
}
