/* engine/adapters.c — the registry of mounted adapters: an id table under a mutex, loads and frees run on the engine thread (the backend's one driver), references handed to requests. */
#define _GNU_SOURCE
#include "engine/adapters.h"

#include <dirent.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "model/lora.h"

#define REGISTRY_MAX 64

struct mounted {
    char id[ADAPTER_ID_MAX];
    char path[1024];
    struct lora_adapter *a; /* the mount's reference */
};

struct adapter_registry {
    const struct model *m;  /* borrowed */
    struct engine *e;       /* borrowed; NULL: loads on the caller's thread */
    char *dir;              /* owned; NULL: none */
    char *merged_id;        /* owned; NULL: none */
    pthread_mutex_t mu;
    struct mounted mounts[REGISTRY_MAX]; /* under mu */
    int n;
};

int adapter_registry_create(const struct model *m, struct engine *e, const char *dir,
                            const char *merged_id, struct adapter_registry **out,
                            struct err *err)
{
    struct adapter_registry *r = calloc(1, sizeof *r);
    if (!r || (dir && !(r->dir = strdup(dir))) || (merged_id && !(r->merged_id = strdup(merged_id)))) {
        if (r) {
            free(r->dir);
            free(r);
        }
        return err_set(err, INFERD_ENOMEM, "out of memory");
    }
    r->m = m;
    r->e = e;
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

void adapter_registry_free(struct adapter_registry *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++)
        lora_release(r->mounts[i].a);
    pthread_mutex_destroy(&r->mu);
    free(r->dir);
    free(r->merged_id);
    free(r);
}

static bool id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n >= ADAPTER_ID_MAX || !strcmp(id, "none"))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

static int find(struct adapter_registry *r, const char *id, size_t len)
{
    for (int i = 0; i < r->n; i++)
        if (strlen(r->mounts[i].id) == len && !strncmp(r->mounts[i].id, id, len))
            return i;
    return -1;
}

static void info_of(const struct mounted *mt, struct adapter_info *info)
{
    const struct lora_adapter *a = mt->a;
    *info = (struct adapter_info){.rank = a->rank, .scale = a->scale, .size_bytes = a->file_bytes,
                                  .ram_bytes = a->ram_bytes, .mounted_modules = a->mounted_modules,
                                  .users = atomic_load(&mt->a->refs) - 1};
    snprintf(info->id, sizeof info->id, "%s", mt->id);
    snprintf(info->path, sizeof info->path, "%s", mt->path);
}

/* ---- work for the engine thread ------------------------------------------ */

struct load_job {
    const struct model *m;
    const char *path;
    struct lora_adapter *a;
};

static int load_on_engine(void *ctx, struct err *err)
{
    struct load_job *j = ctx;
    return lora_load(j->m, j->path, &j->a, err);
}

static int release_on_engine(void *ctx, struct err *err)
{
    (void)err;
    lora_release(ctx);
    return 0;
}

static int run(struct adapter_registry *r, int (*fn)(void *, struct err *), void *ctx,
               struct err *err)
{
    return r->e ? engine_run(r->e, fn, ctx, err) : fn(ctx, err);
}

int adapter_mount(struct adapter_registry *r, const char *id, const char *path,
                  struct adapter_info *info, struct err *err)
{
    if (!id_ok(id))
        return err_set(err, INFERD_EINVAL,
                       "adapter id '%s' must be 1 to %d letters, digits, '-', '_' or '.' (not "
                       "\"none\")", id, ADAPTER_ID_MAX - 1);
    if (r->merged_id)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "adapter %s is merged into the weights (--merge-adapter): no other "
                       "adapter can be mounted", r->merged_id);
    pthread_mutex_lock(&r->mu);
    bool taken = find(r, id, strlen(id)) >= 0, full = r->n == REGISTRY_MAX;
    pthread_mutex_unlock(&r->mu);
    if (taken)
        return err_set(err, INFERD_EEXIST, "adapter %s is already mounted", id);
    if (full)
        return err_set(err, INFERD_ERANGE, "%d adapters are mounted already", REGISTRY_MAX);
    struct load_job j = {.m = r->m, .path = path};
    int rc = run(r, load_on_engine, &j, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&r->mu);
    if (find(r, id, strlen(id)) >= 0 || r->n == REGISTRY_MAX) { /* a race with another mount */
        pthread_mutex_unlock(&r->mu);
        run(r, release_on_engine, j.a, err);
        return err_set(err, INFERD_EEXIST, "adapter %s is already mounted", id);
    }
    struct mounted *mt = &r->mounts[r->n++];
    snprintf(mt->id, sizeof mt->id, "%s", id);
    snprintf(mt->path, sizeof mt->path, "%s", path);
    mt->a = j.a;
    if (info)
        info_of(mt, info);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int adapter_unmount(struct adapter_registry *r, const char *id, int *removed_modules,
                    struct err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = find(r, id, strlen(id));
    if (i < 0) {
        pthread_mutex_unlock(&r->mu);
        return err_set(err, INFERD_ENOENT, "adapter %s not mounted", id);
    }
    /* references are only taken under mu (adapter_resolve), so none can appear now */
    int users = atomic_load(&r->mounts[i].a->refs) - 1;
    if (users > 0) {
        pthread_mutex_unlock(&r->mu);
        return err_set(err, INFERD_EBUSY, "adapter %s is in use by %d request%s", id, users,
                       users == 1 ? "" : "s");
    }
    struct lora_adapter *a = r->mounts[i].a;
    *removed_modules = a->mounted_modules;
    r->mounts[i] = r->mounts[--r->n];
    pthread_mutex_unlock(&r->mu);
    return run(r, release_on_engine, a, err);
}

int adapter_list(struct adapter_registry *r, struct adapter_info *out, int cap)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    for (int i = 0; i < n && i < cap; i++)
        info_of(&r->mounts[i], &out[i]);
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* rank and base model from dir/adapter_config.json; false when it is not an adapter. */
static bool read_found(const char *dir, struct adapter_found *f)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    if (file_read_all(path, 1u << 20, &text, &len, NULL, &err) < 0)
        return false;
    json_object *root = json_tokener_parse(text), *v;
    free(text);
    if (!root)
        return false;
    if (json_object_object_get_ex(root, "r", &v))
        f->rank = json_object_get_int(v);
    if (json_object_object_get_ex(root, "base_model_name_or_path", &v) &&
        json_object_is_type(v, json_type_string))
        snprintf(f->base_model, sizeof f->base_model, "%s", json_object_get_string(v));
    json_object_put(root);
    return true;
}

int adapter_available(struct adapter_registry *r, struct adapter_found *out, int cap)
{
    if (!r->dir)
        return 0;
    DIR *d = opendir(r->dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= ADAPTER_ID_MAX)
            continue;
        struct adapter_found f = {0};
        snprintf(f.path, sizeof f.path, "%s/%s", r->dir, e->d_name);
        if (!read_found(f.path, &f))
            continue;
        snprintf(f.id, sizeof f.id, "%s", e->d_name);
        pthread_mutex_lock(&r->mu);
        f.mounted = find(r, f.id, strlen(f.id)) >= 0;
        pthread_mutex_unlock(&r->mu);
        if (n < cap)
            out[n] = f;
        n++;
    }
    closedir(d);
    return n;
}

int adapter_resolve(struct adapter_registry *r, const char *spec, struct gen_params *p,
                    struct err *err)
{
    p->n_adapters = 0;
    if (r && r->merged_id) {
        if (!spec || !strcmp(spec, r->merged_id))
            return 0;
        return err_set(err, INFERD_EINVAL,
                       "adapter %s is merged into the weights: adapter must be omitted or \"%s\"",
                       r->merged_id, r->merged_id);
    }
    if (!spec || !*spec || !strcmp(spec, "none"))
        return 0;
    if (!r)
        return err_set(err, INFERD_EINVAL, "adapter '%s' not mounted (this model has no adapters)",
                       spec);
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    for (const char *s = spec; !rc;) {
        size_t len = strcspn(s, "+,");
        int i = find(r, s, len);
        if (i < 0)
            rc = err_set(err, INFERD_EINVAL, "adapter '%.*s' not mounted", (int)len, s);
        else if (p->n_adapters == LORA_MAX_STACK)
            rc = err_set(err, INFERD_EINVAL, "at most %d adapters can be stacked", LORA_MAX_STACK);
        else {
            lora_retain(r->mounts[i].a);
            p->adapters[p->n_adapters++] = r->mounts[i].a;
        }
        if (!s[len])
            break;
        s += len + 1;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc < 0)
        adapter_put(p);
    return rc;
}

void adapter_put(struct gen_params *p)
{
    /* never the last reference: the mount holds one until it is unmounted, and unmounting
     * waits for requests to let go */
    for (int i = 0; i < p->n_adapters; i++)
        lora_release(p->adapters[i]);
    p->n_adapters = 0;
}
