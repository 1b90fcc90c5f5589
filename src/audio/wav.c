/* audio/wav.c — RIFF/WAVE files to mono float samples: PCM 8/16/24/32-bit and IEEE float, any channel count up to 16. */
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

#define WAVE_PCM 1
#define WAVE_FLOAT 3
#define WAVE_EXTENSIBLE 0xfffe

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

void audio_pcm_free(struct audio_pcm *p)
{
    if (!p)
        return;
    free(p->samples);
    memset(p, 0, sizeof *p);
}

struct wav_fmt {
    int format, channels, bits, block_align;
    uint32_t rate;
};

static int parse_fmt(const uint8_t *c, uint32_t size, struct wav_fmt *f, struct err *err)
{
    if (size < 16)
        return err_set(err, INFERD_EFORMAT, "WAV fmt chunk is %u bytes (at least 16 expected)",
                       size);
    f->format = rd_u16(c);
    f->channels = rd_u16(c + 2);
    f->rate = rd_u32(c + 4);
    f->block_align = rd_u16(c + 12);
    f->bits = rd_u16(c + 14);
    if (f->format == WAVE_EXTENSIBLE) {
        /* cbSize, valid bits, channel mask, then the sub-format GUID whose
         * first two bytes are the plain format code */
        if (size < 40)
            return err_set(err, INFERD_EFORMAT,
                           "WAV extensible fmt chunk is %u bytes (40 expected)", size);
        f->format = rd_u16(c + 24);
    }
    if (f->format != WAVE_PCM && f->format != WAVE_FLOAT)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "WAV sample format 0x%04x is not supported (PCM or IEEE float only)",
                       f->format);
    if (f->channels < 1 || f->channels > AUDIO_MAX_CHANNELS)
        return err_set(err, INFERD_EUNSUPPORTED, "WAV has %d channels (1 to %d supported)",
                       f->channels, AUDIO_MAX_CHANNELS);
    if (f->rate < 1000 || f->rate > 384000)
        return err_set(err, INFERD_EUNSUPPORTED, "WAV sample rate %u Hz (1000 to 384000 supported)",
                       f->rate);
    bool ok = f->format == WAVE_PCM
                  ? (f->bits == 8 || f->bits == 16 || f->bits == 24 || f->bits == 32)
                  : (f->bits == 32 || f->bits == 64);
    if (!ok)
        return err_set(err, INFERD_EUNSUPPORTED, "WAV %s samples of %d bits are not supported",
                       f->format == WAVE_PCM ? "PCM" : "float", f->bits);
    if (f->block_align != f->channels * (f->bits / 8))
        return err_set(err, INFERD_EFORMAT,
                       "WAV block align %d does not match %d channels of %d bits",
                       f->block_align, f->channels, f->bits);
    return 0;
}

static float sample_at(const uint8_t *p, const struct wav_fmt *f)
{
    if (f->format == WAVE_FLOAT) {
        if (f->bits == 32) {
            float v;
            memcpy(&v, p, 4);
            return v;
        }
        double d;
        memcpy(&d, p, 8);
        return (float)d;
    }
    switch (f->bits) {
    case 8:
        return ((int)p[0] - 128) * (1.0f / 128.0f);
    case 16:
        return (float)(int16_t)rd_u16(p) * (1.0f / 32768.0f);
    case 24: {
        int32_t v = (int32_t)((uint32_t)p[0] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 24);
        return (float)(v >> 8) * (1.0f / 8388608.0f);
    }
    default:
        return (float)((double)(int32_t)rd_u32(p) * (1.0 / 2147483648.0));
    }
}

int audio_wav_decode(const uint8_t *data, size_t len, struct audio_pcm *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (len < 12 || memcmp(data, "RIFF", 4) || memcmp(data + 8, "WAVE", 4))
        return err_set(err, INFERD_EFORMAT, "not a WAV file (no RIFF/WAVE header)");
    struct wav_fmt f = {0};
    bool have_fmt = false;
    size_t pos = 12;
    while (pos + 8 <= len) {
        const uint8_t *id = data + pos;
        uint32_t size = rd_u32(data + pos + 4);
        size_t body = pos + 8, avail = len - body;
        if (!memcmp(id, "fmt ", 4)) {
            if (size > avail)
                return err_set(err, INFERD_EFORMAT, "WAV fmt chunk runs past the end of the file");
            int rc = parse_fmt(data + body, size, &f, err);
            if (rc < 0)
                return rc;
            have_fmt = true;
        } else if (!memcmp(id, "data", 4)) {
            if (!have_fmt)
                return err_set(err, INFERD_EFORMAT, "WAV data chunk comes before its fmt chunk");
            /* a streamed file leaves the size 0 or 0xffffffff: read to the end */
            size_t bytes = size == 0 || size > avail ? avail : size;
            size_t frames = bytes / (size_t)f.block_align;
            if (frames == 0)
                return err_set(err, INFERD_EFORMAT, "WAV data chunk holds no whole sample frame");
            float *s = malloc(frames * sizeof *s);
            if (!s)
                return err_set(err, INFERD_ENOMEM, "out of memory for %zu WAV frames", frames);
            int width = f.bits / 8;
            const uint8_t *p = data + body;
            float inv = 1.0f / (float)f.channels;
            for (size_t i = 0; i < frames; i++) {
                float sum = 0;
                for (int ch = 0; ch < f.channels; ch++, p += width)
                    sum += sample_at(p, &f);
                s[i] = f.channels == 1 ? sum : sum * inv;
            }
            out->samples = s;
            out->n = frames;
            out->sample_rate = (int)f.rate;
            out->channels = f.channels;
            return 0;
        }
        if (size > avail)
            return err_set(err, INFERD_EFORMAT, "a WAV chunk at byte %zu runs past the end of the file",
                           pos);
        pos = body + size + (size & 1);
    }
    return err_set(err, INFERD_EFORMAT, have_fmt ? "WAV file has no data chunk"
                                                 : "WAV file has no fmt chunk");
}
