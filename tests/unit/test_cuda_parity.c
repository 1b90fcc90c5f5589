/* tests/unit/test_cuda_parity.c — the CUDA backend against the Hugging Face goldens and against the CPU backend:
 * logits within tolerance for prefill, prefill + token-by-token decode and
 * varlen batches (exact and fast modes); greedy generations equal to the
 * CPU's for 32 tokens; CUDA-graph replay equal to eager launches; fast-mode
 * prefill attention against an f64 reference on varlen, chunked, GQA and
 * sliding-window shapes; f32 GEMVs batch invariant in exact mode; the
 * fast-mode skinny GEMM against f64; out of device memory as a clear error. Skipped, saying why, without a GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "base/bf16.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "golden_support.h"
#include "test_support.h"
#define GEN_TOKENS 32

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: CUDA parity not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: CUDA parity not checked");
}

/* What cuda_backend creates GPU 0 with, besides the mode: the defaults, or
 * the switch a test is comparing. */
static struct backend_options cuda_options;

static int cuda_backend(enum compute_mode mode, struct backend **out, struct err *err)
{
    struct backend_options opt = cuda_options;
    opt.mode = mode;
    return backend_cuda_create(0, &opt, out, err);
}

Test(cuda_parity, exact_mode_matches_transformers_for_prefill_decode_and_batches, .timeout = 600)
{
    skip_without_gpu();
    golden_check_all("cuda", cuda_backend, COMPUTE_EXACT, &GOLDEN_EXACT);
}

Test(cuda_parity, fast_mode_stays_within_bf16_tolerance, .timeout = 600)
{
    skip_without_gpu();
    golden_check_all("cuda", cuda_backend, COMPUTE_FAST, &GOLDEN_FAST);
}

/* The same with prefill attention on the f32 kernels, not the tensor cores. */
Test(cuda_parity, fast_mode_with_f32_prefill_attention_stays_within_bf16_tolerance,
     .timeout = 600)
{
    skip_without_gpu();
    cuda_options.cuda_prefill_tc = BACKEND_OFF;
    golden_check_all("cuda", cuda_backend, COMPUTE_FAST, &GOLDEN_FAST);
    cuda_options.cuda_prefill_tc = BACKEND_DEFAULT;
}

/* GEN_TOKENS greedy tokens after the golden's first prompt; with gap, each
 * step's lead of the top logit over the next, relative to the largest |logit|. */
static void greedy_tokens(struct backend *be, const char *dir, const struct golden_case *prompt,
                          int32_t *out, float *gap)
{
    struct err err = {0};
    struct model *m = NULL;
    struct generator *gen = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(generator_create(m, prompt->n_tokens + GEN_TOKENS + 1, 64, &gen, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(generator_feed(gen, prompt->tokens, prompt->n_tokens, &err), 0, "%s", err.msg);
    for (int i = 0; i < GEN_TOKENS; i++) {
        const int vocab = m->config.vocab_size;
        out[i] = logits_argmax(gen->logits, vocab);
        if (gap) {
            float next = -INFINITY, scale = 0;
            for (int v = 0; v < vocab; v++) {
                if (v != out[i] && gen->logits[v] > next)
                    next = gen->logits[v];
                scale = fmaxf(scale, fabsf(gen->logits[v]));
            }
            gap[i] = (gen->logits[out[i]] - next) / scale;
        }
        cr_assert_eq(generator_feed(gen, &out[i], 1, &err), 0, "%s", err.msg);
    }
    generator_free(gen);
    model_free(m);
}

static void check_generations(enum compute_mode mode)
{
    static char paths[GOLDEN_MAX_FILES][512];
    int n = golden_list(paths, GOLDEN_MAX_FILES);
    cr_assert_gt(n, 0, "no goldens found in %s", golden_dir());
    char *tmp = test_mkdtemp();
    cr_assert_not_null(tmp);
    for (int i = 0; i < n; i++) {
        struct golden g;
        cr_assert_eq(golden_load(paths[i], &g), 0, "cannot read %s", paths[i]);
        char dir[1024];
        golden_make_model(&g, tmp, dir, sizeof dir);
        struct err err = {0};
        struct backend *cpu = NULL, *gpu = NULL;
        /* the CPU's cache in the element type the GPU's is given */
        cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode, .threads = 2,
                                                                  .kv_type = cuda_options.kv_type},
                                        &cpu, &err),
                     0, "%s", err.msg);
        cr_assert_eq(cuda_backend(mode, &gpu, &err), 0, "%s", err.msg);
        int32_t want[GEN_TOKENS], got[GEN_TOKENS];
        float gap[GEN_TOKENS];
        greedy_tokens(cpu, dir, &g.cases[0], want, gap);
        greedy_tokens(gpu, dir, &g.cases[0], got, NULL);
        int same = 0;
        while (same < GEN_TOKENS && want[same] == got[same])
            same++;
        cr_log_info("cuda %s %s: greedy generation equals the CPU's for %d of %d tokens", g.name,
                    mode == COMPUTE_EXACT ? "exact" : "fast", same, GEN_TOKENS);
        /* FAST mode rounds activations to bf16 on both devices, each in its own
         * order of summation: a step whose top two logits the CPU separates by
         * less than bf16's relative step is a tie the devices may break apart */
        bool near_tie = mode == COMPUTE_FAST && same < GEN_TOKENS && gap[same] < 0x1p-8f;
        if (near_tie)
            cr_log_info("cuda %s fast: token %d is a near tie (top two %.2e apart, relative)",
                        g.name, same, gap[same]);
        cr_expect(same == GEN_TOKENS || near_tie,
                  "%s: CPU and CUDA greedy tokens differ at %d (%d vs %d; top two %.2e apart)",
                  g.name, same, same < GEN_TOKENS ? want[same] : 0,
                  same < GEN_TOKENS ? got[same] : 0, same < GEN_TOKENS ? gap[same] : 0.0f);
        backend_destroy(gpu);
        backend_destroy(cpu);
        golden_free(&g);
    }
    test_rmtree(tmp);
    free(tmp);
}

Test(cuda_parity, greedy_generation_equals_cpu_for_32_tokens_exact_mode, .timeout = 600)
{
    skip_without_gpu();
    check_generations(COMPUTE_EXACT);
}

/* Fast mode keeps the KV cache in fp16 on both devices, each rounding K and
 * V computed in its own order; with random tiny models, whose top logits are
 * often within fp16 rounding of each other, that alone can pick a different
 * token (the goldens above check the fp16 cache against transformers). With
 * an f32 cache on both they must give the CPU's tokens up to the first near
 * tie (check_generations). */
Test(cuda_parity, greedy_generation_equals_cpu_for_32_tokens_fast_mode_f32_kv, .timeout = 600)
{
    skip_without_gpu();
    cuda_options.kv_type = BACKEND_KV_F32;
    check_generations(COMPUTE_FAST);
    cuda_options.kv_type = BACKEND_KV_AUTO;
}

/* The logits of n_seqs sequences decoded side by side from golden case gc's
 * tokens, one token each per step (sequence s reads the case from its s-th
 * token on, wrapping), with the switch sw of cuda_options set to value while
 * the backend is created: n_tokens steps of n_seqs rows. */
static float *decode_logits(const char *dir, enum compute_mode mode, const struct golden_case *gc,
                            int n_seqs, enum backend_switch *sw, enum backend_switch value,
                            int *vocab)
{
    *sw = value;
    struct golden_fixture f = {0};
    golden_fixture_open(&f, cuda_backend, dir, mode, n_seqs);
    *vocab = f.model->config.vocab_size;
    size_t step_floats = (size_t)n_seqs * (size_t)*vocab;
    float *logits = malloc((size_t)gc->n_tokens * step_floats * sizeof(float));
    cr_assert_not_null(logits);
    struct err err = {0};
    struct block_table bt[16];
    cr_assert_leq(n_seqs, 16);
    int *tokens = malloc((size_t)n_seqs * sizeof *tokens);
    cr_assert_not_null(tokens);
    for (int s = 0; s < n_seqs; s++) {
        block_table_init(&bt[s]);
        cr_assert_eq(block_table_reserve(f.pool, &bt[s], gc->n_tokens, &err), 0, "%s", err.msg);
    }
    for (int i = 0; i < gc->n_tokens; i++) {
        struct batch_seq steps[16];
        for (int s = 0; s < n_seqs; s++) {
            tokens[s] = gc->tokens[(i + s) % gc->n_tokens];
            steps[s] = (struct batch_seq){.tokens = &tokens[s], .n_tokens = 1, .pos0 = i,
                                          .block_ids = bt[s].blocks, .n_block_ids = bt[s].n_blocks};
        }
        struct batch step = {steps, n_seqs};
        golden_forward(&f, &step);
        memcpy(logits + (size_t)i * step_floats, f.logits, step_floats * sizeof(float));
    }
    for (int s = 0; s < n_seqs; s++)
        block_table_clear(f.pool, &bt[s]);
    free(tokens);
    golden_fixture_close(&f);
    *sw = BACKEND_DEFAULT;
    return logits;
}

/* The model of golden file path, written into a new temporary folder (*tmp; dir its path),
 * and its longest case. */
static const struct golden_case *golden_model_longest(const char *path, struct golden *g,
                                                      char **tmp, char *dir, size_t cap)
{
    *tmp = test_mkdtemp();
    cr_assert_eq(golden_load(path, g), 0);
    golden_make_model(g, *tmp, dir, cap);
    const struct golden_case *gc = &g->cases[0];
    for (int c = 1; c < g->n_cases; c++)
        if (g->cases[c].n_tokens > gc->n_tokens)
            gc = &g->cases[c];
    return gc;
}

/* Decode steps of n_seqs sequences for every golden model (its longest case, a token at a
 * time) with a switch of the CUDA backend on and off: bit for bit when tolerance is 0, else
 * the largest |difference| at most tolerance times the largest |logit|. Returns how many
 * models' logits differed at all. */
static int decode_with_switch(enum backend_switch *sw, enum compute_mode mode, int n_seqs,
                              double tolerance, const char *what)
{
    static char paths[GOLDEN_MAX_FILES][512];
    int n = golden_list(paths, GOLDEN_MAX_FILES), differed = 0;
    cr_assert_gt(n, 0);
    for (int k = 0; k < n; k++) {
        char *tmp, dir[1024];
        struct golden g;
        const struct golden_case *gc = golden_model_longest(paths[k], &g, &tmp, dir, sizeof dir);
        int vocab = 0;
        float *on = decode_logits(dir, mode, gc, n_seqs, sw, BACKEND_ON, &vocab);
        float *off = decode_logits(dir, mode, gc, n_seqs, sw, BACKEND_OFF, &vocab);
        size_t n_floats = (size_t)gc->n_tokens * n_seqs * vocab, first = 0;
        while (first < n_floats && !memcmp(&on[first], &off[first], sizeof(float)))
            first++;
        differed += first < n_floats;
        if (tolerance == 0) {
            cr_assert_eq(first, n_floats,
                         "%s: logits of %d sequences %s differ first at step %zu, sequence %zu "
                         "(%.9g against %.9g)",
                         g.name, n_seqs, what, first / ((size_t)n_seqs * vocab),
                         first / (size_t)vocab % (size_t)n_seqs,
                         first < n_floats ? on[first] : 0.0, first < n_floats ? off[first] : 0.0);
            cr_log_info("cuda %s: %d decode steps of %d sequences bit-identical %s", g.name,
                        gc->n_tokens, n_seqs, what);
        } else {
            double worst = 0, largest = 0;
            for (size_t i = 0; i < n_floats; i++) {
                worst = fmax(worst, fabs((double)on[i] - off[i]));
                largest = fmax(largest, fabs((double)off[i]));
            }
            cr_expect_leq(worst, tolerance * largest,
                          "%s: logits of %d sequences %s differ by %.3g (largest %.3g)", g.name,
                          n_seqs, what, worst, largest);
            cr_log_info("cuda %s: %d decode steps of %d sequences %s: largest difference %.3g "
                        "of %.3g", g.name, gc->n_tokens, n_seqs, what, worst, largest);
        }
        free(on);
        free(off);
        golden_free(&g);
        test_rmtree(tmp);
        free(tmp);
    }
    return differed;
}

static void decode_equal_with_switch(enum backend_switch *sw, enum compute_mode mode, int n_seqs,
                                     const char *what)
{
    decode_with_switch(sw, mode, n_seqs, 0, what);
}

Test(cuda_graphs, replayed_decode_steps_equal_eager_launches, .timeout = 300)
{
    skip_without_gpu();
    decode_equal_with_switch(&cuda_options.cuda_graphs, COMPUTE_FAST, 1,
                             "from CUDA graphs and from eager launches");
}

/* Steps of more rows than the GEMV kernels take run on cuBLASLt; they are
 * captured once a step repeats the one before. */
Test(cuda_graphs, replayed_decode_steps_of_12_sequences_equal_eager_launches, .timeout = 300)
{
    skip_without_gpu();
    decode_equal_with_switch(&cuda_options.cuda_graphs, COMPUTE_FAST, 12,
                             "from CUDA graphs and from eager launches");
}

Test(cuda_fusion, qk_prep_folded_into_decode_attention_equals_separate_launches, .timeout = 300)
{
    skip_without_gpu();
    decode_equal_with_switch(&cuda_options.cuda_qk_fusion, COMPUTE_FAST, 1,
                             "with q/k prep folded into attention and launched apart (fast mode)");
    decode_equal_with_switch(&cuda_options.cuda_qk_fusion, COMPUTE_EXACT, 1,
                             "with q/k prep folded into attention and launched apart (exact mode)");
    /* more than 8 rows: the tensor-core decode kernel's fold */
    decode_equal_with_switch(&cuda_options.cuda_qk_fusion, COMPUTE_FAST, 12,
                             "with q/k prep folded into tensor-core attention and launched apart");
}

/* The logits of speculative-verify-shaped steps: n_seqs sequences side by side, sequence s
 * reading span[s] tokens of golden case gc a step (every row's logits; from its s-th token
 * on, wrapping), with the switch sw set to value while the backend is created; the rows of
 * every step one after another, *n_floats of them in all. */
static float *span_logits(const char *dir, const struct golden_case *gc, int n_seqs,
                          const int *span, enum backend_switch *sw, enum backend_switch value,
                          size_t *n_floats)
{
    *sw = value;
    int rows = 0, longest = 1;
    for (int s = 0; s < n_seqs; s++) {
        rows += span[s];
        longest = span[s] > longest ? span[s] : longest;
    }
    struct golden_fixture f = {0};
    golden_fixture_open(&f, cuda_backend, dir, COMPUTE_FAST, rows);
    const size_t vocab = (size_t)f.model->config.vocab_size;
    const int n_steps = gc->n_tokens / longest;
    float *logits = malloc((size_t)n_steps * rows * vocab * sizeof(float));
    int32_t *tokens = malloc((size_t)rows * sizeof *tokens);
    cr_assert(logits && tokens);
    struct err err = {0};
    struct block_table bt[8];
    cr_assert_leq(n_seqs, 8);
    for (int s = 0; s < n_seqs; s++) {
        block_table_init(&bt[s]);
        cr_assert_eq(block_table_reserve(f.pool, &bt[s], gc->n_tokens, &err), 0, "%s", err.msg);
    }
    for (int i = 0; i < n_steps; i++) {
        struct batch_seq steps[8];
        int row = 0;
        for (int s = 0; s < n_seqs; s++) {
            for (int j = 0; j < span[s]; j++)
                tokens[row + j] = gc->tokens[(i * span[s] + j + s) % gc->n_tokens];
            steps[s] = (struct batch_seq){.tokens = &tokens[row], .n_tokens = span[s],
                                          .pos0 = i * span[s], .block_ids = bt[s].blocks,
                                          .n_block_ids = bt[s].n_blocks, .all_logits = true};
            row += span[s];
        }
        struct batch step = {steps, n_seqs};
        golden_forward(&f, &step);
        memcpy(logits + (size_t)i * rows * vocab, f.logits, (size_t)rows * vocab * sizeof(float));
    }
    for (int s = 0; s < n_seqs; s++)
        block_table_clear(f.pool, &bt[s]);
    free(tokens);
    golden_fixture_close(&f);
    *sw = BACKEND_DEFAULT;
    *n_floats = (size_t)n_steps * rows * vocab;
    return logits;
}

/* Steps shaped as speculative verification, a switch on against off for every golden model:
 * one sequence of 5 tokens a step, and 5, 1 and 2 tokens side by side (8 rows, the skinny
 * GEMM's most); the largest |difference| over the largest |logit| at most tolerance (0: the
 * same bits). */
static void spans_with_switch(enum backend_switch *sw, double tolerance, const char *what)
{
    static char paths[GOLDEN_MAX_FILES][512];
    static const int one[] = {5}, mixed[] = {5, 1, 2};
    static const struct {
        int n_seqs;
        const int *span;
    } shapes[] = {{1, one}, {3, mixed}};
    int n = golden_list(paths, GOLDEN_MAX_FILES);
    cr_assert_gt(n, 0);
    for (int k = 0; k < n; k++) {
        char *tmp, dir[1024];
        struct golden g;
        const struct golden_case *gc = golden_model_longest(paths[k], &g, &tmp, dir, sizeof dir);
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            size_t n_floats = 0;
            float *on = span_logits(dir, gc, shapes[sh].n_seqs, shapes[sh].span, sw, BACKEND_ON,
                                    &n_floats);
            float *off = span_logits(dir, gc, shapes[sh].n_seqs, shapes[sh].span, sw,
                                     BACKEND_OFF, &n_floats);
            double worst = 0, largest = 0;
            size_t first = n_floats;
            for (size_t i = 0; i < n_floats; i++) {
                if (first == n_floats && memcmp(&on[i], &off[i], sizeof(float)))
                    first = i;
                worst = fmax(worst, fabs((double)on[i] - off[i]));
                largest = fmax(largest, fabs((double)off[i]));
            }
            if (tolerance == 0)
                cr_expect_eq(first, n_floats, "%s, %zu sequences: logits %s differ first at %zu",
                             g.name, (size_t)shapes[sh].n_seqs, what, first);
            else
                cr_expect_leq(worst, tolerance * largest,
                              "%s, %zu sequences: logits %s differ by %.3g (largest %.3g)",
                              g.name, (size_t)shapes[sh].n_seqs, what, worst, largest);
            cr_log_info("cuda %s: verify spans of %d sequences %s: largest difference %.3g of "
                        "%.3g", g.name, shapes[sh].n_seqs, what, worst, largest);
            free(on);
            free(off);
        }
        golden_free(&g);
        test_rmtree(tmp);
        free(tmp);
    }
}

/* Rule 1 over a verify step's spans: each block prepares the K and V of the span positions its
 * split holds, from the rows whose tokens they are, in the q/k launch's arithmetic - the same
 * bits as that launch before the attention. */
Test(cuda_fusion, qk_prep_folded_into_the_attention_of_verify_spans_equals_separate_launches,
     .timeout = 300)
{
    skip_without_gpu();
    spans_with_switch(&cuda_options.cuda_qk_span_fusion, 0,
                      "with the spans' q/k prep folded into attention and launched apart");
}

/* Rule 9 in verify steps: the RMSNorm from the sums the residual-adding skinny GEMM left,
 * against its own launch. x times the norm weight is rounded to bf16 and the inverse RMS
 * applied after the products, where the launched norm rounds the normalised x: on the
 * H200 the tiny models' logits moved by 0.4-1.0% of the largest (a MoE layer's norm, which
 * its experts read too, folded by mistake, moved them by 55%). */
Test(cuda_fusion, rmsnorm_from_the_skinny_gemms_sums_stays_within_rounding_of_its_launch,
     .timeout = 300)
{
    skip_without_gpu();
    spans_with_switch(&cuda_options.cuda_norm_sums, 2e-2,
                      "with the RMSNorm folded into the skinny GEMM and launched");
}

/* Rule 4 of fuse.h: an add and the RMSNorm of its sum in one launch give the bits of two
 * launches (12 sequences: the cuBLASLt path, whose adds stand alone; exact mode: the
 * architectures whose norms sit between a matmul and its add). */
Test(cuda_fusion, add_and_rmsnorm_in_one_launch_equal_two_launches, .timeout = 300)
{
    skip_without_gpu();
    decode_equal_with_switch(&cuda_options.cuda_add_norm_fusion, COMPUTE_FAST, 12,
                             "with each add and the RMSNorm after it in one launch and in two");
    decode_equal_with_switch(&cuda_options.cuda_add_norm_fusion, COMPUTE_EXACT, 1,
                             "with each add and the RMSNorm after it in one launch and in two "
                             "(exact mode)");
}

/* Rule 6: x rounded to bf16 by the launch before a cuBLASLt GEMM gives the bits of the GEMM's
 * own conversion (12 sequences: the cuBLASLt path). */
Test(cuda_fusion, gemm_x_written_by_the_launch_before_equals_its_own_conversion, .timeout = 300)
{
    skip_without_gpu();
    /* rule 10 rounds gate and up before the SiLU, and needs rule 6: off on both sides */
    cuda_options.cuda_gemm_bf16_swiglu = BACKEND_OFF;
    decode_equal_with_switch(&cuda_options.cuda_gemm_x_fusion, COMPUTE_FAST, 12,
                             "with each GEMM's bf16 x from the launch before it (only that x "
                             "where nothing reads the f32 output) and its own");
    cuda_options.cuda_gemm_bf16_swiglu = BACKEND_DEFAULT;
}

/* Rule 10: gate and up from the cuBLASLt GEMM in bf16, rounded before the SiLU (as
 * transformers rounds a bf16 model's), against f32 products rounded after it (12 sequences:
 * the cuBLASLt path). Every golden model with a SwiGLU MLP takes it, so some logits move. */
Test(cuda_fusion, bf16_gate_and_up_stay_within_rounding_of_f32_products, .timeout = 300)
{
    skip_without_gpu();
    int differed = decode_with_switch(&cuda_options.cuda_gemm_bf16_swiglu, COMPUTE_FAST, 12,
                                      2e-2, "with bf16 and with f32 gate/up products");
    cr_expect_gt(differed, 0, "no golden model's logits moved: rule 10 never ran");
}

/* Rule 11: a cuBLASLt GEMM adding its products into the residual stream (C = D = the stream,
 * beta 1) against writing them for an add launch: fl(res + product) either way where cuBLASLt
 * keeps its algorithm's sums, so at most float rounding apart (12 sequences). */
Test(cuda_fusion, a_gemm_adding_into_the_residual_stream_matches_the_add_launch, .timeout = 300)
{
    skip_without_gpu();
    decode_with_switch(&cuda_options.cuda_gemm_residual, COMPUTE_FAST, 12, 1e-4,
                       "with the GEMM adding into the residual stream and the add launched");
}

/* One attention call: up to ATTN_MAX_SPANS spans over a one-layer paged cache. */
#define ATTN_MAX_SPANS 40
struct attn_shape {
    int head_dim, n_heads, n_kv_heads, block_size, window, n_spans;
    int n_tokens[ATTN_MAX_SPANS], pos0[ATTN_MAX_SPANS];
    float q_amp;
};

/* Multiples of 2^-10 in [-amp, amp): exact in f16, so the cache holds what
 * the reference reads whatever its element type. */
static float exact_rand(uint64_t *state, float amp)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((*state >> 33) % 2048) - 1024;
    return amp * (float)k / 1024.0f;
}

/* The largest |out - reference| of one shape; the reference is computed in
 * double from the same q, K and V. */
static double attention_error(struct backend *be, const struct attn_shape *sh)
{
    int hd = sh->head_dim, kv_dim = sh->n_kv_heads * hd, q_dim = sh->n_heads * hd;
    int n_rows = 0, n_ctx = 0, n_blocks = 0;
    for (int s = 0; s < sh->n_spans; s++) {
        n_rows += sh->n_tokens[s];
        n_ctx += sh->pos0[s] + sh->n_tokens[s];
        n_blocks += (sh->pos0[s] + sh->n_tokens[s] + sh->block_size - 1) / sh->block_size;
    }
    /* the spans' blocks, shuffled over the cache */
    uint32_t *ids = malloc((size_t)n_blocks * sizeof *ids);
    uint64_t rng = 12345;
    for (int i = 0; i < n_blocks; i++)
        ids[i] = (uint32_t)i;
    for (int i = n_blocks - 1; i > 0; i--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((rng >> 33) % (uint64_t)(i + 1));
        uint32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    float *k = malloc((size_t)n_ctx * kv_dim * sizeof(float));
    float *v = malloc((size_t)n_ctx * kv_dim * sizeof(float));
    float *q = malloc((size_t)n_rows * q_dim * sizeof(float));
    float *out = malloc((size_t)n_rows * q_dim * sizeof(float));
    for (size_t i = 0; i < (size_t)n_ctx * kv_dim; i++) {
        k[i] = exact_rand(&rng, 1.0f);
        v[i] = exact_rand(&rng, 1.0f);
    }
    for (size_t i = 0; i < (size_t)n_rows * q_dim; i++)
        q[i] = exact_rand(&rng, sh->q_amp);

    struct kv_cache kv = {.dtype = be->kv_dtype, .n_layers = 1, .n_blocks = n_blocks,
                          .block_size = sh->block_size, .n_kv_heads = sh->n_kv_heads,
                          .head_dim = hd};
    size_t cache_bytes = (size_t)n_blocks * sh->block_size * kv_dim * dtype_size(be->kv_dtype);
    kv.k = be->ops->alloc(be, cache_bytes);
    kv.v = be->ops->alloc(be, cache_bytes);
    float *dk = be->ops->alloc(be, (size_t)n_ctx * kv_dim * sizeof(float));
    float *dv = be->ops->alloc(be, (size_t)n_ctx * kv_dim * sizeof(float));
    float *dq = be->ops->alloc(be, (size_t)n_rows * q_dim * sizeof(float));
    float *dout = be->ops->alloc(be, (size_t)n_rows * q_dim * sizeof(float));
    cr_assert(kv.k && kv.v && dk && dv && dq && dout);
    be->ops->to_device(be, dk, k, (size_t)n_ctx * kv_dim * sizeof(float));
    be->ops->to_device(be, dv, v, (size_t)n_ctx * kv_dim * sizeof(float));
    be->ops->to_device(be, dq, q, (size_t)n_rows * q_dim * sizeof(float));

    /* every span's whole context into the cache, then its new rows' queries */
    struct attn_span store[ATTN_MAX_SPANS], spans[ATTN_MAX_SPANS];
    int row = 0, ctx_row = 0, block = 0;
    for (int s = 0; s < sh->n_spans; s++) {
        int ctx = sh->pos0[s] + sh->n_tokens[s];
        int nb = (ctx + sh->block_size - 1) / sh->block_size;
        store[s] = (struct attn_span){ctx_row, ctx, 0, ids + block, nb};
        spans[s] = (struct attn_span){row, sh->n_tokens[s], sh->pos0[s], ids + block, nb};
        row += sh->n_tokens[s];
        ctx_row += ctx;
        block += nb;
    }
    float scale = 1.0f / sqrtf((float)hd);
    be->ops->kv_store(be, &kv, 0, dk, dv, store, sh->n_spans);
    be->ops->attention(be, dq, &kv, 0, spans, sh->n_spans, sh->n_heads, scale, sh->window, dout);
    be->ops->to_host(be, out, dout, (size_t)n_rows * q_dim * sizeof(float));
    struct err err = {0};
    cr_assert_eq(be->ops->status(be, &err), 0, "%s", err.msg);

    double worst = 0;
    double *w = malloc((size_t)n_ctx * sizeof *w), *acc = malloc((size_t)hd * sizeof *acc);
    for (int s = 0; s < sh->n_spans; s++) {
        const float *ks = k + (size_t)store[s].row0 * kv_dim, *vs = v + (size_t)store[s].row0 * kv_dim;
        for (int i = 0; i < sh->n_tokens[s]; i++) {
            int pos = sh->pos0[s] + i;
            int first = sh->window > 0 && pos - sh->window + 1 > 0 ? pos - sh->window + 1 : 0;
            for (int h = 0; h < sh->n_heads; h++) {
                const float *qh = q + (size_t)(spans[s].row0 + i) * q_dim + (size_t)h * hd;
                size_t kvh = (size_t)(h / (sh->n_heads / sh->n_kv_heads)) * hd;
                double m = -INFINITY, l = 0;
                for (int p = first; p <= pos; p++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)qh[d] * ks[(size_t)p * kv_dim + kvh + d];
                    w[p] = dot * scale;
                    m = fmax(m, w[p]);
                }
                for (int d = 0; d < hd; d++)
                    acc[d] = 0;
                for (int p = first; p <= pos; p++) {
                    double e = exp(w[p] - m);
                    l += e;
                    for (int d = 0; d < hd; d++)
                        acc[d] += e * vs[(size_t)p * kv_dim + kvh + d];
                }
                const float *o = out + (size_t)(spans[s].row0 + i) * q_dim + (size_t)h * hd;
                for (int d = 0; d < hd; d++) {
                    double err_d = fabs(acc[d] / l - o[d]);
                    if (!(err_d <= worst)) /* NaN counts as the worst */
                        worst = isnan(err_d) ? INFINITY : err_d;
                }
            }
        }
    }
    free(w);
    free(acc);
    be->ops->release(be, kv.k);
    be->ops->release(be, kv.v);
    be->ops->release(be, dk);
    be->ops->release(be, dv);
    be->ops->release(be, dq);
    be->ops->release(be, dout);
    free(ids);
    free(k);
    free(v);
    free(q);
    free(out);
    return worst;
}

/* Spans not multiples of a 64-position tile, chunked (pos0 > 0), several in
 * one call (one of a single token), GQA groups 1 / 4 / 8, block sizes 1 to
 * 256, sliding windows, long enough for many 128-position tiles: every
 * output within fp16 rounding of the exact result (the fast-mode kernels
 * round q, K, V and the softmax weights to fp16; the outputs are means of
 * values in [-1, 1]). */
static void check_fast_prefill_shapes(const char *kernel)
{
    static const struct attn_shape shapes[] = {
        {128, 8, 8, 16, 0, 1, {600}, {0}, 2.0f},
        {64, 16, 4, 16, 0, 2, {77, 200}, {300, 45}, 3.0f},
        {128, 16, 2, 7, 0, 3, {130, 1, 63}, {513, 40, 0}, 3.0f},
        {64, 8, 1, 16, 100, 1, {333}, {250}, 3.0f},
        {128, 8, 2, 256, 37, 2, {250, 129}, {0, 90}, 4.0f},
        {128, 4, 4, 1, 0, 1, {65}, {700}, 4.0f},
        {64, 32, 8, 16, 0, 1, {511}, {1024}, 2.0f},
        {128, 16, 4, 16, 0, 2, {700, 200}, {333, 1700}, 3.0f},
        {128, 8, 2, 32, 300, 1, {900}, {129}, 3.0f},
    };
    struct err err = {0};
    struct backend *be = NULL;
    cr_assert_eq(cuda_backend(COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const struct attn_shape *sh = &shapes[i];
        double worst = attention_error(be, sh);
        cr_log_info("cuda prefill attention (%s), head_dim %d, %d/%d heads, block %d, window %d, "
                    "%d span(s) (%d at %d, ...): max |error| %.2e",
                    kernel, sh->head_dim, sh->n_heads, sh->n_kv_heads, sh->block_size, sh->window,
                    sh->n_spans, sh->n_tokens[0], sh->pos0[0], worst);
        cr_expect_leq(worst, 5e-3, "%s, shape %zu: max |error| %.3e", kernel, i, worst);
    }
    backend_destroy(be);
}

/* The warp-group kernel where the GPU runs sm_90a code (the mma.sync one
 * elsewhere), then the mma.sync kernel everywhere. */
Test(cuda_attention, fast_prefill_matches_f64_reference_on_varlen_gqa_and_window_shapes,
     .timeout = 300)
{
    skip_without_gpu();
    check_fast_prefill_shapes("default");
    cuda_options.cuda_prefill_wgmma = BACKEND_OFF;
    check_fast_prefill_shapes("mma.sync");
    cuda_options.cuda_prefill_wgmma = BACKEND_DEFAULT;
}

/* A decode attention shape of these tests: n_spans sequences of `tokens`
 * tokens each, at positions spread over the second half of ctx. */
struct decode_kind {
    int head_dim, n_heads, n_kv_heads, block_size, window, n_spans, tokens, ctx;
};

/* The largest |out - reference| of decode shape k, logged. */
static double decode_kind_error(struct backend *be, const struct decode_kind *k, const char *path)
{
    struct attn_shape sh = {k->head_dim, k->n_heads, k->n_kv_heads, k->block_size, k->window,
                            k->n_spans, {0}, {0}, 3.0f};
    for (int s = 0; s < sh.n_spans; s++) {
        sh.n_tokens[s] = k->tokens;
        sh.pos0[s] = k->ctx / 2 + (s * 97) % (k->ctx / 2);
    }
    double worst = attention_error(be, &sh);
    cr_log_info("cuda decode attention (%s), head_dim %d, %d/%d heads, block %d, window %d, "
                "%d sequences of %d token(s) near %d: max |error| %.2e",
                path, sh.head_dim, sh.n_heads, sh.n_kv_heads, sh.block_size, sh.window,
                sh.n_spans, k->tokens, k->ctx, worst);
    return worst;
}

/* Decode steps of many sequences (more than CU_GEMV_MAX_ROWS rows: the
 * tensor-core decode kernel in fast mode, the flash-decoding one with
 * cuda_decode_tc off), one or two tokens a sequence at spread-out positions,
 * GQA groups 1 to 16, head dims 64 and 128, block sizes 1 to 256, sliding
 * windows, and contexts long enough that a row's positions are split and
 * merged: every output within fp16 rounding of the exact result. */
Test(cuda_attention, fast_decode_of_many_sequences_matches_f64_reference, .timeout = 300)
{
    skip_without_gpu();
    static const struct decode_kind kinds[] = {
        {128, 32, 8, 16, 0, 40, 1, 700},  /* 8B's heads: one split a row */
        {128, 32, 8, 16, 0, 12, 1, 3000}, /* few rows, long contexts: split and merged */
        {64, 16, 1, 7, 0, 20, 1, 300},    /* a group of 16, blocks not a power of two */
        {128, 24, 2, 256, 37, 16, 1, 500}, /* a group of 12, a sliding window */
        {64, 8, 8, 1, 0, 10, 2, 200},     /* no grouping, two tokens a sequence */
        {128, 16, 4, 16, 100, 9, 1, 5000}, /* a window inside split contexts */
    };
    struct err err = {0};
    for (int tc = 0; tc < 2; tc++) {
        cuda_options.cuda_decode_tc = tc ? BACKEND_ON : BACKEND_OFF;
        struct backend *be = NULL;
        cr_assert_eq(cuda_backend(COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
        const char *path = tc ? "tensor cores" : "flash-decoding";
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            double worst = decode_kind_error(be, &kinds[i], path);
            cr_expect_leq(worst, 5e-3, "%s, kind %zu: max |error| %.3e", path, i, worst);
        }
        backend_destroy(be);
    }
}

/* Decode steps of one to eight sequences (the flash-decoding kernel): short
 * contexts on the narrow kernel (a block per query head, one-pass tiles,
 * their splits merged), long ones on the wide kernel, head dims 64, 128 and
 * 256, groups 1 to 12, sliding windows: every output within fp16 rounding of
 * the exact result. */
Test(cuda_attention, fast_decode_of_a_few_sequences_matches_f64_reference, .timeout = 300)
{
    skip_without_gpu();
    static const struct decode_kind kinds[] = {
        {128, 32, 8, 16, 0, 1, 1, 150},    /* 8B's heads, one sequence */
        {64, 32, 8, 16, 0, 4, 1, 600},     /* 1B's heads */
        {256, 8, 4, 16, 0, 2, 1, 300},     /* head dim 256 */
        {128, 16, 8, 16, 0, 8, 1, 1000},   /* eight sequences, a group of 2 */
        {128, 24, 2, 256, 37, 3, 1, 500},  /* a group of 12, a sliding window */
        {128, 16, 4, 16, 100, 2, 1, 1500}, /* a window across splits */
        {64, 8, 8, 1, 0, 3, 2, 200},       /* no grouping, two tokens a sequence */
        {128, 32, 8, 16, 0, 2, 1, 6000},   /* long contexts: the wide kernel */
    };
    struct err err = {0};
    struct backend *be = NULL;
    cr_assert_eq(cuda_backend(COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        double worst = decode_kind_error(be, &kinds[i], "flash-decoding");
        cr_expect_leq(worst, 5e-3, "kind %zu: max |error| %.3e", i, worst);
    }
    backend_destroy(be);
}

/* RMSNorm then a bf16 matmul of 1..8 rows (the decode path: the norm is
 * folded into the GEMV, x staged in shared memory) at hidden sizes whose x
 * is at, under and over the default 48 KB of shared memory, against the CPU
 * backend in exact mode (where the fold is off unless asked for, as here). */
Test(cuda_gemv, folded_rmsnorm_gemv_matches_cpu_for_1_to_8_rows_at_real_hidden_sizes,
     .timeout = 300)
{
    skip_without_gpu();
    static const int hidden[] = {1024, 3072, 4096, 14336};
    const int out_rows = 96;
    struct err err = {0};
    struct backend *cpu = NULL, *gpu = NULL;
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &cpu, &err), 0, "%s",
                 err.msg);
    cuda_options.cuda_norm_fusion = BACKEND_ON;
    cr_assert_eq(cuda_backend(COMPUTE_EXACT, &gpu, &err), 0, "%s", err.msg);
    cuda_options.cuda_norm_fusion = BACKEND_DEFAULT;
    uint64_t state = 7;
    for (size_t h = 0; h < sizeof hidden / sizeof hidden[0]; h++) {
        int cols = hidden[h];
        uint16_t *w = malloc((size_t)out_rows * cols * sizeof *w);
        float *x = malloc((size_t)8 * cols * sizeof *x), *nw = malloc((size_t)cols * sizeof *nw);
        float *want = malloc((size_t)8 * out_rows * sizeof *want);
        float *got = malloc((size_t)8 * out_rows * sizeof *got);
        cr_assert(w && x && nw && want && got);
        for (size_t i = 0; i < (size_t)out_rows * cols; i++)
            w[i] = f32_to_bf16(exact_rand(&state, 0.5f));
        for (int i = 0; i < 8 * cols; i++)
            x[i] = exact_rand(&state, 2.0f);
        for (int i = 0; i < cols; i++)
            nw[i] = 1.0f + exact_rand(&state, 0.25f);
        for (int rows = 1; rows <= 8; rows++) {
            struct backend *bes[2] = {cpu, gpu};
            float *outs[2] = {want, got};
            for (int b = 0; b < 2; b++) {
                struct backend *be = bes[b];
                size_t xb = (size_t)rows * cols * sizeof(float), yb = (size_t)rows * out_rows * sizeof(float);
                void *dw = be->ops->alloc(be, (size_t)out_rows * cols * 2);
                float *dx = be->ops->alloc(be, xb), *dn = be->ops->alloc(be, xb);
                float *dnw = be->ops->alloc(be, (size_t)cols * sizeof(float));
                float *dy = be->ops->alloc(be, yb);
                cr_assert(dw && dx && dn && dnw && dy);
                be->ops->to_device(be, dw, w, (size_t)out_rows * cols * 2);
                be->ops->to_device(be, dx, x, xb);
                be->ops->to_device(be, dnw, nw, (size_t)cols * sizeof(float));
                struct weight_matrix wm = {DTYPE_BF16, out_rows, cols, dw};
                be->ops->rmsnorm(be, dx, dnw, rows, cols, 1e-6f, dn);
                be->ops->matmul(be, dn, rows, &wm, NULL, dy);
                be->ops->to_host(be, outs[b], dy, yb);
                cr_assert_eq(be->ops->status ? be->ops->status(be, &err) : 0, 0,
                             "hidden %d, %d rows: %s", cols, rows, err.msg);
                be->ops->release(be, dw);
                be->ops->release(be, dx);
                be->ops->release(be, dn);
                be->ops->release(be, dnw);
                be->ops->release(be, dy);
            }
            double worst = 0, scale = 0;
            for (int i = 0; i < rows * out_rows; i++) {
                worst = fmax(worst, fabs((double)want[i] - got[i]));
                scale = fmax(scale, fabs((double)want[i]));
            }
            cr_expect_leq(worst, 1e-4 * scale, "hidden %d, %d rows: max |error| %.3e of %.3e",
                          cols, rows, worst, scale);
        }
        free(w);
        free(x);
        free(nw);
        free(want);
        free(got);
    }
    backend_destroy(gpu);
    backend_destroy(cpu);
}

/* y = x w^T on be for n rows of x, f32 weights of rows x cols. */
static void matmul_f32_on(struct backend *be, const float *w, int rows, int cols, const float *x,
                          int n, float *y)
{
    struct err err = {0};
    size_t wb = (size_t)rows * cols * sizeof(float), xb = (size_t)n * cols * sizeof(float);
    size_t yb = (size_t)n * rows * sizeof(float);
    void *dw = be->ops->alloc(be, wb);
    float *dx = be->ops->alloc(be, xb), *dy = be->ops->alloc(be, yb);
    cr_assert(dw && dx && dy);
    be->ops->to_device(be, dw, w, wb);
    be->ops->to_device(be, dx, x, xb);
    struct weight_matrix wm = {DTYPE_F32, rows, cols, dw};
    be->ops->matmul(be, dx, n, &wm, NULL, dy);
    be->ops->to_host(be, y, dy, yb);
    cr_assert_eq(be->ops->status ? be->ops->status(be, &err) : 0, 0, "%d x %d, %d rows: %s", rows,
                 cols, n, err.msg);
    be->ops->release(be, dw);
    be->ops->release(be, dx);
    be->ops->release(be, dy);
}

/* f32 weights (Whisper's; 16-byte loads, split-K chosen from the matrix's
 * shape) in EXACT mode: every row of a many-row matmul has the bits of that
 * row alone (batch invariance), and each output is the f64 dot product
 * within f32 rounding of sum |w x|. Shapes cover a decoder step's matrices,
 * a tall head and a row length that is not a multiple of 8 (element loads). */
Test(cuda_gemv, f32_weights_in_exact_mode_are_batch_invariant_and_match_f64, .timeout = 300)
{
    skip_without_gpu();
    static const int shapes[][2] = {{512, 512}, {2048, 512}, {512, 2048}, {5003, 512}, {37, 1000}};
    static const int batches[] = {2, 5, 8, 9, 24};
    const int max_n = 24;
    struct err err = {0};
    struct backend *gpu = NULL;
    cr_assert_eq(cuda_backend(COMPUTE_EXACT, &gpu, &err), 0, "%s", err.msg);
    uint64_t state = 11;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        int rows = shapes[sh][0], cols = shapes[sh][1];
        float *w = malloc((size_t)rows * cols * sizeof *w);
        float *x = malloc((size_t)max_n * cols * sizeof *x);
        float *alone = malloc((size_t)max_n * rows * sizeof *alone);
        float *many = malloc((size_t)max_n * rows * sizeof *many);
        cr_assert(w && x && alone && many);
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            w[i] = exact_rand(&state, 0.5f) + exact_rand(&state, 1.0f) * 0x1p-12f;
        for (int i = 0; i < max_n * cols; i++)
            x[i] = exact_rand(&state, 2.0f);
        for (int t = 0; t < max_n; t++)
            matmul_f32_on(gpu, w, rows, cols, x + (size_t)t * cols, 1, alone + (size_t)t * rows);
        double worst = 0;
        for (int t = 0; t < max_n; t++)
            for (int r = 0; r < rows; r++) {
                double dot = 0, mag = 0;
                for (int c = 0; c < cols; c++) {
                    double p = (double)w[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                    dot += p;
                    mag += fabs(p);
                }
                worst = fmax(worst, fabs(alone[(size_t)t * rows + r] - dot) / (mag + 1e-30));
            }
        cr_expect_leq(worst, (double)cols * 0x1p-24, "%d x %d: error %.3e of sum |w x|", rows,
                      cols, worst);
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            int n = batches[b];
            matmul_f32_on(gpu, w, rows, cols, x, n, many);
            cr_expect_eq(memcmp(many, alone, (size_t)n * rows * sizeof *many), 0,
                         "%d x %d, %d rows: not the bits of each row alone", rows, cols, n);
        }
        free(w);
        free(x);
        free(alone);
        free(many);
    }
    backend_destroy(gpu);
}

/* One skinny-GEMM case on be (FAST mode): n_mat matrices of rows x cols
 * (bf16 w, f32 bias when given) over n token rows of x, through matmul or
 * matmul_group, then the epilogue the planner folds in: none, the SwiGLU
 * pair (silu_mul into y[0]) or the residual add (res += y[0]). out gets
 * y[0] (after the SwiGLU) and, for the residual, res. */
enum skinny_epilogue { SKINNY_PLAIN, SKINNY_SWIGLU, SKINNY_RESIDUAL };

static void skinny_on(struct backend *be, int n_mat, int rows, int cols, const uint16_t *w,
                      const float *bias, const float *x, int n, enum skinny_epilogue ep,
                      const float *res0, float *out, float *res_out)
{
    struct err err = {0};
    size_t wb = (size_t)rows * cols * 2, xb = (size_t)n * cols * sizeof(float);
    size_t yb = (size_t)n * rows * sizeof(float);
    void *dw[3];
    float *db[3], *dy[3];
    struct weight_matrix wm[3];
    const struct weight_matrix *wp[3];
    float *dx = be->ops->alloc(be, xb), *dres = be->ops->alloc(be, yb);
    cr_assert(dx && dres);
    for (int i = 0; i < n_mat; i++) {
        dw[i] = be->ops->alloc(be, wb);
        db[i] = bias ? be->ops->alloc(be, (size_t)rows * sizeof(float)) : NULL;
        dy[i] = be->ops->alloc(be, yb);
        cr_assert(dw[i] && dy[i] && (!bias || db[i]));
        be->ops->to_device(be, dw[i], w + (size_t)i * rows * cols, wb);
        if (bias)
            be->ops->to_device(be, db[i], bias + (size_t)i * rows, (size_t)rows * sizeof(float));
        wm[i] = (struct weight_matrix){DTYPE_BF16, rows, cols, dw[i]};
        wp[i] = &wm[i];
    }
    be->ops->to_device(be, dx, x, xb);
    be->ops->to_device(be, dres, res0, yb);
    if (n_mat == 1)
        be->ops->matmul(be, dx, n, &wm[0], bias ? db[0] : NULL, dy[0]);
    else
        be->ops->matmul_group(be, dx, n, n_mat, wp, bias ? (const float *const *)db : NULL,
                              (float *const *)dy);
    if (ep == SKINNY_SWIGLU)
        be->ops->silu_mul(be, dy[0], dy[1], dy[0], (int64_t)n * rows);
    if (ep == SKINNY_RESIDUAL)
        be->ops->add(be, dres, dy[0], (int64_t)n * rows);
    for (int i = 0; i < n_mat; i++)
        be->ops->to_host(be, out + (size_t)i * n * rows, dy[i], yb);
    be->ops->to_host(be, res_out, dres, yb);
    cr_assert_eq(be->ops->status ? be->ops->status(be, &err) : 0, 0, "%d x %d, %d rows: %s", rows,
                 cols, n, err.msg);
    for (int i = 0; i < n_mat; i++) {
        be->ops->release(be, dw[i]);
        if (db[i])
            be->ops->release(be, db[i]);
        be->ops->release(be, dy[i]);
    }
    be->ops->release(be, dx);
    be->ops->release(be, dres);
}

/* FAST-mode bf16 matmuls of 3..8 rows (a batched decode or verify step) run
 * on the tensor-core skinny GEMM, of 9..64 rows on the batched tile GEMM
 * (split-K at most shapes), and where those are off, of 9..128 rows on the
 * warp-group GEMM of the cuBLASLt path (sm_90a GPUs): each output is the f64
 * dot product of bf16-rounded x and the weights within f32 accumulation's
 * rounding of sum |w x|, with bias, the q/k/v group, the SwiGLU pair and the
 * residual add folded in, the same bits on a second run; and with every one
 * switched off (cuBLASLt) the same within the same bound. Shapes: a tile of
 * rows cut short (37), rows not a multiple of 32 long (200), a decode step's
 * 4,096 and 14,336, a tall head. */
Test(cuda_gemv, fast_tensor_core_gemms_of_3_to_128_rows_match_f64_with_their_epilogues,
     .timeout = 600)
{
    skip_without_gpu();
    static const struct {
        int n_mat, rows, cols;
        enum skinny_epilogue ep;
        bool bias;
    } cases[] = {
        {1, 37, 200, SKINNY_PLAIN, true},   {3, 96, 256, SKINNY_PLAIN, true},
        {2, 304, 200, SKINNY_SWIGLU, false}, {1, 200, 304, SKINNY_RESIDUAL, false},
        {1, 512, 4096, SKINNY_RESIDUAL, false}, {2, 256, 4096, SKINNY_SWIGLU, false},
        {1, 256, 14336, SKINNY_PLAIN, false}, {1, 5000, 512, SKINNY_PLAIN, false},
    };
    static const int batches[] = {3, 5, 8, 9, 16, 33, 64, 65, 96, 128};
    static const char *const names[] = {"skinny / batched tile / warp-group GEMM",
                                        "warp-group GEMM", "cuBLASLt"};
    const int max_n = 128;
    struct err err = {0};
    struct backend *gpu[3] = {NULL, NULL, NULL};
    cuda_options.cuda_batch_gemm = BACKEND_ON;
    cuda_options.cuda_wgmma_gemm = BACKEND_ON;
    cr_assert_eq(cuda_backend(COMPUTE_FAST, &gpu[0], &err), 0, "%s", err.msg);
    cuda_options.cuda_skinny_gemm = BACKEND_OFF;
    cuda_options.cuda_batch_gemm = BACKEND_OFF;
    cr_assert_eq(cuda_backend(COMPUTE_FAST, &gpu[1], &err), 0, "%s", err.msg);
    cuda_options.cuda_wgmma_gemm = BACKEND_OFF;
    cr_assert_eq(cuda_backend(COMPUTE_FAST, &gpu[2], &err), 0, "%s", err.msg);
    cuda_options.cuda_skinny_gemm = BACKEND_DEFAULT;
    cuda_options.cuda_batch_gemm = BACKEND_DEFAULT;
    cuda_options.cuda_wgmma_gemm = BACKEND_DEFAULT;
    uint64_t state = 13;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n_mat = cases[ci].n_mat, rows = cases[ci].rows, cols = cases[ci].cols;
        size_t wn = (size_t)n_mat * rows * cols, yn = (size_t)max_n * rows;
        uint16_t *w = malloc(wn * sizeof *w);
        float *bias = malloc((size_t)n_mat * rows * sizeof *bias);
        float *x = malloc((size_t)max_n * cols * sizeof *x), *res0 = malloc(yn * sizeof *res0);
        float *out = malloc(n_mat * yn * sizeof *out), *res = malloc(yn * sizeof *res);
        float *again = malloc(n_mat * yn * sizeof *again);
        double *dot = malloc(n_mat * yn * sizeof *dot), *mag = malloc(n_mat * yn * sizeof *mag);
        cr_assert(w && bias && x && res0 && out && res && again && dot && mag);
        for (size_t i = 0; i < wn; i++)
            w[i] = f32_to_bf16(exact_rand(&state, 0.5f));
        for (int i = 0; i < n_mat * rows; i++)
            bias[i] = exact_rand(&state, 1.0f);
        for (int i = 0; i < max_n * cols; i++)
            x[i] = exact_rand(&state, 2.0f);
        for (size_t i = 0; i < yn; i++)
            res0[i] = exact_rand(&state, 1.0f);
        for (int t = 0; t < max_n; t++)
            for (int m = 0; m < n_mat; m++)
                for (int r = 0; r < rows; r++) {
                    double d = cases[ci].bias ? bias[m * rows + r] : 0, a = fabs(d);
                    for (int c = 0; c < cols; c++) {
                        double p = (double)bf16_to_f32(w[((size_t)m * rows + r) * cols + c]) *
                                   bf16_to_f32(f32_to_bf16(x[(size_t)t * cols + c]));
                        d += p;
                        a += fabs(p);
                    }
                    dot[((size_t)m * max_n + t) * rows + r] = d;
                    mag[((size_t)m * max_n + t) * rows + r] = a;
                }
        for (int g = 0; g < 3; g++)
            for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
                int n = batches[b];
                skinny_on(gpu[g], n_mat, rows, cols, w, cases[ci].bias ? bias : NULL, x, n,
                          cases[ci].ep, res0, out, res);
                if (g < 2) {
                    /* a tile's column parts are added in warp (or split) order: the same bits again */
                    skinny_on(gpu[g], n_mat, rows, cols, w, cases[ci].bias ? bias : NULL, x, n,
                              cases[ci].ep, res0, again, res);
                    cr_expect_eq(memcmp(again, out, n_mat * (size_t)n * rows * sizeof *out), 0,
                                 "case %zu, %d rows: a second run gave other bits", ci, n);
                }
                double worst = 0;
                for (int t = 0; t < n; t++)
                    for (int r = 0; r < rows; r++) {
                        size_t i = (size_t)t * rows + r;
                        double want = dot[i], bound = mag[i];
                        float got = out[i];
                        if (cases[ci].ep == SKINNY_SWIGLU) {
                            /* y0 = silu(gate) up: the gate's and the up's errors, through silu */
                            double gate = dot[i], up = dot[(size_t)max_n * rows + i];
                            want = gate / (1 + exp(-gate)) * up;
                            bound = 1.2 * (fabs(up) * mag[i] +
                                           fabs(gate) * mag[(size_t)max_n * rows + i]) +
                                    fabs(want) * 1e-6;
                        } else if (cases[ci].ep == SKINNY_RESIDUAL) {
                            cr_expect_eq(res[i], res0[i] + out[i],
                                         "case %zu, %d rows: res is not res + y at %zu", ci, n, i);
                        }
                        worst = fmax(worst, fabs(got - want) / (bound + 1e-30));
                    }
                for (int m = 1; m < n_mat && cases[ci].ep == SKINNY_PLAIN; m++)
                    for (int t = 0; t < n; t++)
                        for (int r = 0; r < rows; r++) {
                            size_t i = ((size_t)m * max_n + t) * rows + r;
                            float got = out[(size_t)m * n * rows + (size_t)t * rows + r];
                            worst = fmax(worst, fabs(got - dot[i]) / (mag[i] + 1e-30));
                        }
                cr_expect_leq(worst, (double)cols * 0x1p-24,
                              "%s, case %zu (%d x %d x %d), %d rows: error %.3e of sum |w x|",
                              names[g], ci, n_mat, rows, cols, n, worst);
            }
        free(w);
        free(bias);
        free(x);
        free(res0);
        free(out);
        free(res);
        free(again);
        free(dot);
        free(mag);
    }
    for (int g = 0; g < 3; g++)
        backend_destroy(gpu[g]);
}

/* One residual add, the RMSNorm of the sum and a matmul of its rows (12 rows: the cuBLASLt
 * path) through backend ops at a real hidden size, the block RMSNorm kernel's; res, h and y
 * come back. */
static void add_norm_matmul_on(struct backend *be, const float *x, const float *res0,
                               const float *norm_w, const uint16_t *w, int rows, int cols,
                               int n, float *res, float *h, float *y)
{
    struct err err = {0};
    size_t xb = (size_t)n * cols * sizeof(float), yb = (size_t)n * rows * sizeof(float);
    float *dx = be->ops->alloc(be, xb), *dres = be->ops->alloc(be, xb), *dh = be->ops->alloc(be, xb);
    float *dnw = be->ops->alloc(be, (size_t)cols * sizeof(float)), *dy = be->ops->alloc(be, yb);
    void *dw = be->ops->alloc(be, (size_t)rows * cols * 2);
    cr_assert(dx && dres && dh && dnw && dy && dw);
    be->ops->to_device(be, dx, x, xb);
    be->ops->to_device(be, dres, res0, xb);
    be->ops->to_device(be, dnw, norm_w, (size_t)cols * sizeof(float));
    be->ops->to_device(be, dw, w, (size_t)rows * cols * 2);
    struct weight_matrix wm = {DTYPE_BF16, rows, cols, dw};
    be->ops->add(be, dres, dx, (int64_t)n * cols);
    be->ops->rmsnorm(be, dres, dnw, n, cols, 1e-5f, dh);
    be->ops->matmul(be, dh, n, &wm, NULL, dy);
    be->ops->to_host(be, res, dres, xb);
    be->ops->to_host(be, h, dh, xb);
    be->ops->to_host(be, y, dy, yb);
    cr_assert_eq(be->ops->status ? be->ops->status(be, &err) : 0, 0, "%s", err.msg);
    void *bufs[] = {dx, dres, dh, dnw, dy, dw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->ops->release(be, bufs[i]);
}

/* Rules 4 and 6 at 4,096 columns (the block RMSNorm kernel; the goldens' tiny models take the
 * warp kernel): the fused launches give the unfused ones' bits in the sum, the norm and the
 * GEMM's output. */
Test(cuda_fusion, add_rmsnorm_and_bf16_x_at_a_real_hidden_size_equal_unfused_launches,
     .timeout = 120)
{
    skip_without_gpu();
    const int rows = 1024, cols = 4096, n = 12;
    size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
    float *x = malloc(nx * sizeof *x), *res0 = malloc(nx * sizeof *res0);
    float *norm_w = malloc((size_t)cols * sizeof *norm_w);
    uint16_t *w = malloc((size_t)rows * cols * sizeof *w);
    float *out[2][3];
    for (int k = 0; k < 2; k++) {
        out[k][0] = malloc(nx * sizeof(float));
        out[k][1] = malloc(nx * sizeof(float));
        out[k][2] = malloc(ny * sizeof(float));
        cr_assert(out[k][0] && out[k][1] && out[k][2]);
    }
    cr_assert(x && res0 && norm_w && w);
    uint64_t state = 29;
    for (size_t i = 0; i < nx; i++) {
        x[i] = exact_rand(&state, 2.0f);
        res0[i] = exact_rand(&state, 1.0f);
    }
    for (int i = 0; i < cols; i++)
        norm_w[i] = exact_rand(&state, 1.0f);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = f32_to_bf16(exact_rand(&state, 0.5f));
    for (int k = 0; k < 2; k++) {
        struct backend *be = NULL;
        struct err err = {0};
        cuda_options.cuda_add_norm_fusion = k ? BACKEND_OFF : BACKEND_ON;
        cuda_options.cuda_gemm_x_fusion = k ? BACKEND_OFF : BACKEND_ON;
        cr_assert_eq(cuda_backend(COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
        add_norm_matmul_on(be, x, res0, norm_w, w, rows, cols, n, out[k][0], out[k][1], out[k][2]);
        backend_destroy(be);
    }
    cuda_options.cuda_add_norm_fusion = BACKEND_DEFAULT;
    cuda_options.cuda_gemm_x_fusion = BACKEND_DEFAULT;
    static const char *const names[3] = {"the sum", "the norm", "the GEMM's output"};
    for (int j = 0; j < 3; j++)
        cr_expect_eq(memcmp(out[0][j], out[1][j], (j == 2 ? ny : nx) * sizeof(float)), 0,
                     "%s differs between the fused and the unfused launches", names[j]);
    for (size_t i = 0; i < nx; i++)
        cr_assert_eq(out[1][0][i], res0[i] + x[i], "the sum at %zu", i);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++)
            free(out[k][j]);
    free(x);
    free(res0);
    free(norm_w);
    free(w);
}

/* A matmul adding into the residual stream, the RMSNorm of the sum and a matmul of its rows,
 * through backend ops (n rows: the skinny GEMM); res and the last output come back. */
static void residual_norm_matmul_on(struct backend *be, const float *x, const uint16_t *w1,
                                    int in, const float *res0, const float *norm_w,
                                    const uint16_t *w2, int out, int hidden, int n, float *res,
                                    float *y)
{
    struct err err = {0};
    size_t xb = (size_t)n * in * sizeof(float), hb = (size_t)n * hidden * sizeof(float);
    size_t yb = (size_t)n * out * sizeof(float);
    float *dx = be->ops->alloc(be, xb), *dy1 = be->ops->alloc(be, hb);
    float *dres = be->ops->alloc(be, hb), *dh = be->ops->alloc(be, hb);
    float *dnw = be->ops->alloc(be, (size_t)hidden * sizeof(float)), *dy = be->ops->alloc(be, yb);
    void *dw1 = be->ops->alloc(be, (size_t)hidden * in * 2);
    void *dw2 = be->ops->alloc(be, (size_t)out * hidden * 2);
    cr_assert(dx && dy1 && dres && dh && dnw && dy && dw1 && dw2);
    be->ops->to_device(be, dx, x, xb);
    be->ops->to_device(be, dres, res0, hb);
    be->ops->to_device(be, dnw, norm_w, (size_t)hidden * sizeof(float));
    be->ops->to_device(be, dw1, w1, (size_t)hidden * in * 2);
    be->ops->to_device(be, dw2, w2, (size_t)out * hidden * 2);
    struct weight_matrix m1 = {DTYPE_BF16, hidden, in, dw1}, m2 = {DTYPE_BF16, out, hidden, dw2};
    be->ops->matmul(be, dx, n, &m1, NULL, dy1);
    be->ops->add(be, dres, dy1, (int64_t)n * hidden);
    be->ops->rmsnorm(be, dres, dnw, n, hidden, 1e-5f, dh);
    be->ops->matmul(be, dh, n, &m2, NULL, dy);
    be->ops->to_host(be, res, dres, hb);
    be->ops->to_host(be, y, dy, yb);
    cr_assert_eq(be->ops->status ? be->ops->status(be, &err) : 0, 0, "%s", err.msg);
    void *bufs[] = {dx, dy1, dres, dh, dnw, dy, dw1, dw2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->ops->release(be, bufs[i]);
}

/* Rule 9 at real hidden sizes and one whose last tile is short, 3, 5 and 8 rows: the residual
 * stream is the launched norm's bits, and the output is inv Σ W bf16(res w) (x times the
 * norm weight rounded to bf16 as the GEMM reads it, the row's inverse RMS applied after)
 * within the accumulation's rounding of the f64 value, inv from the stream in f64; the
 * launched norm's output agrees within bf16 rounding of x. */
Test(cuda_fusion, rmsnorm_folded_from_skinny_sums_matches_its_launch_at_real_hidden_sizes,
     .timeout = 120)
{
    skip_without_gpu();
    static const int hiddens[] = {4096, 200}, rows_of[] = {3, 5, 8};
    const int in = 256, out = 512, max_n = 8;
    uint64_t state = 31;
    for (size_t hi = 0; hi < sizeof hiddens / sizeof hiddens[0]; hi++) {
        const int hidden = hiddens[hi];
        size_t nh = (size_t)max_n * hidden;
        float *x = malloc((size_t)max_n * in * sizeof *x), *res0 = malloc(nh * sizeof *res0);
        float *norm_w = malloc((size_t)hidden * sizeof *norm_w);
        uint16_t *w1 = malloc((size_t)hidden * in * 2), *w2 = malloc((size_t)out * hidden * 2);
        float *res[2], *y[2];
        for (int k = 0; k < 2; k++) {
            res[k] = malloc(nh * sizeof(float));
            y[k] = malloc((size_t)max_n * out * sizeof(float));
            cr_assert(res[k] && y[k]);
        }
        cr_assert(x && res0 && norm_w && w1 && w2);
        for (int i = 0; i < max_n * in; i++)
            x[i] = exact_rand(&state, 2.0f);
        for (size_t i = 0; i < nh; i++)
            res0[i] = exact_rand(&state, 1.0f);
        for (int i = 0; i < hidden; i++)
            norm_w[i] = exact_rand(&state, 1.0f);
        for (size_t i = 0; i < (size_t)hidden * in; i++)
            w1[i] = f32_to_bf16(exact_rand(&state, 0.5f));
        for (size_t i = 0; i < (size_t)out * hidden; i++)
            w2[i] = f32_to_bf16(exact_rand(&state, 0.5f));
        for (size_t ri = 0; ri < sizeof rows_of / sizeof rows_of[0]; ri++) {
            const int n = rows_of[ri];
            for (int k = 0; k < 2; k++) {
                struct backend *be = NULL;
                struct err err = {0};
                cuda_options.cuda_norm_sums = k ? BACKEND_OFF : BACKEND_ON;
                cr_assert_eq(cuda_backend(COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
                residual_norm_matmul_on(be, x, w1, in, res0, norm_w, w2, out, hidden, n, res[k],
                                        y[k]);
                backend_destroy(be);
            }
            cuda_options.cuda_norm_sums = BACKEND_DEFAULT;
            cr_expect_eq(memcmp(res[0], res[1], (size_t)n * hidden * sizeof(float)), 0,
                         "hidden %d, %d rows: the residual stream differs", hidden, n);
            double worst = 0, apart = 0;
            for (int t = 0; t < n; t++) {
                const float *r = res[1] + (size_t)t * hidden;
                double ss = 0;
                for (int c = 0; c < hidden; c++)
                    ss += (double)r[c] * r[c];
                double inv = 1.0 / sqrt(ss / hidden + 1e-5);
                for (int o = 0; o < out; o++) {
                    double want = 0, mag = 0, launched = 0;
                    for (int c = 0; c < hidden; c++) {
                        double wv = bf16_to_f32(w2[(size_t)o * hidden + c]);
                        double p = wv * bf16_to_f32(f32_to_bf16(r[c] * norm_w[c]));
                        want += p;
                        mag += fabs(p);
                        launched += fabs(wv * norm_w[c] * r[c] * inv);
                    }
                    const float *got = &y[0][(size_t)t * out + o];
                    worst = fmax(worst, fabs(*got - want * inv) / (mag * inv + 1e-30));
                    apart = fmax(apart, fabs((double)*got - y[1][(size_t)t * out + o]) /
                                            (launched * 0x1p-8 + 1e-30));
                }
            }
            cr_expect_leq(worst, (double)hidden * 0x1p-24 + 1e-6,
                          "hidden %d, %d rows: the folded norm's output is %.3g of sum |w x| "
                          "from inv sum W bf16(res w)",
                          hidden, n, worst);
            cr_expect_leq(apart, 1.0,
                          "hidden %d, %d rows: the folded and the launched norm's outputs are "
                          "%.3g bf16 roundings of sum |w x| apart",
                          hidden, n, apart);
            cr_log_info("cuda rule 9, hidden %d, %d rows: %.3g of sum |w x| from the f64 value, "
                        "%.3g bf16 roundings from the launched norm's", hidden, n, worst, apart);
        }
        for (int k = 0; k < 2; k++) {
            free(res[k]);
            free(y[k]);
        }
        free(x);
        free(res0);
        free(norm_w);
        free(w1);
        free(w2);
    }
}

/* A KV pool larger than any GPU's memory is refused with a message, not a crash. */
Test(cuda_memory, oversized_kv_pool_is_a_clear_out_of_memory_error, .timeout = 120)
{
    skip_without_gpu();
    static char paths[GOLDEN_MAX_FILES][512];
    cr_assert_gt(golden_list(paths, GOLDEN_MAX_FILES), 0);
    char *tmp = test_mkdtemp();
    struct golden g;
    cr_assert_eq(golden_load(paths[0], &g), 0);
    char dir[1024];
    golden_make_model(&g, tmp, dir, sizeof dir);
    struct err err = {0};
    struct backend *be = NULL;
    struct model *m = NULL;
    struct kv_pool *pool = NULL;
    cr_assert_eq(cuda_backend(COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    int rc = kv_pool_create(m, be, 1 << 30, 256, &pool, &err);
    cr_expect_eq(rc, -INFERD_ENOMEM, "an impossible KV pool gave %d", rc);
    cr_expect(strstr(err.msg, "out of memory") != NULL, "message: %s", err.msg);
    /* the backend still works afterwards */
    cr_assert_eq(kv_pool_create(m, be, 64, GOLDEN_BLOCK_SIZE, &pool, &err), 0, "%s", err.msg);
    kv_pool_free(pool);
    model_free(m);
    backend_destroy(be);
    golden_free(&g);
    test_rmtree(tmp);
    free(tmp);
}

Test(cuda_device, missing_gpu_number_is_refused_clearly)
{
    struct err err = {0};
    struct backend *be = NULL;
    int rc = backend_cuda_create(1000, &(struct backend_options){.mode = COMPUTE_FAST}, &be, &err);
    cr_expect_eq(rc, -INFERD_EUNSUPPORTED);
    cr_expect_null(be);
    cr_expect_neq(err.msg[0], '\0');
}
