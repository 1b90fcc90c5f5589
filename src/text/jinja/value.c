/* text/jinja/value.c — the template value model with Python semantics: arena, lists, ordered dicts,
 * truthiness, equality, ordering, str()/repr() printing, JSON in (json-c) and out (json.dumps). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "text/jinja/internal.h"

/* ---- arena ---- */

struct arena_chunk {
    struct arena_chunk *next;
    size_t size, used;
    max_align_t data[];
};

void *jinja_arena_alloc(struct arena *a, size_t n)
{
    if (a->over)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (a->cap && a->used_total + n > a->cap) {
        a->over = true;
        return NULL;
    }
    struct arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 65536 ? n : 65536;
        c = malloc(sizeof(*c) + sz);
        if (!c) {
            a->over = true;
            return NULL;
        }
        c->size = sz;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used_total += n;
    memset(p, 0, n);
    return p;
}

char *jinja_arena_strndup(struct arena *a, const char *s, size_t n)
{
    char *p = jinja_arena_alloc(a, n + 1);
    if (!p)
        return NULL;
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jinja_arena_free(struct arena *a)
{
    struct arena_chunk *c = a->head;
    while (c) {
        struct arena_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->used_total = 0;
}

int jinja_list_push(struct arena *a, struct vlist *l, struct value v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        struct value *nv = jinja_arena_alloc(a, nc * sizeof(*nv));
        if (!nv)
            return -1;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

struct value *jinja_dict_get(const struct vdict *d, struct value k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jinja_value_equal(&d->keys[i], &k))
            return &d->vals[i];
    return NULL;
}

struct value *jinja_dict_get_str(const struct vdict *d, const char *k)
{
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].kind == V_STR && d->keys[i].u.s.n == n && memcmp(d->keys[i].u.s.p, k, n) == 0)
            return &d->vals[i];
    return NULL;
}

int jinja_dict_set(struct arena *a, struct vdict *d, struct value k, struct value v)
{
    struct value *old = jinja_dict_get(d, k);
    if (old) {
        *old = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        struct value *nk = jinja_arena_alloc(a, nc * sizeof(*nk));
        struct value *nv = jinja_arena_alloc(a, nc * sizeof(*nv));
        if (!nk || !nv)
            return -1;
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof(*nk));
            memcpy(nv, d->vals, d->n * sizeof(*nv));
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = nc;
    }
    d->keys[d->n] = k;
    d->vals[d->n] = v;
    d->n++;
    return 0;
}

/* ---- semantics ---- */

bool jinja_value_truthy(const struct value *v)
{
    switch (v->kind) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0.0;
    case V_STR: return v->u.s.n != 0;
    case V_LIST: return v->u.l->n != 0;
    case V_DICT: return v->u.d->n != 0;
    default: return true;
    }
}

static bool is_num(const struct value *v) { return v->kind == V_INT || v->kind == V_FLOAT || v->kind == V_BOOL; }
static double num_f(const struct value *v)
{
    return v->kind == V_FLOAT ? v->u.f : v->kind == V_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const struct value *v) { return v->kind == V_INT ? v->u.i : (int64_t)v->u.b; }

/* Nested containers deeper than this compare unequal/unordered: a list may contain itself. */
#define MAX_COMPARE_DEPTH 100

static bool equal_at(const struct value *a, const struct value *b, int depth);

bool jinja_value_equal(const struct value *a, const struct value *b) { return equal_at(a, b, 0); }

static bool equal_at(const struct value *a, const struct value *b, int depth)
{
    if (depth > MAX_COMPARE_DEPTH)
        return false;
    if (is_num(a) && is_num(b)) {
        if (a->kind == V_FLOAT || b->kind == V_FLOAT)
            return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->kind != b->kind) {
        if ((a->kind == V_DICT || a->kind == V_NS) && (b->kind == V_DICT || b->kind == V_NS))
            goto dicts;
        return false;
    }
    switch (a->kind) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case V_LIST:
        if (a->u.l == b->u.l)
            return true;
        if (a->u.l->n != b->u.l->n)
            return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!equal_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                return false;
        return true;
    case V_DICT: case V_NS:
    dicts:
        if (a->u.d == b->u.d)
            return true;
        if (a->u.d->n != b->u.d->n)
            return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            struct value *o = jinja_dict_get(b->u.d, a->u.d->keys[i]);
            if (!o || !equal_at(&a->u.d->vals[i], o, depth + 1))
                return false;
        }
        return true;
    case V_MACRO: return a->u.m == b->u.m;
    case V_BUILTIN: return a->u.fn == b->u.fn;
    default: return false;
    }
}

static int compare_at(const struct value *a, const struct value *b, int *cmp, int depth);

int jinja_value_compare(const struct value *a, const struct value *b, int *cmp) { return compare_at(a, b, cmp, 0); }

static int compare_at(const struct value *a, const struct value *b, int *cmp, int depth)
{
    if (depth > MAX_COMPARE_DEPTH)
        return -1;
    if (is_num(a) && is_num(b)) {
        if (a->kind == V_FLOAT || b->kind == V_FLOAT) {
            double x = num_f(a), y = num_f(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = num_i(a), y = num_i(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        }
        return 0;
    }
    if (a->kind == V_STR && b->kind == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c == 0)
            c = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
        *cmp = c < 0 ? -1 : c > 0;
        return 0;
    }
    if (a->kind == V_LIST && b->kind == V_LIST) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (equal_at(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                continue;
            return compare_at(&a->u.l->v[i], &b->u.l->v[i], cmp, depth + 1);
        }
        *cmp = a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
        return 0;
    }
    return -1;
}

const char *jinja_value_type_name(const struct value *v)
{
    switch (v->kind) {
    case V_UNDEF: return "undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return v->is_tuple ? "tuple" : "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_BUILTIN: return "function";
    }
    return "object";
}

size_t jinja_utf8_len(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            c++;
    return c;
}

size_t jinja_utf8_offset(const char *s, size_t n, size_t cp)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == cp)
                return i;
            c++;
        }
    }
    return n;
}

/* ---- printing ---- */

/* Python's float repr: shortest round-trip digits, scientific below 1e-4 or from 1e16. */
static void fmt_float_repr(double d, char *buf, size_t size)
{
    if (isnan(d)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, size, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        snprintf(buf, size, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    char e[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d)
            break;
    }
    /* e = "-d.ddde+XX" */
    char digits[32];
    int nd = 0;
    const char *q = e;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    while (*q && *q != 'e') {
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
        q++;
    }
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char out[64];
    size_t k = 0;
    if (neg)
        out[k++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++)
                out[k++] = digits[i];
        }
        k += (size_t)snprintf(out + k, sizeof out - k, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        out[k++] = '0';
        out[k++] = '.';
        for (int i = 0; i < -exp10 - 1; i++)
            out[k++] = '0';
        for (int i = 0; i < nd; i++)
            out[k++] = digits[i];
    } else {
        for (int i = 0; i <= exp10; i++)
            out[k++] = i < nd ? digits[i] : '0';
        out[k++] = '.';
        if (nd > exp10 + 1)
            for (int i = exp10 + 1; i < nd; i++)
                out[k++] = digits[i];
        else
            out[k++] = '0';
    }
    out[k] = 0;
    snprintf(buf, size, "%s", out);
}

static int put_py_str_repr(struct strbuf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (jinja_put(b, &q, 1))
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == (unsigned char)q || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            if (jinja_put(b, tmp, 2))
                return -1;
        } else if (c == '\n') {
            if (jinja_puts(b, "\\n"))
                return -1;
        } else if (c == '\t') {
            if (jinja_puts(b, "\\t"))
                return -1;
        } else if (c == '\r') {
            if (jinja_puts(b, "\\r"))
                return -1;
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            if (jinja_puts(b, tmp))
                return -1;
        } else if (jinja_put(b, (const char *)&s[i], 1)) {
            return -1;
        }
    }
    return jinja_put(b, &q, 1);
}

#define MAX_PRINT_DEPTH 128

int jinja_value_to_str(struct strbuf *b, const struct value *v, bool as_repr, int depth)
{
    if (depth > MAX_PRINT_DEPTH)
        return -1;
    char tmp[64];
    switch (v->kind) {
    case V_UNDEF: return 0;
    case V_NONE: return jinja_puts(b, "None");
    case V_BOOL: return jinja_puts(b, v->u.b ? "True" : "False");
    case V_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
        return jinja_puts(b, tmp);
    case V_FLOAT:
        fmt_float_repr(v->u.f, tmp, sizeof tmp);
        return jinja_puts(b, tmp);
    case V_STR:
        return as_repr ? put_py_str_repr(b, v->u.s.p, v->u.s.n) : jinja_put(b, v->u.s.p, v->u.s.n);
    case V_LIST:
        if (jinja_puts(b, v->is_tuple ? "(" : "["))
            return -1;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && jinja_puts(b, ", "))
                return -1;
            if (jinja_value_to_str(b, &v->u.l->v[i], true, depth + 1))
                return -1;
        }
        if (v->is_tuple && v->u.l->n == 1 && jinja_puts(b, ","))
            return -1;
        return jinja_puts(b, v->is_tuple ? ")" : "]");
    case V_DICT: case V_NS:
        if (jinja_puts(b, v->kind == V_NS ? "<Namespace {" : "{"))
            return -1;
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i && jinja_puts(b, ", "))
                return -1;
            if (jinja_value_to_str(b, &v->u.d->keys[i], true, depth + 1) || jinja_puts(b, ": ") ||
                jinja_value_to_str(b, &v->u.d->vals[i], true, depth + 1))
                return -1;
        }
        return jinja_puts(b, v->kind == V_NS ? "}>" : "}");
    case V_MACRO: return jinja_puts(b, "<Macro>");
    case V_BUILTIN: return jinja_puts(b, "<built-in function>");
    }
    return 0;
}

static int put_json_str(struct strbuf *b, const char *s, size_t n, bool ensure_ascii)
{
    if (jinja_put(b, "\"", 1))
        return -1;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (!esc && c >= 0x80 && ensure_ascii) {
            /* \uXXXX, with a surrogate pair above the BMP, as json.dumps(ensure_ascii=True) */
            size_t k = 1;
            uint32_t cp = c;
            if (c >= 0xF0 && i + 3 < n) {
                cp = c & 0x07;
                k = 4;
            } else if (c >= 0xE0 && i + 2 < n) {
                cp = c & 0x0F;
                k = 3;
            } else if (c >= 0xC0 && i + 1 < n) {
                cp = c & 0x1F;
                k = 2;
            }
            for (size_t j = 1; j < k; j++)
                cp = (cp << 6) | ((unsigned char)s[i + j] & 0x3F);
            char u[16];
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(u, sizeof u, "\\u%04x", cp);
            }
            if (jinja_put(b, s + run, i - run) || jinja_puts(b, u))
                return -1;
            i += k - 1;
            run = i + 1;
            continue;
        }
        if (esc) {
            if (jinja_put(b, s + run, i - run) || jinja_puts(b, esc))
                return -1;
            run = i + 1;
        }
    }
    if (jinja_put(b, s + run, n - run))
        return -1;
    return jinja_put(b, "\"", 1);
}

static int json_nl(struct strbuf *b, int indent, int level)
{
    if (jinja_put(b, "\n", 1))
        return -1;
    for (int i = 0; i < indent * level; i++)
        if (jinja_put(b, " ", 1))
            return -1;
    return 0;
}

static int to_json_dict(struct strbuf *b, const struct value *v, const struct json_fmt *f, int depth,
                        struct err *err, const size_t *order);

static int to_json(struct strbuf *b, const struct value *v, const struct json_fmt *f, int depth, struct err *err)
{
    int indent = f->indent;
    if (depth > MAX_PRINT_DEPTH)
        return err_set(err, INFERD_ERANGE, "tojson: value nested too deeply");
    char tmp[64];
    int rc = 0;
    switch (v->kind) {
    case V_UNDEF:
        return err_set(err, INFERD_EINVAL, "tojson: cannot serialize an undefined value");
    case V_NONE: rc = jinja_puts(b, "null"); break;
    case V_BOOL: rc = jinja_puts(b, v->u.b ? "true" : "false"); break;
    case V_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
        rc = jinja_puts(b, tmp);
        break;
    case V_FLOAT:
        if (isnan(v->u.f))
            rc = jinja_puts(b, "NaN");
        else if (isinf(v->u.f))
            rc = jinja_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float_repr(v->u.f, tmp, sizeof tmp);
            rc = jinja_puts(b, tmp);
        }
        break;
    case V_STR: rc = put_json_str(b, v->u.s.p, v->u.s.n, f->ensure_ascii); break;
    case V_LIST:
        if (v->u.l->n == 0) {
            rc = jinja_puts(b, "[]");
            break;
        }
        if (jinja_puts(b, "["))
            goto full;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && jinja_puts(b, f->item_sep))
                goto full;
            if (indent >= 0 && json_nl(b, indent, depth + 1))
                goto full;
            int r = to_json(b, &v->u.l->v[i], f, depth + 1, err);
            if (r)
                return r;
        }
        if (indent >= 0 && json_nl(b, indent, depth))
            goto full;
        rc = jinja_puts(b, "]");
        break;
    case V_DICT: case V_NS:
        if (v->u.d->n == 0) {
            rc = jinja_puts(b, "{}");
            break;
        }
        size_t *order = malloc(v->u.d->n * sizeof(size_t));
        if (!order)
            goto full;
        for (size_t i = 0; i < v->u.d->n; i++)
            order[i] = i;
        if (f->sort_keys) { /* insertion sort keeps it simple; dicts in templates are small */
            for (size_t i = 1; i < v->u.d->n; i++) {
                size_t x = order[i], j = i;
                int c = 0;
                while (j > 0) {
                    if (jinja_value_compare(&v->u.d->keys[order[j - 1]], &v->u.d->keys[x], &c)) {
                        free(order);
                        return err_set(err, INFERD_EINVAL, "tojson: sort_keys needs comparable keys");
                    }
                    if (c <= 0)
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        int drc = to_json_dict(b, v, f, depth, err, order);
        free(order);
        if (drc)
            return drc;
        rc = 0;
        break;
    default:
        return err_set(err, INFERD_EINVAL, "tojson: cannot serialize a %s", jinja_value_type_name(v));
    }
    if (rc == 0)
        return 0;
full:
    return err_set(err, INFERD_ERANGE, "tojson: output too large");
}

static int to_json_dict(struct strbuf *b, const struct value *v, const struct json_fmt *f, int depth,
                        struct err *err, const size_t *order)
{
    int indent = f->indent;
    if (jinja_puts(b, "{"))
        goto full;
    for (size_t oi = 0; oi < v->u.d->n; oi++) {
        size_t i = order[oi];
        if (oi && jinja_puts(b, f->item_sep))
            goto full;
        if (indent >= 0 && json_nl(b, indent, depth + 1))
            goto full;
        const struct value *k = &v->u.d->keys[i];
        if (k->kind == V_STR) {
            if (put_json_str(b, k->u.s.p, k->u.s.n, f->ensure_ascii))
                goto full;
        } else {
            /* json.dumps turns int/float/bool/None keys into strings */
            struct strbuf kb = {0};
            int r = k->kind == V_BOOL ? jinja_puts(&kb, k->u.b ? "true" : "false")
                    : k->kind == V_NONE ? jinja_puts(&kb, "null")
                                        : jinja_value_to_str(&kb, k, false, depth + 1);
            if (r || (k->kind != V_INT && k->kind != V_FLOAT && k->kind != V_BOOL && k->kind != V_NONE)) {
                strbuf_free(&kb);
                return err_set(err, INFERD_EINVAL, "tojson: keys must be str, int, float, bool or None");
            }
            r = put_json_str(b, kb.data ? kb.data : "", kb.len, f->ensure_ascii);
            strbuf_free(&kb);
            if (r)
                goto full;
        }
        if (jinja_puts(b, f->key_sep))
            goto full;
        int r = to_json(b, &v->u.d->vals[i], f, depth + 1, err);
        if (r)
            return r;
    }
    if (indent >= 0 && json_nl(b, indent, depth))
        goto full;
    if (jinja_puts(b, "}") == 0)
        return 0;
full:
    return err_set(err, INFERD_ERANGE, "tojson: output too large");
}

int jinja_value_to_json(struct strbuf *b, const struct value *v, const struct json_fmt *f, struct err *err)
{
    return to_json(b, v, f, 0, err);
}

struct value jinja_value_from_json(struct arena *a, struct json_object *j)
{
    switch (json_object_get_type(j)) {
    case json_type_null: return v_none();
    case json_type_boolean: return v_bool(json_object_get_boolean(j));
    case json_type_int: return v_int(json_object_get_int64(j));
    case json_type_double: return v_float(json_object_get_double(j));
    case json_type_string: return v_str(a, json_object_get_string(j), (size_t)json_object_get_string_len(j));
    case json_type_array: {
        struct value l = v_list(a);
        if (l.kind != V_LIST)
            return l;
        size_t n = json_object_array_length(j);
        for (size_t i = 0; i < n; i++)
            if (jinja_list_push(a, l.u.l, jinja_value_from_json(a, json_object_array_get_idx(j, i))))
                return v_undef();
        return l;
    }
    case json_type_object: {
        struct value d = v_dict(a);
        if (d.kind != V_DICT)
            return d;
        struct json_object_iterator it = json_object_iter_begin(j), end = json_object_iter_end(j);
        while (!json_object_iter_equal(&it, &end)) {
            const char *k = json_object_iter_peek_name(&it);
            struct value key = v_str(a, k, strlen(k));
            struct value val = jinja_value_from_json(a, json_object_iter_peek_value(&it));
            if (key.kind != V_STR || jinja_dict_set(a, d.u.d, key, val))
                return v_undef();
            json_object_iter_next(&it);
        }
        return d;
    }
    }
    return v_none();
}
