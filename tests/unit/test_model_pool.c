/* tests/unit/test_model_pool.c — the model pool's accounting: loads on first use, the memory
 * limit unloading the least recently used (idle before busy, never one in use before its
 * requests end), waiters bounded and told of failed loads, and request resolution's errors. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/model_pool.h"

/* A fake loader: each entry's bytes are its path's number; loads and unloads are recorded. */
struct fake {
    pthread_mutex_t lock;
    char log[1024];
    int loads, unloads;
    bool fail; /* the next load fails */
    int load_ms;
    uint64_t extra;
};

static void note(struct fake *f, const char *what, const char *id)
{
    pthread_mutex_lock(&f->lock);
    size_t n = strlen(f->log);
    snprintf(f->log + n, sizeof f->log - n, "%s%s:%s", n ? " " : "", what, id);
    pthread_mutex_unlock(&f->lock);
}

static uint64_t fake_estimate(void *ctx, const char *id, const char *path, const void *options)
{
    (void)ctx, (void)id, (void)options;
    return (uint64_t)atoll(path);
}

static int fake_load(void *ctx, const char *id, const char *path, const void *options,
                     struct served_model *sm, void **handle, uint64_t *bytes, struct err *err)
{
    struct fake *f = ctx;
    (void)options;
    if (f->load_ms)
        usleep((useconds_t)f->load_ms * 1000);
    if (f->fail) {
        f->fail = false;
        return err_set(err, INFERD_EIO, "no weights in %s", path);
    }
    f->loads++;
    note(f, "load", id);
    sm->n_eos = 1;
    *handle = f;
    *bytes = (uint64_t)atoll(path);
    return 0;
}

static uint64_t fake_unload(void *ctx, const char *id, struct served_model *sm, void *handle)
{
    struct fake *f = ctx;
    cr_assert_eq(handle, f);
    cr_assert_eq(sm->n_eos, 1, "the unloaded entry is still filled in");
    f->unloads++;
    note(f, "unload", id);
    return 7;
}

static uint64_t fake_extra(void *ctx)
{
    return ((struct fake *)ctx)->extra;
}

static struct model_pool *make(struct fake *f, uint64_t limit, int max_waiting)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    struct model_pool_config cfg = {
        .memory_limit_bytes = limit,
        .max_waiting = max_waiting,
        .loader = {.estimate = fake_estimate, .load = fake_load, .unload = fake_unload,
                   .extra_bytes = fake_extra, .ctx = f},
    };
    struct model_pool *p = NULL;
    struct err err = {0};
    cr_assert_eq(model_pool_create(&cfg, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(model_pool_add(p, "a", "100", NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_pool_add(p, "b", "100", NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(model_pool_add(p, "c", "50", NULL, &err), 0, "%s", err.msg);
    return p;
}

static struct served_model *take(struct model_pool *p, const char *id)
{
    struct served_model *sm = NULL;
    struct err err = {0};
    cr_assert_eq(model_pool_acquire(p, id, &sm, &err), 0, "%s: %s", id, err.msg);
    cr_assert_str_eq(sm->id, id && id[0] ? id : "a");
    return sm;
}

static enum model_pool_state state_of(struct model_pool *p, int i)
{
    struct model_pool_info in;
    model_pool_info(p, i, &in);
    return in.state;
}

Test(model_pool, loads_on_first_use_and_the_default_is_the_first_entry)
{
    struct fake f;
    struct model_pool *p = make(&f, 0, 8);
    cr_assert_str_eq(model_pool_default_id(p), "a");
    cr_assert_eq(state_of(p, 1), MODEL_POOL_UNLOADED);
    cr_assert_null(model_pool_peek(p, "b"), "peeking never loads");
    struct served_model *sm = take(p, NULL);
    model_pool_release(p, sm);
    sm = take(p, "b");
    model_pool_release(p, sm);
    sm = take(p, "b"); /* resident: no second load */
    model_pool_release(p, sm);
    cr_assert_eq(f.loads, 2);
    cr_assert_str_eq(f.log, "load:a load:b");
    struct model_pool_info in;
    model_pool_info(p, 1, &in);
    cr_assert_eq(in.state, MODEL_POOL_RESIDENT);
    cr_assert_eq(in.requests, 2);
    cr_assert_eq(in.loads, 1);
    cr_assert_eq(in.bytes, 100);
    model_pool_free(p);
    cr_assert_eq(f.unloads, 2, "freeing the pool unloads what is resident");
}

Test(model_pool, a_limit_that_fits_one_model_unloads_the_least_recently_used)
{
    struct fake f;
    struct model_pool *p = make(&f, 160, 8);
    model_pool_release(p, take(p, "a"));
    model_pool_release(p, take(p, "c")); /* 150: both fit */
    cr_assert_eq(state_of(p, 0), MODEL_POOL_RESIDENT);
    model_pool_release(p, take(p, "a")); /* a is now the most recently used */
    model_pool_release(p, take(p, "b")); /* 250 would not fit: c (LRU) goes, then a */
    cr_assert_str_eq(f.log, "load:a load:c unload:c unload:a load:b");
    cr_assert_eq(state_of(p, 0), MODEL_POOL_UNLOADED);
    cr_assert_eq(state_of(p, 2), MODEL_POOL_UNLOADED);
    struct model_pool_totals t;
    model_pool_totals(p, &t);
    cr_assert_eq(t.resident_bytes, 100);
    cr_assert_eq(t.evictions, 2);
    struct model_pool_info in;
    model_pool_info(p, 0, &in);
    cr_assert_eq(in.demotions, 7, "an unload reports what it demoted to the SSD tier");
    cr_assert_eq(in.unloads, 1);
    model_pool_free(p);
}

Test(model_pool, bytes_outside_the_pool_count_against_its_limit)
{
    struct fake f;
    struct model_pool *p = make(&f, 160, 8);
    model_pool_release(p, take(p, "a"));
    f.extra = 20; /* a Whisper model loaded beside: 100 + 50 + 20 > 160 */
    model_pool_release(p, take(p, "c"));
    cr_assert_eq(state_of(p, 0), MODEL_POOL_UNLOADED);
    cr_assert_eq(state_of(p, 2), MODEL_POOL_RESIDENT);
    model_pool_free(p);
}

struct taker {
    struct model_pool *p;
    const char *id;
    int rc;
    struct err err;
};

static void *take_thread(void *arg)
{
    struct taker *t = arg;
    struct served_model *sm = NULL;
    t->rc = model_pool_acquire(t->p, t->id, &sm, &t->err);
    if (t->rc == 0)
        model_pool_release(t->p, sm);
    return NULL;
}

Test(model_pool, a_model_in_use_is_unloaded_only_after_its_requests_end)
{
    struct fake f;
    struct model_pool *p = make(&f, 150, 8);
    struct served_model *held = take(p, "a");
    struct taker t = {.p = p, .id = "b"};
    pthread_t th;
    pthread_create(&th, NULL, take_thread, &t);
    /* b waits: a must go first and is in use. */
    for (int i = 0; i < 200 && state_of(p, 0) != MODEL_POOL_UNLOADING; i++)
        usleep(5000);
    cr_assert_eq(state_of(p, 0), MODEL_POOL_UNLOADING);
    cr_assert_eq(f.unloads, 0, "nothing is unloaded under a request");
    cr_assert_null(model_pool_peek(p, "a"), "an unloading model takes no new requests");
    model_pool_release(p, held);
    pthread_join(th, NULL);
    cr_assert_eq(t.rc, 0, "%s", t.err.msg);
    cr_assert_str_eq(f.log, "load:a unload:a load:b");
    model_pool_free(p);
}

Test(model_pool, idle_models_are_unloaded_before_busy_ones)
{
    struct fake f;
    struct model_pool *p = make(&f, 200, 8);
    struct served_model *a = take(p, "a"); /* busy, and least recently used */
    model_pool_release(p, take(p, "c"));   /* idle */
    model_pool_release(p, take(p, "b"));   /* needs 100: 250 > 200, c goes, not a */
    cr_assert_str_eq(f.log, "load:a load:c unload:c load:b");
    model_pool_release(p, a);
    model_pool_free(p);
}

Test(model_pool, waiters_hear_of_a_failed_load_and_the_next_request_tries_again)
{
    struct fake f;
    struct model_pool *p = make(&f, 0, 8);
    f.fail = true;
    struct served_model *sm = NULL;
    struct err err = {0};
    cr_assert_eq(model_pool_acquire(p, "b", &sm, &err), -INFERD_EIO);
    cr_assert(strstr(err.msg, "no weights in 100"), "%s", err.msg);
    struct model_pool_info in;
    model_pool_info(p, 1, &in);
    cr_assert_eq(in.load_failures, 1);
    cr_assert(strstr(in.last_error, "no weights"));
    model_pool_release(p, take(p, "b"));
    model_pool_free(p);
}

Test(model_pool, waiting_for_loads_is_bounded)
{
    struct fake f;
    struct model_pool *p = make(&f, 0, 1);
    f.load_ms = 300;
    struct taker t = {.p = p, .id = "b"};
    pthread_t th;
    pthread_create(&th, NULL, take_thread, &t);
    for (int i = 0; i < 200; i++) {
        struct model_pool_totals tot;
        model_pool_totals(p, &tot);
        if (tot.waiting == 1)
            break;
        usleep(1000);
    }
    struct served_model *sm = NULL;
    struct err err = {0};
    cr_assert_eq(model_pool_acquire(p, "c", &sm, &err), -INFERD_EBUSY);
    pthread_join(th, NULL);
    cr_assert_eq(t.rc, 0, "%s", t.err.msg);
    struct model_pool_totals tot;
    model_pool_totals(p, &tot);
    cr_assert_eq(tot.refused, 1);
    model_pool_free(p);
}

Test(model_pool, ids_are_unique_and_printable)
{
    struct fake f;
    struct model_pool *p = make(&f, 0, 8);
    struct err err = {0};
    cr_assert_eq(model_pool_add(p, "a", "1", NULL, &err), -INFERD_EINVAL);
    cr_assert(strstr(err.msg, "two pool models"), "%s", err.msg);
    cr_assert_eq(model_pool_add(p, "x\"y", "1", NULL, &err), -INFERD_EINVAL);
    cr_assert_eq(model_pool_add(p, "", "1", NULL, &err), -INFERD_EINVAL);
    cr_assert_eq(model_pool_set_default(p, "nope", &err), -INFERD_ENOENT);
    cr_assert_eq(model_pool_set_default(p, "c", &err), 0);
    cr_assert_str_eq(model_pool_default_id(p), "c");
    model_pool_free(p);
}

Test(model_pool, requests_resolve_unknown_models_to_404_and_without_a_pool_ignore_the_name)
{
    struct fake f;
    struct server srv;
    memset(&srv, 0, sizeof srv);
    snprintf(srv.served.id, sizeof srv.served.id, "one");
    struct served_model *sm = NULL;
    struct api_error e;
    memset(&e, 0, sizeof e);
    cr_assert_eq(served_model_acquire(&srv, "anything", &sm, &e), 0);
    cr_assert_eq(sm, &srv.served);
    served_model_release(&srv, sm);

    srv.pool = make(&f, 0, 8);
    cr_assert_eq(served_model_acquire(&srv, "nope", &sm, &e), -INFERD_ENOENT);
    cr_assert_eq(e.status, 404);
    cr_assert_str_eq(e.code, "model_not_found");
    cr_assert_str_eq(e.param, "model");
    f.fail = true;
    cr_assert_eq(served_model_acquire(&srv, "c", &sm, &e), -INFERD_EIO);
    cr_assert_eq(e.status, 503);
    cr_assert_eq(served_model_acquire(&srv, "c", &sm, &e), 0);
    cr_assert_str_eq(sm->id, "c");
    served_model_release(&srv, sm);
    model_pool_free(srv.pool);
}
