/* api/responses.c — the OpenAI Responses API: bodies read into chat-shaped requests, output
 * written as items, Response objects and their events, and the routes over the response store. */
#include "api/responses.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/model_pool.h"
#include "api/response_store.h"
#include "base/log.h"
#include "base/timer.h"

/* Longest silence on a stream before a keep-alive comment goes out. */
#define SSE_KEEPALIVE_MS 15000
/* OpenAI's limits on metadata. */
#define METADATA_MAX_KEYS 16
#define METADATA_MAX_KEY 64
#define METADATA_MAX_VALUE 512

static void put(json_object *o, const char *key, json_object *v)
{
    json_object_object_add(o, key, v);
}

static json_object *jstr(const char *s, size_t len)
{
    return json_object_new_string_len(s ? s : "", (int)len);
}

/* A float setting as it was written (0.7, not 0.699999988). */
static json_object *jsetting(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", v);
    return json_object_new_double_s(v, buf);
}

static json_object *jstr_or_null(const char *s)
{
    return s ? json_object_new_string(s) : NULL;
}

/* ======================================================================
 * The request: input items → chat messages
 * ====================================================================== */

struct parse {
    struct responses_request *r;
    json_object *known_calls; /* owned; the call_ids of the input's function_calls, as keys */
    struct strbuf reasoning;  /* a reasoning item's text, for the next assistant turn */
    bool has_reasoning;
};

static int nomem(const struct json_reader *at)
{
    return json_reader_fail_plain(at, INFERD_ENOMEM, "out of memory");
}

/* A content given as a string, or as parts whose texts are joined (as chat joins text parts). */
static int read_text_content(const struct json_reader *content, struct strbuf *out)
{
    const char *s;
    size_t len = 0, n = 0;
    struct json_reader parts;
    int rc;
    if (!content->v)
        return json_reader_fail(content, INFERD_EINVAL,
                                "is required: a string or an array of input_text parts");
    if (json_object_is_type(content->v, json_type_string)) {
        if ((rc = json_read_str(content, NULL, JSON_REQUIRED, &s, &len)))
            return rc;
        return strbuf_append(out, s, len) ? 0 : nomem(content);
    }
    if (!json_object_is_type(content->v, json_type_array))
        return json_reader_fail(content, INFERD_EINVAL,
                                "must be a string or an array of content parts, got %s",
                                json_type_phrase(content->v));
    if ((rc = json_read_array(content, NULL, JSON_REQUIRED, &parts, &n)))
        return rc;
    for (size_t k = 0; k < n; k++) {
        struct json_reader part = json_reader_element(&parts, k), obj;
        const char *type, *field = "text";
        if ((rc = json_read_object(&part, NULL, JSON_REQUIRED, &obj)) ||
            (rc = json_read_str(&part, "type", JSON_REQUIRED, &type, NULL)))
            return rc;
        struct json_reader at = json_reader_member(&part, "type");
        if (!strcmp(type, "input_image") || !strcmp(type, "input_file") ||
            !strcmp(type, "input_audio"))
            return json_reader_fail(&at, INFERD_EINVAL,
                                    "is \"%s\", which is not supported by this model: it reads "
                                    "text only; send input_text parts",
                                    type);
        if (!strcmp(type, "refusal"))
            field = "refusal";
        else if (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0)
            return json_reader_fail(&at, INFERD_EINVAL,
                                    "\"%.64s\" is not a supported content part type; use "
                                    "input_text (or output_text in assistant messages)",
                                    type);
        if ((rc = json_read_str(&part, field, JSON_REQUIRED, &s, &len)))
            return rc;
        if (!strbuf_append(out, s, len))
            return nomem(&part);
    }
    return 0;
}

static json_object *chat_message(const char *role, const char *content, size_t len)
{
    json_object *m = json_object_new_object();
    put(m, "role", json_object_new_string(role));
    put(m, "content", jstr(content, len));
    return m;
}

/* The reasoning item before an assistant turn becomes its reasoning_content (which the template
 * renders or drops, as transformers would); before anything else it is dropped. */
static void take_reasoning(struct parse *p, json_object *assistant)
{
    if (assistant && p->has_reasoning && p->reasoning.len > 0)
        put(assistant, "reasoning_content", jstr(p->reasoning.data, p->reasoning.len));
    strbuf_reset(&p->reasoning);
    p->has_reasoning = false;
}

static int read_message_item(struct parse *p, const struct json_reader *item)
{
    enum { USER, ASSISTANT, SYSTEM, DEVELOPER };
    static const char *const roles[] = {"user", "assistant", "system", "developer", NULL};
    int role = USER, rc;
    struct strbuf text = {0};
    if ((rc = json_read_enum(item, "role", JSON_REQUIRED, roles, &role)))
        return rc;
    struct json_reader content = json_reader_member(item, "content");
    if ((rc = read_text_content(&content, &text))) {
        strbuf_free(&text);
        return rc;
    }
    /* OpenAI's developer role is the system role of every chat template. */
    json_object *m = chat_message(role == DEVELOPER ? "system" : roles[role],
                                  text.data ? text.data : "", text.len);
    strbuf_free(&text);
    take_reasoning(p, role == ASSISTANT ? m : NULL);
    json_object_array_add(p->r->input, m);
    return 0;
}

/* A non-empty string member. */
static int read_name(const struct json_reader *item, const char *key, const char **s)
{
    size_t len = 0;
    int rc = json_read_str(item, key, JSON_REQUIRED, s, &len);
    if (!rc && len == 0) {
        struct json_reader at = json_reader_member(item, key);
        return json_reader_fail(&at, INFERD_EINVAL, "must not be empty");
    }
    return rc;
}

/* A function_call joins the assistant turn it follows (its message or earlier calls), as chat
 * shows parallel calls: one assistant message with several tool_calls. */
static int read_call_item(struct parse *p, const struct json_reader *item)
{
    const char *call_id, *name, *arguments;
    size_t args_len = 0;
    int rc;
    if ((rc = read_name(item, "call_id", &call_id)) || (rc = read_name(item, "name", &name)) ||
        (rc = json_read_str(item, "arguments", JSON_REQUIRED, &arguments, &args_len)))
        return rc;
    size_t n = json_object_array_length(p->r->input);
    json_object *last = n ? json_object_array_get_idx(p->r->input, n - 1) : NULL, *role = NULL;
    json_object *assistant = NULL;
    if (last && json_object_object_get_ex(last, "role", &role) &&
        !strcmp(json_object_get_string(role), "assistant") && !p->has_reasoning)
        assistant = last;
    if (!assistant) {
        assistant = chat_message("assistant", "", 0);
        take_reasoning(p, assistant);
        json_object_array_add(p->r->input, assistant);
    }
    json_object *calls = NULL;
    if (!json_object_object_get_ex(assistant, "tool_calls", &calls)) {
        calls = json_object_new_array();
        put(assistant, "tool_calls", calls);
    }
    json_object *fn = json_object_new_object();
    put(fn, "name", json_object_new_string(name));
    put(fn, "arguments", jstr(arguments, args_len));
    json_object *call = json_object_new_object();
    put(call, "id", json_object_new_string(call_id));
    put(call, "type", json_object_new_string("function"));
    put(call, "function", fn);
    json_object_array_add(calls, call);
    put(p->known_calls, call_id, NULL);
    return 0;
}

static int read_output_item(struct parse *p, const struct json_reader *item, size_t index)
{
    const char *call_id;
    struct strbuf text = {0};
    int rc;
    if ((rc = read_name(item, "call_id", &call_id)))
        return rc;
    struct json_reader output = json_reader_member(item, "output");
    if ((rc = read_text_content(&output, &text))) {
        strbuf_free(&text);
        return rc;
    }
    json_object *m = chat_message("tool", text.data ? text.data : "", text.len);
    strbuf_free(&text);
    put(m, "tool_call_id", json_object_new_string(call_id));
    take_reasoning(p, NULL);
    json_object_array_add(p->r->input, m);
    if (json_object_object_get_ex(p->known_calls, call_id, NULL))
        return 0;
    /* Its call may be in the previous response: responses_join looks there. */
    struct responses_request *r = p->r;
    struct responses_pending_output *grown =
        realloc(r->pending, (r->n_pending + 1) * sizeof *r->pending);
    if (!grown)
        return nomem(item);
    r->pending = grown;
    r->pending[r->n_pending].index = index;
    if (!(r->pending[r->n_pending].call_id = strdup(call_id)))
        return nomem(item);
    r->n_pending++;
    return 0;
}

/* The texts of a reasoning item's parts (each {type: part_type, text}), joined into out. */
static int read_reasoning_parts(const struct json_reader *item, const char *key, bool *present,
                                const char *part_type, struct strbuf *out)
{
    struct json_reader parts;
    size_t n = 0;
    int rc;
    if ((rc = json_read_array(item, key, present, &parts, &n)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        struct json_reader part = json_reader_element(&parts, i), obj;
        const char *type, *s;
        size_t len = 0;
        if ((rc = json_read_object(&part, NULL, JSON_REQUIRED, &obj)) ||
            (rc = json_read_str(&part, "type", JSON_REQUIRED, &type, NULL)))
            return rc;
        if (strcmp(type, part_type) != 0) {
            struct json_reader at = json_reader_member(&part, "type");
            return json_reader_fail(&at, INFERD_EINVAL, "must be \"%s\", got \"%.64s\"",
                                    part_type, type);
        }
        if ((rc = json_read_str(&part, "text", JSON_REQUIRED, &s, &len)))
            return rc;
        if ((out->len && !strbuf_puts(out, "\n\n")) || !strbuf_append(out, s, len))
            return nomem(&part);
    }
    return 0;
}

/* A reasoning item: its summary's texts, else its reasoning_text contents. It starts an
 * assistant turn even when it says nothing. */
static int read_reasoning_item(struct parse *p, const struct json_reader *item)
{
    struct strbuf content = {0};
    const char *s;
    int rc;
    strbuf_reset(&p->reasoning);
    if ((rc = json_read_str(item, "encrypted_content", JSON_OPTIONAL, &s, NULL)) ||
        (rc = read_reasoning_parts(item, "summary", JSON_REQUIRED, "summary_text",
                                   &p->reasoning)) ||
        (rc = read_reasoning_parts(item, "content", JSON_OPTIONAL, "reasoning_text", &content))) {
        strbuf_free(&content);
        return rc;
    }
    if (p->reasoning.len == 0 && content.len > 0 &&
        !strbuf_append(&p->reasoning, content.data, content.len)) {
        strbuf_free(&content);
        return nomem(item);
    }
    strbuf_free(&content);
    p->has_reasoning = true;
    return 0;
}

static int read_item(struct parse *p, const struct json_reader *item, size_t index)
{
    struct json_reader obj;
    const char *type = "message";
    bool has_type = false;
    int rc;
    if ((rc = json_read_object(item, NULL, JSON_REQUIRED, &obj)) ||
        (rc = json_read_str(item, "type", &has_type, &type, NULL)))
        return rc;
    if (!strcmp(type, "message"))
        return read_message_item(p, item);
    if (!strcmp(type, "function_call"))
        return read_call_item(p, item);
    if (!strcmp(type, "function_call_output"))
        return read_output_item(p, item, index);
    if (!strcmp(type, "reasoning"))
        return read_reasoning_item(p, item);
    struct json_reader at = json_reader_member(item, "type");
    return json_reader_fail(&at, INFERD_EINVAL,
                            "\"%.64s\" is not a supported input item type; the types are "
                            "message, function_call, function_call_output and reasoning",
                            type);
}

static int read_input(struct parse *p, const struct json_reader *root)
{
    struct json_reader input = json_reader_member(root, "input"), items;
    size_t n = 0;
    int rc;
    if (!(p->r->input = json_object_new_array()))
        return nomem(root);
    if (!input.v) {
        if (p->r->previous_response_id)
            return 0;
        return json_reader_fail(&input, INFERD_EINVAL,
                                "is required: a string or an array of input items");
    }
    if (json_object_is_type(input.v, json_type_string)) {
        const char *s;
        size_t len = 0;
        if ((rc = json_read_str(&input, NULL, JSON_REQUIRED, &s, &len)))
            return rc;
        json_object_array_add(p->r->input, chat_message("user", s, len));
        return 0;
    }
    if (!json_object_is_type(input.v, json_type_array))
        return json_reader_fail(&input, INFERD_EINVAL,
                                "must be a string or an array of input items, got %s",
                                json_type_phrase(input.v));
    if ((rc = json_read_array(&input, NULL, JSON_REQUIRED, &items, &n)))
        return rc;
    if (n == 0 && !p->r->previous_response_id)
        return json_reader_fail(&items, INFERD_EINVAL, "must contain at least one item");
    for (size_t i = 0; i < n; i++) {
        struct json_reader item = json_reader_element(&items, i);
        if ((rc = read_item(p, &item, i)))
            return rc;
    }
    take_reasoning(p, NULL);
    return 0;
}

/* ---- tools ---- */

static bool chat_tools_have(json_object *tools, const char *name)
{
    size_t n = tools ? json_object_array_length(tools) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *fn = NULL, *fname = NULL;
        json_object_object_get_ex(json_object_array_get_idx(tools, i), "function", &fn);
        json_object_object_get_ex(fn, "name", &fname);
        if (!strcmp(json_object_get_string(fname), name))
            return true;
    }
    return false;
}

/* Function tools ({type:"function", name, description, parameters, strict}) become chat tools;
 * hosted tool types (web_search, file_search, ...) are dropped: this server runs no tools. */
static int read_tools(const struct json_reader *root, struct responses_request *r)
{
    struct json_reader tools;
    size_t n = 0;
    int rc;
    if ((rc = json_read_array(root, "tools", JSON_OPTIONAL, &tools, &n)))
        return rc;
    json_object *chat = json_object_new_array(), *echo = json_object_new_array();
    put(r->echo, "tools", echo);
    if (!chat || !echo) {
        json_object_put(chat);
        return nomem(root);
    }
    for (size_t i = 0; i < n; i++) {
        struct json_reader t = json_reader_element(&tools, i), obj;
        const char *type, *name, *description = NULL;
        bool strict = false;
        if ((rc = json_read_object(&t, NULL, JSON_REQUIRED, &obj)) ||
            (rc = json_read_str(&t, "type", JSON_REQUIRED, &type, NULL)))
            break;
        if (strcmp(type, "function") != 0)
            continue;
        if ((rc = read_name(&t, "name", &name)) ||
            (rc = json_read_str(&t, "description", JSON_OPTIONAL, &description, NULL)) ||
            (rc = json_read_bool(&t, "strict", JSON_OPTIONAL, &strict)))
            break;
        struct json_reader params = json_reader_member(&t, "parameters");
        if (params.v && !json_object_is_type(params.v, json_type_object)) {
            rc = json_reader_fail(&params, INFERD_EINVAL, "must be a JSON Schema object, got %s",
                                  json_type_phrase(params.v));
            break;
        }
        if ((rc = json_reader_check_tree(&t)))
            break;
        json_object *fn = json_object_new_object();
        put(fn, "name", json_object_new_string(name));
        if (description)
            put(fn, "description", json_object_new_string(description));
        if (params.v)
            put(fn, "parameters", json_object_get(params.v));
        json_object *ct = json_object_new_object();
        put(ct, "type", json_object_new_string("function"));
        put(ct, "function", fn);
        json_object_array_add(chat, ct);
        json_object *et = json_object_new_object();
        put(et, "type", json_object_new_string("function"));
        put(et, "name", json_object_new_string(name));
        put(et, "description", jstr_or_null(description));
        put(et, "parameters", json_object_get(params.v));
        put(et, "strict", json_object_new_boolean(strict));
        json_object_array_add(echo, et);
    }
    if (rc) {
        json_object_put(chat);
        return rc;
    }
    if (json_object_array_length(chat) > 0)
        r->gen.tools = chat;
    else
        json_object_put(chat);
    return 0;
}

static int read_tool_choice(const struct json_reader *root, struct responses_request *r)
{
    static const char *const modes[] = {"auto", "none", "required", NULL};
    static const enum gen_tool_choice mode_of[] = {GEN_TOOL_CHOICE_AUTO, GEN_TOOL_CHOICE_NONE,
                                                   GEN_TOOL_CHOICE_REQUIRED};
    struct json_reader c = json_reader_member(root, "tool_choice");
    bool have_tools = r->gen.tools != NULL;
    int rc, mode = 0;
    if (!c.v) {
        put(r->echo, "tool_choice", json_object_new_string("auto"));
        return 0;
    }
    if (json_object_is_type(c.v, json_type_string)) {
        if (json_read_enum(&c, NULL, JSON_REQUIRED, modes, &mode))
            return json_reader_fail(&c, INFERD_EINVAL,
                                    "must be \"auto\", \"none\", \"required\" or "
                                    "{\"type\":\"function\",\"name\":...}");
        if (mode_of[mode] == GEN_TOOL_CHOICE_REQUIRED && !have_tools)
            return json_reader_fail_plain(
                &c, INFERD_EINVAL, "tool_choice \"required\" needs a function tool in tools");
        r->gen.tool_choice = mode_of[mode];
        r->gen.has_tool_choice = true;
        put(r->echo, "tool_choice", json_object_new_string(modes[mode]));
        return 0;
    }
    if (!json_object_is_type(c.v, json_type_object))
        return json_reader_fail(&c, INFERD_EINVAL, "must be a string or an object, got %s",
                                json_type_phrase(c.v));
    const char *type, *name;
    if ((rc = json_read_str(&c, "type", JSON_REQUIRED, &type, NULL)))
        return rc;
    if (strcmp(type, "function") != 0) {
        struct json_reader at = json_reader_member(&c, "type");
        return json_reader_fail(&at, INFERD_EINVAL,
                                "\"%.64s\" is not supported: only function tools run here "
                                "({\"type\":\"function\",\"name\":...})",
                                type);
    }
    if ((rc = read_name(&c, "name", &name)))
        return rc;
    if (!have_tools || !chat_tools_have(r->gen.tools, name)) {
        struct json_reader at = json_reader_member(&c, "name");
        return json_reader_fail_plain(&at, INFERD_EINVAL,
                                      "tool_choice names function \"%.64s\", which is not in tools",
                                      name);
    }
    if (!(r->gen.tool_choice_name = strdup(name)))
        return nomem(&c);
    r->gen.tool_choice = GEN_TOOL_CHOICE_FUNCTION;
    r->gen.has_tool_choice = true;
    json_object *echo = json_object_new_object();
    put(echo, "type", json_object_new_string("function"));
    put(echo, "name", json_object_new_string(name));
    put(r->echo, "tool_choice", echo);
    return 0;
}

/* ---- reasoning and text ---- */

static int read_reasoning(const struct json_reader *root, struct responses_request *r)
{
    /* The values chat's reasoning_effort takes, in enum gen_reasoning_effort's order. */
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh",
                                          NULL};
    static const char *const summaries[] = {"auto", "concise", "detailed", NULL};
    struct json_reader obj;
    int effort = 0, summary = 0, generate = 0, rc;
    bool has_summary = false, has_generate = false;
    if ((rc = json_read_object(root, "reasoning", JSON_OPTIONAL, &obj)) ||
        (rc = json_read_enum(&obj, "effort", &r->gen.has_reasoning_effort, efforts, &effort)) ||
        (rc = json_read_enum(&obj, "summary", &has_summary, summaries, &summary)) ||
        (rc = json_read_enum(&obj, "generate_summary", &has_generate, summaries, &generate)))
        return rc;
    r->gen.reasoning_effort = (enum gen_reasoning_effort)effort;
    json_object *echo = json_object_new_object();
    put(echo, "effort", r->gen.has_reasoning_effort ? json_object_new_string(efforts[effort])
                                                    : NULL);
    put(echo, "summary", has_summary    ? json_object_new_string(summaries[summary])
                         : has_generate ? json_object_new_string(summaries[generate])
                                        : NULL);
    put(r->echo, "reasoning", echo);
    return 0;
}

/* text.format: plain text, or structured output (json_schema / json_object, as chat's
 * response_format); the format is echoed as sent. */
static int read_text(const struct json_reader *root, struct responses_request *r)
{
    static const char *const verbosities[] = {"low", "medium", "high", NULL};
    struct json_reader text, format;
    int verbosity = 1, rc;
    if ((rc = json_read_object(root, "text", JSON_OPTIONAL, &text)) ||
        (rc = json_read_enum(&text, "verbosity", JSON_OPTIONAL, verbosities, &verbosity)) ||
        (rc = json_read_object(&text, "format", JSON_OPTIONAL, &format)))
        return rc;
    if (format.v) {
        structured_spec_free(&r->gen.structured);
        if ((rc = structured_read_text_format(&format, &r->gen.structured)))
            return rc;
    }
    if (r->gen.structured.kind != STRUCTURED_NONE) {
        json_object *echo = json_object_new_object();
        put(echo, "format", json_object_get(format.v));
        put(echo, "verbosity", json_object_new_string(verbosities[verbosity]));
        put(r->echo, "text", echo);
        return 0;
    }
    json_object *echo = json_object_new_object(), *fmt = json_object_new_object();
    put(fmt, "type", json_object_new_string("text"));
    put(echo, "format", fmt);
    put(echo, "verbosity", json_object_new_string(verbosities[verbosity]));
    put(r->echo, "text", echo);
    return 0;
}

/* ---- the rest of the body ---- */

static int read_metadata(const struct json_reader *root, struct responses_request *r)
{
    struct json_reader m;
    int rc;
    if ((rc = json_read_object(root, "metadata", JSON_OPTIONAL, &m)))
        return rc;
    if (!m.v) {
        put(r->echo, "metadata", json_object_new_object());
        return 0;
    }
    if (json_object_object_length(m.v) > METADATA_MAX_KEYS)
        return json_reader_fail(&m, INFERD_EINVAL, "may hold at most %d keys, got %d",
                                METADATA_MAX_KEYS, json_object_object_length(m.v));
    json_object_object_foreach(m.v, key, val)
    {
        struct json_reader v = json_reader_entry(&m, key, val);
        size_t len = 0;
        const char *s;
        if (strlen(key) > METADATA_MAX_KEY)
            return json_reader_fail_plain(&m, INFERD_EINVAL,
                                          "metadata keys must be at most %d characters",
                                          METADATA_MAX_KEY);
        if ((rc = json_read_str(&v, NULL, JSON_REQUIRED, &s, &len)))
            return rc;
        if (len > METADATA_MAX_VALUE)
            return json_reader_fail(&v, INFERD_EINVAL, "must be at most %d bytes, got %zu",
                                    METADATA_MAX_VALUE, len);
    }
    if ((rc = json_reader_check_tree(&m)))
        return rc;
    put(r->echo, "metadata", json_object_get(m.v));
    return 0;
}

/* Fields that would change what a response means and that this server does not do. */
static int refuse_unsupported(const struct json_reader *root)
{
    static const char *const absent[][2] = {
        {"conversation", "conversations are not stored here: chain with previous_response_id"},
        {"prompt", "reusable prompt templates are not supported: send input and instructions"},
    };
    bool background = false;
    int64_t top_logprobs = 0;
    int rc;
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        struct json_reader at = json_reader_member(root, absent[i][0]);
        if (at.v)
            return json_reader_fail(&at, INFERD_EINVAL, "is not supported: %s", absent[i][1]);
    }
    if ((rc = json_read_bool(root, "background", JSON_OPTIONAL, &background)))
        return rc;
    if (background) {
        struct json_reader at = json_reader_member(root, "background");
        return json_reader_fail(&at, INFERD_EINVAL,
                                "true is not supported: responses run while the request waits "
                                "(stream them with stream: true)");
    }
    if ((rc = json_read_int64(root, "top_logprobs", JSON_OPTIONAL, 0, 20, &top_logprobs)))
        return rc;
    if (top_logprobs > 0) {
        struct json_reader at = json_reader_member(root, "top_logprobs");
        return json_reader_fail(&at, INFERD_EINVAL,
                                "is not supported on /v1/responses (use /v1/chat/completions "
                                "with logprobs); send 0 or leave it out");
    }
    return 0;
}

/* A string field copied into the echo as given, else null (or fallback). */
static int echo_str(const struct json_reader *root, json_object *echo, const char *key,
                    const char *fallback)
{
    const char *s = NULL;
    int rc = json_read_str(root, key, JSON_OPTIONAL, &s, NULL);
    if (!rc)
        put(echo, key, jstr_or_null(s ? s : fallback));
    return rc;
}

static int read_fields(const struct json_reader *root, struct responses_request *r)
{
    static const char *const truncations[] = {"disabled", "auto", NULL};
    struct json_reader opts, kwargs, include;
    int64_t max_output = 0, max_tool_calls = 0;
    bool has_max_output = false, has_max_tokens = false, has_max_tool_calls = false;
    bool parallel = true;
    int truncation = 0;
    size_t n = 0, id_len = 0;
    int rc;
    r->store = true;
    if ((rc = json_read_strdup(root, "previous_response_id", JSON_OPTIONAL,
                               &r->previous_response_id, &id_len)))
        return rc;
    if (r->previous_response_id && (id_len == 0 || id_len > RESPONSES_MAX_ID)) {
        struct json_reader at = json_reader_member(root, "previous_response_id");
        return json_reader_fail(&at, INFERD_EINVAL, "must be 1 to %d bytes, got %zu",
                                RESPONSES_MAX_ID, id_len);
    }
    if ((rc = json_read_strdup(root, "instructions", JSON_OPTIONAL, &r->instructions, NULL)) ||
        (rc = json_read_int64(root, "max_output_tokens", &has_max_output, 1, INT64_MAX,
                              &max_output)))
        return rc;
    if (!has_max_output &&
        (rc = json_read_int64(root, "max_tokens", &has_max_tokens, 1, INT64_MAX, &max_output)))
        return rc;
    r->gen.has_max_tokens = has_max_output || has_max_tokens;
    r->gen.max_tokens = max_output;
    if ((rc = json_read_int(root, "max_reasoning_tokens", &r->gen.has_max_reasoning_tokens, 1,
                            INT32_MAX, &r->gen.max_reasoning_tokens)))
        return rc;
    if ((rc = json_read_bool(root, "store", JSON_OPTIONAL, &r->store)) ||
        (rc = json_read_bool(root, "stream", JSON_OPTIONAL, &r->stream)) ||
        (rc = json_read_bool(root, "parallel_tool_calls", JSON_OPTIONAL, &parallel)) ||
        (rc = json_read_enum(root, "truncation", JSON_OPTIONAL, truncations, &truncation)) ||
        (rc = json_read_int64(root, "max_tool_calls", &has_max_tool_calls, 1, INT64_MAX,
                              &max_tool_calls)) ||
        (rc = json_read_object(root, "stream_options", JSON_OPTIONAL, &opts)) ||
        (rc = json_read_bool(&opts, "include_obfuscation", JSON_OPTIONAL, &(bool){false})) ||
        (rc = json_read_array(root, "include", JSON_OPTIONAL, &include, &n)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        struct json_reader inc = json_reader_element(&include, i);
        const char *s;
        if ((rc = json_read_str(&inc, NULL, JSON_REQUIRED, &s, NULL)))
            return rc;
    }
    if ((rc = json_read_strdup(root, "model", JSON_OPTIONAL, &r->gen.model, NULL)) ||
        (rc = json_read_object(root, "chat_template_kwargs", JSON_OPTIONAL, &kwargs)) ||
        (rc = json_reader_check_tree(&kwargs)))
        return rc;
    r->gen.chat_template_kwargs = json_object_get(kwargs.v);
    r->gen.has_stream = true;
    r->gen.stream = r->stream;

    json_object *e = r->echo;
    put(e, "background", json_object_new_boolean(false));
    put(e, "instructions", jstr_or_null(r->instructions));
    put(e, "max_output_tokens",
        r->gen.has_max_tokens ? json_object_new_int64(r->gen.max_tokens) : NULL);
    put(e, "max_tool_calls", has_max_tool_calls ? json_object_new_int64(max_tool_calls) : NULL);
    put(e, "parallel_tool_calls", json_object_new_boolean(parallel));
    put(e, "previous_response_id", jstr_or_null(r->previous_response_id));
    put(e, "store", json_object_new_boolean(r->store));
    put(e, "top_logprobs", json_object_new_int(0));
    put(e, "truncation", json_object_new_string(truncations[truncation]));
    put(e, "conversation", NULL);
    put(e, "prompt", NULL);
    /* user is a string or absent in the Response, never null. */
    if (json_reader_has(root, "user") && (rc = echo_str(root, e, "user", NULL)))
        return rc;
    if ((rc = echo_str(root, e, "safety_identifier", NULL)) ||
        (rc = echo_str(root, e, "prompt_cache_retention", NULL)) ||
        (rc = echo_str(root, e, "service_tier", "default")) ||
        (rc = echo_str(root, e, "prompt_cache_key", NULL)))
        return rc;
    return 0;
}

int responses_parse(const char *body, size_t len, struct responses_request *out,
                    struct api_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->gen.kind = GEN_REQUEST_CHAT;
    json_object *obj = NULL;
    int rc = gen_request_parse_object(body, len, &obj, e);
    if (rc)
        return rc;
    struct err err = {0};
    struct json_doc doc = {.err = &err, .name = "the request body",
                           .flags = GEN_REQUEST_DOC_FLAGS};
    struct json_reader root = json_reader_root(&doc, obj);
    struct parse p = {.r = out, .known_calls = json_object_new_object()};
    if (!(out->echo = json_object_new_object()) || !p.known_calls)
        rc = nomem(&root);
    /* The previous response's id first: without it input is required. */
    if (rc || (rc = read_fields(&root, out)) || (rc = read_input(&p, &root)) ||
        (rc = gen_request_read_sampling(&root, &out->gen)) ||
        (rc = gen_request_read_cache_identity(&root, &out->gen)) ||
        (rc = read_tools(&root, out)) || (rc = read_tool_choice(&root, out)) ||
        (rc = read_reasoning(&root, out)) || (rc = read_text(&root, out)) ||
        (rc = read_metadata(&root, out)) || (rc = refuse_unsupported(&root)))
        rc = gen_request_reader_error(rc, &doc, e);
    /* The sampling fields are read after read_fields: echo them now. */
    if (!rc && out->gen.has_temperature)
        put(out->echo, "temperature", jsetting(out->gen.temperature));
    if (!rc && out->gen.has_top_p)
        put(out->echo, "top_p", jsetting(out->gen.top_p));
    json_object_put(p.known_calls);
    strbuf_free(&p.reasoning);
    json_object_put(obj);
    if (rc)
        responses_request_free(out);
    return rc;
}

void responses_request_free(struct responses_request *r)
{
    if (!r)
        return;
    gen_request_free(&r->gen);
    json_object_put(r->input);
    json_object_put(r->conversation);
    free(r->instructions);
    free(r->previous_response_id);
    json_object_put(r->echo);
    for (size_t i = 0; i < r->n_pending; i++)
        free(r->pending[i].call_id);
    free(r->pending);
    memset(r, 0, sizeof *r);
}

/* ---- joining the conversation ---- */

static bool messages_call(json_object *messages, const char *call_id)
{
    size_t n = messages ? json_object_array_length(messages) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *calls = NULL;
        if (!json_object_object_get_ex(json_object_array_get_idx(messages, i), "tool_calls",
                                       &calls) ||
            !json_object_is_type(calls, json_type_array))
            continue;
        for (size_t k = 0; k < json_object_array_length(calls); k++) {
            json_object *id = NULL;
            if (json_object_object_get_ex(json_object_array_get_idx(calls, k), "id", &id) &&
                !strcmp(json_object_get_string(id), call_id))
                return true;
        }
    }
    return false;
}

static int join_fail(struct api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int join_fail(struct api_error *e, int status, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    api_error_setv(e, status, status >= 500 ? API_ERROR_SERVER : API_ERROR_INVALID_REQUEST, param,
                   NULL, fmt, ap);
    va_end(ap);
    return status >= 500 ? -INFERD_ENOMEM : -INFERD_EINVAL;
}

int responses_join(struct responses_request *r, const char *context, size_t context_len,
                   struct api_error *e)
{
    json_object *ctx = NULL, *prev = NULL, *instr = NULL;
    struct err err = {0};
    if (context) {
        if (json_text_parse(context, context_len, GEN_REQUEST_MAX_DEPTH, true, &ctx, &err) < 0 ||
            !json_object_is_type(ctx, json_type_object)) {
            json_object_put(ctx);
            return join_fail(e, 500, NULL, "the stored response cannot be read: %s", err.msg);
        }
        json_object_object_get_ex(ctx, "messages", &prev);
        json_object_object_get_ex(ctx, "instructions", &instr);
        if (!json_object_is_type(prev, json_type_array))
            prev = NULL;
    }
    for (size_t i = 0; i < r->n_pending; i++) {
        if (messages_call(prev, r->pending[i].call_id))
            continue;
        char param[64];
        snprintf(param, sizeof param, "input[%zu].call_id", r->pending[i].index);
        json_object_put(ctx);
        return join_fail(e, 400, param,
                         "%s: no function_call with call_id \"%.64s\" comes before this output "
                         "(in input, or in the previous response)",
                         param, r->pending[i].call_id);
    }
    if (!r->instructions && json_object_is_type(instr, json_type_string)) {
        r->instructions = strdup(json_object_get_string(instr));
        put(r->echo, "instructions", jstr_or_null(r->instructions));
    }
    json_object *conv = json_object_new_array(), *messages = json_object_new_array();
    size_t n_prev = prev ? json_object_array_length(prev) : 0;
    for (size_t i = 0; i < n_prev; i++)
        json_object_array_add(conv, json_object_get(json_object_array_get_idx(prev, i)));
    for (size_t i = 0; i < json_object_array_length(r->input); i++)
        json_object_array_add(conv, json_object_get(json_object_array_get_idx(r->input, i)));
    json_object_put(ctx);

    size_t n = json_object_array_length(conv), from = 0;
    if (r->instructions && r->instructions[0]) {
        /* One leading system message: templates give only the first one its place. */
        json_object *first = n ? json_object_array_get_idx(conv, 0) : NULL, *role = NULL,
                    *content = NULL;
        struct strbuf sys = {0};
        strbuf_puts(&sys, r->instructions);
        if (first && json_object_object_get_ex(first, "role", &role) &&
            !strcmp(json_object_get_string(role), "system") &&
            json_object_object_get_ex(first, "content", &content) &&
            json_object_is_type(content, json_type_string)) {
            strbuf_puts(&sys, "\n\n");
            strbuf_append(&sys, json_object_get_string(content),
                          (size_t)json_object_get_string_len(content));
            from = 1;
        }
        json_object_array_add(messages, chat_message("system", sys.data ? sys.data : "", sys.len));
        bool failed = sys.failed;
        strbuf_free(&sys);
        if (failed) {
            json_object_put(conv);
            json_object_put(messages);
            return join_fail(e, 500, NULL, "out of memory");
        }
    }
    for (size_t i = from; i < n; i++)
        json_object_array_add(messages, json_object_get(json_object_array_get_idx(conv, i)));
    if (json_object_array_length(messages) == 0) {
        json_object_put(conv);
        json_object_put(messages);
        return join_fail(e, 400, "input",
                         "input: the conversation is empty; send input items (or instructions)");
    }
    json_object_put(r->conversation);
    json_object_put(r->gen.messages);
    r->conversation = conv;
    r->gen.messages = messages;
    return 0;
}

/* ======================================================================
 * The output: items, Response objects, events
 * ====================================================================== */

enum item_kind { ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

struct item {
    enum item_kind kind;
    char id[48];
    struct strbuf text;    /* the reasoning, the message's text, or the call's arguments */
    char *call_id, *name;  /* owned; ITEM_CALL */
    int tool_index;        /* ITEM_CALL: generation_tool_delta.index */
    const char *status;    /* "in_progress", "completed" or "incomplete" */
};

struct responses_writer {
    char id[RESPONSES_MAX_ID + 1];
    char *model;             /* owned */
    time_t created_at, completed_at;
    json_object *echo;       /* owned; the request's fields, defaults filled */
    const struct tokenizer *tok;
    struct item *items;      /* owned; n_items */
    size_t n_items, cap_items;
    int open;                /* the item text goes to, -1 none */
    uint64_t seq;            /* the next event's sequence_number */
    const char *status;      /* "in_progress", "completed", "incomplete", "failed" */
    bool finished;
    char error[256];         /* with "failed" */
    int n_prompt, n_cached, n_generated, n_reasoning;
};

int responses_writer_create(const struct responses_request *r,
                            const struct responses_writer_config *cfg,
                            struct responses_writer **out)
{
    *out = NULL;
    struct responses_writer *w = calloc(1, sizeof *w);
    if (!w)
        return -INFERD_ENOMEM;
    snprintf(w->id, sizeof w->id, "%s", cfg->id);
    w->model = strdup(cfg->model ? cfg->model : "");
    w->created_at = cfg->created_at;
    w->tok = cfg->tok;
    w->open = -1;
    w->status = "in_progress";
    if (!w->model || json_object_deep_copy(r->echo, &w->echo, NULL) != 0) {
        responses_writer_free(w);
        return -INFERD_ENOMEM;
    }
    if (!json_object_object_get_ex(w->echo, "temperature", NULL))
        put(w->echo, "temperature", jsetting(cfg->temperature));
    if (!json_object_object_get_ex(w->echo, "top_p", NULL))
        put(w->echo, "top_p", jsetting(cfg->top_p));
    *out = w;
    return 0;
}

void responses_writer_free(struct responses_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_items; i++) {
        strbuf_free(&w->items[i].text);
        free(w->items[i].call_id);
        free(w->items[i].name);
    }
    free(w->items);
    free(w->model);
    json_object_put(w->echo);
    free(w);
}

bool responses_writer_finished(const struct responses_writer *w)
{
    return w->finished;
}

bool responses_writer_succeeded(const struct responses_writer *w)
{
    return w->finished && strcmp(w->status, "failed") != 0;
}

/* ---- JSON of items and the Response ---- */

/* An item as it is now; fresh: as it is when it opens (no text yet, in progress). */
static json_object *item_json(const struct item *it, bool fresh)
{
    json_object *o = json_object_new_object();
    put(o, "id", json_object_new_string(it->id));
    const char *text = fresh || !it->text.data ? "" : it->text.data;
    size_t len = fresh ? 0 : it->text.len;
    const char *status = fresh ? "in_progress" : it->status;
    switch (it->kind) {
    case ITEM_REASONING: {
        put(o, "type", json_object_new_string("reasoning"));
        json_object *summary = json_object_new_array();
        if (!fresh) {
            json_object *part = json_object_new_object();
            put(part, "type", json_object_new_string("summary_text"));
            put(part, "text", jstr(text, len));
            json_object_array_add(summary, part);
        }
        put(o, "summary", summary);
        put(o, "status", json_object_new_string(status));
        break;
    }
    case ITEM_MESSAGE: {
        put(o, "type", json_object_new_string("message"));
        put(o, "role", json_object_new_string("assistant"));
        put(o, "status", json_object_new_string(status));
        json_object *content = json_object_new_array();
        if (!fresh) {
            json_object *part = json_object_new_object();
            put(part, "type", json_object_new_string("output_text"));
            put(part, "text", jstr(text, len));
            put(part, "annotations", json_object_new_array());
            put(part, "logprobs", json_object_new_array());
            json_object_array_add(content, part);
        }
        put(o, "content", content);
        break;
    }
    case ITEM_CALL:
        put(o, "type", json_object_new_string("function_call"));
        put(o, "status", json_object_new_string(status));
        put(o, "call_id", json_object_new_string(it->call_id ? it->call_id : ""));
        put(o, "name", json_object_new_string(it->name ? it->name : ""));
        put(o, "arguments", jstr(text, len));
        break;
    }
    return o;
}

static json_object *usage_json(const struct responses_writer *w)
{
    json_object *u = json_object_new_object(), *in = json_object_new_object(),
                *outd = json_object_new_object();
    put(u, "input_tokens", json_object_new_int(w->n_prompt));
    put(in, "cached_tokens", json_object_new_int(w->n_cached));
    put(u, "input_tokens_details", in);
    put(u, "output_tokens", json_object_new_int(w->n_generated));
    put(outd, "reasoning_tokens", json_object_new_int(w->n_reasoning));
    put(u, "output_tokens_details", outd);
    put(u, "total_tokens", json_object_new_int(w->n_prompt + w->n_generated));
    return u;
}

/* The Response object; early: as response.created shows it (no output yet). */
static json_object *response_json(const struct responses_writer *w, bool early)
{
    json_object *o = json_object_new_object();
    put(o, "id", json_object_new_string(w->id));
    put(o, "object", json_object_new_string("response"));
    put(o, "created_at", json_object_new_int64(w->created_at));
    put(o, "status", json_object_new_string(early ? "in_progress" : w->status));
    put(o, "completed_at", !early && w->completed_at ? json_object_new_int64(w->completed_at)
                                                     : NULL);
    json_object *error = NULL;
    if (!early && !strcmp(w->status, "failed")) {
        error = json_object_new_object();
        put(error, "code", json_object_new_string("server_error"));
        put(error, "message", json_object_new_string(w->error));
    }
    put(o, "error", error);
    json_object *incomplete = NULL;
    if (!early && !strcmp(w->status, "incomplete")) {
        incomplete = json_object_new_object();
        put(incomplete, "reason", json_object_new_string("max_output_tokens"));
    }
    put(o, "incomplete_details", incomplete);
    put(o, "model", json_object_new_string(w->model));
    json_object *output = json_object_new_array();
    for (size_t i = 0; !early && i < w->n_items; i++)
        json_object_array_add(output, item_json(&w->items[i], false));
    put(o, "output", output);
    put(o, "usage", early || !w->finished ? NULL : usage_json(w));
    json_object_object_foreach(w->echo, key, val)
        put(o, key, json_object_get(val));
    return o;
}

json_object *responses_writer_response(const struct responses_writer *w)
{
    return response_json(w, false);
}

/* ---- events ---- */

static json_object *event_new(const char *type)
{
    json_object *ev = json_object_new_object();
    put(ev, "type", json_object_new_string(type));
    return ev;
}

/* Adds sequence_number and appends `event: TYPE` and `data: JSON`; drops ev when not streaming. */
static void emit(struct responses_writer *w, struct strbuf *out, json_object *ev)
{
    if (!out) {
        json_object_put(ev);
        return;
    }
    json_object *type = NULL;
    json_object_object_get_ex(ev, "type", &type);
    put(ev, "sequence_number", json_object_new_int64((int64_t)w->seq++));
    size_t len = 0;
    const char *s = json_object_to_json_string_length(
        ev, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    strbuf_printf(out, "event: %s\ndata: ", json_object_get_string(type));
    if (s)
        strbuf_append(out, s, len);
    strbuf_puts(out, "\n\n");
    json_object_put(ev);
}

static json_object *item_event(const char *type, const struct item *it, size_t index)
{
    json_object *ev = event_new(type);
    put(ev, "item_id", json_object_new_string(it->id));
    put(ev, "output_index", json_object_new_int64((int64_t)index));
    return ev;
}

static json_object *text_part(const char *type, const char *text, size_t len)
{
    json_object *part = json_object_new_object();
    put(part, "type", json_object_new_string(type));
    put(part, "text", jstr(text, len));
    if (!strcmp(type, "output_text")) {
        put(part, "annotations", json_object_new_array());
        put(part, "logprobs", json_object_new_array());
    }
    return part;
}

static void response_event(struct responses_writer *w, struct strbuf *out, const char *type,
                           bool early)
{
    json_object *ev = event_new(type);
    put(ev, "response", response_json(w, early));
    emit(w, out, ev);
}

void responses_writer_start(struct responses_writer *w, struct strbuf *out)
{
    response_event(w, out, "response.created", true);
    response_event(w, out, "response.in_progress", true);
}

/* The done events of item i, which gets status. */
static void close_item(struct responses_writer *w, size_t i, const char *status,
                       struct strbuf *out)
{
    struct item *it = &w->items[i];
    const char *text = it->text.data ? it->text.data : "";
    json_object *ev;
    it->status = status;
    switch (it->kind) {
    case ITEM_REASONING:
        ev = item_event("response.reasoning_summary_text.done", it, i);
        put(ev, "summary_index", json_object_new_int(0));
        put(ev, "text", jstr(text, it->text.len));
        emit(w, out, ev);
        ev = item_event("response.reasoning_summary_part.done", it, i);
        put(ev, "summary_index", json_object_new_int(0));
        put(ev, "part", text_part("summary_text", text, it->text.len));
        emit(w, out, ev);
        break;
    case ITEM_MESSAGE:
        ev = item_event("response.output_text.done", it, i);
        put(ev, "content_index", json_object_new_int(0));
        put(ev, "text", jstr(text, it->text.len));
        put(ev, "logprobs", json_object_new_array());
        emit(w, out, ev);
        ev = item_event("response.content_part.done", it, i);
        put(ev, "content_index", json_object_new_int(0));
        put(ev, "part", text_part("output_text", text, it->text.len));
        emit(w, out, ev);
        break;
    case ITEM_CALL:
        ev = item_event("response.function_call_arguments.done", it, i);
        put(ev, "name", json_object_new_string(it->name ? it->name : ""));
        put(ev, "arguments", jstr(text, it->text.len));
        emit(w, out, ev);
        break;
    }
    ev = event_new("response.output_item.done");
    put(ev, "output_index", json_object_new_int64((int64_t)i));
    put(ev, "item", item_json(it, false));
    emit(w, out, ev);
    if (w->open == (int)i)
        w->open = -1;
}

/* Opens a new item (closing the open one): its added events. NULL when memory ran out. */
static struct item *open_item(struct responses_writer *w, enum item_kind kind, struct strbuf *out)
{
    static const char *const prefixes[] = {"rs_", "msg_", "fc_"};
    if (w->open >= 0)
        close_item(w, (size_t)w->open, "completed", out);
    if (w->n_items == w->cap_items) {
        size_t cap = w->cap_items ? w->cap_items * 2 : 4;
        struct item *grown = realloc(w->items, cap * sizeof *grown);
        if (!grown)
            return NULL;
        w->items = grown;
        w->cap_items = cap;
    }
    size_t i = w->n_items++;
    struct item *it = &w->items[i];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->status = "in_progress";
    generation_random_id(it->id, sizeof it->id, prefixes[kind]);
    w->open = (int)i;
    return it;
}

/* The added events of item i, once its call_id and name are known. */
static void announce_item(struct responses_writer *w, size_t i, struct strbuf *out)
{
    struct item *it = &w->items[i];
    json_object *ev = event_new("response.output_item.added");
    put(ev, "output_index", json_object_new_int64((int64_t)i));
    put(ev, "item", item_json(it, true));
    emit(w, out, ev);
    if (it->kind == ITEM_REASONING) {
        ev = item_event("response.reasoning_summary_part.added", it, i);
        put(ev, "summary_index", json_object_new_int(0));
        put(ev, "part", text_part("summary_text", "", 0));
        emit(w, out, ev);
    } else if (it->kind == ITEM_MESSAGE) {
        ev = item_event("response.content_part.added", it, i);
        put(ev, "content_index", json_object_new_int(0));
        put(ev, "part", text_part("output_text", "", 0));
        emit(w, out, ev);
    }
}

/* Text for the open item of kind (opening one when another kind, or nothing, is open). */
static void add_text(struct responses_writer *w, enum item_kind kind, const char *s, size_t len,
                     struct strbuf *out)
{
    if (len == 0)
        return;
    if (w->open < 0 || w->items[w->open].kind != kind) {
        if (!open_item(w, kind, out))
            return;
        announce_item(w, (size_t)w->open, out);
    }
    size_t i = (size_t)w->open;
    struct item *it = &w->items[i];
    strbuf_append(&it->text, s, len);
    json_object *ev;
    if (kind == ITEM_REASONING) {
        ev = item_event("response.reasoning_summary_text.delta", it, i);
        put(ev, "summary_index", json_object_new_int(0));
    } else {
        ev = item_event("response.output_text.delta", it, i);
        put(ev, "content_index", json_object_new_int(0));
        put(ev, "logprobs", json_object_new_array());
    }
    put(ev, "delta", jstr(s, len));
    emit(w, out, ev);
}

static void add_tool_delta(struct responses_writer *w, const struct generation_tool_delta *d,
                           struct strbuf *out)
{
    ssize_t at = -1;
    for (size_t i = w->n_items; i-- > 0;) {
        if (w->items[i].kind == ITEM_CALL && w->items[i].tool_index == d->index) {
            at = (ssize_t)i;
            break;
        }
    }
    if (at < 0 || d->id || d->name) {
        struct item *it = open_item(w, ITEM_CALL, out);
        if (!it)
            return;
        it->tool_index = d->index;
        if (d->id)
            it->call_id = strdup(d->id);
        else {
            char id[32];
            generation_random_id(id, sizeof id, "call_");
            it->call_id = strdup(id);
        }
        it->name = strdup(d->name ? d->name : "");
        at = w->open;
        announce_item(w, (size_t)at, out);
    }
    size_t len = d->arguments ? strlen(d->arguments) : 0;
    if (len == 0)
        return;
    struct item *it = &w->items[at];
    strbuf_append(&it->text, d->arguments, len);
    json_object *ev = item_event("response.function_call_arguments.delta", it, (size_t)at);
    put(ev, "delta", jstr(d->arguments, len));
    emit(w, out, ev);
}

/* About how many generated tokens were reasoning: the reasoning text's tokens and its tags. */
static int count_reasoning_tokens(const struct responses_writer *w)
{
    struct strbuf all = {0};
    bool answered = false;
    for (size_t i = 0; i < w->n_items; i++) {
        if (w->items[i].kind == ITEM_REASONING)
            strbuf_append(&all, w->items[i].text.data ? w->items[i].text.data : "",
                          w->items[i].text.len);
        else if (w->items[i].text.len > 0 || w->items[i].kind == ITEM_CALL)
            answered = true;
    }
    if (all.len == 0) {
        strbuf_free(&all);
        return 0;
    }
    int n = answered ? 2 : 1; /* <think>, and </think> when an answer followed */
    int32_t *ids = NULL;
    int n_ids = 0;
    struct err err = {0};
    if (w->tok && !all.failed && tok_encode(w->tok, all.data, all.len, false, &ids, &n_ids, &err) == 0)
        n += n_ids;
    free(ids);
    strbuf_free(&all);
    return n < w->n_generated ? n : w->n_generated;
}

static void finish(struct responses_writer *w, const struct gen_news *o, struct strbuf *out)
{
    w->n_prompt = o->n_prompt;
    w->n_cached = o->n_cached;
    w->n_generated = o->n_generated;
    w->finished = true;
    if (o->finish != GEN_FINISH_STOP && o->finish != GEN_FINISH_LENGTH) {
        snprintf(w->error, sizeof w->error, "%s",
                 o->finish == GEN_FINISH_ERROR ? o->error : "the request was cancelled");
        w->status = "failed";
        if (w->open >= 0)
            w->items[w->open].status = "incomplete";
        w->open = -1;
        w->n_reasoning = count_reasoning_tokens(w);
        json_object *ev = event_new("error");
        put(ev, "code", json_object_new_string("server_error"));
        put(ev, "message", json_object_new_string(w->error));
        put(ev, "param", NULL);
        emit(w, out, ev);
        response_event(w, out, "response.failed", false);
        return;
    }
    bool cut = o->finish == GEN_FINISH_LENGTH;
    bool answered = false;
    for (size_t i = 0; i < w->n_items; i++)
        answered |= w->items[i].kind != ITEM_REASONING;
    if (!answered && open_item(w, ITEM_MESSAGE, out))
        announce_item(w, (size_t)w->open, out);
    if (w->open >= 0)
        close_item(w, (size_t)w->open, cut ? "incomplete" : "completed", out);
    w->status = cut ? "incomplete" : "completed";
    if (!cut)
        w->completed_at = time(NULL);
    w->n_reasoning = count_reasoning_tokens(w);
    response_event(w, out, cut ? "response.incomplete" : "response.completed", false);
}

void responses_writer_feed(struct responses_writer *w, const struct generation_news *n,
                           struct strbuf *out)
{
    if (w->finished)
        return;
    if (n->split) {
        add_text(w, ITEM_REASONING, n->text.reasoning, n->text.reasoning_len, out);
        add_text(w, ITEM_MESSAGE, n->text.content, n->text.content_len, out);
    } else {
        add_text(w, ITEM_MESSAGE, n->out.text, n->out.text_len, out);
    }
    if (n->out.finish != GEN_RUNNING) {
        add_text(w, ITEM_REASONING, n->tail.reasoning, n->tail.reasoning_len, out);
        add_text(w, ITEM_MESSAGE, n->tail.content, n->tail.content_len, out);
    }
    for (size_t i = 0; i < n->n_tools; i++)
        add_tool_delta(w, &n->tools[i], out);
    if (n->out.finish != GEN_RUNNING)
        finish(w, &n->out, out);
}

char *responses_writer_context(const struct responses_writer *w,
                               const struct responses_request *r, size_t *len)
{
    struct strbuf content = {0}, reasoning = {0};
    json_object *calls = json_object_new_array();
    for (size_t i = 0; i < w->n_items; i++) {
        const struct item *it = &w->items[i];
        const char *text = it->text.data ? it->text.data : "";
        if (it->kind == ITEM_MESSAGE)
            strbuf_append(&content, text, it->text.len);
        else if (it->kind == ITEM_REASONING)
            strbuf_append(&reasoning, text, it->text.len);
        else {
            json_object *fn = json_object_new_object(), *call = json_object_new_object();
            put(fn, "name", json_object_new_string(it->name ? it->name : ""));
            put(fn, "arguments", jstr(text, it->text.len));
            put(call, "id", json_object_new_string(it->call_id ? it->call_id : ""));
            put(call, "type", json_object_new_string("function"));
            put(call, "function", fn);
            json_object_array_add(calls, call);
        }
    }
    json_object *answer = chat_message("assistant", content.data ? content.data : "", content.len);
    if (reasoning.len > 0)
        put(answer, "reasoning_content", jstr(reasoning.data, reasoning.len));
    if (json_object_array_length(calls) > 0)
        put(answer, "tool_calls", calls);
    else
        json_object_put(calls);
    bool failed = content.failed || reasoning.failed;
    strbuf_free(&content);
    strbuf_free(&reasoning);

    json_object *messages = json_object_new_array();
    size_t n = r->conversation ? json_object_array_length(r->conversation) : 0;
    for (size_t i = 0; i < n; i++)
        json_object_array_add(messages,
                              json_object_get(json_object_array_get_idx(r->conversation, i)));
    json_object_array_add(messages, answer);
    json_object *ctx = json_object_new_object();
    put(ctx, "instructions", jstr_or_null(r->instructions));
    put(ctx, "messages", messages);
    size_t n_out = 0;
    const char *s = json_object_to_json_string_length(
        ctx, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n_out);
    char *copy = s && !failed ? strndup(s, n_out) : NULL;
    json_object_put(ctx);
    if (copy && len)
        *len = n_out;
    return copy;
}

/* ======================================================================
 * Routes
 * ====================================================================== */

static void send_json_object(struct http_exchange *x, int status, json_object *o)
{
    size_t len;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, status, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the response");
    json_object_put(o);
}

/* Keeps a finished response for GET and for previous_response_id, when the request asked. */
static void store_response(struct server *srv, const struct responses_request *r,
                           const struct responses_writer *w)
{
    if (!r->store || !srv->responses || !responses_writer_succeeded(w))
        return;
    json_object *resp = responses_writer_response(w);
    size_t resp_len = 0, ctx_len = 0;
    const char *resp_text = json_object_to_json_string_length(
        resp, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &resp_len);
    char *ctx = responses_writer_context(w, r, &ctx_len);
    struct err err = {0};
    if (!resp_text || !ctx)
        log_warn("responses: out of memory storing %s", w->id);
    else if (response_store_put(srv->responses, w->id, resp_text, resp_len, ctx, ctx_len, &err) <
             0)
        log_warn("responses: %s not stored: %s", w->id, err.msg);
    free(ctx);
    json_object_put(resp);
}

/* One streamed response. */
struct stream {
    struct server *srv;
    struct generation *gen;       /* owned */
    struct responses_writer *w;   /* owned */
    struct responses_request req; /* owned; the conversation, stored at the finish */
    bool started;
};

static void stream_free(struct stream *s)
{
    if (!s)
        return;
    generation_free(s->gen);
    responses_writer_free(s->w);
    responses_request_free(&s->req);
    free(s);
}

static bool stream_produce(void *ctx, struct strbuf *out, bool *done)
{
    struct stream *s = ctx;
    if (!s->started) {
        s->started = true;
        responses_writer_start(s->w, out);
        return true;
    }
    while (out->len == 0 && !*done) {
        struct generation_news n;
        if (generation_next(s->gen, SSE_KEEPALIVE_MS, &n) < 0)
            return false;
        bool quiet = n.out.finish == GEN_RUNNING && n.out.text_len == 0 && n.n_tools == 0;
        responses_writer_feed(s->w, &n, out);
        generation_news_free(&n);
        if (responses_writer_finished(s->w)) {
            store_response(s->srv, &s->req, s->w);
            *done = true;
        } else if (quiet && out->len == 0) {
            /* A long prefill sends nothing for a while: a comment keeps the connection from
             * reading as idle; SSE clients skip it. */
            strbuf_puts(out, ": keep-alive\n\n");
        }
    }
    return true;
}

static void stream_release(void *ctx)
{
    stream_free(ctx);
}

/* The chat path names its own fields in errors; a Responses client sent others. */
static void rename_param(struct api_error *e)
{
    if (!strcmp(e->param, "messages"))
        snprintf(e->param, sizeof e->param, "input");
    else if (!strcmp(e->param, "max_tokens"))
        snprintf(e->param, sizeof e->param, "max_output_tokens");
}

/* The previous response's context, or a 404 naming it. Returns 1 with *ctx (malloc'd), 0 with
 * e filled. */
static int previous_context(struct server *srv, const char *id, char **ctx, size_t *len,
                            struct api_error *e)
{
    int rc = srv->responses ? response_store_get(srv->responses, id, NULL, NULL, ctx, len) : 0;
    if (rc < 0) {
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return 0;
    }
    if (rc == 0) {
        api_error_set(e, 404, API_ERROR_NOT_FOUND, "previous_response_id",
                      "previous_response_not_found",
                      "previous_response_id '%.128s' not found or expired", id);
        return 0;
    }
    return 1;
}

void responses_create(struct http_exchange *x)
{
    struct server *srv = x->srv;
    struct api_error e;
    memset(&e, 0, sizeof e);
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return;
    }
    s->srv = srv;
    char *ctx = NULL;
    size_t ctx_len = 0;
    bool ok = generation_admit(srv, &e) == 0 && responses_parse(x->body, x->body_len, &s->req, &e) == 0;
    if (ok && s->req.previous_response_id)
        ok = previous_context(srv, s->req.previous_response_id, &ctx, &ctx_len, &e);
    ok = ok && responses_join(&s->req, ctx, ctx_len, &e) == 0;
    free(ctx);
    struct served_model *sm = NULL;
    if (ok && (served_model_acquire(srv, s->req.gen.model, &sm, &e) < 0 ||
               generation_start(x, sm, &s->req.gen, &s->gen, &e) < 0)) {
        rename_param(&e);
        ok = false;
    }
    const struct served_model *run = s->gen ? generation_model(s->gen) : &srv->served;
    char id[48];
    generation_random_id(id, sizeof id, "resp_");
    struct responses_writer_config cfg = {
        .id = id,
        .model = run->id,
        .created_at = time(NULL),
        .temperature = s->req.gen.has_temperature ? s->req.gen.temperature
                                                  : run->defaults.temperature,
        .top_p = s->req.gen.has_top_p ? s->req.gen.top_p : run->defaults.top_p,
        .tok = run->tok,
    };
    if (ok && responses_writer_create(&s->req, &cfg, &s->w) < 0) {
        api_error_set(&e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        ok = false;
    }
    if (!ok) {
        stream_free(s);
        http_send_error(x, &e);
        return;
    }
    if (s->req.stream) {
        http_send_stream(x, 200, "text/event-stream",
                         (struct http_stream){stream_produce, stream_release, s});
        return;
    }
    struct generation_news all;
    if (generation_collect(s->gen, &all, &e) < 0) {
        stream_free(s);
        http_send_error(x, &e);
        return;
    }
    responses_writer_feed(s->w, &all, NULL);
    generation_news_free(&all);
    store_response(srv, &s->req, s->w);
    send_json_object(x, 200, responses_writer_response(s->w));
    stream_free(s);
}

static void send_not_found(struct http_exchange *x)
{
    http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, "not_found",
                     "Response with id '%.128s' not found (never stored, store false, deleted, "
                     "or expired).",
                     x->id);
}

void responses_get(struct http_exchange *x)
{
    char *resp = NULL;
    size_t len = 0;
    int rc = x->srv->responses
                 ? response_store_get(x->srv->responses, x->id, &resp, &len, NULL, NULL)
                 : 0;
    if (rc < 0)
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
    else if (rc == 0)
        send_not_found(x);
    else
        http_send_json(x, 200, resp, len);
    free(resp);
}

void responses_delete(struct http_exchange *x)
{
    if (!x->srv->responses || !response_store_delete(x->srv->responses, x->id)) {
        send_not_found(x);
        return;
    }
    json_object *o = json_object_new_object();
    put(o, "id", json_object_new_string(x->id));
    put(o, "object", json_object_new_string("response.deleted"));
    put(o, "deleted", json_object_new_boolean(true));
    send_json_object(x, 200, o);
}
