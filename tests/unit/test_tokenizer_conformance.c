/* tests/unit/test_tokenizer_conformance.c — tok_encode/tok_decode equal the HF Rust reference (tests/text/refs-*.txt) on the whole corpus.
 *
 * Needs the real tokenizers fetched by scripts/fetch-tokenizers.sh into the directory named by
 * INFERD_TOKENIZER_DATA (DATA/NAME/tokenizer.json); each test skips with a message when they
 * are absent. tests/text/README.md says how the corpus and the refs were made. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/tokenizer.h"
#include "test_support.h"

/* How many mismatches of each kind are printed in full. */
#define SHOW_FIRST 5

/* The source tree's tests/text; INFERD_TEXT_REFS_DIR overrides it for a test binary
 * carried to another machine. */
static const char *refs_dir(void)
{
    const char *env = getenv("INFERD_TEXT_REFS_DIR");
    return env && *env ? env : INFERD_SOURCE_DIR "/tests/text";
}

struct corpus_entry {
    long id;
    char *bytes; /* owned; len bytes, NUL-terminated for convenience */
    size_t len;
    bool from_hex; /* stored hex-encoded: not valid UTF-8 */
};

struct ids {
    int32_t *v; /* owned */
    int n;
};

struct ref_line {
    long id;
    struct ids with_special, without_special;
    char *decoded; /* owned; decoded_len bytes */
    size_t decoded_len;
};

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes n hex digits; *out is malloc'd (n/2 bytes plus a NUL). */
static bool hex_decode(const char *hex, size_t n, char **out, size_t *len)
{
    if (n % 2)
        return false;
    char *b = malloc(n / 2 + 1);
    cr_assert_not_null(b);
    for (size_t i = 0; i < n; i += 2) {
        int hi = hex_value(hex[i]), lo = hex_value(hex[i + 1]);
        if (hi < 0 || lo < 0) {
            free(b);
            return false;
        }
        b[i / 2] = (char)(hi << 4 | lo);
    }
    b[n / 2] = '\0';
    *out = b;
    *len = n / 2;
    return true;
}

static struct corpus_entry *load_corpus(size_t *n_out)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/corpus.jsonl", refs_dir());
    size_t size;
    char *text = test_read_file(path, &size);
    cr_assert_not_null(text, "cannot read %s", path);
    size_t cap = 4096, n = 0;
    struct corpus_entry *v = malloc(cap * sizeof *v);
    cr_assert_not_null(v);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        struct json_object *o = json_tokener_parse(line);
        cr_assert_not_null(o, "%s: bad JSON line %zu", path, n + 1);
        struct json_object *id, *t, *h;
        cr_assert(json_object_object_get_ex(o, "id", &id), "%s: line %zu has no id", path, n + 1);
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            cr_assert_not_null(v);
        }
        struct corpus_entry *e = &v[n];
        e->id = (long)json_object_get_int64(id);
        if (json_object_object_get_ex(o, "text", &t)) {
            /* The length, not strlen: the corpus has strings with U+0000 in them. */
            e->len = (size_t)json_object_get_string_len(t);
            e->bytes = malloc(e->len + 1);
            cr_assert_not_null(e->bytes);
            memcpy(e->bytes, json_object_get_string(t), e->len);
            e->bytes[e->len] = '\0';
            e->from_hex = false;
        } else {
            cr_assert(json_object_object_get_ex(o, "hex", &h), "%s: id %ld has neither text nor hex", path, e->id);
            cr_assert(hex_decode(json_object_get_string(h), (size_t)json_object_get_string_len(h), &e->bytes, &e->len),
                      "%s: id %ld: bad hex", path, e->id);
            e->from_hex = true;
        }
        json_object_put(o);
        n++;
    }
    free(text);
    *n_out = n;
    return v;
}

/* Parses "1,2,3" (or "" for none) up to end. */
static struct ids parse_ids(const char *s, const char *end)
{
    struct ids r = {NULL, 0};
    if (s == end)
        return r;
    int cap = 16;
    r.v = malloc(cap * sizeof *r.v);
    cr_assert_not_null(r.v);
    while (s < end) {
        char *next;
        long x = strtol(s, &next, 10);
        cr_assert(next != s, "bad id list in refs");
        if (r.n == cap) {
            cap *= 2;
            r.v = realloc(r.v, cap * sizeof *r.v);
            cr_assert_not_null(r.v);
        }
        r.v[r.n++] = (int32_t)x;
        s = next;
        if (s < end && *s == ',')
            s++;
    }
    return r;
}

static struct ref_line *load_refs(const char *name, size_t *n_out)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/refs-%s.txt", refs_dir(), name);
    size_t size;
    char *text = test_read_file(path, &size);
    cr_assert_not_null(text, "cannot read %s", path);
    size_t cap = 4096, n = 0;
    struct ref_line *v = malloc(cap * sizeof *v);
    cr_assert_not_null(v);
    char *p = text, *end = text + size;
    while (p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *field[4];
        const char *field_end[4];
        const char *q = p;
        for (int f = 0; f < 4; f++) {
            field[f] = q;
            const char *tab = f < 3 ? memchr(q, '\t', (size_t)(eol - q)) : NULL;
            cr_assert(f == 3 || tab, "%s: line %zu has fewer than 4 fields", path, n + 1);
            field_end[f] = f < 3 ? tab : eol;
            q = field_end[f] + 1;
        }
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            cr_assert_not_null(v);
        }
        struct ref_line *r = &v[n++];
        r->id = strtol(field[0], NULL, 10);
        r->with_special = parse_ids(field[1], field_end[1]);
        r->without_special = parse_ids(field[2], field_end[2]);
        cr_assert(hex_decode(field[3], (size_t)(field_end[3] - field[3]), &r->decoded, &r->decoded_len),
                  "%s: id %ld: bad decoded hex", path, r->id);
        p = eol + 1;
    }
    free(text);
    *n_out = n;
    return v;
}

/* A short, printable rendering of bytes for failure messages. */
static void snippet(const char *s, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o > 60 && i + 1 < len) {
            o += (size_t)snprintf(out + o, cap - o, "...(%zu bytes)", len);
            break;
        }
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

/* "[a,b,c ...]" starting a little before the first difference with other. */
static void ids_text(const int32_t *v, int n, const int32_t *other, int n_other, char *out, size_t cap)
{
    int first = 0;
    while (first < n && first < n_other && v[first] == other[first])
        first++;
    int from = first > 3 ? first - 3 : 0;
    size_t o = (size_t)snprintf(out, cap, "n=%d [%s", n, from ? "... " : "");
    for (int i = from; i < n && i < from + 16 && o + 16 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%d", i > from ? "," : "", v[i]);
    snprintf(out + o, cap - o, "%s] (first difference at %d)", n > from + 16 ? " ..." : "", first);
}

static bool same_ids(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

struct tally {
    const char *what;
    int mismatches;
};

static void report_ids(struct tally *t, const struct corpus_entry *e, const struct ids *want,
                       const int32_t *got, int n_got, int rc, const struct err *err)
{
    if (rc == 0 && same_ids(want->v, want->n, got, n_got))
        return;
    if (t->mismatches++ >= SHOW_FIRST)
        return;
    char snip[256], w[512], g[512];
    snippet(e->bytes, e->len, snip, sizeof snip);
    ids_text(want->v, want->n, got, n_got, w, sizeof w);
    if (rc != 0)
        snprintf(g, sizeof g, "error %s: %.400s", err_code_name(err->code), err->msg);
    else
        ids_text(got, n_got, want->v, want->n, g, sizeof g);
    cr_log_error("%s: id %ld%s \"%s\"\n    expected %s\n    got      %s", t->what, e->id,
                 e->from_hex ? " (invalid UTF-8)" : "", snip, w, g);
}

static void check_tokenizer(const char *name)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: run scripts/fetch-tokenizers.sh DIR and set it to DIR "
                     "(make test does both)");
    char dir[1024], json_path[1100];
    snprintf(dir, sizeof dir, "%s/%s", data, name);
    snprintf(json_path, sizeof json_path, "%s/tokenizer.json", dir);
    struct stat st;
    if (stat(json_path, &st) != 0)
        cr_skip_test("%s is missing: run scripts/fetch-tokenizers.sh %s", json_path, data);

    struct err err = {0};
    struct tokenizer *tok = NULL;
    int rc = tok_load(dir, &tok, &err);
    cr_assert_eq(rc, 0, "tok_load %s: %s", dir, err.msg);

    size_t n_corpus, n_refs;
    struct corpus_entry *corpus = load_corpus(&n_corpus);
    struct ref_line *refs = load_refs(name, &n_refs);
    cr_assert_eq(n_corpus, n_refs, "corpus has %zu entries but refs-%s.txt has %zu lines: regenerate the refs "
                 "(tests/text/README.md)", n_corpus, name, n_refs);

    struct tally enc_sp = {"encode(add_special=true)", 0};
    struct tally enc_plain = {"encode(add_special=false)", 0};
    struct tally dec = {"decode(skip_special=false)", 0};
    for (size_t i = 0; i < n_corpus; i++) {
        const struct corpus_entry *e = &corpus[i];
        const struct ref_line *r = &refs[i];
        cr_assert_eq(e->id, r->id, "corpus line %zu is id %ld but refs-%s.txt says %ld", i + 1, e->id, name, r->id);

        int32_t *ids = NULL;
        int n_ids = 0;
        err_clear(&err);
        rc = tok_encode(tok, e->bytes, e->len, true, &ids, &n_ids, &err);
        report_ids(&enc_sp, e, &r->with_special, ids, rc == 0 ? n_ids : 0, rc, &err);
        free(ids);

        ids = NULL;
        n_ids = 0;
        err_clear(&err);
        rc = tok_encode(tok, e->bytes, e->len, false, &ids, &n_ids, &err);
        report_ids(&enc_plain, e, &r->without_special, ids, rc == 0 ? n_ids : 0, rc, &err);
        free(ids);

        /* Decode the reference ids, so a decode failure is not hidden behind an encode one. */
        char *text = NULL;
        size_t len = 0;
        err_clear(&err);
        rc = tok_decode(tok, r->without_special.v, r->without_special.n, false, &text, &len, &err);
        if (rc != 0 || len != r->decoded_len || memcmp(text, r->decoded, len) != 0) {
            if (dec.mismatches++ < SHOW_FIRST) {
                char snip[256], w[256], g[256];
                snippet(e->bytes, e->len, snip, sizeof snip);
                snippet(r->decoded, r->decoded_len, w, sizeof w);
                if (rc != 0)
                    snprintf(g, sizeof g, "error %s: %.200s", err_code_name(err.code), err.msg);
                else
                    snippet(text, len, g, sizeof g);
                cr_log_error("%s: id %ld%s \"%s\"\n    expected \"%s\"\n    got      \"%s\"", dec.what, e->id,
                             e->from_hex ? " (invalid UTF-8)" : "", snip, w, g);
            }
        }
        free(text);
    }

    cr_log_info("%s: %zu corpus entries; mismatches: %s %d, %s %d, %s %d", name, n_corpus, enc_sp.what,
                enc_sp.mismatches, enc_plain.what, enc_plain.mismatches, dec.what, dec.mismatches);
    int total = enc_sp.mismatches + enc_plain.mismatches + dec.mismatches;

    for (size_t i = 0; i < n_corpus; i++)
        free(corpus[i].bytes);
    for (size_t i = 0; i < n_refs; i++) {
        free(refs[i].with_special.v);
        free(refs[i].without_special.v);
        free(refs[i].decoded);
    }
    free(corpus);
    free(refs);
    tok_free(tok);

    cr_assert_eq(total, 0, "%s differs from the HF Rust reference: %d encode(add_special) + %d encode(plain) + "
                 "%d decode mismatches over %zu entries (first %d of each kind logged above)", name,
                 enc_sp.mismatches, enc_plain.mismatches, dec.mismatches, n_corpus, SHOW_FIRST);
}

Test(tokenizer_conformance, qwen3_encode_and_decode_equal_hf_rust_reference_on_corpus, .timeout = 600)
{
    check_tokenizer("qwen3");
}

Test(tokenizer_conformance, llama3_encode_and_decode_equal_hf_rust_reference_on_corpus, .timeout = 600)
{
    check_tokenizer("llama3");
}

Test(tokenizer_conformance, gemma3_encode_and_decode_equal_hf_rust_reference_on_corpus, .timeout = 600)
{
    check_tokenizer("gemma3");
}
