/* engine/gen_output.c — the shared record through which the engine thread hands a request's
 * text and tokens to the thread that answers it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static bool grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(*buf, n * elem);
    if (!p)
        return false;
    *buf = p;
    *cap = n;
    return true;
}

bool gen_output_publish(struct gen_output *o, const char *text, size_t len, bool new_token,
                        const struct gen_token *token)
{
    bool ok = true;
    pthread_mutex_lock(&o->mu);
    if (len > 0) {
        if (grow((void **)&o->text, &o->text_cap, o->text_len + len + 1, 1)) {
            memcpy(o->text + o->text_len, text, len);
            o->text_len += len;
            o->text[o->text_len] = '\0';
        } else {
            ok = false;
        }
    }
    if (new_token)
        o->n_generated++;
    if (token) {
        if (grow((void **)&o->tokens, &o->tokens_cap, o->n_tokens + 1, sizeof *o->tokens)) {
            o->tokens[o->n_tokens] = *token;
            o->tokens[o->n_tokens].text_end = o->text_len;
            o->n_tokens++;
        } else {
            ok = false;
        }
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return ok;
}

void gen_output_finish(struct gen_output *o, enum gen_finish why, int error_code,
                       const char *error)
{
    pthread_mutex_lock(&o->mu);
    if (o->finish == GEN_RUNNING) {
        o->finish = why;
        o->error_code = error_code;
        if (error)
            snprintf(o->error, sizeof o->error, "%s", error);
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
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
    while (o->finish == GEN_RUNNING && o->text_len <= text_len && o->n_tokens <= n_tokens) {
        if (pthread_cond_timedwait(&o->cv, &o->mu, &until) == ETIMEDOUT)
            break;
    }
}

int gen_output_drain(struct gen_output *o, struct gen_cursor *cur, int timeout_ms,
                     struct gen_news *news)
{
    memset(news, 0, sizeof *news);
    pthread_mutex_lock(&o->mu);
    if (timeout_ms > 0)
        gen_output_wait(o, cur->text, cur->tokens, timeout_ms);
    size_t text_len = o->text_len > cur->text ? o->text_len - cur->text : 0;
    size_t n_tokens = o->n_tokens > cur->tokens ? o->n_tokens - cur->tokens : 0;
    /* Copied under the lock: the engine may grow (move) the buffers. */
    char *text = text_len ? malloc(text_len + 1) : NULL;
    struct gen_token *tokens = n_tokens ? malloc(n_tokens * sizeof *tokens) : NULL;
    if ((text_len && !text) || (n_tokens && !tokens)) {
        pthread_mutex_unlock(&o->mu);
        free(text);
        free(tokens);
        return -INFERD_ENOMEM;
    }
    if (text) {
        memcpy(text, o->text + cur->text, text_len);
        text[text_len] = '\0';
    }
    if (tokens)
        memcpy(tokens, o->tokens + cur->tokens, n_tokens * sizeof *tokens);
    news->text = text;
    news->text_len = text_len;
    news->text_from = cur->text;
    news->tokens = tokens;
    news->n_tokens = n_tokens;
    news->finish = o->finish;
    news->n_prompt = o->n_prompt;
    news->n_cached = o->n_cached;
    news->n_generated = o->n_generated;
    news->error_code = o->error_code;
    memcpy(news->error, o->error, sizeof news->error);
    pthread_mutex_unlock(&o->mu);
    cur->text += text_len;
    cur->tokens += n_tokens;
    return 0;
}

void gen_news_free(struct gen_news *news)
{
    free(news->text);
    free(news->tokens);
    news->text = NULL;
    news->tokens = NULL;
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
    free(o->text);
    free(o->tokens);
    free(o);
}
