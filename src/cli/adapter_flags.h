/* cli/adapter_flags.h — the LoRA adapter flags of serve, run and bench (--adapter, --adapter-dir, --merge-adapter) and what they do at start-up. */
#ifndef INFERD_CLI_ADAPTER_FLAGS_H
#define INFERD_CLI_ADAPTER_FLAGS_H

#include "base/err.h"
#include "engine/adapters.h"

#define CLI_MAX_ADAPTERS 16

struct cli_adapter_options {
    const char *ids[CLI_MAX_ADAPTERS];   /* --adapter ID=DIR (or DIR: its base name) */
    char id_buf[CLI_MAX_ADAPTERS][ADAPTER_ID_MAX];
    const char *dirs[CLI_MAX_ADAPTERS];
    int n;
    const char *dir;   /* --adapter-dir: where /v1/adapters/available looks */
    const char *merge; /* --merge-adapter ID: merged into the weights at start-up */
};

/* 1 when a (with its value v) is one of the adapter flags and was taken, 0 when it is not
 * one of them, -1 (message printed) when its value is bad. */
int cli_adapter_flag(const char *a, const char *v, struct cli_adapter_options *o);

/* --merge-adapter: loads that --adapter and merges it into m's weights. 0 without one;
 * -INFERD_EINVAL when it names no --adapter or other adapters are asked for too. */
int cli_adapter_merge(const struct cli_adapter_options *o, struct model *m, struct err *err);

/* A registry for m driven by e, with every --adapter mounted (none after a merge). */
int cli_adapters_mount(const struct cli_adapter_options *o, const struct model *m,
                       struct engine *e, struct adapter_registry **out, struct err *err);

#endif
