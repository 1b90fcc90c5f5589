/* tests/unit/test_cpu_matmul.c — every matmul kernel level the CPU has agrees with a double-precision reference. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "base/bf16.h"
#include "base/panels.h"
#include "base/threadpool.h"

/* f32 accumulation over K <= ~1000 terms, in any order, stays far inside
 * this fraction of sum |x| |w|; one bf16 rounding of x (2^-9) does not. */
#define TOL 2e-5

static const int64_t shape_T[] = {1, 2, 3, 5, 7, 16, 17, 64, 130};
static const int64_t shape_K[] = {1, 7, 64, 200, 1024 + 3};
static const int64_t shape_N[] = {1, 5, 16, 33, 503};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Matmul contexts on pools of 1 and 2 threads, shared by a test's cases. */
struct rig {
    struct threadpool *pool[2];
    struct cpu_matmul *mm[2];
};

static void rig_init(struct rig *rig)
{
    struct err err = {0};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(threadpool_create(i + 1, &rig->pool[i], &err), 0, "%s", err.msg);
        cr_assert_eq(cpu_matmul_create(rig->pool[i], &rig->mm[i], &err), 0, "%s", err.msg);
    }
}

static void rig_free(struct rig *rig)
{
    for (int i = 0; i < 2; i++) {
        cpu_matmul_free(rig->mm[i]);
        threadpool_free(rig->pool[i]);
    }
}

/* Levels this machine lacks are skipped, once per test, with a note; the
 * same binary exercises them on a machine that has them. */
static bool level_available(enum cpu_matmul_level level)
{
    if (level <= cpu_matmul_detect_level())
        return true;
    cr_log_info("matmul level %s is not available on this CPU; skipped",
                cpu_matmul_level_name(level));
    return false;
}

static void use_level(struct cpu_matmul *mm, int level)
{
    struct err err = {0};
    cr_assert_eq(cpu_matmul_set_level(mm, (enum cpu_matmul_level)level, &err), 0, "%s", err.msg);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1) with a full 24-bit mantissa, so bf16 rounding shows. */
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(int32_t)(rng_state >> 32) / 2147483648.0f;
}

/* One problem: inputs, and the exact answer without and with bias. */
struct problem {
    int64_t T, K, N;
    enum dtype dtype;
    float *x;       /* T x K */
    void *w;        /* N x K of dtype */
    float *wf;      /* the same weights as f32 */
    float *bias;    /* N */
    double *ref;    /* T x N, no bias */
    double *scale;  /* T x N: sum |x| |w| */
    float *y;       /* T x N */
    float *y2;      /* T x N, a second result for comparisons */
};

static void problem_init(struct problem *p, int64_t T, int64_t K, int64_t N, enum dtype dtype)
{
    memset(p, 0, sizeof *p);
    p->T = T;
    p->K = K;
    p->N = N;
    p->dtype = dtype;
    size_t tk = (size_t)(T * K > 0 ? T * K : 1), nk = (size_t)(N * K > 0 ? N * K : 1);
    p->x = malloc(sizeof(float) * tk);
    p->w = malloc(dtype_size(dtype) * nk);
    p->wf = malloc(sizeof(float) * nk);
    p->bias = malloc(sizeof(float) * (size_t)N);
    p->ref = malloc(sizeof(double) * (size_t)(T * N));
    p->scale = malloc(sizeof(double) * (size_t)(T * N));
    p->y = malloc(sizeof(float) * (size_t)(T * N));
    p->y2 = malloc(sizeof(float) * (size_t)(T * N));
    cr_assert(p->x && p->w && p->wf && p->bias && p->ref && p->scale && p->y && p->y2);
    for (int64_t i = 0; i < T * K; i++)
        p->x[i] = rnd();
    for (int64_t i = 0; i < N * K; i++) {
        float v = rnd();
        if (dtype == DTYPE_BF16) {
            uint16_t h = f32_to_bf16(v);
            ((uint16_t *)p->w)[i] = h;
            p->wf[i] = bf16_to_f32(h);
        } else if (dtype == DTYPE_F16) {
            /* Exactly representable f16: a multiple of 2^-10 in [-1, 1). */
            int q = (int)lrintf(v * 1024.0f);
            float f = (float)q / 1024.0f;
            uint16_t h = 0;
            if (q != 0) {
                int e = 0;
                float m = frexpf(fabsf(f), &e); /* f = m * 2^e, m in [0.5, 1) */
                uint16_t man = (uint16_t)lrintf((m * 2.0f - 1.0f) * 1024.0f);
                h = (uint16_t)((f < 0 ? 0x8000 : 0) | (uint16_t)((e - 1 + 15) << 10) | man);
            }
            ((uint16_t *)p->w)[i] = h;
            p->wf[i] = f16_to_f32(h);
        } else {
            ((float *)p->w)[i] = v;
            p->wf[i] = v;
        }
    }
    for (int64_t r = 0; r < N; r++)
        p->bias[r] = rnd();
}

static void problem_free(struct problem *p)
{
    free(p->x);
    free(p->w);
    free(p->wf);
    free(p->bias);
    free(p->ref);
    free(p->scale);
    free(p->y);
    free(p->y2);
}

/* The answer in double; FAST mode's answer multiplies x rounded to bf16. */
static void problem_reference(struct problem *p, enum compute_mode mode)
{
    double *xd = malloc(sizeof(double) * (size_t)(p->T * p->K > 0 ? p->T * p->K : 1));
    cr_assert(xd);
    for (int64_t i = 0; i < p->T * p->K; i++)
        xd[i] = mode == COMPUTE_FAST ? bf16_to_f32(f32_to_bf16(p->x[i])) : p->x[i];
    for (int64_t t = 0; t < p->T; t++)
        for (int64_t r = 0; r < p->N; r++) {
            double acc = 0.0, mag = 0.0;
            const double *xt = xd + t * p->K;
            const float *wr = p->wf + r * p->K;
            for (int64_t c = 0; c < p->K; c++) {
                double prod = xt[c] * wr[c];
                acc += prod;
                mag += fabs(prod);
            }
            p->ref[t * p->N + r] = acc;
            p->scale[t * p->N + r] = mag;
        }
    free(xd);
}

/* Runs the problem on mm (y poisoned with NaN first, so an output left
 * unwritten fails) and checks every element. */
static void run_and_check(struct problem *p, struct cpu_matmul *mm, enum compute_mode mode,
                          bool with_bias, const char *what)
{
    struct weight_matrix w = {.dtype = p->dtype, .rows = p->N, .cols = p->K, .data = p->w};
    for (int64_t i = 0; i < p->T * p->N; i++)
        p->y[i] = NAN;
    cpu_matmul_run(mm, mode, p->x, p->T, &w, with_bias ? p->bias : NULL, p->y);
    for (int64_t t = 0; t < p->T; t++)
        for (int64_t r = 0; r < p->N; r++) {
            int64_t i = t * p->N + r;
            double b = with_bias ? p->bias[r] : 0.0;
            double want = p->ref[i] + b;
            double tol = TOL * (p->scale[i] + fabs(b)) + 1e-30;
            if (!(fabs((double)p->y[i] - want) <= tol))
                cr_assert_fail("%s: level %s, %s weights, %s, T=%ld K=%ld N=%ld%s: "
                               "y[%ld, %ld] = %.9g, want %.9g (tolerance %.3g)",
                               what, cpu_matmul_level_name(cpu_matmul_get_level(mm)),
                               dtype_name(p->dtype), mode == COMPUTE_FAST ? "FAST" : "EXACT",
                               (long)p->T, (long)p->K, (long)p->N,
                               with_bias ? " with bias" : "", (long)t, (long)r,
                               (double)p->y[i], want, tol);
        }
}

/* Every shape of the grid, both weight types, with and without bias, on 1
 * and 2 threads, at every level this CPU has. */
static void check_grid(enum compute_mode mode, const char *what)
{
    struct rig rig;
    rig_init(&rig);
    bool available[CPU_MATMUL_N_LEVELS];
    for (int l = 0; l < CPU_MATMUL_N_LEVELS; l++)
        available[l] = level_available((enum cpu_matmul_level)l);
    for (int ti = 0; ti < COUNT(shape_T); ti++)
        for (int ki = 0; ki < COUNT(shape_K); ki++)
            for (int ni = 0; ni < COUNT(shape_N); ni++)
                for (int d = 0; d < 2; d++) {
                    struct problem p;
                    problem_init(&p, shape_T[ti], shape_K[ki], shape_N[ni],
                                 d ? DTYPE_BF16 : DTYPE_F32);
                    problem_reference(&p, mode);
                    for (int l = 0; l < CPU_MATMUL_N_LEVELS; l++) {
                        if (!available[l])
                            continue;
                        for (int th = 0; th < 2; th++) {
                            use_level(rig.mm[th], l);
                            run_and_check(&p, rig.mm[th], mode, false, what);
                            run_and_check(&p, rig.mm[th], mode, true, what);
                        }
                    }
                    problem_free(&p);
                }
    rig_free(&rig);
}

Test(cpu_matmul, exact_mode_matches_double_reference_for_odd_shapes)
{
    check_grid(COMPUTE_EXACT, "exact");
}

Test(cpu_matmul, fast_mode_matches_reference_with_activations_rounded_to_bf16)
{
    check_grid(COMPUTE_FAST, "fast");
}

/* Prompts longer than any kernel's token chunk (192 to 256 rows), with many
 * outputs (threads split N) and with few (threads split the tokens). */
Test(cpu_matmul, long_prompts_are_split_into_token_chunks)
{
    static const int64_t shapes[][3] = {{500, 300, 70}, {600, 65, 5}, {300, 1030, 40}};
    struct rig rig;
    rig_init(&rig);
    for (int s = 0; s < COUNT(shapes); s++)
        for (int mode = 0; mode < 2; mode++) {
            struct problem p;
            problem_init(&p, shapes[s][0], shapes[s][1], shapes[s][2], DTYPE_BF16);
            problem_reference(&p, (enum compute_mode)mode);
            for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++)
                for (int th = 0; th < 2; th++) {
                    use_level(rig.mm[th], l);
                    run_and_check(&p, rig.mm[th], (enum compute_mode)mode, s == 1, "long prompt");
                }
            problem_free(&p);
        }
    rig_free(&rig);
}

/* Each output has one owner and a fixed summation order, so the thread
 * count cannot change a single bit. */
Test(cpu_matmul, results_do_not_depend_on_thread_count)
{
    static const int64_t shapes[][3] = {
        {1, 1027, 503}, {3, 200, 33}, {130, 1027, 503}, {64, 64, 5},
    };
    struct rig rig;
    rig_init(&rig);
    for (int s = 0; s < COUNT(shapes); s++)
        for (int mode = 0; mode < 2; mode++) {
            struct problem p;
            problem_init(&p, shapes[s][0], shapes[s][1], shapes[s][2], DTYPE_BF16);
            struct weight_matrix w = {.dtype = p.dtype, .rows = p.N, .cols = p.K, .data = p.w};
            for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++) {
                for (int th = 0; th < 2; th++)
                    use_level(rig.mm[th], l);
                cpu_matmul_run(rig.mm[0], (enum compute_mode)mode, p.x, p.T, &w, p.bias, p.y);
                cpu_matmul_run(rig.mm[1], (enum compute_mode)mode, p.x, p.T, &w, p.bias, p.y2);
                cr_assert(memcmp(p.y, p.y2, sizeof(float) * (size_t)(p.T * p.N)) == 0,
                          "level %s, T=%ld: 1 and 2 threads differ", cpu_matmul_level_name(l),
                          (long)p.T);
            }
            problem_free(&p);
        }
    rig_free(&rig);
}

/* EXACT mode's promise to a prefix cache: a token's outputs are the same bits
 * whether it is computed alone or among T tokens, at every level, for both
 * weight types and shapes with K and N tails, so the GEMV (few tokens) and
 * the GEMM (many) must sum each output in one order. */
Test(cpu_matmul, exact_mode_row_bits_do_not_depend_on_the_rows_in_the_call)
{
    static const int64_t shapes[][2] = {{1027, 503}, {200, 33}, {64, 5}, {256, 40}, {7, 17}};
    static const int64_t counts[] = {2, 3, 4, 5, 7, 8, 9, 11, 16, 17, 40};
    struct rig rig;
    rig_init(&rig);
    for (int s = 0; s < COUNT(shapes); s++)
        for (int d = 0; d < 2; d++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                struct problem p;
                problem_init(&p, 40, shapes[s][0], shapes[s][1], d ? DTYPE_BF16 : DTYPE_F32);
                struct weight_matrix w = {.dtype = p.dtype, .rows = p.N, .cols = p.K, .data = p.w};
                const float *bias = with_bias ? p.bias : NULL;
                for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++) {
                    use_level(rig.mm[1], l);
                    /* each row alone */
                    for (int64_t t = 0; t < p.T; t++)
                        cpu_matmul_run(rig.mm[1], COMPUTE_EXACT, p.x + t * p.K, 1, &w, bias,
                                       p.y + t * p.N);
                    for (int c = 0; c < COUNT(counts); c++) {
                        /* rows [t0, t0 + n) in one call, from several offsets */
                        for (int64_t t0 = 0; t0 + counts[c] <= p.T; t0 += counts[c] + 5) {
                            int64_t n = counts[c];
                            cpu_matmul_run(rig.mm[1], COMPUTE_EXACT, p.x + t0 * p.K, n, &w, bias,
                                           p.y2);
                            cr_assert(memcmp(p.y + t0 * p.N, p.y2,
                                             sizeof(float) * (size_t)(n * p.N)) == 0,
                                      "level %s, %s weights, K=%ld N=%ld: rows %ld..%ld computed "
                                      "%ld at a time differ from the same rows alone",
                                      cpu_matmul_level_name(l), dtype_name(p.dtype), (long)p.K,
                                      (long)p.N, (long)t0, (long)(t0 + n - 1), (long)n);
                        }
                    }
                }
                problem_free(&p);
            }
    rig_free(&rig);
}

/* With one-hot weight rows (W[r, c] = 1 for c = r mod K, else 0) y is x
 * itself: exactly the bf16 of x in FAST mode (ties to even), exactly x in
 * EXACT mode. K = 16 puts the values through the vector rounding code, and
 * the token counts cover GEMV, GEMM and the AMX path. */
Test(cpu_matmul, fast_mode_rounds_ties_to_even_and_exact_mode_does_not_round)
{
    const float ulp = 1.0f / 128.0f; /* bf16 spacing in [1, 2) */
    const float cases[] = {
        1.0f + ulp / 2,               /* tie, 1.0 is even: down */
        1.0f + 3 * ulp / 2,           /* tie, 1 + ulp is odd: up to 1 + 2 ulp */
        1.0f + ulp / 2 + ulp / 4096,  /* just above the tie: up */
        -(1.0f + ulp / 2),            /* ties are symmetric */
        3.0e-3f,
        -7.25e5f,
        1.0f + ulp / 2 - ulp / 4096,  /* just below the tie: down */
    };
    struct rig rig;
    rig_init(&rig);
    static const int64_t token_counts[] = {1, 3, 12, 40};
    const int64_t K = 16, N = 19;
    for (int tc = 0; tc < COUNT(token_counts); tc++)
        for (int d = 0; d < 2; d++) {
            int64_t T = token_counts[tc];
            struct problem p;
            problem_init(&p, T, K, N, d ? DTYPE_BF16 : DTYPE_F32);
            for (int64_t r = 0; r < N; r++)
                for (int64_t c = 0; c < K; c++) {
                    float v = c == r % K ? 1.0f : 0.0f;
                    if (d)
                        ((uint16_t *)p.w)[r * K + c] = f32_to_bf16(v);
                    else
                        ((float *)p.w)[r * K + c] = v;
                }
            for (int64_t i = 0; i < T * K; i++)
                p.x[i] = cases[i % COUNT(cases)];
            struct weight_matrix w = {.dtype = p.dtype, .rows = N, .cols = K, .data = p.w};
            for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++)
                for (int mode = 0; mode < 2; mode++) {
                    use_level(rig.mm[1], l);
                    cpu_matmul_run(rig.mm[1], (enum compute_mode)mode, p.x, T, &w, NULL, p.y);
                    for (int64_t t = 0; t < T; t++)
                        for (int64_t r = 0; r < N; r++) {
                            float xv = p.x[t * K + r % K];
                            float want = mode == COMPUTE_FAST ? bf16_to_f32(f32_to_bf16(xv)) : xv;
                            cr_assert_eq(p.y[t * N + r], want,
                                         "level %s %s T=%ld: %.9g became %.9g, want %.9g",
                                         cpu_matmul_level_name(l), mode ? "FAST" : "EXACT",
                                         (long)T, (double)xv, (double)p.y[t * N + r],
                                         (double)want);
                        }
                }
            problem_free(&p);
        }
    cr_assert_eq(bf16_to_f32(f32_to_bf16(cases[0])), 1.0f);
    cr_assert_eq(bf16_to_f32(f32_to_bf16(cases[1])), 1.0f + 2 * ulp);
    cr_assert_eq(bf16_to_f32(f32_to_bf16(cases[2])), 1.0f + ulp);
    cr_assert_eq(bf16_to_f32(f32_to_bf16(cases[6])), 1.0f);
    rig_free(&rig);
}

Test(cpu_matmul, f16_weights_match_reference)
{
    struct rig rig;
    rig_init(&rig);
    struct problem p;
    problem_init(&p, 9, 70, 21, DTYPE_F16);
    for (int mode = 0; mode < 2; mode++) {
        problem_reference(&p, (enum compute_mode)mode);
        for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++) {
            use_level(rig.mm[1], l);
            run_and_check(&p, rig.mm[1], (enum compute_mode)mode, true, "f16");
        }
    }
    problem_free(&p);
    rig_free(&rig);
}

Test(cpu_matmul, zero_inner_dimension_gives_the_bias)
{
    struct rig rig;
    rig_init(&rig);
    float bias[3] = {1.5f, -2.0f, 0.25f}, y[2 * 3], x[1] = {0};
    struct weight_matrix w = {.dtype = DTYPE_BF16, .rows = 3, .cols = 0, .data = x};
    for (int i = 0; i < 6; i++)
        y[i] = NAN;
    cpu_matmul_run(rig.mm[1], COMPUTE_EXACT, x, 2, &w, bias, y);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(y[i], bias[i % 3]);
    cpu_matmul_run(rig.mm[1], COMPUTE_FAST, x, 2, &w, NULL, y);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(y[i], 0.0f);
    rig_free(&rig);
}

Test(cpu_matmul, levels_beyond_this_cpu_or_unknown_are_refused)
{
    struct rig rig;
    rig_init(&rig);
    struct err err = {0};
    enum cpu_matmul_level best = cpu_matmul_detect_level();
    cr_assert_eq(cpu_matmul_get_level(rig.mm[0]), best);
    cr_assert_eq(cpu_matmul_set_level(rig.mm[0], (enum cpu_matmul_level)CPU_MATMUL_N_LEVELS, &err),
                 -INFERD_EINVAL);
    if (best < CPU_MATMUL_AMX) {
        cr_assert_eq(cpu_matmul_set_level(rig.mm[0], best + 1, &err), -INFERD_EUNSUPPORTED);
        cr_assert(strstr(err.msg, cpu_matmul_level_name(best + 1)) != NULL, "%s", err.msg);
    }
    cr_assert_eq(cpu_matmul_get_level(rig.mm[0]), best);
    rig_free(&rig);
}

Test(cpu_measure, bandwidth_peak_and_gemm_rate_are_positive)
{
    struct rig rig;
    rig_init(&rig);
    cr_assert_gt(cpu_measure_read_bandwidth(rig.pool[1], 64u << 20), 0.0);
    cr_assert_gt(cpu_measure_fma_peak_gflops(rig.pool[1], cpu_matmul_detect_level()), 0.0);
    cr_assert_gt(cpu_measure_gemm_gflops(rig.mm[1], COMPUTE_FAST), 0.0);
    rig_free(&rig);
}

/* p's BF16 weights laid out in panels (owned by the caller). */
static struct weight_matrix panels_of(const struct problem *p)
{
    void *packed = aligned_alloc(64, (panels_bytes(p->N, p->K) + 63) / 64 * 64);
    cr_assert(packed);
    panels_pack(p->w, p->N, p->K, packed);
    return (struct weight_matrix){.dtype = DTYPE_BF16_P32, .rows = p->N, .cols = p->K, .data = packed};
}

/* A group (q/k/v-style: one input, matrices of different heights) gives
 * every member bit for bit what its own matmul gives, at every level, for
 * decode-sized and prompt-sized T, with and without bias; row-major and in
 * panels (whose threads' chunks start a panel of each member: heights that
 * are not multiples of 32). */
Test(cpu_matmul, grouped_matmul_equals_separate_matmuls)
{
    static const int64_t heights[3] = {503, 33, 130};
    static const int64_t token_counts[] = {1, 2, 7, 40};
    struct rig rig;
    rig_init(&rig);
    for (int tc = 0; tc < COUNT(token_counts); tc++)
        for (int mode = 0; mode < 2; mode++)
            for (int panels = 0; panels < 2; panels++) {
                struct problem p[3];
                struct weight_matrix w[3];
                const struct weight_matrix *wp[3];
                const float *bias[3];
                float *y[3];
                for (int i = 0; i < 3; i++) {
                    problem_init(&p[i], token_counts[tc], 200, heights[i], DTYPE_BF16);
                    w[i] = panels ? panels_of(&p[i])
                                  : (struct weight_matrix){.dtype = DTYPE_BF16, .rows = p[i].N,
                                                           .cols = p[i].K, .data = p[i].w};
                    wp[i] = &w[i];
                    bias[i] = i == 1 ? NULL : p[i].bias;
                    y[i] = p[i].y2;
                }
                for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++) {
                    use_level(rig.mm[1], l);
                    cpu_matmul_run_group(rig.mm[1], (enum compute_mode)mode, p[0].x, p[0].T, 3, wp,
                                         bias, y);
                    for (int i = 0; i < 3; i++) {
                        cpu_matmul_run(rig.mm[1], (enum compute_mode)mode, p[0].x, p[0].T, &w[i],
                                       bias[i], p[i].y);
                        cr_assert(memcmp(p[i].y, p[i].y2,
                                         sizeof(float) * (size_t)(p[i].T * p[i].N)) == 0,
                                  "level %s, %s, T=%ld, member %d differs",
                                  cpu_matmul_level_name(l), dtype_name(w[i].dtype), (long)p[i].T, i);
                    }
                }
                for (int i = 0; i < 3; i++) {
                    if (panels)
                        free((void *)w[i].data);
                    problem_free(&p[i]);
                }
            }
    rig_free(&rig);
}

/* FAST mode's decode GEMV runs each row count up to its limit (8 rows on
 * AVX-512, 10 on AVX2) in one pass over the weights: blocks of weight rows
 * against all the rows at once, a kernel per count. Every count from 1 to
 * 12 (past the limit the GEMM takes over) against the reference, with K
 * inside one vector, just past a vector and tails of every kind, N from one
 * output to a few blocks with a remainder, both weight types, with and
 * without bias, on 1 and 2 threads, at every level. */
Test(cpu_matmul, fast_decode_gemv_matches_reference_for_every_row_count)
{
    static const int64_t Ks[] = {1, 31, 33, 384, 1027};
    static const int64_t Ns[] = {1, 7, 17, 130};
    struct rig rig;
    rig_init(&rig);
    for (int64_t T = 1; T <= 12; T++)
        for (int ki = 0; ki < COUNT(Ks); ki++)
            for (int ni = 0; ni < COUNT(Ns); ni++)
                for (int d = 0; d < 2; d++) {
                    struct problem p;
                    problem_init(&p, T, Ks[ki], Ns[ni], d ? DTYPE_BF16 : DTYPE_F32);
                    problem_reference(&p, COMPUTE_FAST);
                    for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++)
                        for (int th = 0; th < 2; th++) {
                            use_level(rig.mm[th], l);
                            run_and_check(&p, rig.mm[th], COMPUTE_FAST, false, "fast decode");
                            run_and_check(&p, rig.mm[th], COMPUTE_FAST, true, "fast decode");
                        }
                    problem_free(&p);
                }
    rig_free(&rig);
}

/* The multi-row GEMV sums each (row, output) on its own accumulator in
 * column order and reduces every accumulator by the same tree, so in FAST
 * mode a row's outputs are the same bits whatever else shares the call, from
 * 2 rows up to 8, and whichever block of weight rows an output falls in; from
 * 1 where one row takes the same kernel: at AVX2, and with bf16 weights on
 * AVX512-BF16. */
Test(cpu_matmul, fast_decode_rows_do_not_depend_on_the_other_rows_in_the_call)
{
    static const int64_t shapes[][2] = {{384, 130}, {1027, 37}, {33, 16}};
    struct rig rig;
    rig_init(&rig);
    for (int s = 0; s < COUNT(shapes); s++)
        for (int d = 0; d < 2; d++) {
            struct problem p;
            problem_init(&p, 8, shapes[s][0], shapes[s][1], d ? DTYPE_BF16 : DTYPE_F32);
            struct weight_matrix w = {.dtype = p.dtype, .rows = p.N, .cols = p.K, .data = p.w};
            for (int l = CPU_MATMUL_AVX2; l <= (int)cpu_matmul_detect_level(); l++) {
                use_level(rig.mm[1], l);
                cpu_matmul_run(rig.mm[1], COMPUTE_FAST, p.x, 8, &w, p.bias, p.y);
                bool one_too = l == CPU_MATMUL_AVX2 || (d && l >= CPU_MATMUL_AVX512BF16);
                for (int64_t n = one_too ? 1 : 2; n < 8; n++)
                    for (int64_t t0 = 0; t0 + n <= 8; t0 += n) {
                        cpu_matmul_run(rig.mm[1], COMPUTE_FAST, p.x + t0 * p.K, n, &w, p.bias,
                                       p.y2);
                        cr_assert(memcmp(p.y + t0 * p.N, p.y2,
                                         sizeof(float) * (size_t)(n * p.N)) == 0,
                                  "level %s, %s weights, K=%ld N=%ld: rows %ld..%ld computed %ld "
                                  "at a time differ from the same rows among 8",
                                  cpu_matmul_level_name(l), dtype_name(p.dtype), (long)p.K,
                                  (long)p.N, (long)t0, (long)(t0 + n - 1), (long)n);
                    }
            }
            problem_free(&p);
        }
    rig_free(&rig);
}

/* ---- BF16 weights in panels of 32 rows (DTYPE_BF16_P32) ----------------- */

Test(cpu_matmul, panels_hold_every_element_where_panels_index_says_zeros_past_and_unpack_back)
{
    static const int64_t shapes[][2] = {{1, 1}, {31, 7}, {32, 64}, {33, 65}, {70, 200}};
    for (int s = 0; s < COUNT(shapes); s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1];
        uint16_t *src = malloc(sizeof *src * (size_t)(rows * cols));
        uint64_t bytes = panels_bytes(rows, cols);
        uint16_t *dst = malloc(bytes);
        cr_assert(src && dst);
        memset(dst, 0xff, bytes);
        for (int64_t i = 0; i < rows * cols; i++)
            src[i] = (uint16_t)(i * 7 + 1);
        panels_pack(src, rows, cols, dst);
        uint64_t nonzero = 0;
        for (uint64_t i = 0; i < bytes / 2; i++)
            nonzero += dst[i] != 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                cr_assert_eq(dst[panels_index(cols, r, c)], src[r * cols + c],
                             "%ldx%ld: element (%ld, %ld)", (long)rows, (long)cols, (long)r,
                             (long)c);
                uint32_t pair = panels_row_pairs(dst, cols, r)[(c / 2) * PANEL_ROWS];
                cr_assert_eq((uint16_t)(c % 2 ? pair >> 16 : pair), src[r * cols + c],
                             "%ldx%ld: element (%ld, %ld) through its row's pairs", (long)rows,
                             (long)cols, (long)r, (long)c);
            }
        cr_assert_eq(nonzero, (uint64_t)(rows * cols), "%ldx%ld: padding is not zero",
                     (long)rows, (long)cols);
        cr_assert_eq(bytes, (uint64_t)((rows + 31) / 32) * 32 * (uint64_t)((cols + 1) / 2) * 4);
        uint16_t *back = malloc(sizeof *back * (size_t)(rows * cols));
        cr_assert(back);
        for (int64_t r0 = 0; r0 < rows; r0 += 7) { /* rows back out, from any row */
            int64_t n = rows - r0 < 9 ? rows - r0 : 9;
            panels_unpack_rows(dst, cols, r0, n, back);
            cr_assert(memcmp(back, src + r0 * cols, sizeof *back * (size_t)(n * cols)) == 0,
                      "%ldx%ld: rows %ld..%ld unpacked differ", (long)rows, (long)cols, (long)r0,
                      (long)(r0 + n - 1));
        }
        free(back);
        free(src);
        free(dst);
    }
}

/* FAST mode over panels: every row count of the GEMV (1-8) and past it (the
 * GEMM), K inside a pair, odd, past a K block, N from one output to a few
 * panels with a remainder, with and without bias, on 1 and 2 threads, at
 * the levels this CPU has: the panel kernels at AVX512-BF16 and up, the
 * scalar path below. */
Test(cpu_matmul, panel_weights_match_the_reference_at_every_row_count_and_level)
{
    static const int64_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 40};
    static const int64_t Ks[] = {1, 31, 33, 384, 1027};
    static const int64_t Ns[] = {1, 7, 33, 130};
    struct rig rig;
    rig_init(&rig);
    for (int ti = 0; ti < COUNT(Ts); ti++)
        for (int ki = 0; ki < COUNT(Ks); ki++)
            for (int ni = 0; ni < COUNT(Ns); ni++) {
                struct problem p;
                problem_init(&p, Ts[ti], Ks[ki], Ns[ni], DTYPE_BF16);
                problem_reference(&p, COMPUTE_FAST);
                struct weight_matrix w = panels_of(&p);
                void *rows = p.w;
                p.w = (void *)w.data;
                p.dtype = DTYPE_BF16_P32;
                for (int l = 0; l <= (int)cpu_matmul_detect_level(); l++)
                    for (int th = 0; th < 2; th++) {
                        if (l < CPU_MATMUL_AVX512BF16 && (th || Ks[ki] > 384))
                            continue; /* the scalar path: a few shapes suffice */
                        use_level(rig.mm[th], l);
                        run_and_check(&p, rig.mm[th], COMPUTE_FAST, false, "panels");
                        run_and_check(&p, rig.mm[th], COMPUTE_FAST, true, "panels");
                    }
                p.w = rows;
                free((void *)w.data);
                problem_free(&p);
            }
    rig_free(&rig);
}

/* The panel GEMV sums each output in one lane in the GEMM kernel's order (K
 * blocks of 256 columns, each from zero, added to the total), so a row's
 * outputs are the same bits computed alone, among 8 rows, or in a prompt's
 * GEMM. */
Test(cpu_matmul, panel_weights_give_a_row_the_same_bits_at_any_row_count_gemv_or_gemm)
{
    static const int64_t shapes[][2] = {{384, 130}, {1027, 37}, {33, 16}, {600, 70}};
    if (!level_available(CPU_MATMUL_AVX512BF16))
        return;
    struct rig rig;
    rig_init(&rig);
    for (int s = 0; s < COUNT(shapes); s++) {
        struct problem p;
        problem_init(&p, 24, shapes[s][0], shapes[s][1], DTYPE_BF16);
        struct weight_matrix w = panels_of(&p);
        for (int th = 0; th < 2; th++) {
            use_level(rig.mm[th], cpu_matmul_detect_level());
            cpu_matmul_run(rig.mm[th], COMPUTE_FAST, p.x, 24, &w, p.bias, p.y); /* the GEMM */
            for (int64_t n = 1; n <= 8; n++)
                for (int64_t t0 = 0; t0 + n <= 24; t0 += n) {
                    cpu_matmul_run(rig.mm[th], COMPUTE_FAST, p.x + t0 * p.K, n, &w, p.bias, p.y2);
                    cr_assert(memcmp(p.y + t0 * p.N, p.y2, sizeof(float) * (size_t)(n * p.N)) == 0,
                              "K=%ld N=%ld, %d threads: rows %ld..%ld computed %ld at a time "
                              "differ from the same rows in a GEMM of 24",
                              (long)p.K, (long)p.N, th + 1, (long)t0, (long)(t0 + n - 1), (long)n);
                }
        }
        free((void *)w.data);
        problem_free(&p);
    }
    rig_free(&rig);
}
