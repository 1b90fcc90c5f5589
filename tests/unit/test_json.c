/* tests/unit/test_json.c — the typed JSON reader: parsing, paths in errors, type and range checks, null as absent. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static struct json_object *root_obj;
static struct err err;
static struct json_doc doc;

static void teardown(void)
{
    json_object_put(root_obj);
    root_obj = NULL;
}

TestSuite(json, .fini = teardown);

/* A reader at the parsed text, with flags; the text must parse. */
static struct json_reader open_doc(const char *text, unsigned flags)
{
    json_object_put(root_obj);
    memset(&err, 0, sizeof err);
    int rc = json_text_parse(text, strlen(text), 0, false, &root_obj, &err);
    cr_assert_eq(rc, 0, "%s: %s", text, err.msg);
    doc = (struct json_doc){.err = &err, .flags = flags};
    return json_reader_root(&doc, root_obj);
}

#define assert_fails(rc, code, path, message)                                                   \
    do {                                                                                        \
        cr_assert_eq((rc), -(code), "rc %d, message: %s", (rc), err.msg);                       \
        cr_assert_str_eq(doc.err_path, (path));                                                 \
        cr_assert_str_eq(err.msg, (message));                                                   \
    } while (0)

/* ---- parsing ----------------------------------------------------------------- */

Test(json, parse_accepts_one_value_with_surrounding_whitespace)
{
    cr_assert_eq(json_text_parse(" {\"a\":1}\n ", 10, 0, false, &root_obj, &err), 0, "%s", err.msg);
    cr_assert(json_object_is_type(root_obj, json_type_object));
}

Test(json, parse_completes_a_bare_number_at_the_end)
{
    cr_assert_eq(json_text_parse("42", 2, 0, true, &root_obj, &err), 0, "%s", err.msg);
    cr_assert_eq(json_object_get_int64(root_obj), 42);
}

Test(json, parse_of_null_gives_no_object)
{
    cr_assert_eq(json_text_parse("null", 4, 0, true, &root_obj, &err), 0);
    cr_assert_null(root_obj);
}

Test(json, parse_errors_say_what_and_where)
{
    cr_assert_eq(json_text_parse("{\"a\":", 5, 0, false, &root_obj, &err), -INFERD_EFORMAT);
    cr_assert_str_eq(err.msg, "unexpected end of data at byte 5");
    cr_assert_eq(json_text_parse("{} {}", 5, 0, false, &root_obj, &err), -INFERD_EFORMAT);
    cr_assert_str_eq(err.msg, "unexpected bytes after the value (byte 3)");
    cr_assert_eq(json_text_parse("{\"a\":1,}", 8, 0, true, &root_obj, &err), -INFERD_EFORMAT);
    cr_assert_not_null(strstr(err.msg, "at byte 7"), "%s", err.msg);
    cr_assert_eq(json_text_parse("[\0]", 3, 0, false, &root_obj, &err), -INFERD_EFORMAT);
    cr_assert_str_eq(err.msg, "it contains a raw NUL byte");
    cr_assert_eq(json_text_parse("", 0, 0, false, &root_obj, &err), -INFERD_EFORMAT);
    cr_assert_null(root_obj);
}

Test(json, parse_refuses_nesting_beyond_max_depth)
{
    cr_assert_eq(json_text_parse("[[[[1]]]]", 9, 4, false, &root_obj, &err), -INFERD_EFORMAT);
    cr_assert_str_eq(err.msg, "nesting deeper than 4 levels");
    cr_assert_eq(json_text_parse("[[[1]]]", 7, 4, false, &root_obj, &err), 0, "%s", err.msg);
}

Test(json, lenient_mode_accepts_trailing_commas_and_strict_mode_does_not)
{
    cr_assert_eq(json_text_parse("[1,]", 4, 0, false, &root_obj, &err), 0, "%s", err.msg);
    json_object_put(root_obj);
    root_obj = NULL;
    cr_assert_eq(json_text_parse("[1,]", 4, 0, true, &root_obj, &err), -INFERD_EFORMAT);
}

/* ---- paths ------------------------------------------------------------------- */

Test(json, nested_error_names_the_full_path)
{
    struct json_reader r = open_doc("{\"messages\":[{\"role\":\"user\"},{\"content\":1},"
                                    "{\"role\":\"tool\",\"content\":5}]}",
                                    0);
    struct json_reader msgs;
    size_t n;
    cr_assert_eq(json_read_array(&r, "messages", JSON_REQUIRED, &msgs, &n), 0);
    cr_assert_eq(n, 3);
    struct json_reader m = json_reader_element(&msgs, 2);
    const char *s;
    assert_fails(json_read_str(&m, "content", JSON_REQUIRED, &s, NULL), INFERD_EFORMAT,
                 "messages[2].content", "messages[2].content must be a string, got a number");
    char path[8];
    cr_assert_eq(json_reader_path(&m, path, sizeof path), strlen("messages[2]"));
    cr_assert_str_eq(path, "message", "cut to the buffer");
}

Test(json, missing_required_field_names_its_path)
{
    struct json_reader r = open_doc("{\"rope_scaling\":{\"type\":\"linear\"}}", 0);
    struct json_reader rs;
    double f;
    cr_assert_eq(json_read_object(&r, "rope_scaling", JSON_REQUIRED, &rs), 0);
    assert_fails(json_read_double(&rs, "factor", JSON_REQUIRED, JSON_ANY_NUMBER, &f),
                 INFERD_EFORMAT, "rope_scaling.factor",
                 "missing required field 'rope_scaling.factor'");
}

Test(json, prefix_and_root_name_appear_in_messages)
{
    struct json_reader r = open_doc("[1]", 0);
    doc.prefix = "tokenizer";
    doc.name = "tokenizer.json";
    struct json_reader o;
    assert_fails(json_read_object(&r, NULL, JSON_REQUIRED, &o), INFERD_EFORMAT, "",
                 "tokenizer: tokenizer.json must be an object, got an array");
    struct json_reader e = json_reader_element(&r, 0);
    assert_fails(json_reader_fail_plain(&e, INFERD_EINVAL, "no good"), INFERD_EINVAL, "[0]",
                 "tokenizer: no good");
}

Test(json, entry_and_member_readers_extend_the_path)
{
    struct json_reader r = open_doc("{\"vocab\":{\"a\":\"x\"}}", 0);
    struct json_reader vocab;
    cr_assert_eq(json_read_object(&r, "vocab", JSON_REQUIRED, &vocab), 0);
    json_object_object_foreach(vocab.v, key, val)
    {
        struct json_reader e = json_reader_entry(&vocab, key, val);
        int id;
        assert_fails(json_read_int(&e, NULL, JSON_REQUIRED, 0, 10, &id), INFERD_EFORMAT,
                     "vocab.a", "vocab.a must be an integer, got a string");
    }
}

/* ---- types ------------------------------------------------------------------- */

Test(json, every_type_mismatch_is_a_format_error_naming_both_types)
{
    struct json_reader r = open_doc("{\"s\":\"x\",\"n\":1.5,\"i\":2,\"b\":true,\"o\":{},\"a\":[]}", 0);
    const char *s;
    bool b;
    int64_t i;
    double d;
    int e;
    struct json_reader sub;
    size_t n;
    static const char *const names[] = {"x", NULL};
    assert_fails(json_read_str(&r, "n", JSON_REQUIRED, &s, NULL), INFERD_EFORMAT, "n",
                 "n must be a string, got a number");
    assert_fails(json_read_bool(&r, "s", JSON_REQUIRED, &b), INFERD_EFORMAT, "s",
                 "s must be a boolean, got a string");
    assert_fails(json_read_int64(&r, "b", JSON_REQUIRED, 0, 9, &i), INFERD_EFORMAT, "b",
                 "b must be an integer, got a boolean");
    assert_fails(json_read_double(&r, "o", JSON_REQUIRED, JSON_ANY_NUMBER, &d), INFERD_EFORMAT,
                 "o", "o must be a number, got an object");
    assert_fails(json_read_enum(&r, "a", JSON_REQUIRED, names, &e), INFERD_EFORMAT, "a",
                 "a must be a string, got an array");
    assert_fails(json_read_object(&r, "a", JSON_REQUIRED, &sub), INFERD_EFORMAT, "a",
                 "a must be an object, got an array");
    assert_fails(json_read_array(&r, "i", JSON_REQUIRED, &sub, &n), INFERD_EFORMAT, "i",
                 "i must be an array, got a number");
}

Test(json, a_fractional_number_is_not_an_integer)
{
    struct json_reader r = open_doc("{\"n\":64.0,\"m\":2.5}", 0);
    int64_t i = 0;
    assert_fails(json_read_int64(&r, "n", JSON_REQUIRED, 0, 100, &i), INFERD_EFORMAT, "n",
                 "n must be an integer, got 64.0");
    r = open_doc("{\"n\":64.0,\"m\":2.5}", JSON_INTEGRAL_DOUBLES);
    cr_assert_eq(json_read_int64(&r, "n", JSON_REQUIRED, 0, 100, &i), 0, "%s", err.msg);
    cr_assert_eq(i, 64);
    assert_fails(json_read_int64(&r, "m", JSON_REQUIRED, 0, 100, &i), INFERD_EFORMAT, "m",
                 "m must be an integer, got 2.5");
}

Test(json, strings_come_with_their_length_and_copies_are_owned)
{
    struct json_reader r = open_doc("{\"s\":\"a\\u0000b\"}", 0);
    const char *s = NULL;
    size_t n = 0;
    cr_assert_eq(json_read_str(&r, "s", JSON_REQUIRED, &s, &n), 0);
    cr_assert_eq(n, 3);
    char *copy = NULL;
    cr_assert_eq(json_read_strdup(&r, "s", JSON_REQUIRED, &copy, &n), 0);
    cr_assert_eq(memcmp(copy, "a\0b", 4), 0);
    free(copy);
}

Test(json, text_documents_refuse_nul_and_bad_utf8)
{
    struct json_reader r = open_doc("{\"s\":\"a\\u0000b\",\"t\":\"\xc0\xaf\"}", JSON_TEXT);
    const char *s;
    assert_fails(json_read_str(&r, "s", JSON_REQUIRED, &s, NULL), INFERD_EFORMAT, "s",
                 "s contains a NUL character (\\u0000), which is not allowed");
    assert_fails(json_read_str(&r, "t", JSON_REQUIRED, &s, NULL), INFERD_EFORMAT, "t",
                 "t is not valid UTF-8");
}

Test(json, enum_gives_the_index_or_lists_the_choices)
{
    static const char *const names[] = {"none", "low", "high", NULL};
    struct json_reader r = open_doc("{\"e\":\"low\",\"f\":\"max\"}", 0);
    int i = -1;
    cr_assert_eq(json_read_enum(&r, "e", JSON_REQUIRED, names, &i), 0);
    cr_assert_eq(i, 1);
    assert_fails(json_read_enum(&r, "f", JSON_REQUIRED, names, &i), INFERD_EUNSUPPORTED, "f",
                 "f must be one of \"none\", \"low\", \"high\"; got \"max\"");
}

/* ---- ranges ------------------------------------------------------------------ */

Test(json, integer_ranges_are_checked_with_both_bounds_in_the_message)
{
    struct json_reader r = open_doc("{\"v\":0,\"w\":4194305,\"x\":-1,\"y\":7}", 0);
    int v = 0;
    assert_fails(json_read_int(&r, "v", JSON_REQUIRED, 1, 4 << 20, &v), INFERD_ERANGE, "v",
                 "v must be in [1, 4194304], got 0");
    assert_fails(json_read_int(&r, "w", JSON_REQUIRED, 1, 4 << 20, &v), INFERD_ERANGE, "w",
                 "w must be in [1, 4194304], got 4194305");
    int64_t x;
    assert_fails(json_read_int64(&r, "x", JSON_REQUIRED, 1, INT64_MAX, &x), INFERD_ERANGE, "x",
                 "x must be at least 1, got -1");
    assert_fails(json_read_int64(&r, "y", JSON_REQUIRED, INT64_MIN, 5, &x), INFERD_ERANGE, "y",
                 "y must be at most 5, got 7");
    cr_assert_eq(json_read_int(&r, "y", JSON_REQUIRED, 7, 7, &v), 0);
    cr_assert_eq(v, 7);
}

Test(json, number_ranges_honour_open_and_closed_bounds)
{
    struct json_reader r = open_doc("{\"z\":0,\"one\":1,\"big\":1e400}", 0);
    double d = -1;
    assert_fails(json_read_double(&r, "z", JSON_REQUIRED, (struct json_range){0, 1, .lo_open = true},
                                  &d),
                 INFERD_ERANGE, "z", "z must be in (0, 1], got 0");
    cr_assert_eq(json_read_double(&r, "one", JSON_REQUIRED, (struct json_range){.lo = 0, .hi = 1}, &d), 0);
    cr_assert_float_eq(d, 1.0, 0);
    assert_fails(json_read_double(&r, "one", JSON_REQUIRED,
                                  (struct json_range){0, 1, .hi_open = true}, &d),
                 INFERD_ERANGE, "one", "one must be in [0, 1), got 1");
    assert_fails(json_read_double(&r, "z", JSON_REQUIRED,
                                  (struct json_range){0, INFINITY, .lo_open = true}, &d),
                 INFERD_ERANGE, "z", "z must be greater than 0, got 0");
    assert_fails(json_read_double(&r, "big", JSON_REQUIRED, JSON_ANY_NUMBER, &d), INFERD_ERANGE,
                 "big", "big must be a finite number");
}

/* ---- absence ------------------------------------------------------------------ */

Test(json, null_counts_as_absent_and_leaves_the_default)
{
    struct json_reader r = open_doc("{\"t\":null}", 0);
    double t = 0.5;
    bool here = true;
    cr_assert_eq(json_read_double(&r, "t", &here, JSON_ANY_NUMBER, &t), 0);
    cr_assert_not(here);
    cr_assert_float_eq(t, 0.5, 0);
    int k = 3;
    cr_assert_eq(json_read_int(&r, "k", JSON_OPTIONAL, 0, 9, &k), 0);
    cr_assert_eq(k, 3);
    const char *s = "dflt";
    cr_assert_eq(json_read_str(&r, "t", JSON_OPTIONAL, &s, NULL), 0);
    cr_assert_str_eq(s, "dflt");
    assert_fails(json_read_double(&r, "t", JSON_REQUIRED, JSON_ANY_NUMBER, &t), INFERD_EFORMAT,
                 "t", "missing required field 't'");
    cr_assert_not(json_reader_has(&r, "t"));
    cr_assert(json_reader_has_key(&r, "t"), "null is present as a key");
    cr_assert_not(json_reader_has_key(&r, "k"));
}

Test(json, present_reports_a_value_that_is_there)
{
    struct json_reader r = open_doc("{\"b\":false}", 0);
    bool b = true, here = false;
    cr_assert_eq(json_read_bool(&r, "b", &here, &b), 0);
    cr_assert(here);
    cr_assert_not(b);
}

/* ---- whole objects ------------------------------------------------------------- */

Test(json, unknown_keys_are_refused_by_name)
{
    static const char *const keys[] = {"a", "b", NULL};
    struct json_reader r = open_doc("{\"o\":{\"a\":1,\"c\":2}}", 0);
    struct json_reader o;
    cr_assert_eq(json_read_object(&r, "o", JSON_REQUIRED, &o), 0);
    assert_fails(json_reader_check_keys(&o, keys), INFERD_EFORMAT, "o.c",
                 "o.c is not a known field");
    static const char *const all[] = {"a", "c", NULL};
    cr_assert_eq(json_reader_check_keys(&o, all), 0);
}

Test(json, tree_check_refuses_bad_text_and_infinite_numbers_naming_the_kept_value)
{
    struct json_reader r = open_doc("{\"k\":{\"a\":[1,\"\xff\"]},\"m\":{\"b\":{\"c\":1e400}},"
                                    "\"n\":{\"\xfe\":1},\"ok\":{\"x\":[\"y\",2.5,null]}}",
                                    JSON_TEXT);
    struct json_reader k = json_reader_member(&r, "k"), m = json_reader_member(&r, "m"),
                       n = json_reader_member(&r, "n"), ok = json_reader_member(&r, "ok");
    assert_fails(json_reader_check_tree(&k), INFERD_EFORMAT, "k", "k is not valid UTF-8");
    assert_fails(json_reader_check_tree(&m), INFERD_ERANGE, "m",
                 "m contains a number that is not finite");
    assert_fails(json_reader_check_tree(&n), INFERD_EFORMAT, "n", "n is not valid UTF-8");
    cr_assert_eq(json_reader_check_tree(&ok), 0, "%s", err.msg);
}
