/* grammar/schema.c — JSON Schema to rules: one rule per subschema (so $ref recursion is a rule
 * calling itself), objects with properties in the given order, arrays with prefix items and
 * counts, strings with lengths, patterns and formats, integers as exact digit automata; and
 * json_object and choice lists, which are the same machinery without a schema. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "grammar/gram_internal.h"

#define MAX_NESTING 64
#define MAX_KEY_BYTES 256
/* Fraction digits of a number bounded on both sides, so its language is finite. */
#define BOUNDED_FRACTION_DIGITS 15
/* Integer bounds beyond this are treated as open (they fit int64 with room for arithmetic). */
#define INT_LIMIT 1000000000000000000LL

struct memo {
    struct json_object *s;
    int rule;
};

struct sc {
    struct gbuild *b;
    struct json_object *doc;   /* the whole schema ($ref targets are resolved in it) */
    bool free_ws;
    struct err *err;
    int rc;
    struct memo *memo;         /* owned */
    int nmemo, capmemo;
    struct json_object **made; /* owned; merged schemas made here, put at the end */
    int nmade, capmade;
    int r_value, r_string, r_ws; /* shared rules, -1 until needed */
    int depth;
    char path[512];
    size_t plen;
};

/* ---- paths and errors ------------------------------------------------------------ */

/* Appends ".what" (or "[i]" when what is NULL) to the path; returns the mark to pop to. */
static size_t path_push(struct sc *c, const char *what, int i)
{
    size_t mark = c->plen;
    int n = what ? snprintf(c->path + c->plen, sizeof c->path - c->plen, ".%s", what)
                 : snprintf(c->path + c->plen, sizeof c->path - c->plen, "[%d]", i);
    if (n > 0)
        c->plen = c->plen + (size_t)n < sizeof c->path ? c->plen + (size_t)n : sizeof c->path - 1;
    return mark;
}

static void path_pop(struct sc *c, size_t mark)
{
    c->plen = mark;
    c->path[mark] = 0;
}

static int fail(struct sc *c, int code, const char *what)
{
    if (!c->rc)
        c->rc = err_set(c->err, code, "%s: %s", c->path, what);
    return -1;
}

static int failf_key(struct sc *c, int code, const char *key, const char *what)
{
    if (!c->rc)
        c->rc = err_set(c->err, code, "%s.%s: %s", c->path, key, what);
    return -1;
}

/* ---- shared pieces -------------------------------------------------------------- */

static int ws(struct sc *c)
{
    if (!c->free_ws)
        return gb_empty(c->b);
    if (c->r_ws < 0) {
        c->r_ws = gb_rule(c->b, "ws", 2);
        uint32_t r[] = {'\t', '\n', '\r', '\r', ' ', ' '};
        gb_define(c->b, c->r_ws, gb_repeat(c->b, gb_bclass(c->b, r, 3), 0, -1));
    }
    return gb_call(c->b, c->r_ws);
}

/* "lit" surrounded by optional whitespace (punctuation between JSON tokens). */
static int punct(struct sc *c, const char *lit)
{
    if (!c->free_ws)
        return gb_str(c->b, lit);
    int k[3] = {ws(c), gb_str(c->b, lit), ws(c)};
    return gb_seq(c->b, k, 3);
}

/* One character of a JSON string: a plain character or an escape (never a lone surrogate). */
static int string_char(struct sc *c)
{
    uint32_t plain[] = {0x20, 0x21, 0x23, 0x5B, 0x5D, 0x10FFFF};
    uint32_t hex[] = {'0', '9', 'A', 'F', 'a', 'f'};
    uint32_t hex_nd[] = {'0', '9', 'A', 'C', 'E', 'F', 'a', 'c', 'e', 'f'};
    uint32_t d8[] = {'0', '7'};
    uint32_t dd[] = {'D', 'D', 'd', 'd'};
    uint32_t simple[] = {'"', '"', '/', '/', '\\', '\\', 'b', 'b', 'f', 'f', 'n', 'n', 'r', 'r',
                         't', 't'};
    struct gbuild *b = c->b;
    int h3 = gb_repeat(b, gb_bclass(b, hex, 3), 3, 3);
    int u_plain = gb_seq2(b, gb_bclass(b, hex_nd, 5), h3);
    int u_low[] = {gb_bclass(b, dd, 2), gb_bclass(b, d8, 1), gb_repeat(b, gb_bclass(b, hex, 3), 2, 2)};
    int u = gb_seq2(b, gb_str(b, "u"), gb_alt2(b, u_plain, gb_seq(b, u_low, 3)));
    int esc = gb_seq2(b, gb_str(b, "\\"), gb_alt2(b, gb_bclass(b, simple, 8), u));
    return gb_alt2(b, gb_class(b, plain, 3), esc);
}

static int string_any(struct sc *c)
{
    if (c->r_string < 0) {
        c->r_string = gb_rule(c->b, "string", 6);
        int k[3] = {gb_str(c->b, "\""), gb_repeat(c->b, string_char(c), 0, -1), gb_str(c->b, "\"")};
        gb_define(c->b, c->r_string, gb_seq(c->b, k, 3));
    }
    return gb_call(c->b, c->r_string);
}

static int number_any(struct sc *c)
{
    struct gbuild *b = c->b;
    uint32_t d19[] = {'1', '9'}, d09[] = {'0', '9'}, ee[] = {'E', 'E', 'e', 'e'}, pm[] = {'+', '+', '-', '-'};
    int intp = gb_alt2(b, gb_str(b, "0"), gb_seq2(b, gb_bclass(b, d19, 1),
                                                    gb_repeat(b, gb_bclass(b, d09, 1), 0, -1)));
    int frac = gb_repeat(b, gb_seq2(b, gb_str(b, "."), gb_repeat(b, gb_bclass(b, d09, 1), 1, -1)), 0, 1);
    int ex[] = {gb_bclass(b, ee, 2), gb_repeat(b, gb_bclass(b, pm, 2), 0, 1),
                gb_repeat(b, gb_bclass(b, d09, 1), 1, -1)};
    int k[] = {gb_repeat(b, gb_str(b, "-"), 0, 1), intp, frac, gb_repeat(b, gb_seq(b, ex, 3), 0, 1)};
    return gb_seq(b, k, 4);
}

/* Any JSON value (the rule json_object and schemas without constraints use). */
static int value_any(struct sc *c)
{
    if (c->r_value >= 0)
        return gb_call(c->b, c->r_value);
    struct gbuild *b = c->b;
    c->r_value = gb_rule(b, "value", 5);
    int obj = gb_rule(b, "object", 6), arr = gb_rule(b, "array", 5);
    int kv[] = {string_any(c), punct(c, ":"), gb_call(b, c->r_value)};
    int kvx = gb_seq(b, kv, 3);
    int kv2[] = {gb_str(b, "{"), ws(c),
                 gb_repeat(b, gb_seq2(b, kvx, gb_repeat(b, gb_seq2(b, punct(c, ","), gb_seq(b, kv, 3)), 0, -1)), 0, 1),
                 ws(c), gb_str(b, "}")};
    gb_define(b, obj, gb_seq(b, kv2, 5));
    int el[] = {gb_str(b, "["), ws(c),
                gb_repeat(b, gb_seq2(b, gb_call(b, c->r_value),
                                     gb_repeat(b, gb_seq2(b, punct(c, ","), gb_call(b, c->r_value)), 0, -1)), 0, 1),
                ws(c), gb_str(b, "]")};
    gb_define(b, arr, gb_seq(b, el, 5));
    int alts[] = {gb_call(b, obj), gb_call(b, arr), string_any(c), number_any(c),
                  gb_str(b, "true"), gb_str(b, "false"), gb_str(b, "null")};
    gb_define(b, c->r_value, gb_alt(b, alts, 7));
    return gb_call(b, c->r_value);
}

/* A JSON value written compactly (enum and const). */
static int literal_value(struct sc *c, struct json_object *v)
{
    if (!v)
        return gb_str(c->b, "null");
    size_t len;
    const char *s = json_object_to_json_string_length(
        v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    return s ? gb_bytes(c->b, s, len) : (c->b->oom = true, -1);
}

/* ---- integers: exact decimal ranges ------------------------------------------------- */

static int digits_of(long long v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static long long pow10ll(int n)
{
    long long p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

/* Decimal strings of equal length n between a and z (digit strings, leading zeros allowed). */
static int same_len_range(struct sc *c, const char *a, const char *z, int n)
{
    struct gbuild *b = c->b;
    uint32_t d09[] = {'0', '9'};
    if (n == 0)
        return gb_empty(b);
    if (n == 1) {
        uint32_t r[] = {(uint32_t)a[0], (uint32_t)z[0]};
        return gb_bclass(b, r, 1);
    }
    bool low = true, high = true;
    for (int i = 0; i < n; i++) {
        low = low && a[i] == '0';
        high = high && z[i] == '9';
    }
    if (low && high) /* every string of n digits: no branching, or the size would be 3^n */
        return gb_repeat(b, gb_bclass(b, d09, 1), n, n);
    if (a[0] == z[0])
        return gb_seq2(b, gb_bytes(b, a, 1), same_len_range(c, a + 1, z + 1, n - 1));
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    int alts[3], na = 0;
    alts[na++] = gb_seq2(b, gb_bytes(b, a, 1), same_len_range(c, a + 1, nines, n - 1));
    if (a[0] + 1 <= z[0] - 1) {
        uint32_t r[] = {(uint32_t)a[0] + 1, (uint32_t)z[0] - 1};
        alts[na++] = gb_seq2(b, gb_bclass(b, r, 1), gb_repeat(b, gb_bclass(b, d09, 1), n - 1, n - 1));
    }
    alts[na++] = gb_seq2(b, gb_bytes(b, z, 1), same_len_range(c, zeros, z + 1, n - 1));
    return gb_alt(b, alts, na);
}

/* Non-negative integers in [a, z] without leading zeros; z < 0 means unbounded. */
static int uint_range(struct sc *c, long long a, long long z)
{
    struct gbuild *b = c->b;
    int alts[24], na = 0;
    int da = digits_of(a);
    int dz = z < 0 ? 19 : digits_of(z);
    for (int d = da; d <= dz && d <= 18; d++) {
        long long lo = d == da ? a : pow10ll(d - 1);
        long long hi = d == dz && z >= 0 ? z : pow10ll(d) - 1;
        if (lo > hi)
            continue;
        char sa[24], sz[24];
        snprintf(sa, sizeof sa, "%lld", lo);
        snprintf(sz, sizeof sz, "%lld", hi);
        alts[na++] = same_len_range(c, sa, sz, d);
    }
    if (z < 0) {
        /* more digits than any bound written out: 19 or more */
        uint32_t d19[] = {'1', '9'}, d09[] = {'0', '9'};
        int from = da > 18 ? da : 19;
        alts[na++] = gb_seq2(b, gb_bclass(b, d19, 1), gb_repeat(b, gb_bclass(b, d09, 1), from - 1, -1));
    }
    return na ? gb_alt(b, alts, na) : -1;
}

/* Integers in [lo, hi] (lo_inf/hi_inf: open-ended); -1 with no error when the range is empty. */
static int int_range(struct sc *c, long long lo, bool lo_inf, long long hi, bool hi_inf)
{
    struct gbuild *b = c->b;
    if (!lo_inf && !hi_inf && lo > hi)
        return -2;
    int alts[2], na = 0;
    if (lo_inf || lo < 0) {
        long long nlo = hi_inf || hi >= 0 ? 1 : -hi;
        long long nhi = lo_inf ? -1 : -lo;
        alts[na++] = gb_seq2(b, gb_str(b, "-"), uint_range(c, nlo, nhi));
    }
    if (hi_inf || hi >= 0)
        alts[na++] = uint_range(c, lo_inf || lo < 0 ? 0 : lo, hi_inf ? -1 : hi);
    return gb_alt(b, alts, na);
}

struct bounds {
    double lo, hi;
    bool lo_open, hi_open;
};

/* minimum/maximum/exclusive* of s (both drafts' spellings). */
static int read_bounds(struct sc *c, struct json_object *s, struct bounds *bd)
{
    *bd = (struct bounds){-INFINITY, INFINITY, false, false};
    struct json_object *v;
    if (json_object_object_get_ex(s, "minimum", &v) && v) {
        if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
            return failf_key(c, INFERD_EFORMAT, "minimum", "must be a number");
        bd->lo = json_object_get_double(v);
    }
    if (json_object_object_get_ex(s, "maximum", &v) && v) {
        if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
            return failf_key(c, INFERD_EFORMAT, "maximum", "must be a number");
        bd->hi = json_object_get_double(v);
    }
    if (json_object_object_get_ex(s, "exclusiveMinimum", &v) && v) {
        if (json_object_is_type(v, json_type_boolean))
            bd->lo_open = json_object_get_boolean(v);
        else if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) {
            double x = json_object_get_double(v);
            if (x >= bd->lo) {
                bd->lo = x;
                bd->lo_open = true;
            }
        } else
            return failf_key(c, INFERD_EFORMAT, "exclusiveMinimum", "must be a number");
    }
    if (json_object_object_get_ex(s, "exclusiveMaximum", &v) && v) {
        if (json_object_is_type(v, json_type_boolean))
            bd->hi_open = json_object_get_boolean(v);
        else if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) {
            double x = json_object_get_double(v);
            if (x <= bd->hi) {
                bd->hi = x;
                bd->hi_open = true;
            }
        } else
            return failf_key(c, INFERD_EFORMAT, "exclusiveMaximum", "must be a number");
    }
    if (isnan(bd->lo) || isnan(bd->hi))
        return fail(c, INFERD_EFORMAT, "a bound is not a number");
    return 0;
}

/* The integers within bounds as [lo, hi] with open ends. */
static void int_bounds(const struct bounds *bd, long long *lo, bool *lo_inf, long long *hi, bool *hi_inf)
{
    double l = bd->lo_open ? floor(bd->lo) + 1 : ceil(bd->lo);
    double h = bd->hi_open ? ceil(bd->hi) - 1 : floor(bd->hi);
    *lo_inf = !(l >= (double)-INT_LIMIT && l <= (double)INT_LIMIT);
    *hi_inf = !(h >= (double)-INT_LIMIT && h <= (double)INT_LIMIT);
    if (*lo_inf && l > 0) { /* a lower bound past the limit: nothing we can write */
        *lo_inf = false;
        l = (double)INT_LIMIT;
    }
    if (*hi_inf && h < 0) {
        *hi_inf = false;
        h = (double)-INT_LIMIT;
    }
    *lo = *lo_inf ? 0 : (long long)l;
    *hi = *hi_inf ? 0 : (long long)h;
}

static int integer_expr(struct sc *c, struct json_object *s)
{
    struct bounds bd;
    if (read_bounds(c, s, &bd))
        return -1;
    long long lo, hi;
    bool lo_inf, hi_inf;
    int_bounds(&bd, &lo, &lo_inf, &hi, &hi_inf);
    int x = int_range(c, lo, lo_inf, hi, hi_inf);
    if (x == -2)
        return fail(c, INFERD_EINVAL, "no integer lies within minimum/maximum");
    return x;
}

static int number_expr(struct sc *c, struct json_object *s)
{
    struct gbuild *b = c->b;
    struct bounds bd;
    if (read_bounds(c, s, &bd))
        return -1;
    if (isinf(bd.lo) && isinf(bd.hi))
        return number_any(c);
    bool both = !isinf(bd.lo) && !isinf(bd.hi);
    uint32_t d09[] = {'0', '9'};
    int frac = gb_seq2(b, gb_str(b, "."), gb_repeat(b, gb_bclass(b, d09, 1), 1,
                                                      both ? BOUNDED_FRACTION_DIGITS : -1));
    int alts[3], na = 0;
    long long lo, hi;
    bool lo_inf, hi_inf;
    int_bounds(&bd, &lo, &lo_inf, &hi, &hi_inf);
    int whole = int_range(c, lo, lo_inf, hi, hi_inf);
    if (whole >= 0)
        alts[na++] = whole;
    /* I.F with I ≥ 0 lies in [I, I+1): needs I ≥ lo (I > lo when open) and I + 1 ≤ hi */
    {
        double a = fmax(0, bd.lo_open ? floor(bd.lo) + 1 : ceil(bd.lo));
        double z = isinf(bd.hi) ? INFINITY : floor(bd.hi) - 1;
        if (a <= z && a <= (double)INT_LIMIT) {
            long long za = isinf(z) || z > (double)INT_LIMIT ? -1 : (long long)z;
            alts[na++] = gb_seq2(b, uint_range(c, (long long)a, za), frac);
        }
    }
    /* -M.F lies in (-(M+1), -M]: needs -(M+1) ≥ lo and -M ≤ hi (< hi when open) */
    {
        double a = fmax(0, isinf(bd.hi) ? 0 : bd.hi_open ? floor(-bd.hi) + 1 : ceil(-bd.hi));
        double z = isinf(bd.lo) ? INFINITY : floor(-bd.lo) - 1;
        if (a <= z && a <= (double)INT_LIMIT) {
            long long za = isinf(z) || z > (double)INT_LIMIT ? -1 : (long long)z;
            int k[] = {gb_str(b, "-"), uint_range(c, (long long)a, za), frac};
            alts[na++] = gb_seq(b, k, 3);
        }
    }
    if (!na)
        return fail(c, INFERD_EINVAL, "no number lies within minimum/maximum");
    return gb_alt(b, alts, na);
}

/* ---- strings ------------------------------------------------------------------------ */

static const char *format_regex(const char *f)
{
    if (!strcmp(f, "date"))
        return "^\\d{4}-(((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01]))|((0[469]|11)-(0[1-9]|[12]\\d|30))|"
               "(02-(0[1-9]|1\\d|2[0-8])))$";
    if (!strcmp(f, "time"))
        return "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,9})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$";
    if (!strcmp(f, "date-time"))
        return "^\\d{4}-(((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01]))|((0[469]|11)-(0[1-9]|[12]\\d|30))|"
               "(02-(0[1-9]|1\\d|2[0-8])))T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,9})?"
               "(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$";
    if (!strcmp(f, "uuid"))
        return "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
    if (!strcmp(f, "email"))
        return "^[A-Za-z0-9_+-]+(\\.[A-Za-z0-9_+-]+)*@[A-Za-z0-9]+(-[A-Za-z0-9]+)*\\.([A-Za-z0-9]+(-[A-Za-z0-9]+)*\\.)*"
               "[A-Za-z]{2,12}$";
    if (!strcmp(f, "ipv4"))
        return "^(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}$";
    return NULL;
}

static int get_count(struct sc *c, struct json_object *s, const char *key, int *out)
{
    struct json_object *v;
    if (!json_object_object_get_ex(s, key, &v) || !v)
        return 0;
    if (!json_object_is_type(v, json_type_int) && !(json_object_is_type(v, json_type_double) &&
                                                    json_object_get_double(v) == floor(json_object_get_double(v))))
        return failf_key(c, INFERD_EFORMAT, key, "must be a non-negative integer");
    int64_t n = json_object_get_int64(v);
    if (json_object_is_type(v, json_type_double))
        n = (int64_t)json_object_get_double(v);
    if (n < 0)
        return failf_key(c, INFERD_EFORMAT, key, "must be a non-negative integer");
    if (n > 100000)
        return failf_key(c, INFERD_ERANGE, key, "is too large (over 100000)");
    *out = (int)n;
    return 0;
}

static int string_expr(struct sc *c, struct json_object *s)
{
    struct gbuild *b = c->b;
    int min = 0, max = -1;
    if (get_count(c, s, "minLength", &min) || get_count(c, s, "maxLength", &max))
        return -1;
    if (max >= 0 && max < min)
        return fail(c, INFERD_EINVAL, "maxLength is below minLength");
    struct json_object *pat = NULL, *fmt = NULL;
    json_object_object_get_ex(s, "pattern", &pat);
    json_object_object_get_ex(s, "format", &fmt);
    const char *re = NULL;
    size_t re_len = 0;
    if (fmt) {
        if (!json_object_is_type(fmt, json_type_string))
            return failf_key(c, INFERD_EFORMAT, "format", "must be a string");
        re = format_regex(json_object_get_string(fmt));
        if (!re) {
            char what[128];
            snprintf(what, sizeof what, "format '%.60s' not supported", json_object_get_string(fmt));
            return failf_key(c, INFERD_EUNSUPPORTED, "format", what);
        }
        re_len = strlen(re);
    }
    if (pat) {
        if (!json_object_is_type(pat, json_type_string))
            return failf_key(c, INFERD_EFORMAT, "pattern", "must be a string");
        if (re)
            return failf_key(c, INFERD_EUNSUPPORTED, "pattern", "together with format not supported");
        re = json_object_get_string(pat);
        re_len = (size_t)json_object_get_string_len(pat);
    }
    if (re) {
        if (min > 0 || max >= 0)
            return failf_key(c, INFERD_EUNSUPPORTED, pat ? "pattern" : "format",
                             "together with minLength/maxLength not supported");
        int x;
        struct err e = {0};
        int rc = rx_parse(b, re, re_len, true, &x, &e);
        if (rc) {
            char what[600];
            snprintf(what, sizeof what, "%s", e.msg);
            return failf_key(c, -rc, pat ? "pattern" : "format", what);
        }
        int k[3] = {gb_str(b, "\""), x, gb_str(b, "\"")};
        return gb_seq(b, k, 3);
    }
    if (min == 0 && max < 0)
        return string_any(c);
    int k[3] = {gb_str(b, "\""), gb_repeat(b, string_char(c), min, max), gb_str(b, "\"")};
    return gb_seq(b, k, 3);
}

/* ---- schemas -------------------------------------------------------------------------- */

static int schema_call(struct sc *c, struct json_object *s);

static const char *const unsupported_keys[] = {
    "patternProperties", "if", "then", "else", "dependentSchemas", "dependentRequired",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "not", "propertyNames",
    "minProperties", "maxProperties", "contains", "minContains", "maxContains", "multipleOf",
    "$dynamicRef", "$recursiveRef", "contentSchema", NULL};

static int check_keys(struct sc *c, struct json_object *s)
{
    for (int i = 0; unsupported_keys[i]; i++) {
        struct json_object *v;
        if (json_object_object_get_ex(s, unsupported_keys[i], &v))
            return failf_key(c, INFERD_EUNSUPPORTED, unsupported_keys[i], "not supported");
    }
    struct json_object *u;
    if (json_object_object_get_ex(s, "uniqueItems", &u) && json_object_get_boolean(u))
        return failf_key(c, INFERD_EUNSUPPORTED, "uniqueItems", "not supported");
    return 0;
}

/* The schema a local $ref names ("#", "#/$defs/x", "#/definitions/x", any JSON pointer);
 * NULL after an error. Sets the path to the target's. */
static struct json_object *resolve_ref(struct sc *c, struct json_object *ref)
{
    if (!json_object_is_type(ref, json_type_string)) {
        failf_key(c, INFERD_EFORMAT, "$ref", "must be a string");
        return NULL;
    }
    const char *r = json_object_get_string(ref);
    if (r[0] != '#') {
        failf_key(c, INFERD_EUNSUPPORTED, "$ref", "only references within the schema (#/...) are supported");
        return NULL;
    }
    struct json_object *cur = c->doc;
    char tmp_path[512] = "schema";
    size_t tl = 6;
    const char *p = r + 1;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n < sizeof seg - 1) {
            if (p[0] == '~' && p[1] == '1')
                seg[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0')
                seg[n++] = '~', p += 2;
            else
                seg[n++] = *p++;
        }
        seg[n] = 0;
        struct json_object *next = NULL;
        if (json_object_is_type(cur, json_type_object))
            json_object_object_get_ex(cur, seg, &next);
        else if (json_object_is_type(cur, json_type_array)) {
            char *end;
            long i = strtol(seg, &end, 10);
            if (*end == 0 && i >= 0 && (size_t)i < json_object_array_length(cur))
                next = json_object_array_get_idx(cur, (size_t)i);
        }
        if (!next) {
            char what[400];
            snprintf(what, sizeof what, "'%.300s' does not resolve", r);
            failf_key(c, INFERD_EINVAL, "$ref", what);
            return NULL;
        }
        int k = snprintf(tmp_path + tl, sizeof tmp_path - tl, ".%s", seg);
        if (k > 0 && tl + (size_t)k < sizeof tmp_path)
            tl += (size_t)k;
        cur = next;
    }
    if (*p) {
        failf_key(c, INFERD_EUNSUPPORTED, "$ref", "only JSON pointers (#/...) are supported");
        return NULL;
    }
    memcpy(c->path, tmp_path, tl + 1);
    c->plen = tl;
    return cur;
}

/* Keeps a schema object made here alive until the compile ends. */
static struct json_object *keep(struct sc *c, struct json_object *o)
{
    if (!o) {
        c->b->oom = true;
        return NULL;
    }
    if (c->nmade == c->capmade) {
        int cap = c->capmade ? c->capmade * 2 : 16;
        struct json_object **m = realloc(c->made, (size_t)cap * sizeof *m);
        if (!m) {
            json_object_put(o);
            c->b->oom = true;
            return NULL;
        }
        c->made = m;
        c->capmade = cap;
    }
    c->made[c->nmade++] = o;
    return o;
}

/* Keys that only annotate: they never change what is valid. */
static bool is_annotation(const char *k)
{
    static const char *const a[] = {"title", "description", "examples", "default", "$schema", "$id",
                                    "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                    "definitions", "$anchor", "strict", "name", NULL};
    for (int i = 0; a[i]; i++)
        if (!strcmp(k, a[i]))
            return true;
    return false;
}

/* A shallow copy of s without key drop (NULL: none). */
static struct json_object *copy_without(struct sc *c, struct json_object *s, const char *drop)
{
    struct json_object *o = keep(c, json_object_new_object());
    if (!o)
        return NULL;
    json_object_object_foreach(s, k, v)
    {
        if (drop && !strcmp(k, drop))
            continue;
        json_object_object_add(o, k, json_object_get(v));
    }
    return o;
}

/* allOf merged into one object schema: properties in order of appearance, required united,
 * additionalProperties false when any part says so. */
static struct json_object *merge_all_of(struct sc *c, struct json_object *s, struct json_object *all)
{
    if (!json_object_is_type(all, json_type_array) || json_object_array_length(all) == 0) {
        failf_key(c, INFERD_EFORMAT, "allOf", "must be a non-empty array");
        return NULL;
    }
    struct json_object *base = copy_without(c, s, "allOf");
    if (!base)
        return NULL;
    size_t n = json_object_array_length(all);
    bool own_keys = false;
    json_object_object_foreach(base, k0, v0)
    {
        (void)v0;
        if (!is_annotation(k0))
            own_keys = true;
    }
    if (n == 1 && !own_keys)
        return json_object_array_get_idx(all, 0);
    struct json_object *props = keep(c, json_object_new_object());
    struct json_object *req = keep(c, json_object_new_array());
    struct json_object *addl = NULL;
    if (!props || !req)
        return NULL;
    char where[512];
    snprintf(where, sizeof where, "%s", c->path);
    for (size_t i = 0; i <= n; i++) {
        struct json_object *part = i == 0 ? base : json_object_array_get_idx(all, i - 1);
        struct json_object *ref;
        int hops = 0;
        while (json_object_is_type(part, json_type_object) &&
               json_object_object_get_ex(part, "$ref", &ref) && hops++ < 16) {
            part = resolve_ref(c, ref);
            snprintf(c->path, sizeof c->path, "%s", where);
            c->plen = strlen(c->path);
            if (!part)
                return NULL;
        }
        if (!json_object_is_type(part, json_type_object)) {
            failf_key(c, INFERD_EUNSUPPORTED, "allOf", "only objects can be merged");
            return NULL;
        }
        json_object_object_foreach(part, k, v)
        {
            if (is_annotation(k))
                continue;
            if (!strcmp(k, "type")) {
                if (!json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "object")) {
                    failf_key(c, INFERD_EUNSUPPORTED, "allOf", "only objects can be merged");
                    return NULL;
                }
            } else if (!strcmp(k, "properties") && json_object_is_type(v, json_type_object)) {
                json_object_object_foreach(v, pk, pv)
                {
                    json_object_object_add(props, pk, json_object_get(pv));
                }
            } else if (!strcmp(k, "required") && json_object_is_type(v, json_type_array)) {
                for (size_t q = 0; q < json_object_array_length(v); q++)
                    json_object_array_add(req, json_object_get(json_object_array_get_idx(v, q)));
            } else if (!strcmp(k, "additionalProperties")) {
                if (!addl || (json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v)))
                    addl = v;
            } else if (strcmp(k, "allOf")) {
                char what[160];
                snprintf(what, sizeof what, "merging '%.60s' not supported (only objects' properties, "
                         "required and additionalProperties)", k);
                failf_key(c, INFERD_EUNSUPPORTED, "allOf", what);
                return NULL;
            }
        }
    }
    struct json_object *m = keep(c, json_object_new_object());
    if (!m)
        return NULL;
    json_object_object_add(m, "type", json_object_new_string("object"));
    json_object_object_add(m, "properties", json_object_get(props));
    json_object_object_add(m, "required", json_object_get(req));
    if (addl)
        json_object_object_add(m, "additionalProperties", json_object_get(addl));
    return m;
}

/* Key strings (JSON contents, raw bytes) not equal to any of keys: the trie's complement,
 * by codepoint so every key stays valid UTF-8; escapes are left out of such keys. */
static int key_not_in(struct sc *c, const char *const *keys, const size_t *lens, int n, int depth)
{
    struct gbuild *b = c->b;
    uint32_t plain[] = {0x20, 0x21, 0x23, 0x5B, 0x5D, 0x10FFFF};
    int any = gb_repeat(b, gb_class(b, plain, 3), 0, -1);
    if (depth > MAX_KEY_BYTES)
        return any;
    bool has_empty = false;
    uint32_t firsts[2 * 256];
    int nf = 0;
    int alts[260], na = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] == 0) {
            has_empty = true;
            continue;
        }
        /* the first codepoint's bytes */
        uint8_t c0 = (uint8_t)keys[i][0];
        size_t cl = c0 < 0x80 ? 1 : c0 < 0xE0 ? 2 : c0 < 0xF0 ? 3 : 4;
        if (cl > lens[i])
            cl = lens[i];
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) {
            if (lens[j] == 0)
                continue;
            uint8_t d0 = (uint8_t)keys[j][0];
            size_t dl = d0 < 0x80 ? 1 : d0 < 0xE0 ? 2 : d0 < 0xF0 ? 3 : 4;
            seen = dl == cl && dl <= lens[j] && !memcmp(keys[i], keys[j], cl);
        }
        if (seen || na >= 255 || nf >= 256)
            continue;
        /* the keys that start with this codepoint, without it */
        const char **sub = malloc((size_t)n * sizeof *sub);
        size_t *sl = malloc((size_t)n * sizeof *sl);
        if (!sub || !sl) {
            free(sub);
            free(sl);
            b->oom = true;
            return -1;
        }
        int ns = 0;
        for (int j = i; j < n; j++)
            if (lens[j] >= cl && !memcmp(keys[j], keys[i], cl)) {
                sub[ns] = keys[j] + cl;
                sl[ns++] = lens[j] - cl;
            }
        alts[na++] = gb_seq2(b, gb_bytes(b, keys[i], cl), key_not_in(c, sub, sl, ns, depth + 1));
        free(sub);
        free(sl);
        /* record the codepoint to exclude it below */
        uint32_t cp = c0 < 0x80 ? c0 : c0 < 0xE0 ? c0 & 0x1F : c0 < 0xF0 ? c0 & 0x0F : c0 & 0x07;
        for (size_t k = 1; k < cl; k++)
            cp = cp << 6 | ((uint8_t)keys[i][k] & 0x3F);
        firsts[2 * nf] = firsts[2 * nf + 1] = cp;
        nf++;
    }
    nf = gb_normalize_ranges(firsts, nf);
    /* a first character no key starts with, then anything */
    uint32_t excl[2 * 260];
    int ne = 0;
    uint32_t forbid[2 * 264];
    memcpy(forbid, firsts, 2 * (size_t)nf * sizeof *forbid);
    int nfb = nf;
    forbid[2 * nfb] = 0, forbid[2 * nfb + 1] = 0x1F, nfb++;
    forbid[2 * nfb] = '"', forbid[2 * nfb + 1] = '"', nfb++;
    forbid[2 * nfb] = '\\', forbid[2 * nfb + 1] = '\\', nfb++;
    nfb = gb_normalize_ranges(forbid, nfb);
    ne = gb_complement_ranges(forbid, nfb, 0x10FFFF, excl);
    if (ne)
        alts[na++] = gb_seq2(b, gb_class(b, excl, ne), any);
    if (!has_empty)
        alts[na++] = gb_empty(b);
    return na ? gb_alt(b, alts, na) : -1;
}

static int object_expr(struct sc *c, struct json_object *s)
{
    struct gbuild *b = c->b;
    struct json_object *props = NULL, *req = NULL, *addl = NULL;
    json_object_object_get_ex(s, "properties", &props);
    json_object_object_get_ex(s, "required", &req);
    json_object_object_get_ex(s, "additionalProperties", &addl);
    if (props && !json_object_is_type(props, json_type_object))
        return failf_key(c, INFERD_EFORMAT, "properties", "must be an object");
    if (req && !json_object_is_type(req, json_type_array))
        return failf_key(c, INFERD_EFORMAT, "required", "must be an array");
    int n = props ? json_object_object_length(props) : 0;
    size_t nreq = req ? json_object_array_length(req) : 0;
    /* declared keys, then required keys not declared (any value) */
    int cap = n + (int)nreq + 1;
    const char **keys = calloc((size_t)cap, sizeof *keys);
    size_t *klen = calloc((size_t)cap, sizeof *klen);
    struct json_object **vals = calloc((size_t)cap, sizeof *vals);
    bool *must = calloc((size_t)cap, sizeof *must);
    int *rest = NULL;
    int x = -1, nk = 0;
    if (!keys || !klen || !vals || !must) {
        b->oom = true;
        goto out;
    }
    if (props) {
        json_object_object_foreach(props, k, v)
        {
            keys[nk] = k;
            klen[nk] = strlen(k);
            vals[nk++] = v;
        }
    }
    for (size_t i = 0; i < nreq; i++) {
        struct json_object *r = json_object_array_get_idx(req, i);
        if (!json_object_is_type(r, json_type_string)) {
            failf_key(c, INFERD_EFORMAT, "required", "must list strings");
            goto out;
        }
        const char *k = json_object_get_string(r);
        int at = -1;
        for (int j = 0; j < nk && at < 0; j++)
            if (!strcmp(keys[j], k))
                at = j;
        if (at < 0) {
            keys[nk] = k;
            klen[nk] = strlen(k);
            vals[nk] = NULL; /* any value */
            at = nk++;
        }
        must[at] = true;
    }
    /* the value of each key, as a call */
    int *vexpr = calloc((size_t)nk + 1, sizeof *vexpr);
    rest = vexpr;
    if (!vexpr) {
        b->oom = true;
        goto out;
    }
    for (int i = 0; i < nk; i++) {
        size_t mark = path_push(c, "properties", 0);
        path_push(c, keys[i], 0);
        vexpr[i] = vals[i] ? schema_call(c, vals[i]) : value_any(c);
        path_pop(c, mark);
        if (c->rc)
            goto out;
    }
    /* extra members: absent or false → none (as OpenAI's strict mode); true or a schema → any
     * key not declared */
    int extra = -1;
    if (addl && !(json_object_is_type(addl, json_type_boolean) && !json_object_get_boolean(addl))) {
        size_t mark = path_push(c, "additionalProperties", 0);
        int v = json_object_is_type(addl, json_type_boolean) ? value_any(c) : schema_call(c, addl);
        path_pop(c, mark);
        int key = nk ? gb_seq(b, (int[]){gb_str(b, "\""), key_not_in(c, keys, klen, nk, 0), gb_str(b, "\"")}, 3)
                     : string_any(c);
        int kv[] = {key, punct(c, ":"), v};
        extra = gb_seq(b, kv, 3);
    }
    /* members in declared order: R(i, e) = what may follow from key i on, e: a member came
     * before (so a comma goes first). Optional keys branch; rules keep the branches shared. */
    int r_next[2] = {-1, -1};
    {
        /* R(nk, e) */
        int tail0, tail1;
        if (extra >= 0) {
            int more = gb_repeat(b, gb_seq2(b, punct(c, ","), extra), 0, -1);
            tail1 = more;
            tail0 = gb_repeat(b, gb_seq2(b, extra, gb_repeat(b, gb_seq2(b, punct(c, ","), extra), 0, -1)), 0, 1);
        } else {
            tail1 = gb_empty(b);
            tail0 = gb_empty(b);
        }
        int e0 = tail0, e1 = tail1;
        for (int i = nk - 1; i >= 0; i--) {
            char kbuf[MAX_KEY_BYTES * 6 + 8];
            struct json_object *ks = json_object_new_string_len(keys[i], (int)klen[i]);
            size_t kl = 0;
            const char *kj = ks ? json_object_to_json_string_length(
                                      ks, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &kl)
                                : NULL;
            if (!kj || kl >= sizeof kbuf) {
                json_object_put(ks);
                if (!kj)
                    b->oom = true;
                else {
                    size_t mark = path_push(c, "properties", 0);
                    path_push(c, keys[i], 0);
                    fail(c, INFERD_ERANGE, "the key is too long");
                    path_pop(c, mark);
                }
                goto out;
            }
            memcpy(kbuf, kj, kl);
            json_object_put(ks);
            int kv[] = {gb_bytes(b, kbuf, kl), punct(c, ":"), vexpr[i]};
            int member = gb_seq(b, kv, 3);
            int with1 = gb_seq2(b, gb_seq2(b, punct(c, ","), member), e1);
            int with0 = gb_seq2(b, member, e1);
            int n1, n0;
            if (must[i]) {
                n1 = with1;
                n0 = with0;
            } else {
                n1 = gb_alt2(b, with1, e1);
                n0 = gb_alt2(b, with0, e0);
            }
            /* share the two continuations through rules when an optional key branches */
            if (!must[i] && i > 0) {
                char nm[32];
                snprintf(nm, sizeof nm, "obj%d", b->nrules);
                int ra = gb_rule(b, nm, strlen(nm));
                snprintf(nm, sizeof nm, "obj%d", b->nrules);
                int rb = gb_rule(b, nm, strlen(nm));
                gb_define(b, ra, n0);
                gb_define(b, rb, n1);
                n0 = gb_call(b, ra);
                n1 = gb_call(b, rb);
            }
            e0 = n0;
            e1 = n1;
        }
        r_next[0] = e0;
        r_next[1] = e1;
    }
    int k[] = {gb_str(b, "{"), ws(c), r_next[0], ws(c), gb_str(b, "}")};
    x = gb_seq(b, k, 5);
out:
    free(keys);
    free(klen);
    free(vals);
    free(must);
    free(rest);
    return c->rc ? -1 : x;
}

static int array_expr(struct sc *c, struct json_object *s)
{
    struct gbuild *b = c->b;
    struct json_object *items = NULL, *prefix = NULL;
    json_object_object_get_ex(s, "items", &items);
    json_object_object_get_ex(s, "prefixItems", &prefix);
    if (items && json_object_is_type(items, json_type_array)) { /* draft 4's tuple form */
        prefix = items;
        struct json_object *ai = NULL;
        json_object_object_get_ex(s, "additionalItems", &ai);
        items = ai;
    }
    if (prefix && !json_object_is_type(prefix, json_type_array))
        return failf_key(c, INFERD_EFORMAT, "prefixItems", "must be an array");
    int min = 0, max = -1;
    if (get_count(c, s, "minItems", &min) || get_count(c, s, "maxItems", &max))
        return -1;
    int np = prefix ? (int)json_object_array_length(prefix) : 0;
    bool no_more = items && json_object_is_type(items, json_type_boolean) && !json_object_get_boolean(items);
    if (no_more && (max < 0 || max > np))
        max = np;
    if (max >= 0 && max < min)
        return fail(c, INFERD_EINVAL, "no array length satisfies minItems/maxItems (and items: false)");
    int item = -1;
    if (!no_more && (max < 0 || max > np)) {
        size_t mark = path_push(c, "items", 0);
        item = items && !json_object_is_type(items, json_type_boolean) ? schema_call(c, items) : value_any(c);
        path_pop(c, mark);
        if (c->rc)
            return -1;
    }
    int *pe = calloc((size_t)np + 1, sizeof *pe);
    if (!pe)
        return b->oom = true, -1;
    for (int i = 0; i < np && (max < 0 || i < max); i++) {
        size_t mark = path_push(c, "prefixItems", 0);
        path_push(c, NULL, i);
        pe[i] = schema_call(c, json_object_array_get_idx(prefix, (size_t)i));
        path_pop(c, mark);
        if (c->rc) {
            free(pe);
            return -1;
        }
    }
    /* the items after the prefix: count in [cmin, cmax] */
    int kp = max >= 0 && max < np ? max : np;
    int tail = gb_empty(b);
    if (item >= 0) {
        int cmin = min > kp ? min - kp : 0;
        int cmax = max < 0 ? -1 : max - kp;
        if (kp > 0)
            tail = gb_repeat(b, gb_seq2(b, punct(c, ","), item), cmin, cmax);
        else {
            int rest = gb_repeat(b, gb_seq2(b, punct(c, ","), item), cmin > 0 ? cmin - 1 : 0,
                                 cmax < 0 ? -1 : cmax - 1);
            tail = gb_seq2(b, item, rest);
            if (cmin == 0)
                tail = gb_repeat(b, tail, 0, 1);
        }
    }
    /* prefix items from the last: P(i) = elem_i P(i+1), optional once i ≥ minItems */
    int body = tail;
    for (int i = kp - 1; i >= 0; i--) {
        int el = i > 0 ? gb_seq2(b, punct(c, ","), pe[i]) : pe[i];
        body = gb_seq2(b, el, body);
        if (i >= min)
            body = gb_repeat(b, body, 0, 1);
    }
    free(pe);
    int k[] = {gb_str(b, "["), ws(c), body, ws(c), gb_str(b, "]")};
    return gb_seq(b, k, 5);
}

static int type_expr(struct sc *c, struct json_object *s, const char *t)
{
    if (!strcmp(t, "null"))
        return gb_str(c->b, "null");
    if (!strcmp(t, "boolean"))
        return gb_alt2(c->b, gb_str(c->b, "true"), gb_str(c->b, "false"));
    if (!strcmp(t, "string"))
        return string_expr(c, s);
    if (!strcmp(t, "integer"))
        return integer_expr(c, s);
    if (!strcmp(t, "number"))
        return number_expr(c, s);
    if (!strcmp(t, "object"))
        return object_expr(c, s);
    if (!strcmp(t, "array"))
        return array_expr(c, s);
    char what[128];
    snprintf(what, sizeof what, "unknown type '%.60s'", t);
    return failf_key(c, INFERD_EFORMAT, "type", what);
}

static bool has(struct json_object *s, const char *k)
{
    struct json_object *v;
    return json_object_object_get_ex(s, k, &v);
}

/* The expression of schema s (not yet wrapped in its rule). */
static int schema_body(struct sc *c, struct json_object *s)
{
    struct gbuild *b = c->b;
    if (json_object_is_type(s, json_type_boolean)) {
        if (json_object_get_boolean(s))
            return value_any(c);
        return fail(c, INFERD_EINVAL, "the schema false matches nothing");
    }
    if (!json_object_is_type(s, json_type_object))
        return fail(c, INFERD_EFORMAT, "a schema must be an object or a boolean");
    if (check_keys(c, s))
        return -1;
    struct json_object *v;
    if (json_object_object_get_ex(s, "$ref", &v)) {
        char saved[512];
        size_t sl = c->plen;
        memcpy(saved, c->path, sl + 1);
        struct json_object *t = resolve_ref(c, v);
        int x = t ? schema_call(c, t) : -1;
        if (!c->rc) {
            memcpy(c->path, saved, sl + 1);
            c->plen = sl;
        }
        return x;
    }
    if (json_object_object_get_ex(s, "allOf", &v)) {
        struct json_object *m = merge_all_of(c, s, v);
        return m ? schema_call(c, m) : -1;
    }
    bool nullable = json_object_object_get_ex(s, "nullable", &v) && json_object_get_boolean(v);
    int x;
    const char *alt_key = has(s, "anyOf") ? "anyOf" : has(s, "oneOf") ? "oneOf" : NULL;
    if (alt_key) {
        json_object_object_get_ex(s, alt_key, &v);
        if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
            return failf_key(c, INFERD_EFORMAT, alt_key, "must be a non-empty array");
        /* keywords beside anyOf apply to every branch: merge them in (the branch wins) */
        struct json_object *side = copy_without(c, s, alt_key);
        if (!side)
            return -1;
        bool has_side = false;
        json_object_object_foreach(side, sk, sv)
        {
            (void)sv;
            if (!is_annotation(sk) && strcmp(sk, "nullable"))
                has_side = true;
        }
        size_t n = json_object_array_length(v);
        int *alts = malloc(n * sizeof *alts);
        if (!alts)
            return b->oom = true, -1;
        for (size_t i = 0; i < n && !c->rc; i++) {
            struct json_object *br = json_object_array_get_idx(v, i);
            if (has_side && json_object_is_type(br, json_type_object)) {
                struct json_object *m = copy_without(c, side, NULL);
                if (!m)
                    break;
                json_object_object_foreach(br, bk, bv)
                {
                    json_object_object_add(m, bk, json_object_get(bv));
                }
                br = m;
            }
            size_t mark = path_push(c, alt_key, 0);
            path_push(c, NULL, (int)i);
            alts[i] = schema_call(c, br);
            path_pop(c, mark);
        }
        x = c->rc ? -1 : gb_alt(b, alts, (int)n);
        free(alts);
    } else if (json_object_object_get_ex(s, "enum", &v)) {
        if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
            return failf_key(c, INFERD_EFORMAT, "enum", "must be a non-empty array");
        size_t n = json_object_array_length(v);
        int *alts = malloc(n * sizeof *alts);
        if (!alts)
            return b->oom = true, -1;
        for (size_t i = 0; i < n; i++)
            alts[i] = literal_value(c, json_object_array_get_idx(v, i));
        x = gb_alt(b, alts, (int)n);
        free(alts);
    } else if (json_object_object_get_ex(s, "const", &v)) {
        x = literal_value(c, v);
    } else if (json_object_object_get_ex(s, "type", &v)) {
        if (json_object_is_type(v, json_type_string))
            x = type_expr(c, s, json_object_get_string(v));
        else if (json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0) {
            size_t n = json_object_array_length(v);
            int alts[8], na = 0;
            for (size_t i = 0; i < n && !c->rc; i++) {
                struct json_object *t = json_object_array_get_idx(v, i);
                if (!json_object_is_type(t, json_type_string))
                    return failf_key(c, INFERD_EFORMAT, "type", "must list type names");
                if (na < 8)
                    alts[na++] = type_expr(c, s, json_object_get_string(t));
            }
            x = c->rc ? -1 : gb_alt(b, alts, na);
        } else
            return failf_key(c, INFERD_EFORMAT, "type", "must be a type name or a list of them");
    } else if (has(s, "properties") || has(s, "additionalProperties") || has(s, "required")) {
        x = object_expr(c, s);
    } else if (has(s, "items") || has(s, "prefixItems") || has(s, "minItems") || has(s, "maxItems")) {
        x = array_expr(c, s);
    } else if (has(s, "minLength") || has(s, "maxLength") || has(s, "pattern") || has(s, "format")) {
        x = string_expr(c, s);
    } else if (has(s, "minimum") || has(s, "maximum") || has(s, "exclusiveMinimum") ||
               has(s, "exclusiveMaximum")) {
        x = number_expr(c, s);
    } else {
        x = value_any(c);
    }
    if (nullable && x >= 0)
        x = gb_alt2(b, x, gb_str(b, "null"));
    return c->rc ? -1 : x;
}

/* A call of the rule for schema s, made on first use (so recursion through $ref closes). */
static int schema_call(struct sc *c, struct json_object *s)
{
    if (c->rc || c->b->oom || c->b->too_big)
        return -1;
    for (int i = 0; i < c->nmemo; i++)
        if (c->memo[i].s == s)
            return gb_call(c->b, c->memo[i].rule);
    if (c->depth >= MAX_NESTING)
        return fail(c, INFERD_ERANGE, "nested too deep (over 64 levels)");
    if (c->nmemo == c->capmemo) {
        int cap = c->capmemo ? c->capmemo * 2 : 32;
        struct memo *m = realloc(c->memo, (size_t)cap * sizeof *m);
        if (!m)
            return c->b->oom = true, -1;
        c->memo = m;
        c->capmemo = cap;
    }
    char nm[32];
    snprintf(nm, sizeof nm, "s%d", c->b->nrules);
    int r = gb_rule(c->b, nm, strlen(nm));
    if (r < 0)
        return -1;
    c->memo[c->nmemo++] = (struct memo){s, r};
    c->depth++;
    int x = schema_body(c, s);
    c->depth--;
    gb_define(c->b, r, x);
    return x < 0 ? -1 : gb_call(c->b, r);
}

static void sc_free(struct sc *c)
{
    for (int i = 0; i < c->nmade; i++)
        json_object_put(c->made[i]);
    free(c->made);
    free(c->memo);
}

static int finish(struct sc *c, int x, struct grammar **out)
{
    int rc = c->rc;
    if (!rc && (x < 0 || c->b->oom || c->b->too_big))
        rc = gb_fail(c->b, c->err);
    if (!rc) {
        int root = gb_rule(c->b, "root", 4);
        int k[] = {ws(c), x, ws(c)};
        gb_define(c->b, root, c->free_ws ? gb_seq(c->b, k, 3) : x);
        rc = gb_compile(c->b, root, out, c->err);
    }
    return rc;
}

int grammar_compile_json_schema(const char *schema, size_t len, const struct grammar_options *o,
                                struct grammar **out, struct err *err)
{
    *out = NULL;
    struct json_object *doc = NULL;
    int rc = json_text_parse(schema, len, MAX_NESTING * 2, true, &doc, err);
    if (rc)
        return err_wrap(err, "schema is not valid JSON");
    struct gbuild b;
    gb_init(&b, o);
    struct sc c = {.b = &b, .doc = doc, .free_ws = o && o->free_whitespace, .err = err,
                   .r_value = -1, .r_string = -1, .r_ws = -1};
    strcpy(c.path, "schema");
    c.plen = 6;
    int x = doc ? schema_call(&c, doc) : fail(&c, INFERD_EFORMAT, "a schema must be an object or a boolean");
    rc = finish(&c, x, out);
    sc_free(&c);
    gb_free(&b);
    json_object_put(doc);
    return rc;
}

int grammar_compile_json_object(const struct grammar_options *o, struct grammar **out, struct err *err)
{
    *out = NULL;
    struct gbuild b;
    gb_init(&b, o);
    struct sc c = {.b = &b, .free_ws = o && o->free_whitespace, .err = err, .r_value = -1,
                   .r_string = -1, .r_ws = -1};
    strcpy(c.path, "json_object");
    value_any(&c);
    int obj = gb_find_rule(&b, "object", 6);
    int rc = finish(&c, gb_call(&b, obj), out);
    sc_free(&c);
    gb_free(&b);
    return rc;
}

int grammar_compile_choice(const char *const *choices, const size_t *lens, int n,
                           const struct grammar_options *o, struct grammar **out, struct err *err)
{
    *out = NULL;
    if (n <= 0)
        return err_set(err, INFERD_EINVAL, "grammar: a choice needs at least one string");
    struct gbuild b;
    gb_init(&b, o);
    int root = gb_rule(&b, "root", 4);
    int *alts = malloc((size_t)n * sizeof *alts);
    if (!alts) {
        gb_free(&b);
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory");
    }
    for (int i = 0; i < n; i++)
        alts[i] = gb_bytes(&b, choices[i], lens[i]);
    gb_define(&b, root, gb_alt(&b, alts, n));
    free(alts);
    int rc = gb_compile(&b, root, out, err);
    gb_free(&b);
    return rc;
}
