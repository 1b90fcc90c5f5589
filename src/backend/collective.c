/* backend/collective.c — the host communicator: ranks as threads of one process summing host buffers in rank order (backend/collective.h). */
#include "backend/collective.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

/* What the ranks of one group share: a reusable barrier and each rank's
 * buffer of the reduction in progress. */
struct host_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_ranks, arrived, refs;
    unsigned generation;
    float *bufs[COLLECTIVE_MAX_RANKS];
    int64_t n[COLLECTIVE_MAX_RANKS];
};

/* Waits until every rank of g has arrived; reusable at once (generation). */
static void group_barrier(struct host_group *g)
{
    pthread_mutex_lock(&g->mu);
    unsigned gen = g->generation;
    if (++g->arrived == g->n_ranks) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->generation)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

/* Rank r sums elements [lo, hi) over every rank's buffer in rank order and
 * writes the sum back to all of them: no other rank touches those elements,
 * and each element is the same rounding of the same ordered sum everywhere.
 * The second barrier keeps any rank from posting its next buffer while
 * another still reads this one. */
static int host_all_reduce(struct collective *c, struct backend *be, float *buf, int64_t n,
                           struct err *err)
{
    (void)be;
    struct host_group *g = c->impl;
    g->bufs[c->rank] = buf;
    g->n[c->rank] = n;
    group_barrier(g);
    for (int r = 0; r < g->n_ranks; r++)
        if (g->n[r] != n) {
            group_barrier(g);
            return err_set(err, INFERD_EINVAL, "all-reduce of %lld floats on rank %d, %lld on "
                           "rank %d", (long long)n, c->rank, (long long)g->n[r], r);
        }
    int64_t per = (n + g->n_ranks - 1) / g->n_ranks;
    int64_t lo = per * c->rank, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; i++) {
        float s = g->bufs[0][i];
        for (int r = 1; r < g->n_ranks; r++)
            s += g->bufs[r][i];
        for (int r = 0; r < g->n_ranks; r++)
            g->bufs[r][i] = s;
    }
    group_barrier(g);
    return 0;
}

static void host_destroy(struct collective *c)
{
    struct host_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
    free(c);
}

static const struct collective_ops host_ops = {
    .name = "host",
    .all_reduce_sum = host_all_reduce,
    .destroy = host_destroy,
};

int collective_host_create(int n_ranks, struct collective **out, struct err *err)
{
    if (n_ranks < 1 || n_ranks > COLLECTIVE_MAX_RANKS)
        return err_set(err, INFERD_ERANGE, "%d ranks outside [1, %d]", n_ranks,
                       COLLECTIVE_MAX_RANKS);
    struct host_group *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(err, INFERD_ENOMEM, "out of memory for a communicator group");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->n_ranks = n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        out[r] = calloc(1, sizeof *out[r]);
        if (!out[r]) {
            for (int i = 0; i < r; i++)
                free(out[i]);
            pthread_cond_destroy(&g->cv);
            pthread_mutex_destroy(&g->mu);
            free(g);
            return err_set(err, INFERD_ENOMEM, "out of memory for a communicator");
        }
        *out[r] = (struct collective){.ops = &host_ops, .rank = r, .n_ranks = n_ranks, .impl = g};
    }
    g->refs = n_ranks;
    return 0;
}
