/* api/http.h — the HTTP/1.1 front end (libmicrohttpd): connections and their time limits,
 * request bodies, authentication, routing, and the responses handlers send. */
#ifndef INFERD_API_HTTP_H
#define INFERD_API_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "api/metrics.h"
#include "api/request.h"
#include "api/server.h"
#include "base/strbuf.h"

/* One request as a handler sees it. */
struct http_exchange {
    struct server *srv;
    struct MHD_Connection *conn;
    const char *method;
    const char *path;
    const char *body; /* NUL-terminated; body_len bytes */
    size_t body_len;
    enum api_route route;
    int client_fd;    /* for noticing a client that went away */
    const char *warning; /* static text for a Warning header on the response, or NULL */
    bool responded;
};

/* Sends a complete response. */
void http_send_json(struct http_exchange *x, int status, const char *json, size_t len);
void http_send_text(struct http_exchange *x, int status, const char *content_type,
                    const char *text, size_t len);
void http_send_error(struct http_exchange *x, const struct api_error *e);
/* Fills an api_error and sends it. */
void http_send_errorf(struct http_exchange *x, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* A streamed response (Server-Sent Events). produce appends the next bytes
 * to out, blocking until it has some; it sets *done after the last. It
 * returns false when the stream must be cut (the client went away).
 * release runs once when the connection is done with the stream. */
struct http_stream {
    bool (*produce)(void *ctx, struct strbuf *out, bool *done);
    void (*release)(void *ctx);
    void *ctx;
};
void http_send_stream(struct http_exchange *x, int status, const char *content_type,
                      struct http_stream stream);

/* True when the peer closed its side of the connection or reset it. */
bool http_client_gone(int fd);

struct http_daemon;

int http_start(struct server *srv, struct http_daemon **out, struct err *err);
int http_bound_port(const struct http_daemon *d);
/* Stops accepting new connections; open ones carry on. */
void http_quiesce(struct http_daemon *d);
/* Closes every connection and frees the daemon. */
void http_stop(struct http_daemon *d);

/* Route handlers (api/openai.c, api/admin.c). */
void openai_chat_completions(struct http_exchange *x);
void openai_completions(struct http_exchange *x);
void openai_models(struct http_exchange *x, const char *id);
void admin_health(struct http_exchange *x);
void admin_stats(struct http_exchange *x);
void admin_metrics(struct http_exchange *x);

#endif
