/* tools/mklora.c — a deterministic random PEFT LoRA adapter for a model directory: the names, shapes and config PEFT writes. */
#define _GNU_SOURCE
#include "tools/mklora.h"

#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/hash.h"
#include "base/strbuf.h"
#include "model/config.h"

struct module {
    const char *name, *path; /* PEFT's short name and its place in a layer */
    bool fused;              /* Phi-3's */
    bool mlp;
};

static const struct module modules[] = {
    {"q_proj", "self_attn.q_proj", false, false},     {"k_proj", "self_attn.k_proj", false, false},
    {"v_proj", "self_attn.v_proj", false, false},     {"o_proj", "self_attn.o_proj", false, false},
    {"qkv_proj", "self_attn.qkv_proj", true, false},  {"gate_proj", "mlp.gate_proj", false, true},
    {"up_proj", "mlp.up_proj", false, true},          {"down_proj", "mlp.down_proj", false, true},
    {"gate_up_proj", "mlp.gate_up_proj", true, true},
};
#define N_MODULES (int)(sizeof modules / sizeof modules[0])

static bool layer_dense(const struct model_config *c, int i)
{
    if (c->n_experts == 0)
        return true;
    int step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    return (i < (int)sizeof c->mlp_only_layers && c->mlp_only_layers[i]) || (i + 1) % step != 0;
}

/* out x in of a module, false when the architecture lacks it. */
static bool shape_of(const struct model_config *c, const struct module *m, int64_t *out,
                     int64_t *in)
{
    bool phi3 = c->arch == ARCH_PHI3;
    bool shared = !strcmp(m->name, "o_proj") || !strcmp(m->name, "down_proj");
    if (!shared && m->fused != phi3)
        return false;
    int64_t h = c->hidden_size, inter = c->intermediate_size;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    const char *n = m->name;
    *in = h;
    if (!strcmp(n, "q_proj"))
        *out = q;
    else if (!strcmp(n, "k_proj") || !strcmp(n, "v_proj"))
        *out = kv;
    else if (!strcmp(n, "o_proj"))
        *out = h, *in = q;
    else if (!strcmp(n, "qkv_proj"))
        *out = q + 2 * kv;
    else if (!strcmp(n, "gate_proj") || !strcmp(n, "up_proj"))
        *out = inter;
    else if (!strcmp(n, "down_proj"))
        *out = h, *in = inter;
    else
        *out = 2 * inter;
    return true;
}

struct tensor {
    char name[192];
    int64_t rows, cols;
    float half_width;
};

static float draw(uint64_t seed, const char *name, uint64_t i)
{
    uint64_t h = hash_mix64(hash_fnv1a(seed * HASH_FNV_PRIME ^ HASH_FNV_OFFSET, name, strlen(name)) + i);
    return (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int write_file(const char *dir, const char *name, const void *a, size_t na,
                      struct err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, na, f) != na) {
        if (f)
            fclose(f);
        return err_set(err, INFERD_EIO, "%s: cannot write it", path);
    }
    return fclose(f) == 0 ? 0 : err_set(err, INFERD_EIO, "%s: cannot write it", path);
}

int mklora_write(const struct mklora_opts *o, struct err *err)
{
    if (o->rank < 1 || o->rank > 256)
        return err_set(err, INFERD_EINVAL, "--rank %d outside [1, 256]", o->rank);
    struct model_config c;
    int rc = model_config_load(o->model_dir, &c, NULL, err);
    if (rc < 0)
        return rc;
    bool regex = o->targets && !strncmp(o->targets, "regex:", 6);
    regex_t re;
    bool want[N_MODULES];
    for (int k = 0; k < N_MODULES; k++) {
        int64_t r, cc;
        want[k] = !o->targets || regex ? shape_of(&c, &modules[k], &r, &cc) : false;
    }
    if (regex) {
        struct strbuf anchored = {0};
        strbuf_printf(&anchored, "^(%s)$", o->targets + 6);
        int bad = anchored.failed || regcomp(&re, anchored.data, REG_EXTENDED | REG_NOSUB);
        strbuf_free(&anchored);
        if (bad)
            return err_set(err, INFERD_EINVAL, "target regular expression %s does not compile",
                           o->targets + 6);
    } else if (o->targets) {
        char *list = strdup(o->targets), *save = NULL;
        if (!list)
            return err_set(err, INFERD_ENOMEM, "out of memory");
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int k = 0;
            while (k < N_MODULES && strcmp(modules[k].name, t))
                k++;
            int64_t r, cc;
            if (k == N_MODULES || !shape_of(&c, &modules[k], &r, &cc)) {
                rc = err_set(err, INFERD_EINVAL, "target %s is not a projection of a %s model", t,
                             model_arch_name(c.arch));
                break;
            }
            want[k] = true;
        }
        free(list);
        if (rc < 0)
            return rc;
    }
    /* the tensors, sorted by name as safetensors writers sort them */
    int cap = c.n_layers * N_MODULES * 2, n = 0;
    struct tensor *ts = calloc((size_t)cap, sizeof *ts);
    if (!ts)
        return err_set(err, INFERD_ENOMEM, "out of memory");
    for (int l = 0; l < c.n_layers; l++)
        for (int k = 0; k < N_MODULES; k++) {
            int64_t out, in;
            if (!want[k] || !shape_of(&c, &modules[k], &out, &in) ||
                (modules[k].mlp && !layer_dense(&c, l)))
                continue;
            if (regex) {
                char full[160];
                snprintf(full, sizeof full, "model.layers.%d.%s", l, modules[k].path);
                if (regexec(&re, full, 0, NULL, 0) != 0)
                    continue;
            }
            for (int ab = 0; ab < 2; ab++) {
                struct tensor *t = &ts[n++];
                snprintf(t->name, sizeof t->name, "base_model.model.model.layers.%d.%s.lora_%c.weight",
                         l, modules[k].path, ab ? 'B' : 'A');
                t->rows = ab ? out : o->rank;
                t->cols = ab ? o->rank : in;
                t->half_width = ab ? 0.5f / sqrtf((float)o->rank) : 1.0f / sqrtf((float)in);
            }
        }
    if (regex)
        regfree(&re);
    if (n == 0) {
        free(ts);
        return err_set(err, INFERD_EINVAL, "the targets name no projection of this model");
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(ts[j - 1].name, ts[j].name) > 0; j--) {
            struct tensor x = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = x;
        }
    struct strbuf hdr = {0}, body = {0}, cfg = {0};
    uint64_t off = 0;
    strbuf_printf(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)ts[i].rows * (uint64_t)ts[i].cols * 4;
        strbuf_printf(&hdr, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                       ts[i].name, (long long)ts[i].rows, (long long)ts[i].cols,
                       (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    strbuf_printf(&hdr, "}");
    while (hdr.len % 8)
        strbuf_printf(&hdr, " ");
    uint64_t hlen = hdr.len;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)(hlen >> (8 * i));
    strbuf_append(&body, (const char *)prefix, 8);
    strbuf_append(&body, hdr.data, hdr.len);
    for (int i = 0; i < n; i++) {
        uint64_t count = (uint64_t)ts[i].rows * (uint64_t)ts[i].cols;
        for (uint64_t j = 0; j < count; j++) {
            float v = ts[i].half_width * draw(o->seed, ts[i].name, j);
            strbuf_append(&body, (const char *)&v, 4);
        }
    }
    /* adapter_config.json as PEFT writes it (the fields it reads) */
    strbuf_printf(&cfg, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n"
                         "  \"base_model_name_or_path\": \"%s\",\n  \"r\": %d,\n  \"lora_alpha\": %g,\n"
                         "  \"lora_dropout\": 0.0,\n  \"use_rslora\": %s,\n  \"use_dora\": false,\n"
                         "  \"fan_in_fan_out\": false,\n  \"bias\": \"none\",\n"
                         "  \"modules_to_save\": null,\n  \"target_modules\": ",
                   o->model_dir, o->rank, o->alpha, o->rslora ? "true" : "false");
    if (regex) {
        strbuf_printf(&cfg, "\"");
        for (const char *p = o->targets + 6; *p; p++)
            strbuf_printf(&cfg, *p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
        strbuf_printf(&cfg, "\"");
    } else {
        strbuf_printf(&cfg, "[");
        bool first = true;
        for (int k = 0; k < N_MODULES; k++)
            if (want[k]) {
                strbuf_printf(&cfg, "%s\"%s\"", first ? "" : ", ", modules[k].name);
                first = false;
            }
        strbuf_printf(&cfg, "]");
    }
    strbuf_printf(&cfg, "\n}\n");
    free(ts);
    if (hdr.failed || body.failed || cfg.failed)
        rc = err_set(err, INFERD_ENOMEM, "out of memory");
    /* the directory and any parents missing */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", o->out_dir);
    for (char *p = dir + 1; !rc && *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                rc = err_set(err, INFERD_EIO, "%s: cannot create it", dir);
            *p = '/';
        }
    if (!rc && mkdir(o->out_dir, 0755) < 0 && errno != EEXIST)
        rc = err_set(err, INFERD_EIO, "%s: cannot create it", o->out_dir);
    if (!rc)
        rc = write_file(o->out_dir, "adapter_model.safetensors", body.data, body.len, err);
    if (!rc)
        rc = write_file(o->out_dir, "adapter_config.json", cfg.data, cfg.len, err);
    strbuf_free(&hdr);
    strbuf_free(&body);
    strbuf_free(&cfg);
    return rc;
}
