/* cli/args.h — strict parsing of numeric command-line values, with messages naming the flag. */
#ifndef INFERD_CLI_ARGS_H
#define INFERD_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

/* Each returns false after printing "inferd: FLAG: ..." when text is not a
 * number in [min, max]. */
bool arg_int(const char *flag, const char *text, long min, long max, long *out);
bool arg_float(const char *flag, const char *text, double min, double max, double *out);
bool arg_u64(const char *flag, const char *text, uint64_t *out);

/* "exact" or "fast". */
bool arg_mode(const char *text, enum compute_mode *out);

/* "on" or "off" for flag; false after printing "inferd: FLAG: ..." otherwise. */
bool arg_on_off(const char *flag, const char *text, bool *out);

/* Comma-separated token ids, e.g. "1,2,3"; *ids is malloc'd. */
bool arg_token_list(const char *flag, const char *text, int32_t **ids, int *n);

/* "-h" or "--help": every command answers it with its usage on stdout. */
bool arg_is_help(const char *arg);

/* The value following argv[*i], or NULL (with a message) when it is missing. */
const char *arg_value(int argc, char **argv, int *i);

#endif
