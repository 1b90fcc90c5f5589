/* kv/kv.h — the paged KV pool: fixed-size blocks, reference counts, per-sequence block tables. */
#ifndef INFERD_KV_KV_H
#define INFERD_KV_KV_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"
#include "model/model.h"

struct kv_pool {
    struct kv_cache cache;   /* storage; cache.k/v owned (backend memory) */
    struct backend *backend; /* borrowed */
    uint32_t *refcount;      /* owned; n_blocks */
    uint32_t *free_list;     /* owned; stack of free block ids */
    int n_free;
};

/* Sizes the pool for n_blocks blocks of block_size tokens for model m. */
int kv_pool_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                   struct kv_pool **out, struct err *err);
void kv_pool_free(struct kv_pool *pool);

/* Returns a block with refcount 1, or -INFERD_ENOMEM when none is free. */
int kv_pool_alloc(struct kv_pool *pool, uint32_t *block_out, struct err *err);
void kv_pool_retain(struct kv_pool *pool, uint32_t block);
void kv_pool_release(struct kv_pool *pool, uint32_t block);

/* A sequence's blocks in position order. */
struct block_table {
    uint32_t *blocks; /* owned; n_blocks used of cap */
    int n_blocks, cap;
};

void block_table_init(struct block_table *bt);
/* Grows bt with fresh blocks until it covers n_positions token positions. */
int block_table_reserve(struct kv_pool *pool, struct block_table *bt, int n_positions,
                        struct err *err);
/* Releases every block back to the pool and empties bt. */
void block_table_clear(struct kv_pool *pool, struct block_table *bt);

#endif
