/* cli/adapter_flags.c — --adapter ID=DIR, --adapter-dir and --merge-adapter: parsed, merged or mounted at start-up. */
#include "cli/adapter_flags.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "model/lora.h"

int cli_adapter_flag(const char *a, const char *v, struct cli_adapter_options *o)
{
    if (!strcmp(a, "--adapter-dir")) {
        o->dir = v;
        return 1;
    }
    if (!strcmp(a, "--merge-adapter")) {
        o->merge = v;
        return 1;
    }
    if (strcmp(a, "--adapter") != 0)
        return 0;
    if (o->n == CLI_MAX_ADAPTERS) {
        fprintf(stderr, "inferd: --adapter is given %d times at most\n", CLI_MAX_ADAPTERS);
        return -1;
    }
    const char *eq = strchr(v, '=');
    const char *dir = eq ? eq + 1 : v;
    char *id = o->id_buf[o->n];
    if (eq) {
        snprintf(id, ADAPTER_ID_MAX, "%.*s", (int)(eq - v), v);
    } else { /* the directory's base name */
        size_t n = strlen(v);
        while (n > 1 && v[n - 1] == '/')
            n--;
        size_t s = n;
        while (s > 0 && v[s - 1] != '/')
            s--;
        snprintf(id, ADAPTER_ID_MAX, "%.*s", (int)(n - s), v + s);
    }
    if (!id[0] || !dir[0]) {
        fprintf(stderr, "inferd: --adapter takes ID=DIR or DIR, not '%s'\n", v);
        return -1;
    }
    o->ids[o->n] = id;
    o->dirs[o->n++] = dir;
    return 1;
}

int cli_adapter_merge(const struct cli_adapter_options *o, struct model *m, struct err *err)
{
    if (!o->merge)
        return 0;
    int at = -1;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->ids[i], o->merge))
            at = i;
    if (at < 0)
        return err_set(err, INFERD_EINVAL, "--merge-adapter %s names no --adapter", o->merge);
    if (o->n > 1)
        return err_set(err, INFERD_EINVAL,
                       "--merge-adapter %s: no other adapter may be used with a merged one "
                       "(%d --adapter given)", o->merge, o->n);
    struct lora_adapter *a = NULL;
    int rc = lora_load(m, o->dirs[at], &a, err);
    if (rc == 0)
        rc = lora_merge(m, a, err);
    lora_release(a);
    if (rc < 0)
        return err_wrap(err, "--merge-adapter %s", o->merge), rc;
    log_info("adapters: %s (%s) merged into the weights", o->merge, o->dirs[at]);
    return 0;
}

int cli_adapters_mount(const struct cli_adapter_options *o, const struct model *m,
                       struct engine *e, struct adapter_registry **out, struct err *err)
{
    *out = NULL;
    if (!m->backend->ops->lora)
        return 0; /* the adapter routes answer that this backend cannot run them */
    struct adapter_registry *r;
    int rc = adapter_registry_create(m, e, o->dir, o->merge, &r, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < o->n && !o->merge; i++) {
        struct adapter_info in;
        if ((rc = adapter_mount(r, o->ids[i], o->dirs[i], &in, err)) < 0) {
            err_wrap(err, "--adapter %s=%s", o->ids[i], o->dirs[i]);
            adapter_registry_free(r);
            return rc;
        }
        log_info("adapters: %s mounted from %s: rank %d, scale %g, %d modules, %.1f MiB", in.id,
                 in.path, in.rank, (double)in.scale, in.mounted_modules,
                 (double)in.ram_bytes / (1 << 20));
    }
    *out = r;
    return 0;
}
