/* tests/unit/test_config.c — config.json and generation_config.json parsing, defaults, range checks and loading. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"
#include "test_support.h"

#define assert_refused(rc, err, code, fragment)                                                   \
    do {                                                                                          \
        cr_assert_eq((rc), -(code), "rc %d, message: %s", (rc), (err).msg);                      \
        cr_assert_not_null(strstr((err).msg, (fragment)), "message '%s' lacks '%s'", (err).msg,   \
                           (fragment));                                                           \
    } while (0)

static const char llama32_1b[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"head_dim\":64,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
    "\"intermediate_size\":8192,\"max_position_embeddings\":131072,\"mlp_bias\":false,"
    "\"model_type\":\"llama\",\"num_attention_heads\":32,\"num_hidden_layers\":16,"
    "\"num_key_value_heads\":8,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,"
    "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
    "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.45.0.dev0\",\"use_cache\":true,\"vocab_size\":128256}";

static const char qwen25_05b[] =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
    "\"eos_token_id\":151643,\"hidden_act\":\"silu\",\"hidden_size\":896,"
    "\"initializer_range\":0.02,\"intermediate_size\":4864,\"max_position_embeddings\":32768,"
    "\"max_window_layers\":24,\"model_type\":\"qwen2\",\"num_attention_heads\":14,"
    "\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
    "\"rope_theta\":1000000.0,\"sliding_window\":32768,\"tie_word_embeddings\":true,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.43.1\",\"use_cache\":true,"
    "\"use_sliding_window\":false,\"vocab_size\":151936}";

static const char qwen3_06b[] =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"initializer_range\":0.02,\"intermediate_size\":3072,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
    "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\","
    "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";

static const char mistral_7b[] =
    "{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,"
    "\"hidden_act\":\"silu\",\"hidden_size\":4096,\"initializer_range\":0.02,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":32768,\"model_type\":\"mistral\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"sliding_window\":4096,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"use_cache\":true,"
    "\"vocab_size\":32000}";

#define MINIMAL                                                                                   \
    "\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":1000,\"hidden_size\":64,"           \
    "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4"

static int parse_text(const char *text, struct model_config *c, struct err *err)
{
    return model_config_parse(text, strlen(text), c, err);
}

/* The minimal Llama config with extra members appended; json-c keeps the last
 * of repeated keys, so extra can also override a minimal field. */
static int parse_minimal_with(const char *extra, struct model_config *c, struct err *err)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "{" MINIMAL "%s%s}", extra[0] ? "," : "", extra);
    return parse_text(buf, c, err);
}

/* ---------------------------------------------------------------- architectures */

Test(config, llama_config_parses_every_field)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_text(llama32_1b, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, ARCH_LLAMA);
    cr_assert_str_eq(c.arch_name, "LlamaForCausalLM");
    cr_assert_eq(c.vocab_size, 128256);
    cr_assert_eq(c.hidden_size, 2048);
    cr_assert_eq(c.intermediate_size, 8192);
    cr_assert_eq(c.n_layers, 16);
    cr_assert_eq(c.n_heads, 32);
    cr_assert_eq(c.n_kv_heads, 8);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.max_position_embeddings, 131072);
    cr_assert_float_eq(c.rms_norm_eps, 1e-5f, 1e-12);
    cr_assert_float_eq(c.rope_theta, 500000.0f, 1e-3);
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_LLAMA3);
    cr_assert_float_eq(c.rope_factor, 32.0f, 0);
    cr_assert_float_eq(c.rope_low_freq_factor, 1.0f, 0);
    cr_assert_float_eq(c.rope_high_freq_factor, 4.0f, 0);
    cr_assert_eq(c.rope_original_max_position, 8192);
    cr_assert(c.tie_word_embeddings);
    cr_assert(!c.attention_bias);
    cr_assert(!c.qk_norm);
    cr_assert_eq(c.torch_dtype, DTYPE_BF16);
    cr_assert_eq(c.bos_token_id, 128000);
    cr_assert_eq(c.n_eos, 3);
    cr_assert_eq(c.eos_token_ids[0], 128001);
    cr_assert_eq(c.eos_token_ids[2], 128009);
    cr_assert_eq(c.sliding_window, 0);
}

Test(config, qwen2_always_has_attention_bias)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_text(qwen25_05b, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, ARCH_QWEN2);
    cr_assert(c.attention_bias, "Qwen2 q/k/v projections carry biases");
    cr_assert(!c.qk_norm);
    cr_assert_eq(c.head_dim, 64, "896 / 14");
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_token_ids[0], 151643);
    cr_assert_eq(c.sliding_window, 0, "use_sliding_window is false");
}

Test(config, qwen3_has_qk_norm_and_explicit_head_dim)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_text(qwen3_06b, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, ARCH_QWEN3);
    cr_assert(c.qk_norm);
    cr_assert(!c.attention_bias);
    cr_assert_eq(c.head_dim, 128, "head_dim * heads need not equal hidden_size");
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_NONE);
    cr_assert_float_eq(c.rope_theta, 1e6f, 1e-3);
    cr_assert_eq(c.max_position_embeddings, 40960);
}

Test(config, qwen3_attention_bias_comes_from_the_config)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s,\"attention_bias\":true}", (int)strlen(qwen3_06b) - 1,
             qwen3_06b);
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_text(buf, &c, &err), 0, "%s", err.msg);
    cr_assert(c.attention_bias);
}

Test(config, mistral_keeps_its_sliding_window)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_text(mistral_7b, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, ARCH_MISTRAL);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert(!c.tie_word_embeddings);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.bos_token_id, 1);
}

Test(config, model_type_is_used_when_architectures_is_absent)
{
    const char *types[] = {"llama", "mistral", "qwen2", "qwen3"};
    enum model_arch want[] = {ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3};
    for (int i = 0; i < 4; i++) {
        char buf[512];
        snprintf(buf, sizeof buf,
                 "{\"model_type\":\"%s\",\"vocab_size\":100,\"hidden_size\":32,"
                 "\"intermediate_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
                 types[i]);
        struct model_config c;
        struct err err = {0};
        cr_assert_eq(parse_text(buf, &c, &err), 0, "%s: %s", types[i], err.msg);
        cr_assert_eq(c.arch, want[i], "%s", types[i]);
    }
}

Test(config, unsupported_architecture_message_names_it_and_lists_supported)
{
    struct model_config c;
    struct err err = {0};
    int rc = parse_minimal_with("\"architectures\":[\"GemmaForCausalLM\"]", &c, &err);
    cr_assert_eq(rc, -INFERD_EUNSUPPORTED);
    cr_assert_str_eq(err.msg, "unsupported architecture 'GemmaForCausalLM' (supported: "
                              "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                              "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma3ForCausalLM, "
                              "Gemma3ForConditionalGeneration, Phi3ForCausalLM)");
    rc = parse_text("{\"model_type\":\"phi\",\"vocab_size\":1}", &c, &err);
    assert_refused(rc, err, INFERD_EUNSUPPORTED, "'phi'");
}

Test(config, missing_or_malformed_architecture_is_refused)
{
    struct model_config c;
    struct err err = {0};
    assert_refused(parse_text("{\"vocab_size\":10}", &c, &err), err, INFERD_EFORMAT,
                   "neither 'architectures' nor 'model_type'");
    assert_refused(parse_minimal_with("\"architectures\":[]", &c, &err), err, INFERD_EFORMAT,
                   "architectures");
    assert_refused(parse_minimal_with("\"architectures\":\"LlamaForCausalLM\"", &c, &err), err,
                   INFERD_EFORMAT, "architectures");
    assert_refused(parse_minimal_with("\"architectures\":[7]", &c, &err), err, INFERD_EFORMAT,
                   "architectures");
}

Test(config, model_arch_name_gives_the_class_name)
{
    cr_assert_str_eq(model_arch_name(ARCH_LLAMA), "LlamaForCausalLM");
    cr_assert_str_eq(model_arch_name(ARCH_MISTRAL), "MistralForCausalLM");
    cr_assert_str_eq(model_arch_name(ARCH_QWEN2), "Qwen2ForCausalLM");
    cr_assert_str_eq(model_arch_name(ARCH_QWEN3), "Qwen3ForCausalLM");
}

/* ---------------------------------------------------------------- defaults */

Test(config, absent_optional_fields_take_transformers_defaults)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_minimal_with("", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_kv_heads, 4, "defaults to num_attention_heads");
    cr_assert_eq(c.head_dim, 16, "hidden_size / num_attention_heads");
    cr_assert_eq(c.max_position_embeddings, 4096);
    cr_assert_float_eq(c.rms_norm_eps, 1e-6f, 1e-12);
    cr_assert_float_eq(c.rope_theta, 10000.0f, 0);
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_NONE);
    cr_assert(!c.tie_word_embeddings);
    cr_assert(!c.attention_bias);
    cr_assert_eq(c.torch_dtype, DTYPE_BF16);
    cr_assert_eq(c.bos_token_id, -1);
    cr_assert_eq(c.n_eos, 0);
}

Test(config, null_means_default)
{
    struct model_config c;
    struct err err = {0};
    int rc = parse_minimal_with("\"head_dim\":null,\"num_key_value_heads\":null,"
                                "\"rope_scaling\":null,\"bos_token_id\":null,"
                                "\"eos_token_id\":null,\"torch_dtype\":null",
                                &c, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_eq(c.n_kv_heads, 4);
    cr_assert_eq(c.bos_token_id, -1);
}

Test(config, dtype_names_map_to_dtypes)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_minimal_with("\"torch_dtype\":\"float16\"", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.torch_dtype, DTYPE_F16);
    cr_assert_eq(parse_minimal_with("\"torch_dtype\":\"float32\"", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.torch_dtype, DTYPE_F32);
    cr_assert_eq(parse_minimal_with("\"torch_dtype\":\"float32\",\"dtype\":\"bfloat16\"", &c, &err),
                 0, "%s", err.msg);
    cr_assert_eq(c.torch_dtype, DTYPE_BF16, "the newer 'dtype' wins");
    assert_refused(parse_minimal_with("\"torch_dtype\":\"float64\"", &c, &err), err,
                   INFERD_EUNSUPPORTED, "float64");
}

Test(config, eos_ids_accept_int_or_list_and_drop_duplicates)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_minimal_with("\"eos_token_id\":7", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_token_ids[0], 7);
    cr_assert_eq(parse_minimal_with("\"eos_token_id\":[5,6,5]", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 2);
    cr_assert_eq(c.eos_token_ids[1], 6);
    assert_refused(parse_minimal_with("\"eos_token_id\":[1,2,3,4,5,6,7,8,9]", &c, &err), err,
                   INFERD_ERANGE, "at most 8");
    assert_refused(parse_minimal_with("\"eos_token_id\":1000", &c, &err), err, INFERD_ERANGE,
                   "eos_token_id");
    assert_refused(parse_minimal_with("\"eos_token_id\":[1,\"2\"]", &c, &err), err,
                   INFERD_EFORMAT, "eos_token_id");
    assert_refused(parse_minimal_with("\"eos_token_id\":\"2\"", &c, &err), err, INFERD_EFORMAT,
                   "eos_token_id");
    assert_refused(parse_minimal_with("\"bos_token_id\":-1", &c, &err), err, INFERD_ERANGE,
                   "bos_token_id");
}

/* ---------------------------------------------------------------- bad values */

Test(config, missing_required_field_is_named)
{
    const char *text = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":1000,"
                       "\"intermediate_size\":128,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4}";
    struct model_config c;
    struct err err = {0};
    assert_refused(parse_text(text, &c, &err), err, INFERD_EFORMAT, "'hidden_size'");
}

Test(config, wrong_json_types_are_format_errors_naming_the_field)
{
    static const struct {
        const char *extra, *field;
    } cases[] = {
        {"\"hidden_size\":\"64\"", "hidden_size"},
        {"\"hidden_size\":64.0", "hidden_size"},
        {"\"vocab_size\":true", "vocab_size"},
        {"\"num_hidden_layers\":[2]", "num_hidden_layers"},
        {"\"num_key_value_heads\":2.5", "num_key_value_heads"},
        {"\"head_dim\":\"16\"", "head_dim"},
        {"\"max_position_embeddings\":{}", "max_position_embeddings"},
        {"\"rms_norm_eps\":\"1e-5\"", "rms_norm_eps"},
        {"\"rope_theta\":\"10000\"", "rope_theta"},
        {"\"tie_word_embeddings\":\"true\"", "tie_word_embeddings"},
        {"\"tie_word_embeddings\":1", "tie_word_embeddings"},
        {"\"attention_bias\":0", "attention_bias"},
        {"\"torch_dtype\":16", "torch_dtype"},
        {"\"rope_scaling\":\"linear\"", "rope_scaling"},
        {"\"bos_token_id\":1.0", "bos_token_id"},
        {"\"hidden_act\":1", "hidden_act"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct model_config c;
        struct err err = {0};
        int rc = parse_minimal_with(cases[i].extra, &c, &err);
        cr_assert_eq(rc, -INFERD_EFORMAT, "%s: rc %d (%s)", cases[i].extra, rc, err.msg);
        cr_assert_not_null(strstr(err.msg, cases[i].field), "%s: %s", cases[i].extra, err.msg);
    }
}

Test(config, absurd_values_are_range_errors_naming_the_field)
{
    static const struct {
        const char *extra, *field;
    } cases[] = {
        {"\"vocab_size\":0", "vocab_size"},
        {"\"vocab_size\":4194305", "vocab_size"},
        {"\"vocab_size\":99999999999999999999999", "vocab_size"},
        {"\"hidden_size\":-64", "hidden_size"},
        {"\"hidden_size\":65537", "hidden_size"},
        {"\"intermediate_size\":1048577", "intermediate_size"},
        {"\"num_hidden_layers\":0", "num_hidden_layers"},
        {"\"num_hidden_layers\":1025", "num_hidden_layers"},
        {"\"num_attention_heads\":1025", "num_attention_heads"},
        {"\"num_key_value_heads\":0", "num_key_value_heads"},
        {"\"num_key_value_heads\":3", "num_key_value_heads"},
        {"\"num_attention_heads\":3", "num_attention_heads"}, /* 64 % 3 != 0, no head_dim */
        {"\"head_dim\":15", "head_dim"},
        {"\"head_dim\":2048", "head_dim"},
        {"\"head_dim\":0", "head_dim"},
        {"\"hidden_size\":4096,\"num_attention_heads\":2", "head_dim"}, /* default 2048 */
        {"\"max_position_embeddings\":16777217", "max_position_embeddings"},
        {"\"max_position_embeddings\":0", "max_position_embeddings"},
        {"\"rms_norm_eps\":0", "rms_norm_eps"},
        {"\"rms_norm_eps\":1", "rms_norm_eps"},
        {"\"rms_norm_eps\":-1e-6", "rms_norm_eps"},
        {"\"rope_theta\":0", "rope_theta"},
        {"\"rope_theta\":-10000.0", "rope_theta"},
        {"\"rope_theta\":1e300", "rope_theta"},
        {"\"rope_theta\":1e999", "rope_theta"},
        {"\"rope_theta\":NaN", "rope_theta"},
        {"\"bos_token_id\":1000", "bos_token_id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct model_config c;
        struct err err = {0};
        int rc = parse_minimal_with(cases[i].extra, &c, &err);
        cr_assert_eq(rc, -INFERD_ERANGE, "%s: rc %d (%s)", cases[i].extra, rc, err.msg);
        cr_assert_not_null(strstr(err.msg, cases[i].field), "%s: %s", cases[i].extra, err.msg);
    }
}

Test(config, explicit_head_dim_allows_hidden_not_divisible_by_heads)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_minimal_with("\"num_attention_heads\":3,\"num_key_value_heads\":1,"
                                    "\"head_dim\":32",
                                    &c, &err),
                 0, "%s", err.msg);
    cr_assert_eq(c.head_dim, 32);
}

Test(config, features_the_forward_pass_lacks_are_refused)
{
    struct model_config c;
    struct err err = {0};
    assert_refused(parse_minimal_with("\"hidden_act\":\"gelu\"", &c, &err), err,
                   INFERD_EUNSUPPORTED, "gelu");
    assert_refused(parse_minimal_with("\"mlp_bias\":true", &c, &err), err, INFERD_EUNSUPPORTED,
                   "mlp_bias");
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s,\"use_sliding_window\":true}", (int)strlen(qwen25_05b) - 1,
             qwen25_05b);
    assert_refused(parse_text(buf, &c, &err), err, INFERD_EUNSUPPORTED, "use_sliding_window");
}

Test(config, malformed_json_is_refused)
{
    struct model_config c;
    struct err err = {0};
    assert_refused(parse_text("", &c, &err), err, INFERD_EFORMAT, "JSON");
    assert_refused(parse_text("{\"vocab_size\":", &c, &err), err, INFERD_EFORMAT, "JSON");
    assert_refused(parse_text("{\"vocab_size\" 12}", &c, &err), err, INFERD_EFORMAT, "JSON");
    assert_refused(parse_text("[1]", &c, &err), err, INFERD_EFORMAT, "not a JSON object");
    assert_refused(parse_text("{} {}", &c, &err), err, INFERD_EFORMAT, "JSON");
}

Test(config, buffer_is_read_only_up_to_len)
{
    /* Valid JSON followed by bytes outside len that would break it. */
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "{" MINIMAL "}GARBAGE");
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(model_config_parse(buf, (size_t)n - 7, &c, &err), 0, "%s", err.msg);
    assert_refused(model_config_parse(buf, (size_t)n - 10, &c, &err), err, INFERD_EFORMAT,
                   "JSON");
}

/* ---------------------------------------------------------------- rope_scaling */

Test(config, rope_scaling_kinds_are_parsed)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_minimal_with("\"rope_scaling\":{\"rope_type\":\"default\"}", &c, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_NONE);
    cr_assert_eq(
        parse_minimal_with("\"rope_scaling\":{\"type\":\"linear\",\"factor\":4}", &c, &err), 0,
        "%s", err.msg);
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_LINEAR);
    cr_assert_float_eq(c.rope_factor, 4.0f, 0);
    cr_assert_eq(parse_minimal_with("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                                    "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                    "\"original_max_position_embeddings\":8192}",
                                    &c, &err),
                 0, "%s", err.msg);
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_LLAMA3);
    cr_assert_eq(c.rope_original_max_position, 8192);
}

Test(config, rope_parameters_supply_theta_and_type)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_minimal_with("\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2,"
                                    "\"rope_theta\":250000.0}",
                                    &c, &err),
                 0, "%s", err.msg);
    cr_assert_eq(c.rope_scaling, ROPE_SCALING_LINEAR);
    cr_assert_float_eq(c.rope_theta, 250000.0f, 0);
}

Test(config, other_rope_scaling_types_are_unsupported_by_name)
{
    const char *types[] = {"yarn", "dynamic"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        char extra[256];
        snprintf(extra, sizeof extra, "\"rope_scaling\":{\"rope_type\":\"%s\",\"factor\":4.0}",
                 types[i]);
        struct model_config c;
        struct err err = {0};
        assert_refused(parse_minimal_with(extra, &c, &err), err, INFERD_EUNSUPPORTED, types[i]);
    }
    /* longrope and su (Phi-3) are supported, and need their factor lists */
    const char *longrope[] = {"longrope", "su"};
    for (size_t i = 0; i < sizeof longrope / sizeof *longrope; i++) {
        char extra[256];
        snprintf(extra, sizeof extra, "\"rope_scaling\":{\"rope_type\":\"%s\",\"factor\":4.0}",
                 longrope[i]);
        struct model_config c;
        struct err err = {0};
        assert_refused(parse_minimal_with(extra, &c, &err), err, INFERD_EFORMAT, "short_factor");
    }
}

Test(config, malformed_rope_scaling_is_refused)
{
    struct model_config c;
    struct err err = {0};
    assert_refused(parse_minimal_with("\"rope_scaling\":{\"factor\":4.0}", &c, &err), err,
                   INFERD_EFORMAT, "rope_type");
    assert_refused(parse_minimal_with("\"rope_scaling\":{\"rope_type\":\"linear\"}", &c, &err), err,
                   INFERD_EFORMAT, "factor");
    assert_refused(parse_minimal_with("\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":0}",
                                      &c, &err),
                   err, INFERD_ERANGE, "factor");
    assert_refused(parse_minimal_with("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                                      "\"low_freq_factor\":1,\"high_freq_factor\":4}",
                                      &c, &err),
                   err, INFERD_EFORMAT, "original_max_position_embeddings");
    assert_refused(parse_minimal_with("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                                      "\"low_freq_factor\":4,\"high_freq_factor\":4,"
                                      "\"original_max_position_embeddings\":8192}",
                                      &c, &err),
                   err, INFERD_ERANGE, "high_freq_factor");
    assert_refused(parse_minimal_with("\"rope_scaling\":{\"rope_type\":5}", &c, &err), err,
                   INFERD_EFORMAT, "rope_type");
    assert_refused(parse_minimal_with("\"rope_scaling\":[1]", &c, &err), err, INFERD_EFORMAT,
                   "rope_scaling");
}

/* ---------------------------------------------------------------- generation_config.json */

Test(generation_config, defaults_are_neutral_sampling)
{
    struct generation_defaults g;
    generation_defaults_init(&g);
    cr_assert_float_eq(g.temperature, 1.0f, 0);
    cr_assert_float_eq(g.top_p, 1.0f, 0);
    cr_assert_eq(g.top_k, 0);
    cr_assert_float_eq(g.repetition_penalty, 1.0f, 0);
    cr_assert(!g.do_sample);
    cr_assert_eq(g.n_eos, 0);
    cr_assert_eq(g.bos_token_id, -1);
}

Test(generation_config, fields_present_override_and_absent_ones_stay)
{
    const char *text = "{\"do_sample\":true,\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20,"
                       "\"eos_token_id\":[151645,151643],\"bos_token_id\":151643,"
                       "\"pad_token_id\":151643,\"transformers_version\":\"4.51.0\"}";
    struct generation_defaults g;
    generation_defaults_init(&g);
    struct err err = {0};
    cr_assert_eq(generation_config_parse(text, strlen(text), &g, &err), 0, "%s", err.msg);
    cr_assert(g.do_sample);
    cr_assert_float_eq(g.temperature, 0.6f, 1e-7);
    cr_assert_float_eq(g.top_p, 0.95f, 1e-7);
    cr_assert_eq(g.top_k, 20);
    cr_assert_float_eq(g.repetition_penalty, 1.0f, 0);
    cr_assert_eq(g.n_eos, 2);
    cr_assert_eq(g.eos_token_ids[0], 151645);
    cr_assert_eq(g.bos_token_id, 151643);
}

Test(generation_config, bad_field_is_refused_and_leaves_defaults_untouched)
{
    static const struct {
        const char *text, *field;
        int code;
    } cases[] = {
        {"{\"temperature\":\"hot\"}", "temperature", INFERD_EFORMAT},
        {"{\"temperature\":-1}", "temperature", INFERD_ERANGE},
        {"{\"top_p\":1.5}", "top_p", INFERD_ERANGE},
        {"{\"top_k\":-3}", "top_k", INFERD_ERANGE},
        {"{\"top_k\":2.5}", "top_k", INFERD_EFORMAT},
        {"{\"repetition_penalty\":0}", "repetition_penalty", INFERD_ERANGE},
        {"{\"do_sample\":\"yes\"}", "do_sample", INFERD_EFORMAT},
        {"{\"eos_token_id\":[1,-2]}", "eos_token_id", INFERD_ERANGE},
        {"{\"eos_token_id\":{}}", "eos_token_id", INFERD_EFORMAT},
        {"{\"temperature\":0.5,\"bos_token_id\":\"x\"}", "bos_token_id", INFERD_EFORMAT},
        {"{\"temperature\":", "JSON", INFERD_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct generation_defaults g;
        generation_defaults_init(&g);
        struct err err = {0};
        int rc = generation_config_parse(cases[i].text, strlen(cases[i].text), &g, &err);
        cr_assert_eq(rc, -cases[i].code, "%s: rc %d (%s)", cases[i].text, rc, err.msg);
        cr_assert_not_null(strstr(err.msg, cases[i].field), "%s: %s", cases[i].text, err.msg);
        cr_assert_float_eq(g.temperature, 1.0f, 0, "%s changed g", cases[i].text);
    }
}

/* ---------------------------------------------------------------- loading a directory */

static void write_in(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(test_write_file(path, text, strlen(text)), 0);
}

Test(config, missing_config_json_is_an_io_error_naming_the_path)
{
    char *dir = test_mkdtemp();
    struct model_config c;
    struct generation_defaults g;
    struct err err = {0};
    int rc = model_config_load(dir, &c, &g, &err);
    assert_refused(rc, err, INFERD_EIO, "config.json");
    cr_assert_not_null(strstr(err.msg, dir), "%s", err.msg);
    test_rmtree(dir);
    free(dir);
}

Test(config, load_without_generation_config_uses_defaults)
{
    char *dir = test_mkdtemp();
    write_in(dir, "config.json", qwen3_06b);
    struct model_config c;
    struct generation_defaults g;
    struct err err = {0};
    cr_assert_eq(model_config_load(dir, &c, &g, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, ARCH_QWEN3);
    cr_assert_eq(g.n_eos, 0);
    cr_assert_float_eq(g.temperature, 1.0f, 0);
    test_rmtree(dir);
    free(dir);
}

Test(config, generation_config_eos_ids_are_merged_without_duplicates)
{
    char *dir = test_mkdtemp();
    write_in(dir, "config.json", qwen3_06b); /* eos 151645 */
    write_in(dir, "generation_config.json",
             "{\"eos_token_id\":[151645,151643],\"temperature\":0.6,\"top_k\":20}");
    struct model_config c;
    struct generation_defaults g;
    struct err err = {0};
    cr_assert_eq(model_config_load(dir, &c, &g, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 2);
    cr_assert_eq(c.eos_token_ids[0], 151645);
    cr_assert_eq(c.eos_token_ids[1], 151643);
    cr_assert_eq(g.top_k, 20);
    cr_assert_float_eq(g.temperature, 0.6f, 1e-7);
    test_rmtree(dir);
    free(dir);
}

Test(config, broken_files_are_refused_naming_the_file)
{
    char *dir = test_mkdtemp();
    struct model_config c;
    struct generation_defaults g;
    struct err err = {0};
    write_in(dir, "config.json", "{\"architectures\":[\"LlamaForCausalLM\"],");
    assert_refused(model_config_load(dir, &c, &g, &err), err, INFERD_EFORMAT, "config.json");
    write_in(dir, "config.json", qwen3_06b);
    write_in(dir, "generation_config.json", "{\"top_p\":7}");
    assert_refused(model_config_load(dir, &c, &g, &err), err, INFERD_ERANGE,
                   "generation_config.json");
    write_in(dir, "generation_config.json", "{\"eos_token_id\":[200000]}");
    assert_refused(model_config_load(dir, &c, &g, &err), err, INFERD_ERANGE,
                   "outside the vocabulary");
    write_in(dir, "generation_config.json", "{\"eos_token_id\":[1,2,3,4,5,6,7,8]}");
    assert_refused(model_config_load(dir, &c, &g, &err), err, INFERD_ERANGE, "distinct eos ids");
    test_rmtree(dir);
    free(dir);
}

Test(config, oversized_config_file_is_refused_before_reading)
{
    char *dir = test_mkdtemp();
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fseek(f, 17L << 20, SEEK_SET); /* sparse: 17 MB without writing them */
    fputc('}', f);
    fclose(f);
    struct model_config c;
    struct err err = {0};
    assert_refused(model_config_load(dir, &c, NULL, &err), err, INFERD_EFORMAT, "limit");
    test_rmtree(dir);
    free(dir);
}

Test(config, config_json_that_is_a_directory_is_an_io_error)
{
    char *dir = test_mkdtemp();
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    struct model_config c;
    struct err err = {0};
    assert_refused(model_config_load(dir, &c, NULL, &err), err, INFERD_EIO, "config.json");
    test_rmtree(dir);
    free(dir);
}

/* ---- Gemma 3 and Phi-3 ------------------------------------------------------ */

/* Gemma 3 4B as released: the text model's config names only what differs
 * from Gemma3TextConfig's defaults, the ids and dtype sit at the top. */
static const char gemma3_4b_it[] =
    "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"boi_token_index\":255999,"
    "\"eoi_token_index\":256000,\"eos_token_id\":[1,106],\"image_token_index\":262144,"
    "\"initializer_range\":0.02,\"mm_tokens_per_image\":256,\"model_type\":\"gemma3\","
    "\"text_config\":{\"hidden_size\":2560,\"intermediate_size\":10240,"
    "\"model_type\":\"gemma3_text\",\"num_hidden_layers\":34,"
    "\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"},\"sliding_window\":1024},"
    "\"torch_dtype\":\"bfloat16\",\"vision_config\":{\"hidden_size\":1152,"
    "\"image_size\":896,\"model_type\":\"siglip_vision_model\"}}";

Test(config, gemma3_multimodal_reads_its_text_config_with_gemma3_defaults)
{
    struct model_config c;
    struct err err = {0};
    cr_assert_eq(parse_text(gemma3_4b_it, &c, &err), 0, "%s", err.msg);
    cr_expect_eq(c.arch, ARCH_GEMMA3);
    cr_expect(c.multimodal);
    cr_expect_eq(c.vocab_size, 262208);
    cr_expect_eq(c.hidden_size, 2560);
    cr_expect_eq(c.n_layers, 34);
    cr_expect_eq(c.n_heads, 8);
    cr_expect_eq(c.n_kv_heads, 4);
    cr_expect_eq(c.head_dim, 256);
    cr_expect_eq(c.sliding_window, 1024);
    cr_expect_eq(c.rope_scaling, ROPE_SCALING_LINEAR);
    cr_expect_float_eq(c.rope_factor, 8.0f, 0);
    cr_expect_float_eq(c.rope_theta, 1000000.0f, 0);
    cr_expect_float_eq(c.rope_local_theta, 10000.0f, 0);
    cr_expect_float_eq(c.query_scale, 0.0625f, 0);
    cr_expect_eq(c.final_logit_softcap, 0.0f);
    for (int i = 0; i < c.n_layers; i++)
        cr_expect_eq(c.layer_sliding[i], (i + 1) % 6 != 0, "layer %d", i);
    cr_expect(c.qk_norm && c.gemma_norm && c.embed_scale && c.gelu_tanh && c.tie_word_embeddings);
    cr_expect_eq(c.torch_dtype, DTYPE_BF16);
    cr_expect_eq(c.n_eos, 2);
    cr_expect_eq(c.eos_token_ids[1], 106);
    cr_expect_eq(c.bos_token_id, 2);
}

Test(config, gemma3_layer_types_and_soft_caps)
{
    struct model_config c;
    struct err err = {0};
    const char *text =
        "{\"architectures\":[\"Gemma3ForCausalLM\"],\"vocab_size\":300,\"hidden_size\":64,"
        "\"intermediate_size\":96,\"num_hidden_layers\":3,\"num_attention_heads\":2,"
        "\"num_key_value_heads\":1,\"head_dim\":32,\"query_pre_attn_scalar\":16,"
        "\"layer_types\":[\"full_attention\",\"sliding_attention\",\"full_attention\"],"
        "\"sliding_window\":8,\"final_logit_softcapping\":30.0,\"attn_logit_softcapping\":null}";
    cr_assert_eq(parse_text(text, &c, &err), 0, "%s", err.msg);
    cr_expect(!c.layer_sliding[0] && c.layer_sliding[1] && !c.layer_sliding[2]);
    cr_expect_float_eq(c.query_scale, 0.25f, 0);
    cr_expect_float_eq(c.final_logit_softcap, 30.0f, 0);
    cr_expect(!c.multimodal);

    char *capped = strdup(text);
    memcpy(strstr(capped, "null"), "50.0", 4);
    assert_refused(parse_text(capped, &c, &err), err, INFERD_EUNSUPPORTED,
                   "attn_logit_softcapping");
    free(capped);
    const char *wrong_count =
        "{\"architectures\":[\"Gemma3ForCausalLM\"],\"num_hidden_layers\":2,"
        "\"layer_types\":[\"full_attention\"]}";
    assert_refused(parse_text(wrong_count, &c, &err), err, INFERD_EFORMAT, "names 1 layers");
    const char *silu = "{\"architectures\":[\"Gemma3ForCausalLM\"],\"hidden_activation\":\"silu\"}";
    assert_refused(parse_text(silu, &c, &err), err, INFERD_EUNSUPPORTED, "gelu_pytorch_tanh");
}

/* Phi-4-mini's shape of config: partial rotary, longrope factors per rotated pair. */
static void phi3_config(char *buf, size_t cap, int n_factors, const char *partial)
{
    char list[1024];
    size_t len = (size_t)snprintf(list, sizeof list, "[");
    for (int i = 0; i < n_factors; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d.5", i ? "," : "", 1 + i);
    snprintf(list + len, sizeof list - len, "]");
    snprintf(buf, cap,
             "{\"architectures\":[\"Phi3ForCausalLM\"],\"vocab_size\":400,\"hidden_size\":256,"
             "\"intermediate_size\":512,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
             "\"num_key_value_heads\":2,\"max_position_embeddings\":131072,"
             "\"original_max_position_embeddings\":4096,\"partial_rotary_factor\":%s,"
             "\"hidden_act\":\"silu\",\"sliding_window\":262144,"
             "\"rope_scaling\":{\"long_factor\":%s,\"short_factor\":%s,\"type\":\"longrope\"}}",
             partial, list, list);
}

Test(config, phi3_longrope_reads_factors_switch_point_and_attention_factor)
{
    char text[4096];
    struct model_config c;
    struct err err = {0};
    phi3_config(text, sizeof text, 24, "0.75"); /* head_dim 64: 48 rotated dims */
    cr_assert_eq(parse_text(text, &c, &err), 0, "%s", err.msg);
    cr_expect_eq(c.arch, ARCH_PHI3);
    cr_expect_eq(c.rope_dim, 48);
    cr_expect_eq(model_rope_dim(&c), 48);
    cr_expect_eq(c.rope_scaling, ROPE_SCALING_LONGROPE);
    cr_expect_eq(c.n_rope_factors, 24);
    cr_expect_float_eq(c.rope_long_factor[23], 24.5f, 0);
    cr_expect_eq(c.rope_original_max_position, 4096);
    cr_expect_eq(c.sliding_window, 262144);
    /* transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)) */
    cr_expect_float_eq(c.rope_attention_factor, (float)sqrt(1 + log(32.0) / log(4096.0)), 1e-7);
    float freq[48];
    model_rope_inv_freq(&c, freq);
    cr_expect_float_eq(freq[0], 1.0f / 1.5f, 1e-7);
    model_rope_inv_freq_long(&c, freq);
    cr_expect_float_eq(freq[0], 1.0f / 1.5f, 1e-7);

    phi3_config(text, sizeof text, 32, "0.75");
    assert_refused(parse_text(text, &c, &err), err, INFERD_EFORMAT, "48 rotated dims need 24");
    phi3_config(text, sizeof text, 24, "0.3");
    assert_refused(parse_text(text, &c, &err), err, INFERD_ERANGE, "partial_rotary_factor");
}
