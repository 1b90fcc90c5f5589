/* api/anthropic.c — the Anthropic Messages wire format: a Messages body translated into the
 * API-neutral request (checked field by field, errors naming the path), the message object and
 * its event stream made from the generation's output, and count_tokens. */
#include "api/anthropic.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/engine_proxy.h"
#include "api/keys.h"
#include "api/model_pool.h"
#include "api/prompt.h"
#include "base/err.h"
#include "base/json.h"
#include "base/timer.h"

/* Longest silence on a stream before a ping event goes out. */
#define SSE_KEEPALIVE_MS 15000

/* ---- small helpers ------------------------------------------------------------ */

static json_object *jstr(const char *s, size_t len)
{
    return json_object_new_string_len(s ? s : "", (int)len);
}

static bool append_json(struct strbuf *out, json_object *o)
{
    size_t len = 0;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    return s && strbuf_append(out, s, len);
}

/* ---- request: errors ------------------------------------------------------------ */

static int fail_nomem(struct api_error *e)
{
    api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory while parsing the request");
    return -INFERD_ENOMEM;
}

static int nomem(const struct json_reader *r)
{
    return json_reader_fail_plain(r, INFERD_ENOMEM, "out of memory");
}

/* ---- request: the parse's state -------------------------------------------------- */

/* A tool_use block met in an assistant message, waiting for its tool_result. */
struct tool_use_seen {
    const char *id; /* borrowed from the document */
    size_t msg, block;
    bool answered;
};

struct parse {
    struct anthropic_request *out;
    enum anthropic_body kind;
    const struct json_reader *root;
    struct tool_use_seen *uses; /* owned; n_uses */
    size_t n_uses, cap_uses;
    /* The last cache_control breakpoint: 0 none, 1 on tools, 2 in system, 3 in a message. */
    int bp_level;
    size_t bp_msg, bp_block; /* with 2: bp_block; with 3: both */
    bool has_system;         /* the conversation starts with the system message */
};

static json_object *text_part(const char *s, size_t len)
{
    json_object *p = json_object_new_object();
    if (p) {
        json_object_object_add(p, "type", json_object_new_string("text"));
        json_object_object_add(p, "text", jstr(s, len));
    }
    return p;
}

static json_object *message_of(const char *role, json_object *content)
{
    json_object *m = json_object_new_object();
    if (!m) {
        json_object_put(content);
        return NULL;
    }
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", content);
    return m;
}

/* Checks an optional cache_control member of block: {"type":"ephemeral", "ttl"?: "5m"|"1h"}.
 * *present says whether the block is a breakpoint. */
static int check_cache_control(const struct json_reader *block, bool *present)
{
    static const char *const types[] = {"ephemeral", NULL};
    static const char *const ttls[] = {"5m", "1h", NULL};
    struct json_reader cc;
    int t = 0, ttl = 0;
    int rc;
    *present = false;
    if ((rc = json_read_object(block, "cache_control", present, &cc)) || !*present)
        return rc;
    if ((rc = json_read_enum(&cc, "type", JSON_REQUIRED, types, &t)) ||
        (rc = json_read_enum(&cc, "ttl", JSON_OPTIONAL, ttls, &ttl)))
        return rc;
    return 0;
}

/* The "type" of a content block, required. */
static int block_type(const struct json_reader *b, const char **type)
{
    struct json_reader obj;
    int rc = json_read_object(b, NULL, JSON_REQUIRED, &obj);
    if (rc)
        return rc;
    struct json_reader t = json_reader_member(b, "type");
    if (!t.v)
        return json_reader_fail(&t, INFERD_EINVAL, "is required in a content block");
    return json_read_str(&t, NULL, JSON_REQUIRED, type, NULL);
}

static int refuse_media(const struct json_reader *b, const char *type)
{
    struct json_reader t = json_reader_member(b, "type");
    return json_reader_fail(&t, INFERD_EINVAL,
                            "is \"%s\": %s content blocks are not supported by this model, "
                            "which reads text only; send text blocks",
                            type, type);
}

static int refuse_unknown(const struct json_reader *b, const char *type, const char *allowed)
{
    struct json_reader t = json_reader_member(b, "type");
    return json_reader_fail(&t, INFERD_EINVAL, "\"%.64s\" is not a known content block type here; "
                            "allowed: %s", type, allowed);
}

/* ---- request: system and tool results ----------------------------------------- */

/* A text block's text, required; "text" blocks only (media refused, others unknown). */
static int read_text_block(const struct json_reader *b, const char *where, const char **s,
                           size_t *len)
{
    const char *type;
    int rc = block_type(b, &type);
    if (rc)
        return rc;
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return refuse_media(b, type);
    if (strcmp(type, "text") != 0)
        return refuse_unknown(b, type, where);
    return json_read_str(b, "text", JSON_REQUIRED, s, len);
}

/* system: a string, or an array of text blocks (kept as text parts). */
static int parse_system(struct parse *p, json_object *msgs)
{
    struct json_reader sys = json_reader_member(p->root, "system");
    const char *s;
    size_t len, n;
    int rc;
    if (!sys.v)
        return 0;
    json_object *content;
    if (json_object_is_type(sys.v, json_type_string)) {
        if ((rc = json_read_str(&sys, NULL, JSON_REQUIRED, &s, &len)))
            return rc;
        content = jstr(s, len);
    } else if (json_object_is_type(sys.v, json_type_array)) {
        struct json_reader blocks;
        if ((rc = json_read_array(&sys, NULL, JSON_REQUIRED, &blocks, &n)))
            return rc;
        if (n == 0)
            return 0;
        content = json_object_new_array();
        if (!content)
            return nomem(&sys);
        for (size_t j = 0; j < n; j++) {
            struct json_reader b = json_reader_element(&blocks, j);
            bool bp = false;
            if ((rc = read_text_block(&b, "\"text\" (system blocks are text)", &s, &len)) ||
                (rc = check_cache_control(&b, &bp))) {
                json_object_put(content);
                return rc;
            }
            json_object_array_add(content, text_part(s, len));
            if (bp) {
                p->bp_level = 2;
                p->bp_block = j;
            }
        }
    } else {
        return json_reader_fail(&sys, INFERD_EINVAL, "must be a string or an array of text "
                                "blocks, got %s", json_type_phrase(sys.v));
    }
    json_object *m = message_of("system", content);
    if (!m)
        return nomem(&sys);
    json_object_array_add(msgs, m);
    p->has_system = true;
    return 0;
}

/* A tool_result's content: absent (""), a string, or text blocks (joined by the template). */
static int tool_result_content(const struct json_reader *b, bool is_error, json_object **out)
{
    struct json_reader c = json_reader_member(b, "content");
    const char *s;
    size_t len, n;
    int rc;
    *out = NULL;
    /* The template has no field for a failed call: the model reads it in the text. */
    const char *error_mark = is_error ? "Error: " : "";
    if (!c.v || json_object_is_type(c.v, json_type_string)) {
        s = "";
        len = 0;
        if (c.v && (rc = json_read_str(&c, NULL, JSON_REQUIRED, &s, &len)))
            return rc;
        struct strbuf t = {0};
        strbuf_puts(&t, error_mark);
        strbuf_append(&t, s, len);
        *out = t.failed ? NULL : jstr(t.data, t.len);
        strbuf_free(&t);
        return *out ? 0 : nomem(b);
    }
    if (!json_object_is_type(c.v, json_type_array))
        return json_reader_fail(&c, INFERD_EINVAL, "must be a string or an array of text blocks, "
                                "got %s", json_type_phrase(c.v));
    struct json_reader blocks;
    if ((rc = json_read_array(&c, NULL, JSON_REQUIRED, &blocks, &n)))
        return rc;
    json_object *parts = json_object_new_array();
    if (!parts)
        return nomem(b);
    if (is_error)
        json_object_array_add(parts, text_part(error_mark, strlen(error_mark)));
    for (size_t j = 0; j < n; j++) {
        struct json_reader tb = json_reader_element(&blocks, j);
        bool bp;
        if ((rc = read_text_block(&tb, "\"text\" (tool results hold text)", &s, &len)) ||
            (rc = check_cache_control(&tb, &bp))) {
            json_object_put(parts);
            return rc;
        }
        json_object_array_add(parts, text_part(s, len));
    }
    *out = parts;
    return 0;
}

/* ---- request: messages --------------------------------------------------------- */

static struct tool_use_seen *find_use(struct parse *p, const char *id)
{
    for (size_t i = 0; i < p->n_uses; i++)
        if (!strcmp(p->uses[i].id, id))
            return &p->uses[i];
    return NULL;
}

static int note_use(struct parse *p, const struct json_reader *b, const char *id, size_t mi,
                    size_t bi)
{
    struct json_reader idr = json_reader_member(b, "id");
    if (find_use(p, id))
        return json_reader_fail(&idr, INFERD_EINVAL, "\"%.64s\" is used by an earlier tool_use "
                                "block; tool_use ids must be unique", id);
    if (p->n_uses == p->cap_uses) {
        size_t cap = p->cap_uses ? p->cap_uses * 2 : 8;
        struct tool_use_seen *grown = realloc(p->uses, cap * sizeof *grown);
        if (!grown)
            return nomem(b);
        p->uses = grown;
        p->cap_uses = cap;
    }
    p->uses[p->n_uses++] = (struct tool_use_seen){.id = id, .msg = mi, .block = bi};
    return 0;
}

static int note_result(struct parse *p, const struct json_reader *b, const char *id, size_t mi)
{
    struct json_reader idr = json_reader_member(b, "tool_use_id");
    struct tool_use_seen *u = find_use(p, id);
    if (!u || u->msg >= mi)
        return json_reader_fail(&idr, INFERD_EINVAL, "\"%.64s\" answers no tool_use block of an "
                                "earlier assistant message", id);
    if (u->answered)
        return json_reader_fail(&idr, INFERD_EINVAL, "\"%.64s\" answers a tool_use that an "
                                "earlier tool_result already answered", id);
    u->answered = true;
    return 0;
}

/* An assistant's tool_use block as an OpenAI tool call: arguments as JSON text. */
static int tool_call_of(const struct json_reader *b, const char **id, json_object **out)
{
    const char *name;
    size_t id_len = 0, name_len = 0;
    struct json_reader input;
    int rc;
    *out = NULL;
    if ((rc = json_read_str(b, "id", JSON_REQUIRED, id, &id_len)) ||
        (rc = json_read_str(b, "name", JSON_REQUIRED, &name, &name_len)) ||
        (rc = json_read_object(b, "input", JSON_REQUIRED, &input)) ||
        (rc = json_reader_check_tree(&input)))
        return rc;
    if (id_len == 0) {
        struct json_reader r = json_reader_member(b, "id");
        return json_reader_fail(&r, INFERD_EINVAL, "must not be empty");
    }
    if (name_len == 0) {
        struct json_reader r = json_reader_member(b, "name");
        return json_reader_fail(&r, INFERD_EINVAL, "must not be empty");
    }
    size_t args_len = 0;
    const char *args = json_object_to_json_string_length(
        input.v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &args_len);
    json_object *fn = json_object_new_object(), *call = json_object_new_object();
    if (!fn || !call || !args) {
        json_object_put(fn);
        json_object_put(call);
        return nomem(b);
    }
    json_object_object_add(fn, "name", jstr(name, name_len));
    json_object_object_add(fn, "arguments", jstr(args, args_len));
    json_object_object_add(call, "id", jstr(*id, id_len));
    json_object_object_add(call, "type", json_object_new_string("function"));
    json_object_object_add(call, "function", fn);
    *out = call;
    return 0;
}

/* Appends text parts as one message of role to msgs and empties *parts. */
static void flush_parts(json_object *msgs, const char *role, json_object **parts)
{
    if (*parts && json_object_array_length(*parts) > 0)
        json_object_array_add(msgs, message_of(role, *parts));
    else
        json_object_put(*parts);
    *parts = NULL;
}

/* Message mi (reader m) in OpenAI's shape, appended to msgs: the first max_blocks of its
 * blocks. With check, tool_use/tool_result pairs and cache_control breakpoints are noted in
 * p; without, the message was checked already (the retention cut reads it again). */
static int translate_message(struct parse *p, const struct json_reader *m, size_t mi,
                             size_t max_blocks, bool check, json_object *msgs)
{
    static const char *const roles[] = {"user", "assistant", NULL};
    struct json_reader obj, blocks;
    int role = 0, rc;
    const char *s;
    size_t len, n;
    if ((rc = json_read_object(m, NULL, JSON_REQUIRED, &obj)) ||
        (rc = json_read_enum(m, "role", JSON_REQUIRED, roles, &role)))
        return rc;
    bool assistant = role == 1;
    struct json_reader content = json_reader_member(m, "content");
    if (!content.v)
        return json_reader_fail(&content, INFERD_EINVAL, "is required: a string or an array of "
                                "content blocks");
    if (json_object_is_type(content.v, json_type_string)) {
        if ((rc = json_read_str(&content, NULL, JSON_REQUIRED, &s, &len)))
            return rc;
        json_object_array_add(msgs, message_of(roles[role], jstr(s, len)));
        return 0;
    }
    if (!json_object_is_type(content.v, json_type_array))
        return json_reader_fail(&content, INFERD_EINVAL, "must be a string or an array of content "
                                "blocks, got %s", json_type_phrase(content.v));
    if ((rc = json_read_array(&content, NULL, JSON_REQUIRED, &blocks, &n)))
        return rc;
    if (n == 0 && !assistant)
        return json_reader_fail(&content, INFERD_EINVAL, "must not be empty");

    json_object *parts = NULL, *calls = NULL;
    struct strbuf reasoning = {0};
    bool has_reasoning = false;
    for (size_t j = 0; j < n && j < max_blocks; j++) {
        struct json_reader b = json_reader_element(&blocks, j);
        const char *type;
        bool bp = false;
        if ((rc = block_type(&b, &type)) || (rc = check_cache_control(&b, &bp)))
            goto out;
        if (bp && check) {
            p->bp_level = 3;
            p->bp_msg = mi;
            p->bp_block = j;
        }
        if (!strcmp(type, "text")) {
            if ((rc = json_read_str(&b, "text", JSON_REQUIRED, &s, &len)))
                goto out;
            if (!parts && !(parts = json_object_new_array())) {
                rc = nomem(&b);
                goto out;
            }
            json_object_array_add(parts, text_part(s, len));
        } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
            rc = refuse_media(&b, type);
            goto out;
        } else if (assistant && !strcmp(type, "tool_use")) {
            const char *id;
            json_object *call;
            if ((rc = tool_call_of(&b, &id, &call)) ||
                (check && (rc = note_use(p, &b, id, mi, j)))) {
                json_object_put(call);
                goto out;
            }
            if (!calls && !(calls = json_object_new_array())) {
                json_object_put(call);
                rc = nomem(&b);
                goto out;
            }
            json_object_array_add(calls, call);
        } else if (assistant && !strcmp(type, "thinking")) {
            if ((rc = json_read_str(&b, "thinking", JSON_REQUIRED, &s, &len)) ||
                (rc = json_read_str(&b, "signature", JSON_OPTIONAL, &(const char *){0}, NULL)))
                goto out;
            strbuf_append(&reasoning, s, len);
            has_reasoning = true;
        } else if (assistant && !strcmp(type, "redacted_thinking")) {
            /* Another model's sealed reasoning: nothing this model can read. */
        } else if (!assistant && !strcmp(type, "tool_result")) {
            const char *id;
            bool is_error = false;
            json_object *result;
            if ((rc = json_read_str(&b, "tool_use_id", JSON_REQUIRED, &id, NULL)) ||
                (rc = json_read_bool(&b, "is_error", JSON_OPTIONAL, &is_error)) ||
                (check && (rc = note_result(p, &b, id, mi))) ||
                (rc = tool_result_content(&b, is_error, &result)))
                goto out;
            /* Text before a result stays before it. */
            flush_parts(msgs, "user", &parts);
            json_object *tm = message_of("tool", result);
            if (!tm) {
                rc = nomem(&b);
                goto out;
            }
            json_object_object_add(tm, "tool_call_id", json_object_new_string(id));
            json_object_array_add(msgs, tm);
        } else {
            rc = refuse_unknown(&b, type,
                                assistant ? "text, tool_use, thinking, redacted_thinking"
                                          : "text, tool_result");
            goto out;
        }
    }
    if (!assistant) {
        flush_parts(msgs, "user", &parts);
    } else {
        json_object *am = message_of("assistant", parts ? parts : json_object_new_string(""));
        parts = NULL;
        if (!am || reasoning.failed) {
            rc = nomem(m);
            goto out;
        }
        if (calls)
            json_object_object_add(am, "tool_calls", calls);
        calls = NULL;
        if (has_reasoning)
            json_object_object_add(am, "reasoning_content", jstr(reasoning.data, reasoning.len));
        json_object_array_add(msgs, am);
    }
out:
    json_object_put(parts);
    json_object_put(calls);
    strbuf_free(&reasoning);
    return rc;
}

static int parse_messages(struct parse *p, json_object *msgs)
{
    struct json_reader list = json_reader_member(p->root, "messages");
    size_t n = 0;
    int rc;
    if (!list.v)
        return json_reader_fail(&list, INFERD_EINVAL, "is required: an array of messages");
    if ((rc = json_read_array(&list, NULL, JSON_REQUIRED, &list, &n)))
        return rc;
    if (n == 0)
        return json_reader_fail(&list, INFERD_EINVAL, "must contain at least one message");
    for (size_t i = 0; i < n; i++) {
        struct json_reader m = json_reader_element(&list, i);
        if ((rc = translate_message(p, &m, i, SIZE_MAX, true, msgs)))
            return rc;
    }
    for (size_t i = 0; i < p->n_uses; i++) {
        const struct tool_use_seen *u = &p->uses[i];
        if (u->answered)
            continue;
        struct json_reader m = json_reader_element(&list, u->msg);
        struct json_reader c = json_reader_member(&m, "content");
        struct json_reader b = json_reader_element(&c, u->block);
        struct json_reader id = json_reader_member(&b, "id");
        return json_reader_fail(&id, INFERD_EINVAL, "\"%.64s\" is answered by no tool_result "
                                "block in a later user message", u->id);
    }
    return 0;
}

/* The conversation up to the last breakpoint: system (cut after its breakpoint block when
 * that is the last), then messages up to the breakpoint's, that one cut after its block. */
static int build_retain_cut(struct parse *p, json_object *full)
{
    if (p->bp_level == 0)
        return 0;
    json_object *cut = json_object_new_array();
    if (!cut)
        return nomem(p->root);
    int rc = 0;
    if (p->has_system) {
        json_object *m = json_object_array_get_idx(full, 0);
        json_object *content = json_object_object_get(m, "content");
        if (p->bp_level == 2 && json_object_is_type(content, json_type_array)) {
            json_object *parts = json_object_new_array();
            for (size_t j = 0; parts && j <= p->bp_block; j++)
                json_object_array_add(parts,
                                      json_object_get(json_object_array_get_idx(content, j)));
            json_object_array_add(cut, message_of("system", parts));
        } else {
            json_object_array_add(cut, json_object_get(m));
        }
    }
    if (p->bp_level == 3) {
        struct json_reader list = json_reader_member(p->root, "messages");
        for (size_t i = 0; i <= p->bp_msg && !rc; i++) {
            struct json_reader m = json_reader_element(&list, i);
            rc = translate_message(p, &m, i, i == p->bp_msg ? p->bp_block + 1 : SIZE_MAX, false,
                                   cut);
        }
    }
    if (rc || json_object_array_length(cut) == 0) {
        json_object_put(cut);
        return rc;
    }
    p->out->retain_messages = cut;
    return 0;
}

/* ---- request: tools, sampling, thinking ----------------------------------------- */

static int parse_tools(struct parse *p, struct gen_request *r)
{
    struct json_reader tools = json_reader_member(p->root, "tools");
    size_t n = 0;
    int rc;
    if (!tools.v)
        return 0;
    if ((rc = json_read_array(&tools, NULL, JSON_REQUIRED, &tools, &n)))
        return rc;
    if (n > ANTHROPIC_MAX_TOOLS)
        return json_reader_fail(&tools, INFERD_EINVAL, "holds %zu tools; at most %d are taken", n,
                                ANTHROPIC_MAX_TOOLS);
    json_object *out = json_object_new_array();
    if (!out)
        return nomem(&tools);
    for (size_t i = 0; i < n; i++) {
        struct json_reader t = json_reader_element(&tools, i), obj, schema;
        const char *name, *desc = NULL, *type = "custom";
        size_t name_len = 0, desc_len = 0;
        bool has_desc = false, bp = false;
        if ((rc = json_read_object(&t, NULL, JSON_REQUIRED, &obj)) ||
            (rc = json_read_str(&t, "type", JSON_OPTIONAL, &type, NULL)) ||
            (rc = check_cache_control(&t, &bp)))
            goto fail;
        if (bp)
            p->bp_level = 1;
        /* Anthropic's own server tools (web search, code execution, ...) have no schema and
         * nothing here could run them: left out, as other servers do. */
        if (strcmp(type, "custom") != 0 && !json_reader_has(&t, "input_schema"))
            continue;
        if ((rc = json_read_str(&t, "name", JSON_REQUIRED, &name, &name_len)) ||
            (rc = json_read_str(&t, "description", &has_desc, &desc, &desc_len)) ||
            (rc = json_read_object(&t, "input_schema", JSON_REQUIRED, &schema)) ||
            (rc = json_reader_check_tree(&schema)))
            goto fail;
        if (name_len == 0 || name_len > ANTHROPIC_MAX_TOOL_NAME) {
            struct json_reader nr = json_reader_member(&t, "name");
            rc = json_reader_fail(&nr, INFERD_EINVAL, "must be 1 to %d bytes, got %zu",
                                  ANTHROPIC_MAX_TOOL_NAME, name_len);
            goto fail;
        }
        json_object *fn = json_object_new_object(), *tool = json_object_new_object();
        if (!fn || !tool) {
            json_object_put(fn);
            json_object_put(tool);
            rc = nomem(&t);
            goto fail;
        }
        json_object_object_add(fn, "name", jstr(name, name_len));
        if (has_desc)
            json_object_object_add(fn, "description", jstr(desc, desc_len));
        json_object_object_add(fn, "parameters", json_object_get(schema.v));
        json_object_object_add(tool, "type", json_object_new_string("function"));
        json_object_object_add(tool, "function", fn);
        json_object_array_add(out, tool);
    }
    r->tools = out;
    return 0;
fail:
    json_object_put(out);
    return rc;
}

static bool tools_have(json_object *tools, const char *name)
{
    size_t n = tools ? json_object_array_length(tools) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *fn = json_object_object_get(json_object_array_get_idx(tools, i), "function");
        if (!strcmp(json_object_get_string(json_object_object_get(fn, "name")), name))
            return true;
    }
    return false;
}

static int parse_tool_choice(const struct json_reader *root, struct gen_request *r)
{
    static const char *const types[] = {"auto", "any", "tool", "none", NULL};
    static const enum gen_tool_choice choice_of[] = {GEN_TOOL_CHOICE_AUTO,
                                                     GEN_TOOL_CHOICE_REQUIRED,
                                                     GEN_TOOL_CHOICE_FUNCTION, GEN_TOOL_CHOICE_NONE};
    struct json_reader c;
    bool present = false, parallel = false;
    int type = 0, rc;
    if ((rc = json_read_object(root, "tool_choice", &present, &c)) || !present)
        return rc;
    if ((rc = json_read_enum(&c, "type", JSON_REQUIRED, types, &type)) ||
        (rc = json_read_bool(&c, "disable_parallel_tool_use", JSON_OPTIONAL, &parallel)))
        return rc;
    bool have_tools = r->tools && json_object_array_length(r->tools) > 0;
    struct json_reader t = json_reader_member(&c, "type");
    if ((type == 1 || type == 2) && !have_tools)
        return json_reader_fail(&t, INFERD_EINVAL, "\"%s\" needs a non-empty tools array",
                                types[type]);
    if (type == 2) {
        struct json_reader name = json_reader_member(&c, "name");
        const char *s;
        if ((rc = json_read_str(&name, NULL, JSON_REQUIRED, &s, NULL)))
            return rc;
        if (!tools_have(r->tools, s))
            return json_reader_fail(&name, INFERD_EINVAL, "names \"%.64s\", which is not in "
                                    "tools", s);
        if ((rc = json_read_strdup(&name, NULL, JSON_REQUIRED, &r->tool_choice_name, NULL)))
            return rc;
    }
    r->has_tool_choice = true;
    r->tool_choice = choice_of[type];
    return 0;
}

static int parse_thinking(struct parse *p, struct gen_request *r)
{
    static const char *const types[] = {"enabled", "disabled", "adaptive", "between_tools", NULL};
    struct json_reader t;
    bool present = false;
    int type = 0, rc;
    if ((rc = json_read_object(p->root, "thinking", &present, &t)) || !present)
        return rc;
    if ((rc = json_read_enum(&t, "type", JSON_REQUIRED, types, &type)))
        return rc;
    if (type == 0) {
        int64_t budget = 0;
        struct json_reader b = json_reader_member(&t, "budget_tokens");
        if ((rc = json_read_int64(&t, "budget_tokens", JSON_REQUIRED, 1, INT32_MAX, &budget)))
            return rc;
        if (p->kind == ANTHROPIC_MESSAGES && budget >= r->max_tokens)
            return json_reader_fail(&b, INFERD_EINVAL, "must be less than max_tokens (%lld), got "
                                    "%lld", (long long)r->max_tokens, (long long)budget);
        r->think_open = true;
        r->think_budget = (int)budget;
    }
    /* The template's switch: enabled, adaptive and between_tools all let the model think. */
    json_object *kwargs = json_object_new_object();
    if (!kwargs)
        return nomem(&t);
    json_object_object_add(kwargs, "enable_thinking", json_object_new_boolean(type != 1));
    r->chat_template_kwargs = kwargs;
    return 0;
}

static int parse_stop_sequences(const struct json_reader *root, struct gen_request *r)
{
    struct json_reader list;
    size_t n = 0;
    int rc;
    if ((rc = json_read_array(root, "stop_sequences", JSON_OPTIONAL, &list, &n)))
        return rc;
    if (n > GEN_REQUEST_MAX_STOP)
        return json_reader_fail(&list, INFERD_EINVAL, "holds %zu strings; at most %d are taken", n,
                                GEN_REQUEST_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        struct json_reader s = json_reader_element(&list, i);
        size_t len = 0;
        if ((rc = json_read_strdup(&s, NULL, JSON_REQUIRED, &r->stop[r->n_stop], &len)))
            return rc;
        r->n_stop++;
        if (len == 0)
            return json_reader_fail(&s, INFERD_EINVAL, "must not be an empty string");
    }
    return 0;
}

static int parse_scalars(struct parse *p, struct gen_request *r)
{
    const struct json_reader *root = p->root;
    struct json_reader meta;
    const char *s;
    int rc;
    if (p->kind == ANTHROPIC_MESSAGES) {
        if ((rc = json_read_int64(root, "max_tokens", JSON_REQUIRED, 1, INT64_MAX,
                                  &r->max_tokens)) ||
            (rc = json_read_bool(root, "stream", &r->has_stream, &r->stream)))
            return rc;
        r->has_max_tokens = true;
    }
    if ((rc = json_read_strdup(root, "model", JSON_OPTIONAL, &r->model, NULL)) ||
        (rc = json_read_double(root, "temperature", &r->has_temperature,
                               (struct json_range){.lo = 0, .hi = 2}, &r->temperature)) ||
        (rc = json_read_double(root, "top_p", &r->has_top_p,
                               (struct json_range){.lo = 0, .hi = 1, .lo_open = true}, &r->top_p)) ||
        (rc = json_read_int64(root, "top_k", &r->has_top_k, 0, INT32_MAX, &r->top_k)) ||
        (rc = gen_request_read_sampler_extras(root, r)) ||
        (rc = json_read_object(root, "metadata", JSON_OPTIONAL, &meta)) ||
        (rc = json_read_str(&meta, "user_id", JSON_OPTIONAL, &s, NULL)) ||
        (rc = json_reader_check_tree(&meta)))
        return rc;
    return 0;
}

/* ---- request: entry points ---------------------------------------------------- */

int anthropic_request_parse(const char *body, size_t len, enum anthropic_body kind,
                            struct anthropic_request *out, struct api_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->req.kind = GEN_REQUEST_CHAT;
    json_object *obj = NULL;
    int rc = gen_request_parse_object(body, len, &obj, e);
    if (rc)
        return rc;
    struct err err = {0};
    struct json_doc doc = {.err = &err, .name = "the request body",
                           .flags = JSON_TEXT | JSON_INTEGRAL_DOUBLES};
    struct json_reader root = json_reader_root(&doc, obj);
    struct parse p = {.out = out, .kind = kind, .root = &root};
    struct gen_request *r = &out->req;
    json_object *msgs = json_object_new_array();
    if (!msgs) {
        rc = nomem(&root);
    } else if (!(rc = parse_scalars(&p, r)) && !(rc = parse_stop_sequences(&root, r)) &&
               !(rc = parse_tools(&p, r)) && !(rc = parse_tool_choice(&root, r)) &&
               !(rc = parse_thinking(&p, r)) && !(rc = gen_request_read_session(&root, r)) &&
               !(rc = parse_system(&p, msgs)) && !(rc = parse_messages(&p, msgs)) &&
               !(rc = build_retain_cut(&p, msgs))) {
        r->messages = msgs;
        msgs = NULL;
    }
    json_object_put(msgs);
    free(p.uses);
    if (rc) {
        if (rc == -INFERD_ENOMEM)
            fail_nomem(e);
        else
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, doc.err_path, NULL, "%s", err.msg);
        anthropic_request_free(out);
        out->req.kind = GEN_REQUEST_CHAT;
    }
    json_object_put(obj);
    return rc ? (rc == -INFERD_ENOMEM ? rc : -INFERD_EINVAL) : 0;
}

void anthropic_request_free(struct anthropic_request *r)
{
    if (!r)
        return;
    gen_request_free(&r->req);
    json_object_put(r->retain_messages);
    memset(r, 0, sizeof *r);
}

int anthropic_retain_tokens(const struct served_model *sm, const struct anthropic_request *r)
{
    if (!r->retain_messages || !sm->tmpl || !sm->tok)
        return 0;
    struct err err = {0};
    json_object *messages = NULL;
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    int n = 0;
    json_object *tools = r->req.has_tool_choice && r->req.tool_choice == GEN_TOOL_CHOICE_NONE
                             ? NULL
                             : r->req.tools;
    /* Rendered as the whole prompt is (api/prompt.c), without the generation prompt, so it
     * ends where the breakpoint's block does, give or take the turn's closing tokens. */
    if (chat_template_join_content(r->retain_messages, &messages, &err) == 0 &&
        chat_template_render(sm->tmpl, messages, tools, false, r->req.chat_template_kwargs,
                             &text, &len, &err) == 0 &&
        tok_encode(sm->tok, text, len, false, &ids, &n, &err) < 0)
        n = 0;
    json_object_put(messages);
    free(text);
    free(ids);
    return n;
}

/* ---- reply: shared pieces ------------------------------------------------------- */

/* Prompt tokens computed now and kept by the prefix cache: its full blocks past the reused
 * part. */
static int cache_creation(const struct anthropic_reply *r, const struct gen_news *o)
{
    if (r->cache_block_size <= 0)
        return 0;
    int full = o->n_prompt / r->cache_block_size * r->cache_block_size;
    return full > o->n_cached ? full - o->n_cached : 0;
}

static json_object *usage_json(const struct anthropic_reply *r, const struct gen_news *o)
{
    json_object *u = json_object_new_object();
    json_object_object_add(u, "input_tokens", json_object_new_int(o->n_prompt));
    json_object_object_add(u, "cache_creation_input_tokens",
                           json_object_new_int(cache_creation(r, o)));
    json_object_object_add(u, "cache_read_input_tokens", json_object_new_int(o->n_cached));
    json_object_object_add(u, "output_tokens", json_object_new_int(o->n_generated));
    return u;
}

/* stop_reason, and in *sequence the stop sequence that fired (NULL for none). */
static const char *stop_reason(const struct anthropic_reply *r, const struct gen_news *o,
                               bool tool_calls, const char **sequence)
{
    *sequence = NULL;
    if (tool_calls)
        return "tool_use";
    if (o->finish == GEN_FINISH_LENGTH)
        return "max_tokens";
    if (o->stop_string > 0 && (size_t)o->stop_string <= r->n_stop) {
        *sequence = r->stop[o->stop_string - 1];
        return "stop_sequence";
    }
    return "end_turn";
}

static json_object *message_object(const struct anthropic_reply *r, json_object *content)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(r->id));
    json_object_object_add(m, "type", json_object_new_string("message"));
    json_object_object_add(m, "role", json_object_new_string("assistant"));
    json_object_object_add(m, "model", json_object_new_string(r->model ? r->model : ""));
    json_object_object_add(m, "content", content);
    return m;
}

static json_object *tool_use_block(const char *name, json_object *input)
{
    char id[40];
    generation_random_id(id, sizeof id, "toolu_");
    json_object *b = json_object_new_object();
    json_object_object_add(b, "type", json_object_new_string("tool_use"));
    json_object_object_add(b, "id", json_object_new_string(id));
    json_object_object_add(b, "name", json_object_new_string(name ? name : ""));
    json_object_object_add(b, "input", input ? input : json_object_new_object());
    return b;
}

/* The calls of a whole answer: deltas gathered per call (a call's first piece names it). */
static void add_tool_blocks(json_object *content, const struct generation_news *all)
{
    for (size_t i = 0; i < all->n_tools; i++) {
        const struct generation_tool_delta *d = &all->tools[i];
        if (!d->name)
            continue; /* a later piece: gathered with its call's first below */
        struct strbuf args = {0};
        for (size_t k = i; k < all->n_tools; k++)
            if (all->tools[k].index == d->index && (k == i || !all->tools[k].name))
                strbuf_puts(&args, all->tools[k].arguments ? all->tools[k].arguments : "");
        json_object *input = NULL;
        if (!args.failed && args.len > 0)
            json_text_parse(args.data, args.len, GEN_REQUEST_MAX_DEPTH, false, &input,
                            &(struct err){0});
        if (input && !json_object_is_type(input, json_type_object)) {
            json_object_put(input); /* input is an object by definition */
            input = NULL;
        }
        json_object_array_add(content, tool_use_block(d->name, input));
        strbuf_free(&args);
    }
}

int anthropic_message_json(const struct anthropic_reply *r, const struct generation_news *all,
                           struct strbuf *out)
{
    const struct gen_news *o = &all->out;
    json_object *content = json_object_new_array();
    const char *reasoning = NULL, *text = o->text;
    size_t reasoning_len = 0, text_len = o->text_len;
    if (all->split) {
        reasoning = all->text.reasoning;
        reasoning_len = all->text.reasoning_len;
        text = all->text.content;
        text_len = all->text.content_len;
    }
    if (reasoning_len > 0) {
        json_object *b = json_object_new_object();
        json_object_object_add(b, "type", json_object_new_string("thinking"));
        json_object_object_add(b, "thinking", jstr(reasoning, reasoning_len));
        json_object_object_add(b, "signature", json_object_new_string(""));
        json_object_array_add(content, b);
    }
    /* An answer with nothing else still has its (empty) text block. */
    if (text_len > 0 || (reasoning_len == 0 && all->n_tools == 0)) {
        json_object *b = json_object_new_object();
        json_object_object_add(b, "type", json_object_new_string("text"));
        json_object_object_add(b, "text", jstr(text, text_len));
        json_object_array_add(content, b);
    }
    add_tool_blocks(content, all);
    json_object *m = message_object(r, content);
    const char *sequence;
    const char *reason = stop_reason(r, o, all->tool_calls || all->n_tools > 0, &sequence);
    json_object_object_add(m, "stop_reason", json_object_new_string(reason));
    json_object_object_add(m, "stop_sequence", sequence ? json_object_new_string(sequence) : NULL);
    json_object_object_add(m, "usage", usage_json(r, o));
    bool ok = append_json(out, m);
    json_object_put(m);
    return ok ? 0 : -INFERD_ENOMEM;
}

/* ---- reply: the event stream ------------------------------------------------------ */

static void event(struct strbuf *out, const char *name, json_object *data)
{
    strbuf_puts(out, "event: ");
    strbuf_puts(out, name);
    strbuf_puts(out, "\ndata: ");
    append_json(out, data);
    strbuf_puts(out, "\n\n");
    json_object_put(data);
}

static json_object *typed(const char *type)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

void anthropic_stream_ping(struct strbuf *out)
{
    event(out, "ping", typed("ping"));
}

static void message_start(struct anthropic_stream *s, const struct gen_news *o, struct strbuf *out)
{
    json_object *m = message_object(&s->reply, json_object_new_array());
    json_object_object_add(m, "stop_reason", NULL);
    json_object_object_add(m, "stop_sequence", NULL);
    struct gen_news counts = *o;
    counts.n_generated = 0; /* the output's count goes out with message_delta */
    json_object_object_add(m, "usage", usage_json(&s->reply, &counts));
    json_object *e = typed("message_start");
    json_object_object_add(e, "message", m);
    event(out, "message_start", e);
    s->started = true;
}

static void close_block(struct anthropic_stream *s, struct strbuf *out)
{
    if (s->open == ANTHROPIC_BLOCK_NONE)
        return;
    json_object *e = typed("content_block_stop");
    json_object_object_add(e, "index", json_object_new_int(s->n_blocks - 1));
    event(out, "content_block_stop", e);
    s->open = ANTHROPIC_BLOCK_NONE;
}

static void open_block(struct anthropic_stream *s, enum anthropic_block kind, json_object *block,
                       struct strbuf *out)
{
    close_block(s, out);
    json_object *e = typed("content_block_start");
    json_object_object_add(e, "index", json_object_new_int(s->n_blocks));
    json_object_object_add(e, "content_block", block);
    event(out, "content_block_start", e);
    s->n_blocks++;
    s->open = kind;
}

static void delta(struct anthropic_stream *s, json_object *d, struct strbuf *out)
{
    json_object *e = typed("content_block_delta");
    json_object_object_add(e, "index", json_object_new_int(s->n_blocks - 1));
    json_object_object_add(e, "delta", d);
    event(out, "content_block_delta", e);
}

/* Text of one kind (thinking or text) into its block, opening one when another is open. */
static void emit_text(struct anthropic_stream *s, enum anthropic_block kind, const char *text,
                      size_t len, struct strbuf *out)
{
    if (len == 0)
        return;
    bool thinking = kind == ANTHROPIC_BLOCK_THINKING;
    if (s->open != kind) {
        json_object *b = typed(thinking ? "thinking" : "text");
        json_object_object_add(b, thinking ? "thinking" : "text", json_object_new_string(""));
        if (thinking)
            json_object_object_add(b, "signature", json_object_new_string(""));
        open_block(s, kind, b, out);
    }
    json_object *d = typed(thinking ? "thinking_delta" : "text_delta");
    json_object_object_add(d, thinking ? "thinking" : "text", jstr(text, len));
    delta(s, d, out);
}

static void emit_tool(struct anthropic_stream *s, const struct generation_tool_delta *t,
                      struct strbuf *out)
{
    if (s->open != ANTHROPIC_BLOCK_TOOL_USE || s->open_call != t->index || t->name) {
        open_block(s, ANTHROPIC_BLOCK_TOOL_USE, tool_use_block(t->name, NULL), out);
        s->open_call = t->index;
    }
    if (t->arguments && t->arguments[0]) {
        json_object *d = typed("input_json_delta");
        json_object_object_add(d, "partial_json", json_object_new_string(t->arguments));
        delta(s, d, out);
    }
}

void anthropic_stream_news(struct anthropic_stream *s, const struct generation_news *n,
                           struct strbuf *out, bool *done)
{
    const struct gen_news *o = &n->out;
    if (!s->started)
        message_start(s, o, out);
    if (n->split) {
        emit_text(s, ANTHROPIC_BLOCK_THINKING, n->text.reasoning, n->text.reasoning_len, out);
        emit_text(s, ANTHROPIC_BLOCK_TEXT, n->text.content, n->text.content_len, out);
    } else {
        emit_text(s, ANTHROPIC_BLOCK_TEXT, o->text, o->text_len, out);
    }
    if (o->finish != GEN_RUNNING) {
        emit_text(s, ANTHROPIC_BLOCK_THINKING, n->tail.reasoning, n->tail.reasoning_len, out);
        emit_text(s, ANTHROPIC_BLOCK_TEXT, n->tail.content, n->tail.content_len, out);
    }
    for (size_t i = 0; i < n->n_tools; i++)
        emit_tool(s, &n->tools[i], out);
    if (o->finish == GEN_RUNNING)
        return;
    *done = true;
    if (o->finish == GEN_FINISH_ERROR || o->finish == GEN_FINISH_CANCELLED) {
        /* The status line is long gone: the error travels as an event. */
        struct api_error e;
        if (o->finish == GEN_FINISH_ERROR && o->error_code == INFERD_ENOMEM)
            api_error_set(&e, 529, API_ERROR_UNAVAILABLE, NULL, NULL, "%s", o->error);
        else if (o->finish == GEN_FINISH_ERROR && o->error_code == INFERD_EBUSY)
            api_error_set(&e, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "%s", o->error);
        else
            api_error_set(&e, 500, API_ERROR_SERVER, NULL, NULL, "%s",
                          o->finish == GEN_FINISH_ERROR ? o->error : "the request was cancelled");
        strbuf_puts(out, "event: error\ndata: ");
        api_error_render_anthropic(&e, out);
        strbuf_puts(out, "\n\n");
        return;
    }
    if (s->n_blocks == 0) { /* an empty answer still has its one (empty) text block */
        json_object *b = typed("text");
        json_object_object_add(b, "text", json_object_new_string(""));
        open_block(s, ANTHROPIC_BLOCK_TEXT, b, out);
    }
    close_block(s, out);
    const char *sequence;
    const char *reason = stop_reason(&s->reply, o, n->tool_calls, &sequence);
    json_object *d = json_object_new_object();
    json_object_object_add(d, "stop_reason", json_object_new_string(reason));
    json_object_object_add(d, "stop_sequence", sequence ? json_object_new_string(sequence) : NULL);
    json_object *e = typed("message_delta");
    json_object_object_add(e, "delta", d);
    json_object_object_add(e, "usage", usage_json(&s->reply, o));
    event(out, "message_delta", e);
    event(out, "message_stop", typed("message_stop"));
}

/* ---- handlers -------------------------------------------------------------------- */

/* Anthropic answers an overloaded server with 529, not 503. */
static void send_error(struct http_exchange *x, const struct api_error *e)
{
    struct api_error a = *e;
    if (a.status == 503)
        a.status = 529;
    http_send_error(x, &a);
}

static void send_json(struct http_exchange *x, struct strbuf *b)
{
    if (b->failed || !b->data)
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the response");
    else
        http_send_json(x, 200, b->data, b->len);
}

static void reply_init(struct anthropic_reply *rep, const struct served_model *sm,
                       struct gen_request *req)
{
    memset(rep, 0, sizeof *rep);
    generation_random_id(rep->id, sizeof rep->id, "msg_");
    rep->model = sm->id;
    for (size_t i = 0; i < req->n_stop; i++) { /* moved: the reply names the one that fired */
        rep->stop[i] = req->stop[i];
        req->stop[i] = NULL;
    }
    rep->n_stop = req->n_stop;
    req->n_stop = 0;
    const struct engine_config *c = served_engine_config(sm);
    if (c && c->prompt_cache_bytes > 0)
        rep->cache_block_size = c->kv_block_size > 0 ? c->kv_block_size : KV_BLOCK_SIZE_DEFAULT;
}

static void reply_free(struct anthropic_reply *rep)
{
    for (size_t i = 0; i < rep->n_stop; i++)
        free(rep->stop[i]);
    rep->n_stop = 0;
}

struct stream_ctx {
    struct anthropic_stream s;
    struct generation *gen; /* owned */
};

static bool stream_produce(void *ctx, struct strbuf *out, bool *done)
{
    struct stream_ctx *c = ctx;
    while (out->len == 0 && !*done) {
        struct generation_news n;
        if (generation_next(c->gen, SSE_KEEPALIVE_MS, &n) < 0)
            return false;
        bool quiet = n.out.finish == GEN_RUNNING && n.out.text_len == 0 && n.out.n_tokens == 0 &&
                     n.n_tools == 0;
        if (quiet) {
            /* A long prefill sends nothing for a while: pings keep the connection from reading
             * as idle; the SDK skips them, even before message_start, which waits for the
             * prompt's cache counts. */
            anthropic_stream_ping(out);
        } else {
            anthropic_stream_news(&c->s, &n, out, done);
        }
        generation_news_free(&n);
    }
    return true;
}

static void stream_release(void *ctx)
{
    struct stream_ctx *c = ctx;
    generation_free(c->gen);
    reply_free(&c->s.reply);
    free(c);
}

void anthropic_messages(struct http_exchange *x)
{
    struct server *srv = x->srv;
    struct api_error e;
    struct anthropic_request ar;
    memset(&e, 0, sizeof e);
    memset(&ar, 0, sizeof ar);
    if (generation_admit(srv, &e) < 0 ||
        anthropic_request_parse(x->body, x->body_len, ANTHROPIC_MESSAGES, &ar, &e) < 0) {
        send_error(x, &e);
        return;
    }
    struct served_model *sm = NULL;
    if (served_model_acquire(srv, ar.req.model, &sm, &e) < 0) {
        anthropic_request_free(&ar);
        send_error(x, &e);
        return;
    }
    ar.req.retain_tokens = anthropic_retain_tokens(sm, &ar);
    struct generation *g = NULL;
    if (generation_start(x, sm, &ar.req, &g, &e) < 0) {
        anthropic_request_free(&ar);
        send_error(x, &e);
        return;
    }
    bool stream = ar.req.has_stream && ar.req.stream;
    struct stream_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        generation_free(g);
        anthropic_request_free(&ar);
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return;
    }
    c->gen = g;
    reply_init(&c->s.reply, generation_model(g), &ar.req);
    anthropic_request_free(&ar);
    if (stream) {
        http_send_stream(x, 200, "text/event-stream",
                         (struct http_stream){stream_produce, stream_release, c});
        return;
    }
    struct generation_news all;
    if (generation_collect(g, &all, &e) < 0) {
        send_error(x, &e);
    } else {
        struct strbuf b = {0};
        if (anthropic_message_json(&c->s.reply, &all, &b) < 0)
            b.failed = true;
        send_json(x, &b);
        strbuf_free(&b);
        generation_news_free(&all);
    }
    stream_release(c);
}

void anthropic_count_tokens(struct http_exchange *x)
{
    struct server *srv = x->srv;
    struct api_error e;
    struct anthropic_request ar;
    memset(&e, 0, sizeof e);
    if (generation_admit(srv, &e) < 0 ||
        anthropic_request_parse(x->body, x->body_len, ANTHROPIC_COUNT_TOKENS, &ar, &e) < 0) {
        send_error(x, &e);
        return;
    }
    /* Encoded as the generation would encode it: the same namespace, so a resent reply
     * keeps its generated ids and the count is usage.input_tokens. */
    uint64_t ns = api_cache_namespace(x->tenant_ns, NULL, 0);
    struct prompt pr;
    struct served_model *sm = NULL;
    bool ok = served_model_acquire(srv, ar.req.model, &sm, &e) == 0;
    if (ok)
        ok = prompt_build(srv, sm, &ar.req, ns, &pr, &e);
    served_model_release(srv, sm);
    anthropic_request_free(&ar);
    if (!ok) {
        send_error(x, &e);
        return;
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "input_tokens", json_object_new_int(pr.n_ids));
    prompt_free(&pr);
    struct strbuf b = {0};
    if (!o || !append_json(&b, o))
        b.failed = true;
    json_object_put(o);
    send_json(x, &b);
    strbuf_free(&b);
}
