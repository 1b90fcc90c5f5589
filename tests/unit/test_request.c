/* tests/unit/test_request.c — OpenAI request bodies: every field's valid and invalid forms, error
 * objects and their JSON. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "base/err.h"

static struct gen_request req;
static struct api_error aerr;

static void teardown(void)
{
    gen_request_free(&req);
}

TestSuite(request, .fini = teardown);

static int parse_chat(const char *body)
{
    return gen_request_parse(body, strlen(body), GEN_REQUEST_CHAT, &req, &aerr);
}

static int parse_completion(const char *body)
{
    return gen_request_parse(body, strlen(body), GEN_REQUEST_COMPLETION, &req, &aerr);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define CHAT(extra) "{" MSGS "," extra "}"

#define assert_ok(rc) cr_assert_eq((rc), 0, "rc %d: [%s] %s", (rc), aerr.param, aerr.message)

/* A 400 invalid_request_error naming param whose message contains fragment. */
#define assert_400(rc, want_param, fragment)                                              \
    do {                                                                                  \
        cr_assert_eq((rc), -INFERD_EINVAL, "rc %d", (rc));                                \
        cr_assert_eq(aerr.status, 400);                                                   \
        cr_assert_str_eq(aerr.type, "invalid_request_error");                             \
        cr_assert_str_eq(aerr.param, (want_param), "param '%s', message: %s", aerr.param, \
                         aerr.message);                                                   \
        cr_assert_not_null(strstr(aerr.message, (fragment)), "message '%s' lacks '%s'",   \
                           aerr.message, (fragment));                                     \
    } while (0)

/* ---- the SDK's typical bodies ---------------------------------------------- */

Test(request, sdk_streaming_chat_body_parses_with_include_usage)
{
    assert_ok(parse_chat("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                         "{\"role\":\"user\",\"content\":\"hello\"}],\"model\":\"qwen3\","
                         "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                         "\"max_completion_tokens\":64,\"temperature\":0.2}"));
    cr_assert_eq(req.kind, GEN_REQUEST_CHAT);
    cr_assert_eq(json_object_array_length(req.messages), 2);
    cr_assert_str_eq(req.model, "qwen3");
    cr_assert(req.has_stream && req.stream);
    cr_assert(req.has_include_usage && req.include_usage);
    cr_assert(req.has_max_tokens);
    cr_assert_eq(req.max_tokens, 64);
    cr_assert(req.has_temperature);
    cr_assert_float_eq(req.temperature, 0.2, 1e-12);
    cr_assert_not(req.has_top_p);
    cr_assert_not(req.has_seed);
    cr_assert_eq(req.prompt_kind, GEN_PROMPT_NONE);
}

Test(request, sdk_tools_round_trip_body_parses)
{
    assert_ok(parse_chat(
        "{\"model\":\"m\",\"messages\":["
        "{\"role\":\"user\",\"content\":\"weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{"
        "\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18C\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]},\"strict\":false}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}"));
    cr_assert_eq(json_object_array_length(req.messages), 3);
    cr_assert_eq(json_object_array_length(req.tools), 1);
    cr_assert(req.has_tool_choice);
    cr_assert_eq(req.tool_choice, GEN_TOOL_CHOICE_FUNCTION);
    cr_assert_str_eq(req.tool_choice_name, "get_weather");
}

Test(request, sdk_completion_with_token_array_parses)
{
    assert_ok(parse_completion("{\"model\":\"m\",\"prompt\":[1,2,151643],\"max_tokens\":16,"
                               "\"echo\":false,\"best_of\":1,\"suffix\":null}"));
    cr_assert_eq(req.kind, GEN_REQUEST_COMPLETION);
    cr_assert_eq(req.prompt_kind, GEN_PROMPT_TOKENS);
    cr_assert_eq(req.n_prompt_tokens, 3);
    cr_assert_eq(req.prompt_tokens[2], 151643);
    cr_assert_null(req.messages);
}

Test(request, unknown_top_level_fields_are_ignored)
{
    assert_ok(
        parse_chat(CHAT("\"metadata\":{\"a\":\"b\"},\"store\":false,\"parallel_tool_calls\":true,"
                        "\"service_tier\":\"auto\",\"x\":[1,[2,{}]]")));
}

Test(request, null_fields_count_as_absent)
{
    assert_ok(parse_chat(CHAT("\"temperature\":null,\"stop\":null,\"tools\":null,\"seed\":null")));
    cr_assert_not(req.has_temperature);
    cr_assert_eq(req.n_stop, 0);
    cr_assert_null(req.tools);
    cr_assert_not(req.has_seed);
}

/* ---- body-level errors ------------------------------------------------------ */

Test(request, invalid_json_is_400_could_not_parse)
{
    assert_400(parse_chat("{\"messages\":["), "", "could not parse the JSON body");
    assert_400(parse_chat("{\"a\":1,}"), "", "could not parse the JSON body");
    assert_400(parse_chat("{\"a\":1} x"), "", "could not parse the JSON body");
    assert_400(parse_chat(""), "", "could not parse the JSON body");
    assert_400(parse_chat("{\"a\":1"), "", "could not parse the JSON body");
}

Test(request, body_that_is_not_an_object_is_400)
{
    assert_400(parse_chat("[1,2]"), "", "must be a JSON object");
    assert_400(parse_chat("\"hi\""), "", "must be a JSON object");
    assert_400(parse_chat("5"), "", "must be a JSON object, got a number");
    assert_400(parse_chat("null"), "", "must be a JSON object, got null");
    assert_400(parse_chat(" true "), "", "must be a JSON object, got a boolean");
}

Test(request, nesting_beyond_64_levels_is_400)
{
    char body[512];
    size_t n = 0;
    n += (size_t)sprintf(body + n, "{" MSGS ",\"x\":");
    for (int i = 0; i < 70; i++)
        body[n++] = '[';
    for (int i = 0; i < 70; i++)
        body[n++] = ']';
    body[n++] = '}';
    body[n] = '\0';
    assert_400(parse_chat(body), "", "nesting deeper than 64");
}

Test(request, nesting_within_the_limit_is_accepted)
{
    char body[512];
    size_t n = 0;
    n += (size_t)sprintf(body + n, "{" MSGS ",\"x\":");
    for (int i = 0; i < 50; i++)
        body[n++] = '[';
    for (int i = 0; i < 50; i++)
        body[n++] = ']';
    body[n++] = '}';
    body[n] = '\0';
    assert_ok(parse_chat(body));
}

Test(request, raw_nul_byte_in_body_is_400)
{
    static const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\0b\"}]}";
    int rc = gen_request_parse(body, sizeof body - 1, GEN_REQUEST_CHAT, &req, &aerr);
    assert_400(rc, "", "NUL");
}

Test(request, escaped_nul_inside_kept_string_is_400)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}"),
               "messages[0].content", "NUL");
}

Test(request, invalid_utf8_in_kept_string_is_400)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\"}]}"),
               "messages[0].content", "UTF-8");
    assert_400(parse_chat(CHAT("\"model\":\"\xc0\xaf\"")), "model", "UTF-8");
    assert_400(parse_completion("{\"prompt\":\"\xed\xa0\x80\"}"), "prompt", "UTF-8");
}

Test(request, escaped_lone_surrogate_becomes_replacement_character)
{
    assert_ok(parse_completion("{\"prompt\":\"a\\ud800\"}"));
    cr_assert_str_eq(req.prompt_text, "a\xef\xbf\xbd");
}

Test(request, valid_multibyte_utf8_is_kept)
{
    assert_ok(parse_completion(
        "{\"prompt\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \\ud83d\\ude00\"}"));
    cr_assert_eq(req.prompt_kind, GEN_PROMPT_TEXT);
    cr_assert_str_eq(req.prompt_text, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf0\x9f\x98\x80");
}

Test(request, huge_numbers_are_400)
{
    assert_400(parse_chat(CHAT("\"temperature\":1e400")), "temperature", "finite");
    assert_400(parse_chat(CHAT("\"seed\":99999999999999999999")), "", "64-bit range");
    assert_400(parse_chat(CHAT("\"seed\":-9223372036854775809")), "", "64-bit range");
    assert_400(parse_chat(CHAT("\"x\":9223372036854775808")), "", "64-bit range");
}

Test(request, digits_inside_strings_are_not_range_checked)
{
    assert_ok(parse_chat(
        "{\"messages\":[{\"role\":\"user\",\"content\":\"99999999999999999999 \\\" 1e400\"}]}"));
}

Test(request, int64_extremes_are_accepted_as_seed)
{
    assert_ok(parse_chat(CHAT("\"seed\":9223372036854775807")));
    cr_assert_eq(req.seed, INT64_MAX);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"seed\":-9223372036854775808")));
    cr_assert_eq(req.seed, INT64_MIN);
}

/* ---- messages --------------------------------------------------------------- */

Test(request, missing_or_empty_messages_is_400)
{
    assert_400(parse_chat("{\"model\":\"m\"}"), "messages", "required");
    assert_400(parse_chat("{\"messages\":[]}"), "messages", "at least one");
    assert_400(parse_chat("{\"messages\":{}}"), "messages", "must be an array");
}

Test(request, unknown_role_names_the_message)
{
    assert_400(
        parse_chat(
            "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"assistant\",\"content\":\"b\"},{\"role\":\"robot\",\"content\":\"c\"}]}"),
        "messages[2].role", "must be one of");
}

Test(request, every_role_is_accepted)
{
    assert_ok(parse_chat("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                         "{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\","
                         "\"content\":\"u\",\"name\":\"bob\"},"
                         "{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[{\"id\":\"c\","
                         "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                         "{\"role\":\"tool\",\"content\":\"t\",\"tool_call_id\":\"c\"}]}"));
}

Test(request, developer_messages_become_system_messages)
{
    assert_ok(parse_chat("{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
                         "{\"role\":\"user\",\"content\":\"u\"}]}"));
    json_object *role = NULL;
    json_object_object_get_ex(json_object_array_get_idx(req.messages, 0), "role", &role);
    cr_assert_str_eq(json_object_get_string(role), "system");
}

Test(request, message_that_is_not_an_object_is_400)
{
    assert_400(parse_chat("{\"messages\":[\"hi\"]}"), "messages[0]", "must be an object");
}

Test(request, missing_role_is_400)
{
    assert_400(parse_chat("{\"messages\":[{\"content\":\"hi\"}]}"), "messages[0].role", "required");
}

Test(request, text_content_parts_are_accepted)
{
    assert_ok(parse_chat(
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]}]}"));
}

Test(request, image_content_part_is_400_saying_images_are_unsupported)
{
    assert_400(
        parse_chat(
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
            "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:,\"}}]}]}"),
        "messages[0].content[1].type", "image content parts are not supported");
}

Test(request, other_content_part_types_and_bad_text_are_400)
{
    assert_400(
        parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}"),
        "messages[0].content[0].type", "only \"text\"");
    assert_400(
        parse_chat(
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}"),
        "messages[0].content[0].text", "must be a string");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}"),
               "messages[0].content[0].type", "required");
}

Test(request, content_of_wrong_type_is_400)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":5}]}"),
               "messages[0].content", "must be a string or an array");
}

Test(request, user_message_without_content_is_400)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\"}]}"), "messages[0].content",
               "required");
}

Test(request, assistant_may_have_null_content)
{
    assert_ok(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}"));
}

Test(request, tool_message_must_answer_an_earlier_call)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
                          "{\"role\":\"tool\",\"tool_call_id\":\"call_9\",\"content\":\"x\"}]}"),
               "messages[1].tool_call_id", "\"call_9\" is not the id of a tool call");
    /* A call made later does not count; one made earlier, among several, does. */
    assert_400(parse_chat("{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"x\"},"
                          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c2\","
                          "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}"),
               "messages[0].tool_call_id", "not the id of a tool call");
    assert_ok(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
                         "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                         "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
                         "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"x\"},"
                         "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"y\"}]}"));
}

Test(request, tool_message_needs_tool_call_id)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}"),
               "messages[0].tool_call_id", "required");
}

Test(request, malformed_tool_calls_name_the_field)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"type\":\"function\","
                          "\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}"),
               "messages[0].tool_calls[0].function.arguments", "must be a string");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"type\":\"other\","
                          "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}"),
               "messages[0].tool_calls[0].type", "\"function\"");
    assert_400(
        parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
                   "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}"),
        "messages[0].tool_calls[0].id", "required");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"type\":\"function\","
                          "\"function\":{\"name\":\"\",\"arguments\":\"{}\"}}]}]}"),
               "messages[0].tool_calls[0].function.name", "empty");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}"),
               "messages[0].tool_calls", "must be an array");
}

Test(request, incomplete_tool_calls_name_the_missing_field)
{
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}"),
               "messages[0].tool_calls[0].type", "required");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"type\":\"function\",\"function\":\"f\"}]}]}"),
               "messages[0].tool_calls[0].function", "must be an object");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"type\":\"function\",\"function\":{\"arguments\":\"{}\"}}]}]}"),
               "messages[0].tool_calls[0].function.name", "required");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                          "\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}]}"),
               "messages[0].tool_calls[0].function.arguments", "required");
    assert_400(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}"),
               "messages[0].content[0].text", "required");
}

Test(request, kept_objects_refuse_bad_utf8_and_non_finite_numbers_anywhere)
{
    assert_400(parse_chat(CHAT("\"chat_template_kwargs\":{\"a\":[1,\"\xff\"]}")),
               "chat_template_kwargs", "UTF-8");
    assert_400(parse_chat(CHAT("\"chat_template_kwargs\":{\"\xff\":1}")), "chat_template_kwargs",
               "UTF-8");
    assert_400(parse_chat(CHAT("\"chat_template_kwargs\":{\"a\":{\"b\":1e400}}")),
               "chat_template_kwargs", "not finite");
    assert_400(parse_chat(CHAT("\"response_format\":{\"type\":\"a\\u0000\"}")),
               "response_format.type", "NUL");
}

Test(request, invalid_utf8_in_unchecked_message_key_is_400)
{
    assert_400(
        parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"extra\":\"\xfe\"}]}"),
        "messages[0]", "UTF-8");
}

/* ---- prompt ----------------------------------------------------------------- */

Test(request, string_prompt_is_kept)
{
    assert_ok(parse_completion("{\"prompt\":\"Once upon\"}"));
    cr_assert_eq(req.prompt_kind, GEN_PROMPT_TEXT);
    cr_assert_str_eq(req.prompt_text, "Once upon");
    cr_assert_eq(req.prompt_text_len, 9);
}

Test(request, single_element_string_array_prompt_is_accepted)
{
    assert_ok(parse_completion("{\"prompt\":[\"Once upon\"]}"));
    cr_assert_eq(req.prompt_kind, GEN_PROMPT_TEXT);
    cr_assert_str_eq(req.prompt_text, "Once upon");
}

Test(request, multi_prompt_array_is_400_one_prompt_per_request)
{
    assert_400(parse_completion("{\"prompt\":[\"a\",\"b\"]}"), "prompt",
               "only one prompt per request");
    assert_400(parse_completion("{\"prompt\":[[1,2],[3]]}"), "prompt",
               "only one prompt per request");
}

Test(request, bad_prompts_are_400)
{
    assert_400(parse_completion("{}"), "prompt", "required");
    assert_400(parse_completion("{\"prompt\":5}"), "prompt", "must be a string or an array");
    assert_400(parse_completion("{\"prompt\":[]}"), "prompt", "empty");
    assert_400(parse_completion("{\"prompt\":[1,-2]}"), "prompt[1]", "token id");
    assert_400(parse_completion("{\"prompt\":[1,\"a\"]}"), "prompt[1]", "token id");
    assert_400(parse_completion("{\"prompt\":[1,1.5]}"), "prompt[1]", "integer");
    assert_400(parse_completion("{\"prompt\":[4294967296]}"), "prompt[0]", "token id");
    assert_400(parse_completion("{\"prompt\":[[1,2]]}"), "prompt[0]", "not supported");
}

/* ---- max_tokens ------------------------------------------------------------- */

Test(request, max_tokens_and_max_completion_tokens)
{
    assert_ok(parse_chat(CHAT("\"max_tokens\":10")));
    cr_assert_eq(req.max_tokens, 10);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"max_tokens\":10,\"max_completion_tokens\":20")));
    cr_assert_eq(req.max_tokens, 20);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"max_tokens\":5.0")));
    cr_assert_eq(req.max_tokens, 5);
}

Test(request, zero_negative_or_nonint_max_tokens_is_400)
{
    assert_400(parse_chat(CHAT("\"max_tokens\":0")), "max_tokens", "at least 1");
    assert_400(parse_chat(CHAT("\"max_tokens\":-3")), "max_tokens", "at least 1");
    assert_400(parse_chat(CHAT("\"max_completion_tokens\":0")), "max_completion_tokens",
               "at least 1");
    assert_400(parse_chat(CHAT("\"max_tokens\":\"5\"")), "max_tokens", "must be an integer");
    assert_400(parse_chat(CHAT("\"max_tokens\":2.5")), "max_tokens", "must be an integer");
}

/* ---- sampling ranges -------------------------------------------------------- */

struct range_case {
    const char *key;
    const char *ok[3];
    const char *bad[3];
};

static const struct range_case ranges[] = {
    {"temperature", {"0", "2", "0.7"}, {"-0.1", "2.01", "\"1\""}},
    {"top_p", {"1", "0.01", "0.5"}, {"0", "1.5", "true"}},
    {"min_p", {"0", "1", "0.05"}, {"-0.01", "1.01", "[]"}},
    {"repetition_penalty", {"10", "0.5", "1.1"}, {"0", "10.5", "{}"}},
    {"presence_penalty", {"-2", "2", "0"}, {"-2.5", "2.1", "\"x\""}},
    {"frequency_penalty", {"-2", "2", "1"}, {"-3", "2.5", "null_is_absent"}},
};

Test(request, ranged_numbers_accept_bounds_and_reject_outside_or_wrong_type)
{
    char body[256];
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        for (int k = 0; k < 3; k++) {
            snprintf(body, sizeof body, CHAT("\"%s\":%s"), ranges[i].key, ranges[i].ok[k]);
            assert_ok(parse_chat(body));
            gen_request_free(&req);
            if (!strcmp(ranges[i].bad[k], "null_is_absent"))
                continue;
            snprintf(body, sizeof body, CHAT("\"%s\":%s"), ranges[i].key, ranges[i].bad[k]);
            assert_400(parse_chat(body), ranges[i].key, ranges[i].key);
        }
    }
}

Test(request, ranged_values_are_stored_with_set_flags)
{
    assert_ok(parse_chat(
        CHAT("\"top_p\":0.9,\"min_p\":0.1,\"repetition_penalty\":1.2,"
             "\"presence_penalty\":-1,\"frequency_penalty\":0.5,\"top_k\":40,\"seed\":7")));
    cr_assert(req.has_top_p && req.has_min_p && req.has_repetition_penalty);
    cr_assert(req.has_presence_penalty && req.has_frequency_penalty && req.has_top_k &&
              req.has_seed);
    cr_assert_not(req.has_temperature);
    cr_assert_float_eq(req.top_p, 0.9, 1e-12);
    cr_assert_float_eq(req.presence_penalty, -1, 1e-12);
    cr_assert_eq(req.top_k, 40);
    cr_assert_eq(req.seed, 7);
}

Test(request, top_k_allows_minus_one_and_rejects_below)
{
    assert_ok(parse_chat(CHAT("\"top_k\":-1")));
    cr_assert_eq(req.top_k, -1);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"top_k\":0")));
    gen_request_free(&req);
    assert_400(parse_chat(CHAT("\"top_k\":-2")), "top_k", ">= 0");
    assert_400(parse_chat(CHAT("\"top_k\":1.5")), "top_k", "integer");
}

Test(request, seed_must_be_an_integer)
{
    assert_400(parse_chat(CHAT("\"seed\":\"7\"")), "seed", "must be an integer");
    assert_400(parse_chat(CHAT("\"seed\":0.5")), "seed", "must be an integer");
}

Test(request, n_other_than_one_is_400_not_supported_yet)
{
    assert_ok(parse_chat(CHAT("\"n\":1")));
    gen_request_free(&req);
    assert_400(parse_chat(CHAT("\"n\":2")), "n", "n > 1 is not supported yet");
    assert_400(parse_chat(CHAT("\"n\":0")), "n", "n > 1 is not supported yet");
    assert_400(parse_chat(CHAT("\"n\":\"2\"")), "n", "must be an integer");
}

/* ---- stop --------------------------------------------------------------------- */

Test(request, stop_string_or_array_of_up_to_four)
{
    assert_ok(parse_chat(CHAT("\"stop\":\"\\n\\n\"")));
    cr_assert_eq(req.n_stop, 1);
    cr_assert_str_eq(req.stop[0], "\n\n");
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"stop\":[\"a\",\"b\",\"c\",\"d\"]")));
    cr_assert_eq(req.n_stop, 4);
    cr_assert_str_eq(req.stop[3], "d");
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"stop\":[]")));
    cr_assert_eq(req.n_stop, 0);
}

Test(request, bad_stop_is_400)
{
    assert_400(parse_chat(CHAT("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]")), "stop", "at most 4");
    assert_400(parse_chat(CHAT("\"stop\":\"\"")), "stop", "empty");
    assert_400(parse_chat(CHAT("\"stop\":[\"a\",\"\"]")), "stop[1]", "empty");
    assert_400(parse_chat(CHAT("\"stop\":[\"a\",3]")), "stop[1]", "must be a string");
    assert_400(parse_chat(CHAT("\"stop\":3")), "stop", "string or an array");
}

/* ---- logit_bias ------------------------------------------------------------- */

Test(request, logit_bias_maps_token_ids_to_bias)
{
    assert_ok(parse_chat(CHAT("\"logit_bias\":{\"50256\":-100,\"7\":2.5}")));
    cr_assert_eq(req.n_logit_bias, 2);
    bool saw = false;
    for (size_t i = 0; i < req.n_logit_bias; i++)
        if (req.logit_bias[i].token == 50256) {
            cr_assert_float_eq(req.logit_bias[i].bias, -100.0f, 1e-6);
            saw = true;
        }
    cr_assert(saw);
}

Test(request, bad_logit_bias_is_400)
{
    assert_400(parse_chat(CHAT("\"logit_bias\":{\"abc\":1}")), "logit_bias", "token ids");
    assert_400(parse_chat(CHAT("\"logit_bias\":{\"-1\":1}")), "logit_bias", "token ids");
    assert_400(parse_chat(CHAT("\"logit_bias\":{\"12x\":1}")), "logit_bias", "token ids");
    assert_400(parse_chat(CHAT("\"logit_bias\":{\"5\":101}")), "logit_bias", "[-100, 100]");
    assert_400(parse_chat(CHAT("\"logit_bias\":{\"5\":\"1\"}")), "logit_bias", "must be a number");
    assert_400(parse_chat(CHAT("\"logit_bias\":[1]")), "logit_bias", "must be an object");
}

/* ---- logprobs and streaming -------------------------------------------------- */

Test(request, logprobs_with_top_logprobs)
{
    assert_ok(parse_chat(CHAT("\"logprobs\":true,\"top_logprobs\":20")));
    cr_assert(req.has_logprobs && req.logprobs);
    cr_assert(req.has_top_logprobs);
    cr_assert_eq(req.top_logprobs, 20);
}

Test(request, bad_logprobs_are_400)
{
    assert_400(parse_chat(CHAT("\"top_logprobs\":3")), "top_logprobs", "requires logprobs");
    assert_400(parse_chat(CHAT("\"logprobs\":false,\"top_logprobs\":3")), "top_logprobs",
               "requires logprobs");
    assert_400(parse_chat(CHAT("\"logprobs\":true,\"top_logprobs\":21")), "top_logprobs",
               "[0, 20]");
    assert_400(parse_chat(CHAT("\"logprobs\":true,\"top_logprobs\":-1")), "top_logprobs",
               "[0, 20]");
    assert_400(parse_chat(CHAT("\"logprobs\":1")), "logprobs", "must be a boolean");
}

Test(request, include_usage_false_is_recorded_as_set)
{
    assert_ok(parse_chat(CHAT("\"stream\":false,\"stream_options\":{\"include_usage\":false}")));
    cr_assert(req.has_stream);
    cr_assert_not(req.stream);
    cr_assert(req.has_include_usage);
    cr_assert_not(req.include_usage);
}

Test(request, bad_stream_fields_are_400)
{
    assert_400(parse_chat(CHAT("\"stream\":\"yes\"")), "stream", "must be a boolean");
    assert_400(parse_chat(CHAT("\"stream_options\":true")), "stream_options", "must be an object");
    assert_400(parse_chat(CHAT("\"stream_options\":{\"include_usage\":1}")),
               "stream_options.include_usage", "must be a boolean");
}

/* ---- tools -------------------------------------------------------------------- */

#define TOOL "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"

Test(request, tool_choice_strings)
{
    assert_ok(parse_chat(CHAT("\"tools\":[" TOOL "],\"tool_choice\":\"required\"")));
    cr_assert_eq(req.tool_choice, GEN_TOOL_CHOICE_REQUIRED);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"tools\":[" TOOL "],\"tool_choice\":\"auto\"")));
    cr_assert_eq(req.tool_choice, GEN_TOOL_CHOICE_AUTO);
    cr_assert(req.has_tool_choice);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"tool_choice\":\"none\"")));
    cr_assert_eq(req.tool_choice, GEN_TOOL_CHOICE_NONE);
}

Test(request, bad_tool_choice_is_400)
{
    assert_400(parse_chat(CHAT("\"tools\":[" TOOL "],\"tool_choice\":\"always\"")), "tool_choice",
               "\"required\"");
    assert_400(parse_chat(CHAT("\"tool_choice\":\"required\"")), "tool_choice", "non-empty tools");
    assert_400(
        parse_chat(CHAT("\"tools\":[" TOOL
                        "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}")),
        "tool_choice.function.name", "not in tools");
    assert_400(parse_chat(CHAT("\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"x\"}")),
               "tool_choice.type", "\"function\"");
    assert_400(parse_chat(CHAT("\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\"}")),
               "tool_choice.function.name", "required");
    assert_400(parse_chat(CHAT("\"tool_choice\":3")), "tool_choice", "string or an object");
}

Test(request, malformed_tools_name_the_field)
{
    assert_400(parse_chat(CHAT("\"tools\":{}")), "tools", "must be an array");
    assert_400(parse_chat(CHAT("\"tools\":[" TOOL ",{\"type\":\"web_search\"}]")), "tools[1].type",
               "\"function\"");
    assert_400(parse_chat(CHAT("\"tools\":[{\"type\":\"function\"}]")), "tools[0].function",
               "must be an object");
    assert_400(parse_chat(CHAT("\"tools\":[{\"type\":\"function\",\"function\":{}}]")),
               "tools[0].function.name", "required");
    assert_400(parse_chat(CHAT("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]")),
               "tools[0].function.name", "empty");
    assert_400(
        parse_chat(CHAT(
            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":1}}]")),
        "tools[0].function.description", "must be a string");
    assert_400(
        parse_chat(CHAT(
            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]")),
        "tools[0].function.parameters", "JSON Schema object");
    assert_400(parse_chat(CHAT("\"tools\":[3]")), "tools[0]", "must be an object");
}

/* ---- the rest ------------------------------------------------------------------ */

Test(request, chat_template_kwargs_kept_as_object)
{
    assert_ok(parse_chat(CHAT("\"chat_template_kwargs\":{\"enable_thinking\":false}")));
    cr_assert_not_null(req.chat_template_kwargs);
    json_object *v = NULL;
    cr_assert(json_object_object_get_ex(req.chat_template_kwargs, "enable_thinking", &v));
    cr_assert_not(json_object_get_boolean(v));
    gen_request_free(&req);
    assert_400(parse_chat(CHAT("\"chat_template_kwargs\":[1]")), "chat_template_kwargs",
               "must be an object");
}

Test(request, reasoning_effort_values)
{
    static const char *const ok[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    char body[160];
    for (int i = 0; i < 6; i++) {
        snprintf(body, sizeof body, CHAT("\"reasoning_effort\":\"%s\""), ok[i]);
        assert_ok(parse_chat(body));
        cr_assert(req.has_reasoning_effort);
        cr_assert_eq((int)req.reasoning_effort, i);
        gen_request_free(&req);
    }
    assert_400(parse_chat(CHAT("\"reasoning_effort\":\"max\"")), "reasoning_effort",
               "must be one of");
    assert_400(parse_chat(CHAT("\"reasoning_effort\":1")), "reasoning_effort", "must be a string");
}

Test(request, response_format_is_read_into_a_structured_spec)
{
    assert_ok(parse_chat(CHAT("\"response_format\":{\"type\":\"json_object\"}")));
    cr_assert_eq(req.structured.kind, STRUCTURED_JSON_OBJECT);
}

Test(request, structured_fields_follow_their_precedence)
{
    /* guided_grammar > json_schema > json_object > structured_outputs > guided_json >
     * guided_regex > guided_choice */
    assert_ok(parse_chat(CHAT("\"guided_choice\":[\"a\",\"b\"],\"guided_regex\":\"[0-9]+\"")));
    cr_assert_eq(req.structured.kind, STRUCTURED_REGEX);
    cr_assert_str_eq(req.structured.param, "guided_regex");
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"structured_outputs\":{\"type\":\"integer\"},"
                              "\"response_format\":{\"type\":\"json_object\"}")));
    cr_assert_eq(req.structured.kind, STRUCTURED_JSON_OBJECT);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"structured_outputs\":{\"type\":\"integer\"},"
                              "\"response_format\":{\"type\":\"text\"}")));
    cr_assert_eq(req.structured.kind, STRUCTURED_JSON_SCHEMA);
    cr_assert_str_eq(req.structured.text, "{\"type\":\"integer\"}");
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"guided_grammar\":\"root ::= \\\"x\\\"\",\"response_format\":"
                              "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                              "\"schema\":{\"type\":\"string\"}}}")));
    cr_assert_eq(req.structured.kind, STRUCTURED_GRAMMAR);
    gen_request_free(&req);
    assert_400(parse_chat(CHAT("\"guided_choice\":[]")), "guided_choice", "non-empty");
    assert_400(parse_chat(CHAT("\"response_format\":{\"type\":\"json_schema\"}")),
               "response_format.json_schema", "required");
    assert_400(parse_chat(CHAT("\"response_format\":{\"type\":\"yaml\"}")),
               "response_format.type", "must be one of");
}

Test(request, user_must_be_a_string_when_present)
{
    assert_ok(parse_chat(CHAT("\"user\":\"u-1\"")));
    gen_request_free(&req);
    assert_400(parse_chat(CHAT("\"user\":1")), "user", "must be a string");
}

Test(request, model_must_be_a_string)
{
    assert_400(parse_chat(CHAT("\"model\":1")), "model", "must be a string");
}

Test(request, failed_parse_leaves_request_empty)
{
    assert_400(parse_chat(CHAT("\"model\":\"m\",\"stop\":[\"a\"],\"n\":3")), "n", "not supported");
    cr_assert_null(req.messages);
    cr_assert_null(req.model);
    cr_assert_eq(req.n_stop, 0);
}

/* ---- error JSON ------------------------------------------------------------------ */

Test(request, error_json_has_openai_shape_with_param)
{
    char *json = NULL;
    assert_400(parse_chat(CHAT("\"temperature\":5")), "temperature", "[0, 2]");
    cr_assert_eq(api_error_to_json(&aerr, &json), 0);
    json_object *root = json_tokener_parse(json);
    cr_assert_not_null(root, "%s", json);
    json_object *e = NULL, *v = NULL;
    cr_assert(json_object_object_get_ex(root, "error", &e));
    cr_assert(json_object_object_get_ex(e, "message", &v));
    cr_assert_str_eq(json_object_get_string(v), aerr.message);
    cr_assert(json_object_object_get_ex(e, "type", &v));
    cr_assert_str_eq(json_object_get_string(v), "invalid_request_error");
    cr_assert(json_object_object_get_ex(e, "param", &v));
    cr_assert_str_eq(json_object_get_string(v), "temperature");
    cr_assert(json_object_object_get_ex(e, "code", &v));
    cr_assert_null(v);
    json_object_put(root);
    free(json);
}

Test(request, error_json_has_null_param_and_code_when_empty)
{
    char *json = NULL;
    struct api_error e = {.status = 400, .type = "invalid_request_error", .message = "bad \"x\""};
    cr_assert_eq(api_error_to_json(&e, &json), 0);
    cr_assert_str_eq(json,
                     "{\"error\":{\"message\":\"bad \\\"x\\\"\",\"type\":\"invalid_request_error\","
                     "\"param\":null,\"code\":null}}");
    free(json);
    struct api_error c = {
        .status = 429, .type = "resource_admission", .code = "queue_full", .message = "full"};
    cr_assert_eq(api_error_to_json(&c, &json), 0);
    cr_assert_not_null(strstr(json, "\"code\":\"queue_full\""));
    free(json);
}

/* ---- legacy completions fields ---------------------------------------------- */

Test(request, completion_logprobs_is_the_number_of_alternatives)
{
    assert_ok(parse_completion("{\"prompt\":\"hi\",\"logprobs\":3}"));
    cr_assert(req.has_logprobs && req.logprobs);
    cr_assert(req.has_top_logprobs);
    cr_assert_eq(req.top_logprobs, 3);
    gen_request_free(&req);
    assert_ok(parse_completion("{\"prompt\":\"hi\",\"logprobs\":0}"));
    cr_assert(req.logprobs);
    cr_assert_eq(req.top_logprobs, 0);
    gen_request_free(&req);
    assert_400(parse_completion("{\"prompt\":\"hi\",\"logprobs\":6}"), "logprobs", "[0, 5]");
    assert_400(parse_completion("{\"prompt\":\"hi\",\"logprobs\":true}"), "logprobs", "integer");
}

Test(request, completion_fields_that_would_change_the_reply_are_refused)
{
    assert_400(parse_completion("{\"prompt\":\"hi\",\"echo\":true}"), "echo", "not supported");
    assert_400(parse_completion("{\"prompt\":\"hi\",\"best_of\":3}"), "best_of", "must be 1");
    assert_400(parse_completion("{\"prompt\":\"hi\",\"suffix\":\"end\"}"), "suffix",
               "not supported");
    /* their neutral values are fine */
    assert_ok(parse_completion("{\"prompt\":\"hi\",\"echo\":false,\"best_of\":1,\"suffix\":\"\"}"));
    gen_request_free(&req);
}

/* ---- prefix-cache identity: cache_salt, session_id, prompt_cache_key -------- */

Test(request, cache_salt_and_session_id_are_taken_on_both_routes)
{
    assert_ok(parse_chat(CHAT("\"cache_salt\":\"team-a\",\"session_id\":\"conv-1\"")));
    cr_assert_str_eq(req.cache_salt, "team-a");
    cr_assert_str_eq(req.session_id, "conv-1");
    gen_request_free(&req);
    assert_ok(parse_completion("{\"prompt\":\"hi\",\"cache_salt\":\"s\",\"session_id\":\"c\"}"));
    cr_assert_str_eq(req.cache_salt, "s");
    cr_assert_str_eq(req.session_id, "c");
}

Test(request, absent_or_null_identity_fields_leave_them_null)
{
    assert_ok(parse_chat(CHAT("\"cache_salt\":null,\"prompt_cache_key\":null")));
    cr_assert_null(req.cache_salt);
    cr_assert_null(req.session_id);
}

Test(request, prompt_cache_key_is_the_session_when_session_id_is_absent)
{
    assert_ok(parse_chat(CHAT("\"prompt_cache_key\":\"pck\"")));
    cr_assert_str_eq(req.session_id, "pck");
}

Test(request, session_id_wins_over_prompt_cache_key)
{
    assert_ok(parse_chat(CHAT("\"prompt_cache_key\":\"pck\",\"session_id\":\"sid\"")));
    cr_assert_str_eq(req.session_id, "sid");
}

Test(request, identity_fields_of_256_bytes_are_taken)
{
    char body[1024], v[257];
    memset(v, 'k', 256);
    v[256] = '\0';
    snprintf(body, sizeof body, CHAT("\"cache_salt\":\"%s\",\"session_id\":\"%s\""), v, v);
    assert_ok(parse_chat(body));
    cr_assert_eq(strlen(req.cache_salt), 256);
    cr_assert_eq(strlen(req.session_id), 256);
}

/* Every identity field refuses a non-string, an empty string and 300 bytes,
 * naming itself. */
Test(request, malformed_identity_fields_are_400_naming_the_field)
{
    static const char *const fields[] = {"session_id", "prompt_cache_key", "cache_salt"};
    char big[301];
    memset(big, 'x', 300);
    big[300] = '\0';
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, CHAT("\"%s\":42"), fields[i]);
        assert_400(parse_chat(body), fields[i], "must be a string");
        gen_request_free(&req);
        snprintf(body, sizeof body, CHAT("\"%s\":[\"a\"]"), fields[i]);
        assert_400(parse_chat(body), fields[i], "must be a string");
        gen_request_free(&req);
        snprintf(body, sizeof body, CHAT("\"%s\":\"\""), fields[i]);
        assert_400(parse_chat(body), fields[i], "must not be an empty string");
        gen_request_free(&req);
        snprintf(body, sizeof body, "{\"prompt\":\"p\",\"%s\":\"%s\"}", fields[i], big);
        assert_400(parse_completion(body), fields[i], "at most 256 bytes, got 300");
        gen_request_free(&req);
    }
}

Test(request, a_bad_prompt_cache_key_is_refused_even_beside_a_good_session_id)
{
    assert_400(parse_chat(CHAT("\"session_id\":\"ok\",\"prompt_cache_key\":\"\"")),
               "prompt_cache_key", "must not be an empty string");
    cr_assert_null(req.session_id);
}

/* ---- mlx-lm's sampler extras ---------------------------------------------- */

static const struct range_case extra_ranges[] = {
    {"xtc_probability", {"0", "1", "0.5"}, {"-0.1", "1.01", "\"0.5\""}},
    {"xtc_threshold", {"0", "0.5", "0.1"}, {"-0.01", "0.51", "true"}},
    {"repetition_context_size", {"0", "20", "2147483647"}, {"-1", "2147483648", "2.5"}},
    {"presence_context_size", {"0", "1", "64"}, {"-5", "1e12", "\"20\""}},
    {"frequency_context_size", {"0", "1", "64"}, {"-1", "0.5", "[]"}},
};

Test(request, sampler_extras_accept_their_ranges_and_reject_others_naming_the_field)
{
    char body[256];
    for (size_t i = 0; i < sizeof extra_ranges / sizeof extra_ranges[0]; i++) {
        for (int k = 0; k < 3; k++) {
            snprintf(body, sizeof body, CHAT("\"%s\":%s"), extra_ranges[i].key,
                     extra_ranges[i].ok[k]);
            assert_ok(parse_chat(body));
            gen_request_free(&req);
            snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s}", extra_ranges[i].key,
                     extra_ranges[i].ok[k]);
            assert_ok(parse_completion(body));
            gen_request_free(&req);
            snprintf(body, sizeof body, CHAT("\"%s\":%s"), extra_ranges[i].key,
                     extra_ranges[i].bad[k]);
            assert_400(parse_chat(body), extra_ranges[i].key, extra_ranges[i].key);
            snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s}", extra_ranges[i].key,
                     extra_ranges[i].bad[k]);
            assert_400(parse_completion(body), extra_ranges[i].key, extra_ranges[i].key);
        }
    }
}

Test(request, sampler_extras_are_stored_with_set_flags)
{
    assert_ok(parse_chat(CHAT("\"xtc_probability\":0.25,\"xtc_threshold\":0.1,"
                              "\"repetition_context_size\":64,\"presence_context_size\":0,"
                              "\"frequency_context_size\":8")));
    cr_assert(req.has_xtc_probability && req.has_xtc_threshold);
    cr_assert(req.has_repetition_context_size && req.has_presence_context_size &&
              req.has_frequency_context_size);
    cr_assert_float_eq(req.xtc_probability, 0.25, 1e-12);
    cr_assert_float_eq(req.xtc_threshold, 0.1, 1e-12);
    cr_assert_eq(req.repetition_context_size, 64);
    cr_assert_eq(req.presence_context_size, 0);
    cr_assert_eq(req.frequency_context_size, 8);
    gen_request_free(&req);
    assert_ok(parse_chat(CHAT("\"top_p\":0.5")));
    cr_assert_not(req.has_xtc_probability || req.has_xtc_threshold ||
                  req.has_repetition_context_size || req.has_presence_context_size ||
                  req.has_frequency_context_size);
}
