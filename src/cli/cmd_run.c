/* cli/cmd_run.c — `inferd run`: load a model directory and generate from a prompt of token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "base/timer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/spec_flags.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

struct run_options {
    const char *dir;
    int32_t *prompt; /* owned; from --tokens */
    int n_prompt;
    const char *text; /* -p: encoded with the model's tokenizer */
    const char *device; /* --device: cpu, cuda[:N] or auto */
    bool chat;        /* --chat: the text is a user message through the chat template */
    long n_generate, n_threads, n_ctx;
    enum compute_mode mode;
    struct sampler_params sampling;
    struct backend_options backend; /* the environment's, then the backend flags' */
    struct cli_spec_options spec;   /* speculative decoding */
    struct cli_kv_quant kvq;        /* --kv-quant, --kv-quant-config */
    enum dtype quantize;            /* --quantize; DTYPE_F32: as stored */
    struct cli_tp_flags tp;         /* --tensor-parallel, --nccl-lib */
};

static const char usage[] =
    "usage: inferd run DIR (-p TEXT [--chat] | --tokens IDS) [-n N] [--temp T] [--top-k K]\n"
    "       [--top-p P] [--min-p P] [--seed S] [--threads N] [--mode fast|exact] [--ctx N]\n"
    "       [--device cpu|cuda[:N]|auto] [--draft-model DIR] [--draft-kind two-model|ngram]\n"
    "       [--num-draft-tokens K] [--ngram-max N] [--ngram-min N] [--tensor-parallel N]\n"
    "Generates from a Hugging Face model directory or a GGUF file: -p TEXT is\n"
    "encoded with its tokenizer (--chat sends it as a user message through the\n"
    "chat template) and the answer printed as text; --tokens takes comma-separated\n"
    "ids and prints the generated ids on one comma-separated line. -n tokens\n"
    "(default 32); --temp 0 (the default) is greedy; --ctx 4096 by default.\n" CLI_SPEC_USAGE;

static bool parse_run_options(int argc, char **argv, struct run_options *o)
{
    *o = (struct run_options){.n_generate = 32, .n_ctx = 4096, .mode = COMPUTE_FAST,
                              .sampling = {.temperature = 0, .top_p = 1}};
    cli_backend_options_from_env(&o->backend);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double f;
        if (arg_is_help(a)) {
            fputs(usage, stdout);
            exit(0);
        }
        if (a[0] != '-') {
            if (o->dir) {
                fprintf(stderr, "inferd run: unexpected argument '%s'\n", a);
                return false;
            }
            o->dir = a;
            continue;
        }
        if (!strcmp(a, "--chat")) {
            o->chat = true;
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
        if (!strcmp(a, "--tokens")) {
            free(o->prompt);
            if (!arg_token_list(a, v, &o->prompt, &o->n_prompt))
                return false;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            o->text = v;
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
        } else if (!strcmp(a, "--device")) {
            struct device_spec spec;
            if (!cli_device_parse(v, &spec))
                return false;
            o->device = v;
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
    if (!o->dir || (!o->prompt) == (!o->text)) {
        fprintf(stderr, "usage: inferd run DIR (-p TEXT [--chat] | --tokens IDS) [-n N] [--temp T] [--seed S] [--device cpu|cuda[:N]|auto]\n"
                        "       [backend flags]\n" CLI_BACKEND_USAGE CLI_KV_QUANT_USAGE CLI_QUANTIZE_USAGE CLI_TP_USAGE);
        return false;
    }
    if (o->chat && !o->text) {
        fprintf(stderr, "inferd run: --chat applies to a text prompt (-p)\n");
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

/* The prompt's token ids from -p: the text as given, or as one user message
 * rendered through the chat template (--chat); the template adds BOS itself,
 * so only a raw prompt gets the tokenizer's special tokens. */
static int encode_text_prompt(const struct tokenizer *tok, const struct run_options *o,
                              int32_t **ids, int *n, struct err *err)
{
    if (!o->chat)
        return tok_encode(tok, o->text, strlen(o->text), true, ids, n, err);
    struct chat_template ct;
    int rc = chat_template_load(tok, &ct, err);
    if (rc < 0)
        return rc;
    struct json_object *messages = json_object_new_array();
    struct json_object *message = json_object_new_object();
    json_object_object_add(message, "role", json_object_new_string("user"));
    json_object_object_add(message, "content", json_object_new_string(o->text));
    json_object_array_add(messages, message);
    char *rendered = NULL;
    size_t len = 0;
    rc = chat_template_render(&ct, messages, NULL, true, NULL, &rendered, &len, err);
    if (rc == 0)
        rc = tok_encode(tok, rendered, len, false, ids, n, err);
    free(rendered);
    json_object_put(messages);
    chat_template_free(&ct);
    return rc;
}

/* Prints a generated token: as text when the model has a tokenizer, else as its id. */
static int print_token(struct detok *detok, int32_t tok, long index, struct err *err)
{
    if (!detok) {
        printf("%s%d", index ? "," : "", tok);
    } else {
        const char *text;
        size_t len;
        int rc = detok_push(detok, tok, &text, &len, err);
        if (rc < 0)
            return rc;
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return 0;
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
    struct cli_tp *tp = NULL; /* the other ranks under --tensor-parallel */
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct detok *detok = NULL;
    struct generator *g = NULL;
    struct sampler sampler = {0};
    struct model *draft = NULL;
    struct spec_config spec = {0};
    int status = 1;

    double t0 = now_s();
    o.backend.mode = o.mode;
    o.backend.threads = (int)o.n_threads;
    if (cli_kv_quant_resolve(&o.kvq, o.dir, &o.backend, &err) < 0 ||
        cli_model_open(o.device, &o.backend, &o.tp, o.dir,
                       &(struct model_load_options){.quantize = o.quantize}, &be, &m, &tp,
                       &err) < 0)
        goto fail;
    /* A text prompt is answered in text; --tokens always in ids, whatever
     * tokenizer the model carries, so scripts read one format. */
    if (o.text) {
        if (model_tokenizer_load(o.dir, &tok, &err) < 0 ||
            detok_create(tok, true, &detok, &err) < 0)
            goto fail;
    }
    if (o.text && encode_text_prompt(tok, &o, &o.prompt, &o.n_prompt, &err) < 0)
        goto fail;
    if (o.n_prompt == 0) {
        err_set(&err, INFERD_EINVAL, "the prompt encodes to no tokens");
        goto fail;
    }
    double t_loaded = now_s();
    long n_ctx = o.n_ctx < m->config.max_position_embeddings ? o.n_ctx
                                                             : m->config.max_position_embeddings;
    if (o.n_prompt + o.n_generate > n_ctx) {
        err_set(&err, INFERD_ERANGE, "prompt (%d) + generation (%ld) exceed the context (%ld)",
                o.n_prompt, o.n_generate, n_ctx);
        goto fail;
    }
    int32_t picks[1 + SPEC_MAX_DRAFTS];
    int n_picks = 0;
    if (cli_spec_load(&o.spec, m, tok, &draft, &spec, &err) < 0 ||
        generator_create_spec(m, (int)n_ctx, 512, spec.kind != SPEC_NONE ? &spec : NULL, &g,
                              &err) < 0 ||
        sampler_init(&sampler, &o.sampling, m->config.vocab_size, &err) < 0 ||
        generator_feed_picks(g, o.prompt, o.n_prompt, &sampler, picks, &n_picks, &err) < 0)
        goto fail;
    double t_prefilled = now_s();
    long produced = 0;
    /* a step gives one token, or with speculation every draft kept and one more */
    for (bool done = false; !done && produced < o.n_generate;) {
        for (int j = 0; j < n_picks && produced < o.n_generate; j++) {
            int32_t next = picks[j];
            produced++;
            if (is_eos(m, next)) {
                done = true;
                break;
            }
            if (print_token(detok, next, produced - 1, &err) < 0)
                goto fail;
        }
        if (!done && produced < o.n_generate &&
            generator_feed_picks(g, &picks[n_picks - 1], 1, &sampler, picks, &n_picks, &err) < 0)
            goto fail;
    }
    if (detok) {
        const char *text;
        size_t len;
        if (detok_flush(detok, &text, &len, &err) < 0)
            goto fail;
        fwrite(text, 1, len, stdout);
    }
    printf("\n");
    fflush(stdout);
    double t_done = now_s();
    fprintf(stderr, "inferd run: load %.2f s, prefill %d tokens %.1f tok/s, decode %ld tokens %.1f tok/s\n",
            t_loaded - t0, o.n_prompt, o.n_prompt / (t_prefilled - t_loaded), produced,
            produced > 1 ? (produced - 1) / (t_done - t_prefilled) : 0.0);
    if (spec.kind != SPEC_NONE) {
        uint64_t drafted, accepted, steps;
        generator_spec_stats(g, &drafted, &accepted, &steps);
        fprintf(stderr, "inferd run: speculation: %llu drafted, %llu accepted (%.0f%%), %llu "
                        "verify steps, %.2f tokens per verify step\n",
                (unsigned long long)drafted, (unsigned long long)accepted,
                drafted ? 100.0 * (double)accepted / (double)drafted : 0.0,
                (unsigned long long)steps, steps ? (double)(accepted + steps) / (double)steps : 0.0);
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "inferd run: %s\n", err.msg);
done:
    sampler_free(&sampler);
    generator_free(g);
    model_free(draft);
    detok_free(detok);
    tok_free(tok);
    model_free(m);
    cli_tp_free(tp);
    backend_destroy(be);
    free(o.prompt);
    return status;
}
