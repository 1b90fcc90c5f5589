/* engine/stop.c — stop-string matching with one KMP automaton per stop; only the held-back tail is kept. */
#include "engine/stop.h"

#include "base/strbuf.h"
#include "base/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct stop_string {
    char *bytes;  /* owned; len bytes */
    int len;
    int *fail;    /* owned; len entries: KMP failure function */
    int state;    /* bytes of this stop matched by the stream's current suffix */
};

struct stop_matcher {
    struct stop_string stops[STOP_MAX_STRINGS];
    int n;
    int which;    /* matched stop, -1 while generating */
    struct strbuf hold; /* owned; text not emitted yet: at most a stop prefix and a partial code point */
    struct strbuf out;  /* owned; the held text plus the new, of which the last call emitted a prefix */
};

void stop_matcher_free(struct stop_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++) {
        free(m->stops[i].bytes);
        free(m->stops[i].fail);
    }
    strbuf_free(&m->hold);
    strbuf_free(&m->out);
    free(m);
}

int stop_matcher_create(const char *const *stops, int n, struct stop_matcher **out,
                        struct err *err)
{
    if (!out)
        return err_set(err, INFERD_EINVAL, "stop_matcher_create: out is NULL");
    *out = NULL;
    if (n < 0 || n > STOP_MAX_STRINGS)
        return err_set(err, INFERD_ERANGE, "at most %d stop strings, got %d", STOP_MAX_STRINGS, n);
    if (n > 0 && !stops)
        return err_set(err, INFERD_EINVAL, "stop strings missing");
    for (int i = 0; i < n; i++) {
        if (!stops[i])
            return err_set(err, INFERD_EINVAL, "stop string %d is NULL", i);
        size_t len = strlen(stops[i]);
        if (len == 0 || len > STOP_MAX_LEN)
            return err_set(err, INFERD_ERANGE, "stop string %d must be 1..%d bytes, got %zu", i,
                           STOP_MAX_LEN, len);
        if (!utf8_valid((const unsigned char *)stops[i], len))
            return err_set(err, INFERD_EINVAL, "stop string %d is not valid UTF-8", i);
    }
    struct stop_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(err, INFERD_ENOMEM, "stop matcher: out of memory");
    m->which = -1;
    /* The longest held tail: a stop prefix plus up to 3 bytes to reach a code-point start. */
    if (!strbuf_reserve(&m->hold, STOP_MAX_LEN + 8)) {
        free(m);
        return err_set(err, INFERD_ENOMEM, "stop matcher: out of memory");
    }
    for (int i = 0; i < n; i++) {
        struct stop_string *s = &m->stops[i];
        s->len = (int)strlen(stops[i]);
        s->bytes = malloc((size_t)s->len);
        s->fail = malloc((size_t)s->len * sizeof *s->fail);
        m->n = i + 1;
        if (!s->bytes || !s->fail) {
            stop_matcher_free(m);
            return err_set(err, INFERD_ENOMEM, "stop matcher: out of memory");
        }
        memcpy(s->bytes, stops[i], (size_t)s->len);
        s->fail[0] = 0;
        for (int q = 1, k = 0; q < s->len; q++) {
            while (k > 0 && s->bytes[q] != s->bytes[k])
                k = s->fail[k - 1];
            if (s->bytes[q] == s->bytes[k])
                k++;
            s->fail[q] = k;
        }
    }
    *out = m;
    return 0;
}

/* Advances stop i's automaton by one byte; true when the stop completes. */
static bool stop_step(struct stop_string *s, char c)
{
    int q = s->state;
    if (q == s->len)
        q = s->fail[q - 1];
    while (q > 0 && s->bytes[q] != c)
        q = s->fail[q - 1];
    if (s->bytes[q] == c)
        q++;
    s->state = q;
    return q == s->len;
}

int stop_matcher_push(struct stop_matcher *m, const char *text, size_t len, const char **emit,
                      size_t *emit_len, bool *stopped, struct err *err)
{
    if (!m || !emit || !emit_len || !stopped || (len > 0 && !text))
        return err_set(err, INFERD_EINVAL, "stop_matcher_push: NULL argument");
    *emit = "";
    *emit_len = 0;
    *stopped = m->which >= 0;
    if (*stopped)
        return 0;
    strbuf_reset(&m->out);
    if (!strbuf_append(&m->out, m->hold.data, m->hold.len) || !strbuf_append(&m->out, text, len))
        return err_set(err, INFERD_ENOMEM, "stop matcher: out of memory");
    char *w = m->out.data;
    size_t work_len = m->out.len;

    for (size_t pos = m->hold.len; pos < work_len; pos++) {
        int best = -1;
        for (int i = 0; i < m->n; i++)
            if (stop_step(&m->stops[i], w[pos]) &&
                (best < 0 || m->stops[i].len > m->stops[best].len))
                best = i;
        if (best >= 0) {
            m->which = best;
            strbuf_reset(&m->hold);
            *emit = w;
            *emit_len = pos + 1 - (size_t)m->stops[best].len;
            *stopped = true;
            return 0;
        }
    }

    int keep = 0;
    for (int i = 0; i < m->n; i++)
        if (m->stops[i].state > keep)
            keep = m->stops[i].state;
    size_t cut = utf8_safe_cut((const unsigned char *)w, work_len, work_len - (size_t)keep);
    strbuf_reset(&m->hold);
    strbuf_append(&m->hold, w + cut, work_len - cut); /* fits: reserved at creation */
    *emit = w;
    *emit_len = cut;
    return 0;
}

int stop_matcher_flush(struct stop_matcher *m, const char **emit, size_t *emit_len,
                       struct err *err)
{
    if (!m || !emit || !emit_len)
        return err_set(err, INFERD_EINVAL, "stop_matcher_flush: NULL argument");
    *emit = "";
    *emit_len = 0;
    if (m->which >= 0 || m->hold.len == 0)
        return 0;
    strbuf_reset(&m->out);
    if (!strbuf_append(&m->out, m->hold.data, m->hold.len))
        return err_set(err, INFERD_ENOMEM, "stop matcher: out of memory");
    *emit = m->out.data;
    *emit_len = m->out.len;
    strbuf_reset(&m->hold);
    for (int i = 0; i < m->n; i++)
        m->stops[i].state = 0;
    return 0;
}

int stop_matcher_which(const struct stop_matcher *m)
{
    return m ? m->which : -1;
}
