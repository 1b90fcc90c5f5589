/* backend/cpu/matmul_avx512.c — AVX-512 matmul kernels: f32 GEMV/GEMM, and vdpbf16ps GEMV/GEMM for bf16 weights in FAST mode. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include <string.h>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/vec_avx512.h"
#include "base/panels.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* GEMM blocking for Sapphire Rapids-class cores (48 KiB L1d, 2 MiB L2).
 * MR x NR = 12 x 32: 24 zmm accumulators (of 32 registers) cover the FMA
 * latency on two FMA ports with 2 vector loads + 12 broadcasts per 24 FMAs.
 * KC = 256 keeps the packed W panel (32 x 256 f32 = 32 KiB; 16 KiB as bf16
 * pairs) in L1; MC = 240 tokens make the x block 240 KiB (f32) or 120 KiB
 * (bf16), L2-resident for the whole sweep over N. */
#define MR 12
#define NR 32
#define KC 256
#define MC 240

/* As in the AVX2 GEMV: up to this many tokens each weight row streams once,
 * as one sequential stream per thread, prefetched this far ahead. On
 * Sapphire Rapids (16 threads, K=1024 N=3072) GEMM took 157 us at T=5,
 * twice GEMV's 80 us at T=4, and still 171 us at T=8. */
#define GEMV_MAX_T 8
#define GEMV_PREFETCH_BYTES 1024
/* Column pairs ahead that the panel GEMV prefetches in each panel (4 KB);
 * without, 8 rows of the house model's step took 413-487 us against 336-368. */
#define GEMV_PANEL_PREFETCH_PAIRS 32

/* ---- helpers ----------------------------------------------------------- */

static ALWAYS_INLINE __mmask32 mask32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1);
}

/* Up to 16 weights from column c of a row (n valid, the rest zero), as f32. */
static ALWAYS_INLINE __m512 load16_w(const void *row, int64_t c, int64_t n, bool bf16)
{
    if (bf16) {
        __m256i h = _mm256_maskz_loadu_epi16(mask16(n), (const uint16_t *)row + c);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(mask16(n), (const float *)row + c);
}

static ALWAYS_INLINE __m512 round_bf16(__m512 v)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16));
}

/* r[i] = row i of a 16x16 block of 32-bit words in, column i out. */
static ALWAYS_INLINE void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + q], lane l: rows 4g..4g+3 of column 4l + q. */
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    /* A 4x4 transpose of 128-bit lanes per q. */
    for (int q = 0; q < 4; q++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[q], u[4 + q], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i v1 = _mm512_shuffle_i32x4(u[q], u[4 + q], _MM_SHUFFLE(3, 2, 3, 2));
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i v3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], _MM_SHUFFLE(3, 2, 3, 2));
        r[q] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
        r[4 + q] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
        r[8 + q] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + q] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* Stores an mr x nr accumulator row pair into c with the driver's
 * first/bias/accumulate rule; n (< 32) masks the columns. */
static ALWAYS_INLINE void store_row(float *ci, __m512 a0, __m512 a1, int n, const float *bias,
                                    bool first)
{
    __mmask16 k0 = mask16(n), k1 = mask16(n - 16 > 0 ? n - 16 : 0);
    __m512 c0, c1;
    if (first) {
        c0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
        c1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
    } else {
        c0 = _mm512_maskz_loadu_ps(k0, ci);
        c1 = _mm512_maskz_loadu_ps(k1, ci + 16);
    }
    _mm512_mask_storeu_ps(ci, k0, _mm512_add_ps(c0, a0));
    _mm512_mask_storeu_ps(ci + 16, k1, _mm512_add_ps(c1, a1));
}

/* ---- multi-row decode GEMV (FAST mode) ----------------------------------
 *
 * A decode step of T (1..8) sequences: every weight row is loaded once per
 * vector for all T token rows, and RB weight rows are in flight together
 * with one accumulator per (weight row, token row), RB * T <= 16 (1 x 16,
 * 2 x 8, 3 x 5, 4 x 4, 5 x 3, 8 x 2). The per-row horizontal sums that cost
 * the one-token kernel's row-by-row loop as much as its dot products (a
 * 4-way sum and a reduce per output) become one 16-way transposing sum per
 * block: 15 adds and 30 shuffles for 16 outputs, written with one scatter.
 * With T = 1 the 16 rows of a block land in consecutive outputs, so a block
 * is one masked store. */

/* Lane j of the result is the sum of a[j]'s 16 lanes. */
static ALWAYS_INLINE __m512 hsum16_transposed(const __m512 a[16])
{
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: a[2i] and a[2i+1], two partial sums each */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: a[4i..4i+3], one partial sum each */
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        c[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    for (int i = 0; i < 2; i++) /* 128-bit lanes 0+1 and 2+3 of c[2i], then of c[2i+1] */
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One block: weight rows [r, r + RB) against token rows [0, TB) of x.
 * dot: x is bf16 and the weights bf16 pairs for vdpbf16ps, 32 columns a
 * vector; else x is f32 and each 16 weights are widened from bf16 (bf16w)
 * or loaded as f32. Accumulator j = t * RB + i is (token t, row i); out
 * holds each lane's offset in y from y + r (token t's row i: t * N + i).
 * The next block's rows (contiguous with these) are prefetched a few lines
 * per vector, as one stream. */
static ALWAYS_INLINE void gemv_multi_block(const int RB, const int TB, const bool dot,
                                           const bool bf16w, const void *x, int64_t K,
                                           const void *w, const float *bias, float *y, int64_t N,
                                           int64_t r, __m512i out)
{
    const size_t esize = dot || bf16w ? 2 : 4;
    const int step = dot ? 32 : 16;
    const char *wr[16];
    for (int i = 0; i < RB; i++)
        wr[i] = (const char *)w + (size_t)(r + i) * (size_t)K * esize;
    const char *pf = (const char *)w + (size_t)(r + RB) * (size_t)K * esize;
    const size_t pf_step = (size_t)RB * (size_t)step * esize;
    __m512 acc[16];
    for (int j = 0; j < 16; j++)
        acc[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += step) {
        const bool full = c + step <= K;
        for (size_t q = 0; q < pf_step; q += 64)
            _mm_prefetch(pf + q, _MM_HINT_T0);
        pf += pf_step;
        if (dot) {
            const __mmask32 km = full ? (__mmask32)0xffffffffu : mask32(K - c);
            __m512bh xv[16], wv[16];
            for (int t = 0; t < TB; t++)
                xv[t] = (__m512bh)_mm512_maskz_loadu_epi16(km, (const uint16_t *)x + t * K + c);
            for (int i = 0; i < RB; i++)
                wv[i] = (__m512bh)_mm512_maskz_loadu_epi16(km, (const uint16_t *)wr[i] + c);
            for (int t = 0; t < TB; t++)
                for (int i = 0; i < RB; i++)
                    acc[t * RB + i] = _mm512_dpbf16_ps(acc[t * RB + i], wv[i], xv[t]);
        } else {
            const int64_t n = K - c;
            __m512 xv[16], wv[16];
            for (int t = 0; t < TB; t++)
                xv[t] = _mm512_maskz_loadu_ps(mask16(n), (const float *)x + t * K + c);
            for (int i = 0; i < RB; i++)
                wv[i] = load16_w(wr[i], c, n, bf16w);
            for (int t = 0; t < TB; t++)
                for (int i = 0; i < RB; i++)
                    acc[t * RB + i] = _mm512_fmadd_ps(wv[i], xv[t], acc[t * RB + i]);
        }
    }
    __m512 s = hsum16_transposed(acc);
    const __mmask16 live = mask16(RB * TB);
    if (bias) {
        /* lane j's bias is bias[r + j % RB] */
        __m512i which = _mm512_set_epi32(15 % RB, 14 % RB, 13 % RB, 12 % RB, 11 % RB, 10 % RB,
                                         9 % RB, 8 % RB, 7 % RB, 6 % RB, 5 % RB, 4 % RB, 3 % RB,
                                         2 % RB, 1 % RB, 0);
        __m512 b = _mm512_maskz_loadu_ps(mask16(RB), bias + r);
        s = _mm512_add_ps(s, _mm512_permutexvar_ps(which, b));
    }
    if (TB == 1)
        _mm512_mask_storeu_ps(y + r, live, s);
    else
        _mm512_mask_i32scatter_ps(y + r, live, out, s, 4);
}

/* Rows [r0, r1) against TB token rows: blocks of RB, then single rows. */
static ALWAYS_INLINE void gemv_multi_rows(const int RB, const int TB, const bool dot,
                                          const bool bf16w, const void *x, int64_t K,
                                          const void *w, const float *bias, float *y, int64_t N,
                                          int64_t r0, int64_t r1)
{
    int32_t off1[16], offb[16];
    for (int j = 0; j < 16; j++) {
        off1[j] = (int32_t)(j * N); /* RB = 1: lane j is token j */
        offb[j] = (int32_t)((j / RB) * N + j % RB);
    }
    const __m512i out1 = _mm512_loadu_si512(off1), outb = _mm512_loadu_si512(offb);
    int64_t r = r0;
    for (; r + RB <= r1; r += RB)
        gemv_multi_block(RB, TB, dot, bf16w, x, K, w, bias, y, N, r, outb);
    for (; r < r1; r++)
        gemv_multi_block(1, TB, dot, bf16w, x, K, w, bias, y, N, r, out1);
}

#define MULTI_CASE(tb, rb)                                                                     \
    case tb:                                                                                   \
        if (dot)                                                                               \
            gemv_multi_rows(rb, tb, true, true, xt, K, w, bias, yt, N, r0, r1);                \
        else if (bf16w)                                                                        \
            gemv_multi_rows(rb, tb, false, true, xt, K, w, bias, yt, N, r0, r1);               \
        else                                                                                   \
            gemv_multi_rows(rb, tb, false, false, xt, K, w, bias, yt, N, r0, r1);              \
        break;

/* T token rows, 8 at a time (the driver never sends more than GEMV_MAX_T). */
static void gemv_multi_run(const void *x, int64_t T, int64_t K, const void *w, bool dot,
                           bool bf16w, const float *bias, float *y, int64_t N, int64_t r0,
                           int64_t r1)
{
    const size_t xsize = dot ? 2 : 4;
    for (int64_t t = 0; t < T; t += 8) {
        const void *xt = (const char *)x + (size_t)(t * K) * xsize;
        float *yt = y + t * N;
        switch (T - t < 8 ? T - t : 8) {
            MULTI_CASE(1, 16)
            MULTI_CASE(2, 8)
            MULTI_CASE(3, 5)
            MULTI_CASE(4, 4)
            MULTI_CASE(5, 3)
            MULTI_CASE(6, 2)
            MULTI_CASE(7, 2)
            default:
            MULTI_CASE(8, 2)
        }
    }
}

/* ---- f32 GEMV ---------------------------------------------------------- */

static void prepare_x_f32(const float *x, int64_t n, void *dst_)
{
    float *dst = dst_;
    for (int64_t i = 0; i < n; i += 16)
        _mm512_mask_storeu_ps(dst + i, mask16(n - i),
                              round_bf16(_mm512_maskz_loadu_ps(mask16(n - i), x + i)));
}

/* As in the AVX2 GEMV: one sequential weight stream per thread, prefetched
 * ahead, 4 accumulators per token, 16 wide; the K tail is masked. */
static ALWAYS_INLINE void gemv_row(const int TG, const bool bf16, const float *x, int64_t K,
                                   const void *w, const float *bias, float *y, int64_t N,
                                   int64_t r, int64_t t0)
{
    const size_t esize = bf16 ? 2 : 4;
    const char *wr = (const char *)w + (size_t)r * (size_t)K * esize;
    const float *xt[2];
    __m512 acc[2][4];
    for (int t = 0; t < TG; t++) {
        xt[t] = x + (t0 + t) * K;
        for (int u = 0; u < 4; u++)
            acc[t][u] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 64 <= K; c += 64) {
        for (size_t q = 0; q < 64 * esize; q += 64)
            _mm_prefetch(wr + (size_t)c * esize + GEMV_PREFETCH_BYTES + q, _MM_HINT_T0);
        for (int u = 0; u < 4; u++) {
            __m512 wv = load16_w(wr, c + 16 * u, 16, bf16);
            for (int t = 0; t < TG; t++)
                acc[t][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xt[t] + c + 16 * u), acc[t][u]);
        }
    }
    for (; c < K; c += 16) {
        __m512 wv = load16_w(wr, c, K - c, bf16);
        for (int t = 0; t < TG; t++)
            acc[t][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mask16(K - c), xt[t] + c),
                                        acc[t][0]);
    }
    for (int t = 0; t < TG; t++) {
        __m512 a = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]),
                                 _mm512_add_ps(acc[t][2], acc[t][3]));
        y[(t0 + t) * N + r] = _mm512_reduce_add_ps(a) + (bias ? bias[r] : 0.0f);
    }
}

/* One token row at AVX-512F (two or more take the multi-row kernel above). */
static ALWAYS_INLINE void gemv_rows(const bool bf16, const float *x, int64_t T, int64_t K,
                                    const void *w, const float *bias, float *y, int64_t N,
                                    int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = 0;
        for (; t + 2 <= T; t += 2)
            gemv_row(2, bf16, x, K, w, bias, y, N, r, t);
        if (t < T)
            gemv_row(1, bf16, x, K, w, bias, y, N, r, t);
    }
}

static void gemv_f32_run(const void *x, int64_t T, int64_t K, const void *w, enum dtype dtype,
                         const float *bias, float *y, int64_t N, int64_t r0, int64_t r1)
{
    if (T >= 2)
        gemv_multi_run(x, T, K, w, false, dtype == DTYPE_BF16, bias, y, N, r0, r1);
    else if (dtype == DTYPE_BF16)
        gemv_rows(true, x, T, K, w, bias, y, N, r0, r1);
    else
        gemv_rows(false, x, T, K, w, bias, y, N, r0, r1);
}

/* ---- bf16 GEMV (vdpbf16ps) --------------------------------------------- */

static void prepare_x_bf16(const float *x, int64_t n, void *dst_)
{
    uint16_t *dst = dst_;
    for (int64_t i = 0; i < n; i += 16) {
        __m512i b = bf16_bits(_mm512_maskz_loadu_ps(mask16(n - i), x + i));
        _mm256_mask_storeu_epi16(dst + i, mask16(n - i), _mm512_cvtepi32_epi16(b));
    }
}

/* Weights need no widening here: 32 bf16 of a row pair up along K with 32
 * bf16 of x, and vdpbf16ps adds both products of each pair into f32. Every
 * row count takes the multi-row kernel: at one row its 16-row blocks beat a
 * row at a time too (one thread, the house model's step: 590-623 against
 * 656-706 us), and a row's bits then never depend on the rows beside it. */
static void gemv_bf16_run(const void *x, int64_t T, int64_t K, const void *w, enum dtype dtype,
                          const float *bias, float *y, int64_t N, int64_t r0, int64_t r1)
{
    (void)dtype;
    gemv_multi_run(x, T, K, w, true, true, bias, y, N, r0, r1);
}

/* ---- bf16 GEMV over panels (vdpbf16ps) ---------------------------------
 *
 * Weights in panels of 32 rows (base/panels.h): a column pair of 16 rows is
 * one vector, so each output sums in one lane of one accumulator: a pair of
 * x is broadcast and vdpbf16ps adds both of its products into every row's
 * lane. No horizontal sums, no scatter: a block's outputs are stored as
 * whole vectors. PB panels against TB token rows are 2 PB TB accumulators
 * (8 to 24: enough independent sums to cover the instruction's latency). The
 * sums run in the GEMM kernel's order (the same instruction and operands, K
 * in blocks of KC columns, each block summed from zero and added to y), so a
 * row's bits are the same at any T and from the GEMV or the GEMM. The house
 * model's step on two Zen 5 cores (`matmul_bench 2 best bf16 house`): 8 rows
 * 374-376 us against the row-major kernel's 419-444 (its 16-way transposing
 * sums and scatter per 16 outputs), one row 2-4% faster, 2-4 rows 5-9%
 * slower; the Qwen3-0.6B shape's one-row decode, out of cache, 29-36%
 * faster (bench/RESULTS.md). */

/* Word j of a token row of x (bf16): x[2j] low, x[2j + 1] high, broadcast
 * from memory (a float's load, not a general register's move); x_last_pair:
 * an odd K's last word, its high half zero. */
static ALWAYS_INLINE __m512bh x_pair(const uint16_t *xt, int64_t j)
{
    float v;
    memcpy(&v, xt + 2 * j, 4);
    return (__m512bh)_mm512_set1_ps(v);
}

static ALWAYS_INLINE __m512bh x_last_pair(const uint16_t *xt, int64_t K)
{
    return (__m512bh)_mm512_set1_epi32((int)xt[K - 1]);
}

/* One column pair (pair jj of the block, word j of x) of PB panels into the
 * 2 PB TB sums; last: an odd K's last pair. */
static ALWAYS_INLINE void gemv_panels_pair(const int PB, const int TB, __m512 *acc,
                                           const uint32_t *const *pw, int64_t jj,
                                           const uint16_t *x, int64_t K, int64_t j, bool last)
{
    __m512bh wv[8];
#pragma GCC unroll 4
    for (int p = 0; p < PB; p++) {
        const uint32_t *at = pw[p] + jj * PANEL_ROWS;
        _mm_prefetch((const char *)(at + GEMV_PANEL_PREFETCH_PAIRS * PANEL_ROWS), _MM_HINT_T0);
        _mm_prefetch((const char *)(at + GEMV_PANEL_PREFETCH_PAIRS * PANEL_ROWS + 16),
                     _MM_HINT_T0);
        wv[2 * p] = (__m512bh)_mm512_load_si512(at);
        wv[2 * p + 1] = (__m512bh)_mm512_load_si512(at + 16);
    }
#pragma GCC unroll 8
    for (int t = 0; t < TB; t++) {
        __m512bh xb = last ? x_last_pair(x + t * K, K) : x_pair(x + t * K, j);
#pragma GCC unroll 8
        for (int v = 0; v < 2 * PB; v++)
            acc[t * 2 * PB + v] = _mm512_dpbf16_ps(acc[t * 2 * PB + v], xb, wv[v]);
    }
}

/* Panels [p0, p0 + PB) (rows 32 p0 .. ) against token rows [0, TB), K
 * block [kb, kb + kc) (kb even); outputs of rows r_end and past are not
 * written (token t's row r is y[t * N + r]). */
static ALWAYS_INLINE void gemv_panels_block(const int PB, const int TB, const uint16_t *x,
                                            int64_t K, const uint32_t *w, const float *bias,
                                            float *y, int64_t N, int64_t r_end, int64_t p0,
                                            int64_t kb, int64_t kc)
{
    const int64_t pairs = panels_pairs(K), j0 = kb / 2, j1 = (kb + kc + 1) / 2;
    const uint32_t *pw[4];
    for (int p = 0; p < PB; p++)
        pw[p] = w + ((uint64_t)(p0 + p) * (uint64_t)pairs + (uint64_t)j0) * PANEL_ROWS;
    __m512 acc[24];
#pragma GCC unroll 24
    for (int a = 0; a < 2 * PB * TB; a++)
        acc[a] = _mm512_setzero_ps();
    /* the pairs whole in x, then an odd K's last */
    const int64_t n_whole = (j1 < K / 2 ? j1 : K / 2) - j0;
    for (int64_t jj = 0; jj < n_whole; jj++)
        gemv_panels_pair(PB, TB, acc, pw, jj, x, K, j0 + jj, false);
    if (j0 + n_whole < j1)
        gemv_panels_pair(PB, TB, acc, pw, n_whole, x, K, j0 + n_whole, true);
    /* every loop over the sums unrolled, so they stay in registers */
    const bool first = kb == 0;
#pragma GCC unroll 8
    for (int v = 0; v < 2 * PB; v++) {
        int64_t r = p0 * PANEL_ROWS + 16 * v;
        __mmask16 k = r < r_end ? mask16(r_end - r) : 0;
        __m512 b = first && bias ? _mm512_maskz_loadu_ps(k, bias + r) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            float *yr = y + t * N + r;
            __m512 c = first ? b : _mm512_maskz_loadu_ps(k, yr);
            _mm512_mask_storeu_ps(yr, k, _mm512_add_ps(c, acc[t * 2 * PB + v]));
        }
    }
}

/* Panels [p, p_end) over every K block, PB at a time. */
static ALWAYS_INLINE void gemv_panels_span(const int PB, const int TB, const uint16_t *x,
                                           int64_t K, const uint32_t *w, const float *bias,
                                           float *y, int64_t N, int64_t r_end, int64_t p,
                                           int64_t p_end)
{
    for (; p + PB <= p_end; p += PB)
        for (int64_t kb = 0; kb < K; kb += KC)
            gemv_panels_block(PB, TB, x, K, w, bias, y, N, r_end, p, kb, K - kb < KC ? K - kb : KC);
}

/* Rows [r0, r1) (r0 a multiple of 32) against TB token rows: PB panels at a
 * time, then the rest (fewer than PB) in one block, so a chunk's last
 * panels keep as many sums in flight as they can. */
static ALWAYS_INLINE void gemv_panels_rows(const int PB, const int TB, const uint16_t *x,
                                           int64_t K, const uint32_t *w, const float *bias,
                                           float *y, int64_t N, int64_t r0, int64_t r1)
{
    const int64_t p_end = (r1 + PANEL_ROWS - 1) / PANEL_ROWS;
    int64_t p = r0 / PANEL_ROWS;
    gemv_panels_span(PB, TB, x, K, w, bias, y, N, r1, p, p_end);
    p += (p_end - p) / PB * PB;
    switch (p_end - p) {
    case 3: gemv_panels_span(PB > 3 ? 3 : 1, TB, x, K, w, bias, y, N, r1, p, p_end); break;
    case 2: gemv_panels_span(PB > 2 ? 2 : 1, TB, x, K, w, bias, y, N, r1, p, p_end); break;
    case 1: gemv_panels_span(1, TB, x, K, w, bias, y, N, r1, p, p_end); break;
    default: break;
    }
}

#define PANELS_CASE(tb, pb)                                                                    \
    case tb:                                                                                   \
        gemv_panels_rows(pb, tb, xt, K, w, bias, yt, N, r0, r1);                               \
        break;

/* T token rows, 8 at a time; w in panels (DTYPE_BF16_P32), x prepared as bf16. */
static void gemv_panels_run(const void *x, int64_t T, int64_t K, const void *w_, enum dtype dtype,
                            const float *bias, float *y, int64_t N, int64_t r0, int64_t r1)
{
    (void)dtype;
    const uint32_t *w = w_;
    for (int64_t t = 0; t < T; t += 8) {
        const uint16_t *xt = (const uint16_t *)x + t * K;
        float *yt = y + t * N;
        switch (T - t < 8 ? T - t : 8) {
            PANELS_CASE(1, 4)
            PANELS_CASE(2, 4)
            PANELS_CASE(3, 3)
            PANELS_CASE(4, 3)
            PANELS_CASE(5, 2)
            PANELS_CASE(6, 2)
            PANELS_CASE(7, 1)
            default:
            PANELS_CASE(8, 1)
        }
    }
}

/* ---- f32 GEMM ---------------------------------------------------------- */

/* Panels of 12 token rows, k-major f32: 16 columns at a time through a
 * 16x16 transpose (rows 12..15 zero), stored 12 lanes wide. */
static void pack_x_f32(const float *x, int64_t ldx, int m, int k, bool round, void *dst_)
{
    float *dst = dst_;
    for (int p = 0; p < m; p += MR) {
        int mp = m - p < MR ? m - p : MR;
        float *d = dst + (size_t)(p / MR) * MR * (size_t)k;
        for (int c = 0; c < k; c += 16) {
            __m512i v[16];
            for (int i = 0; i < 16; i++) {
                __m512 xv = i < mp ? _mm512_maskz_loadu_ps(mask16(k - c), x + (p + i) * ldx + c)
                                   : _mm512_setzero_ps();
                v[i] = _mm512_castps_si512(round ? round_bf16(xv) : xv);
            }
            transpose16(v);
            for (int jj = 0; jj < 16 && c + jj < k; jj++)
                _mm512_mask_storeu_ps(d + (size_t)(c + jj) * MR, (__mmask16)0x0fff,
                                      _mm512_castsi512_ps(v[jj]));
        }
    }
}

/* One panel of 32 weight rows, k-major f32 (widened from bf16), two groups
 * of 16 rows through 16x16 transposes; rows past n and columns past k load
 * as zeros. */
static ALWAYS_INLINE void pack_w_f32_impl(const bool bf16, const void *w, int64_t ldw, int n,
                                          int k, float *dst)
{
    const size_t esize = bf16 ? 2 : 4;
    for (int c = 0; c < k; c += 16) {
        for (int g = 0; g < 2; g++) {
            __m512i v[16];
            for (int i = 0; i < 16; i++) {
                int row = g * 16 + i;
                v[i] = row < n ? _mm512_castps_si512(load16_w(
                                     (const char *)w + (size_t)row * (size_t)ldw * esize, c,
                                     k - c, bf16))
                               : _mm512_setzero_si512();
            }
            transpose16(v);
            for (int jj = 0; jj < 16 && c + jj < k; jj++)
                _mm512_store_si512(dst + (size_t)(c + jj) * NR + g * 16, v[jj]);
        }
    }
}

static void pack_w_f32(const void *w, enum dtype dtype, int64_t ldw, int n, int k, void *dst)
{
    if (dtype == DTYPE_BF16)
        pack_w_f32_impl(true, w, ldw, n, k, dst);
    else
        pack_w_f32_impl(false, w, ldw, n, k, dst);
}

static ALWAYS_INLINE void kernel_f32_m(const int M, int n, int k, const float *a, const float *b,
                                       float *c, int64_t ldc, const float *bias, bool first)
{
    __m512 acc[MR][2];
    for (int i = 0; i < M; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        for (int i = 0; i < M; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < M; i++)
        store_row(c + i * ldc, acc[i][0], acc[i][1], n, bias, first);
}

#define KERNEL_SWITCH(fn, m, ...)                                                              \
    switch (m) {                                                                               \
    case 12: fn(12, __VA_ARGS__); break;                                                       \
    case 11: fn(11, __VA_ARGS__); break;                                                       \
    case 10: fn(10, __VA_ARGS__); break;                                                       \
    case 9: fn(9, __VA_ARGS__); break;                                                         \
    case 8: fn(8, __VA_ARGS__); break;                                                         \
    case 7: fn(7, __VA_ARGS__); break;                                                         \
    case 6: fn(6, __VA_ARGS__); break;                                                         \
    case 5: fn(5, __VA_ARGS__); break;                                                         \
    case 4: fn(4, __VA_ARGS__); break;                                                         \
    case 3: fn(3, __VA_ARGS__); break;                                                         \
    case 2: fn(2, __VA_ARGS__); break;                                                         \
    default: fn(1, __VA_ARGS__); break;                                                        \
    }

static void kernel_f32(int m, int n, int k, const void *a, const void *b, float *c, int64_t ldc,
                       const float *bias, bool first)
{
    KERNEL_SWITCH(kernel_f32_m, m, n, k, a, b, c, ldc, bias, first)
}

/* ---- EXACT-mode GEMV in the GEMM's order --------------------------------
 *
 * The GEMV above sums each output in four 16-lane accumulators and a
 * horizontal sum; the GEMM sums it in K blocks of KC, each one FMA chain
 * from zero in column order, added to the bias (first block) or to the sum
 * so far. A token's bits would then depend on whether it shared its call with
 * more than GEMV_MAX_T others. In EXACT mode decode-sized calls come here
 * instead: the same chains and adds as the GEMM, with 16 weight rows in the
 * lanes of a vector (a 16x16 transpose of the rows as they stream in, bf16
 * pairs transposed as 32-bit words and widened after) rather than packed. */

#define EXACT_MAX_T 8

/* kn (<= one tile) columns of a transposed tile into TT chains: lane i of
 * v[jj] is word jj of row i (a bf16 pair: even column low, odd high). With
 * kn a constant the checks fold away and v stays in registers. */
static ALWAYS_INLINE void exact_tile(const int TT, const bool bf16, const float *xc, int64_t K,
                                     const __m512i v[16], const int kn, __m512 acc[])
{
    const __m512i hi_half = _mm512_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 16
    for (int jj = 0; jj < 16; jj++) {
        if (bf16) {
            if (2 * jj < kn) {
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v[jj], 16));
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++)
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xc[t * K + 2 * jj]), we, acc[t]);
            }
            if (2 * jj + 1 < kn) {
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v[jj], hi_half));
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++)
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xc[t * K + 2 * jj + 1]), wo, acc[t]);
            }
        } else if (jj < kn) {
            __m512 wv = _mm512_castsi512_ps(v[jj]);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xc[t * K + jj]), wv, acc[t]);
        }
    }
}

/* 16 rows from row r (n valid; the rest zero) x kn columns from column c. */
static ALWAYS_INLINE void exact_load(const bool bf16, const void *w, int64_t K, int64_t r, int n,
                                     int64_t c, const int kn, __m512i v[16])
{
    const size_t esize = bf16 ? 2 : 4;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        const char *src = (const char *)w + ((size_t)(r + i) * (size_t)K + (size_t)c) * esize;
        if (i >= n)
            v[i] = _mm512_setzero_si512();
        else if (bf16)
            v[i] = _mm512_maskz_loadu_epi16(mask32(kn), src);
        else
            v[i] = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask16(kn), src));
    }
}

/* Units of G groups of 16 rows against TT tokens: G * TT chains in flight. */
static ALWAYS_INLINE void exact_unit(const int G, const int TT, const bool bf16, const float *x,
                                     int64_t K, const void *w, const float *bias, float *y,
                                     int64_t N, int64_t r, int n_rows, int next_rows)
{
    const int step = bf16 ? 32 : 16; /* columns per transposed tile */
    /* The unit's 16 G rows are as many streams as the hardware prefetchers
     * follow at most, and each starts cold; so while this unit computes, the
     * next unit's rows (contiguous) are prefetched, a few lines per tile. */
    const size_t esize = bf16 ? 2 : 4;
    const char *pf = (const char *)w + (size_t)(r + n_rows) * (size_t)K * esize;
    const char *pf_end = pf + (size_t)next_rows * (size_t)K * esize;
    const int64_t tiles = (int64_t)G * ((K + step - 1) / step);
    const int64_t pf_per_tile = ((int64_t)(pf_end - pf) / 64 + tiles - 1) / tiles;
    for (int64_t pc = 0; pc < K; pc += KC) {
        const int64_t kend = pc + KC < K ? pc + KC : K;
        __m512 acc[2][EXACT_MAX_T];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++)
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                acc[g][t] = _mm512_setzero_ps();
        int64_t c = pc;
        for (; c + step <= kend; c += step) {
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) {
                for (int64_t q = 0; q < pf_per_tile && pf < pf_end; q++, pf += 64)
                    _mm_prefetch(pf, _MM_HINT_T1);
                __m512i v[16];
                exact_load(bf16, w, K, r + 16 * g, n_rows - 16 * g, c, step, v);
                transpose16(v);
                exact_tile(TT, bf16, x + c, K, v, step, acc[g]);
            }
        }
        if (c < kend) {
            const int kn = (int)(kend - c);
            for (int g = 0; g < G; g++) {
                __m512i v[16];
                exact_load(bf16, w, K, r + 16 * g, n_rows - 16 * g, c, kn, v);
                transpose16(v);
                exact_tile(TT, bf16, x + c, K, v, kn, acc[g]);
            }
        }
        /* store_row's rule: (first ? bias or 0 : the sum so far) + this block */
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            int n = n_rows - g * 16;
            if (n <= 0)
                break;
            __mmask16 m = mask16(n);
            int64_t r0 = r + g * 16;
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                float *yt = y + t * N + r0;
                __m512 c0 = pc > 0 ? _mm512_maskz_loadu_ps(m, yt)
                            : bias ? _mm512_maskz_loadu_ps(m, bias + r0)
                                   : _mm512_setzero_ps();
                _mm512_mask_storeu_ps(yt, m, _mm512_add_ps(c0, acc[g][t]));
            }
        }
    }
}

static ALWAYS_INLINE void exact_rows(const int G, const int TT, const bool bf16, const float *x,
                                     int64_t K, const void *w, const float *bias, float *y,
                                     int64_t N, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r += 16 * G) {
        int n = r1 - r < 16 * G ? (int)(r1 - r) : 16 * G;
        int64_t after = r1 - r - n;
        exact_unit(G, TT, bf16, x, K, w, bias, y, N, r, n, after < 16 * G ? (int)after : 16 * G);
    }
}

#define EXACT_CASE(tt, g)                                                                      \
    case tt:                                                                                   \
        if (bf16)                                                                              \
            exact_rows(g, tt, true, x, K, w, bias, y, N, r0, r1);                              \
        else                                                                                   \
            exact_rows(g, tt, false, x, K, w, bias, y, N, r0, r1);                             \
        break;

/* Few tokens take two row groups (two chains per token to cover the FMA
 * latency); more tokens have chains enough with one. */
static void gemv_exact_tokens(const float *x, int64_t T, int64_t K, const void *w, bool bf16,
                              const float *bias, float *y, int64_t N, int64_t r0, int64_t r1)
{
    switch (T) {
        EXACT_CASE(1, 2)
        EXACT_CASE(2, 2)
        EXACT_CASE(3, 2)
        EXACT_CASE(4, 2)
        EXACT_CASE(5, 1)
        EXACT_CASE(6, 1)
        EXACT_CASE(7, 1)
        default:
        EXACT_CASE(8, 1)
    }
}

static void gemv_exact_run(const void *x_, int64_t T, int64_t K, const void *w, enum dtype dtype,
                           const float *bias, float *y, int64_t N, int64_t r0, int64_t r1)
{
    const float *x = x_;
    for (int64_t t = 0; t < T; t += EXACT_MAX_T) {
        int64_t tt = T - t < EXACT_MAX_T ? T - t : EXACT_MAX_T;
        gemv_exact_tokens(x + t * K, tt, K, w, dtype == DTYPE_BF16, bias, y + t * N, N, r0, r1);
    }
}

/* ---- bf16 pair packing (shared with AMX) -------------------------------- */

/* Weight rows are already bf16 pairs along K in memory, so packing is a
 * 16x16 transpose of 32-bit words per group of 16 rows. */
void cpu_mm_pack_w_bf16_pairs32(const void *w_, enum dtype dtype, int64_t ldw, int n, int k,
                                void *dst_)
{
    const uint16_t *w = w_;
    uint32_t *dst = dst_;
    int pairs = (k + 1) / 2;
    if (dtype == DTYPE_BF16_P32) { /* w: the block's first pair in its panel: already packed */
        memcpy(dst, w, (size_t)pairs * NR * 4);
        return;
    }
    for (int c = 0; c < k; c += 32) {
        for (int g = 0; g < 2; g++) {
            __m512i v[16];
            for (int i = 0; i < 16; i++) {
                int row = g * 16 + i;
                const uint16_t *src = w + (size_t)row * (size_t)ldw + c;
                v[i] = row < n ? _mm512_maskz_loadu_epi16(mask32(k - c), src)
                               : _mm512_setzero_si512();
            }
            transpose16(v);
            for (int jj = 0; jj < 16 && c / 2 + jj < pairs; jj++)
                _mm512_store_si512(dst + (size_t)(c / 2 + jj) * NR + g * 16, v[jj]);
        }
    }
}

/* ---- bf16 GEMM (vdpbf16ps) --------------------------------------------- */

/* For CPUs with AVX512-BF16 and no AMX hardware (Zen 4/5, where vdpbf16ps
 * retires two products per lane at the f32 FMA's rate: twice its flops; a
 * 12-chain probe gave 232 against 122 GFLOP/s on one Zen core). On Sapphire
 * Rapids, capped below AMX, it measured half the f32 kernel's speed, so
 * matmul.c picks it only where CPUID reports no AMX. */

/* 32 floats (n valid) rounded to 32 bf16, in order. */
static ALWAYS_INLINE __m512i load32_x_bf16(const float *x, int64_t n)
{
    __m256i lo = _mm512_cvtepi32_epi16(bf16_bits(_mm512_maskz_loadu_ps(mask16(n), x)));
    __m256i hi = _mm512_cvtepi32_epi16(
        bf16_bits(_mm512_maskz_loadu_ps(mask16(n > 16 ? n - 16 : 0), x + 16)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Panels of 12 token rows as bf16 pairs along K: word [p * 12 + i] holds
 * x[i, 2p] (low half) and x[i, 2p + 1]; 32 columns (16 pairs) at a time
 * through a 16x16 transpose of 32-bit words. */
static void pack_x_bf16(const float *x, int64_t ldx, int m, int k, bool round, void *dst_)
{
    uint32_t *dst = dst_;
    int pairs = (k + 1) / 2;
    (void)round; /* always rounded: this kernel exists for FAST mode */
    for (int p = 0; p < m; p += MR) {
        int mp = m - p < MR ? m - p : MR;
        uint32_t *d = dst + (size_t)(p / MR) * MR * (size_t)pairs;
        for (int c = 0; c < k; c += 32) {
            __m512i v[16];
            for (int i = 0; i < 16; i++)
                v[i] = i < mp ? load32_x_bf16(x + (p + i) * ldx + c, k - c)
                              : _mm512_setzero_si512();
            transpose16(v);
            for (int jj = 0; jj < 16 && c / 2 + jj < pairs; jj++)
                _mm512_mask_storeu_epi32(d + (size_t)(c / 2 + jj) * MR, (__mmask16)0x0fff, v[jj]);
        }
    }
}

static ALWAYS_INLINE void kernel_bf16_m(const int M, int n, int k, const uint32_t *a,
                                        const uint32_t *b, float *c, int64_t ldc,
                                        const float *bias, bool first)
{
    __m512 acc[MR][2];
    int pairs = (k + 1) / 2;
    for (int i = 0; i < M; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; p++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
        for (int i = 0; i < M; i++) {
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < M; i++)
        store_row(c + i * ldc, acc[i][0], acc[i][1], n, bias, first);
}

static void kernel_bf16(int m, int n, int k, const void *a, const void *b, float *c, int64_t ldc,
                        const float *bias, bool first)
{
    KERNEL_SWITCH(kernel_bf16_m, m, n, k, a, b, c, ldc, bias, first)
}

float cpu_mm_fma_chains_avx512(long iters)
{
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
    __m512 acc[12];
    for (int i = 0; i < 12; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++)
            acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    __m512 s = acc[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

const struct mm_gemv cpu_mm_gemv_avx512 = {
    .max_t = GEMV_MAX_T,
    .x_bf16 = false,
    .prepare_x = prepare_x_f32,
    .run = gemv_f32_run,
};

const struct mm_gemm cpu_mm_gemm_avx512 = {
    .mr = MR, .nr = NR, .kc = KC, .mc = MC, .k_align = 1,
    .a_elem = 4, .b_elem = 4,
    .pack_x = pack_x_f32, .pack_w = pack_w_f32, .kernel = kernel_f32,
};

const struct mm_gemv cpu_mm_gemv_exact_avx512 = {
    .max_t = EXACT_MAX_T,
    .x_bf16 = false,
    .prepare_x = NULL, /* EXACT mode only: x is used as it is */
    .run = gemv_exact_run,
};

const struct mm_gemv cpu_mm_gemv_avx512bf16 = {
    .max_t = GEMV_MAX_T,
    .x_bf16 = true,
    .prepare_x = prepare_x_bf16,
    .run = gemv_bf16_run,
};

const struct mm_gemv cpu_mm_gemv_avx512bf16_panels = {
    .max_t = GEMV_MAX_T,
    .x_bf16 = true,
    .prepare_x = prepare_x_bf16,
    .run = gemv_panels_run,
};

const struct mm_gemm cpu_mm_gemm_avx512bf16 = {
    .mr = MR, .nr = NR, .kc = KC, .mc = MC, .k_align = 2,
    .a_elem = 2, .b_elem = 2,
    .pack_x = pack_x_bf16, .pack_w = cpu_mm_pack_w_bf16_pairs32, .kernel = kernel_bf16,
};
