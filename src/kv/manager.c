/* kv/manager.c — the engine's view of the KV cache: computed prefixes (through the prefix
 * cache), slots for new tokens (all or nothing, evicting cached blocks first), truncation
 * and release, over the reference-counted pool. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

struct kv_manager {
    struct kv_pool *pool;     /* owned */
    struct kv_prefix *prefix; /* owned; NULL while the prefix cache is off */
    struct kv_tier *tier;     /* owned; NULL without the SSD tier */
    size_t block_bytes;
    int window;               /* a windowed pool's sliding_window; 0: a plain pool */
};

static int manager_create(const struct model *m, struct backend *be, int n_blocks, int n_slots,
                          int block_size, struct kv_manager **out, struct err *err)
{
    struct kv_manager *mgr = calloc(1, sizeof *mgr);
    if (!mgr)
        return err_set(err, INFERD_ENOMEM, "out of memory for the KV manager");
    int rc = n_slots > 0
                 ? kv_pool_create_windowed(m, be, n_blocks, n_slots, block_size, &mgr->pool, err)
                 : kv_pool_create(m, be, n_blocks, block_size, &mgr->pool, err);
    if (rc < 0) {
        free(mgr);
        return rc;
    }
    mgr->block_bytes = kv_format_bytes_per_block(&m->config, &mgr->pool->format, block_size);
    mgr->window = mgr->pool->cache.window_positions;
    *out = mgr;
    return 0;
}

int kv_manager_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                      struct kv_manager **out, struct err *err)
{
    return manager_create(m, be, n_blocks, 0, block_size, out, err);
}

int kv_manager_create_windowed(const struct model *m, struct backend *be, int n_blocks,
                               int n_slots, int block_size, struct kv_manager **out,
                               struct err *err)
{
    return manager_create(m, be, n_blocks, n_slots < 1 ? 1 : n_slots, block_size, out, err);
}

int kv_manager_slots_per_seq(const struct model_config *c, int block_size, int chunk)
{
    if (c->sliding_window <= 0)
        return 0;
    /* from the block of n_tokens - window on (window_from_of) to the chunk's end */
    return kv_blocks_for(c->sliding_window + chunk, block_size) + 2;
}

int kv_manager_free_slots(const struct kv_manager *mgr) { return mgr->pool->n_slot_free; }

int kv_manager_total_slots(const struct kv_manager *mgr)
{
    return kv_pool_windowed(mgr->pool) ? mgr->pool->window.n_blocks : 0;
}

void kv_manager_destroy(struct kv_manager *mgr)
{
    if (!mgr)
        return;
    /* the pool goes away with everything in it: nothing is kept in host memory now */
    if (mgr->tier)
        kv_tier_closing(mgr->tier);
    if (mgr->prefix)
        kv_prefix_clear(mgr->prefix);
    kv_tier_free(mgr->tier);
    kv_prefix_free(mgr->prefix);
    kv_pool_free(mgr->pool);
    free(mgr);
}

int kv_manager_prefix_enable(struct kv_manager *mgr, const struct kv_prefix_config *cfg,
                             struct err *err)
{
    if (mgr->pool->n_free != mgr->pool->cache.n_blocks)
        return err_set(err, INFERD_EINVAL, "the prefix cache is turned on before any block is used");
    if (mgr->prefix || cfg->max_bytes == 0)
        return 0;
    return kv_prefix_create(mgr->pool, mgr->block_bytes, cfg, &mgr->prefix, err);
}

bool kv_manager_prefix_enabled(const struct kv_manager *mgr) { return mgr->prefix != NULL; }

int kv_manager_tier_enable(struct kv_manager *mgr, const struct kv_tier_config *cfg,
                           struct err *err)
{
    if (!mgr->prefix)
        return err_set(err, INFERD_EINVAL, "the SSD tier needs the prefix cache (--prompt-cache > 0)");
    if (mgr->window)
        return err_set(err, INFERD_EINVAL, "the SSD tier stores blocks of every layer; this pool "
                       "keeps the sliding-window layers apart");
    if (mgr->tier)
        return 0;
    int rc = kv_tier_create(mgr->pool, mgr->prefix, mgr->block_bytes, cfg, &mgr->tier, err);
    if (rc == 0)
        kv_tier_set_manager(mgr->tier, mgr);
    return rc;
}

bool kv_manager_tier_enabled(const struct kv_manager *mgr) { return mgr->tier != NULL; }

void kv_manager_tier_poll(struct kv_manager *mgr, bool idle)
{
    if (mgr->tier)
        kv_tier_poll(mgr->tier, idle);
}

int kv_manager_tier_unsaved(const struct kv_manager *mgr)
{
    return mgr->tier ? kv_tier_unsaved(mgr->tier) : 0;
}

bool kv_manager_tier_busy(const struct kv_manager *mgr)
{
    return mgr->tier && kv_tier_busy(mgr->tier);
}

void kv_manager_tier_wait(struct kv_manager *mgr, int timeout_ms)
{
    if (mgr->tier)
        kv_tier_wait(mgr->tier, timeout_ms);
}

bool kv_manager_loading(const struct kv_manager *mgr, const struct kv_seq *seq)
{
    (void)mgr;
    return seq->n_loading > 0;
}

int kv_manager_tier_flush(struct kv_manager *mgr, int timeout_ms, struct err *err)
{
    if (!mgr->tier)
        return err_set(err, INFERD_EINVAL, "no SSD tier (--ssd-cache DIR)");
    return kv_tier_flush(mgr->tier, timeout_ms, err);
}

void kv_manager_tier_stats(const struct kv_manager *mgr, struct kv_tier_stats *out)
{
    if (mgr->tier)
        kv_tier_stats(mgr->tier, out);
    else
        memset(out, 0, sizeof *out);
}

void kv_seq_init(struct kv_seq *seq)
{
    memset(seq, 0, sizeof *seq);
    block_table_init(&seq->table);
    seq->chain_block = -1;
}

/* Every reference a sequence takes or drops goes through these two, so the
 * cache always knows which of its blocks only it still holds. */
static void block_retain(struct kv_manager *mgr, uint32_t block)
{
    kv_pool_retain(mgr->pool, block);
    if (mgr->prefix)
        kv_prefix_after_refcount(mgr->prefix, block);
}

static void block_release(struct kv_manager *mgr, uint32_t block)
{
    kv_pool_release(mgr->pool, block);
    if (mgr->prefix)
        kv_prefix_after_refcount(mgr->prefix, block);
}

/* ---- window slots (windowed pools) -------------------------------------- */

/* The first block a sequence of n_tokens positions keeps a slot for: the one
 * holding position n_tokens - window, what a query at n_tokens - 1 (the last
 * position again, after a truncation by one) sees first. */
static int window_from_of(const struct kv_manager *mgr, int n_tokens)
{
    int first = n_tokens - mgr->window;
    return first > 0 ? first / mgr->pool->cache.block_size : 0;
}

/* True when every block of blocks[window_from_of(n_tokens), n_blocks) has a slot. */
static bool window_complete(const struct kv_manager *mgr, const uint32_t *blocks, int n_blocks,
                            int n_tokens)
{
    for (int b = window_from_of(mgr, n_tokens); b < n_blocks; b++)
        if (mgr->pool->window_slot[blocks[b]] == KV_NO_SLOT)
            return false;
    return true;
}

/* Gives back seq's slot references of its blocks [from, to). */
static void slots_release(struct kv_manager *mgr, const struct kv_seq *seq, int from, int to)
{
    for (int b = from; b < to && b < seq->table.n_blocks; b++)
        kv_pool_slot_release(mgr->pool, seq->table.blocks[b]);
}

/* Lets go of the slots of blocks seq's window has passed. */
static void window_slide(struct kv_manager *mgr, struct kv_seq *seq)
{
    int from = window_from_of(mgr, seq->n_tokens);
    if (from > seq->window_from) {
        slots_release(mgr, seq, seq->window_from, from);
        seq->window_from = from;
    }
}

/* Free slots and those only the prefix cache holds: what make_slots can give. */
static int slots_available(const struct kv_manager *mgr)
{
    const struct kv_pool *pool = mgr->pool;
    int n = pool->n_slot_free;
    for (int b = 0; b < pool->cache.n_blocks; b++)
        n += pool->cache_slot[b] && pool->slot_refs[pool->window_slot[b]] == 1;
    return n;
}

/* Frees slots until n are free by taking back those only the prefix cache
 * holds (the least recently used first, one no longer cached before any).
 * False when the running sequences hold the rest. */
static bool make_slots(struct kv_manager *mgr, int n)
{
    struct kv_pool *pool = mgr->pool;
    while (pool->n_slot_free < n) {
        int64_t victim = -1;
        uint64_t oldest = UINT64_MAX;
        for (int b = 0; b < pool->cache.n_blocks; b++) {
            if (!pool->cache_slot[b] || pool->slot_refs[pool->window_slot[b]] != 1)
                continue;
            struct kv_prefix_entry e;
            uint64_t used = mgr->prefix && kv_prefix_entry(mgr->prefix, (uint32_t)b, &e)
                                ? e.used_ns + 1
                                : 0;
            if (used < oldest) {
                oldest = used;
                victim = b;
            }
        }
        /* evicting cached blocks would not help: a slot is held by sequences
         * or flagged as the cache's, and a block only the cache holds has no
         * sequence's slot reference */
        if (victim < 0)
            return false;
        pool->cache_slot[victim] = false;
        kv_pool_slot_release(pool, (uint32_t)victim);
    }
    return true;
}

/* Evicts unreferenced cached blocks until n blocks are free; false when the
 * cache has nothing more to give. */
static bool make_free(struct kv_manager *mgr, int n)
{
    while (mgr->pool->n_free < n)
        if (!mgr->prefix || !kv_prefix_evict_one(mgr->prefix))
            return false;
    return true;
}

static bool make_one_free(void *ctx) { return make_free(ctx, 1); }

/* Copies the first n slots of cached block src into a fresh block appended to
 * seq (copy on write: a shared block is never written). False when no block
 * or no copy op is to be had; seq is then unchanged. */
static bool attach_partial(struct kv_manager *mgr, struct kv_seq *seq, uint32_t src, int n)
{
    struct backend *be = mgr->pool->backend;
    struct kv_pool *pool = mgr->pool;
    struct err err = {0};
    if (!be->ops->kv_copy_slots || block_table_grow(&seq->table, seq->table.n_blocks + 1, &err) < 0)
        return false;
    if (mgr->window && pool->window_slot[src] == KV_NO_SLOT)
        return false; /* its window layers' K/V are gone */
    block_retain(mgr, src); /* so that making room cannot evict it */
    if (mgr->window)
        kv_pool_slot_retain(pool, src);
    uint32_t dst;
    bool ok = make_free(mgr, 1) && (!mgr->window || make_slots(mgr, 1)) &&
              kv_pool_alloc(pool, &dst, &err) == 0;
    if (ok && mgr->window && kv_pool_slot_alloc(pool, dst, &err) < 0) {
        kv_pool_release(pool, dst);
        ok = false;
    }
    if (ok) {
        if (pool->cache.n_layers > 0) /* a windowed pool may keep every layer in slots */
            be->ops->kv_copy_slots(be, &pool->cache, src, dst, n);
        if (mgr->window)
            be->ops->kv_copy_slots(be, &pool->window, pool->window_slot[src],
                                   pool->window_slot[dst], n);
        seq->table.blocks[seq->table.n_blocks++] = dst;
    }
    if (mgr->window)
        kv_pool_slot_release(pool, src);
    block_release(mgr, src);
    return ok;
}

int kv_manager_computed_blocks(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                               int n)
{
    if (!mgr->prefix || seq->table.n_blocks != 0 || n < 2)
        return seq->n_cached;
    int bs = mgr->pool->cache.block_size;
    struct err err = {0};
    int limit = n - 1; /* the last token is always computed, so its logits exist */
    if (block_table_grow(&seq->table, limit / bs + 1, &err) < 0)
        return seq->n_cached;
    int src = -1, m = 0;
    int n_found = kv_prefix_lookup(mgr->prefix, seq->ns, tokens, limit, seq->table.blocks, &src, &m);
    int n_full = n_found;
    /* a windowed pool: the longest prefix whose window has every slot */
    while (mgr->window && n_full > 0 && !window_complete(mgr, seq->table.blocks, n_full, n_full * bs))
        n_full--;
    if (n_full < n_found || (mgr->window && src >= 0 &&
                             !window_complete(mgr, seq->table.blocks, n_full, n_full * bs + m)))
        src = -1;
    for (int i = 0; i < n_full; i++)
        block_retain(mgr, seq->table.blocks[i]);
    seq->table.n_blocks = n_full;
    seq->window_from = 0;
    if (mgr->window) {
        seq->window_from = window_from_of(mgr, n_full * bs);
        for (int i = seq->window_from; i < n_full; i++)
            kv_pool_slot_retain(mgr->pool, seq->table.blocks[i]);
    }
    int reused = n_full * bs;
    /* where the chain ends in memory it may go on on disk */
    int n_disk = 0;
    if (mgr->tier) {
        uint64_t ns = kv_prefix_namespace_of(mgr->prefix, seq->ns);
        uint64_t h = n_full > 0 ? kv_prefix_block_hash(mgr->prefix, seq->table.blocks[n_full - 1])
                                : ns;
        n_disk = kv_tier_continue(mgr->tier, seq, tokens, limit, h, ns, make_one_free, mgr);
        reused += n_disk * bs;
    }
    if (n_disk == 0 && src >= 0 && attach_partial(mgr, seq, (uint32_t)src, m))
        reused += m;
    if (mgr->window && window_from_of(mgr, reused) > seq->window_from) {
        /* with the partial block copied the window starts later */
        int from = window_from_of(mgr, reused);
        slots_release(mgr, seq, seq->window_from, from);
        seq->window_from = from;
    }
    seq->n_tokens = seq->n_cached = reused;
    /* the attached full blocks are already in the cache under this chain */
    seq->n_published = 0;
    seq->chain_block = -1;
    kv_prefix_note_lookup(mgr->prefix, seq->session, reused);
    return reused;
}

/* Positions of seq whose K/V are really there: not those still being read. */
static int settled(const struct kv_manager *mgr, const struct kv_seq *seq, int n_computed)
{
    int bs = mgr->pool->cache.block_size;
    if (seq->n_loading > 0 && n_computed > seq->loading_from * bs)
        return seq->loading_from * bs;
    return n_computed;
}

/* The cache takes a reference to the slot of each of seq's cached blocks
 * that has one (while free slots last: make_slots takes them back first). */
static void cache_keep_slots(struct kv_manager *mgr, const struct kv_seq *seq)
{
    struct kv_pool *pool = mgr->pool;
    for (int b = seq->window_from; mgr->prefix && mgr->window && b < seq->table.n_blocks; b++) {
        uint32_t block = seq->table.blocks[b];
        struct kv_prefix_entry e;
        if (!pool->cache_slot[block] && pool->window_slot[block] != KV_NO_SLOT &&
            kv_prefix_entry(mgr->prefix, block, &e)) {
            kv_pool_slot_retain(pool, block);
            pool->cache_slot[block] = true;
        }
    }
}

void kv_manager_publish(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                        int n_computed)
{
    if (mgr->prefix) {
        kv_prefix_publish(mgr->prefix, seq, tokens, settled(mgr, seq, n_computed));
        cache_keep_slots(mgr, seq);
    }
}

void kv_manager_retire(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                       int n_computed)
{
    n_computed = settled(mgr, seq, n_computed);
    if (mgr->prefix) {
        kv_prefix_publish(mgr->prefix, seq, tokens, n_computed);
        kv_prefix_publish_partial(mgr->prefix, seq, tokens, n_computed);
    }
    /* the window of the last position included, so a prompt continuing the
     * sequence finds every slot it needs */
    cache_keep_slots(mgr, seq);
    kv_manager_free(mgr, seq);
}

int kv_manager_allocate_slots(struct kv_manager *mgr, struct kv_seq *seq, int n_new_tokens,
                              struct err *err)
{
    struct kv_pool *pool = mgr->pool;
    /* slots the window has passed go first (whatever else happens, nothing
     * will read them again) */
    if (mgr->window)
        window_slide(mgr, seq);
    int needed = kv_pool_blocks_for(pool, seq->n_tokens + n_new_tokens);
    int more = needed - seq->table.n_blocks;
    if (more > 0 && !make_free(mgr, more))
        return err_set(err, INFERD_ENOMEM,
                       "KV pool exhausted: %d more blocks wanted, %d of %d free", more,
                       pool->n_free, pool->cache.n_blocks);
    if (more > 0 && mgr->window &&
        (slots_available(mgr) < more || !make_slots(mgr, more) || pool->n_free < more))
        return err_set(err, INFERD_ENOMEM,
                       "KV window slots exhausted: %d more wanted, %d of %d free", more,
                       pool->n_slot_free, pool->window.n_blocks);
    int rc = block_table_grow(&seq->table, needed, err);
    if (rc < 0)
        return rc;
    /* Cannot fail: the free counts were checked above. */
    while (seq->table.n_blocks < needed) {
        uint32_t *b = &seq->table.blocks[seq->table.n_blocks++];
        kv_pool_alloc(pool, b, err);
        if (mgr->window)
            kv_pool_slot_alloc(pool, *b, err);
    }
    seq->n_tokens += n_new_tokens;
    return 0;
}

void kv_manager_truncate(struct kv_manager *mgr, struct kv_seq *seq, int n_tokens)
{
    if (n_tokens < 0)
        n_tokens = 0;
    if (n_tokens >= seq->n_tokens)
        return;
    int bs = mgr->pool->cache.block_size;
    if (mgr->window && window_from_of(mgr, n_tokens + 1) < seq->window_from) {
        /* the window of the next query (position n_tokens) reaches blocks
         * whose slots are gone: everything is computed again */
        kv_manager_free(mgr, seq);
        return;
    }
    int keep = kv_pool_blocks_for(mgr->pool, n_tokens);
    while (seq->table.n_blocks > keep) {
        uint32_t b = seq->table.blocks[--seq->table.n_blocks];
        if (mgr->window && seq->table.n_blocks >= seq->window_from)
            kv_pool_slot_release(mgr->pool, b);
        block_release(mgr, b);
    }
    /* The kept last block will be written from slot n_tokens % bs on: when
     * another holder shares it (the cache included), write a copy instead. */
    int tail = n_tokens % bs;
    if (tail > 0) {
        uint32_t last = seq->table.blocks[keep - 1];
        if (mgr->pool->refcount[last] > 1) {
            seq->table.n_blocks--;
            bool copied = attach_partial(mgr, seq, last, tail);
            if (mgr->window && keep - 1 >= seq->window_from)
                kv_pool_slot_release(mgr->pool, last);
            block_release(mgr, last);
            if (!copied) /* no block for the copy: drop the shared one's slots instead */
                n_tokens -= tail;
        }
    }
    seq->n_tokens = n_tokens;
    if (seq->n_cached > n_tokens)
        seq->n_cached = n_tokens;
    if (seq->n_published > n_tokens / bs) {
        seq->n_published = 0;
        seq->chain_block = -1;
    }
    if (mgr->prefix)
        kv_prefix_enforce_cap(mgr->prefix);
}

void kv_manager_free(struct kv_manager *mgr, struct kv_seq *seq)
{
    if (mgr->tier)
        kv_tier_forget(mgr->tier, seq);
    seq->n_loading = 0;
    if (mgr->window)
        slots_release(mgr, seq, seq->window_from, seq->table.n_blocks);
    seq->window_from = 0;
    for (int i = 0; i < seq->table.n_blocks; i++)
        block_release(mgr, seq->table.blocks[i]);
    free(seq->table.blocks);
    block_table_init(&seq->table);
    seq->n_tokens = 0;
    seq->n_cached = 0;
    seq->n_published = 0;
    seq->chain_block = -1;
    if (mgr->prefix)
        kv_prefix_enforce_cap(mgr->prefix);
}

int kv_manager_attach(struct kv_manager *mgr, struct kv_seq *seq, const uint32_t *blocks,
                      int n_blocks, struct err *err)
{
    if (seq->table.n_blocks != 0)
        return err_set(err, INFERD_EINVAL, "cached blocks attach only to an empty sequence");
    int n_tokens = n_blocks * mgr->pool->cache.block_size;
    if (mgr->window && !window_complete(mgr, blocks, n_blocks, n_tokens))
        return err_set(err, INFERD_EINVAL, "blocks in the window of the last of %d positions "
                       "have no window slots", n_tokens);
    int rc = block_table_grow(&seq->table, n_blocks, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < n_blocks; i++) {
        block_retain(mgr, blocks[i]);
        seq->table.blocks[i] = blocks[i];
    }
    seq->table.n_blocks = n_blocks;
    seq->n_tokens = seq->n_cached = n_tokens;
    seq->window_from = mgr->window ? window_from_of(mgr, n_tokens) : 0;
    for (int i = seq->window_from; mgr->window && i < n_blocks; i++)
        kv_pool_slot_retain(mgr->pool, blocks[i]);
    return 0;
}

int kv_manager_continue(struct kv_manager *mgr, struct kv_seq *dst, const struct kv_seq *src,
                        struct err *err)
{
    if (dst->table.n_blocks != 0)
        return err_set(err, INFERD_EINVAL, "cached blocks attach only to an empty sequence");
    int rc = block_table_grow(&dst->table, src->table.n_blocks, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < src->table.n_blocks; i++) {
        block_retain(mgr, src->table.blocks[i]);
        dst->table.blocks[i] = src->table.blocks[i];
    }
    dst->table.n_blocks = src->table.n_blocks;
    /* the window slots src holds, dst holds too */
    dst->window_from = src->window_from;
    if (mgr->window)
        for (int i = src->window_from; i < src->table.n_blocks; i++)
            kv_pool_slot_retain(mgr->pool, src->table.blocks[i]);
    dst->n_tokens = dst->n_cached = src->n_tokens;
    dst->n_published = src->n_published;
    dst->chain_block = src->chain_block;
    dst->chain_gen = src->chain_gen;
    dst->chain_hash = src->chain_hash;
    if (mgr->prefix)
        kv_prefix_note_lookup(mgr->prefix, dst->session, src->n_tokens);
    return 0;
}

int kv_manager_close_session(struct kv_manager *mgr, const char *session_id)
{
    return mgr->prefix ? kv_prefix_close_session(mgr->prefix, session_id) : -1;
}

void kv_manager_tick(struct kv_manager *mgr, uint64_t now_ns)
{
    if (mgr->prefix)
        kv_prefix_tick(mgr->prefix, now_ns);
}

void kv_manager_prefix_clear(struct kv_manager *mgr)
{
    if (mgr->prefix)
        kv_prefix_clear(mgr->prefix);
}

void kv_manager_prefix_stats(const struct kv_manager *mgr, struct kv_prefix_stats *out)
{
    if (mgr->prefix)
        kv_prefix_get_stats(mgr->prefix, out);
    else
        memset(out, 0, sizeof *out);
}

int kv_manager_free_blocks(const struct kv_manager *mgr) { return mgr->pool->n_free; }

int kv_manager_available_blocks(const struct kv_manager *mgr)
{
    return mgr->pool->n_free + (mgr->prefix ? kv_prefix_unreferenced_blocks(mgr->prefix) : 0);
}

int kv_manager_total_blocks(const struct kv_manager *mgr) { return mgr->pool->cache.n_blocks; }

int kv_manager_block_size(const struct kv_manager *mgr) { return mgr->pool->cache.block_size; }

int kv_manager_blocks_for(const struct kv_manager *mgr, int n_tokens)
{
    return kv_pool_blocks_for(mgr->pool, n_tokens);
}

struct kv_cache *kv_manager_cache(struct kv_manager *mgr) { return &mgr->pool->cache; }

struct kv_pool *kv_manager_pool(struct kv_manager *mgr) { return mgr->pool; }
