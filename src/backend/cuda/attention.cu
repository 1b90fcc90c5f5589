/* backend/cuda/attention.cu — paged causal attention: split-K flash-decoding for a few rows, tiled f32 flash attention for prefill (fp16 tensor-core prefill: attention_prefill.cu; quantized caches: attention_quant.cu). */
#include <cuda_fp16.h>
#include <float.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/warp.cuh"

#define DEC_WARPS 4
#define DEC_GROUP_MAX 8
#define DEC_KEYS 4
/* The scratch starts with this many merge counters (zero between launches),
 * then the split partials; the counters never share memory with partials,
 * whatever the shape of the step that wrote them. */
#define DEC_COUNTERS CU_ATTN_COUNTERS
#define FD_WARPS 8
#define FD_THREADS (FD_WARPS * 32)
#define FD_RED_FLOATS 4096
#define PF_BQ 32
#define PF_BK 32
#define PF_THREADS 128

/* ---- decode: one row, one kv head's query group, one split of positions -- */

/* For head dims other than 64, 128 and 256. Warps of a block take
 * interleaved positions of the split; lanes hold head dims lane + 32 j. Each warp keeps an online softmax per query head,
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
                kd[u][j] = ok ? kv_get(kv.k, off + d, kv.f16) : 0.0f;
                vd[u][j] = ok ? kv_get(kv.v, off + d, kv.f16) : 0.0f;
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
                    osm_add_score(warp_sum(s), vd[u], m[g], l[g], acc[g]);
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
        float M = osm_max(DEC_WARPS, &sm_m[0][g], DEC_GROUP_MAX), L, A;
        osm_merge(DEC_WARPS, &sm_m[0][g], &sm_l[0][g], DEC_GROUP_MAX, &sm_acc[0][g][d],
                  DEC_GROUP_MAX * DPL * 32, M, &L, &A);
        int head = h0 + g;
        if (n_splits == 1) {
            op.u.attn.out[(size_t)row * q_dim + (size_t)head * hd + d] = A / L;
        } else {
            float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) *
                                   (size_t)PART_STRIDE(hd);
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
}

/* Flash-decoding for head_dim 64, 128 and 256: a block of FD_WARPS warps
 * takes one row, one kv head's query heads (up to GP of them, so K and V are
 * read once for the whole group) and one split of positions, walked in tiles
 * of T positions (T * HD = 8192 floats). For a tile every thread first issues
 * all of its K and V loads (16-byte, 16 per thread, so a tile is one round
 * trip to memory): for the scores LPP lanes share a position, each with 16
 * of its dims, and reduce the dot products with shuffles; for P V a warp's
 * lanes cover whole V rows. Scores go through shared memory, one warp per
 * query head rescales the tile (online softmax across tiles), every thread
 * accumulates its dims over its positions, and the warps are summed at the
 * end. A split with no positions (past the row's last position, or before
 * its sliding window) exits at once; a row whose positions fall in one split
 * is written directly. Otherwise each split leaves (m, l, acc) in part and
 * the last block of the row and head group to finish merges them, in split
 * order, so the result does not depend on which block that is. */
template <int HD, int EB = 4, bool NARROW = false>
struct fd_shape {
    static constexpr int LPP = HD / 16;                    /* lanes per position (scores) */
    static constexpr int PPW = 32 / LPP;                   /* positions per warp (scores) */
    /* positions per tile: 32 KB of K and as much of V, whatever the element
     * size; narrow, one pass of the warps over the scores */
    static constexpr int T = NARROW ? CU_ATTN_NARROW_TILE(HD) : 8192 / HD * (4 / EB);
    static constexpr int KR = T / (FD_WARPS * PPW);        /* K rows per thread per tile */
    static constexpr int VL = HD / 4;                      /* float4 per row */
    static constexpr int VF = VL > 32 ? VL / 32 : 1;       /* float4 per lane per V row */
    static constexpr int VPI = VL < 32 ? 32 / VL : 1;      /* V rows per warp at a time */
    static constexpr int VR = T / (FD_WARPS * VPI);        /* V rows per thread per tile */
    static constexpr int PS = PART_STRIDE(HD);             /* floats per partial */
};

/* out = the splits' partials s_first .. s_first + n_active - 1 merged, for
 * query heads h0 .. h0 + ng - 1 of row. Called by all threads of a block. */
template <int HD, int GP>
static __device__ void fd_merge(const struct cu_op &op, const float *part, int n_splits, int row,
                                int h0, int ng, int s_first, int n_active, float (*mw)[GP],
                                float (*lw)[GP])
{
    constexpr int PS = fd_shape<HD>::PS;
    const float *base = part + ((size_t)row * op.u.attn.n_heads + h0) * n_splits * PS;
    for (int i = threadIdx.x; i < GP * CU_ATTN_MAX_SPLITS; i += blockDim.x) {
        int g = i / CU_ATTN_MAX_SPLITS, s = i % CU_ATTN_MAX_SPLITS;
        bool ok = g < ng && s < n_active;
        const float *pp = base + ((size_t)g * n_splits + s_first + s) * PS;
        mw[s][g] = ok ? __ldcg(pp) : -FLT_MAX;
        lw[s][g] = ok ? __ldcg(pp + 1) : 0.0f;
    }
    __syncthreads();
    if ((int)threadIdx.x < ng) {
        int g = threadIdx.x;
        float M = -FLT_MAX;
        for (int s = 0; s < n_active; s++)
            M = fmaxf(M, mw[s][g]);
        float L = 0.0f;
        for (int s = 0; s < n_active; s++) {
            float e = expf(mw[s][g] - M);
            L = fmaf(lw[s][g], e, L);
            mw[s][g] = e;
        }
        float inv = 1.0f / L;
        for (int s = 0; s < n_active; s++)
            mw[s][g] *= inv;
    }
    __syncthreads();
    const int q_dim = op.u.attn.n_heads * HD;
    for (int i = threadIdx.x; i < ng * (HD / 4); i += blockDim.x) {
        int g = i / (HD / 4), f = i % (HD / 4);
        const float *pp = base + ((size_t)g * n_splits + s_first) * PS + 4 + 4 * f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int s = 0; s < n_active; s++) {
            float4 v = __ldcg((const float4 *)(pp + (size_t)s * PS));
            float w = mw[s][g];
            a.x = fmaf(w, v.x, a.x);
            a.y = fmaf(w, v.y, a.y);
            a.z = fmaf(w, v.z, a.z);
            a.w = fmaf(w, v.w, a.w);
        }
        float *o = op.u.attn.out + (size_t)row * q_dim + (size_t)(h0 + g) * HD + 4 * f;
        o[0] = a.x;
        o[1] = a.y;
        o[2] = a.z;
        o[3] = a.w;
    }
}

/* Four consecutive cache elements as loaded (raw: a float4 from an f32 cache,
 * 8 bytes from an fp16 one) and widened to f32 only when used, so that all
 * of a tile's loads are in flight before the first conversion waits. */
template <typename KT>
struct kv4;

template <>
struct kv4<float> {
    using raw = float4;
    static __device__ __forceinline__ raw load(const float *row, int i4)
    {
        return __ldg((const float4 *)row + i4);
    }
    static __device__ __forceinline__ raw load_shared(const float *row, int i4)
    {
        return ((const float4 *)row)[i4];
    }
    static __device__ __forceinline__ raw zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static __device__ __forceinline__ float4 widen(raw r) { return r; }
    static __device__ __forceinline__ float narrow(float x) { return x; }
};

template <>
struct kv4<__half> {
    using raw = uint2;
    static __device__ __forceinline__ raw load(const __half *row, int i4)
    {
        return __ldg((const uint2 *)row + i4);
    }
    static __device__ __forceinline__ raw load_shared(const __half *row, int i4)
    {
        return ((const uint2 *)row)[i4];
    }
    static __device__ __forceinline__ raw zero() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ __half narrow(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ float4 widen(raw r)
    {
        float2 a = __half22float2(*(const __half2 *)&r.x), b = __half22float2(*(const __half2 *)&r.y);
        return make_float4(a.x, a.y, b.x, b.y);
    }
};

/* NARROW (cu_attention_narrow; GP is 1): tiles of one pass, a block per
 * query head, so a short context's blocks each run a short dependent chain.
 * PREP: the q/k launch before the attention is folded in. Each block
 * prepares its own query heads from the raw q (RMSNorm, RoPE). The positions
 * its row's span computes this step (the newest alone in a decode step; a
 * speculative verify span's up to NEW) are not in the cache yet: the block
 * prepares the K of those its split holds (and takes their V) itself, from
 * the rows whose tokens they are, and reads both from shared memory. The
 * span's last row, which attends to all of them, writes them into the cache
 * for the steps after (its first head group of the kv head). */
template <int HD, int GP, typename KT, bool PREP, bool NARROW, int NEW = 1>
static __global__ void __launch_bounds__(FD_THREADS, HD * GP <= 512 ? 2 : 1)
attn_decode_fd_kernel(struct cu_op op, const uint8_t *params, float *part, unsigned *counters,
                      struct cu_qk_args prep)
{
    using S = fd_shape<HD, (int)sizeof(KT), NARROW>;
    static_assert(!NARROW || GP == 1, "a narrow block takes one query head");
    using L = kv4<KT>;
    constexpr int T = S::T, LPP = S::LPP, PPW = S::PPW, KR = S::KR;
    constexpr int VL = S::VL, VF = S::VF, VPI = S::VPI, VR = S::VR, PS = S::PS;
    constexpr int GB = GP < FD_RED_FLOATS / (FD_WARPS * HD) ? GP : FD_RED_FLOATS / (FD_WARPS * HD);
    static_assert(KR >= 1 && VR >= 1 && GB >= 1 && T % 32 == 0, "decode tile shape");
    static_assert(GP <= FD_WARPS, "one warp per query head rescales a tile");
    __shared__ __align__(16) float q_sm[GP][HD];
    __shared__ float s_sm[GP][T];
    __shared__ float m_sm[GP], l_sm[GP], c_sm[GP];
    __shared__ __align__(16) float red[FD_WARPS][GB][HD];
    __shared__ float mw[CU_ATTN_MAX_SPLITS][GP], lw[CU_ATTN_MAX_SPLITS][GP];
    static_assert(NEW == 1 || PREP, "span positions come with the q/k work");
    __shared__ __align__(16) float k_prep[NEW][PREP ? HD : 1];
    __shared__ __align__(16) KT k_new[NEW][PREP ? HD : 1], v_new[NEW][PREP ? HD : 1];

    const struct cu_kv kv = op.u.attn.kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int group = op.u.attn.n_heads / kv.n_kv_heads;
    const int chunks_per_kv = (group + GP - 1) / GP;
    const int kvh = blockIdx.x / chunks_per_kv, hc = blockIdx.x % chunks_per_kv;
    const int h0 = kvh * group + hc * GP;
    const int ng = group - hc * GP < GP ? group - hc * GP : GP;
    const int split = blockIdx.y, n_splits = gridDim.y, row = blockIdx.z;

    struct decode_split ds;
    if (!decode_split_of(op, params, row, split, n_splits, &ds))
        return;
    const uint32_t *bt = ds.bt;
    const int last = ds.last, begin = ds.begin, end = ds.end;
    const int s_first = ds.s_first, n_active = ds.n_active;
    /* PREP: positions new0 .. last are this step's (rows span_row0 ..), the
     * span's last row being span_last */
    int new0 = last, span_row0 = row, span_last = row;
    if (PREP && NEW > 1)
        decode_row_span(op, params, row, &new0, &span_row0, &span_last);

    const int q_dim = op.u.attn.n_heads * HD;
    const float *qrow = op.u.attn.q + (size_t)row * q_dim + (size_t)h0 * HD;
    const size_t head_off = (size_t)kvh * HD;
    const int layer = op.u.attn.layer;
    const int kg = lane / LPP, kl = lane % LPP;
    const int vg = VPI > 1 ? lane / VL : 0, vl = VPI > 1 ? lane % VL : lane;

    /* A tile's loads all go out before any is used. With PREP the newest
     * position comes from shared memory (k_new / v_new); before they are
     * prepared (hold_newest) its registers are left for patch_newest. */
    typename L::raw kr[KR][4], vr[VR][VF];
    auto load_tile_into = [&](int t0, bool hold_newest, typename L::raw(&kd)[KR][4],
                              typename L::raw(&vd)[VR][VF]) {
#pragma unroll
        for (int r = 0; r < KR; r++) {
            int p = t0 + r * (FD_WARPS * PPW) + warp * PPW + kg;
            if (PREP && p >= new0 && p <= end) {
#pragma unroll
                for (int i = 0; i < 4; i++)
                    kd[r][i] =
                        hold_newest ? L::zero() : L::load_shared(k_new[p - new0], kl + i * LPP);
            } else if (p <= end) {
                const KT *src = (const KT *)kv.k + slot_offset(&kv, layer, bt, p) + head_off;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    kd[r][i] = L::load(src, kl + i * LPP);
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++)
                    kd[r][i] = L::zero();
            }
        }
#pragma unroll
        for (int r = 0; r < VR; r++) {
            int p = t0 + r * (FD_WARPS * VPI) + warp * VPI + vg;
            if (PREP && p >= new0 && p <= end) {
#pragma unroll
                for (int j = 0; j < VF; j++)
                    vd[r][j] =
                        hold_newest ? L::zero() : L::load_shared(v_new[p - new0], vl + 32 * j);
            } else if (p <= end) {
                const KT *src = (const KT *)kv.v + slot_offset(&kv, layer, bt, p) + head_off;
#pragma unroll
                for (int j = 0; j < VF; j++)
                    vd[r][j] = L::load(src, vl + 32 * j);
            } else {
#pragma unroll
                for (int j = 0; j < VF; j++)
                    vd[r][j] = L::zero();
            }
        }
    };
    auto load_tile = [&](int t0, bool hold_newest) { load_tile_into(t0, hold_newest, kr, vr); };
    auto patch_newest = [&](int t0) {
#pragma unroll
        for (int r = 0; r < KR; r++) {
            int p = t0 + r * (FD_WARPS * PPW) + warp * PPW + kg;
            if (p >= new0 && p <= end)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    kr[r][i] = L::load_shared(k_new[p - new0], kl + i * LPP);
        }
#pragma unroll
        for (int r = 0; r < VR; r++) {
            int p = t0 + r * (FD_WARPS * VPI) + warp * VPI + vg;
            if (p >= new0 && p <= end)
#pragma unroll
                for (int j = 0; j < VF; j++)
                    vr[r][j] = L::load_shared(v_new[p - new0], vl + 32 * j);
        }
    };
    /* the first tile's cache reads need nothing this step computed (the
     * newest position is held back): they go out before the q/k work, whose
     * latency they then cover. The GEMV after this launch may start now. */
    load_tile(begin, true);
    pdl_release();
    pdl_wait();
    if (PREP) {
        float pos;
        const float *inv_freq = qk_row_freqs(prep, params, row, &pos);
        /* this split's new positions: p_lo .. end */
        const int p_lo = new0 > begin ? new0 : begin;
        const int n_new = end >= p_lo ? end - p_lo + 1 : 0;
        for (int j = warp; j < ng + n_new; j += FD_WARPS) {
            if (j < ng) {
                qk_head_prep(qrow + (size_t)j * HD, prep.q_norm, prep.eps, HD, prep.rot_dim, pos,
                             inv_freq, prep.factor, q_sm[j]);
                for (int i = lane; i < HD; i += 32)
                    q_sm[j][i] *= op.u.attn.scale;
                continue;
            }
            const int p = p_lo + (j - ng), n = p - new0, src = span_row0 + n;
            float k_pos = pos;
            const float *k_freq = src == row ? inv_freq : qk_row_freqs(prep, params, src, &k_pos);
            const size_t kv_row = ((size_t)src * kv.n_kv_heads + kvh) * HD;
            qk_head_prep(prep.k + kv_row, prep.k_norm, prep.eps, HD, prep.rot_dim, k_pos, k_freq,
                         prep.factor, k_prep[n]);
            const size_t slot = slot_offset(&kv, layer, bt, p) + head_off;
            const bool store = hc == 0 && row == span_last;
            for (int i = lane; i < HD; i += 32) {
                KT kq = L::narrow(k_prep[n][i]), vq = L::narrow(prep.v[kv_row + i]);
                k_new[n][i] = kq;
                v_new[n][i] = vq;
                if (store) {
                    ((KT *)kv.k)[slot + i] = kq;
                    ((KT *)kv.v)[slot + i] = vq;
                }
            }
        }
        for (int i = threadIdx.x; i < (GP - ng) * HD; i += FD_THREADS)
            q_sm[ng + i / HD][i % HD] = 0.0f;
    } else {
        for (int i = threadIdx.x; i < GP * HD; i += FD_THREADS) {
            int g = i / HD;
            q_sm[g][i % HD] = g < ng ? qrow[i] * op.u.attn.scale : 0.0f;
        }
    }
    if (threadIdx.x < GP) {
        m_sm[threadIdx.x] = -FLT_MAX;
        l_sm[threadIdx.x] = 0.0f;
        c_sm[threadIdx.x] = 1.0f;
    }
    __syncthreads();
    if (PREP && new0 <= end && new0 < begin + T)
        patch_newest(begin);

    float4 acc[GP][VF];
#pragma unroll
    for (int g = 0; g < GP; g++)
#pragma unroll
        for (int j = 0; j < VF; j++)
            acc[g][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    /* narrow tiles are small: the next one's loads go out before this one's
     * products, so a split of several tiles waits for memory once (where a
     * tile's registers, twice, leave room: all but head dim 256 over f32) */
    constexpr bool PREFETCH = NARROW && sizeof(kr) + sizeof(vr) <= 128;
    typename L::raw kn[KR][4], vn[VR][VF]; /* unused (and gone) without PREFETCH */
    for (int t0 = begin; t0 <= end; t0 += T) {
        if (PREFETCH) {
            if (t0 != begin) {
#pragma unroll
                for (int r = 0; r < KR; r++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        kr[r][i] = kn[r][i];
#pragma unroll
                for (int r = 0; r < VR; r++)
#pragma unroll
                    for (int j = 0; j < VF; j++)
                        vr[r][j] = vn[r][j];
            }
            if (t0 + T <= end)
                load_tile_into(t0 + T, false, kn, vn);
        } else if (t0 != begin) {
            load_tile(t0, false);
        }
        /* scores */
#pragma unroll
        for (int r = 0; r < KR; r++) {
            int c = r * (FD_WARPS * PPW) + warp * PPW + kg;
#pragma unroll
            for (int g = 0; g < GP; g++) {
                const float4 *qg = (const float4 *)q_sm[g];
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 qq = qg[kl + i * LPP], kk = L::widen(kr[r][i]);
                    s = fmaf(qq.x, kk.x, s);
                    s = fmaf(qq.y, kk.y, s);
                    s = fmaf(qq.z, kk.z, s);
                    s = fmaf(qq.w, kk.w, s);
                }
#pragma unroll
                for (int o = LPP / 2; o > 0; o >>= 1)
                    s += __shfl_xor_sync(0xffffffffu, s, o);
                if (kl == 0)
                    s_sm[g][c] = s;
            }
        }
        __syncthreads();
        /* online softmax: warp g rescales query head g over the tile */
        if (warp < ng) {
            const int g = warp;
            float sv[T / 32];
            float mx = -FLT_MAX;
#pragma unroll
            for (int j = 0; j < T / 32; j++) {
                int c = lane + 32 * j;
                sv[j] = t0 + c <= end ? s_sm[g][c] : -FLT_MAX;
                mx = fmaxf(mx, sv[j]);
            }
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = m_sm[g];
            float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < T / 32; j++) {
                int c = lane + 32 * j;
                float pr = t0 + c <= end ? expf(sv[j] - m_new) : 0.0f;
                s_sm[g][c] = pr;
                sum += pr;
            }
            sum = warp_sum(sum);
            __syncwarp();
            if (lane == 0) {
                float corr = expf(m_old - m_new);
                c_sm[g] = corr;
                l_sm[g] = fmaf(l_sm[g], corr, sum);
                m_sm[g] = m_new;
            }
        }
        __syncthreads();
        /* P V */
#pragma unroll
        for (int g = 0; g < GP; g++) {
            float corr = c_sm[g];
#pragma unroll
            for (int j = 0; j < VF; j++) {
                acc[g][j].x *= corr;
                acc[g][j].y *= corr;
                acc[g][j].z *= corr;
                acc[g][j].w *= corr;
            }
        }
#pragma unroll
        for (int r = 0; r < VR; r++) {
            int c = r * (FD_WARPS * VPI) + warp * VPI + vg;
            float4 vv[VF];
#pragma unroll
            for (int j = 0; j < VF; j++)
                vv[j] = L::widen(vr[r][j]);
#pragma unroll
            for (int g = 0; g < GP; g++) {
                float pw = s_sm[g][c];
#pragma unroll
                for (int j = 0; j < VF; j++) {
                    acc[g][j].x = fmaf(pw, vv[j].x, acc[g][j].x);
                    acc[g][j].y = fmaf(pw, vv[j].y, acc[g][j].y);
                    acc[g][j].z = fmaf(pw, vv[j].z, acc[g][j].z);
                    acc[g][j].w = fmaf(pw, vv[j].w, acc[g][j].w);
                }
            }
        }
        __syncthreads();
    }

    /* lanes of a warp that held different positions, then the warps */
#pragma unroll
    for (int o = VL; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < GP; g++)
#pragma unroll
            for (int j = 0; j < VF; j++) {
                acc[g][j].x += __shfl_xor_sync(0xffffffffu, acc[g][j].x, o);
                acc[g][j].y += __shfl_xor_sync(0xffffffffu, acc[g][j].y, o);
                acc[g][j].z += __shfl_xor_sync(0xffffffffu, acc[g][j].z, o);
                acc[g][j].w += __shfl_xor_sync(0xffffffffu, acc[g][j].w, o);
            }
#pragma unroll
    for (int g0 = 0; g0 < GP; g0 += GB) {
        if (g0 < ng) { /* uniform over the block */
            if (vg == 0) {
#pragma unroll
                for (int gg = 0; gg < GB; gg++)
#pragma unroll
                    for (int j = 0; j < VF; j++)
                        *(float4 *)&red[warp][gg][4 * (vl + 32 * j)] = acc[g0 + gg][j];
            }
            __syncthreads();
            for (int i = threadIdx.x; i < GB * (HD / 4); i += FD_THREADS) {
                int gg = i / (HD / 4), f = i % (HD / 4), g = g0 + gg;
                if (g >= ng)
                    continue;
                float4 a = *(const float4 *)&red[0][gg][4 * f];
#pragma unroll
                for (int w = 1; w < FD_WARPS; w++) {
                    float4 b = *(const float4 *)&red[w][gg][4 * f];
                    a.x += b.x;
                    a.y += b.y;
                    a.z += b.z;
                    a.w += b.w;
                }
                int head = h0 + g;
                if (n_active == 1) {
                    float inv = 1.0f / l_sm[g];
                    float *o = op.u.attn.out + (size_t)row * q_dim + (size_t)head * HD + 4 * f;
                    o[0] = a.x * inv;
                    o[1] = a.y * inv;
                    o[2] = a.z * inv;
                    o[3] = a.w * inv;
                } else {
                    float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) * PS;
                    if (f == 0) {
                        pp[0] = m_sm[g];
                        pp[1] = l_sm[g];
                    }
                    *(float4 *)(pp + 4 + 4 * f) = a;
                }
            }
            __syncthreads();
        }
    }
    if (n_active == 1 || !counters)
        return;
    /* the last block of this row and head group to finish merges the splits */
    if (block_arrives_last(&counters[(size_t)row * gridDim.x + blockIdx.x], (unsigned)n_active))
        fd_merge<HD, GP>(op, part, n_splits, row, h0, ng, s_first, n_active, mw, lw);
}

/* The merge as a launch of its own, for steps with more (row, head group)
 * pairs than there are counters. */
template <int HD, int GP>
static __global__ void __launch_bounds__(FD_THREADS)
attn_decode_fd_merge_kernel(struct cu_op op, const uint8_t *params, const float *part, int n_splits)
{
    __shared__ float mw[CU_ATTN_MAX_SPLITS][GP], lw[CU_ATTN_MAX_SPLITS][GP];
    const int group = op.u.attn.n_heads / op.u.attn.kv.n_kv_heads;
    const int chunks_per_kv = (group + GP - 1) / GP;
    const int kvh = blockIdx.x / chunks_per_kv, hc = blockIdx.x % chunks_per_kv;
    const int h0 = kvh * group + hc * GP;
    const int ng = group - hc * GP < GP ? group - hc * GP : GP;
    const int row = blockIdx.z;
    int first, last;
    const uint32_t *bt;
    if (!decode_row(op, params, row, &first, &last, &bt))
        return;
    const int chunk = (op.u.attn.ctx_bucket + n_splits - 1) / n_splits;
    const int s_first = first / chunk, n_active = last / chunk - s_first + 1;
    if (n_active == 1)
        return; /* written by the decode kernel */
    fd_merge<HD, GP>(op, part, n_splits, row, h0, ng, s_first, n_active, mw, lw);
}

static __global__ void attn_combine_kernel(struct cu_op op, const float *part, int n_splits)
{
    int head = blockIdx.x, row = blockIdx.y;
    int hd = op.u.attn.kv.head_dim;
    const float *pp = part + ((size_t)row * op.u.attn.n_heads + head) * n_splits * (size_t)PART_STRIDE(hd);
    float M = osm_max(n_splits, pp, PART_STRIDE(hd));
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float L, A;
        osm_merge(n_splits, pp, pp + 1, PART_STRIDE(hd), pp + 2 + d, PART_STRIDE(hd), M, &L, &A);
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
    const struct osm_quad_rows rows = osm_quad_rows_at(span->pos0, q0, nq, r, window);
    float acc[HPT], m, l;
    osm_init(acc, m, l);

    for (int k0 = rows.first_pos - rows.first_pos % PF_BK; k0 <= rows.last_pos; k0 += PF_BK) {
        __syncthreads();
        for (int i = tid; i < PF_BK * hd; i += PF_THREADS) {
            int c = i / hd, d = i % hd;
            int p = k0 + c;
            float kval = 0, vval = 0;
            if (p <= rows.last_pos) {
                size_t off = slot_offset(&kv, op.u.attn.layer, bt, p) + (size_t)kvh * hd + d;
                kval = kv_get(kv.k, off, kv.f16);
                vval = kv_get(kv.v, off, kv.f16);
            }
            sk[c * ldk + d] = kval;
            sv[c * hd + d] = vval;
        }
        __syncthreads();
        float s[PF_BK / 4];
        float tile_max = osm_quad_scores<PF_BK>(s, sq + r * ldk, sk, ldk, hd, sub, k0,
                                                rows.row_valid, rows.my_first, rows.my_pos);
        osm_quad_tile<PF_BK>(s, tile_max, sp_ + r * (PF_BK + 1), sv, hd, sub, m, l, acc);
    }
    if (!rows.row_valid)
        return;
    float *out = op.u.attn.out + (size_t)(span->row0 + q0 + r) * q_dim + (size_t)head * hd;
    osm_quad_store(acc, l, out, hd, sub);
}

/* ---- dispatch ----------------------------------------------------------- */

/* Merge counters, then the partials. */
static size_t part_float_count(const struct cu_op *op)
{
    return (size_t)op->n_rows * op->u.attn.n_heads * op->u.attn.n_splits *
           PART_STRIDE(op->u.attn.kv.head_dim);
}

size_t cu_attention_part_floats(const struct cu_op *op)
{
    if (op->kind == CU_ATTN_DENSE)
        return DEC_COUNTERS + cu_dense_part_floats(op);
    if (op->u.attn.window_blocks > 0)
        return DEC_COUNTERS + (cu_qwindow_bytes(op) + sizeof(float) - 1) / sizeof(float);
    if (cu_attention_uses_prefill(op) || op->u.attn.n_splits <= 1)
        return 0;
    return DEC_COUNTERS + part_float_count(op);
}

/* Head dims without a flash-decoding kernel. */
template <int DPL>
static cudaError_t launch_decode(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                 float *part)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    int chunks = (group + DEC_GROUP_MAX - 1) / DEC_GROUP_MAX;
    dim3 grid((unsigned)(op->u.attn.kv.n_kv_heads * chunks), (unsigned)op->u.attn.n_splits,
              (unsigned)op->n_rows);
    float *partials = op->u.attn.n_splits > 1 ? part + DEC_COUNTERS : NULL;
    attn_decode_kernel<DPL><<<grid, DEC_WARPS * 32, 0, s>>>(*op, params, partials);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || op->u.attn.n_splits == 1)
        return e;
    dim3 cgrid((unsigned)op->u.attn.n_heads, (unsigned)op->n_rows);
    attn_combine_kernel<<<cgrid, 128, 0, s>>>(*op, partials, op->u.attn.n_splits);
    return cudaGetLastError();
}

/* The merge launch of the splits' partials, a block per row and head group. */
template <int HD, int GP>
static cudaError_t launch_fd_merge(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                   const float *partials)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    dim3 mgrid((unsigned)(op->u.attn.kv.n_kv_heads * ((group + GP - 1) / GP)), 1,
               (unsigned)op->n_rows);
    attn_decode_fd_merge_kernel<HD, GP>
        <<<mgrid, FD_THREADS, 0, s>>>(*op, params, partials, op->u.attn.n_splits);
    return cudaGetLastError();
}

template <int HD, int GP, bool NARROW = false>
static cudaError_t launch_decode_fd(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                    float *part, const struct cu_qk_args *prep, bool early)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)(op->u.attn.kv.n_kv_heads * ((group + GP - 1) / GP)), (unsigned)n_splits,
              (unsigned)op->n_rows);
    unsigned *counters = NULL;
    float *partials = NULL;
    bool merge_inside = true;
    if (n_splits > 1) {
        partials = part + DEC_COUNTERS;
        merge_inside = (size_t)op->n_rows * grid.x <= DEC_COUNTERS;
        if (merge_inside)
            counters = (unsigned *)part;
    }
    struct cu_qk_args none;
    memset(&none, 0, sizeof none);
    /* spans of several new positions (cu_attention_takes_qk: f16, head dim up to 128) */
    constexpr int NEW = HD <= 128 ? CU_QK_MAX_SPAN : 1;
    auto kern = op->u.attn.kv.f16
                    ? (!prep ? attn_decode_fd_kernel<HD, GP, __half, false, NARROW>
                       : op->u.attn.max_span_tokens > 1
                           ? attn_decode_fd_kernel<HD, GP, __half, true, NARROW, NEW>
                           : attn_decode_fd_kernel<HD, GP, __half, true, NARROW>)
                    : (prep ? attn_decode_fd_kernel<HD, GP, float, true, NARROW>
                            : attn_decode_fd_kernel<HD, GP, float, false, NARROW>);
    /* launched after the launch before it completes, not as its programmatic
     * dependent (early launches measured slower on the 1B and 8B shapes: -3 to
     * -5% tg128, -5% at 8k; +4% on the 0.6B), except, when the caller asks
     * (early), narrow ones with the q/k prep folded in, whose first tile needs
     * nothing of the step: after the block-quantized stream GEMV they measured
     * faster (Llama-3.2-1B Q4_K_M +3 to +5%, 8B +1 to +2%), after the bf16
     * GEMV slower (8B bf16 -3 to -4%). The o_proj GEMV after it may start
     * early: pdl_release once the first tile's loads are out. */
    cudaError_t e;
    if (NARROW && prep && early) {
        e = cu_launch_dependent(true, kern, grid, dim3(FD_THREADS), 0, s, *op, params, partials,
                                counters, *prep);
    } else {
        kern<<<grid, FD_THREADS, 0, s>>>(*op, params, partials, counters, prep ? *prep : none);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess || merge_inside)
        return e;
    return launch_fd_merge<HD, GP>(s, op, params, partials);
}

/* The query heads per block: one when narrow, else the group rounded up to a
 * power of two, at most 8. */
template <int HD>
static cudaError_t launch_decode_hd(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                    float *part, const struct cu_qk_args *prep, bool early)
{
    if (op->u.attn.narrow)
        return launch_decode_fd<HD, 1, true>(s, op, params, part, prep, early);
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    if (group == 1)
        return launch_decode_fd<HD, 1>(s, op, params, part, prep, false);
    if (group == 2)
        return launch_decode_fd<HD, 2>(s, op, params, part, prep, false);
    if (group <= 4)
        return launch_decode_fd<HD, 4>(s, op, params, part, prep, false);
    return launch_decode_fd<HD, 8>(s, op, params, part, prep, false);
}

cudaError_t cu_launch_attention_merge(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part)
{
    int hd = op->u.attn.kv.head_dim, group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    const float *partials = part + DEC_COUNTERS;
    if (hd == 64)
        return group <= 8 ? launch_fd_merge<64, 8>(s, op, params, partials)
                          : launch_fd_merge<64, 16>(s, op, params, partials);
    if (hd == 128)
        return group <= 8 ? launch_fd_merge<128, 8>(s, op, params, partials)
                          : launch_fd_merge<128, 16>(s, op, params, partials);
    return cudaErrorInvalidValue;
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
                                float *part, int smem_optin, struct cu_attn_kernels kernels)
{
    int hd = op->u.attn.kv.head_dim;
    if (op->n_rows == 0)
        return cudaSuccess;
    if (hd > CU_MAX_HEAD_DIM)
        return cudaErrorInvalidValue;
    if (op->u.attn.kv.quant)
        return cu_launch_attention_quant(s, op, params, part, smem_optin, kernels);
    if (cu_attention_uses_prefill(op) && kernels.tensor_cores && op->u.attn.kv.f16) {
        cudaError_t e =
            cu_launch_attention_prefill_f16(s, op, params, smem_optin, kernels.prefill_wgmma);
        if (e != cudaErrorNotSupported)
            return e;
    }
    if (cu_attention_uses_prefill(op)) {
        if (hd <= 64)
            return launch_prefill<16>(s, op, params, smem_optin);
        if (hd <= 128)
            return launch_prefill<32>(s, op, params, smem_optin);
        return launch_prefill<64>(s, op, params, smem_optin);
    }
    if (hd == 64)
        return launch_decode_hd<64>(s, op, params, part, NULL, false);
    if (hd == 128)
        return launch_decode_hd<128>(s, op, params, part, NULL, false);
    if (hd == 256)
        return launch_decode_hd<256>(s, op, params, part, NULL, false);
    if (hd <= 64)
        return launch_decode<2>(s, op, params, part);
    if (hd <= 128)
        return launch_decode<4>(s, op, params, part);
    return launch_decode<8>(s, op, params, part);
}

cudaError_t cu_launch_attention_qk(cudaStream_t s, const struct cu_op *op,
                                   const struct cu_qk_args *qk, const uint8_t *params, float *part,
                                   bool early)
{
    if (op->n_rows == 0)
        return cudaSuccess;
    if (!cu_attention_takes_qk(op, qk))
        return cudaErrorInvalidValue;
    int hd = op->u.attn.kv.head_dim;
    if (hd == 64)
        return launch_decode_hd<64>(s, op, params, part, qk, early);
    if (hd == 128)
        return launch_decode_hd<128>(s, op, params, part, qk, early);
    return launch_decode_hd<256>(s, op, params, part, qk, early);
}
