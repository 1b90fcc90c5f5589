/* backend/cpu/attn_tiled_avx2.c — FAST mode's tiled prefill attention in AVX2: eight queries per vector, sixteen per tile. */
#include <immintrin.h>

#include "backend/cpu/vec_avx2.h"

#define TA_VL 8
#define TA_V __m256
#define TA_MASK __m256
#define TA_ZERO() _mm256_setzero_ps()
#define TA_LOAD(p) _mm256_loadu_ps(p)
#define TA_STORE(p, x) _mm256_storeu_ps(p, x)
#define TA_SET1(x) _mm256_set1_ps(x)
#define TA_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define TA_MUL(a, b) _mm256_mul_ps(a, b)
#define TA_ADD(a, b) _mm256_add_ps(a, b)
#define TA_SUB(a, b) _mm256_sub_ps(a, b)
#define TA_MAX(a, b) _mm256_max_ps(a, b)
#define TA_EXP(x) vec_exp8(x)
/* lanes whose [first, last] holds pos */
#define TA_VALID(pos, first, last)                                                                 \
    _mm256_and_ps(_mm256_cmp_ps(pos, first, _CMP_GE_OQ), _mm256_cmp_ps(pos, last, _CMP_LE_OQ))
#define TA_SELECT(mask, yes, no) _mm256_blendv_ps(no, yes, mask)
/* sixteen registers: 12 accumulators + the query vectors + a broadcast */
#define TA_JB1 12
#define TA_JB2 6
#define TA_DV 2
#define TA_TILE cpu_tattn_tile_avx2

#include "backend/cpu/attn_tiled_body.h"
