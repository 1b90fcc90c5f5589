/* tests/unit/test_anthropic.c — the Anthropic Messages wire format: every request field
 * translated into the neutral request, every refusal naming its path, the retention cut of
 * cache_control breakpoints, the message object and event stream made from hand-made
 * generation output (tool_use included), and the Anthropic error body. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/anthropic.h"
#include "api/prompt.h"

#define HOUSE INFERD_SOURCE_DIR "/models/house"

static struct anthropic_request ar;
static struct api_error e;

static void parse_ok(const char *body)
{
    int rc = anthropic_request_parse(body, strlen(body), ANTHROPIC_MESSAGES, &ar, &e);
    cr_assert_eq(rc, 0, "%s", e.message);
}

/* Parses body, which must be refused with 400 and a message starting with path. */
static void parse_refused(const char *body, const char *path, const char *words)
{
    int rc = anthropic_request_parse(body, strlen(body), ANTHROPIC_MESSAGES, &ar, &e);
    cr_assert_eq(rc, -INFERD_EINVAL, "accepted: %s", body);
    cr_assert_eq(e.status, 400);
    cr_assert_eq(strncmp(e.message, path, strlen(path)), 0, "message '%s' does not start with '%s'",
                 e.message, path);
    cr_assert(strstr(e.message, words), "message '%s' lacks '%s'", e.message, words);
    cr_assert_null(ar.req.messages);
}

static void fini(void)
{
    anthropic_request_free(&ar);
}

TestSuite(anthropic_request, .fini = fini);

static json_object *msg(size_t i)
{
    return json_object_array_get_idx(ar.req.messages, i);
}

static const char *field(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v))
        return NULL;
    return json_object_get_string(v);
}

static const char *plain(json_object *o)
{
    return json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

#define ONE_USER "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"

Test(anthropic_request, a_minimal_body_is_a_chat_with_max_tokens)
{
    parse_ok("{\"model\":\"claude-x\",\"max_tokens\":7," ONE_USER "}");
    cr_assert_eq(ar.req.kind, GEN_REQUEST_CHAT);
    cr_assert(ar.req.has_max_tokens);
    cr_assert_eq(ar.req.max_tokens, 7);
    cr_assert_str_eq(ar.req.model, "claude-x");
    cr_assert_eq(json_object_array_length(ar.req.messages), 1);
    cr_assert_str_eq(plain(msg(0)), "{\"role\":\"user\",\"content\":\"Hi\"}");
    cr_assert(!ar.req.has_stream && !ar.req.tools && !ar.req.chat_template_kwargs);
    cr_assert_null(ar.retain_messages);
}

Test(anthropic_request, system_as_a_string_or_text_blocks_is_the_first_message)
{
    parse_ok("{\"max_tokens\":1,\"system\":\"Be brief.\"," ONE_USER "}");
    cr_assert_str_eq(plain(msg(0)), "{\"role\":\"system\",\"content\":\"Be brief.\"}");
    anthropic_request_free(&ar);
    parse_ok("{\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\","
             "\"text\":\"B\"}]," ONE_USER "}");
    cr_assert_str_eq(plain(msg(0)), "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":"
                                    "\"A\"},{\"type\":\"text\",\"text\":\"B\"}]}");
    cr_assert_str_eq(field(msg(1), "role"), "user");
}

Test(anthropic_request, sampling_stop_stream_metadata_and_session_fields_are_taken)
{
    parse_ok("{\"max_tokens\":50,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,"
             "\"stop_sequences\":[\"END\",\"\\n\\n\"],\"stream\":true,\"metadata\":{\"user_id\":"
             "\"u1\"},\"session_id\":\"s-1\"," ONE_USER "}");
    cr_assert(ar.req.has_temperature && ar.req.temperature == 0.5);
    cr_assert(ar.req.has_top_p && ar.req.top_p == 0.9);
    cr_assert(ar.req.has_top_k && ar.req.top_k == 20);
    cr_assert_eq(ar.req.n_stop, 2);
    cr_assert_str_eq(ar.req.stop[0], "END");
    cr_assert_str_eq(ar.req.stop[1], "\n\n");
    cr_assert(ar.req.has_stream && ar.req.stream);
    cr_assert_str_eq(ar.req.session_id, "s-1");
}

Test(anthropic_request, assistant_blocks_become_content_reasoning_and_tool_calls)
{
    parse_ok("{\"max_tokens\":1,\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":"
             "\"object\"}}],\"messages\":["
             "{\"role\":\"user\",\"content\":\"Weather?\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\","
             "\"signature\":\"sig\"},{\"type\":\"redacted_thinking\",\"data\":\"xx\"},"
             "{\"type\":\"text\",\"text\":\"Let me look.\"},{\"type\":\"tool_use\",\"id\":"
             "\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
             "\"toolu_1\",\"content\":\"12 C\"},{\"type\":\"text\",\"text\":\"Thanks\"}]}]}");
    cr_assert_eq(json_object_array_length(ar.req.messages), 4);
    json_object *a = msg(1);
    cr_assert_str_eq(field(a, "role"), "assistant");
    cr_assert_str_eq(field(a, "reasoning_content"), "hmm");
    cr_assert_str_eq(plain(json_object_object_get(a, "content")),
                     "[{\"type\":\"text\",\"text\":\"Let me look.\"}]");
    cr_assert_str_eq(plain(json_object_object_get(a, "tool_calls")),
                     "[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":"
                     "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]");
    cr_assert_str_eq(plain(msg(2)),
                     "{\"role\":\"tool\",\"content\":\"12 C\",\"tool_call_id\":\"toolu_1\"}");
    cr_assert_str_eq(plain(msg(3)),
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Thanks\"}]}");
}

Test(anthropic_request, tool_results_with_blocks_and_is_error_keep_their_order)
{
    parse_ok("{\"max_tokens\":1,\"messages\":["
             "{\"role\":\"user\",\"content\":\"Go\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":"
             "\"f\",\"input\":{}},{\"type\":\"tool_use\",\"id\":\"b\",\"name\":\"f\",\"input\":"
             "{}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\","
             "\"content\":[{\"type\":\"text\",\"text\":\"one\"}]},{\"type\":\"tool_result\","
             "\"tool_use_id\":\"b\",\"is_error\":true,\"content\":\"boom\"}]}]}");
    cr_assert_eq(json_object_array_length(ar.req.messages), 4);
    cr_assert_str_eq(plain(json_object_object_get(msg(1), "content")), "\"\"");
    cr_assert_str_eq(plain(msg(2)), "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":"
                                    "\"one\"}],\"tool_call_id\":\"a\"}");
    cr_assert_str_eq(field(msg(3), "content"), "Error: boom");
    cr_assert_str_eq(field(msg(3), "tool_call_id"), "b");
}

Test(anthropic_request, tools_become_function_tools_and_server_tools_are_left_out)
{
    parse_ok("{\"max_tokens\":1,\"tools\":[{\"name\":\"lookup\",\"description\":\"Looks up\","
             "\"input_schema\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}}}},"
             "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]," ONE_USER "}");
    cr_assert_str_eq(plain(ar.req.tools),
                     "[{\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"description\":"
                     "\"Looks up\",\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":"
                     "{\"type\":\"string\"}}}}}]");
    cr_assert(!ar.req.has_tool_choice);
}

Test(anthropic_request, tool_choice_maps_onto_the_neutral_choices)
{
    static const char *const choices[] = {"{\"type\":\"auto\"}", "{\"type\":\"any\"}",
                                          "{\"type\":\"tool\",\"name\":\"f\"}",
                                          "{\"type\":\"none\"}"};
    static const enum gen_tool_choice want[] = {GEN_TOOL_CHOICE_AUTO, GEN_TOOL_CHOICE_REQUIRED,
                                                GEN_TOOL_CHOICE_FUNCTION, GEN_TOOL_CHOICE_NONE};
    for (size_t i = 0; i < 4; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"max_tokens\":1,\"tools\":[{\"name\":\"f\",\"input_schema\":"
                 "{}}],\"tool_choice\":%s," ONE_USER "}", choices[i]);
        parse_ok(body);
        cr_assert(ar.req.has_tool_choice);
        cr_assert_eq(ar.req.tool_choice, want[i], "%s", choices[i]);
        if (want[i] == GEN_TOOL_CHOICE_FUNCTION)
            cr_assert_str_eq(ar.req.tool_choice_name, "f");
        anthropic_request_free(&ar);
    }
}

Test(anthropic_request, thinking_sets_the_template_switch_and_the_budget)
{
    parse_ok("{\"max_tokens\":100,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":40},"
             ONE_USER "}");
    cr_assert_str_eq(plain(ar.req.chat_template_kwargs), "{\"enable_thinking\":true}");
    cr_assert(ar.req.think_open);
    cr_assert_eq(ar.req.think_budget, 40);
    anthropic_request_free(&ar);
    parse_ok("{\"max_tokens\":100,\"thinking\":{\"type\":\"disabled\"}," ONE_USER "}");
    cr_assert_str_eq(plain(ar.req.chat_template_kwargs), "{\"enable_thinking\":false}");
    cr_assert(!ar.req.think_open);
    cr_assert_eq(ar.req.think_budget, 0);
    anthropic_request_free(&ar);
    parse_ok("{\"max_tokens\":100,\"thinking\":{\"type\":\"adaptive\"}," ONE_USER "}");
    cr_assert_str_eq(plain(ar.req.chat_template_kwargs), "{\"enable_thinking\":true}");
    cr_assert(!ar.req.think_open, "adaptive thinking is the model's choice");
}

Test(anthropic_request, count_tokens_needs_no_max_tokens_and_ignores_stream)
{
    const char *body = "{\"model\":\"m\",\"stream\":\"yes\"," ONE_USER "}";
    cr_assert_eq(anthropic_request_parse(body, strlen(body), ANTHROPIC_COUNT_TOKENS, &ar, &e), 0,
                 "%s", e.message);
    cr_assert(!ar.req.has_max_tokens && !ar.req.has_stream);
}

Test(anthropic_request, every_malformed_field_is_refused_naming_its_path)
{
    parse_refused("{" ONE_USER "}", "missing required field 'max_tokens'", "max_tokens");
    cr_assert_str_eq(e.param, "max_tokens");
    parse_refused("{\"max_tokens\":\"5\"," ONE_USER "}", "max_tokens", "must be");
    parse_refused("{\"max_tokens\":0," ONE_USER "}", "max_tokens", "at least 1");
    parse_refused("{\"max_tokens\":5}", "messages", "is required");
    parse_refused("{\"max_tokens\":5,\"messages\":[]}", "messages", "at least one message");
    parse_refused("{\"max_tokens\":5,\"messages\":{}}", "messages", "must be");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
                  "messages[0].role", "must be one of");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\"}]}", "messages[0].content",
                  "is required");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":7}]}",
                  "messages[0].content", "must be a string or an array");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
                  "messages[0].content", "must not be empty");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
                  "messages[0].content[0]", "must be an object");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":"
                  "\"x\"}]}]}", "messages[0].content[0].type", "is required");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"text\",\"text\":3}]}]}", "messages[0].content[0].text", "must be");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"audio\"}]}]}", "messages[0].content[0].type", "not a known content block");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
                  "messages[0].content[0].type", "not a known content block");
    parse_refused("{\"max_tokens\":5,\"system\":5," ONE_USER "}", "system", "must be a string");
    parse_refused("{\"max_tokens\":5,\"system\":[{\"type\":\"image\"}]," ONE_USER "}",
                  "system[0].type", "not supported by this model");
    parse_refused("{\"max_tokens\":5,\"temperature\":3," ONE_USER "}", "temperature", "must be");
    parse_refused("{\"max_tokens\":5,\"top_p\":0," ONE_USER "}", "top_p", "must be");
    parse_refused("{\"max_tokens\":5,\"top_k\":-1," ONE_USER "}", "top_k", "must be in [0,");
    parse_refused("{\"max_tokens\":5,\"stop_sequences\":\"x\"," ONE_USER "}", "stop_sequences",
                  "must be");
    parse_refused("{\"max_tokens\":5,\"stop_sequences\":[\"\"]," ONE_USER "}",
                  "stop_sequences[0]", "empty");
    parse_refused("{\"max_tokens\":5,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"],"
                  ONE_USER "}", "stop_sequences", "at most 4");
    parse_refused("{\"max_tokens\":5,\"metadata\":{\"user_id\":1}," ONE_USER "}",
                  "metadata.user_id", "must be");
    parse_refused("{\"max_tokens\":5,\"stream\":1," ONE_USER "}", "stream", "must be");
    parse_refused("{\"max_tokens\":5,\"tools\":{}," ONE_USER "}", "tools", "must be");
    parse_refused("{\"max_tokens\":5,\"tools\":[{\"name\":\"f\"}]," ONE_USER "}",
                  "missing required field 'tools[0].input_schema'", "input_schema");
    parse_refused("{\"max_tokens\":5,\"tools\":[{\"name\":\"\",\"input_schema\":{}}]," ONE_USER
                  "}", "tools[0].name", "1 to 128 bytes");
    parse_refused("{\"max_tokens\":5,\"tool_choice\":{\"type\":\"any\"}," ONE_USER "}",
                  "tool_choice.type", "non-empty tools");
    parse_refused("{\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
                  "\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}," ONE_USER "}",
                  "tool_choice.name", "not in tools");
    parse_refused("{\"max_tokens\":5,\"tool_choice\":{\"type\":\"some\"}," ONE_USER "}",
                  "tool_choice.type", "must be one of");
    parse_refused("{\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\"}," ONE_USER "}",
                  "missing required field 'thinking.budget_tokens'", "budget_tokens");
    parse_refused("{\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":5},"
                  ONE_USER "}", "thinking.budget_tokens", "less than max_tokens");
    parse_refused("{\"max_tokens\":5,\"thinking\":{\"type\":\"on\"}," ONE_USER "}",
                  "thinking.type", "must be one of");
    parse_refused("{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"x\","
                  "\"cache_control\":{\"type\":\"persistent\"}}]," ONE_USER "}",
                  "system[0].cache_control.type", "must be one of");
    parse_refused("{\"max_tokens\":5,\"session_id\":\"\"," ONE_USER "}", "session_id",
                  "must not be an empty string");
    parse_refused("{\"max_tokens\":99999999999999999999," ONE_USER "}", "the body contains an "
                  "integer beyond", "64-bit");
    parse_refused("{\"max_tokens\":5,", "could not parse the JSON body", "JSON");
    parse_refused("[1]", "the request body must be a JSON object", "object");
}

Test(anthropic_request, images_and_documents_are_refused_as_unsupported_by_this_model)
{
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\","
                  "\"data\":\"AA==\"}}]}]}",
                  "messages[0].content[0].type", "image content blocks are not supported by this model");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"document\"}]}]}", "messages[0].content[0].type", "document content blocks");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                  "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
                  "\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                  "\"tool_use_id\":\"a\",\"content\":[{\"type\":\"image\"}]}]}]}",
                  "messages[2].content[0].content[0].type", "image content blocks");
}

Test(anthropic_request, tool_use_and_tool_result_must_answer_each_other)
{
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                  "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
                  "\"input\":{}}]},{\"role\":\"user\",\"content\":\"no result\"}]}",
                  "messages[1].content[0].id", "answered by no tool_result");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                  "\"tool_result\",\"tool_use_id\":\"zz\",\"content\":\"r\"}]}]}",
                  "messages[0].content[0].tool_use_id", "answers no tool_use");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                  "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
                  "\"input\":{}},{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
                  "messages[1].content[1].id", "must be unique");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                  "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
                  "\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                  "\"tool_use_id\":\"a\"},{\"type\":\"tool_result\",\"tool_use_id\":\"a\"}]}]}",
                  "messages[2].content[1].tool_use_id", "already answered");
    parse_refused("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                  "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
                  "\"input\":[]}]}]}", "messages[1].content[0].input", "must be an object");
}

Test(anthropic_request, too_many_tools_are_refused)
{
    struct strbuf b = {0};
    strbuf_puts(&b, "{\"max_tokens\":5,\"tools\":[");
    for (int i = 0; i <= ANTHROPIC_MAX_TOOLS; i++)
        strbuf_printf(&b, "%s{\"name\":\"t%d\",\"input_schema\":{}}", i ? "," : "", i);
    strbuf_puts(&b, "]," ONE_USER "}");
    parse_refused(b.data, "tools", "holds 513 tools");
    strbuf_free(&b);
}

Test(anthropic_request, the_last_cache_control_breakpoint_cuts_the_retained_conversation)
{
    parse_ok("{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"S1\",\"cache_control\":"
             "{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"S2\"}],\"messages\":["
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"U1\"},{\"type\":"
             "\"text\",\"text\":\"U2\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}},"
             "{\"type\":\"text\",\"text\":\"U3\"}]},"
             "{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"user\",\"content\":\"Q\"}]}");
    cr_assert_not_null(ar.retain_messages);
    cr_assert_str_eq(plain(ar.retain_messages),
                     "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"S1\"},"
                     "{\"type\":\"text\",\"text\":\"S2\"}]},{\"role\":\"user\",\"content\":"
                     "[{\"type\":\"text\",\"text\":\"U1\"},{\"type\":\"text\",\"text\":\"U2\"}]}]");
    anthropic_request_free(&ar);
    parse_ok("{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"S1\",\"cache_control\":"
             "{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"S2\"}]," ONE_USER "}");
    cr_assert_str_eq(plain(ar.retain_messages),
                     "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"S1\"}]}]");
}

/* ---- the retention position, through the house model's template ------------------------ */

Test(anthropic_request, the_retention_position_is_the_rendered_prefix_up_to_the_breakpoint)
{
    struct tokenizer *tok;
    struct chat_template tmpl;
    struct err err = {0};
    cr_assert_eq(tok_load(HOUSE, &tok, &err), 0, "%s", err.msg);
    cr_assert_eq(chat_template_load(tok, &tmpl, &err), 0, "%s", err.msg);
    struct server srv;
    memset(&srv, 0, sizeof srv);
    srv.served.tok = tok;
    srv.served.tmpl = &tmpl;
    parse_ok("{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"You are a careful "
             "assistant who answers in full sentences.\",\"cache_control\":{\"type\":"
             "\"ephemeral\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"What is the "
             "capital of France, and why is it that one?\"}]}");
    int retain = anthropic_retain_tokens(&srv.served, &ar);
    struct prompt whole;
    cr_assert(prompt_build(&srv, &srv.served, &ar.req, 0, &whole, &e), "%s", e.message);
    cr_assert_gt(retain, 8);
    cr_assert_lt(retain, whole.n_ids, "the system prompt is %d of %d tokens", retain, whole.n_ids);
    /* Without a breakpoint there is no hint. */
    anthropic_request_free(&ar);
    parse_ok("{\"max_tokens\":5," ONE_USER "}");
    cr_assert_eq(anthropic_retain_tokens(&srv.served, &ar), 0);
    prompt_free(&whole);
    chat_template_free(&tmpl);
    tok_free(tok);
}

/* ---- replies ------------------------------------------------------------------------- */

static struct anthropic_reply reply(void)
{
    struct anthropic_reply r;
    memset(&r, 0, sizeof r);
    snprintf(r.id, sizeof r.id, "msg_test");
    r.model = "house";
    r.stop[0] = (char *)"STOP";
    r.stop[1] = (char *)"END";
    r.n_stop = 2;
    r.cache_block_size = 16;
    return r;
}

static struct generation_news finished(enum gen_finish finish, const char *text)
{
    struct generation_news n;
    memset(&n, 0, sizeof n);
    n.out.finish = finish;
    n.out.text = (char *)text;
    n.out.text_len = text ? strlen(text) : 0;
    n.out.n_prompt = 40;
    n.out.n_cached = 20;
    n.out.n_generated = 9;
    return n;
}

static json_object *render(const struct anthropic_reply *r, const struct generation_news *n)
{
    struct strbuf b = {0};
    cr_assert_eq(anthropic_message_json(r, n, &b), 0);
    json_object *o = json_tokener_parse(b.data);
    cr_assert_not_null(o, "not JSON: %s", b.data);
    strbuf_free(&b);
    return o;
}

static const char *at(json_object *o, const char *path)
{
    /* a.b.0.c */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_object *v = o;
    for (char *save, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
        v = json_object_is_type(v, json_type_array) ? json_object_array_get_idx(v, atoi(k))
                                                    : json_object_object_get(v, k);
    return v ? json_object_get_string(v) : NULL;
}

TestSuite(anthropic_reply);

Test(anthropic_reply, a_text_answer_is_a_message_with_usage_and_cache_counts)
{
    struct anthropic_reply r = reply();
    struct generation_news n = finished(GEN_FINISH_STOP, "Hello.");
    json_object *o = render(&r, &n);
    cr_assert_str_eq(at(o, "id"), "msg_test");
    cr_assert_str_eq(at(o, "type"), "message");
    cr_assert_str_eq(at(o, "role"), "assistant");
    cr_assert_str_eq(at(o, "model"), "house");
    cr_assert_eq(json_object_array_length(json_object_object_get(o, "content")), 1);
    cr_assert_str_eq(at(o, "content.0.type"), "text");
    cr_assert_str_eq(at(o, "content.0.text"), "Hello.");
    cr_assert_str_eq(at(o, "stop_reason"), "end_turn");
    cr_assert_null(at(o, "stop_sequence"));
    cr_assert_str_eq(at(o, "usage.input_tokens"), "40");
    cr_assert_str_eq(at(o, "usage.output_tokens"), "9");
    cr_assert_str_eq(at(o, "usage.cache_read_input_tokens"), "20");
    cr_assert_str_eq(at(o, "usage.cache_creation_input_tokens"), "12", "32 in full blocks - 20");
    json_object_put(o);
}

Test(anthropic_reply, stop_reasons_name_max_tokens_and_the_stop_sequence_that_fired)
{
    struct anthropic_reply r = reply();
    struct generation_news n = finished(GEN_FINISH_LENGTH, "abc");
    json_object *o = render(&r, &n);
    cr_assert_str_eq(at(o, "stop_reason"), "max_tokens");
    json_object_put(o);
    n = finished(GEN_FINISH_STOP, "abc");
    n.out.stop_string = 2;
    o = render(&r, &n);
    cr_assert_str_eq(at(o, "stop_reason"), "stop_sequence");
    cr_assert_str_eq(at(o, "stop_sequence"), "END");
    json_object_put(o);
    r.cache_block_size = 0;
    o = render(&r, &n);
    cr_assert_str_eq(at(o, "usage.cache_creation_input_tokens"), "0", "the cache is off");
    json_object_put(o);
}

Test(anthropic_reply, thinking_comes_first_and_an_empty_answer_keeps_one_text_block)
{
    struct anthropic_reply r = reply();
    struct generation_news n = finished(GEN_FINISH_STOP, "<think>why</think>Because.");
    n.split = true;
    n.text = (struct generation_text){.reasoning = (char *)"why", .reasoning_len = 3,
                                      .content = (char *)"Because.", .content_len = 8};
    json_object *o = render(&r, &n);
    cr_assert_str_eq(at(o, "content.0.type"), "thinking");
    cr_assert_str_eq(at(o, "content.0.thinking"), "why");
    cr_assert_str_eq(at(o, "content.0.signature"), "");
    cr_assert_str_eq(at(o, "content.1.type"), "text");
    cr_assert_str_eq(at(o, "content.1.text"), "Because.");
    json_object_put(o);
    n = finished(GEN_FINISH_STOP, "");
    o = render(&r, &n);
    cr_assert_eq(json_object_array_length(json_object_object_get(o, "content")), 1);
    cr_assert_str_eq(at(o, "content.0.text"), "");
    json_object_put(o);
}

Test(anthropic_reply, tool_calls_are_tool_use_blocks_with_their_input_object)
{
    struct anthropic_reply r = reply();
    struct generation_news n = finished(GEN_FINISH_STOP, "Checking.");
    struct generation_tool_delta calls[] = {
        {.index = 0, .id = (char *)"call_1", .name = (char *)"get_weather",
         .arguments = (char *)"{\"city\":\"Paris\"}"},
        {.index = 1, .id = (char *)"call_2", .name = (char *)"get_time",
         .arguments = (char *)"{}"},
    };
    n.tools = calls;
    n.n_tools = 2;
    n.tool_calls = true;
    json_object *o = render(&r, &n);
    cr_assert_str_eq(at(o, "content.0.text"), "Checking.");
    cr_assert_str_eq(at(o, "content.1.type"), "tool_use");
    cr_assert_eq(strncmp(at(o, "content.1.id"), "toolu_", 6), 0);
    cr_assert_str_eq(at(o, "content.1.name"), "get_weather");
    cr_assert_str_eq(at(o, "content.1.input.city"), "Paris");
    cr_assert_str_eq(at(o, "content.2.name"), "get_time");
    cr_assert_str_neq(at(o, "content.1.id"), at(o, "content.2.id"));
    cr_assert_str_eq(at(o, "stop_reason"), "tool_use");
    json_object_put(o);
}

/* ---- the event stream ------------------------------------------------------------------ */

struct events {
    char names[64][32];
    json_object *data[64];
    int n;
};

/* Splits out into events, checking each is "event: NAME\ndata: JSON\n\n" with type NAME. */
static void split_events(const char *out, struct events *ev)
{
    memset(ev, 0, sizeof *ev);
    const char *p = out;
    while (*p) {
        cr_assert_eq(strncmp(p, "event: ", 7), 0, "not an event: %.80s", p);
        const char *nl = strchr(p, '\n');
        cr_assert_lt(ev->n, 64);
        snprintf(ev->names[ev->n], sizeof ev->names[0], "%.*s", (int)(nl - p - 7), p + 7);
        cr_assert_eq(strncmp(nl + 1, "data: ", 6), 0);
        const char *end = strstr(nl + 1, "\n\n");
        cr_assert_not_null(end);
        char *json = strndup(nl + 7, (size_t)(end - nl - 7));
        ev->data[ev->n] = json_tokener_parse(json);
        cr_assert_not_null(ev->data[ev->n], "not JSON: %s", json);
        free(json);
        if (strcmp(ev->names[ev->n], "error") != 0)
            cr_assert_str_eq(at(ev->data[ev->n], "type"), ev->names[ev->n]);
        ev->n++;
        p = end + 2;
    }
}

static void free_events(struct events *ev)
{
    for (int i = 0; i < ev->n; i++)
        json_object_put(ev->data[i]);
}

TestSuite(anthropic_stream);

Test(anthropic_stream, blocks_open_and_close_in_order_and_end_with_message_delta_and_stop)
{
    struct anthropic_stream s;
    memset(&s, 0, sizeof s);
    s.reply = reply();
    struct strbuf out = {0};
    bool done = false;
    struct generation_news n = finished(GEN_RUNNING, NULL);
    n.split = true;
    n.text = (struct generation_text){.reasoning = (char *)"Let me ", .reasoning_len = 7,
                                      .content = (char *)"", .content_len = 0};
    anthropic_stream_news(&s, &n, &out, &done);
    n.text = (struct generation_text){.reasoning = (char *)"see.", .reasoning_len = 4,
                                      .content = (char *)"It is", .content_len = 5};
    anthropic_stream_news(&s, &n, &out, &done);
    cr_assert(!done);
    struct generation_tool_delta first = {.index = 0, .id = (char *)"c", .name = (char *)"f",
                                          .arguments = (char *)"{\"a\":"};
    struct generation_tool_delta rest = {.index = 0, .arguments = (char *)"1}"};
    struct generation_tool_delta second = {.index = 1, .id = (char *)"d", .name = (char *)"g",
                                           .arguments = (char *)""};
    struct generation_tool_delta deltas[] = {first, rest, second};
    n = finished(GEN_FINISH_STOP, NULL);
    n.split = true;
    n.text = (struct generation_text){.reasoning = (char *)"", .content = (char *)" sunny."};
    n.text.content_len = 7;
    n.tools = deltas;
    n.n_tools = 3;
    n.tool_calls = true;
    anthropic_stream_news(&s, &n, &out, &done);
    cr_assert(done);
    struct events ev;
    split_events(out.data, &ev);
    static const char *const want[] = {
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_stop",
        "message_delta", "message_stop"};
    cr_assert_eq(ev.n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < ev.n; i++)
        cr_assert_str_eq(ev.names[i], want[i], "event %d", i);
    cr_assert_str_eq(at(ev.data[0], "message.id"), "msg_test");
    cr_assert_eq(json_object_array_length(json_object_object_get(
                     json_object_object_get(ev.data[0], "message"), "content")), 0);
    cr_assert_str_eq(at(ev.data[0], "message.usage.input_tokens"), "40");
    cr_assert_str_eq(at(ev.data[0], "message.usage.cache_read_input_tokens"), "20");
    cr_assert_str_eq(at(ev.data[1], "content_block.type"), "thinking");
    cr_assert_str_eq(at(ev.data[2], "delta.type"), "thinking_delta");
    cr_assert_str_eq(at(ev.data[2], "delta.thinking"), "Let me ");
    cr_assert_str_eq(at(ev.data[3], "delta.thinking"), "see.");
    cr_assert_str_eq(at(ev.data[4], "index"), "0");
    cr_assert_str_eq(at(ev.data[5], "content_block.type"), "text");
    cr_assert_str_eq(at(ev.data[5], "index"), "1");
    cr_assert_str_eq(at(ev.data[6], "delta.text"), "It is");
    cr_assert_str_eq(at(ev.data[7], "delta.text"), " sunny.");
    cr_assert_str_eq(at(ev.data[9], "content_block.type"), "tool_use");
    cr_assert_str_eq(at(ev.data[9], "content_block.name"), "f");
    cr_assert_eq(strncmp(at(ev.data[9], "content_block.id"), "toolu_", 6), 0);
    cr_assert_str_eq(at(ev.data[9], "index"), "2");
    cr_assert_str_eq(at(ev.data[10], "delta.type"), "input_json_delta");
    cr_assert_str_eq(at(ev.data[10], "delta.partial_json"), "{\"a\":");
    cr_assert_str_eq(at(ev.data[11], "delta.partial_json"), "1}");
    cr_assert_str_eq(at(ev.data[13], "content_block.name"), "g");
    cr_assert_str_eq(at(ev.data[13], "index"), "3");
    cr_assert_str_eq(at(ev.data[15], "delta.stop_reason"), "tool_use");
    cr_assert_null(at(ev.data[15], "delta.stop_sequence"));
    cr_assert_str_eq(at(ev.data[15], "usage.output_tokens"), "9");
    free_events(&ev);
    strbuf_free(&out);
}

Test(anthropic_stream, an_empty_answer_is_one_empty_text_block_and_the_stop_sequence_is_named)
{
    struct anthropic_stream s;
    memset(&s, 0, sizeof s);
    s.reply = reply();
    struct strbuf out = {0};
    bool done = false;
    struct generation_news n = finished(GEN_FINISH_STOP, "");
    n.out.stop_string = 1;
    anthropic_stream_news(&s, &n, &out, &done);
    struct events ev;
    split_events(out.data, &ev);
    cr_assert_eq(ev.n, 5);
    cr_assert_str_eq(ev.names[1], "content_block_start");
    cr_assert_str_eq(at(ev.data[1], "content_block.type"), "text");
    cr_assert_str_eq(at(ev.data[1], "content_block.text"), "");
    cr_assert_str_eq(ev.names[2], "content_block_stop");
    cr_assert_str_eq(at(ev.data[3], "delta.stop_reason"), "stop_sequence");
    cr_assert_str_eq(at(ev.data[3], "delta.stop_sequence"), "STOP");
    free_events(&ev);
    strbuf_free(&out);
}

Test(anthropic_stream, a_failure_after_the_start_is_an_error_event)
{
    struct anthropic_stream s;
    memset(&s, 0, sizeof s);
    s.reply = reply();
    struct strbuf out = {0};
    bool done = false;
    struct generation_news n = finished(GEN_RUNNING, "partial");
    anthropic_stream_news(&s, &n, &out, &done);
    n = finished(GEN_FINISH_ERROR, NULL);
    snprintf(n.out.error, sizeof n.out.error, "the backend failed");
    anthropic_stream_news(&s, &n, &out, &done);
    cr_assert(done);
    struct events ev;
    split_events(out.data, &ev);
    cr_assert_str_eq(ev.names[ev.n - 1], "error");
    cr_assert_str_eq(at(ev.data[ev.n - 1], "type"), "error");
    cr_assert_str_eq(at(ev.data[ev.n - 1], "error.type"), "api_error");
    cr_assert_str_eq(at(ev.data[ev.n - 1], "error.message"), "the backend failed");
    free_events(&ev);
    strbuf_reset(&out);
    anthropic_stream_ping(&out);
    cr_assert_str_eq(out.data, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    strbuf_free(&out);
}

/* ---- the error body ------------------------------------------------------------------- */

Test(anthropic_errors, each_status_has_anthropics_error_type)
{
    static const struct { int status; const char *type; } cases[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
        {404, "not_found_error"},       {405, "invalid_request_error"}, {413, "request_too_large"},
        {415, "invalid_request_error"}, {429, "rate_limit_error"},      {500, "api_error"},
        {503, "overloaded_error"},      {529, "overloaded_error"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct api_error err;
        api_error_set(&err, cases[i].status, API_ERROR_UNSET, "p", "c", "went \"wrong\"");
        struct strbuf b = {0};
        cr_assert_eq(api_error_anthropic.render(&err, &b), 0);
        char want[256];
        snprintf(want, sizeof want,
                 "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"went \\\"wrong\\\"\"}}",
                 cases[i].type);
        cr_assert_str_eq(b.data, want, "status %d", cases[i].status);
        strbuf_free(&b);
    }
    json_object *oom = json_tokener_parse(api_error_anthropic.out_of_memory);
    cr_assert_str_eq(at(oom, "error.type"), "api_error");
    json_object_put(oom);
    cr_assert_str_eq(api_error_anthropic.content_type, "application/json");
}
