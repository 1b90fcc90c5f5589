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
struct request_state;

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
    struct request_state *state; /* the transport's own; NULL outside a connection (a WebSocket
                                    session's exchange, tests) */
};

/* The value of request header name (case-insensitive), or NULL. */
const char *http_header(const struct http_exchange *x, const char *name);

/* Sends a complete response. */
void http_send_json(struct http_exchange *x, int status, const char *json, size_t len);
void http_send_text(struct http_exchange *x, int status, const char *content_type,
                    const char *text, size_t len);
/* Sends a response the handler built with libmicrohttpd (headers of its own: the web page's
 * caching and security headers); takes r over. */
struct MHD_Response;
void http_send_response(struct http_exchange *x, int status, struct MHD_Response *r);
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

/* A WebSocket session. run is called on a thread of its own once the 101 is out, with the
 * connection's socket (borrowed) and the bytes the client sent after its handshake; when it
 * returns the transport closes the connection. release runs once: after run, or instead of it
 * when the connection ends before the upgrade. http_stop shuts every session's socket down and
 * waits for its run to return. */
struct http_websocket {
    void (*run)(void *ctx, int fd, const char *early, size_t n_early);
    void (*release)(void *ctx);
    void *ctx;
};
/* Answers a WebSocket opening handshake (RFC 6455 §4.2.2). A GET with "Upgrade: websocket", a
 * Connection header naming upgrade, Sec-WebSocket-Version 13 and a well-formed Sec-WebSocket-Key
 * gets 101 with Sec-WebSocket-Accept, then ws runs. Anything else is answered in plain text, ws
 * released: no Upgrade header, 426 "expected websocket"; another version, 426 naming 13 in
 * Sec-WebSocket-Version; a missing or malformed key, or no Connection: upgrade, 400. */
void http_send_websocket(struct http_exchange *x, struct http_websocket ws);

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
