/* tools/mkmodel.h — deterministic synthetic Hugging Face model directories for tests and benchmarks (not part of libinferd: linked into the inferd binary and the tests). */
#ifndef INFERD_TOOLS_MKMODEL_H
#define INFERD_TOOLS_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"

enum mkmodel_rope {
    MKMODEL_ROPE_NONE,
    MKMODEL_ROPE_LINEAR,
    MKMODEL_ROPE_LLAMA3,
    MKMODEL_ROPE_LONGROPE, /* phi3: factors drawn by formula (mkmodel_longrope_factor) */
};

/* One named model shape. Decimal fields are kept as the exact text written
 * to config.json, so the file never depends on how a platform prints floats. */
struct mkmodel_preset {
    const char *name;
    const char *arch;               /* "llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3" */
    int vocab_size, hidden_size, intermediate_size;
    int n_layers, n_heads, n_kv_heads, head_dim;
    int max_position_embeddings;
    int sliding_window;             /* mistral: 0 writes null (unlimited) */
    bool tie_word_embeddings;
    const char *rope_theta;         /* e.g. "1000000.0" */
    const char *rms_norm_eps;       /* e.g. "1e-06" */
    enum mkmodel_rope rope;
    const char *rope_factor;        /* linear and llama3 */
    const char *rope_low_freq_factor, *rope_high_freq_factor; /* llama3 */
    int rope_original_max_position; /* llama3, longrope */
    enum dtype dtype;               /* every tensor's dtype and torch_dtype */
    int bos_token_id;               /* -1 writes null */
    int eos_token_ids[3];           /* config.json's */
    int n_eos;
    int gen_eos_token_ids[3];       /* generation_config.json's */
    int n_gen_eos;
    const char *temperature;        /* NULL: greedy (do_sample false, no sampling keys) */
    const char *top_p;
    int top_k;                      /* 0: not written */
    int pad_token_id;               /* -1: not written */
    bool real;                      /* the shapes of a released model (multi-GB) */
    /* qwen3_moe: experts (0: none), top-k, each expert's width, norm_topk_prob,
     * the layers kept dense (bit i: layer i in mlp_only_layers), and the
     * experts whose router row is written as zeros (bit e): experts sharing a
     * zero row get the same logit, 0, for every token, so they tie exactly
     * and the top-k choice between them is the tie rule's. */
    int n_experts, n_experts_per_tok, moe_intermediate_size;
    bool norm_topk_prob;
    uint32_t mlp_only_layers;
    uint64_t zero_router_experts;
    /* gemma3: every sliding_window_pattern-th layer is global, the others
     * local with window sliding_window and RoPE base rope_local_base_freq */
    int sliding_window_pattern;
    const char *rope_local_base_freq;
    int query_pre_attn_scalar;
    const char *final_logit_softcapping; /* NULL writes null */
    /* phi3 */
    const char *partial_rotary_factor;   /* NULL: not written (every dim rotates) */
};

/* longrope's factor i of n (short or long) as the text config.json holds:
 * short 1 + (37 i mod 100) / 1000, long 1 + 4 i / n (4 decimals, truncated);
 * a formula, not a released model's factors. */
void mkmodel_longrope_factor(bool long_factor, int i, int n, char *out, size_t cap);

/* Every preset, tiny test ones first; *n gets the count. */
const struct mkmodel_preset *mkmodel_presets(int *n);

/* The preset named name, or NULL. */
const struct mkmodel_preset *mkmodel_preset_find(const char *name);

/* "LlamaForCausalLM" etc. for a known arch, else NULL. */
const char *mkmodel_arch_class(const char *arch);

/* Parameters (elements over all tensors written) and model.safetensors' size in bytes. */
uint64_t mkmodel_param_count(const struct mkmodel_preset *p);
uint64_t mkmodel_file_bytes(const struct mkmodel_preset *p);

struct mkmodel_opts {
    const char *arch;    /* NULL or the preset's arch; alone it picks preset "tiny-<arch>" */
    const char *preset;  /* NULL only when arch or shape is given */
    const struct mkmodel_preset *shape; /* NULL, or a shape outside the table (tests'
                                           own sizes); arch and preset are then ignored */
    uint64_t seed;
    const char *out_dir; /* created if missing; files in it are overwritten */
    const char *tokenizer_dir; /* NULL, or a directory holding tokenizer.json and
                                  tokenizer_config.json (special_tokens_map.json optional) */
};

/* Writes out_dir/config.json, generation_config.json and model.safetensors.
 * With a tokenizer_dir, its tokenizer files are copied into out_dir and the
 * model is fitted to them: vocab_size becomes the tokenizer's size (the
 * highest id in its vocab or added tokens, plus one) when that exceeds the
 * preset's; bos_token_id is the tokenizer's bos_token (null when it has
 * none); eos_token_id, in both configs, is its eos_token followed by the
 * end-of-turn markers its chat template uses (<|im_end|>, <|eot_id|>,
 * <end_of_turn>, Phi-3's and Phi-4's <|end|>). special_tokens_map.json fills in a token that
 * tokenizer_config.json does not name, as the tokenizer loader does.
 * Without a tokenizer_dir the files are exactly the preset's.
 * Weights stream through a fixed-size buffer, so real shapes need little
 * memory. Each file is written under a temporary name and renamed into
 * place, so an interrupted run never leaves a truncated file behind.
 *
 * Weights: element i (row-major) of tensor NAME is drawn from splitmix64
 * whose state starts at s0 = fnv1a64(NAME) ^ mix64(seed) (FNV-1a 64: offset
 * 0xcbf29ce484222325, prime 0x100000001b3; mix64 is splitmix64's output
 * function), so z_i = mix64(s0 + (i + 1) * 0x9e3779b97f4a7c15). Its top 24
 * bits r give u = (r - 2^23) * 2^-23 in [-1, 1), a float; the value is a * u
 * in float arithmetic with a = sqrtf(3) * std (norms: 1 + 0.1 * u), rounded
 * to nearest even into the file's dtype. std: linear weights
 * 1 / sqrt(in_features), embeddings 1 (0.1 when tied to the LM head),
 * untied lm_head 2 / sqrt(hidden), the router (mlp.gate) as a linear weight
 * but with the rows of zero_router_experts 0,
 * biases 0.1. The bytes are the same on every IEEE-754 machine. */
int mkmodel_write(const struct mkmodel_opts *o, struct err *err);

/* FNV-1a 64 of the file dir/name as 16 lowercase hex digits into hex (cap
 * >= 17): the checksum tests/goldens records for each model it was made from. */
int mkmodel_file_fnv1a64(const char *dir, const char *name, char *hex, size_t cap,
                         struct err *err);

#endif
