/* backend/cuda/fa_wgmma.cuh — FlashAttention's attending side on Hopper's warp-group tensor cores, shared by the prefill over an f16 cache (attention_prefill.cu) and over a quantized one (attention_quant.cu): a block of a producer warp group and two consumer groups of 64 query rows, K/V tiles of BN positions in STAGES pairs laid out as wgmma reads them, handed over by named barriers. Needs sm_90a machine code (the consumer loop is compiled only there). */
#ifndef INFERD_BACKEND_CUDA_FA_WGMMA_CUH
#define INFERD_BACKEND_CUDA_FA_WGMMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/fa_mma.cuh"
#include "backend/cuda/warp.cuh"
#include "backend/cuda/wgmma.cuh"

/* Named barriers (0 is __syncthreads'): stage s full for consumer group c
 * (its 128 threads and the producers'), stage s empty (the block's), group
 * c's turn to issue (both groups'); `unused` is the first id after them. */
template <int STAGES>
struct wg_bars {
    static __device__ __forceinline__ int full(int s, int c) { return 1 + 2 * s + c; }
    static __device__ __forceinline__ int empty(int s) { return 1 + 2 * STAGES + s; }
    static __device__ __forceinline__ int turn(int c) { return 1 + 3 * STAGES + c; }
    static constexpr int unused = 3 + 3 * STAGES;
    static_assert(unused <= 16, "16 named barriers");
};

/* A consumer group's products, each closed as a group: S = Q K^T over the K
 * tile at kt (HD / 64 swizzled tiles of BN rows of 128 bytes; Q as qf, each
 * warp's A fragments), and O += P V over the V tile at vt (read N-major). */
template <int HD, int BN>
static __device__ __forceinline__ void wg_issue_s(float (&s)[BN / 8][4],
                                                  const uint32_t (&qf)[HD / 16][4], uint32_t kt)
{
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t step = (uint32_t)(kk & 3) * 32; /* along the 128-byte rows */
        wgmma_rs<BN>(s, qf[kk], wgmma_desc(kt + (uint32_t)(kk >> 2) * BN * 128 + step, 16, 1024),
                     kk > 0);
    }
    wgmma_commit();
}

template <int HD, int BN>
static __device__ __forceinline__ void wg_issue_pv(float (&o)[HD / 8][4],
                                                   const uint32_t (&pf)[BN / 16][4], uint32_t vt)
{
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        wgmma_rs_nmajor<HD>(o, pf[kk], wgmma_desc(vt + (uint32_t)kk * 16 * 128, BN * 128, 1024));
    wgmma_commit();
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Consumer group c's attention over the rows' tiles (pair s at tiles0 + 2 s
 * tile bytes, K then V; THREADS: the block's), each warp its fa_warp w of 16
 * rows with Q loaded. Tile j's S goes out with tile j - 1's P V, so the
 * softmax runs while the tensor cores add. No tile is skipped: the products
 * are issued on no condition (one the compiler cannot see is the same for
 * the whole group makes it serialize them), and a tile wholly out of a row's
 * range is masked to nothing. Turns: group 0 goes first; each group arrives
 * at the other's turn once it has issued. With more_full (a shared address,
 * else 0), stage s is full only once the mbarrier at more_full + 8 s has
 * completed the phase of its tile as well (it counts bytes that another
 * block copies in); the group's first warp waits on it. */
template <int HD, int BN, int STAGES, int THREADS>
static __device__ __forceinline__ void wg_attend(fa_warp<HD> &w, const fa_rows &rows,
                                                 uint32_t tiles0, int c, int window, int lane,
                                                 uint32_t more_full = 0)
{
    using B = wg_bars<STAGES>;
    const bool waits_more = more_full && (threadIdx.x & 127) < 32;
    auto wait_full = [&](int j) {
        if (waits_more)
            mbar_wait_cluster(more_full + 8u * (uint32_t)(j % STAGES), (uint32_t)(j / STAGES) & 1u);
        bar_sync(B::full(j % STAGES, c), 256);
    };
    constexpr uint32_t TILE_BYTES = BN * HD * sizeof(__half); /* a K or a V tile */
    constexpr int NS = BN / 8;                                /* n8 tiles of S */
    const int t = lane & 3, n_tiles = rows.n_tiles;
    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    uint32_t pf[NS / 2][4];
    float corr[2];
    if (c == 1)
        bar_arrive(B::turn(0), 256);
    wait_full(0);
    bar_sync(B::turn(c), 256);
    wgmma_fence();
    wg_issue_s<HD, BN>(s, w.qf, tiles0);
    bar_arrive(B::turn(1 - c), 256);
    wgmma_wait<0>();
    wgmma_hold(s);
    w.template softmax_scores<NS>(s, rows.k_begin, rows.straddles(rows.k_begin), window, t,
                                  corr);
    for (int j = 1; j < n_tiles; j++) {
        const int st = j % STAGES, k0 = rows.k_begin + j * BN;
        const uint32_t kt = tiles0 + (uint32_t)st * 2 * TILE_BYTES;
        const uint32_t vt_prev =
            tiles0 + (uint32_t)((j - 1) % STAGES) * 2 * TILE_BYTES + TILE_BYTES;
        w.template softmax_finish<NS>(s, corr, pf); /* O complete: rescaled; P of tile j - 1 */
        wait_full(j);
        bar_sync(B::turn(c), 256);
        wgmma_fence();
        wg_issue_s<HD, BN>(s, w.qf, kt);
        wg_issue_pv<HD, BN>(w.o, pf, vt_prev);
        bar_arrive(B::turn(1 - c), 256);
        wgmma_wait<1>();
        wgmma_hold(s);
        w.template softmax_scores<NS>(s, k0, rows.straddles(k0), window, t, corr);
        wgmma_wait<0>();
        wgmma_hold(w.o);
        if (j - 1 + STAGES < n_tiles) /* tile j - 1 is done with */
            bar_arrive(B::empty((j - 1) % STAGES), THREADS);
    }
    w.template softmax_finish<NS>(s, corr, pf);
    bar_sync(B::turn(c), 256);
    wgmma_fence();
    wg_issue_pv<HD, BN>(w.o, pf,
                        tiles0 + (uint32_t)((n_tiles - 1) % STAGES) * 2 * TILE_BYTES +
                            TILE_BYTES);
    if (c == 0) /* group 1's last turn */
        bar_arrive(B::turn(1), 256);
    wgmma_wait<0>();
    wgmma_hold(w.o);
}
#endif

#endif
