/* api/generation.c — the API-neutral path of a generation request: admission, prompt and
 * parameters, submit, taking the engine's output (gen_output_drain) while watching the client,
 * and the reasoning split. */
#include "api/generation.h"

#include <stdlib.h>
#include <string.h>

#include "api/prompt.h"
#include "api/reencode.h"
#include "base/timer.h"
#include "text/reasoning.h"

/* How often a waiting reader looks whether its client is still there. */
#define WAIT_SLICE_MS 50

struct generation {
    struct server *srv;
    struct gen_output *out;               /* one reference */
    struct gen_cursor cur;                /* how far the output was taken */
    int client_fd;
    int logprobs;
    bool split_reasoning;                 /* the model thinks in <think>…</think> */
    bool starts_inside;                   /* the prompt ends inside an open <think> */
    struct reasoning_splitter *splitter;  /* owned; NULL when not splitting */
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
static int submit_error(struct server *srv, int rc, const struct gen_request *req,
                        const struct gen_params *p, const struct err *err, struct api_error *e)
{
    const char *prompt_param = req->kind == GEN_REQUEST_CHAT ? "messages" : "prompt";
    const struct engine_config *c = engine_config(srv->engine);
    if (rc == -INFERD_EBUSY) {
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

int generation_start(const struct http_exchange *x, const struct gen_request *req,
                     struct generation **out, struct api_error *e)
{
    struct server *srv = x->srv;
    *out = NULL;
    const char *session = NULL;
    if (!request_session(x, req, &session, e))
        return -INFERD_EINVAL;
    struct sampler_logit_bias *bias = calloc(req->n_logit_bias + 1, sizeof *bias);
    struct generation *g = calloc(1, sizeof *g);
    if (!bias || !g) {
        free(bias);
        free(g);
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
        return -INFERD_ENOMEM;
    }
    /* The parameters first: the prompt is encoded under their cache namespace. */
    struct gen_params p;
    memset(&p, 0, sizeof p);
    prompt_fill_params(srv, req, &p, bias);
    p.cache_ns = api_cache_namespace(x->tenant_ns, req->cache_salt,
                                     req->cache_salt ? strlen(req->cache_salt) : 0);
    p.session_id = session;
    struct prompt pr;
    if (!prompt_build(srv, req, p.cache_ns, &pr, e)) {
        free(bias);
        free(g);
        return -INFERD_EINVAL;
    }
    p.prompt = pr.ids;
    p.n_prompt = pr.n_ids;
    struct err err = {0};
    int rc = engine_submit(srv->engine, &p, &g->out, &err);
    bool starts_inside = pr.starts_inside_think;
    free(bias);
    if (rc < 0) {
        prompt_free(&pr);
        free(g);
        return submit_error(srv, rc, req, &p, &err, e);
    }
    if (srv->reencode && pr.text) {
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
    g->srv = srv;
    g->client_fd = x->client_fd;
    g->logprobs = p.logprobs;
    g->split_reasoning =
        req->kind == GEN_REQUEST_CHAT && (starts_inside || prompt_model_thinks(srv->tok));
    g->starts_inside = starts_inside;
    if (g->split_reasoning) {
        struct reasoning_opts opts = {.starts_inside = starts_inside};
        if ((rc = reasoning_splitter_create(&opts, &g->splitter, &err)) < 0) {
            generation_free(g);
            api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "%s", err.msg);
            return rc;
        }
    }
    *out = g;
    return 0;
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
    reencode_remember(g->srv->reencode, g->cache_ns, g->add_special, g->prompt_text,
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

int generation_next(struct generation *g, int timeout_ms, struct generation_news *news)
{
    memset(news, 0, sizeof *news);
    uint64_t until = timeout_ms >= 0 ? now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
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
        if (http_client_gone(g->client_fd)) {
            cancel(g);
            generation_news_free(news);
            return -INFERD_EIO;
        }
        if (news->out.text_len > 0 || news->out.n_tokens > 0)
            break;
        /* Only ids (their text held back): nothing to send; the finish reads them all again. */
        gen_news_free(&news->out);
        if (timeout_ms >= 0 && now_ns() >= until)
            return 0;
    }
    if (!g->splitter)
        return 0;
    struct err err = {0};
    struct reasoning_delta d = {0};
    if (news->out.text_len > 0) {
        /* The splitter fails only when memory runs out. */
        news->split = true;
        if (reasoning_splitter_push(g->splitter, news->out.text, news->out.text_len, &d, &err) <
                0 ||
            take_delta(&d, &news->text) < 0)
            goto nomem;
    }
    memset(&d, 0, sizeof d);
    if (news->out.finish != GEN_RUNNING && reasoning_splitter_flush(g->splitter, &d, &err) == 0 &&
        take_delta(&d, &news->tail) < 0)
        goto nomem;
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
    struct gen_news n;
    for (;;) {
        if (gen_output_drain(g->out, &g->cur, WAIT_SLICE_MS, &n) < 0)
            goto nomem;
        enum gen_finish finish = n.finish;
        gen_news_free(&n);
        if (finish != GEN_RUNNING) {
            g->finished = true;
            break;
        }
        if (http_client_gone(g->client_fd)) {
            cancel(g);
            return finish_error(&n, e);
        }
    }
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
    return 0;
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
    free(g->prompt_text);
    free(g->prompt_ids);
    free(g);
}
