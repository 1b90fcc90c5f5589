/* backend/cuda/nccl_api.h — the few NCCL declarations inferd uses, as nccl.h declares them, so the build needs no NCCL package (the library is opened at run time). */
#ifndef INFERD_BACKEND_CUDA_NCCL_API_H
#define INFERD_BACKEND_CUDA_NCCL_API_H

#include <stddef.h>

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *nccl_stream_t; /* cudaStream_t */

enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

/* The functions, as pointer types for dlsym. */
typedef ncclResult_t (*nccl_get_version_fn)(int *version);
typedef ncclResult_t (*nccl_get_unique_id_fn)(ncclUniqueId *id);
typedef ncclResult_t (*nccl_comm_init_rank_fn)(ncclComm_t *comm, int n_ranks, ncclUniqueId id,
                                               int rank);
typedef ncclResult_t (*nccl_comm_init_all_fn)(ncclComm_t *comms, int n_dev, const int *devices);
typedef ncclResult_t (*nccl_all_reduce_fn)(const void *send, void *recv, size_t count,
                                           ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                           nccl_stream_t stream);
typedef ncclResult_t (*nccl_comm_destroy_fn)(ncclComm_t comm);
typedef const char *(*nccl_get_error_string_fn)(ncclResult_t result);
typedef ncclResult_t (*nccl_group_fn)(void);

#endif
