/* tests/unit/test_invariance.c — EXACT mode is batch invariant: a token's logits are the same bits however its prompt is chunked and whatever shares its step, so a prefix-cache hit equals a cold run (CPU at every ISA level and thread count; the CUDA backend where there is a GPU). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kv/kv.h"
#include "model/model.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "tools/mkmodel.h"

#define PROMPT 100
#define BLOCK 16
#define TARGET_BLOCKS ((PROMPT + BLOCK - 1) / BLOCK)
#define OTHERS_MAX 16
#define OTHER_MAX_TOKENS 20
#define OTHER_MAX_POS 60
#define OTHER_BLOCKS ((OTHER_MAX_POS + OTHER_MAX_TOKENS + BLOCK - 1) / BLOCK)
#define POOL_BLOCKS (TARGET_BLOCKS + OTHERS_MAX * OTHER_BLOCKS)
#define STEP_TOKENS (PROMPT + OTHERS_MAX * OTHER_MAX_TOKENS)

/* Every tiny preset `inferd mkmodel --list` offers. */
static int tiny_presets(const struct mkmodel_preset **out, int cap)
{
    int n, count = 0;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    for (int i = 0; i < n && count < cap; i++)
        if (!p[i].real)
            out[count++] = &p[i];
    return count;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int rng_range(uint64_t *s, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

/* A backend made from options: the CPU's, or GPU 0's. */
typedef int (*backend_maker)(const struct backend_options *opt, struct backend **out,
                             struct err *err);

static int make_cpu(const struct backend_options *opt, struct backend **out, struct err *err)
{
    return backend_cpu_create(opt, out, err);
}

static int make_cuda(const struct backend_options *opt, struct backend **out, struct err *err)
{
    return backend_cuda_create(0, opt, out, err);
}

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: CUDA batch invariance not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: CUDA batch invariance not checked");
}

/* ---- logits of a prompt, step by step ----------------------------------- */

/* One model on one CPU backend configuration, with a KV pool that gives the
 * prompt under test its own blocks and each other sequence its own. */
struct rig {
    const char *preset;
    const char *config; /* "1 thread, best ISA" etc., for messages */
    struct backend *be;
    struct model *model;
    struct kv_pool *pool;
    struct forward_state *state;
    int vocab;
    int32_t prompt[PROMPT];
    uint32_t target_blocks[TARGET_BLOCKS];
    uint32_t other_blocks[OTHERS_MAX][OTHER_BLOCKS];
    float *logits; /* owned; STEP_TOKENS rows */
    float *want;   /* owned; PROMPT rows: the prompt in one step */
    float *got;    /* owned; PROMPT rows */
};

static void rig_open(struct rig *r, const char *dir, const char *preset, backend_maker make,
                     const struct backend_options *opt, const char *config)
{
    struct err err = {0};
    memset(r, 0, sizeof *r);
    r->preset = preset;
    r->config = config;
    cr_assert_eq(make(opt, &r->be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, r->be, &r->model, &err), 0, "%s: %s", preset, err.msg);
    cr_assert_eq(kv_pool_create(r->model, r->be, POOL_BLOCKS, BLOCK, &r->pool, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(forward_state_create(r->model, STEP_TOKENS, &r->state, &err), 0, "%s", err.msg);
    r->vocab = r->model->config.vocab_size;
    size_t row = (size_t)r->vocab * sizeof(float);
    r->logits = malloc((size_t)STEP_TOKENS * row);
    r->want = malloc((size_t)PROMPT * row);
    r->got = malloc((size_t)PROMPT * row);
    cr_assert(r->logits && r->want && r->got);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < PROMPT; i++)
        r->prompt[i] = (int32_t)(rng_next(&s) % (uint64_t)r->vocab);
    uint32_t b = 0;
    for (int i = 0; i < TARGET_BLOCKS; i++)
        r->target_blocks[i] = b++;
    for (int o = 0; o < OTHERS_MAX; o++)
        for (int i = 0; i < OTHER_BLOCKS; i++)
            r->other_blocks[o][i] = b++;
}

static void rig_close(struct rig *r)
{
    free(r->logits);
    free(r->want);
    free(r->got);
    forward_state_free(r->state);
    kv_pool_free(r->pool);
    model_free(r->model);
    backend_destroy(r->be);
}

/* Another sequence of a step: its own tokens at its own positions. */
struct other {
    int32_t tokens[OTHER_MAX_TOKENS];
    int n_tokens, pos0;
    bool all_logits, no_logits;
};

/* One step: the prompt's tokens [p0, p0 + n) (all their logits) placed at
 * index `at` among the others; the prompt's rows go to r->got. */
static void step(struct rig *r, int p0, int n, const struct other *others, int n_others, int at)
{
    struct batch_seq seqs[OTHERS_MAX + 1];
    int k = 0, out_row = 0, target_row = -1;
    for (int i = 0; i <= n_others; i++) {
        if (i == at) {
            seqs[k++] = (struct batch_seq){.tokens = r->prompt + p0, .n_tokens = n, .pos0 = p0,
                                           .block_ids = r->target_blocks,
                                           .n_block_ids = TARGET_BLOCKS, .all_logits = true};
            target_row = out_row;
            out_row += n;
        }
        if (i == n_others)
            break;
        const struct other *o = &others[i];
        seqs[k++] = (struct batch_seq){.tokens = o->tokens, .n_tokens = o->n_tokens,
                                       .pos0 = o->pos0, .block_ids = r->other_blocks[i],
                                       .n_block_ids = OTHER_BLOCKS, .all_logits = o->all_logits,
                                       .no_logits = o->no_logits};
        out_row += o->no_logits ? 0 : o->all_logits ? o->n_tokens : 1;
    }
    struct err err = {0};
    struct batch batch = {seqs, k};
    cr_assert_eq(model_forward(r->model, r->state, &r->pool->cache, &batch, r->logits, &err), 0,
                 "%s", err.msg);
    size_t row = (size_t)r->vocab;
    memcpy(r->got + (size_t)p0 * row, r->logits + (size_t)target_row * row,
           (size_t)n * row * sizeof(float));
}

/* Every position of r->got against r->want, bit for bit. */
static void expect_prompt_bits(const struct rig *r, const char *how)
{
    size_t row = (size_t)r->vocab;
    for (int p = 0; p < PROMPT; p++) {
        const float *a = r->want + (size_t)p * row, *b = r->got + (size_t)p * row;
        if (memcmp(a, b, row * sizeof(float)) == 0)
            continue;
        double worst = 0;
        for (size_t v = 0; v < row; v++)
            worst = fmax(worst, fabs((double)a[v] - b[v]));
        cr_assert_fail("%s, %s: the logits of position %d computed %s differ from the prompt "
                       "in one step (by up to %g)",
                       r->preset, r->config, p, how, worst);
    }
}

/* r's prompt logits against those of `ref` computed the same way, bit for bit. */
static void expect_bits_of(const struct rig *ref, struct rig *r, const char *how)
{
    memcpy(r->want, ref->got, (size_t)PROMPT * ref->vocab * sizeof(float));
    expect_prompt_bits(r, how);
}

/* The prompt in chunks of random sizes in [1, max_chunk], each step alone. */
static void run_chunked(struct rig *r, uint64_t *s, int max_chunk)
{
    for (int p0 = 0; p0 < PROMPT;) {
        int n = rng_range(s, 1, max_chunk);
        n = n < PROMPT - p0 ? n : PROMPT - p0;
        step(r, p0, n, NULL, 0, 0);
        p0 += n;
    }
}

/* The prompt in random chunks, each step shared with 1..16 other sequences
 * (prefill chunks and single decode tokens at their own positions, asking
 * for all, last or no logits) and the prompt at a random place among them. */
static void run_mixed(struct rig *r, uint64_t *s)
{
    struct other others[OTHERS_MAX];
    int count = 1;
    for (int p0 = 0; p0 < PROMPT;) {
        int n = rng_range(s, 1, 30);
        n = n < PROMPT - p0 ? n : PROMPT - p0;
        for (int i = 0; i < count; i++) {
            struct other *o = &others[i];
            o->n_tokens = rng_range(s, 0, 2) == 0 ? 1 : rng_range(s, 1, OTHER_MAX_TOKENS);
            o->pos0 = rng_range(s, 0, OTHER_MAX_POS);
            for (int t = 0; t < o->n_tokens; t++)
                o->tokens[t] = (int32_t)(rng_next(s) % (uint64_t)r->vocab);
            int logits = rng_range(s, 0, 2);
            o->all_logits = logits == 0;
            o->no_logits = logits == 2;
        }
        step(r, p0, n, others, count, rng_range(s, 0, count));
        p0 += n;
        count = count % OTHERS_MAX + 1;
    }
}

static void check_preset(const char *dir, const char *preset, backend_maker make,
                         const struct backend_options *opt, const char *config)
{
    struct rig r;
    rig_open(&r, dir, preset, make, opt, config);
    step(&r, 0, PROMPT, NULL, 0, 0);
    memcpy(r.want, r.got, (size_t)PROMPT * r.vocab * sizeof(float));

    run_chunked(&r, &(uint64_t){1}, 1);
    expect_prompt_bits(&r, "one token at a time");
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int c = 0; c < 3; c++) {
        memset(r.got, 0, (size_t)PROMPT * r.vocab * sizeof(float));
        run_chunked(&r, &s, c == 0 ? 8 : 40);
        expect_prompt_bits(&r, "in random chunks");
    }
    for (int c = 0; c < 2; c++) {
        memset(r.got, 0, (size_t)PROMPT * r.vocab * sizeof(float));
        run_mixed(&r, &s);
        expect_prompt_bits(&r, "in random chunks among 1-16 other sequences");
    }
    rig_close(&r);
}

/* Every tiny preset on backends made by make: at 1 and 2 threads under the
 * cpu_isa cap isa on the CPU, once on a GPU. */
static void check_all_presets(backend_maker make, enum cpu_isa isa, const char *isa_name)
{
    const struct mkmodel_preset *presets[32];
    int n = tiny_presets(presets, 32);
    cr_assert_geq(n, 4);
    if (make == make_cpu && isa != CPU_ISA_BEST) {
        struct cpu_features f;
        cpu_features_detect(isa, &f);
        if (!f.avx2)
            cr_skip_test("this CPU lacks %s", isa_name);
    }
    for (int i = 0; i < n; i++) {
        struct err err = {0};
        char *dir = test_mkdtemp();
        cr_assert_not_null(dir);
        struct mkmodel_opts opts = {.preset = presets[i]->name, .seed = 5, .out_dir = dir};
        cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", presets[i]->name, err.msg);
        for (int threads = 1; threads <= (make == make_cpu ? 2 : 1); threads++) {
            struct backend_options opt = {.mode = COMPUTE_EXACT, .threads = threads,
                                          .cpu_isa = isa};
            char config[64];
            if (make == make_cpu)
                snprintf(config, sizeof config, "%d thread%s, %s", threads,
                         threads > 1 ? "s" : "", isa_name);
            else
                snprintf(config, sizeof config, "GPU 0");
            check_preset(dir, presets[i]->name, make, &opt, config);
        }
        test_rmtree(dir);
        free(dir);
    }
}

TestSuite(batch_invariance, .timeout = 600);
TestSuite(cuda_batch_invariance, .timeout = 600);

Test(batch_invariance, exact_logits_do_not_depend_on_chunking_or_step_mates)
{
    check_all_presets(make_cpu, CPU_ISA_BEST, "the best ISA");
}

Test(batch_invariance, exact_logits_do_not_depend_on_chunking_or_step_mates_on_avx2_kernels)
{
    check_all_presets(make_cpu, CPU_ISA_AVX2, "AVX2");
}

/* The CUDA backend's promise: GEMV for every row count with one warp per
 * output, RMSNorm never folded, attention on the decode kernels with one
 * split; decode steps replayed from graphs and q/k work folded into the
 * attention included. */
Test(cuda_batch_invariance, exact_logits_do_not_depend_on_chunking_or_step_mates)
{
    skip_without_gpu();
    check_all_presets(make_cuda, CPU_ISA_BEST, "");
}

/* check(dir, preset) for every tiny preset, its model written with seed to a fresh directory. */
static void each_tiny_model(uint64_t seed, void (*check)(const char *dir, const char *preset))
{
    const struct mkmodel_preset *presets[32];
    int n = tiny_presets(presets, 32);
    for (int i = 0; i < n; i++) {
        struct err err = {0};
        char *dir = test_mkdtemp();
        cr_assert_not_null(dir);
        struct mkmodel_opts opts = {.preset = presets[i]->name, .seed = seed, .out_dir = dir};
        cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", presets[i]->name, err.msg);
        check(dir, presets[i]->name);
        test_rmtree(dir);
        free(dir);
    }
}

static void check_thread_counts(const char *dir, const char *preset)
{
    struct rig one, two;
    rig_open(&one, dir, preset, make_cpu,
             &(struct backend_options){.mode = COMPUTE_EXACT, .threads = 1}, "1 thread");
    rig_open(&two, dir, preset, make_cpu,
             &(struct backend_options){.mode = COMPUTE_EXACT, .threads = 2}, "2 threads");
    step(&one, 0, PROMPT, NULL, 0, 0);
    step(&two, 0, PROMPT, NULL, 0, 0);
    expect_bits_of(&one, &two, "on 2 threads against 1");
    rig_close(&one);
    rig_close(&two);
}

/* One and two threads give the same bits too (each output has one owner
 * and a fixed order). */
Test(batch_invariance, exact_logits_do_not_depend_on_thread_count)
{
    each_tiny_model(5, check_thread_counts);
}

/* The CPU backend with every op run as it is called (backend_ops.hold_row_ops off). */
static int make_cpu_unheld(const struct backend_options *opt, struct backend **out,
                           struct err *err)
{
    static struct backend_ops unheld;
    int rc = backend_cpu_create(opt, out, err);
    if (rc == 0) {
        unheld = *(*out)->ops;
        unheld.hold_row_ops = NULL;
        (*out)->ops = &unheld;
    }
    return rc;
}

static void check_held_row_ops(const char *dir, const char *preset)
{
    for (int mode = 0; mode < 2; mode++) {
        struct backend_options opt = {.mode = mode ? COMPUTE_FAST : COMPUTE_EXACT, .threads = 2};
        struct rig plain, held;
        rig_open(&plain, dir, preset, make_cpu_unheld, &opt, "run as called");
        rig_open(&held, dir, preset, make_cpu, &opt, mode ? "fast mode, held" : "exact mode, held");
        uint64_t s1 = 0x1234567ull, s2 = s1;
        run_chunked(&plain, &s1, 40);
        run_chunked(&held, &s2, 40);
        expect_bits_of(&plain, &held, "in random chunks against ops run as called");
        for (int c = 0; c < 2; c++) {
            run_mixed(&plain, &s1);
            run_mixed(&held, &s2);
            expect_bits_of(&plain, &held, "among 1-16 other sequences against ops run as called");
        }
        rig_close(&plain);
        rig_close(&held);
    }
}

/* Row ops held for the next parallel op (norms, adds, RoPE, K/V stores, a GEMV's prepared x:
 * backend_ops.hold_row_ops) give the bits of the same ops run as they are called, in both
 * modes on two threads, whatever the step holds. */
Test(batch_invariance, held_row_ops_give_the_bits_of_ops_run_as_called)
{
    each_tiny_model(7, check_held_row_ops);
}

/* ---- whole generations through the engine -------------------------------- */

#define N_REQ 8
#define N_FILLERS 8
#define GEN_TOKENS 12

struct requests {
    int32_t prompt[N_REQ + N_FILLERS][PROMPT];
    int n_prompt[N_REQ + N_FILLERS];
};

static struct gen_params request(const struct requests *q, int i)
{
    struct gen_params p = {.prompt = q->prompt[i], .n_prompt = q->n_prompt[i],
                           .max_tokens = GEN_TOKENS, .logprobs = 0,
                           .sampling = {.temperature = 0, .top_p = 1}};
    if (i % 2) /* every other request samples, seeded */
        p.sampling = (struct sampler_params){.temperature = 0.9f, .top_p = 1,
                                             .seed = 1000 + (uint64_t)i};
    return p;
}

static void wait_generated(struct gen_output *o, int n)
{
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING && o->n_generated < n)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
}

/* The tokens and their logprobs (bits) of a finished request. */
struct result {
    int32_t ids[GEN_TOKENS];
    float logprob[GEN_TOKENS];
};

static void collect(struct gen_output *o, struct result *out, const char *preset, int i)
{
    wait_generated(o, GEN_TOKENS + 1);
    cr_assert_eq(o->finish, GEN_FINISH_LENGTH, "%s: request %d finished with %d", preset, i,
                 o->finish);
    cr_assert_eq((int)o->n_tokens, GEN_TOKENS);
    memset(out, 0, sizeof *out);
    for (int t = 0; t < GEN_TOKENS; t++) {
        out->ids[t] = gen_output_tokens(o)[t].id;
        out->logprob[t] = gen_output_tokens(o)[t].logprob;
    }
    gen_output_release(o);
}

static struct gen_output *submit(struct engine *e, const struct requests *q, int i)
{
    struct gen_params p = request(q, i);
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    return o;
}

static void expect_same(const struct result *want, const struct result *got, const char *preset,
                        int i, const char *how)
{
    cr_assert(memcmp(want, got, sizeof *want) == 0,
              "%s: request %d (%s) %s gave other tokens or logprobs than alone "
              "(first tokens %d %d %d vs %d %d %d)",
              preset, i, i % 2 ? "seeded sampling" : "greedy", how, want->ids[0], want->ids[1],
              want->ids[2], got->ids[0], got->ids[1], got->ids[2]);
}

static void check_engine(backend_maker make, const char *preset, const char *tokenizer_dir)
{
    struct err err = {0};
    char *dir = test_mkdtemp();
    cr_assert_not_null(dir);
    struct mkmodel_opts opts = {.preset = preset, .seed = 5, .out_dir = dir,
                                .tokenizer_dir = tokenizer_dir};
    cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", preset, err.msg);
    struct backend *be;
    struct model *model;
    struct tokenizer *tok;
    cr_assert_eq(make(&(struct backend_options){.mode = COMPUTE_EXACT, .threads = 2}, &be, &err),
                 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, be, &model, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    /* a small step budget, so prompts are chunked differently as the
     * company in each step changes */
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 16, .max_step_tokens = 40,
                                .max_queue = 64};
    struct engine *e;
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);

    struct requests q;
    uint64_t s = 0xdeadbeefcafef00dull;
    for (int i = 0; i < N_REQ + N_FILLERS; i++) {
        q.n_prompt[i] = rng_range(&s, 1, PROMPT);
        for (int t = 0; t < q.n_prompt[i]; t++)
            q.prompt[i][t] = (int32_t)rng_range(&s, 100, 5000);
    }
    struct result alone[N_REQ], got;
    for (int i = 0; i < N_REQ; i++)
        collect(submit(e, &q, i), &alone[i], preset, i);

    /* all at once */
    struct gen_output *o[N_REQ + N_FILLERS];
    for (int i = 0; i < N_REQ; i++)
        o[i] = submit(e, &q, i);
    for (int i = 0; i < N_REQ; i++) {
        collect(o[i], &got, preset, i);
        expect_same(&alone[i], &got, preset, i, "submitted together");
    }

    /* arriving one after another while the earlier ones decode */
    for (int i = 0; i < N_REQ; i++) {
        o[i] = submit(e, &q, i);
        wait_generated(o[i], 1 + i % 3);
    }
    for (int i = 0; i < N_REQ; i++) {
        collect(o[i], &got, preset, i);
        expect_same(&alone[i], &got, preset, i, "arriving in turn");
    }

    /* sixteen in the batch: fillers first, the requests arriving among them */
    for (int i = 0; i < N_FILLERS; i++)
        o[N_REQ + i] = submit(e, &q, N_REQ + i);
    for (int i = N_REQ - 1; i >= 0; i--) {
        o[i] = submit(e, &q, i);
        if (i % 2)
            wait_generated(o[N_REQ + i], 2);
    }
    for (int i = 0; i < N_REQ; i++) {
        collect(o[i], &got, preset, i);
        expect_same(&alone[i], &got, preset, i, "among 15 other requests");
    }
    for (int i = 0; i < N_FILLERS; i++)
        collect(o[N_REQ + i], &got, preset, N_REQ + i);

    engine_free(e);
    tok_free(tok);
    model_free(model);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

static void check_engines(backend_maker make)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set; run scripts/fetch-tokenizers.sh DIR and "
                     "export it");
    char tokenizer_dir[4096];
    snprintf(tokenizer_dir, sizeof tokenizer_dir, "%s/qwen3", data);
    const struct mkmodel_preset *presets[32];
    int n = tiny_presets(presets, 32);
    for (int i = 0; i < n; i++)
        check_engine(make, presets[i]->name, tokenizer_dir);
}

Test(batch_invariance, generations_alone_and_mixed_with_other_arrivals_give_the_same_tokens)
{
    check_engines(make_cpu);
}

/* On the GPU the picks are made there too (backend sampling). */
Test(cuda_batch_invariance, generations_alone_and_mixed_with_other_arrivals_give_the_same_tokens)
{
    skip_without_gpu();
    check_engines(make_cuda);
}

/* ---- a next turn that arrives while the previous one finishes ----------------
 * Driven step by step (no engine thread), so the next turn is admitted in the
 * very step that computes the previous one's last token: it takes the
 * finishing sequence's blocks over (the partial last block included) instead
 * of waiting for them to be published, counts the whole previous sequence as
 * reused, and gives a cold run's tokens and logprobs, bit for bit. */

#define TURN_GEN 8

struct turn_rig {
    struct backend *be;
    struct model *model;
    struct tokenizer *tok;
};

/* Steps sc until o has been told its finish. */
static void step_until_told(struct sched *sc, struct gen_output *o)
{
    struct err err = {0};
    for (int guard = 0; o->finish == GEN_RUNNING; guard++) {
        cr_assert_lt(guard, 1000);
        sched_admit(sc);
        cr_assert_geq(sched_step(sc, &err), 0, "%s", err.msg);
    }
}

static struct gen_params turn_params(const int32_t *prompt, int n)
{
    return (struct gen_params){.prompt = prompt, .n_prompt = n, .max_tokens = TURN_GEN,
                               .sampling = {.temperature = 0, .top_p = 1}, .logprobs = 1};
}

/* The first turn of n_prompt tokens runs to its finish; the next one, its
 * whole sequence and extra tokens more, arrives before its finishing step. */
static void check_turn(struct turn_rig *r, const char *preset, int n_prompt, int extra)
{
    struct sched_config cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                               .prefix = {.max_bytes = 16u << 20, .model_digest = 1}};
    struct sched sc;
    struct err err = {0};
    cr_assert_eq(sched_init(&sc, r->model, &cfg, NULL, &err), 0, "%s", err.msg);
    int32_t prompt[64], next[96];
    uint64_t seed = 0x5eed0000u + (uint64_t)n_prompt;
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)rng_range(&seed, 100, 5000);
    struct gen_params first = turn_params(prompt, n_prompt);
    int vocab = r->model->config.vocab_size;
    struct seq *f, *s;
    struct gen_output *fo, *so;
    cr_assert_eq(seq_create(&first, r->tok, vocab, &f, &fo, &err), 0, "%s", err.msg);
    cr_assert(sched_enqueue(&sc, f, false));
    step_until_told(&sc, fo);
    cr_assert_eq(sc.n_finishing, 1, "%s: the first turn takes one more step", preset);
    int n_first = (int)fo->n_tokens;
    memcpy(next, prompt, (size_t)n_prompt * sizeof *next);
    for (int i = 0; i < n_first; i++)
        next[n_prompt + i] = gen_output_tokens(fo)[i].id;
    for (int i = 0; i < extra; i++)
        next[n_prompt + n_first + i] = (int32_t)rng_range(&seed, 100, 5000);
    struct gen_params p = turn_params(next, n_prompt + n_first + extra);
    cr_assert_eq(seq_create(&p, r->tok, vocab, &s, &so, &err), 0, "%s", err.msg);
    cr_assert(sched_enqueue(&sc, s, false));
    sched_admit(&sc);
    cr_assert_eq(s->continues, f, "%s: the next turn continues the finishing one", preset);
    cr_assert_eq(so->n_cached, n_prompt + n_first, "%s: %d reused of %d + %d", preset,
                 so->n_cached, n_prompt, n_first);
    /* a one-token row runs a step later: a backend may fold its K/V write
     * into its attention, which would then miss the finishing row's write */
    cr_assert_eq(sched_step(&sc, &err), extra >= 2 ? 2 : 1, "%s: %s", preset, err.msg);
    cr_assert_null(s->continues);
    step_until_told(&sc, so);
    struct gen_token got[TURN_GEN];
    cr_assert_eq(so->n_tokens, TURN_GEN);
    memcpy(got, gen_output_tokens(so), sizeof got);
    while (!sched_idle(&sc))
        cr_assert_geq(sched_step(&sc, &err), 0, "%s", err.msg);
    gen_output_release(fo);
    gen_output_release(so);
    sched_free(&sc);

    struct engine_config ecfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                 .max_queue = 4};
    struct engine *cold;
    cr_assert_eq(engine_create(r->model, r->tok, &ecfg, &cold, &err), 0, "%s", err.msg);
    struct gen_output *o;
    cr_assert_eq(engine_submit(cold, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
    cr_assert_eq(o->n_tokens, TURN_GEN);
    for (int i = 0; i < TURN_GEN; i++) {
        const struct gen_token *w = &gen_output_tokens(o)[i];
        cr_assert(got[i].id == w->id && got[i].logprob == w->logprob,
                  "%s (prompt %d + %d), token %d: %d (%.9g) against a cold run's %d (%.9g)",
                  preset, n_prompt, extra, i, got[i].id, got[i].logprob, w->id, w->logprob);
    }
    gen_output_release(o);
    engine_free(cold);
}

static void check_turns(backend_maker make)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    char tokenizer_dir[4096];
    snprintf(tokenizer_dir, sizeof tokenizer_dir, "%s/qwen3", data);
    const struct mkmodel_preset *presets[32];
    int n = tiny_presets(presets, 32);
    for (int i = 0; i < n; i++) {
        struct err err = {0};
        char *dir = test_mkdtemp();
        struct mkmodel_opts opts = {.preset = presets[i]->name, .seed = 5, .out_dir = dir,
                                    .tokenizer_dir = tokenizer_dir};
        cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", presets[i]->name, err.msg);
        struct turn_rig r;
        cr_assert_eq(make(&(struct backend_options){.mode = COMPUTE_EXACT, .threads = 2}, &r.be,
                          &err),
                     0, "%s", err.msg);
        cr_assert_eq(model_load(dir, r.be, &r.model, &err), 0, "%s", err.msg);
        cr_assert_eq(tok_load(dir, &r.tok, &err), 0, "%s", err.msg);
        check_turn(&r, presets[i]->name, 21, 5);  /* 21 + 8: the last token inside a block */
        check_turn(&r, presets[i]->name, 24, 5);  /* 24 + 8: the last token fills a block */
        check_turn(&r, presets[i]->name, 25, 12); /* 25 + 8: it opens one; 12 more: a prefill */
        check_turn(&r, presets[i]->name, 21, 1);  /* one token more: it waits a step */
        tok_free(r.tok);
        model_free(r.model);
        backend_destroy(r.be);
        test_rmtree(dir);
        free(dir);
    }
}

Test(batch_invariance, a_next_turn_takes_over_a_finishing_sequence_and_keeps_its_tokens)
{
    check_turns(make_cpu);
}

Test(cuda_batch_invariance, a_next_turn_takes_over_a_finishing_sequence_and_keeps_its_tokens)
{
    skip_without_gpu();
    check_turns(make_cuda);
}

/* ---- the host-RAM tier under a device pool ----------------------------------------
 * A prompt whose blocks were pushed out of the GPU's cache by another one comes back
 * from host memory: reused, and with the cold run's tokens and logprobs. */

static void check_host_tier(const char *preset, const char *tokenizer_dir)
{
    struct err err = {0};
    char *dir = test_mkdtemp();
    struct mkmodel_opts opts = {.preset = preset, .seed = 5, .out_dir = dir,
                                .tokenizer_dir = tokenizer_dir};
    cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", preset, err.msg);
    struct turn_rig r;
    cr_assert_eq(make_cuda(&(struct backend_options){.mode = COMPUTE_EXACT}, &r.be, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(model_load(dir, r.be, &r.model, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(dir, &r.tok, &err), 0, "%s", err.msg);
    struct kv_format f = kv_format_of_dtype(r.be->kv_dtype);
    size_t block = kv_format_bytes_per_block(&r.model->config, &f, BLOCK);
    int32_t a[PROMPT], b[PROMPT];
    uint64_t seed = 0xa11ce;
    for (int i = 0; i < PROMPT; i++) {
        a[i] = (int32_t)rng_range(&seed, 100, 5000);
        b[i] = (int32_t)rng_range(&seed, 100, 5000);
    }
    struct gen_params pa = turn_params(a, PROMPT), pb = turn_params(b, PROMPT);
    struct gen_token want[TURN_GEN];
    /* cold */
    struct engine_config cold_cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                     .max_queue = 4};
    struct engine *e;
    cr_assert_eq(engine_create(r.model, r.tok, &cold_cfg, &e, &err), 0, "%s", err.msg);
    struct gen_output *o;
    cr_assert_eq(engine_submit(e, &pa, &o, &err), 0, "%s", err.msg);
    wait_generated(o, TURN_GEN);
    memcpy(want, gen_output_tokens(o), sizeof want);
    gen_output_release(o);
    engine_free(e);
    /* a GPU cache of 8 blocks: b's 7 push most of a's out, into host memory */
    struct engine_config cfg = cold_cfg;
    cfg.prompt_cache_bytes = 8 * block;
    cr_assert_eq(engine_create(r.model, r.tok, &cfg, &e, &err), 0, "%s", err.msg);
    for (int k = 0; k < 3; k++) {
        struct gen_params *p = k == 1 ? &pb : &pa;
        cr_assert_eq(engine_submit(e, p, &o, &err), 0, "%s", err.msg);
        wait_generated(o, TURN_GEN);
        pthread_mutex_lock(&o->mu);
        while (o->finish == GEN_RUNNING)
            gen_output_wait(o, o->text.len, o->n_tokens, 1000);
        pthread_mutex_unlock(&o->mu);
        if (k == 2) {
            cr_assert_geq(o->n_cached, (PROMPT - 1) / BLOCK * BLOCK, "%s: %d reused", preset,
                          o->n_cached);
            for (int i = 0; i < TURN_GEN; i++) {
                const struct gen_token *g = &gen_output_tokens(o)[i];
                cr_assert(g->id == want[i].id && g->logprob == want[i].logprob,
                          "%s, token %d: %d (%.9g) against a cold run's %d (%.9g)", preset, i,
                          g->id, g->logprob, want[i].id, want[i].logprob);
            }
        }
        gen_output_release(o);
    }
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_gt(st.ssd_cache.host_hits, 0, "%s: nothing came back from host memory", preset);
    engine_free(e);
    tok_free(r.tok);
    model_free(r.model);
    backend_destroy(r.be);
    test_rmtree(dir);
    free(dir);
}

Test(cuda_batch_invariance, blocks_pushed_out_of_the_gpu_come_back_from_host_memory)
{
    skip_without_gpu();
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    char tokenizer_dir[4096];
    snprintf(tokenizer_dir, sizeof tokenizer_dir, "%s/qwen3", data);
    const struct mkmodel_preset *presets[32];
    int n = tiny_presets(presets, 32);
    for (int i = 0; i < n; i++)
        check_host_tier(presets[i]->name, tokenizer_dir);
}
