/* text/jinja/jinja.h — a Jinja2 interpreter for chat templates: parse once, render with a JSON context. */
#ifndef INFERD_TEXT_JINJA_H
#define INFERD_TEXT_JINJA_H

#include <stddef.h>

#include "base/err.h"

struct json_object;

struct jinja_template;

/* Limits that stop runaway templates (loops, recursion, output size). */
struct jinja_limits {
    size_t max_output_bytes;   /* default 16 MiB */
    long max_steps;            /* evaluation steps; default 50,000,000 */
    int max_depth;             /* macro/call recursion; default 256 */
};

void jinja_limits_default(struct jinja_limits *l);

/* Parses template source with transformers' settings (trim_blocks and
 * lstrip_blocks on, loopcontrols). Errors say line and column. Fuzzed. */
int jinja_parse(const char *src, size_t len, struct jinja_template **out, struct err *err);
void jinja_free(struct jinja_template *t);

/* Renders with the variables of ctx (a JSON object; borrowed). Globals
 * raise_exception(msg) and strftime_now(fmt) are provided, and tojson
 * formats as transformers' (json.dumps with ensure_ascii=False). *out is
 * malloc'd and NUL-terminated. */
int jinja_render(const struct jinja_template *t, struct json_object *ctx,
                 const struct jinja_limits *limits, char **out, size_t *len, struct err *err);

#endif
