/* kv/kv.h — the paged KV cache: its block size, its element format, the pool of fixed-size
 * blocks with reference counts, and the narrow manager the engine schedules through. */
#ifndef INFERD_KV_KV_H
#define INFERD_KV_KV_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"
#include "model/model.h"

/* ---- layout ----------------------------------------------------------------
 * The cache is cut into blocks of block_size token positions. A sequence owns
 * a block table: position p of the sequence lives in slot p % block_size of
 * block table[p / block_size]. Blocks are shared between sequences by
 * reference count (a prefix found in a cache), so a table's blocks need not be
 * contiguous or distinct from another table's:
 *
 *     sequence A  table [ 7 | 2 | 9 ]      positions 0..47 (block_size 16)
 *     sequence B  table [ 7 | 4 ]          shares A's first 16 positions
 *     pool        refcount[7] = 2, refcount[2] = refcount[9] = refcount[4] = 1
 *
 * In memory (struct kv_cache, which the backend reads), element
 * (layer, block, slot, kv_head, d) of K is at
 *     k + ((layer * n_blocks + block) * block_size + slot) * kv_dim + kv_head * head_dim + d
 * with kv_dim = n_kv_heads * head_dim, each element kv_format.dtype; V likewise.
 * A format with scales (group_size > 0) would keep them beside the values;
 * none does today. */

/* The block size every cache is created with unless a caller asks otherwise.
 * Everything else reads the size from the pool or manager it holds. */
#define KV_BLOCK_SIZE_DEFAULT 16

/* Blocks of block_size positions that cover n_positions positions. */
static inline int kv_blocks_for(int n_positions, int block_size)
{
    return (n_positions + block_size - 1) / block_size;
}

enum kv_scale_layout {
    KV_SCALES_NONE = 0, /* values are stored as they are (f32, f16, bf16) */
};

/* How one K or V element is stored. */
struct kv_format {
    enum dtype dtype;            /* element type of the stored values */
    int group_size;              /* values sharing one scale; 0: no scales */
    enum kv_scale_layout scales; /* where the scales live; KV_SCALES_NONE when group_size is 0 */
    int scale_bytes;             /* bytes of one scale; 0 without scales */
};

/* The format of a cache whose elements are dtype (no scales). */
struct kv_format kv_format_of_dtype(enum dtype dtype);
/* Bytes of K and V together, over every layer, for one token position:
 *   2 * n_layers * (kv_dim * dtype_size + kv_dim / group_size * scale_bytes). */
size_t kv_format_bytes_per_token(const struct model_config *c, const struct kv_format *f);
/* kv_format_bytes_per_token * block_size: one block in every layer, K and V. */
size_t kv_format_bytes_per_block(const struct model_config *c, const struct kv_format *f,
                                 int block_size);

/* ---- pool ----------------------------------------------------------------- */

struct kv_pool {
    struct kv_cache cache;   /* storage; cache.k/v owned (backend memory) */
    struct kv_format format; /* derived from the backend's kv_dtype */
    struct backend *backend; /* borrowed */
    uint32_t *refcount;      /* owned; n_blocks */
    uint32_t *free_list;     /* owned; stack of free block ids */
    int n_free;
};

/* Sizes the pool for n_blocks blocks of block_size tokens for model m, in the
 * format of be->kv_dtype. */
int kv_pool_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                   struct kv_pool **out, struct err *err);
void kv_pool_free(struct kv_pool *pool);

/* Returns a block with refcount 1, or -INFERD_ENOMEM when none is free. */
int kv_pool_alloc(struct kv_pool *pool, uint32_t *block_out, struct err *err);
void kv_pool_retain(struct kv_pool *pool, uint32_t block);
void kv_pool_release(struct kv_pool *pool, uint32_t block);

/* Blocks that cover n_positions positions. */
int kv_pool_blocks_for(const struct kv_pool *pool, int n_positions);

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

/* ---- manager ---------------------------------------------------------------
 * What the engine asks of the cache, in the shape of a scheduler's KV manager:
 * how much of a sequence is already computed, slots for its next tokens (all
 * or nothing), and giving blocks back. */

/* One sequence's share of the cache. The first n_cached positions sit in
 * blocks that were found already computed (attached with a reference each,
 * possibly shared with other sequences, never written); slots for positions
 * [0, n_tokens) are allocated. */
struct kv_seq {
    struct block_table table;
    int n_tokens; /* positions with a slot: computed, or being computed this step */
    int n_cached; /* leading positions whose K/V came from a cache; <= n_tokens */
};

struct kv_manager;

/* A manager over a fresh pool of n_blocks blocks of block_size positions. */
int kv_manager_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                      struct kv_manager **out, struct err *err);
void kv_manager_destroy(struct kv_manager *mgr);

void kv_seq_init(struct kv_seq *seq);

/* How many leading tokens of tokens[0, n) already have K/V for seq: called as
 * a sequence is admitted, this is where a prefix cache attaches the blocks it
 * finds (kv_manager_attach). No cache is looked up yet, so the answer is what
 * seq already holds: 0 for an empty seq. */
int kv_manager_computed_blocks(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                               int n);

/* Slots for n_new_tokens positions after seq's n_tokens. Returns 0, or
 * -INFERD_ENOMEM when the pool (or memory for the table) cannot hold them:
 * then neither seq nor the pool has changed. */
int kv_manager_allocate_slots(struct kv_manager *mgr, struct kv_seq *seq, int n_new_tokens,
                              struct err *err);

/* Drops positions from n_tokens on; blocks no longer covering a position are
 * released (a shared block lives on in its other tables). */
void kv_manager_truncate(struct kv_manager *mgr, struct kv_seq *seq, int n_tokens);

/* Gives every block of seq back and empties it (it stays usable). */
void kv_manager_free(struct kv_manager *mgr, struct kv_seq *seq);

/* Appends blocks that already hold computed K/V (n_blocks full blocks, e.g.
 * found in a prefix cache) to the empty seq, one reference each; they count
 * as cached positions. Returns 0, -INFERD_EINVAL when seq is not empty, or
 * -INFERD_ENOMEM (seq unchanged). */
int kv_manager_attach(struct kv_manager *mgr, struct kv_seq *seq, const uint32_t *blocks,
                      int n_blocks, struct err *err);

/* Blocks nobody holds: what admission may count on. */
int kv_manager_free_blocks(const struct kv_manager *mgr);
int kv_manager_total_blocks(const struct kv_manager *mgr);
int kv_manager_block_size(const struct kv_manager *mgr);
/* Blocks that cover n_tokens positions. */
int kv_manager_blocks_for(const struct kv_manager *mgr, int n_tokens);
/* The storage the forward pass reads and writes. */
struct kv_cache *kv_manager_cache(struct kv_manager *mgr);
/* The pool underneath, for reference counts in tests and a future cache. */
struct kv_pool *kv_manager_pool(struct kv_manager *mgr);

#endif
