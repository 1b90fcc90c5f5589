/* model/whisper.c — Whisper's weights and its two halves as transformers defines them: the encoder
 * (two convolutions + GELU, sinusoidal positions, pre-LN layers) once per 30 s window, the decoder
 * (learned positions, causal self-attention over its own K/V, cross-attention over the window's
 * cached K/V, the head tied to the token embedding) a few tokens at a time. */
#include "model/whisper.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/file.h"
#include "base/json.h"
#include "model/safetensors.h"

#define CONFIG_CAP (1u << 20)
#define NAME_CAP 160

/* ---- config --------------------------------------------------------------- */

static int read_id_list(const struct json_reader *root, const char *key, int32_t *out, int *n,
                        int vocab)
{
    struct json_reader arr;
    size_t len = 0;
    int rc = json_read_array(root, key, JSON_OPTIONAL, &arr, &len);
    if (rc < 0)
        return rc;
    if (len > WHISPER_MAX_SUPPRESS)
        return json_reader_fail(&arr, INFERD_ERANGE, "has %zu entries (at most %d)", len,
                                WHISPER_MAX_SUPPRESS);
    *n = 0;
    for (size_t i = 0; i < len; i++) {
        struct json_reader e = json_reader_element(&arr, i);
        int id;
        if ((rc = json_read_int(&e, NULL, JSON_REQUIRED, 0, vocab - 1, &id)) < 0)
            return rc;
        out[(*n)++] = id;
    }
    return 0;
}

static int parse_json(const char *text, size_t len, const char *name, json_object **out,
                      struct err *err)
{
    int rc = json_text_parse(text, len, 0, false, out, err);
    if (rc < 0)
        return err_wrap(err, "%s is not valid JSON", name);
    if (!*out || !json_object_is_type(*out, json_type_object)) {
        json_object_put(*out);
        return err_set(err, INFERD_EFORMAT, "%s is not a JSON object", name);
    }
    return 0;
}

int whisper_config_parse(const char *text, size_t len, struct whisper_config *c, struct err *err)
{
    memset(c, 0, sizeof *c);
    json_object *root;
    int rc = parse_json(text, len, "config.json", &root, err);
    if (rc < 0)
        return rc;
    struct json_doc doc = {.err = err, .name = "config.json", .prefix = "config.json",
                           .flags = JSON_INTEGRAL_DOUBLES};
    struct json_reader r = json_reader_root(&doc, root);
    const char *type = NULL;
    c->max_source_positions = 1500;
    c->max_target_positions = 448;
    c->n_mels = 80;
    if ((rc = json_read_str(&r, "model_type", JSON_REQUIRED, &type, NULL)) < 0)
        goto out;
    if (strcmp(type, "whisper")) {
        rc = err_set(err, INFERD_EUNSUPPORTED, "config.json: model_type '%s' is not whisper",
                     type);
        goto out;
    }
    const char *act = "gelu";
    if ((rc = json_read_int(&r, "d_model", JSON_REQUIRED, 8, 8192, &c->d_model)) < 0 ||
        (rc = json_read_int(&r, "vocab_size", JSON_REQUIRED, 1, 1 << 20, &c->vocab_size)) < 0 ||
        (rc = json_read_int(&r, "num_mel_bins", JSON_OPTIONAL, 1, 256, &c->n_mels)) < 0 ||
        (rc = json_read_int(&r, "encoder_layers", JSON_REQUIRED, 1, 128, &c->encoder_layers)) < 0 ||
        (rc = json_read_int(&r, "decoder_layers", JSON_REQUIRED, 1, 128, &c->decoder_layers)) < 0 ||
        (rc = json_read_int(&r, "encoder_attention_heads", JSON_REQUIRED, 1, 256,
                            &c->encoder_heads)) < 0 ||
        (rc = json_read_int(&r, "decoder_attention_heads", JSON_REQUIRED, 1, 256,
                            &c->decoder_heads)) < 0 ||
        (rc = json_read_int(&r, "encoder_ffn_dim", JSON_REQUIRED, 1, 65536, &c->encoder_ffn)) < 0 ||
        (rc = json_read_int(&r, "decoder_ffn_dim", JSON_REQUIRED, 1, 65536, &c->decoder_ffn)) < 0 ||
        (rc = json_read_int(&r, "max_source_positions", JSON_OPTIONAL, 1, 1 << 16,
                            &c->max_source_positions)) < 0 ||
        (rc = json_read_int(&r, "max_target_positions", JSON_OPTIONAL, 4, 1 << 16,
                            &c->max_target_positions)) < 0 ||
        (rc = json_read_bool(&r, "scale_embedding", JSON_OPTIONAL, &c->scale_embedding)) < 0 ||
        (rc = json_read_str(&r, "activation_function", JSON_OPTIONAL, &act, NULL)) < 0)
        goto out;
    if (c->scale_embedding) {
        rc = err_set(err, INFERD_EUNSUPPORTED,
                     "config.json: scale_embedding true is not supported (no release sets it)");
        goto out;
    }
    if (strcmp(act, "gelu")) {
        rc = err_set(err, INFERD_EUNSUPPORTED,
                     "config.json: activation_function '%s' (only gelu is supported)", act);
        goto out;
    }
    if (c->d_model % c->encoder_heads || c->d_model % c->decoder_heads) {
        rc = err_set(err, INFERD_EFORMAT,
                     "config.json: d_model %d is not a multiple of the heads (%d, %d)", c->d_model,
                     c->encoder_heads, c->decoder_heads);
        goto out;
    }
    c->multilingual = c->vocab_size >= 51865;
    /* Older checkpoints keep the decoding lists in config.json; generation_config.json overrides. */
    if ((rc = read_id_list(&r, "suppress_tokens", c->suppress, &c->n_suppress, c->vocab_size)) < 0 ||
        (rc = read_id_list(&r, "begin_suppress_tokens", c->begin_suppress, &c->n_begin_suppress,
                           c->vocab_size)) < 0)
        goto out;
out:
    json_object_put(root);
    return rc;
}

static int parse_generation_config(const char *dir, struct whisper_config *c, struct err *err)
{
    char path[4200], *text = NULL;
    size_t len;
    bool missing = false;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    int rc = file_read_all(path, CONFIG_CAP, &text, &len, &missing, err);
    if (rc < 0 || missing)
        return rc;
    json_object *root;
    if ((rc = parse_json(text, len, "generation_config.json", &root, err)) < 0) {
        free(text);
        return rc;
    }
    struct json_doc doc = {.err = err, .name = "generation_config.json",
                           .prefix = "generation_config.json", .flags = JSON_INTEGRAL_DOUBLES};
    struct json_reader r = json_reader_root(&doc, root);
    rc = json_read_bool(&r, "is_multilingual", JSON_OPTIONAL, &c->multilingual);
    if (rc == 0 && json_reader_has(&r, "suppress_tokens"))
        rc = read_id_list(&r, "suppress_tokens", c->suppress, &c->n_suppress, c->vocab_size);
    if (rc == 0 && json_reader_has(&r, "begin_suppress_tokens"))
        rc = read_id_list(&r, "begin_suppress_tokens", c->begin_suppress, &c->n_begin_suppress,
                          c->vocab_size);
    json_object_put(root);
    free(text);
    return rc;
}

/* ---- weights ---------------------------------------------------------------- */

static float *model_buffer(struct whisper_model *m, size_t floats)
{
    if (m->n_buffers == m->cap_buffers) {
        int cap = m->cap_buffers ? m->cap_buffers * 2 : 64;
        void **b = realloc(m->buffers, (size_t)cap * sizeof *b);
        if (!b)
            return NULL;
        m->buffers = b;
        m->cap_buffers = cap;
    }
    float *p = m->backend->ops->alloc(m->backend, floats * sizeof(float));
    if (p)
        m->buffers[m->n_buffers++] = p;
    return p;
}

/* Tensor name of exactly the shape given (dims with 0 end the shape), as f32 in
 * backend memory. */
static int load_tensor(struct whisper_model *m, struct st_set *set, const char *name,
                       int64_t d0, int64_t d1, int64_t d2, float **out, struct err *err)
{
    const struct st_tensor *t = st_set_find(set, name);
    if (!t)
        return err_set(err, INFERD_EFORMAT, "tensor %s is missing", name);
    int64_t want[3] = {d0, d1, d2};
    int n_want = d2 ? 3 : d1 ? 2 : 1;
    bool ok = t->n_dims == n_want;
    for (int i = 0; ok && i < n_want; i++)
        ok = t->shape[i] == want[i];
    if (!ok)
        return err_set(err, INFERD_EFORMAT, "tensor %s has the wrong shape (%d dims, [%lld, ...])",
                       name, t->n_dims, t->n_dims ? (long long)t->shape[0] : 0LL);
    size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1) * (size_t)(d2 ? d2 : 1);
    float *host = malloc(n * sizeof *host);
    if (!host)
        return err_set(err, INFERD_ENOMEM, "out of memory converting %s", name);
    const uint8_t *src = t->data;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == DTYPE_F32) {
            memcpy(&host[i], src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            host[i] = t->dtype == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    float *dev = model_buffer(m, n);
    if (!dev) {
        free(host);
        return err_set(err, INFERD_ENOMEM, "out of backend memory for %s (%zu floats)", name, n);
    }
    m->backend->ops->to_device(m->backend, dev, host, n * sizeof *host);
    free(host);
    m->weight_bytes += n * sizeof(float);
    *out = dev;
    return 0;
}

static int load_attn(struct whisper_model *m, struct st_set *set, const char *prefix,
                     const char *block, const char *norm, struct whisper_attn_w *a, struct err *err)
{
    int64_t d = m->config.d_model;
    char n[NAME_CAP];
    int rc;
#define T(suffix, d0, d1, out) \
    (snprintf(n, sizeof n, "%s.%s", prefix, suffix), load_tensor(m, set, n, d0, d1, 0, out, err))
    char b[96];
#define B(what) (snprintf(b, sizeof b, "%s.%s", block, what), b)
    if ((rc = T(B("q_proj.weight"), d, d, &a->q_w)) || (rc = T(B("q_proj.bias"), d, 0, &a->q_b)) ||
        (rc = T(B("k_proj.weight"), d, d, &a->k_w)) || (rc = T(B("v_proj.weight"), d, d, &a->v_w)) ||
        (rc = T(B("v_proj.bias"), d, 0, &a->v_b)) || (rc = T(B("out_proj.weight"), d, d, &a->o_w)) ||
        (rc = T(B("out_proj.bias"), d, 0, &a->o_b)))
        return rc;
    snprintf(b, sizeof b, "%s.weight", norm);
    if ((rc = T(b, d, 0, &a->ln_w)))
        return rc;
    snprintf(b, sizeof b, "%s.bias", norm);
    return T(b, d, 0, &a->ln_b);
}

static int load_layer(struct whisper_model *m, struct st_set *set, bool decoder, int i,
                      struct whisper_layer_w *L, struct err *err)
{
    const struct whisper_config *c = &m->config;
    int64_t d = c->d_model, ffn = decoder ? c->decoder_ffn : c->encoder_ffn;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "model.%s.layers.%d", decoder ? "decoder" : "encoder", i);
    int rc = load_attn(m, set, prefix, "self_attn", "self_attn_layer_norm", &L->self, err);
    if (rc == 0 && decoder)
        rc = load_attn(m, set, prefix, "encoder_attn", "encoder_attn_layer_norm", &L->cross, err);
    if (rc)
        return rc;
    char n[NAME_CAP];
    if ((rc = T("fc1.weight", ffn, d, &L->fc1_w)) || (rc = T("fc1.bias", ffn, 0, &L->fc1_b)) ||
        (rc = T("fc2.weight", d, ffn, &L->fc2_w)) || (rc = T("fc2.bias", d, 0, &L->fc2_b)) ||
        (rc = T("final_layer_norm.weight", d, 0, &L->ln_w)) ||
        (rc = T("final_layer_norm.bias", d, 0, &L->ln_b)))
        return rc;
#undef T
#undef B
    return 0;
}

/* Whisper's sinusoids(length, channels): [sin(t * f_i), cos(t * f_i)] with
 * f_i = exp(-i * ln(10000) / (channels / 2 - 1)), computed as torch does in f32. */
static int sinusoids(struct whisper_model *m, int length, int channels, float **out,
                     struct err *err)
{
    int half = channels / 2;
    float *host = malloc((size_t)length * channels * sizeof *host);
    float *dev = host ? model_buffer(m, (size_t)length * channels) : NULL;
    if (!dev) {
        free(host);
        return err_set(err, INFERD_ENOMEM, "out of memory for the encoder positions");
    }
    float inc = logf(10000.0f) / (float)(half - 1 > 0 ? half - 1 : 1);
    for (int t = 0; t < length; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)t * expf(-inc * (float)i);
            host[(size_t)t * channels + i] = sinf(a);
            host[(size_t)t * channels + half + i] = cosf(a);
        }
    m->backend->ops->to_device(m->backend, dev, host, (size_t)length * channels * sizeof *host);
    free(host);
    *out = dev;
    return 0;
}

static int read_config(const char *dir, struct whisper_config *c, struct err *err)
{
    char path[4200], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = file_read_all(path, CONFIG_CAP, &text, &len, NULL, err);
    if (rc < 0)
        return rc;
    rc = whisper_config_parse(text, len, c, err);
    free(text);
    return rc < 0 ? rc : parse_generation_config(dir, c, err);
}

int whisper_load(const char *dir, struct backend *be, struct whisper_model **out, struct err *err)
{
    *out = NULL;
    const struct backend_ops *op = be->ops;
    if (!op->layer_norm || !op->gelu || !op->conv1d || !op->attention_dense)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "the %s backend lacks the encoder-decoder ops Whisper needs", op->name);
    struct whisper_model *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(err, INFERD_ENOMEM, "out of memory loading %s", dir);
    m->backend = be;
    struct st_set set = {0};
    int rc = read_config(dir, &m->config, err);
    const struct whisper_config *c = &m->config;
    if (rc == 0)
        rc = st_set_open(dir, &set, err);
    if (rc == 0) {
        m->enc = calloc((size_t)c->encoder_layers, sizeof *m->enc);
        m->dec = calloc((size_t)c->decoder_layers, sizeof *m->dec);
        if (!m->enc || !m->dec)
            rc = err_set(err, INFERD_ENOMEM, "out of memory loading %s", dir);
    }
    int64_t d = c->d_model;
    if (rc == 0 &&
        ((rc = load_tensor(m, &set, "model.encoder.conv1.weight", d, c->n_mels, 3, &m->conv1_w, err)) ||
         (rc = load_tensor(m, &set, "model.encoder.conv1.bias", d, 0, 0, &m->conv1_b, err)) ||
         (rc = load_tensor(m, &set, "model.encoder.conv2.weight", d, d, 3, &m->conv2_w, err)) ||
         (rc = load_tensor(m, &set, "model.encoder.conv2.bias", d, 0, 0, &m->conv2_b, err))))
        goto done;
    if (rc == 0)
        rc = st_set_find(&set, "model.encoder.embed_positions.weight")
                 ? load_tensor(m, &set, "model.encoder.embed_positions.weight",
                               c->max_source_positions, d, 0, &m->enc_pos, err)
                 : sinusoids(m, c->max_source_positions, (int)d, &m->enc_pos, err);
    for (int i = 0; rc == 0 && i < c->encoder_layers; i++)
        rc = load_layer(m, &set, false, i, &m->enc[i], err);
    for (int i = 0; rc == 0 && i < c->decoder_layers; i++)
        rc = load_layer(m, &set, true, i, &m->dec[i], err);
    if (rc == 0 &&
        ((rc = load_tensor(m, &set, "model.encoder.layer_norm.weight", d, 0, 0, &m->enc_ln_w, err)) ||
         (rc = load_tensor(m, &set, "model.encoder.layer_norm.bias", d, 0, 0, &m->enc_ln_b, err)) ||
         (rc = load_tensor(m, &set, "model.decoder.layer_norm.weight", d, 0, 0, &m->dec_ln_w, err)) ||
         (rc = load_tensor(m, &set, "model.decoder.layer_norm.bias", d, 0, 0, &m->dec_ln_b, err)) ||
         (rc = load_tensor(m, &set, "model.decoder.embed_tokens.weight", c->vocab_size, d, 0,
                           &m->embed, err)) ||
         (rc = load_tensor(m, &set, "model.decoder.embed_positions.weight",
                           c->max_target_positions, d, 0, &m->dec_pos, err))))
        goto done;
    /* proj_out is the embedding (tied); a checkpoint that stores it stores the same matrix. */
    const struct st_tensor *head = rc == 0 ? st_set_find(&set, "proj_out.weight") : NULL;
    if (head && (head->n_dims != 2 || head->shape[0] != c->vocab_size || head->shape[1] != d))
        rc = err_set(err, INFERD_EFORMAT, "tensor proj_out.weight has the wrong shape");
    for (int i = 0; rc == 0 && i < set.n_tensors; i++)
        if (!set.used[i])
            rc = err_set(err, INFERD_EFORMAT, "unexpected tensor %s in %s", set.tensors[i].name,
                         dir);
done:
    st_set_close(&set);
    if (rc < 0) {
        whisper_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void whisper_free(struct whisper_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_buffers; i++)
        m->backend->ops->release(m->backend, m->buffers[i]);
    free(m->buffers);
    free(m->enc);
    free(m->dec);
    free(m);
}

/* ---- state --------------------------------------------------------------------- */

int whisper_state_create(const struct whisper_model *m, struct whisper_state **out,
                         struct err *err)
{
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    struct whisper_state *st = calloc(1, sizeof *st);
    if (!st)
        return err_set(err, INFERD_ENOMEM, "out of memory for a Whisper state");
    st->m = m;
    size_t d = (size_t)c->d_model, src = (size_t)c->max_source_positions,
           tgt = (size_t)c->max_target_positions, L = (size_t)c->decoder_layers;
    size_t ffn = (size_t)(c->encoder_ffn > c->decoder_ffn ? c->encoder_ffn : c->decoder_ffn);
    size_t wide = d > (size_t)c->n_mels ? d : (size_t)c->n_mels;
    struct { float **p; size_t n; } bufs[] = {
        {&st->cross_k, L * src * d}, {&st->cross_v, L * src * d},
        {&st->self_k, L * tgt * d},  {&st->self_v, L * tgt * d},
        {&st->enc_out, src * d},     {&st->mel, 2 * src * wide}, {&st->conv, 2 * src * d},
        {&st->x, src * d}, {&st->xn, src * d}, {&st->q, src * d}, {&st->k, src * d},
        {&st->v, src * d}, {&st->attn, src * d}, {&st->ffn, src * ffn},
        {&st->logits, (size_t)c->vocab_size},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i].p = be->ops->alloc(be, bufs[i].n * sizeof(float)))) {
            whisper_state_free(st);
            return err_set(err, INFERD_ENOMEM, "out of backend memory for a Whisper state");
        }
    *out = st;
    return 0;
}

void whisper_state_free(struct whisper_state *st)
{
    if (!st)
        return;
    struct backend *be = st->m->backend;
    float *bufs[] = {st->cross_k, st->cross_v, st->self_k, st->self_v, st->enc_out, st->mel,
                     st->conv, st->x, st->xn, st->q, st->k, st->v, st->attn, st->ffn, st->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->release(be, bufs[i]);
    free(st);
}

static struct weight_matrix wm(const float *p, int64_t rows, int64_t cols)
{
    return (struct weight_matrix){.dtype = DTYPE_F32, .rows = rows, .cols = cols, .data = p};
}

/* LN -> fc1 -> GELU -> fc2 -> residual, over n rows of st->x. */
static void mlp_block(struct whisper_state *st, const struct whisper_layer_w *L, int ffn, int n)
{
    struct backend *be = st->m->backend;
    const struct backend_ops *op = be->ops;
    int64_t d = st->m->config.d_model;
    op->layer_norm(be, st->x, L->ln_w, L->ln_b, n, d, 1e-5f, st->xn);
    struct weight_matrix w1 = wm(L->fc1_w, ffn, d), w2 = wm(L->fc2_w, d, ffn);
    op->matmul(be, st->xn, n, &w1, L->fc1_b, st->ffn);
    op->gelu(be, st->ffn, (int64_t)n * ffn);
    op->matmul(be, st->ffn, n, &w2, L->fc2_b, st->attn);
    op->add(be, st->x, st->attn, (int64_t)n * d);
}

/* LN -> q, and k/v into k_out/v_out (rows from kv_in when cross is false,
 * already there when it is true) -> attention -> out_proj -> residual. */
static void attn_block(struct whisper_state *st, const struct whisper_attn_w *a, int heads, int n,
                       const float *k, const float *v, int64_t n_kv, int64_t causal)
{
    struct backend *be = st->m->backend;
    const struct backend_ops *op = be->ops;
    int64_t d = st->m->config.d_model;
    struct weight_matrix wq = wm(a->q_w, d, d), wo = wm(a->o_w, d, d);
    op->matmul(be, st->xn, n, &wq, a->q_b, st->q);
    int hd = (int)(d / heads);
    op->attention_dense(be, st->q, n, k, v, n_kv, d, heads, hd, 1.0f / sqrtf((float)hd), causal,
                        st->attn);
    op->matmul(be, st->attn, n, &wo, a->o_b, st->q);
    op->add(be, st->x, st->q, (int64_t)n * d);
}

int whisper_encode(struct whisper_state *st, const float *mel, struct err *err)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    int64_t d = c->d_model, frames = 2 * (int64_t)c->max_source_positions,
            src = c->max_source_positions;
    /* the features time-major, as the convolution reads them */
    float *t_major = malloc((size_t)frames * c->n_mels * sizeof *t_major);
    if (!t_major)
        return err_set(err, INFERD_ENOMEM, "out of memory for the encoder input");
    for (int64_t t = 0; t < frames; t++)
        for (int b = 0; b < c->n_mels; b++)
            t_major[t * c->n_mels + b] = mel[(size_t)b * frames + t];
    op->to_device(be, st->mel, t_major, (size_t)frames * c->n_mels * sizeof *t_major);
    free(t_major);

    struct weight_matrix w1 = wm(m->conv1_w, d, (int64_t)c->n_mels * 3), w2 = wm(m->conv2_w, d, d * 3);
    op->conv1d(be, st->mel, frames, c->n_mels, &w1, m->conv1_b, 3, 1, 1, st->conv);
    op->gelu(be, st->conv, frames * d);
    op->conv1d(be, st->conv, frames, d, &w2, m->conv2_b, 3, 2, 1, st->x);
    op->gelu(be, st->x, src * d);
    op->add(be, st->x, m->enc_pos, src * d);
    for (int i = 0; i < c->encoder_layers; i++) {
        const struct whisper_layer_w *L = &m->enc[i];
        struct weight_matrix wk = wm(L->self.k_w, d, d), wv = wm(L->self.v_w, d, d);
        op->layer_norm(be, st->x, L->self.ln_w, L->self.ln_b, src, d, 1e-5f, st->xn);
        op->matmul(be, st->xn, src, &wk, NULL, st->k);
        op->matmul(be, st->xn, src, &wv, L->self.v_b, st->v);
        attn_block(st, &L->self, c->encoder_heads, (int)src, st->k, st->v, src, -1);
        mlp_block(st, L, c->encoder_ffn, (int)src);
    }
    op->layer_norm(be, st->x, m->enc_ln_w, m->enc_ln_b, src, d, 1e-5f, st->enc_out);
    /* every decoder layer's view of this window, once */
    for (int i = 0; i < c->decoder_layers; i++) {
        const struct whisper_layer_w *L = &m->dec[i];
        struct weight_matrix wk = wm(L->cross.k_w, d, d), wv = wm(L->cross.v_w, d, d);
        op->matmul(be, st->enc_out, src, &wk, NULL, st->cross_k + (size_t)i * src * d);
        op->matmul(be, st->enc_out, src, &wv, L->cross.v_b, st->cross_v + (size_t)i * src * d);
    }
    st->n_past = 0;
    return op->status ? op->status(be, err) : 0;
}

int whisper_encoder_output(struct whisper_state *st, float *out, struct err *err)
{
    const struct whisper_config *c = &st->m->config;
    struct backend *be = st->m->backend;
    be->ops->to_host(be, out, st->enc_out,
                     (size_t)c->max_source_positions * c->d_model * sizeof(float));
    return be->ops->status ? be->ops->status(be, err) : 0;
}

int whisper_decode(struct whisper_state *st, const int32_t *tokens, int n, float *logits,
                   struct err *err)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    int64_t d = c->d_model, tgt = c->max_target_positions, src = c->max_source_positions;
    if (n <= 0 || st->n_past + n > tgt)
        return err_set(err, INFERD_ERANGE, "%d decoder positions past %d (at most %lld)", n,
                       st->n_past, (long long)tgt);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return err_set(err, INFERD_EINVAL, "token %d outside the vocabulary of %d", tokens[i],
                           c->vocab_size);
    struct weight_matrix emb = wm(m->embed, c->vocab_size, d);
    op->embed(be, &emb, tokens, n, st->x);
    op->add(be, st->x, m->dec_pos + (size_t)st->n_past * d, (int64_t)n * d);
    for (int i = 0; i < c->decoder_layers; i++) {
        const struct whisper_layer_w *L = &m->dec[i];
        float *sk = st->self_k + (size_t)i * tgt * d, *sv = st->self_v + (size_t)i * tgt * d;
        struct weight_matrix wk = wm(L->self.k_w, d, d), wv = wm(L->self.v_w, d, d);
        op->layer_norm(be, st->x, L->self.ln_w, L->self.ln_b, n, d, 1e-5f, st->xn);
        op->matmul(be, st->xn, n, &wk, NULL, sk + (size_t)st->n_past * d);
        op->matmul(be, st->xn, n, &wv, L->self.v_b, sv + (size_t)st->n_past * d);
        attn_block(st, &L->self, c->decoder_heads, n, sk, sv, st->n_past + n, st->n_past);
        op->layer_norm(be, st->x, L->cross.ln_w, L->cross.ln_b, n, d, 1e-5f, st->xn);
        attn_block(st, &L->cross, c->decoder_heads, n, st->cross_k + (size_t)i * src * d,
                   st->cross_v + (size_t)i * src * d, src, -1);
        mlp_block(st, L, c->decoder_ffn, n);
    }
    st->n_past += n;
    const float *last = st->x + (size_t)(n - 1) * d;
    op->layer_norm(be, last, m->dec_ln_w, m->dec_ln_b, 1, d, 1e-5f, st->xn);
    op->matmul(be, st->xn, 1, &emb, NULL, st->logits);
    op->to_host(be, logits, st->logits, (size_t)c->vocab_size * sizeof(float));
    return op->status ? op->status(be, err) : 0;
}

void whisper_rewind(struct whisper_state *st, int n)
{
    if (n < st->n_past)
        st->n_past = n < 0 ? 0 : n;
}
