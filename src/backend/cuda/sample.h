/* backend/cuda/sample.h — token sampling on the GPU (sample.cu): the CUDA side of backend_ops.sample. */
#ifndef INFERD_BACKEND_CUDA_SAMPLE_H
#define INFERD_BACKEND_CUDA_SAMPLE_H

#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
}

/* Device and pinned buffers of the sampling kernels, grown on demand. */
struct cu_sampler;

cudaError_t cu_sampler_create(struct cu_sampler **out);
void cu_sampler_destroy(struct cu_sampler *sp);

/* Samples n_rows rows of logits (device memory, n_rows x vocab, adjusted in
 * place) on stream as backend_ops.sample describes, after whatever the
 * stream already holds; waits for the results. On failure returns the CUDA
 * error and names the failing step in *what. */
cudaError_t cu_sampler_run(struct cu_sampler *sp, cudaStream_t stream, float *logits, int n_rows,
                           int vocab, const struct sample_spec *specs, struct sample_result *out,
                           float *host_rows, const char **what);

#endif
