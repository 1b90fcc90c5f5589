/* cli/bench_adapters.c — decode tok/s of a batch spread over N distinct LoRA adapters against the base model, runs alternating so a noisy machine's drift falls on all of them alike. */
#define _GNU_SOURCE
#include "cli/bench_adapters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/sampler.h"
#include "kv/kv.h"
#include "model/lora.h"
#include "tools/mklora.h"

#define BLOCK 16
#define MAX_REPS 100

bool bench_adapter_counts_parse(const char *v, struct bench_adapter_options *o)
{
    o->n_counts = 0;
    for (const char *s = v; *s;) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n < 0 || n > 256 || o->n_counts == BENCH_ADAPTER_MAX_COUNTS ||
            (*end && *end != ',')) {
            fprintf(stderr, "inferd bench: --adapters takes up to %d counts in [0, 256] "
                            "separated by commas, not '%s'\n", BENCH_ADAPTER_MAX_COUNTS, v);
            return false;
        }
        o->counts[o->n_counts++] = (int)n;
        s = *end ? end + 1 : end;
    }
    return o->n_counts > 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct bench_rig {
    const struct model *m;
    const struct bench_adapter_options *o;
    struct kv_pool *pool;
    struct forward_state *st;
    struct lora_adapter **adapters; /* max count */
    int32_t *tokens;                /* batch x (prompt + gen) */
    uint32_t *blocks;               /* batch x blocks per sequence */
    int blocks_per_seq;
    float *logits;                  /* batch x vocab */
    struct sample_spec *greedy;     /* batch: the device's greedy pick, where it samples */
    struct sample_result *picked;   /* batch */
};

/* One decode step of the whole batch, its tokens picked as the engine picks
 * them: greedily on the device where the backend samples (only the tokens
 * cross to the host), else by argmax over the logits copied back. */
static int decode_step(struct bench_rig *r, const struct batch *b, int32_t *next, struct err *err)
{
    int vocab = r->m->config.vocab_size;
    if (model_samples_on_backend(r->m)) {
        struct forward_output out = {.host_rows = r->logits, .specs = r->greedy,
                                     .results = r->picked};
        int rc = model_forward_sampled(r->m, r->st, &r->pool->cache, b, &out, err);
        for (int s = 0; s < b->n_seqs && rc == 0; s++)
            next[s] = r->picked[s].need_host ? logits_argmax(r->logits + (size_t)s * vocab, vocab)
                                             : r->picked[s].token;
        return rc;
    }
    int rc = model_forward(r->m, r->st, &r->pool->cache, b, r->logits, err);
    for (int s = 0; s < b->n_seqs && rc == 0; s++)
        next[s] = logits_argmax(r->logits + (size_t)s * vocab, vocab);
    return rc;
}

/* One run: every sequence's prompt (a forward each), then gen_len decode steps of the whole
 * batch; returns decode tokens per second, or a negative error code. */
static double run_once(struct bench_rig *r, int count, struct err *err)
{
    const struct bench_adapter_options *o = r->o;
    int ctx = o->prompt_len + o->gen_len, vocab = r->m->config.vocab_size;
    struct batch_seq *seqs = calloc((size_t)o->batch, sizeof *seqs);
    struct lora_adapter **picks = calloc((size_t)o->batch, sizeof *picks);
    if (!seqs || !picks) {
        free(seqs);
        free(picks);
        return err_set(err, INFERD_ENOMEM, "out of memory");
    }
    int rc = 0;
    for (int s = 0; s < o->batch && rc == 0; s++) {
        picks[s] = count ? r->adapters[s % count] : NULL;
        int32_t *t = r->tokens + (size_t)s * ctx;
        for (int i = 0; i < o->prompt_len; i++)
            t[i] = (int32_t)((s * 131 + i * 17 + 3) % vocab);
        seqs[s] = (struct batch_seq){.tokens = t, .n_tokens = o->prompt_len,
                                     .block_ids = r->blocks + (size_t)s * r->blocks_per_seq,
                                     .n_block_ids = r->blocks_per_seq,
                                     .adapters = (const struct lora_adapter *const *)&picks[s],
                                     .n_adapters = count ? 1 : 0};
        struct batch b = {&seqs[s], 1};
        rc = model_forward(r->m, r->st, &r->pool->cache, &b, r->logits, err);
        if (rc == 0)
            t[o->prompt_len] = logits_argmax(r->logits, vocab);
    }
    int32_t *next = calloc((size_t)o->batch, sizeof *next);
    if (!next && rc == 0)
        rc = err_set(err, INFERD_ENOMEM, "out of memory");
    double t0 = now_s();
    for (int step = 0; step < o->gen_len - 1 && rc == 0; step++) {
        int pos = o->prompt_len + step;
        for (int s = 0; s < o->batch; s++) {
            seqs[s].tokens = r->tokens + (size_t)s * ctx + pos;
            seqs[s].n_tokens = 1;
            seqs[s].pos0 = pos;
        }
        struct batch b = {seqs, o->batch};
        rc = decode_step(r, &b, next, err);
        for (int s = 0; s < o->batch && rc == 0; s++)
            r->tokens[(size_t)s * ctx + pos + 1] = next[s];
    }
    double secs = now_s() - t0;
    free(next);
    free(seqs);
    free(picks);
    return rc < 0 ? rc : (double)o->batch * (o->gen_len - 1) / secs;
}

int bench_adapters_run(const struct model *m, const char *model_dir,
                       const struct bench_adapter_options *o, struct err *err)
{
    int max_count = 0;
    for (int i = 0; i < o->n_counts; i++)
        max_count = o->counts[i] > max_count ? o->counts[i] : max_count;
    if (o->gen_len < 2 || o->reps > MAX_REPS)
        return err_set(err, INFERD_EINVAL, "--gen-len must be at least 2 and --reps at most %d",
                       MAX_REPS);
    struct bench_rig r = {.m = m, .o = o};
    int ctx = o->prompt_len + o->gen_len;
    r.blocks_per_seq = (ctx + BLOCK - 1) / BLOCK;
    char tmp[] = "/tmp/inferd-bench-lora-XXXXXX";
    bool made = mkdtemp(tmp) != NULL;
    r.adapters = calloc((size_t)max_count + 1, sizeof *r.adapters);
    r.tokens = calloc((size_t)o->batch * ctx, sizeof *r.tokens);
    r.blocks = calloc((size_t)o->batch * r.blocks_per_seq, sizeof *r.blocks);
    r.logits = malloc((size_t)o->batch * m->config.vocab_size * sizeof *r.logits);
    r.greedy = calloc((size_t)o->batch, sizeof *r.greedy);
    r.picked = calloc((size_t)o->batch, sizeof *r.picked);
    for (int s = 0; r.greedy && s < o->batch; s++)
        r.greedy[s] = (struct sample_spec){.top_p = 1.0f, .repetition_penalty = 1.0f,
                                           .n_top = -1};
    int rc = made && r.adapters && r.tokens && r.blocks && r.logits && r.greedy && r.picked
                 ? 0 : err_set(err, INFERD_ENOMEM, "out of memory (or no temporary directory)");
    for (int i = 0; rc == 0 && i < o->batch * r.blocks_per_seq; i++)
        r.blocks[i] = (uint32_t)i;
    if (rc == 0)
        rc = kv_pool_create(m, m->backend, o->batch * r.blocks_per_seq, BLOCK, &r.pool, err);
    if (rc == 0)
        rc = forward_state_create(m, o->prompt_len > o->batch ? o->prompt_len : o->batch, &r.st, err);
    for (int i = 0; rc == 0 && i < max_count; i++) {
        char dir[sizeof tmp + 32];
        snprintf(dir, sizeof dir, "%s/a%d", tmp, i);
        struct mklora_opts lo = {.model_dir = model_dir, .out_dir = dir, .rank = o->rank,
                                 .alpha = 2.0 * o->rank, .seed = (uint64_t)i + 1};
        rc = mklora_write(&lo, err);
        if (rc == 0)
            rc = lora_load(m, dir, &r.adapters[i], err);
    }
    double loads[2];
    if (rc == 0) {
        getloadavg(loads, 1);
        printf("adapters: %d sequences, prompt %d, %d decode steps, rank %d on every projection, "
               "%d reps alternating; load average %.2f before\n",
               o->batch, o->prompt_len, o->gen_len - 1, o->rank, o->reps, loads[0]);
    }
    double tps[BENCH_ADAPTER_MAX_COUNTS][MAX_REPS];
    if (rc == 0) /* warm-up: every count once, not counted */
        for (int c = 0; c < o->n_counts && rc == 0; c++) {
            double t = run_once(&r, o->counts[c], err);
            rc = t < 0 ? (int)t : 0;
        }
    for (int rep = 0; rc == 0 && rep < o->reps; rep++)
        for (int c = 0; c < o->n_counts && rc == 0; c++) {
            double t = run_once(&r, o->counts[c], err);
            rc = t < 0 ? (int)t : 0;
            tps[c][rep] = t;
        }
    if (rc == 0) {
        getloadavg(loads + 1, 1);
        double base = 0;
        for (int c = 0; c < o->n_counts; c++) {
            qsort(tps[c], (size_t)o->reps, sizeof(double), cmp_double);
            double med = o->reps % 2 ? tps[c][o->reps / 2]
                                     : 0.5 * (tps[c][o->reps / 2 - 1] + tps[c][o->reps / 2]);
            if (o->counts[c] == 0)
                base = med;
            printf("  %3d distinct adapter%s: decode %8.1f tok/s (median; min %.1f, max %.1f)",
                   o->counts[c], o->counts[c] == 1 ? " " : "s", med, tps[c][0],
                   tps[c][o->reps - 1]);
            if (base > 0 && o->counts[c] > 0)
                printf("  %5.1f%% of no adapter", 100.0 * med / base);
            printf("\n");
        }
        printf("load average %.2f after\n", loads[1]);
    }
    for (int i = 0; i < max_count && r.adapters; i++)
        lora_release(r.adapters[i]);
    forward_state_free(r.st);
    kv_pool_free(r.pool);
    free(r.adapters);
    free(r.tokens);
    free(r.blocks);
    free(r.logits);
    free(r.greedy);
    free(r.picked);
    if (made) {
        char cmd[sizeof tmp + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "inferd bench: could not remove %s\n", tmp);
    }
    return rc;
}
