/* tests/unit/test_structured.c — structured output through the engine: the sampler's mask step,
 * grammar-constrained generations on a tiny random-weight model (JSON Schema, choices, EOS only
 * where the grammar accepts), jump-forward's equivalence, forced tool calls that parse, and the
 * grammar after the reasoning part. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/structured.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"

/* ---- the sampler's mask step (no model) ---------------------------------------------------- */

Test(structured_sampler, masked_tokens_are_never_picked_and_the_spec_carries_the_mask)
{
    enum { N = 100 };
    struct sampler s;
    struct err err = {0};
    struct sampler_params p = {.temperature = 1.5f, .top_p = 1, .seed = 7};
    cr_assert_eq(sampler_init(&s, &p, N, &err), 0, "%s", err.msg);
    uint32_t mask[(N + 31) / 32] = {0};
    int allowed[] = {3, 40, 77, 99};
    for (int i = 0; i < 4; i++)
        mask[allowed[i] >> 5] |= 1u << (allowed[i] & 31);
    cr_assert_eq(sampler_set_mask(&s, mask), 0);
    float logits[N];
    for (int i = 0; i < N; i++)
        logits[i] = (float)((i * 37) % 11); /* the best tokens are all masked out */
    int seen[N] = {0};
    for (int k = 0; k < 400; k++) {
        int32_t t = sampler_pick(&s, logits);
        cr_assert(mask[t >> 5] >> (t & 31) & 1u, "token %d is masked out", t);
        seen[t]++;
    }
    for (int i = 0; i < 4; i++)
        cr_assert_gt(seen[allowed[i]], 0, "every allowed token is picked sometimes");
    float lp;
    struct token_logprob top[4];
    sampler_logprobs(&s, 5, 0, &lp, top);
    cr_assert(isinf(lp) && lp < 0, "a masked token has logprob -inf");
    struct sample_spec spec;
    cr_assert_eq(sampler_fill_spec(&s, -1, &spec), 0);
    cr_assert_eq(spec.mask, mask);
    /* greedy too */
    s.params.temperature = 0;
    cr_assert_eq(sampler_pick(&s, logits), 40, "the best allowed token (logit 40 * 37 %% 11 = 6)");
    cr_assert_eq(sampler_set_mask(&s, NULL), 0);
    cr_assert_eq(spec.mask, mask);
    sampler_free(&s);
}

/* ---- through the engine, on tiny-qwen3 with the Qwen3 tokenizer ---------------------------- */

static char *model_dir;
static struct backend *be;
static struct model *model;
static struct tokenizer *tok;
static struct grammar_vocab *vocab;
static struct grammar_cache *cache;
static int32_t eos_id;

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
    cr_assert_eq(grammar_vocab_create(tok, &vocab, &err), 0, "%s", err.msg);
    cr_assert_eq(grammar_cache_create(vocab, 8, &cache, &err), 0, "%s", err.msg);
    eos_id = tok_piece_to_id(tok, "<|im_end|>");
    cr_assert(eos_id >= 0);
}

static void teardown(void)
{
    grammar_cache_free(cache);
    grammar_vocab_free(vocab);
    tok_free(tok);
    model_free(model);
    backend_destroy(be);
    if (model_dir)
        test_rmtree(model_dir);
    cache = NULL;
    vocab = NULL;
    tok = NULL;
    model = NULL;
    be = NULL;
    model_dir = NULL;
}

TestSuite(structured, .init = setup, .fini = teardown, .timeout = 180);

static struct engine *start(void)
{
    struct engine_config cfg = {.n_ctx = 512, .max_seqs = 2, .max_step_tokens = 64,
                                .max_queue = 4};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

static struct gen_grammar *compile(enum structured_kind kind, const char *text)
{
    struct structured_spec spec = {.kind = kind, .text = (char *)text, .len = strlen(text)};
    struct gen_grammar *g = NULL;
    struct err err = {0};
    cr_assert_eq(grammar_cache_get(cache, &spec, &g, &err), 0, "%s", err.msg);
    return g;
}

static const int32_t prompt[] = {785, 6722, 315, 279};

static struct gen_params params(struct gen_grammar *g, int max_tokens, float temperature)
{
    static int32_t eos[1];
    eos[0] = eos_id;
    return (struct gen_params){.prompt = prompt, .n_prompt = 4, .max_tokens = max_tokens,
                               .sampling = {.temperature = temperature, .top_p = 1, .seed = 11},
                               .logprobs = -1, .eos_ids = eos, .n_eos = 1, .grammar = g,
                               .jump_forward = true};
}

struct result {
    char text[4096];
    int32_t ids[512];
    int n_ids;
    enum gen_finish finish;
    uint64_t steps; /* forward passes the engine ran for it */
};

static void run(struct engine *e, const struct gen_params *p, struct result *r)
{
    struct engine_stats before, after;
    engine_get_stats(e, &before);
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    size_t len = o->text.len < sizeof r->text - 1 ? o->text.len : sizeof r->text - 1;
    memcpy(r->text, o->text.data, len);
    r->text[len] = '\0';
    r->n_ids = (int)o->n_ids < 512 ? (int)o->n_ids : 512;
    memcpy(r->ids, o->ids.data, (size_t)r->n_ids * sizeof *r->ids);
    r->finish = o->finish;
    pthread_mutex_unlock(&o->mu);
    gen_output_release(o);
    /* the finishing step (the last token's K/V) may still be running: wait for it */
    for (int i = 0; i < 200; i++) {
        engine_get_stats(e, &after);
        if (after.running == 0)
            break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    r->steps = after.steps - before.steps;
}

/* The grammar (compiled alone) accepts text whole. */
static bool grammar_accepts(enum structured_kind kind, const char *src, const char *text)
{
    struct grammar *g = NULL;
    struct err err = {0};
    int rc = kind == STRUCTURED_JSON_SCHEMA ? grammar_compile_json_schema(src, strlen(src), NULL, &g, &err)
                                            : grammar_compile_regex(src, strlen(src), NULL, &g, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    struct grammar_matcher *m;
    cr_assert_eq(grammar_matcher_create(g, vocab, &m, &err), 0);
    bool ok = grammar_matcher_accept_bytes(m, text, strlen(text)) == 0 &&
              grammar_matcher_is_accepting(m);
    grammar_matcher_free(m);
    grammar_free(g);
    return ok;
}

static const char person[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":5},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"role\",\"tags\"]}";

Test(structured, greedy_and_sampled_replies_parse_and_satisfy_the_schema)
{
    struct engine *e = start();
    struct gen_grammar *g = compile(STRUCTURED_JSON_SCHEMA, person);
    float temps[] = {0, 1.0f};
    for (int i = 0; i < 2; i++) {
        struct gen_params p = params(g, 200, temps[i]);
        struct result r;
        run(e, &p, &r);
        cr_assert_eq(r.finish, GEN_FINISH_STOP, "a bounded schema finishes: %s", r.text);
        json_object *v = json_tokener_parse(r.text);
        cr_assert_not_null(v, "not JSON: %s", r.text);
        json_object *age;
        cr_assert(json_object_object_get_ex(v, "age", &age));
        cr_assert(json_object_get_int(age) >= 0 && json_object_get_int(age) <= 150);
        json_object_put(v);
        cr_assert(grammar_accepts(STRUCTURED_JSON_SCHEMA, person, r.text), "%s", r.text);
    }
    gen_grammar_release(g);
    engine_free(e);
}

Test(structured, eos_comes_only_where_the_grammar_accepts)
{
    struct engine *e = start();
    struct gen_grammar *g = compile(STRUCTURED_REGEX, "[a-z]{3,6}");
    struct sampler_logit_bias bias = {.token = eos_id, .bias = 100};
    struct gen_params p = params(g, 40, 0);
    p.sampling.logit_bias = &bias;
    p.sampling.n_logit_bias = 1;
    struct result r;
    run(e, &p, &r);
    /* EOS is what the model wants most: it comes as soon as the grammar accepts, never before */
    cr_assert_eq(r.finish, GEN_FINISH_STOP);
    cr_assert(strlen(r.text) >= 3 && strlen(r.text) <= 6, "'%s'", r.text);
    cr_assert(grammar_accepts(STRUCTURED_REGEX, "[a-z]{3,6}", r.text), "%s", r.text);
    gen_grammar_release(g);
    /* a finished grammar ends the reply (stop) with no EOS needed */
    g = compile(STRUCTURED_CHOICE, "[\"yes\",\"no\"]");
    p = params(g, 40, 0);
    run(e, &p, &r);
    cr_assert_eq(r.finish, GEN_FINISH_STOP);
    cr_assert(!strcmp(r.text, "yes") || !strcmp(r.text, "no"), "%s", r.text);
    for (int i = 0; i < r.n_ids; i++)
        cr_assert(!tok_is_special(tok, r.ids[i]), "no special token inside structured output");
    gen_grammar_release(g);
    engine_free(e);
}

/* Keys and structure forced; the values are choices the model makes. */
static const char long_keys[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"customer_account_identifier\":{\"enum\":[\"alpha\",\"beta\"]},"
    "\"preferred_notification_channel\":{\"enum\":[\"email\",\"sms\",\"push\"]},"
    "\"subscription_is_currently_active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"customer_account_identifier\",\"preferred_notification_channel\","
    "\"subscription_is_currently_active\"]}";

/* Everything forced but a final choice. */
static const char mostly_forced[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"api_version_identifier\":{\"const\":\"2024-06-01\"},"
    "\"operation_kind\":{\"const\":\"create_customer_record\"},"
    "\"dry_run\":{\"type\":\"boolean\"}},"
    "\"required\":[\"api_version_identifier\",\"operation_kind\",\"dry_run\"]}";

Test(structured, jump_forward_appends_canonical_tokens_and_saves_forward_passes)
{
    struct engine *e = start();
    const char *schemas[] = {mostly_forced, long_keys};
    for (int k = 0; k < 2; k++) {
        struct gen_grammar *g = compile(STRUCTURED_JSON_SCHEMA, schemas[k]);
        struct gen_params p = params(g, 200, 0);
        struct result slow, fast;
        p.jump_forward = false;
        run(e, &p, &slow);
        p.jump_forward = true;
        run(e, &p, &fast);
        cr_assert_eq(slow.finish, GEN_FINISH_STOP);
        cr_assert_eq(fast.finish, GEN_FINISH_STOP);
        cr_assert(grammar_accepts(STRUCTURED_JSON_SCHEMA, schemas[k], fast.text), "%s", fast.text);
        cr_assert(grammar_accepts(STRUCTURED_JSON_SCHEMA, schemas[k], slow.text), "%s", slow.text);
        cr_assert_lt(fast.steps, slow.steps, "jump-forward saves forward passes (%llu vs %llu)",
                     (unsigned long long)fast.steps, (unsigned long long)slow.steps);
        cr_assert_lt(fast.steps, (uint64_t)fast.n_ids, "fewer forward passes than output tokens");
        if (k == 0) {
            /* the forced text is identical; its tokens are the tokenizer's own encoding (a
             * reply without jump-forward may spell it in other tokens, so a random-weight
             * model's later free choices may differ between the two) */
            cr_assert_eq(strncmp(fast.text, slow.text, 80), 0);
            int32_t *canon = NULL;
            int n_canon = 0;
            struct err err = {0};
            const char *tail = strstr(fast.text, ",\"dry_run\"");
            cr_assert_not_null(tail);
            size_t head = (size_t)(tail - fast.text);
            cr_assert_eq(tok_encode(tok, fast.text, head, false, &canon, &n_canon, &err), 0);
            cr_assert_geq(fast.n_ids, n_canon);
            /* the first jump's tokens (a later jump starts at a token boundary the grammar
             * chose, where the whole text's encoding may merge differently) */
            for (int i = 1; i < n_canon && i < 16; i++)
                cr_assert_eq(fast.ids[i], canon[i], "token %d is canonical", i);
            free(canon);
        }
        gen_grammar_release(g);
    }
    engine_free(e);
}

Test(structured, forced_tool_calls_parse_into_a_call_with_valid_arguments)
{
    struct engine *e = start();
    json_object *tools = json_tokener_parse(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},"
        "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\",\"unit\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\",\"maxLength\":6}},"
        "\"required\":[\"tz\"]}}}]");
    const char *syntaxes[] = {"hermes", "llama_json", "mistral"};
    enum toolcall_syntax which[] = {TOOLCALL_HERMES, TOOLCALL_LLAMA_JSON, TOOLCALL_MISTRAL};
    for (int i = 0; i < 3; i++)
        for (int named = 0; named < 2; named++) {
            struct structured_spec spec;
            struct err err = {0};
            cr_assert_eq(structured_tool_call_spec(syntaxes[i], tools, named ? "get_weather" : NULL,
                                                   &spec, &err), 0, "%s", err.msg);
            struct gen_grammar *g = NULL;
            cr_assert_eq(grammar_cache_get(cache, &spec, &g, &err), 0, "%s", err.msg);
            structured_spec_free(&spec);
            struct gen_params p = params(g, 200, 0);
            struct result r;
            run(e, &p, &r);
            cr_assert_eq(r.finish, GEN_FINISH_STOP, "%s: %s", syntaxes[i], r.text);
            struct toolcall_parser *tp;
            struct toolcall_events ev;
            cr_assert_eq(toolcall_parser_create(which[i], tools, &tp, &err), 0);
            cr_assert_eq(toolcall_parser_push(tp, r.text, strlen(r.text), &ev, &err), 0);
            cr_assert_eq(toolcall_parser_finish(tp, &ev, &err), 0);
            cr_assert_eq(toolcall_parser_calls(tp), 1, "%s: one call in '%s'", syntaxes[i], r.text);
            if (named)
                cr_assert_not_null(strstr(r.text, "get_weather"), "%s", r.text);
            toolcall_parser_free(tp);
            gen_grammar_release(g);
        }
    json_object_put(tools);
    engine_free(e);
}

Test(structured, with_thinking_the_grammar_applies_after_think_within_the_budget)
{
    struct engine *e = start();
    int32_t think_id = tok_piece_to_id(tok, "<think>"), end_id = tok_piece_to_id(tok, "</think>");
    struct gen_grammar *g = compile(STRUCTURED_JSON_SCHEMA, person);
    struct gen_params p = params(g, 200, 0);
    p.grammar_after_think = true;
    p.think_open = true;
    p.think_budget = 6;
    struct result r;
    run(e, &p, &r);
    cr_assert_eq(r.finish, GEN_FINISH_STOP);
    cr_assert_eq(r.ids[0], think_id);
    cr_assert_eq(r.ids[7], end_id, "<think>, 6 tokens, then the forced </think>");
    const char *json = strstr(r.text, "</think>");
    cr_assert_not_null(json, "%s", r.text);
    json += strlen("</think>");
    cr_assert(grammar_accepts(STRUCTURED_JSON_SCHEMA, person, json), "after </think>: '%s'", json);
    gen_grammar_release(g);
    engine_free(e);
}

Test(structured, the_cache_compiles_a_repeated_schema_once_and_refuses_what_it_cannot_enforce)
{
    struct grammar_cache_stats before, after;
    grammar_cache_stats(cache, &before);
    struct gen_grammar *a = compile(STRUCTURED_JSON_SCHEMA, person);
    struct gen_grammar *b = compile(STRUCTURED_JSON_SCHEMA, person);
    cr_assert_eq(a, b, "one compiled grammar for one schema");
    grammar_cache_stats(cache, &after);
    cr_assert_eq(after.misses - before.misses, 1);
    cr_assert_eq(after.hits - before.hits, 1);
    gen_grammar_release(a);
    gen_grammar_release(b);
    const char bad[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"not\":{}}}}";
    struct structured_spec spec = {.kind = STRUCTURED_JSON_SCHEMA, .text = (char *)bad,
                                   .len = strlen(bad)};
    struct gen_grammar *g = NULL;
    struct err err = {0};
    cr_assert_eq(grammar_cache_get(cache, &spec, &g, &err), -INFERD_EUNSUPPORTED);
    cr_assert_not_null(strstr(err.msg, "properties.a"), "names the path: %s", err.msg);
    /* over its capacity the least recently used goes; references still held stay valid */
    struct gen_grammar *held = compile(STRUCTURED_REGEX, "[0-9]+");
    for (int i = 0; i < 10; i++) {
        char re[32];
        snprintf(re, sizeof re, "x{%d}", i + 1);
        gen_grammar_release(compile(STRUCTURED_REGEX, re));
    }
    grammar_cache_stats(cache, &after);
    cr_assert_eq(after.entries, 8);
    struct engine *e = start();
    struct gen_params p = params(held, 8, 0);
    struct result r;
    run(e, &p, &r);
    cr_assert(r.n_ids > 0 && strspn(r.text, "0123456789") == strlen(r.text), "%s", r.text);
    gen_grammar_release(held);
    engine_free(e);
}
