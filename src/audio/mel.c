/* audio/mel.c — Whisper's log-mel spectrogram, step for step as transformers' WhisperFeatureExtractor (numpy path) computes it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "base/threadpool.h"

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
    out->band = malloc((size_t)n_mels * 2 * sizeof *out->band);
    out->window = malloc(AUDIO_N_FFT * sizeof *out->window);
    out->twiddle = malloc((size_t)AUDIO_N_FFT * 2 * sizeof *out->twiddle);
    double *mel_hz = malloc((size_t)(n_mels + 2) * sizeof *mel_hz);
    if (!out->filters || !out->band || !out->window || !out->twiddle || !mel_hz) {
        free(mel_hz);
        audio_mel_free(out);
        return err_set(err, INFERD_ENOMEM, "out of memory for %d mel filters", n_mels);
    }
    /* periodic Hann: np.hanning(401)[:-1] */
    for (int i = 0; i < AUDIO_N_FFT; i++)
        out->window[i] = 0.5 - 0.5 * cos(2.0 * M_PI * i / AUDIO_N_FFT);
    for (int k = 0; k < AUDIO_N_FFT; k++) {
        double a = 2.0 * M_PI * k / AUDIO_N_FFT;
        out->twiddle[2 * k] = cos(a);
        out->twiddle[2 * k + 1] = -sin(a);
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
        int first = N_FREQS, last = -1;
        for (int k = 0; k < N_FREQS; k++)
            if (out->filters[(size_t)m * N_FREQS + k] != 0) {
                first = first < k ? first : k;
                last = k;
            }
        out->band[2 * m] = first;
        out->band[2 * m + 1] = last;
    }
    free(mel_hz);
    return 0;
}

void audio_mel_free(struct audio_mel *m)
{
    free(m->filters);
    free(m->band);
    free(m->window);
    free(m->twiddle);
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

/* The radices of AUDIO_N_FFT (400 = 4 * 4 * 5 * 5), largest sub-transforms first. */
static const int fft_radix[] = {4, 4, 5, 5, 1};

/* x (n complex values, re/im pairs, stride apart) to its DFT in out (n values, contiguous),
 * n dividing AUDIO_N_FFT: decimation in time over radix[0], each output a radix-point DFT of
 * the sub-transforms' values times the roots of unity (tw: the AUDIO_N_FFT roots). */
static void fft(const double *x, long stride, double *out, int n, const int *radix, const double *tw)
{
    if (n == 1) {
        out[0] = x[0];
        out[1] = x[1];
        return;
    }
    const int p = radix[0], m = n / p, step = AUDIO_N_FFT / n;
    for (int r = 0; r < p; r++)
        fft(x + 2 * r * stride, stride * p, out + 2 * r * m, m, radix + 1, tw);
    for (int k = 0; k < m; k++) {
        double yr[5], yi[5];
        for (int r = 0; r < p; r++) { /* Y_r[k] * W_n^(r k) */
            const double *w = tw + 2 * ((r * k * step) % AUDIO_N_FFT);
            double ar = out[2 * (r * m + k)], ai = out[2 * (r * m + k) + 1];
            yr[r] = ar * w[0] - ai * w[1];
            yi[r] = ar * w[1] + ai * w[0];
        }
        for (int q = 0; q < p; q++) { /* X[k + q m] = sum_r Y_r W_p^(r q) */
            double sr = 0, si = 0;
            for (int r = 0; r < p; r++) {
                const double *w = tw + 2 * ((r * q % p) * (AUDIO_N_FFT / p));
                sr += yr[r] * w[0] - yi[r] * w[1];
                si += yr[r] * w[1] + yi[r] * w[0];
            }
            out[2 * (k + q * m)] = sr;
            out[2 * (k + q * m) + 1] = si;
        }
    }
}

struct mel_job {
    const struct audio_mel *m;
    const float *samples;
    size_t n;
    float *out;
    float *vmax; /* one per thread */
};

/* Whether frame t reads only zeros: all of its samples lie at or past the audio's end and
 * before the window's end (none reflected back into the audio). */
static bool frame_past_audio(long start, size_t n)
{
    return start >= 0 && (size_t)start >= n && start + AUDIO_N_FFT <= AUDIO_WINDOW_SAMPLES;
}

/* Frames [begin, end) of the window for thread ith: log10 of each mel band's energy. */
static void mel_frames(void *ctx, int ith, int nth)
{
    const struct mel_job *j = ctx;
    const struct audio_mel *m = j->m;
    long begin, end;
    threadpool_split(AUDIO_WINDOW_FRAMES, ith, nth, 1, &begin, &end);
    double buf[2 * AUDIO_N_FFT], spec[2 * AUDIO_N_FFT], power[N_FREQS];
    float vmax = -INFINITY;
    const float silent_v = (float)log10(MEL_FLOOR);
    for (long t = begin; t < end; t++) {
        long start = t * AUDIO_HOP - AUDIO_N_FFT / 2;
        bool silent = frame_past_audio(start, j->n);
        if (!silent) {
            silent = true;
            for (int i = 0; i < AUDIO_N_FFT; i++) {
                buf[2 * i] = (double)padded_sample(j->samples, j->n, start + i) * m->window[i];
                buf[2 * i + 1] = 0;
                silent &= buf[2 * i] == 0.0;
            }
        }
        if (silent) { /* every power 0: every bin at the floor */
            for (int b = 0; b < m->n_mels; b++)
                j->out[(size_t)b * AUDIO_WINDOW_FRAMES + t] = silent_v;
            vmax = vmax > silent_v ? vmax : silent_v;
            continue;
        }
        fft(buf, 1, spec, AUDIO_N_FFT, fft_radix, m->twiddle);
        for (int k = 0; k < N_FREQS; k++)
            power[k] = spec[2 * k] * spec[2 * k] + spec[2 * k + 1] * spec[2 * k + 1];
        for (int b = 0; b < m->n_mels; b++) {
            const double *f = m->filters + (size_t)b * N_FREQS;
            double e = 0;
            for (int k = m->band[2 * b]; k <= m->band[2 * b + 1]; k++) /* the rest are zeros */
                e += f[k] * power[k];
            float v = (float)log10(e > MEL_FLOOR ? e : MEL_FLOOR);
            j->out[(size_t)b * AUDIO_WINDOW_FRAMES + t] = v;
            if (v > vmax)
                vmax = v;
        }
    }
    j->vmax[ith] = vmax;
}

void audio_mel_window(const struct audio_mel *m, const float *samples, size_t n, float *out,
                      struct threadpool *pool)
{
    if (n > AUDIO_WINDOW_SAMPLES)
        n = AUDIO_WINDOW_SAMPLES;
    enum { MAX_THREADS = 256 };
    float vmaxes[MAX_THREADS];
    struct mel_job job = {m, samples, n, out, vmaxes};
    int nth = 1;
    if (pool && threadpool_size(pool) <= MAX_THREADS) {
        nth = threadpool_size(pool);
        threadpool_run(pool, mel_frames, &job);
    } else {
        mel_frames(&job, 0, 1);
    }
    float vmax = -INFINITY;
    for (int i = 0; i < nth; i++)
        vmax = vmaxes[i] > vmax ? vmaxes[i] : vmax;
    float floor_v = vmax - 8.0f;
    size_t total = (size_t)m->n_mels * AUDIO_WINDOW_FRAMES;
    for (size_t i = 0; i < total; i++) {
        float v = out[i] > floor_v ? out[i] : floor_v;
        out[i] = (v + 4.0f) / 4.0f;
    }
}
