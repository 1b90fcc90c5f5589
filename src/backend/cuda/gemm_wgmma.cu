/* backend/cuda/gemm_wgmma.cu — FAST-mode bf16 matmuls of 9 to 128 token rows (a batched decode step, a short prefill chunk) on Hopper's warp-group tensor cores, the weights streamed once through shared memory for all the rows.
 *
 * y (t x rows) = x (t x k) w^T, x already in bf16 (the GEMM path's x,
 * fuse.h rule 6), the products as cuBLASLt's GEMM leaves them: y in f32 or
 * bf16, or added into an f32 accumulator (the residual stream).
 *
 * The weights are wgmma's A operand and the tokens its B ("swap AB"): a
 * block takes a tile of WG_BM = 128 weight rows and all t token rows padded
 * to NT (n32, n48, n64, n96 or n128). Both operands walk K in stages of 64
 * columns, one 128-byte swizzled line of every row (wgmma.cuh's layout), brought by
 * the copy engine (TMA: one tensor map a matrix and one for x, rows and
 * columns past the ends read as zeros) into a ring of STAGES slots. One
 * thread of a third warp group issues the copies (the group keeps few
 * registers, giving the rest to the other two); the block's two groups, 64
 * weight rows each, multiply: a full barrier a slot says its stage landed,
 * an empty barrier (a warp of each group arrives) that the products reading
 * it are done and the slot may be filled again. Each stage is four
 * m64nNTk16 products a group, issued asynchronously, one stage's in flight
 * while the next is issued.
 *
 * Off by default until the whole CUDA suite has run with it on: on an H100
 * it gains 5% on cuBLASLt at 16 rows, matches it at 96 and trails by 2% at
 * 64 (bench/RESULTS.md). Tiles of 256 weight rows, all threads copying with
 * cp.async, the weights prefetched into L2 a ring ahead, and x shared by the
 * two blocks of a cluster each measured slower.
 *
 * Split-K: where the tiles leave SMs idle, a tile's stages are cut into
 * `splits` ranges, one block each (one block an SM: the ring takes ~200 KB);
 * each block leaves its partial tile in the workspace, and the tile's last
 * block (a counter per tile, reset by that block) adds the partials in split
 * order and writes y, so the bits depend on the shapes and the device only.
 *
 * Needs sm_90a machine code and the driver's tensor-map encoder; elsewhere
 * cu_gemm_wgmma_runs says no and the caller keeps cuBLASLt. */
#include <cuda.h>
#include <cudaTypedefs.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/warp.cuh"
#include "backend/cuda/wgmma.cuh"

#define WG_CONSUMERS 256                 /* two warp groups multiply */
#define WG_THREADS (WG_CONSUMERS + 128) /* and one thread of a third loads */
/* registers a thread: the loading group gives its share to the multiplying ones */
#define WG_LOADER_REGS 56
#define WG_CONSUMER_REGS 224
#define WG_BK 64                        /* columns of a stage: one 128-byte line a row */
/* stages a split holds at least */
#define WG_MIN_SPLIT_STAGES 4
#define WG_BM 128                       /* weight rows of a tile: 64 a multiplying group */

template <int NT>
struct wg_shape {
    static constexpr int W_BYTES = WG_BM * WG_BK * 2;
    static constexpr int X_BYTES = NT * WG_BK * 2;
    static constexpr int STAGE_BYTES = W_BYTES + X_BYTES;
    /* as many slots as fit 200 KB; their full and empty barriers after them */
    static constexpr int STAGES = (200 * 1024) / STAGE_BYTES;
    static constexpr size_t SMEM = 1024 + (size_t)STAGES * (STAGE_BYTES + 16);
    static constexpr int ACC = NT / 2; /* accumulators a thread */
    static_assert(STAGES >= 4, "a ring of at least four stages");
};

/* The tensor maps of a launch: each matrix's, and x's. */
struct wg_maps {
    CUtensorMap w[CU_WGMMA_GEMM_MAX_MATS];
    CUtensorMap x;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* d (+)= a b, m64nNk16, a and b bf16 in shared memory, both K-major; scale_d 0
 * overwrites d, 1 accumulates. */
template <int N>
static __device__ __forceinline__ void wgmma_ss_bf16(float (&d)[N / 8][4], uint64_t da,
                                                     uint64_t db, int scale_d);

#define WS_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define WS_D8(n)                                                                               \
    WS_D4((n) + 0), WS_D4((n) + 1), WS_D4((n) + 2), WS_D4((n) + 3), WS_D4((n) + 4),             \
        WS_D4((n) + 5), WS_D4((n) + 6), WS_D4((n) + 7)

template <>
__device__ __forceinline__ void wgmma_ss_bf16<32>(float (&d)[4][4], uint64_t da, uint64_t db,
                                                      int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 0, 0;\n}\n"
                 : WS_D4(0), WS_D4(1), WS_D4(2), WS_D4(3)
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_ss_bf16<64>(float (&d)[8][4], uint64_t da, uint64_t db,
                                                      int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                 "%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WS_D8(0)
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_ss_bf16<48>(float (&d)[6][4], uint64_t da, uint64_t db,
                                                      int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, 0, 0;\n}\n"
                 : WS_D4(0), WS_D4(1), WS_D4(2), WS_D4(3), WS_D4(4), WS_D4(5)
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_ss_bf16<96>(float (&d)[12][4], uint64_t da, uint64_t db,
                                                      int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
                 "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
                 "%44, %45, %46, %47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
                 : WS_D8(0), WS_D4(8), WS_D4(9), WS_D4(10), WS_D4(11)
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_ss_bf16<128>(float (&d)[16][4], uint64_t da, uint64_t db,
                                                      int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
                 "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
                 "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                 "%61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WS_D8(0), WS_D8(8)
                 : "l"(da), "l"(db), "r"(scale_d));
}

#undef WS_D4
#undef WS_D8
#endif

/* Tiles of the launch: each matrix's rows in WG_BM-row tiles, one after the other. */
static int64_t wg_tiles(const struct cu_wg_gemm *g)
{
    return cu_row_tiles(g->m, g->n_mat, WG_BM);
}

static int wg_splits(int64_t n_tiles, int64_t k, int n_sm)
{
    return cu_split_k(n_tiles, (k + WG_BK - 1) / WG_BK, n_sm, WG_MIN_SPLIT_STAGES);
}

static size_t wg_counter_bytes(int64_t n_tiles)
{
    return ((size_t)n_tiles * sizeof(unsigned) + 255) / 256 * 256;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The warp group's products of the stage in the slot at `slot` (its 64 weight
 * rows, then x), closed as a group; the first overwrites d unless
 * `accumulate`. d is written by the products alone: anything else that wrote
 * it while products were in flight would make the compiler wait for them. */
template <int NT>
static __device__ __forceinline__ void wg_products(float (&d)[NT / 8][4], uint32_t slot, int group,
                                                   bool accumulate)
{
    const uint32_t wa = slot + (uint32_t)group * 8192u;
    const uint32_t xa = slot + (uint32_t)wg_shape<NT>::W_BYTES;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; kk++)
        wgmma_ss_bf16<NT>(d, wgmma_desc(wa + 32u * kk, 16, 1024),
                          wgmma_desc(xa + 32u * kk, 16, 1024), kk > 0 || accumulate);
    wgmma_commit();
}

/* Which matrix tile `tile` of the launch lies in, and its first row there. */
static __device__ __forceinline__ int wg_tile_matrix(const struct cu_wg_gemm &g, int tile, int *row0)
{
    int m = 0;
    while (m + 1 < g.n_mat && tile >= (int)((g.m[m].rows + WG_BM - 1) / WG_BM)) {
        tile -= (int)((g.m[m].rows + WG_BM - 1) / WG_BM);
        m++;
    }
    *row0 = tile * WG_BM;
    return m;
}

/* Where accumulator (n, e) of a multiplying thread lies in a partial tile. */
static __device__ __forceinline__ int wg_part_at(int n, int e)
{
    return (4 * n + e) * WG_CONSUMERS + (int)threadIdx.x;
}

/* A multiplying thread's accumulators into a partial tile of the workspace. */
template <int NT>
static __device__ __forceinline__ void wg_partial_store(float *p, const float (&d)[NT / 8][4])
{
#pragma unroll
    for (int n = 0; n < NT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            __stcg(&p[wg_part_at(n, e)], d[n][e]);
}

/* A multiplying thread's outputs: d[n][e] is weight row 64 group + 16 warp +
 * lane / 4 (+ 8 for e >= 2), token 8 n + 2 (lane % 4) + (e & 1). From d
 * (parts 0), or the sum of the n_parts partial tiles at part(0), part(1), ...
 * in that order (into d). Each partial's loads, and the residual's, go out
 * together before anything is written: a store may alias any later load, so
 * loads between the stores would each wait for their round trip (at 128 rows
 * that made a split launch take 3x its weights' read). */
template <int NT, typename Part>
static __device__ __forceinline__ void wg_store(const struct cu_wg_gemm &g, int m, int row0,
                                                float (&d)[NT / 8][4], int n_parts, Part part)
{
    const int tid = threadIdx.x, lane = tid & 31, rows = (int)g.m[m].rows;
    const int r_base = row0 + 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);
    const int t_base = 2 * (lane & 3);
    auto idx_of = [&](int n, int e) -> int64_t {
        const int row = r_base + 8 * (e >> 1), tok = 8 * n + t_base + (e & 1);
        return row < rows && tok < g.t ? (int64_t)tok * rows + row : -1;
    };
    for (int p = 0; p < n_parts; p++)
#pragma unroll
        for (int n = 0; n < NT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float v = __ldcg(part(p) + wg_part_at(n, e));
                d[n][e] = p > 0 ? d[n][e] + v : v;
            }
    float old[NT / 8][4];
    if (g.acc)
#pragma unroll
        for (int n = 0; n < NT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t idx = idx_of(n, e);
                old[n][e] = idx >= 0 ? g.acc[idx] : 0.0f;
            }
#pragma unroll
    for (int n = 0; n < NT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t idx = idx_of(n, e);
            if (idx < 0)
                continue;
            if (g.acc)
                g.acc[idx] = old[n][e] + d[n][e];
            else if (g.y_bf16)
                ((uint16_t *)g.m[m].y)[idx] = f32_to_bf16_bits(d[n][e]);
            else
                ((float *)g.m[m].y)[idx] = d[n][e];
        }
}

/* The loading thread: stage i of the split into slot i % STAGES once the
 * products of stage i - STAGES are done with it. The first slots' weights go
 * out before the launch before has finished, their x once it has. */
template <int NT>
static __device__ __forceinline__ void wg_load(const struct wg_maps &maps, int m, int row0,
                                               int s_begin, int n, uint32_t base, uint32_t full,
                                               uint32_t empty)
{
    using S = wg_shape<NT>;
    const uint64_t stream = l2_policy(false), keep = l2_policy(true);
    const void *wmap = &maps.w[m], *xmap = &maps.x;
    auto slot_of = [&](int i) { return base + (uint32_t)(i % S::STAGES) * S::STAGE_BYTES; };
    auto bar_of = [&](uint32_t b, int i) { return b + 8u * (uint32_t)(i % S::STAGES); };
    const int first = min(n, S::STAGES);
    for (int i = 0; i < first; i++) {
        mbar_arrive_expect_tx(bar_of(full, i), S::STAGE_BYTES);
        tma_load_2d(slot_of(i), wmap, (s_begin + i) * WG_BK, row0, bar_of(full, i), stream);
    }
    pdl_release();
    pdl_wait();
    for (int i = 0; i < first; i++)
        tma_load_2d(slot_of(i) + S::W_BYTES, xmap, (s_begin + i) * WG_BK, 0, bar_of(full, i),
                    keep);
    for (int i = S::STAGES; i < n; i++) {
        mbar_wait_cluster(bar_of(empty, i), (uint32_t)(i / S::STAGES - 1) & 1u);
        mbar_arrive_expect_tx(bar_of(full, i), S::STAGE_BYTES);
        tma_load_2d(slot_of(i), wmap, (s_begin + i) * WG_BK, row0, bar_of(full, i), stream);
        tma_load_2d(slot_of(i) + S::W_BYTES, xmap, (s_begin + i) * WG_BK, 0, bar_of(full, i),
                    keep);
    }
}
#endif

/* Block tile * splits + split takes the split's range of the tile's stages:
 * the last warp group's first thread loads them (wg_load), the two warp
 * groups multiply each as it lands and release its slot once their products
 * of it are done. */
template <int NT>
static __global__ void __launch_bounds__(WG_THREADS, 1)
gemm_wgmma_kernel(const __grid_constant__ struct wg_maps maps, struct cu_wg_gemm g, int splits,
                  unsigned *counters, float *partials)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = wg_shape<NT>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t full = base + (uint32_t)(S::STAGES * S::STAGE_BYTES);
    const uint32_t empty = full + 8u * S::STAGES;
    const int tid = threadIdx.x;
    const int tile = blockIdx.x / splits, split = blockIdx.x % splits;
    int row0;
    const int m = wg_tile_matrix(g, tile, &row0);
    const int nstage = (g.k + WG_BK - 1) / WG_BK;
    const int per = (nstage + splits - 1) / splits;
    const int s_begin = min(nstage, split * per), n = min(nstage, s_begin + per) - s_begin;

    if (tid == 0) {
        for (int i = 0; i < S::STAGES; i++) {
            mbar_init(full + 8u * i, 1);
            mbar_init(empty + 8u * i, WG_CONSUMERS / 32);
        }
        cluster_mbar_init_fence();
    }
    __syncthreads();

    if (tid >= WG_CONSUMERS) {
        /* the loading group leaves once its copies are out (the barriers after
         * this are the multiplying groups' alone) */
        regs_lower_to<WG_LOADER_REGS>();
        if (tid == WG_CONSUMERS)
            wg_load<NT>(maps, m, row0, s_begin, n, base, full, empty);
        pdl_release();
        return;
    }
    regs_raise_to<WG_CONSUMER_REGS>();
    pdl_release();
    pdl_wait(); /* y and acc may be the launch before's */
    float d[NT / 8][4];
#pragma unroll
    for (int c = 0; c < NT / 8; c++) /* what a split without stages leaves */
        d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.0f;
    for (int i = 0; i < n; i++) {
        mbar_wait_cluster(full + 8u * (uint32_t)(i % S::STAGES), (uint32_t)(i / S::STAGES) & 1u);
        wg_products<NT>(d, base + (uint32_t)(i % S::STAGES) * S::STAGE_BYTES, tid >> 7, i > 0);
        wgmma_wait<1>(); /* the stage before's products: its slot may be filled again */
        if (i > 0 && (tid & 31) == 0)
            mbar_arrive(empty + 8u * (uint32_t)((i - 1) % S::STAGES));
    }
    wgmma_wait<0>();
    wgmma_hold(d);

    auto part = [&](int p) {
        return (const float *)partials + ((size_t)tile * splits + p) * WG_CONSUMERS * S::ACC;
    };
    if (splits > 1) {
        /* this split's partial, then the tile's last block adds them all in split order */
        wg_partial_store<NT>(partials + (size_t)blockIdx.x * WG_CONSUMERS * S::ACC, d);
        if (!block_arrives_last(&counters[tile], (unsigned)splits, WG_CONSUMERS))
            return;
    }
    wg_store<NT>(g, m, row0, d, splits > 1 ? splits : 0, part);
#endif
}

/* The driver's tensor-map encoder (NULL where the driver has none). */
static PFN_cuTensorMapEncodeTiled_v12000 wg_encoder(void)
{
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            fn = NULL;
        return (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }();
    return encode;
}

/* The map of a row-major bf16 matrix of rows x k read in boxes of WG_BK
 * columns (128 bytes) by box_rows rows, 128-byte swizzled; rows and columns
 * past its end read as zeros. */
static bool wg_map(CUtensorMap *map, const void *p, int64_t rows, int64_t k, int box_rows)
{
    const PFN_cuTensorMapEncodeTiled_v12000 encode = wg_encoder();
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {WG_BK, (cuuint32_t)box_rows}, step[2] = {1, 1};
    return encode &&
           encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, step,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool cu_gemm_wgmma_takes(int64_t t, int64_t k)
{
    return t > CU_SKINNY_MAX_ROWS && t <= CU_WGMMA_GEMM_MAX_ROWS && k >= WG_BK && k % 8 == 0 &&
           k <= INT32_MAX;
}

bool cu_gemm_wgmma_runs(const struct cu_device *dev)
{
    static int native = -1;
    return wg_shape<32>::SMEM <= (size_t)dev->smem_optin &&
           wg_shape<48>::SMEM <= (size_t)dev->smem_optin &&
           wg_shape<64>::SMEM <= (size_t)dev->smem_optin &&
           wg_shape<96>::SMEM <= (size_t)dev->smem_optin &&
           wg_shape<128>::SMEM <= (size_t)dev->smem_optin && wg_encoder() != NULL &&
           kernel_runs_sm90a(gemm_wgmma_kernel<128>, &native);
}

size_t cu_gemm_wgmma_work_bytes(const struct cu_device *dev)
{
    /* with more than one split at most n_sm blocks, so at most n_sm tiles */
    return wg_counter_bytes(dev->n_sm) +
           (size_t)dev->n_sm * WG_CONSUMERS * wg_shape<128>::ACC * sizeof(float);
}

template <int NT>
static cudaError_t launch_nt(struct cu_device *dev, cudaStream_t s, const struct cu_wg_gemm *g,
                             int64_t n_tiles)
{
    using S = wg_shape<NT>;
    static int native = -1;
    if (S::SMEM > (size_t)dev->smem_optin || !kernel_runs_sm90a(gemm_wgmma_kernel<NT>, &native))
        return cudaErrorNotSupported;
    struct wg_maps maps;
    memset(&maps, 0, sizeof maps);
    for (int i = 0; i < g->n_mat; i++)
        if (!wg_map(&maps.w[i], g->m[i].w, g->m[i].rows, g->k, WG_BM))
            return cudaErrorNotSupported;
    if (!wg_map(&maps.x, g->x, g->t, g->k, NT))
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(gemm_wgmma_kernel<NT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::SMEM);
    if (e != cudaSuccess)
        return e;
    const int splits = wg_splits(n_tiles, g->k, dev->n_sm);
    if (splits > 1 && n_tiles * splits > dev->n_sm)
        return cudaErrorInvalidValue;
    unsigned *counters = (unsigned *)g->work;
    float *partials = (float *)((uint8_t *)g->work + wg_counter_bytes(dev->n_sm));
    return cu_launch_dependent(dev->pdl, gemm_wgmma_kernel<NT>, dim3((unsigned)(n_tiles * splits)),
                               dim3(WG_THREADS), S::SMEM, s, maps, *g, splits, counters, partials);
}

cudaError_t cu_launch_gemm_wgmma(struct cu_device *dev, cudaStream_t s, const struct cu_wg_gemm *g)
{
    if (g->t == 0)
        return cudaSuccess;
    if (!cu_gemm_wgmma_takes(g->t, g->k) || g->n_mat < 1 || g->n_mat > CU_WGMMA_GEMM_MAX_MATS ||
        ((uintptr_t)g->x % 16) != 0 || (g->acc && g->n_mat != 1) ||
        cu_gemm_wgmma_work_bytes(dev) > g->work_bytes)
        return cudaErrorInvalidValue;
    for (int i = 0; i < g->n_mat; i++)
        if ((uintptr_t)g->m[i].w % 16 != 0 || g->m[i].rows < 1)
            return cudaErrorInvalidValue;
    const int64_t n_tiles = wg_tiles(g);
    if (n_tiles * ((g->k + WG_BK - 1) / WG_BK) >= INT32_MAX)
        return cudaErrorInvalidValue;
    if (g->t <= 32)
        return launch_nt<32>(dev, s, g, n_tiles);
    if (g->t <= 48)
        return launch_nt<48>(dev, s, g, n_tiles);
    if (g->t <= 64)
        return launch_nt<64>(dev, s, g, n_tiles);
    if (g->t <= 96)
        return launch_nt<96>(dev, s, g, n_tiles);
    return launch_nt<128>(dev, s, g, n_tiles);
}
