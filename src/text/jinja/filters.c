/* text/jinja/filters.c — Jinja filters and tests, the methods of str/dict/list values, and the globals
 * (range, namespace, dict, raise_exception, strftime_now) that chat templates use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "text/jinja/internal.h"

#define FN_ARGS                                                                                         \
    struct render *r, struct builtin *b, struct value *args, size_t nargs, const char **kwn,          \
        struct value *kwv, size_t nkw, struct value *out, const struct node *at

static int oom_err(struct render *r, const struct node *at) { return jinja_error(r, at, "out of memory"); }

/* Positional argument i, or keyword argument name; NULL when absent. */
static struct value *arg(struct value *args, size_t nargs, const char **kwn, struct value *kwv, size_t nkw,
                         size_t i, const char *name)
{
    if (i < nargs)
        return &args[i];
    for (size_t k = 0; name && k < nkw; k++)
        if (strcmp(kwn[k], name) == 0)
            return &kwv[k];
    return NULL;
}
#define ARG(i, name) arg(args, nargs, kwn, kwv, nkw, (i), (name))

static bool is_str(const struct value *v) { return v && v->kind == V_STR; }
static bool is_intish(const struct value *v) { return v && (v->kind == V_INT || v->kind == V_BOOL); }
static int64_t as_int(const struct value *v) { return v->kind == V_INT ? v->u.i : v->kind == V_BOOL ? v->u.b : 0; }

static int need_str(struct render *r, const struct value *v, const char *what, const struct node *at)
{
    if (v->kind == V_STR)
        return 0;
    return jinja_error(r, at, "%s expects a string, got '%s'", what, jinja_value_type_name(v));
}

static struct value mkstr(struct render *r, const char *p, size_t n) { return v_str(&r->arena, p, n); }

static int set_str(struct render *r, struct value *out, struct strbuf *b, const struct node *at)
{
    *out = mkstr(r, b->data ? b->data : "", b->len);
    strbuf_free(b);
    return out->kind == V_STR ? 0 : oom_err(r, at);
}

/* ---- case mapping (Unicode via utf8proc) ---- */

enum case_op { C_UPPER, C_LOWER, C_CAPITALIZE, C_TITLE_PY, C_TITLE_JINJA };

static int map_case(struct render *r, const struct value *s, enum case_op op, struct value *out,
                    const struct node *at)
{
    struct strbuf b = {0};
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s->u.s.p;
    utf8proc_ssize_t n = (utf8proc_ssize_t)s->u.s.n, i = 0;
    bool word_start = true, first = true;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, n - i, &cp);
        if (k <= 0) { /* invalid byte: copy through */
            if (jinja_put(&b, (const char *)p + i, 1))
                goto fail;
            i++;
            continue;
        }
        utf8proc_int32_t o = cp;
        bool cased = utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp;
        switch (op) {
        case C_UPPER: o = utf8proc_toupper(cp); break;
        case C_LOWER: o = utf8proc_tolower(cp); break;
        case C_CAPITALIZE: o = first ? utf8proc_toupper(cp) : utf8proc_tolower(cp); break;
        case C_TITLE_PY:
            o = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            word_start = !cased;
            break;
        case C_TITLE_JINJA: {
            bool delim = cp == '-' || cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '(' ||
                         cp == '{' || cp == '[' || cp == '<' || cp == '\f' || cp == '\v';
            o = delim ? cp : word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            word_start = delim;
            break;
        }
        }
        /* Python's full case mapping turns ß into SS (Ss in title case); utf8proc's simple one does not */
        if (cp == 0xDF && o != cp) {
            bool whole = op == C_UPPER;
            first = false;
            if (jinja_put(&b, whole ? "SS" : "Ss", 2))
                goto fail;
            i += k;
            continue;
        }
        first = false;
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t el = utf8proc_encode_char(o, enc);
        if (jinja_put(&b, (const char *)enc, (size_t)el))
            goto fail;
        i += k;
    }
    return set_str(r, out, &b, at);
fail:
    strbuf_free(&b);
    return oom_err(r, at);
}

/* ---- strip / split / replace helpers ---- */

static bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

/* str.isspace() for one code point */
static bool uni_space(int32_t cp)
{
    if (cp < 0x80)
        return py_space((unsigned char)cp);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Decodes the code point starting at p[i]; invalid bytes decode as themselves, length 1. */
static size_t cp_at(const char *p, size_t n, size_t i, int32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = 0x110000 + (unsigned char)p[i]; /* matches nothing but itself */
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

/* Start of the code point that ends at p[e - 1]. */
static size_t cp_start_before(const char *p, size_t b, size_t e)
{
    size_t s = e - 1;
    while (s > b && e - s < 4 && ((unsigned char)p[s] & 0xC0) == 0x80)
        s--;
    int32_t cp;
    if (cp_at(p, e, s, &cp) != e - s)
        return e - 1;
    return s;
}

static bool cp_in_set(int32_t cp, const struct value *set)
{
    for (size_t i = 0; i < set->u.s.n;) {
        int32_t c;
        i += cp_at(set->u.s.p, set->u.s.n, i, &c);
        if (c == cp)
            return true;
    }
    return false;
}

static bool strip_this(int32_t cp, const struct value *chars)
{
    return chars ? cp_in_set(cp, chars) : uni_space(cp);
}

static int do_strip(struct render *r, const struct value *s, const struct value *chars, bool left, bool right,
                    struct value *out, const struct node *at)
{
    if (need_str(r, s, "strip", at))
        return -1;
    const char *p = s->u.s.p;
    size_t b = 0, e = s->u.s.n;
    if (chars && chars->kind != V_STR) {
        if (chars->kind != V_NONE && chars->kind != V_UNDEF)
            return jinja_error(r, at, "strip arg must be None or str");
        chars = NULL;
    }
    int32_t cp;
    while (left && b < e) {
        size_t k = cp_at(p, e, b, &cp);
        if (!strip_this(cp, chars))
            break;
        b += k;
    }
    while (right && e > b) {
        size_t st = cp_start_before(p, b, e);
        cp_at(p, e, st, &cp);
        if (!strip_this(cp, chars))
            break;
        e = st;
    }
    *out = mkstr(r, p + b, e - b);
    return out->kind == V_STR ? 0 : oom_err(r, at);
}

/* Byte length of the whitespace code point at p[i], or 0. */
static size_t ws_at(const char *p, size_t n, size_t i)
{
    int32_t cp;
    size_t k = cp_at(p, n, i, &cp);
    return uni_space(cp) ? k : 0;
}

static const char *find_sub(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0)
        return h;
    if (nn > hn)
        return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && memcmp(h + i, n, nn) == 0)
            return h + i;
    return NULL;
}

static int do_split(struct render *r, const struct value *s, const struct value *sep, const struct value *maxsplit,
                    struct value *out, const struct node *at)
{
    if (need_str(r, s, "split", at))
        return -1;
    int64_t maxs = maxsplit && is_intish(maxsplit) ? as_int(maxsplit) : -1;
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom_err(r, at);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep || sep->kind == V_NONE || sep->kind == V_UNDEF) {
        size_t i = 0, k;
        int64_t splits = 0;
        while (i < n) {
            while (i < n && (k = ws_at(p, n, i)))
                i += k;
            if (i >= n)
                break;
            size_t st = i;
            if (maxs >= 0 && splits >= maxs) {
                size_t e = n;
                while (e > st) {
                    size_t b = cp_start_before(p, st, e);
                    if (!ws_at(p, e, b))
                        break;
                    e = b;
                }
                struct value w = mkstr(r, p + st, e - st);
                if (w.kind != V_STR || jinja_list_push(&r->arena, out->u.l, w))
                    return oom_err(r, at);
                break;
            }
            while (i < n && !ws_at(p, n, i)) {
                int32_t cp;
                i += cp_at(p, n, i, &cp);
            }
            struct value w = mkstr(r, p + st, i - st);
            if (w.kind != V_STR || jinja_list_push(&r->arena, out->u.l, w))
                return oom_err(r, at);
            splits++;
        }
        return 0;
    }
    if (sep->kind != V_STR)
        return jinja_error(r, at, "split separator must be a string");
    if (sep->u.s.n == 0)
        return jinja_error(r, at, "empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
        const char *f = (maxs < 0 || splits < maxs) ? find_sub(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
        size_t e = f ? (size_t)(f - p) : n;
        struct value w = mkstr(r, p + i, e - i);
        if (w.kind != V_STR || jinja_list_push(&r->arena, out->u.l, w))
            return oom_err(r, at);
        if (!f)
            break;
        i = e + sep->u.s.n;
        splits++;
    }
    return 0;
}

static int do_replace(struct render *r, const struct value *s, const struct value *old, const struct value *nw,
                      const struct value *count, struct value *out, const struct node *at)
{
    struct value ss;
    if (jinja_value_stringify(r, s, &ss, at))
        return -1;
    if (!is_str(old) || !is_str(nw))
        return jinja_error(r, at, "replace expects string arguments");
    int64_t cnt = count && is_intish(count) ? as_int(count) : -1;
    struct strbuf b = {.limit = r->lim.max_output_bytes};
    const char *p = ss.u.s.p;
    size_t n = ss.u.s.n, i = 0;
    int64_t done = 0;
    if (old->u.s.n == 0) { /* Python inserts the replacement between every character */
        for (size_t k = 0; k <= n; k++) {
            if ((cnt < 0 || done < cnt)) {
                if (jinja_put(&b, nw->u.s.p, nw->u.s.n))
                    goto fail;
                done++;
            }
            if (k < n) {
                size_t e = k + 1;
                while (e < n && ((unsigned char)p[e] & 0xC0) == 0x80)
                    e++;
                if (jinja_put(&b, p + k, e - k))
                    goto fail;
                k = e - 1;
            }
        }
        return set_str(r, out, &b, at);
    }
    while (i < n) {
        const char *f = (cnt < 0 || done < cnt) ? find_sub(p + i, n - i, old->u.s.p, old->u.s.n) : NULL;
        if (!f) {
            if (jinja_put(&b, p + i, n - i))
                goto fail;
            break;
        }
        if (jinja_put(&b, p + i, (size_t)(f - (p + i))) || jinja_put(&b, nw->u.s.p, nw->u.s.n))
            goto fail;
        i = (size_t)(f - p) + old->u.s.n;
        done++;
    }
    return set_str(r, out, &b, at);
fail:
    strbuf_free(&b);
    return jinja_error(r, at, "replace: result larger than the output limit");
}

static bool has_prefix(const struct value *s, const struct value *x, bool suffix)
{
    if (x->u.s.n > s->u.s.n)
        return false;
    const char *p = suffix ? s->u.s.p + s->u.s.n - x->u.s.n : s->u.s.p;
    return memcmp(p, x->u.s.p, x->u.s.n) == 0;
}

static int do_startsends(struct render *r, const struct value *s, const struct value *x, bool suffix,
                         struct value *out, const struct node *at)
{
    if (need_str(r, s, suffix ? "endswith" : "startswith", at))
        return -1;
    if (!x)
        return jinja_error(r, at, "%s needs an argument", suffix ? "endswith" : "startswith");
    if (x->kind == V_STR) {
        *out = v_bool(has_prefix(s, x, suffix));
        return 0;
    }
    if (x->kind == V_LIST) {
        bool any = false;
        for (size_t i = 0; i < x->u.l->n; i++) {
            if (x->u.l->v[i].kind != V_STR)
                return jinja_error(r, at, "tuple for %s must contain only strings",
                                suffix ? "endswith" : "startswith");
            any = any || has_prefix(s, &x->u.l->v[i], suffix);
        }
        *out = v_bool(any);
        return 0;
    }
    return jinja_error(r, at, "%s first arg must be str or a tuple of str", suffix ? "endswith" : "startswith");
}

/* Python str.format with {}, {0} and {name}; no format specs. */
static int do_format(struct render *r, const struct value *s, struct value *args, size_t nargs, const char **kwn,
                     struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    struct strbuf b = {.limit = r->lim.max_output_bytes};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, auto_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            if (jinja_put(&b, "{", 1))
                goto full;
            i++;
            continue;
        }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            if (jinja_put(&b, "}", 1))
                goto full;
            i++;
            continue;
        }
        if (p[i] != '{') {
            if (jinja_put(&b, p + i, 1))
                goto full;
            continue;
        }
        size_t e = i + 1;
        while (e < n && p[e] != '}')
            e++;
        if (e >= n) {
            strbuf_free(&b);
            return jinja_error(r, at, "format: single '{' encountered in format string");
        }
        const char *f = p + i + 1;
        size_t fl = e - i - 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl)) {
            strbuf_free(&b);
            return jinja_error(r, at, "format: format specs and conversions are not supported");
        }
        struct value *v = NULL;
        if (fl == 0) {
            v = auto_i < nargs ? &args[auto_i] : NULL;
            auto_i++;
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t idx = (size_t)strtoul(f, NULL, 10);
            v = idx < nargs ? &args[idx] : NULL;
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == fl && memcmp(kwn[k], f, fl) == 0)
                    v = &kwv[k];
        }
        if (!v) {
            strbuf_free(&b);
            return jinja_error(r, at, "format: missing argument for '{%.*s}'", (int)(fl < 40 ? fl : 40), f);
        }
        if (jinja_value_to_str(&b, v, false, 0))
            goto full;
        i = e;
    }
    return set_str(r, out, &b, at);
full:
    strbuf_free(&b);
    return jinja_error(r, at, "format: result larger than the output limit");
}

/* ---- methods ---- */

static int m_method(FN_ARGS);

static int bind_method(struct render *r, struct value *obj, const char *name, builtin_fn fn, struct value *out,
                       const struct node *at)
{
    struct builtin *b = jinja_arena_alloc(&r->arena, sizeof(*b));
    struct value *self = jinja_arena_alloc(&r->arena, sizeof(*self));
    if (!b || !self)
        return oom_err(r, at);
    *self = *obj;
    b->name = name;
    b->fn = fn;
    b->self = self;
    out->kind = V_BUILTIN;
    out->is_tuple = false;
    out->u.fn = b;
    return 0;
}

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith",
                                          "replace", "upper", "lower", "title", "capitalize", "format",
                                          "find", "count", "join", "splitlines", "isdigit", "isspace",
                                          "isalpha", "isupper", "islower", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", NULL};
static const char *const LIST_METHODS[] = {"append", "index", "count", "extend", "pop", "insert", NULL};

static const char *find_name(const char *const *names, const char *name)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0)
            return names[i];
    return NULL;
}

int jinja_getattr(struct render *r, struct value *obj, const char *name, struct value *out, const struct node *at)
{
    *out = v_undef();
    const char *m;
    switch (obj->kind) {
    case V_STR:
        if ((m = find_name(STR_METHODS, name)))
            return bind_method(r, obj, m, m_method, out, at);
        return 0;
    case V_DICT:
        if ((m = find_name(DICT_METHODS, name)))
            return bind_method(r, obj, m, m_method, out, at);
        /* fallthrough */
    case V_NS: {
        struct value *v = jinja_dict_get_str(obj->u.d, name);
        if (v)
            *out = *v;
        return 0;
    }
    case V_LIST:
        if ((m = find_name(LIST_METHODS, name)))
            return bind_method(r, obj, m, m_method, out, at);
        return 0;
    default:
        return 0;
    }
}

static int64_t cp_index(const struct value *s, const char *bytepos)
{
    return (int64_t)jinja_utf8_len(s->u.s.p, (size_t)(bytepos - s->u.s.p));
}

static int str_method(struct render *r, const char *name, struct value *s, struct value *args, size_t nargs,
                      const char **kwn, struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    if (!strcmp(name, "strip"))
        return do_strip(r, s, ARG(0, "chars"), true, true, out, at);
    if (!strcmp(name, "lstrip"))
        return do_strip(r, s, ARG(0, "chars"), true, false, out, at);
    if (!strcmp(name, "rstrip"))
        return do_strip(r, s, ARG(0, "chars"), false, true, out, at);
    if (!strcmp(name, "split"))
        return do_split(r, s, ARG(0, "sep"), ARG(1, "maxsplit"), out, at);
    if (!strcmp(name, "startswith"))
        return do_startsends(r, s, ARG(0, "prefix"), false, out, at);
    if (!strcmp(name, "endswith"))
        return do_startsends(r, s, ARG(0, "suffix"), true, out, at);
    if (!strcmp(name, "replace"))
        return do_replace(r, s, ARG(0, "old"), ARG(1, "new"), ARG(2, "count"), out, at);
    if (!strcmp(name, "upper"))
        return map_case(r, s, C_UPPER, out, at);
    if (!strcmp(name, "lower"))
        return map_case(r, s, C_LOWER, out, at);
    if (!strcmp(name, "title"))
        return map_case(r, s, C_TITLE_PY, out, at);
    if (!strcmp(name, "capitalize"))
        return map_case(r, s, C_CAPITALIZE, out, at);
    if (!strcmp(name, "format"))
        return do_format(r, s, args, nargs, kwn, kwv, nkw, out, at);
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        struct value *x = ARG(0, "sub");
        if (!is_str(x))
            return jinja_error(r, at, "%s expects a string argument", name);
        if (!strcmp(name, "find")) {
            const char *f = find_sub(s->u.s.p, s->u.s.n, x->u.s.p, x->u.s.n);
            *out = v_int(f ? cp_index(s, f) : -1);
            return 0;
        }
        if (x->u.s.n == 0) {
            *out = v_int((int64_t)jinja_utf8_len(s->u.s.p, s->u.s.n) + 1);
            return 0;
        }
        int64_t c = 0;
        const char *p = s->u.s.p;
        size_t n = s->u.s.n;
        const char *f;
        while ((f = find_sub(p, n, x->u.s.p, x->u.s.n))) {
            c++;
            n -= (size_t)(f - p) + x->u.s.n;
            p = f + x->u.s.n;
        }
        *out = v_int(c);
        return 0;
    }
    if (!strcmp(name, "join")) {
        struct value *l = ARG(0, "iterable");
        if (!l || l->kind != V_LIST)
            return jinja_error(r, at, "join expects a list");
        struct strbuf b = {.limit = r->lim.max_output_bytes};
        for (size_t i = 0; i < l->u.l->n; i++) {
            if (l->u.l->v[i].kind != V_STR) {
                strbuf_free(&b);
                return jinja_error(r, at, "sequence item %zu: expected str instance, %s found", i,
                                jinja_value_type_name(&l->u.l->v[i]));
            }
            if ((i && jinja_put(&b, s->u.s.p, s->u.s.n)) || jinja_put(&b, l->u.l->v[i].u.s.p, l->u.l->v[i].u.s.n)) {
                strbuf_free(&b);
                return jinja_error(r, at, "join: result larger than the output limit");
            }
        }
        return set_str(r, out, &b, at);
    }
    if (!strcmp(name, "splitlines")) {
        *out = v_list(&r->arena);
        if (out->kind != V_LIST)
            return oom_err(r, at);
        size_t i = 0, n = s->u.s.n;
        const char *p = s->u.s.p;
        while (i < n) {
            size_t e = i;
            while (e < n && p[e] != '\n' && p[e] != '\r')
                e++;
            struct value w = mkstr(r, p + i, e - i);
            if (w.kind != V_STR || jinja_list_push(&r->arena, out->u.l, w))
                return oom_err(r, at);
            if (e < n && p[e] == '\r' && e + 1 < n && p[e + 1] == '\n')
                e++;
            i = e + 1;
        }
        return 0;
    }
    /* is* predicates: ASCII classes, which is what chat templates test for */
    bool all = s->u.s.n > 0, any_cased = false;
    for (size_t i = 0; i < s->u.s.n; i++) {
        unsigned char c = (unsigned char)s->u.s.p[i];
        bool ok;
        if (!strcmp(name, "isdigit"))
            ok = c >= '0' && c <= '9';
        else if (!strcmp(name, "isspace"))
            ok = py_space(c);
        else if (!strcmp(name, "isalpha"))
            ok = (c | 32) >= 'a' && (c | 32) <= 'z';
        else if (!strcmp(name, "isupper")) {
            ok = !(c >= 'a' && c <= 'z');
            any_cased = any_cased || (c >= 'A' && c <= 'Z');
        } else {
            ok = !(c >= 'A' && c <= 'Z');
            any_cased = any_cased || (c >= 'a' && c <= 'z');
        }
        all = all && ok;
    }
    if (!strcmp(name, "isupper") || !strcmp(name, "islower"))
        all = all && any_cased;
    *out = v_bool(all);
    return 0;
}

static int dict_items(struct render *r, struct value *d, struct value *out, const struct node *at)
{
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom_err(r, at);
    for (size_t i = 0; i < d->u.d->n; i++) {
        struct value t = v_list(&r->arena);
        if (t.kind != V_LIST || jinja_list_push(&r->arena, t.u.l, d->u.d->keys[i]) ||
            jinja_list_push(&r->arena, t.u.l, d->u.d->vals[i]))
            return oom_err(r, at);
        t.is_tuple = true;
        if (jinja_list_push(&r->arena, out->u.l, t))
            return oom_err(r, at);
    }
    return 0;
}

static int dict_method(struct render *r, const char *name, struct value *d, struct value *args, size_t nargs,
                       const char **kwn, struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    if (!strcmp(name, "get")) {
        struct value *k = ARG(0, "key"), *def = ARG(1, "default");
        if (!k)
            return jinja_error(r, at, "get expects at least 1 argument");
        struct value *v = jinja_dict_get(d->u.d, *k);
        *out = v ? *v : def ? *def : v_none();
        return 0;
    }
    if (!strcmp(name, "items"))
        return dict_items(r, d, out, at);
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom_err(r, at);
    bool keys = !strcmp(name, "keys");
    for (size_t i = 0; i < d->u.d->n; i++)
        if (jinja_list_push(&r->arena, out->u.l, keys ? d->u.d->keys[i] : d->u.d->vals[i]))
            return oom_err(r, at);
    return 0;
}

static int list_method(struct render *r, const char *name, struct value *l, struct value *args, size_t nargs,
                       const char **kwn, struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    struct vlist *L = l->u.l;
    *out = v_none();
    if (!strcmp(name, "append") || !strcmp(name, "extend") || !strcmp(name, "insert") || !strcmp(name, "pop")) {
        if (l->is_tuple)
            return jinja_error(r, at, "'tuple' object has no attribute '%s'", name);
    }
    if (!strcmp(name, "append")) {
        if (nargs != 1)
            return jinja_error(r, at, "append takes exactly one argument");
        if (jinja_list_push(&r->arena, L, args[0]))
            return oom_err(r, at);
        return 0;
    }
    if (!strcmp(name, "extend")) {
        if (nargs != 1 || args[0].kind != V_LIST)
            return jinja_error(r, at, "extend takes one list");
        size_t n = args[0].u.l->n;
        for (size_t i = 0; i < n; i++)
            if (jinja_list_push(&r->arena, L, args[0].u.l->v[i]))
                return oom_err(r, at);
        return 0;
    }
    if (!strcmp(name, "insert")) {
        if (nargs != 2 || !is_intish(&args[0]))
            return jinja_error(r, at, "insert takes an index and a value");
        int64_t i = as_int(&args[0]);
        if (i < 0)
            i += (int64_t)L->n;
        if (i < 0)
            i = 0;
        if ((size_t)i > L->n)
            i = (int64_t)L->n;
        if (jinja_list_push(&r->arena, L, v_none()))
            return oom_err(r, at);
        memmove(&L->v[i + 1], &L->v[i], (L->n - 1 - (size_t)i) * sizeof(struct value));
        L->v[i] = args[1];
        return 0;
    }
    if (!strcmp(name, "pop")) {
        int64_t i = nargs ? as_int(&args[0]) : -1;
        if (i < 0)
            i += (int64_t)L->n;
        if (i < 0 || (size_t)i >= L->n)
            return jinja_error(r, at, "pop index out of range");
        *out = L->v[i];
        memmove(&L->v[i], &L->v[i + 1], (L->n - 1 - (size_t)i) * sizeof(struct value));
        L->n--;
        return 0;
    }
    if (nargs < 1)
        return jinja_error(r, at, "%s takes one argument", name);
    int64_t c = 0;
    for (size_t i = 0; i < L->n; i++) {
        if (jinja_value_equal(&L->v[i], &args[0])) {
            if (!strcmp(name, "index")) {
                *out = v_int((int64_t)i);
                return 0;
            }
            c++;
        }
    }
    if (!strcmp(name, "index"))
        return jinja_error(r, at, "value is not in list");
    *out = v_int(c);
    return 0;
}

/* Method builtins: the name on struct builtin picks the operation. */
static int m_method(FN_ARGS)
{
    struct value *self = b->self;
    if (self->kind == V_STR)
        return str_method(r, b->name, self, args, nargs, kwn, kwv, nkw, out, at);
    if (self->kind == V_DICT)
        return dict_method(r, b->name, self, args, nargs, kwn, kwv, nkw, out, at);
    return list_method(r, b->name, self, args, nargs, kwn, kwv, nkw, out, at);
}

/* ---- tests ---- */

static const char *const TESTS[] = {"defined", "undefined", "none", "string", "mapping", "iterable", "sequence",
                                    "number", "integer", "float", "boolean", "true", "false", "odd", "even",
                                    "divisibleby", "in", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan",
                                    "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "sameas", "callable",
                                    "lower", "upper", NULL};

bool jinja_has_test(const char *name) { return find_name(TESTS, name) != NULL; }

int jinja_apply_test(struct render *r, const char *name, struct value *in, struct value *args, size_t nargs,
                     bool *res, const struct node *at)
{
    enum vkind k = in->kind;
    bool num = k == V_INT || k == V_FLOAT || k == V_BOOL;
    if (!strcmp(name, "defined")) { *res = k != V_UNDEF; return 0; }
    if (!strcmp(name, "undefined")) { *res = k == V_UNDEF; return 0; }
    if (!strcmp(name, "none")) { *res = k == V_NONE; return 0; }
    if (!strcmp(name, "string")) { *res = k == V_STR; return 0; }
    if (!strcmp(name, "mapping")) { *res = k == V_DICT || k == V_NS; return 0; }
    if (!strcmp(name, "iterable")) { *res = k == V_STR || k == V_LIST || k == V_DICT || k == V_UNDEF; return 0; }
    if (!strcmp(name, "sequence")) { *res = k == V_STR || k == V_LIST || k == V_DICT || k == V_UNDEF; return 0; }
    if (!strcmp(name, "number")) { *res = num; return 0; }
    if (!strcmp(name, "integer")) { *res = k == V_INT; return 0; }
    if (!strcmp(name, "float")) { *res = k == V_FLOAT; return 0; }
    if (!strcmp(name, "boolean")) { *res = k == V_BOOL; return 0; }
    if (!strcmp(name, "true")) { *res = k == V_BOOL && in->u.b; return 0; }
    if (!strcmp(name, "false")) { *res = k == V_BOOL && !in->u.b; return 0; }
    if (!strcmp(name, "callable")) { *res = k == V_MACRO || k == V_BUILTIN; return 0; }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (k != V_STR) {
            *res = false;
            return 0;
        }
        struct value o;
        if (map_case(r, in, name[0] == 'l' ? C_LOWER : C_UPPER, &o, at))
            return -1;
        *res = jinja_value_equal(&o, in);
        return 0;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (k == V_FLOAT) { /* Python: value % 2 == 1 */
            double m = fmod(in->u.f, 2.0);
            if (m < 0)
                m += 2.0;
            *res = name[0] == 'o' ? m == 1.0 : m == 0.0;
            return 0;
        }
        if (k != V_INT && k != V_BOOL)
            return jinja_error(r, at, "test '%s' needs a number, got '%s'", name, jinja_value_type_name(in));
        int64_t v = as_int(in);
        *res = name[0] == 'o' ? (v % 2 != 0) : (v % 2 == 0);
        return 0;
    }
    if (nargs < 1)
        return find_name(TESTS, name) ? jinja_error(r, at, "test '%s' needs an argument", name)
                                      : jinja_error(r, at, "no test named '%s'", name);
    struct value *a = &args[0];
    if (!strcmp(name, "divisibleby")) {
        bool fin = in->kind == V_FLOAT, fa = a->kind == V_FLOAT;
        if ((!is_intish(in) && !fin) || (!is_intish(a) && !fa))
            return jinja_error(r, at, "divisibleby needs numbers");
        if (fin || fa) {
            double x = fin ? in->u.f : (double)as_int(in), y = fa ? a->u.f : (double)as_int(a);
            if (y == 0)
                return jinja_error(r, at, "divisibleby zero");
            *res = fmod(x, y) == 0;
            return 0;
        }
        if (as_int(a) == 0)
            return jinja_error(r, at, "divisibleby zero");
        *res = as_int(a) == -1 || as_int(in) % as_int(a) == 0;
        return 0;
    }
    if (!strcmp(name, "in")) {
        switch (a->kind) {
        case V_STR:
            *res = in->kind == V_STR && find_sub(a->u.s.p, a->u.s.n, in->u.s.p, in->u.s.n) != NULL;
            return 0;
        case V_LIST:
            *res = false;
            for (size_t i = 0; i < a->u.l->n; i++)
                if (jinja_value_equal(in, &a->u.l->v[i]))
                    *res = true;
            return 0;
        case V_DICT: case V_NS: *res = jinja_dict_get(a->u.d, *in) != NULL; return 0;
        default: return jinja_error(r, at, "test 'in' needs a container");
        }
    }
    if (!strcmp(name, "sameas")) {
        *res = in->kind == a->kind && (k == V_NONE || k == V_UNDEF || jinja_value_equal(in, a)) &&
               (k != V_LIST || in->u.l == a->u.l) && (k != V_DICT || in->u.d == a->u.d);
        return 0;
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) { *res = jinja_value_equal(in, a); return 0; }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) { *res = !jinja_value_equal(in, a); return 0; }
    int c;
    bool lt = !strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<");
    bool le = !strcmp(name, "le") || !strcmp(name, "<=");
    bool gt = !strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">");
    bool ge = !strcmp(name, "ge") || !strcmp(name, ">=");
    if (!(lt || le || gt || ge))
        return jinja_error(r, at, "no test named '%s'", name);
    if (jinja_value_compare(in, a, &c))
        return jinja_error(r, at, "test '%s' cannot compare '%s' and '%s'", name, jinja_value_type_name(in), jinja_value_type_name(a));
    *res = lt ? c < 0 : le ? c <= 0 : gt ? c > 0 : c >= 0;
    return 0;
}

/* ---- filters ---- */

static int to_list(struct render *r, struct value *v, struct value *out, const struct node *at)
{
    if (v->kind == V_LIST) {
        *out = *v;
        return 0;
    }
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom_err(r, at);
    if (v->kind == V_UNDEF)
        return 0;
    if (v->kind == V_DICT || v->kind == V_NS) {
        for (size_t i = 0; i < v->u.d->n; i++)
            if (jinja_list_push(&r->arena, out->u.l, v->u.d->keys[i]))
                return oom_err(r, at);
        return 0;
    }
    if (v->kind == V_STR) {
        for (size_t i = 0; i < v->u.s.n;) {
            size_t e = i + 1;
            while (e < v->u.s.n && ((unsigned char)v->u.s.p[e] & 0xC0) == 0x80)
                e++;
            struct value c = mkstr(r, v->u.s.p + i, e - i);
            if (c.kind != V_STR || jinja_list_push(&r->arena, out->u.l, c))
                return oom_err(r, at);
            i = e;
        }
        return 0;
    }
    return jinja_error(r, at, "'%s' object is not iterable", jinja_value_type_name(v));
}

/* Dotted attribute path ("a.b", "0") as jinja's make_attrgetter. */
static int get_path(struct render *r, struct value *obj, const struct value *path, struct value *out,
                    const struct node *at)
{
    if (path->kind == V_INT) {
        struct value o = *obj;
        *out = v_undef();
        if (o.kind == V_LIST) {
            int64_t i = path->u.i;
            if (i < 0)
                i += (int64_t)o.u.l->n;
            if (i >= 0 && (size_t)i < o.u.l->n)
                *out = o.u.l->v[i];
        }
        return 0;
    }
    if (path->kind != V_STR)
        return jinja_error(r, at, "attribute must be a string");
    struct value cur = *obj;
    const char *p = path->u.s.p, *end = p + path->u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        char part[128];
        size_t pl = (size_t)(e - p) < sizeof part - 1 ? (size_t)(e - p) : sizeof part - 1;
        memcpy(part, p, pl);
        part[pl] = 0;
        struct value nx = v_undef();
        if (pl && part[0] >= '0' && part[0] <= '9' && cur.kind == V_LIST) {
            size_t i = (size_t)strtoul(part, NULL, 10);
            if (i < cur.u.l->n)
                nx = cur.u.l->v[i];
        } else if (jinja_getattr(r, &cur, part, &nx, at)) {
            return -1;
        }
        cur = nx;
        if (!dot)
            break;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

static int cmp_for_sort(const struct value *a, const struct value *b, bool case_sensitive, int *c)
{
    if (!case_sensitive && a->kind == V_STR && b->kind == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        for (size_t i = 0; i < n; i++) {
            unsigned char x = (unsigned char)a->u.s.p[i], y = (unsigned char)b->u.s.p[i];
            if (x >= 'A' && x <= 'Z') x += 32;
            if (y >= 'A' && y <= 'Z') y += 32;
            if (x != y) {
                *c = x < y ? -1 : 1;
                return 0;
            }
        }
        *c = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
        return 0;
    }
    return jinja_value_compare(a, b, c);
}

/* Stable merge sort of items by keys; fails when two keys cannot be ordered. */
static int merge_sort(struct value *items, struct value *keys, size_t n, struct value *ti, struct value *tk,
                      bool cs, bool rev)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    if (merge_sort(items, keys, h, ti, tk, cs, rev) || merge_sort(items + h, keys + h, n - h, ti, tk, cs, rev))
        return -1;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        if (cmp_for_sort(&keys[j], &keys[i], cs, &c))
            return -1;
        bool take_right = rev ? c > 0 : c < 0;
        if (take_right) {
            ti[k] = items[j];
            tk[k++] = keys[j++];
        } else {
            ti[k] = items[i];
            tk[k++] = keys[i++];
        }
    }
    while (i < h) {
        ti[k] = items[i];
        tk[k++] = keys[i++];
    }
    while (j < n) {
        ti[k] = items[j];
        tk[k++] = keys[j++];
    }
    memcpy(items, ti, n * sizeof(*items));
    memcpy(keys, tk, n * sizeof(*keys));
    return 0;
}

static int sorted(struct render *r, struct value *in, bool rev, bool cs, const struct value *attr, bool by_value,
                  bool dict_pairs, struct value *out, const struct node *at)
{
    struct value l;
    if (dict_pairs) {
        if (in->kind != V_DICT && in->kind != V_NS)
            return jinja_error(r, at, "dictsort expects a dict");
        if (dict_items(r, in, &l, at))
            return -1;
    } else if (to_list(r, in, &l, at)) {
        return -1;
    }
    size_t n = l.u.l->n;
    struct value res = v_list(&r->arena);
    struct value *keys = jinja_arena_alloc(&r->arena, (n + 1) * sizeof(*keys));
    struct value *ti = jinja_arena_alloc(&r->arena, (n + 1) * sizeof(*ti));
    struct value *tk = jinja_arena_alloc(&r->arena, (n + 1) * sizeof(*tk));
    if (res.kind != V_LIST || !keys || !ti || !tk)
        return oom_err(r, at);
    for (size_t i = 0; i < n; i++) {
        if (jinja_list_push(&r->arena, res.u.l, l.u.l->v[i]))
            return oom_err(r, at);
        if (dict_pairs)
            keys[i] = l.u.l->v[i].u.l->v[by_value ? 1 : 0];
        else if (attr && attr->kind != V_NONE && attr->kind != V_UNDEF) {
            if (get_path(r, &l.u.l->v[i], attr, &keys[i], at))
                return -1;
        } else
            keys[i] = l.u.l->v[i];
    }
    if (merge_sort(res.u.l->v, keys, n, ti, tk, cs, rev))
        return jinja_error(r, at, "sort: values cannot be compared");
    *out = res;
    return 0;
}

static int do_indent(struct render *r, struct value *in, struct value *width, bool first, bool blank,
                     struct value *out, const struct node *at)
{
    struct value s;
    if (jinja_value_stringify(r, in, &s, at))
        return -1;
    struct strbuf ind = {0};
    if (width && width->kind == V_STR) {
        if (jinja_put(&ind, width->u.s.p, width->u.s.n))
            goto fail;
    } else {
        int64_t w = width && is_intish(width) ? as_int(width) : 4;
        if (w > 1024)
            w = 1024;
        for (int64_t i = 0; i < w; i++)
            if (jinja_put(&ind, " ", 1))
                goto fail;
    }
    struct strbuf b = {.limit = r->lim.max_output_bytes};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0, line = 0;
    if (first && jinja_put(&b, ind.data ? ind.data : "", ind.len))
        goto fail2;
    /* s.split('\n'): every line after the first gets the indent, blank ones only when asked */
    while (i <= n) {
        size_t e = i;
        while (e < n && p[e] != '\n')
            e++;
        if (line > 0) {
            if (jinja_put(&b, "\n", 1))
                goto fail2;
            if ((blank || e > i) && jinja_put(&b, ind.data ? ind.data : "", ind.len))
                goto fail2;
        }
        if (jinja_put(&b, p + i, e - i))
            goto fail2;
        line++;
        i = e + 1;
    }
    strbuf_free(&ind);
    return set_str(r, out, &b, at);
fail2:
    strbuf_free(&b);
fail:
    strbuf_free(&ind);
    return jinja_error(r, at, "indent: result larger than the output limit");
}

static int do_join(struct render *r, struct value *in, struct value *sep, struct value *attr, struct value *out,
                   const struct node *at)
{
    struct value l;
    if (to_list(r, in, &l, at))
        return -1;
    struct strbuf b = {.limit = r->lim.max_output_bytes};
    for (size_t i = 0; i < l.u.l->n; i++) {
        struct value item = l.u.l->v[i];
        if (attr && get_path(r, &l.u.l->v[i], attr, &item, at)) {
            strbuf_free(&b);
            return -1;
        }
        if ((i && sep && sep->kind == V_STR && jinja_put(&b, sep->u.s.p, sep->u.s.n)) || jinja_value_to_str(&b, &item, false, 0)) {
            strbuf_free(&b);
            return jinja_error(r, at, "join: result larger than the output limit");
        }
    }
    return set_str(r, out, &b, at);
}

static int do_int(struct render *r, struct value *in, struct value *def, struct value *out)
{
    int64_t d = def && is_intish(def) ? as_int(def) : 0;
    switch (in->kind) {
    case V_INT: *out = *in; return 0;
    case V_BOOL: *out = v_int(in->u.b); return 0;
    case V_FLOAT:
        *out = isfinite(in->u.f) && fabs(in->u.f) < 9.2e18 ? v_int((int64_t)in->u.f) : v_int(d);
        return 0;
    case V_STR: {
        char buf[64];
        size_t n = in->u.s.n < sizeof buf - 1 ? in->u.s.n : sizeof buf - 1;
        memcpy(buf, in->u.s.p, n);
        buf[n] = 0;
        char *e;
        long long v = strtoll(buf, &e, 10);
        while (*e && py_space((unsigned char)*e))
            e++;
        if (e != buf && !*e && in->u.s.n < sizeof buf) {
            *out = v_int(v);
            return 0;
        }
        double f = strtod(buf, &e);
        while (*e && py_space((unsigned char)*e))
            e++;
        if (e != buf && !*e && isfinite(f) && fabs(f) < 9.2e18 && in->u.s.n < sizeof buf) {
            *out = v_int((int64_t)f);
            return 0;
        }
        *out = v_int(d);
        return 0;
    }
    default: *out = v_int(d); return 0;
    }
    (void)r;
}

static int do_float(struct value *in, struct value *def, struct value *out)
{
    double d = def ? (def->kind == V_FLOAT ? def->u.f : is_intish(def) ? (double)as_int(def) : 0.0) : 0.0;
    switch (in->kind) {
    case V_FLOAT: *out = *in; return 0;
    case V_INT: case V_BOOL: *out = v_float((double)as_int(in)); return 0;
    case V_STR: {
        char buf[64];
        size_t n = in->u.s.n < sizeof buf - 1 ? in->u.s.n : sizeof buf - 1;
        memcpy(buf, in->u.s.p, n);
        buf[n] = 0;
        char *e;
        double f = strtod(buf, &e);
        while (*e && py_space((unsigned char)*e))
            e++;
        *out = v_float(e != buf && !*e && in->u.s.n < sizeof buf ? f : d);
        return 0;
    }
    default: *out = v_float(d); return 0;
    }
}

/* map / select / reject / selectattr / rejectattr */
static int do_map_select(struct render *r, const char *name, struct value *in, struct value *args, size_t nargs,
                         const char **kwn, struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    struct value l, empty = v_list(&r->arena);
    if (empty.kind != V_LIST)
        return oom_err(r, at);
    /* jinja2 skips a falsy input ("if value: for item in value") */
    if (!jinja_value_truthy(in))
        l = empty;
    else if (to_list(r, in, &l, at))
        return -1;
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom_err(r, at);
    bool is_map = !strcmp(name, "map");
    bool by_attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    bool reject = !strcmp(name, "reject") || !strcmp(name, "rejectattr");
    struct value *attr = NULL, *def = NULL;
    size_t first = 0;
    if (is_map) {
        attr = ARG(SIZE_MAX, "attribute");
        def = ARG(SIZE_MAX, "default");
    } else if (by_attr) {
        if (nargs < 1)
            return jinja_error(r, at, "%s needs an attribute name", name);
        attr = &args[0];
        first = 1;
    }
    const char *fname = NULL;
    if (first < nargs) {
        if (args[first].kind != V_STR)
            return jinja_error(r, at, "%s: filter or test name must be a string", name);
        fname = args[first].u.s.p;
        first++;
    }
    if (is_map && !attr && !fname)
        return jinja_error(r, at, "map needs a filter name or attribute=");
    struct value *rest = nargs > first ? &args[first] : NULL;
    size_t nrest = nargs > first ? nargs - first : 0;
    for (size_t i = 0; i < l.u.l->n; i++) {
        struct value item = l.u.l->v[i], x = item;
        if (attr && get_path(r, &item, attr, &x, at))
            return -1;
        if (is_map) {
            if (attr) {
                if (x.kind == V_UNDEF && def)
                    x = *def;
            } else if (jinja_apply_filter(r, fname, &item, rest, nrest, NULL, NULL, 0, &x, at)) {
                return -1;
            }
            if (jinja_list_push(&r->arena, out->u.l, x))
                return oom_err(r, at);
            continue;
        }
        bool keep;
        if (fname) {
            if (jinja_apply_test(r, fname, &x, rest, nrest, &keep, at))
                return -1;
        } else {
            keep = jinja_value_truthy(&x);
        }
        if (keep != reject && jinja_list_push(&r->arena, out->u.l, item))
            return oom_err(r, at);
    }
    return 0;
}

static const char *const FILTERS[] = {
    "tojson", "trim", "strip", "upper", "lower", "title", "capitalize", "length", "count", "first", "last",
    "join", "replace", "default", "d", "items", "list", "map", "select", "reject", "selectattr", "rejectattr",
    "unique", "int", "float", "string", "round", "indent", "safe", "abs", "sort", "reverse", "dictsort",
    "wordcount", "escape", "e", "max", "min", "sum", "attr", "batch", NULL};

bool jinja_has_filter(const char *name) { return find_name(FILTERS, name) != NULL; }

static int esc_html(struct render *r, struct value *in, struct value *out, const struct node *at)
{
    struct value s;
    if (jinja_value_stringify(r, in, &s, at))
        return -1;
    struct strbuf b = {.limit = r->lim.max_output_bytes};
    for (size_t i = 0; i < s.u.s.n; i++) {
        const char *rep = NULL;
        switch (s.u.s.p[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        }
        if (rep ? jinja_puts(&b, rep) : jinja_put(&b, s.u.s.p + i, 1)) {
            strbuf_free(&b);
            return jinja_error(r, at, "escape: result larger than the output limit");
        }
    }
    return set_str(r, out, &b, at);
}

int jinja_apply_filter(struct render *r, const char *name, struct value *in, struct value *args, size_t nargs,
                       const char **kwn, struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    *out = v_undef();
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct value *dv = ARG(0, "default_value"), *boolean = ARG(1, "boolean");
        bool use = in->kind == V_UNDEF || (boolean && jinja_value_truthy(boolean) && !jinja_value_truthy(in));
        *out = use ? (dv ? *dv : mkstr(r, "", 0)) : *in;
        return 0;
    }
    if (!strcmp(name, "safe")) {
        *out = *in;
        return 0;
    }
    if (!strcmp(name, "tojson")) {
        /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        struct value *ea = ARG(0, "ensure_ascii"), *ind = ARG(1, "indent"), *seps = ARG(2, "separators"),
                     *sk = ARG(3, "sort_keys");
        struct json_fmt f = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
        if (ind && is_intish(ind))
            f.indent = (int)(as_int(ind) > 64 ? 64 : as_int(ind) < 0 ? 0 : as_int(ind));
        if (f.indent >= 0)
            f.item_sep = ",";
        if (seps && seps->kind == V_LIST) {
            if (seps->u.l->n != 2 || seps->u.l->v[0].kind != V_STR || seps->u.l->v[1].kind != V_STR)
                return jinja_error(r, at, "tojson separators must be two strings");
            f.item_sep = seps->u.l->v[0].u.s.p;
            f.key_sep = seps->u.l->v[1].u.s.p;
        }
        f.sort_keys = sk && jinja_value_truthy(sk);
        f.ensure_ascii = ea && jinja_value_truthy(ea);
        struct strbuf b = {.limit = r->lim.max_output_bytes};
        struct err jerr = {0};
        if (jinja_value_to_json(&b, in, &f, &jerr)) {
            strbuf_free(&b);
            return jinja_error(r, at, "%s", jerr.msg);
        }
        return set_str(r, out, &b, at);
    }
    if (!strcmp(name, "string")) {
        if (in->kind == V_UNDEF) {
            *out = mkstr(r, "", 0);
            return 0;
        }
        return jinja_value_stringify(r, in, out, at);
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e"))
        return esc_html(r, in, out, at);
    if (!strcmp(name, "trim") || !strcmp(name, "strip") || !strcmp(name, "upper") || !strcmp(name, "lower") ||
        !strcmp(name, "title") || !strcmp(name, "capitalize") || !strcmp(name, "wordcount")) {
        struct value s;
        if (in->kind == V_UNDEF)
            s = mkstr(r, "", 0);
        else if (jinja_value_stringify(r, in, &s, at))
            return -1;
        if (name[0] == 't' && name[1] == 'r')
            return do_strip(r, &s, ARG(0, "chars"), true, true, out, at);
        if (!strcmp(name, "strip"))
            return do_strip(r, &s, ARG(0, "chars"), true, true, out, at);
        if (!strcmp(name, "upper"))
            return map_case(r, &s, C_UPPER, out, at);
        if (!strcmp(name, "lower"))
            return map_case(r, &s, C_LOWER, out, at);
        if (!strcmp(name, "title"))
            return map_case(r, &s, C_TITLE_JINJA, out, at);
        if (!strcmp(name, "capitalize"))
            return map_case(r, &s, C_CAPITALIZE, out, at);
        int64_t words = 0;
        bool inw = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char c = (unsigned char)s.u.s.p[i];
            bool wc = (c | 32) >= 'a' && (c | 32) <= 'z' ? true : (c >= '0' && c <= '9') || c == '_' || c >= 0x80;
            if (wc && !inw)
                words++;
            inw = wc;
        }
        *out = v_int(words);
        return 0;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        switch (in->kind) {
        case V_STR: *out = v_int((int64_t)jinja_utf8_len(in->u.s.p, in->u.s.n)); return 0;
        case V_LIST: *out = v_int((int64_t)in->u.l->n); return 0;
        case V_DICT: case V_NS: *out = v_int((int64_t)in->u.d->n); return 0;
        case V_UNDEF: *out = v_int(0); return 0;
        default: return jinja_error(r, at, "object of type '%s' has no len()", jinja_value_type_name(in));
        }
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct value l;
        if (to_list(r, in, &l, at))
            return -1;
        if (l.u.l->n)
            *out = l.u.l->v[name[0] == 'f' ? 0 : l.u.l->n - 1];
        return 0;
    }
    if (!strcmp(name, "join"))
        return do_join(r, in, ARG(0, "d"), ARG(1, "attribute"), out, at);
    if (!strcmp(name, "replace"))
        return do_replace(r, in, ARG(0, "old"), ARG(1, "new"), ARG(2, "count"), out, at);
    if (!strcmp(name, "items")) {
        if (in->kind == V_UNDEF) {
            *out = v_list(&r->arena);
            return out->kind == V_LIST ? 0 : oom_err(r, at);
        }
        if (in->kind != V_DICT && in->kind != V_NS)
            return jinja_error(r, at, "items expects a mapping, got '%s'", jinja_value_type_name(in));
        return dict_items(r, in, out, at);
    }
    if (!strcmp(name, "list")) {
        struct value l;
        if (to_list(r, in, &l, at))
            return -1;
        *out = v_list(&r->arena);
        if (out->kind != V_LIST)
            return oom_err(r, at);
        for (size_t i = 0; i < l.u.l->n; i++)
            if (jinja_list_push(&r->arena, out->u.l, l.u.l->v[i]))
                return oom_err(r, at);
        return 0;
    }
    if (!strcmp(name, "map") || !strcmp(name, "select") || !strcmp(name, "reject") ||
        !strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return do_map_select(r, name, in, args, nargs, kwn, kwv, nkw, out, at);
    if (!strcmp(name, "unique")) {
        struct value l, *cs = ARG(0, "case_sensitive"), *attr = ARG(1, "attribute");
        if (to_list(r, in, &l, at))
            return -1;
        *out = v_list(&r->arena);
        if (out->kind != V_LIST)
            return oom_err(r, at);
        bool case_s = cs && jinja_value_truthy(cs);
        for (size_t i = 0; i < l.u.l->n; i++) {
            struct value ki = l.u.l->v[i];
            if (attr && get_path(r, &l.u.l->v[i], attr, &ki, at))
                return -1;
            bool dup = false;
            for (size_t j = 0; j < out->u.l->n && !dup; j++) {
                struct value kj = out->u.l->v[j];
                if (attr && get_path(r, &out->u.l->v[j], attr, &kj, at))
                    return -1;
                int c;
                dup = (!case_s && ki.kind == V_STR && kj.kind == V_STR) ? (cmp_for_sort(&ki, &kj, false, &c) == 0 && c == 0)
                                                                        : jinja_value_equal(&ki, &kj);
            }
            if (!dup && jinja_list_push(&r->arena, out->u.l, l.u.l->v[i]))
                return oom_err(r, at);
        }
        return 0;
    }
    if (!strcmp(name, "int"))
        return do_int(r, in, ARG(0, "default"), out);
    if (!strcmp(name, "float"))
        return do_float(in, ARG(0, "default"), out);
    if (!strcmp(name, "abs")) {
        if (in->kind == V_INT || in->kind == V_BOOL) {
            int64_t v = as_int(in);
            if (v == INT64_MIN)
                return jinja_error(r, at, "integer overflow in abs");
            *out = v_int(v < 0 ? -v : v);
        } else if (in->kind == V_FLOAT) {
            *out = v_float(fabs(in->u.f));
        } else {
            return jinja_error(r, at, "bad operand type for abs(): '%s'", jinja_value_type_name(in));
        }
        return 0;
    }
    if (!strcmp(name, "round")) {
        struct value *prec = ARG(0, "precision"), *method = ARG(1, "method");
        int64_t p = prec && is_intish(prec) ? as_int(prec) : 0;
        if (p > 300) p = 300;
        if (p < -300) p = -300;
        if (in->kind != V_INT && in->kind != V_FLOAT && in->kind != V_BOOL)
            return jinja_error(r, at, "round expects a number, got '%s'", jinja_value_type_name(in));
        double x = in->kind == V_FLOAT ? in->u.f : (double)as_int(in);
        double m = pow(10.0, (double)p);
        const char *meth = method && method->kind == V_STR ? method->u.s.p : "common";
        double y;
        if (!strcmp(meth, "ceil"))
            y = ceil(x * m) / m;
        else if (!strcmp(meth, "floor"))
            y = floor(x * m) / m;
        else if (!strcmp(meth, "common") && p >= 0 && p <= 40 && isfinite(x)) {
            /* correctly rounded from the exact binary value, half to even, as Python's round() */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)p, x);
            y = strtod(buf, NULL);
        } else if (!strcmp(meth, "common"))
            y = nearbyint(x * m) / m;
        else
            return jinja_error(r, at, "round method must be 'common', 'ceil' or 'floor'");
        if (in->kind != V_FLOAT && !strcmp(meth, "common"))
            *out = v_int((int64_t)y); /* Python: round(int, n) stays an int */
        else
            *out = v_float(y);
        return 0;
    }
    if (!strcmp(name, "indent")) {
        struct value *first = ARG(1, "first"), *blank = ARG(2, "blank");
        return do_indent(r, in, ARG(0, "width"), first && jinja_value_truthy(first), blank && jinja_value_truthy(blank), out, at);
    }
    if (!strcmp(name, "sort")) {
        struct value *rev = ARG(0, "reverse"), *cs = ARG(1, "case_sensitive"), *attr = ARG(2, "attribute");
        return sorted(r, in, rev && jinja_value_truthy(rev), cs && jinja_value_truthy(cs), attr, false, false, out, at);
    }
    if (!strcmp(name, "dictsort")) {
        struct value *cs = ARG(0, "case_sensitive"), *by = ARG(1, "by"), *rev = ARG(2, "reverse");
        bool by_value = by && by->kind == V_STR && !strcmp(by->u.s.p, "value");
        return sorted(r, in, rev && jinja_value_truthy(rev), cs && jinja_value_truthy(cs), NULL, by_value, true, out, at);
    }
    if (!strcmp(name, "reverse")) {
        if (in->kind == V_STR) {
            struct value l;
            if (to_list(r, in, &l, at))
                return -1;
            struct strbuf b = {0};
            for (size_t i = l.u.l->n; i-- > 0;)
                if (jinja_put(&b, l.u.l->v[i].u.s.p, l.u.l->v[i].u.s.n)) {
                    strbuf_free(&b);
                    return oom_err(r, at);
                }
            return set_str(r, out, &b, at);
        }
        struct value l;
        if (to_list(r, in, &l, at))
            return -1;
        *out = v_list(&r->arena);
        if (out->kind != V_LIST)
            return oom_err(r, at);
        for (size_t i = l.u.l->n; i-- > 0;)
            if (jinja_list_push(&r->arena, out->u.l, l.u.l->v[i]))
                return oom_err(r, at);
        return 0;
    }
    if (!strcmp(name, "max") || !strcmp(name, "min") || !strcmp(name, "sum")) {
        struct value l;
        if (to_list(r, in, &l, at))
            return -1;
        struct value *attr = ARG(!strcmp(name, "sum") ? 0 : 1, "attribute");
        if (!strcmp(name, "sum")) {
            struct value acc = *(ARG(1, "start") ? ARG(1, "start") : &(struct value){.kind = V_INT});
            for (size_t i = 0; i < l.u.l->n; i++) {
                struct value x = l.u.l->v[i];
                if (attr && get_path(r, &l.u.l->v[i], attr, &x, at))
                    return -1;
                if ((acc.kind != V_INT && acc.kind != V_FLOAT) || (x.kind != V_INT && x.kind != V_FLOAT && x.kind != V_BOOL))
                    return jinja_error(r, at, "sum: unsupported operand '%s'", jinja_value_type_name(&x));
                if (acc.kind == V_INT && x.kind != V_FLOAT) {
                    if (__builtin_add_overflow(acc.u.i, as_int(&x), &acc.u.i))
                        return jinja_error(r, at, "integer overflow in sum");
                } else {
                    double a = acc.kind == V_FLOAT ? acc.u.f : (double)acc.u.i;
                    acc = v_float(a + (x.kind == V_FLOAT ? x.u.f : (double)as_int(&x)));
                }
            }
            *out = acc;
            return 0;
        }
        struct value sl;
        if (sorted(r, &l, false, false, attr, false, false, &sl, at))
            return -1;
        if (sl.u.l->n)
            *out = sl.u.l->v[name[1] == 'a' ? sl.u.l->n - 1 : 0];
        return 0;
    }
    if (!strcmp(name, "attr")) {
        struct value *a = ARG(0, "name");
        if (!is_str(a))
            return jinja_error(r, at, "attr expects a name");
        return jinja_getattr(r, in, a->u.s.p, out, at);
    }
    if (!strcmp(name, "batch")) {
        struct value *cnt = ARG(0, "linecount"), *fill = ARG(1, "fill_with");
        if (!is_intish(cnt) || as_int(cnt) <= 0)
            return jinja_error(r, at, "batch expects a positive count");
        struct value l;
        if (to_list(r, in, &l, at))
            return -1;
        *out = v_list(&r->arena);
        if (out->kind != V_LIST)
            return oom_err(r, at);
        size_t c = (size_t)as_int(cnt);
        for (size_t i = 0; i < l.u.l->n; i += c) {
            struct value row = v_list(&r->arena);
            if (row.kind != V_LIST)
                return oom_err(r, at);
            for (size_t j = i; j < i + c; j++) {
                if (j < l.u.l->n ? jinja_list_push(&r->arena, row.u.l, l.u.l->v[j])
                                 : (fill && jinja_list_push(&r->arena, row.u.l, *fill)))
                    return oom_err(r, at);
                if (j >= l.u.l->n && !fill)
                    break;
            }
            if (jinja_list_push(&r->arena, out->u.l, row))
                return oom_err(r, at);
        }
        return 0;
    }
    return jinja_error(r, at, "no filter named '%s'", name);
}

/* ---- globals ---- */

static int g_range(FN_ARGS)
{
    int64_t start = 0, stop, stp = 1;
    for (size_t i = 0; i < nargs; i++)
        if (!is_intish(&args[i]))
            return jinja_error(r, at, "range() arguments must be integers");
    if (nargs == 1) {
        stop = as_int(&args[0]);
    } else if (nargs == 2 || nargs == 3) {
        start = as_int(&args[0]);
        stop = as_int(&args[1]);
        if (nargs == 3)
            stp = as_int(&args[2]);
    } else {
        return jinja_error(r, at, "range() takes 1 to 3 arguments");
    }
    if (stp == 0)
        return jinja_error(r, at, "range() step must not be zero");
    double cnt = stp > 0 ? ceil(((double)stop - (double)start) / (double)stp)
                         : ceil(((double)start - (double)stop) / (double)-stp);
    if (cnt < 0)
        cnt = 0;
    /* building the list costs a step per element, so huge ranges stop at the step limit */
    if (cnt > (double)(r->lim.max_steps - r->steps))
        return err_set(r->err, INFERD_ERANGE, "template line %d: exceeded the step limit (%ld steps) in range()",
                       at ? at->line : 0, r->lim.max_steps);
    r->steps += (long)cnt;
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom_err(r, at);
    for (int64_t i = 0; i < (int64_t)cnt; i++)
        if (jinja_list_push(&r->arena, out->u.l, v_int(start + i * stp)))
            return oom_err(r, at);
    return 0;
}

static int g_namespace_or_dict(FN_ARGS, bool ns)
{
    struct value d = v_dict(&r->arena);
    if (d.kind != V_DICT)
        return oom_err(r, at);
    if (ns)
        d.kind = V_NS;
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].kind != V_DICT && args[i].kind != V_NS)
            return jinja_error(r, at, "%s() positional arguments must be mappings", ns ? "namespace" : "dict");
        for (size_t k = 0; k < args[i].u.d->n; k++)
            if (jinja_dict_set(&r->arena, d.u.d, args[i].u.d->keys[k], args[i].u.d->vals[k]))
                return oom_err(r, at);
    }
    for (size_t k = 0; k < nkw; k++)
        if (jinja_dict_set(&r->arena, d.u.d, v_cstr(kwn[k]), kwv[k]))
            return oom_err(r, at);
    *out = d;
    return 0;
}

static int g_namespace(FN_ARGS) { return g_namespace_or_dict(r, b, args, nargs, kwn, kwv, nkw, out, at, true); }
static int g_dict(FN_ARGS) { return g_namespace_or_dict(r, b, args, nargs, kwn, kwv, nkw, out, at, false); }

static int g_raise_exception(FN_ARGS)
{
    struct value *m = ARG(0, "message");
    struct value s = mkstr(r, "", 0);
    if (m && jinja_value_stringify(r, m, &s, at))
        return -1;
    if (r->err && r->err->code)
        return -r->err->code;
    return err_set(r->err, INFERD_EINVAL, "%.*s", (int)(s.u.s.n < 480 ? s.u.s.n : 480), s.u.s.p);
}

static int g_strftime_now(FN_ARGS)
{
    struct value *f = ARG(0, "format");
    if (!is_str(f))
        return jinja_error(r, at, "strftime_now expects a format string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = f->u.s.n ? strftime(buf, sizeof buf, f->u.s.p, &tm) : 0;
    *out = mkstr(r, buf, n);
    return out->kind == V_STR ? 0 : oom_err(r, at);
}

static struct builtin G_RANGE = {"range", g_range, NULL};
static struct builtin G_NAMESPACE = {"namespace", g_namespace, NULL};
static struct builtin G_DICT = {"dict", g_dict, NULL};
static struct builtin G_RAISE = {"raise_exception", g_raise_exception, NULL};
static struct builtin G_STRFTIME = {"strftime_now", g_strftime_now, NULL};

int jinja_global_builtin(const char *name, struct value *out)
{
    struct builtin *g = !strcmp(name, "range")             ? &G_RANGE
                        : !strcmp(name, "namespace")       ? &G_NAMESPACE
                        : !strcmp(name, "dict")            ? &G_DICT
                        : !strcmp(name, "raise_exception") ? &G_RAISE
                        : !strcmp(name, "strftime_now")    ? &G_STRFTIME
                                                           : NULL;
    *out = v_undef();
    if (!g)
        return -1;
    out->kind = V_BUILTIN;
    out->u.fn = g;
    return 0;
}
