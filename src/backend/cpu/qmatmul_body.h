/* backend/cpu/qmatmul_body.h — the int8 dot kernels of Q8_0, Q4_0, Q4_K and Q6_K on 256-bit vectors, written once over the qmm_dot_i32 primitive the including ISA file defines. */
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

QMM_INLINE void qmm_dot_q8_0_n(int64_t K, const void *w, const struct qmm_act *x, int64_t xs,
                                 const int nt, float *out)
{
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

QMM_INLINE void qmm_dot_q4_0_n(int64_t K, const void *w, const struct qmm_act *x, int64_t xs,
                                 const int nt, float *out)
{
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

/* Q4_K: per 64 elements 32 bytes of nibbles, low nibbles the first 32
 * (sub-block 2c), high the next; x = d * sc * q - dmin * m, q in 0..15, so
 * the unsigned nibbles go in as they are and the minimum is taken off with
 * x's block sums. */
QMM_INLINE void qmm_dot_q4_k_n(int64_t K, const void *w, const struct qmm_act *x, int64_t xs,
                                 const int nt, float *out)
{
    __m256 acc[QMM_MAX_T];
    float mins[QMM_MAX_T];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_setzero_ps();
        mins[t] = 0.0f;
    }
    const __m256i lo4 = _mm256_set1_epi8(15);
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 256; i++, b += 144) {
        float d = qmm_half(b), dmin = qmm_half(b + 2);
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
            __m256i q[2] = {_mm256_and_si256(raw, lo4),
                            _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4)};
            for (int h = 0; h < 2; h++) {
                int sc, m;
                qmm_scale_min_k4(2 * c + h, b + 4, &sc, &m);
                float dsc = d * (float)sc, dm = dmin * (float)m;
                for (int t = 0; t < nt; t++) {
                    const struct qmm_act *a = x + t * xs + i * 8 + 2 * c + h;
                    __m256i s = qmm_dot_i32(q[h], qmm_load_act(a));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dsc * a->d),
                                             acc[t]);
                    mins[t] += dm * a->s;
                }
            }
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]) - mins[t];
}

/* Q6_K: per 128 elements 64 bytes of low nibbles and 32 of 2-bit highs;
 * the 32-element group g takes nibble (g & 2 ? high : low) of ql[(g & 1) *
 * 32 + l] and bits 2g..2g+1 of qh[l]; q - 32 is signed, and each half of
 * the group has its own int8 scale, applied to the int32 lanes (the lower
 * four hold elements 0..15). */
QMM_INLINE void qmm_dot_q6_k_n(int64_t K, const void *w, const struct qmm_act *x, int64_t xs,
                                 const int nt, float *out)
{
    __m256 acc[QMM_MAX_T];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    const __m256i lo4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    const __m256i bias = _mm256_set1_epi8(32);
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 256; i++, b += 210) {
        float d = qmm_half(b + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qhp = b + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i nib[4] = {_mm256_and_si256(l0, lo4), _mm256_and_si256(l1, lo4),
                              _mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                              _mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4)};
            for (int g = 0; g < 4; g++) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), two);
                __m256i wq = _mm256_sub_epi8(_mm256_or_si256(nib[g], _mm256_slli_epi16(hi, 4)),
                                             bias);
                __m256i aw = _mm256_sign_epi8(wq, wq);
                __m256i scale = _mm256_setr_epi32(sc[2 * g], sc[2 * g], sc[2 * g], sc[2 * g],
                                                  sc[2 * g + 1], sc[2 * g + 1], sc[2 * g + 1],
                                                  sc[2 * g + 1]);
                for (int t = 0; t < nt; t++) {
                    const struct qmm_act *a = x + t * xs + i * 8 + 4 * h + g;
                    __m256i s = qmm_dot_i32(aw, _mm256_sign_epi8(qmm_load_act(a), wq));
                    s = _mm256_mullo_epi32(s, scale);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * a->d),
                                             acc[t]);
                }
            }
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = qmm_hsum(acc[t]);
}

/* Each kernel instantiated per token count, so its accumulators live in
 * registers (a loop bound the compiler knows). */
#define QMM_BY_NT(t)                                                                   \
    static void qmm_dot_##t(int64_t K, const void *w, const struct qmm_act *x, int64_t xs, \
                            int nt, float *out)                                        \
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
QMM_BY_NT(q4_k)
QMM_BY_NT(q6_k)

#define QMM_KERNEL_TABLE                                                              \
    {.dot = {[DTYPE_Q8_0] = qmm_dot_q8_0, [DTYPE_Q4_0] = qmm_dot_q4_0,               \
             [DTYPE_Q4_K] = qmm_dot_q4_k, [DTYPE_Q6_K] = qmm_dot_q6_k}}

#endif
