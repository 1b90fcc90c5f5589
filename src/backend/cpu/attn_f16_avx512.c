/* backend/cpu/attn_f16_avx512.c — the f16 cache's group decode kernel in AVX-512: sixteen dimensions per vector, four heads per register block. */
#include <immintrin.h>

#include "backend/cpu/vec_avx512.h"

/* The sums of a, b, c and d, in that order: each folded to eight lanes, then
 * AVX2's horizontal adds. */
static inline __attribute__((always_inline)) __m128 reduce4_avx512(__m512 a, __m512 b, __m512 c,
                                                                   __m512 d)
{
#define HA_FOLD(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1))
    __m256 ab = _mm256_hadd_ps(HA_FOLD(a), HA_FOLD(b)), cd = _mm256_hadd_ps(HA_FOLD(c), HA_FOLD(d));
#undef HA_FOLD
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

#define HA_VL 16
#define HA_V __m512
#define HA_ZERO() _mm512_setzero_ps()
#define HA_LOAD(p) _mm512_loadu_ps(p)
#define HA_LOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define HA_STORE(p, x) _mm512_storeu_ps(p, x)
#define HA_SET1(x) _mm512_set1_ps(x)
#define HA_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define HA_MUL(a, b) _mm512_mul_ps(a, b)
#define HA_ADD(a, b) _mm512_add_ps(a, b)
#define HA_SUB(a, b) _mm512_sub_ps(a, b)
#define HA_MAX(a, b) _mm512_max_ps(a, b)
#define HA_EXP(x) vec_exp16(x)
#define HA_HSUM(x) _mm512_reduce_add_ps(x)
#define HA_HMAX(x) _mm512_reduce_max_ps(x)
#define HA_REDUCE4(a, b, c, d) reduce4_avx512(a, b, c, d)
/* thirty-two registers: 16 accumulators (4 heads x 4 positions, or x 4 V
 * vectors) + the broadcasts and the widened K / V vector */
#define HA_GB 4
#define HA_DV 4
#define HA_GROUP cpu_hattn_group_avx512

#include "backend/cpu/attn_f16_body.h"
