/* grammar/regex.c — regular expressions (the ECMAScript/PCRE subset structured output needs) to
 * expressions, for guided_regex and JSON Schema's pattern and format. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

#define MAX_DEPTH 100
#define MAX_COUNT 1000
#define MAX_RANGES 512

struct rx {
    struct gbuild *b;
    const uint8_t *s;
    size_t n, i;
    bool json;
    int depth;
    struct err *err;
    int rc;
};

static int fail(struct rx *r, int code, const char *what)
{
    if (!r->rc)
        r->rc = err_set(r->err, code, "regex: %s at byte %zu", what, r->i);
    return -1;
}

static uint32_t next_cp(struct rx *r)
{
    uint8_t c = r->s[r->i];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || r->i + (size_t)n > r->n) {
        fail(r, INFERD_EFORMAT, "invalid UTF-8");
        r->i++;
        return 0xFFFD;
    }
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; k++) {
        uint8_t d = r->s[r->i + k];
        if ((d & 0xC0) != 0x80) {
            fail(r, INFERD_EFORMAT, "invalid UTF-8");
            break;
        }
        cp = cp << 6 | (d & 0x3F);
    }
    r->i += (size_t)n;
    return cp;
}

int rx_json_class(struct gbuild *b, const uint32_t *rg, int n)
{
    /* plain: the ranges without '"', '\\' and controls */
    uint32_t plain[2 * (MAX_RANGES + 4)];
    int np = 0;
    static const uint32_t cut[3][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    for (int i = 0; i < n; i++) {
        uint32_t lo = rg[2 * i], hi = rg[2 * i + 1];
        for (int k = 0; k < 3 && lo <= hi; k++) {
            if (hi < cut[k][0] || lo > cut[k][1])
                continue;
            if (lo < cut[k][0] && np < MAX_RANGES + 3) {
                plain[2 * np] = lo;
                plain[2 * np + 1] = cut[k][0] - 1;
                np++;
            }
            lo = cut[k][1] + 1;
        }
        if (lo <= hi && np < MAX_RANGES + 3) {
            plain[2 * np] = lo;
            plain[2 * np + 1] = hi;
            np++;
        }
    }
    int alts[40], na = 0;
    if (np)
        alts[na++] = gb_class(b, plain, np);
    for (int i = 0; i < n; i++)
        for (uint32_t c = rg[2 * i]; c <= rg[2 * i + 1] && c <= '\\' && na < 38; c++) {
            char esc[8];
            if (c == '"')
                memcpy(esc, "\\\"", 3);
            else if (c == '\\')
                memcpy(esc, "\\\\", 3);
            else if (c == '\n')
                memcpy(esc, "\\n", 3);
            else if (c == '\t')
                memcpy(esc, "\\t", 3);
            else if (c == '\r')
                memcpy(esc, "\\r", 3);
            else if (c == '\b')
                memcpy(esc, "\\b", 3);
            else if (c == '\f')
                memcpy(esc, "\\f", 3);
            else if (c < 0x20) {
                static const char hex[] = "0123456789abcdef";
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                esc[6] = 0;
            } else
                continue;
            alts[na++] = gb_str(b, esc);
        }
    if (!na)
        return -1;
    return gb_alt(b, alts, na);
}

/* One character from the ranges (n pairs), as JSON text or raw. */
static int emit_class(struct rx *r, uint32_t *rg, int n)
{
    n = gb_normalize_ranges(rg, n);
    if (n == 0)
        return fail(r, INFERD_EINVAL, "an empty character class");
    if (r->json) {
        int x = rx_json_class(r->b, rg, n);
        return x < 0 && !r->b->oom && !r->b->too_big ? fail(r, INFERD_EINVAL, "an empty character class") : x;
    }
    return gb_class(r->b, rg, n);
}

static int add_range(uint32_t *rg, int *n, uint32_t lo, uint32_t hi)
{
    if (*n >= MAX_RANGES)
        return -1;
    rg[2 * *n] = lo;
    rg[2 * *n + 1] = hi;
    (*n)++;
    return 0;
}

/* \d \w \s and their negations into rg; false when c is not one of them. */
static bool class_escape(uint32_t c, uint32_t *rg, int *n)
{
    uint32_t tmp[16];
    int k = 0;
    switch (c | 0x20) {
    case 'd':
        add_range(tmp, &k, '0', '9');
        break;
    case 'w':
        add_range(tmp, &k, '0', '9');
        add_range(tmp, &k, 'A', 'Z');
        add_range(tmp, &k, '_', '_');
        add_range(tmp, &k, 'a', 'z');
        break;
    case 's':
        add_range(tmp, &k, '\t', '\r');
        add_range(tmp, &k, ' ', ' ');
        break;
    default:
        return false;
    }
    if (c >= 'a') {
        for (int i = 0; i < k; i++)
            add_range(rg, n, tmp[2 * i], tmp[2 * i + 1]);
    } else {
        uint32_t out[20];
        int m = gb_complement_ranges(tmp, k, 0x10FFFF, out);
        for (int i = 0; i < m; i++)
            add_range(rg, n, out[2 * i], out[2 * i + 1]);
    }
    return true;
}

static int hexv(uint8_t c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* After a backslash: a single escaped codepoint (class escapes handled by the caller). */
static uint32_t escape_cp(struct rx *r)
{
    if (r->i >= r->n) {
        fail(r, INFERD_EFORMAT, "a trailing backslash");
        return 0;
    }
    uint8_t c = r->s[r->i];
    switch (c) {
    case 'n': r->i++; return '\n';
    case 'r': r->i++; return '\r';
    case 't': r->i++; return '\t';
    case 'f': r->i++; return '\f';
    case 'v': r->i++; return '\v';
    case '0': r->i++; return 0;
    case 'x': {
        if (r->i + 2 < r->n + 0 && hexv(r->s[r->i + 1]) >= 0 && hexv(r->s[r->i + 2]) >= 0) {
            uint32_t v = (uint32_t)(hexv(r->s[r->i + 1]) * 16 + hexv(r->s[r->i + 2]));
            r->i += 3;
            return v;
        }
        fail(r, INFERD_EFORMAT, "a bad \\x escape");
        return 0;
    }
    case 'u': {
        r->i++;
        uint32_t v = 0;
        if (r->i < r->n && r->s[r->i] == '{') {
            r->i++;
            int k = 0;
            while (r->i < r->n && hexv(r->s[r->i]) >= 0 && k < 7) {
                v = v * 16 + (uint32_t)hexv(r->s[r->i++]);
                k++;
            }
            if (!k || r->i >= r->n || r->s[r->i] != '}' || v > 0x10FFFF) {
                fail(r, INFERD_EFORMAT, "a bad \\u{} escape");
                return 0;
            }
            r->i++;
            return v;
        }
        for (int k = 0; k < 4; k++) {
            if (r->i >= r->n || hexv(r->s[r->i]) < 0) {
                fail(r, INFERD_EFORMAT, "a bad \\u escape");
                return 0;
            }
            v = v * 16 + (uint32_t)hexv(r->s[r->i++]);
        }
        return v;
    }
    default:
        if (c >= '1' && c <= '9') {
            fail(r, INFERD_EUNSUPPORTED, "a backreference (not supported)");
            return 0;
        }
        if ((c == 'b' || c == 'B' || c == 'A' || c == 'z' || c == 'Z' || c == 'G')) {
            fail(r, INFERD_EUNSUPPORTED, "an assertion escape (not supported)");
            return 0;
        }
        if (c == 'p' || c == 'P' || c == 'k' || c == 'c') {
            fail(r, INFERD_EUNSUPPORTED, "a \\p, \\k or \\c escape (not supported)");
            return 0;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            fail(r, INFERD_EFORMAT, "an unknown escape");
            return 0;
        }
        return next_cp(r);
    }
}

static int parse_class(struct rx *r)
{
    uint32_t rg[2 * MAX_RANGES];
    int n = 0;
    r->i++; /* [ */
    bool neg = r->i < r->n && r->s[r->i] == '^';
    if (neg)
        r->i++;
    bool first = true;
    while (!r->rc) {
        if (r->i >= r->n)
            return fail(r, INFERD_EFORMAT, "an unclosed character class");
        if (r->s[r->i] == ']' && !first)
            break;
        first = false;
        uint32_t lo;
        if (r->s[r->i] == '\\') {
            r->i++;
            if (r->i < r->n && class_escape(r->s[r->i], rg, &n)) {
                r->i++;
                continue;
            }
            if (r->i < r->n && r->s[r->i] == 'b') {
                r->i++;
                lo = '\b';
            } else
                lo = escape_cp(r);
        } else {
            lo = next_cp(r);
        }
        uint32_t hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                r->i++;
                hi = escape_cp(r);
            } else
                hi = next_cp(r);
            if (hi < lo)
                return fail(r, INFERD_EFORMAT, "a character range out of order");
        }
        if (add_range(rg, &n, lo, hi))
            return fail(r, INFERD_ERANGE, "too many ranges in a character class");
    }
    if (r->rc)
        return -1;
    r->i++; /* ] */
    n = gb_normalize_ranges(rg, n);
    if (neg) {
        uint32_t out[2 * MAX_RANGES + 2];
        n = gb_complement_ranges(rg, n, 0x10FFFF, out);
        return emit_class(r, out, n);
    }
    return emit_class(r, rg, n);
}

static int parse_alt(struct rx *r);

static int parse_atom(struct rx *r)
{
    uint8_t c = r->s[r->i];
    uint32_t rg[2 * MAX_RANGES];
    int n = 0;
    switch (c) {
    case '(': {
        if (++r->depth > MAX_DEPTH)
            return fail(r, INFERD_ERANGE, "groups nested too deep");
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':')
                r->i += 2;
            else if (r->i + 1 < r->n && (r->s[r->i + 1] == '<' || r->s[r->i + 1] == 'P') &&
                     r->i + 2 < r->n && r->s[r->i + 2] != '=' && r->s[r->i + 2] != '!') {
                /* a named group: (?<name>...) or (?P<name>...) */
                while (r->i < r->n && r->s[r->i] != '>')
                    r->i++;
                if (r->i >= r->n)
                    return fail(r, INFERD_EFORMAT, "an unclosed group name");
                r->i++;
            } else
                return fail(r, INFERD_EUNSUPPORTED, "lookaround or a group flag (not supported)");
        }
        int x = parse_alt(r);
        if (r->rc)
            return -1;
        if (r->i >= r->n || r->s[r->i] != ')')
            return fail(r, INFERD_EFORMAT, "an unclosed group");
        r->i++;
        r->depth--;
        return x;
    }
    case '[':
        return parse_class(r);
    case '.':
        r->i++;
        if (r->json)
            add_range(rg, &n, 0, 0x10FFFF);
        else {
            add_range(rg, &n, 0, '\n' - 1);
            add_range(rg, &n, '\n' + 1, '\r' - 1);
            add_range(rg, &n, '\r' + 1, 0x10FFFF);
        }
        return emit_class(r, rg, n);
    case '\\':
        r->i++;
        if (r->i < r->n && class_escape(r->s[r->i], rg, &n)) {
            r->i++;
            return emit_class(r, rg, n);
        }
        {
            uint32_t cp = escape_cp(r);
            if (r->rc)
                return -1;
            add_range(rg, &n, cp, cp);
            return emit_class(r, rg, n);
        }
    case '*':
    case '+':
    case '?':
    case '{':
        if (c == '{' && !(r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9'))
            break;
        return fail(r, INFERD_EFORMAT, "a quantifier with nothing to repeat");
    case '^':
    case '$':
        return fail(r, INFERD_EUNSUPPORTED, "an anchor inside the pattern (not supported)");
    default:
        break;
    }
    uint32_t cp = next_cp(r);
    add_range(rg, &n, cp, cp);
    return emit_class(r, rg, n);
}

static bool read_int(struct rx *r, int *out)
{
    size_t at = r->i;
    long v = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
        if (v <= 100000)
            v = v * 10 + (r->s[r->i] - '0');
        r->i++;
    }
    *out = v > 100000 ? 100001 : (int)v;
    return r->i > at;
}

static int parse_repeat(struct rx *r)
{
    int x = parse_atom(r);
    while (!r->rc && r->i < r->n) {
        uint8_t c = r->s[r->i];
        int min, max;
        if (c == '*')
            min = 0, max = -1, r->i++;
        else if (c == '+')
            min = 1, max = -1, r->i++;
        else if (c == '?')
            min = 0, max = 1, r->i++;
        else if (c == '{' && r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9') {
            r->i++;
            read_int(r, &min);
            max = min;
            if (r->i < r->n && r->s[r->i] == ',') {
                r->i++;
                if (!read_int(r, &max))
                    max = -1;
            }
            if (r->i >= r->n || r->s[r->i] != '}')
                return fail(r, INFERD_EFORMAT, "a malformed {m,n}");
            r->i++;
            if (min > MAX_COUNT || max > MAX_COUNT)
                return fail(r, INFERD_ERANGE, "a repetition count over 1000");
            if (max >= 0 && max < min)
                return fail(r, INFERD_EFORMAT, "a repetition {m,n} with n < m");
        } else
            break;
        if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+'))
            r->i++; /* lazy or possessive: the language is the same */
        x = gb_repeat(r->b, x, min, max);
    }
    return x;
}

static int parse_seq(struct rx *r)
{
    int kids[64], nk = 0;
    int x = -2;
    while (!r->rc && r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        int y = parse_repeat(r);
        if (nk == 64) {
            kids[0] = gb_seq(r->b, kids, nk);
            nk = 1;
        }
        kids[nk++] = y;
    }
    (void)x;
    return r->rc ? -1 : gb_seq(r->b, kids, nk);
}

static int parse_alt(struct rx *r)
{
    int kids[64], nk = 0;
    kids[nk++] = parse_seq(r);
    while (!r->rc && r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        int y = parse_seq(r);
        if (nk == 64) {
            kids[0] = gb_alt(r->b, kids, nk);
            nk = 1;
        }
        kids[nk++] = y;
    }
    return r->rc ? -1 : gb_alt(r->b, kids, nk);
}

int rx_parse(struct gbuild *b, const char *re, size_t len, bool json, int *expr, struct err *err)
{
    struct rx r = {.b = b, .s = (const uint8_t *)re, .n = len, .json = json, .err = err};
    bool head = len > 0 && re[0] == '^';
    bool tail = len > (size_t)head && re[len - 1] == '$';
    if (tail) {
        /* an escaped $ is a literal: count the backslashes before it */
        size_t k = len - 1, bs = 0;
        while (k > 0 && re[k - 1] == '\\')
            k--, bs++;
        if (bs % 2)
            tail = false;
    }
    r.i = head;
    r.n = len - tail;
    int x = parse_alt(&r);
    if (!r.rc && r.i < r.n)
        fail(&r, INFERD_EFORMAT, "an unmatched ')'");
    if (r.rc)
        return r.rc;
    if (json && (!head || !tail)) {
        uint32_t any[2] = {0, 0x10FFFF};
        int pad = gb_repeat(b, rx_json_class(b, any, 1), 0, -1);
        int parts[3], np = 0;
        if (!head)
            parts[np++] = pad;
        parts[np++] = x;
        if (!tail)
            parts[np++] = gb_repeat(b, rx_json_class(b, any, 1), 0, -1);
        x = gb_seq(b, parts, np);
    }
    if (x < 0)
        return gb_fail(b, err);
    *expr = x;
    return 0;
}

int grammar_compile_regex(const char *re, size_t len, const struct grammar_options *o,
                          struct grammar **out, struct err *err)
{
    *out = NULL;
    struct gbuild b;
    gb_init(&b, o);
    int x = -1, root = gb_rule(&b, "root", 4);
    int rc = rx_parse(&b, re, len, false, &x, err);
    if (!rc) {
        gb_define(&b, root, x);
        rc = gb_compile(&b, root, out, err);
    }
    gb_free(&b);
    return rc;
}
