/* grammar/mask.c — token masks: per DFA state, computed on first use, the tokens accepted
 * whatever the stack and the uncertain ones that leave the rule with bytes to spare; the
 * uncertain ones are walked with the real stack when a mask is asked for. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_internal.h"

/* Accepted tokens are kept as a list below this share of the vocabulary, as a bitset above. */
#define LIST_SHARE 64

struct state_cache {
    uint32_t *acc_bits; /* owned; a bitset, or NULL when acc_list holds them */
    int32_t *acc_list;  /* owned */
    int n_acc;
    int32_t *unc;       /* owned; uncertain ids in trie order */
    int n_unc;
};

struct mask_cache {
    const struct grammar_vocab *v;
    int n_states;
    _Atomic(struct state_cache *) *st; /* owned; n_states, NULL until computed */
    pthread_mutex_t lock;              /* serializes builds and guards the scratch below */
    struct gss gss;                    /* owned */
    struct gwork w;                    /* owned */
    struct gwalk wk;                   /* owned */
    int32_t *acc_tmp, *unc_tmp;        /* owned; n_vocab each */
};

void gwalk_free(struct gwalk *k)
{
    for (int i = 0; i < k->n_lvl; i++)
        gset_free(&k->lvl[i]);
    free(k->lvl);
    free(k->endacc);
    memset(k, 0, sizeof *k);
}

static int gwalk_reserve(struct gwalk *k, int n)
{
    if (n <= k->n_lvl)
        return 0;
    struct gset *l = realloc(k->lvl, (size_t)n * sizeof *l);
    if (!l)
        return -INFERD_ENOMEM;
    k->lvl = l;
    bool *e = realloc(k->endacc, (size_t)n * sizeof *e);
    if (!e)
        return -INFERD_ENOMEM;
    k->endacc = e;
    memset(k->lvl + k->n_lvl, 0, (size_t)(n - k->n_lvl) * sizeof *l);
    k->n_lvl = n;
    return 0;
}

struct mask_cache *mask_cache_create(const struct grammar *g, const struct grammar_vocab *v)
{
    struct mask_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->v = v;
    c->n_states = g->n_states;
    c->st = calloc((size_t)g->n_states, sizeof *c->st);
    c->acc_tmp = malloc(((size_t)v->n_vocab + 1) * sizeof *c->acc_tmp);
    c->unc_tmp = malloc(((size_t)v->n_vocab + 1) * sizeof *c->unc_tmp);
    pthread_mutex_init(&c->lock, NULL);
    if (!c->st || !c->acc_tmp || !c->unc_tmp || gss_init(&c->gss) ||
        gwalk_reserve(&c->wk, v->max_len + 2)) {
        mask_cache_free(c);
        return NULL;
    }
    return c;
}

void mask_cache_free(struct mask_cache *c)
{
    if (!c)
        return;
    for (int i = 0; c->st && i < c->n_states; i++) {
        struct state_cache *s = atomic_load(&c->st[i]);
        if (s) {
            free(s->acc_bits);
            free(s->acc_list);
            free(s->unc);
            free(s);
        }
    }
    free(c->st);
    pthread_mutex_destroy(&c->lock);
    gss_free(&c->gss);
    gwork_free(&c->w);
    gwalk_free(&c->wk);
    free(c->acc_tmp);
    free(c->unc_tmp);
    free(c);
}

bool mask_cache_for(const struct mask_cache *c, const struct grammar_vocab *v)
{
    return c->v == v;
}

enum { T_REJECT, T_ACCEPT, T_UNCERTAIN };

/* Steps lvl[d] by byte into lvl[d+1]: the common one-pair, no-call case inline. */
static inline int walk_step(const struct grammar *g, struct gss *gss, struct gwork *w,
                            struct gwalk *k, int d, uint8_t byte)
{
    const struct gset *in = &k->lvl[d];
    struct gset *out = &k->lvl[d + 1];
    if (in->n == 1) {
        int32_t t = gram_next(g, in->e[0].state, byte);
        if (t < 0) {
            out->n = 0;
            out->accepting = out->ended = false;
            return 0;
        }
        if (g->flags[t] == GS_BYTES && out->cap) {
            out->e[0] = (struct gelem){t, in->e[0].stack};
            out->n = 1;
            out->accepting = out->ended = false;
            return 0;
        }
    }
    return gram_step(g, gss, w, in, byte, out);
}

/* Walks the tokens ids[0..n) (in trie order) from the pair e, sorting each into accepted or
 * uncertain (calling back through the arrays; rejected tokens are dropped). lcp, when given,
 * holds each token's common prefix with the one before it in ids. */
static int walk(const struct grammar *g, const struct grammar_vocab *v, struct gss *gss,
                struct gwork *w, struct gwalk *k, struct gelem e, const int32_t *ids, int n,
                const uint16_t *lcp, int32_t *acc, int *n_acc, int32_t *unc, int *n_unc)
{
    int rc = gwalk_reserve(k, v->max_len + 2);
    if (rc || (rc = gset_reserve(&k->lvl[0], 4)))
        return rc;
    struct gset *l0 = &k->lvl[0];
    l0->e[0] = e;
    l0->n = 1;
    l0->accepting = l0->ended = false;
    k->endacc[0] = false;
    int valid = 0;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (int i = 0; i < n; i++) {
        size_t L;
        const uint8_t *p = vocab_tok(v, ids[i], &L);
        int c;
        if (lcp)
            c = i == 0 ? 0 : lcp[i];
        else {
            c = 0;
            while ((size_t)c < L && (size_t)c < prev_len && p[c] == prev[c])
                c++;
        }
        prev = p;
        prev_len = L;
        if (valid > c)
            valid = c;
        while ((size_t)valid < L && (valid == 0 || k->lvl[valid].n > 0)) {
            if ((rc = gset_reserve(&k->lvl[valid + 1], 4)))
                return rc;
            rc = walk_step(g, gss, w, k, valid, p[valid]);
            if (rc)
                return rc;
            k->endacc[valid + 1] = k->endacc[valid] || k->lvl[valid + 1].ended;
            valid++;
        }
        int fate;
        if ((size_t)valid == L) {
            const struct gset *end = &k->lvl[L];
            if (end->n > 0 || end->ended || end->accepting)
                fate = T_ACCEPT;
            else
                fate = k->endacc[L - 1] ? T_UNCERTAIN : T_REJECT;
        } else {
            fate = k->endacc[valid] ? T_UNCERTAIN : T_REJECT;
        }
        if (fate == T_ACCEPT)
            acc[(*n_acc)++] = ids[i];
        else if (fate == T_UNCERTAIN && unc)
            unc[(*n_unc)++] = ids[i];
    }
    return 0;
}

/* Computes state s's cache entry (under c->lock). */
static struct state_cache *build(const struct grammar *g, struct mask_cache *c, int32_t s)
{
    const struct grammar_vocab *v = c->v;
    int n_acc = 0, n_unc = 0;
    gss_truncate(&c->gss, 2);
    struct gelem e = {s, GSS_SENT};
    for (int b = 0; b < 256; b++) {
        int a = v->first[b], z = v->first[b + 1];
        if (a == z || gram_next(g, s, (uint8_t)b) < 0)
            continue;
        if (walk(g, v, &c->gss, &c->w, &c->wk, e, v->sorted + a, z - a, v->lcp + a, c->acc_tmp,
                 &n_acc, c->unc_tmp, &n_unc))
            return NULL;
    }
    gss_truncate(&c->gss, 2);
    struct state_cache *sc = calloc(1, sizeof *sc);
    if (!sc)
        return NULL;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if ((size_t)n_acc * LIST_SHARE > (size_t)v->n_vocab) {
        sc->acc_bits = calloc(words, sizeof *sc->acc_bits);
        if (sc->acc_bits)
            for (int i = 0; i < n_acc; i++)
                sc->acc_bits[c->acc_tmp[i] >> 5] |= 1u << (c->acc_tmp[i] & 31);
    } else {
        sc->acc_list = malloc(((size_t)n_acc + 1) * sizeof *sc->acc_list);
        if (sc->acc_list)
            memcpy(sc->acc_list, c->acc_tmp, (size_t)n_acc * sizeof *sc->acc_list);
    }
    sc->n_acc = n_acc;
    sc->unc = malloc(((size_t)n_unc + 1) * sizeof *sc->unc);
    if (sc->unc)
        memcpy(sc->unc, c->unc_tmp, (size_t)n_unc * sizeof *sc->unc);
    sc->n_unc = n_unc;
    if ((!sc->acc_bits && !sc->acc_list) || !sc->unc) {
        free(sc->acc_bits);
        free(sc->acc_list);
        free(sc->unc);
        free(sc);
        return NULL;
    }
    return sc;
}

static struct state_cache *get(const struct grammar *g, struct mask_cache *c, int32_t s)
{
    struct state_cache *sc = atomic_load_explicit(&c->st[s], memory_order_acquire);
    if (sc)
        return sc;
    pthread_mutex_lock(&c->lock);
    sc = atomic_load_explicit(&c->st[s], memory_order_acquire);
    if (!sc) {
        sc = build(g, c, s);
        if (sc)
            atomic_store_explicit(&c->st[s], sc, memory_order_release);
    }
    pthread_mutex_unlock(&c->lock);
    return sc;
}

int mask_add_elem(const struct grammar *g, const struct grammar_vocab *v, struct mask_cache *c,
                  struct gss *gss, struct gwork *w, struct gwalk *wk, struct gelem e,
                  bool add_accepted, uint32_t *bits)
{
    struct state_cache *sc = get(g, c, e.state);
    if (!sc)
        return -INFERD_ENOMEM;
    if (add_accepted) {
        if (sc->acc_bits) {
            size_t words = ((size_t)v->n_vocab + 31) / 32;
            for (size_t i = 0; i < words; i++)
                bits[i] |= sc->acc_bits[i];
        } else {
            for (int i = 0; i < sc->n_acc; i++)
                bits[sc->acc_list[i] >> 5] |= 1u << (sc->acc_list[i] & 31);
        }
    }
    if (!sc->n_unc)
        return 0;
    int32_t local[256];
    int32_t *acc = sc->n_unc <= 256 ? local : malloc((size_t)sc->n_unc * sizeof *acc);
    if (!acc)
        return -INFERD_ENOMEM;
    int n_acc = 0, n_unc = 0;
    int rc = walk(g, v, gss, w, wk, e, sc->unc, sc->n_unc, NULL, acc, &n_acc, NULL, &n_unc);
    for (int i = 0; !rc && i < n_acc; i++)
        bits[acc[i] >> 5] |= 1u << (acc[i] & 31);
    if (acc != local)
        free(acc);
    return rc;
}

int mask_cache_fill(const struct grammar *g, struct mask_cache *c)
{
    for (int32_t s = 0; s < g->n_states; s++)
        if ((g->flags[s] & GS_BYTES) && !get(g, c, s))
            return -INFERD_ENOMEM;
    return 0;
}
