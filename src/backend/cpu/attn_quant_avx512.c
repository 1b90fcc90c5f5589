/* backend/cpu/attn_quant_avx512.c — quantized attention's row kernel in AVX-512: sixteen codes decoded per instruction, the same bits as the AVX2 kernel. */
#include <float.h>
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/attn_quant_kernels.h"
#include "backend/cpu/vec_avx512.h"
#include "backend/kv_quant.h"

/* Codes d .. d + 15 (d a multiple of 16) as sixteen 32-bit indices. */
static inline __m512i codes16(const uint8_t *codes, int d, int bits)
{
    if (bits == 8)
        return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + d)));
    if (bits == 5) {
        int32_t c[16];
        for (int i = 0; i < 16; i++)
            c[i] = kvq_get_code(codes, d + i, 5);
        return _mm512_loadu_si512(c);
    }
    /* sixteen codes fill 2 * bits <= 8 bytes: the first eight in the low
     * 8 * bits, the rest above; each half broadcast to eight lanes */
    uint64_t w = qattn_load_le(codes + d * bits / 8, 2 * bits);
    uint32_t lo = (uint32_t)(w & ((1ull << (8 * bits)) - 1)), hi = (uint32_t)(w >> (8 * bits));
    __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)lo)),
                                      _mm256_set1_epi32((int)hi), 1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512i shift = _mm512_mullo_epi32(lane, _mm512_set1_epi32(bits));
    return _mm512_and_si512(_mm512_srlv_epi32(both, shift), _mm512_set1_epi32((1 << bits) - 1));
}

/* levels[idx] for sixteen indices: one register permute for up to 16
 * levels, two registers for 32, a gather for 256. */
static inline __m512 lookup16(__m512i idx, int bits, const float *levels)
{
    if (bits <= 4)
        return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(levels));
    if (bits == 5)
        return _mm512_permutex2var_ps(_mm512_loadu_ps(levels), idx, _mm512_loadu_ps(levels + 16));
    return _mm512_i32gather_ps(idx, levels, 4);
}

/* As the AVX2 decode_record: the same products and fused multiply-adds per
 * element, sixteen at a time. */
static inline void decode_record16(const struct kv_quant_layer *l, const float *levels, int hd,
                                   bool v, const uint8_t *rec, float *out)
{
    int bits = kvq_code_bits(l, v);
    if (l->scheme == KV_QUANT_AFFINE) {
        int g = l->group_size;
        const uint8_t *sb = rec + hd * bits / 8; /* each group's f16 scale and bias */
        for (int g0 = 0; g0 < hd; g0 += g, sb += 4) {
            __m512 scale = _mm512_set1_ps(qattn_load_f16(sb));
            __m512 bias = _mm512_set1_ps(qattn_load_f16(sb + 2));
            for (int d = g0; d < g0 + g; d += 16)
                _mm512_storeu_ps(out + d, _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes16(rec, d, bits)),
                                                          scale, bias));
        }
        return;
    }
    if (l->scheme == KV_QUANT_TURBO) {
        bool qjl = !v && l->qjl;
        __m512 s = _mm512_set1_ps(qattn_load_f16(rec));
        const uint8_t *codes = rec + (qjl ? 4 : 2);
        for (int d = 0; d < hd; d += 16)
            _mm512_storeu_ps(out + d, _mm512_mul_ps(s, lookup16(codes16(codes, d, bits), bits, levels)));
        return;
    }
    memcpy(out, rec, (size_t)hd * sizeof(float));
}

/* z[d] = +1 or -1 from the QJL sign bits of a key record: a mask register per 16. */
static inline void decode_signs16(const struct kv_quant_layer *l, int hd, const uint8_t *rec,
                                  float *z)
{
    const uint8_t *signs = rec + 4 + hd * kvq_code_bits(l, false) / 8;
    const __m512 one = _mm512_set1_ps(1.0f), minus = _mm512_set1_ps(-1.0f);
    for (int d = 0; d < hd; d += 16) {
        uint16_t m;
        memcpy(&m, signs + d / 8, 2);
        _mm512_storeu_ps(z + d, _mm512_mask_blend_ps((__mmask16)m, minus, one));
    }
}

/* vec_dot's sum (vec_avx2.h) in half the instructions: its two 8-lane
 * accumulators s0 (elements i % 16 < 8) and s1 are this one's halves, the
 * tail of eight its lower half, then the same horizontal sum. n a multiple of 8. */
static inline float dot16(const float *a, const float *b, int64_t n)
{
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    if (i + 8 <= n)
        s = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(0xff, a + i),
                                  _mm512_maskz_loadu_ps(0xff, b + i), s, 0xff);
    __m256 s0 = _mm512_castps512_ps256(s), s1 = _mm512_extractf32x8_ps(s, 1);
    __m256 t = _mm256_add_ps(s0, s1);
    __m128 lo = _mm256_castps256_ps128(t), hi = _mm256_extractf128_ps(t, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* The first n (any count) of sixteen lanes. */
static inline __mmask16 lanes16(int n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* The largest of s[0, n). */
static inline float row_max16(const float *s, int n)
{
    __m512 m = _mm512_set1_ps(-FLT_MAX);
    for (int j = 0; j < n; j += 16)
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, lanes16(n - j), s + j));
    return _mm512_reduce_max_ps(m);
}

/* s[j] = exp(s[j] - shift) for j < n by vec_exp16; returns their sum: each lane adds its
 * positions in order (a masked tail's other lanes add nothing), then the AVX2 kernel's tree. */
static inline float row_exp16(float *s, int n, float shift)
{
    const __m512 vs = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 k = lanes16(n - j);
        __m512 e = vec_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vs));
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
    return _mm_cvtss_f32(qattn_reduce4(h, h, h, h));
}

/* Sixteen floats a register; a row's halves (elements 0-7 and 8-15 of each sixteen) added as
 * the AVX2 kernel adds its two accumulators. */
#define QA_V __m512
#define QA_V_LOAD(p) _mm512_loadu_ps(p)
#define QA_V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define QA_V_ZERO() _mm512_setzero_ps()
#define QA_V_SET1(x) _mm512_set1_ps(x)
#define QA_V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define QA_V_MUL(a, b) _mm512_mul_ps((a), (b))
#define QA_V_HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps((v), 1))
#define QA_QK_HEADS 4  /* heads scored together: 16 sums of four positions in registers */
#define QA_PV_SLICES 2 /* sixteen-float slices of P V's rows a pass */

#define QA_DECODE_RECORD decode_record16
#define QA_DECODE_SIGNS decode_signs16
#define QA_DOT dot16
#define QA_ROW_MAX row_max16
#define QA_ROW_EXP row_exp16
#define QA_GROUP attend_group_avx512
#define QA_ROWS cpu_qattn_rows_avx512
#include "backend/cpu/attn_quant_group.h"
