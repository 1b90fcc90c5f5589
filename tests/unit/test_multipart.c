/* tests/unit/test_multipart.c — multipart/form-data: the boundary from the Content-Type, parts
 * with their names, filenames, types and binary data in place, and a clear error for every
 * malformed body. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api/multipart.h"

static struct multipart_form form;
static struct err err;

static void teardown(void)
{
    multipart_free(&form);
}

TestSuite(multipart, .fini = teardown);

static int parse(const char *body, size_t len, const char *boundary)
{
    memset(&err, 0, sizeof err);
    return multipart_parse(body, len, boundary, &form, &err);
}

#define PARSE(lit, boundary) parse((lit), sizeof(lit) - 1, (boundary))

/* A refusal whose message contains fragment, with the form left empty. */
#define assert_malformed(rc, fragment)                                                        \
    do {                                                                                      \
        cr_assert_eq((rc), -INFERD_EINVAL, "rc %d", (rc));                                    \
        cr_assert_not_null(strstr(err.msg, (fragment)), "message: %s", err.msg);              \
        cr_assert_eq(form.n_parts, 0);                                                        \
        cr_assert_null(form.parts);                                                           \
    } while (0)

/* ---- the boundary ------------------------------------------------------------ */

Test(multipart, boundary_is_read_plain_or_quoted_among_other_parameters)
{
    char b[MULTIPART_MAX_BOUNDARY + 1];
    cr_assert_eq(multipart_boundary("multipart/form-data; boundary=abc123", b, &err), 0, "%s",
                 err.msg);
    cr_assert_str_eq(b, "abc123");
    cr_assert_eq(multipart_boundary("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b:c\"", b,
                                    &err),
                 0, "%s", err.msg);
    cr_assert_str_eq(b, "a b:c");
    cr_assert_eq(multipart_boundary("  multipart/form-data ; boundary=----WebKitFormBoundary7MA4YW"
                                    "xkTrZu0gW",
                                    b, &err),
                 0, "%s", err.msg);
    cr_assert_str_eq(b, "----WebKitFormBoundary7MA4YWxkTrZu0gW");
}

Test(multipart, boundary_refuses_other_types_and_missing_or_bad_boundaries)
{
    char b[MULTIPART_MAX_BOUNDARY + 1];
    cr_assert_eq(multipart_boundary(NULL, b, &err), -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "must be multipart/form-data"), "%s", err.msg);
    cr_assert_eq(multipart_boundary("application/json", b, &err), -INFERD_EINVAL);
    cr_assert_eq(multipart_boundary("multipart/form-datax; boundary=a", b, &err), -INFERD_EINVAL);
    cr_assert_eq(multipart_boundary("multipart/mixed; boundary=a", b, &err), -INFERD_EINVAL);
    cr_assert_eq(multipart_boundary("multipart/form-data", b, &err), -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "needs a boundary"), "%s", err.msg);
    cr_assert_eq(multipart_boundary("multipart/form-data; boundary=", b, &err), -INFERD_EINVAL);
    cr_assert_eq(multipart_boundary("multipart/form-data; boundary=\"abc", b, &err),
                 -INFERD_EINVAL);
    cr_assert_eq(multipart_boundary("multipart/form-data; boundary=a<b", b, &err), -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "0x3c"), "%s", err.msg);
    cr_assert_eq(multipart_boundary("multipart/form-data; boundary=\"ab \"", b, &err),
                 -INFERD_EINVAL);
    char ct[200];
    snprintf(ct, sizeof ct, "multipart/form-data; boundary=%071d", 7);
    cr_assert_eq(multipart_boundary(ct, b, &err), -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "longer than 70"), "%s", err.msg);
    snprintf(ct, sizeof ct, "multipart/form-data; boundary=%070d", 7);
    cr_assert_eq(multipart_boundary(ct, b, &err), 0, "%s", err.msg);
}

/* ---- parts ------------------------------------------------------------------- */

Test(multipart, parts_carry_name_filename_type_and_binary_data_in_place)
{
    static const char body[] = "--XyZ\r\n"
                               "Content-Disposition: form-data; name=\"model\"\r\n"
                               "\r\n"
                               "whisper-1\r\n"
                               "--XyZ\r\n"
                               "content-disposition: form-data; name=\"file\"; "
                               "filename=\"a \\\"b\\\".wav\"\r\n"
                               "Content-Type:  audio/wav \r\n"
                               "X-Other: ignored\r\n"
                               "\r\n"
                               "RIFF\0\r\n--XyY\r\n--Xy-\xff\r\n"
                               "--XyZ--\r\n";
    cr_assert_eq(PARSE(body, "XyZ"), 0, "%s", err.msg);
    cr_assert_eq(form.n_parts, 2);
    const struct multipart_part *m = &form.parts[0], *f = &form.parts[1];
    cr_assert_str_eq(m->name, "model");
    cr_assert_str_empty(m->filename);
    cr_assert_str_empty(m->content_type);
    cr_assert_eq(m->data_len, 9);
    cr_assert_arr_eq(m->data, "whisper-1", 9);
    cr_assert_str_eq(f->name, "file");
    cr_assert_str_eq(f->filename, "a \"b\".wav");
    cr_assert_str_eq(f->content_type, "audio/wav");
    static const char data[] = "RIFF\0\r\n--XyY\r\n--Xy-\xff";
    cr_assert_eq(f->data_len, sizeof data - 1);
    cr_assert_arr_eq(f->data, data, sizeof data - 1);
    cr_assert(f->data > body && f->data + f->data_len < body + sizeof body, "data points into body");
    cr_assert_eq(multipart_find(&form, "file"), f);
    cr_assert_eq(multipart_find(&form, "model"), m);
    cr_assert_null(multipart_find(&form, "language"));
}

Test(multipart, preamble_epilogue_padding_and_empty_data_are_accepted)
{
    static const char body[] = "this is the preamble\r\n"
                               "--b \t\r\n"
                               "Content-Disposition: form-data; name=empty\r\n"
                               "\r\n"
                               "\r\n"
                               "--b\r\n"
                               "Content-Disposition: form-data; name=x\r\n"
                               "\r\n"
                               "1\r\n"
                               "--b--and an epilogue";
    cr_assert_eq(PARSE(body, "b"), 0, "%s", err.msg);
    cr_assert_eq(form.n_parts, 2);
    cr_assert_str_eq(form.parts[0].name, "empty");
    cr_assert_eq(form.parts[0].data_len, 0);
    cr_assert_str_eq(form.parts[1].name, "x");
    cr_assert_eq(form.parts[1].data_len, 1);
}

Test(multipart, a_body_without_its_boundary_or_its_end_is_malformed)
{
    assert_malformed(PARSE("no boundary here", "b"), "does not contain its boundary");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; name=x\r\n\r\nabc", "b"),
                     "ends before its closing boundary");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; name=x", "b"),
                     "ends inside its headers");
    assert_malformed(PARSE("--b", "b"), "ends before its closing boundary");
    assert_malformed(PARSE("--b--\r\n", "b"), "has no parts");
    assert_malformed(PARSE("--bc\r\n", "b"), "neither CRLF nor '--'");
}

Test(multipart, parts_without_a_form_data_name_are_malformed)
{
    assert_malformed(PARSE("--b\r\n\r\nabc\r\n--b--", "b"), "part 1 has no Content-Disposition");
    assert_malformed(PARSE("--b\r\nContent-Type: text/plain\r\n\r\nabc\r\n--b--", "b"),
                     "no Content-Disposition");
    assert_malformed(PARSE("--b\r\nContent-Disposition: attachment; name=x\r\n\r\na\r\n--b--", "b"),
                     "must be form-data");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; filename=x\r\n\r\na\r\n--b--",
                           "b"),
                     "has no name");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; name=\"\"\r\n\r\na\r\n--b--",
                           "b"),
                     "has no name");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; name=\"x\r\n\r\na\r\n--b--",
                           "b"),
                     "name is malformed");
    assert_malformed(PARSE("--b\r\nno colon\r\n\r\na\r\n--b--", "b"), "without a name and ':'");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; name=\"a\0b\"\r\n\r\na\r\n--b--",
                           "b"),
                     "NUL byte");
    assert_malformed(PARSE("--b\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--b\r\n"
                           "Content-Disposition: form-data\r\n\r\n2\r\n--b--",
                           "b"),
                     "part 2");
}

Test(multipart, overlong_names_headers_and_too_many_parts_are_refused)
{
    char body[80000];
    int n = snprintf(body, sizeof body,
                     "--b\r\nContent-Disposition: form-data; name=\"%0300d\"\r\n\r\na\r\n--b--", 1);
    assert_malformed(parse(body, (size_t)n, "b"), "longer than 255");
    n = snprintf(body, sizeof body,
                 "--b\r\nContent-Disposition: form-data; name=a; filename=\"%0300d\"\r\n\r\na\r\n"
                 "--b--",
                 1);
    assert_malformed(parse(body, (size_t)n, "b"), "filename is malformed or longer");
    n = snprintf(body, sizeof body,
                 "--b\r\nContent-Disposition: form-data; name=a\r\nContent-Type: %0200d\r\n\r\n"
                 "a\r\n--b--",
                 1);
    assert_malformed(parse(body, (size_t)n, "b"), "Content-Type is longer");
    n = snprintf(body, sizeof body, "--b\r\nX-Long: %09000d\r\n\r\na\r\n--b--", 1);
    assert_malformed(parse(body, (size_t)n, "b"), "headers are longer than 8192");

    size_t len = 0;
    for (int i = 0; i <= MULTIPART_MAX_PARTS; i++)
        len += (size_t)snprintf(body + len, sizeof body - len,
                                "--b\r\nContent-Disposition: form-data; name=p%d\r\n\r\nv\r\n", i);
    len += (size_t)snprintf(body + len, sizeof body - len, "--b--");
    assert_malformed(parse(body, len, "b"), "more than 64 parts");
    /* One fewer fits. */
    char *last = strstr(body, "--b\r\nContent-Disposition: form-data; name=p64");
    cr_assert_not_null(last);
    memcpy(last, "--b--", 6);
    cr_assert_eq(parse(body, strlen(body), "b"), 0, "%s", err.msg);
    cr_assert_eq(form.n_parts, MULTIPART_MAX_PARTS);
    cr_assert_str_eq(form.parts[63].name, "p63");
}
