/* backend/cpu/attn_f16_avx2.c — the f16 cache's group decode kernel in AVX2 + F16C: eight dimensions per vector, three heads per register block. */
#include <immintrin.h>

#include "backend/cpu/vec_avx2.h"

/* The sums of a, b, c and d, in that order. */
static inline __attribute__((always_inline)) __m128 reduce4_avx2(__m256 a, __m256 b, __m256 c,
                                                                 __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* per 128-bit half: a, b, c, d partial sums */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

static inline __attribute__((always_inline)) float hmax256(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

#define HA_VL 8
#define HA_V __m256
#define HA_ZERO() _mm256_setzero_ps()
#define HA_LOAD(p) _mm256_loadu_ps(p)
#define HA_LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define HA_STORE(p, x) _mm256_storeu_ps(p, x)
#define HA_SET1(x) _mm256_set1_ps(x)
#define HA_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define HA_MUL(a, b) _mm256_mul_ps(a, b)
#define HA_ADD(a, b) _mm256_add_ps(a, b)
#define HA_SUB(a, b) _mm256_sub_ps(a, b)
#define HA_MAX(a, b) _mm256_max_ps(a, b)
#define HA_EXP(x) vec_exp8(x)
#define HA_HSUM(x) hsum256(x)
#define HA_HMAX(x) hmax256(x)
#define HA_REDUCE4(a, b, c, d) reduce4_avx2(a, b, c, d)
/* sixteen registers: 12 accumulators (3 heads x 4 positions, or x 4 V
 * vectors) + the broadcasts or the widened K / V vector */
#define HA_GB 3
#define HA_DV 4
#define HA_GROUP cpu_hattn_group_avx2

#include "backend/cpu/attn_f16_body.h"
