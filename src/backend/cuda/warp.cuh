/* backend/cuda/warp.cuh — the warp-level pieces every CUDA kernel file shares: a butterfly sum over the 32 lanes, a 16-byte load that streams past L1, 16-byte asynchronous copies into shared memory, bf16 bits to and from f32. */
#ifndef INFERD_BACKEND_CUDA_WARP_CUH
#define INFERD_BACKEND_CUDA_WARP_CUH

#include <stdint.h>

static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Element p (0..7) of eight bf16 packed in 16 bytes, widened exactly. */
static __device__ __forceinline__ float bf16x8_at(uint4 q, int p)
{
    const uint32_t h = p < 2 ? q.x : p < 4 ? q.y : p < 6 ? q.z : q.w;
    return __uint_as_float(p & 1 ? h & 0xffff0000u : h << 16);
}

/* x rounded to bf16 (to nearest even; a NaN stays a quiet NaN): what cuBLASLt's GEMMs read. */
static __device__ __forceinline__ uint16_t f32_to_bf16_bits(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

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

/* 16 bytes global -> shared (dst: a shared-space address) without passing
 * through registers, zero-filled when !valid (src is then not read). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    cp_async16((uint32_t)__cvta_generic_to_shared(dst), src, valid);
}

/* Closes this thread's group of cp_async16 copies issued since the last one. */
static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most N of this thread's groups are still in flight. */
template <int N>
static __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Named barriers (ids 1..15; __syncthreads owns 0) for warps that hand
 * shared memory to each other: `threads` in all, a multiple of 32, arrive
 * at barrier id before it opens; bar_sync waits for it, bar_arrive does
 * not. The shared-memory writes before either are seen by the threads that
 * waited. A waiting warp issues nothing until the barrier opens. */
static __device__ __forceinline__ void bar_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

static __device__ __forceinline__ void bar_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* Thread-block clusters (compute capability 9.0; elsewhere these trap):
 * this block's rank in its cluster; the cluster's barrier, whose arrival
 * releases this thread's earlier writes (arrive, or relaxed: orders
 * nothing) and whose wait acquires the others' (wait), both at once
 * (sync); the shared-window address of a's place in block `rank`'s shared
 * memory (map). Every thread of every block of the cluster takes part in
 * the barrier. */
static __device__ __forceinline__ int cluster_rank(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
#else
    __trap();
    return 0;
#endif
}

static __device__ __forceinline__ void cluster_arrive(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void cluster_arrive_relaxed(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void cluster_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void cluster_sync(void)
{
    cluster_arrive();
    cluster_wait();
}

static __device__ __forceinline__ uint32_t cluster_map(uint32_t a, int rank)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
#else
    __trap();
    return 0;
#endif
}

/* Shared-memory barriers (mbarrier) that blocks of a cluster signal each
 * other through (compute capability 9.0): made for `count` arrivals a phase
 * (init, by one thread, then cluster_mbar_init_fence before the cluster's
 * barrier publishes it); an arrival from any block of the cluster at the
 * barrier at shared-window address a (cluster_map's), releasing this
 * thread's earlier writes to the cluster; the wait for phase `parity` to
 * complete at this block's barrier a, acquiring what the arrivals
 * released. */
static __device__ __forceinline__ void mbar_init(uint32_t a, int count)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void cluster_mbar_init_fence(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void mbar_arrive_cluster(uint32_t a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(a)
                 : "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void mbar_wait_cluster(uint32_t a, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "wait_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n"
                 "}\n" ::"r"(a),
                 "r"(parity)
                 : "memory");
#else
    __trap();
#endif
}

/* An arrival at this block's barrier a that also expects `bytes` more of
 * asynchronous copies (bulk_copy_to_cluster's) in the phase. */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t a, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}

/* An arrival at this block's barrier a, releasing this thread's earlier
 * accesses to the block. */
static __device__ __forceinline__ void mbar_arrive(uint32_t a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
#else
    __trap();
#endif
}

/* An L2 eviction policy for tma_load_2d: for data every block reads again
 * (`keep`: evicted last) or data read once (evicted first). */
static __device__ __forceinline__ uint64_t l2_policy(bool keep)
{
    uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (keep)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

/* The box of a 2-D tensor map (map: the address of a __grid_constant__
 * kernel parameter) at coordinates (c0 innermost, c1) copied by the copy
 * engine into this block's shared memory at dst (laid out and swizzled as the
 * map says), counted at this block's barrier bar as it lands (the whole box,
 * elements past the tensor's end filled in); L2 keeps it by `policy`. */
static __device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, int c0, int c1,
                                                   uint32_t bar, uint64_t policy)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
                 : "memory");
#else
    __trap();
#endif
}

/* `bytes` (a multiple of 16, both addresses 16-byte aligned) of this block's
 * shared memory at src copied by the copy engine to dst in another block of
 * the cluster (cluster_map's address), counted at that block's barrier bar
 * (cluster_map's too) as they land; the copy reads src through the async
 * proxy, so src's writers fence first (fence_proxy_async_smem). Commit closes
 * this thread's copies issued since the last commit into a group; wait_all
 * returns once all of its groups are done. */
static __device__ __forceinline__ void bulk_copy_to_cluster(uint32_t dst, uint32_t src,
                                                            uint32_t bytes, uint32_t bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(dst),
                 "r"(src), "r"(bytes), "r"(bar)
                 : "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void bulk_commit(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void bulk_wait_all(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
    __trap();
#endif
}

/* A warp group's registers a thread moved to N (setmaxnreg: all four warps
 * of the group at once; sm_90a machine code only, elsewhere nothing). */
template <int N>
static __device__ __forceinline__ void regs_lower_to(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N>
static __device__ __forceinline__ void regs_raise_to(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* Whether `kernel` runs here as sm_90a machine code (its setmaxnreg and
 * wgmma in effect; elsewhere the PTX of an older target is compiled and
 * their bodies are empty): asked once, *cache keeps the answer (-1 before). */
template <typename K>
static bool kernel_runs_sm90a(K kernel, int *cache)
{
    if (*cache < 0) {
        cudaFuncAttributes a;
        *cache = cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.binaryVersion == 90;
    }
    return *cache == 1;
}

#endif
