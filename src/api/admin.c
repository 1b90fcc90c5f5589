/* api/admin.c — GET /health, /stats and /metrics, POST /admin/cache/session/close. */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "api/admin.h"
#include "base/json.h"

/* The longest session id a request may name (as the request parser allows). */
#define ADMIN_SESSION_ID_MAX 256

void admin_health(struct http_exchange *x)
{
    if (atomic_load(&x->srv->stopping)) {
        static const char stopping[] = "{\"status\": \"shutting down\"}";
        http_send_json(x, 503, stopping, sizeof stopping - 1);
    } else if (atomic_load(&x->srv->ready)) {
        static const char ok[] = "{\"status\": \"ok\"}";
        http_send_json(x, 200, ok, sizeof ok - 1);
    } else {
        static const char loading[] = "{\"status\": \"loading\"}";
        http_send_json(x, 503, loading, sizeof loading - 1);
    }
}

void admin_stats(struct http_exchange *x)
{
    struct strbuf b = {0};
    api_metrics_stats_json(x->srv, &b);
    if (b.failed)
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for /stats");
    else
        http_send_json(x, 200, b.data, b.len);
    strbuf_free(&b);
}

void admin_metrics(struct http_exchange *x)
{
    struct strbuf b = {0};
    api_metrics_prometheus(x->srv, &b);
    if (b.failed)
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for /metrics");
    else
        http_send_text(x, 200, "text/plain; version=0.0.4; charset=utf-8", b.data ? b.data : "",
                       b.len);
    strbuf_free(&b);
}

void admin_session_close(struct http_exchange *x)
{
    struct err err = {0};
    struct json_object *root = NULL;
    if (json_text_parse(x->body, x->body_len, 0, true, &root, &err) < 0) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL,
                         "the body is not valid JSON: %s", err.msg);
        return;
    }
    struct json_doc doc = {.err = &err, .name = "body", .flags = JSON_TEXT};
    struct json_reader r = json_reader_root(&doc, root);
    const char *id = NULL;
    size_t len = 0;
    int rc = root && json_object_is_type(root, json_type_object)
                 ? json_read_str(&r, "session_id", JSON_REQUIRED, &id, &len)
                 : err_set(&err, INFERD_EFORMAT, "the body must be an object with a session_id");
    if (rc == 0 && (len == 0 || len > ADMIN_SESSION_ID_MAX))
        rc = err_set(&err, INFERD_ERANGE, "session_id must be 1 to %d bytes, got %zu",
                     ADMIN_SESSION_ID_MAX, len);
    if (rc < 0) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "session_id", NULL, "%s", err.msg);
        json_object_put(root);
        return;
    }
    int released = -1;
    if (!x->srv->engine || !atomic_load(&x->srv->ready)) {
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "the model is still loading");
    } else if (engine_close_session(x->srv->engine, id, &released, &err) < 0) {
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "%s", err.msg);
    } else {
        char body[96];
        int n = released < 0 ? snprintf(body, sizeof body, "{\"closed\": false}")
                             : snprintf(body, sizeof body,
                                        "{\"closed\": true, \"blocks_released\": %d}", released);
        http_send_json(x, 200, body, (size_t)n);
    }
    json_object_put(root);
}
