/* tests/unit/test_cli.c — the inferd binary's commands: --help and --version, and the text conformance suite run through `inferd tokenize` and `inferd template`.
 *
 * The conformance tests feed tests/text/corpus.jsonl and conversations.jsonl to the binary and
 * hold its output to the same references, under the same rules, as test_tokenizer_conformance.c
 * and test_template_conformance.c (tests/text/README.md). They need the real tokenizers in
 * INFERD_TOKENIZER_DATA and skip with a message without them. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "base/strbuf.h"
#include "test_support.h"

#define SHOW_FIRST 5

static char *tmp; /* owned; this test's scratch directory */

static void setup(void) { cr_assert_not_null(tmp = test_mkdtemp()); }

static void teardown(void)
{
    test_rmtree(tmp);
    free(tmp);
}

TestSuite(cli, .init = setup, .fini = teardown);

static const char *refs_dir(void)
{
    const char *env = getenv("INFERD_TEXT_REFS_DIR");
    return env && *env ? env : INFERD_SOURCE_DIR "/tests/text";
}

/* Runs `INFERD_BINARY args` with stdin from in_path (NULL: /dev/null), stdout
 * into tmp/out and stderr into tmp/err. Returns the exit status; *out gets
 * stdout (caller frees) when out is not NULL. */
static int run(const char *args, const char *in_path, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s <'%s' >'%s/out' 2>'%s/err'", INFERD_BINARY, args,
             in_path ? in_path : "/dev/null", tmp, tmp);
    int st = system(cmd);
    cr_assert(st != -1 && WIFEXITED(st), "did not exit normally: %s", cmd);
    if (out) {
        char path[1100];
        snprintf(path, sizeof path, "%s/out", tmp);
        cr_assert_not_null(*out = test_read_file(path, NULL), "no output from %s", cmd);
    }
    return WEXITSTATUS(st);
}

static char *read_stderr(void)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/err", tmp);
    char *s = test_read_file(path, NULL);
    cr_assert_not_null(s);
    return s;
}

/* DATA/name, or a skip when the tokenizers were not fetched. */
static void tokenizer_dir(const char *name, char *dir, size_t cap)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: run scripts/fetch-tokenizers.sh DIR and set "
                     "it to DIR (make test does both)");
    snprintf(dir, cap, "%s/%s", data, name);
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    if (stat(path, &st) != 0)
        cr_skip_test("%s is missing: run scripts/fetch-tokenizers.sh %s", path, data);
}

/* The lines of text (modified in place), at most cap. */
static size_t split_lines(char *text, char **lines, size_t cap)
{
    size_t n = 0;
    for (char *p = text; *p && n < cap;) {
        char *nl = strchr(p, '\n');
        lines[n++] = p;
        if (!nl)
            break;
        *nl = '\0';
        p = nl + 1;
    }
    return n;
}

static void write_or_fail(const char *path, const struct strbuf *b)
{
    cr_assert(!b->failed);
    cr_assert_eq(test_write_file(path, b->data ? b->data : "", b->len), 0, "cannot write %s", path);
}

/* ---------------------------------------------------------------- help and version */

Test(cli, every_command_answers_help_with_its_usage_on_stdout_and_status_0)
{
    static const char *const commands[] = {"run", "serve", "bench", "mkmodel", "tokenize", "template"};
    static const char *const flags[] = {"--help", "-h"};
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
        for (size_t f = 0; f < 2; f++) {
            char args[64], want[64], *out;
            snprintf(args, sizeof args, "%s %s", commands[c], flags[f]);
            snprintf(want, sizeof want, "usage: inferd %s", commands[c]);
            cr_expect_eq(run(args, NULL, &out), 0, "inferd %s: exit status", args);
            cr_expect(strstr(out, want) == out, "inferd %s printed \"%.80s\"", args, out);
            free(out);
        }
    }
}

Test(cli, help_wins_over_a_flag_that_wants_a_value)
{
    char *out;
    cr_assert_eq(run("bench --help", NULL, &out), 0);
    free(out);
    char *err = read_stderr();
    cr_expect_eq(strstr(err, "needs a value"), NULL, "stderr: %s", err);
    free(err);
}

/* The speculative decoding flags that cannot work together are refused before anything runs,
 * with a message naming the flag. */
Test(cli, speculative_flags_that_contradict_each_other_are_refused_naming_them)
{
    static const struct {
        const char *args, *names;
    } cases[] = {
        {"--draft-vocab 100", "--draft-vocab"},
        {"--draft-kind ngram --draft-vocab 100", "--draft-vocab"},
        {"--draft-model " INFERD_SOURCE_DIR "/models/house-draft --draft-vocab 0", "--draft-vocab"},
        {"--draft-kind ngram --draft-model " INFERD_SOURCE_DIR "/models/house-draft", "ngram"},
        {"--draft-kind two-model", "--draft-model"},
        {"--num-draft-tokens 17 --draft-kind ngram", "--num-draft-tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, "run %s/models/house -p hi -n 2 %s", INFERD_SOURCE_DIR,
                 cases[i].args);
        cr_expect_neq(run(args, NULL, NULL), 0, "accepted: %s", cases[i].args);
        char *err = read_stderr();
        cr_expect(strstr(err, cases[i].names), "%s: stderr does not name %s: %s", cases[i].args,
                  cases[i].names, err);
        free(err);
    }
}

Test(cli, version_prints_the_project_version)
{
    static const char *const spellings[] = {"--version", "version"};
    for (int i = 0; i < 2; i++) {
        char *out;
        cr_assert_eq(run(spellings[i], NULL, &out), 0, "inferd %s", spellings[i]);
        cr_expect_str_eq(out, "inferd " INFERD_VERSION "\n");
        free(out);
    }
}

Test(cli, top_usage_names_the_version_and_every_command)
{
    char *out;
    cr_assert_eq(run("help", NULL, &out), 0);
    cr_expect_not_null(strstr(out, "inferd " INFERD_VERSION));
    static const char *const commands[] = {"  run ", "  serve ", "  bench ", "  mkmodel ",
                                           "  tokenize ", "  template ", "  version"};
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        cr_expect_not_null(strstr(out, commands[c]), "usage lacks '%s'", commands[c]);
    free(out);
}

/* ---------------------------------------------------------------- tokenize */

Test(cli, tokenize_prints_each_token_id_with_its_piece)
{
    char dir[1100], args[1200], *out;
    tokenizer_dir("qwen3", dir, sizeof dir);
    snprintf(args, sizeof args, "tokenize '%s' 'Hello world\n'", dir);
    cr_assert_eq(run(args, NULL, &out), 0);
    cr_expect_str_eq(out, "    9707  Hello\n    1879  Ġworld\n     198  Ċ\n");
    free(out);
}

Test(cli, tokenize_jsonl_stops_at_a_line_that_is_not_a_json_string_naming_it)
{
    char dir[1100], args[1200], in[1100], *out;
    tokenizer_dir("qwen3", dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    const char lines[] = "\"Hello world\"\n{\"text\":\"x\"}\n\"never read\"\n";
    cr_assert_eq(test_write_file(in, lines, sizeof lines - 1), 0);
    snprintf(args, sizeof args, "tokenize '%s' --jsonl", dir);
    cr_assert_eq(run(args, in, &out), 1);
    cr_expect_str_eq(out, "[9707,1879]\n");
    free(out);
    char *err = read_stderr();
    cr_expect_not_null(strstr(err, "line 2"), "stderr: %s", err);
    free(err);
}

/* Every text entry of the corpus through `tokenize DIR --jsonl` (and
 * --no-special) against the reference ids. Entries stored as hex are not
 * valid UTF-8, so no JSON string can carry them: they are left out here
 * (test_tokenizer_conformance.c covers them through tok_encode). */
static void check_tokenize(const char *name)
{
    char dir[1100], path[1100], args[1200];
    tokenizer_dir(name, dir, sizeof dir);

    snprintf(path, sizeof path, "%s/corpus.jsonl", refs_dir());
    char *corpus = test_read_file(path, NULL);
    cr_assert_not_null(corpus, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/refs-%s.txt", refs_dir(), name);
    char *refs = test_read_file(path, NULL);
    cr_assert_not_null(refs, "cannot read %s", path);
    size_t cap = 1 << 16;
    char **corpus_lines = malloc(cap * sizeof *corpus_lines);
    char **ref_lines = malloc(cap * sizeof *ref_lines);
    size_t n_corpus = split_lines(corpus, corpus_lines, cap);
    size_t n_refs = split_lines(refs, ref_lines, cap);
    cr_assert_eq(n_corpus, n_refs, "%s: %zu corpus lines, %zu refs", name, n_corpus, n_refs);

    /* want[k]: the refs' with- and without-special ids of the k-th text entry. */
    struct strbuf input = {0};
    char **want_special = calloc(n_corpus, sizeof(char *)), **want_plain = calloc(n_corpus, sizeof(char *));
    long *ids = calloc(n_corpus, sizeof(long));
    size_t n_text = 0;
    for (size_t i = 0; i < n_corpus; i++) {
        struct json_object *e = json_tokener_parse(corpus_lines[i]), *text, *idv;
        cr_assert_not_null(e, "corpus line %zu is not JSON", i + 1);
        cr_assert(json_object_object_get_ex(e, "id", &idv));
        if (json_object_object_get_ex(e, "text", &text)) {
            size_t len;
            const char *s = json_object_to_json_string_length(
                text, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
            strbuf_append(&input, s, len);
            strbuf_append(&input, "\n", 1);
            /* id \t with-special \t without-special \t decoded-hex */
            char *f1 = strchr(ref_lines[i], '\t'), *f2 = f1 ? strchr(f1 + 1, '\t') : NULL,
                 *f3 = f2 ? strchr(f2 + 1, '\t') : NULL;
            cr_assert(f3, "%s: ref line %zu has fewer than 4 fields", name, i + 1);
            cr_assert_eq(strtol(ref_lines[i], NULL, 10), json_object_get_int64(idv),
                         "%s: ref line %zu is not corpus entry %lld", name, i + 1,
                         (long long)json_object_get_int64(idv));
            *f2 = *f3 = '\0';
            cr_assert_neq(asprintf(&want_special[n_text], "[%s]", f1 + 1), -1);
            cr_assert_neq(asprintf(&want_plain[n_text], "[%s]", f2 + 1), -1);
            ids[n_text++] = (long)json_object_get_int64(idv);
        }
        json_object_put(e);
    }
    cr_assert_gt(n_text, 1000, "%s: only %zu text entries in the corpus", name, n_text);
    snprintf(path, sizeof path, "%s/texts.jsonl", tmp);
    write_or_fail(path, &input);

    for (int special = 1; special >= 0; special--) {
        char *out, **got = malloc(cap * sizeof *got);
        snprintf(args, sizeof args, "tokenize '%s' --jsonl%s", dir, special ? "" : " --no-special");
        int status = run(args, path, &out);
        cr_assert_eq(status, 0, "inferd %s: exit status %d", args, status);
        size_t n_got = split_lines(out, got, cap);
        cr_assert_eq(n_got, n_text, "%s: %zu lines out for %zu in", args, n_got, n_text);
        int mismatches = 0;
        for (size_t k = 0; k < n_text; k++) {
            const char *want = special ? want_special[k] : want_plain[k];
            if (strcmp(got[k], want) && mismatches++ < SHOW_FIRST)
                cr_log_error("%s%s: corpus id %ld: expected %.200s, got %.200s", name,
                             special ? "" : " --no-special", ids[k], want, got[k]);
        }
        cr_expect_eq(mismatches, 0, "%s%s: %d of %zu entries differ from the reference", name,
                     special ? "" : " --no-special", mismatches, n_text);
        free(got);
        free(out);
    }
    for (size_t k = 0; k < n_text; k++) {
        free(want_special[k]);
        free(want_plain[k]);
    }
    free(want_special);
    free(want_plain);
    free(ids);
    strbuf_free(&input);
    free(corpus_lines);
    free(ref_lines);
    free(corpus);
    free(refs);
}

Test(cli, tokenize_jsonl_matches_the_reference_ids_for_qwen3, .timeout = 300) { check_tokenize("qwen3"); }
Test(cli, tokenize_jsonl_matches_the_reference_ids_for_llama3, .timeout = 300) { check_tokenize("llama3"); }
Test(cli, tokenize_jsonl_matches_the_reference_ids_for_gemma3, .timeout = 300) { check_tokenize("gemma3"); }

/* ---------------------------------------------------------------- template */

Test(cli, template_answers_a_malformed_line_with_an_error_line_and_status_1)
{
    char dir[1100], args[1200], in[1100], *out;
    tokenizer_dir("qwen3", dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    const char lines[] = "[1]\n{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                         "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}\n";
    cr_assert_eq(test_write_file(in, lines, sizeof lines - 1), 0);
    snprintf(args, sizeof args, "template '%s'", dir);
    cr_assert_eq(run(args, in, &out), 1);
    cr_expect_str_eq(out, "{\"error\":\"stdin line 1 is not a JSON object with a messages array\"}\n"
                          "{\"text\":\"<|im_start|>user\\nab<|im_end|>\\n\"}\n");
    free(out);
}

/* Every conversation of the template's refs through `template DIR` (with
 * --no-join unless join), with the inputs make_template_refs.js passes, and
 * the expectations of test_template_conformance.c: transformers_output /
 * transformers_error over output / error; an error must contain the recorded
 * message. */
static void check_template(const char *name, bool join)
{
    char dir[1100], path[1100], args[1200];
    tokenizer_dir(name, dir, sizeof dir);

    snprintf(path, sizeof path, "%s/conversations.jsonl", refs_dir());
    char *convs_text = test_read_file(path, NULL);
    cr_assert_not_null(convs_text, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/template-refs-%s.jsonl", refs_dir(), name);
    char *refs_text = test_read_file(path, NULL);
    cr_assert_not_null(refs_text, "cannot read %s", path);
    size_t cap = 1 << 14;
    char **conv_lines = malloc(cap * sizeof(char *)), **ref_lines = malloc(cap * sizeof(char *));
    size_t n_convs = split_lines(convs_text, conv_lines, cap);
    size_t n_refs = split_lines(refs_text, ref_lines, cap);
    cr_assert_geq(n_refs, 100, "%s: only %zu conversations in the refs", name, n_refs);

    struct strbuf input = {0};
    struct json_object **refs = calloc(n_refs, sizeof *refs);
    for (size_t i = 0; i < n_refs; i++) {
        struct json_object *idv, *conv, *v, *line = json_object_new_object();
        cr_assert_not_null(refs[i] = json_tokener_parse(ref_lines[i]), "%s: bad JSON on line %zu", path, i + 1);
        cr_assert(json_object_object_get_ex(refs[i], "id", &idv));
        int64_t id = json_object_get_int64(idv);
        cr_assert(id >= 0 && (size_t)id < n_convs, "%s: id %lld is not a conversation", path, (long long)id);
        cr_assert_not_null(conv = json_tokener_parse(conv_lines[id]));
        cr_assert(json_object_object_get_ex(conv, "id", &v) && json_object_get_int64(v) == id,
                  "conversations.jsonl line %lld is not conversation %lld: regenerate (tests/text/README.md)",
                  (long long)id + 1, (long long)id);
        static const char *const keys[] = {"messages", "tools", "add_generation_prompt", "enable_thinking"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (json_object_object_get_ex(conv, keys[k], &v))
                json_object_object_add(line, keys[k], json_object_get(v));
        size_t len;
        const char *s = json_object_to_json_string_length(line, JSON_C_TO_STRING_PLAIN, &len);
        strbuf_append(&input, s, len);
        strbuf_append(&input, "\n", 1);
        json_object_put(line);
        json_object_put(conv);
    }
    snprintf(path, sizeof path, "%s/conversations.jsonl", tmp);
    write_or_fail(path, &input);

    char *out, **got = malloc(cap * sizeof *got);
    snprintf(args, sizeof args, "template '%s'%s", dir, join ? "" : " --no-join");
    int status = run(args, path, &out);
    cr_assert_eq(status, 0, "inferd %s: exit status %d", args, status);
    size_t n_got = split_lines(out, got, cap);
    cr_assert_eq(n_got, n_refs, "%s: %zu lines out for %zu in", name, n_got, n_refs);

    int mismatches = 0;
    for (size_t i = 0; i < n_refs; i++) {
        struct json_object *want_out = NULL, *want_err = NULL, *idv, *answer, *text = NULL, *error = NULL;
        json_object_object_get_ex(refs[i], "id", &idv);
        if (!json_object_object_get_ex(refs[i], "transformers_output", &want_out) &&
            !json_object_object_get_ex(refs[i], "transformers_error", &want_err) &&
            !json_object_object_get_ex(refs[i], "output", &want_out))
            cr_assert(json_object_object_get_ex(refs[i], "error", &want_err), "%s: ref %zu has no expectation",
                      name, i);
        cr_assert_not_null(answer = json_tokener_parse(got[i]), "%s: output line %zu is not JSON: %.200s", name,
                           i + 1, got[i]);
        json_object_object_get_ex(answer, "text", &text);
        json_object_object_get_ex(answer, "error", &error);
        char what[600] = "";
        if (want_out && !text)
            snprintf(what, sizeof what, "expected output, got error %.300s", json_object_get_string(error));
        else if (want_out && (json_object_get_string_len(text) != json_object_get_string_len(want_out) ||
                              memcmp(json_object_get_string(text), json_object_get_string(want_out),
                                     (size_t)json_object_get_string_len(text))))
            snprintf(what, sizeof what, "renders differently:\n    expected %.200s\n    got      %.200s",
                     json_object_to_json_string(want_out), json_object_to_json_string(text));
        else if (want_err && !error)
            snprintf(what, sizeof what, "expected an error containing \"%.200s\", but it rendered",
                     json_object_get_string(want_err));
        else if (want_err && !strstr(json_object_get_string(error), json_object_get_string(want_err)))
            snprintf(what, sizeof what, "expected an error containing \"%.200s\", got \"%.250s\"",
                     json_object_get_string(want_err), json_object_get_string(error));
        if (what[0] && mismatches++ < SHOW_FIRST)
            cr_log_error("%s: conversation %lld %s", name, (long long)json_object_get_int64(idv), what);
        json_object_put(answer);
    }
    cr_expect_eq(mismatches, 0, "%s: %d of %zu conversations differ from the reference", name, mismatches,
                 n_refs);

    for (size_t i = 0; i < n_refs; i++)
        json_object_put(refs[i]);
    free(refs);
    free(got);
    free(out);
    strbuf_free(&input);
    free(conv_lines);
    free(ref_lines);
    free(convs_text);
    free(refs_text);
}

/* The Qwen3 and Llama 3 conversations have no content-part arrays, so the
 * join the server does (and `template` by default) leaves them as the
 * reference saw them. */
Test(cli, template_matches_the_reference_renders_for_qwen3, .timeout = 300) { check_template("qwen3", true); }
Test(cli, template_matches_the_reference_renders_for_llama3, .timeout = 300) { check_template("llama3", true); }

/* The Gemma 3 conversations hand the template content-part arrays, which
 * the reference renders part by part (each part trimmed): the same input
 * only with --no-join. */
Test(cli, template_no_join_matches_the_reference_renders_for_gemma3, .timeout = 300)
{
    check_template("gemma3", false);
}
