/* cli/cmd_serve.c — `inferd serve`: load a model directory and answer the OpenAI API over HTTP
 * until SIGINT or SIGTERM. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/reencode.h"
#include "api/routes.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "kv/kv.h"

#define DEFAULT_CTX_CAP 8192
#define DEFAULT_KV_MB 4096

struct serve_options {
    const char *dir;
    const char *host;
    long port, max_tokens, top_k, threads, ctx, max_queue, max_batch, kv_mb, max_body_mb;
    long request_timeout_s, shutdown_timeout_s;
    double temperature, top_p, min_p;
    bool has_temperature, has_top_p, has_top_k, has_min_p;
    const char *api_key;
    const char *device; /* --device: cpu, cuda[:N] or auto */
    enum compute_mode mode;
    struct backend_options backend; /* the environment's, then the backend flags' */
};

static const char usage[] =
    "usage: inferd serve DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
    "       [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
    "       [--threads N] [--ctx N] [--max-batch N] [--max-queue N] [--kv-mb MB]\n"
    "       [--max-body-mb 32] [--request-timeout S] [--shutdown-timeout S] [--mode fast|exact]\n"
    "       [--device cpu|cuda[:N]|auto] [backend flags]\n"
    "Serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) and\n"
    "/health, /stats, /metrics. --port 0 picks a free port. Sampling flags set the\n"
    "defaults below each request's own fields (generation_config.json is below them).\n"
    CLI_BACKEND_USAGE;

static bool parse_serve_options(int argc, char **argv, struct serve_options *o)
{
    *o = (struct serve_options){.host = "127.0.0.1", .port = 8080, .max_queue = 64,
                                .max_batch = 8, .kv_mb = 0, .max_body_mb = 32,
                                .request_timeout_s = 30, .shutdown_timeout_s = 10,
                                .mode = COMPUTE_FAST};
    cli_backend_options_from_env(&o->backend);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            exit(0);
        }
        if (a[0] != '-') {
            if (o->dir) {
                fprintf(stderr, "inferd serve: unexpected argument '%s'\n%s", a, usage);
                return false;
            }
            o->dir = a;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return false;
        int backend_flag = cli_backend_flag(a, v, &o->backend);
        if (backend_flag < 0)
            return false;
        if (backend_flag > 0)
            continue;
        bool ok = true;
        if (!strcmp(a, "--host"))
            o->host = v;
        else if (!strcmp(a, "--port"))
            ok = arg_int(a, v, 0, 65535, &o->port);
        else if (!strcmp(a, "--api-key"))
            o->api_key = v;
        else if (!strcmp(a, "--max-tokens"))
            ok = arg_int(a, v, 1, INT_MAX, &o->max_tokens);
        else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp"))
            ok = o->has_temperature = arg_float(a, v, 0, 2, &o->temperature);
        else if (!strcmp(a, "--top-p"))
            ok = o->has_top_p = arg_float(a, v, 1e-9, 1, &o->top_p);
        else if (!strcmp(a, "--top-k"))
            ok = o->has_top_k = arg_int(a, v, 0, INT_MAX, &o->top_k);
        else if (!strcmp(a, "--min-p"))
            ok = o->has_min_p = arg_float(a, v, 0, 1, &o->min_p);
        else if (!strcmp(a, "--threads"))
            ok = arg_int(a, v, 0, 1024, &o->threads);
        else if (!strcmp(a, "--ctx"))
            ok = arg_int(a, v, 2, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--max-batch"))
            ok = arg_int(a, v, 1, 1024, &o->max_batch);
        else if (!strcmp(a, "--max-queue"))
            ok = arg_int(a, v, 1, 1 << 20, &o->max_queue);
        else if (!strcmp(a, "--kv-mb"))
            ok = arg_int(a, v, 1, 1 << 30, &o->kv_mb);
        else if (!strcmp(a, "--max-body-mb"))
            ok = arg_int(a, v, 1, 4096, &o->max_body_mb);
        else if (!strcmp(a, "--request-timeout"))
            ok = arg_int(a, v, 1, 3600, &o->request_timeout_s);
        else if (!strcmp(a, "--shutdown-timeout"))
            ok = arg_int(a, v, 0, 3600, &o->shutdown_timeout_s);
        else if (!strcmp(a, "--mode"))
            ok = arg_mode(v, &o->mode);
        else if (!strcmp(a, "--device")) {
            struct device_spec spec;
            ok = cli_device_parse(v, &spec);
            o->device = v;
        }
        else {
            fprintf(stderr, "inferd serve: unknown flag '%s'\n%s", a, usage);
            return false;
        }
        if (!ok)
            return false;
    }
    if (!o->dir) {
        fputs(usage, stderr);
        return false;
    }
    return true;
}

static const char *base_name(const char *dir, char *buf, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(buf, cap, "%.*s", (int)(n - start), dir + start);
    return buf;
}

static void add_eos(struct server *srv, int32_t id)
{
    if (id < 0 || srv->n_eos >= SERVER_MAX_EOS)
        return;
    for (int i = 0; i < srv->n_eos; i++)
        if (srv->eos_ids[i] == id)
            return;
    srv->eos_ids[srv->n_eos++] = id;
}

/* Engine sizes from the flags and the model: the KV pool holds max_batch
 * full contexts when that fits the budget, and at least one. */
static void engine_sizes(const struct serve_options *o, const struct model *m,
                         struct engine_config *ec)
{
    const struct model_config *c = &m->config;
    long ctx = o->ctx ? o->ctx : c->max_position_embeddings;
    if (!o->ctx && ctx > DEFAULT_CTX_CAP)
        ctx = DEFAULT_CTX_CAP;
    if (ctx < 2)
        ctx = 2;
    struct kv_format format = kv_format_of_dtype(m->backend->kv_dtype);
    size_t budget = (size_t)(o->kv_mb ? o->kv_mb : DEFAULT_KV_MB) << 20;
    long tokens = (long)(budget / kv_format_bytes_per_token(c, &format));
    if (tokens > ctx * o->max_batch)
        tokens = ctx * o->max_batch;
    if (tokens < ctx)
        tokens = ctx;
    *ec = (struct engine_config){
        .n_ctx = (int)ctx,
        .max_seqs = (int)o->max_batch,
        .max_step_tokens = (int)(o->max_batch > 512 ? o->max_batch : 512),
        .max_queue = (int)o->max_queue,
        .kv_blocks = (int)((tokens + KV_BLOCK_SIZE_DEFAULT - 1) / KV_BLOCK_SIZE_DEFAULT),
    };
}

int cmd_serve(int argc, char **argv)
{
    struct serve_options o;
    if (!parse_serve_options(argc, argv, &o))
        return 2;

    /* Signals are taken by this thread alone (sigwait below); every thread
     * started from here inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    static struct server srv;
    char name[256];
    snprintf(srv.model_id, sizeof srv.model_id, "%s", base_name(o.dir, name, sizeof name));
    srv.cfg = (struct server_config){
        .host = o.host,
        .port = (int)o.port,
        .api_key = o.api_key,
        .max_body_bytes = (size_t)o.max_body_mb << 20,
        .request_timeout_s = (int)o.request_timeout_s,
        .idle_timeout_s = 60,
        .shutdown_grace_ms = (int)o.shutdown_timeout_s * 1000,
        .max_connections = 512,
    };
    srv.created = time(NULL);
    srv.started_ns = now_ns();
    atomic_init(&srv.ready, false);
    atomic_init(&srv.stopping, false);

    struct err err = {0};
    struct http_daemon *http = NULL;
    if (http_start(&srv, api_routes(), &http, &err) < 0) {
        fprintf(stderr, "inferd serve: %s\n", err.msg);
        return 1;
    }

    int status = 1;
    struct backend *be = NULL;
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct chat_template tmpl = {0};
    bool have_tmpl = false;
    struct engine *engine = NULL;
    struct reencode *reencode = NULL;
    uint64_t t0 = now_ns();
    o.backend.mode = o.mode;
    o.backend.threads = (int)o.threads;
    if (cli_backend_create(o.device, &o.backend, &be, &err) < 0 ||
        model_load(o.dir, be, &m, &err) < 0) {
        fprintf(stderr, "inferd serve: %s\n", err.msg);
        goto out;
    }
    if (tok_load(o.dir, &tok, &err) < 0) {
        fprintf(stderr, "inferd serve: %s: the server needs the model's tokenizer: %s\n", o.dir,
                err.msg);
        goto out;
    }
    if (tok_vocab_size(tok) > m->config.vocab_size)
        log_warn("serve: the tokenizer has %d tokens but the model only %d; prompts using the "
                 "others are refused",
                 tok_vocab_size(tok), m->config.vocab_size);
    if (chat_template_load(tok, &tmpl, &err) == 0)
        have_tmpl = true;
    else
        log_warn("serve: no chat template (%s); /v1/chat/completions will answer 400", err.msg);

    if (reencode_create(tok, REENCODE_MAX_BYTES, &reencode, &err) < 0) {
        fprintf(stderr, "inferd serve: %s\n", err.msg);
        goto out;
    }

    struct engine_config ec;
    engine_sizes(&o, m, &ec);
    if (engine_create(m, tok, &ec, &engine, &err) < 0) {
        fprintf(stderr, "inferd serve: %s\n", err.msg);
        goto out;
    }

    const struct generation_defaults *g = &m->generation;
    srv.defaults = (struct server_defaults){
        .temperature = o.has_temperature ? (float)o.temperature : g->temperature,
        .top_p = o.has_top_p ? (float)o.top_p : g->top_p,
        .top_k = o.has_top_k ? (int)o.top_k : g->top_k,
        .min_p = o.has_min_p ? (float)o.min_p : 0,
        .repetition_penalty = g->repetition_penalty,
        .max_tokens = (int)o.max_tokens,
    };
    for (int i = 0; i < g->n_eos; i++)
        add_eos(&srv, g->eos_token_ids[i]);
    if (tok_eos_token(tok))
        add_eos(&srv, tok_piece_to_id(tok, tok_eos_token(tok)));
    srv.model = m;
    srv.tok = tok;
    srv.tmpl = have_tmpl ? &tmpl : NULL;
    srv.engine = engine;
    srv.reencode = reencode;
    atomic_store(&srv.ready, true);

    int port = http_bound_port(http);
    printf("inferd: serving %s at http://%s:%d\n", srv.model_id, o.host, port);
    printf("try:    curl http://%s:%d/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"
           "          -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
           "\"max_tokens\": 64}'\n",
           o.host, port, o.api_key ? " -H 'Authorization: Bearer $KEY'" : "");
    fflush(stdout);
    char where[256];
    cli_backend_describe(be, where, sizeof where);
    log_info("serve: ready in %.2f s on %s; context %d, up to %d sequences, KV pool %d blocks",
             (double)(now_ns() - t0) * 1e-9, where, ec.n_ctx, ec.max_seqs, ec.kv_blocks);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    log_info("serve: signal %d: finishing in-flight requests (up to %ld s)", sig,
             o.shutdown_timeout_s);
    status = 0;

out:
    atomic_store(&srv.stopping, true);
    http_quiesce(http);
    engine_shutdown(engine, srv.cfg.shutdown_grace_ms);
    http_stop(http);
    engine_free(engine);
    reencode_free(reencode);
    if (have_tmpl)
        chat_template_free(&tmpl);
    tok_free(tok);
    model_free(m);
    backend_destroy(be);
    return status;
}
