/* backend/cuda/cuda_stub.c — the CUDA entry points of a build without CUDA: they report that it is absent. */
#ifndef INFERD_HAVE_CUDA

#include "backend/cuda/cuda.h"

int backend_cuda_create(int device, const struct backend_options *opt, struct backend **out,
                        struct err *err)
{
    (void)device;
    (void)opt;
    *out = NULL;
    return err_set(err, INFERD_EUNSUPPORTED,
                   "this inferd was built without CUDA (configure with nvcc and -DINFERD_CUDA=ON)");
}

int backend_cuda_device_count(void) { return 0; }

bool backend_cuda_compiled(void) { return false; }

void backend_cuda_describe(struct backend *be, char *buf, size_t cap)
{
    (void)be;
    if (cap)
        buf[0] = '\0';
}

void *backend_cuda_stream(struct backend *be)
{
    (void)be;
    return NULL;
}

size_t backend_cuda_free_memory(struct backend *be)
{
    (void)be;
    return 0;
}

long backend_cuda_planned_launches(struct backend *be)
{
    (void)be;
    return 0;
}

double backend_cuda_read_bandwidth(struct backend *be, size_t bytes)
{
    (void)be;
    (void)bytes;
    return 0.0;
}

#endif
