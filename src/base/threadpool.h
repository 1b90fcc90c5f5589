/* base/threadpool.h — a fixed set of worker threads that run one parallel job at a time. */
#ifndef INFERD_BASE_THREADPOOL_H
#define INFERD_BASE_THREADPOOL_H

#include <stdatomic.h>
#include <stdint.h>

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

/* Shares of a job's items that the threads keep from one job to the next:
 * thread ith takes the items of its own share (threadpool_split's) from the
 * front, then items from the back of the other shares. With the same n and
 * nth, a thread gets the same items job after job unless it falls behind, so
 * the data of its items stays in its own core's caches (where each core has
 * its own L3, data another core read last comes from memory), and a thread
 * that lost its core for a while delays the job by one item, not its share. */
#define THREADPOOL_MAX_SHARES 64

struct threadpool_shares {
    int n_shares;
    struct {
        _Alignas(64) _Atomic uint64_t span; /* next item (low 32 bits), end (high 32 bits) */
    } share[THREADPOOL_MAX_SHARES];
};

/* Deals n items (below 2^31) to nth threads; threads past THREADPOOL_MAX_SHARES
 * have no share of their own and only take from the others'. */
void threadpool_shares_init(struct threadpool_shares *s, long n, int nth);
/* The next item for thread ith, or -1 when every item is taken. */
long threadpool_shares_next(struct threadpool_shares *s, int ith);

#endif
