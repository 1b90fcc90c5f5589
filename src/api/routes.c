/* api/routes.c — the server's route table: the OpenAI routes, then /health, /stats, /metrics,
 * /fit and the admin routes (which need the API key when one is set).
 * A new API is one more file of handlers and a few more lines here. */
#include "api/routes.h"

#include "api/admin.h"
#include "api/fit.h"
#include "api/openai.h"

/* The order is the order of the request counters in /metrics. */
static const struct http_route routes[] = {
    {"POST", "/v1/chat/completions", false, HTTP_BODY_JSON, openai_chat_completions, NULL, false},
    {"POST", "/v1/completions", false, HTTP_BODY_JSON, openai_completions, NULL, false},
    {"GET", "/v1/models", false, HTTP_BODY_NONE, openai_models, NULL, false},
    {"GET", "/v1/models", true, HTTP_BODY_NONE, openai_models, NULL, false},
    {"GET", "/health", false, HTTP_BODY_NONE, admin_health, NULL, true},
    {"GET", "/stats", false, HTTP_BODY_NONE, admin_stats, NULL, false},
    {"GET", "/metrics", false, HTTP_BODY_NONE, admin_metrics, NULL, false},
    {"GET", "/fit", false, HTTP_BODY_NONE, fit_report, NULL, false},
    {"POST", "/admin/cache/session/close", false, HTTP_BODY_JSON, admin_session_close, NULL,
     false},
    {"POST", "/admin/cache/flush", false, HTTP_BODY_JSON, admin_cache_flush, NULL, false},
};

static const struct http_routes table = {
    .routes = routes,
    .n = sizeof routes / sizeof routes[0],
    .errors = &api_error_openai,
};

const struct http_routes *api_routes(void)
{
    return &table;
}
