/* engine/sampler.c — token selection from logits with a seeded, reproducible random stream:
 * bias and windowed penalties, temperature, truncation and XTC, and the logprobs OpenAI reports. */
#define _GNU_SOURCE
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/logsumexp.h"

_Static_assert(SAMPLE_MAX_TOP == SAMPLER_MAX_TOP_LOGPROBS,
               "a backend reports as many candidates as logprobs may ask for");

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) from the top 53 bits. */
static double uniform01(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

/* ---- parameters and state ---------------------------------------------- */

static bool repetition_on(const struct sampler_params *p)
{
    return p->repetition_penalty != 0 && p->repetition_penalty != 1;
}

static bool penalties_on(const struct sampler_params *p)
{
    return repetition_on(p) || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

/* Presence and frequency keep separate counts only when both apply over different windows. */
static bool presence_split(const struct sampler_params *p)
{
    return p->presence_penalty != 0 && p->frequency_penalty != 0 &&
           p->presence_context_size != p->frequency_context_size;
}

/* The window of the shared generated-token count (counts): frequency's, else presence's. */
static int count_window(const struct sampler_params *p)
{
    if (p->frequency_penalty != 0)
        return p->frequency_context_size;
    return p->presence_penalty != 0 ? p->presence_context_size : 0;
}

/* How many recent tokens the windows need kept (0: no active penalty has a window). */
static int ring_size(const struct sampler_params *p)
{
    int n = repetition_on(p) ? p->repetition_context_size : 0;
    int c = count_window(p);
    n = c > n ? c : n;
    if (presence_split(p) && p->presence_context_size > n)
        n = p->presence_context_size;
    return n;
}

static int check_windows_and_xtc(const struct sampler_params *p, struct err *err)
{
    if (p->repetition_context_size < 0 || p->presence_context_size < 0 ||
        p->frequency_context_size < 0)
        return err_set(err, INFERD_ERANGE,
                       "penalty context sizes %d, %d, %d (repetition, presence, frequency) "
                       "must be >= 0 (0: the whole history)",
                       p->repetition_context_size, p->presence_context_size,
                       p->frequency_context_size);
    if (!(p->xtc_probability >= 0 && p->xtc_probability <= 1))
        return err_set(err, INFERD_ERANGE, "xtc_probability %g must be in [0, 1]",
                       p->xtc_probability);
    if (!(p->xtc_threshold >= 0 && p->xtc_threshold <= 0.5f))
        return err_set(err, INFERD_ERANGE, "xtc_threshold %g must be in [0, 0.5]",
                       p->xtc_threshold);
    if (p->n_xtc_keep < 0 || p->n_xtc_keep > SAMPLER_MAX_XTC_KEEP)
        return err_set(err, INFERD_ERANGE, "%d XTC-exempt tokens: at most %d", p->n_xtc_keep,
                       SAMPLER_MAX_XTC_KEEP);
    return 0;
}

static int check_params(const struct sampler_params *p, int n_vocab, struct err *err)
{
    if (n_vocab < 1)
        return err_set(err, INFERD_EINVAL, "vocabulary size %d must be >= 1", n_vocab);
    if (p->temperature < 0 || !isfinite(p->temperature))
        return err_set(err, INFERD_ERANGE, "temperature %g must be >= 0", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return err_set(err, INFERD_ERANGE, "top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return err_set(err, INFERD_ERANGE, "min_p %g must be in [0, 1]", p->min_p);
    if (p->top_k < 0)
        return err_set(err, INFERD_ERANGE, "top_k %d must be >= 0", p->top_k);
    if (p->repetition_penalty != 0 && !(p->repetition_penalty > 0 && p->repetition_penalty <= 10))
        return err_set(err, INFERD_ERANGE, "repetition_penalty %g must be in (0, 10] (0 or 1: off)",
                       p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return err_set(err, INFERD_ERANGE, "presence_penalty %g must be in [-2, 2]",
                       p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return err_set(err, INFERD_ERANGE, "frequency_penalty %g must be in [-2, 2]",
                       p->frequency_penalty);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return err_set(err, INFERD_EINVAL, "logit_bias has %d entries but %s", p->n_logit_bias,
                       p->n_logit_bias < 0 ? "a count cannot be negative" : "no array");
    for (int i = 0; i < p->n_logit_bias; i++) {
        const struct sampler_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return err_set(err, INFERD_ERANGE, "logit_bias token %d is outside the vocabulary [0, %d)",
                           (int)b->token, n_vocab);
        if (!(b->bias >= -100 && b->bias <= 100))
            return err_set(err, INFERD_ERANGE, "logit_bias %g for token %d must be in [-100, 100]",
                           b->bias, (int)b->token);
    }
    return check_windows_and_xtc(p, err);
}

static int by_token_then_index(const void *a_, const void *b_)
{
    const int32_t *a = a_, *b = b_; /* pairs (token, index in the request) */
    if (a[0] != b[0])
        return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

/* One entry per token, ascending ids, biases summed in the request's order:
 * the sum is added to the logit once, on the host and on a backend alike.
 * Returns the number of entries, or -1 when out of memory. */
static int merge_bias(const struct sampler_logit_bias *in, int n, struct sampler_logit_bias *out)
{
    int32_t *pairs = malloc((size_t)n * 2 * sizeof *pairs);
    if (!pairs)
        return -1;
    for (int i = 0; i < n; i++) {
        pairs[2 * i] = in[i].token;
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, (size_t)n, 2 * sizeof *pairs, by_token_then_index);
    int m = 0;
    for (int i = 0; i < n; i++) {
        const struct sampler_logit_bias *b = &in[pairs[2 * i + 1]];
        if (m > 0 && out[m - 1].token == b->token)
            out[m - 1].bias += b->bias;
        else
            out[m++] = *b;
    }
    free(pairs);
    return m;
}

int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab, struct err *err)
{
    int rc = check_params(p, n_vocab, err);
    if (rc < 0)
        return rc;
    *s = (struct sampler){.params = *p, .rng_state = p->seed, .n_vocab = n_vocab};
    size_t n = (size_t)n_vocab;
    bool ok = (s->probs = malloc(n * sizeof *s->probs)) && (s->order = malloc(n * sizeof *s->order));
    if (ok && p->n_logit_bias > 0) {
        ok = (s->bias = malloc((size_t)p->n_logit_bias * sizeof *s->bias));
        int merged = ok ? merge_bias(p->logit_bias, p->n_logit_bias, s->bias) : -1;
        ok = merged >= 0;
        s->params.n_logit_bias = ok ? merged : 0;
    }
    s->params.logit_bias = s->bias;
    if (ok && penalties_on(p)) {
        ok = (s->counts = calloc(n, sizeof *s->counts)) && (s->listed = calloc(n, sizeof *s->listed)) &&
             (s->seen = malloc(n * sizeof *s->seen)) &&
             (!repetition_on(p) || (s->in_rep = calloc(n, sizeof *s->in_rep))) &&
             (!presence_split(p) || (s->in_presence = calloc(n, sizeof *s->in_presence))) &&
             (ring_size(p) == 0 ||
              (s->ring = malloc((size_t)ring_size(p) * sizeof *s->ring)));
        s->ring_cap = ok ? ring_size(p) : 0;
        for (int i = 0; ok && i < s->params.n_logit_bias; i++)
            s->listed[s->bias[i].token] |= SAMPLER_LISTED_BIASED;
    }
    if (ok && (p->n_logit_bias > 0 || penalties_on(p)))
        ok = (s->processed = malloc(n * sizeof *s->processed));
    if (!ok) {
        sampler_free(s);
        return err_set(err, INFERD_ENOMEM, "out of memory for the sampler");
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->probs);
    free(s->order);
    free(s->bias);
    free(s->processed);
    free(s->counts);
    free(s->listed);
    free(s->seen);
    free(s->in_rep);
    free(s->in_presence);
    free(s->ring);
    free(s->skip);
    s->skip = NULL;
    s->in_rep = s->in_presence = s->ring = NULL;
    s->ring_cap = 0;
    s->n_pushed = s->n_prompt_pushed = 0;
    free(s->adjust);
    s->adjust = NULL;
    s->adjust_cap = 0;
    s->last_on_backend = false;
    s->probs = s->processed = NULL;
    s->order = s->counts = s->seen = NULL;
    s->bias = NULL;
    s->listed = NULL;
    s->params.logit_bias = NULL;
    s->params.n_logit_bias = 0;
    s->n_seen = 0;
    s->last = NULL;
}

static void list_token(struct sampler *s, int32_t token)
{
    if (!(s->listed[token] & SAMPLER_LISTED_SEEN)) {
        s->listed[token] |= SAMPLER_LISTED_SEEN;
        s->seen[s->n_seen++] = token;
        if (s->skip)
            s->skip[token] = -INFINITY;
    }
}

/* The token at position n - window leaves a window of that many tokens when
 * position n arrives, if it is one the window counts (position >= first). */
static void slide_out(struct sampler *s, int32_t *count, int window, int64_t first)
{
    int64_t leaving = s->n_pushed - window;
    if (window > 0 && leaving >= first)
        count[s->ring[leaving % s->ring_cap]]--;
}

static void push_token(struct sampler *s, int32_t token)
{
    if (s->ring)
        s->ring[s->n_pushed % s->ring_cap] = token;
    s->n_pushed++;
}

void sampler_observe_prompt(struct sampler *s, const int32_t *tokens, int n)
{
    if (!s->seen || !repetition_on(&s->params)) /* only the repetition penalty sees the prompt */
        return;
    int window = s->params.repetition_context_size;
    for (int i = window > 0 && n > window ? n - window : 0; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < s->n_vocab) {
            list_token(s, tokens[i]);
            s->in_rep[tokens[i]]++;
            if (window > 0) { /* with no window, nothing slides out: no position needed */
                push_token(s, tokens[i]);
                s->n_prompt_pushed++;
            }
        }
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (!s->seen || token < 0 || token >= s->n_vocab)
        return;
    const struct sampler_params *p = &s->params;
    list_token(s, token);
    if (s->ring) { /* before token takes its position (and perhaps the leaving one's slot) */
        if (s->in_rep)
            slide_out(s, s->in_rep, p->repetition_context_size, 0);
        slide_out(s, s->counts, count_window(p), s->n_prompt_pushed);
        if (s->in_presence)
            slide_out(s, s->in_presence, p->presence_context_size, s->n_prompt_pushed);
    }
    push_token(s, token);
    if (s->in_rep)
        s->in_rep[token]++;
    if (s->in_presence)
        s->in_presence[token]++;
    s->counts[token]++;
}

/* ---- logits processing ------------------------------------------------- */

/* Running maxima kept apart: independent max chains instead of one branch a logit
 * (x > m ? x : m keeps m for a NaN x, as the one-branch scan does). */
#define ARGMAX_LANES 16

int32_t logits_argmax(const float *logits, int n)
{
    /* the largest value first (NaN never compares greater, so it never counts), then the
     * lowest id holding it: a branch-free pass and a short scan, where one pass of a
     * branch per logit took ~4 us a row of 8,192 */
    float lane[ARGMAX_LANES];
    for (int k = 0; k < ARGMAX_LANES; k++)
        lane[k] = -INFINITY;
    int i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int k = 0; k < ARGMAX_LANES; k++)
            lane[k] = logits[i + k] > lane[k] ? logits[i + k] : lane[k];
    float best_v = -INFINITY;
    for (int k = 0; k < ARGMAX_LANES; k++)
        best_v = lane[k] > best_v ? lane[k] : best_v;
    for (; i < n; i++)
        best_v = logits[i] > best_v ? logits[i] : best_v;
    if (best_v == -INFINITY) /* nothing above -inf: token 0 */
        return 0;
    for (i = 0; logits[i] != best_v; i++)
        ;
    return i;
}

/* A generated or seen token's penalties (fmaf: one rounding, as on a backend). */
static float penalized(float v, bool repetition, float r, int32_t count, float presence,
                       float frequency)
{
    if (repetition)
        v = v > 0 ? v / r : v * r;
    if (count > 0)
        v = fmaf(-frequency, (float)count, v) - presence;
    return v;
}

/* One listed token's logit after its penalties, as its windows stand now. */
static float penalize_token(const struct sampler *s, int32_t t, float v)
{
    const struct sampler_params *p = &s->params;
    bool repeat = s->in_rep && s->in_rep[t] > 0;
    if (!s->in_presence)
        return penalized(v, repeat, p->repetition_penalty, s->counts[t], p->presence_penalty,
                         p->frequency_penalty);
    /* separate windows: the same operations, each only where its own count is */
    v = penalized(v, repeat, p->repetition_penalty, s->counts[t], 0, p->frequency_penalty);
    return s->in_presence[t] > 0 ? v - p->presence_penalty : v;
}


/* ---- the mask step (structured output) ---------------------------------- */

int sampler_set_mask(struct sampler *s, const uint32_t *mask)
{
    if (mask && !s->processed && !(s->processed = malloc((size_t)s->n_vocab * sizeof *s->processed)))
        return -INFERD_ENOMEM;
    s->mask = mask;
    return 0;
}

/* x[t] = -inf for every token the mask leaves out; a word at a time, so whole runs of
 * disallowed tokens cost one test per 32. */
static void apply_mask(const struct sampler *s, float *x)
{
    int n = s->n_vocab;
    for (int w = 0; w * 32 < n; w++) {
        uint32_t bits = s->mask[w];
        if (bits == 0xffffffffu)
            continue;
        int end = w * 32 + 32 < n ? w * 32 + 32 : n;
        for (int t = w * 32; t < end; t++)
            if (!(bits >> (t & 31) & 1u))
                x[t] = -INFINITY;
    }
}

/* The logits to choose from: the caller's row when no bias, penalty or mask
 * applies yet, otherwise a copy with them applied (O(vocab) copy plus
 * O(bias entries + distinct seen tokens)), the mask last. */
static const float *processed_logits(struct sampler *s, const float *logits)
{
    const struct sampler_params *p = &s->params;
    if (p->n_logit_bias == 0 && s->n_seen == 0 && !s->mask)
        return logits;
    float *x = s->processed;
    memcpy(x, logits, (size_t)s->n_vocab * sizeof *x);
    for (int i = 0; i < p->n_logit_bias; i++)
        x[s->bias[i].token] += s->bias[i].bias;
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        x[t] = penalize_token(s, t, x[t]);
    }
    if (s->mask)
        apply_mask(s, x);
    return x;
}

/* ---- truncation -------------------------------------------------------- */

/* The order candidates are ranked in: descending probability, ties lower id
 * first. Total, since probabilities are never NaN. */
static bool ranks_before(const float *probs, int32_t a, int32_t b)
{
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
}

static int by_prob_desc(const void *a, const void *b, void *probs_)
{
    const float *probs = probs_;
    float pa = probs[*(const int32_t *)a], pb = probs[*(const int32_t *)b];
    if (pa != pb)
        return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Moves the k best-ranked of order[0..n) into order[0..k), in no particular
 * order (quickselect; expected O(n)). */
static void select_best(int32_t *order, int n, int k, const float *probs)
{
    int lo = 0, hi = n - 1, nth = k - 1;
    while (lo < hi) {
        int32_t pivot = order[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (ranks_before(probs, order[i], pivot))
                i++;
            while (ranks_before(probs, pivot, order[j]))
                j--;
            if (i <= j) {
                int32_t t = order[i];
                order[i++] = order[j];
                order[j--] = t;
            }
        }
        if (nth <= j)
            hi = j;
        else if (nth >= i)
            lo = i;
        else
            break;
    }
}

/* Applies top-k, min-p and top-p to probs: leaves the kept candidates, best
 * first, in order[0..keep) and returns keep. Only the candidates that can
 * survive are sorted: those at or above the min-p floor and at or above the
 * probability below which all tokens together hold less than 1 - top_p; if
 * rounding makes that second cut too tight, it is redone without it. The
 * result equals sorting the whole vocabulary. */
static int truncate_candidates(struct sampler *s, float max_prob)
{
    const struct sampler_params *p = &s->params;
    int n = s->n_vocab;
    int cap = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    float min_prob = p->min_p > 0 ? p->min_p * max_prob : 0;
    float tail = p->top_p < 1 ? (1 - p->top_p) / (float)n : 0;
    for (int attempt = 0;; attempt++) {
        float cut = attempt == 0 && tail > min_prob ? tail : min_prob;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->probs[i] >= cut)
                s->order[m++] = i;
        if (m == 0 && cut > min_prob) /* rounding put even the best token under the tail cut */
            continue;
        if (m > cap) {
            select_best(s->order, m, cap, s->probs);
            m = cap;
        }
        qsort_r(s->order, (size_t)m, sizeof *s->order, by_prob_desc, s->probs);

        int keep = m;
        if (p->min_p > 0) {
            int k = 1;
            while (k < keep && s->probs[s->order[k]] >= min_prob)
                k++;
            keep = k;
        }
        if (p->top_p < 1) {
            double cum = 0;
            int k = 0;
            while (k < keep) {
                cum += s->probs[s->order[k++]];
                if (cum >= p->top_p)
                    break;
            }
            /* Ran out of candidates that the tail cut alone removed: redo. */
            if (cum < p->top_p && keep == m && m < cap && cut > min_prob)
                continue;
            keep = k;
        }
        return keep;
    }
}

/* ---- XTC ------------------------------------------------------------------ */

/* A candidate's weight at temperature 1, relative to the largest logit max. */
static float weight_t1(float v, float max)
{
    if (max == INFINITY)
        return v == INFINITY ? 1.0f : 0.0f;
    float e = expf(v - max);
    return e == e ? e : 0.0f; /* NaN logits: weight zero */
}

static bool xtc_exempt(const struct sampler_params *p, int32_t token)
{
    for (int i = 0; i < p->n_xtc_keep; i++)
        if (p->xtc_keep[i] == token)
            return true;
    return false;
}

/* XTC over the kept candidates order[0..keep) of processed logits x: when
 * the draw (the stream's next number) is below xtc_probability, drops every
 * candidate whose renormalized temperature-1 probability is above the
 * threshold except the least likely of those (ties with it stay) and the
 * exempt tokens, keeping the rest in their order. Returns the new keep (>= 1). */
static int xtc_exclude(struct sampler *s, const float *x, int keep)
{
    const struct sampler_params *p = &s->params;
    if (!(p->xtc_probability > 0) || !(uniform01(&s->rng_state) < p->xtc_probability))
        return keep;
    float max = -INFINITY;
    for (int k = 0; k < keep; k++)
        if (x[s->order[k]] > max)
            max = x[s->order[k]];
    double sum = 0;
    for (int k = 0; k < keep; k++)
        sum += weight_t1(x[s->order[k]], max);
    /* the least likely candidate above the threshold, and how many are above it */
    float least = INFINITY;
    int above = 0;
    for (int k = 0; k < keep; k++) {
        float q = (float)(weight_t1(x[s->order[k]], max) / sum);
        if (q > p->xtc_threshold) {
            above++;
            least = q < least ? q : least;
        }
    }
    if (above < 2)
        return keep;
    int m = 0;
    for (int k = 0; k < keep; k++) {
        int32_t t = s->order[k];
        float q = (float)(weight_t1(x[t], max) / sum);
        if (!(q > least) || xtc_exempt(p, t))
            s->order[m++] = t;
    }
    return m;
}

/* ---- picking ----------------------------------------------------------- */

bool sampler_is_greedy(const struct sampler *s)
{
    return s->params.temperature == 0.0f || s->params.top_k == 1;
}

/* A sampling pick's candidates from processed logits x whose largest is x[best]: their
 * probabilities at the temperature in s->probs, the kept ones (top-k, min-p, top-p) best first
 * in s->order[0..keep). Returns keep; 0 when nothing is above -inf. */
static int sampling_candidates(struct sampler *s, const float *x, int32_t best)
{
    const struct sampler_params *p = &s->params;
    int n = s->n_vocab;
    float max = x[best];
    if (!(max > -INFINITY))
        return 0;
    double sum = 0;
    if (max == INFINITY) { /* +inf logits share all the probability */
        for (int i = 0; i < n; i++) {
            s->probs[i] = x[i] == INFINITY ? 1.0f : 0.0f;
            sum += s->probs[i];
        }
    } else {
        for (int i = 0; i < n; i++) {
            float e = expf((x[i] - max) / p->temperature);
            s->probs[i] = e == e ? e : 0.0f; /* NaN logits: probability zero */
            sum += s->probs[i];
        }
    }
    for (int i = 0; i < n; i++)
        s->probs[i] = (float)(s->probs[i] / sum);
    int keep = n;
    if ((p->top_k > 0 && p->top_k < n) || p->min_p > 0 || p->top_p < 1) {
        keep = truncate_candidates(s, s->probs[best]);
    } else {
        for (int i = 0; i < n; i++)
            s->order[i] = i;
    }
    return keep;
}

/* Whether token t has a bias entry (s->bias holds one per token, ids ascending). */
static bool has_bias(const struct sampler *s, int32_t t)
{
    int lo = 0, hi = s->params.n_logit_bias;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->bias[mid].token < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->params.n_logit_bias && s->bias[lo].token == t;
}

/* The lowest id of the largest logit + skip (0, or -inf for a changed token; NaN counts as
 * -inf), or -1 when none is above -inf: logits_argmax's passes over the sums. */
static int32_t argmax_unchanged(const float *logits, const float *skip, int n)
{
    float lane[ARGMAX_LANES];
    for (int k = 0; k < ARGMAX_LANES; k++)
        lane[k] = -INFINITY;
    int i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int k = 0; k < ARGMAX_LANES; k++) {
            float v = logits[i + k] + skip[i + k];
            lane[k] = v > lane[k] ? v : lane[k];
        }
    float best_v = -INFINITY;
    for (int k = 0; k < ARGMAX_LANES; k++)
        best_v = lane[k] > best_v ? lane[k] : best_v;
    for (; i < n; i++)
        best_v = logits[i] + skip[i] > best_v ? logits[i] + skip[i] : best_v;
    if (best_v == -INFINITY)
        return -1;
    for (i = 0; logits[i] + skip[i] != best_v; i++)
        ;
    return i;
}

/* s->skip, made on first use: -inf at every token bias or penalties change, else 0. */
static bool make_skip(struct sampler *s)
{
    if (s->skip)
        return true;
    if (!(s->skip = calloc((size_t)s->n_vocab, sizeof *s->skip)))
        return false;
    for (int i = 0; i < s->params.n_logit_bias; i++)
        s->skip[s->bias[i].token] = -INFINITY;
    for (int i = 0; i < s->n_seen; i++)
        s->skip[s->seen[i]] = -INFINITY;
    return true;
}

/* Candidate t of processed value v against the best so far (ties to the lower id); kept in
 * s->order and s->probs (a greedy pick does not use them) for sampler_logprobs. */
static void changed_candidate(struct sampler *s, int m, int32_t t, float v, int32_t *best,
                              float *best_v)
{
    s->order[m] = t;
    s->probs[m] = v;
    if (v > *best_v || (v == *best_v && v > -INFINITY && t < *best)) {
        *best = t;
        *best_v = v;
    }
}

/* A greedy pick without processed_logits' copy of the row (an O(vocab) write and read a row
 * per step), where bias entries and penalties alone change the row (no mask): the argmax of
 * the processed row is the row's own argmax over the tokens they leave alone against each
 * changed token's processed value (computed as processed_logits computes it), ties to the
 * lower id, token 0 when nothing is above -inf. The changed tokens and their values stay in
 * s->order and s->probs (s->n_changed of them) for sampler_logprobs. -1 (nothing done)
 * where the copy is taken: a sampling pick, a mask, nothing changed, or out of memory. */
static int32_t greedy_sparse_pick(struct sampler *s, const float *logits)
{
    const struct sampler_params *p = &s->params;
    if (!sampler_is_greedy(s) || s->mask || (p->n_logit_bias == 0 && s->n_seen == 0))
        return -1;
    /* the best unchanged token: with penalties (many changed tokens, the row's argmax often
     * among them) in one pass over row + skip, with bias alone the row's argmax unless it
     * has an entry */
    int32_t best = s->listed ? -1 : logits_argmax(logits, s->n_vocab);
    if (s->listed || has_bias(s, best)) {
        if (!make_skip(s))
            return -1;
        best = argmax_unchanged(logits, s->skip, s->n_vocab);
    }
    float best_v = best >= 0 && logits[best] > -INFINITY ? logits[best] : -INFINITY;
    best = best_v > -INFINITY ? best : -1;
    /* with no logprobs to give, penalties that only lower a logit (the OpenAI and HF ones
     * with non-negative amounts) leave a token below the best as it is below it already */
    bool prune = s->no_logprobs && p->repetition_penalty >= 0 &&
                 (p->repetition_penalty == 0 || p->repetition_penalty >= 1) &&
                 p->presence_penalty >= 0 && p->frequency_penalty >= 0;
    int m = 0;
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = s->bias[i].token;
        float v = logits[t] + s->bias[i].bias;
        if (prune && v < best_v)
            continue;
        if (s->listed && (s->listed[t] & SAMPLER_LISTED_SEEN))
            v = penalize_token(s, t, v);
        changed_candidate(s, m++, t, v, &best, &best_v);
    }
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        if ((s->listed[t] & SAMPLER_LISTED_BIASED) || (prune && logits[t] < best_v))
            continue;
        changed_candidate(s, m++, t, penalize_token(s, t, logits[t]), &best, &best_v);
    }
    s->n_changed = m;
    s->last = s->no_logprobs ? NULL : logits;
    s->last_sparse = !s->no_logprobs;
    s->last_on_backend = false;
    return best >= 0 ? best : 0;
}

void sampler_skip_logprobs(struct sampler *s) { s->no_logprobs = true; }

/* The pick from processed logits x. u: the uniform number for a sampling
 * pick (NULL: draw it from the stream); *used: whether one decided the pick. */
static int32_t pick_processed(struct sampler *s, const float *x, const double *u, bool *used)
{
    int n = s->n_vocab;
    s->last = x;
    s->last_sparse = false;
    s->last_on_backend = false;
    *used = false;
    int32_t best = logits_argmax(x, n);
    if (sampler_is_greedy(s))
        return best;
    int keep = sampling_candidates(s, x, best);
    if (keep == 0) /* nothing above -inf: the argmax fallback, token 0 */
        return best;
    if (!u) /* a backend's pick (u given) was described only when XTC did not fire */
        keep = xtc_exclude(s, x, keep);

    double total = 0;
    for (int k = 0; k < keep; k++)
        total += s->probs[s->order[k]];
    *used = true;
    double r = (u ? *u : uniform01(&s->rng_state)) * total;
    for (int k = 0; k < keep; k++) {
        r -= s->probs[s->order[k]];
        if (r < 0)
            return s->order[k];
    }
    return s->order[keep - 1];
}

int32_t sampler_pick(struct sampler *s, const float *logits)
{
    int32_t token = greedy_sparse_pick(s, logits);
    if (token >= 0)
        return token;
    bool used;
    return pick_processed(s, processed_logits(s, logits), NULL, &used);
}

/* ---- verification picks (speculative decoding) ---------------------------- */

/* The kept candidates' total probability (their sum before renormalizing). */
static double kept_total(const struct sampler *s, int keep)
{
    double total = 0;
    for (int k = 0; k < keep; k++)
        total += s->probs[s->order[k]];
    return total;
}

int sampler_probs(struct sampler *s, const float *logits, float *probs)
{
    const float *x = processed_logits(s, logits);
    int n = s->n_vocab;
    memset(probs, 0, (size_t)n * sizeof *probs);
    int32_t best = logits_argmax(x, n);
    int keep = sampler_is_greedy(s) ? 0 : sampling_candidates(s, x, best);
    if (keep == 0) {
        probs[best] = 1;
        return 0;
    }
    double total = kept_total(s, keep);
    for (int k = 0; k < keep; k++)
        probs[s->order[k]] = (float)(s->probs[s->order[k]] / total);
    return 0;
}

int32_t sampler_pick_draft(struct sampler *s, const float *logits, int32_t draft, const float *q,
                           bool *accepted)
{
    const float *x = processed_logits(s, logits);
    int n = s->n_vocab;
    s->last = x;
    s->last_sparse = false;
    s->last_on_backend = false;
    int32_t best = logits_argmax(x, n);
    int keep = sampler_is_greedy(s) ? 0 : sampling_candidates(s, x, best);
    if (keep == 0) { /* greedy, or nothing above -inf (token 0, as sampler_pick): no number drawn */
        *accepted = best == draft;
        return best;
    }
    double total = kept_total(s, keep);
    double p_draft = 0;
    for (int k = 0; k < keep; k++)
        if (s->order[k] == draft)
            p_draft = s->probs[draft] / total;
    double q_draft = q && draft >= 0 && draft < n ? q[draft] : 1.0;
    /* accepted with probability min(1, p / q) */
    if (uniform01(&s->rng_state) * q_draft < p_draft) {
        *accepted = true;
        return draft;
    }
    *accepted = false;
    /* rejected: a token from norm(max(0, p - q)); q is zero outside the draft for a point mass */
    double residual = 0;
    for (int k = 0; k < keep; k++) {
        int32_t t = s->order[k];
        double r = s->probs[t] / total - (q ? q[t] : t == draft ? 1.0 : 0.0);
        residual += r > 0 ? r : 0;
    }
    double r = uniform01(&s->rng_state) * residual;
    int32_t last = best;
    for (int k = 0; k < keep; k++) {
        int32_t t = s->order[k];
        double d = s->probs[t] / total - (q ? q[t] : t == draft ? 1.0 : 0.0);
        if (!(d > 0))
            continue;
        last = t;
        if ((r -= d) < 0)
            return t;
    }
    return last; /* rounding left r at or just above zero */
}

/* ---- picks made by a backend --------------------------------------------- */

int sampler_fill_spec(struct sampler *s, int n_top, struct sample_spec *spec)
{
    const struct sampler_params *p = &s->params;
    if (s->in_presence && s->n_seen > 0) /* one count per token cannot carry two windows */
        return -INFERD_EUNSUPPORTED;
    uint64_t peek = s->rng_state;
    bool sampling = !sampler_is_greedy(s);
    if (sampling && p->xtc_probability > 0 && uniform01(&peek) < p->xtc_probability)
        return -INFERD_EUNSUPPORTED; /* XTC fires: the host picks (and draws the same number) */
    int need = p->n_logit_bias + s->n_seen;
    if (need > s->adjust_cap) {
        struct sample_adjust *grown = realloc(s->adjust, (size_t)need * sizeof *grown);
        if (!grown)
            return -INFERD_ENOMEM;
        s->adjust = grown;
        s->adjust_cap = need;
    }
    bool repetition = repetition_on(p);
    int n = 0;
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = s->bias[i].token;
        s->adjust[n++] = (struct sample_adjust){
            .token = t,
            .bias = s->bias[i].bias,
            .count = s->counts ? s->counts[t] : 0,
            .repeat = s->in_rep && s->in_rep[t] > 0,
        };
    }
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        if (s->listed[t] & SAMPLER_LISTED_BIASED) /* already there, with its bias */
            continue;
        bool repeat = s->in_rep && s->in_rep[t] > 0;
        if (s->counts[t] == 0 && !repeat) /* slid out of every window: nothing to apply */
            continue;
        s->adjust[n++] = (struct sample_adjust){.token = t, .count = s->counts[t], .repeat = repeat};
    }
    *spec = (struct sample_spec){
        .temperature = p->temperature,
        .top_k = p->top_k,
        .top_p = p->top_p,
        .min_p = p->min_p,
        .u = sampling ? uniform01(&peek) : 0.0,
        .repetition_penalty = repetition ? p->repetition_penalty : 1.0f,
        .presence_penalty = p->presence_penalty,
        .frequency_penalty = p->frequency_penalty,
        .adjust = s->adjust,
        .n_adjust = n,
        .n_top = n_top < 0 ? -1 : n_top > SAMPLE_MAX_TOP ? SAMPLE_MAX_TOP : n_top,
        .mask = s->mask,
    };
    return 0;
}

int32_t sampler_take_result(struct sampler *s, const struct sample_spec *spec,
                            const struct sample_result *res, const float *host_row)
{
    bool used;
    int32_t token;
    if (res->need_host) {
        token = pick_processed(s, host_row, &spec->u, &used);
    } else {
        used = res->used_random != 0;
        token = res->token;
        s->result = *res;
        s->last = NULL;
        s->last_on_backend = true;
    }
    if (used && s->params.xtc_probability > 0) /* the XTC draw that did not fire, first */
        uniform01(&s->rng_state);
    if (used) /* the number the spec peeked at is now spent */
        uniform01(&s->rng_state);
    return token;
}

/* ---- logprobs ---------------------------------------------------------- */

/* log softmax of one logit v, given the row's largest logit and log Z. */
static float logprob_of(float v, float max, double log_z)
{
    if (max == INFINITY)
        return v == INFINITY ? (float)-log_z : -INFINITY;
    return v == v ? (float)((double)v - log_z) : -INFINITY;
}

/* sampler_logprobs for a pick a backend made, from its result's numbers. */
static int logprobs_of_result(const struct sample_result *r, int32_t token, int top_n,
                              float *token_logprob, struct token_logprob *top)
{
    float max = r->max_logit;
    if (!(max > -INFINITY)) {
        *token_logprob = -INFINITY;
        return 0;
    }
    float v = NAN;
    bool found = token == r->token;
    if (found)
        v = r->logit;
    for (int k = 0; k < r->n_top && !found; k++)
        if (r->top[k].token == token) {
            v = r->top[k].logit;
            found = true;
        }
    if (!found)
        return -INFERD_EINVAL;
    double log_z = r->log_z;
    *token_logprob = logprob_of(v, max, log_z);
    int m = 0;
    for (int k = 0; k < r->n_top && m < top_n; k++) {
        float c = r->top[k].logit;
        if (!(c > -INFINITY) || (max == INFINITY && c != INFINITY))
            continue;
        top[m++] = (struct token_logprob){.token = r->top[k].token,
                                          .logprob = logprob_of(c, max, log_z)};
    }
    return m;
}

int sampler_logprobs(struct sampler *s, int32_t token, int top_n, float *token_logprob,
                     struct token_logprob *top)
{
    if (s->last && s->last_sparse) { /* the greedy pick's row, its changed tokens set now */
        memcpy(s->processed, s->last, (size_t)s->n_vocab * sizeof *s->processed);
        for (int i = 0; i < s->n_changed; i++)
            s->processed[s->order[i]] = s->probs[i];
        s->last = s->processed;
        s->last_sparse = false;
    }
    const float *x = s->last;
    int n = s->n_vocab;
    if ((!x && !s->last_on_backend) || token < 0 || token >= n)
        return -INFERD_EINVAL;
    if (top_n < 0)
        top_n = 0;
    if (top_n > SAMPLER_MAX_TOP_LOGPROBS)
        top_n = SAMPLER_MAX_TOP_LOGPROBS;
    if (s->last_on_backend)
        return logprobs_of_result(&s->result, token, top_n, token_logprob, top);

    float max = x[logits_argmax(x, n)];
    if (!(max > -INFINITY)) { /* every token has probability zero: nothing to report */
        *token_logprob = -INFINITY;
        return 0;
    }
    /* log Z; with +inf logits, the mass is spread evenly over them. */
    double log_z;
    if (max == INFINITY) {
        int n_inf = 0;
        for (int i = 0; i < n; i++)
            n_inf += x[i] == INFINITY;
        log_z = log((double)n_inf);
    } else {
        log_z = logsumexp_f32(x, (size_t)n); /* NaN logits add nothing */
    }
    *token_logprob = logprob_of(x[token], max, log_z);

    /* Top-n by insertion into a sorted list of at most 20: one comparison
     * for most tokens. Scanning ids upwards and inserting only strictly
     * better values keeps lower ids first among ties. */
    int m = 0;
    float worst = -INFINITY;
    for (int i = 0; i < n && top_n > 0; i++) {
        float v = x[i];
        if (!(v > -INFINITY) || (max == INFINITY && v != INFINITY) || (m == top_n && !(v > worst)))
            continue;
        int j = m < top_n ? m++ : top_n - 1;
        while (j > 0 && top[j - 1].logprob < v) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (struct token_logprob){.token = i, .logprob = v}; /* the raw logit until the pass below */
        worst = top[m - 1].logprob;
    }
    for (int k = 0; k < m; k++)
        top[k].logprob = logprob_of(top[k].logprob, max, log_z);
    return m;
}
