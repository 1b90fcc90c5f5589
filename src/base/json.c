/* base/json.c — JSON text parsing and the typed, path-aware reader over json-c values. */
#include "base/json.h"

#include "base/utf8.h"

#include <json-c/json.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------- */

int json_text_parse(const char *text, size_t len, int max_depth, bool strict,
                    struct json_object **out, struct err *err)
{
    *out = NULL;
    if (len >= INT_MAX)
        return err_set(err, INFERD_EFORMAT, "it is too large (%zu bytes)", len);
    if (memchr(text, '\0', len))
        return err_set(err, INFERD_EFORMAT, "it contains a raw NUL byte");
    struct json_tokener *tok = json_tokener_new_ex(max_depth > 0 ? max_depth : 32);
    if (!tok)
        return err_set(err, INFERD_ENOMEM, "out of memory parsing JSON");
    if (strict)
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    if (jerr == json_tokener_continue) {
        /* A NUL tells json-c the text is over, so a bare number at the very
         * end completes while an open object or string is refused. */
        root = json_tokener_parse_ex(tok, "", 1);
        jerr = json_tokener_get_error(tok);
        end = len;
    }
    json_tokener_free(tok);
    if (jerr == json_tokener_error_depth) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "nesting deeper than %d levels",
                       max_depth > 0 ? max_depth : 32);
    }
    if (jerr != json_tokener_success) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "%s at byte %zu", json_tokener_error_desc(jerr), end);
    }
    for (size_t i = end; i < len; i++) {
        char c = text[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            json_object_put(root);
            return err_set(err, INFERD_EFORMAT, "unexpected bytes after the value (byte %zu)", i);
        }
    }
    *out = root;
    return 0;
}

/* ---- positions and paths ----------------------------------------------------- */

struct json_reader json_reader_root(struct json_doc *doc, struct json_object *v)
{
    doc->err_path[0] = '\0';
    return (struct json_reader){.v = v, .doc = doc};
}

struct json_reader json_reader_member(const struct json_reader *r, const char *key)
{
    struct json_object *v = NULL;
    if (r->v && json_object_is_type(r->v, json_type_object))
        json_object_object_get_ex(r->v, key, &v);
    return json_reader_entry(r, key, v);
}

struct json_reader json_reader_element(const struct json_reader *r, size_t i)
{
    struct json_object *v = NULL;
    if (r->v && json_object_is_type(r->v, json_type_array) && i < json_object_array_length(r->v))
        v = json_object_array_get_idx(r->v, i);
    return (struct json_reader){.v = v, .doc = r->doc, .up = r, .index = i};
}

struct json_reader json_reader_entry(const struct json_reader *r, const char *key,
                                     struct json_object *v)
{
    return (struct json_reader){.v = v, .doc = r->doc, .up = r, .key = key};
}

bool json_reader_has(const struct json_reader *r, const char *key)
{
    return json_reader_member(r, key).v != NULL;
}

bool json_reader_has_key(const struct json_reader *r, const char *key)
{
    return r->v && json_object_is_type(r->v, json_type_object) &&
           json_object_object_get_ex(r->v, key, NULL);
}

/* Appends r's path to buf at *pos (which may run past size: the full length is counted). */
static void path_put(const struct json_reader *r, char *buf, size_t size, size_t *pos)
{
    if (!r->up)
        return;
    path_put(r->up, buf, size, pos);
    char piece[80];
    int n;
    if (r->key)
        n = snprintf(piece, sizeof piece, "%s%.64s", r->up->up ? "." : "", r->key);
    else
        n = snprintf(piece, sizeof piece, "[%zu]", r->index);
    for (int i = 0; i < n; i++, (*pos)++)
        if (*pos + 1 < size)
            buf[*pos] = piece[i];
}

size_t json_reader_path(const struct json_reader *r, char *buf, size_t size)
{
    size_t pos = 0;
    path_put(r, buf, size, &pos);
    if (size)
        buf[pos < size ? pos : size - 1] = '\0';
    return pos;
}

static int fail_v(const struct json_reader *r, int code, bool named, const char *fmt, va_list ap)
{
    struct json_doc *doc = r->doc;
    json_reader_path(r, doc->err_path, sizeof doc->err_path);
    char text[400];
    vsnprintf(text, sizeof text, fmt, ap);
    const char *subject = doc->err_path[0] ? doc->err_path : doc->name ? doc->name : "the value";
    return err_set(doc->err, code, "%s%s%s%s%s", doc->prefix ? doc->prefix : "",
                   doc->prefix ? ": " : "", named ? subject : "", named ? " " : "", text);
}

int json_reader_fail(const struct json_reader *r, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_v(r, code, true, fmt, ap);
    va_end(ap);
    return rc;
}

int json_reader_fail_plain(const struct json_reader *r, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_v(r, code, false, fmt, ap);
    va_end(ap);
    return rc;
}

const char *json_type_phrase(const struct json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double:
    case json_type_int: return "a number";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "an unknown value";
}

/* ---- typed fields ------------------------------------------------------------ */

/* Positions *at on member key of r (or r itself); 1 when a value is there,
 * 0 when it is absent and may be, or the error for a missing required one. */
static int locate(const struct json_reader *r, const char *key, bool *present,
                  struct json_reader *at)
{
    *at = key ? json_reader_member(r, key) : *r;
    if (present)
        *present = at->v != NULL;
    if (at->v)
        return 1;
    if (!present) {
        char path[128];
        json_reader_path(at, path, sizeof path);
        return json_reader_fail_plain(at, INFERD_EFORMAT, "missing required field '%s'",
                                      path[0] ? path : at->doc->name ? at->doc->name : "");
    }
    return 0;
}

static int wrong_type(const struct json_reader *at, const char *want)
{
    return json_reader_fail(at, INFERD_EFORMAT, "must be %s, got %s", want,
                            json_type_phrase(at->v));
}

static int check_text(const struct json_reader *at, const char *s, size_t n)
{
    if (memchr(s, '\0', n))
        return json_reader_fail(at, INFERD_EFORMAT,
                                "contains a NUL character (\\u0000), which is not allowed");
    if (!utf8_valid((const unsigned char *)s, n))
        return json_reader_fail(at, INFERD_EFORMAT, "is not valid UTF-8");
    return 0;
}

int json_read_str(const struct json_reader *r, const char *key, bool *present, const char **s,
                  size_t *len)
{
    struct json_reader at;
    int rc = locate(r, key, present, &at);
    if (rc <= 0)
        return rc;
    if (!json_object_is_type(at.v, json_type_string))
        return wrong_type(&at, "a string");
    const char *p = json_object_get_string(at.v);
    size_t n = (size_t)json_object_get_string_len(at.v);
    if ((at.doc->flags & JSON_TEXT) && (rc = check_text(&at, p, n)))
        return rc;
    *s = p;
    if (len)
        *len = n;
    return 0;
}

int json_read_strdup(const struct json_reader *r, const char *key, bool *present, char **s,
                     size_t *len)
{
    const char *p = NULL;
    size_t n = 0;
    int rc = json_read_str(r, key, present, &p, &n);
    if (rc || !p)
        return rc;
    char *copy = malloc(n + 1);
    if (!copy)
        return err_set(r->doc->err, INFERD_ENOMEM, "%s%sout of memory",
                       r->doc->prefix ? r->doc->prefix : "", r->doc->prefix ? ": " : "");
    memcpy(copy, p, n + 1);
    *s = copy;
    if (len)
        *len = n;
    return 0;
}

int json_read_bool(const struct json_reader *r, const char *key, bool *present, bool *out)
{
    struct json_reader at;
    int rc = locate(r, key, present, &at);
    if (rc <= 0)
        return rc;
    if (!json_object_is_type(at.v, json_type_boolean))
        return wrong_type(&at, "a boolean");
    *out = json_object_get_boolean(at.v);
    return 0;
}

int json_read_int64(const struct json_reader *r, const char *key, bool *present, int64_t lo,
                    int64_t hi, int64_t *out)
{
    struct json_reader at;
    int rc = locate(r, key, present, &at);
    if (rc <= 0)
        return rc;
    int64_t x;
    if (json_object_is_type(at.v, json_type_int)) {
        x = json_object_get_int64(at.v);
    } else if (json_object_is_type(at.v, json_type_double)) {
        double d = json_object_get_double(at.v);
        if (!(at.doc->flags & JSON_INTEGRAL_DOUBLES) || !isfinite(d) || d != floor(d) ||
            d < -9223372036854775808.0 || d >= 9223372036854775808.0)
            return json_reader_fail(&at, INFERD_EFORMAT, "must be an integer, got %s",
                                    json_object_to_json_string(at.v));
        x = (int64_t)d;
    } else {
        return wrong_type(&at, "an integer");
    }
    if (x < lo || x > hi) {
        if (hi == INT64_MAX)
            return json_reader_fail(&at, INFERD_ERANGE, "must be at least %lld, got %lld",
                                    (long long)lo, (long long)x);
        if (lo == INT64_MIN)
            return json_reader_fail(&at, INFERD_ERANGE, "must be at most %lld, got %lld",
                                    (long long)hi, (long long)x);
        return json_reader_fail(&at, INFERD_ERANGE, "must be in [%lld, %lld], got %lld",
                                (long long)lo, (long long)hi, (long long)x);
    }
    *out = x;
    return 0;
}

int json_read_int(const struct json_reader *r, const char *key, bool *present, int lo, int hi,
                  int *out)
{
    int64_t x = *out; /* stays when the value is absent */
    int rc = json_read_int64(r, key, present, lo, hi, &x);
    if (!rc)
        *out = (int)x;
    return rc;
}

int json_read_double(const struct json_reader *r, const char *key, bool *present,
                     struct json_range range, double *out)
{
    struct json_reader at;
    int rc = locate(r, key, present, &at);
    if (rc <= 0)
        return rc;
    if (!json_object_is_type(at.v, json_type_double) && !json_object_is_type(at.v, json_type_int))
        return wrong_type(&at, "a number");
    double d = json_object_get_double(at.v);
    if (!isfinite(d))
        return json_reader_fail(&at, INFERD_ERANGE, "must be a finite number");
    bool below = range.lo_open ? d <= range.lo : d < range.lo;
    bool above = range.hi_open ? d >= range.hi : d > range.hi;
    if (below || above) {
        if (isinf(range.hi))
            return json_reader_fail(&at, INFERD_ERANGE, "must be %s %g, got %g",
                                    range.lo_open ? "greater than" : "at least", range.lo, d);
        if (isinf(range.lo))
            return json_reader_fail(&at, INFERD_ERANGE, "must be %s %g, got %g",
                                    range.hi_open ? "less than" : "at most", range.hi, d);
        return json_reader_fail(&at, INFERD_ERANGE, "must be in %c%g, %g%c, got %g",
                                range.lo_open ? '(' : '[', range.lo, range.hi,
                                range.hi_open ? ')' : ']', d);
    }
    *out = d;
    return 0;
}

int json_read_enum(const struct json_reader *r, const char *key, bool *present,
                   const char *const *names, int *out)
{
    const char *s = NULL;
    int rc = json_read_str(r, key, present, &s, NULL);
    if (rc || !s)
        return rc;
    for (int i = 0; names[i]; i++) {
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    }
    char list[256];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; names[i] && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s\"%s\"", i ? ", " : "", names[i]);
    struct json_reader at = key ? json_reader_member(r, key) : *r;
    return json_reader_fail(&at, INFERD_EUNSUPPORTED, "must be one of %s; got \"%.64s\"", list, s);
}

int json_read_object(const struct json_reader *r, const char *key, bool *present,
                     struct json_reader *out)
{
    int rc = locate(r, key, present, out);
    if (rc <= 0)
        return rc;
    if (!json_object_is_type(out->v, json_type_object))
        return wrong_type(out, "an object");
    return 0;
}

int json_read_array(const struct json_reader *r, const char *key, bool *present,
                    struct json_reader *out, size_t *n)
{
    *n = 0;
    int rc = locate(r, key, present, out);
    if (rc <= 0)
        return rc;
    if (!json_object_is_type(out->v, json_type_array))
        return wrong_type(out, "an array");
    *n = json_object_array_length(out->v);
    return 0;
}

int json_reader_check_keys(const struct json_reader *r, const char *const *keys)
{
    if (!r->v || !json_object_is_type(r->v, json_type_object))
        return 0;
    json_object_object_foreach(r->v, k, v)
    {
        (void)v;
        bool known = false;
        for (int i = 0; keys[i] && !known; i++)
            known = !strcmp(k, keys[i]);
        if (!known) {
            struct json_reader at = json_reader_entry(r, k, v);
            return json_reader_fail(&at, INFERD_EFORMAT, "is not a known field");
        }
    }
    return 0;
}

static int check_subtree(const struct json_reader *r, struct json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_string:
        if (r->doc->flags & JSON_TEXT)
            return check_text(r, json_object_get_string(v), (size_t)json_object_get_string_len(v));
        return 0;
    case json_type_double:
        if (!isfinite(json_object_get_double(v)))
            return json_reader_fail(r, INFERD_ERANGE, "contains a number that is not finite");
        return 0;
    case json_type_array: {
        size_t n = json_object_array_length(v);
        for (size_t i = 0; i < n; i++) {
            int rc = check_subtree(r, json_object_array_get_idx(v, i));
            if (rc)
                return rc;
        }
        return 0;
    }
    case json_type_object: {
        json_object_object_foreach(v, key, val)
        {
            int rc = (r->doc->flags & JSON_TEXT) ? check_text(r, key, strlen(key)) : 0;
            if (!rc)
                rc = check_subtree(r, val);
            if (rc)
                return rc;
        }
        return 0;
    }
    default: return 0;
    }
}

int json_reader_check_tree(const struct json_reader *r)
{
    return check_subtree(r, r->v);
}
