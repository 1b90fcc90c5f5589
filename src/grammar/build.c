/* grammar/build.c — the expression builder every front end writes into: literals, codepoint
 * classes, sequences, alternatives, repetitions and rule calls. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

/* Expression nodes per allowed DFA state: a front end that needs more than this is building
 * something the compiler would refuse anyway, and stopping early bounds memory and time. */
#define NODES_PER_STATE 16

void gb_init(struct gbuild *b, const struct grammar_options *o)
{
    memset(b, 0, sizeof *b);
    b->max_states = o && o->max_states ? o->max_states : GRAMMAR_DEFAULT_MAX_STATES;
}

void gb_free(struct gbuild *b)
{
    free(b->x);
    free(b->kids);
    free(b->bytes);
    free(b->cps);
    for (int i = 0; i < b->nrules; i++)
        free(b->rules[i].name);
    free(b->rules);
    memset(b, 0, sizeof *b);
}

int gb_fail(const struct gbuild *b, struct err *err)
{
    if (b->oom)
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory");
    return err_set(err, INFERD_ERANGE,
                   "grammar: too large (over the limit of %zu states)", b->max_states);
}

/* Grows *p (elements of size sz) to hold need; false (and oom) when memory runs out. */
static bool grow(struct gbuild *b, void **p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * sz);
    if (!q) {
        b->oom = true;
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

static bool failed(const struct gbuild *b)
{
    return b->oom || b->too_big;
}

static int node(struct gbuild *b, struct gx x)
{
    if (failed(b))
        return -1;
    if ((size_t)b->nx >= b->max_states * NODES_PER_STATE) {
        b->too_big = true;
        return -1;
    }
    size_t cap = (size_t)b->capx;
    if (!grow(b, (void **)&b->x, &cap, (size_t)b->nx + 1, sizeof *b->x))
        return -1;
    b->capx = (int)cap;
    b->x[b->nx] = x;
    return b->nx++;
}

int gb_empty(struct gbuild *b)
{
    return node(b, (struct gx){.kind = GX_EMPTY});
}

int gb_bytes(struct gbuild *b, const char *s, size_t n)
{
    if (failed(b))
        return -1;
    if (n == 0)
        return gb_empty(b);
    if (!grow(b, (void **)&b->bytes, &b->capbytes, b->nbytes + n, 1))
        return -1;
    memcpy(b->bytes + b->nbytes, s, n);
    int id = node(b, (struct gx){.kind = GX_BYTES, .n = (int)n, .off = (int)b->nbytes});
    if (id >= 0)
        b->nbytes += n;
    return id;
}

int gb_str(struct gbuild *b, const char *s)
{
    return gb_bytes(b, s, strlen(s));
}

static int ranges(struct gbuild *b, int kind, const uint32_t *r, int n)
{
    if (failed(b))
        return -1;
    size_t cap = (size_t)b->capcps;
    if (!grow(b, (void **)&b->cps, &cap, (size_t)b->ncps + 2 * (size_t)n, sizeof *b->cps))
        return -1;
    b->capcps = (int)cap;
    memcpy(b->cps + b->ncps, r, 2 * (size_t)n * sizeof *r);
    int id = node(b, (struct gx){.kind = kind, .n = n, .off = b->ncps});
    if (id >= 0)
        b->ncps += 2 * n;
    return id;
}

int gb_class(struct gbuild *b, const uint32_t *r, int n)
{
    return ranges(b, GX_CLASS, r, n);
}

int gb_bclass(struct gbuild *b, const uint32_t *r, int n)
{
    return ranges(b, GX_BCLASS, r, n);
}

int gb_char(struct gbuild *b, uint32_t lo, uint32_t hi)
{
    uint32_t r[2] = {lo, hi};
    return gb_class(b, r, 1);
}

static int list(struct gbuild *b, int kind, const int *kids, int n)
{
    if (failed(b))
        return -1;
    for (int i = 0; i < n; i++)
        if (kids[i] < 0)
            return -1;
    size_t cap = (size_t)b->capkids;
    if (!grow(b, (void **)&b->kids, &cap, (size_t)b->nkids + (size_t)n, sizeof *b->kids))
        return -1;
    b->capkids = (int)cap;
    memcpy(b->kids + b->nkids, kids, (size_t)n * sizeof *kids);
    int id = node(b, (struct gx){.kind = kind, .n = n, .off = b->nkids});
    if (id >= 0)
        b->nkids += n;
    return id;
}

int gb_seq(struct gbuild *b, const int *kids, int n)
{
    if (n == 1)
        return kids[0];
    return n == 0 ? gb_empty(b) : list(b, GX_SEQ, kids, n);
}

int gb_alt(struct gbuild *b, const int *kids, int n)
{
    if (n == 1)
        return kids[0];
    return list(b, GX_ALT, kids, n);
}

int gb_seq2(struct gbuild *b, int a, int c)
{
    int k[2] = {a, c};
    return gb_seq(b, k, 2);
}

int gb_alt2(struct gbuild *b, int a, int c)
{
    int k[2] = {a, c};
    return gb_alt(b, k, 2);
}

int gb_repeat(struct gbuild *b, int kid, int min, int max)
{
    if (kid < 0)
        return -1;
    if (max >= 0 && (min > max || max == 0))
        return max == 0 ? gb_empty(b) : -1;
    if (min == 1 && max == 1)
        return kid;
    int id = list(b, GX_REPEAT, &kid, 1);
    if (id >= 0) {
        b->x[id].min = min;
        b->x[id].max = max;
    }
    return id;
}

int gb_call(struct gbuild *b, int rule)
{
    if (rule < 0)
        return -1;
    return node(b, (struct gx){.kind = GX_RULE, .off = rule});
}

int gb_rule(struct gbuild *b, const char *name, size_t name_len)
{
    if (failed(b))
        return -1;
    if ((size_t)b->nrules >= b->max_states) {
        b->too_big = true;
        return -1;
    }
    size_t cap = (size_t)b->caprules;
    if (!grow(b, (void **)&b->rules, &cap, (size_t)b->nrules + 1, sizeof *b->rules))
        return -1;
    b->caprules = (int)cap;
    char *s = malloc(name_len + 1);
    if (!s) {
        b->oom = true;
        return -1;
    }
    memcpy(s, name, name_len);
    s[name_len] = 0;
    b->rules[b->nrules] = (struct grule){.name = s, .expr = -1};
    return b->nrules++;
}

int gb_find_rule(const struct gbuild *b, const char *name, size_t name_len)
{
    for (int i = 0; i < b->nrules; i++)
        if (strlen(b->rules[i].name) == name_len && !memcmp(b->rules[i].name, name, name_len))
            return i;
    return -1;
}

void gb_define(struct gbuild *b, int rule, int expr)
{
    if (rule >= 0 && rule < b->nrules)
        b->rules[rule].expr = expr;
}

static int cmp_range(const void *a, const void *c)
{
    const uint32_t *x = a, *y = c;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

int gb_normalize_ranges(uint32_t *r, int n)
{
    if (n <= 1)
        return n;
    qsort(r, (size_t)n, 2 * sizeof *r, cmp_range);
    int k = 0;
    for (int i = 1; i < n; i++) {
        if (r[2 * i] <= r[2 * k + 1] + 1) {
            if (r[2 * i + 1] > r[2 * k + 1])
                r[2 * k + 1] = r[2 * i + 1];
        } else {
            k++;
            r[2 * k] = r[2 * i];
            r[2 * k + 1] = r[2 * i + 1];
        }
    }
    return k + 1;
}

int gb_complement_ranges(const uint32_t *r, int n, uint32_t max, uint32_t *out)
{
    int k = 0;
    uint32_t next = 0;
    for (int i = 0; i < n && next <= max; i++) {
        if (r[2 * i] > next) {
            out[2 * k] = next;
            out[2 * k + 1] = r[2 * i] - 1 < max ? r[2 * i] - 1 : max;
            k++;
        }
        next = r[2 * i + 1] + 1;
    }
    if (next <= max) {
        out[2 * k] = next;
        out[2 * k + 1] = max;
        k++;
    }
    return k;
}
