/* backend/cpu/qmatmul.h — matmul over GGUF block-quantized weights: activations as int8 blocks, the per-ISA dot kernels and the driver; private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_QMATMUL_H
#define INFERD_BACKEND_CPU_QMATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include <immintrin.h>
#include <math.h>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/qgemm.h"
#include "base/bf16.h"

/* x is quantized once per call, row by row, in the form the weight type's
 * kernels read (qmm_act_k_of):
 *
 * struct qmm_act, for the 32-element types (Q8_0, Q4_0, Q4_1): 32
 * elements of an x row as x[i] ~ d * q[i], d = max|x| / 127, q =
 * rint(x / d) (ties to even, what cvtps2dq does), with s = d * sum(q)
 * (what the minimum of an affine weight block multiplies). */
struct qmm_act {
    float d, s;
    int8_t q[32];
};
#define QMM_ACT_ELEMS 32

/* struct qmm_act_k, for the K types (Q4_K, Q5_K, Q6_K): 256 elements with
 * one float scale d and, per 32 elements, a multiplier m in 1..16: x[i] ~
 * d * m[i / 32] * q[i], d = max|x| / (127 * 16), m = ceil(16 * max|x_b| /
 * max|x|) (at least 1), q = rint(x / (d * m)). A float scale per
 * super-block lets a kernel sum a whole weight super-block in integers
 * (each group's weight scale times x's m is one int16 multiplier) and pay
 * one float multiply per 256 elements, as llama.cpp's Q8_K does; the m keep
 * the step of a 32-element block within 1/16 of the largest |x| of its
 * own, so the codes are nearly as fine as a scale per 32 (the int8 error
 * of Q8_K's one scale per 256 flipped 1-2% more greedy picks of a trained
 * model). bsums[g] = m * (sum of the 16 codes of group g): the group
 * minima (Q4_K, Q5_K) and Q6_K's offset of 32 come off through them. */
struct qmm_act_k {
    _Alignas(64) int8_t q[256];
    int16_t bsums[16];
    uint8_t m[8];
    float d;
};
#define QMM_ACT_K_ELEMS 256

/* m of a 32-element block whose largest |x| is bmax, inv = 16 / max|x| of
 * the super-block (0 when it is all zeros). */
static inline int qmm_act_k_multiplier(float bmax, float inv)
{
    float r = ceilf(bmax * inv);
    return r < 1.0f ? 1 : r > 16.0f ? 16 : (int)r;
}

/* True when weight type t's kernels read struct qmm_act_k. */
static inline bool qmm_act_k_of(enum dtype t)
{
    return t == DTYPE_Q4_K || t == DTYPE_Q5_K || t == DTYPE_Q6_K;
}

/* Tokens one kernel call dots with a weight row (the row's blocks are
 * unpacked once for all of them). */
#define QMM_MAX_T 4

/* out[t] = sum over c < K of W[c] * x_t[c] for t < nt (1..QMM_MAX_T), W one
 * row of its block type at w, x_t the t-th activation row: x + t * x_stride
 * elements of x's form (struct qmm_act or struct qmm_act_k, by W's type).
 * Each weight (super-)block's integer dot with x is exact; the scaled sums
 * are f32 in an order fixed by the kernel, the same for every nt, so a
 * token's result does not depend on how many share the call. */
typedef void (*qmm_dot_fn)(int64_t K, const void *w, const void *x, int64_t x_stride, int nt,
                           float *out);

/* n floats of one x row (a multiple of 32 or 256) into n / 32 struct
 * qmm_act or n / 256 struct qmm_act_k. Every ISA's version gives the same
 * bytes. */
typedef void (*qmm_quantize_fn)(const float *x, int64_t n, void *out);

/* One ISA's int8 kernels by weight type; NULL: the type has none there and
 * runs on the generic path (blocks dequantized to f32 on the stack, dotted
 * with the f32 x). */
struct qmm_kernels {
    qmm_dot_fn dot[DTYPE_COUNT];
    qmm_quantize_fn quantize_x;   /* struct qmm_act rows */
    qmm_quantize_fn quantize_x_k; /* struct qmm_act_k rows */
};

extern const struct qmm_kernels cpu_qmm_scalar;  /* plain C: the reference of the others */
extern const struct qmm_kernels cpu_qmm_avx2;    /* vpmaddubsw + vpmaddwd on 256 bits */
extern const struct qmm_kernels cpu_qmm_avx512;  /* AVX-512 VNNI on 512 bits (vpdpwssd, vpdpbusd) */

/* The reference quantizers (cpu_qmm_scalar's). */
void cpu_qmm_quantize_x(const float *x, int64_t n, struct qmm_act *out);
void cpu_qmm_quantize_x_k(const float *x, int64_t n, struct qmm_act_k *out);

/* The kernels level and this processor allow (VNNI decides the AVX-512 set). */
const struct qmm_kernels *cpu_qmm_kernels_for(enum cpu_matmul_level level);

/* The driver's growable buffers: quantized activations, and the GEMM's. */
struct qmm_scratch {
    void *act; /* owned; struct qmm_act or struct qmm_act_k rows */
    size_t act_bytes;
    struct qgemm_scratch gemm;
};
void cpu_qmm_scratch_free(struct qmm_scratch *s);

/* y[i] = x * w[i]^T (+ bias[i]) for n (1..CPU_MATMUL_MAX_GROUP) matrices of
 * one block dtype and equal cols, threads of pool sharing the rows. A FAST
 * step of QGEMM_MIN_T tokens or more runs gemm (qgemm.h) when it is not
 * NULL; the rest, EXACT steps always, run k's dot kernels, whose bits for a
 * token do not depend on the others. */
void cpu_qmm_run(struct threadpool *pool, const struct qmm_kernels *k, qgemm_fn gemm,
                 enum compute_mode mode, struct qmm_scratch *s, const float *x, int64_t T, int n,
                 const struct weight_matrix *const *w, const float *const *bias,
                 float *const *y);

/* ---- block fields, shared by the kernel files ----------------------- */

static inline float qmm_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h); /* the baseline build has F16C: one instruction */
#else
    return f16_to_f32(h);
#endif
}

/* Q4_K/Q5_K's 12 packed bytes of 6-bit scales and mins as 8 scale bytes
 * then 8 min bytes (llama.cpp's unpacking, four words at a time). */
static inline void qmm_scales_mins_k4(const uint8_t *q, uint8_t out[16])
{
    uint32_t u[4];
    memcpy(u, q, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    uint32_t mins_lo = u[1] & m6;
    u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    u[2] = mins_lo;
    u[0] &= m6;
    memcpy(out, u, 16);
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
