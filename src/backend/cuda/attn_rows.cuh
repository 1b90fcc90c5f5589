/* backend/cuda/attn_rows.cuh — what the decode attention kernels share: a step's spans and row map as they lie in the launch parameters, the positions a decode row attends to, a position's place in the paged cache, the layout of split partials. */
#ifndef INFERD_BACKEND_CUDA_ATTN_ROWS_CUH
#define INFERD_BACKEND_CUDA_ATTN_ROWS_CUH

#include "backend/cuda/record.h"

/* Floats per split partial of one query head: m, l, two unused, acc[hd]
 * (16-byte aligned). */
#define PART_STRIDE(hd) ((hd) + 4)

/* Element offset of position pos's K (or V) row in a layer of the paged cache, from the
 * sequence's block table bt. */
static __device__ __forceinline__ size_t slot_offset(const struct cu_kv *kv, int layer,
                                                     const uint32_t *bt, int pos)
{
    /* a power-of-two block size (the usual) by shifts: the division's
     * instructions stand between a position and its block table load */
    const int bs = kv->block_size;
    int bi, bo;
    if ((bs & (bs - 1)) == 0) {
        bi = pos >> (__ffs(bs) - 1);
        bo = pos & (bs - 1);
    } else {
        bi = pos / bs;
        bo = pos % bs;
    }
    uint32_t block = bt[bi];
    return (((size_t)layer * kv->n_blocks + block) * bs + bo) *
           ((size_t)kv->n_kv_heads * kv->head_dim);
}

struct span_view {
    const struct cu_span *spans;
    const int *rowmap;
};

static __device__ __forceinline__ struct span_view spans_at(const uint8_t *params, uint32_t off,
                                                            int n_spans)
{
    struct span_view v;
    v.spans = (const struct cu_span *)(params + off);
    v.rowmap = (const int *)(v.spans + n_spans);
    return v;
}

/* The positions row attends to, [*first, *last], and its block table;
 * false for a row no span covers. */
static __device__ __forceinline__ bool decode_row(const struct cu_op &op, const uint8_t *params,
                                                  int row, int *first, int *last,
                                                  const uint32_t **bt)
{
    struct span_view sv = spans_at(params, op.u.attn.spans_off, op.u.attn.n_spans);
    if (sv.rowmap[row] < 0)
        return false;
    const struct cu_span *sp = &sv.spans[sv.rowmap[row]];
    *bt = (const uint32_t *)(params + sp->bt_off);
    *last = sp->pos0 + (row - sp->row0);
    *first = 0;
    if (op.u.attn.window > 0 && *last - op.u.attn.window + 1 > 0)
        *first = *last - op.u.attn.window + 1;
    return true;
}

/* Row row's span: its first position this step (*new0), its first row and
 * its last (rows are the span's positions in order). */
static __device__ __forceinline__ void decode_row_span(const struct cu_op &op,
                                                       const uint8_t *params, int row, int *new0,
                                                       int *row0, int *last_row)
{
    struct span_view sv = spans_at(params, op.u.attn.spans_off, op.u.attn.n_spans);
    const struct cu_span *sp = &sv.spans[sv.rowmap[row]];
    *new0 = sp->pos0;
    *row0 = sp->row0;
    *last_row = sp->row0 + sp->n_tokens - 1;
}

/* A decode row's positions [first, last], its block table, and the part of
 * them split attends to, [begin, end], of the row's active splits s_first ..
 * s_first + n_active - 1 (a split holds ctx_bucket / n_splits positions). */
struct decode_split {
    const uint32_t *bt;
    int first, last, begin, end, s_first, n_active;
};

/* False for a row no span covers, or a split with none of its positions. */
static __device__ __forceinline__ bool decode_split_of(const struct cu_op &op,
                                                       const uint8_t *params, int row, int split,
                                                       int n_splits, struct decode_split *d)
{
    if (!decode_row(op, params, row, &d->first, &d->last, &d->bt))
        return false;
    const int chunk = (op.u.attn.ctx_bucket + n_splits - 1) / n_splits;
    d->s_first = d->first / chunk;
    d->n_active = d->last / chunk - d->s_first + 1;
    if (split < d->s_first || split >= d->s_first + d->n_active)
        return false;
    d->begin = split * chunk > d->first ? split * chunk : d->first;
    d->end = split * chunk + chunk - 1 < d->last ? split * chunk + chunk - 1 : d->last;
    return true;
}

#endif
