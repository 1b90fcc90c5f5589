/* backend/cpu/qmatmul_avx512.c — the block-format int8 dot kernels with AVX-512 VNNI (vpdpbusd on 256-bit vectors: one instruction for AVX2's three). */
#include <immintrin.h>

#include "backend/cpu/qmatmul.h"

static inline __attribute__((always_inline)) __m256i qmm_dot_i32(__m256i u, __m256i s)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

#include "backend/cpu/qmatmul_body.h"

const struct qmm_kernels cpu_qmm_avx512 = QMM_KERNEL_TABLE;
