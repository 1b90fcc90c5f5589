/* tests/unit/test_http.c — the transport over loopback with a route table of its own: routing
 * (exact and id-tail paths, 404, 405 with Allow), each body kind's Content-Type check and the
 * multipart parts it hands over, authentication, body limits, per-route error formats, and the
 * request counters kept per route. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/http.h"
#include "api/websocket.h"

/* ---- a test API ---------------------------------------------------------------- */

/* Echoes each part as "name|filename|type|len\n" followed by its data and "\n". */
static void echo_parts(struct http_exchange *x)
{
    struct strbuf b = {0};
    for (size_t i = 0; i < x->form->n_parts; i++) {
        const struct multipart_part *p = &x->form->parts[i];
        strbuf_printf(&b, "%s|%s|%s|%zu\n", p->name, p->filename, p->content_type, p->data_len);
        strbuf_append(&b, p->data, p->data_len);
        strbuf_puts(&b, "\n");
    }
    http_send_text(x, 200, "application/octet-stream", b.data ? b.data : "", b.len);
    strbuf_free(&b);
}

static void echo_body(struct http_exchange *x)
{
    cr_assert_null(x->form);
    http_send_text(x, 200, "text/plain", x->body, x->body_len);
}

static void echo_id(struct http_exchange *x)
{
    const char *id = x->id ? x->id : "(none)";
    http_send_text(x, 200, "text/plain", id, strlen(id));
}

static void refuse(struct http_exchange *x)
{
    http_send_errorf(x, 429, API_ERROR_RATE_LIMIT, "p", "busy", "come back in %d s", 3);
}

static void no_answer(struct http_exchange *x)
{
}

/* A WebSocket session that echoes every message until the peer closes. */
static void echo_run(void *ctx, int fd, const char *early, size_t n_early)
{
    struct ws_conn c;
    struct err err = {0};
    if (ws_conn_init(&c, fd, 1024, early, n_early, &err) < 0)
        return;
    struct ws_event ev;
    while (ws_conn_next(&c, -1, &ev) == 0)
        if (ev.kind == WS_EVENT_MESSAGE)
            ws_conn_send_text(&c, (const char *)ev.data, ev.len);
    ws_conn_free(&c);
}

static void echo_release(void *ctx)
{
    (*(int *)ctx)++;
}

static int echo_releases;

static void echo_socket(struct http_exchange *x)
{
    http_send_websocket(x, (struct http_websocket){echo_run, echo_release, &echo_releases});
}

/* Another API's error body: "kind status param code message". */
static int render_plain(const struct api_error *e, struct strbuf *out)
{
    return strbuf_printf(out, "%d %d %s %s %s", (int)api_error_kind_of(e), e->status, e->param,
                         e->code, e->message)
               ? 0
               : -INFERD_ENOMEM;
}

static const struct api_error_format plain_errors = {
    .render = render_plain, .content_type = "text/plain", .out_of_memory = "oom"};

static const struct http_route test_routes[] = {
    {"POST", "/upload", false, HTTP_BODY_MULTIPART, echo_parts, NULL, false},
    {"POST", "/json", false, HTTP_BODY_JSON, echo_body, NULL, false},
    {"POST", "/raw", false, HTTP_BODY_NONE, echo_body, NULL, false},
    {"GET", "/items", true, HTTP_BODY_NONE, echo_id, NULL, false},
    {"GET", "/both", false, HTTP_BODY_NONE, echo_id, NULL, false},
    {"POST", "/both", false, HTTP_BODY_JSON, echo_body, NULL, false},
    {"GET", "/open", false, HTTP_BODY_NONE, echo_id, NULL, true},
    {"GET", "/plain", false, HTTP_BODY_NONE, refuse, &plain_errors, false},
    {"POST", "/plain", false, HTTP_BODY_JSON, echo_body, &plain_errors, false},
    {"GET", "/silent", false, HTTP_BODY_NONE, no_answer, NULL, false},
    {"GET", "/ws", false, HTTP_BODY_NONE, echo_socket, NULL, false},
};

static const struct http_routes table = {
    .routes = test_routes,
    .n = sizeof test_routes / sizeof test_routes[0],
    .errors = &api_error_openai,
};

static struct server srv;
static struct http_daemon *daemon_;
static int port;

static void start(const char *api_key)
{
    memset(&srv, 0, sizeof srv);
    srv.cfg = (struct server_config){.host = "127.0.0.1", .port = 0, .api_key = api_key,
                                     .max_body_bytes = 64 * 1024, .request_timeout_s = 10,
                                     .idle_timeout_s = 10, .max_connections = 16};
    struct err err = {0};
    cr_assert_eq(http_start(&srv, &table, &daemon_, &err), 0, "%s", err.msg);
    port = http_bound_port(daemon_);
}

static void stop(void)
{
    http_stop(daemon_);
    daemon_ = NULL;
}

static void start_open(void)
{
    start(NULL);
}

TestSuite(http, .init = start_open, .fini = stop);

/* ---- a raw client ------------------------------------------------------------ */

struct reply {
    int status;
    char head[4096]; /* status line and headers */
    char *body;      /* malloc'd; body_len bytes and a NUL */
    size_t body_len;
};

static struct reply roundtrip(const char *req, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    for (size_t sent = 0; sent < len;) {
        ssize_t n = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may answer and close before the whole body is sent */
        sent += (size_t)n;
    }
    struct strbuf in = {0};
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
        strbuf_append(&in, buf, (size_t)n);
    close(fd);
    struct reply r = {0};
    cr_assert_not_null(in.data, "no answer");
    char *end = strstr(in.data, "\r\n\r\n");
    cr_assert_not_null(end, "%s", in.data);
    size_t head = (size_t)(end - in.data);
    cr_assert_lt(head, sizeof r.head);
    memcpy(r.head, in.data, head);
    cr_assert_eq(sscanf(r.head, "HTTP/1.1 %d", &r.status), 1, "%s", r.head);
    r.body_len = in.len - head - 4;
    r.body = malloc(r.body_len + 1);
    memcpy(r.body, end + 4, r.body_len);
    r.body[r.body_len] = '\0';
    strbuf_free(&in);
    return r;
}

/* A request with Connection: close; extra headers end in \r\n each. */
static struct reply request(const char *method, const char *path, const char *headers,
                            const char *body, size_t body_len)
{
    struct strbuf b = {0};
    strbuf_printf(&b, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s", method, path,
                  headers ? headers : "");
    if (body)
        strbuf_printf(&b, "Content-Length: %zu\r\n", body_len);
    strbuf_puts(&b, "\r\n");
    if (body)
        strbuf_append(&b, body, body_len);
    struct reply r = roundtrip(b.data, b.len);
    strbuf_free(&b);
    return r;
}

static struct reply get(const char *path)
{
    return request("GET", path, NULL, NULL, 0);
}

static bool has_header(const struct reply *r, const char *line)
{
    return strstr(r->head, line) != NULL;
}

#define assert_reply(r, want_status, want_body)                                                \
    do {                                                                                       \
        cr_assert_eq((r).status, (want_status), "%s\n\n%s", (r).head, (r).body);               \
        cr_assert_str_eq((r).body, (want_body));                                               \
        free((r).body);                                                                        \
    } while (0)

/* ---- multipart ----------------------------------------------------------------- */

#define FORM_CT "Content-Type: multipart/form-data; boundary=\"--7d\"\r\n"

Test(http, a_multipart_route_hands_the_parsed_parts_to_its_handler)
{
    static const char body[] = "----7d\r\n"
                               "Content-Disposition: form-data; name=\"model\"\r\n\r\n"
                               "tiny\r\n"
                               "----7d\r\n"
                               "Content-Disposition: form-data; name=\"file\"; filename=\"x.bin\"\r\n"
                               "Content-Type: application/octet-stream\r\n\r\n"
                               "\0\1\r\n\xff\r\n"
                               "----7d--\r\n";
    struct reply r = request("POST", "/upload", FORM_CT, body, sizeof body - 1);
    cr_assert_eq(r.status, 200, "%s\n%s", r.head, r.body);
    static const char want[] = "model|||4\ntiny\n"
                               "file|x.bin|application/octet-stream|5\n\0\1\r\n\xff\n";
    cr_assert_eq(r.body_len, sizeof want - 1);
    cr_assert_arr_eq(r.body, want, sizeof want - 1);
    free(r.body);
}

Test(http, a_malformed_multipart_body_is_a_400_that_says_what_is_wrong)
{
    static const char body[] = "----7d\r\nContent-Disposition: form-data; name=a\r\n\r\nno end";
    assert_reply(request("POST", "/upload", FORM_CT, body, sizeof body - 1), 400,
                 "{\"error\":{\"message\":\"multipart part 1: the body ends before its closing "
                 "boundary\",\"type\":\"invalid_request_error\",\"param\":null,"
                 "\"code\":\"bad_request\"}}");
}

Test(http, a_multipart_route_needs_multipart_form_data_with_a_boundary)
{
    struct reply r = request("POST", "/upload", "Content-Type: application/json\r\n", "{}", 2);
    cr_assert_eq(r.status, 415);
    cr_assert_not_null(strstr(r.body, "must be multipart/form-data"), "%s", r.body);
    cr_assert_not_null(strstr(r.body, "\"code\":\"unsupported_media_type\""), "%s", r.body);
    free(r.body);
    r = request("POST", "/upload", "Content-Type: multipart/form-data\r\n", "x", 1);
    cr_assert_eq(r.status, 415);
    cr_assert_not_null(strstr(r.body, "needs a boundary parameter"), "%s", r.body);
    free(r.body);
    r = request("POST", "/upload", NULL, "x", 1);
    cr_assert_eq(r.status, 415, "no Content-Type at all");
    free(r.body);
}

/* ---- the other body kinds ------------------------------------------------------- */

Test(http, a_json_route_takes_json_or_no_content_type_and_refuses_others)
{
    assert_reply(request("POST", "/json", "Content-Type: application/json; charset=utf-8\r\n",
                         "{\"a\":1}", 7),
                 200, "{\"a\":1}");
    assert_reply(request("POST", "/json", NULL, "{}", 2), 200, "{}");
    assert_reply(request("POST", "/json", "Content-Type: text/plain\r\n", "{}", 2), 415,
                 "{\"error\":{\"message\":\"Content-Type must be application/json, got "
                 "'text/plain'\",\"type\":\"invalid_request_error\",\"param\":null,"
                 "\"code\":\"unsupported_media_type\"}}");
}

Test(http, a_route_without_a_body_kind_ignores_the_content_type)
{
    assert_reply(request("POST", "/raw", "Content-Type: text/plain\r\n", "as it came", 10), 200,
                 "as it came");
    assert_reply(request("POST", "/raw", "Content-Type: multipart/form-data\r\n", "x", 1), 200,
                 "x");
}

/* ---- routing -------------------------------------------------------------------- */

Test(http, an_id_tail_route_hands_over_the_rest_of_the_path)
{
    assert_reply(get("/items/abc-1"), 200, "abc-1");
    assert_reply(get("/items/a/b"), 200, "a/b");
    struct reply r = get("/items/");
    cr_assert_eq(r.status, 404, "an empty id");
    free(r.body);
    r = get("/items");
    cr_assert_eq(r.status, 404, "no exact route");
    free(r.body);
    assert_reply(get("/open"), 200, "(none)");
}

Test(http, an_unknown_path_is_a_404_in_the_tables_error_format)
{
    assert_reply(get("/nope"), 404,
                 "{\"error\":{\"message\":\"no route for GET /nope\",\"type\":"
                 "\"invalid_request_error\",\"param\":null,\"code\":\"not_found\"}}");
}

Test(http, a_wrong_method_is_a_405_whose_allow_lists_every_method_of_the_path)
{
    struct reply r = request("DELETE", "/both", NULL, NULL, 0);
    cr_assert(has_header(&r, "Allow: GET, POST"), "%s", r.head);
    assert_reply(r, 405,
                 "{\"error\":{\"message\":\"/both does not accept DELETE; use GET, POST\","
                 "\"type\":\"invalid_request_error\",\"param\":null,"
                 "\"code\":\"method_not_allowed\"}}");
    r = request("POST", "/items/x", NULL, "{}", 2);
    cr_assert(has_header(&r, "Allow: GET\r\n"), "%s", r.head);
    cr_assert_eq(r.status, 405);
    free(r.body);
    r = request("HEAD", "/both", NULL, NULL, 0);
    cr_assert_eq(r.status, 200, "HEAD is answered where GET is");
    free(r.body);
    assert_reply(request("POST", "/both", NULL, "{}", 2), 200, "{}");
}

Test(http, a_route_with_its_own_error_format_writes_its_errors_with_it)
{
    struct reply r = get("/plain");
    cr_assert(has_header(&r, "Content-Type: text/plain"), "%s", r.head);
    assert_reply(r, 429, "4 429 p busy come back in 3 s");
    assert_reply(request("POST", "/plain", "Content-Type: text/html\r\n", "{}", 2), 415,
                 "1 415  unsupported_media_type Content-Type must be application/json, got "
                 "'text/html'");
    assert_reply(request("PUT", "/plain", NULL, NULL, 0), 405,
                 "1 405  method_not_allowed /plain does not accept PUT; use GET, POST");
}

Test(http, a_handler_that_sends_nothing_is_answered_500)
{
    struct reply r = get("/silent");
    cr_assert_eq(r.status, 500);
    cr_assert_not_null(strstr(r.body, "the handler sent no response"), "%s", r.body);
    free(r.body);
}

/* ---- limits --------------------------------------------------------------------- */

Test(http, a_body_over_the_limit_is_a_413_by_its_length_or_as_it_arrives)
{
    struct reply r = request("POST", "/json", "Content-Length: 100000000\r\n", NULL, 0);
    cr_assert_eq(r.status, 413);
    cr_assert_not_null(strstr(r.body, "the limit is 65536"), "%s", r.body);
    free(r.body);
    static const char chunked[] = "POST /raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n";
    struct strbuf b = {0};
    strbuf_puts(&b, chunked);
    for (int i = 0; i < 20; i++) {
        strbuf_printf(&b, "1000\r\n");
        for (int k = 0; k < 4096; k++)
            strbuf_append(&b, "z", 1);
        strbuf_puts(&b, "\r\n");
    }
    strbuf_puts(&b, "0\r\n\r\n");
    r = roundtrip(b.data, b.len);
    strbuf_free(&b);
    cr_assert_eq(r.status, 413);
    cr_assert_not_null(strstr(r.body, "over the limit of 65536 bytes"), "%s", r.body);
    free(r.body);
}

Test(http, conflicting_content_lengths_are_a_400)
{
    static const char req[] = "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}";
    struct reply r = roundtrip(req, sizeof req - 1);
    cr_assert_eq(r.status, 400);
    free(r.body);
}

/* ---- authentication --------------------------------------------------------------- */

Test(http_auth, only_open_routes_answer_without_the_key, .init = NULL, .fini = stop)
{
    start("sek");
    struct reply r = get("/items/1");
    cr_assert_eq(r.status, 401);
    cr_assert_not_null(strstr(r.body, "\"code\":\"invalid_api_key\""), "%s", r.body);
    free(r.body);
    assert_reply(request("GET", "/items/1", "Authorization: Bearer sek\r\n", NULL, 0), 200, "1");
    assert_reply(request("GET", "/items/2", "x-api-key: sek\r\n", NULL, 0), 200, "2");
    r = request("GET", "/items/1", "Authorization: Bearer nope\r\n", NULL, 0);
    cr_assert_eq(r.status, 401);
    free(r.body);
    assert_reply(get("/open"), 200, "(none)");
    r = get("/nope");
    cr_assert_eq(r.status, 404, "an unknown path is a 404 before the key is asked for");
    free(r.body);
}

/* ---- counters --------------------------------------------------------------------- */

Test(http, answers_are_counted_per_route_with_routes_of_one_path_reported_together)
{
    free(get("/items/a").body);
    free(get("/items/b").body);
    free(get("/both").body);
    free(request("POST", "/both", NULL, "{}", 2).body);
    free(request("DELETE", "/both", NULL, NULL, 0).body);
    free(get("/nope").body);
    free(request("POST", "/json", "Content-Type: text/plain\r\n", "{}", 2).body);
    cr_assert_eq(api_metrics_total(&srv.metrics), 7);
    struct strbuf b = {0};
    api_metrics_prometheus(&srv, &b);
    cr_assert_str_eq(b.data,
                     "# HELP inferd_requests_total HTTP requests answered, by route and status.\n"
                     "# TYPE inferd_requests_total counter\n"
                     "inferd_requests_total{route=\"/json\",status=\"415\"} 1\n"
                     "inferd_requests_total{route=\"/items\",status=\"200\"} 2\n"
                     "inferd_requests_total{route=\"/both\",status=\"200\"} 2\n"
                     "inferd_requests_total{route=\"/both\",status=\"405\"} 1\n"
                     "inferd_requests_total{route=\"other\",status=\"404\"} 1\n");
    strbuf_free(&b);
}

Test(http_limits, a_table_larger_than_the_counters_hold_is_refused, .init = NULL, .fini = NULL)
{
    static struct http_route many[API_METRICS_MAX_ROUTES + 1];
    for (size_t i = 0; i < sizeof many / sizeof many[0]; i++)
        many[i] = (struct http_route){"GET", "/x", false, HTTP_BODY_NONE, echo_id, NULL, false};
    struct http_routes t = {.routes = many, .n = sizeof many / sizeof many[0],
                            .errors = &api_error_openai};
    memset(&srv, 0, sizeof srv);
    srv.cfg = (struct server_config){.host = "127.0.0.1", .max_body_bytes = 1024,
                                     .request_timeout_s = 1, .idle_timeout_s = 1,
                                     .max_connections = 1};
    struct err err = {0};
    struct http_daemon *d = NULL;
    cr_assert_eq(http_start(&srv, &t, &d, &err), -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "at most 32"), "%s", err.msg);
    cr_assert_null(d);
}

/* ---- WebSocket upgrade ------------------------------------------------------------ */

#define WS_HEADERS(key, version)                                                              \
    "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " key                     \
    "\r\nSec-WebSocket-Version: " version "\r\n"

Test(http, a_websocket_route_refuses_what_is_not_a_valid_upgrade)
{
    int before = echo_releases;
    struct reply r = get("/ws");
    cr_assert(has_header(&r, "Upgrade: websocket"), "%s", r.head);
    assert_reply(r, 426, "expected websocket");
    r = request("GET", "/ws", WS_HEADERS("dGhlIHNhbXBsZSBub25jZQ==", "8"), NULL, 0);
    cr_assert(has_header(&r, "Sec-WebSocket-Version: 13"), "%s", r.head);
    cr_assert_eq(r.status, 426);
    free(r.body);
    r = request("GET", "/ws", WS_HEADERS("short", "13"), NULL, 0);
    assert_reply(r, 400, "Sec-WebSocket-Key must be the base64 of 16 bytes");
    cr_assert_eq(echo_releases, before + 3, "every refused session is released");
}

Test(http, a_websocket_upgrade_is_answered_101_and_the_session_speaks_frames)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    /* The handshake and a first masked "Hello" (RFC 6455 §5.7) in one write. */
    static const char hs[] = "GET /ws HTTP/1.1\r\nHost: x\r\n" WS_HEADERS(
        "dGhlIHNhbXBsZSBub25jZQ==", "13") "\r\n"
                                          "\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58";
    cr_assert_eq(send(fd, hs, sizeof hs - 1, MSG_NOSIGNAL), (ssize_t)(sizeof hs - 1));
    struct strbuf in = {0};
    char buf[4096];
    char *end = NULL;
    while (!end || in.len < (size_t)(end - in.data) + 4 + 7) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        cr_assert_gt(n, 0, "the connection ended after %zu bytes: %s", in.len, in.data);
        strbuf_append(&in, buf, (size_t)n);
        end = strstr(in.data, "\r\n\r\n");
    }
    cr_assert(strstr(in.data, "HTTP/1.1 101"), "%s", in.data);
    cr_assert(strstr(in.data, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "%s",
              in.data);
    const unsigned char *f = (const unsigned char *)end + 4;
    cr_assert_eq(f[0], 0x81);
    cr_assert_eq(f[1], 5, "an unmasked 5-byte frame echoed");
    cr_assert_eq(memcmp(f + 2, "Hello", 5), 0);
    /* A close (1000) is answered with a close, and the session ends. */
    static const char close_frame[] = "\x88\x82\x01\x02\x03\x04\x02\xea";
    cr_assert_eq(send(fd, close_frame, sizeof close_frame - 1, MSG_NOSIGNAL), 8);
    unsigned char reply[4];
    size_t got = 0;
    while (got < 4) {
        ssize_t n = recv(fd, reply + got, sizeof reply - got, 0);
        cr_assert_gt(n, 0);
        got += (size_t)n;
    }
    cr_assert_eq(reply[0], 0x88);
    cr_assert_eq(reply[1], 2);
    cr_assert_eq(reply[2] << 8 | reply[3], 1000);
    strbuf_free(&in);
    close(fd);
}

Test(http, stopping_the_server_ends_open_websocket_sessions)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    static const char hs[] =
        "GET /ws HTTP/1.1\r\nHost: x\r\n" WS_HEADERS("dGhlIHNhbXBsZSBub25jZQ==", "13") "\r\n";
    cr_assert_eq(send(fd, hs, sizeof hs - 1, MSG_NOSIGNAL), (ssize_t)(sizeof hs - 1));
    char buf[1024];
    cr_assert_gt(recv(fd, buf, sizeof buf, 0), 0);
    int before = echo_releases;
    /* The session waits for a frame that never comes: http_stop must not. */
    stop();
    cr_assert_eq(echo_releases, before + 1);
    close(fd);
    start_open(); /* for the suite's fini */
}
