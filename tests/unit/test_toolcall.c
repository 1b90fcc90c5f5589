/* tests/unit/test_toolcall.c — tool calls parsed out of model replies, per family: a corpus of
 * replies (single, parallel, text before, malformed, near-JSON, unterminated, unicode), each fed
 * whole, split at every byte and byte by byte, always giving the same content and calls; the
 * syntax chosen from chat templates; and calls coming out of token ids through the generation
 * path. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/generation.h"
#include "engine/sequence.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"

#define MAX_CALLS 8

/* What a reply parsed to: the text outside calls and the calls, as the
 * events concatenate. */
struct parsed {
    char content[4096];
    size_t content_len;
    int n_calls;
    char name[MAX_CALLS][128];
    char args[MAX_CALLS][1024];
};

static void take(struct parsed *r, const struct toolcall_events *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        const struct toolcall_event *e = &ev->events[i];
        switch (e->kind) {
        case TOOLCALL_TEXT:
            cr_assert_lt(r->content_len + e->len, sizeof r->content);
            memcpy(r->content + r->content_len, e->text, e->len);
            r->content_len += e->len;
            r->content[r->content_len] = '\0';
            break;
        case TOOLCALL_CALL_START:
            cr_assert_eq(e->index, r->n_calls, "calls are numbered in order");
            cr_assert_lt(r->n_calls, MAX_CALLS);
            snprintf(r->name[r->n_calls++], sizeof r->name[0], "%s", e->text);
            break;
        case TOOLCALL_ARGUMENTS:
            cr_assert_eq(e->index, r->n_calls - 1, "arguments belong to the open call");
            cr_assert_lt(strlen(r->args[e->index]) + e->len, sizeof r->args[0]);
            strncat(r->args[e->index], e->text, e->len);
            break;
        case TOOLCALL_CALL_END:
            cr_assert_eq(e->index, r->n_calls - 1);
            break;
        }
    }
}

/* text fed in pieces cut at cuts[0..n_cuts) (ascending), then finished. */
static void parse_cut(enum toolcall_syntax syntax, json_object *tools, const char *text,
                      const size_t *cuts, size_t n_cuts, struct parsed *r)
{
    struct toolcall_parser *p;
    struct err err = {0};
    struct toolcall_events ev;
    memset(r, 0, sizeof *r);
    cr_assert_eq(toolcall_parser_create(syntax, tools, &p, &err), 0, "%s", err.msg);
    size_t len = strlen(text), from = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        cr_assert_eq(toolcall_parser_push(p, text + from, to - from, &ev, &err), 0, "%s", err.msg);
        take(r, &ev);
        from = to;
    }
    cr_assert_eq(toolcall_parser_finish(p, &ev, &err), 0, "%s", err.msg);
    take(r, &ev);
    cr_assert_eq(toolcall_parser_calls(p), r->n_calls);
    toolcall_parser_free(p);
    for (int i = 0; i < r->n_calls; i++) {
        json_object *o = json_tokener_parse(r->args[i]);
        cr_assert(json_object_is_type(o, json_type_object), "arguments %s are not a JSON object",
                  r->args[i]);
        json_object_put(o);
    }
}

static void assert_same(const struct parsed *a, const struct parsed *b, const char *how)
{
    cr_assert_str_eq(a->content, b->content, "%s: content differs", how);
    cr_assert_eq(a->n_calls, b->n_calls, "%s: %d calls, not %d", how, b->n_calls, a->n_calls);
    for (int i = 0; i < a->n_calls; i++) {
        cr_assert_str_eq(a->name[i], b->name[i], "%s: call %d's name", how, i);
        cr_assert_str_eq(a->args[i], b->args[i], "%s: call %d's arguments", how, i);
    }
}

/* One corpus entry: the reply, and what it must parse to — content, then
 * name and arguments of each call. */
struct expect {
    const char *content;
    int n_calls;
    const char *calls[MAX_CALLS][2];
};

static void check(enum toolcall_syntax syntax, const char *tools_json, const char *text,
                  struct expect want)
{
    json_object *tools = tools_json ? json_tokener_parse(tools_json) : NULL;
    struct parsed whole, cut;
    parse_cut(syntax, tools, text, NULL, 0, &whole);
    cr_assert_str_eq(whole.content, want.content, "content of %s: got [%s]", text, whole.content);
    cr_assert_eq(whole.n_calls, want.n_calls, "calls in %s", text);
    for (int i = 0; i < want.n_calls; i++) {
        cr_assert_str_eq(whole.name[i], want.calls[i][0], "name of call %d in %s", i, text);
        cr_assert_str_eq(whole.args[i], want.calls[i][1], "arguments of call %d in %s: got %s", i,
                         text, whole.args[i]);
    }
    size_t len = strlen(text);
    for (size_t at = 0; at <= len; at++) {
        parse_cut(syntax, tools, text, &at, 1, &cut);
        char how[64];
        snprintf(how, sizeof how, "split at byte %zu", at);
        assert_same(&whole, &cut, how);
    }
    size_t *every = malloc((len + 1) * sizeof *every);
    for (size_t i = 0; i < len; i++)
        every[i] = i + 1;
    parse_cut(syntax, tools, text, every, len, &cut);
    assert_same(&whole, &cut, "byte by byte");
    free(every);
    json_object_put(tools);
}

#define NO_CALLS(text) ((struct expect){(text), 0, {{0}}})

/* ---- Hermes (Qwen) -------------------------------------------------------------------- */

Test(toolcall_hermes, single_call_has_no_content)
{
    check(TOOLCALL_HERMES, NULL,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
          (struct expect){"", 1, {{"get_weather", "{\"city\":\"Paris\"}"}}});
}

Test(toolcall_hermes, parallel_calls_get_their_own_indices)
{
    check(TOOLCALL_HERMES, NULL,
          "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": [true, null, 2.50]}}\n</tool_call>",
          (struct expect){"", 2, {{"a", "{\"x\":1}"}, {"b", "{\"y\":[true,null,2.50]}"}}});
}

Test(toolcall_hermes, text_before_the_call_stays_content)
{
    check(TOOLCALL_HERMES, NULL,
          "Let me check the weather.\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>\n",
          (struct expect){"Let me check the weather.", 1, {{"w", "{}"}}});
}

Test(toolcall_hermes, text_after_the_call_stays_content)
{
    check(TOOLCALL_HERMES, NULL,
          "<tool_call>{\"name\": \"w\", \"arguments\": {}}</tool_call>\n\nDone, <b>bold</b>.",
          (struct expect){"Done, <b>bold</b>.", 1, {{"w", "{}"}}});
}

Test(toolcall_hermes, malformed_call_is_text)
{
    const char *t = "Hi <tool_call>{\"name\": \"f\", \"arguments\": }</tool_call> there";
    check(TOOLCALL_HERMES, NULL, t, NO_CALLS(t));
    const char *no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
    check(TOOLCALL_HERMES, NULL, no_name, NO_CALLS(no_name));
    const char *bad_args = "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>";
    check(TOOLCALL_HERMES, NULL, bad_args, NO_CALLS(bad_args));
    const char *nul_name = "<tool_call>{\"name\": \"a\\u0000b\", \"arguments\": {}}</tool_call>";
    check(TOOLCALL_HERMES, NULL, nul_name, NO_CALLS(nul_name));
}

Test(toolcall_hermes, near_json_is_repaired)
{
    check(TOOLCALL_HERMES, NULL,
          "<tool_call>{'name': 'f', 'arguments': {'a': True, b: None, \"c\": [1, 2,], 'd': 'it\\'s',},}"
          "</tool_call>",
          (struct expect){"", 1, {{"f", "{\"a\":true,\"b\":null,\"c\":[1,2],\"d\":\"it's\"}"}}});
}

Test(toolcall_hermes, arguments_given_as_a_json_string_become_the_object)
{
    check(TOOLCALL_HERMES, NULL,
          "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
          (struct expect){"", 1, {{"f", "{\"a\":1}"}}});
}

Test(toolcall_hermes, unterminated_call_is_text)
{
    const char *t = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1";
    check(TOOLCALL_HERMES, NULL, t, NO_CALLS(t));
}

Test(toolcall_hermes, a_complete_call_missing_only_its_end_tag_still_counts)
{
    check(TOOLCALL_HERMES, NULL, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n",
          (struct expect){"", 1, {{"f", "{}"}}});
}

Test(toolcall_hermes, unicode_in_text_and_arguments)
{
    check(TOOLCALL_HERMES, NULL,
          "Voilà 🌍 <tool_call>{\"name\": \"say\", \"arguments\": {\"text\": \"héllo \\u00e9 日本 🎉 "
          "\\ud83d\\ude00\"}}</tool_call>",
          (struct expect){"Voilà 🌍", 1, {{"say", "{\"text\":\"héllo é 日本 🎉 😀\"}"}}});
}

Test(toolcall_hermes, text_that_only_looks_like_a_tag_is_content)
{
    const char *t = "if a <tool and b < c then <tool_cal> </tool_call> ok ";
    check(TOOLCALL_HERMES, NULL, t, NO_CALLS(t));
}

/* ---- Qwen3-Coder XML ----------------------------------------------------------------------- */

static const char *CODER_TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"metric\":{\"type\":\"boolean\"},\"ratio\":{\"type\":\"number\"},\"opts\":{\"type\":\"object\"},"
    "\"tags\":{\"type\":\"array\"},\"maybe\":{\"type\":[\"integer\",\"null\"]}}}}}]";

Test(toolcall_qwen3_coder, parameters_are_typed_by_the_schema)
{
    check(TOOLCALL_QWEN3_CODER, CODER_TOOLS,
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
          "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
          "<parameter=ratio>\n0.5\n</parameter>\n<parameter=opts>\n{'unit': 'C',}\n</parameter>\n"
          "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n"
          "<parameter=other>\n42\n</parameter>\n</function>\n</tool_call>",
          (struct expect){"", 1,
                          {{"get_weather",
                            "{\"city\":\"Paris\",\"days\":3,\"metric\":true,\"ratio\":0.5,"
                            "\"opts\":{\"unit\":\"C\"},\"tags\":[\"a\",\"b\"],\"maybe\":null,"
                            "\"other\":\"42\"}"}}});
}

Test(toolcall_qwen3_coder, a_value_that_does_not_read_as_its_type_stays_a_string)
{
    check(TOOLCALL_QWEN3_CODER, CODER_TOOLS,
          "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
          "<parameter=city>\nNew\nYork \"NY\"\n</parameter>\n</function>\n</tool_call>",
          (struct expect){"", 1, {{"get_weather", "{\"days\":\"three\",\"city\":\"New\\nYork \\\"NY\\\"\"}"}}});
}

Test(toolcall_qwen3_coder, parallel_calls_and_text_before)
{
    check(TOOLCALL_QWEN3_CODER, NULL,
          "I'll run both.\n<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n"
          "</tool_call>\n<tool_call>\n<function=b>\n</function>\n</tool_call>",
          (struct expect){"I'll run both.", 2, {{"a", "{\"x\":\"1\"}"}, {"b", "{}"}}});
}

Test(toolcall_qwen3_coder, a_bare_function_without_tool_call_tags_counts)
{
    check(TOOLCALL_QWEN3_CODER, NULL,
          "<function=a>\n<parameter=x>\nv\n</parameter>\n</function>\nthen text",
          (struct expect){"then text", 1, {{"a", "{\"x\":\"v\"}"}}});
}

Test(toolcall_qwen3_coder, the_json_form_is_taken_too)
{
    check(TOOLCALL_QWEN3_CODER, NULL,
          "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
          (struct expect){"", 1, {{"f", "{\"a\":1}"}}});
}

Test(toolcall_qwen3_coder, malformed_and_unterminated_calls_are_text)
{
    const char *t1 = "<tool_call>\n<function>oops</function>\n</tool_call>";
    check(TOOLCALL_QWEN3_CODER, NULL, t1, NO_CALLS(t1));
    const char *t2 = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n";
    check(TOOLCALL_QWEN3_CODER, NULL, t2, NO_CALLS(t2));
    const char *t3 = "<function=\x01f>\n</function>";
    check(TOOLCALL_QWEN3_CODER, NULL, t3, NO_CALLS(t3));
}

Test(toolcall_qwen3_coder, unicode_values)
{
    check(TOOLCALL_QWEN3_CODER, CODER_TOOLS,
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich 🇨🇭\n</parameter>\n"
          "</function>\n</tool_call>",
          (struct expect){"", 1, {{"get_weather", "{\"city\":\"Zürich 🇨🇭\"}"}}});
}

/* ---- Llama 3.1+ JSON ------------------------------------------------------------------------- */

Test(toolcall_llama, the_whole_reply_as_a_call)
{
    check(TOOLCALL_LLAMA_JSON, NULL,
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
          (struct expect){"", 1, {{"get_weather", "{\"city\":\"Paris\"}"}}});
}

Test(toolcall_llama, after_a_python_tag)
{
    check(TOOLCALL_LLAMA_JSON, NULL,
          "Checking. <|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": \"b\"}}",
          (struct expect){"Checking.", 1, {{"f", "{\"a\":\"b\"}"}}});
}

Test(toolcall_llama, several_separated_by_semicolons_or_newlines)
{
    check(TOOLCALL_LLAMA_JSON, NULL,
          "  {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": -1e3}}\n"
          "{\"name\": \"c\", \"arguments\": {}}",
          (struct expect){"", 3, {{"a", "{}"}, {"b", "{\"n\":-1e3}"}, {"c", "{}"}}});
}

Test(toolcall_llama, text_first_means_no_bare_call)
{
    const char *t = "Here: {\"name\": \"a\", \"parameters\": {}}";
    check(TOOLCALL_LLAMA_JSON, NULL, t, NO_CALLS(t));
}

Test(toolcall_llama, json_that_is_not_a_call_is_text)
{
    const char *t = "{\"answer\": 42} is the answer";
    check(TOOLCALL_LLAMA_JSON, NULL, t, NO_CALLS(t));
    const char *t2 = "{\"name\": 5, \"parameters\": {}}";
    check(TOOLCALL_LLAMA_JSON, NULL, t2, NO_CALLS(t2));
}

Test(toolcall_llama, near_json_is_repaired)
{
    check(TOOLCALL_LLAMA_JSON, NULL, "{'name': 'f', 'parameters': {'on': False, 'q': 'x\"y',},}",
          (struct expect){"", 1, {{"f", "{\"on\":false,\"q\":\"x\\\"y\"}"}}});
}

Test(toolcall_llama, unterminated_call_is_text)
{
    const char *t = "{\"name\": \"f\", \"parameters\": {\"a\": \"}";
    check(TOOLCALL_LLAMA_JSON, NULL, t, NO_CALLS(t));
}

Test(toolcall_llama, plain_and_unicode_replies)
{
    check(TOOLCALL_LLAMA_JSON, NULL, "Hello there 👋", NO_CALLS("Hello there 👋"));
    check(TOOLCALL_LLAMA_JSON, NULL, "{\"name\": \"翻訳\", \"parameters\": {\"text\": \"café\"}}",
          (struct expect){"", 1, {{"翻訳", "{\"text\":\"café\"}"}}});
}

/* ---- Mistral ---------------------------------------------------------------------------------- */

Test(toolcall_mistral, single_and_parallel)
{
    check(TOOLCALL_MISTRAL, NULL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}]",
          (struct expect){"", 1, {{"f", "{\"a\":1}"}}});
    check(TOOLCALL_MISTRAL, NULL,
          "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"b\": \"]\"}}]",
          (struct expect){"", 2, {{"f", "{}"}, {"g", "{\"b\":\"]\"}"}}});
}

Test(toolcall_mistral, the_array_alone_counts_once_the_marker_token_is_dropped)
{
    check(TOOLCALL_MISTRAL, NULL, "\n[{\"name\": \"f\", \"arguments\": {}}]",
          (struct expect){"", 1, {{"f", "{}"}}});
}

Test(toolcall_mistral, text_before_the_marker_stays_content)
{
    check(TOOLCALL_MISTRAL, NULL, "Sure thing. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
          (struct expect){"Sure thing.", 1, {{"f", "{}"}}});
}

Test(toolcall_mistral, malformed_unterminated_and_markdown_are_text)
{
    const char *t1 = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": 3}]";
    check(TOOLCALL_MISTRAL, NULL, t1, NO_CALLS(t1));
    const char *t2 = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [1, 2}]";
    check(TOOLCALL_MISTRAL, NULL, t2, NO_CALLS(t2));
    const char *t3 = "[a link](http://example.com) and [TOOL_CALLS] no json";
    check(TOOLCALL_MISTRAL, NULL, t3, NO_CALLS(t3));
}

Test(toolcall_mistral, near_json_and_unicode)
{
    check(TOOLCALL_MISTRAL, NULL, "[TOOL_CALLS][{'name': 'f', 'arguments': {'x': '✓',},},]",
          (struct expect){"", 1, {{"f", "{\"x\":\"✓\"}"}}});
}

/* ---- the near-JSON reader and the syntax choice ---------------------------------------------- */

Test(toolcall_json, repairs_what_models_write_and_refuses_the_rest)
{
    static const char *const ok[][2] = {
        {"{\"a\":1}", "{\"a\":1}"},
        {"```json\n{\"a\": [1,2,],}\n```", "{\"a\":[1,2]}"},
        {"{a: 'b', c_d: True, e: None}", "{\"a\":\"b\",\"c_d\":true,\"e\":null}"},
        {"{\"big\": 123456789012345678901234567890}", "{\"big\":123456789012345678901234567890}"},
        {"{\"s\": \"line\nbreak\"}", "{\"s\":\"line\\nbreak\"}"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        json_object *o = NULL;
        struct err err = {0};
        cr_assert_eq(toolcall_json_repair(ok[i][0], strlen(ok[i][0]), &o, &err), 0, "%s: %s",
                     ok[i][0], err.msg);
        cr_assert_str_eq(json_object_to_json_string_ext(
                             o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE),
                         ok[i][1]);
        json_object_put(o);
    }
    static const char *const bad[] = {"{\"a\": 1", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": .5}",
                                      "{\"a\": \"\\ud800\"}", "{\"a\": 1} x", "{\"a\": \"\xff\"}",
                                      "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                                      "[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                                      "]]]]]]]]]]]]]]]]]]]]]]]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_object *o = NULL;
        struct err err = {0};
        cr_assert_eq(toolcall_json_repair(bad[i], strlen(bad[i]), &o, &err), -INFERD_EFORMAT,
                     "%s was taken", bad[i]);
        cr_assert_null(o);
    }
}

Test(toolcall_syntax, chosen_by_what_the_template_writes)
{
    const char *why = NULL;
    cr_assert_eq(toolcall_syntax_for_template("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}", &why),
                 TOOLCALL_HERMES);
    cr_assert(strstr(why, "<tool_call>"));
    cr_assert_eq(toolcall_syntax_for_template("<tool_call>\n<function={{ name }}>", NULL),
                 TOOLCALL_QWEN3_CODER);
    cr_assert_eq(toolcall_syntax_for_template("{{ '[TOOL_CALLS]' + calls | tojson }}", NULL),
                 TOOLCALL_MISTRAL);
    cr_assert_eq(toolcall_syntax_for_template("{{- '<|python_tag|>' + call }}", NULL),
                 TOOLCALL_LLAMA_JSON);
    cr_assert_eq(toolcall_syntax_for_template(
                     "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}", NULL),
                 TOOLCALL_LLAMA_JSON);
    cr_assert_eq(toolcall_syntax_for_template("{{ messages }}", &why), TOOLCALL_HERMES);
    cr_assert(strstr(why, "default"));
    cr_assert_eq(toolcall_syntax_for_template(NULL, NULL), TOOLCALL_HERMES);
    cr_assert_str_eq(toolcall_syntax_name(TOOLCALL_QWEN3_CODER), "qwen3_coder");
}

/* ---- token ids through the generation path -------------------------------------------------- */

/* What a reader of the generation saw, news by news or at once. */
struct reply {
    char reasoning[2048], content[2048];
    int n_calls;
    char id[MAX_CALLS][64], name[MAX_CALLS][128], args[MAX_CALLS][1024];
    bool tool_calls;
};

static void reply_take(struct reply *r, const struct generation_news *n)
{
    if (n->split) {
        strncat(r->reasoning, n->text.reasoning, n->text.reasoning_len);
        strncat(r->content, n->text.content, n->text.content_len);
        if (n->tail.reasoning)
            strncat(r->reasoning, n->tail.reasoning, n->tail.reasoning_len);
        if (n->tail.content)
            strncat(r->content, n->tail.content, n->tail.content_len);
    } else if (n->out.text) {
        strncat(r->content, n->out.text, n->out.text_len);
    }
    for (size_t i = 0; i < n->n_tools; i++) {
        const struct generation_tool_delta *d = &n->tools[i];
        cr_assert(d->arguments);
        if (d->id) {
            cr_assert_eq(d->index, r->n_calls, "a call's first piece opens the next index");
            cr_assert_not_null(d->name);
            snprintf(r->id[r->n_calls], sizeof r->id[0], "%s", d->id);
            snprintf(r->name[r->n_calls], sizeof r->name[0], "%s", d->name);
            r->n_calls++;
        } else {
            cr_assert_eq(d->index, r->n_calls - 1, "later pieces add to the open call");
            cr_assert_null(d->name);
        }
        strcat(r->args[d->index], d->arguments);
    }
    r->tool_calls |= n->tool_calls;
}

static void publish(struct gen_output *o, const char *text, size_t len, const int32_t *id,
                    enum gen_finish finish)
{
    struct gen_pending p = {0};
    strbuf_append(&p.text, text, len);
    if (id) {
        strbuf_append(&p.ids, (const char *)id, sizeof *id);
        p.n_generated = 1;
    }
    p.finish = finish;
    cr_assert(gen_output_publish(o, &p));
}

static const char *TOOLS_BODY =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather and time in Paris?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]%s}";

/* The model's reply as token ids through the detokenizer into an output, read
 * by a generation (streamed: one news per token; else collected at the end). */
static void run_reply(struct server *srv, const char *extra, const char *reply, bool streamed,
                      struct reply *r)
{
    char body[2048];
    snprintf(body, sizeof body, TOOLS_BODY, extra);
    struct gen_request req;
    struct api_error e;
    cr_assert_eq(gen_request_parse(body, strlen(body), GEN_REQUEST_CHAT, &req, &e), 0, "%s",
                 e.message);
    struct err err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    cr_assert_eq(tok_encode(srv->served.tok, reply, strlen(reply), false, &ids, &n_ids, &err), 0, "%s",
                 err.msg);
    struct detok *d;
    cr_assert_eq(detok_create(srv->served.tok, true, &d, &err), 0, "%s", err.msg);
    struct gen_output *o = gen_output_create(8);
    cr_assert_not_null(o);
    struct generation *g;
    cr_assert_eq(generation_open_output(srv, &req, o, false, &g, &e), 0, "%s", e.message);
    memset(r, 0, sizeof *r);
    struct generation_news n;
    for (int i = 0; i < n_ids; i++) {
        const char *text;
        size_t len;
        cr_assert_eq(detok_push(d, ids[i], &text, &len, &err), 0);
        publish(o, text, len, &ids[i], GEN_RUNNING);
        if (streamed) {
            cr_assert_eq(generation_next(g, 0, &n), 0);
            cr_assert_eq(n.out.finish, GEN_RUNNING);
            cr_assert(!n.tool_calls, "tool_calls is said at the finish");
            reply_take(r, &n);
            generation_news_free(&n);
        }
    }
    publish(o, "", 0, NULL, GEN_FINISH_STOP);
    if (streamed) {
        do {
            cr_assert_eq(generation_next(g, 1000, &n), 0);
            reply_take(r, &n);
            enum gen_finish f = n.out.finish;
            generation_news_free(&n);
            if (f != GEN_RUNNING)
                break;
        } while (1);
    } else {
        cr_assert_eq(generation_collect(g, &n, &e), 0, "%s", e.message);
        for (size_t i = 0; i < n.n_tools; i++)
            cr_assert_not_null(n.tools[i].id, "collected: every call is one whole piece");
        reply_take(r, &n);
        generation_news_free(&n);
    }
    generation_free(g);
    gen_output_release(o); /* the engine's reference */
    detok_free(d);
    free(ids);
    gen_request_free(&req);
}

static struct tokenizer *load_qwen3(void)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set; run scripts/fetch-tokenizers.sh DIR and "
                     "export it");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3", data);
    struct tokenizer *tok = NULL;
    struct err err = {0};
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    return tok;
}

Test(toolcall_pipeline, token_ids_become_tool_calls_streamed_and_collected_alike)
{
    struct server srv = {0};
    srv.served.tok = load_qwen3();
    const char *reply =
        "<think>\nTwo tools.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
        "\"arguments\": {'tz': 'CET',}}\n</tool_call>";
    struct reply streamed, collected;
    run_reply(&srv, "", reply, true, &streamed);
    run_reply(&srv, "", reply, false, &collected);
    const struct reply *rs[] = {&streamed, &collected};
    for (int k = 0; k < 2; k++) {
        const struct reply *r = rs[k];
        cr_assert_str_eq(r->reasoning, "\nTwo tools.\n");
        cr_assert_str_eq(r->content, "\n\nLet me look.");
        cr_assert(r->tool_calls);
        cr_assert_eq(r->n_calls, 2);
        cr_assert_str_eq(r->name[0], "get_weather");
        cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\"}");
        cr_assert_str_eq(r->name[1], "get_time");
        cr_assert_str_eq(r->args[1], "{\"tz\":\"CET\"}");
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(strlen(r->id[i]), 5 + 24, "%s", r->id[i]);
            cr_assert(!strncmp(r->id[i], "call_", 5));
            for (int c = 5; c < 29; c++)
                cr_assert(isalnum((unsigned char)r->id[i][c]), "%s", r->id[i]);
        }
        cr_assert_str_neq(r->id[0], r->id[1]);
    }
    tok_free((struct tokenizer *)srv.served.tok);
}

Test(toolcall_pipeline, tool_choice_none_leaves_the_text_alone)
{
    struct server srv = {0};
    srv.served.tok = load_qwen3();
    const char *reply = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    struct reply r;
    run_reply(&srv, ",\"tool_choice\":\"none\"", reply, false, &r);
    cr_assert_eq(r.n_calls, 0);
    cr_assert(!r.tool_calls);
    cr_assert_str_eq(r.content, reply);
    run_reply(&srv, ",\"tool_choice\":\"auto\"", "No call needed.", true, &r);
    cr_assert_eq(r.n_calls, 0);
    cr_assert(!r.tool_calls);
    cr_assert_str_eq(r.content, "No call needed.");
    tok_free((struct tokenizer *)srv.served.tok);
}
