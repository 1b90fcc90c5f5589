/* tests/unit/test_webui.c — the chat page's files as api/webui.c serves them over loopback: the
 * security and caching headers, 304 for a matching ETag, the gzip form only for clients that
 * take it, 404 for a file the table lacks, and the route table with and without the page. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/routes.h"
#include "api/webui.h"

static const unsigned char page[] = "<!doctype html><textarea></textarea>";
static const unsigned char page_gz[] = "GZ";
static const unsigned char script[] = "console.log(1)";

static const struct webui_asset files[] = {
    {"/", "text/html; charset=utf-8", page, sizeof page - 1, page_gz, 2, "\"0123456789abcdef\""},
    {"/assets/app.js", "text/javascript", script, sizeof script - 1, NULL, 0, "\"fedcba9876543210\""},
};
static const struct webui_assets table_files = {files, 2};

static const struct http_route routes[] = {
    {"GET", "/", false, HTTP_BODY_NONE, webui_serve, NULL, true},
    {"GET", "/assets", true, HTTP_BODY_NONE, webui_serve, NULL, true},
};
static const struct http_routes table = {routes, 2, &api_error_openai};

static struct server srv;
static struct http_daemon *daemon_;
static int port;

static void start(void)
{
    memset(&srv, 0, sizeof srv);
    srv.cfg = (struct server_config){.host = "127.0.0.1", .max_body_bytes = 1024,
                                     .request_timeout_s = 10, .idle_timeout_s = 10,
                                     .max_connections = 8};
    srv.webui = &table_files;
    struct err err = {0};
    cr_assert_eq(http_start(&srv, &table, &daemon_, &err), 0, "%s", err.msg);
    port = http_bound_port(daemon_);
}

static void stop(void)
{
    http_stop(daemon_);
}

TestSuite(webui, .init = start, .fini = stop);

struct reply {
    int status;
    char head[4096];
    char body[4096];
};

static struct reply get(const char *path, const char *headers)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n",
                     path, headers ? headers : "");
    cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    char all[8192];
    size_t len = 0;
    ssize_t got;
    while (len < sizeof all - 1 && (got = recv(fd, all + len, sizeof all - 1 - len, 0)) > 0)
        len += (size_t)got;
    all[len] = '\0';
    close(fd);
    struct reply r = {0};
    char *end = strstr(all, "\r\n\r\n");
    cr_assert_not_null(end, "%s", all);
    memcpy(r.head, all, (size_t)(end - all));
    snprintf(r.body, sizeof r.body, "%s", end + 4);
    cr_assert_eq(sscanf(r.head, "HTTP/1.1 %d", &r.status), 1);
    return r;
}

static bool has(const struct reply *r, const char *line)
{
    return strstr(r->head, line) != NULL;
}

Test(webui, the_page_comes_with_its_csp_etag_and_revalidation)
{
    struct reply r = get("/", NULL);
    cr_assert_eq(r.status, 200, "%s", r.head);
    cr_assert_str_eq(r.body, (const char *)page);
    cr_assert(has(&r, "Content-Type: text/html; charset=utf-8"), "%s", r.head);
    cr_assert(has(&r, "Content-Security-Policy: default-src 'none'; script-src 'self';"), "%s",
              r.head);
    cr_assert(has(&r, "ETag: \"0123456789abcdef\""), "%s", r.head);
    cr_assert(has(&r, "Cache-Control: no-cache"), "%s", r.head);
    cr_assert(has(&r, "X-Content-Type-Options: nosniff"), "%s", r.head);
    cr_assert_not(has(&r, "Content-Encoding"), "%s", r.head);
    r = get("/", "If-None-Match: \"0123456789abcdef\"\r\n");
    cr_assert_eq(r.status, 304, "%s", r.head);
    cr_assert_str_eq(r.body, "");
    r = get("/", "If-None-Match: W/\"0123456789abcdef\", \"other\"\r\n");
    cr_assert_eq(r.status, 304, "a weak match revalidates too: %s", r.head);
    r = get("/", "If-None-Match: \"other\"\r\n");
    cr_assert_eq(r.status, 200);
}

Test(webui, gzip_goes_only_to_clients_that_accept_it)
{
    struct reply r = get("/", "Accept-Encoding: br, gzip\r\n");
    cr_assert_eq(r.status, 200);
    cr_assert(has(&r, "Content-Encoding: gzip"), "%s", r.head);
    cr_assert(has(&r, "ETag: \"0123456789abcdef-gz\""), "%s", r.head);
    cr_assert_str_eq(r.body, "GZ");
    r = get("/", "Accept-Encoding: gzip;q=0, br\r\n");
    cr_assert_not(has(&r, "Content-Encoding"), "%s", r.head);
    r = get("/", "Accept-Encoding: gzip\r\nIf-None-Match: \"0123456789abcdef-gz\"\r\n");
    cr_assert_eq(r.status, 304, "%s", r.head);
    /* A file without a smaller gzip form goes as it is. */
    r = get("/assets/app.js", "Accept-Encoding: gzip\r\n");
    cr_assert_eq(r.status, 200);
    cr_assert_not(has(&r, "Content-Encoding"), "%s", r.head);
    cr_assert_str_eq(r.body, (const char *)script);
}

Test(webui, a_file_the_page_lacks_is_a_404)
{
    struct reply r = get("/assets/missing.js", NULL);
    cr_assert_eq(r.status, 404, "%s", r.head);
    cr_assert(strstr(r.body, "no file /assets/missing.js"), "%s", r.body);
}

static bool has_route(const struct http_routes *t, const char *path)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->routes[i].path, path))
            return true;
    return false;
}

Test(webui_routes, no_webui_leaves_the_page_out_and_keeps_the_socket)
{
    const struct http_routes *on = api_routes(true), *off = api_routes(false);
    cr_assert(has_route(on, "/"));
    cr_assert(has_route(on, "/assets"));
    cr_assert(has_route(on, "/favicon.ico"));
    cr_assert_not(has_route(off, "/"));
    cr_assert_not(has_route(off, "/assets"));
    cr_assert_not(has_route(off, "/favicon.ico"));
    cr_assert(has_route(off, "/ws/chat"));
    cr_assert(has_route(off, "/v1/chat/completions"));
    cr_assert_eq(on->n, off->n + 3);
}
