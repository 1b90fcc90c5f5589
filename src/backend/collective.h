/* backend/collective.h — the communicator seam of tensor parallelism: an in-place sum of one buffer across the ranks of a group.
 *
 * A group is n_ranks communicators, one per rank, each driven by that
 * rank's thread alone. Every rank calls collective_all_reduce with the same
 * n, in the same order of calls; each returns once its buffer holds
 *   buf[i] = sum over r = 0 .. n_ranks - 1, in that order, of rank r's buf[i]
 * (the host group), or once the sum is queued behind the rank backend's ops
 * (NCCL, where the backend runs asynchronously). Two implementations:
 *   - host (collective.c): ranks are threads of one process over host
 *     memory (the CPU backend); a barrier, then each rank sums a slice of
 *     the elements in rank order, so the result is deterministic and the
 *     same on every rank;
 *   - NCCL (backend/cuda/nccl.c): libnccl.so.2 loaded at run time, one
 *     communicator per GPU, the reduction enqueued on the rank backend's
 *     stream. */
#ifndef INFERD_BACKEND_COLLECTIVE_H
#define INFERD_BACKEND_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

struct collective;

struct collective_ops {
    const char *name; /* "host", "nccl" */
    /* buf: n floats of be's memory; be: the rank's backend (its ops before
     * this call are part of what is summed). Returns 0 or a negative code
     * with err filled. */
    int (*all_reduce_sum)(struct collective *c, struct backend *be, float *buf, int64_t n,
                          struct err *err);
    /* Frees this rank's communicator; the group's shared state goes with the last one. */
    void (*destroy)(struct collective *c);
};

struct collective {
    const struct collective_ops *ops;
    int rank, n_ranks;
    void *impl; /* owned by the implementation */
};

static inline int collective_all_reduce_sum(struct collective *c, struct backend *be, float *buf,
                                            int64_t n, struct err *err)
{
    return c->ops->all_reduce_sum(c, be, buf, n, err);
}

static inline void collective_destroy(struct collective *c)
{
    if (c)
        c->ops->destroy(c);
}

/* n_ranks host communicators into out[0 .. n_ranks) (each owned by the
 * caller, freed with collective_destroy): for backends whose ops have run
 * by the time they return (the CPU's). 1 <= n_ranks <= COLLECTIVE_MAX_RANKS. */
#define COLLECTIVE_MAX_RANKS 64
int collective_host_create(int n_ranks, struct collective **out, struct err *err);

/* n_ranks NCCL communicators, rank r on GPU devices[r] (ncclCommInitAll),
 * into out[0 .. n_ranks). libnccl.so.2 is opened from lib_path, else from
 * $INFERD_NCCL_LIB, else by the dynamic loader's search (where CUDA
 * installations and PyTorch's nvidia-nccl package put it). NVLink
 * multicast (NVLS) is turned off for these communicators (NCCL_NVLS_ENABLE=0
 * unless the environment already sets it). -INFERD_EUNSUPPORTED naming the
 * library and the loader's message when it cannot be opened or lacks a
 * function; -INFERD_EIO with NCCL's message when initialisation fails. */
int collective_nccl_create(int n_ranks, const int *devices, const char *lib_path,
                           struct collective **out, struct err *err);

/* Opens the NCCL library as collective_nccl_create would and reports its
 * version (major * 10000 + minor * 100 + patch, NCCL's own encoding) without
 * making a communicator: start-up checks and tests. Errors as above. */
int collective_nccl_probe(const char *lib_path, int *version, struct err *err);

#endif
