/* tests/unit/golden_support.c — loading the Hugging Face goldens and holding a backend's logits to them. */
#include "golden_support.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/mkmodel.h"
#include "test_support.h"

const struct tolerance GOLDEN_EXACT = {1e-3, 1.0, 0};
const struct tolerance GOLDEN_FAST = {2e-2, 0.99, 0.15};

const char *golden_dir(void)
{
    const char *env = getenv("INFERD_GOLDEN_DIR");
    return env && *env ? env : INFERD_SOURCE_DIR "/tests/goldens";
}

int golden_load(const char *path, struct golden *g)
{
    json_object *root = json_object_from_file(path);
    if (!root)
        return -1;
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", json_object_get_string(json_object_object_get(root, "model")));
    snprintf(g->fnv, sizeof g->fnv, "%s",
             json_object_get_string(json_object_object_get(root, "safetensors_fnv1a64")));
    snprintf(g->config_fnv, sizeof g->config_fnv, "%s",
             json_object_get_string(json_object_object_get(root, "config_fnv1a64")));
    json_object *cases = json_object_object_get(root, "cases");
    int n_cases = (int)json_object_array_length(cases);
    if (n_cases == 0 || n_cases > 64) {
        json_object_put(root);
        return -1;
    }
    g->n_cases = n_cases;
    g->cases = calloc((size_t)g->n_cases, sizeof *g->cases);
    for (int c = 0; c < g->n_cases; c++) {
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

void golden_free(struct golden *g)
{
    for (int c = 0; c < g->n_cases; c++) {
        free(g->cases[c].tokens);
        free(g->cases[c].pos);
    }
    free(g->cases);
}

int golden_list(char paths[][512], int max)
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

void golden_compare_row(const float *logits, int vocab, const struct golden_position *p,
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
    a->over += rel > a->rel_limit;
    if (rel > a->worst_rel || !isfinite(rel)) {
        a->worst_rel = rel;
        snprintf(a->worst_where, sizeof a->worst_where, "%s case %d position %d", what, case_idx, pos);
    }
}

void golden_make_model(const struct golden *g, const char *tmp, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s", tmp, g->name);
    struct err err = {0};
    struct mkmodel_opts opts = {.preset = g->name, .seed = 1, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", g->name, err.msg);
    char fnv[32];
    cr_assert_eq(mkmodel_file_fnv1a64(dir, "model.safetensors", fnv, sizeof fnv, &err), 0, "%s", err.msg);
    cr_assert_str_eq(fnv, g->fnv, "%s: model bytes differ from the ones the golden was made from", g->name);
    cr_assert_eq(mkmodel_file_fnv1a64(dir, "config.json", fnv, sizeof fnv, &err), 0, "%s", err.msg);
    cr_assert_str_eq(fnv, g->config_fnv, "%s: config.json differs from the one the golden was made from",
                     g->name);
}

void golden_fixture_open(struct golden_fixture *f, golden_backend_fn make, const char *model_dir,
                         enum compute_mode mode, int max_tokens)
{
    struct err err = {0};
    cr_assert_eq(make(mode, &f->be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(model_dir, f->be, &f->model, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_pool_create(f->model, f->be, 256, GOLDEN_BLOCK_SIZE, &f->pool, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(forward_state_create(f->model, max_tokens, &f->state, &err), 0, "%s", err.msg);
    f->logits = malloc((size_t)max_tokens * (size_t)f->model->config.vocab_size * sizeof(float));
    cr_assert_not_null(f->logits);
}

void golden_fixture_close(struct golden_fixture *f)
{
    free(f->logits);
    forward_state_free(f->state);
    kv_pool_free(f->pool);
    model_free(f->model);
    backend_destroy(f->be);
}

void golden_forward(struct golden_fixture *f, const struct batch *batch)
{
    struct err err = {0};
    cr_assert_eq(model_forward(f->model, f->state, &f->pool->cache, batch, f->logits, &err), 0,
                 "%s", err.msg);
}

static void run_prefill(struct golden_fixture *f, const struct golden *g, struct agreement *a)
{
    struct err err = {0};
    int vocab = f->model->config.vocab_size;
    for (int c = 0; c < g->n_cases; c++) {
        const struct golden_case *gc = &g->cases[c];
        struct block_table bt;
        block_table_init(&bt);
        cr_assert_eq(block_table_reserve(f->pool, &bt, gc->n_tokens, &err), 0, "%s", err.msg);
        struct batch_seq seq = {gc->tokens, gc->n_tokens, 0, bt.blocks, bt.n_blocks, true, false, NULL, NULL, 0};
        struct batch batch = {&seq, 1};
        golden_forward(f, &batch);
        for (int i = 0; i < gc->n_tokens; i++)
            golden_compare_row(f->logits + (size_t)i * vocab, vocab, &gc->pos[i], "prefill", c, i, a);
        block_table_clear(f->pool, &bt);
    }
}

/* The first third as one prefill chunk, the rest one token per step. */
static void run_incremental(struct golden_fixture *f, const struct golden *g, struct agreement *a)
{
    struct err err = {0};
    int vocab = f->model->config.vocab_size;
    for (int c = 0; c < g->n_cases; c++) {
        const struct golden_case *gc = &g->cases[c];
        struct block_table bt;
        block_table_init(&bt);
        cr_assert_eq(block_table_reserve(f->pool, &bt, gc->n_tokens, &err), 0, "%s", err.msg);
        int first = gc->n_tokens / 3 > 0 ? gc->n_tokens / 3 : 1;
        struct batch_seq seq = {gc->tokens, first, 0, bt.blocks, bt.n_blocks, true, false, NULL, NULL, 0};
        struct batch batch = {&seq, 1};
        golden_forward(f, &batch);
        for (int i = 0; i < first; i++)
            golden_compare_row(f->logits + (size_t)i * vocab, vocab, &gc->pos[i], "prefill+decode", c, i, a);
        for (int i = first; i < gc->n_tokens; i++) {
            struct batch_seq step = {gc->tokens + i, 1, i, bt.blocks, bt.n_blocks, false, false, NULL, NULL, 0};
            struct batch one = {&step, 1};
            golden_forward(f, &one);
            golden_compare_row(f->logits, vocab, &gc->pos[i], "prefill+decode", c, i, a);
        }
        block_table_clear(f->pool, &bt);
    }
}

/* All cases at once: a varlen batch whose sequences have different lengths. */
static void run_batched(struct golden_fixture *f, const struct golden *g, struct agreement *a)
{
    struct err err = {0};
    int vocab = f->model->config.vocab_size;
    struct block_table *bts = calloc((size_t)(unsigned)g->n_cases, sizeof *bts);
    struct batch_seq *seqs = calloc((size_t)(unsigned)g->n_cases, sizeof *seqs);
    for (int c = 0; c < g->n_cases; c++) {
        const struct golden_case *gc = &g->cases[c];
        block_table_init(&bts[c]);
        cr_assert_eq(block_table_reserve(f->pool, &bts[c], gc->n_tokens, &err), 0, "%s", err.msg);
        seqs[c] = (struct batch_seq){gc->tokens, gc->n_tokens, 0, bts[c].blocks, bts[c].n_blocks, true, false, NULL, NULL, 0};
    }
    struct batch batch = {seqs, g->n_cases};
    golden_forward(f, &batch);
    int row = 0;
    for (int c = 0; c < g->n_cases; c++)
        for (int i = 0; i < g->cases[c].n_tokens; i++, row++)
            golden_compare_row(f->logits + (size_t)row * vocab, vocab, &g->cases[c].pos[i], "batched", c, i, a);
    for (int c = 0; c < g->n_cases; c++)
        block_table_clear(f->pool, &bts[c]);
    free(bts);
    free(seqs);
}

void golden_check_all(const char *label, golden_backend_fn make, enum compute_mode mode,
                      const struct tolerance *tol)
{
    static char paths[64][512];
    int n = golden_list(paths, 64);
    cr_assert_gt(n, 0, "no goldens found in %s", golden_dir());
    char *tmp = test_mkdtemp();
    cr_assert_not_null(tmp);
    static const char *const run_names[3] = {"prefill", "prefill+decode", "batched"};
    long all_positions[3] = {0}, all_equal[3] = {0};
    for (int i = 0; i < n; i++) {
        struct golden g;
        cr_assert_eq(golden_load(paths[i], &g), 0, "cannot read %s", paths[i]);
        char dir[1024];
        golden_make_model(&g, tmp, dir, sizeof dir);

        int total = 0;
        for (int c = 0; c < g.n_cases; c++)
            total += g.cases[c].n_tokens;
        struct golden_fixture f = {0};
        golden_fixture_open(&f, make, dir, mode, total);
        struct agreement a[3] = {{0}};
        for (int k = 0; k < 3; k++)
            a[k].rel_limit = tol->rel_logit;
        bool routed = f.model->config.n_experts > 0;
        run_prefill(&f, &g, &a[0]);
        run_incremental(&f, &g, &a[1]);
        run_batched(&f, &g, &a[2]);
        for (int k = 0; k < 3; k++) {
            double agree = (double)a[k].argmax_equal / (double)a[k].positions;
            cr_log_info("%s %s %s %s: %ld positions, argmax %.4f, worst |dlogit|/max|logit| %.2e at %s",
                        label, g.name, mode == COMPUTE_EXACT ? "exact" : "fast", run_names[k],
                        a[k].positions, agree,
                        a[k].worst_rel, a[k].worst_where);
            if (tol->min_argmax_agreement >= 1.0)
                cr_expect_geq(agree, 1.0, "%s: argmax agreement %.4f", g.name, agree);
            all_positions[k] += a[k].positions;
            all_equal[k] += a[k].argmax_equal;
            if (routed && tol->routed_share_over > 0) {
                double share = (double)a[k].over / (double)a[k].positions;
                cr_log_info("%s %s %s: %ld of %ld positions past %.0e (expert choices flipped at "
                            "router near-ties)", label, g.name, run_names[k], a[k].over,
                            a[k].positions, tol->rel_logit);
                cr_expect_leq(share, tol->routed_share_over,
                              "%s: %ld of %ld positions past relative logit error %.0e (worst "
                              "%.3e at %s)", g.name, a[k].over, a[k].positions, tol->rel_logit,
                              a[k].worst_rel, a[k].worst_where);
            } else {
                cr_expect_leq(a[k].worst_rel, tol->rel_logit,
                              "%s: worst relative logit error %.3e at %s", g.name, a[k].worst_rel,
                              a[k].worst_where);
            }
        }
        golden_fixture_close(&f);
        golden_free(&g);
    }
    for (int k = 0; k < 3; k++) {
        double agree = (double)all_equal[k] / (double)all_positions[k];
        cr_log_info("%s all goldens, %s %s: argmax agreement %.4f over %ld positions", label,
                    mode == COMPUTE_EXACT ? "exact" : "fast", run_names[k], agree,
                    all_positions[k]);
        cr_expect_geq(agree, tol->min_argmax_agreement, "%s: argmax agreement %.4f over %ld positions",
                      run_names[k], agree, all_positions[k]);
    }
    test_rmtree(tmp);
    free(tmp);
}

