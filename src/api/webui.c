/* api/webui.c — serving the chat page's files: ETag revalidation, gzip, caching and security
 * headers. The files themselves are generated from web/ at build time. */
#include "api/webui.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Nothing from another origin, no inline script or style, no eval; the page talks only to this
 * server (fetch) and renders model output as sanitized Markdown. */
#define WEBUI_CSP                                                                                 \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "            \
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; "                \
    "form-action 'none'; frame-ancestors 'none'"

static const struct webui_asset *find_asset(const struct webui_assets *a, const char *path)
{
    for (size_t i = 0; a && i < a->n; i++)
        if (!strcmp(a->assets[i].path, path))
            return &a->assets[i];
    return NULL;
}

/* True when Accept-Encoding names gzip with a non-zero q (or "*"). */
static bool accepts_gzip(const char *ae)
{
    for (const char *p = ae; p && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, ",;");
        bool named = (n == 4 && !strncasecmp(p, "gzip", 4)) || (n == 1 && *p == '*');
        const char *end = p + strcspn(p, ",");
        if (named) {
            const char *q = strstr(p, "q=");
            if (q && q < end && strtod(q + 2, NULL) == 0)
                return false;
            return true;
        }
        p = end;
    }
    return false;
}

/* True when If-None-Match lists etag (or is "*"); weak or strong alike (RFC 9110 §13.1.2). */
static bool etag_matches(const char *inm, const char *etag)
{
    if (!inm)
        return false;
    size_t n = strlen(etag);
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (!strncmp(p, etag, n))
            return true;
        p += strcspn(p, ",");
    }
    return false;
}

static void add_headers(struct MHD_Response *r, const struct webui_asset *a, const char *etag)
{
    MHD_add_response_header(r, "Content-Type", a->content_type);
    MHD_add_response_header(r, "ETag", etag);
    /* Always revalidated: a new binary serves a new page at once, an unchanged one costs a 304. */
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "Vary", "Accept-Encoding");
    MHD_add_response_header(r, "Content-Security-Policy", WEBUI_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
}

void webui_serve(struct http_exchange *x)
{
    char path[256];
    if (x->id)
        snprintf(path, sizeof path, "/assets/%s", x->id);
    else
        snprintf(path, sizeof path, "%s", x->path);
    const struct webui_asset *a = find_asset(x->srv->webui, path);
    if (!a) {
        http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, "not_found", "no file %.200s", path);
        return;
    }
    bool gz = a->gz && accepts_gzip(http_header(x, "Accept-Encoding"));
    /* The compressed form is another representation: its own validator. */
    char etag[64];
    snprintf(etag, sizeof etag, "%.*s%s\"", (int)strlen(a->etag) - 1, a->etag, gz ? "-gz" : "");
    struct MHD_Response *r;
    int status = 200;
    if (etag_matches(http_header(x, "If-None-Match"), etag)) {
        status = 304;
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    } else {
        r = MHD_create_response_from_buffer(gz ? a->gz_len : a->len,
                                            (void *)(gz ? a->gz : a->data),
                                            MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for %s", path);
        return;
    }
    add_headers(r, a, etag);
    if (gz && status == 200)
        MHD_add_response_header(r, "Content-Encoding", "gzip");
    http_send_response(x, status, r);
}
