/* tools/gguf_write.c — writes a model directory as GGUF: metadata, tokenizer vocabulary, and tensors converted and quantized row by row. */
#include "tools/gguf_write.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/file.h"
#include "base/json.h"
#include "base/strbuf.h"
#include "base/threadpool.h"
#include "model/config.h"
#include "model/gguf.h"
#include "base/quant.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"

#define ALIGN 32
#define MAX_TOKENIZER_BYTES (64u << 20)

bool gguf_ftype_parse(const char *name, enum gguf_ftype *out)
{
    static const char *const names[] = {"bf16", "q8_0", "q4_0", "q4_k_m", "q6_k"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(name, names[i])) {
            *out = (enum gguf_ftype)i;
            return true;
        }
    return false;
}

/* ---------------------------------------------------------------- header bytes */

static void put_raw(struct strbuf *b, const void *p, size_t n) { strbuf_append(b, p, n); }

static void put_u32(struct strbuf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put_raw(b, x, 4);
}

static void put_u64(struct strbuf *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_string(struct strbuf *b, const char *s, size_t len)
{
    put_u64(b, len);
    put_raw(b, s, len);
}

static void kv_head(struct strbuf *b, const char *key, enum gguf_type t)
{
    put_string(b, key, strlen(key));
    put_u32(b, (uint32_t)t);
}

static void kv_u32(struct strbuf *b, int *n, const char *key, uint32_t v)
{
    kv_head(b, key, GGUF_U32);
    put_u32(b, v);
    ++*n;
}

static void kv_f32(struct strbuf *b, int *n, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    kv_head(b, key, GGUF_F32);
    put_u32(b, u);
    ++*n;
}

static void kv_bool(struct strbuf *b, int *n, const char *key, bool v)
{
    kv_head(b, key, GGUF_BOOL);
    strbuf_putc(b, v ? 1 : 0);
    ++*n;
}

static void kv_bools(struct strbuf *b, int *n, const char *key, const bool *v, int count)
{
    kv_head(b, key, GGUF_ARRAY);
    put_u32(b, GGUF_BOOL);
    put_u64(b, (uint64_t)count);
    for (int i = 0; i < count; i++)
        strbuf_putc(b, v[i] ? 1 : 0);
    (*n)++;
}

static void kv_str(struct strbuf *b, int *n, const char *key, const char *s)
{
    kv_head(b, key, GGUF_STRING);
    put_string(b, s, strlen(s));
    ++*n;
}

/* ---------------------------------------------------------------- tokenizer */

/* tokenizer.ggml.* from tokenizer.json (gpt2-style BPE) and the chat template
 * from tokenizer_config.json; nothing when dir has no tokenizer.json. */
static int write_tokenizer(const char *dir, const struct model_config *c, struct strbuf *b,
                           int *n_kv, bool *written, struct err *err)
{
    int vocab_size = c->vocab_size;
    char path[4200];
    char *text = NULL, *ctext = NULL;
    size_t len, clen = 0;
    bool missing = false;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = file_read_all(path, MAX_TOKENIZER_BYTES, &text, &len, &missing, err);
    if (rc || missing)
        return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if ((rc = file_read_all(path, MAX_TOKENIZER_BYTES, &ctext, &clen, &missing, err))) {
        free(text);
        return rc;
    }
    struct json_object *root = NULL, *cfg = NULL;
    if ((rc = json_text_parse(text, len, 0, false, &root, err)) ||
        (ctext && (rc = json_text_parse(ctext, clen, 0, false, &cfg, err))))
        goto out;
    struct json_object *model = json_object_object_get(root, "model");
    struct json_object *vocab = json_object_object_get(model, "vocab");
    struct json_object *merges = json_object_object_get(model, "merges");
    struct json_object *added = json_object_object_get(root, "added_tokens");
    const char *type = json_object_get_string(json_object_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") || !vocab || !merges ||
        json_object_get_boolean(json_object_object_get(model, "byte_fallback"))) {
        rc = err_set(err, INFERD_EUNSUPPORTED,
                     "%s/tokenizer.json: only byte-level BPE vocabularies are written to GGUF", dir);
        goto out;
    }
    /* the split regex names the pre-tokenizer */
    const char *regex = NULL;
    struct json_object *pre = json_object_object_get(root, "pre_tokenizer");
    struct json_object *list = json_object_object_get(pre, "pretokenizers");
    for (size_t i = 0; list && i < json_object_array_length(list); i++) {
        struct json_object *pat =
            json_object_object_get(json_object_array_get_idx(list, i), "pattern");
        if (json_object_object_get(pat, "Regex"))
            regex = json_object_get_string(json_object_object_get(pat, "Regex"));
    }
    const char *pre_name = tok_gguf_pre_name(regex);
    if (!pre_name) {
        rc = err_set(err, INFERD_EUNSUPPORTED,
                     "%s/tokenizer.json: its pre-tokenizer has no GGUF name", dir);
        goto out;
    }
    const char **pieces = calloc((size_t)vocab_size, sizeof *pieces);
    int32_t *types = calloc((size_t)vocab_size, sizeof *types);
    if (!pieces || !types) {
        free(pieces);
        free(types);
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the vocabulary");
        goto out;
    }
    json_object_object_foreach(vocab, piece, idv)
    {
        int id = json_object_get_int(idv);
        if (id >= 0 && id < vocab_size) {
            pieces[id] = piece;
            types[id] = 1;
        }
    }
    for (size_t i = 0; added && i < json_object_array_length(added); i++) {
        struct json_object *a = json_object_array_get_idx(added, i);
        int id = json_object_get_int(json_object_object_get(a, "id"));
        if (id >= 0 && id < vocab_size) {
            pieces[id] = json_object_get_string(json_object_object_get(a, "content"));
            types[id] = json_object_get_boolean(json_object_object_get(a, "special")) ? 3 : 4;
        }
    }
    *written = true;
    kv_str(b, n_kv, "tokenizer.ggml.model", "gpt2");
    kv_str(b, n_kv, "tokenizer.ggml.pre", pre_name);
    kv_head(b, "tokenizer.ggml.tokens", GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, (uint64_t)vocab_size);
    for (int i = 0; i < vocab_size; i++) {
        char pad[32];
        if (!pieces[i]) {
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            types[i] = 5; /* unused: nothing encodes to it */
        }
        const char *s = pieces[i] ? pieces[i] : pad;
        put_string(b, s, strlen(s));
    }
    ++*n_kv;
    kv_head(b, "tokenizer.ggml.token_type", GGUF_ARRAY);
    put_u32(b, GGUF_I32);
    put_u64(b, (uint64_t)vocab_size);
    for (int i = 0; i < vocab_size; i++)
        put_u32(b, (uint32_t)types[i]);
    ++*n_kv;
    free(pieces);
    free(types);
    kv_head(b, "tokenizer.ggml.merges", GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    size_t n_merges = json_object_array_length(merges);
    put_u64(b, n_merges);
    for (size_t i = 0; i < n_merges; i++) {
        struct json_object *m = json_object_array_get_idx(merges, i);
        if (json_object_is_type(m, json_type_string)) {
            put_string(b, json_object_get_string(m), (size_t)json_object_get_string_len(m));
        } else {
            const char *l = json_object_get_string(json_object_array_get_idx(m, 0));
            const char *r = json_object_get_string(json_object_array_get_idx(m, 1));
            put_u64(b, strlen(l) + 1 + strlen(r));
            put_raw(b, l, strlen(l));
            strbuf_putc(b, ' ');
            put_raw(b, r, strlen(r));
        }
    }
    ++*n_kv;
    /* special tokens by name, as tokenizer_config.json names them */
    static const char *const names[] = {"bos_token", "eos_token", "pad_token"};
    static const char *const keys[] = {"tokenizer.ggml.bos_token_id",
                                       "tokenizer.ggml.eos_token_id",
                                       "tokenizer.ggml.padding_token_id"};
    int eos = -1;
    for (int k = 0; k < 3; k++) {
        struct json_object *t = json_object_object_get(cfg, names[k]);
        if (t && json_object_is_type(t, json_type_object))
            t = json_object_object_get(t, "content");
        const char *want = t ? json_object_get_string(t) : NULL;
        for (size_t i = 0; want && added && i < json_object_array_length(added); i++) {
            struct json_object *a = json_object_array_get_idx(added, i);
            if (!strcmp(json_object_get_string(json_object_object_get(a, "content")), want)) {
                int id = json_object_get_int(json_object_object_get(a, "id"));
                kv_u32(b, n_kv, keys[k], (uint32_t)id);
                if (k == 1)
                    eos = id;
                break;
            }
        }
    }
    const char *pp = json_object_get_string(
        json_object_object_get(json_object_object_get(root, "post_processor"), "type"));
    kv_bool(b, n_kv, "tokenizer.ggml.add_bos_token", pp && !strcmp(pp, "TemplateProcessing"));
    /* the config's other end-of-sequence ids (e.g. <|eot_id|>) as eot and eom */
    static const char *const more[] = {"tokenizer.ggml.eot_token_id",
                                       "tokenizer.ggml.eom_token_id"};
    for (int i = 0, k = 0; i < c->n_eos; i++) {
        int id = c->eos_token_ids[i];
        if (id == eos)
            continue;
        if (eos < 0) {
            kv_u32(b, n_kv, keys[1], (uint32_t)id);
            eos = id;
        } else if (k < 2) {
            kv_u32(b, n_kv, more[k++], (uint32_t)id);
        }
    }
    struct json_object *tmpl = json_object_object_get(cfg, "chat_template");
    if (tmpl && json_object_is_type(tmpl, json_type_string))
        kv_str(b, n_kv, "tokenizer.chat_template", json_object_get_string(tmpl));
out:
    json_object_put(root);
    json_object_put(cfg);
    free(text);
    free(ctext);
    return rc;
}

/* ---------------------------------------------------------------- tensors */

struct out_tensor {
    char name[96];
    const struct st_tensor *src; /* NULL for rope_freqs and the rope factors */
    const struct st_tensor **experts; /* owned array of ne[2] borrowed sources: a 3-D
                                         tensor of experts' matrices stacked (src NULL) */
    const float *values;         /* rope_freqs, rope_factors_*: ne[0] floats */
    int n_dims;
    int64_t ne[3];               /* ne[0] contiguous; ne[2] experts (1 otherwise) */
    enum dtype dtype;
    int permute_heads;           /* rows into llama.cpp's rope order over this many heads */
    bool add_one;                /* Gemma's norm weights: stored as 1 + w, as llama.cpp's
                                    converter stores them */
    uint64_t offset;
};

static const struct {
    const char *hf, *gguf;
} layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

/* Names that differ by family, looked up before the shared ones (as
 * llama.cpp's tensor map has them for gemma3, phi3, qwen3moe). */
static const struct {
    enum model_arch arch;
    const char *hf, *gguf;
} arch_layer_names[] = {
    {ARCH_GEMMA3, "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {ARCH_GEMMA3, "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {ARCH_GEMMA3, "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {ARCH_PHI3, "self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {ARCH_PHI3, "mlp.gate_up_proj.weight", "ffn_up.weight"},
    {ARCH_QWEN3_MOE, "mlp.gate.weight", "ffn_gate_inp.weight"},
    {ARCH_QWEN3_MOE, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
    {ARCH_QWEN3_MOE, "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {ARCH_QWEN3_MOE, "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {ARCH_QWEN3_MOE, "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
};

/* An expert's matrix, model.layers.L.mlp.experts.E.P.weight: its layer and
 * expert, and the GGUF name of the stacked tensor it joins into out. */
static bool expert_name(const char *hf, char *out, size_t cap, int *layer, int *expert)
{
    int end = 0;
    char proj[16];
    if (sscanf(hf, "model.layers.%d.mlp.experts.%d.%15[a-z_].weight%n", layer, expert, proj,
               &end) != 3 || hf[end] != '\0')
        return false;
    if (strcmp(proj, "gate_proj") && strcmp(proj, "up_proj") && strcmp(proj, "down_proj"))
        return false;
    snprintf(out, cap, "blk.%d.ffn_%.*s_exps.weight", *layer, (int)(strlen(proj) - 5), proj);
    return true;
}

static bool gguf_name(enum model_arch arch, const char *hf, char *out, size_t cap, int *layer)
{
    *layer = -1;
    if (!strcmp(hf, "model.embed_tokens.weight"))
        return snprintf(out, cap, "token_embd.weight"), true;
    if (!strcmp(hf, "model.norm.weight"))
        return snprintf(out, cap, "output_norm.weight"), true;
    if (!strcmp(hf, "lm_head.weight"))
        return snprintf(out, cap, "output.weight"), true;
    int end = 0;
    if (sscanf(hf, "model.layers.%d.%n", layer, &end) != 1 || !end)
        return false;
    for (size_t i = 0; i < sizeof arch_layer_names / sizeof arch_layer_names[0]; i++)
        if (arch_layer_names[i].arch == arch && !strcmp(hf + end, arch_layer_names[i].hf))
            return snprintf(out, cap, "blk.%d.%s", *layer, arch_layer_names[i].gguf), true;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
        if (!strcmp(hf + end, layer_names[i].hf))
            return snprintf(out, cap, "blk.%d.%s", *layer, layer_names[i].gguf), true;
    return false;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between. */
static bool more_bits(int layer, int n_layers)
{
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

static bool ends_with(const char *s, const char *x)
{
    size_t a = strlen(s), b = strlen(x);
    return a >= b && !strcmp(s + a - b, x);
}

/* The type llama-quantize gives a matrix, then its fallbacks for rows that
 * are not whole blocks. */
static enum dtype matrix_type(enum gguf_ftype ft, const char *name, int layer, int n_layers,
                              bool tied, int64_t cols)
{
    bool head = !strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight"));
    enum dtype t;
    switch (ft) {
    case GGUF_FTYPE_BF16: t = DTYPE_BF16; break;
    case GGUF_FTYPE_Q8_0: t = DTYPE_Q8_0; break;
    case GGUF_FTYPE_Q4_0: t = head ? DTYPE_Q6_K : DTYPE_Q4_0; break;
    case GGUF_FTYPE_Q6_K: t = DTYPE_Q6_K; break;
    default:
        t = head || ((ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight") ||
                      ends_with(name, ".ffn_down_exps.weight")) &&
                     more_bits(layer, n_layers))
                ? DTYPE_Q6_K
                : DTYPE_Q4_K;
    }
    if (head && t == DTYPE_Q6_K && cols % 256 != 0)
        t = DTYPE_Q8_0; /* llama.cpp's head rule when rows are not whole super-blocks */
    if (cols % dtype_block_elems(t) != 0)
        t = t == DTYPE_Q4_K ? DTYPE_Q5_0 : t == DTYPE_Q6_K ? DTYPE_Q8_0 : t;
    if (cols % dtype_block_elems(t) != 0)
        t = DTYPE_F16;
    return t;
}

static uint32_t file_type_id(enum gguf_ftype ft)
{
    static const uint32_t ids[] = {32, 7, 2, 15, 18}; /* llama_ftype numbers */
    return ids[ft];
}

/* Element c of row r of a dense source tensor. */
static float source_element(const struct st_tensor *t, int64_t cols, int64_t r, int64_t c)
{
    const uint8_t *p = (const uint8_t *)t->data + ((uint64_t)r * (uint64_t)cols + (uint64_t)c) *
                                                      dtype_size(t->dtype);
    if (t->dtype == DTYPE_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return t->dtype == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* The source row stored at row r: llama.cpp's order puts HF row
 * h*hd + i*hd/2 + j at h*hd + 2j + i. */
static int64_t hf_row(int heads, int64_t rows, int64_t r)
{
    if (!heads)
        return r;
    int64_t hd = rows / heads, h = r / hd, k = r % hd;
    return h * hd + (k % 2) * (hd / 2) + k / 2;
}

/* Row r of t (stored order) as floats into x. */
static void source_row(const struct out_tensor *t, int64_t rows, int64_t cols, int64_t r, float *x)
{
    if (t->values) {
        memcpy(x, t->values, (size_t)cols * sizeof *x);
        return;
    }
    if (t->experts) { /* rows of expert r / ne[1], stacked */
        for (int64_t c = 0; c < cols; c++)
            x[c] = source_element(t->experts[r / t->ne[1]], cols, r % t->ne[1], c);
        return;
    }
    /* a bias is one column of rows: permute its elements as rows */
    int64_t sr = hf_row(t->permute_heads, t->n_dims == 2 ? rows : cols, t->n_dims == 2 ? r : 0);
    for (int64_t c = 0; c < cols; c++)
        x[c] = t->n_dims == 2 ? source_element(t->src, cols, sr, c)
                              : source_element(t->src, 1, hf_row(t->permute_heads, cols, c), 0);
    /* transformers computes 1.0 + weight.float(): the same f32 sum */
    for (int64_t c = 0; t->add_one && c < cols; c++)
        x[c] = 1.0f + x[c];
}

/* Rows quantized per batch across the pool's threads (the K types' searches
 * make a multi-GB model minutes of work on one core); each row's bytes depend
 * only on the row, so the file is the same on any thread count. */
#define WRITE_BATCH_ROWS 512

struct quant_job {
    const struct out_tensor *t;
    int64_t rows, cols, r0, n;
    size_t row_bytes;
    float *x;   /* per thread: cols floats */
    uint8_t *q; /* n rows of row_bytes */
};

static void quant_rows(void *ctx, int ith, int nth)
{
    struct quant_job *j = ctx;
    long b, e;
    threadpool_split((long)j->n, ith, nth, 1, &b, &e);
    float *x = j->x + (size_t)ith * (size_t)j->cols;
    for (long i = b; i < e; i++) {
        source_row(j->t, j->rows, j->cols, j->r0 + i, x);
        quant_quantize_row(j->t->dtype, x, j->q + (size_t)i * j->row_bytes, j->cols);
    }
}

static int write_data(FILE *fp, struct threadpool *pool, const struct out_tensor *t,
                      struct err *err)
{
    int64_t cols = t->ne[0], rows = t->n_dims >= 2 ? t->ne[1] * t->ne[2] : 1;
    int nth = threadpool_size(pool);
    struct quant_job j = {.t = t, .rows = rows, .cols = cols,
                          .row_bytes = (size_t)dtype_row_bytes(t->dtype, (uint64_t)cols)};
    j.x = malloc((size_t)nth * (size_t)cols * sizeof *j.x);
    j.q = malloc((size_t)WRITE_BATCH_ROWS * j.row_bytes);
    int rc = 0;
    if (!j.x || !j.q)
        rc = err_set(err, INFERD_ENOMEM, "out of memory writing %s", t->name);
    for (j.r0 = 0; !rc && j.r0 < rows; j.r0 += j.n) {
        j.n = rows - j.r0 < WRITE_BATCH_ROWS ? rows - j.r0 : WRITE_BATCH_ROWS;
        threadpool_run(pool, quant_rows, &j);
        size_t bytes = (size_t)j.n * j.row_bytes;
        if (fwrite(j.q, 1, bytes, fp) != bytes)
            rc = err_set(err, INFERD_EIO, "writing %s: %s", t->name, strerror(errno));
    }
    free(j.x);
    free(j.q);
    return rc;
}

/* Llama 3 rope scaling as llama.cpp's converter stores it: per frequency,
 * the divisor transformers' formula applies. */
static void llama3_factors(const struct model_config *c, float *out)
{
    int half = c->head_dim / 2;
    float base[512], scaled[512];
    struct model_config plain = *c;
    plain.rope_scaling = ROPE_SCALING_NONE;
    model_rope_inv_freq(&plain, base);
    model_rope_inv_freq(c, scaled);
    for (int i = 0; i < half; i++)
        out[i] = (float)((double)base[i] / scaled[i]);
}

int gguf_write_model(const char *dir, enum gguf_ftype ftype, const char *path, struct err *err)
{
    struct model_config c;
    struct st_set set;
    int rc = model_config_load(dir, &c, NULL, err);
    if (rc)
        return rc;
    if ((rc = st_set_open(dir, &set, err)))
        return rc;
    /* llama.cpp's names, in enum model_arch's order */
    static const char *const archs[] = {"llama",    "mistral", "qwen2", "qwen3",
                                        "qwen3moe", "gemma3",  "phi3"};
    const char *arch = archs[c.arch];
    bool permuted = c.arch == ARCH_LLAMA || c.arch == ARCH_MISTRAL;
    struct out_tensor *ts = calloc((size_t)set.n_tensors + 3, sizeof *ts);
    float freqs[512], short_factors[CONFIG_MAX_ROPE_FACTORS], long_factors[CONFIG_MAX_ROPE_FACTORS];
    struct strbuf hdr = {0}, kvs = {0};
    FILE *fp = NULL;
    struct threadpool *pool = NULL;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int n = 0, n_kv = 0;
    if (!ts) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for %d tensors", set.n_tensors);
        goto out;
    }
    bool tied = !st_set_find(&set, "lm_head.weight");
    for (int i = 0; i < set.n_tensors; i++) {
        const struct st_tensor *s = &set.tensors[i];
        struct out_tensor *t = &ts[n];
        int layer, expert;
        if (ends_with(s->name, "rotary_emb.inv_freq"))
            continue;
        if (c.arch == ARCH_QWEN3_MOE &&
            expert_name(s->name, t->name, sizeof t->name, &layer, &expert)) {
            /* llama.cpp stacks a layer's experts into one 3-D tensor per projection */
            if (expert != 0)
                continue;
            if (s->n_dims != 2 || !(t->experts = calloc((size_t)c.n_experts, sizeof *t->experts))) {
                rc = err_set(err, s->n_dims != 2 ? INFERD_EFORMAT : INFERD_ENOMEM,
                             "tensor %s: not a matrix, or out of memory", s->name);
                goto out;
            }
            n++; /* owns t->experts from here */
            for (int e = 0; e < c.n_experts; e++) {
                char en[160];
                snprintf(en, sizeof en, "%.*s%d%s", (int)(strstr(s->name, ".experts.") - s->name + 9),
                         s->name, e, strchr(strstr(s->name, ".experts.") + 9, '.'));
                const struct st_tensor *x = st_set_find(&set, en);
                if (!x || x->n_dims != 2 || x->shape[0] != s->shape[0] ||
                    x->shape[1] != s->shape[1] || x->dtype != s->dtype) {
                    rc = err_set(err, INFERD_EFORMAT, "expert tensor %s is missing or differs "
                                 "from expert 0's shape", en);
                    goto out;
                }
                t->experts[e] = x;
            }
            t->n_dims = 3;
            t->ne[0] = s->shape[1];
            t->ne[1] = s->shape[0];
            t->ne[2] = c.n_experts;
            t->dtype = matrix_type(ftype, t->name, layer, c.n_layers, tied, t->ne[0]);
            continue;
        }
        if (!gguf_name(c.arch, s->name, t->name, sizeof t->name, &layer) || s->n_dims > 2) {
            rc = err_set(err, INFERD_EUNSUPPORTED, "tensor %s has no GGUF name", s->name);
            goto out;
        }
        t->src = s;
        t->n_dims = s->n_dims;
        t->ne[0] = s->shape[s->n_dims - 1];
        t->ne[1] = s->n_dims == 2 ? s->shape[0] : 1;
        t->ne[2] = 1;
        t->add_one = c.gemma_norm && ends_with(s->name, "norm.weight");
        t->dtype = s->n_dims == 1 || t->add_one
                       ? DTYPE_F32
                       : matrix_type(ftype, t->name, layer, c.n_layers, tied, t->ne[0]);
        if (permuted && (strstr(t->name, ".attn_q.") || strstr(t->name, ".attn_k.")))
            t->permute_heads = strstr(t->name, ".attn_q.") ? c.n_heads : c.n_kv_heads;
        n++;
    }
    if (c.rope_scaling == ROPE_SCALING_LLAMA3) {
        llama3_factors(&c, freqs);
        ts[n++] = (struct out_tensor){.name = "rope_freqs.weight", .values = freqs, .n_dims = 1,
                                      .ne = {c.head_dim / 2, 1, 1}, .dtype = DTYPE_F32};
    }
    if (c.rope_scaling == ROPE_SCALING_LONGROPE) { /* Phi-3: as F32 tensors */
        memcpy(short_factors, c.rope_short_factor, sizeof short_factors);
        memcpy(long_factors, c.rope_long_factor, sizeof long_factors);
        ts[n++] = (struct out_tensor){.name = "rope_factors_long.weight", .values = long_factors,
                                      .n_dims = 1, .ne = {c.n_rope_factors, 1, 1},
                                      .dtype = DTYPE_F32};
        ts[n++] = (struct out_tensor){.name = "rope_factors_short.weight", .values = short_factors,
                                      .n_dims = 1, .ne = {c.n_rope_factors, 1, 1},
                                      .dtype = DTYPE_F32};
    }

    char key[128];
#define AK(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    kv_str(&kvs, &n_kv, "general.architecture", arch);
    kv_u32(&kvs, &n_kv, "general.alignment", ALIGN);
    kv_u32(&kvs, &n_kv, "general.file_type", file_type_id(ftype));
    kv_u32(&kvs, &n_kv, AK("context_length"), (uint32_t)c.max_position_embeddings);
    kv_u32(&kvs, &n_kv, AK("embedding_length"), (uint32_t)c.hidden_size);
    kv_u32(&kvs, &n_kv, AK("block_count"), (uint32_t)c.n_layers);
    kv_u32(&kvs, &n_kv, AK("feed_forward_length"), (uint32_t)c.intermediate_size);
    kv_u32(&kvs, &n_kv, AK("attention.head_count"), (uint32_t)c.n_heads);
    kv_u32(&kvs, &n_kv, AK("attention.head_count_kv"), (uint32_t)c.n_kv_heads);
    kv_u32(&kvs, &n_kv, AK("attention.key_length"), (uint32_t)c.head_dim);
    kv_u32(&kvs, &n_kv, AK("attention.value_length"), (uint32_t)c.head_dim);
    kv_u32(&kvs, &n_kv, AK("rope.dimension_count"), (uint32_t)model_rope_dim(&c));
    kv_u32(&kvs, &n_kv, AK("vocab_size"), (uint32_t)c.vocab_size);
    kv_f32(&kvs, &n_kv, AK("rope.freq_base"), c.rope_theta);
    kv_f32(&kvs, &n_kv, AK("attention.layer_norm_rms_epsilon"), c.rms_norm_eps);
    if (c.rope_scaling == ROPE_SCALING_LINEAR) {
        kv_str(&kvs, &n_kv, AK("rope.scaling.type"), "linear");
        kv_f32(&kvs, &n_kv, AK("rope.scaling.factor"), c.rope_factor);
    }
    if (c.arch == ARCH_MISTRAL && c.sliding_window)
        kv_u32(&kvs, &n_kv, AK("attention.sliding_window"), (uint32_t)c.sliding_window);
    if (c.arch == ARCH_PHI3) { /* 0: none, as the converter writes Phi-4's */
        kv_u32(&kvs, &n_kv, AK("attention.sliding_window"), (uint32_t)c.sliding_window);
        if (c.rope_scaling == ROPE_SCALING_LONGROPE) {
            kv_u32(&kvs, &n_kv, AK("rope.scaling.original_context_length"),
                   (uint32_t)c.rope_original_max_position);
            kv_f32(&kvs, &n_kv, AK("rope.scaling.attn_factor"), c.rope_attention_factor);
        }
    }
    if (c.arch == ARCH_QWEN3_MOE) {
        kv_u32(&kvs, &n_kv, AK("expert_count"), (uint32_t)c.n_experts);
        kv_u32(&kvs, &n_kv, AK("expert_used_count"), (uint32_t)c.n_experts_per_tok);
        kv_u32(&kvs, &n_kv, AK("expert_feed_forward_length"), (uint32_t)c.moe_intermediate_size);
        if (c.shared_expert_intermediate_size)
            kv_u32(&kvs, &n_kv, AK("expert_shared_feed_forward_length"),
                   (uint32_t)c.shared_expert_intermediate_size);
        /* llama.cpp renormalizes always; the key tells our reader when not to */
        if (!c.norm_topk_prob)
            kv_bool(&kvs, &n_kv, AK("expert_weights_norm"), false);
    }
    if (c.arch == ARCH_GEMMA3) {
        kv_u32(&kvs, &n_kv, AK("attention.sliding_window"), (uint32_t)c.sliding_window);
        /* what llama.cpp fixes for the released models (every sixth layer
         * global, local base 10000, its query scale rule) is written only
         * where this model differs from it */
        bool six = true;
        for (int i = 0; i < c.n_layers; i++)
            six = six && c.layer_sliding[i] == ((i + 1) % 6 != 0 && c.sliding_window > 0);
        if (!six)
            kv_bools(&kvs, &n_kv, AK("attention.sliding_window_pattern"), c.layer_sliding,
                     c.n_layers);
        if (c.rope_local_theta != 10000.0f)
            kv_f32(&kvs, &n_kv, AK("rope.freq_base_swa"), c.rope_local_theta);
        double qpas = c.n_layers == 62 ? (double)(c.hidden_size / c.n_heads) : c.head_dim;
        if (c.query_scale != (float)pow(qpas, -0.5))
            kv_f32(&kvs, &n_kv, AK("attention.scale"), c.query_scale);
        if (c.final_logit_softcap > 0)
            kv_f32(&kvs, &n_kv, AK("final_logit_softcapping"), c.final_logit_softcap);
    }
#undef AK
    bool has_tokenizer = false;
    if ((rc = write_tokenizer(dir, &c, &kvs, &n_kv, &has_tokenizer, err)))
        goto out;
    if (!has_tokenizer) /* the config's eos ids alone */
        for (int i = 0; i < c.n_eos && i < 3; i++)
            kv_u32(&kvs, &n_kv, (const char *[]){"tokenizer.ggml.eos_token_id",
                                                 "tokenizer.ggml.eot_token_id",
                                                 "tokenizer.ggml.eom_token_id"}[i],
                   (uint32_t)c.eos_token_ids[i]);

    put_raw(&hdr, "GGUF", 4);
    put_u32(&hdr, 3);
    put_u64(&hdr, (uint64_t)n);
    put_u64(&hdr, (uint64_t)n_kv);
    put_raw(&hdr, kvs.data, kvs.len);
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        struct out_tensor *t = &ts[i];
        put_string(&hdr, t->name, strlen(t->name));
        put_u32(&hdr, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            put_u64(&hdr, (uint64_t)t->ne[d]);
        put_u32(&hdr, gguf_ggml_type(t->dtype));
        put_u64(&hdr, offset);
        t->offset = offset;
        uint64_t bytes = dtype_row_bytes(t->dtype, (uint64_t)t->ne[0]) * (uint64_t)t->ne[1] *
                         (uint64_t)t->ne[2];
        offset += (bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    while (hdr.len % ALIGN)
        strbuf_putc(&hdr, 0);
    if (hdr.failed || kvs.failed) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the GGUF header");
        goto out;
    }
    if (!(fp = fopen(tmp, "wb"))) {
        rc = err_set(err, INFERD_EIO, "creating %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (fwrite(hdr.data, 1, hdr.len, fp) != hdr.len) {
        rc = err_set(err, INFERD_EIO, "writing %s: %s", tmp, strerror(errno));
        goto out;
    }
    static const uint8_t zeros[ALIGN];
    if ((rc = threadpool_create(0, &pool, err)))
        goto out;
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = write_data(fp, pool, &ts[i], err)))
            break;
        uint64_t bytes = dtype_row_bytes(ts[i].dtype, (uint64_t)ts[i].ne[0]) *
                         (uint64_t)ts[i].ne[1] * (uint64_t)ts[i].ne[2];
        size_t pad = (size_t)((ALIGN - bytes % ALIGN) % ALIGN);
        if (fwrite(zeros, 1, pad, fp) != pad)
            rc = err_set(err, INFERD_EIO, "writing %s: %s", tmp, strerror(errno));
    }
    if (fclose(fp) != 0 && !rc)
        rc = err_set(err, INFERD_EIO, "writing %s: %s", tmp, strerror(errno));
    fp = NULL;
    if (!rc && rename(tmp, path) != 0)
        rc = err_set(err, INFERD_EIO, "renaming %s: %s", tmp, strerror(errno));
out:
    if (fp)
        fclose(fp);
    if (rc)
        unlink(tmp);
    threadpool_free(pool);
    strbuf_free(&hdr);
    strbuf_free(&kvs);
    for (int i = 0; ts && i < n; i++)
        free(ts[i].experts);
    free(ts);
    st_set_close(&set);
    return rc;
}
