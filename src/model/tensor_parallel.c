/* model/tensor_parallel.c — the tensor-parallel group: N rank models stepped in lock-step, one thread per rank, behind one front model the engine drives (model/tensor_parallel.h).
 *
 * The front model is rank 0's model seen through the group: its config is
 * rank 0's share, so the KV pool the engine makes for it holds rank 0's KV
 * heads, on rank 0's backend. Every other rank keeps a mirror of each such
 * cache (the same blocks and slots, its own heads, on its own backend),
 * made at the first step that uses it. The front's backend is the group's
 * face to the KV layer: memory ops go to rank 0's backend, a block copy
 * (the prefix cache's partial reuse) is made in every rank's cache, and the
 * release of a cache releases its mirrors. A step hands the same batch to
 * every rank; each writes its vocabulary columns of the host logits rows,
 * and the rows are sampled on the host. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/collective.h"
#include "model/tensor_parallel.h"

#define TP_MAX_MIRRORS 8

/* Rank r's copy of one cache that the front's pool allocated (k0 its K). */
struct kv_mirror {
    const void *k0;
    void *k[COLLECTIVE_MAX_RANKS], *v[COLLECTIVE_MAX_RANKS]; /* [0] unused: rank 0's is k0 */
};

/* One rank's part of a step. */
struct tp_job {
    const struct model *m;
    struct forward_state *st;
    struct kv_cache kv, window;
    const struct batch *batch;
    struct forward_output out;
    int rc;
    struct err err;
};

struct tp_group {
    struct backend front;         /* what the front model's backend points at */
    struct backend_ops front_ops;
    int n_ranks;
    struct model *ranks[COLLECTIVE_MAX_RANKS]; /* owned */
    pthread_t threads[COLLECTIVE_MAX_RANKS];   /* ranks 1 .. n_ranks - 1 */
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done_cv;
    unsigned generation;
    int done;
    bool stop;
    struct tp_job jobs[COLLECTIVE_MAX_RANKS];
    struct kv_mirror mirrors[TP_MAX_MIRRORS];
    int n_mirrors;
};

static struct tp_group *group_of(struct backend *be) { return (struct tp_group *)(void *)be; }

static struct backend *rank0_be(struct tp_group *g) { return g->ranks[0]->backend; }

/* ---- the front backend: the group's face to the KV pool ---- */

static void front_destroy(struct backend *be) { (void)be; /* the group's; freed with it */ }

static void *front_alloc(struct backend *be, size_t bytes)
{
    struct backend *b0 = rank0_be(group_of(be));
    return b0->ops->alloc(b0, bytes);
}

static struct kv_mirror *mirror_find(struct tp_group *g, const void *k0)
{
    for (int i = 0; i < g->n_mirrors; i++)
        if (g->mirrors[i].k0 == k0)
            return &g->mirrors[i];
    return NULL;
}

static void mirror_release(struct tp_group *g, struct kv_mirror *mi)
{
    for (int r = 1; r < g->n_ranks; r++) {
        struct backend *b = g->ranks[r]->backend;
        if (mi->k[r])
            b->ops->release(b, mi->k[r]);
        if (mi->v[r])
            b->ops->release(b, mi->v[r]);
    }
    *mi = g->mirrors[--g->n_mirrors];
}

static void front_release(struct backend *be, void *ptr)
{
    struct tp_group *g = group_of(be);
    struct kv_mirror *mi = mirror_find(g, ptr);
    if (mi)
        mirror_release(g, mi);
    rank0_be(g)->ops->release(rank0_be(g), ptr);
}

static void front_to_device(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct backend *b0 = rank0_be(group_of(be));
    b0->ops->to_device(b0, dst, src, bytes);
}

static void front_to_host(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct backend *b0 = rank0_be(group_of(be));
    b0->ops->to_host(b0, dst, src, bytes);
}

/* kv with its storage swapped for rank r's mirror (r 0: kv itself). */
static struct kv_cache rank_cache(const struct kv_cache *kv, const struct kv_mirror *mi, int r)
{
    struct kv_cache c = *kv;
    if (r > 0) {
        c.k = mi->k[r];
        c.v = mi->v[r];
    }
    return c;
}

static void front_kv_copy_slots(struct backend *be, struct kv_cache *kv, uint32_t src,
                                uint32_t dst, int n)
{
    struct tp_group *g = group_of(be);
    rank0_be(g)->ops->kv_copy_slots(rank0_be(g), kv, src, dst, n);
    const struct kv_mirror *mi = mirror_find(g, kv->k);
    for (int r = 1; mi && r < g->n_ranks; r++) { /* no mirror yet: no rank has written it */
        struct backend *b = g->ranks[r]->backend;
        struct kv_cache c = rank_cache(kv, mi, r);
        b->ops->kv_copy_slots(b, &c, src, dst, n);
    }
}

static int front_status(struct backend *be, struct err *err)
{
    struct tp_group *g = group_of(be);
    for (int r = 0; r < g->n_ranks; r++) {
        struct backend *b = g->ranks[r]->backend;
        int rc = b->ops->status ? b->ops->status(b, err) : 0;
        if (rc < 0)
            return err_wrap(err, "rank %d", r), rc;
    }
    return 0;
}

/* The ops the KV layer and the engine call on a model's backend outside a
 * step; compute ops stay NULL (each rank's model runs on its own backend),
 * as do sampling (rows are sampled on the host) and the host-tier copies
 * (the SSD tier is not supported with tensor parallelism). */
static void front_init(struct tp_group *g)
{
    struct backend *b0 = rank0_be(g);
    g->front_ops = (struct backend_ops){
        .name = b0->ops->name,
        .destroy = front_destroy,
        .alloc = front_alloc,
        .release = front_release,
        .to_device = front_to_device,
        .to_host = front_to_host,
        .status = front_status,
        .kv_copy_slots = b0->ops->kv_copy_slots ? front_kv_copy_slots : NULL,
    };
    g->front = *b0;
    g->front.ops = &g->front_ops;
    g->front.impl = NULL;
}

/* ---- KV mirrors ---- */

static size_t cache_bytes(const struct kv_cache *kv, bool v)
{
    return (size_t)kv->n_layers * (size_t)kv->n_blocks * (size_t)kv->block_size *
           kv_cache_row_bytes(kv, v);
}

/* The mirrors of kv (made now on every rank when it has none). */
static int mirror_get(struct tp_group *g, const struct kv_cache *kv, struct kv_mirror **out,
                      struct err *err)
{
    if ((*out = mirror_find(g, kv->k)))
        return 0;
    if (g->n_mirrors == TP_MAX_MIRRORS)
        return err_set(err, INFERD_ENOMEM, "more than %d KV caches over one tensor-parallel "
                       "group", TP_MAX_MIRRORS);
    struct kv_mirror *mi = &g->mirrors[g->n_mirrors++];
    memset(mi, 0, sizeof *mi);
    mi->k0 = kv->k;
    for (int r = 1; r < g->n_ranks; r++) {
        struct backend *b = g->ranks[r]->backend;
        mi->k[r] = b->ops->alloc(b, cache_bytes(kv, false));
        mi->v[r] = b->ops->alloc(b, cache_bytes(kv, true));
        if (!mi->k[r] || !mi->v[r]) {
            size_t bytes = cache_bytes(kv, false) + cache_bytes(kv, true);
            mirror_release(g, mi);
            return err_set(err, INFERD_ENOMEM, "out of memory for rank %d's KV cache (%.1f MB)",
                           r, (double)bytes / 1e6);
        }
    }
    *out = mi;
    return 0;
}

/* ---- the ranks' threads ---- */

static void job_run(struct tp_job *j)
{
    j->rc = model_forward_rank(j->m, j->st, &j->kv, j->batch, &j->out, &j->err);
}

struct worker_arg {
    struct tp_group *g;
    int rank;
};

static void *worker_main(void *p)
{
    struct tp_group *g = ((struct worker_arg *)p)->g;
    int rank = ((struct worker_arg *)p)->rank;
    free(p);
    pthread_mutex_lock(&g->mu);
    unsigned seen = 0; /* steps count from 0: one posted before this thread ran is still seen */
    for (;;) {
        while (seen == g->generation && !g->stop)
            pthread_cond_wait(&g->go, &g->mu);
        if (g->stop)
            break;
        seen = g->generation;
        pthread_mutex_unlock(&g->mu);
        job_run(&g->jobs[rank]);
        pthread_mutex_lock(&g->mu);
        g->done++;
        pthread_cond_signal(&g->done_cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int tp_states_create(const struct model *front, struct forward_state *st, int max_tokens,
                     struct err *err)
{
    struct tp_group *g = front->tp;
    st->ranks = calloc((size_t)g->n_ranks, sizeof *st->ranks);
    if (!st->ranks)
        return err_set(err, INFERD_ENOMEM, "out of memory for rank states");
    st->n_ranks = g->n_ranks;
    for (int r = 0; r < g->n_ranks; r++) {
        int rc = forward_state_create(g->ranks[r], max_tokens, &st->ranks[r], err);
        if (rc < 0)
            return err_wrap(err, "rank %d", r), rc;
    }
    return 0;
}

int tp_forward(const struct model *front, struct forward_state *st, struct kv_cache *kv,
               const struct batch *batch, const struct forward_output *out, struct err *err)
{
    struct tp_group *g = front->tp;
    if (st->n_ranks != g->n_ranks)
        return err_set(err, INFERD_EINVAL, "forward state is not this group's");
    struct kv_mirror *mi = NULL, *wmi = NULL;
    int rc = mirror_get(g, kv, &mi, err);
    if (rc == 0 && kv->window)
        rc = mirror_get(g, kv->window, &wmi, err);
    if (rc < 0)
        return rc;
    for (int r = 0; r < g->n_ranks; r++) {
        struct tp_job *j = &g->jobs[r];
        j->m = g->ranks[r];
        j->st = st->ranks[r];
        j->kv = rank_cache(kv, mi, r);
        if (kv->window) {
            j->window = rank_cache(kv->window, wmi, r);
            j->kv.window = &j->window;
        }
        j->batch = batch;
        j->out = (struct forward_output){.host_rows = out->host_rows};
        j->rc = 0;
        memset(&j->err, 0, sizeof j->err);
    }
    pthread_mutex_lock(&g->mu);
    g->done = 0;
    g->generation++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    job_run(&g->jobs[0]);
    pthread_mutex_lock(&g->mu);
    while (g->done < g->n_threads)
        pthread_cond_wait(&g->done_cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < g->n_ranks; r++)
        if (g->jobs[r].rc < 0) {
            *err = g->jobs[r].err;
            if (g->n_ranks > 1)
                err_wrap(err, "tensor-parallel rank %d", r);
            return g->jobs[r].rc;
        }
    /* every row is on the host by now: the host's work for them comes after */
    if (out->before_rows && batch_n_outputs(batch) > 0) {
        rc = out->before_rows(out->ctx, false, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void tp_group_free(struct tp_group *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n_threads; i++)
        pthread_join(g->threads[i], NULL);
    while (g->n_mirrors > 0)
        mirror_release(g, &g->mirrors[0]);
    for (int r = 0; r < g->n_ranks; r++)
        model_free(g->ranks[r]);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done_cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int model_load_parallel(const char *dir, struct backend *const *bes,
                        struct collective *const *comms, int n_ranks,
                        const struct model_load_options *o, struct model **out, struct err *err)
{
    *out = NULL;
    if (n_ranks < 1 || n_ranks > COLLECTIVE_MAX_RANKS)
        return err_set(err, INFERD_ERANGE, "--tensor-parallel %d outside [1, %d]", n_ranks,
                       COLLECTIVE_MAX_RANKS);
    for (int r = 0; r < n_ranks; r++)
        if (!comms[r] || comms[r]->rank != r || comms[r]->n_ranks != n_ranks)
            return err_set(err, INFERD_EINVAL, "communicator %d is not rank %d of %d", r, r,
                           n_ranks);
    struct tp_group *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(err, INFERD_ENOMEM, "out of memory for a tensor-parallel group");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done_cv, NULL);
    struct model_load_options ro = o ? *o : (struct model_load_options){0};
    ro.tp_ranks = n_ranks;
    int rc = 0;
    g->n_ranks = n_ranks;
    for (int r = 0; r < n_ranks && rc == 0; r++) {
        ro.tp_rank = r;
        if ((rc = model_load_with(dir, bes[r], &ro, &g->ranks[r], err)) == 0)
            g->ranks[r]->comm = comms[r]; /* alone too: one rank exercises the same path */
        else if (n_ranks > 1)
            err_wrap(err, "rank %d", r);
    }
    struct model *front = rc == 0 ? malloc(sizeof *front) : NULL;
    if (rc == 0 && !front)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the model");
    for (int r = 1; rc == 0 && r < n_ranks; r++) {
        struct worker_arg *a = malloc(sizeof *a);
        if (a)
            *a = (struct worker_arg){g, r};
        if (!a || pthread_create(&g->threads[r - 1], NULL, worker_main, a) != 0) {
            free(a);
            rc = err_set(err, INFERD_ENOMEM, "cannot start rank %d's thread", r);
        } else {
            g->n_threads++;
        }
    }
    if (rc) {
        free(front);
        tp_group_free(g);
        return rc;
    }
    front_init(g);
    /* rank 0's model as the engine sees it: its weights and config, the
     * group's backend; it owns nothing but the group */
    *front = *g->ranks[0];
    front->backend = &g->front;
    front->owned_buffers = NULL;
    front->n_owned_buffers = front->cap_owned_buffers = 0;
    front->comm = NULL;
    front->tp = g;
    *out = front;
    return 0;
}
