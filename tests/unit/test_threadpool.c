/* tests/unit/test_threadpool.c — the worker pool runs every share exactly once and splits ranges exactly. */
#include <criterion/criterion.h>
#include <stdatomic.h>

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
