/* backend/cpu/attn_tiled.h — contract between the plain-cache attention driver (attention.c) and FAST mode's tiled prefill kernels (attn_tiled_avx2.c, attn_tiled_avx512.c); private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_ATTN_TILED_H
#define INFERD_BACKEND_CPU_ATTN_TILED_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Largest head_dim the tile kernels take (larger heads run the row kernel). */
#define TATTN_MAX_HEAD_DIM 256
/* Positions whose scores one pass computes: a multiple of every score
 * kernel's register block (16, 12, 6), so only a tile's last chunk has a tail. */
#define TATTN_CHUNK 96
/* Query vectors (rows x heads) of a tile: two vectors' lanes, the width of
 * the kernels' score blocks. */
#define TATTN_MAX_QUERIES_AVX2 16
#define TATTN_MAX_QUERIES_AVX512 32

/* Element offset of slot's row (all kv heads) of layer in block of a plain (f32 or f16) cache. */
static inline size_t tattn_slot_offset(const struct kv_cache *kv, int layer, uint32_t block,
                                       int slot)
{
    size_t kv_dim = (size_t)kv->n_kv_heads * kv->head_dim;
    return (((size_t)layer * kv->n_blocks + block) * kv->block_size + slot) * kv_dim;
}

/* One attention call (cpu_attention's arguments) over a plain cache. */
struct tattn_args {
    const float *q; /* n_rows x (n_heads * head_dim) */
    const struct kv_cache *kv;
    int layer;
    int n_heads;
    float scale;
    int sliding_window;
    float *out;     /* as q */
    /* >= 0: every query attends to positions [0, fixed_last] (dense attention without a
     * causal mask); -1: a row's last position follows from its span (causal) */
    int fixed_last;
};

/* A tile: query rows [row0, row0 + n_rows) of span sp (absolute rows of q,
 * consecutive positions) and heads [head0, head0 + n_heads) of kv_head's
 * group; n_rows * n_heads at most the kernel's TATTN_MAX_QUERIES_*. */
struct tattn_tile {
    const struct attn_span *sp;
    int row0, n_rows;
    int head0, n_heads;
    int kv_head;
};

/* out of the tile's queries = softmax(scale * q·Kᵀ, causal, windowed) · V,
 * as backend_ops.attention states it, in f32: the tile's queries against
 * TATTN_CHUNK positions at a time (score block, online softmax per query,
 * then the probabilities times V), so each K and V row read serves every
 * query of the tile. Over an f16 cache (kv->dtype F16) each chunk's rows are
 * widened to f32 with F16C first, then read as an f32 cache's. Sums run in a different order than the row kernel's,
 * so the results agree with it to float rounding, not bit for bit. The
 * AVX2 kernel needs head_dim % 8 == 0, the AVX-512 one head_dim % 16 == 0. */
void cpu_tattn_tile_avx2(const struct tattn_args *a, const struct tattn_tile *t);
void cpu_tattn_tile_avx512(const struct tattn_args *a, const struct tattn_tile *t);

#endif
