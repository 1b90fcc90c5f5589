/* fuzz/fuzz_audio.c — libFuzzer target: the audio upload decoder (WAV, and libsndfile's containers where built) and the resampler on what it yields; the transcription request parser (JSON bodies with base64 audio, multipart forms) and the session chunk decoder, chosen by the first byte. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "api/audio.h"
#include "audio/audio.h"

static void decode_audio(const uint8_t *data, size_t size)
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
        if (audio_resample(p.samples, n, p.sample_rate, AUDIO_SAMPLE_RATE, 1, &y, &m, &err) == 0)
            free(y);
        audio_pcm_free(&p);
    } else if (err.msg[0] == '\0') {
        __builtin_trap();
    }
}

static void parse_request(const char *type, const uint8_t *data, size_t size)
{
    struct audio_request r;
    struct api_error e = {0};
    if (audio_request_parse(type, (const char *)data, size, size & 1, 1 << 20, 1, &r, &e) == 0) {
        if ((r.file_len && !r.file) || r.o.beam_size < 1 || r.o.beam_size > 16 ||
            r.o.n_vocabulary > AUDIO_MAX_VOCABULARY_TERMS)
            __builtin_trap();
        for (int i = 0; i < r.o.n_vocabulary; i++)
            if (!r.o.vocabulary[i][0])
                __builtin_trap();
        audio_request_free(&r);
    } else if (e.status < 400 || !e.message[0]) {
        __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    /* 1, 2, 3 start no audio container, so the seed files stay the decoder's */
    switch (data[0]) {
    case 1:
        parse_request("application/json", data + 1, size - 1);
        return 0;
    case 2:
        parse_request("multipart/form-data; boundary=XyZ", data + 1, size - 1);
        return 0;
    case 3: {
        struct audio_pcm p;
        struct api_error e = {0};
        if (audio_chunk_decode(data[1 % size] & 1 ? "audio/pcm" : "application/octet-stream",
                               data + 1, size - 1, 2, &p, &e) == 0)
            audio_pcm_free(&p);
        else if (e.status < 400 || !e.message[0])
            __builtin_trap();
        return 0;
    }
    default:
        decode_audio(data, size); /* the whole input: the seed corpus is plain audio files */
        return 0;
    }
}
