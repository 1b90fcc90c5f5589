/* engine/transcribe.h — speech to text with a Whisper model: 30 s windows, the special-token
 * prompt, greedy or sampled decoding with temperature fallback, timestamps and segments. */
#ifndef INFERD_ENGINE_TRANSCRIBE_H
#define INFERD_ENGINE_TRANSCRIBE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"

enum transcribe_task { TRANSCRIBE_TASK_TRANSCRIBE = 0, TRANSCRIBE_TASK_TRANSLATE };

struct transcribe_segment;

/* Voice-activity chunking (audio_vad, audio/audio.h): the audio is cut at silences into chunks
 * of at most 30 s, each transcribed on its own at its place in time. */
struct transcribe_vad {
    bool on;
    float threshold;     /* (0, 1): how far above the noise floor a frame's score must be */
    int min_speech_ms;   /* speech shorter than this is dropped */
    bool trim;           /* silence is cut out (else only the cut points follow silences) */
};

struct transcribe_options {
    enum transcribe_task task;
    const char *language;  /* "en", "de", ... (or a name Whisper knows, "english"); NULL or "":
                              detected from the first window (multilingual models) */
    const char *prompt;    /* text the first window is conditioned on; NULL: none */
    /* terms the decoding is biased towards: as many as fit (in order) go before the prompt
     * in the first window's conditioning text, within the 223-token budget */
    const char *const *vocabulary;
    int n_vocabulary;
    float temperature;     /* 0: greedy (or beam search), falling back to 0.2, 0.4, ... 1.0
                              when a window's text repeats itself (gzip ratio > 2.4) or its
                              mean log probability is below -1; > 0: that temperature only */
    int beam_size;         /* 0 or 1: greedy; 2..WHISPER_MAX_SEQS: beam search at temperature 0
                              (openai-whisper's: patience 1, the finished beam with the best
                              sum log probability / length) */
    bool timestamps;       /* timestamp tokens: segments with times, seeking by them */
    bool word_timestamps;  /* each segment's words with times (cross-attention alignment) */
    bool no_previous_text; /* condition_on_previous_text off: a window is not prompted with the
                              text before it (the prompt still conditions the first) */
    float no_speech_threshold; /* > 0: a window whose <|nospeech|> probability is above it and
                                  whose mean log probability is below -1 is silence, skipped */
    bool no_fallback;      /* temperature 0 stays greedy (or beam) whatever the window's text:
                              transformers' generate() without a temperature ladder */
    int max_new_tokens;    /* tokens sampled per window at most (the end of text counts, as
                              transformers' max_new_tokens); 0: the model's limit (224) */
    struct transcribe_vad vad;
    uint64_t seed;         /* for sampled windows */
    /* Called with each segment as it is decoded (streaming); non-zero stops the transcription
     * (-INFERD_EIO, "cancelled"). */
    int (*on_segment)(void *ctx, const struct transcribe_segment *segment);
    /* Called after each window with the seconds of audio done and in all; non-zero stops. */
    int (*on_progress)(void *ctx, double done, double total);
    /* When set (by another thread), the transcription stops before its next token
     * (-INFERD_EIO, "cancelled"); NULL: never. */
    const atomic_bool *cancel;
    void *ctx;
};

struct transcribe_word {
    char *text;                 /* owned, UTF-8, with its leading space */
    double start, end;          /* seconds from the start of the audio, inside the segment */
};

struct transcribe_segment {
    int id;
    double start, end;          /* seconds from the start of the audio */
    char *text;                 /* owned, UTF-8 */
    int32_t *tokens;            /* owned; n_tokens text and timestamp ids */
    int n_tokens;
    float temperature, avg_logprob, compression_ratio, no_speech_prob;
    struct transcribe_word *words; /* owned; n_words (word_timestamps) */
    int n_words;
};

struct transcribe_result {
    char *text;                 /* owned: every segment's text, joined */
    char language[16];          /* the code used ("en") */
    int32_t language_token;     /* its token (<|en|>); -1 on an English-only model */
    double duration;            /* seconds of audio */
    struct transcribe_segment *segments; /* owned; n_segments */
    int n_segments;
    int n_vocabulary_used;      /* the options' vocabulary terms that fitted the prompt budget */
    /* where the run's time went, in milliseconds (waiting for an earlier run not counted) */
    double load_ms;             /* loading the model for this run (0: it was loaded) */
    double vad_ms;              /* the voice detector (0 without VAD) */
    double transcribe_ms;       /* everything after the load, VAD included */
    double mel_ms;              /* the log-mel features of every window (host) */
    double encode_ms;           /* the encoder over every window, on the device */
    double decode_ms;           /* the decoder's steps (prompt, tokens, fallback passes) */
    int n_windows;              /* 30 s windows encoded */
    int n_decoder_steps;        /* decoder calls (one token of every live sequence each) */
    int n_passes;               /* decodings of a window (more than n_windows: fallbacks) */
    int n_vad_chunks;           /* VAD: the stretches of speech transcribed */
    double vad_speech_seconds;  /* VAD: their length */
};

void transcribe_result_free(struct transcribe_result *r);

/* A Whisper model directory served on a backend: loaded on first use (or by
 * transcriber_load), unloaded by transcriber_unload; one transcription at a
 * time (others wait their turn). */
struct transcriber;

struct transcriber_stats {
    uint64_t requests, failures;
    double audio_seconds, compute_seconds; /* real-time factor: compute / audio */
    /* where compute_seconds went (the rest: audio decoding, prompts, segments, waiting) */
    double mel_seconds, encode_seconds, decode_seconds;
    uint64_t windows, decoder_steps, passes;
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

/* Transcribes a log-mel spectrogram of n_frames frames (n_mels x n_frames floats, mel-major,
 * host memory; audio_mel_window's layout when n_frames is AUDIO_WINDOW_FRAMES): every frame is
 * content, windows are cut from it at each seek and padded with zeros, as transformers'
 * generate() does with the features it is given (a clip under 30 s that the feature extractor
 * padded to 3000 frames is decoded to its last padded frame, not to the clip's end as
 * transcriber_run decodes it). No VAD (-INFERD_EINVAL). Parity tests hold it to generate(). */
int transcriber_run_mel(struct transcriber *t, const float *mel, size_t n_frames,
                        const struct transcribe_options *o, struct transcribe_result *out,
                        struct err *err);

/* The alignment of openai-whisper's timing.py, from cross-attention scores to each token's
 * first frame: scores holds n_heads matrices of n_rows tokens x n_frames encoder frames
 * (scaled q . k, whisper_cross_scores); each row is softmaxed over the frames, each frame
 * normalised to zero mean and unit population deviation over the rows, each row median-
 * filtered along the frames (width 7, reflected at the ends); the heads are averaged over
 * rows [first_row, first_row + n_path_rows), and dynamic time warping of the negated
 * average (ties step to the next frame) gives the path, jump[i] its first frame on row
 * first_row + i. -INFERD_EINVAL for shapes that do not fit, -INFERD_ENOMEM. */
int transcribe_align(const float *scores, int n_heads, int n_rows, int n_frames, int first_row,
                     int n_path_rows, int *jump, struct err *err);

/* Shares the device with a chat engine (engine/turns.h): every encoder pass and decoder step
 * runs in a turn of its own. NULL: the device is the transcriber's alone. turns is borrowed. */
struct device_turns;
void transcriber_set_turns(struct transcriber *t, struct device_turns *turns);

/* The beam width requests get when they name none (--whisper-beam; 1: greedy). */
void transcriber_set_default_beam(struct transcriber *t, int beam_size);
int transcriber_default_beam(const struct transcriber *t);

/* Threads of the log-mel front end (0: one per core, 1: the transcribing thread alone, the
 * default); each window's frames are split over them (the same features either way). */
int transcriber_set_mel_threads(struct transcriber *t, int n_threads, struct err *err);

/* ---- dictation sessions ---------------------------------------------------------------
 *
 * Audio arrives in pieces; each completed 30 s window is transcribed as soon as it is whole
 * (conditioned on the window before unless the options say otherwise), the rest when the
 * session finishes. At most TRANSCRIBER_MAX_SESSIONS are open at once. */
#define TRANSCRIBER_MAX_SESSIONS 64
#define TRANSCRIBER_SESSION_ID 32

struct transcribe_session_status {
    size_t samples;     /* 16 kHz samples received */
    double duration;    /* their seconds */
    bool speech;        /* the voice detector heard speech in the last piece */
    int n_segments;     /* segments transcribed so far */
};

/* Opens a session with a copy of o (its strings and vocabulary copied; the callbacks are
 * not kept) and an int the caller keeps with it (tag); id gets its id. -INFERD_EBUSY when
 * TRANSCRIBER_MAX_SESSIONS are open. */
int transcriber_session_open(struct transcriber *t, const struct transcribe_options *o, int tag,
                             char id[TRANSCRIBER_SESSION_ID], struct err *err);
/* Appends n samples and transcribes the windows they complete. -INFERD_ENOENT for no such
 * session; a failed transcription leaves the session open. */
int transcriber_session_append(struct transcriber *t, const char *id, const float *x, size_t n,
                               struct transcribe_session_status *st, struct err *err);
/* Transcribes what is left, closes the session and hands over its whole transcript (every
 * segment, times from the session's start) and its tag. -INFERD_ENOENT; a failed
 * transcription leaves the session open. */
int transcriber_session_finish(struct transcriber *t, const char *id,
                               struct transcribe_result *out, int *tag, struct err *err);
/* Closes a session without a transcript; false when there was none. */
bool transcriber_session_close(struct transcriber *t, const char *id);
int transcriber_session_count(struct transcriber *t);

/* The code of a language given as a code or an English name ("German" -> "de"), or NULL. */
const char *transcribe_language_code(const char *name);

#endif
