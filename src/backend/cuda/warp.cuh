/* backend/cuda/warp.cuh — the warp-level pieces every CUDA kernel file shares: a butterfly sum over the 32 lanes, and a 16-byte load that streams past L1. */
#ifndef INFERD_BACKEND_CUDA_WARP_CUH
#define INFERD_BACKEND_CUDA_WARP_CUH

#include <stdint.h>

/* The sum of v over the warp's 32 lanes, the same bits in every lane (xor
 * butterfly: each lane adds the same pairs in the same order). */
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Weight rows stream past once: load them without keeping them in L1. */
static __device__ __forceinline__ uint4 load_stream(const uint4 *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

#endif
