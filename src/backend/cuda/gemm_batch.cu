/* backend/cuda/gemm_batch.cu — FAST-mode bf16 matmuls of a batched decode step (9 to 64 token rows) on tensor cores, every weight read once for all the rows, with the GEMV epilogues.
 *
 * y (n_rows x rows) = x (n_rows x cols) w^T, CU_SKINNY_MAX_ROWS < n_rows <=
 * CU_BATCH_MAX_ROWS. A block of GB_WARPS warps takes a tile of GB_BN weight
 * rows (for the SwiGLU pair, GB_BN / 2 gate rows and the same up rows) and
 * all 64 token rows (rows past n_rows are zero), and walks its columns in
 * stages of 64: each stage is 32 KB of weights and the 16 KB of x's f32
 * beside them, copied with cp.async into one of GB_STAGES buffers (three
 * stages in flight while one is multiplied). Rows' 16-byte chunks are
 * XOR-swizzled by row so the shared-memory reads are free of bank conflicts.
 * Warp w multiplies weight rows 32 w .. 32 w + 31 by the 64 token rows: per
 * 16 columns two A fragments (the weights, ldmatrix), eight B fragments (x,
 * rounded to bf16 pairs as the GEMV kernels round it in FAST mode) and
 * sixteen mma.sync m16n8k16, f32 accumulators. x is read from L2 by every
 * block; loading it as f32 with the weights keeps it as far ahead of its
 * products as they are (a register-staged x held each stage to L2's latency).
 *
 * Split-K: a tile's stages are cut into `splits` ranges, one block each, so
 * that the grid fills the SMs once (one block an SM: the stages take 192 KB).
 * Each block leaves its partial tile in the workspace; the last block of the
 * tile to finish (a counter per tile, reset by that block) adds the partials
 * in split order and applies the epilogue, so the result's bits depend on
 * the shapes and the device only, not on which block finished last. The
 * epilogue goes through shared memory, so y is written a token row at a
 * time: bias, the residual add (res += y) or SwiGLU (gate = silu(gate) up,
 * up kept) as the GEMV kernels do. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/warp.cuh"

#define GB_THREADS 256
#define GB_WARPS (GB_THREADS / 32)
#define GB_BN 256 /* weight rows of a tile */
#define GB_BM 64  /* token rows */
#define GB_BK 64  /* columns of a stage */
#define GB_STAGES 4
#define GB_W_BYTES (GB_BN * GB_BK * 2)
#define GB_X_BYTES (GB_BM * GB_BK * 4)
#define GB_STAGE_BYTES (GB_W_BYTES + GB_X_BYTES)
#define GB_ACC 64 /* accumulators a thread: 2 x 8 fragments of 4 */
#define GB_CT_LD (GB_BN + 4) /* floats per token row of the epilogue's tile */
#define GB_SMEM (GB_STAGES * GB_STAGE_BYTES > GB_BM * GB_CT_LD * 4 ? GB_STAGES * GB_STAGE_BYTES \
                                                                 : GB_BM * GB_CT_LD * 4)
/* stages a split holds at least */
#define GB_MIN_SPLIT_STAGES 4

/* Byte offset of 16-byte chunk c of row r in a buffer of rows of `row`
 * bytes (the weights' 128, x's 256). */
template <int ROW>
static __device__ __forceinline__ uint32_t gb_swz(int r, int c)
{
    return (uint32_t)(r * ROW + ((c ^ (r & 7)) << 4));
}

/* Tiles of one matmul: per matrix of the group, or the pair's shared rows. */
static int64_t batch_tiles(const struct cu_gemv_args *a)
{
    if (a->pair)
        return cu_row_tiles(a->m, 1, GB_BN / 2);
    return cu_row_tiles(a->m, a->n_mat, GB_BN);
}

static int batch_splits(int64_t n_tiles, int64_t cols, int n_sm)
{
    return cu_split_k(n_tiles, (cols + GB_BK - 1) / GB_BK, n_sm, GB_MIN_SPLIT_STAGES);
}

/* Workspace of a launch: the tiles' counters (256 bytes), then the partials. */
static size_t batch_work_bytes(int64_t n_tiles, int splits)
{
    if (splits <= 1)
        return 0;
    size_t counters = ((size_t)n_tiles * sizeof(unsigned) + 255) / 256 * 256;
    return counters + (size_t)n_tiles * splits * GB_THREADS * GB_ACC * sizeof(float);
}

template <bool PAIR>
static __global__ void __launch_bounds__(GB_THREADS, 1)
gemm_batch_kernel(struct cu_gemv_args a, int splits, unsigned *counters, float *partials)
{
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int cols = (int)a.cols, nt = a.n_rows;
    int tile = blockIdx.x / splits;
    const int split = blockIdx.x % splits, tile_id = tile;
    int m = 0;
    if (!PAIR)
        while (m + 1 < a.n_mat && tile >= (int)((a.m[m].rows + GB_BN - 1) / GB_BN)) {
            tile -= (int)((a.m[m].rows + GB_BN - 1) / GB_BN);
            m++;
        }
    const int rows = (int)a.m[m].rows;
    const int row0 = tile * (PAIR ? GB_BN / 2 : GB_BN); /* first output row */
    const int nstage = (cols + GB_BK - 1) / GB_BK;
    const int per = (nstage + splits - 1) / splits;
    const int s_begin = min(nstage, split * per), s_end = min(nstage, s_begin + per);
    const uint32_t base = smem_addr(smem);

    /* weight copies: chunk (tid % 8) of tile rows tid / 8 + 32 i */
    const int w_chunk = threadIdx.x & 7, w_row = threadIdx.x >> 3;
    auto w_src = [&](int r) -> const uint16_t * {
        const struct cu_mat *mat = &a.m[PAIR ? r / (GB_BN / 2) : m];
        int rr = row0 + (PAIR ? r % (GB_BN / 2) : r);
        return (const uint16_t *)mat->w + (int64_t)min(rr, rows - 1) * cols;
    };
    auto issue_w = [&](int st) {
        if (st >= s_end)
            return;
        const uint32_t slot = base + (st % GB_STAGES) * GB_STAGE_BYTES;
        const int col = st * GB_BK + 8 * w_chunk;
        const bool in = col < cols;
#pragma unroll
        for (int i = 0; i < GB_BN / 32; i++) {
            int r = w_row + 32 * i;
            cp_async16(slot + gb_swz<128>(r, w_chunk), in ? (const void *)(w_src(r) + col) : a.x,
                       in);
        }
    };
    /* x as f32: chunk (tid % 16) of token rows tid / 16 + 16 j; rows past
     * n_rows and columns past cols zero-filled */
    const int x_chunk = threadIdx.x & 15, x_row = threadIdx.x >> 4;
    auto issue_x = [&](int st) {
        if (st < s_end) {
            const uint32_t slot = base + (st % GB_STAGES) * GB_STAGE_BYTES + GB_W_BYTES;
            const int col = st * GB_BK + 4 * x_chunk;
#pragma unroll
            for (int j = 0; j < GB_BM / 16; j++) {
                int tok = x_row + 16 * j;
                bool in = tok < nt && col < cols;
                cp_async16(slot + gb_swz<256>(tok, x_chunk),
                           in ? (const void *)(a.x + (int64_t)tok * cols + col) : a.x, in);
            }
        }
        cp_async_commit();
    };

    /* accumulator (i * 8 + j) * 4 + e: element e of the C fragment of A tile
     * i (weight rows 32 warp + 16 i ..) and n tile j (token rows 8 j ..) */
    float acc[GB_ACC];
#pragma unroll
    for (int k = 0; k < GB_ACC; k++)
        acc[k] = 0.0f;

    /* ldmatrix roles for the A tiles i: rows (lane & 7) + 8 ((lane >> 3) & 1),
     * chunk + (lane >> 4). The B fragments are built from x's f32: token row
     * 8 j + g, columns 2t, 2t + 1 and 2t + 8, 2t + 9 of the k16 step, rounded
     * to bf16 pairs. */
    const int a_row = 32 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), a_chunk = lane >> 4;
    auto multiply = [&](int st) {
        const uint32_t wb = base + (st % GB_STAGES) * GB_STAGE_BYTES, xb = wb + GB_W_BYTES;
#pragma unroll
        for (int kk = 0; kk < GB_BK / 16; kk++) {
            uint32_t af[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ldsm_x4(wb + gb_swz<128>(a_row + 16 * i, 2 * kk + a_chunk), af[i][0], af[i][1],
                        af[i][2], af[i][3]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int tok = 8 * j + g;
                float2 lo, hi;
                lds64(xb + gb_swz<256>(tok, 4 * kk + (t >> 1)) + 8 * (t & 1), lo);
                lds64(xb + gb_swz<256>(tok, 4 * kk + 2 + (t >> 1)) + 8 * (t & 1), hi);
                const uint32_t b0 = pack_bf16x2(lo.x, lo.y), b1 = pack_bf16x2(hi.x, hi.y);
#pragma unroll
                for (int i = 0; i < 2; i++)
                    mma_bf16(&acc[(i * 8 + j) * 4], af[i][0], af[i][1], af[i][2], af[i][3], b0,
                             b1);
            }
        }
    };

    /* the first stages' weights go out before the kernel before has finished
     * (in the first stage's copy group), x after it has */
#pragma unroll
    for (int i = 0; i < GB_STAGES - 1; i++)
        issue_w(s_begin + i);
    pdl_release();
    pdl_wait();
#pragma unroll
    for (int i = 0; i < GB_STAGES - 1; i++)
        issue_x(s_begin + i);
    for (int st = s_begin; st < s_end; st++) {
        cp_async_wait<GB_STAGES - 2>();
        __syncthreads(); /* stage st landed; the slot of st - 1 is free */
        issue_w(st + GB_STAGES - 1);
        issue_x(st + GB_STAGES - 1);
        multiply(st);
    }
    cp_async_wait<0>();

    if (splits > 1) {
        /* this split's partial, then the last block of the tile adds them all */
        float *mine = partials + ((size_t)tile_id * splits + split) * GB_THREADS * GB_ACC;
#pragma unroll
        for (int k = 0; k < GB_ACC; k++)
            __stcg(&mine[k * GB_THREADS + threadIdx.x], acc[k]);
        if (!block_arrives_last(&counters[tile_id], (unsigned)splits))
            return;
        /* split by split, all of a split's loads in flight at once */
        const float *all = partials + (size_t)tile_id * splits * GB_THREADS * GB_ACC + threadIdx.x;
#pragma unroll
        for (int k = 0; k < GB_ACC; k++)
            acc[k] = __ldcg(&all[k * GB_THREADS]);
        for (int s = 1; s < splits; s++) {
            const float *p = all + (size_t)s * GB_THREADS * GB_ACC;
#pragma unroll
            for (int k = 0; k < GB_ACC; k++)
                acc[k] += __ldcg(&p[k * GB_THREADS]);
        }
    }

    /* the tile through shared memory, ct[token][tile row] */
    __syncthreads();
    float *ct = (float *)smem;
#pragma unroll
    for (int k = 0; k < GB_ACC; k++) {
        const int i = k / 32, j = (k / 4) % 8, e = k % 4;
        ct[(8 * j + 2 * t + (e & 1)) * GB_CT_LD + 32 * warp + 16 * i + g + 8 * (e >> 1)] = acc[k];
    }
    __syncthreads();
    constexpr int OUT = PAIR ? GB_BN / 2 : GB_BN;
    for (int k = threadIdx.x; k < nt * OUT; k += GB_THREADS) {
        const int tok = k / OUT, r = k % OUT, row = row0 + r;
        if (row >= rows)
            continue;
        const int64_t idx = (int64_t)tok * rows + row;
        if (PAIR) {
            float gv = ct[tok * GB_CT_LD + r], uv = ct[tok * GB_CT_LD + OUT + r];
            a.m[0].y[idx] = gv / (1.0f + expf(-gv)) * uv;
            a.m[1].y[idx] = uv;
        } else {
            float v = ct[tok * GB_CT_LD + r] + (a.m[m].bias ? a.m[m].bias[row] : 0.0f);
            a.m[m].y[idx] = v;
            if (a.res)
                a.res[idx] += v;
        }
    }
}

size_t cu_gemm_batch_work_bytes(const struct cu_device *dev, const struct cu_gemv_args *a)
{
    if (a->n_rows <= CU_SKINNY_MAX_ROWS || a->n_rows > CU_BATCH_MAX_ROWS)
        return 0;
    int64_t n_tiles = batch_tiles(a);
    return batch_work_bytes(n_tiles, batch_splits(n_tiles, a->cols, dev->n_sm));
}

cudaError_t cu_launch_gemm_batch(struct cu_device *dev, cudaStream_t s,
                                 const struct cu_gemv_args *a)
{
    if (a->n_rows == 0)
        return cudaSuccess;
    if (a->dtype != DTYPE_BF16 || a->n_rows <= CU_SKINNY_MAX_ROWS ||
        a->n_rows > CU_BATCH_MAX_ROWS || a->cols % 8 || a->norm_w || a->row_invariant ||
        ((uintptr_t)a->x % 16) != 0 || (a->pair && a->n_mat != 2))
        return cudaErrorInvalidValue;
    for (int i = 0; i < a->n_mat; i++)
        if ((uintptr_t)a->m[i].w % 16 != 0)
            return cudaErrorInvalidValue;
    int64_t n_tiles = batch_tiles(a);
    if (n_tiles == 0)
        return cudaSuccess;
    int splits = batch_splits(n_tiles, a->cols, dev->n_sm);
    if (n_tiles * splits >= INT32_MAX)
        return cudaErrorInvalidValue;
    size_t need = batch_work_bytes(n_tiles, splits);
    if (need > a->work_bytes)
        return cudaErrorInvalidValue;
    unsigned *counters = need ? (unsigned *)a->work : NULL;
    float *partials =
        need ? (float *)((uint8_t *)a->work + ((size_t)n_tiles * sizeof(unsigned) + 255) / 256 * 256)
             : NULL;
    auto kern = a->pair ? gemm_batch_kernel<true> : gemm_batch_kernel<false>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, GB_SMEM);
    if (e != cudaSuccess)
        return e;
    return cu_launch_dependent(dev->pdl, kern, dim3((unsigned)(n_tiles * splits)),
                               dim3(GB_THREADS), GB_SMEM, s, *a, splits, counters, partials);
}
