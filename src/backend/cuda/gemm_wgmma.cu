/* backend/cuda/gemm_wgmma.cu — FAST-mode bf16 matmuls of 9 to 128 token rows (a batched decode step, a short prefill chunk) on Hopper's warp-group tensor cores, the weights streamed once through shared memory for all the rows.
 *
 * y (t x rows) = x (t x k) w^T, x already in bf16 (the GEMM path's x,
 * fuse.h rule 6), the products as cuBLASLt's GEMM leaves them: y in f32 or
 * bf16, or added into an f32 accumulator (the residual stream).
 *
 * The weights are wgmma's A operand and the tokens its B ("swap AB"): a
 * block of two warp groups takes a tile of WG_BM = 128 weight rows, each
 * group 64 of them (m64), and all t token rows padded to NT (n32, n64 or
 * n128). Both operands walk K in stages of 64 columns, one 128-byte swizzled
 * line of every row (wgmma.cuh's layout), copied with cp.async by all 256
 * threads into a ring of STAGES slots; STAGES - 2 stages are in flight while
 * one is multiplied and the one before it may still be read by the products
 * issued last. Each stage is four m64nNTk16 products a group, issued
 * asynchronously.
 *
 * Off by default: on an H100 this form streams the weights at about a third
 * of the card's bandwidth and loses to cuBLASLt at every row count measured,
 * and a form with one producer warp and mbarriers lost more
 * (bench/RESULTS.md).
 *
 * Split-K: where the tiles leave SMs idle, a tile's stages are cut into
 * `splits` ranges, one block each (one block an SM: the ring takes ~200 KB);
 * each block leaves its partial tile in the workspace, and the tile's last
 * block (a counter per tile, reset by that block) adds the partials in split
 * order and writes y, so the bits depend on the shapes and the device only.
 *
 * Needs sm_90a machine code; elsewhere the launch reports
 * cudaErrorNotSupported and the caller keeps cuBLASLt. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/warp.cuh"
#include "backend/cuda/wgmma.cuh"

#define WG_THREADS 256
#define WG_BM 128 /* weight rows of a tile: two warp groups of 64 */
#define WG_BK 64  /* columns of a stage: one 128-byte line a row */
#define WG_W_BYTES (WG_BM * WG_BK * 2)
/* stages a split holds at least */
#define WG_MIN_SPLIT_STAGES 4

template <int NT>
struct wg_shape {
    static constexpr int X_BYTES = NT * WG_BK * 2;
    static constexpr int STAGE_BYTES = WG_W_BYTES + X_BYTES;
    /* as many slots as fit 200 KB */
    static constexpr int STAGES = (200 * 1024) / STAGE_BYTES;
    static constexpr size_t SMEM = 1024 + (size_t)STAGES * STAGE_BYTES;
    static constexpr int ACC = NT / 2; /* accumulators a thread */
    static_assert(STAGES >= 4, "a ring of at least four stages");
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
/* Copies of a stage into the slot at `slot`: 16-byte chunk (c % 8) of row c / 8
 * for c = cid, cid + 8 * row_step, ... (cid < 8 * row_step). Weight rows past
 * the matrix read its last row (their outputs are not written), token rows
 * past t and columns past k are zero-filled. */
static __device__ __forceinline__ void wg_copy_w(uint32_t slot, const uint16_t *w, int rows,
                                                 int row0, int k, int st, int cid, int row_step)
{
    const int chunk = cid & 7, crow = cid >> 3, col = st * WG_BK + 8 * chunk;
    const bool in = col < k;
#pragma unroll 4
    for (int r = crow; r < WG_BM; r += row_step) {
        const uint16_t *src = w + (int64_t)min(row0 + r, rows - 1) * k + col;
        cp_async16(slot + (uint32_t)(r >> 6) * 8192u + wgmma_swz(r & 63, chunk),
                   in ? (const void *)src : (const void *)w, in);
    }
}

template <int NT>
static __device__ __forceinline__ void wg_copy_x(uint32_t slot, const uint16_t *x, int nt, int k,
                                                 int st, int cid, int row_step)
{
    const int chunk = cid & 7, crow = cid >> 3, col = st * WG_BK + 8 * chunk;
#pragma unroll 4
    for (int r = crow; r < NT; r += row_step) {
        const bool in = r < nt && col < k;
        cp_async16(slot + WG_W_BYTES + wgmma_swz(r, chunk),
                   in ? (const void *)(x + (int64_t)r * k + col) : (const void *)x, in);
    }
}

/* The warp group's products of the stage in the slot at `slot`, closed as a group;
 * the first overwrites d unless `accumulate`. d is written by the products alone:
 * anything else that wrote it while products were in flight would make the
 * compiler wait for them. */
template <int NT>
static __device__ __forceinline__ void wg_products(float (&d)[NT / 8][4], uint32_t slot, int group,
                                                   bool accumulate)
{
    const uint32_t wa = slot + (uint32_t)group * 8192u, xa = slot + WG_W_BYTES;
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

/* A thread's accumulators into (or, add, out of) a partial tile of the workspace. */
template <int NT>
static __device__ __forceinline__ void wg_partial_store(float *p, const float (&d)[NT / 8][4])
{
#pragma unroll
    for (int n = 0; n < NT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            __stcg(&p[(4 * n + e) * WG_THREADS + threadIdx.x], d[n][e]);
}

/* The tile's outputs: d[n][e] is weight row 64 group + 16 warp + lane / 4 (+ 8
 * for e >= 2), token 8 n + 2 (lane % 4) + (e & 1). From d (parts 0), or the
 * sum of the n_parts partial tiles at part(0), part(1), ... in that order. */
template <int NT, typename Part>
static __device__ __forceinline__ void wg_store(const struct cu_wg_gemm &g, int m, int row0,
                                                const float (&d)[NT / 8][4], int n_parts,
                                                Part part)
{
    const int tid = threadIdx.x, lane = tid & 31, rows = (int)g.m[m].rows;
    const int r_base = row0 + 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);
    const int t_base = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < NT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r_base + 8 * (e >> 1), tok = 8 * n + t_base + (e & 1);
            if (row >= rows || tok >= g.t)
                continue;
            float v = d[n][e];
            if (n_parts > 0) {
                const int at = (4 * n + e) * WG_THREADS + tid;
                v = __ldcg(part(0) + at);
                for (int p = 1; p < n_parts; p++)
                    v += __ldcg(part(p) + at);
            }
            const int64_t idx = (int64_t)tok * rows + row;
            if (g.acc)
                g.acc[idx] += v;
            else if (g.y_bf16)
                ((uint16_t *)g.m[m].y)[idx] = f32_to_bf16_bits(v);
            else
                ((float *)g.m[m].y)[idx] = v;
        }
}
#endif

/* Block tile * splits + split takes the split's range of the tile's stages.
 * Every thread copies its share of a stage; after its own copies of the stage
 * have landed it fences them for the products' reads (the async proxy) and
 * meets the others at the block's barrier, which also says both groups are
 * done with the slot the next copies go to (the products of two stages back:
 * each group waits for all but its last stage's). */
template <int NT>
static __global__ void __launch_bounds__(WG_THREADS, 1)
gemm_wgmma_kernel(struct cu_wg_gemm g, int splits, unsigned *counters, float *partials)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = wg_shape<NT>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const int tid = threadIdx.x, k = g.k;
    const int tile = blockIdx.x / splits, split = blockIdx.x % splits;
    int row0;
    const int m = wg_tile_matrix(g, tile, &row0), rows = (int)g.m[m].rows;
    const uint16_t *w = (const uint16_t *)g.m[m].w;
    const int nstage = (k + WG_BK - 1) / WG_BK;
    const int per = (nstage + splits - 1) / splits;
    const int s_begin = min(nstage, split * per), s_end = min(nstage, s_begin + per);
    auto slot_of = [&](int st) { return base + (uint32_t)(st % S::STAGES) * S::STAGE_BYTES; };
    auto issue_x = [&](int st) {
        if (st < s_end)
            wg_copy_x<NT>(slot_of(st), g.x, g.t, k, st, tid, WG_THREADS / 8);
        cp_async_commit();
    };

    float d[NT / 8][4];
#pragma unroll
    for (int n = 0; n < NT / 8; n++) /* what a split without stages leaves */
        d[n][0] = d[n][1] = d[n][2] = d[n][3] = 0.0f;

    /* the first stages' weights go out before the launch before has finished
     * (in the first stage's copy group), x once it has */
    for (int i = 0; i < S::STAGES - 2; i++)
        if (s_begin + i < s_end)
            wg_copy_w(slot_of(s_begin + i), w, rows, row0, k, s_begin + i, tid, WG_THREADS / 8);
    pdl_release();
    pdl_wait();
    for (int i = 0; i < S::STAGES - 2; i++)
        issue_x(s_begin + i);
    for (int st = s_begin; st < s_end; st++) {
        cp_async_wait<S::STAGES - 3>();
        fence_proxy_async_smem();
        __syncthreads(); /* stage st landed; every group is done with st - 2's slot */
        const int next = st + S::STAGES - 2;
        if (next < s_end)
            wg_copy_w(slot_of(next), w, rows, row0, k, next, tid, WG_THREADS / 8);
        issue_x(next);
        wg_products<NT>(d, slot_of(st), tid >> 7, st > s_begin);
        wgmma_wait<1>(); /* the products before: their slot may be refilled */
    }
    wgmma_wait<0>();
    wgmma_hold(d);
    cp_async_wait<0>();

    auto part = [&](int p) {
        return (const float *)partials + ((size_t)tile * splits + p) * WG_THREADS * S::ACC;
    };
    if (splits > 1) {
        /* this split's partial, then the tile's last block adds them all in split order */
        wg_partial_store<NT>(partials + (size_t)blockIdx.x * WG_THREADS * S::ACC, d);
        if (!block_arrives_last(&counters[tile], (unsigned)splits))
            return;
    }
    wg_store<NT>(g, m, row0, d, splits > 1 ? splits : 0, part);
#endif
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
           wg_shape<64>::SMEM <= (size_t)dev->smem_optin &&
           wg_shape<128>::SMEM <= (size_t)dev->smem_optin &&
           kernel_runs_sm90a(gemm_wgmma_kernel<128>, &native);
}

size_t cu_gemm_wgmma_work_bytes(const struct cu_device *dev)
{
    /* with more than one split at most n_sm blocks, so at most n_sm tiles */
    return wg_counter_bytes(dev->n_sm) +
           (size_t)dev->n_sm * WG_THREADS * wg_shape<128>::ACC * sizeof(float);
}

template <int NT>
static cudaError_t launch_nt(struct cu_device *dev, cudaStream_t s, const struct cu_wg_gemm *g,
                             int64_t n_tiles, void *work)
{
    using S = wg_shape<NT>;
    static int native = -1;
    if (S::SMEM > (size_t)dev->smem_optin || !kernel_runs_sm90a(gemm_wgmma_kernel<NT>, &native))
        return cudaErrorNotSupported;
    cudaError_t e = cudaFuncSetAttribute(gemm_wgmma_kernel<NT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::SMEM);
    if (e != cudaSuccess)
        return e;
    int splits = wg_splits(n_tiles, g->k, dev->n_sm);
    if (splits > 1 && n_tiles * splits > dev->n_sm)
        return cudaErrorInvalidValue;
    unsigned *counters = (unsigned *)work;
    float *partials = (float *)((uint8_t *)work + wg_counter_bytes(dev->n_sm));
    return cu_launch_dependent(dev->pdl, gemm_wgmma_kernel<NT>, dim3((unsigned)(n_tiles * splits)),
                               dim3(WG_THREADS), S::SMEM, s, *g, splits, counters, partials);
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
    int64_t n_tiles = wg_tiles(g);
    if (n_tiles * ((g->k + WG_BK - 1) / WG_BK) >= INT32_MAX)
        return cudaErrorInvalidValue;
    if (g->t <= 32)
        return launch_nt<32>(dev, s, g, n_tiles, g->work);
    if (g->t <= 64)
        return launch_nt<64>(dev, s, g, n_tiles, g->work);
    return launch_nt<128>(dev, s, g, n_tiles, g->work);
}
