/* backend/cuda/gemm_skinny.cu — FAST-mode bf16 matmuls of a few token rows (a batched decode step, a speculative verify step) on tensor cores, every weight read once for all the rows, with the GEMV epilogues.
 *
 * y (n_rows x rows) = x (n_rows x cols) w^T, n_rows <= CU_SKINNY_MAX_ROWS (8).
 * Each warp owns a tile of 16 weight rows (16 gate rows and the same 16 up
 * rows for the SwiGLU pair) and streams it through a pipeline of its own in
 * shared memory: stages of 64 columns, each one full 128-byte line of every
 * row of the tile, copied with cp.async (the loads in flight hold no
 * registers, so an SM keeps ~100 KB of weights and x coming).
 * The products are mma.sync m16n8k16: the weights the A operand, x (rounded
 * to bf16, as the GEMV kernels round it in FAST mode) the B operand, the 8
 * token rows one n tile. For a plain tile x rides the same pipeline: each
 * stage also copies the n_rows rows' 64 columns of x (f32, 256 bytes a row),
 * so a warp never waits on a load of its own outside the pipeline. Loaded
 * into registers one stage ahead instead (from L2: the stages leave L1 little
 * room), x's latency stalled every stage on an H200 (Nsight Compute, 5 rows:
 * 42% of stall cycles on L1TEX); through the pipeline, a speculative verify
 * step of the Llama-3.1-8B shape went from 1.28x to 1.24x a one-token step
 * and 8-row decode steps 11% faster. The SwiGLU pair's stages (32 weight
 * rows) leave no room for x at two blocks an SM, so its x is still read from
 * global memory a stage ahead.
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
 * number of tiles to within one; a team's warps take the tile's stages in
 * turn (warp p of the team stages p, p + split, ...), so that together they
 * read each row's bytes in order, and add their sums through shared memory
 * in warp order (deterministic: graph replay and eager launches give the
 * same bits). The split follows from the shapes and the device alone, so a
 * row's bits do not depend on when the launch runs, only on how many rows it
 * has. With contiguous column ranges a warp instead, the epilogue's loads
 * after the sums and the norm's wait before the first stage, a verify step
 * of the Llama-3.1-8B shape took 4% longer on an H100 (bench/RESULTS.md).
 *
 * An RMSNorm between two of these GEMMs (fuse.h rule 9): the one that adds
 * into the residual stream also writes the new stream times the norm's
 * weight where the norm would write its output, and leaves, per tile, each
 * token row's sum of squares of the new stream over the tile's 16 outputs
 * (reduced across the tile's lanes by shuffles). The one after the norm
 * reads that as x, like any x, and scales each token row's sums by the
 * row's inverse RMS in its epilogue (sum_c W w x inv = inv sum_c W (w x)),
 * which its block finds from the tile sums, added in tile order (a warp a
 * row), while the first stages stream in. Normalising x as it was read, the
 * norm weight's loads stood in every stage's chain: slower than the norm's
 * own launch (bench/RESULTS.md). */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/warp.cuh"

#define SK_THREADS 256
#define SK_WARPS (SK_THREADS / 32)
#define SK_MAX_SPLIT 8
/* Stages of 64 columns in a warp's pipeline (STAGES - 1 in flight while one
 * is multiplied), sized so that two blocks fit an SM: a plain tile's stage
 * carries its 16 weight rows and the x rows (256 bytes each), four stages up
 * to SK_DEEP_ROWS token rows and three above; the pair's 32 weight rows take
 * three, its x read from L2 a stage ahead. */
#define SK_STAGE_COLS 64
#define SK_X_ROW_BYTES (SK_STAGE_COLS * 4)
#define SK_DEEP_ROWS 5
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

/* NP: 1, or 2 for the SwiGLU pair; STAGES: the depth of each warp's pipeline;
 * NORM: the products of a token row scaled by its inverse RMS from a.sums_in
 * (rule 9). */
template <int NP, int STAGES, bool NORM>
static __global__ void __launch_bounds__(SK_THREADS, 2)
gemm_skinny_kernel(struct cu_gemv_args a, int n_tiles, int split)
{
    constexpr bool XP = NP == 1;                /* x rides the stages */
    constexpr int ACC = NP * 4;
    constexpr int ROWS = 16 * NP;               /* weight rows of a stage */
    constexpr int W_BYTES = ROWS * 128;         /* 8 pieces of 16 bytes a row */
    constexpr int COPIES = ROWS * 8 / 32;       /* weight cp.async a lane issues per stage */
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int teams = SK_WARPS / split, team = warp / split, part = warp % split;
    const int cols = (int)a.cols;
    const int nstage = (cols + SK_STAGE_COLS - 1) / SK_STAGE_COLS;
    /* the warp's stages of its tile: part + split i for i < n_mine */
    const int n_mine = max(0, (nstage - part + split - 1) / split);
    const int nt = a.n_rows;
    const int stage_bytes = W_BYTES + (XP ? nt * SK_X_ROW_BYTES : 0);
    /* x row g (the pair's rows past n_rows read the last row: their sums are never stored) */
    const float *xrow = a.x + (int64_t)min(g, nt - 1) * cols;
    const uint32_t pipe = (uint32_t)__cvta_generic_to_shared(smem) + warp * stage_bytes * STAGES;
    float *red = (float *)(smem + SK_WARPS * stage_bytes * STAGES); /* [SK_WARPS][ACC][32] */

    const int rounds = (n_tiles + gridDim.x * teams - 1) / (gridDim.x * teams);
    int m = 0, row0 = 0;
    bool active = false;
    /* the rows this lane copies: piece (lane % 8) of stage rows lane / 8 + 4 k,
     * from wrow[k / 4] + 4 (k % 4) rows, into dst + 512 k; row_ok bit k: the
     * row exists (the last tile's missing rows are zero-filled) */
    const uint16_t *wrow[NP];
    uint32_t dst = 0, row_ok = 0;

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
        const int rows = (int)a.m[m].rows, piece = lane % 8, lr = lane / 8;
#pragma unroll
        for (int p = 0; p < NP; p++)
            wrow[p] = (const uint16_t *)a.m[NP == 1 ? m : p].w + (int64_t)(row0 + lr) * cols +
                      8 * piece;
        /* rows lr + 4 k have lr's parity, so one swizzle serves them all */
        dst = (uint32_t)(lr * 128 + ((piece ^ ((lr & 1) << 2)) * 16));
        row_ok = 0;
#pragma unroll
        for (int k = 0; k < COPIES; k++)
            row_ok |= (row0 + lr + 4 * (k % 4) < rows ? 1u : 0u) << k;
    };
    /* the weights of the warp's stage li into slot li % STAGES */
    auto issue_w = [&](int li) {
        if (active && li < n_mine) {
            const int c0 = (part + split * li) * SK_STAGE_COLS;
            const uint32_t slot = pipe + (li % STAGES) * stage_bytes + dst;
            const bool col_in = c0 + 8 * (lane % 8) < cols;
#pragma unroll
            for (int k = 0; k < COPIES; k++) {
                bool in = col_in && (row_ok >> k & 1);
                cp_async16(slot + 512 * k,
                           in ? (const void *)(wrow[k / 4] + (int64_t)(4 * (k % 4)) * cols + c0)
                              : (const void *)a.x,
                           in);
            }
        }
    };
    /* XP: x rows t < nt of the warp's stage li after its weights, 16 pieces of 16 bytes a
     * row, piece j of row t at j ^ (t & 1) so that load_x's quarter-warps read
     * distinct banks; zeros past the row's end */
    auto issue_x = [&](int li) {
        if (XP && active && li < n_mine) {
            const int st = part + split * li;
            uint32_t xslot = pipe + (li % STAGES) * stage_bytes + W_BYTES;
#pragma unroll
            for (int k = 0; k < CU_SKINNY_MAX_ROWS * 16 / 32; k++) {
                int i = lane + 32 * k, t = i >> 4, j = i & 15;
                if (t < nt) {
                    int col = st * SK_STAGE_COLS + 4 * j;
                    bool in = col < cols;
                    cp_async16(xslot + t * SK_X_ROW_BYTES + ((j ^ (t & 1)) * 16),
                               in ? (const void *)(a.x + (int64_t)t * cols + col)
                                  : (const void *)a.x,
                               in);
                }
            }
        }
    };
    /* the warp's stage li: always one group */
    auto issue = [&](int li) {
        issue_w(li);
        issue_x(li);
        cp_async_commit();
    };
    float acc[NP][4];
    /* NORM: the inverse RMS of the token rows 2q and 2q + 1 the lane's sums are of */
    float inv[2] = {1.0f, 1.0f};
    /* the lane's x of the warp's stage li (its 8 columns of each 32): XP from the stage's
     * copy (zeros for rows past n_rows), else from global memory (zeros past
     * the row's end) */
    auto load_x = [&](int li, float4(&xs)[2][2]) {
        const int st = part + split * li;
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int col = st * SK_STAGE_COLS + 32 * c + 8 * q + 4 * h;
                if (XP) {
                    uint32_t xslot = pipe + (li % STAGES) * stage_bytes + W_BYTES;
                    int j = (32 * c + 8 * q + 4 * h) / 4;
                    uint4 v = g < nt ? lds128(xslot + g * SK_X_ROW_BYTES + ((j ^ (g & 1)) * 16))
                                     : make_uint4(0, 0, 0, 0);
                    xs[c][h] = make_float4(__uint_as_float(v.x), __uint_as_float(v.y),
                                           __uint_as_float(v.z), __uint_as_float(v.w));
                } else {
                    xs[c][h] = col < cols ? __ldg((const float4 *)(xrow + col))
                                          : make_float4(0, 0, 0, 0);
                }
            }
    };
    /* the products of the warp's stage li, waited for, with its x */
    auto multiply = [&](int li, const float4(&xs)[2][2]) {
        uint32_t slot = pipe + (li % STAGES) * stage_bytes;
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
            issue(i);
    };

    /* the first tile's first weights go out before the kernel before has
     * finished; x (written by that kernel) only after it has */
    begin_tile(0);
    if (XP) {
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++)
            issue_w(i);
    } else {
        prologue();
    }
    pdl_release();
    pdl_wait();
    if (XP)
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++) {
            issue_x(i);
            cp_async_commit();
        }
    __shared__ float inv_sm[CU_SKINNY_MAX_ROWS];
    if (NORM) {
        /* row t's sums of squares, added in tile order by warp t; the block
         * waits for them only before its first epilogue, so the other warps
         * start their products at once */
        if (warp < nt) {
            const int parts = (cols + 15) / 16;
            const float *sums = a.sums_in + (int64_t)warp * parts;
            float s = 0.0f;
            for (int i = lane; i < parts; i += 32)
                s += sums[i];
            s = warp_sum(s);
            if (lane == 0)
                inv_sm[warp] = 1.0f / sqrtf(s / (float)cols + a.norm_eps);
        }
    }
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
        /* XP: x with its stage; else one stage ahead of the products, so its
         * L2 latency hides behind them */
        float4 x_cur[2][2], x_next[2][2];
        if (!XP && active && n_mine > 0)
            load_x(0, x_cur);
        for (int st = 0; st < n_mine; st++) {
            cp_async_wait<STAGES - 2>();
            __syncwarp();
            if (active && XP) {
                load_x(st, x_cur);
                multiply(st, x_cur);
            } else if (active) {
                if (st + 1 < n_mine)
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
        /* the epilogue's operands of the lane's four outputs (their bias, the
         * residual stream, the next norm's weight), all loaded before the
         * team's sums meet, so that their latency passes while the team's
         * last warps finish and no load waits behind a store (stores through
         * a.res and the outputs would otherwise order each load after the
         * stores before it) */
        float res_pre[4] = {}, xw_pre[2] = {}, bias_pre[2] = {};
        if (NP == 1 && active && part == 0) {
            const int64_t rows = a.m[m].rows;
            const float *bias = a.m[m].bias;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = row0 + g + 8 * (e >> 1), t = 2 * q + (e & 1);
                if (a.res && row < rows && t < nt)
                    res_pre[e] = a.res[(int64_t)t * rows + row];
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = row0 + g + 8 * h;
                if (a.sums_out && row < rows)
                    xw_pre[h] = a.xw_w[row];
                if (bias && row < rows)
                    bias_pre[h] = bias[row];
            }
        }
        if (NORM && r == 0) {
            __syncthreads(); /* the rows' inverse RMS, found while the first stages streamed */
            inv[0] = inv_sm[min(2 * q, nt - 1)];
            inv[1] = inv_sm[min(2 * q + 1, nt - 1)];
        }
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
        float sq[2] = {0.0f, 0.0f}; /* the new res squared, token rows 2q and 2q + 1 */
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = row0 + g + 8 * (e >> 1), t = 2 * q + (e & 1);
            if (row >= rows || t >= nt)
                continue;
            int64_t idx = (int64_t)t * rows + row;
            if (NP == 2) {
                float gv = NORM ? acc[0][e] * inv[e & 1] : acc[0][e];
                float uv = NORM ? acc[NP - 1][e] * inv[e & 1] : acc[NP - 1][e];
                a.m[0].y[idx] = gv / (1.0f + expf(-gv)) * uv;
                a.m[NP - 1].y[idx] = uv;
            } else {
                float v = (NORM ? acc[0][e] * inv[e & 1] : acc[0][e]) + bias_pre[e >> 1];
                a.m[m].y[idx] = v;
                if (a.res) {
                    float r = res_pre[e] + v;
                    a.res[idx] = r;
                    sq[e & 1] += r * r;
                    if (a.sums_out)
                        a.xw_out[idx] = r * xw_pre[e >> 1];
                }
            }
        }
        if (NP == 1 && a.sums_out) {
            /* over the tile's rows: the lanes of one q */
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                sq[0] += __shfl_xor_sync(0xffffffffu, sq[0], o);
                sq[1] += __shfl_xor_sync(0xffffffffu, sq[1], o);
            }
            const int64_t parts = (rows + 15) / 16;
            if (g == 0)
#pragma unroll
                for (int k = 0; k < 2; k++)
                    if (2 * q + k < nt)
                        a.sums_out[(2 * q + k) * parts + row0 / 16] = sq[k];
        }
    }
}

/* kernel: index K in cu_device.skinny_smem */
template <int NP, int STAGES, int K>
static cudaError_t launch(struct cu_device *dev, cudaStream_t s, const struct cu_gemv_args *a,
                          int n_tiles)
{
    auto kern = a->sums_in ? gemm_skinny_kernel<NP, STAGES, true>
                           : gemm_skinny_kernel<NP, STAGES, false>;
    const size_t x_bytes = NP == 1 ? (size_t)a->n_rows * SK_X_ROW_BYTES : 0;
    const size_t smem = (size_t)SK_WARPS * STAGES * (16 * NP * SK_STAGE_COLS * 2 + x_bytes) +
                        (size_t)SK_WARPS * NP * 4 * 32 * sizeof(float);
    int per_sm = 0;
    cudaError_t e =
        cu_kernel_fit(kern, SK_THREADS, smem, &dev->skinny_smem[K + (a->sums_in ? 3 : 0)], &per_sm);
    if (e != cudaSuccess)
        return e;
    /* a team per tile: as many warps on a tile as keep each SM streaming */
    const int64_t per_sm_tiles = (n_tiles + dev->n_sm - 1) / dev->n_sm;
    const int nstage = (int)((a->cols + SK_STAGE_COLS - 1) / SK_STAGE_COLS);
    int split = 1;
    while (split < SK_MAX_SPLIT && per_sm_tiles * split < SK_WARPS_PER_SM &&
           nstage >= 2 * split * STAGES)
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
    /* no folded norm but rule 9's; its sums only of a single matrix's residual add, with
     * the stream times the norm weight written beside them */
    if (a->dtype != DTYPE_BF16 || !cu_skinny_takes(a->n_rows, a->cols) || a->norm_w ||
        (a->sums_out && (!a->res || a->n_mat != 1 || a->pair || !a->xw_out || !a->xw_w)) ||
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
    if (a->pair)
        return launch<2, 3, 0>(dev, s, a, (int)n_tiles);
    if (a->n_rows <= SK_DEEP_ROWS)
        return launch<1, 4, 1>(dev, s, a, (int)n_tiles);
    return launch<1, 3, 2>(dev, s, a, (int)n_tiles);
}
