/* tests/unit/test_cpu_norm.c — the CPU backend's RMSNorm against a double-precision reference, and a row's bits independent of the rows beside it; RoPE's angles kept from call to call give the bits of a fresh computation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "test_support.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

/* Uniform in [-1, 1) with a full 24-bit mantissa. */
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(int32_t)(rng_state >> 32) / 2147483648.0f;
}

/* Rows of every kind of length (inside one 16-element step, whole steps, a
 * tail, Qwen3's head and hidden sizes, longer than a page), values spread
 * over 2^-20..2^20 so the sum of squares carries far more bits than a float;
 * few rows (the one-thread path) and many (the threads split the rows).
 * The answer: x * (1 / sqrt(mean(x^2) + eps)) * w taken in double, within
 * a few float roundings (the scale is rounded once, then two products). */
Test(cpu_norm, rmsnorm_matches_double_reference)
{
    static const int64_t dims[] = {1, 7, 16, 17, 64, 384, 1000, 4099};
    static const int64_t rows[] = {1, 8, 41};
    struct backend *be = test_cpu_backend(COMPUTE_FAST);
    for (int di = 0; di < 8; di++)
        for (int ri = 0; ri < 3; ri++) {
            int64_t dim = dims[di], n = rows[ri];
            float *x = malloc(sizeof(float) * (size_t)(n * dim));
            float *w = malloc(sizeof(float) * (size_t)dim);
            float *y = malloc(sizeof(float) * (size_t)(n * dim));
            cr_assert(x && w && y);
            for (int64_t i = 0; i < n * dim; i++)
                x[i] = rnd() * ldexpf(1.0f, (int)(rnd() * 20.0f));
            for (int64_t i = 0; i < dim; i++)
                w[i] = 1.0f + rnd();
            const float eps = 1e-6f;
            be->ops->rmsnorm(be, x, w, n, dim, eps, y);
            for (int64_t r = 0; r < n; r++) {
                double ss = 0;
                for (int64_t i = 0; i < dim; i++)
                    ss += (double)x[r * dim + i] * x[r * dim + i];
                double inv = 1.0 / sqrt(ss / (double)dim + eps);
                for (int64_t i = 0; i < dim; i++) {
                    double want = (double)w[i] * ((double)x[r * dim + i] * inv);
                    double got = y[r * dim + i];
                    cr_assert(fabs(got - want) <= 4.0 * 0x1p-24 * fabs(want) + 1e-38,
                              "dim %ld, %ld rows: y[%ld, %ld] = %.9g, want %.9g", (long)dim,
                              (long)n, (long)r, (long)i, got, want);
                }
            }
            free(x);
            free(w);
            free(y);
        }
    backend_destroy(be);
}

/* A row's norm is the same bits alone and among others, on one thread and
 * split over threads (EXACT mode's batch invariance relies on it). */
Test(cpu_norm, rmsnorm_row_bits_do_not_depend_on_the_rows_in_the_call)
{
    const int64_t dim = 384 + 5, n = 60; /* 60 x 389 is past the threaded size */
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    float *x = malloc(sizeof(float) * (size_t)(n * dim)), *w = malloc(sizeof(float) * dim);
    float *all = malloc(sizeof(float) * (size_t)(n * dim)), *one = malloc(sizeof(float) * dim);
    cr_assert(x && w && all && one);
    for (int64_t i = 0; i < n * dim; i++)
        x[i] = rnd() * 3.0f;
    for (int64_t i = 0; i < dim; i++)
        w[i] = rnd();
    be->ops->rmsnorm(be, x, w, n, dim, 1e-5f, all);
    for (int64_t r = 0; r < n; r++) {
        be->ops->rmsnorm(be, x + r * dim, w, 1, dim, 1e-5f, one);
        cr_assert(memcmp(one, all + r * dim, sizeof(float) * (size_t)dim) == 0,
                  "row %ld alone differs from the same row among %ld", (long)r, (long)n);
    }
    free(x);
    free(w);
    free(all);
    free(one);
    backend_destroy(be);
}

/* RoPE of q-like rows (n tokens x 3 heads x 64) at positions, on backend be. */
static void rope_rows(struct backend *be, const float *x, float *y, int64_t n,
                      const int32_t *positions, const struct rope_table *t)
{
    memcpy(y, x, sizeof(float) * (size_t)(n * 3 * 64));
    be->ops->rope(be, y, n, 3, 64, positions, t);
}

/* The angles a call computes are kept for the next calls of the same positions and table
 * values: the bits of a fresh backend's every time, with the table's values (not its address)
 * deciding, two tables alternating, a third pushing one out, and positions changing. */
Test(cpu_norm, rope_angles_kept_between_calls_give_a_fresh_computations_bits)
{
    enum { N = 9, ROWS = N * 3 * 64 };
    static float x[ROWS], kept[ROWS], fresh[ROWS];
    for (int i = 0; i < ROWS; i++)
        x[i] = rnd();
    float freq_a[32], freq_b[32], freq_c[32];
    for (int i = 0; i < 32; i++) {
        freq_a[i] = powf(10000.0f, -(float)i / 32.0f);
        freq_b[i] = powf(500000.0f, -(float)i / 32.0f);
        freq_c[i] = freq_a[i] * 0.25f;
    }
    struct rope_table a = {.rot_dim = 64, .inv_freq = freq_a, .attention_factor = 1.0f};
    struct rope_table b = {.rot_dim = 64, .inv_freq = freq_b, .attention_factor = 1.0f};
    struct rope_table c = {.rot_dim = 64, .inv_freq = freq_c, .attention_factor = 1.25f};
    int32_t pos[N] = {0, 1, 2, 3, 100, 101, 102, 513, 1023}, pos2[N];
    for (int i = 0; i < N; i++)
        pos2[i] = pos[i] + 1;
    struct backend *be = test_cpu_backend(COMPUTE_FAST);
    struct {
        const struct rope_table *t;
        const int32_t *p;
        int64_t n;
    } calls[] = {{&a, pos, N}, {&a, pos, N}, {&b, pos, N}, {&a, pos, N}, {&b, pos, N},
                 {&c, pos, N}, {&a, pos, N}, {&a, pos2, N}, {&a, pos, 2}, {&a, pos, N}};
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
        if (k == 4) /* b's values change in place: its kept angles are no longer its own */
            for (int i = 0; i < 32; i++)
                freq_b[i] *= 0.5f;
        rope_rows(be, x, kept, calls[k].n, calls[k].p, calls[k].t);
        struct backend *once = test_cpu_backend(COMPUTE_FAST);
        rope_rows(once, x, fresh, calls[k].n, calls[k].p, calls[k].t);
        backend_destroy(once);
        cr_assert(!memcmp(kept, fresh, sizeof(float) * (size_t)(calls[k].n * 3 * 64)),
                  "call %zu differs from a fresh backend's", k);
    }
    backend_destroy(be);
}
