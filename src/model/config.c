/* model/config.c — config.json and generation_config.json: parsing, defaults and range checks. */
#include "model/config.h"

#include "base/file.h"
#include "base/json.h"

#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX_FILE_BYTES (16u << 20)

/* Parses text as one JSON object; what names the file in messages. */
static int parse_object(const char *text, size_t len, const char *what, struct json_object **out,
                        struct err *err)
{
    int rc = json_text_parse(text, len, 0, false, out, err);
    if (rc)
        return err_wrap(err, "%s is not valid JSON", what);
    if (!json_object_is_type(*out, json_type_object)) {
        json_object_put(*out);
        *out = NULL;
        return err_set(err, INFERD_EFORMAT, "%s is not a JSON object", what);
    }
    return 0;
}

/* eos_token_id: one integer or a list of them in [0, max_id]; duplicates are dropped. */
static int read_token_ids(const struct json_reader *r, const char *key, int max_id, int *ids,
                          int *n_out)
{
    struct json_reader v = json_reader_member(r, key);
    *n_out = 0;
    if (!v.v)
        return 0;
    bool is_list = json_object_is_type(v.v, json_type_array);
    if (!is_list && !json_object_is_type(v.v, json_type_int))
        return json_reader_fail(&v, INFERD_EFORMAT,
                                "must be an integer or a list of integers, got %s",
                                json_type_phrase(v.v));
    size_t n = is_list ? json_object_array_length(v.v) : 1;
    if (n > CONFIG_MAX_EOS)
        return json_reader_fail(&v, INFERD_ERANGE, "lists %zu ids (at most %d are supported)", n,
                                CONFIG_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        struct json_reader e = is_list ? json_reader_element(&v, i) : v;
        int id = 0;
        int rc = json_read_int(&e, NULL, JSON_REQUIRED, 0, max_id, &id);
        if (rc)
            return rc;
        bool seen = false;
        for (int j = 0; j < *n_out; j++)
            seen |= ids[j] == id;
        if (!seen)
            ids[(*n_out)++] = id;
    }
    return 0;
}

/* An optional float field; absent leaves *inout as it is. */
static int read_float(const struct json_reader *r, const char *key, struct json_range range,
                      float *inout)
{
    double x = *inout;
    int rc = json_read_double(r, key, JSON_OPTIONAL, range, &x);
    if (!rc)
        *inout = (float)x;
    return rc;
}

/* ---------------------------------------------------------------- config.json */

static const struct {
    const char *class_name, *model_type;
    enum model_arch arch;
} arch_table[] = {
    {"LlamaForCausalLM", "llama", ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", ARCH_QWEN3},
    {"Qwen3MoeForCausalLM", "qwen3_moe", ARCH_QWEN3_MOE},
    {"Gemma3ForCausalLM", "gemma3_text", ARCH_GEMMA3},
    {"Gemma3ForConditionalGeneration", "gemma3", ARCH_GEMMA3},
    {"Phi3ForCausalLM", "phi3", ARCH_PHI3},
};
#define N_ARCHS ((int)(sizeof arch_table / sizeof arch_table[0]))

const char *model_arch_name(enum model_arch arch)
{
    for (int i = 0; i < N_ARCHS; i++)
        if (arch_table[i].arch == arch)
            return arch_table[i].class_name;
    return "unknown";
}

static int parse_arch(const struct json_reader *root, struct model_config *c)
{
    const char *name = NULL;
    struct json_reader archs;
    size_t n;
    int rc = json_read_array(root, "architectures", JSON_OPTIONAL, &archs, &n);
    if (rc)
        return rc;
    bool from_class = archs.v != NULL;
    if (from_class) {
        if (n == 0)
            return json_reader_fail(&archs, INFERD_EFORMAT,
                                    "must be a non-empty list of class names");
        struct json_reader first = json_reader_element(&archs, 0);
        if ((rc = json_read_str(&first, NULL, JSON_REQUIRED, &name, NULL)))
            return rc;
    } else {
        if ((rc = json_read_str(root, "model_type", JSON_OPTIONAL, &name, NULL)))
            return rc;
        if (!name)
            return json_reader_fail_plain(root, INFERD_EFORMAT,
                                          "config has neither 'architectures' nor 'model_type'");
    }
    for (int i = 0; i < N_ARCHS; i++) {
        if (strcmp(name, from_class ? arch_table[i].class_name : arch_table[i].model_type) == 0) {
            c->arch = arch_table[i].arch;
            c->multimodal = !strcmp(arch_table[i].class_name, "Gemma3ForConditionalGeneration");
            snprintf(c->arch_name, sizeof c->arch_name, "%s", name);
            return 0;
        }
    }
    return json_reader_fail_plain(root, INFERD_EUNSUPPORTED,
                                  "unsupported architecture '%.100s' (supported: LlamaForCausalLM, "
                                  "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                                  "Qwen3MoeForCausalLM, Gemma3ForCausalLM, "
                                  "Gemma3ForConditionalGeneration, Phi3ForCausalLM)",
                                  name);
}

static int parse_sizes(const struct json_reader *root, struct model_config *c)
{
    /* Gemma 3's released configs leave out what Gemma3TextConfig defaults
     * (the multimodal ones name little more than the sizes that differ). */
    bool gemma = c->arch == ARCH_GEMMA3;
    bool *need = gemma ? JSON_OPTIONAL : JSON_REQUIRED;
    if (gemma) {
        c->vocab_size = 262208;
        c->hidden_size = 2304;
        c->intermediate_size = 9216;
        c->n_layers = 26;
        c->n_heads = 8;
    }
    int rc;
    if ((rc = json_read_int(root, "vocab_size", need, 1, 4 << 20, &c->vocab_size)) ||
        (rc = json_read_int(root, "hidden_size", need, 1, 65536, &c->hidden_size)) ||
        (rc = json_read_int(root, "intermediate_size", need, 1, 1 << 20,
                            &c->intermediate_size)) ||
        (rc = json_read_int(root, "num_hidden_layers", need, 1, CONFIG_MAX_LAYERS,
                            &c->n_layers)) ||
        (rc = json_read_int(root, "num_attention_heads", need, 1, 1024, &c->n_heads)))
        return rc;
    c->n_kv_heads = gemma ? 4 : c->n_heads;
    c->max_position_embeddings = gemma ? 131072 : 4096;
    if ((rc = json_read_int(root, "num_key_value_heads", JSON_OPTIONAL, 1, 1024,
                            &c->n_kv_heads)) ||
        (rc = json_read_int(root, "max_position_embeddings", JSON_OPTIONAL, 1, 16 << 20,
                            &c->max_position_embeddings)))
        return rc;
    if (c->n_heads % c->n_kv_heads != 0)
        return json_reader_fail_plain(
            root, INFERD_ERANGE,
            "num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", c->n_heads,
            c->n_kv_heads);
    if (!gemma && !json_reader_has(root, "head_dim") && c->hidden_size % c->n_heads != 0)
        return json_reader_fail_plain(root, INFERD_ERANGE,
                                      "hidden_size (%d) is not a multiple of num_attention_heads "
                                      "(%d) and head_dim is not given",
                                      c->hidden_size, c->n_heads);
    c->head_dim = gemma ? 256 : c->hidden_size / c->n_heads;
    if ((rc = json_read_int(root, "head_dim", JSON_OPTIONAL, 1, 1024, &c->head_dim)))
        return rc;
    if (c->head_dim > 1024) /* the default, hidden_size / num_attention_heads, is unchecked above */
        return json_reader_fail_plain(
            root, INFERD_ERANGE,
            "head_dim = %d (hidden_size / num_attention_heads) is out of range (1..1024)",
            c->head_dim);
    if (c->head_dim % 2 != 0)
        return json_reader_fail_plain(root, INFERD_ERANGE,
                                      "head_dim = %d must be even (rotary embedding pairs)",
                                      c->head_dim);
    /* partial_rotary_factor (Phi-4-mini): transformers rotates int(head_dim * factor) dims */
    double partial = 1.0;
    if ((rc = json_read_double(root, "partial_rotary_factor", JSON_OPTIONAL,
                               (struct json_range){.lo = 0, .hi = 1, .lo_open = true},
                               &partial)))
        return rc;
    c->rope_dim = (int)((double)c->head_dim * partial);
    if (c->rope_dim < 2 || c->rope_dim % 2 != 0)
        return json_reader_fail_plain(root, INFERD_ERANGE,
                                      "partial_rotary_factor %g rotates %d of %d dims per head; "
                                      "that must be even and at least 2",
                                      partial, c->rope_dim, c->head_dim);
    c->rms_norm_eps = 1e-6f;
    return read_float(root, "rms_norm_eps",
                      (struct json_range){.lo = 0, .hi = 1, .lo_open = true, .hi_open = true},
                      &c->rms_norm_eps);
}

/* longrope's factor list key of rs: exactly model_rope_dim / 2 positive numbers. */
static int read_rope_factors(const struct json_reader *rs, const char *key,
                             const struct model_config *c, float *out)
{
    struct json_reader list;
    size_t n;
    int rc = json_read_array(rs, key, JSON_REQUIRED, &list, &n);
    if (rc)
        return rc;
    if (n != (size_t)c->n_rope_factors)
        return json_reader_fail(&list, INFERD_EFORMAT,
                                "has %zu factors; %d rotated dims need %d", n,
                                model_rope_dim(c), c->n_rope_factors);
    for (size_t i = 0; i < n; i++) {
        struct json_reader e = json_reader_element(&list, i);
        double x = 0;
        if ((rc = json_read_double(&e, NULL, JSON_REQUIRED,
                                   (struct json_range){.lo = 0, .hi = 1e9, .lo_open = true}, &x)))
            return rc;
        out[i] = (float)x;
    }
    return 0;
}

/* Phi-3's longrope ("su" in older configs): short and long factors per rotated
 * pair, the context they switch at, and the attention factor transformers'
 * _compute_longrope_parameters derives when the config gives none. */
static int parse_longrope(const struct json_reader *root, const struct json_reader *rs,
                          struct model_config *c)
{
    c->n_rope_factors = model_rope_dim(c) / 2;
    if (c->n_rope_factors > CONFIG_MAX_ROPE_FACTORS)
        return json_reader_fail(rs, INFERD_ERANGE, "needs %d factors (at most %d are supported)",
                                c->n_rope_factors, CONFIG_MAX_ROPE_FACTORS);
    int rc;
    if ((rc = read_rope_factors(rs, "short_factor", c, c->rope_short_factor)) ||
        (rc = read_rope_factors(rs, "long_factor", c, c->rope_long_factor)))
        return rc;
    c->rope_original_max_position = c->max_position_embeddings;
    const struct json_reader *orig_src =
        json_reader_has(rs, "original_max_position_embeddings") ? rs : root;
    if ((rc = json_read_int(orig_src, "original_max_position_embeddings", JSON_OPTIONAL, 1,
                            16 << 20, &c->rope_original_max_position)))
        return rc;
    double factor = (double)c->max_position_embeddings / c->rope_original_max_position;
    double attention = factor <= 1.0 ? 1.0
                                     : sqrt(1.0 + log(factor) / log(c->rope_original_max_position));
    if ((rc = json_read_double(rs, "attention_factor", JSON_OPTIONAL,
                               (struct json_range){.lo = 0, .hi = 1e6, .lo_open = true},
                               &attention)))
        return rc;
    c->rope_attention_factor = (float)attention;
    c->rope_scaling = ROPE_SCALING_LONGROPE;
    return 0;
}

/* rope_scaling, or the newer rope_parameters that also carries rope_theta.
 * Gemma 3's newer configs key rope_parameters by layer type: the global
 * layers' entry is read here, the local ones' base by parse_gemma3. */
static int parse_rope(const struct json_reader *root, struct model_config *c)
{
    static const char *const types[] = {"default", "linear", "llama3", "longrope", "su", NULL};
    enum { TYPE_DEFAULT, TYPE_LINEAR, TYPE_LLAMA3, TYPE_LONGROPE, TYPE_SU };
    struct json_reader params, rs;
    int rc = json_read_object(root, "rope_parameters", JSON_OPTIONAL, &params);
    if (rc)
        return rc;
    if (params.v && json_reader_has(&params, "full_attention") &&
        (rc = json_read_object(&params, "full_attention", JSON_REQUIRED, &params)))
        return rc;
    const struct json_reader *theta_src =
        json_reader_has(root, "rope_theta") || !params.v ? root : &params;
    c->rope_theta = c->arch == ARCH_GEMMA3 ? 1000000.0f : 10000.0f;
    if ((rc = read_float(theta_src, "rope_theta",
                         (struct json_range){.lo = 0, .hi = 3.0e38, .lo_open = true},
                         &c->rope_theta)))
        return rc;
    c->rope_scaling = ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    if ((rc = json_read_object(root, "rope_scaling", JSON_OPTIONAL, &rs)))
        return rc;
    if (!rs.v)
        rs = params;
    if (!rs.v)
        return 0;

    /* older configs spell rope_type "type" */
    const char *type_key =
        json_reader_has(&rs, "rope_type") || !json_reader_has(&rs, "type") ? "rope_type" : "type";
    int type = TYPE_DEFAULT;
    if ((rc = json_read_enum(&rs, type_key, JSON_REQUIRED, types, &type)) || type == TYPE_DEFAULT)
        return rc;
    if (type == TYPE_LONGROPE || type == TYPE_SU)
        return parse_longrope(root, &rs, c);
    double factor = 1;
    if ((rc = json_read_double(&rs, "factor", JSON_REQUIRED,
                               (struct json_range){.lo = 0, .hi = 1e6, .lo_open = true}, &factor)))
        return rc;
    c->rope_factor = (float)factor;
    if (type == TYPE_LINEAR) {
        c->rope_scaling = ROPE_SCALING_LINEAR;
        return 0;
    }
    double low = 0, high = 0;
    if ((rc = json_read_double(&rs, "low_freq_factor", JSON_REQUIRED, JSON_ANY_NUMBER, &low)) ||
        (rc = json_read_double(&rs, "high_freq_factor", JSON_REQUIRED, JSON_ANY_NUMBER, &high)) ||
        (rc = json_read_int(&rs, "original_max_position_embeddings", JSON_REQUIRED, 1, 16 << 20,
                            &c->rope_original_max_position)))
        return rc;
    if (!(low > 0) || !(high > low) || high > 1e6)
        return json_reader_fail(&rs, INFERD_ERANGE,
                                "needs 0 < low_freq_factor < high_freq_factor <= 1e6, got %g and %g",
                                low, high);
    c->rope_low_freq_factor = (float)low;
    c->rope_high_freq_factor = (float)high;
    c->rope_scaling = ROPE_SCALING_LLAMA3;
    return 0;
}

/* Gemma 3: which layers are local (layer_types, else every layer but each
 * sliding_window_pattern-th), their window and RoPE base, the query scale,
 * the soft-caps, and the Gemma norms, embedding scale and GeGLU. */
static int parse_gemma3(const struct json_reader *root, struct model_config *c)
{
    int rc;
    c->sliding_window = 4096;
    if (json_reader_has_key(root, "sliding_window") && !json_reader_has(root, "sliding_window"))
        c->sliding_window = 0; /* null: no layer has a window */
    if ((rc = json_read_int(root, "sliding_window", JSON_OPTIONAL, 1, INT_MAX,
                            &c->sliding_window)))
        return rc;
    struct json_reader types;
    size_t n_types;
    if ((rc = json_read_array(root, "layer_types", JSON_OPTIONAL, &types, &n_types)))
        return rc;
    if (types.v) {
        if (n_types != (size_t)c->n_layers)
            return json_reader_fail(&types, INFERD_EFORMAT, "names %zu layers, the model has %d",
                                    n_types, c->n_layers);
        static const char *const kinds[] = {"full_attention", "sliding_attention", NULL};
        for (size_t i = 0; i < n_types; i++) {
            struct json_reader e = json_reader_element(&types, i);
            int kind = 0;
            if ((rc = json_read_enum(&e, NULL, JSON_REQUIRED, kinds, &kind)))
                return rc;
            c->layer_sliding[i] = kind == 1;
        }
    } else {
        int pattern = 6;
        if ((rc = json_read_int(root, "sliding_window_pattern", JSON_OPTIONAL, 1, INT_MAX,
                                &pattern)))
            return rc;
        for (int i = 0; i < c->n_layers; i++)
            c->layer_sliding[i] = (i + 1) % pattern != 0;
    }
    if (!c->sliding_window)
        memset(c->layer_sliding, 0, sizeof c->layer_sliding);

    c->rope_local_theta = 10000.0f;
    struct json_reader params, local;
    if ((rc = json_read_object(root, "rope_parameters", JSON_OPTIONAL, &params)) ||
        (rc = json_read_object(&params, "sliding_attention", JSON_OPTIONAL, &local)))
        return rc;
    const struct json_reader *local_src = json_reader_has(root, "rope_local_base_freq") || !local.v
                                              ? root
                                              : &local;
    const char *local_key = local_src == root ? "rope_local_base_freq" : "rope_theta";
    if ((rc = read_float(local_src, local_key,
                         (struct json_range){.lo = 0, .hi = 3.0e38, .lo_open = true},
                         &c->rope_local_theta)))
        return rc;

    double qpas = 256;
    if ((rc = json_read_double(root, "query_pre_attn_scalar", JSON_OPTIONAL,
                               (struct json_range){.lo = 0, .hi = 1e9, .lo_open = true}, &qpas)))
        return rc;
    c->query_scale = (float)pow(qpas, -0.5);
    if ((rc = read_float(root, "final_logit_softcapping",
                         (struct json_range){.lo = 0, .hi = 1e9, .lo_open = true},
                         &c->final_logit_softcap)))
        return rc;
    if (json_reader_has(root, "attn_logit_softcapping"))
        return json_reader_fail_plain(root, INFERD_EUNSUPPORTED,
                                      "attn_logit_softcapping (soft-capped attention scores) is "
                                      "not supported");
    c->qk_norm = true;
    c->gemma_norm = true;
    c->embed_scale = true;
    c->gelu_tanh = true;
    c->tie_word_embeddings = true;
    return 0;
}

static int parse_sliding_window(const struct json_reader *root, struct model_config *c)
{
    c->sliding_window = 0;
    if (c->arch == ARCH_MISTRAL) {
        /* transformers' MistralConfig defaults to 4096; null turns it off. */
        if (!json_reader_has_key(root, "sliding_window"))
            c->sliding_window = 4096;
        return json_read_int(root, "sliding_window", JSON_OPTIONAL, 1, INT_MAX,
                             &c->sliding_window);
    }
    if (c->arch == ARCH_GEMMA3)
        return 0; /* parse_gemma3 */
    if (c->arch == ARCH_PHI3) /* transformers' Phi3Config defaults to no window */
        return json_read_int(root, "sliding_window", JSON_OPTIONAL, 1, INT_MAX,
                             &c->sliding_window);
    if (c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE) {
        bool on = false;
        int rc = json_read_bool(root, "use_sliding_window", JSON_OPTIONAL, &on);
        if (rc)
            return rc;
        if (on)
            return json_reader_fail_plain(root, INFERD_EUNSUPPORTED,
                                          "use_sliding_window = true (per-layer sliding-window "
                                          "attention) is not supported");
    }
    return 0;
}

/* Variants the forward pass does not implement are refused rather than run wrongly. */
static int parse_unsupported_features(const struct json_reader *root,
                                      const struct model_config *c)
{
    const char *act = NULL;
    bool mlp_bias = false;
    int rc;
    /* Gemma 3 names it hidden_activation, and runs gelu_pytorch_tanh */
    const char *act_key = c->arch == ARCH_GEMMA3 && !json_reader_has(root, "hidden_act")
                              ? "hidden_activation"
                              : "hidden_act";
    const char *want = c->arch == ARCH_GEMMA3 ? "gelu_pytorch_tanh" : "silu";
    if ((rc = json_read_str(root, act_key, JSON_OPTIONAL, &act, NULL)))
        return rc;
    if (act && strcmp(act, want) != 0)
        return json_reader_fail_plain(root, INFERD_EUNSUPPORTED,
                                      "%s '%.40s' is not supported (%s runs %s)", act_key, act,
                                      model_arch_name(c->arch), want);
    if ((rc = json_read_bool(root, "mlp_bias", JSON_OPTIONAL, &mlp_bias)))
        return rc;
    if (mlp_bias)
        return json_reader_fail_plain(root, INFERD_EUNSUPPORTED, "mlp_bias = true is not supported");
    return 0;
}

/* num_experts and the fields that go with it (Qwen3-MoE; Qwen2-MoE's shared expert). */
static int parse_experts(const struct json_reader *root, struct model_config *c)
{
    c->decoder_sparse_step = 1;
    c->norm_topk_prob = false; /* transformers' Qwen3MoeConfig default */
    if (c->arch != ARCH_QWEN3_MOE)
        return 0;
    int rc;
    if ((rc = json_read_int(root, "num_experts", JSON_REQUIRED, 0, CONFIG_MAX_EXPERTS,
                            &c->n_experts)) ||
        (rc = json_read_bool(root, "norm_topk_prob", JSON_OPTIONAL, &c->norm_topk_prob)) ||
        (rc = json_read_int(root, "decoder_sparse_step", JSON_OPTIONAL, 1, 1024,
                            &c->decoder_sparse_step)) ||
        (rc = json_read_int(root, "shared_expert_intermediate_size", JSON_OPTIONAL, 0, 1 << 20,
                            &c->shared_expert_intermediate_size)))
        return rc;
    if (c->n_experts == 0)
        return 0;
    if ((rc = json_read_int(root, "num_experts_per_tok", JSON_REQUIRED, 1,
                            CONFIG_MAX_EXPERTS_PER_TOK, &c->n_experts_per_tok)) ||
        (rc = json_read_int(root, "moe_intermediate_size", JSON_REQUIRED, 1, 1 << 20,
                            &c->moe_intermediate_size)))
        return rc;
    if (c->n_experts_per_tok > c->n_experts)
        return json_reader_fail_plain(root, INFERD_ERANGE,
                                      "num_experts_per_tok (%d) is more than num_experts (%d)",
                                      c->n_experts_per_tok, c->n_experts);
    struct json_reader only;
    size_t n = 0;
    if ((rc = json_read_array(root, "mlp_only_layers", JSON_OPTIONAL, &only, &n)))
        return rc;
    for (size_t i = 0; only.v && i < n; i++) {
        struct json_reader e = json_reader_element(&only, i);
        int layer = 0;
        if ((rc = json_read_int(&e, NULL, JSON_REQUIRED, 0, c->n_layers - 1, &layer)))
            return rc;
        c->mlp_only_layers[layer] = 1;
    }
    return 0;
}

static int parse_dtype_name(const struct json_reader *root, struct model_config *c)
{
    static const char *const names[] = {"bfloat16", "float16", "float32", NULL};
    static const enum dtype types[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int i = 0;
    int rc = json_read_enum(root, json_reader_has(root, "dtype") ? "dtype" : "torch_dtype",
                            JSON_OPTIONAL, names, &i);
    c->torch_dtype = types[i];
    return rc;
}

/* One {group_size, bits} of MLX's affine quantization, checked against what
 * the loader runs. */
static int read_quant_shape(const struct json_reader *q, int *bits, int *group)
{
    int rc;
    if ((rc = json_read_int(q, "bits", JSON_REQUIRED, 1, 64, bits)) ||
        (rc = json_read_int(q, "group_size", JSON_REQUIRED, 1, 1 << 20, group)))
        return rc;
    if (*bits != 4 && *bits != 8)
        return json_reader_fail(q, INFERD_EUNSUPPORTED,
                                "bits %d is not supported (MLX quantization of 4 or 8 bits)",
                                *bits);
    if (*group != 32 && *group != 64 && *group != 128)
        return json_reader_fail(q, INFERD_EUNSUPPORTED,
                                "group_size %d is not supported (32, 64 or 128)", *group);
    return 0;
}

/* MLX-quantized checkpoints (mlx-community): quantization, which mlx-lm
 * also writes as quantization_config, = {group_size, bits[, mode "affine"]}
 * and per-module entries, each its own {group_size, bits} or false (left
 * dense). A quantization_config of another method (GPTQ, AWQ, bitsandbytes,
 * FP8: a quant_method key) is refused by name. The loader reads each
 * tensor's bits and group from its shapes; these say the checkpoint is one. */
static int parse_quantization(const struct json_reader *root, struct model_config *c)
{
    const char *key = json_reader_has(root, "quantization") ? "quantization"
                                                            : "quantization_config";
    struct json_reader q;
    const char *method = NULL, *mode = NULL;
    int rc = json_read_object(root, key, JSON_OPTIONAL, &q);
    if (rc || !q.v)
        return rc;
    if ((rc = json_read_str(&q, "quant_method", JSON_OPTIONAL, &method, NULL)))
        return rc;
    if (method)
        return json_reader_fail(&q, INFERD_EUNSUPPORTED,
                                "quant_method '%.40s' is not supported (inferd loads MLX's "
                                "affine quantization and GGUF files)", method);
    if ((rc = json_read_str(&q, "mode", JSON_OPTIONAL, &mode, NULL)))
        return rc;
    if (mode && strcmp(mode, "affine") != 0)
        return json_reader_fail(&q, INFERD_EUNSUPPORTED,
                                "mode '%.40s' is not supported (only MLX's affine quantization)",
                                mode);
    if ((rc = read_quant_shape(&q, &c->quant_bits, &c->quant_group_size)))
        return rc;
    json_object_object_foreach(q.v, k, v)
    {
        if (!strcmp(k, "bits") || !strcmp(k, "group_size") || !strcmp(k, "mode"))
            continue;
        struct json_reader e = json_reader_entry(&q, k, v);
        int bits, group;
        if (json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v))
            continue;
        if (!json_object_is_type(v, json_type_object))
            return json_reader_fail(&e, INFERD_EFORMAT,
                                    "must be a module's {group_size, bits} or false, got %s",
                                    json_type_phrase(v));
        if ((rc = read_quant_shape(&e, &bits, &group)))
            return rc;
    }
    return 0;
}

int model_config_parse(const char *json, size_t len, struct model_config *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    struct json_object *obj;
    int rc = parse_object(json, len, "config.json", &obj, err);
    if (rc)
        return rc;
    struct json_doc doc = {.err = err, .name = "config.json"};
    struct json_reader root = json_reader_root(&doc, obj);
    struct model_config *c = calloc(1, sizeof *c); /* large: the per-layer flags */
    if (!c) {
        json_object_put(obj);
        return err_set(err, INFERD_ENOMEM, "out of memory parsing config.json");
    }
    c->bos_token_id = -1;
    /* Gemma3ForConditionalGeneration: the text model's config is text_config;
     * the ids and dtype may sit at the top */
    struct json_reader text = root;
    if ((rc = parse_arch(&root, c)))
        goto out;
    if (c->multimodal && (rc = json_read_object(&root, "text_config", JSON_REQUIRED, &text)))
        goto out;
    const struct json_reader *ids = c->multimodal && !json_reader_has(&root, "eos_token_id")
                                        ? &text
                                        : &root;
    const struct json_reader *dtype_src =
        c->multimodal && !json_reader_has(&root, "torch_dtype") && !json_reader_has(&root, "dtype")
            ? &text
            : &root;
    if ((rc = parse_sizes(&text, c)) || (rc = parse_rope(&text, c)) ||
        (rc = parse_sliding_window(&text, c)) ||
        (c->arch == ARCH_GEMMA3 && (rc = parse_gemma3(&text, c))) ||
        (rc = parse_unsupported_features(&text, c)) || (rc = parse_experts(&text, c)) ||
        (rc = parse_dtype_name(dtype_src, c)) || (rc = parse_quantization(&text, c)) ||
        (rc = json_read_bool(&text, "tie_word_embeddings", JSON_OPTIONAL,
                             &c->tie_word_embeddings)) ||
        (rc = json_read_bool(&text, "attention_bias", JSON_OPTIONAL, &c->attention_bias)) ||
        (rc = json_read_int(ids, "bos_token_id", JSON_OPTIONAL, 0, c->vocab_size - 1,
                            &c->bos_token_id)) ||
        (rc = read_token_ids(ids, "eos_token_id", c->vocab_size - 1, c->eos_token_ids, &c->n_eos)))
        goto out;
    if (c->arch == ARCH_GEMMA3 && c->bos_token_id < 0 && !json_reader_has_key(ids, "bos_token_id"))
        c->bos_token_id = 2 < c->vocab_size ? 2 : -1; /* Gemma3TextConfig's default */
    if (c->arch == ARCH_GEMMA3 && c->n_eos == 0 && !json_reader_has_key(ids, "eos_token_id") &&
        c->vocab_size > 1)
        c->eos_token_ids[c->n_eos++] = 1;
    if (c->arch == ARCH_QWEN2)
        c->attention_bias = true; /* Qwen2 always has q/k/v biases; its config does not say so */
    if (c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE)
        c->qk_norm = true;
    *out = *c;
out:
    free(c);
    json_object_put(obj);
    return rc;
}

/* ---------------------------------------------------------------- generation_config.json */

void generation_defaults_init(struct generation_defaults *g)
{
    memset(g, 0, sizeof *g);
    g->temperature = 1.0f;
    g->top_p = 1.0f;
    g->top_k = 0;
    g->repetition_penalty = 1.0f;
    g->do_sample = false;
    g->n_eos = 0;
    g->bos_token_id = -1;
}

int generation_config_parse(const char *json, size_t len, struct generation_defaults *g,
                            struct err *err)
{
    struct json_object *obj;
    int rc = parse_object(json, len, "generation_config.json", &obj, err);
    if (rc)
        return rc;
    struct json_doc doc = {.err = err, .name = "generation_config.json"};
    struct json_reader root = json_reader_root(&doc, obj);
    struct generation_defaults n = *g; /* committed only when everything parses */
    int ids[CONFIG_MAX_EOS], n_ids = 0;
    if ((rc = read_float(&root, "temperature", (struct json_range){.lo = 0, .hi = 1e6},
                         &n.temperature)) ||
        (rc = read_float(&root, "top_p", (struct json_range){.lo = 0, .hi = 1}, &n.top_p)) ||
        (rc = json_read_int(&root, "top_k", JSON_OPTIONAL, 0, INT_MAX, &n.top_k)) ||
        (rc = read_float(&root, "repetition_penalty",
                         (struct json_range){.lo = 0, .hi = 1e6, .lo_open = true},
                         &n.repetition_penalty)) ||
        (rc = json_read_bool(&root, "do_sample", JSON_OPTIONAL, &n.do_sample)) ||
        (rc = json_read_int(&root, "bos_token_id", JSON_OPTIONAL, 0, INT_MAX, &n.bos_token_id)) ||
        (rc = read_token_ids(&root, "eos_token_id", INT_MAX, ids, &n_ids)))
        goto out;
    if (json_reader_has(&root, "eos_token_id")) {
        memcpy(n.eos_token_ids, ids, sizeof ids);
        n.n_eos = n_ids;
    }
    *g = n;
out:
    json_object_put(obj);
    return rc;
}

/* ---------------------------------------------------------------- loading from a directory */

static int merge_eos(struct model_config *cfg, const struct generation_defaults *g,
                     struct err *err)
{
    for (int i = 0; i < g->n_eos; i++) {
        int id = g->eos_token_ids[i];
        bool seen = false;
        for (int j = 0; j < cfg->n_eos; j++)
            seen |= cfg->eos_token_ids[j] == id;
        if (seen)
            continue;
        if (id >= cfg->vocab_size)
            return err_set(err, INFERD_ERANGE, "eos_token_id %d is outside the vocabulary (%d)",
                           id, cfg->vocab_size);
        if (cfg->n_eos == CONFIG_MAX_EOS)
            return err_set(err, INFERD_ERANGE,
                           "config.json and generation_config.json name more than %d distinct "
                           "eos ids",
                           CONFIG_MAX_EOS);
        cfg->eos_token_ids[cfg->n_eos++] = id;
    }
    return 0;
}

int model_config_load(const char *dir, struct model_config *cfg, struct generation_defaults *gen,
                      struct err *err)
{
    struct generation_defaults local;
    if (!gen)
        gen = &local;
    generation_defaults_init(gen);
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/config.json", dir);
    if (n < 0 || (size_t)n >= sizeof path)
        return err_set(err, INFERD_EINVAL, "model directory path is too long");

    char *text;
    size_t len;
    int rc = file_read_all(path, CONFIG_MAX_FILE_BYTES, &text, &len, NULL, err);
    if (rc)
        return rc;
    rc = model_config_parse(text, len, cfg, err);
    free(text);
    if (rc)
        return err_wrap(err, "%s", path);

    n = snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (n < 0 || (size_t)n >= sizeof path)
        return err_set(err, INFERD_EINVAL, "model directory path is too long");
    bool missing = false;
    if ((rc = file_read_all(path, CONFIG_MAX_FILE_BYTES, &text, &len, &missing, err)))
        return rc;
    if (missing)
        return 0;
    rc = generation_config_parse(text, len, gen, err);
    free(text);
    if (!rc)
        rc = merge_eos(cfg, gen, err);
    if (rc)
        return err_wrap(err, "%s", path);
    return 0;
}
