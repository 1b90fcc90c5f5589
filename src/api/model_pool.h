/* api/model_pool.h — several models in one server: entries named by id, loaded on first use by a
 * loader thread while their requests wait, kept resident under a memory limit with the least
 * recently used unloaded first (after their in-flight requests), and the one point where a
 * request's `model` becomes the served model it runs on. Loading itself is the caller's (the
 * composition root's): the pool only decides when. */
#ifndef INFERD_API_MODEL_POOL_H
#define INFERD_API_MODEL_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "api/errors.h"
#include "api/server.h"
#include "base/err.h"

#define MODEL_POOL_MAX_ENTRIES 64

enum model_pool_state {
    MODEL_POOL_UNLOADED = 0,
    MODEL_POOL_LOADING,
    MODEL_POOL_RESIDENT,
    MODEL_POOL_UNLOADING, /* waiting for its in-flight requests, then unloaded */
};

const char *model_pool_state_name(enum model_pool_state s);

/* How entries are loaded and unloaded; every call runs on the pool's loader thread (or the
 * creating thread for model_pool_load_now), never two at a time. */
struct model_pool_loader {
    /* The bytes an entry is expected to take before its first load (its files, say). */
    uint64_t (*estimate)(void *ctx, const char *id, const char *path, const void *options);
    /* Loads an entry: fills sm (all but its id) and *handle, and *bytes with what it holds
     * resident (weights and KV pool). Returns 0 or a negative -INFERD_E* code with err set. */
    int (*load)(void *ctx, const char *id, const char *path, const void *options,
                struct served_model *sm, void **handle, uint64_t *bytes, struct err *err);
    /* Demotes the entry's cached prefixes to the SSD tier (when there is one) and frees
     * everything load made; no request holds sm any more. Returns the blocks demoted. */
    uint64_t (*unload)(void *ctx, const char *id, struct served_model *sm, void *handle);
    /* Frees an entry's options (NULL: nothing to free). */
    void (*free_options)(void *ctx, void *options);
    /* Bytes held outside the pool's entries that count against its limit (a lazily loaded
     * Whisper model); NULL: none. Read before each load. */
    uint64_t (*extra_bytes)(void *ctx);
    void *ctx;
};

struct model_pool_config {
    uint64_t memory_limit_bytes; /* resident entries' bytes (plus extra_bytes); 0: no limit */
    int max_waiting;             /* requests waiting for loads at once; more are refused */
    struct model_pool_loader loader;
};

/* One entry as /v1/models, /stats and /metrics report it. */
struct model_pool_info {
    char id[256];
    enum model_pool_state state;
    bool is_default;
    uint64_t bytes;          /* resident bytes; before the first load, the estimate */
    int in_flight;           /* requests holding it */
    int waiting;             /* requests waiting for it to load */
    uint64_t loads, unloads, load_failures, requests, demotions;
    double load_s_last, load_s_total;
    double resident_s;       /* total time resident, the current stretch included */
    double idle_s;           /* since its last request ended; 0 while in use or never used */
    char last_error[512];    /* the last failed load's message, or "" */
};

struct model_pool_totals {
    int entries, resident;
    uint64_t resident_bytes, extra_bytes, memory_limit_bytes;
    uint64_t loads, unloads, evictions, waits, refused;
    int waiting;
};

struct model_pool;

int model_pool_create(const struct model_pool_config *cfg, struct model_pool **out,
                      struct err *err);
/* Stops the loader thread and unloads every resident entry (each finishing its requests
 * first: call after the HTTP side is quiet). */
void model_pool_free(struct model_pool *p);

/* Adds an entry before serving starts; takes options over (freed with free_options, also on
 * failure). The first entry added is the default unless model_pool_set_default says another.
 * -INFERD_EINVAL for an empty or duplicate id, -INFERD_ERANGE past MODEL_POOL_MAX_ENTRIES. */
int model_pool_add(struct model_pool *p, const char *id, const char *path, void *options,
                   struct err *err);
int model_pool_set_default(struct model_pool *p, const char *id, struct err *err);
const char *model_pool_default_id(const struct model_pool *p);

/* Loads an entry on the calling thread now (start-up: the default model is served before the
 * server says it is ready); a no-op when resident. */
int model_pool_load_now(struct model_pool *p, const char *id, struct err *err);

/* The entry named id (NULL or "": the default), resident, with one reference held for the
 * caller: loads it first when needed, waiting for the loader. -INFERD_ENOENT when no entry has
 * that id; -INFERD_EBUSY when max_waiting requests already wait (or the pool is stopping);
 * -INFERD_EIO when its load failed (err says why). */
int model_pool_acquire(struct model_pool *p, const char *id, struct served_model **out,
                       struct err *err);
/* The entry if it is resident now, with a reference; NULL otherwise (loads nothing). */
struct served_model *model_pool_peek(struct model_pool *p, const char *id);
void model_pool_release(struct model_pool *p, struct served_model *sm);

/* Unloads an entry now (after its in-flight requests); returns whether it was resident. */
bool model_pool_unload(struct model_pool *p, const char *id);
/* Demotes every resident entry's cache without unloading: calls fn on each under a reference;
 * returns the sum of what fn returned. */
uint64_t model_pool_each_resident(struct model_pool *p,
                                  uint64_t (*fn)(void *ctx, struct served_model *sm), void *ctx);

int model_pool_count(const struct model_pool *p);
void model_pool_info(struct model_pool *p, int i, struct model_pool_info *out);
void model_pool_totals(struct model_pool *p, struct model_pool_totals *out);

/* The model a request names, as every handler resolves it: without a pool the server's one
 * model whatever the name; with one, model_pool_acquire, its failures as API errors (404
 * model_not_found, 429 queue_full, 503 model_unavailable). Release with served_model_release. */
int served_model_acquire(struct server *srv, const char *id, struct served_model **out,
                         struct api_error *e);
void served_model_release(const struct server *srv, struct served_model *sm);
/* For reports, which never load a model: the default model when it is resident now, else
 * NULL; without a pool the one model (its engine NULL while it loads). Release with
 * served_model_release. */
struct served_model *served_model_peek(const struct server *srv);

#endif
