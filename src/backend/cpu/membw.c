/* backend/cpu/membw.c — measuring the machine: DRAM read bandwidth, f32 FMA peak, achieved GEMM rate. */
#include "backend/cpu/matmul.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/matmul_kernels.h"
#include "base/bf16.h"
#include "base/threadpool.h"
#include "base/timer.h"

#define MAX_THREADS 1024
#define READ_PASSES 5
#define FMA_ITERS 4000000L /* x 12 FMAs per thread: tens of milliseconds */
#define FMA_RUNS 3
#define GEMM_T 256
#define GEMM_K 1024
#define GEMM_N 1024
#define GEMM_RUNS 5

/* ---- read bandwidth ---------------------------------------------------- */

struct read_job {
    char *buf;
    size_t bytes;
    uint64_t sink[MAX_THREADS]; /* keeps the reads from being optimised away */
};

/* Each thread touches its own share first, so the pages it later reads are
 * local to it on a NUMA machine. */
static void touch_job(void *ctx, int ith, int nth)
{
    struct read_job *j = ctx;
    long b, e;
    threadpool_split((long)j->bytes, ith, nth, 4096, &b, &e);
    memset(j->buf + b, (int)(ith + 1), (size_t)(e - b));
}

/* Four independent 256-bit streams of loads folded with xor: cheap enough
 * that the loop is bound by memory, not by the core. */
static void read_job_fn(void *ctx, int ith, int nth)
{
    struct read_job *j = ctx;
    long b, e;
    threadpool_split((long)j->bytes, ith, nth, 4096, &b, &e);
    const __m256i *p = (const __m256i *)(j->buf + b);
    size_t n = (size_t)(e - b) / 128;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i++, p += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(p));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(p + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(p + 3));
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    j->sink[ith] = (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

double cpu_measure_read_bandwidth(struct threadpool *pool, size_t bytes)
{
    bytes = bytes / 4096 * 4096;
    if (bytes == 0)
        return 0.0;
    struct read_job *j = calloc(1, sizeof *j);
    if (!j)
        return 0.0;
    j->buf = aligned_alloc(2u << 20, (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20));
    if (!j->buf) {
        free(j);
        return 0.0;
    }
    j->bytes = bytes;
    madvise(j->buf, bytes, MADV_HUGEPAGE); /* fewer TLB misses; a hint only */
    threadpool_run(pool, touch_job, j);
    double best = 0.0;
    for (int pass = 0; pass < READ_PASSES; pass++) {
        double t0 = now_s();
        threadpool_run(pool, read_job_fn, j);
        double dt = now_s() - t0;
        double gbs = (double)bytes / dt * 1e-9;
        best = gbs > best ? gbs : best;
    }
    free(j->buf);
    free(j);
    return best;
}

/* ---- FMA peak ---------------------------------------------------------- */

struct fma_job {
    bool zmm; /* 512-bit chains (AVX-512 CPUs) rather than 256-bit */
    float sink[MAX_THREADS];
};

/* Twelve independent chains: enough to cover 4-cycle latency on two FMA
 * pipes with room to spare. acc * 0.999999 + 1e-6 stays finite forever. */
static void fma_job_fn(void *ctx, int ith, int nth)
{
    (void)nth;
    struct fma_job *j = ctx;
    if (j->zmm) {
        j->sink[ith] = cpu_mm_fma_chains_avx512(FMA_ITERS);
        return;
    }
    const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
    __m256 acc[12];
    for (int i = 0; i < 12; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < FMA_ITERS; it++)
        for (int i = 0; i < 12; i++)
            acc[i] = _mm256_fmadd_ps(acc[i], m, a);
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, acc[i]);
    j->sink[ith] = _mm256_cvtss_f32(s);
}

double cpu_measure_fma_peak_gflops(struct threadpool *pool, enum cpu_matmul_level level)
{
    struct fma_job *j = calloc(1, sizeof *j);
    if (!j)
        return 0.0;
    j->zmm = level >= CPU_MATMUL_AVX512 && cpu_matmul_detect_level() >= CPU_MATMUL_AVX512;
    double flops = (double)threadpool_size(pool) * FMA_ITERS * 12 * (j->zmm ? 16 : 8) * 2;
    double best = 0.0;
    for (int run = 0; run < FMA_RUNS; run++) {
        double t0 = now_s();
        threadpool_run(pool, fma_job_fn, j);
        double g = flops / (now_s() - t0) * 1e-9;
        best = g > best ? g : best;
    }
    free(j);
    return best;
}

/* ---- GEMM rate --------------------------------------------------------- */

double cpu_measure_gemm_gflops(struct cpu_matmul *mm, enum compute_mode mode)
{
    float *x = malloc(sizeof(float) * GEMM_T * GEMM_K);
    uint16_t *w = malloc(sizeof(uint16_t) * GEMM_N * GEMM_K);
    float *y = malloc(sizeof(float) * GEMM_T * GEMM_N);
    double best = 0.0;
    if (x && w && y) {
        uint32_t s = 12345;
        for (long i = 0; i < GEMM_T * GEMM_K; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = (float)(s >> 8) / (float)(1u << 24) - 0.5f;
        }
        for (long i = 0; i < GEMM_N * GEMM_K; i++) {
            s = s * 1664525u + 1013904223u;
            w[i] = f32_to_bf16(((float)(s >> 8) / (float)(1u << 24) - 0.5f) * 0.1f);
        }
        struct weight_matrix wm = {.dtype = DTYPE_BF16, .rows = GEMM_N, .cols = GEMM_K, .data = w};
        cpu_matmul_run(mm, mode, x, GEMM_T, &wm, NULL, y); /* warm caches and threads */
        for (int run = 0; run < GEMM_RUNS; run++) {
            double t0 = now_s();
            cpu_matmul_run(mm, mode, x, GEMM_T, &wm, NULL, y);
            double g = 2.0 * GEMM_T * GEMM_K * GEMM_N / (now_s() - t0) * 1e-9;
            best = g > best ? g : best;
        }
    }
    free(x);
    free(w);
    free(y);
    return best;
}
