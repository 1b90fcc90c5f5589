/* backend/cuda/gemm_skinny.cu — FAST-mode bf16 matmuls of a few token rows (a batched decode step, a speculative verify step) on tensor cores, every weight read once for all the rows, with the GEMV epilogues.
 *
 * y (n_rows x rows) = x (n_rows x cols) w^T, n_rows <= CU_SKINNY_MAX_ROWS (8).
 * Each warp owns a tile of 16 weight rows (16 gate rows and the same 16 up
 * rows for the SwiGLU pair) and streams it through a pipeline of its own in
 * shared memory: stages of 64 columns, each one full 128-byte line of every
 * row of the tile, copied with cp.async (the loads in flight hold no
 * registers, so an SM keeps ~100 KB of weights coming).
 * The products are mma.sync m16n8k16: the weights the A operand, x (rounded
 * to bf16, as the GEMV kernels round it in FAST mode) the B operand, the 8
 * token rows one n tile, read from global memory (every warp of an SM reads
 * the same x; the weights' stages leave L1 little room for it, so x comes
 * mostly from L2, about as many bytes as the weights, and is loaded one
 * stage ahead of its products to hide that latency).
 *
 * Fragment layout. For lane (g = lane / 4, q = lane % 4) the m16n8k16 A
 * fragment holds row g and row g + 8 at the logical columns {2q, 2q + 1,
 * 2q + 8, 2q + 9}, the B fragment token row g at the same logical columns.
 * A dot product does not care which physical column a logical one is, as
 * long as A and B agree: for each 32 columns the lane takes the 16 bytes of
 * columns [8q, 8q + 8) of its two weight rows and of x, and the two mmas
 * take columns 8q..8q+3 and 8q+4..8q+7 as their logical four. In shared
 * memory the 16-byte pieces of odd rows are swapped by halves of the line,
 * so those reads are free of bank conflicts. Rows are a multiple of 8
 * long; pieces past the end are zero-filled and meet zero x.
 *
 * Work: a persistent grid (every block resident), tiles dealt out to teams
 * of `split` warps round-robin over the blocks so every SM gets the same
 * number of tiles to within one; a team's warps take contiguous column
 * ranges of the tile and add their sums through shared memory in warp order
 * (deterministic: graph replay and eager launches give the same bits). The
 * split follows from the shapes and the device alone, so a row's bits do not
 * depend on when the launch runs, only on how many rows it has. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/warp.cuh"

#define SK_THREADS 256
#define SK_WARPS (SK_THREADS / 32)
#define SK_MAX_SPLIT 8
/* stages of 64 columns in a warp's pipeline (SK_STAGES - 1 in flight while
 * one is multiplied): four for a tile of 16 rows, three for the pair's 32,
 * so an SM holds three blocks, or two (about 200 KB) */
#define SK_STAGES(NP) ((NP) == 1 ? 4 : 3)
#define SK_STAGE_COLS 64
/* Warps an SM should have streaming a tile: splits grow until the tiles an
 * SM gets reach it. */
#define SK_WARPS_PER_SM 24

/* Eight consecutive x values (two float4) as four bf16 pairs. */
static __device__ __forceinline__ uint4 x_bf16x8(float4 a, float4 b)
{
    return make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y),
                      pack_bf16x2(b.z, b.w));
}

static __device__ __forceinline__ uint4 lds128(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}

/* Tiles of 16 rows: per matrix of the group, or the pair's shared rows. */
static __host__ __device__ int64_t skinny_tiles(const struct cu_gemv_args *a)
{
    if (a->pair)
        return (a->m[0].rows + 15) / 16;
    int64_t n = 0;
    for (int i = 0; i < a->n_mat; i++)
        n += (a->m[i].rows + 15) / 16;
    return n;
}

/* Bytes of one warp's pipeline: its stages of 16 * NP rows of 128 bytes. */
#define SK_WARP_BYTES(NP) (SK_STAGES(NP) * 16 * (NP) * SK_STAGE_COLS * 2)

/* NP: 1, or 2 for the SwiGLU pair. */
template <int NP>
static __global__ void __launch_bounds__(SK_THREADS, NP == 1 ? 3 : 2)
gemm_skinny_kernel(struct cu_gemv_args a, int n_tiles, int split)
{
    constexpr int ACC = NP * 4;
    constexpr int STAGES = SK_STAGES(NP);
    constexpr int ROWS = 16 * NP;               /* rows of a stage */
    constexpr int STAGE_BYTES = ROWS * 128;     /* 8 pieces of 16 bytes a row */
    constexpr int COPIES = ROWS * 8 / 32;       /* cp.async a lane issues per stage */
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int teams = SK_WARPS / split, team = warp / split, part = warp % split;
    const int cols = (int)a.cols;
    const int nstage = (cols + SK_STAGE_COLS - 1) / SK_STAGE_COLS;
    const int per_part = (nstage + split - 1) / split;
    const int s_begin = min(nstage, part * per_part);
    const int s_end = min(nstage, s_begin + per_part);
    const int nt = a.n_rows;
    /* x row g (rows past n_rows read the last row: their sums are never stored) */
    const float *xrow = a.x + (int64_t)min(g, nt - 1) * cols;
    const uint32_t pipe = (uint32_t)__cvta_generic_to_shared(smem) + warp * STAGE_BYTES * STAGES;
    float *red = (float *)(smem + SK_WARPS * STAGE_BYTES * STAGES); /* [SK_WARPS][ACC][32] */

    const int rounds = (n_tiles + gridDim.x * teams - 1) / (gridDim.x * teams);
    int m = 0, row0 = 0;
    bool active = false;
    /* the rows this lane copies: piece (lane % 8) of rows lane / 8 + 4 k */
    const uint16_t *src[COPIES];
    uint32_t dst[COPIES];

    auto begin_tile = [&](int r) {
        int tile = blockIdx.x + gridDim.x * (team + teams * r);
        active = tile < n_tiles;
        if (!active)
            return;
        m = 0;
        if (NP == 1)
            while (m + 1 < a.n_mat && tile >= (int)((a.m[m].rows + 15) / 16)) {
                tile -= (int)((a.m[m].rows + 15) / 16);
                m++;
            }
        row0 = tile * 16;
        const int rows = (int)a.m[m].rows;
#pragma unroll
        for (int k = 0; k < COPIES; k++) {
            int rr = lane / 8 + 4 * k, piece = lane % 8; /* stage row, 16-byte piece */
            int p = rr / 16, r = rr % 16;
            int64_t row = min(row0 + r, rows - 1);
            src[k] = (const uint16_t *)a.m[NP == 1 ? m : p].w + row * cols + 8 * piece;
            dst[k] = (uint32_t)(rr * 128 + ((piece ^ ((rr & 1) << 2)) * 16));
        }
    };
    /* stage st of the tile into slot st % STAGES; always one group */
    auto issue = [&](int st) {
        if (active && st < s_end) {
            uint32_t slot = pipe + (st % STAGES) * STAGE_BYTES;
#pragma unroll
            for (int k = 0; k < COPIES; k++) {
                int col = st * SK_STAGE_COLS + 8 * (lane % 8);
                bool in = col < cols;
                cp_async16(slot + dst[k], in ? (const void *)(src[k] + st * SK_STAGE_COLS)
                                             : (const void *)a.x,
                           in);
            }
        }
        cp_async_commit();
    };
    float acc[NP][4];
    /* the lane's x of stage st (its 8 columns of each 32), zeros past the row's end */
    auto load_x = [&](int st, float4(&xs)[2][2]) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            int col = st * SK_STAGE_COLS + 32 * c + 8 * q;
            bool in = col < cols;
            xs[c][0] = in ? __ldg((const float4 *)(xrow + col)) : make_float4(0, 0, 0, 0);
            xs[c][1] = in ? __ldg((const float4 *)(xrow + col) + 1) : make_float4(0, 0, 0, 0);
        }
    };
    /* the products of stage st, waited for, with its x */
    auto multiply = [&](int st, const float4(&xs)[2][2]) {
        uint32_t slot = pipe + (st % STAGES) * STAGE_BYTES;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            int piece = 4 * c + q;
            uint4 lo[NP], hi[NP];
#pragma unroll
            for (int p = 0; p < NP; p++) {
                int r_lo = 16 * p + g, r_hi = r_lo + 8; /* same parity: same swap */
                lo[p] = lds128(slot + r_lo * 128 + ((piece ^ ((r_lo & 1) << 2)) * 16));
                hi[p] = lds128(slot + r_hi * 128 + ((piece ^ ((r_hi & 1) << 2)) * 16));
            }
            uint4 xv = x_bf16x8(xs[c][0], xs[c][1]);
#pragma unroll
            for (int p = 0; p < NP; p++) {
                mma_bf16(acc[p], lo[p].x, hi[p].x, lo[p].y, hi[p].y, xv.x, xv.y);
                mma_bf16(acc[p], lo[p].z, hi[p].z, lo[p].w, hi[p].w, xv.z, xv.w);
            }
        }
    };
    auto prologue = [&]() {
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++)
            issue(s_begin + i);
    };

    /* the first tile's first copies go out before the kernel before has finished */
    begin_tile(0);
    prologue();
    pdl_release();
    pdl_wait();

    for (int r = 0; r < rounds; r++) {
        if (r > 0) {
            begin_tile(r);
            prologue();
        }
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[p][e] = 0.0f;
        /* x one stage ahead of the products: its L2 latency hides behind them */
        float4 x_cur[2][2], x_next[2][2];
        if (active && s_begin < s_end)
            load_x(s_begin, x_cur);
        for (int st = s_begin; st < s_end; st++) {
            cp_async_wait<STAGES - 2>();
            __syncwarp();
            if (active) {
                if (st + 1 < s_end)
                    load_x(st + 1, x_next);
                multiply(st, x_cur);
#pragma unroll
                for (int c = 0; c < 2; c++)
                    x_cur[c][0] = x_next[c][0], x_cur[c][1] = x_next[c][1];
            }
            __syncwarp(); /* every lane is done with the slot the next copy refills */
            issue(st + STAGES - 1);
        }
        cp_async_wait<0>();
        if (split > 1) {
            /* the team's parts, added in warp order by its first warp */
            float *mine = red + (size_t)warp * ACC * 32;
            if (part != 0)
#pragma unroll
                for (int p = 0; p < NP; p++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        mine[(p * 4 + e) * 32 + lane] = acc[p][e];
            __syncthreads(); /* every warp of the block runs every round */
            if (part == 0)
                for (int w = 1; w < split; w++) {
                    const float *theirs = mine + (size_t)w * ACC * 32;
#pragma unroll
                    for (int p = 0; p < NP; p++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[p][e] += theirs[(p * 4 + e) * 32 + lane];
                }
            __syncthreads();
        }
        if (!active || part != 0)
            continue;
        /* c[e]: weight row row0 + g (+ 8 for e >= 2), token row 2q (+ 1 for odd e) */
        const int64_t rows = a.m[m].rows;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = row0 + g + 8 * (e >> 1), t = 2 * q + (e & 1);
            if (row >= rows || t >= nt)
                continue;
            int64_t idx = (int64_t)t * rows + row;
            if (NP == 2) {
                float gv = acc[0][e], uv = acc[NP - 1][e];
                a.m[0].y[idx] = gv / (1.0f + expf(-gv)) * uv;
                a.m[NP - 1].y[idx] = uv;
            } else {
                float v = acc[0][e] + (a.m[m].bias ? a.m[m].bias[row] : 0.0f);
                a.m[m].y[idx] = v;
                if (a.res)
                    a.res[idx] += v;
            }
        }
    }
}

template <int NP>
static cudaError_t launch(struct cu_device *dev, cudaStream_t s, const struct cu_gemv_args *a,
                          int n_tiles)
{
    auto kern = gemm_skinny_kernel<NP>;
    const size_t smem = (size_t)SK_WARPS * SK_WARP_BYTES(NP) +
                        (size_t)SK_WARPS * NP * 4 * 32 * sizeof(float);
    int per_sm = 0;
    cudaError_t e = cu_kernel_fit(kern, SK_THREADS, smem, &dev->skinny_smem[NP - 1], &per_sm);
    if (e != cudaSuccess)
        return e;
    /* a team per tile: as many warps on a tile as keep each SM streaming */
    const int64_t per_sm_tiles = (n_tiles + dev->n_sm - 1) / dev->n_sm;
    const int nstage = (int)((a->cols + SK_STAGE_COLS - 1) / SK_STAGE_COLS);
    int split = 1;
    while (split < SK_MAX_SPLIT && per_sm_tiles * split < SK_WARPS_PER_SM &&
           nstage >= 2 * split * SK_STAGES(NP))
        split *= 2;
    /* whole rounds of SMs: tile t goes to block t mod grid, so to SM t mod n_sm */
    const int teams = SK_WARPS / split;
    int64_t want = (n_tiles + teams - 1) / teams;
    want = (want + dev->n_sm - 1) / dev->n_sm * dev->n_sm;
    int64_t slots = (int64_t)dev->n_sm * per_sm;
    unsigned grid = (unsigned)(want < slots ? want : slots);
    return cu_launch_dependent(dev->pdl, kern, dim3(grid), dim3(SK_THREADS), smem, s, *a, n_tiles,
                               split);
}

cudaError_t cu_launch_gemm_skinny(struct cu_device *dev, cudaStream_t s,
                                  const struct cu_gemv_args *a)
{
    if (a->n_rows == 0)
        return cudaSuccess;
    if (a->dtype != DTYPE_BF16 || !cu_skinny_takes(a->n_rows, a->cols) || a->norm_w ||
        a->row_invariant || ((uintptr_t)a->x % 16) != 0)
        return cudaErrorInvalidValue;
    for (int i = 0; i < a->n_mat; i++)
        if ((uintptr_t)a->m[i].w % 16 != 0)
            return cudaErrorInvalidValue;
    int64_t n_tiles = skinny_tiles(a);
    if (n_tiles == 0)
        return cudaSuccess;
    if (n_tiles >= INT32_MAX)
        return cudaErrorInvalidValue;
    return a->pair ? launch<2>(dev, s, a, (int)n_tiles) : launch<1>(dev, s, a, (int)n_tiles);
}
