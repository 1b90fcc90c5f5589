/* audio/resample.c — sample-rate conversion to Whisper's rate through libsamplerate's band-limited sinc converter. */
#include <limits.h>
#include <math.h>
#include <samplerate.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

/* 90% of the lower rate's Nyquist band passed (7.2 kHz of Whisper's 8), 121 dB
 * of stopband: the converter's middle setting, about 3.5 times the speed of its
 * best one (145 dB, 97%) for a band the log-mel filters barely weigh. */
#define CONVERTER SRC_SINC_MEDIUM_QUALITY

int audio_resample(const float *in, size_t n_in, int rate_in, int rate_out, float **out,
                   size_t *n_out, struct err *err)
{
    *out = NULL;
    *n_out = 0;
    if (rate_in <= 0 || rate_out <= 0)
        return err_set(err, INFERD_EINVAL, "resampling from %d Hz to %d Hz", rate_in, rate_out);
    double ratio = (double)rate_out / rate_in;
    if (!src_is_valid_ratio(ratio))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "resampling from %d Hz to %d Hz: a ratio past libsamplerate's 1/256 to 256",
                       rate_in, rate_out);
    if (n_in > (size_t)(LONG_MAX / 256))
        return err_set(err, INFERD_ERANGE, "%zu samples are too many to resample", n_in);
    size_t cap = (size_t)ceil((double)n_in * ratio) + 1;
    float *y = malloc(cap * sizeof *y);
    if (!y)
        return err_set(err, INFERD_ENOMEM, "out of memory resampling %zu samples", n_in);
    if (rate_in == rate_out || n_in == 0) {
        if (n_in)
            memcpy(y, in, n_in * sizeof *y);
        *out = y;
        *n_out = n_in;
        return 0;
    }
    SRC_DATA d = {.data_in = in, .data_out = y, .input_frames = (long)n_in,
                  .output_frames = (long)cap, .end_of_input = 1, .src_ratio = ratio};
    int e = src_simple(&d, CONVERTER, 1);
    if (e) {
        free(y);
        return err_set(err, INFERD_EINVAL, "resampling from %d Hz to %d Hz: %s", rate_in,
                       rate_out, src_strerror(e));
    }
    *out = y;
    *n_out = (size_t)d.output_frames_gen;
    return 0;
}
