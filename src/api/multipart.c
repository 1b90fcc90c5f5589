/* api/multipart.c — multipart/form-data parsing: the boundary from the Content-Type, then each
 * part's headers (Content-Disposition name/filename, Content-Type) and its data in place. */
#define _GNU_SOURCE /* memmem */
#include "api/multipart.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* RFC 2046 §5.1.1 bchars (a space may not end the boundary). */
static bool is_bchar(char c)
{
    if (c == '\0')
        return false;
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           strchr("'()+_,-./:=? ", c) != NULL;
}

/* Reads a parameter value at *p (a token up to ';', or a quoted-string with
 * backslash escapes) into out; advances *p past it. False when it does not fit
 * or a quote is not closed. */
static bool read_value(const char **p, const char *end, char *out, size_t cap)
{
    const char *s = *p;
    size_t n = 0;
    if (s < end && *s == '"') {
        s++;
        while (s < end && *s != '"') {
            if (*s == '\\' && s + 1 < end)
                s++;
            if (n + 1 >= cap)
                return false;
            out[n++] = *s++;
        }
        if (s >= end)
            return false;
        s++;
    } else {
        while (s < end && *s != ';' && !is_space(*s)) {
            if (n + 1 >= cap)
                return false;
            out[n++] = *s++;
        }
    }
    out[n] = '\0';
    *p = s;
    return true;
}

/* Finds parameter key (case-insensitive) in "; k=v; k2="v2"" between p and end.
 * Returns 1 with out filled, 0 when absent, -1 when a value is malformed or too long. */
static int find_param(const char *p, const char *end, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);
    char scratch[MULTIPART_MAX_NAME];
    while (p < end) {
        while (p < end && (*p == ';' || is_space(*p)))
            p++;
        const char *k = p;
        while (p < end && *p != '=' && *p != ';' && !is_space(*p))
            p++;
        size_t n = (size_t)(p - k);
        while (p < end && is_space(*p))
            p++;
        if (p >= end || *p != '=')
            continue; /* a parameter without a value: skipped */
        p++;
        while (p < end && is_space(*p))
            p++;
        bool want = n == klen && !strncasecmp(k, key, klen);
        if (!read_value(&p, end, want ? out : scratch, want ? cap : sizeof scratch))
            return -1;
        if (want)
            return 1;
    }
    return 0;
}

int multipart_boundary(const char *content_type, char *out, struct err *err)
{
    static const char type[] = "multipart/form-data";
    const char *ct = content_type ? content_type : "";
    while (is_space(*ct))
        ct++;
    if (strncasecmp(ct, type, sizeof type - 1) ||
        (ct[sizeof type - 1] && ct[sizeof type - 1] != ';' && !is_space(ct[sizeof type - 1])))
        return err_set(err, INFERD_EINVAL, "Content-Type must be multipart/form-data, got '%.100s'",
                       ct);
    const char *params = ct + sizeof type - 1;
    int found = find_param(params, params + strlen(params), "boundary", out,
                           MULTIPART_MAX_BOUNDARY + 1);
    if (found <= 0)
        return err_set(err, INFERD_EINVAL,
                       found < 0 ? "the multipart boundary is longer than %d bytes or malformed"
                                 : "Content-Type multipart/form-data needs a boundary parameter",
                       MULTIPART_MAX_BOUNDARY);
    size_t n = strlen(out);
    for (size_t i = 0; i < n; i++)
        if (!is_bchar(out[i]))
            return err_set(err, INFERD_EINVAL,
                           "the multipart boundary has a character it may not have (byte 0x%02x)",
                           (unsigned char)out[i]);
    if (n == 0 || out[n - 1] == ' ')
        return err_set(err, INFERD_EINVAL, "the multipart boundary is empty or ends in a space");
    return 0;
}

/* Copies a header value, trimmed, into out. False when it does not fit. */
static bool copy_trimmed(const char *s, const char *end, char *out, size_t cap)
{
    while (s < end && is_space(*s))
        s++;
    while (end > s && is_space(end[-1]))
        end--;
    size_t n = (size_t)(end - s);
    if (n + 1 > cap)
        return false;
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

static int parse_disposition(const char *v, const char *end, struct multipart_part *part,
                             size_t idx, struct err *err)
{
    static const char form_data[] = "form-data";
    while (v < end && is_space(*v))
        v++;
    size_t n = sizeof form_data - 1;
    if ((size_t)(end - v) < n || strncasecmp(v, form_data, n) ||
        (v + n < end && v[n] != ';' && !is_space(v[n])))
        return err_set(err, INFERD_EINVAL,
                       "multipart part %zu: Content-Disposition must be form-data", idx);
    v += n;
    int rc = find_param(v, end, "name", part->name, sizeof part->name);
    if (rc < 0)
        return err_set(err, INFERD_EINVAL,
                       "multipart part %zu: its name is malformed or longer than %d bytes", idx,
                       MULTIPART_MAX_NAME - 1);
    if (rc == 0 || part->name[0] == '\0')
        return err_set(err, INFERD_EINVAL, "multipart part %zu: Content-Disposition has no name",
                       idx);
    if (find_param(v, end, "filename", part->filename, sizeof part->filename) < 0)
        return err_set(err, INFERD_EINVAL,
                       "multipart part %zu: its filename is malformed or longer than %d bytes",
                       idx, MULTIPART_MAX_NAME - 1);
    return 0;
}

/* Reads the header block [h, end) of part idx (1-based, for messages). */
static int parse_headers(const char *h, const char *end, struct multipart_part *part, size_t idx,
                         struct err *err)
{
    if (memchr(h, '\0', (size_t)(end - h)))
        return err_set(err, INFERD_EINVAL, "multipart part %zu: a NUL byte in its headers", idx);
    bool disposition = false;
    while (h < end) {
        const char *eol = memmem(h, (size_t)(end - h), "\r\n", 2);
        if (!eol)
            eol = end;
        const char *colon = memchr(h, ':', (size_t)(eol - h));
        if (!colon || colon == h) {
            int shown = eol - h < 40 ? (int)(eol - h) : 40;
            return err_set(err, INFERD_EINVAL,
                           "multipart part %zu: a header line without a name and ':' (%.*s)", idx,
                           shown, h);
        }
        size_t n = (size_t)(colon - h);
        if (n == 19 && !strncasecmp(h, "Content-Disposition", n)) {
            if (parse_disposition(colon + 1, eol, part, idx, err) < 0)
                return -INFERD_EINVAL;
            disposition = true;
        } else if (n == 12 && !strncasecmp(h, "Content-Type", n)) {
            if (!copy_trimmed(colon + 1, eol, part->content_type, sizeof part->content_type))
                return err_set(err, INFERD_EINVAL,
                               "multipart part %zu: its Content-Type is longer than %d bytes", idx,
                               MULTIPART_MAX_TYPE - 1);
        }
        h = eol + 2;
    }
    if (!disposition)
        return err_set(err, INFERD_EINVAL, "multipart part %zu has no Content-Disposition header",
                       idx);
    return 0;
}

int multipart_parse(const char *body, size_t len, const char *boundary,
                    struct multipart_form *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    /* "\r\n--" boundary: the delimiter; the first one may open the body without the CRLF. */
    char delim[MULTIPART_MAX_BOUNDARY + 5];
    size_t blen = strlen(boundary);
    if (blen == 0 || blen > MULTIPART_MAX_BOUNDARY)
        return err_set(err, INFERD_EINVAL, "the multipart boundary must be 1 to %d bytes",
                       MULTIPART_MAX_BOUNDARY);
    memcpy(delim, "\r\n--", 4);
    memcpy(delim + 4, boundary, blen);
    size_t dlen = 4 + blen;

    const char *end = body + len, *p;
    if (len >= dlen - 2 && !memcmp(body, delim + 2, dlen - 2)) {
        p = body + dlen - 2;
    } else {
        const char *d = memmem(body, len, delim, dlen);
        if (!d)
            return err_set(err, INFERD_EINVAL,
                           "the multipart body does not contain its boundary '%s'", boundary);
        p = d + dlen;
    }

    int rc = 0;
    size_t cap = 0;
    for (;;) {
        /* Just past a delimiter: "--" closes the body, else padding and CRLF open a part. */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            break;
        while (p < end && is_space(*p))
            p++;
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') {
            rc = err_set(err, INFERD_EINVAL,
                         p >= end ? "the multipart body ends before its closing boundary"
                                  : "the multipart boundary is followed by neither CRLF nor '--'");
            goto fail;
        }
        p += 2;
        size_t idx = out->n_parts + 1;
        if (out->n_parts == MULTIPART_MAX_PARTS) {
            rc = err_set(err, INFERD_EINVAL, "the multipart body has more than %d parts",
                         MULTIPART_MAX_PARTS);
            goto fail;
        }
        if (out->n_parts == cap) {
            size_t ncap = cap ? cap * 2 : 4;
            struct multipart_part *np = realloc(out->parts, ncap * sizeof *np);
            if (!np) {
                rc = err_set(err, INFERD_ENOMEM, "out of memory for %zu multipart parts", ncap);
                goto fail;
            }
            out->parts = np;
            cap = ncap;
        }
        struct multipart_part *part = &out->parts[out->n_parts];
        memset(part, 0, sizeof *part);

        /* The header block ends at an empty line; it may itself be empty. */
        const char *hend, *data;
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            hend = p;
            data = p + 2;
        } else {
            size_t window = (size_t)(end - p);
            if (window > MULTIPART_MAX_HEADERS + 4)
                window = MULTIPART_MAX_HEADERS + 4;
            hend = memmem(p, window, "\r\n\r\n", 4);
            if (!hend) {
                rc = err_set(err, INFERD_EINVAL,
                             window == (size_t)(end - p)
                                 ? "multipart part %zu: the body ends inside its headers"
                                 : "multipart part %zu: its headers are longer than %d bytes",
                             idx, MULTIPART_MAX_HEADERS);
                goto fail;
            }
            data = hend + 4;
        }
        if ((rc = parse_headers(p, hend, part, idx, err)) < 0)
            goto fail;
        const char *next = memmem(data, (size_t)(end - data), delim, dlen);
        if (!next) {
            rc = err_set(err, INFERD_EINVAL,
                         "multipart part %zu: the body ends before its closing boundary", idx);
            goto fail;
        }
        part->data = data;
        part->data_len = (size_t)(next - data);
        out->n_parts++;
        p = next + dlen;
    }
    if (out->n_parts == 0) {
        rc = err_set(err, INFERD_EINVAL, "the multipart body has no parts");
        goto fail;
    }
    return 0;

fail:
    multipart_free(out);
    return rc;
}

const struct multipart_part *multipart_find(const struct multipart_form *f, const char *name)
{
    for (size_t i = 0; i < f->n_parts; i++)
        if (!strcmp(f->parts[i].name, name))
            return &f->parts[i];
    return NULL;
}

void multipart_free(struct multipart_form *f)
{
    free(f->parts);
    memset(f, 0, sizeof *f);
}
