/* backend/cpu/qgemm.h — the prefill GEMM over block-quantized weights: int8 panels unpacked per call, 16 tokens per kernel, AVX2, AVX-VNNI, AVX-512 VNNI and AMX-INT8 kernels; private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_QGEMM_H
#define INFERD_BACKEND_CPU_QGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"

/* A FAST-mode step of at least this many tokens runs the GEMM; shorter ones
 * (and every EXACT step: its bits must not depend on the batch) run the
 * decode kernels. A step pays for a whole group of QGEMM_TOKENS: on one
 * Zen 4 core at K = 1024, 16 tokens ran at 230 (Q4_K) and 280 (Q8_0)
 * GFLOP/s against the decode kernels' 145 and 110, so the GEMM wins from
 * 16 * 145 / 230 = 10 tokens on. */
#define QGEMM_MIN_T 12

#define QGEMM_TOKENS 16 /* tokens per x group: one zmm of int32 lanes, one AMX tile */
#define QGEMM_ROWS 16   /* weight rows per panel (per kernel call) */

/* QGEMM_ROWS rows of a weight matrix, unpacked from their blocks for one
 * call (never kept: the file's blocks stay the only copy of the weights).
 * Along K the rows are cut into blocks of blk elements (32, or 16 for
 * Q6_K's per-16 scales), and weight w[r][c] = scale[b][r] * q[r][c] +
 * min[b][r] with b = c / blk (min absent: 0). Rows past the matrix are
 * zero codes and zero scales. */
struct qgemm_w {
    const int8_t *q;      /* QGEMM_ROWS x K codes, row r at q + r * K */
    const int32_t *corr;  /* [K / blk][QGEMM_ROWS]: -128 * (sum of the block's codes) */
    const float *scale;   /* [K / blk][QGEMM_ROWS] */
    const float *min;     /* [K / blk][QGEMM_ROWS], or NULL */
    int code_max;         /* the largest |code| the type's panels hold: 8
                             Q4_0, 15 Q4_1 and Q4_K, 31 Q5_K, 32 Q6_K, 128
                             Q8_0 (how the AVX2 kernel keeps vpmaddubsw
                             from saturating) */
};

/* QGEMM_TOKENS tokens of x, quantized per 32 elements (x[t][c] ~ d[c /
 * 32][t] * code) and laid out for the dot instructions: the codes plus 128
 * (so unsigned, what vpdpbusd's vector operand and AMX's B tile take;
 * corr takes the 128 back off) in quads, [K / 4][token][4], so a quad of
 * all 16 tokens is 64 bytes: one zmm, or one row of an AMX B tile. Tokens
 * past the step have codes 0 (+128) and zero scales. */
struct qgemm_x {
    const uint8_t *q; /* K / 4 x 64 bytes */
    const float *d;   /* [K / 32][QGEMM_TOKENS] */
    const float *s;   /* [K / 32][QGEMM_TOKENS]: d * (sum of the block's codes) */
};

/* out[r][t] = sum over the K / blk blocks b of
 *     (float)(corr[b][r] + sum over c in b of q[r][c] * xq[t][c])
 *         * (scale[b][r] * d[b'][t]) + min[b][r] * s[b'][t],
 * b' = b * blk / 32, xq the codes + 128 as stored: the bracket is the
 * block's exact integer dot with x's codes, and each block meets one float
 * multiply-add per (row, token). blk is 32 or 16, K a multiple of 32. */
typedef void (*qgemm_fn)(int64_t K, int blk, const struct qgemm_w *w, const struct qgemm_x *x,
                         float out[QGEMM_ROWS][QGEMM_TOKENS]);

/* Every kernel gives the same bits: the same exact integer block sums,
 * each block added as fmaf(sum, scale * d, acc) then, with a minimum,
 * fmaf(s, min, acc), blocks in order from a zero acc. */
extern const qgemm_fn cpu_qgemm_scalar;       /* plain C: the reference of the others */
extern const qgemm_fn cpu_qgemm_avx2;         /* AVX2: vpmaddubsw + vpmaddwd, 8 tokens a ymm */
extern const qgemm_fn cpu_qgemm_avxvnni;      /* AVX-VNNI: vpdpbusd (VEX) on ymm */
extern const qgemm_fn cpu_qgemm_avxvnni_evex; /* cpu_qgemm_avxvnni's code with AVX-512
                                                 VNNI's ymm vpdpbusd: tests run it where
                                                 AVX-VNNI is absent */
extern const qgemm_fn cpu_qgemm_vnni;         /* AVX-512 VNNI: vpdpbusd, tokens in lanes */
extern const qgemm_fn cpu_qgemm_amx;          /* AMX-INT8 tiles (tdpbsud) */
extern const qgemm_fn cpu_qgemm_amx_emulated; /* cpu_qgemm_amx's code with each tile
                                                 instruction done in C: runs on any
                                                 AVX-512 VNNI machine, so tests check the
                                                 AMX operand layout where AMX is absent */

/* The kernel level and this processor allow: AMX-INT8, AVX-512 VNNI, then
 * at level avx2 (or an AVX-512 CPU without VNNI) AVX-VNNI where CPUID
 * reports it, else AVX2; scalar at level scalar. */
qgemm_fn cpu_qgemm_kernel_for(enum cpu_matmul_level level);

/* True when weights of type t unpack into struct qgemm_w. */
bool cpu_qgemm_takes(enum dtype t);

/* The GEMM's growable buffers: x groups, and each thread's panels. */
struct qgemm_scratch {
    void *x;       /* owned; the step's x groups */
    size_t x_bytes;
    void **panels; /* owned; one buffer per thread (each owned) */
    int n_panels;
    size_t panel_bytes;
};
void cpu_qgemm_scratch_free(struct qgemm_scratch *s);

/* y[i] = x * w[i]^T (+ bias[i]) for n matrices of one type and equal cols
 * K, x given as T rows already quantized by the type's quantizer (xs
 * struct qmm_act or struct qmm_act_k each, act_size bytes apiece), threads
 * of pool sharing the rows. False, with nothing written, when the buffers
 * do not fit in memory (the caller then runs the decode kernels). */
bool cpu_qgemm_run(struct threadpool *pool, qgemm_fn fn, struct qgemm_scratch *s, const void *xa,
                   size_t act_size, int64_t xs, int64_t T, int n,
                   const struct weight_matrix *const *w, const float *const *bias,
                   float *const *y);

#endif
