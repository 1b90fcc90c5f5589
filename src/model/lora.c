/* model/lora.c — PEFT LoRA adapters: adapter_config.json and adapter_model.safetensors read, checked against the base model, held in backend memory (f32; bf16 where FAST mode runs bf16 weights); merging one into the weights.
 *
 * PEFT names a pair after the module it wraps:
 *   base_model.model.<prefix>layers.N.<self_attn|mlp>.<proj>.lora_A.weight   (rank x in)
 *   base_model.model.<prefix>layers.N.<self_attn|mlp>.<proj>.lora_B.weight   (out x rank)
 * and adds scale * B A x to the module's output (scale = lora_alpha / r, or
 * lora_alpha / sqrt(r) with use_rslora). fan_in_fan_out only transposes the
 * base weight of GPT-2-style Conv1D modules; the projections here are
 * Linear, whose A and B PEFT stores as above either way. */
#define _GNU_SOURCE
#include "model/lora.h"
#include "model/arch.h"

#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/panels.h"

#define CONFIG_CAP (1u << 20)

/* The modules a layer may have, as PEFT names them. */
enum module { MOD_Q, MOD_K, MOD_V, MOD_O, MOD_GATE, MOD_UP, MOD_DOWN, MOD_QKV, MOD_GATE_UP, N_MOD };

static const char *const module_path[N_MOD] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",    "self_attn.qkv_proj",
    "mlp.gate_up_proj",
};

/* Whether layer i of m has module mod, and its shape (out x in). */
static bool module_shape(const struct model *m, int i, enum module mod, int64_t *out, int64_t *in)
{
    const struct model_config *c = &m->config;
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    bool fused = c->arch == ARCH_PHI3;
    /* a sparse (mixture-of-experts) layer has no dense MLP */
    bool mlp = m->weights.layers[i].w_gate.rows > 0 || fused;
    switch (mod) {
    case MOD_Q: *out = q, *in = hidden; return !fused;
    case MOD_K:
    case MOD_V: *out = kv, *in = hidden; return !fused;
    case MOD_O: *out = hidden, *in = q; return true;
    case MOD_GATE:
    case MOD_UP: *out = inter, *in = hidden; return !fused && mlp;
    case MOD_DOWN: *out = hidden, *in = inter; return mlp;
    case MOD_QKV: *out = q + 2 * kv, *in = hidden; return fused;
    case MOD_GATE_UP: *out = 2 * inter, *in = hidden; return fused;
    default: return false;
    }
}

/* ---- adapter_config.json ------------------------------------------------- */

struct targets {
    bool regex;
    regex_t re;
    char **names; /* owned; a list's entries */
    int n_names;
    bool *matched; /* per name: some module matched it */
};

static void targets_free(struct targets *t)
{
    if (t->regex)
        regfree(&t->re);
    for (int i = 0; i < t->n_names; i++)
        free(t->names[i]);
    free(t->names);
    free(t->matched);
}

/* PEFT's rule: a list entry matches a module whose full name is the entry or
 * ends with "." + entry; a string is a regular expression the whole name
 * must match. */
static bool targets_match(struct targets *t, const char *full)
{
    if (t->regex)
        return regexec(&t->re, full, 0, NULL, 0) == 0;
    bool any = false;
    size_t n = strlen(full);
    for (int i = 0; i < t->n_names; i++) {
        size_t k = strlen(t->names[i]);
        if (!strcmp(full, t->names[i]) ||
            (k < n && full[n - k - 1] == '.' && !strcmp(full + n - k, t->names[i]))) {
            t->matched[i] = true;
            any = true;
        }
    }
    return any;
}

struct peft_config {
    int rank;
    float alpha;
    bool rslora;
    struct targets targets;
    char base_model[256];
};

static bool empty_or_null(json_object *v)
{
    return !v || json_object_is_type(v, json_type_null) ||
           (json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0) ||
           (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0);
}

static int parse_config(const char *dir, struct peft_config *pc, struct err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = NULL;
    size_t len = 0;
    int rc = file_read_all(path, CONFIG_CAP, &text, &len, NULL, err);
    if (rc < 0)
        return rc;
    json_object *root = json_tokener_parse(text);
    free(text);
    if (!root || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "%s: not a JSON object", path);
    }
    json_object *v;
    rc = -INFERD_EFORMAT;
    if (json_object_object_get_ex(root, "peft_type", &v) && json_object_is_type(v, json_type_string) &&
        strcmp(json_object_get_string(v), "LORA") != 0) {
        err_set(err, INFERD_EFORMAT, "%s: peft_type %s is not LORA", path, json_object_get_string(v));
        goto out;
    }
    if (!json_object_object_get_ex(root, "r", &v) || !json_object_is_type(v, json_type_int) ||
        json_object_get_int(v) < 1 || json_object_get_int(v) > LORA_MAX_RANK) {
        err_set(err, INFERD_EFORMAT, "%s: r must be an integer in [1, %d]", path, LORA_MAX_RANK);
        goto out;
    }
    pc->rank = json_object_get_int(v);
    pc->alpha = 8; /* PEFT's default */
    if (json_object_object_get_ex(root, "lora_alpha", &v) && !json_object_is_type(v, json_type_null)) {
        if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double)) {
            err_set(err, INFERD_EFORMAT, "%s: lora_alpha must be a number", path);
            goto out;
        }
        pc->alpha = (float)json_object_get_double(v);
    }
    if (json_object_object_get_ex(root, "use_rslora", &v))
        pc->rslora = json_object_get_boolean(v);
    if (json_object_object_get_ex(root, "use_dora", &v) && json_object_get_boolean(v)) {
        err_set(err, INFERD_EUNSUPPORTED, "%s: DoRA adapters (use_dora) are not supported", path);
        goto out;
    }
    if (json_object_object_get_ex(root, "bias", &v) && !json_object_is_type(v, json_type_null) &&
        strcmp(json_object_get_string(v), "none") != 0) {
        err_set(err, INFERD_EUNSUPPORTED, "%s: bias \"%s\" is not supported (only \"none\")", path,
                json_object_get_string(v));
        goto out;
    }
    static const char *const refused[] = {"rank_pattern", "alpha_pattern", "modules_to_save",
                                          "layer_replication"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (json_object_object_get_ex(root, refused[i], &v) && !empty_or_null(v)) {
            err_set(err, INFERD_EUNSUPPORTED, "%s: %s is not supported", path, refused[i]);
            goto out;
        }
    if (json_object_object_get_ex(root, "base_model_name_or_path", &v) &&
        json_object_is_type(v, json_type_string))
        snprintf(pc->base_model, sizeof pc->base_model, "%s", json_object_get_string(v));
    if (!json_object_object_get_ex(root, "target_modules", &v) || empty_or_null(v)) {
        err_set(err, INFERD_EFORMAT, "%s: target_modules is missing", path);
        goto out;
    }
    if (json_object_is_type(v, json_type_string)) {
        const char *pat = json_object_get_string(v);
        size_t n = strlen(pat) + 8;
        char *anchored = malloc(n);
        if (!anchored) {
            err_set(err, INFERD_ENOMEM, "out of memory");
            goto out;
        }
        snprintf(anchored, n, "^(%s)$", pat);
        int bad = regcomp(&pc->targets.re, anchored, REG_EXTENDED | REG_NOSUB);
        free(anchored);
        if (bad) {
            err_set(err, INFERD_EFORMAT, "%s: target_modules regular expression %s does not compile",
                    path, pat);
            goto out;
        }
        pc->targets.regex = true;
    } else if (json_object_is_type(v, json_type_array)) {
        int n = (int)json_object_array_length(v);
        pc->targets.names = calloc((size_t)n, sizeof(char *));
        pc->targets.matched = calloc((size_t)n, sizeof(bool));
        if (!pc->targets.names || !pc->targets.matched) {
            err_set(err, INFERD_ENOMEM, "out of memory");
            goto out;
        }
        for (int i = 0; i < n; i++) {
            json_object *e = json_object_array_get_idx(v, (size_t)i);
            if (!json_object_is_type(e, json_type_string)) {
                err_set(err, INFERD_EFORMAT, "%s: target_modules[%d] is not a string", path, i);
                goto out;
            }
            if (!(pc->targets.names[i] = strdup(json_object_get_string(e)))) {
                err_set(err, INFERD_ENOMEM, "out of memory");
                goto out;
            }
            pc->targets.n_names = i + 1;
        }
    } else {
        err_set(err, INFERD_EFORMAT, "%s: target_modules must be a list or a string", path);
        goto out;
    }
    rc = 0;
out:
    json_object_put(root);
    return rc;
}

/* ---- adapter_model.safetensors ------------------------------------------- */

struct found {
    const struct st_tensor *a, *b; /* of one (layer, module) */
};

/* Splits a tensor name into layer, module and A/B; -1 when it is none of ours. */
static int parse_name(const struct model *m, const char *name, int *layer, enum module *mod,
                      bool *is_b)
{
    static const char root[] = "base_model.model.";
    if (strncmp(name, root, sizeof root - 1))
        return -1;
    name += sizeof root - 1;
    size_t pl = strlen(m->prefix);
    if (strncmp(name, m->prefix, pl) || strncmp(name + pl, "layers.", 7))
        return -1;
    char *end;
    long i = strtol(name + pl + 7, &end, 10);
    if (end == name + pl + 7 || *end != '.' || i < 0 || i >= m->config.n_layers)
        return -1;
    const char *rest = end + 1;
    for (int k = 0; k < N_MOD; k++) {
        size_t n = strlen(module_path[k]);
        if (strncmp(rest, module_path[k], n))
            continue;
        const char *t = rest + n;
        if (!strcmp(t, ".lora_A.weight") || !strcmp(t, ".lora_A.default.weight"))
            *is_b = false;
        else if (!strcmp(t, ".lora_B.weight") || !strcmp(t, ".lora_B.default.weight"))
            *is_b = true;
        else
            continue;
        *layer = (int)i;
        *mod = (enum module)k;
        return 0;
    }
    return -1;
}

/* The tensor as f32 on the host: rows x cols floats (caller frees), NULL when out of memory. */
static float *widen(const struct st_tensor *t)
{
    size_t n = (size_t)t->shape[0] * (size_t)t->shape[1];
    float *f = malloc(n * sizeof(float));
    if (!f)
        return NULL;
    const uint8_t *p = t->data;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == DTYPE_F32)
            memcpy(&f[i], p + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            f[i] = t->dtype == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    return f;
}

static int own(struct lora_adapter *a, void *buf, struct err *err)
{
    void **grown = realloc(a->bufs, (size_t)(a->n_bufs + 1) * sizeof *grown);
    if (!grown) {
        a->be->ops->release(a->be, buf);
        return err_set(err, INFERD_ENOMEM, "out of memory");
    }
    a->bufs = grown;
    a->bufs[a->n_bufs++] = buf;
    return 0;
}

/* Copies n host floats into new backend memory the adapter owns, rounded to bf16 (in place
 * in host) when the adapter keeps bf16. */
static int upload(struct lora_adapter *a, float *host, size_t n, void **out, struct err *err)
{
    size_t es = a->bf16 ? 2 : sizeof(float);
    if (a->bf16) {
        uint16_t *h = (uint16_t *)(void *)host; /* each 2 bytes written after its 4 are read */
        for (size_t i = 0; i < n; i++)
            h[i] = f32_to_bf16(host[i]);
    }
    void *d = a->be->ops->alloc(a->be, n * es);
    if (!d)
        return err_set(err, INFERD_ENOMEM, "out of backend memory for an adapter (%zu bytes)",
                       n * es);
    a->be->ops->to_device(a->be, d, host, n * es);
    a->ram_bytes += n * es;
    *out = d;
    return own(a, d, err);
}

/* The pairs of one (layer, module): its A and B widened and uploaded; a fused
 * module's B split into its parts' rows. */
static int mount_module(const struct model *m, struct lora_adapter *a, int layer,
                        enum module mod, const struct found *f, struct err *err)
{
    float *ha = widen(f->a), *hb = widen(f->b);
    void *da = NULL, *db = NULL;
    int rc = ha && hb ? 0 : err_set(err, INFERD_ENOMEM, "out of memory");
    if (!rc)
        rc = upload(a, ha, (size_t)f->a->shape[0] * (size_t)f->a->shape[1], &da, err);
    if (!rc)
        rc = upload(a, hb, (size_t)f->b->shape[0] * (size_t)f->b->shape[1], &db, err);
    free(ha);
    free(hb);
    if (rc)
        return rc;
    const struct model_config *c = &m->config;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    struct lora_pair p = {.a = da, .b = db, .rank = a->rank, .b_stride = a->rank,
                          .scale = a->scale, .bf16 = a->bf16};
    struct lora_pair *row = a->pairs + (size_t)layer * LORA_N_TARGETS;
    size_t es = a->bf16 ? 2 : sizeof(float);
#define PART(t, r0) (row[t] = p, row[t].b = (const uint8_t *)db + (size_t)(r0) * (size_t)a->rank * es)
    switch (mod) {
    case MOD_Q: PART(LORA_Q, 0); break;
    case MOD_K: PART(LORA_K, 0); break;
    case MOD_V: PART(LORA_V, 0); break;
    case MOD_O: PART(LORA_O, 0); break;
    case MOD_GATE: PART(LORA_GATE, 0); break;
    case MOD_UP: PART(LORA_UP, 0); break;
    case MOD_DOWN: PART(LORA_DOWN, 0); break;
    case MOD_QKV: PART(LORA_Q, 0); PART(LORA_K, q); PART(LORA_V, q + kv); break;
    case MOD_GATE_UP: PART(LORA_GATE, 0); PART(LORA_UP, c->intermediate_size); break;
    default: break;
    }
#undef PART
    a->mounted_modules++;
    return 0;
}

static int check_tensor(const char *what, const char *module, const struct st_tensor *t,
                        int64_t rows, int64_t cols, struct err *err)
{
    if (t->dtype != DTYPE_F32 && t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16)
        return err_set(err, INFERD_EFORMAT, "%s of %s: dtype %s (F32, BF16 or F16 expected)", what,
                       module, dtype_name(t->dtype));
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return err_set(err, INFERD_EFORMAT,
                       "%s of %s has shape [%lld, %lld]; the base model and r need [%lld, %lld]",
                       what, module, t->n_dims > 0 ? (long long)t->shape[0] : 0,
                       t->n_dims > 1 ? (long long)t->shape[1] : 0, (long long)rows,
                       (long long)cols);
    return 0;
}

static int load_tensors(const struct model *m, struct lora_adapter *a, struct peft_config *pc,
                        const uint8_t *file, size_t file_len, const char *path, struct err *err)
{
    struct st_header h = {0};
    int rc = st_header_parse(file, file_len, &h, err);
    if (rc < 0)
        return rc;
    const uint8_t *data = file + 8 + h.header_len;
    int n_layers = m->config.n_layers;
    struct found *found = calloc((size_t)n_layers * N_MOD, sizeof *found);
    if (!found) {
        st_header_free(&h);
        return err_set(err, INFERD_ENOMEM, "out of memory");
    }
    char full[256];
    for (int i = 0; i < h.n_tensors && !rc; i++) {
        struct st_tensor *t = &h.tensors[i];
        t->data = data + t->offset;
        int layer;
        enum module mod;
        bool is_b;
        int64_t out, in;
        if (parse_name(m, t->name, &layer, &mod, &is_b) < 0 ||
            !module_shape(m, layer, mod, &out, &in)) {
            rc = err_set(err, INFERD_EFORMAT,
                         "%s: tensor %s is not a LoRA pair of a projection this %s model has",
                         path, t->name, m->arch->name);
            break;
        }
        snprintf(full, sizeof full, "%slayers.%d.%s", m->prefix, layer, module_path[mod]);
        if (!targets_match(&pc->targets, full)) {
            rc = err_set(err, INFERD_EFORMAT, "%s: tensor %s is for %s, which target_modules leaves out",
                         path, t->name, full);
            break;
        }
        struct found *f = &found[layer * N_MOD + mod];
        if (is_b ? f->b != NULL : f->a != NULL) {
            rc = err_set(err, INFERD_EFORMAT, "%s: two lora_%c tensors for %s", path,
                         is_b ? 'B' : 'A', full);
            break;
        }
        rc = is_b ? check_tensor("lora_B", full, t, out, pc->rank, err)
                  : check_tensor("lora_A", full, t, pc->rank, in, err);
        if (is_b)
            f->b = t;
        else
            f->a = t;
    }
    /* Every module of the base that target_modules names has its pair. */
    for (int l = 0; l < n_layers && !rc; l++)
        for (int k = 0; k < N_MOD && !rc; k++) {
            int64_t out, in;
            if (!module_shape(m, l, (enum module)k, &out, &in))
                continue;
            snprintf(full, sizeof full, "%slayers.%d.%s", m->prefix, l, module_path[k]);
            struct found *f = &found[l * N_MOD + k];
            if (!targets_match(&pc->targets, full) && !f->a && !f->b)
                continue;
            if (!f->a || !f->b)
                rc = err_set(err, INFERD_EFORMAT, "%s: %s has no lora_%c tensor", path, full,
                             f->a ? 'B' : 'A');
            else
                rc = mount_module(m, a, l, (enum module)k, f, err);
        }
    for (int i = 0; i < pc->targets.n_names && !rc; i++)
        if (!pc->targets.matched[i])
            rc = err_set(err, INFERD_EFORMAT,
                         "target module %s names no projection of this %s model", pc->targets.names[i],
                         m->arch->name);
    if (!rc && a->mounted_modules == 0)
        rc = err_set(err, INFERD_EFORMAT, "%s: target_modules matches no projection of this %s model",
                     path, m->arch->name);
    free(found);
    st_header_free(&h);
    return rc;
}

int lora_load(const struct model *m, const char *dir, struct lora_adapter **out, struct err *err)
{
    if (!m->backend->ops->lora)
        return err_set(err, INFERD_EUNSUPPORTED, "the %s backend cannot run adapters",
                       m->backend->ops->name);
    struct peft_config pc = {0};
    int rc = parse_config(dir, &pc, err);
    if (rc < 0) {
        targets_free(&pc.targets);
        return rc;
    }
    struct lora_adapter *a = calloc(1, sizeof *a);
    if (a)
        a->pairs = calloc((size_t)m->config.n_layers * LORA_N_TARGETS, sizeof *a->pairs);
    if (!a || !a->pairs) {
        free(a);
        targets_free(&pc.targets);
        return err_set(err, INFERD_ENOMEM, "out of memory");
    }
    atomic_init(&a->refs, 1);
    a->be = m->backend;
    a->rank = pc.rank;
    a->alpha = pc.alpha;
    a->rslora = pc.rslora;
    a->scale = pc.rslora ? pc.alpha / sqrtf((float)pc.rank) : pc.alpha / (float)pc.rank;
    a->n_layers = m->config.n_layers;
    /* FAST mode over bf16 weights rounds the projections' inputs to bf16 already: the adapter
     * in bf16 halves what each step reads of it (at 16 distinct adapters in a batch, as much
     * as a small model's own weights) */
    a->bf16 = m->backend->mode == COMPUTE_FAST && m->config.n_layers > 0 &&
              (m->weights.layers[0].wo.dtype == DTYPE_BF16 ||
               m->weights.layers[0].wo.dtype == DTYPE_BF16_P32);
    snprintf(a->base_model, sizeof a->base_model, "%s", pc.base_model);

    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0 || sb.st_size < 8) {
        rc = err_set(err, INFERD_EIO, "%s: cannot read it", path);
    } else {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = err_set(err, INFERD_EIO, "%s: cannot map it", path);
        } else {
            a->file_bytes = (uint64_t)sb.st_size;
            a->digest = hash_fnv1a(HASH_FNV_OFFSET, map, (size_t)sb.st_size);
            a->digest = hash_fnv1a(a->digest, &a->scale, sizeof a->scale);
            a->digest = hash_fnv1a(a->digest, &a->bf16, sizeof a->bf16);
            rc = load_tensors(m, a, &pc, map, (size_t)sb.st_size, path, err);
            munmap(map, (size_t)sb.st_size);
        }
    }
    if (fd >= 0)
        close(fd);
    targets_free(&pc.targets);
    if (rc < 0) {
        lora_release(a);
        return rc;
    }
    *out = a;
    return 0;
}

void lora_retain(struct lora_adapter *a)
{
    atomic_fetch_add(&a->refs, 1);
}

void lora_release(struct lora_adapter *a)
{
    if (!a || atomic_fetch_sub(&a->refs, 1) != 1)
        return;
    for (int i = 0; i < a->n_bufs; i++)
        a->be->ops->release(a->be, a->bufs[i]);
    free(a->bufs);
    free(a->pairs);
    free(a);
}

/* ---- merging ------------------------------------------------------------- */

static int model_own(struct model *m, void *p, struct err *err)
{
    if (m->n_owned_buffers == m->cap_owned_buffers) {
        int cap = m->cap_owned_buffers ? m->cap_owned_buffers * 2 : 64;
        void **b = realloc(m->owned_buffers, (size_t)cap * sizeof *b);
        if (!b) {
            m->backend->ops->release(m->backend, p);
            return err_set(err, INFERD_ENOMEM, "out of memory");
        }
        m->owned_buffers = b;
        m->cap_owned_buffers = cap;
    }
    m->owned_buffers[m->n_owned_buffers++] = p;
    return 0;
}

static float *to_host_floats(struct backend *be, const void *src, size_t n, enum dtype dt)
{
    size_t es = dt == DTYPE_F32 ? 4 : 2;
    void *raw = malloc(n * es);
    float *f = malloc(n * sizeof(float));
    if (!raw || !f) {
        free(raw);
        free(f);
        return NULL;
    }
    be->ops->to_host(be, raw, src, n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == DTYPE_F32)
            memcpy(&f[i], (uint8_t *)raw + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, (uint8_t *)raw + 2 * i, 2);
            f[i] = dt == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    free(raw);
    return f;
}

/* w's elements as f32, row-major (a matrix in panels unpacked). */
static float *matrix_to_host_floats(struct backend *be, const struct weight_matrix *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    if (w->dtype != DTYPE_BF16_P32)
        return to_host_floats(be, w->data, n, w->dtype);
    uint64_t bytes = panels_bytes(w->rows, w->cols);
    uint16_t *packed = malloc(bytes), *rows = malloc(n * 2 + 2);
    float *f = packed && rows ? malloc(n * sizeof(float)) : NULL;
    if (f) {
        be->ops->to_host(be, packed, w->data, bytes);
        panels_unpack_rows(packed, w->cols, 0, w->rows, rows);
        for (size_t i = 0; i < n; i++)
            f[i] = bf16_to_f32(rows[i]);
    }
    free(packed);
    free(rows);
    return f;
}

/* w := w + scale * B A in f32, as a new F32 matrix the model owns. */
static int merge_one(struct model *m, struct weight_matrix *w, const struct lora_pair *p,
                     struct err *err)
{
    struct backend *be = m->backend;
    if (w->dtype != DTYPE_F32 && w->dtype != DTYPE_BF16 && w->dtype != DTYPE_F16 &&
        w->dtype != DTYPE_BF16_P32)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "cannot merge an adapter into %s weights (dense weights only)",
                       dtype_name(w->dtype));
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols, r = (size_t)p->rank;
    enum dtype pdt = p->bf16 ? DTYPE_BF16 : DTYPE_F32;
    size_t es = p->bf16 ? 2 : sizeof(float);
    float *hw = matrix_to_host_floats(be, w);
    float *ha = to_host_floats(be, p->a, r * cols, pdt); /* the values the op reads */
    float *hb = malloc(rows * r * sizeof(float));
    int rc = 0;
    if (!hw || !ha || !hb) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory merging an adapter");
        goto out;
    }
    for (size_t i = 0; i < rows && rc == 0; i++) {
        float *row = to_host_floats(be, (const uint8_t *)p->b + i * (size_t)p->b_stride * es, r, pdt);
        if (!row)
            rc = err_set(err, INFERD_ENOMEM, "out of memory merging an adapter");
        else
            memcpy(hb + i * r, row, r * sizeof(float));
        free(row);
    }
    if (rc)
        goto out;
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < cols; c++) {
            float d = 0;
            for (size_t k = 0; k < r; k++)
                d += hb[i * r + k] * ha[k * cols + c];
            hw[i * cols + c] += p->scale * d;
        }
    float *dev = be->ops->alloc(be, rows * cols * sizeof(float));
    if (!dev) {
        rc = err_set(err, INFERD_ENOMEM, "out of backend memory merging an adapter");
        goto out;
    }
    be->ops->to_device(be, dev, hw, rows * cols * sizeof(float));
    if ((rc = model_own(m, dev, err)) == 0)
        *w = (struct weight_matrix){.dtype = DTYPE_F32, .rows = w->rows, .cols = w->cols, .data = dev};
out:
    free(hw);
    free(ha);
    free(hb);
    return rc;
}

int lora_merge(struct model *m, const struct lora_adapter *a, struct err *err)
{
    if (a->n_layers != m->config.n_layers)
        return err_set(err, INFERD_EINVAL, "the adapter was loaded for another model");
    for (int l = 0; l < a->n_layers; l++) {
        struct layer_weights *lw = &m->weights.layers[l];
        struct weight_matrix *w[LORA_N_TARGETS] = {&lw->wq, &lw->wk,     &lw->wv,    &lw->wo,
                                                   &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            const struct lora_pair *p = &a->pairs[(size_t)l * LORA_N_TARGETS + t];
            if (!p->a)
                continue;
            int rc = merge_one(m, w[t], p, err);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}
