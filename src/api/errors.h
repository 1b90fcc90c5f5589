/* api/errors.h — one error record for every API, and one formatter per API that renders it as
 * that API's error body (OpenAI's, Anthropic's). */
#ifndef INFERD_API_ERRORS_H
#define INFERD_API_ERRORS_H

#include <stdarg.h>

#include "base/strbuf.h"

/* What went wrong, in terms every API can name its own way. */
enum api_error_kind {
    API_ERROR_UNSET = 0,        /* follow the status: 401, 404, 429, 503, other 5xx, else 400 */
    API_ERROR_INVALID_REQUEST,  /* the request cannot be served as sent */
    API_ERROR_AUTHENTICATION,   /* no valid API key */
    API_ERROR_NOT_FOUND,        /* no such route or model */
    API_ERROR_RATE_LIMIT,       /* the admission queue is full; try again */
    API_ERROR_SERVER,           /* a fault of the server's */
    API_ERROR_UNAVAILABLE,      /* loading, stopping, out of memory, cancelled */
};

/* An error as a handler reports it; empty param/code mean none. */
struct api_error {
    int status;               /* HTTP status: 400 for bad input, 500 when memory ran out */
    enum api_error_kind kind; /* API_ERROR_UNSET: derived from status */
    char type[32];            /* OpenAI's type name as request parsing writes it; formatters
                                 read kind (or status) instead, which says the same */
    char param[64];           /* the offending field, e.g. "messages[2].role" */
    char code[64];            /* machine-readable code, often empty */
    char message[512];        /* says what was wrong and what is allowed */
};

/* Fills every field of e (type left empty). param and code may be NULL. */
void api_error_set(struct api_error *e, int status, enum api_error_kind kind, const char *param,
                   const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void api_error_setv(struct api_error *e, int status, enum api_error_kind kind, const char *param,
                    const char *code, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));

/* e's kind, derived from its status when unset (or out of range). */
enum api_error_kind api_error_kind_of(const struct api_error *e);

/* How one API writes its errors. render appends the body for e to out and
 * returns 0 or -INFERD_ENOMEM; out_of_memory is a fixed body sent with status
 * 500 when rendering fails. */
struct api_error_format {
    int (*render)(const struct api_error *e, struct strbuf *out);
    const char *content_type;
    const char *out_of_memory;
};

/* OpenAI: {"error":{"message":…,"type":…,"param":…|null,"code":…|null}}. */
int api_error_render_openai(const struct api_error *e, struct strbuf *out);
extern const struct api_error_format api_error_openai;

/* Anthropic: {"type":"error","error":{"type":…,"message":…}}, the type following the status:
 * 400 invalid_request_error, 401 authentication_error, 403 permission_error, 404
 * not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error, 503 and 529
 * overloaded_error (other 4xx: invalid_request_error, other 5xx: api_error). */
int api_error_render_anthropic(const struct api_error *e, struct strbuf *out);
extern const struct api_error_format api_error_anthropic;

/* The OpenAI body in *out (malloc'd, caller frees). Returns 0 or -INFERD_ENOMEM. */
int api_error_to_json(const struct api_error *e, char **out);

#endif
