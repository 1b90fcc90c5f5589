/* api/http.c — the HTTP/1.1 transport on libmicrohttpd: one thread per connection, request
 * deadlines against slow clients, body limits, authentication, routing through the caller's
 * table, and responses. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "api/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/websocket.h"
#include "base/log.h"
#include "base/timer.h"

/* A connection the watchdog keeps an eye on: a request (headers and body)
 * must arrive before its deadline, so a client sending one byte a second
 * cannot hold a connection for ever. */
struct conn_watch {
    int fd;
    uint64_t deadline_ns; /* 0: a request is being answered, no deadline */
    bool upgraded;        /* a WebSocket session owns the connection: it never gets a deadline */
    struct conn_watch *prev, *next;
};

struct http_daemon {
    struct MHD_Daemon *mhd;
    struct server *srv;          /* borrowed */
    const struct http_routes *routes; /* borrowed */
    pthread_mutex_t watch_mu;
    struct conn_watch *watched;  /* list of live connections, under watch_mu */
    pthread_t watchdog;
    bool watchdog_running;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stopping;               /* under stop_mu */
    int port;
    pthread_mutex_t ws_mu;
    pthread_cond_t ws_cv;        /* signalled when a WebSocket session ends */
    struct ws_session *sessions; /* live WebSocket sessions, under ws_mu */
    bool ws_closing;             /* under ws_mu: http_stop is ending every session */
    int ws_upgrading;            /* under ws_mu: 101s queued whose upgrade has not run yet */
};

/* A WebSocket session on its own thread, from the upgrade until its run returns. */
struct ws_session {
    struct http_daemon *d;
    struct http_websocket ws;
    int fd;
    char *early;                 /* owned; bytes the client sent after the handshake */
    size_t n_early;
    struct MHD_UpgradeResponseHandle *urh;
    struct ws_session *prev, *next;
};

/* Per-request state kept between libmicrohttpd's calls of the access handler. */
struct request_state {
    struct strbuf body;
    bool too_large;
    bool handled;
    uint64_t tenant_ns;          /* from the key the request presented, at admission */
    struct multipart_form form;  /* owned; multipart routes, once the body is here */
    struct http_daemon *d;
    struct http_websocket ws;    /* a WebSocket route's session until the upgrade takes it */
    bool ws_pending;             /* ws is set and not yet taken */
    bool upgraded;
};

static uint64_t deadline_after(int seconds)
{
    return now_ns() + (uint64_t)seconds * 1000000000ull;
}

bool http_client_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
        return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return false;
}

/* ---- responses ---- */

static void count(struct http_exchange *x, int status)
{
    api_metrics_count(&x->srv->metrics, x->counter, status);
}

static void queue(struct http_exchange *x, int status, struct MHD_Response *r)
{
    if (!r) {
        log_error("http: out of memory for a response");
        x->responded = true;
        return;
    }
    MHD_add_response_header(r, "Server", "inferd");
    MHD_queue_response(x->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    count(x, status);
    x->responded = true;
}

void http_send_response(struct http_exchange *x, int status, struct MHD_Response *r)
{
    queue(x, status, r);
}

void http_send_text(struct http_exchange *x, int status, const char *content_type,
                    const char *text, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (r)
        MHD_add_response_header(r, "Content-Type", content_type);
    queue(x, status, r);
}

void http_send_json(struct http_exchange *x, int status, const char *json, size_t len)
{
    http_send_text(x, status, "application/json", json, len);
}

void http_send_error(struct http_exchange *x, const struct api_error *e)
{
    const struct api_error_format *f = x->errors;
    struct strbuf b = {0};
    if (f->render(e, &b) < 0 || b.failed) {
        http_send_text(x, 500, f->content_type, f->out_of_memory, strlen(f->out_of_memory));
    } else {
        http_send_text(x, e->status, f->content_type, b.data ? b.data : "", b.len);
    }
    strbuf_free(&b);
}

void http_send_errorf(struct http_exchange *x, int status, enum api_error_kind kind,
                      const char *param, const char *code, const char *fmt, ...)
{
    struct api_error e;
    va_list ap;
    va_start(ap, fmt);
    api_error_setv(&e, status, kind, param, code, fmt, ap);
    va_end(ap);
    http_send_error(x, &e);
}

struct stream_state {
    struct http_stream s;
    struct strbuf pending;
    bool done;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream_state *st = cls;
    while (st->pending.len == 0) {
        if (st->done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!st->s.produce(st->s.ctx, &st->pending, &st->done) || st->pending.failed)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->pending.len < max ? st->pending.len : max;
    memcpy(buf, st->pending.data, n);
    strbuf_consume(&st->pending, n);
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream_state *st = cls;
    st->s.release(st->s.ctx);
    strbuf_free(&st->pending);
    free(st);
}

void http_send_stream(struct http_exchange *x, int status, const char *content_type,
                      struct http_stream stream)
{
    struct stream_state *st = calloc(1, sizeof *st);
    if (!st) {
        stream.release(stream.ctx);
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for a stream");
        return;
    }
    st->s = stream;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                          stream_free);
    if (!r) {
        stream_free(st);
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for a stream");
        return;
    }
    MHD_add_response_header(r, "Content-Type", content_type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    queue(x, status, r);
}

/* ---- routing ---- */

static bool path_matches(const struct http_route *r, const char *path)
{
    size_t n = strlen(r->path);
    if (!r->id_tail)
        return !strcmp(path, r->path);
    return !strncmp(path, r->path, n) && path[n] == '/' && path[n + 1];
}

static bool method_is(const char *method, const char *want)
{
    return !strcmp(method, want) || (!strcmp(want, "GET") && !strcmp(method, "HEAD"));
}

/* The route for method and path, or NULL. *first_on_path is the index of the
 * first route whose path matches, whose counters take the request (a 405
 * too); -1 when no route has the path. */
static const struct http_route *find_route(const struct http_routes *t, const char *method,
                                           const char *path, int *first_on_path)
{
    *first_on_path = -1;
    for (size_t i = 0; i < t->n; i++) {
        const struct http_route *r = &t->routes[i];
        if (!path_matches(r, path))
            continue;
        if (*first_on_path < 0)
            *first_on_path = (int)i;
        if (method_is(method, r->method))
            return r;
    }
    return NULL;
}

/* The key the request presents: "Authorization: Bearer KEY", else "x-api-key: KEY". */
static const char *presented_key(struct http_exchange *x)
{
    const char *auth = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncasecmp(auth, "Bearer ", 7)) {
        const char *given = auth + 7;
        while (*given == ' ')
            given++;
        return given;
    }
    return MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "x-api-key");
}

/* True when the route is open, no key is configured, or the request presents
 * one of the keys; then x->tenant_ns is that key's namespace (0 without keys). */
static bool authorized(struct http_exchange *x)
{
    const struct server_config *cfg = &x->srv->cfg;
    bool have_list = cfg->api_keys && cfg->api_keys->n > 0;
    x->tenant_ns = 0;
    if ((!cfg->api_key && !have_list) || x->route->open)
        return true;
    const char *given = presented_key(x);
    if (!given)
        return false;
    size_t len = strlen(given);
    if (cfg->api_key) {
        const struct api_keys one = {.keys = (char **)&cfg->api_key, .n = 1};
        if (api_keys_match(&one, given, len) == 0) {
            x->tenant_ns = api_keys_namespace(cfg->api_key, strlen(cfg->api_key));
            return true;
        }
    }
    int i = have_list ? api_keys_match(cfg->api_keys, given, len) : -1;
    if (i < 0)
        return false;
    x->tenant_ns = cfg->api_keys->ns[i];
    return true;
}

const char *http_header(const struct http_exchange *x, const char *name)
{
    if (!x->conn)
        return NULL;
    return MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, name);
}

/* The 415 check of a route's body kind. */
static bool content_type_is_json(const char *ct)
{
    if (!ct)
        return true; /* no header: read the body as JSON */
    while (*ct == ' ')
        ct++;
    static const char want[] = "application/json";
    if (strncasecmp(ct, want, sizeof want - 1))
        return false;
    char next = ct[sizeof want - 1];
    return next == '\0' || next == ';' || next == ' ';
}

struct length_headers {
    int count;
    char first[32];
    bool differ;
};

static enum MHD_Result count_length_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                           const char *value)
{
    struct length_headers *h = cls;
    if (strcasecmp(key, "Content-Length"))
        return MHD_YES;
    if (h->count++ == 0)
        snprintf(h->first, sizeof h->first, "%s", value ? value : "");
    else if (strcmp(h->first, value ? value : ""))
        h->differ = true;
    return MHD_YES;
}

/* The methods the routes on x's path take, for Allow ("GET, POST"). */
static void allowed_methods(const struct http_routes *t, const char *path, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < t->n; i++) {
        const struct http_route *r = &t->routes[i];
        if (!path_matches(r, path) || strstr(out, r->method))
            continue;
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", r->method);
    }
}

/* The Content-Type check of a route's body kind. */
static bool content_type_fits(struct http_exchange *x)
{
    if (x->route->body == HTTP_BODY_NONE)
        return true;
    const char *ct = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "Content-Type");
    if (x->route->body == HTTP_BODY_JSON) {
        if (content_type_is_json(ct))
            return true;
        http_send_errorf(x, 415, API_ERROR_INVALID_REQUEST, NULL, "unsupported_media_type",
                         "Content-Type must be application/json, got '%.100s'", ct);
        return false;
    }
    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    struct err err = {0};
    if (multipart_boundary(ct, boundary, &err) == 0)
        return true;
    http_send_errorf(x, 415, API_ERROR_INVALID_REQUEST, NULL, "unsupported_media_type", "%s",
                     err.msg);
    return false;
}

/* Checks that can be made before the body arrives; sends the error and
 * returns false when the request is refused. */
static bool admit_request(struct http_exchange *x, const struct http_routes *t)
{
    struct server *srv = x->srv;
    if (x->counter < 0) { /* no route has this path */
        http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, "not_found", "no route for %s %s",
                         x->method, x->path);
        return false;
    }
    if (!x->route) {
        char allow[64];
        allowed_methods(t, x->path, allow, sizeof allow);
        struct api_error e;
        api_error_set(&e, 405, API_ERROR_INVALID_REQUEST, NULL, "method_not_allowed",
                      "%s does not accept %s; use %s", x->path, x->method, allow);
        struct strbuf b = {0};
        if (x->errors->render(&e, &b) == 0 && !b.failed) {
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
            if (resp) {
                MHD_add_response_header(resp, "Content-Type", x->errors->content_type);
                MHD_add_response_header(resp, "Allow", allow);
            }
            queue(x, 405, resp);
        } else {
            http_send_error(x, &e);
        }
        strbuf_free(&b);
        return false;
    }
    if (!authorized(x)) {
        http_send_errorf(x, 401, API_ERROR_AUTHENTICATION, NULL, "invalid_api_key",
                         "a valid API key is required: send it as 'Authorization: Bearer KEY'");
        return false;
    }
    struct length_headers lengths = {0};
    MHD_get_connection_values(x->conn, MHD_HEADER_KIND, count_length_header, &lengths);
    if (lengths.differ) {
        /* Which body length is meant cannot be known (RFC 9112 §6.3). */
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, "bad_request",
                         "conflicting Content-Length headers");
        return false;
    }
    if (!content_type_fits(x))
        return false;
    if (!strcmp(x->route->method, "POST")) {
        const char *cl = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (end != cl && n > srv->cfg.max_body_bytes) {
                http_send_errorf(x, 413, API_ERROR_INVALID_REQUEST, NULL, "request_too_large",
                                 "the body is %llu bytes; the limit is %zu", n,
                                 srv->cfg.max_body_bytes);
                return false;
            }
        }
    }
    return true;
}

/* Hands the complete request to its route's handler. */
static void dispatch(struct http_exchange *x, struct request_state *rs)
{
    if (x->route->body == HTTP_BODY_MULTIPART) {
        const char *ct = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, "Content-Type");
        char boundary[MULTIPART_MAX_BOUNDARY + 1];
        struct err err = {0};
        int rc = multipart_boundary(ct, boundary, &err);
        if (rc == 0)
            rc = multipart_parse(x->body, x->body_len, boundary, &rs->form, &err);
        if (rc < 0) {
            if (rc == -INFERD_ENOMEM)
                http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "%s", err.msg);
            else
                http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, "bad_request", "%s",
                                 err.msg);
            return;
        }
        x->form = &rs->form;
    }
    x->route->handle(x);
    if (!x->responded)
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "the handler sent no response");
}

static struct conn_watch *watch_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void watch_set_deadline(struct http_daemon *d, struct MHD_Connection *conn,
                               uint64_t deadline)
{
    struct conn_watch *w = watch_of(conn);
    if (!w)
        return;
    pthread_mutex_lock(&d->watch_mu);
    w->deadline_ns = w->upgraded ? 0 : deadline;
    pthread_mutex_unlock(&d->watch_mu);
}

/* ---- WebSocket upgrade ---- */

/* Releases a session's context, takes it off the daemon's list and hands its connection back
 * to libmicrohttpd, which closes it. */
static void ws_session_end(struct http_daemon *d, struct ws_session *s)
{
    s->ws.release(s->ws.ctx);
    pthread_mutex_lock(&d->ws_mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        d->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    /* Handed back under the lock, so http_stop never stops the daemon between the two. */
    MHD_upgrade_action(s->urh, MHD_UPGRADE_ACTION_CLOSE);
    pthread_cond_broadcast(&d->ws_cv);
    pthread_mutex_unlock(&d->ws_mu);
    free(s->early);
    free(s);
}

static void *ws_session_main(void *arg)
{
    struct ws_session *s = arg;
    struct http_daemon *d = s->d;
    s->ws.run(s->ws.ctx, s->fd, s->early, s->n_early);
    ws_session_end(d, s);
    return NULL;
}

/* libmicrohttpd's call once the 101 is sent: the socket is the session's from here. */
static void on_upgrade(void *cls, struct MHD_Connection *conn, void *req_cls, const char *extra_in,
                       size_t extra_in_size, MHD_socket sock,
                       struct MHD_UpgradeResponseHandle *urh)
{
    struct request_state *rs = req_cls;
    struct http_daemon *d = rs->d;
    struct ws_session *s = calloc(1, sizeof *s);
    char *early = extra_in_size ? malloc(extra_in_size) : NULL;
    rs->ws_pending = false;
    rs->upgraded = true;
    if (!s || (extra_in_size && !early)) {
        free(s);
        free(early);
        rs->ws.release(rs->ws.ctx);
        pthread_mutex_lock(&d->ws_mu);
        d->ws_upgrading--;
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        pthread_cond_broadcast(&d->ws_cv);
        pthread_mutex_unlock(&d->ws_mu);
        return;
    }
    if (extra_in_size)
        memcpy(early, extra_in, extra_in_size);
    *s = (struct ws_session){.d = d, .ws = rs->ws, .fd = sock, .early = early,
                             .n_early = extra_in_size, .urh = urh};
    pthread_mutex_lock(&d->ws_mu);
    d->ws_upgrading--;
    s->next = d->sessions;
    if (d->sessions)
        d->sessions->prev = s;
    d->sessions = s;
    if (d->ws_closing) /* upgraded while the server stops: over at once */
        shutdown(sock, SHUT_RDWR);
    pthread_mutex_unlock(&d->ws_mu);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, ws_session_main, s) != 0) {
        log_error("http: no thread for a WebSocket session");
        ws_session_end(d, s);
    }
    pthread_attr_destroy(&attr);
}

/* True when the comma-separated header value lists token (case-insensitive). */
static bool header_lists(const char *value, const char *token)
{
    size_t n = strlen(token);
    for (const char *p = value; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *last = end;
        while (last > p && (last[-1] == ' ' || last[-1] == '\t'))
            last--;
        if ((size_t)(last - p) == n && !strncasecmp(p, token, n))
            return true;
        p = end;
    }
    return false;
}

static void send_plain(struct http_exchange *x, int status, const char *text, const char *hname,
                       const char *hvalue)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (r) {
        MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
        if (hname)
            MHD_add_response_header(r, hname, hvalue);
    }
    queue(x, status, r);
}

void http_send_websocket(struct http_exchange *x, struct http_websocket ws)
{
    const char *upgrade = http_header(x, "Upgrade");
    const char *connection = http_header(x, "Connection");
    const char *version = http_header(x, "Sec-WebSocket-Version");
    const char *key = http_header(x, "Sec-WebSocket-Key");
    if (!x->state || !upgrade || !header_lists(upgrade, "websocket") || strcmp(x->method, "GET")) {
        ws.release(ws.ctx);
        send_plain(x, 426, "expected websocket", "Upgrade", "websocket");
        return;
    }
    if (!version || strcmp(version, "13")) {
        ws.release(ws.ctx);
        send_plain(x, 426, "unsupported WebSocket version; this server speaks 13",
                   "Sec-WebSocket-Version", "13");
        return;
    }
    if (!connection || !header_lists(connection, "upgrade") || !ws_client_key_valid(key)) {
        ws.release(ws.ctx);
        send_plain(x, 400,
                   !ws_client_key_valid(key)
                       ? "Sec-WebSocket-Key must be the base64 of 16 bytes"
                       : "a WebSocket handshake needs 'Connection: Upgrade'",
                   NULL, NULL);
        return;
    }
    char accept[WS_ACCEPT_LEN + 1];
    ws_accept_key(key, accept);
    struct MHD_Response *r = MHD_create_response_for_upgrade(on_upgrade, NULL);
    if (!r) {
        ws.release(ws.ctx);
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for an upgrade");
        return;
    }
    MHD_add_response_header(r, "Upgrade", "websocket");
    MHD_add_response_header(r, "Sec-WebSocket-Accept", accept);
    x->state->ws = ws;
    x->state->ws_pending = true;
    /* http_stop waits for the upgrade (or the request's end) before stopping the daemon: the
     * client may see the 101 before the session exists. */
    pthread_mutex_lock(&x->state->d->ws_mu);
    x->state->d->ws_upgrading++;
    pthread_mutex_unlock(&x->state->d->ws_mu);
    /* The session owns the connection from the upgrade on: no request deadline applies. */
    struct conn_watch *w = watch_of(x->conn);
    if (w) {
        pthread_mutex_lock(&x->state->d->watch_mu);
        w->upgraded = true;
        w->deadline_ns = 0;
        pthread_mutex_unlock(&x->state->d->watch_mu);
    }
    queue(x, 101, r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct http_daemon *d = cls;
    struct server *srv = d->srv;
    struct request_state *rs = *con_cls;
    int first_on_path;
    const struct http_route *r = find_route(d->routes, method, url, &first_on_path);
    const union MHD_ConnectionInfo *fdi =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const struct http_route *counted =
        first_on_path >= 0 ? &d->routes->routes[first_on_path] : NULL;
    struct http_exchange x = {
        .srv = srv,
        .conn = conn,
        .method = method,
        .path = url,
        .route = r,
        .errors = counted && counted->errors ? counted->errors : d->routes->errors,
        .counter = first_on_path,
        .client_fd = fdi ? fdi->connect_fd : -1,
        .state = rs,
    };

    if (!rs) {
        rs = calloc(1, sizeof *rs);
        if (!rs)
            return MHD_NO;
        *con_cls = rs;
        rs->d = d;
        x.state = rs;
        if (!admit_request(&x, d->routes))
            rs->handled = true;
        rs->tenant_ns = x.tenant_ns;
        return MHD_YES;
    }
    if (rs->handled) {
        *upload_data_size = 0; /* the answer is sent; the rest of the body is dropped */
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!rs->too_large) {
            if (rs->body.len + *upload_data_size > srv->cfg.max_body_bytes) {
                rs->too_large = true;
                strbuf_free(&rs->body);
            } else if (!strbuf_append(&rs->body, upload_data, *upload_data_size)) {
                rs->too_large = true;
                strbuf_free(&rs->body);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* The whole request is here: no deadline while it is answered. */
    watch_set_deadline(d, conn, 0);
    rs->handled = true;
    if (rs->too_large) {
        http_send_errorf(&x, 413, API_ERROR_INVALID_REQUEST, NULL, "request_too_large",
                         "the body is over the limit of %zu bytes", srv->cfg.max_body_bytes);
        return MHD_YES;
    }
    x.tenant_ns = rs->tenant_ns;
    x.body = rs->body.data ? rs->body.data : "";
    x.body_len = rs->body.len;
    if (r->id_tail)
        x.id = url + strlen(r->path) + 1;
    dispatch(&x, rs);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_daemon *d = cls;
    struct request_state *rs = *con_cls;
    if (rs) {
        if (rs->ws_pending) { /* queued a 101 that never ran its upgrade */
            rs->ws.release(rs->ws.ctx);
            pthread_mutex_lock(&d->ws_mu);
            d->ws_upgrading--;
            pthread_cond_broadcast(&d->ws_cv);
            pthread_mutex_unlock(&d->ws_mu);
        }
        strbuf_free(&rs->body);
        multipart_free(&rs->form);
        free(rs);
        *con_cls = NULL;
    }
    /* The next request on this connection must arrive in time too. */
    watch_set_deadline(d, conn,
                       deadline_after(d->srv->cfg.idle_timeout_s + d->srv->cfg.request_timeout_s));
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct http_daemon *d = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn_watch *w = calloc(1, sizeof *w);
        if (!w)
            return;
        const union MHD_ConnectionInfo *fdi =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        w->fd = fdi ? fdi->connect_fd : -1;
        w->deadline_ns = deadline_after(d->srv->cfg.request_timeout_s);
        pthread_mutex_lock(&d->watch_mu);
        w->next = d->watched;
        if (d->watched)
            d->watched->prev = w;
        d->watched = w;
        pthread_mutex_unlock(&d->watch_mu);
        *socket_context = w;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn_watch *w = *socket_context;
        if (!w)
            return;
        pthread_mutex_lock(&d->watch_mu);
        if (w->prev)
            w->prev->next = w->next;
        else
            d->watched = w->next;
        if (w->next)
            w->next->prev = w->prev;
        pthread_mutex_unlock(&d->watch_mu);
        free(w);
        *socket_context = NULL;
    }
}

/* Once a second: shut down connections whose request is overdue. shutdown()
 * leaves the descriptor to libmicrohttpd, which sees end-of-file and closes. */
static void *watchdog_main(void *arg)
{
    struct http_daemon *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->stop_mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        if (!d->stopping)
            pthread_cond_timedwait(&d->stop_cv, &d->stop_mu, &until);
        bool stop = d->stopping;
        pthread_mutex_unlock(&d->stop_mu);
        if (stop)
            break;
        uint64_t now = now_ns();
        pthread_mutex_lock(&d->watch_mu);
        for (struct conn_watch *w = d->watched; w; w = w->next) {
            if (w->deadline_ns && now > w->deadline_ns && w->fd >= 0) {
                shutdown(w->fd, SHUT_RDWR);
                w->deadline_ns = 0;
            }
        }
        pthread_mutex_unlock(&d->watch_mu);
    }
    return NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    log_debug("http: %s", msg);
}

int http_start(struct server *srv, const struct http_routes *routes, struct http_daemon **out,
               struct err *err)
{
    const char *labels[API_METRICS_MAX_ROUTES];
    for (size_t i = 0; i < routes->n && i < API_METRICS_MAX_ROUTES; i++)
        labels[i] = routes->routes[i].path;
    if (api_metrics_init(&srv->metrics, labels, routes->n, err) < 0)
        return -INFERD_EINVAL;
    struct http_daemon *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(err, INFERD_ENOMEM, "out of memory for the HTTP server");
    d->srv = srv;
    d->routes = routes;
    pthread_mutex_init(&d->watch_mu, NULL);
    pthread_mutex_init(&d->stop_mu, NULL);
    pthread_cond_init(&d->stop_cv, NULL);
    pthread_mutex_init(&d->ws_mu, NULL);
    pthread_cond_init(&d->ws_cv, NULL);

    char port[16];
    snprintf(port, sizeof port, "%d", srv->cfg.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(srv->cfg.host, port, &hints, &ai);
    if (gai != 0) {
        free(d);
        return err_set(err, INFERD_EINVAL, "cannot use host '%s': %s", srv->cfg.host,
                       gai_strerror(gai));
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG | MHD_ALLOW_UPGRADE;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    d->mhd = MHD_start_daemon(
        flags, (uint16_t)srv->cfg.port, NULL, NULL, on_request, d, MHD_OPTION_SOCK_ADDR,
        ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->cfg.idle_timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->cfg.max_connections,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, d, MHD_OPTION_NOTIFY_CONNECTION, on_connection, d,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, d, MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d->mhd) {
        free(d);
        return err_set(err, INFERD_EIO, "cannot listen on %s:%d (in use, or not allowed)",
                       srv->cfg.host, srv->cfg.port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d->mhd, MHD_DAEMON_INFO_BIND_PORT);
    d->port = di ? di->port : srv->cfg.port;
    if (pthread_create(&d->watchdog, NULL, watchdog_main, d) == 0)
        d->watchdog_running = true;
    *out = d;
    return 0;
}

int http_bound_port(const struct http_daemon *d)
{
    return d->port;
}

void http_quiesce(struct http_daemon *d)
{
    MHD_socket fd = MHD_quiesce_daemon(d->mhd);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
}

void http_stop(struct http_daemon *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->stop_mu);
    d->stopping = true;
    pthread_cond_signal(&d->stop_cv);
    pthread_mutex_unlock(&d->stop_mu);
    if (d->watchdog_running)
        pthread_join(d->watchdog, NULL);
    /* WebSocket sessions end before the daemon: their sockets read end-of-file, their runs
     * return and hand the connections back (MHD_upgrade_action needs the daemon alive). */
    pthread_mutex_lock(&d->ws_mu);
    d->ws_closing = true;
    for (;;) {
        for (struct ws_session *s = d->sessions; s; s = s->next)
            shutdown(s->fd, SHUT_RDWR);
        if (!d->sessions && d->ws_upgrading == 0)
            break;
        pthread_cond_wait(&d->ws_cv, &d->ws_mu);
    }
    pthread_mutex_unlock(&d->ws_mu);
    MHD_stop_daemon(d->mhd);
    pthread_mutex_destroy(&d->watch_mu);
    pthread_mutex_destroy(&d->stop_mu);
    pthread_cond_destroy(&d->stop_cv);
    pthread_mutex_destroy(&d->ws_mu);
    pthread_cond_destroy(&d->ws_cv);
    free(d);
}
