/* cli/cmd_template.c — `inferd template`: a tokenizer directory's chat template rendered for each JSON object line of stdin. */
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/jsonl.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

static const char usage[] =
    "usage: inferd template DIR [--no-join]\n"
    "Renders DIR's chat template (tokenizer_config.json) as transformers'\n"
    "apply_chat_template does, for each JSON object line of stdin:\n"
    "  messages               the conversation (required); a content given as an\n"
    "                         array of text parts is joined into one string, as\n"
    "                         `inferd serve` does (--no-join hands the array to\n"
    "                         the template as it is, as transformers does)\n"
    "  tools                  tool definitions (optional)\n"
    "  add_generation_prompt  true or false (default false)\n"
    "  any other key          a template variable, as chat_template_kwargs\n"
    "                         (e.g. \"enable_thinking\": false)\n"
    "bos_token and eos_token are the tokenizer's. Writes one line per input line:\n"
    "{\"text\": RENDERED} or {\"error\": MESSAGE}. The exit status is 1 when a line\n"
    "was not a JSON object with a messages array (that line gets an error too),\n"
    "else 0: a template's own errors (raise_exception) are answers.\n";

/* Renders in (a JSON object whose messages is an array) into *text (*len bytes). */
static int render(const struct chat_template *ct, struct json_object *in,
                  struct json_object *messages, bool join, char **text, size_t *len,
                  struct err *err)
{
    struct json_object *tools = NULL, *kwargs = json_object_new_object(), *joined = NULL;
    bool add_generation_prompt = false;
    if (!kwargs)
        return err_set(err, INFERD_ENOMEM, "out of memory");
    json_object_object_foreach(in, key, v) {
        if (!strcmp(key, "tools"))
            tools = v;
        else if (!strcmp(key, "add_generation_prompt"))
            add_generation_prompt = json_object_get_boolean(v);
        else if (strcmp(key, "messages"))
            json_object_object_add(kwargs, key, json_object_get(v));
    }
    int rc = join ? chat_template_join_content(messages, &joined, err) : 0;
    if (rc == 0)
        rc = chat_template_render(ct, join ? joined : messages, tools, add_generation_prompt,
                                  kwargs, text, len, err);
    json_object_put(joined);
    json_object_put(kwargs);
    return rc;
}

int cmd_template(int argc, char **argv)
{
    const char *dir = NULL;
    bool join = true;
    for (int i = 1; i < argc; i++) {
        if (arg_is_help(argv[i])) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--no-join")) {
            join = false;
            continue;
        }
        if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "inferd template: unexpected argument '%s'\n%s", argv[i], usage);
            return 2;
        }
        dir = argv[i];
    }
    if (!dir) {
        fputs(usage, stderr);
        return 2;
    }
    struct err err = {0};
    struct tokenizer *tok = NULL;
    struct chat_template ct = {0};
    if (tok_load(dir, &tok, &err) < 0 || chat_template_load(tok, &ct, &err) < 0) {
        fprintf(stderr, "inferd template: %s\n", err.msg);
        tok_free(tok);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long line_no = 0;
    int status = 0;
    while ((len = cli_jsonl_next(stdin, &line, &cap)) >= 0) {
        line_no++;
        struct json_object *in = cli_jsonl_parse(line, (size_t)len), *messages = NULL;
        char *text = NULL;
        size_t text_len = 0;
        int rc;
        err_clear(&err);
        if (json_object_is_type(in, json_type_object) &&
            json_object_object_get_ex(in, "messages", &messages) &&
            json_object_is_type(messages, json_type_array)) {
            rc = render(&ct, in, messages, join, &text, &text_len, &err);
        } else {
            rc = err_set(&err, INFERD_EINVAL,
                         "stdin line %ld is not a JSON object with a messages array", line_no);
            status = 1;
        }
        struct json_object *out = json_object_new_object();
        if (rc == 0)
            json_object_object_add(out, "text", json_object_new_string_len(text, (int)text_len));
        else
            json_object_object_add(out, "error", json_object_new_string(err.msg));
        cli_jsonl_write(stdout, out);
        fflush(stdout); /* a caller feeding lines one at a time reads each answer */
        json_object_put(out);
        json_object_put(in);
        free(text);
    }
    free(line);
    chat_template_free(&ct);
    tok_free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "inferd template: cannot write the output\n");
        return 1;
    }
    return status;
}
