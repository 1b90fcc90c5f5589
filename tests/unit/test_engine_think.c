/* tests/unit/test_engine_think.c — the engine's thinking steering (a forced <think> to open the
 * reply, a forced </think> once the thinking budget is spent) and which stop string ended a
 * generation. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "test_support.h"
#include "text/tokenizer.h"

static char *model_dir;
static struct backend *be;
static struct model *model;
static struct tokenizer *tok;
static int32_t think_id, end_think_id;

/* tiny-qwen3 fitted to the real Qwen3 tokenizer (fetched by `make text-data`), which has
 * <think> and </think>. */
static void setup(void)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set; run scripts/fetch-tokenizers.sh DIR and "
                     "export it");
    model_dir = test_mkdtemp();
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset tiny-qwen3 --seed 3 --tokenizer %s/qwen3 --out %s >/dev/null",
             INFERD_BINARY, data, model_dir);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &be, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(model_load(model_dir, be, &model, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(model_dir, &tok, &err), 0, "%s", err.msg);
    think_id = tok_piece_to_id(tok, "<think>");
    end_think_id = tok_piece_to_id(tok, "</think>");
    cr_assert(think_id >= 0 && end_think_id >= 0);
}

static void teardown(void)
{
    tok_free(tok);
    model_free(model);
    backend_destroy(be);
    if (model_dir)
        test_rmtree(model_dir);
    tok = NULL;
    model = NULL;
    be = NULL;
    model_dir = NULL;
}

TestSuite(engine_think, .init = setup, .fini = teardown, .timeout = 120);

static struct engine *start(void)
{
    struct engine_config cfg = {.n_ctx = 512, .max_seqs = 2, .max_step_tokens = 64,
                                .max_queue = 4};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

static struct gen_params greedy(const int32_t *prompt, int n, int max_tokens)
{
    return (struct gen_params){.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens,
                               .sampling = {.temperature = 0, .top_p = 1}, .logprobs = -1};
}

/* Runs p to its end; the generated ids into ids (cap entries), their count returned. */
static int run(struct engine *e, const struct gen_params *p, int32_t *ids, int cap,
               enum gen_finish *finish, int *stop_string)
{
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    int n = (int)o->n_ids < cap ? (int)o->n_ids : cap;
    memcpy(ids, o->ids.data, (size_t)n * sizeof *ids);
    if (finish)
        *finish = o->finish;
    if (stop_string)
        *stop_string = o->stop_string;
    pthread_mutex_unlock(&o->mu);
    gen_output_release(o);
    return n;
}

static int index_of(const int32_t *ids, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return i;
    return -1;
}

Test(engine_think, think_open_forces_the_reply_to_start_with_think)
{
    struct engine *e = start();
    int32_t prompt[] = {785, 6722, 315};
    int32_t ids[64];
    struct gen_params p = greedy(prompt, 3, 6);
    int n = run(e, &p, ids, 64, NULL, NULL);
    cr_assert_gt(n, 0);
    cr_assert_neq(ids[0], think_id, "the random model does not open <think> by itself");
    p.think_open = true;
    n = run(e, &p, ids, 64, NULL, NULL);
    cr_assert_eq(n, 6);
    cr_assert_eq(ids[0], think_id);
    engine_free(e);
}

Test(engine_think, the_budget_forces_end_of_thinking_after_that_many_tokens)
{
    struct engine *e = start();
    int32_t prompt[] = {785, 6722, 315};
    int32_t ids[64];
    struct gen_params p = greedy(prompt, 3, 20);
    p.think_open = true;
    int n = run(e, &p, ids, 64, NULL, NULL);
    cr_assert_eq(n, 20);
    cr_assert_eq(index_of(ids, n, end_think_id), -1, "without a budget the thinking goes on");
    p.think_budget = 5;
    n = run(e, &p, ids, 64, NULL, NULL);
    cr_assert_eq(n, 20);
    cr_assert_eq(ids[0], think_id);
    cr_assert_eq(ids[6], end_think_id, "<think>, 5 tokens of thinking, then </think>");
    cr_assert_eq(index_of(ids + 1, 5, end_think_id), -1);
    engine_free(e);
}

Test(engine_think, a_prompt_left_inside_think_counts_the_budget_from_its_first_token)
{
    struct engine *e = start();
    int32_t prompt[] = {785, 6722, 315, 0};
    prompt[3] = think_id; /* as a template that opens the reply's <think> leaves it */
    int32_t ids[64];
    struct gen_params p = greedy(prompt, 4, 12);
    p.think_open = true; /* already open: nothing forced first */
    p.think_budget = 3;
    int n = run(e, &p, ids, 64, NULL, NULL);
    cr_assert_eq(n, 12);
    cr_assert_neq(ids[0], think_id);
    cr_assert_eq(ids[3], end_think_id);
    engine_free(e);
}

Test(engine_think, a_prompt_whose_thinking_is_closed_is_not_steered_by_the_budget)
{
    struct engine *e = start();
    int32_t prompt[] = {785, 0, 0, 6722};
    prompt[1] = think_id;
    prompt[2] = end_think_id;
    int32_t plain[64], ids[64];
    struct gen_params p = greedy(prompt, 4, 10);
    int n0 = run(e, &p, plain, 64, NULL, NULL);
    p.think_budget = 2;
    int n = run(e, &p, ids, 64, NULL, NULL);
    cr_assert_eq(n, n0);
    cr_assert_eq(memcmp(ids, plain, (size_t)n * sizeof *ids), 0);
    engine_free(e);
}

Test(engine_think, the_output_names_the_stop_string_that_fired)
{
    struct engine *e = start();
    int32_t prompt[] = {785, 6722, 315};
    int32_t ids[64];
    struct gen_params p = greedy(prompt, 3, 30);
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
    cr_assert_gt(o->text.len, 4);
    cr_assert_eq(o->stop_string, 0);
    char stop[8];
    snprintf(stop, sizeof stop, "%.1s", o->text.data + o->text.len / 2);
    if ((unsigned char)stop[0] >= 0x80)
        snprintf(stop, sizeof stop, "%.1s", o->text.data); /* keep it one whole character */
    gen_output_release(o);
    const char *stops[] = {"\x01never", stop};
    p.stop = stops;
    p.n_stop = 2;
    enum gen_finish finish;
    int which = -1;
    run(e, &p, ids, 64, &finish, &which);
    cr_assert_eq(finish, GEN_FINISH_STOP);
    cr_assert_eq(which, 2, "1 + the index of the stop string that fired");
    engine_free(e);
}
