/* grammar/matcher.c — a generation's position in a grammar: the graph-structured stack, the
 * closure of a set of stack tops, byte and token steps, forced bytes and rollback. */
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "grammar/gram_internal.h"

/* A position with more stack tops than this is an ambiguity explosion, not a real grammar. */
#define MAX_POSITION 4096

/* ---- the graph-structured stack ----------------------------------------------------- */

int gss_init(struct gss *s)
{
    memset(s, 0, sizeof *s);
    s->cap = 256;
    s->nb = 256;
    s->ret = malloc((size_t)s->cap * sizeof *s->ret);
    s->parent = malloc((size_t)s->cap * sizeof *s->parent);
    s->next = malloc((size_t)s->cap * sizeof *s->next);
    s->bucket = malloc((size_t)s->nb * sizeof *s->bucket);
    if (!s->ret || !s->parent || !s->next || !s->bucket) {
        gss_free(s);
        return -INFERD_ENOMEM;
    }
    memset(s->bucket, 0xff, (size_t)s->nb * sizeof *s->bucket);
    /* frames 0 and 1 are the two bottoms; never hashed */
    s->ret[0] = s->ret[1] = -1;
    s->parent[0] = s->parent[1] = -1;
    s->n = 2;
    return 0;
}

void gss_free(struct gss *s)
{
    free(s->ret);
    free(s->parent);
    free(s->next);
    free(s->bucket);
    memset(s, 0, sizeof *s);
}

static inline uint32_t frame_hash(int32_t ret, int32_t parent)
{
    return (uint32_t)hash_mix64(((uint64_t)(uint32_t)ret << 32) | (uint32_t)parent);
}

static int gss_rehash(struct gss *s, int nb)
{
    int32_t *b = malloc((size_t)nb * sizeof *b);
    if (!b)
        return -INFERD_ENOMEM;
    memset(b, 0xff, (size_t)nb * sizeof *b);
    for (int i = 2; i < s->n; i++) {
        uint32_t h = frame_hash(s->ret[i], s->parent[i]) & (uint32_t)(nb - 1);
        s->next[i] = b[h];
        b[h] = i;
    }
    free(s->bucket);
    s->bucket = b;
    s->nb = nb;
    return 0;
}

/* The frame (ret, parent), made when new; -1 when memory runs out. */
static int32_t gss_push(struct gss *s, int32_t ret, int32_t parent)
{
    uint32_t h = frame_hash(ret, parent) & (uint32_t)(s->nb - 1);
    for (int32_t i = s->bucket[h]; i >= 0; i = s->next[i])
        if (s->ret[i] == ret && s->parent[i] == parent)
            return i;
    if (s->n == s->cap) {
        int cap = s->cap * 2;
        int32_t *r = realloc(s->ret, (size_t)cap * sizeof *r);
        if (r)
            s->ret = r;
        int32_t *p = realloc(s->parent, (size_t)cap * sizeof *p);
        if (p)
            s->parent = p;
        int32_t *nx = realloc(s->next, (size_t)cap * sizeof *nx);
        if (nx)
            s->next = nx;
        if (!r || !p || !nx)
            return -1;
        s->cap = cap;
    }
    if (s->n >= s->nb) {
        if (gss_rehash(s, s->nb * 2))
            return -1;
        h = frame_hash(ret, parent) & (uint32_t)(s->nb - 1);
    }
    int32_t i = s->n++;
    s->ret[i] = ret;
    s->parent[i] = parent;
    s->next[i] = s->bucket[h];
    s->bucket[h] = i;
    return i;
}

void gss_truncate(struct gss *s, int n)
{
    /* frames go in reverse creation order, so each is the head of its bucket */
    while (s->n > n && s->n > 2) {
        int32_t i = --s->n;
        uint32_t h = frame_hash(s->ret[i], s->parent[i]) & (uint32_t)(s->nb - 1);
        s->bucket[h] = s->next[i];
    }
}

/* ---- positions ------------------------------------------------------------------ */

void gset_free(struct gset *s)
{
    free(s->e);
    memset(s, 0, sizeof *s);
}

int gset_reserve(struct gset *s, int n)
{
    if (n <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < n)
        cap *= 2;
    struct gelem *e = realloc(s->e, (size_t)cap * sizeof *e);
    if (!e)
        return -INFERD_ENOMEM;
    s->e = e;
    s->cap = cap;
    return 0;
}

int gset_copy(struct gset *dst, const struct gset *src)
{
    if (gset_reserve(dst, src->n))
        return -INFERD_ENOMEM;
    if (src->n)
        memcpy(dst->e, src->e, (size_t)src->n * sizeof *src->e);
    dst->n = src->n;
    dst->accepting = src->accepting;
    dst->ended = src->ended;
    return 0;
}

void gwork_free(struct gwork *w)
{
    free(w->todo);
    free(w->seen);
    memset(w, 0, sizeof *w);
}

static int grow_elems(struct gelem **p, int *cap, int need)
{
    if (need <= *cap)
        return 0;
    int c = *cap ? *cap * 2 : 32;
    while (c < need)
        c *= 2;
    struct gelem *q = realloc(*p, (size_t)c * sizeof *q);
    if (!q)
        return -INFERD_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

int gram_close(const struct grammar *g, struct gss *gss, struct gwork *w, const struct gelem *seeds,
               int n, struct gset *out)
{
    out->n = 0;
    out->accepting = out->ended = false;
    int nt = 0, ns = 0;
    if (grow_elems(&w->todo, &w->cap_todo, n + 8))
        return -INFERD_ENOMEM;
    for (int i = 0; i < n; i++)
        w->todo[nt++] = seeds[i];
    while (nt > 0) {
        struct gelem e = w->todo[--nt];
        bool dup = false;
        for (int i = 0; i < ns && !dup; i++)
            dup = w->seen[i].state == e.state && w->seen[i].stack == e.stack;
        if (dup)
            continue;
        if (ns >= MAX_POSITION)
            return -INFERD_ERANGE;
        if (grow_elems(&w->seen, &w->cap_seen, ns + 1))
            return -INFERD_ENOMEM;
        w->seen[ns++] = e;
        uint8_t f = g->flags[e.state];
        if (f & GS_BYTES) {
            if (gset_reserve(out, out->n + 1))
                return -INFERD_ENOMEM;
            out->e[out->n++] = e;
        }
        if (f & GS_CALLS) {
            int a = g->call_off[e.state], z = g->call_off[e.state + 1];
            if (grow_elems(&w->todo, &w->cap_todo, nt + (z - a) + 1))
                return -INFERD_ENOMEM;
            for (int k = a; k < z; k++) {
                int32_t fr = gss_push(gss, g->calls[k].ret, e.stack);
                if (fr < 0)
                    return -INFERD_ENOMEM;
                w->todo[nt++] = (struct gelem){g->rule_start[g->calls[k].rule], fr};
            }
        }
        if (f & GS_FINAL) {
            if (e.stack == GSS_NIL)
                out->accepting = true;
            else if (e.stack == GSS_SENT)
                out->ended = true;
            else {
                if (grow_elems(&w->todo, &w->cap_todo, nt + 1))
                    return -INFERD_ENOMEM;
                w->todo[nt++] = (struct gelem){gss->ret[e.stack], gss->parent[e.stack]};
            }
        }
    }
    return 0;
}

int gram_step(const struct grammar *g, struct gss *gss, struct gwork *w, const struct gset *in,
              uint8_t byte, struct gset *out)
{
    struct gelem seeds_local[16];
    struct gelem *seeds = seeds_local;
    if (in->n > 16) {
        seeds = malloc((size_t)in->n * sizeof *seeds);
        if (!seeds)
            return -INFERD_ENOMEM;
    }
    int n = 0;
    for (int i = 0; i < in->n; i++) {
        int32_t t = gram_next(g, in->e[i].state, byte);
        if (t >= 0)
            seeds[n++] = (struct gelem){t, in->e[i].stack};
    }
    int rc = 0;
    if (n)
        rc = gram_close(g, gss, w, seeds, n, out);
    else {
        out->n = 0;
        out->accepting = out->ended = false;
    }
    if (seeds != seeds_local)
        free(seeds);
    return rc;
}

/* ---- the matcher ------------------------------------------------------------------ */

struct hist {
    int elem_off, n;      /* the position before the step, in m->saved */
    bool accepting;
    int gss_n;            /* frames before the step */
};

struct grammar_matcher {
    const struct grammar *g;
    const struct grammar_vocab *v;
    struct mask_cache *cache;     /* the grammar's (borrowed) or own (owned when own_cache) */
    bool own_cache;
    struct gss gss;               /* owned */
    struct gwork w;               /* owned */
    struct gwalk wk;              /* owned */
    struct gset cur, tmp, tmp2;   /* owned */
    struct gelem *saved;          /* owned; positions before each step */
    int n_saved, cap_saved;
    struct hist *hist;            /* owned */
    int n_hist, cap_hist;
    uint8_t *seen;                /* owned; n_states bytes: states already ORed into a mask */
};

static int start_position(struct grammar_matcher *m)
{
    gss_truncate(&m->gss, 2);
    struct gelem s = {m->g->rule_start[m->g->root], GSS_NIL};
    return gram_close(m->g, &m->gss, &m->w, &s, 1, &m->cur);
}

int grammar_matcher_create(const struct grammar *g, const struct grammar_vocab *v,
                           struct grammar_matcher **out, struct err *err)
{
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m || gss_init(&m->gss)) {
        free(m);
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory");
    }
    m->g = g;
    m->v = v;
    m->seen = calloc((size_t)g->n_states, 1);
    /* the grammar keeps the cache of the first vocabulary it meets; others get their own */
    struct grammar *gm = (struct grammar *)g;
    struct mask_cache *c = atomic_load(&gm->cache);
    if (!c) {
        pthread_mutex_lock(&gm->cache_lock);
        c = atomic_load(&gm->cache);
        if (!c) {
            c = mask_cache_create(g, v);
            atomic_store(&gm->cache, c);
        }
        pthread_mutex_unlock(&gm->cache_lock);
    }
    if (c && !mask_cache_for(c, v)) {
        c = mask_cache_create(g, v);
        m->own_cache = true;
    }
    m->cache = c;
    int rc = c && m->seen ? start_position(m) : -INFERD_ENOMEM;
    if (rc) {
        grammar_matcher_free(m);
        return err_set(err, -rc, "grammar: %s",
                       rc == -INFERD_ERANGE ? "the start position is too ambiguous" : "out of memory");
    }
    *out = m;
    return 0;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    if (!m)
        return;
    if (m->own_cache)
        mask_cache_free(m->cache);
    gss_free(&m->gss);
    gwork_free(&m->w);
    gwalk_free(&m->wk);
    gset_free(&m->cur);
    gset_free(&m->tmp);
    gset_free(&m->tmp2);
    free(m->saved);
    free(m->hist);
    free(m->seen);
    free(m);
}

void grammar_matcher_reset(struct grammar_matcher *m)
{
    m->n_hist = 0;
    m->n_saved = 0;
    start_position(m);
}

/* Reads bytes from m->cur into m->cur; on rejection everything is as before. */
static int advance(struct grammar_matcher *m, const uint8_t *p, size_t len)
{
    int gss_n = m->gss.n;
    if (grow_elems(&m->saved, &m->cap_saved, m->n_saved + m->cur.n))
        return -INFERD_ENOMEM;
    if (m->n_hist == m->cap_hist) {
        int cap = m->cap_hist ? m->cap_hist * 2 : 64;
        struct hist *h = realloc(m->hist, (size_t)cap * sizeof *h);
        if (!h)
            return -INFERD_ENOMEM;
        m->hist = h;
        m->cap_hist = cap;
    }
    int rc = gset_copy(&m->tmp, &m->cur);
    for (size_t i = 0; !rc && i < len; i++) {
        if (!m->tmp.n) {
            rc = -INFERD_EINVAL;
            break;
        }
        rc = gram_step(m->g, &m->gss, &m->w, &m->tmp, p[i], &m->tmp2);
        struct gset t = m->tmp;
        m->tmp = m->tmp2;
        m->tmp2 = t;
    }
    if (!rc && !m->tmp.n && !m->tmp.accepting)
        rc = -INFERD_EINVAL;
    if (rc) {
        gss_truncate(&m->gss, gss_n);
        return rc;
    }
    if (m->cur.n)
        memcpy(m->saved + m->n_saved, m->cur.e, (size_t)m->cur.n * sizeof *m->cur.e);
    m->hist[m->n_hist++] = (struct hist){m->n_saved, m->cur.n, m->cur.accepting, gss_n};
    m->n_saved += m->cur.n;
    struct gset t = m->cur;
    m->cur = m->tmp;
    m->tmp = t;
    return 0;
}

int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t token)
{
    if (token < 0 || token >= m->v->n_vocab || m->v->special[token])
        return -INFERD_EINVAL;
    size_t len;
    const uint8_t *p = vocab_tok(m->v, token, &len);
    if (!len)
        return -INFERD_EINVAL;
    return advance(m, p, len);
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *bytes, size_t len)
{
    return advance(m, (const uint8_t *)bytes, len);
}

bool grammar_matcher_is_accepting(const struct grammar_matcher *m)
{
    return m->cur.accepting;
}

bool grammar_matcher_is_finished(const struct grammar_matcher *m)
{
    return m->cur.accepting && m->cur.n == 0;
}

int grammar_matcher_rollback(struct grammar_matcher *m, int n_tokens)
{
    if (n_tokens < 0 || n_tokens > m->n_hist)
        return -INFERD_EINVAL;
    if (n_tokens == 0)
        return 0;
    struct hist h = m->hist[m->n_hist - n_tokens];
    if (gset_reserve(&m->cur, h.n))
        return -INFERD_ENOMEM;
    if (h.n)
        memcpy(m->cur.e, m->saved + h.elem_off, (size_t)h.n * sizeof *m->cur.e);
    m->cur.n = h.n;
    m->cur.accepting = h.accepting;
    m->cur.ended = false;
    m->n_saved = h.elem_off;
    m->n_hist -= n_tokens;
    gss_truncate(&m->gss, h.gss_n);
    return 0;
}

size_t grammar_matcher_forced_bytes(const struct grammar_matcher *mc, char *buf, size_t cap)
{
    struct grammar_matcher *m = (struct grammar_matcher *)mc;
    int gss_n = m->gss.n;
    size_t n = 0;
    if (gset_copy(&m->tmp, &m->cur))
        return 0;
    while (n < cap && m->tmp.n && !m->tmp.accepting) {
        int only = -1;
        bool many = false;
        for (int i = 0; i < m->tmp.n && !many; i++) {
            int32_t s = m->tmp.e[i].state;
            for (int b = 0; b < 256 && !many; b++)
                if (gram_next(m->g, s, (uint8_t)b) >= 0) {
                    if (only < 0)
                        only = b;
                    else if (only != b)
                        many = true;
                }
        }
        if (many || only < 0)
            break;
        if (gram_step(m->g, &m->gss, &m->w, &m->tmp, (uint8_t)only, &m->tmp2))
            break;
        struct gset t = m->tmp;
        m->tmp = m->tmp2;
        m->tmp2 = t;
        buf[n++] = (char)only;
    }
    gss_truncate(&m->gss, gss_n);
    return n;
}

int grammar_matcher_prepare(struct grammar_matcher *m)
{
    return mask_cache_fill(m->g, m->cache);
}

int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits, bool *eos_allowed)
{
    size_t words = ((size_t)m->v->n_vocab + 31) / 32;
    memset(bits, 0, words * sizeof *bits);
    *eos_allowed = m->cur.accepting;
    int gss_n = m->gss.n;
    int rc = 0;
    for (int i = 0; i < m->cur.n && !rc; i++) {
        int32_t s = m->cur.e[i].state;
        rc = mask_add_elem(m->g, m->v, m->cache, &m->gss, &m->w, &m->wk, m->cur.e[i], !m->seen[s],
                           bits);
        m->seen[s] = 1;
    }
    for (int i = 0; i < m->cur.n; i++)
        m->seen[m->cur.e[i].state] = 0;
    gss_truncate(&m->gss, gss_n);
    return rc;
}
