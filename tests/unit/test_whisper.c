/* tests/unit/test_whisper.c — uploaded audio (WAV decoding, resampling), Whisper's log-mel front end, and the model and its decoding on random weights. */
#include <criterion/criterion.h>
#include <samplerate.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "audio/audio.h"
#include "base/threadpool.h"
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
    cr_assert_eq(audio_resample(tone, n, in_rate, 16000, 1, &y, &m, &err), 0);
    cr_assert(m >= 15999 && m <= 16001, "%zu samples for 1 s", m);
    /* away from the edges: amplitude 0.5 -> RMS 0.3536; and the phase is right */
    cr_assert_float_eq(rms(y + 1000, 14000), 0.5 / sqrt(2.0), 2e-3);
    cr_assert_float_eq(y[8000], 0.5f * sinf(2 * (float)M_PI * 1000.0f * 8000 / 16000), 5e-3);
    free(y);
    cr_assert_eq(audio_resample(alias, n, in_rate, 16000, 1, &y, &m, &err), 0);
    cr_assert_lt(rms(y + 1000, 14000), 1e-3);
    free(y);
    /* a ratio past the converter's range is refused, not attempted */
    cr_assert_eq(audio_resample(tone, n, 44100, 100, 1, &y, &m, &err), -INFERD_EUNSUPPORTED);
    cr_assert_null(y);
    free(tone);
    free(alias);
}

/* Pieces converted apart, on any number of threads, give the samples of libsamplerate's one
 * pass over the whole signal, bit for bit: each piece starts at a whole rate period, where
 * the converter's phase is the one pass's. */
Test(resample, pieces_on_any_thread_count_give_the_samples_of_one_pass)
{
    static const int rates[] = {8000, 11025, 22050, 32000, 44056, 44100, 48000, 96000};
    for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
        const int rate = rates[r];
        const size_t n = (size_t)(7.3 * rate) + 17;
        float *x = malloc(n * sizeof *x);
        uint64_t st = 99;
        for (size_t i = 0; i < n; i++) {
            double t = (double)i / rate;
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)(0.4 * sin(2 * M_PI * (200 + 300 * t) * t) +
                           0.05 * ((double)(st >> 40) / (double)(1ull << 24) - 0.5));
        }
        size_t cap = (size_t)(n * 16000.0 / rate) + 64;
        float *ref = malloc(cap * sizeof *ref);
        SRC_DATA d = {.data_in = x, .data_out = ref, .input_frames = (long)n,
                      .output_frames = (long)cap, .end_of_input = 1,
                      .src_ratio = 16000.0 / rate};
        cr_assert_eq(src_simple(&d, SRC_SINC_MEDIUM_QUALITY, 1), 0);
        float *first = NULL;
        size_t first_n = 0;
        static const int threads[] = {1, 3, 8};
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            float *y;
            size_t m;
            struct err err = {0};
            cr_assert_eq(audio_resample(x, n, rate, 16000, threads[t], &y, &m, &err), 0, "%s",
                         err.msg);
            cr_assert_eq(m, (size_t)d.output_frames_gen, "%d Hz, %d threads: %zu samples, one "
                         "pass %ld", rate, threads[t], m, d.output_frames_gen);
            size_t differ = 0;
            for (size_t i = 0; i < m; i++)
                differ += y[i] != ref[i];
            cr_expect_eq(differ, 0, "%d Hz, %d threads: %zu samples differ from one pass", rate,
                         threads[t], differ);
            if (!first) {
                first = y;
                first_n = m;
            } else {
                cr_expect_eq(memcmp(first, y, first_n * sizeof *y), 0,
                             "%d Hz: %d threads differ from 1", rate, threads[t]);
                free(y);
            }
        }
        free(first);
        free(ref);
        free(x);
    }
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
    audio_mel_window(&mel, x, n, out, NULL);
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

/* Frames split over a pool's threads give the features of one thread, bit for bit, for clips
 * that end mid-window (frames past the end are silence without reading them) and a full one. */
Test(mel, threads_give_the_features_of_one_thread)
{
    struct audio_mel mel;
    struct err err = {0};
    struct threadpool *pool = NULL;
    cr_assert_eq(audio_mel_init(80, &mel, &err), 0);
    cr_assert_eq(threadpool_create(3, &pool, &err), 0, "%s", err.msg);
    size_t lens[] = {1, 16000 * 7 + 77, AUDIO_WINDOW_SAMPLES};
    size_t total = (size_t)80 * AUDIO_WINDOW_FRAMES;
    float *x = malloc(AUDIO_WINDOW_SAMPLES * sizeof *x), *one = malloc(total * sizeof *one),
          *many = malloc(total * sizeof *many);
    for (size_t i = 0; i < AUDIO_WINDOW_SAMPLES; i++)
        x[i] = 0.3f * sinf(0.05f * (float)i) + 0.2f * sinf(0.0031f * (float)(i * i % 100003));
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        audio_mel_window(&mel, x, lens[k], one, NULL);
        audio_mel_window(&mel, x, lens[k], many, pool);
        cr_assert_eq(memcmp(one, many, total * sizeof *one), 0, "%zu samples", lens[k]);
    }
    free(x);
    free(one);
    free(many);
    threadpool_free(pool);
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
    audio_mel_window(&mel, x, n, out, NULL);
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
    cr_assert_eq(m->config.max_previous_text, 223, "openai-whisper's n_text_ctx / 2 - 1 by default");
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

/* models/whisper-house read at most 64 tokens of previous text in training, and says so in its
 * generation_config.json (max_previous_text_tokens); a value past n_text_ctx / 2 - 1 is refused */
Test(whisper_model, the_house_model_limits_its_previous_text)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/models/whisper-house", INFERD_SOURCE_DIR);
    struct err err = {0};
    struct backend *be = cpu();
    struct whisper_model *m;
    cr_assert_eq(whisper_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->config.max_previous_text, 64);
    cr_assert_eq(m->config.d_model, 192);
    whisper_free(m);

    char *tmp = test_mkdtemp();
    cr_assert_eq(mkwhisper_write("whisper-test", 1, tmp, &err), 0, "%s", err.msg);
    char path[4300];
    snprintf(path, sizeof path, "%s/generation_config.json", tmp);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"max_previous_text_tokens\": 224}", f);
    fclose(f);
    cr_assert_lt(whisper_load(tmp, be, &m, &err), 0);
    cr_assert_not_null(strstr(err.msg, "max_previous_text_tokens"), "%s", err.msg);
    backend_destroy(be);
    test_rmtree(tmp);
    free(tmp);
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

static int count_segments(void *ctx, const struct transcribe_segment *seg)
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
    audio_mel_window(&front, clip, n_clip, mel, NULL);
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

/* A golden file of int32 ids (NULL when absent); *n gets their count. */
static int32_t *golden_ids(const char *preset, const char *what, int *n)
{
    char path[4200];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tests/goldens/whisper/%s_%s.i32", INFERD_SOURCE_DIR, preset,
             what);
    int32_t *v = (int32_t *)test_read_file(path, &len);
    *n = (int)(len / sizeof *v);
    return v;
}

/* The transcriber's greedy decoding of the golden clip's features, as transformers'
 * generate(input_features, language=, task=, do_sample=False, max_new_tokens=20) decodes them:
 * the prompt <|startoftranscript|><|lang|><|task|><|notimestamps|>, generation_config.json's
 * suppress and begin-suppress lists, no temperature fallback, no conditioning on the window
 * before, 20 new tokens per window; every segment's ids in order. */
static int32_t *decode_like_generate(struct transcriber *t, const float *mel, const char *lang,
                                     enum transcribe_task task, int max_new, int *n,
                                     int32_t *lang_token)
{
    struct transcribe_options o = {.language = lang, .task = task, .no_fallback = true,
                                   .no_previous_text = true, .max_new_tokens = max_new};
    struct transcribe_result r;
    struct err err = {0};
    cr_assert_eq(transcriber_run_mel(t, mel, AUDIO_WINDOW_FRAMES, &o, &r, &err), 0, "%s",
                 err.msg);
    int total = 0;
    for (int i = 0; i < r.n_segments; i++)
        total += r.segments[i].n_tokens;
    int32_t *ids = malloc((size_t)(total ? total : 1) * sizeof *ids);
    *n = 0;
    for (int i = 0; i < r.n_segments; i++)
        for (int k = 0; k < r.segments[i].n_tokens; k++)
            ids[(*n)++] = r.segments[i].tokens[k];
    *lang_token = r.language_token;
    transcribe_result_free(&r);
    return ids;
}

static void assert_ids_equal(const char *preset, const char *what, const int32_t *got, int n_got,
                             const int32_t *want, int n_want)
{
    for (int i = 0; i < n_got && i < n_want; i++)
        cr_assert_eq(got[i], want[i], "%s %s: id %d is %d, transformers' %d", preset, what, i,
                     got[i], want[i]);
    cr_assert_eq(n_got, n_want, "%s %s: %d ids, transformers' %d", preset, what, n_got, n_want);
}

/* Greedy transcription (language en), translation (language de) and language detection on the
 * whisper-tiny and whisper-base shapes equal transformers' generate() and detect_language().
 * The goldens hold only the generated ids: whisper-tiny's 40 are two windows of 20, since its
 * first window ends in timestamp pairs (<|21.18|>, which <|notimestamps|> does not forbid) and
 * generate() seeks there and decodes the rest of the 3000 padded frames again. */
Test(whisper_goldens, generate_translate_and_language_match_transformers_when_goldens_exist,
     .timeout = 600)
{
    static const char *const presets[] = {"whisper-tiny", "whisper-base"};
    int checked = 0;
    for (int p = 0; p < 2; p++) {
        int n_gen, n_tr, n_lang;
        int32_t *gen = golden_ids(presets[p], "generate", &n_gen),
                *tr = golden_ids(presets[p], "translate", &n_tr),
                *lang = golden_ids(presets[p], "lang", &n_lang);
        if (!gen || !tr || !lang) {
            free(gen), free(tr), free(lang);
            continue;
        }
        cr_assert_eq(n_lang, 1);
        struct audio_mel front;
        cr_assert_eq(audio_mel_init(80, &front, &(struct err){0}), 0);
        size_t n_clip;
        float *clip = golden_clip(&n_clip), *mel = malloc(80 * AUDIO_WINDOW_FRAMES * sizeof *mel);
        audio_mel_window(&front, clip, n_clip, mel, NULL);
        free(clip);
        audio_mel_free(&front);
        char *dir = test_mkdtemp();
        struct err err = {0};
        struct transcriber *t;
        struct backend *be = cpu();
        cr_assert_eq(mkwhisper_write(presets[p], 1, dir, &err), 0, "%s", err.msg);
        cr_assert_eq(transcriber_create(dir, be, &t, &err), 0, "%s", err.msg);
        int n;
        int32_t tok;
        int32_t *ids = decode_like_generate(t, mel, "en", TRANSCRIBE_TASK_TRANSCRIBE, 20, &n, &tok);
        assert_ids_equal(presets[p], "generate", ids, n, gen, n_gen);
        free(ids);
        ids = decode_like_generate(t, mel, "de", TRANSCRIBE_TASK_TRANSLATE, 20, &n, &tok);
        assert_ids_equal(presets[p], "translate", ids, n, tr, n_tr);
        free(ids);
        ids = decode_like_generate(t, mel, NULL, TRANSCRIBE_TASK_TRANSCRIBE, 1, &n, &tok);
        cr_assert_eq(tok, lang[0], "%s: detected language token %d, transformers' %d",
                     presets[p], tok, lang[0]);
        free(ids);
        transcriber_free(t);
        backend_destroy(be);
        test_rmtree(dir);
        free(dir);
        free(mel);
        free(gen), free(tr), free(lang);
        checked++;
    }
    if (!checked)
        cr_skip_test("whisper generate goldens absent: run tests/goldens/whisper/make_goldens.py");
}

/* A clip with some structure: tones that change every half second. */
static float *tone_clip(size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = 0.3f * sinf(2 * (float)M_PI * (220.0f + (float)(i / 8000) * 70.0f) * i / 16000);
    return x;
}

static struct transcriber *test_transcriber(const char *dir)
{
    struct transcriber *t;
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-test", 1, dir, &err), 0, "%s", err.msg);
    cr_assert_eq(transcriber_create(dir, cpu(), &t, &err), 0, "%s", err.msg);
    return t;
}

/* The decoder's sequences: one token per sequence equals that sequence fed alone, and
 * selecting sources copies their caches. */
Test(whisper_model, sequences_decode_as_separate_decoders_and_select_copies_caches)
{
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-test", 1, dir, &err), 0, "%s", err.msg);
    struct backend *be = cpu();
    struct whisper_model *m;
    struct whisper_state *st;
    cr_assert_eq(whisper_load(dir, be, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_state_create(m, &st, &err), 0, "%s", err.msg);
    float *mel = calloc(80 * AUDIO_WINDOW_FRAMES, sizeof *mel);
    for (int i = 0; i < 80 * AUDIO_WINDOW_FRAMES; i++)
        mel[i] = cosf((float)i * 0.002f);
    cr_assert_eq(whisper_encode(st, mel, &err), 0, "%s", err.msg);
    int vocab = m->config.vocab_size;
    int32_t prompt[] = {257, 258, 359, 363}, a = 70, b = 80;
    float *ref_a = malloc(vocab * sizeof(float)), *ref_b = malloc(vocab * sizeof(float));
    float *rows = malloc(3 * (size_t)vocab * sizeof(float));
    /* references: one sequence at a time */
    cr_assert_eq(whisper_decode(st, prompt, 4, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_decode(st, &a, 1, ref_a, &err), 0);
    whisper_rewind(st, 4);
    cr_assert_eq(whisper_decode(st, &b, 1, ref_b, &err), 0);
    /* three sequences after the same prompt */
    cr_assert_eq(whisper_state_reserve(st, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_state_reserve(st, WHISPER_MAX_SEQS + 1, &err), -INFERD_EINVAL);
    cr_assert_eq(whisper_state_reserve(st, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_decode(st, prompt, 4, NULL, &err), 0, "%s", err.msg);
    int zero[3] = {0, 0, 0};
    cr_assert_eq(whisper_seqs_select(st, zero, 3, &err), 0, "%s", err.msg);
    int32_t toks[3] = {a, b, a};
    cr_assert_eq(whisper_decode_seqs(st, toks, 3, rows, &err), 0, "%s", err.msg);
    for (int i = 0; i < vocab; i++) {
        cr_assert_float_eq(rows[i], ref_a[i], 1e-4f);
        cr_assert_float_eq(rows[vocab + i], ref_b[i], 1e-4f);
        cr_assert_float_eq(rows[2 * (size_t)vocab + i], ref_a[i], 1e-4f);
    }
    /* sequence 0 takes sequence 1's history: its next step is the b-history's */
    float *ref_c = malloc(vocab * sizeof(float));
    int32_t nxt[2] = {90, 90};
    whisper_state_reserve(st, 1, &err);
    cr_assert_eq(whisper_decode(st, prompt, 4, NULL, &err), 0);
    cr_assert_eq(whisper_decode(st, &b, 1, NULL, &err), 0);
    cr_assert_eq(whisper_decode(st, &nxt[0], 1, ref_c, &err), 0);
    cr_assert_eq(whisper_state_reserve(st, 3, &err), 0);
    cr_assert_eq(whisper_decode(st, prompt, 4, NULL, &err), 0);
    cr_assert_eq(whisper_seqs_select(st, zero, 3, &err), 0);
    cr_assert_eq(whisper_decode_seqs(st, toks, 3, rows, &err), 0);
    int src[2] = {1, 1};
    cr_assert_eq(whisper_seqs_select(st, src, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(whisper_decode_seqs(st, nxt, 2, rows, &err), 0);
    for (int i = 0; i < vocab; i++) {
        cr_assert_float_eq(rows[i], ref_c[i], 1e-4f);
        cr_assert_float_eq(rows[vocab + i], ref_c[i], 1e-4f);
    }
    int bad[1] = {5};
    cr_assert_eq(whisper_seqs_select(st, bad, 1, &err), -INFERD_EINVAL);
    free(ref_a), free(ref_b), free(ref_c), free(rows), free(mel);
    whisper_state_free(st);
    whisper_free(m);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

static double window_score(const struct transcribe_result *r)
{
    /* one window: every segment carries its mean log probability (sum / (tokens + 1)) */
    return r->n_segments ? r->segments[0].avg_logprob : 0;
}

Test(transcribe, beam_of_one_equals_greedy_and_a_wider_beam_scores_at_least_as_well)
{
    char *dir = test_mkdtemp();
    struct transcriber *t = test_transcriber(dir);
    struct err err = {0};
    size_t n = 16000 * 3;
    float *x = tone_clip(n);
    struct transcribe_options o = {.language = "en", .timestamps = false};
    struct transcribe_result g, b1, b4;
    cr_assert_eq(transcriber_run(t, x, n, &o, &g, &err), 0, "%s", err.msg);
    o.beam_size = 1;
    cr_assert_eq(transcriber_run(t, x, n, &o, &b1, &err), 0, "%s", err.msg);
    cr_assert_str_eq(b1.text, g.text);
    o.beam_size = 4;
    cr_assert_eq(transcriber_run(t, x, n, &o, &b4, &err), 0, "%s", err.msg);
    cr_assert_geq(window_score(&b4), window_score(&g) - 1e-6, "beam 4 %g < greedy %g",
                  window_score(&b4), window_score(&g));
    o.beam_size = WHISPER_MAX_SEQS + 1;
    struct transcribe_result bad;
    cr_assert_eq(transcriber_run(t, x, n, &o, &bad, &err), -INFERD_EINVAL);
    transcribe_result_free(&g);
    transcribe_result_free(&b1);
    transcribe_result_free(&b4);
    free(x);
    transcriber_free(t);
    test_rmtree(dir);
    free(dir);
}

struct progress_log {
    int segments, progress;
    double last_done, total;
    int stop_after;
};

static int log_segment(void *ctx, const struct transcribe_segment *seg)
{
    struct progress_log *p = ctx;
    cr_assert_leq(seg->start, seg->end);
    return ++p->segments == p->stop_after;
}

static int log_progress(void *ctx, double done, double total)
{
    struct progress_log *p = ctx;
    cr_assert_geq(done, p->last_done);
    p->last_done = done;
    p->total = total;
    p->progress++;
    return 0;
}

Test(transcribe, no_speech_probability_progress_and_cancel)
{
    char *dir = test_mkdtemp();
    struct transcriber *t = test_transcriber(dir);
    struct err err = {0};
    size_t n = 16000 * 31; /* two windows */
    float *x = tone_clip(n);
    struct progress_log log = {0};
    struct transcribe_options o = {.language = "en", .timestamps = true, .on_segment = log_segment,
                                   .on_progress = log_progress, .ctx = &log};
    struct transcribe_result r;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    cr_assert_geq(log.progress, 2);
    cr_assert_float_eq(log.last_done, 31.0, 1e-6);
    cr_assert_float_eq(log.total, 31.0, 1e-6);
    cr_assert_eq(log.segments, r.n_segments);
    for (int i = 0; i < r.n_segments; i++)
        cr_assert(r.segments[i].no_speech_prob > 0 && r.segments[i].no_speech_prob < 1);
    /* a threshold below every window's no-speech probability skips the windows whose mean log
     * probability is low; one above them all skips none */
    transcribe_result_free(&r);
    log = (struct progress_log){0};
    o.no_speech_threshold = 1e-9f;
    o.on_segment = NULL;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    int kept = r.n_segments;
    transcribe_result_free(&r);
    o.no_speech_threshold = 0.999999f;
    log = (struct progress_log){0};
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    cr_assert_geq(r.n_segments, kept);
    transcribe_result_free(&r);
    /* the segment callback's non-zero return stops the transcription */
    log = (struct progress_log){.stop_after = 1};
    o.no_speech_threshold = 0;
    o.on_segment = log_segment;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), -INFERD_EIO);
    cr_assert_eq(log.segments, 1);
    free(x);
    transcriber_free(t);
    test_rmtree(dir);
    free(dir);
}

/* ---- word timestamps --------------------------------------------------------------------- */

/* The reference: timing.py transcribed as plainly as possible (full matrices, a sort per
 * median, the DTW with its trace, the path walked back into a list). */
static void reference_align(const float *scores, int H, int R, int F, int first, int T, int *jump)
{
    double *w = malloc((size_t)H * R * F * sizeof *w);
    for (int h = 0; h < H; h++)
        for (int r = 0; r < R; r++) {
            const float *x = scores + ((size_t)h * R + r) * F;
            double mx = -INFINITY, sum = 0;
            for (int f = 0; f < F; f++)
                mx = fmax(mx, x[f]);
            for (int f = 0; f < F; f++)
                sum += exp(x[f] - mx);
            for (int f = 0; f < F; f++)
                w[((size_t)h * R + r) * F + f] = exp(x[f] - mx) / sum;
        }
    for (int h = 0; h < H; h++)
        for (int f = 0; f < F; f++) {
            double mean = 0, var = 0;
            for (int r = 0; r < R; r++)
                mean += w[((size_t)h * R + r) * F + f] / R;
            for (int r = 0; r < R; r++)
                var += pow(w[((size_t)h * R + r) * F + f] - mean, 2) / R;
            for (int r = 0; r < R; r++)
                w[((size_t)h * R + r) * F + f] = (w[((size_t)h * R + r) * F + f] - mean) / sqrt(var);
        }
    double *m = calloc((size_t)T * F, sizeof *m);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int f = 0; f < F; f++) {
                double win[7];
                for (int j = 0; j < 7; j++) {
                    int i = f + j - 3;
                    i = i < 0 ? -i : i >= F ? 2 * (F - 1) - i : i;
                    win[j] = w[((size_t)h * R + first + t) * F + i];
                }
                for (int a = 0; a < 7; a++) /* insertion sort */
                    for (int b = a; b > 0 && win[b] < win[b - 1]; b--) {
                        double s = win[b];
                        win[b] = win[b - 1];
                        win[b - 1] = s;
                    }
                m[(size_t)t * F + f] += win[3] / H;
            }
    double *cost = malloc((size_t)(T + 1) * (F + 1) * sizeof *cost);
    int *trace = malloc((size_t)(T + 1) * (F + 1) * sizeof *trace);
    for (int i = 0; i <= T; i++)
        for (int j = 0; j <= F; j++)
            cost[i * (F + 1) + j] = INFINITY, trace[i * (F + 1) + j] = -1;
    cost[0] = 0;
    for (int j = 1; j <= F; j++)
        for (int i = 1; i <= T; i++) {
            double c0 = cost[(i - 1) * (F + 1) + j - 1], c1 = cost[(i - 1) * (F + 1) + j],
                   c2 = cost[i * (F + 1) + j - 1], c;
            int tr;
            if (c0 < c1 && c0 < c2)
                c = c0, tr = 0;
            else if (c1 < c0 && c1 < c2)
                c = c1, tr = 1;
            else
                c = c2, tr = 2;
            cost[i * (F + 1) + j] = -m[(size_t)(i - 1) * F + j - 1] + c;
            trace[i * (F + 1) + j] = tr;
        }
    for (int j = 0; j <= F; j++)
        trace[j] = 2;
    for (int i = 0; i <= T; i++)
        trace[i * (F + 1)] = 1;
    int *pi = malloc((size_t)(T + F + 2) * sizeof *pi), *pj = malloc((size_t)(T + F + 2) * sizeof *pj);
    int len = 0, i = T, j = F;
    while (i > 0 || j > 0) {
        pi[len] = i - 1, pj[len] = j - 1, len++;
        int tr = trace[i * (F + 1) + j];
        if (tr == 0)
            i--, j--;
        else if (tr == 1)
            i--;
        else
            j--;
    }
    /* forwards: a jump where the text index changes (and at the start) */
    int prev = -2;
    for (int k = len - 1; k >= 0; k--)
        if (pi[k] != prev) {
            if (pi[k] >= 0)
                jump[pi[k]] = pj[k];
            prev = pi[k];
        }
    free(w), free(m), free(cost), free(trace), free(pi), free(pj);
}

Test(words, alignment_matches_a_plain_transcription_of_timing_py)
{
    enum { H = 3, R = 9, F = 40, FIRST = 2, T = 6 };
    float *scores = malloc((size_t)H * R * F * sizeof *scores);
    uint64_t s = 42;
    /* a diagonal the tokens follow, under noise */
    for (int h = 0; h < H; h++)
        for (int r = 0; r < R; r++)
            for (int f = 0; f < F; f++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                double noise = (double)(s >> 11) * 0x1.0p-53;
                double centre = (r - FIRST + 0.5) * F / (double)T;
                scores[((size_t)h * R + r) * F + f] =
                    (float)(4.0 * exp(-pow(f - centre, 2) / 8.0) + noise);
            }
    int got[T], want[T];
    struct err err = {0};
    cr_assert_eq(transcribe_align(scores, H, R, F, FIRST, T, got, &err), 0, "%s", err.msg);
    reference_align(scores, H, R, F, FIRST, T, want);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(got[t], want[t], "row %d: frame %d, the reference %d", t, got[t], want[t]);
        if (t)
            cr_assert_geq(got[t], got[t - 1]);
    }
    cr_assert_eq(transcribe_align(scores, H, R, F, 5, T, got, &err), -INFERD_EINVAL);
    free(scores);
}

Test(words, word_times_are_monotonic_and_inside_their_segments)
{
    char *dir = test_mkdtemp();
    struct transcriber *t = test_transcriber(dir);
    struct err err = {0};
    size_t n = 16000 * 4;
    float *x = tone_clip(n);
    struct transcribe_options o = {.language = "en", .timestamps = true, .word_timestamps = true};
    struct transcribe_result r;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    int words = 0;
    double last = 0;
    for (int i = 0; i < r.n_segments; i++) {
        const struct transcribe_segment *g = &r.segments[i];
        for (int k = 0; k < g->n_words; k++, words++) {
            const struct transcribe_word *w = &g->words[k];
            cr_assert_not_null(w->text);
            cr_assert_geq(w->start, g->start - 1e-9, "%s", w->text);
            cr_assert_leq(w->end, g->end + 1e-9, "%s", w->text);
            cr_assert_leq(w->start, w->end);
            cr_assert_geq(w->start, last - 1e-9);
            last = w->end;
        }
    }
    cr_assert_gt(words, 0, "no words in %d segments: '%s'", r.n_segments, r.text);
    transcribe_result_free(&r);
    free(x);
    transcriber_free(t);
    test_rmtree(dir);
    free(dir);
}

/* ---- voice activity ------------------------------------------------------------------------ */

/* Speech-like bursts (a modulated tone) in low noise at the given seconds. */
static float *bursts(size_t n, const double (*at)[2], int n_at)
{
    float *x = malloc(n * sizeof *x);
    uint64_t s = 9;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = 0.001f * (float)((double)(s >> 11) * 0x1.0p-53 - 0.5);
        double sec = (double)i / 16000;
        for (int k = 0; k < n_at; k++)
            if (sec >= at[k][0] && sec < at[k][1])
                x[i] += 0.3f * sinf(2 * (float)M_PI * 180.0f * (float)sec) *
                        (0.6f + 0.4f * sinf(2 * (float)M_PI * 4.0f * (float)sec));
    }
    return x;
}

Test(vad, finds_speech_between_silences_and_chunks_at_them)
{
    const double at[][2] = {{1.0, 3.0}, {3.1, 4.0}, {10.0, 12.5}, {40.0, 41.0}, {41.5, 41.6}};
    size_t n = 16000 * 45;
    float *x = bursts(n, at, 5);
    struct audio_vad_options o = {0};
    struct audio_span *sp;
    int ns;
    struct err err = {0};
    cr_assert_eq(audio_vad(x, n, &o, &sp, &ns, &err), 0, "%s", err.msg);
    /* 1-3 and 3.1-4 joined (a 100 ms gap), 10-12.5, 40-41; the 100 ms blip dropped */
    cr_assert_eq(ns, 3, "%d regions", ns);
    cr_assert(fabs(sp[0].start / 16000.0 - 0.9) < 0.05 && fabs(sp[0].end / 16000.0 - 4.1) < 0.05);
    cr_assert(fabs(sp[1].start / 16000.0 - 9.9) < 0.05 && fabs(sp[1].end / 16000.0 - 12.6) < 0.05);
    cr_assert(fabs(sp[2].start / 16000.0 - 39.9) < 0.05);
    free(sp);
    /* trimmed chunks: speech only, within 30 s; tiled: the whole audio, cut inside silences */
    o.trim = true;
    cr_assert_eq(audio_vad_chunks(x, n, &o, AUDIO_WINDOW_SAMPLES, &sp, &ns, &err), 0);
    cr_assert_eq(ns, 2);
    cr_assert(sp[0].start >= 14000 && sp[0].end <= 16000 * 13);
    cr_assert(sp[1].start >= 16000 * 39);
    free(sp);
    o.trim = false;
    cr_assert_eq(audio_vad_chunks(x, n, &o, AUDIO_WINDOW_SAMPLES, &sp, &ns, &err), 0);
    cr_assert_eq(ns, 2);
    cr_assert_eq(sp[0].start, 0);
    cr_assert_eq(sp[0].end, sp[1].start);
    cr_assert_eq(sp[1].end, n);
    cr_assert(sp[0].end > 16000 * 13 && sp[0].end < 16000 * 39, "cut at %zu", sp[0].end);
    free(sp);
    /* silence alone: nothing to transcribe when trimming */
    memset(x, 0, n * sizeof *x);
    o.trim = true;
    cr_assert_eq(audio_vad_chunks(x, n, &o, AUDIO_WINDOW_SAMPLES, &sp, &ns, &err), 0);
    cr_assert_eq(ns, 0);
    free(sp);
    free(x);
}

Test(vad, transcription_with_vad_places_segments_in_the_speech)
{
    char *dir = test_mkdtemp();
    struct transcriber *t = test_transcriber(dir);
    const double at[][2] = {{2.0, 4.0}, {33.0, 35.0}};
    size_t n = 16000 * 36;
    float *x = bursts(n, at, 2);
    struct err err = {0};
    struct transcribe_options o = {.language = "en", .timestamps = true,
                                   .vad = {.on = true, .trim = true}};
    struct transcribe_result r;
    cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
    for (int i = 0; i < r.n_segments; i++) {
        double s = r.segments[i].start;
        cr_assert((s >= 1.8 && s <= 4.2) || (s >= 32.8 && s <= 35.2), "segment at %g", s);
    }
    transcribe_result_free(&r);
    free(x);
    transcriber_free(t);
    test_rmtree(dir);
    free(dir);
}
