/* text/reasoning.c — separates <think> reasoning from content in streamed text, holding back partial tags. */
#include "text/reasoning.h"

#include "base/strbuf.h"
#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

struct reasoning_splitter {
    char start_tag[REASONING_TAG_MAX + 1];
    char end_tag[REASONING_TAG_MAX + 1];
    size_t start_len, end_len;
    bool inside;
    char hold[REASONING_TAG_MAX + 8]; /* possible partial tag, plus a partial code point */
    size_t hold_len;
    struct strbuf work, reasoning, content; /* owned */
};

static int nomem(struct err *err)
{
    return err_set(err, INFERD_ENOMEM, "reasoning splitter: out of memory");
}

/* First occurrence of needle in hay, or -1. Tags are short, so a plain scan is enough. */
static long find(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m > n)
        return -1;
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0)
            return (long)i;
    return -1;
}

/* Length of the longest proper prefix of tag that ends s. */
static size_t partial_tag_suffix(const char *s, size_t n, const char *tag, size_t m)
{
    size_t k = m - 1 < n ? m - 1 : n;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0)
            return k;
    return 0;
}

static int set_tag(char *dst, size_t *dst_len, const char *tag, const char *dflt, const char *what,
                   struct err *err)
{
    if (!tag)
        tag = dflt;
    size_t n = strlen(tag);
    if (n == 0 || n > REASONING_TAG_MAX)
        return err_set(err, INFERD_ERANGE, "reasoning %s tag must be 1..%d bytes, got %zu", what,
                       REASONING_TAG_MAX, n);
    memcpy(dst, tag, n + 1);
    *dst_len = n;
    return 0;
}

int reasoning_splitter_create(const struct reasoning_opts *opts, struct reasoning_splitter **out,
                              struct err *err)
{
    if (!out)
        return err_set(err, INFERD_EINVAL, "reasoning_splitter_create: out is NULL");
    *out = NULL;
    struct reasoning_opts dflt = {0};
    if (!opts)
        opts = &dflt;
    struct reasoning_splitter *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(err, INFERD_ENOMEM, "reasoning splitter: out of memory");
    if (set_tag(r->start_tag, &r->start_len, opts->start_tag, "<think>", "start", err) < 0 ||
        set_tag(r->end_tag, &r->end_len, opts->end_tag, "</think>", "end", err) < 0) {
        free(r);
        return -INFERD_ERANGE;
    }
    r->inside = opts->starts_inside;
    *out = r;
    return 0;
}

void reasoning_splitter_free(struct reasoning_splitter *r)
{
    if (!r)
        return;
    strbuf_free(&r->work);
    strbuf_free(&r->reasoning);
    strbuf_free(&r->content);
    free(r);
}

static void delta_fill(struct reasoning_splitter *r, struct reasoning_delta *out)
{
    out->reasoning = r->reasoning.len ? r->reasoning.data : "";
    out->reasoning_len = r->reasoning.len;
    out->content = r->content.len ? r->content.data : "";
    out->content_len = r->content.len;
}

int reasoning_splitter_push(struct reasoning_splitter *r, const char *text, size_t len,
                            struct reasoning_delta *out, struct err *err)
{
    if (!r || !out || (len > 0 && !text))
        return err_set(err, INFERD_EINVAL, "reasoning_splitter_push: NULL argument");
    strbuf_reset(&r->reasoning);
    strbuf_reset(&r->content);
    strbuf_reset(&r->work);
    if (!strbuf_append(&r->work, r->hold, r->hold_len) || !strbuf_append(&r->work, text, len))
        return nomem(err);
    r->hold_len = 0;

    const char *w = r->work.data;
    size_t n = r->work.len, pos = 0;
    for (;;) {
        const char *tag = r->inside ? r->end_tag : r->start_tag;
        size_t tag_len = r->inside ? r->end_len : r->start_len;
        struct strbuf *dst = r->inside ? &r->reasoning : &r->content;
        long at = find(w + pos, n - pos, tag, tag_len);
        if (at >= 0) {
            if (!strbuf_append(dst, w + pos, (size_t)at))
                return nomem(err);
            pos += (size_t)at + tag_len;
            r->inside = !r->inside;
            continue;
        }
        size_t keep = partial_tag_suffix(w + pos, n - pos, tag, tag_len);
        size_t cut = pos + utf8_safe_cut((const unsigned char *)w + pos, n - pos, n - pos - keep);
        if (!strbuf_append(dst, w + pos, cut - pos))
            return nomem(err);
        r->hold_len = n - cut;
        memcpy(r->hold, w + cut, r->hold_len);
        break;
    }
    delta_fill(r, out);
    return 0;
}

int reasoning_splitter_flush(struct reasoning_splitter *r, struct reasoning_delta *out,
                             struct err *err)
{
    if (!r || !out)
        return err_set(err, INFERD_EINVAL, "reasoning_splitter_flush: NULL argument");
    strbuf_reset(&r->reasoning);
    strbuf_reset(&r->content);
    if (!strbuf_append(r->inside ? &r->reasoning : &r->content, r->hold, r->hold_len))
        return nomem(err);
    r->hold_len = 0;
    delta_fill(r, out);
    return 0;
}

bool reasoning_splitter_inside(const struct reasoning_splitter *r)
{
    return r && r->inside;
}

int reasoning_split_all(const char *text, size_t len, bool starts_inside, char **reasoning,
                        size_t *reasoning_len, char **content, size_t *content_len,
                        struct err *err)
{
    if ((len > 0 && !text) || !reasoning || !content)
        return err_set(err, INFERD_EINVAL, "reasoning_split_all: NULL argument");
    *reasoning = *content = NULL;
    struct strbuf rb = {0}, cb = {0};
    static const char start[] = "<think>", end[] = "</think>";
    bool inside = starts_inside;
    size_t pos = 0;
    while (pos < len) {
        const char *tag = inside ? end : start;
        size_t tag_len = inside ? sizeof end - 1 : sizeof start - 1;
        long at = find(text + pos, len - pos, tag, tag_len);
        size_t take = at >= 0 ? (size_t)at : len - pos;
        strbuf_append(inside ? &rb : &cb, text + pos, take);
        if (at < 0)
            break;
        pos += take + tag_len;
        inside = !inside;
    }
    /* a failed append is remembered by the buffer, so one check covers the loop */
    *reasoning = strbuf_take(&rb, reasoning_len);
    *content = strbuf_take(&cb, content_len);
    if (*reasoning && *content)
        return 0;
    free(*reasoning);
    free(*content);
    *reasoning = *content = NULL;
    return nomem(err);
}
