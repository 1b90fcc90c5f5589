/* api/model_pool.c — the model pool: entries, their references, the loader thread that loads
 * what requests wait for and unloads the least recently used to stay under the memory limit,
 * and the resolution of a request's `model` into the served model it runs on. */
#include "api/model_pool.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"

struct pool_entry {
    struct served_model sm;      /* sm.id always; the rest while resident */
    char *path;                  /* owned */
    void *options;               /* owned (loader.free_options) */
    void *handle;                /* the loader's, while resident */
    enum model_pool_state state;
    bool wanted;                 /* a request waits for it to load */
    uint64_t want_seq;           /* when it was first wanted: the loader takes the oldest */
    int refs;                    /* requests holding sm */
    int waiting;
    uint64_t bytes;              /* resident bytes, or the estimate before a first load */
    bool measured;               /* bytes is what a load reported */
    uint64_t last_used_ns;       /* the last acquire or release: the LRU order */
    uint64_t resident_since_ns, resident_ns_total;
    uint64_t loads, unloads, load_failures, requests, demotions, failures_seen;
    uint64_t load_ns_last, load_ns_total;
    char last_error[512];
};

struct model_pool {
    struct model_pool_config cfg;
    struct pool_entry entries[MODEL_POOL_MAX_ENTRIES];
    int n, def;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* any state, reference or waiter change */
    pthread_cond_t work;    /* the loader's: an entry is wanted, or stop */
    pthread_t loader;
    bool loader_running, stop;
    int waiting;
    uint64_t seq, evictions, waits, refused;
};

const char *model_pool_state_name(enum model_pool_state s)
{
    switch (s) {
    case MODEL_POOL_LOADING: return "loading";
    case MODEL_POOL_RESIDENT: return "resident";
    case MODEL_POOL_UNLOADING: return "unloading";
    default: return "unloaded";
    }
}

static struct pool_entry *find(struct model_pool *p, const char *id)
{
    if (!id || !id[0])
        return p->n ? &p->entries[p->def] : NULL;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->entries[i].sm.id, id))
            return &p->entries[i];
    return NULL;
}

static struct pool_entry *entry_of(struct model_pool *p, struct served_model *sm)
{
    (void)p;
    return (struct pool_entry *)((char *)sm - offsetof(struct pool_entry, sm));
}

static uint64_t resident_bytes(const struct model_pool *p)
{
    uint64_t sum = 0;
    for (int i = 0; i < p->n; i++)
        if (p->entries[i].state != MODEL_POOL_UNLOADED)
            sum += p->entries[i].bytes;
    return sum;
}

/* Unloads e (resident, under the lock): new requests for it wait while the ones holding it
 * finish, then the loader's unload runs without the lock. */
static void unload_locked(struct model_pool *p, struct pool_entry *e)
{
    e->state = MODEL_POOL_UNLOADING;
    pthread_cond_broadcast(&p->changed);
    while (e->refs > 0)
        pthread_cond_wait(&p->changed, &p->lock);
    pthread_mutex_unlock(&p->lock);
    uint64_t demoted = p->cfg.loader.unload(p->cfg.loader.ctx, e->sm.id, &e->sm, e->handle);
    pthread_mutex_lock(&p->lock);
    char id[sizeof e->sm.id];
    memcpy(id, e->sm.id, sizeof id);
    memset(&e->sm, 0, sizeof e->sm);
    memcpy(e->sm.id, id, sizeof id);
    e->handle = NULL;
    e->state = MODEL_POOL_UNLOADED;
    e->unloads++;
    e->demotions += demoted;
    e->resident_ns_total += now_ns() - e->resident_since_ns;
    log_info("pool: %s unloaded (%llu cached blocks demoted)", e->sm.id,
             (unsigned long long)demoted);
    pthread_cond_broadcast(&p->changed);
}

/* The resident entry to unload first, never keep: idle ones before busy ones (a busy one is
 * unloaded only after its requests), least recently used first. */
static struct pool_entry *victim(struct model_pool *p, const struct pool_entry *keep)
{
    struct pool_entry *best = NULL;
    for (int i = 0; i < p->n; i++) {
        struct pool_entry *e = &p->entries[i];
        if (e == keep || e->state != MODEL_POOL_RESIDENT)
            continue;
        if (!best || (e->refs == 0) > (best->refs == 0) ||
            ((e->refs == 0) == (best->refs == 0) && e->last_used_ns < best->last_used_ns))
            best = e;
    }
    return best;
}

/* Unloads least recently used entries until the resident and loading ones (keep among them,
 * at its estimate until it is measured) fit under the limit, or only keep is left. */
static void make_room(struct model_pool *p, const struct pool_entry *keep)
{
    if (!p->cfg.memory_limit_bytes)
        return;
    for (;;) {
        uint64_t extra = 0;
        if (p->cfg.loader.extra_bytes) {
            pthread_mutex_unlock(&p->lock);
            extra = p->cfg.loader.extra_bytes(p->cfg.loader.ctx);
            pthread_mutex_lock(&p->lock);
        }
        if (resident_bytes(p) + extra <= p->cfg.memory_limit_bytes)
            return;
        struct pool_entry *v = victim(p, keep);
        if (!v)
            return;
        log_info("pool: unloading %s (%.1f MB) to make room for %s under %.1f MB", v->sm.id,
                 (double)v->bytes / 1e6, keep ? keep->sm.id : "-",
                 (double)p->cfg.memory_limit_bytes / 1e6);
        p->evictions++;
        unload_locked(p, v);
    }
}

/* Loads e (unloaded, under the lock; the lock is dropped while the loader works). */
static int load_locked(struct model_pool *p, struct pool_entry *e, struct err *err)
{
    e->state = MODEL_POOL_LOADING;
    pthread_cond_broadcast(&p->changed);
    make_room(p, e);
    pthread_mutex_unlock(&p->lock);
    struct served_model sm = {0};
    memcpy(sm.id, e->sm.id, sizeof sm.id);
    void *handle = NULL;
    uint64_t bytes = 0;
    uint64_t t0 = now_ns();
    int rc = p->cfg.loader.load(p->cfg.loader.ctx, e->sm.id, e->path, e->options, &sm, &handle,
                                &bytes, err);
    uint64_t dt = now_ns() - t0;
    pthread_mutex_lock(&p->lock);
    e->wanted = false;
    if (rc < 0) {
        e->state = MODEL_POOL_UNLOADED;
        e->load_failures++;
        snprintf(e->last_error, sizeof e->last_error, "%s", err->msg);
        log_warn("pool: loading %s failed: %s", e->sm.id, err->msg);
    } else {
        e->sm = sm;
        e->handle = handle;
        e->bytes = bytes;
        e->measured = true;
        e->state = MODEL_POOL_RESIDENT;
        e->loads++;
        e->load_ns_last = dt;
        e->load_ns_total += dt;
        e->resident_since_ns = now_ns();
        e->last_used_ns = e->resident_since_ns;
        e->last_error[0] = '\0';
        log_info("pool: %s loaded in %.2f s (%.1f MB resident)", e->sm.id, (double)dt * 1e-9,
                 (double)bytes / 1e6);
        /* Its measured size may be over the estimate: the others make room now. */
        make_room(p, e);
    }
    pthread_cond_broadcast(&p->changed);
    return rc;
}

static void *loader_run(void *arg)
{
    struct model_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        struct pool_entry *next = NULL;
        for (int i = 0; i < p->n; i++) {
            struct pool_entry *e = &p->entries[i];
            if (e->wanted && e->state == MODEL_POOL_UNLOADED &&
                (!next || e->want_seq < next->want_seq))
                next = e;
        }
        if (!next) {
            pthread_cond_wait(&p->work, &p->lock);
            continue;
        }
        struct err err = {0};
        if (load_locked(p, next, &err) < 0)
            next->failures_seen++;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int model_pool_create(const struct model_pool_config *cfg, struct model_pool **out,
                      struct err *err)
{
    *out = NULL;
    if (!cfg->loader.load || !cfg->loader.unload)
        return err_set(err, INFERD_EINVAL, "the model pool needs a loader");
    struct model_pool *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "out of memory for the model pool");
    p->cfg = *cfg;
    if (p->cfg.max_waiting <= 0)
        p->cfg.max_waiting = 64;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->changed, NULL);
    pthread_cond_init(&p->work, NULL);
    if (pthread_create(&p->loader, NULL, loader_run, p) != 0) {
        model_pool_free(p);
        return err_set(err, INFERD_ENOMEM, "cannot start the model pool's loader thread");
    }
    p->loader_running = true;
    *out = p;
    return 0;
}

void model_pool_free(struct model_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    if (p->loader_running)
        pthread_join(p->loader, NULL);
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->n; i++)
        if (p->entries[i].state == MODEL_POOL_RESIDENT)
            unload_locked(p, &p->entries[i]);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n; i++) {
        if (p->cfg.loader.free_options)
            p->cfg.loader.free_options(p->cfg.loader.ctx, p->entries[i].options);
        free(p->entries[i].path);
    }
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->changed);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static bool has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

int model_pool_add(struct model_pool *p, const char *id, const char *path, void *options,
                   struct err *err)
{
    int rc = 0;
    if (!id || !id[0] || strlen(id) >= sizeof p->entries[0].sm.id || strpbrk(id, "\"\\") ||
        has_control(id))
        rc = err_set(err, INFERD_EINVAL, "a pool model's id must be 1 to %zu bytes without "
                     "quotes, backslashes or control characters, not '%.64s'",
                     sizeof p->entries[0].sm.id - 1, id ? id : "");
    else if (find(p, id))
        rc = err_set(err, INFERD_EINVAL, "two pool models are named '%s' (ids are the "
                     "directory or file names unless the pool file names them)", id);
    else if (p->n >= MODEL_POOL_MAX_ENTRIES)
        rc = err_set(err, INFERD_ERANGE, "the pool holds %d models at most",
                     MODEL_POOL_MAX_ENTRIES);
    char *copy = rc == 0 ? strdup(path ? path : "") : NULL;
    if (rc == 0 && !copy)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the pool");
    if (rc < 0) {
        if (p->cfg.loader.free_options)
            p->cfg.loader.free_options(p->cfg.loader.ctx, options);
        return rc;
    }
    struct pool_entry *e = &p->entries[p->n];
    memset(e, 0, sizeof *e);
    snprintf(e->sm.id, sizeof e->sm.id, "%s", id);
    e->path = copy;
    e->options = options;
    e->bytes = p->cfg.loader.estimate ? p->cfg.loader.estimate(p->cfg.loader.ctx, id, copy,
                                                                options)
                                      : 0;
    pthread_mutex_lock(&p->lock);
    p->n++;
    pthread_mutex_unlock(&p->lock);
    return 0;
}

int model_pool_set_default(struct model_pool *p, const char *id, struct err *err)
{
    struct pool_entry *e = id && id[0] ? find(p, id) : NULL;
    if (!e)
        return err_set(err, INFERD_ENOENT, "no pool model is named '%s'", id ? id : "");
    p->def = (int)(e - p->entries);
    return 0;
}

const char *model_pool_default_id(const struct model_pool *p)
{
    return p->n ? p->entries[p->def].sm.id : "";
}

int model_pool_load_now(struct model_pool *p, const char *id, struct err *err)
{
    pthread_mutex_lock(&p->lock);
    struct pool_entry *e = find(p, id);
    int rc = 0;
    if (!e)
        rc = err_set(err, INFERD_ENOENT, "no pool model is named '%s'", id ? id : "");
    else {
        while (e->state == MODEL_POOL_LOADING || e->state == MODEL_POOL_UNLOADING)
            pthread_cond_wait(&p->changed, &p->lock);
        if (e->state == MODEL_POOL_UNLOADED)
            rc = load_locked(p, e, err);
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int model_pool_acquire(struct model_pool *p, const char *id, struct served_model **out,
                       struct err *err)
{
    *out = NULL;
    pthread_mutex_lock(&p->lock);
    struct pool_entry *e = find(p, id);
    int rc = 0;
    bool waited = false;
    if (!e) {
        rc = err_set(err, INFERD_ENOENT, "the model '%.200s' does not exist", id ? id : "");
        goto out;
    }
    for (;;) {
        if (e->state == MODEL_POOL_RESIDENT) {
            e->refs++;
            e->requests++;
            e->last_used_ns = now_ns();
            *out = &e->sm;
            break;
        }
        if (p->stop) {
            rc = err_set(err, INFERD_EBUSY, "the server is stopping");
            break;
        }
        if (p->waiting >= p->cfg.max_waiting) {
            p->refused++;
            rc = err_set(err, INFERD_EBUSY,
                         "%d requests already wait for models to load; try again", p->waiting);
            break;
        }
        if (!e->wanted) {
            e->wanted = true;
            e->want_seq = ++p->seq;
        }
        if (!waited)
            p->waits++;
        waited = true;
        uint64_t failures = e->failures_seen;
        e->waiting++;
        p->waiting++;
        pthread_cond_signal(&p->work);
        pthread_cond_wait(&p->changed, &p->lock);
        e->waiting--;
        p->waiting--;
        if (e->failures_seen != failures) {
            rc = err_set(err, INFERD_EIO, "the model '%s' failed to load: %s", e->sm.id,
                         e->last_error);
            break;
        }
    }
out:
    pthread_mutex_unlock(&p->lock);
    return rc;
}

struct served_model *model_pool_peek(struct model_pool *p, const char *id)
{
    pthread_mutex_lock(&p->lock);
    struct pool_entry *e = find(p, id);
    struct served_model *sm = NULL;
    if (e && e->state == MODEL_POOL_RESIDENT) {
        e->refs++;
        sm = &e->sm;
    }
    pthread_mutex_unlock(&p->lock);
    return sm;
}

void model_pool_release(struct model_pool *p, struct served_model *sm)
{
    if (!sm)
        return;
    struct pool_entry *e = entry_of(p, sm);
    pthread_mutex_lock(&p->lock);
    e->refs--;
    e->last_used_ns = now_ns();
    if (e->refs == 0)
        pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
}

bool model_pool_unload(struct model_pool *p, const char *id)
{
    pthread_mutex_lock(&p->lock);
    struct pool_entry *e = find(p, id);
    bool was = false;
    if (e) {
        while (e->state == MODEL_POOL_LOADING || e->state == MODEL_POOL_UNLOADING)
            pthread_cond_wait(&p->changed, &p->lock);
        if (e->state == MODEL_POOL_RESIDENT) {
            unload_locked(p, e);
            was = true;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return was;
}

uint64_t model_pool_each_resident(struct model_pool *p,
                                  uint64_t (*fn)(void *ctx, struct served_model *sm), void *ctx)
{
    uint64_t sum = 0;
    for (int i = 0; i < model_pool_count(p); i++) {
        struct served_model *sm = model_pool_peek(p, p->entries[i].sm.id);
        if (!sm)
            continue;
        sum += fn(ctx, sm);
        model_pool_release(p, sm);
    }
    return sum;
}

int model_pool_count(const struct model_pool *p)
{
    return p->n;
}

void model_pool_info(struct model_pool *p, int i, struct model_pool_info *out)
{
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->n)
        return;
    pthread_mutex_lock(&p->lock);
    const struct pool_entry *e = &p->entries[i];
    uint64_t now = now_ns();
    memcpy(out->id, e->sm.id, sizeof out->id);
    out->state = e->state;
    out->is_default = i == p->def;
    out->bytes = e->bytes;
    out->in_flight = e->refs;
    out->waiting = e->waiting;
    out->loads = e->loads;
    out->unloads = e->unloads;
    out->load_failures = e->load_failures;
    out->requests = e->requests;
    out->demotions = e->demotions;
    out->load_s_last = (double)e->load_ns_last * 1e-9;
    out->load_s_total = (double)e->load_ns_total * 1e-9;
    uint64_t resident = e->resident_ns_total;
    if (e->state == MODEL_POOL_RESIDENT || e->state == MODEL_POOL_UNLOADING)
        resident += now - e->resident_since_ns;
    out->resident_s = (double)resident * 1e-9;
    out->idle_s = e->refs == 0 && e->last_used_ns ? (double)(now - e->last_used_ns) * 1e-9 : 0;
    memcpy(out->last_error, e->last_error, sizeof out->last_error);
    pthread_mutex_unlock(&p->lock);
}

void model_pool_totals(struct model_pool *p, struct model_pool_totals *out)
{
    memset(out, 0, sizeof *out);
    uint64_t extra = p->cfg.loader.extra_bytes ? p->cfg.loader.extra_bytes(p->cfg.loader.ctx) : 0;
    pthread_mutex_lock(&p->lock);
    out->entries = p->n;
    for (int i = 0; i < p->n; i++) {
        const struct pool_entry *e = &p->entries[i];
        if (e->state == MODEL_POOL_RESIDENT || e->state == MODEL_POOL_UNLOADING) {
            out->resident++;
            out->resident_bytes += e->bytes;
        }
        out->loads += e->loads;
        out->unloads += e->unloads;
    }
    out->extra_bytes = extra;
    out->memory_limit_bytes = p->cfg.memory_limit_bytes;
    out->evictions = p->evictions;
    out->waits = p->waits;
    out->refused = p->refused;
    out->waiting = p->waiting;
    pthread_mutex_unlock(&p->lock);
}

int served_model_acquire(struct server *srv, const char *id, struct served_model **out,
                         struct api_error *e)
{
    *out = NULL;
    if (!srv->pool) {
        *out = &srv->served;
        return 0;
    }
    struct err err = {0};
    int rc = model_pool_acquire(srv->pool, id, out, &err);
    if (rc == -INFERD_ENOENT)
        api_error_set(e, 404, API_ERROR_NOT_FOUND, "model", "model_not_found",
                      "the model '%.200s' does not exist; GET /v1/models lists the served ones",
                      id ? id : "");
    else if (rc == -INFERD_EBUSY)
        api_error_set(e, 429, API_ERROR_RATE_LIMIT, NULL, "queue_full", "%s", err.msg);
    else if (rc < 0)
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, "model", "model_unavailable", "%s", err.msg);
    return rc;
}

void served_model_release(const struct server *srv, struct served_model *sm)
{
    if (srv->pool && sm)
        model_pool_release(srv->pool, sm);
}

struct served_model *served_model_peek(const struct server *srv)
{
    /* Without a pool the one model is the server's own, read only by reports. */
    return srv->pool ? model_pool_peek(srv->pool, NULL) : (struct served_model *)&srv->served;
}
