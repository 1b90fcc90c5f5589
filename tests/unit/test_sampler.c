/* tests/unit/test_sampler.c — greedy picks the argmax; seeded sampling is reproducible and respects top-k/top-p/min-p. */
#include <criterion/criterion.h>

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
