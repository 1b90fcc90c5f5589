/* api/engine_child.h — serve --isolate, the engine child's side: serves one loaded model's
 * engine to the supervisor over a connected unix socket in engine_wire frames (api/engine_wire.h):
 * submits, cancels and calls in; each request's news, call replies and step progress out. */
#ifndef INFERD_API_ENGINE_CHILD_H
#define INFERD_API_ENGINE_CHILD_H

#include "api/engine_wire.h"
#include "api/server.h"
#include "base/err.h"

/* What a test fault does to the child (a test build's hook; release builds have none). */
enum engine_child_fault {
    ENGINE_FAULT_NONE = 0,
    ENGINE_FAULT_CRASH, /* abort(): the supervisor sees the child die */
    ENGINE_FAULT_HANG,  /* the child stops sending anything: the supervisor sees no progress */
};

struct engine_child_hooks {
    /* Asked after each event sent for a request, with its parameters and the tokens generated
     * so far; NULL: never. Only test builds (INFERD_TEST_FAULTS) set it. */
    enum engine_child_fault (*fault)(void *ctx, const struct gen_params *p, int n_generated);
    void *ctx;
};

/* Sends hello, then serves sm's engine (sm->engine, borrowed) on fd until the supervisor
 * closes its side; then shuts the engine down (running requests get grace_ms to finish, their
 * last events sent) and returns 0. -INFERD_EIO when the HELLO cannot be sent. */
int engine_child_serve(int fd, struct served_model *sm, const struct engine_wire_hello *hello,
                       int grace_ms, const struct engine_child_hooks *hooks, struct err *err);

#endif
