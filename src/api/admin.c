/* api/admin.c — GET /health, /stats and /metrics, POST /admin/cache/session/close and
 * /admin/cache/flush, GET /engine. */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api/admin.h"
#include "api/engine_proxy.h"
#include "api/model_pool.h"
#include "api/response_store.h"
#include "base/json.h"
#include "base/timer.h"

/* The longest session id a request may name (as the request parser allows). */
#define ADMIN_SESSION_ID_MAX 256
/* How long a flush waits for the writes by default, and at most. */
#define ADMIN_FLUSH_TIMEOUT_MS 30000
#define ADMIN_FLUSH_TIMEOUT_MAX_MS 3600000

/* The models the cache's admin routes reach: the one model once it is loaded, or every
 * resident pool entry (each held until release_models). */
static int cache_models(struct server *srv, struct served_model **out)
{
    if (!srv->pool) {
        out[0] = &srv->served;
        return served_engine_ready(&srv->served) ? 1 : 0;
    }
    int n = 0;
    for (int i = 0; i < model_pool_count(srv->pool) && n < MODEL_POOL_MAX_ENTRIES; i++) {
        struct model_pool_info in;
        model_pool_info(srv->pool, i, &in);
        struct served_model *sm = model_pool_peek(srv->pool, in.id);
        if (sm)
            out[n++] = sm;
    }
    return n;
}

static void release_models(struct server *srv, struct served_model **models, int n)
{
    for (int i = 0; i < n; i++)
        served_model_release(srv, models[i]);
}

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
    struct served_model *models[MODEL_POOL_MAX_ENTRIES];
    int n_models = cache_models(x->srv, models);
    rc = 0;
    for (int i = 0; i < n_models && rc == 0; i++) {
        int n = -1;
        rc = served_engine_close_session(models[i], id, &n, &err);
        if (n >= 0)
            released = (released < 0 ? 0 : released) + n;
    }
    release_models(x->srv, models, n_models);
    if (n_models == 0 || !atomic_load(&x->srv->ready)) {
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "the model is still loading");
    } else if (rc < 0) {
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

/* The flush's answer: durable, the tier's counters as the flush answered, and why not. */
static void send_flush_result(struct http_exchange *x, bool durable, const struct kv_tier_stats *t,
                              double elapsed_ms, const char *reason)
{
    const struct ssd_stats *ss = &t->store;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "durable", json_object_new_boolean(durable));
    struct {
        const char *name;
        uint64_t value;
    } counters[] = {
        {"pending", ss->pending},  {"pending_bytes", ss->pending_bytes},
        {"unqueued", t->unsaved},  {"blocks", ss->blocks},
        {"bytes", ss->bytes},      {"writes", ss->writes},
        {"write_bytes", ss->write_bytes}, {"failed", ss->failed},
        {"dropped", ss->dropped},
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        json_object_object_add(o, counters[i].name,
                               json_object_new_int64((int64_t)counters[i].value));
    json_object_object_add(o, "disabled", json_object_new_boolean(ss->disabled));
    json_object_object_add(o, "elapsed_ms", json_object_new_double(elapsed_ms));
    if (reason)
        json_object_object_add(o, "reason", json_object_new_string(reason));
    size_t len;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, durable ? 200 : 503, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the answer");
    json_object_put(o);
}

/* An optional {"timeout_ms": N} (no body, or an empty one, is {}). */
static int flush_timeout(const struct http_exchange *x, int *timeout_ms, struct err *err)
{
    *timeout_ms = ADMIN_FLUSH_TIMEOUT_MS;
    size_t n = x->body_len;
    while (n > 0 && strchr(" \t\r\n", x->body[n - 1]))
        n--;
    if (n == 0)
        return 0;
    struct json_object *root = NULL;
    int rc = json_text_parse(x->body, x->body_len, 0, true, &root, err);
    if (rc < 0) {
        json_object_put(root);
        return err_wrap(err, "the body is not valid JSON");
    }
    if (!root || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "the body must be an object, e.g. {\"timeout_ms\": %d}",
                       ADMIN_FLUSH_TIMEOUT_MS);
    }
    struct json_doc doc = {.err = err, .name = "body", .flags = JSON_TEXT};
    struct json_reader r = json_reader_root(&doc, root);
    static const char *const keys[] = {"timeout_ms", NULL};
    rc = json_reader_check_keys(&r, keys);
    if (rc == 0)
        rc = json_read_int(&r, "timeout_ms", JSON_OPTIONAL, 0, ADMIN_FLUSH_TIMEOUT_MAX_MS,
                           timeout_ms);
    json_object_put(root);
    return rc;
}

void admin_cache_flush(struct http_exchange *x)
{
    struct err err = {0};
    int timeout_ms;
    if (flush_timeout(x, &timeout_ms, &err) < 0) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "timeout_ms", NULL, "%s", err.msg);
        return;
    }
    struct served_model *models[MODEL_POOL_MAX_ENTRIES];
    int n_models = cache_models(x->srv, models);
    if (n_models == 0 || !atomic_load(&x->srv->ready)) {
        release_models(x->srv, models, n_models);
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "the model is still loading");
        return;
    }
    if (!served_engine_config(models[0])->tier) {
        release_models(x->srv, models, n_models);
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL,
                         "there is no SSD tier to flush: the server runs without --ssd-cache DIR");
        return;
    }
    /* With a pool every resident model's cache is flushed; the counters are the last one's. */
    struct kv_tier_stats after = {0};
    uint64_t t0 = now_ns();
    int rc = 0;
    struct err first = {0};
    struct served_model *last = NULL;
    for (int i = 0; i < n_models; i++) {
        last = models[i];
        memset(&after, 0, sizeof after);
        int r = served_engine_flush(last, timeout_ms, &after, &err);
        if (r < 0 && rc == 0) {
            rc = r;
            first = err;
        }
    }
    double ms = (double)(now_ns() - t0) * 1e-6;
    if (rc == -INFERD_EINVAL) {
        release_models(x->srv, models, n_models);
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL, "%s", first.msg);
        return;
    }
    if (rc < 0 && !after.enabled) { /* refused before the engine thread saw it (stopping) */
        struct engine_stats st;
        served_engine_stats(last, &st);
        after = st.ssd_cache;
    }
    release_models(x->srv, models, n_models);
    send_flush_result(x, rc == 0, &after, ms, rc == 0 ? NULL : first.msg);
}

/* One engine child as GET /engine lists it. */
static void engine_child_json(void *ctx, struct engine_proxy *p)
{
    json_object *arr = ctx;
    struct engine_proxy_info in;
    engine_proxy_info(p, &in);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(in.id));
    json_object_object_add(o, "pid", in.pid > 0 ? json_object_new_int64((int64_t)in.pid) : NULL);
    json_object_object_add(o, "state", json_object_new_string(in.state));
    json_object_object_add(o, "restarts", json_object_new_int(in.restarts));
    json_object_object_add(o, "crashes", json_object_new_int64((int64_t)in.crashes));
    json_object_object_add(o, "hangs", json_object_new_int64((int64_t)in.hangs));
    json_object_object_add(o, "socket", json_object_new_string(in.socket));
    json_object_object_add(o, "in_flight", json_object_new_int(in.in_flight));
    json_object_object_add(o, "paused", json_object_new_boolean(in.paused));
    json_object_array_add(arr, o);
}

void admin_engine(struct http_exchange *x)
{
    struct server *srv = x->srv;
    json_object *o = json_object_new_object();
    if (srv->isolation) {
        /* pid, restarts and socket are the default model's child's; engines lists them all */
        json_object *engines = json_object_new_array();
        engine_supervisor_each(srv->isolation, engine_child_json, engines);
        const char *def = srv->pool ? model_pool_default_id(srv->pool) : srv->served.id;
        json_object *d = NULL;
        int restarts = 0;
        for (size_t i = 0; i < json_object_array_length(engines); i++) {
            json_object *e = json_object_array_get_idx(engines, i), *v = NULL;
            json_object_object_get_ex(e, "restarts", &v);
            restarts += json_object_get_int(v);
            json_object_object_get_ex(e, "id", &v);
            if (!strcmp(json_object_get_string(v), def))
                d = e;
        }
        json_object *v = NULL;
        json_object_object_add(o, "isolated", json_object_new_boolean(true));
        json_object_object_add(o, "pid", d && json_object_object_get_ex(d, "pid", &v)
                                             ? json_object_get(v) : NULL);
        json_object_object_add(o, "restarts", json_object_new_int(restarts));
        json_object_object_add(o, "socket", d && json_object_object_get_ex(d, "socket", &v)
                                                ? json_object_get(v) : NULL);
        json_object_object_add(o, "supervisor_pid", json_object_new_int64((int64_t)getpid()));
        json_object_object_add(o, "admin_socket", srv->admin_socket
                                                      ? json_object_new_string(srv->admin_socket)
                                                      : NULL);
        json_object_object_add(o, "watchdog_s",
                               json_object_new_int(engine_supervisor_watchdog_s(srv->isolation)));
        json_object_object_add(o, "leases",
                               json_object_new_int(engine_supervisor_leases(srv->isolation)));
        json_object_object_add(o, "engines", engines);
        json_object *rs = NULL;
        if (srv->responses) { /* the supervisor keeps the stored responses, not a child */
            struct response_store_stats st;
            response_store_get_stats(srv->responses, &st);
            rs = json_object_new_object();
            json_object_object_add(rs, "entries", json_object_new_int64((int64_t)st.entries));
            json_object_object_add(rs, "bytes", json_object_new_int64((int64_t)st.bytes));
            json_object_object_add(rs, "max_bytes", json_object_new_int64((int64_t)st.max_bytes));
            json_object_object_add(rs, "ttl_ms", json_object_new_int64((int64_t)st.ttl_s * 1000));
        }
        json_object_object_add(o, "response_store", rs);
    } else {
        json_object_object_add(o, "isolated", json_object_new_boolean(false));
        json_object_object_add(o, "pid", json_object_new_int64((int64_t)getpid()));
        json_object_object_add(o, "restarts", json_object_new_int(0));
        json_object_object_add(o, "socket", NULL);
    }
    json_object *pool = NULL;
    if (srv->pool) {
        pool = json_object_new_object();
        json_object_object_add(pool, "default",
                               json_object_new_string(model_pool_default_id(srv->pool)));
        json_object *resident = json_object_new_array();
        for (int i = 0; i < model_pool_count(srv->pool); i++) {
            struct model_pool_info in;
            model_pool_info(srv->pool, i, &in);
            if (in.state == MODEL_POOL_RESIDENT)
                json_object_array_add(resident, json_object_new_string(in.id));
        }
        json_object_object_add(pool, "resident", resident);
    }
    json_object_object_add(o, "pool", pool);
    size_t len = 0;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, 200, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for /engine");
    json_object_put(o);
}
