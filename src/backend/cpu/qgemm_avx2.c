/* backend/cpu/qgemm_avx2.c — the quantized prefill GEMM on AVX2 alone: weight quads against x quads through vpmaddubsw + vpmaddwd, 8 tokens per ymm, the same panels, exact integer block sums and float steps as the VNNI kernels. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/qgemm.h"

#define QGEMM_INLINE static inline __attribute__((always_inline))

/* Rows per pass: 4 rows x 2 halves of 8 tokens = 8 int32 accumulators,
 * with the x quads, the weight broadcasts and the temporaries in the other
 * 8 of the 16 ymm. The float sums live in out (L1) between blocks. */
#define AVX2_ROWS 4

/* ---- why no sum saturates ----------------------------------------------- *
 * vpmaddubsw multiplies unsigned bytes by signed ones and adds each pair of
 * products into an int16 with signed saturation; a saturated pair would
 * silently break the exact block sums. Two paths keep every pair in range,
 * chosen by the largest |code| the panel's type can hold (qgemm_w.code_max,
 * which unpack_row guarantees whatever the file holds: its codes come from
 * 4-, 5- and 6-bit fields, or are Q8_0's bytes):
 *
 * Narrow codes (code_max <= 32: Q4_0 8, Q4_1 and Q4_K 15, Q5_K 31, Q6_K 32)
 * meet x's codes + 128 as stored, xu in 0..255: a pair is at most 2 * 255
 * * 32 = 16320 in magnitude, and the pairs of two quads added with vpaddw
 * at most 4 * 255 * 32 = 32640 <= 32767: neither vpmaddubsw saturates nor
 * vpaddw wraps. vpmaddwd by ones then widens to int32 exactly, and the
 * block's sum starts at corr, as vpdpbusd's does. (Four quads of the codes
 * within 16 would fit too, 8 * 255 * 16 = 32640, but their operands do not
 * fit in 16 ymm beside 8 accumulators: the spills cost more than the
 * vpmaddwd saved.)
 *
 * Wide codes (Q8_0, code_max 128: -128..127 in a file) would reach
 * 2 * 255 * 128 = 65280. They take llama.cpp's sign trick with the roles
 * turned: |w| (0..128, an unsigned byte even for -128) is the unsigned
 * operand and x's signed code xs = xu - 128 with w's sign applied (vpsignb)
 * the signed one. struct qmm_act's codes are rint(x / d) with d = max|x| /
 * 127, so |xs| <= 127 (tokens past the step: 0), hence -xs never wraps and
 * |sign(xs, w)| <= 127: a pair is at most 2 * 128 * 127 = 32512 in
 * magnitude. The products are w * xs, the codes without the 128, so the
 * sum starts at 0 rather than corr; both ways it is the same integer, the
 * sum of w * xs. */

/* Pins v to a register here: without it GCC reassociates the chains of
 * integer adds into trees, keeping every product live and spilling them. */
#define KEEP(v) __asm__("" : "+x"(v))

QGEMM_INLINE __m256i quad_of(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* out rows r0.. += the block's sums, scaled as the VNNI kernels scale them
 * (the same two FMAs in the same order: bit-identical results). */
QGEMM_INLINE void block_epilogue(const bool min, const struct qgemm_w *w, const struct qgemm_x *x,
                                 int64_t b, int64_t bx, int r0, __m256i is[AVX2_ROWS][2],
                                 float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    __m256 dx[2] = {_mm256_loadu_ps(x->d + bx * QGEMM_TOKENS),
                    _mm256_loadu_ps(x->d + bx * QGEMM_TOKENS + 8)};
    const float *scale = w->scale + b * QGEMM_ROWS + r0;
    for (int r = 0; r < AVX2_ROWS; r++) {
        __m256 sc = _mm256_set1_ps(scale[r]);
        for (int h = 0; h < 2; h++) {
            float *o = out[r0 + r] + 8 * h;
            __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][h]), _mm256_mul_ps(dx[h], sc),
                                         _mm256_loadu_ps(o));
            _mm256_storeu_ps(o, acc);
        }
    }
    if (min) {
        __m256 sx[2] = {_mm256_loadu_ps(x->s + bx * QGEMM_TOKENS),
                        _mm256_loadu_ps(x->s + bx * QGEMM_TOKENS + 8)};
        const float *mn = w->min + b * QGEMM_ROWS + r0;
        for (int r = 0; r < AVX2_ROWS; r++) {
            __m256 m = _mm256_set1_ps(mn[r]);
            for (int h = 0; h < 2; h++) {
                float *o = out[r0 + r] + 8 * h;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(sx[h], m, _mm256_loadu_ps(o)));
            }
        }
    }
}

/* wide: the sign path (code_max > 32); else two quads' pair sums meet in
 * int16. */
QGEMM_INLINE void avx2_rows(int64_t K, const int blk, const bool min, const bool wide,
                            const struct qgemm_w *w, int r0, const struct qgemm_x *x,
                            float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    const __m256i ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < AVX2_ROWS; r++) {
        _mm256_storeu_ps(out[r0 + r], _mm256_setzero_ps());
        _mm256_storeu_ps(out[r0 + r] + 8, _mm256_setzero_ps());
    }
    const uint8_t *xq = x->q;
    const int8_t *wq = w->q + (size_t)r0 * (size_t)K;
    for (int64_t b = 0; b < K / blk; b++, xq += blk / 4 * 64) {
        __m256i is[AVX2_ROWS][2];
        const int8_t *wb = wq + b * blk;
        if (wide) {
            for (int r = 0; r < AVX2_ROWS; r++)
                is[r][0] = is[r][1] = _mm256_setzero_si256();
            for (int k = 0; k < blk / 4; k++) {
                __m256i xs[2] = {
                    _mm256_xor_si256(_mm256_load_si256((const __m256i *)(xq + 64 * k)), bias),
                    _mm256_xor_si256(_mm256_load_si256((const __m256i *)(xq + 64 * k + 32)), bias)};
                for (int r = 0; r < AVX2_ROWS; r++) {
                    __m256i wv = quad_of(wb + (size_t)r * (size_t)K + 4 * k);
                    __m256i wa = _mm256_abs_epi8(wv);
                    for (int h = 0; h < 2; h++) {
                        is[r][h] = _mm256_add_epi32(
                            is[r][h],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xs[h], wv)),
                                              ones));
                        KEEP(is[r][h]);
                    }
                }
            }
        } else {
            const int32_t *corr = w->corr + b * QGEMM_ROWS + r0;
            for (int r = 0; r < AVX2_ROWS; r++)
                is[r][0] = is[r][1] = _mm256_set1_epi32(corr[r]);
            for (int k = 0; k < blk / 4; k += 2) {
                __m256i x0[2] = {_mm256_load_si256((const __m256i *)(xq + 64 * k)),
                                 _mm256_load_si256((const __m256i *)(xq + 64 * k + 32))};
                __m256i x1[2] = {_mm256_load_si256((const __m256i *)(xq + 64 * k + 64)),
                                 _mm256_load_si256((const __m256i *)(xq + 64 * k + 96))};
                for (int r = 0; r < AVX2_ROWS; r++) {
                    const int8_t *wr = wb + (size_t)r * (size_t)K + 4 * k;
                    __m256i w0 = quad_of(wr), w1 = quad_of(wr + 4);
                    for (int h = 0; h < 2; h++) {
                        __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x0[h], w0),
                                                     _mm256_maddubs_epi16(x1[h], w1));
                        is[r][h] = _mm256_add_epi32(is[r][h], _mm256_madd_epi16(p, ones));
                        KEEP(is[r][h]);
                    }
                }
            }
        }
        block_epilogue(min, w, x, b, b * blk / 32, r0, is, out);
    }
}

QGEMM_INLINE void avx2_panel(int64_t K, const int blk, const bool min, const bool wide,
                             const struct qgemm_w *w, const struct qgemm_x *x,
                             float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    for (int r0 = 0; r0 < QGEMM_ROWS; r0 += AVX2_ROWS)
        avx2_rows(K, blk, min, wide, w, r0, x, out);
}

/* The block size, the minimum and the path as constants, so each variant's
 * inner loops unroll. */
static void gemm_avx2(int64_t K, int blk, const struct qgemm_w *wp, const struct qgemm_x *xp,
                      float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    /* Copies, so stores to out (which may alias anything, strict aliasing
     * being off) do not make the loops reload the pointers. */
    const struct qgemm_w wc = *wp, *w = &wc;
    const struct qgemm_x xc = *xp, *x = &xc;
    if (w->code_max > 32 && (blk != 32 || w->min))
        cpu_qgemm_scalar(K, blk, wp, xp, out); /* no type's panel: exact, slowly */
    else if (w->code_max > 32)
        avx2_panel(K, 32, false, true, w, x, out); /* Q8_0 */
    else if (blk == 16)
        avx2_panel(K, 16, false, false, w, x, out); /* Q6_K */
    else if (w->min)
        avx2_panel(K, 32, true, false, w, x, out); /* Q4_1, Q4_K, Q5_K */
    else
        avx2_panel(K, 32, false, false, w, x, out); /* Q4_0 */
}

const qgemm_fn cpu_qgemm_avx2 = gemm_avx2;
