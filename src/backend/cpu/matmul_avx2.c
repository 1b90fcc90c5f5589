/* backend/cpu/matmul_avx2.c — AVX2/FMA matmul kernels: a bandwidth-bound decode GEMV and a 6x16 packed-panel GEMM. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/matmul_kernels.h"
#include "base/bf16.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* GEMM blocking for Zen 3 / Haswell-class cores (32 KiB L1d, 512 KiB+ L2).
 * MR x NR = 6 x 16: 12 ymm accumulators hide the 4-cycle FMA latency on two
 * FMA pipes, and each k step needs 2 vector loads + 6 broadcasts for 12 FMAs,
 * well inside the load ports. KC = 256 keeps one packed W panel (16 x 256 f32
 * = 16 KiB) in L1 while every token panel streams past it; MC = 192 tokens
 * make the packed x block 192 KiB, resident in L2 for the whole N sweep. */
#define MR 6
#define NR 16
#define KC 256
#define MC 192

/* GEMV runs while T is at most this. It streams W from memory once and
 * re-reads each row piece from L1 for every token row; GEMM's packing
 * handles only ~8 GB/s of weights on two Zen 3 cores, so GEMM wins from
 * about 12 tokens (measured at K=1024, N=3072: 820 vs 1050 us at T=8, even
 * at T=12). */
#define GEMV_MAX_T 10
#define GEMV_STEP 32 /* columns between prefetches: a 64-byte line of each bf16 row */

/* ---- helpers ----------------------------------------------------------- */

/* bf16 -> f32 is the bf16 bits moved to the top half of a 32-bit word. */
static ALWAYS_INLINE __m256 load8_w(const void *row, int64_t c, bool bf16)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)row + c);
}

static ALWAYS_INLINE float load1_w(const void *row, int64_t c, bool bf16)
{
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[c]) : ((const float *)row)[c];
}

/* Round to the nearest bf16, ties to even, NaN kept quiet: bit-identical to
 * f32_to_bf16 in base/bf16.h, returned widened back to f32. */
static ALWAYS_INLINE __m256 round_bf16(__m256 v)
{
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_and_si256(r, hi_mask);
    __m256i quiet = _mm256_or_si256(_mm256_and_si256(u, hi_mask), _mm256_set1_epi32(0x00400000));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(quiet), nan);
}

/* r[i] = row i of an 8x8 block in, column i out. */
static ALWAYS_INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
    }
}

/* ---- GEMV -------------------------------------------------------------- */

static void prepare_x_f32(const float *x, int64_t n, void *dst_)
{
    float *dst = dst_;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, round_bf16(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        dst[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

/* ---- decode GEMV ---------------------------------------------------------
 *
 * RB weight rows against TB token rows at a time, one accumulator per
 * (weight row, token row): each output is one FMA chain over its row's
 * 8-column pieces in column order, reduced by the same 8-way transposing sum
 * (7 adds, 14 shuffles for 8 outputs) and its K tail (under 8 columns) added
 * in scalar after it. So in FAST mode a token row's outputs are the same bits
 * whatever else shares the call, one row or eight, and whichever block of
 * weight rows an output falls in — a speculative verify step's rows are
 * those of plain decode steps.
 *
 * Per 8 columns a block loads TB + RB vectors for TB * RB FMAs, so more
 * weight rows a block save loads while the accumulators and the vectors held
 * fit 16 ymm registers: RB = 8, 4, 3, 2, 2, 2, 1, 1 for TB = 1..8, the
 * fastest of the sizes that fit on a Zen 3 (bench/RESULTS.md; one token row
 * as 8 interleaved weight rows ran 6% faster than the row-after-row stream
 * it replaced, and three rows 14%). The next block's rows (contiguous with
 * these) are prefetched as one stream, a line a row per 32 columns: the
 * hardware prefetchers alone keep too few lines in flight for interleaved
 * rows. */

/* Lanes j of the result are the sums of a[j]'s 8 lanes. */
static ALWAYS_INLINE __m256 hsum8_transposed(const __m256 a[8])
{
    __m256 b[4], c[2];
    for (int i = 0; i < 4; i++) /* per 128-bit lane: a[2i] and a[2i+1], two partial sums each */
        b[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++) { /* per 128-bit lane: a[4i..4i+3] */
        __m256d lo = _mm256_unpacklo_pd(_mm256_castps_pd(b[2 * i]), _mm256_castps_pd(b[2 * i + 1]));
        __m256d hi = _mm256_unpackhi_pd(_mm256_castps_pd(b[2 * i]), _mm256_castps_pd(b[2 * i + 1]));
        c[i] = _mm256_add_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20),
                         _mm256_permute2f128_ps(c[0], c[1], 0x31));
}

/* Most accumulators a block holds (TB * RB), and the most weight or token rows it holds;
 * the accumulator arrays get 7 more, zeros, so the last group of 8 is whole for the
 * transposing sum. */
#define GEMV_MAX_ACC 12

/* The 8 columns at c of every (token, row) pair: accumulator t * RB + i. */
static ALWAYS_INLINE void gemv_piece(const int RB, const int TB, const bool bf16, const float *x,
                                     int64_t K, const char *const wr[], int64_t c, __m256 acc[])
{
    if (TB <= RB) {
        __m256 xv[GEMV_MAX_ACC];
        for (int t = 0; t < TB; t++)
            xv[t] = _mm256_loadu_ps(x + t * K + c);
        for (int i = 0; i < RB; i++) {
            __m256 wv = load8_w(wr[i], c, bf16);
            for (int t = 0; t < TB; t++)
                acc[t * RB + i] = _mm256_fmadd_ps(wv, xv[t], acc[t * RB + i]);
        }
    } else {
        __m256 wv[GEMV_MAX_ACC];
        for (int i = 0; i < RB; i++)
            wv[i] = load8_w(wr[i], c, bf16);
        for (int t = 0; t < TB; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * K + c);
            for (int i = 0; i < RB; i++)
                acc[t * RB + i] = _mm256_fmadd_ps(wv[i], xv, acc[t * RB + i]);
        }
    }
}

/* Weight rows [r, r + RB) against token rows [0, TB) of x (f32, rounded by
 * prepare_x). */
static ALWAYS_INLINE void gemv_block(const int RB, const int TB, const bool bf16, const float *x,
                                     int64_t K, const void *w, const float *bias, float *y,
                                     int64_t N, int64_t r)
{
    const size_t esize = bf16 ? 2 : 4;
    const char *wr[GEMV_MAX_ACC];
    for (int i = 0; i < RB; i++)
        wr[i] = (const char *)w + (size_t)(r + i) * (size_t)K * esize;
    const char *pf = (const char *)w + (size_t)(r + RB) * (size_t)K * esize;
    const size_t pf_step = (size_t)RB * GEMV_STEP * esize;
    __m256 acc[GEMV_MAX_ACC + 7];
    const int n_acc = TB * RB;
    for (int j = 0; j < n_acc + 7; j++)
        acc[j] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + GEMV_STEP <= K; c += GEMV_STEP) {
        for (size_t q = 0; q < pf_step; q += 64)
            _mm_prefetch(pf + q, _MM_HINT_T0);
        pf += pf_step;
        for (int u = 0; u < GEMV_STEP; u += 8)
            gemv_piece(RB, TB, bf16, x, K, wr, c + u, acc);
    }
    for (; c + 8 <= K; c += 8)
        gemv_piece(RB, TB, bf16, x, K, wr, c, acc);
    float s[GEMV_MAX_ACC + 7];
    for (int j = 0; j < n_acc; j += 8)
        _mm256_storeu_ps(s + j, hsum8_transposed(acc + j));
    for (int t = 0; t < TB; t++)
        for (int i = 0; i < RB; i++) {
            float v = s[t * RB + i];
            for (int64_t cc = c; cc < K; cc++)
                v += load1_w(wr[i], cc, bf16) * x[t * K + cc];
            y[t * N + r + i] = v + (bias ? bias[r + i] : 0.0f);
        }
}

static ALWAYS_INLINE void gemv_blocks(const int RB, const int TB, const bool bf16, const float *x,
                                      int64_t K, const void *w, const float *bias, float *y,
                                      int64_t N, int64_t r0, int64_t r1)
{
    int64_t r = r0;
    for (; r + RB <= r1; r += RB)
        gemv_block(RB, TB, bf16, x, K, w, bias, y, N, r);
    for (; r < r1; r++)
        gemv_block(1, TB, bf16, x, K, w, bias, y, N, r);
}

#define GEMV_CASE(tb, rb)                                                                      \
    case tb:                                                                                   \
        if (bf16)                                                                              \
            gemv_blocks(rb, tb, true, xt, K, w, bias, yt, N, r0, r1);                          \
        else                                                                                   \
            gemv_blocks(rb, tb, false, xt, K, w, bias, yt, N, r0, r1);                         \
        break;

/* T token rows, 8 at a time (a last group of one goes with the group before
 * it, split as 5 + 4). */
static void gemv_run(const void *x_, int64_t T, int64_t K, const void *w, enum dtype dtype,
                     const float *bias, float *y, int64_t N, int64_t r0, int64_t r1)
{
    const float *x = x_;
    const bool bf16 = dtype == DTYPE_BF16;
    for (int64_t t = 0; t < T;) {
        int64_t n = T - t <= 8 ? T - t : T - t == 9 ? 5 : 8;
        const float *xt = x + t * K;
        float *yt = y + t * N;
        switch (n) {
            GEMV_CASE(1, 8)
            GEMV_CASE(2, 4)
            GEMV_CASE(3, 3)
            GEMV_CASE(4, 2)
            GEMV_CASE(5, 2)
            GEMV_CASE(6, 2)
            GEMV_CASE(7, 1)
            default:
            GEMV_CASE(8, 1)
        }
        t += n;
    }
}

/* ---- EXACT-mode GEMV in the GEMM's order --------------------------------
 *
 * As in the AVX-512 file: EXACT mode's decode-sized calls sum each output
 * exactly as the GEMM below does (K blocks of KC, each one FMA chain from
 * zero in column order, added to the bias or the sum so far), so a token's
 * bits do not depend on how many tokens share the call. Eight weight rows sit
 * in the lanes of a vector through an 8x8 transpose of 32-byte row pieces
 * (bf16 pairs as 32-bit words, widened after). */

#define EXACT_MAX_T 8
#define EXACT_TT 4 /* tokens per pass: 16 ymm registers hold G * TT chains + a tile */

/* 8 rows x kn columns (at most 32 bytes of each) from column c of row r;
 * fewer rows or columns load as zeros. */
static ALWAYS_INLINE void exact_load(const bool bf16, const void *w, int64_t K, int64_t r,
                                     int n_rows, int64_t c, const int kn, __m256 v[8])
{
    const size_t esize = bf16 ? 2 : 4;
    const int step = bf16 ? 16 : 8;
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const char *src = (const char *)w + ((size_t)(r + i) * (size_t)K + (size_t)c) * esize;
        if (i >= n_rows) {
            v[i] = _mm256_setzero_ps();
        } else if (kn == step) {
            v[i] = _mm256_loadu_ps((const float *)src);
        } else {
            float tmp[8] = {0};
            memcpy(tmp, src, (size_t)kn * esize);
            v[i] = _mm256_loadu_ps(tmp);
        }
    }
}

/* kn (<= one tile) columns of a transposed tile into TT chains: lane i of
 * v[jj] is word jj of row i (a bf16 pair: even column low, odd high). With
 * kn a constant the checks fold away and v stays in registers. */
static ALWAYS_INLINE void exact_tile(const int TT, const bool bf16, const float *xc, int64_t K,
                                     const __m256 v[8], const int kn, __m256 acc[])
{
    const __m256i hi_half = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 8
    for (int jj = 0; jj < 8; jj++) {
        if (bf16) {
            __m256i pair = _mm256_castps_si256(v[jj]);
            if (2 * jj < kn) {
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++)
                    acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(xc + t * K + 2 * jj), we, acc[t]);
            }
            if (2 * jj + 1 < kn) {
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(pair, hi_half));
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++)
                    acc[t] =
                        _mm256_fmadd_ps(_mm256_broadcast_ss(xc + t * K + 2 * jj + 1), wo, acc[t]);
            }
        } else if (jj < kn) {
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++)
                acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(xc + t * K + jj), v[jj], acc[t]);
        }
    }
}

/* Units of G groups of 8 rows against TT tokens: G * TT chains in flight. */
static ALWAYS_INLINE void exact_unit(const int G, const int TT, const bool bf16, const float *x,
                                     int64_t K, const void *w, const float *bias, float *y,
                                     int64_t N, int64_t r, int n_rows, int next_rows)
{
    const int step = bf16 ? 16 : 8;
    /* Many row streams, each starting cold: the next unit's rows
     * (contiguous) are prefetched while this one computes, a few lines per tile. */
    const size_t esize = bf16 ? 2 : 4;
    const char *pf = (const char *)w + (size_t)(r + n_rows) * (size_t)K * esize;
    const char *pf_end = pf + (size_t)next_rows * (size_t)K * esize;
    const int64_t tiles = (int64_t)G * ((K + step - 1) / step);
    const int64_t pf_per_tile = ((int64_t)(pf_end - pf) / 64 + tiles - 1) / tiles;
    for (int64_t pc = 0; pc < K; pc += KC) {
        const int64_t kend = pc + KC < K ? pc + KC : K;
        __m256 acc[2][EXACT_TT];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++)
                acc[g][t] = _mm256_setzero_ps();
        int64_t c = pc;
        for (; c + step <= kend; c += step) {
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) {
                for (int64_t q = 0; q < pf_per_tile && pf < pf_end; q++, pf += 64)
                    _mm_prefetch(pf, _MM_HINT_T1);
                __m256 v[8];
                exact_load(bf16, w, K, r + g * 8, n_rows - g * 8, c, step, v);
                transpose8(v);
                exact_tile(TT, bf16, x + c, K, v, step, acc[g]);
            }
        }
        if (c < kend) {
            const int kn = (int)(kend - c);
            for (int g = 0; g < G; g++) {
                __m256 v[8];
                exact_load(bf16, w, K, r + g * 8, n_rows - g * 8, c, kn, v);
                transpose8(v);
                exact_tile(TT, bf16, x + c, K, v, kn, acc[g]);
            }
        }
        /* store_row's rule: (first ? bias or 0 : the sum so far) + this block */
        for (int g = 0; g < G; g++) {
            int n = n_rows - g * 8;
            if (n <= 0)
                break;
            int64_t r0 = r + g * 8;
            for (int t = 0; t < TT; t++) {
                float *yt = y + t * N + r0;
                float a[8];
                _mm256_storeu_ps(a, acc[g][t]);
                for (int j = 0; j < n && j < 8; j++)
                    yt[j] = (pc > 0 ? yt[j] : bias ? bias[r0 + j] : 0.0f) + a[j];
            }
        }
    }
}

static ALWAYS_INLINE void exact_rows(const int G, const int TT, const bool bf16, const float *x,
                                     int64_t K, const void *w, const float *bias, float *y,
                                     int64_t N, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += 8 * G) {
        int n = r1 - r < 8 * G ? (int)(r1 - r) : 8 * G;
        int64_t after = r1 - r - n;
        exact_unit(G, TT, bf16, x, K, w, bias, y, N, r, n, after < 8 * G ? (int)after : 8 * G);
    }
}

#define EXACT_CASE(tt, g)                                                                      \
    case tt:                                                                                   \
        if (bf16)                                                                              \
            exact_rows(g, tt, true, x, K, w, bias, y, N, r0, r1);                              \
        else                                                                                   \
            exact_rows(g, tt, false, x, K, w, bias, y, N, r0, r1);                             \
        break;

static void gemv_exact_run(const void *x_, int64_t T, int64_t K, const void *w, enum dtype dtype,
                           const float *bias_, float *y_, int64_t N, int64_t r0, int64_t r1)
{
    bool bf16 = dtype == DTYPE_BF16;
    for (int64_t t0 = 0; t0 < T; t0 += EXACT_TT) {
        const float *x = (const float *)x_ + t0 * K;
        const float *bias = bias_;
        float *y = y_ + t0 * N;
        switch (T - t0 < EXACT_TT ? T - t0 : EXACT_TT) {
            EXACT_CASE(1, 2)
            EXACT_CASE(2, 2)
            EXACT_CASE(3, 1)
        default:
            EXACT_CASE(4, 1)
        }
    }
}

/* ---- GEMM packing ------------------------------------------------------ */

/* Panels of 6 token rows, k-major: dst[k * 6 + i] = x[i, k]. Eight columns
 * at a time go through an 8x8 transpose (rows 6 and 7 are zeros). */
static void pack_x(const float *x, int64_t ldx, int m, int k, bool round, void *dst_)
{
    float *dst = dst_;
    for (int p = 0; p < m; p += MR) {
        int mp = m - p < MR ? m - p : MR;
        const float *rows[MR];
        for (int i = 0; i < MR; i++)
            rows[i] = x + (int64_t)(p + (i < mp ? i : 0)) * ldx;
        float *d = dst + (size_t)(p / MR) * MR * (size_t)k;
        int c = 0;
        for (; c + 8 <= k; c += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++) {
                v[i] = i < mp ? _mm256_loadu_ps(rows[i] + c) : _mm256_setzero_ps();
                if (round)
                    v[i] = round_bf16(v[i]);
            }
            transpose8(v);
            for (int jj = 0; jj < 8; jj++) {
                float *o = d + (size_t)(c + jj) * MR;
                _mm_storeu_ps(o, _mm256_castps256_ps128(v[jj]));
                _mm_storel_pi((__m64 *)(o + 4), _mm256_extractf128_ps(v[jj], 1));
            }
        }
        for (; c < k; c++)
            for (int i = 0; i < MR; i++) {
                float v = i < mp ? rows[i][c] : 0.0f;
                d[c * MR + i] = round ? bf16_to_f32(f32_to_bf16(v)) : v;
            }
    }
}

/* One panel of 16 weight rows, k-major f32: dst[k * 16 + j] = W[j, k],
 * widened from bf16 on the way. Full panels go 8 rows x 8 columns through
 * transposes; the panel at the end of N (and the K tail) goes element-wise. */
static ALWAYS_INLINE void pack_w_impl(const bool bf16, const void *w, int64_t ldw, int n, int k,
                                      float *dst)
{
    const size_t esize = bf16 ? 2 : 4;
    int c = 0;
    if (n == NR) {
        for (; c + 8 <= k; c += 8) {
            for (int g = 0; g < 2; g++) {
                __m256 v[8];
                for (int i = 0; i < 8; i++)
                    v[i] = load8_w((const char *)w + (size_t)(g * 8 + i) * (size_t)ldw * esize, c,
                                   bf16);
                transpose8(v);
                for (int jj = 0; jj < 8; jj++)
                    _mm256_store_ps(dst + (size_t)(c + jj) * NR + g * 8, v[jj]);
            }
        }
    }
    for (; c < k; c++)
        for (int j = 0; j < NR; j++)
            dst[(size_t)c * NR + j] =
                j < n ? load1_w((const char *)w + (size_t)j * (size_t)ldw * esize, c, bf16) : 0.0f;
}

static void pack_w(const void *w, enum dtype dtype, int64_t ldw, int n, int k, void *dst)
{
    if (dtype == DTYPE_BF16)
        pack_w_impl(true, w, ldw, n, k, dst);
    else
        pack_w_impl(false, w, ldw, n, k, dst);
}

/* ---- GEMM microkernel -------------------------------------------------- */

/* One accumulator row into c under the driver's first/bias/accumulate
 * rule; a partial panel (n < 16) goes through a small buffer. */
static ALWAYS_INLINE void store_row(float *ci, __m256 a0, __m256 a1, int n, const float *bias,
                                    bool first)
{
    if (n == NR) {
        __m256 c0, c1;
        if (first) {
            c0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
            c1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
        } else {
            c0 = _mm256_loadu_ps(ci);
            c1 = _mm256_loadu_ps(ci + 8);
        }
        _mm256_storeu_ps(ci, _mm256_add_ps(c0, a0));
        _mm256_storeu_ps(ci + 8, _mm256_add_ps(c1, a1));
        return;
    }
    float row[NR];
    _mm256_storeu_ps(row, a0);
    _mm256_storeu_ps(row + 8, a1);
    for (int j = 0; j < n; j++)
        ci[j] = (first ? (bias ? bias[j] : 0.0f) : ci[j]) + row[j];
}

/* Named accumulators rather than an array: GCC keeps an array of 12 ymm in
 * registers but also stores it to the stack on every k step, halving the
 * FMA rate. Rows past M are dead code once M is a constant. */
#define FMA_ROW(i, lo, hi)                                                                     \
    if (M > i) {                                                                               \
        __m256 ai = _mm256_broadcast_ss(a + i);                                                \
        lo = _mm256_fmadd_ps(ai, b0, lo);                                                      \
        hi = _mm256_fmadd_ps(ai, b1, hi);                                                      \
    }
#define STORE_ROW(i, lo, hi)                                                                   \
    if (M > i)                                                                                 \
        store_row(c + i * ldc, lo, hi, n, bias, first);

static ALWAYS_INLINE void kernel_m(const int M, int n, int k, const float *a, const float *b,
                                   float *c, int64_t ldc, const float *bias, bool first)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int p = 0; p < k; p++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        FMA_ROW(0, c00, c01)
        FMA_ROW(1, c10, c11)
        FMA_ROW(2, c20, c21)
        FMA_ROW(3, c30, c31)
        FMA_ROW(4, c40, c41)
        FMA_ROW(5, c50, c51)
        a += MR;
        b += NR;
    }
    STORE_ROW(0, c00, c01)
    STORE_ROW(1, c10, c11)
    STORE_ROW(2, c20, c21)
    STORE_ROW(3, c30, c31)
    STORE_ROW(4, c40, c41)
    STORE_ROW(5, c50, c51)
}

static void kernel(int m, int n, int k, const void *a, const void *b, float *c, int64_t ldc,
                   const float *bias, bool first)
{
    switch (m) {
    case 6: kernel_m(6, n, k, a, b, c, ldc, bias, first); break;
    case 5: kernel_m(5, n, k, a, b, c, ldc, bias, first); break;
    case 4: kernel_m(4, n, k, a, b, c, ldc, bias, first); break;
    case 3: kernel_m(3, n, k, a, b, c, ldc, bias, first); break;
    case 2: kernel_m(2, n, k, a, b, c, ldc, bias, first); break;
    default: kernel_m(1, n, k, a, b, c, ldc, bias, first); break;
    }
}

const struct mm_gemv cpu_mm_gemv_avx2 = {
    .max_t = GEMV_MAX_T,
    .x_bf16 = false,
    .prepare_x = prepare_x_f32,
    .run = gemv_run,
};

const struct mm_gemm cpu_mm_gemm_avx2 = {
    .mr = MR, .nr = NR, .kc = KC, .mc = MC, .k_align = 1,
    .a_elem = 4, .b_elem = 4,
    .pack_x = pack_x, .pack_w = pack_w, .kernel = kernel,
};

const struct mm_gemv cpu_mm_gemv_exact_avx2 = {
    .max_t = EXACT_MAX_T,
    .x_bf16 = false,
    .prepare_x = NULL, /* EXACT mode only: x is used as it is */
    .run = gemv_exact_run,
};
