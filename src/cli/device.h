/* cli/device.h — the `--device cpu|cuda[:N]|auto` flag: parsing it and creating the backend it names. */
#ifndef INFERD_CLI_DEVICE_H
#define INFERD_CLI_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

enum device_kind { DEVICE_CPU, DEVICE_CUDA, DEVICE_AUTO };

struct device_spec {
    enum device_kind kind;
    int index; /* GPU number for DEVICE_CUDA */
};

/* "cpu", "cuda", "cuda:N" or "auto"; false (with a message naming the
 * flag) for anything else. */
bool cli_device_parse(const char *text, struct device_spec *out);

/* Creates the backend device names (NULL: "cpu"). "auto" is the first GPU
 * when inferd has CUDA and a GPU is present, else the CPU. n_threads applies
 * to the CPU backend only. */
int cli_backend_create(const char *device, int n_threads, enum compute_mode mode,
                       struct backend **out, struct err *err);

/* One line saying what be runs on, for logs and benchmark headers. */
void cli_backend_describe(struct backend *be, char *buf, size_t cap);

#endif
