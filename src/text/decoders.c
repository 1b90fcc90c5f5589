/* text/decoders.c — tokenizer.json decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

enum dec_kind {
    DEC_BYTELEVEL,
    DEC_METASPACE,
    DEC_BYTEFALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_REPLACE,
    DEC_SEQUENCE,
};

struct decoder {
    enum dec_kind kind;
    uint32_t ch;            /* Metaspace replacement; Strip content */
    bool strip_first;       /* Metaspace: prepend_scheme is not "never" */
    size_t start, stop;     /* Strip */
    struct tok_pattern pat; /* Replace */
    char *content;          /* owned; Replace */
    size_t content_len;
    void **subs;            /* owned; Sequence members, each a struct decoder * */
    size_t n_subs;
};

void decoder_free(struct decoder *d)
{
    if (!d)
        return;
    tok_pattern_free(&d->pat);
    free(d->content);
    for (size_t i = 0; i < d->n_subs; i++)
        decoder_free(d->subs[i]);
    free(d->subs);
    free(d);
}

/* A Sequence member, for tok_json_components. */
static int parse_member(const struct json_reader *e, void **out, struct err *err)
{
    struct decoder *sub = NULL;
    int rc = decoder_parse(e, &sub, err);
    *out = sub;
    return rc;
}

int decoder_parse(const struct json_reader *j, struct decoder **out, struct err *err)
{
    *out = NULL;
    const char *type;
    int rc = tok_json_type(j, &type);
    if (rc)
        return rc;
    struct decoder *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    if (!strcmp(type, "ByteLevel")) {
        d->kind = DEC_BYTELEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        const char *ps = NULL;
        d->strip_first = true;
        if (!(rc = tok_json_char(j, "replacement", "\xE2\x96\x81", &d->ch, err)) &&
            !(rc = json_read_str(j, "prepend_scheme", JSON_OPTIONAL, &ps, NULL))) {
            if (ps)
                d->strip_first = strcmp(ps, "never") != 0;
            else
                rc = json_read_bool(j, "add_prefix_space", JSON_OPTIONAL, &d->strip_first);
        }
    } else if (!strcmp(type, "ByteFallback")) {
        d->kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        int64_t start = 0, stop = 0;
        if (!(rc = tok_json_char(j, "content", " ", &d->ch, err)) &&
            !(rc = tok_json_index(j, "start", JSON_OPTIONAL, INT64_MAX, &start)))
            rc = tok_json_index(j, "stop", JSON_OPTIONAL, INT64_MAX, &stop);
        d->start = (size_t)start;
        d->stop = (size_t)stop;
    } else if (!strcmp(type, "Replace")) {
        d->kind = DEC_REPLACE;
        struct json_reader pat = json_reader_member(j, "pattern");
        if (!(rc = tok_pattern_parse(&pat, &d->pat, err)))
            rc = json_read_strdup(j, "content", JSON_REQUIRED, &d->content, &d->content_len);
    } else if (!strcmp(type, "Sequence")) {
        d->kind = DEC_SEQUENCE;
        rc = tok_json_components(j, "decoders", parse_member, &d->subs, &d->n_subs, err);
    } else {
        rc = err_set(err, INFERD_EUNSUPPORTED, "tokenizer: unsupported decoder type '%.60s'", type);
    }
    if (rc) {
        decoder_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* A valid UTF-8 byte run stays; an invalid one becomes one U+FFFD per byte. */
static int flush_bytes(struct strbuf *bytes, struct plist *out, struct err *err)
{
    if (!bytes->len)
        return 0;
    struct strbuf chk = {0};
    int rc = tok_utf8_lossy(bytes->data, bytes->len, &chk, err);
    bool valid = !rc && chk.len == bytes->len && !memcmp(chk.data, bytes->data, bytes->len);
    strbuf_free(&chk);
    if (!rc && valid)
        rc = plist_push(out, bytes->data, bytes->len, false, err);
    for (size_t i = 0; !rc && !valid && i < bytes->len; i++)
        rc = plist_push(out, "\xEF\xBF\xBD", 3, false, err);
    strbuf_reset(bytes);
    return rc;
}

static int decode_one(const struct decoder *d, struct plist *l, struct plist *out, struct err *err)
{
    int rc = 0;
    switch (d->kind) {
    case DEC_BYTELEVEL:
    case DEC_FUSE: {
        struct strbuf all = {0};
        rc = tok_put(&all, "", 0, err);
        for (size_t i = 0; !rc && i < l->n; i++) {
            const struct piece *p = &l->v[i];
            if (d->kind == DEC_FUSE) {
                rc = tok_put(&all, p->s, p->len, err);
                continue;
            }
            /* A token whose characters are not all in the byte map passes through as is. */
            size_t mark = all.len;
            bool mapped = true;
            for (size_t k = 0; !rc && k < p->len;) {
                int b = tok_cp_to_byte(tok_utf8_next(p->s, p->len, &k));
                if (b < 0) {
                    mapped = false;
                    break;
                }
                char c = (char)b;
                rc = tok_put(&all, &c, 1, err);
            }
            if (!rc && !mapped) {
                all.len = mark;
                rc = tok_put(&all, p->s, p->len, err);
            }
        }
        if (!rc && d->kind == DEC_BYTELEVEL) {
            struct strbuf lossy = {0};
            rc = tok_utf8_lossy(all.data, all.len, &lossy, err);
            if (!rc)
                rc = plist_push(out, lossy.data, lossy.len, false, err);
            strbuf_free(&lossy);
        } else if (!rc) {
            rc = plist_push(out, all.data, all.len, false, err);
        }
        strbuf_free(&all);
        return rc;
    }
    case DEC_METASPACE:
        for (size_t i = 0; !rc && i < l->n; i++) {
            const struct piece *p = &l->v[i];
            struct strbuf b = {0};
            rc = tok_put(&b, "", 0, err);
            for (size_t k = 0; !rc && k < p->len;) {
                size_t at = k;
                uint32_t cp = tok_utf8_next(p->s, p->len, &k);
                if (cp == d->ch) {
                    if (!(i == 0 && d->strip_first))
                        rc = tok_put(&b, " ", 1, err);
                } else {
                    rc = tok_put(&b, p->s + at, k - at, err);
                }
            }
            if (!rc)
                rc = plist_push(out, b.data, b.len, false, err);
            strbuf_free(&b);
        }
        return rc;
    case DEC_BYTEFALLBACK: {
        struct strbuf bytes = {0};
        for (size_t i = 0; !rc && i < l->n; i++) {
            const struct piece *p = &l->v[i];
            if (p->len == 6 && !memcmp(p->s, "<0x", 3) && p->s[5] == '>' && hexval(p->s[3]) >= 0 &&
                hexval(p->s[4]) >= 0) {
                char c = (char)(hexval(p->s[3]) * 16 + hexval(p->s[4]));
                rc = tok_put(&bytes, &c, 1, err);
                continue;
            }
            rc = flush_bytes(&bytes, out, err);
            if (!rc)
                rc = plist_push(out, p->s, p->len, false, err);
        }
        if (!rc)
            rc = flush_bytes(&bytes, out, err);
        strbuf_free(&bytes);
        return rc;
    }
    case DEC_STRIP:
        for (size_t i = 0; !rc && i < l->n; i++) {
            const struct piece *p = &l->v[i];
            size_t a = 0, b = p->len, k = 0;
            for (size_t n = 0; n < d->start && k < p->len; n++) {
                size_t at = k;
                if (tok_utf8_next(p->s, p->len, &k) != d->ch) {
                    k = at;
                    break;
                }
            }
            a = k;
            for (size_t n = 0; n < d->stop && b > a; n++) {
                size_t st;
                size_t q = b;
                while (q > a && ((uint8_t)p->s[q - 1] & 0xC0) == 0x80)
                    q--;
                st = q > a ? q - 1 : a;
                size_t t = st;
                if (tok_utf8_next(p->s, b, &t) != d->ch)
                    break;
                b = st;
            }
            rc = plist_push(out, p->s + a, b - a, false, err);
        }
        return rc;
    case DEC_REPLACE: {
        struct spanlist sp = {0};
        for (size_t i = 0; !rc && i < l->n; i++) {
            const struct piece *p = &l->v[i];
            struct strbuf b = {0};
            rc = tok_pattern_find(&d->pat, p->s, p->len, &sp, err);
            if (!rc)
                rc = tok_put(&b, "", 0, err);
            for (size_t k = 0; !rc && k < sp.n; k++)
                rc = sp.v[k].is_match
                         ? tok_put(&b, d->content, d->content_len, err)
                         : tok_put(&b, p->s + sp.v[k].start, sp.v[k].end - sp.v[k].start, err);
            if (!rc)
                rc = plist_push(out, b.data, b.len, false, err);
            strbuf_free(&b);
        }
        free(sp.v);
        return rc;
    }
    case DEC_SEQUENCE:
        break;
    }
    return rc;
}

bool decoder_has_byte_fallback(const struct decoder *d)
{
    if (d->kind == DEC_BYTEFALLBACK)
        return true;
    for (size_t i = 0; i < d->n_subs; i++)
        if (decoder_has_byte_fallback(d->subs[i]))
            return true;
    return false;
}

int decoder_apply(const struct decoder *d, struct plist *l, struct err *err)
{
    if (d->kind == DEC_SEQUENCE) {
        for (size_t i = 0; i < d->n_subs; i++) {
            int rc = decoder_apply(d->subs[i], l, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    struct plist out = {0};
    int rc = decode_one(d, l, &out, err);
    if (rc) {
        plist_free(&out);
        return rc;
    }
    plist_free(l);
    *l = out;
    return 0;
}
