/* tests/unit/test_quant.c — the GGUF block formats: exact layouts on known blocks, and every format's round trip within its step size. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "model/quant.h"

static const enum dtype block_types[] = {DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0,
                                         DTYPE_Q5_1, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q4_K,
                                         DTYPE_Q5_K, DTYPE_Q6_K};

/* Deterministic values in [-1, 1). */
static void fill(float *x, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)(seed >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

Test(quant, block_sizes_are_ggufs)
{
    cr_assert_eq(dtype_row_bytes(DTYPE_Q8_0, 64), 68);
    cr_assert_eq(dtype_row_bytes(DTYPE_Q4_0, 32), 18);
    cr_assert_eq(dtype_row_bytes(DTYPE_Q4_K, 512), 288);
    cr_assert_eq(dtype_row_bytes(DTYPE_Q6_K, 256), 210);
    cr_assert_eq(dtype_row_bytes(DTYPE_BF16, 3), 6);
    cr_assert_eq(dtype_size(DTYPE_Q4_K), 0, "a block type has no element size");
}

Test(quant, q8_0_block_is_scale_then_rounded_int8s)
{
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16) / 16.0f; /* amax 1 at i = 0 */
    uint8_t b[34];
    quant_quantize_row(DTYPE_Q8_0, x, b, 32);
    uint16_t d;
    memcpy(&d, b, 2);
    cr_assert_eq(d, quant_f32_to_f16(1.0f / 127));
    cr_assert_eq((int8_t)b[2], -127);
    cr_assert_eq((int8_t)b[2 + 16], 0);
    cr_assert_eq((int8_t)b[2 + 24], (int8_t)roundf(0.5f * 127)); /* 64 */
}

Test(quant, q4_0_block_puts_the_second_half_in_high_nibbles)
{
    float x[32] = {0};
    x[0] = -8.0f; /* the signed max: d = -8 / -8 = 1 */
    x[16] = 7.0f;
    x[1] = 3.0f;
    uint8_t b[18];
    quant_quantize_row(DTYPE_Q4_0, x, b, 32);
    cr_assert_eq(b[2] & 15, 0);      /* -8 + 8 */
    cr_assert_eq(b[2] >> 4, 15);     /* 7 + 8 */
    cr_assert_eq(b[3] & 15, 11);     /* 3 + 8 */
    float y[32];
    quant_dequantize_row(DTYPE_Q4_0, b, y, 32);
    cr_assert_eq(y[0], -8.0f);
    cr_assert_eq(y[16], 7.0f);
    cr_assert_eq(y[1], 3.0f);
}

Test(quant, f16_rounds_to_nearest_even)
{
    cr_assert_eq(quant_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(quant_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);      /* tie to even */
    cr_assert_eq(quant_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);      /* tie to even, up */
    cr_assert_eq(quant_f32_to_f16(65520.0f), 0x7c00);                /* rounds to inf */
    cr_assert_eq(quant_f32_to_f16(5.9604645e-08f), 0x0001);          /* smallest subnormal */
    for (uint32_t h = 0; h < 0x7c00; h += 7)
        cr_assert_eq(quant_f32_to_f16(f16_to_f32((uint16_t)h)), h);
}

/* Each format's error bound, as a fraction of the block's largest |x|: half
 * a step of its levels plus what its 6- or 4-bit group scales lose. Q2_K
 * and Q3_K keep so few levels that only a loose bound is meaningful. */
static double bound(enum dtype t)
{
    switch (t) {
    case DTYPE_Q8_0: return 0.5 / 127 + 1e-3;
    case DTYPE_Q4_0: return 1.0 / 8 + 1e-2; /* the end opposite the signed max clamps at 7 */
    case DTYPE_Q4_1: return 2.0 / 15 * 0.5 + 1e-2;
    case DTYPE_Q5_0: return 1.0 / 16 + 1e-2;
    case DTYPE_Q5_1: return 2.0 / 31 * 0.5 + 1e-2;
    case DTYPE_Q6_K: return 0.08;
    case DTYPE_Q5_K: return 0.08;
    case DTYPE_Q4_K: return 0.15;
    default: return 0.6;
    }
}

Test(quant, every_format_round_trips_within_its_step)
{
    enum { N = 1024 };
    float x[N], y[N];
    uint8_t q[N * 2];
    for (size_t k = 0; k < sizeof block_types / sizeof block_types[0]; k++) {
        enum dtype t = block_types[k];
        fill(x, N, 7 + (uint32_t)k);
        quant_quantize_row(t, x, q, N);
        quant_dequantize_row(t, q, y, N);
        double worst = 0, sq = 0;
        for (int i = 0; i < N; i++) {
            worst = fmax(worst, fabs(x[i] - y[i]));
            sq += (x[i] - y[i]) * (x[i] - y[i]);
        }
        cr_assert_leq(worst, bound(t), "%s: max error %g > %g", dtype_name(t), worst, bound(t));
        cr_assert_gt(sq, 0, "%s lost nothing: suspicious", dtype_name(t));
    }
}

Test(quant, zero_blocks_stay_zero)
{
    float x[256] = {0}, y[256];
    uint8_t q[256];
    for (size_t k = 0; k < sizeof block_types / sizeof block_types[0]; k++) {
        quant_quantize_row(block_types[k], x, q, 256);
        quant_dequantize_row(block_types[k], q, y, 256);
        for (int i = 0; i < 256; i++)
            cr_assert_eq(y[i], 0.0f, "%s element %d", dtype_name(block_types[k]), i);
    }
}

Test(quant, quantizing_is_deterministic)
{
    float x[512];
    fill(x, 512, 99);
    uint8_t a[1024], b[1024];
    for (size_t k = 0; k < sizeof block_types / sizeof block_types[0]; k++) {
        size_t bytes = (size_t)dtype_row_bytes(block_types[k], 512);
        quant_quantize_row(block_types[k], x, a, 512);
        quant_quantize_row(block_types[k], x, b, 512);
        cr_assert_eq(memcmp(a, b, bytes), 0);
    }
}
