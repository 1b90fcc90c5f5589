/* audio/resample.c — sample-rate conversion by a tabulated Kaiser-windowed sinc (band-limited, any ratio; a polyphase table of taps where the ratio reduces to few phases). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

#define ZERO_CROSSINGS 32 /* kernel half-width, in periods of the lower Nyquist */
#define PHASES 256        /* kernel samples per input sample (at cutoff 1) */
#define KAISER_BETA 8.6
#define CUTOFF 0.95       /* of the lower of the two Nyquist frequencies */

/* I0, the modified Bessel function of order 0, by its power series. */
static double bessel_i0(double x)
{
    double sum = 1, term = 1, q = x * x / 4;
    for (int k = 1; k < 64; k++) {
        term *= q / ((double)k * k);
        sum += term;
        if (term < sum * 1e-17)
            break;
    }
    return sum;
}

/* The tabulated kernel at u = |fc * t| (linear between table entries; 0 past the last). */
static double kernel_at(const double *table, int table_len, double u)
{
    double pos = u * PHASES;
    long k = (long)pos;
    if (k >= table_len - 1)
        return 0;
    double frac = pos - (double)k;
    return table[k] + (table[k + 1] - table[k]) * frac;
}

static long gcd_long(long a, long b)
{
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Where rate_out / rate_in reduces to up / down with up <= MAX_POLYPHASE, output j sits at
 * input position j * down / up: phase (j * down) % up of up distinct offsets. Each phase's
 * taps (the same kernel values the direct loop computes) are tabulated once, so an output
 * costs one dot product. Returns 0, or -1 when the ratio has too many phases or the table
 * does not fit in memory (the caller then evaluates the kernel per tap). */
#define MAX_POLYPHASE 4096
static int resample_polyphase(const float *in, size_t n_in, int rate_in, int rate_out,
                              const double *table, int table_len, double fc, double reach,
                              float *y, size_t n)
{
    long g = gcd_long(rate_in, rate_out), up = rate_out / g, down = rate_in / g;
    if (up > MAX_POLYPHASE)
        return -1;
    long r = (long)ceil(reach) + 1, width = 2 * r + 1; /* taps d = -r .. r around the base */
    double *taps = malloc((size_t)up * (size_t)width * sizeof *taps);
    if (!taps)
        return -1;
    for (long ph = 0; ph < up; ph++)
        for (long d = -r; d <= r; d++)
            taps[ph * width + d + r] =
                kernel_at(table, table_len, fabs(((double)d - (double)ph / up) * fc)) * fc;
    for (size_t j = 0; j < n; j++) {
        unsigned long long pos = (unsigned long long)j * (unsigned long long)down;
        long base = (long)(pos / (unsigned long long)up), ph = (long)(pos % (unsigned long long)up);
        const double *w = taps + ph * width;
        long first = base - r;
        double acc[4] = {0, 0, 0, 0};
        if (first >= 0 && first + width <= (long)n_in) {
            const float *x = in + first;
            long k = 0;
            for (; k + 4 <= width; k += 4)
                for (int l = 0; l < 4; l++)
                    acc[l] += x[k + l] * w[k + l];
            for (; k < width; k++)
                acc[0] += x[k] * w[k];
        } else { /* near an edge: the taps outside the input are left out */
            for (long k = 0; k < width; k++)
                if (first + k >= 0 && first + k < (long)n_in)
                    acc[0] += in[first + k] * w[k];
        }
        y[j] = (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
    free(taps);
    return 0;
}

int audio_resample(const float *in, size_t n_in, int rate_in, int rate_out, float **out,
                   size_t *n_out, struct err *err)
{
    *out = NULL;
    *n_out = 0;
    if (rate_in <= 0 || rate_out <= 0)
        return err_set(err, INFERD_EINVAL, "resampling from %d Hz to %d Hz", rate_in, rate_out);
    size_t n = (size_t)(((unsigned __int128)n_in * (unsigned)rate_out + (unsigned)rate_in - 1) /
                        (unsigned)rate_in);
    float *y = malloc((n ? n : 1) * sizeof *y);
    if (!y)
        return err_set(err, INFERD_ENOMEM, "out of memory resampling %zu samples", n_in);
    if (rate_in == rate_out) {
        if (n_in)
            memcpy(y, in, n_in * sizeof *y);
        *out = y;
        *n_out = n_in;
        return 0;
    }
    /* In input-sample units the kernel is fc * sinc(fc * t) with fc the
     * cutoff over the input rate's Nyquist; it reaches ZERO_CROSSINGS / fc
     * samples to each side. Tabulated over u = fc * t in [0, ZERO_CROSSINGS]. */
    double fc = CUTOFF * (rate_out < rate_in ? (double)rate_out / rate_in : 1.0);
    int table_len = ZERO_CROSSINGS * PHASES + 2;
    double *table = malloc((size_t)table_len * sizeof *table);
    if (!table) {
        free(y);
        return err_set(err, INFERD_ENOMEM, "out of memory for the resampling kernel");
    }
    double i0b = bessel_i0(KAISER_BETA);
    for (int i = 0; i < table_len; i++) {
        double u = (double)i / PHASES, r = u / ZERO_CROSSINGS;
        double sinc = u == 0 ? 1 : sin(M_PI * u) / (M_PI * u);
        table[i] = r >= 1 ? 0 : sinc * bessel_i0(KAISER_BETA * sqrt(1 - r * r)) / i0b;
    }
    double step = (double)rate_in / rate_out, reach = ZERO_CROSSINGS / fc;
    if (resample_polyphase(in, n_in, rate_in, rate_out, table, table_len, fc, reach, y, n) == 0) {
        free(table);
        *out = y;
        *n_out = n;
        return 0;
    }
    for (size_t j = 0; j < n; j++) {
        double t = (double)j * step;
        long lo = (long)ceil(t - reach), hi = (long)floor(t + reach);
        if (lo < 0)
            lo = 0;
        if (hi > (long)n_in - 1)
            hi = (long)n_in - 1;
        double acc = 0;
        for (long i = lo; i <= hi; i++)
            acc += in[i] * kernel_at(table, table_len, fabs(((double)i - t) * fc));
        y[j] = (float)(acc * fc);
    }
    free(table);
    *out = y;
    *n_out = n;
    return 0;
}
