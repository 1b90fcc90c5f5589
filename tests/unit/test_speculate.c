/* tests/unit/test_speculate.c — speculative decoding gives exactly the target's output: greedy
 * tokens and logprobs equal plain decoding in exact mode (draft model, prompt lookup, every tiny
 * architecture and the house pair, alone and in mixed batches), sampled picks follow the
 * target's distribution (chi-square; a wrong acceptance rule fails it), misses at every
 * position truncate the KV, stops and max_tokens inside an accepted run end where plain
 * decoding does, grammars, preemption, cancellation and seeds hold, and a draft with another
 * tokenizer is refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/structured.h"
#include "backend/cpu/matmul.h"
#include "base/logsumexp.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculate.h"
#include "model/model.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "tools/mkmodel.h"

#define HOUSE INFERD_SOURCE_DIR "/models/house"
#define HOUSE_DRAFT INFERD_SOURCE_DIR "/models/house-draft"

#define N_REQ 6
#define MAX_PROMPT 48
#define GEN 20

/* ---- prompt lookup ----------------------------------------------------------- */

Test(speculate, prompt_lookup_continues_the_latest_longest_match)
{
    int32_t t[] = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3};
    int32_t out[4];
    /* "2 3" last occurred before at 5..6, followed by 7 8 5 2 */
    int n = spec_ngram_lookup(t, 12, 1, 3, out, 4);
    cr_assert_eq(n, 4);
    cr_assert(out[0] == 7 && out[1] == 8 && out[2] == 5 && out[3] == 2);
    /* a longer match wins over a later shorter one: "9 1 2" never recurs, "1 2 3"... */
    int32_t u[] = {4, 5, 6, 1, 6, 0, 4, 5, 6};
    n = spec_ngram_lookup(u, 9, 1, 3, out, 2);
    cr_assert_eq(n, 2);
    cr_assert(out[0] == 1 && out[1] == 6, "got %d %d", out[0], out[1]);
    int32_t v[] = {1, 2, 3, 4};
    cr_assert_eq(spec_ngram_lookup(v, 4, 1, 3, out, 4), 0);
}

/* ---- the number of drafts from what they cost -------------------------------- */

Test(speculate, the_best_number_of_drafts_weighs_the_rows_cost_against_the_tokens_kept)
{
    const double six[4] = {0.6, 0.6, 0.6, 0.6}, sure[4] = {1, 1, 1, 1};
    /* a step of r rows (index r), in units of a one-row step: verify rows that cost little
     * (a GPU's), and rows of arithmetic (a CPU's: 1.11, 1.20, 1.48, 1.74) */
    const double flat[6] = {0, 1.0, 1.01, 1.02, 1.03, 1.04};
    const double cpu[6] = {0, 1.0, 1.11, 1.20, 1.48, 1.74};
    cr_assert_eq(spec_best_drafts(six, flat, 4, 0.02), 4);
    /* at 60%: 1.96 tokens for 1.20 + 2 x 0.18 beat 2.18 for 1.48 + 3 x 0.18 */
    cr_assert_eq(spec_best_drafts(six, cpu, 4, 0.18), 2);
    /* every draft kept: the most, even where rows cost */
    cr_assert_eq(spec_best_drafts(sure, cpu, 4, 0.18), 4);
    /* drafts kept more often once a run has begun (correlated) earn a longer verify: with a
     * cheaper fourth row, 60% throughout stays at 2, 60% then 95% takes 3 */
    const double runs[4] = {0.6, 0.95, 0.95, 0.95};
    const double cheap4[6] = {0, 1.0, 1.11, 1.20, 1.30, 1.74};
    cr_assert_eq(spec_best_drafts(six, cheap4, 4, 0.18), 2);
    cr_assert_eq(spec_best_drafts(runs, cheap4, 4, 0.18), 3);
    /* nothing to weigh: the most; one measured cost: a neighbour that could beat it */
    const double one[6] = {0, 1.0, 1.11, 0, 0, 0}, only_most[6] = {0, 1.0, 0, 0, 0, 1.74},
                 none[6] = {0};
    cr_assert_eq(spec_best_drafts(six, none, 4, 0.0), 4);
    cr_assert_eq(spec_best_drafts(six, one, 4, 0.18), 2);
    cr_assert_eq(spec_best_drafts(six, only_most, 4, 0.18), 3);
    /* every draft kept by a drafter that costs nothing: a draft fewer cannot win even if
     * the rows cost in proportion, so the most stays without a step spent measuring */
    cr_assert_eq(spec_best_drafts(sure, only_most, 4, 0.001), 4);
    /* the best's next unmeasured: that next where it could win (60% then 95%: a third
     * draft's 0.54 tokens for at least its 0.18), not where it could not (60%: 0.22 tokens) */
    const double gap[6] = {0, 1.0, 1.11, 1.20, 0, 1.74};
    cr_assert_eq(spec_best_drafts(runs, gap, 4, 0.18), 3);
    cr_assert_eq(spec_best_drafts(six, gap, 4, 0.18), 2);
    /* the best's previous unmeasured: that previous. A sequence whose drafts are all kept
     * at first drafts the most and measures only that; from there it walks down while the
     * rows cost more than they bring (2 for 1.20 + 2 x 0.18 beats 3 for 1.48 + 3 x 0.18) */
    const double below[6] = {0, 1.0, 0, 1.20, 1.48, 1.74};
    cr_assert_eq(spec_best_drafts(six, below, 4, 0.18), 1);
    const double top_two[6] = {0, 1.0, 0, 0, 1.48, 1.74};
    cr_assert_eq(spec_best_drafts(six, top_two, 4, 0.18), 2);
}

Test(speculate, a_row_count_measured_long_ago_is_measured_again_and_its_new_cost_replaces_the_old)
{
    /* the first verify steps ran four and three rows in a slow moment (cold caches, another
     * process), then two rows ran alone: with every draft kept, 2 tokens for 1.1 + 0.1 beat
     * 3 for 2.4 + 0.2 and 4 for 2.6 + 0.3, and while those count, k = 2 and 3 are never
     * tried again */
    const double sure[4] = {1, 1, 1, 1};
    struct spec_costs c = {0};
    spec_costs_note(&c, 4, 2.6);
    spec_costs_note(&c, 3, 2.4);
    double now[SPEC_MAX_DRAFTS + 2];
    for (int i = 0; i < SPEC_COST_STALE; i++) {
        spec_costs_note(&c, 2, 1.1);
        spec_costs_current(&c, now);
        cr_assert_float_eq(now[3], 2.4, 1e-12, "still counted after %d steps", i + 1);
        cr_assert_eq(spec_best_drafts(sure, now, 3, 0.1), 1);
    }
    /* past SPEC_COST_STALE steps the slow measurements no longer count: the unmeasured
     * neighbour above the best is tried */
    spec_costs_note(&c, 2, 1.1);
    spec_costs_current(&c, now);
    cr_assert(now[3] == 0.0 && now[4] == 0.0);
    cr_assert_float_eq(now[2], 1.1, 1e-12);
    cr_assert_eq(spec_best_drafts(sure, now, 3, 0.1), 2);
    /* measured again, a new cost replaces the old average (0.8 x 2.4 + 0.2 x 1.15 would
     * still lose to two rows), and the next neighbour is tried in turn */
    spec_costs_note(&c, 3, 1.15);
    spec_costs_current(&c, now);
    cr_assert_float_eq(now[3], 1.15, 1e-12);
    cr_assert_eq(spec_best_drafts(sure, now, 3, 0.1), 3);
    spec_costs_note(&c, 4, 1.2);
    spec_costs_current(&c, now);
    cr_assert_float_eq(now[4], 1.2, 1e-12);
    cr_assert_eq(spec_best_drafts(sure, now, 3, 0.1), 3);
    /* a fresh one moves as an average */
    spec_costs_note(&c, 4, 2.2);
    spec_costs_current(&c, now);
    cr_assert_float_eq(now[4], 0.8 * 1.2 + 0.2 * 2.2, 1e-12);
}

Test(speculate, the_automatic_draft_head_reads_the_rows_that_held_most_picks)
{
    float survey[32] = {50, 30, 10, 5, 3, 1, 1}; /* 100 picks over ids 0 .. 1,791 */
    /* 97 of them in the first five buckets (1,280 ids) */
    cr_assert_eq(spec_surveyed_rows(survey, 32, 8192), 5 * SPEC_SURVEY_BUCKET);
    /* one pick far out is 1% of them: left out */
    survey[31] = 1;
    cr_assert_eq(spec_surveyed_rows(survey, 32, 8192), 5 * SPEC_SURVEY_BUCKET);
    /* a tenth far out: kept, the whole head */
    survey[31] = 10;
    cr_assert_eq(spec_surveyed_rows(survey, 32, 8192), 8192);
    /* a vocabulary that ends inside its last bucket, and nothing counted yet */
    cr_assert_eq(spec_surveyed_rows(survey, 32, 8000), 8000);
    float none[32] = {0};
    cr_assert_eq(spec_surveyed_rows(none, 32, 8192), 8192);
}

Test(speculate, a_draft_model_with_another_tokenizer_is_refused_naming_the_difference)
{
    struct err err = {0};
    struct tokenizer *house, *other;
    cr_assert_eq(tok_load(HOUSE, &house, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(HOUSE_DRAFT, &other, &err), 0, "%s", err.msg);
    cr_assert_eq(spec_check_tokenizers(house, other, &err), 0, "%s", err.msg);
    tok_free(other);

    /* the same tokenizer with one special token renamed */
    size_t len, clen;
    char *json = test_read_file(HOUSE "/tokenizer.json", &len);
    char *config = test_read_file(HOUSE "/tokenizer_config.json", &clen);
    cr_assert(json && config);
    char *at = strstr(json, "<|im_end|>");
    cr_assert_not_null(at);
    memcpy(at, "<|im_fin|>", 10);
    cr_assert_eq(tok_load_json(json, len, config, clen, &other, &err), 0, "%s", err.msg);
    cr_assert_lt(spec_check_tokenizers(house, other, &err), 0);
    cr_assert(strstr(err.msg, "<|im_end|>") && strstr(err.msg, "special token"), "%s", err.msg);
    tok_free(other);
    free(json);
    free(config);

    /* the kind's own refusals */
    struct spec_config c = {.kind = SPEC_NGRAM, .draft = (const struct model *)1};
    cr_assert_lt(spec_config_check(&c, NULL, &err), 0);
    cr_assert(strstr(err.msg, "ngram"), "%s", err.msg);
    c = (struct spec_config){.kind = SPEC_TWO_MODEL};
    cr_assert_lt(spec_config_check(&c, NULL, &err), 0);
    c = (struct spec_config){.kind = SPEC_NGRAM, .num_draft_tokens = SPEC_MAX_DRAFTS + 1};
    cr_assert_lt(spec_config_check(&c, NULL, &err), 0);
    c = (struct spec_config){.kind = SPEC_NGRAM, .draft_vocab = 100};
    cr_assert_lt(spec_config_check(&c, NULL, &err), 0);
    cr_assert(strstr(err.msg, "--draft-vocab"), "%s", err.msg);
    c = (struct spec_config){.kind = SPEC_TWO_MODEL, .draft_vocab = -1};
    cr_assert_lt(spec_config_check(&c, NULL, &err), 0);
    cr_assert(strstr(err.msg, "--draft-vocab"), "%s", err.msg);
    c = (struct spec_config){.kind = SPEC_NGRAM};
    cr_assert_eq(spec_config_check(&c, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(c.num_draft_tokens, SPEC_DRAFTS_NGRAM);
    cr_assert(c.ngram_max == 3 && c.ngram_min == 1);
    tok_free(house);
}

/* ---- engines with and without speculation ------------------------------------ */

struct pair {
    struct backend *be;
    struct model *target, *draft;
    struct tokenizer *tok;
    char *dirs[2]; /* made by mkmodel; NULL for the house pair */
};

static void pair_open_mode(struct pair *p, const char *target, const char *draft,
                           enum compute_mode mode)
{
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode, .threads = 1},
                                    &p->be, &err),
                 0, "%s", err.msg);
    cr_assert_eq(model_load(target, p->be, &p->target, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(draft, p->be, &p->draft, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(target, &p->tok, &err), 0, "%s", err.msg);
}

static void pair_open_dirs(struct pair *p, const char *target, const char *draft)
{
    pair_open_mode(p, target, draft, COMPUTE_EXACT);
}

/* A tiny preset as the target and the same shape with other weights (seed) as its draft. */
static void pair_open_tiny(struct pair *p, const char *preset, uint64_t draft_seed)
{
    memset(p, 0, sizeof *p);
    struct err err = {0};
    for (int i = 0; i < 2; i++) {
        p->dirs[i] = test_mkdtemp();
        struct mkmodel_opts o = {.preset = preset, .seed = i == 0 ? 5 : draft_seed,
                                 .out_dir = p->dirs[i], .tokenizer_dir = HOUSE};
        cr_assert_eq(mkmodel_write(&o, &err), 0, "%s: %s", preset, err.msg);
    }
    pair_open_dirs(p, p->dirs[0], p->dirs[1]);
}

static void pair_close(struct pair *p)
{
    tok_free(p->tok);
    model_free(p->target);
    model_free(p->draft);
    backend_destroy(p->be);
    for (int i = 0; i < 2; i++)
        if (p->dirs[i]) {
            test_rmtree(p->dirs[i]);
            free(p->dirs[i]);
        }
}

struct requests {
    int32_t prompt[N_REQ][MAX_PROMPT];
    int n_prompt[N_REQ];
};

/* Random prompts, every other one a phrase repeated (so prompt lookup finds matches). */
static void make_requests(struct requests *q, int vocab, uint64_t seed)
{
    for (int i = 0; i < N_REQ; i++) {
        q->n_prompt[i] = 8 + (int)(seed % 40);
        int period = 3 + i;
        for (int t = 0; t < q->n_prompt[i]; t++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int32_t r = 3 + (int32_t)((seed >> 33) % (uint64_t)(vocab - 3));
            q->prompt[i][t] = i % 2 && t >= period ? q->prompt[i][t - period] : r;
        }
    }
}

struct result {
    int32_t ids[GEN + 1];
    float logprob[GEN + 1];
    int n;
    enum gen_finish finish;
    struct gen_spec_usage spec;
    char text[512];
};

static struct gen_params params_of(const struct requests *q, int i, int max_tokens)
{
    return (struct gen_params){.prompt = q->prompt[i], .n_prompt = q->n_prompt[i],
                               .max_tokens = max_tokens, .logprobs = 0,
                               .sampling = {.temperature = 0, .top_p = 1}};
}

static void wait_done(struct gen_output *o)
{
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
}

static void collect(struct gen_output *o, struct result *r)
{
    wait_done(o);
    memset(r, 0, sizeof *r);
    r->n = (int)o->n_tokens;
    cr_assert_leq(r->n, GEN + 1);
    for (int t = 0; t < r->n; t++) {
        r->ids[t] = gen_output_tokens(o)[t].id;
        r->logprob[t] = gen_output_tokens(o)[t].logprob;
    }
    r->finish = o->finish;
    r->spec = o->spec;
    snprintf(r->text, sizeof r->text, "%.*s", (int)o->text.len, o->text.data ? o->text.data : "");
    gen_output_release(o);
}

static struct engine *engine_for(struct pair *p, const struct spec_config *spec, size_t cache)
{
    struct err err = {0};
    struct spec_config c;
    const struct spec_config *checked = NULL;
    if (spec) {
        c = *spec;
        cr_assert_eq(spec_config_check(&c, p->target, &err), 0, "%s", err.msg);
        checked = &c;
    }
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 8, .max_step_tokens = 48,
                                .max_queue = 64, .prompt_cache_bytes = cache, .spec = checked};
    struct engine *e;
    cr_assert_eq(engine_create(p->target, p->tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

/* Each request alone, then all together with a sampled request and one that turned
 * speculation off among them. */
static void run_requests(struct engine *e, const struct requests *q, struct result alone[N_REQ],
                         struct result together[N_REQ])
{
    struct err err = {0};
    struct gen_output *o[N_REQ + 2];
    for (int i = 0; i < N_REQ; i++) {
        struct gen_params p = params_of(q, i, GEN);
        cr_assert_eq(engine_submit(e, &p, &o[i], &err), 0, "%s", err.msg);
        collect(o[i], &alone[i]);
    }
    struct gen_params sampled = params_of(q, 0, GEN);
    sampled.sampling = (struct sampler_params){.temperature = 0.8f, .top_p = 1, .seed = 7};
    struct gen_params off = params_of(q, 1, GEN);
    off.no_speculation = true;
    cr_assert_eq(engine_submit(e, &sampled, &o[N_REQ], &err), 0, "%s", err.msg);
    for (int i = 0; i < N_REQ; i++) {
        struct gen_params p = params_of(q, i, GEN);
        cr_assert_eq(engine_submit(e, &p, &o[i], &err), 0, "%s", err.msg);
    }
    cr_assert_eq(engine_submit(e, &off, &o[N_REQ + 1], &err), 0, "%s", err.msg);
    for (int i = 0; i < N_REQ; i++)
        collect(o[i], &together[i]);
    struct result r;
    collect(o[N_REQ], &r);
    cr_assert_eq(r.n, GEN);
    collect(o[N_REQ + 1], &r);
    cr_assert_eq(r.spec.target_calls, 0, "speculative: false still verified drafts");
    cr_assert_eq(r.spec.drafted, 0);
}

/* How far a logprob may be from plain decoding's, relative (0: the same bits). A pick the
 * backend made reports log Z as a float, one the host made as a double, and which makes a
 * verify row's pick can depend on the requests beside it. */
static double logprob_tolerance;

static void expect_same(const struct result *want, const struct result *got, const char *what,
                        int i)
{
    cr_assert_eq(got->n, want->n, "%s: request %d gave %d tokens, plain %d", what, i, got->n,
                 want->n);
    for (int t = 0; t < want->n; t++) {
        cr_assert_eq(got->ids[t], want->ids[t], "%s: request %d token %d is %d, plain %d", what,
                     i, t, got->ids[t], want->ids[t]);
        bool same = logprob_tolerance > 0
                        ? fabs((double)got->logprob[t] - want->logprob[t]) <=
                              logprob_tolerance * fmax(1.0, fabs((double)want->logprob[t]))
                        : memcmp(&got->logprob[t], &want->logprob[t], sizeof(float)) == 0;
        cr_assert(same, "%s: request %d token %d logprob %.9g, plain %.9g", what, i, t,
                  got->logprob[t], want->logprob[t]);
    }
}

/* plain, prompt lookup, a draft of other weights, and the target as its own draft */
/* Speculating runs of the pair's requests give plain decoding's tokens: alone, and (unless
 * alone_only) in mixed batches too. */
static void check_pair_runs(struct pair *p, const char *name, bool self_draft, bool alone_only)
{
    struct requests q;
    make_requests(&q, p->target->config.vocab_size < 4000 ? p->target->config.vocab_size : 4000,
                  0x5eed0000u + (uint64_t)strlen(name));
    struct result plain[N_REQ], plain_mixed[N_REQ], got[N_REQ], mixed[N_REQ];
    struct engine *e = engine_for(p, NULL, 0);
    run_requests(e, &q, plain, plain_mixed);
    engine_free(e);
    for (int i = 0; i < N_REQ && !alone_only; i++)
        expect_same(&plain[i], &plain_mixed[i], "plain batched", i);

    /* two-model with its head's rows chosen as it runs (the default), then with every row;
     * the last: a draft that proposes only the first quarter of the token ids */
    struct spec_config kinds[] = {
        {.kind = SPEC_NGRAM, .num_draft_tokens = 4},
        {.kind = SPEC_TWO_MODEL, .draft = p->draft},
        {.kind = SPEC_TWO_MODEL, .draft = p->target, .num_draft_tokens = 4},
        {.kind = SPEC_TWO_MODEL, .draft = p->draft, .draft_vocab = p->target->config.vocab_size / 4},
        {.kind = SPEC_TWO_MODEL, .draft = p->draft, .draft_vocab = p->target->config.vocab_size},
    };
    const char *names[] = {"ngram", "two-model", "self-draft", "two-model, a quarter of the ids",
                           "two-model, every id"};
    for (int k = 0; k < (self_draft ? 5 : 2); k++) {
        e = engine_for(p, &kinds[k], k == 1 ? (size_t)1 << 20 : 0);
        run_requests(e, &q, got, mixed);
        struct engine_stats st;
        engine_get_stats(e, &st);
        char what[128];
        for (int i = 0; i < N_REQ; i++) {
            snprintf(what, sizeof what, "%s %s alone", name, names[k]);
            expect_same(&plain[i], &got[i], what, i);
            if (alone_only)
                continue;
            snprintf(what, sizeof what, "%s %s mixed", name, names[k]);
            expect_same(&plain[i], &mixed[i], what, i);
        }
        /* prompt lookup may find nothing to draft on a random model; a draft model always does */
        if (k > 0)
            cr_assert_gt(st.spec_verify_steps, 0, "%s %s: nothing was verified", name, names[k]);
        if (k == 2)
            cr_assert_gt(st.spec_accepted, 0, "%s: the target as its own draft kept nothing",
                         name);
        if (kinds[k].kind == SPEC_TWO_MODEL) {
            int vocab = p->draft->config.vocab_size, rows = st.spec_draft_vocab;
            bool chosen = kinds[k].draft_vocab == 0;
            cr_assert_eq(st.spec_draft_vocab_auto, chosen, "%s %s", name, names[k]);
            cr_assert(chosen ? rows > 0 && rows <= vocab &&
                                   (rows == vocab || rows % SPEC_SURVEY_BUCKET == 0)
                             : rows == kinds[k].draft_vocab,
                      "%s %s: the draft reads %d head rows", name, names[k], rows);
        }
        cr_log_info("%s %s: %llu of %llu drafts kept over %llu verify steps, %d head rows",
                    name, names[k], (unsigned long long)st.spec_accepted,
                    (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_verify_steps,
                    st.spec_draft_vocab);
        engine_free(e);
    }
}

static void check_pair(struct pair *p, const char *name, bool self_draft)
{
    check_pair_runs(p, name, self_draft, false);
}

Test(speculate, greedy_output_equals_plain_decoding_on_every_tiny_architecture, .timeout = 240)
{
    int n;
    const struct mkmodel_preset *presets = mkmodel_presets(&n);
    for (int i = 0; i < n; i++) {
        if (presets[i].real)
            continue;
        struct pair p;
        pair_open_tiny(&p, presets[i].name, 6);
        check_pair(&p, presets[i].name, i == 0);
        pair_close(&p);
    }
}

Test(speculate, greedy_output_equals_plain_decoding_on_the_house_pair, .timeout = 240)
{
    struct pair p = {0};
    pair_open_dirs(&p, HOUSE, HOUSE_DRAFT);
    check_pair(&p, "house", true);
    pair_close(&p);
}

/* FAST mode promises no batch invariance, but where the CPU has AVX512-BF16 a verify step's
 * rows of one sequence (at most 8: the bf16 GEMV, whose rows never depend on the rows beside
 * it; attention's row kernels below 18 rows, as a decode row's) are a decode step's bits, so
 * speculation alone gives plain decoding's tokens. Below that level the one-row GEMV is
 * another kernel than the multi-row one, and only the agreement rate is measured
 * (bench/RESULTS.md). */
Test(speculate, fast_mode_greedy_output_alone_equals_plain_decoding_with_avx512_bf16,
     .timeout = 240)
{
    if (cpu_matmul_detect_level() < CPU_MATMUL_AVX512BF16)
        cr_skip_test("no AVX512-BF16 here: fast mode's one-row and multi-row GEMVs differ");
    struct pair p = {0};
    pair_open_mode(&p, HOUSE, HOUSE_DRAFT, COMPUTE_FAST);
    check_pair_runs(&p, "house, fast mode", true, true);
    pair_close(&p);
}

/* ---- misses at every position, stops and lengths inside an accepted run ------- */

/* Drafts the reference continuation, with one draft changed at position miss (none when miss
 * is past the drafts). */
struct scripted {
    const int32_t *ref; /* prompt then the plain greedy continuation */
    int n_ref;
    int miss;
    int vocab;
};

static int scripted_drafts(void *ctx, const int32_t *tokens, int n, int32_t *out, int cap)
{
    struct scripted *s = ctx;
    int m = 0;
    while (m < cap && n + m < s->n_ref) {
        out[m] = s->ref[n + m];
        if (m == s->miss)
            out[m] = (out[m] + 1) % s->vocab;
        m++;
    }
    (void)tokens;
    return m;
}

Test(speculate, a_miss_at_every_position_truncates_the_kv_and_keeps_the_output, .timeout = 120)
{
    struct pair p;
    pair_open_tiny(&p, "tiny-qwen3", 6);
    struct requests q;
    make_requests(&q, 4000, 99);
    int vocab = p.target->config.vocab_size;
    /* the plain continuation, and its prompt + tokens as the script */
    struct engine *e = engine_for(&p, NULL, 0);
    struct result plain;
    struct err err = {0};
    struct gen_output *o;
    struct gen_params gp = params_of(&q, 0, GEN);
    cr_assert_eq(engine_submit(e, &gp, &o, &err), 0, "%s", err.msg);
    collect(o, &plain);
    engine_free(e);
    int32_t ref[MAX_PROMPT + GEN + 1];
    memcpy(ref, q.prompt[0], (size_t)q.n_prompt[0] * sizeof *ref);
    memcpy(ref + q.n_prompt[0], plain.ids, (size_t)plain.n * sizeof *ref);
    const int k = 4;
    for (int miss = 0; miss <= k; miss++) {
        struct scripted s = {ref, q.n_prompt[0] + plain.n, miss, vocab};
        struct spec_config c = {.kind = SPEC_CALLBACK, .num_draft_tokens = k,
                                .draft_fn = scripted_drafts, .draft_ctx = &s};
        /* the prefix cache on: a second run of the same request reads back only kept K/V */
        e = engine_for(&p, &c, (size_t)4 << 20);
        for (int run = 0; run < 2; run++) {
            struct result got;
            cr_assert_eq(engine_submit(e, &gp, &o, &err), 0, "%s", err.msg);
            collect(o, &got);
            char what[64];
            snprintf(what, sizeof what, "miss at %d, run %d", miss, run);
            expect_same(&plain, &got, what, 0);
            cr_assert_gt(got.spec.target_calls, 0);
            if (miss == k) /* every draft right: (k + 1) tokens a step but at the end */
                cr_assert_leq(got.spec.target_calls, (GEN + k) / (k + 1) + 1, "%d verify steps",
                              got.spec.target_calls);
            else /* the miss ends each run (fewer drafts near max_tokens) */
                cr_assert(got.spec.accepted <= miss * got.spec.target_calls &&
                              got.spec.accepted >= miss * (got.spec.target_calls - 2),
                          "%s: %d of %d over %d steps", what, got.spec.accepted,
                          got.spec.drafted, got.spec.target_calls);
        }
        engine_free(e);
    }

    /* The generator's view: after every verification the KV holds exactly the kept positions. */
    for (int miss = 0; miss <= k; miss++) {
        struct scripted s = {ref, q.n_prompt[0] + plain.n, miss, vocab};
        struct spec_config c = {.kind = SPEC_CALLBACK, .num_draft_tokens = k,
                                .draft_fn = scripted_drafts, .draft_ctx = &s};
        cr_assert_eq(spec_config_check(&c, p.target, &err), 0, "%s", err.msg);
        struct generator *g;
        cr_assert_eq(generator_create_spec(p.target, 128, 64, &c, &g, &err), 0, "%s", err.msg);
        struct sampler sm;
        cr_assert_eq(sampler_init(&sm, &(struct sampler_params){.top_p = 1}, vocab, &err), 0, "%s",
                     err.msg);
        int32_t picks[1 + SPEC_MAX_DRAFTS];
        int n_picks, made = 0;
        cr_assert_eq(generator_feed_picks(g, q.prompt[0], q.n_prompt[0], &sm, picks, &n_picks,
                                          &err), 0, "%s", err.msg);
        while (made < plain.n) {
            for (int j = 0; j < n_picks && made < plain.n; j++, made++)
                cr_assert_eq(picks[j], plain.ids[made], "miss %d: token %d", miss, made);
            if (made >= plain.n)
                break;
            int32_t next = picks[n_picks - 1];
            cr_assert_eq(generator_feed_picks(g, &next, 1, &sm, picks, &n_picks, &err), 0, "%s",
                         err.msg);
            cr_assert_eq(g->seq->kv.n_tokens, g->seq->n_computed);
            cr_assert_eq(g->seq->n_computed, g->seq->n_tokens);
            cr_assert_leq(n_picks, miss < k ? miss + 1 : k + 1);
        }
        sampler_free(&sm);
        generator_free(g);
    }
    pair_close(&p);
}

Test(speculate, stops_and_max_tokens_inside_an_accepted_run_end_where_plain_decoding_does,
     .timeout = 120)
{
    /* The plain engine runs on a backend of its own (the same weights): the speculating one
     * computes a finished sequence's last token after its reader is told, and one backend is
     * driven by one thread at a time. */
    struct pair p, plain_p;
    pair_open_tiny(&p, "tiny-llama", 6);
    pair_open_tiny(&plain_p, "tiny-llama", 6);
    struct requests q;
    make_requests(&q, 4000, 1234);
    struct err err = {0};
    struct engine *plain_e = engine_for(&plain_p, NULL, 0);
    struct result full;
    struct gen_output *o;
    struct gen_params gp = params_of(&q, 2, GEN);
    cr_assert_eq(engine_submit(plain_e, &gp, &o, &err), 0, "%s", err.msg);
    collect(o, &full);
    int32_t ref[MAX_PROMPT + GEN + 1];
    memcpy(ref, q.prompt[2], (size_t)q.n_prompt[2] * sizeof *ref);
    memcpy(ref + q.n_prompt[2], full.ids, (size_t)full.n * sizeof *ref);
    /* every draft right, 4 a step: runs of 5 tokens */
    struct scripted s = {ref, q.n_prompt[2] + full.n, 99, p.target->config.vocab_size};
    struct spec_config c = {.kind = SPEC_CALLBACK, .num_draft_tokens = 4,
                            .draft_fn = scripted_drafts, .draft_ctx = &s};
    struct engine *e = engine_for(&p, &c, (size_t)1 << 20);
    for (int max = 1; max <= 11; max++) {
        struct gen_params mp = params_of(&q, 2, max);
        struct result want, got;
        cr_assert_eq(engine_submit(plain_e, &mp, &o, &err), 0, "%s", err.msg);
        collect(o, &want);
        cr_assert_eq(engine_submit(e, &mp, &o, &err), 0, "%s", err.msg);
        collect(o, &got);
        char what[64];
        snprintf(what, sizeof what, "max_tokens %d", max);
        expect_same(&want, &got, what, 2);
        cr_assert_eq(got.finish, want.finish);
        cr_assert_str_eq(got.text, want.text);
    }
    /* a stop string: the text of a few generated tokens, wherever it falls in a run */
    for (int at = 2; at < 12; at++) {
        char *piece = NULL;
        size_t len = 0;
        cr_assert_eq(tok_decode(p.tok, &full.ids[at], 1, true, &piece, &len, &err), 0);
        if (len == 0) {
            free(piece);
            continue;
        }
        const char *stops[] = {piece};
        struct gen_params sp = params_of(&q, 2, GEN);
        sp.stop = stops;
        sp.n_stop = 1;
        struct result want, got;
        cr_assert_eq(engine_submit(plain_e, &sp, &o, &err), 0, "%s", err.msg);
        collect(o, &want);
        cr_assert_eq(engine_submit(e, &sp, &o, &err), 0, "%s", err.msg);
        collect(o, &got);
        cr_assert_str_eq(got.text, want.text, "stop '%s'", piece);
        cr_assert_eq(got.finish, want.finish);
        cr_assert_eq(got.n, want.n, "stop '%s': %d tokens, plain %d", piece, got.n, want.n);
        free(piece);
    }
    engine_free(e);
    engine_free(plain_e);
    pair_close(&p);
    pair_close(&plain_p);
}

/* ---- the sampled distribution ----------------------------------------------- */

#define CHI_SAMPLES 20000
#define CHI_TOP_K 6

/* Chi-square of counts against probabilities p over the tokens with p > 0. */
static double chi_square(const int *counts, const float *p, int n, int total, int *dof)
{
    double chi = 0;
    *dof = -1;
    for (int t = 0; t < n; t++) {
        if (p[t] <= 0) {
            if (counts[t] > 0)
                return INFINITY; /* a token the target never picks */
            continue;
        }
        double want = p[t] * total;
        chi += (counts[t] - want) * (counts[t] - want) / want;
        (*dof)++;
    }
    return chi;
}

/* A uniform number in [0, 1) for sample i of stream salt, apart from the sampler's. */
static double uniform_of(uint64_t i, uint64_t salt)
{
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

/* The statistic for CHI_SAMPLES verification picks at one row of a tiny model's logits:
 * by sampler_pick_draft (the right rule), or by the wrong rule that, after a rejection, draws
 * from p itself instead of from norm(max(0, p - q)). With q, each sample's draft is drawn from
 * q (as a sampling drafter's is), else it is draft (a point mass). */
static double sampled_chi(const float *logits, int vocab, int32_t draft, const float *q,
                          bool wrong_rule, int *dof)
{
    struct err err = {0};
    int *counts = calloc((size_t)vocab, sizeof *counts);
    float *p = malloc((size_t)vocab * sizeof *p);
    cr_assert(counts && p);
    struct sampler_params sp = {.temperature = 1.3f, .top_k = CHI_TOP_K, .top_p = 1};
    for (int i = 0; i < CHI_SAMPLES; i++) {
        struct sampler s;
        sp.seed = 1000 + (uint64_t)i;
        cr_assert_eq(sampler_init(&s, &sp, vocab, &err), 0, "%s", err.msg);
        if (i == 0)
            sampler_probs(&s, logits, p);
        int32_t t;
        bool accepted;
        if (q) {
            double r = uniform_of((uint64_t)i, 0x51u);
            draft = 0;
            while (draft < vocab - 1 && (r -= q[draft]) >= 0)
                draft++;
        }
        if (!wrong_rule) {
            t = sampler_pick_draft(&s, logits, draft, q, &accepted);
        } else {
            /* accept with p(x) / q(x) as the right rule does, then the target's own pick */
            double u = uniform_of((uint64_t)i, 0xacu);
            double qd = q ? q[draft] : 1.0;
            t = u * qd < p[draft] ? draft : sampler_pick(&s, logits);
        }
        counts[t]++;
        sampler_free(&s);
    }
    double chi = chi_square(counts, p, vocab, CHI_SAMPLES, dof);
    free(counts);
    free(p);
    return chi;
}

Test(speculate, sampled_picks_follow_the_target_distribution_and_a_wrong_rule_does_not)
{
    /* a tiny model's next-token row, without a tokenizer: its own small vocabulary */
    struct err err = {0};
    char *dir = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-qwen3-gqa1", .seed = 5, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    struct backend *be;
    struct model *m;
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = COMPUTE_EXACT, .threads = 1},
                                    &be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    int vocab = m->config.vocab_size;
    struct generator *g;
    cr_assert_eq(generator_create(m, 64, 64, &g, &err), 0, "%s", err.msg);
    int32_t prompt[] = {11, 42, 7, 99, 123, 5, 42};
    cr_assert_eq(generator_feed(g, prompt, 7, &err), 0, "%s", err.msg);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    memcpy(logits, g->logits, (size_t)vocab * sizeof *logits);

    float *p = malloc((size_t)vocab * sizeof *p);
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &(struct sampler_params){.temperature = 1.3f, .top_k = CHI_TOP_K,
                                                           .top_p = 1}, vocab, &err), 0);
    sampler_probs(&s, logits, p);
    sampler_free(&s);
    /* drafts: the most likely token, a less likely candidate, and one the target never picks;
     * q: a point mass (prompt lookup) and a spread distribution (a sampling draft) */
    int32_t best = logits_argmax(p, vocab), other = -1, never = -1;
    for (int t = 0; t < vocab; t++) {
        if (p[t] > 0 && t != best && (other < 0 || p[t] < p[other]))
            other = t;
        if (p[t] == 0 && never < 0)
            never = t;
    }
    float *q = calloc((size_t)vocab, sizeof *q);
    q[best] = 0.2f, q[other] = 0.5f, q[never] = 0.3f;
    /* chi-square 0.999 quantile for CHI_TOP_K - 1 = 5 degrees of freedom */
    const double limit = 20.52;
    int32_t drafts[] = {best, other, never, best};
    for (int d = 0; d < 4; d++)
        for (int withq = 0; withq < 2; withq++) {
            if ((d == 3) != withq) /* the drafts drawn from q: one case */
                continue;
            int dof;
            double chi = sampled_chi(logits, vocab, drafts[d], withq ? q : NULL, false, &dof);
            cr_assert_eq(dof, CHI_TOP_K - 1);
            cr_assert_lt(chi, limit, "draft %d (p %.3f)%s: chi-square %.1f over %d dof", drafts[d],
                         p[drafts[d]], withq ? " with q" : "", chi, dof);
            double wrong = sampled_chi(logits, vocab, drafts[d], withq ? q : NULL, true, &dof);
            cr_log_info("draft %d%s: chi-square %.1f right rule, %.1f wrong rule", drafts[d],
                        withq ? " with q" : "", chi, wrong);
            if (withq || p[drafts[d]] > 0.05f) /* a draft never accepted: both rules alike */
                cr_assert_gt(wrong, limit, "the wrong rule passed for draft %d (p %.3f): %.1f",
                             drafts[d], p[drafts[d]], wrong);
        }
    free(q);
    free(p);
    free(logits);
    generator_free(g);
    model_free(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

/* ---- preemption, cancellation, seeds ------------------------------------------ */

Test(speculate, preemption_cancellation_and_seeds_behave_as_without_speculation, .timeout = 120)
{
    struct pair p;
    pair_open_tiny(&p, "tiny-qwen3", 6);
    struct requests q;
    make_requests(&q, 4000, 4321);
    struct err err = {0};
    struct spec_config self = {.kind = SPEC_TWO_MODEL, .draft = p.target, .num_draft_tokens = 4};
    cr_assert_eq(spec_config_check(&self, p.target, &err), 0, "%s", err.msg);

    /* plain, with room for everyone */
    struct engine *big = engine_for(&p, NULL, 0);
    struct result want[N_REQ], got[N_REQ];
    struct gen_output *o[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        struct gen_params gp = params_of(&q, i, GEN);
        cr_assert_eq(engine_submit(big, &gp, &o[i], &err), 0, "%s", err.msg);
        collect(o[i], &want[i]);
    }
    engine_free(big);

    /* speculating in a pool of 8 blocks of 16: six sequences of up to 68 positions and their
     * drafts take turns, preempted and recomputed */
    struct engine_config cfg = {.n_ctx = 80, .max_seqs = 8, .max_step_tokens = 48,
                                .max_queue = 64, .kv_blocks = 8, .spec = &self};
    struct engine *small;
    cr_assert_eq(engine_create(p.target, p.tok, &cfg, &small, &err), 0, "%s", err.msg);
    for (int i = 0; i < N_REQ; i++) {
        struct gen_params gp = params_of(&q, i, GEN);
        cr_assert_eq(engine_submit(small, &gp, &o[i], &err), 0, "%s", err.msg);
    }
    for (int i = 0; i < N_REQ; i++) {
        collect(o[i], &got[i]);
        expect_same(&want[i], &got[i], "preempted while speculating", i);
    }
    struct engine_stats st;
    engine_get_stats(small, &st);
    cr_assert_gt(st.preemptions, 0, "the pool was meant to run short");
    cr_assert_gt(st.spec_verify_steps, 0);

    /* a cancelled speculating request goes; the next one is served as before */
    struct gen_params long_one = params_of(&q, 0, GEN);
    cr_assert_eq(engine_submit(small, &long_one, &o[0], &err), 0, "%s", err.msg);
    atomic_store(&o[0]->cancel, true);
    wait_done(o[0]);
    cr_assert(o[0]->finish == GEN_FINISH_CANCELLED || o[0]->finish == GEN_FINISH_LENGTH);
    gen_output_release(o[0]);
    struct gen_params again = params_of(&q, 1, GEN);
    cr_assert_eq(engine_submit(small, &again, &o[1], &err), 0, "%s", err.msg);
    collect(o[1], &got[1]);
    expect_same(&want[1], &got[1], "after a cancellation", 1);

    /* a seeded sampled request gives the same tokens every time, alone or among others */
    struct gen_params sampled = params_of(&q, 2, GEN);
    sampled.sampling = (struct sampler_params){.temperature = 0.7f, .top_k = 20, .top_p = 0.95f,
                                               .seed = 99};
    struct result first, second;
    cr_assert_eq(engine_submit(small, &sampled, &o[0], &err), 0, "%s", err.msg);
    collect(o[0], &first);
    for (int i = 1; i < 4; i++) {
        struct gen_params gp = params_of(&q, i, GEN);
        cr_assert_eq(engine_submit(small, &gp, &o[i], &err), 0, "%s", err.msg);
    }
    cr_assert_eq(engine_submit(small, &sampled, &o[0], &err), 0, "%s", err.msg);
    collect(o[0], &second);
    for (int i = 1; i < 4; i++)
        collect(o[i], &got[i]);
    expect_same(&first, &second, "seeded sampling, again among others", 2);
    cr_assert_gt(first.spec.target_calls, 0);
    engine_free(small);
    pair_close(&p);
}

/* ---- structured output ----------------------------------------------------------- */

Test(speculate, grammar_constrained_output_equals_plain_decoding, .timeout = 120)
{
    struct pair p = {0};
    pair_open_dirs(&p, HOUSE, HOUSE_DRAFT);
    struct err err = {0};
    struct grammar_vocab *vocab;
    struct grammar_cache *cache;
    cr_assert_eq(grammar_vocab_create(p.tok, &vocab, &err), 0, "%s", err.msg);
    cr_assert_eq(grammar_cache_create(vocab, 4, &cache, &err), 0, "%s", err.msg);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                         "\"maxLength\":40},\"tribe\":{\"type\":\"string\",\"maxLength\":40}},"
                         "\"required\":[\"name\",\"tribe\"]}";
    struct structured_spec spec = {.kind = STRUCTURED_JSON_SCHEMA, .text = (char *)schema,
                                   .len = strlen(schema)};
    struct gen_grammar *g;
    cr_assert_eq(grammar_cache_get(cache, &spec, &g, &err), 0, "%s", err.msg);
    int32_t *prompt = NULL;
    int n_prompt = 0;
    const char *text = "And the sons of Jacob came out of the field when they heard it:";
    cr_assert_eq(tok_encode(p.tok, text, strlen(text), false, &prompt, &n_prompt, &err), 0);
    int32_t eos[] = {2, 0};
    struct gen_params gp = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = 48,
                            .sampling = {.temperature = 0, .top_p = 1}, .logprobs = -1,
                            .eos_ids = eos, .n_eos = 2, .grammar = g, .jump_forward = true};
    char want[512] = "";
    struct spec_config kinds[] = {
        {.kind = SPEC_NONE},
        {.kind = SPEC_TWO_MODEL, .draft = p.draft},
        {.kind = SPEC_TWO_MODEL, .draft = p.target},
        {.kind = SPEC_NGRAM},
    };
    for (int k = 0; k < 4; k++) {
        struct engine *e = engine_for(&p, k ? &kinds[k] : NULL, 0);
        struct gen_output *o;
        cr_assert_eq(engine_submit(e, &gp, &o, &err), 0, "%s", err.msg);
        struct result r;
        collect(o, &r);
        if (k == 0) {
            snprintf(want, sizeof want, "%s", r.text);
            cr_assert(want[0] == '{', "plain: '%s'", want);
        } else {
            cr_assert_str_eq(r.text, want, "drafter %d", k);
            cr_log_info("drafter %d: %d of %d drafts kept over %d verify steps: %s", k,
                        r.spec.accepted, r.spec.drafted, r.spec.target_calls, r.text);
            if (k == 2) /* the target as its own draft: its greedy picks outside the grammar are cut */
                cr_assert_gt(r.spec.accepted, 0);
        }
        engine_free(e);
    }
    gen_grammar_release(g);
    grammar_cache_free(cache);
    grammar_vocab_free(vocab);
    free(prompt);
    pair_close(&p);
}

/* ---- a full batch decodes without drafts ------------------------------------ */

/* All requests at once, then the engine's verify steps. */
static uint64_t verify_steps_together(struct pair *p, const struct requests *q, int max_batch,
                                      struct result out[N_REQ])
{
    struct err err = {0};
    struct spec_config c = {.kind = SPEC_TWO_MODEL, .draft = p->target, .num_draft_tokens = 3,
                            .max_batch = max_batch};
    struct engine *e = engine_for(p, &c, 0);
    struct gen_output *o[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        struct gen_params gp = params_of(q, i, GEN);
        cr_assert_eq(engine_submit(e, &gp, &o[i], &err), 0, "%s", err.msg);
    }
    for (int i = 0; i < N_REQ; i++)
        collect(o[i], &out[i]);
    struct engine_stats st;
    engine_get_stats(e, &st);
    engine_free(e);
    return st.spec_verify_steps;
}

Test(speculate, steps_with_more_decoding_sequences_than_max_batch_run_without_drafts,
     .timeout = 120)
{
    struct pair p;
    pair_open_tiny(&p, "tiny-qwen3", 6);
    struct requests q;
    make_requests(&q, 4000, 777);
    struct result any[N_REQ], capped[N_REQ];
    /* the target as its own draft: every step that may draft does */
    uint64_t all = verify_steps_together(&p, &q, 0, any);
    uint64_t few = verify_steps_together(&p, &q, 1, capped);
    for (int i = 0; i < N_REQ; i++)
        expect_same(&any[i], &capped[i], "max_batch 1", i);
    cr_assert_gt(all, 0);
    /* six sequences decode together most of the time: only the steps where one is left draft */
    cr_assert_lt(few * 3, all, "max_batch 1: %llu verify steps, unlimited %llu",
                 (unsigned long long)few, (unsigned long long)all);
    pair_close(&p);
}

/* ---- the draft model reads the prompt with the target ----------------------- */

/* The draft steps one request of a 100-token prompt (three chunks of at most 48) takes with
 * the target as its own draft, its tokens into r. */
static uint64_t draft_steps_of_one(struct pair *p, const int32_t *prompt, int n_prompt,
                                   int max_tokens, bool speculate, struct result *r)
{
    struct err err = {0};
    struct spec_config c = {.kind = SPEC_TWO_MODEL, .draft = p->target, .num_draft_tokens = 3};
    struct engine *e = engine_for(p, speculate ? &c : NULL, 0);
    struct gen_params gp = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = max_tokens,
                            .sampling = {.temperature = 0, .top_p = 1}};
    struct gen_output *o;
    cr_assert_eq(engine_submit(e, &gp, &o, &err), 0, "%s", err.msg);
    collect(o, r);
    struct engine_stats st;
    engine_get_stats(e, &st);
    engine_free(e);
    return st.spec_draft_steps;
}

/* The draft model reads each prompt chunk in the step the target computes it, so the first
 * proposal has only its pending token left: a request that may draft (two tokens or more to
 * generate) takes one draft step per chunk before then, one that may not takes none, and the
 * tokens are plain decoding's either way. */
Test(speculate, the_draft_model_reads_each_prompt_chunk_with_the_target, .timeout = 120)
{
    struct pair p;
    pair_open_tiny(&p, "tiny-qwen3", 6);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++)
        prompt[i] = 3 + (i * 37) % 1000;
    struct result plain, got;
    for (int max_tokens = 1; max_tokens <= 2; max_tokens++) {
        draft_steps_of_one(&p, prompt, 100, max_tokens, false, &plain);
        uint64_t steps = draft_steps_of_one(&p, prompt, 100, max_tokens, true, &got);
        expect_same(&plain, &got, "one long prompt", max_tokens);
        /* two tokens: the second comes from a step whose proposal has no room for a draft */
        cr_assert_eq(steps, max_tokens == 2 ? 3u : 0u,
                     "max_tokens %d: %llu draft steps, expected one per prompt chunk (3) or none",
                     max_tokens, (unsigned long long)steps);
    }
    pair_close(&p);
}

/* ---- verify rows picked by a backend that samples -------------------------------- */

/* The CPU backend's ops posing as a backend that samples: greedy picks of plain specs (no
 * adjustments, no mask) made here, with the numbers a device reports; any other row goes to
 * the host. Counts the largest call, in rows. */
static struct backend_ops sampling_ops;
static int largest_sample_call;

static int sample_greedy(struct backend *be, const float *logits, int n_rows, int vocab,
                         const struct sample_spec *specs, struct sample_result *out,
                         float *host_rows, struct err *err)
{
    (void)be;
    (void)err;
    largest_sample_call = n_rows > largest_sample_call ? n_rows : largest_sample_call;
    for (int r = 0; r < n_rows; r++) {
        const float *x = logits + (size_t)r * vocab;
        struct sample_result *res = &out[r];
        memset(res, 0, sizeof *res);
        if (specs[r].temperature != 0 || specs[r].n_adjust > 0 || specs[r].mask) {
            res->need_host = 1;
            memcpy(host_rows + (size_t)r * vocab, x, (size_t)vocab * sizeof(float));
            continue;
        }
        res->token = logits_argmax(x, vocab);
        res->logit = res->max_logit = x[res->token];
        res->log_z = logsumexp_f32(x, (size_t)vocab);
    }
    return 0;
}

/* Where the backend samples, a greedy request's verify rows are its picks too (only the ids
 * come back): speculation still gives plain decoding's tokens, alone and in mixed batches
 * with a sampled request (a step with its verify rows is picked on the host), their logprobs
 * within a float log Z's rounding, and a verify step's rows went to the backend in one call. */
Test(speculate, verify_rows_a_sampling_backend_picks_give_plain_decodings_output, .timeout = 240)
{
    struct pair p = {0};
    pair_open_dirs(&p, HOUSE, HOUSE_DRAFT);
    sampling_ops = *p.be->ops;
    sampling_ops.sample = sample_greedy;
    p.be->ops = &sampling_ops;
    largest_sample_call = 0;
    logprob_tolerance = 1e-6;
    check_pair_runs(&p, "house, picks on the backend", false, false);
    logprob_tolerance = 0;
    cr_assert_gt(largest_sample_call, 1 + 1, "no verify step's rows were picked in one call");
    cr_log_info("house, picks on the backend: largest call %d rows", largest_sample_call);
    pair_close(&p);
}
