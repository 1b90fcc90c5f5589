/* tests/unit/test_cpu_norm.c — the CPU backend's RMSNorm against a double-precision reference, and a row's bits independent of the rows beside it. */
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
