/* cli/cmd_tokenize.c — `inferd tokenize`: a tokenizer directory's ids for a text, or for each JSON string line of stdin. */
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/jsonl.h"
#include "text/tokenizer.h"

static const char usage[] =
    "usage: inferd tokenize DIR [--no-special] [--] TEXT\n"
    "       inferd tokenize DIR --jsonl [--no-special]\n"
    "Encodes with DIR's tokenizer.json (a model or tokenizer directory).\n"
    "With TEXT: one line per token, its id and its piece (the vocabulary entry;\n"
    "characters that do not print are escaped: \\n, \\t, \\xNN, \\u{NNNN}).\n"
    "With --jsonl: reads one JSON string per line on stdin and writes one JSON\n"
    "array of ids per line, e.g. [9707,1879]. A line that is not a JSON string\n"
    "stops the command with a message naming the line, exit status 1.\n"
    "Special tokens are added as the tokenizer's post-processor adds them\n"
    "(encode(text, add_special_tokens=True)); --no-special leaves them out.\n";

/* One code point of a piece, escaped unless it prints on a terminal as itself. */
static size_t print_code_point(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c == '\n' || c == '\t' || c == '\r' || c == '\\') {
        printf("\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : c == '\r' ? 'r' : '\\');
        return 1;
    }
    if (c < 0x20 || c == 0x7f) {
        printf("\\x%02x", c);
        return 1;
    }
    if (c < 0x80) {
        putchar(c);
        return 1;
    }
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (len > n || !utf8_valid(s, len)) {
        printf("\\x%02x", c);
        return 1;
    }
    unsigned cp = len == 2 ? (c & 0x1fu) << 6 | (s[1] & 0x3fu)
                : len == 3 ? (c & 0x0fu) << 12 | (s[1] & 0x3fu) << 6 | (s[2] & 0x3fu)
                           : (c & 0x07u) << 18 | (s[1] & 0x3fu) << 12 | (s[2] & 0x3fu) << 6 |
                                 (s[3] & 0x3fu);
    /* C1 controls, line/paragraph separators and the BOM move or hide text. */
    if (cp < 0xa0 || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff)
        printf("\\u{%04x}", cp);
    else
        fwrite(s, 1, len, stdout);
    return len;
}

static void print_piece(const char *piece)
{
    const unsigned char *s = (const unsigned char *)piece;
    size_t n = strlen(piece);
    for (size_t i = 0; i < n;)
        i += print_code_point(s + i, n - i);
}

static int tokenize_text(const struct tokenizer *tok, const char *text, bool add_special)
{
    struct err err = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(tok, text, strlen(text), add_special, &ids, &n, &err) < 0) {
        fprintf(stderr, "inferd tokenize: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const char *piece = tok_id_to_piece(tok, ids[i]);
        printf("%8d  ", ids[i]);
        print_piece(piece ? piece : "");
        fputs(tok_is_special(tok, ids[i]) ? "  (special)\n" : "\n", stdout);
    }
    free(ids);
    return 0;
}

/* Stops at the first line that is not a JSON string: every line written
 * before it answers the line of the same number. */
static int tokenize_jsonl(const struct tokenizer *tok, bool add_special)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long line_no = 0;
    int status = 0;
    while (status == 0 && (len = cli_jsonl_next(stdin, &line, &cap)) >= 0) {
        line_no++;
        struct json_object *v = cli_jsonl_parse(line, (size_t)len);
        if (!json_object_is_type(v, json_type_string)) {
            fprintf(stderr, "inferd tokenize: stdin line %ld is not a JSON string\n", line_no);
            json_object_put(v);
            status = 1;
            break;
        }
        struct err err = {0};
        int32_t *ids = NULL;
        int n = 0;
        if (tok_encode(tok, json_object_get_string(v), (size_t)json_object_get_string_len(v),
                       add_special, &ids, &n, &err) < 0) {
            fprintf(stderr, "inferd tokenize: stdin line %ld: %s\n", line_no, err.msg);
            status = 1;
        } else {
            putchar('[');
            for (int i = 0; i < n; i++)
                printf(i ? ",%d" : "%d", ids[i]);
            fputs("]\n", stdout);
            fflush(stdout); /* a caller feeding lines one at a time reads each answer */
        }
        free(ids);
        json_object_put(v);
    }
    free(line);
    return status;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL;
    bool jsonl = false, add_special = true, positional_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!positional_only && a[0] == '-' && a[1]) {
            if (arg_is_help(a)) {
                fputs(usage, stdout);
                return 0;
            }
            if (!strcmp(a, "--jsonl"))
                jsonl = true;
            else if (!strcmp(a, "--no-special"))
                add_special = false;
            else if (!strcmp(a, "--"))
                positional_only = true;
            else {
                fprintf(stderr, "inferd tokenize: unknown option '%s'\n%s", a, usage);
                return 2;
            }
        } else if (!dir) {
            dir = a;
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "inferd tokenize: unexpected argument '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (!dir || jsonl == (text != NULL)) {
        fputs(usage, stderr);
        return 2;
    }
    struct err err = {0};
    struct tokenizer *tok = NULL;
    if (tok_load(dir, &tok, &err) < 0) {
        fprintf(stderr, "inferd tokenize: %s\n", err.msg);
        return 1;
    }
    int status = jsonl ? tokenize_jsonl(tok, add_special) : tokenize_text(tok, text, add_special);
    tok_free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "inferd tokenize: cannot write the output\n");
        return 1;
    }
    return status;
}
