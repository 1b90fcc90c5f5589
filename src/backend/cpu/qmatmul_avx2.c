/* backend/cpu/qmatmul_avx2.c — the block-format int8 dot kernels on AVX2 (vpmaddubsw + vpmaddwd). */
#include <immintrin.h>

#include "backend/cpu/qmatmul.h"

static inline __attribute__((always_inline)) __m256i qmm_dot_i32(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "backend/cpu/qmatmul_body.h"

const struct qmm_kernels cpu_qmm_avx2 = QMM_KERNEL_TABLE;
