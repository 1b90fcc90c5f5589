/* fuzz/fuzz_json.c — libFuzzer target: JSON text parsing and every typed reader on arbitrary documents. */
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static const char *const names[] = {"a", "b", "role", "", NULL};

/* A failed read must leave a message and a path that names a value below r. */
static void check_failure(int rc, const struct json_reader *r, const struct err *err)
{
    if (rc == 0)
        return;
    if (rc > 0 || err->msg[0] == '\0')
        __builtin_trap();
    char path[128];
    json_reader_path(r, path, sizeof path);
    if (strncmp(r->doc->err_path, path, strlen(path)) != 0)
        __builtin_trap();
}

/* Every typed read on r, then the same on its members and elements. */
static void visit(const struct json_reader *r, struct err *err, int depth)
{
    const char *s = NULL;
    size_t n = 0;
    bool b = false, here = false;
    int64_t i = 0;
    int k = 0, e = -1;
    double d = 0;
    char *copy = NULL;
    struct json_reader sub;
    check_failure(json_read_str(r, NULL, JSON_OPTIONAL, &s, &n), r, err);
    if (s && strlen(s) > n)
        __builtin_trap();
    check_failure(json_read_strdup(r, NULL, &here, &copy, &n), r, err);
    free(copy);
    check_failure(json_read_bool(r, NULL, JSON_OPTIONAL, &b), r, err);
    if (json_read_int64(r, NULL, &here, -5, 1 << 20, &i) == 0 && here && (i < -5 || i > 1 << 20))
        __builtin_trap();
    check_failure(json_read_int(r, NULL, JSON_REQUIRED, INT32_MIN, INT32_MAX, &k), r, err);
    if (json_read_double(r, NULL, &here, (struct json_range){0, 1, .lo_open = true}, &d) == 0 &&
        here && !(d > 0 && d <= 1))
        __builtin_trap();
    if (json_read_enum(r, NULL, &here, names, &e) == 0 && here && (e < 0 || e > 3))
        __builtin_trap();
    check_failure(json_reader_check_keys(r, names), r, err);
    check_failure(json_reader_check_tree(r), r, err);
    if (depth >= 6)
        return;
    if (json_read_object(r, NULL, JSON_OPTIONAL, &sub) == 0 && sub.v) {
        json_object_object_foreach(sub.v, key, val)
        {
            struct json_reader m = json_reader_entry(&sub, key, val);
            visit(&m, err, depth + 1);
        }
        struct json_reader m = json_reader_member(&sub, "role");
        visit(&m, err, depth + 1);
    }
    if (json_read_array(r, NULL, JSON_OPTIONAL, &sub, &n) == 0) {
        for (size_t j = 0; j < n && j < 16; j++) {
            struct json_reader el = json_reader_element(&sub, j);
            visit(&el, err, depth + 1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    /* The first byte picks the options, the rest is the document. */
    unsigned opts = data[0];
    struct err err = {0};
    struct json_object *root = NULL;
    if (json_text_parse((const char *)data + 1, size - 1, 1 + (opts & 63), opts & 64, &root,
                        &err) != 0)
        return 0;
    struct json_doc doc = {.err = &err,
                           .prefix = (opts & 128) ? "fuzz" : NULL,
                           .name = "the document",
                           .flags = (opts & 1 ? JSON_TEXT : 0) |
                                    (opts & 2 ? JSON_INTEGRAL_DOUBLES : 0)};
    struct json_reader r = json_reader_root(&doc, root);
    visit(&r, &err, 0);
    json_object_put(root);
    return 0;
}
