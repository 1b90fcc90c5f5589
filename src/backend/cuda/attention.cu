/* backend/cuda/attention.cu — paged causal attention: split-K flash-decoding for a few rows, tiled flash attention for prefill. */
#include <cuda_fp16.h>
#include <float.h>
#include <mma.h>

#include "backend/cuda/cuda_internal.h"

#define DEC_WARPS 4
#define DEC_GROUP_MAX 8
#define DEC_KEYS 4
/* From this context bucket on, the tiled decode kernel (measured faster at 8k, slower at 1k). */
#define DEC_TILED_MIN_CTX 4096
#define DEC_MIN_CHUNK 64
#define PF_BQ 32
#define PF_BK 32
#define PF_THREADS 128

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
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

static __device__ __forceinline__ size_t slot_offset(const struct cu_kv *kv, int layer,
                                                     const uint32_t *bt, int pos)
{
    uint32_t block = bt[pos / kv->block_size];
    return (((size_t)layer * kv->n_blocks + block) * kv->block_size + pos % kv->block_size) *
           ((size_t)kv->n_kv_heads * kv->head_dim);
}

/* ---- decode: one row, one kv head's query group, one split of positions -- */

/* Warps of a block take interleaved positions of the split; lanes hold
 * head dims lane + 32 j. Each warp keeps an online softmax per query head,
 * then the warps merge through shared memory. With one split the result is
 * final; otherwise (m, l, acc) go to part for attn_combine_kernel. */
template <int DPL>
static __global__ void __launch_bounds__(DEC_WARPS * 32)
attn_decode_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    __shared__ float sm_m[DEC_WARPS][DEC_GROUP_MAX], sm_l[DEC_WARPS][DEC_GROUP_MAX];
    __shared__ float sm_acc[DEC_WARPS][DEC_GROUP_MAX][DPL * 32];
    const struct cu_kv kv = op.u.attn.kv;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int hd = kv.head_dim;
    int group = op.u.attn.n_heads / kv.n_kv_heads;
    int chunks_per_kv = (group + DEC_GROUP_MAX - 1) / DEC_GROUP_MAX;
    int kvh = blockIdx.x / chunks_per_kv;
    int h0 = kvh * group + (blockIdx.x % chunks_per_kv) * DEC_GROUP_MAX;
    int ng = group - (blockIdx.x % chunks_per_kv) * DEC_GROUP_MAX;
    if (ng > DEC_GROUP_MAX)
        ng = DEC_GROUP_MAX;
    int split = blockIdx.y, n_splits = gridDim.y;
    int row = blockIdx.z;

    struct span_view sv = spans_at(params, op.u.attn.spans_off, op.u.attn.n_spans);
    if (sv.rowmap[row] < 0)
        return;
    const struct cu_span *sp = &sv.spans[sv.rowmap[row]];
    const uint32_t *bt = (const uint32_t *)(params + sp->bt_off);
    int last = sp->pos0 + (row - sp->row0);
    int first = 0;
    if (op.u.attn.window > 0 && last - op.u.attn.window + 1 > 0)
        first = last - op.u.attn.window + 1;
    int chunk = (op.u.attn.ctx_bucket + n_splits - 1) / n_splits;
    int begin = split * chunk, end = begin + chunk - 1;
    if (begin < first)
        begin = first;
    if (end > last)
        end = last;

    int q_dim = op.u.attn.n_heads * hd;
    float q[DEC_GROUP_MAX][DPL], acc[DEC_GROUP_MAX][DPL], m[DEC_GROUP_MAX], l[DEC_GROUP_MAX];
#pragma unroll
    for (int g = 0; g < DEC_GROUP_MAX; g++) {
        m[g] = -FLT_MAX;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            int d = lane + 32 * j;
            q[g][j] = (g < ng && d < hd)
                          ? op.u.attn.q[(size_t)row * q_dim + (size_t)(h0 + g) * hd + d] *
                                op.u.attn.scale
                          : 0.0f;
            acc[g][j] = 0.0f;
        }
    }
    for (int p0 = begin + warp; p0 <= end; p0 += DEC_WARPS * DEC_KEYS) {
        /* the loads of DEC_KEYS positions go out together */
        float kd[DEC_KEYS][DPL], vd[DEC_KEYS][DPL];
#pragma unroll
        for (int u = 0; u < DEC_KEYS; u++) {
            int p = p0 + u * DEC_WARPS;
            size_t off = p <= end ? slot_offset(&kv, op.u.attn.layer, bt, p) + (size_t)kvh * hd : 0;
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                int d = lane + 32 * j;
                bool ok = p <= end && d < hd;
                kd[u][j] = ok ? kv.k[off + d] : 0.0f;
                vd[u][j] = ok ? kv.v[off + d] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < DEC_KEYS; u++) {
            if (p0 + u * DEC_WARPS > end)
                break;
#pragma unroll
            for (int g = 0; g < DEC_GROUP_MAX; g++) {
                if (g < ng) {
                    float s = 0;
#pragma unroll
                    for (int j = 0; j < DPL; j++)
                        s = fmaf(q[g][j], kd[u][j], s);
                    s = warp_sum(s);
                    float m_new = fmaxf(m[g], s);
                    float corr = expf(m[g] - m_new), pr = expf(s - m_new);
                    l[g] = l[g] * corr + pr;
#pragma unroll
                    for (int j = 0; j < DPL; j++)
                        acc[g][j] = fmaf(acc[g][j], corr, pr * vd[u][j]);
                    m[g] = m_new;
                }
            }
        }
    }
    /* merge the warps */
#pragma unroll
    for (int g = 0; g < DEC_GROUP_MAX; g++) {
        if (g < ng) {
            if (lane == 0) {
                sm_m[warp][g] = m[g];
                sm_l[warp][g] = l[g];
            }
#pragma unroll
            for (int j = 0; j < DPL; j++)
                sm_acc[warp][g][lane + 32 * j] = acc[g][j];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        float M = -FLT_MAX;
        for (int w = 0; w < DEC_WARPS; w++)
            M = fmaxf(M, sm_m[w][g]);
        float L = 0, A = 0;
        for (int w = 0; w < DEC_WARPS; w++) {
            float e = expf(sm_m[w][g] - M);
            L += sm_l[w][g] * e;
            A += sm_acc[w][g][d] * e;
        }
        int head = h0 + g;
        if (n_splits == 1) {
            op.u.attn.out[(size_t)row * q_dim + (size_t)head * hd + d] = A / L;
        } else {
            float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) *
                                   (size_t)(hd + 2);
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
}

/* The same work with lanes over positions for the scores: each lane takes
 * one position of a 32-position tile and dots its whole K row (16-byte
 * loads, many in flight) with every query head of the group held in shared
 * memory; then lanes over head dims accumulate P V. Split results are merged
 * by the block that finishes last (a counter per row and kv head, left at
 * zero again), so there is no second launch. */
template <int DPL>
static __global__ void __launch_bounds__(DEC_WARPS * 32)
attn_decode_tiled_kernel(struct cu_op op, const uint8_t *params, float *part, unsigned *counters)
{
    constexpr int HD = DPL * 32;
    __shared__ __align__(16) float q_sm[DEC_GROUP_MAX][HD];
    __shared__ float p_sm[DEC_WARPS][DEC_GROUP_MAX][32];
    __shared__ float sm_m[DEC_WARPS][DEC_GROUP_MAX], sm_l[DEC_WARPS][DEC_GROUP_MAX];
    __shared__ float sm_acc[DEC_WARPS][DEC_GROUP_MAX][HD];
    __shared__ bool is_last;
    const struct cu_kv kv = op.u.attn.kv;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int group = op.u.attn.n_heads / kv.n_kv_heads;
    int chunks_per_kv = (group + DEC_GROUP_MAX - 1) / DEC_GROUP_MAX;
    int kvh = blockIdx.x / chunks_per_kv;
    int h0 = kvh * group + (blockIdx.x % chunks_per_kv) * DEC_GROUP_MAX;
    int ng = group - (blockIdx.x % chunks_per_kv) * DEC_GROUP_MAX;
    if (ng > DEC_GROUP_MAX)
        ng = DEC_GROUP_MAX;
    int split = blockIdx.y, n_splits = gridDim.y;
    int row = blockIdx.z;

    struct span_view sv = spans_at(params, op.u.attn.spans_off, op.u.attn.n_spans);
    if (sv.rowmap[row] < 0)
        return;
    const struct cu_span *sp = &sv.spans[sv.rowmap[row]];
    const uint32_t *bt = (const uint32_t *)(params + sp->bt_off);
    int last = sp->pos0 + (row - sp->row0);
    int first = 0;
    if (op.u.attn.window > 0 && last - op.u.attn.window + 1 > 0)
        first = last - op.u.attn.window + 1;
    int chunk = (op.u.attn.ctx_bucket + n_splits - 1) / n_splits;
    int begin = split * chunk, end = begin + chunk - 1;
    if (begin < first)
        begin = first;
    if (end > last)
        end = last;

    int q_dim = op.u.attn.n_heads * HD;
    for (int i = threadIdx.x; i < DEC_GROUP_MAX * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        q_sm[g][d] = g < ng ? op.u.attn.q[(size_t)row * q_dim + (size_t)(h0 + g) * HD + d] *
                                  op.u.attn.scale
                            : 0.0f;
    }
    __syncthreads();

    float m[DEC_GROUP_MAX], l[DEC_GROUP_MAX], acc[DEC_GROUP_MAX][DPL];
#pragma unroll
    for (int g = 0; g < DEC_GROUP_MAX; g++) {
        m[g] = -FLT_MAX;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++)
            acc[g][j] = 0.0f;
    }
    for (int t0 = begin + warp * 32; t0 <= end; t0 += DEC_WARPS * 32) {
        int p = t0 + lane;
        bool valid = p <= end;
        size_t off = valid ? slot_offset(&kv, op.u.attn.layer, bt, p) + (size_t)kvh * HD : 0;
        float s[DEC_GROUP_MAX];
#pragma unroll
        for (int g = 0; g < DEC_GROUP_MAX; g++)
            s[g] = 0.0f;
        if (valid) {
            const float4 *kr = (const float4 *)(kv.k + off);
#pragma unroll
            for (int d4 = 0; d4 < HD / 4; d4++) {
                float4 kk = kr[d4];
#pragma unroll
                for (int g = 0; g < DEC_GROUP_MAX; g++) {
                    if (g < ng) {
                        float4 qq = ((const float4 *)q_sm[g])[d4];
                        s[g] = fmaf(qq.x, kk.x, fmaf(qq.y, kk.y, fmaf(qq.z, kk.z, fmaf(qq.w, kk.w, s[g]))));
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < DEC_GROUP_MAX; g++) {
            if (g < ng) {
                float sv_ = valid ? s[g] : -FLT_MAX;
                float tmax = sv_;
                for (int o = 16; o > 0; o >>= 1)
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
                float m_new = fmaxf(m[g], tmax);
                float corr = expf(m[g] - m_new);
                float pr = valid ? expf(sv_ - m_new) : 0.0f;
                l[g] = l[g] * corr + warp_sum(pr);
                m[g] = m_new;
#pragma unroll
                for (int j = 0; j < DPL; j++)
                    acc[g][j] *= corr;
                p_sm[warp][g][lane] = pr;
            }
        }
        __syncwarp();
        int nk = end - t0 + 1 < 32 ? end - t0 + 1 : 32;
#pragma unroll 4
        for (int k = 0; k < nk; k++) {
            size_t vo = __shfl_sync(0xffffffffu, off, k);
            float vv[DPL];
#pragma unroll
            for (int j = 0; j < DPL; j++)
                vv[j] = kv.v[vo + lane + 32 * j];
#pragma unroll
            for (int g = 0; g < DEC_GROUP_MAX; g++) {
                if (g < ng) {
                    float pk = p_sm[warp][g][k];
#pragma unroll
                    for (int j = 0; j < DPL; j++)
                        acc[g][j] = fmaf(pk, vv[j], acc[g][j]);
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int g = 0; g < DEC_GROUP_MAX; g++) {
        if (g < ng) {
            if (lane == 0) {
                sm_m[warp][g] = m[g];
                sm_l[warp][g] = l[g];
            }
#pragma unroll
            for (int j = 0; j < DPL; j++)
                sm_acc[warp][g][lane + 32 * j] = acc[g][j];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        float M = -FLT_MAX;
        for (int w = 0; w < DEC_WARPS; w++)
            M = fmaxf(M, sm_m[w][g]);
        float L = 0, A = 0;
        for (int w = 0; w < DEC_WARPS; w++) {
            float e = expf(sm_m[w][g] - M);
            L += sm_l[w][g] * e;
            A += sm_acc[w][g][d] * e;
        }
        int head = h0 + g;
        if (n_splits == 1) {
            op.u.attn.out[(size_t)row * q_dim + (size_t)head * HD + d] = A / L;
        } else {
            float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) *
                                   (size_t)(HD + 2);
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
    if (n_splits == 1)
        return;
    /* the last block of this (row, head group) to finish merges the splits */
    __threadfence();
    __syncthreads();
    unsigned *counter = &counters[(size_t)row * gridDim.x + blockIdx.x];
    if (threadIdx.x == 0)
        is_last = atomicAdd(counter, 1u) == (unsigned)n_splits - 1;
    __syncthreads();
    if (!is_last)
        return;
    __threadfence();
    for (int i = threadIdx.x; i < ng * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        int head = h0 + g;
        const float *pp = part + ((size_t)row * op.u.attn.n_heads + head) * n_splits * (size_t)(HD + 2);
        float M = -FLT_MAX;
        for (int s2 = 0; s2 < n_splits; s2++)
            M = fmaxf(M, __ldcg(pp + s2 * (HD + 2)));
        float L = 0, A = 0;
        for (int s2 = 0; s2 < n_splits; s2++) {
            const float *ps = pp + s2 * (HD + 2);
            float e = expf(__ldcg(ps) - M);
            L += __ldcg(ps + 1) * e;
            A += __ldcg(ps + 2 + d) * e;
        }
        op.u.attn.out[(size_t)row * q_dim + (size_t)head * HD + d] = A / L;
    }
    if (threadIdx.x == 0)
        *counter = 0;
}

static __global__ void attn_combine_kernel(struct cu_op op, const float *part, int n_splits)
{
    int head = blockIdx.x, row = blockIdx.y;
    int hd = op.u.attn.kv.head_dim;
    const float *pp = part + ((size_t)row * op.u.attn.n_heads + head) * n_splits * (size_t)(hd + 2);
    float M = -FLT_MAX;
    for (int s = 0; s < n_splits; s++)
        M = fmaxf(M, pp[s * (hd + 2)]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float L = 0, A = 0;
        for (int s = 0; s < n_splits; s++) {
            const float *ps = pp + s * (hd + 2);
            float e = expf(ps[0] - M);
            L += ps[1] * e;
            A += ps[2 + d] * e;
        }
        op.u.attn.out[(size_t)row * op.u.attn.n_heads * hd + (size_t)head * hd + d] = A / L;
    }
}

/* ---- prefill: tiles of PF_BQ queries of one head against PF_BK keys ----- */

/* Thread t owns query row t / 4 of the tile and every fourth key column /
 * head dim from t % 4; scores and P go through shared memory. f32 throughout. */
template <int HPT>
static __global__ void __launch_bounds__(PF_THREADS)
attn_prefill_kernel(struct cu_op op, const uint8_t *params)
{
    extern __shared__ float smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const int hd = kv.head_dim, ldk = hd + 1; /* rows padded: no bank conflicts across rows */
    float *sq = smem;                   /* PF_BQ x (hd + 1) */
    float *sk = sq + PF_BQ * ldk;       /* PF_BK x (hd + 1) */
    float *sv = sk + PF_BK * ldk;       /* PF_BK x hd */
    float *sp_ = sv + PF_BK * hd;       /* PF_BQ x (PF_BK + 1) */
    int tid = threadIdx.x, r = tid / 4, sub = tid % 4;
    int head = blockIdx.y;
    int group = op.u.attn.n_heads / kv.n_kv_heads;
    int kvh = head / group;
    struct span_view svw = spans_at(params, op.u.attn.spans_off, op.u.attn.n_spans);
    const struct cu_span *span = &svw.spans[blockIdx.z];
    int q0 = blockIdx.x * PF_BQ;
    if (q0 >= span->n_tokens)
        return;
    int nq = span->n_tokens - q0 < PF_BQ ? span->n_tokens - q0 : PF_BQ;
    const uint32_t *bt = (const uint32_t *)(params + span->bt_off);
    int q_dim = op.u.attn.n_heads * hd;
    int window = op.u.attn.window;

    for (int i = tid; i < PF_BQ * hd; i += PF_THREADS) {
        int qi = i / hd, d = i % hd;
        sq[qi * ldk + d] = qi < nq ? op.u.attn.q[(size_t)(span->row0 + q0 + qi) * q_dim + (size_t)head * hd + d] *
                              op.u.attn.scale
                        : 0.0f;
    }
    int my_pos = span->pos0 + q0 + r;
    bool row_valid = r < nq;
    int my_first = 0;
    if (window > 0 && my_pos - window + 1 > 0)
        my_first = my_pos - window + 1;
    int last_pos = span->pos0 + q0 + nq - 1;
    int first_pos = 0;
    if (window > 0 && span->pos0 + q0 - window + 1 > 0)
        first_pos = span->pos0 + q0 - window + 1;

    float acc[HPT];
#pragma unroll
    for (int j = 0; j < HPT; j++)
        acc[j] = 0.0f;
    float m = -FLT_MAX, l = 0.0f;

    for (int k0 = first_pos - first_pos % PF_BK; k0 <= last_pos; k0 += PF_BK) {
        __syncthreads();
        for (int i = tid; i < PF_BK * hd; i += PF_THREADS) {
            int c = i / hd, d = i % hd;
            int p = k0 + c;
            float kval = 0, vval = 0;
            if (p <= last_pos) {
                size_t off = slot_offset(&kv, op.u.attn.layer, bt, p) + (size_t)kvh * hd + d;
                kval = kv.k[off];
                vval = kv.v[off];
            }
            sk[c * ldk + d] = kval;
            sv[c * hd + d] = vval;
        }
        __syncthreads();
        float s[PF_BK / 4];
        float tile_max = -FLT_MAX;
#pragma unroll
        for (int j = 0; j < PF_BK / 4; j++) {
            int c = sub + 4 * j;
            int p = k0 + c;
            float dot = 0;
            for (int d = 0; d < hd; d++)
                dot = fmaf(sq[r * ldk + d], sk[c * ldk + d], dot);
            bool ok = row_valid && p <= my_pos && p >= my_first;
            s[j] = ok ? dot : -FLT_MAX;
            if (ok)
                tile_max = fmaxf(tile_max, dot);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        float m_new = fmaxf(m, tile_max);
        float corr = expf(m - m_new);
        float rowsum = 0;
#pragma unroll
        for (int j = 0; j < PF_BK / 4; j++) {
            float pr = s[j] == -FLT_MAX ? 0.0f : expf(s[j] - m_new);
            sp_[r * (PF_BK + 1) + sub + 4 * j] = pr;
            rowsum += pr;
        }
        rowsum += __shfl_xor_sync(0xffffffffu, rowsum, 1);
        rowsum += __shfl_xor_sync(0xffffffffu, rowsum, 2);
        l = l * corr + rowsum;
        m = m_new;
        __syncwarp();
#pragma unroll
        for (int j = 0; j < HPT; j++)
            acc[j] *= corr;
        for (int c = 0; c < PF_BK; c++) {
            float pr = sp_[r * (PF_BK + 1) + c];
#pragma unroll
            for (int j = 0; j < HPT; j++) {
                int d = sub + 4 * j;
                if (d < hd)
                    acc[j] = fmaf(pr, sv[c * hd + d], acc[j]);
            }
        }
    }
    if (!row_valid)
        return;
    float inv = 1.0f / l;
    float *out = op.u.attn.out + (size_t)(span->row0 + q0 + r) * q_dim + (size_t)head * hd;
#pragma unroll
    for (int j = 0; j < HPT; j++) {
        int d = sub + 4 * j;
        if (d < hd)
            out[d] = acc[j] * inv;
    }
}

/* ---- prefill on tensor cores (fast mode) -------------------------------- */

#define TC_BQ 64
#define TC_BK 64
#define TC_WARPS 4

/* Flash attention with fp16 WMMA tiles and f32 accumulation: each warp owns
 * 16 query rows of a 64-row tile and walks 64-position K/V tiles (read from
 * the paged f32 cache, rounded to fp16 in shared memory): S = Q K^T on tensor
 * cores, an online softmax per row, P V on tensor cores, O kept in shared
 * memory as f32. Q is scaled before rounding; P is rounded to fp16 and the
 * row sums are taken over the rounded values, so O stays a weighted mean.
 * fp16, not bf16: its 3 more mantissa bits keep the goldens' fast-mode
 * argmax agreement (bf16 tiles measured 0.989, under the 0.99 bar). */
template <int HD>
static __global__ void __launch_bounds__(TC_WARPS * 32)
attn_prefill_tc_kernel(struct cu_op op, const uint8_t *params)
{
    using namespace nvcuda;
    extern __shared__ __align__(128) uint8_t tc_smem[];
    __half *qs = (__half *)tc_smem;      /* TC_BQ x HD */
    __half *ks = qs + TC_BQ * HD;                /* TC_BK x HD */
    __half *vs = ks + TC_BK * HD;                /* TC_BK x HD */
    __half *ps = vs + TC_BK * HD;                /* TC_BQ x TC_BK */
    float *sb = (float *)(ps + TC_BQ * TC_BK);          /* TC_BQ x HD: scores, then P V */
    float *os = sb + TC_BQ * HD;                        /* TC_BQ x HD */
    float *row_m = os + TC_BQ * HD, *row_l = row_m + TC_BQ, *row_c = row_l + TC_BQ;
    const struct cu_kv kv = op.u.attn.kv;
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int head = blockIdx.y;
    int group = op.u.attn.n_heads / kv.n_kv_heads;
    int kvh = head / group;
    struct span_view svw = spans_at(params, op.u.attn.spans_off, op.u.attn.n_spans);
    const struct cu_span *span = &svw.spans[blockIdx.z];
    int q0 = blockIdx.x * TC_BQ;
    if (q0 >= span->n_tokens)
        return;
    int nq = span->n_tokens - q0 < TC_BQ ? span->n_tokens - q0 : TC_BQ;
    const uint32_t *bt = (const uint32_t *)(params + span->bt_off);
    int q_dim = op.u.attn.n_heads * HD;
    int window = op.u.attn.window;

    for (int i = tid; i < TC_BQ * HD; i += blockDim.x) {
        int qi = i / HD, d = i % HD;
        float v = qi < nq ? op.u.attn.q[(size_t)(span->row0 + q0 + qi) * q_dim + (size_t)head * HD + d] *
                                op.u.attn.scale
                          : 0.0f;
        qs[i] = __float2half_rn(v);
        os[i] = 0.0f;
    }
    for (int i = tid; i < TC_BQ; i += blockDim.x) {
        row_m[i] = -FLT_MAX;
        row_l[i] = 0.0f;
    }
    int last_pos = span->pos0 + q0 + nq - 1;
    int first_pos = 0;
    if (window > 0 && span->pos0 + q0 - window + 1 > 0)
        first_pos = span->pos0 + q0 - window + 1;
    float *sw = sb + warp * 16 * HD;
    __half *pw = ps + warp * 16 * TC_BK;

    for (int k0 = first_pos - first_pos % TC_BK; k0 <= last_pos; k0 += TC_BK) {
        __syncthreads();
        for (int i = tid; i < TC_BK * HD; i += blockDim.x) {
            int c = i / HD, d = i % HD;
            int p = k0 + c;
            float kval = 0, vval = 0;
            if (p <= last_pos) {
                size_t off = slot_offset(&kv, op.u.attn.layer, bt, p) + (size_t)kvh * HD + d;
                kval = kv.k[off];
                vval = kv.v[off];
            }
            ks[i] = __float2half_rn(kval);
            vs[i] = __float2half_rn(vval);
        }
        __syncthreads();
        /* S = Q K^T for this warp's 16 rows */
        for (int j = 0; j < TC_BK / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                wmma::load_matrix_sync(a, qs + warp * 16 * HD + kk * 16, HD);
                wmma::load_matrix_sync(b, ks + j * 16 * HD + kk * 16, HD);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(sw + j * 16, c, HD, wmma::mem_row_major);
        }
        __syncwarp();
        /* online softmax, one row at a time, lanes over the 64 positions */
        for (int rr = 0; rr < 16; rr++) {
            int r = warp * 16 + rr;
            int qpos = span->pos0 + q0 + r;
            int qfirst = window > 0 && qpos - window + 1 > 0 ? qpos - window + 1 : 0;
            bool rv = r < nq;
            float sv[2];
            float mx = -FLT_MAX;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int c = lane + 32 * h, p = k0 + c;
                bool ok = rv && p <= qpos && p >= qfirst;
                sv[h] = ok ? sw[rr * HD + c] : -FLT_MAX;
                mx = fmaxf(mx, sv[h]);
            }
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = row_m[r];
            float m_new = fmaxf(m_old, mx);
            float sum = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                __half pb = __float2half_rn(sv[h] == -FLT_MAX ? 0.0f : expf(sv[h] - m_new));
                pw[rr * TC_BK + lane + 32 * h] = pb;
                sum += __half2float(pb);
            }
            sum = warp_sum(sum);
            __syncwarp();
            if (lane == 0) {
                float corr = expf(m_old - m_new);
                row_c[r] = corr;
                row_l[r] = row_l[r] * corr + sum;
                row_m[r] = m_new;
            }
        }
        __syncwarp();
        /* P V into sw */
#pragma unroll
        for (int n = 0; n < HD / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                wmma::load_matrix_sync(a, pw + kk * 16, TC_BK);
                wmma::load_matrix_sync(b, vs + kk * 16 * HD + n * 16, HD);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(sw + n * 16, c, HD, wmma::mem_row_major);
        }
        __syncwarp();
        for (int rr = 0; rr < 16; rr++) {
            int r = warp * 16 + rr;
            float corr = row_c[r];
            for (int d = lane; d < HD; d += 32)
                os[r * HD + d] = os[r * HD + d] * corr + sw[rr * HD + d];
        }
    }
    __syncwarp();
    for (int rr = 0; rr < 16; rr++) {
        int r = warp * 16 + rr;
        if (r >= nq)
            break;
        float inv = 1.0f / row_l[r];
        float *out = op.u.attn.out + (size_t)(span->row0 + q0 + r) * q_dim + (size_t)head * HD;
        for (int d = lane; d < HD; d += 32)
            out[d] = os[r * HD + d] * inv;
    }
}

template <int HD>
static cudaError_t launch_prefill_tc(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                     int smem_optin)
{
    size_t smem = (size_t)TC_BQ * HD * 2 + 2 * (size_t)TC_BK * HD * 2 + (size_t)TC_BQ * TC_BK * 2 +
                  2 * (size_t)TC_BQ * HD * 4 + 3 * (size_t)TC_BQ * 4;
    if (smem > (size_t)smem_optin)
        return cudaErrorInvalidConfiguration;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_tc_kernel<HD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((op->u.attn.max_span_tokens + TC_BQ - 1) / TC_BQ),
              (unsigned)op->u.attn.n_heads, (unsigned)op->u.attn.n_spans);
    attn_prefill_tc_kernel<HD><<<grid, TC_WARPS * 32, smem, s>>>(*op, params);
    return cudaGetLastError();
}

/* ---- dispatch ----------------------------------------------------------- */

bool cu_attention_uses_prefill(const struct cu_op *op)
{
    int hd = op->u.attn.kv.head_dim;
    return op->u.attn.max_span_tokens > CU_GEMV_MAX_ROWS && hd % 4 == 0 && hd <= CU_MAX_HEAD_DIM;
}

int cu_attention_splits(int n_kv_heads, int n_rows, int ctx_bucket, int n_sm)
{
    int splits = 1;
    while (splits < CU_ATTN_MAX_SPLITS && ctx_bucket / (splits * 2) >= DEC_MIN_CHUNK &&
           (long)n_kv_heads * n_rows * splits < 2L * n_sm)
        splits *= 2;
    return splits;
}

/* Partials, then (tiled decode) one counter per row and block column. */
static size_t part_float_count(const struct cu_op *op)
{
    return ((size_t)op->n_rows * op->u.attn.n_heads * op->u.attn.n_splits *
                (op->u.attn.kv.head_dim + 2) + 63) & ~(size_t)63;
}

size_t cu_attention_part_floats(const struct cu_op *op)
{
    if (cu_attention_uses_prefill(op) || op->u.attn.n_splits <= 1)
        return 0;
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    size_t counters = (size_t)op->n_rows * op->u.attn.kv.n_kv_heads *
                      ((group + DEC_GROUP_MAX - 1) / DEC_GROUP_MAX);
    return part_float_count(op) + counters;
}

template <int DPL>
static cudaError_t launch_decode(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                 float *part)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    int chunks = (group + DEC_GROUP_MAX - 1) / DEC_GROUP_MAX;
    dim3 grid((unsigned)(op->u.attn.kv.n_kv_heads * chunks), (unsigned)op->u.attn.n_splits,
              (unsigned)op->n_rows);
    if (op->u.attn.kv.head_dim == DPL * 32 && op->u.attn.ctx_bucket >= DEC_TILED_MIN_CTX) {
        unsigned *counters = (unsigned *)(part + part_float_count(op));
        attn_decode_tiled_kernel<DPL><<<grid, DEC_WARPS * 32, 0, s>>>(*op, params, part, counters);
        return cudaGetLastError();
    }
    attn_decode_kernel<DPL><<<grid, DEC_WARPS * 32, 0, s>>>(*op, params, part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || op->u.attn.n_splits == 1)
        return e;
    dim3 cgrid((unsigned)op->u.attn.n_heads, (unsigned)op->n_rows);
    attn_combine_kernel<<<cgrid, 128, 0, s>>>(*op, part, op->u.attn.n_splits);
    return cudaGetLastError();
}

template <int HPT>
static cudaError_t launch_prefill(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                  int smem_optin)
{
    int hd = op->u.attn.kv.head_dim;
    size_t smem = sizeof(float) * ((size_t)PF_BQ * (hd + 1) + (size_t)PF_BK * (hd + 1) +
                                   (size_t)PF_BK * hd + (size_t)PF_BQ * (PF_BK + 1));
    if (smem > (size_t)smem_optin)
        return cudaErrorInvalidConfiguration;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<HPT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((op->u.attn.max_span_tokens + PF_BQ - 1) / PF_BQ),
              (unsigned)op->u.attn.n_heads, (unsigned)op->u.attn.n_spans);
    attn_prefill_kernel<HPT><<<grid, PF_THREADS, smem, s>>>(*op, params);
    return cudaGetLastError();
}

cudaError_t cu_launch_attention(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                float *part, int smem_optin, bool tensor_cores)
{
    int hd = op->u.attn.kv.head_dim;
    if (op->n_rows == 0)
        return cudaSuccess;
    if (hd > CU_MAX_HEAD_DIM)
        return cudaErrorInvalidValue;
    if (cu_attention_uses_prefill(op) && tensor_cores && (hd == 64 || hd == 128))
        return hd == 64 ? launch_prefill_tc<64>(s, op, params, smem_optin)
                        : launch_prefill_tc<128>(s, op, params, smem_optin);
    if (cu_attention_uses_prefill(op)) {
        if (hd <= 64)
            return launch_prefill<16>(s, op, params, smem_optin);
        if (hd <= 128)
            return launch_prefill<32>(s, op, params, smem_optin);
        return launch_prefill<64>(s, op, params, smem_optin);
    }
    if (hd <= 64)
        return launch_decode<2>(s, op, params, part);
    if (hd <= 128)
        return launch_decode<4>(s, op, params, part);
    return launch_decode<8>(s, op, params, part);
}
