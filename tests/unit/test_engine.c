/* tests/unit/test_engine.c — the serving engine: batched generation matches solo generation,
 * preemption under a small KV pool loses nothing, and queue, context, cancel and stop rules. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/strbuf.h"
#include "base/timer.h"
#include "engine/engine.h"
#include "engine/sequence.h"
#include "test_support.h"
#include "text/tokenizer.h"

static char *model_dir;
static struct backend *be;
static struct model *model;
static struct tokenizer *tok;

/* tiny-qwen3 fitted to the real Qwen3 tokenizer (fetched by `make text-data`). */
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
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(model_dir, be, &model, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(model_dir, &tok, &err), 0, "%s", err.msg);
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

TestSuite(engine, .init = setup, .fini = teardown, .timeout = 120);

static struct engine *start(int max_seqs, int max_queue, int kv_blocks, int n_ctx)
{
    struct engine_config cfg = {.n_ctx = n_ctx, .max_seqs = max_seqs, .max_step_tokens = 64,
                                .max_queue = max_queue, .kv_blocks = kv_blocks};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

static struct gen_params greedy(const int32_t *prompt, int n, int max_tokens)
{
    return (struct gen_params){.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens,
                               .sampling = {.temperature = 0, .top_p = 1}, .logprobs = 1};
}

static void wait_done(struct gen_output *o)
{
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
}

/* Submits p and waits for it to finish; the caller releases the output. */
static struct gen_output *run_to_end(struct engine *e, const struct gen_params *p)
{
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, p, &o, &err), 0, "%s", err.msg);
    wait_done(o);
    return o;
}

/* The generated token ids of a finished output (logprobs requested). */
static int ids_of(const struct gen_output *o, int32_t *ids, int cap)
{
    int n = (int)o->n_tokens < cap ? (int)o->n_tokens : cap;
    for (int i = 0; i < n; i++)
        ids[i] = gen_output_tokens(o)[i].id;
    return n;
}

/* Logprob margin between greedy's choice and the runner-up at each step. */
static void margins_of(const struct gen_output *o, float *margin, int n)
{
    for (int i = 0; i < n; i++) {
        const struct gen_token *t = &gen_output_tokens(o)[i];
        margin[i] = t->n_top >= 2 ? t->top[0].logprob - t->top[1].logprob : 1e9f;
    }
}

/* Two greedy runs of one prompt computed in different batch shapes agree
 * token for token, except that float rounding may break a near tie (the
 * reference's two best tokens within 1e-3); after such a step the runs
 * legitimately part. */
static void assert_same_greedy(const int32_t *want, const float *want_margin, const int32_t *got,
                               int n, int prompt)
{
    for (int j = 0; j < n; j++) {
        if (want[j] == got[j])
            continue;
        cr_assert_lt(want_margin[j], 1e-3f,
                     "prompt %d step %d: %d vs %d with a margin of %g, not a near tie", prompt, j,
                     want[j], got[j], want_margin[j]);
        return;
    }
}

#define N_PROMPTS 5
static const int32_t prompts[N_PROMPTS][12] = {
    {9707, 11, 1879, 0},
    {785, 6722, 315, 9625, 374, 0},
    {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 0},
    {40, 1079, 0},
    {3838, 374, 279, 7290, 315, 2272, 30, 0},
};

static int prompt_len(int i)
{
    int n = 0;
    while (prompts[i][n])
        n++;
    return n;
}

static void generate_all(struct engine *e, int max_tokens, bool together, int32_t out[][64],
                         float margin[][64], int *n_out)
{
    struct gen_output *o[N_PROMPTS];
    struct err err = {0};
    for (int i = 0; i < N_PROMPTS; i++) {
        struct gen_params p = greedy(prompts[i], prompt_len(i), max_tokens);
        cr_assert_eq(engine_submit(e, &p, &o[i], &err), 0, "%s", err.msg);
        if (!together)
            wait_done(o[i]);
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        wait_done(o[i]);
        cr_assert_eq(o[i]->finish, GEN_FINISH_LENGTH, "prompt %d finished with %d", i,
                     o[i]->finish);
        n_out[i] = ids_of(o[i], out[i], 64);
        margins_of(o[i], margin[i], n_out[i]);
        cr_assert_eq(n_out[i], max_tokens);
        cr_assert_eq(o[i]->n_generated, max_tokens);
        gen_output_release(o[i]);
    }
}

Test(engine, batched_generation_matches_one_at_a_time)
{
    struct engine *e = start(8, 16, 0, 256);
    int32_t solo[N_PROMPTS][64], batched[N_PROMPTS][64];
    float solo_margin[N_PROMPTS][64], batched_margin[N_PROMPTS][64];
    int n_solo[N_PROMPTS], n_batched[N_PROMPTS];
    generate_all(e, 24, false, solo, solo_margin, n_solo);
    generate_all(e, 24, true, batched, batched_margin, n_batched);
    for (int i = 0; i < N_PROMPTS; i++)
        assert_same_greedy(solo[i], solo_margin[i], batched[i], 24, i);
    engine_free(e);
}

/* The CPU backend's ops with a submit that does nothing: the engine then takes the backend
 * for an asynchronous one and hands a step's news to its readers during the next step. */
static struct backend_ops async_ops;
static void submit_nothing(struct backend *b) { (void)b; }

static void pose_as_async(void)
{
    async_ops = *be->ops;
    async_ops.submit = submit_nothing;
    be->ops = &async_ops;
    cr_assert(model_overlaps_host_work(model));
}

Test(engine, news_handed_over_during_the_next_step_loses_nothing)
{
    struct engine *e = start(8, 16, 0, 256);
    int32_t solo[N_PROMPTS][64], batched[N_PROMPTS][64];
    float solo_margin[N_PROMPTS][64], batched_margin[N_PROMPTS][64];
    int n_solo[N_PROMPTS], n_batched[N_PROMPTS];
    generate_all(e, 24, false, solo, solo_margin, n_solo);
    engine_free(e);
    const struct backend_ops *cpu_ops = be->ops;
    pose_as_async();
    e = start(8, 16, 0, 256);
    generate_all(e, 24, true, batched, batched_margin, n_batched);
    for (int i = 0; i < N_PROMPTS; i++)
        assert_same_greedy(solo[i], solo_margin[i], batched[i], 24, i);

    /* one reader cancels while its news may wait for the next step; the others stream on */
    struct gen_output *o[3];
    struct err err = {0};
    struct gen_params p = greedy(prompts[0], prompt_len(0), 40);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(engine_submit(e, &p, &o[i], &err), 0, "%s", err.msg);
    struct gen_cursor cur = {0};
    size_t streamed = 0;
    for (enum gen_finish finish = GEN_RUNNING; finish == GEN_RUNNING;) {
        struct gen_news n;
        cr_assert_eq(gen_output_drain(o[1], &cur, 1000, &n), 0);
        streamed += n.n_tokens;
        finish = n.finish;
        gen_news_free(&n);
        if (streamed >= 2)
            atomic_store(&o[0]->cancel, true);
    }
    cr_assert_eq(streamed, 40, "every token reached the streaming reader");
    wait_done(o[0]);
    wait_done(o[2]);
    cr_assert_eq(o[0]->finish, GEN_FINISH_CANCELLED);
    cr_assert_eq(o[2]->finish, GEN_FINISH_LENGTH);
    cr_assert_eq(o[2]->n_tokens, 40);
    for (int j = 0; j < 40; j++)
        cr_assert_eq(gen_output_tokens(o[1])[j].id, gen_output_tokens(o[2])[j].id);
    for (int i = 0; i < 3; i++)
        gen_output_release(o[i]);
    engine_free(e);
    be->ops = cpu_ops;
}

Test(engine, preemption_under_a_small_kv_pool_loses_nothing)
{
    /* Room for one full 64-token context (4 blocks of 16) plus a little:
     * five sequences of ~50 positions must take turns and be recomputed. */
    struct engine *big = start(8, 16, 0, 64);
    int32_t want[N_PROMPTS][64], got[N_PROMPTS][64];
    float want_margin[N_PROMPTS][64], got_margin[N_PROMPTS][64];
    int n_want[N_PROMPTS], n_got[N_PROMPTS];
    generate_all(big, 40, false, want, want_margin, n_want);
    engine_free(big);

    struct engine *small = start(8, 16, 6, 64);
    generate_all(small, 40, true, got, got_margin, n_got);
    for (int i = 0; i < N_PROMPTS; i++)
        assert_same_greedy(want[i], want_margin[i], got[i], 40, i);
    struct engine_stats st;
    engine_get_stats(small, &st);
    cr_assert_eq(st.requests_finished, N_PROMPTS);
    cr_assert_gt(st.preemptions, 0, "the pool was meant to run short");
    engine_free(small);
}

Test(engine, prompt_that_fills_the_context_is_refused_with_both_numbers)
{
    struct engine *e = start(2, 4, 0, 32);
    int32_t prompt[32];
    for (int i = 0; i < 32; i++)
        prompt[i] = 100 + i;
    struct gen_params p = greedy(prompt, 32, 4);
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), -INFERD_ERANGE);
    cr_assert(strstr(err.msg, "32 tokens") && strstr(err.msg, "holds 32"), "%s", err.msg);
    /* One token shorter fits, and max_tokens is clamped to the one position left. */
    p.n_prompt = 31;
    p.max_tokens = 100;
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    wait_done(o);
    cr_assert_eq(o->finish, GEN_FINISH_LENGTH);
    cr_assert_eq(o->n_generated, 1);
    gen_output_release(o);
    engine_free(e);
}

Test(engine, full_queue_refuses_with_busy)
{
    struct engine *e = start(1, 2, 0, 512);
    struct gen_output *o[8];
    int accepted = 0, refused = 0;
    struct err err = {0};
    int32_t prompt[] = {9707, 11, 1879};
    for (int i = 0; i < 8; i++) {
        struct gen_params p = greedy(prompt, 3, 400);
        int rc = engine_submit(e, &p, &o[accepted], &err);
        if (rc == 0)
            accepted++;
        else {
            cr_assert_eq(rc, -INFERD_EBUSY, "%s", err.msg);
            refused++;
        }
    }
    cr_assert_geq(refused, 1);
    cr_assert_geq(accepted, 2);
    for (int i = 0; i < accepted; i++) {
        atomic_store(&o[i]->cancel, true);
        wait_done(o[i]);
        gen_output_release(o[i]);
    }
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.requests_refused, (uint64_t)refused);
    engine_free(e);
}

Test(engine, cancel_finishes_the_generation_early)
{
    struct engine *e = start(2, 4, 0, 4096);
    int32_t prompt[] = {9707, 11, 1879};
    struct gen_params p = greedy(prompt, 3, 4000);
    p.logprobs = -1;
    struct gen_output *o;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->n_generated < 3 && o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 100);
    pthread_mutex_unlock(&o->mu);
    atomic_store(&o->cancel, true);
    wait_done(o);
    cr_assert_eq(o->finish, GEN_FINISH_CANCELLED);
    cr_assert_lt(o->n_generated, 4000);
    gen_output_release(o);
    engine_free(e);
}

Test(engine, stop_string_ends_the_text_before_it)
{
    struct engine *e = start(2, 4, 0, 512);
    int32_t prompt[] = {785, 6722, 315};
    struct gen_params p = greedy(prompt, 3, 30);
    struct gen_output *o = run_to_end(e, &p);
    cr_assert_gt(o->text.len, 4);
    /* Stop on a piece of the middle of what greedy decoding produced. */
    size_t mid = o->text.len / 2;
    while (mid > 0 && ((unsigned char)o->text.data[mid] & 0xC0) == 0x80)
        mid--;
    size_t end = mid + 1;
    while (end < o->text.len && ((unsigned char)o->text.data[end] & 0xC0) == 0x80)
        end++;
    char stop[64];
    snprintf(stop, sizeof stop, "%.*s", (int)(end - mid), o->text.data + mid);
    char *full = strdup(o->text.data);
    gen_output_release(o);

    const char *stops[] = {stop};
    p.stop = stops;
    p.n_stop = 1;
    o = run_to_end(e, &p);
    cr_assert_eq(o->finish, GEN_FINISH_STOP);
    const char *first = strstr(full, stop);
    cr_assert_eq(o->text.len, (size_t)(first - full), "text '%s' vs full '%s' stop '%s'",
                 o->text.data ? o->text.data : "", full, stop);
    cr_assert_eq(memcmp(o->text.data ? o->text.data : "", full, o->text.len), 0);
    free(full);
    gen_output_release(o);
    engine_free(e);
}

Test(engine, end_of_sequence_token_stops_and_is_not_text)
{
    struct engine *e = start(2, 4, 0, 512);
    int32_t prompt[] = {785, 6722, 315};
    struct gen_params p = greedy(prompt, 3, 10);
    struct gen_output *o = run_to_end(e, &p);
    int32_t first = gen_output_tokens(o)[0].id;
    gen_output_release(o);
    /* Declaring greedy's first token an end-of-sequence token ends at once. */
    p.eos_ids = &first;
    p.n_eos = 1;
    o = run_to_end(e, &p);
    cr_assert_eq(o->finish, GEN_FINISH_STOP);
    cr_assert_eq(o->n_generated, 1);
    cr_assert_eq(o->text.len, 0);
    gen_output_release(o);
    engine_free(e);
}

Test(engine, same_seed_same_tokens_under_sampling)
{
    struct engine *e = start(4, 8, 0, 512);
    int32_t prompt[] = {9707, 11, 1879};
    int32_t runs[3][16];
    uint64_t seeds[3] = {7, 7, 8};
    for (int r = 0; r < 3; r++) {
        struct gen_params p = greedy(prompt, 3, 16);
        p.sampling = (struct sampler_params){.temperature = 1.0f, .top_p = 1, .seed = seeds[r]};
        struct gen_output *o = run_to_end(e, &p);
        cr_assert_eq(ids_of(o, runs[r], 16), 16);
        gen_output_release(o);
    }
    cr_assert_arr_eq(runs[0], runs[1], sizeof runs[0]);
    cr_assert_arr_neq(runs[0], runs[2], sizeof runs[0]);
    engine_free(e);
}

Test(engine, drain_hands_over_every_byte_and_token_once)
{
    int32_t prompt[] = {1, 5, 9, 13};
    struct engine *e = start(2, 4, 0, 512);
    struct gen_params p = greedy(prompt, 4, 12);
    struct gen_output *o = NULL;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    struct gen_cursor cur = {0};
    char text[4096];
    size_t text_len = 0, n_tokens = 0;
    int32_t ids[64];
    enum gen_finish finish = GEN_RUNNING;
    while (finish == GEN_RUNNING) {
        struct gen_news n;
        cr_assert_eq(gen_output_drain(o, &cur, 1000, &n), 0);
        cr_assert_eq(n.text_from, text_len, "news starts where the last one ended");
        cr_assert_leq(text_len + n.text_len, sizeof text);
        if (n.text_len)
            memcpy(text + text_len, n.text, n.text_len);
        text_len += n.text_len;
        for (size_t i = 0; i < n.n_tokens; i++)
            ids[n_tokens++] = n.tokens[i].id;
        finish = n.finish;
        gen_news_free(&n);
    }
    cr_assert_eq(finish, GEN_FINISH_LENGTH);
    cr_assert_eq(text_len, o->text.len);
    cr_assert(text_len == 0 || !memcmp(text, o->text.data, text_len));
    cr_assert_eq(n_tokens, o->n_tokens);
    for (size_t i = 0; i < n_tokens; i++)
        cr_assert_eq(ids[i], gen_output_tokens(o)[i].id);
    struct gen_news after;
    cr_assert_eq(gen_output_drain(o, &cur, 0, &after), 0);
    cr_assert_eq(after.text_len, 0);
    cr_assert_eq(after.n_tokens, 0);
    cr_assert_eq(after.finish, GEN_FINISH_LENGTH);
    gen_output_release(o);
    engine_free(e);
}

/* A producer for gen_output_hold: publishes each piece after delay_ms, then the finish. */
struct hold_producer {
    struct gen_output *o;
    const char *const *pieces;
    int n_pieces;
    int delay_ms;
    bool finish;
};

static void *hold_produce(void *arg)
{
    struct hold_producer *h = arg;
    for (int i = 0; i <= h->n_pieces; i++) {
        if (i == h->n_pieces && !h->finish)
            break;
        usleep((useconds_t)h->delay_ms * 1000);
        struct gen_pending p;
        memset(&p, 0, sizeof p);
        if (i < h->n_pieces) {
            cr_assert(strbuf_append(&p.text, h->pieces[i], strlen(h->pieces[i])));
            p.n_generated = 1;
        } else {
            p.finish = GEN_FINISH_STOP;
        }
        cr_assert(gen_output_publish(h->o, &p));
    }
    return NULL;
}

/* A held reader (--stream-interval's window) is not woken by text: it sleeps to the end of
 * its window and then takes everything that came in one drain; the finish wakes it at once. */
Test(engine, a_held_reader_takes_its_window_at_once_and_wakes_for_the_finish)
{
    static const char *const pieces[] = {"al", "pha", " beta"};
    struct gen_output *o = gen_output_create(4);
    cr_assert(o);
    struct hold_producer h = {o, pieces, 3, 5, false};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, hold_produce, &h), 0);
    uint64_t t0 = now_ns(), window = 300 * 1000000ull;
    cr_assert_not(gen_output_hold(o, t0 + window), "no finish was published");
    cr_assert_geq(now_ns() - t0, window, "text ended the hold before its window");
    cr_assert_not(o->held);
    pthread_join(t, NULL);
    struct gen_cursor cur = {0};
    struct gen_news n;
    cr_assert_eq(gen_output_drain(o, &cur, 0, &n), 0);
    cr_assert_eq(n.text_len, strlen("alpha beta"));
    cr_assert_str_eq(n.text, "alpha beta", "the window's pieces in one drain");
    cr_assert_eq(n.finish, GEN_RUNNING);
    gen_news_free(&n);

    /* the finish ends a hold long before its window */
    struct hold_producer fin = {o, pieces, 1, 5, true};
    cr_assert_eq(pthread_create(&t, NULL, hold_produce, &fin), 0);
    t0 = now_ns();
    cr_assert(gen_output_hold(o, t0 + 60ull * 1000000000ull), "the finish was published");
    cr_assert_lt(now_ns() - t0, 30ull * 1000000000ull, "the finish did not wake the reader");
    pthread_join(t, NULL);
    cr_assert_eq(gen_output_drain(o, &cur, 0, &n), 0);
    cr_assert_str_eq(n.text, "al");
    cr_assert_eq(n.finish, GEN_FINISH_STOP);
    gen_news_free(&n);
    gen_output_release(o);
    gen_output_release(o);
}

/* ---- the prefix cache: a hit gives exactly the tokens of a cold run ---------
 * Every tiny architecture (its own vocabulary, the Qwen3 tokenizer only for
 * detokenizing ids below 300), exact mode. Each case runs a request cold on an
 * engine without the cache, then on an engine with it after a first request
 * that leaves the prefix behind, and wants the same tokens and the reuse it
 * expects. */

/* tiny-mistral (window 24) and tiny-gemma3 (local layers, window 16) run on
 * windowed pools: their sequences pass their windows */
static const char *const tiny_presets[] = {"tiny-llama",   "tiny-llama3", "tiny-llama-linear",
                                           "tiny-mistral", "tiny-qwen2",  "tiny-qwen3",
                                           "tiny-qwen3-gqa1", "tiny-gemma3"};

static void cache_setup(void)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qwen3", data);
    struct err err = {0};
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2, .mode = COMPUTE_EXACT},
                                    &be, &err),
                 0, "%s", err.msg);
}

TestSuite(engine_cache, .init = cache_setup, .fini = teardown, .timeout = 600);

static void load_preset(const char *preset)
{
    if (model)
        model_free(model);
    if (model_dir)
        test_rmtree(model_dir);
    model_dir = test_mkdtemp();
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s mkmodel --preset %s --seed 5 --out %s >/dev/null", INFERD_BINARY,
             preset, model_dir);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    struct err err = {0};
    cr_assert_eq(model_load(model_dir, be, &model, &err), 0, "%s", err.msg);
}

static struct engine *start_cached(size_t cache_bytes, int max_seqs, int kv_blocks)
{
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = max_seqs, .max_step_tokens = 64,
                                .max_queue = 32, .kv_blocks = kv_blocks,
                                .prompt_cache_bytes = cache_bytes};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

#define CACHE_GEN 8

/* A deterministic prompt of n ids in [1, 300) starting from seed. */
static void make_prompt(int32_t *out, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        out[i] = 1 + (int32_t)((seed >> 8) % 299);
    }
}

static struct gen_params cache_params(const int32_t *prompt, int n, bool sampled)
{
    struct gen_params p = greedy(prompt, n, CACHE_GEN);
    if (sampled)
        p.sampling = (struct sampler_params){.temperature = 1.0f, .top_p = 1, .seed = 7};
    return p;
}

/* Runs p to its end on e: its tokens into ids, its reused prompt tokens returned. */
static int run_ids(struct engine *e, const struct gen_params *p, int32_t *ids)
{
    struct gen_output *o = run_to_end(e, p);
    cr_assert_eq(o->finish, GEN_FINISH_LENGTH, "finished with %d: %s", o->finish, o->error);
    cr_assert_eq(ids_of(o, ids, CACHE_GEN), CACHE_GEN);
    int cached = o->n_cached;
    gen_output_release(o);
    return cached;
}

struct hit_case {
    const char *name;
    int first_len;  /* the request that leaves its blocks behind: base[0, first_len) */
    int shared;     /* the second shares base[0, shared) ... */
    int len;        /* ... and is len tokens long (the rest differs) */
    int want_cached;
};

/* 16-token blocks; the first request leaves all it computed: its prompt and
 * its 8 generated tokens (the last one's K/V computed after it finished), the
 * last, partly filled block as a partial entry. */
static const struct hit_case hit_cases[] = {
    {"one block", 24, 16, 30, 16},
    {"many blocks", 48, 48, 56, 48},
    {"a partial block", 48, 37, 45, 37},
    {"the whole prompt", 48, 48, 48, 47},
};

static void check_hits(const char *preset, bool sampled)
{
    enum { N_CASES = sizeof hit_cases / sizeof hit_cases[0] };
    load_preset(preset);
    int32_t base[N_CASES][64], second[N_CASES][64], want[N_CASES][CACHE_GEN];
    for (int c = 0; c < N_CASES; c++) {
        make_prompt(base[c], 64, 100 + (uint32_t)c);
        make_prompt(second[c], 64, 900 + (uint32_t)c);
        memcpy(second[c], base[c], (size_t)hit_cases[c].shared * sizeof *base[c]);
    }
    /* The cold runs first, and that engine gone before the warm one starts:
     * the two share one backend, and an engine may still be computing a
     * finished request's last token after its reader saw the finish. */
    struct engine *cold = start_cached(0, 4, 0);
    for (int c = 0; c < N_CASES; c++) {
        struct gen_params p = cache_params(second[c], hit_cases[c].len, sampled);
        cr_assert_eq(run_ids(cold, &p, want[c]), 0, "the cold engine reuses nothing");
    }
    engine_free(cold);
    struct engine *warm = start_cached(16u << 20, 4, 0);
    for (int c = 0; c < N_CASES; c++) {
        const struct hit_case *hc = &hit_cases[c];
        int32_t got[CACHE_GEN], first_ids[CACHE_GEN];
        struct gen_params first = cache_params(base[c], hc->first_len, sampled);
        struct gen_params p = cache_params(second[c], hc->len, sampled);
        run_ids(warm, &first, first_ids);
        int cached = run_ids(warm, &p, got);
        cr_assert_eq(cached, hc->want_cached, "%s, %s: %d tokens reused, %d expected", preset,
                     hc->name, cached, hc->want_cached);
        cr_assert_arr_eq(got, want[c], sizeof want[c], "%s, %s (%s): a hit changed the tokens",
                         preset, hc->name, sampled ? "sampled" : "greedy");
    }
    struct engine_stats st;
    engine_get_stats(warm, &st);
    cr_assert_geq(st.prompt_cache.hits, 4);
    engine_free(warm);
}

Test(engine_cache, a_hit_gives_the_tokens_of_a_cold_run_greedy_every_architecture)
{
    for (size_t i = 0; i < sizeof tiny_presets / sizeof tiny_presets[0]; i++)
        check_hits(tiny_presets[i], false);
}

Test(engine_cache, a_hit_gives_the_tokens_of_a_cold_run_sampled_every_architecture)
{
    for (size_t i = 0; i < sizeof tiny_presets / sizeof tiny_presets[0]; i++)
        check_hits(tiny_presets[i], true);
}

/* Requests sharing a 32-token system prompt, submitted together (and again
 * once the first are done), under a roomy cache and under a tiny one. */
static void check_shared_prefix(size_t cache_bytes, int kv_blocks)
{
    load_preset("tiny-qwen3");
    enum { N = 6 };
    int32_t prompts[N][48], want[N][CACHE_GEN], got[N][CACHE_GEN];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], 48, 300 + (uint32_t)i);
        make_prompt(prompts[i], 32, 77); /* the shared system prompt */
    }
    struct engine *cold = start_cached(0, 4, 0);
    for (int i = 0; i < N; i++) {
        struct gen_params p = cache_params(prompts[i], 40 + i, i % 2);
        run_ids(cold, &p, want[i]);
    }
    engine_free(cold);
    struct engine *warm = start_cached(cache_bytes, 4, kv_blocks);
    for (int round = 0; round < 2; round++) {
        struct gen_output *o[N];
        struct err err = {0};
        for (int i = 0; i < N; i++) {
            struct gen_params p = cache_params(prompts[i], 40 + i, i % 2);
            cr_assert_eq(engine_submit(warm, &p, &o[i], &err), 0, "%s", err.msg);
        }
        for (int i = 0; i < N; i++) {
            wait_done(o[i]);
            cr_assert_eq(o[i]->finish, GEN_FINISH_LENGTH);
            cr_assert_eq(ids_of(o[i], got[i], CACHE_GEN), CACHE_GEN);
            gen_output_release(o[i]);
            cr_assert_arr_eq(got[i], want[i], sizeof want[i], "round %d request %d", round, i);
        }
    }
    struct engine_stats st;
    engine_get_stats(warm, &st);
    cr_assert_gt(st.prompt_cache.hits, 0, "the shared prefix was reused");
    if (kv_blocks)
        cr_assert_gt(st.prompt_cache.evictions, 0, "the pool was meant to run short");
    engine_free(warm);
}

Test(engine_cache, concurrent_requests_share_a_prefix_and_keep_their_tokens)
{
    check_shared_prefix(16u << 20, 0);
}

Test(engine_cache, eviction_pressure_keeps_the_tokens)
{
    /* 12 blocks in all: four requests of up to 4 blocks each must take turns
     * (preempting and evicting), and the cache keeps at most one block. */
    size_t block = 4 * 2 * 128 * 4 * 2 * 16; /* tiny-qwen3: layers, kv heads, dims, f32, K+V, slots */
    check_shared_prefix(block, 12);
}

Test(engine_cache, session_close_releases_its_blocks_once)
{
    load_preset("tiny-qwen3");
    struct engine *e = start_cached(16u << 20, 2, 0);
    int32_t prompt[40];
    make_prompt(prompt, 40, 5);
    struct gen_params p = cache_params(prompt, 40, false);
    p.session_id = "chat-1";
    int32_t ids[CACHE_GEN];
    run_ids(e, &p, ids);
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.prompt_cache.sessions, 1);
    cr_assert_eq(st.prompt_cache.session_misses, 1);
    struct err err = {0};
    int released = -2;
    cr_assert_eq(engine_close_session(e, "chat-1", &released, &err), 0, "%s", err.msg);
    cr_assert_eq(released, 3, "40 + 8 tokens: 3 full blocks, the last token's K/V computed too");
    cr_assert_eq(engine_close_session(e, "chat-1", &released, &err), 0, "%s", err.msg);
    cr_assert_eq(released, -1);
    engine_get_stats(e, &st);
    cr_assert_eq(st.prompt_cache.sessions, 0);
    engine_shutdown(e, 0);
    cr_assert_eq(engine_close_session(e, "chat-1", &released, &err), -INFERD_EBUSY);
    engine_free(e);
}

/* ---- the next turn reuses the whole previous sequence ------------------------
 * A finished request's last sampled token has its K/V computed in one more
 * step after its reader is told, and its partly filled last block is cached
 * as a partial entry: a request whose prompt is the first's prompt, all its
 * generated tokens and more reuses all of them. */

/* Runs p to its end on e: its generated ids into ids (*n of them, at most
 * cap), its reused prompt tokens into *cached; returns how it finished. */
static enum gen_finish run_turn(struct engine *e, const struct gen_params *p, int32_t *ids,
                                int cap, int *n, int *cached)
{
    struct gen_output *o = run_to_end(e, p);
    enum gen_finish finish = o->finish;
    *n = ids_of(o, ids, cap);
    cr_assert_eq(*n, o->n_generated);
    *cached = o->n_cached;
    gen_output_release(o);
    return finish;
}

struct turn_case {
    const char *name;
    int n_prompt;  /* of the first turn, which generates up to CACHE_GEN tokens */
    bool eos;      /* its 4th greedy token declared end-of-sequence */
};

static const struct turn_case turn_cases[] = {
    {"ending inside a block", 21, false},    /* 21 + 8 = 29: a partial entry of 13 */
    {"ending on a block boundary", 24, false}, /* 24 + 8 = 32: two full blocks */
    {"ending at an end-of-sequence token", 30, true},
};

static void check_next_turn(const char *preset)
{
    enum { N = sizeof turn_cases / sizeof turn_cases[0], EXTRA = 5 };
    load_preset(preset);
    int32_t prompt[N][32], first_ids[N][CACHE_GEN], next[N][64], want[N][CACHE_GEN], eos[N];
    int n_first[N], n_next[N];
    struct gen_params first[N];
    /* Cold: the first turn's tokens, then the next turn's answer without the cache. */
    struct engine *cold = start_cached(0, 4, 0);
    for (int c = 0; c < N; c++) {
        const struct turn_case *tc = &turn_cases[c];
        int cached;
        make_prompt(prompt[c], tc->n_prompt, 40 + (uint32_t)c);
        first[c] = cache_params(prompt[c], tc->n_prompt, false);
        enum gen_finish want_finish = GEN_FINISH_LENGTH;
        if (tc->eos) {
            run_turn(cold, &first[c], first_ids[c], CACHE_GEN, &n_first[c], &cached);
            eos[c] = first_ids[c][3];
            first[c].eos_ids = &eos[c];
            first[c].n_eos = 1;
            want_finish = GEN_FINISH_STOP;
        }
        cr_assert_eq(run_turn(cold, &first[c], first_ids[c], CACHE_GEN, &n_first[c], &cached),
                     want_finish, "%s: %s", preset, tc->name);
        n_next[c] = tc->n_prompt + n_first[c] + EXTRA;
        memcpy(next[c], prompt[c], (size_t)tc->n_prompt * sizeof *next[c]);
        memcpy(next[c] + tc->n_prompt, first_ids[c], (size_t)n_first[c] * sizeof *next[c]);
        make_prompt(next[c] + tc->n_prompt + n_first[c], EXTRA, 70 + (uint32_t)c);
        struct gen_params p = cache_params(next[c], n_next[c], false);
        run_ids(cold, &p, want[c]);
    }
    engine_free(cold); /* the engines share one backend: one at a time */
    struct engine *warm = start_cached(16u << 20, 4, 0);
    for (int c = 0; c < N; c++) {
        const struct turn_case *tc = &turn_cases[c];
        int32_t ids[CACHE_GEN], got[CACHE_GEN];
        int n, cached;
        run_turn(warm, &first[c], ids, CACHE_GEN, &n, &cached);
        cr_assert_eq(n, n_first[c]);
        cr_assert_arr_eq(ids, first_ids[c], (size_t)n * sizeof *ids);
        struct gen_params p = cache_params(next[c], n_next[c], false);
        cached = run_ids(warm, &p, got);
        cr_assert_eq(cached, tc->n_prompt + n_first[c],
                     "%s, %s: %d tokens reused of %d prompt + %d generated", preset, tc->name,
                     cached, tc->n_prompt, n_first[c]);
        cr_assert_arr_eq(got, want[c], sizeof want[c], "%s, %s: the next turn's tokens changed",
                         preset, tc->name);
    }
    struct engine_stats st;
    engine_get_stats(warm, &st);
    cr_assert_eq(st.requests_finished, 2 * N);
    engine_free(warm);
}

Test(engine_cache, the_next_turn_reuses_the_whole_previous_sequence_every_architecture)
{
    for (size_t i = 0; i < sizeof tiny_presets / sizeof tiny_presets[0]; i++)
        check_next_turn(tiny_presets[i]);
}

Test(engine_cache, a_cancelled_request_leaves_what_it_computed_its_partial_block_too)
{
    load_preset("tiny-qwen3");
    int32_t prompt[20], next[256];
    make_prompt(prompt, 20, 11);
    struct engine *e = start_cached(16u << 20, 2, 0);
    struct gen_params p = cache_params(prompt, 20, false);
    p.max_tokens = 200;
    struct gen_output *o;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->n_generated < 5 && o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 100);
    pthread_mutex_unlock(&o->mu);
    atomic_store(&o->cancel, true);
    wait_done(o);
    cr_assert_eq(o->finish, GEN_FINISH_CANCELLED);
    int n_gen = ids_of(o, next + 20, 200);
    gen_output_release(o);
    memcpy(next, prompt, sizeof prompt);
    make_prompt(next + 20 + n_gen, 4, 12);
    int n_next = 20 + n_gen + 4;
    /* Cancelled, it skips the extra step: all but its last sampled token,
     * the positions past the last full block (when any) from its partial one. */
    int computed = 20 + n_gen - 1;
    int32_t got[CACHE_GEN], want[CACHE_GEN];
    struct gen_params q = cache_params(next, n_next, false);
    cr_assert_eq(run_ids(e, &q, got), computed);
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.prompt_cache.hit_tokens, (uint64_t)computed);
    engine_free(e);
    struct engine *cold = start_cached(0, 2, 0);
    run_ids(cold, &q, want);
    cr_assert_arr_eq(got, want, sizeof want, "a hit through a partial block changed the tokens");
    engine_free(cold);
}
