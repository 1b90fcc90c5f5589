/* backend/cpu/qgemm_amx_body.h — the AMX-INT8 prefill kernel, written once over tile macros: qgemm_amx.c defines them as the AMX instructions, qgemm_avx512.c as C that does what each instruction does. */
#ifndef INFERD_BACKEND_CPU_QGEMM_AMX_BODY_H
#define INFERD_BACKEND_CPU_QGEMM_AMX_BODY_H

/* The including file defines, before including this one:
 *   QGEMM_TILE_CONFIG(cfg)        load a struct qgemm_tile_config
 *   QGEMM_TILE_ZERO(t)
 *   QGEMM_TILE_LOAD(t, p, stride) rows of tile t from p, stride bytes apart
 *   QGEMM_TILE_DPBSUD(c, a, b)    c[m][n] += sum over k of (int8) a[m][k] *
 *                                 (uint8) b[k / 4][4 n + k % 4], in int32
 *   QGEMM_TILE_STORE(t, p, stride)
 *   QGEMM_TILE_RELEASE()
 *   QGEMM_AMX_KERNEL              the kernel's name
 * Tile 0 is the block's 16 rows x 16 tokens of int32 sums; tile 1 (A) the
 * 16 weight rows' codes of one block (blk bytes each, rows K bytes apart
 * in the panel); tile 2 (B) the block's blk / 4 quads of the x group, 64
 * bytes each: struct qgemm_x's layout is the B tile's as it is. */

#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/qgemm.h"

/* The 64-byte LDTILECFG operand, palette 1. */
struct qgemm_tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Constants in memory (see matmul_amx.c: a stack copy's stores can be
 * optimised away); one per block size. */
static const struct qgemm_tile_config qgemm_cfg32 = {
    .palette_id = 1, .colsb = {64, 32, 64}, .rows = {16, 16, 8},
};
static const struct qgemm_tile_config qgemm_cfg16 = {
    .palette_id = 1, .colsb = {64, 16, 64}, .rows = {16, 16, 4},
};

/* Each block's tile product is stored and scaled in zmm: the sums of a
 * block must meet its own scales before the next block's are added. */
static void QGEMM_AMX_KERNEL(int64_t K, int blk, const struct qgemm_w *w, const struct qgemm_x *x,
                             float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    QGEMM_TILE_CONFIG(blk == 32 ? &qgemm_cfg32 : &qgemm_cfg16);
    int32_t c[QGEMM_ROWS][QGEMM_TOKENS] __attribute__((aligned(64)));
    __m512 acc[QGEMM_ROWS];
    for (int r = 0; r < QGEMM_ROWS; r++)
        acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / blk; b++) {
        QGEMM_TILE_ZERO(0);
        QGEMM_TILE_LOAD(1, w->q + b * blk, K);
        QGEMM_TILE_LOAD(2, x->q + b * blk / 4 * 64, 64);
        QGEMM_TILE_DPBSUD(0, 1, 2);
        QGEMM_TILE_STORE(0, &c[0][0], QGEMM_TOKENS * 4);
        int64_t bx = b * blk / 32;
        __m512 dx = _mm512_load_ps(x->d + bx * QGEMM_TOKENS);
        __m512 sx = _mm512_load_ps(x->s + bx * QGEMM_TOKENS);
        const int32_t *corr = w->corr + b * QGEMM_ROWS;
        const float *scale = w->scale + b * QGEMM_ROWS;
        for (int r = 0; r < QGEMM_ROWS; r++) {
            __m512i s = _mm512_add_epi32(_mm512_load_si512(c[r]), _mm512_set1_epi32(corr[r]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                     _mm512_mul_ps(dx, _mm512_set1_ps(scale[r])), acc[r]);
        }
        if (w->min) {
            const float *min = w->min + b * QGEMM_ROWS;
            for (int r = 0; r < QGEMM_ROWS; r++)
                acc[r] = _mm512_fmadd_ps(sx, _mm512_set1_ps(min[r]), acc[r]);
        }
    }
    QGEMM_TILE_RELEASE();
    for (int r = 0; r < QGEMM_ROWS; r++)
        _mm512_storeu_ps(out[r], acc[r]);
}

#endif
