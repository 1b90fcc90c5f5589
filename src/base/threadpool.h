/* base/threadpool.h — a fixed set of worker threads that run one parallel job at a time. */
#ifndef INFERD_BASE_THREADPOOL_H
#define INFERD_BASE_THREADPOOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* A job: called once per thread with that thread's index ith in [0, nth). */
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

struct threadpool;

/* n_threads counts the calling thread, which works too; 0 means one per core. */
int threadpool_create(int n_threads, struct threadpool **out, struct err *err);
void threadpool_free(struct threadpool *pool);
int threadpool_size(const struct threadpool *pool);

/* Runs the held loops, then fn, on every thread and returns when all have
 * finished. Workers spin briefly between jobs (decode issues hundreds of
 * short jobs per token) and then sleep. Not reentrant: one caller thread
 * drives a pool (a second one running a job at the same time aborts with a
 * message rather than corrupting the first). */
void threadpool_run(struct threadpool *pool, threadpool_fn fn, void *ctx);

/* Held loops. A caller may hand the pool a small loop to run with its next
 * job instead of now (alone on the calling thread while the workers wait, or
 * as a job of its own): threadpool_hold copies the loop's context (at most
 * THREADPOOL_HOLD_BYTES) and keeps it; the next threadpool_run runs the held
 * loops first, in order, on every thread, then its own function, with one wake
 * of the workers for all of them. A held loop splits its work as
 * threadpool_split splits `items` units (align 1) among the threads; the
 * threads meet between two held loops only where their items differ, and
 * always after the last one, so a loop's share may read what the same share of
 * an earlier loop of the same items wrote, and the job what any of them wrote.
 * threadpool_flush runs what is held now: as a job of its own, or on the
 * calling thread alone (here). Loops of one item each run on the calling
 * thread, with no meeting; a pool of one thread runs a loop at once. */
#define THREADPOOL_HOLD_MAX 24
#define THREADPOOL_HOLD_BYTES 128

void threadpool_hold(struct threadpool *pool, threadpool_fn fn, const void *ctx, size_t bytes,
                     long items);
void threadpool_flush(struct threadpool *pool, bool here);
/* Loops held and not yet run. */
int threadpool_held(const struct threadpool *pool);

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
