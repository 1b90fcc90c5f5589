/* cli/device.c — the `--device cpu|cuda[:N]|auto` flag: parsing it and creating the backend it names. */
#include "cli/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "base/threadpool.h"

bool cli_device_parse(const char *text, struct device_spec *out)
{
    *out = (struct device_spec){.kind = DEVICE_CPU, .index = 0};
    if (!strcmp(text, "cpu"))
        return true;
    if (!strcmp(text, "auto")) {
        out->kind = DEVICE_AUTO;
        return true;
    }
    if (!strncmp(text, "cuda", 4) && (text[4] == '\0' || text[4] == ':')) {
        out->kind = DEVICE_CUDA;
        if (text[4] == '\0')
            return true;
        char *end;
        errno = 0;
        long v = strtol(text + 5, &end, 10);
        if (!errno && end != text + 5 && !*end && v >= 0 && v < 1024) {
            out->index = (int)v;
            return true;
        }
    }
    fprintf(stderr, "inferd: --device: '%s' is not cpu, cuda, cuda:N or auto\n", text);
    return false;
}

int cli_backend_create(const char *device, int n_threads, enum compute_mode mode,
                       struct backend **out, struct err *err)
{
    struct device_spec spec = {DEVICE_CPU, 0};
    if (device && !cli_device_parse(device, &spec))
        return err_set(err, INFERD_EINVAL, "--device: '%s' is not cpu, cuda, cuda:N or auto",
                       device);
    if (spec.kind == DEVICE_AUTO)
        spec.kind = backend_cuda_device_count() > 0 ? DEVICE_CUDA : DEVICE_CPU;
    if (spec.kind == DEVICE_CUDA)
        return backend_cuda_create(spec.index, mode, out, err);
    return backend_cpu_create(n_threads, mode, out, err);
}

void cli_backend_describe(struct backend *be, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = '\0';
    if (!be)
        return;
    struct threadpool *pool = backend_cpu_threadpool(be);
    if (pool) {
        snprintf(buf, cap, "cpu, %d threads", threadpool_size(pool));
        return;
    }
    char gpu[200];
    backend_cuda_describe(be, gpu, sizeof gpu);
    snprintf(buf, cap, "%s %s", be->ops->name, gpu);
}
