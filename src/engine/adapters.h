/* engine/adapters.h — the adapters mounted on one engine's model, by id: mounting and unmounting on the engine thread, request specs ("a+b", "none") resolved to references, the adapter directory's listing. */
#ifndef INFERD_ENGINE_ADAPTERS_H
#define INFERD_ENGINE_ADAPTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define ADAPTER_ID_MAX 128

/* One mounted adapter as /v1/adapters reports it. */
struct adapter_info {
    char id[ADAPTER_ID_MAX];
    char path[1024];
    int rank;
    float scale;
    uint64_t size_bytes;   /* adapter_model.safetensors */
    uint64_t ram_bytes;    /* backend memory it holds */
    int mounted_modules;   /* projections it changes (layers x modules) */
    int users;             /* requests running with it */
};

/* One adapter directory found under the adapter directory. */
struct adapter_found {
    char id[ADAPTER_ID_MAX]; /* the directory's name */
    char path[1024];
    char base_model[256];    /* adapter_config.json's base_model_name_or_path */
    int rank;
    bool mounted;
};

struct adapter_registry;

/* A registry over m (borrowed) whose mounts and unmounts run on e's thread (borrowed; NULL:
 * on the caller's, for a model no engine drives yet). dir (copied; NULL: none) is where
 * /v1/adapters/available looks. merged_id (copied; NULL: none) names the adapter merged into
 * the weights at start-up: then no adapter may be mounted or asked for but that id. */
int adapter_registry_create(const struct model *m, struct engine *e, const char *dir,
                            const char *merged_id, struct adapter_registry **out,
                            struct err *err);
/* Unmounts everything (call after the engine is shut down). NULL is ignored. */
void adapter_registry_free(struct adapter_registry *r);

/* Mounts the PEFT adapter in path under id (letters, digits, '-', '_', '.'; not "none").
 * -INFERD_EEXIST when id is taken, -INFERD_EINVAL for a bad id, -INFERD_EUNSUPPORTED with
 * a merged adapter, or lora_load's error. info (may be NULL) gets what was mounted. */
int adapter_mount(struct adapter_registry *r, const char *id, const char *path,
                  struct adapter_info *info, struct err *err);
/* Unmounts id: -INFERD_ENOENT when it is not mounted, -INFERD_EBUSY while requests use it.
 * *removed_modules gets its mounted_modules. */
int adapter_unmount(struct adapter_registry *r, const char *id, int *removed_modules,
                    struct err *err);
/* The mounted adapters, up to cap of them into out; returns how many there are. */
int adapter_list(struct adapter_registry *r, struct adapter_info *out, int cap);
/* The adapter directories (holding adapter_config.json) under the registry's dir, up to cap;
 * returns how many were found (0 without a dir). */
int adapter_available(struct adapter_registry *r, struct adapter_found *out, int cap);

/* A request's `adapter`: NULL, "" or "none" for the base (with a merged adapter: NULL or
 * its id), else ids joined by '+' (or ',') stacked in that order, at most LORA_MAX_STACK.
 * Fills p->adapters / n_adapters with a reference each (adapter_put releases them; the
 * engine's sequence takes its own at submit). -INFERD_EINVAL naming the unknown id. */
int adapter_resolve(struct adapter_registry *r, const char *spec, struct gen_params *p,
                    struct err *err);
void adapter_put(struct gen_params *p);

#endif
