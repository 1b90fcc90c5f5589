/* api/ws_chat.c — WS /ws/chat: one conversation per WebSocket connection, each turn a chat
 * generation through api/generation.h, streamed back as the protocol's frames. */
#include "api/ws_chat.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/generation.h"
#include "api/model_pool.h"
#include "api/prompt.h"
#include "api/websocket.h"
#include "base/timer.h"

/* A client frame's limit: a prompt is text typed or pasted, not a document store. */
#define WS_CHAT_MAX_MESSAGE ((size_t)4 << 20)
/* How often a running turn looks at the socket for an abort or a close. */
#define WS_CHAT_POLL_MS 20

struct ws_chat {
    struct server *srv;  /* borrowed */
    uint64_t tenant_ns;  /* the key the upgrade presented */
    struct ws_conn conn;
    json_object *history; /* owned; the conversation's user and assistant turns */
};

static int send_object(struct ws_chat *s, json_object *o)
{
    size_t len = 0;
    const char *text = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    int rc = text ? ws_conn_send_text(&s->conn, text, len) : -INFERD_ENOMEM;
    json_object_put(o);
    return rc;
}

static json_object *frame(const char *type)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

static int send_error(struct ws_chat *s, int status, const char *message)
{
    json_object *o = frame("error");
    json_object_object_add(o, "message", json_object_new_string(message));
    json_object_object_add(o, "status", json_object_new_int(status));
    return send_object(s, o);
}

static json_object *jnum(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", v);
    return json_object_new_double_s(v, buf);
}

/* The ready frame: what the model can do, as /v1/models says it. */
static int send_ready(struct ws_chat *s)
{
    /* With a pool: the default model, as far as it is known without loading it. */
    struct served_model *held = served_model_peek(s->srv), none = {0};
    const struct served_model *srv = held ? held : &none;
    if (!held)
        snprintf(none.id, sizeof none.id, "%s", s->srv->served.id);
    const char *tmpl = srv->tok && srv->tmpl ? tok_chat_template(srv->tok) : NULL;
    bool thinks = (srv->tok && prompt_model_thinks(srv->tok)) ||
                  (tmpl && (strstr(tmpl, "enable_thinking") || strstr(tmpl, "<think>")));
    json_object *o = frame("ready");
    json_object_object_add(o, "model", json_object_new_string(srv->id));
    json_object_object_add(o, "vision", json_object_new_boolean(false));
    json_object_object_add(o, "audio", json_object_new_boolean(false));
    json_object_object_add(o, "transcription", json_object_new_boolean(false));
    json_object_object_add(o, "thinking", json_object_new_boolean(thinks));
    json_object_object_add(o, "tools", json_object_new_boolean(tmpl && strstr(tmpl, "tools")));
    json_object *g = json_object_new_object();
    json_object_object_add(g, "temperature", jnum(srv->defaults.temperature));
    json_object_object_add(g, "top_p", jnum(srv->defaults.top_p));
    json_object_object_add(g, "top_k", json_object_new_int(srv->defaults.top_k));
    json_object_object_add(g, "max_tokens", srv->defaults.max_tokens
                                                ? json_object_new_int(srv->defaults.max_tokens)
                                                : NULL);
    json_object_object_add(o, "genDefaults", g);
    served_model_release(s->srv, held);
    return send_object(s, o);
}

static int send_delta(struct ws_chat *s, const char *kind, const char *text, size_t len)
{
    if (len == 0)
        return 0;
    json_object *e = json_object_new_object();
    json_object_object_add(e, "type", json_object_new_string(kind));
    json_object_object_add(e, "delta", json_object_new_string_len(text, (int)len));
    json_object *o = frame("message_update");
    json_object_object_add(o, "assistantMessageEvent", e);
    return send_object(s, o);
}

/* What a turn accumulates for the conversation and the agent_end frame. */
struct turn {
    struct strbuf content;    /* the reply's text outside reasoning and tool calls */
    json_object *tool_calls;  /* owned; [{id, type, function:{name, arguments}}] */
    uint64_t start_ns, first_ns, end_ns;
    struct gen_news last;     /* counts and finish of the last news (text fields unused) */
    bool tool_finish;
};

static int send_news(struct ws_chat *s, struct turn *t, const struct generation_news *n)
{
    int rc = 0;
    if (n->split) {
        const struct generation_text *parts[2] = {&n->text, &n->tail};
        for (int i = 0; i < 2 && rc == 0; i++) {
            rc = send_delta(s, "thinking_delta", parts[i]->reasoning, parts[i]->reasoning_len);
            if (rc == 0)
                rc = send_delta(s, "text_delta", parts[i]->content, parts[i]->content_len);
            strbuf_append(&t->content, parts[i]->content ? parts[i]->content : "",
                          parts[i]->content_len);
        }
    } else if (n->out.text_len) {
        rc = send_delta(s, "text_delta", n->out.text, n->out.text_len);
        strbuf_append(&t->content, n->out.text, n->out.text_len);
    }
    for (size_t i = 0; i < n->n_tools && rc == 0; i++) {
        const struct generation_tool_delta *d = &n->tools[i];
        json_object *e = json_object_new_object();
        json_object_object_add(e, "type", json_object_new_string("toolcall"));
        json_object_object_add(e, "index", json_object_new_int(d->index));
        if (d->id)
            json_object_object_add(e, "id", json_object_new_string(d->id));
        if (d->name)
            json_object_object_add(e, "name", json_object_new_string(d->name));
        json_object_object_add(e, "arguments", json_object_new_string(d->arguments));
        json_object *o = frame("message_update");
        json_object_object_add(o, "assistantMessageEvent", e);
        rc = send_object(s, o);
        /* The conversation keeps the calls whole, as an assistant message carries them. */
        if (d->id) {
            json_object *call = json_object_new_object(), *fn = json_object_new_object();
            json_object_object_add(call, "id", json_object_new_string(d->id));
            json_object_object_add(call, "type", json_object_new_string("function"));
            json_object_object_add(fn, "name", json_object_new_string(d->name ? d->name : ""));
            json_object_object_add(fn, "arguments", json_object_new_string(d->arguments));
            json_object_object_add(call, "function", fn);
            json_object_array_add(t->tool_calls, call);
        } else if (d->index >= 0 && (size_t)d->index < json_object_array_length(t->tool_calls)) {
            json_object *fn = json_object_object_get(
                json_object_array_get_idx(t->tool_calls, (size_t)d->index), "function");
            const char *had = json_object_get_string(json_object_object_get(fn, "arguments"));
            struct strbuf b = {0};
            strbuf_puts(&b, had ? had : "");
            strbuf_puts(&b, d->arguments);
            json_object_object_add(fn, "arguments",
                                   json_object_new_string(b.data ? b.data : ""));
            strbuf_free(&b);
        }
    }
    if (n->tool_calls)
        t->tool_finish = true;
    return rc;
}

static int send_end(struct ws_chat *s, const struct turn *t, const char *finish)
{
    json_object *o = frame("agent_end");
    json_object_object_add(o, "finish_reason", json_object_new_string(finish));
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(t->last.n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(t->last.n_generated));
    json_object_object_add(u, "cached_tokens", json_object_new_int(t->last.n_cached));
    json_object_object_add(o, "usage", u);
    json_object *tm = json_object_new_object();
    double ttft = t->first_ns ? (double)(t->first_ns - t->start_ns) / 1e6 : 0;
    double secs = t->first_ns && t->end_ns > t->first_ns ? (double)(t->end_ns - t->first_ns) / 1e9
                                                         : 0;
    json_object_object_add(tm, "ttft_ms", jnum(ttft));
    json_object_object_add(tm, "tokens_per_s",
                           jnum(secs > 0 && t->last.n_generated > 1
                                    ? (t->last.n_generated - 1) / secs
                                    : 0));
    json_object_object_add(o, "timings", tm);
    return send_object(s, o);
}

/* The chat body a prompt frame stands for: the conversation so far with the new user turn. */
static json_object *turn_body(struct ws_chat *s, json_object *msg, json_object *user)
{
    json_object *body = json_object_new_object(), *messages = json_object_new_array();
    json_object *v;
    if (json_object_object_get_ex(msg, "system", &v) && json_object_is_type(v, json_type_string) &&
        json_object_get_string_len(v) > 0) {
        json_object *sys = json_object_new_object();
        json_object_object_add(sys, "role", json_object_new_string("system"));
        json_object_object_add(sys, "content", json_object_get(v));
        json_object_array_add(messages, sys);
    }
    for (size_t i = 0; i < json_object_array_length(s->history); i++)
        json_object_array_add(messages, json_object_get(json_object_array_get_idx(s->history, i)));
    json_object_array_add(messages, json_object_get(user));
    json_object_object_add(body, "messages", messages);
    static const char *const passed[] = {"max_tokens", "temperature", "top_p", "top_k", "seed",
                                         "stop", "logit_bias"};
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++)
        if (json_object_object_get_ex(msg, passed[i], &v))
            json_object_object_add(body, passed[i], json_object_get(v));
    if (json_object_object_get_ex(msg, "thinking", &v) && json_object_is_type(v, json_type_boolean)) {
        json_object *kw = json_object_new_object();
        json_object_object_add(kw, "enable_thinking", json_object_get(v));
        json_object_object_add(body, "chat_template_kwargs", kw);
    }
    return body;
}

/* Runs one turn to its end, an abort or the connection's end. Returns -INFERD_EIO when the
 * connection is over. */
static int run_turn(struct ws_chat *s, json_object *msg)
{
    json_object *text;
    if (!json_object_object_get_ex(msg, "message", &text) ||
        !json_object_is_type(text, json_type_string))
        return send_error(s, 400, "a prompt frame needs \"message\": a string");
    json_object *user = json_object_new_object();
    json_object_object_add(user, "role", json_object_new_string("user"));
    json_object_object_add(user, "content", json_object_get(text));
    json_object *body = turn_body(s, msg, user);
    size_t len = 0;
    const char *b = json_object_to_json_string_length(body, JSON_C_TO_STRING_PLAIN, &len);

    struct api_error e;
    memset(&e, 0, sizeof e);
    struct gen_request req;
    memset(&req, 0, sizeof req);
    struct generation *g = NULL;
    struct served_model *sm = NULL;
    struct http_exchange x = {.srv = s->srv, .method = "GET", .path = "/ws/chat",
                              .errors = &api_error_openai, .counter = -1, .client_fd = -1,
                              .tenant_ns = s->tenant_ns};
    struct turn t = {.tool_calls = json_object_new_array(), .start_ns = now_ns()};
    int rc = 0;
    if (generation_admit(s->srv, &e) < 0 ||
        gen_request_parse(b ? b : "", b ? len : 0, GEN_REQUEST_CHAT, &req, &e) < 0 ||
        served_model_acquire(s->srv, req.model, &sm, &e) < 0 ||
        generation_start(&x, sm, &req, &g, &e) < 0) {
        rc = send_error(s, e.status, e.message);
        goto done;
    }
    char id[48];
    generation_random_id(id, sizeof id, "chatcmpl-");
    json_object *start = frame("agent_start");
    json_object_object_add(start, "id", json_object_new_string(id));
    if ((rc = send_object(s, start)) < 0)
        goto done;
    const char *finish = NULL;
    while (!finish) {
        struct generation_news n;
        if (generation_next(g, WS_CHAT_POLL_MS, &n) < 0) {
            rc = send_error(s, 500, "out of memory while streaming");
            goto done;
        }
        if (!t.first_ns && (n.out.text_len || n.out.n_generated > 0))
            t.first_ns = now_ns();
        rc = send_news(s, &t, &n);
        enum gen_finish f = n.out.finish;
        char error[256];
        snprintf(error, sizeof error, "%s", n.out.error);
        t.last.n_prompt = n.out.n_prompt;
        t.last.n_cached = n.out.n_cached;
        t.last.n_generated = n.out.n_generated;
        generation_news_free(&n);
        if (rc < 0)
            goto done;
        if (f == GEN_FINISH_ERROR || f == GEN_FINISH_CANCELLED) {
            rc = send_error(s, f == GEN_FINISH_ERROR ? 500 : 503,
                            f == GEN_FINISH_ERROR ? error : "the generation was cancelled");
            goto done;
        }
        if (f != GEN_RUNNING) {
            finish = t.tool_finish ? "tool_calls" : f == GEN_FINISH_LENGTH ? "length" : "stop";
            break;
        }
        /* Between pieces: an abort, a close or a stray frame from the client. */
        struct ws_event ev;
        if (ws_conn_next(&s->conn, 0, &ev) < 0) {
            rc = -INFERD_EIO;
            goto done;
        }
        if (ev.kind != WS_EVENT_MESSAGE)
            continue;
        json_object *m = json_tokener_parse((const char *)ev.data);
        json_object *type = NULL;
        json_object_object_get_ex(m, "type", &type);
        if (type && !strcmp(json_object_get_string(type), "abort"))
            finish = "aborted";
        else
            rc = send_error(s, 409, "a turn is under way: send {\"type\":\"abort\"} first");
        json_object_put(m);
        if (rc < 0)
            goto done;
    }
    t.end_ns = now_ns();
    generation_free(g); /* cancels an aborted turn in the engine */
    g = NULL;
    if (strcmp(finish, "aborted")) {
        /* The turn joins the conversation only when it finished. */
        json_object *reply = json_object_new_object();
        json_object_object_add(reply, "role", json_object_new_string("assistant"));
        json_object_object_add(reply, "content",
                               json_object_new_string_len(t.content.data ? t.content.data : "",
                                                          (int)t.content.len));
        if (json_object_array_length(t.tool_calls) > 0)
            json_object_object_add(reply, "tool_calls", json_object_get(t.tool_calls));
        json_object_array_add(s->history, json_object_get(user));
        json_object_array_add(s->history, reply);
    }
    rc = send_end(s, &t, finish);
done:
    generation_free(g);
    gen_request_free(&req);
    json_object_put(body);
    json_object_put(user);
    json_object_put(t.tool_calls);
    strbuf_free(&t.content);
    return rc == -INFERD_EIO || s->conn.broken ? -INFERD_EIO : 0;
}

static void session_run(void *ctx, int fd, const char *early, size_t n_early)
{
    struct ws_chat *s = ctx;
    struct err err = {0};
    if (ws_conn_init(&s->conn, fd, WS_CHAT_MAX_MESSAGE, early, n_early, &err) < 0)
        return;
    if (send_ready(s) < 0)
        return;
    for (;;) {
        struct ws_event ev;
        if (ws_conn_next(&s->conn, -1, &ev) < 0)
            return;
        if (ev.kind != WS_EVENT_MESSAGE)
            continue;
        json_object *m = ev.text ? json_tokener_parse((const char *)ev.data) : NULL;
        json_object *type = NULL;
        int rc;
        if (!json_object_is_type(m, json_type_object) ||
            !json_object_object_get_ex(m, "type", &type) ||
            !json_object_is_type(type, json_type_string))
            rc = send_error(s, 400, "a frame must be a JSON object with a string \"type\"");
        else if (!strcmp(json_object_get_string(type), "prompt"))
            rc = run_turn(s, m);
        else if (!strcmp(json_object_get_string(type), "abort"))
            rc = 0; /* nothing under way */
        else if (!strcmp(json_object_get_string(type), "new_session")) {
            json_object_put(s->history);
            s->history = json_object_new_array();
            rc = send_object(s, frame("new_session"));
        } else
            rc = send_error(s, 400, "unknown frame type; expected prompt, abort or new_session");
        json_object_put(m);
        if (rc < 0)
            return;
    }
}

static void session_release(void *ctx)
{
    struct ws_chat *s = ctx;
    ws_conn_close(&s->conn, WS_CLOSE_GOING_AWAY, NULL);
    ws_conn_free(&s->conn);
    json_object_put(s->history);
    free(s);
}

void ws_chat_handle(struct http_exchange *x)
{
    struct ws_chat *s = calloc(1, sizeof *s);
    if (!s) {
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for a session");
        return;
    }
    s->srv = x->srv;
    s->tenant_ns = x->tenant_ns;
    s->conn.fd = -1;
    s->history = json_object_new_array();
    http_send_websocket(x, (struct http_websocket){session_run, session_release, s});
}
