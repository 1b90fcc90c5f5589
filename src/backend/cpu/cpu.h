/* backend/cpu/cpu.h — CPU-backend extras beyond the op table, for benchmarks and tools. */
#ifndef INFERD_BACKEND_CPU_CPU_H
#define INFERD_BACKEND_CPU_CPU_H

#include "backend/backend.h"

struct threadpool;
struct cpu_matmul;

/* The backend's thread pool and matmul context; NULL when be is not the CPU backend. */
struct threadpool *backend_cpu_threadpool(struct backend *be);
struct cpu_matmul *backend_cpu_matmul(struct backend *be);

#endif
