/* tests/unit/test_model_load.c — model_load on tiny generated checkpoints: shapes, dtypes, ties, shards, extras, rope tables. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "model/model.h"
#include "test_support.h"

#define assert_refused(rc, err, code, fragment)                                                   \
    do {                                                                                          \
        cr_assert_eq((rc), -(code), "rc %d, message: %s", (rc), (err).msg);                      \
        cr_assert_not_null(strstr((err).msg, (fragment)), "message '%s' lacks '%s'", (err).msg,   \
                           (fragment));                                                           \
    } while (0)

/* ---------------------------------------------------------------- a host-memory backend */

/* Only the memory ops: the loader needs nothing else, and counting live
 * buffers proves model_free releases every one. */
struct fake_mem {
    int live;
    int n_allocs;
    int fail_at; /* the fail_at-th alloc returns NULL; 0 = never */
};

static void *fake_alloc(struct backend *be, size_t bytes)
{
    struct fake_mem *m = be->impl;
    if (m->fail_at && ++m->n_allocs == m->fail_at)
        return NULL;
    m->live++;
    return calloc(1, bytes);
}

static void fake_release(struct backend *be, void *p)
{
    struct fake_mem *m = be->impl;
    if (p)
        m->live--;
    free(p);
}

static void fake_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static const struct backend_ops fake_ops = {
    .name = "fake",
    .alloc = fake_alloc,
    .release = fake_release,
    .to_device = fake_copy,
    .to_host = fake_copy,
};

static struct fake_mem mem;
static struct backend fake_be;

static void setup_backend(void)
{
    memset(&mem, 0, sizeof mem);
    fake_be = (struct backend){.ops = &fake_ops, .mode = COMPUTE_EXACT, .impl = &mem};
}

/* ---------------------------------------------------------------- tiny checkpoints */

enum { VOCAB = 16, HIDDEN = 8, INTER = 12, LAYERS = 2, HEADS = 2, KV_HEADS = 1 };

struct tiny {
    const char *arch;          /* architectures[0]; default LlamaForCausalLM */
    int head_dim;              /* written to config when > 0; else hidden / heads = 4 */
    bool tied;
    bool write_lm_head;        /* write lm_head.weight even when tied */
    const char *dtype;         /* matrices: "F32", "BF16" (default) or "F16" */
    const char *vec_dtype;     /* norms and biases; default "F32" */
    const char *omit;          /* leave this tensor out */
    const char *extra;         /* add this tensor (shape [2]) */
    const char *reshape;       /* write this tensor with shape [8, 8] */
    int shards;                /* 2: two shards and an index; else model.safetensors */
    bool unaligned;            /* do not pad the header to 8 bytes */
    bool attention_bias;       /* Llama with attention_bias: q/k/v/o biases (pass it in config_extra too) */
    const char *config_extra;  /* appended members of config.json */
};

struct spec {
    char name[128];
    int n_dims;
    int64_t shape[2];
    bool vector;
};

static int head_dim_of(const struct tiny *t)
{
    return t->head_dim > 0 ? t->head_dim : HIDDEN / HEADS;
}

static bool has_bias(const struct tiny *t)
{
    return t->attention_bias || (t->arch && strcmp(t->arch, "Qwen2ForCausalLM") == 0);
}

static bool has_qk_norm(const struct tiny *t)
{
    return t->arch && strcmp(t->arch, "Qwen3ForCausalLM") == 0;
}

static int add_spec(struct spec *s, int n, const char *name, int64_t rows, int64_t cols)
{
    snprintf(s[n].name, sizeof s[n].name, "%s", name);
    s[n].n_dims = cols ? 2 : 1;
    s[n].shape[0] = rows;
    s[n].shape[1] = cols;
    s[n].vector = cols == 0;
    return n + 1;
}

/* Every tensor the tiny model should hold, in a stable order. */
static int tiny_specs(const struct tiny *t, struct spec *s)
{
    int hd = head_dim_of(t), q = HEADS * hd, kv = KV_HEADS * hd, n = 0;
    char name[128];
    n = add_spec(s, n, "model.embed_tokens.weight", VOCAB, HIDDEN);
    for (int i = 0; i < LAYERS; i++) {
#define L(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix), name)
        n = add_spec(s, n, L("input_layernorm.weight"), HIDDEN, 0);
        n = add_spec(s, n, L("self_attn.q_proj.weight"), q, HIDDEN);
        n = add_spec(s, n, L("self_attn.k_proj.weight"), kv, HIDDEN);
        n = add_spec(s, n, L("self_attn.v_proj.weight"), kv, HIDDEN);
        n = add_spec(s, n, L("self_attn.o_proj.weight"), HIDDEN, q);
        if (has_bias(t)) {
            n = add_spec(s, n, L("self_attn.q_proj.bias"), q, 0);
            n = add_spec(s, n, L("self_attn.k_proj.bias"), kv, 0);
            n = add_spec(s, n, L("self_attn.v_proj.bias"), kv, 0);
        }
        if (t->attention_bias)
            n = add_spec(s, n, L("self_attn.o_proj.bias"), HIDDEN, 0);
        if (has_qk_norm(t)) {
            n = add_spec(s, n, L("self_attn.q_norm.weight"), hd, 0);
            n = add_spec(s, n, L("self_attn.k_norm.weight"), hd, 0);
        }
        n = add_spec(s, n, L("post_attention_layernorm.weight"), HIDDEN, 0);
        n = add_spec(s, n, L("mlp.gate_proj.weight"), INTER, HIDDEN);
        n = add_spec(s, n, L("mlp.up_proj.weight"), INTER, HIDDEN);
        n = add_spec(s, n, L("mlp.down_proj.weight"), HIDDEN, INTER);
#undef L
    }
    n = add_spec(s, n, "model.norm.weight", HIDDEN, 0);
    if (!t->tied || t->write_lm_head)
        n = add_spec(s, n, "lm_head.weight", VOCAB, HIDDEN);
    return n;
}

/* Element j of the tensor called name: multiples of 1/16 in [-30/16, 30/16],
 * exact in F16, BF16 and F32, distinct across tensors. */
static float value_of(const char *name, int64_t j)
{
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return (float)((int)((h + (uint32_t)j * 7u) % 61u) - 30) / 16.0f;
}

/* Independent float -> half for the normal, exactly representable values above. */
static uint16_t half_bits(float v)
{
    if (v == 0)
        return 0;
    int e;
    double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
    uint16_t mant = (uint16_t)lround((m * 2 - 1) * 1024);
    return (uint16_t)((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | mant);
}

static size_t dtype_bytes(const char *dt)
{
    return strcmp(dt, "F32") == 0 ? 4 : 2;
}

static void encode(const char *dt, float v, uint8_t *out)
{
    if (strcmp(dt, "F32") == 0) {
        memcpy(out, &v, 4);
        return;
    }
    uint16_t h;
    if (strcmp(dt, "BF16") == 0) {
        uint32_t u;
        memcpy(&u, &v, 4);
        h = (uint16_t)(u >> 16);
    } else {
        h = half_bits(v);
    }
    memcpy(out, &h, 2);
}

struct file_builder {
    char *header;  /* growing JSON */
    size_t hlen, hcap;
    uint8_t *data;
    size_t dlen, dcap;
};

static void fb_append(struct file_builder *fb, const char *s)
{
    size_t n = strlen(s);
    if (fb->hlen + n + 1 > fb->hcap) {
        fb->hcap = (fb->hlen + n + 1) * 2;
        fb->header = realloc(fb->header, fb->hcap);
    }
    memcpy(fb->header + fb->hlen, s, n + 1);
    fb->hlen += n;
}

static void fb_add(struct file_builder *fb, const char *name, const char *dt, int n_dims,
                   const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++)
        n *= shape[d];
    size_t bytes = (size_t)n * dtype_bytes(dt);
    if (fb->dlen + bytes > fb->dcap) {
        fb->dcap = (fb->dlen + bytes) * 2 + 64;
        fb->data = realloc(fb->data, fb->dcap);
    }
    for (int64_t j = 0; j < n; j++)
        encode(dt, value_of(name, j), fb->data + fb->dlen + (size_t)j * dtype_bytes(dt));
    char entry[512];
    if (n_dims == 2)
        snprintf(entry, sizeof entry,
                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                 fb->hlen > 1 ? "," : "", name, dt, (long long)shape[0], (long long)shape[1],
                 fb->dlen, fb->dlen + bytes);
    else
        snprintf(entry, sizeof entry,
                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                 fb->hlen > 1 ? "," : "", name, dt, (long long)shape[0], fb->dlen,
                 fb->dlen + bytes);
    fb_append(fb, entry);
    fb->dlen += bytes;
}

static void fb_write(struct file_builder *fb, const char *dir, const char *file, bool pad)
{
    fb_append(fb, "}");
    if (pad)
        while (fb->hlen % 8)
            fb_append(fb, " ");
    else if (fb->hlen % 2 == 0)
        fb_append(fb, " "); /* odd length: every tensor lands at an odd address */
    size_t len = 8 + fb->hlen + fb->dlen;
    uint8_t *buf = malloc(len);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)fb->hlen >> (8 * i));
    memcpy(buf + 8, fb->header, fb->hlen);
    memcpy(buf + 8 + fb->hlen, fb->data, fb->dlen);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cr_assert_eq(test_write_file(path, buf, len), 0);
    free(buf);
    free(fb->header);
    free(fb->data);
    memset(fb, 0, sizeof *fb);
}

static void write_config(const char *dir, const struct tiny *t)
{
    char text[2048], path[1024];
    char head_dim[32] = "";
    if (t->head_dim > 0)
        snprintf(head_dim, sizeof head_dim, "\"head_dim\":%d,", t->head_dim);
    snprintf(text, sizeof text,
             "{\"architectures\":[\"%s\"],\"vocab_size\":%d,\"hidden_size\":%d,"
             "\"intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
             "\"num_key_value_heads\":%d,%s\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,"
             "\"tie_word_embeddings\":%s,\"eos_token_id\":2,\"bos_token_id\":1%s%s}",
             t->arch ? t->arch : "LlamaForCausalLM", VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS,
             head_dim, t->tied ? "true" : "false", t->config_extra ? "," : "",
             t->config_extra ? t->config_extra : "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(test_write_file(path, text, strlen(text)), 0);
}

/* Writes the tiny checkpoint t into a fresh directory; caller frees and removes it. */
static char *write_tiny(const struct tiny *t)
{
    char *dir = test_mkdtemp();
    cr_assert_not_null(dir);
    write_config(dir, t);
    struct spec specs[64];
    int n = tiny_specs(t, specs);
    const char *mdt = t->dtype ? t->dtype : "BF16", *vdt = t->vec_dtype ? t->vec_dtype : "F32";
    struct file_builder fb[2] = {0};
    char index[8192] = "{\"weight_map\":{";
    for (int i = 0; i < 2; i++)
        fb_append(&fb[i], "{");
    for (int i = 0; i < n; i++) {
        if (t->omit && strcmp(specs[i].name, t->omit) == 0)
            continue;
        int part = t->shards == 2 ? (i >= n / 2) : 0;
        int64_t wrong[2] = {8, 8};
        bool reshape = t->reshape && strcmp(specs[i].name, t->reshape) == 0;
        fb_add(&fb[part], specs[i].name, specs[i].vector ? vdt : mdt, reshape ? 2 : specs[i].n_dims,
               reshape ? wrong : specs[i].shape);
        size_t il = strlen(index);
        snprintf(index + il, sizeof index - il, "%s\"%s\":\"part%d.safetensors\"",
                 il > 15 ? "," : "", specs[i].name, part + 1);
    }
    if (t->extra) {
        int64_t two = 2;
        fb_add(&fb[0], t->extra, "F32", 1, &two);
        size_t il = strlen(index);
        snprintf(index + il, sizeof index - il, ",\"%s\":\"part1.safetensors\"", t->extra);
    }
    if (t->shards == 2) {
        fb_write(&fb[0], dir, "part1.safetensors", !t->unaligned);
        fb_write(&fb[1], dir, "part2.safetensors", !t->unaligned);
        strcat(index, "}}");
        char path[1024];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        cr_assert_eq(test_write_file(path, index, strlen(index)), 0);
    } else {
        fb_write(&fb[0], dir, "model.safetensors", !t->unaligned);
        free(fb[1].header);
    }
    return dir;
}

static int load_tiny(const struct tiny *t, struct model **m, struct err *err)
{
    char *dir = write_tiny(t);
    int rc = model_load(dir, &fake_be, m, err);
    test_rmtree(dir);
    free(dir);
    return rc;
}

static float matrix_at(const struct weight_matrix *w, int64_t j)
{
    const uint8_t *p = w->data;
    if (w->dtype == DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * j, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    return bf16_to_f32(h);
}

static void assert_matrix_holds(const struct weight_matrix *w, const char *name, int64_t rows,
                                int64_t cols)
{
    cr_assert_eq(w->rows, rows, "%s rows", name);
    cr_assert_eq(w->cols, cols, "%s cols", name);
    for (int64_t j = 0; j < rows * cols; j++)
        cr_assert_float_eq(matrix_at(w, j), value_of(name, j), 0, "%s[%lld]", name, (long long)j);
}

static void assert_vector_holds(const float *v, const char *name, int64_t n)
{
    cr_assert_not_null(v, "%s", name);
    for (int64_t j = 0; j < n; j++)
        cr_assert_float_eq(v[j], value_of(name, j), 0, "%s[%lld]", name, (long long)j);
}

static bool points_into_mapping(const struct model *m, const void *p)
{
    for (int i = 0; i < m->files.n_files; i++) {
        const uint8_t *b = m->files.maps[i];
        if ((const uint8_t *)p >= b && (const uint8_t *)p < b + m->files.map_lens[i])
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------- loading */

TestSuite(model_load, .init = setup_backend);

Test(model_load, bf16_checkpoint_loads_in_place_with_every_weight)
{
    struct tiny t = {0};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->config.arch, ARCH_LLAMA);
    cr_assert_eq(m->backend, &fake_be);
    cr_assert_eq(m->weights.embed.dtype, DTYPE_BF16);
    cr_assert(points_into_mapping(m, m->weights.embed.data), "BF16 is used from the mapping");
    assert_matrix_holds(&m->weights.embed, "model.embed_tokens.weight", VOCAB, HIDDEN);
    assert_matrix_holds(&m->weights.lm_head, "lm_head.weight", VOCAB, HIDDEN);
    assert_vector_holds(m->weights.final_norm, "model.norm.weight", HIDDEN);
    const struct layer_weights *L = &m->weights.layers[1];
    assert_vector_holds(L->attn_norm, "model.layers.1.input_layernorm.weight", HIDDEN);
    assert_matrix_holds(&L->wq, "model.layers.1.self_attn.q_proj.weight", 8, HIDDEN);
    assert_matrix_holds(&L->wk, "model.layers.1.self_attn.k_proj.weight", 4, HIDDEN);
    assert_matrix_holds(&L->wv, "model.layers.1.self_attn.v_proj.weight", 4, HIDDEN);
    assert_matrix_holds(&L->wo, "model.layers.1.self_attn.o_proj.weight", HIDDEN, 8);
    assert_vector_holds(L->mlp_norm, "model.layers.1.post_attention_layernorm.weight", HIDDEN);
    assert_matrix_holds(&L->w_gate, "model.layers.1.mlp.gate_proj.weight", INTER, HIDDEN);
    assert_matrix_holds(&L->w_up, "model.layers.1.mlp.up_proj.weight", INTER, HIDDEN);
    assert_matrix_holds(&L->w_down, "model.layers.1.mlp.down_proj.weight", HIDDEN, INTER);
    cr_assert_null(L->bq);
    cr_assert_null(L->q_norm);
    cr_assert_eq(m->config.n_eos, 1);
    model_free(m);
    cr_assert_eq(mem.live, 0, "model_free releases every backend buffer");
}

Test(model_load, f32_matrices_are_used_in_place)
{
    struct tiny t = {.dtype = "F32", .vec_dtype = "BF16"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->weights.layers[0].wq.dtype, DTYPE_F32);
    cr_assert(points_into_mapping(m, m->weights.layers[0].wq.data));
    assert_matrix_holds(&m->weights.layers[0].wq, "model.layers.0.self_attn.q_proj.weight", 8,
                        HIDDEN);
    assert_vector_holds(m->weights.layers[0].attn_norm, "model.layers.0.input_layernorm.weight",
                        HIDDEN);
    model_free(m);
    cr_assert_eq(mem.live, 0);
}

Test(model_load, f16_matrices_and_vectors_are_widened_to_f32)
{
    struct tiny t = {.dtype = "F16", .vec_dtype = "F16"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    const struct weight_matrix *w = &m->weights.layers[0].w_down;
    cr_assert_eq(w->dtype, DTYPE_F32);
    cr_assert(!points_into_mapping(m, w->data), "widened copies live in backend memory");
    assert_matrix_holds(w, "model.layers.0.mlp.down_proj.weight", HIDDEN, INTER);
    assert_matrix_holds(&m->weights.embed, "model.embed_tokens.weight", VOCAB, HIDDEN);
    assert_vector_holds(m->weights.final_norm, "model.norm.weight", HIDDEN);
    cr_assert_gt(m->n_owned_buffers, 0);
    model_free(m);
    cr_assert_eq(mem.live, 0);
}

Test(model_load, f16_special_values_widen_exactly)
{
    /* Hand-made bits: 1.0, -2.0, the smallest subnormal, 65504 (max), -0, +inf. */
    struct tiny t = {.dtype = "F16"};
    static const uint16_t bits[6] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x7c00};
    const float want[6] = {1.0f, -2.0f, 5.9604644775390625e-08f, 65504.0f, -0.0f, INFINITY};
    char *tdir = write_tiny(&t);
    /* Patch the first six elements of the embedding in the written file. */
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", tdir);
    size_t len;
    uint8_t *buf = (uint8_t *)test_read_file(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | buf[i];
    cr_assert(strstr((char *)buf + 8, "\"model.embed_tokens.weight\":{\"dtype\":\"F16\","
                                      "\"shape\":[16,8],\"data_offsets\":[0,"),
              "embedding is first in the data section");
    memcpy(buf + 8 + hl, bits, sizeof bits);
    cr_assert_eq(test_write_file(path, buf, len), 0);
    free(buf);
    struct model *m;
    struct err err = {0};
    cr_assert_eq(model_load(tdir, &fake_be, &m, &err), 0, "%s", err.msg);
    const float *e = m->weights.embed.data;
    for (int i = 0; i < 6; i++)
        cr_assert(memcmp(&e[i], &want[i], 4) == 0, "element %d: %g, want %g", i, e[i], want[i]);
    model_free(m);
    test_rmtree(tdir);
    free(tdir);
}

Test(model_load, misaligned_tensor_data_is_copied_not_used_in_place)
{
    struct tiny t = {.dtype = "BF16", .unaligned = true};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    const struct weight_matrix *w = &m->weights.layers[0].wk;
    cr_assert_eq((uintptr_t)w->data % 2, 0);
    cr_assert(!points_into_mapping(m, w->data));
    assert_matrix_holds(w, "model.layers.0.self_attn.k_proj.weight", 4, HIDDEN);
    model_free(m);
    cr_assert_eq(mem.live, 0);
}

Test(model_load, tied_embeddings_share_the_embedding_matrix)
{
    struct tiny t = {.tied = true};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert(m->config.tie_word_embeddings);
    cr_assert_eq(m->weights.lm_head.data, m->weights.embed.data);
    cr_assert_eq(m->weights.lm_head.rows, VOCAB);
    model_free(m);
}

Test(model_load, tied_checkpoint_that_still_has_lm_head_uses_it)
{
    struct tiny t = {.tied = true, .write_lm_head = true};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_neq(m->weights.lm_head.data, m->weights.embed.data);
    assert_matrix_holds(&m->weights.lm_head, "lm_head.weight", VOCAB, HIDDEN);
    model_free(m);
}

Test(model_load, untied_checkpoint_without_lm_head_is_refused)
{
    struct tiny t = {.omit = "lm_head.weight"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "missing tensor 'lm_head.weight'");
    cr_assert_null(m);
    cr_assert_eq(mem.live, 0, "nothing leaks on failure");
}

Test(model_load, qwen2_loads_qkv_biases)
{
    struct tiny t = {.arch = "Qwen2ForCausalLM", .vec_dtype = "BF16"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    const struct layer_weights *L = &m->weights.layers[0];
    assert_vector_holds(L->bq, "model.layers.0.self_attn.q_proj.bias", 8);
    assert_vector_holds(L->bk, "model.layers.0.self_attn.k_proj.bias", 4);
    assert_vector_holds(L->bv, "model.layers.0.self_attn.v_proj.bias", 4);
    model_free(m);
    cr_assert_eq(mem.live, 0);
}

Test(model_load, llama_attention_bias_loads_qkv_and_output_biases)
{
    struct tiny t = {.attention_bias = true, .config_extra = "\"attention_bias\":true"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    const struct layer_weights *L = &m->weights.layers[1];
    assert_vector_holds(L->bq, "model.layers.1.self_attn.q_proj.bias", 8);
    assert_vector_holds(L->bo, "model.layers.1.self_attn.o_proj.bias", HIDDEN);
    cr_assert_null(m->weights.layers[0].q_norm);
    model_free(m);
    cr_assert_eq(mem.live, 0);
}

Test(model_load, qwen3_loads_qk_norms_with_head_dim_from_config)
{
    struct tiny t = {.arch = "Qwen3ForCausalLM", .head_dim = 6};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    const struct layer_weights *L = &m->weights.layers[1];
    cr_assert_eq(L->wq.rows, HEADS * 6);
    cr_assert_eq(L->wo.cols, HEADS * 6);
    assert_vector_holds(L->q_norm, "model.layers.1.self_attn.q_norm.weight", 6);
    assert_vector_holds(L->k_norm, "model.layers.1.self_attn.k_norm.weight", 6);
    cr_assert_null(L->bq);
    model_free(m);
}

Test(model_load, two_shard_checkpoint_loads)
{
    struct tiny t = {.shards = 2};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->files.n_files, 2);
    assert_matrix_holds(&m->weights.embed, "model.embed_tokens.weight", VOCAB, HIDDEN);
    assert_matrix_holds(&m->weights.lm_head, "lm_head.weight", VOCAB, HIDDEN);
    model_free(m);
}

Test(model_load, read_weights_backends_get_every_matrix_read_from_its_shard)
{
    fake_be.read_weights = true;
    struct tiny t = {.shards = 2};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->files.n_files, 2);
    const struct layer_weights *L = &m->weights.layers[1];
    const struct weight_matrix *checked[] = {&m->weights.embed, &m->weights.lm_head, &L->wq,
                                             &L->w_down};
    for (size_t i = 0; i < sizeof checked / sizeof *checked; i++)
        cr_assert(!points_into_mapping(m, checked[i]->data), "matrix %zu lives in backend memory",
                  i);
    assert_matrix_holds(&m->weights.embed, "model.embed_tokens.weight", VOCAB, HIDDEN);
    assert_matrix_holds(&m->weights.lm_head, "lm_head.weight", VOCAB, HIDDEN);
    assert_matrix_holds(&L->wq, "model.layers.1.self_attn.q_proj.weight", 8, HIDDEN);
    assert_matrix_holds(&L->w_down, "model.layers.1.mlp.down_proj.weight", HIDDEN, INTER);
    model_free(m);
    cr_assert_eq(mem.live, 0, "model_free releases every read copy");
}

Test(model_load, missing_tensor_is_refused_naming_it)
{
    struct tiny t = {.omit = "model.layers.1.mlp.up_proj.weight"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
    cr_assert_eq(mem.live, 0);
}

Test(model_load, qwen2_without_biases_is_refused)
{
    struct tiny t = {.arch = "Qwen2ForCausalLM", .omit = "model.layers.0.self_attn.k_proj.bias"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "model.layers.0.self_attn.k_proj.bias");
}

Test(model_load, extra_tensor_is_refused_naming_it)
{
    struct tiny t = {.extra = "model.layers.0.mlp.extra_proj.weight"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT,
                   "unexpected tensor model.layers.0.mlp.extra_proj.weight");
    cr_assert_eq(mem.live, 0);
}

Test(model_load, rotary_inv_freq_buffers_in_checkpoints_are_ignored)
{
    struct tiny t = {.extra = "model.layers.0.self_attn.rotary_emb.inv_freq"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    model_free(m);
}

Test(model_load, shape_mismatch_with_config_is_refused_with_both_shapes)
{
    struct tiny t = {.reshape = "model.layers.0.self_attn.k_proj.weight"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT,
                   "tensor model.layers.0.self_attn.k_proj.weight has shape [8, 8], config.json "
                   "implies [4, 8]");
    struct tiny v = {.reshape = "model.norm.weight"};
    rc = load_tiny(&v, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT,
                   "tensor model.norm.weight has shape [8, 8], config.json implies [8]");
}

Test(model_load, config_that_disagrees_with_weights_is_refused)
{
    /* The checkpoint has 2 layers of intermediate 12; config says 16. */
    struct tiny t = {.config_extra = "\"intermediate_size\":16"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EFORMAT, "config.json implies [16, 8]");
}

Test(model_load, missing_config_is_an_io_error)
{
    char *dir = test_mkdtemp();
    struct model *m;
    struct err err = {0};
    int rc = model_load(dir, &fake_be, &m, &err);
    assert_refused(rc, err, INFERD_EIO, "config.json");
    test_rmtree(dir);
    free(dir);
}

Test(model_load, missing_weights_are_an_io_error)
{
    char *dir = test_mkdtemp();
    struct tiny t = {0};
    write_config(dir, &t);
    struct model *m;
    struct err err = {0};
    int rc = model_load(dir, &fake_be, &m, &err);
    assert_refused(rc, err, INFERD_EIO, "model.safetensors");
    test_rmtree(dir);
    free(dir);
}

Test(model_load, unsupported_architecture_is_refused_before_weights)
{
    struct tiny t = {.arch = "GPT2LMHeadModel"};
    struct model *m;
    struct err err = {0};
    int rc = load_tiny(&t, &m, &err);
    assert_refused(rc, err, INFERD_EUNSUPPORTED, "'GPT2LMHeadModel'");
}

Test(model_load, backend_out_of_memory_is_reported_and_nothing_leaks)
{
    char *dir = write_tiny(&(struct tiny){.dtype = "F16"});
    for (int fail_at = 1; fail_at <= 12; fail_at++) {
        memset(&mem, 0, sizeof mem);
        mem.fail_at = fail_at;
        struct model *m;
        struct err err = {0};
        int rc = model_load(dir, &fake_be, &m, &err);
        assert_refused(rc, err, INFERD_ENOMEM, "backend memory");
        cr_assert_eq(mem.live, 0, "fail_at %d leaks %d buffers", fail_at, mem.live);
    }
    test_rmtree(dir);
    free(dir);
}

Test(model_load, backend_without_memory_ops_is_refused)
{
    struct backend_ops none = {.name = "none"};
    struct backend be = {.ops = &none};
    struct model *m;
    struct err err = {0};
    assert_refused(model_load("/nonexistent", &be, &m, &err), err, INFERD_EINVAL, "backend");
}

Test(model_load, weight_bytes_per_token_counts_one_decode_step)
{
    struct tiny t = {0};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    /* per layer: q 8x8, k 4x8, v 4x8, o 8x8, gate/up 12x8, down 8x12 in BF16,
     * plus two f32 norms of 8; then the final norm, lm_head and one embedding row. */
    uint64_t layer = (64 + 32 + 32 + 64 + 96 + 96 + 96) * 2 + 2 * 8 * 4;
    uint64_t want = LAYERS * layer + 8 * 4 + VOCAB * HIDDEN * 2 + HIDDEN * 2;
    cr_assert_eq(model_weight_bytes_per_token(m), want);
    model_free(m);

    struct tiny q = {.arch = "Qwen2ForCausalLM", .dtype = "F16"};
    cr_assert_eq(load_tiny(&q, &m, &err), 0, "%s", err.msg);
    /* F16 is widened, so the step reads 4-byte weights; biases add (8 + 4 + 4) floats. */
    layer = (64 + 32 + 32 + 64 + 96 + 96 + 96) * 4 + 2 * 8 * 4 + 16 * 4;
    want = LAYERS * layer + 8 * 4 + VOCAB * HIDDEN * 4 + HIDDEN * 4;
    cr_assert_eq(model_weight_bytes_per_token(m), want);
    model_free(m);
}

/* ---------------------------------------------------------------- rope tables */

/* inv_freq by the textbook formula, entirely in double. */
static double ref_inv_freq(double theta, int head_dim, int i)
{
    return 1.0 / pow(theta, (2.0 * i) / head_dim);
}

static void assert_close(float got, double want, const char *what, int i)
{
    cr_assert(fabs(got - want) <= 2e-6 * fabs(want), "%s[%d] = %.9g, want %.9g", what, i, got,
              want);
}

Test(model_load, rope_table_without_scaling_matches_the_formula)
{
    struct tiny t = {.head_dim = 8, .config_extra = "\"rope_theta\":500000.0"};
    struct model *m;
    struct err err = {0};
    /* head_dim 8 * 2 heads = 16 != hidden 8: fine, shapes follow head_dim. */
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->rope.rot_dim, 8);
    cr_assert_eq(m->rope.inv_freq, m->rope_inv_freq);
    cr_assert_float_eq(m->rope.attention_factor, 1.0f, 0);
    for (int i = 0; i < 4; i++)
        assert_close(m->rope_inv_freq[i], ref_inv_freq(500000.0, 8, i), "inv_freq", i);
    cr_assert_float_eq(m->rope_inv_freq[0], 1.0f, 0);
    model_free(m);
}

Test(model_load, rope_table_with_linear_scaling_divides_by_factor)
{
    struct tiny t = {.config_extra = "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0}"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    for (int i = 0; i < 2; i++)
        assert_close(m->rope_inv_freq[i], ref_inv_freq(10000.0, 4, i) / 4.0, "inv_freq", i);
    cr_assert_float_eq(m->rope_inv_freq[0], 0.25f, 0);
    model_free(m);
}

/* transformers' llama3 rule, written out independently in double. */
static double ref_llama3(double f, double factor, double low, double high, double old_ctx)
{
    double wavelen = 2 * M_PI / f;
    double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    if (wavelen < high_wavelen)
        return f;
    if (wavelen > low_wavelen)
        return f / factor;
    double smooth = (old_ctx / wavelen - low) / (high - low);
    return (1 - smooth) * f / factor + smooth * f;
}

Test(model_load, rope_table_with_llama3_scaling_matches_transformers_rule)
{
    /* Llama 3.1 8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192. */
    struct model_config c = {.head_dim = 128,
                             .rope_theta = 500000.0f,
                             .rope_scaling = ROPE_SCALING_LLAMA3,
                             .rope_factor = 8.0f,
                             .rope_low_freq_factor = 1.0f,
                             .rope_high_freq_factor = 4.0f,
                             .rope_original_max_position = 8192};
    float inv[64];
    model_rope_inv_freq(&c, inv);
    int n_high = 0, n_low = 0, n_mid = 0;
    for (int i = 0; i < 64; i++) {
        double f = ref_inv_freq(500000.0, 128, i);
        double want = ref_llama3(f, 8, 1, 4, 8192);
        assert_close(inv[i], want, "llama3 inv_freq", i);
        double wavelen = 2 * M_PI / f;
        n_high += wavelen < 2048;
        n_low += wavelen > 8192;
        n_mid += wavelen >= 2048 && wavelen <= 8192;
    }
    cr_assert(n_high > 0 && n_low > 0 && n_mid > 0, "all three bands are exercised (%d/%d/%d)",
              n_high, n_mid, n_low);
    cr_assert_float_eq(inv[0], 1.0f, 0, "the highest frequency is untouched");
}

Test(model_load, rope_table_with_llama3_scaling_is_loaded_from_config)
{
    struct tiny t = {.head_dim = 16,
                     .config_extra = "\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":"
                                     "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                                     "\"high_freq_factor\":4.0,"
                                     "\"original_max_position_embeddings\":8192}"};
    struct model *m;
    struct err err = {0};
    cr_assert_eq(load_tiny(&t, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->config.rope_scaling, ROPE_SCALING_LLAMA3);
    for (int i = 0; i < 8; i++)
        assert_close(m->rope_inv_freq[i],
                     ref_llama3(ref_inv_freq(500000.0, 16, i), 8, 1, 4, 8192), "inv_freq", i);
    model_free(m);
}
