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
#include "base/logsumexp.h"
#include "base/threadpool.h"
#include "base/timer.h"
#include "engine/turns.h"
#include "model/whisper.h"
#include "text/tokenizer.h"

#define MAX_PROMPT_TOKENS 223    /* openai-whisper: n_text_ctx / 2 - 1 of the previous text
                                    (less where the model's config says it read less) */
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
    int32_t no_speech; /* <|nospeech|> (<|nocaptions|> in older vocabularies); -1: none */
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
    struct threadpool *mel_pool;  /* owned; the front end's threads (NULL: the caller's alone) */
    struct special_ids ids;
    float *features, *logits;     /* owned host buffers: one window's mel, a row of logits per
                                     decoder sequence */
    pthread_mutex_t stats_lock;
    struct transcriber_stats stats;
    double last_used;
    int default_beam;
    const atomic_bool *cancel;    /* the running transcription's (borrowed); NULL: none */
    struct device_turns *turns;   /* borrowed: the device's turns, shared with the chat engine;
                                     NULL: the device is ours alone */
    int max_new_tokens;           /* the running transcription's cap per window; 0: none */
    /* where the running transcription's time goes: each device turn is timed from the moment
     * it is taken (the backend syncs before it is given back) */
    double turn_t0, run_device_s, run_encode_s, run_mel_s;
    int run_turns, run_windows, run_passes;
    pthread_mutex_t sessions_lock; /* the list, and each session's work (one at a time) */
    struct session *sessions;     /* owned list */
    int n_sessions;
    uint64_t session_counter;
};

/* A dictation session: its options (strings owned), the audio so far and what of it is
 * transcribed. */
struct session {
    char id[TRANSCRIBER_SESSION_ID];
    int tag;
    struct transcribe_options o;
    char *language, *prompt;       /* owned; o's point here */
    char **vocabulary;             /* owned; o.vocabulary points here */
    float *pcm;                    /* owned; n samples (cap allocated) */
    size_t n, cap, cut;            /* [0, cut) transcribed */
    struct transcribe_result acc;  /* the segments of [0, cut) */
    char *last_text;               /* owned: the last window's text, the next one's prompt */
    bool speech;
    struct session *next;
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
    s->no_speech = piece(t->tok, "<|nospeech|>");
    if (s->no_speech < 0)
        s->no_speech = piece(t->tok, "<|nocaptions|>");
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
    pthread_mutex_init(&t->sessions_lock, NULL);
    t->last_used = now_s();
    t->default_beam = 1;
    t->session_counter = (uint64_t)(now_s() * 1e6) * 0x9e3779b97f4a7c15ull;
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
        t->logits = malloc((size_t)WHISPER_MAX_SEQS * t->model->config.vocab_size * sizeof(float));
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

static void session_free(struct session *s);

void transcriber_free(struct transcriber *t)
{
    if (!t)
        return;
    while (t->sessions) {
        struct session *s = t->sessions;
        t->sessions = s->next;
        session_free(s);
    }
    pthread_mutex_destroy(&t->sessions_lock);
    unload_locked(t);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->stats_lock);
    threadpool_free(t->mel_pool);
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
        for (int w = 0; w < r->segments[i].n_words; w++)
            free(r->segments[i].words[w].text);
        free(r->segments[i].words);
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

/* log(sum e^x[i]) over [lo, hi). */
static double log_sum_exp(const float *x, int lo, int hi)
{
    return hi > lo ? logsumexp_f32(x + lo, (size_t)(hi - lo)) : -INFINITY;
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
    float sum_logprob, avg_logprob, compression_ratio, no_speech_prob;
    char *text;
};

/* Each pass over the model is one slice of the device's turns (engine/turns.h), so a chat
 * engine sharing the device runs a step between any two of them. */
static void turn_begin(struct transcriber *t)
{
    device_turns_take(t->turns, DEVICE_TURNS_TRANSCRIBER);
    t->turn_t0 = now_s();
}

static void turn_end(struct transcriber *t)
{
    t->run_device_s += now_s() - t->turn_t0;
    t->run_turns++;
    device_turns_give(t->turns);
}

/* One token of sequence 0, its logits into t->logits. */
static int in_turn_decode(struct transcriber *t, const int32_t *tok, struct err *err)
{
    turn_begin(t);
    int rc = whisper_decode(t->state, tok, 1, t->logits, err);
    turn_end(t);
    return rc;
}

/* Feeds the prompt and leaves its last logits in t->logits; *no_speech gets the probability of
 * <|nospeech|> at the start-of-transcript token, where openai-whisper reads it. */
static int feed_prompt(struct transcriber *t, const struct ids *prompt, float *no_speech,
                       struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    int sot_at = 0;
    while (sot_at < prompt->n - 1 && prompt->v[sot_at] != t->ids.sot)
        sot_at++;
    whisper_rewind(t->state, 0);
    turn_begin(t);
    int rc = whisper_decode(t->state, prompt->v, sot_at + 1, t->logits, err);
    *no_speech = 0;
    if (rc == 0 && t->ids.no_speech >= 0 && t->ids.no_speech < c->vocab_size)
        *no_speech = (float)exp((double)t->logits[t->ids.no_speech] -
                                log_sum_exp(t->logits, 0, c->vocab_size));
    if (rc == 0 && sot_at + 1 < prompt->n)
        rc = whisper_decode(t->state, prompt->v + sot_at + 1, prompt->n - sot_at - 1, t->logits,
                            err);
    turn_end(t);
    return rc;
}

static bool cancelled(const struct transcriber *t)
{
    return t->cancel && atomic_load(t->cancel);
}

static int sample_limit(const struct transcriber *t, const struct ids *prompt)
{
    int limit = t->model->config.max_target_positions - prompt->n - 1;
    if (limit > MAX_SAMPLE_LEN)
        limit = MAX_SAMPLE_LEN;
    return t->max_new_tokens > 0 && t->max_new_tokens < limit ? t->max_new_tokens : limit;
}

static int finish_try(struct transcriber *t, struct window_try *w, struct err *err)
{
    /* openai-whisper's mean: the end of text's log probability counts, and so does its place */
    w->avg_logprob = w->sum_logprob / (float)(w->tokens.n + 1);
    size_t len;
    int rc = text_of(t, w->tokens.v, w->tokens.n, &w->text, &len, err);
    if (rc == 0)
        w->compression_ratio = compression_ratio(w->text, len);
    return rc;
}

static int decode_window(struct transcriber *t, const struct ids *prompt, float temperature,
                         bool timestamps, uint64_t *rng, struct window_try *w, struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    int rc = feed_prompt(t, prompt, &w->no_speech_prob, err);
    int limit = sample_limit(t, prompt);
    while (rc == 0 && w->tokens.n < limit) {
        if (cancelled(t))
            return err_set(err, INFERD_EIO, "the transcription was cancelled");
        apply_rules(t, t->logits, w->tokens.v, w->tokens.n, timestamps);
        float lp;
        int32_t tok = pick(t->logits, c->vocab_size, temperature, rng, &lp);
        w->sum_logprob += lp;
        if (tok == t->ids.eot)
            break;
        if (ids_push(&w->tokens, tok) < 0)
            return err_set(err, INFERD_ENOMEM, "out of memory decoding");
        if (w->tokens.n < limit)
            rc = in_turn_decode(t, &tok, err);
    }
    return rc < 0 ? rc : finish_try(t, w, err);
}

/* ---- beam search -------------------------------------------------------------------- */

struct beam {
    struct ids tokens;   /* sampled so far, without the end of text */
    double sum_logprob;
};

struct candidate {
    int parent;          /* index of the live beam it extends */
    int32_t token;
    double score;        /* the parent's sum of log probabilities plus the token's */
    int order;           /* generation order: ties keep it (Python's stable sort) */
};

static int candidate_cmp(const void *a, const void *b)
{
    const struct candidate *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->order - y->order;
}

/* The k best tokens of row x (log probabilities) into tok/lp, best first (ties: lower id). */
static void top_k(const float *x, int vocab, int k, int32_t *tok, float *lp)
{
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        if (x[i] == -INFINITY)
            continue;
        if (n == k && x[i] <= lp[n - 1])
            continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && lp[at - 1] < x[i]) {
            lp[at] = lp[at - 1];
            tok[at] = tok[at - 1];
            at--;
        }
        lp[at] = x[i];
        tok[at] = i;
    }
    for (int i = n; i < k; i++) {
        tok[i] = -1;
        lp[i] = -INFINITY;
    }
}

static int beam_copy(struct beam *dst, const struct beam *src, int32_t token, double score)
{
    dst->tokens.n = 0;
    for (int i = 0; i < src->tokens.n; i++)
        if (ids_push(&dst->tokens, src->tokens.v[i]) < 0)
            return -INFERD_ENOMEM;
    if (token >= 0 && ids_push(&dst->tokens, token) < 0)
        return -INFERD_ENOMEM;
    dst->sum_logprob = score;
    return 0;
}

/* openai-whisper's BeamSearchDecoder with patience 1 over one window: each live beam offers
 * its beam_size + 1 best next tokens; the best-scored candidates that do not end the text
 * become the next beams (beam_size of them), those that end it join the finished ones until
 * beam_size have finished; the window's text is the finished sequence with the best
 * sum log probability / length (length_penalty none). The beams share the window's cross
 * K/V; each has its own self K/V, reordered with whisper_seqs_select. */
static int decode_window_beam(struct transcriber *t, const struct ids *prompt, int beam_size,
                              bool timestamps, struct window_try *w, struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    int vocab = c->vocab_size, B = beam_size, K = beam_size + 1;
    struct beam live[WHISPER_MAX_SEQS], next[WHISPER_MAX_SEQS], done[WHISPER_MAX_SEQS];
    memset(live, 0, sizeof live);
    memset(next, 0, sizeof next);
    memset(done, 0, sizeof done);
    struct candidate cand[WHISPER_MAX_SEQS * (WHISPER_MAX_SEQS + 1)];
    int32_t ktok[WHISPER_MAX_SEQS + 1], tokens[WHISPER_MAX_SEQS];
    float klp[WHISPER_MAX_SEQS + 1];
    int parents[WHISPER_MAX_SEQS];
    int n_live = 1, n_done = 0, rc = feed_prompt(t, prompt, &w->no_speech_prob, err);
    int limit = sample_limit(t, prompt);
    /* the prompt's logits for the one live beam; later steps write a row per beam */
    for (int step = 0; rc == 0 && step < limit && n_done < B; step++) {
        if (cancelled(t)) {
            rc = err_set(err, INFERD_EIO, "the transcription was cancelled");
            break;
        }
        int n_cand = 0;
        for (int b = 0; b < n_live; b++) {
            float *x = t->logits + (size_t)b * vocab;
            apply_rules(t, x, live[b].tokens.v, live[b].tokens.n, timestamps);
            float z = (float)log_sum_exp(x, 0, vocab);
            for (int i = 0; i < vocab; i++)
                x[i] -= z;
            top_k(x, vocab, K, ktok, klp);
            for (int j = 0; j < K && ktok[j] >= 0; j++) {
                cand[n_cand] = (struct candidate){b, ktok[j], live[b].sum_logprob + klp[j], n_cand};
                n_cand++;
            }
        }
        qsort(cand, (size_t)n_cand, sizeof *cand, candidate_cmp);
        int n_next = 0;
        /* newly finished ones, best first, join while there is room (as openai-whisper adds them) */
        for (int i = 0; i < n_cand && n_next < B; i++) {
            const struct candidate *k = &cand[i];
            if (k->token == t->ids.eot) {
                if (n_done < B && beam_copy(&done[n_done++], &live[k->parent], -1, k->score) < 0)
                    rc = err_set(err, INFERD_ENOMEM, "out of memory in beam search");
                continue;
            }
            if (beam_copy(&next[n_next], &live[k->parent], k->token, k->score) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory in beam search");
            parents[n_next] = k->parent;
            tokens[n_next] = k->token;
            n_next++;
        }
        for (int b = 0; b < n_next; b++) { /* next becomes live (their buffers trade places) */
            struct beam tmp = live[b];
            live[b] = next[b];
            next[b] = tmp;
        }
        n_live = n_next;
        if (rc < 0 || n_done >= B || n_live == 0 || step + 1 >= limit)
            break;
        turn_begin(t);
        if ((rc = whisper_seqs_select(t->state, parents, n_live, err)) == 0)
            rc = whisper_decode_seqs(t->state, tokens, n_live, t->logits, err);
        turn_end(t);
    }
    /* too few finished: the live beams count, best first (their sums as they stand) */
    for (int round = 0; rc == 0 && n_done < B && round < n_live; round++) {
        int best = -1;
        for (int b = 0; b < n_live; b++)
            if (live[b].sum_logprob > -INFINITY &&
                (best < 0 || live[b].sum_logprob > live[best].sum_logprob))
                best = b;
        if (best < 0)
            break;
        if (beam_copy(&done[n_done++], &live[best], -1, live[best].sum_logprob) < 0)
            rc = err_set(err, INFERD_ENOMEM, "out of memory in beam search");
        live[best].sum_logprob = -INFINITY;
    }
    int pick_i = -1;
    double pick_score = -INFINITY;
    for (int i = 0; rc == 0 && i < n_done; i++) {
        double score = done[i].sum_logprob / (done[i].tokens.n > 0 ? done[i].tokens.n : 1);
        if (pick_i < 0 || score > pick_score) {
            pick_i = i;
            pick_score = score;
        }
    }
    if (rc == 0 && pick_i >= 0) {
        for (int i = 0; i < done[pick_i].tokens.n && rc == 0; i++)
            if (ids_push(&w->tokens, done[pick_i].tokens.v[i]) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory in beam search");
        w->sum_logprob = (float)done[pick_i].sum_logprob;
    }
    for (int i = 0; i < WHISPER_MAX_SEQS; i++) {
        free(live[i].tokens.v);
        free(next[i].tokens.v);
        free(done[i].tokens.v);
    }
    return rc < 0 ? rc : finish_try(t, w, err);
}

static void window_try_free(struct window_try *w)
{
    free(w->tokens.v);
    free(w->text);
    memset(w, 0, sizeof *w);
}

static int add_segment(struct transcriber *t, struct transcribe_result *r, double start,
                       double end, const int32_t *tokens, int n, const struct window_try *w,
                       float temperature, struct err *err)
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
    s->no_speech_prob = w->no_speech_prob;
    return 0;
}

/* Cuts a window's tokens into segments at timestamp pairs (openai-whisper's
 * rule) and returns how many samples the window used. */
static int segment_window(struct transcriber *t, struct transcribe_result *r, double offset,
                          size_t window_len, const struct window_try *w, float temperature,
                          bool timestamps, size_t *used, struct err *err)
{
    const int32_t *tok = w->tokens.v, tsb = t->ids.ts_begin;
    int n = w->tokens.n, rc;
    *used = window_len;
    if (n == 0)
        return 0;
    if (!timestamps) {
        /* <|notimestamps|> does not forbid timestamp tokens (no rule is applied): a pair of them
         * still ends the window's text there, and the next window starts at the pair's time,
         * as openai-whisper's and transformers' seek loops both do */
        int last_pair = 0;
        for (int i = 1; i < n; i++)
            if (tok[i - 1] >= tsb && tok[i] >= tsb)
                last_pair = i;
        bool single_end = n >= 2 && tok[n - 2] < tsb && tok[n - 1] >= tsb;
        if (last_pair > 0 && !single_end) {
            size_t at = (size_t)(tok[last_pair - 1] - tsb) * SAMPLES_PER_TS;
            if (at > 0 && at < window_len)
                *used = at;
        }
        return add_segment(t, r, offset, offset + (double)*used / AUDIO_SAMPLE_RATE, tok, n, w,
                           temperature, err);
    }
    double window_s = (double)window_len / AUDIO_SAMPLE_RATE;
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
        /* a timestamp past the window's audio (into its padding) ends at the audio's end */
        double start = offset + fmin((s[0] - tsb) * SECONDS_PER_TS, window_s),
               end = offset + fmin((s[len - 1] - tsb) * SECONDS_PER_TS, window_s);
        if ((rc = add_segment(t, r, start, end, s, len, w, temperature, err)) < 0)
            return rc;
        last_slice = i;
    }
    if (any_pair) {
        if (!single_end) /* seek to where the last whole segment ended */
            *used = (size_t)(tok[last_slice - 1] - tsb) * SAMPLES_PER_TS;
        if (*used == 0 || *used > window_len)
            *used = window_len;
        return 0;
    }
    double dur = (double)window_len / AUDIO_SAMPLE_RATE;
    for (int i = n - 1; i >= 0; i--)
        if (tok[i] >= tsb) {
            if (tok[i] != tsb)
                dur = fmin((tok[i] - tsb) * SECONDS_PER_TS, window_s);
            break;
        }
    return add_segment(t, r, offset, offset + dur, tok, n, w, temperature, err);
}

/* ---- word timestamps ------------------------------------------------------------------ */

#define MEDFILT_WIDTH 7
#define FRAMES_PER_SECOND 50.0 /* encoder frames */

static int float_cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int transcribe_align(const float *scores, int n_heads, int n_rows, int n_frames, int first_row,
                     int n_path_rows, int *jump, struct err *err)
{
    if (n_heads < 1 || n_rows < 1 || n_frames < 1 || first_row < 0 || n_path_rows < 1 ||
        first_row + n_path_rows > n_rows)
        return err_set(err, INFERD_EINVAL, "alignment of %d rows from %d of %d over %d frames",
                       n_path_rows, first_row, n_rows, n_frames);
    size_t per_head = (size_t)n_rows * n_frames, T = (size_t)n_path_rows, F = (size_t)n_frames;
    float *w = malloc((size_t)n_heads * per_head * sizeof *w);
    float *matrix = calloc(T * F, sizeof *matrix);
    float *cost = malloc((T + 1) * (F + 1) * sizeof *cost);
    signed char *trace = malloc((T + 1) * (F + 1));
    if (!w || !matrix || !cost || !trace) {
        free(w), free(matrix), free(cost), free(trace);
        return err_set(err, INFERD_ENOMEM, "out of memory for the word alignment");
    }
    memcpy(w, scores, (size_t)n_heads * per_head * sizeof *w);
    for (int h = 0; h < n_heads; h++) {
        float *wh = w + (size_t)h * per_head;
        for (int r = 0; r < n_rows; r++) { /* softmax over the frames */
            float *x = wh + (size_t)r * F, mx = -INFINITY, sum = 0;
            for (size_t f = 0; f < F; f++)
                mx = fmaxf(mx, x[f]);
            for (size_t f = 0; f < F; f++)
                sum += x[f] = expf(x[f] - mx);
            for (size_t f = 0; f < F; f++)
                x[f] /= sum;
        }
        for (size_t f = 0; f < F; f++) { /* zero mean, unit population deviation over rows */
            double mean = 0, var = 0;
            for (int r = 0; r < n_rows; r++)
                mean += wh[(size_t)r * F + f];
            mean /= n_rows;
            for (int r = 0; r < n_rows; r++) {
                double d = wh[(size_t)r * F + f] - mean;
                var += d * d;
            }
            float sd = (float)sqrt(var / n_rows);
            for (int r = 0; r < n_rows; r++) {
                float *x = &wh[(size_t)r * F + f];
                *x = sd > 0 ? (*x - (float)mean) / sd : *x - (float)mean;
            }
        }
        /* the median of 7 along the frames (reflected at the ends), then the mean over heads,
         * of the path's rows */
        int pad = MEDFILT_WIDTH / 2;
        for (size_t r = 0; r < T; r++) {
            const float *x = wh + ((size_t)first_row + r) * F;
            for (size_t f = 0; f < F; f++) {
                float v = x[f];
                if ((int)F > pad) {
                    float win[MEDFILT_WIDTH];
                    for (int j = 0; j < MEDFILT_WIDTH; j++) {
                        long i = (long)f + j - pad;
                        if (i < 0)
                            i = -i;
                        if (i >= (long)F)
                            i = 2 * ((long)F - 1) - i;
                        win[j] = x[i];
                    }
                    qsort(win, MEDFILT_WIDTH, sizeof *win, float_cmp);
                    v = win[pad];
                }
                matrix[r * F + f] += v / (float)n_heads;
            }
        }
    }
    /* dynamic time warping over -matrix, openai-whisper's dtw_cpu: ties go right (a frame on) */
    for (size_t i = 0; i <= T; i++)
        for (size_t j = 0; j <= F; j++) {
            cost[i * (F + 1) + j] = INFINITY;
            trace[i * (F + 1) + j] = -1;
        }
    cost[0] = 0;
    for (size_t j = 1; j <= F; j++)
        for (size_t i = 1; i <= T; i++) {
            float c0 = cost[(i - 1) * (F + 1) + j - 1], c1 = cost[(i - 1) * (F + 1) + j],
                  c2 = cost[i * (F + 1) + j - 1], c;
            signed char tr;
            if (c0 < c1 && c0 < c2)
                c = c0, tr = 0;
            else if (c1 < c0 && c1 < c2)
                c = c1, tr = 1;
            else
                c = c2, tr = 2;
            cost[i * (F + 1) + j] = -matrix[(i - 1) * F + j - 1] + c;
            trace[i * (F + 1) + j] = tr;
        }
    for (size_t j = 0; j <= F; j++)
        trace[j] = 2;
    for (size_t i = 0; i <= T; i++)
        trace[i * (F + 1)] = 1;
    for (size_t i = 0; i < T; i++)
        jump[i] = -1;
    /* back from the corner: the last frame each row is entered at is its first on the path */
    size_t i = T, j = F;
    while (i > 0 || j > 0) {
        if (i > 0 && j > 0)
            jump[i - 1] = (int)(j - 1);
        signed char tr = trace[i * (F + 1) + j];
        if (tr == 0)
            i--, j--;
        else if (tr == 1)
            i--;
        else
            j--;
    }
    for (size_t r = 0; r < T; r++) /* rows the path only crosses at frame -1 */
        if (jump[r] < 0)
            jump[r] = 0;
    free(w), free(matrix), free(cost), free(trace);
    return 0;
}

struct word_span {
    int first, n_tokens; /* into the window's text tokens */
    char *text;          /* owned; "" once merged into a neighbour */
    double start, end;
};

static bool is_punctuation(const char *s)
{
    while (*s == ' ')
        s++;
    size_t n = strlen(s);
    while (n && s[n - 1] == ' ')
        n--;
    static const char punct[] = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
    for (size_t a = 0; a + n <= sizeof punct - 1; a++) /* a substring of it, as Python's `in` */
        if (!strncmp(punct + a, s, n))
            return true;
    return false;
}

/* openai-whisper's split_tokens_on_spaces: tokens gathered until they decode to whole
 * characters; a new word at a space, at punctuation, or at the start. */
static int split_words(struct transcriber *t, const int32_t *tok, int n, struct word_span **out,
                       int *n_out, struct err *err)
{
    struct word_span *w = calloc((size_t)(n ? n : 1), sizeof *w);
    if (!w)
        return err_set(err, INFERD_ENOMEM, "out of memory splitting words");
    int nw = 0, rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        int j = i + 1;
        char *sub = NULL;
        size_t len;
        for (;; j++) {
            free(sub);
            if ((rc = text_of(t, tok + i, j - i, &sub, &len, err)) < 0)
                break;
            if (!strstr(sub, "\xef\xbf\xbd") || j >= n)
                break;
        }
        if (rc < 0)
            break;
        bool fresh = nw == 0 || sub[0] == ' ' || is_punctuation(sub);
        if (fresh) {
            w[nw++] = (struct word_span){.first = i, .n_tokens = j - i, .text = sub};
        } else {
            struct word_span *last = &w[nw - 1];
            char *joined = malloc(strlen(last->text) + len + 1);
            if (!joined) {
                free(sub);
                rc = err_set(err, INFERD_ENOMEM, "out of memory splitting words");
                break;
            }
            sprintf(joined, "%s%s", last->text, sub);
            free(last->text);
            free(sub);
            last->text = joined;
            last->n_tokens += j - i;
        }
        i = j;
    }
    if (rc < 0) {
        for (int i = 0; i < nw; i++)
            free(w[i].text);
        free(w);
        return rc;
    }
    *out = w;
    *n_out = nw;
    return 0;
}

/* openai-whisper's merge_punctuations: opening marks join the word after them, closing marks
 * the word before (the word keeps its own times). */
static void merge_punctuation(struct word_span *w, int n)
{
    static const char *const prepend = "\"'\xe2\x80\x9c\xc2\xbf([{-";
    static const char *const append = "\"'.\xe3\x80\x82,\xef\xbc\x8c!\xef\xbc\x81?\xef\xbc\x9f:"
                                      "\xef\xbc\x9a\xe2\x80\x9d)]}\xe3\x80\x81";
    for (int i = n - 2; i >= 0; i--) {
        const char *p = w[i].text;
        if (p[0] == ' ' && p[1] && strstr(prepend, p + 1) && strlen(p + 1) <= 3 &&
            w[i + 1].text[0]) {
            char *j = malloc(strlen(p) + strlen(w[i + 1].text) + 1);
            if (!j)
                continue;
            sprintf(j, "%s%s", p, w[i + 1].text);
            free(w[i + 1].text);
            w[i + 1].text = j;
            w[i + 1].first = w[i].first;
            w[i + 1].n_tokens += w[i].n_tokens;
            w[i].text[0] = '\0';
            w[i].n_tokens = 0;
        }
    }
    for (int i = 1; i < n; i++) {
        const char *p = w[i].text;
        int prev = i - 1;
        while (prev >= 0 && !w[prev].text[0])
            prev--;
        if (prev < 0 || !p[0] || w[prev].text[strlen(w[prev].text) - 1] == ' ' ||
            strlen(p) > 3 || !strstr(append, p))
            continue;
        char *j = malloc(strlen(w[prev].text) + strlen(p) + 1);
        if (!j)
            continue;
        sprintf(j, "%s%s", w[prev].text, p);
        free(w[prev].text);
        w[prev].text = j;
        w[prev].n_tokens += w[i].n_tokens;
        w[i].text[0] = '\0';
        w[i].n_tokens = 0;
    }
}

/* Word times for the segments [first_seg, r->n_segments) of one window (openai-whisper's
 * add_word_timestamps): the window's text tokens forced through the decoder after the
 * start-of-transcript sequence and <|notimestamps|>, the alignment heads' cross-attention
 * aligned to the window's frames, each word from the jump at its first token's row to the
 * next word's; times are clamped into their segment. */
static int add_words(struct transcriber *t, struct transcribe_result *r, int first_seg,
                     const struct ids *sot_seq, double offset, size_t window_len,
                     struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    struct ids text = {0}, all = {0};
    int rc = 0;
    for (int s = first_seg; s < r->n_segments && rc == 0; s++)
        for (int i = 0; i < r->segments[s].n_tokens && rc == 0; i++)
            if (r->segments[s].tokens[i] < t->ids.eot && ids_push(&text, r->segments[s].tokens[i]) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory for word timestamps");
    int frames = (int)(window_len / AUDIO_HOP / 2);
    if (frames < 1)
        frames = 1;
    if (frames > c->max_source_positions)
        frames = c->max_source_positions;
    if (rc < 0 || text.n == 0 || sot_seq->n + text.n + 2 > c->max_target_positions) {
        free(text.v);
        return rc;
    }
    for (int i = 0; i < sot_seq->n; i++)
        ids_push(&all, sot_seq->v[i]);
    ids_push(&all, t->ids.no_timestamps);
    for (int i = 0; i < text.n; i++)
        ids_push(&all, text.v[i]);
    if (ids_push(&all, t->ids.eot) < 0)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for word timestamps");
    int n_heads = c->n_alignment_heads, *jump = malloc((size_t)(text.n + 1) * sizeof *jump);
    float *scores = malloc((size_t)n_heads * all.n * frames * sizeof *scores);
    struct word_span *words = NULL;
    int n_words = 0;
    if (rc == 0 && (!jump || !scores))
        rc = err_set(err, INFERD_ENOMEM, "out of memory for word timestamps");
    if (rc == 0) {
        turn_begin(t);
        rc = whisper_cross_scores(t->state, all.v, all.n, c->alignment_heads, n_heads, frames,
                                  scores, err);
        turn_end(t);
    }
    if (rc == 0)
        rc = transcribe_align(scores, n_heads, all.n, frames, sot_seq->n, text.n + 1, jump, err);
    if (rc == 0)
        rc = split_words(t, text.v, text.n, &words, &n_words, err);
    if (rc == 0) {
        for (int k = 0; k < n_words; k++) {
            int end_row = k + 1 < n_words ? words[k + 1].first : text.n;
            words[k].start = offset + jump[words[k].first] / FRAMES_PER_SECOND;
            words[k].end = offset + jump[end_row] / FRAMES_PER_SECOND;
        }
        merge_punctuation(words, n_words);
        /* to the segments, by their text tokens */
        int wi = 0;
        for (int s = first_seg; s < r->n_segments && rc == 0; s++) {
            struct transcribe_segment *g = &r->segments[s];
            int want = 0, saved = 0;
            for (int i = 0; i < g->n_tokens; i++)
                want += g->tokens[i] < t->ids.eot;
            g->words = calloc((size_t)(n_words ? n_words : 1), sizeof *g->words);
            if (!g->words) {
                rc = err_set(err, INFERD_ENOMEM, "out of memory for word timestamps");
                break;
            }
            double last_end = g->start;
            while (wi < n_words && saved < want) {
                struct word_span *w = &words[wi++];
                saved += w->n_tokens;
                if (!w->text[0])
                    continue;
                double st = fmin(fmax(w->start, last_end), g->end);
                double en = fmin(fmax(w->end, st), g->end);
                g->words[g->n_words++] = (struct transcribe_word){w->text, st, en};
                w->text = NULL; /* the segment owns it now */
                last_end = en;
            }
        }
    }
    for (int k = 0; k < n_words; k++)
        free(words[k].text);
    free(words);
    free(jump);
    free(scores);
    free(text.v);
    free(all.v);
    return rc;
}

static int detect_language(struct transcriber *t, int *lang, struct err *err)
{
    whisper_rewind(t->state, 0);
    int rc = in_turn_decode(t, &t->ids.sot, err);
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

/* Tokens of previous text (or prompt) the decoder is given after <|startofprev|>. */
static int prompt_budget(const struct transcriber *t)
{
    int m = t->model->config.max_previous_text;
    return m < MAX_PROMPT_TOKENS ? m : MAX_PROMPT_TOKENS;
}

/* The first window's conditioning: as many vocabulary terms as fit (in order, comma
 * separated) then the prompt, within prompt_budget (the prompt's own tail first). */
static int initial_prompt(struct transcriber *t, const struct transcribe_options *o,
                          struct ids *prev, int *n_terms, struct err *err)
{
    const int budget = prompt_budget(t);
    struct ids p = {0};
    int rc = 0;
    *n_terms = 0;
    if (o->prompt && *o->prompt) {
        int32_t *ids;
        int n;
        char *spaced = malloc(strlen(o->prompt) + 2);
        if (!spaced)
            return err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
        sprintf(spaced, " %s", o->prompt); /* as openai-whisper encodes it */
        rc = tok_encode(t->tok, spaced, strlen(spaced), false, &ids, &n, err);
        free(spaced);
        if (rc < 0)
            return rc;
        int from = n > budget ? n - budget : 0;
        for (int i = from; i < n && rc == 0; i++)
            if (ids_push(&p, ids[i]) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
        free(ids);
    }
    int32_t comma = -1;
    for (int k = 0; rc == 0 && k < o->n_vocabulary; k++) {
        const char *term = o->vocabulary[k];
        char *spaced = malloc(strlen(term) + 2);
        int32_t *ids = NULL;
        int n = 0;
        if (!spaced) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the vocabulary");
            break;
        }
        sprintf(spaced, " %s", term);
        rc = tok_encode(t->tok, spaced, strlen(spaced), false, &ids, &n, err);
        free(spaced);
        if (rc < 0)
            break;
        if (comma < 0 && k == 0) {
            int32_t *c1;
            int nc;
            if ((rc = tok_encode(t->tok, ",", 1, false, &c1, &nc, err)) < 0) {
                free(ids);
                break;
            }
            comma = nc == 1 ? c1[0] : -1;
            free(c1);
        }
        int need = n + (prev->n > 0 && comma >= 0);
        if (n == 0 || prev->n + need + p.n > budget) {
            free(ids);
            break; /* in order: the first term that does not fit ends the list */
        }
        if (prev->n > 0 && comma >= 0)
            ids_push(prev, comma);
        for (int i = 0; i < n; i++)
            if (ids_push(prev, ids[i]) < 0)
                rc = err_set(err, INFERD_ENOMEM, "out of memory for the vocabulary");
        free(ids);
        (*n_terms)++;
    }
    if (rc == 0 && *n_terms > 0 && p.n > 0 && comma >= 0 && prev->n + p.n < budget)
        ids_push(prev, comma);
    for (int i = 0; rc == 0 && i < p.n; i++)
        if (ids_push(prev, p.v[i]) < 0)
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
    free(p.v);
    return rc;
}

/* A stretch of the audio transcribed on its own (all of it, or a VAD chunk). */
struct chunk {
    size_t start, end; /* samples */
};

static int make_chunks(const float *samples, size_t n, const struct transcribe_options *o,
                       struct chunk **out, int *n_out, struct err *err)
{
    if (!o->vad.on) {
        *out = malloc(sizeof **out);
        if (!*out)
            return err_set(err, INFERD_ENOMEM, "out of memory");
        (*out)[0] = (struct chunk){0, n};
        *n_out = 1;
        return 0;
    }
    struct audio_vad_options v = {.threshold = o->vad.threshold,
                                  .min_speech_ms = o->vad.min_speech_ms,
                                  .trim = o->vad.trim};
    struct audio_span *spans = NULL;
    int n_spans = 0;
    int rc = audio_vad_chunks(samples, n, &v, AUDIO_WINDOW_SAMPLES, &spans, &n_spans, err);
    if (rc < 0)
        return rc;
    *out = malloc((size_t)(n_spans ? n_spans : 1) * sizeof **out);
    if (!*out) {
        free(spans);
        return err_set(err, INFERD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n_spans; i++)
        (*out)[i] = (struct chunk){spans[i].start, spans[i].end};
    *n_out = n_spans;
    free(spans);
    return 0;
}

/* One window's features from a whole spectrogram (n_mels x n_frames, mel-major): frames
 * [from, from + AUDIO_WINDOW_FRAMES), zeros past the last, as transformers' generate() and
 * openai-whisper's transcribe() pad a cut. */
static void mel_slice(const float *mel, int n_mels, size_t n_frames, size_t from, float *out)
{
    size_t have = from < n_frames ? n_frames - from : 0;
    if (have > AUDIO_WINDOW_FRAMES)
        have = AUDIO_WINDOW_FRAMES;
    for (int b = 0; b < n_mels; b++) {
        float *row = out + (size_t)b * AUDIO_WINDOW_FRAMES;
        memcpy(row, mel + (size_t)b * n_frames + from, have * sizeof *row);
        memset(row + have, 0, (AUDIO_WINDOW_FRAMES - have) * sizeof *row);
    }
}

/* Transcribes samples [0, n), or, with mel, the spectrogram's n_frames frames (n is then
 * n_frames * AUDIO_HOP: positions stay in samples, each window cut from mel). */
static int run_locked(struct transcriber *t, const float *samples, size_t n, const float *mel,
                      size_t n_frames, const struct transcribe_options *o,
                      struct transcribe_result *r, struct err *err)
{
    const struct whisper_config *c = &t->model->config;
    int lang = -1;
    if (mel && o->vad.on)
        return err_set(err, INFERD_EINVAL, "voice activity chunking needs the audio, not its "
                                           "spectrogram");
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
    int beam = o->beam_size > 1 ? o->beam_size : 1;
    if (beam > WHISPER_MAX_SEQS)
        return err_set(err, INFERD_EINVAL, "beam_size %d (at most %d)", beam, WHISPER_MAX_SEQS);
    r->duration = (double)n / AUDIO_SAMPLE_RATE;
    struct ids prev = {0}, prompt = {0}, sot_seq = {0};
    struct chunk *chunks = NULL;
    int n_chunks = 0;
    int rc = initial_prompt(t, o, &prev, &r->n_vocabulary_used, err);
    if (rc == 0)
        rc = whisper_state_reserve(t->state, beam, err);
    if (rc == 0) {
        double v0 = now_s();
        rc = make_chunks(samples, n, o, &chunks, &n_chunks, err);
        if (o->vad.on) {
            r->vad_ms = (now_s() - v0) * 1e3;
            r->n_vad_chunks = n_chunks;
            for (int i = 0; rc == 0 && i < n_chunks; i++)
                r->vad_speech_seconds +=
                    (double)(chunks[i].end - chunks[i].start) / AUDIO_SAMPLE_RATE;
        }
    }
    if (rc < 0)
        goto out;
    uint64_t rng = o->seed ? o->seed : 0x5eed;
    for (int ci = 0; ci < n_chunks; ci++) {
        const float *cs = samples ? samples + chunks[ci].start : NULL;
        size_t cn = chunks[ci].end - chunks[ci].start;
        for (size_t seek = 0; seek < cn || (cn == 0 && seek == 0);) {
            size_t window_len = cn - seek < AUDIO_WINDOW_SAMPLES ? cn - seek : AUDIO_WINDOW_SAMPLES;
            if (cn > 0 && window_len < AUDIO_SAMPLE_RATE / 100) /* under 10 ms: nothing to hear */
                break;
            double offset = (double)(chunks[ci].start + seek) / AUDIO_SAMPLE_RATE;
            double m0 = now_s();
            if (mel)
                mel_slice(mel, c->n_mels, n_frames, seek / AUDIO_HOP, t->features);
            else
                audio_mel_window(&t->mel, cs + seek, window_len, t->features, t->mel_pool);
            t->run_mel_s += now_s() - m0;
            t->run_windows++;
            turn_begin(t);
            rc = whisper_encode(t->state, t->features, err);
            turn_end(t);
            t->run_encode_s += now_s() - t->turn_t0;
            t->run_turns--; /* the encoder's turn is counted apart from the decoder's */
            if (rc < 0)
                goto out;
            if (c->multilingual && lang < 0 && (rc = detect_language(t, &lang, err)) < 0)
                goto out;
            sot_seq.n = 0;
            ids_push(&sot_seq, t->ids.sot);
            if (c->multilingual) {
                ids_push(&sot_seq, t->ids.lang[lang]);
                ids_push(&sot_seq, o->task == TRANSCRIBE_TASK_TRANSLATE ? t->ids.translate
                                                                       : t->ids.transcribe);
            }
            prompt.n = 0;
            if (prev.n && t->ids.prev >= 0) {
                ids_push(&prompt, t->ids.prev);
                int from = prev.n > prompt_budget(t) ? prev.n - prompt_budget(t) : 0;
                for (int i = from; i < prev.n; i++)
                    ids_push(&prompt, prev.v[i]);
            }
            for (int i = 0; i < sot_seq.n; i++)
                ids_push(&prompt, sot_seq.v[i]);
            if ((!o->timestamps && ids_push(&prompt, t->ids.no_timestamps) < 0) || !prompt.v ||
                !sot_seq.v) {
                rc = err_set(err, INFERD_ENOMEM, "out of memory for the prompt");
                goto out;
            }
            struct window_try w = {0};
            float temperature = o->temperature > 0 ? o->temperature : 0.0f;
            for (;;) {
                window_try_free(&w);
                t->run_passes++;
                rc = temperature == 0 && beam > 1
                         ? decode_window_beam(t, &prompt, beam, o->timestamps, &w, err)
                         : decode_window(t, &prompt, temperature, o->timestamps, &rng, &w, err);
                if (rc < 0) {
                    window_try_free(&w);
                    goto out;
                }
                bool failed = !o->no_fallback && (w.compression_ratio > COMPRESSION_RATIO_MAX ||
                                                  w.avg_logprob < LOGPROB_MIN);
                /* silence: no fallback (openai-whisper) */
                if (o->no_speech_threshold > 0 && w.no_speech_prob > o->no_speech_threshold &&
                    w.avg_logprob < LOGPROB_MIN)
                    failed = false;
                if (!failed || o->temperature > 0 || temperature >= 1.0f - 1e-6f)
                    break;
                temperature += 0.2f;
            }
            size_t used = window_len;
            bool silent = o->no_speech_threshold > 0 && w.no_speech_prob > o->no_speech_threshold &&
                          !(w.avg_logprob > LOGPROB_MIN);
            int first_seg = r->n_segments;
            if (!silent) {
                rc = segment_window(t, r, offset, window_len, &w, temperature, o->timestamps,
                                    &used, err);
                if (rc == 0 && o->word_timestamps)
                    rc = add_words(t, r, first_seg, &sot_seq, offset, window_len, err);
                for (int i = first_seg; rc == 0 && o->on_segment && i < r->n_segments; i++)
                    if (o->on_segment(o->ctx, &r->segments[i]))
                        rc = err_set(err, INFERD_EIO, "the transcription was cancelled");
                /* the next window is conditioned on this one's text unless it was sampled hot */
                for (int i = 0; rc == 0 && i < w.tokens.n; i++)
                    if (w.tokens.v[i] < t->ids.eot && ids_push(&prev, w.tokens.v[i]) < 0)
                        rc = err_set(err, INFERD_ENOMEM, "out of memory decoding");
                if (o->no_previous_text || temperature > 0.5f)
                    prev.n = 0;
            }
            window_try_free(&w);
            if (rc < 0)
                goto out;
            seek += used;
            if (o->on_progress &&
                o->on_progress(o->ctx, (double)(chunks[ci].start + seek) / AUDIO_SAMPLE_RATE,
                               r->duration)) {
                rc = err_set(err, INFERD_EIO, "the transcription was cancelled");
                goto out;
            }
            if (cn == 0)
                break;
        }
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
    r->language_token = c->multilingual && lang >= 0 ? t->ids.lang[lang] : -1;
    if (!r->text)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the transcript");
out:
    free(chunks);
    free(prev.v);
    free(prompt.v);
    free(sot_seq.v);
    return rc;
}

static int run(struct transcriber *t, const float *samples, size_t n, const float *mel,
               size_t n_frames, const struct transcribe_options *o, struct transcribe_result *out,
               struct err *err)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&t->lock);
    double t0 = now_s();
    bool was_loaded = t->model != NULL;
    int rc = load_locked(t, err);
    double t_loaded = now_s();
    t->cancel = o->cancel;
    t->max_new_tokens = o->max_new_tokens;
    if (rc == 0 && mel && t->model->config.n_mels != t->mel.n_mels)
        rc = err_set(err, INFERD_EINVAL, "a spectrogram of %d bins for a model of %d",
                     t->mel.n_mels, t->model->config.n_mels);
    t->run_device_s = t->run_encode_s = t->run_mel_s = 0;
    t->run_turns = t->run_windows = t->run_passes = 0;
    if (rc == 0)
        rc = run_locked(t, samples, n, mel, n_frames, o, out, err);
    t->cancel = NULL;
    t->max_new_tokens = 0;
    double t1 = now_s();
    out->load_ms = was_loaded ? 0 : (t_loaded - t0) * 1e3;
    out->transcribe_ms = (t1 - t_loaded) * 1e3;
    out->mel_ms = t->run_mel_s * 1e3;
    out->encode_ms = t->run_encode_s * 1e3;
    out->decode_ms = (t->run_device_s - t->run_encode_s) * 1e3;
    out->n_windows = t->run_windows;
    out->n_decoder_steps = t->run_turns;
    out->n_passes = t->run_passes;
    pthread_mutex_lock(&t->stats_lock);
    t->last_used = t1;
    t->stats.requests++;
    if (rc < 0) {
        t->stats.failures++;
    } else {
        t->stats.audio_seconds += (double)n / AUDIO_SAMPLE_RATE;
        t->stats.compute_seconds += t1 - t0;
        t->stats.mel_seconds += t->run_mel_s;
        t->stats.encode_seconds += t->run_encode_s;
        t->stats.decode_seconds += t->run_device_s - t->run_encode_s;
        t->stats.windows += (uint64_t)t->run_windows;
        t->stats.decoder_steps += (uint64_t)t->run_turns;
        t->stats.passes += (uint64_t)t->run_passes;
    }
    pthread_mutex_unlock(&t->stats_lock);
    pthread_mutex_unlock(&t->lock);
    if (rc < 0)
        transcribe_result_free(out);
    return rc;
}

int transcriber_run(struct transcriber *t, const float *samples, size_t n,
                    const struct transcribe_options *o, struct transcribe_result *out,
                    struct err *err)
{
    return run(t, samples, n, NULL, 0, o, out, err);
}

int transcriber_run_mel(struct transcriber *t, const float *mel, size_t n_frames,
                        const struct transcribe_options *o, struct transcribe_result *out,
                        struct err *err)
{
    return run(t, NULL, n_frames * AUDIO_HOP, mel, n_frames, o, out, err);
}

void transcriber_set_turns(struct transcriber *t, struct device_turns *turns)
{
    pthread_mutex_lock(&t->lock);
    t->turns = turns;
    pthread_mutex_unlock(&t->lock);
}

void transcriber_set_default_beam(struct transcriber *t, int beam_size)
{
    t->default_beam = beam_size < 1 ? 1 : beam_size > WHISPER_MAX_SEQS ? WHISPER_MAX_SEQS : beam_size;
}

int transcriber_default_beam(const struct transcriber *t) { return t->default_beam; }

int transcriber_set_mel_threads(struct transcriber *t, int n_threads, struct err *err)
{
    struct threadpool *pool = NULL;
    if (n_threads != 1) {
        int rc = threadpool_create(n_threads, &pool, err);
        if (rc < 0)
            return err_wrap(err, "the Whisper front end's threads");
    }
    pthread_mutex_lock(&t->lock);
    threadpool_free(t->mel_pool);
    t->mel_pool = pool;
    pthread_mutex_unlock(&t->lock);
    return 0;
}

/* ---- dictation sessions -------------------------------------------------------------------- */

static void session_free(struct session *s)
{
    if (!s)
        return;
    free(s->language);
    free(s->prompt);
    for (int i = 0; s->vocabulary && i < s->o.n_vocabulary; i++)
        free(s->vocabulary[i]);
    free(s->vocabulary);
    free(s->pcm);
    free(s->last_text);
    transcribe_result_free(&s->acc);
    free(s);
}

int transcriber_session_count(struct transcriber *t)
{
    pthread_mutex_lock(&t->sessions_lock);
    int n = t->n_sessions;
    pthread_mutex_unlock(&t->sessions_lock);
    return n;
}

int transcriber_session_open(struct transcriber *t, const struct transcribe_options *o, int tag,
                             char id[TRANSCRIBER_SESSION_ID], struct err *err)
{
    struct session *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(err, INFERD_ENOMEM, "out of memory for a session");
    s->o = *o;
    s->o.on_segment = NULL;
    s->o.on_progress = NULL;
    s->o.ctx = NULL;
    s->tag = tag;
    bool ok = (!o->language || (s->language = strdup(o->language))) &&
              (!o->prompt || (s->prompt = strdup(o->prompt))) &&
              (o->n_vocabulary == 0 ||
               (s->vocabulary = calloc((size_t)o->n_vocabulary, sizeof *s->vocabulary)));
    for (int i = 0; ok && i < o->n_vocabulary; i++)
        ok = (s->vocabulary[i] = strdup(o->vocabulary[i])) != NULL;
    s->o.language = s->language;
    s->o.prompt = s->prompt;
    s->o.vocabulary = (const char *const *)s->vocabulary;
    if (!ok) {
        session_free(s);
        return err_set(err, INFERD_ENOMEM, "out of memory for a session");
    }
    pthread_mutex_lock(&t->sessions_lock);
    if (t->n_sessions >= TRANSCRIBER_MAX_SESSIONS) {
        pthread_mutex_unlock(&t->sessions_lock);
        session_free(s);
        return err_set(err, INFERD_EBUSY, "too many open transcription sessions (%d)",
                       TRANSCRIBER_MAX_SESSIONS);
    }
    uint64_t a = rng_next(&t->session_counter), b = rng_next(&t->session_counter);
    snprintf(s->id, sizeof s->id, "ts_%012llx%012llx", (unsigned long long)(a >> 16),
             (unsigned long long)(b >> 16));
    s->next = t->sessions;
    t->sessions = s;
    t->n_sessions++;
    snprintf(id, TRANSCRIBER_SESSION_ID, "%s", s->id);
    pthread_mutex_unlock(&t->sessions_lock);
    return 0;
}

static struct session **session_find(struct transcriber *t, const char *id)
{
    struct session **p = &t->sessions;
    while (*p && strcmp((*p)->id, id))
        p = &(*p)->next;
    return p;
}

/* Transcribes samples [cut, cut + n) of s and moves its segments into s->acc. */
static int session_window(struct transcriber *t, struct session *s, size_t n, struct err *err)
{
    struct transcribe_options o = s->o;
    if (s->cut > 0) /* later windows: conditioned on the one before */
        o.prompt = o.no_previous_text ? NULL : s->last_text;
    struct transcribe_result r;
    int rc = transcriber_run(t, s->pcm + s->cut, n, &o, &r, err);
    if (rc < 0)
        return rc;
    double offset = (double)s->cut / AUDIO_SAMPLE_RATE;
    struct transcribe_segment *g =
        realloc(s->acc.segments, (size_t)(s->acc.n_segments + r.n_segments + 1) * sizeof *g);
    if (!g) {
        transcribe_result_free(&r);
        return err_set(err, INFERD_ENOMEM, "out of memory for the session's segments");
    }
    s->acc.segments = g;
    for (int i = 0; i < r.n_segments; i++) {
        struct transcribe_segment *d = &g[s->acc.n_segments];
        *d = r.segments[i];
        d->id = s->acc.n_segments++;
        d->start += offset;
        d->end += offset;
        for (int w = 0; w < d->n_words; w++) {
            d->words[w].start += offset;
            d->words[w].end += offset;
        }
    }
    r.n_segments = 0;
    memcpy(s->acc.language, r.language, sizeof r.language);
    s->acc.n_vocabulary_used = r.n_vocabulary_used;
    free(s->last_text);
    s->last_text = r.text;
    r.text = NULL;
    transcribe_result_free(&r);
    s->cut += n;
    return 0;
}

int transcriber_session_append(struct transcriber *t, const char *id, const float *x, size_t n,
                               struct transcribe_session_status *st, struct err *err)
{
    pthread_mutex_lock(&t->sessions_lock);
    struct session *s = *session_find(t, id);
    int rc = 0;
    if (!s) {
        rc = err_set(err, INFERD_ENOENT, "unknown transcription session");
        goto out;
    }
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : AUDIO_WINDOW_SAMPLES;
        while (cap < s->n + n)
            cap *= 2;
        float *p = realloc(s->pcm, cap * sizeof *p);
        if (!p) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the session's audio");
            goto out;
        }
        s->pcm = p;
        s->cap = cap;
    }
    memcpy(s->pcm + s->n, x, n * sizeof *x);
    s->n += n;
    struct audio_span *sp = NULL;
    int n_sp = 0;
    if (audio_vad(x, n, &(struct audio_vad_options){0}, &sp, &n_sp, err) == 0)
        s->speech = n_sp > 0;
    free(sp);
    while (rc == 0 && s->n - s->cut >= AUDIO_WINDOW_SAMPLES)
        rc = session_window(t, s, AUDIO_WINDOW_SAMPLES, err);
    st->samples = s->n;
    st->duration = (double)s->n / AUDIO_SAMPLE_RATE;
    st->speech = s->speech;
    st->n_segments = s->acc.n_segments;
out:
    pthread_mutex_unlock(&t->sessions_lock);
    return rc;
}

int transcriber_session_finish(struct transcriber *t, const char *id,
                               struct transcribe_result *out, int *tag, struct err *err)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&t->sessions_lock);
    struct session **p = session_find(t, id), *s = *p;
    int rc = 0;
    if (!s) {
        rc = err_set(err, INFERD_ENOENT, "unknown transcription session");
        goto out;
    }
    if (s->n - s->cut >= AUDIO_SAMPLE_RATE / 10 || (s->cut == 0 && s->n > 0))
        rc = session_window(t, s, s->n - s->cut, err);
    if (rc < 0)
        goto out;
    size_t len = 0;
    for (int i = 0; i < s->acc.n_segments; i++)
        len += strlen(s->acc.segments[i].text);
    char *text = malloc(len + 1);
    if (!text) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the transcript");
        goto out;
    }
    text[0] = '\0';
    for (int i = 0, at = 0; i < s->acc.n_segments; i++) {
        size_t l = strlen(s->acc.segments[i].text);
        memcpy(text + at, s->acc.segments[i].text, l + 1);
        at += (int)l;
    }
    *out = s->acc;
    memset(&s->acc, 0, sizeof s->acc);
    free(out->text);
    out->text = text;
    out->duration = (double)s->n / AUDIO_SAMPLE_RATE;
    if (!out->language[0])
        snprintf(out->language, sizeof out->language, "%s", s->language ? s->language : "en");
    *tag = s->tag;
    *p = s->next;
    t->n_sessions--;
    session_free(s);
out:
    pthread_mutex_unlock(&t->sessions_lock);
    return rc;
}

bool transcriber_session_close(struct transcriber *t, const char *id)
{
    pthread_mutex_lock(&t->sessions_lock);
    struct session **p = session_find(t, id), *s = *p;
    if (s) {
        *p = s->next;
        t->n_sessions--;
        session_free(s);
    }
    pthread_mutex_unlock(&t->sessions_lock);
    return s != NULL;
}
