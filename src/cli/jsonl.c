/* cli/jsonl.c — JSON Lines reading and writing for the text commands (tokenize, template). */
#include "cli/jsonl.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

ssize_t cli_jsonl_next(FILE *in, char **line, size_t *cap)
{
    ssize_t n = getline(line, cap, in);
    if (n > 0 && (*line)[n - 1] == '\n')
        (*line)[--n] = '\0';
    return n;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

struct json_object *cli_jsonl_parse(const char *line, size_t len)
{
    /* Trailing whitespace goes first: json-c cannot tell where a bare number
     * at the end of its input stops and would ask for more. */
    while (len > 0 && is_space(line[len - 1]))
        len--;
    if (len == 0 || len > (size_t)INT32_MAX)
        return NULL;
    struct json_tokener *tok = json_tokener_new();
    if (!tok)
        return NULL;
    struct json_object *v = json_tokener_parse_ex(tok, line, (int)len);
    bool whole = json_tokener_get_error(tok) == json_tokener_success &&
                 json_tokener_get_parse_end(tok) == len;
    json_tokener_free(tok);
    if (!whole) {
        json_object_put(v);
        return NULL;
    }
    return v;
}

void cli_jsonl_write(FILE *out, struct json_object *v)
{
    size_t len;
    const char *s = json_object_to_json_string_length(
        v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    fwrite(s, 1, len, out);
    fputc('\n', out);
}
