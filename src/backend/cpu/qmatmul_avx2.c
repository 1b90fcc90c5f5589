/* backend/cpu/qmatmul_avx2.c — the block-format int8 dot kernels and x quantizers on AVX2 (vpmaddubsw + vpmaddwd). */
#include <immintrin.h>

#include "backend/cpu/qmatmul.h"

static inline __attribute__((always_inline)) __m256i qmm_dot_i32(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "backend/cpu/qmatmul_body.h"

const struct qmm_kernels cpu_qmm_avx2 = {
    .dot = {[DTYPE_Q8_0] = qmm_dot_q8_0, [DTYPE_Q4_0] = qmm_dot_q4_0, [DTYPE_Q4_1] = qmm_dot_q4_1,
            [DTYPE_Q4_K] = qmm_dot_q4_k, [DTYPE_Q5_K] = qmm_dot_q5_k, [DTYPE_Q6_K] = qmm_dot_q6_k},
    .quantize_x = qmm_quantize_x,
    .quantize_x_k = qmm_quantize_x_k,
};
