/* tests/unit/test_strbuf.c — the growable byte string: appends, the size limit, reset and handing the bytes over. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"

Test(strbuf, appends_keep_the_text_nul_terminated)
{
    struct strbuf b = {0};
    cr_assert(strbuf_append(&b, "ab", 2));
    cr_assert(strbuf_putc(&b, 'c'));
    cr_assert(strbuf_puts(&b, "de"));
    cr_assert(strbuf_printf(&b, "%d", 42));
    cr_assert_str_eq(b.data, "abcde42");
    cr_assert_eq(b.len, 7);
    strbuf_consume(&b, 5);
    cr_assert_str_eq(b.data, "42");
    strbuf_free(&b);
    cr_assert_null(b.data);
}

Test(strbuf, an_append_past_the_limit_fails_and_later_appends_are_dropped)
{
    struct strbuf b = {.limit = 4};
    cr_assert(strbuf_append(&b, "abcd", 4), "exactly the limit fits");
    cr_assert_not(strbuf_putc(&b, 'e'));
    cr_assert(b.failed);
    cr_assert_str_eq(b.data, "abcd", "a failed append changes nothing");
    strbuf_reset(&b);
    cr_assert_not(b.failed);
    cr_assert_eq(b.limit, 4, "reset keeps the limit");
    cr_assert(strbuf_append(&b, "xy", 2));
    cr_assert_str_eq(b.data, "xy");
    strbuf_free(&b);
}

Test(strbuf, reserve_makes_room_without_changing_the_text)
{
    struct strbuf b = {0};
    cr_assert(strbuf_reserve(&b, 1000));
    cr_assert_geq(b.cap, 1001);
    cr_assert_eq(b.len, 0);
    char *before = b.data;
    for (int i = 0; i < 1000; i++)
        strbuf_putc(&b, 'x');
    cr_assert_eq(b.data, before, "no reallocation within the reserved room");
    strbuf_free(&b);
}

Test(strbuf, take_hands_over_the_bytes_and_empties_the_buffer)
{
    struct strbuf b = {.limit = 100};
    size_t len = 99;
    char *empty = strbuf_take(&b, &len);
    cr_assert_not_null(empty, "an empty buffer gives an empty string");
    cr_assert_str_eq(empty, "");
    cr_assert_eq(len, 0);
    free(empty);
    strbuf_puts(&b, "hello");
    char *s = strbuf_take(&b, &len);
    cr_assert_str_eq(s, "hello");
    cr_assert_eq(len, 5);
    cr_assert_null(b.data);
    cr_assert_eq(b.limit, 100);
    free(s);
    b.limit = 2;
    strbuf_puts(&b, "abc");
    cr_assert_null(strbuf_take(&b, NULL), "a failed buffer hands over nothing");
}
