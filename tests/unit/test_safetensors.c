/* tests/unit/test_safetensors.c — safetensors header validation and the mmap'd tensor set (single file and shards). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "test_support.h"

/* A file image whose length prefix says header_len (whatever the header's real length). */
static uint8_t *image_with_len(uint64_t header_len, const char *header, const void *data,
                               size_t data_len, size_t *len_out)
{
    size_t hl = strlen(header);
    size_t len = 8 + hl + data_len;
    uint8_t *buf = malloc(len);
    cr_assert(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(header_len >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data_len)
        memcpy(buf + 8 + hl, data, data_len);
    *len_out = len;
    return buf;
}

/* A well-formed file image: header padded with spaces to a multiple of 8, then data. */
static uint8_t *image(const char *header, const void *data, size_t data_len, size_t *len_out)
{
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    char *h = malloc(padded + 1);
    cr_assert(h);
    memcpy(h, header, hl);
    memset(h + hl, ' ', padded - hl);
    h[padded] = '\0';
    uint8_t *buf = image_with_len(padded, h, data, data_len, len_out);
    free(h);
    return buf;
}

/* Parses header over data_len zero bytes; returns the result code, header freed. */
static int parse_header(const char *header, size_t data_len, struct err *err)
{
    uint8_t *zeros = calloc(1, data_len + 1);
    size_t len;
    uint8_t *buf = image(header, zeros, data_len, &len);
    struct st_header h;
    int rc = st_header_parse(buf, len, &h, err);
    if (rc == 0)
        st_header_free(&h);
    free(buf);
    free(zeros);
    return rc;
}

static const struct st_tensor *header_find(const struct st_header *h, const char *name)
{
    for (int i = 0; i < h->n_tensors; i++)
        if (strcmp(h->tensors[i].name, name) == 0)
            return &h->tensors[i];
    return NULL;
}

#define assert_refused(rc, err, code, fragment)                                                   \
    do {                                                                                          \
        cr_assert_eq((rc), -(code), "rc %d, message: %s", (rc), (err).msg);                      \
        cr_assert_not_null(strstr((err).msg, (fragment)), "message '%s' lacks '%s'", (err).msg,   \
                           (fragment));                                                           \
    } while (0)

/* ---------------------------------------------------------------- header parsing */

Test(safetensors, valid_header_gives_names_dtypes_shapes_and_offsets)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[1,1,2],\"data_offsets\":[32,36]}}";
    uint8_t data[36] = {0};
    size_t len;
    uint8_t *buf = image(hdr, data, sizeof data, &len);
    struct st_header h;
    struct err err = {0};
    cr_assert_eq(st_header_parse(buf, len, &h, &err), 0, "%s", err.msg);
    cr_assert_eq(h.n_tensors, 3, "__metadata__ is not a tensor");
    const struct st_tensor *a = header_find(&h, "a"), *b = header_find(&h, "b"),
                           *c = header_find(&h, "c");
    cr_assert(a && b && c);
    cr_assert_eq(a->dtype, DTYPE_F32);
    cr_assert_eq(a->n_dims, 2);
    cr_assert_eq(a->shape[0], 2);
    cr_assert_eq(a->shape[1], 3);
    cr_assert_eq(a->offset, 0);
    cr_assert_eq(a->nbytes, 24);
    cr_assert_eq(b->dtype, DTYPE_BF16);
    cr_assert_eq(b->offset, 24);
    cr_assert_eq(b->nbytes, 8);
    cr_assert_eq(c->dtype, DTYPE_F16);
    cr_assert_eq(c->n_dims, 3);
    cr_assert_eq(h.header_len, (strlen(hdr) + 7) / 8 * 8);
    st_header_free(&h);
    free(buf);
}

Test(safetensors, scalar_and_empty_tensors_are_accepted)
{
    struct err err = {0};
    const char *hdr = "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
                      "\"f\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    cr_assert_eq(parse_header(hdr, 4, &err), 0, "%s", err.msg);
}

Test(safetensors, padding_with_spaces_after_the_json_is_accepted)
{
    struct err err = {0};
    cr_assert_eq(parse_header("{}      \n ", 0, &err), 0, "%s", err.msg);
}

Test(safetensors, file_shorter_than_8_bytes_is_refused)
{
    uint8_t buf[5] = {1, 0, 0, 0, 0};
    struct st_header h;
    struct err err = {0};
    int rc = st_header_parse(buf, sizeof buf, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "too short");
    rc = st_header_parse(buf, 0, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "too short");
}

Test(safetensors, header_length_larger_than_file_is_refused)
{
    size_t len;
    uint8_t *buf = image_with_len(1000, "{}", NULL, 0, &len);
    struct st_header h;
    struct err err = {0};
    int rc = st_header_parse(buf, len, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "truncated");
    free(buf);
}

Test(safetensors, header_length_over_the_limit_is_refused_before_reading)
{
    size_t len;
    uint8_t *buf = image_with_len((uint64_t)ST_MAX_HEADER_BYTES + 1, "{}", NULL, 0, &len);
    struct st_header h;
    struct err err = {0};
    int rc = st_header_parse(buf, len, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "limit");
    free(buf);
    buf = image_with_len(UINT64_MAX, "{}", NULL, 0, &len);
    rc = st_header_parse(buf, len, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "limit");
    free(buf);
}

Test(safetensors, empty_header_is_refused)
{
    size_t len;
    uint8_t *buf = image_with_len(0, "", NULL, 0, &len);
    struct st_header h;
    struct err err = {0};
    int rc = st_header_parse(buf, len, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "empty");
    free(buf);
}

Test(safetensors, malformed_json_is_refused)
{
    struct err err = {0};
    assert_refused(parse_header("{\"a\":", 0, &err), err, INFERD_EFORMAT, "JSON");
    assert_refused(parse_header("{\"a\" 1}", 0, &err), err, INFERD_EFORMAT, "JSON");
    assert_refused(parse_header("not json", 0, &err), err, INFERD_EFORMAT, "JSON");
    assert_refused(parse_header("[1,2]", 0, &err), err, INFERD_EFORMAT, "not a JSON object");
    assert_refused(parse_header("{} x", 0, &err), err, INFERD_EFORMAT, "JSON");
}

Test(safetensors, nul_bytes_after_the_json_are_refused)
{
    size_t len;
    uint8_t *buf = image_with_len(8, "{}", "\0\0\0\0\0\0", 6, &len);
    struct st_header h;
    struct err err = {0};
    int rc = st_header_parse(buf, len, &h, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "after its JSON");
    free(buf);
}

Test(safetensors, unsupported_dtype_is_refused_naming_dtype_and_tensor)
{
    struct err err = {0};
    int rc =
        parse_header("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, &err);
    assert_refused(rc, err, INFERD_EUNSUPPORTED, "F64");
    cr_assert_not_null(strstr(err.msg, "'w'"), "%s", err.msg);
    const char *others[] = {"I8", "U8", "BOOL", "F8_E4M3", "I64"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        char hdr[200];
        snprintf(hdr, sizeof hdr,
                 "{\"t\":{\"dtype\":\"%s\",\"shape\":[0],\"data_offsets\":[0,0]}}", others[i]);
        assert_refused(parse_header(hdr, 0, &err), err, INFERD_EUNSUPPORTED, others[i]);
    }
}

Test(safetensors, unknown_dtype_is_a_format_error_naming_it)
{
    struct err err = {0};
    int rc = parse_header("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
                          &err);
    assert_refused(rc, err, INFERD_EFORMAT, "Q4_K");
    rc = parse_header("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,2]}}", 2, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "dtype");
}

Test(safetensors, offsets_past_end_are_refused)
{
    struct err err = {0};
    int rc = parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 16,
                          &err);
    assert_refused(rc, err, INFERD_EFORMAT, "past the end");
    cr_assert_not_null(strstr(err.msg, "'w'"), "%s", err.msg);
    rc = parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                      "\"data_offsets\":[18446744073709551612,18446744073709551616]}}",
                      16, &err);
    cr_assert_eq(rc, -INFERD_EFORMAT, "%s", err.msg);
}

Test(safetensors, offsets_ending_before_they_begin_are_refused)
{
    struct err err = {0};
    int rc = parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16,
                          &err);
    assert_refused(rc, err, INFERD_EFORMAT, "end before they begin");
}

Test(safetensors, malformed_data_offsets_are_refused)
{
    struct err err = {0};
    assert_refused(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                                &err),
                   err, INFERD_EFORMAT, "data_offsets");
    assert_refused(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, &err), err,
                   INFERD_EFORMAT, "data_offsets");
    assert_refused(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
                                4, &err),
                   err, INFERD_EFORMAT, "negative");
    assert_refused(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4,
                     &err),
        err, INFERD_EFORMAT, "data_offsets");
}

Test(safetensors, size_not_matching_dtype_times_shape_is_refused)
{
    struct err err = {0};
    int rc = parse_header("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                          24, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "need 12");
}

Test(safetensors, shape_whose_size_overflows_is_refused)
{
    struct err err = {0};
    int rc = parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                          "\"data_offsets\":[0,0]}}",
                          0, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "more than");
}

Test(safetensors, bad_shapes_are_refused)
{
    struct err err = {0};
    assert_refused(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],"
                                "\"data_offsets\":[0,4]}}",
                                4, &err),
                   err, INFERD_EFORMAT, "5 dimensions");
    assert_refused(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
                                4, &err),
                   err, INFERD_EFORMAT, "negative");
    assert_refused(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, &err),
        err, INFERD_EFORMAT, "shape");
    assert_refused(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, &err),
        err, INFERD_EFORMAT, "shape");
    assert_refused(parse_header("{\"w\":[1,2]}", 4, &err), err, INFERD_EFORMAT,
                   "not a JSON object");
}

Test(safetensors, overlapping_tensors_are_refused_naming_both)
{
    struct err err = {0};
    int rc = parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                          20, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "overlap");
    cr_assert(strstr(err.msg, "'a'") && strstr(err.msg, "'b'"), "%s", err.msg);
}

Test(safetensors, duplicate_tensor_names_are_refused)
{
    struct err err = {0};
    int rc = parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                          8, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "duplicate tensor name 'a'");
    /* The same name spelled with an escape still collides once decoded. */
    rc = parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "duplicate tensor name");
}

Test(safetensors, keys_nested_in_entries_are_not_mistaken_for_duplicates)
{
    struct err err = {0};
    int rc = parse_header("{\"__metadata__\":{\"a\":\"x\",\"b\":\"{,\\\"\"},"
                          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"b,:\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                          8, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
}

/* ---------------------------------------------------------------- tensor sets on disk */

static char *tdir_file(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static void write_image(const char *dir, const char *name, const char *header, const void *data,
                        size_t data_len)
{
    size_t len;
    uint8_t *buf = image(header, data, data_len, &len);
    char *p = tdir_file(dir, name);
    cr_assert_eq(test_write_file(p, buf, len), 0);
    free(p);
    free(buf);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char *p = tdir_file(dir, name);
    cr_assert_eq(test_write_file(p, text, strlen(text)), 0);
    free(p);
}

static const float shard_a_data[2] = {1.5f, -2.0f};
static const float shard_b_data[3] = {3.0f, 4.0f, 5.0f};
#define SHARD_A_HDR "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"
#define SHARD_B_HDR "{\"y\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}"

static void write_two_shards(const char *dir)
{
    write_image(dir, "model-00001-of-00002.safetensors", SHARD_A_HDR, shard_a_data,
                sizeof shard_a_data);
    write_image(dir, "model-00002-of-00002.safetensors", SHARD_B_HDR, shard_b_data,
                sizeof shard_b_data);
}

Test(safetensors, single_file_set_maps_tensor_data_and_marks_lookups_used)
{
    char *dir = test_mkdtemp();
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]}}";
    float data[5] = {1, 2, 3, 4, 5};
    write_image(dir, "model.safetensors", hdr, data, sizeof data);
    struct st_set set;
    struct err err = {0};
    cr_assert_eq(st_set_open(dir, &set, &err), 0, "%s", err.msg);
    cr_assert_eq(set.n_tensors, 2);
    cr_assert_eq(set.n_files, 1);
    const struct st_tensor *b = st_set_find(&set, "b");
    cr_assert_not_null(b);
    cr_assert_eq(memcmp(b->data, data + 2, 12), 0);
    cr_assert_null(st_set_find(&set, "c"));
    int used = 0;
    for (int i = 0; i < set.n_tensors; i++)
        used += set.used[i];
    cr_assert_eq(used, 1, "only b was looked up");
    st_set_close(&set);
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, missing_weights_are_an_io_error_naming_the_path)
{
    char *dir = test_mkdtemp();
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EIO, "model.safetensors");
    cr_assert_not_null(strstr(err.msg, dir), "%s", err.msg);
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, truncated_file_on_disk_is_refused_naming_it)
{
    char *dir = test_mkdtemp();
    write_text(dir, "model.safetensors", "abc");
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "model.safetensors");
    cr_assert_not_null(strstr(err.msg, "too short"), "%s", err.msg);
    /* A header length pointing past the end of the file. */
    size_t len;
    uint8_t *buf = image_with_len(4096, "{}", NULL, 0, &len);
    char *p = tdir_file(dir, "model.safetensors");
    cr_assert_eq(test_write_file(p, buf, len), 0);
    rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "truncated");
    cr_assert_not_null(strstr(err.msg, p), "%s", err.msg);
    free(p);
    free(buf);
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, two_shard_index_opens_both_and_finds_every_tensor)
{
    char *dir = test_mkdtemp();
    write_two_shards(dir);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":20},\"weight_map\":{"
               "\"x\":\"model-00001-of-00002.safetensors\","
               "\"y\":\"model-00002-of-00002.safetensors\"}}");
    struct st_set set;
    struct err err = {0};
    cr_assert_eq(st_set_open(dir, &set, &err), 0, "%s", err.msg);
    cr_assert_eq(set.n_files, 2);
    cr_assert_eq(set.n_tensors, 2);
    const struct st_tensor *x = st_set_find(&set, "x"), *y = st_set_find(&set, "y");
    cr_assert(x && y);
    cr_assert_neq(x->file_index, y->file_index);
    cr_assert_eq(memcmp(x->data, shard_a_data, sizeof shard_a_data), 0);
    cr_assert_eq(memcmp(y->data, shard_b_data, sizeof shard_b_data), 0);
    st_set_close(&set);
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, index_naming_a_missing_shard_is_an_io_error_naming_it)
{
    char *dir = test_mkdtemp();
    write_two_shards(dir);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
               "\"y\":\"model-00003-of-00002.safetensors\"}}");
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EIO, "model-00003-of-00002.safetensors");
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, index_placing_a_tensor_in_the_wrong_shard_is_refused)
{
    char *dir = test_mkdtemp();
    write_two_shards(dir);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"model-00002-of-00002.safetensors\","
               "\"y\":\"model-00002-of-00002.safetensors\"}}");
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    cr_assert_eq(rc, -INFERD_EFORMAT, "%s", err.msg);
    /* Only shard 2 is named, so x (in shard 1) is nowhere in the opened files. */
    cr_assert_not_null(strstr(err.msg, "'x'"), "%s", err.msg);

    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"model-00002-of-00002.safetensors\","
               "\"y\":\"model-00001-of-00002.safetensors\"}}");
    rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "but it is in model-0000");
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, index_naming_a_tensor_no_shard_holds_is_refused)
{
    char *dir = test_mkdtemp();
    write_two_shards(dir);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
               "\"z\":\"model-00001-of-00002.safetensors\"}}");
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "'z'");
    cr_assert_not_null(strstr(err.msg, "does not hold it"), "%s", err.msg);
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, shard_names_that_leave_the_directory_are_refused)
{
    char *dir = test_mkdtemp();
    write_two_shards(dir);
    const char *bad[] = {"../model-00001-of-00002.safetensors", "/etc/passwd",
                         "sub/model.safetensors", "..", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char idx[256];
        snprintf(idx, sizeof idx, "{\"weight_map\":{\"x\":\"%s\"}}", bad[i]);
        write_text(dir, "model.safetensors.index.json", idx);
        struct st_set set;
        struct err err = {0};
        int rc = st_set_open(dir, &set, &err);
        assert_refused(rc, err, INFERD_EFORMAT, "plain file name");
    }
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, malformed_index_is_refused)
{
    char *dir = test_mkdtemp();
    write_two_shards(dir);
    struct st_set set;
    struct err err = {0};
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    assert_refused(st_set_open(dir, &set, &err), err, INFERD_EFORMAT, "not valid JSON");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    assert_refused(st_set_open(dir, &set, &err), err, INFERD_EFORMAT, "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":3}}");
    assert_refused(st_set_open(dir, &set, &err), err, INFERD_EFORMAT, "not a file name");
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, tensor_in_two_shards_is_refused)
{
    char *dir = test_mkdtemp();
    write_image(dir, "s1.safetensors", SHARD_A_HDR, shard_a_data, sizeof shard_a_data);
    write_image(dir, "s2.safetensors", SHARD_A_HDR, shard_a_data, sizeof shard_a_data);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"s1.safetensors\",\"w\":\"s2.safetensors\"}}");
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "appears in both");
    test_rmtree(dir);
    free(dir);
}

Test(safetensors, bad_header_in_a_shard_names_the_shard)
{
    char *dir = test_mkdtemp();
    write_image(dir, "s1.safetensors",
                "{\"x\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}", "ab", 2);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"s1.safetensors\"}}");
    struct st_set set;
    struct err err = {0};
    int rc = st_set_open(dir, &set, &err);
    assert_refused(rc, err, INFERD_EUNSUPPORTED, "s1.safetensors");
    cr_assert_not_null(strstr(err.msg, "I8"), "%s", err.msg);
    test_rmtree(dir);
    free(dir);
}
