/* api/http.h — the HTTP/1.1 transport (libmicrohttpd): connections and their time limits,
 * request bodies, authentication, routing through a table its caller fills, and the responses
 * handlers send. It knows no API: routes, handlers and error bodies come from the table. */
#ifndef INFERD_API_HTTP_H
#define INFERD_API_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "api/errors.h"
#include "api/keys.h"
#include "api/multipart.h"
#include "api/server.h"
#include "base/strbuf.h"

struct http_exchange;

/* What a route's body must be; checked (415) before the body is read. */
enum http_body {
    HTTP_BODY_NONE,      /* any Content-Type; the body is handed over as it came */
    HTTP_BODY_JSON,      /* application/json, or no Content-Type at all */
    HTTP_BODY_MULTIPART, /* multipart/form-data; boundary=…: parsed into x->form (400 when
                            malformed) */
};

struct http_route {
    const char *method; /* "GET" (which answers HEAD too), "POST" or "DELETE" */
    const char *path;   /* matched exactly, or with id_tail as path + "/" + a non-empty id */
    bool id_tail;
    enum http_body body;
    void (*handle)(struct http_exchange *x); /* must send exactly one response */
    const struct api_error_format *errors;   /* NULL: the table's */
    bool open;          /* answered without the API key (health checks) */
};

/* A server's routes, in the order requests are counted and reported. Routes
 * with the same path share a label in the request counters. */
struct http_routes {
    const struct http_route *routes; /* borrowed; n entries, at most API_METRICS_MAX_ROUTES */
    size_t n;
    const struct api_error_format *errors; /* the default, also for paths no route has */
};

/* One request as a handler sees it. */
struct http_exchange {
    struct server *srv;
    struct MHD_Connection *conn;
    const char *method;
    const char *path;
    const char *id;         /* an id_tail route's id (the rest of the path), else NULL */
    const char *body;       /* NUL-terminated; body_len bytes */
    size_t body_len;
    const struct multipart_form *form; /* HTTP_BODY_MULTIPART routes: the parts, else NULL */
    const struct http_route *route;    /* NULL for a path no route has */
    const struct api_error_format *errors; /* how this route writes its errors */
    int counter;            /* the request counters' slot (api_metrics_count) */
    int client_fd;          /* for noticing a client that went away */
    uint64_t tenant_ns;     /* the namespace of the API key presented (api/keys.h); 0 when the
                               server has no keys or the route is open */
    bool responded;
};

/* The value of request header name (case-insensitive), or NULL. */
const char *http_header(const struct http_exchange *x, const char *name);

/* Sends a complete response. */
void http_send_json(struct http_exchange *x, int status, const char *json, size_t len);
void http_send_text(struct http_exchange *x, int status, const char *content_type,
                    const char *text, size_t len);
/* Sends e with its status, as the route's error format writes it. */
void http_send_error(struct http_exchange *x, const struct api_error *e);
/* Fills an api_error and sends it. */
void http_send_errorf(struct http_exchange *x, int status, enum api_error_kind kind,
                      const char *param, const char *code, const char *fmt, ...)
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

/* Listens on srv->cfg's host and port and answers with routes (borrowed; must
 * outlive the daemon). Sets up srv->metrics with one counter set per route. */
int http_start(struct server *srv, const struct http_routes *routes, struct http_daemon **out,
               struct err *err);
int http_bound_port(const struct http_daemon *d);
/* Stops accepting new connections; open ones carry on. */
void http_quiesce(struct http_daemon *d);
/* Closes every connection and frees the daemon. */
void http_stop(struct http_daemon *d);

#endif
