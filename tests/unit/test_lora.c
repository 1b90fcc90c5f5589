/* tests/unit/test_lora.c — PEFT LoRA adapters: the unmerged per-row path equals the weights with B·A merged in (every tiny architecture), a mixed batch gives each row the bits it gets alone, the prefix cache never crosses adapters, and malformed adapters are refused by name. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "base/bf16.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/lora.h"
#include "model/model.h"
#include "golden_support.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "tools/mklora.h"
#include "tools/mkmodel.h"

#define PROMPT 13
#define BLOCK 16

struct rig {
    char *dir;
    struct backend *be;
    struct model *m;
    struct kv_pool *pool;
    struct forward_state *st;
};

/* An f32 KV cache in either mode: the comparisons below are of adapter paths, and an f16
 * cache would round the two paths' K/V (equal to float rounding) to f16 values an ulp apart. */
static void rig_open_mode(struct rig *r, const char *dir, enum compute_mode mode)
{
    struct err err = {0};
    r->dir = NULL;
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode, .threads = 2,
                                                              .kv_type = BACKEND_KV_F32},
                                    &r->be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, r->be, &r->m, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_pool_create(r->m, r->be, 32, BLOCK, &r->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(r->m, 128, &r->st, &err), 0, "%s", err.msg);
}

static void rig_open(struct rig *r, const char *dir)
{
    rig_open_mode(r, dir, COMPUTE_EXACT);
}

static void rig_close(struct rig *r)
{
    forward_state_free(r->st);
    kv_pool_free(r->pool);
    model_free(r->m);
    backend_destroy(r->be);
}

static void prompt_of(int32_t *t, int n, int vocab, int salt)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)((i * 37 + salt * 11 + 5) % vocab);
}

/* Logits of every prompt position (n x vocab, caller frees), in blocks from block0. */
static float *run_prompt(struct rig *r, const int32_t *tokens, int n, uint32_t block0,
                         struct lora_adapter *const *ad, int n_ad)
{
    uint32_t blocks[4] = {block0, block0 + 1, block0 + 2, block0 + 3};
    float *logits = malloc((size_t)n * (size_t)r->m->config.vocab_size * sizeof(float));
    struct batch_seq seq = {.tokens = tokens, .n_tokens = n, .pos0 = 0, .block_ids = blocks,
                            .n_block_ids = 4, .all_logits = true,
                            .adapters = (const struct lora_adapter *const *)ad, .n_adapters = n_ad};
    struct batch b = {&seq, 1};
    struct err err = {0};
    cr_assert_eq(model_forward(r->m, r->st, &r->pool->cache, &b, logits, &err), 0, "%s", err.msg);
    return logits;
}

static void write_model(const char *preset, const char *dir)
{
    struct err err = {0};
    struct mkmodel_opts o = {.preset = preset, .seed = 5, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s: %s", preset, err.msg);
}

static void write_adapter(const char *model_dir, const char *out, const char *targets, int rank,
                          uint64_t seed, bool rslora)
{
    struct err err = {0};
    struct mklora_opts o = {.model_dir = model_dir, .out_dir = out, .rank = rank, .alpha = 16,
                            .targets = targets, .seed = seed, .rslora = rslora};
    cr_assert_eq(mklora_write(&o, &err), 0, "%s", err.msg);
}

/* ---- the unmerged path equals the merged weights ----------------------- */

Test(lora, unmerged_path_equals_merged_weights_on_every_tiny_architecture, .timeout = 240)
{
    int n;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].real)
            continue;
        char *tmp = test_mkdtemp();
        char mdir[512], adir[512];
        snprintf(mdir, sizeof mdir, "%s/model", tmp);
        snprintf(adir, sizeof adir, "%s/adapter", tmp);
        write_model(p[i].name, mdir);
        /* every projection, rsLoRA on every other preset */
        write_adapter(mdir, adir, NULL, 8, 11 + (uint64_t)i, i % 2 == 1);

        struct rig lo, merged;
        rig_open(&lo, mdir);
        rig_open(&merged, mdir);
        struct err err = {0};
        struct lora_adapter *a = NULL;
        cr_assert_eq(lora_load(lo.m, adir, &a, &err), 0, "%s: %s", p[i].name, err.msg);
        struct lora_adapter *am = NULL;
        cr_assert_eq(lora_load(merged.m, adir, &am, &err), 0, "%s", err.msg);
        cr_assert_eq(lora_merge(merged.m, am, &err), 0, "%s: %s", p[i].name, err.msg);
        lora_release(am);

        int vocab = lo.m->config.vocab_size;
        int32_t toks[PROMPT];
        prompt_of(toks, PROMPT, vocab, i);
        float *got = run_prompt(&lo, toks, PROMPT, 0, &a, 1);
        float *want = run_prompt(&merged, toks, PROMPT, 0, NULL, 0);
        float *base = run_prompt(&lo, toks, PROMPT, 8, NULL, 0);
        double max_diff = 0, max_abs = 0, max_change = 0;
        for (size_t k = 0; k < (size_t)PROMPT * (size_t)vocab; k++) {
            max_diff = fmax(max_diff, fabs((double)got[k] - want[k]));
            max_abs = fmax(max_abs, fabs((double)want[k]));
            max_change = fmax(max_change, fabs((double)base[k] - want[k]));
        }
        cr_expect_leq(max_diff, 1e-5 * max_abs, "%s: adapter path %g from the merged weights (|logits| %g)",
                      p[i].name, max_diff, max_abs);
        cr_expect_geq(max_change, 1e-2 * max_abs, "%s: the adapter barely changes the logits (%g)",
                      p[i].name, max_change);
        free(got);
        free(want);
        free(base);
        lora_release(a);
        rig_close(&lo);
        rig_close(&merged);
        test_rmtree(tmp);
        free(tmp);
        checked++;
    }
    cr_assert_geq(checked, 8);
}

/* FAST mode over bf16 weights keeps A and B in bf16 (half the bytes); the merged reference
 * is built from the same rounded values, so the unmerged path still equals it (within FAST's
 * own rounding of the projections' inputs). EXACT keeps f32. */
Test(lora, fast_mode_keeps_bf16_adapters_that_equal_their_merged_values, .timeout = 120)
{
    char *tmp = test_mkdtemp();
    char mdir[512], adir[512];
    snprintf(mdir, sizeof mdir, "%s/model", tmp);
    snprintf(adir, sizeof adir, "%s/adapter", tmp);
    write_model("tiny-llama", mdir);
    write_adapter(mdir, adir, NULL, 8, 5, false);
    struct rig exact, lo, merged;
    rig_open(&exact, mdir);
    rig_open_mode(&lo, mdir, COMPUTE_FAST);
    rig_open_mode(&merged, mdir, COMPUTE_FAST);
    struct err err = {0};
    struct lora_adapter *ae = NULL, *a = NULL, *am = NULL;
    cr_assert_eq(lora_load(exact.m, adir, &ae, &err), 0, "%s", err.msg);
    cr_assert_eq(lora_load(lo.m, adir, &a, &err), 0, "%s", err.msg);
    cr_assert_not(ae->bf16);
    cr_assert(a->bf16);
    cr_expect_eq(a->ram_bytes * 2, ae->ram_bytes);
    cr_expect_neq(a->digest, ae->digest, "the rounded adapter is another cache namespace");
    cr_assert_eq(lora_load(merged.m, adir, &am, &err), 0, "%s", err.msg);
    cr_assert_eq(lora_merge(merged.m, am, &err), 0, "%s", err.msg);
    lora_release(am);
    int vocab = lo.m->config.vocab_size;
    int32_t toks[PROMPT];
    prompt_of(toks, PROMPT, vocab, 3);
    float *got = run_prompt(&lo, toks, PROMPT, 0, &a, 1);
    float *want = run_prompt(&merged, toks, PROMPT, 0, NULL, 0);
    float *base = run_prompt(&lo, toks, PROMPT, 8, NULL, 0);
    double max_diff = 0, max_abs = 0, max_change = 0;
    for (size_t k = 0; k < (size_t)PROMPT * (size_t)vocab; k++) {
        max_diff = fmax(max_diff, fabs((double)got[k] - want[k]));
        max_abs = fmax(max_abs, fabs((double)want[k]));
        max_change = fmax(max_change, fabs((double)base[k] - want[k]));
    }
    cr_expect_leq(max_diff, 5e-3 * max_abs, "bf16 adapter path %g from its merged values (|logits| %g)",
                  max_diff, max_abs);
    cr_expect_geq(max_change, 1e-2 * max_abs, "the adapter barely changes the logits (%g)", max_change);
    free(got);
    free(want);
    free(base);
    lora_release(a);
    lora_release(ae);
    rig_close(&exact);
    rig_close(&lo);
    rig_close(&merged);
    test_rmtree(tmp);
    free(tmp);
}

/* ---- a mixed batch: each row as alone ----------------------------------- */

Test(lora, mixed_batch_gives_each_sequence_the_bits_it_gets_alone, .timeout = 120)
{
    char *tmp = test_mkdtemp();
    char mdir[512], a1dir[512], a2dir[512];
    snprintf(mdir, sizeof mdir, "%s/model", tmp);
    snprintf(a1dir, sizeof a1dir, "%s/a1", tmp);
    snprintf(a2dir, sizeof a2dir, "%s/a2", tmp);
    write_model("tiny-llama", mdir);
    write_adapter(mdir, a1dir, "q_proj,v_proj,down_proj", 8, 1, false);
    write_adapter(mdir, a2dir, "regex:.*\\.(k_proj|o_proj|gate_proj|up_proj)", 16, 2, false);
    struct rig r;
    rig_open(&r, mdir);
    struct err err = {0};
    struct lora_adapter *a1 = NULL, *a2 = NULL;
    cr_assert_eq(lora_load(r.m, a1dir, &a1, &err), 0, "%s", err.msg);
    cr_assert_eq(lora_load(r.m, a2dir, &a2, &err), 0, "%s", err.msg);
    cr_assert_eq(a2->rank, 16);

    /* none, a1, a2, a1+a2, a1, none, a2+a1: decodes and prefill chunks */
    struct lora_adapter *stacks[7][2] = {{0}, {a1}, {a2}, {a1, a2}, {a1}, {0}, {a2, a1}};
    int n_stack[7] = {0, 1, 1, 2, 1, 0, 2};
    int n_tok[7] = {5, 1, 3, 1, 4, 1, 2};
    int vocab = r.m->config.vocab_size;
    int32_t toks[7][8];
    uint32_t blocks[7][1];
    float *alone[7];
    for (int s = 0; s < 7; s++) {
        prompt_of(toks[s], n_tok[s], vocab, 3 * s + 1);
        blocks[s][0] = (uint32_t)s;
        struct batch_seq seq = {.tokens = toks[s], .n_tokens = n_tok[s], .block_ids = blocks[s],
                                .n_block_ids = 1, .all_logits = true,
                                .adapters = (const struct lora_adapter *const *)stacks[s],
                                .n_adapters = n_stack[s]};
        struct batch b = {&seq, 1};
        alone[s] = malloc((size_t)n_tok[s] * vocab * sizeof(float));
        cr_assert_eq(model_forward(r.m, r.st, &r.pool->cache, &b, alone[s], &err), 0, "%s", err.msg);
    }
    struct batch_seq seqs[7];
    int total = 0;
    for (int s = 0; s < 7; s++) {
        blocks[s][0] = (uint32_t)(8 + s); /* fresh blocks: the same positions computed again */
        seqs[s] = (struct batch_seq){.tokens = toks[s], .n_tokens = n_tok[s], .block_ids = blocks[s],
                                     .n_block_ids = 1, .all_logits = true,
                                     .adapters = (const struct lora_adapter *const *)stacks[s],
                                     .n_adapters = n_stack[s]};
        total += n_tok[s];
    }
    float *together = malloc((size_t)total * vocab * sizeof(float));
    struct batch b = {seqs, 7};
    cr_assert_eq(model_forward(r.m, r.st, &r.pool->cache, &b, together, &err), 0, "%s", err.msg);
    size_t off = 0;
    for (int s = 0; s < 7; s++) {
        size_t bytes = (size_t)n_tok[s] * vocab * sizeof(float);
        cr_expect(!memcmp(together + off, alone[s], bytes),
                  "sequence %d: logits in the mixed batch differ from its own run", s);
        off += (size_t)n_tok[s] * vocab;
        free(alone[s]);
    }
    /* and the adapters matter: a1's rows differ from the base's */
    cr_expect(memcmp(together + 5 * vocab, together, (size_t)vocab * sizeof(float)) != 0);
    free(together);
    lora_release(a1);
    lora_release(a2);
    rig_close(&r);
    test_rmtree(tmp);
    free(tmp);
}

/* ---- the prefix cache never crosses adapters ----------------------------- */

static int run_engine(struct engine *e, const int32_t *prompt, int n, struct lora_adapter *a,
                      int32_t *out_tokens, int max_tokens)
{
    struct gen_params p = {.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens,
                           .sampling = {.temperature = 0, .top_p = 1, .repetition_penalty = 1},
                           .logprobs = -1};
    if (a) {
        p.adapters[0] = a;
        p.n_adapters = 1;
    }
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    struct gen_cursor cur = {0};
    int n_cached = -1, got = 0;
    for (;;) {
        struct gen_news news = {0};
        cr_assert_eq(gen_output_drain(o, &cur, 1000, &news), 0);
        for (size_t i = 0; i < news.n_ids && got < max_tokens; i++)
            out_tokens[got++] = news.ids[i];
        bool done = news.finish != GEN_RUNNING;
        n_cached = news.n_cached;
        cr_assert_neq(news.finish, GEN_FINISH_ERROR, "%s", news.error);
        gen_news_free(&news);
        if (done)
            break;
    }
    gen_output_release(o);
    return n_cached;
}

Test(lora, prefix_cache_hit_never_crosses_adapters, .timeout = 120)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: the engine needs a tokenizer");
    char *tmp = test_mkdtemp();
    char mdir[512], adir[512], tdir[512];
    snprintf(mdir, sizeof mdir, "%s/model", tmp);
    snprintf(adir, sizeof adir, "%s/a", tmp);
    snprintf(tdir, sizeof tdir, "%s/qwen3", data);
    struct err err = {0};
    struct mkmodel_opts mo = {.preset = "tiny-qwen3", .seed = 5, .out_dir = mdir, .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&mo, &err), 0, "%s", err.msg);
    write_adapter(mdir, adir, NULL, 8, 7, false);
    struct rig r;
    rig_open(&r, mdir);
    struct tokenizer *tok = NULL;
    cr_assert_eq(tok_load(mdir, &tok, &err), 0, "%s", err.msg);
    struct lora_adapter *a = NULL;
    cr_assert_eq(lora_load(r.m, adir, &a, &err), 0, "%s", err.msg);
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                .max_queue = 8, .kv_block_size = BLOCK,
                                .prompt_cache_bytes = 64u << 20};
    struct engine *e = NULL;
    cr_assert_eq(engine_create(r.m, tok, &cfg, &e, &err), 0, "%s", err.msg);
    int32_t prompt[40];
    prompt_of(prompt, 40, r.m->config.vocab_size, 9);
    int32_t base1[6], ad1[6], base2[6], ad2[6];
    cr_assert_eq(run_engine(e, prompt, 40, a, ad1, 6), 0);
    /* the same prompt without the adapter finds nothing the adapter computed */
    cr_expect_eq(run_engine(e, prompt, 40, NULL, base1, 6), 0);
    /* each finds its own */
    cr_expect_gt(run_engine(e, prompt, 40, a, ad2, 6), 0);
    cr_expect_gt(run_engine(e, prompt, 40, NULL, base2, 6), 0);
    cr_expect(!memcmp(ad1, ad2, sizeof ad1), "a cache hit changed the adapter's tokens");
    cr_expect(!memcmp(base1, base2, sizeof base1), "a cache hit changed the base's tokens");
    engine_free(e);
    /* the engine's sequences dropped their references: the caller's is the last */
    cr_expect_eq(atomic_load(&a->refs), 1);
    lora_release(a);
    tok_free(tok);
    rig_close(&r);
    test_rmtree(tmp);
    free(tmp);
}

/* ---- validation ---------------------------------------------------------- */

struct fixture {
    char *tmp;
    char mdir[512], adir[512];
    struct rig r;
};

static void fixture_open(struct fixture *f, const char *preset)
{
    f->tmp = test_mkdtemp();
    snprintf(f->mdir, sizeof f->mdir, "%s/model", f->tmp);
    snprintf(f->adir, sizeof f->adir, "%s/a", f->tmp);
    write_model(preset, f->mdir);
    rig_open(&f->r, f->mdir);
}

static void fixture_close(struct fixture *f)
{
    rig_close(&f->r);
    test_rmtree(f->tmp);
    free(f->tmp);
}

/* Rewrites the adapter's config with key's value replaced (or added). */
static void set_config(struct fixture *f, const char *key, const char *value)
{
    char path[600];
    snprintf(path, sizeof path, "%s/adapter_config.json", f->adir);
    size_t len;
    char *text = test_read_file(path, &len);
    cr_assert_not_null(text);
    char needle[64];
    snprintf(needle, sizeof needle, "\"%s\":", key);
    char *at = strstr(text, needle);
    char out[8192];
    if (at) {
        char *end = strpbrk(at + strlen(needle), ",\n}");
        if (*(at + strlen(needle) + 1) == '[')
            end = strchr(at, ']') + 1;
        snprintf(out, sizeof out, "%.*s\"%s\": %s%s", (int)(at - text), text, key, value, end);
    } else {
        snprintf(out, sizeof out, "{\"%s\": %s, %s", key, value, text + 1);
    }
    free(text);
    cr_assert_eq(test_write_file(path, out, strlen(out)), 0);
}

static void expect_refused(struct fixture *f, const char *needle)
{
    struct err err = {0};
    struct lora_adapter *a = NULL;
    int rc = lora_load(f->r.m, f->adir, &a, &err);
    cr_expect_lt(rc, 0, "accepted; expected an error mentioning '%s'", needle);
    cr_expect(strstr(err.msg, needle), "message '%s' does not mention '%s'", err.msg, needle);
    if (rc == 0)
        lora_release(a);
}

Test(lora_validation, refuses_what_peft_files_may_hold_but_we_do_not_run)
{
    struct fixture f;
    fixture_open(&f, "tiny-llama");
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "bias", "\"all\"");
    expect_refused(&f, "bias");
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "use_dora", "true");
    expect_refused(&f, "DoRA");
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "rank_pattern", "{\"q_proj\": 4}");
    expect_refused(&f, "rank_pattern");
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "peft_type", "\"IA3\"");
    expect_refused(&f, "LORA");
    fixture_close(&f);
}

Test(lora_validation, shapes_rank_and_module_names_are_checked_against_the_base)
{
    struct fixture f;
    fixture_open(&f, "tiny-llama");
    /* r says 4 but the tensors are rank 8 */
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "r", "4");
    expect_refused(&f, "shape");
    /* a tensor for a module target_modules leaves out */
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "target_modules", "[\"q_proj\"]");
    expect_refused(&f, "target_modules leaves out");
    /* a target that names nothing in the model */
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "target_modules", "[\"q_proj\", \"v_proj\", \"c_attn\"]");
    expect_refused(&f, "c_attn");
    /* a module the config targets without its tensors */
    write_adapter(f.mdir, f.adir, "q_proj,v_proj", 8, 1, false);
    set_config(&f, "target_modules", "[\"q_proj\", \"v_proj\", \"o_proj\"]");
    expect_refused(&f, "o_proj has no lora_A");
    /* an adapter written for another model's shapes */
    char other[600], odir[600];
    snprintf(other, sizeof other, "%s/other", f.tmp);
    snprintf(odir, sizeof odir, "%s/oa", f.tmp);
    write_model("tiny-qwen3", other);
    write_adapter(other, odir, "q_proj", 8, 1, false);
    struct err err = {0};
    struct lora_adapter *a = NULL;
    cr_expect_lt(lora_load(f.r.m, odir, &a, &err), 0);
    cr_expect(strstr(err.msg, "shape") || strstr(err.msg, "not a LoRA pair"), "%s", err.msg);
    /* a directory without an adapter */
    cr_expect_lt(lora_load(f.r.m, f.mdir, &a, &err), 0);
    cr_expect(strstr(err.msg, "adapter_config.json"), "%s", err.msg);
    fixture_close(&f);
}

Test(lora_validation, phi3_takes_its_fused_projections_only)
{
    struct fixture f;
    fixture_open(&f, "tiny-phi3");
    struct err err = {0};
    struct mklora_opts o = {.model_dir = f.mdir, .out_dir = f.adir, .rank = 4, .alpha = 8,
                            .targets = "q_proj"};
    cr_expect_lt(mklora_write(&o, &err), 0, "mkmodel wrote a q_proj adapter for Phi-3");
    write_adapter(f.mdir, f.adir, "qkv_proj,gate_up_proj", 4, 3, false);
    struct lora_adapter *a = NULL;
    cr_assert_eq(lora_load(f.r.m, f.adir, &a, &err), 0, "%s", err.msg);
    /* qkv_proj is split into q, k and v; gate_up_proj into gate and up */
    for (int t = LORA_Q; t <= LORA_V; t++)
        cr_expect_not_null(a->pairs[t].a);
    cr_expect_null(a->pairs[LORA_O].a);
    cr_expect_not_null(a->pairs[LORA_GATE].a);
    cr_expect_eq(a->mounted_modules, 2 * f.r.m->config.n_layers);
    lora_release(a);
    set_config(&f, "target_modules", "[\"qkv_proj\", \"gate_up_proj\", \"q_proj\"]");
    expect_refused(&f, "q_proj");
    fixture_close(&f);
}

Test(lora_validation, scale_is_alpha_over_rank_or_over_its_root_with_rslora)
{
    struct fixture f;
    fixture_open(&f, "tiny-qwen3");
    write_adapter(f.mdir, f.adir, "q_proj", 16, 1, false);
    struct err err = {0};
    struct lora_adapter *a = NULL;
    cr_assert_eq(lora_load(f.r.m, f.adir, &a, &err), 0, "%s", err.msg);
    cr_expect_float_eq(a->scale, 1.0f, 1e-7);
    uint64_t d1 = a->digest;
    lora_release(a);
    write_adapter(f.mdir, f.adir, "q_proj", 16, 1, true);
    cr_assert_eq(lora_load(f.r.m, f.adir, &a, &err), 0, "%s", err.msg);
    cr_expect_float_eq(a->scale, 4.0f, 1e-6);
    cr_expect_neq(a->digest, d1, "the scale is part of the adapter's identity");
    lora_release(a);
    fixture_close(&f);
}

Test(lora_validation, merging_refuses_block_quantized_weights)
{
    char *tmp = test_mkdtemp();
    char mdir[512], adir[512];
    snprintf(mdir, sizeof mdir, "%s/model", tmp);
    snprintf(adir, sizeof adir, "%s/a", tmp);
    write_model("tiny-llama3", mdir); /* hidden 160: whole Q8_0 blocks */
    write_adapter(mdir, adir, "q_proj", 4, 1, false);
    struct err err = {0};
    struct backend *be;
    struct model *m;
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1}, &be, &err), 0);
    cr_assert_eq(model_load_with(mdir, be, &(struct model_load_options){.quantize = DTYPE_Q8_0},
                                 &m, &err), 0, "%s", err.msg);
    struct lora_adapter *a = NULL;
    cr_assert_eq(lora_load(m, adir, &a, &err), 0, "%s", err.msg);
    cr_expect_eq(lora_merge(m, a, &err), -INFERD_EUNSUPPORTED);
    cr_expect(strstr(err.msg, "dense weights only"), "%s", err.msg);
    lora_release(a);
    model_free(m);
    backend_destroy(be);
    test_rmtree(tmp);
    free(tmp);
}

/* ---- parity with transformers (+ peft) ------------------------------------ */

static int make_cpu(enum compute_mode mode, struct backend **out, struct err *err)
{
    return backend_cpu_create(&(struct backend_options){.mode = mode, .threads = 2}, out, err);
}

/* tests/goldens/lora/<preset>.json, written by tools/make_lora_goldens.py on a machine with
 * torch: every position of every case with the adapter applied, in exact mode within 1e-3 of
 * max|logit| and the same argmax. */
Test(lora_parity, adapter_logits_match_transformers_goldens, .timeout = 300)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/lora", golden_dir());
    char cmd[800];
    snprintf(cmd, sizeof cmd, "ls %s/*.json >/dev/null 2>&1", dir);
    if (system(cmd) != 0)
        cr_skip_test("no LoRA goldens in %s: run `python3 tools/make_lora_goldens.py` where torch "
                     "and transformers are", dir);
    snprintf(cmd, sizeof cmd, "ls %s/*.json", dir);
    FILE *ls = popen(cmd, "r");
    cr_assert_not_null(ls);
    char path[1024];
    int checked = 0;
    while (fgets(path, sizeof path, ls)) {
        path[strcspn(path, "\n")] = 0;
        struct golden g;
        cr_assert_eq(golden_load(path, &g), 0, "%s", path);
        size_t len;
        char *text = test_read_file(path, &len);
        json_object *root = json_tokener_parse(text), *ad, *v;
        free(text);
        cr_assert(root && json_object_object_get_ex(root, "adapter", &ad), "%s: no adapter", path);
        struct mklora_opts lo = {.seed = 1};
        char targets[256] = "", fnv_want[32] = "";
        if (json_object_object_get_ex(ad, "rank", &v))
            lo.rank = json_object_get_int(v);
        if (json_object_object_get_ex(ad, "alpha", &v))
            lo.alpha = json_object_get_double(v);
        if (json_object_object_get_ex(ad, "seed", &v))
            lo.seed = (uint64_t)json_object_get_int64(v);
        if (json_object_object_get_ex(ad, "targets", &v))
            snprintf(targets, sizeof targets, "%s", json_object_get_string(v));
        if (json_object_object_get_ex(ad, "safetensors_fnv1a64", &v))
            snprintf(fnv_want, sizeof fnv_want, "%s", json_object_get_string(v));
        json_object_put(root);

        char *tmp = test_mkdtemp(), mdir[900], adir[900], fnv[32];
        golden_make_model(&g, tmp, mdir, sizeof mdir);
        snprintf(adir, sizeof adir, "%s/adapter", tmp);
        lo.model_dir = mdir;
        lo.out_dir = adir;
        lo.targets = targets;
        struct err err = {0};
        cr_assert_eq(mklora_write(&lo, &err), 0, "%s", err.msg);
        cr_assert_eq(mkmodel_file_fnv1a64(adir, "adapter_model.safetensors", fnv, sizeof fnv, &err), 0);
        cr_assert_str_eq(fnv, fnv_want, "%s: the adapter differs from the one the golden was made with",
                         g.name);

        struct golden_fixture f;
        golden_fixture_open(&f, make_cpu, mdir, COMPUTE_EXACT, 128);
        struct lora_adapter *a = NULL;
        cr_assert_eq(lora_load(f.model, adir, &a, &err), 0, "%s: %s", g.name, err.msg);
        struct agreement agr = {0};
        int vocab = f.model->config.vocab_size;
        for (int c = 0; c < g.n_cases; c++) {
            const struct golden_case *gc = &g.cases[c];
            struct block_table bt;
            block_table_init(&bt);
            cr_assert_eq(block_table_reserve(f.pool, &bt, gc->n_tokens, &err), 0, "%s", err.msg);
            struct batch_seq seq = {.tokens = gc->tokens, .n_tokens = gc->n_tokens,
                                    .block_ids = bt.blocks, .n_block_ids = bt.n_blocks,
                                    .all_logits = true,
                                    .adapters = (const struct lora_adapter *const *)&a,
                                    .n_adapters = 1};
            struct batch b = {&seq, 1};
            golden_forward(&f, &b);
            for (int i = 0; i < gc->n_tokens; i++)
                golden_compare_row(f.logits + (size_t)i * vocab, vocab, &gc->pos[i], "lora", c, i,
                                   &agr);
            block_table_clear(f.pool, &bt);
        }
        cr_expect_leq(agr.worst_rel, 1e-3, "%s: %g of max|logit| from the reference at %s", g.name,
                      agr.worst_rel, agr.worst_where);
        cr_expect_eq(agr.argmax_equal, agr.positions, "%s: argmax differs at %ld of %ld positions",
                     g.name, agr.positions - agr.argmax_equal, agr.positions);
        lora_release(a);
        golden_fixture_close(&f);
        golden_free(&g);
        test_rmtree(tmp);
        free(tmp);
        checked++;
    }
    pclose(ls);
    cr_assert_gt(checked, 0);
}

/* ---- the CPU op itself ---------------------------------------------------- */

static float *host_floats(struct backend *be, size_t n, uint32_t seed)
{
    float *p = be->ops->alloc(be, n * sizeof(float));
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((int32_t)(seed >> 8) % 2001 - 1000) / 1000.0f;
    }
    return p;
}

/* Shapes off every vector width (in 517, out 203, ranks 5 and 13, a B split out of a wider
 * one), stacked and repeated pairs over runs of rows: each row within float rounding of a
 * double-precision reference, and bit for bit what it gets as the call's only row (the batch
 * large enough for the threads, a row alone not). */
/* The values as the op stores them: bf16 in place (each rounded) when bf16. */
static void *as_stored(float *v, size_t n, bool bf16)
{
    if (!bf16)
        return v;
    uint16_t *h = (uint16_t *)(void *)v;
    for (size_t i = 0; i < n; i++)
        h[i] = f32_to_bf16(v[i]);
    return v;
}

static double stored_at(const void *m, size_t i, bool bf16)
{
    return bf16 ? (double)bf16_to_f32(((const uint16_t *)m)[i]) : (double)((const float *)m)[i];
}

static void op_case(bool bf16)
{
    struct backend *be;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = COMPUTE_EXACT, .threads = 2},
                                    &be, &err), 0, "%s", err.msg);
    enum { IN = 517, OUT = 203, ROWS = 9 };
    float *a1 = host_floats(be, 5 * IN, 1), *b1 = host_floats(be, OUT * 5, 2);
    float *a2 = host_floats(be, 13 * IN, 3), *b2 = host_floats(be, (OUT + 4) * 16, 4);
    size_t es = bf16 ? 2 : 4;
    struct lora_pair p1 = {.a = as_stored(a1, 5 * IN, bf16), .b = as_stored(b1, OUT * 5, bf16),
                           .rank = 5, .b_stride = 5, .scale = 0.5f, .bf16 = bf16};
    /* rank 13 in rows 16 apart, starting 4 rows in, as a fused projection's part */
    struct lora_pair p2 = {.a = as_stored(a2, 13 * IN, bf16),
                           .b = (uint8_t *)as_stored(b2, (OUT + 4) * 16, bf16) + 4 * 16 * es,
                           .rank = 13, .b_stride = 16, .scale = 2.0f, .bf16 = bf16};
    float *x = host_floats(be, ROWS * IN, 5);
    float *y0 = host_floats(be, ROWS * OUT, 6);
    float *y = be->ops->alloc(be, ROWS * OUT * sizeof(float));
    float *scratch = be->ops->alloc(be, 4 * ROWS * LORA_MAX_RANK * sizeof(float));
    /* rows 0-2 p1, 3 none, 4-5 p1 + p2 stacked, 6-8 p2 then p1 */
    struct lora_seg segs[] = {{0, 3, p1}, {4, 2, p1}, {4, 2, p2}, {6, 3, p2}, {6, 3, p1}};
    int n_segs = (int)(sizeof segs / sizeof segs[0]);
    memcpy(y, y0, ROWS * OUT * sizeof(float));
    be->ops->lora(be, x, IN, OUT, segs, n_segs, scratch, y);
    double worst = 0;
    for (int t = 0; t < ROWS; t++) {
        for (int r = 0; r < OUT; r++) {
            double want = y0[t * OUT + r];
            for (int s = 0; s < n_segs; s++) {
                const struct lora_seg *sg = &segs[s];
                if (t < sg->row0 || t >= sg->row0 + sg->n_rows)
                    continue;
                double v = 0;
                for (int k = 0; k < sg->p.rank; k++) {
                    double u = 0;
                    for (int c = 0; c < IN; c++)
                        u += stored_at(sg->p.a, (size_t)k * IN + c, bf16) * x[t * IN + c];
                    v += stored_at(sg->p.b, (size_t)r * sg->p.b_stride + k, bf16) * u;
                }
                want += sg->p.scale * v;
            }
            double d = fabs(want - y[t * OUT + r]);
            worst = d > worst ? d : worst;
        }
        /* the row alone: the same segs cut to it */
        float *ya = be->ops->alloc(be, OUT * sizeof(float));
        memcpy(ya, y0 + t * OUT, OUT * sizeof(float));
        struct lora_seg alone[5];
        int n = 0;
        for (int s = 0; s < n_segs; s++)
            if (t >= segs[s].row0 && t < segs[s].row0 + segs[s].n_rows)
                alone[n++] = (struct lora_seg){0, 1, segs[s].p};
        be->ops->lora(be, x + t * IN, IN, OUT, alone, n, scratch, ya);
        cr_expect(!memcmp(ya, y + t * OUT, OUT * sizeof(float)),
                  "row %d: its bits in the batch differ from its bits alone", t);
        be->ops->release(be, ya);
    }
    cr_expect_leq(worst, 1e-3, "the op is %g from the reference", worst);
    cr_expect(!memcmp(y + 3 * OUT, y0 + 3 * OUT, OUT * sizeof(float)), "a row no seg covers changed");
    void *bufs[] = {a1, b1, a2, b2, x, y0, y, scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->ops->release(be, bufs[i]);
    backend_destroy(be);
}

Test(lora_op, cpu_rows_match_a_reference_and_their_bits_alone_at_odd_shapes)
{
    op_case(false);
}

Test(lora_op, bf16_pairs_read_the_same_way_widened_exactly)
{
    op_case(true);
}

/* ---- the CUDA op (on a machine with a GPU) --------------------------------- */

/* One backend's side of a comparison: the model on it, a paged pool, a forward state, the
 * adapters loaded from dirs, and room for the logits of rows rows. */
struct op_side {
    struct backend *be;
    struct model *m;
    struct kv_pool *pool;
    struct forward_state *st;
    struct lora_adapter *ad[3];
    int n_ad;
    float *logits;
};

static void side_open(struct op_side *o, struct backend *be, const char *mdir, int blocks,
                      const char *const *adirs, int n_ad, int rows)
{
    struct err err = {0};
    memset(o, 0, sizeof *o);
    o->be = be;
    cr_assert_eq(model_load(mdir, be, &o->m, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_pool_create(o->m, be, blocks, BLOCK, &o->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(o->m, blocks, &o->st, &err), 0, "%s", err.msg);
    for (o->n_ad = 0; o->n_ad < n_ad; o->n_ad++)
        cr_assert_eq(lora_load(o->m, adirs[o->n_ad], &o->ad[o->n_ad], &err), 0, "%s", err.msg);
    o->logits = malloc((size_t)rows * o->m->config.vocab_size * sizeof(float));
    cr_assert_not_null(o->logits);
}

static void side_close(struct op_side *o)
{
    for (int j = 0; j < o->n_ad; j++)
        lora_release(o->ad[j]);
    forward_state_free(o->st);
    kv_pool_free(o->pool);
    model_free(o->m);
    backend_destroy(o->be);
    free(o->logits);
}

/* One decode step of n sequences, sequence s at position step with the adapter stack
 * stack[s][0, n_stack[s]) of side o, logits into o->logits. */
static void side_step(struct op_side *o, int n, int step, int32_t (*toks)[16],
                      uint32_t (*blocks)[1], const struct lora_adapter *(*stack)[2],
                      const int *n_stack)
{
    struct batch_seq seqs[16];
    cr_assert_leq(n, 16);
    for (int s = 0; s < n; s++)
        seqs[s] = (struct batch_seq){.tokens = toks[s] + step, .n_tokens = 1, .pos0 = step,
                                     .block_ids = blocks[s], .n_block_ids = 1,
                                     .adapters = stack[s], .n_adapters = n_stack[s]};
    struct batch b = {seqs, n};
    struct err err = {0};
    cr_assert_eq(model_forward(o->m, o->st, &o->pool->cache, &b, o->logits, &err), 0, "%s",
                 err.msg);
}

/* Mixed decode steps on the GPU (EXACT) within float rounding of the CPU's, every step's
 * rows taking other adapters in the same places: steps of the same shape replay one captured
 * graph, so this holds only because the segments live in the arena, not in the graph. */
Test(lora_cuda, gpu_op_matches_the_cpu_and_replays_with_other_adapters, .timeout = 300)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: the CUDA adapter op is not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: the CUDA adapter op is not checked");
    char *tmp = test_mkdtemp();
    char mdir[512], a1dir[512], a2dir[512];
    snprintf(mdir, sizeof mdir, "%s/model", tmp);
    snprintf(a1dir, sizeof a1dir, "%s/a1", tmp);
    snprintf(a2dir, sizeof a2dir, "%s/a2", tmp);
    write_model("tiny-qwen3", mdir);
    write_adapter(mdir, a1dir, NULL, 8, 1, false);
    write_adapter(mdir, a2dir, "q_proj,o_proj,up_proj", 16, 2, true);
    const char *adirs[2] = {a1dir, a2dir};
    struct err err = {0};
    struct backend *bes[2];
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = COMPUTE_EXACT, .threads = 2},
                                    &bes[0], &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(0, &(struct backend_options){.mode = COMPUTE_EXACT}, &bes[1],
                                     &err), 0, "%s", err.msg);
    enum { N = 4, STEPS = 6 };
    struct op_side sides[2];
    for (int k = 0; k < 2; k++)
        side_open(&sides[k], bes[k], mdir, 64, adirs, 2, N);
    int vocab = sides[0].m->config.vocab_size;
    int32_t toks[N][16];
    uint32_t blocks[N][1];
    for (int s = 0; s < N; s++) {
        prompt_of(toks[s], STEPS + 8, vocab, s + 2);
        blocks[s][0] = (uint32_t)s;
    }
    double worst = 0, max_abs = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int k = 0; k < 2; k++) {
            /* who takes what rotates every step: same segments' shapes, other adapters */
            const struct lora_adapter *stack[N][2];
            int n_stack[N];
            for (int s = 0; s < N; s++) {
                int pick = (s + step) % N; /* 0: none, 1: a1, 2: a2, 3: a1+a2 */
                n_stack[s] = pick == 0 ? 0 : pick == 3 ? 2 : 1;
                stack[s][0] = sides[k].ad[pick == 2 ? 1 : 0];
                stack[s][1] = sides[k].ad[1];
            }
            side_step(&sides[k], N, step, toks, blocks, stack, n_stack);
        }
        for (size_t i = 0; i < (size_t)N * vocab; i++) {
            worst = fmax(worst, fabs((double)sides[0].logits[i] - sides[1].logits[i]));
            max_abs = fmax(max_abs, fabs((double)sides[0].logits[i]));
        }
    }
    cr_expect_leq(worst, 1e-3 * max_abs, "GPU logits %g from the CPU's (max %g)", worst, max_abs);
    for (int k = 0; k < 2; k++)
        side_close(&sides[k]);
    test_rmtree(tmp);
    free(tmp);
}

/* CUDA fuse rule 7 (FAST mode; 16 rows, past the GEMV kernels): the adapters' shrinks and
 * expands folded into the RMSNorm and SwiGLU launches give logits as close to the CPU's
 * (FAST mode too) as a launch pair a group gives, and within float rounding of those (sums
 * in another order, which can move a bf16 rounding of x), in fewer launches; rows with no
 * adapter, one, two stacked, and one of a rank the row kernels do not read (4) side by
 * side, over rows whose cluster slices run past the row's end (hidden 200, inter 328). */
Test(lora_cuda, adapters_folded_into_row_launches_match_the_group_launches, .timeout = 300)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: the folded adapter launches are not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: the folded adapter launches are not checked");
    char *tmp = test_mkdtemp();
    char mdir[512], adir[3][512];
    snprintf(mdir, sizeof mdir, "%s/model", tmp);
    for (int j = 0; j < 3; j++)
        snprintf(adir[j], sizeof adir[j], "%s/a%d", tmp, j);
    write_model("tiny-llama", mdir);
    write_adapter(mdir, adir[0], NULL, 8, 1, false);
    write_adapter(mdir, adir[1], "q_proj,o_proj,up_proj,down_proj", 16, 2, true);
    write_adapter(mdir, adir[2], "gate_proj,v_proj", 4, 3, false);
    const char *adirs[3] = {adir[0], adir[1], adir[2]};
    struct err err = {0};
    /* 0: the group launches, 1: rule 7, 2: the CPU */
    enum { K = 3, N = 16, STEPS = 4 };
    struct op_side sides[K];
    for (int k = 0; k < K; k++) {
        struct backend_options o = {.mode = COMPUTE_FAST,
                                    .cuda_lora_rows = k == 1 ? BACKEND_ON : BACKEND_OFF,
                                    .threads = 2};
        struct backend *be;
        if (k == 2)
            cr_assert_eq(backend_cpu_create(&o, &be, &err), 0, "%s", err.msg);
        else
            cr_assert_eq(backend_cuda_create(0, &o, &be, &err), 0, "%s", err.msg);
        side_open(&sides[k], be, mdir, 2 * N, adirs, 3, N);
        cr_assert(sides[k].ad[0]->bf16, "FAST mode over bf16 weights keeps bf16 adapters");
    }
    int vocab = sides[0].m->config.vocab_size;
    int32_t toks[N][16];
    uint32_t blocks[N][1];
    long launches[2] = {0, 0};
    for (int s = 0; s < N; s++) {
        prompt_of(toks[s], STEPS + 8, vocab, s + 2);
        blocks[s][0] = (uint32_t)s;
    }
    double worst = 0, max_abs = 0, from_cpu[2] = {0, 0};
    for (int step = 0; step < STEPS; step++) {
        for (int k = 0; k < K; k++) {
            /* 0: none, 1: a0, 2: a1, 3: a0 + a1, rotating every step; from the third step
             * also 4: a2 (rank 4), which keeps q/k/v's and gate/up's groups out of rule 7 */
            const struct lora_adapter *stack[N][2];
            int n_stack[N];
            for (int s = 0; s < N; s++) {
                int pick = (s + step) % (step < 2 ? 4 : 5);
                n_stack[s] = pick == 0 ? 0 : pick == 3 ? 2 : 1;
                stack[s][0] = sides[k].ad[pick == 2 ? 1 : pick == 4 ? 2 : 0];
                stack[s][1] = sides[k].ad[1];
            }
            long before = backend_cuda_planned_launches(sides[k].be);
            side_step(&sides[k], N, step, toks, blocks, stack, n_stack);
            if (step == 0 && k < 2)
                launches[k] = backend_cuda_planned_launches(sides[k].be) - before;
        }
        for (size_t i = 0; i < (size_t)N * vocab; i++) {
            const float *lg[K] = {sides[0].logits, sides[1].logits, sides[2].logits};
            worst = fmax(worst, fabs((double)lg[0][i] - lg[1][i]));
            max_abs = fmax(max_abs, fabs((double)lg[2][i]));
            for (int k = 0; k < 2; k++)
                from_cpu[k] = fmax(from_cpu[k], fabs((double)lg[k][i] - lg[2][i]));
        }
    }
    cr_log_info("max |logit| %g; group launches %g from the CPU, rule 7 %g, each other %g",
                max_abs, from_cpu[0], from_cpu[1], worst);
    cr_expect_leq(from_cpu[1], 2 * from_cpu[0] + 1e-4 * max_abs,
                  "folded adapter launches' logits %g from the CPU's, the group launches' %g",
                  from_cpu[1], from_cpu[0]);
    cr_expect_leq(worst, 5e-3 * max_abs, "folded adapter launches' logits %g from the group "
                  "launches' (max %g)", worst, max_abs);
    cr_expect_gt(launches[0], 0);
    cr_expect_lt(launches[1], launches[0], "the folded step planned %ld launches, the other %ld",
                 launches[1], launches[0]);
    for (int k = 0; k < K; k++)
        side_close(&sides[k]);
    test_rmtree(tmp);
    free(tmp);
}
