/* backend/cpu/matmul.h — y = x·Wᵀ (+ bias) on the CPU: decode GEMV and prefill GEMM, per ISA level. */
#ifndef INFERD_BACKEND_CPU_MATMUL_H
#define INFERD_BACKEND_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"

struct threadpool;

/* Instruction-set levels of the kernels, lowest first. Each level also uses
 * the ones below it where it has nothing better (AMX only multiplies bf16
 * weights in FAST mode with enough tokens; the rest falls to AVX-512). */
enum cpu_matmul_level {
    CPU_MATMUL_SCALAR = 0, /* plain C: the reference the vector paths are tested against */
    CPU_MATMUL_AVX2,       /* AVX2 + FMA (x86-64-v3): the baseline build */
    CPU_MATMUL_AVX512,     /* AVX-512 F/BW/VL/DQ */
    CPU_MATMUL_AVX512BF16, /* + vdpbf16ps for the FAST-mode decode GEMV of bf16 weights */
    CPU_MATMUL_AMX,        /* + AMX-BF16 tiles for FAST-mode prefill */
};
#define CPU_MATMUL_N_LEVELS 5

/* A matmul context: the thread pool it runs on (borrowed) and per-thread
 * packing scratch. One caller thread at a time, like the pool. */
struct cpu_matmul;

int cpu_matmul_create(struct threadpool *pool, struct cpu_matmul **out, struct err *err);
void cpu_matmul_free(struct cpu_matmul *mm);

struct cpu_features;

/* The best level features f allow. */
enum cpu_matmul_level cpu_matmul_level_of(const struct cpu_features *f);
/* The best level this processor allows: cpu_matmul_level_of(cpu_features()). */
enum cpu_matmul_level cpu_matmul_detect_level(void);
/* Makes mm use level (contexts start at cpu_matmul_detect_level()); a level
 * above the detected one is -INFERD_EUNSUPPORTED. Tests and benchmarks use
 * this to run every available level in one process. */
int cpu_matmul_set_level(struct cpu_matmul *mm, enum cpu_matmul_level level, struct err *err);
enum cpu_matmul_level cpu_matmul_get_level(const struct cpu_matmul *mm);
const char *cpu_matmul_level_name(enum cpu_matmul_level level);

/* y[t, r] = sum_c x[t, c] * W[r, c] (+ bias[r] when bias != NULL) for t < T.
 * x is T x w->cols f32 row-major, y is T x w->rows; w is F32, BF16 or F16,
 * or a GGUF block type, read in place. Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and
 * Q6_K weights are dotted with x quantized to int8 blocks (qmatmul.c, in
 * both modes: what llama.cpp computes; FAST prompts through the int8 GEMM
 * of qgemm.c), the other block types block by block dequantized to f32
 * against f32 x. FAST rounds x to bf16 (nearest even) before multiplying;
 * both modes accumulate in f32. Small T streams W once (GEMV); larger T
 * packs cache blocks (GEMM). Threads of the context's pool share the work. */
void cpu_matmul_run(struct cpu_matmul *mm, enum compute_mode mode, const float *x, int64_t T,
                    const struct weight_matrix *w, const float *bias, float *y);

/* The same input through n matrices of equal cols and dtype (q/k/v, or
 * gate/up): y[i] = x * w[i]^T (+ bias[i]). A decode-sized T runs as one
 * parallel job over the matrices' rows together, so small matrices do not
 * each pay a fork-join and a prefetch ramp; larger T runs them in turn. */
#define CPU_MATMUL_MAX_GROUP 4
void cpu_matmul_run_group(struct cpu_matmul *mm, enum compute_mode mode, const float *x, int64_t T,
                          int n, const struct weight_matrix *const *w, const float *const *bias,
                          float *const *y);

/* ---- measuring the machine (membw.c) ----------------------------------- */

/* Reads a bytes-sized buffer (make it many times the last-level cache, e.g.
 * 1 GiB) with every thread of pool, several times; returns the best GB/s
 * (1e9 bytes), or 0 when the buffer cannot be allocated. */
double cpu_measure_read_bandwidth(struct threadpool *pool, size_t bytes);

/* f32 FMA throughput of every thread of pool on independent FMA chains of
 * the widest vectors level uses (256-bit, or 512-bit from AVX-512 up), in
 * GFLOP/s (an FMA counts 2): the ceiling the f32 GEMM is judged by. bf16
 * dot products (vdpbf16ps, AMX) can exceed it. */
double cpu_measure_fma_peak_gflops(struct threadpool *pool, enum cpu_matmul_level level);

/* GFLOP/s of a cache-friendly GEMM through cpu_matmul_run (T=256 tokens,
 * K=N=1024, bf16 weights), best of several runs; 0 when out of memory. */
double cpu_measure_gemm_gflops(struct cpu_matmul *mm, enum compute_mode mode);

#endif
