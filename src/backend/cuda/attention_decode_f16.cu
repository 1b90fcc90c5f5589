/* backend/cuda/attention_decode_f16.cu — decode attention of many sequences over an f16 paged KV cache on mma.sync tensor cores. */
#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fa_mma.cuh"
#include "backend/cuda/warp.cuh"

/* A block of DM_WARPS warps takes one row (a sequence's newest token), one
 * kv head and one split of the row's positions. The kv head's query heads
 * (its GQA group, at most 16) are the 16 rows of the mma A fragments - rows
 * past the group repeat its last head and are never stored - so K and V are
 * read once for the whole group. The K/V tiles come through fa_kv_stream
 * (cp.async, one tile ahead of the tile computed); warp w attends to
 * positions 16 w .. 16 w + 15 of each tile with an online softmax of its
 * own (fa_warp, in base 2), and at the end the warps' states are merged
 * through shared memory in warp order. A row whose positions fall in one
 * split is written directly; otherwise the split leaves (m, l, acc) in
 * part, as the flash-decoding kernel does (m in natural-log units), for
 * cu_launch_attention_merge.
 *
 * Against the f32-accumulating flash-decoding kernel (attention.cu), which
 * does its products with FMAs, this one spends a few mma instructions per
 * 16 positions: with many sequences a step's decode attention is bound by
 * reading the cache, not by issuing arithmetic. q and the softmax weights
 * are rounded to fp16 for the products, as in the prefill kernel.
 *
 * PREP (fuse.h rule 1's fold, every row one token): the q/k launch before
 * the attention is folded in. Each block prepares its group's query heads
 * from the raw q (RMSNorm, RoPE) into shared memory with the q/k launch's
 * own code (qk_head_prep), so the bits are that launch's; the block whose
 * split holds the row's newest position prepares that position's K, and
 * writes it and the V into the cache before its first tile is copied (the
 * copies read them back through L2 after the barrier). The other splits'
 * copies go out before the q work, whose latency they cover. */
#define DM_WARPS (FA_BK / 16)
#define DM_THREADS (32 * DM_WARPS)

template <int HD>
struct dm_shape {
    using stream = fa_kv_stream<HD, DM_THREADS>;
    /* the warps' states for the merge, over the K/V buffers once they are done */
    static constexpr size_t SMEM = stream::SMEM > FA_DECODE_MERGE_BYTES(HD, DM_WARPS)
                                       ? stream::SMEM
                                       : FA_DECODE_MERGE_BYTES(HD, DM_WARPS);
};

template <int HD, bool PREP>
static __global__ void __launch_bounds__(DM_THREADS)
attn_decode_mma_kernel(struct cu_op op, const uint8_t *params, float *part, struct cu_qk_args prep)
{
    using S = dm_shape<HD>;
    extern __shared__ __align__(128) uint8_t fa_smem[];
    __shared__ __align__(16) float q_sm[PREP ? 16 : 1][PREP ? HD : 1];
    __shared__ __align__(16) float k_sm[PREP ? HD : 1];
    const struct cu_kv kv = op.u.attn.kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int group = op.u.attn.n_heads / kv.n_kv_heads;
    const int kvh = blockIdx.x, h0 = kvh * group;
    const int split = blockIdx.y, n_splits = gridDim.y, row = blockIdx.z;

    struct decode_split ds;
    if (!decode_split_of(op, params, row, split, n_splits, &ds))
        return;
    const int first = ds.first, last = ds.last, begin = ds.begin, end = ds.end;
    const int n_active = ds.n_active;
    /* splits are whole tiles: the bucket and the split count are powers of
     * two and a split holds at least FA_BK positions */
    const int k_begin = begin - begin % FA_BK;
    const int n_tiles = (end - k_begin) / FA_BK + 1;
    const int window = op.u.attn.window;

    const int q_dim = op.u.attn.n_heads * HD;
    const float *q_row = op.u.attn.q + (size_t)row * q_dim + (size_t)h0 * HD;
    const bool writes_newest = PREP && split == ds.s_first + n_active - 1;
    typename S::stream kvs;
    if (!writes_newest)
        kvs.start(fa_smem, kv, op.u.attn.layer, ds.bt, (size_t)kvh * HD, k_begin, end, n_tiles);
    if (PREP) {
        float pos;
        const float *inv_freq = qk_row_freqs(prep, params, row, &pos);
        for (int j = warp; j < group + (writes_newest ? 1 : 0); j += DM_WARPS) {
            if (j < group) {
                qk_head_prep(q_row + (size_t)j * HD, prep.q_norm, prep.eps, HD, prep.rot_dim, pos,
                             inv_freq, prep.factor, q_sm[j]);
                continue;
            }
            const size_t kv_row = ((size_t)row * kv.n_kv_heads + kvh) * HD;
            qk_head_prep(prep.k + kv_row, prep.k_norm, prep.eps, HD, prep.rot_dim, pos, inv_freq,
                         prep.factor, k_sm);
            const size_t slot = slot_offset(&kv, op.u.attn.layer, ds.bt, last) + (size_t)kvh * HD;
            for (int i = lane; i < HD; i += 32) {
                ((__half *)kv.k)[slot + i] = __float2half_rn(k_sm[i]);
                ((__half *)kv.v)[slot + i] = __float2half_rn(prep.v[kv_row + i]);
            }
        }
        __syncthreads();
    }
    if (writes_newest)
        kvs.start(fa_smem, kv, op.u.attn.layer, ds.bt, (size_t)kvh * HD, k_begin, end, n_tiles);

    fa_warp<HD> w;
    w.init();
    w.qpos[0] = w.qpos[1] = last;
    {
        const float *qr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = g + 8 * h;
            i = i < group ? i : group - 1;
            qr[h] = PREP ? q_sm[i] : q_row + (size_t)i * HD;
        }
        w.load_q(qr, op.u.attn.scale * FA_LOG2E, t);
    }
    constexpr uint32_t SUB_BYTES = 16 * HD * sizeof(__half); /* a warp's 16 rows of a tile */
    for (int it = 0; it < n_tiles; it++) {
        const int p0 = k_begin + it * FA_BK + 16 * warp; /* this warp's first position */
        kvs.wait(it);
        if (p0 <= end && p0 + 15 >= begin)
            w.template attend<16>(kvs.k_tile(it) + warp * SUB_BYTES,
                                  kvs.v_tile(it) + warp * SUB_BYTES, p0,
                                  p0 + 15 > last || p0 < first, window, lane);
        __syncthreads(); /* the buffer is refilled after the next wait */
    }
    cp_async_wait<0>();
    __syncthreads();

    fa_decode_finish<HD, DM_WARPS>(w, fa_smem, op, part, row, h0, group, split, n_splits,
                                   n_active == 1);
}

template <int HD, bool PREP>
static cudaError_t launch_decode_mma(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                     float *part, int smem_optin, const struct cu_qk_args *qk)
{
    constexpr size_t smem = dm_shape<HD>::SMEM;
    if (smem > (size_t)smem_optin)
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(attn_decode_mma_kernel<HD, PREP>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    const int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)op->u.attn.kv.n_kv_heads, (unsigned)n_splits, (unsigned)op->n_rows);
    attn_decode_mma_kernel<HD, PREP><<<grid, DM_THREADS, smem, s>>>(
        *op, params, n_splits > 1 ? part + CU_ATTN_COUNTERS : NULL,
        qk ? *qk : cu_qk_args{});
    if ((e = cudaGetLastError()) != cudaSuccess || n_splits == 1)
        return e;
    return cu_launch_attention_merge(s, op, params, part);
}

cudaError_t cu_launch_attention_decode_f16(cudaStream_t s, const struct cu_op *op,
                                           const uint8_t *params, float *part, int smem_optin,
                                           const struct cu_qk_args *qk)
{
    if (!cu_attention_uses_mma(op) || (qk && !cu_attention_takes_qk(op, qk)))
        return cudaErrorNotSupported;
    if (op->u.attn.kv.head_dim == 64)
        return qk ? launch_decode_mma<64, true>(s, op, params, part, smem_optin, qk)
                  : launch_decode_mma<64, false>(s, op, params, part, smem_optin, NULL);
    return qk ? launch_decode_mma<128, true>(s, op, params, part, smem_optin, qk)
              : launch_decode_mma<128, false>(s, op, params, part, smem_optin, NULL);
}
