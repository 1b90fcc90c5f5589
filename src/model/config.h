/* model/config.h — a model's config.json and generation_config.json, parsed and validated. */
#ifndef INFERD_MODEL_CONFIG_H
#define INFERD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "base/dtype.h"
#include "base/err.h"

enum model_arch {
    ARCH_LLAMA,
    ARCH_MISTRAL,
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_QWEN3_MOE,   /* Qwen3MoeForCausalLM */
    ARCH_GEMMA3,      /* Gemma3ForCausalLM, and the text model of Gemma3ForConditionalGeneration */
    ARCH_PHI3,        /* Phi3ForCausalLM: Phi-3, Phi-3.5, Phi-4-mini */
};

enum rope_scaling_kind {
    ROPE_SCALING_NONE,
    ROPE_SCALING_LINEAR,
    ROPE_SCALING_LLAMA3,
    ROPE_SCALING_LONGROPE, /* Phi-3's longrope (older configs: "su"): per-dim short/long factors */
};

#define CONFIG_MAX_EOS 8
/* Experts a mixture-of-experts config may have, and experts a token may use. */
#define CONFIG_MAX_EXPERTS 512
#define CONFIG_MAX_EXPERTS_PER_TOK 32
/* Layers whose sliding/global kind a config may set one by one (Gemma 3). */
#define CONFIG_MAX_LAYERS 1024
/* Longrope factors per rotated dim pair. */
#define CONFIG_MAX_ROPE_FACTORS 256

struct model_config {
    enum model_arch arch;
    char arch_name[64];        /* as written in architectures[0] */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;              /* config head_dim, else hidden_size / n_heads */
    int max_position_embeddings;
    int sliding_window;        /* attention looks back at most this many tokens; 0 = unlimited */
    float rms_norm_eps;
    float rope_theta;
    enum rope_scaling_kind rope_scaling;
    float rope_factor;
    float rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    bool tie_word_embeddings;
    bool attention_bias;       /* q/k/v projections have biases (Qwen2; Llama attention_bias) */
    bool qk_norm;              /* per-head RMSNorm on q and k (Qwen3) */
    enum dtype torch_dtype;
    /* MLX-quantized (config.json quantization): the default bits (4 or 8)
     * and group size (32, 64, 128); 0 when the checkpoint is not. */
    int quant_bits, quant_group_size;
    int bos_token_id;          /* -1 when absent */
    int eos_token_ids[CONFIG_MAX_EOS];
    int n_eos;
    /* Mixture of experts (Qwen3-MoE); n_experts 0: every layer is dense. Layer i is sparse
     * when it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0. */
    int n_experts;             /* num_experts */
    int n_experts_per_tok;     /* num_experts_per_tok: top-k */
    int moe_intermediate_size; /* each expert's */
    bool norm_topk_prob;       /* the top-k probabilities are divided by their sum */
    int decoder_sparse_step;
    int shared_expert_intermediate_size; /* 0: no shared expert (Qwen2-MoE style when > 0) */
    unsigned char mlp_only_layers[1024]; /* 1: layer i is dense whatever the step says */

    /* Gemma 3 and Phi-3 (zero elsewhere). */
    int rope_dim;              /* rotated dims per head (partial_rotary_factor); 0 = head_dim */
    bool layer_sliding[CONFIG_MAX_LAYERS]; /* Gemma 3: the layer attends within sliding_window
                                              (a local layer); else it sees the whole context */
    float rope_local_theta;    /* Gemma 3's local layers' RoPE base (rope_local_base_freq),
                                  unscaled; 0 = every layer uses rope_theta and rope_scaling */
    float query_scale;         /* attention's q.k scale; 0 = 1 / sqrt(head_dim) */
    float final_logit_softcap; /* logits = cap * tanh(logits / cap); 0 = off */
    bool gemma_norm;           /* RMSNorm weights are offsets: x / rms(x) * (1 + w) */
    bool embed_scale;          /* embeddings times sqrt(hidden_size), rounded to their dtype */
    bool gelu_tanh;            /* the MLP's activation is gelu (tanh approximation), not silu */
    /* Gemma3ForConditionalGeneration: the text model's tensors are under a
     * prefix ("language_model.model." as released, "model.language_model." as
     * transformers saves it now); the vision tower's are not used. */
    bool multimodal;
    /* longrope: per-dim divisors of the frequencies, the short ones up to
     * rope_original_max_position, the long ones from there; attention_factor
     * multiplies cos and sin. */
    int n_rope_factors;        /* rope_dim / 2 */
    float rope_short_factor[CONFIG_MAX_ROPE_FACTORS], rope_long_factor[CONFIG_MAX_ROPE_FACTORS];
    float rope_attention_factor;
};

/* True when layer i of c runs the experts rather than the dense MLP. */
static inline bool model_config_layer_sparse(const struct model_config *c, int i)
{
    return c->n_experts > 0 && !c->mlp_only_layers[i] &&
           (i + 1) % (c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1) == 0;
}

/* True when layer i attends within c->sliding_window: Gemma 3's local
 * layers, every layer of a model with one window (Mistral, Phi-3). */
static inline bool model_config_layer_windowed(const struct model_config *c, int i)
{
    return c->sliding_window > 0 && (c->arch != ARCH_GEMMA3 || c->layer_sliding[i]);
}

/* Parses config.json text (len bytes, need not be NUL-terminated).
 * Unsupported architectures are refused naming the architecture; sizes are
 * range-checked (absurd values are errors, not allocations). Fuzzed. */
int model_config_parse(const char *json, size_t len, struct model_config *out, struct err *err);

/* Sampling defaults from generation_config.json (fields absent stay as given). */
struct generation_defaults {
    float temperature, top_p;
    int top_k;
    float repetition_penalty;
    bool do_sample;
    int eos_token_ids[CONFIG_MAX_EOS];
    int n_eos;                 /* 0 when the file names none */
    int bos_token_id;
};

void generation_defaults_init(struct generation_defaults *g);
int generation_config_parse(const char *json, size_t len, struct generation_defaults *g,
                            struct err *err);

/* Reads DIR/config.json (required) and DIR/generation_config.json (optional;
 * its eos ids are merged into cfg). */
int model_config_load(const char *dir, struct model_config *cfg, struct generation_defaults *gen,
                      struct err *err);

const char *model_arch_name(enum model_arch arch);

/* Fills inv_freq (model_rope_dim / 2 floats) with the rotary inverse
 * frequencies after rope_scaling, rounded as transformers computes them in
 * float32 (longrope: with the short factors). */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq);
/* Rotated dims per head: rope_dim, or head_dim when that is 0. */
int model_rope_dim(const struct model_config *cfg);
/* longrope's long-context frequencies (model_rope_dim / 2 floats). */
void model_rope_inv_freq_long(const struct model_config *cfg, float *inv_freq);
/* Gemma 3's local layers' frequencies: rope_local_theta, unscaled. */
void model_rope_inv_freq_local(const struct model_config *cfg, float *inv_freq);

#endif
