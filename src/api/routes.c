/* api/routes.c — the server's route table: the OpenAI routes (chat, completions, embeddings, models,
 * responses, adapters), GET /v1 listing them, Anthropic's Messages, then /health, /stats, /metrics, /fit
 * and the admin routes (which need the API key when one is set), WS /ws/chat, and the chat page
 * (GET /, /favicon.ico, /assets/…) unless it is turned off. A new API is one more file of
 * handlers and a few more lines here. */
#include "api/routes.h"

#include <json-c/json.h>
#include <stdio.h>

#include "api/adapters.h"
#include "api/admin.h"
#include "api/anthropic.h"
#include "api/audio.h"
#include "api/embeddings.h"
#include "api/fit.h"
#include "api/openai.h"
#include "api/responses.h"
#include "api/webui.h"
#include "api/ws_chat.h"

static void api_index(struct http_exchange *x);

/* The order is the order of the request counters in /metrics. The chat page's routes come
 * last, so a server without the page serves the same table cut short. */
static const struct http_route routes[] = {
    {"POST", "/v1/chat/completions", false, HTTP_BODY_JSON, openai_chat_completions, NULL, false},
    {"POST", "/v1/completions", false, HTTP_BODY_JSON, openai_completions, NULL, false},
    {"GET", "/v1/models", false, HTTP_BODY_NONE, openai_models, NULL, false},
    {"GET", "/v1/models", true, HTTP_BODY_NONE, openai_models, NULL, false},
    {"POST", "/v1/messages", false, HTTP_BODY_JSON, anthropic_messages, &api_error_anthropic,
     false},
    {"POST", "/v1/messages/count_tokens", false, HTTP_BODY_JSON, anthropic_count_tokens,
     &api_error_anthropic, false},
    {"POST", "/v1/responses", false, HTTP_BODY_JSON, responses_create, NULL, false},
    {"GET", "/v1/responses", true, HTTP_BODY_NONE, responses_get, NULL, false},
    {"DELETE", "/v1/responses", true, HTTP_BODY_NONE, responses_delete, NULL, false},
    /* multipart forms or JSON bodies: api/audio.c tells them apart (415 for anything else) */
    {"POST", "/v1/audio/transcriptions", false, HTTP_BODY_NONE, audio_transcriptions, NULL,
     false},
    {"POST", "/v1/audio/translations", false, HTTP_BODY_NONE, audio_translations, NULL, false},
    {"POST", "/v1/audio/sessions", false, HTTP_BODY_JSON, audio_session_create, NULL, false},
    {"POST", "/v1/audio/sessions", true, HTTP_BODY_NONE, audio_session_post, NULL, false},
    {"DELETE", "/v1/audio/sessions", true, HTTP_BODY_NONE, audio_session_delete, NULL, false},
    {"POST", "/v1/embeddings", false, HTTP_BODY_JSON, openai_embeddings, NULL, false},
    {"GET", "/v1/adapters", false, HTTP_BODY_NONE, adapters_list, NULL, false},
    {"GET", "/v1/adapters", true, HTTP_BODY_NONE, adapters_get, NULL, false},
    {"POST", "/v1/adapters", false, HTTP_BODY_JSON, adapters_mount, NULL, false},
    {"DELETE", "/v1/adapters", true, HTTP_BODY_NONE, adapters_unmount, NULL, false},
    {"GET", "/v1", false, HTTP_BODY_NONE, api_index, NULL, false},
    {"GET", "/health", false, HTTP_BODY_NONE, admin_health, NULL, true},
    {"GET", "/stats", false, HTTP_BODY_NONE, admin_stats, NULL, false},
    {"GET", "/metrics", false, HTTP_BODY_NONE, admin_metrics, NULL, false},
    {"GET", "/fit", false, HTTP_BODY_NONE, fit_report, NULL, false},
    {"POST", "/admin/cache/session/close", false, HTTP_BODY_JSON, admin_session_close, NULL,
     false},
    {"POST", "/admin/cache/flush", false, HTTP_BODY_JSON, admin_cache_flush, NULL, false},
    {"POST", "/admin/transcription/unload", false, HTTP_BODY_NONE, audio_unload, NULL, false},
    {"GET", "/engine", false, HTTP_BODY_NONE, admin_engine, NULL, false},
    {"GET", "/ws/chat", false, HTTP_BODY_NONE, ws_chat_handle, NULL, false},
    /* The page itself needs no key: it asks for one when the API answers 401. */
    {"GET", "/", false, HTTP_BODY_NONE, webui_serve, NULL, true},
    {"GET", "/favicon.ico", false, HTTP_BODY_NONE, webui_serve, NULL, true},
    {"GET", "/assets", true, HTTP_BODY_NONE, webui_serve, NULL, true},
};
#define WEBUI_ROUTES 3

static const struct http_routes table = {
    .routes = routes,
    .n = sizeof routes / sizeof routes[0],
    .errors = &api_error_openai,
};

static const struct http_routes table_without_webui = {
    .routes = routes,
    .n = sizeof routes / sizeof routes[0] - WEBUI_ROUTES,
    .errors = &api_error_openai,
};

const struct http_routes *api_routes(bool webui)
{
    return webui ? &table : &table_without_webui;
}

/* GET /v1: the server, its model and every route of the table ({id} where a route takes one). */
static void api_index(struct http_exchange *x)
{
    json_object *root = json_object_new_object(), *endpoints = json_object_new_array();
    json_object_object_add(root, "name", json_object_new_string("inferd"));
    json_object_object_add(root, "version",
                           x->srv->version ? json_object_new_string(x->srv->version) : NULL);
    json_object_object_add(root, "model", json_object_new_string(x->srv->served.id));
    const struct http_routes *t = api_routes(x->srv->webui != NULL);
    for (size_t i = 0; i < t->n; i++) {
        const struct http_route *r = &t->routes[i];
        char path[256];
        snprintf(path, sizeof path, "%s%s", r->path, r->id_tail ? "/{id}" : "");
        json_object *e = json_object_new_object();
        json_object_object_add(e, "method", json_object_new_string(r->method));
        json_object_object_add(e, "path", json_object_new_string(path));
        json_object_array_add(endpoints, e);
    }
    json_object_object_add(root, "endpoints", endpoints);
    size_t len = 0;
    const char *s = json_object_to_json_string_length(
        root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, 200, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for /v1");
    json_object_put(root);
}
