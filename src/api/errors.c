/* api/errors.c — the error record's kind and the per-API renderings of it. */
#include "api/errors.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void api_error_setv(struct api_error *e, int status, enum api_error_kind kind, const char *param,
                    const char *code, const char *fmt, va_list ap)
{
    memset(e, 0, sizeof *e);
    e->status = status;
    e->kind = kind;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
}

void api_error_set(struct api_error *e, int status, enum api_error_kind kind, const char *param,
                   const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    api_error_setv(e, status, kind, param, code, fmt, ap);
    va_end(ap);
}

enum api_error_kind api_error_kind_of(const struct api_error *e)
{
    if (e->kind > API_ERROR_UNSET && e->kind <= API_ERROR_UNAVAILABLE)
        return e->kind;
    switch (e->status) {
    case 401: return API_ERROR_AUTHENTICATION;
    case 404: return API_ERROR_NOT_FOUND;
    case 429: return API_ERROR_RATE_LIMIT;
    case 503: return API_ERROR_UNAVAILABLE;
    default: return e->status >= 500 ? API_ERROR_SERVER : API_ERROR_INVALID_REQUEST;
    }
}

/* OpenAI folds authentication and missing things into invalid requests, and
 * everything the server cannot do now into server errors. */
static const char *openai_type(enum api_error_kind kind)
{
    switch (kind) {
    case API_ERROR_RATE_LIMIT: return "rate_limit_error";
    case API_ERROR_SERVER:
    case API_ERROR_UNAVAILABLE: return "server_error";
    default: return "invalid_request_error";
    }
}

static json_object *string_or_null(const char *s)
{
    return s[0] ? json_object_new_string(s) : NULL;
}

/* Appends root as compact JSON to out and frees it: 0, or -INFERD_ENOMEM. */
static int append_and_free(json_object *root, struct strbuf *out)
{
    size_t len = 0;
    const char *s = json_object_to_json_string_length(
        root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    bool ok = s && strbuf_append(out, s, len);
    json_object_put(root);
    return ok ? 0 : -INFERD_ENOMEM;
}

int api_error_render_openai(const struct api_error *e, struct strbuf *out)
{
    json_object *inner = json_object_new_object();
    json_object *root = json_object_new_object();
    if (!inner || !root) {
        json_object_put(inner);
        json_object_put(root);
        return -INFERD_ENOMEM;
    }
    json_object_object_add(root, "error", inner);
    json_object_object_add(inner, "message", json_object_new_string(e->message));
    const char *type = openai_type(api_error_kind_of(e));
    json_object_object_add(inner, "type", json_object_new_string(type));
    json_object_object_add(inner, "param", string_or_null(e->param));
    json_object_object_add(inner, "code", string_or_null(e->code));
    return append_and_free(root, out);
}

const struct api_error_format api_error_openai = {
    .render = api_error_render_openai,
    .content_type = "application/json",
    .out_of_memory = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                     "\"param\":null,\"code\":null}}",
};

/* Anthropic names its error types after the status, with a few of its own (403, 413, 529). */
static const char *anthropic_type(const struct api_error *e)
{
    switch (e->status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: break;
    }
    switch (api_error_kind_of(e)) {
    case API_ERROR_AUTHENTICATION: return "authentication_error";
    case API_ERROR_NOT_FOUND: return "not_found_error";
    case API_ERROR_RATE_LIMIT: return "rate_limit_error";
    case API_ERROR_UNAVAILABLE: return "overloaded_error";
    case API_ERROR_SERVER: return "api_error";
    default: return e->status >= 500 ? "api_error" : "invalid_request_error";
    }
}

int api_error_render_anthropic(const struct api_error *e, struct strbuf *out)
{
    json_object *inner = json_object_new_object();
    json_object *root = json_object_new_object();
    if (!inner || !root) {
        json_object_put(inner);
        json_object_put(root);
        return -INFERD_ENOMEM;
    }
    json_object_object_add(root, "type", json_object_new_string("error"));
    json_object_object_add(root, "error", inner);
    json_object_object_add(inner, "type", json_object_new_string(anthropic_type(e)));
    json_object_object_add(inner, "message", json_object_new_string(e->message));
    return append_and_free(root, out);
}

const struct api_error_format api_error_anthropic = {
    .render = api_error_render_anthropic,
    .content_type = "application/json",
    .out_of_memory = "{\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                     "\"message\":\"out of memory\"}}",
};

int api_error_to_json(const struct api_error *e, char **out)
{
    struct strbuf b = {0};
    *out = NULL;
    if (api_error_render_openai(e, &b) < 0 || b.failed || !b.data) {
        strbuf_free(&b);
        return -INFERD_ENOMEM;
    }
    *out = b.data; /* the buffer's storage becomes the caller's */
    return 0;
}
