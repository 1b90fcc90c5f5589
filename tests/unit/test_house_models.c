/* tests/unit/test_house_models.c — the shipped house models (models/house, models/house-draft) against
 * their transformers golden (tests/goldens/house): our tokenizer gives the same ids on the held-out
 * text, the CPU engine in exact mode gives the same held-out perplexity within 0.5%, and the draft's
 * greedy next token equals the main model's on at least half of the held-out positions. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "model/model.h"
#include "test_support.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#define BLOCK_SIZE 16
/* Every WINDOW_STRIDE-th window of the golden (0, 10, 20, ...): 19 of its 186 windows, about 5k
 * tokens from all four sources, keeps this file under a minute on two cores. */
#define WINDOW_STRIDE 10

/* INFERD_HOUSE_WINDOW_STRIDE=1 measures every window (what models/house/README.md reports). */
static int window_stride(void)
{
    const char *env = getenv("INFERD_HOUSE_WINDOW_STRIDE");
    int s = env && *env ? atoi(env) : WINDOW_STRIDE;
    return s > 0 ? s : WINDOW_STRIDE;
}
#define MAX_PPL_REL_DIFF 0.005
#define MIN_DRAFT_AGREEMENT 0.5

static const char *golden_dir(void)
{
    const char *env = getenv("INFERD_GOLDEN_DIR");
    return env && *env ? env : INFERD_SOURCE_DIR "/tests/goldens";
}

struct window_golden {
    double nll_house, nll_draft; /* sums over the window's predicted tokens */
    int agree;                   /* positions where the two models' argmax are equal */
};

struct house_golden {
    int window, n_windows, n_tokens;
    int32_t *tokens;             /* owned; n_tokens: transformers' tokenizer on heldout.txt */
    struct window_golden *wins;  /* owned; n_windows */
    double ppl_house, ppl_draft, agreement; /* over all windows */
};

static void load_golden(struct house_golden *g)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/house/perplexity.json", golden_dir());
    json_object *root = json_object_from_file(path);
    cr_assert_not_null(root, "cannot read %s", path);
    memset(g, 0, sizeof *g);
    g->window = json_object_get_int(json_object_object_get(root, "window"));
    g->n_windows = json_object_get_int(json_object_object_get(root, "n_windows"));
    g->ppl_house = json_object_get_double(json_object_object_get(root, "ppl_house"));
    g->ppl_draft = json_object_get_double(json_object_object_get(root, "ppl_house_draft"));
    g->agreement = json_object_get_double(json_object_object_get(root, "greedy_agreement"));
    json_object *toks = json_object_object_get(root, "tokens");
    json_object *wins = json_object_object_get(root, "windows_stats");
    g->n_tokens = (int)json_object_array_length(toks);
    cr_assert_eq((int)json_object_array_length(wins), g->n_windows);
    cr_assert_eq(g->n_windows, g->n_tokens / g->window, "windows are the stream cut in %d-token pieces",
                 g->window);
    g->tokens = malloc((size_t)g->n_tokens * sizeof *g->tokens);
    g->wins = calloc((size_t)g->n_windows, sizeof *g->wins);
    for (int i = 0; i < g->n_tokens; i++)
        g->tokens[i] = json_object_get_int(json_object_array_get_idx(toks, i));
    for (int i = 0; i < g->n_windows; i++) {
        json_object *w = json_object_array_get_idx(wins, i);
        g->wins[i].nll_house = json_object_get_double(json_object_object_get(w, "nll_house"));
        g->wins[i].nll_draft = json_object_get_double(json_object_object_get(w, "nll_house_draft"));
        g->wins[i].agree = json_object_get_int(json_object_object_get(w, "agree"));
    }
    json_object_put(root);
}

static void free_golden(struct house_golden *g)
{
    free(g->tokens);
    free(g->wins);
}

/* One model in exact mode (f32 activations), with room for one window. */
struct runner {
    struct backend *be;
    struct model *model;
    struct kv_pool *pool;
    struct forward_state *state;
    float *logits; /* owned; window x vocab */
};

static void runner_open(struct runner *r, const char *name, int window)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", INFERD_SOURCE_DIR, name);
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &r->be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, r->be, &r->model, &err), 0, "%s: %s", dir, err.msg);
    int blocks = (window + BLOCK_SIZE - 1) / BLOCK_SIZE;
    cr_assert_eq(kv_pool_create(r->model, r->be, blocks, BLOCK_SIZE, &r->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(r->model, window, &r->state, &err), 0, "%s", err.msg);
    r->logits = malloc((size_t)window * r->model->config.vocab_size * sizeof(float));
    cr_assert_not_null(r->logits);
}

static void runner_close(struct runner *r)
{
    free(r->logits);
    forward_state_free(r->state);
    kv_pool_free(r->pool);
    model_free(r->model);
    backend_destroy(r->be);
}

/* Runs one window from position 0 (no earlier context, as transformers did). Returns the sum of
 * -log p(tokens[i+1] | tokens[0..i]) over i < n-1, and writes each position's argmax. */
static double runner_window(struct runner *r, const int32_t *tokens, int n, int32_t *argmax)
{
    struct err err = {0};
    int vocab = r->model->config.vocab_size;
    struct block_table bt;
    block_table_init(&bt);
    cr_assert_eq(block_table_reserve(r->pool, &bt, n, &err), 0, "%s", err.msg);
    struct batch_seq seq = {.tokens = tokens, .n_tokens = n, .pos0 = 0, .block_ids = bt.blocks,
                            .n_block_ids = bt.n_blocks, .all_logits = true};
    struct batch batch = {&seq, 1};
    cr_assert_eq(model_forward(r->model, r->state, &r->pool->cache, &batch, r->logits, &err), 0,
                 "%s", err.msg);
    double nll = 0;
    for (int i = 0; i < n; i++) {
        const float *row = r->logits + (size_t)i * vocab;
        int best = 0;
        for (int v = 1; v < vocab; v++)
            if (row[v] > row[best])
                best = v;
        argmax[i] = best;
        if (i == n - 1)
            break;
        double sum = 0;
        for (int v = 0; v < vocab; v++)
            sum += exp((double)row[v] - row[best]);
        nll += row[best] + log(sum) - row[tokens[i + 1]];
    }
    block_table_clear(r->pool, &bt);
    return nll;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

Test(house_models, tokenizer_encodes_heldout_text_as_transformers_does, .timeout = 120)
{
    struct house_golden g;
    load_golden(&g);
    char path[1024];
    snprintf(path, sizeof path, "%s/house/heldout.txt", golden_dir());
    size_t len = 0;
    char *text = test_read_file(path, &len);
    cr_assert_not_null(text, "cannot read %s", path);
    struct tokenizer *tok = NULL;
    struct err err = {0};
    cr_assert_eq(tok_load(INFERD_SOURCE_DIR "/models/house", &tok, &err), 0, "%s", err.msg);
    int32_t *ids = NULL;
    int n = 0;
    cr_assert_eq(tok_encode(tok, text, len, true, &ids, &n, &err), 0, "%s", err.msg);
    int first_diff = -1;
    for (int i = 0; i < n && i < g.n_tokens && first_diff < 0; i++)
        if (ids[i] != g.tokens[i])
            first_diff = i;
    cr_expect_eq(first_diff, -1, "first different id at token %d: ours %d, transformers %d", first_diff,
                 first_diff >= 0 ? ids[first_diff] : 0, first_diff >= 0 ? g.tokens[first_diff] : 0);
    cr_expect_eq(n, g.n_tokens, "ours: %d tokens, transformers: %d", n, g.n_tokens);
    cr_log_info("house tokenizer: %d held-out tokens, all equal to transformers'", n);

    /* The chat turn markers are single special tokens, as the chat template relies on. */
    cr_expect_eq(tok_piece_to_id(tok, "<|endoftext|>"), 0);
    cr_expect_eq(tok_piece_to_id(tok, "<|im_start|>"), 1);
    cr_expect_eq(tok_piece_to_id(tok, "<|im_end|>"), 2);
    cr_expect_str_eq(tok_eos_token(tok), "<|im_end|>");
    free(ids);
    free(text);
    tok_free(tok);
    free_golden(&g);
}

Test(house_models, chat_template_renders_chatml_turns_the_model_was_trained_on)
{
    struct tokenizer *tok = NULL;
    struct err err = {0};
    cr_assert_eq(tok_load(INFERD_SOURCE_DIR "/models/house-draft", &tok, &err), 0, "%s", err.msg);
    struct chat_template ct;
    cr_assert_eq(chat_template_load(tok, &ct, &err), 0, "%s", err.msg);
    json_object *messages = json_tokener_parse(
        "[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
        " {\"role\": \"user\", \"content\": \"In the beginning\"}]");
    cr_assert_not_null(messages);
    char *out = NULL;
    size_t len = 0;
    cr_assert_eq(chat_template_render(&ct, messages, NULL, true, NULL, &out, &len, &err), 0, "%s",
                 err.msg);
    cr_expect_str_eq(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                          "<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\n");
    int32_t *ids = NULL;
    int n = 0;
    cr_assert_eq(tok_encode(tok, out, len, false, &ids, &n, &err), 0, "%s", err.msg);
    int starts = 0, ends = 0;
    for (int i = 0; i < n; i++) {
        starts += ids[i] == 1;
        ends += ids[i] == 2;
    }
    cr_expect_eq(ids[0], 1, "the rendered prompt starts with <|im_start|>");
    cr_expect(starts == 3 && ends == 2, "%d <|im_start|> and %d <|im_end|> tokens (want 3 and 2)",
              starts, ends);
    free(ids);
    free(out);
    json_object_put(messages);
    chat_template_free(&ct);
    tok_free(tok);
}

/* Perplexity of both models over the chosen windows, and the draft's greedy agreement with the main
 * model there; the golden's figures over the same windows, for comparison. */
struct measured {
    double ppl_house, ppl_draft, agreement;          /* ours */
    double g_ppl_house, g_ppl_draft, g_agreement;    /* transformers, same windows */
    int windows, predicted, positions;
    double seconds;
};

static void measure(struct measured *m)
{
    struct house_golden g;
    load_golden(&g);
    struct runner house, draft;
    runner_open(&house, "house", g.window);
    runner_open(&draft, "house-draft", g.window);
    int32_t *am_house = malloc((size_t)g.window * sizeof(int32_t));
    int32_t *am_draft = malloc((size_t)g.window * sizeof(int32_t));
    double nll_h = 0, nll_d = 0, g_nll_h = 0, g_nll_d = 0;
    long agree = 0, g_agree = 0;
    memset(m, 0, sizeof *m);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int stride = window_stride();
    for (int w = 0; w < g.n_windows; w += stride) {
        const int32_t *toks = g.tokens + (size_t)w * g.window;
        nll_h += runner_window(&house, toks, g.window, am_house);
        nll_d += runner_window(&draft, toks, g.window, am_draft);
        for (int i = 0; i < g.window; i++)
            agree += am_house[i] == am_draft[i];
        g_nll_h += g.wins[w].nll_house;
        g_nll_d += g.wins[w].nll_draft;
        g_agree += g.wins[w].agree;
        m->windows++;
    }
    m->seconds = seconds_since(&t0);
    m->predicted = m->windows * (g.window - 1);
    m->positions = m->windows * g.window;
    m->ppl_house = exp(nll_h / m->predicted);
    m->ppl_draft = exp(nll_d / m->predicted);
    m->agreement = (double)agree / m->positions;
    m->g_ppl_house = exp(g_nll_h / m->predicted);
    m->g_ppl_draft = exp(g_nll_d / m->predicted);
    m->g_agreement = (double)g_agree / m->positions;
    cr_log_info("house held-out, %d windows of %d (every %d-th of %d), %.1f s: perplexity house %.4f "
                "(transformers %.4f), house-draft %.4f (transformers %.4f); draft greedy agreement "
                "%.4f (transformers %.4f). Over all windows transformers gives %.4f, %.4f and %.4f.",
                m->windows, g.window, stride, g.n_windows, m->seconds, m->ppl_house,
                m->g_ppl_house, m->ppl_draft, m->g_ppl_draft, m->agreement, m->g_agreement,
                g.ppl_house, g.ppl_draft, g.agreement);
    free(am_house);
    free(am_draft);
    runner_close(&house);
    runner_close(&draft);
    free_golden(&g);
}

Test(house_models, engine_reproduces_transformers_heldout_perplexity_within_half_a_percent,
     .timeout = 300)
{
    struct measured m;
    measure(&m);
    double rel_h = fabs(m.ppl_house / m.g_ppl_house - 1);
    double rel_d = fabs(m.ppl_draft / m.g_ppl_draft - 1);
    cr_log_info("relative difference: house %.2e, house-draft %.2e", rel_h, rel_d);
    cr_expect_leq(rel_h, MAX_PPL_REL_DIFF, "house: perplexity %.4f, transformers %.4f", m.ppl_house,
                  m.g_ppl_house);
    cr_expect_leq(rel_d, MAX_PPL_REL_DIFF, "house-draft: perplexity %.4f, transformers %.4f",
                  m.ppl_draft, m.g_ppl_draft);
    /* A model that learned nothing scores about the vocabulary size (8192); these learned English. */
    cr_expect_lt(m.ppl_house, 100.0);
    cr_expect_lt(m.ppl_draft, 100.0);
}

Test(house_models, draft_greedy_token_equals_main_models_on_half_the_heldout_positions,
     .timeout = 300)
{
    struct measured m;
    measure(&m);
    cr_log_info("draft acceptance (greedy agreement): %.4f over %d positions", m.agreement, m.positions);
    cr_expect_geq(m.agreement, MIN_DRAFT_AGREEMENT, "draft agrees with house on %.4f of positions",
                  m.agreement);
}
