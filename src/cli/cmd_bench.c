/* cli/cmd_bench.c — `inferd bench`: load time, prefill and decode speed against the machine's own limits. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda.h"
#include "base/cpu.h"
#include "base/threadpool.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench_adapters.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/spec_flags.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kv/kv.h"

#define BENCH_MAX_REPS 100

struct rep_result {
    double bandwidth;      /* GB/s measured just before this repetition */
    double prefill_tps, decode_tps;
    double floor_tps;      /* bandwidth / weight bytes per token */
    double decode_of_floor;
};

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of one field of the repetitions. */
static double median_of(const struct rep_result *reps, long n, size_t field)
{
    double v[BENCH_MAX_REPS];
    for (long i = 0; i < n; i++)
        v[i] = *(const double *)((const char *)&reps[i] + field);
    qsort(v, (size_t)n, sizeof v[0], compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct bench_options {
    const char *dir;
    const char *device; /* --device: cpu, cuda[:N] or auto */
    long prompt_len, gen_len, n_threads, reps, chunk;
    long warmup; /* untimed runs of the prefill and decode before the timed ones */
    enum compute_mode mode;
    struct backend_options backend; /* the environment's, then the backend flags' */
    struct cli_spec_options spec;   /* speculative decoding of the decode runs */
    long verify_k;                  /* --verify-cost K: time a K-draft verify step; 0: no */
    long adapter_rank, adapter_batch; /* --rank, --batch of --adapters */
    struct cli_kv_quant kvq;        /* --kv-quant, --kv-quant-config */
    enum dtype quantize;            /* --quantize; DTYPE_F32: as stored */
    struct bench_adapter_options adapters; /* --adapters LIST: n_counts 0 when not asked */
    struct cli_tp_flags tp;         /* --tensor-parallel, --nccl-lib */
};

/* GPU memory bandwidth the floors are stated against (H200 HBM3e). */
#define GPU_NOMINAL_GBS 4600.0

static const char usage[] =
    "usage: inferd bench DIR [--prompt-len P] [--gen-len G] [--threads N] [--mode fast|exact]\n"
    "       [--reps R] [--warmup W] [--chunk C] [--device cpu|cuda[:N]|auto] [--verify-cost K]\n"
    "       [--draft-model DIR] [--draft-kind two-model|ngram] [--num-draft-tokens K]\n"
    "       [--tensor-parallel N [--nccl-lib PATH]]\n"
    "Loads DIR and measures prefill of a P-token prompt (default 128, in chunks of\n"
    "C = 512) and greedy decode of G tokens (default 32), R times (default 3),\n"
    "against the memory-bandwidth floor measured before each decode; prints the\n"
    "medians. W untimed runs of both come first (default 1): kernels load and decode graphs\n"
    "are captured once per process, not at every token of a server's life.\n"
    "With a drafter (below) the decode speculates and its acceptance is printed.\n"
    "--verify-cost K times one target step over 1 + K tokens with every row's logits (a\n"
    "speculative verify step) against a one-token decode step at the same position; where\n"
    "the backend samples, again with each row's greedy pick made on the device instead.\n"    "--adapters 0,1,4,16 [--rank 16] [--batch 16] instead measures decode tok/s of --batch\n"
    "sequences spread over that many distinct random LoRA adapters (0: none), runs alternating.\n"
    CLI_SPEC_USAGE;

static bool parse_bench_options(int argc, char **argv, struct bench_options *o)
{
    *o = (struct bench_options){.prompt_len = 128, .gen_len = 32, .reps = 3, .warmup = 1, .chunk = 512,
                                .mode = COMPUTE_FAST, .adapter_rank = 16, .adapter_batch = 16};
    cli_backend_options_from_env(&o->backend);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (arg_is_help(a)) {
            fputs(usage, stdout);
            exit(0);
        }
        if (a[0] != '-') {
            o->dir = a;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return false;
        const struct cli_model_flags flags = {&o->backend, &o->kvq, &o->quantize, &o->tp,
                                              &o->spec};
        int model_flag = cli_model_flag(a, v, &flags);
        if (model_flag < 0)
            return false;
        if (model_flag > 0)
            continue;
        bool ok = !strcmp(a, "--prompt-len") ? arg_int(a, v, 1, 1 << 20, &o->prompt_len)
                : !strcmp(a, "--gen-len")    ? arg_int(a, v, 1, 1 << 20, &o->gen_len)
                : !strcmp(a, "--threads")    ? arg_int(a, v, 0, 1024, &o->n_threads)
                : !strcmp(a, "--reps")       ? arg_int(a, v, 1, BENCH_MAX_REPS, &o->reps)
                : !strcmp(a, "--warmup")     ? arg_int(a, v, 0, BENCH_MAX_REPS, &o->warmup)
                : !strcmp(a, "--mode")       ? arg_mode(v, &o->mode)
                : !strcmp(a, "--chunk")      ? arg_int(a, v, 1, 1 << 16, &o->chunk)
                : !strcmp(a, "--verify-cost") ? arg_int(a, v, 1, SPEC_MAX_DRAFTS, &o->verify_k)
                : !strcmp(a, "--adapters")   ? bench_adapter_counts_parse(v, &o->adapters)
                : !strcmp(a, "--rank")       ? arg_int(a, v, 1, LORA_MAX_RANK, &o->adapter_rank)
                : !strcmp(a, "--batch")      ? arg_int(a, v, 1, 256, &o->adapter_batch)
                : !strcmp(a, "--device")     ? (o->device = v, cli_device_parse(v, &(struct device_spec){0}))
                                             : (fprintf(stderr, "inferd bench: unknown option '%s'\n", a), false);
        if (!ok)
            return false;
    }
    if (!o->dir) {
        fprintf(stderr, "usage: inferd bench DIR [--prompt-len P] [--gen-len G] [--threads N] "
                        "[--mode fast|exact] [--reps R] [--warmup W] [--chunk C] [--device cpu|cuda[:N]|auto]\n"
                        "       [backend flags]\n" CLI_BACKEND_USAGE CLI_KV_QUANT_USAGE CLI_QUANTIZE_USAGE CLI_TP_USAGE);
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

/* One forward over n tokens at pos0 of seq (all rows' logits when all), timed; then the
 * positions are dropped again unless keep. With specs (greedy, one a row) the backend picks
 * the rows' tokens into results, as the engine's steps do where it samples; else the logits
 * come to the host. */
static int timed_step(const struct model *m, struct forward_state *fwd, struct kv_manager *kv,
                      struct kv_seq *seq, const int32_t *tokens, int n, bool all, bool keep,
                      float *logits, const struct sample_spec *specs,
                      struct sample_result *results, double *seconds, struct err *err)
{
    int pos0 = seq->n_tokens;
    int rc = kv_manager_allocate_slots(kv, seq, n, err);
    if (rc < 0)
        return rc;
    struct batch_seq bs = {.tokens = tokens + pos0, .n_tokens = n, .pos0 = pos0,
                           .block_ids = seq->table.blocks, .n_block_ids = seq->table.n_blocks,
                           .all_logits = all};
    struct batch b = {&bs, 1};
    struct forward_output out = {.host_rows = logits, .specs = specs, .results = results};
    double t = now_s();
    rc = model_forward_sampled(m, fwd, kv_manager_cache(kv), &b, &out, err);
    *seconds = now_s() - t;
    if (!keep)
        kv_manager_truncate(kv, seq, pos0);
    return rc;
}

/* The verify step's cost: one target step over the pending token and k drafts (every row's
 * logits; with picks, every row's greedy pick made by the backend instead, as the engine
 * verifies greedy requests where the backend samples) against a one-token decode step (its
 * pick likewise), both after a prompt of n_prompt tokens; medians of reps pairs after one of
 * each to warm up. */
static int verify_cost(const struct model *m, const int32_t *prompt, int n_prompt, int chunk,
                       int k, int reps, bool picks, double *plain_s, double *verify_s,
                       struct err *err)
{
    struct sample_spec specs[SPEC_MAX_DRAFTS + 1];
    struct sample_result *results = calloc((size_t)k + 1, sizeof *results);
    for (int i = 0; i <= k; i++)
        specs[i] = (struct sample_spec){.top_p = 1.0f, .repetition_penalty = 1.0f, .n_top = -1};
    const struct sample_spec *use = picks ? specs : NULL;
    int n_ctx = n_prompt + k + 1;
    struct kv_manager *kv = NULL;
    struct forward_state *fwd = NULL;
    float *logits = malloc((size_t)(k + 1) * (size_t)m->config.vocab_size * sizeof *logits);
    int32_t *tokens = malloc((size_t)n_ctx * sizeof *tokens); /* the prompt, then drafts */
    struct kv_seq seq;
    kv_seq_init(&seq);
    int rc = logits && tokens && results ? 0 : err_set(err, INFERD_ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < n_ctx; i++)
        tokens[i] = prompt[i % n_prompt];
    prompt = tokens;
    if (rc == 0)
        rc = kv_manager_create(m, m->backend, kv_blocks_for(n_ctx, KV_BLOCK_SIZE_DEFAULT),
                               KV_BLOCK_SIZE_DEFAULT, &kv, err);
    if (rc == 0)
        rc = forward_state_create(m, chunk > k + 1 ? chunk : k + 1, &fwd, err);
    for (int done = 0; rc == 0 && done < n_prompt - 1;) {
        int n = n_prompt - 1 - done < chunk ? n_prompt - 1 - done : chunk;
        double s;
        rc = timed_step(m, fwd, kv, &seq, prompt, n, false, true, logits, NULL, NULL, &s, err);
        done += n;
    }
    double plain[BENCH_MAX_REPS + 1], verify[BENCH_MAX_REPS + 1];
    for (int r = 0; rc == 0 && r <= reps; r++) {
        rc = timed_step(m, fwd, kv, &seq, prompt, 1, false, false, logits, use, results,
                        &plain[r], err);
        if (rc == 0)
            rc = timed_step(m, fwd, kv, &seq, prompt, k + 1, true, false, logits, use, results,
                            &verify[r], err);
    }
    if (rc == 0) { /* the first pair warmed up */
        qsort(plain + 1, (size_t)reps, sizeof *plain, compare_doubles);
        qsort(verify + 1, (size_t)reps, sizeof *verify, compare_doubles);
        *plain_s = plain[1 + reps / 2];
        *verify_s = verify[1 + reps / 2];
    }
    if (kv)
        kv_manager_free(kv, &seq);
    free(seq.table.blocks);
    kv_manager_destroy(kv);
    forward_state_free(fwd);
    free(logits);
    free(tokens);
    free(results);
    return rc;
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
    struct cli_tp *tp = NULL; /* the other ranks under --tensor-parallel */
    struct model *m = NULL;
    struct generator *g = NULL;
    struct sampler greedy = {0};
    int32_t *prompt = NULL;
    struct model *draft = NULL;
    struct spec_config spec = {0};
    int status = 1;

    o.backend.mode = o.mode;
    o.backend.threads = (int)o.n_threads;
    if (cli_kv_quant_resolve(&o.kvq, o.dir, &o.backend, &err) < 0)
        goto fail;
    double t0 = now_s();
    if (cli_model_open(o.device, &o.backend, &o.tp, o.dir,
                       &(struct model_load_options){.quantize = o.quantize}, &be, &m, &tp,
                       &err) < 0)
        goto fail;
    double load_s = now_s() - t0;
    if (o.adapters.n_counts > 0) {
        o.adapters.rank = (int)o.adapter_rank;
        o.adapters.batch = (int)o.adapter_batch;
        o.adapters.prompt_len = (int)o.prompt_len;
        o.adapters.gen_len = (int)o.gen_len;
        o.adapters.reps = (int)o.reps;
        if (bench_adapters_run(m, o.dir, &o.adapters, &err) < 0)
            goto fail;
        status = 0;
        goto done;
    }
    double file_gb = dir_safetensors_bytes(m) / 1e9;

    struct threadpool *pool = backend_cpu_threadpool(be); /* NULL on a GPU */
    double fma_peak = pool ? cpu_measure_fma_peak_gflops(
                                 pool, cpu_matmul_get_level(backend_cpu_matmul(be)))
                           : 0.0;
    double gemm_peak = pool ? cpu_measure_gemm_gflops(backend_cpu_matmul(be), o.mode) : 0.0;
    double gpu_bandwidth = pool ? 0.0 : backend_cuda_read_bandwidth(be, (size_t)2 << 30);

    /* Greedy decoding, picked on the GPU where the backend samples: only token ids come back. */
    if (cli_spec_load(&o.spec, m, NULL, &draft, &spec, &err) < 0 ||
        generator_create_spec(m, (int)(o.prompt_len + o.gen_len + SPEC_MAX_DRAFTS + 2),
                              (int)o.chunk, spec.kind != SPEC_NONE ? &spec : NULL, &g, &err) < 0 ||
        sampler_init(&greedy, &(struct sampler_params){.temperature = 0, .top_p = 1},
                     m->config.vocab_size, &err) < 0)
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

    /* Memory bandwidth on a shared machine moves from second to second, so
     * every repetition measures it right before its decode and the decode's
     * fraction of the floor is taken per repetition, then the median. */
    double bytes_per_token = (double)model_weight_bytes_per_token(m);
    struct rep_result reps[BENCH_MAX_REPS];
    /* the warm-up runs first and is dropped: what happens once per process
     * (kernels loaded, graphs captured for each context bucket) is not a
     * rate the server keeps */
    for (long r = -o.warmup; r < o.reps; r++) {
        struct rep_result scratch, *rr = r < 0 ? &scratch : &reps[r];
        rr->bandwidth = pool ? cpu_measure_read_bandwidth(pool, (size_t)512 << 20) : gpu_bandwidth;
        generator_reset(g);
        double t = now_s();
        int32_t tok;
        if (generator_feed_pick(g, prompt, (int)o.prompt_len, &greedy, &tok, &err) < 0)
            goto fail;
        rr->prefill_tps = o.prompt_len / (now_s() - t);
        t = now_s();
        /* a speculating step gives every kept draft and one more token */
        int32_t picks[1 + SPEC_MAX_DRAFTS];
        int n_picks = 1;
        picks[0] = tok;
        long made = 0;
        while (made < o.gen_len) {
            if (generator_feed_picks(g, &picks[n_picks - 1], 1, &greedy, picks, &n_picks,
                                     &err) < 0)
                goto fail;
            made += n_picks;
        }
        rr->decode_tps = made / (now_s() - t);
        rr->floor_tps = rr->bandwidth * 1e9 / bytes_per_token;
        rr->decode_of_floor = rr->decode_tps / rr->floor_tps;
    }

    double prefill_tps = median_of(reps, o.reps, offsetof(struct rep_result, prefill_tps));
    double prefill_gflops = prefill_flops(&m->config, o.prompt_len) * prefill_tps / o.prompt_len / 1e9;
    double decode_tps = median_of(reps, o.reps, offsetof(struct rep_result, decode_tps));
    double bandwidth = median_of(reps, o.reps, offsetof(struct rep_result, bandwidth));
    double decode_of_floor = median_of(reps, o.reps, offsetof(struct rep_result, decode_of_floor));

    printf("model            %s (%s, %d layers, hidden %d, vocab %d)\n", o.dir,
           m->config.arch_name, m->config.n_layers, m->config.hidden_size, m->config.vocab_size);
    if (pool) {
        printf("cpu              %s, %d threads, mode %s, %ld repetitions (medians below)\n",
               cpu_matmul_level_name(cpu_matmul_get_level(backend_cpu_matmul(be))),
               threadpool_size(pool), o.mode == COMPUTE_FAST ? "fast" : "exact",
               o.reps);
    } else {
        char gpu[256];
        cli_backend_describe(be, gpu, sizeof gpu);
        printf("device           %s, mode %s, %ld repetitions (medians below)\n", gpu,
               o.mode == COMPUTE_FAST ? "fast" : "exact", o.reps);
    }
    printf("load             %.3f s for %.2f GB (%.2f s/GB)\n", load_s, file_gb,
           file_gb > 0 ? load_s / file_gb : 0.0);
    {
        struct kv_format kvf = kv_format_of_backend(be);
        char kv_name[32];
        kv_format_name(&kvf, kv_name, sizeof kv_name);
        printf("kv cache         %s, %zu bytes/token\n", kv_name,
               kv_format_bytes_per_token(&m->config, &kvf));
    }
    printf("read bandwidth   %.1f GB/s (measured before each decode)\n", bandwidth);
    if (pool) {
        printf("fma peak         %.1f GFLOP/s; gemm kernel on a cache-resident shape %.1f GFLOP/s\n",
               fma_peak, gemm_peak);
        printf("prefill          %ld tokens: %.1f tok/s, %.1f GFLOP/s = %.0f%% of the gemm kernel's rate, %.0f%% of fma peak\n",
               o.prompt_len, prefill_tps, prefill_gflops, 100.0 * prefill_gflops / gemm_peak,
               100.0 * prefill_gflops / fma_peak);
    } else {
        printf("prefill          %ld tokens in chunks of %ld: %.1f tok/s, %.1f TFLOP/s\n", o.prompt_len,
               o.chunk, prefill_tps, prefill_gflops / 1e3);
    }
    printf("decode           %ld tokens: %.2f tok/s; floor %.2f tok/s (%.1f MB/token); %.0f%% of floor\n",
           o.gen_len, decode_tps, bandwidth * 1e9 / bytes_per_token, bytes_per_token / 1e6,
           100.0 * decode_of_floor);
    if (spec.kind != SPEC_NONE) {
        uint64_t drafted, accepted, steps;
        generator_spec_stats(g, &drafted, &accepted, &steps);
        printf("speculation      %s, up to %d drafts: %llu drafted, %llu accepted (%.0f%%), "
               "%.2f tokens per verify step\n",
               spec.kind == SPEC_NGRAM ? "ngram" : "two-model", spec.num_draft_tokens,
               (unsigned long long)drafted, (unsigned long long)accepted,
               drafted ? 100.0 * (double)accepted / (double)drafted : 0.0,
               steps ? (double)(accepted + steps) / (double)steps : 0.0);
    }
    for (int picks = 0; o.verify_k > 0 && picks <= model_samples_on_backend(m); picks++) {
        double plain_s = 0, verify_s = 0;
        if (verify_cost(m, prompt, (int)o.prompt_len, (int)o.chunk, (int)o.verify_k,
                        (int)(o.reps < 5 ? 5 : o.reps), picks, &plain_s, &verify_s, &err) < 0)
            goto fail;
        printf("verify cost      1 + %ld tokens, %s: %.3f ms vs one-token decode %.3f ms = "
               "%.2fx\n",
               o.verify_k, picks ? "greedy picks on the device" : "every row's logits",
               verify_s * 1e3, plain_s * 1e3, verify_s / plain_s);
    }
    if (!pool)
        printf("decode nominal   floor at %.0f GB/s: %.2f tok/s; %.0f%% of it\n", GPU_NOMINAL_GBS,
               GPU_NOMINAL_GBS * 1e9 / bytes_per_token,
               100.0 * decode_tps / (GPU_NOMINAL_GBS * 1e9 / bytes_per_token));
    status = 0;
    goto done;
fail:
    fprintf(stderr, "inferd bench: %s\n", err.msg);
done:
    free(prompt);
    sampler_free(&greedy);
    generator_free(g);
    model_free(draft);
    model_free(m);
    cli_tp_free(tp);
    backend_destroy(be);
    return status;
}
