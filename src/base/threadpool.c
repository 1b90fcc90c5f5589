/* base/threadpool.c — spin-then-sleep worker pool for fork-join parallel loops. */
#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cpu.h"

#define SPIN_ITERATIONS 200000
/* While spinning, give the core away this often: when the machine has more
 * runnable threads than cores (HTTP threads, other processes), a spinning
 * thread would otherwise hold a core the thread it waits for needs. */
#define SPINS_PER_YIELD 256

/* A held loop: its function, its context's copy and the items it splits. */
struct held_loop {
    threadpool_fn fn;
    long items;
    _Alignas(16) unsigned char ctx[THREADPOOL_HOLD_BYTES];
};

struct threadpool {
    int n_threads;
    pthread_t *workers; /* owned; n_threads - 1 */
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    _Atomic unsigned generation; /* bumped once per job */
    _Atomic int pending;         /* workers still running the current job */
    _Atomic int stopping;
    _Atomic bool running;        /* a job is in flight: a second caller is a bug */
    threadpool_fn fn;
    void *ctx;
    /* the loops held for the next job, and that job's own function (NULL:
     * a flush) once they run */
    struct held_loop held[THREADPOOL_HOLD_MAX];
    int n_held;
    threadpool_fn after_fn;
    void *after_ctx;
    _Alignas(64) _Atomic int arrived; /* threads past the current meeting point */
};

struct worker_arg {
    struct threadpool *pool;
    int ith;
};

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

static void *worker_main(void *arg_)
{
    struct worker_arg arg = *(struct worker_arg *)arg_;
    free(arg_);
    struct threadpool *pool = arg.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stopping)) {
            if (++spins < SPIN_ITERATIONS) {
                if (spins % SPINS_PER_YIELD == 0)
                    sched_yield();
                else
                    cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool->mutex);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stopping))
                pthread_cond_wait(&pool->wake, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (atomic_load(&pool->stopping))
            return NULL;
        seen = gen;
        pool->fn(pool->ctx, arg.ith, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

int threadpool_create(int n_threads, struct threadpool **out, struct err *err)
{
    if (n_threads <= 0)
        n_threads = cpu_features()->n_cores;
    if (n_threads > 1024)
        return err_set(err, INFERD_ERANGE, "thread count %d is too large", n_threads);
    struct threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return err_set(err, INFERD_ENOMEM, "out of memory creating thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        free(pool);
        return err_set(err, INFERD_ENOMEM, "out of memory creating thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *arg = malloc(sizeof *arg);
        if (arg) {
            arg->pool = pool;
            arg->ith = i;
        }
        if (!arg || pthread_create(&pool->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i;
            threadpool_free(pool);
            return err_set(err, INFERD_ENOMEM, "could not start worker thread %d", i);
        }
    }
    *out = pool;
    return 0;
}

void threadpool_free(struct threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stopping, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->workers[i - 1], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->workers);
    free(pool);
}

int threadpool_size(const struct threadpool *pool) { return pool ? pool->n_threads : 1; }

/* Waits until `count` threads have arrived (each thread's own arrival counted by the caller). */
static void meet(struct threadpool *pool, int count)
{
    atomic_fetch_add_explicit(&pool->arrived, 1, memory_order_acq_rel);
    for (unsigned spins = 1; atomic_load_explicit(&pool->arrived, memory_order_acquire) < count;
         spins++) {
        if (spins % SPINS_PER_YIELD == 0)
            sched_yield();
        else
            cpu_relax();
    }
}

/* The job of a run with held loops: each loop, a meeting where the next one's items
 * differ and after the last, then the run's own function. */
static void held_job(void *ctx, int ith, int nth)
{
    struct threadpool *pool = ctx;
    int meetings = 0;
    for (int i = 0; i < pool->n_held; i++) {
        const struct held_loop *h = &pool->held[i];
        h->fn((void *)h->ctx, ith, nth);
        bool last = i + 1 == pool->n_held;
        if ((last && pool->after_fn) || (!last && pool->held[i + 1].items != h->items))
            meet(pool, ++meetings * nth);
    }
    if (pool->after_fn)
        pool->after_fn(pool->after_ctx, ith, nth);
}

static void run_job(struct threadpool *pool, threadpool_fn fn, void *ctx);

/* Whether some held loop has work for more than one thread. */
static bool held_loops_split(const struct threadpool *pool)
{
    for (int i = 0; i < pool->n_held; i++)
        if (pool->held[i].items > 1)
            return true;
    return false;
}

void threadpool_hold(struct threadpool *pool, threadpool_fn fn, const void *ctx, size_t bytes,
                     long items)
{
    if (!pool || pool->n_threads == 1 || bytes > THREADPOOL_HOLD_BYTES) {
        threadpool_flush(pool, true);
        fn((void *)ctx, 0, 1);
        return;
    }
    if (pool->n_held == THREADPOOL_HOLD_MAX)
        threadpool_flush(pool, false);
    struct held_loop *h = &pool->held[pool->n_held++];
    h->fn = fn;
    h->items = items;
    memcpy(h->ctx, ctx, bytes);
}

int threadpool_held(const struct threadpool *pool) { return pool ? pool->n_held : 0; }

void threadpool_flush(struct threadpool *pool, bool here)
{
    if (!pool || pool->n_held == 0)
        return;
    if (here || !held_loops_split(pool)) {
        for (int i = 0; i < pool->n_held; i++)
            pool->held[i].fn(pool->held[i].ctx, 0, 1);
        pool->n_held = 0;
        return;
    }
    threadpool_run(pool, NULL, NULL);
}

void threadpool_run(struct threadpool *pool, threadpool_fn fn, void *ctx)
{
    /* loops of one item are the calling thread's alone: run here, they need no meeting */
    if (pool && pool->n_held > 0 && pool->n_threads > 1 && held_loops_split(pool)) {
        pool->after_fn = fn;
        pool->after_ctx = ctx;
        atomic_store_explicit(&pool->arrived, 0, memory_order_relaxed);
        run_job(pool, held_job, pool);
        pool->n_held = 0;
        return;
    }
    if (pool && pool->n_held > 0)
        threadpool_flush(pool, true);
    if (!fn)
        return;
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    run_job(pool, fn, ctx);
}

static void run_job(struct threadpool *pool, threadpool_fn fn, void *ctx)
{
    /* One job at a time: a second thread's job would overwrite fn and ctx under the
     * workers of the first (and its owner's scratch buffers); fail loudly instead. */
    if (atomic_exchange_explicit(&pool->running, true, memory_order_acquire)) {
        fputs("inferd: two threads ran jobs on one thread pool at once (a backend is driven "
              "by one thread at a time)\n", stderr);
        abort();
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    fn(ctx, 0, pool->n_threads);
    for (unsigned spins = 1; atomic_load_explicit(&pool->pending, memory_order_acquire) != 0;
         spins++) {
        if (spins % SPINS_PER_YIELD == 0)
            sched_yield();
        else
            cpu_relax();
    }
    atomic_store_explicit(&pool->running, false, memory_order_release);
}

void threadpool_split(long n, int ith, int nth, long align, long *begin, long *end)
{
    if (align < 1)
        align = 1;
    long units = (n + align - 1) / align;
    long per = units / nth, extra = units % nth;
    long ub = ith * per + (ith < extra ? ith : extra);
    long ue = ub + per + (ith < extra ? 1 : 0);
    *begin = ub * align < n ? ub * align : n;
    *end = ue * align < n ? ue * align : n;
}

void threadpool_shares_init(struct threadpool_shares *s, long n, int nth)
{
    s->n_shares = nth < THREADPOOL_MAX_SHARES ? nth : THREADPOOL_MAX_SHARES;
    for (int i = 0; i < s->n_shares; i++) {
        long b, e;
        threadpool_split(n, i, s->n_shares, 1, &b, &e);
        atomic_init(&s->share[i].span, (uint64_t)b | (uint64_t)e << 32);
    }
}

/* Takes share i's front item (own) or its back one; -1 when the share is empty. */
static long take(struct threadpool_shares *s, int i, bool own)
{
    uint64_t span = atomic_load_explicit(&s->share[i].span, memory_order_relaxed);
    for (;;) {
        uint64_t next = span & 0xffffffffu, end = span >> 32;
        if (next >= end)
            return -1;
        uint64_t after = own ? (next + 1) | end << 32 : next | (end - 1) << 32;
        if (atomic_compare_exchange_weak_explicit(&s->share[i].span, &span, after,
                                                  memory_order_relaxed, memory_order_relaxed))
            return (long)(own ? next : end - 1);
    }
}

long threadpool_shares_next(struct threadpool_shares *s, int ith)
{
    if (ith < s->n_shares) {
        long item = take(s, ith, true);
        if (item >= 0)
            return item;
    }
    /* the others' shares, each until it is empty (an empty share stays empty) */
    for (int k = 1; k <= s->n_shares; k++) {
        long item = take(s, (ith + k) % s->n_shares, false);
        if (item >= 0)
            return item;
    }
    return -1;
}
