/* backend/cuda/gemv_store.cuh — the one epilogue of every GEMV kernel: a finished output row's sums written out (the SwiGLU pair, or bias and the residual add). */
#ifndef INFERD_BACKEND_CUDA_GEMV_STORE_CUH
#define INFERD_BACKEND_CUDA_GEMV_STORE_CUH

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/warp.cuh"

/* Output row lr of matrix m for token rows t0 .. t0 + nt (nt <= TT), acc
 * holding each matrix's sum per token row: with NP 2 (a SwiGLU pair, gate
 * and up) y0 = silu(g) * u and y1 = u; else y = sum + bias, and res += y
 * when the launch folds the residual add in. */
template <int NP, int TT>
static __device__ __forceinline__ void gemv_store_row(const struct cu_gemv_args &a, int m,
                                                      int64_t lr, int t0, int nt,
                                                      const float (&acc)[NP][TT])
{
    if (NP == 2) {
        const int64_t rows = a.m[0].rows;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t < nt) {
                const float g = acc[0][t], u = acc[NP - 1][t];
                const int64_t idx = (int64_t)(t0 + t) * rows + lr;
                a.m[0].y[idx] = g / (1.0f + expf(-g)) * u;
                a.m[NP - 1].y[idx] = u;
            }
        }
        return;
    }
    const int64_t rows = a.m[m].rows;
    const float bias = a.m[m].bias ? a.m[m].bias[lr] : 0.0f;
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (t < nt) {
            const float v = acc[0][t] + bias;
            const int64_t idx = (int64_t)(t0 + t) * rows + lr;
            a.m[m].y[idx] = v;
            if (a.res)
                a.res[idx] += v;
        }
    }
}

/* Every accumulator 0. */
template <int NP, int TT>
static __device__ __forceinline__ void gemv_zero_acc(float (&acc)[NP][TT])
{
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[p][t] = 0.0f;
}

/* A warp's row done: its lanes' partial sums reduced (warp_sum), lane 0
 * storing the row, and the accumulators zeroed for the warp's next row. */
template <int NP, int TT>
static __device__ __forceinline__ void gemv_finish_row(const struct cu_gemv_args &a, int m,
                                                       int64_t lr, int nt, float (&acc)[NP][TT])
{
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[p][t] = warp_sum(acc[p][t]);
    if ((threadIdx.x & 31) == 0)
        gemv_store_row<NP, TT>(a, m, lr, 0, nt, acc);
    gemv_zero_acc(acc);
}

#endif
