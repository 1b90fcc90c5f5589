/* backend/cuda/lora.cu — the low-rank adapter ops on the GPU: the segmented shrink (u = A x) and expand (y += scale B u) of Punica's SGMV, for up to CU_LORA_MAX_GROUP ops over the same x at once (a layer's q/k/v or gate/up adapters), reading the step's segments from the parameter arena.
 *
 * Two launches a group, each a programmatic dependent of the launch before
 * it: a block reads its segment table and the adapter weights it multiplies
 * (never written by a step) while the launch before drains, and only then
 * waits for it and reads x, u or y. The shrink gives each item (segment,
 * tile of CU_LORA_TILE_ROWS rows, rank index k) one warp or a few (A's row
 * split into runs of about 2,048 columns): the whole row of A against x, so
 * u needs no second pass. The expand gives each (op, row, LORA_EXPAND
 * outputs) a block, LORA_OUT_PER_THREAD outputs a thread.
 *
 * The sums do not depend on the batch: u[t][k] is each lane's 16-byte words
 * of its run in order, a butterfly over the lanes, the runs in order (in
 * alone decides the runs); y[t][r] adds the segments covering t in order,
 * each B row times u in rank order, as a stack of adapters adds them.
 *
 * On an H200 (Llama-3.2-1B, 16 sequences, rank 16 on all seven projections)
 * a replayed step took 2,024 / 2,114 us with 1 / 16 distinct adapters
 * against 1,432 without: about 4.6 us a launch, the bytes of 16 adapters
 * (361 MB) about 80 us of it. */
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define LORA_THREADS 256
#define LORA_WARPS (LORA_THREADS / 32)
#define LORA_TILE_ROWS CU_LORA_TILE_ROWS
#define LORA_OUT_PER_THREAD 4                               /* outputs a thread expands */
#define LORA_EXPAND (LORA_THREADS * LORA_OUT_PER_THREAD)    /* outputs an expand block covers */
#define LORA_HELD 8           /* 16-byte words of A a lane loads before the wait */
#define LORA_B_HELD_WORDS 2   /* 16-byte words of a B row loaded before the wait, at most */
#define LORA_SEGS_SHARED 64   /* larger segment tables are read where they are */

static_assert(sizeof(struct cu_lora_seg) % sizeof(uint32_t) == 0, "a segment copies as words");

/* Elements of a 16-byte word of an adapter matrix: 8 bf16 or 4 f32. */
static __device__ __forceinline__ int lora_word_elems(int bf16) { return bf16 ? 8 : 4; }

/* Element j of a 16-byte word of an adapter matrix, widened exactly. */
static __device__ __forceinline__ float lora_word_at(uint4 w, int j, int bf16)
{
    uint32_t h[4] = {w.x, w.y, w.z, w.w};
    if (bf16)
        return __uint_as_float(j & 1 ? h[j >> 1] & 0xffff0000u : h[j >> 1] << 16);
    return __uint_as_float(h[j]);
}

static __device__ __forceinline__ float lora_at(const void *m, size_t i, int bf16)
{
    if (bf16)
        return __uint_as_float((uint32_t)__ldg((const uint16_t *)m + i) << 16);
    return __ldg((const float *)m + i);
}

/* The job's segment table, copied into shared memory by the whole block (one
 * round trip, not one a segment walked). */
static __device__ const struct cu_lora_seg *lora_segs(const uint8_t *params, uint32_t off, int n)
{
    __shared__ struct cu_lora_seg sm[LORA_SEGS_SHARED];
    const struct cu_lora_seg *segs = (const struct cu_lora_seg *)(params + off);
    if (n > LORA_SEGS_SHARED)
        return segs;
    constexpr int words = sizeof(struct cu_lora_seg) / sizeof(uint32_t);
    for (int i = threadIdx.x; i < n * words; i += LORA_THREADS)
        ((uint32_t *)sm)[i] = __ldg((const uint32_t *)segs + i);
    __syncthreads();
    return sm;
}

/* The job of a launch's block: the last whose first block is at most b. */
static __device__ __forceinline__ int lora_job_of(const struct cu_lora_group &g, unsigned b,
                                                  bool expand)
{
    int o = 0;
    while (o + 1 < g.n_jobs && b >= (expand ? g.job[o + 1].expand0 : g.job[o + 1].item0))
        o++;
    return o;
}

/* Warps an item of the shrink takes: A's row split into runs of about 2,048
 * columns, one a warp (in alone decides it, and so the order of the sums). */
static __host__ __device__ __forceinline__ int lora_item_warps(int64_t in)
{
    return in <= 2048 ? 1 : in <= 4096 ? 2 : in <= 8192 ? 4 : 8;
}

/* The shrink: per item (segment, tile of up to CU_LORA_TILE_ROWS rows, rank
 * index k), u[t][k] = row k of A against each row t of the tile. An item's
 * warps each take a run of A's row, a lane its 16-byte words in order; the
 * lanes' sums meet in a butterfly, the warps' in warp order. */
static __global__ void __launch_bounds__(LORA_THREADS)
lora_shrink_kernel(struct cu_lora_group g, const uint8_t *params, float *u)
{
    __shared__ float red[LORA_WARPS][LORA_TILE_ROWS];
    const int o = lora_job_of(g, blockIdx.x, false);
    const int n_segs = g.job[o].n_segs;
    const uint32_t u_base = g.job[o].u_base;
    const struct cu_lora_seg *segs = lora_segs(params, g.job[o].segs_off, n_segs);
    const int64_t in = g.in;
    const int wpi = lora_item_warps(in), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned item = (blockIdx.x - g.job[o].item0) * (LORA_WARPS / wpi) + warp / wpi;
    const int part = warp % wpi;
    const unsigned n_items = g.job[o].n_items;
    int i = 0; /* the last segment whose first item is at most item: item0 rises */
    for (int lo = 1, hi = n_segs - 1; lo <= hi;) {
        int mid = (lo + hi) / 2;
        if (segs[mid].item0 <= item)
            i = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    const bool live = item < n_items;
    const struct cu_lora_seg sg = segs[i];
    const unsigned local = item - sg.item0;
    const int k = live ? (int)(local % (unsigned)sg.rank) : 0;
    const int t0 = live ? (int)(local / (unsigned)sg.rank) * LORA_TILE_ROWS : 0;
    const int nt = !live ? 0 : sg.n_rows - t0 < LORA_TILE_ROWS ? sg.n_rows - t0 : LORA_TILE_ROWS;
    const size_t a0 = (size_t)k * (size_t)in;
    const int e = lora_word_elems(sg.bf16);
    const bool vec = in % 8 == 0 && ((uintptr_t)sg.a + a0 * (sg.bf16 ? 2 : 4)) % 16 == 0 &&
                     (uintptr_t)g.x % 16 == 0;
    /* this warp's run of words (vec) or of elements */
    const int64_t units = vec ? in / e : in;
    const int64_t per = (units + wpi - 1) / wpi;
    const int64_t w0 = part * per, w1 = w0 + per < units ? w0 + per : units;
    const uint4 *aw = (const uint4 *)((const uint8_t *)sg.a + a0 * (sg.bf16 ? 2 : 4));

    /* the weights first, while the launch before drains */
    uint4 held[LORA_HELD];
#pragma unroll
    for (int h = 0; h < LORA_HELD; h++) {
        int64_t w = w0 + h * 32 + lane;
        held[h] = vec && nt > 0 && w < w1 ? __ldg(aw + w) : make_uint4(0, 0, 0, 0);
    }
    pdl_release();
    pdl_wait();

    float acc[LORA_TILE_ROWS];
#pragma unroll
    for (int t = 0; t < LORA_TILE_ROWS; t++)
        acc[t] = 0.0f;
    const float *xr = g.x + (size_t)(sg.row0 + t0) * (size_t)in;
    if (vec && nt > 0) {
#pragma unroll 1
        for (int64_t wb = w0; wb < w1; wb += LORA_HELD * 32) {
#pragma unroll
            for (int h = 0; h < LORA_HELD; h++) {
                int64_t w = wb + h * 32 + lane;
                if (w >= w1)
                    break;
                uint4 a = wb == w0 ? held[h] : __ldg(aw + w);
#pragma unroll
                for (int t = 0; t < LORA_TILE_ROWS; t++) {
                    if (t < nt) {
                        const float4 *xp = (const float4 *)(xr + (size_t)t * (size_t)in + w * e);
                        float4 lo = __ldcg(xp);
                        acc[t] = fmaf(lora_word_at(a, 0, sg.bf16), lo.x, acc[t]);
                        acc[t] = fmaf(lora_word_at(a, 1, sg.bf16), lo.y, acc[t]);
                        acc[t] = fmaf(lora_word_at(a, 2, sg.bf16), lo.z, acc[t]);
                        acc[t] = fmaf(lora_word_at(a, 3, sg.bf16), lo.w, acc[t]);
                        if (sg.bf16) {
                            float4 hi = __ldcg(xp + 1);
                            acc[t] = fmaf(lora_word_at(a, 4, 1), hi.x, acc[t]);
                            acc[t] = fmaf(lora_word_at(a, 5, 1), hi.y, acc[t]);
                            acc[t] = fmaf(lora_word_at(a, 6, 1), hi.z, acc[t]);
                            acc[t] = fmaf(lora_word_at(a, 7, 1), hi.w, acc[t]);
                        }
                    }
                }
            }
        }
    } else if (nt > 0) {
        for (int64_t c = w0 + lane; c < w1; c += 32) {
            float a = lora_at(sg.a, a0 + (size_t)c, sg.bf16);
#pragma unroll
            for (int t = 0; t < LORA_TILE_ROWS; t++)
                if (t < nt)
                    acc[t] = fmaf(a, __ldcg(xr + (size_t)t * (size_t)in + c), acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < LORA_TILE_ROWS; t++) {
        float v = acc[t];
        for (int d = 16; d > 0; d >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, d);
        if (lane == 0)
            red[warp][t] = v;
    }
    __syncthreads();
    if (part == 0 && lane < nt) {
        float s = 0.0f;
        for (int p = 0; p < wpi; p++)
            s += red[warp + p][lane];
        u[u_base + sg.u_off + (uint32_t)((t0 + lane) * sg.rank + k)] = s;
    }
}

/* The expand: per (op, row t, LORA_EXPAND outputs), a thread's
 * LORA_OUT_PER_THREAD consecutive outputs r get y[t][r] += scale * B[r] u[t]
 * of every segment covering t, in order. */
static __global__ void __launch_bounds__(LORA_THREADS)
lora_expand_kernel(struct cu_lora_group g, const uint8_t *params, const float *u)
{
    __shared__ float us[LORA_MAX_RANK];
    const int o = lora_job_of(g, blockIdx.x, true);
    float *y = g.job[o].y;
    const int64_t out = g.job[o].out;
    const uint32_t u_base = g.job[o].u_base;
    const int n_segs = g.job[o].n_segs;
    const struct cu_lora_seg *segs = lora_segs(params, g.job[o].segs_off, n_segs);
    const unsigned local = blockIdx.x - g.job[o].expand0;
    const unsigned per_row = (unsigned)((out + LORA_EXPAND - 1) / LORA_EXPAND);
    const int t = (int)(local / per_row);
    const int64_t r0 = (int64_t)(local % per_row) * LORA_EXPAND +
                       (int64_t)threadIdx.x * LORA_OUT_PER_THREAD;

    /* the first covering segment's B rows, while the launch before drains */
    int first = 0;
    while (first < n_segs && (t < segs[first].row0 || t >= segs[first].row0 + segs[first].n_rows))
        first++;
    uint4 held[LORA_OUT_PER_THREAD][LORA_B_HELD_WORDS];
    bool have = false;
    if (first < n_segs) {
        const struct cu_lora_seg sg = segs[first];
        const int words = sg.rank / lora_word_elems(sg.bf16);
        const size_t row_bytes = (size_t)sg.b_stride * (sg.bf16 ? 2 : 4);
        have = sg.rank % lora_word_elems(sg.bf16) == 0 && words <= LORA_B_HELD_WORDS &&
               row_bytes % 16 == 0 && (uintptr_t)sg.b % 16 == 0;
#pragma unroll
        for (int q = 0; q < LORA_OUT_PER_THREAD; q++)
#pragma unroll
            for (int w = 0; w < LORA_B_HELD_WORDS; w++)
                held[q][w] = have && r0 + q < out && w < words
                                 ? __ldg((const uint4 *)((const uint8_t *)sg.b +
                                                         (size_t)(r0 + q) * row_bytes) + w)
                                 : make_uint4(0, 0, 0, 0);
    }
    pdl_release();
    pdl_wait();
    if (first == n_segs)
        return; /* no adapter on this row */

    float yv[LORA_OUT_PER_THREAD];
#pragma unroll
    for (int q = 0; q < LORA_OUT_PER_THREAD; q++)
        yv[q] = r0 + q < out ? y[(size_t)t * (size_t)out + (size_t)(r0 + q)] : 0.0f;
    for (int i = first; i < n_segs; i++) {
        if (t < segs[i].row0 || t >= segs[i].row0 + segs[i].n_rows)
            continue;
        const struct cu_lora_seg sg = segs[i];
        __syncthreads(); /* the previous segment's us is read */
        for (int k = threadIdx.x; k < sg.rank; k += LORA_THREADS)
            us[k] = __ldcg(u + u_base + sg.u_off + (size_t)(t - sg.row0) * (size_t)sg.rank + k);
        __syncthreads();
#pragma unroll
        for (int q = 0; q < LORA_OUT_PER_THREAD; q++) {
            if (r0 + q >= out)
                continue;
            float v = 0.0f;
            if (i == first && have) {
                const int e = lora_word_elems(sg.bf16);
#pragma unroll
                for (int w = 0; w < LORA_B_HELD_WORDS; w++)
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (j < e && w * e + j < sg.rank)
                            v = fmaf(lora_word_at(held[q][w], j, sg.bf16), us[w * e + j], v);
            } else {
                const size_t b0 = (size_t)(r0 + q) * (size_t)sg.b_stride;
                for (int k = 0; k < sg.rank; k++)
                    v = fmaf(lora_at(sg.b, b0 + (size_t)k, sg.bf16), us[k], v);
            }
            yv[q] += sg.scale * v;
        }
    }
#pragma unroll
    for (int q = 0; q < LORA_OUT_PER_THREAD; q++)
        if (r0 + q < out)
            y[(size_t)t * (size_t)out + (size_t)(r0 + q)] = yv[q];
}

void cu_lora_group_of(const struct cu_op *ops, int n_ops, struct cu_lora_group *g)
{
    memset(g, 0, sizeof *g);
    g->x = ops[0].u.lora.x;
    g->in = ops[0].u.lora.in;
    g->n_jobs = n_ops;
    const unsigned items_per_block = LORA_WARPS / (unsigned)lora_item_warps(g->in);
    uint32_t u_base = 0;
    for (int i = 0; i < n_ops; i++) {
        const struct cu_op *op = &ops[i];
        struct cu_lora_job *j = &g->job[i];
        j->y = op->u.lora.y;
        j->out = op->u.lora.out;
        j->n_segs = op->u.lora.n_segs;
        j->segs_off = op->u.lora.segs_off;
        j->u_base = u_base;
        j->n_items = op->u.lora.n_items;
        j->item0 = g->n_shrink;
        j->expand0 = g->n_expand;
        u_base += op->u.lora.u_floats;
        g->n_shrink += (op->u.lora.n_items + items_per_block - 1) / items_per_block;
        g->n_expand +=
            (unsigned)op->n_rows * (unsigned)((j->out + LORA_EXPAND - 1) / LORA_EXPAND);
    }
}

/* Both launch as programmatic dependents: 2,108 against 2,310 us a replayed
 * step of Llama-3.2-1B, 16 sequences over 16 rank-16 adapters (H200). */
cudaError_t cu_launch_lora_shrink(const struct cu_device *dev, cudaStream_t s,
                                  const struct cu_lora_group *g, const uint8_t *params,
                                  void *work)
{
    return cu_launch_dependent(dev->pdl, lora_shrink_kernel, dim3(g->n_shrink),
                               dim3(LORA_THREADS), 0, s, *g, params, (float *)work);
}

cudaError_t cu_launch_lora_expand(const struct cu_device *dev, cudaStream_t s,
                                  const struct cu_lora_group *g, const uint8_t *params,
                                  const void *work)
{
    return cu_launch_dependent(dev->pdl, lora_expand_kernel, dim3(g->n_expand),
                               dim3(LORA_THREADS), 0, s, *g, params, (const float *)work);
}
