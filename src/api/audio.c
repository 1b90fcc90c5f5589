/* api/audio.c — the transcription routes: the request read and checked (a multipart form or a
 * JSON body), the upload decoded to 16 kHz (audio/), the transcriber run (engine/transcribe.h),
 * the result in the format asked or streamed as it is decoded; dictation sessions. */
#include "api/audio.h"

#include <json-c/json.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "api/multipart.h"
#include "api/server.h"
#include "base/json.h"
#include "base/strbuf.h"

static const char *const format_names[] = {"json", "text", "srt", "vtt", "verbose_json", NULL};

/* ---- reading the request ----------------------------------------------------------------- */

/* The fields as text, whichever body carried them: a form part's bytes, or a JSON value
 * written as text (strings as they are, numbers and booleans as JSON spells them). */
struct fields {
    const struct multipart_form *form;
    json_object *json;
};

static bool field_text(const struct fields *f, const char *name, char *buf, size_t cap)
{
    if (f->form) {
        const struct multipart_part *p = multipart_find(f->form, name);
        if (!p)
            return false;
        size_t n = p->data_len < cap - 1 ? p->data_len : cap - 1;
        memcpy(buf, p->data, n);
        buf[n] = '\0';
        return true;
    }
    json_object *v;
    if (!json_object_object_get_ex(f->json, name, &v) || !v)
        return false;
    const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v)
                                                             : json_object_to_json_string(v);
    snprintf(buf, cap, "%s", s ? s : "");
    return true;
}

static int bad(struct api_error *e, const char *param, const char *fmt, const char *value)
{
    api_error_set(e, 400, API_ERROR_INVALID_REQUEST, param, "invalid_value", fmt, value);
    return -1;
}

static int read_bool(const struct fields *f, const char *name, bool *out, struct api_error *e)
{
    char v[16];
    if (!field_text(f, name, v, sizeof v))
        return 0;
    if (!strcmp(v, "true") || !strcmp(v, "1"))
        *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "0"))
        *out = false;
    else
        return api_error_set(e, 400, API_ERROR_INVALID_REQUEST, name, "invalid_value",
                             "%s must be true or false, got '%.40s'", name, v), -1;
    return 0;
}

/* A number in [lo, hi] (open at lo when lo_open). */
static int read_number(const struct fields *f, const char *name, double lo, double hi,
                       bool lo_open, double *out, bool *given, struct api_error *e)
{
    char v[64];
    if (!field_text(f, name, v, sizeof v))
        return 0;
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(lo_open ? d > lo : d >= lo) || !(d <= hi)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, name, "invalid_value",
                      "%s must be a number in %c%g, %g], got '%.40s'", name, lo_open ? '(' : '[',
                      lo, hi, v);
        return -1;
    }
    *out = d;
    if (given)
        *given = true;
    return 0;
}

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

/* Standard or URL-safe base64, padding optional, whitespace skipped; -1 for anything else. */
static int base64_decode(const char *s, size_t len, uint8_t **out, size_t *n_out)
{
    uint8_t *o = malloc(len / 4 * 3 + 3);
    if (!o)
        return -2;
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0, pad = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            continue;
        if (c == '=') {
            pad++;
            continue;
        }
        int v = b64_value((unsigned char)c);
        if (v < 0 || pad) {
            free(o);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[n++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6 || pad > 2) { /* a lone 6-bit group is no byte */
        free(o);
        return -1;
    }
    *out = o;
    *n_out = n;
    return 0;
}

/* The JSON body's audio: file (base64 or a data: URL), input_audio.data or audio. */
static int json_file(json_object *root, struct audio_request *r, struct api_error *e)
{
    json_object *v = NULL, *ia;
    const char *key = "file";
    if (!json_object_object_get_ex(root, "file", &v) || !v) {
        key = "input_audio";
        if (json_object_object_get_ex(root, "input_audio", &ia) && ia &&
            json_object_is_type(ia, json_type_object))
            json_object_object_get_ex(ia, "data", &v);
    }
    if (!v) {
        key = "audio";
        json_object_object_get_ex(root, "audio", &v);
    }
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_string)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, key, "invalid_value",
                      "%s must be a string of base64 audio (or a data: URL)", key);
        return -1;
    }
    const char *s = json_object_get_string(v);
    size_t len = (size_t)json_object_get_string_len(v);
    if (!strncmp(s, "data:", 5)) {
        const char *comma = memchr(s, ',', len);
        if (!comma || !strstr(s, ";base64")) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, key, "invalid_value",
                          "%s: a data: URL must be base64 (data:audio/wav;base64,...)", key);
            return -1;
        }
        len -= (size_t)(comma + 1 - s);
        s = comma + 1;
    }
    int rc = base64_decode(s, len, &r->file_owned, &r->file_len);
    if (rc == -2) {
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the audio");
        return -1;
    }
    if (rc < 0) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, key, "invalid_value",
                      "%s is not valid base64", key);
        return -1;
    }
    r->file = r->file_owned;
    return 0;
}

static int add_term(struct audio_request *r, const char *s, size_t len, size_t *bytes,
                    struct api_error *e)
{
    while (len && (*s == ' ' || *s == '\t' || *s == '\n'))
        s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\n'))
        len--;
    if (!len)
        return 0;
    *bytes += len;
    if (r->o.n_vocabulary >= AUDIO_MAX_VOCABULARY_TERMS || *bytes > AUDIO_MAX_VOCABULARY_BYTES) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "vocabulary", "invalid_value",
                      "vocabulary holds at most %d terms and %d bytes", AUDIO_MAX_VOCABULARY_TERMS,
                      AUDIO_MAX_VOCABULARY_BYTES);
        return -1;
    }
    if (memchr(s, '\0', len)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "vocabulary", "invalid_value",
                      "vocabulary terms must be text");
        return -1;
    }
    if (r->o.n_vocabulary % 64 == 0) {
        char **v = realloc(r->vocabulary, (size_t)(r->o.n_vocabulary + 64) * sizeof *v);
        if (!v)
            goto oom;
        r->vocabulary = v;
    }
    if (!(r->vocabulary[r->o.n_vocabulary] = strndup(s, len)))
        goto oom;
    r->o.n_vocabulary++;
    return 0;
oom:
    api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the vocabulary");
    return -1;
}

static int add_terms_csv(struct audio_request *r, const char *s, size_t len, size_t *bytes,
                         struct api_error *e)
{
    while (len) {
        const char *c = memchr(s, ',', len);
        size_t n = c ? (size_t)(c - s) : len;
        if (add_term(r, s, n, bytes, e) < 0)
            return -1;
        s += n;
        len -= n;
        if (len) /* the comma */
            s++, len--;
    }
    return 0;
}

/* vocabulary: a JSON array of strings, a comma-separated string, or form parts named
 * vocabulary or vocabulary[] (each a term list). */
static int read_vocabulary(const struct fields *f, struct audio_request *r, struct api_error *e)
{
    size_t bytes = 0;
    if (f->form) {
        for (size_t i = 0; i < f->form->n_parts; i++) {
            const struct multipart_part *p = &f->form->parts[i];
            if ((!strcmp(p->name, "vocabulary") || !strcmp(p->name, "vocabulary[]")) &&
                add_terms_csv(r, p->data, p->data_len, &bytes, e) < 0)
                return -1;
        }
    } else {
        json_object *v;
        if (!json_object_object_get_ex(f->json, "vocabulary", &v) || !v)
            goto done;
        if (json_object_is_type(v, json_type_string)) {
            if (add_terms_csv(r, json_object_get_string(v),
                              (size_t)json_object_get_string_len(v), &bytes, e) < 0)
                return -1;
        } else if (json_object_is_type(v, json_type_array)) {
            for (size_t i = 0; i < json_object_array_length(v); i++) {
                json_object *t = json_object_array_get_idx(v, i);
                if (!t || !json_object_is_type(t, json_type_string)) {
                    api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "vocabulary",
                                  "invalid_value", "vocabulary[%zu] must be a string", i);
                    return -1;
                }
                if (add_term(r, json_object_get_string(t), (size_t)json_object_get_string_len(t),
                             &bytes, e) < 0)
                    return -1;
            }
        } else {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "vocabulary", "invalid_value",
                          "vocabulary must be an array of strings or a comma-separated string");
            return -1;
        }
    }
done:
    r->o.vocabulary = (const char *const *)r->vocabulary;
    return 0;
}

/* timestamp_granularities[]: each part (form) or element (JSON) "segment" or "word". */
static int read_granularities(const struct fields *f, bool *word, struct api_error *e)
{
    const char *names[2] = {"timestamp_granularities[]", "timestamp_granularities"};
    char v[32];
    for (int k = 0; k < 2; k++) {
        if (f->form) {
            for (size_t i = 0; i < f->form->n_parts; i++) {
                const struct multipart_part *p = &f->form->parts[i];
                if (strcmp(p->name, names[k]))
                    continue;
                snprintf(v, sizeof v, "%.*s", (int)(p->data_len < 31 ? p->data_len : 31), p->data);
                if (!strcmp(v, "word"))
                    *word = true;
                else if (strcmp(v, "segment"))
                    goto bad_value;
            }
            continue;
        }
        json_object *a;
        if (!json_object_object_get_ex(f->json, names[k], &a) || !a)
            continue;
        size_t n = json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
        if (!json_object_is_type(a, json_type_array)) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, names[k], "invalid_value",
                          "%s must be an array of 'segment' and 'word'", names[k]);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            json_object *s = json_object_array_get_idx(a, i);
            snprintf(v, sizeof v, "%s", s && json_object_is_type(s, json_type_string)
                                            ? json_object_get_string(s) : "?");
            if (!strcmp(v, "word"))
                *word = true;
            else if (strcmp(v, "segment"))
                goto bad_value;
        }
    }
    return 0;
bad_value:
    api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "timestamp_granularities[]",
                  "unsupported_value",
                  "timestamp_granularities[] takes 'segment' and 'word', got '%.40s'", v);
    return -1;
}

static int read_fields(const struct fields *f, bool needs_file, size_t max_audio_bytes,
                       int default_beam, struct audio_request *r, struct api_error *e)
{
    char fmt_s[32] = "json", lang[32] = "";
    field_text(f, "response_format", fmt_s, sizeof fmt_s);
    int fmt = -1;
    for (int i = 0; format_names[i]; i++)
        if (!strcmp(fmt_s, format_names[i]))
            fmt = i;
    if (fmt < 0)
        return bad(e, "response_format",
                   "response_format must be json, text, srt, verbose_json or vtt, got '%.40s'",
                   fmt_s);
    r->fmt = (enum audio_format)fmt;
    if (field_text(f, "language", lang, sizeof lang) && lang[0]) {
        if (!transcribe_language_code(lang))
            return bad(e, "language",
                       "language '%.32s' is not one Whisper knows (an ISO-639-1 code such as 'en')",
                       lang);
        snprintf(r->language, sizeof r->language, "%s", lang);
        r->o.language = r->language;
    }
    double temp = 0, beam = default_beam, nst = AUDIO_DEFAULT_NO_SPEECH, vth = 0.5, vms = 250;
    bool words = false, cond = true, no_ts = false;
    if (read_number(f, "temperature", 0, 1, false, &temp, &r->temperature_given, e) < 0 ||
        read_number(f, "beam_size", 1, 16, false, &beam, NULL, e) < 0 ||
        read_number(f, "no_speech_threshold", 0, 1, false, &nst, NULL, e) < 0 ||
        read_number(f, "vad_threshold", 0, 1, true, &vth, NULL, e) < 0 ||
        read_number(f, "vad_min_speech_ms", 0, 60000, false, &vms, NULL, e) < 0 ||
        read_bool(f, "stream", &r->stream, e) < 0 ||
        read_bool(f, "condition_on_previous_text", &cond, e) < 0 ||
        read_bool(f, "without_timestamps", &no_ts, e) < 0 ||
        read_bool(f, "vad", &r->o.vad.on, e) < 0 || read_bool(f, "vad_trim", &r->o.vad.trim, e) < 0 ||
        read_granularities(f, &words, e) < 0 || read_vocabulary(f, r, e) < 0)
        return -1;
    if (vth >= 1) /* (0, 1): the bound read_number leaves closed */
        return bad(e, "vad_threshold", "vad_threshold must be in (0, 1), got '%s'", "1");
    if (beam != (int)beam)
        return bad(e, "beam_size", "beam_size must be an integer in [1, 16], got '%s'", "a fraction");
    if (beam > 1 && r->temperature_given && temp > 0)
        return bad(e, "beam_size",
                   "beam_size above 1 needs temperature 0 (beam search is deterministic), got '%s'",
                   "a temperature above 0");
    if (words && r->fmt != AUDIO_FMT_VERBOSE_JSON && !r->stream)
        return bad(e, "timestamp_granularities[]",
                   "word timestamps need response_format verbose_json (or stream), got '%s'",
                   format_names[r->fmt]);
    r->o.temperature = (float)temp;
    r->o.beam_size = (int)beam;
    r->o.no_speech_threshold = (float)nst;
    r->o.no_previous_text = !cond;
    r->o.word_timestamps = words;
    r->o.timestamps = !no_ts && (words || r->fmt == AUDIO_FMT_SRT || r->fmt == AUDIO_FMT_VTT ||
                                 r->fmt == AUDIO_FMT_VERBOSE_JSON);
    if (words && no_ts)
        return bad(e, "without_timestamps", "word timestamps cannot go %s", "without timestamps");
    r->o.vad.threshold = (float)vth;
    r->o.vad.min_speech_ms = (int)vms;
    r->o.seed = 1;
    if (f->form) {
        const struct multipart_part *pp = multipart_find(f->form, "prompt");
        if (pp && pp->data_len && !(r->prompt = strndup(pp->data, pp->data_len)))
            goto oom;
        const struct multipart_part *file = multipart_find(f->form, "file");
        if (file) {
            r->file = (const uint8_t *)file->data;
            r->file_len = file->data_len;
        }
    } else {
        json_object *p;
        if (json_object_object_get_ex(f->json, "prompt", &p) && p) {
            if (!json_object_is_type(p, json_type_string))
                return bad(e, "prompt", "prompt must be a string%s", "");
            if (json_object_get_string_len(p) && !(r->prompt = strdup(json_object_get_string(p))))
                goto oom;
        }
        if (json_file(f->json, r, e) < 0)
            return -1;
    }
    r->o.prompt = r->prompt;
    if (needs_file && !r->file) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "file", "missing_file",
                      "the request has no 'file' (the audio to transcribe)");
        return -1;
    }
    if (r->file && max_audio_bytes && r->file_len > max_audio_bytes) {
        api_error_set(e, 413, API_ERROR_INVALID_REQUEST, "file", "file_too_large",
                      "the audio file is %zu bytes; at most %zu are accepted (--max-audio-mb)",
                      r->file_len, max_audio_bytes);
        return -1;
    }
    return 0;
oom:
    api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory reading the request");
    return -1;
}

static bool type_is(const char *ct, const char *want)
{
    if (!ct)
        return false;
    while (*ct == ' ')
        ct++;
    size_t n = strlen(want);
    return !strncasecmp(ct, want, n) && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

int audio_request_parse(const char *content_type, const char *body, size_t len, bool needs_file,
                        size_t max_audio_bytes, int default_beam, struct audio_request *out,
                        struct api_error *e)
{
    memset(out, 0, sizeof *out);
    struct err err = {0};
    int rc;
    if (type_is(content_type, "multipart/form-data")) {
        char boundary[MULTIPART_MAX_BOUNDARY + 1];
        struct multipart_form form = {0};
        rc = multipart_boundary(content_type, boundary, &err);
        if (rc == 0)
            rc = multipart_parse(body, len, boundary, &form, &err);
        if (rc < 0) {
            api_error_set(e, rc == -INFERD_ENOMEM ? 500 : 400,
                          rc == -INFERD_ENOMEM ? API_ERROR_SERVER : API_ERROR_INVALID_REQUEST,
                          NULL, "bad_request", "%s", err.msg);
            return -1;
        }
        struct fields f = {.form = &form};
        rc = read_fields(&f, needs_file, max_audio_bytes, default_beam, out, e);
        /* the file points into the body, not the form: the form's list can go */
        multipart_free(&form);
    } else if (type_is(content_type, "application/json") || (!content_type && !needs_file)) {
        json_object *root = NULL;
        rc = json_text_parse(body, len, 0, true, &root, &err);
        if (rc < 0 || !root || !json_object_is_type(root, json_type_object)) {
            json_object_put(root);
            api_error_set(e, rc == -INFERD_ENOMEM ? 500 : 400,
                          rc == -INFERD_ENOMEM ? API_ERROR_SERVER : API_ERROR_INVALID_REQUEST,
                          NULL, "bad_request", "invalid JSON body%s%s", rc < 0 ? ": " : "",
                          rc < 0 ? err.msg : " (an object is expected)");
            return -1;
        }
        struct fields f = {.json = root};
        rc = read_fields(&f, needs_file, max_audio_bytes, default_beam, out, e);
        json_object_put(root);
    } else {
        api_error_set(e, 415, API_ERROR_INVALID_REQUEST, NULL, "unsupported_media_type",
                      "Content-Type must be multipart/form-data or application/json, got "
                      "'%.100s'", content_type ? content_type : "(none)");
        return -1;
    }
    if (rc < 0)
        audio_request_free(out);
    return rc < 0 ? -1 : 0;
}

void audio_request_free(struct audio_request *r)
{
    free(r->prompt);
    for (int i = 0; r->vocabulary && i < r->o.n_vocabulary; i++)
        free(r->vocabulary[i]);
    free(r->vocabulary);
    free(r->file_owned);
    memset(r, 0, sizeof *r);
}

static int decode_error(int rc, const struct err *err, struct api_error *e)
{
    if (rc == -INFERD_ENOMEM)
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "%s", err->msg);
    else
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "file",
                      rc == -INFERD_EUNSUPPORTED ? "unsupported_audio" : "invalid_audio",
                      "undecodable audio: %s", err->msg);
    return -1;
}

int audio_chunk_decode(const char *content_type, const uint8_t *body, size_t len, int n_threads,
                       struct audio_pcm *out, struct api_error *e)
{
    memset(out, 0, sizeof *out);
    struct err err = {0};
    bool raw = type_is(content_type, "audio/pcm") ||
               (type_is(content_type, "application/octet-stream") && len >= 4 &&
                memcmp(body, "RIFF", 4) && memcmp(body, "fLaC", 4) && memcmp(body, "OggS", 4) &&
                memcmp(body, "ID3", 3) && !(body[0] == 0xff && (body[1] & 0xe0) == 0xe0));
    if (!raw) {
        int rc = audio_decode_16k(body, len, 0, n_threads, out, &err);
        return rc < 0 ? decode_error(rc, &err, e) : 0;
    }
    if (len % 4) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "body", "invalid_audio",
                      "audio/pcm is little-endian float32 samples: %zu bytes is not a whole "
                      "number of them", len);
        return -1;
    }
    out->n = len / 4;
    out->sample_rate = AUDIO_SAMPLE_RATE;
    out->channels = 1;
    out->samples = malloc((out->n ? out->n : 1) * sizeof *out->samples);
    if (!out->samples) {
        api_error_set(e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the audio");
        return -1;
    }
    for (size_t i = 0; i < out->n; i++) {
        uint32_t u = (uint32_t)body[4 * i] | (uint32_t)body[4 * i + 1] << 8 |
                     (uint32_t)body[4 * i + 2] << 16 | (uint32_t)body[4 * i + 3] << 24;
        float v;
        memcpy(&v, &u, 4);
        if (!(v >= -64.0f && v <= 64.0f)) { /* NaN, infinities, or no audio at all */
            audio_pcm_free(out);
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "body", "invalid_audio",
                          "audio/pcm sample %zu is not a finite sample value", i);
            return -1;
        }
        out->samples[i] = v;
    }
    return 0;
}

/* ---- answering ------------------------------------------------------------------------------ */

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

static json_object *words_json(const struct transcribe_result *r)
{
    json_object *a = json_object_new_array();
    for (int i = 0; i < r->n_segments; i++)
        for (int k = 0; k < r->segments[i].n_words; k++) {
            const struct transcribe_word *w = &r->segments[i].words[k];
            json_object *o = json_object_new_object();
            json_object_object_add(o, "word", json_object_new_string(w->text));
            json_object_object_add(o, "start", jnum(w->start));
            json_object_object_add(o, "end", jnum(w->end));
            json_object_array_add(a, o);
        }
    return a;
}

static json_object *verbose_json(const struct transcribe_result *r, enum transcribe_task task,
                                 bool words)
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
        if (words) {
            json_object *w = json_object_new_array();
            for (int k = 0; k < s->n_words; k++) {
                json_object *wo = json_object_new_object();
                json_object_object_add(wo, "word", json_object_new_string(s->words[k].text));
                json_object_object_add(wo, "start", jnum(s->words[k].start));
                json_object_object_add(wo, "end", jnum(s->words[k].end));
                json_object_array_add(w, wo);
            }
            json_object_object_add(o, "words", w);
        }
        json_object_array_add(segs, o);
    }
    json_object_object_add(root, "segments", segs);
    if (words)
        json_object_object_add(root, "words", words_json(r));
    json_object *usage = json_object_new_object();
    json_object_object_add(usage, "type", json_object_new_string("duration"));
    json_object_object_add(usage, "seconds", json_object_new_int64((int64_t)(r->duration + 0.999)));
    json_object_object_add(root, "usage", usage);
    return root;
}

/* What the response extensions say beside the transcript: the model, and when the request
 * began (total_ms counts from there: the upload's decoding and any wait for the model too). */
struct run_info {
    const char *model;
    double started;              /* now_ms() when the handler began */
    const struct audio_request *req;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static json_object *timings_json(const struct transcribe_result *r, const struct run_info *ri)
{
    json_object *t = json_object_new_object();
    json_object_object_add(t, "load_ms", jnum(r->load_ms));
    json_object_object_add(t, "transcribe_ms", jnum(r->transcribe_ms));
    json_object_object_add(t, "total_ms", jnum(now_ms() - ri->started));
    json_object_object_add(t, "mel_ms", jnum(r->mel_ms));
    json_object_object_add(t, "encode_ms", jnum(r->encode_ms));
    json_object_object_add(t, "decode_ms", jnum(r->decode_ms));
    json_object_object_add(t, "windows", json_object_new_int(r->n_windows));
    json_object_object_add(t, "decoder_steps", json_object_new_int(r->n_decoder_steps));
    json_object_object_add(t, "passes", json_object_new_int(r->n_passes));
    if (ri->req->o.vad.on)
        json_object_object_add(t, "vad_ms", jnum(r->vad_ms));
    return t;
}

/* The "inferd" object: {model, language, duration, timings {load_ms, transcribe_ms, total_ms,
 * mel_ms, encode_ms, decode_ms, windows, decoder_steps, passes, vad_ms (with VAD)}, vocabulary {terms, used} (when the request had terms), vad {chunks,
 * speech_seconds} (with VAD)}. */
static json_object *extension_json(const struct transcribe_result *r, const struct run_info *ri)
{
    json_object *x = json_object_new_object();
    json_object_object_add(x, "model", json_object_new_string(ri->model));
    json_object_object_add(x, "language", json_object_new_string(r->language));
    json_object_object_add(x, "duration", jnum(r->duration));
    json_object_object_add(x, "timings", timings_json(r, ri));
    if (ri->req->o.n_vocabulary > 0) {
        json_object *v = json_object_new_object();
        json_object_object_add(v, "terms", json_object_new_int(ri->req->o.n_vocabulary));
        json_object_object_add(v, "used", json_object_new_int(r->n_vocabulary_used));
        json_object_object_add(x, "vocabulary", v);
    }
    if (ri->req->o.vad.on) {
        json_object *v = json_object_new_object();
        json_object_object_add(v, "chunks", json_object_new_int(r->n_vad_chunks));
        json_object_object_add(v, "speech_seconds", jnum(r->vad_speech_seconds));
        json_object_object_add(x, "vad", v);
    }
    return x;
}

/* The body of a finished transcription in the request's JSON shapes (json or verbose_json),
 * with the "inferd" extension when ri is given (a dictation session's transcript has none). */
static json_object *result_json(const struct transcribe_result *r, enum audio_format fmt,
                                enum transcribe_task task, bool words, const struct run_info *ri)
{
    json_object *o;
    if (fmt == AUDIO_FMT_VERBOSE_JSON) {
        o = verbose_json(r, task, words);
    } else {
        o = json_object_new_object();
        json_object_object_add(o, "text", json_object_new_string(r->text));
        if (words)
            json_object_object_add(o, "words", words_json(r));
    }
    if (ri)
        json_object_object_add(o, "inferd", extension_json(r, ri));
    return o;
}

/* A response with the extension headers: x-inferd-language (the language's code) and
 * x-inferd-timings (the timings object as compact JSON). */
static void send_with_headers(struct http_exchange *x, const char *content_type, const char *body,
                              size_t len, const struct transcribe_result *r,
                              const struct run_info *ri)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp) {
        json_object *t = timings_json(r, ri);
        MHD_add_response_header(resp, "Content-Type", content_type);
        MHD_add_response_header(resp, "x-inferd-language", r->language);
        MHD_add_response_header(resp, "x-inferd-timings",
                                json_object_to_json_string_ext(t, JSON_C_TO_STRING_PLAIN));
        json_object_put(t);
    }
    http_send_response(x, 200, resp);
}

static void send_object(struct http_exchange *x, int status, json_object *o)
{
    size_t len = 0;
    const char *s =
        json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, status, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the transcript");
    json_object_put(o);
}

static void send_result(struct http_exchange *x, const struct transcribe_result *r,
                        enum audio_format fmt, enum transcribe_task task, bool words,
                        const struct run_info *ri)
{
    struct strbuf b = {0};
    switch (fmt) {
    case AUDIO_FMT_TEXT:
        strbuf_printf(&b, "%s\n", r->text);
        send_with_headers(x, "text/plain; charset=utf-8", b.data, b.len, r, ri);
        break;
    case AUDIO_FMT_SRT:
    case AUDIO_FMT_VTT:
        subtitles(r, fmt == AUDIO_FMT_VTT, &b);
        send_with_headers(x, fmt == AUDIO_FMT_VTT ? "text/vtt; charset=utf-8" : "application/x-subrip",
                          b.data ? b.data : "", b.len, r, ri);
        break;
    default: {
        json_object *o = result_json(r, fmt, task, words, ri);
        size_t len = 0;
        const char *s = json_object_to_json_string_length(
            o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
        if (s)
            send_with_headers(x, "application/json", s, len, r, ri);
        else
            http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the transcript");
        json_object_put(o);
    }
    }
    strbuf_free(&b);
}

/* A transcription's failure as its status: bad options 400, memory 500, the rest 503. */
static void send_run_error(struct http_exchange *x, int rc, const struct err *err)
{
    int status = rc == -INFERD_EINVAL ? 400 : rc == -INFERD_ENOMEM ? 500 : 503;
    http_send_errorf(x, status, status == 400 ? API_ERROR_INVALID_REQUEST : API_ERROR_SERVER,
                     NULL, NULL, "%s", err->msg);
}

/* ---- streaming as decoded ------------------------------------------------------------------------ */

/* The transcription runs on a thread of its own; its callbacks append events under the lock
 * and wake the connection's producer, which sends them as they come. When the connection is
 * done with the stream (finished, or the client went away) release marks it cancelled, which
 * the next callback reports to the transcriber, and waits for the thread. */
struct audio_stream {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct strbuf events;
    size_t sent;
    bool finished;
    atomic_bool cancelled;       /* the transcription's cancel flag */
    int client_fd;               /* for noticing a client that went away */
    pthread_t thread;
    struct transcriber *t;       /* borrowed */
    struct audio_request req;    /* owned */
    struct audio_pcm pcm;        /* owned */
    enum transcribe_task task;
    struct run_info info;        /* its req points at req above */
};

/* Appends one event (o consumed) under the lock; returns whether the stream was cancelled. */
static bool stream_push(struct audio_stream *s, const char *event, json_object *o)
{
    pthread_mutex_lock(&s->lock);
    strbuf_printf(&s->events, "event: %s\ndata: %s\n\n", event,
                  json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                        JSON_C_TO_STRING_NOSLASHESCAPE));
    bool cancelled = atomic_load(&s->cancelled);
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    json_object_put(o);
    return cancelled;
}

static int stream_segment(void *ctx, const struct transcribe_segment *seg)
{
    json_object *o = json_object_new_object(), *g = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string("transcript.text.delta"));
    json_object_object_add(o, "delta", json_object_new_string(seg->text));
    json_object_object_add(g, "id", json_object_new_int(seg->id));
    json_object_object_add(g, "start", jnum(seg->start));
    json_object_object_add(g, "end", jnum(seg->end));
    if (seg->n_words) {
        json_object *w = json_object_new_array();
        for (int k = 0; k < seg->n_words; k++) {
            json_object *wo = json_object_new_object();
            json_object_object_add(wo, "word", json_object_new_string(seg->words[k].text));
            json_object_object_add(wo, "start", jnum(seg->words[k].start));
            json_object_object_add(wo, "end", jnum(seg->words[k].end));
            json_object_array_add(w, wo);
        }
        json_object_object_add(g, "words", w);
    }
    json_object_object_add(o, "segment", g);
    return stream_push(ctx, "transcript.text.delta", o);
}

static int stream_progress(void *ctx, double done, double total)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string("transcript.progress"));
    json_object_object_add(o, "done", jnum(done));
    json_object_object_add(o, "total", jnum(total));
    return stream_push(ctx, "transcript.progress", o);
}

static void *stream_run(void *arg)
{
    struct audio_stream *s = arg;
    struct transcribe_result r;
    struct err err = {0};
    s->req.o.on_segment = stream_segment;
    s->req.o.on_progress = stream_progress;
    s->req.o.ctx = s;
    s->req.o.cancel = &s->cancelled;
    int rc = transcriber_run(s->t, s->pcm.samples, s->pcm.n, &s->req.o, &r, &err);
    if (rc == 0) {
        json_object *o = result_json(&r, s->req.fmt == AUDIO_FMT_VERBOSE_JSON
                                             ? AUDIO_FMT_VERBOSE_JSON : AUDIO_FMT_JSON,
                                     s->task, s->req.o.word_timestamps, &s->info);
        json_object_object_add(o, "type", json_object_new_string("transcript.text.done"));
        stream_push(s, "transcript.text.done", o);
        transcribe_result_free(&r);
    } else {
        json_object *o = json_object_new_object(), *e = json_object_new_object();
        json_object_object_add(o, "type", json_object_new_string("error"));
        json_object_object_add(o, "message", json_object_new_string(err.msg));
        json_object_object_add(e, "message", json_object_new_string(err.msg));
        json_object_object_add(o, "error", e);
        stream_push(s, "error", o);
    }
    pthread_mutex_lock(&s->lock);
    s->finished = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static bool stream_produce(void *ctx, struct strbuf *out, bool *done)
{
    struct audio_stream *s = ctx;
    pthread_mutex_lock(&s->lock);
    while (s->sent == s->events.len && !s->finished) {
        /* between events, look for a client that went away every 200 ms: it stops the decode */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&s->wake, &s->lock, &ts) != 0 &&
            http_client_gone(s->client_fd)) {
            atomic_store(&s->cancelled, true);
            pthread_mutex_unlock(&s->lock);
            return false;
        }
    }
    strbuf_append(out, s->events.data + s->sent, s->events.len - s->sent);
    s->sent = s->events.len;
    *done = s->finished;
    pthread_mutex_unlock(&s->lock);
    return true;
}

static void stream_release(void *ctx)
{
    struct audio_stream *s = ctx;
    atomic_store(&s->cancelled, true);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    strbuf_free(&s->events);
    audio_request_free(&s->req);
    audio_pcm_free(&s->pcm);
    free(s);
}

/* ---- the transcription routes --------------------------------------------------------------------- */

static bool have_model(struct http_exchange *x)
{
    if (x->srv->transcriber)
        return true;
    http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, "model", "model_unavailable",
                     "this server has no Whisper model; start it with --whisper-model DIR");
    return false;
}

static void handle(struct http_exchange *x, enum transcribe_task task)
{
    struct server *srv = x->srv;
    double started = now_ms();
    if (!have_model(x))
        return;
    struct audio_request req;
    struct api_error e;
    if (audio_request_parse(http_header(x, "Content-Type"), x->body, x->body_len, true,
                            srv->max_audio_bytes, transcriber_default_beam(srv->transcriber),
                            &req, &e) < 0) {
        http_send_error(x, &e);
        return;
    }
    struct audio_pcm pcm;
    struct err err = {0};
    int rc = audio_decode_16k(req.file, req.file_len, 0, srv->audio_threads, &pcm, &err);
    if (rc < 0) {
        decode_error(rc, &err, &e);
        audio_request_free(&req);
        http_send_error(x, &e);
        return;
    }
    if (pcm.n < AUDIO_SAMPLE_RATE / 10) {
        audio_pcm_free(&pcm);
        audio_request_free(&req);
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "file", "audio_too_short",
                         "the audio lasts %.3f s; at least 0.1 s is needed",
                         (double)pcm.n / AUDIO_SAMPLE_RATE);
        return;
    }
    /* translations are always into English; a language there names the source */
    if (req.stream) {
        struct audio_stream *s = calloc(1, sizeof *s);
        if (!s) {
            audio_pcm_free(&pcm);
            audio_request_free(&req);
            http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
            return;
        }
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->wake, NULL);
        s->t = srv->transcriber;
        s->client_fd = x->client_fd;
        atomic_init(&s->cancelled, false);
        s->req = req;
        s->req.o.prompt = s->req.prompt; /* the struct moved: its pointers follow */
        s->req.o.language = s->req.language[0] ? s->req.language : NULL;
        s->req.o.vocabulary = (const char *const *)s->req.vocabulary;
        s->pcm = pcm;
        s->task = task;
        s->info = (struct run_info){transcriber_id(srv->transcriber), started, &s->req};
        if (pthread_create(&s->thread, NULL, stream_run, s) != 0) {
            pthread_mutex_destroy(&s->lock);
            pthread_cond_destroy(&s->wake);
            strbuf_free(&s->events);
            audio_request_free(&s->req);
            audio_pcm_free(&s->pcm);
            free(s);
            http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "could not start a thread");
            return;
        }
        http_send_stream(x, 200, "text/event-stream",
                         (struct http_stream){stream_produce, stream_release, s});
        return;
    }
    struct transcribe_result r;
    rc = transcriber_run(srv->transcriber, pcm.samples, pcm.n, &req.o, &r, &err);
    audio_pcm_free(&pcm);
    if (rc < 0)
        send_run_error(x, rc, &err);
    else
        send_result(x, &r, req.fmt, task, req.o.word_timestamps,
                    &(struct run_info){transcriber_id(srv->transcriber), started, &req});
    if (rc == 0)
        transcribe_result_free(&r);
    audio_request_free(&req);
}

void audio_transcriptions(struct http_exchange *x) { handle(x, TRANSCRIBE_TASK_TRANSCRIBE); }
void audio_translations(struct http_exchange *x) { handle(x, TRANSCRIBE_TASK_TRANSLATE); }

void audio_unload(struct http_exchange *x)
{
    if (!have_model(x))
        return;
    bool was = transcriber_unload(x->srv->transcriber);
    char body[96];
    int n = snprintf(body, sizeof body, "{\"unloaded\":%s}", was ? "true" : "false");
    http_send_json(x, 200, body, (size_t)n);
}

/* ---- dictation sessions --------------------------------------------------------------------------- */

static void session_unknown(struct http_exchange *x)
{
    http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, "unknown_session",
                     "unknown transcription session");
}

void audio_session_create(struct http_exchange *x)
{
    struct server *srv = x->srv;
    if (!have_model(x))
        return;
    struct audio_request req;
    struct api_error e;
    if (audio_request_parse(http_header(x, "Content-Type"), x->body, x->body_len, false, 0,
                            transcriber_default_beam(srv->transcriber), &req, &e) < 0) {
        http_send_error(x, &e);
        return;
    }
    if (req.fmt != AUDIO_FMT_JSON && req.fmt != AUDIO_FMT_VERBOSE_JSON) {
        audio_request_free(&req);
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "response_format", "invalid_value",
                         "a session answers json or verbose_json");
        return;
    }
    char id[TRANSCRIBER_SESSION_ID];
    struct err err = {0};
    int tag = (int)req.fmt | (req.o.word_timestamps ? 0x100 : 0);
    int rc = transcriber_session_open(srv->transcriber, &req.o, tag, id, &err);
    if (rc < 0) {
        audio_request_free(&req);
        if (rc == -INFERD_EBUSY)
            http_send_errorf(x, 429, API_ERROR_RATE_LIMIT, NULL, "too_many_sessions",
                             "too many open transcription sessions (at most %d)",
                             TRANSCRIBER_MAX_SESSIONS);
        else
            http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "%s", err.msg);
        return;
    }
    json_object *o = json_object_new_object(), *v = json_object_new_array();
    json_object_object_add(o, "id", json_object_new_string(id));
    json_object_object_add(o, "object", json_object_new_string("transcription.session"));
    json_object_object_add(o, "model", json_object_new_string(transcriber_id(srv->transcriber)));
    for (int i = 0; i < req.o.n_vocabulary; i++)
        json_object_array_add(v, json_object_new_string(req.vocabulary[i]));
    json_object_object_add(o, "vocabulary", v);
    audio_request_free(&req);
    send_object(x, 200, o);
}

/* x->id is "{id}/audio" or "{id}/finish": the id into id, the action returned. */
static const char *session_action(const struct http_exchange *x, char *id, size_t cap)
{
    const char *slash = strchr(x->id, '/');
    if (!slash || (size_t)(slash - x->id) >= cap)
        return NULL;
    snprintf(id, cap, "%.*s", (int)(slash - x->id), x->id);
    return slash + 1;
}

void audio_session_post(struct http_exchange *x)
{
    struct server *srv = x->srv;
    if (!have_model(x))
        return;
    char id[TRANSCRIBER_SESSION_ID];
    const char *action = session_action(x, id, sizeof id);
    struct err err = {0};
    struct api_error e;
    if (action && !strcmp(action, "audio")) {
        if (srv->max_audio_bytes && x->body_len > srv->max_audio_bytes) {
            http_send_errorf(x, 413, API_ERROR_INVALID_REQUEST, "body", "file_too_large",
                             "the chunk is %zu bytes; at most %zu are accepted (--max-audio-mb)",
                             x->body_len, srv->max_audio_bytes);
            return;
        }
        struct audio_pcm pcm;
        if (audio_chunk_decode(http_header(x, "Content-Type"), (const uint8_t *)x->body,
                               x->body_len, srv->audio_threads, &pcm, &e) < 0) {
            http_send_error(x, &e);
            return;
        }
        struct transcribe_session_status st;
        int rc = transcriber_session_append(srv->transcriber, id, pcm.samples, pcm.n, &st, &err);
        audio_pcm_free(&pcm);
        if (rc == -INFERD_ENOENT) {
            session_unknown(x);
            return;
        }
        if (rc < 0) {
            send_run_error(x, rc, &err);
            return;
        }
        json_object *o = json_object_new_object();
        json_object_object_add(o, "id", json_object_new_string(id));
        json_object_object_add(o, "samples", json_object_new_int64((int64_t)st.samples));
        json_object_object_add(o, "duration", jnum(st.duration));
        json_object_object_add(o, "speech", json_object_new_boolean(st.speech));
        json_object_object_add(o, "segments", json_object_new_int(st.n_segments));
        send_object(x, 200, o);
        return;
    }
    if (action && !strcmp(action, "finish")) {
        struct transcribe_result r;
        int tag = 0;
        int rc = transcriber_session_finish(srv->transcriber, id, &r, &tag, &err);
        if (rc == -INFERD_ENOENT) {
            session_unknown(x);
            return;
        }
        if (rc < 0) {
            send_run_error(x, rc, &err);
            return;
        }
        json_object *o = result_json(&r, (enum audio_format)(tag & 0xff),
                                     TRANSCRIBE_TASK_TRANSCRIBE, (tag & 0x100) != 0, NULL);
        json_object_object_add(o, "id", json_object_new_string(id));
        transcribe_result_free(&r);
        send_object(x, 200, o);
        return;
    }
    http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, NULL,
                     "not found: a session takes POST .../{id}/audio and .../{id}/finish");
}

void audio_session_delete(struct http_exchange *x)
{
    if (!have_model(x))
        return;
    if (strchr(x->id, '/') || !transcriber_session_close(x->srv->transcriber, x->id)) {
        session_unknown(x);
        return;
    }
    http_send_text(x, 204, "text/plain", "", 0);
}
