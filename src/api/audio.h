/* api/audio.h — OpenAI's audio routes: /v1/audio/transcriptions and /translations (multipart
 * uploads decoded, transcribed by the server's Whisper model, answered as json, text, srt, vtt,
 * verbose_json or a stream of transcript.text events), and /admin/transcription/unload. */
#ifndef INFERD_API_AUDIO_H
#define INFERD_API_AUDIO_H

#include "api/http.h"

#define AUDIO_DEFAULT_MAX_MB 25

void audio_transcriptions(struct http_exchange *x);
void audio_translations(struct http_exchange *x);
void audio_unload(struct http_exchange *x);

#endif
