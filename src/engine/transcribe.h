/* engine/transcribe.h — speech to text with a Whisper model: 30 s windows, the special-token
 * prompt, greedy or sampled decoding with temperature fallback, timestamps and segments. */
#ifndef INFERD_ENGINE_TRANSCRIBE_H
#define INFERD_ENGINE_TRANSCRIBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"

enum transcribe_task { TRANSCRIBE_TASK_TRANSCRIBE = 0, TRANSCRIBE_TASK_TRANSLATE };

struct transcribe_options {
    enum transcribe_task task;
    const char *language;  /* "en", "de", ... (or a name Whisper knows, "english"); NULL or "":
                              detected from the first window (multilingual models) */
    const char *prompt;    /* text the first window is conditioned on; NULL: none */
    float temperature;     /* 0: greedy, falling back to 0.2, 0.4, ... 1.0 when a window's
                              text repeats itself (gzip ratio > 2.4) or its mean log
                              probability is below -1; > 0: that temperature only */
    bool timestamps;       /* timestamp tokens: segments with times, seeking by them */
    uint64_t seed;         /* for sampled windows */
    /* Called with each segment's text as it is decoded (streaming); non-zero stops. */
    int (*on_segment)(void *ctx, const char *text, size_t len);
    void *ctx;
};

struct transcribe_segment {
    int id;
    double start, end;          /* seconds from the start of the audio */
    char *text;                 /* owned, UTF-8 */
    int32_t *tokens;            /* owned; n_tokens text and timestamp ids */
    int n_tokens;
    float temperature, avg_logprob, compression_ratio, no_speech_prob;
};

struct transcribe_result {
    char *text;                 /* owned: every segment's text, joined */
    char language[16];          /* the code used ("en") */
    double duration;            /* seconds of audio */
    struct transcribe_segment *segments; /* owned; n_segments */
    int n_segments;
};

void transcribe_result_free(struct transcribe_result *r);

/* A Whisper model directory served on a backend: loaded on first use (or by
 * transcriber_load), unloaded by transcriber_unload; one transcription at a
 * time (others wait their turn). */
struct transcriber;

struct transcriber_stats {
    uint64_t requests, failures;
    double audio_seconds, compute_seconds; /* real-time factor: compute / audio */
    bool loaded;
    double idle_seconds;                   /* since the last transcription ended */
};

int transcriber_create(const char *dir, struct backend *be, struct transcriber **out,
                       struct err *err);
void transcriber_free(struct transcriber *t);
/* Loads the model now (a no-op when it is loaded). */
int transcriber_load(struct transcriber *t, struct err *err);
/* Drops the model's weights and state; the next transcription loads it again.
 * Waits for a running transcription. Returns whether it was loaded. */
bool transcriber_unload(struct transcriber *t);
/* Unloads when loaded and idle for at least idle_s seconds. */
bool transcriber_unload_idle(struct transcriber *t, double idle_s);
void transcriber_stats(struct transcriber *t, struct transcriber_stats *out);
/* The directory's name as the model's id (its last path component). */
const char *transcriber_id(const struct transcriber *t);

/* Transcribes n samples of 16 kHz mono audio. -INFERD_EINVAL for an unknown
 * language, or a language or translation on an English-only model. */
int transcriber_run(struct transcriber *t, const float *samples, size_t n,
                    const struct transcribe_options *o, struct transcribe_result *out,
                    struct err *err);

/* The code of a language given as a code or an English name ("German" -> "de"), or NULL. */
const char *transcribe_language_code(const char *name);

#endif
