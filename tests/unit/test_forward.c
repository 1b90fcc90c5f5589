/* tests/unit/test_forward.c — the forward step refuses malformed batches with clear errors, and chunking a prompt does not change its logits. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "kv/kv.h"
#include "tools/mkmodel.h"
#include "model/model.h"
#include "test_support.h"

static char *tmp;
static struct backend *be;
static struct model *model;
static struct kv_pool *pool;
static struct forward_state *state;
static float *logits;

static void setup(void)
{
    struct err err = {0};
    tmp = test_mkdtemp();
    cr_assert_not_null(tmp);
    struct mkmodel_opts opts = {.preset = "tiny-qwen3", .seed = 3, .out_dir = tmp};
    cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(tmp, be, &model, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_pool_create(model, be, 16, 16, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(model, 64, &state, &err), 0, "%s", err.msg);
    logits = malloc(64 * (size_t)model->config.vocab_size * sizeof(float));
}

static void teardown(void)
{
    free(logits);
    forward_state_free(state);
    kv_pool_free(pool);
    model_free(model);
    backend_destroy(be);
    test_rmtree(tmp);
    free(tmp);
}

TestSuite(forward, .init = setup, .fini = teardown);

static int forward_one(const int32_t *tokens, int n, int pos0, const uint32_t *blocks, int n_blocks,
                       struct err *err)
{
    struct batch_seq seq = {tokens, n, pos0, blocks, n_blocks, false, false, NULL, NULL, 0};
    struct batch batch = {&seq, 1};
    return model_forward(model, state, &pool->cache, &batch, logits, err);
}

Test(forward, token_outside_the_vocabulary_is_refused)
{
    struct err err = {0};
    uint32_t blocks[1] = {0};
    int32_t bad[2] = {3, 100000};
    cr_assert_eq(forward_one(bad, 2, 0, blocks, 1, &err), -INFERD_EINVAL);
    cr_assert(strstr(err.msg, "100000"), "%s", err.msg);
    int32_t negative[1] = {-1};
    cr_assert_eq(forward_one(negative, 1, 0, blocks, 1, &err), -INFERD_EINVAL);
}

Test(forward, block_table_too_short_for_the_positions_is_refused)
{
    struct err err = {0};
    uint32_t blocks[1] = {0};
    int32_t tokens[4] = {1, 2, 3, 4};
    cr_assert_eq(forward_one(tokens, 4, 14, blocks, 1, &err), -INFERD_EINVAL);
    cr_assert(strstr(err.msg, "block table"), "%s", err.msg);
    uint32_t outside[1] = {999};
    cr_assert_eq(forward_one(tokens, 4, 0, outside, 1, &err), -INFERD_EINVAL);
}

Test(forward, more_tokens_than_the_state_holds_is_refused)
{
    struct err err = {0};
    int32_t tokens[65] = {0};
    uint32_t blocks[5] = {0, 1, 2, 3, 4};
    cr_assert_eq(forward_one(tokens, 65, 0, blocks, 5, &err), -INFERD_ERANGE);
    struct batch empty = {NULL, 0};
    cr_assert_eq(model_forward(model, state, &pool->cache, &empty, logits, &err), -INFERD_EINVAL);
}

/* A prompt fed in chunks of 7 predicts the same next token, with the same
 * logits to f32 rounding, as the prompt fed in one step. */
Test(forward, chunked_prefill_equals_one_shot_prefill)
{
    struct err err = {0};
    int vocab = model->config.vocab_size;
    int32_t prompt[50];
    for (int i = 0; i < 50; i++)
        prompt[i] = (i * 37 + 11) % vocab;
    struct generator *one, *chunked;
    cr_assert_eq(generator_create(model, 128, 64, &one, &err), 0, "%s", err.msg);
    cr_assert_eq(generator_create(model, 128, 7, &chunked, &err), 0, "%s", err.msg);
    cr_assert_eq(generator_feed(one, prompt, 50, &err), 0, "%s", err.msg);
    cr_assert_eq(generator_feed(chunked, prompt, 50, &err), 0, "%s", err.msg);
    double worst = 0, max_abs = 0;
    for (int v = 0; v < vocab; v++) {
        worst = fmax(worst, fabs(one->logits[v] - chunked->logits[v]));
        max_abs = fmax(max_abs, fabs(one->logits[v]));
    }
    cr_assert_leq(worst, 1e-4 * max_abs, "chunked prefill differs by %g (max |logit| %g)", worst, max_abs);
    cr_assert_eq(generator_feed(one, prompt, 100, &err), -INFERD_ERANGE, "context overflow must be refused");
    generator_free(one);
    generator_free(chunked);
}

/* head_rows: each row's first head_rows logits are the full head's (the same matrix rows, the
 * same bits), the rest of the row is left as it was, and a head_rows of zero or past the
 * vocabulary is the whole head. */
Test(forward, a_head_of_the_first_rows_gives_those_logits_and_leaves_the_rest)
{
    struct err err = {0};
    int vocab = model->config.vocab_size, keep = vocab / 4 + 3;
    int32_t tokens[5] = {5, 17, 2, 40, 9};
    uint32_t blocks[1] = {0};
    /* every row's logits: 5 rows */
    struct batch_seq seq = {tokens, 5, 0, blocks, 1, true, false, NULL, NULL, 0};
    struct batch batch = {&seq, 1};
    size_t n = 5 * (size_t)vocab;
    float *full = malloc(n * sizeof *full), *part = malloc(n * sizeof *part);
    cr_assert(full && part);
    cr_assert_eq(model_forward(model, state, &pool->cache, &batch, full, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < n; i++)
        part[i] = -12345.0f;
    struct forward_output out = {.host_rows = part, .head_rows = keep};
    cr_assert_eq(model_forward_sampled(model, state, &pool->cache, &batch, &out, &err), 0, "%s",
                 err.msg);
    for (int r = 0; r < 5; r++)
        for (int v = 0; v < vocab; v++) {
            float got = part[(size_t)r * vocab + v];
            if (v < keep)
                cr_assert(!memcmp(&got, &full[(size_t)r * vocab + v], sizeof got),
                          "row %d logit %d: %.9g, the whole head's %.9g", r, v, got,
                          full[(size_t)r * vocab + v]);
            else
                cr_assert_eq(got, -12345.0f, "row %d logit %d past the head's rows was written",
                             r, v);
        }
    int whole[2] = {0, vocab + 10};
    for (int i = 0; i < 2; i++) {
        out.head_rows = whole[i];
        cr_assert_eq(model_forward_sampled(model, state, &pool->cache, &batch, &out, &err), 0,
                     "%s", err.msg);
        cr_assert(!memcmp(part, full, n * sizeof *part), "head_rows %d is not the whole head",
                  whole[i]);
    }
    free(full);
    free(part);
}
