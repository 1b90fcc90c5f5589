/* api/generation.c — the API-neutral path of a generation request: admission, prompt and
 * parameters, submit, taking the engine's output (gen_output_drain) while watching the client,
 * the reasoning split, and tool calls parsed out of the content. */
#include "api/generation.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api/engine_proxy.h"
#include "api/model_pool.h"
#include "api/prompt.h"
#include "api/reencode.h"
#include "base/strbuf.h"
#include "base/timer.h"
#include "text/reasoning.h"
#include "text/toolcall.h"

/* How often a waiting reader looks whether its client is still there. */
#define WAIT_SLICE_MS 50

struct generation {
    struct server *srv;
    struct served_model *sm;              /* the model it runs on; one reference when holds_model */
    bool holds_model;
    struct gen_output *out;               /* one reference */
    struct gen_cursor cur;                /* how far the output was taken */
    int client_fd;
    uint64_t client_checked_ns; /* when client_gone last asked the socket */
    uint64_t news_ns;           /* when generation_next last returned text or tokens; 0: never */
    int logprobs;
    bool split_reasoning;                 /* the model thinks in <think>…</think> */
    bool starts_inside;                   /* the prompt ends inside an open <think> */
    struct reasoning_splitter *splitter;  /* owned; NULL when not splitting */
    struct toolcall_parser *tools;        /* owned; NULL when the request's tools are off */
    bool finished;                        /* the finish was taken */
    /* What the prompt was, for the re-encoding map once the reply is finished. */
    char *prompt_text;                    /* owned; NULL: nothing to remember */
    size_t prompt_len;
    int32_t *prompt_ids;                  /* owned; n_prompt */
    int n_prompt;
    bool add_special;
    uint64_t cache_ns;
};

int generation_admit(const struct server *srv, struct api_error *e)
{
    if (atomic_load(&srv->stopping)) {
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "shutting_down",
                      "the server is shutting down");
        return -INFERD_EBUSY;
    }
    if (!atomic_load(&srv->ready)) {
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "model_loading",
                      "the model is still loading; try again");
        return -INFERD_EBUSY;
    }
    return 0;
}

/* The engine's refusal of a submit, as the client should see it. Every
 * "does not fit" is -INFERD_ERANGE; which limit it was follows from the
 * engine's configuration, in the order engine_submit checks them. */
static int submit_error(struct server *srv, const struct served_model *sm, int rc,
                        const struct gen_request *req, const struct gen_params *p,
                        const struct err *err, struct api_error *e)
{
    const char *prompt_param = req->kind == GEN_REQUEST_CHAT ? "messages" : "prompt";
    const struct engine_config *c = served_engine_config(sm);
    if (rc == -INFERD_ENOENT) { /* the adapter spec names no mounted adapter */
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "adapter", "adapter_not_found", "%s",
                      err->msg);
    } else if (rc == -INFERD_EBUSY) {
        api_error_set(e, 429, API_ERROR_RATE_LIMIT, NULL, "rate_limit_exceeded", "%s", err->msg);
    } else if (rc == -INFERD_ERANGE && c->budget_ctx > 0 && p->n_prompt >= c->budget_ctx) {
        atomic_fetch_add(&srv->admission_rejected, 1);
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, prompt_param, "context_over_budget",
                      "%s", err->msg);
    } else if (rc == -INFERD_ERANGE && p->n_prompt >= c->n_ctx) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, prompt_param,
                      "context_length_exceeded", "%s", err->msg);
    } else if (rc == -INFERD_ERANGE) {
        atomic_fetch_add(&srv->admission_rejected, 1);
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "max_tokens", "kv_budget_exceeded",
                      "%s", err->msg);
    } else if (rc == -INFERD_ENOMEM) {
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "%s", err->msg);
    } else if (rc == -INFERD_EIO) { /* --isolate: the engine child is restarting */
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "engine_unavailable", "%s", err->msg);
    } else {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, NULL, NULL, "%s", err->msg);
    }
    return rc;
}

/* The session a request names: the body's session_id or prompt_cache_key,
 * else the header x-session-affinity, else session_id. NULL when none; false
 * with e filled (400 naming the header) for an empty or oversize header. */
static bool request_session(const struct http_exchange *x, const struct gen_request *req,
                            const char **out, struct api_error *e)
{
    static const char *const headers[] = {"x-session-affinity", "session_id"};
    *out = req->session_id;
    for (size_t i = 0; i < sizeof headers / sizeof headers[0] && !*out; i++) {
        const char *v = http_header(x, headers[i]);
        if (!v)
            continue;
        size_t len = strlen(v);
        if (len == 0 || len > GEN_REQUEST_MAX_KEY_BYTES) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, headers[i], NULL,
                          "the %s header must be 1 to %d bytes, got %zu", headers[i],
                          GEN_REQUEST_MAX_KEY_BYTES, len);
            return false;
        }
        *out = v;
    }
    return true;
}

/* The thinking budget of a structured reply that thinks first, unless the request sets one. */
#define STRUCTURED_THINK_BUDGET 1024

/* req's constraint on its reply, compiled or found in the server's cache; *out NULL when it
 * asks for none. A construct the compiler refuses is a 400 naming it (its JSON path in the
 * message, the request field as param). */
static int request_grammar(const struct served_model *sm, const struct gen_request *req,
                           struct gen_grammar **out, struct structured_spec *source,
                           struct api_error *e)
{
    *out = NULL;
    memset(source, 0, sizeof *source);
    if (!prompt_structured(req))
        return 0;
    struct structured_spec tool;
    memset(&tool, 0, sizeof tool);
    const struct structured_spec *spec = &req->structured;
    struct err err = {0};
    int rc = 0;
    bool forced_call = req->structured.kind == STRUCTURED_NONE ||
                       (req->kind == GEN_REQUEST_CHAT && req->tools && req->has_tool_choice &&
                        (req->tool_choice == GEN_TOOL_CHOICE_REQUIRED ||
                         req->tool_choice == GEN_TOOL_CHOICE_FUNCTION));
    const char *param = forced_call ? "tool_choice" : spec->param;
    if (!sm->grammars) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, param, "structured_output_unavailable",
                      "%s asks for structured output, which this server runs without", param);
        return -INFERD_EUNSUPPORTED;
    }
    if (forced_call) {
        enum toolcall_syntax syntax =
            toolcall_syntax_for_template(sm->tok ? tok_chat_template(sm->tok) : NULL, NULL);
        rc = structured_tool_call_spec(toolcall_syntax_name(syntax), req->tools,
                                       req->tool_choice == GEN_TOOL_CHOICE_FUNCTION
                                           ? req->tool_choice_name
                                           : NULL,
                                       &tool, &err);
        spec = &tool;
    }
    if (rc == 0)
        rc = grammar_cache_get(sm->grammars, spec, out, &err);
    /* an engine in a child compiles its own from the source (compiled grammars stay in
     * their process); compiling here too answers a bad one with the same 400 */
    if (rc == 0 && sm->proxy) {
        *source = *spec;
        source->text = strndup(spec->text ? spec->text : "", spec->len);
        if (!source->text) {
            memset(source, 0, sizeof *source);
            gen_grammar_release(*out);
            *out = NULL;
            rc = err_set(&err, INFERD_ENOMEM, "out of memory for the grammar's source");
        }
    }
    structured_spec_free(&tool);
    if (rc == -INFERD_ENOMEM)
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "%s", err.msg);
    else if (rc < 0)
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, param,
                      rc == -INFERD_EUNSUPPORTED ? "unsupported_schema"
                      : rc == -INFERD_ERANGE     ? "grammar_too_large"
                                                 : "invalid_grammar",
                      "%s: %s", param, err.msg);
    return rc;
}

/* Whether req has tool calls parsed out of its reply. */
static bool tools_on(const struct gen_request *req)
{
    return req->kind == GEN_REQUEST_CHAT && req->tools &&
           json_object_array_length(req->tools) > 0 &&
           !(req->has_tool_choice && req->tool_choice == GEN_TOOL_CHOICE_NONE);
}

/* How the reply of a submitted request is read: the reasoning split and the
 * tool-call parser it needs. */
static int open_reading(struct generation *g, struct server *srv, struct served_model *sm,
                        const struct gen_request *req, bool starts_inside, struct api_error *e)
{
    struct err err = {0};
    int rc = 0;
    g->srv = srv;
    g->sm = sm;
    g->split_reasoning =
        req->kind == GEN_REQUEST_CHAT && (starts_inside || prompt_model_thinks(sm->tok));
    g->starts_inside = starts_inside;
    if (g->split_reasoning) {
        struct reasoning_opts opts = {.starts_inside = starts_inside};
        rc = reasoning_splitter_create(&opts, &g->splitter, &err);
    }
    if (rc == 0 && tools_on(req)) {
        enum toolcall_syntax syntax = toolcall_syntax_for_template(tok_chat_template(sm->tok), NULL);
        rc = toolcall_parser_create(syntax, req->tools, &g->tools, &err);
    }
    if (rc < 0)
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "%s", err.msg);
    return rc;
}

int generation_start(const struct http_exchange *x, struct served_model *sm,
                     const struct gen_request *req, struct generation **out, struct api_error *e)
{
    struct server *srv = x->srv;
    *out = NULL;
    const char *session = NULL;
    if (!request_session(x, req, &session, e)) {
        served_model_release(srv, sm);
        return -INFERD_EINVAL;
    }
    struct sampler_logit_bias *bias = calloc(req->n_logit_bias + 1, sizeof *bias);
    struct generation *g = calloc(1, sizeof *g);
    if (!bias || !g) {
        free(bias);
        free(g);
        served_model_release(srv, sm);
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return -INFERD_ENOMEM;
    }
    /* From here the generation holds the model: generation_free lets it go. */
    g->srv = srv;
    g->sm = sm;
    g->holds_model = true;
    /* The parameters first: the prompt is encoded under their cache namespace. */
    struct gen_params p;
    memset(&p, 0, sizeof p);
    prompt_fill_params(srv, sm, req, &p, bias);
    p.cache_ns = api_cache_namespace(x->tenant_ns, req->cache_salt,
                                     req->cache_salt ? strlen(req->cache_salt) : 0);
    p.session_id = session;
    struct gen_grammar *grammar = NULL;
    struct structured_spec grammar_source; /* for an engine in a child (request_grammar) */
    int rc = request_grammar(sm, req, &grammar, &grammar_source, e);
    if (rc < 0) {
        free(bias);
        generation_free(g);
        return rc;
    }
    struct prompt pr;
    if (!prompt_build(srv, sm, req, p.cache_ns, &pr, e)) {
        gen_grammar_release(grammar);
        structured_spec_free(&grammar_source);
        free(bias);
        generation_free(g);
        return -INFERD_EINVAL;
    }
    if (grammar) {
        p.grammar = grammar;
        p.jump_forward = !srv->no_jump_forward;
        /* Thinking asked for: the reply thinks first (within a budget), then the grammar. */
        if (req->kind == GEN_REQUEST_CHAT && prompt_thinking_asked(req) &&
            prompt_model_thinks(sm->tok)) {
            p.grammar_after_think = true;
            p.think_open = true;
            if (p.think_budget <= 0)
                p.think_budget = req->has_max_reasoning_tokens ? req->max_reasoning_tokens
                                                               : STRUCTURED_THINK_BUDGET;
        }
    }
    p.prompt = pr.ids;
    p.n_prompt = pr.n_ids;
    struct err err = {0};
    /* the adapters asked for are resolved where the engine runs */
    rc = served_engine_submit(sm, &p, req->adapter, grammar ? &grammar_source : NULL, &g->out,
                              &err);
    gen_grammar_release(grammar); /* the sequence holds its own reference */
    structured_spec_free(&grammar_source);
    bool starts_inside = pr.starts_inside_think;
    free(bias);
    if (rc < 0) {
        prompt_free(&pr);
        submit_error(srv, sm, rc, req, &p, &err, e);
        generation_free(g);
        return rc;
    }
    if (sm->reencode && pr.text) {
        /* Kept until the reply is finished, when the whole sequence is remembered. */
        g->prompt_text = pr.text;
        g->prompt_len = pr.text_len;
        g->prompt_ids = pr.ids;
        g->n_prompt = pr.n_ids;
        g->add_special = pr.add_special;
        g->cache_ns = p.cache_ns;
        pr.text = NULL;
        pr.ids = NULL;
    }
    prompt_free(&pr);
    g->client_fd = x->client_fd;
    g->logprobs = p.logprobs;
    if ((rc = open_reading(g, srv, sm, req, starts_inside, e)) < 0) {
        generation_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int generation_open_output(struct server *srv, const struct gen_request *req,
                           struct gen_output *out, bool starts_inside, struct generation **gout,
                           struct api_error *e)
{
    *gout = NULL;
    struct generation *g = calloc(1, sizeof *g);
    if (!g) {
        gen_output_release(out);
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return -INFERD_ENOMEM;
    }
    g->out = out;
    g->client_fd = -1;
    g->logprobs = -1;
    int rc = open_reading(g, srv, &srv->served, req, starts_inside, e);
    if (rc < 0) {
        generation_free(g);
        return rc;
    }
    *gout = g;
    return 0;
}

struct served_model *generation_model(const struct generation *g)
{
    return g->sm;
}

int generation_logprobs(const struct generation *g)
{
    return g->logprobs;
}

static char *copy_text(const char *s, size_t len)
{
    char *c = malloc(len + 1);
    if (c) {
        if (len)
            memcpy(c, s, len);
        c[len] = '\0';
    }
    return c;
}

/* Copies a splitter's delta (valid only until its next call) into t. */
static int take_delta(const struct reasoning_delta *d, struct generation_text *t)
{
    t->reasoning = copy_text(d->reasoning, d->reasoning_len);
    t->content = copy_text(d->content, d->content_len);
    if (!t->reasoning || !t->content)
        return -INFERD_ENOMEM;
    t->reasoning_len = d->reasoning_len;
    t->content_len = d->content_len;
    return 0;
}

/* A fresh call id: "call_" and 24 random alphanumerics. */
static char *call_id(void)
{
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t t = now_ns();
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (unsigned char)((t >> (i % 8 * 8)) ^ (i * 37));
    }
    char *id = malloc(5 + sizeof r + 1);
    if (!id)
        return NULL;
    memcpy(id, "call_", 5);
    for (size_t i = 0; i < sizeof r; i++)
        id[5 + i] = alnum[r[i] % (sizeof alnum - 1)];
    id[5 + sizeof r] = '\0';
    return id;
}

static struct generation_tool_delta *add_tool_delta(struct generation_news *news, int index,
                                                    size_t content_offset)
{
    struct generation_tool_delta *grown =
        realloc(news->tools, (news->n_tools + 1) * sizeof *grown);
    if (!grown)
        return NULL;
    news->tools = grown;
    struct generation_tool_delta *d = &grown[news->n_tools++];
    memset(d, 0, sizeof *d);
    d->index = index;
    d->content_offset = content_offset;
    return d;
}

/* The parser's events: text into content, calls into news->tools (one delta
 * per call start with its id and name, argument bytes joined onto the delta
 * of their call). base: content bytes of this news before these. */
static int take_tool_events(const struct toolcall_events *ev, struct strbuf *content, size_t base,
                            struct generation_news *news)
{
    for (size_t i = 0; i < ev->n; i++) {
        const struct toolcall_event *e = &ev->events[i];
        struct generation_tool_delta *d = news->n_tools ? &news->tools[news->n_tools - 1] : NULL;
        if (e->kind == TOOLCALL_TEXT) {
            strbuf_append(content, e->text, e->len);
        } else if (e->kind == TOOLCALL_CALL_START) {
            if (!(d = add_tool_delta(news, e->index, base + content->len)) ||
                !(d->id = call_id()) || !(d->name = strdup(e->text)) ||
                !(d->arguments = strdup("")))
                return -INFERD_ENOMEM;
        } else if (e->kind == TOOLCALL_ARGUMENTS) {
            if (!d || d->index != e->index) {
                if (!(d = add_tool_delta(news, e->index, base + content->len)) ||
                    !(d->arguments = strdup("")))
                    return -INFERD_ENOMEM;
            }
            size_t have = strlen(d->arguments);
            char *grown = realloc(d->arguments, have + e->len + 1);
            if (!grown)
                return -INFERD_ENOMEM;
            memcpy(grown + have, e->text, e->len);
            grown[have + e->len] = '\0';
            d->arguments = grown;
        }
    }
    return content->failed ? -INFERD_ENOMEM : 0;
}

/* Runs *content through the tool-call parser (then finishes it when last):
 * *content becomes the text outside calls, the calls go to news->tools. */
static int parse_tools(struct generation *g, char **content, size_t *len, size_t base, bool last,
                       struct generation_news *news)
{
    struct strbuf text = {0};
    struct toolcall_events ev;
    struct err err = {0};
    int rc = 0;
    if (*len > 0 && (rc = toolcall_parser_push(g->tools, *content, *len, &ev, &err)) == 0)
        rc = take_tool_events(&ev, &text, base, news);
    if (rc == 0 && last && (rc = toolcall_parser_finish(g->tools, &ev, &err)) == 0)
        rc = take_tool_events(&ev, &text, base, news);
    if (rc == 0 && !strbuf_putc(&text, '\0'))
        rc = -INFERD_ENOMEM;
    if (rc < 0) {
        strbuf_free(&text);
        return -INFERD_ENOMEM;
    }
    free(*content);
    *len = text.len - 1;
    *content = strbuf_take(&text, NULL);
    return *content ? 0 : -INFERD_ENOMEM;
}

/* A reply that is not split for reasoning still goes through text when tools
 * are on: reasoning "" and content out.text. */
static int take_unsplit(const char *s, size_t len, struct generation_text *t)
{
    struct reasoning_delta d = {.reasoning = "", .content = s ? s : "", .content_len = len};
    return take_delta(&d, t);
}

static void cancel(struct generation *g)
{
    atomic_store(&g->out->cancel, true);
}

/* Hands a reply that finished normally (whole: text and ids from the start) to the re-encoding
 * map, once, so the next prompt that resends it gets its ids back. Best effort: a failure only
 * costs that re-encoding. */
static void remember_reply(struct generation *g, const struct gen_news *whole)
{
    if (!g->prompt_text || (whole->finish != GEN_FINISH_STOP && whole->finish != GEN_FINISH_LENGTH))
        return;
    struct err err = {0};
    reencode_remember(g->sm->reencode, g->cache_ns, g->add_special, g->prompt_text,
                      g->prompt_len, g->prompt_ids, g->n_prompt, whole->text ? whole->text : "",
                      whole->text_len, whole->ids, (int)whole->n_ids, &err);
    free(g->prompt_text);
    free(g->prompt_ids);
    g->prompt_text = NULL;
    g->prompt_ids = NULL;
}

/* remember_reply for a reader that took the output in pieces. */
static void remember_streamed(struct generation *g)
{
    if (!g->prompt_text)
        return;
    struct gen_cursor from_start = {0};
    struct gen_news whole;
    if (gen_output_drain(g->out, &from_start, 0, &whole) == 0) {
        remember_reply(g, &whole);
        gen_news_free(&whole);
    }
}

/* Whether the client hung up, asking its socket at most once a wait slice: a stream's tokens
 * come every few milliseconds, and a poll a token was a system call each (a microsecond on a
 * virtual machine) for an answer that a slice later is as good. A stream whose client left is
 * also ended by the HTTP layer when its next write fails. */
static bool client_gone(struct generation *g)
{
    uint64_t now = now_ns();
    if (now - g->client_checked_ns < (uint64_t)WAIT_SLICE_MS * 1000000ull)
        return false;
    g->client_checked_ns = now;
    return http_client_gone(g->client_fd);
}

int generation_next(struct generation *g, int timeout_ms, struct generation_news *news)
{
    memset(news, 0, sizeof *news);
    uint64_t until = timeout_ms >= 0 ? now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
    /* --stream-interval: after the first news, the tokens of a window come together (the
     * finish at once) */
    int interval_ms = g->srv ? g->srv->cfg.stream_interval_ms : 0;
    if (interval_ms > 0 && g->news_ns) {
        uint64_t window = g->news_ns + (uint64_t)interval_ms * 1000000ull;
        if (window > now_ns())
            gen_output_hold(g->out, window);
    }
    for (;;) {
        int slice = WAIT_SLICE_MS;
        if (timeout_ms >= 0) {
            uint64_t now = now_ns();
            uint64_t left_ms = now < until ? (until - now + 999999) / 1000000 : 0;
            if (left_ms < (uint64_t)slice)
                slice = (int)left_ms;
        }
        int rc = gen_output_drain(g->out, &g->cur, slice, &news->out);
        if (rc < 0)
            return rc;
        if (news->out.finish != GEN_RUNNING) {
            g->finished = true;
            remember_streamed(g);
            break;
        }
        if (client_gone(g)) {
            cancel(g);
            generation_news_free(news);
            return -INFERD_EIO;
        }
        if (news->out.text_len > 0 || news->out.n_tokens > 0) {
            g->news_ns = now_ns();
            break;
        }
        /* Only ids (their text held back): nothing to send; the finish reads them all again. */
        gen_news_free(&news->out);
        if (timeout_ms >= 0 && now_ns() >= until)
            return 0;
    }
    if (!g->splitter && !g->tools)
        return 0;
    struct err err = {0};
    struct reasoning_delta d = {0};
    bool finished = news->out.finish != GEN_RUNNING;
    if (!g->splitter) {
        news->split = true;
        if (take_unsplit(news->out.text, news->out.text_len, &news->text) < 0 ||
            take_unsplit("", 0, &news->tail) < 0)
            goto nomem;
    } else {
        if (news->out.text_len > 0) {
            /* The splitter fails only when memory runs out. */
            news->split = true;
            if (reasoning_splitter_push(g->splitter, news->out.text, news->out.text_len, &d,
                                        &err) < 0 ||
                take_delta(&d, &news->text) < 0)
                goto nomem;
        }
        memset(&d, 0, sizeof d);
        if (finished && reasoning_splitter_flush(g->splitter, &d, &err) == 0 &&
            take_delta(&d, &news->tail) < 0)
            goto nomem;
    }
    if (g->tools) {
        news->split = true;
        if ((!news->text.content && take_unsplit("", 0, &news->text) < 0) ||
            (finished && !news->tail.content && take_unsplit("", 0, &news->tail) < 0))
            goto nomem;
        if (parse_tools(g, &news->text.content, &news->text.content_len, 0, false, news) < 0 ||
            (finished && parse_tools(g, &news->tail.content, &news->tail.content_len,
                                     news->text.content_len, true, news) < 0))
            goto nomem;
        news->tool_calls = finished && toolcall_parser_calls(g->tools) > 0;
    }
    return 0;
nomem:
    generation_news_free(news);
    return -INFERD_ENOMEM;
}

/* The error for a generation that did not finish normally. */
static int finish_error(const struct gen_news *n, struct api_error *e)
{
    if (n->finish == GEN_FINISH_ERROR) {
        /* Memory (e.g. on the GPU) running out is the server's state, not a fault. */
        if (n->error_code == INFERD_ENOMEM)
            api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "%s", n->error);
        /* --isolate: the engine child crashed or hung and is being restarted. */
        else if (n->error_code == INFERD_EBUSY)
            api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "engine_unavailable", "%s",
                          n->error);
        else
            api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "%s", n->error);
    } else {
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "cancelled",
                      "the request was cancelled");
    }
    return -INFERD_EIO;
}

int generation_collect(struct generation *g, struct generation_news *all, struct api_error *e)
{
    memset(all, 0, sizeof *all);
    /* Woken by the finish alone: the text before it is read once, from the start, below. */
    while (!gen_output_hold(g->out, now_ns() + (uint64_t)WAIT_SLICE_MS * 1000000ull)) {
        if (client_gone(g)) {
            cancel(g);
            const struct gen_news unfinished = {.finish = GEN_RUNNING};
            return finish_error(&unfinished, e);
        }
    }
    g->finished = true;
    /* Finished: the engine no longer writes, so one drain from the start takes it all. */
    struct gen_cursor whole = {0};
    if (gen_output_drain(g->out, &whole, 0, &all->out) < 0)
        goto nomem;
    if (all->out.finish != GEN_FINISH_STOP && all->out.finish != GEN_FINISH_LENGTH) {
        int rc = finish_error(&all->out, e);
        generation_news_free(all);
        return rc;
    }
    remember_reply(g, &all->out);
    struct err err = {0};
    struct generation_text *t = &all->text;
    if (g->split_reasoning &&
        reasoning_split_all(all->out.text ? all->out.text : "", all->out.text_len,
                            g->starts_inside, &t->reasoning, &t->reasoning_len, &t->content,
                            &t->content_len, &err) == 0)
        all->split = true;
    if (g->tools) {
        if (!all->split && take_unsplit(all->out.text, all->out.text_len, t) < 0)
            goto nomem_all;
        all->split = true;
        if (parse_tools(g, &t->content, &t->content_len, 0, true, all) < 0)
            goto nomem_all;
        all->tool_calls = all->n_tools > 0;
    }
    return 0;
nomem_all:
    generation_news_free(all);
nomem:
    api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the reply");
    return -INFERD_ENOMEM;
}

void generation_news_free(struct generation_news *news)
{
    gen_news_free(&news->out);
    free(news->text.reasoning);
    free(news->text.content);
    free(news->tail.reasoning);
    free(news->tail.content);
    for (size_t i = 0; i < news->n_tools; i++) {
        free(news->tools[i].id);
        free(news->tools[i].name);
        free(news->tools[i].arguments);
    }
    free(news->tools);
    memset(news, 0, sizeof *news);
}

void generation_free(struct generation *g)
{
    if (!g)
        return;
    if (g->out) {
        if (!g->finished)
            cancel(g);
        gen_output_release(g->out);
    }
    reasoning_splitter_free(g->splitter);
    toolcall_parser_free(g->tools);
    free(g->prompt_text);
    free(g->prompt_ids);
    if (g->holds_model)
        served_model_release(g->srv, g->sm);
    free(g);
}

void generation_random_id(char *out, size_t cap, const char *prefix)
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
