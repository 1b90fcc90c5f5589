/* api/webui.h — the chat page at GET /: the files built from web/ (compiled into the inferd
 * binary at build time, each with its gzip form and a content-hash ETag), served with
 * revalidation (304 for a matching If-None-Match), gzip when the client accepts it, and a
 * Content-Security-Policy that allows nothing from other origins and no inline script. */
#ifndef INFERD_API_WEBUI_H
#define INFERD_API_WEBUI_H

#include <stdbool.h>
#include <stddef.h>

#include "api/http.h"

struct webui_asset {
    const char *path;              /* as requested: "/", "/assets/app.js", "/favicon.ico" */
    const char *content_type;
    const unsigned char *data;     /* borrowed (static); len bytes */
    size_t len;
    const unsigned char *gz;       /* the same, gzip-compressed; NULL when that is no smaller */
    size_t gz_len;
    const char *etag;              /* quoted: "\"<first 16 hex of SHA-256(data)>\"" */
};

struct webui_assets {
    const struct webui_asset *assets; /* borrowed (static); n entries */
    size_t n;
};

/* The page as the build made it from web/: generated, linked into the inferd binary only. */
extern const struct webui_assets webui_bundle;

/* GET / and GET /favicon.ico, and GET /assets/{name}: the file of srv->webui at that path, or
 * 404. */
void webui_serve(struct http_exchange *x);

#endif
