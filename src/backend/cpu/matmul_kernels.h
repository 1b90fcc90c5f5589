/* backend/cpu/matmul_kernels.h — contract between the matmul driver (matmul.c) and its per-ISA kernel files; private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_MATMUL_KERNELS_H
#define INFERD_BACKEND_CPU_MATMUL_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

/* Decode: each weight row is streamed from memory once and dotted with all
 * T (few) activation rows. x is T x K, row stride K, already in the form
 * prepare_x made (FAST mode) or the caller's f32 (EXACT). Writes y[t, r] for
 * r in [r0, r1), y row stride N. */
struct mm_gemv {
    int max_t;  /* the driver switches to GEMM above this many tokens */
    bool x_bf16; /* x must be bf16 (uint16) rather than f32: FAST mode only */
    /* FAST mode: n floats of x rounded to bf16, written as f32 or as bf16 per
     * x_bf16 (NULL for the EXACT-mode kernels). */
    void (*prepare_x)(const float *x, int64_t n, void *dst);
    void (*run)(const void *x, int64_t T, int64_t K, const void *w, enum dtype dtype,
                const float *bias, float *y, int64_t N, int64_t r0, int64_t r1);
};

/* Prefill: BLIS-style blocking. The driver walks a thread's share of y in
 * token chunks of mc and K blocks of kc; per block pack_x lays the chunk's
 * x out as mr-row panels (L2-resident), then for each nr-row slice of W
 * pack_w makes one panel (L1-resident) and kernel multiplies it with every
 * x panel into mr x nr tiles of y. */
struct mm_gemm {
    int mr, nr;     /* register tile: tokens x outputs */
    int kc;         /* K block (a multiple of k_align) */
    int mc;         /* token chunk (a multiple of mr) */
    int k_align;    /* packed K is padded with zeros to a multiple of this */
    size_t a_elem, b_elem; /* bytes per packed x / W element */
    /* Optional per-thread setup and teardown around a job (AMX tile config). */
    void (*thread_begin)(void);
    void (*thread_end)(void);
    /* x rows [0, m) x cols [0, k) (row stride ldx) into ceil(m / mr) panels of
     * mr * kpad elements, kpad = k rounded up to k_align; rows past m and
     * columns past k are zero; round_bf16 rounds to bf16 (FAST mode). */
    void (*pack_x)(const float *x, int64_t ldx, int m, int k, bool round_bf16, void *dst);
    /* W rows [0, n) (n <= nr) x cols [0, k) (row stride ldw elements) into one
     * panel of nr * kpad elements, zero past n and k. */
    void (*pack_w)(const void *w, enum dtype dtype, int64_t ldw, int n, int k, void *dst);
    /* c[i, j] (row stride ldc), i < m, j < n: (first ? bias[j] or 0 : c[i, j])
     * plus the product of the panels over k. m <= mr, n <= nr. */
    void (*kernel)(int m, int n, int k, const void *a, const void *b, float *c, int64_t ldc,
                   const float *bias, bool first);
};

/* EXACT mode's GEMV: every output summed in the order of the same ISA's GEMM
 * (K blocks of kc, each one FMA chain from zero in column order, added to the
 * bias or to the sum so far), so a token's bits do not depend on how many
 * tokens share the call, nor on which of the two kernels the driver picks. */
extern const struct mm_gemv cpu_mm_gemv_exact_avx2;
extern const struct mm_gemv cpu_mm_gemv_exact_avx512;
extern const struct mm_gemv cpu_mm_gemv_avx2;
extern const struct mm_gemm cpu_mm_gemm_avx2;
extern const struct mm_gemv cpu_mm_gemv_avx512;
extern const struct mm_gemm cpu_mm_gemm_avx512;
extern const struct mm_gemv cpu_mm_gemv_avx512bf16;   /* bf16 weights, FAST mode */
extern const struct mm_gemm cpu_mm_gemm_avx512bf16;   /* bf16 weights, FAST mode, no AMX hardware */
/* bf16 weights in panels of 32 rows (DTYPE_BF16_P32), FAST mode; with
 * cpu_mm_gemm_avx512bf16, whose pack_w copies a panel's K block */
extern const struct mm_gemv cpu_mm_gemv_avx512bf16_panels;
extern const struct mm_gemm cpu_mm_gemm_amx;          /* bf16 weights, FAST mode */

/* The AMX weight packing (vdpbf16ps pair layout): n (<= 32) bf16 rows into pairs
 * along K, [ceil(k / 2)][32] 32-bit words, zero past n and k. For
 * DTYPE_BF16_P32, w is the block's first pair in its panel, copied as it is. */
void cpu_mm_pack_w_bf16_pairs32(const void *w, enum dtype dtype, int64_t ldw, int n, int k,
                                void *dst);

/* Runs iters rounds of 12 independent 512-bit FMA chains and returns a
 * value that depends on them: membw.c's f32 peak probe on AVX-512 CPUs. */
float cpu_mm_fma_chains_avx512(long iters);

#endif
