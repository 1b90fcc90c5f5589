/* grammar/compile.c — expressions to the automaton: per rule a Thompson NFA over bytes and calls,
 * determinized by subset construction; then dead states pruned, left recursion refused, and
 * each rule's DFA packed into byte-class transition rows. */
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "grammar/gram_internal.h"

/* NFA nodes per allowed DFA state, over all rules (bounds the unrolling of repetitions). */
#define NFA_PER_STATE 32
/* NFA states the subset construction may visit (closures and the subsets it walks), per NFA
 * state the limit allows: an expression whose automaton fits the state limit can still have
 * subsets of tens of thousands of NFA states each ("(a|){200}{200}"), minutes of work. */
#define VISITS_PER_NFA_STATE 16

enum { E_EPS, E_BYTE, E_CALL };

struct nedge {
    int32_t from, to;
    int32_t lo, hi; /* byte range; for a call, lo is the rule */
    uint8_t kind;
};

struct nfa {
    int nn, cap_n;
    struct nedge *e; /* owned */
    int ne, cap_e;
    int *adj_off, *adj; /* owned; CSR by from */
    size_t limit;
    bool oom, too_big;
};

/* One DFA state while building. */
struct dst {
    int32_t rule;
    bool final;
    int r_off, r_n; /* byte ranges in c->rng */
    int c_off, c_n; /* calls in c->cl */
};

struct rng {
    uint8_t lo, hi;
    int32_t to;
};

struct comp {
    const struct gbuild *b;
    struct nfa nfa;
    struct dst *st; /* owned */
    int ns, cap_s;
    struct rng *rng; /* owned */
    int nr, cap_r;
    struct gcall *cl; /* owned */
    int nc, cap_c;
    size_t max_states, nfa_total;
    size_t visits, max_visits; /* the subset construction's work, and its limit */
    bool oom, too_big, too_complex;
};

static bool grow(void **p, int *cap, int need, size_t sz)
{
    if (need <= *cap)
        return true;
    int c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- Thompson construction ---------------------------------------------------- */

static int nfa_node(struct nfa *a)
{
    if ((size_t)a->nn >= a->limit) {
        a->too_big = true;
        return -1;
    }
    return a->nn++;
}

static void nfa_edge(struct nfa *a, int from, int to, int kind, int lo, int hi)
{
    if (from < 0 || to < 0)
        return;
    if (!grow((void **)&a->e, &a->cap_e, a->ne + 1, sizeof *a->e)) {
        a->oom = true;
        return;
    }
    a->e[a->ne++] = (struct nedge){from, to, lo, hi, (uint8_t)kind};
}

/* Encodes cp as UTF-8 into out; returns the length. */
static int utf8_put(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* A codepoint range [s, e] as chains of byte ranges from → to: split where the encoding
 * length changes, then until every byte position ranges independently (as regex engines'
 * UTF-8 sequence splitting does). */
static void nfa_cprange(struct nfa *a, int from, int to, uint32_t s, uint32_t e)
{
    uint32_t stack[64][2];
    int sp = 0;
    stack[sp][0] = s;
    stack[sp++][1] = e;
    while (sp > 0 && !a->oom && !a->too_big) {
        sp--;
        s = stack[sp][0];
        e = stack[sp][1];
        if (s > e)
            continue;
        /* surrogates are not characters */
        if (s <= 0xDFFF && e >= 0xD800) {
            if (e > 0xDFFF && sp < 63) {
                stack[sp][0] = 0xE000;
                stack[sp++][1] = e;
            }
            if (s < 0xD800 && sp < 63) {
                stack[sp][0] = s;
                stack[sp++][1] = 0xD7FF;
            }
            continue;
        }
        static const uint32_t lens[3] = {0x7F, 0x7FF, 0xFFFF};
        bool split = false;
        for (int i = 0; i < 3 && !split; i++)
            if (s <= lens[i] && lens[i] < e && sp < 62) {
                stack[sp][0] = lens[i] + 1;
                stack[sp++][1] = e;
                stack[sp][0] = s;
                stack[sp++][1] = lens[i];
                split = true;
            }
        if (split)
            continue;
        if (e > 0x7F) {
            for (int i = 1; i < 4 && !split; i++) {
                uint32_t m = (1u << (6 * i)) - 1;
                if ((s & ~m) != (e & ~m)) {
                    if ((s & m) != 0 && sp < 62) {
                        stack[sp][0] = (s | m) + 1;
                        stack[sp++][1] = e;
                        stack[sp][0] = s;
                        stack[sp++][1] = s | m;
                        split = true;
                    } else if ((e & m) != m && sp < 62) {
                        stack[sp][0] = e & ~m;
                        stack[sp++][1] = e;
                        stack[sp][0] = s;
                        stack[sp++][1] = (e & ~m) - 1;
                        split = true;
                    }
                }
            }
            if (split)
                continue;
        }
        uint8_t bs[4], be[4];
        int n = utf8_put(s, bs);
        utf8_put(e, be);
        int cur = from;
        for (int i = 0; i < n; i++) {
            int nxt = i == n - 1 ? to : nfa_node(a);
            nfa_edge(a, cur, nxt, E_BYTE, bs[i], be[i]);
            cur = nxt;
        }
    }
}

/* Connects from → to through expression x. */
static void nfa_expr(struct nfa *a, const struct gbuild *b, int x, int from, int to, int depth)
{
    if (a->oom || a->too_big || x < 0)
        return;
    if (depth > 2000) {
        a->too_big = true;
        return;
    }
    const struct gx *g = &b->x[x];
    switch (g->kind) {
    case GX_EMPTY:
        nfa_edge(a, from, to, E_EPS, 0, 0);
        return;
    case GX_BYTES: {
        int cur = from;
        for (int i = 0; i < g->n; i++) {
            int nxt = i == g->n - 1 ? to : nfa_node(a);
            uint8_t c = (uint8_t)b->bytes[g->off + i];
            nfa_edge(a, cur, nxt, E_BYTE, c, c);
            cur = nxt;
        }
        return;
    }
    case GX_CLASS:
        for (int i = 0; i < g->n; i++)
            nfa_cprange(a, from, to, b->cps[g->off + 2 * i], b->cps[g->off + 2 * i + 1]);
        return;
    case GX_BCLASS:
        for (int i = 0; i < g->n; i++)
            nfa_edge(a, from, to, E_BYTE, (int)b->cps[g->off + 2 * i],
                     (int)(b->cps[g->off + 2 * i + 1] > 255 ? 255 : b->cps[g->off + 2 * i + 1]));
        return;
    case GX_SEQ: {
        int cur = from;
        for (int i = 0; i < g->n; i++) {
            int nxt = i == g->n - 1 ? to : nfa_node(a);
            nfa_expr(a, b, b->kids[g->off + i], cur, nxt, depth + 1);
            cur = nxt;
        }
        return;
    }
    case GX_ALT:
        /* each branch gets its own entry node, so a loop inside one never joins another */
        for (int i = 0; i < g->n; i++) {
            int s = nfa_node(a);
            nfa_edge(a, from, s, E_EPS, 0, 0);
            nfa_expr(a, b, b->kids[g->off + i], s, to, depth + 1);
        }
        return;
    case GX_REPEAT: {
        int kid = b->kids[g->off];
        int cur = from;
        for (int i = 0; i < g->min; i++) {
            int nxt = nfa_node(a);
            nfa_expr(a, b, kid, cur, nxt, depth + 1);
            cur = nxt;
            if (a->oom || a->too_big)
                return;
        }
        if (g->max < 0) {
            int loop = nfa_node(a);
            nfa_edge(a, cur, loop, E_EPS, 0, 0);
            nfa_expr(a, b, kid, loop, loop, depth + 1);
            nfa_edge(a, loop, to, E_EPS, 0, 0);
            return;
        }
        nfa_edge(a, cur, to, E_EPS, 0, 0);
        for (int i = g->min; i < g->max; i++) {
            int nxt = i == g->max - 1 ? to : nfa_node(a);
            nfa_expr(a, b, kid, cur, nxt, depth + 1);
            if (nxt != to)
                nfa_edge(a, nxt, to, E_EPS, 0, 0);
            cur = nxt;
            if (a->oom || a->too_big)
                return;
        }
        return;
    }
    case GX_RULE:
        nfa_edge(a, from, to, E_CALL, g->off, 0);
        return;
    }
}

/* ---- subset construction ------------------------------------------------------ */

struct subsets {
    int *pool; /* owned; member lists back to back */
    int npool, cap_pool;
    int *off, *len; /* owned; per local DFA state */
    int n, cap;
    int *table; /* owned; hash → local id + 1 */
    int nt;
};

static uint64_t set_hash(const int *s, int n)
{
    uint64_t h = HASH_FNV_OFFSET;
    for (int i = 0; i < n; i++)
        h = hash_fnv1a_word(h, (uint64_t)s[i]);
    return hash_mix64(h);
}

/* The local id of subset s (sorted), added when new; -1 on failure. */
static int subset_id(struct comp *c, struct subsets *S, const int *s, int n, bool *fresh)
{
    *fresh = false;
    if (S->n * 2 >= S->nt) {
        int nt = S->nt ? S->nt * 2 : 256;
        int *t = calloc((size_t)nt, sizeof *t);
        if (!t)
            return c->oom = true, -1;
        for (int i = 0; i < S->n; i++) {
            uint64_t h = set_hash(S->pool + S->off[i], S->len[i]);
            size_t k = h & (size_t)(nt - 1);
            while (t[k])
                k = (k + 1) & (size_t)(nt - 1);
            t[k] = i + 1;
        }
        free(S->table);
        S->table = t;
        S->nt = nt;
    }
    uint64_t h = set_hash(s, n);
    size_t k = h & (size_t)(S->nt - 1);
    while (S->table[k]) {
        int i = S->table[k] - 1;
        if (S->len[i] == n && !memcmp(S->pool + S->off[i], s, (size_t)n * sizeof *s))
            return i;
        k = (k + 1) & (size_t)(S->nt - 1);
    }
    if ((size_t)c->ns + (size_t)S->n >= c->max_states) {
        c->too_big = true;
        return -1;
    }
    if (!grow((void **)&S->pool, &S->cap_pool, S->npool + n, sizeof *S->pool) ||
        !grow((void **)&S->off, &S->cap, S->n + 1, sizeof *S->off)) {
        c->oom = true;
        return -1;
    }
    int cap = S->cap;
    int *len = realloc(S->len, (size_t)cap * sizeof *len);
    if (!len) {
        c->oom = true;
        return -1;
    }
    S->len = len;
    if (n)
        memcpy(S->pool + S->npool, s, (size_t)n * sizeof *s);
    S->off[S->n] = S->npool;
    S->len[S->n] = n;
    S->npool += n;
    S->table[k] = S->n + 1;
    *fresh = true;
    return S->n++;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Sorted ε-closure of seeds (n of them) into out (room for nn); returns its size. */
static int eps_closure(const struct nfa *a, const int *seeds, int n, int *out, int *stamp,
                       int mark, int *stk)
{
    int no = 0, sp = 0;
    for (int i = 0; i < n; i++)
        if (stamp[seeds[i]] != mark) {
            stamp[seeds[i]] = mark;
            stk[sp++] = seeds[i];
        }
    while (sp > 0) {
        int v = stk[--sp];
        out[no++] = v;
        for (int k = a->adj_off[v]; k < a->adj_off[v + 1]; k++) {
            const struct nedge *e = &a->e[a->adj[k]];
            if (e->kind == E_EPS && stamp[e->to] != mark) {
                stamp[e->to] = mark;
                stk[sp++] = e->to;
            }
        }
    }
    if (no > 1)
        qsort(out, (size_t)no, sizeof *out, cmp_int);
    return no;
}

/* Counts n more NFA states visited; true (too_complex set) once past the limit. */
static bool over_visits(struct comp *c, int n)
{
    c->visits += (size_t)n;
    if (c->visits > c->max_visits)
        c->too_complex = true;
    return c->too_complex;
}

struct pend {
    int32_t lo, hi, to; /* NFA edge (for calls lo is the rule) */
};

static int cmp_call(const void *a, const void *b)
{
    const struct pend *x = a, *y = b;
    return x->lo != y->lo ? (x->lo > y->lo) - (x->lo < y->lo) : (x->to > y->to) - (x->to < y->to);
}

/* Determinizes the current NFA (start 0, final 1) as rule r's states; returns the global id of
 * its start state or -1. */
static int determinize(struct comp *c, int r)
{
    struct nfa *a = &c->nfa;
    int nn = a->nn;
    /* CSR adjacency */
    free(a->adj_off);
    free(a->adj);
    a->adj_off = calloc((size_t)nn + 1, sizeof *a->adj_off);
    a->adj = malloc(((size_t)a->ne + 1) * sizeof *a->adj);
    int *stamp = calloc((size_t)nn, sizeof *stamp);
    int *tmp = malloc(((size_t)nn + 1) * sizeof *tmp);
    int *stk = malloc(((size_t)nn + 1) * sizeof *stk);
    int *seeds = malloc(((size_t)nn + 1) * sizeof *seeds);
    struct pend *pe = NULL;
    int cap_pe = 0;
    uint32_t *pts = NULL;
    int cap_pts = 0;
    struct subsets S = {0};
    int base = c->ns, start = -1, mark = 0;
    if (!a->adj_off || !a->adj || !stamp || !tmp || !stk || !seeds) {
        c->oom = true;
        goto out;
    }
    for (int i = 0; i < a->ne; i++)
        a->adj_off[a->e[i].from + 1]++;
    for (int i = 0; i < nn; i++)
        a->adj_off[i + 1] += a->adj_off[i];
    {
        int *fill = calloc((size_t)nn + 1, sizeof *fill);
        if (!fill) {
            c->oom = true;
            goto out;
        }
        for (int i = 0; i < a->ne; i++) {
            int f = a->e[i].from;
            a->adj[a->adj_off[f] + fill[f]++] = i;
        }
        free(fill);
    }
    int zero = 0;
    bool fresh;
    int n0 = eps_closure(a, &zero, 1, tmp, stamp, ++mark, stk);
    if (subset_id(c, &S, tmp, n0, &fresh) < 0)
        goto out;
    /* local ids map to global ids base + local, in creation order */
    for (int cur = 0; cur < S.n && !c->oom && !c->too_big && !c->too_complex; cur++) {
        if (!grow((void **)&c->st, &c->cap_s, base + cur + 1, sizeof *c->st)) {
            c->oom = true;
            break;
        }
        struct dst *d = &c->st[base + cur];
        memset(d, 0, sizeof *d);
        d->rule = r;
        int npe = 0;
        int ncalls = 0;
        if (over_visits(c, S.len[cur]))
            goto out;
        /* gather edges (S.pool may move while adding subsets: index it afresh each time) */
        for (int m = 0; m < S.len[cur]; m++) {
            int v = S.pool[S.off[cur] + m];
            if (v == 1)
                d->final = true;
            for (int k = a->adj_off[v]; k < a->adj_off[v + 1]; k++) {
                const struct nedge *e = &a->e[a->adj[k]];
                if (e->kind == E_EPS)
                    continue;
                if (!grow((void **)&pe, &cap_pe, npe + 1, sizeof *pe)) {
                    c->oom = true;
                    goto out;
                }
                pe[npe++] = (struct pend){e->kind == E_CALL ? -1 - e->lo : e->lo, e->hi, e->to};
                ncalls += e->kind == E_CALL;
            }
        }
        /* calls first (negative lo), grouped by rule */
        if (npe)
            qsort(pe, (size_t)npe, sizeof *pe, cmp_call);
        d->c_off = c->nc;
        int i = 0;
        while (i < ncalls) {
            int j = i, ns = 0;
            while (j < ncalls && pe[j].lo == pe[i].lo)
                seeds[ns++] = pe[j++].to;
            int n = eps_closure(a, seeds, ns, tmp, stamp, ++mark, stk);
            int id = over_visits(c, n) ? -1 : subset_id(c, &S, tmp, n, &fresh);
            if (id < 0)
                goto out;
            if (!grow((void **)&c->cl, &c->cap_c, c->nc + 1, sizeof *c->cl)) {
                c->oom = true;
                goto out;
            }
            c->cl[c->nc++] = (struct gcall){-1 - pe[i].lo, base + id};
            i = j;
        }
        d = &c->st[base + cur];
        d->c_n = c->nc - d->c_off;
        /* byte edges: cut 0..255 at every edge boundary, one target set per piece */
        int nb = npe - ncalls;
        struct pend *be = npe ? pe + ncalls : pe;
        if (!grow((void **)&pts, &cap_pts, 2 * nb + 2, sizeof *pts)) {
            c->oom = true;
            goto out;
        }
        int np = 0;
        for (int k = 0; k < nb; k++) {
            pts[np++] = (uint32_t)be[k].lo;
            pts[np++] = (uint32_t)be[k].hi + 1;
        }
        if (np)
            qsort(pts, (size_t)np, sizeof *pts, cmp_int);
        d->r_off = c->nr;
        for (int k = 0; k + 1 < np; k++) {
            if (pts[k] == pts[k + 1])
                continue;
            uint32_t lo = pts[k], hi = pts[k + 1] - 1;
            int ns = 0;
            for (int q = 0; q < nb; q++)
                if ((uint32_t)be[q].lo <= lo && lo <= (uint32_t)be[q].hi)
                    seeds[ns++] = be[q].to;
            if (!ns)
                continue;
            int n = eps_closure(a, seeds, ns, tmp, stamp, ++mark, stk);
            int id = over_visits(c, n) ? -1 : subset_id(c, &S, tmp, n, &fresh);
            if (id < 0)
                goto out;
            struct rng *last = c->nr > c->st[base + cur].r_off ? &c->rng[c->nr - 1] : NULL;
            if (last && last->to == base + id && last->hi + 1 == (int)lo) {
                last->hi = (uint8_t)hi;
                continue;
            }
            if (!grow((void **)&c->rng, &c->cap_r, c->nr + 1, sizeof *c->rng)) {
                c->oom = true;
                goto out;
            }
            c->rng[c->nr++] = (struct rng){(uint8_t)lo, (uint8_t)hi, base + id};
        }
        c->st[base + cur].r_n = c->nr - c->st[base + cur].r_off;
    }
    if (!c->oom && !c->too_big && !c->too_complex) {
        c->ns = base + S.n;
        start = base;
    }
out:
    free(stamp);
    free(tmp);
    free(stk);
    free(seeds);
    free(pe);
    free(pts);
    free(S.pool);
    free(S.off);
    free(S.len);
    free(S.table);
    return start;
}

/* ---- analysis: live states, nullable rules, left recursion ----------------------- */

/* Marks states that can finish their rule (bytes to live states, calls of productive rules);
 * iterates to a fixpoint since productivity of rules and liveness of states depend on each
 * other. */
static void find_live(struct comp *c, const int *start, int nrules, bool *live, bool *prod)
{
    bool changed = true;
    while (changed) {
        changed = false;
        for (int s = c->ns - 1; s >= 0; s--) {
            if (live[s])
                continue;
            const struct dst *d = &c->st[s];
            bool l = d->final;
            for (int k = 0; !l && k < d->r_n; k++)
                l = live[c->rng[d->r_off + k].to];
            for (int k = 0; !l && k < d->c_n; k++)
                l = prod[c->cl[d->c_off + k].rule] && live[c->cl[d->c_off + k].ret];
            if (l) {
                live[s] = changed = true;
                if (start[d->rule] == s)
                    prod[d->rule] = true;
            }
        }
    }
}

/* Rules that derive the empty string. */
static void find_nullable(struct comp *c, const int *start, int nrules, const bool *live,
                          bool *nullable)
{
    bool *reach = malloc((size_t)c->ns * sizeof *reach);
    int *stk = malloc((size_t)c->ns * sizeof *stk);
    if (!reach || !stk) {
        c->oom = true;
        free(reach);
        free(stk);
        return;
    }
    bool changed = true;
    while (changed) {
        changed = false;
        for (int r = 0; r < nrules; r++) {
            if (nullable[r] || start[r] < 0)
                continue;
            memset(reach, 0, (size_t)c->ns);
            int sp = 0;
            stk[sp++] = start[r];
            reach[start[r]] = true;
            while (sp > 0 && !nullable[r]) {
                const struct dst *d = &c->st[stk[--sp]];
                if (d->final)
                    nullable[r] = changed = true;
                for (int k = 0; k < d->c_n; k++) {
                    const struct gcall *cl = &c->cl[d->c_off + k];
                    if (nullable[cl->rule] && live[cl->ret] && !reach[cl->ret]) {
                        reach[cl->ret] = true;
                        stk[sp++] = cl->ret;
                    }
                }
            }
        }
    }
    free(reach);
    free(stk);
}

/* Rule a calls rule b before reading a byte: an edge of the left-call graph. A cycle in it
 * would let a closure push forever. Returns a rule on a cycle, or -1. */
static int find_left_recursion(struct comp *c, const int *start, int nrules, const bool *nullable)
{
    char *lg = calloc((size_t)nrules * (size_t)nrules, 1);
    bool *reach = malloc((size_t)c->ns);
    int *stk = malloc((size_t)c->ns * sizeof *stk);
    int found = -1;
    if (!lg || !reach || !stk) {
        c->oom = true;
        goto out;
    }
    for (int r = 0; r < nrules; r++) {
        if (start[r] < 0)
            continue;
        memset(reach, 0, (size_t)c->ns);
        int sp = 0;
        stk[sp++] = start[r];
        reach[start[r]] = true;
        while (sp > 0) {
            const struct dst *d = &c->st[stk[--sp]];
            for (int k = 0; k < d->c_n; k++) {
                const struct gcall *cl = &c->cl[d->c_off + k];
                lg[(size_t)r * nrules + cl->rule] = 1;
                if (nullable[cl->rule] && !reach[cl->ret]) {
                    reach[cl->ret] = true;
                    stk[sp++] = cl->ret;
                }
            }
        }
    }
    /* Floyd–Warshall-free cycle check: repeatedly remove rules with no left calls out */
    {
        bool *gone = calloc((size_t)nrules, 1);
        if (!gone) {
            c->oom = true;
            goto out;
        }
        bool changed = true;
        while (changed) {
            changed = false;
            for (int r = 0; r < nrules; r++) {
                if (gone[r])
                    continue;
                bool out_edge = false;
                for (int q = 0; q < nrules && !out_edge; q++)
                    out_edge = lg[(size_t)r * nrules + q] && !gone[q];
                if (!out_edge)
                    gone[r] = changed = true;
            }
        }
        for (int r = 0; r < nrules && found < 0; r++)
            if (!gone[r] && lg[(size_t)r * nrules + r])
                found = r;
        for (int r = 0; r < nrules && found < 0; r++)
            if (!gone[r])
                found = r;
        free(gone);
    }
out:
    free(lg);
    free(reach);
    free(stk);
    return found;
}

/* ---- packing ------------------------------------------------------------------ */

static int pack(struct comp *c, const int *start, int nrules, int root, const bool *live,
                const bool *prod, struct grammar **out, struct err *err)
{
    struct grammar *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory");
    g->n_states = c->ns;
    g->n_rules = nrules;
    g->root = root;
    g->state_rule = malloc((size_t)c->ns * sizeof *g->state_rule);
    g->flags = calloc((size_t)c->ns, 1);
    g->trans_off = malloc((size_t)c->ns * sizeof *g->trans_off);
    g->classmap = calloc((size_t)nrules * 256, 1);
    g->call_off = malloc(((size_t)c->ns + 1) * sizeof *g->call_off);
    g->calls = malloc(((size_t)c->nc + 1) * sizeof *g->calls);
    g->rule_start = malloc((size_t)nrules * sizeof *g->rule_start);
    g->rule_nclass = calloc((size_t)nrules, sizeof *g->rule_nclass);
    pthread_mutex_init(&g->cache_lock, NULL);
    atomic_init(&g->cache, NULL);
    if (!g->state_rule || !g->flags || !g->trans_off || !g->classmap || !g->call_off ||
        !g->calls || !g->rule_start || !g->rule_nclass) {
        grammar_free(g);
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory");
    }
    /* byte classes per rule: bytes no range boundary of the rule separates */
    for (int r = 0; r < nrules; r++) {
        g->rule_start[r] = prod[r] ? start[r] : -1;
        bool cut[257] = {0};
        for (int s = 0; s < c->ns; s++) {
            if (c->st[s].rule != r)
                continue;
            for (int k = 0; k < c->st[s].r_n; k++) {
                const struct rng *q = &c->rng[c->st[s].r_off + k];
                cut[q->lo] = true;
                cut[q->hi + 1] = true;
            }
        }
        int cls = 0;
        for (int b = 0; b < 256; b++) {
            if (b > 0 && cut[b])
                cls++;
            g->classmap[(size_t)r * 256 + b] = (uint8_t)cls;
        }
        g->rule_nclass[r] = (uint16_t)(cls + 1);
    }
    size_t total = 0;
    for (int s = 0; s < c->ns; s++)
        total += g->rule_nclass[c->st[s].rule];
    g->trans = malloc((total + 1) * sizeof *g->trans);
    if (!g->trans) {
        grammar_free(g);
        return err_set(err, INFERD_ENOMEM, "grammar: out of memory");
    }
    uint64_t h = HASH_FNV_OFFSET;
    h = hash_fnv1a_word(h, (uint64_t)c->ns);
    h = hash_fnv1a_word(h, (uint64_t)root);
    size_t at = 0;
    int nc = 0;
    for (int s = 0; s < c->ns; s++) {
        const struct dst *d = &c->st[s];
        int r = d->rule;
        int ncls = g->rule_nclass[r];
        g->state_rule[s] = r;
        g->trans_off[s] = (int32_t)at;
        for (int k = 0; k < ncls; k++)
            g->trans[at + k] = -1;
        bool bytes = false;
        for (int k = 0; k < d->r_n; k++) {
            const struct rng *q = &c->rng[d->r_off + k];
            if (!live[q->to])
                continue;
            for (int b = q->lo; b <= q->hi; b++)
                g->trans[at + g->classmap[(size_t)r * 256 + b]] = q->to;
            bytes = true;
        }
        g->call_off[s] = nc;
        for (int k = 0; k < d->c_n; k++) {
            const struct gcall *cl = &c->cl[d->c_off + k];
            if (prod[cl->rule] && live[cl->ret])
                g->calls[nc++] = *cl;
        }
        g->flags[s] = (uint8_t)((d->final ? GS_FINAL : 0) | (nc > g->call_off[s] ? GS_CALLS : 0) |
                                (bytes ? GS_BYTES : 0));
        h = hash_fnv1a_word(h, ((uint64_t)r << 8) | g->flags[s]);
        for (int k = 0; k < ncls; k++)
            h = hash_fnv1a_word(h, (uint64_t)(uint32_t)g->trans[at + k]);
        for (int k = g->call_off[s]; k < nc; k++)
            h = hash_fnv1a_word(h, ((uint64_t)(uint32_t)g->calls[k].rule << 32) |
                                       (uint32_t)g->calls[k].ret);
        at += (size_t)ncls;
    }
    g->call_off[c->ns] = nc;
    h = hash_fnv1a(h, g->classmap, (size_t)nrules * 256);
    g->digest = hash_mix64(h);
    *out = g;
    return 0;
}

int gb_compile(struct gbuild *b, int root, struct grammar **out, struct err *err)
{
    *out = NULL;
    if (b->oom || b->too_big || root < 0)
        return gb_fail(b, err);
    for (int r = 0; r < b->nrules; r++)
        if (b->rules[r].expr < 0)
            return err_set(err, INFERD_EINVAL, "grammar: rule '%.64s' is used but not defined",
                           b->rules[r].name);
    struct comp c = {.b = b, .max_states = b->max_states};
    int nrules = b->nrules;
    int *start = malloc((size_t)nrules * sizeof *start);
    bool *live = NULL, *prod = calloc((size_t)nrules + 1, 1), *nullable = calloc((size_t)nrules + 1, 1);
    int rc = 0;
    if (!start || !prod || !nullable) {
        rc = err_set(err, INFERD_ENOMEM, "grammar: out of memory");
        goto done;
    }
    size_t nfa_budget = b->max_states * NFA_PER_STATE;
    c.max_visits = nfa_budget * VISITS_PER_NFA_STATE;
    for (int r = 0; r < nrules; r++) {
        struct nfa *a = &c.nfa;
        a->nn = 0;
        a->ne = 0;
        a->limit = nfa_budget - (c.nfa_total < nfa_budget ? c.nfa_total : nfa_budget);
        if (a->limit < 2) {
            rc = gb_fail(&(struct gbuild){.max_states = b->max_states, .too_big = true}, err);
            goto done;
        }
        nfa_node(a);
        nfa_node(a);
        nfa_expr(a, b, b->rules[r].expr, 0, 1, 0);
        c.nfa_total += (size_t)a->nn;
        if (a->oom || a->too_big) {
            rc = gb_fail(&(struct gbuild){.max_states = b->max_states, .oom = a->oom,
                                          .too_big = a->too_big}, err);
            goto done;
        }
        start[r] = determinize(&c, r);
        if (start[r] < 0 && c.too_complex) {
            rc = err_set(err, INFERD_ERANGE,
                         "grammar: too complex (building its automaton visited over %zu "
                         "expression states; the limit follows from %zu states)",
                         c.max_visits, b->max_states);
            goto done;
        }
        if (start[r] < 0) {
            rc = gb_fail(&(struct gbuild){.max_states = b->max_states, .oom = c.oom || !c.too_big,
                                          .too_big = c.too_big}, err);
            goto done;
        }
    }
    live = calloc((size_t)c.ns + 1, 1);
    if (!live) {
        rc = err_set(err, INFERD_ENOMEM, "grammar: out of memory");
        goto done;
    }
    find_live(&c, start, nrules, live, prod);
    if (!prod[root]) {
        rc = err_set(err, INFERD_EINVAL, "grammar: rule '%.64s' matches nothing",
                     b->rules[root].name);
        goto done;
    }
    find_nullable(&c, start, nrules, live, nullable);
    int lr = find_left_recursion(&c, start, nrules, nullable);
    if (c.oom) {
        rc = err_set(err, INFERD_ENOMEM, "grammar: out of memory");
        goto done;
    }
    if (lr >= 0) {
        rc = err_set(err, INFERD_EINVAL, "grammar: rule '%.64s' is left-recursive",
                     b->rules[lr].name);
        goto done;
    }
    rc = pack(&c, start, nrules, root, live, prod, out, err);
done:
    free(c.nfa.e);
    free(c.nfa.adj_off);
    free(c.nfa.adj);
    free(c.st);
    free(c.rng);
    free(c.cl);
    free(start);
    free(live);
    free(prod);
    free(nullable);
    return rc;
}

void grammar_free(struct grammar *g)
{
    if (!g)
        return;
    mask_cache_free(atomic_load(&g->cache));
    pthread_mutex_destroy(&g->cache_lock);
    free(g->state_rule);
    free(g->flags);
    free(g->trans_off);
    free(g->trans);
    free(g->classmap);
    free(g->call_off);
    free(g->calls);
    free(g->rule_start);
    free(g->rule_nclass);
    free(g);
}

uint64_t grammar_digest(const struct grammar *g)
{
    return g->digest;
}

int grammar_n_states(const struct grammar *g)
{
    return g->n_states;
}
