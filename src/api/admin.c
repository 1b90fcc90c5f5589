/* api/admin.c — GET /health, /stats and /metrics. */
#include <string.h>

#include "api/admin.h"

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
