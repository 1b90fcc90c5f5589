/* backend/cuda/attention_prefill.cu — prefill attention over an f16 paged KV cache: FlashAttention-2 on mma.sync tensor cores, and on Hopper's warp-group tensor cores (wgmma) with producer warps. */
#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fa_mma.cuh"
#include "backend/cuda/fa_wgmma.cuh"
#include "backend/cuda/warp.cuh"
#include "backend/cuda/wgmma.cuh"

/* A block of NW warps takes BQ = 16 NW query rows of one span and one query
 * head and walks the K/V tiles its rows attend to, oldest first. Each warp
 * owns 16 rows: Q (rounded to fp16, pre-scaled) stays in registers as mma
 * A fragments, S = Q K^T and O += P V are m16n8k16 mma.sync products with f32
 * accumulators in registers, and the online softmax runs on those registers
 * (a row lives in the four lanes of a quad). K and V tiles come through
 * fa_kv_stream (cp.async, one tile ahead of the tile being computed). Causal and
 * sliding-window masks are applied only to tiles that straddle some row's
 * range; a warp skips tiles wholly outside all of its rows' ranges. */
template <int HD, int NW>
struct fa_shape {
    static constexpr int BQ = 16 * NW; /* query rows per block */
    static constexpr int THREADS = 32 * NW;
    using stream = fa_kv_stream<HD, THREADS>;
};

template <int HD, int NW>
static __global__ void __launch_bounds__(32 * NW, 1)
attn_prefill_f16_kernel(struct cu_op op, const uint8_t *params)
{
    using S = fa_shape<HD, NW>;
    constexpr int BQ = S::BQ;
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
    const int pos0 = span->pos0;
    const fa_rows rows(pos0, n_tokens, q0, BQ, op.u.attn.window, warp);
    const int last_pos = rows.last_pos, k_begin = rows.k_begin, n_tiles = rows.n_tiles;
    fa_warp<HD> w;
    w.init();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int i = rows.wrow0 + g + 8 * h;
        w.qpos[h] = pos0 + (i < n_tokens ? i : n_tokens - 1);
    }

    /* Q: f32 -> fp16 A fragments, scaled into base-2 scores */
    const int q_dim = op.u.attn.n_heads * HD;
    {
        const float *qr[2];
#pragma unroll
        for (int h = 0; h < 2; h++)
            qr[h] = op.u.attn.q + (size_t)(span->row0 + w.qpos[h] - pos0) * q_dim +
                    (size_t)head * HD;
        w.load_q(qr, op.u.attn.scale * FA_LOG2E, t);
    }

    typename S::stream kvs;
    kvs.start(fa_smem, kv, op.u.attn.layer, bt, (size_t)kvh * HD, k_begin, last_pos, n_tiles);
    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_begin + it * FA_BK;
        kvs.wait(it);
        if (!rows.skips(k0))
            w.attend(kvs.k_tile(it), kvs.v_tile(it), k0, rows.straddles(k0), op.u.attn.window,
                     lane);
        __syncthreads(); /* the buffer is refilled after the next wait */
    }

    if (rows.warp_live)
        w.store(op.u.attn.out + (size_t)span->row0 * q_dim + (size_t)head * HD, q_dim, rows.wrow0,
                n_tokens, lane);
}

template <int HD, int NW>
static cudaError_t launch_prefill_f16(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, int smem_optin)
{
    using S = fa_shape<HD, NW>;
    constexpr size_t smem = S::stream::SMEM;
    if (smem > (size_t)smem_optin)
        return cudaErrorInvalidConfiguration;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_f16_kernel<HD, NW>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)op->u.attn.n_heads,
              (unsigned)((op->u.attn.max_span_tokens + S::BQ - 1) / S::BQ),
              (unsigned)op->u.attn.n_spans);
    attn_prefill_f16_kernel<HD, NW><<<grid, S::THREADS, smem, s>>>(*op, params);
    return cudaGetLastError();
}

/* ---- wgmma (sm_90a) --------------------------------------------------- */

/* FlashAttention on Hopper's warp-group tensor cores. A block of three warp
 * groups takes 128 query rows of one query head. Warp group 0 produces: it
 * copies each FW_BN-position K/V tile from the paged cache into one of
 * FW_STAGES stages of 128-byte swizzled shared memory (cp.async, a warp's
 * lanes over two rows' 16-byte chunks, each row's place in the cache looked
 * up once by one lane and passed round by shuffles), its registers lowered
 * so the consumers' can rise. Each consumer group owns 64 of the rows, each
 * warp 16 with their Q (fp16, pre-scaled) as mma.sync A fragments in its
 * registers, as the mma.sync kernel holds them (keeping Q in shared memory
 * measured 6% slower): S = Q K^T with wgmma (K from shared memory),
 * fa_warp's online softmax on the accumulators (each warp's 16 rows are an
 * mma.sync C fragment, so the step is the mma.sync kernel's), and O += P V
 * with P from registers as well and V read N-major. A tile's S goes out
 * together with the previous tile's P V, so its softmax runs while the
 * tensor cores add the tile before it, and the two consumer groups take
 * turns issuing (named barriers), so one group's softmax runs beside the
 * other's products.
 *
 * Stages are handed over by named barriers: full (each consumer group its
 * own: the producers arrive once the tile's copies landed, the group waits)
 * and empty (the producers wait for both groups). The producers announce
 * tile j once they issued tile j + 1 (three stages: that never waits on a
 * stage the consumers still hold). */
#define FW_BN 128     /* positions a K/V tile */
#define FW_STAGES 3   /* K/V tiles in shared memory */
#define FW_THREADS 384
#define FW_PRODUCER_REGS 56
#define FW_CONSUMER_REGS 224

template <int HD>
struct fw_tiles : wg_bars<FW_STAGES> {
    static_assert(HD % 64 == 0, "whole 128-byte rows");
    static constexpr uint32_t KV_BYTES = FW_BN * HD * 2; /* a K or a V tile */
    /* the 1,024-byte alignment of the swizzle, then the stages */
    static constexpr size_t SMEM = 1024 + FW_STAGES * 2 * (size_t)KV_BYTES;

    /* Byte offset of (row, 16-byte chunk) in a K or V tile: HD / 64
     * swizzled tiles of FW_BN rows of 128 bytes side by side. */
    static __device__ __forceinline__ uint32_t at(int row, int chunk)
    {
        return (uint32_t)(chunk >> 3) * (FW_BN * 128) + wgmma_swz(row, chunk & 7);
    }
};

/* Warp group 0: every tile's K and V rows into stage j % FW_STAGES. */
template <int HD>
static __device__ __forceinline__ void fw_produce(const struct cu_kv &kv, int layer,
                                                  const uint32_t *bt, int kvh,
                                                  const fa_rows &rows, uint32_t kv0)
{
    using T = fw_tiles<HD>;
    constexpr int RPW = FW_BN / 4; /* rows a producer warp copies */
    constexpr int CPR = HD / 8;    /* 16-byte chunks a row */
    constexpr int RPI = 32 / CPR;  /* rows a copy instruction of the warp covers */
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int chunk = lane % CPR, sub = lane / CPR;
    const __half *kc = (const __half *)kv.k, *vc = (const __half *)kv.v;
    const int bs = kv.block_size;
    const size_t layer_base = (size_t)layer * kv.n_blocks;
    const size_t kv_dim = (size_t)kv.n_kv_heads * HD, head_off = (size_t)kvh * HD;
    for (int j = 0; j <= rows.n_tiles; j++) {
        if (j < rows.n_tiles) {
            const int s = j % FW_STAGES;
            /* lane l finds row l of the warp's rows */
            const int pos = rows.k_begin + j * FW_BN + warp * RPW + lane % RPW;
            size_t my_off = FA_NO_ROW;
            if (pos <= rows.last_pos)
                my_off = ((layer_base + __ldg(bt + pos / bs)) * bs + pos % bs) * kv_dim + head_off;
            if (j >= FW_STAGES) /* both consumer groups are done with tile j - FW_STAGES */
                bar_sync(T::empty(s), FW_THREADS);
            const uint32_t kdst = kv0 + (uint32_t)s * 2 * T::KV_BYTES, vdst = kdst + T::KV_BYTES;
#pragma unroll
            for (int i = 0; i < RPW / RPI; i++) {
                const int r = i * RPI + sub;
                size_t off = __shfl_sync(0xffffffffu, my_off, r);
                const bool valid = off != FA_NO_ROW;
                off = valid ? off + (size_t)chunk * 8 : 0;
                const uint32_t o = T::at(warp * RPW + r, chunk);
                cp_async16(kdst + o, kc + off, valid);
                cp_async16(vdst + o, vc + off, valid);
            }
            cp_async_commit();
        }
        if (j >= 1) { /* tile j - 1 landed: hand it over */
            if (j < rows.n_tiles)
                cp_async_wait<1>();
            else
                cp_async_wait<0>();
            fence_proxy_async_smem();
            bar_arrive(T::full((j - 1) % FW_STAGES, 0), 256);
            bar_arrive(T::full((j - 1) % FW_STAGES, 1), 256);
        }
    }
}

template <int HD>
static __global__ void __launch_bounds__(FW_THREADS, 1)
attn_prefill_wgmma_kernel(struct cu_op op, const uint8_t *params)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = fw_tiles<HD>;
    extern __shared__ __align__(128) uint8_t fw_smem[];
    const uint32_t kv0 = (smem_addr(fw_smem) + 1023u) & ~1023u; /* the swizzle's alignment */
    const struct cu_kv kv = op.u.attn.kv;
    const int group = threadIdx.x / 128, c = group - 1; /* c: the consumer group */
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int head = blockIdx.x;
    const int kvh = head / (op.u.attn.n_heads / kv.n_kv_heads);
    const struct cu_span *span =
        (const struct cu_span *)(params + op.u.attn.spans_off) + blockIdx.z;
    /* the longest rows (latest tiles) are scheduled first */
    const int q0 = (gridDim.y - 1 - blockIdx.y) * 128;
    const int n_tokens = span->n_tokens;
    if (q0 >= n_tokens)
        return;
    const fa_rows rows(span->pos0, n_tokens, q0, 128, op.u.attn.window, c > 0 ? 1 : 0, FW_BN,
                       64);

    if (group == 0) {
        regs_lower_to<FW_PRODUCER_REGS>();
        fw_produce<HD>(kv, op.u.attn.layer, (const uint32_t *)(params + span->bt_off), kvh, rows,
                       kv0);
        return;
    }

    regs_raise_to<FW_CONSUMER_REGS>();
    const int g = lane >> 2, t = lane & 3, window = op.u.attn.window;
    const int wrow0 = rows.wrow0 + 16 * (warp % 4); /* this warp's 16 rows */
    fa_warp<HD> w;
    w.init();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = wrow0 + g + 8 * h;
        w.qpos[h] = span->pos0 + (i < n_tokens ? i : n_tokens - 1);
    }
    const int q_dim = op.u.attn.n_heads * HD;
    {
        const float *qr[2];
#pragma unroll
        for (int h = 0; h < 2; h++)
            qr[h] = op.u.attn.q + (size_t)(span->row0 + w.qpos[h] - span->pos0) * q_dim +
                    (size_t)head * HD;
        w.load_q(qr, op.u.attn.scale * FA_LOG2E, t);
    }
    wg_attend<HD, FW_BN, FW_STAGES, FW_THREADS>(w, rows, kv0, c, window, lane);
    w.store(op.u.attn.out + (size_t)span->row0 * q_dim + (size_t)head * HD, q_dim, wrow0,
            n_tokens, lane);
#endif
}

template <int HD>
static cudaError_t launch_prefill_wgmma(cudaStream_t s, const struct cu_op *op,
                                        const uint8_t *params, int smem_optin)
{
    static int native = -1;
    constexpr size_t smem = fw_tiles<HD>::SMEM;
    if (smem > (size_t)smem_optin || !kernel_runs_sm90a(attn_prefill_wgmma_kernel<HD>, &native))
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_wgmma_kernel<HD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)op->u.attn.n_heads, (unsigned)((op->u.attn.max_span_tokens + 127) / 128),
              (unsigned)op->u.attn.n_spans);
    attn_prefill_wgmma_kernel<HD><<<grid, FW_THREADS, smem, s>>>(*op, params);
    return cudaGetLastError();
}

/* Prefill attention of an op whose cache is f16 (kv.f16); head dims 64 and
 * 128, cudaErrorNotSupported for others (the caller falls back). With
 * wgmma, where the GPU runs the sm_90a machine code, the warp-group kernel
 * (on an H100, a causal 4096-token chunk with 32 query and 8 kv heads of 128
 * dims: 386 us against 703 us on mma.sync); else mma.sync with four warps
 * (64 rows) per block: on an H200, one causal 4096-token span of that shape
 * ran at 247 TFLOP/s, against 239 with eight warps and 184 with two. */
cudaError_t cu_launch_attention_prefill_f16(cudaStream_t s, const struct cu_op *op,
                                            const uint8_t *params, int smem_optin, bool wgmma)
{
    const int hd = op->u.attn.kv.head_dim;
    if (!op->u.attn.kv.f16 || (hd != 64 && hd != 128))
        return cudaErrorNotSupported;
    if (wgmma) {
        cudaError_t e = hd == 64 ? launch_prefill_wgmma<64>(s, op, params, smem_optin)
                                 : launch_prefill_wgmma<128>(s, op, params, smem_optin);
        if (e != cudaErrorNotSupported)
            return e;
    }
    return hd == 64 ? launch_prefill_f16<64, 4>(s, op, params, smem_optin)
                    : launch_prefill_f16<128, 4>(s, op, params, smem_optin);
}
