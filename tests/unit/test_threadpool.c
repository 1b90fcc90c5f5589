/* tests/unit/test_threadpool.c — the worker pool runs every share exactly once and splits ranges exactly. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/threadpool.h"

struct count_job {
    _Atomic long calls;
    _Atomic long covered;
    long n;
};

static void count_share(void *ctx, int ith, int nth)
{
    struct count_job *job = ctx;
    long b, e;
    threadpool_split(job->n, ith, nth, 8, &b, &e);
    atomic_fetch_add(&job->calls, 1);
    atomic_fetch_add(&job->covered, e - b);
}

Test(threadpool, every_thread_runs_each_job_once_and_shares_cover_the_range)
{
    struct threadpool *pool;
    struct err err = {0};
    cr_assert_eq(threadpool_create(3, &pool, &err), 0, "%s", err.msg);
    for (int rep = 0; rep < 300; rep++) {
        struct count_job job = {.n = 1000 + rep};
        threadpool_run(pool, count_share, &job);
        cr_assert_eq(job.calls, 3);
        cr_assert_eq(job.covered, job.n);
    }
    threadpool_free(pool);
}

Test(threadpool, split_is_aligned_contiguous_and_complete)
{
    for (long n = 0; n < 200; n++) {
        for (int nth = 1; nth <= 5; nth++) {
            long expect = 0;
            for (int i = 0; i < nth; i++) {
                long b, e;
                threadpool_split(n, i, nth, 16, &b, &e);
                cr_assert_eq(b, expect);
                cr_assert(b % 16 == 0 || b == n);
                cr_assert_geq(e, b);
                expect = e;
            }
            cr_assert_eq(expect, n);
        }
    }
}

Test(threadpool, absurd_thread_count_is_refused)
{
    struct threadpool *pool = NULL;
    struct err err = {0};
    cr_assert_lt(threadpool_create(100000, &pool, &err), 0);
    cr_assert_eq(err.code, INFERD_ERANGE);
}

/* Each item taken once, by whichever thread: marks per item, and which thread took it. */
struct shares_job {
    struct threadpool_shares shares;
    _Atomic int taken[600];
    int by[600];
    int stall_thread; /* this thread takes its first item, then sleeps: the others take the rest */
};

static void take_shares(void *ctx, int ith, int nth)
{
    (void)nth;
    struct shares_job *job = ctx;
    bool first = true;
    for (long item; (item = threadpool_shares_next(&job->shares, ith)) >= 0; first = false) {
        atomic_fetch_add(&job->taken[item], 1);
        job->by[item] = ith;
        if (first && ith == job->stall_thread) {
            struct timespec nap = {0, 20 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
    }
}

Test(threadpool, shares_give_every_item_once_and_a_stalled_threads_items_to_the_others)
{
    struct threadpool *pool;
    struct err err = {0};
    cr_assert_eq(threadpool_create(3, &pool, &err), 0, "%s", err.msg);
    for (long n = 0; n <= 600; n += n < 20 ? 1 : 97) {
        static struct shares_job job;
        memset(&job, 0, sizeof job);
        job.stall_thread = n == 600 ? 1 : -1;
        threadpool_shares_init(&job.shares, n, 3);
        threadpool_run(pool, take_shares, &job);
        for (long i = 0; i < n; i++)
            cr_assert_eq(job.taken[i], 1, "item %ld of %ld taken %d times", i, n, job.taken[i]);
        if (n == 600) { /* thread 1's share is items [200, 400): it took only the first */
            int others = 0;
            for (long i = 201; i < 400; i++)
                others += job.by[i] != 1;
            cr_assert_gt(others, 150, "the others took %d of the stalled thread's 199 items",
                         others);
        }
    }
    threadpool_free(pool);
}

Test(threadpool, shares_are_the_split_when_no_thread_falls_behind)
{
    struct threadpool_shares s;
    threadpool_shares_init(&s, 10, 3); /* one thread alone: its share, then the others' backs */
    long want[] = {0, 1, 2, 3, 6, 5, 4, 9, 8, 7};
    for (int i = 0; i < 10; i++)
        cr_assert_eq(threadpool_shares_next(&s, 0), want[i]);
    cr_assert_eq(threadpool_shares_next(&s, 0), -1);
    cr_assert_eq(threadpool_shares_next(&s, 2), -1);
    threadpool_shares_init(&s, 5, 100); /* more threads than shares: they only take */
    for (int i = 0; i < 5; i++)
        cr_assert_geq(threadpool_shares_next(&s, 80), 0);
    cr_assert_eq(threadpool_shares_next(&s, 80), -1);
}

/* Held loops: a[] and b[] written by loops the pool holds, read by the job after them. */
#define HELD_N 999
struct held_data {
    int a[HELD_N], b[HELD_N], seen[HELD_N];
    _Atomic int order; /* the loops' and the job's turns, as each thread saw them */
    _Atomic int bad;
};

struct held_loop_ctx {
    struct held_data *d;
    long n;     /* the items the loop splits */
    int stride; /* loop_spread: b[j] = a[(j * stride) % HELD_N] * 3; loop_turn: its number */
};

/* a[i] = i + 1 over the thread's share of HELD_N */
static void loop_fill(void *ctx, int ith, int nth)
{
    const struct held_loop_ctx *c = ctx;
    long b, e;
    threadpool_split(c->n, ith, nth, 1, &b, &e);
    for (long i = b; i < e; i++)
        c->d->a[i] = (int)i + 1;
}

/* a[i] *= 2 over the same share: reads what this thread wrote */
static void loop_double(void *ctx, int ith, int nth)
{
    const struct held_loop_ctx *c = ctx;
    long b, e;
    threadpool_split(c->n, ith, nth, 1, &b, &e);
    for (long i = b; i < e; i++)
        c->d->a[i] *= 2;
}

/* another split (HELD_N - 1 items): reads what any thread wrote */
static void loop_spread(void *ctx, int ith, int nth)
{
    const struct held_loop_ctx *c = ctx;
    long b, e;
    threadpool_split(c->n, ith, nth, 1, &b, &e);
    for (long j = b; j < e; j++)
        c->d->b[j] = c->d->a[(j * c->stride) % HELD_N] * 3;
}

/* the job: every thread checks every element of b the spread wrote */
static void job_check(void *ctx, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct held_data *d = ctx;
    for (long j = 0; j < HELD_N - 1; j++)
        if (d->b[j] != (int)((j * 7) % HELD_N + 1) * 2 * 3)
            atomic_fetch_add(&d->bad, 1);
}

static void hold_three(struct threadpool *pool, struct held_data *d)
{
    struct held_loop_ctx fill = {d, HELD_N, 0}, spread = {d, HELD_N - 1, 7};
    threadpool_hold(pool, loop_fill, &fill, sizeof fill, fill.n);
    threadpool_hold(pool, loop_double, &fill, sizeof fill, fill.n);
    threadpool_hold(pool, loop_spread, &spread, sizeof spread, spread.n);
}

Test(threadpool, held_loops_run_in_order_before_the_job_and_the_threads_meet_where_splits_differ)
{
    for (int threads = 1; threads <= 3; threads++) {
        struct threadpool *pool;
        struct err err = {0};
        cr_assert_eq(threadpool_create(threads, &pool, &err), 0, "%s", err.msg);
        static struct held_data d;
        for (int rep = 0; rep < 300; rep++) {
            memset(&d, 0, sizeof d);
            hold_three(pool, &d);
            cr_assert_eq(threadpool_held(pool), threads == 1 ? 0 : 3);
            threadpool_run(pool, job_check, &d);
            cr_assert_eq(threadpool_held(pool), 0);
            cr_assert_eq(d.bad, 0, "%d threads, rep %d: %d elements of b wrong", threads, rep,
                         d.bad);
        }
        /* flushed as a job of their own, or on this thread alone */
        for (int here = 0; here < 2; here++) {
            memset(&d, 0, sizeof d);
            hold_three(pool, &d);
            threadpool_flush(pool, here);
            cr_assert_eq(threadpool_held(pool), 0);
            job_check(&d, 0, 1);
            cr_assert_eq(d.bad, 0, "%d threads, flushed %s", threads, here ? "here" : "as a job");
        }
        threadpool_free(pool);
    }
}

/* More loops than the pool holds: the first ones run when it is full, in order. */
static void loop_turn(void *ctx, int ith, int nth)
{
    (void)nth;
    struct held_loop_ctx *c = ctx;
    if (ith == 0)
        c->d->seen[atomic_fetch_add(&c->d->order, 1)] = c->stride;
}

Test(threadpool, a_full_pool_runs_what_it_holds_and_keeps_the_order)
{
    struct threadpool *pool;
    struct err err = {0};
    cr_assert_eq(threadpool_create(2, &pool, &err), 0, "%s", err.msg);
    static struct held_data d;
    memset(&d, 0, sizeof d);
    int n = 3 * THREADPOOL_HOLD_MAX + 5;
    for (int i = 0; i < n; i++) {
        struct held_loop_ctx c = {&d, 1 + i % 2, i};
        threadpool_hold(pool, loop_turn, &c, sizeof c, c.n);
        cr_assert_leq(threadpool_held(pool), THREADPOOL_HOLD_MAX);
    }
    threadpool_flush(pool, false);
    cr_assert_eq(d.order, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(d.seen[i], i, "turn %d ran loop %d", i, d.seen[i]);
    threadpool_free(pool);
}
