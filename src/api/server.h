/* api/server.h — what every route handler sees: the served model (or the pool of them), its
 * text pipeline and engine, the server's settings and counters. */
#ifndef INFERD_API_SERVER_H
#define INFERD_API_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "api/keys.h"
#include "api/metrics.h"
#include "engine/engine.h"
#include "model/model.h"
#include "text/chat_template.h"

struct grammar_cache;
#include "text/tokenizer.h"

#define SERVER_MAX_EOS 8

struct engine_proxy;
struct engine_supervisor;
struct reencode;
struct model_pool;
struct response_store;
struct transcriber;
struct webui_assets;

/* --thinking: the enable_thinking a chat template gets when a request says nothing (neither
 * chat_template_kwargs.enable_thinking nor a reasoning effort). */
enum server_thinking {
    SERVER_THINKING_TEMPLATE = 0, /* the template's own default */
    SERVER_THINKING_OFF,
    SERVER_THINKING_ON,
};

/* Sampling defaults below the request: generation_config.json, then CLI flags. */
struct server_defaults {
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
    int max_tokens; /* 0: whatever the context leaves */
    bool temperature_set; /* temperature came from --temperature, not generation_config.json */
};

/* What the model needs and the machine has (GET /fit), worked out at start-up. */
struct server_fit {
    uint64_t weights_bytes;       /* every weight */
    uint64_t kv_bytes_per_token;  /* K and V of one position, every layer */
    uint64_t transient_bytes;     /* activations of one prefill chunk and the logits rows */
    uint64_t memory_budget_bytes; /* --memory-budget; 0: none */
    uint64_t memory_bytes;        /* the backend's memory: RAM on the CPU, free GPU memory */
    int64_t max_safe_context;     /* positions of KV that fit beside weights and transients in
                                     the budget (or memory_bytes without one) */
    double bandwidth_gbs;         /* memory read bandwidth, probed at start-up; 0: unknown */
    double weight_bytes_per_token;/* what one decode step reads */
    char backend_name[16];
    char backend_device[192];
};

struct server_config {
    const char *host;        /* borrowed */
    int port;                /* 0: any free port */
    const char *api_key;     /* borrowed; one accepted key, or NULL */
    const struct api_keys *api_keys; /* borrowed; more accepted keys (api/keys.h), or NULL;
                                        with neither, no authentication */
    size_t max_body_bytes;
    int request_timeout_s;   /* a request's headers and body must arrive within this */
    int idle_timeout_s;      /* keep-alive connections idle longer are closed */
    int shutdown_grace_ms;   /* in-flight requests get this long to finish on SIGTERM */
    int max_connections;
    int stream_interval_ms;  /* a streamed reply takes its new tokens at most this often (one
                                write and one wake-up a window, not a step); 0: every step */
};

/* --stream-interval's default */
#define STREAM_INTERVAL_DEFAULT_MS 10

/* One model as requests see it: the model, its text pipeline, its engine and what goes with
 * them. Without a pool the server has one (server.served); with one, each pool entry fills its
 * own while it is resident (api/model_pool.h), and a request holds a reference to it. */
struct served_model {
    char id[256];
    const struct model *model;        /* borrowed */
    const struct tokenizer *tok;      /* borrowed */
    const struct chat_template *tmpl; /* borrowed; NULL when the tokenizer has none */
    struct engine *engine;            /* borrowed; NULL when proxy runs the engine */
    struct engine_proxy *proxy;       /* borrowed; --isolate: the engine runs in a child process
                                         (api/engine_proxy.h: call it through served_engine_*) */
    struct reencode *reencode;        /* borrowed; replies resent in prompts keep their own ids
                                         (api/reencode.h); NULL: prompts are encoded plainly */
    struct grammar_cache *grammars;   /* borrowed; compiled structured-output grammars
                                         (api/structured.h); NULL: structured output refused */
    struct adapter_registry *adapters; /* borrowed; the LoRA adapters mounted on the model
                                          (engine/adapters.h); NULL: none in this process (an
                                          engine child's: served_adapters_*) */
    struct server_defaults defaults;
    int32_t eos_ids[SERVER_MAX_EOS];
    int n_eos;
    struct server_fit fit;
};

struct server {
    struct server_config cfg;
    struct served_model served;       /* the one model, without a pool */
    struct model_pool *pool;          /* borrowed; several models by request `model`
                                         (api/model_pool.h); NULL: served is all there is */
    struct engine_supervisor *isolation; /* borrowed; --isolate: every engine in a child process
                                         (api/engine_proxy.h); NULL: engines in this process */
    const char *admin_socket;         /* borrowed; --isolate's unix socket for /admin/drain and
                                         /admin/lease (api/admin_socket.h), or NULL */
    struct response_store *responses; /* borrowed; the Responses API's stored responses
                                         (api/response_store.h); NULL: none are kept */
    bool no_jump_forward;             /* --no-jump-forward: forced text is sampled token by
                                         token like any other (the masks' cost, measured alone) */
    const struct webui_assets *webui; /* borrowed; the chat page's files (api/webui.h); NULL:
                                         --no-webui */
    struct transcriber *transcriber;  /* borrowed; the Whisper model (engine/transcribe.h); NULL:
                                         no --whisper-model, the audio routes answer 503 */
    size_t max_audio_bytes;           /* --max-audio-mb: larger uploads are a 413; 0: no limit */
    int audio_threads;                /* threads resampling an upload (--threads; 0: per core) */
    enum server_thinking thinking;
    const char *version;              /* borrowed; the server's version for GET /v1, or NULL */
    time_t created;                   /* server start, for /v1/models */
    uint64_t started_ns;
    atomic_bool ready;                /* false while loading: /health answers 503 */
    atomic_bool stopping;             /* set on SIGTERM/SIGINT: /health and new requests answer 503 */
    struct api_metrics metrics;
    /* Requests refused because they alone exceed the KV or the memory budget
     * (/stats admission.rejected); the enforced context is engine_config's n_ctx. */
    atomic_uint_fast64_t admission_rejected;
};

#endif
