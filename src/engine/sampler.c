/* engine/sampler.c — token selection from logits with a seeded, reproducible random stream:
 * bias and penalties, temperature and truncation, and the logprobs OpenAI reports. */
#define _GNU_SOURCE
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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
    return 0;
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
        if (ok)
            memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->params.logit_bias = s->bias;
    if (ok && penalties_on(p))
        ok = (s->counts = calloc(n, sizeof *s->counts)) && (s->listed = calloc(n, sizeof *s->listed)) &&
             (s->seen = malloc(n * sizeof *s->seen));
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
    if (!s->listed[token]) {
        s->listed[token] = 1;
        s->seen[s->n_seen++] = token;
    }
}

void sampler_observe_prompt(struct sampler *s, const int32_t *tokens, int n)
{
    if (!s->seen || !repetition_on(&s->params)) /* only the repetition penalty sees the prompt */
        return;
    for (int i = 0; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < s->n_vocab)
            list_token(s, tokens[i]);
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (!s->seen || token < 0 || token >= s->n_vocab)
        return;
    list_token(s, token);
    s->counts[token]++;
}

/* ---- logits processing ------------------------------------------------- */

int32_t logits_argmax(const float *logits, int n)
{
    int32_t best = 0;
    float best_v = -INFINITY; /* NaN never compares greater, so it never wins */
    for (int i = 0; i < n; i++)
        if (logits[i] > best_v) {
            best_v = logits[i];
            best = i;
        }
    return best;
}

/* The logits to choose from: the caller's row when no bias or penalty
 * applies yet, otherwise a copy with them applied (O(vocab) copy plus
 * O(bias entries + distinct seen tokens)). */
static const float *processed_logits(struct sampler *s, const float *logits)
{
    const struct sampler_params *p = &s->params;
    if (p->n_logit_bias == 0 && s->n_seen == 0)
        return logits;
    float *x = s->processed;
    memcpy(x, logits, (size_t)s->n_vocab * sizeof *x);
    for (int i = 0; i < p->n_logit_bias; i++)
        x[s->bias[i].token] += s->bias[i].bias;
    bool repetition = repetition_on(p);
    float r = p->repetition_penalty, presence = p->presence_penalty, frequency = p->frequency_penalty;
    for (int i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        float v = x[t];
        if (repetition)
            v = v > 0 ? v / r : v * r;
        int32_t c = s->counts[t];
        if (c > 0)
            v = v - frequency * (float)c - presence;
        x[t] = v;
    }
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

/* ---- picking ----------------------------------------------------------- */

int32_t sampler_pick(struct sampler *s, const float *logits)
{
    const struct sampler_params *p = &s->params;
    int n = s->n_vocab;
    const float *x = processed_logits(s, logits);
    s->last = x;
    int32_t best = logits_argmax(x, n);
    if (p->temperature == 0.0f || p->top_k == 1)
        return best;

    float max = x[best];
    if (!(max > -INFINITY)) /* nothing above -inf: the argmax fallback, token 0 */
        return best;
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

    double total = 0;
    for (int k = 0; k < keep; k++)
        total += s->probs[s->order[k]];
    double r = uniform01(&s->rng_state) * total;
    for (int k = 0; k < keep; k++) {
        r -= s->probs[s->order[k]];
        if (r < 0)
            return s->order[k];
    }
    return s->order[keep - 1];
}

/* ---- logprobs ---------------------------------------------------------- */

/* log softmax of one logit v, given the row's largest logit and log Z. */
static float logprob_of(float v, float max, double log_z)
{
    if (max == INFINITY)
        return v == INFINITY ? (float)-log_z : -INFINITY;
    return v == v ? (float)((double)v - log_z) : -INFINITY;
}

int sampler_logprobs(const struct sampler *s, int32_t token, int top_n, float *token_logprob,
                     struct token_logprob *top)
{
    const float *x = s->last;
    int n = s->n_vocab;
    if (!x || token < 0 || token >= n)
        return -INFERD_EINVAL;
    if (top_n < 0)
        top_n = 0;
    if (top_n > SAMPLER_MAX_TOP_LOGPROBS)
        top_n = SAMPLER_MAX_TOP_LOGPROBS;

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
        double sum = 0;
        for (int i = 0; i < n; i++)
            if (x[i] == x[i])
                sum += expf(x[i] - max);
        log_z = max + log(sum);
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
        top[j] = (struct token_logprob){.token = i, .logprob = v}; /* raw logit for now */
        worst = top[m - 1].logprob;
    }
    for (int k = 0; k < m; k++)
        top[k].logprob = logprob_of(top[k].logprob, max, log_z);
    return m;
}
