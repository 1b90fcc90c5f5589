/* backend/cuda/attention_decode_quant.cu — decode attention over a quantized paged KV cache (backend/kv_quant.h) on mma.sync tensor cores: each warp streams its own positions' records into shared memory, decodes them there to fp16 tiles and runs the f16 cache's FlashAttention-2 warp step (fa_mma.cuh) on them; the scores of an affine cache and of TurboQuant keys of 4 or 8 bits are taken from the codes themselves (positions the mma rows), so is an affine cache's P V (O^T = V^T P^T on the codes, P scaled by each group's scale), and TurboQuant V of 2 to 4 bits enters P V as its codes' bare levels with the norm applied to P. */
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

/* Where a decode block of DQ_WARPS warps works (blockIdx: kv head, split,
 * row) and the sub-tiles the calling warp owns there. */
struct dq_block {
    int warp, lane, g, t;
    int group, kvh, h0, layer, split, n_splits, row;
    struct decode_split ds;
    int w_first, n_sub; /* this warp's first position, and its sub-tiles */
};

/* False for a block whose split holds none of its row's positions. */
static __device__ __forceinline__ bool dq_block_of(const struct cu_op &op, const uint8_t *params,
                                                   dq_block &b)
{
    b.warp = threadIdx.x / 32, b.lane = threadIdx.x & 31;
    b.g = b.lane >> 2, b.t = b.lane & 3;
    b.group = op.u.attn.n_heads / op.u.attn.kv.n_kv_heads;
    b.kvh = blockIdx.x, b.h0 = b.kvh * b.group, b.layer = op.u.attn.layer;
    b.split = blockIdx.y, b.n_splits = gridDim.y, b.row = blockIdx.z;
    if (!decode_split_of(op, params, b.row, b.split, b.n_splits, &b.ds))
        return false;
    /* splits are whole tiles (the bucket and the split count are powers of
     * two and a split holds at least FA_BK positions) */
    const int k_begin = b.ds.begin - b.ds.begin % FA_BK;
    b.w_first = k_begin + DQ_ROWS * b.warp;
    b.n_sub = b.ds.end >= b.w_first ? (b.ds.end - b.w_first) / FA_BK + 1 : 0;
    return true;
}

/* The calling warp's stream of its sub-tiles' records into its rooms at
 * raw (shared), the first copies issued. */
static __device__ __forceinline__ void dq_stream_start(dq_stream &st, const dq_block &b,
                                                       const struct cu_kv &kv, int hd,
                                                       uint32_t raw, int kroom, int vroom)
{
    st.init(dq_side_of(kv, b.layer, b.kvh, hd, false), dq_side_of(kv, b.layer, b.kvh, hd, true),
            b.ds.bt, kv.block_size, b.ds.last, raw, kroom, vroom, DQ_STAGES, b.lane);
    st.prime<DQ_STAGES>(b.w_first, b.n_sub, b.lane);
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

template <int HD>
static __global__ void __launch_bounds__(DQ_THREADS, DQ_MIN_BLOCKS)
qattn_decode_mma_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    extern __shared__ __align__(128) uint8_t dq_smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    dq_block b;
    if (!dq_block_of(op, params, b))
        return;
    const int warp = b.warp, lane = b.lane, g = b.g, t = b.t, group = b.group, h0 = b.h0;
    const struct decode_split &ds = b.ds;

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
    /* the first copies cover the query and table work */
    dq_stream_start(st, b, kv, HD, smem_addr(raw), kroom, vroom);

    const int q_dim = op.u.attn.n_heads * HD;
    const float *q_row = op.u.attn.q + (size_t)b.row * q_dim + (size_t)h0 * HD;
    if (turbo) {
        dq_levels(kv, st.k.bits, ktab);
        dq_levels(kv, st.v.bits, vtab);
        for (int i = threadIdx.x; i < group * HD; i += DQ_THREADS)
            q_sm[i] = q_row[i];
        __syncthreads();
        for (int j = warp; j < group; j += DQ_WARPS)
            warp_rotate(q_sm + j * HD, HD, kv.seed, 0, b.layer, false);
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

    for (int j = 0; j < b.n_sub; j++) {
        const uint8_t *stage = raw + st.arrive<DQ_STAGES>(j, b.w_first, b.n_sub, lane);
        dq_decode<HD>(stage, kroom, st.k, ktab, kdec, lane);
        dq_decode<HD>(stage + DQ_ROWS * kroom, vroom, st.v, vtab, vdec, lane);
        __syncwarp();
        const int p0 = b.w_first + j * FA_BK;
        w.template attend<DQ_ROWS>(kdec, vdec, p0, p0 + DQ_ROWS - 1 > ds.last || p0 < ds.first,
                                   op.u.attn.window, lane);
    }
    cp_async_wait<0>();
    __syncthreads();
    fa_decode_finish<HD, DQ_WARPS>(w, warps, op, part, b.row, h0, group, b.split, b.n_splits,
                                   ds.n_active == 1);
}

/* Decode over an affine cache (4 or 8 bits, groups of GS) with the scores
 * taken from the codes themselves. A K record is s_G c + b_G per group G,
 * so q . k = sum_G s_G (q_G . c_G) + b_G sum(q_G): the products run on the
 * codes as exact fp16 (1024 + c, their bits under 1024's exponent, one byte
 * permute for two codes) and each group's scale and bias apply once per
 * position and head afterwards, instead of dequantizing every element of
 * K to fp16 in shared memory and reading it back with ldmatrix. To make
 * that pay, the product is turned around: a sub-tile's 16 positions are
 * the rows of the mma A fragments (read straight from the raw records) and
 * the kv head's query heads, at most 8, its columns (S^T = K Q^T), so one
 * m16n8k16 covers 16 positions. The dims of a k16 step are permuted so
 * that lane t's codes of a group are one run of bytes (da_dim); the query
 * fragments follow the same permutation. The softmax runs per head over
 * the column of positions; P^T is turned into B fragments with movmatrix,
 * and V is not dequantized either: O^T = V^T P^T runs on V's codes with
 * P's columns scaled by each position's group scale (da_pv_codes). The
 * copies and splits are qattn_decode_mma_kernel's. */
#define DA_MAX_GROUP 8
/* blocks an SM the registers must allow in the column kernels: four fit
 * the shared memory of 8-bit records of head dim 128 */
#define DA_MIN_BLOCKS 4

/* The head dim of lane t's j-th element (0..3) of k16 step kk of group G. */
template <int BITS, int GS>
static __device__ __forceinline__ int da_dim(int G, int kk, int t, int j)
{
    const int base = G * GS + t * (GS / 4);
    return BITS == 8 ? base + 4 * kk + j : base + 8 * (kk >> 1) + (kk & 1) + 2 * j;
}

/* LB bytes of shared memory at addr (ALIGN-byte aligned: 4 or 8) as LB / 4
 * words. */
template <int LB, int ALIGN>
static __device__ __forceinline__ void da_words(uint32_t addr, uint32_t *w)
{
    if (ALIGN == 8 && LB % 8 == 0) {
#pragma unroll
        for (int i = 0; i < LB / 8; i++)
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                         : "=r"(w[2 * i]), "=r"(w[2 * i + 1])
                         : "r"(addr + 8 * i));
    } else {
#pragma unroll
        for (int i = 0; i < LB / 4; i++)
            asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[i]) : "r"(addr + 4 * i));
    }
}

/* The A fragment halves of k16 step kk from a lane's words: (j = 0, 1) in
 * lo, (2, 3) in hi, as fp16 1024 + c. */
template <int BITS>
static __device__ __forceinline__ void da_codes(const uint32_t *w, int kk, uint32_t &lo,
                                                uint32_t &hi)
{
    uint32_t x;
    if (BITS == 8) {
        x = w[kk];
    } else {
        const uint32_t word = w[kk >> 1];
        x = (kk & 1) ? (word >> 4) & 0x0f0f0f0fu : word & 0x0f0f0f0fu;
    }
    lo = __byte_perm(x, 0x64646464u, 0x4140);
    hi = __byte_perm(x, 0x64646464u, 0x4342);
}

/* A warp's shared memory in the column kernels: its V fp16 sub-tile where V
 * is decoded (vtile), then DQ_STAGES sub-tiles of raw records. */
static __host__ __device__ __forceinline__ size_t da_warp_bytes(const struct kv_quant_layer &f,
                                                                int hd, bool vtile)
{
    const int raw = DQ_ROWS * (dq_record_room(kvq_head_bytes(&f, hd, false)) +
                               dq_record_room(kvq_head_bytes(&f, hd, true)));
    return (vtile ? (size_t)DQ_ROWS * hd * sizeof(__half) : 0) + (size_t)DQ_STAGES * raw;
}

/* The block's: the warps' regions (the merge's room once they are done) and
 * 16 bytes past them. */
static __host__ __device__ __forceinline__ size_t da_block_bytes(const struct kv_quant_layer &f,
                                                                 int hd)
{
    size_t warps = DQ_WARPS * da_warp_bytes(f, hd, false);
    if (warps < FA_DECODE_MERGE_BYTES(hd, DQ_WARPS))
        warps = FA_DECODE_MERGE_BYTES(hd, DQ_WARPS);
    return warps + 16;
}

/* A warp's state over S^T fragments (rows: positions g and g + 8 of a
 * 16-position sub-tile; columns: the query heads 2t and 2t + 1): the
 * online softmax per head down its column, P^T turned into B fragments by
 * movmatrix, and O^T = V^T P^T, 16 dims an mma, so O^T's columns are the
 * lane's own heads and no mma row is empty. V comes either as an fp16
 * sub-tile in shared memory (pv: V^T's A fragments are ldmatrix.trans
 * reads) or as its codes: an affine cache's (da_pv_codes; VGS its group
 * size, GROUP_BIAS) or TurboQuant levels (dt_pv_codes; VGS the head dim),
 * whose rows are permuted within each group of VGS dims, lane g's VGS / 8
 * of them one run. */
template <int HD, int VGS = 0, bool GROUP_BIAS = VGS != 0>
struct da_columns {
    static constexpr int NT = HD / 16;
    /* o[n]: O^T's rows dim(n, g, 0) and dim(n, g, 1), columns 2t, 2t + 1 */
    float o[NT][4];
    /* GROUP_BIAS: per group G (row G, columns 2t, 2t + 1) what the codes'
     * products leave out, sum_p (p b_G - 1024 p'_G) (da_pv_codes) */
    float z[4];
    /* per column head 2t + c: the running max (base 2) and this lane's part
     * of the sum (its positions of every sub-tile) */
    float m[2], l[2];

    /* The head dim of O^T's tile n, row g + 8 h. */
    static __device__ __forceinline__ int dim(int n, int g, int h)
    {
        if constexpr (VGS == 0) {
            return 16 * n + g + 8 * h;
        } else {
            constexpr int TPG = VGS / 16; /* tiles a group */
            return VGS * (n / TPG) + VGS / 8 * g + 2 * (n % TPG) + h;
        }
    }

    __device__ __forceinline__ void init(void)
    {
#pragma unroll
        for (int n = 0; n < NT; n++)
            o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        z[0] = z[1] = z[2] = z[3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }

    /* The softmax of one sub-tile: score[r][c] of position g + 8 r and head
     * 2t + c (base 2, -inf where masked) into the running state, O rescaled;
     * returns P^T as B fragments (k the positions 2t, 2t + 1 and 8 + 2t,
     * 9 + 2t, column g the head) in pb. */
    __device__ __forceinline__ void softmax(const float (&score)[2][2], uint32_t (&pb)[2])
    {
        float use[2], corr[2];
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float mx = fmaxf(score[0][c], score[1][c]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            mx = fmaxf(mx, m[c]);
            use[c] = mx == -INFINITY ? 0.0f : mx;
            corr[c] = fast_exp2(m[c] - use[c]);
            m[c] = mx;
            l[c] *= corr[c];
        }
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                o[n][0] *= corr[0];
                o[n][1] *= corr[1];
                o[n][2] *= corr[0];
                o[n][3] *= corr[1];
            }
            z[0] *= corr[0];
            z[1] *= corr[1];
        }
        uint32_t pt[2]; /* P^T rows g, g + 8 (positions) at columns 2t, 2t + 1 (heads) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            pt[r] = pack_half2(fast_exp2(score[r][0] - use[0]), fast_exp2(score[r][1] - use[1]));
            const float2 pf = __half22float2(*(const __half2 *)&pt[r]);
            l[0] += pf.x;
            l[1] += pf.y;
        }
        pb[0] = movmatrix_trans(pt[0]);
        pb[1] = movmatrix_trans(pt[1]);
    }

    /* O^T += V^T P^T with V's 16 rows at vdec (fp16, swizzled as
     * fa_mma.cuh's tiles, written by this warp before the call). */
    __device__ __forceinline__ void pv(uint32_t vdec, const uint32_t (&pb)[2], int lane)
    {
        const int v_lrow = ((lane >> 3) & 1) * 8 + (lane & 7), v_lchunk = lane >> 4;
        __syncwarp(); /* the V sub-tile's stores are seen */
#pragma unroll
        for (int n = 0; n < NT; n++) {
            /* matrices: positions 0-7 and 8-15 of dims 16 n .. 16 n + 7, then
             * of 16 n + 8 .. 16 n + 15, each transposed */
            uint32_t v[4];
            ldsm_x4_trans(vdec + swz<HD>(v_lrow, 2 * n + v_lchunk), v[0], v[2], v[1], v[3]);
            mma_16816(o[n], v, pb[0], pb[1]);
        }
        __syncwarp(); /* the V sub-tile is read before the next one is written */
    }

    /* One sub-tile with V decoded to fp16 at vdec. */
    __device__ __forceinline__ void step(const float (&score)[2][2], uint32_t vdec, int lane)
    {
        uint32_t pb[2];
        softmax(score, pb);
        pv(vdec, pb, lane);
    }

    /* After the warp's last sub-tile: the block's warps merged
     * (fa_decode_merge, through smem) into the row's output or the split's
     * part. */
    template <int NW>
    __device__ __forceinline__ void finish(uint8_t *smem, const struct cu_op &op, float *part,
                                           const dq_block &b)
    {
        cp_async_wait<0>();
        const int g = b.lane >> 2, t = b.lane & 3;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            l[c] += __shfl_xor_sync(0xffffffffu, l[c], 4);
            l[c] += __shfl_xor_sync(0xffffffffu, l[c], 8);
            l[c] += __shfl_xor_sync(0xffffffffu, l[c], 16);
        }
        if constexpr (GROUP_BIAS) { /* each group's z, from the lane of row G, into its dims */
            constexpr int TPG = VGS / 16;
#pragma unroll
            for (int G = 0; G < HD / VGS; G++) {
                const float z0 = __shfl_sync(0xffffffffu, z[0], 4 * G + t);
                const float z1 = __shfl_sync(0xffffffffu, z[1], 4 * G + t);
#pragma unroll
                for (int e = 0; e < TPG; e++) {
                    o[G * TPG + e][0] += z0;
                    o[G * TPG + e][1] += z1;
                    o[G * TPG + e][2] += z0;
                    o[G * TPG + e][3] += z1;
                }
            }
        }
        __syncthreads(); /* every warp is done with its tiles: smem is the merge's */
        float *m_w = (float *)smem, *l_w = m_w + NW * 16;
        float *o_w = l_w + NW * 16;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int head = 2 * t + c;
            if (g == 0) {
                m_w[b.warp * 16 + head] = m[c];
                l_w[b.warp * 16 + head] = l[c];
            }
            float *oh = o_w + ((size_t)b.warp * 16 + head) * HD;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                oh[dim(n, g, 0)] = o[n][c];
                oh[dim(n, g, 1)] = o[n][2 + c];
            }
        }
        __syncthreads();
        fa_decode_merge<HD, NW>(smem, op, part, b.row, b.h0, b.group, b.split, b.n_splits,
                                b.ds.n_active == 1);
    }
};

/* Whether position p of a row (positions first..last, window) is masked. */
static __device__ __forceinline__ bool da_masked(int p, const struct decode_split &ds, int window)
{
    return p > ds.last || (window > 0 && p <= ds.last - window);
}

/* A record's room in a sub-tile for an affine record of head dim HD, at
 * compile time. */
template <int HD, int BITS, int GS>
struct da_record {
    static constexpr int ROOM = dq_record_room(HD * BITS / 8 + HD / GS * 4);
};

/* O^T += V^T P^T from an affine V sub-tile's records themselves (each
 * ROOM bytes apart from the first at vrec): V = s_G c + b_G per group G,
 * so the products run on the codes as exact fp16 1024 + c with P's
 * columns scaled by each position's s_G (P'_G, rounded to fp16 once), and
 * the rest, sum_p (P b_G - 1024 P'_G), goes into z's row G through two
 * more products: P^T with A rows b_0 .. b_{NG-1}, and P'_G^T with A row G
 * all -1024 (the same rounded P'_G, so the 1024s cancel exactly). Tile e
 * of group G takes the lane's dims GS G + GS/8 g + 2e (row g) and + 1
 * (row g + 8): a lane's codes of a group are one run of bytes (one or two
 * loads a position), and two byte permutes give two positions' codes of a
 * dim in one register. */
template <int HD, int BITS, int GS, int ALIGN>
static __device__ __forceinline__ void da_pv_codes(da_columns<HD, GS> &cols, uint32_t vrec,
                                                   const uint32_t (&pb)[2], int lane)
{
    constexpr int ROOM = da_record<HD, BITS, GS>::ROOM;
    constexpr int NG = HD / GS, TPG = GS / 16;
    constexpr int W = GS / 32;                /* words of four codes a lane has a group */
    constexpr int LBV = GS / 8 * BITS / 8;    /* their bytes in a record */
    constexpr uint32_t PAIR_OFF = HD * BITS / 8;
    const int g = lane >> 2, t = lane & 3;
    uint32_t rec[4]; /* positions 2t, 2t + 1, 8 + 2t, 9 + 2t */
#pragma unroll
    for (int q = 0; q < 4; q++)
        rec[q] = vrec + (uint32_t)((2 * t + (q & 1) + 8 * (q >> 1)) * ROOM);
    { /* sum_p P b_G into z's rows */
        const uint32_t at = PAIR_OFF + 4u * (uint32_t)(g < NG ? g : 0);
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[q]) : "r"(rec[q] + at));
        uint32_t a[4] = {__byte_perm(w[0], w[1], 0x7632), 0u, __byte_perm(w[2], w[3], 0x7632), 0u};
        if (g >= NG)
            a[0] = a[2] = 0u;
        mma_16816(cols.z, a, pb[0], pb[1]);
    }
    uint32_t pr[4][NG]; /* each position's (scale, bias) of every group */
#pragma unroll
    for (int q = 0; q < 4; q++)
        da_words<4 * NG, ALIGN>(rec[q] + PAIR_OFF, pr[q]);
#pragma unroll
    for (int G = 0; G < NG; G++) {
        const uint32_t sb[2] = {
            dq_u32(__hmul2(dq_h2(pb[0]), dq_h2(__byte_perm(pr[0][G], pr[1][G], 0x5410)))),
            dq_u32(__hmul2(dq_h2(pb[1]), dq_h2(__byte_perm(pr[2][G], pr[3][G], 0x5410))))};
        {
            const uint32_t m1024 = g == G ? 0xe400e400u : 0u; /* fp16 -1024 twice */
            const uint32_t a[4] = {m1024, 0u, m1024, 0u};
            mma_16816(cols.z, a, sb[0], sb[1]);
        }
        uint32_t cw[4][W]; /* four codes a word, dims in order */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t at = rec[q] + (uint32_t)((GS * G + GS / 8 * g) * BITS / 8);
            if (BITS == 8) {
                da_words<LBV, ALIGN>(at, cw[q]);
            } else {
                uint32_t x;
                if (LBV == 2)
                    asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(x) : "r"(at));
                else
                    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x) : "r"(at));
                const uint32_t e = x & 0x0f0f0f0fu, o = (x >> 4) & 0x0f0f0f0fu;
                cw[q][0] = __byte_perm(e, o, 0x5140);
                if (W == 2)
                    cw[q][W - 1] = __byte_perm(e, o, 0x7362);
            }
        }
#pragma unroll
        for (int e = 0; e < TPG; e++) {
            const uint32_t sel = (e & 1) ? 0x7362 : 0x5140;
            const uint32_t x01 = __byte_perm(cw[0][e >> 1], cw[1][e >> 1], sel);
            const uint32_t x89 = __byte_perm(cw[2][e >> 1], cw[3][e >> 1], sel);
            const uint32_t a[4] = {__byte_perm(x01, 0x64646464u, 0x4140),
                                   __byte_perm(x01, 0x64646464u, 0x4342),
                                   __byte_perm(x89, 0x64646464u, 0x4140),
                                   __byte_perm(x89, 0x64646464u, 0x4342)};
            mma_16816(cols.o[G * TPG + e], a, sb[0], sb[1]);
        }
    }
}

template <int HD, int BITS, int GS, int ALIGN>
static __global__ void __launch_bounds__(DQ_THREADS, DA_MIN_BLOCKS)
qattn_decode_affine_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    constexpr int NG = HD / GS;            /* groups a head */
    constexpr int KS = GS / 16;            /* k16 steps a group */
    constexpr int LB = GS / 4 * BITS / 8;  /* a lane's bytes of a group's codes */
    extern __shared__ __align__(128) uint8_t dq_smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    dq_block b;
    if (!dq_block_of(op, params, b))
        return;
    const int warp = b.warp, lane = b.lane, g = b.g, t = b.t, group = b.group, h0 = b.h0;
    const struct decode_split &ds = b.ds;

    uint8_t *raw = dq_smem + (size_t)warp * da_warp_bytes(f, HD, false);
    constexpr int ROOM = da_record<HD, BITS, GS>::ROOM; /* K's and V's alike */

    dq_stream st;
    dq_stream_start(st, b, kv, HD, smem_addr(raw), ROOM, ROOM);

    /* Q^T as B fragments (column g: head g of the group, zero past it) in
     * da_dim's order, scaled into base-2 scores; each group's sum of the
     * rounded values, for heads 2t and 2t + 1 (the C fragment's columns) */
    uint32_t qb[NG][KS][2];
    float qs[NG][2];
    {
        const float qscale = op.u.attn.scale * FA_LOG2E;
        const bool live = g < group;
        const float *qh = op.u.attn.q + (size_t)b.row * op.u.attn.n_heads * HD +
                          (size_t)(h0 + (live ? g : 0)) * HD;
#pragma unroll
        for (int G = 0; G < NG; G++) {
            float sum = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float x0 = live ? qh[da_dim<BITS, GS>(G, kk, t, 2 * h)] * qscale : 0.0f;
                    const float x1 =
                        live ? qh[da_dim<BITS, GS>(G, kk, t, 2 * h + 1)] * qscale : 0.0f;
                    qb[G][kk][h] = pack_half2(x0, x1);
                    sum += half2_sum(qb[G][kk][h]);
                }
            }
            sum = osm_quad_sum(sum); /* head g's */
            qs[G][0] = __shfl_sync(0xffffffffu, sum, 8 * t);
            qs[G][1] = __shfl_sync(0xffffffffu, sum, 8 * t + 4);
        }
    }

    da_columns<HD, GS> cols;
    cols.init();
    const int window = op.u.attn.window;
    const int pair_off = HD * BITS / 8;

    for (int j = 0; j < b.n_sub; j++) {
        const uint8_t *stage = raw + st.arrive<DQ_STAGES>(j, b.w_first, b.n_sub, lane);

        /* S^T: rows the positions g and g + 8, columns the heads */
        const uint32_t krec = smem_addr(stage) + (uint32_t)st.k.lead;
        const uint32_t rec0 = krec + (uint32_t)(g * ROOM), rec1 = rec0 + 8u * ROOM;
        float score[2][2];
        {
            float acc[NG][4];
#pragma unroll
            for (int G = 0; G < NG; G++) {
                acc[G][0] = acc[G][1] = acc[G][2] = acc[G][3] = 0.0f;
                uint32_t w0[LB / 4], w1[LB / 4];
                const uint32_t at = (uint32_t)(G * GS * BITS / 8 + t * LB);
                da_words<LB, ALIGN>(rec0 + at, w0);
                da_words<LB, ALIGN>(rec1 + at, w1);
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    uint32_t a[4];
                    da_codes<BITS>(w0, kk, a[0], a[2]);
                    da_codes<BITS>(w1, kk, a[1], a[3]);
                    mma_16816(acc[G], a, qb[G][kk][0], qb[G][kk][1]);
                }
            }
            /* s (q . (1024 + c)) + q_sum (b - 1024 s), group by group */
            const int p0 = b.w_first + j * FA_BK;
            const bool edge = p0 + DQ_ROWS - 1 > ds.last || p0 < ds.first;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t pairs = (r ? rec1 : rec0) + (uint32_t)pair_off;
                score[r][0] = score[r][1] = 0.0f;
#pragma unroll
                for (int G = 0; G < NG; G++) {
                    uint32_t pr;
                    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(pr) : "r"(pairs + 4 * G));
                    const float2 sb = __half22float2(*(const __half2 *)&pr);
                    const float d = fmaf(-1024.0f, sb.x, sb.y);
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        score[r][c] = fmaf(sb.x, acc[G][2 * r + c],
                                           fmaf(qs[G][c], d, score[r][c]));
                }
                if (edge && da_masked(p0 + g + 8 * r, ds, window))
                    score[r][0] = score[r][1] = -INFINITY;
            }
        }

        uint32_t pb[2];
        cols.softmax(score, pb);
        da_pv_codes<HD, BITS, GS, ALIGN>(cols, smem_addr(stage) + DQ_ROWS * ROOM + st.v.lead, pb,
                                         lane);
    }
    cols.template finish<DQ_WARPS>(dq_smem, op, part, b);
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

/* The TurboQuant decode kernel's pair tables (a 4-bit key side's, V's of 2
 * to 4 bits) in interleaved copies: entry e of copy c is word e COPIES + c,
 * and lane l reads copy l % COPIES, so a warp's random lookups meet in a
 * bank only between lanes of one copy (none with 32 copies), where one
 * table gave three or four wavefronts a lookup. Copies as the shared memory
 * allows four blocks an SM: 16 of a 256-entry table, 32 of V's smaller ones
 * (a 4-bit V beside 4-bit keys 8). An 8-bit key side keeps dq_levels' one
 * table of halves (copies 0). */
template <int KBITS>
static constexpr __host__ __device__ int dt_k_copies() { return KBITS == 4 ? 16 : 0; }
template <int VB>
static constexpr __host__ __device__ int dt_v_copies() { return VB == 0 ? 0 : VB < 4 ? 32 : 8; }

/* Bytes of a side's table: `copies` of a pair table of `bits`, or
 * DQ_TABLE_BYTES as dq_levels writes it. */
static constexpr __host__ __device__ int dt_table_bytes(int bits, int copies)
{
    return copies ? 4 * copies << (2 * bits) : DQ_TABLE_BYTES;
}

/* COPIES interleaved copies of the pair table of BITS-bit levels at tab
 * (dq_levels' entries: entry e the levels of codes e % 2^BITS and
 * e / 2^BITS as an fp16 pair). */
template <int BITS, int COPIES>
static __device__ __forceinline__ void dt_pair_table(const struct cu_kv &kv, uint32_t *tab)
{
    const float *lv = kv.cb->levels[BITS];
    constexpr int MASK = (1 << BITS) - 1, N = COPIES << (2 * BITS);
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        const int e = i / COPIES;
        const __half2 h = __floats2half2_rn(lv[e & MASK], lv[e >> BITS]);
        tab[i] = *(const uint32_t *)&h;
    }
}

/* A lane's HD / 8 codes of a TurboQuant V record of VB (2 to 4) bits, its
 * run of the codes at `at` (any alignment; the words after it may be read),
 * the first code in the lowest bits. */
template <int HD, int VB>
static __device__ __forceinline__ uint64_t dt_code_run(uint32_t at)
{
    constexpr int BYTES = HD / 8 * VB / 8;
    constexpr int WORDS = (BYTES + 3 + 3) / 4; /* at any of four alignments */
    const uint32_t base = at & ~3u, sh = 8u * (at & 3u);
    uint32_t w[3];
#pragma unroll
    for (int i = 0; i < WORDS; i++)
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[i]) : "r"(base + 4u * i));
    const uint32_t lo = __funnelshift_r(w[0], w[1], sh);
    const uint32_t hi = WORDS > 2 ? __funnelshift_r(w[1], w[2], sh) : 0u;
    return (uint64_t)hi << 32 | lo;
}

/* Fields of 2 VB bits pairing the codes of positions a and b dim by dim: in
 * *even, dims 0, 2, 4, .. of the runs (a's code low, b's high: the index of
 * the level pair table dq_levels builds), in *odd, dims 1, 3, 5, .. */
template <int VB>
static __device__ __forceinline__ void dt_pair_fields(uint64_t a, uint64_t b, uint64_t &even,
                                                      uint64_t &odd)
{
    constexpr uint64_t FIELD = (1u << VB) - 1u;
    uint64_t lo = 0; /* the low VB bits of every 2 VB-bit field */
#pragma unroll
    for (int j = 0; j < 64 / (2 * VB); j++)
        lo |= FIELD << (2 * VB * j);
    even = (a & lo) | ((b << VB) & (lo << VB));
    odd = ((a >> VB) & lo) | (b & (lo << VB));
}

/* O^T += V^T P^T from a sub-tile's TurboQuant V records of VB (2 to 4) bits
 * themselves (ROOM bytes apart from the first at vrec), as bare levels: P's
 * columns carry each record's norm. An A fragment register holds one dim of
 * two positions (2t, 2t + 1 or 8 + 2t, 9 + 2t), so its two codes come from
 * two records and look up the block's pair table at tab as one index. Lane
 * g's rows are dims HD / 8 g on (da_columns' VGS = HD): one run of each
 * record's codes, loaded once a position, tile n its dims 2n (row g) and
 * 2n + 1 (row g + 8). No fp16 sub-tile is written and read back. The table
 * is dt_pair_table's dt_v_copies<VB>() copies. */
template <int HD, int VB>
static __device__ __forceinline__ void dt_pv_codes(da_columns<HD, HD, false> &cols, uint32_t vrec,
                                                   uint32_t tab, const uint32_t (&pb)[2], int lane)
{
    constexpr int COPIES = dt_v_copies<VB>();
    constexpr int ROOM = dq_record_room(2 + HD * VB / 8);
    constexpr int NT = HD / 16;
    constexpr uint32_t IDX = (1u << (2 * VB)) - 1u;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t run = vrec + 2u + (uint32_t)(g * (HD / 8 * VB / 8));
    const uint32_t mine = tab + 4u * (uint32_t)(lane % COPIES); /* this lane's copy */
    uint64_t x[4]; /* positions 2t, 2t + 1, 8 + 2t, 9 + 2t */
#pragma unroll
    for (int q = 0; q < 4; q++)
        x[q] = dt_code_run<HD, VB>(run + (uint32_t)((2 * t + (q & 1) + 8 * (q >> 1)) * ROOM));
    uint64_t f[4]; /* (2t, 2t + 1) even dims, odd dims; (8 + 2t, 9 + 2t) the same */
    dt_pair_fields<VB>(x[0], x[1], f[0], f[1]);
    dt_pair_fields<VB>(x[2], x[3], f[2], f[3]);
#pragma unroll
    for (int n = 0; n < NT; n++) {
        uint32_t a[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t idx = (uint32_t)(f[i] >> (2 * VB * n)) & IDX;
            asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(a[i]) : "r"(mine + 4u * COPIES * idx));
        }
        mma_16816(cols.o[n], a, pb[0], pb[1]);
    }
}

/* The norms of V records (ROOM bytes apart from the one at rec) of
 * positions 2t, 2t + 1 (vs[0]) and 8 + 2t, 9 + 2t (vs[1]) of a sub-tile, as
 * fp16 pairs: P's columns' factors before dt_pv_codes. */
static __device__ __forceinline__ void dt_norm_pairs(uint32_t rec, int room, int t,
                                                     uint32_t (&vs)[2])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t n0, n1;
        const uint32_t p = rec + (uint32_t)((2 * t + 8 * h) * room);
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(n0) : "r"(p));
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(n1) : "r"(p + (uint32_t)room));
        vs[h] = __byte_perm(n0, n1, 0x5410);
    }
}

/* TurboQuant keys of KBITS (4 or 8) bits, no QJL, the same turn: a key is
 * norm R^T L[c] (L the Lloyd-Max levels), so in the query's rotated frame
 * q . k = norm sum_d q'_d L[c_d]. The A fragments are the levels of the
 * raw codes, looked up in the block's fp16 tables (a byte of two 4-bit codes
 * a lookup of a pair in the lane's copy of dt_pair_table's, two lookups in
 * dq_levels' one table for 8-bit codes), with no scaling per
 * element: the record's norm multiplies each score once. Lane t's codes are
 * one run of bytes (dims t HD / 4 on, k16 step kk its dims 4 kk .. 4 kk + 3),
 * read as aligned words and funnel-shifted, since a record's codes start
 * two bytes in. V of VB (2 to 4) bits enters P V as its codes' bare levels
 * (dt_pv_codes), its norm applied to P's columns; other widths (VB 0) are
 * decoded to an fp16 sub-tile as in qattn_decode_mma_kernel. The output
 * stays in the values' rotated frame for qattn_unrotate_kernel. */
template <int HD, int KBITS, int VB>
static __global__ void __launch_bounds__(DQ_THREADS, DA_MIN_BLOCKS)
qattn_decode_turbo_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    constexpr int KT = HD / 16;             /* k16 steps */
    constexpr int LB = HD / 4 * KBITS / 8;  /* a lane's bytes of a record's codes */
    extern __shared__ __align__(128) uint8_t dq_smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    dq_block b;
    if (!dq_block_of(op, params, b))
        return;
    const int warp = b.warp, lane = b.lane, g = b.g, t = b.t, group = b.group, h0 = b.h0;
    const struct decode_split &ds = b.ds;

    constexpr int KC = dt_k_copies<KBITS>(), VC = dt_v_copies<VB>();
    uint8_t *ktab = dq_smem, *vtab = ktab + dt_table_bytes(KBITS, KC);
    float *q_sm = (float *)(vtab + dt_table_bytes(VB, VC));
    uint8_t *warps = (uint8_t *)q_sm + DA_MAX_GROUP * HD * sizeof(float);
    uint8_t *mine = warps + (size_t)warp * da_warp_bytes(f, HD, VB == 0);
    const uint32_t vdec = smem_addr(mine); /* VB 0: the fp16 V sub-tile */
    uint8_t *raw = mine + (VB == 0 ? DQ_ROWS * HD * sizeof(__half) : 0);
    const int kroom = dq_record_room(kvq_head_bytes(&f, HD, false));
    const int vroom = dq_record_room(kvq_head_bytes(&f, HD, true));

    dq_stream st;
    /* the first copies cover the table and query work */
    dq_stream_start(st, b, kv, HD, smem_addr(raw), kroom, vroom);

    /* the levels, and the group's query rows rotated into the keys' frame */
    if constexpr (KC != 0)
        dt_pair_table<KBITS, KC>(kv, (uint32_t *)ktab);
    else
        dq_levels(kv, KBITS, ktab);
    if constexpr (VC != 0)
        dt_pair_table<VB, VC>(kv, (uint32_t *)vtab);
    else
        dq_levels(kv, st.v.bits, vtab);
    const float *q_row = op.u.attn.q + (size_t)b.row * op.u.attn.n_heads * HD + (size_t)h0 * HD;
    for (int i = threadIdx.x; i < group * HD; i += DQ_THREADS)
        q_sm[i] = q_row[i];
    __syncthreads();
    for (int j = warp; j < group; j += DQ_WARPS)
        warp_rotate(q_sm + j * HD, HD, kv.seed, 0, b.layer, false);
    __syncthreads();

    /* Q^T as B fragments (column g: head g, zero past the group), lane t's
     * dims t HD / 4 + 4 kk + j, scaled into base-2 scores */
    uint32_t qb[KT][2];
    {
        const float qscale = op.u.attn.scale * FA_LOG2E;
        const bool live = g < group;
        const float *qh = q_sm + (live ? g : 0) * HD + t * (HD / 4);
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                qb[kk][h] = live ? pack_half2(qh[4 * kk + 2 * h] * qscale,
                                              qh[4 * kk + 2 * h + 1] * qscale)
                                 : 0u;
    }

    da_columns<HD, VB ? HD : 0, false> cols;
    cols.init();
    const int window = op.u.attn.window;
    uint32_t ktab_s = smem_addr(ktab);
    if constexpr (KC != 0)
        ktab_s += 4u * (uint32_t)(lane % KC); /* this lane's copy of the pair table */
    const uint32_t vtab_s = smem_addr(vtab);

    for (int j = 0; j < b.n_sub; j++) {
        const uint8_t *stage = raw + st.arrive<DQ_STAGES>(j, b.w_first, b.n_sub, lane);
        const uint32_t vrec = smem_addr(stage) + (uint32_t)(DQ_ROWS * kroom + st.v.lead);
        uint32_t vs[2];
        if (VB)
            dt_norm_pairs(vrec, vroom, t, vs);
        else
            dq_decode<HD>(stage + DQ_ROWS * kroom, vroom, st.v, vtab, vdec, lane);

        /* S^T: rows the positions g and g + 8, columns the heads */
        const uint32_t rec0 = smem_addr(stage) + (uint32_t)(st.k.lead + g * kroom);
        const uint32_t rec1 = rec0 + 8u * (uint32_t)kroom;
        uint32_t w[2][LB / 4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t at = (r ? rec1 : rec0) + 2u + (uint32_t)(t * LB);
            const uint32_t base = at & ~3u, sh = 8u * (at & 3u);
            uint32_t x[LB / 4 + 1];
#pragma unroll
            for (int i = 0; i <= LB / 4; i++)
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x[i]) : "r"(base + 4 * i));
#pragma unroll
            for (int i = 0; i < LB / 4; i++)
                w[r][i] = __funnelshift_r(x[i], x[i + 1], sh);
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    uint32_t v;
                    if (KBITS == 4) { /* byte 2 kk + h: the level pair of two codes */
                        const int at_byte = 2 * kk + h;
                        const uint32_t code = (w[r][at_byte >> 2] >> (8 * (at_byte & 3))) & 0xffu;
                        asm volatile("ld.shared.u32 %0, [%1];\n"
                                     : "=r"(v)
                                     : "r"(ktab_s + 4u * KC * code));
                    } else { /* bytes 2 h and 2 h + 1 of word kk */
                        const uint32_t c0 = (w[r][kk] >> (16 * h)) & 0xffu;
                        const uint32_t c1 = (w[r][kk] >> (16 * h + 8)) & 0xffu;
                        uint32_t l0, l1;
                        asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(l0) : "r"(ktab_s + 2 * c0));
                        asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(l1) : "r"(ktab_s + 2 * c1));
                        v = __byte_perm(l0, l1, 0x5410);
                    }
                    a[2 * h + r] = v;
                }
            mma_16816(acc, a, qb[kk][0], qb[kk][1]);
        }
        float score[2][2];
        const int p0 = b.w_first + j * FA_BK;
        const bool edge = p0 + DQ_ROWS - 1 > ds.last || p0 < ds.first;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            unsigned short nb;
            asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(nb) : "r"(r ? rec1 : rec0));
            const float norm = __half2float(__ushort_as_half(nb));
            score[r][0] = norm * acc[2 * r];
            score[r][1] = norm * acc[2 * r + 1];
            if (edge && da_masked(p0 + g + 8 * r, ds, window))
                score[r][0] = score[r][1] = -INFINITY;
        }
        if constexpr (VB != 0) {
            uint32_t pb[2];
            cols.softmax(score, pb);
            pb[0] = dq_u32(__hmul2(dq_h2(pb[0]), dq_h2(vs[0])));
            pb[1] = dq_u32(__hmul2(dq_h2(pb[1]), dq_h2(vs[1])));
            dt_pv_codes<HD, VB>(cols, vrec, vtab_s, pb, lane);
        } else {
            cols.step(score, vdec, lane);
        }
    }
    cols.template finish<DQ_WARPS>(dq_smem, op, part, b); /* the tables are done with too */
}

template <int HD, int BITS, int GS, int ALIGN>
static cudaError_t launch_qdecode_affine(cudaStream_t s, const struct cu_op *op,
                                        const uint8_t *params, float *part, int smem_optin)
{
    const size_t smem = da_block_bytes(op->u.attn.kv.fmt, HD);
    if (smem > (size_t)smem_optin)
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(qattn_decode_affine_kernel<HD, BITS, GS, ALIGN>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    const int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)op->u.attn.kv.n_kv_heads, (unsigned)n_splits, (unsigned)op->n_rows);
    qattn_decode_affine_kernel<HD, BITS, GS, ALIGN><<<grid, DQ_THREADS, smem, s>>>(
        *op, params, n_splits > 1 ? part + CU_ATTN_COUNTERS : NULL);
    if ((e = cudaGetLastError()) != cudaSuccess || n_splits == 1)
        return e;
    return cu_launch_attention_merge(s, op, params, part);
}

/* The affine kernel's instance for the record's bits, group and alignment:
 * every kv head's record starts at a multiple of the largest power of two
 * (8 at most) dividing its size. */
template <int HD>
static cudaError_t launch_qdecode_affine_hd(cudaStream_t s, const struct cu_op *op,
                                           const uint8_t *params, float *part, int smem_optin)
{
    const struct kv_quant_layer &f = op->u.attn.kv.fmt;
    const bool by8 = kvq_head_bytes(&f, HD, false) % 8 == 0;
    if (f.k_bits == 8 && f.group_size == 64)
        return by8 ? launch_qdecode_affine<HD, 8, 64, 8>(s, op, params, part, smem_optin)
                   : launch_qdecode_affine<HD, 8, 64, 4>(s, op, params, part, smem_optin);
    if (f.k_bits == 8)
        return by8 ? launch_qdecode_affine<HD, 8, 32, 8>(s, op, params, part, smem_optin)
                   : launch_qdecode_affine<HD, 8, 32, 4>(s, op, params, part, smem_optin);
    if (f.group_size == 64)
        return by8 ? launch_qdecode_affine<HD, 4, 64, 8>(s, op, params, part, smem_optin)
                   : launch_qdecode_affine<HD, 4, 64, 4>(s, op, params, part, smem_optin);
    return by8 ? launch_qdecode_affine<HD, 4, 32, 8>(s, op, params, part, smem_optin)
               : launch_qdecode_affine<HD, 4, 32, 4>(s, op, params, part, smem_optin);
}

/* The block's shared memory in qattn_decode_turbo_kernel: the two sides'
 * level tables, the rotated query rows and the affine kernel's warp
 * regions (with an fp16 V sub-tile where V is decoded: VB 0), or the
 * merge's room over all of them once they are done, whichever is larger;
 * and 16 bytes the word loads may read past. */
template <int KBITS, int VB>
static size_t dt_block_bytes(const struct kv_quant_layer &f, int hd)
{
    size_t bytes = dt_table_bytes(KBITS, dt_k_copies<KBITS>()) +
                   dt_table_bytes(VB, dt_v_copies<VB>()) + (size_t)DA_MAX_GROUP * hd * sizeof(float) +
                   DQ_WARPS * da_warp_bytes(f, hd, VB == 0);
    if (bytes < FA_DECODE_MERGE_BYTES(hd, DQ_WARPS))
        bytes = FA_DECODE_MERGE_BYTES(hd, DQ_WARPS);
    return bytes + 16;
}

template <int HD, int KBITS, int VB>
static cudaError_t launch_qdecode_turbo(cudaStream_t s, const struct cu_op *op,
                                       const uint8_t *params, float *part, int smem_optin)
{
    const size_t smem = dt_block_bytes<KBITS, VB>(op->u.attn.kv.fmt, HD);
    if (smem > (size_t)smem_optin)
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(qattn_decode_turbo_kernel<HD, KBITS, VB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    const int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)op->u.attn.kv.n_kv_heads, (unsigned)n_splits, (unsigned)op->n_rows);
    qattn_decode_turbo_kernel<HD, KBITS, VB><<<grid, DQ_THREADS, smem, s>>>(
        *op, params, n_splits > 1 ? part + CU_ATTN_COUNTERS : NULL);
    if ((e = cudaGetLastError()) != cudaSuccess || n_splits == 1)
        return e;
    return cu_launch_attention_merge(s, op, params, part);
}


/* The TurboQuant kernel's instance for the key bits (4 or 8) and the value
 * bits: 2 to 4 into P V as their bare levels (the norm on P), others decoded. */
template <int HD, int KBITS>
static cudaError_t launch_qdecode_turbo_k(cudaStream_t s, const struct cu_op *op,
                                         const uint8_t *params, float *part, int smem_optin)
{
    switch (op->u.attn.kv.fmt.v_bits) {
    case 2: return launch_qdecode_turbo<HD, KBITS, 2>(s, op, params, part, smem_optin);
    case 3: return launch_qdecode_turbo<HD, KBITS, 3>(s, op, params, part, smem_optin);
    case 4: return launch_qdecode_turbo<HD, KBITS, 4>(s, op, params, part, smem_optin);
    default: return launch_qdecode_turbo<HD, KBITS, 0>(s, op, params, part, smem_optin);
    }
}

template <int HD>
static cudaError_t launch_qdecode_turbo_hd(cudaStream_t s, const struct cu_op *op,
                                          const uint8_t *params, float *part, int smem_optin)
{
    return op->u.attn.kv.fmt.k_bits == 4
               ? launch_qdecode_turbo_k<HD, 4>(s, op, params, part, smem_optin)
               : launch_qdecode_turbo_k<HD, 8>(s, op, params, part, smem_optin);
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
    const bool affine = f->scheme == KV_QUANT_AFFINE &&
                        op->u.attn.n_heads <= kv->n_kv_heads * DA_MAX_GROUP;
    const bool turbo_keys = f->scheme == KV_QUANT_TURBO && (f->k_bits == 4 || f->k_bits == 8) &&
                            op->u.attn.n_heads <= kv->n_kv_heads * DA_MAX_GROUP;
    if (turbo_keys && kv->head_dim == 64)
        return launch_qdecode_turbo_hd<64>(s, op, params, part, smem_optin);
    if (turbo_keys && kv->head_dim == 128)
        return launch_qdecode_turbo_hd<128>(s, op, params, part, smem_optin);
    if (affine && kv->head_dim == 64)
        return launch_qdecode_affine_hd<64>(s, op, params, part, smem_optin);
    if (affine && kv->head_dim == 128)
        return launch_qdecode_affine_hd<128>(s, op, params, part, smem_optin);
    if (kv->head_dim == 64)
        return launch_qdecode_mma<64>(s, op, params, part, smem_optin);
    if (kv->head_dim == 128)
        return launch_qdecode_mma<128>(s, op, params, part, smem_optin);
    return cudaErrorNotSupported;
}
