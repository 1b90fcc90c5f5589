/* backend/cpu/cpu_internal.h — state shared by the CPU backend's files (not part of the backend contract). */
#ifndef INFERD_BACKEND_CPU_INTERNAL_H
#define INFERD_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "base/threadpool.h"

/* The cos and sin one rope call computed, kept for the next calls of the same positions and
 * table: every layer's q and k of a step turn by the same angles. */
struct cpu_rope_angles {
    bool valid;
    struct rope_table table; /* the table these come from, inv_freq pointing at freq */
    float *freq;             /* owned: a copy of the table's frequencies (freq_cap floats) */
    int32_t *positions;      /* owned; n */
    float *cos_sin;          /* owned; n x rot_dim: a token's cos, then its sin */
    int64_t n;
    int64_t positions_cap, cos_sin_cap, freq_cap; /* elements allocated */
};

/* Two tables' angles: models that alternate local and global rotary tables (Gemma 3) */
#define CPU_ROPE_ANGLE_SETS 2

struct cpu_impl {
    struct threadpool *pool;   /* owned */
    struct cpu_matmul *matmul; /* owned; packing scratch per thread */
    struct kv_quant kv_quant;  /* the KV format when backend.kv_quant points here */
    struct kvq_codebooks codebooks; /* TURBO's Lloyd–Max levels (filled with kv_quant) */
    /* quantized attention's row kernel: the AVX-512 one where the processor
     * (and the cpu_isa cap) has AVX-512 F/BW/VL, else the AVX2 one; the same bits */
    void (*qattn_rows)(void *job, int ith, int nth);
    bool f16c; /* the processor converts f16 (an f16 cache's kernels use F16C, else scalar code) */
    struct cpu_rope_angles angles[CPU_ROPE_ANGLE_SETS]; /* the most recently used first */
    /* backend_ops.hold_row_ops: the step's token rows while row ops are held, else 0 */
    int64_t hold_tokens;
    /* a quantized prefill's f32 window (cpu_attention_quant_window), owned */
    float *qwindow;
    size_t qwindow_bytes;
};

/* Runs what the pool holds (backend_ops.hold_row_ops): every op that reads memory without
 * running a job of the pool first calls it. */
static inline void cpu_settle(struct backend *be)
{
    threadpool_flush(((struct cpu_impl *)be->impl)->pool, false);
}

/* backend_ops.kv_copy_slots: slots [0, n) of block src to dst, every layer, K and V. */
void cpu_kv_copy_slots(struct backend *be, struct kv_cache *kv, uint32_t src, uint32_t dst, int n);
void cpu_kv_store(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                  const float *v, const struct attn_span *spans, int n_spans);
/* Dense attention (backend_ops.attention_dense's arguments) through FAST mode's kernels: the
 * tiles for four queries or more, the row kernel for one query over 128 keys or more. False,
 * computing nothing, in EXACT mode, for other shapes, or where K/V rows are not exactly the
 * n_heads heads. */
bool cpu_attention_dense_tiled(struct backend *be, const float *q, int64_t n_q, const float *k,
                               const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                               int head_dim, float scale, int64_t causal, float *out);
void cpu_attention(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                   const struct attn_span *spans, int n_spans, int n_heads, float scale,
                   int sliding_window, float *out);

/* The quantized cache's store and attention (attn_quant.c); cpu_kv_store and
 * cpu_attention hand a cache with kv->quant to them. */
void cpu_kv_store_quant(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                        const float *v, const struct attn_span *spans, int n_spans);
void cpu_attention_quant(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                         const struct attn_span *spans, int n_spans, int n_heads, float scale,
                         int sliding_window, float *out);
/* FAST mode's prefill over a quantized cache (cpu_attention's arguments): every position the
 * spans attend decoded once into an f32 window (an f32 cache of one layer whose blocks are the
 * spans' blocks in order, kvq_dequantize_head's vectors: TurboQuant rotated back, QJL keys
 * with their residual), then cpu_attention over it, which tiles a prefill; the row kernel
 * decodes a row's whole context for every query row instead. False, computing nothing, in
 * EXACT mode, for steps of short spans and past CPU_QWINDOW_MAX_BYTES. */
bool cpu_attention_quant_window(struct backend *be, const float *q, const struct kv_cache *kv,
                                int layer, const struct attn_span *spans, int n_spans,
                                int n_heads, float scale, int sliding_window, float *out);
#define CPU_QWINDOW_MAX_BYTES ((size_t)256 << 20)
/* FAST mode runs a span of at least this many query rows through the tiled kernels (and a
 * quantized cache's through its window); shorter ones keep the row kernels, so the rows of a
 * speculative verify step (1 + SPEC_MAX_DRAFTS at most) are summed as decode rows are. */
#define CPU_TILED_MIN_ROWS 18
/* The encoder-decoder ops (encdec.c), as backend_ops states them. */
void cpu_layer_norm(struct backend *be, const float *x, const float *weight, const float *bias,
                    int64_t n_rows, int64_t dim, float eps, float *y);
void cpu_gelu(struct backend *be, float *x, int64_t n);
void cpu_conv1d(struct backend *be, const float *x, int64_t n_in, int64_t c_in,
                const struct weight_matrix *w, const float *bias, int kernel, int stride, int pad,
                float *y);
void cpu_attention_dense(struct backend *be, const float *q, int64_t n_q, const float *k,
                         const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                         int head_dim, float scale, int64_t causal, float *out);
void cpu_scatter_rows(struct backend *be, const float *src, int64_t n_rows, int64_t cols,
                      const int32_t *rows, float *dst);

/* The mixture-of-experts ops (moe.c), as backend_ops states them. */
void cpu_moe_route(struct backend *be, const float *logits, int64_t n_rows, int n_experts,
                   int top_k, bool norm, int32_t *ids, float *weights);
void cpu_moe_ffn(struct backend *be, const float *x, int64_t n_rows, const struct moe_experts *ex,
                 const int32_t *ids, const float *weights, int top_k, float *scratch, float *y);
void cpu_gated_add(struct backend *be, float *y, const float *x, const float *g, int64_t n_rows,
                   int64_t dim);

/* The low-rank adapter op (lora.c), as backend_ops states it. */
void cpu_lora(struct backend *be, const float *x, int64_t in, int64_t out,
              const struct lora_seg *segs, int n_segs, float *scratch, float *y);

/* -INFERD_EINVAL for a format the kernels above do not read. */
int cpu_kv_quant_check(const struct kv_quant *q, struct err *err);

#endif
