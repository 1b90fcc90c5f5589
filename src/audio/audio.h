/* audio/audio.h — uploaded audio to Whisper's input: decoding (WAV here, other containers
 * through libsndfile where the build has it), resampling to 16 kHz, and the log-mel
 * spectrogram exactly as transformers' WhisperFeatureExtractor computes it. */
#ifndef INFERD_AUDIO_AUDIO_H
#define INFERD_AUDIO_AUDIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct threadpool;

#define AUDIO_SAMPLE_RATE 16000       /* Whisper's rate */
#define AUDIO_N_FFT 400
#define AUDIO_HOP 160
#define AUDIO_WINDOW_SAMPLES 480000   /* 30 s at 16 kHz: one encoder window */
#define AUDIO_WINDOW_FRAMES 3000      /* mel frames of one window */
#define AUDIO_MAX_CHANNELS 16

/* Mono samples in [-1, 1] (float input may exceed it; nothing clips). */
struct audio_pcm {
    float *samples; /* owned; n floats */
    size_t n;
    int sample_rate;
    int channels;   /* of the source, before the mix to mono */
};

void audio_pcm_free(struct audio_pcm *p);

/* A RIFF/WAVE (or RF64-less WAVE_FORMAT_EXTENSIBLE) file of len bytes: PCM 8
 * (unsigned), 16, 24 or 32-bit, IEEE float 32 or 64-bit, 1..AUDIO_MAX_CHANNELS
 * channels mixed to mono by their mean, any rate in [1000, 384000]. A data chunk
 * whose length runs past the file is read up to the file's end (streamed WAVs
 * write 0 or 0xffffffff there) but must hold at least one whole frame.
 * -INFERD_EFORMAT says what is wrong with the bytes (not RIFF, no fmt chunk, a
 * chunk past the end, ...), -INFERD_EUNSUPPORTED names a well-formed format
 * this reader does not take (A-law, ADPCM, 12-bit, ...). Never reads outside data. */
int audio_wav_decode(const uint8_t *data, size_t len, struct audio_pcm *out, struct err *err);

/* True when the build reads containers other than WAV (libsndfile: FLAC, OGG
 * Vorbis/Opus, MP3 where its version has it). */
bool audio_have_sndfile(void);

/* Any supported container, told by its bytes (WAV by its own reader above,
 * the rest through libsndfile). -INFERD_EFORMAT for bytes that are no audio
 * this build reads (an empty file included). */
int audio_decode(const uint8_t *data, size_t len, struct audio_pcm *out, struct err *err);

/* Band-limited resampling through libsamplerate (SRC_SINC_MEDIUM_QUALITY:
 * 90% of the lower Nyquist band passed, 121 dB of stopband), in pieces of
 * 8,192 input samples or more converted on up to n_threads threads (0: one per core): the
 * samples of one pass over the whole signal, whatever n_threads. Equal rates copy. *out is
 * malloc'd (the caller frees it); *n_out is n_in * rate_out / rate_in to
 * within a sample. Rates whose ratio is past 1/256..256 are refused
 * (-INFERD_EUNSUPPORTED). */
int audio_resample(const float *in, size_t n_in, int rate_in, int rate_out, int n_threads,
                   float **out, size_t *n_out, struct err *err);

/* audio_decode then audio_resample to 16 kHz on up to n_threads threads;
 * -INFERD_ERANGE when the audio lasts longer than max_seconds (0: no
 * limit). */
int audio_decode_16k(const uint8_t *data, size_t len, double max_seconds, int n_threads,
                     struct audio_pcm *out, struct err *err);

/* The log-mel front end (transformers' WhisperFeatureExtractor, numpy path):
 * periodic Hann window of 400, frames every 160 samples centred with reflect
 * padding, |rfft|^2 (201 bins, in double, by a mixed-radix FFT), Slaney-scale and Slaney-normalised
 * triangular filters over 0..8000 Hz, max(1e-10, .), log10, the last frame
 * dropped, then max(x, max over the window - 8), then (x + 4) / 4. */
struct audio_mel {
    int n_mels;          /* 80 or 128 (any 1..256 is accepted) */
    double *filters;     /* owned; n_mels x 201 */
    int *band;           /* owned; n_mels x 2: each filter's first and last non-zero bin */
    double *window;      /* owned; 400 */
    double *twiddle;     /* owned; 400 x 2: cos and -sin of 2 pi k / 400, the FFT's roots */
};

int audio_mel_init(int n_mels, struct audio_mel *out, struct err *err);
void audio_mel_free(struct audio_mel *m);

/* The features of one window: samples [0, n) (n <= AUDIO_WINDOW_SAMPLES)
 * padded with zeros to 30 s as the feature extractor pads, into out
 * (n_mels x AUDIO_WINDOW_FRAMES floats, mel-major as the model reads them).
 * The frames are split over pool's threads (NULL: the calling thread alone);
 * each frame is computed alone, so the features are the same either way. */
void audio_mel_window(const struct audio_mel *m, const float *samples, size_t n, float *out,
                      struct threadpool *pool);

/* ---- voice activity ------------------------------------------------------------------
 *
 * Our own detector (no trained model): 20 ms frames of 16 kHz audio, each scored in [0, 1] by
 * its log energy placed between the recording's noise floor (the 10th percentile of the
 * frames' energies) and its loud speech (the 99th), at least 20 dB apart, blended
 * (0.8 / 0.2) with its spectral flux (the rise of the magnitude spectrum from the frame
 * before, relative to the spectrum: speech changes, hum and steady noise do not). Frames
 * scoring at least the threshold are speech; speech regions closer than 300 ms are joined,
 * those shorter than min_speech_ms dropped, the rest padded by 100 ms each side. */
struct audio_vad_options {
    float threshold;   /* (0, 1); 0: 0.5 */
    int min_speech_ms; /* 0: 250 */
    bool trim;         /* chunks cover speech only (else they tile the whole audio) */
};

struct audio_span {
    size_t start, end; /* samples, [start, end) */
};

/* The speech regions of x (16 kHz mono), in order, into *out (malloc'd; the caller frees it). */
int audio_vad(const float *x, size_t n, const struct audio_vad_options *o,
              struct audio_span **out, int *n_out, struct err *err);

/* Chunks of at most max_len samples cut at silences: speech regions taken in order into a
 * chunk while it stays within max_len (a region longer than that is cut at its quietest
 * 20 ms frame in the chunk's last 5 s); with trim a chunk runs from its first region's start
 * to its last one's end, without it the chunks tile [0, n), each cut in the middle of the
 * silence between two regions. No speech at all: no chunks with trim, else one per max_len. */
int audio_vad_chunks(const float *x, size_t n, const struct audio_vad_options *o,
                     size_t max_len, struct audio_span **out, int *n_out, struct err *err);

#endif
