/* base/json.h — typed reading of JSON documents (json-c) with errors that name the value's path. */
#ifndef INFERD_BASE_JSON_H
#define INFERD_BASE_JSON_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct json_object;

/* ---- parsing ------------------------------------------------------------- */

/* Parses len bytes of text (no NUL needed; a raw NUL byte is refused) as one
 * JSON value that only whitespace may follow. max_depth 0 means json-c's
 * default (32); strict refuses json-c's extensions (trailing commas, single
 * quotes, ...). A JSON null gives 0 with *out NULL; otherwise *out is owned by
 * the caller (json_object_put). Messages say what is wrong and where, not which
 * document ("unexpected character at byte 12"): callers name it, e.g.
 * err_wrap(err, "config.json is not valid JSON"). -INFERD_EFORMAT or -INFERD_ENOMEM. */
int json_text_parse(const char *text, size_t len, int max_depth, bool strict,
                    struct json_object **out, struct err *err);

/* ---- readers --------------------------------------------------------------- */

enum json_doc_flags {
    JSON_TEXT = 1u << 0,             /* every string read is valid UTF-8 without NUL characters */
    JSON_INTEGRAL_DOUBLES = 1u << 1, /* 3.0 reads as the integer 3 (clients that only know doubles) */
};

/* What the readers of one document share: options, and where errors go. */
struct json_doc {
    struct err *err;    /* may be NULL */
    const char *prefix; /* starts every message ("tokenizer: ..."), or NULL */
    const char *name;   /* names the root in messages ("tokenizer.json"); NULL: "the value" */
    unsigned flags;     /* enum json_doc_flags */
    char err_path[128]; /* the path the last error was about, e.g. "messages[2].role"; "" for the root */
};

/* A position in a document: the value there and how it was reached. Readers
 * live on the stack and point at their parent, so a path costs nothing until
 * an error spells it out ("tools[0].function.name"). */
struct json_reader {
    struct json_object *v;        /* borrowed; NULL when absent or JSON null */
    struct json_doc *doc;
    const struct json_reader *up; /* NULL at the root */
    const char *key;              /* member name in up; NULL for an array element */
    size_t index;                 /* element index in up when key is NULL */
};

struct json_reader json_reader_root(struct json_doc *doc, struct json_object *v);
/* Member key of r; its v is NULL when absent, null, or r is not an object. */
struct json_reader json_reader_member(const struct json_reader *r, const char *key);
/* Element i of r (an array, i < its length). */
struct json_reader json_reader_element(const struct json_reader *r, size_t i);
/* Member key of r whose value v the caller already has (json_object_object_foreach). */
struct json_reader json_reader_entry(const struct json_reader *r, const char *key,
                                     struct json_object *v);

/* Member key is present and not null. */
bool json_reader_has(const struct json_reader *r, const char *key);
/* Member key is present, even as null (for fields where null means "off"). */
bool json_reader_has_key(const struct json_reader *r, const char *key);

/* Writes r's path ("" for the root) into buf, cut to size; returns its full length. */
size_t json_reader_path(const struct json_reader *r, char *buf, size_t size);

/* Fails at r: records its path in doc->err_path and sets doc->err to
 * "<prefix>: <path> <message>" (the root's name when the path is empty).
 * Returns -code. */
int json_reader_fail(const struct json_reader *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Like json_reader_fail, for messages that do not start with the value's name. */
int json_reader_fail_plain(const struct json_reader *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "null", "a boolean", "a number", "a string", "an array", "an object". */
const char *json_type_phrase(const struct json_object *v);

/* ---- typed fields -----------------------------------------------------------
 *
 * Each reads member key of r (key NULL: r's own value). present says whether
 * the value may be absent: JSON_REQUIRED refuses absence (and null) with
 * "missing required field '<path>'"; otherwise *present tells whether it was
 * there (JSON_OPTIONAL when the caller does not care). An absent value leaves
 * *out untouched, so a default set beforehand stands; JSON null counts as
 * absent. Errors: a wrong type or a missing field -INFERD_EFORMAT, a value out
 * of range -INFERD_ERANGE, a string outside an enum's set -INFERD_EUNSUPPORTED,
 * a failed copy -INFERD_ENOMEM; messages read "top_p must be in (0, 1], got 1.5". */

#define JSON_REQUIRED ((bool *)NULL)
#define JSON_OPTIONAL (&(bool){false})

/* *s borrows from the document; len may be NULL. */
int json_read_str(const struct json_reader *r, const char *key, bool *present, const char **s,
                  size_t *len);
/* *s is a malloc'd copy, owned by the caller; len may be NULL. */
int json_read_strdup(const struct json_reader *r, const char *key, bool *present, char **s,
                     size_t *len);
int json_read_bool(const struct json_reader *r, const char *key, bool *present, bool *out);
/* An integer in [lo, hi] (INT64_MIN / INT64_MAX leave that side open). */
int json_read_int64(const struct json_reader *r, const char *key, bool *present, int64_t lo,
                    int64_t hi, int64_t *out);
int json_read_int(const struct json_reader *r, const char *key, bool *present, int lo, int hi,
                  int *out);

/* Bounds of a number; an infinite bound leaves that side open-ended. */
struct json_range {
    double lo, hi;
    bool lo_open, hi_open; /* (lo, ...) rather than [lo, ...) */
};
#define JSON_ANY_NUMBER ((struct json_range){-INFINITY, INFINITY, false, false})

/* A finite number (integer or not) within range. */
int json_read_double(const struct json_reader *r, const char *key, bool *present,
                     struct json_range range, double *out);
/* A string that is one of names (NULL-terminated); *out is its index. */
int json_read_enum(const struct json_reader *r, const char *key, bool *present,
                   const char *const *names, int *out);
/* An object; *out is a reader at it (out->v NULL when absent). */
int json_read_object(const struct json_reader *r, const char *key, bool *present,
                     struct json_reader *out);
/* An array; *out is a reader at it and *n its length (0 when absent). Descend
 * into elements with json_reader_element(out, i). */
int json_read_array(const struct json_reader *r, const char *key, bool *present,
                    struct json_reader *out, size_t *n);

/* Refuses members of the object r whose names are not in keys (NULL-terminated). */
int json_reader_check_keys(const struct json_reader *r, const char *const *keys);
/* Walks r's whole subtree, kept as it is: every key and string must pass the
 * document's text rules (JSON_TEXT) and every number must be finite. Errors
 * name r, the value the caller keeps, not the nested spot. */
int json_reader_check_tree(const struct json_reader *r);

#endif
