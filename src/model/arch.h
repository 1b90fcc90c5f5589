/* model/arch.h — what differs between model families: one table per family, chosen at load time (internal to model/).
 *
 * forward.c is the driver every family shares: it lays out the batch,
 * embeds the tokens, calls the family's layer once per layer and runs the
 * final norm and the LM head. A family (arch/NAME.c) says which config.json
 * architectures it serves, which tensors a layer has (load_layer) and what a
 * layer computes over the shared buffers of struct forward_state (layer).
 * A new family is a new file and one line in arch.c. */
#ifndef INFERD_MODEL_ARCH_H
#define INFERD_MODEL_ARCH_H

#include "model/model.h"

/* The activations of one step, max_tokens rows each; forward.c owns them
 * (forward_state_create / forward_state_free), a family's layer reads and
 * writes them. */
struct forward_state {
    int max_tokens;
    struct backend *be;            /* borrowed */
    /* backend memory, max_tokens rows each: */
    float *x;                      /* residual stream, hidden_size */
    float *xn;                     /* normed input of a block, hidden_size */
    float *q, *attn;               /* n_heads * head_dim */
    float *k, *v;                  /* n_kv_heads * head_dim */
    float *gate, *up;              /* intermediate_size (or a shared expert's, when wider) */
    float *proj;                   /* o_proj / down_proj output, hidden_size */
    float *head_in;                /* final-normed rows awaiting the LM head, hidden_size */
    float *logits;                 /* LOGITS_CHUNK_ROWS x vocab_size */
    /* mixture of experts (NULL for a dense model): */
    float *router;                 /* n_experts */
    int32_t *moe_ids;              /* n_experts_per_tok: the chosen experts */
    float *moe_weights;            /* n_experts_per_tok */
    float *moe_scratch;            /* moe_scratch_floats(max_tokens, ...) in all */
    float *shared_out;             /* hidden_size; NULL without a shared expert */
    float *shared_gate;            /* 1 */
    /* host memory: */
    int32_t *tokens, *positions;   /* owned; max_tokens */
    int32_t *out_rows;             /* owned; rows whose logits are wanted */
    struct attn_span *spans;       /* owned; grown to the batch's n_seqs */
    int spans_cap;
    /* Low-rank adapters of this step: runs of consecutive rows that take one
     * adapter (a stack is one run per adapter over the same rows), built by
     * batch_prepare; n_lora_runs 0: no row takes any, and forward_lora is a no-op. */
    struct lora_run *lora_runs;    /* owned; lora_runs_cap */
    int n_lora_runs, lora_runs_cap;
    struct lora_seg *lora_segs;    /* owned; lora_runs_cap: one op's segments */
    float *lora_scratch;           /* backend memory, allocated by the first step with adapters:
                                      max_tokens * LORA_MAX_STACK * LORA_MAX_RANK floats */
    /* a windowed cache's window layers (kv_cache.window): the spans with
     * their blocks mapped to window slots */
    struct attn_span *window_spans; /* owned; spans_cap */
    uint32_t *window_ids;          /* owned; window_ids_cap */
    size_t window_ids_cap;
    /* tensor parallelism: the first error a collective met this step (0:
     * none), returned once the layers are done */
    int collective_rc;
    struct err collective_err;
    /* a group's front (model.tp): each rank's state, owned; NULL otherwise */
    struct forward_state **ranks;
    int n_ranks;
};

struct lora_run {
    int row0, n_rows;
    const struct lora_adapter *adapter; /* borrowed from the batch */
};

/* y (n_rows x the target's out) += each run's adapter's update of x for
 * target t of layer (backend_ops.lora); nothing when no run targets it. A
 * family calls it after each projection's matmul, before anything reads y. */
void forward_lora(const struct model *m, struct forward_state *st, int layer, int t,
                  const float *x, int64_t in, int64_t out, float *y);

/* buf (n floats, a row-parallel projection's output) summed over the
 * ranks of m's group; nothing for a model alone. A family calls it after
 * o_proj and down_proj (and their adapters), before the residual add. */
void forward_all_reduce(const struct model *m, struct forward_state *st, float *buf, int64_t n);

/* The cache, layer index and spans that layer's K/V are stored and read
 * through: kv's, or for a window layer of a windowed cache its window's. */
static inline struct kv_cache *arch_layer_kv(struct kv_cache *kv, const struct forward_state *st,
                                             int layer, int *kv_layer,
                                             const struct attn_span **spans)
{
    if (!kv->window) {
        *kv_layer = layer;
        *spans = st->spans;
        return kv;
    }
    int i = kv->layer_index[layer];
    *kv_layer = i >= 0 ? i : -1 - i;
    *spans = i >= 0 ? st->spans : st->window_spans;
    return i >= 0 ? kv : kv->window;
}

struct arch {
    const char *name;                    /* the family, e.g. "llama" */
    const enum model_arch *serves;       /* the config architectures it runs */
    int n_serves;
    /* Loads layer i's tensors into *lw (through model_load_matrix /
     * model_load_vector), checking each against the shape config implies. */
    int (*load_layer)(struct model *m, int i, struct layer_weights *lw, struct err *err);
    /* One decoder layer over the n_rows rows of st->x (in place): the K/V of
     * the rows go into kv's layer, spans are st->spans[0 .. n_spans). The
     * backend fuses by the order of ops, so a family's op order is part of
     * its contract. */
    void (*layer)(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                  int layer, int n_rows, int n_spans);
};

/* The family that runs a, or NULL when none does. */
const struct arch *arch_find(enum model_arch a);

/* The families (arch/NAME.c), each a table. */
extern const struct arch arch_llama;
extern const struct arch arch_qwen3_moe;

/* The Llama family's pieces other families share (arch/llama.c): layer i's
 * attention tensors and norms (input and post-attention), a SwiGLU MLP of
 * inter rows (mlp.{gate,up,down}_proj), and the blocks over them. */
int arch_llama_load_attention(struct model *m, int i, struct layer_weights *L, struct err *err);
int arch_llama_load_mlp(struct model *m, int i, int64_t inter, struct layer_weights *L,
                        struct err *err);
void arch_llama_attention(const struct model *m, struct forward_state *st,
                          const struct layer_weights *lw, struct kv_cache *kv, int layer,
                          int n_rows, int n_spans);
void arch_llama_mlp(const struct model *m, struct forward_state *st,
                    const struct layer_weights *lw, int n_rows);
extern const struct arch arch_gemma3;
extern const struct arch arch_phi3;

/* Weight loading for load_layer (load.c): the tensor name with exactly the
 * shape given, marked used. A matrix stays in the mapping where it can (BF16,
 * F32); F16 is widened to F32. A vector is converted to F32 in backend
 * memory. Both are -INFERD_EFORMAT naming the tensor when it is missing or
 * has another shape. */
int model_load_matrix(struct model *m, const char *name, int64_t rows, int64_t cols,
                      struct weight_matrix *w, struct err *err);
int model_load_vector(struct model *m, const char *name, int64_t n, float **out,
                      struct err *err);
/* An RMSNorm weight: model_load_vector, with Gemma's offset folded in
 * (config.gemma_norm: 1 + w, one f32 add, as transformers computes it). */
int model_load_norm(struct model *m, const char *name, int64_t n, float **out, struct err *err);

/* A fused projection of n_parts stacked parts (part i part_rows[i] rows,
 * cols wide) loaded as model_load_matrix loads one matrix, each part a
 * matrix of its own: a view where the layout allows (model_matrix_rows),
 * else a copy of its rows. */
int model_load_matrix_parts(struct model *m, const char *name, int64_t cols, int n_parts,
                            const int64_t *part_rows, struct weight_matrix *parts,
                            struct err *err);

/* Rows [r0, r0 + n) of whole as a matrix: a view (model_matrix_rows) where
 * the layout allows, else (panels, r0 not a panel's first row) a copy the
 * model owns; name is for errors. */
int model_matrix_rows_owned(struct model *m, const char *name, const struct weight_matrix *whole,
                            int64_t r0, int64_t n, struct weight_matrix *part, struct err *err);

/* Rows [r0, r0 + n) of w, in place (a fused projection split into its parts);
 * in panels (DTYPE_BF16_P32) r0 must be a multiple of 32. */
static inline struct weight_matrix model_matrix_rows(const struct weight_matrix *w, int64_t r0,
                                                     int64_t n)
{
    struct weight_matrix v = *w;
    v.rows = n;
    v.data = (const uint8_t *)w->data + (uint64_t)r0 * dtype_row_bytes(w->dtype, (uint64_t)w->cols);
    return v;
}

#endif
