/* backend/cuda/wgmma.cuh — Hopper warp-group tensor-core products (wgmma, sm_90a): shared-memory matrix descriptors for 128-byte swizzled tiles, the m64nNk16 fp16 products with f32 accumulators, and the fences and groups that order them. */
#ifndef INFERD_BACKEND_CUDA_WGMMA_CUH
#define INFERD_BACKEND_CUDA_WGMMA_CUH

#include <stdint.h>

/* A warp group is four consecutive warps (128 threads, the first warp's
 * index a multiple of four); a wgmma is issued by all of them together and
 * runs asynchronously: wgmma_fence() before the first product that reads or
 * writes registers the threads touched since, wgmma_commit() closes a group
 * of products, wgmma_wait<N>() returns once at most N groups are in flight.
 *
 * Accumulators of m64nNk16 (d[N / 8][4]): warp w of the group holds rows
 * 16 w .. 16 w + 15 exactly as an mma.sync m16n8 C fragment per n8 tile: lane
 * (g = lane / 4, t = lane % 4) has d[n][0..1] at row g, columns 8 n + 2 t and
 * + 1, d[n][2..3] at row g + 8. A from registers is the mma.sync m16n8k16 A
 * fragment of the warp's 16 rows.
 *
 * Operands in shared memory are tiles of rows of 64 halves (128 bytes), the
 * 16-byte chunks of row r stored at chunk ^ (r % 8) (128-byte swizzle; the
 * tile 1024-byte aligned). A matrix 128 halves wide along K (or N) is two
 * such tiles, halves 0..63 then 64..127. K-major (B = K: each row one
 * n, its K halves along it): SBO = 1024 bytes from one 8-row group to
 * the next, a k16 step 32 bytes further along the row. N-major (B = V: each
 * row one k, its N halves along it): SBO = 1024 bytes per 8 k rows, LBO = the
 * distance from the tile of N halves 0..63 to that of 64..127. */

/* The descriptor of a 128-byte swizzled operand at shared address addr. */
static __device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}

/* Byte offset of (row, 16-byte chunk) in a 128-byte swizzled tile. */
static __device__ __forceinline__ uint32_t wgmma_swz(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

static __device__ __forceinline__ void wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Shared-memory writes of the generic proxy (st.shared, cp.async) made
 * visible to the wgmma reads after the next barrier (sm_90 and up; code
 * compiled for older GPUs has no wgmma to order). */
static __device__ __forceinline__ void fence_proxy_async_smem(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Keeps the compiler from moving accesses of accumulator registers across a
 * wgmma_wait (the products write them behind its back). */
template <int NT>
static __device__ __forceinline__ void wgmma_hold(float (&d)[NT][4])
{
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            asm volatile("" : "+f"(d[n][j])::"memory");
}

#define WG_D4(d, n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define WG_D32(d, n)                                                                           \
    WG_D4(d, (n) + 0), WG_D4(d, (n) + 1), WG_D4(d, (n) + 2), WG_D4(d, (n) + 3),                \
        WG_D4(d, (n) + 4), WG_D4(d, (n) + 5), WG_D4(d, (n) + 6), WG_D4(d, (n) + 7)
#define WG_ACC32                                                                               \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_ACC64                                                                               \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "    \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "    \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* d (+)= a b, m64nNk16 with a in registers and b in shared memory, K-major;
 * scale_d 0 overwrites d, 1 accumulates. */
template <int N>
static __device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                                uint64_t db, int scale_d);

template <>
__device__ __forceinline__ void wgmma_rs<64>(float (&d)[8][4], const uint32_t (&a)[4],
                                             uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_ACC32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : WG_D32(d, 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_rs<128>(float (&d)[16][4], const uint32_t (&a)[4],
                                              uint64_t db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_ACC64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : WG_D32(d, 0), WG_D32(d, 8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

/* d += a b, m64nNk16 with a in registers and b in shared memory, N-major. */
template <int N>
static __device__ __forceinline__ void wgmma_rs_nmajor(float (&d)[N / 8][4],
                                                       const uint32_t (&a)[4], uint64_t db);

template <>
__device__ __forceinline__ void wgmma_rs_nmajor<64>(float (&d)[8][4], const uint32_t (&a)[4],
                                                    uint64_t db)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_ACC32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : WG_D32(d, 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

template <>
__device__ __forceinline__ void wgmma_rs_nmajor<128>(float (&d)[16][4], const uint32_t (&a)[4],
                                                     uint64_t db)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_ACC64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : WG_D32(d, 0), WG_D32(d, 8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

#undef WG_D4
#undef WG_D32
#undef WG_ACC32
#undef WG_ACC64

#endif
