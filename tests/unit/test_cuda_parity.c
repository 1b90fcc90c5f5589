/* tests/unit/test_cuda_parity.c — the CUDA backend against the Hugging Face goldens and against the CPU backend:
 * logits within tolerance for prefill, prefill + token-by-token decode and
 * varlen batches (exact and fast modes); greedy generations equal to the
 * CPU's for 32 tokens; CUDA-graph replay equal to eager launches; out of
 * device memory as a clear error. Skipped, saying why, without a GPU. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kv/kv.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "test_support.h"

#define BLOCK_SIZE 16
#define GEN_TOKENS 32

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: CUDA parity not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: CUDA parity not checked");
}

/* The source tree's goldens; INFERD_GOLDEN_DIR overrides it for a test
 * binary carried to another machine. */
static const char *golden_dir(void)
{
    const char *env = getenv("INFERD_GOLDEN_DIR");
    return env && *env ? env : INFERD_SOURCE_DIR "/tests/goldens";
}

struct golden_position {
    int argmax;
    double logsumexp, max_abs;
    int n_top;
    int top_ids[64];
    double top_logits[64];
};

struct golden_case {
    int32_t *tokens;
    int n_tokens;
    struct golden_position *pos;
};

struct golden {
    char name[128];
    char fnv[32];
    struct golden_case *cases;
    int n_cases;
};

/* The bf16 contract for fast mode; exact mode as the CPU's. */
struct tolerance {
    double rel_logit;
    double min_argmax_agreement;
};
static const struct tolerance EXACT = {1e-3, 1.0};
static const struct tolerance FAST = {2e-2, 0.99};

struct agreement {
    long positions, argmax_equal;
    double worst_rel;
    char worst_where[160];
};

static int load_golden(const char *path, struct golden *g)
{
    json_object *root = json_object_from_file(path);
    if (!root)
        return -1;
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", json_object_get_string(json_object_object_get(root, "model")));
    snprintf(g->fnv, sizeof g->fnv, "%s",
             json_object_get_string(json_object_object_get(root, "safetensors_fnv1a64")));
    json_object *cases = json_object_object_get(root, "cases");
    int n_cases = (int)json_object_array_length(cases);
    if (n_cases == 0 || n_cases > 64) {
        json_object_put(root);
        return -1;
    }
    g->n_cases = n_cases;
    g->cases = calloc((size_t)n_cases, sizeof *g->cases);
    for (int c = 0; c < n_cases; c++) {
        json_object *jc = json_object_array_get_idx(cases, c);
        json_object *toks = json_object_object_get(jc, "tokens");
        json_object *poss = json_object_object_get(jc, "positions");
        struct golden_case *gc = &g->cases[c];
        gc->n_tokens = (int)json_object_array_length(toks);
        if (gc->n_tokens < 1 || gc->n_tokens > 100000) {
            json_object_put(root);
            return -1;
        }
        gc->tokens = calloc((size_t)gc->n_tokens, sizeof *gc->tokens);
        gc->pos = calloc((size_t)gc->n_tokens, sizeof *gc->pos);
        for (int i = 0; i < gc->n_tokens; i++) {
            gc->tokens[i] = json_object_get_int(json_object_array_get_idx(toks, i));
            json_object *jp = json_object_array_get_idx(poss, i);
            struct golden_position *p = &gc->pos[i];
            p->argmax = json_object_get_int(json_object_object_get(jp, "argmax"));
            p->logsumexp = json_object_get_double(json_object_object_get(jp, "logsumexp"));
            p->max_abs = json_object_get_double(json_object_object_get(jp, "max_abs"));
            json_object *ids = json_object_object_get(jp, "top_ids");
            json_object *vals = json_object_object_get(jp, "top_logits");
            p->n_top = (int)json_object_array_length(ids);
            if (p->n_top > 64)
                p->n_top = 64;
            for (int k = 0; k < p->n_top; k++) {
                p->top_ids[k] = json_object_get_int(json_object_array_get_idx(ids, k));
                p->top_logits[k] = json_object_get_double(json_object_array_get_idx(vals, k));
            }
        }
    }
    json_object_put(root);
    return 0;
}

static void free_golden(struct golden *g)
{
    for (int c = 0; c < g->n_cases; c++) {
        free(g->cases[c].tokens);
        free(g->cases[c].pos);
    }
    free(g->cases);
}

static int list_goldens(char paths[][512], int max)
{
    DIR *d = opendir(golden_dir());
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".json"))
            snprintf(paths[n++], 512, "%s/%s", golden_dir(), e->d_name);
    }
    closedir(d);
    return n;
}

static void compare_row(const float *logits, int vocab, const struct golden_position *p,
                        const char *what, int case_idx, int pos, struct agreement *a)
{
    int argmax = 0;
    double max = logits[0];
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[argmax]) {
            argmax = v;
            max = logits[v];
        }
    double sum = 0;
    for (int v = 0; v < vocab; v++)
        sum += exp((double)logits[v] - max);
    double lse = max + log(sum);
    double worst = fabs(lse - p->logsumexp);
    for (int k = 0; k < p->n_top; k++) {
        double d = fabs((double)logits[p->top_ids[k]] - p->top_logits[k]);
        if (d > worst)
            worst = d;
    }
    if (!isfinite(worst))
        worst = INFINITY;
    double rel = worst / (p->max_abs > 0 ? p->max_abs : 1.0);
    a->positions++;
    a->argmax_equal += argmax == p->argmax;
    if (rel > a->worst_rel || !isfinite(rel)) {
        a->worst_rel = rel;
        snprintf(a->worst_where, sizeof a->worst_where, "%s case %d position %d", what, case_idx, pos);
    }
}

struct fixture {
    struct backend *be;
    struct model *model;
    struct kv_pool *pool;
    struct forward_state *state;
    float *logits;
};

static void fixture_open(struct fixture *f, const char *model_dir, enum compute_mode mode,
                         int max_tokens)
{
    struct err err = {0};
    cr_assert_eq(backend_cuda_create(0, mode, &f->be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(model_dir, f->be, &f->model, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_pool_create(f->model, f->be, 256, BLOCK_SIZE, &f->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(f->model, max_tokens, &f->state, &err), 0, "%s", err.msg);
    f->logits = malloc((size_t)max_tokens * (size_t)f->model->config.vocab_size * sizeof(float));
}

static void fixture_close(struct fixture *f)
{
    free(f->logits);
    forward_state_free(f->state);
    kv_pool_free(f->pool);
    model_free(f->model);
    backend_destroy(f->be);
}

static void forward_ok(struct fixture *f, const struct batch *batch)
{
    struct err err = {0};
    cr_assert_eq(model_forward(f->model, f->state, &f->pool->cache, batch, f->logits, &err), 0,
                 "%s", err.msg);
}

static void run_prefill(struct fixture *f, const struct golden *g, struct agreement *a)
{
    struct err err = {0};
    int vocab = f->model->config.vocab_size;
    for (int c = 0; c < g->n_cases; c++) {
        const struct golden_case *gc = &g->cases[c];
        struct block_table bt;
        block_table_init(&bt);
        cr_assert_eq(block_table_reserve(f->pool, &bt, gc->n_tokens, &err), 0, "%s", err.msg);
        struct batch_seq seq = {.tokens = gc->tokens, .n_tokens = gc->n_tokens, .pos0 = 0,
                                .block_ids = bt.blocks, .n_block_ids = bt.n_blocks,
                                .all_logits = true};
        struct batch batch = {&seq, 1};
        forward_ok(f, &batch);
        for (int i = 0; i < gc->n_tokens; i++)
            compare_row(f->logits + (size_t)i * vocab, vocab, &gc->pos[i], "prefill", c, i, a);
        block_table_clear(f->pool, &bt);
    }
}

/* The first third as one prefill chunk, the rest one token per step (the
 * steps that CUDA graphs replay). */
static void run_incremental(struct fixture *f, const struct golden *g, struct agreement *a)
{
    struct err err = {0};
    int vocab = f->model->config.vocab_size;
    for (int c = 0; c < g->n_cases; c++) {
        const struct golden_case *gc = &g->cases[c];
        struct block_table bt;
        block_table_init(&bt);
        cr_assert_eq(block_table_reserve(f->pool, &bt, gc->n_tokens, &err), 0, "%s", err.msg);
        int first = gc->n_tokens / 3 > 0 ? gc->n_tokens / 3 : 1;
        struct batch_seq seq = {.tokens = gc->tokens, .n_tokens = first, .pos0 = 0,
                                .block_ids = bt.blocks, .n_block_ids = bt.n_blocks,
                                .all_logits = true};
        struct batch batch = {&seq, 1};
        forward_ok(f, &batch);
        for (int i = 0; i < first; i++)
            compare_row(f->logits + (size_t)i * vocab, vocab, &gc->pos[i], "prefill+decode", c, i, a);
        for (int i = first; i < gc->n_tokens; i++) {
            struct batch_seq step = {.tokens = gc->tokens + i, .n_tokens = 1, .pos0 = i,
                                     .block_ids = bt.blocks, .n_block_ids = bt.n_blocks};
            struct batch one = {&step, 1};
            forward_ok(f, &one);
            compare_row(f->logits, vocab, &gc->pos[i], "prefill+decode", c, i, a);
        }
        block_table_clear(f->pool, &bt);
    }
}

static void run_batched(struct fixture *f, const struct golden *g, struct agreement *a)
{
    struct err err = {0};
    int vocab = f->model->config.vocab_size;
    struct block_table *bts = calloc((size_t)(unsigned)g->n_cases, sizeof *bts);
    struct batch_seq *seqs = calloc((size_t)(unsigned)g->n_cases, sizeof *seqs);
    for (int c = 0; c < g->n_cases; c++) {
        const struct golden_case *gc = &g->cases[c];
        block_table_init(&bts[c]);
        cr_assert_eq(block_table_reserve(f->pool, &bts[c], gc->n_tokens, &err), 0, "%s", err.msg);
        seqs[c] = (struct batch_seq){.tokens = gc->tokens, .n_tokens = gc->n_tokens, .pos0 = 0,
                                     .block_ids = bts[c].blocks, .n_block_ids = bts[c].n_blocks,
                                     .all_logits = true};
    }
    struct batch batch = {seqs, g->n_cases};
    forward_ok(f, &batch);
    int row = 0;
    for (int c = 0; c < g->n_cases; c++)
        for (int i = 0; i < g->cases[c].n_tokens; i++, row++)
            compare_row(f->logits + (size_t)row * vocab, vocab, &g->cases[c].pos[i], "batched", c, i, a);
    for (int c = 0; c < g->n_cases; c++)
        block_table_clear(f->pool, &bts[c]);
    free(bts);
    free(seqs);
}

/* Writes the golden's model into tmp and returns its directory in dir. */
static void make_model(const struct golden *g, const char *tmp, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s", tmp, g->name);
    struct err err = {0};
    struct mkmodel_opts opts = {.preset = g->name, .seed = 1, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", g->name, err.msg);
    char fnv[32];
    cr_assert_eq(mkmodel_file_fnv1a64(dir, "model.safetensors", fnv, sizeof fnv, &err), 0, "%s", err.msg);
    cr_assert_str_eq(fnv, g->fnv, "%s: model bytes differ from the ones the golden was made from", g->name);
}

static void check_all_goldens(enum compute_mode mode, const struct tolerance *tol)
{
    static char paths[64][512];
    int n = list_goldens(paths, 64);
    cr_assert_gt(n, 0, "no goldens found in %s", golden_dir());
    char *tmp = test_mkdtemp();
    cr_assert_not_null(tmp);
    static const char *const run_names[3] = {"prefill", "prefill+decode", "batched"};
    long all_positions[3] = {0}, all_equal[3] = {0};
    for (int i = 0; i < n; i++) {
        struct golden g;
        cr_assert_eq(load_golden(paths[i], &g), 0, "cannot read %s", paths[i]);
        char dir[1024];
        make_model(&g, tmp, dir, sizeof dir);
        int total = 0;
        for (int c = 0; c < g.n_cases; c++)
            total += g.cases[c].n_tokens;
        struct fixture f = {0};
        fixture_open(&f, dir, mode, total);
        struct agreement a[3] = {{0}};
        run_prefill(&f, &g, &a[0]);
        run_incremental(&f, &g, &a[1]);
        run_batched(&f, &g, &a[2]);
        for (int k = 0; k < 3; k++) {
            double agree = (double)a[k].argmax_equal / (double)a[k].positions;
            cr_log_info("cuda %s %s %s: %ld positions, argmax %.4f, worst |dlogit|/max|logit| %.2e at %s",
                        g.name, mode == COMPUTE_EXACT ? "exact" : "fast", run_names[k],
                        a[k].positions, agree, a[k].worst_rel, a[k].worst_where);
            if (tol->min_argmax_agreement >= 1.0)
                cr_expect_geq(agree, 1.0, "%s: argmax agreement %.4f", g.name, agree);
            all_positions[k] += a[k].positions;
            all_equal[k] += a[k].argmax_equal;
            cr_expect_leq(a[k].worst_rel, tol->rel_logit, "%s: worst relative logit error %.3e at %s",
                          g.name, a[k].worst_rel, a[k].worst_where);
        }
        fixture_close(&f);
        free_golden(&g);
    }
    for (int k = 0; k < 3; k++) {
        double agree = (double)all_equal[k] / (double)all_positions[k];
        cr_log_info("cuda all goldens, %s %s: argmax agreement %.4f over %ld positions",
                    mode == COMPUTE_EXACT ? "exact" : "fast", run_names[k], agree, all_positions[k]);
        cr_expect_geq(agree, tol->min_argmax_agreement, "%s: argmax agreement %.4f over %ld positions",
                      run_names[k], agree, all_positions[k]);
    }
    test_rmtree(tmp);
    free(tmp);
}

Test(cuda_parity, exact_mode_matches_transformers_for_prefill_decode_and_batches, .timeout = 600)
{
    skip_without_gpu();
    check_all_goldens(COMPUTE_EXACT, &EXACT);
}

Test(cuda_parity, fast_mode_stays_within_bf16_tolerance, .timeout = 600)
{
    skip_without_gpu();
    check_all_goldens(COMPUTE_FAST, &FAST);
}

/* GEN_TOKENS greedy tokens after the golden's first prompt. */
static void greedy_tokens(struct backend *be, const char *dir, const struct golden_case *prompt,
                          int32_t *out)
{
    struct err err = {0};
    struct model *m = NULL;
    struct generator *gen = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(generator_create(m, prompt->n_tokens + GEN_TOKENS + 1, 64, &gen, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(generator_feed(gen, prompt->tokens, prompt->n_tokens, &err), 0, "%s", err.msg);
    for (int i = 0; i < GEN_TOKENS; i++) {
        out[i] = logits_argmax(gen->logits, m->config.vocab_size);
        cr_assert_eq(generator_feed(gen, &out[i], 1, &err), 0, "%s", err.msg);
    }
    generator_free(gen);
    model_free(m);
}

static void check_generations(enum compute_mode mode)
{
    static char paths[64][512];
    int n = list_goldens(paths, 64);
    cr_assert_gt(n, 0, "no goldens found in %s", golden_dir());
    char *tmp = test_mkdtemp();
    cr_assert_not_null(tmp);
    for (int i = 0; i < n; i++) {
        struct golden g;
        cr_assert_eq(load_golden(paths[i], &g), 0, "cannot read %s", paths[i]);
        char dir[1024];
        make_model(&g, tmp, dir, sizeof dir);
        struct err err = {0};
        struct backend *cpu = NULL, *gpu = NULL;
        cr_assert_eq(backend_cpu_create(2, mode, &cpu, &err), 0, "%s", err.msg);
        cr_assert_eq(backend_cuda_create(0, mode, &gpu, &err), 0, "%s", err.msg);
        int32_t want[GEN_TOKENS], got[GEN_TOKENS];
        greedy_tokens(cpu, dir, &g.cases[0], want);
        greedy_tokens(gpu, dir, &g.cases[0], got);
        int same = 0;
        while (same < GEN_TOKENS && want[same] == got[same])
            same++;
        cr_log_info("cuda %s %s: greedy generation equals the CPU's for %d of %d tokens", g.name,
                    mode == COMPUTE_EXACT ? "exact" : "fast", same, GEN_TOKENS);
        cr_expect_eq(same, GEN_TOKENS, "%s: CPU and CUDA greedy tokens differ at %d (%d vs %d)",
                     g.name, same, same < GEN_TOKENS ? want[same] : 0,
                     same < GEN_TOKENS ? got[same] : 0);
        backend_destroy(gpu);
        backend_destroy(cpu);
        free_golden(&g);
    }
    test_rmtree(tmp);
    free(tmp);
}

Test(cuda_parity, greedy_generation_equals_cpu_for_32_tokens_exact_mode, .timeout = 600)
{
    skip_without_gpu();
    check_generations(COMPUTE_EXACT);
}

Test(cuda_parity, greedy_generation_equals_cpu_for_32_tokens_fast_mode, .timeout = 600)
{
    skip_without_gpu();
    check_generations(COMPUTE_FAST);
}

/* Decoding the same tokens with graphs and with eager launches gives the same bits. */
Test(cuda_graphs, replayed_decode_steps_equal_eager_launches, .timeout = 300)
{
    skip_without_gpu();
    static char paths[64][512];
    int n = list_goldens(paths, 64);
    cr_assert_gt(n, 0);
    char *tmp = test_mkdtemp();
    struct golden g;
    cr_assert_eq(load_golden(paths[0], &g), 0);
    char dir[1024];
    make_model(&g, tmp, dir, sizeof dir);
    const struct golden_case *gc = &g.cases[0];
    float *logits[2];
    for (int run = 0; run < 2; run++) {
        setenv("INFERD_CUDA_GRAPHS", run ? "0" : "1", 1);
        struct fixture f = {0};
        fixture_open(&f, dir, COMPUTE_FAST, gc->n_tokens);
        int vocab = f.model->config.vocab_size;
        logits[run] = malloc((size_t)gc->n_tokens * (size_t)vocab * sizeof(float));
        struct err err = {0};
        struct block_table bt;
        block_table_init(&bt);
        cr_assert_eq(block_table_reserve(f.pool, &bt, gc->n_tokens, &err), 0, "%s", err.msg);
        for (int i = 0; i < gc->n_tokens; i++) {
            struct batch_seq step = {.tokens = gc->tokens + i, .n_tokens = 1, .pos0 = i,
                                     .block_ids = bt.blocks, .n_block_ids = bt.n_blocks};
            struct batch one = {&step, 1};
            forward_ok(&f, &one);
            memcpy(logits[run] + (size_t)i * vocab, f.logits, (size_t)vocab * sizeof(float));
        }
        block_table_clear(f.pool, &bt);
        cr_assert_eq(memcmp(logits[0], logits[run], (size_t)gc->n_tokens * vocab * sizeof(float)), 0,
                     "%s: logits with graphs differ from eager launches", g.name);
        fixture_close(&f);
    }
    unsetenv("INFERD_CUDA_GRAPHS");
    free(logits[0]);
    free(logits[1]);
    free_golden(&g);
    test_rmtree(tmp);
    free(tmp);
}

/* A KV pool larger than any GPU's memory is refused with a message, not a crash. */
Test(cuda_memory, oversized_kv_pool_is_a_clear_out_of_memory_error, .timeout = 120)
{
    skip_without_gpu();
    static char paths[64][512];
    cr_assert_gt(list_goldens(paths, 64), 0);
    char *tmp = test_mkdtemp();
    struct golden g;
    cr_assert_eq(load_golden(paths[0], &g), 0);
    char dir[1024];
    make_model(&g, tmp, dir, sizeof dir);
    struct err err = {0};
    struct backend *be = NULL;
    struct model *m = NULL;
    struct kv_pool *pool = NULL;
    cr_assert_eq(backend_cuda_create(0, COMPUTE_FAST, &be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    int rc = kv_pool_create(m, be, 1 << 30, 256, &pool, &err);
    cr_expect_eq(rc, -INFERD_ENOMEM, "an impossible KV pool gave %d", rc);
    cr_expect(strstr(err.msg, "out of memory") != NULL, "message: %s", err.msg);
    /* the backend still works afterwards */
    cr_assert_eq(kv_pool_create(m, be, 64, BLOCK_SIZE, &pool, &err), 0, "%s", err.msg);
    kv_pool_free(pool);
    model_free(m);
    backend_destroy(be);
    free_golden(&g);
    test_rmtree(tmp);
    free(tmp);
}

Test(cuda_device, missing_gpu_number_is_refused_clearly)
{
    struct err err = {0};
    struct backend *be = NULL;
    int rc = backend_cuda_create(1000, COMPUTE_FAST, &be, &err);
    cr_expect_eq(rc, -INFERD_EUNSUPPORTED);
    cr_expect_null(be);
    cr_expect_neq(err.msg[0], '\0');
}
