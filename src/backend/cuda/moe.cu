/* backend/cuda/moe.cu — mixture-of-experts on the GPU: routing (softmax + torch.topk's choice) a block per row, and the chosen experts' SwiGLU MLPs read by the ids routing left in device memory: expert GEMVs with 16-byte loads (every mode), a grouped tensor-core GEMM (FAST mode, many rows), and the first warp-per-output kernels, kept for comparison.
 *
 * Nothing crosses to the host: the expert ids stay where routing wrote
 * them and the experts' matrices are found through a pointer table in the
 * step's parameter arena, so a step stays capturable into a graph (no launch
 * depends on a count the host would have to read). An expert no row chose
 * is never read.
 *
 * The GEMVs: each (pair, output) is one warp's dot product, lanes taking
 * 8-column chunks lane, lane + 32, ... in column order, then a fixed
 * butterfly; a row's terms are added in ascending
 * expert id, each product and sum rounded to f32 on its own (no fused
 * multiply-add). Which rows share a launch changes which kernel runs (a row
 * alone, rows grouped by expert so an expert's weights are read once for all
 * of them) but never those operations, so EXACT mode's batch invariance
 * holds bit for bit.
 *
 * A step of fewer than CU_MOE_SHARE_MIN_ROWS rows (decode) runs the row
 * kernels: gate/up a block per (pair, 8 outputs), then down a block per (row,
 * 8 outputs) over the row's experts with their weighted sum, which under fuse
 * rule 8 it adds into the residual: a decode layer's experts are two launches
 * after the routing one, with no add launch of their own.
 *
 * The grouped GEMM (FAST mode, from CU_MOE_GEMM_MIN_ROWS rows): a plan
 * kernel sorts the (row, expert) pairs by expert (stable) and cuts each
 * expert's run into tiles of rows; gate and up run as one GEMM over the
 * gathered bf16 rows of x with silu(g) * u in the epilogue (h rounded to
 * bf16, as FAST mode's down projection would round it), down as a second
 * GEMM writing each pair's output, and a last kernel adds each row's pairs
 * in ascending expert order. Every launch's grid is sized for the worst
 * case; blocks past the plan's tile count leave at once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <mma.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/moe_route.h"
#include "backend/cuda/warp.cuh"

static __global__ void moe_route_kernel(const float *logits, int n_rows, int n_experts, int top_k,
                                        int norm, int32_t *ids, float *weights)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows)
        return;
    struct moe_pair scratch[MOE_MAX_EXPERTS];
    moe_route_row(logits + (size_t)r * n_experts, n_experts, top_k, norm != 0, scratch,
                  ids + (size_t)r * top_k, weights + (size_t)r * top_k);
}

/* The same choice as moe_route_row, a block per row: the max, the exps and
 * the products by 1 / sum element by element, the sums (of the exps, of the
 * chosen p) in moe_route_row's order by one thread. When the k-th and the
 * (k+1)-th largest p differ, every selection algorithm picks the same k, so
 * the chosen set is the experts with fewer than k larger p, placed by p
 * descending and then id, which moe_route_row's last sort gives too; a row
 * with ties across that boundary (or a NaN) goes through moe_route_row
 * itself on one thread, where the replay of libstdc++'s order decides. Same
 * bits either way; the serial kernel above stays for --cuda-moe off. Each
 * thread ranks its experts against all n: a block's threads share the
 * n x n comparisons, which one warp alone took ~10 us over for 128 experts. */
#define ROUTE_THREADS 128

/* A block's shared memory for routing one row: the probabilities and ranks,
 * or moe_route_row's scratch on the serial way. */
struct route_smem {
    union {
        struct {
            float p[MOE_MAX_EXPERTS];
            int rank[MOE_MAX_EXPERTS];
        } par;
        struct moe_pair scratch[MOE_MAX_EXPERTS];
    } u;
    int chosen[CU_MOE_MAX_TOP_K];
    float warp_max[32];
    float sum;
    int n_in;
};

/* Routes the row of logits l with all of the block's threads (every thread
 * calls it): ri[0..k) and wi[0..k) (shared or global memory) are
 * moe_route_row's choice, written and visible to every thread on return. */
static __device__ void route_row_block(const float *l, int n, int k, int norm,
                                       struct route_smem *sm, int32_t *ri, float *wi)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x;
    float *p = sm->u.par.p;
    int *rank = sm->u.par.rank;
    float mx = -INFINITY;
    bool nan = false;
    for (int e = tid; e < n; e += nt) {
        float v = l[e];
        p[e] = v;
        mx = v > mx ? v : mx;
        nan = nan || isnan(v);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = v > mx ? v : mx;
    }
    if (lane == 0)
        sm->warp_max[warp] = mx;
    if (tid == 0)
        sm->n_in = 0;
    bool serial = __syncthreads_or(nan) || k > CU_MOE_MAX_TOP_K;
    if (!serial) {
        for (int w = 0; w < nt / 32; w++)
            mx = sm->warp_max[w] > mx ? sm->warp_max[w] : mx;
        for (int e = tid; e < n; e += nt)
            p[e] = expf(p[e] - mx);
        __syncthreads();
        if (tid == 0) {
            float sum = 0;
            for (int e = 0; e < n; e++)
                sum += p[e];
            sm->sum = sum;
        }
        __syncthreads();
        float inv = 1.0f / sm->sum;
        for (int e = tid; e < n; e += nt)
            p[e] *= inv;
        __syncthreads();
        int in = 0;
        for (int e = tid; e < n; e += nt) {
            float pe = p[e];
            int above = 0, tied = 0;
            for (int j = 0; j < n; j++) {
                float pj = p[j];
                above += pj > pe;
                tied += pj == pe && j < e;
            }
            rank[e] = above < k ? above + tied : -1;
            in += above < k;
        }
        for (int o = 16; o > 0; o >>= 1)
            in += __shfl_xor_sync(0xffffffffu, in, o);
        if (lane == 0 && in)
            atomicAdd(&sm->n_in, in);
        __syncthreads();
        serial = sm->n_in != k;
        if (!serial) {
            for (int e = tid; e < n; e += nt)
                if (rank[e] >= 0)
                    sm->chosen[rank[e]] = e;
            __syncthreads();
            if (tid == 0) {
                float total = 0;
                for (int i = 0; i < k; i++)
                    total += p[sm->chosen[i]];
                sm->sum = total;
            }
            __syncthreads();
            for (int i = tid; i < k; i += nt) {
                int e = sm->chosen[i];
                ri[i] = e;
                wi[i] = norm ? p[e] / sm->sum : p[e];
            }
        }
    }
    __syncthreads(); /* the ranks and probabilities are read: scratch may reuse them */
    if (serial && tid == 0)
        moe_route_row(l, n, k, norm != 0, sm->u.scratch, ri, wi);
    __syncthreads();
}

static __global__ void __launch_bounds__(ROUTE_THREADS)
moe_route_block_kernel(const float *logits, int n_rows, int n_experts, int top_k, int norm,
                       int32_t *ids, float *weights)
{
    __shared__ struct route_smem sm;
    const int r = blockIdx.x;
    pdl_wait();
    pdl_release();
    if (r >= n_rows)
        return;
    route_row_block(logits + (size_t)r * n_experts, n_experts, top_k, norm, &sm,
                    ids + (size_t)r * top_k, weights + (size_t)r * top_k);
}

cudaError_t cu_launch_moe_route(const struct cu_device *dev, cudaStream_t s,
                                const struct cu_op *op, bool parallel)
{
    if (parallel) {
        return cu_launch_dependent(dev->pdl, moe_route_block_kernel, dim3((unsigned)op->n_rows),
                                   dim3(ROUTE_THREADS), 0, s, op->u.route.logits, op->n_rows,
                                   op->u.route.n_experts, op->u.route.top_k, op->u.route.norm,
                                   op->u.route.ids, op->u.route.weights);
    }
    int threads = 32, blocks = (op->n_rows + threads - 1) / threads;
    moe_route_kernel<<<blocks, threads, 0, s>>>(op->u.route.logits, op->n_rows,
                                                 op->u.route.n_experts, op->u.route.top_k,
                                                 op->u.route.norm, op->u.route.ids,
                                                 op->u.route.weights);
    return cudaGetLastError();
}

/* ---- the first kernels (--cuda-moe off): a warp per output, an element per lane ---- */

#define MOE_WARPS 8

static __device__ __forceinline__ float round_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return x;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

/* Element c of row of a matrix of dtype (bf16 or f32). */
static __device__ __forceinline__ float legacy_w_at(const void *row, int64_t c, int bf16)
{
    return bf16 ? __uint_as_float((uint32_t)((const uint16_t *)row)[c] << 16)
                : ((const float *)row)[c];
}

/* sum over c of w[c] * x[c], lanes striding the columns, then a fixed tree. */
static __device__ __forceinline__ float legacy_warp_dot(const void *w, const float *x, int64_t cols,
                                                 int bf16, bool rnd)
{
    int lane = threadIdx.x & 31;
    float acc = 0;
    for (int64_t c = lane; c < cols; c += 32) {
        float xv = rnd ? round_bf16(x[c]) : x[c];
        acc = fmaf(legacy_w_at(w, c, bf16), xv, acc);
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

/* h[p, o] = silu(gate[e] x[r]) * up[e] x[r] for pair p = (row r, slot j),
 * e = ids[p]; one warp per (p, o). */
static __global__ void legacy_gate_up_kernel(const float *x, int64_t hidden, int64_t inter, int top_k,
                                          int n_experts, const void *const *mats,
                                          const int32_t *ids, int bf16, int rnd, float *h)
{
    int64_t o = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    int p = blockIdx.y;
    if (o >= inter)
        return;
    int e = ids[p];
    size_t esz = bf16 ? 2 : 4;
    const uint8_t *g = (const uint8_t *)mats[e] + (size_t)o * hidden * esz;
    const uint8_t *u = (const uint8_t *)mats[n_experts + e] + (size_t)o * hidden * esz;
    const float *xr = x + (size_t)(p / top_k) * hidden;
    float gv = legacy_warp_dot(g, xr, hidden, bf16, rnd != 0);
    float uv = legacy_warp_dot(u, xr, hidden, bf16, rnd != 0);
    if ((threadIdx.x & 31) == 0)
        h[(size_t)p * inter + o] = gv / (1.0f + expf(-gv)) * uv;
}

/* y[r, o] = sum over the row's experts in ascending id of w * down[e][o] . h[p];
 * one warp per (r, o). */
static __global__ void legacy_down_kernel(const float *h, int64_t hidden, int64_t inter, int top_k,
                                       int n_experts, const void *const *mats, const int32_t *ids,
                                       const float *weights, int bf16, int rnd, float *y)
{
    int64_t o = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    int r = blockIdx.y;
    if (o >= hidden)
        return;
    size_t esz = bf16 ? 2 : 4;
    const int32_t *ri = ids + (size_t)r * top_k;
    float acc = 0;
    int32_t done = -1;
    for (int k = 0; k < top_k; k++) {
        int best = -1;
        for (int j = 0; j < top_k; j++)
            if (ri[j] > done && (best < 0 || ri[j] < ri[best]))
                best = j;
        done = ri[best];
        const uint8_t *d = (const uint8_t *)mats[2 * n_experts + done] + (size_t)o * inter * esz;
        float dv = legacy_warp_dot(d, h + ((size_t)r * top_k + best) * inter, inter, bf16, rnd != 0);
        float term = weights[(size_t)r * top_k + best] * dv;
        acc += term;
    }
    if ((threadIdx.x & 31) == 0)
        y[(size_t)r * hidden + o] = acc;
}

static cudaError_t launch_legacy(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                 bool round)
{
    const void *const *mats = (const void *const *)(params + op->u.moe.mats_off);
    int bf16 = op->u.moe.dtype == DTYPE_BF16;
    int64_t hidden = op->u.moe.hidden, inter = op->u.moe.inter;
    int k = op->u.moe.top_k;
    float *h = op->u.moe.scratch;
    dim3 g1((unsigned)((inter + MOE_WARPS - 1) / MOE_WARPS), (unsigned)(op->n_rows * k));
    legacy_gate_up_kernel<<<g1, 32 * MOE_WARPS, 0, s>>>(op->u.moe.x, hidden, inter, k,
                                                     op->u.moe.n_experts, mats, op->u.moe.ids,
                                                     bf16, round, h);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((hidden + MOE_WARPS - 1) / MOE_WARPS), (unsigned)op->n_rows);
    legacy_down_kernel<<<g2, 32 * MOE_WARPS, 0, s>>>(h, hidden, inter, k, op->u.moe.n_experts, mats,
                                                  op->u.moe.ids, op->u.moe.weights, bf16, round,
                                                  op->u.moe.y);
    return cudaGetLastError();
}


/* ---- shared pieces ------------------------------------------------------- */

#define MV_THREADS 256
#define MV_WARPS (MV_THREADS / 32)
/* rows of one expert staged together by the grouped GEMVs */
#define MV_GROUP_ROWS 4
/* the plan kernel: one block; thread e holds expert e (MOE_MAX_EXPERTS at most) */
#define PLAN_THREADS 512

static __device__ __forceinline__ float4 round4(float4 v)
{
    v.x = round_bf16(v.x);
    v.y = round_bf16(v.y);
    v.z = round_bf16(v.z);
    v.w = round_bf16(v.w);
    return v;
}

/* Chunk c (8 columns) of a weight row: one 16-byte load of bf16, two of f32. */
template <bool BF16>
static __device__ __forceinline__ void load_chunk(const uint4 *row, int c, bool live, uint4 *w)
{
    if (BF16) {
        w[0] = live ? load_stream(row + c) : make_uint4(0, 0, 0, 0);
    } else {
        w[0] = live ? load_stream(row + 2 * c) : make_uint4(0, 0, 0, 0);
        w[1] = live ? load_stream(row + 2 * c + 1) : make_uint4(0, 0, 0, 0);
    }
}

/* sum over the chunk's 8 columns in order of w[i] * x[i], fused multiply-adds from 0. */
template <bool BF16>
static __device__ __forceinline__ float dot8(const uint4 *w, const float x[8])
{
    float s = 0.0f;
    if (BF16) {
        uint32_t v[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s = fmaf(__uint_as_float(v[i] << 16), x[2 * i], s);
            s = fmaf(__uint_as_float(v[i] & 0xffff0000u), x[2 * i + 1], s);
        }
    } else {
        uint32_t v[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            s = fmaf(__uint_as_float(v[i]), x[i], s);
    }
    return s;
}

/* A staged vector of n8 chunks: the low halves of its chunks, then the high
 * halves, so a warp reading chunks lane, lane + 32, ... reads consecutive
 * float4s (no bank conflicts). */
static __device__ __forceinline__ void stage_vec(float4 *dst, const float *src, int n8, bool round,
                                                 int i)
{
    float4 v = __ldg((const float4 *)src + i);
    dst[(i & 1) * n8 + (i >> 1)] = round ? round4(v) : v;
}

static __device__ __forceinline__ void staged_x8(const float4 *v, int n8, int c, float x[8])
{
    float4 lo = v[c], hi = v[n8 + c];
    x[0] = lo.x; x[1] = lo.y; x[2] = lo.z; x[3] = lo.w;
    x[4] = hi.x; x[5] = hi.y; x[6] = hi.z; x[7] = hi.w;
}

static __device__ __forceinline__ float silu_mul1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* Where the pairs of a plan live (int32 arrays in the op's scratch):
 *   hdr[0]        active experts (some pair chose them); hdr[1] tiles
 *   act_e[a]      the a-th active expert, ascending
 *   act_start[a]  its first position in sorted; act_start[n_active] = n_pairs
 *   sorted[pos]   pair ids grouped by expert ascending, pair order within
 *   where[pair]   its position in sorted
 *   tiles[3t..]   tile t: expert, first position, rows (bm at most) */
struct moe_plan {
    int *hdr, *act_e, *act_start, *sorted, *where, *tiles;
};

static size_t plan_max_tiles(int64_t n_pairs, int n_experts, int bm)
{
    if (bm <= 0)
        return 0;
    int64_t active = n_pairs < n_experts ? n_pairs : n_experts;
    return (size_t)((n_pairs + bm - 1) / bm + active);
}

/* Ints of a plan, and the plan laid out from base when base is not NULL. */
static size_t plan_ints(int64_t n_pairs, int n_experts, int bm, int *base, struct moe_plan *p)
{
    size_t at = 0;
    size_t hdr = at;
    at += 4;
    size_t act_e = at;
    at += (size_t)n_experts;
    size_t act_start = at;
    at += (size_t)n_experts + 1;
    size_t sorted = at;
    at += (size_t)n_pairs;
    size_t where = at;
    at += (size_t)n_pairs;
    size_t tiles = at;
    at += 3 * plan_max_tiles(n_pairs, n_experts, bm);
    if (base) {
        p->hdr = base + hdr;
        p->act_e = base + act_e;
        p->act_start = base + act_start;
        p->sorted = base + sorted;
        p->where = base + where;
        p->tiles = base + tiles;
    }
    return at;
}

/* Exclusive prefix sum of v over the block (PLAN_THREADS threads); tmp holds
 * a warp's worth of ints. */
static __device__ int block_excl_scan(int v, int *tmp)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NW = PLAN_THREADS / 32;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    if (lane == 31)
        tmp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = lane < NW ? tmp[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o)
                s += y;
        }
        if (lane < NW)
            tmp[lane] = s;
    }
    __syncthreads();
    int r = (warp > 0 ? tmp[warp - 1] : 0) + x - v;
    __syncthreads();
    return r;
}

/* One block: counts the pairs of each expert, numbers the active experts and
 * the tiles of bm rows (bm 0: none), then places the pairs, a round of
 * PLAN_THREADS at a time; within a round a pair's place among its expert's
 * is its rank in its warp (__match_any_sync) after the earlier warps' counts,
 * so the order within an expert is the pairs' order. */
static __global__ void __launch_bounds__(PLAN_THREADS)
moe_plan_kernel(const int32_t *ids, int n_pairs, int n_experts, int bm, struct moe_plan p)
{
    extern __shared__ int plan_sm[]; /* cnt, base: n_experts each; tag: NW x n_experts */
    __shared__ int scan_tmp[32];
    constexpr int NW = PLAN_THREADS / 32;
    int *cnt = plan_sm, *base = plan_sm + n_experts, *tag = plan_sm + 2 * n_experts;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    pdl_wait();
    pdl_release();
    for (int e = tid; e < n_experts; e += PLAN_THREADS)
        cnt[e] = 0;
    for (int i = tid; i < NW * n_experts; i += PLAN_THREADS)
        tag[i] = -1;
    __syncthreads();
    for (int q = tid; q < n_pairs; q += PLAN_THREADS)
        atomicAdd(&cnt[ids[q]], 1);
    __syncthreads();
    int c = tid < n_experts ? cnt[tid] : 0;
    int n_tiles = bm > 0 ? (c + bm - 1) / bm : 0;
    int start = block_excl_scan(c, scan_tmp);
    int slot = block_excl_scan(c > 0 ? 1 : 0, scan_tmp);
    int tile0 = block_excl_scan(n_tiles, scan_tmp);
    if (tid < n_experts) {
        base[tid] = start;
        if (c > 0) {
            p.act_e[slot] = tid;
            p.act_start[slot] = start;
        }
        for (int i = 0; i < n_tiles; i++) {
            int *t = p.tiles + 3 * (tile0 + i);
            t[0] = tid;
            t[1] = start + i * bm;
            t[2] = c - i * bm < bm ? c - i * bm : bm;
        }
        if (tid == n_experts - 1) {
            int active = slot + (c > 0 ? 1 : 0);
            p.hdr[0] = active;
            p.hdr[1] = tile0 + n_tiles;
            p.act_start[active] = n_pairs;
        }
    }
    __syncthreads();
    for (int r0 = 0, round = 0; r0 < n_pairs; r0 += PLAN_THREADS, round++) {
        int q = r0 + tid;
        bool live = q < n_pairs;
        int e = live ? ids[q] : -1;
        unsigned peers = __match_any_sync(0xffffffffu, e);
        int rank = __popc(peers & ((1u << lane) - 1u));
        if (live && rank == 0)
            tag[warp * n_experts + e] = round * 64 + __popc(peers);
        __syncthreads();
        if (live) {
            int pos = base[e] + rank;
            for (int w = 0; w < warp; w++) {
                int t = tag[w * n_experts + e];
                if (t >= 0 && t / 64 == round)
                    pos += t % 64;
            }
            p.sorted[pos] = q;
            p.where[q] = pos;
        }
        __syncthreads();
        if (tid < n_experts) {
            int add = 0;
            for (int w = 0; w < NW; w++) {
                int t = tag[w * n_experts + tid];
                if (t >= 0 && t / 64 == round)
                    add += t % 64;
            }
            base[tid] += add;
        }
        __syncthreads();
    }
}

/* ---- the expert GEMVs ---------------------------------------------------- */

struct moe_gemv_args {
    const float *x;
    int64_t hidden, inter;
    int n_rows, top_k, n_experts;
    const void *const *mats; /* device: gate[n], up[n], down[n] */
    const int32_t *ids;
    const float *weights;
    int round;  /* FAST: x and h rounded to bf16 as they are staged */
    int planned; /* the grouped kernels (blockIdx.y an active expert of plan), else the row ones */
    struct moe_plan plan;
    float *h;   /* n_pairs x inter, by pair */
    float *out; /* n_pairs x hidden, by pair: each pair's down projection, unweighted */
    float *y;
    float *resid; /* not NULL: each row's sum is added into resid instead of written to y */
    int x_early; /* the launch right before is routing's: x may be read before the wait */
};

/* The pairs a grouped block serves: those of active expert blockIdx.y of
 * the plan. False when the plan has fewer experts. */
static __device__ __forceinline__ bool block_pairs(const struct moe_gemv_args &a, int *e,
                                                   const int **list, int *cnt)
{
    int slot = blockIdx.y;
    if (slot >= a.plan.hdr[0])
        return false;
    *e = a.plan.act_e[slot];
    int p0 = a.plan.act_start[slot];
    *cnt = a.plan.act_start[slot + 1] - p0;
    *list = a.plan.sorted + p0;
    return true;
}

/* Expert e's gate and up rows o (row 0 when not live), read U chunks a lane
 * at a time: chunks cb + k * 32 + lane, k < U, as far as n8. */
template <bool BF16>
struct gate_up_rows {
    const uint4 *g, *u;
    bool live;
    __device__ gate_up_rows(const struct moe_gemv_args &a, int e, int64_t o, bool live_)
        : live(live_)
    {
        const size_t row_bytes = (size_t)a.hidden * (BF16 ? 2 : 4);
        g = (const uint4 *)((const uint8_t *)a.mats[e] + (live ? o : 0) * row_bytes);
        u = (const uint4 *)((const uint8_t *)a.mats[a.n_experts + e] + (live ? o : 0) * row_bytes);
    }
    template <int U, int NV>
    __device__ void issue(int cb, int lane, int n8, uint4 (&wg)[U][NV], uint4 (&wu)[U][NV]) const
    {
#pragma unroll
        for (int k = 0; k < U; k++) {
            int c = cb + k * 32 + lane;
            load_chunk<BF16>(g, c, live && c < n8, wg[k]);
            load_chunk<BF16>(u, c, live && c < n8, wu[k]);
        }
    }
};

/* h[p, o] = silu(gate[e] . x[r]) * (up[e] . x[r]) for the pair p =
 * blockIdx.y alone (row r = p / top_k, expert e = ids[p]), a warp per output
 * o, lanes taking U chunks a round (U changes no sum's order). With x_early,
 * x is staged before the wait for the launch before (the routing launch): the
 * launch that wrote x ended before that one began. Otherwise the launch
 * before may be the one that wrote x (the router's matmul writes the normed
 * x when the RMSNorm is folded into it). */
template <bool BF16, int U, int MIN_BLOCKS = 1>
static __global__ void __launch_bounds__(MV_THREADS, MIN_BLOCKS)
moe_gate_up_row_gemv(struct moe_gemv_args a)
{
    extern __shared__ float4 xs[]; /* the row's hidden floats */
    constexpr int NV = BF16 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n8 = (int)(a.hidden / 8);
    const int64_t o = (int64_t)blockIdx.x * MV_WARPS + warp;
    const int pair = blockIdx.y, k = a.top_k, r = pair / k;
    const float *xr = a.x + (int64_t)r * a.hidden;
    if (a.x_early)
        for (int i = threadIdx.x; i < 2 * n8; i += MV_THREADS)
            stage_vec(xs, xr, n8, a.round != 0, i);
    pdl_wait();
    pdl_release();
    if (!a.x_early)
        for (int i = threadIdx.x; i < 2 * n8; i += MV_THREADS)
            stage_vec(xs, xr, n8, a.round != 0, i);
    const int e = a.ids[pair];
    const bool live = o < a.inter;
    const struct gate_up_rows<BF16> rows(a, e, o, live);
    uint4 wg[U][NV], wu[U][NV];
    auto issue = [&](int cb) { rows.template issue<U>(cb, lane, n8, wg, wu); };
    issue(0);
    __syncthreads();
    if (!live)
        return;
    float ag = 0.0f, au = 0.0f;
    for (int cb = 0;;) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            int c = cb + k * 32 + lane;
            if (c < n8) {
                float xv[8];
                staged_x8(xs, n8, c, xv);
                ag += dot8<BF16>(wg[k], xv);
                au += dot8<BF16>(wu[k], xv);
            }
        }
        cb += 32 * U;
        if (cb >= n8)
            break;
        issue(cb);
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane == 0)
        a.h[(int64_t)pair * a.inter + o] = silu_mul1(ag, au);
}

/* h[p, o] = silu(gate[e] . x[p / top_k]) * (up[e] . x[p / top_k]) for the
 * block's pairs p (expert e), a warp per output o, RT of the pairs' x rows
 * staged at a time. */
template <bool BF16, int RT>
static __global__ void __launch_bounds__(MV_THREADS) moe_gate_up_gemv(struct moe_gemv_args a)
{
    extern __shared__ float4 xs[]; /* RT rows of hidden floats */
    constexpr int U = 4, NV = BF16 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n8 = (int)(a.hidden / 8);
    const int64_t o = (int64_t)blockIdx.x * MV_WARPS + warp;
    pdl_wait();
    pdl_release();
    int e, cnt;
    const int *list;
    if (!block_pairs(a, &e, &list, &cnt))
        return;
    const bool live = o < a.inter;
    const struct gate_up_rows<BF16> rows(a, e, o, live);
    uint4 wg[U][NV], wu[U][NV];
    auto issue = [&](int cb) { rows.template issue<U>(cb, lane, n8, wg, wu); };
    for (int g0 = 0; g0 < cnt; g0 += RT) {
        const int nr = cnt - g0 < RT ? cnt - g0 : RT;
        /* the first weights go out before x is staged */
        issue(0);
        __syncthreads(); /* the last group's x is read */
        for (int i = threadIdx.x; i < nr * 2 * n8; i += MV_THREADS) {
            int t = i / (2 * n8), r = i - t * 2 * n8;
            const float *xr = a.x + (int64_t)(list[g0 + t] / a.top_k) * a.hidden;
            stage_vec(xs + t * 2 * n8, xr, n8, a.round != 0, r);
        }
        __syncthreads();
        if (!live)
            continue;
        float ag[RT], au[RT];
#pragma unroll
        for (int t = 0; t < RT; t++)
            ag[t] = au[t] = 0.0f;
        for (int cb = 0;;) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                int c = cb + k * 32 + lane;
                if (c < n8) {
#pragma unroll
                    for (int t = 0; t < RT; t++) {
                        if (t < nr) {
                            float xv[8];
                            staged_x8(xs + t * 2 * n8, n8, c, xv);
                            ag[t] += dot8<BF16>(wg[k], xv);
                            au[t] += dot8<BF16>(wu[k], xv);
                        }
                    }
                }
            }
            cb += 32 * U;
            if (cb >= n8)
                break;
            issue(cb);
        }
#pragma unroll
        for (int t = 0; t < RT; t++) {
            ag[t] = warp_sum(ag[t]);
            au[t] = warp_sum(au[t]);
        }
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < RT; t++)
                if (t < nr)
                    a.h[(int64_t)list[g0 + t] * a.inter + o] = silu_mul1(ag[t], au[t]);
    }
}

/* out[p, o] = down[e][o] . h[p] for the block's pairs p (planned), a warp
 * per output o, RT pairs' h staged at a time. */
template <bool BF16, int RT>
static __global__ void __launch_bounds__(MV_THREADS) moe_down_gemv(struct moe_gemv_args a)
{
    extern __shared__ float4 hs[]; /* RT rows of inter floats */
    constexpr int U = 4, NV = BF16 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n8 = (int)(a.inter / 8);
    const int64_t o = (int64_t)blockIdx.x * MV_WARPS + warp;
    pdl_wait();
    pdl_release();
    int e, cnt;
    const int *list;
    if (!block_pairs(a, &e, &list, &cnt))
        return;
    const bool live = o < a.hidden;
    const size_t row_bytes = (size_t)a.inter * (BF16 ? 2 : 4);
    const uint4 *d =
        (const uint4 *)((const uint8_t *)a.mats[2 * a.n_experts + e] + (live ? o : 0) * row_bytes);
    uint4 wd[U][NV];
    auto issue = [&](int cb) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            int c = cb + k * 32 + lane;
            load_chunk<BF16>(d, c, live && c < n8, wd[k]);
        }
    };
    for (int g0 = 0; g0 < cnt; g0 += RT) {
        const int nr = cnt - g0 < RT ? cnt - g0 : RT;
        issue(0);
        __syncthreads();
        for (int i = threadIdx.x; i < nr * 2 * n8; i += MV_THREADS) {
            int t = i / (2 * n8), r = i - t * 2 * n8;
            stage_vec(hs + t * 2 * n8, a.h + (int64_t)list[g0 + t] * a.inter, n8, a.round != 0, r);
        }
        __syncthreads();
        if (!live)
            continue;
        float acc[RT];
#pragma unroll
        for (int t = 0; t < RT; t++)
            acc[t] = 0.0f;
        for (int cb = 0;;) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                int c = cb + k * 32 + lane;
                if (c < n8) {
#pragma unroll
                    for (int t = 0; t < RT; t++) {
                        if (t < nr) {
                            float hv[8];
                            staged_x8(hs + t * 2 * n8, n8, c, hv);
                            acc[t] += dot8<BF16>(wd[k], hv);
                        }
                    }
                }
            }
            cb += 32 * U;
            if (cb >= n8)
                break;
            issue(cb);
        }
#pragma unroll
        for (int t = 0; t < RT; t++)
            acc[t] = warp_sum(acc[t]);
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < RT; t++)
                if (t < nr)
                    a.out[(int64_t)list[g0 + t] * a.hidden + o] = acc[t];
    }
}

/* The row's slots in ascending expert id (top_k <= CU_MOE_MAX_TOP_K). */
static __device__ __forceinline__ void ascending_slots(const int32_t *ri, int top_k, int *ord)
{
    int32_t done = -1;
    for (int k = 0; k < top_k; k++) {
        int best = -1;
        for (int j = 0; j < top_k; j++)
            if (ri[j] > done && (best < 0 || ri[j] < ri[best]))
                best = j;
        done = ri[best];
        ord[k] = best;
    }
}

/* y[r, o] = sum over row r's experts in ascending id of w * (down[e][o] . h[p]),
 * a warp per output o, the row's top_k h vectors staged: the down GEMV and
 * the sum in one launch, for steps whose rows take their experts alone; with
 * resid, y is not written and the sum is added into resid (the layer's
 * residual add). G experts' loads are in flight at once, the first G's issued
 * before the wait for the launch before (gate/up): the ids and weights were
 * written by a launch that ended before that one began. */
template <bool BF16, int G>
static __global__ void __launch_bounds__(MV_THREADS) moe_down_row_gemv(struct moe_gemv_args a)
{
    extern __shared__ float4 hs[]; /* top_k rows of inter floats, by slot */
    __shared__ int ord[CU_MOE_MAX_TOP_K];
    __shared__ const uint8_t *mat[CU_MOE_MAX_TOP_K];
    __shared__ float wsel[CU_MOE_MAX_TOP_K];
    constexpr int U = 4, NV = BF16 ? 1 : 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n8 = (int)(a.inter / 8), k = a.top_k;
    const int r = blockIdx.y;
    const int64_t o = (int64_t)blockIdx.x * MV_WARPS + warp;
    const bool live = o < a.hidden;
    const size_t row_bytes = (size_t)a.inter * (BF16 ? 2 : 4);
    const int32_t *ri = a.ids + (int64_t)r * k;
    const float *wr = a.weights + (int64_t)r * k;
    /* each slot's place in ascending expert id, its down matrix and its weight */
    if (threadIdx.x < k) {
        const int t = threadIdx.x, id = ri[t];
        int place = 0;
        for (int j = 0; j < k; j++)
            place += ri[j] < id || (ri[j] == id && j < t);
        ord[place] = t;
        mat[t] = (const uint8_t *)a.mats[2 * a.n_experts + id];
        wsel[t] = wr[t];
    }
    __syncthreads();
    uint4 w[G][U][NV];
    auto issue = [&](int kk, int cb) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const bool on = live && kk + g < k;
            const uint4 *d = on ? (const uint4 *)(mat[ord[kk + g]] + o * row_bytes) : NULL;
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = cb + u * 32 + lane;
                load_chunk<BF16>(d, c, on && c < n8, w[g][u]);
            }
        }
    };
    issue(0, 0);
    pdl_wait();
    pdl_release();
    for (int i = threadIdx.x; i < k * 2 * n8; i += MV_THREADS) {
        int j = i / (2 * n8), c = i - j * 2 * n8;
        stage_vec(hs + j * 2 * n8, a.h + ((int64_t)r * k + j) * a.inter, n8, a.round != 0, c);
    }
    __syncthreads();
    if (!live)
        return;
    float acc = 0.0f;
    for (int kk = 0; kk < k; kk += G) {
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++)
            s[g] = 0.0f;
        for (int cb = 0;;) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = cb + u * 32 + lane;
                if (c < n8) {
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        if (kk + g < k) {
                            float hv[8];
                            staged_x8(hs + ord[kk + g] * 2 * n8, n8, c, hv);
                            s[g] += dot8<BF16>(w[g][u], hv);
                        }
                    }
                }
            }
            cb += 32 * U;
            if (cb >= n8)
                break;
            issue(kk, cb);
        }
        if (kk + G < k)
            issue(kk + G, 0);
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (kk + g < k) {
                float t = warp_sum(s[g]);
                acc = __fadd_rn(acc, __fmul_rn(wsel[ord[kk + g]], t));
            }
        }
    }
    if (lane == 0) {
        const int64_t at = (int64_t)r * a.hidden + o;
        if (a.resid)
            a.resid[at] = __fadd_rn(a.resid[at], acc);
        else
            a.y[at] = acc;
    }
}

/* y[r, :] = sum over row r's experts in ascending id of w * out[pos(p), :],
 * pos the plan's where (NULL: out is by pair), or with resid that sum added
 * into resid instead; a block per row, 4 columns a thread. */
static __global__ void __launch_bounds__(256)
moe_combine_kernel(const float *out, const int *where, const int32_t *ids, const float *weights,
                   int top_k, int64_t hidden, float *y, float *resid)
{
    __shared__ int ord[CU_MOE_MAX_TOP_K];
    const int r = blockIdx.x;
    pdl_wait();
    pdl_release();
    const int32_t *ri = ids + (int64_t)r * top_k;
    if (threadIdx.x == 0)
        ascending_slots(ri, top_k, ord);
    __syncthreads();
    for (int64_t c = (int64_t)threadIdx.x * 4; c < hidden; c += 4 * 256) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int k = 0; k < top_k; k++) {
            int64_t p = (int64_t)r * top_k + ord[k];
            int64_t pos = where ? where[p] : p;
            float w = weights[p];
            float4 v = *(const float4 *)(out + pos * hidden + c);
            acc.x = __fadd_rn(acc.x, __fmul_rn(w, v.x));
            acc.y = __fadd_rn(acc.y, __fmul_rn(w, v.y));
            acc.z = __fadd_rn(acc.z, __fmul_rn(w, v.z));
            acc.w = __fadd_rn(acc.w, __fmul_rn(w, v.w));
        }
        if (resid) {
            float4 *z = (float4 *)(resid + (int64_t)r * hidden + c), v = *z;
            *z = make_float4(__fadd_rn(v.x, acc.x), __fadd_rn(v.y, acc.y), __fadd_rn(v.z, acc.z),
                             __fadd_rn(v.w, acc.w));
        } else {
            *(float4 *)(y + (int64_t)r * hidden + c) = acc;
        }
    }
}

/* ---- the grouped GEMM (FAST mode, tensor cores) ----------------------------
 *
 * Floor, Qwen3-30B-A3B shape (hidden 2048, moe_intermediate 768, top-8):
 * FLOPs per token and layer 2 * 3 * 8 * 768 * 2048 = 75.5 MFLOP, so a
 * 4096-token chunk is 309 GFLOP per layer (14.8 TFLOP over 48 layers); at
 * 128 experts every expert's weights are read once per chunk (1.2 GB per
 * layer), far under the compute at H200 rates. */

#define GM_BN 128 /* B rows per tile: down's outputs, or 64 gate + 64 up rows */
#define GM_BK 32
#define GM_LDS (GM_BK + 8) /* bf16 per staged row: 80 bytes, no bank conflicts */
#define GM_STAGES 3
#define GM_THREADS 256

struct moe_gemm_args {
    const __nv_bfloat16 *a;  /* gate/up: x in bf16 by row; down: h in bf16 by position */
    const void *const *mats; /* device: gate[n], up[n], down[n] */
    int n_experts, top_k;
    int64_t K, N; /* gate/up: hidden, inter; down: inter, hidden */
    struct moe_plan plan;
    __nv_bfloat16 *h; /* gate/up's output: n_pairs x inter by position */
    float *out;       /* down's output: n_pairs x hidden by position */
};

static size_t gemm_smem(int bm)
{
    return (size_t)GM_STAGES * (size_t)(bm + GM_BN) * GM_LDS * 2;
}

/* One tile of the plan (BM rows of one expert) times GM_BN weight rows, a
 * 2 x 4 grid of warps each holding BM / 2 x 32 of the product in WMMA
 * fragments, operands staged by cp.async GM_STAGES deep. GATE_UP: the B
 * rows interleave gate and up 16 at a time so a warp's two fragment columns
 * are the gate and up of the same 16 outputs, and the epilogue writes
 * bf16(silu(g) * u); else the f32 outputs. */
template <int BM, bool GATE_UP>
static __global__ void __launch_bounds__(GM_THREADS, 2) moe_gemm_kernel(struct moe_gemm_args g)
{
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char gm_sm[];
    __nv_bfloat16 *As = (__nv_bfloat16 *)gm_sm;
    __nv_bfloat16 *Bs = As + GM_STAGES * BM * GM_LDS;
    constexpr int MI = BM / 32;
    constexpr int A_PER = (BM * 4 + GM_THREADS - 1) / GM_THREADS;
    constexpr int B_PER = GM_BN * 4 / GM_THREADS;
    pdl_wait();
    pdl_release();
    const int tile = blockIdx.y;
    if (tile >= g.plan.hdr[1])
        return;
    const int e = g.plan.tiles[3 * tile], pos0 = g.plan.tiles[3 * tile + 1];
    const int cnt = g.plan.tiles[3 * tile + 2];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp >> 2, wn = warp & 3;
    const int64_t K = g.K, N = g.N;
    const int64_t n0 = (int64_t)blockIdx.x * (GATE_UP ? GM_BN / 2 : GM_BN);

    const __nv_bfloat16 *a_src[A_PER];
    int a_soff[A_PER], a_kc[A_PER];
    bool a_ok[A_PER];
#pragma unroll
    for (int i = 0; i < A_PER; i++) {
        int id = tid + i * GM_THREADS, row = id >> 2;
        a_kc[i] = (id & 3) * 8;
        a_soff[i] = row * GM_LDS + a_kc[i];
        a_ok[i] = id < BM * 4 && row < cnt;
        int64_t src = 0;
        if (a_ok[i])
            src = GATE_UP ? g.plan.sorted[pos0 + row] / g.top_k : pos0 + row;
        a_src[i] = g.a + src * K + a_kc[i];
    }
    const __nv_bfloat16 *b_src[B_PER];
    int b_soff[B_PER], b_kc[B_PER];
    bool b_ok[B_PER];
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
        int id = tid + i * GM_THREADS, j = id >> 2;
        b_kc[i] = (id & 3) * 8;
        b_soff[i] = j * GM_LDS + b_kc[i];
        int mat = GATE_UP ? ((j >> 4) & 1) : 2;
        int64_t nrow = GATE_UP ? n0 + (j >> 5) * 16 + (j & 15) : n0 + j;
        b_ok[i] = nrow < N;
        b_src[i] = (const __nv_bfloat16 *)g.mats[mat * g.n_experts + e] +
                   (b_ok[i] ? nrow : 0) * K + b_kc[i];
    }
    auto load_stage = [&](int stage, int kt) {
        int64_t k0 = (int64_t)kt * GM_BK;
        __nv_bfloat16 *as = As + stage * BM * GM_LDS, *bs = Bs + stage * GM_BN * GM_LDS;
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            if (tid + i * GM_THREADS < BM * 4) {
                bool v = a_ok[i] && k0 + a_kc[i] < K;
                cp_async16(as + a_soff[i], v ? a_src[i] + k0 : g.a, v);
            }
        }
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            bool v = b_ok[i] && k0 + b_kc[i] < K;
            cp_async16(bs + b_soff[i], v ? b_src[i] + k0 : b_src[i] - b_kc[i], v);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int nj = 0; nj < 2; nj++)
            wmma::fill_fragment(acc[mi][nj], 0.0f);

    const int nk = (int)((K + GM_BK - 1) / GM_BK);
#pragma unroll
    for (int s = 0; s < GM_STAGES - 1; s++) {
        if (s < nk)
            load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<GM_STAGES - 2>();
        __syncthreads();
        int pf = kt + GM_STAGES - 1;
        if (pf < nk)
            load_stage(pf % GM_STAGES, pf);
        cp_async_commit();
        const int st = kt % GM_STAGES;
        const __nv_bfloat16 *as = As + st * BM * GM_LDS + wm * (BM / 2) * GM_LDS;
        const __nv_bfloat16 *bs = Bs + st * GM_BN * GM_LDS + wn * 32 * GM_LDS;
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            /* B's two fragments held, A's loaded one at a time: 128 registers suffice */
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bf[2];
#pragma unroll
            for (int nj = 0; nj < 2; nj++)
                wmma::load_matrix_sync(bf[nj], bs + nj * 16 * GM_LDS + kk, GM_LDS);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> af;
                wmma::load_matrix_sync(af, as + mi * 16 * GM_LDS + kk, GM_LDS);
#pragma unroll
                for (int nj = 0; nj < 2; nj++)
                    wmma::mma_sync(acc[mi][nj], af, bf[nj], acc[mi][nj]);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    /* each warp passes its fragments through 1 KB of the staging memory */
    float *stage = (float *)gm_sm + warp * 256;
    const int rr = lane >> 1, cc = (lane & 1) * 8;
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        const int m = wm * (BM / 2) + mi * 16 + rr;
        if (GATE_UP) {
            /* gate and up fragments of one type hold the same elements */
            for (int t = 0; t < acc[mi][0].num_elements; t++)
                acc[mi][0].x[t] = silu_mul1(acc[mi][0].x[t], acc[mi][1].x[t]);
            wmma::store_matrix_sync(stage, acc[mi][0], 16, wmma::mem_row_major);
            __syncwarp();
            const int64_t col = n0 + wn * 16 + cc;
            if (m < cnt && col < N) {
                const float *v = stage + rr * 16 + cc;
                __align__(16) __nv_bfloat16 b[8];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    b[i] = __float2bfloat16_rn(v[i]);
                *(uint4 *)(g.h + (int64_t)(pos0 + m) * N + col) = *(const uint4 *)b;
            }
            __syncwarp();
        } else {
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                wmma::store_matrix_sync(stage, acc[mi][nj], 16, wmma::mem_row_major);
                __syncwarp();
                const int64_t col = n0 + wn * 32 + nj * 16 + cc;
                if (m < cnt && col < N) {
                    const float4 *v = (const float4 *)(stage + rr * 16 + cc);
                    float4 *dst = (float4 *)(g.out + (int64_t)(pos0 + m) * N + col);
                    dst[0] = v[0];
                    dst[1] = v[1];
                }
                __syncwarp();
            }
        }
    }
}

/* x (n floats) to bf16, round to nearest even (FAST mode's rounding of matmul inputs). */
static __global__ void moe_to_bf16_kernel(const float *x, int64_t n4, __nv_bfloat16 *out)
{
    pdl_wait();
    pdl_release();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = ((const float4 *)x)[i];
        __align__(8) __nv_bfloat16 b[4] = {__float2bfloat16_rn(v.x), __float2bfloat16_rn(v.y),
                                           __float2bfloat16_rn(v.z), __float2bfloat16_rn(v.w)};
        ((uint2 *)out)[i] = *(const uint2 *)b;
    }
}

/* ---- choosing and launching ----------------------------------------------- */

/* Index of each kernel that may need more than 48 KB of dynamic shared
 * memory in cu_device.moe_smem. */
enum {
    SM_GATE_UP_BF16_1, SM_GATE_UP_BF16_G, SM_GATE_UP_F32_1, SM_GATE_UP_F32_G,
    SM_DOWN_BF16_G, SM_DOWN_F32_G, SM_DOWN_ROW_BF16, SM_DOWN_ROW_F32,
    SM_GEMM_32_GU, SM_GEMM_32_D, SM_GEMM_128_GU, SM_GEMM_128_D, SM_N
};
static_assert(SM_N <= CU_MOE_SMEM_KERNELS, "cu_device.moe_smem holds every MoE kernel");

template <typename... KArgs, typename... Args>
static cudaError_t launch(struct cu_device *dev, int slot, void (*kernel)(KArgs...), dim3 grid,
                          dim3 block, size_t smem, cudaStream_t s, Args... args)
{
    /* static shared memory counts against the default 48 KB too */
    if (smem + 1024 > 48 * 1024 && smem > dev->moe_smem[slot]) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
        dev->moe_smem[slot] = smem;
    }
    return cu_launch_dependent(dev->pdl, kernel, grid, block, smem, s, args...);
}

/* Whether the new kernels take this op: a shape the GEMVs read in chunks
 * (record.c's vec) whose staged vectors fit in shared memory. A choice of
 * shape and device alone, never of the rows, so EXACT mode's rows get the
 * same arithmetic whatever the step holds. */
static bool gemv_fits(const struct cu_device *dev, const struct cu_op *op)
{
    size_t optin = (size_t)dev->smem_optin;
    size_t x_rows = (size_t)op->u.moe.hidden * sizeof(float) * MV_GROUP_ROWS;
    size_t h_rows = (size_t)op->u.moe.inter * sizeof(float) * (size_t)op->u.moe.top_k;
    size_t h_group = (size_t)op->u.moe.inter * sizeof(float) * MV_GROUP_ROWS;
    return op->u.moe.vec && x_rows + 1024 <= optin && h_rows + 1024 <= optin &&
           h_group + 1024 <= optin;
}

static cudaError_t plan_launch(struct cu_device *dev, cudaStream_t s, const struct cu_op *op,
                               int bm, const struct moe_plan *p)
{
    int n_pairs = op->n_rows * op->u.moe.top_k, ne = op->u.moe.n_experts;
    size_t smem = (size_t)(2 + PLAN_THREADS / 32) * (size_t)ne * sizeof(int);
    return cu_launch_dependent(dev->pdl, moe_plan_kernel, dim3(1), dim3(PLAN_THREADS), smem, s,
                               op->u.moe.ids, n_pairs, ne, bm, *p);
}

static cudaError_t combine_launch(struct cu_device *dev, cudaStream_t s, const struct cu_op *op,
                                  const float *out, const int *where, float *resid)
{
    return cu_launch_dependent(dev->pdl, moe_combine_kernel, dim3((unsigned)op->n_rows), dim3(256),
                               0, s, out, where, op->u.moe.ids, op->u.moe.weights,
                               op->u.moe.top_k, op->u.moe.hidden, op->u.moe.y, resid);
}

/* The row kernels (a step whose rows take their experts alone): gate/up with
 * two chunks a lane a round in blocks small enough for six an SM (bf16: one
 * wave over Qwen3-30B-A3B's 768 blocks), then down with four experts' loads in
 * flight. */
template <bool BF16>
static cudaError_t row_launches(struct cu_device *dev, cudaStream_t s, struct moe_gemv_args *a)
{
    const int64_t hidden = a->hidden, inter = a->inter;
    const int n_pairs = a->n_rows * a->top_k;
    const dim3 gg((unsigned)((inter + MV_WARPS - 1) / MV_WARPS), (unsigned)n_pairs);
    const dim3 gd((unsigned)((hidden + MV_WARPS - 1) / MV_WARPS), (unsigned)a->n_rows);
    const size_t xs = (size_t)hidden * sizeof(float);
    const size_t hs = (size_t)inter * sizeof(float) * (size_t)a->top_k;
    cudaError_t e = launch(dev, BF16 ? SM_GATE_UP_BF16_1 : SM_GATE_UP_F32_1,
                           moe_gate_up_row_gemv<BF16, 2, BF16 ? 6 : 1>, gg, dim3(MV_THREADS), xs,
                           s, *a);
    if (e != cudaSuccess)
        return e;
    return launch(dev, BF16 ? SM_DOWN_ROW_BF16 : SM_DOWN_ROW_F32,
                  moe_down_row_gemv<BF16, BF16 ? 4 : 2>, gd, dim3(MV_THREADS), hs, s, *a);
}

template <bool BF16>
static cudaError_t gemv_launch(struct cu_device *dev, cudaStream_t s, const struct cu_op *op,
                               struct moe_gemv_args *a)
{
    const int64_t hidden = a->hidden, inter = a->inter;
    const int n_pairs = a->n_rows * a->top_k;
    const unsigned gx_up = (unsigned)((inter + MV_WARPS - 1) / MV_WARPS);
    const unsigned gx_down = (unsigned)((hidden + MV_WARPS - 1) / MV_WARPS);
    cudaError_t e;
    if (!a->planned)
        return row_launches<BF16>(dev, s, a);
    /* a slot per expert some pair may have chosen; the plan says how many did */
    int n_slots = n_pairs < a->n_experts ? n_pairs : a->n_experts;
    e = launch(dev, BF16 ? SM_GATE_UP_BF16_G : SM_GATE_UP_F32_G,
               moe_gate_up_gemv<BF16, MV_GROUP_ROWS>, dim3(gx_up, (unsigned)n_slots),
               dim3(MV_THREADS), (size_t)hidden * sizeof(float) * MV_GROUP_ROWS, s, *a);
    if (e != cudaSuccess)
        return e;
    e = launch(dev, BF16 ? SM_DOWN_BF16_G : SM_DOWN_F32_G, moe_down_gemv<BF16, MV_GROUP_ROWS>,
               dim3(gx_down, (unsigned)n_slots), dim3(MV_THREADS),
               (size_t)inter * sizeof(float) * MV_GROUP_ROWS, s, *a);
    if (e != cudaSuccess)
        return e;
    return combine_launch(dev, s, op, a->out, NULL, a->resid);
}

/* The GEMV path: h and the pairs' outputs as moe_scratch_floats lays them
 * out for the CPU (n_pairs x inter, then n_pairs x hidden), the plan in the
 * last n_pairs x inter floats when it fits there. */
static cudaError_t run_gemvs(struct cu_device *dev, cudaStream_t s, const struct cu_op *op,
                             bool after_routing, const void *const *mats, bool round,
                             float *resid)
{
    struct moe_gemv_args a;
    memset(&a, 0, sizeof a);
    a.x = op->u.moe.x;
    a.hidden = op->u.moe.hidden;
    a.inter = op->u.moe.inter;
    a.n_rows = op->n_rows;
    a.top_k = op->u.moe.top_k;
    a.n_experts = op->u.moe.n_experts;
    a.mats = mats;
    a.ids = op->u.moe.ids;
    a.weights = op->u.moe.weights;
    a.round = round;
    const int64_t n_pairs = (int64_t)a.n_rows * a.top_k;
    a.h = op->u.moe.scratch;
    a.out = a.h + n_pairs * a.inter;
    a.y = op->u.moe.y;
    a.resid = resid;
    a.x_early = after_routing;
    int *plan_base = (int *)(a.out + n_pairs * a.hidden);
    a.planned = a.n_rows >= CU_MOE_SHARE_MIN_ROWS &&
                plan_ints(n_pairs, a.n_experts, 0, NULL, NULL) <= (size_t)(n_pairs * a.inter);
    if (a.planned) {
        plan_ints(n_pairs, a.n_experts, 0, plan_base, &a.plan);
        cudaError_t e = plan_launch(dev, s, op, 0, &a.plan);
        if (e != cudaSuccess)
            return e;
    }
    return op->u.moe.dtype == DTYPE_BF16 ? gemv_launch<true>(dev, s, op, &a)
                                         : gemv_launch<false>(dev, s, op, &a);
}

/* The grouped GEMM's scratch: the pairs' outputs (f32, by position), h
 * (bf16, by position), x in bf16 and the plan; false when that is more than
 * moe_scratch_floats gives (then the GEMVs run). */
struct gemm_layout {
    float *out;
    __nv_bfloat16 *h, *xb;
    int *plan;
};

static bool gemm_layout(const struct cu_op *op, int bm, struct gemm_layout *l)
{
    const int64_t n_rows = op->n_rows, n_pairs = n_rows * op->u.moe.top_k;
    const int64_t hidden = op->u.moe.hidden, inter = op->u.moe.inter;
    size_t have = moe_scratch_floats(n_rows, op->u.moe.top_k, inter, hidden);
    size_t out = (size_t)(n_pairs * hidden), h = (size_t)(n_pairs * inter) / 2,
           xb = (size_t)(n_rows * hidden) / 2;
    size_t need = out + h + xb + plan_ints(n_pairs, op->u.moe.n_experts, bm, NULL, NULL);
    if (need > have)
        return false;
    float *s = op->u.moe.scratch;
    l->out = s;
    l->h = (__nv_bfloat16 *)(s + out);
    l->xb = (__nv_bfloat16 *)(s + out + h);
    l->plan = (int *)(s + out + h + xb);
    return true;
}

template <int BM>
static cudaError_t gemm_launch(struct cu_device *dev, cudaStream_t s, const struct cu_op *op,
                               const void *const *mats, const struct gemm_layout *l,
                               float *resid)
{
    const int64_t n_rows = op->n_rows, n_pairs = n_rows * op->u.moe.top_k;
    const int64_t hidden = op->u.moe.hidden, inter = op->u.moe.inter;
    const int ne = op->u.moe.n_experts;
    struct moe_gemm_args g;
    memset(&g, 0, sizeof g);
    plan_ints(n_pairs, ne, BM, l->plan, &g.plan);
    cudaError_t e = plan_launch(dev, s, op, BM, &g.plan);
    if (e != cudaSuccess)
        return e;
    int64_t n4 = n_rows * hidden / 4;
    int blocks = (int)((n4 + 255) / 256);
    blocks = blocks < 4 * dev->n_sm ? blocks : 4 * dev->n_sm;
    e = cu_launch_dependent(dev->pdl, moe_to_bf16_kernel, dim3((unsigned)blocks), dim3(256), 0, s,
                            op->u.moe.x, n4, l->xb);
    if (e != cudaSuccess)
        return e;
    const unsigned tiles = (unsigned)plan_max_tiles(n_pairs, ne, BM);
    g.mats = mats;
    g.n_experts = ne;
    g.top_k = op->u.moe.top_k;
    g.h = l->h;
    g.out = l->out;
    g.a = l->xb;
    g.K = hidden;
    g.N = inter;
    e = launch(dev, BM == 128 ? SM_GEMM_128_GU : SM_GEMM_32_GU, moe_gemm_kernel<BM, true>,
               dim3((unsigned)((inter + GM_BN / 2 - 1) / (GM_BN / 2)), tiles), dim3(GM_THREADS),
               gemm_smem(BM), s, g);
    if (e != cudaSuccess)
        return e;
    g.a = l->h;
    g.K = inter;
    g.N = hidden;
    e = launch(dev, BM == 128 ? SM_GEMM_128_D : SM_GEMM_32_D, moe_gemm_kernel<BM, false>,
               dim3((unsigned)((hidden + GM_BN - 1) / GM_BN), tiles), dim3(GM_THREADS),
               gemm_smem(BM), s, g);
    if (e != cudaSuccess)
        return e;
    return combine_launch(dev, s, op, l->out, g.plan.where, resid);
}

bool cu_exec_moe_ffn(struct cu_impl *im, const struct cu_op *op, const struct cu_op *add,
                     bool after_routing)
{
    const void *const *mats = (const void *const *)(im->arena_dev + op->u.moe.mats_off);
    const bool fast = im->fuse.fast;
    float *resid = add ? add->u.ew.out : NULL;
    if (!im->moe_kernels || !gemv_fits(&im->dev, op))
        return CU_TRY(im, launch_legacy(im->stream, op, im->arena_dev, fast)) &&
               (!add || CU_TRY(im, cu_launch_add(im->stream, add)));
    const int64_t n_pairs = (int64_t)op->n_rows * op->u.moe.top_k;
    if (fast && op->u.moe.dtype == DTYPE_BF16 && op->n_rows >= CU_MOE_GEMM_MIN_ROWS &&
        gemm_smem(128) <= (size_t)im->dev.smem_optin) {
        /* 128-row tiles once the experts average 64 rows, 32-row ones below */
        bool big = n_pairs >= 64 * (int64_t)op->u.moe.n_experts;
        struct gemm_layout l;
        if (gemm_layout(op, big ? 128 : 32, &l))
            return CU_TRY(im, big ? gemm_launch<128>(&im->dev, im->stream, op, mats, &l, resid)
                                  : gemm_launch<32>(&im->dev, im->stream, op, mats, &l, resid));
    }
    return CU_TRY(im, run_gemvs(&im->dev, im->stream, op, after_routing, mats, fast, resid));
}

static __global__ void gated_add_kernel(float *y, const float *x, const float *g, int64_t n_rows,
                                        int64_t dim)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * dim;
         i += (int64_t)gridDim.x * blockDim.x) {
        float sg = 1.0f / (1.0f + expf(-g[i / dim]));
        y[i] += sg * x[i];
    }
}

cudaError_t cu_launch_gated_add(cudaStream_t s, const struct cu_op *op)
{
    int64_t n = (int64_t)op->n_rows * op->u.gated.dim;
    int blocks = (int)((n + 255) / 256);
    blocks = blocks < 1024 ? blocks : 1024;
    gated_add_kernel<<<blocks, 256, 0, s>>>(op->u.gated.y, op->u.gated.x, op->u.gated.g,
                                            op->n_rows, op->u.gated.dim);
    return cudaGetLastError();
}
