/* backend/cpu/attn_f16.h — contract between the attention driver (attention.c) and the kernels of an f16 cache: the element conversions, and the decode kernel that reads each K and V row once for a whole GQA group (attn_f16_avx2.c, attn_f16_avx512.c, and the portable one in attn_f16.c); private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_ATTN_F16_H
#define INFERD_BACKEND_CPU_ATTN_F16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/attn_tiled.h"

/* Positions one online-softmax step scores (the chunk's scores of every head
 * of a group stay in L1). */
#define HATTN_CHUNK 64
/* Largest head_dim the group kernels take (the row kernel's, attend_one's). */
#define HATTN_MAX_HEAD_DIM 1024
/* Query heads of one group item at most, and their floats (heads x head_dim):
 * a larger group is dealt as several items of consecutive heads. */
#define HATTN_MAX_HEADS 16
#define HATTN_MAX_QUERY_FLOATS 8192

/* dst[i] = src[i] rounded to f16: to nearest even, saturating at +-65504 as
 * kvq_f32_to_f16 (backend/kv_quant.h) does; NaN stays a NaN. With f16c the
 * F16C instructions, else that scalar function: the same bits for every
 * value but NaN payloads. */
void cpu_f16_from_f32(uint16_t *dst, const float *src, size_t n, bool f16c);
/* dst[i] = src[i] widened to f32 (exact), F16C or kvq_f16_to_f32. */
void cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n, bool f16c);

/* One item of the group kernels: query rows [row, row + n_rows) (absolute, of
 * span sp; n_rows >= 1) of heads [head0, head0 + n_heads) of kv_head's group,
 * n_rows * n_heads at most HATTN_MAX_HEADS and that many times head_dim at
 * most HATTN_MAX_QUERY_FLOATS. Rows of one item read each K and V row once
 * for all of them (a speculative verify entry's rows, a short prompt chunk). */
struct hattn_item {
    const struct attn_span *sp;
    int row;
    int kv_head, head0, n_heads;
    int n_rows;
    /* kv heads [kv_head, kv_head + n_kv) (0 reads as 1), each with n_heads heads from head0 on:
     * then whole groups (head0 = kv_head * n_heads), n_rows * n_kv * n_heads at most
     * HATTN_MAX_HEADS and that many times head_dim at most HATTN_MAX_QUERY_FLOATS. Every kv
     * head's part of a slot row is read in the same pass, for the heads of each in turn. */
    int n_kv;
};

static inline int hattn_item_kv_heads(const struct hattn_item *it)
{
    return it->n_kv > 1 ? it->n_kv : 1;
}

/* Heads of a group one item takes: the whole group when it fits the limits
 * above, else the largest share that does. */
static inline int hattn_item_heads(int group, int head_dim)
{
    int cap = HATTN_MAX_QUERY_FLOATS / head_dim;
    cap = cap < HATTN_MAX_HEADS ? cap : HATTN_MAX_HEADS;
    return group < cap ? group : cap;
}

/* Rows one item of `heads` heads takes at most within the limits above. */
static inline int hattn_item_rows(int heads, int head_dim)
{
    int rows = HATTN_MAX_HEADS / heads, by_floats = HATTN_MAX_QUERY_FLOATS / (heads * head_dim);
    rows = rows < by_floats ? rows : by_floats;
    return rows > 1 ? rows : 1;
}

/* out of the item's heads = softmax(scale * q·Kᵀ over [first, last]) · V, as
 * backend_ops.attention states it, over an f16 cache (a->kv->dtype F16;
 * a->fixed_last is not read, the row's last position follows from its span):
 * the queries pre-scaled, HATTN_CHUNK positions at a time, each K row widened
 * once and dotted with every head of the item, an online softmax per head,
 * then each V row widened once and added into every head's accumulator, for
 * every row of the item at once (a row's positions past its own last one
 * weigh exactly nothing). The result depends on the row's own inputs and
 * position only, never on other rows, items or threads: a row gives the same
 * bits alone as among others. The AVX2 kernel needs head_dim % 8 == 0, the
 * AVX-512 one head_dim % 16 == 0, both F16C; the portable kernels take any
 * head_dim up to HATTN_MAX_HEAD_DIM, widening rows through cpu_f16_to_f32
 * with (f16c) or without F16C. */
void cpu_hattn_group_avx2(const struct tattn_args *a, const struct hattn_item *it);
void cpu_hattn_group_avx512(const struct tattn_args *a, const struct hattn_item *it);
void cpu_hattn_group_f16c(const struct tattn_args *a, const struct hattn_item *it);
void cpu_hattn_group_scalar(const struct tattn_args *a, const struct hattn_item *it);

#endif
