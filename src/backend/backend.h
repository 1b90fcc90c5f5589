/* backend/backend.h — the op set a compute backend implements; the model calls only these. */
#ifndef INFERD_BACKEND_BACKEND_H
#define INFERD_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/err.h"
#include "backend/kv_quant.h"

/* Activation precision. EXACT: f32 activations everywhere (parity tests).
 * FAST: matmul inputs rounded to bf16 so bf16 dot-product hardware (AMX,
 * AVX512-BF16, tensor cores) can be used; accumulation stays f32. */
enum compute_mode { COMPUTE_EXACT = 0, COMPUTE_FAST = 1 };

/* A weight matrix as stored by Hugging Face: rows = out_features,
 * cols = in_features, row-major. data is borrowed (mmap'd file or backend
 * memory); dtype is F32 or BF16 (F16 checkpoints are widened at load), or a
 * block type (base/quant.h: each row dtype_row_bytes(dtype, cols) bytes)
 * the backend takes (backend_takes_blocks). */
struct weight_matrix {
    enum dtype dtype;
    int64_t rows, cols;
    const void *data;
};

/* A mixture-of-experts layer's experts. Expert e is a SwiGLU MLP,
 *   f_e(x) = down[e] · (silu(gate[e] · x) * up[e] · x),
 * gate[e] and up[e] inter x hidden, down[e] hidden x inter, every matrix of
 * one dtype. The arrays are host memory (the model's); the matrices' data
 * is wherever weights live. */
struct moe_experts {
    int n_experts;
    int64_t hidden, inter;
    struct weight_matrix *gate, *up, *down; /* n_experts each */
};

/* Floats of scratch moe_ffn needs for n_rows rows of top_k experts. */
static inline size_t moe_scratch_floats(int64_t n_rows, int top_k, int64_t inter, int64_t hidden)
{
    return (size_t)n_rows * (size_t)top_k * (size_t)(2 * inter + hidden);
}

/* Paged KV storage of one model: n_blocks blocks of block_size token slots
 * per layer. Element (layer, block, slot, kv_head, d) of K lives at
 *   k + ((layer * n_blocks + block) * block_size + slot) * kv_dim + kv_head * head_dim + d
 * with kv_dim = n_kv_heads * head_dim; V likewise. Elements are of dtype:
 * the backend's kv_dtype (F32, or F16 where the backend stores it so).
 * A quantized cache (quant not NULL, backend/kv_quant.h) stores each slot's
 * row of one layer in k_row_bytes (v_row_bytes) bytes instead, at byte
 *   ((layer * n_blocks + block) * block_size + slot) * k_row_bytes
 * holding n_kv_heads records of kvq_head_bytes(layer's format) each; every
 * layer's rows take the largest layer's row bytes. */
struct kv_cache {
    void *k, *v; /* backend memory; owned by whoever allocated the cache */
    enum dtype dtype;
    int n_layers, n_blocks, block_size, n_kv_heads, head_dim;
    const struct kv_quant *quant;    /* borrowed (the backend's); NULL: dtype elements */
    size_t k_row_bytes, v_row_bytes; /* one slot of one layer; 0: kv_dim * dtype size */
    /* Sliding-window layers kept apart (kv/pool.c's windowed pools); window
     * NULL: every layer lives here as above. Else only the model's other
     * layers do, layer_index[l] of them, and a window layer l is layer
     * -1 - layer_index[l] of *window, whose "blocks" are slots: block b's
     * positions are at slot window_slot[b] (host array, n_blocks entries;
     * UINT32_MAX once every query to come is past them). The backends see
     * either cache as above; the model driver picks (model/arch.h). */
    struct kv_cache *window;
    const int32_t *layer_index;
    const uint32_t *window_slot;
    int window_positions; /* the window layers' sliding_window */
};

/* Bytes of one slot's row in one layer, K (v false) or V. */
static inline size_t kv_cache_row_bytes(const struct kv_cache *kv, bool v)
{
    size_t rb = v ? kv->v_row_bytes : kv->k_row_bytes;
    return rb ? rb : (size_t)kv->n_kv_heads * (size_t)kv->head_dim * dtype_size(kv->dtype);
}

/* One sequence's share of a forward step: its n_tokens new tokens sit at
 * rows [row0, row0 + n_tokens) of the step's activations and at positions
 * [pos0, pos0 + n_tokens); block_ids maps position / block_size to a block
 * of the kv_cache and covers at least pos0 + n_tokens positions. */
struct attn_span {
    int row0, n_tokens, pos0;
    const uint32_t *block_ids;
    int n_block_ids;
};

/* Precomputed rotary frequencies for one model (after rope_scaling). */
struct rope_table {
    int rot_dim;        /* rotated dims per head: the first rot_dim of head_dim (partial
                           rotary), the rest passed through */
    /* Host memory owned by the model: rot_dim / 2 floats; when long_from > 0,
     * rot_dim floats, the frequencies of positions below long_from and then
     * those of positions from it on (Phi-3's longrope: short and long). */
    const float *inv_freq;
    float attention_factor; /* multiplies cos and sin (1 unless a scaling kind says otherwise) */
    int32_t long_from;  /* 0: one set of frequencies */
};

/* ---- sampling on the backend ----------------------------------------------
 * A backend that can choose tokens where the logits are (sample, below) takes
 * one sample_spec per logits row and answers one sample_result, so only a few
 * hundred bytes per row cross to the host. The semantics are the host
 * sampler's (engine/sampler.h), step by step, on the row x of vocab logits:
 *
 * 1. Adjustments, for each entry of the row's sparse list (distinct tokens):
 *    x[t] += bias; then when repeat, x[t] = x[t] > 0 ? x[t] / repetition_penalty
 *    : x[t] * repetition_penalty; then when count > 0,
 *    x[t] = fmaf(-frequency_penalty, count, x[t]) - presence_penalty.
 *    Every operation is one IEEE float operation, rounded to nearest.
 * 1b. The mask (structured output), when given: x[t] = -inf for every token t whose bit
 *    (mask[t >> 5] >> (t & 31)) & 1 is 0.
 * 2. NaN counts as -inf from here on. M = the largest logit, argmax = the
 *    lowest id holding it (token 0 when nothing is above -inf).
 * 3. Greedy (temperature 0 or top_k 1): the token is argmax.
 * 4. Sampling over finite M: e[i] = expf((x[i] - M) / temperature), S = the
 *    double sum of e, p[i] = (float)(e[i] / S). Candidates are ranked by p
 *    descending, ties lower id first; top_k keeps the first top_k (0: all);
 *    min_p keeps the first and those with p >= min_p * p[argmax]; top_p keeps
 *    the shortest ranked prefix whose double running sum reaches top_p. Then
 *    r = u * (double sum of the kept p) and the token is the first kept
 *    candidate at which r minus the running sum drops below 0 (the last kept
 *    one if rounding never lets it). Without any truncation the candidates are
 *    walked in id order instead of ranked order. Nothing above -inf: argmax,
 *    and u is not used (used_random false).
 * 5. Logprobs (n_top >= 0), whatever the temperature: max_logit = M and log_z = M + log of
 *    the sum of expf(x[i] - M) over the row (log of the count of +inf logits
 *    when M is +inf); top holds the n_top best (id, logit) by logit
 *    descending, ties lower id first.
 * A row the backend cannot finish exactly (sampling with a +inf logit, or a
 * truncation its candidate list cannot settle) comes back with need_host:
 * its logits after steps 1 and 1b are in the caller's host_rows and the host finishes
 * the pick itself; max_logit, log_z and top are then not filled. */

/* The most candidates a sample_result reports (OpenAI's top_logprobs limit). */
#define SAMPLE_MAX_TOP 20

/* One token's adjustment before sampling. */
struct sample_adjust {
    int32_t token;  /* [0, vocab) */
    float bias;     /* added first; the sum of the request's logit_bias entries for token */
    int32_t count;  /* times generated: frequency and presence penalties apply when > 0 */
    int32_t repeat; /* 1: the repetition penalty applies (token in prompt or output) */
};

struct sample_spec {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    double u;          /* uniform in [0, 1), drawn by the host for this pick; unused when greedy */
    float repetition_penalty, presence_penalty, frequency_penalty;
    const struct sample_adjust *adjust; /* host memory; n_adjust entries, distinct tokens */
    int n_adjust;
    int n_top;         /* candidates to report, [0, SAMPLE_MAX_TOP]; -1: no logprobs (log_z
                          is then not computed) */
    const uint32_t *mask; /* host memory; NULL: none; else (vocab + 31) / 32 words, step 1b */
};

struct sample_candidate {
    int32_t token;
    float logit;       /* after steps 1 and 1b */
};

struct sample_result {
    int32_t token;     /* the pick */
    float logit;       /* its logit after steps 1 and 1b (NaN reads as -inf) */
    float max_logit;   /* M */
    float log_z;       /* see step 5 */
    int32_t n_top;     /* entries of top filled: min(n_top asked, vocab) */
    int32_t used_random; /* 1 when u decided the pick */
    int32_t need_host; /* 1: only the processed row in host_rows is valid */
    int32_t pad;
    struct sample_candidate top[SAMPLE_MAX_TOP];
};

/* ---- low-rank adapters (LoRA) ----------------------------------------------
 * A PEFT adapter adds scale * B (A x) to a projection's output, per row: A is
 * rank x in and B is out x rank, row-major in backend memory (B's rows
 * b_stride elements apart, so a fused projection's B can be split into row
 * views), f32, or bf16 where FAST mode runs bf16 weights (half the bytes a
 * step reads per distinct adapter; FAST rounds matmul inputs to bf16 anyway).
 * Rows of one step take different adapters, so the op takes runs of rows with
 * the pair each run uses (Punica's segmented shrink and expand). */
#define LORA_MAX_RANK 256
#define LORA_MAX_STACK 4 /* adapters one request may stack ("a+b") */

struct lora_pair {
    const void *a;   /* rank x in */
    const void *b;   /* out x rank, rows b_stride elements apart */
    int rank;
    int b_stride;    /* >= rank */
    float scale;     /* alpha / rank, or alpha / sqrt(rank) (rsLoRA) */
    bool bf16;       /* a and b hold bf16 (widened exactly to f32 as they are read), else f32 */
};

/* Rows [row0, row0 + n_rows) of the step take pair p. */
struct lora_seg {
    int row0, n_rows;
    struct lora_pair p;
};

/* Floats of scratch backend_ops.lora needs for segs: the sum of n_rows * rank. */
static inline size_t lora_scratch_floats(const struct lora_seg *segs, int n_segs)
{
    size_t n = 0;
    for (int i = 0; i < n_segs; i++)
        n += (size_t)segs[i].n_rows * (size_t)segs[i].p.rank;
    return n;
}

struct backend;

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);

    /* Memory for activations and KV; zeroed. NULL when out of memory. */
    void *(*alloc)(struct backend *be, size_t bytes);
    void (*release)(struct backend *be, void *ptr);
    /* Copies between host and backend memory (plain memcpy on the CPU). */
    void (*to_device)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(struct backend *be, void *dst, const void *src, size_t bytes);

    /* Token ids, positions and attn_span arrays passed to ops are host memory;
     * a backend with its own memory copies them itself. */

    /* out[t, :] = row tokens[t] of table (vocab x dim), widened to f32. */
    void (*embed)(struct backend *be, const struct weight_matrix *table, const int32_t *tokens,
                  int64_t n_tokens, float *out);
    /* y[t, r] = sum_c x[t, c] * w[r, c] (+ bias[r] when bias != NULL), for
     * t < n_tokens; x is n_tokens x w->cols, y is n_tokens x w->rows. For
     * block-type weights x may first be quantized to int8 blocks, as
     * llama.cpp does (the CPU's Q8_0, Q4_0, Q4_K, Q6_K kernels). */
    void (*matmul)(struct backend *be, const float *x, int64_t n_tokens,
                   const struct weight_matrix *w, const float *bias, float *y);
    /* The same x through n (<= 4) matrices with equal cols and dtype:
     * y[i] = x * w[i]^T (+ bias[i]); lets a backend fuse q/k/v or gate/up. */
    void (*matmul_group)(struct backend *be, const float *x, int64_t n_tokens, int n,
                         const struct weight_matrix *const *w, const float *const *bias,
                         float *const *y);
    /* y[r, :] = x[r, :] / rms(x[r, :]) * weight, rows of dim floats; y may alias x. */
    void (*rmsnorm)(struct backend *be, const float *x, const float *weight, int64_t n_rows,
                    int64_t dim, float eps, float *y);
    /* Rotates each head of x (n_tokens x n_heads x head_dim, in place) by its
     * token's position, rotate-half (GPT-NeoX) layout as in HF Llama/Qwen, over
     * the head's first rope->rot_dim dims: with half = rot_dim / 2, f the
     * position's frequencies (rope_table) and a = attention_factor,
     *   c = cos(pos * f[i]) * a, s = sin(pos * f[i]) * a (pos * f[i] rounded to f32)
     *   x[i] = x[i] c - x[i + half] s,  x[i + half] = x[i + half] c + x[i] s. */
    void (*rope)(struct backend *be, float *x, int64_t n_tokens, int n_heads, int head_dim,
                 const int32_t *positions, const struct rope_table *rope);
    /* out[i] = silu(gate[i]) * up[i]. */
    void (*silu_mul)(struct backend *be, const float *gate, const float *up, float *out, int64_t n);
    /* y[i] += x[i]. */
    void (*add)(struct backend *be, float *y, const float *x, int64_t n);
    /* Writes the step's new K and V rows (n_rows x kv_dim each) into their
     * slots; a quantized cache's rows are quantized here (kv_quant.h's
     * kvq_quantize_head, the same bytes on every backend up to rounding). */
    void (*kv_store)(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                     const float *v, const struct attn_span *spans, int n_spans);
    /* Causal attention of each span's queries over positions [0, pos] of its
     * sequence (only the last sliding_window of them when that is > 0), read
     * through the block table; q and out are n_rows x (n_heads * head_dim);
     * grouped-query heads share kv head h / (n_heads / n_kv_heads). A
     * quantized cache is read as it is stored, record by record, equal (up
     * to float rounding) to attention over kvq_dequantize_head of each one. */
    void (*attention)(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                      const struct attn_span *spans, int n_spans, int n_heads, float scale,
                      int sliding_window, float *out);

    /* Backends that run ops asynchronously (CUDA) report here the first error
     * an op met since the last call, e.g. out of device memory: 0 when all
     * went well. NULL for backends whose ops cannot fail. */
    int (*status)(struct backend *be, struct err *err);

    /* Optional (NULL: the caller copies logits to the host and samples there).
     * Picks one token per row of logits (backend memory, n_rows x vocab, which
     * the op may overwrite) as the block comment on sample_spec describes,
     * filling out[r] for specs[r]; a row r that needs the host gets its
     * processed logits at host_rows + r * vocab (host memory). Returns 0, or
     * a negative error code with err filled (the op's and earlier ops'). */
    int (*sample)(struct backend *be, const float *logits, int n_rows, int vocab,
                  const struct sample_spec *specs, struct sample_result *out, float *host_rows,
                  struct err *err);

    /* Copies slots [0, n) of block src to block dst in every layer, K and V:
     *   K[layer, dst, slot, e] = K[layer, src, slot, e]   (V likewise)
     * for layer < n_layers, slot < n, e < kv_dim, elements as kv->dtype stores
     * them (bit for bit; a quantized cache's row bytes likewise). src != dst, 0 < n <= block_size; the other slots of
     * dst are left as they are. Runs in order with the ops called before and
     * after it (a backend that records ops records this one too). Optional
     * (NULL: the KV manager never reuses part of a block). */
    void (*kv_copy_slots)(struct backend *be, struct kv_cache *kv, uint32_t src, uint32_t dst,
                          int n);
    /* height rows of width bytes, row i between host + i * host_pitch and
     * dev + i * dev_pitch, in one transfer each way, after every op called
     * before it (as to_host and to_device). Optional (NULL: the caller copies
     * row by row): for a block of every layer's KV, whose rows are strided. */
    void (*to_host_2d)(struct backend *be, void *host, size_t host_pitch, const void *dev,
                       size_t dev_pitch, size_t width, size_t height);
    void (*to_device_2d)(struct backend *be, void *dev, size_t dev_pitch, const void *host,
                         size_t host_pitch, size_t width, size_t height);
    /* Page-locked host memory the device copies to and from directly (NULL
     * when out of memory), and its release. Optional, with the two below. */
    void *(*host_alloc)(struct backend *be, size_t bytes);
    void (*host_free)(struct backend *be, void *ptr);
    /* to_host_2d / to_device_2d into or out of host_alloc memory, queued
     * behind every op called before and ahead of every op called after, and
     * returning at once: the host bytes are what the device will have read
     * or written by the time later ops run, never to be read by the CPU
     * without a synchronous copy after them. */
    void (*to_host_2d_async)(struct backend *be, void *host, size_t host_pitch, const void *dev,
                             size_t dev_pitch, size_t width, size_t height);
    void (*to_device_2d_async)(struct backend *be, void *dev, size_t dev_pitch, const void *host,
                               size_t host_pitch, size_t width, size_t height);
    /* Starts every op called so far on the device and returns without
     * waiting for them, so the host can work while they run. Optional (NULL:
     * ops have run by the time they return, as on the CPU). */
    void (*submit)(struct backend *be);
    /* Optional (NULL: every op runs as it is called). From a call with n_tokens > 0 until
     * the next with 0, the row-wise and elementwise ops of a step over n_tokens token rows
     * (norms, adds, RoPE, K/V stores) may be held and run by the threads that run the next
     * larger op, as its first part; results are for the backend's own ops to read until the
     * call with 0, which runs whatever is held. The CPU backend: one wake of its threads
     * instead of these ops on one thread while the others wait. */
    void (*hold_row_ops)(struct backend *be, int64_t n_tokens);

    /* ---- encoder-decoder ops (Whisper). Optional: NULL on a backend that
     * lacks them, which then cannot run such a model. ---- */
    /* y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias over rows of
     * dim floats, mean and population variance of the row; y may alias x. */
    void (*layer_norm)(struct backend *be, const float *x, const float *weight, const float *bias,
                       int64_t n_rows, int64_t dim, float eps, float *y);
    /* x[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2))) (the exact GELU), in place. */
    void (*gelu)(struct backend *be, float *x, int64_t n);
    /* 1-D convolution over time, activations time-major: x is n_in x c_in, y
     * is n_out x w->rows, n_out = (n_in + 2 * pad - kernel) / stride + 1, and
     *   y[t, o] = bias[o] + sum_{c, j} w[o, c * kernel + j] * x[t * stride + j - pad, c]
     * where x outside rows [0, n_in) reads 0; w is PyTorch's (out, in, kernel)
     * weight seen as out x (in * kernel); bias may be NULL. */
    void (*conv1d)(struct backend *be, const float *x, int64_t n_in, int64_t c_in,
                   const struct weight_matrix *w, const float *bias, int kernel, int stride,
                   int pad, float *y);
    /* Attention over contiguous K/V rows: q and out are n_q x (n_heads * head_dim);
     * row r of k and v starts at r * kv_stride floats, head h at h * head_dim.
     * Query i attends to keys [0, n_kv) when causal < 0, else to
     * [0, min(n_kv, causal + i + 1)): out = softmax(scale * q . k) v per head. */
    void (*attention_dense)(struct backend *be, const float *q, int64_t n_q, const float *k,
                            const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                            int head_dim, float scale, int64_t causal, float *out);
    /* dst[rows[r] * cols + c] = src[r * cols + c] for r < n_rows (embed's
     * inverse: rows written where a host array of indices says, which lets a
     * decoder step write its K/V cache row without the position in the op). */
    void (*scatter_rows)(struct backend *be, const float *src, int64_t n_rows, int64_t cols,
                         const int32_t *rows, float *dst);

    /* ---- mixture-of-experts ops (Qwen3-MoE). Optional: NULL on a backend that
     * lacks them, which then cannot load such a model. ---- */
    /* Mixture-of-experts routing, for each row r of logits (n_rows x
     * n_experts, the router's output): p = softmax(logits[r]) in f32 (the
     * largest logit subtracted, expf, the sum in expert order, each e times
     * 1 / sum); the top_k experts by p are chosen as torch.topk chooses them
     * on the CPU (backend/moe_route.h: libstdc++'s nth_element, or
     * partial_sort when top_k * 64 <= n_experts, over (p, expert) pairs, so
     * equal p resolve as the reference resolves them), written to
     * ids[r * top_k + j] by p descending (ties lower id first) with their p
     * in weights[r * top_k + j], each divided by the sum of the chosen p (in
     * that order) when norm. ids and weights are backend memory: a backend
     * with its own memory never copies them to the host (moe_ffn reads them
     * where they are). 1 <= top_k <= n_experts <= MOE_MAX_EXPERTS. */
    void (*moe_route)(struct backend *be, const float *logits, int64_t n_rows, int n_experts,
                      int top_k, bool norm, int32_t *ids, float *weights);
    /* The experts of moe_route's choice:
     *   y[r, :] = sum over the top_k experts e of row r, in ascending order
     *             of e, of weights[r, j] * f_e(x[r, :])
     * each term rounded to f32 and added to a sum starting at 0 (the order
     * transformers' index_add_ adds them). x and y are n_rows x ex->hidden
     * (y must not alias x); scratch is backend memory of
     * moe_scratch_floats(n_rows, top_k, ex->inter, ex->hidden) floats. Only
     * the matrices of experts some row chose are read. EXACT mode: a row's
     * result is the same whatever other rows the call has. */
    void (*moe_ffn)(struct backend *be, const float *x, int64_t n_rows,
                    const struct moe_experts *ex, const int32_t *ids, const float *weights,
                    int top_k, float *scratch, float *y);
    /* y[r, :] += sigmoid(g[r]) * x[r, :] for n_rows rows of dim floats,
     * sigmoid(t) = 1 / (1 + expf(-t)) (a shared expert's gate, Qwen2-MoE style). */
    void (*gated_add)(struct backend *be, float *y, const float *x, const float *g,
                      int64_t n_rows, int64_t dim);
    /* ---- Gemma 3's elementwise ops. Optional: NULL on a backend that lacks
     * them, which then cannot run such a model. Each element is computed on
     * its own (batch invariance holds), in f32. ---- */
    /* out[i] = gelu_tanh(gate[i]) * up[i], where gelu_tanh(x) =
     * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (PyTorch's
     * approximate="tanh"); out may alias gate. */
    void (*gelu_tanh_mul)(struct backend *be, const float *gate, const float *up, float *out,
                          int64_t n);
    /* x[i] = x[i] * s. */
    void (*scale)(struct backend *be, float *x, int64_t n, float s);
    /* x[i] = cap * tanh(x[i] / cap) (logit soft-capping). */
    void (*softcap)(struct backend *be, float *x, int64_t n, float cap);

    /* ---- low-rank adapters. Optional: NULL on a backend that cannot run
     * adapters (loading one onto it is refused). ---- */
    /* For each seg in order and each row t of it, with A, B (as f32), scale its pair's:
     *   u[k] = sum_c A[k, c] * x[t, c]          (k < rank, f32)
     *   y[t, r] += scale * (sum_k B[r, k] * u[k])  (r < out, f32)
     * x is rows x in, y rows x out (y does not alias x); rows outside every
     * seg are left as they are; segs over the same rows (stacked adapters)
     * add in seg order. A row's result depends on that row alone, whatever
     * else the call holds (batch invariance). scratch is backend memory of
     * lora_scratch_floats(segs, n_segs) floats; segs is host memory. */
    void (*lora)(struct backend *be, const float *x, int64_t in, int64_t out,
                 const struct lora_seg *segs, int n_segs, float *scratch, float *y);

    /* alloc's memory is the host's, page aligned: the CPU may read it where it lies (the SSD
     * tier writes cached KV blocks to disk straight from the pool). */
    bool memory_is_host;
};

/* A backend is driven by one thread at a time (its scratch buffers, thread
 * pool and stream are its own); two engines over one backend must not step
 * at once. */
struct backend {
    const struct backend_ops *ops;
    enum compute_mode mode;
    /* The loader copies weight matrices into backend memory (alloc +
     * to_device) instead of pointing at the mapped file: for backends that
     * cannot read host memory in place. */
    bool copy_weights;
    /* The loader reads weight matrices from their files (pread) into backend
     * memory instead of pointing at the mapped file: for backends whose
     * memory is host memory in huge pages. A mapped file's pages are 4 KB
     * page-cache pages (no file system here backs a mapping with huge ones);
     * a decode step streams every weight once, and from pages left in small
     * folios by the file's writer that cost up to 8x in decode speed. */
    bool read_weights;
    /* In FAST mode the loader lays BF16 weight matrices out in panels of 32
     * rows (DTYPE_BF16_P32, base/panels.h) for embed and matmul: where the
     * CPU's GEMV multiplies a broadcast pair of x by 16 rows at once. */
    bool bf16_panels;
    /* embed and matmul take weight matrices of the block types as they
     * are stored; false: the loader dequantizes them to F32. */
    bool block_weights;
    /* With block_weights: the block types taken, bit (1 << dtype) each; 0
     * takes all of them. The loader dequantizes the others to F32. */
    uint64_t block_types;
    /* Element type of the KV caches this backend's attention reads and writes. */
    enum dtype kv_dtype;
    /* Their quantized format (backend/kv_quant.h), the backend's copy of
     * backend_options.kv_quant; NULL: kv_dtype elements. */
    const struct kv_quant *kv_quant;
    void *impl; /* owned by the backend */
};

/* Whether be's embed and matmul take weights of block type t as stored. */
static inline bool backend_takes_blocks(const struct backend *be, enum dtype t)
{
    return be->block_weights && dtype_is_block(t) &&
           (!be->block_types || ((be->block_types >> t) & 1u));
}

/* A switch whose zero value leaves the backend's default. */
enum backend_switch { BACKEND_DEFAULT = 0, BACKEND_ON, BACKEND_OFF };

/* Element type of the KV cache (backend.kv_dtype). */
enum backend_kv_type {
    BACKEND_KV_AUTO = 0, /* the backend's choice: f16 in FAST mode, f32 in EXACT mode */
    BACKEND_KV_F32,
    BACKEND_KV_F16,
};

/* What the CUDA backend measures and logs when it is destroyed. */
enum backend_profile {
    BACKEND_PROFILE_OFF = 0,
    BACKEND_PROFILE_OPS,    /* steps launched eagerly, each launch timed between events;
                               GPU time per kind of launch */
    BACKEND_PROFILE_GRAPHS, /* graph captures and replays, the GPU time of each replayed
                               step, and the host's time per sampled step */
};

/* How a backend is made. Zero-initialised, every field is its default, so a
 * caller names only what it changes: (struct backend_options){.threads = 2}.
 * A backend ignores the fields that are not about it. The defaults are the
 * fastest settings; the switches exist to measure each piece and to check
 * that turning it off changes no result. */
struct backend_options {
    enum compute_mode mode;  /* EXACT (the zero value) or FAST */
    int threads;             /* CPU: worker threads; 0: one per core */
    enum cpu_isa cpu_isa;    /* CPU: the highest instruction set its kernels use;
                                CPU_ISA_BEST: whatever the processor has */
    enum backend_kv_type kv_type;
    /* The KV cache quantized on write and read quantized by attention
     * (copied at creation); NULL: plain kv_type elements. */
    const struct kv_quant *kv_quant;
    /* CUDA: a step of at most 8 tokens is captured into a CUDA graph the
     * first time its op list is seen and replayed after (default on; off:
     * every step launched eagerly) */
    enum backend_switch cuda_graphs;
    /* CUDA: kernels start while the launch before them drains (programmatic
     * dependent launch, sm_90 and newer; default on; off: each launch waits) */
    enum backend_switch cuda_pdl;
    /* CUDA: an RMSNorm is folded into the decode GEMV that reads its output
     * (default on in FAST mode; off: the norm is its own launch, the default in
     * EXACT mode, whose batch invariance the folded norm's sum would break) */
    enum backend_switch cuda_norm_fusion;
    /* CUDA: q/k norms + RoPE + KV write are folded into the decode attention
     * after them (default on; off: they are one launch before it) */
    enum backend_switch cuda_qk_fusion;
    /* CUDA: ... also for spans of up to 8 tokens over an f16 cache (a speculative verify
     * step; default off until measured on a GPU: their q/k work is one launch before the
     * attention) */
    enum backend_switch cuda_qk_span_fusion;
    /* CUDA: in FAST mode the skinny GEMM that adds into the residual stream (3-8 rows) also
     * leaves each row's sums of squares, and the skinny GEMM after the RMSNorm of that
     * stream normalises its x from them, so the norm is no launch of its own (default: in
     * steps with a span of several tokens, a speculative verify step's, where it measured
     * faster; on: in every such step, batched decode too; off: the norm is launched) */
    enum backend_switch cuda_norm_sums;
    /* CUDA: a residual add and the RMSNorm of its sum right after it are one launch
     * (default on; off: two launches; the bits are the same either way) */
    enum backend_switch cuda_add_norm_fusion;
    /* CUDA: the RMSNorm or SwiGLU right before a cuBLASLt GEMM also writes its output in bf16
     * for it (default on; off: the GEMM converts x in a launch of its own; same bits) */
    enum backend_switch cuda_gemm_x_fusion;
    /* CUDA: in FAST mode the cuBLASLt GEMM of a gate/up pair writes both products in bf16
     * where only the SwiGLU after it reads them, and that SwiGLU writes only the bf16 x of
     * the down GEMM (default on; off: f32 products; gate and up are then rounded to bf16
     * after the SiLU, not before) */
    enum backend_switch cuda_gemm_bf16_swiglu;
    /* CUDA: in FAST mode a cuBLASLt GEMM whose product only a residual add reads adds into
     * the residual stream itself (default on; off: the product is written, and the add is
     * its own launch or the RMSNorm's after it) */
    enum backend_switch cuda_gemm_residual;
    /* CUDA: FAST-mode prefill attention over an f16 cache on tensor cores
     * (default on; off: the f32 kernel) */
    enum backend_switch cuda_prefill_tc;
    /* CUDA: that prefill, over an f16 cache and over a quantized one (its
     * attending warps), on Hopper's warp-group tensor cores (wgmma, where the
     * GPU runs sm_90a code; default on; off: mma.sync) */
    enum backend_switch cuda_prefill_wgmma;
    /* CUDA: that prefill over a quantized cache with warps that decode the
     * records beside the warps that attend (where the GPU runs sm_90a code;
     * default on; off: every warp decodes and attends in turn) */
    enum backend_switch cuda_qprefill_ws;
    /* CUDA: that prefill's blocks, with wgmma consumers, as clusters of two
     * whose producers decode one side each (K, V) into both blocks' tiles
     * (default on; off: each block decodes both) */
    enum backend_switch cuda_qprefill_pair;
    /* CUDA: FAST-mode prefill over a quantized cache by decoding the spans'
     * records once a step into an f16 window that the f16 cache's prefill
     * kernel attends over (head dims 64 and 128, windows up to
     * CU_QWINDOW_MAX_BYTES; default on; off: the kernels that decode each
     * tile for every block of query rows it serves) */
    enum backend_switch cuda_qprefill_window;
    /* CUDA: FAST-mode decode attention of many sequences (more than 8 rows)
     * over an f16 cache on tensor cores (default on; off: the f32
     * flash-decoding kernel, with the q/k launch folded in) */
    enum backend_switch cuda_decode_tc;
    /* CUDA: FAST-mode bf16 matmuls of 9 to 64 rows (a batched decode step) on
     * a tensor-core tile GEMM with the GEMV epilogues (default off, where
     * cuBLASLt is faster: bench/RESULTS.md; off: cuBLASLt, the adds and SwiGLU
     * launched apart) */
    enum backend_switch cuda_batch_gemm;
    /* CUDA, FAST mode: the GEMM path's bf16 matmuls of 9-128 rows on a warp-group
     * tensor-core GEMM (sm_90a GPUs; default off, where cuBLASLt is faster:
     * bench/RESULTS.md; off: cuBLASLt) */
    enum backend_switch cuda_wgmma_gemm;
    /* CUDA, FAST mode: a lora group's shrink and expand folded into the RMSNorm and SiLU-mul
     * launches around its matmul, where thread-block clusters run (default off, where its
     * row launches cost more than the launches they save: bench/RESULTS.md; off: two
     * launches a group) */
    enum backend_switch cuda_lora_rows;
    /* CUDA: matmuls of f32 weights over more rows than the GEMV kernels take
     * through cuBLASLt's f32 GEMM (default off: a row's result then depends
     * on how many rows the GEMM has, which EXACT mode's batch invariance
     * forbids; Whisper's backend, whose encoder multiplies 1,500 rows, turns
     * it on) */
    enum backend_switch cuda_gemm_f32;
    /* CUDA: MoE routing a warp per row, the experts on GEMVs with 16-byte
     * loads and, in FAST mode with many rows, a grouped tensor-core GEMM
     * (default on; off: the first kernels, routing a thread per row and the
     * experts a warp per output reading an element per lane) */
    enum backend_switch cuda_moe;
    /* CUDA: FAST-mode GEMVs of Q8_0, Q4_K and Q6_K weights over at most 8 rows
     * quantize x to int8 blocks and multiply with __dp4a (default on; off:
     * the float kernels EXACT mode runs, dequantizing to f32 in registers) */
    enum backend_switch cuda_qgemv_dp4a;
    /* CUDA: of those, Q4_K and Q6_K ones (Q6_K rows a multiple of 2048 long)
     * run in one launch whose blocks quantize x (Q4_K: and apply a folded
     * RMSNorm) in shared memory themselves (default on; off: x quantized by a
     * launch of its own, as for Q8_0) */
    enum backend_switch cuda_qgemv_stream;
    /* CUDA: of those, a Q4_K product and a Q6_K one over the same x (Q4_K_M's
     * q and k, then v) in one launch of that kernel (default on; off: a launch
     * for each type) */
    enum backend_switch cuda_qgemv_mixed;
    /* CUDA: FAST-mode bf16 matmuls of at most this many token rows run on the
     * GEMV kernels, more rows on the skinny GEMM or cuBLASLt (1..8; 0: the
     * default, 2) */
    int cuda_gemv_rows;
    /* CUDA: FAST-mode bf16 matmuls of 3..8 token rows run on a tensor-core
     * GEMM that reads the weights once for all rows (default on; off:
     * cuBLASLt) */
    enum backend_switch cuda_skinny_gemm;
    /* CUDA: backend_ops.sample picks tokens on the GPU (default on; off: the
     * op is NULL, so logits are copied to the host and sampled there) */
    enum backend_switch gpu_sampling;
    enum backend_profile profile; /* CUDA */
    /* CUDA: alloc hands out at most this many bytes of device memory at once
     * (weights, KV, activations); past it alloc returns NULL, which its
     * callers report as -INFERD_ENOMEM. 0: no cap. */
    size_t memory_cap_bytes;
};

/* Creates the CPU backend from opt's mode, threads, cpu_isa, kv_type and
 * kv_quant (a quantized cache's kv_dtype is F32, whatever kv_type says).
 * -INFERD_EUNSUPPORTED when the processor (or the cpu_isa cap) lacks
 * AVX2/FMA; -INFERD_EINVAL for a kv_quant format outside those kv_quant.h
 * lists. */
int backend_cpu_create(const struct backend_options *opt, struct backend **out,
                       struct err *err);

static inline void backend_destroy(struct backend *be)
{
    if (be)
        be->ops->destroy(be);
}

#endif
