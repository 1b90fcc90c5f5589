/* bench/invariance_agreement.c — how often a prompt prefilled in one chunk and the same prompt with its first k tokens computed earlier (a prefix-cache hit) agree on their greedy continuation.
 *
 * Usage: invariance_agreement MODEL_DIR [PROMPTS [GEN [fast|exact [THREADS]]]]
 *   PROMPTS (default 100) random prompts of 32..96 tokens, each with a random
 *   k in [1, L - 1]; GEN (default 32) greedy tokens after each. Prints how
 *   many continuations agree token for token, how many prompts' last logits
 *   agree bit for bit, and where the others first part. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "model/model.h"

#define PROMPT_MIN 32
#define PROMPT_MAX 96

static uint64_t rng = 0x853c49e6748fea9bull;

static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The prompt fed as [0, k) then [k, n) (k == 0: in one piece), then gen
 * greedy tokens into out; the logits after the prompt into last. */
static int continuation(const struct model *m, const int32_t *prompt, int n, int k, int gen,
                        int32_t *out, float *last, struct err *err)
{
    struct generator *g;
    int rc = generator_create(m, n + gen + 1, 512, &g, err);
    if (rc < 0)
        return rc;
    if (k > 0)
        rc = generator_feed(g, prompt, k, err);
    if (rc == 0)
        rc = generator_feed(g, prompt + k, n - k, err);
    if (rc == 0)
        memcpy(last, g->logits, (size_t)m->config.vocab_size * sizeof(float));
    for (int i = 0; rc == 0 && i < gen; i++) {
        out[i] = argmax(g->logits, m->config.vocab_size);
        rc = generator_feed(g, &out[i], 1, err);
    }
    generator_free(g);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [PROMPTS [GEN [fast|exact [THREADS]]]]\n", argv[0]);
        return 2;
    }
    int prompts = argc > 2 ? atoi(argv[2]) : 100;
    int gen = argc > 3 ? atoi(argv[3]) : 32;
    enum compute_mode mode = argc > 4 && !strcmp(argv[4], "exact") ? COMPUTE_EXACT : COMPUTE_FAST;
    int threads = argc > 5 ? atoi(argv[5]) : 0;
    if (prompts < 1 || gen < 1) {
        fprintf(stderr, "PROMPTS and GEN must be positive\n");
        return 2;
    }
    struct err err = {0};
    struct backend *be;
    struct model *m;
    if (backend_cpu_create(&(struct backend_options){.mode = mode, .threads = threads}, &be,
                           &err) < 0 ||
        model_load(argv[1], be, &m, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int vocab = m->config.vocab_size;
    int32_t prompt[PROMPT_MAX], cold[1024], hit[1024];
    float *cold_last = malloc((size_t)vocab * sizeof(float));
    float *hit_last = malloc((size_t)vocab * sizeof(float));
    if (gen > 1024 || !cold_last || !hit_last) {
        fprintf(stderr, "GEN at most 1024\n");
        return 1;
    }
    int agree = 0, same_logits = 0, parted_at[1025] = {0};
    for (int p = 0; p < prompts; p++) {
        int n = PROMPT_MIN + (int)(next_u32() % (PROMPT_MAX - PROMPT_MIN + 1));
        int k = 1 + (int)(next_u32() % (uint32_t)(n - 1));
        for (int i = 0; i < n; i++)
            prompt[i] = (int32_t)(next_u32() % (uint32_t)vocab);
        if (continuation(m, prompt, n, 0, gen, cold, cold_last, &err) < 0 ||
            continuation(m, prompt, n, k, gen, hit, hit_last, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int j = 0;
        while (j < gen && cold[j] == hit[j])
            j++;
        agree += j == gen;
        parted_at[j]++;
        same_logits += !memcmp(cold_last, hit_last, (size_t)vocab * sizeof(float));
    }
    printf("%s mode, %d prompts of %d..%d tokens, first k computed earlier, %d greedy tokens:\n",
           mode == COMPUTE_FAST ? "fast" : "exact", prompts, PROMPT_MIN, PROMPT_MAX, gen);
    printf("  continuations identical: %d / %d\n", agree, prompts);
    printf("  logits after the prompt bit-identical: %d / %d\n", same_logits, prompts);
    printf("  first differing token (step: prompts):");
    for (int j = 0; j < gen; j++)
        if (parted_at[j])
            printf(" %d: %d", j, parted_at[j]);
    printf("\n");
    free(cold_last);
    free(hit_last);
    model_free(m);
    backend_destroy(be);
    return 0;
}
