/* api/audio.h — OpenAI's audio routes: /v1/audio/transcriptions and /translations (multipart
 * uploads or JSON bodies with base64 audio, decoded, transcribed by the server's Whisper model,
 * answered as json, text, srt, vtt, verbose_json or a stream of transcript events sent as each
 * segment is decoded), dictation sessions (/v1/audio/sessions*), and
 * /admin/transcription/unload. */
#ifndef INFERD_API_AUDIO_H
#define INFERD_API_AUDIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/errors.h"
#include "api/http.h"
#include "audio/audio.h"
#include "engine/transcribe.h"

#define AUDIO_DEFAULT_MAX_MB 25
#define AUDIO_MAX_VOCABULARY_TERMS 8192
#define AUDIO_MAX_VOCABULARY_BYTES (16 * 1024)
#define AUDIO_DEFAULT_NO_SPEECH 0.6f

enum audio_format { AUDIO_FMT_JSON, AUDIO_FMT_TEXT, AUDIO_FMT_SRT, AUDIO_FMT_VTT,
                    AUDIO_FMT_VERBOSE_JSON };

/* One transcription request's fields, from a multipart form or a JSON body (the same names:
 * file, model, language, prompt, response_format, temperature, stream,
 * timestamp_granularities[], beam_size, condition_on_previous_text, no_speech_threshold,
 * without_timestamps, vocabulary, vad, vad_threshold, vad_min_speech_ms, vad_trim). */
struct audio_request {
    enum audio_format fmt;
    bool stream;
    struct transcribe_options o;   /* its strings point into this struct */
    char language[32];
    char *prompt;                  /* owned */
    char **vocabulary;             /* owned; o.n_vocabulary terms */
    const uint8_t *file;           /* the audio: into the body, or file_owned */
    size_t file_len;
    uint8_t *file_owned;           /* owned: a JSON body's base64 decoded */
    bool temperature_given;
};

/* Parses a request body of content_type (multipart/form-data or application/json; anything
 * else is a 415). needs_file: the audio is required (transcriptions; a session's parameters
 * have none). default_beam: the server's --whisper-beam. Fills e and returns -1 on refusal
 * (400, 413 over max_audio_bytes when that is not 0, 415, 500 out of memory); 0 otherwise. */
int audio_request_parse(const char *content_type, const char *body, size_t len, bool needs_file,
                        size_t max_audio_bytes, int default_beam, struct audio_request *out,
                        struct api_error *e);
void audio_request_free(struct audio_request *r);

/* A session's chunk: audio/pcm (little-endian float32, 16 kHz mono; "audio/pcm;rate=16000"
 * and "application/octet-stream" with no container are read so too) or any container
 * audio_decode reads, resampled to 16 kHz on up to n_threads threads (0: one per core).
 * Fills e and returns -1 on refusal. */
int audio_chunk_decode(const char *content_type, const uint8_t *body, size_t len, int n_threads,
                       struct audio_pcm *out, struct api_error *e);

void audio_transcriptions(struct http_exchange *x);
void audio_translations(struct http_exchange *x);
void audio_unload(struct http_exchange *x);
/* POST /v1/audio/sessions (JSON parameters) */
void audio_session_create(struct http_exchange *x);
/* POST /v1/audio/sessions/{id}/audio and /v1/audio/sessions/{id}/finish */
void audio_session_post(struct http_exchange *x);
/* DELETE /v1/audio/sessions/{id} */
void audio_session_delete(struct http_exchange *x);

#endif
