/* backend/cuda/qgemv.cu — block-quantized weights on the GPU: GEMV kernels that stream Q8_0, Q4_K, Q6_K and MLX blocks and dequantize them in registers, bf16 tiles for cuBLASLt prefill, and embedding rows of block tables.
 *
 * Every type is read in chunks of 32 consecutive elements of a row (chunk c:
 * elements [32c, 32c + 32)): a Q8_0 block, a 32-wide sub-block of Q4_K or
 * Q6_K, a quarter, half or whole MLX group of 32/64/128. A chunk is loaded
 * raw (load) and expanded into 32 floats (expand) by exactly the arithmetic
 * of base/quant.c's dequantizers, rounding for rounding (__fmul_rn and
 * __fadd_rn keep nvcc from fusing what the C code computes in two steps), so
 * an embedding row and a dequantized tile hold the CPU reference's values.
 * In FAST mode, decode and small batches of Q8_0, Q4_K and Q6_K take another
 * path instead (see "FAST mode" below): x quantized to int8 blocks, integer
 * dot products with __dp4a, the scales applied once per block. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/gemv_store.cuh"
#include "backend/cuda/warp.cuh"

#define QGEMV_THREADS 256
#define QGEMV_WARPS (QGEMV_THREADS / 32)
/* chunks per lane loaded before any is used: each warp keeps about 2.5 KB of
 * one row in flight (Q4_K), enough with 64 warps per SM to cover HBM latency */
#define QGEMV_UNROLL 2

static __device__ __forceinline__ uint32_t ld_u16(const uint8_t *p)
{
    return __ldg((const unsigned short *)p);
}

static __device__ __forceinline__ uint32_t ld_u32(const uint8_t *p)
{
    return __ldg((const unsigned int *)p);
}

static __device__ __forceinline__ float half_bits(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu)));
}

static __device__ __forceinline__ float bf16_bits(uint32_t h) { return __uint_as_float(h << 16); }

/* 32 bytes at a 2-byte-aligned p as 8 little-endian words: aligned loads
 * shifted into place, never reading outside [p, p + 32). */
static __device__ __forceinline__ void ld32_at2(const uint8_t *p, uint32_t out[8])
{
    const uintptr_t a = (uintptr_t)p;
    const uint8_t *base = (const uint8_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3) * 8; /* 0 or 16 */
    uint32_t w[9];
    if (sh == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = ld_u32(base + 4 * i);
        w[8] = 0;
    } else {
        w[0] = ld_u16(p) << 16; /* the half word of base below p is not ours to read */
#pragma unroll
        for (int i = 1; i < 8; i++)
            w[i] = ld_u32(base + 4 * i);
        w[8] = ld_u16(base + 32);
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

/* ---- the types ----------------------------------------------------------- */

template <int T> struct qtype;

/* Q8_0: d, int8 q[32]; x = q * d. */
template <> struct qtype<DTYPE_Q8_0> {
    struct raw {
        uint32_t d, q[8];
    };
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols, int) { return (uint64_t)cols / 32 * 34; }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int, raw &r)
    {
        const uint8_t *b = row + c * 34;
        r.d = ld_u16(b);
        ld32_at2(b + 2, r.q);
    }
    static __device__ __forceinline__ void expand(const raw &r, int64_t, int, float v[32])
    {
        float d = half_bits(r.d);
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = __fmul_rn((float)(int8_t)(r.q[i / 4] >> (8 * (i % 4))), d);
    }
};

/* Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, qs[128]; sub-block j
 * (32 elements) is the low (even j) or high nibbles of qs[32 * (j / 2) ...],
 * x = d * sc * q - dmin * m. Blocks of 144 bytes stay 16-byte aligned. */
template <> struct qtype<DTYPE_Q4_K> {
    struct raw {
        uint4 head, qs[2];
    };
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols, int) { return (uint64_t)cols / 256 * 144; }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int, raw &r)
    {
        const uint8_t *b = row + (c >> 3) * 144;
        const int j = (int)(c & 7);
        r.head = __ldg((const uint4 *)b);
        const uint4 *q = (const uint4 *)(b + 16 + 32 * (j >> 1));
        r.qs[0] = __ldg(q);
        r.qs[1] = __ldg(q + 1);
    }
    static __device__ __forceinline__ void expand(const raw &r, int64_t c, int, float v[32])
    {
        const int j = (int)(c & 7);
        uint8_t sc[12];
        const uint32_t hw[3] = {r.head.y, r.head.z, r.head.w};
#pragma unroll
        for (int i = 0; i < 12; i++)
            sc[i] = (uint8_t)(hw[i / 4] >> (8 * (i % 4)));
        uint32_t s, m;
        if (j < 4) {
            s = sc[j] & 63;
            m = sc[j + 4] & 63;
        } else {
            s = (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
            m = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
        }
        float d1 = __fmul_rn(half_bits(r.head.x), (float)s);
        float m1 = __fmul_rn(half_bits(r.head.x >> 16), (float)m);
        const uint32_t q[8] = {r.qs[0].x, r.qs[0].y, r.qs[0].z, r.qs[0].w,
                               r.qs[1].x, r.qs[1].y, r.qs[1].z, r.qs[1].w};
        const int sh = (j & 1) * 4;
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = __fsub_rn(__fmul_rn(d1, (float)((q[i / 4] >> (8 * (i % 4) + sh)) & 15)), m1);
    }
};

/* Q6_K: ql[128], qh[64], int8 scales[16], d; chunk k of a block is half
 * h = k / 4, quarter g = k % 4: low bits from ql[64h + 32(g & 1) + l] (high
 * nibble when g & 2), high bits (qh[32h + l] >> 2g) & 3, scale
 * scales[8h + 2g + l / 16]; x = d * scale * (q - 32). */
template <> struct qtype<DTYPE_Q6_K> {
    struct raw {
        uint32_t ql[8], qh[8], sc, d;
    };
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols, int) { return (uint64_t)cols / 256 * 210; }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int, raw &r)
    {
        const uint8_t *b = row + (c >> 3) * 210;
        const int k = (int)(c & 7), h = k >> 2, g = k & 3;
        ld32_at2(b + 64 * h + 32 * (g & 1), r.ql);
        ld32_at2(b + 128 + 32 * h, r.qh);
        r.sc = ld_u16(b + 192 + 8 * h + 2 * g);
        r.d = ld_u16(b + 208);
    }
    static __device__ __forceinline__ void expand(const raw &r, int64_t c, int, float v[32])
    {
        const int g = (int)(c & 3);
        const float d = half_bits(r.d);
        const float ds[2] = {__fmul_rn(d, (float)(int8_t)(r.sc & 0xff)),
                             __fmul_rn(d, (float)(int8_t)(r.sc >> 8))};
        const int lsh = (g & 2) ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            uint32_t lo = (r.ql[i / 4] >> (8 * (i % 4) + lsh)) & 15;
            uint32_t hi = (r.qh[i / 4] >> (8 * (i % 4) + 2 * g)) & 3;
            v[i] = __fmul_rn(ds[i / 16], (float)((int)(lo | hi << 4) - 32));
        }
    }
};

/* MLX affine groups of BITS bits: scale, bias (BF16, F16 or F32), then the
 * group's packed words; x = scale * q + bias. The group size and the scale
 * type come from the dtype at run time (the dtype order of base/dtype.h). */
template <int BITS> struct qmlx {
    struct raw {
        uint32_t s, b, w[BITS];
    };
    static __device__ __forceinline__ int group(int dt) { return 32 << ((dt - DTYPE_MLX4_G32_BF16) / 3 % 3); }
    static __device__ __forceinline__ int skind(int dt) { return (dt - DTYPE_MLX4_G32_BF16) % 3; }
    static __device__ __forceinline__ int block_bytes(int dt)
    {
        return (skind(dt) == 2 ? 8 : 4) + group(dt) * BITS / 8;
    }
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols, int dt)
    {
        return (uint64_t)(cols / group(dt)) * (uint64_t)block_bytes(dt);
    }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t c, int dt, raw &r)
    {
        const int per = group(dt) / 32; /* chunks per group */
        const int64_t gi = c / per;
        const int part = (int)(c - gi * per);
        const uint8_t *b = row + gi * block_bytes(dt);
        const int hb = skind(dt) == 2 ? 8 : 4;
        r.s = ld_u32(b);
        r.b = hb == 8 ? ld_u32(b + 4) : r.s >> 16;
        const uint8_t *q = b + hb + part * (4 * BITS);
#pragma unroll
        for (int i = 0; i < BITS; i++)
            r.w[i] = ld_u32(q + 4 * i);
    }
    static __device__ __forceinline__ void expand(const raw &r, int64_t, int dt, float v[32])
    {
        const int k = skind(dt);
        const float s = k == 2 ? __uint_as_float(r.s) : k == 0 ? bf16_bits(r.s & 0xffffu) : half_bits(r.s);
        const float b = k == 2 ? __uint_as_float(r.b) : k == 0 ? bf16_bits(r.b & 0xffffu) : half_bits(r.b);
        constexpr uint32_t mask = (1u << BITS) - 1;
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = __fadd_rn(__fmul_rn(s, (float)((r.w[i * BITS / 32] >> (i * BITS % 32)) & mask)), b);
    }
};
template <> struct qtype<DTYPE_MLX4_G32_BF16> : qmlx<4> {};
template <> struct qtype<DTYPE_MLX8_G32_BF16> : qmlx<8> {};

/* ---- GEMV ------------------------------------------------------------------
 *
 * One warp per output row (unit), its lanes taking chunks lane, lane + 32, ...
 * in order and the warp's partial sums reduced by one butterfly: a row's sum
 * is fixed by the row alone, whatever the token count or tile, so EXACT mode's
 * batch invariance holds on every row count. Up to TT token rows share each
 * loaded chunk; a launch of more rows tiles them over blockIdx.y. Epilogues
 * as gemv.cu's: bias, the residual add, the SwiGLU pair. x is read through
 * L1 (a few KB per token, shared by every warp of an SM). */
template <int T, int TT, int NP>
static __global__ void __launch_bounds__(QGEMV_THREADS)
qgemv_kernel(struct cu_gemv_args a, int64_t n_units)
{
    typedef qtype<T> Q;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t unit = (int64_t)blockIdx.x * QGEMV_WARPS + warp;
    if (unit >= n_units)
        return;
    const int t0 = blockIdx.y * TT;
    const int nt = a.n_rows - t0 < TT ? a.n_rows - t0 : TT;
    const int64_t cols = a.cols, nchunk = cols / 32;
    const int dt = a.dtype;
    const uint64_t rb = Q::row_bytes(cols, dt);

    int m = 0;
    int64_t lr = unit;
    if (NP == 1)
        while (m + 1 < a.n_mat && lr >= a.m[m].rows) {
            lr -= a.m[m].rows;
            m++;
        }
    const uint8_t *wrow[NP];
#pragma unroll
    for (int p = 0; p < NP; p++)
        wrow[p] = (const uint8_t *)a.m[NP == 1 ? m : p].w + (uint64_t)lr * rb;
    const float *x0 = a.x + (int64_t)t0 * cols;

    float acc[NP][TT];
    gemv_zero_acc(acc);

    for (int64_t c0 = lane; c0 < nchunk; c0 += 32 * QGEMV_UNROLL) {
        typename Q::raw r[QGEMV_UNROLL][NP];
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) {
            int64_t c = c0 + 32 * u;
            if (c < nchunk)
#pragma unroll
                for (int p = 0; p < NP; p++)
                    Q::load(wrow[p], c, dt, r[u][p]);
        }
#pragma unroll
        for (int u = 0; u < QGEMV_UNROLL; u++) {
            int64_t c = c0 + 32 * u;
            if (c >= nchunk)
                break;
#pragma unroll
            for (int p = 0; p < NP; p++) {
                float v[32];
                Q::expand(r[u][p], c, dt, v);
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    if (t < nt) {
                        const float4 *xp = (const float4 *)(x0 + t * cols + c * 32);
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < 8; i++) {
                            float4 xv = __ldg(xp + i);
                            s = fmaf(v[4 * i], xv.x, s);
                            s = fmaf(v[4 * i + 1], xv.y, s);
                            s = fmaf(v[4 * i + 2], xv.z, s);
                            s = fmaf(v[4 * i + 3], xv.w, s);
                        }
                        acc[p][t] += s;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[p][t] = warp_sum(acc[p][t]);
    if (lane != 0)
        return;
    gemv_store_row<NP, TT>(a, m, lr, t0, nt, acc);
}

template <int T, int NP>
static cudaError_t qgemv_np(cudaStream_t s, const struct cu_gemv_args *a, int64_t n_units)
{
    dim3 block(QGEMV_THREADS);
    unsigned gx = (unsigned)((n_units + QGEMV_WARPS - 1) / QGEMV_WARPS);
    if (a->n_rows == 1)
        qgemv_kernel<T, 1, NP><<<dim3(gx, 1), block, 0, s>>>(*a, n_units);
    else if (a->n_rows == 2)
        qgemv_kernel<T, 2, NP><<<dim3(gx, 1), block, 0, s>>>(*a, n_units);
    else if (a->n_rows <= 4)
        qgemv_kernel<T, 4, NP><<<dim3(gx, 1), block, 0, s>>>(*a, n_units);
    else
        qgemv_kernel<T, 8, NP><<<dim3(gx, (unsigned)((a->n_rows + 7) / 8)), block, 0, s>>>(
            *a, n_units);
    return cudaGetLastError();
}

template <int T>
static cudaError_t qgemv_type(cudaStream_t s, const struct cu_gemv_args *a, int64_t n_units)
{
    return a->pair ? qgemv_np<T, 2>(s, a, n_units) : qgemv_np<T, 1>(s, a, n_units);
}

/* ---- FAST mode: int8 activations and __dp4a ------------------------------
 *
 * For decode and small batches (at most CU_GEMV_MAX_ROWS token rows) of
 * Q8_0, Q4_K and Q6_K, x is first quantized to int8 blocks of 32 (one small
 * launch per op into the backend's workspace): x_i ~ xd * xq_i with
 * xd = amax / 127, and each block keeps {xd, xd * sum xq}. The GEMV then
 * multiplies the weights' integer codes by xq with __dp4a (4 int8 products a
 * call, int32 sums) and applies the scales once per 32 elements (per 16 for
 * Q6_K's), in f32:
 *   Q8_0  sum w x = dw xd  sum q xq
 *   Q4_K  sum (d sc q - dmin m) x = d sc xd sum q xq - dmin m (xd sum xq)
 *   Q6_K  sum d sc (q - 32) x = d sc xd sum (q - 32) xq   (q - 32 fits int8)
 * so a row's result is, up to f32 rounding, exactly sum w_i xhat_i with
 * xhat_i = xd xq_i: |xhat_i - x_i| <= xd / 2 = amax / 254 of its block, the
 * whole error (tests/unit/test_cuda_quant.c bounds each output by it). The
 * weights are read as in the float kernel, a warp per output row, units of
 * 32 (64 for Q4_K: both nibbles of 32 bytes of qs) taken by the lanes in
 * order and one butterfly at the end, so the bits of a row do not depend on
 * the launch's other rows. The GEMV is a programmatic dependent of the
 * quantize launch: it loads its first weights before it waits for xq. */

/* Where x's int8 image sits in a workspace of cu_qgemv_int8_bytes: n_rows x
 * cols int8, then a float2 {xd, xd * sum xq} per block of 32, 16-byte aligned. */
static size_t qx_codes_bytes(int n_rows, int64_t cols)
{
    return ((size_t)n_rows * (size_t)cols + 15) & ~(size_t)15;
}

extern "C" size_t cu_qgemv_int8_bytes(int dtype, int n_rows, int64_t cols)
{
    if ((dtype != DTYPE_Q8_0 && dtype != DTYPE_Q4_K && dtype != DTYPE_Q6_K) || n_rows < 1 ||
        n_rows > CU_GEMV_MAX_ROWS || cols <= 0 || cols % (dtype == DTYPE_Q8_0 ? 32 : 256))
        return 0;
    return qx_codes_bytes(n_rows, cols) + (size_t)n_rows * (size_t)(cols / 32) * sizeof(float2);
}

/* One block of 32 of x: the codes q = round(x * 127 / amax) packed four to
 * a word in w, the scale xd = amax / 127 and the code sums of elements
 * 0..15 and 16..31; a NaN anywhere in the block makes its scale NaN (so it
 * reaches the output, as the float kernel's would) and its codes 0. Both
 * int8 paths quantize x with it, so their codes and scales are the same bits. */
static __device__ __forceinline__ void qx_block32(const float v[32], uint32_t w[8], float &d,
                                                  int &sum_lo, int &sum_hi)
{
    float amax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        amax = fmaxf(amax, fabsf(v[i]));
        nan |= v[i] != v[i];
    }
    const bool scaled = amax > 0.0f && amax <= 3.402823466e38f && !nan;
    const float r = scaled ? __fdiv_rn(127.0f, amax) : 0.0f;
    sum_lo = sum_hi = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int q = scaled ? __float2int_rn(__fmul_rn(v[4 * k + i], r)) : 0;
            word |= (uint32_t)(q & 0xff) << (8 * i);
            if (k < 4)
                sum_lo += q;
            else
                sum_hi += q;
        }
        w[k] = word;
    }
    d = nan ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.0f);
}

/* Block b of 32 of x (its values v) quantized into the workspace: its codes at
 * q + 32 b, {xd, xd * sum of codes} at ds[b]. */
static __device__ __forceinline__ void qx_store_block32(const float v[32], int64_t b, int8_t *q,
                                                        float2 *ds)
{
    uint32_t w[8];
    float d;
    int lo, hi;
    qx_block32(v, w, d, lo, hi);
    uint4 *out = (uint4 *)(q + b * 32);
    out[0] = make_uint4(w[0], w[1], w[2], w[3]);
    out[1] = make_uint4(w[4], w[5], w[6], w[7]);
    ds[b] = make_float2(d, d * (float)(lo + hi));
}

/* One thread per block of 32 of x. */
static __global__ void __launch_bounds__(256)
qx_quantize_kernel(const float *x, int64_t n_blocks, int8_t *q, float2 *ds)
{
    pdl_release(); /* the GEMV may start loading weights; it waits for all of this */
    const int64_t b = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (b >= n_blocks)
        return;
    float v[32];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float4 f = __ldg((const float4 *)(x + b * 32) + k);
        v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
    }
    qx_store_block32(v, b, q, ds);
}

/* The same with the RMSNorm of fuse.h rule 2 first: a block per row of x finds
 * the row's 1 / rms, writes the normalised row to norm_out (as the RMSNorm
 * launch it replaces would) and quantizes w * (x * inv), a thread per block
 * of 32 in turn: one launch where the norm and the quantize took two. */
#define QX_NORM_THREADS 256
static __global__ void __launch_bounds__(QX_NORM_THREADS)
qx_norm_quantize_kernel(const float *x, int64_t cols, const float *norm_w, float eps,
                        float *norm_out, int8_t *q, float2 *ds)
{
    __shared__ float partial[QX_NORM_THREADS / 32];
    pdl_release();
    const int64_t row = blockIdx.x, n32 = cols / 32;
    const float4 *xr = (const float4 *)(x + row * cols);
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < cols / 4; i += QX_NORM_THREADS) {
        const float4 f = __ldg(xr + i);
        ss += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < QX_NORM_THREADS / 32; w++)
        tot += partial[w];
    const float inv = 1.0f / sqrtf(tot / (float)cols + eps);
    for (int64_t j = threadIdx.x; j < n32; j += QX_NORM_THREADS) {
        float v[32];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float4 f = __ldg(xr + j * 8 + k), g = __ldg((const float4 *)norm_w + j * 8 + k);
            v[4 * k] = g.x * (f.x * inv), v[4 * k + 1] = g.y * (f.y * inv);
            v[4 * k + 2] = g.z * (f.z * inv), v[4 * k + 3] = g.w * (f.w * inv);
            if (norm_out)
                ((float4 *)(norm_out + row * cols))[j * 8 + k] =
                    make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        }
        qx_store_block32(v, row * n32 + j, q, ds);
    }
}

/* __dp4a of unsigned bytes a with signed bytes b. */
static __device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

static __device__ __forceinline__ void ld_x32(const int8_t *p, int w[8])
{
    const int4 a = __ldg((const int4 *)p), b = __ldg((const int4 *)p + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

template <int T> struct dq;

/* Q8_0: a unit is a block (the float kernel's load). */
template <> struct dq<DTYPE_Q8_0> {
    static constexpr int UNIT = 32;
    typedef qtype<DTYPE_Q8_0>::raw raw;
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols) { return (uint64_t)cols / 32 * 34; }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t k, raw &r)
    {
        qtype<DTYPE_Q8_0>::load(row, k, 0, r);
    }
    static __device__ __forceinline__ float dot(const raw &r, int64_t, const int8_t *xq,
                                                const float2 *ds)
    {
        int xw[8];
        ld_x32(xq, xw);
        int acc = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            acc = __dp4a((int)r.q[i], xw[i], acc);
        return half_bits(r.d) * __ldg(ds).x * (float)acc;
    }
};

/* Q4_K: unit k is the pair of sub-blocks 2p, 2p + 1 (p = k % 4) of block
 * k / 4: the low and the high nibbles of the same 32 bytes of qs. */
template <> struct dq<DTYPE_Q4_K> {
    static constexpr int UNIT = 64;
    struct raw {
        uint4 head, qs[2];
    };
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols) { return (uint64_t)cols / 256 * 144; }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t k, raw &r)
    {
        const uint8_t *b = row + (k >> 2) * 144;
        r.head = __ldg((const uint4 *)b); /* shared by the block's 4 lanes: through L1 */
        const uint4 *q = (const uint4 *)(b + 16 + 32 * (k & 3));
        r.qs[0] = load_stream(q);
        r.qs[1] = load_stream(q + 1);
    }
    /* byte i (0..11) of the 6-bit scales and mins */
    static __device__ __forceinline__ uint32_t scb(const raw &r, int i)
    {
        const uint32_t w = i < 4 ? r.head.y : i < 8 ? r.head.z : r.head.w;
        return (w >> (8 * (i & 3))) & 0xffu;
    }
    static __device__ __forceinline__ void scale_min(const raw &r, int j, int &s, int &m)
    {
        if (j < 4) {
            s = (int)(scb(r, j) & 63);
            m = (int)(scb(r, j + 4) & 63);
        } else {
            s = (int)((scb(r, j + 4) & 15) | (scb(r, j - 4) >> 6) << 4);
            m = (int)((scb(r, j + 4) >> 4) | (scb(r, j) >> 6) << 4);
        }
    }
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *xq,
                                                const float2 *ds)
    {
        const int j = 2 * (int)(k & 3);
        int s0, m0, s1, m1;
        scale_min(r, j, s0, m0);
        scale_min(r, j + 1, s1, m1);
        const uint32_t q[8] = {r.qs[0].x, r.qs[0].y, r.qs[0].z, r.qs[0].w,
                               r.qs[1].x, r.qs[1].y, r.qs[1].z, r.qs[1].w};
        int x0[8], x1[8];
        ld_x32(xq, x0);
        ld_x32(xq + 32, x1);
        int a0 = 0, a1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            a0 = __dp4a((int)(q[i] & 0x0f0f0f0fu), x0[i], a0);
            a1 = __dp4a((int)((q[i] >> 4) & 0x0f0f0f0fu), x1[i], a1);
        }
        const float2 d0 = __ldg(ds), d1 = __ldg(ds + 1);
        const float d = half_bits(r.head.x), dmin = half_bits(r.head.x >> 16);
        return d * (d0.x * (float)(s0 * a0) + d1.x * (float)(s1 * a1)) -
               dmin * ((float)m0 * d0.y + (float)m1 * d1.y);
    }
};

/* Q6_K: a unit is a chunk of 32 (the float kernel's load), two scales of 16. */
template <> struct dq<DTYPE_Q6_K> {
    static constexpr int UNIT = 32;
    typedef qtype<DTYPE_Q6_K>::raw raw;
    static __device__ __forceinline__ uint64_t row_bytes(int64_t cols) { return (uint64_t)cols / 256 * 210; }
    static __device__ __forceinline__ void load(const uint8_t *row, int64_t k, raw &r)
    {
        qtype<DTYPE_Q6_K>::load(row, k, 0, r);
    }
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *xq,
                                                const float2 *ds)
    {
        const int g = (int)(k & 3), lsh = (g & 2) ? 4 : 0;
        int xw[8];
        ld_x32(xq, xw);
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t v = ((r.ql[i] >> lsh) & 0x0f0f0f0fu) | ((r.qh[i] >> (2 * g)) & 0x03030303u) << 4;
            int w = (int)__vsub4(v, 0x20202020u); /* each byte q - 32, in [-32, 31] */
            if (i < 4)
                lo = __dp4a(w, xw[i], lo);
            else
                hi = __dp4a(w, xw[i], hi);
        }
        const int isc = (int)(int8_t)(r.sc & 0xff) * lo + (int)(int8_t)(r.sc >> 8) * hi;
        return half_bits(r.d) * __ldg(ds).x * (float)isc;
    }
};

/* Units per lane loaded before any is used: about 2 KB of a row in flight per warp. */
#define QGEMV_INT8_UNROLL 2

template <int T, int TT, int NP>
static __global__ void __launch_bounds__(QGEMV_THREADS)
qgemv_int8_kernel(struct cu_gemv_args a, int64_t n_units, const int8_t *xq, const float2 *xds)
{
    typedef dq<T> D;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t unit = (int64_t)blockIdx.x * QGEMV_WARPS + warp;
    if (unit >= n_units)
        return;
    const int nt = a.n_rows < TT ? a.n_rows : TT;
    const int64_t cols = a.cols, nk = cols / D::UNIT, nb = cols / 32;
    const uint64_t rb = D::row_bytes(cols);

    int m = 0;
    int64_t lr = unit;
    if (NP == 1)
        while (m + 1 < a.n_mat && lr >= a.m[m].rows) {
            lr -= a.m[m].rows;
            m++;
        }
    const uint8_t *wrow[NP];
#pragma unroll
    for (int p = 0; p < NP; p++)
        wrow[p] = (const uint8_t *)a.m[NP == 1 ? m : p].w + (uint64_t)lr * rb;

    float acc[NP][TT];
    gemv_zero_acc(acc);

    typename D::raw r[QGEMV_INT8_UNROLL][NP];
    int64_t k0 = lane;
#pragma unroll
    for (int u = 0; u < QGEMV_INT8_UNROLL; u++)
        if (k0 + 32 * u < nk)
#pragma unroll
            for (int p = 0; p < NP; p++)
                D::load(wrow[p], k0 + 32 * u, r[u][p]);
    /* xq is the quantize launch's, and y and res may still be read or written
     * by the launches before it */
    pdl_wait();
    while (k0 < nk) {
#pragma unroll
        for (int u = 0; u < QGEMV_INT8_UNROLL; u++) {
            const int64_t k = k0 + 32 * u;
            if (k >= nk)
                break;
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < nt)
#pragma unroll
                    for (int p = 0; p < NP; p++)
                        acc[p][t] += D::dot(r[u][p], k, xq + t * cols + k * D::UNIT,
                                            xds + t * nb + k * (D::UNIT / 32));
        }
        k0 += 32 * QGEMV_INT8_UNROLL;
#pragma unroll
        for (int u = 0; u < QGEMV_INT8_UNROLL; u++)
            if (k0 + 32 * u < nk)
#pragma unroll
                for (int p = 0; p < NP; p++)
                    D::load(wrow[p], k0 + 32 * u, r[u][p]);
    }
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[p][t] = warp_sum(acc[p][t]);
    if (lane != 0)
        return;
    gemv_store_row<NP, TT>(a, m, lr, 0, nt, acc);
}

template <int T, int NP>
static cudaError_t qgemv_int8_np(const struct cu_device *dev, cudaStream_t s,
                                 const struct cu_gemv_args *a, int64_t n_units, const int8_t *q,
                                 const float2 *ds)
{
    const dim3 grid((unsigned)((n_units + QGEMV_WARPS - 1) / QGEMV_WARPS)), block(QGEMV_THREADS);
    if (a->n_rows == 1)
        return cu_launch_dependent(dev->pdl, qgemv_int8_kernel<T, 1, NP>, grid, block, 0, s, *a,
                                   n_units, q, ds);
    if (a->n_rows == 2)
        return cu_launch_dependent(dev->pdl, qgemv_int8_kernel<T, 2, NP>, grid, block, 0, s, *a,
                                   n_units, q, ds);
    if (a->n_rows <= 4)
        return cu_launch_dependent(dev->pdl, qgemv_int8_kernel<T, 4, NP>, grid, block, 0, s, *a,
                                   n_units, q, ds);
    return cu_launch_dependent(dev->pdl, qgemv_int8_kernel<T, 8, NP>, grid, block, 0, s, *a,
                               n_units, q, ds);
}

template <int T>
static cudaError_t qgemv_int8_type(const struct cu_device *dev, cudaStream_t s,
                                   const struct cu_gemv_args *a, int64_t n_units, const int8_t *q,
                                   const float2 *ds)
{
    return a->pair ? qgemv_int8_np<T, 2>(dev, s, a, n_units, q, ds)
                   : qgemv_int8_np<T, 1>(dev, s, a, n_units, q, ds);
}

/* The quantize launch (with a folded RMSNorm: the norm-and-quantize one), then
 * the GEMV; the caller checked cu_qgemv_int8_runs. */
static cudaError_t qgemv_int8(const struct cu_device *dev, cudaStream_t s,
                              const struct cu_gemv_args *a, int64_t n_units)
{
    int8_t *q = (int8_t *)a->xq;
    float2 *ds = (float2 *)(q + qx_codes_bytes(a->n_rows, a->cols));
    const int64_t n_blocks = (int64_t)a->n_rows * (a->cols / 32);
    if (a->norm_w)
        qx_norm_quantize_kernel<<<(unsigned)a->n_rows, QX_NORM_THREADS, 0, s>>>(
            a->x, a->cols, a->norm_w, a->norm_eps, a->norm_out, q, ds);
    else
        qx_quantize_kernel<<<(unsigned)((n_blocks + 255) / 256), 256, 0, s>>>(a->x, n_blocks, q,
                                                                             ds);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    switch (a->dtype) {
    case DTYPE_Q8_0: return qgemv_int8_type<DTYPE_Q8_0>(dev, s, a, n_units, q, ds);
    case DTYPE_Q4_K: return qgemv_int8_type<DTYPE_Q4_K>(dev, s, a, n_units, q, ds);
    default: return qgemv_int8_type<DTYPE_Q6_K>(dev, s, a, n_units, q, ds);
    }
}

/* ---- FAST mode, decode: persistent blocks that stage x themselves --------
 *
 * The launches above cost two kernels per product and keep little of a row
 * in flight; for Q4_K and Q6_K rows (Q6_K: rows of whole groups of eight
 * 210-byte blocks, so that every row starts 16-byte aligned) this kernel
 * does the whole product in one launch,
 * as the bf16 decode GEMV does (gemv.cu): one wave of blocks, each warp
 * walking the rows its block owns. A warp streams its rows' bytes through a
 * ring of QS_STAGES stages of its own shared memory with cp.async (16 bytes a
 * lane, contiguous: every sector read once; nothing in registers while in
 * flight), the first stages issued before the kernel waits for the launch
 * before it (a programmatic dependent: weights are never written by a step).
 * Then every block quantizes x itself into shared memory - with the RMSNorm
 * of fuse.h rule 2 applied first when the planner folded one in - a thread
 * per block of 32 (qx_block32, as the quantize launch), and each warp
 * multiplies its stages from there, no block barrier again. A block is 16
 * warps and one runs an SM: x is read from L2 and quantized once an SM
 * (with three blocks of 8 warps an SM doing it, 22.7 MB of L2 reads for the
 * 8B's down made a third of its time), and the 8B's 4,096 down rows fall
 * two to nearly every warp (1.3 a warp before: the warps with two set the
 * time).
 *
 * Q4_K: a lane's unit is a pair of sub-blocks: 32 bytes of a block's qs (unit p
 * of block b: qs[32p, 32p + 32), the low nibbles sub-block 2p, the high ones
 * 2p + 1); four lanes read a block's 128 bytes of qs and its 16-byte head (a
 * quarter warp's 16-byte reads fall in distinct banks). x's codes sit in
 * shared memory in the order the lanes read them: four planes, plane k
 * holding codes [16k, 16k + 16) of every unit's 64, unit after unit (a
 * quarter warp reads 128 contiguous bytes), and per unit a float4 {xd, xd *
 * sum of codes} of its two x blocks. A row's units are summed in one order
 * whatever the launch, so its bits do not depend on the other rows. */
#define QS_THREADS 512
#define QS_WARPS (QS_THREADS / 32)
/* stages per warp: two in flight while one is multiplied */
#define QS_STAGES 3

template <int T> struct qs;

template <> struct qs<DTYPE_Q4_K> {
    static constexpr int BLOCK_BYTES = 144;
    static constexpr int UNITS = 4; /* units a block: pairs of sub-blocks */
    static constexpr int XS = 1;    /* float4s of x's scales per unit */
    /* blocks of each matrix a stage: 2304 bytes, shared by a pair's matrices */
    static constexpr __host__ __device__ int stage_blocks(int np) { return 16 / np; }
    /* Where x block g's codes (w: two rows of 16 of its unit's plane pair)
     * and its {xd, xd * sum} go. */
    static __device__ __forceinline__ void stage(int8_t *xq, float4 *xs, int cols, int g,
                                                 const uint32_t w[8], float d, int sum)
    {
        const int sub = g & 7, hi = sub & 1, u = (g >> 3) * 4 + (sub >> 1);
        ((uint4 *)(xq + (2 * hi) * (cols / 4)))[u] = make_uint4(w[0], w[1], w[2], w[3]);
        ((uint4 *)(xq + (2 * hi + 1) * (cols / 4)))[u] = make_uint4(w[4], w[5], w[6], w[7]);
        ((float2 *)xs)[2 * u + hi] = make_float2(d, d * (float)sum);
    }
    /* Unit u (of the row) of the blocks at blk[k] (shared memory, one per
     * matrix of a pair, all at unit u): sub-blocks 2p and 2p + 1, the low and
     * high nibbles of qs[32p, 32p + 32), into out[k]. Their 6-bit scales and
     * mins come out two at a time (a byte each): for p < 2 bytes 2p, 2p + 1
     * of sc[0..3] and sc[4..7]; above, the low (high) nibbles of sc[8..11]
     * with sc[0..3]'s (sc[4..7]'s) top two bits - one expression with shifts
     * and masks fixed by p (the lane's p never changes: u % 4 = lane % 4), so
     * the warp never diverges. The high nibbles are multiplied in place (q &
     * 0xf0: 16 times the code, unsigned) and the sum scaled back by 1/16 after
     * its exact conversion, the same bits as shifting them down first. x's
     * codes are loaded once for the pair. */
    template <int NP>
    static __device__ __forceinline__ void dot(const uint8_t *const (&blk)[NP], int u,
                                               const int8_t *xq, const float4 *xs, int cols,
                                               float (&out)[NP])
    {
        const int p = u & 3, sh = 16 * (p & 1);
        const bool upper = p >= 2;
        const uint32_t mask_w = upper ? 0x0f0fu : 0u, mask_yz = upper ? 0x3030u : 0x3f3fu;
        const int sh_yz = sh + (upper ? 2 : 0);
        const int plane = cols / 4;
        const int4 x0 = ((const int4 *)xq)[u], x1 = ((const int4 *)(xq + plane))[u];
        const int4 x2 = ((const int4 *)(xq + 2 * plane))[u], x3 = ((const int4 *)(xq + 3 * plane))[u];
        const float4 f = xs[u];
        const int xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const int xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const uint4 head = *(const uint4 *)blk[k];
            const uint4 q0 = *((const uint4 *)(blk[k] + 16) + 2 * p);
            const uint4 q1 = *((const uint4 *)(blk[k] + 16) + 2 * p + 1);
            const uint32_t w = head.w >> sh;
            const uint32_t sv = (w & mask_w) | (head.y >> sh_yz & mask_yz);
            const uint32_t mv = (w >> 4 & mask_w) | (head.z >> sh_yz & mask_yz);
            const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
            int a0 = 0, a1 = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                a0 = __dp4a((int)(q[i] & 0x0f0f0f0fu), xl[i], a0);
                a1 = dp4a_us(q[i] & 0xf0f0f0f0u, xh[i], a1);
            }
            const float d = half_bits(head.x), dmin = half_bits(head.x >> 16);
            out[k] = d * (f.x * (float)((int)(sv & 0xffu) * a0) +
                          f.z * ((float)((int)(sv >> 8) * a1) * 0.0625f)) -
                     dmin * ((float)(mv & 0xffu) * f.y + (float)(mv >> 8) * f.w);
        }
    }
};

/* 8 bytes at a 2-byte-aligned p in shared memory, from aligned words. */
static __device__ __forceinline__ void ld8_at2(const uint8_t *p, uint32_t &lo, uint32_t &hi)
{
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)((uintptr_t)p & 3) * 8;
    const uint32_t w0 = a[0], w1 = a[1], w2 = a[2];
    lo = __funnelshift_r(w0, w1, sh);
    hi = __funnelshift_r(w1, w2, sh);
}

/* Q6_K: a unit is 8 positions l = 8i + [0, 8) of half h of a block (u % 8
 * = 4h + i), in all four quarters g: elements 128h + 32g + l, 32 of them,
 * low bits from ql[64h + 32(g & 1) + l] (high nibbles for g >= 2), high bits
 * (qh[32h + l] >> 2g) & 3, scale sc[8h + i/2 + 2g]. Blocks of 210 bytes sit
 * 2-byte aligned in a stage, so a lane reads its bytes as aligned words
 * shifted into place. x: plane 0 holds each unit's codes of quarters 0 and
 * 1 (8 each), plane 1 of quarters 2 and 3; per unit two float4s, the four
 * quarters' xd and their code sums (sum (q - 32) x = sum q x - 32 sum x). */
template <> struct qs<DTYPE_Q6_K> {
    static constexpr int BLOCK_BYTES = 210;
    static constexpr int UNITS = 8;
    static constexpr int XS = 2;
    /* 1680 bytes a matrix: eight blocks keep a stage 16-byte aligned */
    static constexpr __host__ __device__ int stage_blocks(int) { return 8; }
    static __device__ __forceinline__ void stage(int8_t *xq, float4 *xs, int cols, int g,
                                                 const uint32_t w[8], float d, int)
    {
        const int k = g & 7, h = k >> 2, q = k & 3;
        const int u0 = (g >> 3) * 8 + 4 * h;
        uint2 *plane = (uint2 *)(xq + (q >> 1) * (cols / 2));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int u = u0 + i;
            plane[2 * u + (q & 1)] = make_uint2(w[2 * i], w[2 * i + 1]);
            ((float *)&xs[2 * u])[q] = d;
            ((int *)&xs[2 * u + 1])[q] = __dp4a((int)w[2 * i], 0x01010101, __dp4a((int)w[2 * i + 1], 0x01010101, 0));
        }
    }
    template <int NP>
    static __device__ __forceinline__ void dot(const uint8_t *const (&blk)[NP], int u,
                                               const int8_t *xq, const float4 *xs, int cols,
                                               float (&out)[NP])
    {
#pragma unroll
        for (int k = 0; k < NP; k++)
            out[k] = dot1(blk[k], u, xq, xs, cols);
    }
    static __device__ __forceinline__ float dot1(const uint8_t *blk, int u, const int8_t *xq,
                                                const float4 *xs, int cols)
    {
        const int h = (u >> 2) & 1, i = u & 3;
        uint32_t a[2], b[2], c[2], sc[2];
        ld8_at2(blk + 64 * h + 8 * i, a[0], a[1]);
        ld8_at2(blk + 64 * h + 32 + 8 * i, b[0], b[1]);
        ld8_at2(blk + 128 + 32 * h + 8 * i, c[0], c[1]);
        ld8_at2(blk + 192 + 8 * h, sc[0], sc[1]);
        const float d = half_bits(*(const unsigned short *)(blk + 208));
        const int4 x01 = ((const int4 *)xq)[u], x23 = ((const int4 *)(xq + cols / 2))[u];
        const int xw[4][2] = {{x01.x, x01.y}, {x01.z, x01.w}, {x23.x, x23.y}, {x23.z, x23.w}};
        const float4 xd = xs[2 * u];
        const int4 xsum = ((const int4 *)xs)[2 * u + 1];
        const float xdv[4] = {xd.x, xd.y, xd.z, xd.w};
        const int xsv[4] = {xsum.x, xsum.y, xsum.z, xsum.w};
        float acc = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t *lo = (g & 1) ? b : a;
            int is = 0;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const uint32_t code = ((lo[k] >> (4 * (g >> 1))) & 0x0f0f0f0fu) |
                                      ((c[k] >> (2 * g)) & 0x03030303u) << 4;
                is = __dp4a((int)code, xw[g][k], is);
            }
            const int scale = (int)(int8_t)(sc[g >> 1] >> (8 * ((i >> 1) + 2 * (g & 1))));
            acc = fmaf(xdv[g], (float)(scale * (is - 32 * xsv[g])), acc);
        }
        return d * acc;
    }
};

/* Bytes of one stage of type T's blocks of one matrix. */
template <int T>
static constexpr __host__ __device__ int qs_stage_bytes(int np)
{
    return qs<T>::stage_blocks(np) * qs<T>::BLOCK_BYTES;
}

/* Bytes of x's image as type T's products read it: per token row its codes
 * and their scales (S::XS float4s a unit). */
template <int T>
static size_t qs_image_bytes(int n_rows, int64_t cols)
{
    const size_t units = (size_t)cols / 256 * qs<T>::UNITS;
    return (size_t)n_rows * ((size_t)cols + units * qs<T>::XS * sizeof(float4));
}

/* Shared memory of the stream kernel of type T (and T2 in a mixed launch):
 * the warps' stages, each slot as large as the larger type's, then x's image
 * for each type. */
template <int T, int T2 = T>
static size_t qs_smem_bytes(int np, int n_rows, int64_t cols)
{
    const int sb1 = qs_stage_bytes<T>(np), sb2 = qs_stage_bytes<T2>(np);
    const size_t stages = (size_t)QS_WARPS * QS_STAGES * np * (sb1 > sb2 ? sb1 : sb2);
    return stages + qs_image_bytes<T>(n_rows, cols) +
           (T2 != T ? qs_image_bytes<T2>(n_rows, cols) : 0);
}

/* Where unit u (a row of the launch, counted across its matrices) lies: its
 * matrix m and row lr there (a pair's unit is a row of both matrices). */
template <int NP>
static __device__ __forceinline__ void stream_row_of(const struct cu_gemv_args &a, int u, int &m,
                                                     int &lr)
{
    m = 0;
    lr = u;
    if (NP == 1)
        while (m + 1 < a.n_mat && lr >= a.m[m].rows) {
            lr -= (int)a.m[m].rows;
            m++;
        }
}

/* A warp's walk over its stages, in order: part `part` (blocks from part *
 * CH) of the warp's row `row` (unit first + row * stride: live while that is
 * a unit of the launch; t2 when its matrix is of a mixed launch's second
 * type, whose rows take spr stages), in ring slot `slot`; kept as counters,
 * so no stage divides. */
struct stream_cursor {
    int row, part, slot, spr;
    bool live, t2;
};

/* Group g (32 values) of x's row t, f (normalised first when NORM, by 1/rms
 * r and the norm's weights; block 0 then also writes it to norm_out),
 * quantized into the block's shared memory as S::stage lays x out (and, in a
 * mixed launch, as S2::stage lays T2's image out). */
template <int T, int T2, bool NORM>
static __device__ __forceinline__ void stream_stage_group(const struct cu_gemv_args &a, int t,
                                                          int g, float4 (&f)[8],
                                                          const float4 (&nw)[8], float r,
                                                          int8_t *xq, float4 *xs, int8_t *xq2,
                                                          float4 *xs2)
{
    typedef qs<T> S;
    typedef qs<T2> S2;
    const int cols = (int)a.cols, nu = cols / 256 * S::UNITS, nu2 = cols / 256 * S2::UNITS;
    const size_t at = (size_t)t * cols + (size_t)g * 32;
    if (NORM) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            f[k] = make_float4(nw[k].x * (f[k].x * r), nw[k].y * (f[k].y * r),
                               nw[k].z * (f[k].z * r), nw[k].w * (f[k].w * r));
        if (blockIdx.x == 0 && a.norm_out)
#pragma unroll
            for (int k = 0; k < 8; k++)
                ((float4 *)(a.norm_out + at))[k] = f[k];
    }
    float v[32];
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[4 * k] = f[k].x, v[4 * k + 1] = f[k].y, v[4 * k + 2] = f[k].z, v[4 * k + 3] = f[k].w;
    uint32_t w[8];
    float d;
    int lo, hi;
    qx_block32(v, w, d, lo, hi);
    S::stage(xq + (size_t)t * cols, xs + (size_t)t * nu * S::XS, cols, g, w, d, lo + hi);
    if (T2 != T)
        S2::stage(xq2 + (size_t)t * cols, xs2 + (size_t)t * nu2 * S2::XS, cols, g, w, d, lo + hi);
}

/* Group g of x's row t and, when NORM, of the norm's weights, all loads
 * issued before any is used. */
template <bool NORM>
static __device__ __forceinline__ void stream_load_group(const struct cu_gemv_args &a, int t,
                                                         int g, float4 (&f)[8], float4 (&nw)[8])
{
    const float4 *xp = (const float4 *)(a.x + (size_t)t * a.cols + (size_t)g * 32);
#pragma unroll
    for (int k = 0; k < 8; k++)
        f[k] = __ldg(xp + k);
    if (NORM)
#pragma unroll
        for (int k = 0; k < 8; k++)
            nw[k] = __ldg((const float4 *)(a.norm_w + (size_t)g * 32) + k);
}

/* x's rows quantized into the block's shared memory, normalised first when
 * NORM, a thread per group of 32. Where a row's groups fill whole warps and
 * all rows' groups fit the block's threads (decode rows of up to 8,192),
 * one pass: each thread keeps its group in registers while the block sums
 * the squares (a butterfly per warp, then the row's warps in order), and
 * loads the norm's weights after.
 * Otherwise a pass over x for the sums of squares first. */
template <int T, int T2, bool NORM>
static __device__ __forceinline__ void stream_stage_x(const struct cu_gemv_args &a, int nt,
                                                      int8_t *xq, float4 *xs, int8_t *xq2,
                                                      float4 *xs2)
{
    const int cols = (int)a.cols, n32 = cols / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4 f[8], nw[8];
    if (!NORM) {
        for (int i = threadIdx.x; i < nt * n32; i += QS_THREADS) {
            const int t = i / n32;
            stream_load_group<false>(a, t, i - t * n32, f, nw);
            stream_stage_group<T, T2, false>(a, t, i - t * n32, f, nw, 1.0f, xq, xs, xq2, xs2);
        }
        return;
    }
    __shared__ float red[QS_WARPS * CU_GEMV_MAX_ROWS];
    if (n32 % 32 == 0 && nt * n32 <= QS_THREADS) {
        const int i = threadIdx.x, t = i / n32, g = i - t * n32;
        const bool mine = i < nt * n32;
        float ss = 0.0f;
        if (mine) {
            stream_load_group<false>(a, t, g, f, nw); /* the weights after the sums */
#pragma unroll
            for (int k = 0; k < 8; k++)
                ss += f[k].x * f[k].x + f[k].y * f[k].y + f[k].z * f[k].z + f[k].w * f[k].w;
        }
        ss = warp_sum(ss);
        if (lane == 0)
            red[warp] = ss;
        __syncthreads();
        if (!mine)
            return;
#pragma unroll
        for (int k = 0; k < 8; k++)
            nw[k] = __ldg((const float4 *)(a.norm_w + (size_t)g * 32) + k);
        const int per_row = n32 / 32; /* warps a row's groups fill */
        float tot = 0.0f;
        for (int w = 0; w < per_row; w++)
            tot += red[t * per_row + w];
        stream_stage_group<T, T2, true>(a, t, g, f, nw,
                                        1.0f / sqrtf(tot / (float)cols + a.norm_eps), xq, xs,
                                        xq2, xs2);
        return;
    }
    __shared__ float inv[CU_GEMV_MAX_ROWS];
    for (int t = 0; t < nt; t++) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < cols / 4; i += QS_THREADS) {
            float4 v = __ldg((const float4 *)(a.x + (size_t)t * cols) + i);
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warp_sum(ss);
        if (lane == 0)
            red[warp * CU_GEMV_MAX_ROWS + t] = ss;
    }
    __syncthreads();
    if (threadIdx.x < nt) {
        float tot = 0.0f;
        for (int w = 0; w < QS_WARPS; w++)
            tot += red[w * CU_GEMV_MAX_ROWS + threadIdx.x];
        inv[threadIdx.x] = 1.0f / sqrtf(tot / (float)cols + a.norm_eps);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt * n32; i += QS_THREADS) {
        const int t = i / n32;
        stream_load_group<true>(a, t, i - t * n32, f, nw);
        stream_stage_group<T, T2, true>(a, t, i - t * n32, f, nw, inv[t], xq, xs, xq2, xs2);
    }
}

/* One stage's 16-byte copies of a warp's row (NP matrices, each at src[p],
 * advanced past it) into ring slot dst (matrix p at dst + p * SLOT). */
template <int SB, int NP, int SLOT>
static __device__ __forceinline__ void stream_copy_stage(uint32_t dst, const uint8_t *(&src)[NP],
                                                         int pieces, int lane)
{
    constexpr int PIECES = (SB / 16 + 31) / 32; /* 16-byte copies a lane issues per matrix */
#pragma unroll
    for (int p = 0; p < NP; p++) {
#pragma unroll
        for (int k = 0; k < PIECES; k++) {
            const int i = lane + 32 * k;
            if (i < pieces)
                cp_async16(dst + (uint32_t)(p * SLOT + 16 * i), src[p] + 16 * i, true);
        }
        src[p] += SB;
    }
}

/* The products of one stage of type T (blocks from b0, matrix p at buf + p
 * * SLOT) with x's image of that type, into acc. */
template <int T, int TT, int NP, int SLOT>
static __device__ __forceinline__ void stream_stage_products(const uint8_t *buf, int b0, int nblk,
                                                             int lane, const int8_t *xq,
                                                             const float4 *xs, int cols, int nt,
                                                             float (&acc)[NP][TT])
{
    typedef qs<T> S;
    constexpr int CH = S::stage_blocks(NP);
    const int nu = cols / 256 * S::UNITS;
    const int nb = nblk - b0 < CH ? nblk - b0 : CH;
#pragma unroll
    for (int k = 0; k < (CH * S::UNITS + 31) / 32; k++) {
        const int ul = lane + 32 * k;
        if (ul < nb * S::UNITS) {
            const int u = b0 * S::UNITS + ul;
            const uint8_t *blk[NP];
#pragma unroll
            for (int p = 0; p < NP; p++)
                blk[p] = buf + p * SLOT + (ul / S::UNITS) * S::BLOCK_BYTES;
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < nt) {
                    float part[NP];
                    S::template dot<NP>(blk, u, xq + (size_t)t * cols, xs + (size_t)t * nu * S::XS,
                                        cols, part);
#pragma unroll
                    for (int p = 0; p < NP; p++)
                        acc[p][t] += part[p];
                }
        }
    }
}

/* T2 != T: a mixed launch (NP 1), matrices from a.n_mat1 on of type a.dtype2;
 * each row is streamed and multiplied as its own type. */
template <int T, int T2, int TT, int NP, bool NORM>
static __global__ void __launch_bounds__(QS_THREADS, 1)
qgemv_stream_kernel(struct cu_gemv_args a, int n_units)
{
    constexpr int SB1 = qs_stage_bytes<T>(NP), SB2 = qs_stage_bytes<T2>(NP);
    constexpr int SLOT = SB1 > SB2 ? SB1 : SB2; /* a ring slot, per matrix */
    extern __shared__ float4 qs_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cols = (int)a.cols, nt = a.n_rows;
    uint8_t *ring = (uint8_t *)qs_sm + (size_t)warp * QS_STAGES * NP * SLOT;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    int8_t *xq = (int8_t *)qs_sm + (size_t)QS_WARPS * QS_STAGES * NP * SLOT;
    float4 *xs = (float4 *)(xq + (size_t)nt * cols);
    int8_t *xq2 = (int8_t *)(xs + (size_t)nt * (cols / 256) * qs<T>::UNITS * qs<T>::XS);
    float4 *xs2 = (float4 *)(xq2 + (size_t)nt * cols);
    const int nblk = cols / 256;
    const uint64_t rb1 = (uint64_t)nblk * qs<T>::BLOCK_BYTES;
    const uint64_t rb2 = (uint64_t)nblk * qs<T2>::BLOCK_BYTES;
    const int spr1 = (nblk + qs<T>::stage_blocks(NP) - 1) / qs<T>::stage_blocks(NP);
    const int spr2 = (nblk + qs<T2>::stage_blocks(NP) - 1) / qs<T2>::stage_blocks(NP);
    const int last1 = (nblk - (spr1 - 1) * qs<T>::stage_blocks(NP)) * qs<T>::BLOCK_BYTES / 16;
    const int last2 = (nblk - (spr2 - 1) * qs<T2>::stage_blocks(NP)) * qs<T2>::BLOCK_BYTES / 16;
    /* a mixed launch's rows of the second type: units from split on, or
     * before it when the first matrices are of type T2 */
    int split = n_units;
    bool first_t2 = false;
    if (T2 != T) {
        split = 0;
        for (int i = 0; i < a.n_mat1; i++)
            split += (int)a.m[i].rows;
        first_t2 = a.dtype == T2;
    }

    const int first = blockIdx.x + gridDim.x * warp, stride = gridDim.x * QS_WARPS;
    auto enter_row = [&](stream_cursor &k) {
        const int u = first + k.row * stride;
        k.live = u < n_units;
        k.t2 = T2 != T && ((u >= split) != first_t2);
        k.spr = k.t2 ? spr2 : spr1;
    };
    auto advance = [&](stream_cursor &k) {
        if (++k.part == k.spr) {
            k.part = 0;
            k.row++;
            enter_row(k);
        }
        k.slot = k.slot == QS_STAGES - 1 ? 0 : k.slot + 1;
    };
    /* the copies run QS_STAGES - 1 stages ahead of the products */
    stream_cursor cc = {0, 0, 0, 0, false, false};
    enter_row(cc);
    const uint8_t *src[NP];
    auto copy = [&]() {
        if (cc.live) {
            if (cc.part == 0) {
                int m, lr;
                stream_row_of<NP>(a, first + cc.row * stride, m, lr);
#pragma unroll
                for (int p = 0; p < NP; p++)
                    src[p] = (const uint8_t *)a.m[NP == 1 ? m : p].w +
                             (uint64_t)lr * (cc.t2 ? rb2 : rb1);
            }
            const uint32_t dst = ring_s + (uint32_t)(cc.slot * NP * SLOT);
            if (cc.t2)
                stream_copy_stage<SB2, NP, SLOT>(dst, src, cc.part == spr2 - 1 ? last2 : SB2 / 16,
                                                 lane);
            else
                stream_copy_stage<SB1, NP, SLOT>(dst, src, cc.part == spr1 - 1 ? last1 : SB1 / 16,
                                                 lane);
        }
        cp_async_commit(); /* empty groups too: the count stays one per stage */
        advance(cc);
    };
#pragma unroll
    for (int n = 0; n < QS_STAGES - 1; n++)
        copy();
    pdl_release();
    pdl_wait();

    /* x, normalised when NORM (every block finds the rms itself), quantized
     * into shared memory for each type */
    stream_stage_x<T, T2, NORM>(a, nt, xq, xs, xq2, xs2);
    __syncthreads();

    float acc[NP][TT];
    gemv_zero_acc(acc);
    stream_cursor c = {0, 0, 0, 0, false, false};
    for (enter_row(c); c.live; advance(c)) {
        cp_async_wait<QS_STAGES - 2>();
        __syncwarp();
        /* the buffer it refills was read by the whole warp one stage ago */
        copy();
        const uint8_t *buf = ring + (size_t)c.slot * NP * SLOT;
        if (c.t2)
            stream_stage_products<T2, TT, NP, SLOT>(buf, c.part * qs<T2>::stage_blocks(NP), nblk,
                                                    lane, xq2, xs2, cols, nt, acc);
        else
            stream_stage_products<T, TT, NP, SLOT>(buf, c.part * qs<T>::stage_blocks(NP), nblk,
                                                   lane, xq, xs, cols, nt, acc);
        if (c.part != c.spr - 1)
            continue;
        int m, lr;
        stream_row_of<NP>(a, first + c.row * stride, m, lr);
        gemv_finish_row<NP, TT>(a, m, lr, nt, acc);
    }
    cp_async_wait<0>();
}

template <int T, int T2, int TT, int NP>
static cudaError_t qgemv_stream_launch(struct cu_device *dev, cudaStream_t s,
                                       const struct cu_gemv_args *a, int n_units, size_t smem)
{
    auto kern = a->norm_w ? qgemv_stream_kernel<T, T2, TT, NP, true>
                          : qgemv_stream_kernel<T, T2, TT, NP, false>;
    const int tt = TT == 1 ? 0 : TT == 2 ? 1 : TT == 4 ? 2 : 3;
    const int slot = T2 != T ? 2 * CU_GEMV_STREAM_KERNELS + tt * 2 + (a->norm_w ? 1 : 0)
                             : (T == DTYPE_Q6_K ? CU_GEMV_STREAM_KERNELS : 0) +
                                   (tt * 2 + (NP - 1)) * 2 + (a->norm_w ? 1 : 0);
    int per_sm = 0;
    cudaError_t e = cu_kernel_fit(kern, QS_THREADS, smem, &dev->qgemv_smem[slot], &per_sm);
    if (e != cudaSuccess)
        return e;
    const int64_t want = ((int64_t)n_units + QS_WARPS - 1) / QS_WARPS;
    const int64_t slots = (int64_t)dev->n_sm * per_sm;
    const unsigned grid = (unsigned)(want < slots ? want : slots);
    return cu_launch_dependent(dev->pdl, kern, dim3(grid), dim3(QS_THREADS), smem, s, *a, n_units);
}

template <int T, int NP, int T2 = T>
static cudaError_t qgemv_stream_np(struct cu_device *dev, cudaStream_t s,
                                   const struct cu_gemv_args *a, int n_units, size_t smem)
{
    if (a->n_rows == 1)
        return qgemv_stream_launch<T, T2, 1, NP>(dev, s, a, n_units, smem);
    if (a->n_rows == 2)
        return qgemv_stream_launch<T, T2, 2, NP>(dev, s, a, n_units, smem);
    if (a->n_rows <= 4)
        return qgemv_stream_launch<T, T2, 4, NP>(dev, s, a, n_units, smem);
    return qgemv_stream_launch<T, T2, 8, NP>(dev, s, a, n_units, smem);
}

/* Whether the stream kernel takes dtype over n_rows rows of cols. */
static bool stream_takes(int dtype, int n_rows, int64_t cols, size_t smem_optin)
{
    if (n_rows < 1 || n_rows > CU_GEMV_MAX_ROWS || cols <= 0 || cols >= INT32_MAX / 8)
        return false;
    /* whole blocks, rows starting 16-byte aligned (Q6_K: eight blocks a multiple of 16
     * bytes); the kernel's static shared memory (the norm's sums) within the margin */
    const size_t margin = 1024;
    if (dtype == DTYPE_Q4_K)
        return cols % 256 == 0 && qs_smem_bytes<DTYPE_Q4_K>(2, n_rows, cols) + margin <= smem_optin;
    if (dtype == DTYPE_Q6_K)
        return cols % 2048 == 0 && qs_smem_bytes<DTYPE_Q6_K>(2, n_rows, cols) + margin <= smem_optin;
    return false;
}

/* Whether a launch of both stream types (one matrix a row) takes n_rows rows of cols. */
static bool stream_takes_mixed(int n_rows, int64_t cols, size_t smem_optin)
{
    return n_rows >= 1 && n_rows <= CU_GEMV_MAX_ROWS && cols > 0 && cols < INT32_MAX / 8 &&
           cols % 2048 == 0 &&
           qs_smem_bytes<DTYPE_Q4_K, DTYPE_Q6_K>(1, n_rows, cols) + 1024 <= smem_optin;
}

/* The kernel family of block type dt: T of qtype<T>, or -1. */
static int family(int dt)
{
    if (dt == DTYPE_Q8_0 || dt == DTYPE_Q4_K || dt == DTYPE_Q6_K)
        return dt;
    if (dtype_is_mlx((enum dtype)dt))
        return dtype_mlx_bits((enum dtype)dt) == 4 ? DTYPE_MLX4_G32_BF16 : DTYPE_MLX8_G32_BF16;
    return -1;
}

/* Alignment each family's loads need of a row's start. */
static size_t family_align(int fam)
{
    return fam == DTYPE_Q4_K ? 16 : fam == DTYPE_Q8_0 || fam == DTYPE_Q6_K ? 2 : 4;
}

extern "C" uint64_t cu_block_types(void)
{
    uint64_t set = 0;
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (dtype_is_block((enum dtype)t) && family(t) >= 0)
            set |= 1ull << t;
    return set;
}

/* Rows of a block matrix start where its kernels can load them. */
static bool rows_aligned(const void *w, int dt, int64_t cols)
{
    size_t al = family_align(family(dt));
    return (uintptr_t)w % al == 0 && dtype_row_bytes((enum dtype)dt, (uint64_t)cols) % al == 0;
}

/* Whether a's matrices are of two types (cu_gemv_args.n_mat1). */
static bool mixed_launch(const struct cu_gemv_args *a)
{
    return a->n_mat1 > 0 && a->n_mat1 < a->n_mat && a->dtype2 != a->dtype;
}

/* Matrix i's type. */
static int mat_dtype(const struct cu_gemv_args *a, int i)
{
    return mixed_launch(a) && i >= a->n_mat1 ? a->dtype2 : a->dtype;
}

bool cu_qgemv_stream_runs(const struct cu_device *dev, const struct cu_gemv_args *a)
{
    bool aligned16 = (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->norm_w % 16 == 0;
    int64_t total = 0;
    for (int i = 0; i < a->n_mat; i++) {
        aligned16 = aligned16 && (uintptr_t)a->m[i].w % 16 == 0;
        total += a->m[i].rows;
    }
    const bool mixed_ok = (a->dtype == DTYPE_Q4_K && a->dtype2 == DTYPE_Q6_K) ||
                          (a->dtype == DTYPE_Q6_K && a->dtype2 == DTYPE_Q4_K);
    const bool takes = mixed_launch(a)
                           ? mixed_ok && !a->pair &&
                                 stream_takes_mixed(a->n_rows, a->cols, (size_t)dev->smem_optin)
                           : stream_takes(a->dtype, a->n_rows, a->cols, (size_t)dev->smem_optin);
    return a->xq && a->qstream && !a->row_invariant && aligned16 && total < INT32_MAX && takes;
}

bool cu_qgemv_int8_runs(const struct cu_device *dev, const struct cu_gemv_args *a)
{
    if (cu_qgemv_stream_runs(dev, a) || mixed_launch(a) || !a->xq || a->row_invariant ||
        (uintptr_t)a->xq % 16 || (uintptr_t)a->x % 16 || (uintptr_t)a->norm_w % 16)
        return false;
    size_t need = cu_qgemv_int8_bytes(a->dtype, a->n_rows, a->cols);
    return need && need <= a->xq_bytes;
}

cudaError_t cu_launch_qgemv(struct cu_device *dev, cudaStream_t s, const struct cu_gemv_args *a)
{
    int64_t total = 0;
    for (int i = 0; i < a->n_mat; i++)
        total += a->m[i].rows;
    int64_t n_units = a->pair ? a->m[0].rows : total;
    if (n_units == 0 || a->n_rows == 0)
        return cudaSuccess;
    int fam = family(a->dtype);
    if (fam < 0 || a->cols % 32 || (uintptr_t)a->x % 16)
        return cudaErrorNotSupported;
    for (int i = 0; i < a->n_mat; i++)
        if (!rows_aligned(a->m[i].w, mat_dtype(a, i), a->cols))
            return cudaErrorMisalignedAddress;
    if (mixed_launch(a)) {
        /* only the stream kernel reads two types in one launch */
        if (!cu_qgemv_stream_runs(dev, a))
            return cudaErrorNotSupported;
        const size_t smem = qs_smem_bytes<DTYPE_Q4_K, DTYPE_Q6_K>(1, a->n_rows, a->cols);
        return qgemv_stream_np<DTYPE_Q4_K, 1, DTYPE_Q6_K>(dev, s, a, (int)n_units, smem);
    }
    if (cu_qgemv_stream_runs(dev, a)) {
        const int np = a->pair ? 2 : 1;
        if (a->dtype == DTYPE_Q4_K) {
            const size_t smem = qs_smem_bytes<DTYPE_Q4_K>(np, a->n_rows, a->cols);
            return a->pair ? qgemv_stream_np<DTYPE_Q4_K, 2>(dev, s, a, (int)n_units, smem)
                           : qgemv_stream_np<DTYPE_Q4_K, 1>(dev, s, a, (int)n_units, smem);
        }
        const size_t smem = qs_smem_bytes<DTYPE_Q6_K>(np, a->n_rows, a->cols);
        return a->pair ? qgemv_stream_np<DTYPE_Q6_K, 2>(dev, s, a, (int)n_units, smem)
                       : qgemv_stream_np<DTYPE_Q6_K, 1>(dev, s, a, (int)n_units, smem);
    }
    if (cu_qgemv_int8_runs(dev, a))
        return qgemv_int8(dev, s, a, n_units);
    /* a folded RMSNorm only on the int8 paths (the executor launches the norm
     * apart otherwise: fuse.cu) */
    if (a->norm_w)
        return cudaErrorNotSupported;
    switch (fam) {
    case DTYPE_Q8_0: return qgemv_type<DTYPE_Q8_0>(s, a, n_units);
    case DTYPE_Q4_K: return qgemv_type<DTYPE_Q4_K>(s, a, n_units);
    case DTYPE_Q6_K: return qgemv_type<DTYPE_Q6_K>(s, a, n_units);
    case DTYPE_MLX4_G32_BF16: return qgemv_type<DTYPE_MLX4_G32_BF16>(s, a, n_units);
    default: return qgemv_type<DTYPE_MLX8_G32_BF16>(s, a, n_units);
    }
}

/* ---- whole rows: bf16 tiles and embedding rows ---------------------------- */

/* Rows [0, rows) of w dequantized, one thread per chunk: as bf16 (rounded to
 * nearest even) into out_bf16, or as f32 into out_f32 (then row r of w is
 * rows_idx[r] when rows_idx is given). */
template <int T>
static __global__ void qrows_kernel(const uint8_t *w, int dt, int64_t rows, int64_t cols,
                                    const int32_t *rows_idx, uint16_t *out_bf16, float *out_f32)
{
    typedef qtype<T> Q;
    const int64_t nchunk = cols / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nchunk)
        return;
    const int64_t r = i / nchunk, c = i - r * nchunk;
    const int64_t src = rows_idx ? rows_idx[r] : r;
    typename Q::raw raw;
    Q::load(w + (uint64_t)src * Q::row_bytes(cols, dt), c, dt, raw);
    float v[32];
    Q::expand(raw, c, dt, v);
    if (out_f32) {
        float4 *o = (float4 *)(out_f32 + r * cols + c * 32);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        return;
    }
    uint32_t packed[16];
#pragma unroll
    for (int k = 0; k < 16; k++)
        packed[k] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k])) |
                    (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k + 1])) << 16;
    uint4 *o = (uint4 *)(out_bf16 + r * cols + c * 32);
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = make_uint4(packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]);
}

template <int T>
static cudaError_t qrows_type(cudaStream_t s, const void *w, int dt, int64_t rows, int64_t cols,
                              const int32_t *idx, uint16_t *ob, float *of)
{
    int64_t n = rows * (cols / 32);
    unsigned grid = (unsigned)((n + 255) / 256);
    qrows_kernel<T><<<grid, 256, 0, s>>>((const uint8_t *)w, dt, rows, cols, idx, ob, of);
    return cudaGetLastError();
}

static cudaError_t qrows(cudaStream_t s, const void *w, int dt, int64_t rows, int64_t cols,
                         const int32_t *idx, uint16_t *ob, float *of)
{
    if (rows <= 0)
        return cudaSuccess;
    int fam = family(dt);
    if (fam < 0 || cols % 32)
        return cudaErrorNotSupported;
    if (!rows_aligned(w, dt, cols))
        return cudaErrorMisalignedAddress;
    switch (fam) {
    case DTYPE_Q8_0: return qrows_type<DTYPE_Q8_0>(s, w, dt, rows, cols, idx, ob, of);
    case DTYPE_Q4_K: return qrows_type<DTYPE_Q4_K>(s, w, dt, rows, cols, idx, ob, of);
    case DTYPE_Q6_K: return qrows_type<DTYPE_Q6_K>(s, w, dt, rows, cols, idx, ob, of);
    case DTYPE_MLX4_G32_BF16:
        return qrows_type<DTYPE_MLX4_G32_BF16>(s, w, dt, rows, cols, idx, ob, of);
    default: return qrows_type<DTYPE_MLX8_G32_BF16>(s, w, dt, rows, cols, idx, ob, of);
    }
}

cudaError_t cu_launch_dequant_bf16(cudaStream_t s, int dtype, const void *w, int64_t rows,
                                   int64_t cols, uint16_t *out)
{
    return qrows(s, w, dtype, rows, cols, NULL, out, NULL);
}

cudaError_t cu_launch_embed_blocks(cudaStream_t s, const struct cu_op *op, const uint8_t *params)
{
    return qrows(s, op->u.embed.table, op->u.embed.dtype, op->n_rows, op->u.embed.cols,
                 (const int32_t *)(params + op->u.embed.tok_off), NULL, op->u.embed.out);
}
