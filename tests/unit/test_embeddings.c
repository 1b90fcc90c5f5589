/* tests/unit/test_embeddings.c — embeddings: the last token's final-normed hidden state equals transformers' (tests/goldens/embeddings), the engine computes it beside generations with the same bits as a plain forward, and a directory's sentence-transformers files say how it pools. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "golden_support.h"
#include "kv/kv.h"
#include "model/model.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "tools/mkmodel.h"

static struct backend *make_cpu(void)
{
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &be, &err), 0, "%s",
                 err.msg);
    return be;
}

/* The final-normed hidden state of tokens' last position, through the paged
 * KV in one prefill. */
static void hidden_of(struct model *m, const int32_t *tokens, int n, float *out)
{
    struct err err = {0};
    struct kv_pool *pool = NULL;
    struct forward_state *st = NULL;
    int blocks = (n + 15) / 16;
    cr_assert_eq(kv_pool_create(m, m->backend, blocks, 16, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(m, n, &st, &err), 0, "%s", err.msg);
    uint32_t *ids = malloc((size_t)blocks * sizeof *ids);
    for (int b = 0; b < blocks; b++)
        ids[b] = (uint32_t)b;
    struct batch_seq seq = {tokens, n, 0, ids, blocks, false, true, out, NULL, 0};
    cr_assert_eq(batch_n_outputs(&(struct batch){&seq, 1}), 0);
    cr_assert_eq(model_forward(m, st, &pool->cache, &(struct batch){&seq, 1}, NULL, &err), 0, "%s",
                 err.msg);
    free(ids);
    forward_state_free(st);
    kv_pool_free(pool);
}

Test(embeddings, last_token_state_matches_transformers)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/embeddings/tiny-qwen3.json", golden_dir());
    json_object *root = json_object_from_file(path);
    if (!root)
        cr_skip_test("%s is absent: make it with tools/make_goldens.py --embed-presets tiny-qwen3 "
                     "(tests/goldens/README.md)",
                     path);
    struct err err = {0};
    char *dir = test_mkdtemp();
    struct mkmodel_opts o = {.preset = json_object_get_string(json_object_object_get(root, "model")),
                             .seed = 1, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    char fnv[32];
    cr_assert_eq(mkmodel_file_fnv1a64(dir, "model.safetensors", fnv, sizeof fnv, &err), 0);
    cr_assert_str_eq(fnv, json_object_get_string(json_object_object_get(root, "safetensors_fnv1a64")),
                     "the model is not the one the golden was made from");
    struct backend *be = make_cpu();
    struct model *m = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    int hidden = m->config.hidden_size;
    json_object *cases = json_object_object_get(root, "cases");
    float *h = malloc((size_t)hidden * sizeof *h);
    for (size_t c = 0; c < json_object_array_length(cases); c++) {
        json_object *jc = json_object_array_get_idx(cases, c);
        json_object *jt = json_object_object_get(jc, "tokens"), *je = json_object_object_get(jc, "embedding");
        int n = (int)json_object_array_length(jt);
        int32_t *tokens = malloc((size_t)n * sizeof *tokens);
        for (int i = 0; i < n; i++)
            tokens[i] = json_object_get_int(json_object_array_get_idx(jt, (size_t)i));
        cr_assert_eq((int)json_object_array_length(je), hidden);
        hidden_of(m, tokens, n, h);
        double ss = 0;
        for (int i = 0; i < hidden; i++)
            ss += (double)h[i] * h[i];
        double worst = 0;
        for (int i = 0; i < hidden; i++) {
            double want = json_object_get_double(json_object_array_get_idx(je, (size_t)i));
            double d = fabs(h[i] / sqrt(ss) - want);
            worst = d > worst ? d : worst;
        }
        cr_log_info("embedding case %zu (%d tokens): worst |delta| %.2e", c, n, worst);
        cr_expect_leq(worst, 1e-3, "case %zu: |delta| %.2e", c, worst);
        free(tokens);
    }
    free(h);
    model_free(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
    json_object_put(root);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(test_write_file(path, text, strlen(text)), 0, "%s", path);
}

Test(embeddings, sentence_transformers_files_declare_the_pooling)
{
    char *dir = test_mkdtemp();
    struct model_embedding e;
    struct err err = {0};
    cr_assert_eq(model_embedding_load(dir, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(e.pooling, MODEL_POOLING_DEFAULT, "no modules.json: the default");
    write_text(dir, "modules.json",
               "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
               "\"sentence_transformers.models.Transformer\"}, {\"idx\": 1, \"name\": \"1\", "
               "\"path\": \"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"}, "
               "{\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": "
               "\"sentence_transformers.models.Normalize\"}]");
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    cr_assert_eq(mkdir(sub, 0755), 0);
    write_text(dir, "1_Pooling/config.json",
               "{\"word_embedding_dimension\": 1024, \"pooling_mode_cls_token\": false, "
               "\"pooling_mode_mean_tokens\": false, \"pooling_mode_lasttoken\": true}");
    cr_assert_eq(model_embedding_load(dir, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(e.pooling, MODEL_POOLING_LAST_TOKEN);
    cr_assert_str_eq(e.mode, "lasttoken");
    cr_assert(e.normalize);
    write_text(dir, "1_Pooling/config.json",
               "{\"pooling_mode_mean_tokens\": true, \"pooling_mode_lasttoken\": false}");
    cr_assert_eq(model_embedding_load(dir, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(e.pooling, MODEL_POOLING_OTHER);
    cr_assert_str_eq(e.mode, "mean_tokens");
    write_text(dir, "1_Pooling/config.json", "{not json");
    cr_assert_lt(model_embedding_load(dir, &e, &err), 0);
    cr_assert(strstr(err.msg, "1_Pooling/config.json"), "%s", err.msg);
    test_rmtree(dir);
    free(dir);
}

static void wait_done(struct gen_output *o)
{
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
}

/* An embedding request runs through the engine in prefill chunks beside a
 * generation, and its vector has the bits of one plain prefill (EXACT mode
 * is batch invariant); a prompt may fill the whole context, one more token
 * is refused. */
Test(embeddings, engine_embeds_beside_generations_with_the_bits_of_a_plain_forward, .timeout = 120)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    char *dir = test_mkdtemp();
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset tiny-qwen3 --seed 3 --tokenizer %s/qwen3 --out %s >/dev/null",
             INFERD_BINARY, data, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    struct err err = {0};
    struct backend *be = make_cpu();
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    enum { N_CTX = 96 };
    struct engine_config cfg = {.n_ctx = N_CTX, .max_seqs = 4, .max_step_tokens = 16,
                                .max_queue = 8, .kv_blocks = 32, .prompt_cache_bytes = 1 << 20};
    int32_t prompt[N_CTX + 1], gen_prompt[20];
    for (int i = 0; i <= N_CTX; i++)
        prompt[i] = (int32_t)((i * 131 + 17) % 5000);
    /* before the engine thread drives the backend */
    float *want = malloc((size_t)m->config.hidden_size * sizeof *want);
    hidden_of(m, prompt, 41, want);
    struct engine *e = NULL;
    cr_assert_eq(engine_create(m, tok, &cfg, &e, &err), 0, "%s", err.msg);
    for (int i = 0; i < 20; i++)
        gen_prompt[i] = (int32_t)((i * 71 + 3) % 5000);
    struct gen_params gp = {.prompt = gen_prompt, .n_prompt = 20, .max_tokens = 30,
                            .sampling = {.temperature = 0, .top_p = 1}, .logprobs = -1};
    struct gen_params ep = {.prompt = prompt, .n_prompt = 41, .max_tokens = 1,
                            .sampling = {.temperature = 0, .top_p = 1}, .logprobs = -1,
                            .embed = true};
    struct gen_output *go = NULL, *eo = NULL, *full = NULL;
    cr_assert_eq(engine_submit(e, &gp, &go, &err), 0, "%s", err.msg);
    cr_assert_eq(engine_submit(e, &ep, &eo, &err), 0, "%s", err.msg);
    wait_done(eo);
    cr_assert_eq(eo->finish, GEN_FINISH_STOP, "%s", eo->error);
    cr_assert_eq(eo->n_embedding, m->config.hidden_size);
    cr_assert_eq(eo->n_generated, 0);
    cr_expect_eq(memcmp(want, eo->embedding, (size_t)m->config.hidden_size * sizeof(float)), 0,
                 "the engine's embedding differs from a plain forward");
    /* the whole context is allowed; one position more is not */
    ep.n_prompt = N_CTX;
    cr_assert_eq(engine_submit(e, &ep, &full, &err), 0, "%s", err.msg);
    wait_done(full);
    cr_assert_eq(full->finish, GEN_FINISH_STOP, "%s", full->error);
    ep.n_prompt = N_CTX + 1;
    struct gen_output *over = NULL;
    cr_assert_eq(engine_submit(e, &ep, &over, &err), -INFERD_ERANGE);
    wait_done(go);
    cr_assert_gt(go->n_generated, 0, "the generation beside them ran");
    gen_output_release(go);
    gen_output_release(eo);
    gen_output_release(full);
    engine_free(e);
    free(want);
    tok_free(tok);
    model_free(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}
