/* tests/unit/test_mlx_quant.c — MLX-quantized safetensors: the affine block layout on known bits, the loader's groups holding the file's values unchanged, our forward against the dequantized reference, and malformed quantization fields and tensors as clear errors. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/quant.h"
#include "kv/kv.h"
#include "model/model.h"
#include "tools/mkmodel.h"
#include "tools/mlx_write.h"
#include "test_support.h"

#define SHAPE(nm, ar, dt, tied)                                                              \
    {.name = nm, .arch = ar, .vocab_size = 512, .hidden_size = 256, .intermediate_size = 384, \
     .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,                           \
     .max_position_embeddings = 2048, .tie_word_embeddings = tied, .rope_theta = "10000.0",  \
     .rms_norm_eps = "1e-06", .rope = MKMODEL_ROPE_NONE, .dtype = dt, .bos_token_id = 1,     \
     .eos_token_ids = {2}, .n_eos = 1, .gen_eos_token_ids = {2}, .n_gen_eos = 1,              \
     .pad_token_id = -1}

/* Each float type of scales and biases (the checkpoint's own), tied and untied heads. */
static const struct mkmodel_preset shapes[] = {
    SHAPE("mlx-qwen3", "qwen3", DTYPE_BF16, true),
    SHAPE("mlx-llama-f16", "llama", DTYPE_F16, false),
    SHAPE("mlx-llama-f32", "llama", DTYPE_F32, false),
};

static const int bits_of[] = {4, 8};
static const int groups_of[] = {32, 64, 128};

static void fill(float *x, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)(seed >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

/* ---------------------------------------------------------------- the block */

Test(mlx_block, sizes_are_scale_bias_and_the_groups_packed_bytes)
{
    cr_assert_eq(dtype_block_bytes(DTYPE_MLX4_G32_BF16), 4 + 16);
    cr_assert_eq(dtype_block_bytes(DTYPE_MLX4_G64_F32), 8 + 32);
    cr_assert_eq(dtype_block_bytes(DTYPE_MLX8_G128_F16), 4 + 128);
    cr_assert_eq(dtype_row_bytes(DTYPE_MLX4_G64_BF16, 256), 4 * 36);
    cr_assert_eq(dtype_block_elems(DTYPE_MLX8_G128_BF16), 128);
    cr_assert_eq(dtype_mlx(8, 64, DTYPE_F16), DTYPE_MLX8_G64_F16);
    cr_assert_eq(dtype_mlx(3, 64, DTYPE_F16), DTYPE_COUNT);
    cr_assert_eq(dtype_mlx(4, 16, DTYPE_BF16), DTYPE_COUNT);
    cr_assert_str_eq(dtype_name(DTYPE_MLX4_G128_F32), "MLX4_G128_F32");
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int s = 0; s < 3; s++) {
                enum dtype sc = s == 0 ? DTYPE_BF16 : s == 1 ? DTYPE_F16 : DTYPE_F32;
                enum dtype t = dtype_mlx(bits_of[b], groups_of[g], sc);
                cr_assert(dtype_is_block(t) && dtype_is_mlx(t));
                cr_assert_eq(dtype_mlx_bits(t), bits_of[b]);
                cr_assert_eq(dtype_mlx_group(t), groups_of[g]);
                cr_assert_eq(dtype_mlx_scale(t), sc);
            }
    cr_assert(!dtype_is_block(DTYPE_U32));
    cr_assert_eq(dtype_size(DTYPE_U32), 4);
}

/* MLX packs element j of a group at bits [j * bits, j * bits + bits) of its
 * little-endian uint32 words: 4-bit element 8w + k is nibble k of word w. */
Test(mlx_block, element_j_is_bits_j_times_bits_of_the_words_and_x_is_scale_q_plus_bias)
{
    uint8_t b[20];
    uint16_t s = f32_to_bf16(0.5f), z = f32_to_bf16(-1.0f);
    memcpy(b, &s, 2);
    memcpy(b + 2, &z, 2);
    for (int w = 0; w < 4; w++) {
        uint32_t word = 0;
        for (int k = 0; k < 8; k++)
            word |= (uint32_t)((8 * w + k) * 5 % 16) << (4 * k);
        memcpy(b + 4 + 4 * w, &word, 4);
    }
    float y[32];
    quant_dequantize_row(DTYPE_MLX4_G32_BF16, b, y, 32);
    for (int j = 0; j < 32; j++)
        cr_assert_eq(y[j], 0.5f * (float)(j * 5 % 16) - 1.0f, "element %d: %g", j, y[j]);

    uint8_t b8[8 + 64];
    float sf = 0.03125f, zf = 2.0f;
    memcpy(b8, &sf, 4);
    memcpy(b8 + 4, &zf, 4);
    for (int j = 0; j < 64; j++)
        b8[8 + j] = (uint8_t)(j * 7 % 256); /* byte j of the words: element j */
    float y8[64];
    quant_dequantize_row(DTYPE_MLX8_G64_F32, b8, y8, 64);
    for (int j = 0; j < 64; j++)
        cr_assert_eq(y8[j], 0.03125f * (float)(j * 7 % 256) + 2.0f);
}

/* MLX's rule puts the larger-magnitude end of the range on a whole number
 * |q0| >= (2^bits - 1) / 2 of steps from zero and stretches or shrinks the
 * step to fit, so the far end may be clamped by up to half a step times
 * (2^bits - 1) / |q0| <= 1 step; every element is within 1.5 steps, plus
 * what rounding scale and bias to their type moves an element by. */
Test(mlx_block, the_reference_quantizer_round_trips_within_a_step_and_a_half)
{
    for (int t = DTYPE_MLX4_G32_BF16; t <= DTYPE_MLX8_G128_F32; t++) {
        int g = dtype_mlx_group((enum dtype)t), bits = dtype_mlx_bits((enum dtype)t);
        float x[256], y[256];
        uint8_t q[512]; /* a row of 256 is at most 8 blocks of 8 + 32 bytes */
        fill(x, 256, (uint32_t)t);
        for (int i = 0; i < 256; i++)
            x[i] = x[i] * 3.0f + (i < 128 ? 0.5f : -2.0f);
        quant_quantize_row((enum dtype)t, x, q, 256);
        quant_dequantize_row((enum dtype)t, q, y, 256);
        double rel = dtype_mlx_scale((enum dtype)t) == DTYPE_BF16 ? 0x1p-8
                   : dtype_mlx_scale((enum dtype)t) == DTYPE_F16 ? 0x1p-10 : 0x1p-22;
        for (int i0 = 0; i0 < 256; i0 += g) {
            float lo = x[i0], hi = x[i0];
            for (int i = i0; i < i0 + g; i++) {
                lo = fminf(lo, x[i]);
                hi = fmaxf(hi, x[i]);
            }
            double step = (hi - lo) / ((1 << bits) - 1);
            double tol = 1.5 * step + 2 * rel * (fabs(lo) + fabs(hi)) + 1e-6;
            for (int i = i0; i < i0 + g; i++)
                cr_assert_leq(fabs((double)y[i] - x[i]), tol, "%s element %d: %g for %g",
                              dtype_name((enum dtype)t), i, y[i], x[i]);
        }
    }
}

/* ---------------------------------------------------------------- the loader */

/* Element (r, c) of an MLX-quantized matrix straight from the file's three
 * tensors, by MLX's definition. */
static float file_element(const struct st_tensor *w, const struct st_tensor *s,
                          const struct st_tensor *b, int64_t cols, int64_t r, int64_t c)
{
    int64_t n_words = w->shape[1], n_groups = s->shape[1];
    int bits = (int)(n_words * 32 / cols), group = (int)(cols / n_groups);
    uint32_t word;
    memcpy(&word, (const uint8_t *)w->data + 4 * (r * n_words + c * bits / 32), 4);
    uint32_t q = (word >> (c * bits % 32)) & ((1u << bits) - 1);
    size_t gi = (size_t)(r * n_groups + c / group);
    float sv, bv;
    if (s->dtype == DTYPE_F32) {
        memcpy(&sv, (const uint8_t *)s->data + 4 * gi, 4);
        memcpy(&bv, (const uint8_t *)b->data + 4 * gi, 4);
    } else {
        uint16_t hs, hb;
        memcpy(&hs, (const uint8_t *)s->data + 2 * gi, 2);
        memcpy(&hb, (const uint8_t *)b->data + 2 * gi, 2);
        sv = s->dtype == DTYPE_BF16 ? bf16_to_f32(hs) : f16_to_f32(hs);
        bv = s->dtype == DTYPE_BF16 ? bf16_to_f32(hb) : f16_to_f32(hb);
    }
    volatile float prod = sv * (float)q; /* two roundings, as MLX (no fused multiply-add) */
    return prod + bv;
}

static char *write_mlx_model(const struct mkmodel_preset *p, int bits, int group, char **src_out)
{
    struct err err = {0};
    char *src = test_mkdtemp(), *dst = test_mkdtemp();
    struct mkmodel_opts o = {.shape = p, .seed = 5, .out_dir = src};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    cr_assert_eq(mlx_write_model(src, bits, group, dst, &err), 0, "%s", err.msg);
    *src_out = src;
    return dst;
}

static void check_matrix(struct model *m, struct st_set *file, const char *name,
                         const struct weight_matrix *w, enum dtype want)
{
    char sn[256], bn[256];
    size_t len = strlen(name) - 7;
    snprintf(sn, sizeof sn, "%.*s.scales", (int)len, name);
    snprintf(bn, sizeof bn, "%.*s.biases", (int)len, name);
    const struct st_tensor *tw = st_set_find(file, name), *ts = st_set_find(file, sn),
                           *tb = st_set_find(file, bn);
    cr_assert(tw && ts && tb, "%s: the file has weight, scales and biases", name);
    cr_assert_eq(tw->dtype, DTYPE_U32);
    cr_assert_eq(w->dtype, want, "%s is %s, not %s", name, dtype_name(w->dtype),
                 dtype_name(want));
    uint64_t rb = dtype_row_bytes(w->dtype, (uint64_t)w->cols);
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r += 7) {
        quant_dequantize_row(w->dtype, (const uint8_t *)w->data + (uint64_t)r * rb, row, w->cols);
        for (int64_t c = 0; c < w->cols; c++) {
            float want_v = file_element(tw, ts, tb, w->cols, r, c);
            cr_assert_eq(row[c], want_v, "%s (%lld, %lld): %a, the file says %a", name,
                         (long long)r, (long long)c, row[c], want_v);
        }
    }
    free(row);
    (void)m;
}

/* Every quantized module of the file becomes one matrix of MLX blocks whose
 * dequantized values are, bit for bit, scale * q + bias of the file's own
 * scales, biases and packed words: the embedding, the layers, an untied head. */
Test(mlx_load, the_loader_keeps_every_value_of_the_file, .timeout = 300)
{
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 2; b++)
            for (int g = 0; g < 3; g++) {
                char *src, *dir = write_mlx_model(&shapes[s], bits_of[b], groups_of[g], &src);
                struct err err = {0};
                struct backend *be;
                struct model *m;
                struct st_set file;
                cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1}, &be, &err),
                             0);
                cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s: %s", shapes[s].name, err.msg);
                cr_assert_eq(m->config.quant_bits, bits_of[b]);
                cr_assert_eq(m->config.quant_group_size, groups_of[g]);
                cr_assert_eq(st_set_open(dir, &file, &err), 0, "%s", err.msg);
                enum dtype want = dtype_mlx(bits_of[b], groups_of[g], shapes[s].dtype);
                check_matrix(m, &file, "model.embed_tokens.weight", &m->weights.embed, want);
                check_matrix(m, &file, "model.layers.1.mlp.down_proj.weight",
                             &m->weights.layers[1].w_down, want);
                check_matrix(m, &file, "model.layers.0.self_attn.k_proj.weight",
                             &m->weights.layers[0].wk, want);
                if (!shapes[s].tie_word_embeddings)
                    check_matrix(m, &file, "lm_head.weight", &m->weights.lm_head, want);
                else
                    cr_assert_eq(m->weights.lm_head.data, m->weights.embed.data);
                st_set_close(&file);
                model_free(m);
                backend_destroy(be);
                test_rmtree(dir);
                test_rmtree(src);
                free(dir);
                free(src);
            }
}

Test(mlx_load, mkmodel_mlx_output_is_deterministic)
{
    char *src1, *src2;
    char *a = write_mlx_model(&shapes[0], 4, 64, &src1), *b = write_mlx_model(&shapes[0], 4, 64, &src2);
    char ha[32], hb[32];
    struct err err = {0};
    const char *files[] = {"model.safetensors", "config.json"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(mkmodel_file_fnv1a64(a, files[i], ha, sizeof ha, &err), 0, "%s", err.msg);
        cr_assert_eq(mkmodel_file_fnv1a64(b, files[i], hb, sizeof hb, &err), 0, "%s", err.msg);
        cr_assert_str_eq(ha, hb, "%s differs between two runs", files[i]);
    }
    const char *dirs[] = {a, b, src1, src2};
    for (int i = 0; i < 4; i++) {
        test_rmtree(dirs[i]);
        free((void *)dirs[i]);
    }
}

/* ---------------------------------------------------------------- the forward */

struct loaded {
    struct backend *be;
    struct model *m;
    struct kv_pool *pool;
    struct forward_state *st;
};

/* blocks false: the backend takes no block weights, so the loader widens the
 * MLX groups to F32 (the dequantize-to-f32 reference forward). */
static void load(const char *path, bool blocks, struct loaded *l)
{
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &l->be, &err), 0,
                 "%s", err.msg);
    l->be->block_weights = blocks;
    cr_assert_eq(model_load(path, l->be, &l->m, &err), 0, "%s: %s", path, err.msg);
    cr_assert_eq(kv_pool_create(l->m, l->be, 8, 16, &l->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(l->m, 64, &l->st, &err), 0, "%s", err.msg);
}

static void unload(struct loaded *l)
{
    forward_state_free(l->st);
    kv_pool_free(l->pool);
    model_free(l->m);
    backend_destroy(l->be);
}

static float *logits_of(struct loaded *l, const int32_t *given, int p, int n)
{
    int32_t tokens[64];
    for (int i = 0; i < n; i++)
        tokens[i] = given ? given[i] : (int32_t)((i * 37 + p * 101 + 11) % l->m->config.vocab_size);
    uint32_t blocks[4] = {0, 1, 2, 3};
    struct batch_seq seq = {tokens, n, 0, blocks, 4, true, false};
    struct batch batch = {&seq, 1};
    float *logits = malloc((size_t)n * (size_t)l->m->config.vocab_size * sizeof *logits);
    struct err err = {0};
    cr_assert_eq(model_forward(l->m, l->st, &l->pool->cache, &batch, logits, &err), 0, "%s",
                 err.msg);
    kv_pool_free(l->pool);
    cr_assert_eq(kv_pool_create(l->m, l->be, 8, 16, &l->pool, &err), 0, "%s", err.msg);
    return logits;
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Our forward on the MLX blocks against the reference forward of the same
 * weights widened to F32 at load. The weights are equal bit for bit (the
 * test above), and x is not quantized for these types (the CPU's generic
 * block path dots f32 x with each dequantized group), so the two differ only
 * in the order each dot product is summed (a group at a time against the
 * dense kernel's order): f32 rounding, a relative error of about
 * sqrt(K) * 2^-24 per product (K <= 384 terms: ~1.2e-6), growing through the
 * 2 layers' 4 products each and the head to the order of 1e-5 of the logits'
 * scale. We allow 1e-4 of rms(logit) at the worst logit, and every greedy
 * pick equal (a flip would need two logits within 1e-4 rms of each other). */
#define MLX_LOGIT_TOL 1e-4

Test(mlx_forward, mlx_blocks_run_as_their_dequantized_reference, .timeout = 600)
{
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 2; b++)
            for (int g = 0; g < 3; g += 1 + (s > 0)) {
                char *src, *dir = write_mlx_model(&shapes[s], bits_of[b], groups_of[g], &src);
                struct loaded q, ref;
                load(dir, true, &q);
                load(dir, false, &ref);
                cr_assert(dtype_is_mlx(q.m->weights.layers[0].w_up.dtype));
                cr_assert_eq(ref.m->weights.layers[0].w_up.dtype, DTYPE_F32);
                int V = q.m->config.vocab_size, n = 24;
                double worst = 0, sq = 0;
                int flips = 0;
                for (int p = 0; p < 2; p++) {
                    float *a = logits_of(&q, NULL, p, n), *r = logits_of(&ref, NULL, p, n);
                    for (int i = 0; i < n * V; i++) {
                        cr_assert(isfinite(a[i]));
                        worst = fmax(worst, fabs((double)a[i] - r[i]));
                        sq += (double)r[i] * r[i];
                    }
                    for (int i = 0; i < n; i++)
                        flips += argmax(a + i * V, V) != argmax(r + i * V, V);
                    free(a);
                    free(r);
                }
                double rms = sqrt(sq / (2.0 * n * V));
                cr_log_info("%s mlx %d-bit g%d: max |dlogit| %.3g = %.3g rms", shapes[s].name,
                            bits_of[b], groups_of[g], worst, worst / rms);
                cr_assert_leq(worst, MLX_LOGIT_TOL * rms, "%s %d-bit g%d: max |dlogit| %g of "
                              "rms %g", shapes[s].name, bits_of[b], groups_of[g], worst, rms);
                cr_assert_eq(flips, 0, "%s %d-bit g%d: %d greedy picks differ", shapes[s].name,
                             bits_of[b], groups_of[g], flips);
                unload(&q);
                unload(&ref);
                test_rmtree(dir);
                test_rmtree(src);
                free(dir);
                free(src);
            }
}

/* A trained model (models/house, a small Qwen3: hidden 384, so groups of
 * 128 too) at 4 bits in groups of 64, as mlx-community's default: its held
 * out text's greedy picks are its dequantized self's (1024 positions). */
Test(mlx_forward, the_house_model_at_4_bits_picks_as_its_dequantized_self, .timeout = 600)
{
    char golden[4200], src[4200];
    snprintf(golden, sizeof golden, "%s/tests/goldens/house/perplexity.json", INFERD_SOURCE_DIR);
    snprintf(src, sizeof src, "%s/models/house", INFERD_SOURCE_DIR);
    json_object *root = json_object_from_file(golden);
    cr_assert_not_null(root, "%s", golden);
    json_object *toks = json_object_object_get(root, "tokens");
    enum { PROMPTS = 16, N = 64 };
    int32_t tokens[PROMPTS * N];
    for (int i = 0; i < PROMPTS * N; i++)
        tokens[i] = json_object_get_int(
            json_object_array_get_idx(toks, (size_t)(i / N) * 2903 + (size_t)(i % N)));
    json_object_put(root);
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mlx_write_model(src, 4, 64, dir, &err), 0, "%s", err.msg);
    struct loaded q, ref;
    load(dir, true, &q);
    load(dir, false, &ref);
    int V = q.m->config.vocab_size, agree = 0;
    for (int p = 0; p < PROMPTS; p++) {
        float *a = logits_of(&q, tokens + p * N, p, N), *r = logits_of(&ref, tokens + p * N, p, N);
        for (int i = 0; i < N; i++)
            agree += argmax(a + i * V, V) == argmax(r + i * V, V);
        free(a);
        free(r);
    }
    cr_log_info("house mlx 4-bit g64: argmax agreement %d/%d", agree, PROMPTS * N);
    cr_assert_geq(agree * 100, PROMPTS * N * 99, "argmax agrees at %d of %d", agree, PROMPTS * N);
    unload(&q);
    unload(&ref);
    test_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- bad input */

static int parse_with_quant(const char *quant, const char *key, struct model_config *c,
                            struct err *err)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 64, "
             "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
             "\"num_attention_heads\": 2, \"%s\": %s}",
             key, quant);
    return model_config_parse(json, strlen(json), c, err);
}

Test(mlx_config, quantization_fields_are_checked_with_clear_errors)
{
    struct model_config c;
    struct err err = {0};
    static const struct {
        const char *q, *key, *says;
        int code;
    } cases[] = {
        {"{\"group_size\": 64, \"bits\": 3}", "quantization", "bits 3", INFERD_EUNSUPPORTED},
        {"{\"group_size\": 16, \"bits\": 4}", "quantization", "group_size 16", INFERD_EUNSUPPORTED},
        {"{\"group_size\": 64}", "quantization", "bits", INFERD_EFORMAT},
        {"{\"bits\": 4}", "quantization", "group_size", INFERD_EFORMAT},
        {"{\"group_size\": \"64\", \"bits\": 4}", "quantization", "group_size", INFERD_EFORMAT},
        {"{\"group_size\": 64, \"bits\": 4, \"mode\": \"mxfp4\"}", "quantization", "mxfp4",
         INFERD_EUNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}", "quantization_config",
         "gptq", INFERD_EUNSUPPORTED},
        {"{\"group_size\": 64, \"bits\": 4, \"model.layers.0.mlp.down_proj\": 5}", "quantization",
         "down_proj", INFERD_EFORMAT},
        {"{\"group_size\": 64, \"bits\": 4, \"lm_head\": {\"group_size\": 64, \"bits\": 2}}",
         "quantization", "bits 2", INFERD_EUNSUPPORTED},
        {"[4, 64]", "quantization", "quantization", INFERD_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = parse_with_quant(cases[i].q, cases[i].key, &c, &err);
        cr_assert_eq(rc, -cases[i].code, "%s: rc %d (%s)", cases[i].q, rc, err.msg);
        cr_assert(strstr(err.msg, cases[i].says), "%s: '%s' does not say %s", cases[i].q,
                  err.msg, cases[i].says);
    }
    cr_assert_eq(parse_with_quant("{\"group_size\": 128, \"bits\": 8, \"mode\": \"affine\", "
                                  "\"model.embed_tokens\": false, \"lm_head\": {\"group_size\": "
                                  "32, \"bits\": 4}}",
                                  "quantization_config", &c, &err),
                 0, "%s", err.msg);
    cr_assert_eq(c.quant_bits, 8);
    cr_assert_eq(c.quant_group_size, 128);
}

/* Fuzz-ish: random bits, group sizes and extra entries; a config parses
 * exactly when every {bits, group_size} is one the loader runs, and a refusal
 * always says which field. */
Test(mlx_config, random_quantization_objects_parse_only_when_valid)
{
    static const int bits[] = {-1, 0, 1, 2, 3, 4, 5, 6, 8, 16, 32};
    static const int groups[] = {0, 1, 16, 31, 32, 33, 64, 100, 128, 256, 1024};
    uint32_t seed = 12345;
    for (int it = 0; it < 2000; it++) {
        seed = seed * 1664525u + 1013904223u;
        int b = bits[(seed >> 8) % 11], g = groups[(seed >> 16) % 11];
        int ob = bits[(seed >> 4) % 11], og = groups[(seed >> 12) % 11];
        bool extra = (seed >> 24) & 1;
        char q[256];
        snprintf(q, sizeof q, "{\"group_size\": %d, \"bits\": %d%s", g, b, extra ? ", " : "}");
        if (extra)
            snprintf(q + strlen(q), sizeof q - strlen(q),
                     "\"model.layers.0.self_attn.q_proj\": {\"group_size\": %d, \"bits\": %d}}", og,
                     ob);
        bool ok = (b == 4 || b == 8) && (g == 32 || g == 64 || g == 128) &&
                  (!extra || ((ob == 4 || ob == 8) && (og == 32 || og == 64 || og == 128)));
        struct model_config c;
        struct err err = {0};
        int rc = parse_with_quant(q, "quantization", &c, &err);
        cr_assert_eq(rc == 0, ok, "%s: rc %d (%s)", q, rc, err.msg);
        if (!ok)
            cr_assert(strstr(err.msg, "bits") || strstr(err.msg, "group_size"), "%s: %s", q,
                      err.msg);
    }
}

/* A model directory of config.json (tiny, quantized unless plain) and a
 * safetensors file of the given tensors, each zero-filled. */
struct st_entry {
    const char *name, *dtype;
    int64_t rows, cols;
};

static char *write_dir(const struct st_entry *e, int n, bool quantized)
{
    char *dir = test_mkdtemp(), path[4200], hdr[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 8, \"hidden_size\": "
             "128, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
             "\"num_attention_heads\": 2%s}",
             quantized ? ", \"quantization\": {\"group_size\": 64, \"bits\": 4}" : "");
    cr_assert_eq(test_write_file(path, cfg, strlen(cfg)), 0);
    size_t len = (size_t)snprintf(hdr, sizeof hdr, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t es = !strcmp(e[i].dtype, "F32") || !strcmp(e[i].dtype, "U32") ? 4 : 2;
        uint64_t bytes = (uint64_t)(e[i].rows * e[i].cols) * es;
        len += (size_t)snprintf(hdr + len, sizeof hdr - len,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                                "\"data_offsets\":[%llu,%llu]}",
                                i ? "," : "", e[i].name, e[i].dtype, (long long)e[i].rows,
                                (long long)e[i].cols, (unsigned long long)off,
                                (unsigned long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    size_t total = 8 + len + (size_t)off;
    uint8_t *file = calloc(1, total);
    for (int i = 0; i < 8; i++)
        file[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(file + 8, hdr, len);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(test_write_file(path, file, total), 0);
    free(file);
    return dir;
}

/* The embedding is loaded first, so a malformed quantized embedding is the
 * error whatever else the file lacks. */
Test(mlx_load, malformed_quantized_tensors_are_clear_errors)
{
#define EMB "model.embed_tokens."
    static const struct {
        struct st_entry e[3];
        bool quantized;
        const char *says;
    } cases[] = {
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "BF16", 8, 2}, {EMB "biases", "BF16", 8, 2}},
         false, "no quantization"},
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "BF16", 8, 2}, {NULL}}, true,
         "model.embed_tokens.biases"},
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "BF16", 8, 2}, {EMB "biases", "F16", 8, 2}},
         true, "does not match"},
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "BF16", 7, 2}, {EMB "biases", "BF16", 7, 2}},
         true, "shape"},
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "U32", 8, 2}, {EMB "biases", "U32", 8, 2}},
         true, "BF16, F16 or F32"},
        {{{EMB "weight", "U32", 8, 8}, {EMB "scales", "BF16", 8, 2}, {EMB "biases", "BF16", 8, 2}},
         true, "2 bits"},
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "BF16", 8, 8}, {EMB "biases", "BF16", 8, 8}},
         true, "groups of 16"},
        {{{EMB "weight", "U32", 8, 16}, {EMB "scales", "BF16", 8, 3}, {EMB "biases", "BF16", 8, 3}},
         true, "do not split"},
        {{{EMB "weight", "U32", 9, 16}, {EMB "scales", "BF16", 9, 2}, {EMB "biases", "BF16", 9, 2}},
         true, "packed weight"},
    };
#undef EMB
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = cases[i].e[2].name ? 3 : 2;
        char *dir = write_dir(cases[i].e, n, cases[i].quantized);
        struct err err = {0};
        struct backend *be;
        struct model *m = NULL;
        cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1}, &be, &err), 0);
        int rc = model_load(dir, be, &m, &err);
        cr_assert_lt(rc, 0, "case %zu loaded", i);
        cr_assert_null(m);
        cr_assert(strstr(err.msg, cases[i].says), "case %zu: '%s' does not say '%s'", i, err.msg,
                  cases[i].says);
        backend_destroy(be);
        test_rmtree(dir);
        free(dir);
    }
}
