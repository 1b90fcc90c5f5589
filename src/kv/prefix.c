/* kv/prefix.c — the prefix cache: full KV blocks addressed by a verified hash chain, shared by
 * reference count, and the partial last blocks of retired sequences as leaves reused by copy;
 * evicted leaves first (LRU or GreedyDual-Size), with session affinity. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "base/hash.h"

#define SESSION_ID_MAX 256

/* An open session: blocks published under it are evicted after all others. */
struct prefix_session {
    char *id;           /* owned; NULL: a free slot */
    uint64_t last_ns;   /* the manager's clock at its last lookup or publish */
    int n_blocks;       /* cached blocks marked with it */
};

/* Everything is indexed by pool block id: a block is cached at most once, so
 * the entry of a cached block is the block itself. */
struct kv_prefix {
    struct kv_pool *pool;       /* borrowed */
    struct kv_prefix_config cfg;
    int n_blocks, block_size;
    size_t block_bytes;
    uint8_t *cached;            /* owned; n_blocks: 1 while the cache holds a reference */
    uint8_t *unref;             /* owned; n_blocks: cached and held by nobody else */
    uint64_t *hash, *ns, *gen;  /* owned; n_blocks */
    int32_t *tokens;            /* owned; n_blocks * block_size: each block's token ids */
    int32_t *len;               /* owned; n_blocks: valid tokens, block_size unless partial */
    int32_t *parent;            /* owned; n_blocks: parent entry, -1 for a first block */
    int32_t *first_child, *next_sib, *prev_sib; /* owned; n_blocks: cached children lists */
    int32_t *n_children;        /* owned; n_blocks */
    int32_t *n_partial_children;/* owned; n_blocks: of which partial entries */
    int32_t *bucket_next;       /* owned; n_blocks: hash bucket chains */
    int32_t *session;           /* owned; n_blocks: session slot, -1: none */
    uint64_t *tick;             /* owned; n_blocks: the clock tick of the last use */
    uint64_t *used_ns;          /* owned; n_blocks: the manager's clock at the last use */
    uint64_t *reused;           /* owned; n_blocks: tokens served from the block */
    double *priority;           /* owned; n_blocks: eviction order within a tier */
    int32_t *heap_pos;          /* owned; n_blocks: index in heap, -1 when not evictable */
    int32_t *heap;              /* owned; min-heap of evictable blocks, heap_n used */
    int heap_n;
    int32_t *buckets;           /* owned; bucket_mask + 1 chain heads */
    uint32_t bucket_mask;
    int32_t root_first;         /* first blocks (no parent), as a children list */
    int32_t root_partial;       /* of which partial entries */
    uint64_t clock, next_gen, now_ns;
    double gds_clock;           /* GreedyDual-Size's L */
    struct prefix_session *sessions; /* owned; n_session_slots, ids owned */
    int n_session_slots;
    uint64_t n_cached, n_unref, n_partial;
    struct kv_prefix_stats stats;
    struct kv_prefix_hooks hooks; /* the tier below, told of full blocks coming and going */
};

/* ---- hashing ---------------------------------------------------------------- */


uint64_t kv_prefix_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t ns)
{
    uint64_t h = hash_mix64(parent ^ 0x9e3779b97f4a7c15ull) ^ hash_mix64(ns + 0x632be59bd9b4e019ull);
    for (int i = 0; i < n; i++)
        h = hash_mix64(h ^ (uint32_t)tokens[i]) + 0x9e3779b97f4a7c15ull;
    return hash_mix64(h ^ (uint64_t)n);
}

uint64_t kv_prefix_namespace(uint64_t model_digest, const struct kv_format *format,
                             int block_size, uint64_t cache_ns)
{
    uint64_t h = hash_mix64(model_digest ^ 0x5851f42d4c957f2dull);
    h = hash_mix64(h ^ (uint64_t)format->dtype);
    h = hash_mix64(h ^ ((uint64_t)format->group_size << 8) ^ ((uint64_t)format->scales << 40) ^
              ((uint64_t)format->scale_bytes << 48));
    if (format->quant) /* the scheme of every layer, seed and config digest */
        h = hash_mix64(h ^ kv_format_digest(format));
    h = hash_mix64(h ^ (uint64_t)block_size);
    return hash_mix64(h ^ cache_ns);
}

/* ---- the eviction heap ------------------------------------------------------ */

/* True when a goes before b: blocks without an open session first, then the
 * lower priority, then the older. */
static bool evict_before(const struct kv_prefix *p, int32_t a, int32_t b)
{
    bool sa = p->session[a] >= 0, sb = p->session[b] >= 0;
    if (sa != sb)
        return !sa;
    if (p->priority[a] != p->priority[b])
        return p->priority[a] < p->priority[b];
    return p->tick[a] < p->tick[b];
}

static void heap_set(struct kv_prefix *p, int i, int32_t b)
{
    p->heap[i] = b;
    p->heap_pos[b] = i;
}

static void heap_sift(struct kv_prefix *p, int i)
{
    int32_t b = p->heap[i];
    while (i > 0 && evict_before(p, b, p->heap[(i - 1) / 2])) {
        heap_set(p, i, p->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        int c = 2 * i + 1;
        if (c >= p->heap_n)
            break;
        if (c + 1 < p->heap_n && evict_before(p, p->heap[c + 1], p->heap[c]))
            c++;
        if (!evict_before(p, p->heap[c], b))
            break;
        heap_set(p, i, p->heap[c]);
        i = c;
    }
    heap_set(p, i, b);
}

static void heap_remove(struct kv_prefix *p, int32_t b)
{
    int i = p->heap_pos[b];
    if (i < 0)
        return;
    p->heap_pos[b] = -1;
    int32_t last = p->heap[--p->heap_n];
    if (i < p->heap_n) {
        heap_set(p, i, last);
        heap_sift(p, i);
    }
}

/* Puts b in or out of the eviction heap (and the unreferenced count) after
 * its references, children, session or priority changed. */
static void refresh(struct kv_prefix *p, int32_t b)
{
    bool unref = p->cached[b] && p->pool->refcount[b] == 1;
    if (unref != (bool)p->unref[b]) {
        p->unref[b] = unref;
        if (unref)
            p->n_unref++;
        else
            p->n_unref--;
    }
    bool evictable = unref && p->n_children[b] == 0;
    if (!evictable) {
        heap_remove(p, b);
    } else if (p->heap_pos[b] < 0) {
        heap_set(p, p->heap_n++, b);
        heap_sift(p, p->heap_n - 1);
    } else {
        heap_sift(p, p->heap_pos[b]);
    }
}

/* ---- sessions --------------------------------------------------------------- */

static int session_find(const struct kv_prefix *p, const char *id)
{
    for (int i = 0; i < p->n_session_slots; i++)
        if (p->sessions[i].id && !strcmp(p->sessions[i].id, id))
            return i;
    return -1;
}

/* The slot of session id, opened when absent; -1 when out of memory. */
static int session_open(struct kv_prefix *p, const char *id)
{
    int s = session_find(p, id);
    if (s >= 0)
        return s;
    for (s = 0; s < p->n_session_slots && p->sessions[s].id; s++)
        ;
    if (s == p->n_session_slots) {
        int cap = p->n_session_slots ? p->n_session_slots * 2 : 16;
        struct prefix_session *grown = realloc(p->sessions, (size_t)cap * sizeof *grown);
        if (!grown)
            return -1;
        memset(grown + p->n_session_slots, 0,
               (size_t)(cap - p->n_session_slots) * sizeof *grown);
        p->sessions = grown;
        p->n_session_slots = cap;
    }
    size_t len = strnlen(id, SESSION_ID_MAX);
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    memcpy(copy, id, len);
    copy[len] = 0;
    p->sessions[s] = (struct prefix_session){.id = copy, .last_ns = p->now_ns};
    p->stats.sessions++;
    return s;
}

/* Closes slot s: its blocks lose their mark. Returns how many it had. */
static int session_close(struct kv_prefix *p, int s)
{
    int n = p->sessions[s].n_blocks;
    if (n > 0)
        for (int32_t b = 0; b < p->n_blocks; b++)
            if (p->cached[b] && p->session[b] == s) {
                p->session[b] = -1;
                refresh(p, b);
            }
    free(p->sessions[s].id);
    p->sessions[s] = (struct prefix_session){0};
    p->stats.sessions--;
    return n;
}

/* The session a retention hint marks blocks with when the sequence has none: one per
 * namespace, so the next request with the same prefix (same tenant and salt) keeps them too;
 * it closes when idle like any session. Written into buf (40 bytes). */
static const char *retention_key(uint64_t ns, char *buf)
{
    snprintf(buf, 40, "retain:%016llx", (unsigned long long)ns);
    return buf;
}

int kv_prefix_close_session(struct kv_prefix *p, const char *id)
{
    int s = session_find(p, id);
    return s < 0 ? -1 : session_close(p, s);
}

void kv_prefix_tick(struct kv_prefix *p, uint64_t now_ns)
{
    p->now_ns = now_ns;
    if (p->cfg.session_idle_ns == 0)
        return;
    for (int s = 0; s < p->n_session_slots; s++)
        if (p->sessions[s].id && now_ns - p->sessions[s].last_ns > p->cfg.session_idle_ns)
            session_close(p, s);
}

/* ---- entries ---------------------------------------------------------------- */

/* Marks b as used now: LRU order, and GreedyDual-Size's priority. */
static void touch(struct kv_prefix *p, int32_t b, int reused_tokens)
{
    p->tick[b] = ++p->clock;
    p->used_ns[b] = p->now_ns;
    p->reused[b] += (uint64_t)reused_tokens;
    p->priority[b] = p->cfg.retention == KV_RETAIN_COST_SIZE
                         ? p->gds_clock + (double)p->reused[b] / (double)p->block_bytes
                         : (double)p->tick[b];
    refresh(p, b);
}

static int32_t *children_head(struct kv_prefix *p, int32_t parent)
{
    return parent < 0 ? &p->root_first : &p->first_child[parent];
}

static int32_t *partial_children(struct kv_prefix *p, int32_t parent)
{
    return parent < 0 ? &p->root_partial : &p->n_partial_children[parent];
}

/* The cached block under parent with exactly these tokens, hash and
 * namespace, or -1. The hash only narrows the search: tokens, parent and
 * namespace are compared. */
static int32_t find(const struct kv_prefix *p, uint64_t h, int32_t parent, uint64_t ns,
                    const int32_t *tokens)
{
    size_t bytes = (size_t)p->block_size * sizeof *tokens;
    for (int32_t b = p->buckets[h & p->bucket_mask]; b >= 0; b = p->bucket_next[b])
        if (p->hash[b] == h && p->parent[b] == parent && p->ns[b] == ns &&
            !memcmp(p->tokens + (size_t)b * p->block_size, tokens, bytes))
            return b;
    return -1;
}

/* Caches block b (held by its sequence) under parent with its first n tokens
 * valid; the cache takes a reference. Only full blocks go in the hash buckets:
 * a partial entry is found through its parent's children, by lookup's
 * token-exact match, and never becomes anyone's parent. */
static void insert(struct kv_prefix *p, int32_t b, int32_t parent, uint64_t h, uint64_t ns,
                   const int32_t *tokens, int n, int session)
{
    memcpy(p->tokens + (size_t)b * p->block_size, tokens, (size_t)n * sizeof *tokens);
    p->len[b] = n;
    p->cached[b] = 1;
    p->hash[b] = h;
    p->ns[b] = ns;
    p->gen[b] = ++p->next_gen;
    p->parent[b] = parent;
    p->n_children[b] = p->n_partial_children[b] = 0;
    p->first_child[b] = -1;
    p->reused[b] = 0;
    p->session[b] = session;
    if (session >= 0)
        p->sessions[session].n_blocks++;
    if (n == p->block_size) {
        int32_t *head = &p->buckets[h & p->bucket_mask];
        p->bucket_next[b] = *head;
        *head = b;
    } else {
        p->bucket_next[b] = -1;
        p->n_partial++;
        (*partial_children(p, parent))++;
    }
    int32_t *kids = children_head(p, parent);
    p->prev_sib[b] = -1;
    p->next_sib[b] = *kids;
    if (*kids >= 0)
        p->prev_sib[*kids] = b;
    *kids = b;
    if (parent >= 0) {
        p->n_children[parent]++;
        refresh(p, parent);
    }
    kv_pool_retain(p->pool, (uint32_t)b);
    p->n_cached++;
    touch(p, b, 0);
    if (n == p->block_size && p->hooks.inserted)
        p->hooks.inserted(p->hooks.ctx, (uint32_t)b);
}

/* Takes b out of the cache's structures and drops the cache's reference. */
static void uncache(struct kv_prefix *p, int32_t b)
{
    if (p->len[b] == p->block_size && p->hooks.leaving)
        p->hooks.leaving(p->hooks.ctx, (uint32_t)b);
    if (p->len[b] == p->block_size) {
        int32_t *link = &p->buckets[p->hash[b] & p->bucket_mask];
        while (*link != b)
            link = &p->bucket_next[*link];
        *link = p->bucket_next[b];
    } else {
        p->n_partial--;
        (*partial_children(p, p->parent[b]))--;
    }
    if (p->prev_sib[b] >= 0)
        p->next_sib[p->prev_sib[b]] = p->next_sib[b];
    else
        *children_head(p, p->parent[b]) = p->next_sib[b];
    if (p->next_sib[b] >= 0)
        p->prev_sib[p->next_sib[b]] = p->prev_sib[b];
    if (p->session[b] >= 0)
        p->sessions[p->session[b]].n_blocks--;
    p->session[b] = -1;
    p->cached[b] = 0;
    heap_remove(p, b);
    refresh(p, b);
    int32_t parent = p->parent[b];
    p->n_cached--;
    kv_pool_release(p->pool, (uint32_t)b);
    if (parent >= 0) {
        p->n_children[parent]--;
        refresh(p, parent);
    }
}

bool kv_prefix_evict_one(struct kv_prefix *p)
{
    if (p->heap_n == 0)
        return false;
    int32_t b = p->heap[0];
    if (p->cfg.retention == KV_RETAIN_COST_SIZE)
        p->gds_clock = p->priority[b];
    uncache(p, b);
    p->stats.evictions++;
    return true;
}

void kv_prefix_enforce_cap(struct kv_prefix *p)
{
    while (p->n_unref * p->block_bytes > p->cfg.max_bytes && kv_prefix_evict_one(p))
        ;
}

void kv_prefix_clear(struct kv_prefix *p)
{
    while (kv_prefix_evict_one(p))
        ;
    for (int s = 0; s < p->n_session_slots; s++)
        if (p->sessions[s].id)
            session_close(p, s);
    /* What is left is held by sequences: the cache lets go of all of it at
     * once, so no list needs unlinking one entry at a time. */
    for (int32_t b = 0; b < p->n_blocks; b++) {
        if (!p->cached[b])
            continue;
        p->cached[b] = 0;
        p->n_children[b] = p->n_partial_children[b] = 0;
        p->first_child[b] = p->next_sib[b] = p->prev_sib[b] = p->bucket_next[b] = -1;
        refresh(p, b);
        kv_pool_release(p->pool, (uint32_t)b);
    }
    for (uint32_t i = 0; i <= p->bucket_mask; i++)
        p->buckets[i] = -1;
    p->root_first = -1;
    p->root_partial = 0;
    p->n_cached = 0;
    p->n_partial = 0;
}

uint64_t kv_prefix_namespace_of(const struct kv_prefix *p, uint64_t cache_ns)
{
    return kv_prefix_namespace(p->cfg.model_digest, &p->pool->format, p->block_size, cache_ns);
}

uint64_t kv_prefix_block_hash(const struct kv_prefix *p, uint32_t block) { return p->hash[block]; }

void kv_prefix_set_hooks(struct kv_prefix *p, const struct kv_prefix_hooks *hooks)
{
    p->hooks = *hooks;
}

bool kv_prefix_entry(const struct kv_prefix *p, uint32_t block, struct kv_prefix_entry *out)
{
    int32_t b = (int32_t)block;
    if (b < 0 || b >= p->n_blocks || !p->cached[b])
        return false;
    int32_t parent = p->parent[b];
    *out = (struct kv_prefix_entry){
        .hash = p->hash[b],
        .parent_hash = parent >= 0 ? p->hash[parent] : p->ns[b],
        .ns = p->ns[b],
        .tokens = p->tokens + (size_t)b * p->block_size,
        .n_tokens = p->len[b],
        .gen = p->gen[b],
        .used_ns = p->used_ns[b],
    };
    return true;
}

int kv_prefix_evict_idle(struct kv_prefix *p, uint64_t idle_since_ns,
                         bool (*may_go)(void *ctx, uint32_t block), void *ctx)
{
    if (p->heap_n == 0)
        return 0;
    /* the victims first, then out: uncaching reorders the heap */
    int32_t *victims = malloc((size_t)p->heap_n * sizeof *victims);
    if (!victims)
        return 0;
    int n = 0;
    for (int i = 0; i < p->heap_n; i++) {
        int32_t b = p->heap[i];
        if (p->used_ns[b] < idle_since_ns && p->len[b] == p->block_size &&
            may_go(ctx, (uint32_t)b))
            victims[n++] = b;
    }
    int gone = 0;
    for (int i = 0; i < n; i++)
        if (p->heap_pos[victims[i]] >= 0) { /* still an unreferenced leaf */
            uncache(p, victims[i]);
            p->stats.evictions++;
            gone++;
        }
    free(victims);
    return gone;
}

void kv_prefix_after_refcount(struct kv_prefix *p, uint32_t block)
{
    if (p->cached[block])
        refresh(p, (int32_t)block);
}

int kv_prefix_unreferenced_blocks(const struct kv_prefix *p) { return (int)p->n_unref; }

/* ---- lookup and publish ----------------------------------------------------- */

int kv_prefix_lookup(struct kv_prefix *p, uint64_t cache_ns, const int32_t *tokens, int limit,
                     uint32_t *chain, int *partial_src, int *partial_n)
{
    int bs = p->block_size;
    uint64_t ns = kv_prefix_namespace(p->cfg.model_digest, &p->pool->format, bs, cache_ns);
    int32_t parent = -1;
    uint64_t h = ns;
    int n = 0;
    while ((n + 1) * bs <= limit) {
        uint64_t hn = kv_prefix_hash(h, tokens + (size_t)n * bs, bs, ns);
        int32_t b = find(p, hn, parent, ns, tokens + (size_t)n * bs);
        if (b < 0)
            break;
        chain[n++] = (uint32_t)b;
        parent = b;
        h = hn;
    }
    /* The longest match among the children of the chain's end: token-exact
     * reuse of a block the prompt only partly shares. */
    int rem = limit - n * bs;
    if (rem > bs)
        rem = bs;
    const int32_t *next = tokens + (size_t)n * bs;
    int best = -1, best_n = 0;
    for (int32_t c = *children_head(p, parent); c >= 0 && rem > 0; c = p->next_sib[c]) {
        if (p->ns[c] != ns)
            continue;
        const int32_t *t = p->tokens + (size_t)c * bs;
        int m = 0, valid = rem < p->len[c] ? rem : p->len[c];
        while (m < valid && t[m] == next[m])
            m++;
        if (m > best_n) {
            best = c;
            best_n = m;
        }
    }
    for (int i = 0; i < n; i++)
        touch(p, (int32_t)chain[i], bs);
    if (best >= 0)
        touch(p, best, best_n);
    *partial_src = best;
    *partial_n = best >= 0 ? best_n : 0;
    return n;
}

void kv_prefix_note_lookup(struct kv_prefix *p, const char *session, int n_reused)
{
    if (n_reused > 0) {
        p->stats.hits++;
        p->stats.hit_tokens += (uint64_t)n_reused;
    } else {
        p->stats.misses++;
    }
    if (!session)
        return;
    int s = session_find(p, session);
    if (s >= 0)
        p->sessions[s].last_ns = p->now_ns;
    if (n_reused > 0)
        p->stats.session_hits++;
    else
        p->stats.session_misses++;
}

/* Marks cached block b with session (>= 0) unless it has one already. */
static void mark_session(struct kv_prefix *p, int32_t b, int session)
{
    if (session >= 0 && p->session[b] < 0) {
        p->session[b] = session;
        p->sessions[session].n_blocks++;
    }
}

static bool same_tokens(const struct kv_prefix *p, int32_t b, const int32_t *tokens, int n)
{
    return !memcmp(p->tokens + (size_t)b * p->block_size, tokens, (size_t)n * sizeof *tokens);
}

/* One entry per prefix relation: under one parent and namespace, a partial
 * entry whose tokens start the tokens of another entry (full, or a longer
 * partial) serves nothing the other does not, so it goes. keep is the entry
 * just cached with tokens[0, n). */
static void drop_superseded(struct kv_prefix *p, int32_t parent, uint64_t ns,
                            const int32_t *tokens, int n, int32_t keep)
{
    if (*partial_children(p, parent) == 0) /* the common case: no scan */
        return;
    for (int32_t c = *children_head(p, parent), next; c >= 0; c = next) {
        next = p->next_sib[c];
        if (c != keep && p->ns[c] == ns && p->len[c] < p->block_size && p->len[c] <= n &&
            same_tokens(p, c, tokens, p->len[c]))
            uncache(p, c);
    }
}

/* The cached child of parent (full or partial) whose tokens start with
 * tokens[0, n), or -1. */
static int32_t find_covering(const struct kv_prefix *p, int32_t parent, uint64_t ns,
                             const int32_t *tokens, int n)
{
    int32_t c = parent < 0 ? p->root_first : p->first_child[parent];
    for (; c >= 0; c = p->next_sib[c])
        if (p->ns[c] == ns && p->len[c] >= n && same_tokens(p, c, tokens, n))
            return c;
    return -1;
}

void kv_prefix_publish(struct kv_prefix *p, struct kv_seq *seq, const int32_t *tokens,
                       int n_computed)
{
    int bs = p->block_size;
    int n_full = n_computed / bs;
    if (n_full > seq->table.n_blocks)
        n_full = seq->table.n_blocks;
    if (seq->n_published >= n_full)
        return;
    uint64_t ns = kv_prefix_namespace(p->cfg.model_digest, &p->pool->format, bs, seq->ns);
    /* Continue the chain where the last publish left it, unless its end was
     * evicted meanwhile (then walk it again from the first block). */
    int32_t parent = -1;
    uint64_t h = ns;
    if (seq->n_published > 0 && seq->chain_block >= 0 && p->cached[seq->chain_block] &&
        p->gen[seq->chain_block] == seq->chain_gen) {
        parent = (int32_t)seq->chain_block;
        h = seq->chain_hash;
    } else {
        seq->n_published = 0;
    }
    int session = seq->session ? session_open(p, seq->session) : -1;
    int retain = -1; /* the retention session, opened at its first block */
    for (int i = seq->n_published; i < n_full; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        uint64_t hn = kv_prefix_hash(h, t, bs, ns);
        int32_t b = find(p, hn, parent, ns, t);
        int mark = session;
        if (mark < 0 && (int64_t)(i + 1) * bs <= seq->n_retain) {
            if (retain < 0)
                retain = session_open(p, retention_key(seq->ns, (char[40]){0}));
            mark = retain;
        }
        if (b < 0) {
            b = (int32_t)seq->table.blocks[i];
            if (p->cached[b]) /* cached under another chain: never expected; stop here */
                break;
            insert(p, b, parent, hn, ns, t, bs, mark);
            drop_superseded(p, parent, ns, t, bs, b);
        } else {
            mark_session(p, b, mark);
            touch(p, b, 0);
        }
        parent = b;
        h = hn;
        seq->n_published = i + 1;
        seq->chain_block = b;
        seq->chain_gen = p->gen[b];
        seq->chain_hash = h;
    }
    if (session >= 0)
        p->sessions[session].last_ns = p->now_ns;
    if (retain >= 0)
        p->sessions[retain].last_ns = p->now_ns;
}

/* True when seq's chain still ends at a cached entry (not evicted since). */
static bool chain_intact(const struct kv_prefix *p, const struct kv_seq *seq)
{
    return seq->chain_block >= 0 && p->cached[seq->chain_block] &&
           p->gen[seq->chain_block] == seq->chain_gen;
}

void kv_prefix_publish_partial(struct kv_prefix *p, struct kv_seq *seq, const int32_t *tokens,
                               int n_computed)
{
    int bs = p->block_size;
    int n_full = n_computed / bs, n = n_computed % bs;
    if (n == 0 || n_full >= seq->table.n_blocks)
        return;
    if (n_full > 0 && !chain_intact(p, seq)) {
        seq->n_published = 0; /* walk the chain again, so the partial entry has its parent */
        kv_prefix_publish(p, seq, tokens, n_full * bs);
    }
    if (seq->n_published != n_full || (n_full > 0 && !chain_intact(p, seq)))
        return;
    int32_t b = (int32_t)seq->table.blocks[n_full];
    /* Cached only while nobody else could write the slots past n: the
     * caller lets go of seq next, and lookups copy partial entries. */
    if (p->cached[b] || p->pool->refcount[b] != 1)
        return;
    uint64_t ns = kv_prefix_namespace(p->cfg.model_digest, &p->pool->format, bs, seq->ns);
    int32_t parent = n_full > 0 ? (int32_t)seq->chain_block : -1;
    uint64_t h = n_full > 0 ? seq->chain_hash : ns;
    const int32_t *t = tokens + (size_t)n_full * bs;
    int session = seq->session ? session_open(p, seq->session) : -1;
    int32_t c = find_covering(p, parent, ns, t, n);
    if (c >= 0) {
        mark_session(p, c, session);
        touch(p, c, 0);
    } else {
        insert(p, b, parent, kv_prefix_hash(h, t, n, ns), ns, t, n, session);
        drop_superseded(p, parent, ns, t, n, b);
    }
    if (session >= 0)
        p->sessions[session].last_ns = p->now_ns;
}

/* ---- lifetime --------------------------------------------------------------- */

void kv_prefix_free(struct kv_prefix *p)
{
    if (!p)
        return;
    for (int s = 0; s < p->n_session_slots; s++)
        free(p->sessions[s].id);
    free(p->sessions);
    free(p->cached);
    free(p->unref);
    free(p->hash);
    free(p->ns);
    free(p->gen);
    free(p->tokens);
    free(p->len);
    free(p->parent);
    free(p->first_child);
    free(p->next_sib);
    free(p->prev_sib);
    free(p->n_children);
    free(p->n_partial_children);
    free(p->bucket_next);
    free(p->session);
    free(p->tick);
    free(p->used_ns);
    free(p->reused);
    free(p->priority);
    free(p->heap_pos);
    free(p->heap);
    free(p->buckets);
    free(p);
}

int kv_prefix_create(struct kv_pool *pool, size_t block_bytes, const struct kv_prefix_config *cfg,
                     struct kv_prefix **out, struct err *err)
{
    int n = pool->cache.n_blocks, bs = pool->cache.block_size;
    struct kv_prefix *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "out of memory for the prefix cache");
    p->pool = pool;
    p->cfg = *cfg;
    p->n_blocks = n;
    p->block_size = bs;
    p->block_bytes = block_bytes ? block_bytes : 1;
    p->root_first = -1;
    uint32_t n_buckets = 16;
    while (n_buckets < (uint32_t)n)
        n_buckets *= 2;
    p->bucket_mask = n_buckets - 1;
    size_t nb = (size_t)n;
    p->cached = calloc(nb, 1);
    p->unref = calloc(nb, 1);
    p->hash = calloc(nb, sizeof *p->hash);
    p->ns = calloc(nb, sizeof *p->ns);
    p->gen = calloc(nb, sizeof *p->gen);
    p->tokens = calloc(nb * (size_t)bs, sizeof *p->tokens);
    p->len = calloc(nb, sizeof *p->len);
    p->parent = malloc(nb * sizeof *p->parent);
    p->first_child = malloc(nb * sizeof *p->first_child);
    p->next_sib = malloc(nb * sizeof *p->next_sib);
    p->prev_sib = malloc(nb * sizeof *p->prev_sib);
    p->n_children = calloc(nb, sizeof *p->n_children);
    p->n_partial_children = calloc(nb, sizeof *p->n_partial_children);
    p->bucket_next = malloc(nb * sizeof *p->bucket_next);
    p->session = malloc(nb * sizeof *p->session);
    p->tick = calloc(nb, sizeof *p->tick);
    p->used_ns = calloc(nb, sizeof *p->used_ns);
    p->reused = calloc(nb, sizeof *p->reused);
    p->priority = calloc(nb, sizeof *p->priority);
    p->heap_pos = malloc(nb * sizeof *p->heap_pos);
    p->heap = malloc(nb * sizeof *p->heap);
    p->buckets = malloc((size_t)n_buckets * sizeof *p->buckets);
    if (!p->cached || !p->unref || !p->hash || !p->ns || !p->gen || !p->tokens || !p->len ||
        !p->parent ||
        !p->first_child || !p->next_sib || !p->prev_sib || !p->n_children || !p->bucket_next ||
        !p->n_partial_children ||
        !p->session || !p->tick || !p->used_ns || !p->reused || !p->priority || !p->heap_pos || !p->heap ||
        !p->buckets) {
        kv_prefix_free(p);
        return err_set(err, INFERD_ENOMEM, "out of memory for a prefix cache of %d blocks", n);
    }
    for (int i = 0; i < n; i++) {
        p->parent[i] = p->first_child[i] = p->next_sib[i] = p->prev_sib[i] = -1;
        p->bucket_next[i] = p->session[i] = p->heap_pos[i] = -1;
    }
    for (uint32_t i = 0; i < n_buckets; i++)
        p->buckets[i] = -1;
    p->stats.max_bytes = cfg->max_bytes;
    *out = p;
    return 0;
}

void kv_prefix_get_stats(const struct kv_prefix *p, struct kv_prefix_stats *out)
{
    *out = p->stats;
    out->blocks = p->n_cached;
    out->bytes = p->n_cached * p->block_bytes;
    out->unreferenced_blocks = p->n_unref;
    out->partial_blocks = p->n_partial;
}
