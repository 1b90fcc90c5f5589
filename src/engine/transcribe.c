/* engine/transcribe.c — Whisper decoding as openai-whisper and transformers do it: per 30 s window
 * the log-mel features, one encoder pass, a prompt of special tokens, token by token decoding under
 * the timestamp rules, temperature fallback, segments cut at timestamp pairs and the next window
 * sought from the last timestamp. */
#include "engine/transcribe.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "audio/audio.h"
#include "base/timer.h"
#include "model/whisper.h"
#include "text/tokenizer.h"

#define MAX_PROMPT_TOKENS 223    /* openai-whisper: n_text_ctx / 2 - 1 of the previous text */
#define MAX_SAMPLE_LEN 224       /* tokens decoded per window at most */
#define SECONDS_PER_TS 0.02      /* a timestamp token's step */
#define SAMPLES_PER_TS 320
#define MAX_INITIAL_TS 50        /* the first timestamp is at most 1.0 s */
#define COMPRESSION_RATIO_MAX 2.4f
#define LOGPROB_MIN -1.0f

/* Whisper's languages in its token order, code then English name. */
static const char *const languages[][2] = {
    {"en", "english"}, {"zh", "chinese"}, {"de", "german"}, {"es", "spanish"},
    {"ru", "russian"}, {"ko", "korean"}, {"fr", "french"}, {"ja", "japanese"},
    {"pt", "portuguese"}, {"tr", "turkish"}, {"pl", "polish"}, {"ca", "catalan"},
    {"nl", "dutch"}, {"ar", "arabic"}, {"sv", "swedish"}, {"it", "italian"},
    {"id", "indonesian"}, {"hi", "hindi"}, {"fi", "finnish"}, {"vi", "vietnamese"},
    {"he", "hebrew"}, {"uk", "ukrainian"}, {"el", "greek"}, {"ms", "malay"},
    {"cs", "czech"}, {"ro", "romanian"}, {"da", "danish"}, {"hu", "hungarian"},
    {"ta", "tamil"}, {"no", "norwegian"}, {"th", "thai"}, {"ur", "urdu"},
    {"hr", "croatian"}, {"bg", "bulgarian"}, {"lt", "lithuanian"}, {"la", "latin"},
    {"mi", "maori"}, {"ml", "malayalam"}, {"cy", "welsh"}, {"sk", "slovak"},
    {"te", "telugu"}, {"fa", "persian"}, {"lv", "latvian"}, {"bn", "bengali"},
    {"sr", "serbian"}, {"az", "azerbaijani"}, {"sl", "slovenian"}, {"kn", "kannada"},
    {"et", "estonian"}, {"mk", "macedonian"}, {"br", "breton"}, {"eu", "basque"},
    {"is", "icelandic"}, {"hy", "armenian"}, {"ne", "nepali"}, {"mn", "mongolian"},
    {"bs", "bosnian"}, {"kk", "kazakh"}, {"sq", "albanian"}, {"sw", "swahili"},
    {"gl", "galician"}, {"mr", "marathi"}, {"pa", "punjabi"}, {"si", "sinhala"},
    {"km", "khmer"}, {"sn", "shona"}, {"yo", "yoruba"}, {"so", "somali"},
    {"af", "afrikaans"}, {"oc", "occitan"}, {"ka", "georgian"}, {"be", "belarusian"},
    {"tg", "tajik"}, {"sd", "sindhi"}, {"gu", "gujarati"}, {"am", "amharic"},
    {"yi", "yiddish"}, {"lo", "lao"}, {"uz", "uzbek"}, {"fo", "faroese"},
    {"ht", "haitian creole"}, {"ps", "pashto"}, {"tk", "turkmen"}, {"nn", "nynorsk"},
    {"mt", "maltese"}, {"sa", "sanskrit"}, {"lb", "luxembourgish"}, {"my", "myanmar"},
    {"bo", "tibetan"}, {"tl", "tagalog"}, {"mg", "malagasy"}, {"as", "assamese"},
    {"tt", "tatar"}, {"haw", "hawaiian"}, {"ln", "lingala"}, {"ha", "hausa"},
    {"ba", "bashkir"}, {"jw", "javanese"}, {"su", "sundanese"}, {"yue", "cantonese"},
};
#define N_LANGUAGES ((int)(sizeof languages / sizeof languages[0]))

const char *transcribe_language_code(const char *name)
{
    for (int i = 0; name && i < N_LANGUAGES; i++)
        if (!strcasecmp(name, languages[i][0]) || !strcasecmp(name, languages[i][1]))
            return languages[i][0];
    return NULL;
}

/* The special tokens the prompt and the rules use, looked up by their text. */
struct special_ids {
    int32_t eot, sot, transcribe, translate, no_timestamps, ts_begin, prev;
    int32_t lang[N_LANGUAGES]; /* -1 where the vocabulary lacks it */
};

struct transcriber {
    char *dir;                    /* owned */
    char id[128];
    struct backend *be;           /* borrowed */
    pthread_mutex_t lock;         /* one transcription (or load / unload) at a time */
    struct whisper_model *model;  /* owned; NULL while unloaded */
    struct whisper_state *state;  /* owned */
    struct tokenizer *tok;        /* owned */
    struct audio_mel mel;         /* owned */
    struct special_ids ids;
    float *features, *logits;     /* owned host buffers: one window's mel, one row of logits */
    pthread_mutex_t stats_lock;
    struct transcriber_stats stats;
    double last_used;
};

static int32_t piece(const struct tokenizer *tok, const char *text)
{
    return tok_piece_to_id(tok, text);
}

static int find_ids(struct transcriber *t, struct err *err)
{
    struct special_ids *s = &t->ids;
    s->eot = piece(t->tok, "<|endoftext|>");
    s->sot = piece(t->tok, "<|startoftranscript|>");
    s->transcribe = piece(t->tok, "<|transcribe|>");
    s->translate = piece(t->tok, "<|translate|>");
    s->no_timestamps = piece(t->tok, "<|notimestamps|>");
    s->ts_begin = piece(t->tok, "<|0.00|>");
    s->prev = piece(t->tok, "<|startofprev|>");
    for (int i = 0; i < N_LANGUAGES; i++) {
        char name[16];
        snprintf(name, sizeof name, "<|%s|>", languages[i][0]);
        s->lang[i] = piece(t->tok, name);
    }
    int vocab = t->model->config.vocab_size;
    int32_t need[] = {s->eot, s->sot, s->no_timestamps, s->ts_begin};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i] < 0 || need[i] >= vocab)
            return err_set(err, INFERD_EFORMAT,
                           "%s: tokenizer.json lacks Whisper's special tokens (<|endoftext|>, "
                           "<|startoftranscript|>, <|notimestamps|>, <|0.00|>) within the "
                           "model's %d ids",
                           t->dir, vocab);
    return 0;
}

int transcriber_create(const char *dir, struct backend *be, struct transcriber **out,
                       struct err *err)
{
    struct transcriber *t = calloc(1, sizeof *t);
    if (!t || !(t->dir = strdup(dir))) {
        free(t);
        return err_set(err, INFERD_ENOMEM, "out of memory for the Whisper model");
    }
    const char *base = strrchr(dir, '/');
    size_t len = strlen(dir);
    while (base && base[1] == '\0' && base > dir) { /* "models/x/" names x */
        len = (size_t)(base - dir);
        const char *p = base - 1;
        while (p > dir && *p != '/')
            p--;
        base = *p == '/' ? p : NULL;
    }
    const char *start = base ? base + 1 : dir;
    snprintf(t->id, sizeof t->id, "%.*s", (int)(dir + len - start), start);
    t->be = be;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->stats_lock, NULL);
    t->last_used = now_s();
    *out = t;
    return 0;
}

const char *transcriber_id(const struct transcriber *t) { return t->id; }

static void unload_locked(struct transcriber *t)
{
    whisper_state_free(t->state);
    whisper_free(t->model);
    tok_free(t->tok);
    audio_mel_free(&t->mel);
    free(t->features);
    free(t->logits);
    t->state = NULL;
    t->model = NULL;
    t->tok = NULL;
    t->features = t->logits = NULL;
    pthread_mutex_lock(&t->stats_lock);
    t->stats.loaded = false;
    pthread_mutex_unlock(&t->stats_lock);
}

static int load_locked(struct transcriber *t, struct err *err)
{
    if (t->model)
        return 0;
    int rc = whisper_load(t->dir, t->be, &t->model, err);
    if (rc == 0)
        rc = tok_load(t->dir, &t->tok, err);
    if (rc == 0)
        rc = whisper_state_create(t->model, &t->state, err);
    if (rc == 0)
        rc = audio_mel_init(t->model->config.n_mels, &t->mel, err);
    if (rc == 0)
        rc = find_ids(t, err);
    if (rc == 0 && 2 * t->model->config.max_source_positions != AUDIO_WINDOW_FRAMES)
        rc = err_set(err, INFERD_EUNSUPPORTED,
                     "%s: max_source_positions %d (Whisper's 30 s windows need 1500)", t->dir,
                     t->model->config.max_source_positions);
    if (rc == 0) {
        t->features = malloc((size_t)t->model->config.n_mels * AUDIO_WINDOW_FRAMES * sizeof(float));
        t->logits = malloc((size_t)t->model->config.vocab_size * sizeof(float));
        if (!t->features || !t->logits)
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the Whisper buffers");
    }
    if (rc < 0) {
        unload_locked(t);
        return err_wrap(err, "loading the Whisper model %s", t->dir);
    }
    pthread_mutex_lock(&t->stats_lock);
    t->stats.loaded = true;
    pthread_mutex_unlock(&t->stats_lock);
    return 0;
}

int transcriber_load(struct transcriber *t, struct err *err)
{
    pthread_mutex_lock(&t->lock);
    int rc = load_locked(t, err);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

bool transcriber_unload(struct transcriber *t)
{
    pthread_mutex_lock(&t->lock);
    bool was = t->model != NULL;
    unload_locked(t);
    pthread_mutex_unlock(&t->lock);
    return was;
}

bool transcriber_unload_idle(struct transcriber *t, double idle_s)
{
    if (pthread_mutex_trylock(&t->lock) != 0)
        return false; /* busy: not idle */
    bool done = false;
    pthread_mutex_lock(&t->stats_lock);
    double last = t->last_used;
    pthread_mutex_unlock(&t->stats_lock);
    if (t->model && now_s() - last >= idle_s) {
        unload_locked(t);
        done = true;
    }
    pthread_mutex_unlock(&t->lock);
    return done;
}

void transcriber_free(struct transcriber *t)
{
    if (!t)
        return;
    unload_locked(t);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->stats_lock);
    free(t->dir);
    free(t);
}

void transcriber_stats(struct transcriber *t, struct transcriber_stats *out)
{
    pthread_mutex_lock(&t->stats_lock);
    *out = t->stats;
    out->idle_seconds = now_s() - t->last_used;
    pthread_mutex_unlock(&t->stats_lock);
}

void transcribe_result_free(struct transcribe_result *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_segments; i++) {
        free(r->segments[i].text);
        free(r->segments[i].tokens);
    }
    free(r->segments);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* ---- one window -------------------------------------------------------------- */

/* A growable list of token ids. */
struct ids {
    int32_t *v;
    int n, cap;
};

static int ids_push(struct ids *l, int32_t id)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        int32_t *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return -INFERD_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = id;
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double log_sum_exp(const float *x, int lo, int hi)
{
    float mx = -INFINITY;
    for (int i = lo; i < hi; i++)
        if (x[i] > mx)
            mx = x[i];
    if (mx == -INFINITY)
        return -INFINITY;
    double s = 0;
    for (int i = lo; i < hi; i++)
        s += exp((double)x[i] - mx);
    return mx + log(s);
}

/* The logits filters of generation: suppressed tokens, then Whisper's
 * timestamp rules (ApplyTimestampRules) over the tokens sampled so far. */
static void apply_rules(const struct transcriber *t, float *x, const int32_t *seq, int n_seq,
                        bool timestamps)
{
    const struct whisper_config *c = &t->model->config;
    const struct special_ids *s = &t->ids;
    int vocab = c->vocab_size;
    for (int i = 0; i < c->n_suppress; i++)
        x[c->suppress[i]] = -INFINITY;
    if (n_seq == 0)
        for (int i = 0; i < c->n_begin_suppress; i++)
            x[c->begin_suppress[i]] = -INFINITY;
    if (!timestamps)
        return;
    x[s->no_timestamps] = -INFINITY;
    bool last_ts = n_seq >= 1 && seq[n_seq - 1] >= s->ts_begin;
    bool penult_ts = n_seq < 2 || seq[n_seq - 2] >= s->ts_begin;
    if (last_ts) {
        if (penult_ts) /* a pair closes a segment: text (or the end) comes next */
            for (int i = s->ts_begin; i < vocab; i++)
                x[i] = -INFINITY;
        else /* an opened segment's end: a timestamp or the end of text */
            for (int i = 0; i < s->eot; i++)
                x[i] = -INFINITY;
    }
    int32_t last = -1;
    for (int i = n_seq - 1; i >= 0 && last < 0; i--)
        if (seq[i] >= s->ts_begin)
            last = seq[i];
    if (last >= 0) { /* timestamps never go back */
        int32_t from = last_ts && !penult_ts ? last : last + 1;
        for (int i = s->ts_begin; i < from && i < vocab; i++)
            x[i] = -INFINITY;
    }
    if (n_seq == 0) { /* start with a timestamp, within the first second */
        for (int i = 0; i < s->ts_begin; i++)
            x[i] = -INFINITY;
        for (int i = s->ts_begin + MAX_INITIAL_TS + 1; i < vocab; i++)
            x[i] = -INFINITY;
    }
    /* when the timestamps together outweigh every text token, take a timestamp */
    double ts_mass = log_sum_exp(x, s->ts_begin, vocab);
    float text_max = -INFINITY;
    for (int i = 0; i < s->ts_begin; i++)
        if (x[i] > text_max)
            text_max = x[i];
    double z = log_sum_exp(x, 0, vocab);
    if (ts_mass - z > (double)text_max - z)
        for (int i = 0; i < s->ts_begin; i++)
            x[i] = -INFINITY;
}

/* Greedy (temperature 0) or a draw from softmax(x / temperature); *logprob
 * gets the pick's log probability under softmax(x). */
static int32_t pick(const float *x, int vocab, float temperature, uint64_t *rng, float *logprob)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (x[i] > x[best])
            best = i;
    int32_t tok = best;
    if (temperature > 0 && x[best] > -INFINITY) {
        double sum = 0;
        for (int i = 0; i < vocab; i++)
            sum += exp(((double)x[i] - x[best]) / temperature);
        double u = (double)(rng_next(rng) >> 11) * 0x1.0p-53 * sum;
        for (int i = 0; i < vocab; i++) {
            u -= exp(((double)x[i] - x[best]) / temperature);
            if (u < 0) {
                tok = i;
                break;
            }
        }
    }
    *logprob = (float)((double)x[tok] - log_sum_exp(x, 0, vocab));
    return tok;
}

/* The text of ids, leaving out every special id (eot and above: timestamps
 * are plain added tokens in some tokenizer.json files, so skip_special alone
 * would print them). */
static int text_of(const struct transcriber *t, const int32_t *ids, int n, char **text,
                   size_t *len, struct err *err)
{
    int32_t *keep = malloc((size_t)(n ? n : 1) * sizeof *keep);
    if (!keep)
        return err_set(err, INFERD_ENOMEM, "out of memory decoding");
    int k = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] < t->ids.eot)
            keep[k++] = ids[i];
    int rc = tok_decode(t->tok, keep, k, true, text, len, err);
    free(keep);
    return rc;
}

static float compression_ratio(const char *text, size_t len)
{
    if (len == 0)
        return 0;
    uLongf cap = compressBound((uLong)len);
    Bytef *buf = malloc(cap);
    if (!buf)
        return 0;
    float r = compress2(buf, &cap, (const Bytef *)text, (uLong)len, 6) == Z_OK
                  ? (float)len / (float)cap
                  : 0;
    free(buf);
    return r;
}

/* One window's decoding at one temperature: its sampled tokens (after the
 * prompt, without the end of text) in *out. */
struct window_try {
    struct ids tokens;
    float sum_logprob, avg_logprob, compression_ratio;
    char *text;
};

static int decode_window(struct transcriber *t, const struct ids *prompt, float temperature,
                         bool timestamps, uint64_t *rng, struct window_try *w, struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    whisper_rewind(t->state, 0);
    int rc = whisper_decode(t->state, prompt->v, prompt->n, t->logits, err);
    int limit = c->max_target_positions - prompt->n - 1;
    if (limit > MAX_SAMPLE_LEN)
        limit = MAX_SAMPLE_LEN;
    while (rc == 0 && w->tokens.n < limit) {
        apply_rules(t, t->logits, w->tokens.v, w->tokens.n, timestamps);
        float lp;
        int32_t tok = pick(t->logits, c->vocab_size, temperature, rng, &lp);
        if (tok == t->ids.eot)
            break;
        w->sum_logprob += lp;
        if (ids_push(&w->tokens, tok) < 0)
            return err_set(err, INFERD_ENOMEM, "out of memory decoding");
        if (w->tokens.n < limit)
            rc = whisper_decode(t->state, &tok, 1, t->logits, err);
    }
    if (rc < 0)
        return rc;
    w->avg_logprob = w->sum_logprob / (float)(w->tokens.n + 1);
    size_t len;
    if ((rc = text_of(t, w->tokens.v, w->tokens.n, &w->text, &len, err)) < 0)
        return rc;
    w->compression_ratio = compression_ratio(w->text, len);
    return 0;
}

static void window_try_free(struct window_try *w)
{
    free(w->tokens.v);
    free(w->text);
    memset(w, 0, sizeof *w);
}

static int add_segment(struct transcriber *t, struct transcribe_result *r, double start,
                       double end, const int32_t *tokens, int n, const struct window_try *w,
                       float temperature, const struct transcribe_options *o, struct err *err)
{
    struct transcribe_segment *g = realloc(r->segments, (size_t)(r->n_segments + 1) * sizeof *g);
    if (!g)
        return err_set(err, INFERD_ENOMEM, "out of memory for segments");
    r->segments = g;
    struct transcribe_segment *s = &g[r->n_segments];
    memset(s, 0, sizeof *s);
    size_t len;
    int rc = text_of(t, tokens, n, &s->text, &len, err);
    if (rc < 0)
        return rc;
    s->tokens = malloc((size_t)(n ? n : 1) * sizeof *s->tokens);
    if (!s->tokens) {
        free(s->text);
        return err_set(err, INFERD_ENOMEM, "out of memory for segments");
    }
    memcpy(s->tokens, tokens, (size_t)n * sizeof *tokens);
    s->n_tokens = n;
    s->id = r->n_segments++;
    s->start = start;
    s->end = end;
    s->temperature = temperature;
    s->avg_logprob = w->avg_logprob;
    s->compression_ratio = w->compression_ratio;
    if (o->on_segment && len && o->on_segment(o->ctx, s->text, len))
        return err_set(err, INFERD_EIO, "the client went away");
    return 0;
}

/* Cuts a window's tokens into segments at timestamp pairs (openai-whisper's
 * rule) and returns how many samples the window used. */
static int segment_window(struct transcriber *t, struct transcribe_result *r, size_t seek,
                          size_t window_len, const struct window_try *w, float temperature,
                          const struct transcribe_options *o, size_t *used, struct err *err)
{
    const int32_t *tok = w->tokens.v, tsb = t->ids.ts_begin;
    int n = w->tokens.n, rc;
    double offset = (double)seek / AUDIO_SAMPLE_RATE;
    *used = window_len;
    if (!o->timestamps || n == 0)
        return n == 0 ? 0
                      : add_segment(t, r, offset, offset + (double)window_len / AUDIO_SAMPLE_RATE,
                                    tok, n, w, temperature, o, err);
    bool single_end = n >= 2 && tok[n - 2] < tsb && tok[n - 1] >= tsb;
    int last_slice = 0;
    bool any_pair = false;
    for (int i = 1; i <= n; i++) {
        bool cut = i < n ? tok[i - 1] >= tsb && tok[i] >= tsb : single_end && any_pair;
        if (!cut)
            continue;
        any_pair = true;
        const int32_t *s = tok + last_slice;
        int len = i - last_slice;
        double start = offset + (s[0] - tsb) * SECONDS_PER_TS,
               end = offset + (s[len - 1] - tsb) * SECONDS_PER_TS;
        if ((rc = add_segment(t, r, start, end, s, len, w, temperature, o, err)) < 0)
            return rc;
        last_slice = i;
    }
    if (any_pair) {
        if (!single_end) /* seek to where the last whole segment ended */
            *used = (size_t)(tok[last_slice - 1] - tsb) * SAMPLES_PER_TS;
        if (*used == 0)
            *used = window_len;
        return 0;
    }
    double dur = (double)window_len / AUDIO_SAMPLE_RATE;
    for (int i = n - 1; i >= 0; i--)
        if (tok[i] >= tsb) {
            if (tok[i] != tsb)
                dur = (tok[i] - tsb) * SECONDS_PER_TS;
            break;
        }
    return add_segment(t, r, offset, offset + dur, tok, n, w, temperature, o, err);
}

static int detect_language(struct transcriber *t, int *lang, struct err *err)
{
    whisper_rewind(t->state, 0);
    int rc = whisper_decode(t->state, &t->ids.sot, 1, t->logits, err);
    if (rc < 0)
        return rc;
    int best = -1;
    for (int i = 0; i < N_LANGUAGES; i++) {
        int32_t id = t->ids.lang[i];
        if (id >= 0 && id < t->model->config.vocab_size &&
            (best < 0 || t->logits[id] > t->logits[t->ids.lang[best]]))
            best = i;
    }
    if (best < 0)
        return err_set(err, INFERD_EFORMAT, "the tokenizer has no language tokens to detect with");
    *lang = best;
    return 0;
}

static int run_locked(struct transcriber *t, const float *samples, size_t n,
                      const struct transcribe_options *o, struct transcribe_result *r,
                      struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    int lang = -1;
    if (o->language && *o->language) {
        const char *code = transcribe_language_code(o->language);
        for (int i = 0; code && i < N_LANGUAGES; i++)
            if (!strcmp(languages[i][0], code))
                lang = i;
        if (lang < 0)
            return err_set(err, INFERD_EINVAL, "language '%s' is not one Whisper knows",
                           o->language);
        if (!c->multilingual && lang != 0)
            return err_set(err, INFERD_EINVAL,
                           "the Whisper model %s is English-only; language '%s' is not available",
                           t->id, o->language);
        if (c->multilingual && t->ids.lang[lang] < 0)
            return err_set(err, INFERD_EINVAL, "the tokenizer has no token for language '%s'",
                           o->language);
    }
    if (o->task == TRANSCRIBE_TASK_TRANSLATE && (!c->multilingual || t->ids.translate < 0))
        return err_set(err, INFERD_EINVAL, "the Whisper model %s is English-only: it cannot translate",
                       t->id);
    r->duration = (double)n / AUDIO_SAMPLE_RATE;
    struct ids prev = {0}, prompt = {0};
    int rc = 0;
    if (o->prompt && *o->prompt) {
        int32_t *p;
        int np;
        char *spaced = malloc(strlen(o->prompt) + 2);
        if (!spaced)
            return err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
        sprintf(spaced, " %s", o->prompt); /* as openai-whisper encodes it */
        rc = tok_encode(t->tok, spaced, strlen(spaced), false, &p, &np, err);
        free(spaced);
        for (int i = 0; rc == 0 && i < np; i++)
            if (ids_push(&prev, p[i]) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
        if (rc == 0)
            free(p);
        if (rc < 0)
            goto out;
    }
    uint64_t rng = o->seed ? o->seed : 0x5eed;
    for (size_t seek = 0; seek < n || (n == 0 && seek == 0);) {
        size_t window_len = n - seek < AUDIO_WINDOW_SAMPLES ? n - seek : AUDIO_WINDOW_SAMPLES;
        if (n > 0 && window_len < AUDIO_SAMPLE_RATE / 100) /* under 10 ms: nothing to hear */
            break;
        audio_mel_window(&t->mel, samples + seek, window_len, t->features);
        if ((rc = whisper_encode(t->state, t->features, err)) < 0)
            goto out;
        if (c->multilingual && lang < 0) {
            if ((rc = detect_language(t, &lang, err)) < 0)
                goto out;
        }
        prompt.n = 0;
        if (prev.n && t->ids.prev >= 0) {
            ids_push(&prompt, t->ids.prev);
            int from = prev.n > MAX_PROMPT_TOKENS ? prev.n - MAX_PROMPT_TOKENS : 0;
            for (int i = from; i < prev.n; i++)
                ids_push(&prompt, prev.v[i]);
        }
        ids_push(&prompt, t->ids.sot);
        if (c->multilingual) {
            ids_push(&prompt, t->ids.lang[lang]);
            ids_push(&prompt, o->task == TRANSCRIBE_TASK_TRANSLATE ? t->ids.translate
                                                                  : t->ids.transcribe);
        }
        if (!o->timestamps && ids_push(&prompt, t->ids.no_timestamps) < 0) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
            goto out;
        }
        struct window_try w = {0};
        float temperature = o->temperature > 0 ? o->temperature : 0.0f;
        for (;;) {
            window_try_free(&w);
            if ((rc = decode_window(t, &prompt, temperature, o->timestamps, &rng, &w, err)) < 0) {
                window_try_free(&w);
                goto out;
            }
            bool failed = w.compression_ratio > COMPRESSION_RATIO_MAX || w.avg_logprob < LOGPROB_MIN;
            if (!failed || o->temperature > 0 || temperature >= 1.0f - 1e-6f)
                break;
            temperature += 0.2f;
        }
        size_t used;
        rc = segment_window(t, r, seek, window_len, &w, temperature, o, &used, err);
        /* the next window is conditioned on this one's text unless it was sampled hot */
        for (int i = 0; rc == 0 && temperature < 0.5f && i < w.tokens.n; i++)
            if (w.tokens.v[i] < t->ids.eot && ids_push(&prev, w.tokens.v[i]) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory decoding");
        if (temperature >= 0.5f)
            prev.n = 0;
        window_try_free(&w);
        if (rc < 0)
            goto out;
        seek += used;
        if (n == 0)
            break;
    }
    struct strbuf_lite { char *p; size_t n; } all = {0};
    for (int i = 0; i < r->n_segments; i++) {
        size_t l = strlen(r->segments[i].text);
        char *p = realloc(all.p, all.n + l + 1);
        if (!p) {
            free(all.p);
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the transcript");
            goto out;
        }
        memcpy(p + all.n, r->segments[i].text, l + 1);
        all.p = p;
        all.n += l;
    }
    r->text = all.p ? all.p : strdup("");
    snprintf(r->language, sizeof r->language, "%s", lang >= 0 ? languages[lang][0] : "en");
    if (!r->text)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the transcript");
out:
    free(prev.v);
    free(prompt.v);
    return rc;
}

int transcriber_run(struct transcriber *t, const float *samples, size_t n,
                    const struct transcribe_options *o, struct transcribe_result *out,
                    struct err *err)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&t->lock);
    double t0 = now_s();
    int rc = load_locked(t, err);
    if (rc == 0)
        rc = run_locked(t, samples, n, o, out, err);
    double t1 = now_s();
    pthread_mutex_lock(&t->stats_lock);
    t->last_used = t1;
    t->stats.requests++;
    if (rc < 0) {
        t->stats.failures++;
    } else {
        t->stats.audio_seconds += (double)n / AUDIO_SAMPLE_RATE;
        t->stats.compute_seconds += t1 - t0;
    }
    pthread_mutex_unlock(&t->stats_lock);
    pthread_mutex_unlock(&t->lock);
    if (rc < 0)
        transcribe_result_free(out);
    return rc;
}
