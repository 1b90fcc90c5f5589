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

#endif
