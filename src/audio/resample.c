/* audio/resample.c — sample-rate conversion to Whisper's rate through libsamplerate's band-limited sinc converter, in fixed pieces converted in parallel. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <samplerate.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "audio/audio.h"

/* 90% of the lower rate's Nyquist band passed (7.2 kHz of Whisper's 8), 121 dB
 * of stopband: the converter's middle setting, about 3.5 times the speed of its
 * best one (145 dB, 97%) for a band the log-mel filters barely weigh. */
#define CONVERTER SRC_SINC_MEDIUM_QUALITY
/* How far the middle converter's filter reaches, in zero crossings each side
 * (about 46; stretched by 1 / ratio when downsampling), with room to spare. */
#define FILTER_REACH 64
/* Input samples per piece, before rounding up to whole rate periods. */
#define PIECE_SAMPLES 8192
#define MAX_THREADS 64
/* A piece's failures of our own, below libsamplerate's error numbers. */
#define PIECE_NO_MEMORY (-1)
#define PIECE_SHORT (-2) /* fewer outputs than the piece's: an internal error */

static long gcd(long a, long b)
{
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The signal is cut into pieces of a whole number of rate periods (period_in
 * input samples become exactly period_out output samples, so every piece's
 * outputs start at an integer output index). A piece is converted by a
 * converter of its own started `lead` input samples (whole periods, more
 * than the filter reaches) before it and fed as far past its end, and keeps
 * only its own outputs: each output sees the same input window, at the
 * same phase, as in one pass over the whole signal, and comes out the same
 * (test_whisper checks the bits). The pieces depend only on the rates and
 * the length, never on the thread count. */
struct resample_job {
    const float *in;
    size_t n_in;
    float *out;
    size_t out_cap;
    double ratio;
    long period_in, period_out, piece, lead;
    size_t n_pieces;
    atomic_size_t next;
    atomic_int error;   /* the first failure: a libsamplerate error, or PIECE_*; 0 if none */
    atomic_size_t tail; /* outputs of the last piece */
};

static int convert_piece(struct resample_job *j, size_t i)
{
    size_t begin = i * (size_t)j->piece;
    size_t end = begin + (size_t)j->piece < j->n_in ? begin + (size_t)j->piece : j->n_in;
    bool last = end == j->n_in;
    size_t from = begin > (size_t)j->lead ? begin - (size_t)j->lead : 0;
    size_t to = last || end + (size_t)j->lead >= j->n_in ? j->n_in : end + (size_t)j->lead;
    size_t skip = (begin - from) / (size_t)j->period_in * (size_t)j->period_out;
    size_t want = last ? SIZE_MAX : (end - begin) / (size_t)j->period_in * (size_t)j->period_out;
    size_t cap = (size_t)ceil((double)(to - from) * j->ratio) + 2;
    float *tmp = malloc(cap * sizeof *tmp);
    if (!tmp)
        return PIECE_NO_MEMORY;
    int e = 0;
    SRC_STATE *st = src_new(CONVERTER, 1, &e);
    if (!st && !e)
        e = PIECE_NO_MEMORY;
    if (st) {
        SRC_DATA d = {.data_in = j->in + from, .data_out = tmp, .input_frames = (long)(to - from),
                      .output_frames = (long)cap, .end_of_input = to == j->n_in,
                      .src_ratio = j->ratio};
        e = src_process(st, &d);
        size_t got = (size_t)d.output_frames_gen;
        if (!e && (got < skip || (!last && got - skip < want)))
            e = PIECE_SHORT; /* the lead did not cover the filter */
        size_t at = begin / (size_t)j->period_in * (size_t)j->period_out;
        size_t n = last ? got - skip : want;
        if (!e && at + n > j->out_cap)
            e = PIECE_SHORT; /* more than n_in * ratio + 2 samples */
        if (!e) {
            memcpy(j->out + at, tmp + skip, n * sizeof *tmp);
            if (last)
                atomic_store(&j->tail, n);
        }
        src_delete(st);
    }
    free(tmp);
    return e;
}

static void *resample_worker(void *arg)
{
    struct resample_job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n_pieces;) {
        int e = convert_piece(j, i);
        if (e) {
            int none = 0;
            atomic_compare_exchange_strong(&j->error, &none, e);
        }
    }
    return NULL;
}

int audio_resample(const float *in, size_t n_in, int rate_in, int rate_out, int n_threads,
                   float **out, size_t *n_out, struct err *err)
{
    *out = NULL;
    *n_out = 0;
    if (rate_in <= 0 || rate_out <= 0)
        return err_set(err, INFERD_EINVAL, "resampling from %d Hz to %d Hz", rate_in, rate_out);
    double ratio = (double)rate_out / rate_in;
    if (!src_is_valid_ratio(ratio))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "resampling from %d Hz to %d Hz: a ratio past libsamplerate's 1/256 to 256",
                       rate_in, rate_out);
    if (n_in > (size_t)(LONG_MAX / 256))
        return err_set(err, INFERD_ERANGE, "%zu samples are too many to resample", n_in);
    size_t cap = (size_t)ceil((double)n_in * ratio) + 2;
    float *y = malloc(cap * sizeof *y);
    if (!y)
        return err_set(err, INFERD_ENOMEM, "out of memory resampling %zu samples", n_in);
    if (rate_in == rate_out || n_in == 0) {
        if (n_in)
            memcpy(y, in, n_in * sizeof *y);
        *out = y;
        *n_out = n_in;
        return 0;
    }
    long g = gcd(rate_in, rate_out);
    struct resample_job j = {.in = in, .n_in = n_in, .out = y, .out_cap = cap, .ratio = ratio,
                             .period_in = rate_in / g, .period_out = rate_out / g};
    double reach = FILTER_REACH / (ratio < 1 ? ratio : 1.0) + FILTER_REACH;
    j.lead = j.period_in * (long)ceil(reach / (double)j.period_in);
    j.piece = j.period_in * ((PIECE_SAMPLES + j.period_in - 1) / j.period_in);
    if (j.piece < 4 * j.lead)
        j.piece = j.period_in * ((4 * j.lead + j.period_in - 1) / j.period_in);
    j.n_pieces = (n_in + (size_t)j.piece - 1) / (size_t)j.piece;
    atomic_init(&j.next, 0);
    atomic_init(&j.error, 0);
    atomic_init(&j.tail, 0);

    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = n_threads > 0 ? n_threads : cores > 0 ? (int)cores : 1;
    nth = nth > MAX_THREADS ? MAX_THREADS : nth;
    if ((size_t)nth > j.n_pieces)
        nth = (int)j.n_pieces;
    pthread_t threads[MAX_THREADS];
    int started = 0;
    for (; started < nth - 1; started++)
        if (pthread_create(&threads[started], NULL, resample_worker, &j))
            break; /* fewer helpers: the calling thread converts what they leave */
    resample_worker(&j);
    for (int t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    int e = atomic_load(&j.error);
    if (e) {
        free(y);
        if (e == PIECE_NO_MEMORY)
            return err_set(err, INFERD_ENOMEM, "out of memory resampling %zu samples", n_in);
        return err_set(err, INFERD_EINVAL, "resampling from %d Hz to %d Hz: %s", rate_in,
                       rate_out,
                       e == PIECE_SHORT ? "a piece came out short" : src_strerror(e));
    }
    *out = y;
    *n_out = (j.n_pieces - 1) * (size_t)(j.piece / j.period_in * j.period_out) +
             atomic_load(&j.tail);
    return 0;
}
