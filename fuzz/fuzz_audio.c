/* fuzz/fuzz_audio.c — libFuzzer target: the audio upload decoder (WAV, and libsndfile's containers where built) and the resampler on what it yields. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "audio/audio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct audio_pcm p;
    struct err err = {0};
    int rc = audio_decode(data, size, &p, &err);
    if (rc == 0) {
        if (p.n == 0 || !p.samples || p.sample_rate < 1000 || p.sample_rate > 384000)
            __builtin_trap();
        /* a short prefix through the resampler, so every rate is exercised quickly */
        size_t n = p.n < 4096 ? p.n : 4096;
        float *y;
        size_t m;
        if (audio_resample(p.samples, n, p.sample_rate, AUDIO_SAMPLE_RATE, &y, &m, &err) == 0)
            free(y);
        audio_pcm_free(&p);
    } else if (err.msg[0] == '\0') {
        __builtin_trap();
    }
    return 0;
}
