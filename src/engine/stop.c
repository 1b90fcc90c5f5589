/* engine/stop.c — stop-string matching with one KMP automaton per stop; only the held-back tail is kept. */
#include "engine/stop.h"

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
    char *hold;   /* owned; hold_cap bytes: text not emitted yet */
    size_t hold_len, hold_cap;
    char *out;    /* owned; out_cap bytes: what the last call emitted */
    size_t out_cap;
};

static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07;
        } else {
            return false;
        }
        if (i + k >= n)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

/* Start of the suffix to hold back so that [0, cut) ends on a code-point
 * boundary and no incomplete trailing sequence is emitted. */
static size_t utf8_boundary_before(const unsigned char *s, size_t n, size_t cut)
{
    /* An incomplete sequence at the very end is held back whole. */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back && n - back < cut)
            cut = n - back;
        break;
    }
    for (int steps = 0; steps < 3 && cut > 0 && cut < n && (s[cut] & 0xC0) == 0x80; steps++)
        cut--;
    return cut;
}

void stop_matcher_free(struct stop_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++) {
        free(m->stops[i].bytes);
        free(m->stops[i].fail);
    }
    free(m->hold);
    free(m->out);
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
    m->hold_cap = STOP_MAX_LEN + 8;
    m->hold = malloc(m->hold_cap);
    if (!m->hold) {
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

static int out_reserve(struct stop_matcher *m, size_t need, struct err *err)
{
    if (need <= m->out_cap)
        return 0;
    size_t cap = m->out_cap ? m->out_cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = realloc(m->out, cap);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "stop matcher: out of memory");
    m->out = p;
    m->out_cap = cap;
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
    size_t work_len = m->hold_len + len;
    if (out_reserve(m, work_len + 1, err) < 0)
        return -INFERD_ENOMEM;
    char *w = m->out;
    memcpy(w, m->hold, m->hold_len);
    if (len)
        memcpy(w + m->hold_len, text, len);

    for (size_t pos = m->hold_len; pos < work_len; pos++) {
        int best = -1;
        for (int i = 0; i < m->n; i++)
            if (stop_step(&m->stops[i], w[pos]) &&
                (best < 0 || m->stops[i].len > m->stops[best].len))
                best = i;
        if (best >= 0) {
            m->which = best;
            m->hold_len = 0;
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
    size_t cut = utf8_boundary_before((const unsigned char *)w, work_len, work_len - (size_t)keep);
    m->hold_len = work_len - cut;
    memcpy(m->hold, w + cut, m->hold_len);
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
    if (m->which >= 0 || m->hold_len == 0)
        return 0;
    if (out_reserve(m, m->hold_len, err) < 0)
        return -INFERD_ENOMEM;
    memcpy(m->out, m->hold, m->hold_len);
    *emit = m->out;
    *emit_len = m->hold_len;
    m->hold_len = 0;
    for (int i = 0; i < m->n; i++)
        m->stops[i].state = 0;
    return 0;
}

int stop_matcher_which(const struct stop_matcher *m)
{
    return m ? m->which : -1;
}
