/* cli/jsonl.h — JSON Lines for the text commands: one JSON value in per line of stdin, one compact line out. */
#ifndef INFERD_CLI_JSONL_H
#define INFERD_CLI_JSONL_H

#include <stdio.h>
#include <sys/types.h>

struct json_object;

/* The next line of in without its newline, in *line (grown as getline
 * grows it; the caller frees). Returns its length (it may hold NUL bytes),
 * or -1 at the end of input. */
ssize_t cli_jsonl_next(FILE *in, char **line, size_t *cap);

/* line (len bytes) as exactly one JSON value with only whitespace around it,
 * or NULL when it is not one. The caller puts the value. */
struct json_object *cli_jsonl_parse(const char *line, size_t len);

/* v as one compact JSON line (no spaces, "/" unescaped) on out. */
void cli_jsonl_write(FILE *out, struct json_object *v);

#endif
