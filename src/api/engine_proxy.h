/* api/engine_proxy.h — serve --isolate, the supervisor's side: each served model's engine runs
 * in a child process (a fresh exec of the inferd binary that loads the model and runs its
 * engine), spoken to over a unix socket in engine_wire frames, and restarted when it crashes
 * (waitpid) or hangs (no step progress for watchdog_s while it holds requests); its in-flight
 * requests then finish with an error that says so. A proxy fills a gen_output exactly as the
 * engine thread would, so handlers read a child's tokens with gen_output_drain as they read an
 * in-process engine's. Also here: the engine calls handlers make (served_engine_*), which go to
 * whichever of the two a served model has, and the device lease that pauses every child. */
#ifndef INFERD_API_ENGINE_PROXY_H
#define INFERD_API_ENGINE_PROXY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "api/engine_wire.h"
#include "api/server.h"
#include "base/err.h"
#include "engine/engine.h"

/* What engine_proxy_info reports of one child (GET /engine). */
struct engine_proxy_info {
    char id[256];
    pid_t pid;         /* the child now; 0 while none runs */
    int restarts;      /* children started after the first (crashes and hangs) */
    uint64_t crashes, hangs;
    char socket[108];  /* the unix socket the supervisor listens on for it */
    const char *state; /* "starting", "running", "restarting", "stopped" */
    int in_flight;
    bool paused;       /* stopped under a device lease */
};

struct engine_supervisor_config {
    const char *exe;          /* borrowed; the inferd binary children exec */
    const char *runtime_dir;  /* borrowed; where the children's sockets go */
    int watchdog_s;           /* no step progress this long with requests held: hung; 0: never */
    int start_timeout_s;      /* a child that sends no HELLO within this is killed */
    /* Restarts of one child within restart_window_s beyond max_restarts wait out the window
     * (a model that crashes at load does not spin). */
    int max_restarts, restart_window_s;
};

struct engine_supervisor;
struct engine_proxy;

int engine_supervisor_create(const struct engine_supervisor_config *cfg,
                             struct engine_supervisor **out, struct err *err);
/* Every proxy must have been stopped first. */
void engine_supervisor_free(struct engine_supervisor *s);

/* Starts a child for model id: execs cfg.exe with args (borrowed; n_args strings, the first the
 * hidden subcommand) followed by the socket's path, and waits for its HELLO, which fills *hello.
 * -INFERD_EIO when the child exits or says nothing within start_timeout_s. */
int engine_proxy_start(struct engine_supervisor *s, const char *id, const char *const *args,
                       int n_args, struct engine_wire_hello *hello, struct engine_proxy **out,
                       struct err *err);
/* Lets in-flight requests finish for up to grace_ms (the child shuts its engine down: its SSD
 * tier flushed), then kills what is left. The proxy stays valid (submits and calls refused,
 * the last stats kept) until engine_proxy_free. Idempotent; NULL is ignored. */
void engine_proxy_shutdown(struct engine_proxy *p, int grace_ms);
/* Shuts down (without grace) if still running, then frees. NULL is ignored. */
void engine_proxy_free(struct engine_proxy *p);

/* engine_submit's contract, through the child; besides its codes, -INFERD_EIO when the child
 * is down (restarting: waited for up to start_timeout_s first; stopping). grammar: the
 * constraint params->grammar was compiled from (NULL without one): the child compiles it
 * again for its engine. adapter: the request's adapter spec (NULL: none; params->n_adapters
 * must be 0), resolved by the child against its registry: -INFERD_ENOENT when it does not. */
int engine_proxy_submit(struct engine_proxy *p, const struct gen_params *params,
                        const struct structured_spec *grammar, const char *adapter,
                        struct gen_output **out, struct err *err);
const struct engine_config *engine_proxy_config(const struct engine_proxy *p);
/* The child's stats (the last ones known while it is down or paused; state "restarting" or
 * "paused" then). */
void engine_proxy_stats(struct engine_proxy *p, struct engine_stats *out);
/* The supervisor's view: time to first token and between tokens as their events arrived. */
const struct engine_metrics *engine_proxy_metrics(const struct engine_proxy *p);
int engine_proxy_close_session(struct engine_proxy *p, const char *session_id,
                               int *blocks_released, struct err *err);
int engine_proxy_flush(struct engine_proxy *p, int timeout_ms, struct kv_tier_stats *after,
                       struct err *err);
void engine_proxy_info(struct engine_proxy *p, struct engine_proxy_info *out);
/* The child's adapter registry (engine/adapters.h), with the codes of adapter_list,
 * adapter_available, adapter_mount and adapter_unmount; -INFERD_EBUSY (try again) when the
 * child is down.
 * Adapters mounted here live in the child: a restarted child has only the --adapter ones. */
int engine_proxy_adapter_list(struct engine_proxy *p, struct adapter_info *out, int cap,
                              struct err *err);
int engine_proxy_adapter_available(struct engine_proxy *p, struct adapter_found *out, int cap,
                                   struct err *err);
int engine_proxy_adapter_mount(struct engine_proxy *p, const char *id, const char *path,
                               struct adapter_info *info, struct err *err);
int engine_proxy_adapter_unmount(struct engine_proxy *p, const char *id, int *removed_modules,
                                 struct err *err);

/* The supervisor's children, for reports: calls fn on each live proxy (under the registry's
 * lock: fn must not start or stop one). */
void engine_supervisor_each(struct engine_supervisor *s,
                            void (*fn)(void *ctx, struct engine_proxy *p), void *ctx);
int engine_supervisor_watchdog_s(const struct engine_supervisor *s);

/* POST /admin/lease: while one lease or more is held every child is stopped (SIGSTOP: its
 * engine steps no more and the device is the lease holder's), and children started meanwhile
 * stop as soon as they have said HELLO; the watchdog does not count paused time. */
void engine_supervisor_lease(struct engine_supervisor *s);
void engine_supervisor_unlease(struct engine_supervisor *s);
int engine_supervisor_leases(struct engine_supervisor *s);

/* ---- the engine of a served model, in process or in a child ---- */

/* True when sm has an engine (in process or a child) that requests can use. */
bool served_engine_ready(const struct served_model *sm);
/* adapter: the request's adapter spec ("id", "a+b", "none"; NULL: none), resolved where the
 * engine runs (engine/adapters.h adapter_resolve; params->n_adapters must be 0): one that does
 * not resolve fails with -INFERD_ENOENT and resolve's message. grammar: what params->grammar
 * was compiled from (NULL without one), for a child. */
int served_engine_submit(const struct served_model *sm, const struct gen_params *params,
                         const char *adapter, const struct structured_spec *grammar,
                         struct gen_output **out, struct err *err);
/* NULL when sm has no engine (yet). */
const struct engine_config *served_engine_config(const struct served_model *sm);
void served_engine_stats(const struct served_model *sm, struct engine_stats *out);
const struct engine_metrics *served_engine_metrics(const struct served_model *sm);
int served_engine_close_session(const struct served_model *sm, const char *session_id,
                                int *blocks_released, struct err *err);
int served_engine_flush(const struct served_model *sm, int timeout_ms, struct kv_tier_stats *after,
                        struct err *err);

/* ---- the adapters of a served model, in process or in a child ---- */

/* True when sm's engine keeps an adapter registry (its backend runs adapters). */
bool served_adapters_ready(const struct served_model *sm);
/* engine/adapters.h's adapter_list, adapter_available, adapter_mount and adapter_unmount on sm's
 * registry, wherever it lives; through a child, also -INFERD_EBUSY while it is down. */
int served_adapters_list(const struct served_model *sm, struct adapter_info *out, int cap,
                         struct err *err);
int served_adapters_available(const struct served_model *sm, struct adapter_found *out, int cap,
                              struct err *err);
int served_adapters_mount(const struct served_model *sm, const char *id, const char *path,
                          struct adapter_info *info, struct err *err);
int served_adapters_unmount(const struct served_model *sm, const char *id, int *removed_modules,
                            struct err *err);

#endif
