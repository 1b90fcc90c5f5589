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
            snprintf(c->arch_name, sizeof c->arch_name, "%s", name);
            return 0;
        }
    }
    return json_reader_fail_plain(root, INFERD_EUNSUPPORTED,
                                  "unsupported architecture '%.100s' (supported: LlamaForCausalLM, "
                                  "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
                                  name);
}

static int parse_sizes(const struct json_reader *root, struct model_config *c)
{
    int rc;
    if ((rc = json_read_int(root, "vocab_size", JSON_REQUIRED, 1, 4 << 20, &c->vocab_size)) ||
        (rc = json_read_int(root, "hidden_size", JSON_REQUIRED, 1, 65536, &c->hidden_size)) ||
        (rc = json_read_int(root, "intermediate_size", JSON_REQUIRED, 1, 1 << 20,
                            &c->intermediate_size)) ||
        (rc = json_read_int(root, "num_hidden_layers", JSON_REQUIRED, 1, 1024, &c->n_layers)) ||
        (rc = json_read_int(root, "num_attention_heads", JSON_REQUIRED, 1, 1024, &c->n_heads)))
        return rc;
    c->n_kv_heads = c->n_heads;
    c->max_position_embeddings = 4096;
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
    if (!json_reader_has(root, "head_dim") && c->hidden_size % c->n_heads != 0)
        return json_reader_fail_plain(root, INFERD_ERANGE,
                                      "hidden_size (%d) is not a multiple of num_attention_heads "
                                      "(%d) and head_dim is not given",
                                      c->hidden_size, c->n_heads);
    c->head_dim = c->hidden_size / c->n_heads;
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
    c->rms_norm_eps = 1e-6f;
    return read_float(root, "rms_norm_eps",
                      (struct json_range){.lo = 0, .hi = 1, .lo_open = true, .hi_open = true},
                      &c->rms_norm_eps);
}

/* rope_scaling, or the newer rope_parameters that also carries rope_theta. */
static int parse_rope(const struct json_reader *root, struct model_config *c)
{
    static const char *const types[] = {"default", "linear", "llama3", NULL};
    enum { TYPE_DEFAULT, TYPE_LINEAR, TYPE_LLAMA3 };
    struct json_reader params, rs;
    int rc = json_read_object(root, "rope_parameters", JSON_OPTIONAL, &params);
    if (rc)
        return rc;
    const struct json_reader *theta_src =
        json_reader_has(root, "rope_theta") || !params.v ? root : &params;
    c->rope_theta = 10000.0f;
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
    if (c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3) {
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
static int parse_unsupported_features(const struct json_reader *root)
{
    const char *act = NULL;
    bool mlp_bias = false;
    int rc;
    if ((rc = json_read_str(root, "hidden_act", JSON_OPTIONAL, &act, NULL)))
        return rc;
    if (act && strcmp(act, "silu") != 0)
        return json_reader_fail_plain(root, INFERD_EUNSUPPORTED,
                                      "hidden_act '%.40s' is not supported (only silu)", act);
    if ((rc = json_read_bool(root, "mlp_bias", JSON_OPTIONAL, &mlp_bias)))
        return rc;
    if (mlp_bias)
        return json_reader_fail_plain(root, INFERD_EUNSUPPORTED, "mlp_bias = true is not supported");
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
    struct model_config c = {.bos_token_id = -1};
    if ((rc = parse_arch(&root, &c)) || (rc = parse_sizes(&root, &c)) ||
        (rc = parse_rope(&root, &c)) || (rc = parse_sliding_window(&root, &c)) ||
        (rc = parse_unsupported_features(&root)) || (rc = parse_dtype_name(&root, &c)) ||
        (rc = parse_quantization(&root, &c)) ||
        (rc = json_read_bool(&root, "tie_word_embeddings", JSON_OPTIONAL,
                             &c.tie_word_embeddings)) ||
        (rc = json_read_bool(&root, "attention_bias", JSON_OPTIONAL, &c.attention_bias)) ||
        (rc = json_read_int(&root, "bos_token_id", JSON_OPTIONAL, 0, c.vocab_size - 1,
                            &c.bos_token_id)) ||
        (rc = read_token_ids(&root, "eos_token_id", c.vocab_size - 1, c.eos_token_ids, &c.n_eos)))
        goto out;
    if (c.arch == ARCH_QWEN2)
        c.attention_bias = true; /* Qwen2 always has q/k/v biases; its config does not say so */
    if (c.arch == ARCH_QWEN3)
        c.qk_norm = true;
    *out = c;
out:
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
