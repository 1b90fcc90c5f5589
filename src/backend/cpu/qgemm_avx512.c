/* backend/cpu/qgemm_avx512.c — the quantized prefill GEMM with AVX-512 VNNI (16 tokens in the lanes of a zmm, each weight quad broadcast from the panel into vpdpbusd); for tests, the AMX kernel with its tile instructions emulated in C and the AVX-VNNI kernel in EVEX form. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/qgemm.h"

#define QGEMM_INLINE static inline __attribute__((always_inline))

/* Rows per pass: 8 int32 and 8 f32 accumulators of 16 tokens each, the x
 * quad and the scales in the other zmm. */
#define VNNI_ROWS 8

/* Rows [r0, r0 + VNNI_ROWS) of the panel against the group. Each block's
 * integer sums start at corr (the 128 added to x's codes, taken back off)
 * so they leave vpdpbusd exact. */
QGEMM_INLINE void vnni_rows(int64_t K, const int blk, const bool min, const struct qgemm_w *w,
                            int r0, const struct qgemm_x *x, float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    __m512 acc[VNNI_ROWS];
    for (int r = 0; r < VNNI_ROWS; r++)
        acc[r] = _mm512_setzero_ps();
    const uint8_t *xq = x->q;
    const int8_t *wq = w->q + (size_t)r0 * (size_t)K;
    for (int64_t b = 0; b < K / blk; b++) {
        __m512i is[VNNI_ROWS];
        const int32_t *corr = w->corr + b * QGEMM_ROWS + r0;
        for (int r = 0; r < VNNI_ROWS; r++)
            is[r] = _mm512_set1_epi32(corr[r]);
        for (int k = 0; k < blk / 4; k++, xq += 64) {
            __m512i xv = _mm512_load_si512(xq);
            const int8_t *wk = wq + b * blk + 4 * k;
            for (int r = 0; r < VNNI_ROWS; r++) {
                int32_t q4;
                memcpy(&q4, wk + (size_t)r * (size_t)K, 4);
                is[r] = _mm512_dpbusd_epi32(is[r], xv, _mm512_set1_epi32(q4));
            }
        }
        int64_t bx = b * blk / 32;
        __m512 dx = _mm512_load_ps(x->d + bx * QGEMM_TOKENS);
        const float *scale = w->scale + b * QGEMM_ROWS + r0;
        for (int r = 0; r < VNNI_ROWS; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r]),
                                     _mm512_mul_ps(dx, _mm512_set1_ps(scale[r])), acc[r]);
        if (min) {
            __m512 sx = _mm512_load_ps(x->s + bx * QGEMM_TOKENS);
            const float *mn = w->min + b * QGEMM_ROWS + r0;
            for (int r = 0; r < VNNI_ROWS; r++)
                acc[r] = _mm512_fmadd_ps(sx, _mm512_set1_ps(mn[r]), acc[r]);
        }
    }
    for (int r = 0; r < VNNI_ROWS; r++)
        _mm512_store_ps(out[r0 + r], acc[r]);
}

QGEMM_INLINE void vnni_panel(int64_t K, const int blk, const bool min, const struct qgemm_w *w,
                             const struct qgemm_x *x, float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    for (int r0 = 0; r0 < QGEMM_ROWS; r0 += VNNI_ROWS)
        vnni_rows(K, blk, min, w, r0, x, out);
}

/* The block size and the minimum as constants, so each variant's inner
 * loops unroll. */
static void gemm_vnni(int64_t K, int blk, const struct qgemm_w *w, const struct qgemm_x *x,
                      float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    if (blk == 16)
        vnni_panel(K, 16, false, w, x, out);
    else if (w->min)
        vnni_panel(K, 32, true, w, x, out);
    else
        vnni_panel(K, 32, false, w, x, out);
}

const qgemm_fn cpu_qgemm_vnni = gemm_vnni;

/* ---- AMX, emulated ------------------------------------------------------ *
 * Each tile instruction as the architecture defines it, on tiles in memory
 * shaped by the loaded configuration (rows x colsb bytes; what a load
 * leaves past them is zero), and refusing (abort, as the hardware raises
 * #UD) operand shapes tdpbsud does not accept. */

struct qgemm_tile_config;

struct emu_tiles {
    const struct qgemm_tile_config *cfg;
    uint8_t t[8][16][64];
};

static void emu_load(struct emu_tiles *e, int t, const void *p, size_t stride);
static void emu_store(const struct emu_tiles *e, int t, void *p, size_t stride);
static void emu_dpbsud(struct emu_tiles *e, int c, int a, int b);

#define QGEMM_TILE_CONFIG(c) \
    struct emu_tiles emu_tiles_;  \
    emu_tiles_.cfg = (c)
#define QGEMM_TILE_ZERO(i) memset(emu_tiles_.t[i], 0, sizeof emu_tiles_.t[i])
#define QGEMM_TILE_LOAD(t, p, stride) emu_load(&emu_tiles_, t, p, (size_t)(stride))
#define QGEMM_TILE_DPBSUD(c, a, b) emu_dpbsud(&emu_tiles_, c, a, b)
#define QGEMM_TILE_STORE(t, p, stride) emu_store(&emu_tiles_, t, p, (size_t)(stride))
#define QGEMM_TILE_RELEASE() (void)emu_tiles_
#define QGEMM_AMX_KERNEL gemm_amx_emulated

#include "backend/cpu/qgemm_amx_body.h"

static void emu_load(struct emu_tiles *e, int t, const void *p, size_t stride)
{
    memset(e->t[t], 0, sizeof e->t[t]);
    for (int m = 0; m < e->cfg->rows[t]; m++)
        memcpy(e->t[t][m], (const uint8_t *)p + (size_t)m * stride, e->cfg->colsb[t]);
}

static void emu_store(const struct emu_tiles *e, int t, void *p, size_t stride)
{
    for (int m = 0; m < e->cfg->rows[t]; m++)
        memcpy((uint8_t *)p + (size_t)m * stride, e->t[t][m], e->cfg->colsb[t]);
}

static void emu_dpbsud(struct emu_tiles *e, int c, int a, int b)
{
    const struct qgemm_tile_config *f = e->cfg;
    int M = f->rows[c], N = f->colsb[c] / 4, KQ = f->colsb[a] / 4;
    if (f->rows[a] != M || f->rows[b] != KQ || f->colsb[b] != f->colsb[c] || KQ > 16 || N > 16)
        abort();
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t acc;
            memcpy(&acc, &e->t[c][m][4 * n], 4);
            for (int k = 0; k < KQ; k++)
                for (int i = 0; i < 4; i++)
                    acc += (int8_t)e->t[a][m][4 * k + i] * (int32_t)e->t[b][k][4 * n + i];
            memcpy(&e->t[c][m][4 * n], &acc, 4);
        }
}

const qgemm_fn cpu_qgemm_amx_emulated = gemm_amx_emulated;

/* ---- AVX-VNNI, EVEX-encoded ---------------------------------------------- *
 * The AVX-VNNI kernel's code with AVX-512 VNNI's 256-bit vpdpbusd, which
 * does the same: tests check that code on machines without AVX-VNNI. */

#define QGEMM_DPBUSD_YMM(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define QGEMM_YMM_KERNEL gemm_avxvnni_evex

#include "backend/cpu/qgemm_avxvnni_body.h"

const qgemm_fn cpu_qgemm_avxvnni_evex = gemm_avxvnni_evex;
