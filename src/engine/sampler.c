/* engine/sampler.c — token selection from logits with a seeded, reproducible random stream. */
#define _GNU_SOURCE
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) from the top 53 bits. */
static double uniform01(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

int sampler_init(struct sampler *s, const struct sampler_params *p, int n_vocab, struct err *err)
{
    if (p->temperature < 0 || !isfinite(p->temperature))
        return err_set(err, INFERD_ERANGE, "temperature %g must be >= 0", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return err_set(err, INFERD_ERANGE, "top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return err_set(err, INFERD_ERANGE, "min_p %g must be in [0, 1]", p->min_p);
    if (p->top_k < 0)
        return err_set(err, INFERD_ERANGE, "top_k %d must be >= 0", p->top_k);
    s->params = *p;
    s->rng_state = p->seed;
    s->n_vocab = n_vocab;
    s->probs = malloc((size_t)n_vocab * sizeof *s->probs);
    s->order = malloc((size_t)n_vocab * sizeof *s->order);
    if (!s->probs || !s->order) {
        sampler_free(s);
        return err_set(err, INFERD_ENOMEM, "out of memory for the sampler");
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->probs);
    free(s->order);
    s->probs = NULL;
    s->order = NULL;
}

int32_t logits_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

static int by_prob_desc(const void *a, const void *b, void *probs_)
{
    const float *probs = probs_;
    float pa = probs[*(const int32_t *)a], pb = probs[*(const int32_t *)b];
    if (pa != pb)
        return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t sampler_pick(struct sampler *s, const float *logits)
{
    const struct sampler_params *p = &s->params;
    int n = s->n_vocab;
    if (p->temperature == 0.0f || p->top_k == 1)
        return logits_argmax(logits, n);

    float max = logits[logits_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->probs[i] = expf((logits[i] - max) / p->temperature);
        sum += s->probs[i];
    }
    for (int i = 0; i < n; i++) {
        s->probs[i] = (float)(s->probs[i] / sum);
        s->order[i] = i;
    }
    bool truncates = (p->top_k > 0 && p->top_k < n) || p->min_p > 0 || p->top_p < 1;
    if (truncates) /* candidates in descending probability */
        qsort_r(s->order, (size_t)n, sizeof *s->order, by_prob_desc, s->probs);

    int keep = n;
    if (p->top_k > 0 && p->top_k < keep)
        keep = p->top_k;
    if (p->min_p > 0) {
        float floor = p->min_p * s->probs[s->order[0]];
        int k = 1;
        while (k < keep && s->probs[s->order[k]] >= floor)
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
        keep = k;
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
