/* tests/unit/test_response_store.c — the Responses API's store: copies in and out, the LRU byte
 * cap, expiry on an injected clock, delete, and many threads at once. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/response_store.h"

struct fake_clock {
    uint64_t ms;
};

static uint64_t fake_now(void *ctx)
{
    return ((struct fake_clock *)ctx)->ms;
}

static struct response_store *make(size_t max_bytes, uint64_t ttl_ms, struct fake_clock *clock)
{
    struct response_store_config cfg = {.max_bytes = max_bytes, .ttl_ms = ttl_ms};
    if (clock) {
        cfg.clock_ms = fake_now;
        cfg.clock_ctx = clock;
    }
    struct response_store *s = NULL;
    struct err err = {0};
    cr_assert_eq(response_store_create(&cfg, &s, &err), 0, "%s", err.msg);
    return s;
}

static int put(struct response_store *s, const char *id, const char *response, const char *ctx)
{
    struct err err = {0};
    return response_store_put(s, id, response, strlen(response), ctx, strlen(ctx), &err);
}

static bool has(struct response_store *s, const char *id)
{
    int rc = response_store_get(s, id, NULL, NULL, NULL, NULL);
    cr_assert_geq(rc, 0);
    return rc == 1;
}

/* The bytes one entry with these texts takes (what stats report after putting it alone). */
static size_t entry_bytes(const char *id, const char *response, const char *ctx)
{
    struct response_store *s = make(1 << 20, 0, NULL);
    cr_assert_eq(put(s, id, response, ctx), 0);
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    response_store_free(s);
    return st.bytes;
}

Test(response_store, put_then_get_returns_copies_of_both_texts)
{
    struct response_store *s = make(1 << 20, 0, NULL);
    cr_assert_eq(put(s, "resp_1", "{\"id\":\"resp_1\"}", "{\"messages\":[]}"), 0);
    char *response = NULL, *ctx = NULL;
    size_t rlen = 0, clen = 0;
    cr_assert_eq(response_store_get(s, "resp_1", &response, &rlen, &ctx, &clen), 1);
    cr_assert_str_eq(response, "{\"id\":\"resp_1\"}");
    cr_assert_eq(rlen, strlen(response));
    cr_assert_str_eq(ctx, "{\"messages\":[]}");
    cr_assert_eq(clen, strlen(ctx));
    free(response);
    free(ctx);
    cr_assert_eq(response_store_get(s, "resp_2", &response, NULL, NULL, NULL), 0);
    cr_assert_null(response);
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 1);
    cr_assert_gt(st.bytes, strlen("{\"id\":\"resp_1\"}") + strlen("{\"messages\":[]}"));
    cr_assert_eq(st.max_bytes, (size_t)1 << 20);
    response_store_free(s);
}

Test(response_store, a_second_put_of_an_id_replaces_the_first)
{
    struct response_store *s = make(1 << 20, 0, NULL);
    cr_assert_eq(put(s, "r", "old", "a"), 0);
    cr_assert_eq(put(s, "r", "new", "b"), 0);
    char *response = NULL;
    cr_assert_eq(response_store_get(s, "r", &response, NULL, NULL, NULL), 1);
    cr_assert_str_eq(response, "new");
    free(response);
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 1);
    response_store_free(s);
}

Test(response_store, past_the_byte_cap_the_least_recently_used_entry_goes)
{
    size_t one = entry_bytes("r1", "response", "context");
    struct response_store *s = make(3 * one, 0, NULL);
    cr_assert_eq(put(s, "r1", "response", "context"), 0);
    cr_assert_eq(put(s, "r2", "response", "context"), 0);
    cr_assert_eq(put(s, "r3", "response", "context"), 0);
    cr_assert(has(s, "r1")); /* r1 is now the most recently used; r2 the least */
    cr_assert_eq(put(s, "r4", "response", "context"), 0);
    cr_assert(!has(s, "r2"), "the least recently used entry was kept");
    cr_assert(has(s, "r1") && has(s, "r3") && has(s, "r4"));
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 3);
    cr_assert_leq(st.bytes, 3 * one);
    cr_assert_eq(st.evictions, 1);
    response_store_free(s);
}

Test(response_store, an_entry_over_the_cap_alone_is_refused_and_evicts_nothing)
{
    size_t one = entry_bytes("r1", "x", "y");
    struct response_store *s = make(one + 8, 0, NULL);
    cr_assert_eq(put(s, "r1", "x", "y"), 0);
    char big[256];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    struct err err = {0};
    cr_assert_eq(response_store_put(s, "r2", big, strlen(big), "", 0, &err), -INFERD_ERANGE);
    cr_assert_not_null(strstr(err.msg, "--response-store-mb"), "%s", err.msg);
    cr_assert(has(s, "r1"));
    cr_assert(!has(s, "r2"));
    response_store_free(s);
}

Test(response_store, a_zero_cap_keeps_nothing)
{
    struct response_store *s = make(0, 0, NULL);
    cr_assert_eq(put(s, "r1", "x", "y"), -INFERD_ERANGE);
    cr_assert(!has(s, "r1"));
    response_store_free(s);
}

Test(response_store, entries_expire_ttl_after_their_put_on_the_injected_clock)
{
    struct fake_clock clock = {.ms = 1000};
    struct response_store *s = make(1 << 20, 500, &clock);
    cr_assert_eq(put(s, "old", "a", "b"), 0);
    clock.ms = 1300;
    cr_assert_eq(put(s, "young", "a", "b"), 0);
    clock.ms = 1499;
    cr_assert(has(s, "old"), "expired before its time");
    clock.ms = 1500;
    cr_assert(!has(s, "old"), "kept past its time");
    cr_assert(has(s, "young"));
    cr_assert(!response_store_delete(s, "old"), "an expired entry can still be deleted");
    clock.ms = 1800;
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.bytes, 0);
    cr_assert_eq(st.expirations, 2);
    cr_assert_eq(st.ttl_s, 0); /* 500 ms */
    response_store_free(s);
}

Test(response_store, a_get_does_not_extend_an_entrys_life)
{
    struct fake_clock clock = {.ms = 0};
    struct response_store *s = make(1 << 20, 100, &clock);
    cr_assert_eq(put(s, "r", "a", "b"), 0);
    clock.ms = 90;
    cr_assert(has(s, "r"));
    clock.ms = 100;
    cr_assert(!has(s, "r"));
    response_store_free(s);
}

Test(response_store, delete_drops_an_entry_once)
{
    struct response_store *s = make(1 << 20, 0, NULL);
    cr_assert_eq(put(s, "r", "a", "b"), 0);
    cr_assert(response_store_delete(s, "r"));
    cr_assert(!has(s, "r"));
    cr_assert(!response_store_delete(s, "r"));
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.bytes, 0);
    response_store_free(s);
}

Test(response_store, ids_must_be_one_to_the_maximum_bytes)
{
    struct response_store *s = make(1 << 20, 0, NULL);
    char long_id[RESPONSE_STORE_MAX_ID + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    cr_assert_eq(put(s, "", "a", "b"), -INFERD_EINVAL);
    cr_assert_eq(put(s, long_id, "a", "b"), -INFERD_EINVAL);
    long_id[RESPONSE_STORE_MAX_ID] = '\0';
    cr_assert_eq(put(s, long_id, "a", "b"), 0);
    response_store_free(s);
}

Test(response_store, many_entries_grow_the_table_and_all_stay_reachable)
{
    struct response_store *s = make(64 << 20, 0, NULL);
    char id[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        cr_assert_eq(put(s, id, id, "ctx"), 0);
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        char *response = NULL;
        cr_assert_eq(response_store_get(s, id, &response, NULL, NULL, NULL), 1, "%s", id);
        cr_assert_str_eq(response, id);
        free(response);
    }
    response_store_free(s);
}

/* ---- threads ---- */

struct worker {
    struct response_store *s;
    int seed;
};

static void *hammer(void *arg)
{
    struct worker *w = arg;
    char id[32], text[64];
    unsigned r = (unsigned)w->seed;
    for (int i = 0; i < 20000; i++) {
        r = r * 1103515245u + 12345u;
        snprintf(id, sizeof id, "resp_%03u", (r >> 8) % 200);
        snprintf(text, sizeof text, "{\"id\":\"%s\"}", id);
        switch ((r >> 4) % 4) {
        case 0:
        case 1: {
            struct err err = {0};
            if (response_store_put(w->s, id, text, strlen(text), "c", 1, &err) < 0)
                return "put failed";
            break;
        }
        case 2: {
            char *got = NULL;
            int rc = response_store_get(w->s, id, &got, NULL, NULL, NULL);
            if (rc < 0 || (rc == 1 && strcmp(got, text) != 0)) {
                free(got);
                return "get returned another entry's text";
            }
            free(got);
            break;
        }
        default:
            response_store_delete(w->s, id);
        }
    }
    return NULL;
}

Test(response_store, threads_putting_getting_and_deleting_keep_it_consistent)
{
    size_t one = entry_bytes("resp_100", "{\"id\":\"resp_100\"}", "c");
    struct response_store *s = make(50 * one, 0, NULL);
    pthread_t t[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){s, i + 1};
        cr_assert_eq(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *why = NULL;
        pthread_join(t[i], &why);
        cr_assert_null(why, "%s", (const char *)why);
    }
    struct response_store_stats st;
    response_store_get_stats(s, &st);
    cr_assert_leq(st.bytes, st.max_bytes);
    cr_assert_leq(st.entries, 50);
    size_t found = 0;
    char id[32];
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof id, "resp_%03d", i);
        found += has(s, id);
    }
    cr_assert_eq(found, st.entries, "%zu reachable, %zu counted", found, st.entries);
    response_store_free(s);
}
