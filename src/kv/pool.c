/* kv/pool.c — fixed-size KV blocks: allocation, reference counts, and per-sequence block tables. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

#define KV_MAX_BLOCK_SIZE 256

int kv_pool_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                   struct kv_pool **out, struct err *err)
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
    size_t k_row = kv_format_row_bytes(c, &format, false), v_row = kv_format_row_bytes(c, &format, true);
    size_t k_bytes = k_row * (size_t)c->n_layers * (size_t)block_size * (size_t)n_blocks;
    size_t v_bytes = v_row * (size_t)c->n_layers * (size_t)block_size * (size_t)n_blocks;
    struct kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return err_set(err, INFERD_ENOMEM, "out of memory creating the KV pool");
    pool->backend = be;
    pool->format = format;
    pool->cache = (struct kv_cache){
        .n_layers = c->n_layers,
        .n_blocks = n_blocks,
        .dtype = format.dtype,
        .block_size = block_size,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .quant = format.quant,
        .k_row_bytes = k_row,
        .v_row_bytes = v_row,
    };
    pool->cache.k = be->ops->alloc(be, k_bytes);
    pool->cache.v = be->ops->alloc(be, v_bytes);
    pool->refcount = calloc((size_t)n_blocks, sizeof *pool->refcount);
    pool->free_list = malloc((size_t)n_blocks * sizeof *pool->free_list);
    if (!pool->cache.k || !pool->cache.v || !pool->refcount || !pool->free_list) {
        kv_pool_free(pool);
        return err_set(err, INFERD_ENOMEM, "out of memory for a KV pool of %d blocks (%.1f MB)",
                       n_blocks, (double)(k_bytes + v_bytes) / 1e6);
    }
    /* lowest ids on top of the stack, so allocation order is predictable */
    for (int i = 0; i < n_blocks; i++)
        pool->free_list[i] = (uint32_t)(n_blocks - 1 - i);
    pool->n_free = n_blocks;
    *out = pool;
    return 0;
}

void kv_pool_free(struct kv_pool *pool)
{
    if (!pool)
        return;
    if (pool->cache.k)
        pool->backend->ops->release(pool->backend, pool->cache.k);
    if (pool->cache.v)
        pool->backend->ops->release(pool->backend, pool->cache.v);
    free(pool->refcount);
    free(pool->free_list);
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

void kv_pool_release(struct kv_pool *pool, uint32_t block)
{
    if (pool->refcount[block] > 0 && --pool->refcount[block] == 0)
        pool->free_list[pool->n_free++] = block;
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
