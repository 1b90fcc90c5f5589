/* backend/cuda/attention_decode_quant.cu — decode attention over a quantized paged KV cache (backend/kv_quant.h) on mma.sync tensor cores: each warp streams its own positions' records into shared memory, decodes them there to fp16 tiles and runs the f16 cache's FlashAttention-2 warp step (fa_mma.cuh) on them. */
#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fa_mma.cuh"
#include "backend/cuda/kv_records.cuh"
#include "backend/cuda/kv_rotate.cuh"

/* A block of DQ_WARPS warps takes one row (a sequence's newest token), one
 * kv head and one split of the row's positions, as the f16 cache's decode
 * kernel (attention_decode_f16.cu) does: the kv head's query heads are the
 * 16 rows of the mma A fragments, so each record is read and decoded once
 * for the whole group. Warp w owns positions 16 w .. 16 w + 15 of every
 * FA_BK-position tile of the split, and nothing else: it copies their
 * records (cp.async, DQ_STAGES sub-tiles in flight, the lanes of a record's
 * 16-byte chunks side by side), decodes them into its own fp16 K and V
 * sub-tiles (swizzled as fa_mma.cuh's tiles) and attends to them with an
 * online softmax of its own. No block barrier runs between the first copy
 * and the last tile; at the end the warps' states are merged in warp order
 * (fa_decode_finish). The copies and the decoding are kv_records.cuh's.
 * The query is rounded to fp16 as in the f16 kernel; TURBO rotates it once
 * first (keys' R) and the caller turns the output back from the values'
 * frame (qattn_unrotate_kernel). */
#define DQ_WARPS (FA_BK / 16)
#define DQ_THREADS (32 * DQ_WARPS)
#define DQ_STAGES 2        /* a warp's sub-tiles of records in flight */
/* blocks an SM the registers must allow: three fit the shared memory of
 * 8-bit records of head dim 128 */
#define DQ_MIN_BLOCKS 3

/* A warp's shared memory: its K and V fp16 sub-tiles, then DQ_STAGES
 * sub-tiles of raw records (K's, then V's). */
static __host__ __device__ __forceinline__ size_t dq_warp_bytes(const struct kv_quant_layer &f,
                                                                int hd)
{
    const int raw = DQ_ROWS * (dq_record_room(kvq_head_bytes(&f, hd, false)) +
                               dq_record_room(kvq_head_bytes(&f, hd, true)));
    return 2 * (size_t)DQ_ROWS * hd * sizeof(__half) + (size_t)DQ_STAGES * raw;
}

/* The block's: the two sides' level tables, TURBO's rotated query rows, the
 * warps' regions (the merge's room once they are done), and 16 bytes the
 * last record's word loads may read past. */
static __host__ __device__ __forceinline__ size_t dq_block_bytes(const struct kv_quant_layer &f,
                                                                 int hd)
{
    const size_t q = f.scheme == KV_QUANT_TURBO ? (size_t)DQ_ROWS * hd * sizeof(float) : 0;
    size_t warps = DQ_WARPS * dq_warp_bytes(f, hd);
    if (warps < FA_DECODE_MERGE_BYTES(hd, DQ_WARPS))
        warps = FA_DECODE_MERGE_BYTES(hd, DQ_WARPS);
    return 2 * DQ_TABLE_BYTES + q + warps + 16;
}

template <int HD>
static __global__ void __launch_bounds__(DQ_THREADS, DQ_MIN_BLOCKS)
qattn_decode_mma_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    extern __shared__ __align__(128) uint8_t dq_smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int group = op.u.attn.n_heads / kv.n_kv_heads;
    const int kvh = blockIdx.x, h0 = kvh * group, layer = op.u.attn.layer;
    const int split = blockIdx.y, n_splits = gridDim.y, row = blockIdx.z;

    struct decode_split ds;
    if (!decode_split_of(op, params, row, split, n_splits, &ds))
        return;
    /* splits are whole tiles (the bucket and the split count are powers of
     * two and a split holds at least FA_BK positions) */
    const int k_begin = ds.begin - ds.begin % FA_BK;
    const int w_first = k_begin + DQ_ROWS * warp; /* this warp's first position */
    const int n_sub = ds.end >= w_first ? (ds.end - w_first) / FA_BK + 1 : 0;

    const bool turbo = f.scheme == KV_QUANT_TURBO;
    uint8_t *ktab = dq_smem, *vtab = ktab + DQ_TABLE_BYTES;
    float *q_sm = (float *)(vtab + DQ_TABLE_BYTES);
    uint8_t *warps = (uint8_t *)q_sm + (turbo ? DQ_ROWS * HD * sizeof(float) : 0);
    uint8_t *mine = warps + (size_t)warp * dq_warp_bytes(f, HD);
    const uint32_t kdec = smem_addr(mine), vdec = kdec + DQ_ROWS * HD * sizeof(__half);
    uint8_t *raw = mine + 2 * DQ_ROWS * HD * sizeof(__half);
    const int kroom = dq_record_room(kvq_head_bytes(&f, HD, false));
    const int vroom = dq_record_room(kvq_head_bytes(&f, HD, true));

    dq_stream st;
    st.init(dq_side_of(kv, layer, kvh, HD, false), dq_side_of(kv, layer, kvh, HD, true), ds.bt,
            kv.block_size, ds.last, smem_addr(raw), kroom, vroom, DQ_STAGES, lane);
    /* the first sub-tiles' copies cover the query and table work */
    for (int j = 0; j < DQ_STAGES - 1; j++) {
        if (j < n_sub)
            st.copy(w_first + j * FA_BK, j, lane);
        cp_async_commit();
    }

    const int q_dim = op.u.attn.n_heads * HD;
    const float *q_row = op.u.attn.q + (size_t)row * q_dim + (size_t)h0 * HD;
    if (turbo) {
        dq_levels(kv, st.k.bits, ktab);
        dq_levels(kv, st.v.bits, vtab);
        for (int i = threadIdx.x; i < group * HD; i += DQ_THREADS)
            q_sm[i] = q_row[i];
        __syncthreads();
        for (int j = warp; j < group; j += DQ_WARPS)
            warp_rotate(q_sm + j * HD, HD, kv.seed, 0, layer, false);
        __syncthreads();
    }
    fa_warp<HD> w;
    w.init();
    w.qpos[0] = w.qpos[1] = ds.last;
    {
        const float *qr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = g + 8 * h;
            i = i < group ? i : group - 1;
            qr[h] = (turbo ? q_sm : q_row) + (size_t)i * HD;
        }
        w.load_q(qr, op.u.attn.scale * FA_LOG2E, t);
    }

    for (int j = 0; j < n_sub; j++) {
        cp_async_wait<DQ_STAGES - 2>();
        __syncwarp(); /* sub-tile j is in; j - 1's buffers are free */
        if (j + DQ_STAGES - 1 < n_sub)
            st.copy(w_first + (j + DQ_STAGES - 1) * FA_BK, j + DQ_STAGES - 1, lane);
        cp_async_commit();
        const uint8_t *stage = raw + (size_t)(j % DQ_STAGES) * st.stage_bytes;
        dq_decode<HD>(stage, kroom, st.k, ktab, kdec, lane);
        dq_decode<HD>(stage + DQ_ROWS * kroom, vroom, st.v, vtab, vdec, lane);
        __syncwarp();
        const int p0 = w_first + j * FA_BK;
        w.template attend<DQ_ROWS>(kdec, vdec, p0, p0 + DQ_ROWS - 1 > ds.last || p0 < ds.first,
                                   op.u.attn.window, lane);
    }
    cp_async_wait<0>();
    __syncthreads();
    fa_decode_finish<HD, DQ_WARPS>(w, warps, op, part, row, h0, group, split, n_splits,
                                   ds.n_active == 1);
}

template <int HD>
static cudaError_t launch_qdecode_mma(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part, int smem_optin)
{
    const size_t smem = dq_block_bytes(op->u.attn.kv.fmt, HD);
    if (smem > (size_t)smem_optin)
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(qattn_decode_mma_kernel<HD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    const int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)op->u.attn.kv.n_kv_heads, (unsigned)n_splits, (unsigned)op->n_rows);
    qattn_decode_mma_kernel<HD><<<grid, DQ_THREADS, smem, s>>>(
        *op, params, n_splits > 1 ? part + CU_ATTN_COUNTERS : NULL);
    if ((e = cudaGetLastError()) != cudaSuccess || n_splits == 1)
        return e;
    return cu_launch_attention_merge(s, op, params, part);
}

cudaError_t cu_launch_attention_decode_quant(cudaStream_t s, const struct cu_op *op,
                                             const uint8_t *params, float *part, int smem_optin)
{
    const struct cu_kv *kv = &op->u.attn.kv;
    const struct kv_quant_layer *f = &kv->fmt;
    const bool readable = f->scheme == KV_QUANT_AFFINE || (f->scheme == KV_QUANT_TURBO && !f->qjl);
    if (!readable || op->u.attn.row_invariant || cu_attention_uses_prefill(op) ||
        op->u.attn.n_heads > kv->n_kv_heads * CU_ATTN_MMA_MAX_GROUP)
        return cudaErrorNotSupported;
    if (kv->head_dim == 64)
        return launch_qdecode_mma<64>(s, op, params, part, smem_optin);
    if (kv->head_dim == 128)
        return launch_qdecode_mma<128>(s, op, params, part, smem_optin);
    return cudaErrorNotSupported;
}
