/* backend/cpu/qmatmul.h — matmul over GGUF block-quantized weights: activations as int8 blocks, the per-ISA dot kernels and the driver; private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_QMATMUL_H
#define INFERD_BACKEND_CPU_QMATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "base/bf16.h"

/* One activation block: 32 elements of an x row as x[i] ≈ d * q[i], d =
 * max|x| / 127 and q = round(x / d), with s = d * sum(q) (what the minimum
 * of an affine weight block multiplies). Every weight type reads x in these
 * 32-element blocks, the K types too (llama.cpp's Q8_K uses one scale per
 * 256): a scale per 32 is never coarser, and one layout serves every type. */
struct qmm_act {
    float d, s;
    int8_t q[32];
};
#define QMM_ACT_ELEMS 32

/* Tokens one kernel call dots with a weight row (the row's blocks are
 * unpacked once for all of them). */
#define QMM_MAX_T 4

/* out[t] = sum over c < K of W[c] * x_t[c] for t < nt (1..QMM_MAX_T), W one
 * row of its block type at w, x_t = x + t * x_stride blocks (K / 32 of
 * them). Each weight block's integer dot with each activation block is exact;
 * their scaled sums are f32, in block order, the same for every nt, so a
 * token's result does not depend on how many share the call. */
typedef void (*qmm_dot_fn)(int64_t K, const void *w, const struct qmm_act *x, int64_t x_stride,
                           int nt, float *out);

/* One ISA's int8 kernels by weight type; NULL: the type has none there and
 * runs on the generic path (blocks dequantized to f32 on the stack, dotted
 * with the f32 x). */
struct qmm_kernels {
    qmm_dot_fn dot[DTYPE_COUNT];
};

extern const struct qmm_kernels cpu_qmm_scalar;  /* plain C: the reference of the others */
extern const struct qmm_kernels cpu_qmm_avx2;    /* vpmaddubsw */
extern const struct qmm_kernels cpu_qmm_avx512;  /* AVX-512 VNNI vpdpbusd */

/* n floats (a multiple of 32) of x as n / 32 activation blocks. */
void cpu_qmm_quantize_x(const float *x, int64_t n, struct qmm_act *out);

/* The kernels level and this processor allow (VNNI decides the AVX-512 set). */
const struct qmm_kernels *cpu_qmm_kernels_for(enum cpu_matmul_level level);

/* The driver's growable buffer of quantized activations. */
struct qmm_scratch {
    struct qmm_act *act; /* owned */
    size_t act_blocks;
};
void cpu_qmm_scratch_free(struct qmm_scratch *s);

/* y[i] = x * w[i]^T (+ bias[i]) for n (1..CPU_MATMUL_MAX_GROUP) matrices of
 * one block dtype and equal cols, threads of pool sharing the rows. */
void cpu_qmm_run(struct threadpool *pool, const struct qmm_kernels *k, struct qmm_scratch *s,
                 const float *x, int64_t T, int n, const struct weight_matrix *const *w,
                 const float *const *bias, float *const *y);

/* ---- block fields, shared by the kernel files ----------------------- */

static inline float qmm_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Q4_K's 6-bit scale and min of sub-block j (of 8) from its 12 packed bytes. */
static inline void qmm_scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

#endif
