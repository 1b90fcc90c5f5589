/* cli/cmd_run.c — `inferd run`: load a model directory and generate from a prompt of token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/sampler.h"

struct run_options {
    const char *dir;
    int32_t *prompt; /* owned */
    int n_prompt;
    long n_generate, n_threads, n_ctx;
    enum compute_mode mode;
    struct sampler_params sampling;
};

static bool parse_run_options(int argc, char **argv, struct run_options *o)
{
    *o = (struct run_options){.n_generate = 32, .n_ctx = 4096, .mode = COMPUTE_FAST,
                              .sampling = {.temperature = 0, .top_p = 1}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double f;
        if (a[0] != '-') {
            if (o->dir) {
                fprintf(stderr, "inferd run: unexpected argument '%s'\n", a);
                return false;
            }
            o->dir = a;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return false;
        if (!strcmp(a, "--tokens")) {
            free(o->prompt);
            if (!arg_token_list(a, v, &o->prompt, &o->n_prompt))
                return false;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            fprintf(stderr, "inferd run: text prompts need the model's tokenizer, which this "
                            "build does not load yet; pass token ids with --tokens\n");
            return false;
        } else if (!strcmp(a, "-n")) {
            if (!arg_int(a, v, 0, 1 << 24, &o->n_generate))
                return false;
        } else if (!strcmp(a, "--threads")) {
            if (!arg_int(a, v, 0, 1024, &o->n_threads))
                return false;
        } else if (!strcmp(a, "--ctx")) {
            if (!arg_int(a, v, 1, 1 << 24, &o->n_ctx))
                return false;
        } else if (!strcmp(a, "--mode")) {
            if (!arg_mode(v, &o->mode))
                return false;
        } else if (!strcmp(a, "--temp")) {
            if (!arg_float(a, v, 0, 100, &f))
                return false;
            o->sampling.temperature = (float)f;
        } else if (!strcmp(a, "--top-p")) {
            if (!arg_float(a, v, 1e-9, 1, &f))
                return false;
            o->sampling.top_p = (float)f;
        } else if (!strcmp(a, "--min-p")) {
            if (!arg_float(a, v, 0, 1, &f))
                return false;
            o->sampling.min_p = (float)f;
        } else if (!strcmp(a, "--top-k")) {
            long k;
            if (!arg_int(a, v, 0, 1 << 24, &k))
                return false;
            o->sampling.top_k = (int)k;
        } else if (!strcmp(a, "--seed")) {
            if (!arg_u64(a, v, &o->sampling.seed))
                return false;
        } else {
            fprintf(stderr, "inferd run: unknown option '%s'\n", a);
            return false;
        }
    }
    if (!o->dir || !o->prompt) {
        fprintf(stderr, "usage: inferd run DIR --tokens IDS [-n N] [--temp T] [--seed S]\n");
        return false;
    }
    return true;
}

static bool is_eos(const struct model *m, int32_t tok)
{
    for (int i = 0; i < m->config.n_eos; i++)
        if (m->config.eos_token_ids[i] == tok)
            return true;
    return false;
}

int cmd_run(int argc, char **argv)
{
    struct run_options o;
    if (!parse_run_options(argc, argv, &o)) {
        free(o.prompt);
        return 2;
    }
    struct err err = {0};
    struct backend *be = NULL;
    struct model *m = NULL;
    struct generator *g = NULL;
    struct sampler sampler = {0};
    int status = 1;

    double t0 = now_s();
    if (backend_cpu_create((int)o.n_threads, o.mode, &be, &err) < 0 ||
        model_load(o.dir, be, &m, &err) < 0)
        goto fail;
    double t_loaded = now_s();
    long n_ctx = o.n_ctx < m->config.max_position_embeddings ? o.n_ctx
                                                             : m->config.max_position_embeddings;
    if (o.n_prompt + o.n_generate > n_ctx) {
        err_set(&err, INFERD_ERANGE, "prompt (%d) + generation (%ld) exceed the context (%ld)",
                o.n_prompt, o.n_generate, n_ctx);
        goto fail;
    }
    if (generator_create(m, (int)n_ctx, 512, &g, &err) < 0 ||
        sampler_init(&sampler, &o.sampling, m->config.vocab_size, &err) < 0 ||
        generator_feed(g, o.prompt, o.n_prompt, &err) < 0)
        goto fail;
    double t_prefilled = now_s();
    long produced = 0;
    for (; produced < o.n_generate; produced++) {
        int32_t tok = sampler_pick(&sampler, g->logits);
        printf("%s%d", produced ? "," : "", tok);
        fflush(stdout);
        if (is_eos(m, tok)) {
            produced++;
            break;
        }
        if (produced + 1 < o.n_generate && generator_feed(g, &tok, 1, &err) < 0)
            goto fail;
    }
    printf("\n");
    fflush(stdout);
    double t_done = now_s();
    fprintf(stderr, "inferd run: load %.2f s, prefill %d tokens %.1f tok/s, decode %ld tokens %.1f tok/s\n",
            t_loaded - t0, o.n_prompt, o.n_prompt / (t_prefilled - t_loaded), produced,
            produced > 1 ? (produced - 1) / (t_done - t_prefilled) : 0.0);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "inferd run: %s\n", err.msg);
done:
    sampler_free(&sampler);
    generator_free(g);
    model_free(m);
    backend_destroy(be);
    free(o.prompt);
    return status;
}
