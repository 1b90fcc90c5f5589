/* engine/gen_output.c — the shared record through which the engine thread hands a request's
 * text and tokens to the thread that answers it: one lock and one wake-up per step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/strbuf.h"
#include "engine/sequence.h"

struct gen_output *gen_output_create(int n_prompt)
{
    struct gen_output *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&o->mu, NULL) != 0 || pthread_cond_init(&o->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        free(o);
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    o->n_prompt = n_prompt;
    o->refs = 2;
    atomic_init(&o->cancel, false);
    return o;
}

void gen_pending_free(struct gen_pending *p)
{
    strbuf_free(&p->text);
    strbuf_free(&p->tokens);
    strbuf_free(&p->ids);
    p->n_generated = 0;
    memset(&p->spec, 0, sizeof p->spec);
}

bool gen_output_publish(struct gen_output *o, struct gen_pending *p)
{
    if (p->text.len == 0 && p->tokens.len == 0 && p->ids.len == 0 && p->n_generated == 0 &&
        p->spec.target_calls == 0 && p->finish == GEN_RUNNING && !p->text.failed && !p->tokens.failed && !p->ids.failed)
        return true;
    bool ok = !p->text.failed && !p->tokens.failed && !p->ids.failed;
    struct gen_token *tokens = (struct gen_token *)p->tokens.data;
    size_t n_tokens = p->tokens.len / sizeof *tokens;
    pthread_mutex_lock(&o->mu);
    size_t base = o->text.len;
    if (p->text.len > 0)
        ok = strbuf_append(&o->text, p->text.data, p->text.len) && ok;
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i].text_end += base;
    if (n_tokens > 0) {
        if (strbuf_append(&o->tokens, p->tokens.data, p->tokens.len))
            o->n_tokens += n_tokens;
        else
            ok = false;
    }
    if (p->ids.len > 0) {
        if (strbuf_append(&o->ids, p->ids.data, p->ids.len))
            o->n_ids += p->ids.len / sizeof(int32_t);
        else
            ok = false;
    }
    const bool wake = !o->held || p->finish != GEN_RUNNING;
    o->n_generated += p->n_generated;
    o->spec.drafted += p->spec.drafted;
    o->spec.accepted += p->spec.accepted;
    o->spec.target_calls += p->spec.target_calls;
    o->spec.shared = o->spec.shared || p->spec.shared;
    o->spec.on = o->spec.on || p->spec.on;
    if (p->finish != GEN_RUNNING && o->finish == GEN_RUNNING) {
        o->finish = p->finish;
        o->error_code = p->error_code;
        o->stop_string = p->stop_string;
        memcpy(o->error, p->error, sizeof o->error);
    }
    pthread_mutex_unlock(&o->mu);
    /* After the unlock (the caller's reference keeps o alive): a woken reader
     * finds the lock free instead of sleeping on it again. A held reader is
     * left asleep: it drains what came when its hold ends. */
    if (wake)
        pthread_cond_broadcast(&o->cv);
    gen_pending_free(p);
    return ok;
}

void gen_output_wait(struct gen_output *o, size_t text_len, size_t n_tokens, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (o->finish == GEN_RUNNING && o->text.len <= text_len && o->n_tokens <= n_tokens) {
        if (pthread_cond_timedwait(&o->cv, &o->mu, &until) == ETIMEDOUT)
            break;
    }
}

bool gen_output_hold(struct gen_output *o, uint64_t until_ns)
{
    struct timespec until = {.tv_sec = (time_t)(until_ns / 1000000000ull),
                             .tv_nsec = (long)(until_ns % 1000000000ull)};
    pthread_mutex_lock(&o->mu);
    o->held = true;
    while (o->finish == GEN_RUNNING) {
        if (pthread_cond_timedwait(&o->cv, &o->mu, &until) == ETIMEDOUT)
            break;
    }
    o->held = false;
    bool finished = o->finish != GEN_RUNNING;
    pthread_mutex_unlock(&o->mu);
    return finished;
}

int gen_output_drain(struct gen_output *o, struct gen_cursor *cur, int timeout_ms,
                     struct gen_news *news)
{
    memset(news, 0, sizeof *news);
    pthread_mutex_lock(&o->mu);
    if (timeout_ms > 0)
        gen_output_wait(o, cur->text, cur->tokens, timeout_ms);
    size_t text_len = o->text.len > cur->text ? o->text.len - cur->text : 0;
    size_t n_tokens = o->n_tokens > cur->tokens ? o->n_tokens - cur->tokens : 0;
    size_t n_ids = o->n_ids > cur->ids ? o->n_ids - cur->ids : 0;
    /* Copied under the lock: the engine may grow (move) the buffers. */
    char *text = text_len ? malloc(text_len + 1) : NULL;
    struct gen_token *tokens = n_tokens ? malloc(n_tokens * sizeof *tokens) : NULL;
    int32_t *ids = n_ids ? malloc(n_ids * sizeof *ids) : NULL;
    if ((text_len && !text) || (n_tokens && !tokens) || (n_ids && !ids)) {
        pthread_mutex_unlock(&o->mu);
        free(text);
        free(tokens);
        free(ids);
        return -INFERD_ENOMEM;
    }
    if (text) {
        memcpy(text, o->text.data + cur->text, text_len);
        text[text_len] = '\0';
    }
    if (tokens)
        memcpy(tokens, gen_output_tokens(o) + cur->tokens, n_tokens * sizeof *tokens);
    if (ids)
        memcpy(ids, o->ids.data + cur->ids * sizeof *ids, n_ids * sizeof *ids);
    news->text = text;
    news->text_len = text_len;
    news->text_from = cur->text;
    news->tokens = tokens;
    news->n_tokens = n_tokens;
    news->ids = ids;
    news->n_ids = n_ids;
    news->finish = o->finish;
    news->n_prompt = o->n_prompt;
    news->n_cached = o->n_cached;
    news->n_generated = o->n_generated;
    news->t_admit_ns = o->t_admit_ns;
    news->error_code = o->error_code;
    news->stop_string = o->stop_string;
    news->spec = o->spec;
    memcpy(news->error, o->error, sizeof news->error);
    pthread_mutex_unlock(&o->mu);
    cur->text += text_len;
    cur->tokens += n_tokens;
    cur->ids += n_ids;
    return 0;
}

void gen_news_free(struct gen_news *news)
{
    free(news->text);
    free(news->tokens);
    free(news->ids);
    news->text = NULL;
    news->tokens = NULL;
    news->ids = NULL;
}

void gen_output_release(struct gen_output *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    int left = --o->refs;
    pthread_mutex_unlock(&o->mu);
    if (left > 0)
        return;
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o->embedding);
    strbuf_free(&o->text);
    strbuf_free(&o->tokens);
    strbuf_free(&o->ids);
    free(o);
}
