/* tests/unit/test_sampler.c — greedy picks the argmax; seeded sampling is reproducible and respects top-k/top-p/min-p;
 * logit bias and repetition/presence/frequency penalties follow their formulas; logprobs are OpenAI's; NaN/inf are safe. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

static const float logits[8] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f, -5.0f, 0.5f};

Test(sampler, temperature_zero_is_argmax)
{
    struct sampler s;
    struct sampler_params p = {.temperature = 0, .top_p = 1};
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    cr_assert_eq(sampler_pick(&s, logits), 1);
    sampler_free(&s);
}

/* The scan a logit at a time, the definition logits_argmax keeps. */
static int32_t argmax_by_scan(const float *x, int n)
{
    int32_t best = 0;
    float best_v = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > best_v) {
            best_v = x[i];
            best = i;
        }
    return best;
}

Test(sampler, argmax_is_the_lowest_id_of_the_largest_logit_with_nan_and_inf_anywhere)
{
    float x[203];
    unsigned r = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        int n = 1 + trial % 203;
        for (int i = 0; i < n; i++) {
            r = r * 1103515245u + 12345u;
            int kind = (int)(r >> 16) % 16;
            /* few distinct values, so ties are common */
            x[i] = kind == 0   ? NAN
                   : kind == 1 ? -INFINITY
                   : kind == 2 && trial % 7 == 0 ? INFINITY
                   : trial % 11 == 0 ? -INFINITY
                                     : (float)((int)(r >> 20) % 9) - 4.0f;
        }
        cr_assert_eq(logits_argmax(x, n), argmax_by_scan(x, n), "trial %d, %d logits", trial, n);
    }
    float nan_only[40];
    for (int i = 0; i < 40; i++)
        nan_only[i] = i % 2 ? NAN : -INFINITY;
    cr_assert_eq(logits_argmax(nan_only, 40), 0);
}

Test(sampler, same_seed_gives_same_tokens_and_other_seed_differs)
{
    int32_t a[64], b[64], c[64];
    struct sampler_params p = {.temperature = 1.5f, .top_p = 1, .seed = 7};
    struct sampler s;
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 8 : 7;
        cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
        for (int i = 0; i < 64; i++)
            (run == 0 ? a : run == 1 ? b : c)[i] = sampler_pick(&s, logits);
        sampler_free(&s);
    }
    cr_assert_arr_eq(a, b, sizeof a);
    cr_assert(memcmp(a, c, sizeof a) != 0);
}

Test(sampler, top_k_two_only_returns_the_two_best)
{
    struct sampler_params p = {.temperature = 5.0f, .top_k = 2, .top_p = 1, .seed = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    int seen[8] = {0};
    for (int i = 0; i < 500; i++)
        seen[sampler_pick(&s, logits)]++;
    cr_assert_gt(seen[1], 0);
    cr_assert_gt(seen[5], 0);
    cr_assert_eq(seen[1] + seen[5], 500);
    sampler_free(&s);
}

Test(sampler, min_p_drops_unlikely_tokens)
{
    struct sampler_params p = {.temperature = 1.0f, .top_p = 1, .min_p = 0.5f, .seed = 3};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    for (int i = 0; i < 500; i++) {
        int32_t t = sampler_pick(&s, logits);
        cr_assert(t == 1 || t == 5 || t == 2, "picked %d", t); /* p >= 0.5 * p(best) */
    }
    sampler_free(&s);
}

Test(sampler, tiny_top_p_is_greedy)
{
    struct sampler_params p = {.temperature = 1.0f, .top_p = 0.01f, .seed = 3};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(sampler_pick(&s, logits), 1);
    sampler_free(&s);
}

Test(sampler, out_of_range_parameters_are_refused)
{
    struct sampler s;
    struct err err = {0};
    struct sampler_params bad_temp = {.temperature = -1, .top_p = 1};
    struct sampler_params bad_top_p = {.temperature = 1, .top_p = 0};
    struct sampler_params bad_min_p = {.temperature = 1, .top_p = 1, .min_p = 2};
    cr_assert_lt(sampler_init(&s, &bad_temp, 8, &err), 0);
    cr_assert_lt(sampler_init(&s, &bad_top_p, 8, &err), 0);
    cr_assert_lt(sampler_init(&s, &bad_min_p, 8, &err), 0);
    cr_assert_eq(err.code, INFERD_ERANGE);
}

/* ---- helpers for the logits-processing tests ---- */

static const float small[4] = {2.0f, -1.0f, 0.5f, 3.0f};

/* Asserts that the logprobs of the last pick are the log-softmax of want,
 * the hand-computed processed logits. */
static void assert_logprobs_match(struct sampler *s, const float *want, int n)
{
    double max = want[0], sum = 0;
    for (int i = 1; i < n; i++)
        max = want[i] > max ? want[i] : max;
    for (int i = 0; i < n; i++)
        sum += exp(want[i] - max);
    for (int i = 0; i < n; i++) {
        float lp;
        cr_assert_eq(sampler_logprobs(s, i, 0, &lp, NULL), 0);
        double expect = want[i] - max - log(sum);
        cr_assert(fabs(lp - expect) < 1e-5, "token %d: logprob %g, want %g", i, lp, expect);
    }
}

static uint64_t lcg_state;
static float lcg_uniform(float lo, float hi)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((lcg_state >> 40) * 0x1.0p-24);
}

/* ---- penalties and bias ---- */

Test(sampler_penalties, repetition_divides_positive_and_multiplies_negative_logits_of_prompt_tokens)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){0, 1, 0}, 3);
    cr_assert_eq(sampler_pick(&s, small), 3);
    assert_logprobs_match(&s, (const float[]){1.0f, -2.0f, 0.5f, 3.0f}, 4);
    sampler_free(&s);
}

Test(sampler_penalties, repetition_applies_once_per_token_however_often_it_was_generated)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 1.5f};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    for (int i = 0; i < 3; i++)
        sampler_accept(&s, 3);
    sampler_accept(&s, 1);
    cr_assert_eq(sampler_pick(&s, small), 0); /* 3 / 1.5 ties 2; the lower id wins */
    assert_logprobs_match(&s, (const float[]){2.0f, -1.5f, 0.5f, 2.0f}, 4);
    sampler_free(&s);
}

Test(sampler_penalties, presence_and_frequency_follow_openai_over_generated_tokens_only)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .presence_penalty = 0.5f, .frequency_penalty = 0.25f};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){0, 1, 2}, 3); /* not seen by these penalties */
    sampler_accept(&s, 1);
    for (int i = 0; i < 3; i++)
        sampler_accept(&s, 3);
    cr_assert_eq(sampler_pick(&s, small), 0); /* 3 - 3*0.25 - 0.5 = 1.75 < 2 */
    assert_logprobs_match(&s, (const float[]){2.0f, -1.75f, 0.5f, 1.75f}, 4);
    sampler_free(&s);
}

Test(sampler_penalties, negative_presence_and_frequency_raise_generated_tokens)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .presence_penalty = -1, .frequency_penalty = -0.5f};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_accept(&s, 2);
    sampler_accept(&s, 2);
    cr_assert_eq(sampler_pick(&s, small), 3);
    assert_logprobs_match(&s, (const float[]){2.0f, -1.0f, 2.5f, 3.0f}, 4);
    sampler_free(&s);
}

Test(sampler_penalties, repetition_sees_the_prompt_but_presence_and_frequency_do_not)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2, .presence_penalty = 1,
                               .frequency_penalty = 1};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){0}, 1);
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){1.0f, -1.0f, 0.5f, 3.0f}, 4); /* 2 / 2 only */
    sampler_accept(&s, 0);
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){-1.0f, -1.0f, 0.5f, 3.0f}, 4); /* 2 / 2 - 1 - 1 */
    sampler_free(&s);
}

Test(sampler_penalties, order_is_bias_then_repetition_then_presence_and_frequency)
{
    struct sampler s;
    struct sampler_logit_bias bias[] = {{2, 1.5f}, {1, -1.0f}};
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2, .presence_penalty = 0.5f,
                               .frequency_penalty = 0.25f, .logit_bias = bias, .n_logit_bias = 2};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_accept(&s, 2);
    sampler_accept(&s, 2);
    sampler_accept(&s, 1);
    sampler_pick(&s, small);
    /* 2: (0.5 + 1.5) / 2 - 2*0.25 - 0.5 = 0; 1: (-1 - 1) * 2 - 0.25 - 0.5 = -4.75 */
    assert_logprobs_match(&s, (const float[]){2.0f, -4.75f, 0.0f, 3.0f}, 4);
    sampler_free(&s);
}

Test(sampler_penalties, neutral_values_sample_the_same_tokens_as_no_processing)
{
    struct sampler_logit_bias zero_bias = {3, 0};
    struct sampler_params plain = {.temperature = 1, .top_p = 0.95f, .seed = 11};
    struct sampler_params neutral = plain;
    neutral.repetition_penalty = 1;
    neutral.logit_bias = &zero_bias;
    neutral.n_logit_bias = 1;
    int32_t a[200], b[200];
    struct sampler s;
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(sampler_init(&s, run ? &neutral : &plain, 8, NULL), 0);
        sampler_observe_prompt(&s, (const int32_t[]){1, 2, 5}, 3);
        for (int i = 0; i < 200; i++) {
            (run ? b : a)[i] = sampler_pick(&s, logits);
            sampler_accept(&s, (run ? b : a)[i]);
        }
        sampler_free(&s);
    }
    cr_assert_arr_eq(a, b, sizeof a);
}

Test(sampler_penalties, same_seed_with_penalties_and_bias_gives_same_tokens)
{
    struct sampler_logit_bias bias = {4, 2.0f};
    struct sampler_params p = {.temperature = 0.8f, .top_k = 5, .top_p = 0.9f, .seed = 99,
                               .repetition_penalty = 1.3f, .presence_penalty = 0.4f,
                               .frequency_penalty = 0.2f, .logit_bias = &bias, .n_logit_bias = 1};
    int32_t a[300], b[300];
    struct sampler s;
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
        sampler_observe_prompt(&s, (const int32_t[]){1, 1, 7}, 3);
        for (int i = 0; i < 300; i++) {
            (run ? b : a)[i] = sampler_pick(&s, logits);
            sampler_accept(&s, (run ? b : a)[i]);
        }
        sampler_free(&s);
    }
    cr_assert_arr_eq(a, b, sizeof a);
}

Test(sampler_penalties, out_of_vocabulary_ids_given_to_accept_and_observe_are_ignored)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2, .frequency_penalty = 1};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){-1, 4, 1 << 30}, 3);
    sampler_accept(&s, -5);
    sampler_accept(&s, 4);
    sampler_pick(&s, small);
    assert_logprobs_match(&s, small, 4);
    sampler_free(&s);
}

Test(sampler_bias, minus_100_bans_the_argmax_under_greedy_and_sampling)
{
    struct sampler_logit_bias ban = {1, -100};
    struct sampler_params greedy = {.top_p = 1, .logit_bias = &ban, .n_logit_bias = 1};
    struct sampler_params sampled = {.temperature = 1, .top_p = 1, .seed = 4, .logit_bias = &ban,
                                     .n_logit_bias = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &greedy, 8, NULL), 0);
    cr_assert_eq(sampler_pick(&s, logits), 5);
    sampler_free(&s);
    cr_assert_eq(sampler_init(&s, &sampled, 8, NULL), 0);
    for (int i = 0; i < 1000; i++)
        cr_assert_neq(sampler_pick(&s, logits), 1);
    sampler_free(&s);
}

Test(sampler_bias, plus_100_forces_a_token_under_greedy)
{
    struct sampler_logit_bias force = {6, 100};
    struct sampler_params p = {.top_p = 1, .logit_bias = &force, .n_logit_bias = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    cr_assert_eq(sampler_pick(&s, logits), 6);
    sampler_free(&s);
}

Test(sampler_bias, minus_100_on_all_but_one_token_always_samples_that_token)
{
    struct sampler_logit_bias ban[7];
    for (int i = 0, k = 0; i < 8; i++)
        if (i != 6)
            ban[k++] = (struct sampler_logit_bias){i, -100};
    struct sampler_params p = {.temperature = 1.5f, .top_p = 1, .seed = 2, .logit_bias = ban,
                               .n_logit_bias = 7};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(sampler_pick(&s, logits), 6);
    float lp;
    cr_assert_eq(sampler_logprobs(&s, 6, 0, &lp, NULL), 0);
    cr_assert(fabsf(lp) < 1e-5f, "logprob %g", lp);
    sampler_free(&s);
}

Test(sampler_bias, is_copied_at_init_so_the_caller_may_free_its_array)
{
    struct sampler_logit_bias force = {6, 100};
    struct sampler_params p = {.top_p = 1, .logit_bias = &force, .n_logit_bias = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    force = (struct sampler_logit_bias){0, -100};
    cr_assert_eq(sampler_pick(&s, logits), 6);
    sampler_free(&s);
}

/* A greedy pick where bias entries and penalties alone change the row skips the processed
 * copy: the same token and the same logprobs as the copying path (a sampler with an
 * all-pass mask takes that one), asked after the token was accepted as the engine asks,
 * over rows with ties, -inf and NaN, bias on the row's argmax and around it, and penalties
 * over a history that the picks extend. */
Test(sampler_bias, a_greedy_pick_without_the_copy_equals_the_processed_rows)
{
    enum { V = 64, STEPS = 12 };
    uint32_t all_pass[(V + 31) / 32];
    memset(all_pass, 0xff, sizeof all_pass);
    uint64_t r = 88172645463325252ull;
#define NEXT() (r ^= r << 13, r ^= r >> 7, r ^= r << 17)
    for (int trial = 0; trial < 600; trial++) {
        struct sampler_logit_bias bias[5];
        int n_bias = (int)(NEXT() % 6);
        for (int b = 0; b < n_bias; b++) {
            float amounts[] = {-100, -1, -0.5f, 0.5f, 1, 3, 100};
            bias[b] = (struct sampler_logit_bias){(int32_t)(NEXT() % V), amounts[NEXT() % 7]};
        }
        struct sampler_params p = {.top_p = 1, .logit_bias = n_bias ? bias : NULL,
                                   .n_logit_bias = n_bias};
        if (trial % 2) { /* penalties too, windows included */
            p.repetition_penalty = 1.3f;
            p.presence_penalty = trial % 4 == 1 ? 0.5f : 0;
            p.frequency_penalty = 0.25f;
            p.repetition_context_size = trial % 3 ? 0 : 5;
        }
        struct sampler fast, copying;
        cr_assert_eq(sampler_init(&fast, &p, V, NULL), 0);
        cr_assert_eq(sampler_init(&copying, &p, V, NULL), 0);
        cr_assert_eq(sampler_set_mask(&copying, all_pass), 0);
        int32_t prompt[6];
        for (int i = 0; i < 6; i++)
            prompt[i] = (int32_t)(NEXT() % V);
        sampler_observe_prompt(&fast, prompt, 6);
        sampler_observe_prompt(&copying, prompt, 6);
        for (int step = 0; step < STEPS; step++) {
            float row[V];
            for (int i = 0; i < V; i++) {
                int k = (int)(NEXT() % 23);
                row[i] = k == 0 ? -INFINITY : k == 1 ? NAN : (float)(int)(NEXT() % 9) - 4.0f;
            }
            if (step == 3) /* nothing above -inf */
                for (int i = 0; i < V; i++)
                    row[i] = i % 3 ? -INFINITY : NAN;
            if (n_bias && step % 3 == 0) /* the row's argmax gets a bias entry's change */
                row[bias[0].token] = 10.0f;
            int32_t want = sampler_pick(&copying, row), got = sampler_pick(&fast, row);
            cr_assert_eq(got, want, "trial %d step %d: picked %d, the processed row's argmax %d",
                         trial, step, got, want);
            sampler_accept(&copying, want);
            sampler_accept(&fast, got);
            float lp_want, lp_got;
            struct token_logprob top_want[5], top_got[5];
            int n_want = sampler_logprobs(&copying, want, 5, &lp_want, top_want);
            int n_got = sampler_logprobs(&fast, got, 5, &lp_got, top_got);
            cr_assert_eq(n_got, n_want, "trial %d step %d", trial, step);
            cr_assert(memcmp(&lp_got, &lp_want, sizeof lp_got) == 0,
                      "trial %d step %d: logprob %g vs %g", trial, step, lp_got, lp_want);
            cr_assert(n_want <= 0 ||
                          memcmp(top_got, top_want, (size_t)n_want * sizeof *top_got) == 0,
                      "trial %d step %d: top logprobs differ", trial, step);
        }
        sampler_free(&fast);
        sampler_free(&copying);
    }
#undef NEXT
}

/* ---- logprobs ---- */

Test(sampler_logprobs, of_every_token_sum_to_one)
{
    enum { N = 5000 };
    static float row[N];
    lcg_state = 1;
    for (int i = 0; i < N; i++)
        row[i] = lcg_uniform(-12, 12);
    struct sampler_logit_bias bias = {17, 9};
    struct sampler_params p = {.temperature = 0.7f, .top_p = 0.9f, .seed = 5, .repetition_penalty = 1.2f,
                               .frequency_penalty = 0.5f, .logit_bias = &bias, .n_logit_bias = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, N, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){3, 4, 5}, 3);
    sampler_accept(&s, 17);
    sampler_pick(&s, row);
    double sum = 0;
    for (int i = 0; i < N; i++) {
        float lp;
        cr_assert_eq(sampler_logprobs(&s, i, 0, &lp, NULL), 0);
        sum += exp(lp);
    }
    cr_assert(fabs(log(sum)) < 1e-5, "logsumexp %g", log(sum));
    sampler_free(&s);
}

Test(sampler_logprobs, top_is_sorted_descending_with_ties_lower_id_first)
{
    static const float tied[8] = {1, 3, 2, 3, 0, 2, 3, -1};
    struct sampler_params p = {.top_p = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    cr_assert_eq(sampler_pick(&s, tied), 1);
    struct token_logprob top[SAMPLER_MAX_TOP_LOGPROBS];
    float lp;
    cr_assert_eq(sampler_logprobs(&s, 1, 5, &lp, top), 5);
    const int32_t want[5] = {1, 3, 6, 2, 5};
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(top[k].token, want[k], "rank %d: token %d", k, top[k].token);
        float own;
        sampler_logprobs(&s, top[k].token, 0, &own, NULL);
        cr_assert_float_eq(top[k].logprob, own, 1e-7);
    }
    cr_assert_float_eq(top[0].logprob, lp, 1e-7);
    cr_assert_gt(top[2].logprob, top[3].logprob);
    cr_assert_eq(sampler_logprobs(&s, 1, 2, &lp, top), 2);
    cr_assert(top[0].token == 1 && top[1].token == 3);
    sampler_free(&s);
}

Test(sampler_logprobs, top_stops_at_the_vocabulary_and_at_twenty)
{
    static float row[30];
    for (int i = 0; i < 30; i++)
        row[i] = (float)(i % 7);
    struct sampler_params p = {.top_p = 1};
    struct token_logprob top[SAMPLER_MAX_TOP_LOGPROBS];
    float lp;
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    sampler_pick(&s, row);
    cr_assert_eq(sampler_logprobs(&s, 0, 20, &lp, top), 8);
    sampler_free(&s);
    cr_assert_eq(sampler_init(&s, &p, 30, NULL), 0);
    sampler_pick(&s, row);
    cr_assert_eq(sampler_logprobs(&s, 0, 25, &lp, top), 20);
    for (int k = 1; k < 20; k++)
        cr_assert(top[k - 1].logprob > top[k].logprob ||
                  (top[k - 1].logprob == top[k].logprob && top[k - 1].token < top[k].token));
    cr_assert_eq(sampler_logprobs(&s, 0, 0, &lp, top), 0);
    sampler_free(&s);
}

Test(sampler_logprobs, ignore_temperature_and_truncation)
{
    struct sampler_params hot = {.temperature = 0.3f, .top_k = 2, .top_p = 0.5f, .min_p = 0.2f, .seed = 1};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &hot, 8, NULL), 0);
    sampler_pick(&s, logits);
    assert_logprobs_match(&s, logits, 8);
    struct token_logprob top[8];
    float lp;
    cr_assert_eq(sampler_logprobs(&s, 1, 8, &lp, top), 8); /* truncated tokens are still listed */
    sampler_free(&s);
}

Test(sampler_logprobs, before_any_pick_or_outside_the_vocabulary_are_einval)
{
    struct sampler_params p = {.top_p = 1};
    struct sampler s;
    float lp;
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    cr_assert_eq(sampler_logprobs(&s, 0, 0, &lp, NULL), -INFERD_EINVAL);
    sampler_pick(&s, logits);
    cr_assert_eq(sampler_logprobs(&s, 8, 0, &lp, NULL), -INFERD_EINVAL);
    cr_assert_eq(sampler_logprobs(&s, -1, 0, &lp, NULL), -INFERD_EINVAL);
    sampler_free(&s);
}

/* ---- NaN and infinities ---- */

Test(sampler_nonfinite, nan_logits_count_as_minus_inf_when_greedy_sampled_and_in_logprobs)
{
    const float row[6] = {NAN, 1.0f, NAN, 2.0f, -INFINITY, NAN};
    struct sampler_params greedy = {.top_p = 1};
    struct sampler_params sampled = {.temperature = 2, .top_p = 1, .seed = 9};
    struct sampler_params truncated = {.temperature = 2, .top_k = 4, .top_p = 0.99f, .min_p = 0.01f, .seed = 9};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &greedy, 6, NULL), 0);
    cr_assert_eq(sampler_pick(&s, row), 3);
    float lp;
    struct token_logprob top[6];
    cr_assert_eq(sampler_logprobs(&s, 0, 6, &lp, top), 2); /* only tokens 3 and 1 */
    cr_assert(isinf(lp) && lp < 0);
    cr_assert(top[0].token == 3 && top[1].token == 1);
    cr_assert(fabs(log(exp(top[0].logprob) + exp(top[1].logprob))) < 1e-6);
    sampler_free(&s);
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(sampler_init(&s, run ? &truncated : &sampled, 6, NULL), 0);
        for (int i = 0; i < 500; i++) {
            int32_t t = sampler_pick(&s, row);
            cr_assert(t == 1 || t == 3, "picked %d", t);
        }
        sampler_free(&s);
    }
}

Test(sampler_nonfinite, a_row_with_nothing_above_minus_inf_still_gives_an_in_range_token)
{
    const float nan_row[4] = {NAN, NAN, NAN, NAN};
    const float ninf_row[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    struct sampler_params greedy = {.top_p = 1};
    struct sampler_params sampled = {.temperature = 1, .top_k = 2, .top_p = 0.5f, .seed = 1};
    struct sampler s;
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(sampler_init(&s, run ? &sampled : &greedy, 4, NULL), 0);
        int32_t a = sampler_pick(&s, nan_row), b = sampler_pick(&s, ninf_row);
        cr_assert(a >= 0 && a < 4 && b >= 0 && b < 4);
        float lp;
        struct token_logprob top[4];
        cr_assert_eq(sampler_logprobs(&s, b, 4, &lp, top), 0);
        cr_assert(isinf(lp) && lp < 0);
        sampler_free(&s);
    }
}

Test(sampler_nonfinite, plus_inf_logits_share_all_the_probability)
{
    const float row[5] = {1.0f, INFINITY, NAN, INFINITY, 50.0f};
    struct sampler_params sampled = {.temperature = 1, .top_p = 0.9f, .seed = 3};
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &sampled, 5, NULL), 0);
    int seen[5] = {0};
    for (int i = 0; i < 400; i++)
        seen[sampler_pick(&s, row)]++;
    cr_assert(seen[1] > 0 && seen[3] > 0 && seen[1] + seen[3] == 400);
    float lp;
    struct token_logprob top[5];
    cr_assert_eq(sampler_logprobs(&s, 3, 5, &lp, top), 2);
    cr_assert_float_eq(lp, -logf(2), 1e-6);
    cr_assert(top[0].token == 1 && top[1].token == 3);
    cr_assert_eq(sampler_logprobs(&s, 4, 0, &lp, NULL), 0);
    cr_assert(isinf(lp) && lp < 0);
    sampler_free(&s);
}

/* ---- validation and lifetime ---- */

static void assert_refused(struct sampler_params p, int n_vocab, int code, const char *needle)
{
    struct sampler s = {0};
    struct err err = {0};
    cr_assert_eq(sampler_init(&s, &p, n_vocab, &err), -code, "accepted; wanted '%s'", needle);
    cr_assert_eq(err.code, code);
    cr_assert(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
    cr_assert_null(s.probs);
    sampler_free(&s);
}

Test(sampler_validation, penalties_outside_their_ranges_are_refused_with_a_message)
{
    struct sampler_params base = {.temperature = 1, .top_p = 1};
    struct sampler_params p = base;
    p.repetition_penalty = -1;
    assert_refused(p, 8, INFERD_ERANGE, "repetition_penalty");
    p.repetition_penalty = 10.5f;
    assert_refused(p, 8, INFERD_ERANGE, "repetition_penalty");
    p.repetition_penalty = NAN;
    assert_refused(p, 8, INFERD_ERANGE, "repetition_penalty");
    p = base;
    p.presence_penalty = 2.5f;
    assert_refused(p, 8, INFERD_ERANGE, "presence_penalty");
    p = base;
    p.frequency_penalty = -3;
    assert_refused(p, 8, INFERD_ERANGE, "frequency_penalty");
    p = base;
    p.frequency_penalty = NAN;
    assert_refused(p, 8, INFERD_ERANGE, "frequency_penalty");

    struct sampler s;
    struct sampler_params edges = {.top_p = 1, .repetition_penalty = 10, .presence_penalty = -2,
                                   .frequency_penalty = 2};
    cr_assert_eq(sampler_init(&s, &edges, 8, NULL), 0);
    sampler_free(&s);
}

Test(sampler_validation, logit_bias_outside_the_vocabulary_or_range_is_refused_with_a_message)
{
    struct sampler_logit_bias b;
    struct sampler_params p = {.top_p = 1, .logit_bias = &b, .n_logit_bias = 1};
    b = (struct sampler_logit_bias){8, 1};
    assert_refused(p, 8, INFERD_ERANGE, "outside the vocabulary");
    b = (struct sampler_logit_bias){-1, 1};
    assert_refused(p, 8, INFERD_ERANGE, "outside the vocabulary");
    b = (struct sampler_logit_bias){2, 100.5f};
    assert_refused(p, 8, INFERD_ERANGE, "[-100, 100]");
    b = (struct sampler_logit_bias){2, NAN};
    assert_refused(p, 8, INFERD_ERANGE, "[-100, 100]");
    p.logit_bias = NULL;
    assert_refused(p, 8, INFERD_EINVAL, "no array");
    p.n_logit_bias = -1;
    assert_refused(p, 8, INFERD_EINVAL, "negative");
}

Test(sampler_validation, an_empty_vocabulary_is_refused)
{
    assert_refused((struct sampler_params){.top_p = 1}, 0, INFERD_EINVAL, "vocabulary size");
}

Test(sampler_lifetime, free_is_safe_twice_and_on_a_zeroed_sampler)
{
    struct sampler s = {0};
    sampler_free(&s);
    struct sampler_logit_bias b = {1, 1};
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 1.1f, .logit_bias = &b, .n_logit_bias = 1};
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    sampler_free(&s);
    sampler_free(&s);
    cr_assert_null(s.processed);
    cr_assert_null(s.seen);
}

/* ---- truncation against sorting the whole vocabulary ---- */

static uint64_t ref_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int ref_by_prob_desc(const void *a, const void *b, void *probs_)
{
    const float *probs = probs_;
    float pa = probs[*(const int32_t *)a], pb = probs[*(const int32_t *)b];
    if (pa != pb)
        return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The straightforward sampler: sort everything, then walk top-k, min-p, top-p. */
static int32_t ref_pick(const struct sampler_params *p, uint64_t *rng, const float *x, int n, float *probs,
                        int32_t *order)
{
    float max = x[0];
    for (int i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        probs[i] = expf((x[i] - max) / p->temperature);
        sum += probs[i];
    }
    for (int i = 0; i < n; i++) {
        probs[i] = (float)(probs[i] / sum);
        order[i] = i;
    }
    qsort_r(order, (size_t)n, sizeof *order, ref_by_prob_desc, probs);
    int keep = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    if (p->min_p > 0) {
        float floor = p->min_p * probs[order[0]];
        int k = 1;
        while (k < keep && probs[order[k]] >= floor)
            k++;
        keep = k;
    }
    if (p->top_p < 1) {
        double cum = 0;
        int k = 0;
        while (k < keep) {
            cum += probs[order[k++]];
            if (cum >= p->top_p)
                break;
        }
        keep = k;
    }
    double total = 0;
    for (int k = 0; k < keep; k++)
        total += probs[order[k]];
    double r = (double)(ref_splitmix64(rng) >> 11) * 0x1.0p-53 * total;
    for (int k = 0; k < keep; k++) {
        r -= probs[order[k]];
        if (r < 0)
            return order[k];
    }
    return order[keep - 1];
}

Test(sampler_truncation, keeps_the_same_tokens_as_sorting_the_whole_vocabulary)
{
    enum { N = 3000 };
    static float row[N], probs[N];
    static int32_t order[N];
    const struct sampler_params cases[] = {
        {.temperature = 1, .top_k = 40, .top_p = 1},
        {.temperature = 1, .top_p = 0.9f},
        {.temperature = 3, .top_p = 0.5f},
        {.temperature = 1, .top_p = 0.999f},
        {.temperature = 1, .top_p = 1, .min_p = 0.05f},
        {.temperature = 0.7f, .top_k = 50, .top_p = 0.95f, .min_p = 0.02f},
        {.temperature = 5, .top_k = 2500, .top_p = 0.99f},
        {.temperature = 2, .top_k = 10, .top_p = 0.999f},
        {.temperature = 1, .top_p = 0.3f, .min_p = 0.001f},
    };
    for (int c = 0; c < (int)(sizeof cases / sizeof *cases); c++) {
        for (int tied = 0; tied < 2; tied++) {
            struct sampler_params p = cases[c];
            p.seed = 100 + c;
            struct sampler s;
            cr_assert_eq(sampler_init(&s, &p, N, NULL), 0);
            uint64_t rng = p.seed;
            lcg_state = 7 + c;
            for (int step = 0; step < 40; step++) {
                float spread = step % 2 ? 4 : 15;
                for (int i = 0; i < N; i++) {
                    row[i] = lcg_uniform(-spread, spread);
                    if (tied) /* few distinct values: many equal probabilities */
                        row[i] = roundf(row[i]);
                }
                int32_t want = ref_pick(&p, &rng, row, N, probs, order);
                int32_t got = sampler_pick(&s, row);
                cr_assert_eq(got, want, "case %d tied %d step %d: %d, want %d", c, tied, step, got, want);
            }
            sampler_free(&s);
        }
    }
}

/* ---- picks made by a backend (sampler_fill_spec / sampler_take_result) ---- */

/* The adjustments applied as backend.h states them. */
static void apply_spec(const struct sample_spec *spec, float *x)
{
    for (int i = 0; i < spec->n_adjust; i++) {
        const struct sample_adjust *a = &spec->adjust[i];
        float v = x[a->token] + a->bias;
        if (a->repeat)
            v = v > 0 ? v / spec->repetition_penalty : v * spec->repetition_penalty;
        if (a->count > 0)
            v = fmaf(-spec->frequency_penalty, (float)a->count, v) - spec->presence_penalty;
        x[a->token] = v;
    }
}

static void random_row(float *x, int n, float amp)
{
    for (int i = 0; i < n; i++)
        x[i] = lcg_uniform(-amp, amp);
}

static const struct sampler_logit_bias spec_bias[] = {{2, 1.0f}, {5, -3.0f}, {2, 0.5f}, {60, 4.0f}};

static struct sampler_params spec_params(float temperature)
{
    return (struct sampler_params){.temperature = temperature, .top_k = 0, .top_p = 0.9f,
                                   .seed = 5, .repetition_penalty = 1.3f,
                                   .presence_penalty = 0.4f, .frequency_penalty = 0.25f,
                                   .logit_bias = spec_bias, .n_logit_bias = 4};
}

Test(sampler_backend, spec_adjustments_reproduce_the_hosts_processed_logits)
{
    enum { N = 64 };
    struct sampler s;
    struct sampler_params p = spec_params(0.8f);
    cr_assert_eq(sampler_init(&s, &p, N, NULL), 0);
    int32_t prompt[] = {1, 2, 7, 7};
    sampler_observe_prompt(&s, prompt, 4);
    int32_t generated[] = {3, 3, 1, 60, 9};
    for (int i = 0; i < 5; i++)
        sampler_accept(&s, generated[i]);
    float row[N], mine[N];
    lcg_state = 99;
    random_row(row, N, 4);
    struct sample_spec spec;
    cr_assert_eq(sampler_fill_spec(&s, 3, &spec), 0);
    /* one entry per token: 2, 5, 60 (bias, merged) then 1, 7, 3, 9 (seen) */
    cr_assert_eq(spec.n_adjust, 7);
    for (int i = 0; i < spec.n_adjust; i++)
        for (int j = 0; j < i; j++)
            cr_assert_neq(spec.adjust[i].token, spec.adjust[j].token, "token %d listed twice",
                          spec.adjust[i].token);
    cr_assert_eq(spec.n_top, 3);
    memcpy(mine, row, sizeof row);
    apply_spec(&spec, mine);
    sampler_pick(&s, row);
    cr_assert_arr_eq(mine, s.last, sizeof mine, "adjusting as backend.h says differs from the host");
    sampler_free(&s);
}

Test(sampler_backend, greedy_specs_draw_nothing_and_sampling_specs_peek_at_the_next_number)
{
    struct sampler g, r, ref;
    struct sampler_params greedy = {.temperature = 0, .top_p = 1, .seed = 9};
    struct sampler_params sampling = {.temperature = 1, .top_p = 1, .seed = 9};
    cr_assert_eq(sampler_init(&g, &greedy, 8, NULL), 0);
    cr_assert_eq(sampler_init(&r, &sampling, 8, NULL), 0);
    cr_assert_eq(sampler_init(&ref, &sampling, 8, NULL), 0);
    struct sample_spec spec;
    uint64_t before = g.rng_state;
    cr_assert_eq(sampler_fill_spec(&g, -1, &spec), 0);
    cr_assert_eq(spec.u, 0.0);
    cr_assert_eq(spec.n_top, -1, "-1 asks for no logprobs");
    cr_assert_eq(g.rng_state, before);
    cr_assert_eq(spec.n_adjust, 0);

    /* the host picks with ref; r hands every pick to the "backend" as a
     * need_host result, so the host code finishes it with spec.u */
    float row[8];
    for (int i = 0; i < 50; i++) {
        lcg_state = 1000 + (uint64_t)i;
        random_row(row, 8, 3);
        before = r.rng_state;
        cr_assert_eq(sampler_fill_spec(&r, 25, &spec), 0);
        cr_assert_eq(spec.n_top, SAMPLER_MAX_TOP_LOGPROBS, "n_top is clamped to 20");
        cr_assert_eq(r.rng_state, before, "filling a spec does not move the stream");
        cr_assert(spec.u >= 0 && spec.u < 1);
        struct sample_result res = {.need_host = 1};
        int32_t got = sampler_take_result(&r, &spec, &res, row);
        cr_assert_eq(got, sampler_pick(&ref, row), "pick %d", i);
        cr_assert_eq(r.rng_state, ref.rng_state, "pick %d moved the streams differently", i);
    }
    sampler_free(&g);
    sampler_free(&r);
    sampler_free(&ref);
}

Test(sampler_backend, a_result_that_used_no_random_number_leaves_the_stream)
{
    struct sampler s;
    struct sampler_params p = {.temperature = 1, .top_k = 3, .top_p = 1, .seed = 4};
    cr_assert_eq(sampler_init(&s, &p, 8, NULL), 0);
    struct sample_spec a, b;
    cr_assert_eq(sampler_fill_spec(&s, 0, &a), 0);
    struct sample_result none = {.token = 0, .max_logit = -INFINITY, .used_random = 0};
    cr_assert_eq(sampler_take_result(&s, &a, &none, NULL), 0);
    cr_assert_eq(sampler_fill_spec(&s, 0, &b), 0);
    cr_assert_eq(a.u, b.u, "an unused number is offered again");
    struct sample_result used = {.token = 6, .logit = 1, .max_logit = 1, .log_z = 2,
                                 .used_random = 1};
    cr_assert_eq(sampler_take_result(&s, &b, &used, NULL), 6);
    cr_assert_eq(sampler_fill_spec(&s, 0, &a), 0);
    cr_assert_neq(a.u, b.u, "a used number is spent");
    sampler_free(&s);
}

/* A backend's result for a processed row, built the way backend.h describes. */
static struct sample_result result_of_row(const float *x, int n, int32_t token, int n_top)
{
    struct sample_result r = {.token = token, .logit = x[token] == x[token] ? x[token] : -INFINITY};
    float max = -INFINITY;
    int n_inf = 0;
    for (int i = 0; i < n; i++) {
        max = x[i] > max ? x[i] : max;
        n_inf += x[i] == INFINITY;
    }
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i])
            sum += expf(x[i] - max);
    r.max_logit = max;
    r.log_z = max == INFINITY ? logf((float)n_inf) : (float)(max + log(sum));
    /* top by logit descending, ties lower id first, NaN as -inf */
    int m = 0;
    for (int k = 0; k < n_top && k < n; k++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int j = 0; j < m; j++)
                taken |= r.top[j].token == i;
            float v = x[i] == x[i] ? x[i] : -INFINITY;
            if (!taken && (best < 0 || v > (x[best] == x[best] ? x[best] : -INFINITY)))
                best = i;
        }
        r.top[m].token = best;
        r.top[m++].logit = x[best] == x[best] ? x[best] : -INFINITY;
    }
    r.n_top = m;
    return r;
}

static void assert_result_logprobs_match(const float *x, int n, float amp_check)
{
    struct sampler host, dev;
    struct sampler_params p = {.temperature = 0.7f, .top_p = 1, .seed = 2};
    cr_assert_eq(sampler_init(&host, &p, n, NULL), 0);
    cr_assert_eq(sampler_init(&dev, &p, n, NULL), 0);
    int32_t token = sampler_pick(&host, x);
    struct sample_spec spec;
    cr_assert_eq(sampler_fill_spec(&dev, SAMPLER_MAX_TOP_LOGPROBS, &spec), 0);
    struct sample_result res = result_of_row(x, n, token, spec.n_top);
    res.used_random = 1;
    cr_assert_eq(sampler_take_result(&dev, &spec, &res, NULL), token);
    for (int top_n = 0; top_n <= SAMPLER_MAX_TOP_LOGPROBS; top_n += 5) {
        struct token_logprob th[SAMPLER_MAX_TOP_LOGPROBS], td[SAMPLER_MAX_TOP_LOGPROBS];
        float lh, ld;
        int nh = sampler_logprobs(&host, token, top_n, &lh, th);
        int nd = sampler_logprobs(&dev, token, top_n, &ld, td);
        cr_assert_eq(nd, nh);
        cr_assert(lh == ld || fabsf(lh - ld) <= amp_check, "token logprob %g vs %g", ld, lh);
        for (int k = 0; k < nh; k++) {
            cr_assert_eq(td[k].token, th[k].token);
            cr_assert(fabsf(td[k].logprob - th[k].logprob) <= amp_check, "top %d: %g vs %g", k,
                      td[k].logprob, th[k].logprob);
        }
    }
    /* another candidate's logprob comes from the list; a token outside it is unknown */
    float l;
    cr_assert_eq(sampler_logprobs(&dev, res.top[1].token, 0, &l, NULL), 0);
    int32_t outside = -1;
    for (int i = 0; i < n && outside < 0; i++) {
        bool listed = i == token;
        for (int k = 0; k < res.n_top; k++)
            listed |= res.top[k].token == i;
        if (!listed)
            outside = i;
    }
    if (outside >= 0 && res.max_logit > -INFINITY)
        cr_assert_eq(sampler_logprobs(&dev, outside, 0, &l, NULL), -INFERD_EINVAL);
    sampler_free(&host);
    sampler_free(&dev);
}

Test(sampler_backend, logprobs_from_a_result_equal_the_hosts)
{
    enum { N = 300 };
    float x[N];
    lcg_state = 5;
    random_row(x, N, 10);
    x[7] = x[8] = x[9] = 11.0f; /* ties at the top */
    x[40] = NAN;
    x[41] = -INFINITY;
    assert_result_logprobs_match(x, N, 1e-5f);
}

Test(sampler_backend, logprobs_from_a_result_follow_the_plus_inf_rule)
{
    enum { N = 50 };
    float x[N];
    lcg_state = 6;
    random_row(x, N, 3);
    x[12] = INFINITY;
    x[30] = INFINITY;
    assert_result_logprobs_match(x, N, 1e-6f);
}

/* ---- XTC ("exclude top choices") ---- */

/* Logits whose temperature-1 probabilities are 0.4, 0.3, 0.2, 0.1. */
static void xtc_row(float *x)
{
    const double p[4] = {0.4, 0.3, 0.2, 0.1};
    for (int i = 0; i < 4; i++)
        x[i] = (float)log(p[i]);
}

/* Which of 4 tokens 400 picks with p give (counts[token]). */
static void xtc_counts(struct sampler_params p, int counts[4])
{
    struct sampler s;
    float x[4];
    xtc_row(x);
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    memset(counts, 0, 4 * sizeof *counts);
    for (int i = 0; i < 400; i++)
        counts[sampler_pick(&s, x)]++;
    sampler_free(&s);
}

Test(sampler_xtc, removes_every_token_above_the_threshold_but_the_least_likely_of_them)
{
    int c[4];
    /* 0.4, 0.3 and 0.2 are above 0.15: 0.2 is the least likely, so 0 and 1 go */
    xtc_counts((struct sampler_params){.temperature = 1, .top_p = 1, .seed = 3,
                                       .xtc_probability = 1, .xtc_threshold = 0.15f},
               c);
    cr_assert_eq(c[0] + c[1], 0, "tokens 0 and 1 were removed on every pick (p = 1)");
    cr_assert(c[2] > 0 && c[3] > 0, "the rest are sampled: %d %d", c[2], c[3]);
    cr_assert(c[2] > c[3], "in proportion to their probabilities: %d %d", c[2], c[3]);
}

Test(sampler_xtc, one_token_above_the_threshold_is_never_removed)
{
    int c[4];
    xtc_counts((struct sampler_params){.temperature = 1, .top_p = 1, .seed = 3,
                                       .xtc_probability = 1, .xtc_threshold = 0.35f},
               c);
    cr_assert(c[0] > 0 && c[1] > 0 && c[2] > 0 && c[3] > 0, "nothing removed");
}

Test(sampler_xtc, exempt_tokens_are_never_removed)
{
    int c[4];
    xtc_counts((struct sampler_params){.temperature = 1, .top_p = 1, .seed = 3,
                                       .xtc_probability = 1, .xtc_threshold = 0.15f,
                                       .xtc_keep = {0}, .n_xtc_keep = 1},
               c);
    cr_assert(c[0] > 0, "token 0 is exempt");
    cr_assert_eq(c[1], 0, "token 1 still goes");
}

Test(sampler_xtc, applies_after_truncation_over_the_renormalized_candidates)
{
    int c[4];
    /* top_k 2 keeps 0.4 and 0.3, renormalized 4/7 and 3/7: both above 0.15, 0 goes */
    xtc_counts((struct sampler_params){.temperature = 1, .top_k = 2, .top_p = 1, .seed = 3,
                                       .xtc_probability = 1, .xtc_threshold = 0.15f},
               c);
    cr_assert_eq(c[1], 400, "only token 1 is left: %d %d %d %d", c[0], c[1], c[2], c[3]);
}

Test(sampler_xtc, probability_zero_changes_nothing)
{
    struct sampler a, b;
    struct sampler_params plain = {.temperature = 0.9f, .top_p = 1, .seed = 11};
    struct sampler_params off = plain;
    off.xtc_threshold = 0.1f; /* a threshold alone does not turn it on */
    cr_assert_eq(sampler_init(&a, &plain, 8, NULL), 0);
    cr_assert_eq(sampler_init(&b, &off, 8, NULL), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(sampler_pick(&a, logits), sampler_pick(&b, logits), "pick %d", i);
    cr_assert_eq(a.rng_state, b.rng_state, "no number is drawn for it");
    sampler_free(&a);
    sampler_free(&b);
}

Test(sampler_xtc, greedy_picks_ignore_it)
{
    struct sampler s;
    float x[4];
    xtc_row(x);
    struct sampler_params p = {.temperature = 0, .top_p = 1, .xtc_probability = 1,
                               .xtc_threshold = 0};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    uint64_t before = s.rng_state;
    cr_assert_eq(sampler_pick(&s, x), 0);
    cr_assert_eq(s.rng_state, before);
    sampler_free(&s);
}

Test(sampler_xtc, same_seed_gives_the_same_tokens_and_it_fires_at_its_rate)
{
    struct sampler a, b;
    float x[4];
    xtc_row(x);
    struct sampler_params p = {.temperature = 1, .top_p = 1, .seed = 21, .xtc_probability = 0.5f,
                               .xtc_threshold = 0.15f};
    cr_assert_eq(sampler_init(&a, &p, 4, NULL), 0);
    cr_assert_eq(sampler_init(&b, &p, 4, NULL), 0);
    int top = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t t = sampler_pick(&a, x);
        cr_assert_eq(t, sampler_pick(&b, x), "pick %d", i);
        top += t <= 1;
    }
    /* without XTC tokens 0 and 1 take 70%; firing half the time leaves 35% */
    cr_assert(top > 280 && top < 420, "tokens 0 or 1 in %d of 1000 picks", top);
    sampler_free(&a);
    sampler_free(&b);
}

Test(sampler_xtc, out_of_range_parameters_are_refused)
{
    struct sampler s;
    struct err err = {0};
    struct sampler_params p = {.temperature = 1, .top_p = 1, .xtc_probability = 1.5f};
    cr_assert_eq(sampler_init(&s, &p, 4, &err), -INFERD_ERANGE);
    cr_assert(strstr(err.msg, "xtc_probability"), "%s", err.msg);
    p = (struct sampler_params){.temperature = 1, .top_p = 1, .xtc_threshold = 0.6f};
    cr_assert_eq(sampler_init(&s, &p, 4, &err), -INFERD_ERANGE);
    cr_assert(strstr(err.msg, "xtc_threshold"), "%s", err.msg);
    p = (struct sampler_params){.temperature = 1, .top_p = 1, .n_xtc_keep = SAMPLER_MAX_XTC_KEEP + 1};
    cr_assert_eq(sampler_init(&s, &p, 4, &err), -INFERD_ERANGE);
}

Test(sampler_xtc, a_backend_is_asked_only_for_picks_where_it_does_not_fire)
{
    struct sampler dev, host;
    struct sampler_params p = {.temperature = 1, .top_p = 1, .seed = 8, .xtc_probability = 0.5f,
                               .xtc_threshold = 0.1f};
    cr_assert_eq(sampler_init(&dev, &p, 8, NULL), 0);
    cr_assert_eq(sampler_init(&host, &p, 8, NULL), 0);
    float row[8];
    int on_host = 0;
    for (int i = 0; i < 60; i++) {
        lcg_state = 500 + (uint64_t)i;
        random_row(row, 8, 2);
        struct sample_spec spec;
        int rc = sampler_fill_spec(&dev, 0, &spec);
        int32_t got;
        if (rc == -INFERD_EUNSUPPORTED) {
            on_host++;
            got = sampler_pick(&dev, row);
        } else {
            cr_assert_eq(rc, 0);
            struct sample_result res = {.need_host = 1};
            got = sampler_take_result(&dev, &spec, &res, row);
        }
        cr_assert_eq(got, sampler_pick(&host, row), "pick %d", i);
        cr_assert_eq(dev.rng_state, host.rng_state, "pick %d moved the streams differently", i);
    }
    cr_assert(on_host > 10 && on_host < 50, "XTC fired on %d of 60 picks", on_host);
    sampler_free(&dev);
    sampler_free(&host);
}

/* ---- penalty windows ---- */

Test(sampler_windows, repetition_sees_only_the_last_n_tokens_of_prompt_and_output)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2, .repetition_context_size = 2};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){0, 1, 2}, 3); /* 0 is outside the window */
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){2.0f, -2.0f, 0.25f, 3.0f}, 4);
    sampler_accept(&s, 3); /* the window is now 2, 3 */
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){2.0f, -1.0f, 0.25f, 1.5f}, 4);
    sampler_free(&s);
}

Test(sampler_windows, a_token_is_penalized_inside_its_window_and_not_after)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .presence_penalty = 1, .frequency_penalty = 0.5f,
                               .presence_context_size = 20, .frequency_context_size = 20};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_accept(&s, 3);
    for (int i = 0; i < 19; i++)
        sampler_accept(&s, 1);
    sampler_pick(&s, small); /* 3 is the oldest of the last 20 */
    assert_logprobs_match(&s, (const float[]){2.0f, -1.0f - 19 * 0.5f - 1, 0.5f, 1.5f}, 4);
    sampler_accept(&s, 1); /* 3 slides out */
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){2.0f, -1.0f - 20 * 0.5f - 1, 0.5f, 3.0f}, 4);
    sampler_free(&s);
}

Test(sampler_windows, zero_is_the_whole_history)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 2, .frequency_penalty = 0.5f};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){0}, 1);
    sampler_accept(&s, 3);
    for (int i = 0; i < 100; i++)
        sampler_accept(&s, 1);
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){1.0f, -2.0f - 50, 0.5f, 1.0f}, 4);
    sampler_free(&s);
}

Test(sampler_windows, presence_and_frequency_windows_may_differ)
{
    struct sampler s;
    struct sampler_params p = {.top_p = 1, .presence_penalty = 1, .frequency_penalty = 0.5f,
                               .presence_context_size = 1, .frequency_context_size = 3};
    cr_assert_eq(sampler_init(&s, &p, 4, NULL), 0);
    sampler_accept(&s, 0);
    sampler_accept(&s, 2);
    sampler_accept(&s, 2);
    sampler_accept(&s, 3);
    /* presence window {3}; frequency window {2, 2, 3} */
    sampler_pick(&s, small);
    assert_logprobs_match(&s, (const float[]){2.0f, -1.0f, -0.5f, 1.5f}, 4);
    struct sample_spec spec;
    cr_assert_eq(sampler_fill_spec(&s, -1, &spec), -INFERD_EUNSUPPORTED,
                 "one count per token cannot carry two windows: the host picks");
    sampler_free(&s);
}

Test(sampler_windows, spec_adjustments_reproduce_the_hosts_windowed_logits)
{
    enum { N = 64 };
    struct sampler s;
    struct sampler_params p = spec_params(0.8f);
    p.repetition_context_size = 3;
    p.presence_context_size = p.frequency_context_size = 4;
    cr_assert_eq(sampler_init(&s, &p, N, NULL), 0);
    sampler_observe_prompt(&s, (const int32_t[]){11, 12, 13, 1, 2}, 5);
    int32_t generated[] = {3, 3, 1, 60, 9, 9, 4};
    float row[N], mine[N];
    lcg_state = 77;
    random_row(row, N, 4);
    for (int g = 0; g < 7; g++) {
        sampler_accept(&s, generated[g]);
        struct sample_spec spec;
        cr_assert_eq(sampler_fill_spec(&s, 3, &spec), 0);
        memcpy(mine, row, sizeof row);
        apply_spec(&spec, mine);
        sampler_pick(&s, row);
        cr_assert_arr_eq(mine, s.last, sizeof mine, "after %d generated tokens", g + 1);
        for (int i = 0; i < spec.n_adjust; i++)
            cr_assert_neq(spec.adjust[i].token, 11, "11 left every window with the prompt's head");
    }
    sampler_free(&s);
}

Test(sampler_windows, negative_sizes_are_refused)
{
    struct sampler s;
    struct err err = {0};
    struct sampler_params p = {.top_p = 1, .repetition_penalty = 1.2f,
                               .repetition_context_size = -1};
    cr_assert_eq(sampler_init(&s, &p, 4, &err), -INFERD_ERANGE);
    cr_assert(strstr(err.msg, "context sizes"), "%s", err.msg);
}
