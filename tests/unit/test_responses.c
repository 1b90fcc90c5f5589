/* tests/unit/test_responses.c — the Responses API: bodies into chat-shaped requests (every item
 * kind and field, every error naming its path), conversations joined with a stored context, and
 * output items, Response objects and stream events written from hand-made generation news. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"

static struct responses_request req;
static struct api_error aerr;

static void teardown(void)
{
    responses_request_free(&req);
}

TestSuite(responses, .fini = teardown);

static int parse(const char *body)
{
    responses_request_free(&req);
    return responses_parse(body, strlen(body), &req, &aerr);
}

#define assert_ok(rc) cr_assert_eq((rc), 0, "rc %d: [%s] %s", (rc), aerr.param, aerr.message)

/* A 400 naming param whose message contains fragment. */
#define assert_400(rc, want_param, fragment)                                              \
    do {                                                                                  \
        cr_assert_eq((rc), -INFERD_EINVAL, "rc %d", (rc));                                \
        cr_assert_eq(aerr.status, 400);                                                   \
        cr_assert_str_eq(aerr.param, (want_param), "param '%s', message: %s", aerr.param, \
                         aerr.message);                                                   \
        cr_assert_not_null(strstr(aerr.message, (fragment)), "message '%s' lacks '%s'",   \
                           aerr.message, (fragment));                                     \
    } while (0)

/* Member key of messages[i] as a string ("" when absent). */
static const char *msg_str(json_object *messages, size_t i, const char *key)
{
    json_object *v = NULL;
    json_object_object_get_ex(json_object_array_get_idx(messages, i), key, &v);
    return v ? json_object_get_string(v) : "";
}

static json_object *echo(const char *key)
{
    json_object *v = NULL;
    cr_assert(json_object_object_get_ex(req.echo, key, &v), "no %s in the echo", key);
    return v;
}

static void join(const char *context)
{
    assert_ok(responses_join(&req, context, context ? strlen(context) : 0, &aerr));
}

/* ---- input ---- */

Test(responses, a_string_input_is_one_user_message)
{
    assert_ok(parse("{\"model\":\"m\",\"input\":\"Say hi\"}"));
    cr_assert_eq(json_object_array_length(req.input), 1);
    cr_assert_str_eq(msg_str(req.input, 0, "role"), "user");
    cr_assert_str_eq(msg_str(req.input, 0, "content"), "Say hi");
    cr_assert_eq(req.gen.kind, GEN_REQUEST_CHAT);
    cr_assert_str_eq(req.gen.model, "m");
    cr_assert(req.store, "store defaults to true");
    cr_assert(!req.stream);
    cr_assert(!json_object_object_get_ex(req.echo, "user", NULL), "user is absent, never null");
    join(NULL);
    cr_assert_eq(json_object_array_length(req.gen.messages), 1);
}

Test(responses, message_items_of_every_role_with_string_or_part_content)
{
    assert_ok(parse("{\"input\":["
                    "{\"role\":\"system\",\"content\":\"s\"},"
                    "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"d\"}]},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
                    "{\"type\":\"message\",\"role\":\"assistant\",\"id\":\"msg_1\",\"status\":\"completed\","
                    "\"content\":[{\"type\":\"output_text\",\"text\":\"o\",\"annotations\":[]}]}]}"));
    json_object *m = req.input;
    cr_assert_eq(json_object_array_length(m), 4);
    cr_assert_str_eq(msg_str(m, 0, "role"), "system");
    cr_assert_str_eq(msg_str(m, 1, "role"), "system", "developer maps to system");
    cr_assert_str_eq(msg_str(m, 1, "content"), "d");
    cr_assert_str_eq(msg_str(m, 2, "content"), "ab", "parts join as chat joins them");
    cr_assert_str_eq(msg_str(m, 3, "role"), "assistant");
    cr_assert_str_eq(msg_str(m, 3, "content"), "o");
}

Test(responses, function_calls_join_the_assistant_turn_and_outputs_become_tool_messages)
{
    assert_ok(parse(
        "{\"input\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"think\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Let me look.\"}]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_a\",\"name\":\"get\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"status\":\"completed\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_b\",\"name\":\"get\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":\"12C\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_b\",\"output\":[{\"type\":\"input_text\",\"text\":\"9C\"}]}]}"));
    json_object *m = req.input;
    cr_assert_eq(json_object_array_length(m), 4, "%s", json_object_to_json_string(m));
    cr_assert_str_eq(msg_str(m, 1, "role"), "assistant");
    cr_assert_str_eq(msg_str(m, 1, "content"), "Let me look.");
    cr_assert_str_eq(msg_str(m, 1, "reasoning_content"), "think");
    json_object *calls = NULL;
    cr_assert(json_object_object_get_ex(json_object_array_get_idx(m, 1), "tool_calls", &calls));
    cr_assert_eq(json_object_array_length(calls), 2);
    json_object *c0 = json_object_array_get_idx(calls, 0), *fn = NULL, *v = NULL;
    json_object_object_get_ex(c0, "id", &v);
    cr_assert_str_eq(json_object_get_string(v), "call_a");
    json_object_object_get_ex(c0, "type", &v);
    cr_assert_str_eq(json_object_get_string(v), "function");
    json_object_object_get_ex(c0, "function", &fn);
    json_object_object_get_ex(fn, "name", &v);
    cr_assert_str_eq(json_object_get_string(v), "get");
    json_object_object_get_ex(fn, "arguments", &v);
    cr_assert_str_eq(json_object_get_string(v), "{\"city\":\"Paris\"}");
    cr_assert_str_eq(msg_str(m, 2, "role"), "tool");
    cr_assert_str_eq(msg_str(m, 2, "tool_call_id"), "call_a");
    cr_assert_str_eq(msg_str(m, 2, "content"), "12C");
    cr_assert_str_eq(msg_str(m, 3, "content"), "9C");
    cr_assert_eq(req.n_pending, 0);
}

Test(responses, a_reasoning_item_before_a_call_starts_a_new_assistant_turn)
{
    assert_ok(parse("{\"input\":[{\"role\":\"user\",\"content\":\"u\"},"
                    "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"raw\"}]},"
                    "{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"}]}"));
    cr_assert_eq(json_object_array_length(req.input), 2);
    cr_assert_str_eq(msg_str(req.input, 1, "role"), "assistant");
    cr_assert_str_eq(msg_str(req.input, 1, "content"), "");
    cr_assert_str_eq(msg_str(req.input, 1, "reasoning_content"), "raw",
                     "reasoning_text content stands in for an empty summary");
}

Test(responses, reasoning_not_followed_by_an_assistant_turn_is_dropped)
{
    assert_ok(parse("{\"input\":[{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"x\"}]},"
                    "{\"role\":\"user\",\"content\":\"u\"}]}"));
    cr_assert_eq(json_object_array_length(req.input), 1);
    cr_assert_str_eq(msg_str(req.input, 0, "reasoning_content"), "");
}

Test(responses, an_output_for_an_unseen_call_waits_for_the_previous_response)
{
    assert_ok(parse("{\"previous_response_id\":\"resp_1\",\"input\":[{\"type\":\"function_call_output\","
                    "\"call_id\":\"call_z\",\"output\":\"done\"}]}"));
    cr_assert_eq(req.n_pending, 1);
    cr_assert_eq(req.pending[0].index, 0);
    cr_assert_str_eq(req.pending[0].call_id, "call_z");
    join("{\"instructions\":null,\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
         "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_z\",\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}");
    cr_assert_eq(json_object_array_length(req.gen.messages), 3);
    cr_assert_str_eq(msg_str(req.gen.messages, 2, "role"), "tool");
}

Test(responses, an_output_whose_call_is_nowhere_is_400_naming_its_call_id)
{
    assert_ok(parse("{\"input\":[{\"role\":\"user\",\"content\":\"u\"},{\"type\":\"function_call_output\","
                    "\"call_id\":\"call_z\",\"output\":\"done\"}]}"));
    int rc = responses_join(&req, NULL, 0, &aerr);
    assert_400(rc, "input[1].call_id", "no function_call with call_id \"call_z\"");
}

/* ---- joining with a stored context ---- */

Test(responses, instructions_lead_as_one_system_message)
{
    assert_ok(parse("{\"instructions\":\"Be brief.\",\"input\":\"hi\"}"));
    join(NULL);
    cr_assert_eq(json_object_array_length(req.gen.messages), 2);
    cr_assert_str_eq(msg_str(req.gen.messages, 0, "role"), "system");
    cr_assert_str_eq(msg_str(req.gen.messages, 0, "content"), "Be brief.");
    cr_assert_eq(json_object_array_length(req.conversation), 1,
                 "the stored conversation leaves the instructions out");
    cr_assert_str_eq(json_object_get_string(echo("instructions")), "Be brief.");
}

Test(responses, instructions_merge_into_a_leading_system_message)
{
    assert_ok(parse("{\"instructions\":\"I\",\"input\":[{\"role\":\"developer\",\"content\":\"D\"},"
                    "{\"role\":\"user\",\"content\":\"u\"}]}"));
    join(NULL);
    cr_assert_eq(json_object_array_length(req.gen.messages), 2);
    cr_assert_str_eq(msg_str(req.gen.messages, 0, "content"), "I\n\nD");
}

Test(responses, a_chain_renders_the_previous_turns_first_and_keeps_their_instructions)
{
    assert_ok(parse("{\"previous_response_id\":\"resp_1\",\"input\":\"second\"}"));
    join("{\"instructions\":\"Be brief.\",\"messages\":[{\"role\":\"user\",\"content\":\"first\"},"
         "{\"role\":\"assistant\",\"content\":\"answer\"}]}");
    json_object *m = req.gen.messages;
    cr_assert_eq(json_object_array_length(m), 4);
    cr_assert_str_eq(msg_str(m, 0, "content"), "Be brief.");
    cr_assert_str_eq(msg_str(m, 1, "content"), "first");
    cr_assert_str_eq(msg_str(m, 2, "content"), "answer");
    cr_assert_str_eq(msg_str(m, 3, "content"), "second");
    cr_assert_str_eq(req.instructions, "Be brief.");
    cr_assert_str_eq(json_object_get_string(echo("instructions")), "Be brief.");
    cr_assert_str_eq(json_object_get_string(echo("previous_response_id")), "resp_1");
}

Test(responses, new_instructions_replace_the_previous_ones)
{
    assert_ok(parse("{\"previous_response_id\":\"resp_1\",\"instructions\":\"New.\",\"input\":\"x\"}"));
    join("{\"instructions\":\"Old.\",\"messages\":[]}");
    cr_assert_str_eq(msg_str(req.gen.messages, 0, "content"), "New.");
}

Test(responses, an_empty_conversation_is_400)
{
    assert_ok(parse("{\"previous_response_id\":\"resp_1\"}"));
    static const char ctx[] = "{\"instructions\":null,\"messages\":[]}";
    int rc = responses_join(&req, ctx, sizeof ctx - 1, &aerr);
    assert_400(rc, "input", "conversation is empty");
}

/* ---- fields ---- */

Test(responses, sampling_limits_and_flags_are_read_and_echoed)
{
    assert_ok(parse("{\"input\":\"x\",\"max_output_tokens\":32,\"temperature\":0.5,\"top_p\":0.9,"
                    "\"store\":false,\"stream\":true,\"parallel_tool_calls\":false,\"user\":\"u1\","
                    "\"truncation\":\"disabled\",\"metadata\":{\"k\":\"v\"},\"top_k\":5,\"seed\":7,"
                    "\"prompt_cache_key\":\"sess\",\"include\":[\"reasoning.encrypted_content\"],"
                    "\"service_tier\":\"auto\",\"top_logprobs\":0,\"max_tool_calls\":3}"));
    cr_assert(req.gen.has_max_tokens);
    cr_assert_eq(req.gen.max_tokens, 32);
    cr_assert(req.gen.has_temperature);
    cr_assert_float_eq(req.gen.temperature, 0.5, 1e-9);
    cr_assert_float_eq(req.gen.top_p, 0.9, 1e-9);
    cr_assert_eq(req.gen.top_k, 5);
    cr_assert_eq(req.gen.seed, 7);
    cr_assert_str_eq(req.gen.session_id, "sess");
    cr_assert(!req.store);
    cr_assert(req.stream);
    cr_assert_eq(json_object_get_int(echo("max_output_tokens")), 32);
    cr_assert(!json_object_get_boolean(echo("parallel_tool_calls")));
    cr_assert(!json_object_get_boolean(echo("store")));
    cr_assert_str_eq(json_object_get_string(echo("user")), "u1");
    cr_assert_str_eq(json_object_get_string(echo("truncation")), "disabled");
    cr_assert_str_eq(json_object_to_json_string_ext(echo("metadata"), JSON_C_TO_STRING_PLAIN),
                     "{\"k\":\"v\"}");
    cr_assert_float_eq(json_object_get_double(echo("temperature")), 0.5, 1e-9);
    cr_assert_eq(json_object_get_int(echo("max_tool_calls")), 3);
}

Test(responses, max_tokens_is_taken_when_max_output_tokens_is_absent)
{
    assert_ok(parse("{\"input\":\"x\",\"max_tokens\":9}"));
    cr_assert_eq(req.gen.max_tokens, 9);
    assert_ok(parse("{\"input\":\"x\",\"max_tokens\":9,\"max_output_tokens\":4}"));
    cr_assert_eq(req.gen.max_tokens, 4);
}

Test(responses, function_tools_become_chat_tools_and_hosted_tools_are_dropped)
{
    assert_ok(parse("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"get\",\"description\":\"d\","
                    "\"parameters\":{\"type\":\"object\"},\"strict\":true},{\"type\":\"web_search\"}],"
                    "\"tool_choice\":{\"type\":\"function\",\"name\":\"get\"}}"));
    cr_assert_not_null(req.gen.tools);
    cr_assert_eq(json_object_array_length(req.gen.tools), 1);
    json_object *t = json_object_array_get_idx(req.gen.tools, 0), *fn = NULL, *v = NULL;
    json_object_object_get_ex(t, "type", &v);
    cr_assert_str_eq(json_object_get_string(v), "function");
    cr_assert(json_object_object_get_ex(t, "function", &fn));
    json_object_object_get_ex(fn, "name", &v);
    cr_assert_str_eq(json_object_get_string(v), "get");
    json_object_object_get_ex(fn, "description", &v);
    cr_assert_str_eq(json_object_get_string(v), "d");
    cr_assert(json_object_object_get_ex(fn, "parameters", &v));
    cr_assert_eq(req.gen.tool_choice, GEN_TOOL_CHOICE_FUNCTION);
    cr_assert_str_eq(req.gen.tool_choice_name, "get");
    json_object *tools = echo("tools");
    cr_assert_eq(json_object_array_length(tools), 1);
    json_object_object_get_ex(json_object_array_get_idx(tools, 0), "strict", &v);
    cr_assert(json_object_get_boolean(v));
    json_object_object_get_ex(echo("tool_choice"), "name", &v);
    cr_assert_str_eq(json_object_get_string(v), "get");
}

Test(responses, tool_choice_strings)
{
    assert_ok(parse("{\"input\":\"x\"}"));
    cr_assert(!req.gen.has_tool_choice);
    cr_assert_str_eq(json_object_get_string(echo("tool_choice")), "auto");
    assert_ok(parse("{\"input\":\"x\",\"tool_choice\":\"none\"}"));
    cr_assert_eq(req.gen.tool_choice, GEN_TOOL_CHOICE_NONE);
    assert_ok(parse("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"required\"}"));
    cr_assert_eq(req.gen.tool_choice, GEN_TOOL_CHOICE_REQUIRED);
}

Test(responses, reasoning_effort_takes_every_chat_value_including_xhigh)
{
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    char body[160];
    for (int i = 0; i < 6; i++) {
        snprintf(body, sizeof body, "{\"input\":\"x\",\"reasoning\":{\"effort\":\"%s\",\"summary\":\"auto\"}}",
                 efforts[i]);
        assert_ok(parse(body));
        cr_assert(req.gen.has_reasoning_effort);
        cr_assert_eq((int)req.gen.reasoning_effort, i);
        json_object *v = NULL;
        json_object_object_get_ex(echo("reasoning"), "effort", &v);
        cr_assert_str_eq(json_object_get_string(v), efforts[i]);
    }
    assert_400(parse("{\"input\":\"x\",\"reasoning\":{\"effort\":\"max\"}}"), "reasoning.effort",
               "must be one of");
}

Test(responses, text_format_text_is_accepted)
{
    assert_ok(parse("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"text\"},\"verbosity\":\"low\"}}"));
    json_object *fmt = NULL, *v = NULL;
    json_object_object_get_ex(echo("text"), "format", &fmt);
    json_object_object_get_ex(fmt, "type", &v);
    cr_assert_str_eq(json_object_get_string(v), "text");
    json_object_object_get_ex(echo("text"), "verbosity", &v);
    cr_assert_str_eq(json_object_get_string(v), "low");
}

Test(responses, text_format_json_schema_and_json_object_ask_for_structured_output)
{
    assert_ok(parse("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                    "\"schema\":{\"type\":\"object\"}}}}"));
    cr_assert_eq(req.gen.structured.kind, STRUCTURED_JSON_SCHEMA);
    responses_request_free(&req);
    assert_ok(parse("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}}}"));
    cr_assert_eq(req.gen.structured.kind, STRUCTURED_JSON_OBJECT);
    assert_400(parse("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}"),
               "text.format.type", "must be one of");
}

/* ---- bad input: every error names its path ---- */

Test(responses, malformed_bodies_are_400)
{
    assert_400(parse("{\"input\":"), "", "could not parse the JSON body");
    assert_400(parse("[1]"), "", "must be a JSON object");
    assert_400(parse(""), "", "empty");
}

Test(responses, input_errors_name_the_item)
{
    assert_400(parse("{}"), "input", "is required");
    assert_400(parse("{\"input\":[]}"), "input", "at least one item");
    assert_400(parse("{\"input\":5}"), "input", "must be a string or an array");
    assert_400(parse("{\"input\":[\"hi\"]}"), "input[0]", "object");
    assert_400(parse("{\"input\":[{\"content\":\"hi\"}]}"), "input[0].role", "");
    assert_400(parse("{\"input\":[{\"role\":\"robot\",\"content\":\"hi\"}]}"), "input[0].role",
               "must be one of");
    assert_400(parse("{\"input\":[{\"role\":\"user\"}]}"), "input[0].content", "is required");
    assert_400(parse("{\"input\":[{\"role\":\"user\",\"content\":7}]}"), "input[0].content",
               "must be a string or an array");
    assert_400(parse("{\"input\":[{\"type\":\"web_search_call\",\"id\":\"x\"}]}"), "input[0].type",
               "not a supported input item type");
    assert_400(parse("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}"), "input[0].type",
               "not a supported input item type");
    assert_400(parse("{\"input\":[{\"type\":3}]}"), "input[0].type", "");
}

Test(responses, an_image_part_is_400_as_unsupported_by_this_model)
{
    assert_400(parse("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                     "{\"type\":\"input_image\",\"image_url\":\"https://x/y.png\"}]}]}"),
               "input[0].content[1].type", "not supported by this model");
    assert_400(parse("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\",\"file_id\":\"f\"}]}]}"),
               "input[0].content[0].type", "not supported by this model");
    assert_400(parse("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}"),
               "input[0].content[0].type", "not a supported content part type");
    assert_400(parse("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}"),
               "input[0].content[0].text", "");
}

Test(responses, call_and_output_item_errors_name_their_fields)
{
    assert_400(parse("{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}"),
               "input[0].call_id", "");
    assert_400(parse("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"\",\"arguments\":\"{}\"}]}"),
               "input[0].name", "must not be empty");
    assert_400(parse("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}}]}"),
               "input[0].arguments", "");
    assert_400(parse("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}"),
               "input[0].output", "is required");
    assert_400(parse("{\"input\":[{\"type\":\"reasoning\",\"summary\":[{\"type\":\"text\",\"text\":\"x\"}]}]}"),
               "input[0].summary[0].type", "must be \"summary_text\"");
    assert_400(parse("{\"input\":[{\"type\":\"reasoning\"}]}"), "input[0].summary", "");
}

Test(responses, field_type_errors_name_the_field)
{
    assert_400(parse("{\"input\":\"x\",\"max_output_tokens\":0}"), "max_output_tokens", "");
    assert_400(parse("{\"input\":\"x\",\"max_output_tokens\":\"9\"}"), "max_output_tokens", "");
    assert_400(parse("{\"input\":\"x\",\"temperature\":3}"), "temperature", "");
    assert_400(parse("{\"input\":\"x\",\"top_p\":0}"), "top_p", "");
    assert_400(parse("{\"input\":\"x\",\"store\":\"yes\"}"), "store", "");
    assert_400(parse("{\"input\":\"x\",\"stream\":1}"), "stream", "");
    assert_400(parse("{\"input\":\"x\",\"instructions\":5}"), "instructions", "");
    assert_400(parse("{\"input\":\"x\",\"previous_response_id\":\"\"}"), "previous_response_id",
               "must be 1 to");
    assert_400(parse("{\"input\":\"x\",\"metadata\":{\"k\":1}}"), "metadata.k", "");
    assert_400(parse("{\"input\":\"x\",\"metadata\":[]}"), "metadata", "");
    assert_400(parse("{\"input\":\"x\",\"truncation\":\"sometimes\"}"), "truncation", "must be one of");
    assert_400(parse("{\"input\":\"x\",\"reasoning\":\"high\"}"), "reasoning", "");
    assert_400(parse("{\"input\":\"x\",\"text\":{\"format\":\"text\"}}"), "text.format", "");
    assert_400(parse("{\"input\":\"x\",\"include\":[1]}"), "include[0]", "");
}

Test(responses, tool_errors_name_the_tool)
{
    assert_400(parse("{\"input\":\"x\",\"tools\":{}}"), "tools", "");
    assert_400(parse("{\"input\":\"x\",\"tools\":[{\"name\":\"f\"}]}"), "tools[0].type", "");
    assert_400(parse("{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}"), "tools[0].name", "");
    assert_400(parse("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":[]}]}"),
               "tools[0].parameters", "JSON Schema object");
    assert_400(parse("{\"input\":\"x\",\"tool_choice\":\"always\"}"), "tool_choice", "must be");
    assert_400(parse("{\"input\":\"x\",\"tool_choice\":\"required\"}"), "tool_choice",
               "needs a function tool");
    assert_400(parse("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
                     "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}"),
               "tool_choice.name", "not in tools");
    assert_400(parse("{\"input\":\"x\",\"tool_choice\":{\"type\":\"web_search\"}}"),
               "tool_choice.type", "not supported");
}

Test(responses, fields_this_server_cannot_honour_are_refused)
{
    assert_400(parse("{\"input\":\"x\",\"background\":true}"), "background", "not supported");
    assert_400(parse("{\"input\":\"x\",\"conversation\":\"conv_1\"}"), "conversation",
               "previous_response_id");
    assert_400(parse("{\"input\":\"x\",\"prompt\":{\"id\":\"p\"}}"), "prompt", "not supported");
    assert_400(parse("{\"input\":\"x\",\"top_logprobs\":3}"), "top_logprobs", "not supported");
    assert_ok(parse("{\"input\":\"x\",\"background\":false,\"conversation\":null}"));
}

/* ======================================================================
 * Output
 * ====================================================================== */

static struct responses_writer *writer(const char *body)
{
    assert_ok(parse(body));
    join(NULL);
    struct responses_writer_config cfg = {.id = "resp_test", .model = "tiny", .created_at = 1000,
                                          .temperature = 0.7, .top_p = 1};
    struct responses_writer *w = NULL;
    cr_assert_eq(responses_writer_create(&req, &cfg, &w), 0);
    return w;
}

static struct generation_news text_news(const char *reasoning, const char *content,
                                        enum gen_finish finish)
{
    struct generation_news n;
    memset(&n, 0, sizeof n);
    n.split = true;
    n.text.reasoning = (char *)reasoning;
    n.text.reasoning_len = strlen(reasoning);
    n.text.content = (char *)content;
    n.text.content_len = strlen(content);
    n.out.finish = finish;
    n.out.n_prompt = 20;
    n.out.n_cached = 16;
    n.out.n_generated = 9;
    return n;
}

static json_object *get(json_object *o, const char *path)
{
    char key[64];
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        if (key[0] >= '0' && key[0] <= '9')
            o = json_object_array_get_idx(o, (size_t)atoi(key));
        else if (!json_object_object_get_ex(o, key, &o))
            o = NULL;
        path += n + (dot ? 1 : 0);
    }
    return o;
}

static const char *gets(json_object *o, const char *path)
{
    json_object *v = get(o, path);
    cr_assert_not_null(v, "no %s in %s", path, json_object_to_json_string(o));
    return json_object_get_string(v);
}

Test(responses, a_whole_answer_becomes_reasoning_message_and_function_call_items)
{
    struct responses_writer *w =
        writer("{\"input\":\"x\",\"metadata\":{\"k\":\"v\"},\"tools\":[{\"type\":\"function\",\"name\":\"get\"}]}");
    struct generation_news n = text_news("let me think", "Calling.", GEN_FINISH_STOP);
    struct generation_tool_delta call = {.index = 0, .id = "call_1", .name = "get",
                                         .arguments = "{\"city\":\"Paris\"}"};
    n.tools = &call;
    n.n_tools = 1;
    n.tool_calls = true;
    responses_writer_feed(w, &n, NULL);
    cr_assert(responses_writer_finished(w));
    cr_assert(responses_writer_succeeded(w));
    json_object *r = responses_writer_response(w);
    cr_assert_str_eq(gets(r, "id"), "resp_test");
    cr_assert_str_eq(gets(r, "object"), "response");
    cr_assert_eq(json_object_get_int64(get(r, "created_at")), 1000);
    cr_assert_str_eq(gets(r, "status"), "completed");
    cr_assert_null(get(r, "error"));
    cr_assert_null(get(r, "incomplete_details"));
    cr_assert_str_eq(gets(r, "model"), "tiny");
    cr_assert_eq(json_object_array_length(get(r, "output")), 3);
    cr_assert_str_eq(gets(r, "output.0.type"), "reasoning");
    cr_assert_eq(strncmp(gets(r, "output.0.id"), "rs_", 3), 0);
    cr_assert_str_eq(gets(r, "output.0.summary.0.type"), "summary_text");
    cr_assert_str_eq(gets(r, "output.0.summary.0.text"), "let me think");
    cr_assert_str_eq(gets(r, "output.1.type"), "message");
    cr_assert_eq(strncmp(gets(r, "output.1.id"), "msg_", 4), 0);
    cr_assert_str_eq(gets(r, "output.1.role"), "assistant");
    cr_assert_str_eq(gets(r, "output.1.status"), "completed");
    cr_assert_str_eq(gets(r, "output.1.content.0.type"), "output_text");
    cr_assert_str_eq(gets(r, "output.1.content.0.text"), "Calling.");
    cr_assert_eq(json_object_array_length(get(r, "output.1.content.0.annotations")), 0);
    cr_assert_str_eq(gets(r, "output.2.type"), "function_call");
    cr_assert_eq(strncmp(gets(r, "output.2.id"), "fc_", 3), 0);
    cr_assert_str_eq(gets(r, "output.2.call_id"), "call_1");
    cr_assert_str_eq(gets(r, "output.2.name"), "get");
    cr_assert_str_eq(gets(r, "output.2.arguments"), "{\"city\":\"Paris\"}");
    cr_assert_str_eq(gets(r, "output.2.status"), "completed");
    cr_assert_eq(json_object_get_int(get(r, "usage.input_tokens")), 20);
    cr_assert_eq(json_object_get_int(get(r, "usage.input_tokens_details.cached_tokens")), 16);
    cr_assert_eq(json_object_get_int(get(r, "usage.output_tokens")), 9);
    cr_assert_eq(json_object_get_int(get(r, "usage.total_tokens")), 29);
    int reasoning = json_object_get_int(get(r, "usage.output_tokens_details.reasoning_tokens"));
    cr_assert(reasoning >= 2 && reasoning <= 9, "reasoning_tokens %d", reasoning);
    cr_assert_str_eq(gets(r, "metadata.k"), "v");
    cr_assert_float_eq(json_object_get_double(get(r, "temperature")), 0.7, 1e-9);
    cr_assert_str_eq(gets(r, "tool_choice"), "auto");
    cr_assert_eq(json_object_array_length(get(r, "tools")), 1);
    cr_assert(json_object_get_boolean(get(r, "store")));
    cr_assert(json_object_get_boolean(get(r, "parallel_tool_calls")));
    cr_assert_str_eq(gets(r, "text.format.type"), "text");
    cr_assert(json_object_object_get_ex(r, "previous_response_id", NULL));
    cr_assert(json_object_object_get_ex(r, "instructions", NULL));
    cr_assert(json_object_object_get_ex(r, "max_output_tokens", NULL));
    cr_assert(json_object_object_get_ex(r, "reasoning", NULL));
    cr_assert(json_object_object_get_ex(r, "conversation", NULL));
    cr_assert_str_eq(gets(r, "service_tier"), "default");
    cr_assert_str_eq(gets(r, "truncation"), "disabled");
    cr_assert(!json_object_get_boolean(get(r, "background")));
    json_object_put(r);
    responses_writer_free(w);
}

Test(responses, a_length_cut_is_incomplete_with_max_output_tokens)
{
    struct responses_writer *w = writer("{\"input\":\"x\",\"max_output_tokens\":9}");
    struct generation_news n = text_news("", "cut sho", GEN_FINISH_LENGTH);
    responses_writer_feed(w, &n, NULL);
    json_object *r = responses_writer_response(w);
    cr_assert_str_eq(gets(r, "status"), "incomplete");
    cr_assert_str_eq(gets(r, "incomplete_details.reason"), "max_output_tokens");
    cr_assert_str_eq(gets(r, "output.0.status"), "incomplete");
    cr_assert_eq(json_object_get_int(get(r, "max_output_tokens")), 9);
    cr_assert_eq(json_object_get_int(get(r, "usage.output_tokens_details.reasoning_tokens")), 0);
    cr_assert(responses_writer_succeeded(w), "incomplete responses are stored too");
    json_object_put(r);
    responses_writer_free(w);
}

Test(responses, an_empty_answer_is_one_empty_message)
{
    struct responses_writer *w = writer("{\"input\":\"x\"}");
    struct generation_news n = text_news("", "", GEN_FINISH_STOP);
    responses_writer_feed(w, &n, NULL);
    json_object *r = responses_writer_response(w);
    cr_assert_eq(json_object_array_length(get(r, "output")), 1);
    cr_assert_str_eq(gets(r, "output.0.type"), "message");
    cr_assert_str_eq(gets(r, "output.0.content.0.text"), "");
    json_object_put(r);
    responses_writer_free(w);
}

Test(responses, an_unsplit_answer_is_all_message_text)
{
    struct responses_writer *w = writer("{\"input\":\"x\"}");
    struct generation_news n;
    memset(&n, 0, sizeof n);
    n.out.text = (char *)"plain";
    n.out.text_len = 5;
    n.out.finish = GEN_FINISH_STOP;
    responses_writer_feed(w, &n, NULL);
    json_object *r = responses_writer_response(w);
    cr_assert_str_eq(gets(r, "output.0.content.0.text"), "plain");
    json_object_put(r);
    responses_writer_free(w);
}

/* The events in out: each `event: T` line matches data's type, and sequence numbers count from
 * 0. Returns a JSON array of the data objects (the caller's). */
static json_object *events_of(const struct strbuf *out)
{
    json_object *events = json_object_new_array();
    const char *p = out->data ? out->data : "";
    int64_t want_seq = 0;
    while (*p) {
        cr_assert_eq(strncmp(p, "event: ", 7), 0, "not an event line: %.60s", p);
        const char *nl = strchr(p, '\n');
        char type[96];
        snprintf(type, sizeof type, "%.*s", (int)(nl - p - 7), p + 7);
        p = nl + 1;
        cr_assert_eq(strncmp(p, "data: ", 6), 0);
        const char *end = strstr(p, "\n\n");
        cr_assert_not_null(end);
        char *data = strndup(p + 6, (size_t)(end - p - 6));
        json_object *d = json_tokener_parse(data);
        free(data);
        cr_assert_not_null(d, "data is not JSON: %.80s", p);
        cr_assert_str_eq(gets(d, "type"), type);
        cr_assert_eq(json_object_get_int64(get(d, "sequence_number")), want_seq, "%s", type);
        want_seq++;
        json_object_array_add(events, d);
        p = end + 2;
    }
    return events;
}

static void assert_types(json_object *events, const char *const *want, size_t n)
{
    size_t have = json_object_array_length(events);
    for (size_t i = 0; i < n && i < have; i++)
        cr_assert_str_eq(gets(json_object_array_get_idx(events, i), "type"), want[i],
                         "event %zu", i);
    cr_assert_eq(have, n, "%zu events, want %zu", have, n);
}

Test(responses, streamed_news_make_the_event_chain_the_sdk_assembles)
{
    struct responses_writer *w =
        writer("{\"input\":\"x\",\"stream\":true,\"tools\":[{\"type\":\"function\",\"name\":\"get\"}]}");
    struct strbuf out = {0};
    responses_writer_start(w, &out);
    struct generation_news a = text_news("hm", "", GEN_RUNNING);
    responses_writer_feed(w, &a, &out);
    struct generation_news b = text_news("m", "Hel", GEN_RUNNING);
    responses_writer_feed(w, &b, &out);
    struct generation_news c = text_news("", "lo", GEN_RUNNING);
    struct generation_tool_delta first = {.index = 0, .id = "call_9", .name = "get",
                                          .arguments = "{\"ci"};
    c.tools = &first;
    c.n_tools = 1;
    responses_writer_feed(w, &c, &out);
    struct generation_news d = text_news("", "", GEN_FINISH_STOP);
    struct generation_tool_delta rest = {.index = 0, .arguments = "ty\":\"Oslo\"}"};
    d.tools = &rest;
    d.n_tools = 1;
    d.tool_calls = true;
    responses_writer_feed(w, &d, &out);
    cr_assert(!out.failed);

    json_object *events = events_of(&out);
    static const char *const want[] = {
        "response.created",
        "response.in_progress",
        "response.output_item.added",            /* reasoning */
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", /* hm */
        "response.reasoning_summary_text.delta", /* m */
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",            /* message */
        "response.content_part.added",
        "response.output_text.delta",            /* Hel */
        "response.output_text.delta",            /* lo */
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",            /* function_call */
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    };
    assert_types(events, want, sizeof want / sizeof want[0]);
    json_object *ev = json_object_array_get_idx(events, 0);
    cr_assert_str_eq(gets(ev, "response.status"), "in_progress");
    cr_assert_eq(json_object_array_length(get(ev, "response.output")), 0);
    cr_assert_null(get(ev, "response.usage"));
    ev = json_object_array_get_idx(events, 2);
    cr_assert_eq(json_object_get_int(get(ev, "output_index")), 0);
    cr_assert_str_eq(gets(ev, "item.type"), "reasoning");
    cr_assert_eq(json_object_array_length(get(ev, "item.summary")), 0);
    ev = json_object_array_get_idx(events, 3);
    cr_assert_eq(json_object_get_int(get(ev, "summary_index")), 0);
    cr_assert_str_eq(gets(ev, "part.type"), "summary_text");
    ev = json_object_array_get_idx(events, 6);
    cr_assert_str_eq(gets(ev, "text"), "hmm");
    ev = json_object_array_get_idx(events, 10);
    cr_assert_eq(json_object_get_int(get(ev, "output_index")), 1);
    cr_assert_eq(json_object_get_int(get(ev, "content_index")), 0);
    cr_assert_str_eq(gets(ev, "part.type"), "output_text");
    cr_assert_str_eq(gets(ev, "part.text"), "");
    ev = json_object_array_get_idx(events, 11);
    cr_assert_str_eq(gets(ev, "delta"), "Hel");
    cr_assert_str_eq(gets(ev, "item_id"), gets(json_object_array_get_idx(events, 9), "item.id"));
    ev = json_object_array_get_idx(events, 13);
    cr_assert_str_eq(gets(ev, "text"), "Hello");
    ev = json_object_array_get_idx(events, 16);
    cr_assert_str_eq(gets(ev, "item.type"), "function_call");
    cr_assert_str_eq(gets(ev, "item.call_id"), "call_9");
    cr_assert_str_eq(gets(ev, "item.name"), "get");
    cr_assert_str_eq(gets(ev, "item.arguments"), "");
    cr_assert_eq(json_object_get_int(get(ev, "output_index")), 2);
    cr_assert_str_eq(gets(json_object_array_get_idx(events, 17), "delta"), "{\"ci");
    cr_assert_str_eq(gets(json_object_array_get_idx(events, 18), "delta"), "ty\":\"Oslo\"}");
    ev = json_object_array_get_idx(events, 19);
    cr_assert_str_eq(gets(ev, "arguments"), "{\"city\":\"Oslo\"}");
    cr_assert_str_eq(gets(ev, "name"), "get");
    ev = json_object_array_get_idx(events, 20);
    cr_assert_str_eq(gets(ev, "item.status"), "completed");
    cr_assert_str_eq(gets(ev, "item.arguments"), "{\"city\":\"Oslo\"}");
    ev = json_object_array_get_idx(events, 21);
    cr_assert_str_eq(gets(ev, "response.status"), "completed");
    cr_assert_eq(json_object_array_length(get(ev, "response.output")), 3);
    cr_assert_str_eq(gets(ev, "response.output.1.content.0.text"), "Hello");
    cr_assert_eq(json_object_get_int(get(ev, "response.usage.output_tokens")), 9);

    /* The stored context: the conversation and this answer as one assistant turn. */
    size_t len = 0;
    char *ctx = responses_writer_context(w, &req, &len);
    cr_assert_not_null(ctx);
    json_object *c2 = json_tokener_parse(ctx);
    cr_assert_null(get(c2, "instructions"));
    cr_assert_str_eq(gets(c2, "messages.0.content"), "x");
    cr_assert_str_eq(gets(c2, "messages.1.role"), "assistant");
    cr_assert_str_eq(gets(c2, "messages.1.content"), "Hello");
    cr_assert_str_eq(gets(c2, "messages.1.reasoning_content"), "hmm");
    cr_assert_str_eq(gets(c2, "messages.1.tool_calls.0.id"), "call_9");
    cr_assert_str_eq(gets(c2, "messages.1.tool_calls.0.function.arguments"),
                     "{\"city\":\"Oslo\"}");
    json_object_put(c2);
    free(ctx);
    json_object_put(events);
    strbuf_free(&out);
    responses_writer_free(w);
}

Test(responses, parallel_calls_stream_as_items_of_their_own)
{
    struct responses_writer *w = writer("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}");
    struct strbuf out = {0};
    struct generation_news n = text_news("", "", GEN_FINISH_STOP);
    struct generation_tool_delta calls[] = {
        {.index = 0, .id = "call_a", .name = "f", .arguments = "{}"},
        {.index = 1, .id = "call_b", .name = "f", .arguments = "{\"x\":1}"},
    };
    n.tools = calls;
    n.n_tools = 2;
    responses_writer_feed(w, &n, &out);
    json_object *r = responses_writer_response(w);
    cr_assert_eq(json_object_array_length(get(r, "output")), 2, "no empty message beside calls");
    cr_assert_str_eq(gets(r, "output.0.call_id"), "call_a");
    cr_assert_str_eq(gets(r, "output.1.call_id"), "call_b");
    cr_assert_str_eq(gets(r, "output.1.arguments"), "{\"x\":1}");
    json_object_put(r);
    strbuf_free(&out);
    responses_writer_free(w);
}

Test(responses, a_failure_mid_stream_is_an_error_event_then_response_failed)
{
    struct responses_writer *w = writer("{\"input\":\"x\",\"stream\":true}");
    struct strbuf out = {0};
    responses_writer_start(w, &out);
    struct generation_news a = text_news("", "par", GEN_RUNNING);
    responses_writer_feed(w, &a, &out);
    struct generation_news b = text_news("", "", GEN_FINISH_ERROR);
    snprintf(b.out.error, sizeof b.out.error, "the device fell over");
    responses_writer_feed(w, &b, &out);
    json_object *events = events_of(&out);
    size_t n = json_object_array_length(events);
    json_object *err = json_object_array_get_idx(events, n - 2);
    cr_assert_str_eq(gets(err, "type"), "error");
    cr_assert_str_eq(gets(err, "message"), "the device fell over");
    cr_assert_str_eq(gets(err, "code"), "server_error");
    json_object *failed = json_object_array_get_idx(events, n - 1);
    cr_assert_str_eq(gets(failed, "type"), "response.failed");
    cr_assert_str_eq(gets(failed, "response.status"), "failed");
    cr_assert_str_eq(gets(failed, "response.error.code"), "server_error");
    cr_assert_str_eq(gets(failed, "response.error.message"), "the device fell over");
    cr_assert(!responses_writer_succeeded(w), "a failed response is not stored");
    json_object_put(events);
    strbuf_free(&out);
    responses_writer_free(w);
}

Test(responses, the_split_tail_at_the_finish_reaches_the_message)
{
    struct responses_writer *w = writer("{\"input\":\"x\"}");
    struct generation_news n = text_news("", "ab", GEN_FINISH_STOP);
    n.tail.content = (char *)"cd";
    n.tail.content_len = 2;
    n.tail.reasoning = (char *)"";
    responses_writer_feed(w, &n, NULL);
    json_object *r = responses_writer_response(w);
    cr_assert_str_eq(gets(r, "output.0.content.0.text"), "abcd");
    json_object_put(r);
    responses_writer_free(w);
}
