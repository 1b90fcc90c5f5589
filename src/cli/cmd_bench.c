/* cli/cmd_bench.c — `inferd bench`: load time, prefill and decode speed against the machine's own limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul.h"
#include "base/cpu.h"
#include "base/threadpool.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/sampler.h"

struct bench_options {
    const char *dir;
    long prompt_len, gen_len, n_threads, reps;
    enum compute_mode mode;
};

static bool parse_bench_options(int argc, char **argv, struct bench_options *o)
{
    *o = (struct bench_options){.prompt_len = 128, .gen_len = 32, .reps = 3, .mode = COMPUTE_FAST};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (a[0] != '-') {
            o->dir = a;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return false;
        bool ok = !strcmp(a, "--prompt-len") ? arg_int(a, v, 1, 1 << 20, &o->prompt_len)
                : !strcmp(a, "--gen-len")    ? arg_int(a, v, 1, 1 << 20, &o->gen_len)
                : !strcmp(a, "--threads")    ? arg_int(a, v, 0, 1024, &o->n_threads)
                : !strcmp(a, "--reps")       ? arg_int(a, v, 1, 1000, &o->reps)
                : !strcmp(a, "--mode")       ? arg_mode(v, &o->mode)
                                             : (fprintf(stderr, "inferd bench: unknown option '%s'\n", a), false);
        if (!ok)
            return false;
    }
    if (!o->dir) {
        fprintf(stderr, "usage: inferd bench DIR [--prompt-len P] [--gen-len G] [--threads N] "
                        "[--mode fast|exact] [--reps R]\n");
        return false;
    }
    return true;
}

/* Matmul FLOPs of a prefill of n tokens: every layer's projections for every
 * token, attention over the causal triangle, and the LM head for the last token. */
static double prefill_flops(const struct model_config *c, long n)
{
    double q_dim = (double)c->n_heads * c->head_dim, kv_dim = (double)c->n_kv_heads * c->head_dim;
    double per_token = c->hidden_size * (2 * q_dim + 2 * kv_dim) + 3.0 * c->hidden_size * c->intermediate_size;
    double attention = 2.0 * q_dim * (double)n * (n + 1); /* QK^T and PV, half the square */
    return c->n_layers * (2.0 * per_token * n + attention) + 2.0 * c->hidden_size * c->vocab_size;
}

static uint64_t dir_safetensors_bytes(const struct model *m)
{
    uint64_t total = 0;
    for (int i = 0; i < m->files.n_files; i++)
        total += m->files.map_lens[i];
    return total;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_options o;
    if (!parse_bench_options(argc, argv, &o))
        return 2;
    struct err err = {0};
    struct backend *be = NULL;
    struct model *m = NULL;
    struct generator *g = NULL;
    int32_t *prompt = NULL;
    int status = 1;

    if (backend_cpu_create((int)o.n_threads, o.mode, &be, &err) < 0)
        goto fail;
    double t0 = now_s();
    if (model_load(o.dir, be, &m, &err) < 0)
        goto fail;
    double load_s = now_s() - t0;
    double file_gb = dir_safetensors_bytes(m) / 1e9;

    struct threadpool *pool = backend_cpu_threadpool(be);
    double bandwidth = cpu_measure_read_bandwidth(pool, (size_t)1 << 30);
    double gemm_peak = cpu_measure_gemm_gflops(backend_cpu_matmul(be), o.mode);

    if (generator_create(m, (int)(o.prompt_len + o.gen_len + 1), 512, &g, &err) < 0)
        goto fail;
    prompt = malloc((size_t)o.prompt_len * sizeof *prompt);
    if (!prompt) {
        err_set(&err, INFERD_ENOMEM, "out of memory");
        goto fail;
    }
    uint64_t state = 42;
    for (long i = 0; i < o.prompt_len; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((state >> 33) % (uint64_t)m->config.vocab_size);
    }

    double best_prefill = 1e30, best_decode = 1e30;
    for (long r = 0; r < o.reps; r++) {
        generator_reset(g);
        double t = now_s();
        if (generator_feed(g, prompt, (int)o.prompt_len, &err) < 0)
            goto fail;
        double prefill_s = now_s() - t;
        t = now_s();
        for (long i = 0; i < o.gen_len; i++) {
            int32_t tok = logits_argmax(g->logits, m->config.vocab_size);
            if (generator_feed(g, &tok, 1, &err) < 0)
                goto fail;
        }
        double decode_s = now_s() - t;
        if (prefill_s < best_prefill)
            best_prefill = prefill_s;
        if (decode_s < best_decode)
            best_decode = decode_s;
    }

    double prefill_tps = o.prompt_len / best_prefill;
    double prefill_gflops = prefill_flops(&m->config, o.prompt_len) / best_prefill / 1e9;
    double decode_tps = o.gen_len / best_decode;
    double bytes_per_token = (double)model_weight_bytes_per_token(m);
    double floor_tps = bandwidth * 1e9 / bytes_per_token;

    printf("model            %s (%s, %d layers, hidden %d, vocab %d)\n", o.dir,
           m->config.arch_name, m->config.n_layers, m->config.hidden_size, m->config.vocab_size);
    printf("cpu              %s, %d threads, mode %s\n", cpu_level_name(), threadpool_size(pool),
           o.mode == COMPUTE_FAST ? "fast" : "exact");
    printf("load             %.3f s for %.2f GB (%.2f s/GB)\n", load_s, file_gb,
           file_gb > 0 ? load_s / file_gb : 0.0);
    printf("read bandwidth   %.1f GB/s (measured)\n", bandwidth);
    printf("gemm peak        %.1f GFLOP/s (measured)\n", gemm_peak);
    printf("prefill          %ld tokens: %.1f tok/s, %.1f GFLOP/s = %.0f%% of gemm peak\n",
           o.prompt_len, prefill_tps, prefill_gflops, 100.0 * prefill_gflops / gemm_peak);
    printf("decode           %ld tokens: %.2f tok/s; floor %.2f tok/s (%.1f MB/token); %.0f%% of floor\n",
           o.gen_len, decode_tps, floor_tps, bytes_per_token / 1e6, 100.0 * decode_tps / floor_tps);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "inferd bench: %s\n", err.msg);
done:
    free(prompt);
    generator_free(g);
    model_free(m);
    backend_destroy(be);
    return status;
}
