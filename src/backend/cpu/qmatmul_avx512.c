/* backend/cpu/qmatmul_avx512.c — the block-format int8 dot kernels with AVX-512 VNNI: the 32-element types on 256 bits (vpdpbusd: one instruction for AVX2's three), the K types a 64-element strip per instruction (vpmaddubsw + vpdpwssd). */
#include <immintrin.h>

#include "backend/cpu/qmatmul.h"

static inline __attribute__((always_inline)) __m256i qmm_dot_i32(__m256i u, __m256i s)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

#include "backend/cpu/qmatmul_body.h"

/* ---- K types on 512 bits ----------------------------------------------- *
 * A zmm holds 64 codes, two 32-element groups (Q4_K, Q5_K) or four
 * 16-element ones (Q6_K); vpmaddubsw gives 32 int16 pair sums, vpdpwssd
 * multiplies each by its group's scale (permuted into place from the
 * super-block's 16 scales) and adds into 16 int32 lanes, so a super-block
 * is summed in integers and meets its float scale once per token. */

/* Lanes 0..15 index a, lanes 16..31 index b. */
QMM_INLINE __m512i qmm_idx2(int a, int b)
{
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* Lanes 8i..8i+7 index first + i. */
QMM_INLINE __m512i qmm_idx4(int first)
{
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(first + 1)),
                                                _mm_set1_epi16((short)first))),
        _mm256_set_m128i(_mm_set1_epi16((short)(first + 3)), _mm_set1_epi16((short)(first + 2))),
        1);
}

/* The 32 bytes at p, and the same shifted right by s bits, as one zmm. */
QMM_INLINE __m512i qmm_pair256(const uint8_t *p, int s)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, s), 1);
}

QMM_INLINE void qmm512_dot_k4_n(const bool q5, int64_t K, const void *w, const void *x_,
                                int64_t xs, const int nt, float *out)
{
    const struct qmm_act_k *x = x_;
    __m512 acc[QMM_MAX_T];
    __m256 accm[QMM_MAX_T];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
        accm[t] = _mm256_setzero_ps();
    }
    const __m512i lo4 = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
    const __m512i idx[4] = {qmm_idx2(0, 1), qmm_idx2(2, 3), qmm_idx2(4, 5), qmm_idx2(6, 7)};
    const size_t bytes = q5 ? 176 : 144;
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 256; i++, b += bytes) {
        uint8_t sm[16];
        qmm_scales_mins_k4(b + 4, sm);
        __m512i sm16 = _mm512_castsi256_si512(
            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm)));
        const uint8_t *qs = q5 ? b + 48 : b + 16;
        __m512i qh = q5 ? qmm_pair256(b + 16, 1) : _mm512_setzero_si512();
        /* Each group's scale times the token's multiplier of that block. */
        __m512i isum[QMM_MAX_T], scm[QMM_MAX_T];
        for (int t = 0; t < nt; t++) {
            isum[t] = _mm512_setzero_si512();
            __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)x[t * xs + i].m));
            scm[t] = _mm512_castsi128_si512(
                _mm_mullo_epi16(_mm512_castsi512_si128(sm16), m));
        }
        for (int c = 0; c < 4; c++) {
            __m512i q = _mm512_and_si512(qmm_pair256(qs + 32 * c, 4), lo4);
            if (q5)
                q = _mm512_or_si512(
                    q, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * c), one), 4));
            for (int t = 0; t < nt; t++) {
                __m512i a = _mm512_loadu_si512(x[t * xs + i].q + 64 * c);
                __m512i scale = _mm512_permutexvar_epi16(idx[c], scm[t]);
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(q, a), scale);
            }
        }
        __m256i mins16 = qmm_k4_mins16(sm);
        float d = qmm_half(b), dmin = qmm_half(b + 2);
        for (int t = 0; t < nt; t++) {
            const struct qmm_act_k *a = x + t * xs + i;
            __m256i pm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins16);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * a->d),
                                     acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_set1_ps(dmin * a->d),
                                      accm[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = _mm512_reduce_add_ps(acc[t]) - qmm_hsum(accm[t]);
}

QMM_INLINE void qmm_dot_z_q4_k_n(int64_t K, const void *w, const void *x, int64_t xs,
                                  const int nt, float *out)
{
    qmm512_dot_k4_n(false, K, w, x, xs, nt, out);
}

QMM_INLINE void qmm_dot_z_q5_k_n(int64_t K, const void *w, const void *x, int64_t xs,
                                  const int nt, float *out)
{
    qmm512_dot_k4_n(true, K, w, x, xs, nt, out);
}

/* Q6_K: per 128 elements, groups 0 and 1 (low nibbles of ql[0..64), qh
 * bits 0-1 and 2-3) in one zmm, groups 2 and 3 (high nibbles, bits 4-5 and
 * 6-7) in another, each against 64 consecutive x codes. */
QMM_INLINE void qmm_dot_z_q6_k_n(int64_t K, const void *w, const void *x_, int64_t xs,
                                  const int nt, float *out)
{
    const struct qmm_act_k *x = x_;
    __m512 acc[QMM_MAX_T];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_ps();
    const __m512i lo4 = _mm512_set1_epi8(15), three = _mm512_set1_epi8(3);
    const __m512i idx[4] = {qmm_idx4(0), qmm_idx4(4), qmm_idx4(8), qmm_idx4(12)};
    const uint8_t *b = w;
    for (int64_t i = 0; i < K / 256; i++, b += 210) {
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        __m512i isum[QMM_MAX_T], scm[QMM_MAX_T];
        for (int t = 0; t < nt; t++) {
            /* Group g's scale times the multiplier of its block, g / 2. */
            __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)x[t * xs + i].m));
            __m256i m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
            scm[t] = _mm512_castsi256_si512(_mm256_mullo_epi16(sc16, m16));
            __m256i off = _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)x[t * xs + i].bsums), sc16);
            isum[t] = _mm512_castsi256_si512(
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5)));
            isum[t] = _mm512_inserti64x4(isum[t], _mm256_setzero_si256(), 1);
        }
        for (int h = 0; h < 2; h++) {
            __m512i l = _mm512_loadu_si512(b + 64 * h);
            __m512i hh = qmm_pair256(b + 128 + 32 * h, 2);
            __m512i qa = _mm512_or_si512(_mm512_and_si512(l, lo4),
                                         _mm512_slli_epi16(_mm512_and_si512(hh, three), 4));
            __m512i qb = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(l, 4), lo4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hh, 4), three), 4));
            for (int t = 0; t < nt; t++) {
                const int8_t *aq = x[t * xs + i].q + 128 * h;
                __m512i sa = _mm512_permutexvar_epi16(idx[2 * h], scm[t]);
                __m512i sb = _mm512_permutexvar_epi16(idx[2 * h + 1], scm[t]);
                isum[t] = _mm512_dpwssd_epi32(
                    isum[t], _mm512_maddubs_epi16(qa, _mm512_loadu_si512(aq)), sa);
                isum[t] = _mm512_dpwssd_epi32(
                    isum[t], _mm512_maddubs_epi16(qb, _mm512_loadu_si512(aq + 64)), sb);
            }
        }
        float d = qmm_half(b + 208);
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]),
                                     _mm512_set1_ps(d * x[t * xs + i].d), acc[t]);
    }
    for (int t = 0; t < nt; t++)
        out[t] = _mm512_reduce_add_ps(acc[t]);
}

QMM_BY_NT(z_q4_k)
QMM_BY_NT(z_q5_k)
QMM_BY_NT(z_q6_k)

const struct qmm_kernels cpu_qmm_avx512 = {
    .dot = {[DTYPE_Q8_0] = qmm_dot_q8_0, [DTYPE_Q4_0] = qmm_dot_q4_0, [DTYPE_Q4_1] = qmm_dot_q4_1,
            [DTYPE_Q4_K] = qmm_dot_z_q4_k, [DTYPE_Q5_K] = qmm_dot_z_q5_k,
            [DTYPE_Q6_K] = qmm_dot_z_q6_k},
    .quantize_x = qmm_quantize_x,
    .quantize_x_k = qmm_quantize_x_k,
};
