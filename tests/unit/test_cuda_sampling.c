/* tests/unit/test_cuda_sampling.c — tokens sampled on the GPU against the host sampler: greedy
 * identical always, truncated and plain temperature sampling with penalties and logit bias the
 * same token on (nearly) every row for the same random number, logprobs within 1e-4, rows the
 * GPU hands back to the host, non-finite logits; and the engine's greedy tokens with GPU
 * sampling equal to the CPU engine's. Skipped, saying why, without a GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "golden_support.h"
#include "tools/mkmodel.h"
#include "test_support.h"
#include "text/tokenizer.h"

#define SAMPLE_BATCH 16
#define REAL_VOCAB 151936 /* Qwen3's */

static const struct backend_options cuda_fast = {.mode = COMPUTE_FAST};
static const struct backend_options cuda_exact = {.mode = COMPUTE_EXACT};
static const struct backend_options cpu_exact = {.mode = COMPUTE_EXACT, .threads = 2};

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: GPU sampling not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: GPU sampling not checked");
}

static uint64_t lcg_next(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return *st >> 11;
}

static double lcg_uniform(uint64_t *st) { return (double)lcg_next(st) * 0x1.0p-53; }

static float lcg_normal(uint64_t *st)
{
    double u1 = lcg_uniform(st) + 1e-12, u2 = lcg_uniform(st);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* A row shaped like a language model's: a normal background and a few
 * strong candidates; every fourth row flat, every third quantised to halves
 * (many exact ties). */
static void fill_row(float *x, int vocab, uint64_t *st, int index)
{
    bool flat = index % 4 == 3, ties = index % 3 == 1;
    for (int i = 0; i < vocab; i++) {
        float v = 2.0f * lcg_normal(st);
        x[i] = ties ? roundf(2.0f * v) / 2.0f : v;
    }
    if (flat)
        return;
    int strong = 1 + (int)(lcg_next(st) % 40);
    for (int k = 0; k < strong; k++) {
        float boost = 6.0f + 8.0f * (float)lcg_uniform(st);
        x[lcg_next(st) % (uint64_t)vocab] += ties ? roundf(2.0f * boost) / 2.0f : boost;
    }
}

struct sample_tally {
    long rows, same, need_host;
    double worst_logprob; /* largest |device - host| over the logprobs compared */
};

/* The host's logprobs of token against the device's, and the top lists. */
static void compare_logprobs(struct sampler *host, struct sampler *dev, int32_t token,
                             int top_n, struct sample_tally *t, const char *what, long row)
{
    struct token_logprob th[SAMPLER_MAX_TOP_LOGPROBS], td[SAMPLER_MAX_TOP_LOGPROBS];
    float lh, ld;
    int nh = sampler_logprobs(host, token, top_n, &lh, th);
    int nd = sampler_logprobs(dev, token, top_n, &ld, td);
    cr_assert_geq(nd, 0, "%s row %ld: no device logprobs for token %d", what, row, token);
    cr_assert_eq(nd, nh, "%s row %ld: %d device top logprobs, host %d", what, row, nd, nh);
    double d = isinf(lh) && lh == ld ? 0 : fabs((double)lh - ld);
    for (int k = 0; k < nh; k++) {
        cr_assert_eq(td[k].token, th[k].token,
                     "%s row %ld: top %d is %d on the device, %d on the host", what, row, k,
                     td[k].token, th[k].token);
        double dk = fabs((double)td[k].logprob - th[k].logprob);
        d = dk > d ? dk : d;
    }
    if (d > t->worst_logprob)
        t->worst_logprob = d;
}

/* n_rows rows sampled by the host sampler and by the GPU with the same
 * parameters, state and random stream. Each of SAMPLE_BATCH slots has its
 * own pair of samplers (seeded alike), so one sample call covers 16 rows;
 * both of a pair accept the host's token, which keeps them in step. With
 * history, the penalties see a random prompt and 24 generated tokens. */
static void compare_sampling(struct backend *be, const char *what, const struct sampler_params *p,
                             int logprobs, bool history, const float *given_rows, int vocab,
                             int n_rows, struct sample_tally *t)
{
    struct sampler host[SAMPLE_BATCH], dev[SAMPLE_BATCH];
    struct sample_spec specs[SAMPLE_BATCH];
    struct sample_result res[SAMPLE_BATCH];
    float *rows = malloc((size_t)SAMPLE_BATCH * vocab * sizeof(float));
    float *host_rows = malloc((size_t)SAMPLE_BATCH * vocab * sizeof(float));
    float *dev_rows = be->ops->alloc(be, (size_t)SAMPLE_BATCH * vocab * sizeof(float));
    cr_assert(rows && host_rows && dev_rows);
    uint64_t st = 0x5eed0000u + (uint64_t)vocab;
    for (int k = 0; k < SAMPLE_BATCH; k++) {
        struct sampler_params q = *p;
        q.seed = p->seed + (uint64_t)k;
        cr_assert_eq(sampler_init(&host[k], &q, vocab, NULL), 0);
        cr_assert_eq(sampler_init(&dev[k], &q, vocab, NULL), 0);
        if (history) {
            int32_t prompt[64];
            for (int i = 0; i < 64; i++)
                prompt[i] = (int32_t)(lcg_next(&st) % (uint64_t)vocab);
            sampler_observe_prompt(&host[k], prompt, 64);
            sampler_observe_prompt(&dev[k], prompt, 64);
            for (int i = 0; i < 24; i++) {
                int32_t tok = i % 3 ? prompt[i] : (int32_t)(lcg_next(&st) % (uint64_t)vocab);
                sampler_accept(&host[k], tok);
                sampler_accept(&dev[k], tok);
            }
        }
    }
    for (int r0 = 0; r0 < n_rows; r0 += SAMPLE_BATCH) {
        int n = n_rows - r0 < SAMPLE_BATCH ? n_rows - r0 : SAMPLE_BATCH;
        for (int k = 0; k < n; k++) {
            if (given_rows)
                memcpy(rows + (size_t)k * vocab, given_rows + (size_t)(r0 + k) * vocab,
                       (size_t)vocab * sizeof(float));
            else
                fill_row(rows + (size_t)k * vocab, vocab, &st, r0 + k);
            cr_assert_eq(sampler_fill_spec(&dev[k], logprobs, &specs[k]), 0);
        }
        be->ops->to_device(be, dev_rows, rows, (size_t)n * vocab * sizeof(float));
        struct err err = {0};
        cr_assert_eq(be->ops->sample(be, dev_rows, n, vocab, specs, res, host_rows, &err), 0, "%s",
                     err.msg);
        for (int k = 0; k < n; k++) {
            long row = r0 + k;
            int32_t want = sampler_pick(&host[k], rows + (size_t)k * vocab);
            int32_t got = sampler_take_result(&dev[k], &specs[k], &res[k],
                                              host_rows + (size_t)k * vocab);
            t->rows++;
            t->same += want == got;
            t->need_host += res[k].need_host != 0;
            if (want != got)
                cr_log_warn("%s row %ld: device picked %d, host %d (u %.17g)", what, row, got,
                            want, specs[k].u);
            if (logprobs >= 0 && want == got)
                compare_logprobs(&host[k], &dev[k], got, logprobs, t, what, row);
            sampler_accept(&host[k], want);
            sampler_accept(&dev[k], want);
            cr_assert_eq(dev[k].rng_state, host[k].rng_state, "%s row %ld: random streams parted",
                         what, row);
        }
    }
    for (int k = 0; k < SAMPLE_BATCH; k++) {
        sampler_free(&host[k]);
        sampler_free(&dev[k]);
    }
    be->ops->release(be, dev_rows);
    free(rows);
    free(host_rows);
}

static const struct sampler_logit_bias test_bias[] = {
    {17, 3.5f}, {17, -1.25f}, {1000, -100.0f}, {4242, 100.0f}, {99, 0.75f}, {150000, 2.0f},
};

struct sample_set {
    const char *name;
    struct sampler_params p;
    int logprobs;
    bool history;
    bool must_need_host;
};

static const struct sample_set sample_sets[] = {
    {"greedy", {.temperature = 0, .top_p = 1}, 5, false, false},
    {"temperature 0.7, top_k 20", {.temperature = 0.7f, .top_k = 20, .top_p = 1, .seed = 1}, 20,
     false, false},
    {"top_p 0.9", {.temperature = 1.0f, .top_p = 0.9f, .seed = 2}, 0, false, false},
    {"min_p 0.05", {.temperature = 0.8f, .top_p = 1, .min_p = 0.05f, .seed = 3}, -1, false, false},
    {"top_k 50, top_p 0.95, min_p 0.02",
     {.temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .min_p = 0.02f, .seed = 4}, 2, false,
     false},
    {"plain temperature 0.9", {.temperature = 0.9f, .top_p = 1, .seed = 5}, 3, false, false},
    {"top_k 40 with penalties and bias",
     {.temperature = 0.7f, .top_k = 40, .top_p = 1, .seed = 6, .repetition_penalty = 1.3f,
      .presence_penalty = 0.4f, .frequency_penalty = 0.3f, .logit_bias = test_bias,
      .n_logit_bias = 6},
     20, true, false},
    {"greedy with penalties and bias",
     {.temperature = 0, .top_p = 1, .repetition_penalty = 1.5f, .presence_penalty = -0.5f,
      .frequency_penalty = 1.0f, .logit_bias = test_bias, .n_logit_bias = 6},
     1, true, false},
    {"plain temperature 1.3 with penalties",
     {.temperature = 1.3f, .top_p = 1, .seed = 7, .repetition_penalty = 0.8f,
      .frequency_penalty = -0.5f, .logit_bias = test_bias, .n_logit_bias = 6},
     -1, true, false},
    {"top_p 0.999 (handed to the host)", {.temperature = 1.0f, .top_p = 0.999f, .seed = 8}, 4,
     false, true},
};

/* Requirements: greedy picks are identical on every row and never need the
 * host. Sampling picks are identical on >= 99.9% of rows: the GPU's expf may
 * differ from the C library's in the last bit and its sums run in another
 * order, so a u within float rounding of the boundary between two candidates
 * may pick the neighbour. Logprobs of the token and the top list within 1e-4. */
static void check_sets(struct backend *be, const char *source, const float *rows, int vocab,
                       int n_rows)
{
    for (size_t i = 0; i < sizeof sample_sets / sizeof sample_sets[0]; i++) {
        const struct sample_set *set = &sample_sets[i];
        struct sampler_params p = set->p;
        if (vocab < 151000)
            p.n_logit_bias = 0; /* the bias ids are for the real vocabulary */
        struct sample_tally t = {0};
        char what[256];
        snprintf(what, sizeof what, "%s, %s", source, set->name);
        compare_sampling(be, what, &p, set->logprobs, set->history, rows, vocab, n_rows, &t);
        cr_log_info("gpu sampling %s: %ld of %ld rows the same token, %ld handed to the host, "
                    "logprobs within %.2g",
                    what, t.same, t.rows, t.need_host, t.worst_logprob);
        bool greedy = p.temperature == 0 || p.top_k == 1;
        if (greedy) {
            cr_expect_eq(t.same, t.rows, "%s: greedy tokens differ", what);
            cr_expect_eq(t.need_host, 0, "%s: a greedy row needed the host", what);
        }
        cr_expect_geq((double)t.same, 0.999 * (double)t.rows, "%s: %ld of %ld rows differ", what,
                      t.rows - t.same, t.rows);
        cr_expect_leq(t.worst_logprob, 1e-4, "%s: logprobs off by %g", what, t.worst_logprob);
        if (set->must_need_host && !rows && vocab > 1000)
            cr_expect_gt(t.need_host, 0, "%s: no row was handed to the host", what);
    }
}

Test(cuda_sampling, random_rows_pick_the_host_samplers_tokens, .timeout = 600)
{
    skip_without_gpu();
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cuda_create(0, &cuda_fast, &be, &err), 0, "%s", err.msg);
    cr_assert_not_null(be->ops->sample,
                       "the CUDA backend does not sample (INFERD_CUDA_SAMPLE=0 in the environment?)");
    check_sets(be, "random rows", NULL, REAL_VOCAB, 512);
    check_sets(be, "random rows, vocab 1000", NULL, 1000, 256);
    check_sets(be, "random rows, vocab 100", NULL, 100, 128);
    backend_destroy(be);
}

/* Logits of the goldens' tiny models decoding greedily on the GPU. */
Test(cuda_sampling, tiny_model_logits_pick_the_host_samplers_tokens, .timeout = 600)
{
    skip_without_gpu();
    static char paths[GOLDEN_MAX_FILES][512];
    int n = golden_list(paths, GOLDEN_MAX_FILES);
    cr_assert_gt(n, 0, "no goldens found in %s", golden_dir());
    char *tmp = test_mkdtemp();
    for (int i = 0; i < n; i++) {
        struct golden g;
        cr_assert_eq(golden_load(paths[i], &g), 0, "cannot read %s", paths[i]);
        char dir[1024];
        golden_make_model(&g, tmp, dir, sizeof dir);
        struct err err = {0};
        struct backend *be = NULL;
        struct model *m = NULL;
        struct generator *gen = NULL;
        cr_assert_eq(backend_cuda_create(0, &cuda_fast, &be, &err), 0, "%s", err.msg);
        cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
        int vocab = m->config.vocab_size, steps = 64;
        const struct golden_case *gc = &g.cases[0];
        cr_assert_eq(generator_create(m, gc->n_tokens + steps + 1, 64, &gen, &err), 0, "%s",
                     err.msg);
        float *rows = malloc((size_t)steps * vocab * sizeof(float));
        cr_assert_eq(generator_feed(gen, gc->tokens, gc->n_tokens, &err), 0, "%s", err.msg);
        for (int s = 0; s < steps; s++) {
            memcpy(rows + (size_t)s * vocab, gen->logits, (size_t)vocab * sizeof(float));
            int32_t tok = logits_argmax(gen->logits, vocab);
            cr_assert_eq(generator_feed(gen, &tok, 1, &err), 0, "%s", err.msg);
        }
        char what[160];
        snprintf(what, sizeof what, "%s logits", g.name);
        check_sets(be, what, rows, vocab, steps);
        free(rows);
        generator_free(gen);
        model_free(m);
        backend_destroy(be);
        golden_free(&g);
    }
    test_rmtree(tmp);
    free(tmp);
}

/* One row through the device and the host; returns the device's result. */
static struct sample_result sample_one(struct backend *be, const float *row, int vocab,
                                       const struct sampler_params *p, int32_t *host_token,
                                       int32_t *dev_token)
{
    struct sampler h, d;
    cr_assert_eq(sampler_init(&h, p, vocab, NULL), 0);
    cr_assert_eq(sampler_init(&d, p, vocab, NULL), 0);
    struct sample_spec spec;
    struct sample_result res;
    cr_assert_eq(sampler_fill_spec(&d, 2, &spec), 0);
    float *dev_row = be->ops->alloc(be, (size_t)vocab * sizeof(float));
    float *host_row = malloc((size_t)vocab * sizeof(float));
    be->ops->to_device(be, dev_row, row, (size_t)vocab * sizeof(float));
    struct err err = {0};
    cr_assert_eq(be->ops->sample(be, dev_row, 1, vocab, &spec, &res, host_row, &err), 0, "%s",
                 err.msg);
    *host_token = sampler_pick(&h, row);
    *dev_token = sampler_take_result(&d, &spec, &res, host_row);
    cr_assert_eq(d.rng_state, h.rng_state, "the random streams parted");
    be->ops->release(be, dev_row);
    free(host_row);
    sampler_free(&h);
    sampler_free(&d);
    return res;
}

Test(cuda_sampling, nonfinite_rows_follow_the_host_rules, .timeout = 120)
{
    skip_without_gpu();
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cuda_create(0, &cuda_fast, &be, &err), 0, "%s", err.msg);
    int vocab = 5000;
    float *row = malloc((size_t)vocab * sizeof(float));
    uint64_t st = 11;
    for (int i = 0; i < vocab; i++)
        row[i] = lcg_normal(&st);
    row[3000] = INFINITY;
    row[4000] = INFINITY;
    row[10] = NAN;
    struct sampler_params greedy = {.temperature = 0, .top_p = 1};
    struct sampler_params sampling = {.temperature = 1.0f, .top_k = 10, .top_p = 1, .seed = 3};
    int32_t want, got;
    struct sample_result r = sample_one(be, row, vocab, &greedy, &want, &got);
    cr_expect_eq(got, 3000, "greedy over +inf picks the lowest +inf id, not %d", got);
    cr_expect_eq(r.need_host, 0, "a greedy pick never needs the host");
    r = sample_one(be, row, vocab, &sampling, &want, &got);
    cr_expect_eq(r.need_host, 1, "sampling over +inf logits is the host's");
    cr_expect_eq(got, want);

    for (int i = 0; i < vocab; i++)
        row[i] = i % 2 ? -INFINITY : NAN;
    r = sample_one(be, row, vocab, &sampling, &want, &got);
    cr_expect_eq(got, 0, "nothing above -inf: token 0, got %d", got);
    cr_expect_eq(want, 0);
    cr_expect_eq(r.used_random, 0, "nothing above -inf: no random number is used");
    cr_expect_eq(r.need_host, 0);
    r = sample_one(be, row, vocab, &greedy, &want, &got);
    cr_expect_eq(got, 0);
    free(row);
    backend_destroy(be);
}

/* Greedy tokens of 4 prompts served together by an engine on be. */
static void engine_greedy(struct backend *be, const char *dir, const struct tokenizer *tok,
                          const int32_t prompts[][8], int n_prompts, int max_tokens,
                          int32_t out[][32], float margin[][32])
{
    struct err err = {0};
    struct model *m = NULL;
    struct engine *e = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    struct engine_config cfg = {.n_ctx = 128, .max_seqs = 4, .max_step_tokens = 64, .max_queue = 8};
    cr_assert_eq(engine_create(m, tok, &cfg, &e, &err), 0, "%s", err.msg);
    struct gen_output *o[8];
    for (int i = 0; i < n_prompts; i++) {
        int n = 0;
        while (n < 8 && prompts[i][n])
            n++;
        struct gen_params p = {.prompt = prompts[i], .n_prompt = n, .max_tokens = max_tokens,
                               .sampling = {.temperature = 0, .top_p = 1}, .logprobs = 2};
        cr_assert_eq(engine_submit(e, &p, &o[i], &err), 0, "%s", err.msg);
    }
    for (int i = 0; i < n_prompts; i++) {
        pthread_mutex_lock(&o[i]->mu);
        while (o[i]->finish == GEN_RUNNING)
            gen_output_wait(o[i], o[i]->text.len, o[i]->n_tokens, 1000);
        pthread_mutex_unlock(&o[i]->mu);
        cr_assert_eq((int)o[i]->n_tokens, max_tokens, "prompt %d: %d tokens", i,
                     (int)o[i]->n_tokens);
        const struct gen_token *tokens = gen_output_tokens(o[i]);
        for (int k = 0; k < max_tokens; k++) {
            out[i][k] = tokens[k].id;
            cr_assert_eq(tokens[k].n_top, 2);
            margin[i][k] = tokens[k].top[0].logprob - tokens[k].top[1].logprob;
            cr_assert_eq(tokens[k].top[0].token, out[i][k],
                         "greedy's token is its own top logprob");
        }
        gen_output_release(o[i]);
    }
    engine_free(e);
    model_free(m);
}

Test(cuda_sampling, engine_greedy_tokens_equal_the_cpu_engines, .timeout = 300)
{
    skip_without_gpu();
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: the engine on CUDA not checked");
    char *dir = test_mkdtemp();
    char tdir[1024];
    snprintf(tdir, sizeof tdir, "%s/qwen3", data);
    struct mkmodel_opts mo = {.preset = "tiny-qwen3", .seed = 3, .out_dir = dir,
                              .tokenizer_dir = tdir};
    struct err err = {0};
    cr_assert_eq(mkmodel_write(&mo, &err), 0, "%s", err.msg);
    struct tokenizer *tok = NULL;
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    static const int32_t prompts[4][8] = {
        {9707, 11, 1879}, {785, 6722, 315, 9625, 374}, {16, 17, 18, 19, 20, 21, 22}, {40, 1079}};
    int32_t want[4][32], got[4][32];
    float margin[4][32], unused[4][32];
    struct backend *cpu = NULL, *gpu = NULL;
    cr_assert_eq(backend_cpu_create(&cpu_exact, &cpu, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(0, &cuda_exact, &gpu, &err), 0, "%s", err.msg);
    cr_assert_not_null(gpu->ops->sample);
    engine_greedy(cpu, dir, tok, prompts, 4, 24, want, margin);
    engine_greedy(gpu, dir, tok, prompts, 4, 24, got, unused);
    /* Token for token, except that float rounding may break a near tie (the
     * CPU's two best within 1e-3), after which the runs legitimately part. */
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 24; k++) {
            if (want[i][k] == got[i][k])
                continue;
            cr_expect_lt(margin[i][k], 1e-3f,
                         "prompt %d step %d: CUDA picked %d, the CPU %d, with a margin of %g", i,
                         k, got[i][k], want[i][k], margin[i][k]);
            break;
        }
    backend_destroy(gpu);
    backend_destroy(cpu);
    tok_free(tok);
    test_rmtree(dir);
    free(dir);
}

/* Structured output's mask step (sample_spec.mask): the GPU picks the host sampler's token from
 * the allowed ones only, greedy and sampled, with two masked rows and one unmasked in a batch. */
Test(cuda_sampling, masked_rows_pick_only_allowed_tokens_as_the_host_does, .timeout = 300)
{
    skip_without_gpu();
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cuda_create(0, &cuda_fast, &be, &err), 0, "%s", err.msg);
    int vocab = REAL_VOCAB, words = (vocab + 31) / 32, rows = 3;
    float *x = malloc((size_t)rows * vocab * sizeof(float));
    uint32_t *mask = calloc((size_t)words, sizeof *mask);
    uint64_t st = 5;
    for (int i = 0; i < rows * vocab; i++)
        x[i] = lcg_normal(&st);
    for (int t = 1000; t < vocab; t += 977) /* a sparse set, none of them the argmax by design */
        mask[t >> 5] |= 1u << (t & 31);
    struct sampler_params ps[] = {{.temperature = 0, .top_p = 1},
                                  {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 9},
                                  {.temperature = 1.0f, .top_p = 1, .seed = 4}};
    for (int k = 0; k < 3; k++) {
        struct sampler h[3], d[3];
        struct sample_spec spec[3];
        struct sample_result res[3];
        for (int r = 0; r < rows; r++) {
            cr_assert_eq(sampler_init(&h[r], &ps[k], vocab, NULL), 0);
            cr_assert_eq(sampler_init(&d[r], &ps[k], vocab, NULL), 0);
            if (r < 2) { /* rows 0 and 1 masked, row 2 not */
                cr_assert_eq(sampler_set_mask(&h[r], mask), 0);
                cr_assert_eq(sampler_set_mask(&d[r], mask), 0);
            }
            cr_assert_eq(sampler_fill_spec(&d[r], 2, &spec[r]), 0);
        }
        float *dev = be->ops->alloc(be, (size_t)rows * vocab * sizeof(float));
        float *host_rows = malloc((size_t)rows * vocab * sizeof(float));
        be->ops->to_device(be, dev, x, (size_t)rows * vocab * sizeof(float));
        cr_assert_eq(be->ops->sample(be, dev, rows, vocab, spec, res, host_rows, &err), 0, "%s",
                     err.msg);
        for (int r = 0; r < rows; r++) {
            int32_t want = sampler_pick(&h[r], x + (size_t)r * vocab);
            int32_t got = sampler_take_result(&d[r], &spec[r], &res[r], host_rows + (size_t)r * vocab);
            cr_expect_eq(got, want, "params %d row %d: GPU %d, host %d", k, r, got, want);
            if (r < 2)
                cr_expect(mask[got >> 5] >> (got & 31) & 1u, "row %d picked masked token %d", r,
                          got);
            sampler_free(&h[r]);
            sampler_free(&d[r]);
        }
        be->ops->release(be, dev);
        free(host_rows);
    }
    free(x);
    free(mask);
    backend_destroy(be);
}
