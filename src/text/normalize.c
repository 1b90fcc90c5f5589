/* text/normalize.c — tokenizer.json normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Replace, Prepend, Strip, StripAccents, Sequence. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"

enum norm_kind {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWERCASE,
    NORM_REPLACE,
    NORM_PREPEND,
    NORM_STRIP,
    NORM_STRIP_ACCENTS,
    NORM_SEQUENCE,
};

struct normalizer {
    enum norm_kind kind;
    struct tok_pattern pat;   /* Replace */
    char *content;            /* owned; Replace's content or Prepend's prefix */
    size_t content_len;
    bool left, right;         /* Strip */
    void **subs; /* owned; Sequence members, each a struct normalizer * */
    size_t n_subs;
};

void normalizer_free(struct normalizer *n)
{
    if (!n)
        return;
    tok_pattern_free(&n->pat);
    free(n->content);
    for (size_t i = 0; i < n->n_subs; i++)
        normalizer_free(n->subs[i]);
    free(n->subs);
    free(n);
}

/* A Sequence member, for tok_json_components. */
static int parse_member(const struct json_reader *e, void **out, struct err *err)
{
    struct normalizer *sub = NULL;
    int rc = normalizer_parse(e, &sub, err);
    *out = sub;
    return rc;
}

int normalizer_parse(const struct json_reader *j, struct normalizer **out, struct err *err)
{
    *out = NULL;
    const char *type;
    int rc = tok_json_type(j, &type);
    if (rc)
        return rc;
    struct normalizer *n = calloc(1, sizeof *n);
    if (!n)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    if (!strcmp(type, "NFC"))
        n->kind = NORM_NFC;
    else if (!strcmp(type, "NFD"))
        n->kind = NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        n->kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        n->kind = NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        n->kind = NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents"))
        n->kind = NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Replace")) {
        n->kind = NORM_REPLACE;
        struct json_reader pat = json_reader_member(j, "pattern");
        if (!(rc = tok_pattern_parse(&pat, &n->pat, err)))
            rc = json_read_strdup(j, "content", JSON_REQUIRED, &n->content, &n->content_len);
    } else if (!strcmp(type, "Prepend")) {
        n->kind = NORM_PREPEND;
        rc = json_read_strdup(j, "prepend", JSON_REQUIRED, &n->content, &n->content_len);
    } else if (!strcmp(type, "Strip")) {
        n->kind = NORM_STRIP;
        n->left = n->right = true;
        if (!(rc = json_read_bool(j, "strip_left", JSON_OPTIONAL, &n->left)))
            rc = json_read_bool(j, "strip_right", JSON_OPTIONAL, &n->right);
    } else if (!strcmp(type, "Sequence")) {
        n->kind = NORM_SEQUENCE;
        rc = tok_json_components(j, "normalizers", parse_member, &n->subs, &n->n_subs, err);
    } else {
        rc = err_set(err, INFERD_EUNSUPPORTED, "tokenizer: unsupported normalizer type '%.60s'",
                     type);
    }
    if (rc) {
        normalizer_free(n);
        return rc;
    }
    *out = n;
    return 0;
}

static int replace_buf(struct strbuf *s, struct strbuf *nb, struct err *err)
{
    strbuf_free(s);
    *s = *nb;
    if (!s->data)
        return tok_put(s, "", 0, err);
    return 0;
}

static int unicode_map(struct strbuf *s, utf8proc_option_t opts, struct err *err)
{
    /* ASCII is its own NFC/NFD/NFKC/NFKD. */
    size_t i = 0;
    while (i < s->len && (uint8_t)s->data[i] < 0x80)
        i++;
    if (i == s->len)
        return 0;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s->data, (utf8proc_ssize_t)s->len,
                                      &dst, opts);
    if (n < 0)
        return err_set(err, INFERD_EINVAL, "tokenizer: normalization failed: %s",
                       utf8proc_errmsg(n));
    struct strbuf nb = {0};
    int rc = tok_put(&nb, dst, (size_t)n, err);
    free(dst);
    if (rc)
        return rc;
    return replace_buf(s, &nb, err);
}

int normalizer_apply(const struct normalizer *n, struct strbuf *s, struct err *err)
{
    int rc = 0;
    struct strbuf nb = {0};
    char tmp[4];
    switch (n->kind) {
    case NORM_NFC:
        return unicode_map(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE, err);
    case NORM_NFD:
        return unicode_map(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, err);
    case NORM_NFKC:
        return unicode_map(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, err);
    case NORM_NFKD:
        return unicode_map(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, err);
    case NORM_LOWERCASE:
    case NORM_STRIP_ACCENTS:
        rc = tok_put(&nb, "", 0, err);
        for (size_t i = 0; !rc && i < s->len;) {
            uint32_t cp = tok_utf8_next(s->data, s->len, &i);
            if (n->kind == NORM_LOWERCASE) {
                /* Rust lowercases U+0130 to "i\u0307"; utf8proc's simple mapping gives "i". */
                if (cp == 0x130) {
                    rc = tok_put(&nb, "i\xCC\x87", 3, err);
                    continue;
                }
                cp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            } else {
                /* StripAccents drops combining marks; decomposing first is the file's job (NFD). */
                utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
                if (c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC ||
                    c == UTF8PROC_CATEGORY_ME)
                    continue;
            }
            rc = tok_put(&nb, tmp, tok_utf8_put(cp, tmp), err);
        }
        break;
    case NORM_REPLACE: {
        struct spanlist sp = {0};
        rc = tok_pattern_find(&n->pat, s->data, s->len, &sp, err);
        if (!rc)
            rc = tok_put(&nb, "", 0, err);
        for (size_t i = 0; !rc && i < sp.n; i++) {
            if (sp.v[i].is_match)
                rc = tok_put(&nb, n->content, n->content_len, err);
            else
                rc = tok_put(&nb, s->data + sp.v[i].start, sp.v[i].end - sp.v[i].start, err);
        }
        free(sp.v);
        break;
    }
    case NORM_PREPEND:
        if (s->len == 0)
            return 0;
        rc = tok_put(&nb, n->content, n->content_len, err);
        if (!rc)
            rc = tok_put(&nb, s->data, s->len, err);
        break;
    case NORM_STRIP: {
        size_t a = 0, b = s->len, i = 0;
        if (n->left) {
            while (i < s->len) {
                size_t at = i;
                if (!tok_is_whitespace(tok_utf8_next(s->data, s->len, &i))) {
                    i = at;
                    break;
                }
            }
            a = i;
        }
        if (n->right) {
            /* Walk forward remembering where the last run of whitespace began. */
            size_t j = a, ws_start = s->len;
            bool in_ws = false;
            while (j < s->len) {
                size_t at = j;
                bool w = tok_is_whitespace(tok_utf8_next(s->data, s->len, &j));
                if (w && !in_ws)
                    ws_start = at;
                in_ws = w;
            }
            b = in_ws ? ws_start : s->len;
        }
        rc = tok_put(&nb, s->data + a, b > a ? b - a : 0, err);
        break;
    }
    case NORM_SEQUENCE:
        for (size_t i = 0; i < n->n_subs; i++)
            if ((rc = normalizer_apply(n->subs[i], s, err)))
                return rc;
        return 0;
    }
    if (rc) {
        strbuf_free(&nb);
        return rc;
    }
    return replace_buf(s, &nb, err);
}
