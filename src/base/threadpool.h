/* base/threadpool.h — a fixed set of worker threads that run one parallel job at a time. */
#ifndef INFERD_BASE_THREADPOOL_H
#define INFERD_BASE_THREADPOOL_H

#include "base/err.h"

/* A job: called once per thread with that thread's index ith in [0, nth). */
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

struct threadpool;

/* n_threads counts the calling thread, which works too; 0 means one per core. */
int threadpool_create(int n_threads, struct threadpool **out, struct err *err);
void threadpool_free(struct threadpool *pool);
int threadpool_size(const struct threadpool *pool);

/* Runs fn on every thread and returns when all have finished. Workers spin
 * briefly between jobs (decode issues hundreds of short jobs per token) and
 * then sleep. Not reentrant: one caller thread drives a pool (a second one running a job
 * at the same time aborts with a message rather than corrupting the first). */
void threadpool_run(struct threadpool *pool, threadpool_fn fn, void *ctx);

/* The [begin, end) share of n items for thread ith of nth, in multiples of align. */
void threadpool_split(long n, int ith, int nth, long align, long *begin, long *end);

#endif
