/* tests/unit/test_cuda_moe.c — the CUDA mixture-of-experts kernels against the CPU backend's moe_ffn: the GEMVs (EXACT and FAST), the grouped tensor-core GEMM (FAST, many rows), rows alone equal to the same rows in a batch, graph replay equal to eager launches, unchosen experts never read; at a small shape and at Qwen3-30B-A3B's expert shape, with timings printed. Skipped, saying why, without a GPU. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda.h"
#include "base/bf16.h"

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: CUDA MoE kernels not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: CUDA MoE kernels not checked");
}

static struct backend *cuda(enum compute_mode mode, enum backend_switch graphs,
                            enum backend_switch moe)
{
    struct backend *be = NULL;
    struct err err = {0};
    struct backend_options opt = {.mode = mode, .cuda_graphs = graphs, .cuda_moe = moe};
    cr_assert_eq(backend_cuda_create(0, &opt, &be, &err), 0, "%s", err.msg);
    return be;
}

static struct backend *cpu(enum compute_mode mode)
{
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode}, &be, &err), 0, "%s",
                 err.msg);
    return be;
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* uniform in [-1, 1) */
static float frand(uint64_t *s)
{
    return (float)(rng_next(s) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* ---- experts on the host and on the GPU ---- */

struct experts {
    enum dtype dt;
    int n;
    int64_t hidden, inter;
    void *w[3];                 /* host: gate, up, down of every expert, contiguous; owned */
    struct weight_matrix *m[3]; /* host views; owned */
    struct moe_experts host;
    struct backend *dev_be;     /* the backend holding the device copy */
    void *dw[3];                /* device copies */
    struct weight_matrix *dm[3];
    struct moe_experts dev;
};

static size_t esize(enum dtype dt)
{
    return dt == DTYPE_BF16 ? 2 : 4;
}

static int64_t mat_elems(const struct experts *E)
{
    return E->hidden * E->inter;
}

/* Random experts, entries of size 1 / sqrt(cols) so activations stay near 1;
 * poison: the odd experts' matrices hold NaN (a row that read one would be NaN). */
static void experts_make(struct experts *E, enum dtype dt, int n, int64_t hidden, int64_t inter,
                         uint64_t seed, bool poison)
{
    memset(E, 0, sizeof *E);
    E->dt = dt;
    E->n = n;
    E->hidden = hidden;
    E->inter = inter;
    int64_t per = mat_elems(E);
    for (int k = 0; k < 3; k++) {
        E->w[k] = malloc((size_t)(per * n) * esize(dt));
        E->m[k] = calloc((size_t)n, sizeof(struct weight_matrix));
        cr_assert(E->w[k] && E->m[k]);
        float scale = 1.0f / sqrtf((float)(k == 2 ? inter : hidden));
        uint64_t s = seed * 3 + (uint64_t)k;
        for (int64_t i = 0; i < per * n; i++) {
            float v = frand(&s) * scale * 1.7f;
            if (poison && (i / per) % 2 == 1)
                v = NAN;
            if (dt == DTYPE_BF16)
                ((uint16_t *)E->w[k])[i] = f32_to_bf16(v);
            else
                ((float *)E->w[k])[i] = v;
        }
        for (int e = 0; e < n; e++)
            E->m[k][e] = (struct weight_matrix){dt, k == 2 ? hidden : inter,
                                                k == 2 ? inter : hidden,
                                                (const uint8_t *)E->w[k] +
                                                    (size_t)(per * e) * esize(dt)};
    }
    E->host = (struct moe_experts){n, hidden, inter, E->m[0], E->m[1], E->m[2]};
}

static void experts_upload(struct experts *E, struct backend *be)
{
    int64_t per = mat_elems(E);
    size_t bytes = (size_t)(per * E->n) * esize(E->dt);
    E->dev_be = be;
    for (int k = 0; k < 3; k++) {
        E->dw[k] = be->ops->alloc(be, bytes);
        cr_assert_not_null(E->dw[k], "no device memory for %zu bytes of experts", bytes);
        be->ops->to_device(be, E->dw[k], E->w[k], bytes);
        E->dm[k] = calloc((size_t)E->n, sizeof(struct weight_matrix));
        for (int e = 0; e < E->n; e++) {
            E->dm[k][e] = E->m[k][e];
            E->dm[k][e].data = (const uint8_t *)E->dw[k] + (size_t)(per * e) * esize(E->dt);
        }
    }
    E->dev = (struct moe_experts){E->n, E->hidden, E->inter, E->dm[0], E->dm[1], E->dm[2]};
}

static void experts_drop_device(struct experts *E)
{
    for (int k = 0; k < 3; k++) {
        if (E->dw[k])
            E->dev_be->ops->release(E->dev_be, E->dw[k]);
        free(E->dm[k]);
        E->dw[k] = NULL;
        E->dm[k] = NULL;
    }
    E->dev_be = NULL;
}

static void experts_free(struct experts *E)
{
    experts_drop_device(E);
    for (int k = 0; k < 3; k++) {
        free(E->w[k]);
        free(E->m[k]);
    }
}

static double wval(const struct experts *E, int k, int e, int64_t i)
{
    const void *base = E->m[k][e].data;
    return E->dt == DTYPE_BF16 ? (double)bf16_to_f32(((const uint16_t *)base)[i])
                               : (double)((const float *)base)[i];
}

/* ---- routing a test chooses ---- */

enum routing {
    ROUTE_RANDOM, /* top_k distinct experts per row, at random */
    ROUTE_SAME,   /* every row the same experts (in a row-dependent order) */
    ROUTE_EVEN,   /* even experts only: the odd ones get no row */
};

static const char *routing_name(enum routing r)
{
    return r == ROUTE_RANDOM ? "random" : r == ROUTE_SAME ? "all rows the same experts"
                                                          : "even experts only";
}

/* ids in no particular order within a row, weights positive summing to 1. */
static void route(enum routing how, int n_rows, int n_experts, int top_k, uint64_t seed,
                  int32_t *ids, float *w)
{
    uint64_t s = seed;
    int32_t *perm = malloc((size_t)n_experts * sizeof *perm);
    for (int r = 0; r < n_rows; r++) {
        int pool = how == ROUTE_EVEN ? (n_experts + 1) / 2 : n_experts;
        for (int e = 0; e < pool; e++)
            perm[e] = how == ROUTE_EVEN ? 2 * e : e;
        if (how == ROUTE_SAME) {
            /* the first top_k, shuffled */
            for (int j = top_k - 1; j > 0; j--) {
                int i = (int)(rng_next(&s) % (uint64_t)(j + 1));
                int32_t t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
        } else {
            for (int j = 0; j < top_k; j++) {
                int i = j + (int)(rng_next(&s) % (uint64_t)(pool - j));
                int32_t t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
        }
        float sum = 0;
        for (int j = 0; j < top_k; j++) {
            ids[r * top_k + j] = perm[j];
            w[r * top_k + j] = 0.05f + (frand(&s) + 1.0f);
            sum += w[r * top_k + j];
        }
        for (int j = 0; j < top_k; j++)
            w[r * top_k + j] /= sum;
    }
    free(perm);
}

/* ---- running the op ---- */

/* moe_ffn on the CPU backend, host memory throughout. */
static void run_cpu(struct backend *be, const struct experts *E, const float *x, int n_rows,
                    const int32_t *ids, const float *w, int top_k, float *y)
{
    float *scratch = malloc(moe_scratch_floats(n_rows, top_k, E->inter, E->hidden) * sizeof(float));
    cr_assert_not_null(scratch);
    be->ops->moe_ffn(be, x, n_rows, &E->host, ids, w, top_k, scratch, y);
    free(scratch);
}

/* Device buffers of one call shape. */
struct dev_call {
    struct backend *be;
    int n_rows, top_k;
    int64_t hidden;
    float *x, *w, *scratch, *y;
    int32_t *ids;
};

static void call_alloc(struct dev_call *c, struct backend *be, const struct experts *E,
                       int n_rows, int top_k)
{
    c->be = be;
    c->n_rows = n_rows;
    c->top_k = top_k;
    c->hidden = E->hidden;
    size_t nx = (size_t)n_rows * (size_t)E->hidden, np = (size_t)n_rows * (size_t)top_k;
    c->x = be->ops->alloc(be, nx * sizeof(float));
    c->y = be->ops->alloc(be, nx * sizeof(float));
    c->w = be->ops->alloc(be, np * sizeof(float));
    c->ids = be->ops->alloc(be, np * sizeof(int32_t));
    c->scratch =
        be->ops->alloc(be, moe_scratch_floats(n_rows, top_k, E->inter, E->hidden) * sizeof(float));
    cr_assert(c->x && c->y && c->w && c->ids && c->scratch);
}

static void call_upload(struct dev_call *c, const float *x, const int32_t *ids, const float *w)
{
    struct backend *be = c->be;
    size_t nx = (size_t)c->n_rows * (size_t)c->hidden, np = (size_t)c->n_rows * (size_t)c->top_k;
    be->ops->to_device(be, c->x, x, nx * sizeof(float));
    be->ops->to_device(be, c->ids, ids, np * sizeof(int32_t));
    be->ops->to_device(be, c->w, w, np * sizeof(float));
}

static void call_run(struct dev_call *c, const struct experts *E)
{
    c->be->ops->moe_ffn(c->be, c->x, c->n_rows, &E->dev, c->ids, c->w, c->top_k, c->scratch,
                        c->y);
}

static void call_result(struct dev_call *c, float *y)
{
    struct backend *be = c->be;
    be->ops->to_host(be, y, c->y, (size_t)c->n_rows * (size_t)c->hidden * sizeof(float));
    struct err err = {0};
    cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);
}

static void call_free(struct dev_call *c)
{
    struct backend *be = c->be;
    be->ops->release(be, c->x);
    be->ops->release(be, c->y);
    be->ops->release(be, c->w);
    be->ops->release(be, c->ids);
    be->ops->release(be, c->scratch);
}

/* One call on the GPU: upload, run, download. */
static void run_gpu(struct backend *be, const struct experts *E, const float *x, int n_rows,
                    const int32_t *ids, const float *w, int top_k, float *y)
{
    struct dev_call c;
    call_alloc(&c, be, E, n_rows, top_k);
    call_upload(&c, x, ids, w);
    call_run(&c, E);
    call_result(&c, y);
    call_free(&c);
}

/* ---- tolerances ---- */

/* EXACT mode: both backends sum the same f32 products in their own orders,
 * each within K u sum|terms| of the exact sum (K <= 2048, u = 2^-24); on
 * these random rows that is a few 1e-6 of a row's scale. Outputs cancel to
 * near 0 often, so an element's error is measured against its row's largest
 * |y| (relative to the element itself it would be unbounded):
 *     |y_gpu - y_cpu| <= 1e-5 * max_o |y_cpu[r, o]|. */
static double check_exact(const float *got, const float *want, int n_rows, int64_t hidden,
                          const char *what)
{
    double worst = 0;
    for (int r = 0; r < n_rows; r++) {
        double scale = 0;
        for (int64_t o = 0; o < hidden; o++)
            scale = fmax(scale, fabs(want[r * hidden + o]));
        double tol = 1e-5 * scale + 1e-30;
        for (int64_t o = 0; o < hidden; o++) {
            double d = fabs((double)got[r * hidden + o] - want[r * hidden + o]);
            worst = fmax(worst, d / tol);
            if (!(d <= tol))
                cr_assert_fail("%s: y[%d, %lld] = %.9g, CPU %.9g (tolerance %.3g)", what, r,
                               (long long)o, got[r * hidden + o], want[r * hidden + o], tol);
        }
    }
    return worst;
}

static double silu(double g)
{
    return g / (1.0 + exp(-g));
}

/* How far one backend's f32 sum of n terms may be from the exact sum: the
 * usual model of rounding errors as independent, zero-mean, at most u = 2^-24
 * relative to the partial sum, bounded at 8 standard deviations
 * (8 sqrt(n / 3) u M, M the largest partial sum), plus the tensor cores'
 * truncating accumulation, at most two ulps (4u) of the partial sum per 16
 * products, all of one sign (n / 4 u M). M is measured in double in column
 * order and taken at least as the terms' 2-norm, what a partial sum in
 * another order reaches. (The worst-case bound, n u sum|terms|, is a hundred
 * times what rounding does and would let real faults through.) */
static double sum_error(int64_t n, double m)
{
    return (8 * sqrt((double)n / 3) + (double)n / 4) * 0x1p-24 * m;
}

/* FAST mode, one row. Both backends round x to bf16 (x^), sum gate.x^ and
 * up.x^ (exact products) in f32 in their own orders, take h = silu(g) u (the
 * CPU's exp is a vector approximation within 2 ulp: 2^-19 |h| covers it),
 * round h to bf16 and sum the down projection in f32; the weighted sum over
 * experts runs in the same order on both. So each backend's h_i is within
 *   dh_i = 1.1 |u_i| e_g + |silu(g_i)| e_u + 2^-19 |h_i|
 * of the exact one (e: sum_error of the gate and up sums; |silu'| <= 1.1),
 * both roundings lie in [bf16(h_i - dh_i), bf16(h_i + dh_i)] (rounding is
 * monotonic) and differ by at most that band's width b_i (0 unless a
 * rounding midpoint is near h_i). Per output o:
 *   tol = sum_j w_j [ sum_i |d_oi| b_i + 2 e_down(o) ] + 2^-22 |y_o|
 * computed in double from the weights. */
static void fast_row_tolerance(const struct experts *E, const float *x, const int32_t *ids,
                               const float *w, int top_k, double *tol)
{
    const int64_t H = E->hidden, I = E->inter;
    double *xb = malloc((size_t)H * sizeof(double)), *hb = malloc((size_t)I * sizeof(double));
    double *band = malloc((size_t)I * sizeof(double));
    for (int64_t c = 0; c < H; c++)
        xb[c] = bf16_to_f32(f32_to_bf16(x[c]));
    for (int64_t o = 0; o < H; o++)
        tol[o] = 0;
    for (int j = 0; j < top_k; j++) {
        int e = ids[j];
        for (int64_t i = 0; i < I; i++) {
            double g = 0, uu = 0, mg = 0, mu = 0, g2 = 0, u2 = 0;
            for (int64_t c = 0; c < H; c++) {
                double a = wval(E, 0, e, i * H + c) * xb[c], b = wval(E, 1, e, i * H + c) * xb[c];
                g += a;
                uu += b;
                g2 += a * a;
                u2 += b * b;
                mg = fmax(mg, fabs(g));
                mu = fmax(mu, fabs(uu));
            }
            double h = silu(g) * uu;
            double dh = 1.1 * fabs(uu) * sum_error(H, fmax(mg, sqrt(g2))) +
                        fabs(silu(g)) * sum_error(H, fmax(mu, sqrt(u2))) + 0x1p-19 * fabs(h);
            hb[i] = bf16_to_f32(f32_to_bf16((float)h));
            band[i] = bf16_to_f32(f32_to_bf16((float)(h + dh))) -
                      bf16_to_f32(f32_to_bf16((float)(h - dh)));
        }
        for (int64_t o = 0; o < H; o++) {
            double flip = 0, t = 0, m = 0, t2 = 0;
            for (int64_t i = 0; i < I; i++) {
                double d = wval(E, 2, e, o * I + i);
                flip += fabs(d) * band[i];
                t += d * hb[i];
                t2 += d * hb[i] * d * hb[i];
                m = fmax(m, fabs(t));
            }
            tol[o] += w[j] * (flip + 2 * sum_error(I, fmax(m, sqrt(t2)))) +
                      0x1p-22 * w[j] * fabs(t);
        }
    }
    free(xb);
    free(hb);
    free(band);
}

/* FAST: the bound above on sampled rows (every row up to 16; it costs a
 * double-precision pass over the row's experts), and on every row a coarse
 * one, 2^-8 of the row's largest |y| (one bf16 rounding of the row's scale:
 * far above what rounding does on the sampled rows, far below a wrong expert,
 * tile or row). */
static double check_fast(const struct experts *E, const float *x, const int32_t *ids,
                         const float *w, int top_k, const float *got, const float *want,
                         int n_rows, const char *what)
{
    const int64_t H = E->hidden;
    double worst = 0;
    for (int r = 0; r < n_rows; r++) {
        double scale = 0;
        for (int64_t o = 0; o < H; o++)
            scale = fmax(scale, fabs(want[r * H + o]));
        for (int64_t o = 0; o < H; o++) {
            double d = fabs((double)got[r * H + o] - want[r * H + o]);
            if (!(d <= 0x1p-8 * scale + 1e-30))
                cr_assert_fail("%s: y[%d, %lld] = %.9g, CPU %.9g: off by more than 2^-8 of the "
                               "row's largest |y| (%.3g)",
                               what, r, (long long)o, got[r * H + o], want[r * H + o], scale);
        }
    }
    int samples = n_rows <= 16 ? n_rows : 16;
    double *tol = malloc((size_t)H * sizeof(double));
    for (int k = 0; k < samples; k++) {
        int r = samples == n_rows ? k : (int)((int64_t)k * (n_rows - 1) / (samples - 1));
        fast_row_tolerance(E, x + r * H, ids + r * top_k, w + r * top_k, top_k, tol);
        for (int64_t o = 0; o < H; o++) {
            double d = fabs((double)got[r * H + o] - want[r * H + o]);
            worst = fmax(worst, d / (tol[o] + 1e-30));
            if (!(d <= tol[o] + 1e-30))
                cr_assert_fail("%s: y[%d, %lld] = %.9g, CPU %.9g (bound %.3g)", what, r,
                               (long long)o, got[r * H + o], want[r * H + o], tol[o]);
        }
    }
    free(tol);
    return worst;
}

/* ---- the cases ---- */

static float *random_x(int n_rows, int64_t hidden, uint64_t seed)
{
    float *x = malloc((size_t)((int64_t)n_rows * hidden) * sizeof(float));
    uint64_t s = seed;
    for (int64_t i = 0; i < (int64_t)n_rows * hidden; i++)
        x[i] = frand(&s);
    return x;
}

/* Rows alone (up to 8 of them, spread) give the bits they give in the batch. */
static void check_rows_alone(struct backend *be, const struct experts *E, const float *x,
                             const int32_t *ids, const float *w, int top_k, const float *batch,
                             int n_rows, const char *what)
{
    int n = n_rows < 8 ? n_rows : 8;
    float *one = malloc((size_t)E->hidden * sizeof(float));
    for (int k = 0; k < n; k++) {
        int r = n == n_rows ? k : (int)((int64_t)k * (n_rows - 1) / (n - 1));
        run_gpu(be, E, x + (int64_t)r * E->hidden, 1, ids + r * top_k, w + r * top_k, top_k, one);
        cr_assert_eq(memcmp(one, batch + (int64_t)r * E->hidden, (size_t)E->hidden * sizeof(float)),
                     0, "%s: row %d alone differs from the same row in the batch of %d", what, r,
                     n_rows);
    }
    free(one);
}

/* Each row count and routing: the GPU against the CPU in mode; EXACT mode's
 * rows alone against the batch. */
static void check_shape(struct experts *E, enum compute_mode mode, enum backend_switch moe,
                        int top_k, const int *rows, int n_cases, const char *shape)
{
    struct backend *gpu = cuda(mode, BACKEND_DEFAULT, moe);
    struct backend *ref = cpu(mode);
    experts_upload(E, gpu);
    for (int c = 0; c < n_cases; c++) {
        for (int how = ROUTE_RANDOM; how <= ROUTE_EVEN; how++) {
            int n = rows[c];
            float *x = random_x(n, E->hidden, 1000 + (uint64_t)n);
            int32_t *ids = malloc((size_t)(n * top_k) * sizeof *ids);
            float *w = malloc((size_t)(n * top_k) * sizeof *w);
            route((enum routing)how, n, E->n, top_k, 77 + (uint64_t)n, ids, w);
            float *y = malloc((size_t)((int64_t)n * E->hidden) * sizeof(float));
            float *want = malloc((size_t)((int64_t)n * E->hidden) * sizeof(float));
            run_cpu(ref, E, x, n, ids, w, top_k, want);
            run_gpu(gpu, E, x, n, ids, w, top_k, y);
            char what[256];
            snprintf(what, sizeof what, "%s %s %s, %s kernels, %d rows, %s", shape,
                     dtype_name(E->dt), mode == COMPUTE_EXACT ? "exact" : "fast",
                     moe == BACKEND_OFF ? "first" : "new", n, routing_name((enum routing)how));
            double worst = mode == COMPUTE_EXACT
                               ? check_exact(y, want, n, E->hidden, what)
                               : check_fast(E, x, ids, w, top_k, y, want, n, what);
            cr_log_info("%s: worst error %.3f of the tolerance", what, worst);
            if (mode == COMPUTE_EXACT && n > 1)
                check_rows_alone(gpu, E, x, ids, w, top_k, y, n, what);
            free(x);
            free(ids);
            free(w);
            free(y);
            free(want);
        }
    }
    experts_drop_device(E);
    backend_destroy(gpu);
    backend_destroy(ref);
}

/* hidden and inter multiples of 8 but not of the GEMM's 32-wide K steps or
 * its 64/128-wide output tiles: the tails of every kernel run */
#define SMALL_HIDDEN 136
#define SMALL_INTER 104
#define SMALL_EXPERTS 16
#define SMALL_TOPK 4

static const int small_rows[] = {1, 3, 16, 100, 4096};

Test(cuda_moe, small_shape_exact_matches_the_cpu_and_rows_alone_match_the_batch, .timeout = 600)
{
    skip_without_gpu();
    enum dtype types[2] = {DTYPE_BF16, DTYPE_F32};
    for (int t = 0; t < 2; t++) {
        struct experts E;
        experts_make(&E, types[t], SMALL_EXPERTS, SMALL_HIDDEN, SMALL_INTER, 5 + (uint64_t)t,
                     false);
        check_shape(&E, COMPUTE_EXACT, BACKEND_DEFAULT, SMALL_TOPK, small_rows, 5, "small");
        check_shape(&E, COMPUTE_EXACT, BACKEND_OFF, SMALL_TOPK, small_rows, 5, "small");
        experts_free(&E);
    }
}

Test(cuda_moe, small_shape_fast_stays_within_the_derived_bf16_bound, .timeout = 600)
{
    skip_without_gpu();
    struct experts E;
    experts_make(&E, DTYPE_BF16, SMALL_EXPERTS, SMALL_HIDDEN, SMALL_INTER, 9, false);
    check_shape(&E, COMPUTE_FAST, BACKEND_DEFAULT, SMALL_TOPK, small_rows, 5, "small");
    check_shape(&E, COMPUTE_FAST, BACKEND_OFF, SMALL_TOPK, small_rows, 5, "small");
    experts_free(&E);
}

/* A shape the vectorised kernels cannot read (dims not multiples of 8) still
 * runs, on the first kernels, whatever the switch. */
Test(cuda_moe, a_shape_of_odd_dimensions_runs_on_the_first_kernels, .timeout = 300)
{
    skip_without_gpu();
    static const int rows[] = {1, 5, 40};
    struct experts E;
    experts_make(&E, DTYPE_F32, 6, 24, 12, 11, false);
    check_shape(&E, COMPUTE_EXACT, BACKEND_DEFAULT, 2, rows, 3, "odd");
    experts_free(&E);
}

/* The odd experts hold NaN and no row chooses them: every output is finite,
 * on every path (a row alone, rows grouped by expert, the grouped GEMM). */
Test(cuda_moe, experts_no_row_chose_are_never_read, .timeout = 300)
{
    skip_without_gpu();
    static const int rows[] = {1, 3, 16, 100, 4096};
    struct experts E;
    experts_make(&E, DTYPE_BF16, SMALL_EXPERTS, SMALL_HIDDEN, SMALL_INTER, 13, true);
    for (int mode = 0; mode < 2; mode++) {
        struct backend *gpu = cuda(mode ? COMPUTE_FAST : COMPUTE_EXACT, BACKEND_DEFAULT,
                                   BACKEND_DEFAULT);
        experts_upload(&E, gpu);
        for (int c = 0; c < 5; c++) {
            int n = rows[c];
            float *x = random_x(n, E.hidden, 3);
            int32_t *ids = malloc((size_t)(n * SMALL_TOPK) * sizeof *ids);
            float *w = malloc((size_t)(n * SMALL_TOPK) * sizeof *w);
            route(ROUTE_EVEN, n, E.n, SMALL_TOPK, 21, ids, w);
            float *y = malloc((size_t)((int64_t)n * E.hidden) * sizeof(float));
            run_gpu(gpu, &E, x, n, ids, w, SMALL_TOPK, y);
            for (int64_t i = 0; i < (int64_t)n * E.hidden; i++)
                cr_assert(isfinite(y[i]), "%s, %d rows: y[%lld] = %g: an unchosen expert was read",
                          mode ? "fast" : "exact", n, (long long)i, y[i]);
            free(x);
            free(ids);
            free(w);
            free(y);
        }
        experts_drop_device(&E);
        backend_destroy(gpu);
    }
    experts_free(&E);
}

/* Qwen3-30B-A3B's experts: hidden 2048, moe_intermediate 768, 128 experts, top 8. */
#define Q_HIDDEN 2048
#define Q_INTER 768
#define Q_EXPERTS 128
#define Q_TOPK 8

static const int q_rows[] = {1, 3, 16, 100, 4096};

Test(cuda_moe, qwen3_30b_shape_exact_matches_the_cpu_and_rows_alone_match_the_batch,
     .timeout = 1200)
{
    skip_without_gpu();
    enum dtype types[2] = {DTYPE_BF16, DTYPE_F32};
    for (int t = 0; t < 2; t++) {
        struct experts E;
        experts_make(&E, types[t], Q_EXPERTS, Q_HIDDEN, Q_INTER, 17 + (uint64_t)t, false);
        check_shape(&E, COMPUTE_EXACT, BACKEND_DEFAULT, Q_TOPK, q_rows, 5, "qwen3-30b-a3b");
        experts_free(&E);
    }
}

Test(cuda_moe, qwen3_30b_shape_fast_stays_within_the_derived_bf16_bound, .timeout = 1200)
{
    skip_without_gpu();
    struct experts E;
    experts_make(&E, DTYPE_BF16, Q_EXPERTS, Q_HIDDEN, Q_INTER, 23, false);
    check_shape(&E, COMPUTE_FAST, BACKEND_DEFAULT, Q_TOPK, q_rows, 5, "qwen3-30b-a3b");
    experts_free(&E);
}

/* Steps of up to 8 rows replay from a CUDA graph: the first call captures,
 * the second (new x, ids and weights in the same buffers) replays; both equal
 * eager launches bit for bit. */
Test(cuda_moe, graph_replay_equals_eager_launches, .timeout = 300)
{
    skip_without_gpu();
    static const int rows[] = {1, 3, 8};
    struct experts E;
    experts_make(&E, DTYPE_BF16, Q_EXPERTS, Q_HIDDEN, Q_INTER, 29, false);
    for (int mode = 0; mode < 2; mode++) {
        enum compute_mode m = mode ? COMPUTE_FAST : COMPUTE_EXACT;
        struct backend *graphs = cuda(m, BACKEND_ON, BACKEND_DEFAULT);
        struct backend *eager = cuda(m, BACKEND_OFF, BACKEND_DEFAULT);
        struct experts Eg = E, Ee = E;
        experts_upload(&Eg, graphs);
        experts_upload(&Ee, eager);
        for (int c = 0; c < 3; c++) {
            int n = rows[c];
            struct dev_call cg, ce;
            call_alloc(&cg, graphs, &Eg, n, Q_TOPK);
            call_alloc(&ce, eager, &Ee, n, Q_TOPK);
            float *yg = malloc((size_t)(n * Q_HIDDEN) * sizeof(float));
            float *ye = malloc((size_t)(n * Q_HIDDEN) * sizeof(float));
            for (int round = 0; round < 2; round++) {
                float *x = random_x(n, Q_HIDDEN, 40 + (uint64_t)round);
                int32_t ids[8 * Q_TOPK];
                float w[8 * Q_TOPK];
                route(ROUTE_RANDOM, n, Q_EXPERTS, Q_TOPK, 50 + (uint64_t)round, ids, w);
                call_upload(&cg, x, ids, w);
                call_run(&cg, &Eg);
                call_result(&cg, yg);
                call_upload(&ce, x, ids, w);
                call_run(&ce, &Ee);
                call_result(&ce, ye);
                cr_assert_eq(memcmp(yg, ye, (size_t)(n * Q_HIDDEN) * sizeof(float)), 0,
                             "%s, %d rows, %s: the graph's result differs from eager launches",
                             mode ? "fast" : "exact", n, round ? "replay" : "capture");
                free(x);
            }
            free(yg);
            free(ye);
            call_free(&cg);
            call_free(&ce);
        }
        experts_drop_device(&Eg);
        experts_drop_device(&Ee);
        backend_destroy(graphs);
        backend_destroy(eager);
    }
    experts_free(&E);
}

/* Fuse rule 8: a MoE layer's routing, experts and residual add recorded in one step (the
 * add done by the experts' last launch: the down row kernel at 1 and 3 rows, the sum over
 * each row's experts at 8 and 64; the row kernels reading x before waiting for routing)
 * leave the ids, weights and residual that the three ops leave as steps of their own, bit
 * for bit, at the row counts of every path. */
Test(cuda_moe, routing_experts_and_residual_add_in_one_step_equal_their_own_steps,
     .timeout = 300)
{
    skip_without_gpu();
    static const int rows[] = {1, 3, 8, 64};
    struct experts E;
    experts_make(&E, DTYPE_BF16, Q_EXPERTS, Q_HIDDEN, Q_INTER, 31, false);
    for (int mode = 0; mode < 2; mode++) {
        struct backend *be =
            cuda(mode ? COMPUTE_FAST : COMPUTE_EXACT, BACKEND_OFF, BACKEND_DEFAULT);
        experts_upload(&E, be);
        for (int c = 0; c < 4; c++) {
            int n = rows[c];
            size_t bytes = (size_t)(n * Q_HIDDEN) * sizeof(float);
            size_t n_logits = (size_t)(n * Q_EXPERTS), n_pairs = (size_t)(n * Q_TOPK);
            struct dev_call call;
            call_alloc(&call, be, &E, n, Q_TOPK);
            float *x = random_x(n, Q_HIDDEN, 60 + (uint64_t)c);
            float *res0 = random_x(n, Q_HIDDEN, 70 + (uint64_t)c);
            float *logits = random_x(n, Q_EXPERTS, 80 + (uint64_t)c);
            be->ops->to_device(be, call.x, x, bytes);
            float *dl = be->ops->alloc(be, n_logits * sizeof(float));
            float *res = be->ops->alloc(be, bytes);
            cr_assert(dl && res);
            be->ops->to_device(be, dl, logits, n_logits * sizeof(float));
            float *got[2], *w[2];
            int32_t *ids[2];
            for (int fold = 0; fold < 2; fold++) {
                got[fold] = malloc(bytes);
                w[fold] = malloc(n_pairs * sizeof(float));
                ids[fold] = malloc(n_pairs * sizeof(int32_t));
                cr_assert(got[fold] && w[fold] && ids[fold]);
                be->ops->to_device(be, res, res0, bytes);
                int32_t id0;
                float y0;
                be->ops->moe_route(be, dl, n, Q_EXPERTS, Q_TOPK, true, call.ids, call.w);
                if (!fold) /* reading an output ends the step: each op a step of its own */
                    be->ops->to_host(be, &id0, call.ids, sizeof id0);
                call_run(&call, &E);
                if (!fold)
                    be->ops->to_host(be, &y0, call.y, sizeof y0);
                be->ops->add(be, res, call.y, (int64_t)n * Q_HIDDEN);
                be->ops->to_host(be, got[fold], res, bytes);
                be->ops->to_host(be, ids[fold], call.ids, n_pairs * sizeof(int32_t));
                be->ops->to_host(be, w[fold], call.w, n_pairs * sizeof(float));
                struct err err = {0};
                cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);
            }
            const char *m = mode ? "fast" : "exact";
            cr_assert_eq(memcmp(ids[0], ids[1], n_pairs * sizeof(int32_t)), 0,
                         "%s, %d rows: one launch left other expert ids", m, n);
            cr_assert_eq(memcmp(w[0], w[1], n_pairs * sizeof(float)), 0,
                         "%s, %d rows: one launch left other weights", m, n);
            cr_assert_eq(memcmp(got[0], got[1], bytes), 0,
                         "%s, %d rows: one launch left another residual", m, n);
            for (int fold = 0; fold < 2; fold++) {
                free(got[fold]);
                free(w[fold]);
                free(ids[fold]);
            }
            be->ops->release(be, res);
            be->ops->release(be, dl);
            free(logits);
            free(x);
            free(res0);
            call_free(&call);
        }
        experts_drop_device(&E);
        backend_destroy(be);
    }
    experts_free(&E);
}

/* Routing a block per row picks the experts and weights the one-thread-a-row
 * kernel (moe_route_row's replay of libstdc++) picks, bit for bit: rows of
 * distinct logits, rows whose logits take three values (ties across the
 * top-k boundary: the replay decides) and rows all equal. */
Test(cuda_moe, routing_a_block_per_row_equals_the_serial_replay_bit_for_bit, .timeout = 300)
{
    skip_without_gpu();
    static const struct {
        int n, k;
    } shapes[] = {{6, 2}, {128, 8}, {128, 2}, {512, 8}, {60, 40}};
    struct backend *parallel = cuda(COMPUTE_EXACT, BACKEND_OFF, BACKEND_DEFAULT);
    struct backend *serial = cuda(COMPUTE_EXACT, BACKEND_OFF, BACKEND_OFF);
    const int n_rows = 300;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int n = shapes[c].n, k = shapes[c].k;
        float *logits = malloc((size_t)(n_rows * n) * sizeof(float));
        uint64_t s = 99 + c;
        for (int r = 0; r < n_rows; r++)
            for (int e = 0; e < n; e++) {
                float v = frand(&s);
                logits[r * n + e] = r % 3 == 0   ? v * 4.0f
                                    : r % 3 == 1 ? (v < -0.33f ? -1.0f : v < 0.33f ? 0.0f : 1.0f)
                                    : (r % 9 == 2 ? 0.5f : (float)(int)(v * 3.0f));
            }
        int32_t *ids[2];
        float *w[2];
        for (int norm = 0; norm < 2; norm++) {
            for (int b = 0; b < 2; b++) {
                struct backend *be = b ? serial : parallel;
                float *dl = be->ops->alloc(be, (size_t)(n_rows * n) * sizeof(float));
                int32_t *di = be->ops->alloc(be, (size_t)(n_rows * k) * sizeof(int32_t));
                float *dw = be->ops->alloc(be, (size_t)(n_rows * k) * sizeof(float));
                be->ops->to_device(be, dl, logits, (size_t)(n_rows * n) * sizeof(float));
                be->ops->moe_route(be, dl, n_rows, n, k, norm != 0, di, dw);
                ids[b] = malloc((size_t)(n_rows * k) * sizeof(int32_t));
                w[b] = malloc((size_t)(n_rows * k) * sizeof(float));
                be->ops->to_host(be, ids[b], di, (size_t)(n_rows * k) * sizeof(int32_t));
                be->ops->to_host(be, w[b], dw, (size_t)(n_rows * k) * sizeof(float));
                struct err err = {0};
                cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);
                be->ops->release(be, dl);
                be->ops->release(be, di);
                be->ops->release(be, dw);
            }
            for (int r = 0; r < n_rows; r++) {
                cr_assert_eq(memcmp(ids[0] + r * k, ids[1] + r * k, (size_t)k * sizeof(int32_t)),
                             0, "%d experts, top %d, row %d: the block kernel chose other experts",
                             n, k, r);
                cr_assert_eq(memcmp(w[0] + r * k, w[1] + r * k, (size_t)k * sizeof(float)), 0,
                             "%d experts, top %d, row %d: other weights", n, k, r);
            }
            for (int b = 0; b < 2; b++) {
                free(ids[b]);
                free(w[b]);
            }
        }
        free(logits);
    }
    backend_destroy(parallel);
    backend_destroy(serial);
}

/* ---- timings: printed, never asserted ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call: reps calls recorded as one step (replayed from a graph
 * when it qualifies), timed on its second run. */
static double time_calls(struct dev_call *c, const struct experts *E, int reps)
{
    float y0;
    double t = 0;
    for (int round = 0; round < 2; round++) {
        double t0 = now_s();
        for (int i = 0; i < reps; i++)
            call_run(c, E);
        c->be->ops->to_host(c->be, &y0, c->y, sizeof y0);
        t = now_s() - t0;
    }
    struct err err = {0};
    cr_assert_eq(c->be->ops->status(c->be, &err), 0, "%s", err.msg);
    return t / reps;
}

Test(cuda_moe, timings_on_the_qwen3_30b_shape_are_printed, .timeout = 600)
{
    skip_without_gpu();
    static const int rows[] = {1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096};
    struct experts E;
    experts_make(&E, DTYPE_BF16, Q_EXPERTS, Q_HIDDEN, Q_INTER, 31, false);
    const double expert_bytes = 3.0 * Q_HIDDEN * Q_INTER * 2;
    const double pair_flops = 2.0 * 3 * Q_HIDDEN * Q_INTER;
    for (int mode = 0; mode < 2; mode++) {
        for (int sw = 0; sw < 2; sw++) {
            enum backend_switch moe = sw ? BACKEND_OFF : BACKEND_DEFAULT;
            struct backend *gpu = cuda(mode ? COMPUTE_FAST : COMPUTE_EXACT, BACKEND_DEFAULT, moe);
            experts_upload(&E, gpu);
            for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++) {
                int n = rows[c];
                /* the first kernels re-read every expert per row: big batches take minutes */
                if (sw && n > 1024)
                    continue;
                float *x = random_x(n, Q_HIDDEN, 61);
                int32_t *ids = malloc((size_t)(n * Q_TOPK) * sizeof *ids);
                float *w = malloc((size_t)(n * Q_TOPK) * sizeof *w);
                route(ROUTE_RANDOM, n, Q_EXPERTS, Q_TOPK, 62, ids, w);
                bool used[Q_EXPERTS] = {false};
                int distinct = 0;
                for (int i = 0; i < n * Q_TOPK; i++)
                    if (!used[ids[i]]) {
                        used[ids[i]] = true;
                        distinct++;
                    }
                struct dev_call call;
                call_alloc(&call, gpu, &E, n, Q_TOPK);
                call_upload(&call, x, ids, w);
                double t = time_calls(&call, &E, n <= 64 ? 50 : 5);
                double gbs = distinct * expert_bytes / t / 1e9;
                double tflops = (double)n * Q_TOPK * pair_flops / t / 1e12;
                cr_log_info("qwen3-30b-a3b experts, %s, %s kernels, %4d rows (%3d experts read): "
                            "%9.1f us, %7.1f GB/s of expert weights, %6.1f TFLOP/s",
                            mode ? "fast " : "exact", sw ? "first" : "new  ", n, distinct, t * 1e6,
                            gbs, tflops);
                printf("cuda moe: %s, %s kernels, %4d rows (%3d experts): %9.1f us, %7.1f GB/s, "
                       "%6.1f TFLOP/s\n",
                       mode ? "fast " : "exact", sw ? "first" : "new  ", n, distinct, t * 1e6, gbs,
                       tflops);
                call_free(&call);
                free(x);
                free(ids);
                free(w);
            }
            experts_drop_device(&E);
            backend_destroy(gpu);
        }
    }
    experts_free(&E);
}
