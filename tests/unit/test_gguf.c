/* tests/unit/test_gguf.c — GGUF files: malformed ones are refused by name, mkmodel's load to the same model as safetensors (bf16 bit for bit), and their tokenizers encode as tokenizer.json does. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "model/gguf.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "tools/gguf_write.h"
#include "tools/mkmodel.h"
#include "test_support.h"

/* ---------------------------------------------------------------- hand-made files */

struct image {
    uint8_t buf[4096];
    size_t len;
};

static void put(struct image *im, const void *p, size_t n)
{
    memcpy(im->buf + im->len, p, n);
    im->len += n;
}
static void u32(struct image *im, uint32_t v) { put(im, &v, 4); }
static void u64(struct image *im, uint64_t v) { put(im, &v, 8); }
static void str(struct image *im, const char *s)
{
    u64(im, strlen(s));
    put(im, s, strlen(s));
}

/* A v3 header with one u32 key and n_tensors tensor records of type ty, each
 * 32 F32/… elements at offsets 0, 256, …; the data section follows. */
static void header(struct image *im, uint32_t version, int n_tensors, uint32_t ty)
{
    im->len = 0;
    put(im, "GGUF", 4);
    u32(im, version);
    u64(im, (uint64_t)n_tensors);
    u64(im, 1);
    str(im, "general.alignment");
    u32(im, GGUF_U32);
    u32(im, 32);
    for (int i = 0; i < n_tensors; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        str(im, name);
        u32(im, 1);
        u64(im, 32);
        u32(im, ty);
        u64(im, (uint64_t)i * 256);
    }
    while (im->len % 32)
        im->buf[im->len++] = 0;
}

static int parse(struct image *im, struct err *err)
{
    struct gguf_file f;
    int rc = gguf_parse(im->buf, im->len, &f, err);
    if (!rc)
        gguf_close(&f);
    return rc;
}

Test(gguf_parse, a_well_formed_file_parses_with_its_tensors_in_place)
{
    struct image im;
    header(&im, 3, 2, 0);
    im.len += 512;
    struct gguf_file f;
    struct err err = {0};
    cr_assert_eq(gguf_parse(im.buf, im.len, &f, &err), 0, "%s", err.msg);
    cr_assert_eq(f.n_tensors, 2);
    cr_assert_eq(f.tensors[1].nbytes, 128);
    cr_assert_eq(f.tensors[1].data, im.buf + f.data_offset + 256);
    cr_assert_eq(gguf_find(&f, "general.alignment")->i, 32);
    gguf_close(&f);
}

Test(gguf_parse, every_truncation_is_an_error_naming_the_byte)
{
    struct image im;
    header(&im, 3, 2, 0);
    im.len += 512;
    size_t full = im.len;
    struct err err = {0};
    for (size_t cut = 0; cut < full - 512 + 256; cut++) {
        im.len = cut;
        cr_assert_lt(parse(&im, &err), 0, "cut at %zu accepted", cut);
    }
}

Test(gguf_parse, bad_magic_and_versions_are_refused)
{
    struct image im;
    struct err err = {0};
    header(&im, 3, 0, 0);
    im.buf[0] = 'X';
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "not a GGUF file"), "%s", err.msg);
    header(&im, 1, 0, 0);
    cr_assert_eq(parse(&im, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "version 1"), "%s", err.msg);
    header(&im, __builtin_bswap32(3), 0, 0);
    cr_assert_eq(parse(&im, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "big-endian"), "%s", err.msg);
    header(&im, 2, 0, 0);
    cr_assert_eq(parse(&im, &err), 0, "%s", err.msg);
}

Test(gguf_parse, unsupported_tensor_types_are_refused_by_name)
{
    struct image im;
    struct err err = {0};
    header(&im, 3, 1, 16 /* IQ2_XXS */);
    im.len += 256;
    cr_assert_eq(parse(&im, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "IQ2_XXS"), "%s", err.msg);
    header(&im, 3, 1, 77);
    im.len += 256;
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "unknown type 77"), "%s", err.msg);
}

Test(gguf_parse, rows_that_are_not_whole_blocks_are_refused)
{
    struct image im;
    struct err err = {0};
    header(&im, 3, 1, 12 /* Q4_K: 256 per block, rows of 32 */);
    im.len += 256;
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "Q4_K blocks of 256"), "%s", err.msg);
}

Test(gguf_parse, tensors_outside_the_file_overlapping_or_misaligned_are_refused)
{
    struct image im;
    struct err err = {0};
    header(&im, 3, 2, 0);
    im.len += 300; /* the second tensor ends past the end */
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "outside"), "%s", err.msg);

    header(&im, 3, 2, 0);
    im.len += 512;
    /* second tensor's offset (the last 8 bytes of its record) to 64: overlaps the first (128 B) */
    size_t rec_end = 0;
    for (size_t i = 0; i + 2 < im.len; i++)
        if (!memcmp(im.buf + i, "t1", 2))
            rec_end = i + 2 + 4 + 8 + 4;
    uint64_t off = 64;
    memcpy(im.buf + rec_end, &off, 8);
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "overlap"), "%s", err.msg);
    off = 260;
    memcpy(im.buf + rec_end, &off, 8);
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "alignment"), "%s", err.msg);
}

Test(gguf_parse, duplicate_keys_and_tensor_names_are_refused)
{
    struct image im;
    struct err err = {0};
    im.len = 0;
    put(&im, "GGUF", 4);
    u32(&im, 3);
    u64(&im, 0);
    u64(&im, 2);
    for (int i = 0; i < 2; i++) {
        str(&im, "a.key");
        u32(&im, GGUF_STRING);
        str(&im, "v");
    }
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "a.key appears twice"), "%s", err.msg);

    header(&im, 3, 2, 0);
    im.len += 512;
    for (size_t i = 0; i + 2 < im.len; i++)
        if (!memcmp(im.buf + i, "t1", 2))
            im.buf[i + 1] = '0';
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "t0 appears twice"), "%s", err.msg);
}

Test(gguf_parse, huge_counts_are_refused_before_allocating)
{
    struct image im;
    struct err err = {0};
    im.len = 0;
    put(&im, "GGUF", 4);
    u32(&im, 3);
    u64(&im, 0);
    u64(&im, 1);
    str(&im, "k");
    u32(&im, GGUF_ARRAY);
    u32(&im, GGUF_STRING);
    u64(&im, 1ull << 40);
    cr_assert_eq(parse(&im, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "cannot fit"), "%s", err.msg);
}

/* ---------------------------------------------------------------- models */

struct loaded {
    struct backend *be;
    struct model *m;
    struct kv_pool *pool;
    struct forward_state *st;
};

static void load_mode(const char *path, enum compute_mode mode, struct loaded *l)
{
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2, .mode = mode}, &l->be,
                                    &err),
                 0, "%s", err.msg);
    cr_assert_eq(model_load(path, l->be, &l->m, &err), 0, "%s: %s", path, err.msg);
    cr_assert_eq(kv_pool_create(l->m, l->be, 8, 16, &l->pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(l->m, 32, &l->st, &err), 0, "%s", err.msg);
}

static void load(const char *path, struct loaded *l) { load_mode(path, COMPUTE_EXACT, l); }

static void unload(struct loaded *l)
{
    forward_state_free(l->st);
    kv_pool_free(l->pool);
    model_free(l->m);
    backend_destroy(l->be);
}

/* Logits of every position of a fixed prompt. */
static float *prompt_logits(struct loaded *l, int n)
{
    int32_t tokens[24];
    for (int i = 0; i < n; i++)
        tokens[i] = (int32_t)((i * 37 + 11) % l->m->config.vocab_size);
    uint32_t blocks[2] = {0, 1};
    struct batch_seq seq = {tokens, n, 0, blocks, 2, true, false, NULL, NULL, 0};
    struct batch batch = {&seq, 1};
    float *logits = malloc((size_t)n * (size_t)l->m->config.vocab_size * sizeof *logits);
    struct err err = {0};
    cr_assert_eq(model_forward(l->m, l->st, &l->pool->cache, &batch, logits, &err), 0, "%s",
                 err.msg);
    return logits;
}

/* The preset as safetensors and as GGUF of ftype, loaded side by side in mode. */
static void both_mode(const char *preset, enum gguf_ftype ftype, enum compute_mode mode,
                      char **tmp, struct loaded *st, struct loaded *gg)
{
    struct err err = {0};
    *tmp = test_mkdtemp();
    struct mkmodel_opts o = {.preset = preset, .seed = 5, .out_dir = *tmp};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.gguf", *tmp);
    cr_assert_eq(gguf_write_model(*tmp, ftype, path, &err), 0, "%s", err.msg);
    load_mode(*tmp, mode, st);
    load_mode(path, mode, gg);
}

static void both(const char *preset, enum gguf_ftype ftype, char **tmp, struct loaded *st,
                 struct loaded *gg)
{
    both_mode(preset, ftype, COMPUTE_EXACT, tmp, st, gg);
}

static void finish(char *tmp, struct loaded *a, struct loaded *b)
{
    unload(a);
    unload(b);
    test_rmtree(tmp);
    free(tmp);
}

static void check_same_config(const struct model_config *a, const struct model_config *b)
{
    cr_assert_eq(a->arch, b->arch);
    cr_assert_eq(a->vocab_size, b->vocab_size);
    cr_assert_eq(a->hidden_size, b->hidden_size);
    cr_assert_eq(a->intermediate_size, b->intermediate_size);
    cr_assert_eq(a->n_layers, b->n_layers);
    cr_assert_eq(a->n_heads, b->n_heads);
    cr_assert_eq(a->n_kv_heads, b->n_kv_heads);
    cr_assert_eq(a->head_dim, b->head_dim);
    cr_assert_eq(a->rms_norm_eps, b->rms_norm_eps);
    cr_assert_eq(a->rope_theta, b->rope_theta);
    cr_assert_eq(a->tie_word_embeddings, b->tie_word_embeddings);
    cr_assert_eq(a->attention_bias, b->attention_bias);
    cr_assert_eq(a->qk_norm, b->qk_norm);
    cr_assert_eq(a->n_eos, b->n_eos);
    for (int i = 0; i < a->n_eos; i++)
        cr_assert_eq(a->eos_token_ids[i], b->eos_token_ids[i]);
    /* what the newer families add */
    cr_assert_eq(a->sliding_window, b->sliding_window);
    for (int i = 0; i < a->n_layers; i++) {
        cr_assert_eq(a->layer_sliding[i], b->layer_sliding[i], "layer %d", i);
        cr_assert_eq(model_config_layer_sparse(a, i), model_config_layer_sparse(b, i), "layer %d",
                     i);
    }
    cr_assert_eq(a->rope_local_theta, b->rope_local_theta);
    cr_assert_eq(a->query_scale, b->query_scale);
    cr_assert_eq(a->final_logit_softcap, b->final_logit_softcap);
    cr_assert_eq(a->embed_scale, b->embed_scale);
    cr_assert_eq(a->gelu_tanh, b->gelu_tanh);
    cr_assert_eq(a->rope_scaling, b->rope_scaling);
    cr_assert_eq(a->rope_factor, b->rope_factor);
    cr_assert_eq(model_rope_dim(a), model_rope_dim(b));
    cr_assert_eq(a->n_rope_factors, b->n_rope_factors);
    for (int i = 0; i < a->n_rope_factors; i++) {
        cr_assert_eq(a->rope_short_factor[i], b->rope_short_factor[i]);
        cr_assert_eq(a->rope_long_factor[i], b->rope_long_factor[i]);
    }
    if (a->rope_scaling == ROPE_SCALING_LONGROPE) {
        cr_assert_eq(a->rope_original_max_position, b->rope_original_max_position);
        cr_assert_eq(a->rope_attention_factor, b->rope_attention_factor);
    }
    cr_assert_eq(a->n_experts, b->n_experts);
    cr_assert_eq(a->n_experts_per_tok, b->n_experts_per_tok);
    cr_assert_eq(a->moe_intermediate_size, b->moe_intermediate_size);
    cr_assert_eq(a->norm_topk_prob, b->norm_topk_prob);
    cr_assert_eq(a->shared_expert_intermediate_size, b->shared_expert_intermediate_size);
}

static void check_bit_identical_mode(const char *preset, enum compute_mode mode)
{
    char *tmp;
    struct loaded st, gg;
    both_mode(preset, GGUF_FTYPE_BF16, mode, &tmp, &st, &gg);
    check_same_config(&st.m->config, &gg.m->config);
    int n = 20;
    float *a = prompt_logits(&st, n), *b = prompt_logits(&gg, n);
    size_t count = (size_t)n * (size_t)st.m->config.vocab_size;
    cr_assert_eq(memcmp(a, b, count * sizeof *a), 0, "%s: logits differ", preset);
    free(a);
    free(b);
    finish(tmp, &st, &gg);
}

static void check_bit_identical(const char *preset)
{
    check_bit_identical_mode(preset, COMPUTE_EXACT);
}

Test(gguf_model, bf16_qwen3_logits_are_bit_identical_to_safetensors, .timeout = 120)
{
    check_bit_identical("tiny-qwen3");
}

Test(gguf_model, bf16_llama_with_its_qk_rows_permuted_is_bit_identical, .timeout = 120)
{
    check_bit_identical("tiny-llama");
}

/* FAST mode, where an AVX512-BF16 CPU lays BF16 weights out in panels: the
 * GGUF's q/k rows are put back in order before they are packed. */
Test(gguf_model, bf16_llama_with_its_qk_rows_permuted_is_bit_identical_in_fast_mode,
     .timeout = 120)
{
    check_bit_identical_mode("tiny-llama", COMPUTE_FAST);
}

Test(gguf_model, bf16_qwen2_with_biases_is_bit_identical, .timeout = 120)
{
    check_bit_identical("tiny-qwen2");
}

Test(gguf_model, bf16_qwen3_gqa1_is_bit_identical, .timeout = 120)
{
    check_bit_identical("tiny-qwen3-gqa1");
}

/* Gemma 3: norms stored as 1 + w (F32, as llama.cpp's converter adds the
 * offset), the sandwich norms under their GGUF names, and what llama.cpp
 * fixes for the released sizes (every sixth layer global, local base, query
 * scale) carried as keys where the preset differs; the prompt (20) passes
 * the window (16). */
Test(gguf_model, bf16_gemma3_with_offset_norms_and_its_window_is_bit_identical, .timeout = 120)
{
    check_bit_identical("tiny-gemma3");
}

/* Phi-3: attn_qkv and the fused ffn_up (gate first), partial rotary as
 * rope.dimension_count, longrope as rope_factors_{short,long}.weight. */
Test(gguf_model, bf16_phi3_with_fused_projections_and_longrope_is_bit_identical, .timeout = 120)
{
    check_bit_identical("tiny-phi3");
}

/* Qwen3-MoE: experts stacked into ffn_{gate,up,down}_exps 3-D tensors, the
 * router ffn_gate_inp, the dense layer (mlp_only_layers) as plain ffn_*; the
 * preset's tied router rows keep their ties. */
Test(gguf_model, bf16_qwen3_moe_with_stacked_experts_is_bit_identical, .timeout = 120)
{
    check_bit_identical("tiny-qwen3_moe");
}

/* An expert's matrix is a view into the 3-D tensor (no copy): expert e of
 * blk.N.ffn_up_exps starts e * rows * row_bytes into it. */
Test(gguf_model, expert_matrices_are_slices_of_the_stacked_tensor, .timeout = 120)
{
    struct err err = {0};
    char *tmp = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-qwen3_moe", .seed = 5, .out_dir = tmp};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    char path[4200];
    snprintf(path, sizeof path, "%s/m.gguf", tmp);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_Q8_0, path, &err), 0, "%s", err.msg);
    struct gguf_file f;
    cr_assert_eq(gguf_open(path, &f, &err), 0, "%s", err.msg);
    struct model_config c;
    cr_assert_eq(gguf_model_config(&f, &c, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_experts, 6);
    cr_assert(c.mlp_only_layers[1] && !c.mlp_only_layers[0] && !c.mlp_only_layers[2]);
    const struct gguf_tensor *up = gguf_find_tensor(&f, "blk.2.ffn_up_exps.weight");
    cr_assert(up && up->n_dims == 3 && up->ne[2] == 6 && up->dtype == DTYPE_Q8_0);
    cr_assert_null(gguf_find_tensor(&f, "blk.1.ffn_up_exps.weight"));
    cr_assert_not_null(gguf_find_tensor(&f, "blk.1.ffn_up.weight"));
    const uint8_t *base = up->data;
    uint64_t slice = dtype_row_bytes(up->dtype, (uint64_t)up->ne[0]) * (uint64_t)up->ne[1];
    struct st_set set;
    cr_assert_eq(gguf_tensor_set(&f, &c, path, &set, &err), 0, "%s", err.msg);
    for (int e = 0; e < 6; e++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.2.mlp.experts.%d.up_proj.weight", e);
        const struct st_tensor *t = st_set_find(&set, name);
        cr_assert_not_null(t, "%s", name);
        cr_assert_eq(t->data, base + (uint64_t)e * slice, "%s is not a view", name);
        cr_assert_eq(t->nbytes, slice);
        cr_assert(t->n_dims == 2 && t->shape[0] == up->ne[1] && t->shape[1] == up->ne[0]);
    }
    gguf_close(&f);
    st_set_close(&set);
    /* Q8_0 leaves the experts' down rows (88 columns) F16: mixed types run */
    struct loaded gg;
    load(path, &gg);
    int n = 12;
    float *logits = prompt_logits(&gg, n);
    for (int i = 0; i < n * gg.m->config.vocab_size; i++)
        cr_assert(isfinite(logits[i]));
    free(logits);
    unload(&gg);
    test_rmtree(tmp);
    free(tmp);
}

/* Llama 3 rope scaling travels as rope_freqs.weight divisors: outside the
 * blended band the frequencies are the same floats, inside it they may move
 * by an ulp or so (the blend is rounded differently), which moves the
 * logits by far less than 1e-3. */
Test(gguf_model, llama3_rope_freqs_give_the_scaled_frequencies, .timeout = 120)
{
    char *tmp;
    struct loaded st, gg;
    both("tiny-llama3", GGUF_FTYPE_BF16, &tmp, &st, &gg);
    int half = st.m->config.head_dim / 2;
    for (int i = 0; i < half; i++)
        cr_assert_float_eq(gg.m->rope_inv_freq[i], st.m->rope_inv_freq[i],
                           4e-7f * st.m->rope_inv_freq[i], "frequency %d", i);
    int n = 12;
    float *a = prompt_logits(&st, n), *b = prompt_logits(&gg, n);
    for (size_t i = 0; i < (size_t)n * (size_t)st.m->config.vocab_size; i++)
        cr_assert_float_eq(a[i], b[i], 1e-3f, "logit %zu", i);
    free(a);
    free(b);
    finish(tmp, &st, &gg);
}

/* mkmodel's GGUF bytes depend only on its inputs. */
Test(gguf_model, mkmodel_gguf_files_are_deterministic, .timeout = 120)
{
    struct err err = {0};
    char *tmp = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 5, .out_dir = tmp};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/a.gguf", tmp);
    snprintf(b, sizeof b, "%s/b.gguf", tmp);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_Q4_K_M, a, &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_Q4_K_M, b, &err), 0, "%s", err.msg);
    size_t la, lb;
    char *da = test_read_file(a, &la), *db = test_read_file(b, &lb);
    cr_assert_eq(la, lb);
    cr_assert_eq(memcmp(da, db, la), 0);
    free(da);
    free(db);
    test_rmtree(tmp);
    free(tmp);
}

/* Rows of 96 elements are not whole 256-blocks: Q4_K falls back to Q5_0 and
 * Q6_K (the head) to Q8_0, as llama-quantize does; rows of 176 are not whole
 * 32-blocks either and fall back to F16. */
Test(gguf_model, k_types_fall_back_for_rows_that_are_not_whole_blocks, .timeout = 120)
{
    struct err err = {0};
    char *tmp = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-qwen3-gqa1", .seed = 5, .out_dir = tmp};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    char path[4200];
    snprintf(path, sizeof path, "%s/m.gguf", tmp);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_Q4_K_M, path, &err), 0, "%s", err.msg);
    struct gguf_file f;
    cr_assert_eq(gguf_open(path, &f, &err), 0, "%s", err.msg);
    cr_assert_eq(gguf_find_tensor(&f, "blk.1.attn_q.weight")->dtype, DTYPE_Q5_0);
    cr_assert_eq(gguf_find_tensor(&f, "output.weight")->dtype, DTYPE_Q8_0);
    cr_assert_eq(gguf_find_tensor(&f, "blk.1.ffn_down.weight")->dtype, DTYPE_F16);
    cr_assert_eq(gguf_find_tensor(&f, "blk.0.attn_norm.weight")->dtype, DTYPE_F32);
    gguf_close(&f);
    test_rmtree(tmp);
    free(tmp);
}

/* A quantized file runs through the dequantizing loader: every logit is
 * finite, and the greedy choice mostly agrees with bf16 (tiny random models
 * have flat logits, so agreement is not total). */
Test(gguf_model, quantized_files_load_and_run, .timeout = 300)
{
    static const enum gguf_ftype types[] = {GGUF_FTYPE_Q8_0, GGUF_FTYPE_Q4_0, GGUF_FTYPE_Q4_K_M,
                                            GGUF_FTYPE_Q6_K};
    for (int t = 0; t < 4; t++) {
        char *tmp;
        struct loaded st, gg;
        both("tiny-qwen3", types[t], &tmp, &st, &gg);
        int n = 16, V = st.m->config.vocab_size;
        float *a = prompt_logits(&st, n), *b = prompt_logits(&gg, n);
        for (int i = 0; i < n * V; i++)
            cr_assert(isfinite(b[i]));
        double num = 0, den = 0;
        for (int i = 0; i < n * V; i++) {
            num += (a[i] - b[i]) * (a[i] - b[i]);
            den += a[i] * a[i];
        }
        cr_assert_lt(sqrt(num / den), types[t] == GGUF_FTYPE_Q8_0 ? 0.05 : 0.5,
                     "type %d: relative logit error %g", t, sqrt(num / den));
        free(a);
        free(b);
        finish(tmp, &st, &gg);
    }
}

/* ---------------------------------------------------------------- tokenizers */

static void check_tokenizer(const char *name)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    char tdir[4200], corpus[4200], path[4200];
    snprintf(tdir, sizeof tdir, "%s/%s", data, name);
    snprintf(corpus, sizeof corpus, "%s/tests/text/corpus.jsonl", INFERD_SOURCE_DIR);
    struct err err = {0};
    char *tmp = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = tmp,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/m.gguf", tmp);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_Q8_0, path, &err), 0, "%s", err.msg);
    struct tokenizer *ref, *gg;
    cr_assert_eq(tok_load(tdir, &ref, &err), 0, "%s", err.msg);
    cr_assert_eq(model_tokenizer_load(path, &gg, &err), 0, "%s", err.msg);
    cr_assert_str_eq(tok_chat_template(gg), tok_chat_template(ref));
    FILE *fp = fopen(corpus, "r");
    cr_assert_not_null(fp);
    char *line = NULL;
    size_t cap = 0;
    int n_lines = 0;
    while (getline(&line, &cap, fp) > 0) {
        struct json_object *obj = json_tokener_parse(line);
        const char *text = json_object_get_string(json_object_object_get(obj, "text"));
        size_t len = (size_t)json_object_get_string_len(json_object_object_get(obj, "text"));
        for (int special = 0; special < 2; special++) {
            int32_t *a, *b;
            int na, nb;
            cr_assert_eq(tok_encode(ref, text, len, special, &a, &na, &err), 0, "%s", err.msg);
            cr_assert_eq(tok_encode(gg, text, len, special, &b, &nb, &err), 0, "%s", err.msg);
            cr_assert_eq(na, nb, "%s line %d: %d vs %d ids", name, n_lines, na, nb);
            cr_assert_eq(memcmp(a, b, (size_t)na * sizeof *a), 0, "%s line %d", name, n_lines);
            char *ta, *tb;
            size_t la, lb;
            cr_assert_eq(tok_decode(ref, a, na, false, &ta, &la, &err), 0, "%s", err.msg);
            cr_assert_eq(tok_decode(gg, b, nb, false, &tb, &lb, &err), 0, "%s", err.msg);
            cr_assert(la == lb && !memcmp(ta, tb, la), "%s line %d decodes differently", name,
                      n_lines);
            free(ta);
            free(tb);
            free(a);
            free(b);
        }
        json_object_put(obj);
        n_lines++;
    }
    cr_assert_gt(n_lines, 1000);
    free(line);
    fclose(fp);
    tok_free(ref);
    tok_free(gg);
    test_rmtree(tmp);
    free(tmp);
}

Test(gguf_tokenizer, qwen3_vocabulary_in_gguf_encodes_the_corpus_as_tokenizer_json, .timeout = 600)
{
    check_tokenizer("qwen3");
}

Test(gguf_tokenizer, llama3_vocabulary_in_gguf_encodes_the_corpus_as_tokenizer_json, .timeout = 600)
{
    check_tokenizer("llama3");
}

/* The stand-in vocabulary benchmark files carry: gpt2 model, pre "default". */
Test(gguf_tokenizer, a_minimal_gpt2_vocabulary_with_default_pre_loads)
{
    struct tok_piece tokens[] = {{"a", 1}, {"b", 1}, {"ab", 2}, {"\xc4\xa0", 2}, {"</s>", 4}};
    int32_t types[] = {1, 1, 1, 1, 3};
    struct tok_piece merges[] = {{"a b", 3}};
    struct tok_gguf_vocab v = {.model = "gpt2", .model_len = 4, .pre = "default", .pre_len = 7,
                               .tokens = tokens, .n_tokens = 5, .types = types,
                               .merges = merges, .n_merges = 1, .bos_id = -1, .eos_id = 4,
                               .unk_id = -1, .pad_id = -1, .add_bos = 0};
    struct tokenizer *tok;
    struct err err = {0};
    cr_assert_eq(tok_load_gguf_vocab(&v, &tok, &err), 0, "%s", err.msg);
    int32_t *ids;
    int n;
    cr_assert_eq(tok_encode(tok, "ab</s>", 6, false, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 2);
    cr_assert_eq(ids[0], 2);
    cr_assert_eq(ids[1], 4);
    free(ids);
    tok_free(tok);
}

Test(gguf_tokenizer, unknown_pre_tokenizers_and_models_are_refused_by_name)
{
    struct tok_piece tokens[] = {{"a", 1}};
    struct tok_gguf_vocab v = {.model = "gpt2", .model_len = 4, .pre = "deepseek-coder",
                               .pre_len = 14, .tokens = tokens, .n_tokens = 1, .merges = tokens,
                               .n_merges = 0, .bos_id = -1, .eos_id = -1, .unk_id = -1,
                               .pad_id = -1};
    struct tokenizer *tok;
    struct err err = {0};
    cr_assert_eq(tok_load_gguf_vocab(&v, &tok, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "deepseek-coder"), "%s", err.msg);
    v.model = "rwkv";
    v.model_len = 4;
    cr_assert_eq(tok_load_gguf_vocab(&v, &tok, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "rwkv"), "%s", err.msg);
}

/* ---------------------------------------------------------------- the command line */

/* `inferd run X --tokens IDS` prints generated ids on one line whatever
 * tokenizer X carries: a directory with tokenizer.json, or a GGUF file with
 * tokenizer metadata. */
Test(gguf_cli, run_with_tokens_prints_ids_for_directories_and_gguf_files, .timeout = 300)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    char tdir[4200], cmd[9000], path[4200];
    snprintf(tdir, sizeof tdir, "%s/qwen3", data);
    struct err err = {0};
    char *tmp = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = tmp,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/m.gguf", tmp);
    cr_assert_eq(gguf_write_model(tmp, GGUF_FTYPE_BF16, path, &err), 0, "%s", err.msg);
    const char *targets[] = {tmp, path};
    char outputs[2][256];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s run %s --tokens 9707,1879 -n 6 --threads 2 2>/dev/null",
                 INFERD_BINARY, targets[i]);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        cr_assert_not_null(fgets(outputs[i], sizeof outputs[i], p));
        cr_assert_eq(pclose(p), 0, "%s", cmd);
        size_t n = strlen(outputs[i]);
        cr_assert_gt(n, 1);
        cr_assert_eq(strspn(outputs[i], "0123456789,"), n - 1, "not ids: %s", outputs[i]);
    }
    cr_assert_str_eq(outputs[0], outputs[1], "bf16 GGUF and safetensors generate alike");
    test_rmtree(tmp);
    free(tmp);
}
