/* tools/mkwhisper.c — random-weight Whisper model directories at test and release shapes, byte for byte deterministic. */
#include "tools/mkwhisper.h"

#include <errno.h>
#include <stdarg.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct mkwhisper_preset presets[] = {
    {"whisper-test", 64, 2, 2, 2, 256, 80, false},
    {"whisper-test-128", 64, 1, 1, 2, 128, 128, false},
    {"whisper-tiny", 384, 4, 4, 6, 1536, 80, true},
    {"whisper-base", 512, 6, 6, 8, 2048, 80, true},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

static const char *const lang_codes[] = {
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv",
    "it", "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no",
    "th", "ur", "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr",
    "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw",
    "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu",
    "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue"};
#define N_LANGS ((int)(sizeof lang_codes / sizeof lang_codes[0]))
#define N_TIMESTAMPS 1501

const struct mkwhisper_preset *mkwhisper_presets(int *n)
{
    *n = N_PRESETS;
    return presets;
}

const struct mkwhisper_preset *mkwhisper_preset_find(const char *name)
{
    for (int i = 0; name && i < N_PRESETS; i++)
        if (!strcmp(presets[i].name, name))
            return &presets[i];
    return NULL;
}

/* The special ids of a layout: eot first, then as listed in mkwhisper.h. */
struct layout {
    int eot, sot, lang0, translate, transcribe, startoflm, prev, nospeech, notimestamps, ts0,
        vocab;
};

static struct layout layout_of(const struct mkwhisper_preset *p)
{
    struct layout l;
    l.eot = p->real_vocab ? 50257 : 256;
    l.sot = l.eot + 1;
    l.lang0 = l.sot + 1;
    l.translate = l.lang0 + N_LANGS;
    l.transcribe = l.translate + 1;
    l.startoflm = l.transcribe + 1;
    l.prev = l.startoflm + 1;
    l.nospeech = l.prev + 1;
    l.notimestamps = l.nospeech + 1;
    l.ts0 = l.notimestamps + 1;
    l.vocab = l.ts0 + N_TIMESTAMPS;
    return l;
}

/* ---- text out ------------------------------------------------------------------ */

struct buf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static int write_file(const char *dir, const char *name, const void *data, size_t len,
                      struct err *err)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return err_set(err, INFERD_EIO, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return err_set(err, INFERD_EIO, "cannot write %s", path);
    }
    return 0;
}

static int write_buf(const char *dir, const char *name, struct buf *b, struct err *err)
{
    if (b->oom)
        return err_set(err, INFERD_ENOMEM, "out of memory writing %s", name);
    int rc = write_file(dir, name, b->p, b->n, err);
    free(b->p);
    memset(b, 0, sizeof *b);
    return rc;
}

static void config_json(const struct mkwhisper_preset *p, const struct layout *l, struct buf *b)
{
    put(b, "{\n  \"activation_function\": \"gelu\",\n"
           "  \"architectures\": [\"WhisperForConditionalGeneration\"],\n"
           "  \"begin_suppress_tokens\": [32, %d],\n  \"bos_token_id\": %d,\n"
           "  \"d_model\": %d,\n  \"decoder_attention_heads\": %d,\n  \"decoder_ffn_dim\": %d,\n"
           "  \"decoder_layers\": %d,\n  \"decoder_start_token_id\": %d,\n"
           "  \"encoder_attention_heads\": %d,\n  \"encoder_ffn_dim\": %d,\n"
           "  \"encoder_layers\": %d,\n  \"eos_token_id\": %d,\n"
           "  \"max_source_positions\": 1500,\n  \"max_target_positions\": 448,\n"
           "  \"model_type\": \"whisper\",\n  \"num_hidden_layers\": %d,\n"
           "  \"num_mel_bins\": %d,\n  \"pad_token_id\": %d,\n  \"scale_embedding\": false,\n"
           "  \"suppress_tokens\": [],\n  \"tie_word_embeddings\": true,\n"
           "  \"torch_dtype\": \"float32\",\n  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
        l->eot, l->eot, p->d_model, p->heads, p->ffn, p->decoder_layers, l->sot, p->heads, p->ffn,
        p->encoder_layers, l->eot, p->encoder_layers, p->n_mels, l->eot, l->vocab);
}

static void generation_json(const struct layout *l, struct buf *b)
{
    put(b, "{\n  \"begin_suppress_tokens\": [32, %d],\n  \"bos_token_id\": %d,\n"
           "  \"decoder_start_token_id\": %d,\n  \"eos_token_id\": %d,\n"
           "  \"is_multilingual\": true,\n  \"lang_to_id\": {",
        l->eot, l->eot, l->sot, l->eot);
    for (int i = 0; i < N_LANGS; i++)
        put(b, "%s\"<|%s|>\": %d", i ? ", " : "", lang_codes[i], l->lang0 + i);
    put(b, "},\n  \"max_initial_timestamp_index\": 50,\n  \"max_length\": 448,\n"
           "  \"no_timestamps_token_id\": %d,\n  \"pad_token_id\": %d,\n"
           "  \"prev_sot_token_id\": %d,\n  \"return_timestamps\": false,\n"
           "  \"suppress_tokens\": [],\n"
           "  \"task_to_id\": {\"transcribe\": %d, \"translate\": %d}\n}\n",
        l->notimestamps, l->eot, l->prev, l->transcribe, l->translate);
}

/* GPT-2's byte-to-character map: printable bytes stand for themselves, the
 * rest for U+0100 onwards in byte order; the UTF-8 of byte b's character. */
static void byte_char(int b, char out[4])
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    int cp = b;
    if (!printable) {
        int k = 0;
        for (int i = 0; i < b; i++)
            k += !((i >= '!' && i <= '~') || (i >= 0xa1 && i <= 0xac) || (i >= 0xae && i <= 0xff));
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

static void added(struct buf *b, bool *first, int id, const char *content, bool special)
{
    put(b, "%s\n    {\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, "
           "\"rstrip\": false, \"normalized\": false, \"special\": %s}",
        *first ? "" : ",", id, content, special ? "true" : "false");
    *first = false;
}

static void tokenizer_json(const struct layout *l, struct buf *b)
{
    put(b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
           "  \"added_tokens\": [");
    bool first = true;
    char name[32];
    added(b, &first, l->eot, "<|endoftext|>", true);
    added(b, &first, l->sot, "<|startoftranscript|>", true);
    for (int i = 0; i < N_LANGS; i++) {
        snprintf(name, sizeof name, "<|%s|>", lang_codes[i]);
        added(b, &first, l->lang0 + i, name, true);
    }
    added(b, &first, l->translate, "<|translate|>", true);
    added(b, &first, l->transcribe, "<|transcribe|>", true);
    added(b, &first, l->startoflm, "<|startoflm|>", true);
    added(b, &first, l->prev, "<|startofprev|>", true);
    added(b, &first, l->nospeech, "<|nospeech|>", true);
    added(b, &first, l->notimestamps, "<|notimestamps|>", true);
    for (int i = 0; i < N_TIMESTAMPS; i++) {
        snprintf(name, sizeof name, "<|%d.%02d|>", i / 50, (i % 50) * 2);
        added(b, &first, l->ts0 + i, name, false);
    }
    put(b, "\n  ],\n  \"normalizer\": null,\n"
           "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
           "\"trim_offsets\": true, \"use_regex\": true},\n  \"post_processor\": null,\n"
           "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
           "\"trim_offsets\": true, \"use_regex\": true},\n"
           "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
           "\"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\", "
           "\"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": {");
    for (int i = 0; i < 256; i++) {
        char c[4];
        byte_char(i, c);
        const char *esc = c[0] == '"' ? "\\\"" : c[0] == '\\' ? "\\\\" : c;
        put(b, "%s\"%s\": %d", i ? ", " : "", esc, i);
    }
    put(b, "}, \"merges\": []}\n}\n");
}

static const char tokenizer_config[] =
    "{\n  \"bos_token\": \"<|endoftext|>\",\n  \"eos_token\": \"<|endoftext|>\",\n"
    "  \"pad_token\": \"<|endoftext|>\",\n  \"unk_token\": \"<|endoftext|>\",\n"
    "  \"model_max_length\": 1024,\n  \"tokenizer_class\": \"WhisperTokenizer\"\n}\n";

static void preprocessor_json(const struct mkwhisper_preset *p, struct buf *b)
{
    put(b, "{\n  \"chunk_length\": 30,\n  \"feature_extractor_type\": \"WhisperFeatureExtractor\",\n"
           "  \"feature_size\": %d,\n  \"hop_length\": 160,\n  \"n_fft\": 400,\n"
           "  \"n_samples\": 480000,\n  \"nb_max_frames\": 3000,\n  \"padding_side\": \"right\",\n"
           "  \"padding_value\": 0.0,\n  \"processor_class\": \"WhisperProcessor\",\n"
           "  \"return_attention_mask\": false,\n  \"sampling_rate\": 16000\n}\n",
        p->n_mels);
}

/* ---- weights ------------------------------------------------------------------- */

enum init { INIT_LINEAR, INIT_BIAS, INIT_NORM_W, INIT_NORM_B, INIT_EMBED, INIT_SINUSOID };

struct tensor {
    char name[96];
    int64_t shape[3];
    int n_dims;
    enum init init;
    int64_t fan_in;
};

struct tensors {
    struct tensor v[256];
    int n;
};

static void add(struct tensors *t, const char *name, enum init init, int64_t d0, int64_t d1,
                int64_t d2, int64_t fan_in)
{
    struct tensor *x = &t->v[t->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->shape[2] = d2;
    x->n_dims = d2 ? 3 : d1 ? 2 : 1;
    x->init = init;
    x->fan_in = fan_in;
}

static void add_attn(struct tensors *t, const char *prefix, const char *block, const char *norm,
                     int64_t d)
{
    char n[96];
#define A(suffix, init, d0, d1, fan) \
    (snprintf(n, sizeof n, "%s.%s.%s", prefix, block, suffix), add(t, n, init, d0, d1, 0, fan))
    A("q_proj.weight", INIT_LINEAR, d, d, d);
    A("q_proj.bias", INIT_BIAS, d, 0, 0);
    A("k_proj.weight", INIT_LINEAR, d, d, d);
    A("v_proj.weight", INIT_LINEAR, d, d, d);
    A("v_proj.bias", INIT_BIAS, d, 0, 0);
    A("out_proj.weight", INIT_LINEAR, d, d, d);
    A("out_proj.bias", INIT_BIAS, d, 0, 0);
#undef A
    snprintf(n, sizeof n, "%s.%s.weight", prefix, norm);
    add(t, n, INIT_NORM_W, d, 0, 0, 0);
    snprintf(n, sizeof n, "%s.%s.bias", prefix, norm);
    add(t, n, INIT_NORM_B, d, 0, 0, 0);
}

static void tensor_list(const struct mkwhisper_preset *p, const struct layout *l, struct tensors *t)
{
    int64_t d = p->d_model;
    add(t, "model.encoder.conv1.weight", INIT_LINEAR, d, p->n_mels, 3, (int64_t)p->n_mels * 3);
    add(t, "model.encoder.conv1.bias", INIT_BIAS, d, 0, 0, 0);
    add(t, "model.encoder.conv2.weight", INIT_LINEAR, d, d, 3, d * 3);
    add(t, "model.encoder.conv2.bias", INIT_BIAS, d, 0, 0, 0);
    add(t, "model.encoder.embed_positions.weight", INIT_SINUSOID, 1500, d, 0, 0);
    add(t, "model.encoder.layer_norm.weight", INIT_NORM_W, d, 0, 0, 0);
    add(t, "model.encoder.layer_norm.bias", INIT_NORM_B, d, 0, 0, 0);
    add(t, "model.decoder.embed_tokens.weight", INIT_EMBED, l->vocab, d, 0, 0);
    add(t, "model.decoder.embed_positions.weight", INIT_EMBED, 448, d, 0, 0);
    add(t, "model.decoder.layer_norm.weight", INIT_NORM_W, d, 0, 0, 0);
    add(t, "model.decoder.layer_norm.bias", INIT_NORM_B, d, 0, 0, 0);
    for (int dec = 0; dec < 2; dec++)
        for (int i = 0; i < (dec ? p->decoder_layers : p->encoder_layers); i++) {
            char prefix[64], n[96];
            snprintf(prefix, sizeof prefix, "model.%s.layers.%d", dec ? "decoder" : "encoder", i);
            add_attn(t, prefix, "self_attn", "self_attn_layer_norm", d);
            if (dec)
                add_attn(t, prefix, "encoder_attn", "encoder_attn_layer_norm", d);
#define L(suffix, init, d0, d1, fan) \
    (snprintf(n, sizeof n, "%s.%s", prefix, suffix), add(t, n, init, d0, d1, 0, fan))
            L("fc1.weight", INIT_LINEAR, p->ffn, d, d);
            L("fc1.bias", INIT_BIAS, p->ffn, 0, 0);
            L("fc2.weight", INIT_LINEAR, d, p->ffn, p->ffn);
            L("fc2.bias", INIT_BIAS, d, 0, 0);
            L("final_layer_norm.weight", INIT_NORM_W, d, 0, 0);
            L("final_layer_norm.bias", INIT_NORM_B, d, 0, 0);
#undef L
        }
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const struct tensor *)a)->name, ((const struct tensor *)b)->name);
}

static uint64_t numel(const struct tensor *x)
{
    uint64_t n = 1;
    for (int i = 0; i < x->n_dims; i++)
        n *= (uint64_t)x->shape[i];
    return n;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(const struct tensor *x, uint64_t seed, float *out)
{
    uint64_t s0 = 0xcbf29ce484222325ull;
    for (const char *c = x->name; *c; c++)
        s0 = (s0 ^ (uint8_t)*c) * 0x100000001b3ull;
    s0 ^= mix64(seed);
    uint64_t n = numel(x);
    if (x->init == INIT_SINUSOID) { /* Whisper's sinusoids(1500, d), as transformers stores them */
        int64_t len = x->shape[0], ch = x->shape[1], half = ch / 2;
        float inc = logf(10000.0f) / (float)(half - 1);
        for (int64_t t = 0; t < len; t++)
            for (int64_t i = 0; i < half; i++) {
                float a = (float)t * expf(-inc * (float)i);
                out[t * ch + i] = sinf(a);
                out[t * ch + half + i] = cosf(a);
            }
        return;
    }
    float a = x->init == INIT_LINEAR  ? sqrtf(3.0f) / sqrtf((float)x->fan_in)
              : x->init == INIT_EMBED ? 0.5f
                                      : 0.1f;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t z = mix64(s0 + (i + 1) * 0x9e3779b97f4a7c15ull);
        float u = (float)((int64_t)(z >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
        out[i] = x->init == INIT_NORM_W ? 1.0f + 0.1f * u : a * u;
    }
}

static int write_weights(const struct mkwhisper_preset *p, const struct layout *l, uint64_t seed,
                         const char *dir, struct err *err)
{
    struct tensors *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, INFERD_ENOMEM, "out of memory listing tensors");
    tensor_list(p, l, t);
    qsort(t->v, (size_t)t->n, sizeof t->v[0], tensor_cmp);
    struct buf h = {0};
    uint64_t off = 0, max_n = 0;
    put(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < t->n; i++) {
        uint64_t bytes = numel(&t->v[i]) * 4;
        put(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", t->v[i].name);
        for (int k = 0; k < t->v[i].n_dims; k++)
            put(&h, "%s%lld", k ? "," : "", (long long)t->v[i].shape[k]);
        put(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
            (unsigned long long)(off + bytes));
        off += bytes;
        if (numel(&t->v[i]) > max_n)
            max_n = numel(&t->v[i]);
    }
    put(&h, "}");
    while (!h.oom && h.n % 8)
        put(&h, " ");
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    float *data = malloc(max_n * sizeof *data);
    FILE *f = h.oom || !data ? NULL : fopen(tmp, "wb");
    int rc = 0;
    if (!f) {
        rc = err_set(err, h.oom || !data ? INFERD_ENOMEM : INFERD_EIO, "cannot write %s", tmp);
    } else {
        uint64_t hl = h.n;
        uint8_t le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (uint8_t)(hl >> (8 * k));
        bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(h.p, 1, h.n, f) == h.n;
        for (int i = 0; ok && i < t->n; i++) {
            fill(&t->v[i], seed, data);
            ok = fwrite(data, 4, numel(&t->v[i]), f) == numel(&t->v[i]);
        }
        ok &= fclose(f) == 0;
        if (!ok || rename(tmp, path) != 0) {
            unlink(tmp);
            rc = err_set(err, INFERD_EIO, "cannot write %s", path);
        }
    }
    free(data);
    free(h.p);
    free(t);
    return rc;
}

int mkwhisper_write(const char *preset, uint64_t seed, const char *dir, struct err *err)
{
    const struct mkwhisper_preset *p = mkwhisper_preset_find(preset);
    if (!p)
        return err_set(err, INFERD_EINVAL, "unknown Whisper preset '%s'", preset ? preset : "");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return err_set(err, INFERD_EIO, "cannot create %s: %s", dir, strerror(errno));
    struct layout l = layout_of(p);
    struct buf b = {0};
    int rc;
    config_json(p, &l, &b);
    if ((rc = write_buf(dir, "config.json", &b, err)) < 0)
        return rc;
    generation_json(&l, &b);
    if ((rc = write_buf(dir, "generation_config.json", &b, err)) < 0)
        return rc;
    preprocessor_json(p, &b);
    if ((rc = write_buf(dir, "preprocessor_config.json", &b, err)) < 0)
        return rc;
    tokenizer_json(&l, &b);
    if ((rc = write_buf(dir, "tokenizer.json", &b, err)) < 0)
        return rc;
    if ((rc = write_file(dir, "tokenizer_config.json", tokenizer_config,
                         sizeof tokenizer_config - 1, err)) < 0)
        return rc;
    return write_weights(p, &l, seed, dir, err);
}
