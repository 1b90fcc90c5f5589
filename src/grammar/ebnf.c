/* grammar/ebnf.c — GBNF grammars (llama.cpp's EBNF dialect) to rules: name ::= alternatives,
 * "literals", [classes], ., rule names, ( ), * + ? {m,n}, # comments; the start rule is root. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

#define MAX_DEPTH 100
#define MAX_COUNT 1000
#define MAX_RANGES 512
#define MAX_ITEMS 256

struct gp {
    struct gbuild *b;
    const uint8_t *s;
    size_t n, i;
    int depth;
    struct err *err;
    int rc;
    bool *defined; /* owned; per rule */
    int cap_defined;
};

static int fail(struct gp *p, int code, const char *what)
{
    if (!p->rc)
        p->rc = err_set(p->err, code, "grammar: %s at byte %zu", what, p->i);
    return -1;
}

static bool is_name(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

static void skip_space(struct gp *p)
{
    while (p->i < p->n) {
        uint8_t c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n')
                p->i++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->i++;
        } else {
            break;
        }
    }
}

/* At a name followed by ::= (the start of the next rule)? */
static bool at_rule_start(struct gp *p)
{
    size_t k = p->i;
    while (k < p->n && is_name(p->s[k]))
        k++;
    if (k == p->i)
        return false;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t'))
        k++;
    return k + 3 <= p->n && !memcmp(p->s + k, "::=", 3);
}

static int hexv(uint8_t c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

static uint32_t read_cp(struct gp *p)
{
    uint8_t c = p->s[p->i];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || p->i + (size_t)n > p->n) {
        fail(p, INFERD_EFORMAT, "invalid UTF-8");
        return 0;
    }
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; k++) {
        if ((p->s[p->i + k] & 0xC0) != 0x80) {
            fail(p, INFERD_EFORMAT, "invalid UTF-8");
            return 0;
        }
        cp = cp << 6 | (p->s[p->i + k] & 0x3F);
    }
    p->i += (size_t)n;
    return cp;
}

/* A character of a literal or class, escapes resolved. */
static uint32_t read_char(struct gp *p)
{
    if (p->s[p->i] != '\\')
        return read_cp(p);
    p->i++;
    if (p->i >= p->n) {
        fail(p, INFERD_EFORMAT, "a trailing backslash");
        return 0;
    }
    uint8_t c = p->s[p->i++];
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            if (p->i >= p->n || hexv(p->s[p->i]) < 0) {
                fail(p, INFERD_EFORMAT, "a bad hex escape");
                return 0;
            }
            v = v * 16 + (uint32_t)hexv(p->s[p->i++]);
        }
        if (v > 0x10FFFF) {
            fail(p, INFERD_EFORMAT, "a codepoint past U+10FFFF");
            return 0;
        }
        return v;
    }
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    default: return c;
    }
}

static size_t put_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int parse_literal(struct gp *p)
{
    p->i++; /* " */
    size_t cap = 64, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return p->b->oom = true, -1;
    while (!p->rc) {
        if (p->i >= p->n) {
            fail(p, INFERD_EFORMAT, "an unterminated string");
            break;
        }
        if (p->s[p->i] == '"') {
            p->i++;
            break;
        }
        uint32_t cp = read_char(p);
        if (n + 4 > cap) {
            char *q = realloc(buf, cap *= 2);
            if (!q) {
                p->b->oom = true;
                break;
            }
            buf = q;
        }
        n += put_utf8(cp, buf + n);
    }
    int x = p->rc || p->b->oom ? -1 : gb_bytes(p->b, buf, n);
    free(buf);
    return x;
}

static int parse_class(struct gp *p)
{
    uint32_t rg[2 * MAX_RANGES], out[2 * MAX_RANGES + 2];
    int n = 0;
    p->i++; /* [ */
    bool neg = p->i < p->n && p->s[p->i] == '^';
    if (neg)
        p->i++;
    while (!p->rc) {
        if (p->i >= p->n)
            return fail(p, INFERD_EFORMAT, "an unclosed character class");
        if (p->s[p->i] == ']')
            break;
        uint32_t lo = read_char(p), hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            hi = read_char(p);
            if (hi < lo)
                return fail(p, INFERD_EFORMAT, "a character range out of order");
        }
        if (n >= MAX_RANGES)
            return fail(p, INFERD_ERANGE, "too many ranges in a character class");
        rg[2 * n] = lo;
        rg[2 * n + 1] = hi;
        n++;
    }
    if (p->rc)
        return -1;
    p->i++;
    n = gb_normalize_ranges(rg, n);
    if (neg) {
        n = gb_complement_ranges(rg, n, 0x10FFFF, out);
        memcpy(rg, out, 2 * (size_t)n * sizeof *rg);
    }
    if (!n)
        return fail(p, INFERD_EINVAL, "an empty character class");
    return gb_class(p->b, rg, n);
}

/* The id of rule name (created when first seen). */
static int rule_ref(struct gp *p, size_t at, size_t len)
{
    int r = gb_find_rule(p->b, (const char *)p->s + at, len);
    if (r < 0)
        r = gb_rule(p->b, (const char *)p->s + at, len);
    if (r >= p->cap_defined) {
        int cap = p->cap_defined ? p->cap_defined * 2 : 64;
        while (cap <= r)
            cap *= 2;
        bool *d = realloc(p->defined, (size_t)cap * sizeof *d);
        if (!d)
            return p->b->oom = true, -1;
        memset(d + p->cap_defined, 0, (size_t)(cap - p->cap_defined) * sizeof *d);
        p->defined = d;
        p->cap_defined = cap;
    }
    return r;
}

static int parse_alt(struct gp *p);

static int parse_item(struct gp *p)
{
    uint8_t c = p->s[p->i];
    int x;
    if (c == '"')
        x = parse_literal(p);
    else if (c == '[')
        x = parse_class(p);
    else if (c == '.') {
        p->i++;
        x = gb_char(p->b, 0, 0x10FFFF);
    } else if (c == '(') {
        if (++p->depth > MAX_DEPTH)
            return fail(p, INFERD_ERANGE, "groups nested too deep");
        p->i++;
        x = parse_alt(p);
        skip_space(p);
        if (p->rc)
            return -1;
        if (p->i >= p->n || p->s[p->i] != ')')
            return fail(p, INFERD_EFORMAT, "an unclosed group");
        p->i++;
        p->depth--;
    } else if (is_name(c)) {
        size_t at = p->i;
        while (p->i < p->n && is_name(p->s[p->i]))
            p->i++;
        int r = rule_ref(p, at, p->i - at);
        x = gb_call(p->b, r);
    } else {
        return fail(p, INFERD_EFORMAT, "an unexpected character");
    }
    /* postfix operators */
    while (!p->rc && p->i < p->n) {
        c = p->s[p->i];
        int min, max;
        if (c == '*')
            min = 0, max = -1, p->i++;
        else if (c == '+')
            min = 1, max = -1, p->i++;
        else if (c == '?')
            min = 0, max = 1, p->i++;
        else if (c == '{') {
            p->i++;
            skip_space(p);
            long a = 0, z;
            size_t st = p->i;
            while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && a <= MAX_COUNT)
                a = a * 10 + (p->s[p->i++] - '0');
            if (p->i == st)
                return fail(p, INFERD_EFORMAT, "a malformed {m,n}");
            z = a;
            skip_space(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip_space(p);
                st = p->i;
                z = 0;
                while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && z <= MAX_COUNT)
                    z = z * 10 + (p->s[p->i++] - '0');
                if (p->i == st)
                    z = -1;
                skip_space(p);
            }
            if (p->i >= p->n || p->s[p->i] != '}')
                return fail(p, INFERD_EFORMAT, "a malformed {m,n}");
            p->i++;
            if (a > MAX_COUNT || z > MAX_COUNT)
                return fail(p, INFERD_ERANGE, "a repetition count over 1000");
            if (z >= 0 && z < a)
                return fail(p, INFERD_EFORMAT, "a repetition {m,n} with n < m");
            min = (int)a;
            max = (int)z;
        } else
            break;
        x = gb_repeat(p->b, x, min, max);
    }
    return x;
}

static int parse_seq(struct gp *p)
{
    int kids[MAX_ITEMS], nk = 0;
    for (;;) {
        skip_space(p);
        if (p->rc || p->i >= p->n || p->s[p->i] == '|' || p->s[p->i] == ')' || at_rule_start(p))
            break;
        int x = parse_item(p);
        if (nk == MAX_ITEMS) {
            kids[0] = gb_seq(p->b, kids, nk);
            nk = 1;
        }
        kids[nk++] = x;
    }
    return p->rc ? -1 : gb_seq(p->b, kids, nk);
}

static int parse_alt(struct gp *p)
{
    int kids[MAX_ITEMS], nk = 0;
    kids[nk++] = parse_seq(p);
    for (;;) {
        skip_space(p);
        if (p->rc || p->i >= p->n || p->s[p->i] != '|')
            break;
        p->i++;
        int x = parse_seq(p);
        if (nk == MAX_ITEMS) {
            kids[0] = gb_alt(p->b, kids, nk);
            nk = 1;
        }
        kids[nk++] = x;
    }
    return p->rc ? -1 : gb_alt(p->b, kids, nk);
}

int grammar_compile_ebnf(const char *text, size_t len, const struct grammar_options *o,
                         struct grammar **out, struct err *err)
{
    *out = NULL;
    struct gbuild b;
    gb_init(&b, o);
    struct gp p = {.b = &b, .s = (const uint8_t *)text, .n = len, .err = err};
    for (;;) {
        skip_space(&p);
        if (p.rc || p.i >= p.n)
            break;
        size_t at = p.i;
        while (p.i < p.n && is_name(p.s[p.i]))
            p.i++;
        if (p.i == at) {
            fail(&p, INFERD_EFORMAT, "expected a rule name");
            break;
        }
        size_t name_len = p.i - at;
        while (p.i < p.n && (p.s[p.i] == ' ' || p.s[p.i] == '\t'))
            p.i++;
        if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3)) {
            fail(&p, INFERD_EFORMAT, "expected ::=");
            break;
        }
        p.i += 3;
        int r = rule_ref(&p, at, name_len);
        if (r < 0)
            break;
        if (p.defined[r]) {
            p.i = at;
            fail(&p, INFERD_EFORMAT, "a rule defined twice");
            break;
        }
        p.defined[r] = true;
        int x = parse_alt(&p);
        if (!p.rc && p.i < p.n && p.s[p.i] == ')')
            fail(&p, INFERD_EFORMAT, "an unmatched ')'");
        gb_define(&b, r, x);
    }
    int rc = p.rc;
    if (!rc && (b.oom || b.too_big))
        rc = gb_fail(&b, err);
    for (int r = 0; !rc && r < b.nrules; r++)
        if (!p.defined[r])
            rc = err_set(err, INFERD_EFORMAT, "grammar: rule '%.64s' is used but not defined",
                         b.rules[r].name);
    int root = rc ? -1 : gb_find_rule(&b, "root", 4);
    if (!rc && root < 0)
        rc = err_set(err, INFERD_EFORMAT, "grammar: no root rule");
    if (!rc)
        rc = gb_compile(&b, root, out, err);
    free(p.defined);
    gb_free(&b);
    return rc;
}
