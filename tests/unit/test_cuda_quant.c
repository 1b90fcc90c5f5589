/* tests/unit/test_cuda_quant.c — block-quantized weights on the GPU: each type's GEMV (EXACT, FAST's int8 path and its float kernels, with every fused epilogue) and prefill GEMM against the CPU reference dot product, embedding rows equal to the reference dequantizer's, and tiny GGUF and MLX models' logits on CUDA against the CPU's dequantized reference, with graph replay equal to eager launches. Skipped, saying why, without a GPU. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "base/quant.h"
#include "engine/generate.h"
#include "kv/kv.h"
#include "model/model.h"
#include "tools/gguf_write.h"
#include "tools/mkmodel.h"
#include "tools/mlx_write.h"
#include "test_support.h"

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: quantized CUDA kernels not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: quantized CUDA kernels not checked");
}

/* dp4a: FAST mode's int8 path for the block GEMVs, stream: Q4_K's one-launch
 * kernel on it (--cuda-qgemv mixed|stream|dp4a|float) */
static struct backend *cuda_with(enum compute_mode mode, enum backend_switch graphs,
                                 enum backend_switch dp4a, enum backend_switch stream)
{
    struct backend *be;
    struct err err = {0};
    struct backend_options opt = {.mode = mode, .cuda_graphs = graphs, .cuda_qgemv_dp4a = dp4a,
                                  .cuda_qgemv_stream = stream};
    cr_assert_eq(backend_cuda_create(0, &opt, &be, &err), 0, "%s", err.msg);
    return be;
}

static struct backend *cuda(enum compute_mode mode, enum backend_switch graphs)
{
    return cuda_with(mode, graphs, BACKEND_DEFAULT, BACKEND_DEFAULT);
}

/* The ways a block GEMV runs: EXACT, FAST on int8 x (the default: Q4_K on
 * the stream kernel, which quantizes x itself), FAST on the float kernels,
 * and FAST on int8 x quantized by a launch of its own for every type. */
enum qpath { PATH_EXACT, PATH_FAST_INT8, PATH_FAST_FLOAT, PATH_FAST_DP4A, PATH_COUNT };
static const char *const path_names[] = {"exact", "fast int8", "fast float", "fast dp4a"};

static struct backend *cuda_path(enum qpath p, enum backend_switch graphs)
{
    return cuda_with(p == PATH_EXACT ? COMPUTE_EXACT : COMPUTE_FAST, graphs,
                     p == PATH_FAST_FLOAT ? BACKEND_OFF : BACKEND_ON,
                     p == PATH_FAST_DP4A ? BACKEND_OFF : BACKEND_ON);
}

/* Whether path p runs type t over n_tok rows on the int8 kernels. */
static bool takes_int8(enum qpath p, enum dtype t, int n_tok)
{
    return (p == PATH_FAST_INT8 || p == PATH_FAST_DP4A) && n_tok <= 8 &&
           (t == DTYPE_Q8_0 || t == DTYPE_Q4_K || t == DTYPE_Q6_K);
}

/* The int8 path's error bound for one output (row w of cols, token x).
 *
 * It quantizes x in blocks of 32: xd = amax / 127 (amax: the block's largest
 * |x|), xq_i = round(x_i * fl(127 / amax)), and computes exactly (up to f32
 * rounding) sum_i w_i xhat_i with xhat_i = xd xq_i - the weight's codes times
 * xq in int32, the scales applied after (qgemv.cu). Rounding to the nearest
 * integer leaves |x_i / step - xq_i| <= 1/2, so |xhat_i - x_i| <= amax / 254,
 * and the two f32 roundings of the scale and its reciprocal add at most
 * 127 * 2^-23 relative of a step, below amax * 2^-20. Hence
 *   |y - sum w x| <= sum_blocks amax_b (1/254 + 2^-20) sum_{i in b} |w_i|,
 * on top of the f32 summation bound (check_type). */
static double int8_bound(const float *w, const float *x, int64_t cols)
{
    double bound = 0;
    for (int64_t b = 0; b < cols; b += 32) {
        double amax = 0, sw = 0;
        for (int i = 0; i < 32; i++) {
            amax = fmax(amax, fabs((double)x[b + i]));
            sw += fabs((double)w[b + i]);
        }
        bound += amax * (1.0 / 254 + 0x1p-20) * sw;
    }
    return bound;
}

static void fill(float *x, int64_t n, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)(seed >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

/* Q8_0, Q4_K and Q6_K (a Q4_K_M file's types) and every MLX type. */
static int kernel_types(enum dtype *out)
{
    int n = 0;
    out[n++] = DTYPE_Q8_0;
    out[n++] = DTYPE_Q4_K;
    out[n++] = DTYPE_Q6_K;
    for (int t = DTYPE_MLX4_G32_BF16; t <= DTYPE_MLX8_G128_F32; t++)
        out[n++] = (enum dtype)t;
    return n;
}

static void *upload(struct backend *be, const void *host, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes);
    cr_assert_not_null(d);
    be->ops->to_device(be, d, host, bytes);
    return d;
}

/* y = x w^T through the backend's matmul on a block matrix (rows x cols,
 * quantized from random values with the reference quantizer), against the
 * reference in double over the reference dequantizer's weights.
 *
 * Tolerance, per output: the GEMV sums the same f32 products as the
 * reference, in another order, so |dy| <= K u sum|w x| (K = cols, u = 2^-24:
 * the worst-case bound of a recursive f32 sum, 3e-5 of sum|w x| at K = 512).
 * FAST mode's prefill GEMM (more than 8 rows) multiplies bf16 roundings of
 * both w and x (each within 2^-9 relative): 2^-8 sum|w x| more. FAST mode's
 * int8 path: int8_bound more, and twice the f32 term (its block sums are
 * scaled by products of two or three scales, and Q4_K subtracts the mins'
 * term from the scales', each rounded once more). The int8 path must also
 * show its rounding somewhere (an error above 1e-5 of sum|w x|, where the
 * float kernels stay near 1e-7), so a silent fall-back to them fails. */
static void check_type(struct backend *be, enum dtype t, int n_tok, int64_t rows, int64_t cols,
                       enum qpath path)
{
    const bool fast = path != PATH_EXACT, int8 = takes_int8(path, t, n_tok);
    uint64_t rb = dtype_row_bytes(t, (uint64_t)cols);
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *wd = malloc((size_t)(rows * cols) * 4);
    float *x = malloc((size_t)(n_tok * cols) * sizeof *x), *bias = malloc((size_t)rows * 4);
    float *y = malloc((size_t)(n_tok * rows) * sizeof *y);
    uint8_t *q = malloc((size_t)(rb * (uint64_t)rows));
    fill(w, rows * cols, (uint32_t)t * 7 + 1);
    fill(x, n_tok * cols, (uint32_t)n_tok + 99);
    fill(bias, rows, 5);
    for (int64_t r = 0; r < rows; r++) {
        quant_quantize_row(t, w + r * cols, q + (uint64_t)r * rb, cols);
        quant_dequantize_row(t, q + (uint64_t)r * rb, wd + r * cols, cols);
    }
    struct weight_matrix m = {.dtype = t, .rows = rows, .cols = cols};
    m.data = upload(be, q, (size_t)(rb * (uint64_t)rows));
    float *xd = upload(be, x, (size_t)(n_tok * cols) * 4), *bd = upload(be, bias, (size_t)rows * 4);
    float *yd = be->ops->alloc(be, (size_t)(n_tok * rows) * 4);
    be->ops->matmul(be, xd, n_tok, &m, bd, yd);
    be->ops->to_host(be, y, yd, (size_t)(n_tok * rows) * 4);
    struct err err = {0};
    cr_assert_eq(be->ops->status(be, &err), 0, "%s: %s", dtype_name(t), err.msg);
    double K = (double)cols, u = 0x1p-24, worst = 0, seen = 0;
    for (int i = 0; i < n_tok; i++)
        for (int64_t r = 0; r < rows; r++) {
            double ref = bias[r], mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                ref += (double)wd[r * cols + c] * x[i * cols + c];
                mag += fabs((double)wd[r * cols + c] * x[i * cols + c]);
            }
            double tol = (int8 ? 2 : 1) * K * u * mag + (fast && n_tok > 8 ? 0x1p-8 * mag : 0) +
                         (int8 ? int8_bound(wd + r * cols, x + i * cols, cols) : 0) + 1e-6;
            double d = fabs(y[i * rows + r] - ref);
            worst = fmax(worst, d / tol);
            seen = fmax(seen, d / (mag + 1e-30));
            cr_assert_leq(d, tol, "%s, %d tokens, %lld cols (%s): y[%d, %lld] = %.7g, reference %.7g",
                          dtype_name(t), n_tok, (long long)cols, path_names[path], i,
                          (long long)r, y[i * rows + r], ref);
        }
    if (int8)
        cr_assert_gt(seen, 1e-5, "%s, %d tokens (%s): no int8 rounding seen (%.3g of sum|w x|): "
                     "did the float kernels run?", dtype_name(t), n_tok, path_names[path], seen);
    cr_log_info("%s, %d tokens, %lld cols (%s): worst error %.3f of the bound", dtype_name(t),
                n_tok, (long long)cols, path_names[path], worst);
    be->ops->release(be, (void *)m.data);
    be->ops->release(be, xd);
    be->ops->release(be, bd);
    be->ops->release(be, yd);
    free(w);
    free(wd);
    free(x);
    free(bias);
    free(y);
    free(q);
}

Test(cuda_quant, every_kernel_type_matches_the_reference_dot_product, .timeout = 600)
{
    skip_without_gpu();
    enum dtype types[32];
    int n = kernel_types(types);
    static const int tokens[] = {1, 2, 3, 4, 8, 20};
    /* 512: two Q4_K blocks, most lanes idle; 4352 (17 blocks): lanes wrap
     * and the last unrolled round is partial; 2048: Q6_K rows the stream
     * kernel takes (eight blocks, 16-byte aligned) */
    static const int64_t widths[] = {512, 4352, 2048};
    for (int p = PATH_EXACT; p < PATH_COUNT; p++) {
        struct backend *be = cuda_path((enum qpath)p, BACKEND_DEFAULT);
        cr_assert(be->block_weights);
        for (int i = 0; i < n; i++) {
            cr_assert(backend_takes_blocks(be, types[i]), "%s", dtype_name(types[i]));
            /* 97 rows: odd, the last block of warps is part empty */
            for (int k = 0; k < 6; k++)
                for (int c = 0; c < 3; c++)
                    check_type(be, types[i], tokens[k], 97, widths[c], (enum qpath)p);
        }
        /* more rows than a wave of warps: the stream kernel's warps walk
         * several rows each, prefetching the next row's slots, on rows of
         * one stage and of four to eight (Q4_K 16,384 columns, Q6_K 8,192) */
        if (p == PATH_FAST_INT8)
            for (int k = 0; k < 3; k++) {
                check_type(be, DTYPE_Q4_K, tokens[k], 4099, 512, (enum qpath)p);
                check_type(be, DTYPE_Q6_K, tokens[k], 4099, 2048, (enum qpath)p);
                check_type(be, DTYPE_Q4_K, tokens[k], 4099, 16384, (enum qpath)p);
                check_type(be, DTYPE_Q6_K, tokens[k], 4099, 8192, (enum qpath)p);
            }
        backend_destroy(be);
    }
}

/* The GEMV's fused epilogues on block weights, each path against the
 * reference: several matrices in one launch (matmul_group of 3, with and
 * without bias), the residual add (matmul then add) and the SwiGLU pair
 * (matmul_group of 2 then silu_mul into the gate). The pair's tolerance
 * carries the factors' bounds through g' = silu(g) u: |silu'| <= 1.1, so
 * |dg'| <= 1.1 |u| tg + |silu(g)| tu + 1.1 tg tu. With graphs on, the same
 * ops replayed give the bits of the graphs-off backend. */
struct epi_mat {
    int64_t rows;
    float *wd; /* the reference dequantizer's weights */
    struct weight_matrix m;
};

static void epi_make(struct backend *be, enum dtype t, int64_t rows, int64_t cols, uint32_t seed,
                     struct epi_mat *e)
{
    uint64_t rb = dtype_row_bytes(t, (uint64_t)cols);
    float *w = malloc((size_t)(rows * cols) * 4);
    uint8_t *q = malloc((size_t)(rb * (uint64_t)rows));
    e->rows = rows;
    e->wd = malloc((size_t)(rows * cols) * 4);
    fill(w, rows * cols, seed);
    for (int64_t r = 0; r < rows; r++) {
        quant_quantize_row(t, w + r * cols, q + (uint64_t)r * rb, cols);
        quant_dequantize_row(t, q + (uint64_t)r * rb, e->wd + r * cols, cols);
    }
    e->m = (struct weight_matrix){.dtype = t, .rows = rows, .cols = cols};
    e->m.data = upload(be, q, (size_t)(rb * (uint64_t)rows));
    free(w);
    free(q);
}

/* The reference output (row r, token x) and its tolerance on path p. */
static double epi_ref(const struct epi_mat *e, int64_t r, const float *x, int64_t cols,
                      bool int8, bool fast_gemm, double *tol)
{
    double ref = 0, mag = 0;
    for (int64_t c = 0; c < cols; c++) {
        ref += (double)e->wd[r * cols + c] * x[c];
        mag += fabs((double)e->wd[r * cols + c] * x[c]);
    }
    *tol = (int8 ? 2 : 1) * (double)cols * 0x1p-24 * mag + (fast_gemm ? 0x1p-8 * mag : 0) +
           (int8 ? int8_bound(e->wd + r * cols, x, cols) : 0) + 1e-6;
    return ref;
}

/* Runs the three epilogues once on be, x and the bias already at xd and bd,
 * the outputs in od (the same buffers every time, so a second run replays
 * the first one's graph); out: group y0 | y1 | y2 | res | g | u. */
static void epi_run(struct backend *be, const struct epi_mat *e, const float *xd, const float *bd,
                    float *od, int n_tok, const float *res0, float *out)
{
    const int64_t r0 = e[0].rows, r1 = e[1].rows, r2 = e[2].rows;
    const size_t n_out = (size_t)n_tok * (size_t)(r0 + r1 + r2 + r0 + r0 + r0);
    float *y0 = od, *y1 = y0 + n_tok * r0, *y2 = y1 + n_tok * r1, *res = y2 + n_tok * r2;
    float *g = res + n_tok * r0, *uu = g + n_tok * r0;
    be->ops->to_device(be, res, res0, (size_t)(n_tok * r0) * 4);
    const struct weight_matrix *ws[3] = {&e[0].m, &e[1].m, &e[2].m};
    const float *bs[3] = {bd, NULL, bd};
    float *ys[3] = {y0, y1, y2};
    cr_assert_eq(e[2].rows, r0);
    be->ops->matmul_group(be, xd, n_tok, 3, ws, bs, ys);
    /* the residual: a product of its own into g, then res += g */
    be->ops->matmul(be, xd, n_tok, &e[0].m, NULL, g);
    be->ops->add(be, res, g, (size_t)n_tok * r0);
    const struct weight_matrix *gu[2] = {&e[0].m, &e[2].m};
    const float *nb[2] = {NULL, NULL};
    float *gy[2] = {g, uu};
    be->ops->matmul_group(be, xd, n_tok, 2, gu, nb, gy);
    be->ops->silu_mul(be, g, uu, g, (size_t)n_tok * r0);
    be->ops->to_host(be, out, od, n_out * 4);
    struct err err = {0};
    cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);
}

Test(cuda_quant, fused_epilogues_match_the_reference_on_every_path, .timeout = 600)
{
    skip_without_gpu();
    static const enum dtype types[] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q6_K};
    static const int tokens[] = {1, 2, 3, 4, 8};
    /* 9 blocks of 256; 64: rows of several stages on the stream kernel */
    static const int64_t widths[] = {2304, 16384};
    for (int wi = 0; wi < 2; wi++) {
        for (int p = PATH_EXACT; p < PATH_COUNT; p++) {
            const int64_t cols = widths[wi];
            struct backend *be = cuda_path((enum qpath)p, BACKEND_ON);
            struct backend *eager = cuda_path((enum qpath)p, BACKEND_OFF);
            for (int ti = 0; ti < 3; ti++) {
                enum dtype t = types[ti];
                struct epi_mat e[3], ee[3];
                const int64_t rows[3] = {97, 33, 97};
                for (int k = 0; k < 3; k++) {
                    epi_make(be, t, rows[k], cols, 11 + 5 * (uint32_t)k + (uint32_t)t, &e[k]);
                    epi_make(eager, t, rows[k], cols, 11 + 5 * (uint32_t)k + (uint32_t)t, &ee[k]);
                }
                for (int k = 0; k < 5; k++) {
                    const int n_tok = tokens[k];
                    const bool int8 = takes_int8((enum qpath)p, t, n_tok);
                    float *x = malloc((size_t)(n_tok * cols) * 4), *bias = malloc(97 * 4);
                    float *res0 = malloc((size_t)n_tok * 97 * 4);
                    fill(x, n_tok * cols, 1000 + (uint32_t)k);
                    fill(bias, 97, 17);
                    fill(res0, n_tok * 97, 23);
                    const size_t n_out = (size_t)n_tok * (97 + 33 + 97 + 97 * 3);
                    float *out = malloc(n_out * 4), *again = malloc(n_out * 4),
                          *plain = malloc(n_out * 4);
                    float *xd = upload(be, x, (size_t)(n_tok * cols) * 4);
                    float *bd = upload(be, bias, 97 * 4), *od = be->ops->alloc(be, n_out * 4);
                    float *xe = upload(eager, x, (size_t)(n_tok * cols) * 4);
                    float *bde = upload(eager, bias, 97 * 4), *oe = eager->ops->alloc(eager, n_out * 4);
                    epi_run(be, e, xd, bd, od, n_tok, res0, out);
                    epi_run(be, e, xd, bd, od, n_tok, res0, again); /* replayed */
                    epi_run(eager, ee, xe, bde, oe, n_tok, res0, plain);
                    be->ops->release(be, xd);
                    be->ops->release(be, bd);
                    be->ops->release(be, od);
                    eager->ops->release(eager, xe);
                    eager->ops->release(eager, bde);
                    eager->ops->release(eager, oe);
                    cr_assert_eq(memcmp(out, again, n_out * 4), 0, "%s, %d tokens (%s): replay differs",
                                 dtype_name(t), n_tok, path_names[p]);
                    cr_assert_eq(memcmp(out, plain, n_out * 4), 0,
                                 "%s, %d tokens (%s): graphs differ from eager launches",
                                 dtype_name(t), n_tok, path_names[p]);
                    const float *y[3] = {out, out + n_tok * 97, out + n_tok * (97 + 33)};
                    const float *res = y[2] + n_tok * 97, *g = res + n_tok * 97, *uu = g + n_tok * 97;
                    const char *what[3] = {"group matrix 0 (bias)", "group matrix 1", "group matrix 2 (bias)"};
                    for (int i = 0; i < n_tok; i++) {
                        const float *xi = x + (int64_t)i * cols;
                        for (int mi = 0; mi < 3; mi++)
                            for (int64_t r = 0; r < rows[mi]; r++) {
                                double tol, ref = epi_ref(&e[mi], r, xi, cols, int8, false, &tol);
                                if (mi != 1)
                                    ref += bias[r];
                                double got = y[mi][i * rows[mi] + r];
                                cr_assert_leq(fabs(got - ref), tol, "%s, %d tokens (%s): %s y[%d, %lld] = %.7g, reference %.7g",
                                              dtype_name(t), n_tok, path_names[p], what[mi], i, (long long)r, got, ref);
                            }
                        for (int64_t r = 0; r < 97; r++) {
                            double tg, tu;
                            double rg = epi_ref(&e[0], r, xi, cols, int8, false, &tg);
                            double ru = epi_ref(&e[2], r, xi, cols, int8, false, &tu);
                            double want = res0[i * 97 + r] + rg, got = res[i * 97 + r];
                            cr_assert_leq(fabs(got - want), tg + 1e-6 * fabs(want),
                                          "%s, %d tokens (%s): residual [%d, %lld] = %.7g, reference %.7g",
                                          dtype_name(t), n_tok, path_names[p], i, (long long)r, got, want);
                            double sg = rg / (1 + exp(-rg));
                            double tol = 1.1 * fabs(ru) * tg + fabs(sg) * tu + 1.1 * tg * tu +
                                         1e-6 * fabs(sg * ru) + 1e-6;
                            got = g[i * 97 + r];
                            cr_assert_leq(fabs(got - sg * ru), tol,
                                          "%s, %d tokens (%s): swiglu [%d, %lld] = %.7g, reference %.7g",
                                          dtype_name(t), n_tok, path_names[p], i, (long long)r, got, sg * ru);
                            got = uu[i * 97 + r];
                            cr_assert_leq(fabs(got - ru), tu, "%s, %d tokens (%s): up [%d, %lld] = %.7g, reference %.7g",
                                          dtype_name(t), n_tok, path_names[p], i, (long long)r, got, ru);
                        }
                    }
                    cr_log_info("%s, %d tokens (%s): epilogues within their bounds", dtype_name(t),
                                n_tok, path_names[p]);
                    free(x);
                    free(bias);
                    free(res0);
                    free(out);
                    free(again);
                    free(plain);
                }
                for (int k = 0; k < 3; k++) {
                    be->ops->release(be, (void *)e[k].m.data);
                    eager->ops->release(eager, (void *)ee[k].m.data);
                    free(e[k].wd);
                    free(ee[k].wd);
                }
            }
            backend_destroy(be);
            backend_destroy(eager);
        }
    }
}

/* Q4_K_M's attention projections: q and k in Q4_K, v in Q6_K over the same
 * (normalised) x. In one step the planner gives the three one launch of the
 * stream kernel with both types; each row is still summed by one warp in its
 * own order over the same quantized x, so the outputs are the bits of the
 * products launched apart (q and k in one step, v in the next). With and
 * without the RMSNorm folded in, with graphs and without, at widths whose x
 * images fit the mixed launch's shared memory or not (then it runs apart),
 * and with the types the other way round (Q6_K first). */
static void mixed_run(struct backend *be, const struct epi_mat *e, const float *xd,
                      const float *nwd, float *xn, float *od, int n_tok, int64_t cols, bool norm,
                      bool apart, float *out)
{
    const int64_t r0 = e[0].rows, r1 = e[1].rows, r2 = e[2].rows;
    const size_t n_out = (size_t)n_tok * (size_t)(r0 + r1 + r2);
    float *ys[3] = {od, od + n_tok * r0, od + n_tok * (r0 + r1)};
    const struct weight_matrix *ws[3] = {&e[0].m, &e[1].m, &e[2].m};
    const float *x = xd;
    if (norm) {
        be->ops->rmsnorm(be, xd, nwd, n_tok, cols, 1e-5f, xn);
        x = xn;
    }
    float probe;
    be->ops->matmul_group(be, x, n_tok, apart ? 2 : 3, ws, NULL, ys);
    if (apart) {
        be->ops->to_host(be, &probe, od, sizeof probe); /* ends the step */
        be->ops->matmul(be, x, n_tok, ws[2], NULL, ys[2]);
    }
    be->ops->to_host(be, out, od, n_out * 4);
    struct err err = {0};
    cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);
}

Test(cuda_quant, a_mixed_q4_k_and_q6_k_launch_gives_the_bits_of_its_products_apart, .timeout = 300)
{
    skip_without_gpu();
    static const int tokens[] = {1, 2, 3, 8};
    static const int64_t widths[] = {2048, 16384};
    for (int g = 0; g < 2; g++) {
        struct backend *be = cuda(COMPUTE_FAST, g ? BACKEND_ON : BACKEND_OFF);
        for (int wi = 0; wi < 3; wi++) {
            const int64_t cols = widths[wi < 2 ? wi : 0];
            const int64_t rows[3] = {97, 33, 64};
            const bool q6_first = wi == 2;
            const enum dtype types[3] = {q6_first ? DTYPE_Q6_K : DTYPE_Q4_K,
                                         q6_first ? DTYPE_Q6_K : DTYPE_Q4_K,
                                         q6_first ? DTYPE_Q4_K : DTYPE_Q6_K};
            struct epi_mat e[3];
            for (int k = 0; k < 3; k++)
                epi_make(be, types[k], rows[k], cols, 31 + 7 * (uint32_t)k, &e[k]);
            float *nw = malloc((size_t)cols * 4);
            fill(nw, cols, 5);
            float *nwd = upload(be, nw, (size_t)cols * 4);
            for (int k = 0; k < 4; k++) {
                const int n_tok = tokens[k];
                const size_t n_out = (size_t)n_tok * (97 + 33 + 64);
                float *x = malloc((size_t)(n_tok * cols) * 4);
                fill(x, n_tok * cols, 300 + (uint32_t)k);
                float *xd = upload(be, x, (size_t)(n_tok * cols) * 4);
                float *xn = be->ops->alloc(be, (size_t)(n_tok * cols) * 4);
                float *od = be->ops->alloc(be, n_out * 4);
                float *mixed = malloc(n_out * 4), *apart = malloc(n_out * 4);
                for (int norm = 0; norm < 2; norm++) {
                    mixed_run(be, e, xd, nwd, xn, od, n_tok, cols, norm, false, mixed);
                    mixed_run(be, e, xd, nwd, xn, od, n_tok, cols, norm, true, apart);
                    for (size_t i = 0; i < n_out; i++)
                        cr_assert(memcmp(&mixed[i], &apart[i], 4) == 0,
                                  "%lld columns%s, %d tokens, norm %d, graphs %d: output %zu is "
                                  "%.9g in one launch, %.9g apart",
                                  (long long)cols, q6_first ? " (Q6_K first)" : "", n_tok, norm,
                                  g, i, mixed[i], apart[i]);
                }
                /* and within the reference's bound (no norm: x as given) */
                mixed_run(be, e, xd, nwd, xn, od, n_tok, cols, false, false, mixed);
                for (int i = 0; i < n_tok; i++)
                    for (int mi = 0, off = 0; mi < 3; off += n_tok * (int)rows[mi], mi++)
                        for (int64_t r = 0; r < rows[mi]; r++) {
                            double tol;
                            double ref = epi_ref(&e[mi], r, x + (int64_t)i * cols, cols, true,
                                                 false, &tol);
                            double got = mixed[off + i * rows[mi] + r];
                            cr_assert_leq(fabs(got - ref), tol,
                                          "%lld columns, %d tokens: matrix %d y[%d, %lld] = "
                                          "%.7g, reference %.7g",
                                          (long long)cols, n_tok, mi, i, (long long)r, got, ref);
                        }
                be->ops->release(be, xd);
                be->ops->release(be, xn);
                be->ops->release(be, od);
                free(x);
                free(mixed);
                free(apart);
            }
            for (int k = 0; k < 3; k++) {
                be->ops->release(be, (void *)e[k].m.data);
                free(e[k].wd);
            }
            be->ops->release(be, nwd);
            free(nw);
        }
        backend_destroy(be);
    }
}

/* Embedding rows of a block table hold exactly the reference dequantizer's values. */
Test(cuda_quant, embedding_rows_are_the_reference_dequantizers_values)
{
    skip_without_gpu();
    struct backend *be = cuda(COMPUTE_EXACT, BACKEND_DEFAULT);
    enum dtype types[32];
    int n = kernel_types(types);
    const int64_t rows = 40, cols = 256;
    int32_t tok[5] = {3, 0, 39, 3, 17};
    for (int i = 0; i < n; i++) {
        enum dtype t = types[i];
        uint64_t rb = dtype_row_bytes(t, (uint64_t)cols);
        float *w = malloc((size_t)(rows * cols) * 4), *want = malloc((size_t)cols * 4);
        float *got = malloc((size_t)(5 * cols) * 4);
        uint8_t *q = malloc((size_t)(rb * (uint64_t)rows));
        fill(w, rows * cols, 77 + (uint32_t)t);
        for (int64_t r = 0; r < rows; r++)
            quant_quantize_row(t, w + r * cols, q + (uint64_t)r * rb, cols);
        struct weight_matrix m = {.dtype = t, .rows = rows, .cols = cols};
        m.data = upload(be, q, (size_t)(rb * (uint64_t)rows));
        float *out = be->ops->alloc(be, (size_t)(5 * cols) * 4);
        be->ops->embed(be, &m, tok, 5, out);
        be->ops->to_host(be, got, out, (size_t)(5 * cols) * 4);
        struct err err = {0};
        cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);
        for (int k = 0; k < 5; k++) {
            quant_dequantize_row(t, q + (uint64_t)tok[k] * rb, want, cols);
            cr_assert_eq(memcmp(want, got + k * cols, (size_t)cols * 4), 0,
                         "%s: row %d differs from the reference", dtype_name(t), tok[k]);
        }
        be->ops->release(be, (void *)m.data);
        be->ops->release(be, out);
        free(w);
        free(want);
        free(got);
        free(q);
    }
    backend_destroy(be);
}

/* ---------------------------------------------------------------- models */

static const struct mkmodel_preset shape = {
    .name = "cuda-quant", .arch = "llama", .vocab_size = 512, .hidden_size = 256,
    .intermediate_size = 768, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .head_dim = 64,
    .max_position_embeddings = 2048, .tie_word_embeddings = false, .rope_theta = "10000.0",
    .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, .bos_token_id = 1,
    .eos_token_ids = {2}, .n_eos = 1, .gen_eos_token_ids = {2}, .n_gen_eos = 1,
    .pad_token_id = -1};

struct loaded {
    struct backend *be;
    struct model *m;
    struct kv_pool *pool;
    struct forward_state *st;
};

static void load(struct backend *be, const char *path, struct loaded *l)
{
    struct err err = {0};
    l->be = be;
    cr_assert_eq(model_load(path, be, &l->m, &err), 0, "%s: %s", path, err.msg);
    cr_assert_eq(kv_pool_create(l->m, be, 8, 16, &l->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(l->m, 64, &l->st, &err), 0, "%s", err.msg);
}

static void unload(struct loaded *l)
{
    forward_state_free(l->st);
    kv_pool_free(l->pool);
    model_free(l->m);
    backend_destroy(l->be);
}

/* Logits of every position of a made-up prompt of n tokens, then of one
 * decode step after it (n + 1 rows). */
static float *logits_of(struct loaded *l, int n)
{
    int V = l->m->config.vocab_size;
    int32_t tokens[64];
    for (int i = 0; i <= n; i++)
        tokens[i] = (int32_t)((i * 37 + 11) % V);
    uint32_t blocks[4] = {0, 1, 2, 3};
    float *logits = malloc((size_t)(n + 1) * (size_t)V * sizeof *logits);
    struct err err = {0};
    struct batch_seq seq = {tokens, n, 0, blocks, 4, true, false, NULL, NULL, 0};
    struct batch batch = {&seq, 1};
    cr_assert_eq(model_forward(l->m, l->st, &l->pool->cache, &batch, logits, &err), 0, "%s",
                 err.msg);
    struct batch_seq one = {tokens + n, 1, n, blocks, 4, true, false, NULL, NULL, 0};
    struct batch b1 = {&one, 1};
    cr_assert_eq(model_forward(l->m, l->st, &l->pool->cache, &b1, logits + (size_t)n * V, &err),
                 0, "%s", err.msg);
    return logits;
}

/* A tiny model's file on CUDA against the CPU's forward of the same weights
 * dequantized to F32 (the CPU backend told to take no blocks). EXACT mode:
 * f32 activations on both sides and weights dequantized to the same values,
 * so only summation orders differ (measured on the CPU alone: ~1e-5 of the
 * logits' rms); we allow 1e-3 for the GPU's other reduction trees in norms
 * and attention. FAST mode: bf16 activations into every product (2^-9
 * relative each) and, for the 20-token prefill, bf16 weights in the GEMM:
 * about 2^-8 per product through 2 layers' 4 products and the head, ~1% of
 * rms; we allow 3%. FAST mode on the int8 path (the default; the 3% holds for
 * --cuda-qgemv float): the decode row's Q8_0/Q4_K/Q6_K products take x
 * rounded to int8 steps of amax / 127 per block of 32, an error uniform in
 * half a step, rms amax / 440, about 0.5% of rms(x) for amax ~2.2 rms(x) -
 * twice bf16's 2^-8 per product, so ~2% through the same 9 products; we
 * allow 5%, the same margin. */
static void check_model(const char *path, const char *what)
{
    for (int mode = 0; mode < PATH_COUNT; mode++) {
        struct backend *cpu;
        struct err err = {0};
        cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &cpu, &err), 0);
        cpu->block_weights = false;
        struct loaded ref, q;
        load(cpu, path, &ref);
        load(cuda_path((enum qpath)mode, BACKEND_DEFAULT), path, &q);
        cr_assert(dtype_is_block(q.m->weights.layers[0].w_down.dtype),
                  "%s: blocks stay blocks on the GPU", what);
        for (int n = 3; n <= 20; n += 17) {
            int V = q.m->config.vocab_size;
            float *a = logits_of(&q, n), *r = logits_of(&ref, n);
            double worst = 0, sq = 0, dsq = 0;
            for (int i = 0; i < (n + 1) * V; i++) {
                cr_assert(isfinite(a[i]));
                double e = (double)a[i] - r[i];
                worst = fmax(worst, fabs(e));
                sq += (double)r[i] * r[i];
                dsq += e * e;
            }
            double rel = sqrt(dsq / sq);
            double tol = mode == PATH_EXACT ? 1e-3 : mode == PATH_FAST_FLOAT ? 0.03 : 0.05;
            cr_log_info("%s %s, %d tokens + 1: rms(dlogit) %.3g of rms(logit), max %.3g", what,
                        path_names[mode], n, rel, worst);
            cr_assert_leq(rel, tol, "%s %s, %d tokens: rms(dlogit) %g of rms(logit)", what,
                          path_names[mode], n, rel);
            free(a);
            free(r);
        }
        unload(&q);
        unload(&ref);
    }
}

Test(cuda_quant, gguf_and_mlx_models_on_cuda_match_the_cpus_dequantized_reference, .timeout = 600)
{
    skip_without_gpu();
    struct err err = {0};
    char *tmp = test_mkdtemp(), path[4200];
    struct mkmodel_opts o = {.shape = &shape, .seed = 3, .out_dir = tmp};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    static const enum gguf_ftype ft[] = {GGUF_FTYPE_Q8_0, GGUF_FTYPE_Q4_K_M, GGUF_FTYPE_Q6_K};
    static const char *const names[] = {"q8_0", "q4_k_m", "q6_k"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s.gguf", tmp, names[i]);
        cr_assert_eq(gguf_write_model(tmp, ft[i], path, &err), 0, "%s", err.msg);
        check_model(path, names[i]);
    }
    for (int bits = 4; bits <= 8; bits += 4) {
        snprintf(path, sizeof path, "%s/mlx%d", tmp, bits);
        cr_assert_eq(mlx_write_model(tmp, bits, 64, path, &err), 0, "%s", err.msg);
        check_model(path, bits == 4 ? "mlx 4-bit" : "mlx 8-bit");
    }
    test_rmtree(tmp);
    free(tmp);
}

/* Decode on the quantized GEMV kernels is captured into CUDA graphs: greedy
 * tokens and every step's logits replayed equal eager launches bit for bit. */
Test(cuda_quant, graph_replay_equals_eager_launches, .timeout = 300)
{
    skip_without_gpu();
    struct err err = {0};
    char *tmp = test_mkdtemp(), path[4200];
    struct mkmodel_opts o = {.shape = &shape, .seed = 4, .out_dir = tmp};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/q4_k_m.gguf", tmp);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_Q4_K_M, path, &err), 0, "%s", err.msg);
    enum { STEPS = 12 };
    float *logits[2];
    for (int g = 0; g < 2; g++) {
        struct backend *be = cuda(COMPUTE_FAST, g ? BACKEND_OFF : BACKEND_ON);
        struct model *m;
        struct generator *gen;
        cr_assert_eq(model_load(path, be, &m, &err), 0, "%s", err.msg);
        int V = m->config.vocab_size;
        logits[g] = malloc((size_t)STEPS * (size_t)V * sizeof(float));
        cr_assert_eq(generator_create(m, 64, 16, &gen, &err), 0, "%s", err.msg);
        int32_t prompt[5] = {1, 7, 99, 300, 4}, tok;
        cr_assert_eq(generator_feed(gen, prompt, 5, &err), 0, "%s", err.msg);
        for (int s = 0; s < STEPS; s++) {
            memcpy(logits[g] + (size_t)s * V, gen->logits, (size_t)V * sizeof(float));
            tok = 0;
            for (int i = 1; i < V; i++)
                if (gen->logits[i] > gen->logits[tok])
                    tok = i;
            cr_assert_eq(generator_feed(gen, &tok, 1, &err), 0, "%s", err.msg);
        }
        generator_free(gen);
        model_free(m);
        backend_destroy(be);
    }
    cr_assert_eq(memcmp(logits[0], logits[1], (size_t)STEPS * shape.vocab_size * sizeof(float)), 0,
                 "graph replay and eager launches differ");
    free(logits[0]);
    free(logits[1]);
    test_rmtree(tmp);
    free(tmp);
}
