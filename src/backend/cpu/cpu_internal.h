/* backend/cpu/cpu_internal.h — state shared by the CPU backend's files (not part of the backend contract). */
#ifndef INFERD_BACKEND_CPU_INTERNAL_H
#define INFERD_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "base/threadpool.h"

struct cpu_impl {
    struct threadpool *pool;   /* owned */
    struct cpu_matmul *matmul; /* owned; packing scratch per thread */
};

void cpu_kv_store(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                  const float *v, const struct attn_span *spans, int n_spans);
void cpu_attention(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                   const struct attn_span *spans, int n_spans, int n_heads, float scale,
                   int sliding_window, float *out);

#endif
