/* backend/cpu/attn_tiled_avx512.c — FAST mode's tiled prefill attention in AVX-512: sixteen queries per vector, thirty-two per tile. */
#include <immintrin.h>

#include "backend/cpu/vec_avx512.h"

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
#define TA_EXP(x) vec_exp16(x)
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
