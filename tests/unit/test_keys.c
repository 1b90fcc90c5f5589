/* tests/unit/test_keys.c — API keys: flags and key files, matching, and the prefix-cache
 * namespaces of tenants and cache salts. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/keys.h"
#include "base/err.h"

static struct api_keys keys;
static struct err err;

static void teardown(void)
{
    api_keys_free(&keys);
}

TestSuite(keys, .fini = teardown);

static int parse(const char *text)
{
    return api_keys_parse(&keys, text, strlen(text), "keys.txt", &err);
}

static int match(const char *given)
{
    return api_keys_match(&keys, given, strlen(given));
}

/* ---- key files ------------------------------------------------------------ */

Test(keys, a_key_file_skips_blank_lines_comments_and_surrounding_blanks)
{
    cr_assert_eq(parse("# team keys\n\nsk-one\n  sk-two\t\r\n   \n#sk-not\nsk-three"), 0, "%s",
                 err.msg);
    cr_assert_eq(keys.n, 3);
    cr_assert_str_eq(keys.keys[0], "sk-one");
    cr_assert_str_eq(keys.keys[1], "sk-two");
    cr_assert_str_eq(keys.keys[2], "sk-three");
}

Test(keys, a_key_listed_twice_is_kept_once)
{
    cr_assert_eq(parse("sk-a\nsk-a\n"), 0);
    cr_assert_eq(api_keys_add(&keys, "sk-a", &err), 0);
    cr_assert_eq(keys.n, 1);
}

Test(keys, a_key_with_a_space_inside_is_refused_naming_the_line)
{
    cr_assert_eq(parse("sk-a\nsk b\n"), -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "keys.txt:2"), "%s", err.msg);
}

Test(keys, an_oversize_key_is_refused)
{
    char big[API_KEY_MAX_BYTES + 2];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(api_keys_add(&keys, big, &err), -INFERD_EINVAL);
    cr_assert_eq(api_keys_add(&keys, "", &err), -INFERD_EINVAL);
    cr_assert_eq(keys.n, 0);
}

Test(keys, a_missing_file_is_an_io_error)
{
    cr_assert_eq(api_keys_load_file(&keys, "/nonexistent/inferd-keys.txt", &err), -INFERD_EIO);
    cr_assert_not_null(strstr(err.msg, "/nonexistent/inferd-keys.txt"), "%s", err.msg);
}

Test(keys, a_file_with_only_comments_is_an_error_saying_it_holds_no_key)
{
    char path[] = "/tmp/inferd-keys-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char text[] = "# nothing yet\n\n";
    cr_assert_eq(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    int rc = api_keys_load_file(&keys, path, &err);
    unlink(path);
    cr_assert_eq(rc, -INFERD_EINVAL);
    cr_assert_not_null(strstr(err.msg, "holds no key"), "%s", err.msg);
}

Test(keys, a_file_of_keys_loads)
{
    char path[] = "/tmp/inferd-keys-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char text[] = "sk-file-1\nsk-file-2\n";
    cr_assert_eq(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    int rc = api_keys_load_file(&keys, path, &err);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(keys.n, 2);
}

/* ---- matching --------------------------------------------------------------- */

Test(keys, every_listed_key_matches_and_nothing_else_does)
{
    cr_assert_eq(parse("sk-one\nsk-two\n"), 0);
    cr_assert_eq(match("sk-one"), 0);
    cr_assert_eq(match("sk-two"), 1);
    cr_assert_eq(match("sk-on"), -1);
    cr_assert_eq(match("sk-one2"), -1);
    cr_assert_eq(match(""), -1);
    cr_assert_eq(match("sk-three"), -1);
}

/* ---- namespaces --------------------------------------------------------------- */

Test(keys, two_keys_have_different_namespaces_and_neither_is_the_keyless_one)
{
    cr_assert_eq(parse("sk-one\nsk-two\n"), 0);
    cr_assert_neq(keys.ns[0], keys.ns[1]);
    cr_assert_neq(keys.ns[0], 0);
    cr_assert_neq(keys.ns[1], 0);
    cr_assert_eq(keys.ns[0], api_keys_namespace("sk-one", 6));
}

Test(keys, no_salt_keeps_the_tenants_namespace)
{
    cr_assert_eq(api_cache_namespace(0, NULL, 0), 0);
    uint64_t t = api_keys_namespace("sk-one", 6);
    cr_assert_eq(api_cache_namespace(t, NULL, 0), t);
}

Test(keys, the_same_key_and_salt_share_a_namespace)
{
    uint64_t t = api_keys_namespace("sk-one", 6);
    cr_assert_eq(api_cache_namespace(t, "salt", 4), api_cache_namespace(t, "salt", 4));
    cr_assert_eq(api_cache_namespace(0, "salt", 4), api_cache_namespace(0, "salt", 4));
}

Test(keys, different_salts_or_keys_never_share_a_namespace)
{
    uint64_t a = api_keys_namespace("sk-one", 6), b = api_keys_namespace("sk-two", 6);
    uint64_t ns[] = {
        0,
        a,
        b,
        api_cache_namespace(a, "s1", 2),
        api_cache_namespace(a, "s2", 2),
        api_cache_namespace(b, "s1", 2),
        api_cache_namespace(0, "s1", 2),
        api_cache_namespace(0, "sk-one", 6), /* a salt spelled like a key is not that tenant */
    };
    size_t n = sizeof ns / sizeof ns[0];
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            cr_assert_neq(ns[i], ns[j], "namespaces %zu and %zu collide", i, j);
}
