/* model/config.h — a model's config.json and generation_config.json, parsed and validated. */
#ifndef INFERD_MODEL_CONFIG_H
#define INFERD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "base/dtype.h"
#include "base/err.h"

enum model_arch { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3 };

enum rope_scaling_kind { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3 };

#define CONFIG_MAX_EOS 8

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
};

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

/* Fills inv_freq (head_dim / 2 floats) with the rotary inverse frequencies
 * after rope_scaling, rounded as transformers computes them in float32. */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

#endif
