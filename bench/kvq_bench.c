/* bench/kvq_bench.c — the KV cache's share of a CPU step per format (plain f32 and f16, quantized): decode attention after a long context and the store (quantize-on-write) per token, Qwen3-0.6B's attention shape or the house model's.
 *
 * Usage: kvq_bench [CONTEXT [ROUNDS [THREADS [ISA [SEQS [SHAPE [FORMAT]]]]]]]
 *   CONTEXT positions already cached per sequence (default 8192, at least 1: a short one fits
 *   the caches and shows the kernels' arithmetic alone); ROUNDS alternating rounds
 *   over the formats (default 5; medians reported); THREADS 0 (default) = one per core; ISA
 *   avx2|avx512|best caps the kernels; SEQS sequences decoding in one step (default 1);
 *   SHAPE qwen3-0.6b (default) or house; FORMAT one format alone (f32, f16 or a --kv-quant
 *   name; default all, the ratios then against f32). Every format's cache is filled once through kv_store
 *   (random K/V, the store timed), then each round times, format after format, a decode
 *   step's attention of every layer (one new row per sequence and layer: its store, then
 *   attention over CONTEXT + 1 positions) and a 512-token prefill chunk's store. The weights'
 *   share of a step is not here: it is the same for every format (inferd bench measures
 *   whole steps). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/cpu.h"
#include "base/timer.h"
#include "kv/kv.h"
#include "kv/kv_quant_config.h"

#define BLOCK 16
#define CHUNK 512
#define MAX_ROUNDS 64
#define MAX_SEQS 64

/* "f32" and "f16" are plain caches; the others --kv-quant names */
static const char *const formats[] = {"f32", "f16", "8", "4", "turbo", "turbo:k4v3"};
#define N_FORMATS ((int)(sizeof formats / sizeof formats[0]))

static uint32_t rng = 2463534242u;

static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return (float)(int32_t)rng / 2147483648.0f;
}

struct fmt_run {
    struct kv_quant q;
    struct backend *be;
    struct kv_cache kv;
    uint32_t *blocks; /* sequence s's table: blocks + s * per_seq */
    size_t bytes_per_token;
    double fill_s;
    double decode_ms[MAX_ROUNDS], store_us[MAX_ROUNDS];
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    int ctx = argc > 1 ? atoi(argv[1]) : 8192;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    enum cpu_isa isa = CPU_ISA_BEST;
    if (argc > 4 && strcmp(argv[4], "best"))
        isa = !strcmp(argv[4], "avx2") ? CPU_ISA_AVX2 : CPU_ISA_AVX512;
    int seqs = argc > 5 ? atoi(argv[5]) : 1;
    bool house = argc > 6 && !strcmp(argv[6], "house");
    const char *only = argc > 7 ? argv[7] : NULL;
    int sel[N_FORMATS], n_sel = 0; /* the formats run, in the table's order */
    for (int f = 0; f < N_FORMATS; f++)
        if (!only || !strcmp(formats[f], only))
            sel[n_sel++] = f;
    if (ctx < 1 || rounds < 1 || rounds > MAX_ROUNDS || seqs < 1 || seqs > MAX_SEQS ||
        (argc > 6 && !house && strcmp(argv[6], "qwen3-0.6b")) || !n_sel) {
        fprintf(stderr, "usage: kvq_bench [CONTEXT >= 1 [ROUNDS 1..%d [THREADS [ISA [SEQS 1..%d "
                        "[qwen3-0.6b|house [f32|f16|8|4|turbo|turbo:k4v3]]]]]]]\n",
                MAX_ROUNDS, MAX_SEQS);
        return 2;
    }
    /* Qwen3-0.6B: 28 layers, 16 heads over 8 kv heads of 128; the house model: 6 layers,
     * 6 heads over 2 kv heads of 64 */
    const int LAYERS = house ? 6 : 28, HEADS = house ? 6 : 16, KV_HEADS = house ? 2 : 8;
    const int HEAD_DIM = house ? 64 : 128;
    int per_seq = (ctx + CHUNK + BLOCK - 1) / BLOCK + 1, n_blocks = per_seq * seqs;
    size_t kv_dim = (size_t)KV_HEADS * HEAD_DIM, q_dim = (size_t)HEADS * HEAD_DIM;
    float *k = malloc((size_t)CHUNK * kv_dim * 4), *v = malloc((size_t)CHUNK * kv_dim * 4);
    float *q = malloc((size_t)seqs * q_dim * 4), *out = malloc((size_t)seqs * q_dim * 4);
    for (size_t i = 0; i < (size_t)CHUNK * kv_dim; i++) {
        k[i] = rnd() * (i % HEAD_DIM == 3 ? 8.0f : 1.0f);
        v[i] = rnd();
    }
    for (size_t i = 0; i < (size_t)seqs * q_dim; i++)
        q[i] = rnd();
    struct model_config mc = {.n_layers = LAYERS, .n_heads = HEADS, .n_kv_heads = KV_HEADS,
                              .head_dim = HEAD_DIM};
    static struct fmt_run runs[N_FORMATS];
    struct err err = {0};
    for (int i = 0; i < n_sel; i++) {
        int f = sel[i];
        struct fmt_run *r = &runs[f];
        bool on = false, plain16 = !strcmp(formats[f], "f16");
        if (!plain16 && strcmp(formats[f], "f32") &&
            kv_quant_parse(formats[f], &r->q, &on, &err) < 0) {
            fprintf(stderr, "%s: %s\n", formats[f], err.msg);
            return 1;
        }
        if (backend_cpu_create(&(struct backend_options){.threads = threads, .cpu_isa = isa,
                                                         .mode = COMPUTE_FAST,
                                                         .kv_type = plain16 ? BACKEND_KV_F16
                                                                            : BACKEND_KV_F32,
                                                         .kv_quant = on ? &r->q : NULL},
                               &r->be, &err) < 0) {
            fprintf(stderr, "%s: %s\n", formats[f], err.msg);
            return 1;
        }
        struct kv_format fm = kv_format_of_backend(r->be);
        size_t krow = kv_format_row_bytes(&mc, &fm, false), vrow = kv_format_row_bytes(&mc, &fm, true);
        size_t slots = (size_t)LAYERS * n_blocks * BLOCK;
        r->kv = (struct kv_cache){.k = r->be->ops->alloc(r->be, slots * krow),
                                  .v = r->be->ops->alloc(r->be, slots * vrow),
                                  .dtype = r->be->kv_dtype, .n_layers = LAYERS, .n_blocks = n_blocks,
                                  .block_size = BLOCK, .n_kv_heads = KV_HEADS,
                                  .head_dim = HEAD_DIM, .quant = r->be->kv_quant,
                                  .k_row_bytes = on ? krow : 0, .v_row_bytes = on ? vrow : 0};
        if (!r->kv.k || !r->kv.v) {
            fprintf(stderr, "%s: out of memory for the cache\n", formats[f]);
            return 1;
        }
        r->bytes_per_token = kv_format_bytes_per_token(&mc, &fm);
        r->blocks = malloc((size_t)n_blocks * sizeof *r->blocks);
        for (int b = 0; b < n_blocks; b++)
            r->blocks[b] = (uint32_t)(n_blocks - 1 - b); /* not in address order */
        double t0 = now_s();
        for (int s = 0; s < seqs; s++)
            for (int pos = 0; pos < ctx; pos += CHUNK) {
                int n = ctx - pos < CHUNK ? ctx - pos : CHUNK;
                struct attn_span sp = {0, n, pos, r->blocks + (size_t)s * per_seq, per_seq};
                for (int l = 0; l < LAYERS; l++)
                    r->be->ops->kv_store(r->be, &r->kv, l, k, v, &sp, 1);
            }
        r->fill_s = now_s() - t0;
    }
    printf("kv_bench: %s attention shape (%d layers, %d heads over %d kv heads, head_dim %d), "
           "%d sequences at context %d, %d rounds alternating, threads %d, %s\n",
           house ? "the house model's" : "Qwen3-0.6B", LAYERS, HEADS, KV_HEADS, HEAD_DIM, seqs,
           ctx, rounds, threads, cpu_level_name(cpu_features()));
    struct attn_span step[MAX_SEQS];
    for (int round = 0; round < rounds; round++)
        for (int i = 0; i < n_sel; i++) {
            struct fmt_run *r = &runs[sel[i]];
            /* a decode step: each layer stores every sequence's new row, then attends */
            for (int s = 0; s < seqs; s++)
                step[s] = (struct attn_span){s, 1, ctx, r->blocks + (size_t)s * per_seq, per_seq};
            double t0 = now_s();
            for (int l = 0; l < LAYERS; l++) {
                r->be->ops->kv_store(r->be, &r->kv, l, k, v, step, seqs);
                r->be->ops->attention(r->be, q, &r->kv, l, step, seqs, HEADS,
                                      1.0f / sqrtf((float)HEAD_DIM), 0, out);
            }
            r->decode_ms[round] = (now_s() - t0) * 1e3;
            /* a prefill chunk's store (positions past the context, overwritten each round) */
            struct attn_span chunk = {0, CHUNK, ctx, r->blocks, per_seq};
            t0 = now_s();
            for (int l = 0; l < LAYERS; l++)
                r->be->ops->kv_store(r->be, &r->kv, l, k, v, &chunk, 1);
            r->store_us[round] = (now_s() - t0) * 1e6 / CHUNK;
        }
    double base_ms = 0;
    printf("%-12s %14s %18s %10s %22s %14s\n", "format", "bytes/token", "decode attn ms/step",
           "vs first", "store us/token", "fill s");
    for (int i = 0; i < n_sel; i++) {
        int f = sel[i];
        struct fmt_run *r = &runs[f];
        double ms = median(r->decode_ms, rounds), us = median(r->store_us, rounds);
        if (i == 0)
            base_ms = ms;
        printf("%-12s %14zu %18.2f %9.2fx %22.1f %14.1f\n", formats[f], r->bytes_per_token, ms,
               base_ms / ms, us, r->fill_s);
    }
    for (int i = 0; i < n_sel; i++) {
        struct fmt_run *r = &runs[sel[i]];
        r->be->ops->release(r->be, r->kv.k);
        r->be->ops->release(r->be, r->kv.v);
        backend_destroy(r->be);
        free(r->blocks);
    }
    free(k);
    free(v);
    free(q);
    free(out);
    return 0;
}
