/* tests/unit/test_grammar.c — the grammar engine: each compiler's language, token masks against a
 * brute-force reference, random walks whose outputs parse and validate, the schema corpus,
 * forced bytes, rollback, and the real Qwen3 and Gemma 3 vocabularies. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/json.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

/* ---- helpers ------------------------------------------------------------------------ */

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static struct grammar *compile_schema_opts(const char *s, bool free_ws)
{
    struct grammar *g = NULL;
    struct err e = {0};
    struct grammar_options o = {.free_whitespace = free_ws};
    int rc = grammar_compile_json_schema(s, strlen(s), &o, &g, &e);
    cr_assert_eq(rc, 0, "schema %s: %s", s, e.msg);
    return g;
}

static struct grammar *compile_schema(const char *s)
{
    return compile_schema_opts(s, false);
}

static struct grammar *compile_regex(const char *s)
{
    struct grammar *g = NULL;
    struct err e = {0};
    int rc = grammar_compile_regex(s, strlen(s), NULL, &g, &e);
    cr_assert_eq(rc, 0, "regex %s: %s", s, e.msg);
    return g;
}

static struct grammar *compile_ebnf(const char *s)
{
    struct grammar *g = NULL;
    struct err e = {0};
    int rc = grammar_compile_ebnf(s, strlen(s), NULL, &g, &e);
    cr_assert_eq(rc, 0, "ebnf %s: %s", s, e.msg);
    return g;
}

/* A small vocabulary: every single byte, multi-byte pieces that span JSON terminals, UTF-8
 * characters, leading-space words, an empty token and two special tokens. */
static const char *const extra_tokens[] = {
    "{\"", "\":", "\",", "\"}", "\"]", "},", "}]", " \"", " {", "null", "true", "false", "12",
    "00", "-1", ".5", "e+", "\xC3\xA9", "\xC3\xBC", "\xE5\x90\x8D", "\\n", "\\\"", "\\u00", "abc",
    "the", " the", "name", "\":\"", "\",\"", "2024-", "T12:", ":00", "Z\"", "\"\"", "[]", "{}",
    "[{", "\"}]", " ", "  ", "\n", ", ", ": ", "\xF0\x9F\x98\x80", "id", "red", "blue", "1",
    "0", "-", "yes", "item_", "@", ".com", "abcdefgh", "\"a\"", "é\"", "\"é"};
#define N_EXTRA ((int)(sizeof extra_tokens / sizeof extra_tokens[0]))
#define SPECIAL_A (256 + N_EXTRA)
#define EMPTY_TOK (256 + N_EXTRA + 1)
#define SPECIAL_B (256 + N_EXTRA + 2)
#define SMALL_N (256 + N_EXTRA + 3)

static struct grammar_vocab *small_vocab(void)
{
    static char bytes[256];
    const char *toks[SMALL_N];
    size_t lens[SMALL_N];
    bool special[SMALL_N] = {0};
    for (int b = 0; b < 256; b++) {
        bytes[b] = (char)b;
        toks[b] = &bytes[b];
        lens[b] = 1;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        toks[256 + i] = extra_tokens[i];
        lens[256 + i] = strlen(extra_tokens[i]);
    }
    toks[SPECIAL_A] = "<|eos|>";
    lens[SPECIAL_A] = 7;
    special[SPECIAL_A] = true;
    toks[EMPTY_TOK] = "";
    lens[EMPTY_TOK] = 0;
    toks[SPECIAL_B] = "{";
    lens[SPECIAL_B] = 1;
    special[SPECIAL_B] = true;
    struct grammar_vocab *v = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_vocab_from_bytes(toks, lens, SMALL_N, special, &v, &e), 0, "%s", e.msg);
    return v;
}

static struct grammar_matcher *matcher(struct grammar *g, struct grammar_vocab *v)
{
    struct grammar_matcher *m = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_matcher_create(g, v, &m, &e), 0, "%s", e.msg);
    return m;
}

static bool accepts(struct grammar *g, const char *s)
{
    static struct grammar_vocab *v;
    if (!v)
        v = small_vocab();
    struct grammar_matcher *m = matcher(g, v);
    bool ok = grammar_matcher_accept_bytes(m, s, strlen(s)) == 0 && grammar_matcher_is_accepting(m);
    grammar_matcher_free(m);
    return ok;
}

#define YES(g, s) cr_expect(accepts(g, s), "should accept: %s", s)
#define NO(g, s) cr_expect(!accepts(g, s), "should reject: %s", s)

/* The mask at m's position against accepting each token (every one, or a sample of n) on the
 * matcher itself and rolling back. */
static void check_mask(struct grammar_matcher *m, struct grammar_vocab *v, int sample)
{
    int n = grammar_vocab_size(v);
    uint32_t *bits = calloc(((size_t)n + 31) / 32, sizeof *bits);
    bool eos;
    cr_assert_eq(grammar_matcher_fill_mask(m, bits, &eos), 0);
    cr_assert_eq(eos, grammar_matcher_is_accepting(m));
    int todo = sample > 0 && sample < n ? sample : n;
    for (int k = 0; k < todo; k++) {
        int32_t t = todo == n ? k : (int32_t)(rnd() % (uint64_t)n);
        bool bit = bits[t >> 5] >> (t & 31) & 1;
        bool ok = grammar_matcher_accept_token(m, t) == 0;
        if (ok)
            cr_assert_eq(grammar_matcher_rollback(m, 1), 0);
        size_t len;
        const char *p = grammar_vocab_token(v, t, &len);
        cr_assert_eq(bit, ok, "token %d '%.*s': mask says %d, accepting it says %d", t, (int)len, p,
                     bit, ok);
    }
    free(bits);
}

/* Picks random allowed tokens until EOS (taken with some chance where allowed, always when
 * nothing else is) or max_steps; after half the budget, tokens that close things are
 * preferred so unbounded grammars end. Returns whether it ended; the output goes to out. */
static bool random_walk(struct grammar *g, struct grammar_vocab *v, int max_steps, int check_every,
                        int sample, char *out, size_t cap)
{
    struct grammar_matcher *m = matcher(g, v);
    int n = grammar_vocab_size(v);
    uint32_t *bits = calloc(((size_t)n + 31) / 32, sizeof *bits);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    int32_t *closing = malloc((size_t)n * sizeof *closing);
    size_t len = 0;
    bool ended = false;
    for (int step = 0; step < max_steps; step++) {
        if (check_every && step % check_every == 0)
            check_mask(m, v, sample);
        bool eos;
        cr_assert_eq(grammar_matcher_fill_mask(m, bits, &eos), 0);
        int na = 0, nc = 0;
        for (int t = 0; t < n; t++)
            if (bits[t >> 5] >> (t & 31) & 1) {
                allowed[na++] = t;
                size_t tl;
                const char *p = grammar_vocab_token(v, t, &tl);
                if (memchr(p, '"', tl) || memchr(p, '}', tl) || memchr(p, ']', tl))
                    closing[nc++] = t;
            }
        if (eos && (na == 0 || rnd() % 4 == 0 || step > max_steps / 2)) {
            cr_assert(grammar_matcher_is_accepting(m));
            ended = true;
            break;
        }
        cr_assert(na > 0, "a dead end after '%.*s'", (int)len, out);
        int32_t t = step > max_steps / 3 && nc && rnd() % 3 ? closing[rnd() % (uint64_t)nc]
                                                            : allowed[rnd() % (uint64_t)na];
        cr_assert_eq(grammar_matcher_accept_token(m, t), 0);
        size_t tl;
        const char *p = grammar_vocab_token(v, t, &tl);
        if (len + tl < cap) {
            memcpy(out + len, p, tl);
            len += tl;
        }
        out[len] = 0;
    }
    out[len] = 0;
    free(bits);
    free(allowed);
    free(closing);
    grammar_matcher_free(m);
    return ended;
}

/* ---- a small JSON Schema validator, independent of the compiler ---------------------------- */

static bool validate(struct json_object *root, struct json_object *s, struct json_object *v, int depth);

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool re_search(const char *pat, const char *s)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    cr_assert(re, "validator: pattern %s", pat);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    bool ok = pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL) >= 0;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return ok;
}

static bool check_format(const char *f, const char *s)
{
    if (!strcmp(f, "date") || !strcmp(f, "date-time")) {
        int y, mo, d;
        char rest[64] = "";
        if (sscanf(s, "%4d-%2d-%2d%63s", &y, &mo, &d, rest) < 3 || mo < 1 || mo > 12 || d < 1)
            return false;
        static const int dim[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        if (d > dim[mo - 1] || (mo == 2 && d == 29 && !leap))
            return false;
        if (!strcmp(f, "date"))
            return strlen(s) == 10;
        return rest[0] == 'T' && check_format("time", rest + 1);
    }
    if (!strcmp(f, "time"))
        return re_search("^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-][0-9][0-9]:[0-9][0-9])$", s);
    if (!strcmp(f, "uuid"))
        return re_search("^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$", s);
    if (!strcmp(f, "email"))
        return re_search("^[^@\\s]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$", s);
    if (!strcmp(f, "ipv4")) {
        int a[4], n = 0;
        if (sscanf(s, "%d.%d.%d.%d%n", &a[0], &a[1], &a[2], &a[3], &n) != 4 || s[n])
            return false;
        for (int i = 0; i < 4; i++)
            if (a[i] < 0 || a[i] > 255)
                return false;
        return !re_search("(^|\\.)0[0-9]", s);
    }
    return false;
}

static struct json_object *resolve(struct json_object *root, const char *ref)
{
    struct json_object *cur = root;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ref + 1);
    for (char *seg = strtok(buf, "/"); seg && cur; seg = strtok(NULL, "/")) {
        struct json_object *n = NULL;
        json_object_object_get_ex(cur, seg, &n);
        cur = n;
    }
    return cur;
}

static bool type_is(const char *t, struct json_object *v)
{
    enum json_type jt = json_object_get_type(v);
    if (!strcmp(t, "null"))
        return jt == json_type_null;
    if (!strcmp(t, "boolean"))
        return jt == json_type_boolean;
    if (!strcmp(t, "string"))
        return jt == json_type_string;
    if (!strcmp(t, "integer"))
        return jt == json_type_int || (jt == json_type_double && json_object_get_double(v) == floor(json_object_get_double(v)));
    if (!strcmp(t, "number"))
        return jt == json_type_int || jt == json_type_double;
    if (!strcmp(t, "object"))
        return jt == json_type_object;
    if (!strcmp(t, "array"))
        return jt == json_type_array;
    return false;
}

static bool validate(struct json_object *root, struct json_object *s, struct json_object *v, int depth)
{
    if (depth > 200)
        return false;
    if (json_object_is_type(s, json_type_boolean))
        return json_object_get_boolean(s);
    struct json_object *k;
    if (json_object_object_get_ex(s, "$ref", &k))
        return validate(root, resolve(root, json_object_get_string(k)), v, depth + 1);
    if (json_object_object_get_ex(s, "nullable", &k) && json_object_get_boolean(k) && !v)
        return true;
    if (json_object_object_get_ex(s, "allOf", &k)) {
        for (size_t i = 0; i < json_object_array_length(k); i++) {
            struct json_object *part = json_object_array_get_idx(k, i);
            /* allOf parts here are objects; additionalProperties false at the top applies to
             * the union of their properties, so check the parts' own keywords only */
            if (!validate(root, part, v, depth + 1))
                return false;
        }
    }
    const char *alt = json_object_object_get_ex(s, "anyOf", &k) ? "anyOf"
                      : json_object_object_get_ex(s, "oneOf", &k) ? "oneOf" : NULL;
    if (alt) {
        int hits = 0;
        for (size_t i = 0; i < json_object_array_length(k); i++)
            hits += validate(root, json_object_array_get_idx(k, i), v, depth + 1);
        if (!strcmp(alt, "oneOf") ? hits != 1 : hits == 0)
            return false;
    }
    if (json_object_object_get_ex(s, "enum", &k)) {
        bool hit = false;
        for (size_t i = 0; i < json_object_array_length(k) && !hit; i++)
            hit = json_object_equal(json_object_array_get_idx(k, i), v);
        if (!hit)
            return false;
    }
    if (json_object_object_get_ex(s, "const", &k) && !json_object_equal(k, v))
        return false;
    if (json_object_object_get_ex(s, "type", &k)) {
        bool hit = false;
        if (json_object_is_type(k, json_type_string))
            hit = type_is(json_object_get_string(k), v);
        else
            for (size_t i = 0; i < json_object_array_length(k) && !hit; i++)
                hit = type_is(json_object_get_string(json_object_array_get_idx(k, i)), v);
        if (!hit)
            return false;
    }
    if (json_object_is_type(v, json_type_string)) {
        const char *str = json_object_get_string(v);
        size_t n = utf8_chars(str);
        if (json_object_object_get_ex(s, "minLength", &k) && n < (size_t)json_object_get_int(k))
            return false;
        if (json_object_object_get_ex(s, "maxLength", &k) && n > (size_t)json_object_get_int(k))
            return false;
        if (json_object_object_get_ex(s, "pattern", &k) && !re_search(json_object_get_string(k), str))
            return false;
        if (json_object_object_get_ex(s, "format", &k) && !check_format(json_object_get_string(k), str))
            return false;
    }
    if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) {
        double x = json_object_get_double(v);
        struct json_object *ex;
        bool ex_min_bool = json_object_object_get_ex(s, "exclusiveMinimum", &ex) &&
                           json_object_is_type(ex, json_type_boolean) && json_object_get_boolean(ex);
        bool ex_max_bool = json_object_object_get_ex(s, "exclusiveMaximum", &ex) &&
                           json_object_is_type(ex, json_type_boolean) && json_object_get_boolean(ex);
        if (json_object_object_get_ex(s, "minimum", &k) &&
            (ex_min_bool ? x <= json_object_get_double(k) : x < json_object_get_double(k)))
            return false;
        if (json_object_object_get_ex(s, "maximum", &k) &&
            (ex_max_bool ? x >= json_object_get_double(k) : x > json_object_get_double(k)))
            return false;
        if (json_object_object_get_ex(s, "exclusiveMinimum", &k) && !json_object_is_type(k, json_type_boolean) &&
            x <= json_object_get_double(k))
            return false;
        if (json_object_object_get_ex(s, "exclusiveMaximum", &k) && !json_object_is_type(k, json_type_boolean) &&
            x >= json_object_get_double(k))
            return false;
    }
    if (json_object_is_type(v, json_type_object)) {
        struct json_object *props = NULL, *addl = NULL, *req = NULL;
        json_object_object_get_ex(s, "properties", &props);
        json_object_object_get_ex(s, "additionalProperties", &addl);
        json_object_object_get_ex(s, "required", &req);
        for (size_t i = 0; req && i < json_object_array_length(req); i++) {
            struct json_object *x;
            if (!json_object_object_get_ex(v, json_object_get_string(json_object_array_get_idx(req, i)), &x))
                return false;
        }
        /* allOf's parts declare the properties an additionalProperties false beside it allows */
        struct json_object *all = NULL;
        json_object_object_get_ex(s, "allOf", &all);
        json_object_object_foreach(v, key, val)
        {
            struct json_object *ps = NULL;
            if (props && json_object_object_get_ex(props, key, &ps)) {
                if (!validate(root, ps, val, depth + 1))
                    return false;
                continue;
            }
            bool in_all = false;
            for (size_t i = 0; all && i < json_object_array_length(all) && !in_all; i++) {
                struct json_object *part = json_object_array_get_idx(all, i), *r, *pp;
                if (json_object_object_get_ex(part, "$ref", &r))
                    part = resolve(root, json_object_get_string(r));
                in_all = json_object_object_get_ex(part, "properties", &pp) &&
                         json_object_object_get_ex(pp, key, &r);
            }
            if (in_all)
                continue;
            if (addl && !validate(root, addl, val, depth + 1))
                return false;
        }
    }
    if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v);
        struct json_object *items = NULL, *prefix = NULL;
        json_object_object_get_ex(s, "items", &items);
        json_object_object_get_ex(s, "prefixItems", &prefix);
        if (json_object_object_get_ex(s, "minItems", &k) && n < (size_t)json_object_get_int(k))
            return false;
        if (json_object_object_get_ex(s, "maxItems", &k) && n > (size_t)json_object_get_int(k))
            return false;
        size_t np = prefix ? json_object_array_length(prefix) : 0;
        for (size_t i = 0; i < n; i++) {
            struct json_object *es = i < np ? json_object_array_get_idx(prefix, i) : items;
            if (es && !validate(root, es, json_object_array_get_idx(v, i), depth + 1))
                return false;
        }
    }
    return true;
}

/* Parses out strictly and validates it under the schema text. */
static void expect_valid(const char *schema, const char *out)
{
    struct json_object *s = NULL, *v = NULL;
    struct err e = {0};
    cr_assert_eq(json_text_parse(schema, strlen(schema), 200, true, &s, &e), 0);
    int rc = json_text_parse(out, strlen(out), 200, true, &v, &e);
    cr_assert_eq(rc, 0, "output does not parse (%s): %s\nschema: %s", e.msg, out, schema);
    cr_expect(validate(s, s, v, 0), "output does not validate: %s\nschema: %s", out, schema);
    json_object_put(s);
    json_object_put(v);
}

/* ---- each compiler's language --------------------------------------------------------------- */

Test(grammar_schema, objects_keep_property_order_and_required_keys)
{
    struct grammar *g = compile_schema(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
        "\"c\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"c\"]}");
    YES(g, "{\"a\":1,\"c\":true}");
    YES(g, "{\"a\":-20,\"b\":\"x\",\"c\":false}");
    NO(g, "{\"c\":true,\"a\":1}");
    NO(g, "{\"a\":1}");
    NO(g, "{\"a\":1,\"c\":true,\"d\":1}");
    NO(g, "{ \"a\":1,\"c\":true}");
    grammar_free(g);
}

Test(grammar_schema, free_whitespace_allows_json_whitespace)
{
    struct grammar *g = compile_schema_opts(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},"
        "\"required\":[\"a\"]}", true);
    YES(g, "{ \"a\" : [ 1 , 2 ]\n}");
    YES(g, "{\"a\":[]}");
    NO(g, "{\"a\":[1,]}");
    grammar_free(g);
}

Test(grammar_schema, strings_count_characters_and_escapes)
{
    struct grammar *g = compile_schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    YES(g, "\"ab\"");
    YES(g, "\"\xC3\xA9\xE5\x90\x8D\xF0\x9F\x98\x80\"");
    YES(g, "\"a\\n\\\"\"");
    YES(g, "\"\\u00e9x\"");
    NO(g, "\"a\"");
    NO(g, "\"abcd\"");
    NO(g, "\"a\nb\"");
    NO(g, "\"\\ud800x\"");
    NO(g, "\"\xC3\"");
    NO(g, "\"\xED\xA0\x80x\"");
    grammar_free(g);
}

Test(grammar_schema, integer_bounds_are_exact)
{
    struct grammar *g = compile_schema("{\"type\":\"integer\",\"minimum\":-15,\"exclusiveMaximum\":1000}");
    YES(g, "-15");
    YES(g, "0");
    YES(g, "999");
    NO(g, "1000");
    NO(g, "-16");
    NO(g, "-0");
    NO(g, "007");
    NO(g, "1.0");
    grammar_free(g);
    g = compile_schema("{\"type\":\"integer\",\"minimum\":100}");
    YES(g, "100");
    YES(g, "123456789012345678901234");
    NO(g, "99");
    NO(g, "-100");
    grammar_free(g);
}

Test(grammar_schema, number_bounds_cover_the_integer_part)
{
    struct grammar *g = compile_schema("{\"type\":\"number\",\"minimum\":-2,\"maximum\":3.5}");
    YES(g, "-2");
    YES(g, "-1.75");
    YES(g, "0.5");
    YES(g, "3");
    YES(g, "2.999");
    NO(g, "4");
    NO(g, "-2.5");
    NO(g, "1e5");
    NO(g, "3.6");
    grammar_free(g);
    g = compile_schema("{\"type\":\"number\"}");
    YES(g, "-0.5e+10");
    YES(g, "12");
    NO(g, "01");
    NO(g, ".5");
    grammar_free(g);
}

Test(grammar_schema, enum_const_anyof_nullable_and_type_lists)
{
    struct grammar *g = compile_schema("{\"enum\":[\"a\\\"b\",1,null,{\"x\":[true]}]}");
    YES(g, "\"a\\\"b\"");
    YES(g, "1");
    YES(g, "null");
    YES(g, "{\"x\":[true]}");
    NO(g, "2");
    grammar_free(g);
    g = compile_schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}");
    YES(g, "5");
    YES(g, "\"x\"");
    NO(g, "\"xy\"");
    grammar_free(g);
    g = compile_schema("{\"type\":[\"boolean\",\"null\"]}");
    YES(g, "true");
    YES(g, "null");
    NO(g, "0");
    grammar_free(g);
    g = compile_schema("{\"type\":\"integer\",\"nullable\":true}");
    YES(g, "null");
    YES(g, "3");
    grammar_free(g);
    g = compile_schema("{\"const\":\"fixed\"}");
    YES(g, "\"fixed\"");
    NO(g, "\"fixe\"");
    grammar_free(g);
}

Test(grammar_schema, arrays_with_prefix_items_and_counts)
{
    struct grammar *g = compile_schema("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
                                       "\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}");
    YES(g, "[\"a\"]");
    YES(g, "[\"a\",1]");
    YES(g, "[\"a\",1,true]");
    NO(g, "[]");
    NO(g, "[\"a\",1,true,false]");
    NO(g, "[1]");
    grammar_free(g);
    g = compile_schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}");
    NO(g, "[1]");
    YES(g, "[1,2,3,4,5]");
    grammar_free(g);
}

Test(grammar_schema, refs_recurse_and_allof_merges)
{
    struct grammar *g = compile_schema(
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/t\"}");
    YES(g, "{\"v\":1,\"kids\":[]}");
    YES(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]}]}");
    NO(g, "{\"v\":1,\"kids\":[{\"v\":2}]}");
    grammar_free(g);
    g = compile_schema("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                       "{\"properties\":{\"b\":{\"type\":\"null\"}},\"required\":[\"b\"]}]}");
    YES(g, "{\"a\":1,\"b\":null}");
    NO(g, "{\"a\":1}");
    grammar_free(g);
}

Test(grammar_schema, additional_properties_never_repeat_a_declared_key)
{
    struct grammar *g = compile_schema("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},"
                                       "\"additionalProperties\":{\"type\":\"string\"}}");
    YES(g, "{\"ab\":1,\"a\":\"x\"}");
    YES(g, "{\"abc\":\"x\"}");
    YES(g, "{}");
    NO(g, "{\"ab\":1,\"ab\":\"x\"}");
    NO(g, "{\"ab\":\"x\"}");
    grammar_free(g);
}

Test(grammar_schema, patterns_and_formats)
{
    struct grammar *g = compile_schema("{\"type\":\"string\",\"pattern\":\"^[a-z]+-\\\\d{2}$\"}");
    YES(g, "\"ab-12\"");
    NO(g, "\"ab-1\"");
    grammar_free(g);
    g = compile_schema("{\"type\":\"string\",\"pattern\":\"x\\\"y\"}");
    YES(g, "\"..x\\\"y..\"");
    NO(g, "\"xy\"");
    grammar_free(g);
    const char *fmts[][3] = {{"date", "\"2024-02-28\"", "\"2024-13-01\""},
                             {"time", "\"23:59:59.5+02:00\"", "\"24:00:00Z\""},
                             {"date-time", "\"2024-01-31T00:00:00Z\"", "\"2024-04-31T00:00:00Z\""},
                             {"uuid", "\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567\""},
                             {"email", "\"a.b@ex-ample.com\"", "\"a@b\""},
                             {"ipv4", "\"192.168.0.255\"", "\"256.1.1.1\""}};
    for (int i = 0; i < 6; i++) {
        char s[128];
        snprintf(s, sizeof s, "{\"type\":\"string\",\"format\":\"%s\"}", fmts[i][0]);
        g = compile_schema(s);
        cr_expect(accepts(g, fmts[i][1]), "%s should accept %s", fmts[i][0], fmts[i][1]);
        cr_expect(!accepts(g, fmts[i][2]), "%s should reject %s", fmts[i][0], fmts[i][2]);
        grammar_free(g);
    }
}

Test(grammar_schema, unsupported_keywords_name_their_path)
{
    struct {
        const char *schema, *msg;
        int code;
    } cases[] = {
        {"{\"properties\":{\"a\":{\"patternProperties\":{}}}}", "schema.properties.a.patternProperties: not supported",
         INFERD_EUNSUPPORTED},
        {"{\"type\":\"array\",\"items\":{\"not\":{}}}", "schema.items.not: not supported", INFERD_EUNSUPPORTED},
        {"{\"anyOf\":[{\"type\":\"string\",\"format\":\"hostname\"}]}", "schema.anyOf[0].format", INFERD_EUNSUPPORTED},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve", INFERD_EINVAL},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer", INFERD_EINVAL},
        {"false", "matches nothing", INFERD_EINVAL},
        {"{\"type\":\"strin\"}", "unknown type", INFERD_EFORMAT},
        {"{\"type\":", "not valid JSON", INFERD_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = NULL;
        struct err e = {0};
        int rc = grammar_compile_json_schema(cases[i].schema, strlen(cases[i].schema), NULL, &g, &e);
        cr_expect_eq(rc, -cases[i].code, "%s: rc %d (%s)", cases[i].schema, rc, e.msg);
        cr_expect(strstr(e.msg, cases[i].msg), "%s: message '%s'", cases[i].schema, e.msg);
        cr_expect_null(g);
    }
}

Test(grammar_schema, json_object_is_any_object)
{
    struct grammar *g = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_compile_json_object(NULL, &g, &e), 0, "%s", e.msg);
    YES(g, "{}");
    YES(g, "{\"a\":[1,{\"b\":null}],\"c\":\"\xC3\xA9\"}");
    NO(g, "[]");
    NO(g, "{\"a\"}");
    grammar_free(g);
}

Test(grammar_regex, literals_classes_groups_and_counts)
{
    struct grammar *g = compile_regex("(ab|c)+[x-z]{2,3}\\d?\\.");
    YES(g, "abxx.");
    YES(g, "cabyyz9.");
    NO(g, "xx.");
    NO(g, "abx.");
    NO(g, "abxxxx.");
    grammar_free(g);
    g = compile_regex("[^a\\n]\\w\\s.");
    YES(g, "\xC3\xA9_ !");
    NO(g, "a_ !");
    NO(g, "b_ \n");
    grammar_free(g);
    g = compile_regex("^\\u00e9{2}(?:x|\\x41)$");
    YES(g, "\xC3\xA9\xC3\xA9x");
    YES(g, "\xC3\xA9\xC3\xA9" "A");
    grammar_free(g);
}

Test(grammar_regex, backreferences_and_lookaround_are_refused)
{
    const char *bad[] = {"(a)\\1", "a(?=b)", "a(?!b)", "a\\b", "(ab", "ab)", "*a", "a{3,1}", "[b-a]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct grammar *g = NULL;
        struct err e = {0};
        int rc = grammar_compile_regex(bad[i], strlen(bad[i]), NULL, &g, &e);
        cr_expect_neq(rc, 0, "%s compiled", bad[i]);
        cr_expect(strstr(e.msg, "at byte"), "%s: %s", bad[i], e.msg);
    }
}

Test(grammar_ebnf, arithmetic_and_json_grammars)
{
    struct grammar *g = compile_ebnf("# arithmetic\nroot ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\n"
                                     "term ::= factor ((\"*\" | \"/\") factor)*\n"
                                     "factor ::= [0-9]+ | \"(\" expr \")\"\n");
    YES(g, "1+2*3");
    YES(g, "(1+2)*(3-4)/5");
    NO(g, "1+");
    NO(g, "(1");
    grammar_free(g);
    g = compile_ebnf(
        "root   ::= object\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::=\n  \"{\" ws (\n            string \":\" ws value\n    (\",\" ws string \":\" ws value)*\n  )? \"}\" ws\n"
        "array  ::=\n  \"[\" ws (\n            value\n    (\",\" ws value)*\n  )? \"]\" ws\n"
        "string ::=\n  \"\\\"\" (\n    [^\"\\\\\\x7F\\x00-\\x1F] |\n    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n  )* \"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
    YES(g, "{\"a\": [1, 2.5, \"x\\n\"], \"b\": {\"c\": null}}");
    NO(g, "{\"a\" 1}");
    grammar_free(g);
}

Test(grammar_ebnf, errors_say_where)
{
    struct {
        const char *text, *msg;
    } cases[] = {{"root ::= foo", "'foo' is used but not defined"},
                 {"start ::= \"a\"", "no root rule"},
                 {"root ::= \"a", "unterminated string"},
                 {"root ::= a\na ::= a \"x\" | \"y\"", "left-recursive"},
                 {"root ::= [a-", "unclosed character class"},
                 {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
                 {"root ::= x\nx ::= x", "matches nothing"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = NULL;
        struct err e = {0};
        int rc = grammar_compile_ebnf(cases[i].text, strlen(cases[i].text), NULL, &g, &e);
        cr_expect_neq(rc, 0, "%s compiled", cases[i].text);
        cr_expect(strstr(e.msg, cases[i].msg), "%s: '%s'", cases[i].text, e.msg);
    }
}

Test(grammar_choice, exactly_one_of_the_strings)
{
    const char *ch[] = {"yes", "no", "yes!", "\xC3\xA9"};
    size_t lens[] = {3, 2, 4, 2};
    struct grammar *g = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_compile_choice(ch, lens, 4, NULL, &g, &e), 0, "%s", e.msg);
    YES(g, "yes");
    YES(g, "yes!");
    YES(g, "\xC3\xA9");
    NO(g, "ye");
    NO(g, "no!");
    grammar_free(g);
    cr_expect_eq(grammar_compile_choice(ch, lens, 0, NULL, &g, &e), -INFERD_EINVAL);
}

Test(grammar_limits, max_states_bounds_compiles)
{
    struct grammar *g = NULL;
    struct err e = {0};
    struct grammar_options o = {.max_states = 200};
    const char *re = "(a|b)*a(a|b){12}";
    cr_expect_eq(grammar_compile_regex(re, strlen(re), &o, &g, &e), -INFERD_ERANGE);
    cr_expect(strstr(e.msg, "too large"), "%s", e.msg);
    const char *s = "{\"type\":\"string\",\"maxLength\":5000}";
    cr_expect_eq(grammar_compile_json_schema(s, strlen(s), &o, &g, &e), -INFERD_ERANGE);
    cr_expect_eq(grammar_compile_regex("a{1000}", 7, &o, &g, &e), -INFERD_ERANGE);
}

/* An automaton within the state limit whose subsets hold thousands of expression states
 * each (every count of b from 0 to 12,100) is refused as too complex, not built for minutes;
 * the same shape at a small count still compiles. */
Test(grammar_limits, subset_work_bounds_compiles)
{
    struct grammar *g = NULL;
    struct err e = {0};
    const char *re = "(||b){110}{110}";
    cr_expect_eq(grammar_compile_regex(re, strlen(re), NULL, &g, &e), -INFERD_ERANGE);
    cr_expect(strstr(e.msg, "too complex"), "%s", e.msg);
    cr_expect_null(g);
    const char *small = "(||b){10}{10}";
    cr_assert_eq(grammar_compile_regex(small, strlen(small), NULL, &g, &e), 0, "%s", e.msg);
    char b[102];
    memset(b, 'b', sizeof b - 1);
    b[100] = '\0';
    YES(g, "");
    YES(g, b); /* 100: ten of ten */
    b[100] = 'b';
    b[101] = '\0';
    NO(g, b);
    grammar_free(g);
}

Test(grammar_digest, same_content_same_digest)
{
    struct grammar *a = compile_schema("{\"type\":\"integer\"}");
    struct grammar *b = compile_schema("{ \"type\" : \"integer\" }");
    struct grammar *c = compile_schema("{\"type\":\"string\"}");
    cr_expect_eq(grammar_digest(a), grammar_digest(b));
    cr_expect_neq(grammar_digest(a), grammar_digest(c));
    grammar_free(a);
    grammar_free(b);
    grammar_free(c);
}

/* ---- the matcher ------------------------------------------------------------------------ */

Test(grammar_matcher, masks_match_brute_force_on_a_small_vocabulary)
{
    struct grammar_vocab *v = small_vocab();
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"id\":{\"type\":\"integer\","
        "\"minimum\":-5,\"maximum\":1200},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"blue\"]},\"maxItems\":3}},"
        "\"required\":[\"name\",\"id\"],\"additionalProperties\":false}",
        "{\"anyOf\":[{\"type\":\"string\",\"format\":\"date-time\"},{\"type\":\"number\"},{\"type\":\"null\"}]}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}",
    };
    char out[4096];
    for (int i = 0; i < 3; i++) {
        struct grammar *g = compile_schema(schemas[i]);
        for (int w = 0; w < 4; w++) {
            rng_state = 1234 + (uint64_t)w * 77 + (uint64_t)i;
            if (random_walk(g, v, 60, 1, 0, out, sizeof out))
                expect_valid(schemas[i], out);
        }
        grammar_free(g);
    }
    struct grammar *g = compile_schema_opts(schemas[0], true);
    rng_state = 99;
    if (random_walk(g, v, 80, 1, 0, out, sizeof out))
        expect_valid(schemas[0], out);
    grammar_free(g);
    grammar_vocab_free(v);
}

Test(grammar_matcher, special_and_empty_tokens_are_never_allowed)
{
    struct grammar_vocab *v = small_vocab();
    struct grammar *g = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_compile_json_object(NULL, &g, &e), 0);
    struct grammar_matcher *m = matcher(g, v);
    uint32_t bits[(SMALL_N + 31) / 32];
    bool eos;
    cr_assert_eq(grammar_matcher_fill_mask(m, bits, &eos), 0);
    cr_expect(!(bits[SPECIAL_B >> 5] >> (SPECIAL_B & 31) & 1), "a special token spelled '{' was allowed");
    cr_expect(!(bits[SPECIAL_A >> 5] >> (SPECIAL_A & 31) & 1));
    cr_expect(!(bits[EMPTY_TOK >> 5] >> (EMPTY_TOK & 31) & 1));
    cr_expect(bits['{' >> 5] >> ('{' & 31) & 1);
    cr_expect(!eos);
    cr_expect_eq(grammar_matcher_accept_token(m, SPECIAL_B), -INFERD_EINVAL);
    cr_expect_eq(grammar_matcher_accept_token(m, EMPTY_TOK), -INFERD_EINVAL);
    cr_expect_eq(grammar_matcher_accept_token(m, -1), -INFERD_EINVAL);
    cr_expect_eq(grammar_matcher_accept_token(m, SMALL_N), -INFERD_EINVAL);
    grammar_matcher_free(m);
    grammar_free(g);
    grammar_vocab_free(v);
}

Test(grammar_matcher, tokens_span_terminals_and_utf8_splits_across_tokens)
{
    struct grammar_vocab *v = small_vocab();
    struct grammar *g = compile_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
                                       "\"required\":[\"a\"],\"additionalProperties\":false}");
    struct grammar_matcher *m = matcher(g, v);
    int32_t open_q = 256 + 0;   /* {" */
    int32_t close_colon = 256 + 27; /* ":" */
    cr_assert_str_eq(extra_tokens[27], "\":\"");
    cr_expect_eq(grammar_matcher_accept_token(m, open_q), 0);
    cr_expect_eq(grammar_matcher_accept_token(m, 'a'), 0);
    cr_expect_eq(grammar_matcher_accept_token(m, close_colon), 0);
    /* é as two single-byte tokens, then an invalid continuation is refused */
    cr_expect_eq(grammar_matcher_accept_token(m, 0xC3), 0);
    check_mask(m, v, 0);
    cr_expect_eq(grammar_matcher_accept_token(m, 'x'), -INFERD_EINVAL);
    cr_expect_eq(grammar_matcher_accept_token(m, 0xA9), 0);
    cr_expect_eq(grammar_matcher_accept_token(m, 256 + 3), 0); /* "} */
    cr_expect(grammar_matcher_is_finished(m));
    grammar_matcher_free(m);
    grammar_free(g);
    grammar_vocab_free(v);
}

Test(grammar_matcher, forced_bytes_and_rollback)
{
    struct grammar_vocab *v = small_vocab();
    struct grammar *g = compile_schema("{\"type\":\"object\",\"properties\":{\"first_name\":{\"type\":\"string\"},"
                                       "\"age\":{\"type\":\"integer\"}},\"required\":[\"first_name\",\"age\"],"
                                       "\"additionalProperties\":false}");
    struct grammar_matcher *m = matcher(g, v);
    char buf[64];
    size_t n = grammar_matcher_forced_bytes(m, buf, sizeof buf);
    cr_expect_eq(n, 15);
    cr_expect(!memcmp(buf, "{\"first_name\":\"", 15), "%.*s", (int)n, buf);
    cr_expect_eq(grammar_matcher_forced_bytes(m, buf, 4), 4);
    cr_assert_eq(grammar_matcher_accept_bytes(m, "{\"first_name\":\"Al", 17), 0);
    cr_expect_eq(grammar_matcher_forced_bytes(m, buf, sizeof buf), 0);
    cr_assert_eq(grammar_matcher_accept_token(m, '"'), 0);
    n = grammar_matcher_forced_bytes(m, buf, sizeof buf);
    cr_expect_eq(n, 7);
    cr_expect(!memcmp(buf, ",\"age\":", 7));
    cr_assert_eq(grammar_matcher_accept_bytes(m, ",\"age\":12}", 10), 0);
    cr_expect(grammar_matcher_is_finished(m));
    cr_expect_eq(grammar_matcher_forced_bytes(m, buf, sizeof buf), 0);
    /* back two steps: before ,"age":12} and before the closing quote */
    cr_expect_eq(grammar_matcher_rollback(m, 5), -INFERD_EINVAL);
    cr_assert_eq(grammar_matcher_rollback(m, 2), 0);
    cr_expect(!grammar_matcher_is_accepting(m));
    cr_expect_eq(grammar_matcher_accept_bytes(m, "x\",\"age\":-3}", 12), 0);
    cr_expect(grammar_matcher_is_accepting(m));
    check_mask(m, v, 0);
    cr_assert_eq(grammar_matcher_rollback(m, 1), 0);
    check_mask(m, v, 0);
    /* a rejected step changes nothing */
    cr_expect_eq(grammar_matcher_accept_bytes(m, "\"}", 2), -INFERD_EINVAL);
    cr_expect_eq(grammar_matcher_accept_bytes(m, "\",\"age\":0}", 10), 0);
    cr_expect(grammar_matcher_is_finished(m));
    grammar_matcher_reset(m);
    cr_expect_eq(grammar_matcher_forced_bytes(m, buf, sizeof buf), 15);
    grammar_matcher_free(m);
    grammar_free(g);
    grammar_vocab_free(v);
}

Test(grammar_matcher, bounded_schemas_always_finish)
{
    struct grammar_vocab *v = small_vocab();
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4},\"b\":{\"type\":\"array\","
                    "\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},\"maxItems\":3},\"c\":{\"type\":\"number\","
                    "\"minimum\":0,\"maximum\":1}},\"required\":[\"a\",\"b\",\"c\"],\"additionalProperties\":false}";
    struct grammar *g = compile_schema(s);
    uint32_t bits[(SMALL_N + 31) / 32];
    for (int w = 0; w < 20; w++) {
        rng_state = 5000 + (uint64_t)w;
        struct grammar_matcher *m = matcher(g, v);
        char out[512];
        size_t len = 0;
        int steps = 0;
        /* never take EOS while anything else is allowed: the language must still end */
        for (;; steps++) {
            bool eos;
            cr_assert_eq(grammar_matcher_fill_mask(m, bits, &eos), 0);
            int32_t pick[SMALL_N];
            int na = 0;
            for (int t = 0; t < SMALL_N; t++)
                if (bits[t >> 5] >> (t & 31) & 1)
                    pick[na++] = t;
            if (!na) {
                cr_assert(eos && grammar_matcher_is_finished(m));
                break;
            }
            cr_assert_lt(steps, 200, "a bounded schema did not end: %.*s", (int)len, out);
            int32_t t = pick[rnd() % (uint64_t)na];
            cr_assert_eq(grammar_matcher_accept_token(m, t), 0);
            size_t tl;
            const char *p = grammar_vocab_token(v, t, &tl);
            memcpy(out + len, p, tl);
            len += tl;
        }
        out[len] = 0;
        expect_valid(s, out);
        grammar_matcher_free(m);
    }
    grammar_free(g);
    grammar_vocab_free(v);
}

/* ---- the corpus ----------------------------------------------------------------------------- */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

Test(grammar_corpus, every_schema_compiles_or_fails_as_expected_and_walks_validate)
{
    const char *dir = INFERD_SOURCE_DIR "/tests/grammar/schemas";
    char *expected = read_text(INFERD_SOURCE_DIR "/tests/grammar/expected_errors.txt");
    cr_assert(expected);
    DIR *d = opendir(dir);
    cr_assert(d);
    char *names[1024];
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < 1024;)
        if (strstr(de->d_name, ".json"))
            names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    cr_assert_geq(n, 200, "the corpus has %d schemas", n);
    struct grammar_vocab *v = small_vocab();
    int compiled = 0, refused = 0, walks = 0, ended = 0;
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char *schema = read_text(path);
        struct grammar *g = NULL;
        struct err e = {0};
        int rc = grammar_compile_json_schema(schema, strlen(schema), NULL, &g, &e);
        const char *line = strstr(expected, names[i]);
        if (line) {
            char want[256];
            const char *sp = line + strlen(names[i]) + 1, *nl = strchr(sp, '\n');
            snprintf(want, sizeof want, "%.*s", (int)(nl ? nl - sp : (long)strlen(sp)), sp);
            cr_expect_neq(rc, 0, "%s compiled", names[i]);
            cr_expect(strstr(e.msg, want), "%s: '%s' lacks '%s'", names[i], e.msg, want);
            refused++;
        } else {
            cr_expect_eq(rc, 0, "%s: %s", names[i], e.msg);
            if (!rc) {
                compiled++;
                for (int w = 0; w < 3; w++) {
                    char out[8192];
                    rng_state = 777 + (uint64_t)i * 31 + (uint64_t)w;
                    walks++;
                    if (random_walk(g, v, 300, w == 0 ? 7 : 0, 0, out, sizeof out)) {
                        ended++;
                        expect_valid(schema, out);
                        if (getenv("GRAMMAR_TEST_SHOW") && w == 0 && i % 20 == 0)
                            cr_log_info("%s: %s", names[i], out);
                    }
                }
            }
        }
        grammar_free(g);
        free(schema);
        free(names[i]);
    }
    cr_expect_geq(refused, 8);
    cr_expect_geq(ended * 10, walks * 9, "only %d of %d walks ended", ended, walks);
    cr_log_info("corpus: %d compiled, %d refused as expected, %d of %d walks ended and validated",
                compiled, refused, ended, walks);
    grammar_vocab_free(v);
    free(expected);
}

/* ---- real vocabularies ---------------------------------------------------------------------- */

static struct tokenizer *load_tok(const char *name)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        return NULL;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", data, name);
    struct tokenizer *tok = NULL;
    struct err e = {0};
    cr_assert_eq(tok_load(dir, &tok, &e), 0, "%s", e.msg);
    return tok;
}

static int32_t id_of(struct tokenizer *tok, const char *text)
{
    int32_t *ids = NULL;
    int n = 0;
    struct err e = {0};
    cr_assert_eq(tok_encode(tok, text, strlen(text), false, &ids, &n, &e), 0);
    cr_assert_eq(n, 1, "'%s' is %d tokens", text, n);
    int32_t id = ids[0];
    free(ids);
    return id;
}

Test(grammar_vocab, qwen3_masks_match_brute_force_and_outputs_validate)
{
    struct tokenizer *tok = load_tok("qwen3");
    if (!tok)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: the Qwen3 vocabulary is not checked");
    struct grammar_vocab *v = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_vocab_create(tok, &v, &e), 0, "%s", e.msg);
    cr_assert_eq(grammar_vocab_size(v), tok_vocab_size(tok));
    size_t len;
    const char *p = grammar_vocab_token(v, id_of(tok, " the"), &len);
    cr_expect(len == 4 && !memcmp(p, " the", 4), "byte-level pieces decode to raw bytes");
    p = grammar_vocab_token(v, id_of(tok, "\n\n"), &len);
    cr_expect(len == 2 && !memcmp(p, "\n\n", 2));
    int32_t im_end = tok_piece_to_id(tok, "<|im_end|>");
    cr_assert_geq(im_end, 0);
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},\"when\":{\"type\":\"string\","
        "\"format\":\"date\"},\"n\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":4000},\"ok\":{\"type\":\"boolean\"}},"
        "\"required\":[\"city\",\"n\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"},{\"type\":\"null\"}]},\"maxItems\":4}",
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":[\"a b\",\"\xC3\xA9t\xC3\xA9\"]},\"k\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":2}},\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/t\"}",
    };
    char out[8192];
    for (int i = 0; i < 3; i++) {
        for (int ws = 0; ws < 2; ws++) {
            struct grammar *g = compile_schema_opts(schemas[i], ws);
            rng_state = 4242 + (uint64_t)i * 10 + (uint64_t)ws;
            if (random_walk(g, v, 40, 4, 3000, out, sizeof out))
                expect_valid(schemas[i], out);
            /* special tokens and leading-space tokens at the start */
            struct grammar_matcher *m = matcher(g, v);
            uint32_t *bits = calloc(((size_t)grammar_vocab_size(v) + 31) / 32, sizeof *bits);
            bool eos;
            cr_assert_eq(grammar_matcher_fill_mask(m, bits, &eos), 0);
            cr_expect(!(bits[im_end >> 5] >> (im_end & 31) & 1));
            int32_t sp_open = id_of(tok, " {");
            if (i != 1)
                cr_expect_eq(bits[sp_open >> 5] >> (sp_open & 31) & 1, (uint32_t)ws,
                             "' {' allowed only with free whitespace");
            free(bits);
            grammar_matcher_free(m);
            grammar_free(g);
        }
    }
    grammar_vocab_free(v);
    tok_free(tok);
}

Test(grammar_vocab, sentencepiece_pieces_decode_spaces_and_byte_tokens)
{
    struct tokenizer *tok = load_tok("gemma3");
    if (!tok)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set: the Gemma 3 vocabulary is not checked");
    struct grammar_vocab *v = NULL;
    struct err e = {0};
    cr_assert_eq(grammar_vocab_create(tok, &v, &e), 0, "%s", e.msg);
    size_t len;
    int32_t nl = tok_piece_to_id(tok, "<0x0A>");
    cr_assert_geq(nl, 0);
    const char *p = grammar_vocab_token(v, nl, &len);
    cr_expect(len == 1 && p[0] == '\n');
    int32_t the = tok_piece_to_id(tok, "\xE2\x96\x81the");
    cr_assert_geq(the, 0);
    p = grammar_vocab_token(v, the, &len);
    cr_expect(len == 4 && !memcmp(p, " the", 4), "'%.*s'", (int)len, p);
    struct grammar *g = compile_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}");
    char out[4096];
    rng_state = 31337;
    if (random_walk(g, v, 30, 5, 2000, out, sizeof out))
        expect_valid("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}", out);
    grammar_free(g);
    grammar_vocab_free(v);
    tok_free(tok);
}

Test(grammar_matcher, a_prepared_cache_gives_the_same_masks)
{
    struct grammar_vocab *v = small_vocab();
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},\"b\":{\"anyOf\":["
                    "{\"type\":\"integer\"},{\"type\":\"null\"}]}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}";
    struct grammar *g = compile_schema(s);
    struct grammar_matcher *m = matcher(g, v);
    cr_assert_eq(grammar_matcher_prepare(m), 0);
    grammar_matcher_free(m);
    char out[1024];
    for (int w = 0; w < 5; w++) {
        rng_state = 900 + (uint64_t)w;
        if (random_walk(g, v, 60, 1, 0, out, sizeof out))
            expect_valid(s, out);
    }
    grammar_free(g);
    grammar_vocab_free(v);
}
