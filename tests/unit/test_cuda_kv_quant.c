/* tests/unit/test_cuda_kv_quant.c — a quantized KV cache on the CUDA backend against the CPU
 * backend's: the records CUDA writes are the CPU's bytes (the format is bit-defined in
 * backend/kv_quant.h and both quantize in its arithmetic and order), and CUDA's fused attention
 * over them equals the CPU's within float rounding, for every format, every tiny architecture
 * plus sliding-window, head_dim-96 and wide-GQA shapes, two prefill chunks of three sequences
 * batched (the second at positions past the first, spanning several 64-position tiles) and a
 * decode step after them, in EXACT mode (decode kernels throughout) and FAST mode (the prefill
 * kernels for the prefill chunks and the decode kernels: fp16 tiles on tensor cores, and the
 * f32 ones; the tensor-core prefill with and without its decoding warps), prefill chunks of up
 * to 1,000 tokens after 1,000 positions, and decode steps of ten rows over up to 1,900 positions
 * in many splits. Skipped, saying why, without a GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/kv_quant.h"
#include "kv/kv.h"
#include "kv/kv_quant_config.h"
#include "model/model.h"
#include "tools/mkmodel.h"

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: quantized KV on CUDA not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: quantized KV on CUDA not checked");
}

static struct kv_quant quant_of(const char *name)
{
    struct kv_quant q;
    bool on = false;
    struct err err = {0};
    cr_assert_eq(kv_quant_parse(name, &q, &on, &err), 0, "%s: %s", name, err.msg);
    cr_assert(on, "%s is quantized", name);
    return q;
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

#define GQ_LAYERS 2
#define GQ_BLOCK 16
#define GQ_MAX_SEQS 12
/* CUDA attention vs CPU attention over the same records: both read the same
 * decoded values; only the order of the sums (and, for QJL keys in the
 * prefill kernel, R'^T z folded into the key instead of R' R q into the
 * query) differs. Outputs are averages of values in [-1, 1]. */
#define GQ_TOL 2e-4f
/* The tensor-core kernels round the query, the decoded K/V elements and the
 * softmax weights to fp16 (test_cuda_parity's bound for the f16 cache). */
#define GQ_TOL_TENSOR_CORES 5e-3f

/* What a check runs: n_seqs sequences given two chunks of tokens each (a
 * chunk of 0 skips the step for that sequence), then a decode step of one
 * token each, over a cache of n_blocks blocks dealt round-robin. With
 * attend_prefill false the chunks are only stored, and attention runs at the
 * decode step alone. */
struct gq_plan {
    int n_seqs, n_blocks;
    int chunks[2][GQ_MAX_SEQS];
    bool attend_prefill;
};

/* Three sequences: a prefill chunk of 37, 5 and 20 tokens, a second chunk of
 * 140, 2 and 70 after it (spanning several 64-position tiles), then the
 * decode step. */
static const struct gq_plan gq_short = {3, 40, {{37, 5, 20}, {140, 2, 70}}, true};

/* Ten sequences of 1 to 1,900 positions, on tile and split edges and past
 * them, for decode steps whose rows span up to eight splits. */
static const struct gq_plan gq_long = {
    10, 1200, {{1200, 1, 63, 64, 65, 700, 1023, 1100, 255, 1201}, {699, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    false};

/* Three sequences whose chunks of 1,000, 333 and 64 tokens are followed by
 * chunks of 700 and 129 (and none), all attended. */
static const struct gq_plan gq_long_prefill = {3, 400, {{1000, 333, 64}, {700, 129, 0}}, true};

struct gq_case {
    int n_heads, n_kv_heads, head_dim, sliding_window;
    const char *name;
};

/* A cache of one backend: its memory and the kv_cache over it. */
struct gq_cache {
    struct kv_cache kv;
    size_t krow, vrow, slots;
};

static void gq_cache_init(struct backend *be, const struct gq_case *gc, int n_blocks,
                          struct gq_cache *c)
{
    struct err err = {0};
    struct kv_format f = kv_format_of_backend(be);
    struct model_config mc = {.n_layers = GQ_LAYERS, .n_kv_heads = gc->n_kv_heads,
                              .head_dim = gc->head_dim, .n_heads = gc->n_heads};
    cr_assert_eq(kv_format_check(&mc, &f, &err), 0, "%s", err.msg);
    c->krow = kv_format_row_bytes(&mc, &f, false);
    c->vrow = kv_format_row_bytes(&mc, &f, true);
    c->slots = (size_t)GQ_LAYERS * n_blocks * GQ_BLOCK;
    c->kv = (struct kv_cache){.k = be->ops->alloc(be, c->slots * c->krow),
                              .v = be->ops->alloc(be, c->slots * c->vrow),
                              .dtype = be->kv_dtype, .n_layers = GQ_LAYERS,
                              .n_blocks = n_blocks, .block_size = GQ_BLOCK,
                              .n_kv_heads = gc->n_kv_heads, .head_dim = gc->head_dim,
                              .quant = be->kv_quant, .k_row_bytes = c->krow,
                              .v_row_bytes = c->vrow};
    cr_assert(c->kv.k && c->kv.v, "cache memory");
}

static void *dev_copy(struct backend *be, const void *src, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes);
    cr_assert(d, "device memory");
    be->ops->to_device(be, d, src, bytes);
    return d;
}

/* The CUDA kernels a check runs. tensor_cores: FAST mode's tensor-core
 * prefill and decode kernels (else the f32 ones); window: that prefill from
 * the records decoded once into an f16 window (head dims 64 and 128) for the
 * f16 cache's kernel, on wgmma unless wgmma is off; with window off,
 * prefill_ws: the prefill's decoding warps beside the attending ones, which
 * attend on wgmma unless wgmma is off, in clusters of two blocks unless pair
 * is off. */
struct gq_kernels {
    enum backend_switch tensor_cores, prefill_ws, wgmma, pair, window;
};

/* The plan's steps on both backends, every layer checked at each step it
 * attends. */
static void check_format(const struct gq_case *gc, const char *format, enum compute_mode mode,
                         struct gq_kernels k, const struct gq_plan *plan)
{
    const enum backend_switch tensor_cores = k.tensor_cores;
    struct kv_quant q = quant_of(format);
    if (q.layer[0].scheme == KV_QUANT_AFFINE && gc->head_dim % q.layer[0].group_size)
        return; /* groups must tile head_dim (kv_format_check refuses it) */
    struct err err = {0};
    struct backend *bc, *bg;
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2, .kv_quant = &q}, &bc,
                                    &err),
                 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(0,
                                     &(struct backend_options){.mode = mode, .kv_quant = &q,
                                                               .cuda_prefill_tc = tensor_cores,
                                                               .cuda_decode_tc = tensor_cores,
                                                               .cuda_qprefill_ws = k.prefill_ws,
                                                               .cuda_prefill_wgmma = k.wgmma,
                                                               .cuda_qprefill_pair = k.pair,
                                                               .cuda_qprefill_window = k.window},
                                     &bg, &err),
                 0, "%s", err.msg);
    const float tol =
        mode == COMPUTE_FAST && tensor_cores != BACKEND_OFF ? GQ_TOL_TENSOR_CORES : GQ_TOL;
    const int n_seqs = plan->n_seqs, n_blocks = plan->n_blocks;
    struct gq_cache cc, cg;
    gq_cache_init(bc, gc, n_blocks, &cc);
    gq_cache_init(bg, gc, n_blocks, &cg);
    cr_assert_eq(cc.krow, cg.krow, "the same row pitch on both backends");
    cr_assert_eq(cc.vrow, cg.vrow, "the same row pitch on both backends");
    int hd = gc->head_dim, kvh = gc->n_kv_heads, nh = gc->n_heads;
    size_t kv_dim = (size_t)kvh * hd, q_dim = (size_t)nh * hd;
    uint32_t *tables[GQ_MAX_SEQS];
    int n_tables[GQ_MAX_SEQS] = {0};
    for (int s = 0; s < n_seqs; s++)
        tables[s] = malloc((size_t)n_blocks * sizeof(uint32_t));
    for (uint32_t b = 0, s = 0; b < (uint32_t)n_blocks; b++, s = (s + 1) % n_seqs)
        tables[s][n_tables[s]++] = b;
    uint64_t seed = 0x5eed + (uint64_t)hd * 13 + (uint64_t)nh;
    uint8_t *host_k = malloc(cc.slots * cc.krow), *host_v = malloc(cc.slots * cc.vrow);
    int done[GQ_MAX_SEQS] = {0};
    for (int step = 0; step < 3; step++) {
        struct attn_span spans[GQ_MAX_SEQS];
        int rows = 0, n_spans = 0;
        for (int s = 0; s < n_seqs; s++) {
            int n = step < 2 ? plan->chunks[step][s] : 1;
            if (n == 0)
                continue;
            cr_assert_leq((done[s] + n + GQ_BLOCK - 1) / GQ_BLOCK, n_tables[s], "cache size");
            spans[n_spans++] = (struct attn_span){rows, n, done[s], tables[s], n_tables[s]};
            rows += n;
            done[s] += n;
        }
        const bool attends = step == 2 || plan->attend_prefill;
        float *k = malloc((size_t)rows * kv_dim * 4), *v = malloc((size_t)rows * kv_dim * 4);
        float *qv = malloc((size_t)rows * q_dim * 4);
        float *out_c = malloc((size_t)rows * q_dim * 4), *out_g = malloc((size_t)rows * q_dim * 4);
        for (int layer = 0; layer < GQ_LAYERS; layer++) {
            for (size_t i = 0; i < (size_t)rows * kv_dim; i++) {
                k[i] = frand(&seed) * (i % (size_t)hd == 3 ? 8.0f : 1.0f);
                v[i] = frand(&seed);
            }
            /* every fifth head row of V: no negative value, and its minimum a zero of each
             * sign, -0 first or +0 first, in different lanes of the quantizing warp (an
             * affine group keeps the first of its equal extrema: the bias's sign bit) */
            for (size_t h = 0; h < (size_t)rows * kvh; h += 5) {
                float *x = v + h * hd;
                for (int d = 0; d < hd; d++)
                    x[d] = fabsf(x[d]);
                x[1] = (h / 5) % 2 ? -0.0f : 0.0f;
                x[2] = (h / 5) % 2 ? 0.0f : -0.0f;
            }
            for (size_t i = 0; i < (size_t)rows * q_dim; i++)
                qv[i] = frand(&seed);
            float *dk = dev_copy(bg, k, (size_t)rows * kv_dim * 4);
            float *dv = dev_copy(bg, v, (size_t)rows * kv_dim * 4);
            float *dq = dev_copy(bg, qv, (size_t)rows * q_dim * 4);
            float *dout = bg->ops->alloc(bg, (size_t)rows * q_dim * 4);
            bc->ops->kv_store(bc, &cc.kv, layer, k, v, spans, n_spans);
            bg->ops->kv_store(bg, &cg.kv, layer, dk, dv, spans, n_spans);
            float scale = 1.0f / sqrtf((float)hd);
            if (attends) {
                bc->ops->attention(bc, qv, &cc.kv, layer, spans, n_spans, nh, scale,
                                   gc->sliding_window, out_c);
                bg->ops->attention(bg, dq, &cg.kv, layer, spans, n_spans, nh, scale,
                                   gc->sliding_window, dout);
                bg->ops->to_host(bg, out_g, dout, (size_t)rows * q_dim * 4);
            }
            cr_assert_eq(bg->ops->status(bg, &err), 0, "%s", err.msg);

            /* the stored records, byte for byte, in every slot written so far */
            bg->ops->to_host(bg, host_k, cg.kv.k, cc.slots * cc.krow);
            bg->ops->to_host(bg, host_v, cg.kv.v, cc.slots * cc.vrow);
            long differing = 0;
            for (int s = 0; s < n_seqs; s++)
                for (int pos = 0; pos < done[s]; pos++) {
                    uint32_t blk = tables[s][pos / GQ_BLOCK];
                    size_t slot = ((size_t)layer * n_blocks + blk) * GQ_BLOCK + pos % GQ_BLOCK;
                    differing += memcmp(host_k + slot * cc.krow,
                                        (const uint8_t *)cc.kv.k + slot * cc.krow, cc.krow) != 0;
                    differing += memcmp(host_v + slot * cc.vrow,
                                        (const uint8_t *)cc.kv.v + slot * cc.vrow, cc.vrow) != 0;
                }
            static const char *const step_name[] = {"prefill", "second prefill chunk", "decode"};
            cr_expect_eq(differing, 0, "%s %s layer %d %s: %ld K/V rows differ from the CPU's bytes",
                         gc->name, format, layer, step_name[step], differing);

            float worst = 0;
            for (size_t i = 0; attends && i < (size_t)rows * q_dim; i++) {
                float d = fabsf(out_c[i] - out_g[i]);
                worst = d > worst || isnan(d) ? d : worst;
            }
            cr_expect_leq(worst, tol, "%s %s %s%s layer %d %s: CUDA vs CPU attention differ by %g",
                          gc->name, format, mode == COMPUTE_FAST ? "fast" : "exact",
                          tensor_cores == BACKEND_OFF ? " (f32 kernels)" : "", layer,
                          step_name[step], worst);
            bg->ops->release(bg, dk);
            bg->ops->release(bg, dv);
            bg->ops->release(bg, dq);
            bg->ops->release(bg, dout);
        }
        free(k);
        free(v);
        free(qv);
        free(out_c);
        free(out_g);
    }
    for (int s = 0; s < n_seqs; s++)
        free(tables[s]);
    free(host_k);
    free(host_v);
    bc->ops->release(bc, cc.kv.k);
    bc->ops->release(bc, cc.kv.v);
    bg->ops->release(bg, cg.kv.k);
    bg->ops->release(bg, cg.kv.v);
    backend_destroy(bc);
    backend_destroy(bg);
}

static const char *const gq_formats[] = {"8",          "4",          "8g32",       "4g32",
                                         "turbo",      "turbo:k4v3", "turbo:k4v4", "turbo:k8v2",
                                         "turbo:k3v2", "turbo:k5v4", "turbo:k4v3:qjl", NULL};

static void check_all_shapes(enum compute_mode mode, struct gq_kernels k)
{
    int n = 0;
    const struct mkmodel_preset *presets = mkmodel_presets(&n);
    int tested = 0;
    for (int i = 0; i < n; i++) {
        const struct mkmodel_preset *p = &presets[i];
        if (p->real || p->head_dim % 16 || p->head_dim > 256)
            continue;
        struct gq_case gc = {p->n_heads, p->n_kv_heads, p->head_dim,
                             p->sliding_window > 0 && p->sliding_window < 30 ? p->sliding_window
                                                                             : 0,
                             p->name};
        for (int f = 0; gq_formats[f]; f++)
            check_format(&gc, gq_formats[f], mode, k, &gq_short);
        tested++;
    }
    cr_expect_geq(tested, 5, "the tiny presets");
    struct gq_case extra[] = {{4, 2, 64, 11, "sliding-11"}, {6, 2, 96, 0, "head_dim-96"},
                              {8, 1, 128, 0, "gqa-8"}, {8, 2, 256, 0, "head_dim-256"}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        for (int f = 0; gq_formats[f]; f++)
            check_format(&extra[i], gq_formats[f], mode, k, &gq_short);
}

Test(cuda_kv_quant, exact_mode_stores_the_cpus_bytes_and_attends_as_the_cpu, .timeout = 600)
{
    skip_without_gpu();
    check_all_shapes(COMPUTE_EXACT, (struct gq_kernels){0});
}

Test(cuda_kv_quant, fast_mode_tensor_core_kernels_attend_as_the_cpu, .timeout = 600)
{
    skip_without_gpu();
    check_all_shapes(COMPUTE_FAST, (struct gq_kernels){0});
}

/* The tensor-core prefill reading the records directly, with decoding warps
 * beside the attending ones (on sm_90a GPUs). */
Test(cuda_kv_quant, fast_mode_prefill_reading_the_records_attends_as_the_cpu, .timeout = 600)
{
    skip_without_gpu();
    check_all_shapes(COMPUTE_FAST, (struct gq_kernels){.window = BACKEND_OFF});
}

/* The tensor-core prefill whose warps each decode and attend in turn (the
 * kernel GPUs without sm_90a code run). */
Test(cuda_kv_quant, fast_mode_prefill_without_decoding_warps_attends_as_the_cpu, .timeout = 600)
{
    skip_without_gpu();
    check_all_shapes(COMPUTE_FAST,
                     (struct gq_kernels){.prefill_ws = BACKEND_OFF, .window = BACKEND_OFF});
}

Test(cuda_kv_quant, fast_mode_f32_kernels_attend_as_the_cpu, .timeout = 600)
{
    skip_without_gpu();
    check_all_shapes(COMPUTE_FAST, (struct gq_kernels){.tensor_cores = BACKEND_OFF});
}

/* The long plans' shapes: the Llama-3.1-8B shape, a GQA group of 16 and a
 * window. */
static const struct gq_case gq_long_shapes[] = {{32, 8, 128, 0, "llama-3.1-8b"},
                                                {16, 1, 64, 0, "gqa-16"},
                                                {8, 2, 64, 300, "sliding-300"}};

/* Every long shape in each format under the plan in FAST mode, with the
 * default kernels and then with each of the n_kernels others given. */
static void check_long_shapes(const char *const *formats, size_t n_formats,
                              const struct gq_plan *plan, const struct gq_kernels *kernels,
                              size_t n_kernels)
{
    for (size_t i = 0; i < sizeof gq_long_shapes / sizeof gq_long_shapes[0]; i++)
        for (size_t f = 0; f < n_formats; f++) {
            check_format(&gq_long_shapes[i], formats[f], COMPUTE_FAST, (struct gq_kernels){0},
                         plan);
            for (size_t k = 0; k < n_kernels; k++)
                check_format(&gq_long_shapes[i], formats[f], COMPUTE_FAST, kernels[k], plan);
        }
}

/* Decode steps of ten rows over up to 1,900 positions: rows whose positions
 * span several splits (merged afterwards) beside rows of one, in both decode
 * paths of FAST mode. */
Test(cuda_kv_quant, fast_mode_decode_over_long_rows_in_many_splits_attends_as_the_cpu,
     .timeout = 600)
{
    skip_without_gpu();
    static const char *const formats[] = {"8", "4g32", "turbo", "turbo:k4v3", "turbo:k3v2",
                                          "turbo:k5v4", "turbo:k4v3:qjl"};
    static const struct gq_kernels f32 = {.tensor_cores = BACKEND_OFF};
    check_long_shapes(formats, sizeof formats / sizeof formats[0], &gq_long, &f32, 1);
}

/* Prefill chunks of up to 1,000 tokens after up to 1,000 positions: a block
 * walks up to 32 tiles, so the prefill's producer and consumer warps pass
 * each pair of tiles back and forth many times, beside blocks of one tile;
 * every tensor-core prefill kernel (through the f16 window by default, on
 * wgmma and on mma.sync; reading the records, the decoding warps' consumers
 * on wgmma in clusters of two blocks, on wgmma in blocks alone, on mma.sync,
 * and no decoding warps). */
Test(cuda_kv_quant, fast_mode_long_prefill_chunks_attend_as_the_cpu, .timeout = 600)
{
    skip_without_gpu();
    static const char *const formats[] = {"8", "4g32", "turbo", "turbo:k4v3", "turbo:k4v3:qjl"};
    static const struct gq_kernels others[] = {
        {.wgmma = BACKEND_OFF},
        {.window = BACKEND_OFF},
        {.pair = BACKEND_OFF, .window = BACKEND_OFF},
        {.prefill_ws = BACKEND_OFF, .window = BACKEND_OFF},
        {.wgmma = BACKEND_OFF, .window = BACKEND_OFF}};
    check_long_shapes(formats, sizeof formats / sizeof formats[0], &gq_long_prefill, others,
                      sizeof others / sizeof others[0]);
}

Test(cuda_kv_quant, a_format_neither_backend_reads_is_refused_at_creation)
{
    skip_without_gpu();
    struct kv_quant q = quant_of("8");
    q.layer[0].group_size = 48;
    struct err err = {0};
    struct backend *be = NULL;
    cr_expect_lt(backend_cuda_create(0, &(struct backend_options){.kv_quant = &q}, &be, &err), 0);
    cr_expect(strstr(err.msg, "layer 0"), "names the layer: %s", err.msg);
    backend_destroy(be);
}
