/* api/request.c — OpenAI chat/completions request bodies parsed and validated (400 on bad input). */
#include "api/request.h"

#include "base/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

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

/* ---- string checks ------------------------------------------------------- */

/* A string we keep must be valid UTF-8 without NUL bytes. */
static int check_text(const char *s, size_t n, const char *param, struct api_error *err)
{
    if (memchr(s, '\0', n))
        return fail(err, param, "%s contains a NUL character (\\u0000), which is not allowed",
                    param);
    if (!utf8_valid((const unsigned char *)s, n))
        return fail(err, param, "%s is not valid UTF-8", param);
    return 0;
}

/* Walks a kept JSON value: every key and string must pass check_text and
 * every number must be finite. */
static int check_tree(json_object *v, const char *param, struct api_error *err)
{
    switch (json_object_get_type(v)) {
    case json_type_string:
        return check_text(json_object_get_string(v), (size_t)json_object_get_string_len(v), param,
                          err);
    case json_type_double:
        if (!isfinite(json_object_get_double(v)))
            return fail(err, param, "%s contains a number that is not finite", param);
        return 0;
    case json_type_array: {
        size_t n = json_object_array_length(v);
        for (size_t i = 0; i < n; i++) {
            int rc = check_tree(json_object_array_get_idx(v, i), param, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    case json_type_object: {
        json_object_object_foreach(v, key, val)
        {
            int rc = check_text(key, strlen(key), param, err);
            if (rc)
                return rc;
            rc = check_tree(val, param, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    default: return 0;
    }
}

/* dst = a followed by b, cut to 64 bytes (struct api_error's param size). */
static void param_join(char dst[64], const char *a, const char *b)
{
    size_t na = strnlen(a, 63), nb = strnlen(b, 63 - na);
    memmove(dst, a, na);
    memcpy(dst + na, b, nb);
    dst[na + nb] = '\0';
}

/* dst = base followed by "[i]", cut to 64 bytes. */
static void param_index(char dst[64], const char *base, size_t i)
{
    char idx[24];
    snprintf(idx, sizeof idx, "[%zu]", i);
    param_join(dst, base, idx);
}

/* ---- typed field readers ------------------------------------------------- */

static const char *type_name(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double:
    case json_type_int: return "a number";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "unknown";
}

/* Present and not null. */
static json_object *field(json_object *obj, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(obj, key, &v) || json_object_is_type(v, json_type_null))
        return NULL;
    return v;
}

static int read_number(json_object *v, const char *param, double *out, struct api_error *err)
{
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return fail(err, param, "%s must be a number, got %s", param, type_name(v));
    double d = json_object_get_double(v);
    if (!isfinite(d))
        return fail(err, param, "%s must be a finite number", param);
    *out = d;
    return 0;
}

/* Integers beyond int64 are refused before this runs (scan_numbers), so a
 * json_type_int value is exact here. Integral doubles (3.0) are accepted. */
static int read_int(json_object *v, const char *param, int64_t *out, struct api_error *err)
{
    if (json_object_is_type(v, json_type_int)) {
        *out = json_object_get_int64(v);
        return 0;
    }
    if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (isfinite(d) && d == floor(d) && d >= -9223372036854775808.0 &&
            d < 9223372036854775808.0) {
            *out = (int64_t)d;
            return 0;
        }
        return fail(err, param, "%s must be an integer, got %g", param, d);
    }
    return fail(err, param, "%s must be an integer, got %s", param, type_name(v));
}

static int read_bool(json_object *v, const char *param, bool *out, struct api_error *err)
{
    if (!json_object_is_type(v, json_type_boolean))
        return fail(err, param, "%s must be a boolean, got %s", param, type_name(v));
    *out = json_object_get_boolean(v);
    return 0;
}

/* A string value, checked for UTF-8 and NUL; *s borrows from v. */
static int read_string(json_object *v, const char *param, const char **s, size_t *n,
                       struct api_error *err)
{
    if (!json_object_is_type(v, json_type_string))
        return fail(err, param, "%s must be a string, got %s", param, type_name(v));
    *s = json_object_get_string(v);
    size_t len = (size_t)json_object_get_string_len(v);
    if (n)
        *n = len;
    return check_text(*s, len, param, err);
}

static int dup_string(json_object *v, const char *param, char **out, size_t *n,
                      struct api_error *err)
{
    const char *s = NULL;
    size_t len = 0;
    int rc = read_string(v, param, &s, &len, err);
    if (rc)
        return rc;
    *out = malloc(len + 1);
    if (!*out)
        return fail_nomem(err);
    memcpy(*out, s, len + 1);
    if (n)
        *n = len;
    return 0;
}

/* An optional number in [lo, hi] (bounds open where lo_open/hi_open). */
static int read_ranged(json_object *obj, const char *key, double lo, bool lo_open, double hi,
                       bool hi_open, bool *has, double *out, struct api_error *err)
{
    json_object *v = field(obj, key);
    if (!v)
        return 0;
    double d = 0;
    int rc = read_number(v, key, &d, err);
    if (rc)
        return rc;
    if ((lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi))
        return fail(err, key, "%s must be in %c%g, %g%c, got %g", key, lo_open ? '(' : '[', lo, hi,
                    hi_open ? ')' : ']', d);
    *has = true;
    *out = d;
    return 0;
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

/* Sets *is_null for a body that is exactly the JSON value null (json-c
 * represents it as a NULL object). */
static json_object *parse_json(const char *body, size_t len, bool *is_null, struct api_error *err)
{
    *is_null = false;
    if (memchr(body, '\0', len)) {
        fail(err, NULL, "could not parse the JSON body: it contains a raw NUL byte");
        return NULL;
    }
    /* The terminating NUL tells json-c the input is over, so a bare number
     * or literal at the very end completes instead of waiting for more. */
    char *text = malloc(len + 1);
    json_tokener *tok = json_tokener_new_ex(GEN_REQUEST_MAX_DEPTH);
    if (!text || !tok) {
        free(text);
        if (tok)
            json_tokener_free(tok);
        fail_nomem(err);
        return NULL;
    }
    memcpy(text, body, len);
    text[len] = '\0';
    /* Strict mode also refuses anything but whitespace after the value. */
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = json_tokener_parse_ex(tok, text, (int)(len + 1));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    free(text);
    if (jerr == json_tokener_error_depth) {
        fail(err, NULL, "could not parse the JSON body: nesting deeper than %d levels",
             GEN_REQUEST_MAX_DEPTH);
        return NULL;
    }
    if (jerr != json_tokener_success) {
        fail(err, NULL, "could not parse the JSON body: %s at byte %zu",
             json_tokener_error_desc(jerr), end);
        return NULL;
    }
    *is_null = root == NULL;
    return root;
}

/* ---- messages ------------------------------------------------------------ */

static int check_content_parts(json_object *parts, const char *param, struct api_error *err)
{
    char p[64];
    size_t n = json_object_array_length(parts);
    for (size_t i = 0; i < n; i++) {
        json_object *part = json_object_array_get_idx(parts, i);
        param_index(p, param, i);
        if (!json_object_is_type(part, json_type_object))
            return fail(err, p, "%s must be a content part object, got %s", p, type_name(part));
        char pt[64];
        param_join(pt, p, ".type");
        json_object *type = field(part, "type");
        if (!type)
            return fail(err, pt, "%s is required; only \"text\" parts are supported", pt);
        const char *t;
        int rc = read_string(type, pt, &t, NULL, err);
        if (rc)
            return rc;
        if (!strcmp(t, "image_url") || !strcmp(t, "image") || !strcmp(t, "input_image"))
            return fail(err, pt,
                        "image content parts are not supported: this server serves text-only "
                        "models; send \"text\" parts only");
        if (strcmp(t, "text") != 0)
            return fail(err, pt,
                        "content part type \"%.64s\" is not supported; only \"text\" parts are", t);
        param_join(pt, p, ".text");
        json_object *text = field(part, "text");
        if (!text)
            return fail(err, pt, "%s is required in a text content part", pt);
        const char *s;
        rc = read_string(text, pt, &s, NULL, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int check_tool_calls(json_object *calls, const char *param, struct api_error *err)
{
    char p[64];
    if (!json_object_is_type(calls, json_type_array))
        return fail(err, param, "%s must be an array, got %s", param, type_name(calls));
    size_t n = json_object_array_length(calls);
    for (size_t i = 0; i < n; i++) {
        json_object *call = json_object_array_get_idx(calls, i);
        const char *s;
        int rc;
        param_index(p, param, i);
        if (!json_object_is_type(call, json_type_object))
            return fail(err, p, "%s must be an object, got %s", p, type_name(call));
        char q[64];
        param_join(q, p, ".id");
        json_object *id = field(call, "id");
        if (!id)
            return fail(err, q, "%s is required", q);
        if ((rc = read_string(id, q, &s, NULL, err)))
            return rc;
        param_join(q, p, ".type");
        json_object *type = field(call, "type");
        if (!type)
            return fail(err, q, "%s is required and must be \"function\"", q);
        if ((rc = read_string(type, q, &s, NULL, err)))
            return rc;
        if (strcmp(s, "function") != 0)
            return fail(err, q, "%s must be \"function\"", q);
        param_join(q, p, ".function");
        json_object *fn = field(call, "function");
        if (!fn || !json_object_is_type(fn, json_type_object))
            return fail(err, q, "%s must be an object with name and arguments", q);
        param_join(q, p, ".function.name");
        json_object *name = field(fn, "name");
        if (!name)
            return fail(err, q, "%s is required", q);
        size_t len = 0;
        if ((rc = read_string(name, q, &s, &len, err)))
            return rc;
        if (len == 0)
            return fail(err, q, "%s must not be empty", q);
        param_join(q, p, ".function.arguments");
        json_object *args = field(fn, "arguments");
        if (!args)
            return fail(err, q, "%s is required (a JSON-encoded string)", q);
        if (!json_object_is_type(args, json_type_string))
            return fail(err, q, "%s must be a string holding JSON, got %s", q, type_name(args));
        if ((rc = read_string(args, q, &s, NULL, err)))
            return rc;
    }
    return 0;
}

static int check_message(json_object *m, size_t idx, struct api_error *err)
{
    char p[64], q[64];
    const char *role;
    int rc;
    snprintf(p, sizeof p, "messages[%zu]", idx);
    if (!json_object_is_type(m, json_type_object))
        return fail(err, p, "%s must be an object, got %s", p, type_name(m));
    param_join(q, p, ".role");
    json_object *r = field(m, "role");
    if (!r)
        return fail(err, q, "%s is required", q);
    if ((rc = read_string(r, q, &role, NULL, err)))
        return rc;
    bool is_assistant = !strcmp(role, "assistant"), is_tool = !strcmp(role, "tool");
    if (!is_assistant && !is_tool && strcmp(role, "system") && strcmp(role, "developer") &&
        strcmp(role, "user"))
        return fail(err, q,
                    "%s must be one of \"system\", \"developer\", \"user\", \"assistant\", "
                    "\"tool\"; got \"%.64s\"",
                    q, role);

    param_join(q, p, ".name");
    json_object *name = field(m, "name");
    const char *s;
    if (name && (rc = read_string(name, q, &s, NULL, err)))
        return rc;

    json_object *calls = NULL;
    if (is_assistant && (calls = field(m, "tool_calls"))) {
        param_join(q, p, ".tool_calls");
        if ((rc = check_tool_calls(calls, q, err)))
            return rc;
    }

    param_join(q, p, ".content");
    json_object *content = field(m, "content");
    if (!content) {
        if (!is_assistant)
            return fail(err, q, "%s is required for role \"%s\"", q, role);
    } else if (json_object_is_type(content, json_type_string)) {
        if ((rc = read_string(content, q, &s, NULL, err)))
            return rc;
    } else if (json_object_is_type(content, json_type_array)) {
        if ((rc = check_content_parts(content, q, err)))
            return rc;
    } else {
        return fail(err, q, "%s must be a string or an array of content parts, got %s", q,
                    type_name(content));
    }

    if (is_tool) {
        param_join(q, p, ".tool_call_id");
        json_object *id = field(m, "tool_call_id");
        if (!id)
            return fail(err, q, "%s is required for role \"tool\"", q);
        if ((rc = read_string(id, q, &s, NULL, err)))
            return rc;
    }
    /* Other keys stay in the kept object and reach the template. */
    return check_tree(m, p, err);
}

static int parse_messages(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v = field(root, "messages");
    if (!v)
        return fail(err, "messages", "messages is required: an array of message objects");
    if (!json_object_is_type(v, json_type_array))
        return fail(err, "messages", "messages must be an array, got %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (n == 0)
        return fail(err, "messages", "messages must contain at least one message");
    for (size_t i = 0; i < n; i++) {
        int rc = check_message(json_object_array_get_idx(v, i), i, err);
        if (rc)
            return rc;
    }
    r->messages = json_object_get(v);
    return 0;
}

/* ---- prompt (completions) ------------------------------------------------ */

static int parse_prompt(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v = field(root, "prompt");
    if (!v)
        return fail(err, "prompt",
                    "prompt is required: a string, a one-element array of strings, or an array of "
                    "token ids");
    if (json_object_is_type(v, json_type_string)) {
        r->prompt_kind = GEN_PROMPT_TEXT;
        return dup_string(v, "prompt", &r->prompt_text, &r->prompt_text_len, err);
    }
    if (!json_object_is_type(v, json_type_array))
        return fail(err, "prompt", "prompt must be a string or an array, got %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (n == 0)
        return fail(err, "prompt", "prompt must not be an empty array");
    json_object *first = json_object_array_get_idx(v, 0);
    if (json_object_is_type(first, json_type_string) ||
        json_object_is_type(first, json_type_array)) {
        if (n > 1)
            return fail(err, "prompt",
                        "only one prompt per request is supported; got an array of %zu prompts", n);
        if (json_object_is_type(first, json_type_array))
            return fail(err, "prompt[0]",
                        "prompt[0]: batched token-id prompts are not supported; send one array of "
                        "token ids");
        r->prompt_kind = GEN_PROMPT_TEXT;
        return dup_string(first, "prompt[0]", &r->prompt_text, &r->prompt_text_len, err);
    }
    r->prompt_tokens = malloc(n * sizeof *r->prompt_tokens);
    if (!r->prompt_tokens)
        return fail_nomem(err);
    r->prompt_kind = GEN_PROMPT_TOKENS;
    r->n_prompt_tokens = n;
    for (size_t i = 0; i < n; i++) {
        char p[64];
        int64_t id;
        snprintf(p, sizeof p, "prompt[%zu]", i);
        json_object *t = json_object_array_get_idx(v, i);
        if (!json_object_is_type(t, json_type_int) && !json_object_is_type(t, json_type_double))
            return fail(err, p,
                        "%s must be a token id (an integer); a prompt array holds either one "
                        "string or token ids, got %s",
                        p, type_name(t));
        int rc = read_int(t, p, &id, err);
        if (rc)
            return rc;
        if (id < 0 || id > INT32_MAX)
            return fail(err, p, "%s must be a token id in [0, %d], got %lld", p, INT32_MAX,
                        (long long)id);
        r->prompt_tokens[i] = (int32_t)id;
    }
    return 0;
}

/* ---- sampling and output fields ------------------------------------------ */

static int parse_max_tokens(json_object *root, struct gen_request *r, struct api_error *err)
{
    static const char *const keys[] = {"max_tokens", "max_completion_tokens"};
    for (size_t k = 0; k < 2; k++) { /* the later key wins */
        json_object *v = field(root, keys[k]);
        if (!v)
            continue;
        int64_t n;
        int rc = read_int(v, keys[k], &n, err);
        if (rc)
            return rc;
        if (n < 1)
            return fail(err, keys[k], "%s must be at least 1, got %lld", keys[k], (long long)n);
        r->has_max_tokens = true;
        r->max_tokens = n;
    }
    return 0;
}

static int parse_sampling(json_object *root, struct gen_request *r, struct api_error *err)
{
    int rc;
    if ((rc = read_ranged(root, "temperature", 0, false, 2, false, &r->has_temperature,
                          &r->temperature, err)) ||
        (rc = read_ranged(root, "top_p", 0, true, 1, false, &r->has_top_p, &r->top_p, err)) ||
        (rc = read_ranged(root, "min_p", 0, false, 1, false, &r->has_min_p, &r->min_p, err)) ||
        (rc = read_ranged(root, "repetition_penalty", 0, true, 10, false,
                          &r->has_repetition_penalty, &r->repetition_penalty, err)) ||
        (rc = read_ranged(root, "presence_penalty", -2, false, 2, false, &r->has_presence_penalty,
                          &r->presence_penalty, err)) ||
        (rc = read_ranged(root, "frequency_penalty", -2, false, 2, false, &r->has_frequency_penalty,
                          &r->frequency_penalty, err)))
        return rc;

    json_object *v;
    if ((v = field(root, "top_k"))) {
        if ((rc = read_int(v, "top_k", &r->top_k, err)))
            return rc;
        if (r->top_k < -1)
            return fail(err, "top_k", "top_k must be >= 0 (or -1 for off), got %lld",
                        (long long)r->top_k);
        r->has_top_k = true;
    }
    if ((v = field(root, "seed"))) {
        if ((rc = read_int(v, "seed", &r->seed, err)))
            return rc;
        r->has_seed = true;
    }
    if ((v = field(root, "n"))) {
        int64_t n;
        if ((rc = read_int(v, "n", &n, err)))
            return rc;
        if (n != 1)
            return fail(
                err, "n",
                "n > 1 is not supported yet: only n = 1 (one choice per request) is, got %lld",
                (long long)n);
    }
    return 0;
}

static int parse_stop(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v = field(root, "stop");
    if (!v)
        return 0;
    if (json_object_is_type(v, json_type_string)) {
        if (json_object_get_string_len(v) == 0)
            return fail(err, "stop", "stop must not be an empty string");
        r->n_stop = 1;
        return dup_string(v, "stop", &r->stop[0], NULL, err);
    }
    if (!json_object_is_type(v, json_type_array))
        return fail(err, "stop", "stop must be a string or an array of up to %d strings, got %s",
                    GEN_REQUEST_MAX_STOP, type_name(v));
    size_t n = json_object_array_length(v);
    if (n > GEN_REQUEST_MAX_STOP)
        return fail(err, "stop", "stop may hold at most %d strings, got %zu", GEN_REQUEST_MAX_STOP,
                    n);
    for (size_t i = 0; i < n; i++) {
        char p[32];
        snprintf(p, sizeof p, "stop[%zu]", i);
        json_object *s = json_object_array_get_idx(v, i);
        if (json_object_is_type(s, json_type_string) && json_object_get_string_len(s) == 0)
            return fail(err, p, "%s must not be an empty string", p);
        int rc = dup_string(s, p, &r->stop[r->n_stop], NULL, err);
        if (rc)
            return rc;
        r->n_stop++;
    }
    return 0;
}

static int parse_logit_bias(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v = field(root, "logit_bias");
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_object))
        return fail(
            err, "logit_bias",
            "logit_bias must be an object mapping token ids to numbers in [-100, 100], got %s",
            type_name(v));
    size_t n = (size_t)json_object_object_length(v);
    if (n == 0)
        return 0;
    r->logit_bias = malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias)
        return fail_nomem(err);
    json_object_object_foreach(v, key, val)
    {
        char *end;
        errno = 0;
        long long id = (key[0] >= '0' && key[0] <= '9') ? strtoll(key, &end, 10) : -1;
        if (id < 0 || errno || *end || id > INT32_MAX)
            return fail(err, "logit_bias",
                        "logit_bias keys must be token ids (non-negative integers as strings), got "
                        "\"%.64s\"",
                        key);
        double b = 0;
        int rc = read_number(val, "logit_bias", &b, err);
        if (rc)
            return rc;
        if (b < -100 || b > 100)
            return fail(err, "logit_bias",
                        "logit_bias values must be in [-100, 100], got %g for token %lld", b, id);
        r->logit_bias[r->n_logit_bias].token = (int32_t)id;
        r->logit_bias[r->n_logit_bias].bias = (float)b;
        r->n_logit_bias++;
    }
    return 0;
}

static int parse_output(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v;
    int rc;
    if ((v = field(root, "logprobs")) && r->kind == GEN_REQUEST_COMPLETION) {
        /* The legacy completions API: logprobs is how many alternatives, 0..5. */
        int64_t n;
        if ((rc = read_int(v, "logprobs", &n, err)))
            return rc;
        if (n < 0 || n > 5)
            return fail(err, "logprobs", "logprobs must be in [0, 5], got %lld", (long long)n);
        r->has_logprobs = r->logprobs = true;
        r->has_top_logprobs = true;
        r->top_logprobs = (int)n;
    } else if (v) {
        if ((rc = read_bool(v, "logprobs", &r->logprobs, err)))
            return rc;
        r->has_logprobs = true;
    }
    if (r->kind == GEN_REQUEST_CHAT && (v = field(root, "top_logprobs"))) {
        int64_t n;
        if ((rc = read_int(v, "top_logprobs", &n, err)))
            return rc;
        if (n < 0 || n > 20)
            return fail(err, "top_logprobs", "top_logprobs must be in [0, 20], got %lld",
                        (long long)n);
        if (!r->logprobs)
            return fail(err, "top_logprobs", "top_logprobs requires logprobs to be true");
        r->has_top_logprobs = true;
        r->top_logprobs = (int)n;
    }
    if ((v = field(root, "stream"))) {
        if ((rc = read_bool(v, "stream", &r->stream, err)))
            return rc;
        r->has_stream = true;
    }
    if ((v = field(root, "stream_options"))) {
        if (!json_object_is_type(v, json_type_object))
            return fail(err, "stream_options", "stream_options must be an object, got %s",
                        type_name(v));
        json_object *u = field(v, "include_usage");
        if (u) {
            if ((rc = read_bool(u, "stream_options.include_usage", &r->include_usage, err)))
                return rc;
            r->has_include_usage = true;
        }
    }
    return 0;
}

/* ---- tools and the rest ---------------------------------------------------- */

static int parse_tools(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v = field(root, "tools");
    int rc;
    if (v) {
        if (!json_object_is_type(v, json_type_array))
            return fail(err, "tools", "tools must be an array of function tools, got %s",
                        type_name(v));
        size_t n = json_object_array_length(v);
        for (size_t i = 0; i < n; i++) {
            char p[64], q[64];
            const char *s;
            size_t len = 0;
            json_object *t = json_object_array_get_idx(v, i);
            snprintf(p, sizeof p, "tools[%zu]", i);
            if (!json_object_is_type(t, json_type_object))
                return fail(err, p, "%s must be an object, got %s", p, type_name(t));
            param_join(q, p, ".type");
            json_object *type = field(t, "type");
            if (!type)
                return fail(err, q, "%s is required and must be \"function\"", q);
            if ((rc = read_string(type, q, &s, NULL, err)))
                return rc;
            if (strcmp(s, "function") != 0)
                return fail(err, q,
                            "%s must be \"function\" (the only tool type supported), got \"%.64s\"",
                            q, s);
            param_join(q, p, ".function");
            json_object *fn = field(t, "function");
            if (!fn || !json_object_is_type(fn, json_type_object))
                return fail(err, q, "%s must be an object with a name", q);
            param_join(q, p, ".function.name");
            json_object *name = field(fn, "name");
            if (!name)
                return fail(err, q, "%s is required", q);
            if ((rc = read_string(name, q, &s, &len, err)))
                return rc;
            if (len == 0)
                return fail(err, q, "%s must not be empty", q);
            param_join(q, p, ".function.description");
            json_object *desc = field(fn, "description");
            if (desc && (rc = read_string(desc, q, &s, NULL, err)))
                return rc;
            param_join(q, p, ".function.parameters");
            json_object *params = field(fn, "parameters");
            if (params && !json_object_is_type(params, json_type_object))
                return fail(err, q, "%s must be a JSON Schema object, got %s", q,
                            type_name(params));
            if ((rc = check_tree(t, p, err)))
                return rc;
        }
        r->tools = json_object_get(v);
    }

    json_object *c = field(root, "tool_choice");
    if (!c)
        return 0;
    bool have_tools = r->tools && json_object_array_length(r->tools) > 0;
    if (json_object_is_type(c, json_type_string)) {
        const char *s = json_object_get_string(c);
        if (!strcmp(s, "none"))
            r->tool_choice = GEN_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "auto"))
            r->tool_choice = GEN_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "required"))
            r->tool_choice = GEN_TOOL_CHOICE_REQUIRED;
        else
            return fail(err, "tool_choice",
                        "tool_choice must be \"none\", \"auto\", \"required\" or "
                        "{\"type\":\"function\",\"function\":{\"name\":...}}");
        if (r->tool_choice == GEN_TOOL_CHOICE_REQUIRED && !have_tools)
            return fail(err, "tool_choice",
                        "tool_choice \"required\" needs a non-empty tools array");
        r->has_tool_choice = true;
        return 0;
    }
    if (!json_object_is_type(c, json_type_object))
        return fail(err, "tool_choice", "tool_choice must be a string or an object, got %s",
                    type_name(c));
    json_object *type = field(c, "type");
    if (!type || !json_object_is_type(type, json_type_string) ||
        strcmp(json_object_get_string(type), "function") != 0)
        return fail(err, "tool_choice.type", "tool_choice.type must be \"function\"");
    json_object *fn = field(c, "function");
    json_object *name = fn && json_object_is_type(fn, json_type_object) ? field(fn, "name") : NULL;
    if (!name)
        return fail(err, "tool_choice.function.name", "tool_choice.function.name is required");
    const char *s;
    if ((rc = read_string(name, "tool_choice.function.name", &s, NULL, err)))
        return rc;
    bool found = false;
    size_t n = have_tools ? json_object_array_length(r->tools) : 0;
    for (size_t i = 0; i < n && !found; i++) {
        json_object *f = field(json_object_array_get_idx(r->tools, i), "function");
        found = !strcmp(json_object_get_string(field(f, "name")), s);
    }
    if (!found)
        return fail(err, "tool_choice.function.name",
                    "tool_choice names function \"%.64s\", which is not in tools", s);
    r->tool_choice_name = strdup(s);
    if (!r->tool_choice_name)
        return fail_nomem(err);
    r->tool_choice = GEN_TOOL_CHOICE_FUNCTION;
    r->has_tool_choice = true;
    return 0;
}

/* Legacy completions fields that would change the reply's meaning and that
 * inferd does not implement: refused, so a client never gets silently
 * different output. Their neutral values pass. */
static int refuse_unsupported_completion_fields(json_object *root, struct api_error *err)
{
    json_object *v;
    int rc;
    if ((v = field(root, "echo"))) {
        bool echo = false;
        if ((rc = read_bool(v, "echo", &echo, err)))
            return rc;
        if (echo)
            return fail(err, "echo", "echo is not supported: the reply holds only the generated "
                                     "text (send the prompt yourself, or echo false)");
    }
    if ((v = field(root, "best_of"))) {
        int64_t n;
        if ((rc = read_int(v, "best_of", &n, err)))
            return rc;
        if (n != 1)
            return fail(err, "best_of", "best_of must be 1 (one candidate per request), got %lld",
                        (long long)n);
    }
    if ((v = field(root, "suffix"))) {
        const char *s;
        size_t n;
        if ((rc = read_string(v, "suffix", &s, &n, err)))
            return rc;
        if (n > 0)
            return fail(err, "suffix", "suffix (fill-in-the-middle) is not supported");
    }
    return 0;
}

static int parse_misc(json_object *root, struct gen_request *r, struct api_error *err)
{
    json_object *v;
    int rc;
    const char *s;
    if ((v = field(root, "model")) && (rc = dup_string(v, "model", &r->model, NULL, err)))
        return rc;
    if ((v = field(root, "user")) && (rc = read_string(v, "user", &s, NULL, err)))
        return rc;
    if ((v = field(root, "chat_template_kwargs"))) {
        if (!json_object_is_type(v, json_type_object))
            return fail(err, "chat_template_kwargs",
                        "chat_template_kwargs must be an object, got %s", type_name(v));
        if ((rc = check_tree(v, "chat_template_kwargs", err)))
            return rc;
        r->chat_template_kwargs = json_object_get(v);
    }
    if ((v = field(root, "reasoning_effort"))) {
        static const char *const names[] = {"none", "minimal", "low", "medium", "high"};
        if ((rc = read_string(v, "reasoning_effort", &s, NULL, err)))
            return rc;
        size_t i = 0;
        while (i < 5 && strcmp(s, names[i]) != 0)
            i++;
        if (i == 5)
            return fail(err, "reasoning_effort",
                        "reasoning_effort must be one of \"none\", \"minimal\", \"low\", "
                        "\"medium\", \"high\"; got \"%.64s\"",
                        s);
        r->reasoning_effort = (enum gen_reasoning_effort)i;
        r->has_reasoning_effort = true;
    }
    if ((v = field(root, "response_format"))) {
        if ((rc = check_tree(v, "response_format", err)))
            return rc;
        r->response_format = json_object_get(v);
    }
    if (r->kind == GEN_REQUEST_COMPLETION && (rc = refuse_unsupported_completion_fields(root, err)))
        return rc;
    return 0;
}

/* ---- entry points ---------------------------------------------------------- */

int gen_request_parse(const char *body, size_t len, enum gen_request_kind kind,
                      struct gen_request *out, struct api_error *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    if (!body || len == 0)
        return fail(err, NULL, "could not parse the JSON body: the body is empty");
    if (len > INT32_MAX)
        return fail(err, NULL, "the body is too large");
    int rc = scan_numbers(body, len, err);
    if (rc)
        return rc;
    bool is_null;
    json_object *root = parse_json(body, len, &is_null, err);
    if (!root && !is_null)
        return err->status == 500 ? -INFERD_ENOMEM : -INFERD_EINVAL;
    if (!json_object_is_type(root, json_type_object)) {
        rc = fail(err, NULL, "the request body must be a JSON object, got %s", type_name(root));
        json_object_put(root);
        return rc;
    }
    rc = kind == GEN_REQUEST_CHAT ? parse_messages(root, out, err) : parse_prompt(root, out, err);
    if (!rc)
        rc = parse_max_tokens(root, out, err);
    if (!rc)
        rc = parse_sampling(root, out, err);
    if (!rc)
        rc = parse_stop(root, out, err);
    if (!rc)
        rc = parse_logit_bias(root, out, err);
    if (!rc)
        rc = parse_output(root, out, err);
    if (!rc)
        rc = parse_tools(root, out, err);
    if (!rc)
        rc = parse_misc(root, out, err);
    json_object_put(root);
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
    json_object_put(r->response_format);
    memset(r, 0, sizeof *r);
}
