/* backend/cuda/mma.cuh — tensor-core fragments the mma.sync kernels share: shared-memory addresses, ldmatrix loads, movmatrix transposes, m16n8k16 products in fp16 and bf16, bf16 packing. */
#ifndef INFERD_BACKEND_CUDA_MMA_CUH
#define INFERD_BACKEND_CUDA_MMA_CUH

#include <stdint.h>

/* Fragment roles in m16n8k16 for lane (g = lane / 4, t = lane % 4): the A
 * fragment holds rows g and g + 8 at columns {2t, 2t + 1, 2t + 8, 2t + 9},
 * the B fragment column g at the same rows of k, the C fragment rows g and
 * g + 8 at columns 2t and 2t + 1. ldmatrix .x4 loads four 8x8 tiles of
 * 16-bit elements, lanes 8 i .. 8 i + 7 giving the row addresses of tile i. */

static __device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                               uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                     uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* The 8x8 matrix of 16-bit elements whose rows the warp holds as in an
 * ldmatrix fragment (lane i: row i / 4, columns 2 (i % 4) and 2 (i % 4) + 1),
 * transposed: lane i gets the same fragment of the transpose. */
static __device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x)
{
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* Two floats from shared memory at a shared-space address (8-byte aligned). */
static __device__ __forceinline__ void lds64(uint32_t addr, float2 &v)
{
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
}

/* c += a b: a 16x16 row-major fp16, b 16x8 column-major fp16, c 16x8 f32. */
static __device__ __forceinline__ void mma_16816(float *c, const uint32_t *a, uint32_t b0,
                                                 uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c += a b, m16n8k16: a 16x16 row-major bf16, b 16x8 column-major bf16, c f32. */
static __device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two floats rounded to bf16 (to nearest, ties to even), lo in the low half. */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

#endif
