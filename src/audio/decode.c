/* audio/decode.c — any uploaded container to mono 16 kHz samples: WAV by audio/wav.c, the rest (FLAC, OGG, MP3) through libsndfile's virtual I/O over the bytes in memory. */
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

#ifdef INFERD_HAVE_SNDFILE
#include <sndfile.h>

/* The upload as a read-only libsndfile stream. */
struct mem_stream {
    const uint8_t *data;
    sf_count_t len, pos;
};

static sf_count_t mem_length(void *ud) { return ((struct mem_stream *)ud)->len; }

static sf_count_t mem_seek(sf_count_t off, int whence, void *ud)
{
    struct mem_stream *m = ud;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->len;
    sf_count_t to = base + off;
    if (to < 0 || to > m->len)
        return -1;
    m->pos = to;
    return to;
}

static sf_count_t mem_read(void *ptr, sf_count_t count, void *ud)
{
    struct mem_stream *m = ud;
    sf_count_t left = m->len - m->pos;
    if (count > left)
        count = left;
    if (count > 0) {
        memcpy(ptr, m->data + m->pos, (size_t)count);
        m->pos += count;
    }
    return count < 0 ? 0 : count;
}

static sf_count_t mem_write(const void *ptr, sf_count_t count, void *ud) { return 0; }
static sf_count_t mem_tell(void *ud) { return ((struct mem_stream *)ud)->pos; }

/* Frames read per call: the whole file is never assumed to fit one buffer
 * (a container's frame count may lie). */
#define CHUNK_FRAMES 16384
/* The most frames taken from one upload: an hour at 48 kHz (the size limit
 * on the upload comes first for anything honest). */
#define MAX_FRAMES ((sf_count_t)48000 * 3600)

static int sndfile_decode(const uint8_t *data, size_t len, struct audio_pcm *out, struct err *err)
{
    struct mem_stream m = {data, (sf_count_t)len, 0};
    SF_VIRTUAL_IO io = {mem_length, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info = {0};
    SNDFILE *f = sf_open_virtual(&io, SFM_READ, &info, &m);
    if (!f)
        return err_set(err, INFERD_EFORMAT,
                       "not an audio file this server reads (WAV, FLAC, OGG Vorbis/Opus, MP3)");
    int rc = 0;
    if (info.channels < 1 || info.channels > AUDIO_MAX_CHANNELS ||
        info.samplerate < 1000 || info.samplerate > 384000) {
        rc = err_set(err, INFERD_EUNSUPPORTED, "audio of %d channels at %d Hz is not supported",
                     info.channels, info.samplerate);
        goto done;
    }
    float *buf = malloc((size_t)CHUNK_FRAMES * (size_t)info.channels * sizeof *buf);
    float *s = NULL;
    size_t n = 0, cap = 0;
    if (!buf) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory decoding audio");
        goto done;
    }
    for (;;) {
        sf_count_t got = sf_readf_float(f, buf, CHUNK_FRAMES);
        if (got <= 0)
            break;
        if ((sf_count_t)n + got > MAX_FRAMES) {
            rc = err_set(err, INFERD_ERANGE, "audio longer than %lld frames",
                         (long long)MAX_FRAMES);
            break;
        }
        if (n + (size_t)got > cap) {
            size_t nc = cap ? cap * 2 : (size_t)CHUNK_FRAMES * 4;
            while (nc < n + (size_t)got)
                nc *= 2;
            float *g = realloc(s, nc * sizeof *g);
            if (!g) {
                rc = err_set(err, INFERD_ENOMEM, "out of memory decoding audio");
                break;
            }
            s = g;
            cap = nc;
        }
        for (sf_count_t i = 0; i < got; i++) {
            float sum = 0;
            for (int c = 0; c < info.channels; c++)
                sum += buf[i * info.channels + c];
            s[n++] = sum / (float)info.channels;
        }
    }
    free(buf);
    if (rc == 0 && n == 0)
        rc = err_set(err, INFERD_EFORMAT, "the audio file holds no samples");
    if (rc < 0) {
        free(s);
        goto done;
    }
    out->samples = s;
    out->n = n;
    out->sample_rate = info.samplerate;
    out->channels = info.channels;
done:
    sf_close(f);
    return rc;
}

bool audio_have_sndfile(void) { return true; }
#else
bool audio_have_sndfile(void) { return false; }
#endif

int audio_decode(const uint8_t *data, size_t len, struct audio_pcm *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return err_set(err, INFERD_EFORMAT, "the audio file is empty");
    if (len >= 12 && !memcmp(data, "RIFF", 4) && !memcmp(data + 8, "WAVE", 4))
        return audio_wav_decode(data, len, out, err);
#ifdef INFERD_HAVE_SNDFILE
    return sndfile_decode(data, len, out, err);
#else
    return err_set(err, INFERD_EFORMAT, "not a WAV file (this build reads WAV only)");
#endif
}

int audio_decode_16k(const uint8_t *data, size_t len, double max_seconds, int n_threads,
                     struct audio_pcm *out, struct err *err)
{
    struct audio_pcm src;
    int rc = audio_decode(data, len, &src, err);
    if (rc < 0)
        return rc;
    double seconds = (double)src.n / src.sample_rate;
    if (max_seconds > 0 && seconds > max_seconds) {
        audio_pcm_free(&src);
        return err_set(err, INFERD_ERANGE, "the audio lasts %.1f s (at most %.0f s accepted)",
                       seconds, max_seconds);
    }
    float *y;
    size_t n;
    rc = audio_resample(src.samples, src.n, src.sample_rate, AUDIO_SAMPLE_RATE, n_threads, &y, &n,
                        err);
    if (rc < 0) {
        audio_pcm_free(&src);
        return rc;
    }
    out->samples = y;
    out->n = n;
    out->sample_rate = AUDIO_SAMPLE_RATE;
    out->channels = src.channels;
    audio_pcm_free(&src);
    return 0;
}
