/* backend/cpu/qgemm_avxvnni.c — the quantized prefill GEMM with AVX-VNNI (vpdpbusd in VEX form on ymm), for CPUs that have it without AVX-512: chosen only where CPUID reports AVX-VNNI. */
#include <immintrin.h>

#include "backend/cpu/qgemm.h"

#define QGEMM_DPBUSD_YMM(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define QGEMM_YMM_KERNEL gemm_avxvnni

#include "backend/cpu/qgemm_avxvnni_body.h"

const qgemm_fn cpu_qgemm_avxvnni = gemm_avxvnni;
