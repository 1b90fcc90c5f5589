/* audio/vad.c — voice activity from energy and spectral flux, and the chunking of long audio at its silences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

#define FRAME 320            /* 20 ms at 16 kHz */
#define FFT_N 512
#define JOIN_MS 300          /* speech regions closer than this are one */
#define PAD_MS 100
#define MIN_RANGE_DB 20.0f
#define CUT_SEARCH_S 5       /* an over-long region is cut in its last seconds */

/* In-place radix-2 FFT of FFT_N complex values (re, im). */
static void fft(float *re, float *im)
{
    for (int i = 1, j = 0; i < FFT_N; i++) {
        int bit = FFT_N >> 1;
        for (; j & bit; bit >>= 1)
            j ^= bit;
        j ^= bit;
        if (i < j) {
            float t = re[i];
            re[i] = re[j];
            re[j] = t;
            t = im[i];
            im[i] = im[j];
            im[j] = t;
        }
    }
    for (int len = 2; len <= FFT_N; len <<= 1) {
        double a = -2 * M_PI / len;
        for (int i = 0; i < FFT_N; i += len)
            for (int k = 0; k < len / 2; k++) {
                float wr = (float)cos(a * k), wi = (float)sin(a * k);
                float *ur = &re[i + k], *ui = &im[i + k], *vr = &re[i + k + len / 2],
                      *vi = &im[i + k + len / 2];
                float tr = *vr * wr - *vi * wi, ti = *vr * wi + *vi * wr;
                *vr = *ur - tr;
                *vi = *ui - ti;
                *ur += tr;
                *ui += ti;
            }
    }
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Per-frame scores in [0, 1] and energies (dB) of x. */
static int frame_scores(const float *x, size_t n, float **score_out, float **db_out, size_t *nf_out)
{
    size_t nf = (n + FRAME - 1) / FRAME;
    float *db = malloc((nf ? nf : 1) * sizeof *db), *flux = malloc((nf ? nf : 1) * sizeof *flux);
    float *sorted = malloc((nf ? nf : 1) * sizeof *sorted);
    float *mag = calloc(2 * (FFT_N / 2 + 1), sizeof *mag);
    float *re = malloc(FFT_N * sizeof *re), *im = malloc(FFT_N * sizeof *im);
    if (!db || !flux || !sorted || !mag || !re || !im) {
        free(db), free(flux), free(sorted), free(mag), free(re), free(im);
        return -INFERD_ENOMEM;
    }
    float *prev = mag, *cur = mag + FFT_N / 2 + 1;
    for (size_t f = 0; f < nf; f++) {
        size_t b = f * FRAME, len = n - b < FRAME ? n - b : FRAME;
        double e = 0;
        for (int i = 0; i < FFT_N; i++) {
            float v = (size_t)i < len ? x[b + i] : 0.0f;
            /* Hann over the frame */
            re[i] = (size_t)i < len ? v * (float)(0.5 - 0.5 * cos(2 * M_PI * i / FRAME)) : 0.0f;
            im[i] = 0;
            e += (size_t)i < len ? (double)v * v : 0;
        }
        db[f] = (float)(10.0 * log10(e / (double)len + 1e-10));
        fft(re, im);
        double rise = 0, total = 0;
        for (int k = 0; k <= FFT_N / 2; k++) {
            cur[k] = sqrtf(re[k] * re[k] + im[k] * im[k]);
            float d = cur[k] - prev[k];
            rise += d > 0 ? d : 0;
            total += cur[k];
        }
        flux[f] = f == 0 || total <= 0 ? 0.0f : (float)(rise / total);
        float *t = prev;
        prev = cur;
        cur = t;
    }
    memcpy(sorted, db, nf * sizeof *sorted);
    qsort(sorted, nf, sizeof *sorted, cmp_float);
    float floor_db = nf ? sorted[nf / 10] : 0, loud = nf ? sorted[(nf * 99) / 100] : 0;
    if (loud - floor_db < MIN_RANGE_DB)
        loud = floor_db + MIN_RANGE_DB;
    for (size_t f = 0; f < nf; f++) {
        float e = (db[f] - floor_db) / (loud - floor_db);
        e = e < 0 ? 0 : e > 1 ? 1 : e;
        float fl = flux[f] > 1 ? 1 : flux[f];
        flux[f] = 0.8f * e + 0.2f * fl * e; /* flux counts only where there is energy */
    }
    free(sorted), free(mag), free(re), free(im);
    *score_out = flux;
    *db_out = db;
    *nf_out = nf;
    return 0;
}

static int push_span(struct audio_span **v, int *n, int *cap, size_t start, size_t end)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        struct audio_span *g = realloc(*v, (size_t)c * sizeof *g);
        if (!g)
            return -INFERD_ENOMEM;
        *v = g;
        *cap = c;
    }
    (*v)[(*n)++] = (struct audio_span){start, end};
    return 0;
}

static int vad_frames(const float *x, size_t n, const struct audio_vad_options *o,
                      struct audio_span **out, int *n_out, float **db_out, struct err *err)
{
    float thr = o->threshold > 0 && o->threshold < 1 ? o->threshold : 0.5f;
    int min_ms = o->min_speech_ms > 0 ? o->min_speech_ms : 250;
    float *score, *db;
    size_t nf;
    if (frame_scores(x, n, &score, &db, &nf) < 0)
        return err_set(err, INFERD_ENOMEM, "out of memory for voice detection");
    struct audio_span *v = NULL;
    int nv = 0, cap = 0, rc = 0;
    size_t join = JOIN_MS * AUDIO_SAMPLE_RATE / 1000, pad = PAD_MS * AUDIO_SAMPLE_RATE / 1000,
           min_len = (size_t)min_ms * AUDIO_SAMPLE_RATE / 1000;
    for (size_t f = 0; f < nf && rc == 0;) {
        if (score[f] < thr) {
            f++;
            continue;
        }
        size_t g = f;
        while (g < nf && score[g] >= thr)
            g++;
        size_t s = f * FRAME, e = g * FRAME < n ? g * FRAME : n;
        if (nv > 0 && s - v[nv - 1].end < join)
            v[nv - 1].end = e;
        else
            rc = push_span(&v, &nv, &cap, s, e);
        f = g;
    }
    int k = 0;
    for (int i = 0; i < nv; i++) { /* drop the short ones, pad the rest */
        if (v[i].end - v[i].start < min_len)
            continue;
        size_t s = v[i].start > pad ? v[i].start - pad : 0, e = v[i].end + pad < n ? v[i].end + pad : n;
        if (k > 0 && s < v[k - 1].end)
            s = v[k - 1].end;
        v[k++] = (struct audio_span){s, e};
    }
    free(score);
    if (rc < 0) {
        free(v);
        free(db);
        return err_set(err, INFERD_ENOMEM, "out of memory for voice detection");
    }
    *out = v;
    *n_out = k;
    if (db_out)
        *db_out = db;
    else
        free(db);
    return 0;
}

int audio_vad(const float *x, size_t n, const struct audio_vad_options *o,
              struct audio_span **out, int *n_out, struct err *err)
{
    *out = NULL;
    *n_out = 0;
    return vad_frames(x, n, o, out, n_out, NULL, err);
}

/* The quietest frame boundary in [lo, hi) samples (hi - lo >= FRAME). */
static size_t quietest_cut(const float *db, size_t lo, size_t hi)
{
    size_t best = hi;
    float best_db = INFINITY;
    for (size_t f = (lo + FRAME - 1) / FRAME; (f + 1) * FRAME <= hi; f++)
        if (db[f] < best_db) {
            best_db = db[f];
            best = f * FRAME;
        }
    return best > lo ? best : hi;
}

int audio_vad_chunks(const float *x, size_t n, const struct audio_vad_options *o,
                     size_t max_len, struct audio_span **out, int *n_out, struct err *err)
{
    *out = NULL;
    *n_out = 0;
    if (max_len < 2 * AUDIO_SAMPLE_RATE)
        return err_set(err, INFERD_EINVAL, "chunks of %zu samples are too short", max_len);
    struct audio_span *sp;
    int ns;
    float *db;
    int rc = vad_frames(x, n, o, &sp, &ns, &db, err);
    if (rc < 0)
        return rc;
    struct audio_span *c = NULL;
    int nc = 0, cap = 0;
    size_t search = CUT_SEARCH_S * AUDIO_SAMPLE_RATE;
    for (int i = 0; i < ns && rc == 0;) {
        size_t start = sp[i].start, end = sp[i].end;
        int j = i + 1;
        while (j < ns && sp[j].end - start <= max_len)
            end = sp[j++].end;
        if (end - start > max_len) { /* one region longer than a chunk: cut at a quiet frame */
            end = quietest_cut(db, start + max_len - (search < max_len / 2 ? search : max_len / 2),
                               start + max_len);
            sp[i].start = end;
            j = i;
        }
        rc = push_span(&c, &nc, &cap, start, end);
        i = j;
    }
    if (rc == 0 && !o->trim) { /* tile: each cut in the middle of the silence between chunks */
        if (nc == 0) {
            for (size_t s = 0; s < n && rc == 0; s += max_len)
                rc = push_span(&c, &nc, &cap, s, s + max_len < n ? s + max_len : n);
        } else {
            for (int k = 0; k + 1 < nc; k++) {
                size_t mid = c[k].end + (c[k + 1].start - c[k].end) / 2;
                if (mid - c[k].start <= max_len && c[k + 1].end - mid <= max_len) {
                    c[k].end = mid;
                    c[k + 1].start = mid;
                } else {
                    c[k + 1].start = c[k].end; /* no room: the silence goes to the next */
                }
            }
            if (c[0].start > 0 && c[0].end <= max_len)
                c[0].start = 0;
            if (n - c[nc - 1].start <= max_len)
                c[nc - 1].end = n;
        }
    }
    free(sp);
    free(db);
    if (rc < 0) {
        free(c);
        return err_set(err, INFERD_ENOMEM, "out of memory for voice chunks");
    }
    *out = c;
    *n_out = nc;
    return 0;
}
