/* backend/cuda/kv_rotate.cuh — TurboQuant's rotation of a quantized KV cache (backend/kv_quant.h) as the CUDA kernels apply it to one vector, in shared memory or in a warp's registers: the records' writer and the attention kernels that rotate each query once and each output back once. */
#ifndef INFERD_BACKEND_CUDA_KV_ROTATE_CUH
#define INFERD_BACKEND_CUDA_KV_ROTATE_CUH

#include <stdint.h>

#include "backend/kv_quant.h"

/* x (shared, n floats) = R x, or R^T x when inverse, by one warp:
 * kvq_rotate's and kvq_unrotate's operations, each butterfly of a stage on a
 * lane of its own, so the CPU's bits. */
static __device__ void warp_rotate(float *x, int n, uint64_t seed, int which, int layer,
                                   bool inverse)
{
    const int lane = threadIdx.x & 31;
    __syncwarp();
    if (!inverse) {
        for (int d = lane; d < n; d += 32)
            x[d] *= kvq_sign(seed, which, layer, d);
        __syncwarp();
    }
    for (int off = 0; off < n;) {
        int len = 1;
        while (len * 2 <= n - off)
            len *= 2;
        float *b = x + off;
        for (int lg = 0; 1 << lg < len; lg++) {
            const int h = 1 << lg;
            for (int p = lane; p < len / 2; p += 32) {
                int i = (p >> lg << (lg + 1)) | (p & (h - 1)); /* (p / h) 2 h + p % h */
                float a = b[i], c = b[i + h];
                b[i] = a + c;
                b[i + h] = a - c;
            }
            __syncwarp();
        }
        float norm = 1.0f / sqrtf((float)len);
        for (int i = lane; i < len; i += 32)
            b[i] *= norm;
        __syncwarp();
        off += len;
    }
    if (inverse) {
        for (int d = lane; d < n; d += 32)
            x[d] *= kvq_sign(seed, which, layer, d);
        __syncwarp();
    }
}

/* The rotation's signs of the E = HD / 32 elements a lane holds, bit e for
 * its element e: element E lane + e (consecutive) or lane + 32 e (STRIDED).
 * words[k]: kvq_sign_word(seed, which, layer, 64 k), the signs of elements
 * 64 k .. 64 k + 63 (a block computes them once for its warps). */
template <int HD, bool STRIDED>
static __device__ __forceinline__ uint32_t lane_signs(const uint64_t *words, int lane)
{
    constexpr int E = HD / 32;
    if constexpr (!STRIDED)
        return (uint32_t)(words[(E * lane) >> 6] >> ((E * lane) & 63)) & ((1u << E) - 1);
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < HD / 64; k++) { /* elements 64 k + lane and 64 k + 32 + lane */
        m |= (uint32_t)((words[k] >> lane) & 1) << (2 * k);
        m |= (uint32_t)((words[k] >> (lane + 32)) & 1) << (2 * k + 1);
    }
    return m;
}

/* warp_rotate(x, HD, seed, which, layer, inverse) on a vector held in
 * registers by a warp (HD a power of two), E = HD / 32 elements a lane:
 * element E lane + e in x[e], or lane + 32 e when STRIDED. The same
 * butterflies in the same order (a pair within a lane in its registers,
 * across lanes by shuffles), then the same scaling and signs, so the same
 * bits. signs: lane_signs of the rotation. */
template <int HD, bool STRIDED>
static __device__ __forceinline__ void warp_rotate_regs(float (&x)[HD / 32], uint32_t signs,
                                                        int lane, bool inverse)
{
    constexpr int E = HD / 32;
    if (!inverse)
#pragma unroll
        for (int e = 0; e < E; e++)
            x[e] *= ((signs >> e) & 1) ? -1.0f : 1.0f;
#pragma unroll
    for (int h = 1; h < HD; h *= 2) {
        /* the pair of element d is d ^ h: in the lane's registers or another lane's */
        const bool in_lane = STRIDED ? h >= 32 : h < E;
        if (in_lane) {
            const int r = STRIDED ? h / 32 : h;
#pragma unroll
            for (int e = 0; e < E; e++)
                if (!(e & r)) {
                    const float a = x[e], c = x[e + r];
                    x[e] = a + c;
                    x[e + r] = a - c;
                }
        } else {
            const int m = STRIDED ? h : h / E;
            const bool upper = lane & m;
#pragma unroll
            for (int e = 0; e < E; e++) {
                const float p = __shfl_xor_sync(0xffffffffu, x[e], m);
                x[e] = upper ? p - x[e] : x[e] + p;
            }
        }
    }
    const float norm = 1.0f / sqrtf((float)HD);
#pragma unroll
    for (int e = 0; e < E; e++) {
        x[e] *= norm;
        if (inverse)
            x[e] *= ((signs >> e) & 1) ? -1.0f : 1.0f;
    }
}

#endif
