/* model/config.c — config.json and generation_config.json: parsing, defaults and range checks. */
#include "model/config.h"

#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_MAX_FILE_BYTES (16u << 20)

/* ---------------------------------------------------------------- JSON fields */

static const char *json_type_word(struct json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double: return "a floating-point number";
    case json_type_int: return "an integer";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "an unknown value";
}

/* The member key of obj, or NULL when absent or null (null means "use the default"). */
static struct json_object *field(struct json_object *obj, const char *key)
{
    struct json_object *v = NULL;
    if (!json_object_object_get_ex(obj, key, &v) || json_object_is_type(v, json_type_null))
        return NULL;
    return v;
}

static int int_value(struct json_object *v, const char *name, int64_t lo, int64_t hi, int *out,
                     struct err *err)
{
    if (!json_object_is_type(v, json_type_int))
        return err_set(err, INFERD_EFORMAT, "%s must be an integer, got %s", name,
                       json_type_word(v));
    int64_t x = json_object_get_int64(v);
    if (x < lo || x > hi)
        return err_set(err, INFERD_ERANGE, "%s = %lld is out of range (%lld..%lld)", name,
                       (long long)x, (long long)lo, (long long)hi);
    *out = (int)x;
    return 0;
}

/* Integer member key of obj in [lo, hi]; absent or null gives dflt, or an error when required. */
static int get_int(struct json_object *obj, const char *key, bool required, int dflt, int64_t lo,
                   int64_t hi, int *out, struct err *err)
{
    struct json_object *v = field(obj, key);
    if (!v) {
        if (required)
            return err_set(err, INFERD_EFORMAT, "missing required field '%s'", key);
        *out = dflt;
        return 0;
    }
    return int_value(v, key, lo, hi, out, err);
}

/* Number member (integer or floating point), finite; absent or null gives dflt. */
static int get_number(struct json_object *obj, const char *key, bool required, double dflt,
                      double *out, struct err *err)
{
    struct json_object *v = field(obj, key);
    if (!v) {
        if (required)
            return err_set(err, INFERD_EFORMAT, "missing required field '%s'", key);
        *out = dflt;
        return 0;
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return err_set(err, INFERD_EFORMAT, "%s must be a number, got %s", key, json_type_word(v));
    double x = json_object_get_double(v);
    if (!isfinite(x))
        return err_set(err, INFERD_ERANGE, "%s must be a finite number", key);
    *out = x;
    return 0;
}

static int get_bool(struct json_object *obj, const char *key, bool dflt, bool *out,
                    struct err *err)
{
    struct json_object *v = field(obj, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_object_is_type(v, json_type_boolean))
        return err_set(err, INFERD_EFORMAT, "%s must be true or false, got %s", key,
                       json_type_word(v));
    *out = json_object_get_boolean(v);
    return 0;
}

/* eos_token_id: one integer or a list of them; duplicates are dropped. */
static int get_token_ids(struct json_object *obj, const char *key, int max_id, int *ids, int *n_out,
                         struct err *err)
{
    struct json_object *v = field(obj, key);
    *n_out = 0;
    if (!v)
        return 0;
    bool is_list = json_object_is_type(v, json_type_array);
    size_t n = is_list ? json_object_array_length(v) : 1;
    if (!is_list && !json_object_is_type(v, json_type_int))
        return err_set(err, INFERD_EFORMAT, "%s must be an integer or a list of integers, got %s",
                       key, json_type_word(v));
    if (n > CONFIG_MAX_EOS)
        return err_set(err, INFERD_ERANGE, "%s lists %zu ids (at most %d are supported)", key, n,
                       CONFIG_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = is_list ? json_object_array_get_idx(v, i) : v;
        int id = 0;
        int rc = int_value(e, key, 0, max_id, &id, err);
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

static int get_string(struct json_object *obj, const char *key, const char **out, struct err *err)
{
    struct json_object *v = field(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_string))
        return err_set(err, INFERD_EFORMAT, "%s must be a string, got %s", key, json_type_word(v));
    *out = json_object_get_string(v);
    return 0;
}

/* Parses text as one JSON object (trailing whitespace allowed). */
static int parse_object(const char *text, size_t len, const char *what, struct json_object **out,
                        struct err *err)
{
    *out = NULL;
    if (len > INT_MAX)
        return err_set(err, INFERD_EFORMAT, "%s is too large (%zu bytes)", what, len);
    struct json_tokener *tok = json_tokener_new();
    if (!tok)
        return err_set(err, INFERD_ENOMEM, "out of memory parsing %s", what);
    struct json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        if (jerr == json_tokener_continue || jerr == json_tokener_success)
            return err_set(err, INFERD_EFORMAT, "%s: JSON ends before it is complete", what);
        return err_set(err, INFERD_EFORMAT, "%s is not valid JSON: %s at byte %zu", what,
                       json_tokener_error_desc(jerr), end);
    }
    for (size_t i = end; i < len; i++) {
        char c = text[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            json_object_put(root);
            return err_set(err, INFERD_EFORMAT, "%s has unexpected bytes after its JSON object "
                                                "(byte %zu)",
                           what, i);
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "%s is not a JSON object", what);
    }
    *out = root;
    return 0;
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

static int parse_arch(struct json_object *root, struct model_config *c, struct err *err)
{
    const char *name = NULL;
    bool from_class = false;
    struct json_object *archs = field(root, "architectures");
    if (archs) {
        if (!json_object_is_type(archs, json_type_array) || json_object_array_length(archs) == 0 ||
            !json_object_is_type(json_object_array_get_idx(archs, 0), json_type_string))
            return err_set(err, INFERD_EFORMAT,
                           "architectures must be a non-empty list of class names");
        name = json_object_get_string(json_object_array_get_idx(archs, 0));
        from_class = true;
    } else {
        int rc = get_string(root, "model_type", &name, err);
        if (rc)
            return rc;
        if (!name)
            return err_set(err, INFERD_EFORMAT,
                           "config has neither 'architectures' nor 'model_type'");
    }
    for (int i = 0; i < N_ARCHS; i++) {
        if (strcmp(name, from_class ? arch_table[i].class_name : arch_table[i].model_type) == 0) {
            c->arch = arch_table[i].arch;
            snprintf(c->arch_name, sizeof c->arch_name, "%s", name);
            return 0;
        }
    }
    return err_set(err, INFERD_EUNSUPPORTED,
                   "unsupported architecture '%.100s' (supported: LlamaForCausalLM, "
                   "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
                   name);
}

static int parse_sizes(struct json_object *root, struct model_config *c, struct err *err)
{
    int rc;
    if ((rc = get_int(root, "vocab_size", true, 0, 1, 4 << 20, &c->vocab_size, err)) ||
        (rc = get_int(root, "hidden_size", true, 0, 1, 65536, &c->hidden_size, err)) ||
        (rc = get_int(root, "intermediate_size", true, 0, 1, 1 << 20, &c->intermediate_size,
                      err)) ||
        (rc = get_int(root, "num_hidden_layers", true, 0, 1, 1024, &c->n_layers, err)) ||
        (rc = get_int(root, "num_attention_heads", true, 0, 1, 1024, &c->n_heads, err)) ||
        (rc = get_int(root, "num_key_value_heads", false, c->n_heads, 1, 1024, &c->n_kv_heads,
                      err)) ||
        (rc = get_int(root, "max_position_embeddings", false, 4096, 1, 16 << 20,
                      &c->max_position_embeddings, err)))
        return rc;
    if (c->n_heads % c->n_kv_heads != 0)
        return err_set(err, INFERD_ERANGE,
                       "num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                       c->n_heads, c->n_kv_heads);
    if (!field(root, "head_dim") && c->hidden_size % c->n_heads != 0)
        return err_set(err, INFERD_ERANGE,
                       "hidden_size (%d) is not a multiple of num_attention_heads (%d) and "
                       "head_dim is not given",
                       c->hidden_size, c->n_heads);
    if ((rc = get_int(root, "head_dim", false, c->hidden_size / c->n_heads, 1, 1024, &c->head_dim,
                      err)))
        return rc;
    if (c->head_dim > 1024) /* the default, hidden_size / num_attention_heads, is unchecked above */
        return err_set(
            err, INFERD_ERANGE,
            "head_dim = %d (hidden_size / num_attention_heads) is out of range (1..1024)",
            c->head_dim);
    if (c->head_dim % 2 != 0)
        return err_set(err, INFERD_ERANGE, "head_dim = %d must be even (rotary embedding pairs)",
                       c->head_dim);

    double eps;
    if ((rc = get_number(root, "rms_norm_eps", false, 1e-6, &eps, err)))
        return rc;
    if (!(eps > 0 && eps < 1))
        return err_set(err, INFERD_ERANGE, "rms_norm_eps = %g is out of range (0 < eps < 1)", eps);
    c->rms_norm_eps = (float)eps;
    return 0;
}

/* rope_scaling, or the newer rope_parameters that also carries rope_theta. */
static int parse_rope(struct json_object *root, struct model_config *c, struct err *err)
{
    struct json_object *rs = field(root, "rope_scaling");
    const char *rs_name = "rope_scaling";
    struct json_object *params = field(root, "rope_parameters");
    if (params && !json_object_is_type(params, json_type_object))
        return err_set(err, INFERD_EFORMAT, "rope_parameters must be an object, got %s",
                       json_type_word(params));
    if (!rs && params) {
        rs = params;
        rs_name = "rope_parameters";
    }

    double theta;
    struct json_object *theta_src = field(root, "rope_theta") || !params ? root : params;
    int rc = get_number(theta_src, "rope_theta", false, 10000.0, &theta, err);
    if (rc)
        return rc;
    if (!(theta > 0) || theta > 3.0e38)
        return err_set(err, INFERD_ERANGE, "rope_theta = %g is out of range (must be positive)",
                       theta);
    c->rope_theta = (float)theta;
    c->rope_scaling = ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    if (!rs)
        return 0;
    if (!json_object_is_type(rs, json_type_object))
        return err_set(err, INFERD_EFORMAT, "%s must be an object or null, got %s", rs_name,
                       json_type_word(rs));

    const char *type = NULL;
    if ((rc = get_string(rs, "rope_type", &type, err)))
        return err_wrap(err, "%s", rs_name);
    if (!type && (rc = get_string(rs, "type", &type, err)))
        return err_wrap(err, "%s", rs_name);
    if (!type)
        return err_set(err, INFERD_EFORMAT, "%s has no 'rope_type'", rs_name);
    if (strcmp(type, "default") == 0)
        return 0;

    double factor;
    if (strcmp(type, "linear") == 0 || strcmp(type, "llama3") == 0) {
        if ((rc = get_number(rs, "factor", true, 1.0, &factor, err)))
            return err_wrap(err, "%s", rs_name);
        if (!(factor > 0) || factor > 1e6)
            return err_set(err, INFERD_ERANGE,
                           "%s: factor = %g is out of range (0 < factor <= 1e6)", rs_name, factor);
        c->rope_factor = (float)factor;
    }
    if (strcmp(type, "linear") == 0) {
        c->rope_scaling = ROPE_SCALING_LINEAR;
        return 0;
    }
    if (strcmp(type, "llama3") == 0) {
        double low, high;
        if ((rc = get_number(rs, "low_freq_factor", true, 0, &low, err)) ||
            (rc = get_number(rs, "high_freq_factor", true, 0, &high, err)) ||
            (rc = get_int(rs, "original_max_position_embeddings", true, 0, 1, 16 << 20,
                          &c->rope_original_max_position, err)))
            return err_wrap(err, "%s", rs_name);
        if (!(low > 0) || !(high > low) || high > 1e6)
            return err_set(err, INFERD_ERANGE,
                           "%s: need 0 < low_freq_factor < high_freq_factor, got %g and %g",
                           rs_name, low, high);
        c->rope_low_freq_factor = (float)low;
        c->rope_high_freq_factor = (float)high;
        c->rope_scaling = ROPE_SCALING_LLAMA3;
        return 0;
    }
    return err_set(err, INFERD_EUNSUPPORTED,
                   "unsupported %s type '%.60s' (supported: default, linear, llama3)", rs_name,
                   type);
}

static int parse_sliding_window(struct json_object *root, struct model_config *c, struct err *err)
{
    c->sliding_window = 0;
    if (c->arch == ARCH_MISTRAL) {
        /* transformers' MistralConfig defaults to 4096; null turns it off. */
        struct json_object *v = NULL;
        bool present = json_object_object_get_ex(root, "sliding_window", &v);
        if (!present)
            c->sliding_window = 4096;
        else if (!json_object_is_type(v, json_type_null))
            return int_value(v, "sliding_window", 1, INT_MAX, &c->sliding_window, err);
        return 0;
    }
    if (c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3) {
        bool on;
        int rc = get_bool(root, "use_sliding_window", false, &on, err);
        if (rc)
            return rc;
        if (on)
            return err_set(err, INFERD_EUNSUPPORTED,
                           "use_sliding_window = true (per-layer sliding-window attention) is not "
                           "supported");
    }
    return 0;
}

/* Variants the forward pass does not implement are refused rather than run wrongly. */
static int parse_unsupported_features(struct json_object *root, struct err *err)
{
    const char *act;
    bool mlp_bias;
    int rc;
    if ((rc = get_string(root, "hidden_act", &act, err)))
        return rc;
    if (act && strcmp(act, "silu") != 0)
        return err_set(err, INFERD_EUNSUPPORTED, "hidden_act '%.40s' is not supported (only silu)",
                       act);
    if ((rc = get_bool(root, "mlp_bias", false, &mlp_bias, err)))
        return rc;
    if (mlp_bias)
        return err_set(err, INFERD_EUNSUPPORTED, "mlp_bias = true is not supported");
    return 0;
}

static int parse_dtype_name(struct json_object *root, struct model_config *c, struct err *err)
{
    const char *key = field(root, "dtype") ? "dtype" : "torch_dtype";
    const char *s;
    int rc = get_string(root, key, &s, err);
    if (rc)
        return rc;
    c->torch_dtype = DTYPE_BF16;
    if (!s || strcmp(s, "bfloat16") == 0)
        return 0;
    if (strcmp(s, "float16") == 0)
        c->torch_dtype = DTYPE_F16;
    else if (strcmp(s, "float32") == 0)
        c->torch_dtype = DTYPE_F32;
    else
        return err_set(err, INFERD_EUNSUPPORTED,
                       "%s '%.40s' is not supported (supported: bfloat16, float16, float32)", key,
                       s);
    return 0;
}

int model_config_parse(const char *json, size_t len, struct model_config *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    struct json_object *root;
    int rc = parse_object(json, len, "config.json", &root, err);
    if (rc)
        return rc;
    struct model_config c = {0};
    if ((rc = parse_arch(root, &c, err)) || (rc = parse_sizes(root, &c, err)) ||
        (rc = parse_rope(root, &c, err)) || (rc = parse_sliding_window(root, &c, err)) ||
        (rc = parse_unsupported_features(root, err)) ||
        (rc = parse_dtype_name(root, &c, err)) ||
        (rc = get_bool(root, "tie_word_embeddings", false, &c.tie_word_embeddings, err)) ||
        (rc = get_bool(root, "attention_bias", false, &c.attention_bias, err)) ||
        (rc = get_int(root, "bos_token_id", false, -1, 0, c.vocab_size - 1, &c.bos_token_id,
                      err)) ||
        (rc = get_token_ids(root, "eos_token_id", c.vocab_size - 1, c.eos_token_ids, &c.n_eos,
                            err)))
        goto out;
    if (c.arch == ARCH_QWEN2)
        c.attention_bias = true; /* Qwen2 always has q/k/v biases; its config does not say so */
    if (c.arch == ARCH_QWEN3)
        c.qk_norm = true;
    *out = c;
out:
    json_object_put(root);
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

static int get_float_in(struct json_object *root, const char *key, double lo, double hi,
                        bool lo_open, float *inout, struct err *err)
{
    double x;
    int rc = get_number(root, key, false, (double)*inout, &x, err);
    if (rc)
        return rc;
    if (x < lo || x > hi || (lo_open && x == lo))
        return err_set(err, INFERD_ERANGE, "%s = %g is out of range (%s%g..%g)", key, x,
                       lo_open ? ">" : "", lo, hi);
    *inout = (float)x;
    return 0;
}

int generation_config_parse(const char *json, size_t len, struct generation_defaults *g,
                            struct err *err)
{
    struct json_object *root;
    int rc = parse_object(json, len, "generation_config.json", &root, err);
    if (rc)
        return rc;
    struct generation_defaults n = *g; /* committed only when everything parses */
    int ids[CONFIG_MAX_EOS], n_ids = 0;
    if ((rc = get_float_in(root, "temperature", 0, 1e6, false, &n.temperature, err)) ||
        (rc = get_float_in(root, "top_p", 0, 1, false, &n.top_p, err)) ||
        (rc = get_int(root, "top_k", false, n.top_k, 0, INT_MAX, &n.top_k, err)) ||
        (rc = get_float_in(root, "repetition_penalty", 0, 1e6, true, &n.repetition_penalty,
                           err)) ||
        (rc = get_bool(root, "do_sample", n.do_sample, &n.do_sample, err)) ||
        (rc = get_int(root, "bos_token_id", false, n.bos_token_id, 0, INT_MAX, &n.bos_token_id,
                      err)) ||
        (rc = get_token_ids(root, "eos_token_id", INT_MAX, ids, &n_ids, err)))
        goto out;
    if (field(root, "eos_token_id")) {
        memcpy(n.eos_token_ids, ids, sizeof ids);
        n.n_eos = n_ids;
    }
    *g = n;
out:
    json_object_put(root);
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
