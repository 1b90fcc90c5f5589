/* kv/kv_quant_config.c — KV quantization formats by name (--kv-quant) and the per-layer
 * kv_config.json reader. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/json.h"
#include "kv/kv_quant_config.h"

static bool turbo_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 8; }

int kv_quant_layer_parse(const char *text, struct kv_quant_layer *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (!strcmp(text, "off") || !strcmp(text, "bf16") || !strcmp(text, "f32"))
        return 0;
    int bits = 0, group = 64, n = 0;
    if ((sscanf(text, "%d%n", &bits, &n) == 1 && text[n] == '\0') ||
        (sscanf(text, "%dg%d%n", &bits, &group, &n) == 2 && text[n] == '\0')) {
        if ((bits != 4 && bits != 8) || (group != 32 && group != 64) || text[0] < '0' ||
            text[0] > '9')
            return err_set(err, INFERD_EINVAL,
                           "'%s' is not a KV format (affine: 4 or 8 bits, group 32 or 64)", text);
        *out = (struct kv_quant_layer){.scheme = KV_QUANT_AFFINE, .k_bits = (uint8_t)bits,
                                       .v_bits = (uint8_t)bits, .group_size = (uint8_t)group};
        return 0;
    }
    if (!strncmp(text, "turbo", 5)) {
        const char *rest = text + 5;
        int k = 8, v = 3;
        bool qjl = false;
        if (*rest == ':' && rest[1] == 'k') {
            if (sscanf(rest, ":k%dv%d%n", &k, &v, &n) != 2)
                goto bad;
            rest += n;
        }
        if (!strcmp(rest, ":qjl")) {
            qjl = true;
            rest += 4;
        }
        if (*rest || !turbo_bits(k) || !turbo_bits(v) || (qjl && (k < 3 || k > 5)))
            goto bad;
        *out = (struct kv_quant_layer){.scheme = KV_QUANT_TURBO, .k_bits = (uint8_t)k,
                                       .v_bits = (uint8_t)v, .qjl = qjl};
        return 0;
    }
bad:
    return err_set(err, INFERD_EINVAL,
                   "'%s' is not a KV format (off, 8, 4, 8g32, 4g32, turbo, turbo:kXvY with X and Y "
                   "in 2, 3, 4, 5, 8, optionally followed by :qjl with X in 3..5)", text);
}

int kv_quant_parse(const char *text, struct kv_quant *out, bool *quantized, struct err *err)
{
    memset(out, 0, sizeof *out);
    out->seed = KV_QUANT_DEFAULT_SEED;
    int rc = kv_quant_layer_parse(text, &out->layer[0], err);
    if (rc < 0)
        return rc;
    *quantized = out->layer[0].scheme != KV_QUANT_NONE;
    return 0;
}

/* One FORMAT value (a name, or {"format", "group_size"}) at r. */
static int read_format(const struct json_reader *r, const char *label,
                       struct kv_quant_layer *out, struct err *err)
{
    const char *name = NULL;
    int group = 0;
    bool has_group = false;
    if (r->v && json_object_is_type(r->v, json_type_object)) {
        static const char *const keys[] = {"format", "group_size", NULL};
        int rc = json_reader_check_keys(r, keys);
        if (rc == 0)
            rc = json_read_str(r, "format", JSON_REQUIRED, &name, NULL);
        if (rc == 0)
            rc = json_read_int(r, "group_size", &has_group, 32, 64, &group);
        if (rc < 0)
            return err_wrap(err, "%s", label);
        if (has_group && group != 32 && group != 64)
            return err_set(err, INFERD_EINVAL, "%s: group_size must be 32 or 64, got %d",
                           label, group);
    } else {
        int rc = json_read_str(r, NULL, JSON_REQUIRED, &name, NULL);
        if (rc < 0)
            return err_wrap(err, "%s", label);
    }
    int rc = kv_quant_layer_parse(name, out, err);
    if (rc < 0)
        return err_wrap(err, "%s: format", label);
    if (has_group) {
        if (out->scheme != KV_QUANT_AFFINE)
            return err_set(err, INFERD_EINVAL,
                           "%s: group_size: only affine formats (4, 8) have groups, not '%s'",
                           label, name);
        out->group_size = (uint8_t)group;
    }
    return 0;
}

static int parse_doc(struct json_object *root, const char *what, int n_layers,
                     struct kv_quant *out, struct err *err)
{
    struct json_doc doc = {.err = err, .name = what, .flags = JSON_TEXT};
    struct json_reader r = json_reader_root(&doc, root);
    if (!root || !json_object_is_type(root, json_type_object))
        return err_set(err, INFERD_EFORMAT, "the file is not a JSON object");
    static const char *const keys[] = {"default", "layers", "seed", NULL};
    int rc = json_reader_check_keys(&r, keys);
    if (rc < 0)
        return rc;
    int64_t seed = (int64_t)(KV_QUANT_DEFAULT_SEED & 0x7fffffffffffffffull);
    bool has_seed = false;
    rc = json_read_int64(&r, "seed", &has_seed, 0, INT64_MAX, &seed);
    if (rc < 0)
        return rc;
    out->seed = has_seed ? (uint64_t)seed : KV_QUANT_DEFAULT_SEED;
    struct kv_quant_layer def = {0};
    if (json_reader_has(&r, "default")) {
        struct json_reader d = json_reader_member(&r, "default");
        rc = read_format(&d, "default", &def, err);
        if (rc < 0)
            return rc;
    }
    for (int l = 0; l < n_layers; l++)
        out->layer[l] = def;
    struct json_reader layers = json_reader_member(&r, "layers");
    if (layers.v && json_object_is_type(layers.v, json_type_array)) {
        size_t n = json_object_array_length(layers.v);
        if (n != (size_t)n_layers)
            return err_set(err, INFERD_EINVAL, "layers: %zu entries, the model has %d layers", n,
                           n_layers);
        for (int l = 0; l < n_layers; l++) {
            struct json_reader e = json_reader_element(&layers, (size_t)l);
            if (!e.v)
                continue; /* null: the default */
            char label[32];
            snprintf(label, sizeof label, "layer %d", l);
            rc = read_format(&e, label, &out->layer[l], err);
            if (rc < 0)
                return rc;
        }
    } else if (layers.v && json_object_is_type(layers.v, json_type_object)) {
        json_object_object_foreach(layers.v, key, val)
        {
            char *end;
            long l = strtol(key, &end, 10);
            if (!*key || *end || l < 0 || key[0] == '-' || key[0] == '+')
                return err_set(err, INFERD_EINVAL, "layers: key '%.40s' is not a layer index", key);
            if (l >= n_layers)
                return err_set(err, INFERD_ERANGE, "layer %ld: the model has %d layers (0..%d)", l,
                               n_layers, n_layers - 1);
            struct json_reader e = json_reader_entry(&layers, key, val);
            if (!e.v)
                continue;
            char label[32];
            snprintf(label, sizeof label, "layer %ld", l);
            rc = read_format(&e, label, &out->layer[l], err);
            if (rc < 0)
                return rc;
        }
    } else if (layers.v) {
        return err_set(err, INFERD_EFORMAT, "layers: must be an array or an object, got %s",
                       json_type_phrase(layers.v));
    }
    out->n_layers = n_layers;
    out->per_layer = true;
    uint64_t h = hash_mix64(out->seed ^ (uint64_t)n_layers);
    for (int l = 0; l < n_layers; l++) {
        const struct kv_quant_layer *x = &out->layer[l];
        h = hash_mix64(h ^ ((uint64_t)x->scheme | (uint64_t)x->k_bits << 8 |
                            (uint64_t)x->v_bits << 16 | (uint64_t)x->group_size << 24 |
                            (uint64_t)x->qjl << 32));
    }
    out->digest = h;
    return 0;
}

int kv_quant_config_parse(const char *text, size_t len, const char *what, int n_layers,
                          struct kv_quant *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (n_layers < 1 || n_layers > KV_QUANT_MAX_LAYERS)
        return err_set(err, INFERD_ERANGE, "%s: a per-layer KV config covers 1..%d layers, the "
                       "model has %d", what, KV_QUANT_MAX_LAYERS, n_layers);
    struct json_object *root = NULL;
    int rc = json_text_parse(text, len, 16, true, &root, err);
    if (rc < 0)
        return err_wrap(err, "%s is not valid JSON", what);
    rc = parse_doc(root, what, n_layers, out, err);
    json_object_put(root);
    if (rc < 0) {
        /* every message names the file first */
        if (strncmp(err->msg, what, strlen(what)) != 0)
            err_wrap(err, "%s", what);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

int kv_quant_config_load(const char *path, int n_layers, struct kv_quant *out, struct err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = file_read_all(path, 1 << 20, &text, &len, NULL, err);
    if (rc < 0)
        return err_wrap(err, "KV quantization config");
    rc = kv_quant_config_parse(text, len, path, n_layers, out, err);
    free(text);
    return rc;
}
