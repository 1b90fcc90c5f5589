/* api/audio.c — the transcription routes: the multipart form read and checked, the upload decoded
 * to 16 kHz (audio/), the transcriber run (engine/transcribe.h), the result in the format asked. */
#include "api/audio.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/multipart.h"
#include "api/server.h"
#include "audio/audio.h"
#include "base/strbuf.h"
#include "engine/transcribe.h"

enum audio_format { FMT_JSON, FMT_TEXT, FMT_SRT, FMT_VTT, FMT_VERBOSE_JSON };

static const char *const format_names[] = {"json", "text", "srt", "vtt", "verbose_json", NULL};

/* A form field's text, NUL-terminated into buf; false when absent. */
static bool field(const struct multipart_form *f, const char *name, char *buf, size_t cap)
{
    const struct multipart_part *p = multipart_find(f, name);
    if (!p)
        return false;
    size_t n = p->data_len < cap - 1 ? p->data_len : cap - 1;
    memcpy(buf, p->data, n);
    buf[n] = '\0';
    return true;
}

static void timestamp(struct strbuf *b, double s, char sep)
{
    long ms = (long)(s * 1000.0 + 0.5);
    strbuf_printf(b, "%02ld:%02ld:%02ld%c%03ld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, sep,
                  ms % 1000);
}

static void subtitles(const struct transcribe_result *r, bool vtt, struct strbuf *b)
{
    if (vtt)
        strbuf_puts(b, "WEBVTT\n\n");
    for (int i = 0; i < r->n_segments; i++) {
        const struct transcribe_segment *s = &r->segments[i];
        if (!vtt)
            strbuf_printf(b, "%d\n", i + 1);
        timestamp(b, s->start, vtt ? '.' : ',');
        strbuf_puts(b, " --> ");
        timestamp(b, s->end, vtt ? '.' : ',');
        const char *text = s->text;
        while (*text == ' ')
            text++;
        strbuf_printf(b, "\n%s\n\n", text);
    }
}

static json_object *jnum(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.3f", v);
    return json_object_new_double_s(v, buf);
}

static json_object *verbose_json(const struct transcribe_result *r, enum transcribe_task task)
{
    json_object *root = json_object_new_object(), *segs = json_object_new_array();
    json_object_object_add(root, "task", json_object_new_string(
                                             task == TRANSCRIBE_TASK_TRANSLATE ? "translate"
                                                                               : "transcribe"));
    json_object_object_add(root, "language", json_object_new_string(r->language));
    json_object_object_add(root, "duration", jnum(r->duration));
    json_object_object_add(root, "text", json_object_new_string(r->text));
    for (int i = 0; i < r->n_segments; i++) {
        const struct transcribe_segment *s = &r->segments[i];
        json_object *o = json_object_new_object(), *toks = json_object_new_array();
        json_object_object_add(o, "id", json_object_new_int(s->id));
        json_object_object_add(o, "seek", json_object_new_int((int)(s->start * 100)));
        json_object_object_add(o, "start", jnum(s->start));
        json_object_object_add(o, "end", jnum(s->end));
        json_object_object_add(o, "text", json_object_new_string(s->text));
        for (int k = 0; k < s->n_tokens; k++)
            json_object_array_add(toks, json_object_new_int(s->tokens[k]));
        json_object_object_add(o, "tokens", toks);
        json_object_object_add(o, "temperature", jnum(s->temperature));
        json_object_object_add(o, "avg_logprob", jnum(s->avg_logprob));
        json_object_object_add(o, "compression_ratio", jnum(s->compression_ratio));
        json_object_object_add(o, "no_speech_prob", jnum(s->no_speech_prob));
        json_object_array_add(segs, o);
    }
    json_object_object_add(root, "segments", segs);
    json_object *usage = json_object_new_object();
    json_object_object_add(usage, "type", json_object_new_string("duration"));
    json_object_object_add(usage, "seconds", json_object_new_int64((int64_t)(r->duration + 0.999)));
    json_object_object_add(root, "usage", usage);
    return root;
}

static void send_object(struct http_exchange *x, json_object *o)
{
    size_t len = 0;
    const char *s =
        json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, 200, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the transcript");
    json_object_put(o);
}

/* One SSE event of the transcription stream. */
static void sse_event(struct strbuf *b, json_object *o)
{
    strbuf_printf(b, "data: %s\n\n",
                  json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                        JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
}

static int on_segment(void *ctx, const struct transcribe_segment *seg)
{
    struct strbuf *b = ctx;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string("transcript.text.delta"));
    json_object_object_add(o, "delta", json_object_new_string(seg->text));
    sse_event(b, o);
    return 0;
}

/* The stream's events are produced by the transcription, segment by segment,
 * before the first byte goes out; the stream then drains them. */
struct audio_stream {
    struct strbuf events;
    size_t sent;
};

static bool stream_produce(void *ctx, struct strbuf *out, bool *done)
{
    struct audio_stream *s = ctx;
    strbuf_append(out, s->events.data + s->sent, s->events.len - s->sent);
    s->sent = s->events.len;
    *done = true;
    return true;
}

static void stream_release(void *ctx)
{
    struct audio_stream *s = ctx;
    strbuf_free(&s->events);
    free(s);
}

static void handle(struct http_exchange *x, enum transcribe_task task)
{
    struct server *srv = x->srv;
    if (!srv->transcriber) {
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, "model", "model_unavailable",
                         "this server has no Whisper model; start it with --whisper-model DIR");
        return;
    }
    const struct multipart_form *f = x->form;
    const struct multipart_part *file = multipart_find(f, "file");
    if (!file) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "file", "missing_file",
                         "the form has no 'file' part (the audio to transcribe)");
        return;
    }
    if (srv->max_audio_bytes && file->data_len > srv->max_audio_bytes) {
        http_send_errorf(x, 413, API_ERROR_INVALID_REQUEST, "file", "file_too_large",
                         "the audio file is %zu bytes; at most %zu are accepted (--max-audio-mb)",
                         file->data_len, srv->max_audio_bytes);
        return;
    }
    char fmt_s[32] = "json", lang[32] = "", temp_s[32] = "", stream_s[16] = "", gran[32] = "";
    char *prompt = NULL;
    field(f, "response_format", fmt_s, sizeof fmt_s);
    field(f, "language", lang, sizeof lang);
    field(f, "temperature", temp_s, sizeof temp_s);
    field(f, "stream", stream_s, sizeof stream_s);
    field(f, "timestamp_granularities[]", gran, sizeof gran);
    int fmt = -1;
    for (int i = 0; format_names[i]; i++)
        if (!strcmp(fmt_s, format_names[i]))
            fmt = i;
    if (fmt < 0) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "response_format", "invalid_value",
                         "response_format must be json, text, srt, verbose_json or vtt, got "
                         "'%.40s'", fmt_s);
        return;
    }
    if (gran[0] && strcmp(gran, "segment")) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "timestamp_granularities[]",
                         "unsupported_value",
                         "timestamp_granularities[] supports 'segment', got '%.40s'", gran);
        return;
    }
    struct transcribe_options o = {.task = task, .seed = 1};
    if (temp_s[0]) {
        char *end;
        double t = strtod(temp_s, &end);
        if (*end || end == temp_s || !(t >= 0 && t <= 1)) {
            http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "temperature", "invalid_value",
                             "temperature must be a number in [0, 1], got '%.40s'", temp_s);
            return;
        }
        o.temperature = (float)t;
    }
    bool stream = !strcmp(stream_s, "true") || !strcmp(stream_s, "1");
    if (lang[0] && !transcribe_language_code(lang)) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "language", "invalid_value",
                         "language '%.32s' is not one Whisper knows (an ISO-639-1 code such as "
                         "'en')", lang);
        return;
    }
    o.language = lang[0] ? lang : NULL;
    /* translations are always into English; a language there names the source */
    o.timestamps = fmt == FMT_SRT || fmt == FMT_VTT || fmt == FMT_VERBOSE_JSON;
    const struct multipart_part *pp = multipart_find(f, "prompt");
    if (pp && pp->data_len) {
        prompt = strndup(pp->data, pp->data_len);
        o.prompt = prompt;
    }
    struct audio_pcm pcm;
    struct err err = {0};
    int rc = audio_decode_16k((const uint8_t *)file->data, file->data_len, 0, &pcm, &err);
    if (rc < 0) {
        free(prompt);
        if (rc == -INFERD_ENOMEM)
            http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "%s", err.msg);
        else
            http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "file",
                             rc == -INFERD_EUNSUPPORTED ? "unsupported_audio" : "invalid_audio",
                             "%s", err.msg);
        return;
    }
    struct audio_stream *st = NULL;
    if (stream) {
        st = calloc(1, sizeof *st);
        o.on_segment = on_segment;
        o.ctx = st ? &st->events : NULL;
        if (!st) {
            audio_pcm_free(&pcm);
            free(prompt);
            http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
            return;
        }
    }
    struct transcribe_result r;
    rc = transcriber_run(srv->transcriber, pcm.samples, pcm.n, &o, &r, &err);
    audio_pcm_free(&pcm);
    free(prompt);
    if (rc < 0) {
        if (st)
            stream_release(st);
        int status = rc == -INFERD_EINVAL ? 400 : rc == -INFERD_ENOMEM ? 500 : 503;
        http_send_errorf(x, status, status == 400 ? API_ERROR_INVALID_REQUEST : API_ERROR_SERVER,
                         status == 400 ? "language" : NULL, NULL, "%s", err.msg);
        return;
    }
    if (st) {
        json_object *done = json_object_new_object();
        json_object_object_add(done, "type", json_object_new_string("transcript.text.done"));
        json_object_object_add(done, "text", json_object_new_string(r.text));
        sse_event(&st->events, done);
        transcribe_result_free(&r);
        http_send_stream(x, 200, "text/event-stream",
                         (struct http_stream){stream_produce, stream_release, st});
        return;
    }
    struct strbuf b = {0};
    switch (fmt) {
    case FMT_TEXT:
        strbuf_printf(&b, "%s\n", r.text);
        http_send_text(x, 200, "text/plain; charset=utf-8", b.data, b.len);
        break;
    case FMT_SRT:
    case FMT_VTT:
        subtitles(&r, fmt == FMT_VTT, &b);
        http_send_text(x, 200, fmt == FMT_VTT ? "text/vtt; charset=utf-8" : "application/x-subrip",
                       b.data ? b.data : "", b.len);
        break;
    case FMT_VERBOSE_JSON:
        send_object(x, verbose_json(&r, task));
        break;
    default: {
        json_object *o2 = json_object_new_object();
        json_object_object_add(o2, "text", json_object_new_string(r.text));
        send_object(x, o2);
    }
    }
    strbuf_free(&b);
    transcribe_result_free(&r);
}

void audio_transcriptions(struct http_exchange *x) { handle(x, TRANSCRIBE_TASK_TRANSCRIBE); }
void audio_translations(struct http_exchange *x) { handle(x, TRANSCRIBE_TASK_TRANSLATE); }

void audio_unload(struct http_exchange *x)
{
    if (!x->srv->transcriber) {
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, "model_unavailable",
                         "this server has no Whisper model; start it with --whisper-model DIR");
        return;
    }
    bool was = transcriber_unload(x->srv->transcriber);
    char body[96];
    int n = snprintf(body, sizeof body, "{\"unloaded\":%s}", was ? "true" : "false");
    http_send_json(x, 200, body, (size_t)n);
}
