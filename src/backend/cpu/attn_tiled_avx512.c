/* backend/cpu/attn_tiled_avx512.c — FAST mode's tiled prefill attention in AVX-512: sixteen queries per vector, thirty-two per tile. */
#include <immintrin.h>

/* exp(x) for 16 floats: vec_exp8's range reduction and polynomial, sixteen lanes. */
static inline __m512 exp16(__m512 x)
{
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447505531f);
    x = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    __m512 x2 = _mm512_mul_ps(x, x);
    y = _mm512_fmadd_ps(y, x2, _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127));
    return _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
}

#define TA_VL 16
#define TA_V __m512
#define TA_MASK __mmask16
#define TA_ZERO() _mm512_setzero_ps()
#define TA_LOAD(p) _mm512_loadu_ps(p)
#define TA_STORE(p, x) _mm512_storeu_ps(p, x)
#define TA_SET1(x) _mm512_set1_ps(x)
#define TA_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define TA_MUL(a, b) _mm512_mul_ps(a, b)
#define TA_ADD(a, b) _mm512_add_ps(a, b)
#define TA_SUB(a, b) _mm512_sub_ps(a, b)
#define TA_MAX(a, b) _mm512_max_ps(a, b)
#define TA_EXP(x) exp16(x)
/* lanes whose [first, last] holds pos */
#define TA_VALID(pos, first, last)                                                                 \
    (_mm512_cmp_ps_mask(pos, first, _CMP_GE_OQ) & _mm512_cmp_ps_mask(pos, last, _CMP_LE_OQ))
#define TA_SELECT(mask, yes, no) _mm512_mask_blend_ps(mask, no, yes)
/* thirty-two registers: up to 24 accumulators + the query or V vectors + a broadcast */
#define TA_JB1 16
#define TA_JB2 12
#define TA_DV 4
#define TA_TILE cpu_tattn_tile_avx512

#include "backend/cpu/attn_tiled_body.h"
