/* backend/cpu/qmatmul_body.h — the int8 dot kernels on 256-bit vectors (Q8_0, Q4_0, Q4_1 against 32-element x blocks; Q4_K, Q5_K, Q6_K against 256-element ones) and the x quantizers, written once over the qmm_dot_i32 primitive the including ISA file defines. */
#ifndef INFERD_BACKEND_CPU_QMATMUL_BODY_H
#define INFERD_BACKEND_CPU_QMATMUL_BODY_H

/* The including file defines, before including this one:
 *   static inline __m256i qmm_dot_i32(__m256i u, __m256i s)
 * lane i (of 8 int32) = sum over bytes 4i..4i+3 of (unsigned) u * (signed) s.
 * Both files compute the same integers (no operand here makes vpmaddubsw
 * saturate: |u| <= 128 against |s| <= 127 in pairs), so they differ only
 * in speed. Signed weights go in as |w| with x given w's sign (vpsignb). */

#include <immintrin.h>

#include "backend/cpu/qmatmul.h"

#define QMM_INLINE static inline __attribute__((always_inline))

QMM_INLINE float qmm_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QMM_INLINE __m256i qmm_load_act(const struct qmm_act *a)
{
    return _mm256_loadu_si256((const __m256i *)a->q);
}

/* The 32 signed weights w (already unpacked) against nt tokens' block i. */
QMM_INLINE void qmm_signed_block(__m256i w, float dw, const struct qmm_act *x, int64_t xs, int nt,
                                 __m256 *acc)
{
    __m256i aw = _mm256_sign_epi8(w, w);
    for (int t = 0; t < nt; t++) {
        const struct qmm_act *a = x + t * xs;
        __m256i d = qmm_dot_i32(aw, _mm256_sign_epi8(qmm_load_act(a), w));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(dw * a->d), acc[t]);
    }
}

QMM_INLINE void qmm_dot_q8_0_n(int64_t K, const void *w, const void *x_, int64_t xs,
                                 const int nt, float *out)
{
    const struct qmm_act *x = x_;
    __m256 acc[QMM_MAX_T];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 32; i++, b += 34)
        qmm_signed_block(_mm256_loadu_si256((const __m256i *)(b + 2)), qmm_half(b), x + i, xs,
                         nt, acc);
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]);
}

QMM_INLINE void qmm_dot_q4_0_n(int64_t K, const void *w, const void *x_, int64_t xs,
                                 const int nt, float *out)
{
    const struct qmm_act *x = x_;
    __m256 acc[QMM_MAX_T];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    const __m128i lo4 = _mm_set1_epi8(15);
    const __m256i eight = _mm256_set1_epi8(8);
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 32; i++, b += 18) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(b + 2));
        __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), lo4),
                                     _mm_and_si128(raw, lo4));
        qmm_signed_block(_mm256_sub_epi8(q, eight), qmm_half(b), x + i, xs, nt, acc);
    }
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]);
}

/* Q4_1: unsigned nibbles as they are; x = d * q + m, the minimum times x's
 * scaled block sum. */
QMM_INLINE void qmm_dot_q4_1_n(int64_t K, const void *w, const void *x_, int64_t xs, const int nt,
                               float *out)
{
    const struct qmm_act *x = x_;
    __m256 acc[QMM_MAX_T];
    float mins[QMM_MAX_T];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_setzero_ps();
        mins[t] = 0.0f;
    }
    const __m128i lo4 = _mm_set1_epi8(15);
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 32; i++, b += 20) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(b + 4));
        __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), lo4),
                                     _mm_and_si128(raw, lo4));
        float d = qmm_half(b), m = qmm_half(b + 2);
        for (int t = 0; t < nt; t++) {
            const struct qmm_act *a = x + t * xs + i;
            __m256i s = qmm_dot_i32(q, qmm_load_act(a));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * a->d), acc[t]);
            mins[t] += m * a->s;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]) + mins[t];
}

/* ---- K types against struct qmm_act_k --------------------------------- *
 * Per super-block the codes go in unsigned (vpmaddubsw: code * x in int16
 * pairs, at most 2 * 63 * 127), are multiplied by their group's integer
 * scale and summed in int32 (vpmaddwd), so a super-block costs one
 * conversion and one FMA per token; the minima (Q4_K, Q5_K) and Q6_K's
 * offset of 32 come from x's block sums, also in integers. */

QMM_INLINE __m256i qmm_mul_sum_i16(__m256i u8, __m256i s8, __m256i scale16)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), scale16);
}

/* Each group's min twice, as 16 int16 (one per x block sum). */
QMM_INLINE __m256i qmm_k4_mins16(const uint8_t *sm)
{
    __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
    return _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
}

/* Q4_K (q5 false) and Q5_K: per 64 elements 32 bytes of nibbles, the low
 * ones group 2c, the high ones 2c + 1; Q5_K's fifth bit of group j is bit
 * j of qh[l]. */
QMM_INLINE void qmm_dot_k4_n(const bool q5, int64_t K, const void *w, const void *x_, int64_t xs,
                             const int nt, float *out)
{
    const struct qmm_act_k *x = x_;
    __m256 acc[QMM_MAX_T], accm[QMM_MAX_T];
    for (int t = 0; t < nt; t++)
        acc[t] = accm[t] = _mm256_setzero_ps();
    const __m256i lo4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const size_t bytes = q5 ? 176 : 144;
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 256; i++, b += bytes) {
        uint8_t sm[16];
        qmm_scales_mins_k4(b + 4, sm);
        const uint8_t *qs = q5 ? b + 48 : b + 16;
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m256i isum[QMM_MAX_T];
        for (int t = 0; t < nt; t++)
            isum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(raw, lo4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                         _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                         _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
            }
            for (int t = 0; t < nt; t++) {
                const struct qmm_act_k *at = x + t * xs + i;
                const int8_t *aq = at->q + 64 * c;
                __m256i slo = _mm256_set1_epi16((short)(sm[2 * c] * at->m[2 * c]));
                __m256i shi = _mm256_set1_epi16((short)(sm[2 * c + 1] * at->m[2 * c + 1]));
                __m256i p = _mm256_add_epi32(
                    qmm_mul_sum_i16(lo, _mm256_loadu_si256((const __m256i *)aq), slo),
                    qmm_mul_sum_i16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)), shi));
                isum[t] = _mm256_add_epi32(isum[t], p);
            }
        }
        __m256i mins16 = qmm_k4_mins16(sm);
        float d = qmm_half(b), dmin = qmm_half(b + 2);
        for (int t = 0; t < nt; t++) {
            const struct qmm_act_k *a = x + t * xs + i;
            __m256i pm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins16);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * a->d),
                                     acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_set1_ps(dmin * a->d),
                                      accm[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]) - qmm_hsum(accm[t]);
}

QMM_INLINE void qmm_dot_q4_k_n(int64_t K, const void *w, const void *x, int64_t xs, const int nt,
                               float *out)
{
    qmm_dot_k4_n(false, K, w, x, xs, nt, out);
}

QMM_INLINE void qmm_dot_q5_k_n(int64_t K, const void *w, const void *x, int64_t xs, const int nt,
                               float *out)
{
    qmm_dot_k4_n(true, K, w, x, xs, nt, out);
}

/* Q6_K: per 128 elements 64 bytes of low nibbles and 32 of 2-bit highs;
 * group g of 32 takes nibble (g & 2 ? high : low) of ql[(g & 1) * 32 + l]
 * and bits 2g..2g+1 of qh[l]; each 16 elements have an int8 scale. The
 * codes 0..63 go in unsigned, 32 * scale * bsum comes off after. */
QMM_INLINE void qmm_dot_q6_k_n(int64_t K, const void *w, const void *x_, int64_t xs, const int nt,
                               float *out)
{
    const struct qmm_act_k *x = x_;
    __m256 acc[QMM_MAX_T];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    const __m256i lo4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 256; i++, b += 210) {
        const int8_t *sc = (const int8_t *)(b + 192);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        __m256i isum[QMM_MAX_T];
        for (int t = 0; t < nt; t++) {
            __m256i off = _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)x[t * xs + i].bsums), sc16);
            isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qhp = b + 128 + 32 * h;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i nib[4] = {_mm256_and_si256(l0, lo4), _mm256_and_si256(l1, lo4),
                              _mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                              _mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4)};
            for (int g = 0; g < 4; g++) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), two);
                __m256i q = _mm256_or_si256(nib[g], _mm256_slli_epi16(hi, 4));
                int gi = 8 * h + 2 * g;
                __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[gi + 1]), _mm_set1_epi16(sc[gi]));
                for (int t = 0; t < nt; t++) {
                    const struct qmm_act_k *at = x + t * xs + i;
                    const int8_t *aq = at->q + 128 * h + 32 * g;
                    __m256i sm = _mm256_mullo_epi16(scale, _mm256_set1_epi16(at->m[gi / 2]));
                    isum[t] = _mm256_add_epi32(
                        isum[t], qmm_mul_sum_i16(q, _mm256_loadu_si256((const __m256i *)aq), sm));
                }
            }
        }
        float d = qmm_half(b + 208);
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                     _mm256_set1_ps(d * x[t * xs + i].d), acc[t]);
    }
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]);
}

/* ---- x quantizers ------------------------------------------------------ *
 * The reference's arithmetic (max|x|, the scale, q = rint(x / scale) by
 * multiplying with 1 / scale), so the same bytes. */

QMM_INLINE float qmm_absmax(const float *x, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

QMM_INLINE int qmm_hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* 32 floats times id as 32 int8 codes at q; sums of the first and second 16. */
QMM_INLINE void qmm_quantize32(const float *x, float id, int8_t *q, int *sum_lo, int *sum_hi)
{
    __m256 s = _mm256_set1_ps(id);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), s));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), s));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), s));
    *sum_lo = qmm_hsum_i32(_mm256_add_epi32(i0, i1));
    *sum_hi = qmm_hsum_i32(_mm256_add_epi32(i2, i3));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
}

static void qmm_quantize_x(const float *x, int64_t n, void *out_)
{
    struct qmm_act *out = out_;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float d = qmm_absmax(x, 32) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int lo, hi;
        qmm_quantize32(x, id, out[b].q, &lo, &hi);
        out[b].d = d;
        out[b].s = d * (float)(lo + hi);
    }
}

static void qmm_quantize_x_k(const float *x, int64_t n, void *out_)
{
    struct qmm_act_k *out = out_;
    for (int64_t b = 0; b < n / 256; b++, x += 256) {
        float bmax[8], amax = 0.0f;
        for (int c = 0; c < 8; c++) {
            bmax[c] = qmm_absmax(x + 32 * c, 32);
            amax = bmax[c] > amax ? bmax[c] : amax;
        }
        float d = amax / (127.0f * 16.0f), inv = amax > 0.0f ? 16.0f / amax : 0.0f;
        for (int c = 0; c < 8; c++) {
            int m = qmm_act_k_multiplier(bmax[c], inv), lo, hi;
            float dm = d * (float)m, id = dm > 0.0f ? 1.0f / dm : 0.0f;
            qmm_quantize32(x + 32 * c, id, out[b].q + 32 * c, &lo, &hi);
            out[b].bsums[2 * c] = (int16_t)(m * lo);
            out[b].bsums[2 * c + 1] = (int16_t)(m * hi);
            out[b].m[c] = (uint8_t)m;
        }
        out[b].d = d;
    }
}

#define QMM_BY_NT(t)                                                                   \
    __attribute__((unused)) static void qmm_dot_##t(int64_t K, const void *w, const void *x, \
                                                    int64_t xs, int nt,               \
                            float *out)                                                \
    {                                                                                  \
        switch (nt) {                                                                  \
        case 1: qmm_dot_##t##_n(K, w, x, xs, 1, out); break;                           \
        case 2: qmm_dot_##t##_n(K, w, x, xs, 2, out); break;                           \
        case 3: qmm_dot_##t##_n(K, w, x, xs, 3, out); break;                           \
        default: qmm_dot_##t##_n(K, w, x, xs, 4, out); break;                          \
        }                                                                              \
    }
QMM_BY_NT(q8_0)
QMM_BY_NT(q4_0)
QMM_BY_NT(q4_1)
QMM_BY_NT(q4_k)
QMM_BY_NT(q5_k)
QMM_BY_NT(q6_k)

#endif
