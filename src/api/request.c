/* api/request.c — OpenAI chat/completions request bodies parsed and validated (400 on bad input). */
#include "api/request.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/json.h"

/* ---- errors ------------------------------------------------------------ */

static int fail(struct api_error *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills err as a 400 invalid_request_error naming param (NULL for none). */
static int fail(struct api_error *err, const char *param, const char *fmt, ...)
{
    va_list ap;
    err->status = 400;
    snprintf(err->type, sizeof err->type, "%s", "invalid_request_error");
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->code[0] = '\0';
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -INFERD_EINVAL;
}

static int fail_nomem(struct api_error *err)
{
    err->status = 500;
    snprintf(err->type, sizeof err->type, "%s", "server_error");
    err->param[0] = '\0';
    err->code[0] = '\0';
    snprintf(err->message, sizeof err->message, "%s", "out of memory while parsing the request");
    return -INFERD_ENOMEM;
}

/* The body's fields are read through base/json: its message becomes the
 * error's and the path of the value it names becomes param. */
static int fail_from_reader(int rc, const struct json_doc *doc, struct api_error *err)
{
    if (rc == -INFERD_ENOMEM)
        return fail_nomem(err);
    return fail(err, doc->err_path, "%s", doc->err->msg);
}

static int nomem(const struct json_reader *r)
{
    return json_reader_fail_plain(r, INFERD_ENOMEM, "out of memory");
}

/* ---- raw body checks ----------------------------------------------------- */

/* json-c saturates integer literals beyond int64 instead of failing, so the
 * raw text is scanned for them (outside strings) before parsing. */
static int scan_numbers(const char *body, size_t len, struct api_error *err)
{
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9'))
            continue;
        size_t start = i;
        bool integral = true;
        while (i < len && (body[i] == '-' || body[i] == '+' || body[i] == '.' || body[i] == 'e' ||
                           body[i] == 'E' || (body[i] >= '0' && body[i] <= '9'))) {
            if (body[i] == '.' || body[i] == 'e' || body[i] == 'E')
                integral = false;
            i++;
        }
        size_t n = i - start;
        i--;
        if (!integral)
            continue;
        char buf[32];
        if (n >= sizeof buf)
            return fail(err, NULL, "the body contains an integer beyond the 64-bit range");
        memcpy(buf, body + start, n);
        buf[n] = '\0';
        errno = 0;
        (void)strtoll(buf, NULL, 10);
        if (errno == ERANGE)
            return fail(err, NULL, "the body contains an integer beyond the 64-bit range (%s)",
                        buf);
    }
    return 0;
}

/* ---- messages ------------------------------------------------------------ */

static int check_content_parts(const struct json_reader *parts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct json_reader part = json_reader_element(parts, i), obj;
        const char *t, *s;
        int rc = json_read_object(&part, NULL, JSON_REQUIRED, &obj);
        if (rc)
            return rc;
        struct json_reader type = json_reader_member(&part, "type");
        if (!type.v)
            return json_reader_fail(&type, INFERD_EINVAL,
                                    "is required; only \"text\" parts are supported");
        if ((rc = json_read_str(&type, NULL, JSON_REQUIRED, &t, NULL)))
            return rc;
        if (!strcmp(t, "image_url") || !strcmp(t, "image") || !strcmp(t, "input_image"))
            return json_reader_fail_plain(&type, INFERD_EINVAL,
                                          "image content parts are not supported: this server "
                                          "serves text-only models; send \"text\" parts only");
        if (strcmp(t, "text") != 0)
            return json_reader_fail_plain(
                &type, INFERD_EINVAL,
                "content part type \"%.64s\" is not supported; only \"text\" parts are", t);
        struct json_reader text = json_reader_member(&part, "text");
        if (!text.v)
            return json_reader_fail(&text, INFERD_EINVAL, "is required in a text content part");
        if ((rc = json_read_str(&text, NULL, JSON_REQUIRED, &s, NULL)))
            return rc;
    }
    return 0;
}

/* The "function" member of a tool or tool call: an object with a non-empty name. */
static int check_function_name(const struct json_reader *fn)
{
    const char *s;
    size_t len = 0;
    int rc = json_read_str(fn, "name", JSON_REQUIRED, &s, &len);
    if (!rc && len == 0) {
        struct json_reader name = json_reader_member(fn, "name");
        return json_reader_fail(&name, INFERD_EINVAL, "must not be empty");
    }
    return rc;
}

/* A "type" member that must be "function"; why says what else the message adds. */
static int check_function_type(const struct json_reader *obj, const char *why)
{
    const char *s;
    struct json_reader type = json_reader_member(obj, "type");
    if (!type.v)
        return json_reader_fail(&type, INFERD_EINVAL, "is required and must be \"function\"");
    int rc = json_read_str(&type, NULL, JSON_REQUIRED, &s, NULL);
    if (!rc && strcmp(s, "function") != 0)
        return json_reader_fail(&type, INFERD_EINVAL, "must be \"function\"%s, got \"%.64s\"", why,
                                s);
    return rc;
}

static int check_tool_calls(const struct json_reader *calls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct json_reader call = json_reader_element(calls, i), obj, fn;
        const char *s;
        int rc;
        if ((rc = json_read_object(&call, NULL, JSON_REQUIRED, &obj)) ||
            (rc = json_read_str(&call, "id", JSON_REQUIRED, &s, NULL)) ||
            (rc = check_function_type(&call, "")))
            return rc;
        fn = json_reader_member(&call, "function");
        if (!fn.v || !json_object_is_type(fn.v, json_type_object))
            return json_reader_fail(&fn, INFERD_EINVAL, "must be an object with name and arguments");
        if ((rc = check_function_name(&fn)))
            return rc;
        struct json_reader args = json_reader_member(&fn, "arguments");
        if (!args.v)
            return json_reader_fail(&args, INFERD_EINVAL, "is required (a JSON-encoded string)");
        if (!json_object_is_type(args.v, json_type_string))
            return json_reader_fail(&args, INFERD_EINVAL, "must be a string holding JSON, got %s",
                                    json_type_phrase(args.v));
        if ((rc = json_read_str(&args, NULL, JSON_REQUIRED, &s, NULL)))
            return rc;
    }
    return 0;
}

static int check_message(const struct json_reader *m)
{
    enum { SYSTEM, DEVELOPER, USER, ASSISTANT, TOOL };
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
    struct json_reader obj, calls, parts;
    const char *s;
    size_t n;
    int role = USER;
    int rc;
    if ((rc = json_read_object(m, NULL, JSON_REQUIRED, &obj)) ||
        (rc = json_read_enum(m, "role", JSON_REQUIRED, roles, &role)) ||
        (rc = json_read_str(m, "name", JSON_OPTIONAL, &s, NULL)))
        return rc;
    if (role == ASSISTANT && (rc = json_read_array(m, "tool_calls", JSON_OPTIONAL, &calls, &n)) == 0)
        rc = check_tool_calls(&calls, n);
    if (rc)
        return rc;

    struct json_reader content = json_reader_member(m, "content");
    if (!content.v) {
        if (role != ASSISTANT)
            return json_reader_fail(&content, INFERD_EINVAL, "is required for role \"%s\"",
                                    roles[role]);
    } else if (json_object_is_type(content.v, json_type_string)) {
        if ((rc = json_read_str(&content, NULL, JSON_REQUIRED, &s, NULL)))
            return rc;
    } else if (json_object_is_type(content.v, json_type_array)) {
        if ((rc = json_read_array(&content, NULL, JSON_REQUIRED, &parts, &n)) ||
            (rc = check_content_parts(&parts, n)))
            return rc;
    } else {
        return json_reader_fail(&content, INFERD_EINVAL,
                                "must be a string or an array of content parts, got %s",
                                json_type_phrase(content.v));
    }

    if (role == TOOL) {
        struct json_reader id = json_reader_member(m, "tool_call_id");
        if (!id.v)
            return json_reader_fail(&id, INFERD_EINVAL, "is required for role \"tool\"");
        if ((rc = json_read_str(&id, NULL, JSON_REQUIRED, &s, NULL)))
            return rc;
    }
    /* Other keys stay in the kept object and reach the template. */
    return json_reader_check_tree(m);
}

/* A tool message answers a call: its tool_call_id must be the id of a tool
 * call in an earlier assistant message (calls holds those ids as keys). */
static int check_tool_answers_a_call(const struct json_reader *m, json_object *calls)
{
    json_object *role = NULL, *list = NULL;
    json_object_object_get_ex(m->v, "role", &role);
    const char *r = json_object_get_string(role);
    if (!strcmp(r, "assistant") && json_object_object_get_ex(m->v, "tool_calls", &list)) {
        size_t n = list ? json_object_array_length(list) : 0;
        for (size_t i = 0; i < n; i++) {
            json_object *id = NULL;
            json_object_object_get_ex(json_object_array_get_idx(list, i), "id", &id);
            if (json_object_object_add(calls, json_object_get_string(id), NULL) != 0)
                return nomem(m);
        }
    } else if (!strcmp(r, "tool")) {
        struct json_reader id = json_reader_member(m, "tool_call_id");
        const char *s = json_object_get_string(id.v);
        if (!json_object_object_get_ex(calls, s, NULL))
            return json_reader_fail(&id, INFERD_EINVAL,
                                    "\"%.64s\" is not the id of a tool call in an earlier "
                                    "assistant message",
                                    s);
    }
    return 0;
}

static int parse_messages(const struct json_reader *root, struct gen_request *r)
{
    struct json_reader msgs = json_reader_member(root, "messages");
    size_t n = 0;
    if (!msgs.v)
        return json_reader_fail(&msgs, INFERD_EINVAL,
                                "is required: an array of message objects");
    int rc = json_read_array(&msgs, NULL, JSON_REQUIRED, &msgs, &n);
    if (rc)
        return rc;
    if (n == 0)
        return json_reader_fail(&msgs, INFERD_EINVAL, "must contain at least one message");
    json_object *calls = json_object_new_object(); /* the tool call ids so far, as keys */
    if (!calls)
        return nomem(&msgs);
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct json_reader m = json_reader_element(&msgs, i);
        if ((rc = check_message(&m)) == 0)
            rc = check_tool_answers_a_call(&m, calls);
    }
    json_object_put(calls);
    if (rc)
        return rc;
    /* OpenAI's developer role is the system role of every chat template. */
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(msgs.v, i), *role = NULL;
        if (json_object_object_get_ex(m, "role", &role) &&
            !strcmp(json_object_get_string(role), "developer"))
            json_object_object_add(m, "role", json_object_new_string("system"));
    }
    r->messages = json_object_get(msgs.v);
    return 0;
}

/* ---- prompt (completions) ------------------------------------------------ */

static int parse_prompt(const struct json_reader *root, struct gen_request *r)
{
    struct json_reader p = json_reader_member(root, "prompt");
    if (!p.v)
        return json_reader_fail(&p, INFERD_EINVAL,
                                "is required: a string, a one-element array of strings, or an "
                                "array of token ids");
    if (json_object_is_type(p.v, json_type_string)) {
        r->prompt_kind = GEN_PROMPT_TEXT;
        return json_read_strdup(&p, NULL, JSON_REQUIRED, &r->prompt_text, &r->prompt_text_len);
    }
    if (!json_object_is_type(p.v, json_type_array))
        return json_reader_fail(&p, INFERD_EINVAL, "must be a string or an array, got %s",
                                json_type_phrase(p.v));
    size_t n = json_object_array_length(p.v);
    if (n == 0)
        return json_reader_fail(&p, INFERD_EINVAL, "must not be an empty array");
    struct json_reader first = json_reader_element(&p, 0);
    if (json_object_is_type(first.v, json_type_string) ||
        json_object_is_type(first.v, json_type_array)) {
        if (n > 1)
            return json_reader_fail_plain(
                &p, INFERD_EINVAL,
                "only one prompt per request is supported; got an array of %zu prompts", n);
        if (json_object_is_type(first.v, json_type_array))
            return json_reader_fail_plain(&first, INFERD_EINVAL,
                                          "prompt[0]: batched token-id prompts are not supported; "
                                          "send one array of token ids");
        r->prompt_kind = GEN_PROMPT_TEXT;
        return json_read_strdup(&first, NULL, JSON_REQUIRED, &r->prompt_text,
                                &r->prompt_text_len);
    }
    r->prompt_tokens = malloc(n * sizeof *r->prompt_tokens);
    if (!r->prompt_tokens)
        return nomem(&p);
    r->prompt_kind = GEN_PROMPT_TOKENS;
    r->n_prompt_tokens = n;
    for (size_t i = 0; i < n; i++) {
        struct json_reader t = json_reader_element(&p, i);
        int64_t id = 0;
        if (!json_object_is_type(t.v, json_type_int) && !json_object_is_type(t.v, json_type_double))
            return json_reader_fail(&t, INFERD_EINVAL,
                                    "must be a token id (an integer); a prompt array holds either "
                                    "one string or token ids, got %s",
                                    json_type_phrase(t.v));
        int rc = json_read_int64(&t, NULL, JSON_REQUIRED, INT64_MIN, INT64_MAX, &id);
        if (rc)
            return rc;
        if (id < 0 || id > INT32_MAX)
            return json_reader_fail(&t, INFERD_EINVAL, "must be a token id in [0, %d], got %lld",
                                    INT32_MAX, (long long)id);
        r->prompt_tokens[i] = (int32_t)id;
    }
    return 0;
}

/* ---- sampling and output fields ------------------------------------------ */

static int parse_max_tokens(const struct json_reader *root, struct gen_request *r)
{
    bool has_max = false, has_completion_max = false;
    int rc;
    /* max_completion_tokens, read last, wins */
    if ((rc = json_read_int64(root, "max_tokens", &has_max, 1, INT64_MAX, &r->max_tokens)) ||
        (rc = json_read_int64(root, "max_completion_tokens", &has_completion_max, 1, INT64_MAX,
                              &r->max_tokens)))
        return rc;
    r->has_max_tokens = has_max || has_completion_max;
    return 0;
}

int gen_request_read_sampler_extras(const struct json_reader *root, struct gen_request *r)
{
    int rc;
    if ((rc = json_read_int64(root, "repetition_context_size", &r->has_repetition_context_size, 0,
                              INT32_MAX, &r->repetition_context_size)) ||
        (rc = json_read_int64(root, "presence_context_size", &r->has_presence_context_size, 0,
                              INT32_MAX, &r->presence_context_size)) ||
        (rc = json_read_int64(root, "frequency_context_size", &r->has_frequency_context_size, 0,
                              INT32_MAX, &r->frequency_context_size)) ||
        (rc = json_read_double(root, "xtc_probability", &r->has_xtc_probability,
                               (struct json_range){.lo = 0, .hi = 1}, &r->xtc_probability)) ||
        (rc = json_read_double(root, "xtc_threshold", &r->has_xtc_threshold,
                               (struct json_range){.lo = 0, .hi = 0.5}, &r->xtc_threshold)))
        return rc;
    return 0;
}

static int parse_sampling(const struct json_reader *root, struct gen_request *r)
{
    int rc;
    if ((rc = json_read_double(root, "temperature", &r->has_temperature,
                               (struct json_range){.lo = 0, .hi = 2}, &r->temperature)) ||
        (rc = json_read_double(root, "top_p", &r->has_top_p,
                               (struct json_range){.lo = 0, .hi = 1, .lo_open = true}, &r->top_p)) ||
        (rc = json_read_double(root, "min_p", &r->has_min_p, (struct json_range){.lo = 0, .hi = 1},
                               &r->min_p)) ||
        (rc = json_read_double(root, "repetition_penalty", &r->has_repetition_penalty,
                               (struct json_range){.lo = 0, .hi = 10, .lo_open = true},
                               &r->repetition_penalty)) ||
        (rc = json_read_double(root, "presence_penalty", &r->has_presence_penalty,
                               (struct json_range){.lo = -2, .hi = 2}, &r->presence_penalty)) ||
        (rc = json_read_double(root, "frequency_penalty", &r->has_frequency_penalty,
                               (struct json_range){.lo = -2, .hi = 2}, &r->frequency_penalty)) ||
        (rc = json_read_int64(root, "top_k", &r->has_top_k, INT64_MIN, INT64_MAX, &r->top_k)) ||
        (rc = json_read_int64(root, "seed", &r->has_seed, INT64_MIN, INT64_MAX, &r->seed)) ||
        (rc = gen_request_read_sampler_extras(root, r)))
        return rc;
    if (r->has_top_k && r->top_k < -1) {
        struct json_reader k = json_reader_member(root, "top_k");
        return json_reader_fail(&k, INFERD_EINVAL, "must be >= 0 (or -1 for off), got %lld",
                                (long long)r->top_k);
    }
    int64_t n = 1;
    if ((rc = json_read_int64(root, "n", JSON_OPTIONAL, INT64_MIN, INT64_MAX, &n)))
        return rc;
    if (n != 1) {
        struct json_reader at = json_reader_member(root, "n");
        return json_reader_fail_plain(
            &at, INFERD_EINVAL,
            "n > 1 is not supported yet: only n = 1 (one choice per request) is, got %lld",
            (long long)n);
    }
    return 0;
}

static int parse_stop(const struct json_reader *root, struct gen_request *r)
{
    struct json_reader v = json_reader_member(root, "stop");
    size_t n = 1;
    bool is_list = v.v && json_object_is_type(v.v, json_type_array);
    if (!v.v)
        return 0;
    if (is_list) {
        n = json_object_array_length(v.v);
        if (n > GEN_REQUEST_MAX_STOP)
            return json_reader_fail(&v, INFERD_EINVAL, "may hold at most %d strings, got %zu",
                                    GEN_REQUEST_MAX_STOP, n);
    } else if (!json_object_is_type(v.v, json_type_string)) {
        return json_reader_fail(&v, INFERD_EINVAL,
                                "must be a string or an array of up to %d strings, got %s",
                                GEN_REQUEST_MAX_STOP, json_type_phrase(v.v));
    }
    for (size_t i = 0; i < n; i++) {
        struct json_reader s = is_list ? json_reader_element(&v, i) : v;
        size_t len = 0;
        int rc = json_read_strdup(&s, NULL, JSON_REQUIRED, &r->stop[r->n_stop], &len);
        if (rc)
            return rc;
        r->n_stop++;
        if (len == 0)
            return json_reader_fail(&s, INFERD_EINVAL, "must not be an empty string");
    }
    return 0;
}

static int parse_logit_bias(const struct json_reader *root, struct gen_request *r)
{
    struct json_reader v = json_reader_member(root, "logit_bias");
    if (!v.v)
        return 0;
    if (!json_object_is_type(v.v, json_type_object))
        return json_reader_fail(
            &v, INFERD_EINVAL,
            "must be an object mapping token ids to numbers in [-100, 100], got %s",
            json_type_phrase(v.v));
    size_t n = (size_t)json_object_object_length(v.v);
    if (n == 0)
        return 0;
    r->logit_bias = malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias)
        return nomem(&v);
    json_object_object_foreach(v.v, key, val)
    {
        char *end;
        errno = 0;
        long long id = (key[0] >= '0' && key[0] <= '9') ? strtoll(key, &end, 10) : -1;
        if (id < 0 || errno || *end || id > INT32_MAX)
            return json_reader_fail_plain(&v, INFERD_EINVAL,
                                          "logit_bias keys must be token ids (non-negative "
                                          "integers as strings), got \"%.64s\"",
                                          key);
        /* a reader at logit_bias holding the value: errors name the field, as param */
        struct json_reader value = v;
        value.v = val;
        double b = 0;
        int rc = json_read_double(&value, NULL, JSON_REQUIRED, JSON_ANY_NUMBER, &b);
        if (rc)
            return rc;
        if (b < -100 || b > 100)
            return json_reader_fail_plain(
                &v, INFERD_EINVAL, "logit_bias values must be in [-100, 100], got %g for token %lld",
                b, id);
        r->logit_bias[r->n_logit_bias].token = (int32_t)id;
        r->logit_bias[r->n_logit_bias].bias = (float)b;
        r->n_logit_bias++;
    }
    return 0;
}

static int parse_output(const struct json_reader *root, struct gen_request *r)
{
    int rc;
    if (r->kind == GEN_REQUEST_COMPLETION) {
        /* The legacy completions API: logprobs is how many alternatives, 0..5. */
        int n = 0;
        if ((rc = json_read_int(root, "logprobs", &r->has_logprobs, 0, 5, &n)))
            return rc;
        r->logprobs = r->has_top_logprobs = r->has_logprobs;
        r->top_logprobs = n;
    } else {
        int n = 0;
        if ((rc = json_read_bool(root, "logprobs", &r->has_logprobs, &r->logprobs)) ||
            (rc = json_read_int(root, "top_logprobs", &r->has_top_logprobs, 0, 20, &n)))
            return rc;
        if (r->has_top_logprobs && !r->logprobs) {
            struct json_reader at = json_reader_member(root, "top_logprobs");
            return json_reader_fail(&at, INFERD_EINVAL, "requires logprobs to be true");
        }
        r->top_logprobs = n;
    }
    struct json_reader opts;
    if ((rc = json_read_bool(root, "stream", &r->has_stream, &r->stream)) ||
        (rc = json_read_bool(root, "speculative", &r->has_speculative, &r->speculative)) ||
        (rc = json_read_object(root, "stream_options", JSON_OPTIONAL, &opts)) ||
        (rc = json_read_bool(&opts, "include_usage", &r->has_include_usage, &r->include_usage)))
        return rc;
    return 0;
}

/* ---- tools and the rest ---------------------------------------------------- */

static int check_tool(const struct json_reader *t)
{
    struct json_reader obj, fn, params;
    const char *s;
    int rc;
    if ((rc = json_read_object(t, NULL, JSON_REQUIRED, &obj)) ||
        (rc = check_function_type(t, " (the only tool type supported)")))
        return rc;
    fn = json_reader_member(t, "function");
    if (!fn.v || !json_object_is_type(fn.v, json_type_object))
        return json_reader_fail(&fn, INFERD_EINVAL, "must be an object with a name");
    if ((rc = check_function_name(&fn)) ||
        (rc = json_read_str(&fn, "description", JSON_OPTIONAL, &s, NULL)))
        return rc;
    params = json_reader_member(&fn, "parameters");
    if (params.v && !json_object_is_type(params.v, json_type_object))
        return json_reader_fail(&params, INFERD_EINVAL, "must be a JSON Schema object, got %s",
                                json_type_phrase(params.v));
    return json_reader_check_tree(t);
}

/* Whether tools (an array of checked tools, or NULL) has a function named name. */
static bool tools_have(json_object *tools, const char *name)
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

static int parse_tool_choice(const struct json_reader *root, struct gen_request *r)
{
    static const char *const modes[] = {"auto", "none", "required", NULL};
    static const enum gen_tool_choice mode_of[] = {GEN_TOOL_CHOICE_AUTO, GEN_TOOL_CHOICE_NONE,
                                                   GEN_TOOL_CHOICE_REQUIRED};
    struct json_reader c = json_reader_member(root, "tool_choice");
    bool have_tools = r->tools && json_object_array_length(r->tools) > 0;
    int rc;
    if (!c.v)
        return 0;
    if (json_object_is_type(c.v, json_type_string)) {
        int mode = 0;
        if (json_read_enum(&c, NULL, JSON_REQUIRED, modes, &mode))
            return json_reader_fail(&c, INFERD_EINVAL,
                                    "must be \"none\", \"auto\", \"required\" or "
                                    "{\"type\":\"function\",\"function\":{\"name\":...}}");
        r->tool_choice = mode_of[mode];
        if (r->tool_choice == GEN_TOOL_CHOICE_REQUIRED && !have_tools)
            return json_reader_fail_plain(&c, INFERD_EINVAL,
                                          "tool_choice \"required\" needs a non-empty tools array");
        r->has_tool_choice = true;
        return 0;
    }
    if (!json_object_is_type(c.v, json_type_object))
        return json_reader_fail(&c, INFERD_EINVAL, "must be a string or an object, got %s",
                                json_type_phrase(c.v));
    struct json_reader type = json_reader_member(&c, "type");
    if (!type.v || !json_object_is_type(type.v, json_type_string) ||
        strcmp(json_object_get_string(type.v), "function") != 0)
        return json_reader_fail(&type, INFERD_EINVAL, "must be \"function\"");
    struct json_reader fn = json_reader_member(&c, "function");
    struct json_reader name = json_reader_member(&fn, "name");
    const char *s;
    if (!name.v)
        return json_reader_fail(&name, INFERD_EINVAL, "is required");
    if ((rc = json_read_str(&name, NULL, JSON_REQUIRED, &s, NULL)))
        return rc;
    if (!have_tools || !tools_have(r->tools, s))
        return json_reader_fail_plain(&name, INFERD_EINVAL,
                                      "tool_choice names function \"%.64s\", which is not in tools",
                                      s);
    if ((rc = json_read_strdup(&name, NULL, JSON_REQUIRED, &r->tool_choice_name, NULL)))
        return rc;
    r->tool_choice = GEN_TOOL_CHOICE_FUNCTION;
    r->has_tool_choice = true;
    return 0;
}

static int parse_tools(const struct json_reader *root, struct gen_request *r)
{
    struct json_reader tools = json_reader_member(root, "tools");
    size_t n = 0;
    int rc;
    if (tools.v && !json_object_is_type(tools.v, json_type_array))
        return json_reader_fail(&tools, INFERD_EINVAL, "must be an array of function tools, got %s",
                                json_type_phrase(tools.v));
    if (tools.v) {
        n = json_object_array_length(tools.v);
        for (size_t i = 0; i < n; i++) {
            struct json_reader t = json_reader_element(&tools, i);
            if ((rc = check_tool(&t)))
                return rc;
        }
        r->tools = json_object_get(tools.v);
    }
    return parse_tool_choice(root, r);
}

/* Legacy completions fields that would change the reply's meaning and that
 * inferd does not implement: refused, so a client never gets silently
 * different output. Their neutral values pass. */
static int refuse_unsupported_completion_fields(const struct json_reader *root)
{
    bool echo = false;
    int64_t best_of = 1;
    const char *suffix = "";
    size_t suffix_len = 0;
    int rc;
    if ((rc = json_read_bool(root, "echo", JSON_OPTIONAL, &echo)))
        return rc;
    struct json_reader at = json_reader_member(root, "echo");
    if (echo)
        return json_reader_fail_plain(&at, INFERD_EINVAL,
                                      "echo is not supported: the reply holds only the generated "
                                      "text (send the prompt yourself, or echo false)");
    if ((rc = json_read_int64(root, "best_of", JSON_OPTIONAL, INT64_MIN, INT64_MAX, &best_of)))
        return rc;
    at = json_reader_member(root, "best_of");
    if (best_of != 1)
        return json_reader_fail(&at, INFERD_EINVAL,
                                "must be 1 (one candidate per request), got %lld",
                                (long long)best_of);
    if ((rc = json_read_str(root, "suffix", JSON_OPTIONAL, &suffix, &suffix_len)))
        return rc;
    at = json_reader_member(root, "suffix");
    if (suffix_len > 0)
        return json_reader_fail(&at, INFERD_EINVAL, "(fill-in-the-middle) is not supported");
    return 0;
}

static int parse_misc(const struct json_reader *root, struct gen_request *r)
{
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh",
                                          NULL};
    struct json_reader kwargs;
    const char *s;
    int effort = 0;
    int rc;
    if ((rc = json_read_strdup(root, "model", JSON_OPTIONAL, &r->model, NULL)) ||
        (rc = json_read_str(root, "user", JSON_OPTIONAL, &s, NULL)) ||
        (rc = json_read_object(root, "chat_template_kwargs", JSON_OPTIONAL, &kwargs)) ||
        (rc = json_reader_check_tree(&kwargs)) ||
        (rc = json_read_enum(root, "reasoning_effort", &r->has_reasoning_effort, efforts,
                             &effort)) ||
        (rc = structured_read_request(root, &r->structured)) ||
        (rc = json_read_int(root, "max_reasoning_tokens", &r->has_max_reasoning_tokens, 1,
                            INT32_MAX, &r->max_reasoning_tokens)))
        return rc;
    r->chat_template_kwargs = json_object_get(kwargs.v);
    r->reasoning_effort = (enum gen_reasoning_effort)effort;
    if (r->kind == GEN_REQUEST_COMPLETION)
        return refuse_unsupported_completion_fields(root);
    return 0;
}

/* ---- prefix-cache identity ---------------------------------------------------- */

/* An optional string field of 1..GEN_REQUEST_MAX_KEY_BYTES bytes, copied into *out. */
static int read_key_field(const struct json_reader *root, const char *key, char **out)
{
    struct json_reader v = json_reader_member(root, key);
    size_t len = 0;
    bool present = false;
    int rc = json_read_strdup(root, key, &present, out, &len);
    if (rc || !present)
        return rc;
    if (len == 0)
        return json_reader_fail(&v, INFERD_EINVAL, "must not be an empty string");
    if (len > GEN_REQUEST_MAX_KEY_BYTES)
        return json_reader_fail(&v, INFERD_EINVAL, "must be at most %d bytes, got %zu",
                                GEN_REQUEST_MAX_KEY_BYTES, len);
    return 0;
}

int gen_request_read_session(const struct json_reader *root, struct gen_request *r)
{
    char *cache_key = NULL;
    int rc;
    if ((rc = read_key_field(root, "adapter", &r->adapter)) ||
        (rc = read_key_field(root, "session_id", &r->session_id)) ||
        (rc = read_key_field(root, "prompt_cache_key", &cache_key))) {
        free(cache_key);
        return rc;
    }
    if (r->session_id)
        free(cache_key);
    else
        r->session_id = cache_key;
    return 0;
}

/* ---- entry points ---------------------------------------------------------- */

int gen_request_parse_object(const char *body, size_t len, json_object **out,
                             struct api_error *err)
{
    *out = NULL;
    if (!body || len == 0)
        return fail(err, NULL, "could not parse the JSON body: the body is empty");
    if (len > INT32_MAX)
        return fail(err, NULL, "the body is too large");
    int rc = scan_numbers(body, len, err);
    if (rc)
        return rc;
    struct err e = {0};
    json_object *obj = NULL;
    if ((rc = json_text_parse(body, len, GEN_REQUEST_MAX_DEPTH, true, &obj, &e)))
        return rc == -INFERD_ENOMEM ? fail_nomem(err)
                                    : fail(err, NULL, "could not parse the JSON body: %s", e.msg);
    if (!json_object_is_type(obj, json_type_object)) {
        rc = fail(err, NULL, "the request body must be a JSON object, got %s",
                  json_type_phrase(obj));
        json_object_put(obj);
        return rc;
    }
    *out = obj;
    return 0;
}

int gen_request_read_sampling(const struct json_reader *root, struct gen_request *r)
{
    int rc;
    if ((rc = parse_sampling(root, r)) || (rc = parse_stop(root, r)) ||
        (rc = parse_logit_bias(root, r)))
        return rc;
    return 0;
}

/* cache_salt, then the session (gen_request_read_session). */
int gen_request_read_cache_identity(const struct json_reader *root, struct gen_request *r)
{
    int rc = read_key_field(root, "cache_salt", &r->cache_salt);
    return rc ? rc : gen_request_read_session(root, r);
}

int gen_request_reader_error(int rc, const struct json_doc *doc, struct api_error *err)
{
    return fail_from_reader(rc, doc, err);
}

int gen_request_parse(const char *body, size_t len, enum gen_request_kind kind,
                      struct gen_request *out, struct api_error *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    json_object *obj = NULL;
    int rc = gen_request_parse_object(body, len, &obj, err);
    if (rc)
        return rc;
    /* Every string the request keeps is valid UTF-8 without NUL; clients that
     * only have doubles may send 3.0 for an integer. */
    struct err e = {0};
    struct json_doc doc = {.err = &e, .name = "the request body", .flags = GEN_REQUEST_DOC_FLAGS};
    struct json_reader root = json_reader_root(&doc, obj);
    if ((rc = kind == GEN_REQUEST_CHAT ? parse_messages(&root, out) : parse_prompt(&root, out)) ||
        (rc = parse_max_tokens(&root, out)) || (rc = parse_sampling(&root, out)) ||
        (rc = parse_stop(&root, out)) || (rc = parse_logit_bias(&root, out)) ||
        (rc = parse_output(&root, out)) || (rc = parse_tools(&root, out)) ||
        (rc = parse_misc(&root, out)) || (rc = gen_request_read_cache_identity(&root, out)))
        rc = fail_from_reader(rc, &doc, err);
    json_object_put(obj);
    if (rc) {
        gen_request_free(out);
        out->kind = kind;
    }
    return rc;
}

void gen_request_free(struct gen_request *r)
{
    if (!r)
        return;
    json_object_put(r->messages);
    free(r->prompt_text);
    free(r->prompt_tokens);
    free(r->model);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->logit_bias);
    json_object_put(r->tools);
    free(r->tool_choice_name);
    json_object_put(r->chat_template_kwargs);
    structured_spec_free(&r->structured);
    free(r->cache_salt);
    free(r->adapter);
    free(r->session_id);
    memset(r, 0, sizeof *r);
}
