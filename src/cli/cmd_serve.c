/* cli/cmd_serve.c — `inferd serve`: load a model directory (or a pool of models, loaded by the
 * pool as requests name them) and answer the OpenAI API over HTTP until SIGINT or SIGTERM. */
#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "api/admin_socket.h"
#include "api/engine_child.h"
#include "api/engine_proxy.h"
#include "api/fit.h"
#include "api/model_pool.h"
#include "api/reencode.h"
#include "api/structured.h"
#include "grammar/grammar.h"
#include "api/response_store.h"
#include "api/routes.h"
#include "api/webui.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/adapter_flags.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device.h"
#include "cli/spec_flags.h"
#include "cli/tier.h"
#include "engine/transcribe.h"
#include "engine/turns.h"
#include "kv/kv.h"
#include "kv/kv_quant_config.h"
#include "text/toolcall.h"

#define DEFAULT_CTX_CAP 8192
#define DEFAULT_KV_MB 4096
#define DEFAULT_PREFILL_CHUNK 2048
/* The start-up read probe behind /fit's predicted decode speed: short, as the
 * server starts on it. */
#define FIT_PROBE_CPU_BYTES ((size_t)128 << 20)
#define FIT_PROBE_GPU_BYTES ((size_t)1 << 30)
/* The SSD tier's cost model weighs restores against the prefill rate of a prompt this long,
 * timed at start-up: long enough to fill a GPU's step, short enough to cost little. */
#define TIER_PROBE_TOKENS_CPU 64
#define TIER_PROBE_TOKENS_GPU 512
#define DEFAULT_SSD_DEMOTE_IDLE_S 300
/* --model-pool paths at most (a pool file among them may list more models). */
#define MODEL_POOL_MAX_PATHS 64
/* --isolate: an engine child with requests and no step progress this long is hung. */
#define DEFAULT_WATCHDOG_S 30
/* --isolate: a child restarted more often than this within the window waits the window out. */
#define ISOLATE_MAX_RESTARTS 5
#define ISOLATE_RESTART_WINDOW_S 60

struct serve_options {
    const char *dir;
    struct cli_spec_options spec;   /* speculative decoding */
    const char *host;
    long port, max_tokens, top_k, threads, ctx, max_queue, max_batch, kv_mb, max_body_mb;
    long prefill_chunk, kv_block_size;
    double kv_budget_gb, memory_budget_gb; /* decimal GB; 0: no budget */
    long request_timeout_s, shutdown_timeout_s;
    long stream_interval_ms;
    double temperature, top_p, min_p;
    bool has_temperature, has_top_p, has_top_k, has_min_p;
    struct api_keys keys;  /* owned: every --api-key and the keys of every --api-keys file */
    struct err keys_err;   /* the first bad --api-key / --api-keys, reported once parsed */
    const char *device; /* --device: cpu, cuda[:N] or auto */
    enum compute_mode mode;
    struct backend_options backend; /* the environment's, then the backend flags' */
    struct cli_kv_quant kvq;        /* --kv-quant, --kv-quant-config */
    enum dtype quantize;            /* --quantize; DTYPE_F32: as stored */
    double prompt_cache_gib;        /* --prompt-cache: cap on unreferenced cached KV; 0: off */
    long grammar_cache;             /* --grammar-cache: compiled structured-output grammars kept */
    enum kv_retention cache_retention;
    long session_idle_s;
    long response_store_mb, response_store_ttl_s; /* the Responses API's stored responses */
    enum server_thinking thinking;                /* --thinking on|off */
    const char *ssd_dir;            /* --ssd-cache DIR; NULL: no SSD tier */
    double ssd_max_gib;             /* --ssd-cache-max (binary GiB); 0: the disk's free space */
    bool ssd_verify;                /* --ssd-cache-verify */
    enum ssd_direct_io ssd_direct_io; /* --ssd-direct-io auto|on|off */
    long ssd_demote_idle_s;         /* --ssd-demote-idle; 0: never */
    bool ssd_flag_seen;             /* some --ssd-cache-* flag was given */
    long generation_checkpoint;     /* --generation-checkpoint N; 0: none */
    enum kv_tier_restore ssd_restore; /* --ssd-restore auto|always|never */
    struct kv_quant ssd_cold;       /* --ssd-kv-format: the disk's format when ssd_cold_on */
    bool ssd_cold_on;
    bool no_webui;                  /* --no-webui: no chat page at / */
    bool no_jump_forward;           /* --no-jump-forward: structured output samples forced text */
    const char *whisper_dir;        /* --whisper-model DIR; NULL: the audio routes answer 503 */
    long whisper_idle_unload_s;     /* --whisper-idle-unload S (default 300; 0: never) */
    bool whisper_resident;          /* --whisper-resident: loaded at start, never unloaded */
    long max_audio_mb;              /* --max-audio-mb (default 25) */
    long whisper_beam;              /* --whisper-beam N: requests' default beam width (1: greedy) */
    struct device_turns *turns;     /* not a flag: the device's turns when Whisper shares it with
                                       the chat engines (borrowed; NULL: none) */
    const char *pool_paths[MODEL_POOL_MAX_PATHS]; /* --model-pool: directories, GGUF files
                                                     and pool files (.json) */
    int n_pool_paths;
    double pool_memory_gb;          /* --pool-memory (decimal GB); 0: no limit */
    struct cli_adapter_options adapters; /* --adapter, --adapter-dir, --merge-adapter */
    bool isolate;                   /* --isolate: each model's engine in a child process */
    struct cli_tp_flags tp;         /* --tensor-parallel, --nccl-lib */
    long watchdog_s;                /* --watchdog-s (default 30; 0: off) */
    const char *admin_socket;       /* --admin-socket PATH; NULL: under the runtime directory */
    /* The command line as given (from "serve" on): an engine child parses it again. */
    int argc;
    char **argv;
    /* A pool file entry's "options", as JSON (borrowed from the pool file's, which lives as
     * long as the pool); NULL: the flags alone. An engine child applies it over the flags. */
    const char *entry_options;
};

static const char usage[] =
    "usage: inferd serve DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY]... [--api-keys FILE]\n"
    "       [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
    "       [--threads N] [--ctx N] [--max-batch N] [--max-queue N] [--kv-mb MB]\n"
    "       [--max-body-mb 32] [--request-timeout S] [--shutdown-timeout S]\n"
    "       [--stream-interval MS] [--mode fast|exact]\n"
    "       [--device cpu|cuda[:N]|auto] [--batch N] [--prefill-chunk 2048] [--no-webui]\n"
    "       [--kv-block-size 16] [--kv-budget GB] [--memory-budget GB] [--prompt-cache GIB]\n"
    "       [--cache-retention lru|cost-size] [--session-idle-s 600] [--thinking on|off]\n"
    "       [--response-store-mb 64] [--response-store-ttl-s 3600] [--grammar-cache 64]\n"
    "       [--no-jump-forward] [--adapter ID=DIR]... [--adapter-dir DIR] [--merge-adapter ID]\n"
    "       [--ssd-cache DIR [--ssd-cache-max GIB] [--ssd-cache-verify] [--ssd-demote-idle 300]\n"
    "        [--ssd-restore auto|always|never] [--ssd-kv-format FORMAT] [--generation-checkpoint N]\n"
    "        [--ssd-direct-io auto|on|off]]\n"
    "       [--draft-model DIR] [--draft-kind two-model|ngram] [--num-draft-tokens K]\n"
    "       [--ngram-max 3] [--ngram-min 1] [backend flags]\n"
    "       [--whisper-model WDIR [--whisper-idle-unload 300] [--whisper-resident]\n"
    "        [--whisper-beam 1] [--max-audio-mb 25]]\n"
    "       [--model-pool PATH... [--pool-memory GB]]\n"
    "       [--isolate [--watchdog-s 30] [--admin-socket PATH]]\n"
    "Serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models;\n"
    "GET /v1 lists the routes), Anthropic's /v1/messages, and /health, /stats, /metrics.\n"
    "GET / is a chat page for trying the model in a browser (built into the binary; --no-webui\n"
    "turns it off); WS /ws/chat is a chat session over a WebSocket.\n"
    "--port 0 picks a free port.\n"
    "--whisper-model WDIR serves a Whisper model (a Hugging Face Whisper directory) beside the chat\n"
    "model at POST /v1/audio/transcriptions and /v1/audio/translations (multipart uploads of WAV,\n"
    "FLAC, OGG or MP3 up to --max-audio-mb MB); it is loaded on first use and unloaded after\n"
    "--whisper-idle-unload S idle seconds (0: never; --whisper-resident loads it at start and\n"
    "keeps it). POST /admin/transcription/unload unloads it now. --whisper-beam N (1-16) is the\n"
    "beam width of requests that give no beam_size (1: greedy decoding).\n"
    "--model-pool PATH... serves several models, picked by each request's \"model\" (404\n"
    "model_not_found for an id no entry has): each PATH a model directory or GGUF file (its id\n"
    "the directory's or file's name, without .gguf), or a pool file (.json): an array of\n"
    "{\"id\", \"path\", \"options\"}, paths relative to the file, options any of context,\n"
    "max_tokens, batch, kv_mb, prompt_cache, temperature, mode, device, kv_quant, quantize over\n"
    "the flags. DIR, when given too, is the default model (else the first entry); it loads at\n"
    "start, the others on their first request (which waits; at most --max-queue wait). With\n"
    "--pool-memory GB (decimal) resident models (weights and KV pool, and the Whisper model's\n"
    "files while it is loaded) stay under GB: the least recently used are unloaded first, after\n"
    "their in-flight requests, their cached prefixes flushed to --ssd-cache DIR/ID first, so\n"
    "they are found again after the next load. GET /v1/models lists every model and its state.\n"
    "--isolate runs each model's engine in a child process (a fresh inferd) that the server\n"
    "talks to over a unix socket: a child that crashes, or makes no step progress for\n"
    "--watchdog-s S seconds while it holds requests (0: no watchdog), is killed and restarted;\n"
    "its in-flight requests get a 503 (streams: an error event) and everything else carries on.\n"
    "GET /engine reports the children. --admin-socket PATH (default\n"
    "$XDG_RUNTIME_DIR/inferd-PID.sock, else /tmp/inferd-UID/inferd-PID.sock; mode 0600) answers\n"
    "POST /admin/drain (every cached prefix made durable in the SSD tier: {drained, demotions})\n"
    "and POST /admin/lease (every engine paused while the response stays open). Adapter flags\n"
    "pass to each child, and /v1/adapters mounts in it (a restarted child has the flags' only).\n"
    "Sampling flags set the defaults below each request's own fields (generation_config.json\n"
    "is below them). --thinking on|off is enable_thinking for chat templates that have it when\n"
    "a request says nothing (default: the template's own).\n"
    "--response-store-mb N (MiB, default 64; 0 keeps nothing) and --response-store-ttl-s S\n"
    "(default 3600) bound the responses /v1/responses keeps for previous_response_id and\n"
    "GET /v1/responses/{id}: past the size the least recently used go, past the age any go.\n"
    "--api-key KEY (repeatable) and --api-keys FILE (one key a line; blank lines and # comments\n"
    "skipped) set the keys that are accepted (Authorization: Bearer KEY or x-api-key: KEY); each\n"
    "key is a tenant whose prompt cache is never shared with another's.\n"
    "Admission: --batch N (alias of --max-batch) sequences run together; --batch 1 runs one\n"
    "request at a time, so a request's numerics never depend on what else arrives.\n"
    "--prefill-chunk N prompt tokens per step; --kv-block-size N positions per KV block.\n"
    "--kv-budget GB (decimal): requests run while their projected KV (prompt + max_tokens) fits,\n"
    "others wait; one that alone does not fit is a 400. --memory-budget GB (decimal): the\n"
    "context is what fits beside the weights and buffers (max_tokens is clamped to it, a prompt\n"
    "over it is a 400 context_over_budget); on CUDA, device allocations stop at the budget.\n"
    "GET /fit reports the sizes, the budget, the largest safe context and the predicted\n"
    "decode speed.\n"
    "--grammar-cache N (default 64) keeps the N most recently used compiled structured-output\n"
    "grammars (response_format schemas, guided_*, forced tool calls), so a repeated one compiles once.\n"
    "--no-jump-forward samples the text a grammar forces token by token instead of appending it\n"
    "as a prefill chunk (to measure the token masks' cost alone).\n"
    "--adapter ID=DIR (repeatable; DIR alone: its base name is the id) mounts a PEFT LoRA\n"
    "adapter at start-up; requests pick one with \"adapter\": \"ID\" (stacked: \"a+b\"; default\n"
    "none); /v1/adapters mounts and unmounts while serving. --adapter-dir DIR is what\n"
    "/v1/adapters/available lists. --merge-adapter ID merges that --adapter into the weights\n"
    "(faster; then no other adapter can be used).\n"
    "--prompt-cache GIB (binary GiB, default 8; 0 turns the prefix cache off) caps the\n"
    "KV that finished requests leave for the next ones with the same prefix; without\n"
    "--kv-mb or --memory-budget the KV pool grows by it (up to a quarter of physical memory).\n"
    "--cache-retention picks what is evicted first (lru, or cost-size: GreedyDual-Size);\n"
    "a session's blocks (session_id) are kept ahead of others until it is closed\n"
    "(POST /admin/cache/session/close) or idle for --session-idle-s seconds.\n"
    "--ssd-cache DIR keeps the prompt cache's blocks on disk as well (written behind, on an I/O\n"
    "thread), so they survive a restart: a prompt whose prefix is on disk reads it back when\n"
    "that is predicted to be faster than computing it. Needs the prompt cache (--prompt-cache\n"
    "above 0). --ssd-cache-max GIB (binary GiB; 0 or absent: what the disk has free) caps the\n"
    "files; --ssd-cache-verify checks every block's checksum on every read (the first read of a\n"
    "block after start-up is always checked); --ssd-demote-idle S (default 300; 0: never) lets\n"
    "blocks that are on disk and unused for S seconds leave memory. POST /admin/cache/flush\n"
    "makes everything cached durable; so does a clean shutdown (SIGINT, SIGTERM).\n"
    "--ssd-restore auto|always|never: whether a prefix found on disk is read back as the cost\n"
    "model says (auto: reading predicted faster than computing, from the disk's measured read\n"
    "rate and a timed prefill at start-up), always, or never (it is computed).\n"
    "--ssd-direct-io auto|on|off: how the tier's files are written. auto (the default) writes\n"
    "around the page cache (O_DIRECT) where the file system allows it, else through it; on\n"
    "refuses to start where it is not allowed; off always goes through the page cache.\n"
    "--ssd-kv-format FORMAT (a --kv-quant name: 8, 4, turbo, turbo:k4v3, ...) stores the blocks\n"
    "on disk in that colder, smaller format and restores them into the live one (off: the live\n"
    "format); /stats.tier counts the bytes it saves.\n"
    "--generation-checkpoint N (with --ssd-cache) saves every N generated tokens of each\n"
    "generation (its tokens and sampler state, its K/V through the SSD tier): the same request\n"
    "(prompt, parameters, seed) sent again after a restart or a client's cancel resumes there\n"
    "and gives the tokens an uninterrupted run would have; a completed one's is removed.\n"
    CLI_SPEC_USAGE
    "A request's \"speculative\": false turns it off for that request; usage.speculation\n"
    "{drafted, accepted, targetCalls} and usage.lane (serial, batch, serial+spec) say how it ran.\n"
    CLI_BACKEND_USAGE CLI_KV_QUANT_USAGE CLI_QUANTIZE_USAGE CLI_TP_USAGE;

static bool parse_serve_options(int argc, char **argv, struct serve_options *o)
{
    *o = (struct serve_options){.host = "127.0.0.1", .port = 8080, .max_queue = 64,
                                .max_batch = 8, .kv_mb = 0, .max_body_mb = 32,
                                .whisper_idle_unload_s = 300, .max_audio_mb = 25,
                                .whisper_beam = 1,
                                .prefill_chunk = DEFAULT_PREFILL_CHUNK,
                                .request_timeout_s = 30, .shutdown_timeout_s = 10,
                                .stream_interval_ms = STREAM_INTERVAL_DEFAULT_MS,
                                .mode = COMPUTE_FAST, .prompt_cache_gib = 8,
                                .grammar_cache = GRAMMAR_CACHE_DEFAULT,
                                .cache_retention = KV_RETAIN_LRU, .session_idle_s = 600,
                                .response_store_mb = RESPONSE_STORE_DEFAULT_MB,
                                .response_store_ttl_s = RESPONSE_STORE_DEFAULT_TTL_S,
                                .ssd_demote_idle_s = DEFAULT_SSD_DEMOTE_IDLE_S,
                                .watchdog_s = DEFAULT_WATCHDOG_S, .argc = argc, .argv = argv};
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
        if (!strcmp(a, "--ssd-cache-verify")) { /* the flags without a value */
            o->ssd_verify = o->ssd_flag_seen = true;
            continue;
        }
        if (!strcmp(a, "--no-jump-forward")) {
            o->no_jump_forward = true;
            continue;
        }
        if (!strcmp(a, "--no-webui")) {
            o->no_webui = true;
            continue;
        }
        if (!strcmp(a, "--isolate")) {
            o->isolate = true;
            continue;
        }
        if (!strcmp(a, "--whisper-resident")) {
            o->whisper_resident = true;
            continue;
        }
        if (!strcmp(a, "--model-pool")) { /* every path up to the next flag */
            int before = o->n_pool_paths;
            while (i + 1 < argc && argv[i + 1][0] != '-') {
                if (o->n_pool_paths >= MODEL_POOL_MAX_PATHS) {
                    fprintf(stderr, "inferd serve: --model-pool takes %d paths at most\n",
                            MODEL_POOL_MAX_PATHS);
                    return false;
                }
                o->pool_paths[o->n_pool_paths++] = argv[++i];
            }
            if (o->n_pool_paths == before) {
                fprintf(stderr, "inferd serve: --model-pool needs model directories, GGUF files "
                                "or pool files (.json)\n");
                return false;
            }
            continue;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return false;
        const struct cli_model_flags flags = {&o->backend, &o->kvq, &o->quantize, &o->tp,
                                              &o->spec};
        int model_flag = cli_model_flag(a, v, &flags);
        if (model_flag == 0)
            model_flag = cli_adapter_flag(a, v, &o->adapters);
        if (model_flag < 0)
            return false;
        if (model_flag > 0)
            continue;
        bool ok = true;
        if (!strcmp(a, "--host"))
            o->host = v;
        else if (!strcmp(a, "--port"))
            ok = arg_int(a, v, 0, 65535, &o->port);
        else if (!strcmp(a, "--api-key"))
            ok = api_keys_add(&o->keys, v, &o->keys_err) == 0;
        else if (!strcmp(a, "--api-keys"))
            ok = api_keys_load_file(&o->keys, v, &o->keys_err) == 0;
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
        else if (!strcmp(a, "--max-batch") || !strcmp(a, "--batch"))
            ok = arg_int(a, v, 1, 1024, &o->max_batch);
        else if (!strcmp(a, "--prefill-chunk"))
            ok = arg_int(a, v, 1, 1 << 20, &o->prefill_chunk);
        else if (!strcmp(a, "--kv-block-size")) /* kv/ checks its own limits */
            ok = arg_int(a, v, 1, 1 << 16, &o->kv_block_size);
        else if (!strcmp(a, "--kv-budget"))
            ok = arg_float(a, v, 1e-9, 1e9, &o->kv_budget_gb);
        else if (!strcmp(a, "--memory-budget"))
            ok = arg_float(a, v, 1e-9, 1e9, &o->memory_budget_gb);
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
        else if (!strcmp(a, "--stream-interval"))
            ok = arg_int(a, v, 0, 1000, &o->stream_interval_ms);
        else if (!strcmp(a, "--prompt-cache"))
            ok = arg_float(a, v, 0, 1 << 20, &o->prompt_cache_gib);
        else if (!strcmp(a, "--grammar-cache"))
            ok = arg_int(a, v, 1, 1 << 16, &o->grammar_cache);
        else if (!strcmp(a, "--cache-retention")) {
            if (!strcmp(v, "lru"))
                o->cache_retention = KV_RETAIN_LRU;
            else if (!strcmp(v, "cost-size"))
                o->cache_retention = KV_RETAIN_COST_SIZE;
            else {
                fprintf(stderr, "inferd serve: --cache-retention is lru or cost-size, not '%s'\n",
                        v);
                ok = false;
            }
        }
        else if (!strcmp(a, "--session-idle-s"))
            ok = arg_int(a, v, 0, 1L << 30, &o->session_idle_s);
        else if (!strcmp(a, "--response-store-mb"))
            ok = arg_int(a, v, 0, 1 << 20, &o->response_store_mb);
        else if (!strcmp(a, "--response-store-ttl-s"))
            ok = arg_int(a, v, 1, 1L << 30, &o->response_store_ttl_s);
        else if (!strcmp(a, "--thinking")) {
            if (!strcmp(v, "on") || !strcmp(v, "true"))
                o->thinking = SERVER_THINKING_ON;
            else if (!strcmp(v, "off") || !strcmp(v, "false"))
                o->thinking = SERVER_THINKING_OFF;
            else {
                fprintf(stderr, "inferd serve: --thinking is on or off, not '%s'\n", v);
                ok = false;
            }
        }
        else if (!strcmp(a, "--whisper-model"))
            o->whisper_dir = v;
        else if (!strcmp(a, "--whisper-idle-unload"))
            ok = arg_int(a, v, 0, 1L << 30, &o->whisper_idle_unload_s);
        else if (!strcmp(a, "--whisper-beam"))
            ok = arg_int(a, v, 1, 16, &o->whisper_beam);
        else if (!strcmp(a, "--watchdog-s"))
            ok = arg_int(a, v, 0, 1L << 20, &o->watchdog_s);
        else if (!strcmp(a, "--admin-socket"))
            o->admin_socket = v;
        else if (!strcmp(a, "--pool-memory"))
            ok = arg_float(a, v, 1e-9, 1e9, &o->pool_memory_gb);
        else if (!strcmp(a, "--max-audio-mb"))
            ok = arg_int(a, v, 1, 4096, &o->max_audio_mb);
        else if (!strcmp(a, "--ssd-cache")) {
            o->ssd_dir = v;
            if (!v[0]) {
                fprintf(stderr, "inferd serve: --ssd-cache needs a directory, not ''\n");
                ok = false;
            }
        }
        else if (!strcmp(a, "--ssd-cache-max"))
            ok = o->ssd_flag_seen = arg_float(a, v, 0, 1 << 30, &o->ssd_max_gib);
        else if (!strcmp(a, "--ssd-demote-idle"))
            ok = o->ssd_flag_seen = arg_int(a, v, 0, 1L << 30, &o->ssd_demote_idle_s);
        else if (!strcmp(a, "--ssd-restore")) {
            o->ssd_flag_seen = true;
            if (!strcmp(v, "auto"))
                o->ssd_restore = KV_RESTORE_AUTO;
            else if (!strcmp(v, "always"))
                o->ssd_restore = KV_RESTORE_ALWAYS;
            else if (!strcmp(v, "never"))
                o->ssd_restore = KV_RESTORE_NEVER;
            else {
                fprintf(stderr, "inferd serve: --ssd-restore is auto, always or never, not '%s'\n", v);
                ok = false;
            }
        }
        else if (!strcmp(a, "--ssd-direct-io")) {
            o->ssd_flag_seen = true;
            if (!strcmp(v, "auto"))
                o->ssd_direct_io = SSD_DIRECT_AUTO;
            else if (!strcmp(v, "on"))
                o->ssd_direct_io = SSD_DIRECT_ON;
            else if (!strcmp(v, "off"))
                o->ssd_direct_io = SSD_DIRECT_OFF;
            else {
                fprintf(stderr, "inferd serve: --ssd-direct-io is auto, on or off, not '%s'\n", v);
                ok = false;
            }
        }
        else if (!strcmp(a, "--ssd-kv-format")) {
            struct err e = {0};
            o->ssd_flag_seen = true;
            ok = kv_quant_parse(v, &o->ssd_cold, &o->ssd_cold_on, &e) == 0;
            if (!ok)
                fprintf(stderr, "inferd serve: --ssd-kv-format: %s\n", e.msg);
        }
        else if (!strcmp(a, "--generation-checkpoint"))
            ok = o->ssd_flag_seen = arg_int(a, v, 1, 1L << 20, &o->generation_checkpoint);
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
        if (!ok) {
            if (o->keys_err.code)
                fprintf(stderr, "inferd serve: %s: %s\n", a, o->keys_err.msg);
            return false;
        }
    }
    if (!o->dir && o->n_pool_paths == 0) {
        fputs(usage, stderr);
        return false;
    }
    if (o->pool_memory_gb > 0 && o->n_pool_paths == 0) {
        fprintf(stderr, "inferd serve: --pool-memory needs --model-pool\n");
        return false;
    }
    if (o->ssd_flag_seen && !o->ssd_dir) {
        fprintf(stderr, "inferd serve: --ssd-cache-max, --ssd-cache-verify, --ssd-demote-idle, "
                        "--ssd-restore, --ssd-kv-format, --ssd-direct-io and "
                        "--generation-checkpoint need --ssd-cache DIR\n");
        return false;
    }
    if (o->ssd_dir && !(o->prompt_cache_gib > 0)) {
        fprintf(stderr, "inferd serve: --ssd-cache needs the prompt cache, which --prompt-cache 0 "
                        "turns off\n");
        return false;
    }
    if (o->admin_socket && !o->isolate) {
        fprintf(stderr, "inferd serve: --admin-socket needs --isolate\n");
        return false;
    }
    if (o->tp.n > 1 && (o->ssd_dir || o->isolate || o->adapters.n || o->adapters.dir ||
                        o->adapters.merge)) {
        /* the SSD tier and adapters read and write one backend's KV and weights; a child
         * engine would need the ranks' devices handed over */
        fprintf(stderr, "inferd serve: --tensor-parallel does not run with --ssd-cache, "
                        "--isolate or LoRA adapters yet\n");
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

static void add_eos(struct served_model *srv, int32_t id)
{
    if (id < 0 || srv->n_eos >= SERVER_MAX_EOS)
        return;
    for (int i = 0; i < srv->n_eos; i++)
        if (srv->eos_ids[i] == id)
            return;
    srv->eos_ids[srv->n_eos++] = id;
}

/* The prompt cache's share of physical memory at most, when it grows the pool. */
#define PROMPT_CACHE_MEMORY_SHARE 4

/* Engine sizes from the flags and the model. The KV pool holds max_batch
 * full contexts when that fits the budget (--kv-mb, and what --memory-budget
 * leaves beside the weights and buffers), and at least one context, which the
 * memory budget may shorten. The prefix cache lives in the same pool: with
 * --kv-mb or --memory-budget the pool is all there is (cached blocks take what
 * running requests leave); without them, the pool grows by the --prompt-cache
 * cap, as far as a quarter of physical memory allows. */
static void engine_sizes(const struct serve_options *o, const struct model *m,
                         const struct server_fit *fit, struct engine_config *ec)
{
    const struct model_config *c = &m->config;
    long ctx = o->ctx ? o->ctx : c->max_position_embeddings;
    if (!o->ctx && ctx > DEFAULT_CTX_CAP)
        ctx = DEFAULT_CTX_CAP;
    if (ctx < 2)
        ctx = 2;
    long block = o->kv_block_size ? o->kv_block_size : KV_BLOCK_SIZE_DEFAULT;
    size_t budget = (size_t)(o->kv_mb ? o->kv_mb : DEFAULT_KV_MB) << 20;
    int budget_ctx = 0;
    long kept = ctx; /* the context the engine keeps (engine_config.budget_ctx) */
    size_t cache_bytes = (size_t)(o->prompt_cache_gib * (double)(1ull << 30));
    bool bounded = o->kv_mb || fit->memory_budget_bytes;
    if (fit->memory_budget_bytes) {
        size_t room = (size_t)fit->max_safe_context * fit->kv_bytes_per_token;
        if (room < budget)
            budget = room;
        if (fit->max_safe_context < ctx)
            kept = budget_ctx = (int)fit->max_safe_context;
    }
    long tokens = (long)(budget / fit->kv_bytes_per_token);
    if (tokens > kept * o->max_batch && !(bounded && cache_bytes > 0))
        tokens = kept * o->max_batch;
    if (tokens < kept)
        tokens = kept;
    if (!bounded && cache_bytes > 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        size_t room = pages > 0 && page > 0
                          ? (size_t)pages * (size_t)page / PROMPT_CACHE_MEMORY_SHARE
                          : cache_bytes;
        size_t grow = cache_bytes < room ? cache_bytes : room;
        tokens += (long)(grow / fit->kv_bytes_per_token);
    }
    *ec = (struct engine_config){
        .n_ctx = (int)ctx,
        .max_seqs = (int)o->max_batch,
        .max_step_tokens = (int)(o->max_batch > o->prefill_chunk ? o->max_batch : o->prefill_chunk),
        .max_queue = (int)o->max_queue,
        .kv_blocks = (int)((tokens + block - 1) / block),
        .kv_block_size = (int)o->kv_block_size,
        .kv_budget_bytes = (uint64_t)(o->kv_budget_gb * 1e9),
        .budget_ctx = budget_ctx,
        .prompt_cache_bytes = cache_bytes,
        .cache_retention = o->cache_retention,
        .session_idle_s = (int)o->session_idle_s,
        .checkpoint_every = (int)o->generation_checkpoint,
    };
}

/* The sizes behind GET /fit and --memory-budget. The transient buffers are
 * one prefill chunk's activations (model/forward.c) and the step's logits rows. */
static int fit_measure(const struct serve_options *o, const struct model *m,
                       struct server_fit *fit, struct err *err)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    long chunk = o->max_batch > o->prefill_chunk ? o->max_batch : o->prefill_chunk;
    struct kv_format format = kv_format_of_backend(be);
    fit->weights_bytes = model_weight_bytes(m);
    fit->weight_bytes_per_token = (double)model_weight_bytes_per_token(m);
    fit->kv_bytes_per_token = kv_format_bytes_per_token(c, &format);
    fit->transient_bytes = forward_state_bytes(c, (int)chunk) +
                           (uint64_t)o->max_batch * (uint64_t)c->vocab_size * sizeof(float);
    fit->memory_budget_bytes = (uint64_t)(o->memory_budget_gb * 1e9);
    struct threadpool *pool = backend_cpu_threadpool(be); /* NULL on a GPU */
    if (pool) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        fit->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    } else {
        fit->memory_bytes = backend_cuda_free_memory(be);
    }
    uint64_t memory = fit->memory_budget_bytes ? fit->memory_budget_bytes : fit->memory_bytes;
    fit->max_safe_context =
        fit_max_context(memory, fit->weights_bytes, fit->transient_bytes, fit->kv_bytes_per_token);
    if (fit->memory_budget_bytes && fit->max_safe_context < 2)
        return err_set(err, INFERD_ERANGE,
                       "--memory-budget %.3g GB (%llu bytes) does not hold the weights (%llu "
                       "bytes), the buffers of a %ld-token prefill chunk (%llu bytes) and two "
                       "positions of KV (%llu bytes each)",
                       o->memory_budget_gb, (unsigned long long)fit->memory_budget_bytes,
                       (unsigned long long)fit->weights_bytes, chunk,
                       (unsigned long long)fit->transient_bytes,
                       (unsigned long long)fit->kv_bytes_per_token);
    snprintf(fit->backend_name, sizeof fit->backend_name, "%s", be->ops->name);
    cli_backend_describe(be, fit->backend_device, sizeof fit->backend_device);
    fit->bandwidth_gbs = pool ? cpu_measure_read_bandwidth(pool, FIT_PROBE_CPU_BYTES)
                              : backend_cuda_read_bandwidth(be, FIT_PROBE_GPU_BYTES);
    return 0;
}

/* The SSD tier's configuration: the store's place and limits, the fingerprint of the K/V it
 * keeps (the weights' and the tokenizer's content, the backend's numeric identity; the engine
 * adds the architecture, KV format, block size and mode), and the prefill rate its cost model
 * weighs a restore against, timed here on a short prompt of n_ctx at most. */
static int tier_configure(const struct serve_options *o, const struct model *m, struct backend *be,
                          int n_ctx, struct kv_tier_config *out, struct err *err)
{
    *out = (struct kv_tier_config){
        .store = {.dir = o->ssd_dir,
                  .max_bytes = (uint64_t)(o->ssd_max_gib * (double)(1ull << 30)),
                  .verify_on_read = o->ssd_verify,
                  .direct_io = o->ssd_direct_io},
        .demote_idle_ns = (uint64_t)o->ssd_demote_idle_s * 1000000000ull,
        .restore = o->ssd_restore,
        .cold = o->ssd_cold_on ? &o->ssd_cold : NULL,
    };
    struct ssd_fingerprint *fp = &out->store.fp;
    uint64_t t0 = now_ns();
    fp->model_digest = cli_tier_weights_digest(m);
    uint64_t bytes = 0;
    for (int i = 0; i < m->files.n_files; i++)
        bytes += m->files.map_lens[i];
    log_info("serve: the weights' digest (XXH3-64 of %.2f GB of safetensors) took %.2f s",
             (double)bytes / 1e9, (double)(now_ns() - t0) * 1e-9);
    int rc = cli_tier_tokenizer_digest(o->dir, &fp->tokenizer_digest, err);
    if (rc < 0)
        return rc;
    cli_tier_backend_identity(be, fp->backend_identity, sizeof fp->backend_identity);

    int n = backend_cpu_threadpool(be) ? TIER_PROBE_TOKENS_CPU : TIER_PROBE_TOKENS_GPU;
    if (n > n_ctx - 1)
        n = n_ctx - 1 > 0 ? n_ctx - 1 : 1;
    long chunk = o->max_batch > o->prefill_chunk ? o->max_batch : o->prefill_chunk;
    rc = cli_tier_measure_prefill(m, n, (int)chunk, &out->prefill_tokens_per_s, err);
    if (rc < 0)
        return err_wrap(err, "the SSD tier's prefill probe (%d tokens)", n);
    return 0;
}

/* The Whisper model's idle unloader: wakes every second until told to stop. */
struct whisper_idle {
    struct transcriber *t; /* borrowed */
    double idle_s;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop;
};

static void *whisper_idle_run(void *arg)
{
    struct whisper_idle *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&w->wake, &w->lock, &ts);
        if (!w->stop && transcriber_unload_idle(w->t, w->idle_s))
            log_info("serve: Whisper model unloaded after %.0f s idle", w->idle_s);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* The Whisper model of --whisper-model on a backend of its own on the chat model's device (its
 * ops run on the HTTP thread that asks, beside the engine thread's backend: on a GPU, a stream
 * of its own), in f32, loaded now when resident. On the CPU it runs in the server's --mode (fast:
 * the tiled attention and the GEMMs, ~5x the encoder's speed); on CUDA in exact mode, the kernels
 * its parity with transformers was measured on. */
static int whisper_open(const struct serve_options *o, struct backend **be,
                        struct transcriber **t, struct err *err)
{
    struct backend_options opt = o->backend;
    opt.mode = COMPUTE_EXACT;
    opt.threads = (int)o->threads;
    opt.kv_quant = NULL;       /* Whisper keeps its caches itself */
    opt.cuda_gemm_f32 = BACKEND_ON; /* the encoder's 1,500 rows on cuBLASLt */
    opt.memory_cap_bytes = 0;
    int rc = cli_backend_create(o->device, &opt, be, err);
    if (rc == 0 && !strcmp((*be)->ops->name, "cpu"))
        (*be)->mode = o->mode;
    if (rc == 0)
        rc = transcriber_create(o->whisper_dir, *be, t, err);
    if (rc == 0)
        transcriber_set_default_beam(*t, (int)o->whisper_beam);
    if (rc == 0) /* the host is idle while a GPU encodes; on the CPU the backend waits for it */
        rc = transcriber_set_mel_threads(*t, (int)o->threads, err);
    if (rc == 0 && o->whisper_resident)
        rc = transcriber_load(*t, err);
    return rc;
}

/* One loaded model and everything serve builds around it: the served model's parts, owned. */
struct served_load {
    struct serve_options o;       /* as it was loaded: dir and ssd_dir its own */
    char ssd_dir[PATH_MAX];
    struct backend *be;           /* owned */
    struct cli_tp *tp;            /* owned: the other ranks under --tensor-parallel; NULL */
    struct model *m;              /* owned */
    struct model *draft;          /* owned; NULL without a draft model */
    struct tokenizer *tok;        /* owned */
    struct chat_template tmpl;
    bool have_tmpl;
    struct engine *engine;        /* owned */
    struct reencode *reencode;    /* owned */
    struct grammar_vocab *gvocab; /* owned */
    struct grammar_cache *grammars; /* owned */
    struct spec_config spec;      /* the engine's configuration points here */
    struct kv_tier_config tier;
    struct adapter_registry *adapters; /* owned; NULL: the backend runs none */
    /* --isolate: the engine runs in a child; here only what requests need of the model */
    struct engine_proxy *proxy;   /* owned */
    struct model *host_model;     /* owned (plain free): config, generation defaults and
                                     pooling from the child's HELLO; no weights, no backend */
};

/* Shuts the engine down (its SSD tier flushed: every cached block durable, so the next load
 * finds it) and frees everything. Returns the cached blocks that left memory for the disk. */
static uint64_t served_free(struct served_load *l, int grace_ms)
{
    if (!l)
        return 0;
    uint64_t demoted = 0;
    if (l->proxy) {
        /* The child flushes its SSD tier as it exits: what it cached is on disk after. */
        struct served_model sm = {.proxy = l->proxy};
        struct engine_stats st;
        served_engine_stats(&sm, &st);
        if (engine_proxy_config(l->proxy)->tier)
            demoted = st.prompt_cache.blocks;
        engine_proxy_free(l->proxy);
    }
    if (l->engine) {
        struct engine_stats before;
        engine_get_stats(l->engine, &before);
        engine_shutdown(l->engine, grace_ms);
        if (l->o.ssd_dir) {
            struct engine_stats st;
            engine_get_stats(l->engine, &st); /* as the engine thread left it, after its last flush */
            const struct ssd_stats *ss = &st.ssd_cache.store;
            bool flushed = !ss->disabled && ss->pending + st.ssd_cache.unsaved == 0;
            if (flushed)
                demoted = before.prompt_cache.blocks;
            log_info("serve: SSD tier at exit: %s; %llu blocks (%.1f MiB) on disk, %llu written "
                     "(%.1f MiB) since start, %llu not durable, %llu dropped, %llu failed (%s)",
                     ss->disabled ? "off" : !flushed ? "flush incomplete" : "flushed",
                     (unsigned long long)ss->blocks, (double)ss->bytes / (1 << 20),
                     (unsigned long long)ss->writes, (double)ss->write_bytes / (1 << 20),
                     (unsigned long long)(ss->pending + st.ssd_cache.unsaved),
                     (unsigned long long)ss->dropped, (unsigned long long)ss->failed, l->o.dir);
        }
    }
    engine_free(l->engine);
    adapter_registry_free(l->adapters); /* after the engine: its sequences held references */
    grammar_cache_free(l->grammars); /* after the engine: its sequences held references */
    grammar_vocab_free(l->gvocab);
    reencode_free(l->reencode);
    if (l->have_tmpl)
        chat_template_free(&l->tmpl);
    tok_free(l->tok);
    model_free(l->draft);
    model_free(l->m);
    free(l->host_model);
    cli_tp_free(l->tp);
    backend_destroy(l->be);
    free(l);
    return demoted;
}

/* The hello an engine child sends: what the supervisor's handlers need of the loaded model. */
static void hello_fill(const struct served_load *l, const struct served_model *sm,
                       struct engine_wire_hello *h)
{
    memset(h, 0, sizeof *h);
    h->pid = (int32_t)getpid();
    h->cfg = *engine_config(l->engine);
    h->has_tier = h->cfg.tier != NULL;
    h->spec_kind = (int32_t)l->spec.kind;
    h->fit = sm->fit;
    h->defaults = sm->defaults;
    h->n_eos = sm->n_eos;
    memcpy(h->eos_ids, sm->eos_ids, sizeof h->eos_ids);
    h->config = l->m->config;
    h->generation = l->m->generation;
    h->embedding = l->m->embedding;
    h->has_adapters = sm->adapters != NULL;
}

/* --isolate: starts model dir's engine child (which loads it as served_load would, its SSD
 * tier in ssd_dir) and builds here what requests need besides the engine: the tokenizer, the
 * chat template, the re-encoding map, and a model holding only the config the child reported.
 * Structured output stays off (sm->grammars NULL): a compiled grammar cannot cross. */
static int served_load_isolated(const struct serve_options *base, struct engine_supervisor *sup,
                                const char *id, const char *dir, const char *ssd_dir,
                                struct served_model *sm, struct served_load **out,
                                struct err *err)
{
    *out = NULL;
    struct served_load *l = calloc(1, sizeof *l);
    if (!l)
        return err_set(err, INFERD_ENOMEM, "out of memory loading %s", dir);
    l->o = *base;
    l->o.dir = dir;
    const char *args[8 + 512];
    int n = 0;
    args[n++] = ENGINE_CHILD_COMMAND;
    args[n++] = dir;
    args[n++] = ssd_dir ? ssd_dir : "";
    args[n++] = base->entry_options ? base->entry_options : "";
    for (int i = 0; i < base->argc && n < (int)(sizeof args / sizeof args[0]); i++)
        args[n++] = base->argv[i];
    struct engine_wire_hello hello;
    int rc = engine_proxy_start(sup, id, args, n, &hello, &l->proxy, err);
    if (rc < 0)
        goto fail;
    if ((rc = model_tokenizer_load(dir, &l->tok, err)) < 0) {
        err_wrap(err, "%s: the server needs the model's tokenizer", dir);
        goto fail;
    }
    struct err terr = {0};
    if (chat_template_load(l->tok, &l->tmpl, &terr) == 0)
        l->have_tmpl = true;
    else
        log_warn("serve: no chat template (%s); /v1/chat/completions will answer 400", terr.msg);
    if ((rc = reencode_create(l->tok, REENCODE_MAX_BYTES, &l->reencode, err)) < 0 ||
        /* grammars compiled here answer a bad one with its 400; the child compiles its own */
        (rc = grammar_vocab_create(l->tok, &l->gvocab, err)) < 0 ||
        (rc = grammar_cache_create(l->gvocab, (int)base->grammar_cache, &l->grammars, err)) < 0)
        goto fail;
    if (!(l->host_model = calloc(1, sizeof *l->host_model))) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory loading %s", dir);
        goto fail;
    }
    l->host_model->config = hello.config;
    l->host_model->generation = hello.generation;
    l->host_model->embedding = hello.embedding;
    sm->fit = hello.fit;
    sm->defaults = hello.defaults;
    sm->n_eos = hello.n_eos;
    memcpy(sm->eos_ids, hello.eos_ids, sizeof sm->eos_ids);
    sm->model = l->host_model;
    sm->tok = l->tok;
    sm->tmpl = l->have_tmpl ? &l->tmpl : NULL;
    sm->engine = NULL;
    sm->proxy = l->proxy;
    sm->reencode = l->reencode;
    sm->grammars = l->grammars;
    *out = l;
    return 0;
fail:
    served_free(l, 0);
    return rc;
}

/* Loads the model at dir with the options base says (its SSD tier in ssd_dir, NULL: none) and
 * builds its engine; fills sm (all but its id). */
static int served_load(const struct serve_options *base, const char *dir, const char *ssd_dir,
                       struct served_model *sm, struct served_load **out, struct err *err)
{
    *out = NULL;
    struct served_load *l = calloc(1, sizeof *l);
    if (!l)
        return err_set(err, INFERD_ENOMEM, "out of memory loading %s", dir);
    l->o = *base;
    l->o.dir = dir;
    l->o.ssd_dir = NULL;
    if (ssd_dir) {
        snprintf(l->ssd_dir, sizeof l->ssd_dir, "%s", ssd_dir);
        l->o.ssd_dir = l->ssd_dir;
    }
    struct serve_options *o = &l->o;
    o->backend.mode = o->mode;
    o->backend.threads = (int)o->threads;
    o->backend.memory_cap_bytes = (size_t)(o->memory_budget_gb * 1e9);
    int rc;
    if ((rc = cli_kv_quant_resolve(&o->kvq, o->dir, &o->backend, err)) < 0 ||
        (rc = cli_model_open(o->device, &o->backend, &o->tp, o->dir,
                             &(struct model_load_options){.quantize = o->quantize}, &l->be,
                             &l->m, &l->tp, err)) < 0 ||
        (rc = cli_adapter_merge(&o->adapters, l->m, err)) < 0)
        goto fail;
    if ((rc = model_tokenizer_load(o->dir, &l->tok, err)) < 0) {
        err_wrap(err, "%s: the server needs the model's tokenizer", o->dir);
        goto fail;
    }
    if (tok_vocab_size(l->tok) > l->m->config.vocab_size)
        log_warn("serve: the tokenizer has %d tokens but the model only %d; prompts using the "
                 "others are refused",
                 tok_vocab_size(l->tok), l->m->config.vocab_size);
    struct err terr = {0};
    if (chat_template_load(l->tok, &l->tmpl, &terr) == 0)
        l->have_tmpl = true;
    else
        log_warn("serve: no chat template (%s); /v1/chat/completions will answer 400", terr.msg);
    const char *why = NULL;
    enum toolcall_syntax calls = toolcall_syntax_for_template(tok_chat_template(l->tok), &why);
    log_info("serve: tool calls parsed as %s (%s)", toolcall_syntax_name(calls), why);

    if ((rc = fit_measure(o, l->m, &sm->fit, err)) < 0 ||
        (rc = reencode_create(l->tok, REENCODE_MAX_BYTES, &l->reencode, err)) < 0 ||
        /* Structured output: every token's bytes once, and the cache of compiled grammars. */
        (rc = grammar_vocab_create(l->tok, &l->gvocab, err)) < 0 ||
        (rc = grammar_cache_create(l->gvocab, (int)o->grammar_cache, &l->grammars, err)) < 0)
        goto fail;

    struct engine_config ec;
    engine_sizes(o, l->m, &sm->fit, &ec);
    if ((rc = cli_spec_load(&o->spec, l->m, l->tok, &l->draft, &l->spec, err)) < 0)
        goto fail;
    ec.spec = &l->spec;
    ec.turns = o->turns;
    if (l->spec.kind != SPEC_NONE)
        log_info("serve: speculative decoding: %s, up to %d drafts a step",
                 l->spec.kind == SPEC_NGRAM ? "prompt lookup (ngram)" : o->spec.draft_dir,
                 l->spec.num_draft_tokens);
    if (o->ssd_dir) {
        if ((rc = tier_configure(o, l->m, l->be, ec.n_ctx, &l->tier, err)) < 0) {
            err_wrap(err, "--ssd-cache %s", o->ssd_dir);
            goto fail;
        }
        ec.tier = &l->tier;
    }
    if ((rc = engine_create(l->m, l->tok, &ec, &l->engine, err)) < 0 ||
        (rc = cli_adapters_mount(&o->adapters, l->m, l->engine, &l->adapters, err)) < 0)
        goto fail;
    if (o->ssd_dir) {
        struct engine_stats st;
        engine_get_stats(l->engine, &st);
        const struct kv_tier_stats *ts = &st.ssd_cache;
        log_info("serve: SSD tier in %s (%s): %llu blocks, %.1f MiB on disk; reads at %.0f MB/s, "
                 "prefill at %.0f tok/s: a cold prefix is read back when that is faster",
                 ts->store.dir ? ts->store.dir : o->ssd_dir, l->tier.store.fp.backend_identity,
                 (unsigned long long)ts->store.blocks, (double)ts->store.bytes / (1 << 20),
                 ts->read_bytes_per_s / 1e6, l->tier.prefill_tokens_per_s);
    }

    const struct generation_defaults *g = &l->m->generation;
    sm->defaults = (struct server_defaults){
        .temperature = o->has_temperature ? (float)o->temperature : g->temperature,
        .top_p = o->has_top_p ? (float)o->top_p : g->top_p,
        .top_k = o->has_top_k ? (int)o->top_k : g->top_k,
        .min_p = o->has_min_p ? (float)o->min_p : 0,
        .repetition_penalty = g->repetition_penalty,
        .max_tokens = (int)o->max_tokens,
        .temperature_set = o->has_temperature,
    };
    sm->n_eos = 0;
    for (int i = 0; i < g->n_eos; i++)
        add_eos(sm, g->eos_token_ids[i]);
    if (tok_eos_token(l->tok))
        add_eos(sm, tok_piece_to_id(l->tok, tok_eos_token(l->tok)));
    sm->model = l->m;
    sm->tok = l->tok;
    sm->tmpl = l->have_tmpl ? &l->tmpl : NULL;
    sm->engine = l->engine;
    sm->reencode = l->reencode;
    sm->grammars = l->grammars;
    sm->adapters = l->adapters;
    *out = l;
    return 0;
fail:
    served_free(l, 0);
    return rc;
}

/* The bytes a loaded model holds: its weights and its KV pool. */
static uint64_t served_bytes(const struct served_load *l, const struct served_model *sm)
{
    (void)l;
    const struct engine_config *c = served_engine_config(sm);
    int block = c->kv_block_size > 0 ? c->kv_block_size : KV_BLOCK_SIZE_DEFAULT;
    return sm->fit.weights_bytes + (uint64_t)c->kv_blocks * (uint64_t)block *
                                       sm->fit.kv_bytes_per_token;
}

/* ---- the model pool: its entries' options, the pool file, the loader ---- */

/* What the pool's loader knows: the serve options every entry starts from. */
struct pool_loader {
    const struct serve_options *base;   /* borrowed */
    struct transcriber *whisper;        /* borrowed; NULL without --whisper-model */
    uint64_t whisper_bytes;             /* its weight files: what it holds while loaded */
    int grace_ms;
    struct engine_supervisor *isolation; /* borrowed; --isolate: engines in children */
};

/* The sizes of a directory's weight files (or a GGUF file's): what its first load is guessed
 * to hold before it is measured. */
static uint64_t path_weight_bytes(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    if (!S_ISDIR(st.st_mode))
        return (uint64_t)st.st_size;
    uint64_t sum = 0;
    DIR *d = opendir(path);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        static const char *const ext[] = {".safetensors", ".gguf", ".bin"};
        for (size_t k = 0; k < sizeof ext / sizeof ext[0]; k++) {
            size_t m = strlen(ext[k]);
            char file[PATH_MAX];
            if (n > m && !strcmp(e->d_name + n - m, ext[k]) &&
                snprintf(file, sizeof file, "%s/%s", path, e->d_name) < (int)sizeof file &&
                stat(file, &st) == 0)
                sum += (uint64_t)st.st_size;
        }
    }
    closedir(d);
    return sum;
}

static uint64_t pool_estimate(void *ctx, const char *id, const char *path, const void *options)
{
    (void)ctx, (void)id, (void)options;
    return path_weight_bytes(path);
}

static int pool_load(void *ctx, const char *id, const char *path, const void *options,
                     struct served_model *sm, void **handle, uint64_t *bytes, struct err *err)
{
    const struct serve_options *o = options;
    char ssd[PATH_MAX];
    if (o->ssd_dir &&
        snprintf(ssd, sizeof ssd, "%s/%s", o->ssd_dir, id) >= (int)sizeof ssd)
        return err_set(err, INFERD_ERANGE, "--ssd-cache %s/%s is too long a path", o->ssd_dir, id);
    const struct pool_loader *pl = ctx;
    struct served_load *l = NULL;
    int rc = pl->isolation
                 ? served_load_isolated(o, pl->isolation, id, path, o->ssd_dir ? ssd : NULL, sm,
                                        &l, err)
                 : served_load(o, path, o->ssd_dir ? ssd : NULL, sm, &l, err);
    if (rc < 0)
        return rc;
    *handle = l;
    *bytes = served_bytes(l, sm);
    return 0;
}

static uint64_t pool_unload(void *ctx, const char *id, struct served_model *sm, void *handle)
{
    const struct pool_loader *pl = ctx;
    (void)id, (void)sm;
    return served_free(handle, pl->grace_ms);
}

static void pool_free_options(void *ctx, void *options)
{
    (void)ctx;
    free(options);
}

static uint64_t pool_extra_bytes(void *ctx)
{
    const struct pool_loader *pl = ctx;
    if (!pl->whisper)
        return 0;
    struct transcriber_stats ts;
    transcriber_stats(pl->whisper, &ts);
    return ts.loaded ? pl->whisper_bytes : 0;
}

/* A model's id: its directory's or file's name, without .gguf. */
static void pool_default_id(const char *path, char *id, size_t cap)
{
    base_name(path, id, cap);
    size_t n = strlen(id);
    if (n > 5 && !strcmp(id + n - 5, ".gguf"))
        id[n - 5] = '\0';
}

/* One entry's options: the server's, with what the pool file's "options" object sets. */
static int pool_entry_options(const struct serve_options *base, json_object *opts, int index,
                              struct serve_options **out, struct err *err)
{
    struct serve_options *o = malloc(sizeof *o);
    if (!o)
        return err_set(err, INFERD_ENOMEM, "out of memory for the pool");
    *o = *base;
    if (opts) {
        if (!json_object_is_type(opts, json_type_object)) {
            free(o);
            return err_set(err, INFERD_EFORMAT, "[%d].options: expected an object", index);
        }
        json_object_object_foreach(opts, key, val) {
            const char *v = json_object_get_string(val);
            char flag[64];
            snprintf(flag, sizeof flag, "[%d].options.%s", index, key);
            bool ok = true;
            if (!strcmp(key, "context") || !strcmp(key, "ctx"))
                ok = arg_int(flag, v, 2, 1 << 24, &o->ctx);
            else if (!strcmp(key, "max_tokens"))
                ok = arg_int(flag, v, 1, INT_MAX, &o->max_tokens);
            else if (!strcmp(key, "batch") || !strcmp(key, "max_batch"))
                ok = arg_int(flag, v, 1, 1024, &o->max_batch);
            else if (!strcmp(key, "kv_mb"))
                ok = arg_int(flag, v, 1, 1 << 30, &o->kv_mb);
            else if (!strcmp(key, "prompt_cache"))
                ok = arg_float(flag, v, 0, 1 << 20, &o->prompt_cache_gib);
            else if (!strcmp(key, "temperature"))
                ok = o->has_temperature = arg_float(flag, v, 0, 2, &o->temperature);
            else if (!strcmp(key, "mode"))
                ok = arg_mode(v, &o->mode);
            else if (!strcmp(key, "device")) {
                struct device_spec spec;
                ok = cli_device_parse(v, &spec);
                o->device = v; /* the pool file's JSON lives as long as the pool */
            } else if (!strcmp(key, "kv_quant")) {
                ok = cli_kv_quant_flag("--kv-quant", v, &o->kvq) > 0;
            } else if (!strcmp(key, "quantize")) {
                ok = cli_quantize_flag("--quantize", v, &o->quantize) > 0;
            } else {
                free(o);
                return err_set(err, INFERD_EINVAL,
                               "%s: unknown option (context, max_tokens, batch, kv_mb, "
                               "prompt_cache, temperature, mode, device, kv_quant, quantize)",
                               flag);
            }
            if (!ok) {
                free(o);
                return err_set(err, INFERD_EINVAL, "%s: bad value '%s'", flag, v ? v : "");
            }
        }
        if (o->ssd_dir && !(o->prompt_cache_gib > 0)) {
            free(o);
            return err_set(err, INFERD_EINVAL, "[%d].options.prompt_cache: --ssd-cache needs "
                           "the prompt cache", index);
        }
        o->entry_options = json_object_to_json_string_ext(opts, JSON_C_TO_STRING_PLAIN);
    }
    *out = o;
    return 0;
}

/* A pool file: a JSON array of {"id"?, "path", "options"?}, paths relative to the file. */
static int pool_add_file(struct model_pool *pool, const struct serve_options *base,
                         const char *file, json_object **keep, struct err *err)
{
    json_object *root = json_object_from_file(file);
    if (!root)
        return err_set(err, INFERD_EFORMAT, "%s: not a JSON file (%s)", file,
                       json_util_get_last_err());
    *keep = root;
    if (!json_object_is_type(root, json_type_array))
        return err_set(err, INFERD_EFORMAT, "%s: expected an array of {id, path, options}", file);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    size_t n = json_object_array_length(root);
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(root, i), *v = NULL;
        if (!json_object_is_type(e, json_type_object))
            return err_set(err, INFERD_EFORMAT, "%s: [%zu]: expected an object", file, i);
        json_object_object_foreach(e, key, val) {
            (void)val;
            if (strcmp(key, "id") && strcmp(key, "path") && strcmp(key, "options"))
                return err_set(err, INFERD_EINVAL, "%s: [%zu].%s: unknown field (id, path, "
                               "options)", file, i, key);
        }
        if (!json_object_object_get_ex(e, "path", &v) || !json_object_is_type(v, json_type_string))
            return err_set(err, INFERD_EFORMAT, "%s: [%zu].path: expected a string", file, i);
        char path[PATH_MAX];
        const char *p = json_object_get_string(v);
        snprintf(path, sizeof path, "%s%s", p[0] == '/' ? "" : dir, p);
        char id[256];
        if (json_object_object_get_ex(e, "id", &v)) {
            if (!json_object_is_type(v, json_type_string))
                return err_set(err, INFERD_EFORMAT, "%s: [%zu].id: expected a string", file, i);
            snprintf(id, sizeof id, "%s", json_object_get_string(v));
        } else {
            pool_default_id(path, id, sizeof id);
        }
        struct serve_options *o = NULL;
        json_object *opts = NULL;
        json_object_object_get_ex(e, "options", &opts);
        int rc = pool_entry_options(base, opts, (int)i, &o, err);
        if (rc == 0)
            rc = model_pool_add(pool, id, path, o, err);
        if (rc < 0)
            return err_wrap(err, "%s", file);
    }
    return 0;
}

/* The pool: the positional model first (the default), then every --model-pool path in order
 * (directories and GGUF files; a .json path is a pool file). */
static int pool_build(const struct serve_options *o, struct pool_loader *pl,
                      json_object **files, struct model_pool **out, struct err *err)
{
    struct model_pool_config cfg = {
        .memory_limit_bytes = (uint64_t)(o->pool_memory_gb * 1e9),
        .max_waiting = (int)o->max_queue,
        .loader = {.estimate = pool_estimate, .load = pool_load, .unload = pool_unload,
                   .free_options = pool_free_options, .extra_bytes = pool_extra_bytes,
                   .ctx = pl},
    };
    int rc = model_pool_create(&cfg, out, err);
    if (rc < 0)
        return rc;
    struct model_pool *pool = *out;
    if (o->dir) {
        char id[256];
        pool_default_id(o->dir, id, sizeof id);
        struct serve_options *copy = NULL;
        if ((rc = pool_entry_options(o, NULL, 0, &copy, err)) < 0 ||
            (rc = model_pool_add(pool, id, o->dir, copy, err)) < 0)
            return rc;
    }
    for (int i = 0; i < o->n_pool_paths; i++) {
        const char *p = o->pool_paths[i];
        size_t n = strlen(p);
        if (n > 5 && !strcmp(p + n - 5, ".json")) {
            if ((rc = pool_add_file(pool, o, p, &files[i], err)) < 0)
                return rc;
            continue;
        }
        char id[256];
        pool_default_id(p, id, sizeof id);
        struct serve_options *copy = NULL;
        if ((rc = pool_entry_options(o, NULL, 0, &copy, err)) < 0 ||
            (rc = model_pool_add(pool, id, p, copy, err)) < 0)
            return rc;
    }
    if (model_pool_count(pool) == 0)
        return err_set(err, INFERD_EINVAL, "the pool has no models");
    return 0;
}

static uint64_t shutdown_engine(void *ctx, struct served_model *sm)
{
    if (sm->proxy)
        engine_proxy_shutdown(sm->proxy, *(const int *)ctx);
    else
        engine_shutdown(sm->engine, *(const int *)ctx);
    return 0;
}

/* --isolate's runtime directory: $XDG_RUNTIME_DIR, else /tmp/inferd-UID (made 0700). */
static int runtime_dir(char *out, size_t cap, struct err *err)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (xdg && xdg[0] && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && strlen(xdg) < 60) {
        snprintf(out, cap, "%s", xdg);
        return 0;
    }
    snprintf(out, cap, "/tmp/inferd-%u", (unsigned)getuid());
    if (mkdir(out, 0700) < 0 && errno != EEXIST)
        return err_set(err, INFERD_EIO, "cannot make %s: %s", out, strerror(errno));
    if (stat(out, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid())
        return err_set(err, INFERD_EIO, "%s is not a directory of this user's", out);
    return 0;
}

/* --isolate: the supervisor (children exec this very binary) and the admin socket's path. */
static int isolate_setup(const struct serve_options *o, struct engine_supervisor **out,
                         char *admin_path, size_t cap, struct err *err)
{
    char exe[PATH_MAX], dir[128];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return err_set(err, INFERD_EIO, "cannot find this binary (/proc/self/exe): %s",
                       strerror(errno));
    exe[n] = '\0';
    int rc = runtime_dir(dir, sizeof dir, err);
    if (rc < 0)
        return rc;
    int len = o->admin_socket ? snprintf(admin_path, cap, "%s", o->admin_socket)
                              : snprintf(admin_path, cap, "%.80s/inferd-%d.sock", dir,
                                         (int)getpid());
    if (len < 0 || (size_t)len >= cap)
        return err_set(err, INFERD_ERANGE, "the admin socket's path is longer than %zu bytes",
                       cap - 1);
    struct engine_supervisor_config cfg = {
        .exe = exe,
        .runtime_dir = dir,
        .watchdog_s = (int)o->watchdog_s,
        .start_timeout_s = 600,
        .max_restarts = ISOLATE_MAX_RESTARTS,
        .restart_window_s = ISOLATE_RESTART_WINDOW_S,
    };
    return engine_supervisor_create(&cfg, out, err);
}

#ifdef INFERD_TEST_FAULTS
/* Test builds only (INFERD_TEST_FAULTS, never a release build): a request whose prompt holds
 * INFERD_TEST_FAULT=crash or INFERD_TEST_FAULT=hang makes its engine child abort, or stop
 * sending anything, once it has generated a token, so the suites can watch the supervisor
 * restart it. */
static enum engine_child_fault test_fault(void *ctx, const struct gen_params *p, int n_generated)
{
    const struct tokenizer *tok = ctx;
    if (n_generated < 1 || p->embed)
        return ENGINE_FAULT_NONE;
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    if (tok_decode(tok, p->prompt, p->n_prompt, false, &text, &len, &err) < 0)
        return ENGINE_FAULT_NONE;
    enum engine_child_fault f = strstr(text, "INFERD_TEST_FAULT=crash") ? ENGINE_FAULT_CRASH
                                : strstr(text, "INFERD_TEST_FAULT=hang") ? ENGINE_FAULT_HANG
                                                                         : ENGINE_FAULT_NONE;
    free(text);
    return f;
}
#endif

/* The hidden subcommand serve --isolate execs for each model:
 *     inferd __engine DIR SSD_DIR ENTRY_OPTIONS serve SERVE_ARGS... SOCKET
 * (SSD_DIR and ENTRY_OPTIONS may be ""): connects to the supervisor's SOCKET, loads DIR with
 * the serve flags (and a pool entry's options), and serves its engine there until the
 * supervisor closes the connection. */
int cmd_serve_engine(int argc, char **argv)
{
    if (argc < 6 || strcmp(argv[4], "serve")) {
        fprintf(stderr, "inferd %s: serve --isolate's engine child; not for direct use\n",
                ENGINE_CHILD_COMMAND);
        return 2;
    }
    const char *dir = argv[1], *ssd = argv[2][0] ? argv[2] : NULL, *entry = argv[3];
    const char *path = argv[argc - 1];
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || strlen(path) >= sizeof sa.sun_path) {
        fprintf(stderr, "inferd %s: bad socket %s\n", ENGINE_CHILD_COMMAND, path);
        return 1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        fprintf(stderr, "inferd %s: connect %s: %s\n", ENGINE_CHILD_COMMAND, path,
                strerror(errno));
        return 1;
    }
    struct serve_options base;
    if (!parse_serve_options(argc - 5, argv + 4, &base)) {
        api_keys_free(&base.keys);
        return 2;
    }
    struct err err = {0};
    struct serve_options *eo = NULL;
    json_object *ej = NULL;
    if (entry[0] && (!(ej = json_tokener_parse(entry)) ||
                     pool_entry_options(&base, ej, 0, &eo, &err) < 0)) {
        fprintf(stderr, "inferd serve: engine child for %s: options %s: %s\n", dir, entry,
                err.msg);
        json_object_put(ej);
        api_keys_free(&base.keys);
        return 1;
    }
    const struct serve_options *o = eo ? eo : &base;
    struct served_model sm;
    memset(&sm, 0, sizeof sm);
    struct served_load *l = NULL;
    int status = 1;
    if (served_load(o, dir, ssd, &sm, &l, &err) < 0) {
        fprintf(stderr, "inferd serve: engine child for %s: %s\n", dir, err.msg);
    } else {
        struct engine_wire_hello hello;
        hello_fill(l, &sm, &hello);
        struct engine_child_hooks hooks = {0};
#ifdef INFERD_TEST_FAULTS
        hooks.fault = test_fault;
        hooks.ctx = (void *)l->tok;
#endif
        if (engine_child_serve(fd, &sm, &hello, (int)o->shutdown_timeout_s * 1000, &hooks,
                               &err) == 0)
            status = 0;
        else
            fprintf(stderr, "inferd serve: engine child for %s: %s\n", dir, err.msg);
    }
    served_free(l, 0);
    close(fd);
    free(eo);
    json_object_put(ej);
    api_keys_free(&base.keys);
    return status;
}

int cmd_serve(int argc, char **argv)
{
    struct serve_options o;
    if (!parse_serve_options(argc, argv, &o)) {
        api_keys_free(&o.keys);
        return 2;
    }

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
    srv.cfg = (struct server_config){
        .host = o.host,
        .port = (int)o.port,
        .api_keys = &o.keys,
        .max_body_bytes = (size_t)o.max_body_mb << 20,
        .request_timeout_s = (int)o.request_timeout_s,
        .idle_timeout_s = 60,
        .shutdown_grace_ms = (int)o.shutdown_timeout_s * 1000,
        .max_connections = 512,
        .stream_interval_ms = (int)o.stream_interval_ms,
    };
    srv.created = time(NULL);
    srv.started_ns = now_ns();
    atomic_init(&srv.ready, false);
    atomic_init(&srv.stopping, false);

    srv.version = INFERD_VERSION;
    srv.thinking = o.thinking;
    srv.webui = o.no_webui ? NULL : &webui_bundle;

    struct err err = {0};
    struct backend *whisper_be = NULL;
    struct transcriber *whisper = NULL;
    struct whisper_idle idle = {.idle_s = (double)o.whisper_idle_unload_s};
    pthread_t idle_thread;
    bool idle_running = false;
    if (o.whisper_dir) {
        if (whisper_open(&o, &whisper_be, &whisper, &err) < 0) {
            fprintf(stderr, "inferd serve: --whisper-model: %s\n", err.msg);
            transcriber_free(whisper);
            backend_destroy(whisper_be);
            api_keys_free(&o.keys);
            return 1;
        }
        /* transcriptions and chat steps take turns on the device, neither starving the other */
        if (device_turns_create(&o.turns, &err) < 0) {
            fprintf(stderr, "inferd serve: %s\n", err.msg);
            transcriber_free(whisper);
            backend_destroy(whisper_be);
            api_keys_free(&o.keys);
            return 1;
        }
        transcriber_set_turns(whisper, o.turns);
        srv.transcriber = whisper;
        srv.max_audio_bytes = (size_t)o.max_audio_mb << 20;
        srv.audio_threads = (int)o.threads;
        /* the upload and its form around it */
        if (srv.cfg.max_body_bytes < srv.max_audio_bytes + (1u << 20))
            srv.cfg.max_body_bytes = srv.max_audio_bytes + (1u << 20);
        if (!o.whisper_resident && o.whisper_idle_unload_s > 0) {
            idle.t = whisper;
            pthread_mutex_init(&idle.lock, NULL);
            pthread_cond_init(&idle.wake, NULL);
            idle_running = pthread_create(&idle_thread, NULL, whisper_idle_run, &idle) == 0;
        }
    }
    /* Before the routes answer: GET /v1/responses/{id} does not wait for the model. */
    struct response_store *responses = NULL;
    struct response_store_config rsc = {
        .max_bytes = (size_t)o.response_store_mb << 20,
        .ttl_ms = (uint64_t)o.response_store_ttl_s * 1000,
    };
    if (response_store_create(&rsc, &responses, &err) < 0) {
        fprintf(stderr, "inferd serve: %s\n", err.msg);
        api_keys_free(&o.keys);
        return 1;
    }
    srv.responses = responses;
    /* --isolate: the supervisor of the engine children, and the admin socket beside it */
    struct engine_supervisor *sup = NULL;
    char admin_path[108] = "";
    if (o.isolate && isolate_setup(&o, &sup, admin_path, sizeof admin_path, &err) < 0) {
        fprintf(stderr, "inferd serve: --isolate: %s\n", err.msg);
        response_store_free(responses);
        api_keys_free(&o.keys);
        return 1;
    }
    srv.isolation = sup;
    struct http_daemon *http = NULL;
    if (http_start(&srv, api_routes(!o.no_webui), &http, &err) < 0) {
        fprintf(stderr, "inferd serve: %s\n", err.msg);
        engine_supervisor_free(sup);
        response_store_free(responses);
        api_keys_free(&o.keys);
        return 1;
    }

    int status = 1;
    struct admin_socket *admin = NULL;
    uint64_t t0 = now_ns();
    struct served_load *one = NULL; /* without a pool: the model */
    struct model_pool *pool = NULL;
    json_object *pool_files[MODEL_POOL_MAX_PATHS] = {0}; /* the pool files, kept for their strings */
    struct pool_loader pl = {.base = &o,
                             .whisper = whisper,
                             .whisper_bytes = o.whisper_dir ? path_weight_bytes(o.whisper_dir) : 0,
                             .grace_ms = srv.cfg.shutdown_grace_ms,
                             .isolation = sup};
    srv.no_jump_forward = o.no_jump_forward;
    if (o.n_pool_paths == 0) {
        snprintf(srv.served.id, sizeof srv.served.id, "%s", base_name(o.dir, name, sizeof name));
        if ((sup ? served_load_isolated(&o, sup, srv.served.id, o.dir, o.ssd_dir, &srv.served,
                                        &one, &err)
                 : served_load(&o, o.dir, o.ssd_dir, &srv.served, &one, &err)) < 0) {
            fprintf(stderr, "inferd serve: %s\n", err.msg);
            goto out;
        }
    } else {
        /* The default model is loaded now, so the server is ready with it; the others on
         * their first request. */
        if (pool_build(&o, &pl, pool_files, &pool, &err) < 0 ||
            model_pool_load_now(pool, NULL, &err) < 0) {
            fprintf(stderr, "inferd serve: --model-pool: %s\n", err.msg);
            goto out;
        }
        snprintf(srv.served.id, sizeof srv.served.id, "%s", model_pool_default_id(pool));
        struct served_model *d = model_pool_peek(pool, NULL);
        if (d)
            srv.served.fit = d->fit;
        model_pool_release(pool, d);
        srv.pool = pool;
        log_info("serve: a pool of %d models, %s the default; %s", model_pool_count(pool),
                 srv.served.id, o.pool_memory_gb > 0 ? "resident under --pool-memory" : "no memory limit");
    }
    if (sup) {
        if (admin_socket_start(&srv, admin_path, &admin, &err) < 0) {
            fprintf(stderr, "inferd serve: %s\n", err.msg);
            goto out;
        }
        srv.admin_socket = admin_path;
        log_info("serve: --isolate: engines in child processes (watchdog %ld s); admin socket "
                 "%s", o.watchdog_s, admin_path);
    }
    atomic_store(&srv.ready, true);

    int port = http_bound_port(http);
    printf("inferd: serving %s at http://%s:%d\n", srv.served.id, o.host, port);
    printf("try:    curl http://%s:%d/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"
           "          -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
           "\"max_tokens\": 64}'\n",
           o.host, port, o.keys.n ? " -H 'Authorization: Bearer $KEY'" : "");
    fflush(stdout);
    struct served_model *d = served_model_peek(&srv);
    if (d && served_engine_ready(d)) {
        char where[256];
        if (d->proxy)
            snprintf(where, sizeof where, "%s (in an engine child)", d->fit.backend_device);
        else
            cli_backend_describe(d->model->backend, where, sizeof where);
        const struct engine_config *run = served_engine_config(d);
        log_info("serve: ready in %.2f s on %s; context %d%s, up to %d sequences, KV pool %d "
                 "blocks of %d, prompt cache %.3g GiB",
                 (double)(now_ns() - t0) * 1e-9, where, run->n_ctx,
                 run->budget_ctx ? " (the memory budget's)" : "", run->max_seqs, run->kv_blocks,
                 run->kv_block_size, (double)run->prompt_cache_bytes / (double)(1ull << 30));
    }
    served_model_release(&srv, d);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    log_info("serve: signal %d: finishing in-flight requests (up to %ld s)", sig,
             o.shutdown_timeout_s);
    status = 0;

out:
    atomic_store(&srv.stopping, true);
    http_quiesce(http);
    /* In-flight requests finish (within the grace) before the connections close; the models
     * are freed after, as streams still read their tokenizers. */
    admin_socket_stop(admin); /* leases end: paused children carry on to finish */
    if (one)
        shutdown_engine(&srv.cfg.shutdown_grace_ms, &srv.served);
    if (pool)
        model_pool_each_resident(pool, shutdown_engine, &srv.cfg.shutdown_grace_ms);
    http_stop(http);
    served_free(one, 0);
    model_pool_free(pool);
    engine_supervisor_free(sup);
    for (int i = 0; i < MODEL_POOL_MAX_PATHS; i++)
        json_object_put(pool_files[i]);
    response_store_free(responses);
    if (idle_running) {
        pthread_mutex_lock(&idle.lock);
        idle.stop = true;
        pthread_cond_signal(&idle.wake);
        pthread_mutex_unlock(&idle.lock);
        pthread_join(idle_thread, NULL);
    }
    transcriber_free(whisper);
    backend_destroy(whisper_be);
    device_turns_free(o.turns);
    api_keys_free(&o.keys);
    return status;
}
