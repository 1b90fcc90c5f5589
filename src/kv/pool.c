/* kv/pool.c — fixed-size KV blocks: allocation, reference counts, and per-sequence block tables. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

#define KV_MAX_BLOCK_SIZE 256

/* Storage of n_layers layers of n_blocks blocks into c (k, v allocated). */
static int alloc_storage(struct backend *be, struct kv_cache *c, int n_layers, int n_blocks)
{
    /* no layer here (every layer in the window store): one row, never read */
    size_t rows = n_layers > 0 ? (size_t)n_layers * (size_t)c->block_size * (size_t)n_blocks : 1;
    c->n_layers = n_layers;
    c->n_blocks = n_blocks;
    c->k = be->ops->alloc(be, c->k_row_bytes * rows);
    c->v = be->ops->alloc(be, c->v_row_bytes * rows);
    return c->k && c->v ? 0 : -INFERD_ENOMEM;
}

static int pool_create(const struct model *m, struct backend *be, int n_blocks, int n_slots,
                       int block_size, struct kv_pool **out, struct err *err)
{
    if (block_size < 1 || block_size > KV_MAX_BLOCK_SIZE)
        return err_set(err, INFERD_ERANGE, "KV block size %d outside [1, %d]", block_size,
                       KV_MAX_BLOCK_SIZE);
    if (n_blocks < 1)
        return err_set(err, INFERD_ERANGE, "KV pool needs at least one block, got %d", n_blocks);
    const struct model_config *c = &m->config;
    struct kv_format format = kv_format_of_backend(be);
    int rc = kv_format_check(c, &format, err);
    if (rc < 0)
        return rc;
    int n_window = 0;
    for (int l = 0; n_slots > 0 && !format.quant && l < c->n_layers; l++)
        n_window += model_config_layer_windowed(c, l);
    if (n_slots > n_blocks)
        n_slots = n_blocks;
    if (n_window == 0)
        n_slots = 0;
    else if (n_slots < 1)
        return err_set(err, INFERD_ERANGE, "a windowed KV pool needs at least one slot");
    size_t k_row = kv_format_row_bytes(c, &format, false), v_row = kv_format_row_bytes(c, &format, true);
    struct kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return err_set(err, INFERD_ENOMEM, "out of memory creating the KV pool");
    pool->backend = be;
    pool->format = format;
    pool->cache = (struct kv_cache){
        .dtype = format.dtype,
        .block_size = block_size,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .quant = format.quant,
        .k_row_bytes = k_row,
        .v_row_bytes = v_row,
    };
    pool->window = pool->cache;
    rc = alloc_storage(be, &pool->cache, c->n_layers - n_window, n_blocks);
    pool->refcount = calloc((size_t)n_blocks, sizeof *pool->refcount);
    pool->free_list = malloc((size_t)n_blocks * sizeof *pool->free_list);
    bool ok = rc == 0 && pool->refcount && pool->free_list;
    if (ok && n_window > 0) {
        ok = alloc_storage(be, &pool->window, n_window, n_slots) == 0 &&
             (pool->window_slot = malloc((size_t)n_blocks * sizeof *pool->window_slot)) &&
             (pool->cache_slot = calloc((size_t)n_blocks, sizeof *pool->cache_slot)) &&
             (pool->slot_refs = calloc((size_t)n_slots, sizeof *pool->slot_refs)) &&
             (pool->slot_free = malloc((size_t)n_slots * sizeof *pool->slot_free)) &&
             (pool->layer_index = malloc((size_t)c->n_layers * sizeof *pool->layer_index));
    }
    if (!ok) {
        size_t bytes = (k_row + v_row) * (size_t)block_size *
                       ((size_t)(c->n_layers - n_window) * (size_t)n_blocks +
                        (size_t)n_window * (size_t)n_slots);
        kv_pool_free(pool);
        return err_set(err, INFERD_ENOMEM, "out of memory for a KV pool of %d blocks (%.1f MB)",
                       n_blocks, (double)bytes / 1e6);
    }
    /* lowest ids on top of the stack, so allocation order is predictable */
    for (int i = 0; i < n_blocks; i++)
        pool->free_list[i] = (uint32_t)(n_blocks - 1 - i);
    pool->n_free = n_blocks;
    if (n_window > 0) {
        for (int i = 0; i < n_blocks; i++)
            pool->window_slot[i] = KV_NO_SLOT;
        for (int i = 0; i < n_slots; i++)
            pool->slot_free[i] = (uint32_t)(n_slots - 1 - i);
        pool->n_slot_free = n_slots;
        for (int l = 0, g = 0, w = 0; l < c->n_layers; l++)
            pool->layer_index[l] = model_config_layer_windowed(c, l) ? -1 - w++ : g++;
        pool->cache.window = &pool->window;
        pool->cache.layer_index = pool->layer_index;
        pool->cache.window_slot = pool->window_slot;
        pool->cache.window_positions = c->sliding_window;
    } else {
        pool->window.n_blocks = 0;
    }
    *out = pool;
    return 0;
}

int kv_pool_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                   struct kv_pool **out, struct err *err)
{
    return pool_create(m, be, n_blocks, 0, block_size, out, err);
}

int kv_pool_create_windowed(const struct model *m, struct backend *be, int n_blocks, int n_slots,
                            int block_size, struct kv_pool **out, struct err *err)
{
    return pool_create(m, be, n_blocks, n_slots < 1 ? 1 : n_slots, block_size, out, err);
}

void kv_pool_free(struct kv_pool *pool)
{
    if (!pool)
        return;
    void *bufs[] = {pool->cache.k, pool->cache.v, pool->window.k, pool->window.v};
    for (int i = 0; i < 4; i++)
        if (bufs[i])
            pool->backend->ops->release(pool->backend, bufs[i]);
    free(pool->refcount);
    free(pool->free_list);
    free(pool->window_slot);
    free(pool->cache_slot);
    free(pool->slot_refs);
    free(pool->slot_free);
    free(pool->layer_index);
    free(pool);
}

int kv_pool_alloc(struct kv_pool *pool, uint32_t *block_out, struct err *err)
{
    if (pool->n_free == 0)
        return err_set(err, INFERD_ENOMEM, "KV pool exhausted: all %d blocks in use",
                       pool->cache.n_blocks);
    uint32_t block = pool->free_list[--pool->n_free];
    pool->refcount[block] = 1;
    *block_out = block;
    return 0;
}

void kv_pool_retain(struct kv_pool *pool, uint32_t block) { pool->refcount[block]++; }

static void slot_free(struct kv_pool *pool, uint32_t block)
{
    pool->slot_refs[pool->window_slot[block]] = 0;
    pool->slot_free[pool->n_slot_free++] = pool->window_slot[block];
    pool->window_slot[block] = KV_NO_SLOT;
    pool->cache_slot[block] = false;
}

void kv_pool_release(struct kv_pool *pool, uint32_t block)
{
    if (pool->refcount[block] > 0 && --pool->refcount[block] == 0) {
        /* a freed block never carries a slot into its next use */
        if (pool->window_slot && pool->window_slot[block] != KV_NO_SLOT)
            slot_free(pool, block);
        pool->free_list[pool->n_free++] = block;
    }
}

int kv_pool_slot_alloc(struct kv_pool *pool, uint32_t block, struct err *err)
{
    if (pool->n_slot_free == 0)
        return err_set(err, INFERD_ENOMEM, "KV window slots exhausted: all %d in use",
                       pool->window.n_blocks);
    uint32_t slot = pool->slot_free[--pool->n_slot_free];
    pool->slot_refs[slot] = 1;
    pool->window_slot[block] = slot;
    return 0;
}

void kv_pool_slot_retain(struct kv_pool *pool, uint32_t block)
{
    pool->slot_refs[pool->window_slot[block]]++;
}

void kv_pool_slot_release(struct kv_pool *pool, uint32_t block)
{
    uint32_t slot = pool->window_slot[block];
    if (slot != KV_NO_SLOT && pool->slot_refs[slot] > 0 && --pool->slot_refs[slot] == 0)
        slot_free(pool, block);
}

int kv_pool_blocks_for(const struct kv_pool *pool, int n_positions)
{
    return kv_blocks_for(n_positions, pool->cache.block_size);
}

void block_table_init(struct block_table *bt) { memset(bt, 0, sizeof *bt); }

int block_table_grow(struct block_table *bt, int n_blocks, struct err *err)
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

int block_table_reserve(struct kv_pool *pool, struct block_table *bt, int n_positions,
                        struct err *err)
{
    int needed = kv_pool_blocks_for(pool, n_positions);
    int rc = block_table_grow(bt, needed, err);
    if (rc < 0)
        return rc;
    while (bt->n_blocks < needed) {
        int rc = kv_pool_alloc(pool, &bt->blocks[bt->n_blocks], err);
        if (rc < 0)
            return rc;
        bt->n_blocks++;
    }
    return 0;
}

void block_table_clear(struct kv_pool *pool, struct block_table *bt)
{
    for (int i = 0; i < bt->n_blocks; i++)
        kv_pool_release(pool, bt->blocks[i]);
    free(bt->blocks);
    block_table_init(bt);
}
