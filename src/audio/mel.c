/* audio/mel.c — Whisper's log-mel spectrogram, step for step as transformers' WhisperFeatureExtractor (numpy path) computes it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

#define N_FREQS (AUDIO_N_FFT / 2 + 1)
#define MEL_FLOOR 1e-10

/* The Slaney mel scale (librosa's default, htk=False): linear below 1 kHz,
 * logarithmic above. */
static double hz_to_mel(double hz)
{
    double logstep = 27.0 / log(6.4);
    return hz >= 1000.0 ? 15.0 + log(hz / 1000.0) * logstep : 3.0 * hz / 200.0;
}

static double mel_to_hz(double mel)
{
    double logstep = log(6.4) / 27.0;
    return mel >= 15.0 ? 1000.0 * exp(logstep * (mel - 15.0)) : 200.0 * mel / 3.0;
}

int audio_mel_init(int n_mels, struct audio_mel *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (n_mels < 1 || n_mels > 256)
        return err_set(err, INFERD_EINVAL, "%d mel bins (1 to 256 supported)", n_mels);
    out->n_mels = n_mels;
    out->filters = calloc((size_t)n_mels * N_FREQS, sizeof *out->filters);
    out->window = malloc(AUDIO_N_FFT * sizeof *out->window);
    out->cos_table = malloc((size_t)N_FREQS * AUDIO_N_FFT * sizeof(double));
    out->sin_table = malloc((size_t)N_FREQS * AUDIO_N_FFT * sizeof(double));
    double *mel_hz = malloc((size_t)(n_mels + 2) * sizeof *mel_hz);
    if (!out->filters || !out->window || !out->cos_table || !out->sin_table || !mel_hz) {
        free(mel_hz);
        audio_mel_free(out);
        return err_set(err, INFERD_ENOMEM, "out of memory for %d mel filters", n_mels);
    }
    /* periodic Hann: np.hanning(401)[:-1] */
    for (int i = 0; i < AUDIO_N_FFT; i++)
        out->window[i] = 0.5 - 0.5 * cos(2.0 * M_PI * i / AUDIO_N_FFT);
    for (int k = 0; k < N_FREQS; k++)
        for (int i = 0; i < AUDIO_N_FFT; i++) {
            /* the angle reduced to [0, n_fft) first: k * i grows to 80,000 */
            double a = 2.0 * M_PI * (double)((k * i) % AUDIO_N_FFT) / AUDIO_N_FFT;
            out->cos_table[k * AUDIO_N_FFT + i] = cos(a);
            out->sin_table[k * AUDIO_N_FFT + i] = sin(a);
        }
    /* transformers' mel_filter_bank(201, n_mels, 0, 8000, 16000, norm="slaney",
     * mel_scale="slaney"): centres equally spaced in mel, triangles over the FFT
     * bin frequencies linspace(0, 8000, 201), each scaled by 2 / its width in Hz. */
    double mel_min = hz_to_mel(0.0), mel_max = hz_to_mel(AUDIO_SAMPLE_RATE / 2.0);
    for (int i = 0; i < n_mels + 2; i++)
        mel_hz[i] = mel_to_hz(mel_min + (mel_max - mel_min) * i / (n_mels + 1));
    for (int m = 0; m < n_mels; m++) {
        double lo = mel_hz[m], mid = mel_hz[m + 1], hi = mel_hz[m + 2];
        double enorm = 2.0 / (hi - lo);
        for (int k = 0; k < N_FREQS; k++) {
            double f = (AUDIO_SAMPLE_RATE / 2.0) * k / (N_FREQS - 1);
            double down = (f - lo) / (mid - lo), up = (hi - f) / (hi - mid);
            double w = down < up ? down : up;
            out->filters[(size_t)m * N_FREQS + k] = (w > 0 ? w : 0) * enorm;
        }
    }
    free(mel_hz);
    return 0;
}

void audio_mel_free(struct audio_mel *m)
{
    free(m->filters);
    free(m->window);
    free(m->cos_table);
    free(m->sin_table);
    memset(m, 0, sizeof *m);
}

/* Sample i of the window padded to 30 s and reflected at both ends by n_fft / 2. */
static float padded_sample(const float *s, size_t n, long i)
{
    const long len = AUDIO_WINDOW_SAMPLES;
    if (i < 0)
        i = -i;
    else if (i >= len)
        i = 2 * (len - 1) - i;
    return (size_t)i < n ? s[i] : 0.0f;
}

void audio_mel_window(const struct audio_mel *m, const float *samples, size_t n, float *out)
{
    if (n > AUDIO_WINDOW_SAMPLES)
        n = AUDIO_WINDOW_SAMPLES;
    double buf[AUDIO_N_FFT], power[N_FREQS];
    float vmax = -INFINITY;
    for (int t = 0; t < AUDIO_WINDOW_FRAMES; t++) {
        long start = (long)t * AUDIO_HOP - AUDIO_N_FFT / 2;
        bool silent = true;
        for (int i = 0; i < AUDIO_N_FFT; i++) {
            buf[i] = (double)padded_sample(samples, n, start + i) * m->window[i];
            silent &= buf[i] == 0.0;
        }
        for (int k = 0; k < N_FREQS; k++) {
            double re = 0, im = 0;
            if (!silent) {
                const double *c = m->cos_table + k * AUDIO_N_FFT, *s = m->sin_table + k * AUDIO_N_FFT;
                for (int i = 0; i < AUDIO_N_FFT; i++) {
                    re += buf[i] * c[i];
                    im -= buf[i] * s[i];
                }
            }
            power[k] = re * re + im * im;
        }
        for (int b = 0; b < m->n_mels; b++) {
            const double *f = m->filters + (size_t)b * N_FREQS;
            double e = 0;
            for (int k = 0; k < N_FREQS; k++)
                e += f[k] * power[k];
            float v = (float)log10(e > MEL_FLOOR ? e : MEL_FLOOR);
            out[(size_t)b * AUDIO_WINDOW_FRAMES + t] = v;
            if (v > vmax)
                vmax = v;
        }
    }
    float floor_v = vmax - 8.0f;
    size_t total = (size_t)m->n_mels * AUDIO_WINDOW_FRAMES;
    for (size_t i = 0; i < total; i++) {
        float v = out[i] > floor_v ? out[i] : floor_v;
        out[i] = (v + 4.0f) / 4.0f;
    }
}
