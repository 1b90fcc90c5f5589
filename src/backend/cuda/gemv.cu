/* backend/cuda/gemv.cu — matrix-vector products for decode: bf16 and f32 weights read with 16-byte loads (bf16 by persistent blocks; split-K across warps for the general path), fused epilogues. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/gemv_store.cuh"
#include "backend/cuda/warp.cuh"

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
/* 16-byte loads per lane issued together, per row (8 measured slower than 4
 * on an H200: fewer resident warps). */
#define GEMV_UNROLL(np) 4

static __device__ __forceinline__ float round_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

/* Eight x values (one 16-byte weight chunk's worth) of token row xr; with
 * nw, RMSNorm applied as the CPU does: nw * (x * inv). */
static __device__ __forceinline__ void load_x8(const float *xr, const float *nw, float inv,
                                               bool round, float out[8])
{
    float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)xr + 1);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    if (nw) {
        float4 wa = __ldg((const float4 *)nw), wb = __ldg((const float4 *)nw + 1);
        float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
        for (int i = 0; i < 8; i++)
            out[i] = w[i] * (out[i] * inv);
    }
    if (round)
        for (int i = 0; i < 8; i++)
            out[i] = round_bf16(out[i]);
}

/* How the general kernel reads rows: an element per lane, or chunks of
 * eight elements in 16-byte loads (one for bf16, two for f32). */
enum gemv_read { GEMV_SCALAR, GEMV_BF16X8, GEMV_F32X8 };

static __device__ __forceinline__ float dot_f32x8(uint4 lo, uint4 hi, const float x[8])
{
    uint32_t v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        s = fmaf(__uint_as_float(v[i]), x[i], s);
    return s;
}

static __device__ __forceinline__ float dot_bf16x8(uint4 w, const float x[8])
{
    float s = 0;
    uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = fmaf(__uint_as_float(v[i] << 16), x[2 * i], s);
        s = fmaf(__uint_as_float(v[i] & 0xffff0000u), x[2 * i + 1], s);
    }
    return s;
}

/* Which matrix of the group row r falls in, and its row there. */
static __device__ __forceinline__ int find_mat(const struct cu_gemv_args *a, int64_t r,
                                               int64_t *local)
{
    int m = 0;
    while (m + 1 < a->n_mat && r >= a->m[m].rows) {
        r -= a->m[m].rows;
        m++;
    }
    *local = r;
    return m;
}

/* NP rows (1, or 2 for the SwiGLU pair) times TT token rows. READ: chunks
 * of 8 elements for rows whose length is a multiple of 8 (each lane sums its
 * chunks in column order, eight products a chunk), otherwise an element per
 * lane. wpr warps share each unit of rows (split-K), reducing through shared
 * memory, so short and narrow matrices still fill the GPU. */
template <int TT, int NP, int READ>
static __global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(struct cu_gemv_args a, int64_t n_units, int wpr)
{
    constexpr bool VEC = READ != GEMV_SCALAR;
    constexpr int LOADS = READ == GEMV_F32X8 ? 2 : 1; /* 16-byte loads per chunk */
    __shared__ float red[GEMV_WARPS][NP][TT];
    __shared__ float inv_sm[TT];
    constexpr int U = GEMV_UNROLL(NP);
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int units_per_block = GEMV_WARPS / wpr;
    int64_t unit = (int64_t)blockIdx.x * units_per_block + warp / wpr;
    int part = warp % wpr;
    int t0 = blockIdx.y * TT;
    int nt = a.n_rows - t0 < TT ? a.n_rows - t0 : TT;
    bool active = unit < n_units;
    const int64_t cols = a.cols;
    const float *x0 = a.x + (int64_t)t0 * cols;

    /* fused RMSNorm: every block finds the rms of its token rows itself */
    const float *nw = a.norm_w;
    if (nw) {
        for (int t = 0; t < nt; t++) {
            float ss = 0;
            for (int64_t c = threadIdx.x; c < cols; c += GEMV_THREADS) {
                float v = x0[t * cols + c];
                ss += v * v;
            }
            ss = warp_sum(ss);
            if (lane == 0)
                red[warp][0][0] = ss;
            __syncthreads();
            if (threadIdx.x == 0) {
                float tot = 0;
                for (int w = 0; w < GEMV_WARPS; w++)
                    tot += red[w][0][0];
                inv_sm[t] = 1.0f / sqrtf(tot / (float)cols + a.norm_eps);
            }
            __syncthreads();
        }
        if (blockIdx.x == 0 && a.norm_out)
            for (int t = 0; t < nt; t++)
                for (int64_t c = threadIdx.x; c < cols; c += GEMV_THREADS)
                    a.norm_out[(int64_t)(t0 + t) * cols + c] = nw[c] * (x0[t * cols + c] * inv_sm[t]);
    }
    float inv[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        inv[t] = nw && t < nt ? inv_sm[t] : 1.0f;

    float acc[NP][TT];
    gemv_zero_acc(acc);

    int m = 0;
    int64_t lr = unit;
    if (active && NP == 1)
        m = find_mat(&a, unit, &lr);
    if (active) {
        const void *wrow[NP];
#pragma unroll
        for (int p = 0; p < NP; p++)
            wrow[p] = (const uint8_t *)a.m[NP == 1 ? m : p].w +
                      lr * cols * (a.dtype == DTYPE_F32 ? 4 : 2);
        if (VEC) {
            const int64_t nchunk = cols / 8;
            const int64_t stride = 32 * wpr;
            for (int64_t c0 = part * 32 + lane; c0 < nchunk; c0 += stride * U) {
                uint4 wv[U][NP][LOADS];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int64_t c = c0 + u * stride;
#pragma unroll
                    for (int p = 0; p < NP; p++)
#pragma unroll
                        for (int l = 0; l < LOADS; l++)
                            wv[u][p][l] = c < nchunk
                                              ? load_stream((const uint4 *)wrow[p] + c * LOADS + l)
                                              : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int64_t c = c0 + u * stride;
                    if (c < nchunk) {
#pragma unroll
                        for (int t = 0; t < TT; t++) {
                            if (t < nt) {
                                float xv[8];
                                load_x8(x0 + t * cols + c * 8, nw ? nw + c * 8 : NULL, inv[t],
                                        a.round_bf16, xv);
#pragma unroll
                                for (int p = 0; p < NP; p++)
                                    acc[p][t] += READ == GEMV_F32X8
                                                     ? dot_f32x8(wv[u][p][0], wv[u][p][LOADS - 1], xv)
                                                     : dot_bf16x8(wv[u][p][0], xv);
                            }
                        }
                    }
                }
            }
        } else {
            for (int64_t c = part * 32 + lane; c < cols; c += 32 * wpr) {
                float wf[NP];
#pragma unroll
                for (int p = 0; p < NP; p++)
                    wf[p] = a.dtype == DTYPE_F32
                                ? ((const float *)wrow[p])[c]
                                : __uint_as_float((uint32_t)((const uint16_t *)wrow[p])[c] << 16);
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    if (t < nt) {
                        float xv = x0[t * cols + c];
                        if (nw)
                            xv = nw[c] * (xv * inv[t]);
                        if (a.round_bf16)
                            xv = round_bf16(xv);
#pragma unroll
                        for (int p = 0; p < NP; p++)
                            acc[p][t] = fmaf(wf[p], xv, acc[p][t]);
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
    if (wpr > 1) {
        if (lane == 0)
#pragma unroll
            for (int p = 0; p < NP; p++)
#pragma unroll
                for (int t = 0; t < TT; t++)
                    red[warp][p][t] = acc[p][t];
        __syncthreads();
        if (part == 0 && lane == 0)
            for (int w = 1; w < wpr; w++)
#pragma unroll
                for (int p = 0; p < NP; p++)
#pragma unroll
                    for (int t = 0; t < TT; t++)
                        acc[p][t] += red[warp + w][p][t];
    }
    if (!active || part != 0 || lane != 0)
        return;
    gemv_store_row<NP, TT>(a, m, lr, t0, nt, acc);
}

template <int TT, int NP>
static cudaError_t launch_tt(cudaStream_t s, const struct cu_gemv_args *a, int64_t n_units,
                             int wpr, enum gemv_read read)
{
    dim3 grid((unsigned)((n_units + GEMV_WARPS / wpr - 1) / (GEMV_WARPS / wpr)),
              (unsigned)((a->n_rows + TT - 1) / TT));
    if (read == GEMV_BF16X8)
        gemv_kernel<TT, NP, GEMV_BF16X8><<<grid, GEMV_THREADS, 0, s>>>(*a, n_units, wpr);
    else if (read == GEMV_F32X8)
        gemv_kernel<TT, NP, GEMV_F32X8><<<grid, GEMV_THREADS, 0, s>>>(*a, n_units, wpr);
    else
        gemv_kernel<TT, NP, GEMV_SCALAR><<<grid, GEMV_THREADS, 0, s>>>(*a, n_units, wpr);
    return cudaGetLastError();
}

template <int NP>
static cudaError_t launch_np(cudaStream_t s, const struct cu_gemv_args *a, int64_t n_units,
                             int wpr, enum gemv_read read)
{
    if (a->n_rows == 1)
        return launch_tt<1, NP>(s, a, n_units, wpr, read);
    if (a->n_rows == 2)
        return launch_tt<2, NP>(s, a, n_units, wpr, read);
    if (a->n_rows <= 4)
        return launch_tt<4, NP>(s, a, n_units, wpr, read);
    return launch_tt<8, NP>(s, a, n_units, wpr, read);
}

/* ---- the decode path: persistent blocks streaming whole rows ------------------
 *
 * For bf16 rows of 16-byte chunks, at most 8 token rows whose x fits in
 * shared memory, and no fused RMSNorm (a decode step): one wave of blocks (as
 * many as fit on every SM), each staging x once in shared memory (rounded to
 * bf16 in fast mode), its warps walking the units of rows the block owns
 * (unit = blockIdx.x + k * gridDim.x, so every SM gets the same share to
 * within one unit). A warp issues GEMV_STREAM_LOADS 16-byte loads per lane
 * before it uses any of them (4 KB of a row, half of it per matrix for the
 * SwiGLU pair) and reduces each unit by itself, chunks in column order
 * whatever the batch size, so the sums do not depend on the launch shape:
 * graph replay and eager launches give the same bits.
 *
 * On sm_90 the kernel is launched as a programmatic dependent of the kernel
 * before it: its blocks start while that one drains, issue their first weight
 * loads (weights are never written by a step), and only then wait for the
 * previous kernel's results before reading x or writing anything. Each block
 * allows its own dependents at once, so a GEMV that follows a GEMV (gate/up,
 * then down) fills the SM slots the first one leaves. */
/* Blocks of 16 warps, at most two an SM: fewer blocks stage x from L2 than
 * with 8-warp blocks; on an H200 Llama-3.1-8B bf16 decode 232.0 -> 237.1
 * tok/s, Llama-3.2-1B 1,101 -> 1,151 (one 32-warp block an SM: 237.9, 1,155) */
#ifndef GEMV_STREAM_THREADS
#define GEMV_STREAM_THREADS 512
#endif
#ifndef GEMV_STREAM_MIN_BLOCKS
#define GEMV_STREAM_MIN_BLOCKS 2
#endif
/* 16-byte loads per lane in flight per batch: 8 (64 registers) measured ahead
 * of 16 on an H200 (Llama-3.1-8B decode 197.3 against 192.1 tok/s) */
#ifndef GEMV_STREAM_LOADS
#define GEMV_STREAM_LOADS 8
#endif

/* NORM: x is RMSNorm'ed on the way into shared memory. Every block finds the
 * rms of the token rows itself (a few KB read from L2), block 0 also writes
 * the normed rows to norm_out, as the RMSNorm launch it replaces would. */
template <int TT, int NP, bool NORM>
static __global__ void __launch_bounds__(GEMV_STREAM_THREADS, GEMV_STREAM_MIN_BLOCKS)
gemv_stream_kernel(struct cu_gemv_args a, int n_units)
{
    /* x of token t, chunk c: halves at xs[t * 2 * nchunk + c] and
     * xs[t * 2 * nchunk + nchunk + c], so a warp's reads are conflict-free */
    extern __shared__ float4 xs[];
    constexpr int W = GEMV_STREAM_THREADS / 32;
    constexpr int U = GEMV_STREAM_LOADS / NP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nchunk = (int)(a.cols / 8);
    const int nt = a.n_rows;

    int unit = blockIdx.x + gridDim.x * warp;
    const uint4 *wrow[NP];
    int m = 0, lr = 0;
    uint4 wv[U][NP];
    int cb = 0;

    /* the unit's first loads go out before x is staged */
    auto begin_unit = [&]() {
        lr = unit;
        if (NP == 1) {
            m = 0;
            while (m + 1 < a.n_mat && lr >= a.m[m].rows) {
                lr -= (int)a.m[m].rows;
                m++;
            }
        }
#pragma unroll
        for (int p = 0; p < NP; p++)
            wrow[p] = (const uint4 *)a.m[NP == 1 ? m : p].w + (int64_t)lr * nchunk;
    };
    auto issue = [&]() {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = cb + u * 32 + lane;
#pragma unroll
            for (int p = 0; p < NP; p++)
                wv[u][p] = c < nchunk ? load_stream(wrow[p] + c) : make_uint4(0, 0, 0, 0);
        }
    };
    if (unit < n_units) {
        begin_unit();
        issue();
    }
    /* the next GEMV may start its own weight loads as our blocks leave */
    pdl_release();
    pdl_wait();

    const float *x = a.x;
    float ss[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        ss[t] = 0.0f;
    for (int i = threadIdx.x; i < nt * 2 * nchunk; i += GEMV_STREAM_THREADS) {
        int t = i / (2 * nchunk), r = i - t * 2 * nchunk;
        float4 v = __ldg((const float4 *)(x + (int64_t)t * a.cols) + r);
        if (NORM) {
#pragma unroll
            for (int u = 0; u < TT; u++)
                if (u == t)
                    ss[u] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        } else if (a.round_bf16) {
            v.x = round_bf16(v.x);
            v.y = round_bf16(v.y);
            v.z = round_bf16(v.z);
            v.w = round_bf16(v.w);
        }
        xs[t * 2 * nchunk + (r & 1) * nchunk + (r >> 1)] = v;
    }
    if (NORM) {
        __shared__ float red[GEMV_STREAM_THREADS / 32][TT];
        __shared__ float inv_sm[TT];
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float v = warp_sum(ss[t]);
            if (lane == 0)
                red[warp][t] = v;
        }
        __syncthreads();
        if (threadIdx.x < TT) {
            float tot = 0.0f;
            for (int w = 0; w < GEMV_STREAM_THREADS / 32; w++)
                tot += red[w][threadIdx.x];
            inv_sm[threadIdx.x] = 1.0f / sqrtf(tot / (float)a.cols + a.norm_eps);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nt * 2 * nchunk; i += GEMV_STREAM_THREADS) {
            int t = i / (2 * nchunk), r = i - t * 2 * nchunk;
            float inv = inv_sm[t];
            float4 w = __ldg((const float4 *)a.norm_w + r);
            float4 *slot = &xs[t * 2 * nchunk + (r & 1) * nchunk + (r >> 1)];
            float4 v = *slot;
            v.x = w.x * (v.x * inv);
            v.y = w.y * (v.y * inv);
            v.z = w.z * (v.z * inv);
            v.w = w.w * (v.w * inv);
            if (blockIdx.x == 0 && a.norm_out)
                *((float4 *)(a.norm_out + (int64_t)t * a.cols) + r) = v;
            if (a.round_bf16) {
                v.x = round_bf16(v.x);
                v.y = round_bf16(v.y);
                v.z = round_bf16(v.z);
                v.w = round_bf16(v.w);
            }
            *slot = v;
        }
    }
    __syncthreads();
    if (unit >= n_units)
        return;

    float acc[NP][TT];
    gemv_zero_acc(acc);
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = cb + u * 32 + lane;
            if (c < nchunk) {
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    if (t < nt) {
                        float4 lo = xs[t * 2 * nchunk + c], hi = xs[t * 2 * nchunk + nchunk + c];
                        float xv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                        for (int p = 0; p < NP; p++)
                            acc[p][t] += dot_bf16x8(wv[u][p], xv);
                    }
                }
            }
        }
        cb += 32 * U;
        if (cb >= nchunk) {
            gemv_finish_row<NP, TT>(a, m, lr, nt, acc);
            unit += gridDim.x * W;
            if (unit >= n_units)
                return;
            cb = 0;
            begin_unit();
        }
        issue();
    }
}

/* Index of gemv_stream_kernel<TT, NP, norm> in cu_device.gemv_smem. */
template <int TT, int NP>
static int stream_kernel_index(bool norm)
{
    int tt = TT == 1 ? 0 : TT == 2 ? 1 : TT == 4 ? 2 : 3;
    return (tt * 2 + (NP - 1)) * 2 + (norm ? 1 : 0);
}

template <int TT, int NP>
static cudaError_t launch_stream(struct cu_device *dev, cudaStream_t s,
                                 const struct cu_gemv_args *a, int n_units, size_t smem)
{
    auto kern = a->norm_w ? gemv_stream_kernel<TT, NP, true> : gemv_stream_kernel<TT, NP, false>;
    /* set for every kernel before its first launch on the device: static
     * shared memory counts against the default 48 KB too */
    int per_sm = 0;
    cudaError_t e =
        cu_kernel_fit(kern, GEMV_STREAM_THREADS, smem,
                      &dev->gemv_smem[stream_kernel_index<TT, NP>(a->norm_w != NULL)], &per_sm);
    if (e != cudaSuccess)
        return e;
    const int64_t W = GEMV_STREAM_THREADS / 32;
    int64_t want = ((int64_t)n_units + W - 1) / W;
    int64_t slots = (int64_t)dev->n_sm * per_sm;
    unsigned grid = (unsigned)(want < slots ? want : slots);
    return cu_launch_dependent(dev->pdl, kern, dim3(grid), dim3(GEMV_STREAM_THREADS), smem, s, *a,
                               n_units);
}

template <int NP>
static cudaError_t launch_stream_np(struct cu_device *dev, cudaStream_t s,
                                    const struct cu_gemv_args *a, int n_units, size_t smem)
{
    if (a->n_rows == 1)
        return launch_stream<1, NP>(dev, s, a, n_units, smem);
    if (a->n_rows == 2)
        return launch_stream<2, NP>(dev, s, a, n_units, smem);
    if (a->n_rows <= 4)
        return launch_stream<4, NP>(dev, s, a, n_units, smem);
    return launch_stream<8, NP>(dev, s, a, n_units, smem);
}

cudaError_t cu_launch_gemv(struct cu_device *dev, cudaStream_t s, const struct cu_gemv_args *a)
{
    int64_t total = 0;
    for (int i = 0; i < a->n_mat; i++)
        total += a->m[i].rows;
    int64_t n_units = a->pair ? a->m[0].rows : total;
    if (n_units == 0 || a->n_rows == 0)
        return cudaSuccess;
    if (dtype_is_block((enum dtype)a->dtype))
        return cu_launch_qgemv(dev, s, a);
    bool vec = (a->dtype == DTYPE_BF16 || a->dtype == DTYPE_F32) && a->cols % 8 == 0;
    for (int i = 0; i < a->n_mat && vec; i++)
        vec = ((uintptr_t)a->m[i].w % 16) == 0;
    vec = vec && ((uintptr_t)a->x % 16) == 0 && ((uintptr_t)a->norm_w % 16) == 0;
    bool bf16 = a->dtype == DTYPE_BF16;
    size_t smem = (size_t)a->n_rows * (size_t)a->cols * sizeof(float);
    if (vec && bf16 && a->n_rows <= 8 && smem <= (size_t)dev->smem_optin &&
        n_units < INT32_MAX && (int64_t)a->n_rows * a->cols < INT32_MAX)
        return a->pair ? launch_stream_np<2>(dev, s, a, (int)n_units, smem)
                       : launch_stream_np<1>(dev, s, a, (int)n_units, smem);
    enum gemv_read read = !vec ? GEMV_SCALAR : bf16 ? GEMV_BF16X8 : GEMV_F32X8;
    /* 16-byte loads per lane over a row, or elements for the scalar read */
    int64_t per_lane = !vec ? a->cols : bf16 ? a->cols / 8 : a->cols / 4;
    /* Enough warps in flight to cover HBM latency: about 48 per SM. Split-K
     * changes a row's order of summation, so EXACT mode (row_invariant) takes
     * it only where the streaming kernel, which sums a row in one warp, never
     * runs (f32 and scalar reads): there wpr follows from the matrix's shape
     * alone and a row's bits still do not depend on how many rows came. */
    bool split_ok = !a->row_invariant || read != GEMV_BF16X8;
    int wpr = 1;
    while (split_ok && wpr < GEMV_WARPS && n_units * wpr < (int64_t)dev->n_sm * 48 &&
           per_lane >= 64 * wpr * 2)
        wpr *= 2;
    return a->pair ? launch_np<2>(s, a, n_units, wpr, read) : launch_np<1>(s, a, n_units, wpr, read);
}
