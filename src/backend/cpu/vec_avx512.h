/* backend/cpu/vec_avx512.h — AVX-512 helpers shared by the AVX-512 and AMX kernel files (compiled with AVX-512 flags only). */
#ifndef INFERD_BACKEND_CPU_VEC_AVX512_H
#define INFERD_BACKEND_CPU_VEC_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The first n of 16 lanes. */
static inline __attribute__((always_inline)) __mmask16 mask16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* The bf16 bits of round-to-nearest-even (NaN kept quiet) in the low half
 * of each 32-bit lane: bit-identical to f32_to_bf16 in base/bf16.h. */
static inline __attribute__((always_inline)) __m512i bf16_bits(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(nan, r, quiet);
}

/* exp(x) for 16 floats: vec_exp8's range reduction and polynomial, sixteen lanes. */
static inline __attribute__((always_inline)) __m512 vec_exp16(__m512 x)
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

#endif
