/* tests/unit/test_reencode.c — exact re-encoding with the real Qwen3 tokenizer: a resent reply gets
 * the model's own ids back where BPE would split it differently, and only where that is exact
 * (divergence, stop strings, held-back bytes), per namespace, under a byte cap; and the engine
 * keeps every generated id but the end-of-sequence one (skips without INFERD_TOKENIZER_DATA). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/reencode.h"
#include "engine/engine.h"
#include "test_support.h"

/* Qwen3's ids for the pieces of "Hello world" as a model may sample them: "Hel" + "lo" + " world",
 * where the tokenizer encodes the text as "Hello" + " world". */
#define ID_HEL 32713
#define ID_LO 385
#define ID_WORLD 1879
#define ID_HELLO 9707
#define ID_IM_END 151645

static const char PROMPT[] = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
static const char TAIL[] = "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n";

static struct tokenizer *tok;
static struct reencode *map;

static void load(size_t max_bytes)
{
    const char *root = getenv("INFERD_TOKENIZER_DATA");
    if (!root || !*root) {
        cr_skip_test("INFERD_TOKENIZER_DATA is not set (point it at a directory with qwen3/)");
        return;
    }
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/qwen3", root);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        cr_skip_test("%s is missing; run scripts/fetch-tokenizers.sh", path);
        return;
    }
    struct err err = {0};
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(reencode_create(tok, max_bytes, &map, &err), 0, "%s", err.msg);
}

static void teardown(void)
{
    reencode_free(map);
    tok_free(tok);
    map = NULL;
    tok = NULL;
}

TestSuite(reencode, .fini = teardown);

struct ids {
    int32_t *v;
    int n;
    int reused;
};

static struct ids plain(const char *text, bool add_special)
{
    struct ids r = {0};
    struct err err = {0};
    cr_assert_eq(tok_encode(tok, text, strlen(text), add_special, &r.v, &r.n, &err), 0, "%s",
                 err.msg);
    return r;
}

static struct ids encode_ns(uint64_t ns, const char *text)
{
    struct ids r = {0};
    struct err err = {0};
    cr_assert_eq(reencode_encode(map, ns, false, text, strlen(text), &r.v, &r.n, &r.reused, &err),
                 0, "%s", err.msg);
    return r;
}

static struct ids encode(const char *text)
{
    return encode_ns(0, text);
}

/* Encodes prompt (through the map), then remembers that the model answered gen_ids, of which the
 * client got emitted. Returns the prompt's ids. */
static struct ids turn(uint64_t ns, const char *prompt, const int32_t *gen_ids, int n_gen,
                       const char *emitted)
{
    struct ids p = encode_ns(ns, prompt);
    struct err err = {0};
    cr_assert_eq(reencode_remember(map, ns, false, prompt, strlen(prompt), p.v, p.n, emitted,
                                   strlen(emitted), gen_ids, n_gen, &err),
                 0, "%s", err.msg);
    return p;
}

static char *cat(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = malloc(n);
    cr_assert_not_null(s);
    snprintf(s, n, "%s%s%s", a, b, c);
    return s;
}

/* want = head[0..n_head) followed by the plain encoding of rest */
static void assert_ids(struct ids got, const int32_t *head, int n_head, const char *rest)
{
    struct ids r = plain(rest, false);
    cr_assert_eq(got.n, n_head + r.n, "%d ids, want %d + %d", got.n, n_head, r.n);
    cr_assert_arr_eq(got.v, head, (size_t)n_head * sizeof *head);
    cr_assert_arr_eq(got.v + n_head, r.v, (size_t)r.n * sizeof *r.v);
    free(r.v);
}

static void assert_plain(struct ids got, const char *text)
{
    struct ids r = plain(text, false);
    cr_assert_eq(got.reused, 0);
    cr_assert_eq(got.n, r.n);
    cr_assert_arr_eq(got.v, r.v, (size_t)r.n * sizeof *r.v);
    free(r.v);
}

static int32_t *join(const struct ids *p, const int32_t *more, int n_more)
{
    int32_t *v = malloc(((size_t)p->n + (size_t)n_more) * sizeof *v);
    cr_assert_not_null(v);
    memcpy(v, p->v, (size_t)p->n * sizeof *v);
    memcpy(v + p->n, more, (size_t)n_more * sizeof *v);
    return v;
}

static const int32_t SAMPLED[] = {ID_HEL, ID_LO, ID_WORLD};

Test(reencode, the_sampled_split_differs_from_the_tokenizers)
{
    load(REENCODE_MAX_BYTES);
    struct ids hw = plain("Hello world", false);
    cr_assert_eq(hw.n, 2);
    cr_assert_eq(hw.v[0], ID_HELLO, "the premise of these tests: Qwen3 encodes Hello as one token");
    cr_assert_eq(hw.v[1], ID_WORLD);
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    cr_assert_eq(tok_decode(tok, SAMPLED, 3, true, &text, &len, &err), 0, "%s", err.msg);
    cr_assert_str_eq(text, "Hello world");
    free(text);
    free(hw.v);
}

Test(reencode, a_resent_reply_gets_the_models_own_ids_then_the_remainder_encoded)
{
    load(REENCODE_MAX_BYTES);
    struct ids p = turn(0, PROMPT, SAMPLED, 3, "Hello world");
    cr_assert_eq(p.reused, 0, "nothing was remembered before the first turn");
    assert_plain(p, PROMPT);

    char *next = cat(PROMPT, "Hello world", TAIL);
    struct ids got = encode(next);
    int32_t *want = join(&p, SAMPLED, 3);
    assert_ids(got, want, p.n + 3, TAIL);
    cr_assert_eq(got.reused, p.n + 3);
    cr_assert_eq(got.v[p.n + 3], ID_IM_END, "special tokens in the remainder become their ids");

    struct ids cold = plain(next, false);
    cr_assert_neq(cold.n, got.n, "re-tokenizing the text would have given other ids");
    free(cold.v);
    free(want);
    free(got.v);
    free(p.v);
    free(next);
}

Test(reencode, a_prompt_diverging_inside_the_reply_gets_the_plain_encoding)
{
    load(REENCODE_MAX_BYTES);
    struct ids p = turn(0, PROMPT, SAMPLED, 3, "Hello world");
    char *next = cat(PROMPT, "Help me", TAIL);
    struct ids got = encode(next);
    assert_plain(got, next);
    free(got.v);
    free(next);

    /* Diverging inside the remembered prompt too. */
    next = cat("<|im_start|>user\nho<|im_end|>\n<|im_start|>assistant\n", "Hello world", TAIL);
    got = encode(next);
    assert_plain(got, next);
    free(got.v);
    free(next);
    free(p.v);
}

Test(reencode, namespaces_do_not_mix)
{
    load(REENCODE_MAX_BYTES);
    struct ids p = turn(7, PROMPT, SAMPLED, 3, "Hello world");
    char *next = cat(PROMPT, "Hello world", TAIL);
    struct ids other = encode_ns(8, next);
    assert_plain(other, next);
    struct ids dflt = encode_ns(0, next);
    assert_plain(dflt, next);
    struct ids own = encode_ns(7, next);
    cr_assert_eq(own.reused, p.n + 3);

    /* A completion (encoded with added special tokens) never takes a chat's ids either. */
    int32_t *ids = NULL;
    int n = 0, reused = -1;
    struct err err = {0};
    cr_assert_eq(reencode_encode(map, 7, true, next, strlen(next), &ids, &n, &reused, &err), 0);
    cr_assert_eq(reused, 0);
    free(ids);
    free(own.v);
    free(dflt.v);
    free(other.v);
    free(p.v);
    free(next);
}

Test(reencode, completions_continue_from_the_generated_ids)
{
    load(REENCODE_MAX_BYTES);
    int32_t *p = NULL;
    int n_p = 0, reused = -1;
    struct err err = {0};
    cr_assert_eq(reencode_encode(map, 0, true, "Say: ", 5, &p, &n_p, &reused, &err), 0);
    cr_assert_eq(reused, 0);
    cr_assert_eq(reencode_remember(map, 0, true, "Say: ", 5, p, n_p, "Hello world", 11, SAMPLED,
                                   3, &err),
                 0);
    int32_t *ids = NULL;
    int n = 0;
    cr_assert_eq(reencode_encode(map, 0, true, "Say: Hello world again", 22, &ids, &n, &reused,
                                 &err),
                 0);
    cr_assert_eq(reused, n_p + 3);
    cr_assert_arr_eq(ids, p, (size_t)n_p * sizeof *p);
    cr_assert_arr_eq(ids + n_p, SAMPLED, sizeof SAMPLED);
    free(ids);
    free(p);
}

Test(reencode, after_a_stop_string_only_tokens_inside_the_emitted_text_are_kept)
{
    load(REENCODE_MAX_BYTES);
    /* The stop string "orld" fired: the client got "Hello w" while " world" was sampled whole. */
    struct ids p = turn(0, PROMPT, SAMPLED, 3, "Hello w");
    char *next = cat(PROMPT, "Hello w", TAIL);
    struct ids got = encode(next);
    int32_t *want = join(&p, SAMPLED, 2);
    char *rest = cat("", " w", TAIL);
    assert_ids(got, want, p.n + 2, rest);
    free(rest);
    cr_assert_eq(got.reused, p.n + 2);
    free(want);
    free(got.v);
    free(next);
    free(p.v);
}

Test(reencode, nothing_is_kept_when_no_token_lies_inside_the_emitted_text)
{
    load(REENCODE_MAX_BYTES);
    struct ids p = turn(0, PROMPT, SAMPLED, 3, "He");
    struct reencode_stats st;
    reencode_get_stats(map, &st);
    cr_assert_eq(st.entries, 0);
    char *next = cat(PROMPT, "He", TAIL);
    struct ids got = encode(next);
    assert_plain(got, next);
    free(got.v);
    free(next);
    free(p.v);
}

Test(reencode, a_token_of_held_back_bytes_ends_the_entry_before_it)
{
    load(REENCODE_MAX_BYTES);
    /* "é" is two byte tokens; the generation stopped after the first, whose byte is not text yet. */
    int32_t c3 = tok_piece_to_id(tok, "\xc3\x83"); /* byte 0xC3 in byte-level BPE: "Ã" */
    cr_assert_geq(c3, 0);
    const int32_t gen[] = {ID_HEL, ID_LO, c3};
    struct ids p = turn(0, PROMPT, gen, 3, "Hello");
    char *next = cat(PROMPT, "Hello", TAIL);
    struct ids got = encode(next);
    int32_t *want = join(&p, gen, 2);
    assert_ids(got, want, p.n + 2, TAIL);
    free(want);
    free(got.v);
    free(next);
    free(p.v);
}

Test(reencode, a_conversation_is_one_entry_that_keeps_every_turns_cut)
{
    load(REENCODE_MAX_BYTES);
    struct ids p1 = turn(0, PROMPT, SAMPLED, 3, "Hello world");
    char *prompt2 = cat(PROMPT, "Hello world", TAIL);
    struct ids p2 = turn(0, prompt2, SAMPLED, 3, "Hello world");
    cr_assert_eq(p2.reused, p1.n + 3);
    struct reencode_stats st;
    reencode_get_stats(map, &st);
    cr_assert_eq(st.entries, 1, "turn 2's entry replaced turn 1's");

    /* Turn 3 resends both replies: both keep their ids. */
    char *prompt3 = cat(prompt2, "Hello world", TAIL);
    struct ids p3 = encode(prompt3);
    int32_t *want = join(&p2, SAMPLED, 3);
    assert_ids(p3, want, p2.n + 3, TAIL);
    free(want);

    /* Regenerating turn 2's reply differently still reuses turn 1's. */
    char *other = cat(prompt2, "Help", TAIL);
    struct ids got = encode(other);
    want = join(&p1, SAMPLED, 3);
    cr_assert_eq(got.reused, p1.n + 3);
    cr_assert_arr_eq(got.v, want, (size_t)(p1.n + 3) * sizeof *want);
    free(want);
    free(got.v);
    free(other);
    free(p3.v);
    free(prompt3);
    free(p2.v);
    free(prompt2);
    free(p1.v);
}

Test(reencode, the_byte_cap_evicts_the_least_recently_used_entry)
{
    /* Room for two of these entries but not three. */
    load(REENCODE_MAX_BYTES);
    struct ids a = turn(0, PROMPT, SAMPLED, 3, "Hello world");
    struct reencode_stats st;
    reencode_get_stats(map, &st);
    size_t one = st.bytes;
    reencode_free(map);
    struct err err = {0};
    cr_assert_eq(reencode_create(tok, one * 2 + one / 2, &map, &err), 0);

    const char *prompts[] = {
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nho<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nha<|im_end|>\n<|im_start|>assistant\n",
    };
    char *next[3];
    for (int i = 0; i < 3; i++)
        next[i] = cat(prompts[i], "Hello world", TAIL);
    struct ids t0 = turn(0, prompts[0], SAMPLED, 3, "Hello world");
    struct ids t1 = turn(0, prompts[1], SAMPLED, 3, "Hello world");
    struct ids hit = encode(next[0]); /* entry 0 is now the most recently used */
    cr_assert_gt(hit.reused, 0);
    struct ids t2 = turn(0, prompts[2], SAMPLED, 3, "Hello world");

    reencode_get_stats(map, &st);
    cr_assert_eq(st.entries, 2);
    cr_assert_eq(st.evictions, 1);
    cr_assert_leq(st.bytes, st.max_bytes);
    struct ids g0 = encode(next[0]), g1 = encode(next[1]), g2 = encode(next[2]);
    cr_assert_gt(g0.reused, 0, "used last, kept");
    assert_plain(g1, next[1]); /* least recently used: evicted */
    cr_assert_gt(g2.reused, 0, "newest, kept");

    /* A cap of 0 remembers nothing. */
    reencode_free(map);
    cr_assert_eq(reencode_create(tok, 0, &map, &err), 0);
    struct ids z = turn(0, prompts[0], SAMPLED, 3, "Hello world");
    struct ids zg = encode(next[0]);
    assert_plain(zg, next[0]);
    reencode_get_stats(map, &st);
    cr_assert_eq(st.entries, 0);

    for (int i = 0; i < 3; i++)
        free(next[i]);
    free(a.v);
    free(t0.v);
    free(t1.v);
    free(t2.v);
    free(hit.v);
    free(g0.v);
    free(g1.v);
    free(g2.v);
    free(z.v);
    free(zg.v);
}

/* ---------------------------------------------------------------- the engine's generated ids */

static char *model_dir;
static struct backend *be;
static struct model *model;

static void engine_setup(void)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
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
}

static void engine_teardown(void)
{
    tok_free(tok);
    model_free(model);
    backend_destroy(be);
    if (model_dir)
        test_rmtree(model_dir);
    free(model_dir);
    tok = NULL;
    model = NULL;
    be = NULL;
    model_dir = NULL;
}

TestSuite(generated_ids, .init = engine_setup, .fini = engine_teardown, .timeout = 120);

/* A finished greedy generation, drained whole. */
static void generate(const struct gen_params *p, struct gen_news *all)
{
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 2, .max_step_tokens = 64,
                                .max_queue = 4};
    struct engine *e = NULL;
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(engine_submit(e, p, &o, &err), 0, "%s", err.msg);
    struct gen_cursor cur = {0};
    for (;;) {
        struct gen_news n;
        cr_assert_eq(gen_output_drain(o, &cur, 1000, &n), 0);
        enum gen_finish f = n.finish;
        gen_news_free(&n);
        if (f != GEN_RUNNING)
            break;
    }
    struct gen_cursor whole = {0};
    cr_assert_eq(gen_output_drain(o, &whole, 0, all), 0);
    gen_output_release(o);
    engine_free(e);
}

Test(generated_ids, every_generated_id_is_kept_without_logprobs_and_decodes_to_the_text)
{
    const int32_t prompt[] = {1, 5, 9, 13};
    struct gen_params p = {.prompt = prompt, .n_prompt = 4, .max_tokens = 12,
                           .sampling = {.temperature = 0, .top_p = 1}, .logprobs = -1};
    struct gen_news all;
    generate(&p, &all);
    cr_assert_eq(all.finish, GEN_FINISH_LENGTH);
    cr_assert_eq(all.n_tokens, 0, "no logprob records were asked for");
    cr_assert_eq(all.n_ids, 12);
    cr_assert_eq((int)all.n_ids, all.n_generated);
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    cr_assert_eq(tok_decode(tok, all.ids, (int)all.n_ids, true, &text, &len, &err), 0);
    cr_assert_eq(len, all.text_len);
    cr_assert(len == 0 || !memcmp(text, all.text, len), "the ids decode to the emitted text");
    free(text);

    /* The same request ended by one of its own tokens as end-of-sequence: that token is not kept. */
    int k = 1;
    for (; k < (int)all.n_ids; k++) {
        bool seen = false;
        for (int j = 0; j < k; j++)
            seen = seen || all.ids[j] == all.ids[k];
        if (!seen)
            break;
    }
    cr_assert_lt(k, (int)all.n_ids, "a token that is new at its position");
    int32_t eos = all.ids[k];
    p.eos_ids = &eos;
    p.n_eos = 1;
    struct gen_news stopped;
    generate(&p, &stopped);
    cr_assert_eq(stopped.finish, GEN_FINISH_STOP);
    cr_assert_eq(stopped.n_generated, k + 1, "the end-of-sequence token is counted as generated");
    cr_assert_eq((int)stopped.n_ids, k, "but not kept among the ids");
    cr_assert_arr_eq(stopped.ids, all.ids, (size_t)k * sizeof *all.ids);
    gen_news_free(&stopped);
    gen_news_free(&all);
}
