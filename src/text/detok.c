/* text/detok.c — streaming detokenizer: emits only text that is complete UTF-8 and agrees with decoding the whole sequence. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/tok_internal.h"

/* The window holds context ids whose text was already emitted plus the ids
 * not yet (fully) emitted. Decoding the window and dropping what was already
 * sent gives the new text, so decoders that look at neighbours (Metaspace's
 * first-token rule, Strip after Fuse, byte runs) see the same context as a
 * full decode would. */
struct detok {
    const struct tokenizer *tok;
    bool skip_special;
    struct idlist window; /* owned */
    size_t n_context;     /* leading ids of window that are context only */
    bool byte_runs;       /* the decoder joins <0xNN> runs */
    struct strbuf sent;   /* owned; decode(window) text already emitted */
    struct strbuf out;    /* owned; returned to the caller */
};

int detok_create(const struct tokenizer *tok, bool skip_special, struct detok **out,
                 struct err *err)
{
    *out = NULL;
    struct detok *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(err, INFERD_ENOMEM, "detok: out of memory");
    d->tok = tok;
    d->skip_special = skip_special;
    d->byte_runs = tok_decoder_joins_byte_runs(tok);
    if (tok_put(&d->sent, "", 0, err) || tok_put(&d->out, "", 0, err)) {
        detok_free(d);
        return -INFERD_ENOMEM;
    }
    *out = d;
    return 0;
}

void detok_free(struct detok *d)
{
    if (!d)
        return;
    free(d->window.v);
    strbuf_free(&d->sent);
    strbuf_free(&d->out);
    free(d);
}

/* Length of s without trailing U+FFFD: those may be a character still being completed. */
static size_t stable_len(const char *s, size_t n)
{
    while (n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3))
        n -= 3;
    return n;
}

static int step(struct detok *d, bool final, const char **text, size_t *len, struct err *err)
{
    char *full = NULL;
    size_t flen = 0;
    strbuf_reset(&d->out);
    *text = d->out.data;
    *len = 0;
    /* A trailing run of byte tokens may still turn valid text into U+FFFDs
     * (ByteFallback judges a run as a whole), so it waits for the run to end. */
    size_t k = d->window.n;
    if (!final && d->byte_runs)
        while (k > d->n_context && tok_id_is_byte_token(d->tok, d->window.v[k - 1]))
            k--;
    int rc = tok_decode(d->tok, d->window.v, (int)k, d->skip_special, &full, &flen, err);
    if (rc)
        return rc;
    size_t end = final ? flen : stable_len(full, flen);
    if (flen >= d->sent.len && !memcmp(full, d->sent.data, d->sent.len) && end > d->sent.len) {
        rc = tok_put(&d->out, full + d->sent.len, end - d->sent.len, err);
        strbuf_reset(&d->sent);
        if (!rc)
            rc = tok_put(&d->sent, full, end, err);
    }
    if (!rc && k == d->window.n && end == flen && d->window.n > d->n_context &&
        d->sent.len == flen) {
        /* Everything is out, ending on a character boundary. The ids that made
         * it become the context for what follows: a whole chunk, not just the
         * last id, so a byte-fallback run is never cut in the middle. */
        size_t keep = d->window.n - d->n_context;
        memmove(d->window.v, d->window.v + d->n_context, keep * sizeof *d->window.v);
        d->window.n = keep;
        d->n_context = keep;
        free(full);
        full = NULL;
        rc = tok_decode(d->tok, d->window.v, (int)keep, d->skip_special, &full, &flen, err);
        strbuf_reset(&d->sent);
        if (!rc)
            rc = tok_put(&d->sent, full, flen, err);
    }
    free(full);
    *text = d->out.data;
    *len = d->out.len;
    return rc;
}

int detok_push(struct detok *d, int32_t id, const char **text, size_t *len, struct err *err)
{
    int rc = idlist_push(&d->window, id, err);
    if (rc)
        return rc;
    return step(d, false, text, len, err);
}

int detok_flush(struct detok *d, const char **text, size_t *len, struct err *err)
{
    int rc = step(d, true, text, len, err);
    if (rc)
        return rc;
    d->window.n = 0;
    d->n_context = 0;
    strbuf_reset(&d->sent);
    return 0;
}
