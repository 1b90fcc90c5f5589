/* tests/unit/test_prompt.c — requests made into prompt tokens and generation parameters: chat
 * messages through the house model's template, raw and token-id prompts, the precedence of
 * request fields over server defaults, and the errors for what cannot become a prompt. */
#include <criterion/criterion.h>
#include <limits.h>
#include <string.h>

#include "api/prompt.h"

#define HOUSE INFERD_SOURCE_DIR "/models/house"

static struct tokenizer *tok;
static struct chat_template tmpl;
static struct server srv;

static void setup(void)
{
    struct err err = {0};
    cr_assert_eq(tok_load(HOUSE, &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(chat_template_load(tok, &tmpl, &err), 0, "%s", err.msg);
    memset(&srv, 0, sizeof srv);
    srv.served.tok = tok;
    srv.served.tmpl = &tmpl;
    srv.served.defaults = (struct server_defaults){.temperature = 0.7f, .top_p = 0.9f, .top_k = 40,
                                            .repetition_penalty = 1.1f};
    srv.served.eos_ids[0] = 2;
    srv.served.n_eos = 1;
}

static void teardown(void)
{
    chat_template_free(&tmpl);
    tok_free(tok);
}

TestSuite(prompt, .init = setup, .fini = teardown);

static struct gen_request req;
static struct api_error aerr;

static void parse(const char *body, enum gen_request_kind kind)
{
    cr_assert_eq(gen_request_parse(body, strlen(body), kind, &req, &aerr), 0, "%s", aerr.message);
}

/* The prompt of body, as token ids. */
static struct prompt build(const char *body, enum gen_request_kind kind)
{
    parse(body, kind);
    struct prompt p;
    cr_assert(prompt_build(&srv, &srv.served, &req, 0, &p, &aerr), "%s", aerr.message);
    gen_request_free(&req);
    return p;
}

static void assert_same_ids(const struct prompt *a, const struct prompt *b)
{
    cr_assert_eq(a->n_ids, b->n_ids);
    cr_assert_arr_eq(a->ids, b->ids, (size_t)a->n_ids * sizeof(int32_t));
}

Test(prompt, text_parts_are_joined_into_the_same_prompt_as_a_string)
{
    struct prompt parts = build("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                                "\"text\":\"In the \"},{\"type\":\"text\",\"text\":\"beginning\"}]}]}",
                                GEN_REQUEST_CHAT);
    struct prompt plain =
        build("{\"messages\":[{\"role\":\"user\",\"content\":\"In the beginning\"}]}", GEN_REQUEST_CHAT);
    assert_same_ids(&parts, &plain);
    prompt_free(&parts);
    prompt_free(&plain);
}

Test(prompt, chat_prompt_is_the_rendered_template_ending_in_the_assistant_turn)
{
    struct prompt p = build("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", GEN_REQUEST_CHAT);
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    cr_assert_eq(tok_decode(tok, p.ids, p.n_ids, false, &text, &len, &err), 0, "%s", err.msg);
    cr_assert_str_eq(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    cr_assert_not(p.starts_inside_think);
    free(text);
    prompt_free(&p);
}

Test(prompt, null_content_of_a_tool_calling_turn_renders_as_empty)
{
    struct prompt p = build("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                            "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                            "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                            "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}]}",
                            GEN_REQUEST_CHAT);
    cr_assert_gt(p.n_ids, 10);
    prompt_free(&p);
}

Test(prompt, token_ids_are_taken_as_they_are)
{
    struct prompt p = build("{\"prompt\":[5,6,7]}", GEN_REQUEST_COMPLETION);
    int32_t want[] = {5, 6, 7};
    cr_assert_eq(p.n_ids, 3);
    cr_assert_arr_eq(p.ids, want, sizeof want);
    prompt_free(&p);
}

Test(prompt, raw_text_is_encoded_without_a_template)
{
    struct prompt p = build("{\"prompt\":\"In the beginning\"}", GEN_REQUEST_COMPLETION);
    int32_t *ids = NULL;
    int n = 0;
    struct err err = {0};
    cr_assert_eq(tok_encode(tok, "In the beginning", 16, true, &ids, &n, &err), 0);
    cr_assert_eq(p.n_ids, n);
    cr_assert_arr_eq(p.ids, ids, (size_t)n * sizeof(int32_t));
    free(ids);
    prompt_free(&p);
}

Test(prompt, an_empty_prompt_is_a_400)
{
    parse("{\"prompt\":\"\"}", GEN_REQUEST_COMPLETION);
    struct prompt p;
    cr_assert_not(prompt_build(&srv, &srv.served, &req, 0, &p, &aerr));
    cr_assert_eq(aerr.status, 400);
    cr_assert_str_eq(aerr.param, "prompt");
    cr_assert(strstr(aerr.message, "empty"), "%s", aerr.message);
    gen_request_free(&req);
}

Test(prompt, chat_without_a_template_is_a_400_that_points_to_completions)
{
    srv.served.tmpl = NULL;
    parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", GEN_REQUEST_CHAT);
    struct prompt p;
    cr_assert_not(prompt_build(&srv, &srv.served, &req, 0, &p, &aerr));
    cr_assert_eq(aerr.status, 400);
    cr_assert_str_eq(aerr.code, "no_chat_template");
    cr_assert(strstr(aerr.message, "/v1/completions"), "%s", aerr.message);
    gen_request_free(&req);
}

Test(prompt, request_fields_win_over_server_defaults)
{
    parse("{\"prompt\":\"x\",\"temperature\":0.2,\"top_k\":-1,\"max_tokens\":9,\"seed\":5,"
          "\"logprobs\":2,\"logit_bias\":{\"7\":-100},\"stop\":[\"a\",\"b\"]}",
          GEN_REQUEST_COMPLETION);
    struct gen_params p;
    memset(&p, 0, sizeof p);
    struct sampler_logit_bias bias[1];
    prompt_fill_params(&srv, &srv.served, &req, &p, bias);
    cr_assert_float_eq(p.sampling.temperature, 0.2f, 1e-6);
    cr_assert_float_eq(p.sampling.top_p, 0.9f, 1e-6, "top_p comes from the defaults");
    cr_assert_eq(p.sampling.top_k, 0, "top_k -1 means off");
    cr_assert_float_eq(p.sampling.repetition_penalty, 1.1f, 1e-6);
    cr_assert_eq(p.sampling.seed, 5);
    cr_assert_eq(p.max_tokens, 9);
    cr_assert_eq(p.logprobs, 2);
    cr_assert_eq(p.sampling.n_logit_bias, 1);
    cr_assert_eq(bias[0].token, 7);
    cr_assert_eq(p.n_stop, 2);
    cr_assert_eq(p.n_eos, 1);
    cr_assert_eq(p.eos_ids[0], 2);
    gen_request_free(&req);
}

Test(prompt, without_fields_the_defaults_apply_and_length_is_the_context)
{
    parse("{\"prompt\":\"x\"}", GEN_REQUEST_COMPLETION);
    struct gen_params p;
    memset(&p, 0, sizeof p);
    struct sampler_logit_bias bias[1];
    prompt_fill_params(&srv, &srv.served, &req, &p, bias);
    cr_assert_float_eq(p.sampling.temperature, 0.7f, 1e-6);
    cr_assert_eq(p.sampling.top_k, 40);
    cr_assert_eq(p.max_tokens, INT32_MAX, "the engine clamps it to what the context leaves");
    cr_assert_eq(p.logprobs, -1);
    gen_request_free(&req);
}

/* ---- mlx-lm's sampler extras and the temperature without thinking ---- */

static struct gen_params filled(const char *body, enum gen_request_kind kind)
{
    parse(body, kind);
    struct gen_params p;
    memset(&p, 0, sizeof p);
    struct sampler_logit_bias bias[1];
    prompt_fill_params(&srv, &srv.served, &req, &p, bias);
    gen_request_free(&req);
    return p;
}

#define USER "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

Test(prompt, penalty_windows_default_to_20_tokens_and_xtc_to_off)
{
    struct gen_params p = filled("{\"prompt\":\"x\"}", GEN_REQUEST_COMPLETION);
    cr_assert_eq(p.sampling.repetition_context_size, 20);
    cr_assert_eq(p.sampling.presence_context_size, 20);
    cr_assert_eq(p.sampling.frequency_context_size, 20);
    cr_assert_eq(p.sampling.xtc_probability, 0);
    cr_assert_eq(p.sampling.xtc_threshold, 0);
    p = filled("{\"prompt\":\"x\",\"repetition_context_size\":0,\"presence_context_size\":5,"
               "\"frequency_context_size\":7,\"xtc_probability\":0.5,\"xtc_threshold\":0.1}",
               GEN_REQUEST_COMPLETION);
    cr_assert_eq(p.sampling.repetition_context_size, 0);
    cr_assert_eq(p.sampling.presence_context_size, 5);
    cr_assert_eq(p.sampling.frequency_context_size, 7);
    cr_assert_float_eq(p.sampling.xtc_probability, 0.5f, 1e-6);
    cr_assert_float_eq(p.sampling.xtc_threshold, 0.1f, 1e-6);
    /* XTC never removes the end of the reply or a newline */
    cr_assert_geq(p.sampling.n_xtc_keep, 2);
    cr_assert_eq(p.sampling.xtc_keep[0], 2, "the eos id first");
    int32_t *nl = NULL;
    int n_nl = 0;
    struct err err = {0};
    cr_assert_eq(tok_encode(tok, "\n", 1, false, &nl, &n_nl, &err), 0);
    for (int i = 0; i < n_nl; i++)
        cr_assert_eq(p.sampling.xtc_keep[1 + i], nl[i]);
    free(nl);
}

Test(prompt, a_chat_turn_with_thinking_off_runs_at_most_0_7_unless_a_temperature_is_given)
{
    srv.served.defaults.temperature = 1.0f; /* generation_config.json's */
    struct gen_params p = filled(
        "{" USER ",\"chat_template_kwargs\":{\"enable_thinking\":false}}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 0.7f, 1e-6);
    p = filled("{" USER ",\"reasoning_effort\":\"none\"}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 0.7f, 1e-6);
    srv.thinking = SERVER_THINKING_OFF;
    p = filled("{" USER "}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 0.7f, 1e-6, "--thinking off");
    p = filled("{" USER ",\"temperature\":1.3}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 1.3f, 1e-6, "the request's wins");
    srv.served.defaults.temperature_set = true;
    p = filled("{" USER "}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 1.0f, 1e-6, "--temperature wins");
    srv.served.defaults.temperature_set = false;
    srv.thinking = SERVER_THINKING_TEMPLATE;

    p = filled("{" USER "}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 1.0f, 1e-6, "the template decides: unchanged");
    p = filled("{" USER ",\"chat_template_kwargs\":{\"enable_thinking\":true}}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 1.0f, 1e-6, "thinking on: unchanged");
    srv.served.defaults.temperature = 0.5f;
    p = filled("{" USER ",\"reasoning_effort\":\"none\"}", GEN_REQUEST_CHAT);
    cr_assert_float_eq(p.sampling.temperature, 0.5f, 1e-6, "a cooler default stays");
}
