/* tools/mkmodel.c — writes deterministic Hugging Face model directories (config, generation config, safetensors) from a preset table. */
#define _GNU_SOURCE
#include "tools/mkmodel.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/file.h"

/* ---- presets ------------------------------------------------------------ */

#define TINY_GREEDY .bos_token_id = 1, .eos_token_ids = {2}, .n_eos = 1, \
    .gen_eos_token_ids = {2}, .n_gen_eos = 1, .pad_token_id = -1

#define QWEN3_TOKENS .bos_token_id = 151643, .eos_token_ids = {151645}, .n_eos = 1, \
    .gen_eos_token_ids = {151645, 151643}, .n_gen_eos = 2, .temperature = "0.6", \
    .top_p = "0.95", .top_k = 20, .pad_token_id = 151643

#define LLAMA3_TOKENS .bos_token_id = 128000, .eos_token_ids = {128001, 128008, 128009}, \
    .n_eos = 3, .gen_eos_token_ids = {128001, 128008, 128009}, .n_gen_eos = 3, \
    .temperature = "0.6", .top_p = "0.9", .pad_token_id = -1

#define GEMMA3_TOKENS .bos_token_id = 2, .eos_token_ids = {1, 106}, .n_eos = 2, \
    .gen_eos_token_ids = {1, 106}, .n_gen_eos = 2, .temperature = "1.0", .top_p = "0.95", \
    .top_k = 64, .pad_token_id = 0

/* Tiny presets use odd sizes (SIMD tails), GQA group sizes 1, 2, 3 and 4,
 * head_dim 64 and 128, every rope kind and every file dtype. */
static const struct mkmodel_preset presets[] = {
    { .name = "tiny-llama", .arch = "llama", .vocab_size = 503, .hidden_size = 200,
      .intermediate_size = 328, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
      .max_position_embeddings = 2048, .tie_word_embeddings = false, .rope_theta = "10000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, TINY_GREEDY },
    { .name = "tiny-llama3", .arch = "llama", .vocab_size = 512, .hidden_size = 160,
      .intermediate_size = 256, .n_layers = 2, .n_heads = 2, .n_kv_heads = 2, .head_dim = 128,
      .max_position_embeddings = 4096, .tie_word_embeddings = true, .rope_theta = "500000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_LLAMA3, .rope_factor = "8.0",
      .rope_low_freq_factor = "1.0", .rope_high_freq_factor = "4.0",
      .rope_original_max_position = 64, .dtype = DTYPE_BF16, TINY_GREEDY },
    { .name = "tiny-llama-linear", .arch = "llama", .vocab_size = 389, .hidden_size = 136,
      .intermediate_size = 200, .n_layers = 2, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64,
      .max_position_embeddings = 2048, .tie_word_embeddings = false, .rope_theta = "10000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_LINEAR, .rope_factor = "4.0",
      .dtype = DTYPE_F32, TINY_GREEDY },
    { .name = "tiny-mistral", .arch = "mistral", .vocab_size = 457, .hidden_size = 256,
      .intermediate_size = 344, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .head_dim = 128,
      .max_position_embeddings = 2048, .sliding_window = 24, .tie_word_embeddings = false,
      .rope_theta = "1000000.0", .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_NONE,
      .dtype = DTYPE_F16, TINY_GREEDY },
    { .name = "tiny-qwen2", .arch = "qwen2", .vocab_size = 501, .hidden_size = 192,
      .intermediate_size = 280, .n_layers = 3, .n_heads = 6, .n_kv_heads = 2, .head_dim = 64,
      .max_position_embeddings = 2048, .tie_word_embeddings = true, .rope_theta = "1000000.0",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, TINY_GREEDY },
    { .name = "tiny-qwen3", .arch = "qwen3", .vocab_size = 509, .hidden_size = 200,
      .intermediate_size = 304, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 128,
      .max_position_embeddings = 2048, .tie_word_embeddings = true, .rope_theta = "1000000.0",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, TINY_GREEDY },
    { .name = "tiny-qwen3-gqa1", .arch = "qwen3", .vocab_size = 300, .hidden_size = 96,
      .intermediate_size = 176, .n_layers = 2, .n_heads = 3, .n_kv_heads = 3, .head_dim = 64,
      .max_position_embeddings = 2048, .tie_word_embeddings = false, .rope_theta = "10000.0",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, TINY_GREEDY },
    /* 6 experts, top 2: experts 2 and 3 share a zero router row, so they tie
     * (both logits 0) and about one position in four has the tie at the top-k
     * boundary; layer 1 is dense (mlp_only_layers). */
    { .name = "tiny-qwen3_moe", .arch = "qwen3_moe", .vocab_size = 487, .hidden_size = 160,
      .intermediate_size = 232, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
      .max_position_embeddings = 2048, .tie_word_embeddings = false, .rope_theta = "1000000.0",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, TINY_GREEDY,
      .n_experts = 6, .n_experts_per_tok = 2, .moe_intermediate_size = 88,
      .norm_topk_prob = true, .mlp_only_layers = 1u << 1, .zero_router_experts = 0xcu },
    /* Gemma 3: local layers 0 and 2 (window 16), global 1 and 3 with linear
     * scaling; query_pre_attn_scalar apart from head_dim; soft-capped logits. */
    { .name = "tiny-gemma3", .arch = "gemma3", .vocab_size = 331, .hidden_size = 144,
      .intermediate_size = 232, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
      .max_position_embeddings = 2048, .sliding_window = 16, .tie_word_embeddings = true,
      .rope_theta = "1000000.0", .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_LINEAR,
      .rope_factor = "2.0", .dtype = DTYPE_BF16, .sliding_window_pattern = 2,
      .rope_local_base_freq = "10000.0", .query_pre_attn_scalar = 48,
      .final_logit_softcapping = "5.0", .bos_token_id = 2, .eos_token_ids = {1}, .n_eos = 1,
      .gen_eos_token_ids = {1}, .n_gen_eos = 1, .pad_token_id = 0 },
    /* Phi-3: fused projections, partial rotary (48 of 64 dims) and longrope
     * switching at 32 positions (the goldens' longer cases cross it). */
    { .name = "tiny-phi3", .arch = "phi3", .vocab_size = 347, .hidden_size = 192,
      .intermediate_size = 264, .n_layers = 2, .n_heads = 3, .n_kv_heads = 1, .head_dim = 64,
      .max_position_embeddings = 128, .tie_word_embeddings = false, .rope_theta = "10000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_LONGROPE, .rope_original_max_position = 32,
      .partial_rotary_factor = "0.75", .dtype = DTYPE_BF16, TINY_GREEDY },
    /* Released models' shapes, for benchmarks (random weights). */
    { .name = "qwen3-0.6b", .arch = "qwen3", .vocab_size = 151936, .hidden_size = 1024,
      .intermediate_size = 3072, .n_layers = 28, .n_heads = 16, .n_kv_heads = 8, .head_dim = 128,
      .max_position_embeddings = 40960, .tie_word_embeddings = true, .rope_theta = "1000000",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, QWEN3_TOKENS,
      .real = true },
    { .name = "llama-3.2-1b", .arch = "llama", .vocab_size = 128256, .hidden_size = 2048,
      .intermediate_size = 8192, .n_layers = 16, .n_heads = 32, .n_kv_heads = 8, .head_dim = 64,
      .max_position_embeddings = 131072, .tie_word_embeddings = true, .rope_theta = "500000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_LLAMA3, .rope_factor = "32.0",
      .rope_low_freq_factor = "1.0", .rope_high_freq_factor = "4.0",
      .rope_original_max_position = 8192, .dtype = DTYPE_BF16, LLAMA3_TOKENS, .real = true },
    { .name = "llama-3.1-8b", .arch = "llama", .vocab_size = 128256, .hidden_size = 4096,
      .intermediate_size = 14336, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
      .max_position_embeddings = 131072, .tie_word_embeddings = false, .rope_theta = "500000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_LLAMA3, .rope_factor = "8.0",
      .rope_low_freq_factor = "1.0", .rope_high_freq_factor = "4.0",
      .rope_original_max_position = 8192, .dtype = DTYPE_BF16, LLAMA3_TOKENS, .real = true },
    { .name = "qwen3-8b", .arch = "qwen3", .vocab_size = 151936, .hidden_size = 4096,
      .intermediate_size = 12288, .n_layers = 36, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
      .max_position_embeddings = 40960, .tie_word_embeddings = false, .rope_theta = "1000000",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, QWEN3_TOKENS,
      .real = true },
    { .name = "qwen3-30b-a3b", .arch = "qwen3_moe", .vocab_size = 151936, .hidden_size = 2048,
      .intermediate_size = 6144, .n_layers = 48, .n_heads = 32, .n_kv_heads = 4, .head_dim = 128,
      .max_position_embeddings = 40960, .tie_word_embeddings = false, .rope_theta = "1000000.0",
      .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = DTYPE_BF16, QWEN3_TOKENS,
      .real = true, .n_experts = 128, .n_experts_per_tok = 8, .moe_intermediate_size = 768,
      .norm_topk_prob = true },
    { .name = "gemma-3-1b", .arch = "gemma3", .vocab_size = 262144, .hidden_size = 1152,
      .intermediate_size = 6912, .n_layers = 26, .n_heads = 4, .n_kv_heads = 1, .head_dim = 256,
      .max_position_embeddings = 32768, .sliding_window = 512, .tie_word_embeddings = true,
      .rope_theta = "1000000", .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE,
      .dtype = DTYPE_BF16, .sliding_window_pattern = 6, .rope_local_base_freq = "10000",
      .query_pre_attn_scalar = 256, GEMMA3_TOKENS, .real = true },
    /* the text model of Gemma 3 4B (Gemma3ForConditionalGeneration's text_config) */
    { .name = "gemma-3-4b", .arch = "gemma3", .vocab_size = 262208, .hidden_size = 2560,
      .intermediate_size = 10240, .n_layers = 34, .n_heads = 8, .n_kv_heads = 4, .head_dim = 256,
      .max_position_embeddings = 131072, .sliding_window = 1024, .tie_word_embeddings = true,
      .rope_theta = "1000000", .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_LINEAR,
      .rope_factor = "8.0", .dtype = DTYPE_BF16, .sliding_window_pattern = 6,
      .rope_local_base_freq = "10000", .query_pre_attn_scalar = 256, GEMMA3_TOKENS,
      .real = true },
    { .name = "phi-4-mini", .arch = "phi3", .vocab_size = 200064, .hidden_size = 3072,
      .intermediate_size = 8192, .n_layers = 32, .n_heads = 24, .n_kv_heads = 8, .head_dim = 128,
      .max_position_embeddings = 131072, .tie_word_embeddings = true, .rope_theta = "10000.0",
      .rms_norm_eps = "1e-05", .rope = MKMODEL_ROPE_LONGROPE, .rope_original_max_position = 4096,
      .partial_rotary_factor = "0.75", .dtype = DTYPE_BF16, .bos_token_id = 199999,
      .eos_token_ids = {199999, 200020}, .n_eos = 2, .gen_eos_token_ids = {199999, 200020},
      .n_gen_eos = 2, .pad_token_id = 199999, .real = true },
};

#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const struct mkmodel_preset *mkmodel_presets(int *n)
{
    *n = N_PRESETS;
    return presets;
}

const struct mkmodel_preset *mkmodel_preset_find(const char *name)
{
    for (int i = 0; name && i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

const char *mkmodel_arch_class(const char *arch)
{
    static const char *const map[][2] = {
        {"llama", "LlamaForCausalLM"},
        {"mistral", "MistralForCausalLM"},
        {"qwen2", "Qwen2ForCausalLM"},
        {"qwen3", "Qwen3ForCausalLM"},
        {"qwen3_moe", "Qwen3MoeForCausalLM"},
        {"gemma3", "Gemma3ForCausalLM"},
        {"phi3", "Phi3ForCausalLM"},
    };
    for (size_t i = 0; arch && i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i][0], arch) == 0)
            return map[i][1];
    return NULL;
}

/* ---- the tensor list ---------------------------------------------------- */

/* How a tensor's values are drawn (see mkmodel.h). */
enum init_kind {
    INIT_EMBED, INIT_LINEAR, INIT_LM_HEAD, INIT_NORM, INIT_BIAS, INIT_ROUTER, INIT_NORM_OFFSET
};

struct tensor_spec {
    char name[80];
    int n_dims;
    int64_t shape[2];
    enum init_kind init;
    uint64_t offset; /* within the data section */
};

struct tensor_list {
    struct tensor_spec *t; /* owned; n */
    int n, cap;
};

static int list_add(struct tensor_list *l, enum init_kind init, int64_t rows, int64_t cols,
                    const char *fmt, int layer)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        struct tensor_spec *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        l->t = t;
        l->cap = cap;
    }
    struct tensor_spec *s = &l->t[l->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, fmt, layer);
    s->init = init;
    s->n_dims = cols ? 2 : 1;
    s->shape[0] = rows;
    s->shape[1] = cols;
    return 0;
}

static int64_t spec_numel(const struct tensor_spec *s)
{
    return s->n_dims == 2 ? s->shape[0] * s->shape[1] : s->shape[0];
}

static int spec_cmp(const void *a, const void *b)
{
    return strcmp(((const struct tensor_spec *)a)->name, ((const struct tensor_spec *)b)->name);
}

static int finish_tensor_list(const struct mkmodel_preset *p, struct tensor_list *l, int rc);

/* Gemma 3: sandwich norms and q/k norms, all offsets from 1 (Gemma's
 * RMSNorm scales by 1 + w), and the embedding tied to the head. */
static int gemma3_tensors(const struct mkmodel_preset *p, struct tensor_list *l)
{
    int64_t h = p->hidden_size, inter = p->intermediate_size, hd = p->head_dim;
    int64_t q_out = (int64_t)p->n_heads * hd, kv_out = (int64_t)p->n_kv_heads * hd;
    int rc = 0;
    rc |= list_add(l, INIT_EMBED, p->vocab_size, h, "model.embed_tokens.weight", 0);
    rc |= list_add(l, INIT_NORM_OFFSET, h, 0, "model.norm.weight", 0);
    for (int i = 0; i < p->n_layers && rc == 0; i++) {
        rc |= list_add(l, INIT_NORM_OFFSET, h, 0, "model.layers.%d.input_layernorm.weight", i);
        rc |= list_add(l, INIT_NORM_OFFSET, h, 0,
                       "model.layers.%d.post_attention_layernorm.weight", i);
        rc |= list_add(l, INIT_NORM_OFFSET, h, 0,
                       "model.layers.%d.pre_feedforward_layernorm.weight", i);
        rc |= list_add(l, INIT_NORM_OFFSET, h, 0,
                       "model.layers.%d.post_feedforward_layernorm.weight", i);
        rc |= list_add(l, INIT_LINEAR, q_out, h, "model.layers.%d.self_attn.q_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, kv_out, h, "model.layers.%d.self_attn.k_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, kv_out, h, "model.layers.%d.self_attn.v_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, h, q_out, "model.layers.%d.self_attn.o_proj.weight", i);
        rc |= list_add(l, INIT_NORM_OFFSET, hd, 0, "model.layers.%d.self_attn.q_norm.weight", i);
        rc |= list_add(l, INIT_NORM_OFFSET, hd, 0, "model.layers.%d.self_attn.k_norm.weight", i);
        rc |= list_add(l, INIT_LINEAR, inter, h, "model.layers.%d.mlp.gate_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, inter, h, "model.layers.%d.mlp.up_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, h, inter, "model.layers.%d.mlp.down_proj.weight", i);
    }
    return rc;
}

/* Phi-3: q, k, v as one qkv_proj and gate, up as one gate_up_proj. */
static int phi3_tensors(const struct mkmodel_preset *p, struct tensor_list *l)
{
    int64_t h = p->hidden_size, inter = p->intermediate_size, hd = p->head_dim;
    int64_t q_out = (int64_t)p->n_heads * hd, kv_out = (int64_t)p->n_kv_heads * hd;
    int rc = 0;
    rc |= list_add(l, INIT_EMBED, p->vocab_size, h, "model.embed_tokens.weight", 0);
    rc |= list_add(l, INIT_NORM, h, 0, "model.norm.weight", 0);
    if (!p->tie_word_embeddings)
        rc |= list_add(l, INIT_LM_HEAD, p->vocab_size, h, "lm_head.weight", 0);
    for (int i = 0; i < p->n_layers && rc == 0; i++) {
        rc |= list_add(l, INIT_NORM, h, 0, "model.layers.%d.input_layernorm.weight", i);
        rc |= list_add(l, INIT_NORM, h, 0, "model.layers.%d.post_attention_layernorm.weight", i);
        rc |= list_add(l, INIT_LINEAR, q_out + 2 * kv_out, h,
                       "model.layers.%d.self_attn.qkv_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, h, q_out, "model.layers.%d.self_attn.o_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, 2 * inter, h, "model.layers.%d.mlp.gate_up_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, h, inter, "model.layers.%d.mlp.down_proj.weight", i);
    }
    return rc;
}

/* Every tensor the preset's architecture has, sorted by name, with offsets. */
static int build_tensor_list(const struct mkmodel_preset *p, struct tensor_list *l)
{
    int64_t h = p->hidden_size, inter = p->intermediate_size, hd = p->head_dim;
    int64_t q_out = (int64_t)p->n_heads * hd, kv_out = (int64_t)p->n_kv_heads * hd;
    bool qkv_bias = strcmp(p->arch, "qwen2") == 0;
    bool qk_norm = strncmp(p->arch, "qwen3", 5) == 0;
    int rc = 0;

    memset(l, 0, sizeof *l);
    if (!strcmp(p->arch, "gemma3"))
        rc = gemma3_tensors(p, l);
    else if (!strcmp(p->arch, "phi3"))
        rc = phi3_tensors(p, l);
    if (!strcmp(p->arch, "gemma3") || !strcmp(p->arch, "phi3"))
        return finish_tensor_list(p, l, rc);
    rc |= list_add(l, INIT_EMBED, p->vocab_size, h, "model.embed_tokens.weight", 0);
    rc |= list_add(l, INIT_NORM, h, 0, "model.norm.weight", 0);
    if (!p->tie_word_embeddings)
        rc |= list_add(l, INIT_LM_HEAD, p->vocab_size, h, "lm_head.weight", 0);
    for (int i = 0; i < p->n_layers && rc == 0; i++) {
        rc |= list_add(l, INIT_NORM, h, 0, "model.layers.%d.input_layernorm.weight", i);
        rc |= list_add(l, INIT_LINEAR, q_out, h, "model.layers.%d.self_attn.q_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, kv_out, h, "model.layers.%d.self_attn.k_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, kv_out, h, "model.layers.%d.self_attn.v_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, h, q_out, "model.layers.%d.self_attn.o_proj.weight", i);
        if (qkv_bias) {
            rc |= list_add(l, INIT_BIAS, q_out, 0, "model.layers.%d.self_attn.q_proj.bias", i);
            rc |= list_add(l, INIT_BIAS, kv_out, 0, "model.layers.%d.self_attn.k_proj.bias", i);
            rc |= list_add(l, INIT_BIAS, kv_out, 0, "model.layers.%d.self_attn.v_proj.bias", i);
        }
        if (qk_norm) {
            rc |= list_add(l, INIT_NORM, hd, 0, "model.layers.%d.self_attn.q_norm.weight", i);
            rc |= list_add(l, INIT_NORM, hd, 0, "model.layers.%d.self_attn.k_norm.weight", i);
        }
        rc |= list_add(l, INIT_NORM, h, 0, "model.layers.%d.post_attention_layernorm.weight", i);
        if (p->n_experts && !(p->mlp_only_layers >> i & 1u)) {
            int64_t mi = p->moe_intermediate_size;
            rc |= list_add(l, INIT_ROUTER, p->n_experts, h, "model.layers.%d.mlp.gate.weight", i);
            for (int e = 0; e < p->n_experts && rc == 0; e++) {
                char fmt[3][80];
                static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
                for (int j = 0; j < 3; j++)
                    snprintf(fmt[j], sizeof fmt[j], "model.layers.%%d.mlp.experts.%d.%s.weight", e,
                             proj[j]);
                rc |= list_add(l, INIT_LINEAR, mi, h, fmt[0], i);
                rc |= list_add(l, INIT_LINEAR, mi, h, fmt[1], i);
                rc |= list_add(l, INIT_LINEAR, h, mi, fmt[2], i);
            }
            continue;
        }
        rc |= list_add(l, INIT_LINEAR, inter, h, "model.layers.%d.mlp.gate_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, inter, h, "model.layers.%d.mlp.up_proj.weight", i);
        rc |= list_add(l, INIT_LINEAR, h, inter, "model.layers.%d.mlp.down_proj.weight", i);
    }
    return finish_tensor_list(p, l, rc);
}

/* Sorts the list by name and lays the tensors out back to back; rc from
 * building it, the list freed when that failed. */
static int finish_tensor_list(const struct mkmodel_preset *p, struct tensor_list *l, int rc)
{
    if (rc) {
        free(l->t);
        memset(l, 0, sizeof *l);
        return -1;
    }
    qsort(l->t, (size_t)l->n, sizeof l->t[0], spec_cmp);
    uint64_t off = 0;
    for (int i = 0; i < l->n; i++) {
        l->t[i].offset = off;
        off += (uint64_t)spec_numel(&l->t[i]) * dtype_size(p->dtype);
    }
    return 0;
}

uint64_t mkmodel_param_count(const struct mkmodel_preset *p)
{
    struct tensor_list l;
    if (build_tensor_list(p, &l))
        return 0;
    uint64_t n = 0;
    for (int i = 0; i < l.n; i++)
        n += (uint64_t)spec_numel(&l.t[i]);
    free(l.t);
    return n;
}

/* ---- deterministic values ----------------------------------------------- */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull
#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

static uint64_t fnv1a64_update(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t fnv1a64(const char *s) { return fnv1a64_update(FNV_OFFSET, s, strlen(s)); }

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Round to nearest even; overflow goes to infinity, tiny values to
 * subnormals or signed zero, NaN stays NaN. */
static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds past the largest f16, 65504 */
        return (uint16_t)(sign | 0x7c00u);
    uint32_t exp = a >> 23;
    if (exp < 113) { /* below 2^-14: f16 subnormal, units of 2^-24 */
        if (exp < 102)
            return sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((exp - 112) << 10) | ((a >> 13) & 0x3ffu);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry out of the mantissa correctly bumps the exponent */
    return (uint16_t)(sign | h);
}

/* Half-width a of the uniform range for a tensor (std * sqrt(3)); norms use
 * 0.1 around 1. A tied embedding is also the LM head: at std 1 the input
 * token's own row would win every position by a wide margin (its score grows
 * with hidden, the others' with sqrt(hidden)), so tied models use std 0.1 and
 * their logits depend on what the layers compute. */
static float init_half_width(const struct tensor_spec *s, const struct mkmodel_preset *p)
{
    float sqrt3 = sqrtf(3.0f);
    int hidden = p->hidden_size;
    switch (s->init) {
    case INIT_EMBED: return p->tie_word_embeddings ? sqrt3 * 0.1f : sqrt3;
    case INIT_LINEAR:
    case INIT_ROUTER: return sqrt3 * (1.0f / sqrtf((float)s->shape[1]));
    case INIT_LM_HEAD: return sqrt3 * (2.0f / sqrtf((float)hidden));
    case INIT_BIAS: return sqrt3 * 0.1f;
    case INIT_NORM: return 0.1f;
    case INIT_NORM_OFFSET: return 0.1f;
    }
    return 0.0f;
}

/* Element i's uniform draw in [-1, 1): the top 24 bits of splitmix64 output i + 1. */
static inline float draw(uint64_t s0, uint64_t i)
{
    uint32_t r = (uint32_t)(mix64(s0 + (i + 1) * SPLITMIX_GAMMA) >> 40);
    return (float)((int32_t)r - (1 << 23)) * 0x1p-23f;
}

/* Fills out with elements [first, first + n) of the tensor, in dtype. Each
 * value is one product a * u (norms: then one sum): the volatile keeps the
 * compiler from fusing 1 + a * u into an FMA, which would round once instead
 * of twice and make the bytes depend on the build. */
static void fill_chunk(uint64_t s0, uint64_t first, size_t n, float a, bool norm,
                       enum dtype dt, void *out)
{
    float *o32 = out;
    uint16_t *o16 = out;
    if (norm) {
        for (size_t i = 0; i < n; i++) {
            volatile float t = a * draw(s0, first + i);
            float v = 1.0f + t;
            if (dt == DTYPE_F32)
                o32[i] = v;
            else
                o16[i] = dt == DTYPE_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        }
    } else if (dt == DTYPE_F32) {
        for (size_t i = 0; i < n; i++)
            o32[i] = a * draw(s0, first + i);
    } else if (dt == DTYPE_BF16) {
        for (size_t i = 0; i < n; i++)
            o16[i] = f32_to_bf16(a * draw(s0, first + i));
    } else {
        for (size_t i = 0; i < n; i++)
            o16[i] = f32_to_f16(a * draw(s0, first + i));
    }
}

/* The router rows of the preset's zero_router_experts, within a chunk of
 * elements [first, first + n), set to +0. */
static void zero_router_rows(const struct mkmodel_preset *p, const struct tensor_spec *s,
                             uint64_t first, size_t n, void *out)
{
    size_t esz = dtype_size(p->dtype);
    for (size_t i = 0; i < n; i++) {
        uint64_t row = (first + i) / (uint64_t)s->shape[1];
        if (row < 64 && (p->zero_router_experts >> row & 1u))
            memset((uint8_t *)out + i * esz, 0, esz);
    }
}

/* ---- text building ------------------------------------------------------ */

struct sbuf {
    char *s; /* owned */
    size_t len, cap;
    bool oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap : 256);
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* A JSON object built as (key, value text) pairs and printed with keys
 * sorted, as transformers' save_pretrained does. */
struct kv_entry {
    const char *key;
    char value[2048]; /* Gemma 3's layer_types and longrope's factor lists are long */
};

struct json_obj {
    struct kv_entry e[40];
    int n;
};

static void obj_set(struct json_obj *o, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void obj_set(struct json_obj *o, const char *key, const char *fmt, ...)
{
    struct kv_entry *e = &o->e[o->n++];
    e->key = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->value, sizeof e->value, fmt, ap);
    va_end(ap);
}

static int kv_cmp(const void *a, const void *b)
{
    return strcmp(((const struct kv_entry *)a)->key, ((const struct kv_entry *)b)->key);
}

static void obj_print(struct json_obj *o, struct sbuf *b)
{
    qsort(o->e, (size_t)o->n, sizeof o->e[0], kv_cmp);
    sb_printf(b, "{\n");
    for (int i = 0; i < o->n; i++)
        sb_printf(b, "  \"%s\": %s%s\n", o->e[i].key, o->e[i].value, i + 1 < o->n ? "," : "");
    sb_printf(b, "}\n");
}

/* An int, or a JSON list when there are several. */
static void ids_text(const int *ids, int n, char *out, size_t cap)
{
    if (n == 1) {
        snprintf(out, cap, "%d", ids[0]);
        return;
    }
    size_t len = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%d", i ? ", " : "", ids[i]);
    if (len < cap)
        snprintf(out + len, cap - len, "]");
}

static const char *torch_dtype_name(enum dtype t)
{
    return t == DTYPE_F32 ? "float32" : t == DTYPE_BF16 ? "bfloat16" : "float16";
}

void mkmodel_longrope_factor(bool long_factor, int i, int n, char *out, size_t cap)
{
    int v = long_factor ? 10000 + (int)((int64_t)i * 40000 / n) : 10000 + (37 * i % 100) * 10;
    snprintf(out, cap, "%d.%04d", v / 10000, v % 10000);
}

/* A JSON list of longrope factors for rot / 2 rotated pairs. */
static void longrope_list(bool long_factor, int n, char *out, size_t cap)
{
    size_t len = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < n && len < cap; i++) {
        char f[32];
        mkmodel_longrope_factor(long_factor, i, n, f, sizeof f);
        len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? ", " : "", f);
    }
    if (len < cap)
        snprintf(out + len, cap - len, "]");
}

/* Rotated dims per head: head_dim times partial_rotary_factor, as transformers truncates it. */
static int preset_rope_dim(const struct mkmodel_preset *p)
{
    return p->partial_rotary_factor ? (int)(p->head_dim * strtod(p->partial_rotary_factor, NULL))
                                    : p->head_dim;
}

/* What Gemma 3 and Phi-3 configs add or write their own way. */
static void config_json_gemma3_phi3(const struct mkmodel_preset *p, struct json_obj *o)
{
    if (!strcmp(p->arch, "gemma3")) {
        /* Gemma3TextConfig names the activation hidden_activation */
        obj_set(o, "hidden_activation", "\"gelu_pytorch_tanh\"");
        obj_set(o, "query_pre_attn_scalar", "%d", p->query_pre_attn_scalar);
        obj_set(o, "rope_local_base_freq", "%s", p->rope_local_base_freq);
        obj_set(o, "sliding_window", "%d", p->sliding_window);
        obj_set(o, "sliding_window_pattern", "%d", p->sliding_window_pattern);
        char types[2048];
        size_t len = (size_t)snprintf(types, sizeof types, "[");
        for (int i = 0; i < p->n_layers && len < sizeof types; i++)
            len += (size_t)snprintf(types + len, sizeof types - len, "%s\"%s\"", i ? ", " : "",
                                    (i + 1) % p->sliding_window_pattern ? "sliding_attention"
                                                                         : "full_attention");
        if (len < sizeof types)
            snprintf(types + len, sizeof types - len, "]");
        obj_set(o, "layer_types", "%s", types);
        obj_set(o, "attn_logit_softcapping", "null");
        obj_set(o, "final_logit_softcapping", "%s",
                p->final_logit_softcapping ? p->final_logit_softcapping : "null");
        obj_set(o, "attention_bias", "false");
        obj_set(o, "pad_token_id", "%d", p->pad_token_id >= 0 ? p->pad_token_id : 0);
        return;
    }
    obj_set(o, "hidden_act", "\"silu\"");
    obj_set(o, "attention_bias", "false");
    obj_set(o, "sliding_window", "null");
    obj_set(o, "resid_pdrop", "0.0");
    obj_set(o, "embd_pdrop", "0.0");
    /* Phi3Config defaults pad_token_id to 32000, past a small vocabulary */
    obj_set(o, "pad_token_id", "%d", p->pad_token_id >= 0 ? p->pad_token_id : p->eos_token_ids[0]);
    if (p->partial_rotary_factor)
        obj_set(o, "partial_rotary_factor", "%s", p->partial_rotary_factor);
    if (p->rope == MKMODEL_ROPE_LONGROPE) {
        char shorts[900], longs[900];
        int n = preset_rope_dim(p) / 2;
        longrope_list(false, n, shorts, sizeof shorts);
        longrope_list(true, n, longs, sizeof longs);
        obj_set(o, "rope_scaling",
                "{\"long_factor\": %s, \"short_factor\": %s, \"type\": \"longrope\"}", longs,
                shorts);
        obj_set(o, "original_max_position_embeddings", "%d", p->rope_original_max_position);
    }
}

static void config_json(const struct mkmodel_preset *p, struct sbuf *b)
{
    struct json_obj o = {.n = 0};
    char ids[64];
    bool llama = strcmp(p->arch, "llama") == 0;
    bool qwen = strncmp(p->arch, "qwen", 4) == 0;
    bool gemma3_phi3 = !strcmp(p->arch, "gemma3") || !strcmp(p->arch, "phi3");

    obj_set(&o, "architectures", "[\"%s\"]", mkmodel_arch_class(p->arch));
    obj_set(&o, "model_type", "\"%s\"", !strcmp(p->arch, "gemma3") ? "gemma3_text" : p->arch);
    obj_set(&o, "vocab_size", "%d", p->vocab_size);
    obj_set(&o, "hidden_size", "%d", p->hidden_size);
    obj_set(&o, "intermediate_size", "%d", p->intermediate_size);
    obj_set(&o, "num_hidden_layers", "%d", p->n_layers);
    obj_set(&o, "num_attention_heads", "%d", p->n_heads);
    obj_set(&o, "num_key_value_heads", "%d", p->n_kv_heads);
    obj_set(&o, "head_dim", "%d", p->head_dim);
    obj_set(&o, "max_position_embeddings", "%d", p->max_position_embeddings);
    obj_set(&o, "rms_norm_eps", "%s", p->rms_norm_eps);
    obj_set(&o, "rope_theta", "%s", p->rope_theta);
    if (p->rope == MKMODEL_ROPE_LINEAR)
        obj_set(&o, "rope_scaling", "{\"factor\": %s, \"rope_type\": \"linear\"}", p->rope_factor);
    else if (p->rope == MKMODEL_ROPE_LLAMA3)
        obj_set(&o, "rope_scaling",
                "{\"factor\": %s, \"high_freq_factor\": %s, \"low_freq_factor\": %s, "
                "\"original_max_position_embeddings\": %d, \"rope_type\": \"llama3\"}",
                p->rope_factor, p->rope_high_freq_factor, p->rope_low_freq_factor,
                p->rope_original_max_position);
    else if (p->rope != MKMODEL_ROPE_LONGROPE)
        obj_set(&o, "rope_scaling", "null");
    obj_set(&o, "tie_word_embeddings", "%s", p->tie_word_embeddings ? "true" : "false");
    obj_set(&o, "torch_dtype", "\"%s\"", torch_dtype_name(p->dtype));
    if (p->bos_token_id >= 0)
        obj_set(&o, "bos_token_id", "%d", p->bos_token_id);
    else
        obj_set(&o, "bos_token_id", "null");
    ids_text(p->eos_token_ids, p->n_eos, ids, sizeof ids);
    obj_set(&o, "eos_token_id", "%s", ids);
    obj_set(&o, "initializer_range", "0.02");
    obj_set(&o, "attention_dropout", "0.0");
    obj_set(&o, "use_cache", "true");
    if (gemma3_phi3) {
        config_json_gemma3_phi3(p, &o);
        obj_print(&o, b);
        return;
    }
    obj_set(&o, "hidden_act", "\"silu\"");
    /* Qwen2 always has q/k/v biases and its configs carry no attention_bias. */
    if (llama || strncmp(p->arch, "qwen3", 5) == 0)
        obj_set(&o, "attention_bias", "false");
    if (p->n_experts) {
        obj_set(&o, "num_experts", "%d", p->n_experts);
        obj_set(&o, "num_experts_per_tok", "%d", p->n_experts_per_tok);
        obj_set(&o, "moe_intermediate_size", "%d", p->moe_intermediate_size);
        obj_set(&o, "norm_topk_prob", "%s", p->norm_topk_prob ? "true" : "false");
        obj_set(&o, "decoder_sparse_step", "1");
        char layers[256];
        size_t len = (size_t)snprintf(layers, sizeof layers, "[");
        for (int i = 0, k = 0; i < p->n_layers && i < 32; i++)
            if (p->mlp_only_layers >> i & 1u)
                len += (size_t)snprintf(layers + len, sizeof layers - len, "%s%d", k++ ? ", " : "",
                                        i);
        snprintf(layers + len, sizeof layers - len, "]");
        obj_set(&o, "mlp_only_layers", "%s", layers);
        obj_set(&o, "output_router_logits", "false");
        obj_set(&o, "router_aux_loss_coef", "0.001");
    }
    if (llama)
        obj_set(&o, "mlp_bias", "false");
    if (strcmp(p->arch, "mistral") == 0) {
        if (p->sliding_window > 0)
            obj_set(&o, "sliding_window", "%d", p->sliding_window);
        else
            obj_set(&o, "sliding_window", "null");
    }
    if (qwen) {
        obj_set(&o, "use_sliding_window", "false");
        obj_set(&o, "sliding_window", "null");
        obj_set(&o, "max_window_layers", "%d", p->n_layers);
    }
    obj_print(&o, b);
}

static void generation_config_json(const struct mkmodel_preset *p, struct sbuf *b)
{
    struct json_obj o = {.n = 0};
    char ids[64];
    if (p->bos_token_id >= 0)
        obj_set(&o, "bos_token_id", "%d", p->bos_token_id);
    ids_text(p->gen_eos_token_ids, p->n_gen_eos, ids, sizeof ids);
    obj_set(&o, "eos_token_id", "%s", ids);
    obj_set(&o, "do_sample", "%s", p->temperature ? "true" : "false");
    if (p->temperature) {
        obj_set(&o, "temperature", "%s", p->temperature);
        if (p->top_p)
            obj_set(&o, "top_p", "%s", p->top_p);
        if (p->top_k > 0)
            obj_set(&o, "top_k", "%d", p->top_k);
    }
    if (p->pad_token_id >= 0)
        obj_set(&o, "pad_token_id", "%d", p->pad_token_id);
    obj_print(&o, b);
}

/* The safetensors JSON header, padded with spaces to a multiple of 8 bytes. */
static void safetensors_header(const struct mkmodel_preset *p, const struct tensor_list *l,
                               struct sbuf *b)
{
    size_t esz = dtype_size(p->dtype);
    sb_printf(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < l->n; i++) {
        const struct tensor_spec *s = &l->t[i];
        sb_printf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", s->name, dtype_name(p->dtype),
                  (long long)s->shape[0]);
        if (s->n_dims == 2)
            sb_printf(b, ",%lld", (long long)s->shape[1]);
        sb_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)s->offset,
                  (unsigned long long)(s->offset + (uint64_t)spec_numel(s) * esz));
    }
    sb_printf(b, "}");
    while (!b->oom && b->len % 8)
        sb_printf(b, " ");
}

uint64_t mkmodel_file_bytes(const struct mkmodel_preset *p)
{
    struct tensor_list l;
    if (build_tensor_list(p, &l))
        return 0;
    struct sbuf hdr = {0};
    safetensors_header(p, &l, &hdr);
    uint64_t n = 8 + hdr.len;
    for (int i = 0; i < l.n; i++)
        n += (uint64_t)spec_numel(&l.t[i]) * dtype_size(p->dtype);
    free(hdr.s);
    free(l.t);
    return n;
}

/* ---- files -------------------------------------------------------------- */

static int mkdir_p(const char *dir, struct err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return err_set(err, INFERD_EINVAL, "output path too long: %s", dir);
    for (char *c = path + 1;; c++) {
        if (*c != '/' && *c != '\0')
            continue;
        char saved = *c;
        *c = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return err_set(err, INFERD_EIO, "creating %s: %s", path, strerror(errno));
        *c = saved;
        if (saved == '\0')
            break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, INFERD_EIO, "%s exists and is not a directory", dir);
    return 0;
}

/* An output file written under NAME.tmp and renamed on success. */
struct out_file {
    FILE *f;
    char tmp[4200], final[4200];
};

static int out_open(struct out_file *of, const char *dir, const char *name, struct err *err)
{
    snprintf(of->final, sizeof of->final, "%s/%s", dir, name);
    snprintf(of->tmp, sizeof of->tmp, "%s/%s.tmp", dir, name);
    of->f = fopen(of->tmp, "wb");
    if (!of->f)
        return err_set(err, INFERD_EIO, "creating %s: %s", of->tmp, strerror(errno));
    return 0;
}

static int out_write(struct out_file *of, const void *data, size_t n, struct err *err)
{
    if (fwrite(data, 1, n, of->f) != n)
        return err_set(err, INFERD_EIO, "writing %s: %s", of->tmp, strerror(errno));
    return 0;
}

/* Closes and renames into place when rc == 0; otherwise removes the temporary. */
static int out_finish(struct out_file *of, int rc, struct err *err)
{
    if (!of->f)
        return rc;
    if (fclose(of->f) != 0 && rc == 0)
        rc = err_set(err, INFERD_EIO, "writing %s: %s", of->tmp, strerror(errno));
    of->f = NULL;
    if (rc == 0 && rename(of->tmp, of->final) != 0)
        rc = err_set(err, INFERD_EIO, "renaming %s: %s", of->tmp, strerror(errno));
    if (rc != 0)
        unlink(of->tmp);
    return rc;
}

static int write_bytes(const char *dir, const char *name, const void *data, size_t len,
                       struct err *err)
{
    struct out_file of = {0};
    int rc = out_open(&of, dir, name, err);
    if (rc == 0)
        rc = out_write(&of, data, len, err);
    return out_finish(&of, rc, err);
}

static int write_text(const char *dir, const char *name, const struct sbuf *b, struct err *err)
{
    if (b->oom)
        return err_set(err, INFERD_ENOMEM, "building %s", name);
    return write_bytes(dir, name, b->s, b->len, err);
}

#define CHUNK_ELEMS (1u << 20)

static int write_safetensors(const struct mkmodel_preset *p, uint64_t seed, const char *dir,
                             struct err *err)
{
    struct tensor_list l;
    if (build_tensor_list(p, &l))
        return err_set(err, INFERD_ENOMEM, "building the tensor list");
    struct sbuf hdr = {0};
    safetensors_header(p, &l, &hdr);
    void *buf = malloc((size_t)CHUNK_ELEMS * 4); /* owned; one chunk in the file's dtype */
    struct out_file of = {0};
    int rc = 0;
    if (hdr.oom || !buf)
        rc = err_set(err, INFERD_ENOMEM, "allocating the write buffer");
    if (rc == 0)
        rc = out_open(&of, dir, "model.safetensors", err);
    if (rc == 0) {
        uint8_t prefix[8];
        for (int i = 0; i < 8; i++)
            prefix[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
        rc = out_write(&of, prefix, 8, err);
    }
    if (rc == 0)
        rc = out_write(&of, hdr.s, hdr.len, err);
    uint64_t seed_mix = mix64(seed);
    for (int t = 0; t < l.n && rc == 0; t++) {
        const struct tensor_spec *s = &l.t[t];
        uint64_t s0 = fnv1a64(s->name) ^ seed_mix;
        float a = init_half_width(s, p);
        uint64_t numel = (uint64_t)spec_numel(s);
        for (uint64_t first = 0; first < numel && rc == 0; first += CHUNK_ELEMS) {
            size_t n = numel - first < CHUNK_ELEMS ? (size_t)(numel - first) : CHUNK_ELEMS;
            fill_chunk(s0, first, n, a, s->init == INIT_NORM, p->dtype, buf);
            if (s->init == INIT_ROUTER)
                zero_router_rows(p, s, first, n, buf);
            rc = out_write(&of, buf, n * dtype_size(p->dtype), err);
        }
    }
    rc = out_finish(&of, rc, err);
    free(buf);
    free(hdr.s);
    free(l.t);
    return rc;
}

/* ---- a real tokenizer --------------------------------------------------- */

/* The files --tokenizer copies, read whole before anything is written. */
struct tok_files {
    char *json, *config, *special; /* owned; special is NULL when the file is absent */
    size_t json_len, config_len, special_len;
};

static void tok_files_free(struct tok_files *f)
{
    free(f->json);
    free(f->config);
    free(f->special);
    memset(f, 0, sizeof *f);
}

static int tok_files_read(const char *dir, struct tok_files *f, struct err *err)
{
    char path[4200];
    bool missing = false;
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = file_read_all(path, (size_t)1 << 30, &f->json, &f->json_len, NULL, err);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        rc = file_read_all(path, (size_t)256 << 20, &f->config, &f->config_len, NULL, err);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
        rc = file_read_all(path, (size_t)64 << 20, &f->special, &f->special_len, &missing, err);
    }
    if (rc)
        tok_files_free(f);
    return rc;
}

static json_object *parse_json_file(const char *text, size_t len, const char *name,
                                    struct err *err)
{
    json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!tok) {
        err_set(err, INFERD_ENOMEM, "parsing %s", name);
        return NULL;
    }
    json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!root || e != json_tokener_success || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        err_set(err, INFERD_EFORMAT, "%s is not a JSON object", name);
        return NULL;
    }
    return root;
}

/* A special token's text in a tokenizer config: a string or {"content": ...}; NULL when unset. */
static const char *special_token_text(json_object *cfg, const char *key)
{
    json_object *v;
    if (!cfg || !json_object_object_get_ex(cfg, key, &v) || !v)
        return NULL;
    if (json_object_is_type(v, json_type_object) && !json_object_object_get_ex(v, "content", &v))
        return NULL;
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

/* The id of token text in tokenizer.json (added tokens first, then the model's vocab), or -1. */
static int token_id(json_object *tok_root, const char *text)
{
    json_object *added, *model, *vocab, *v;
    if (json_object_object_get_ex(tok_root, "added_tokens", &added) &&
        json_object_is_type(added, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(added); i++) {
            json_object *e = json_object_array_get_idx(added, i), *c, *id;
            if (json_object_object_get_ex(e, "content", &c) &&
                json_object_is_type(c, json_type_string) &&
                !strcmp(json_object_get_string(c), text) &&
                json_object_object_get_ex(e, "id", &id) && json_object_is_type(id, json_type_int))
                return json_object_get_int(id);
        }
    }
    if (json_object_object_get_ex(tok_root, "model", &model) &&
        json_object_object_get_ex(model, "vocab", &vocab) &&
        json_object_is_type(vocab, json_type_object) &&
        json_object_object_get_ex(vocab, text, &v) && json_object_is_type(v, json_type_int))
        return json_object_get_int(v);
    return -1;
}

/* The tokenizer's size: its highest token id (vocab or added tokens) plus one. */
static int64_t tokenizer_size(json_object *tok_root)
{
    int64_t top = -1;
    json_object *added, *model, *vocab;
    if (json_object_object_get_ex(tok_root, "added_tokens", &added) &&
        json_object_is_type(added, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(added); i++) {
            json_object *id;
            if (json_object_object_get_ex(json_object_array_get_idx(added, i), "id", &id) &&
                json_object_get_int64(id) > top)
                top = json_object_get_int64(id);
        }
    }
    if (json_object_object_get_ex(tok_root, "model", &model) &&
        json_object_object_get_ex(model, "vocab", &vocab)) {
        if (json_object_is_type(vocab, json_type_object)) {
            json_object_object_foreach(vocab, text, id) {
                (void)text;
                if (json_object_get_int64(id) > top)
                    top = json_object_get_int64(id);
            }
        } else if (json_object_is_type(vocab, json_type_array)) {
            /* Unigram: a list of [piece, score], ids by position. */
            top = (int64_t)json_object_array_length(vocab) - 1 > top
                      ? (int64_t)json_object_array_length(vocab) - 1
                      : top;
        }
    }
    return top + 1;
}

/* True when the config's chat template (a string, or any template in a list) contains s. */
static bool chat_template_mentions(json_object *cfg, const char *s)
{
    json_object *ct;
    if (!json_object_object_get_ex(cfg, "chat_template", &ct) || !ct)
        return false;
    if (json_object_is_type(ct, json_type_string))
        return strstr(json_object_get_string(ct), s) != NULL;
    if (!json_object_is_type(ct, json_type_array))
        return false;
    for (size_t i = 0; i < json_object_array_length(ct); i++) {
        json_object *t;
        if (json_object_object_get_ex(json_object_array_get_idx(ct, i), "template", &t) &&
            json_object_is_type(t, json_type_string) && strstr(json_object_get_string(t), s))
            return true;
    }
    return false;
}

static void add_eos(struct mkmodel_preset *p, int id)
{
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos_token_ids[i] == id)
            return;
    if (p->n_eos < (int)(sizeof p->eos_token_ids / sizeof p->eos_token_ids[0]))
        p->eos_token_ids[p->n_eos++] = id;
}

/* Fits preset p (a copy) to the tokenizer: vocab size, bos and eos ids (see mkmodel.h). */
static int fit_to_tokenizer(struct mkmodel_preset *p, const struct tok_files *f, struct err *err)
{
    static const char *const turn_end[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"};
    json_object *root = parse_json_file(f->json, f->json_len, "tokenizer.json", err);
    json_object *cfg = root ? parse_json_file(f->config, f->config_len, "tokenizer_config.json",
                                              err)
                            : NULL;
    json_object *sm = cfg && f->special ? parse_json_file(f->special, f->special_len,
                                                          "special_tokens_map.json", err)
                                        : NULL;
    int rc = 0;
    if (!root || !cfg || (f->special && !sm)) {
        rc = -err->code;
        goto out;
    }
    int64_t size = tokenizer_size(root);
    if (size <= 0 || size > (4 << 20)) {
        rc = err_set(err, INFERD_EFORMAT, "tokenizer.json has %lld tokens (want 1 to %d)",
                     (long long)size, 4 << 20);
        goto out;
    }
    if (size > p->vocab_size)
        p->vocab_size = (int)size;

    const char *bos = special_token_text(cfg, "bos_token");
    if (!bos)
        bos = special_token_text(sm, "bos_token");
    const char *eos = special_token_text(cfg, "eos_token");
    if (!eos)
        eos = special_token_text(sm, "eos_token");
    p->bos_token_id = -1;
    if (bos && (p->bos_token_id = token_id(root, bos)) < 0) {
        rc = err_set(err, INFERD_EFORMAT, "bos_token '%s' is not in tokenizer.json", bos);
        goto out;
    }
    if (!eos) {
        rc = err_set(err, INFERD_EFORMAT,
                     "the tokenizer names no eos_token (tokenizer_config.json or "
                     "special_tokens_map.json)");
        goto out;
    }
    int eos_id = token_id(root, eos);
    if (eos_id < 0) {
        rc = err_set(err, INFERD_EFORMAT, "eos_token '%s' is not in tokenizer.json", eos);
        goto out;
    }
    p->n_eos = 0;
    add_eos(p, eos_id);
    for (size_t i = 0; i < sizeof turn_end / sizeof turn_end[0]; i++) {
        int id = token_id(root, turn_end[i]);
        if (id >= 0 && chat_template_mentions(cfg, turn_end[i]))
            add_eos(p, id);
    }
    memcpy(p->gen_eos_token_ids, p->eos_token_ids, sizeof p->gen_eos_token_ids);
    p->n_gen_eos = p->n_eos;
out:
    json_object_put(sm);
    json_object_put(cfg);
    json_object_put(root);
    return rc;
}

static int copy_tokenizer(const struct tok_files *f, const char *dir, struct err *err)
{
    int rc = write_bytes(dir, "tokenizer.json", f->json, f->json_len, err);
    if (rc == 0)
        rc = write_bytes(dir, "tokenizer_config.json", f->config, f->config_len, err);
    if (rc == 0 && f->special)
        rc = write_bytes(dir, "special_tokens_map.json", f->special, f->special_len, err);
    return rc;
}

/* Resolves opts to a preset, refusing unknown names and arch mismatches. */
static int resolve_preset(const struct mkmodel_opts *o, const struct mkmodel_preset **out,
                          struct err *err)
{
    const char *arch = o->arch && *o->arch ? o->arch : NULL;
    if (arch && !mkmodel_arch_class(arch))
        return err_set(err, INFERD_EINVAL,
                       "unknown architecture '%s' (known: llama, mistral, qwen2, qwen3, gemma3, "
                       "phi3)", arch);
    if (o->shape) {
        *out = o->shape;
        return 0;
    }
    char tiny[64];
    const char *name = o->preset && *o->preset ? o->preset : NULL;
    if (!name && !arch)
        return err_set(err, INFERD_EINVAL, "a preset (or an architecture) is required");
    if (!name) {
        snprintf(tiny, sizeof tiny, "tiny-%s", arch);
        name = tiny;
    }
    const struct mkmodel_preset *p = mkmodel_preset_find(name);
    if (!p)
        return err_set(err, INFERD_EINVAL, "unknown preset '%s' (see mkmodel --list)", name);
    if (arch && strcmp(arch, p->arch) != 0)
        return err_set(err, INFERD_EINVAL,
                       "preset '%s' is a %s model, not %s (omit the architecture or pass %s)",
                       p->name, p->arch, arch, p->arch);
    *out = p;
    return 0;
}

int mkmodel_write(const struct mkmodel_opts *o, struct err *err)
{
    struct err local = {0};
    if (!err)
        err = &local;
    const struct mkmodel_preset *preset = NULL;
    int rc = resolve_preset(o, &preset, err);
    if (rc)
        return rc;
    if (!o->out_dir || !*o->out_dir)
        return err_set(err, INFERD_EINVAL, "an output directory is required");
    struct mkmodel_preset fitted = *preset;
    struct tok_files tf = {0};
    bool with_tokenizer = o->tokenizer_dir && *o->tokenizer_dir;
    if (with_tokenizer) {
        rc = tok_files_read(o->tokenizer_dir, &tf, err);
        if (rc == 0)
            rc = fit_to_tokenizer(&fitted, &tf, err);
        if (rc) {
            err_wrap(err, "tokenizer in %s", o->tokenizer_dir);
            tok_files_free(&tf);
            return rc;
        }
    }
    const struct mkmodel_preset *p = &fitted;
    rc = mkdir_p(o->out_dir, err);
    struct sbuf cfg = {0}, gen = {0};
    if (rc == 0) {
        config_json(p, &cfg);
        generation_config_json(p, &gen);
        rc = write_text(o->out_dir, "config.json", &cfg, err);
    }
    if (rc == 0)
        rc = write_text(o->out_dir, "generation_config.json", &gen, err);
    free(cfg.s);
    free(gen.s);
    if (rc == 0 && with_tokenizer)
        rc = copy_tokenizer(&tf, o->out_dir, err);
    tok_files_free(&tf);
    if (rc == 0)
        rc = write_safetensors(p, o->seed, o->out_dir, err);
    return rc;
}

int mkmodel_file_fnv1a64(const char *dir, const char *name, char *hex, size_t cap,
                         struct err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (cap < 17)
        return err_set(err, INFERD_EINVAL, "checksum buffer too small");
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(err, INFERD_EIO, "opening %s: %s", path, strerror(errno));
    static const size_t bufsize = 1u << 16;
    unsigned char *buf = malloc(bufsize); /* owned */
    if (!buf) {
        fclose(f);
        return err_set(err, INFERD_ENOMEM, "allocating a read buffer");
    }
    uint64_t h = FNV_OFFSET;
    size_t n;
    while ((n = fread(buf, 1, bufsize, f)) > 0)
        h = fnv1a64_update(h, buf, n);
    int rc = ferror(f) ? err_set(err, INFERD_EIO, "reading %s", path) : 0;
    fclose(f);
    free(buf);
    if (rc == 0)
        snprintf(hex, cap, "%016llx", (unsigned long long)h);
    return rc;
}
