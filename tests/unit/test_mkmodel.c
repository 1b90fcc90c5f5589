/* tests/unit/test_mkmodel.c — mkmodel writes the Hugging Face tensors and config of each preset, byte-identically for a seed on every machine. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "base/bf16.h"
#include "tools/mkmodel.h"
#include "test_support.h"

#define CHECKSUMS INFERD_SOURCE_DIR "/tests/goldens/mkmodel_checksums.txt"

static char *tmp; /* owned; this test's scratch directory */

static void setup(void) { cr_assert_not_null(tmp = test_mkdtemp()); }

static void teardown(void)
{
    test_rmtree(tmp);
    free(tmp);
}

TestSuite(mkmodel, .init = setup, .fini = teardown);

/* Writes preset with seed into tmp/sub; dir (cap bytes) receives and returns that path. */
static const char *make(const char *preset, uint64_t seed, const char *sub, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s", tmp, sub);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = preset, .seed = seed, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s: %s", preset, err.msg);
    return dir;
}

static char *slurp(const char *dir, const char *name, size_t *len)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *data = test_read_file(path, len);
    cr_assert_not_null(data, "cannot read %s", path);
    return data;
}

static bool same_file(const char *a, const char *b, const char *name)
{
    size_t la, lb;
    char *da = slurp(a, name, &la), *db = slurp(b, name, &lb);
    bool same = la == lb && memcmp(da, db, la) == 0;
    free(da);
    free(db);
    return same;
}

/* ---- the expected tensor list, built independently of mkmodel.c ---------- */

struct expected {
    char name[96];
    int64_t shape[2];
    int n_dims;
    bool seen;
};

static int expect_add(struct expected *e, int n, const char *name, int64_t r, int64_t c)
{
    snprintf(e[n].name, sizeof e[n].name, "%s", name);
    e[n].shape[0] = r;
    e[n].shape[1] = c;
    e[n].n_dims = c ? 2 : 1;
    e[n].seen = false;
    return n + 1;
}

static int expected_tensors(const struct mkmodel_preset *p, struct expected *e)
{
    int n = 0;
    bool gemma3 = !strcmp(p->arch, "gemma3"), phi3 = !strcmp(p->arch, "phi3");
    int64_t h = p->hidden_size, q = (int64_t)p->n_heads * p->head_dim;
    int64_t kv = (int64_t)p->n_kv_heads * p->head_dim, in = p->intermediate_size;
    n = expect_add(e, n, "model.embed_tokens.weight", p->vocab_size, h);
    n = expect_add(e, n, "model.norm.weight", h, 0);
    if (!p->tie_word_embeddings)
        n = expect_add(e, n, "lm_head.weight", p->vocab_size, h);
    for (int i = 0; i < p->n_layers; i++) {
        char nm[96];
#define LAYER(suffix, r, c)                                             \
    do {                                                                \
        snprintf(nm, sizeof nm, "model.layers.%d." suffix, i);          \
        n = expect_add(e, n, nm, r, c);                                 \
    } while (0)
        LAYER("input_layernorm.weight", h, 0);
        LAYER("post_attention_layernorm.weight", h, 0);
        LAYER("self_attn.o_proj.weight", h, q);
        bool sparse = p->n_experts && !(p->mlp_only_layers >> i & 1u);
        if (!sparse)
            LAYER("mlp.down_proj.weight", h, in);
        if (phi3) { /* fused projections */
            LAYER("self_attn.qkv_proj.weight", q + 2 * kv, h);
            LAYER("mlp.gate_up_proj.weight", 2 * in, h);
            continue;
        }
        LAYER("self_attn.q_proj.weight", q, h);
        LAYER("self_attn.k_proj.weight", kv, h);
        LAYER("self_attn.v_proj.weight", kv, h);
        if (sparse) {
            int64_t mi = p->moe_intermediate_size;
            LAYER("mlp.gate.weight", p->n_experts, h);
            for (int x = 0; x < p->n_experts; x++) {
                static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
                for (int j = 0; j < 3; j++) {
                    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", i, x,
                             proj[j]);
                    n = expect_add(e, n, nm, j == 2 ? h : mi, j == 2 ? mi : h);
                }
            }
        } else {
            LAYER("mlp.gate_proj.weight", in, h);
            LAYER("mlp.up_proj.weight", in, h);
        }
        if (gemma3) { /* sandwich norms */
            LAYER("pre_feedforward_layernorm.weight", h, 0);
            LAYER("post_feedforward_layernorm.weight", h, 0);
        }
        if (!strcmp(p->arch, "qwen2")) {
            LAYER("self_attn.q_proj.bias", q, 0);
            LAYER("self_attn.k_proj.bias", kv, 0);
            LAYER("self_attn.v_proj.bias", kv, 0);
        }
        if (!strncmp(p->arch, "qwen3", 5) || gemma3) {
            LAYER("self_attn.q_norm.weight", p->head_dim, 0);
            LAYER("self_attn.k_norm.weight", p->head_dim, 0);
        }
#undef LAYER
    }
    return n;
}

/* ---- reading a written file back ---------------------------------------- */

struct read_model {
    char *file;           /* owned: all of model.safetensors */
    size_t len;
    uint64_t header_len;
    json_object *header;  /* owned */
};

static void read_model(const char *dir, struct read_model *m)
{
    m->file = slurp(dir, "model.safetensors", &m->len);
    cr_assert_geq(m->len, 8);
    m->header_len = 0;
    for (int i = 0; i < 8; i++)
        m->header_len |= (uint64_t)(unsigned char)m->file[i] << (8 * i);
    cr_assert_leq(8 + m->header_len, m->len);
    json_tokener *tok = json_tokener_new();
    m->header = json_tokener_parse_ex(tok, m->file + 8, (int)m->header_len);
    cr_assert_not_null(m->header, "header is not JSON");
    cr_assert_eq(json_tokener_get_error(tok), json_tokener_success);
    json_tokener_free(tok);
}

static void free_model(struct read_model *m)
{
    json_object_put(m->header);
    free(m->file);
}

static float element(const char *data, const char *dtype, int64_t i)
{
    if (!strcmp(dtype, "F32")) {
        float f;
        memcpy(&f, data + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, data + 2 * i, 2);
    return !strcmp(dtype, "BF16") ? bf16_to_f32(h) : f16_to_f32(h);
}

static const struct mkmodel_preset *tiny_presets(int *n_tiny)
{
    int n;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    *n_tiny = 0;
    while (*n_tiny < n && !p[*n_tiny].real)
        (*n_tiny)++;
    cr_assert_geq(*n_tiny, 7, "the tiny presets come first");
    return p;
}

Test(mkmodel, same_seed_writes_byte_identical_files)
{
    char a[1024], b[1024];
    make("tiny-qwen2", 7, "a", a, sizeof a);
    make("tiny-qwen2", 7, "b", b, sizeof b);
    cr_expect(same_file(a, b, "model.safetensors"));
    cr_expect(same_file(a, b, "config.json"));
    cr_expect(same_file(a, b, "generation_config.json"));
}

Test(mkmodel, different_seed_changes_every_tensor_but_not_the_layout)
{
    char a[1024], b[1024];
    make("tiny-llama", 1, "a", a, sizeof a);
    make("tiny-llama", 2, "b", b, sizeof b);
    cr_expect(same_file(a, b, "config.json"));
    struct read_model ma, mb;
    read_model(a, &ma);
    read_model(b, &mb);
    cr_assert_eq(ma.len, mb.len);
    cr_assert_eq(ma.header_len, mb.header_len);
    cr_expect_eq(memcmp(ma.file, mb.file, 8 + ma.header_len), 0, "headers differ");
    json_object_object_foreach(ma.header, name, info) {
        if (!strcmp(name, "__metadata__"))
            continue;
        json_object *offs = json_object_object_get(info, "data_offsets");
        size_t begin = 8 + ma.header_len + (size_t)json_object_get_int64(json_object_array_get_idx(offs, 0));
        size_t end = 8 + ma.header_len + (size_t)json_object_get_int64(json_object_array_get_idx(offs, 1));
        size_t equal = 0;
        for (size_t i = begin; i < end; i += 2)
            equal += memcmp(ma.file + i, mb.file + i, 2) == 0;
        /* Norms sit in a narrow band near 1, so some bf16 values coincide by chance. */
        cr_expect_lt(equal, (end - begin) / 2 / 4, "%s barely changed with the seed", name);
    }
    free_model(&ma);
    free_model(&mb);
}

Test(mkmodel, every_tiny_preset_has_exactly_the_hf_tensors_sorted_and_packed)
{
    int n_tiny;
    const struct mkmodel_preset *presets = tiny_presets(&n_tiny);
    static struct expected exp[256];
    for (int pi = 0; pi < n_tiny; pi++) {
        const struct mkmodel_preset *p = &presets[pi];
        char dir[1024];
        make(p->name, 1, p->name, dir, sizeof dir);
        struct read_model m;
        read_model(dir, &m);
        cr_expect_eq(m.header_len % 8, 0, "%s: header not padded to 8 bytes", p->name);
        const char *hdr = m.file + 8;
        uint64_t close = m.header_len;
        while (close > 0 && hdr[close - 1] == ' ')
            close--;
        cr_expect(close > 0 && hdr[close - 1] == '}' && m.header_len - close < 8,
                  "%s: the header ends in '}' and fewer than 8 spaces", p->name);
        json_object *meta = json_object_object_get(m.header, "__metadata__");
        cr_expect_str_eq(json_object_get_string(json_object_object_get(meta, "format")), "pt");

        int n_exp = expected_tensors(p, exp);
        int n_seen = 0;
        char prev[96] = "";
        uint64_t next_offset = 0;
        size_t esz = dtype_size(p->dtype);
        json_object_object_foreach(m.header, name, info) {
            if (!strcmp(name, "__metadata__"))
                continue;
            cr_expect_gt(strcmp(name, prev), 0, "%s: %s out of order after %s", p->name, name, prev);
            snprintf(prev, sizeof prev, "%s", name);
            struct expected *e = NULL;
            for (int i = 0; i < n_exp; i++)
                if (!strcmp(exp[i].name, name))
                    e = &exp[i];
            cr_assert_not_null(e, "%s: unexpected tensor %s", p->name, name);
            cr_expect_not(e->seen, "%s: %s twice", p->name, name);
            e->seen = true;
            n_seen++;
            cr_expect_str_eq(json_object_get_string(json_object_object_get(info, "dtype")),
                             dtype_name(p->dtype), "%s: %s dtype", p->name, name);
            json_object *shape = json_object_object_get(info, "shape");
            cr_assert_eq((int)json_object_array_length(shape), e->n_dims, "%s: %s rank", p->name, name);
            int64_t numel = 1;
            for (int d = 0; d < e->n_dims; d++) {
                int64_t v = json_object_get_int64(json_object_array_get_idx(shape, d));
                cr_expect_eq(v, e->shape[d], "%s: %s dim %d is %lld, want %lld", p->name, name, d,
                             (long long)v, (long long)e->shape[d]);
                numel *= v;
            }
            json_object *offs = json_object_object_get(info, "data_offsets");
            uint64_t begin = (uint64_t)json_object_get_int64(json_object_array_get_idx(offs, 0));
            uint64_t end = (uint64_t)json_object_get_int64(json_object_array_get_idx(offs, 1));
            cr_expect_eq(begin, next_offset, "%s: %s not packed after the previous tensor", p->name, name);
            cr_expect_eq(end - begin, (uint64_t)numel * esz, "%s: %s byte size", p->name, name);
            next_offset = end;
        }
        cr_expect_eq(n_seen, n_exp, "%s: %d tensors, want %d", p->name, n_seen, n_exp);
        cr_expect_eq(8 + m.header_len + next_offset, m.len, "%s: file size", p->name);
        cr_expect_eq(mkmodel_file_bytes(p), m.len, "%s: mkmodel_file_bytes", p->name);
        free_model(&m);
    }
}

/* Values stay inside [-a, a] (norms 1 +- 0.1, within a rounding) with the documented std. */
Test(mkmodel, weights_have_the_documented_range_and_spread)
{
    int n_tiny;
    const struct mkmodel_preset *presets = tiny_presets(&n_tiny);
    for (int pi = 0; pi < n_tiny; pi++) {
        const struct mkmodel_preset *p = &presets[pi];
        char dir[1024];
        make(p->name, 3, p->name, dir, sizeof dir);
        struct read_model m;
        read_model(dir, &m);
        const char *data = m.file + 8 + m.header_len;
        json_object_object_foreach(m.header, name, info) {
            if (!strcmp(name, "__metadata__"))
                continue;
            const char *dt = json_object_get_string(json_object_object_get(info, "dtype"));
            json_object *shape = json_object_object_get(info, "shape");
            bool matrix = json_object_array_length(shape) == 2;
            int64_t cols = matrix ? json_object_get_int64(json_object_array_get_idx(shape, 1)) : 0;
            json_object *offs = json_object_object_get(info, "data_offsets");
            int64_t begin = json_object_get_int64(json_object_array_get_idx(offs, 0));
            int64_t numel = (json_object_get_int64(json_object_array_get_idx(offs, 1)) - begin) /
                            (int64_t)(strcmp(dt, "F32") ? 2 : 4);
            bool norm = !matrix && !strstr(name, "bias");
            /* Gemma's norm weights are offsets from 1: centred on 0 */
            bool offset = norm && !strcmp(p->arch, "gemma3");
            double want_std = strstr(name, "embed_tokens") ? (p->tie_word_embeddings ? 0.1 : 1.0)
                            : !strcmp(name, "lm_head.weight") ? 2.0 / sqrt(p->hidden_size)
                            : strstr(name, "bias") ? 0.1
                            : norm ? 0.1 / sqrt(3.0)
                                   : 1.0 / sqrt((double)cols);
            /* bf16 rounds values near 1 by up to 2^-8. */
            double center = norm && !offset ? 1.0 : 0.0;
            double half = want_std * sqrt(3.0) * 1.01 + (norm && !offset ? 0.004 : 0.0);
            double sum = 0, sum2 = 0;
            for (int64_t i = 0; i < numel; i++) {
                double v = element(data + begin, dt, i) - center;
                cr_assert(fabs(v) <= half, "%s %s[%lld] = %g outside +-%g", p->name, name,
                          (long long)i, v + center, half);
                sum += v;
                sum2 += v * v;
            }
            double mean = sum / (double)numel;
            double std = sqrt(sum2 / (double)numel - mean * mean);
            if (numel >= 4096) {
                cr_expect(fabs(std / want_std - 1.0) < 0.05, "%s %s: std %g, want %g", p->name,
                          name, std, want_std);
                cr_expect(fabs(mean) < 0.05 * want_std, "%s %s: mean %g", p->name, name, mean);
            }
        }
        free_model(&m);
    }
}

Test(mkmodel, seed_1_checksums_match_the_committed_list)
{
    FILE *f = fopen(CHECKSUMS, "r");
    cr_assert_not_null(f, "cannot open %s", CHECKSUMS);
    char line[256];
    int checked = 0;
    while (fgets(line, sizeof line, f)) {
        char name[128], want[64];
        if (line[0] == '#' || sscanf(line, "%127s %63s", name, want) != 2)
            continue;
        cr_assert_not_null(mkmodel_preset_find(name), "%s names unknown preset %s", CHECKSUMS, name);
        char dir[1024], got[32];
        make(name, 1, name, dir, sizeof dir);
        struct err err = {0};
        cr_assert_eq(mkmodel_file_fnv1a64(dir, "model.safetensors", got, sizeof got, &err), 0, "%s",
                     err.msg);
        cr_expect_str_eq(got, want, "%s: model.safetensors bytes changed", name);
        checked++;
    }
    fclose(f);
    int n_tiny;
    tiny_presets(&n_tiny);
    cr_expect_eq(checked, n_tiny, "every tiny preset needs a checksum line");
}

Test(mkmodel, config_json_has_what_transformers_and_inferd_read)
{
    int n_tiny;
    const struct mkmodel_preset *presets = tiny_presets(&n_tiny);
    for (int pi = 0; pi < n_tiny; pi++) {
        const struct mkmodel_preset *p = &presets[pi];
        char dir[1024], path[1200];
        make(p->name, 1, p->name, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_object *c = json_object_from_file(path);
        cr_assert_not_null(c, "%s: config.json is not JSON", p->name);
#define INT(key) json_object_get_int(json_object_object_get(c, key))
#define STR(key) json_object_get_string(json_object_object_get(c, key))
#define HAS(key) json_object_object_get_ex(c, key, NULL)
        cr_expect_str_eq(json_object_get_string(json_object_array_get_idx(
                             json_object_object_get(c, "architectures"), 0)),
                         mkmodel_arch_class(p->arch));
        cr_expect_str_eq(STR("model_type"),
                         !strcmp(p->arch, "gemma3") ? "gemma3_text" : p->arch);
        cr_expect_eq(INT("vocab_size"), p->vocab_size);
        cr_expect_eq(INT("hidden_size"), p->hidden_size);
        cr_expect_eq(INT("intermediate_size"), p->intermediate_size);
        cr_expect_eq(INT("num_hidden_layers"), p->n_layers);
        cr_expect_eq(INT("num_attention_heads"), p->n_heads);
        cr_expect_eq(INT("num_key_value_heads"), p->n_kv_heads);
        cr_expect_eq(INT("head_dim"), p->head_dim);
        cr_expect_eq(INT("max_position_embeddings"), p->max_position_embeddings);
        cr_expect_eq(json_object_get_boolean(json_object_object_get(c, "tie_word_embeddings")),
                     p->tie_word_embeddings);
        if (!strcmp(p->arch, "gemma3"))
            cr_expect_str_eq(STR("hidden_activation"), "gelu_pytorch_tanh");
        else
            cr_expect_str_eq(STR("hidden_act"), "silu");
        cr_expect_str_eq(STR("torch_dtype"), p->dtype == DTYPE_F32    ? "float32"
                                             : p->dtype == DTYPE_BF16 ? "bfloat16"
                                                                      : "float16");
        cr_expect(HAS("rms_norm_eps") && HAS("rope_theta") && HAS("bos_token_id") &&
                  HAS("eos_token_id") && HAS("use_cache") && HAS("attention_dropout"));
        json_object *rs = NULL;
        cr_expect(json_object_object_get_ex(c, "rope_scaling", &rs), "%s: rope_scaling", p->name);
        if (p->rope == MKMODEL_ROPE_NONE)
            cr_expect_null(rs, "%s: rope_scaling should be null", p->name);
        else if (p->rope == MKMODEL_ROPE_LONGROPE)
            cr_expect_str_eq(json_object_get_string(json_object_object_get(rs, "type")),
                             "longrope");
        else
            cr_expect_str_eq(json_object_get_string(json_object_object_get(rs, "rope_type")),
                             p->rope == MKMODEL_ROPE_LINEAR ? "linear" : "llama3");
        if (!strcmp(p->arch, "llama") || !strcmp(p->arch, "qwen3"))
            cr_expect(HAS("attention_bias") &&
                      !json_object_get_boolean(json_object_object_get(c, "attention_bias")));
        if (strncmp(p->arch, "qwen", 4) == 0) {
            cr_expect(HAS("use_sliding_window") &&
                      !json_object_get_boolean(json_object_object_get(c, "use_sliding_window")));
            cr_expect_eq(INT("max_window_layers"), p->n_layers);
        }
        if (strcmp(p->arch, "llama") != 0 && p->sliding_window > 0) {
            cr_expect_eq(INT("sliding_window"), p->sliding_window);
        } else if (strcmp(p->arch, "llama") != 0) {
            json_object *sw = NULL;
            cr_expect(json_object_object_get_ex(c, "sliding_window", &sw) && sw == NULL,
                      "%s: sliding_window should be null", p->name);
        }
#undef INT
#undef STR
#undef HAS
        json_object_put(c);
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        json_object *g = json_object_from_file(path);
        cr_expect_not_null(g, "%s: generation_config.json is not JSON", p->name);
        json_object_put(g);
    }
}

/* Published parameter counts of the models whose shapes the real presets copy. */
Test(mkmodel, real_presets_have_the_published_parameter_counts)
{
    static const struct { const char *name; uint64_t params; } want[] = {
        {"qwen3-0.6b", 596049920ull},
        {"llama-3.2-1b", 1235814400ull},
        {"llama-3.1-8b", 8030261248ull},
        {"qwen3-8b", 8190735360ull},
        {"gemma-3-1b", 999885952ull},
        {"gemma-3-4b", 3880263168ull}, /* the text model */
        {"phi-4-mini", 3836021760ull},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct mkmodel_preset *p = mkmodel_preset_find(want[i].name);
        cr_assert_not_null(p, "%s", want[i].name);
        cr_expect(p->real);
        cr_expect_eq(mkmodel_param_count(p), want[i].params, "%s: %llu parameters", p->name,
                     (unsigned long long)mkmodel_param_count(p));
        cr_expect_gt(mkmodel_file_bytes(p), 2 * want[i].params);
        cr_expect_lt(mkmodel_file_bytes(p), 2 * want[i].params + (1u << 20));
    }
}

Test(mkmodel, unknown_names_and_mismatched_arch_are_clear_errors)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/m", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-nope", .seed = 1, .out_dir = dir};
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EINVAL);
    cr_expect(strstr(err.msg, "tiny-nope") != NULL, "%s", err.msg);

    o = (struct mkmodel_opts){.arch = "llama", .preset = "tiny-qwen3", .seed = 1, .out_dir = dir};
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EINVAL);
    cr_expect(strstr(err.msg, "qwen3") && strstr(err.msg, "llama"), "%s", err.msg);

    o = (struct mkmodel_opts){.arch = "gpt2", .seed = 1, .out_dir = dir};
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EINVAL);
    cr_expect(strstr(err.msg, "gpt2") != NULL, "%s", err.msg);

    o = (struct mkmodel_opts){.seed = 1, .out_dir = dir};
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EINVAL);

    o = (struct mkmodel_opts){.preset = "tiny-qwen3", .seed = 1};
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EINVAL);

    struct stat st;
    cr_expect_neq(stat(dir, &st), 0, "a refused call created %s", dir);
}

Test(mkmodel, arch_alone_picks_its_tiny_preset_and_a_matching_arch_is_accepted)
{
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/a", tmp);
    snprintf(b, sizeof b, "%s/b", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.arch = "mistral", .seed = 1, .out_dir = a};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    o = (struct mkmodel_opts){.arch = "mistral", .preset = "tiny-mistral", .seed = 1, .out_dir = b};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    cr_expect(same_file(a, b, "model.safetensors"));
}

Test(mkmodel, rewriting_a_directory_replaces_its_files_and_leaves_no_temporaries)
{
    char dir[1024], path[1200], got[32], again[32];
    struct err err = {0};
    make("tiny-qwen3-gqa1", 2, "m", dir, sizeof dir);
    make("tiny-qwen3-gqa1", 1, "m", dir, sizeof dir);
    cr_assert_eq(mkmodel_file_fnv1a64(dir, "model.safetensors", got, sizeof got, &err), 0);
    char fresh[1024];
    make("tiny-qwen3-gqa1", 1, "fresh", fresh, sizeof fresh);
    cr_assert_eq(mkmodel_file_fnv1a64(fresh, "model.safetensors", again, sizeof again, &err), 0);
    cr_expect_str_eq(got, again);
    struct stat st;
    snprintf(path, sizeof path, "%s/model.safetensors.tmp", dir);
    cr_expect_neq(stat(path, &st), 0, "%s left behind", path);
}

Test(mkmodel, an_output_path_that_is_a_file_is_refused)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/plain", tmp);
    cr_assert_eq(test_write_file(path, "x", 1), 0);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = path};
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EIO);
    cr_expect(strstr(err.msg, "plain") != NULL, "%s", err.msg);
    cr_expect_eq(mkmodel_file_fnv1a64(tmp, "missing", path, sizeof path, &err), -INFERD_EIO);
}

/* Runs the inferd binary with args; returns its exit status and its stdout+stderr in out. */
static int run_cli(const char *args, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel %s 2>&1", INFERD_BINARY, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* `inferd mkmodel ARGS` exits with code and its message names `names` (NULL: not checked). */
static void expect_refused(const char *args, int code, const char *names)
{
    static char out[16384];
    cr_expect_eq(run_cli(args, out, sizeof out), code, "%s: %s", args, out);
    if (names)
        cr_expect(strstr(out, names) != NULL, "%s: %s", args, out);
}

Test(mkmodel, cli_lists_presets_writes_models_and_explains_errors)
{
    static char out[16384];
    cr_expect_eq(run_cli("--list", out, sizeof out), 0, "%s", out);
    int n;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    for (int i = 0; i < n; i++)
        cr_expect(strstr(out, p[i].name) != NULL, "--list lacks %s", p[i].name);

    char args[1200], dir[1024], got[32];
    snprintf(dir, sizeof dir, "%s/cli", tmp);
    snprintf(args, sizeof args, "--preset tiny-llama3 --seed 1 --out '%s'", dir);
    cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
    struct err err = {0};
    cr_assert_eq(mkmodel_file_fnv1a64(dir, "model.safetensors", got, sizeof got, &err), 0, "%s",
                 err.msg);
    char lib[1024], want[32];
    make("tiny-llama3", 1, "lib", lib, sizeof lib);
    cr_assert_eq(mkmodel_file_fnv1a64(lib, "model.safetensors", want, sizeof want, &err), 0);
    cr_expect_str_eq(got, want);

    snprintf(args, sizeof args, "--arch llama --preset tiny-qwen3 --out '%s'", dir);
    expect_refused(args, 1, "tiny-qwen3");
    snprintf(args, sizeof args, "--preset nope --out '%s'", dir);
    expect_refused(args, 1, "nope");
    expect_refused("--preset tiny-qwen3 --seed -4 --out x", 2, NULL);
    expect_refused("--preset tiny-qwen3", 2, "--out");
}

/* --layers N: the preset's first N layers, the same tensors as the full preset's for
 * them (a routed model's dense layers past N dropped from mlp_only_layers). */
Test(mkmodel, cli_layers_keeps_the_first_layers_of_a_preset)
{
    static char out[16384];
    char args[1200], dir[1024];
    snprintf(dir, sizeof dir, "%s/short", tmp);
    snprintf(args, sizeof args, "--preset tiny-qwen3_moe --layers 1 --out '%s'", dir);
    cr_assert_eq(run_cli(args, out, sizeof out), 0, "%s", out);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *cfg = json_object_from_file(path), *v;
    cr_assert_not_null(cfg);
    cr_assert(json_object_object_get_ex(cfg, "num_hidden_layers", &v));
    cr_expect_eq(json_object_get_int(v), 1);
    cr_assert(json_object_object_get_ex(cfg, "mlp_only_layers", &v));
    cr_expect_eq(json_object_array_length(v), 0, "layer 1 (dense) is not kept");
    json_object_put(cfg);

    struct read_model shortm, full;
    char fdir[1024];
    read_model(dir, &shortm);
    read_model(make("tiny-qwen3_moe", 1, "full", fdir, sizeof fdir), &full);
    int n = 0;
    json_object_object_foreach(shortm.header, name, t)
    {
        if (!strcmp(name, "__metadata__"))
            continue;
        n++;
        cr_expect(strstr(name, "layers.1.") == NULL, "%s kept", name);
        json_object *ft, *so, *fo;
        cr_assert(json_object_object_get_ex(full.header, name, &ft), "%s is not the full's", name);
        cr_assert(json_object_object_get_ex(t, "data_offsets", &so));
        cr_assert(json_object_object_get_ex(ft, "data_offsets", &fo));
        int64_t s0 = json_object_get_int64(json_object_array_get_idx(so, 0));
        int64_t s1 = json_object_get_int64(json_object_array_get_idx(so, 1));
        int64_t f0 = json_object_get_int64(json_object_array_get_idx(fo, 0));
        int64_t f1 = json_object_get_int64(json_object_array_get_idx(fo, 1));
        cr_assert_eq(s1 - s0, f1 - f0, "%s", name);
        cr_expect_eq(memcmp(shortm.file + 8 + shortm.header_len + s0,
                            full.file + 8 + full.header_len + f0, (size_t)(s1 - s0)),
                     0, "%s differs from the full preset's", name);
    }
    cr_expect_gt(n, 0);
    free_model(&shortm);
    free_model(&full);

    snprintf(args, sizeof args, "--preset tiny-qwen3_moe --layers 4 --out '%s'", dir);
    expect_refused(args, 2, "3 layers");
    expect_refused("--preset tiny-llama --layers 0 --out x", 2, NULL);
    expect_refused("--arch llama --layers 1 --out x", 2, "--preset");
}

/* ---- --tokenizer: fitting a preset to a real tokenizer ------------------- */

/* A small byte-less BPE tokenizer: vocab ids 0..5, added tokens up to id 700
 * (past tiny-qwen3's 509), a chat template that ends turns with <|im_end|>. */
static const char small_tokenizer_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":600,\"content\":\"<|endoftext|>\",\"special\":true},"
    "{\"id\":650,\"content\":\"<|im_start|>\",\"special\":true},"
    "{\"id\":700,\"content\":\"<|im_end|>\",\"special\":true}],"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"<s>\":4,\"</s>\":5},"
    "\"merges\":[\"a b\"]}}";

static const char small_tokenizer_config[] =
    "{\"bos_token\":{\"content\":\"<s>\",\"special\":true},\"eos_token\":\"<|endoftext|>\","
    "\"chat_template\":\"{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}\"}";

/* Writes tokenizer.json and tokenizer_config.json (config may be NULL: not written) into tmp/sub. */
static const char *write_tokenizer(const char *sub, const char *json, const char *config,
                                   char *dir, size_t cap)
{
    char path[1200];
    snprintf(dir, cap, "%s/%s", tmp, sub);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(test_write_file(path, json, strlen(json)), 0);
    if (config) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        cr_assert_eq(test_write_file(path, config, strlen(config)), 0);
    }
    return dir;
}

static json_object *read_json(const char *dir, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_object *o = json_object_from_file(path);
    cr_assert_not_null(o, "%s is not JSON", path);
    return o;
}

/* eos_token_id as text ("5" or "[5, 7]") for compact comparisons. */
static const char *eos_text(json_object *cfg)
{
    return json_object_to_json_string_ext(json_object_object_get(cfg, "eos_token_id"),
                                          JSON_C_TO_STRING_PLAIN);
}

Test(mkmodel, tokenizer_flag_copies_the_files_and_fits_vocab_bos_and_eos)
{
    char tdir[1024], out[1024], path[1200];
    write_tokenizer("tok", small_tokenizer_json, small_tokenizer_config, tdir, sizeof tdir);
    snprintf(out, sizeof out, "%s/model", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = out,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);

    cr_expect(same_file(tdir, out, "tokenizer.json"));
    cr_expect(same_file(tdir, out, "tokenizer_config.json"));
    struct stat st;
    snprintf(path, sizeof path, "%s/special_tokens_map.json", out);
    cr_expect_neq(stat(path, &st), 0, "special_tokens_map.json appeared from nowhere");

    json_object *c = read_json(out, "config.json"), *g = read_json(out, "generation_config.json");
    cr_expect_eq(json_object_get_int(json_object_object_get(c, "vocab_size")), 701);
    cr_expect_eq(json_object_get_int(json_object_object_get(c, "bos_token_id")), 4);
    cr_expect_eq(json_object_get_int(json_object_object_get(g, "bos_token_id")), 4);
    cr_expect_str_eq(eos_text(c), "[600,700]", "eos: the tokenizer's, then the turn end");
    cr_expect_str_eq(eos_text(g), "[600,700]");
    json_object_put(c);
    json_object_put(g);

    /* The weights have the fitted shape: a 701-row embedding. */
    struct read_model m;
    read_model(out, &m);
    json_object *shape = json_object_object_get(
        json_object_object_get(m.header, "model.embed_tokens.weight"), "shape");
    cr_expect_eq(json_object_get_int(json_object_array_get_idx(shape, 0)), 701);
    free_model(&m);
}

/* Phi-3 and Phi-4 end a turn with <|end|>, not with their eos_token (<|endoftext|>): a model made
 * on such a tokenizer stops there too. */
Test(mkmodel, a_phi_chat_templates_end_token_joins_the_eos_ids)
{
    static const char json[] =
        "{\"added_tokens\":[{\"id\":400,\"content\":\"<|endoftext|>\",\"special\":true},"
        "{\"id\":401,\"content\":\"<|assistant|>\",\"special\":true},"
        "{\"id\":402,\"content\":\"<|end|>\",\"special\":true},"
        "{\"id\":403,\"content\":\"<|user|>\",\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"<s>\":2},\"merges\":[]}}";
    static const char config[] =
        "{\"bos_token\":\"<s>\",\"eos_token\":\"<|endoftext|>\",\"chat_template\":"
        "\"{% for message in messages %}{{'<|' + message['role'] + '|>' + message['content'] + "
        "'<|end|>'}}{% endfor %}{% if add_generation_prompt %}{{'<|assistant|>'}}{% endif %}\"}";
    char tdir[1024], out[1024];
    write_tokenizer("tok", json, config, tdir, sizeof tdir);
    snprintf(out, sizeof out, "%s/model", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-phi3", .seed = 1, .out_dir = out,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    json_object *c = read_json(out, "config.json"), *g = read_json(out, "generation_config.json");
    cr_expect_str_eq(eos_text(c), "[400,402]", "eos: <|endoftext|>, then the turn end <|end|>");
    cr_expect_str_eq(eos_text(g), "[400,402]");
    json_object_put(c);
    json_object_put(g);
}

Test(mkmodel, tokenizer_smaller_than_the_preset_keeps_the_presets_vocab)
{
    static const char json[] =
        "{\"added_tokens\":[{\"id\":3,\"content\":\"<eos>\",\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2},\"merges\":[]}}";
    char tdir[1024], out[1024];
    write_tokenizer("tok", json, "{\"eos_token\":\"<eos>\",\"bos_token\":null}", tdir, sizeof tdir);
    snprintf(out, sizeof out, "%s/model", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = out,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    json_object *c = read_json(out, "config.json"), *g = read_json(out, "generation_config.json");
    cr_expect_eq(json_object_get_int(json_object_object_get(c, "vocab_size")),
                 mkmodel_preset_find("tiny-qwen3")->vocab_size);
    json_object *bos = NULL;
    cr_expect(json_object_object_get_ex(c, "bos_token_id", &bos) && bos == NULL,
              "no bos_token: config.json's bos_token_id is null");
    cr_expect_not(json_object_object_get_ex(g, "bos_token_id", NULL));
    cr_expect_str_eq(eos_text(c), "3");
    cr_expect_str_eq(eos_text(g), "3");
    json_object_put(c);
    json_object_put(g);
}

Test(mkmodel, special_tokens_map_fills_in_what_tokenizer_config_leaves_out_and_is_copied)
{
    char tdir[1024], out[1024], path[1200];
    write_tokenizer("tok", small_tokenizer_json, "{\"bos_token\":\"<s>\"}", tdir, sizeof tdir);
    static const char map[] = "{\"bos_token\":\"</s>\",\"eos_token\":{\"content\":\"</s>\"}}";
    snprintf(path, sizeof path, "%s/special_tokens_map.json", tdir);
    cr_assert_eq(test_write_file(path, map, strlen(map)), 0);
    snprintf(out, sizeof out, "%s/model", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-llama", .seed = 1, .out_dir = out,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    cr_expect(same_file(tdir, out, "special_tokens_map.json"));
    json_object *c = read_json(out, "config.json");
    cr_expect_eq(json_object_get_int(json_object_object_get(c, "bos_token_id")), 4,
                 "tokenizer_config.json's bos wins");
    cr_expect_str_eq(eos_text(c), "5", "no chat template: the eos alone");
    json_object_put(c);
}

Test(mkmodel, a_tokenizer_without_usable_files_or_eos_is_refused_before_writing)
{
    char tdir[1024], out[1024];
    struct err err = {0};
    struct stat st;
    snprintf(out, sizeof out, "%s/model", tmp);
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = out};

    snprintf(tdir, sizeof tdir, "%s/nowhere", tmp);
    o.tokenizer_dir = tdir;
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EIO);
    cr_expect(strstr(err.msg, "tokenizer.json") != NULL, "%s", err.msg);

    write_tokenizer("no-config", small_tokenizer_json, NULL, tdir, sizeof tdir);
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EIO);
    cr_expect(strstr(err.msg, "tokenizer_config.json") != NULL, "%s", err.msg);

    write_tokenizer("no-eos", small_tokenizer_json, "{\"bos_token\":\"<s>\"}", tdir, sizeof tdir);
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EFORMAT);
    cr_expect(strstr(err.msg, "eos_token") != NULL, "%s", err.msg);

    write_tokenizer("bad-eos", small_tokenizer_json, "{\"eos_token\":\"<nope>\"}", tdir,
                    sizeof tdir);
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EFORMAT);
    cr_expect(strstr(err.msg, "<nope>") != NULL, "%s", err.msg);

    write_tokenizer("bad-json", "{\"model\":", "{\"eos_token\":\"a\"}", tdir, sizeof tdir);
    cr_expect_eq(mkmodel_write(&o, &err), -INFERD_EFORMAT);
    cr_expect(strstr(err.msg, "tokenizer.json") != NULL, "%s", err.msg);

    cr_expect_neq(stat(out, &st), 0, "a refused call created %s", out);
}

Test(mkmodel, tokenizer_flag_on_the_cli_and_without_it_the_preset_bytes_are_unchanged)
{
    static char msg[16384];
    char tdir[1024], args[3400], with[1024], without[1024], lib[1024];
    write_tokenizer("tok", small_tokenizer_json, small_tokenizer_config, tdir, sizeof tdir);
    snprintf(with, sizeof with, "%s/with", tmp);
    snprintf(without, sizeof without, "%s/without", tmp);
    snprintf(args, sizeof args, "--preset tiny-qwen3 --tokenizer '%s' --out '%s'", tdir, with);
    cr_expect_eq(run_cli(args, msg, sizeof msg), 0, "%s", msg);
    cr_expect(same_file(tdir, with, "tokenizer_config.json"));
    snprintf(args, sizeof args, "--preset tiny-qwen3 --out '%s'", without);
    cr_expect_eq(run_cli(args, msg, sizeof msg), 0, "%s", msg);
    make("tiny-qwen3", 1, "lib", lib, sizeof lib);
    cr_expect(same_file(lib, without, "config.json"));
    cr_expect(same_file(lib, without, "generation_config.json"));
    cr_expect(same_file(lib, without, "model.safetensors"));
    cr_expect_not(same_file(lib, with, "config.json"));

    snprintf(args, sizeof args, "--preset tiny-qwen3 --tokenizer '%s/none' --out '%s/x'", tmp, tmp);
    cr_expect_eq(run_cli(args, msg, sizeof msg), 1);
    cr_expect(strstr(msg, "tokenizer") != NULL, "%s", msg);
    cr_expect_eq(run_cli("--preset tiny-qwen3 --out x --tokenizer", msg, sizeof msg), 2);
}

/* The e2e suites' model: tiny-qwen3 on the real Qwen3 tokenizer (make text-data). */
Test(mkmodel, tiny_qwen3_on_the_real_qwen3_tokenizer_loads_with_chat_ids)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data || !*data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set; run scripts/fetch-tokenizers.sh DIR and export it");
    char tdir[1024], out[1024];
    snprintf(tdir, sizeof tdir, "%s/qwen3", data);
    struct stat st;
    if (stat(tdir, &st) != 0)
        cr_skip_test("%s is missing; run scripts/fetch-tokenizers.sh %s", tdir, data);
    snprintf(out, sizeof out, "%s/qwen3", tmp);
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-qwen3", .seed = 1, .out_dir = out,
                             .tokenizer_dir = tdir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    json_object *c = read_json(out, "config.json"), *g = read_json(out, "generation_config.json");
    /* 151643 byte-level BPE tokens plus 26 added ones (<|endoftext|> ... </think>). */
    cr_expect_eq(json_object_get_int(json_object_object_get(c, "vocab_size")), 151669);
    json_object *bos = NULL;
    cr_expect(json_object_object_get_ex(c, "bos_token_id", &bos) && bos == NULL);
    cr_expect_str_eq(eos_text(c), "151645", "<|im_end|>");
    cr_expect_str_eq(eos_text(g), "151645");
    json_object_put(c);
    json_object_put(g);
}
