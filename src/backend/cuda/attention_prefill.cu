/* backend/cuda/attention_prefill.cu — prefill attention over an f16 paged KV cache: FlashAttention-2 on mma.sync tensor cores. */
#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/online_softmax.cuh"

/* Positions per K/V tile. */
#define FA_BK 64
/* log2(e): scores are kept in base 2, so exp becomes one ex2 instruction. */
#define FA_LOG2E 1.4426950408889634f

/* A block of NW warps takes BQ = 16 NW query rows of one span and one query
 * head and walks the K/V tiles its rows attend to, oldest first. Each warp
 * owns 16 rows: Q (rounded to fp16, pre-scaled) stays in registers as mma
 * A fragments, S = Q K^T and O += P V are m16n8k16 mma.sync products with f32
 * accumulators in registers, and the online softmax runs on those registers
 * (a row lives in the four lanes of a quad). K and V tiles are copied from
 * the paged cache with 16-byte cp.async, one tile ahead of the tile being
 * computed (two buffers each); their rows are XOR-swizzled in 16-byte chunks
 * so the ldmatrix reads of eight rows hit distinct banks. Where each row
 * starts in the cache is looked up in the block table by the first FA_BK
 * threads, two tiles ahead, into a small table in shared memory. Causal and
 * sliding-window masks are applied only to tiles that straddle some row's
 * range; a warp skips tiles wholly outside all of its rows' ranges. */
template <int HD, int NW>
struct fa_shape {
    static constexpr int BQ = 16 * NW;                  /* query rows per block */
    static constexpr int THREADS = 32 * NW;
    static constexpr int CPR = HD / 8;                  /* 16-byte chunks per K/V row */
    static constexpr int RPP = THREADS / CPR;           /* rows per pass of the copy */
    static constexpr int PASSES = FA_BK / RPP;          /* rows each thread copies per tile */
    static constexpr int TILE_HALVES = FA_BK * HD;
    /* K and V, two buffers each, then three tiles' row offsets */
    static constexpr size_t SMEM =
        2 * 2 * (size_t)TILE_HALVES * sizeof(__half) + 3 * FA_BK * sizeof(size_t);
};

static __device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Byte offset of (row, chunk) in a swizzled tile of HD halves per row. */
template <int HD>
static __device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * HD * 2 + ((chunk ^ (row & 7)) << 4));
}

/* 16 bytes global -> shared, zero-filled when !valid. */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most one group of this thread's copies is still in flight. */
static __device__ __forceinline__ void cp_async_wait_one(void)
{
    asm volatile("cp.async.wait_group 1;\n" ::);
}

static __device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                               uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                     uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c += a b: a 16x16 row-major fp16, b 16x8 column-major fp16, c 16x8 f32. */
static __device__ __forceinline__ void mma_16816(float *c, const uint32_t *a, uint32_t b0,
                                                 uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* The rounded pair as floats, summed. */
static __device__ __forceinline__ float half2_sum(uint32_t v)
{
    float2 f = __half22float2(*(__half2 *)&v);
    return f.x + f.y;
}

/* Where a position's K/V row starts in the cache (in elements), or
 * FA_NO_ROW past the last position: those rows are zero-filled. */
#define FA_NO_ROW (~(size_t)0)

/* Issues the copies of this thread's chunks of a K and V tile, whose rows
 * start at row_off[]: RPP rows per pass, one 16-byte chunk each. */
template <int HD, int PASSES, int RPP>
static __device__ __forceinline__ void fa_tile_copy(uint32_t k_dst, uint32_t v_dst,
                                                    const __half *kc, const __half *vc,
                                                    const size_t *row_off, int row, int chunk)
{
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
        int r = row + i * RPP;
        size_t off = row_off[r];
        bool valid = off != FA_NO_ROW;
        off = valid ? off + chunk * 8 : 0;
        cp_async16(k_dst + swz<HD>(r, chunk), kc + off, valid);
        cp_async16(v_dst + swz<HD>(r, chunk), vc + off, valid);
    }
}

template <int HD, int NW>
static __global__ void __launch_bounds__(32 * NW, 1)
attn_prefill_f16_kernel(struct cu_op op, const uint8_t *params)
{
    using S = fa_shape<HD, NW>;
    constexpr int BQ = S::BQ, CPR = S::CPR, RPP = S::RPP, PASSES = S::PASSES;
    constexpr int KT = HD / 16;    /* k16 steps of Q K^T */
    constexpr int NS = FA_BK / 8;  /* n8 tiles of S */
    constexpr int NO = HD / 8;     /* n8 tiles of O */
    static_assert(S::THREADS % CPR == 0 && FA_BK % RPP == 0, "copy shape");
    extern __shared__ __align__(128) uint8_t fa_smem[];

    const struct cu_kv kv = op.u.attn.kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3; /* mma fragment row group, thread in group */
    const int head = blockIdx.x;
    const int kvh = head / (op.u.attn.n_heads / kv.n_kv_heads);
    const struct cu_span *span =
        (const struct cu_span *)(params + op.u.attn.spans_off) + blockIdx.z;
    /* the longest rows (latest tiles) are scheduled first */
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
    const int n_tokens = span->n_tokens;
    if (q0 >= n_tokens)
        return;
    const uint32_t *bt = (const uint32_t *)(params + span->bt_off);
    const int window = op.u.attn.window;
    const int pos0 = span->pos0;
    const int nq = n_tokens - q0 < BQ ? n_tokens - q0 : BQ;
    const int last_pos = pos0 + q0 + nq - 1;
    int first_pos = 0;
    if (window > 0 && pos0 + q0 - window + 1 > 0)
        first_pos = pos0 + q0 - window + 1;
    const int k_begin = first_pos - first_pos % FA_BK;
    const int n_tiles = (last_pos - k_begin) / FA_BK + 1;

    /* this warp's rows; rows past the span repeat its last row (their
     * results are not stored), so no row attends to nothing */
    const int wrow0 = q0 + warp * 16;
    const bool warp_live = wrow0 < n_tokens;
    const int w_first_qpos = pos0 + (warp_live ? wrow0 : n_tokens - 1);
    const int w_last_qpos = pos0 + (wrow0 + 15 < n_tokens ? wrow0 + 15 : n_tokens - 1);
    int qpos[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int i = wrow0 + g + 8 * h;
        qpos[h] = pos0 + (i < n_tokens ? i : n_tokens - 1);
    }

    /* Q: f32 -> fp16 A fragments, scaled into base-2 scores */
    const int q_dim = op.u.attn.n_heads * HD;
    const float qscale = op.u.attn.scale * FA_LOG2E;
    uint32_t qf[KT][4];
    {
        const float *qr[2];
#pragma unroll
        for (int h = 0; h < 2; h++)
            qr[h] = op.u.attn.q + (size_t)(span->row0 + qpos[h] - pos0) * q_dim + (size_t)head * HD;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 v = *(const float2 *)(qr[j & 1] + kk * 16 + (j >> 1) * 8 + 2 * t);
                qf[kk][j] = pack_half2(v.x * qscale, v.y * qscale);
            }
        }
    }

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    /* copy roles: this thread's chunk of a row, and its first row; the
     * first FA_BK threads also find the rows of the tile two ahead (block
     * id loaded one tile earlier, so its latency hides behind a tile) */
    const int c_chunk = threadIdx.x % CPR, c_row = threadIdx.x / CPR;
    const __half *kc = (const __half *)kv.k, *vc = (const __half *)kv.v;
    const int bs = kv.block_size;
    const size_t layer_base = (size_t)op.u.attn.layer * kv.n_blocks;
    const size_t kv_dim = (size_t)kv.n_kv_heads * HD, head_off = (size_t)kvh * HD;
    const bool finder = threadIdx.x < FA_BK;
    const uint32_t ks0 = smem_addr(fa_smem);
    const uint32_t tile_bytes = S::TILE_HALVES * sizeof(__half);
    /* buffer b: K at ks0 + 2 b tile_bytes, V right after it; then the row
     * offsets of tile j in slot j % 3 (written two tiles ahead, read one
     * ahead: a slot is rewritten two barriers after its last read) */
    size_t *row_off = (size_t *)(fa_smem + 4 * tile_bytes); /* [3][FA_BK] */
    int slot_next = 1; /* the slot of tile it + 1 */
    uint32_t next_block = 0;
    int next_pos = k_begin + threadIdx.x;
    if (finder) {
        for (int j = 0; j < 3 && j < n_tiles; j++, next_pos += FA_BK) {
            next_block = next_pos <= last_pos ? __ldg(bt + next_pos / bs) : 0;
            if (j < 2)
                row_off[j * FA_BK + threadIdx.x] =
                    next_pos <= last_pos
                        ? ((layer_base + next_block) * bs + next_pos % bs) * kv_dim + head_off
                        : FA_NO_ROW;
        }
        next_pos -= FA_BK; /* the position of next_block: tile 2's */
    }
    __syncthreads();
    fa_tile_copy<HD, PASSES, RPP>(ks0, ks0 + tile_bytes, kc, vc, row_off, c_row, c_chunk);
    cp_async_commit();

    /* ldmatrix lane roles: K (non-transposed) and V (transposed) x4 loads */
    const int k_lrow = (lane >> 4) * 8 + (lane & 7), k_lchunk = (lane >> 3) & 1;
    const int v_lrow = ((lane >> 3) & 1) * 8 + (lane & 7), v_lchunk = lane >> 4;

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_begin + it * FA_BK;
        if (it + 1 < n_tiles) {
            uint32_t kb = ks0 + ((it + 1) & 1) * 2 * tile_bytes;
            fa_tile_copy<HD, PASSES, RPP>(kb, kb + tile_bytes, kc, vc,
                                          row_off + slot_next * FA_BK, c_row, c_chunk);
        }
        slot_next = slot_next == 2 ? 0 : slot_next + 1;
        if (finder && it + 2 < n_tiles) {
            row_off[slot_next * FA_BK + threadIdx.x] =
                next_pos <= last_pos
                    ? ((layer_base + next_block) * bs + next_pos % bs) * kv_dim + head_off
                    : FA_NO_ROW;
            next_pos += FA_BK;
            if (it + 3 < n_tiles && next_pos <= last_pos)
                next_block = __ldg(bt + next_pos / bs);
        }
        cp_async_commit();
        cp_async_wait_one();
        __syncthreads();

        /* a warp skips tiles wholly in its rows' future or before their window */
        const bool skip = !warp_live || k0 > w_last_qpos ||
                          (window > 0 && k0 + FA_BK - 1 < w_first_qpos - window + 1);
        if (!skip) {
            const uint32_t kb = ks0 + (it & 1) * 2 * tile_bytes, vb = kb + tile_bytes;
            float s[NS][4];
#pragma unroll
            for (int n = 0; n < NS; n++)
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
#pragma unroll
                for (int np = 0; np < NS / 2; np++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(kb + swz<HD>(np * 16 + k_lrow, 2 * kk + k_lchunk), b0, b1, b2, b3);
                    mma_16816(s[2 * np], qf[kk], b0, b1);
                    mma_16816(s[2 * np + 1], qf[kk], b2, b3);
                }
            }
            /* masks only where a position can be out of some row's range */
            const bool diag = k0 + FA_BK - 1 > w_first_qpos ||
                              (window > 0 && k0 < w_last_qpos - window + 1);
            if (diag) {
#pragma unroll
                for (int n = 0; n < NS; n++) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int p = k0 + n * 8 + 2 * t + (j & 1), qp = qpos[j >> 1];
                        if (p > qp || (window > 0 && p <= qp - window))
                            s[n][j] = -INFINITY;
                    }
                }
            }
            /* online softmax: rows g (h = 0) and g + 8 (h = 1) */
            float use_max[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = row_max[h];
#pragma unroll
                for (int n = 0; n < NS; n++)
                    mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
                mx = osm_quad_max(mx);
                /* a row with nothing seen yet subtracts 0: no inf - inf */
                use_max[h] = mx == -INFINITY ? 0.0f : mx;
                float corr = fast_exp2(row_max[h] - use_max[h]);
                row_max[h] = mx;
                row_sum[h] *= corr;
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    o[n][2 * h] *= corr;
                    o[n][2 * h + 1] *= corr;
                }
            }
            /* P rounded to fp16 as the PV A fragments; the row sums take the
             * rounded values, so O stays a weighted mean of V rows */
            uint32_t pf[FA_BK / 16][4];
#pragma unroll
            for (int kk = 0; kk < FA_BK / 16; kk++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float *sn = s[2 * kk + (j >> 1)];
                    int h = j & 1;
                    uint32_t pv = pack_half2(fast_exp2(sn[2 * h] - use_max[h]),
                                             fast_exp2(sn[2 * h + 1] - use_max[h]));
                    pf[kk][j] = pv;
                    row_sum[h] += half2_sum(pv);
                }
            }
#pragma unroll
            for (int kk = 0; kk < FA_BK / 16; kk++) {
#pragma unroll
                for (int dp = 0; dp < NO / 2; dp++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_trans(vb + swz<HD>(kk * 16 + v_lrow, 2 * dp + v_lchunk), b0, b1, b2,
                                  b3);
                    mma_16816(o[2 * dp], pf[kk], b0, b1);
                    mma_16816(o[2 * dp + 1], pf[kk], b2, b3);
                }
            }
        }
        __syncthreads(); /* the buffer is refilled next iteration */
    }

    if (!warp_live)
        return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = osm_quad_sum(row_sum[h]);
        int i = wrow0 + g + 8 * h;
        if (i >= n_tokens)
            continue;
        float inv = 1.0f / l;
        float *out = op.u.attn.out + (size_t)(span->row0 + i) * q_dim + (size_t)head * HD + 2 * t;
#pragma unroll
        for (int n = 0; n < NO; n++)
            *(float2 *)(out + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
}

template <int HD, int NW>
static cudaError_t launch_prefill_f16(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, int smem_optin)
{
    using S = fa_shape<HD, NW>;
    if (S::SMEM > (size_t)smem_optin)
        return cudaErrorInvalidConfiguration;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_f16_kernel<HD, NW>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)S::SMEM);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)op->u.attn.n_heads,
              (unsigned)((op->u.attn.max_span_tokens + S::BQ - 1) / S::BQ),
              (unsigned)op->u.attn.n_spans);
    attn_prefill_f16_kernel<HD, NW><<<grid, S::THREADS, S::SMEM, s>>>(*op, params);
    return cudaGetLastError();
}

/* Prefill attention of an op whose cache is f16 (kv.f16); head dims 64 and
 * 128, cudaErrorNotSupported for others (the caller falls back). Four warps
 * (64 rows) per block: on an H200, one causal 4096-token span with 32 query
 * and 8 kv heads of 128 dims ran at 247 TFLOP/s, against 239 with eight
 * warps and 184 with two. */
cudaError_t cu_launch_attention_prefill_f16(cudaStream_t s, const struct cu_op *op,
                                            const uint8_t *params, int smem_optin)
{
    if (!op->u.attn.kv.f16)
        return cudaErrorNotSupported;
    switch (op->u.attn.kv.head_dim) {
    case 64: return launch_prefill_f16<64, 4>(s, op, params, smem_optin);
    case 128: return launch_prefill_f16<128, 4>(s, op, params, smem_optin);
    default: return cudaErrorNotSupported;
    }
}
