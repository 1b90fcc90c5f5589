/* backend/cuda/attention_decode_quant.cu — decode attention over a quantized paged KV cache (backend/kv_quant.h) on mma.sync tensor cores: each warp streams its own positions' records into shared memory, decodes them there to fp16 tiles and runs the f16 cache's FlashAttention-2 warp step (fa_mma.cuh) on them. */
#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fa_mma.cuh"
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
 * (fa_decode_finish).
 *
 * Decoding, 8 elements a lane at a time (whole bytes of codes): affine
 * codes become fp16 through their bits under 1024's exponent, less 1024
 * (exact), then one fused scale * code + bias in fp16, whose operands are
 * the record's own f16 scale and bias, so each element is rounded once;
 * TURBO codes are looked up in the block's fp16 copy of the Lloyd–Max
 * levels (a pair of codes at a time for widths up to 4 bits) and scaled by
 * the record's f16 norm. The query is rounded to fp16 as in the f16
 * kernel; TURBO rotates it once first (keys' R) and the caller turns the
 * output back from the values' frame (qattn_unrotate_kernel). */
#define DQ_WARPS (FA_BK / 16)
#define DQ_THREADS (32 * DQ_WARPS)
#define DQ_ROWS 16         /* positions of a tile a warp owns */
#define DQ_STAGES 2        /* a warp's sub-tiles of records in flight */
#define DQ_TABLE_BYTES 1024 /* one side's TURBO levels in fp16 */
/* blocks an SM the registers must allow: three fit the shared memory of
 * 8-bit records of head dim 128 */
#define DQ_MIN_BLOCKS 3
#define DQ_NO_SLOT 0xffffffffu

/* One side (K or V) of a kv head's records in one layer. */
struct dq_side {
    const uint8_t *base; /* the 16-byte chunk where the head's record starts, slot 0 of block 0 */
    uint32_t row_bytes;  /* a slot's row: every kv head's record */
    int lead;            /* bytes of that chunk before the record */
    int chunks;          /* 16-byte chunks copied per record */
    int bits;            /* per code */
    bool turbo;
    int code_off;    /* bytes before the codes: TURBO's norm */
    int pair_off;    /* AFFINE: bytes before the (scale, bias) pairs */
    int group_shift; /* AFFINE: the 8 dims of chunk c share pair c >> group_shift */
};

/* Room for one record of `bytes` in a sub-tile, whatever its lead. */
static __host__ __device__ __forceinline__ int dq_record_room(int bytes)
{
    return 16 * ((bytes + 15) / 16 + (bytes % 16 != 0));
}

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

static __device__ __forceinline__ dq_side dq_side_of(const struct cu_kv &kv, int layer, int h,
                                                     int hd, bool v)
{
    const struct kv_quant_layer &f = kv.fmt;
    const int bytes = kvq_head_bytes(&f, hd, v);
    const size_t at = (size_t)h * bytes;
    dq_side s;
    s.row_bytes = v ? kv.v_row_bytes : kv.k_row_bytes;
    s.base = (const uint8_t *)(v ? kv.v : kv.k) +
             (size_t)layer * kv.n_blocks * kv.block_size * s.row_bytes + (at & ~(size_t)15);
    s.lead = (int)(at & 15);
    s.chunks = (s.lead + bytes + 15) / 16;
    s.bits = kvq_code_bits(&f, v);
    s.turbo = f.scheme == KV_QUANT_TURBO;
    s.code_off = s.turbo ? 2 : 0;
    s.pair_off = hd * s.bits / 8;
    s.group_shift = s.turbo ? 0 : __ffs(f.group_size / 8) - 1;
    return s;
}

/* A side's Lloyd–Max levels as fp16 in tab: pairs (level of the low code,
 * level of the high one) indexed by two codes for widths up to 4 bits,
 * single levels otherwise. By the block's threads. */
static __device__ __forceinline__ void dq_levels(const struct cu_kv &kv, int bits, uint8_t *tab)
{
    const float *lv = kv.cb->levels[bits];
    const int mask = (1 << bits) - 1;
    if (bits <= 4) {
        for (int i = threadIdx.x; i < 1 << (2 * bits); i += DQ_THREADS)
            ((__half2 *)tab)[i] = __floats2half2_rn(lv[i & mask], lv[i >> bits]);
    } else {
        for (int i = threadIdx.x; i <= mask; i += DQ_THREADS)
            ((__half *)tab)[i] = __float2half_rn(lv[i]);
    }
}

/* B bytes from shared memory: the first four in lo, the rest in hi. At any
 * alignment unless aligned (p a multiple of 8, or of 4 for B = 4); the
 * words after them may be read. */
template <int B>
static __device__ __forceinline__ void dq_bytes(const uint8_t *p, bool aligned, uint32_t &lo,
                                                uint32_t &hi)
{
    if (aligned && B == 8) {
        const uint2 v = *(const uint2 *)p;
        lo = v.x, hi = v.y;
        return;
    }
    if (aligned && B == 4) {
        lo = *(const uint32_t *)p, hi = 0u;
        return;
    }
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = 8u * (uint32_t)(a & 3);
    const uint32_t w0 = w[0], w1 = w[1];
    lo = __funnelshift_r(w0, w1, sh);
    hi = B > 4 ? __funnelshift_r(w1, w[2], sh) : 0u;
}

static __device__ __forceinline__ __half2 dq_h2(uint32_t v)
{
    return *(__half2 *)&v;
}

static __device__ __forceinline__ uint32_t dq_u32(__half2 v)
{
    return *(uint32_t *)&v;
}

/* Two byte codes (bytes i and j of x) as fp16 pair scale * code + bias. */
static __device__ __forceinline__ uint32_t dq_affine_pair(uint32_t x, uint32_t sel, __half2 s,
                                                          __half2 b)
{
    /* code c as the fp16 bits 0x6400 | c = 1024 + c, less 1024: exact */
    const __half2 c = __hsub2(dq_h2(__byte_perm(x, 0x64646464u, sel)),
                              __float2half2_rn(1024.0f));
    return dq_u32(__hfma2(c, s, b));
}

/* Elements 8 c .. 8 c + 7 of a record from its B bytes of codes (lo, hi). */
template <int B, bool TURBO>
static __device__ __forceinline__ uint4 dq_chunk(uint32_t lo, uint32_t hi, const uint8_t *rec,
                                                 const dq_side &sd, int c, const uint8_t *tab)
{
    uint4 out;
    if (!TURBO) {
        if (B == 4) { /* nibbles to one code a byte */
            const uint32_t e = lo & 0x0f0f0f0fu, o = (lo >> 4) & 0x0f0f0f0fu;
            lo = __byte_perm(e, o, 0x5140);
            hi = __byte_perm(e, o, 0x7362);
        }
        const uint32_t pair =
            *(const uint32_t *)(rec + sd.pair_off + ((c >> sd.group_shift) << 2));
        const __half2 s = dq_h2(__byte_perm(pair, 0, 0x1010)), b = dq_h2(__byte_perm(pair, 0, 0x3232));
        out.x = dq_affine_pair(lo, 0x4140, s, b);
        out.y = dq_affine_pair(lo, 0x4342, s, b);
        out.z = dq_affine_pair(hi, 0x4140, s, b);
        out.w = dq_affine_pair(hi, 0x4342, s, b);
        return out;
    }
    const uint32_t nb = *(const unsigned short *)rec;
    const __half2 norm = dq_h2(nb | nb << 16);
    uint32_t v[4];
    if (B <= 4) {
        const uint32_t *pairs = (const uint32_t *)tab;
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = dq_u32(__hmul2(dq_h2(pairs[(lo >> (2 * B * k)) & ((1u << 2 * B) - 1)]), norm));
    } else {
        const unsigned short *one = (const unsigned short *)tab;
        const uint64_t x = (uint64_t)hi << 32 | lo;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t a = one[(uint32_t)(x >> (B * 2 * k)) & ((1u << B) - 1)];
            const uint32_t b = one[(uint32_t)(x >> (B * (2 * k + 1))) & ((1u << B) - 1)];
            v[k] = dq_u32(__hmul2(dq_h2(a | b << 16), norm));
        }
    }
    out.x = v[0], out.y = v[1], out.z = v[2], out.w = v[3];
    return out;
}

/* A warp's DQ_ROWS records of one side (raw, stride bytes apart) into an
 * fp16 sub-tile at dst, a 16-byte chunk of 8 elements a lane at a time. */
template <int HD, int B, bool TURBO>
static __device__ __forceinline__ void dq_decode_b(const uint8_t *raw, int stride,
                                                   const dq_side &sd, const uint8_t *tab,
                                                   uint32_t dst, int lane)
{
    constexpr int CPR = HD / 8, RPI = 32 / CPR;
    const int c = lane % CPR;
    /* records start at the same offset in every room (rooms are multiples
     * of 16 bytes) */
    const bool aligned = ((sd.lead + sd.code_off) & (B == 8 ? 7 : 3)) == 0;
#pragma unroll 2
    for (int i = 0; i < DQ_ROWS / RPI; i++) {
        const int r = lane / CPR + i * RPI;
        const uint8_t *rec = raw + r * stride + sd.lead;
        uint32_t lo, hi;
        dq_bytes<B>(rec + sd.code_off + c * B, aligned, lo, hi);
        const uint4 x = dq_chunk<B, TURBO>(lo, hi, rec, sd, c, tab);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz<HD>(r, c)),
                     "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w));
    }
}

template <int HD>
static __device__ __forceinline__ void dq_decode(const uint8_t *raw, int stride,
                                                 const dq_side &sd, const uint8_t *tab,
                                                 uint32_t dst, int lane)
{
    if (!sd.turbo) {
        if (sd.bits == 4)
            dq_decode_b<HD, 4, false>(raw, stride, sd, tab, dst, lane);
        else
            dq_decode_b<HD, 8, false>(raw, stride, sd, tab, dst, lane);
        return;
    }
    switch (sd.bits) {
    case 2: dq_decode_b<HD, 2, true>(raw, stride, sd, tab, dst, lane); break;
    case 3: dq_decode_b<HD, 3, true>(raw, stride, sd, tab, dst, lane); break;
    case 4: dq_decode_b<HD, 4, true>(raw, stride, sd, tab, dst, lane); break;
    case 5: dq_decode_b<HD, 5, true>(raw, stride, sd, tab, dst, lane); break;
    default: dq_decode_b<HD, 8, true>(raw, stride, sd, tab, dst, lane); break;
    }
}

/* A warp's copies of its records, DQ_STAGES sub-tiles deep. Each pass
 * copies the records of one position (two when a position's K and V chunks
 * fit 16 lanes), a lane per 16-byte chunk, K's chunks then V's, so a
 * record's chunks are read side by side. */
struct dq_stream {
    dq_side k, v;
    const uint32_t *bt;
    int block_size, last;
    uint32_t raw0;          /* shared address of stage 0 */
    int kroom, vroom;       /* bytes a record takes in a sub-tile */
    uint32_t stage_bytes;
    /* this lane's part of a pass */
    int per_pass, pos_in_pass;
    bool copies, of_v;
    uint32_t dst_off, src_off; /* its chunk's offset in a record's room and in the record's row */

    __device__ __forceinline__ void init(const dq_side &k_, const dq_side &v_,
                                         const uint32_t *bt_, int block_size_, int last_,
                                         uint32_t raw0_, int kroom_, int vroom_, int lane)
    {
        k = k_, v = v_, bt = bt_, block_size = block_size_, last = last_;
        raw0 = raw0_, kroom = kroom_, vroom = vroom_;
        stage_bytes = (uint32_t)(DQ_ROWS * (kroom + vroom));
        const int lanes = k.chunks + v.chunks <= 16 ? 16 : 32;
        per_pass = 32 / lanes;
        pos_in_pass = lane / lanes;
        const int ci = lane % lanes;
        copies = ci < k.chunks + v.chunks;
        of_v = ci >= k.chunks;
        const int chunk = of_v ? ci - k.chunks : ci;
        dst_off = (of_v ? DQ_ROWS * kroom : 0) + 16 * chunk;
        src_off = 16 * chunk;
    }

    /* Issues the copies of the sub-tile at positions p0.. into stage j's
     * room (positions past last are zero-filled). */
    __device__ __forceinline__ void copy(int p0, int j, int lane) const
    {
        uint32_t slot = DQ_NO_SLOT;
        const int p = p0 + lane;
        if (lane < DQ_ROWS && p <= last) {
            const uint32_t blk = __ldg(bt + p / block_size);
            slot = blk * (uint32_t)block_size + (uint32_t)(p % block_size);
        }
        const uint32_t dst = raw0 + (uint32_t)(j % DQ_STAGES) * stage_bytes + dst_off;
        const uint8_t *src = (of_v ? v.base : k.base) + src_off;
        const uint32_t row_bytes = of_v ? v.row_bytes : k.row_bytes;
        const int room = of_v ? vroom : kroom;
        for (int i = 0; i < DQ_ROWS / per_pass; i++) {
            const int r = i * per_pass + pos_in_pass;
            const uint32_t s = __shfl_sync(0xffffffffu, slot, r);
            if (copies)
                cp_async16(dst + (uint32_t)(r * room),
                           src + (s == DQ_NO_SLOT ? 0 : (size_t)s * row_bytes), s != DQ_NO_SLOT);
        }
    }
};

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
            kv.block_size, ds.last, smem_addr(raw), kroom, vroom, lane);
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
