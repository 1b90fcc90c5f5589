/* backend/cpu/qgemm_avxvnni_body.h — the prefill kernel on 256-bit vpdpbusd, written once over a dot macro: qgemm_avxvnni.c defines it as AVX-VNNI's VEX form (CPUs without AVX-512), qgemm_avx512.c as AVX-512 VNNI's EVEX form on ymm (the same operation, so tests run this code where AVX-VNNI is absent). */
#ifndef INFERD_BACKEND_CPU_QGEMM_AVXVNNI_BODY_H
#define INFERD_BACKEND_CPU_QGEMM_AVXVNNI_BODY_H

/* The including file defines, before including this one:
 *   QGEMM_DPBUSD_YMM(acc, u, s)  acc + per int32 lane the sum of the four
 *                                products (uint8) u * (int8) s, in int32
 *   QGEMM_YMM_KERNEL             the kernel's name */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/qgemm.h"

/* Rows per pass: 4 rows x 2 halves of 8 tokens = 8 int32 accumulators in
 * the 16 ymm of VEX code; the float sums live in out (L1) between blocks. */
#define YMM_VNNI_ROWS 4

static inline __attribute__((always_inline)) void
ymm_vnni_rows(int64_t K, const int blk, const bool min, const struct qgemm_w *w, int r0,
              const struct qgemm_x *x, float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    for (int r = 0; r < YMM_VNNI_ROWS; r++) {
        _mm256_storeu_ps(out[r0 + r], _mm256_setzero_ps());
        _mm256_storeu_ps(out[r0 + r] + 8, _mm256_setzero_ps());
    }
    const uint8_t *xq = x->q;
    const int8_t *wq = w->q + (size_t)r0 * (size_t)K;
    for (int64_t b = 0; b < K / blk; b++) {
        /* The sums start at corr (the 128 added to x's codes, taken back
         * off); vpdpbusd does not saturate, so they are exact. */
        __m256i is[YMM_VNNI_ROWS][2];
        const int32_t *corr = w->corr + b * QGEMM_ROWS + r0;
        for (int r = 0; r < YMM_VNNI_ROWS; r++)
            is[r][0] = is[r][1] = _mm256_set1_epi32(corr[r]);
        for (int k = 0; k < blk / 4; k++, xq += 64) {
            __m256i x0 = _mm256_load_si256((const __m256i *)xq);
            __m256i x1 = _mm256_load_si256((const __m256i *)(xq + 32));
            const int8_t *wk = wq + b * blk + 4 * k;
            for (int r = 0; r < YMM_VNNI_ROWS; r++) {
                int32_t q4;
                memcpy(&q4, wk + (size_t)r * (size_t)K, 4);
                __m256i wv = _mm256_set1_epi32(q4);
                is[r][0] = QGEMM_DPBUSD_YMM(is[r][0], x0, wv);
                is[r][1] = QGEMM_DPBUSD_YMM(is[r][1], x1, wv);
            }
        }
        /* The VNNI kernel's two FMAs in its order: bit-identical results. */
        int64_t bx = b * blk / 32;
        __m256 dx[2] = {_mm256_loadu_ps(x->d + bx * QGEMM_TOKENS),
                        _mm256_loadu_ps(x->d + bx * QGEMM_TOKENS + 8)};
        const float *scale = w->scale + b * QGEMM_ROWS + r0;
        for (int r = 0; r < YMM_VNNI_ROWS; r++) {
            __m256 sc = _mm256_set1_ps(scale[r]);
            for (int h = 0; h < 2; h++) {
                float *o = out[r0 + r] + 8 * h;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][h]),
                                                    _mm256_mul_ps(dx[h], sc), _mm256_loadu_ps(o)));
            }
        }
        if (min) {
            __m256 sx[2] = {_mm256_loadu_ps(x->s + bx * QGEMM_TOKENS),
                            _mm256_loadu_ps(x->s + bx * QGEMM_TOKENS + 8)};
            const float *mn = w->min + b * QGEMM_ROWS + r0;
            for (int r = 0; r < YMM_VNNI_ROWS; r++) {
                __m256 m = _mm256_set1_ps(mn[r]);
                for (int h = 0; h < 2; h++) {
                    float *o = out[r0 + r] + 8 * h;
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(sx[h], m, _mm256_loadu_ps(o)));
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) void
ymm_vnni_panel(int64_t K, const int blk, const bool min, const struct qgemm_w *w,
               const struct qgemm_x *x, float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    for (int r0 = 0; r0 < QGEMM_ROWS; r0 += YMM_VNNI_ROWS)
        ymm_vnni_rows(K, blk, min, w, r0, x, out);
}

/* The block size and the minimum as constants, so each variant's inner
 * loops unroll. */
static void QGEMM_YMM_KERNEL(int64_t K, int blk, const struct qgemm_w *wp,
                             const struct qgemm_x *xp, float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    /* Copies, so stores to out (which may alias anything, strict aliasing
     * being off) do not make the loops reload the pointers. */
    const struct qgemm_w wc = *wp, *w = &wc;
    const struct qgemm_x xc = *xp, *x = &xc;
    if (blk == 16)
        ymm_vnni_panel(K, 16, false, w, x, out);
    else if (w->min)
        ymm_vnni_panel(K, 32, true, w, x, out);
    else
        ymm_vnni_panel(K, 32, false, w, x, out);
}

#endif
