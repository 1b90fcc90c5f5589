/* tests/unit/test_logsumexp.c — base/logsumexp against a double-precision reference: lengths
 * around the vector width (the tail), spreads past the exponential's range, -INFINITY entries
 * (suppressed tokens) and a vocabulary-sized vector. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/logsumexp.h"

static double reference(const float *x, size_t n)
{
    double mx = -INFINITY;
    for (size_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY)
        return -INFINITY;
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    return mx + log(s);
}

static float uniform(uint64_t *s, float lo, float hi)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((*s >> 40) & 0xffffff) / (float)0x1000000;
}

Test(logsumexp, matches_double_precision_for_every_length_and_spread)
{
    static const float spreads[] = {0.5f, 5.0f, 40.0f, 200.0f};
    uint64_t seed = 7;
    float x[70];
    for (size_t s = 0; s < sizeof spreads / sizeof spreads[0]; s++)
        for (size_t n = 1; n <= 70; n++) {
            for (size_t i = 0; i < n; i++)
                x[i] = uniform(&seed, -spreads[s], spreads[s] / 4);
            double want = reference(x, n), got = logsumexp_f32(x, n);
            cr_expect_leq(fabs(got - want), 2e-6 * fmax(1.0, fabs(want)),
                          "n %zu, spread %g: %.9f, want %.9f", n, spreads[s], got, want);
        }
}

Test(logsumexp, a_vocabulary_with_suppressed_tokens)
{
    const size_t n = 51866;
    float *x = malloc(n * sizeof *x);
    uint64_t seed = 11;
    for (size_t i = 0; i < n; i++)
        x[i] = i % 97 == 5 ? -INFINITY : uniform(&seed, -30.0f, 12.0f);
    double want = reference(x, n), got = logsumexp_f32(x, n);
    cr_expect_leq(fabs(got - want), 1e-5, "%.9f, want %.9f", got, want);
    free(x);
}

/* A strong candidate 20 above a N(0, 2^2) background over Qwen3's vocabulary:
 * the background's terms are each below a float step of the candidate's 1, so
 * a lane that has added the candidate drops what it adds after it; summed in
 * one float chain per lane the log was 1.7e-4 off on rows like this. */
Test(logsumexp, a_strong_candidate_above_a_wide_background)
{
    const size_t n = 151936;
    float *x = malloc(n * sizeof *x);
    uint64_t seed = 13;
    for (size_t i = 0; i < n; i++) {
        float z = -6.0f; /* twelve uniforms: close enough to a normal */
        for (int k = 0; k < 12; k++)
            z += uniform(&seed, 0.0f, 1.0f);
        x[i] = 2.0f * z;
    }
    x[3] += 20.0f;
    double want = reference(x, n), got = logsumexp_f32(x, n);
    cr_expect_leq(fabs(got - want), 1e-5, "%.9f, want %.9f", got, want);
    free(x);
}

Test(logsumexp, nan_entries_add_nothing)
{
    float x[19];
    uint64_t seed = 3;
    for (int i = 0; i < 19; i++)
        x[i] = uniform(&seed, -4.0f, 4.0f);
    float clean[19];
    int m = 0;
    for (int i = 0; i < 19; i++)
        if (i % 5 == 1)
            x[i] = NAN; /* in the vector part and the tail */
        else
            clean[m++] = x[i];
    cr_expect_leq(fabs(logsumexp_f32(x, 19) - reference(clean, (size_t)m)), 2e-6);
}

Test(logsumexp, nothing_or_only_minus_infinity_is_minus_infinity)
{
    float x[9] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    cr_expect(isinf(logsumexp_f32(x, 0)) && logsumexp_f32(x, 0) < 0);
    cr_expect(isinf(logsumexp_f32(x, 9)) && logsumexp_f32(x, 9) < 0);
    x[8] = 3.25f; /* the one finite entry in the tail */
    cr_expect_float_eq(logsumexp_f32(x, 9), 3.25, 1e-7);
    x[8] = -INFINITY;
    x[2] = -1.5f; /* in the vector part */
    cr_expect_float_eq(logsumexp_f32(x, 9), -1.5, 1e-7);
}
