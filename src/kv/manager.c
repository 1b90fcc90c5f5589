/* kv/manager.c — the engine's view of the KV cache: computed prefixes, slots for new tokens
 * (all or nothing), truncation and release, over the reference-counted pool. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

struct kv_manager {
    struct kv_pool *pool; /* owned */
};

int kv_manager_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                      struct kv_manager **out, struct err *err)
{
    struct kv_manager *mgr = calloc(1, sizeof *mgr);
    if (!mgr)
        return err_set(err, INFERD_ENOMEM, "out of memory for the KV manager");
    int rc = kv_pool_create(m, be, n_blocks, block_size, &mgr->pool, err);
    if (rc < 0) {
        free(mgr);
        return rc;
    }
    *out = mgr;
    return 0;
}

void kv_manager_destroy(struct kv_manager *mgr)
{
    if (!mgr)
        return;
    kv_pool_free(mgr->pool);
    free(mgr);
}

void kv_seq_init(struct kv_seq *seq)
{
    memset(seq, 0, sizeof *seq);
    block_table_init(&seq->table);
}

int kv_manager_computed_blocks(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                               int n)
{
    (void)mgr;
    (void)tokens;
    (void)n;
    return seq->n_cached;
}

/* Room in seq's table for n_blocks entries, without touching the pool. */
static int table_grow(struct block_table *bt, int n_blocks, struct err *err)
{
    if (n_blocks <= bt->cap)
        return 0;
    int cap = bt->cap ? bt->cap : 8;
    while (cap < n_blocks)
        cap *= 2;
    uint32_t *grown = realloc(bt->blocks, (size_t)cap * sizeof *grown);
    if (!grown)
        return err_set(err, INFERD_ENOMEM, "out of memory growing a block table");
    bt->blocks = grown;
    bt->cap = cap;
    return 0;
}

int kv_manager_allocate_slots(struct kv_manager *mgr, struct kv_seq *seq, int n_new_tokens,
                              struct err *err)
{
    struct kv_pool *pool = mgr->pool;
    int needed = kv_pool_blocks_for(pool, seq->n_tokens + n_new_tokens);
    int more = needed - seq->table.n_blocks;
    if (more > pool->n_free)
        return err_set(err, INFERD_ENOMEM,
                       "KV pool exhausted: %d more blocks wanted, %d of %d free", more,
                       pool->n_free, pool->cache.n_blocks);
    int rc = table_grow(&seq->table, needed, err);
    if (rc < 0)
        return rc;
    /* Cannot fail: the free count was checked above. */
    while (seq->table.n_blocks < needed)
        kv_pool_alloc(pool, &seq->table.blocks[seq->table.n_blocks++], err);
    seq->n_tokens += n_new_tokens;
    return 0;
}

void kv_manager_truncate(struct kv_manager *mgr, struct kv_seq *seq, int n_tokens)
{
    if (n_tokens < 0)
        n_tokens = 0;
    if (n_tokens >= seq->n_tokens)
        return;
    int keep = kv_pool_blocks_for(mgr->pool, n_tokens);
    while (seq->table.n_blocks > keep)
        kv_pool_release(mgr->pool, seq->table.blocks[--seq->table.n_blocks]);
    seq->n_tokens = n_tokens;
    if (seq->n_cached > n_tokens)
        seq->n_cached = n_tokens;
}

void kv_manager_free(struct kv_manager *mgr, struct kv_seq *seq)
{
    block_table_clear(mgr->pool, &seq->table);
    seq->n_tokens = 0;
    seq->n_cached = 0;
}

int kv_manager_attach(struct kv_manager *mgr, struct kv_seq *seq, const uint32_t *blocks,
                      int n_blocks, struct err *err)
{
    if (seq->table.n_blocks != 0)
        return err_set(err, INFERD_EINVAL, "cached blocks attach only to an empty sequence");
    int rc = table_grow(&seq->table, n_blocks, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < n_blocks; i++) {
        kv_pool_retain(mgr->pool, blocks[i]);
        seq->table.blocks[i] = blocks[i];
    }
    seq->table.n_blocks = n_blocks;
    seq->n_tokens = seq->n_cached = n_blocks * mgr->pool->cache.block_size;
    return 0;
}

int kv_manager_free_blocks(const struct kv_manager *mgr) { return mgr->pool->n_free; }

int kv_manager_total_blocks(const struct kv_manager *mgr) { return mgr->pool->cache.n_blocks; }

int kv_manager_block_size(const struct kv_manager *mgr) { return mgr->pool->cache.block_size; }

int kv_manager_blocks_for(const struct kv_manager *mgr, int n_tokens)
{
    return kv_pool_blocks_for(mgr->pool, n_tokens);
}

struct kv_cache *kv_manager_cache(struct kv_manager *mgr) { return &mgr->pool->cache; }

struct kv_pool *kv_manager_pool(struct kv_manager *mgr) { return mgr->pool; }
