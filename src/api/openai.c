/* api/openai.c — POST /v1/chat/completions, POST /v1/completions and GET /v1/models in the
 * OpenAI wire format: request → prompt tokens → engine → JSON or Server-Sent Events. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api/http.h"
#include "api/prompt.h"
#include "base/timer.h"
#include "engine/reasoning.h"

#define WAIT_SLICE_MS 50
/* What OpenAI reports for a token that cannot be sampled (-inf). */
#define LOGPROB_FLOOR -9999.0

/* A request on its way through the engine, shared by the JSON and SSE paths. */
struct generation {
    struct server *srv;
    enum gen_request_kind kind;
    struct gen_output *out;      /* one reference */
    char id[48];
    time_t created;
    int client_fd;
    bool split_reasoning;        /* the model thinks in <think>…</think> */
    bool starts_inside;          /* the prompt ends inside an open <think> */
    int logprobs;                /* -1: none; else alternatives per token */
    bool include_usage;
    /* streaming progress */
    struct reasoning_splitter *splitter; /* owned; NULL when not splitting */
    size_t text_sent, tokens_sent;
    bool sent_role, finished;
};

static void random_id(char *out, size_t cap, const char *prefix)
{
    unsigned char b[12];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t t = now_ns();
        memcpy(b, &t, 8);
        memset(b + 8, 0, 4);
    }
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof b && n + 2 < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%02x", b[i]);
}

static void generation_free(struct generation *g)
{
    if (!g)
        return;
    if (g->out) {
        if (g->out->finish == GEN_RUNNING)
            atomic_store(&g->out->cancel, true);
        gen_output_release(g->out);
    }
    reasoning_splitter_free(g->splitter);
    free(g);
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

static json_object *usage_json(const struct gen_output *o)
{
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(o->n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(o->n_generated));
    json_object_object_add(u, "total_tokens", json_object_new_int(o->n_prompt + o->n_generated));
    json_object *d = json_object_new_object();
    json_object_object_add(d, "cached_tokens", json_object_new_int(o->n_cached));
    json_object_object_add(u, "prompt_tokens_details", d);
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

static void send_json_object(struct http_exchange *x, int status, json_object *o)
{
    size_t len;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, status, s, len);
    else
        http_send_errorf(x, 500, "server_error", NULL, NULL, "out of memory for the response");
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

static void fail_request(struct http_exchange *x, int status, const char *param,
                         const char *code, const char *msg)
{
    http_send_errorf(x, status, status >= 500 ? "server_error" : "invalid_request_error", param,
                     code, "%s", msg);
}

/* Parses, prepares and submits; on failure the error is sent and NULL returned. */
static struct generation *start_generation(struct http_exchange *x, enum gen_request_kind kind,
                                           struct gen_request *req)
{
    struct server *srv = x->srv;
    if (atomic_load(&srv->stopping)) {
        fail_request(x, 503, NULL, "shutting_down", "the server is shutting down");
        return NULL;
    }
    if (!atomic_load(&srv->ready)) {
        fail_request(x, 503, NULL, "model_loading", "the model is still loading; try again");
        return NULL;
    }
    struct api_error aerr;
    if (gen_request_parse(x->body, x->body_len, kind, req, &aerr) < 0) {
        http_send_error(x, &aerr);
        return NULL;
    }
    struct prompt pr;
    if (!prompt_build(srv, req, &pr, &aerr)) {
        http_send_error(x, &aerr);
        return NULL;
    }
    struct sampler_logit_bias *bias = calloc(req->n_logit_bias + 1, sizeof *bias);
    struct generation *g = calloc(1, sizeof *g);
    if (!bias || !g) {
        prompt_free(&pr);
        free(bias);
        free(g);
        fail_request(x, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    struct gen_params p;
    memset(&p, 0, sizeof p);
    prompt_fill_params(srv, req, &pr, &p, bias);
    struct err err = {0};
    int rc = engine_submit(srv->engine, &p, &g->out, &err);
    bool starts_inside = pr.starts_inside_think;
    prompt_free(&pr);
    free(bias);
    if (rc < 0) {
        free(g);
        if (rc == -INFERD_EBUSY)
            http_send_errorf(x, 429, "rate_limit_error", NULL, "rate_limit_exceeded", "%s",
                             err.msg);
        else if (rc == -INFERD_ERANGE)
            fail_request(x, 400, kind == GEN_REQUEST_CHAT ? "messages" : "prompt",
                         "context_length_exceeded", err.msg);
        else if (rc == -INFERD_ENOMEM)
            fail_request(x, 503, NULL, "out_of_memory", err.msg);
        else
            fail_request(x, 400, NULL, NULL, err.msg);
        return NULL;
    }
    g->srv = srv;
    g->kind = kind;
    random_id(g->id, sizeof g->id, kind == GEN_REQUEST_CHAT ? "chatcmpl-" : "cmpl-");
    g->created = time(NULL);
    g->client_fd = x->client_fd;
    g->split_reasoning = kind == GEN_REQUEST_CHAT && (starts_inside || prompt_model_thinks(srv->tok));
    g->starts_inside = starts_inside;
    g->logprobs = p.logprobs;
    g->include_usage = req->has_include_usage && req->include_usage;
    return g;
}

/* Waits (under out->mu) for news past what was sent. False when the client left. */
static bool wait_for_news(struct generation *g)
{
    struct gen_output *o = g->out;
    while (o->finish == GEN_RUNNING && o->text.len <= g->text_sent &&
           o->n_tokens <= g->tokens_sent) {
        gen_output_wait(o, g->text_sent, g->tokens_sent, WAIT_SLICE_MS);
        if (o->finish == GEN_RUNNING && http_client_gone(g->client_fd)) {
            atomic_store(&o->cancel, true);
            return false;
        }
    }
    return true;
}

static json_object *base_object(const struct generation *g, const char *object)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(g->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(g->created));
    json_object_object_add(o, "model", json_object_new_string(g->srv->model_id));
    return o;
}

/* ---- JSON responses ---- */

static void respond_json(struct http_exchange *x, struct generation *g)
{
    struct gen_output *o = g->out;
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING) {
        if (!wait_for_news(g))
            break;
        g->text_sent = o->text.len;
        g->tokens_sent = o->n_tokens;
    }
    enum gen_finish finish = o->finish;
    pthread_mutex_unlock(&o->mu);
    if (finish == GEN_RUNNING || finish == GEN_FINISH_CANCELLED) {
        fail_request(x, 503, NULL, "cancelled", "the request was cancelled");
        return;
    }
    if (finish == GEN_FINISH_ERROR) {
        /* Memory (e.g. on the GPU) running out is the server's state, not a fault. */
        if (o->error_code == INFERD_ENOMEM)
            fail_request(x, 503, NULL, "out_of_memory", o->error);
        else
            fail_request(x, 500, NULL, NULL, o->error);
        return;
    }
    /* Finished: the engine no longer writes to o. */
    json_object *root = base_object(g, g->kind == GEN_REQUEST_CHAT ? "chat.completion"
                                                                   : "text_completion");
    json_object *choice = json_object_new_object();
    json_object_object_add(choice, "index", json_object_new_int(0));
    const char *text = o->text.data ? o->text.data : "";
    if (g->kind == GEN_REQUEST_CHAT) {
        json_object *msg = json_object_new_object();
        json_object_object_add(msg, "role", json_object_new_string("assistant"));
        char *reasoning = NULL, *content = NULL;
        size_t rlen = 0, clen = 0;
        struct err err = {0};
        if (g->split_reasoning &&
            reasoning_split_all(text, o->text.len, g->starts_inside, &reasoning, &rlen, &content,
                                &clen, &err) == 0) {
            json_object_object_add(msg, "content", jstr(content, clen));
            if (rlen > 0)
                json_object_object_add(msg, "reasoning_content", jstr(reasoning, rlen));
        } else {
            json_object_object_add(msg, "content", jstr(text, o->text.len));
        }
        free(reasoning);
        free(content);
        json_object_object_add(msg, "refusal", NULL);
        json_object_object_add(choice, "message", msg);
        json_object_object_add(choice, "logprobs",
                               g->logprobs >= 0
                                   ? chat_logprobs_json(g->srv->tok, gen_output_tokens(o), o->n_tokens)
                                   : NULL);
    } else {
        json_object_object_add(choice, "text", jstr(text, o->text.len));
        json_object_object_add(
            choice, "logprobs",
            g->logprobs >= 0 ? completion_logprobs_json(g->srv->tok, gen_output_tokens(o), o->n_tokens, 0, 0)
                             : NULL);
    }
    json_object_object_add(choice, "finish_reason", json_object_new_string(finish_name(finish)));
    json_object *choices = json_object_new_array();
    json_object_array_add(choices, choice);
    json_object_object_add(root, "choices", choices);
    json_object_object_add(root, "usage", usage_json(o));
    send_json_object(x, 200, root);
}

/* ---- Server-Sent Events ---- */

static json_object *chunk_object(const struct generation *g, json_object *payload,
                                 json_object *logprobs, const char *finish)
{
    bool chat = g->kind == GEN_REQUEST_CHAT;
    json_object *root = base_object(g, chat ? "chat.completion.chunk" : "text_completion");
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

static void emit_delta(struct generation *g, struct strbuf *out, const char *reasoning,
                       size_t rlen, const char *content, size_t clen, json_object *logprobs)
{
    if (g->kind == GEN_REQUEST_COMPLETION) {
        append_sse(out, chunk_object(g, jstr(content, clen), logprobs, NULL));
        return;
    }
    json_object *delta = json_object_new_object();
    if (rlen > 0)
        json_object_object_add(delta, "reasoning_content", jstr(reasoning, rlen));
    if (clen > 0 || rlen == 0)
        json_object_object_add(delta, "content", jstr(content, clen));
    append_sse(out, chunk_object(g, delta, logprobs, NULL));
}

static bool stream_produce(void *ctx, struct strbuf *out, bool *done)
{
    struct generation *g = ctx;
    struct gen_output *o = g->out;
    if (!g->sent_role) {
        g->sent_role = true;
        if (g->kind == GEN_REQUEST_CHAT) {
            json_object *delta = json_object_new_object();
            json_object_object_add(delta, "role", json_object_new_string("assistant"));
            json_object_object_add(delta, "content", json_object_new_string(""));
            append_sse(out, chunk_object(g, delta, NULL, NULL));
            return true;
        }
    }
    while (out->len == 0 && !*done) {
        pthread_mutex_lock(&o->mu);
        if (!wait_for_news(g)) {
            pthread_mutex_unlock(&o->mu);
            return false;
        }
        size_t from = g->text_sent, to = o->text.len;
        size_t t_from = g->tokens_sent, t_to = o->n_tokens;
        enum gen_finish finish = o->finish;
        /* Copy out under the lock: the engine may grow (move) the buffers. */
        char *text = to > from ? malloc(to - from) : NULL;
        struct gen_token *toks = t_to > t_from ? malloc((t_to - t_from) * sizeof *toks) : NULL;
        if (text)
            memcpy(text, o->text.data + from, to - from);
        if (toks)
            memcpy(toks, gen_output_tokens(o) + t_from, (t_to - t_from) * sizeof *toks);
        pthread_mutex_unlock(&o->mu);
        if ((to > from && !text) || (t_to > t_from && !toks)) {
            free(text);
            free(toks);
            return false;
        }
        g->text_sent = to;
        g->tokens_sent = t_to;

        json_object *lp = NULL;
        if (g->logprobs >= 0 && toks)
            lp = g->kind == GEN_REQUEST_CHAT
                     ? chat_logprobs_json(g->srv->tok, toks, t_to - t_from)
                     : completion_logprobs_json(g->srv->tok, toks, t_to - t_from, 0, from);
        struct err err = {0};
        if (g->splitter && to > from) {
            struct reasoning_delta d = {0};
            if (reasoning_splitter_push(g->splitter, text, to - from, &d, &err) == 0 &&
                (d.reasoning_len || d.content_len || lp)) {
                emit_delta(g, out, d.reasoning, d.reasoning_len, d.content, d.content_len, lp);
                lp = NULL;
            }
        } else if (to > from || lp) {
            emit_delta(g, out, NULL, 0, text ? text : "", to - from, lp);
            lp = NULL;
        }
        if (lp)
            json_object_put(lp);
        free(text);
        free(toks);

        if (finish != GEN_RUNNING) {
            if (g->splitter) {
                struct reasoning_delta d = {0};
                if (reasoning_splitter_flush(g->splitter, &d, &err) == 0 &&
                    (d.reasoning_len || d.content_len))
                    emit_delta(g, out, d.reasoning, d.reasoning_len, d.content, d.content_len,
                               NULL);
            }
            if (finish == GEN_FINISH_ERROR || finish == GEN_FINISH_CANCELLED) {
                json_object *e = json_object_new_object(), *body = json_object_new_object();
                json_object_object_add(body, "message",
                                       json_object_new_string(finish == GEN_FINISH_ERROR
                                                                  ? o->error
                                                                  : "the request was cancelled"));
                json_object_object_add(body, "type", json_object_new_string("server_error"));
                json_object_object_add(body, "param", NULL);
                json_object_object_add(body, "code", NULL);
                json_object_object_add(e, "error", body);
                append_sse(out, e);
            } else {
                json_object *payload = g->kind == GEN_REQUEST_CHAT ? json_object_new_object()
                                                                   : json_object_new_string("");
                append_sse(out, chunk_object(g, payload, NULL, finish_name(finish)));
                if (g->include_usage) {
                    json_object *u = base_object(g, g->kind == GEN_REQUEST_CHAT
                                                        ? "chat.completion.chunk"
                                                        : "text_completion");
                    json_object_object_add(u, "choices", json_object_new_array());
                    json_object_object_add(u, "usage", usage_json(o));
                    append_sse(out, u);
                }
            }
            strbuf_puts(out, "data: [DONE]\n\n");
            *done = true;
        }
    }
    return true;
}

static void stream_release(void *ctx)
{
    generation_free(ctx);
}

/* Structured output is not implemented yet: a request for it is answered
 * with unconstrained text and a Warning header that says so, the way
 * servers degrade when a grammar cannot be applied. */
static const char *response_format_warning(const struct gen_request *req)
{
    json_object *type = NULL;
    if (!req->response_format ||
        !json_object_object_get_ex(req->response_format, "type", &type) ||
        !json_object_is_type(type, json_type_string) ||
        !strcmp(json_object_get_string(type), "text"))
        return NULL;
    return "299 inferd \"response_format is not enforced: the reply is unconstrained text\"";
}

static void handle_generation(struct http_exchange *x, enum gen_request_kind kind)
{
    struct gen_request req;
    memset(&req, 0, sizeof req);
    struct generation *g = start_generation(x, kind, &req);
    x->warning = response_format_warning(&req);
    bool stream = req.has_stream && req.stream;
    gen_request_free(&req);
    if (!g)
        return;
    if (!stream) {
        respond_json(x, g);
        generation_free(g);
        return;
    }
    if (g->split_reasoning) {
        struct reasoning_opts opts = {.starts_inside = g->starts_inside};
        struct err err = {0};
        if (reasoning_splitter_create(&opts, &g->splitter, &err) < 0) {
            generation_free(g);
            fail_request(x, 500, NULL, NULL, err.msg);
            return;
        }
    }
    http_send_stream(x, 200, "text/event-stream",
                     (struct http_stream){stream_produce, stream_release, g});
}

void openai_chat_completions(struct http_exchange *x)
{
    handle_generation(x, GEN_REQUEST_CHAT);
}

void openai_completions(struct http_exchange *x)
{
    handle_generation(x, GEN_REQUEST_COMPLETION);
}

static json_object *model_object(const struct server *srv)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(srv->model_id));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64(srv->created));
    json_object_object_add(m, "owned_by", json_object_new_string("inferd"));
    if (srv->engine)
        json_object_object_add(m, "context_window",
                               json_object_new_int(engine_config(srv->engine)->n_ctx));
    return m;
}

void openai_models(struct http_exchange *x, const char *id)
{
    struct server *srv = x->srv;
    if (id) {
        if (strcmp(id, srv->model_id)) {
            http_send_errorf(x, 404, "invalid_request_error", "model", "model_not_found",
                             "the model '%.200s' does not exist; this server serves '%s'", id,
                             srv->model_id);
            return;
        }
        send_json_object(x, 200, model_object(srv));
        return;
    }
    json_object *root = json_object_new_object();
    json_object_object_add(root, "object", json_object_new_string("list"));
    json_object *data = json_object_new_array();
    json_object_array_add(data, model_object(srv));
    json_object_object_add(root, "data", data);
    send_json_object(x, 200, root);
}
