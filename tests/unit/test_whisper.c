/* tests/unit/test_whisper.c — uploaded audio (WAV decoding, resampling), Whisper's log-mel front end, and the model and its decoding on random weights. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "audio/audio.h"
#include "backend/backend.h"
#include "engine/transcribe.h"
#include "model/whisper.h"
#include "test_support.h"
#include "tools/mkwhisper.h"

/* A canonical 44-byte-header WAV of n frames. */
static uint8_t *make_wav(int format, int channels, int rate, int bits, const void *pcm,
                         size_t bytes, size_t *len)
{
    *len = 44 + bytes;
    uint8_t *w = calloc(1, *len);
    memcpy(w, "RIFF", 4);
    uint32_t v = (uint32_t)(*len - 8);
    memcpy(w + 4, &v, 4);
    memcpy(w + 8, "WAVEfmt ", 8);
    v = 16;
    memcpy(w + 16, &v, 4);
    uint16_t h = (uint16_t)format;
    memcpy(w + 20, &h, 2);
    h = (uint16_t)channels;
    memcpy(w + 22, &h, 2);
    v = (uint32_t)rate;
    memcpy(w + 24, &v, 4);
    v = (uint32_t)(rate * channels * bits / 8);
    memcpy(w + 28, &v, 4);
    h = (uint16_t)(channels * bits / 8);
    memcpy(w + 32, &h, 2);
    h = (uint16_t)bits;
    memcpy(w + 34, &h, 2);
    memcpy(w + 36, "data", 4);
    v = (uint32_t)bytes;
    memcpy(w + 40, &v, 4);
    memcpy(w + 44, pcm, bytes);
    return w;
}

Test(wav, pcm16_stereo_is_mixed_to_mono_and_scaled)
{
    int16_t pcm[] = {16384, 0, -32768, -32768, 32767, 32767};
    size_t len;
    uint8_t *w = make_wav(1, 2, 22050, 16, pcm, sizeof pcm, &len);
    struct audio_pcm p;
    struct err err = {0};
    cr_assert_eq(audio_wav_decode(w, len, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p.n, 3);
    cr_assert_eq(p.sample_rate, 22050);
    cr_assert_eq(p.channels, 2);
    cr_assert_float_eq(p.samples[0], 0.25f, 1e-6);
    cr_assert_float_eq(p.samples[1], -1.0f, 1e-6);
    cr_assert_float_eq(p.samples[2], 32767.0f / 32768.0f, 1e-6);
    audio_pcm_free(&p);
    free(w);
}

Test(wav, eight_24_32_bit_and_float_samples_decode)
{
    uint8_t u8[] = {0, 128, 255};
    uint8_t s24[] = {0x00, 0x00, 0x80, 0x00, 0x00, 0x40};
    int32_t s32[] = {INT32_MIN, 1 << 30};
    float f32[] = {0.5f, -0.25f};
    double f64[] = {0.125};
    struct { int fmt, bits; const void *pcm; size_t bytes; float first; } cases[] = {
        {1, 8, u8, sizeof u8, -1.0f}, {1, 24, s24, sizeof s24, -1.0f},
        {1, 32, s32, sizeof s32, -1.0f}, {3, 32, f32, sizeof f32, 0.5f},
        {3, 64, f64, sizeof f64, 0.125f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *w = make_wav(cases[i].fmt, 1, 16000, cases[i].bits, cases[i].pcm, cases[i].bytes,
                              &len);
        struct audio_pcm p;
        struct err err = {0};
        cr_assert_eq(audio_decode(w, len, &p, &err), 0, "case %zu: %s", i, err.msg);
        cr_assert_float_eq(p.samples[0], cases[i].first, 1e-6, "case %zu", i);
        audio_pcm_free(&p);
        free(w);
    }
}

Test(wav, malformed_and_unsupported_files_are_refused_with_a_reason)
{
    int16_t pcm[4] = {0};
    size_t len;
    uint8_t *w = make_wav(1, 1, 16000, 16, pcm, sizeof pcm, &len);
    struct audio_pcm p;
    struct err err = {0};
    cr_assert_eq(audio_decode(w, 0, &p, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "empty"), "%s", err.msg);
    cr_assert_eq(audio_wav_decode(w, 30, &p, &err), -INFERD_EFORMAT); /* fmt cut short */
    cr_assert_eq(audio_wav_decode(w, 45, &p, &err), -INFERD_EFORMAT); /* half a frame */
    cr_assert(strstr(err.msg, "no whole sample frame"), "%s", err.msg);
    w[20] = 6; /* A-law */
    cr_assert_eq(audio_wav_decode(w, len, &p, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "0x0006"), "%s", err.msg);
    w[20] = 1;
    w[34] = 12; /* 12-bit PCM */
    cr_assert_eq(audio_wav_decode(w, len, &p, &err), -INFERD_EUNSUPPORTED);
    free(w);
    cr_assert_eq(audio_decode((const uint8_t *)"hello, not audio", 16, &p, &err),
                 -INFERD_EFORMAT);
}

/* A sine's power (RMS) after resampling, and how much of a tone above the new
 * Nyquist survives (none should). */
static double rms(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s / (double)n);
}

Test(resample, keeps_a_passband_tone_and_removes_an_alias)
{
    const int in_rate = 44100, n = 44100;
    float *tone = malloc(n * sizeof *tone), *alias = malloc(n * sizeof *alias);
    for (int i = 0; i < n; i++) {
        tone[i] = 0.5f * sinf(2 * (float)M_PI * 1000.0f * i / in_rate);
        alias[i] = 0.5f * sinf(2 * (float)M_PI * 12000.0f * i / in_rate);
    }
    float *y;
    size_t m;
    struct err err = {0};
    cr_assert_eq(audio_resample(tone, n, in_rate, 16000, &y, &m, &err), 0);
    cr_assert_eq(m, 16000);
    /* away from the edges: amplitude 0.5 -> RMS 0.3536; and the phase is right */
    cr_assert_float_eq(rms(y + 1000, 14000), 0.5 / sqrt(2.0), 2e-3);
    cr_assert_float_eq(y[8000], 0.5f * sinf(2 * (float)M_PI * 1000.0f * 8000 / 16000), 5e-3);
    free(y);
    cr_assert_eq(audio_resample(alias, n, in_rate, 16000, &y, &m, &err), 0);
    cr_assert_lt(rms(y + 1000, 14000), 1e-3);
    free(y);
    free(tone);
    free(alias);
}

Test(mel, a_sine_lights_the_mel_bin_of_its_frequency)
{
    struct audio_mel mel;
    struct err err = {0};
    cr_assert_eq(audio_mel_init(80, &mel, &err), 0);
    /* filters: Slaney normalisation makes each triangle's area 1 in Hz units
     * (height 2 / width); bin 0 peaks at 1 / 3 of 8000 Hz's mel span over 81 steps */
    size_t n = 16000; /* 1 s */
    float *x = malloc(n * sizeof *x), *out = malloc(80 * AUDIO_WINDOW_FRAMES * sizeof *out);
    for (size_t i = 0; i < n; i++)
        x[i] = 0.5f * sinf(2 * (float)M_PI * 1000.0f * i / 16000);
    audio_mel_window(&mel, x, n, out);
    /* the loudest bin of a frame in the middle: the filter whose centre is nearest 1 kHz.
     * Slaney mel of 1000 Hz is 15; 0..8000 Hz spans 0..45.25 mel in 81 steps, so centre m
     * sits at (m + 1) * 45.245 / 81: 1000 Hz is bin 25.85 -> the peak is bin 26 or 25. */
    int t = 50, best = 0;
    for (int b = 1; b < 80; b++)
        if (out[b * AUDIO_WINDOW_FRAMES + t] > out[best * AUDIO_WINDOW_FRAMES + t])
            best = b;
    cr_assert(best == 25 || best == 26, "peak in bin %d", best);
    /* after the clip the padding is silence, floored at max - 8, then (x + 4) / 4 */
    float vmax = -INFINITY, vmin = INFINITY;
    for (size_t i = 0; i < 80 * AUDIO_WINDOW_FRAMES; i++) {
        vmax = fmaxf(vmax, out[i]);
        vmin = fminf(vmin, out[i]);
    }
    cr_assert_float_eq(vmin, vmax - 2.0f, 1e-5);
    cr_assert_float_eq(out[0 * AUDIO_WINDOW_FRAMES + 2500], vmin, 1e-6);
    free(x);
    free(out);
    audio_mel_free(&mel);
}

Test(mel, filters_match_the_slaney_bank_transformers_builds)
{
    struct audio_mel mel;
    struct err err = {0};
    cr_assert_eq(audio_mel_init(80, &mel, &err), 0);
    /* filter 0 rises from 0 Hz to its centre at mel 45.245 / 81 = 0.5586 (37.24 Hz) over
     * FFT bins 40 Hz apart: bin 1 (40 Hz) is past the centre, on the falling side whose
     * end is mel 1.1172 (74.48 Hz); weight = (74.48 - 40) / 37.24 * 2 / 74.48 */
    double c = 200.0 / 3.0 * (45.24539 / 81.0), hi = 2 * c;
    double want = (hi - 40.0) / (hi - c) * 2.0 / hi;
    cr_assert_float_eq(mel.filters[1], want, 1e-6 * want + 1e-9, "got %.9g want %.9g",
                       mel.filters[1], want);
    cr_assert_eq(mel.filters[0], 0.0);
    audio_mel_free(&mel);
    cr_assert_eq(audio_mel_init(128, &mel, &err), 0);
    audio_mel_free(&mel);
}

/* Golden parity files, when present (tests/goldens/whisper, made by make_goldens.py). */
#define GOLDEN_MEL_FRAMES 400   /* make_goldens.py's MEL_FRAMES */
#define GOLDEN_ENCODER_STRIDE 10 /* make_goldens.py's ENCODER_STRIDE */

/* The clip make_goldens.py uses: 3 s of 440 Hz + 3 kHz at 16 kHz, computed in double as numpy
 * does (float phases of 56k radians would add a noise floor); *n gets its length. */
static float *golden_clip(size_t *n)
{
    *n = 16000 * 3;
    float *x = malloc(*n * sizeof *x);
    cr_assert_not_null(x);
    for (size_t i = 0; i < *n; i++)
        x[i] = (float)(0.3 * sin(2 * M_PI * 440.0 * (double)i / 16000) +
                       0.1 * sin(2 * M_PI * 3000.0 * (double)i / 16000));
    return x;
}
Test(whisper_goldens, mel_matches_transformers_when_goldens_exist)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tests/goldens/whisper/sine_mel80.f32", INFERD_SOURCE_DIR);
    size_t len = 0;
    char *gold = test_read_file(path, &len);
    if (!gold) {
        cr_skip_test("whisper goldens absent (%s): run tests/goldens/whisper/make_goldens.py", path);
    }
    /* make_goldens.py keeps the first GOLDEN_MEL_FRAMES frames of each bin: the clip and a
     * stretch of the padding, which stays one constant after it. */
    cr_assert_eq(len, 80 * GOLDEN_MEL_FRAMES * sizeof(float));
    struct audio_mel mel;
    struct err err = {0};
    cr_assert_eq(audio_mel_init(80, &mel, &err), 0);
    size_t n;
    float *x = golden_clip(&n), *out = malloc(80 * AUDIO_WINDOW_FRAMES * sizeof *out);
    audio_mel_window(&mel, x, n, out);
    float worst = 0;
    for (int b = 0; b < 80; b++)
        for (int f = 0; f < GOLDEN_MEL_FRAMES; f++)
            worst = fmaxf(worst, fabsf(out[(size_t)b * AUDIO_WINDOW_FRAMES + f] -
                                       ((float *)gold)[(size_t)b * GOLDEN_MEL_FRAMES + f]));
    cr_assert_leq(worst, 1e-4f, "max abs diff %g", worst);
    free(x);
    free(out);
    free(gold);
    audio_mel_free(&mel);
}

static struct backend *cpu(void)
{
    struct backend *be;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2}, &be, &err), 0, "%s",
                 err.msg);
    return be;
}

Test(whisper_model, random_test_model_loads_encodes_and_decodes_deterministically)
{
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-test", 1, dir, &err), 0, "%s", err.msg);
    struct backend *be = cpu();
    struct whisper_model *m;
    cr_assert_eq(whisper_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->config.d_model, 64);
    cr_assert(m->config.multilingual);
    struct whisper_state *st;
    cr_assert_eq(whisper_state_create(m, &st, &err), 0, "%s", err.msg);
    float *mel = calloc(80 * AUDIO_WINDOW_FRAMES, sizeof *mel);
    for (int i = 0; i < 80 * AUDIO_WINDOW_FRAMES; i++)
        mel[i] = sinf((float)i * 0.001f);
    cr_assert_eq(whisper_encode(st, mel, &err), 0, "%s", err.msg);
    int vocab = m->config.vocab_size;
    float *a = malloc(vocab * sizeof *a), *b = malloc(vocab * sizeof *b);
    int32_t prompt[] = {257, 258, 359, 363}; /* sot, en, transcribe, notimestamps */
    cr_assert_eq(whisper_decode(st, prompt, 4, a, &err), 0, "%s", err.msg);
    /* the same prefix fed one token at a time through the cache gives the same logits */
    whisper_rewind(st, 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(whisper_decode(st, &prompt[i], 1, b, &err), 0);
    float worst = 0;
    for (int i = 0; i < vocab; i++) {
        cr_assert(isfinite(a[i]));
        worst = fmaxf(worst, fabsf(a[i] - b[i]));
    }
    cr_assert_leq(worst, 1e-4f, "prefill vs cached decode differ by %g", worst);
    whisper_rewind(st, 0);
    int32_t bad = vocab;
    cr_assert_eq(whisper_decode(st, &bad, 1, a, &err), -INFERD_EINVAL);
    free(a);
    free(b);
    free(mel);
    whisper_state_free(st);
    whisper_free(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

Test(whisper_model, missing_tensor_and_wrong_model_type_are_named)
{
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-test", 1, dir, &err), 0, "%s", err.msg);
    struct whisper_config c;
    const char *llama = "{\"model_type\": \"llama\"}";
    cr_assert_eq(whisper_config_parse(llama, strlen(llama), &c, &err), -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "llama"), "%s", err.msg);
    struct backend *be = cpu();
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    struct whisper_model *m = NULL;
    cr_assert_lt(whisper_load(dir, be, &m, &err), 0);
    cr_assert_null(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

static int count_segments(void *ctx, const char *text, size_t len)
{
    (*(int *)ctx)++;
    return 0;
}

Test(transcribe, windows_segments_and_options_on_a_random_model)
{
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-test", 1, dir, &err), 0, "%s", err.msg);
    struct backend *be = cpu();
    struct transcriber *t;
    cr_assert_eq(transcriber_create(dir, be, &t, &err), 0);
    size_t n = 16000 * 2;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = 0.3f * sinf(2 * (float)M_PI * 300.0f * i / 16000);
    int calls = 0;
    struct transcribe_options o = {.language = "en", .temperature = 0.5f, .timestamps = true,
                                   .on_segment = count_segments, .ctx = &calls, .seed = 7};
    struct transcribe_result r, r2;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    cr_assert_str_eq(r.language, "en");
    cr_assert_float_eq(r.duration, 2.0, 1e-9);
    for (int i = 0; i < r.n_segments; i++)
        cr_assert_leq(r.segments[i].start, r.segments[i].end);
    /* the same seed decodes the same tokens */
    cr_assert_eq(transcriber_run(t, x, n, &o, &r2, &err), 0, "%s", err.msg);
    cr_assert_str_eq(r.text, r2.text);
    transcribe_result_free(&r);
    transcribe_result_free(&r2);
    o.language = "klingon";
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), -INFERD_EINVAL);
    struct transcriber_stats s;
    transcriber_stats(t, &s);
    cr_assert_eq(s.requests, 3);
    cr_assert_eq(s.failures, 1);
    cr_assert(s.loaded);
    cr_assert(transcriber_unload(t));
    cr_assert_not(transcriber_unload(t));
    /* language detection on a multilingual model picks one of its language tokens */
    o.language = NULL;
    o.timestamps = false;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    cr_assert_not_null(transcribe_language_code(r.language));
    transcribe_result_free(&r);
    transcriber_free(t);
    free(x);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

/* Encoder output and decoder logits of the whisper-tiny shape against transformers, when
 * make_goldens.py has been run (max abs diff of the encoder within 1e-3 of its scale; logits:
 * argmax identical, relative error <= 1e-3). */
Test(whisper_goldens, tiny_encoder_and_logits_match_transformers_when_goldens_exist)
{
    char path[4200];
    size_t enc_len = 0, log_len = 0;
    snprintf(path, sizeof path, "%s/tests/goldens/whisper/whisper-tiny_encoder.f32", INFERD_SOURCE_DIR);
    float *enc_gold = (float *)test_read_file(path, &enc_len);
    snprintf(path, sizeof path, "%s/tests/goldens/whisper/whisper-tiny_logits.f32", INFERD_SOURCE_DIR);
    float *log_gold = (float *)test_read_file(path, &log_len);
    if (!enc_gold || !log_gold) {
        free(enc_gold);
        free(log_gold);
        cr_skip_test("whisper-tiny goldens absent: run tests/goldens/whisper/make_goldens.py");
    }
    /* The encoder's input is our own mel of the clip (the mel test above holds it to
     * transformers' within 1e-4). */
    struct audio_mel front;
    cr_assert_eq(audio_mel_init(80, &front, &(struct err){0}), 0);
    size_t n_clip;
    float *clip = golden_clip(&n_clip), *mel = malloc(80 * AUDIO_WINDOW_FRAMES * sizeof *mel);
    audio_mel_window(&front, clip, n_clip, mel);
    free(clip);
    audio_mel_free(&front);
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-tiny", 1, dir, &err), 0, "%s", err.msg);
    struct backend *be = cpu();
    struct whisper_model *m;
    struct whisper_state *st;
    cr_assert_eq(whisper_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_state_create(m, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_encode(st, mel, &err), 0, "%s", err.msg);
    size_t d = (size_t)m->config.d_model, kept = 1500 / GOLDEN_ENCODER_STRIDE;
    cr_assert_eq(enc_len, kept * d * sizeof(float));
    float *enc = malloc(1500 * d * sizeof *enc);
    cr_assert_eq(whisper_encoder_output(st, enc, &err), 0);
    float worst = 0, scale = 0;
    for (size_t r = 0; r < kept; r++)
        for (size_t i = 0; i < d; i++) {
            float g = enc_gold[r * d + i];
            worst = fmaxf(worst, fabsf(enc[r * GOLDEN_ENCODER_STRIDE * d + i] - g));
            scale = fmaxf(scale, fabsf(g));
        }
    cr_assert_leq(worst, 1e-3f * scale, "encoder max abs diff %g (scale %g)", worst, scale);
    int vocab = m->config.vocab_size, n_prompt = (int)(log_len / sizeof(float) / vocab);
    size_t prompt_len = 0;
    snprintf(path, sizeof path, "%s/tests/goldens/whisper/whisper-tiny_prompt.i32", INFERD_SOURCE_DIR);
    int32_t *prompt = (int32_t *)test_read_file(path, &prompt_len);
    cr_assert_not_null(prompt, "%s is missing", path);
    cr_assert_eq(n_prompt, 4);
    cr_assert_eq(prompt_len, n_prompt * sizeof(int32_t));
    float *logits = malloc(vocab * sizeof *logits);
    for (int p = 0; p < n_prompt; p++) {
        cr_assert_eq(whisper_decode(st, &prompt[p], 1, logits, &err), 0, "%s", err.msg);
        const float *g = log_gold + (size_t)p * vocab;
        int a = 0, b = 0;
        float diff = 0, norm = 0;
        for (int i = 0; i < vocab; i++) {
            if (logits[i] > logits[a])
                a = i;
            if (g[i] > g[b])
                b = i;
            diff = fmaxf(diff, fabsf(logits[i] - g[i]));
            norm = fmaxf(norm, fabsf(g[i]));
        }
        cr_assert_eq(a, b, "position %d: argmax %d vs transformers' %d", p, a, b);
        cr_assert_leq(diff, 1e-3f * norm, "position %d: logits differ by %g (scale %g)", p, diff, norm);
    }
    free(logits);
    free(prompt);
    free(enc);
    free(enc_gold);
    free(log_gold);
    free(mel);
    whisper_state_free(st);
    whisper_free(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}
