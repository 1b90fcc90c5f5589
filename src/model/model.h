/* model/model.h — a loaded model (config + weights on a backend) and the forward pass over a batch. */
#ifndef INFERD_MODEL_MODEL_H
#define INFERD_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"

/* One decoder layer's weights; the family's load_layer (model/arch.h) fills
 * the ones it has. */
struct layer_weights {
    float *attn_norm;            /* backend memory, hidden_size floats */
    struct weight_matrix wq, wk, wv, wo;
    float *bq, *bk, *bv;         /* backend memory or NULL when the arch has no qkv bias */
    float *bo;                   /* o_proj bias (attention_bias on Llama/Qwen3), else NULL */
    float *q_norm, *k_norm;      /* head_dim floats, Qwen3 only, else NULL */
    float *mlp_norm;
    struct weight_matrix w_gate, w_up, w_down; /* the dense MLP; unset in a sparse layer */
    /* A sparse (mixture-of-experts) layer: the router and the experts. */
    struct weight_matrix router;   /* n_experts x hidden (mlp.gate) */
    struct moe_experts experts;    /* its gate/up/down arrays owned (load.c frees them) */
    /* The shared expert every token runs, scaled by sigmoid(shared_gate . x) (Qwen2-MoE
     * style); rows 0 when the config has none. */
    struct weight_matrix shared_gate, shared_up, shared_down;
    struct weight_matrix shared_expert_gate; /* 1 x hidden */
    /* Gemma 3's sandwich: norms of the attention's and the MLP's outputs
     * before their residual adds, else NULL */
    float *attn_post_norm, *mlp_post_norm;
};

struct model_weights {
    struct weight_matrix embed;  /* vocab x hidden */
    struct layer_weights *layers;/* owned; n_layers */
    float *final_norm;
    struct weight_matrix lm_head;/* == embed when tied */
};

/* What a directory says about its embeddings (sentence-transformers'
 * modules.json, model/embedding.c). Without those files: POOLING_DEFAULT,
 * and an embedding is the last token's hidden state, L2-normalised. */
enum model_pooling {
    MODEL_POOLING_DEFAULT = 0,  /* no modules.json */
    MODEL_POOLING_LAST_TOKEN,   /* Qwen3-Embedding's: the last token's hidden state */
    MODEL_POOLING_OTHER,        /* mean, CLS, max, ...: not computed (mode names it) */
};
struct model_embedding {
    enum model_pooling pooling;
    char mode[32];              /* the pooling_mode_* that is on ("lasttoken", "mean_tokens") */
    bool normalize;             /* a Normalize module follows the pooling */
};
/* Reads DIR/modules.json and its Pooling module's config.json; absent files
 * leave the default. A file that is not what it should be is -INFERD_EFORMAT. */
int model_embedding_load(const char *dir, struct model_embedding *out, struct err *err);

struct arch;
struct lora_adapter;
struct collective;
struct tp_group;

struct model {
    struct model_config config;
    const struct arch *arch;     /* borrowed (static): the family that runs config.arch */
    struct generation_defaults generation;
    struct model_weights weights;
    struct backend *backend;     /* borrowed */
    struct st_set files;         /* owned: the mappings weights point into */
    void **owned_buffers;        /* owned: widened/converted tensors (backend memory) */
    int n_owned_buffers, cap_owned_buffers;
    float *rope_inv_freq;        /* owned host memory, head_dim / 2 floats */
    enum dtype quantize;         /* model_load_options.quantize, while loading */
    struct rope_table rope;
    struct model_embedding embedding; /* the directory's pooling, for /v1/embeddings */
    /* Gemma 3's local (sliding-window) layers rotate by their own base */
    float *rope_local_inv_freq;  /* owned host memory, rope_dim / 2 floats; NULL elsewhere */
    struct rope_table rope_local;
    /* The text model's tensor names start with this: "model.", or for
     * Gemma3ForConditionalGeneration where its checkpoint puts them */
    char prefix[32];
    float embed_scale;           /* embeddings are multiplied by it (Gemma 3); 0: not */
    /* Tensor parallelism (model/tensor_parallel.h). A rank's model holds its
     * shard (tp_rank of tp_ranks; 0 ranks: the whole model), sums its
     * row-parallel outputs through comm (borrowed; NULL alone) and its LM
     * head computes vocabulary [vocab_lo, vocab_lo + lm_head.rows). The model
     * model_load_parallel returns fronts the group: tp (owned) runs every
     * rank, and its backend is the group's face to the KV pool. */
    int tp_rank, tp_ranks;
    struct collective *comm;
    int64_t vocab_lo;
    struct tp_group *tp;
};

/* Loads DIR (config.json, safetensors, generation_config.json) onto be, or
 * a GGUF file when dir names one (model/gguf.h maps it onto the same config
 * and tensor names). Checks every expected tensor exists with the shape
 * config.json implies, and that no unexpected tensor is left over. */
int model_load(const char *dir, struct backend *be, struct model **out, struct err *err);

/* How model_load_with places weights. The zero value is model_load's. */
struct model_load_options {
    /* DTYPE_Q8_0 or DTYPE_Q4_K: dense weight matrices (bf16, f16, f32) are
     * quantized in memory at load with the reference quantizers
     * (base/quant.h), as llama-quantize would write them: Q4_K's LM head
     * (or the embedding tied to it) as Q6_K, and a matrix whose rows are not
     * whole blocks of the type as Q8_0, else as stored. Needs a backend with
     * block_weights. DTYPE_F32 (zero): weights as stored. */
    enum dtype quantize;
    /* Load only rank tp_rank's shard of tp_ranks (model/tensor_parallel.h);
     * 0 or 1 ranks: the whole model. model_load_parallel sets these. */
    int tp_rank, tp_ranks;
};
int model_load_with(const char *dir, struct backend *be, const struct model_load_options *o,
                    struct model **out, struct err *err);
void model_free(struct model *m);

/* Tensor parallelism: dir loaded once per rank, rank r's shard onto bes[r]
 * summing through comms[r] (both borrowed, kept by the caller until
 * model_free; one group of collective.h), behind one model that the engine
 * drives as any other: its config is rank 0's share (the KV pool it is
 * given holds rank 0's KV heads, and the group keeps a pool of the same
 * blocks on every other rank), model_forward runs all ranks in lock-step
 * (a thread per rank besides the caller's) and fills the whole logits
 * rows, sampled on the host. n_ranks 1 is the plain model through the same
 * code. -INFERD_EUNSUPPORTED for what cannot be split (model/
 * tensor_parallel.h), -INFERD_EINVAL when n_ranks does not divide the
 * heads. */
int model_load_parallel(const char *dir, struct backend *const *bes,
                        struct collective *const *comms, int n_ranks,
                        const struct model_load_options *o, struct model **out, struct err *err);

/* The tokenizer of what model_load takes: DIR's tokenizer.json (and
 * tokenizer_config.json), or a GGUF file's tokenizer.ggml.* metadata. */
struct tokenizer;
int model_tokenizer_load(const char *path, struct tokenizer **out, struct err *err);
/* True when path is a GGUF file rather than a model directory. */
bool model_path_is_gguf(const char *path);

/* Bytes of weights one decode step reads (for bandwidth floors). */
uint64_t model_weight_bytes_per_token(const struct model *m);
/* Bytes of all weights: what one step reads plus the embedding rows it does
 * not (the whole table once when the LM head is tied to it). */
uint64_t model_weight_bytes(const struct model *m);

/* One sequence's part of a forward step. tokens[i] sits at position pos0 + i.
 * block_ids must cover pos0 + n_tokens positions of kv. When all_logits,
 * logits for every token are produced, else only for the last one (none when no_logits). */
struct batch_seq {
    const int32_t *tokens;
    int n_tokens;
    int pos0;
    const uint32_t *block_ids;
    int n_block_ids;
    bool all_logits;
    bool no_logits; /* no row at all: a prefill chunk whose prediction nobody reads */
    /* Host memory of hidden_size floats, or NULL: the last token's final-normed
     * hidden state (what the LM head would read) is copied here, and the
     * sequence gets no logits row (an embedding). */
    float *hidden_out;
    /* The low-rank adapters (model/lora.h) this sequence's rows take, applied
     * in order and summed (stacked); n_adapters 0: the base model alone. */
    const struct lora_adapter *const *adapters;
    int n_adapters;
};

struct batch {
    const struct batch_seq *seqs;
    int n_seqs;
};

/* Scratch activations sized for up to max_tokens tokens per step. */
struct forward_state;
int forward_state_create(const struct model *m, int max_tokens, struct forward_state **out,
                         struct err *err);
void forward_state_free(struct forward_state *st);
/* Backend bytes forward_state_create allocates for max_tokens tokens. */
uint64_t forward_state_bytes(const struct model_config *c, int max_tokens);

/* Runs one step: writes the batch's K/V into kv and fills logits (host
 * memory, caller-owned) with vocab_size floats per requested output row, in
 * batch order (all tokens of a seq when all_logits, else its last token). */
int model_forward(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                  const struct batch *batch, float *logits, struct err *err);

/* True when the model's backend picks tokens itself (backend_ops.sample). */
bool model_samples_on_backend(const struct model *m);
/* True when forward_output.before_rows runs while the device computes the step (an
 * asynchronous backend, one rank): host work put there costs the step nothing. */
bool model_overlaps_host_work(const struct model *m);

/* Where a step's output rows go, and the host's work while the device
 * computes them. */
struct forward_output {
    /* Host memory, as large as model_forward's logits: every row's logits when
     * the rows are not sampled on the device; else the processed logits of a
     * row the backend hands back (need_host), at host_rows + row * vocab_size. */
    float *host_rows;
    /* specs[row] picks row's token into results[row] on the device; NULL (or
     * a backend that does not sample): the logits go to host_rows. */
    const struct sample_spec *specs;
    struct sample_result *results;
    /* Called once in a step that has output rows, after the layers and the
     * LM head's first rows are started on the device (backend_ops.submit) and
     * before any row is read: host work there overlaps the device on a
     * backend that runs asynchronously (elsewhere it runs after the layers).
     * sampled says whether the rows are about to be sampled on the device
     * with specs (which it may fill now). Returns 0 to go on, 1 to copy the
     * logits to host_rows instead of sampling, or a negative error code with
     * err filled. NULL: none. */
    int (*before_rows)(void *ctx, bool sampled, struct err *err);
    void *ctx;
    /* The LM head's first head_rows rows only (0: every row): each logits row
     * gets its first head_rows logits, at the same stride, and the rest of the
     * row is left as it was; nothing is sampled on the device. A drafter that
     * proposes only the vocabulary's most frequent tokens reads that much less
     * of the head. Ignored under tensor parallelism, whose ranks hold columns
     * of the head already. */
    int head_rows;
};

/* model_forward with its rows sampled on the device where out->specs and the
 * backend allow (only results cross to the host), and out->before_rows run
 * while the device computes. */
int model_forward_sampled(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                          const struct batch *batch, const struct forward_output *out,
                          struct err *err);

/* Number of logits rows model_forward will write for batch. */
int batch_n_outputs(const struct batch *batch);

#endif
