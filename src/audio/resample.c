/* audio/resample.c — sample-rate conversion by a tabulated Kaiser-windowed sinc (band-limited, any ratio). */
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
    for (size_t j = 0; j < n; j++) {
        double t = (double)j * step;
        long lo = (long)ceil(t - reach), hi = (long)floor(t + reach);
        if (lo < 0)
            lo = 0;
        if (hi > (long)n_in - 1)
            hi = (long)n_in - 1;
        double acc = 0;
        for (long i = lo; i <= hi; i++) {
            double pos = fabs(((double)i - t) * fc) * PHASES;
            long k = (long)pos;
            if (k >= table_len - 1)
                continue;
            double frac = pos - (double)k;
            acc += in[i] * (table[k] + (table[k + 1] - table[k]) * frac);
        }
        y[j] = (float)(acc * fc);
    }
    free(table);
    *out = y;
    *n_out = n;
    return 0;
}
