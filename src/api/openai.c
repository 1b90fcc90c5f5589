/* api/openai.c — the OpenAI wire format: POST /v1/chat/completions and /v1/completions as JSON
 * objects or Server-Sent Events chunks (logprobs, tool calls, usage), and GET /v1/models. The
 * generation itself runs through api/generation.h. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/generation.h"
#include "api/engine_proxy.h"
#include "api/model_pool.h"
#include "api/openai.h"
#include "engine/transcribe.h"
#include "api/prompt.h"
#include "base/timer.h"

/* What OpenAI reports for a token that cannot be sampled (-inf). */
/* Longest silence on a stream before a keep-alive comment goes out. */
#define SSE_KEEPALIVE_MS 15000
#define LOGPROB_FLOOR -9999.0

/* One OpenAI reply to a generation request, shared by the JSON and SSE paths. */
struct reply {
    struct server *srv;
    const struct served_model *sm; /* the generation's model */
    enum gen_request_kind kind;
    struct generation *gen;      /* owned */
    char id[48];
    time_t created;
    int logprobs;                /* -1: none; else alternatives per token */
    bool include_usage;
    bool sent_role;              /* streaming: the first chunk (the assistant role) is out */
};

static void reply_free(struct reply *r)
{
    if (!r)
        return;
    generation_free(r->gen);
    free(r);
}

/* ---- JSON helpers ---- */

static json_object *jstr(const char *s, size_t len)
{
    return json_object_new_string_len(s, (int)len);
}

static json_object *jlogprob(float lp)
{
    double d = isfinite(lp) ? lp : LOGPROB_FLOOR;
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", d);
    return json_object_new_double_s(d, buf);
}

static json_object *token_bytes(const char *s, size_t len)
{
    json_object *a = json_object_new_array_ext((int)len);
    for (size_t i = 0; i < len; i++)
        json_object_array_add(a, json_object_new_int((unsigned char)s[i]));
    return a;
}

/* The text of one token on its own (special tokens included), malloc'd. */
static char *token_text(const struct tokenizer *tok, int32_t id, size_t *len)
{
    char *text = NULL;
    struct err err = {0};
    if (tok_decode(tok, &id, 1, false, &text, len, &err) < 0) {
        *len = 0;
        return strdup("");
    }
    return text;
}

static json_object *usage_json(const struct gen_news *o)
{
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(o->n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(o->n_generated));
    json_object_object_add(u, "total_tokens", json_object_new_int(o->n_prompt + o->n_generated));
    json_object *d = json_object_new_object();
    json_object_object_add(d, "cached_tokens", json_object_new_int(o->n_cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    json_object_object_add(u, "lane", json_object_new_string(gen_spec_lane(&o->spec)));
    if (o->spec.on) {
        json_object *s = json_object_new_object();
        json_object_object_add(s, "drafted", json_object_new_int(o->spec.drafted));
        json_object_object_add(s, "accepted", json_object_new_int(o->spec.accepted));
        json_object_object_add(s, "targetCalls", json_object_new_int(o->spec.target_calls));
        json_object_object_add(u, "speculation", s);
    }
    return u;
}

/* Chat logprobs: {"content":[{token, logprob, bytes, top_logprobs:[…]}], "refusal":null}. */
static json_object *chat_logprobs_json(const struct tokenizer *tok, const struct gen_token *t,
                                       size_t n)
{
    json_object *content = json_object_new_array();
    for (size_t i = 0; i < n; i++) {
        size_t len;
        char *s = token_text(tok, t[i].id, &len);
        json_object *e = json_object_new_object();
        json_object_object_add(e, "token", jstr(s, len));
        json_object_object_add(e, "logprob", jlogprob(t[i].logprob));
        json_object_object_add(e, "bytes", token_bytes(s, len));
        free(s);
        json_object *top = json_object_new_array();
        for (int k = 0; k < t[i].n_top; k++) {
            size_t tl;
            char *ts = token_text(tok, t[i].top[k].token, &tl);
            json_object *te = json_object_new_object();
            json_object_object_add(te, "token", jstr(ts, tl));
            json_object_object_add(te, "logprob", jlogprob(t[i].top[k].logprob));
            json_object_object_add(te, "bytes", token_bytes(ts, tl));
            free(ts);
            json_object_array_add(top, te);
        }
        json_object_object_add(e, "top_logprobs", top);
        json_object_array_add(content, e);
    }
    json_object *lp = json_object_new_object();
    json_object_object_add(lp, "content", content);
    json_object_object_add(lp, "refusal", NULL);
    return lp;
}

/* Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_object *completion_logprobs_json(const struct tokenizer *tok,
                                             const struct gen_token *t, size_t n,
                                             size_t text_base, size_t prev_end)
{
    json_object *tokens = json_object_new_array(), *lps = json_object_new_array();
    json_object *tops = json_object_new_array(), *offsets = json_object_new_array();
    for (size_t i = 0; i < n; i++) {
        size_t len;
        char *s = token_text(tok, t[i].id, &len);
        json_object_array_add(tokens, jstr(s, len));
        free(s);
        json_object_array_add(lps, jlogprob(t[i].logprob));
        json_object *top = json_object_new_object();
        for (int k = 0; k < t[i].n_top; k++) {
            size_t tl;
            char *ts = token_text(tok, t[i].top[k].token, &tl);
            json_object_object_add(top, ts, jlogprob(t[i].top[k].logprob));
            free(ts);
        }
        json_object_array_add(tops, top);
        size_t start = i == 0 ? prev_end : t[i - 1].text_end;
        json_object_array_add(offsets, json_object_new_int64((int64_t)(text_base + start)));
    }
    json_object *lp = json_object_new_object();
    json_object_object_add(lp, "tokens", tokens);
    json_object_object_add(lp, "token_logprobs", lps);
    json_object_object_add(lp, "top_logprobs", tops);
    json_object_object_add(lp, "text_offset", offsets);
    return lp;
}

static const char *finish_name(enum gen_finish f)
{
    return f == GEN_FINISH_LENGTH ? "length" : "stop";
}

/* A reply that made a tool call finishes with "tool_calls", whatever stopped it. */
static const char *reply_finish_name(const struct generation_news *n)
{
    return n->tool_calls ? "tool_calls" : finish_name(n->out.finish);
}

/* Chat tool calls as OpenAI writes them: [{id, type, function:{name, arguments}}] in a message,
 * and in a stream {index, id?, type?, function:{name?, arguments}} (id, type and name on a
 * call's first piece only). */
static json_object *tool_calls_json(const struct generation_news *n, bool stream)
{
    json_object *calls = json_object_new_array();
    for (size_t i = 0; i < n->n_tools; i++) {
        const struct generation_tool_delta *d = &n->tools[i];
        json_object *call = json_object_new_object(), *fn = json_object_new_object();
        if (stream)
            json_object_object_add(call, "index", json_object_new_int(d->index));
        if (d->id) {
            json_object_object_add(call, "id", json_object_new_string(d->id));
            json_object_object_add(call, "type", json_object_new_string("function"));
        }
        if (d->name)
            json_object_object_add(fn, "name", json_object_new_string(d->name));
        json_object_object_add(fn, "arguments", json_object_new_string(d->arguments));
        json_object_object_add(call, "function", fn);
        json_object_array_add(calls, call);
    }
    return calls;
}

static void send_json_object(struct http_exchange *x, int status, json_object *o)
{
    size_t len;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, status, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the response");
    json_object_put(o);
}

static void append_sse(struct strbuf *out, json_object *o)
{
    size_t len;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    strbuf_puts(out, "data: ");
    if (s)
        strbuf_append(out, s, len);
    strbuf_puts(out, "\n\n");
    json_object_put(o);
}

static json_object *base_object(const struct reply *r, const char *object)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(r->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(r->created));
    json_object_object_add(o, "model", json_object_new_string(r->sm->id));
    return o;
}

/* ---- JSON responses ---- */

static void respond_json(struct http_exchange *x, struct reply *r)
{
    struct generation_news all;
    struct api_error e;
    if (generation_collect(r->gen, &all, &e) < 0) {
        http_send_error(x, &e);
        return;
    }
    const struct gen_news *o = &all.out;
    json_object *root = base_object(r, r->kind == GEN_REQUEST_CHAT ? "chat.completion"
                                                                   : "text_completion");
    json_object *choice = json_object_new_object();
    json_object_object_add(choice, "index", json_object_new_int(0));
    const char *text = o->text ? o->text : "";
    if (r->kind == GEN_REQUEST_CHAT) {
        json_object *msg = json_object_new_object();
        json_object_object_add(msg, "role", json_object_new_string("assistant"));
        if (all.split) {
            /* A reply that is only tool calls has content null, as OpenAI sends it. */
            json_object_object_add(msg, "content",
                                   all.n_tools > 0 && all.text.content_len == 0
                                       ? NULL
                                       : jstr(all.text.content, all.text.content_len));
            if (all.text.reasoning_len > 0) {
                /* reasoning_content (vLLM's name) and reasoning (other servers'): clients read
                 * one or the other. */
                json_object_object_add(msg, "reasoning_content",
                                       jstr(all.text.reasoning, all.text.reasoning_len));
                json_object_object_add(msg, "reasoning",
                                       jstr(all.text.reasoning, all.text.reasoning_len));
            }
        } else {
            json_object_object_add(msg, "content", jstr(text, o->text_len));
        }
        json_object_object_add(msg, "refusal", NULL);
        if (all.n_tools > 0)
            json_object_object_add(msg, "tool_calls", tool_calls_json(&all, false));
        json_object_object_add(choice, "message", msg);
        json_object_object_add(choice, "logprobs",
                               r->logprobs >= 0
                                   ? chat_logprobs_json(r->sm->tok, o->tokens, o->n_tokens)
                                   : NULL);
    } else {
        json_object_object_add(choice, "text", jstr(text, o->text_len));
        json_object_object_add(
            choice, "logprobs",
            r->logprobs >= 0 ? completion_logprobs_json(r->sm->tok, o->tokens, o->n_tokens, 0, 0)
                             : NULL);
    }
    json_object_object_add(choice, "finish_reason", json_object_new_string(reply_finish_name(&all)));
    json_object *choices = json_object_new_array();
    json_object_array_add(choices, choice);
    json_object_object_add(root, "choices", choices);
    json_object_object_add(root, "usage", usage_json(o));
    generation_news_free(&all);
    send_json_object(x, 200, root);
}

/* ---- Server-Sent Events ---- */

static json_object *chunk_object(const struct reply *r, json_object *payload,
                                 json_object *logprobs, const char *finish)
{
    bool chat = r->kind == GEN_REQUEST_CHAT;
    json_object *root = base_object(r, chat ? "chat.completion.chunk" : "text_completion");
    json_object *choice = json_object_new_object();
    json_object_object_add(choice, "index", json_object_new_int(0));
    json_object_object_add(choice, chat ? "delta" : "text", payload);
    json_object_object_add(choice, "logprobs", logprobs);
    json_object_object_add(choice, "finish_reason",
                           finish ? json_object_new_string(finish) : NULL);
    json_object *choices = json_object_new_array();
    json_object_array_add(choices, choice);
    json_object_object_add(root, "choices", choices);
    return root;
}

static void emit_delta(struct reply *r, struct strbuf *out, const char *reasoning, size_t rlen,
                       const char *content, size_t clen, json_object *logprobs)
{
    if (r->kind == GEN_REQUEST_COMPLETION) {
        append_sse(out, chunk_object(r, jstr(content, clen), logprobs, NULL));
        return;
    }
    json_object *delta = json_object_new_object();
    if (rlen > 0) {
        json_object_object_add(delta, "reasoning_content", jstr(reasoning, rlen));
        json_object_object_add(delta, "reasoning", jstr(reasoning, rlen));
    }
    if (clen > 0 || rlen == 0)
        json_object_object_add(delta, "content", jstr(content, clen));
    append_sse(out, chunk_object(r, delta, logprobs, NULL));
}

/* The chunks for one piece of news: its text (with its tokens' logprobs), then
 * at the finish the split's held-back text, the finish chunk and usage, or
 * an error object; then [DONE]. */
static void emit_news(struct reply *r, struct strbuf *out, const struct generation_news *n,
                      bool *done)
{
    const struct gen_news *o = &n->out;
    json_object *lp = NULL;
    if (r->logprobs >= 0 && o->n_tokens > 0)
        lp = r->kind == GEN_REQUEST_CHAT
                 ? chat_logprobs_json(r->sm->tok, o->tokens, o->n_tokens)
                 : completion_logprobs_json(r->sm->tok, o->tokens, o->n_tokens, 0, o->text_from);
    if (n->split) {
        const struct generation_text *t = &n->text;
        if (t->reasoning_len || t->content_len || lp) {
            emit_delta(r, out, t->reasoning, t->reasoning_len, t->content, t->content_len, lp);
            lp = NULL;
        }
    } else if (o->text_len > 0 || lp) {
        emit_delta(r, out, NULL, 0, o->text ? o->text : "", o->text_len, lp);
        lp = NULL;
    }
    if (lp)
        json_object_put(lp);
    if (n->n_tools > 0 && r->kind == GEN_REQUEST_CHAT) {
        json_object *delta = json_object_new_object();
        json_object_object_add(delta, "tool_calls", tool_calls_json(n, true));
        append_sse(out, chunk_object(r, delta, NULL, NULL));
    }
    if (o->finish == GEN_RUNNING)
        return;

    const struct generation_text *tail = &n->tail;
    if (tail->reasoning_len || tail->content_len)
        emit_delta(r, out, tail->reasoning, tail->reasoning_len, tail->content, tail->content_len,
                   NULL);
    if (o->finish == GEN_FINISH_ERROR || o->finish == GEN_FINISH_CANCELLED) {
        /* The status line is long gone: the error travels as an event. */
        struct api_error e;
        if (o->finish == GEN_FINISH_ERROR && o->error_code == INFERD_EBUSY)
            api_error_set(&e, 503, API_ERROR_UNAVAILABLE, NULL, "engine_unavailable", "%s",
                          o->error);
        else
            api_error_set(&e, 500, API_ERROR_SERVER, NULL, NULL, "%s",
                          o->finish == GEN_FINISH_ERROR ? o->error : "the request was cancelled");
        strbuf_puts(out, "data: ");
        api_error_render_openai(&e, out);
        strbuf_puts(out, "\n\n");
    } else {
        json_object *payload = r->kind == GEN_REQUEST_CHAT ? json_object_new_object()
                                                           : json_object_new_string("");
        append_sse(out, chunk_object(r, payload, NULL, reply_finish_name(n)));
        if (r->include_usage) {
            json_object *u = base_object(r, r->kind == GEN_REQUEST_CHAT ? "chat.completion.chunk"
                                                                        : "text_completion");
            json_object_object_add(u, "choices", json_object_new_array());
            json_object_object_add(u, "usage", usage_json(o));
            append_sse(out, u);
        }
    }
    strbuf_puts(out, "data: [DONE]\n\n");
    *done = true;
}

static bool stream_produce(void *ctx, struct strbuf *out, bool *done)
{
    struct reply *r = ctx;
    if (!r->sent_role) {
        r->sent_role = true;
        if (r->kind == GEN_REQUEST_CHAT) {
            json_object *delta = json_object_new_object();
            json_object_object_add(delta, "role", json_object_new_string("assistant"));
            json_object_object_add(delta, "content", json_object_new_string(""));
            append_sse(out, chunk_object(r, delta, NULL, NULL));
            return true;
        }
    }
    while (out->len == 0 && !*done) {
        struct generation_news n;
        if (generation_next(r->gen, SSE_KEEPALIVE_MS, &n) < 0)
            return false;
        bool quiet = n.out.finish == GEN_RUNNING && n.out.text_len == 0 && n.out.n_tokens == 0;
        emit_news(r, out, &n, done);
        generation_news_free(&n);
        /* A long prefill sends nothing for a while: a comment line keeps the
         * connection from reading as idle (to the server's own idle timeout and
         * to proxies); SSE clients skip it. */
        if (quiet && out->len == 0)
            strbuf_puts(out, ": keep-alive\n\n");
    }
    return true;
}

static void stream_release(void *ctx)
{
    reply_free(ctx);
}

/* Admits, parses and submits; on failure the error is sent and NULL returned. */
static struct reply *start_reply(struct http_exchange *x, enum gen_request_kind kind,
                                 struct gen_request *req)
{
    struct api_error e;
    memset(&e, 0, sizeof e);
    if (generation_admit(x->srv, &e) < 0 ||
        gen_request_parse(x->body, x->body_len, kind, req, &e) < 0) {
        http_send_error(x, &e);
        return NULL;
    }
    struct reply *r = calloc(1, sizeof *r);
    if (!r) {
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return NULL;
    }
    struct served_model *sm = NULL;
    if (served_model_acquire(x->srv, req->model, &sm, &e) < 0 ||
        generation_start(x, sm, req, &r->gen, &e) < 0) {
        free(r);
        http_send_error(x, &e);
        return NULL;
    }
    r->srv = x->srv;
    r->sm = generation_model(r->gen);
    r->kind = kind;
    generation_random_id(r->id, sizeof r->id, kind == GEN_REQUEST_CHAT ? "chatcmpl-" : "cmpl-");
    r->created = time(NULL);
    r->logprobs = generation_logprobs(r->gen);
    r->include_usage = req->has_include_usage && req->include_usage;
    return r;
}

static void handle_generation(struct http_exchange *x, enum gen_request_kind kind)
{
    struct gen_request req;
    memset(&req, 0, sizeof req);
    struct reply *r = start_reply(x, kind, &req);
    bool stream = req.has_stream && req.stream;
    gen_request_free(&req);
    if (!r)
        return;
    if (!stream) {
        respond_json(x, r);
        reply_free(r);
        return;
    }
    http_send_stream(x, 200, "text/event-stream",
                     (struct http_stream){stream_produce, stream_release, r});
}

void openai_chat_completions(struct http_exchange *x)
{
    handle_generation(x, GEN_REQUEST_CHAT);
}

void openai_completions(struct http_exchange *x)
{
    handle_generation(x, GEN_REQUEST_COMPLETION);
}

/* A float setting as it was written (0.7, not 0.699999988). */
static json_object *jsetting(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", v);
    return json_object_new_double_s(v, buf);
}

/* A model's row; sm NULL for a pool entry that is not resident (its capabilities are known
 * once it is loaded), info NULL without a pool. */
static json_object *model_object(const struct server *srv, const char *id,
                                 const struct served_model *sm,
                                 const struct model_pool_info *info)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(id));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64(srv->created));
    json_object_object_add(m, "owned_by", json_object_new_string("inferd"));
    if (info) {
        json_object_object_add(m, "state",
                               json_object_new_string(model_pool_state_name(info->state)));
        json_object_object_add(m, "default", json_object_new_boolean(info->is_default));
        json_object_object_add(m, "bytes", json_object_new_int64((int64_t)info->bytes));
        json_object_object_add(m, "loads", json_object_new_int64((int64_t)info->loads));
        json_object_object_add(m, "load_s", json_object_new_double(info->load_s_last));
    }
    if (!sm)
        return m;
    if (served_engine_ready(sm))
        json_object_object_add(m, "context_window",
                               json_object_new_int(served_engine_config(sm)->n_ctx));
    /* What a client may ask of this model: tool calls and thinking where its chat template has
     * them; structured output where the server has a grammar cache. */
    const char *tmpl = sm->tok && sm->tmpl ? tok_chat_template(sm->tok) : NULL;
    bool thinks = (sm->tok && prompt_model_thinks(sm->tok)) ||
                  (tmpl && (strstr(tmpl, "enable_thinking") || strstr(tmpl, "<think>")));
    json_object_object_add(m, "tools", json_object_new_boolean(tmpl && strstr(tmpl, "tools")));
    json_object_object_add(m, "structured_output", json_object_new_boolean(sm->grammars != NULL));
    json_object_object_add(m, "reasoning", json_object_new_boolean(thinks));
    json_object_object_add(m, "thinking_switch",
                           json_object_new_boolean(tmpl && strstr(tmpl, "enable_thinking")));
    json_object_object_add(m, "vision", json_object_new_boolean(false));
    json_object_object_add(m, "chat_template", json_object_new_boolean(sm->tmpl != NULL));
    const struct server_defaults *d = &sm->defaults;
    json_object *gen = json_object_new_object();
    json_object_object_add(gen, "temperature", jsetting(d->temperature));
    json_object_object_add(gen, "top_p", jsetting(d->top_p));
    json_object_object_add(gen, "top_k", json_object_new_int(d->top_k));
    json_object_object_add(gen, "min_p", jsetting(d->min_p));
    json_object_object_add(gen, "repetition_penalty",
                           jsetting(d->repetition_penalty));
    json_object_object_add(gen, "max_tokens", d->max_tokens ? json_object_new_int(d->max_tokens)
                                                            : NULL);
    json_object_object_add(m, "gen_defaults", gen);
    return m;
}

/* The row of the pool's entry i: its capabilities when it is resident now. */
static json_object *pool_model_object(struct server *srv, int i)
{
    struct model_pool_info info;
    model_pool_info(srv->pool, i, &info);
    struct served_model *sm = model_pool_peek(srv->pool, info.id);
    json_object *m = model_object(srv, info.id, sm, &info);
    served_model_release(srv, sm);
    return m;
}

/* The pool's entry named id, or -1. */
static int pool_index(struct server *srv, const char *id)
{
    for (int i = 0; i < model_pool_count(srv->pool); i++) {
        struct model_pool_info info;
        model_pool_info(srv->pool, i, &info);
        if (!strcmp(info.id, id))
            return i;
    }
    return -1;
}

void openai_models(struct http_exchange *x)
{
    struct server *srv = x->srv;
    const char *id = x->id;
    int at = id && srv->pool ? pool_index(srv, id) : -1;
    if (id) {
        if (srv->pool ? at < 0 : strcmp(id, srv->served.id) != 0) {
            http_send_errorf(x, 404, API_ERROR_NOT_FOUND, "model", "model_not_found",
                             "the model '%.200s' does not exist; GET /v1/models lists the "
                             "served ones",
                             id);
            return;
        }
        send_json_object(x, 200,
                         srv->pool ? pool_model_object(srv, at)
                                   : model_object(srv, srv->served.id, &srv->served, NULL));
        return;
    }
    json_object *root = json_object_new_object();
    json_object_object_add(root, "object", json_object_new_string("list"));
    json_object *data = json_object_new_array();
    if (srv->pool)
        for (int i = 0; i < model_pool_count(srv->pool); i++)
            json_object_array_add(data, pool_model_object(srv, i));
    else
        json_object_array_add(data, model_object(srv, srv->served.id, &srv->served, NULL));
    if (srv->transcriber) { /* the Whisper model beside the chat model */
        json_object *w = json_object_new_object();
        json_object_object_add(w, "id", json_object_new_string(transcriber_id(srv->transcriber)));
        json_object_object_add(w, "object", json_object_new_string("model"));
        json_object_object_add(w, "created", json_object_new_int64(srv->created));
        json_object_object_add(w, "owned_by", json_object_new_string("inferd"));
        json_object_object_add(w, "type", json_object_new_string("transcription"));
        json_object_array_add(data, w);
    }
    json_object_object_add(root, "data", data);
    send_json_object(x, 200, root);
}
