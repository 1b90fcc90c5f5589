/* backend/cuda/nccl.c — the NCCL communicator (backend/collective.h): libnccl.so.2 opened at run time, one communicator per GPU, all-reduces queued on each rank backend's stream.
 *
 * Built with or without CUDA: the library is found and its functions
 * resolved the same way either way (so a missing library is a clear error,
 * and a test, on any build); only a build with the CUDA backend has streams
 * to queue reductions on. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/collective.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/nccl_api.h"

#define NCCL_DEFAULT_LIB "libnccl.so.2"

struct nccl_lib {
    void *handle; /* dlopen's */
    nccl_get_version_fn get_version;
    nccl_get_unique_id_fn get_unique_id;
    nccl_comm_init_rank_fn comm_init_rank;
    nccl_comm_init_all_fn comm_init_all;
    nccl_all_reduce_fn all_reduce;
    nccl_comm_destroy_fn comm_destroy;
    nccl_get_error_string_fn get_error_string;
    nccl_group_fn group_start, group_end;
};

/* What the ranks of one group share: the library, until the last rank goes. */
struct nccl_group {
    struct nccl_lib lib;
    int refs;
};

struct nccl_rank {
    struct nccl_group *group; /* shared; freed with the last rank */
    ncclComm_t comm;
};

static const char *lib_name(const char *lib_path)
{
    if (lib_path && *lib_path)
        return lib_path;
    const char *env = getenv("INFERD_NCCL_LIB");
    return env && *env ? env : NCCL_DEFAULT_LIB;
}

static int lib_open(const char *lib_path, struct nccl_lib *lib, struct err *err)
{
    memset(lib, 0, sizeof *lib);
    const char *name = lib_name(lib_path);
    lib->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib->handle) {
        const char *why = dlerror();
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tensor parallelism needs NCCL, and %s could not be loaded (%s); install "
                       "NCCL (libnccl2, or PyTorch's nvidia-nccl-cu* wheel) or name the library "
                       "with --nccl-lib PATH or INFERD_NCCL_LIB",
                       name, why ? why : "not found");
    }
    struct {
        const char *sym;
        void **fn;
    } syms[] = {
        {"ncclGetVersion", (void **)&lib->get_version},
        {"ncclGetUniqueId", (void **)&lib->get_unique_id},
        {"ncclCommInitRank", (void **)&lib->comm_init_rank},
        {"ncclCommInitAll", (void **)&lib->comm_init_all},
        {"ncclAllReduce", (void **)&lib->all_reduce},
        {"ncclCommDestroy", (void **)&lib->comm_destroy},
        {"ncclGetErrorString", (void **)&lib->get_error_string},
        {"ncclGroupStart", (void **)&lib->group_start},
        {"ncclGroupEnd", (void **)&lib->group_end},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(lib->handle, syms[i].sym);
        if (!*syms[i].fn) {
            dlclose(lib->handle);
            lib->handle = NULL;
            return err_set(err, INFERD_EUNSUPPORTED, "%s has no %s: not an NCCL 2 library", name,
                           syms[i].sym);
        }
    }
    return 0;
}

int collective_nccl_probe(const char *lib_path, int *version, struct err *err)
{
    struct nccl_lib lib;
    int rc = lib_open(lib_path, &lib, err);
    if (rc)
        return rc;
    *version = 0;
    ncclResult_t r = lib.get_version(version);
    dlclose(lib.handle);
    if (r != NCCL_SUCCESS)
        return err_set(err, INFERD_EIO, "ncclGetVersion failed (%d)", r);
    return 0;
}

/* Queued behind every op the rank's backend recorded before it: those are
 * started on the backend's stream first (backend_ops.submit), then the
 * reduction goes on the same stream, ahead of the ops recorded after it. */
static int nccl_all_reduce(struct collective *c, struct backend *be, float *buf, int64_t n,
                           struct err *err)
{
    struct nccl_rank *rk = c->impl;
    void *stream = backend_cuda_stream(be);
    if (!stream && backend_cuda_compiled())
        return err_set(err, INFERD_EINVAL, "NCCL reduces CUDA memory: rank %d's backend is %s",
                       c->rank, be->ops->name);
    if (be->ops->submit)
        be->ops->submit(be);
    struct nccl_lib *lib = &rk->group->lib;
    ncclResult_t r = lib->all_reduce(buf, buf, (size_t)n, NCCL_FLOAT32, NCCL_SUM, rk->comm, stream);
    if (r != NCCL_SUCCESS)
        return err_set(err, INFERD_EIO, "ncclAllReduce of %lld floats on rank %d: %s",
                       (long long)n, c->rank, lib->get_error_string(r));
    return 0;
}

static void nccl_destroy(struct collective *c)
{
    struct nccl_rank *rk = c->impl;
    struct nccl_group *g = rk->group;
    if (rk->comm)
        g->lib.comm_destroy(rk->comm);
    /* ranks are made and freed by one thread (collective_nccl_create's caller) */
    if (--g->refs == 0) {
        dlclose(g->lib.handle);
        free(g);
    }
    free(rk);
    free(c);
}

static const struct collective_ops nccl_ops = {
    .name = "nccl",
    .all_reduce_sum = nccl_all_reduce,
    .destroy = nccl_destroy,
};

int collective_nccl_create(int n_ranks, const int *devices, const char *lib_path,
                           struct collective **out, struct err *err)
{
    if (n_ranks < 1 || n_ranks > COLLECTIVE_MAX_RANKS)
        return err_set(err, INFERD_ERANGE, "%d ranks outside [1, %d]", n_ranks,
                       COLLECTIVE_MAX_RANKS);
    struct nccl_group *g = calloc(1, sizeof *g);
    if (!g)
        return err_set(err, INFERD_ENOMEM, "out of memory for an NCCL group");
    int rc = lib_open(lib_path, &g->lib, err);
    if (rc) {
        free(g);
        return rc;
    }
    if (!backend_cuda_compiled()) {
        dlclose(g->lib.handle);
        free(g);
        return err_set(err, INFERD_EUNSUPPORTED,
                       "NCCL communicators need the CUDA backend, and this inferd was built "
                       "without CUDA");
    }
    /* NVLink SHARP multicast stays off (it needs fabric-manager setups the
     * machines we run on do not promise); a user's explicit setting wins. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclComm_t comms[COLLECTIVE_MAX_RANKS] = {0};
    ncclResult_t r = g->lib.comm_init_all(comms, n_ranks, devices);
    if (r != NCCL_SUCCESS) {
        rc = err_set(err, INFERD_EIO, "ncclCommInitAll over %d GPUs: %s", n_ranks,
                     g->lib.get_error_string(r));
        dlclose(g->lib.handle);
        free(g);
        return rc;
    }
    g->refs = n_ranks;
    for (int i = 0; i < n_ranks; i++) {
        struct collective *c = calloc(1, sizeof *c);
        struct nccl_rank *rk = calloc(1, sizeof *rk);
        if (!c || !rk) {
            free(c);
            free(rk);
            for (int j = i; j < n_ranks; j++) {
                g->lib.comm_destroy(comms[j]);
                g->refs--;
            }
            for (int j = 0; j < i; j++)
                nccl_destroy(out[j]);
            if (g->refs == 0) { /* i == 0: no rank held the group */
                dlclose(g->lib.handle);
                free(g);
            }
            return err_set(err, INFERD_ENOMEM, "out of memory for NCCL communicators");
        }
        *rk = (struct nccl_rank){.group = g, .comm = comms[i]};
        *c = (struct collective){.ops = &nccl_ops, .rank = i, .n_ranks = n_ranks, .impl = rk};
        out[i] = c;
    }
    return 0;
}
