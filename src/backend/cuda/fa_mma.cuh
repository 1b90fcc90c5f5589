/* backend/cuda/fa_mma.cuh — the FlashAttention-2 warp step on mma.sync tensor cores that the tensor-core attention kernels share: a warp's 16 query rows as fp16 A fragments against a K/V tile of fp16 rows in shared memory, online softmax in registers, the rows' outputs stored; and the stream of an f16 cache's K/V tiles into shared memory. */
#ifndef INFERD_BACKEND_CUDA_FA_MMA_CUH
#define INFERD_BACKEND_CUDA_FA_MMA_CUH

#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/record.h"
#include "backend/cuda/warp.cuh"

/* Positions per K/V tile. */
#define FA_BK 64
/* log2(e): scores are kept in base 2, so exp becomes one ex2 instruction. */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* A tile holds FA_BK rows of HD halves, each row's 16-byte chunks
 * XOR-swizzled so the ldmatrix reads of eight rows hit distinct banks. The
 * mma fragment roles of a lane: row group g = lane / 4, thread t = lane % 4
 * in it; the warp's rows g and g + 8 live in the four lanes of a quad. */

/* Byte offset of (row, chunk) in a swizzled tile of HD halves per row. */
template <int HD>
static __device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * HD * 2 + ((chunk ^ (row & 7)) << 4));
}

static __device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* The rounded pair as floats, summed. */
static __device__ __forceinline__ float half2_sum(uint32_t v)
{
    float2 f = __half22float2(*(__half2 *)&v);
    return f.x + f.y;
}

/* A block's BQ query rows q0.. of a span (pos0, n_tokens) and the K/V tiles
 * they attend to, k_begin.. (n_tiles of bk positions), and the part of them
 * a unit of the block owns (unit_rows rows from wrow0: a warp's 16 by
 * default, a warp group's 64 in the wgmma kernel). Rows past the span repeat
 * its last row (their results are not stored), so no row attends to
 * nothing. */
struct fa_rows {
    int last_pos; /* the block's last row's position */
    int k_begin, n_tiles, bk;
    int wrow0, w_first_qpos, w_last_qpos;
    bool warp_live;
    int window;

    __device__ __forceinline__ fa_rows(int pos0, int n_tokens, int q0, int bq, int window_,
                                       int unit, int bk_ = FA_BK, int unit_rows = 16)
    {
        window = window_;
        bk = bk_;
        const int nq = n_tokens - q0 < bq ? n_tokens - q0 : bq;
        last_pos = pos0 + q0 + nq - 1;
        int first_pos = 0;
        if (window > 0 && pos0 + q0 - window + 1 > 0)
            first_pos = pos0 + q0 - window + 1;
        k_begin = first_pos - first_pos % bk;
        n_tiles = (last_pos - k_begin) / bk + 1;
        wrow0 = q0 + unit * unit_rows;
        warp_live = wrow0 < n_tokens;
        w_first_qpos = pos0 + (warp_live ? wrow0 : n_tokens - 1);
        w_last_qpos = pos0 + (wrow0 + unit_rows - 1 < n_tokens ? wrow0 + unit_rows - 1
                                                                : n_tokens - 1);
    }

    /* The unit has nothing to do in the tile at k0: wholly in its rows'
     * future or before their window. */
    __device__ __forceinline__ bool skips(int k0) const
    {
        return !warp_live || k0 > w_last_qpos ||
               (window > 0 && k0 + bk - 1 < w_first_qpos - window + 1);
    }

    /* Some position of the tile at k0 is out of some row's range: masks. */
    __device__ __forceinline__ bool straddles(int k0) const
    {
        return k0 + bk - 1 > w_first_qpos || (window > 0 && k0 < w_last_qpos - window + 1);
    }
};

/* One warp's running state over its 16 rows: Q as A fragments (fp16, scaled
 * into base-2 scores), O accumulators, and per row half h (rows g, g + 8)
 * the max, sum and query position. */
template <int HD>
struct fa_warp {
    static constexpr int KT = HD / 16; /* k16 steps of Q K^T */
    static constexpr int NO = HD / 8;  /* n8 tiles of O */
    uint32_t qf[KT][4];
    float o[NO][4];
    float row_max[2], row_sum[2];
    int qpos[2];

    __device__ __forceinline__ void init(void)
    {
#pragma unroll
        for (int n = 0; n < NO; n++)
            o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.0f;
    }

    /* Q fragments from f32 rows qr[h] (row g for h = 0, g + 8 for h = 1),
     * each element times qscale. */
    __device__ __forceinline__ void load_q(const float *const qr[2], float qscale, int t)
    {
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 v = *(const float2 *)(qr[j & 1] + kk * 16 + (j >> 1) * 8 + 2 * t);
                qf[kk][j] = pack_half2(v.x * qscale, v.y * qscale);
            }
        }
    }

    /* The online-softmax step of a tile of scores s (NS n8 tiles, positions
     * k0..), masked where a position is past a row or before its window when
     * the tile can be (diag): the running max and sum move on, O is rescaled,
     * and P comes out rounded to fp16 as the A fragments of P V, one per k16
     * step of the tile. In two halves for a caller whose O is still being
     * written (the warp-group kernel's P V of the tile before): the scores'
     * half, then, once O is complete, the half that rescales it and packs P. */
    template <int NS>
    __device__ __forceinline__ void softmax(float (&s)[NS][4], uint32_t (&pf)[NS / 2][4], int k0,
                                            bool diag, int window, int t)
    {
        float corr[2];
        softmax_scores<NS>(s, k0, diag, window, t, corr);
        softmax_finish<NS>(s, corr, pf);
    }

    /* The mask, the rows' new maxima and the factors corr that rescale what
     * came before; s becomes exp2(s - max), the row sums are rescaled. */
    template <int NS>
    __device__ __forceinline__ void softmax_scores(float (&s)[NS][4], int k0, bool diag,
                                                   int window, int t, float (&corr)[2])
    {
        if (diag) {
#pragma unroll
            for (int n = 0; n < NS; n++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int p = k0 + n * 8 + 2 * t + (j & 1), qp = qpos[j >> 1];
                    if (p > qp || (window > 0 && p <= qp - window))
                        s[n][j] = -INFINITY;
                }
            }
        }
        /* online softmax: rows g (h = 0) and g + 8 (h = 1) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = row_max[h];
#pragma unroll
            for (int n = 0; n < NS; n++)
                mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
            mx = osm_quad_max(mx);
            /* a row with nothing seen yet subtracts 0: no inf - inf */
            const float use_max = mx == -INFINITY ? 0.0f : mx;
            corr[h] = fast_exp2(row_max[h] - use_max);
            row_max[h] = mx;
            row_sum[h] *= corr[h];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                s[n][2 * h] = fast_exp2(s[n][2 * h] - use_max);
                s[n][2 * h + 1] = fast_exp2(s[n][2 * h + 1] - use_max);
            }
        }
    }

    /* O rescaled by corr, then P = s rounded to fp16 as the P V A fragments;
     * the row sums take the rounded values, so O stays a weighted mean of V
     * rows. */
    template <int NS>
    __device__ __forceinline__ void softmax_finish(const float (&s)[NS][4], const float (&corr)[2],
                                                   uint32_t (&pf)[NS / 2][4])
    {
        /* once the rows' maxima settle, a tile rarely moves one: the
         * accumulators are rescaled only when some row's factor is not 1
         * (multiplying by 1 changes no bit) */
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    o[n][2 * h] *= corr[h];
                    o[n][2 * h + 1] *= corr[h];
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < NS / 2; kk++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float *sn = s[2 * kk + (j >> 1)];
                int h = j & 1;
                uint32_t pv = pack_half2(sn[2 * h], sn[2 * h + 1]);
                pf[kk][j] = pv;
                row_sum[h] += half2_sum(pv);
            }
        }
    }

    /* S = Q K^T over the BK rows of a tile at kb (positions k0..), masked
     * where a position is past a row or before its window when the tile can
     * be (diag), online softmax, O += P V with V's rows at vb. By the whole
     * warp (lanes converged). */
    template <int BK = FA_BK>
    __device__ __forceinline__ void attend(uint32_t kb, uint32_t vb, int k0, bool diag,
                                           int window, int lane)
    {
        static_assert(BK % 16 == 0 && BK <= FA_BK, "whole k16 steps of a tile");
        constexpr int NS = BK / 8; /* n8 tiles of S */
        const int t = lane & 3;
        const int k_lrow = (lane >> 4) * 8 + (lane & 7), k_lchunk = (lane >> 3) & 1;
        const int v_lrow = ((lane >> 3) & 1) * 8 + (lane & 7), v_lchunk = lane >> 4;
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(kb + swz<HD>(np * 16 + k_lrow, 2 * kk + k_lchunk), b0, b1, b2, b3);
                mma_16816(s[2 * np], qf[kk], b0, b1);
                mma_16816(s[2 * np + 1], qf[kk], b2, b3);
            }
        }
        uint32_t pf[BK / 16][4];
        softmax<NS>(s, pf, k0, diag, window, t);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
#pragma unroll
            for (int dp = 0; dp < NO / 2; dp++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(vb + swz<HD>(kk * 16 + v_lrow, 2 * dp + v_lchunk), b0, b1, b2, b3);
                mma_16816(o[2 * dp], pf[kk], b0, b1);
                mma_16816(o[2 * dp + 1], pf[kk], b2, b3);
            }
        }
    }

    /* The rows' outputs O / l: row i (of wrow0 + g + 8 h) at out + i * ld,
     * rows from n_rows on not stored. */
    __device__ __forceinline__ void store(float *out, size_t ld, int wrow0, int n_rows, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float l = osm_quad_sum(row_sum[h]);
            int i = wrow0 + g + 8 * h;
            if (i >= n_rows)
                continue;
            float inv = 1.0f / l;
            float *o_row = out + (size_t)i * ld + 2 * t;
#pragma unroll
            for (int n = 0; n < NO; n++)
                *(float2 *)(o_row + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        }
    }
};

/* Shared memory fa_decode_finish takes: NW warps' (m, l) and O of 16 rows. */
#define FA_DECODE_MERGE_BYTES(hd, nw) ((size_t)(nw) * 16 * ((hd) + 2) * sizeof(float))

/* fa_decode_finish's merge, once every warp's (m, l, O) is in smem:
 * m_w, l_w [NW][16] (m base 2, l the row's whole sum), then o_w
 * [NW][16][HD], rows the query heads h0.. (the caller has synchronised the
 * block after its stores). */
template <int HD, int NW>
static __device__ __forceinline__ void fa_decode_merge(const uint8_t *smem, const struct cu_op &op,
                                                       float *part, int row, int h0, int group,
                                                       int split, int n_splits, bool whole)
{
    const float *m_w = (const float *)smem, *l_w = m_w + NW * 16;
    const float *o_w = l_w + NW * 16;
    const size_t q_dim = (size_t)op.u.attn.n_heads * HD;
    for (int i = threadIdx.x; i < group * HD; i += NW * 32) {
        const int r = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < NW; k++)
            M = fmaxf(M, m_w[k * 16 + r]);
        float L = 0.0f, A = 0.0f;
#pragma unroll
        for (int k = 0; k < NW; k++) {
            float c = fast_exp2(m_w[k * 16 + r] - M); /* 0 for a warp that saw nothing */
            L = fmaf(l_w[k * 16 + r], c, L);
            A = fmaf(o_w[((size_t)k * 16 + r) * HD + d], c, A);
        }
        const int head = h0 + r;
        if (whole) {
            op.u.attn.out[(size_t)row * q_dim + (size_t)head * HD + d] = A / L;
        } else {
            float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) *
                                   PART_STRIDE(HD);
            if (d == 0) {
                pp[0] = M * FA_LN2; /* base 2 to natural log */
                pp[1] = L;
            }
            pp[4 + d] = A;
        }
    }
}

/* The end of a decode block whose NW warps each ran fa_warp over their own
 * positions of one split of a row, the mma rows being the query heads h0..
 * h0 + group - 1 of one kv head: the warps' (m, l, O) go through smem
 * (FA_DECODE_MERGE_BYTES; the caller has synchronised the block, so the
 * buffers there are free) and are merged in warp order. The row is written
 * to op's output when the split holds all of its positions (whole), else
 * the split leaves (m in natural-log units, l, O) in part at PART_STRIDE
 * floats for cu_launch_attention_merge. */
template <int HD, int NW>
static __device__ __forceinline__ void fa_decode_finish(const fa_warp<HD> &w, uint8_t *smem,
                                                        const struct cu_op &op, float *part,
                                                        int row, int h0, int group, int split,
                                                        int n_splits, bool whole)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *m_w = (float *)smem, *l_w = m_w + NW * 16;
    float *o_w = l_w + NW * 16;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        float l = osm_quad_sum(w.row_sum[h]);
        if (t == 0) {
            m_w[warp * 16 + r] = w.row_max[h];
            l_w[warp * 16 + r] = l;
        }
        float *o = o_w + ((size_t)warp * 16 + r) * HD + 2 * t;
#pragma unroll
        for (int n = 0; n < fa_warp<HD>::NO; n++)
            *(float2 *)(o + n * 8) = make_float2(w.o[n][2 * h], w.o[n][2 * h + 1]);
    }
    __syncthreads();
    fa_decode_merge<HD, NW>(smem, op, part, row, h0, group, split, n_splits, whole);
}

/* Where a position's K/V row starts in the cache (in elements), or
 * FA_NO_ROW past the last position: those rows are zero-filled. */
#define FA_NO_ROW (~(size_t)0)

/* One kv head's K/V tiles of FA_BK positions from k_begin on, copied from
 * the paged cache by a block of THREADS threads with 16-byte cp.async, one
 * tile ahead of the tile being computed (two buffers each, rows swizzled as
 * swz says). Where each row starts in the cache is looked up in the block
 * table by the first FA_BK threads, two tiles ahead, into a small table in
 * shared memory (the block id loaded one tile earlier, so its latency hides
 * behind a tile). Positions past last_pos are zero-filled. Use: start(),
 * then per tile it: wait(it), compute on k_tile(it) / v_tile(it),
 * __syncthreads() (the buffer is refilled after the next wait). */
template <int HD, int THREADS>
struct fa_kv_stream {
    static constexpr int CPR = HD / 8;        /* 16-byte chunks per K/V row */
    static constexpr int RPP = THREADS / CPR; /* rows per pass of the copy */
    static constexpr int PASSES = FA_BK / RPP;
    static constexpr uint32_t TILE_BYTES = FA_BK * HD * sizeof(__half);
    /* K and V, two buffers each, then three tiles' row offsets */
    static constexpr size_t SMEM = 4 * (size_t)TILE_BYTES + 3 * FA_BK * sizeof(size_t);
    static_assert(THREADS % CPR == 0 && FA_BK % RPP == 0 && THREADS >= FA_BK, "copy shape");

    const __half *kc, *vc;
    const uint32_t *bt;
    int bs, last_pos, n_tiles;
    size_t layer_base, kv_dim, head_off;
    uint32_t ks0;
    size_t *row_off; /* [3][FA_BK]: tile j's rows in slot j % 3 */
    int slot_next;   /* the slot of the tile after the one computed */
    uint32_t next_block;
    int next_pos;

    __device__ __forceinline__ size_t row_of(uint32_t block, int pos) const
    {
        return pos <= last_pos ? ((layer_base + block) * bs + pos % bs) * kv_dim + head_off
                               : FA_NO_ROW;
    }

    /* Issues this thread's copies of the tile whose rows start at offs[]
     * into the buffer at k_dst (K, then V TILE_BYTES after it). */
    __device__ __forceinline__ void copy(uint32_t k_dst, const size_t *offs) const
    {
        const int chunk = threadIdx.x % CPR, row = threadIdx.x / CPR;
#pragma unroll
        for (int i = 0; i < PASSES; i++) {
            int r = row + i * RPP;
            size_t off = offs[r];
            bool valid = off != FA_NO_ROW;
            off = valid ? off + chunk * 8 : 0;
            cp_async16(k_dst + swz<HD>(r, chunk), kc + off, valid);
            cp_async16(k_dst + TILE_BYTES + swz<HD>(r, chunk), vc + off, valid);
        }
    }

    /* Finds the first tiles' rows and issues tile 0's copies (the whole
     * block; smem holds SMEM bytes). */
    __device__ __forceinline__ void start(uint8_t *smem, const struct cu_kv &kv, int layer,
                                          const uint32_t *bt_, size_t head_off_, int k_begin,
                                          int last_pos_, int n_tiles_)
    {
        kc = (const __half *)kv.k;
        vc = (const __half *)kv.v;
        bt = bt_;
        bs = kv.block_size;
        last_pos = last_pos_;
        n_tiles = n_tiles_;
        layer_base = (size_t)layer * kv.n_blocks;
        kv_dim = (size_t)kv.n_kv_heads * HD;
        head_off = head_off_;
        ks0 = smem_addr(smem);
        row_off = (size_t *)(smem + 4 * TILE_BYTES);
        slot_next = 1;
        next_block = 0;
        next_pos = k_begin + threadIdx.x;
        if (threadIdx.x < FA_BK) {
            for (int j = 0; j < 3 && j < n_tiles; j++, next_pos += FA_BK) {
                next_block = next_pos <= last_pos ? __ldg(bt + next_pos / bs) : 0;
                if (j < 2)
                    row_off[j * FA_BK + threadIdx.x] = row_of(next_block, next_pos);
            }
            next_pos -= FA_BK; /* the position of next_block: tile 2's */
        }
        __syncthreads();
        copy(ks0, row_off);
        cp_async_commit();
    }

    /* Issues tile it + 1's copies and waits for tile it's (the whole block). */
    __device__ __forceinline__ void wait(int it)
    {
        if (it + 1 < n_tiles)
            copy(ks0 + ((it + 1) & 1) * 2 * TILE_BYTES, row_off + slot_next * FA_BK);
        slot_next = slot_next == 2 ? 0 : slot_next + 1;
        if (threadIdx.x < FA_BK && it + 2 < n_tiles) {
            row_off[slot_next * FA_BK + threadIdx.x] = row_of(next_block, next_pos);
            next_pos += FA_BK;
            if (it + 3 < n_tiles && next_pos <= last_pos)
                next_block = __ldg(bt + next_pos / bs);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
    }

    __device__ __forceinline__ uint32_t k_tile(int it) const
    {
        return ks0 + (it & 1) * 2 * TILE_BYTES;
    }
    __device__ __forceinline__ uint32_t v_tile(int it) const { return k_tile(it) + TILE_BYTES; }
};

#endif
