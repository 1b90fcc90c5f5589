/* backend/cuda/cuda.h — the CUDA backend (NVIDIA GPUs): creation and device queries; without CUDA they say so. */
#ifndef INFERD_BACKEND_CUDA_CUDA_H
#define INFERD_BACKEND_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

/* Creates the CUDA backend on GPU number device, from opt's mode, kv_type,
 * CUDA switches and profile (backend.h). -INFERD_EUNSUPPORTED when inferd was
 * built without CUDA or no such GPU exists. */
int backend_cuda_create(int device, const struct backend_options *opt, struct backend **out,
                        struct err *err);

/* Number of usable CUDA GPUs; 0 when built without CUDA, with no driver or no GPU. */
int backend_cuda_device_count(void);

/* True when inferd was built with the CUDA backend. */
bool backend_cuda_compiled(void);

/* One line naming be's GPU and its memory ("NVIDIA H200, 139.8 GiB, sm_90");
 * an empty string for other backends. */
void backend_cuda_describe(struct backend *be, char *buf, size_t cap);

/* be's CUDA stream (a cudaStream_t) that its ops run on once submitted, for
 * work queued behind them (an NCCL all-reduce); NULL for other backends. */
void *backend_cuda_stream(struct backend *be);

/* Bytes of be's GPU memory free now (cudaMemGetInfo); 0 for other backends. */
size_t backend_cuda_free_memory(struct backend *be);

/* Launches be's fusion planner has made since it was created (steps launched
 * eagerly or captured into a graph; replays plan nothing); 0 for other backends. */
long backend_cuda_planned_launches(struct backend *be);

/* Device-memory read bandwidth of be's GPU in GB/s, measured by streaming
 * `bytes` once per repetition (best of a few); 0 for other backends. */
double backend_cuda_read_bandwidth(struct backend *be, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
