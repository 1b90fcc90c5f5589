/* backend/cuda/kv_rotate.cuh — TurboQuant's rotation of a quantized KV cache (backend/kv_quant.h) as the CUDA kernels apply it to one vector in shared memory: the records' writer and the attention kernels that rotate each query once and each output back once. */
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

#endif
