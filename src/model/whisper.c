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

/* [[layer, head], ...] within the decoder's shape. */
static int read_alignment_heads(const struct json_reader *root, struct whisper_config *c)
{
    struct json_reader arr;
    size_t len = 0;
    int rc = json_read_array(root, "alignment_heads", JSON_REQUIRED, &arr, &len);
    if (rc < 0)
        return rc;
    if (len > WHISPER_MAX_SUPPRESS)
        return json_reader_fail(&arr, INFERD_ERANGE, "has %zu pairs (at most %d)", len,
                                WHISPER_MAX_SUPPRESS);
    c->n_alignment_heads = 0;
    for (size_t i = 0; i < len; i++) {
        struct json_reader el = json_reader_element(&arr, i), pair, e;
        size_t n = 0;
        if ((rc = json_read_array(&el, NULL, JSON_REQUIRED, &pair, &n)) < 0)
            return rc;
        if (n != 2)
            return json_reader_fail(&pair, INFERD_EFORMAT, "is not a [layer, head] pair");
        int layer, head;
        e = json_reader_element(&pair, 0);
        if ((rc = json_read_int(&e, NULL, JSON_REQUIRED, 0, c->decoder_layers - 1, &layer)) < 0)
            return rc;
        e = json_reader_element(&pair, 1);
        if ((rc = json_read_int(&e, NULL, JSON_REQUIRED, 0, c->decoder_heads - 1, &head)) < 0)
            return rc;
        c->alignment_heads[2 * c->n_alignment_heads] = layer;
        c->alignment_heads[2 * c->n_alignment_heads + 1] = head;
        c->n_alignment_heads++;
    }
    return 0;
}

/* Every head of the last half of the decoder layers, as many as fit. */
static void default_alignment_heads(struct whisper_config *c)
{
    c->n_alignment_heads = 0;
    for (int l = c->decoder_layers / 2; l < c->decoder_layers; l++)
        for (int h = 0; h < c->decoder_heads && c->n_alignment_heads < WHISPER_MAX_SUPPRESS; h++) {
            c->alignment_heads[2 * c->n_alignment_heads] = l;
            c->alignment_heads[2 * c->n_alignment_heads + 1] = h;
            c->n_alignment_heads++;
        }
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
    if (rc == 0 && json_reader_has(&r, "alignment_heads"))
        rc = read_alignment_heads(&r, c);
    if (rc == 0)
        rc = json_read_int(&r, "max_previous_text_tokens", JSON_OPTIONAL, 0,
                           c->max_target_positions / 2 - 1, &c->max_previous_text);
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
    if (rc == 0)
        default_alignment_heads(c);
    c->max_previous_text = c->max_target_positions / 2 - 1;
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

/* The self K/V of n_seqs sequences (and the spare pair beam reordering writes into). */
static int alloc_self_kv(struct whisper_state *st, int n_seqs)
{
    const struct whisper_config *c = &st->m->config;
    struct backend *be = st->m->backend;
    size_t n = (size_t)c->decoder_layers * (size_t)c->max_target_positions * (size_t)n_seqs *
               (size_t)c->d_model * sizeof(float);
    st->self_k = be->ops->alloc(be, n);
    st->self_v = be->ops->alloc(be, n);
    if (n_seqs > 1) {
        st->spare_k = be->ops->alloc(be, n);
        st->spare_v = be->ops->alloc(be, n);
    }
    st->n_seqs = n_seqs;
    st->n_past = 0;
    return st->self_k && st->self_v && (n_seqs == 1 || (st->spare_k && st->spare_v))
               ? 0
               : -INFERD_ENOMEM;
}

static void free_self_kv(struct whisper_state *st)
{
    struct backend *be = st->m->backend;
    float *bufs[] = {st->self_k, st->self_v, st->spare_k, st->spare_v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->release(be, bufs[i]);
    st->self_k = st->self_v = st->spare_k = st->spare_v = NULL;
}

int whisper_state_create(const struct whisper_model *m, struct whisper_state **out,
                         struct err *err)
{
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    struct whisper_state *st = calloc(1, sizeof *st);
    if (!st || !(st->capture_q = calloc((size_t)c->decoder_layers, sizeof *st->capture_q))) {
        free(st);
        return err_set(err, INFERD_ENOMEM, "out of memory for a Whisper state");
    }
    st->m = m;
    size_t steps = (size_t)(c->max_target_positions > WHISPER_MAX_SEQS ? c->max_target_positions
                                                                       : WHISPER_MAX_SEQS);
    st->step_pos = malloc(steps * sizeof *st->step_pos);
    st->step_rows = malloc(steps * sizeof *st->step_rows);
    if (!st->step_pos || !st->step_rows) {
        whisper_state_free(st);
        return err_set(err, INFERD_ENOMEM, "out of memory for a Whisper state");
    }
    size_t d = (size_t)c->d_model, src = (size_t)c->max_source_positions,
           L = (size_t)c->decoder_layers;
    size_t ffn = (size_t)(c->encoder_ffn > c->decoder_ffn ? c->encoder_ffn : c->decoder_ffn);
    size_t wide = d > (size_t)c->n_mels ? d : (size_t)c->n_mels;
    size_t rows = src > (size_t)c->max_target_positions ? src : (size_t)c->max_target_positions;
    if (rows < WHISPER_MAX_SEQS)
        rows = WHISPER_MAX_SEQS;
    struct { float **p; size_t n; } bufs[] = {
        {&st->cross_k, L * src * d}, {&st->cross_v, L * src * d},
        {&st->enc_out, src * d},     {&st->mel, 2 * src * wide}, {&st->conv, 2 * src * d},
        {&st->x, rows * d}, {&st->xn, rows * d}, {&st->q, rows * d}, {&st->k, rows * d},
        {&st->v, rows * d}, {&st->attn, rows * d}, {&st->ffn, rows * ffn},
        {&st->logits, (size_t)WHISPER_MAX_SEQS * (size_t)c->vocab_size},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i].p = be->ops->alloc(be, bufs[i].n * sizeof(float)))) {
            whisper_state_free(st);
            return err_set(err, INFERD_ENOMEM, "out of backend memory for a Whisper state");
        }
    if (alloc_self_kv(st, 1) < 0) {
        whisper_state_free(st);
        return err_set(err, INFERD_ENOMEM, "out of backend memory for a Whisper state");
    }
    *out = st;
    return 0;
}

int whisper_state_reserve(struct whisper_state *st, int n_seqs, struct err *err)
{
    if (n_seqs < 1 || n_seqs > WHISPER_MAX_SEQS)
        return err_set(err, INFERD_EINVAL, "%d decoder sequences (1 to %d)", n_seqs,
                       WHISPER_MAX_SEQS);
    st->n_past = 0;
    if (n_seqs == st->n_seqs)
        return 0;
    free_self_kv(st);
    if (alloc_self_kv(st, n_seqs) == 0)
        return 0;
    free_self_kv(st); /* back to one sequence, which the state always has room for */
    if (alloc_self_kv(st, 1) < 0)
        free_self_kv(st);
    return err_set(err, INFERD_ENOMEM, "out of backend memory for %d decoder sequences", n_seqs);
}

void whisper_state_free(struct whisper_state *st)
{
    if (!st)
        return;
    struct backend *be = st->m->backend;
    free_self_kv(st);
    float *bufs[] = {st->cross_k, st->cross_v, st->enc_out, st->mel, st->conv, st->x,
                     st->xn, st->q, st->k, st->v, st->attn, st->ffn, st->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->release(be, bufs[i]);
    for (int i = 0; st->capture_q && i < st->m->config.decoder_layers; i++)
        free(st->capture_q[i]);
    free(st->capture_q);
    free(st->step_pos);
    free(st->step_rows);
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

/* Row pos of sequence seq in layer layer's self K (or V) block. */
static float *self_row(const struct whisper_state *st, float *base, int layer, int pos, int seq)
{
    const struct whisper_config *c = &st->m->config;
    return base + (((size_t)layer * (size_t)c->max_target_positions + (size_t)pos) *
                       (size_t)st->n_seqs + (size_t)seq) * (size_t)c->d_model;
}

/* The self K/V cache row (within a layer's block) of each of n decoder rows:
 * n tokens of sequence 0 from position n_past on (seqs false), or one token
 * for each sequence s < n at n_past (seqs true). */
static void self_rows(const struct whisper_state *st, int n, bool seqs, int32_t *rows)
{
    for (int r = 0; r < n; r++) {
        int pos = seqs ? st->n_past : st->n_past + r, seq = seqs ? r : 0;
        rows[r] = pos * st->n_seqs + seq;
    }
}

/* x = embed(tokens) + the positional embedding of each row's position (the
 * positions as a gathered table, not an offset pointer, so a decode step's
 * ops do not name its position). */
static void embed_rows(struct whisper_state *st, const int32_t *tokens, int n, bool seqs)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    int64_t d = c->d_model;
    int32_t *pos = st->step_pos;
    for (int r = 0; r < n; r++)
        pos[r] = seqs ? st->n_past : st->n_past + r;
    struct weight_matrix emb = wm(m->embed, c->vocab_size, d),
                         pos_emb = wm(m->dec_pos, c->max_target_positions, d);
    be->ops->embed(be, &emb, tokens, n, st->x);
    be->ops->embed(be, &pos_emb, pos, n, st->attn);
    be->ops->add(be, st->x, st->attn, (int64_t)n * d);
}

/* The decoder over n rows of st->x already embedded: n tokens of sequence 0 at positions
 * [n_past, n_past + n) (seqs false), or one token for each sequence s < n at n_past (seqs
 * true). Leaves the final LayerNorm's rows in st->xn. */
static void decoder_layers(struct whisper_state *st, int n, bool seqs)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    int64_t d = c->d_model, src = c->max_source_positions, stride = (int64_t)st->n_seqs * d;
    int heads = c->decoder_heads, hd = (int)(d / heads);
    float scale = 1.0f / sqrtf((float)hd);
    int32_t *rows = st->step_rows;
    self_rows(st, n, seqs, rows);
    for (int i = 0; i < c->decoder_layers; i++) {
        const struct whisper_layer_w *L = &m->dec[i];
        struct weight_matrix wk = wm(L->self.k_w, d, d), wv = wm(L->self.v_w, d, d),
                             wq = wm(L->self.q_w, d, d), wo = wm(L->self.o_w, d, d);
        const struct weight_matrix *kvq[3] = {&wk, &wv, &wq};
        const float *kvq_bias[3] = {NULL, L->self.v_b, L->self.q_b};
        float *kvq_out[3] = {st->k, st->v, st->q};
        float *k0 = self_row(st, st->self_k, i, 0, 0), *v0 = self_row(st, st->self_v, i, 0, 0);
        op->layer_norm(be, st->x, L->self.ln_w, L->self.ln_b, n, d, 1e-5f, st->xn);
        op->matmul_group(be, st->xn, n, 3, kvq, kvq_bias, kvq_out);
        op->scatter_rows(be, st->k, n, d, rows, k0);
        op->scatter_rows(be, st->v, n, d, rows, v0);
        if (seqs) /* each sequence over its own rows */
            for (int s = 0; s < n; s++)
                op->attention_dense(be, st->q + (size_t)s * d, 1, k0 + (size_t)s * d,
                                    v0 + (size_t)s * d, st->n_past + 1, stride, heads, hd, scale,
                                    -1, st->attn + (size_t)s * d);
        else
            op->attention_dense(be, st->q, n, k0, v0, st->n_past + n, stride, heads, hd, scale,
                                st->n_past, st->attn);
        op->matmul(be, st->attn, n, &wo, L->self.o_b, st->q);
        op->add(be, st->x, st->q, (int64_t)n * d);

        op->layer_norm(be, st->x, L->cross.ln_w, L->cross.ln_b, n, d, 1e-5f, st->xn);
        if (st->capture_q[i]) { /* whisper_cross_scores: this layer's queries, to the host */
            struct weight_matrix cq = wm(L->cross.q_w, d, d);
            op->matmul(be, st->xn, n, &cq, L->cross.q_b, st->q);
            op->to_host(be, st->capture_q[i], st->q, (size_t)n * d * sizeof(float));
        }
        attn_block(st, &L->cross, heads, n, st->cross_k + (size_t)i * src * d,
                   st->cross_v + (size_t)i * src * d, src, -1);
        mlp_block(st, L, c->decoder_ffn, n);
    }
}

/* The head over rows of st->x: rows [first, first + n) to n x vocab logits (host memory). */
static void decoder_head(struct whisper_state *st, int first, int n, float *logits)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    int64_t d = c->d_model;
    struct weight_matrix emb = wm(m->embed, c->vocab_size, d);
    op->layer_norm(be, st->x + (size_t)first * d, m->dec_ln_w, m->dec_ln_b, n, d, 1e-5f, st->xn);
    op->matmul(be, st->xn, n, &emb, NULL, st->logits);
    op->to_host(be, logits, st->logits, (size_t)n * c->vocab_size * sizeof(float));
}

/* n tokens (at most max_n) taking positions more decoder positions. */
static int check_tokens(const struct whisper_state *st, const int32_t *tokens, int n, int max_n,
                        int positions, struct err *err)
{
    const struct whisper_config *c = &st->m->config;
    if (!st->self_k)
        return err_set(err, INFERD_ENOMEM, "the Whisper state lost its decoder cache");
    if (n <= 0 || n > max_n || st->n_past + positions > c->max_target_positions)
        return err_set(err, INFERD_ERANGE, "%d decoder positions past %d (at most %d)", positions,
                       st->n_past, c->max_target_positions);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return err_set(err, INFERD_EINVAL, "token %d outside the vocabulary of %d", tokens[i],
                           c->vocab_size);
    return 0;
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
    int rc = check_tokens(st, tokens, n, c->max_target_positions, n, err);
    if (rc < 0)
        return rc;
    embed_rows(st, tokens, n, false);
    decoder_layers(st, n, false);
    st->n_past += n;
    if (logits)
        decoder_head(st, n - 1, 1, logits);
    return op->status ? op->status(be, err) : 0;
}

int whisper_decode_seqs(struct whisper_state *st, const int32_t *tokens, int n, float *logits,
                        struct err *err)
{
    const struct whisper_model *m = st->m;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    int rc = check_tokens(st, tokens, n, st->n_seqs, 1, err);
    if (rc < 0)
        return rc;
    embed_rows(st, tokens, n, true);
    decoder_layers(st, n, true);
    st->n_past += 1;
    decoder_head(st, 0, n, logits);
    return op->status ? op->status(be, err) : 0;
}

int whisper_seqs_select(struct whisper_state *st, const int *src, int n, struct err *err)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    int S = st->n_seqs;
    if (n < 0 || n > S)
        return err_set(err, INFERD_EINVAL, "%d sequences selected of %d", n, S);
    bool identity = true;
    for (int s = 0; s < n; s++) {
        if (src[s] < 0 || src[s] >= S)
            return err_set(err, INFERD_EINVAL, "sequence %d selects %d of %d", s, src[s], S);
        identity = identity && src[s] == s;
    }
    if (identity || st->n_past == 0)
        return 0;
    /* one gather per layer into the spare block (the embed op over the cache's rows), then the
     * two blocks trade places */
    size_t rows = (size_t)st->n_past * (size_t)S;
    int32_t *idx = malloc(rows * sizeof *idx);
    if (!idx)
        return err_set(err, INFERD_ENOMEM, "out of memory reordering beams");
    int64_t d = c->d_model, layer_rows = (int64_t)c->max_target_positions * S;
    for (int i = 0; i < c->decoder_layers; i++) {
        for (int p = 0; p < st->n_past; p++)
            for (int s = 0; s < S; s++)
                idx[(size_t)p * S + s] = (int32_t)((int64_t)p * S + (s < n ? src[s] : s));
        for (int kv = 0; kv < 2; kv++) {
            float *from = (kv ? st->self_v : st->self_k) + (size_t)i * layer_rows * d;
            float *to = (kv ? st->spare_v : st->spare_k) + (size_t)i * layer_rows * d;
            struct weight_matrix table = wm(from, layer_rows, d);
            be->ops->embed(be, &table, idx, (int64_t)rows, to);
        }
    }
    free(idx);
    float *t = st->self_k;
    st->self_k = st->spare_k;
    st->spare_k = t;
    t = st->self_v;
    st->self_v = st->spare_v;
    st->spare_v = t;
    return be->ops->status ? be->ops->status(be, err) : 0;
}

int whisper_cross_scores(struct whisper_state *st, const int32_t *tokens, int n,
                         const int *heads, int n_pairs, int n_frames, float *out,
                         struct err *err)
{
    const struct whisper_model *m = st->m;
    const struct whisper_config *c = &m->config;
    struct backend *be = m->backend;
    int64_t d = c->d_model, src = c->max_source_positions;
    int hd = (int)(d / c->decoder_heads);
    if (n_frames < 1 || n_frames > src)
        return err_set(err, INFERD_ERANGE, "%d encoder frames (1 to %lld)", n_frames,
                       (long long)src);
    for (int p = 0; p < n_pairs; p++)
        if (heads[2 * p] < 0 || heads[2 * p] >= c->decoder_layers || heads[2 * p + 1] < 0 ||
            heads[2 * p + 1] >= c->decoder_heads)
            return err_set(err, INFERD_EINVAL, "no decoder head (%d, %d)", heads[2 * p],
                           heads[2 * p + 1]);
    int rc = 0;
    float *keys = malloc((size_t)n_frames * d * sizeof *keys);
    for (int p = 0; keys && p < n_pairs; p++) {
        float **q = &st->capture_q[heads[2 * p]];
        if (!*q && !(*q = malloc((size_t)n * d * sizeof **q)))
            break;
    }
    for (int p = 0; p < n_pairs; p++)
        if (!st->capture_q[heads[2 * p]])
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the alignment");
    if (!keys)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the alignment");
    if (rc == 0) {
        whisper_rewind(st, 0);
        rc = whisper_decode(st, tokens, n, NULL, err);
    }
    float scale = 1.0f / sqrtf((float)hd);
    for (int layer = 0; rc == 0 && layer < c->decoder_layers; layer++) {
        if (!st->capture_q[layer])
            continue;
        be->ops->to_host(be, keys, st->cross_k + (size_t)layer * src * d,
                         (size_t)n_frames * d * sizeof *keys);
        if (be->ops->status && (rc = be->ops->status(be, err)) < 0)
            break;
        for (int p = 0; p < n_pairs; p++) {
            if (heads[2 * p] != layer)
                continue;
            int h = heads[2 * p + 1];
            float *o = out + (size_t)p * n * n_frames;
            for (int t = 0; t < n; t++) {
                const float *qt = st->capture_q[layer] + (size_t)t * d + (size_t)h * hd;
                for (int f = 0; f < n_frames; f++) {
                    const float *kf = keys + (size_t)f * d + (size_t)h * hd;
                    float dot = 0;
                    for (int e = 0; e < hd; e++)
                        dot += qt[e] * kf[e];
                    o[(size_t)t * n_frames + f] = dot * scale;
                }
            }
        }
    }
    for (int layer = 0; layer < c->decoder_layers; layer++) {
        free(st->capture_q[layer]);
        st->capture_q[layer] = NULL;
    }
    free(keys);
    return rc;
}

void whisper_rewind(struct whisper_state *st, int n)
{
    if (n < st->n_past)
        st->n_past = n < 0 ? 0 : n;
}
