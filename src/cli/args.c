/* cli/args.c — strict parsing of numeric command-line values. */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool arg_int(const char *flag, const char *text, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) {
        fprintf(stderr, "inferd: %s: '%s' is not an integer in [%ld, %ld]\n", flag, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool arg_float(const char *flag, const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "inferd: %s: '%s' is not a number in [%g, %g]\n", flag, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool arg_u64(const char *flag, const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') {
        fprintf(stderr, "inferd: %s: '%s' is not a non-negative integer\n", flag, text);
        return false;
    }
    *out = v;
    return true;
}

bool arg_mode(const char *text, enum compute_mode *out)
{
    if (!strcmp(text, "exact"))
        *out = COMPUTE_EXACT;
    else if (!strcmp(text, "fast"))
        *out = COMPUTE_FAST;
    else {
        fprintf(stderr, "inferd: --mode: '%s' is neither 'exact' nor 'fast'\n", text);
        return false;
    }
    return true;
}

bool arg_on_off(const char *flag, const char *text, bool *out)
{
    if (!strcmp(text, "on"))
        *out = true;
    else if (!strcmp(text, "off"))
        *out = false;
    else {
        fprintf(stderr, "inferd: %s: '%s' is neither 'on' nor 'off'\n", flag, text);
        return false;
    }
    return true;
}

bool arg_token_list(const char *flag, const char *text, int32_t **ids, int *n)
{
    int cap = 16, count = 0;
    int32_t *out = malloc((size_t)cap * sizeof *out);
    const char *p = text;
    while (out && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "inferd: %s: expected comma-separated token ids, got '%s'\n", flag,
                    text);
            free(out);
            return false;
        }
        if (count == cap) {
            int32_t *grown = realloc(out, (size_t)(cap *= 2) * sizeof *out);
            if (!grown)
                break;
            out = grown;
        }
        out[count++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!out || count == 0) {
        fprintf(stderr, "inferd: %s: no token ids given\n", flag);
        free(out);
        return false;
    }
    *ids = out;
    *n = count;
    return true;
}

bool arg_is_help(const char *arg)
{
    return !strcmp(arg, "-h") || !strcmp(arg, "--help");
}

const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "inferd: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}
