/* api/engine_wire.h — the frame protocol between the supervisor and an engine child (serve
 * --isolate): versioned, length-prefixed frames over a unix socket, and the messages they carry.
 *
 * A frame is a 12-byte header then its payload, every integer little-endian:
 *
 *     u32 magic "IFDW"   u16 version (ENGINE_WIRE_VERSION)   u16 type   u32 payload bytes
 *
 * A payload is a sequence of fields: u8/i32/u32/u64/f32 as such; bytes and strings as a u32
 * length then the bytes (a string's length 0xffffffff: NULL); a blob (a plain struct both
 * sides share, the child being the same binary exec'd) as a u32 size that must equal the
 * reader's sizeof, then the bytes, its pointers zeroed by the writer. Decoders check every
 * length against the payload and refuse what is left over. */
#ifndef INFERD_API_ENGINE_WIRE_H
#define INFERD_API_ENGINE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/server.h"
#include "api/structured.h"
#include "base/err.h"
#include "base/strbuf.h"
#include "engine/adapters.h"
#include "engine/engine.h"

#define ENGINE_WIRE_MAGIC 0x57444649u /* "IFDW" */
#define ENGINE_WIRE_VERSION 4
#define ENGINE_WIRE_HEADER 12
#define ENGINE_WIRE_MAX_PAYLOAD (64u << 20)

enum engine_wire_type {
    ENGINE_WIRE_HELLO = 1, /* child → supervisor: the model is loaded; what requests need of it */
    ENGINE_WIRE_SUBMIT,    /* supervisor → child: a request (engine_submit's gen_params) */
    ENGINE_WIRE_SUBMITTED, /* child → supervisor: engine_submit's answer to one */
    ENGINE_WIRE_EVENT,     /* child → supervisor: a request's news (gen_output_drain's) */
    ENGINE_WIRE_CANCEL,    /* supervisor → child: a request's reader went away */
    ENGINE_WIRE_CALL,      /* supervisor → child: stats, a flush, a session's close */
    ENGINE_WIRE_REPLY,     /* child → supervisor: a call's answer */
    ENGINE_WIRE_PROGRESS,  /* child → supervisor: the engine's step count, every half second */
    ENGINE_WIRE_TYPE_END,
};

struct engine_wire_frame {
    uint16_t version, type;
    const uint8_t *payload; /* borrowed from the parsed buffer; len bytes */
    uint32_t len;
};

/* Parses the frame at the start of buf (n bytes): 1 with *f and *used (header + payload)
 * filled, 0 when buf holds less than a whole frame (nothing filled), -INFERD_EFORMAT for a bad
 * magic, another version, an unknown type or a payload longer than ENGINE_WIRE_MAX_PAYLOAD. */
int engine_wire_parse(const uint8_t *buf, size_t n, struct engine_wire_frame *f, size_t *used,
                      struct err *err);

/* Each put appends one whole frame to out; false when out ran out of memory. Each get decodes
 * a frame of its type: 0, or -INFERD_EFORMAT (another type, a short or overlong payload, a blob
 * of another size, a count out of range). What a get allocates its *_free releases (also after
 * a failed get). */

/* HELLO: the loaded model as the supervisor's handlers see it. */
struct engine_wire_hello {
    int32_t pid;
    struct engine_config cfg;        /* tier and spec NULL: has_tier and spec_kind say */
    bool has_tier;
    int32_t spec_kind;               /* enum spec_kind */
    struct server_fit fit;
    struct server_defaults defaults;
    int32_t eos_ids[SERVER_MAX_EOS];
    int32_t n_eos;
    struct model_config config;
    struct generation_defaults generation;
    struct model_embedding embedding;
    bool has_adapters;               /* the child keeps an adapter registry (its backend runs
                                        them): /v1/adapters goes to it */
};
bool engine_wire_put_hello(struct strbuf *out, const struct engine_wire_hello *h);
int engine_wire_get_hello(const struct engine_wire_frame *f, struct engine_wire_hello *h,
                          struct err *err);

/* SUBMIT: request id, then gen_params (a grammar cannot travel: put refuses it; nor can
 * adapters: their spec travels instead). Decoded, p's arrays and strings point into the
 * struct's own allocations. */
struct engine_wire_submit {
    uint64_t id;
    struct gen_params p;
    int32_t *prompt;                  /* owned */
    int32_t *eos;                     /* owned */
    char **stop;                      /* owned; p.n_stop strings, each owned */
    char *session;                    /* owned, or NULL */
    struct sampler_logit_bias *bias;  /* owned */
    /* The request's structured output (kind NONE: none): the child compiles it with its own
     * grammar cache and sets p.grammar; text owned. */
    struct structured_spec grammar;
    /* The request's adapter spec ("id", "a+b", "none"; NULL: none), resolved by the child
     * against its own registry; owned. p.adapters stays empty. */
    char *adapter;
};
/* grammar: the constraint p->grammar was compiled from (NULL exactly when p->grammar is):
 * compiled grammars stay in their process, their sources cross. adapter: the request's
 * adapter spec (NULL: none); p->n_adapters must be 0, as references stay in their process. */
bool engine_wire_put_submit(struct strbuf *out, uint64_t id, const struct gen_params *p,
                            const struct structured_spec *grammar, const char *adapter);
int engine_wire_get_submit(const struct engine_wire_frame *f, struct engine_wire_submit *s,
                           struct err *err);
void engine_wire_submit_free(struct engine_wire_submit *s);

/* SUBMITTED: engine_submit's return code (0 or a negative -INFERD_E*) and message;
 * -INFERD_ENOENT when the adapter spec names no adapter the child has mounted. */
struct engine_wire_submitted {
    uint64_t id;
    int32_t rc;
    char msg[512];
};
bool engine_wire_put_submitted(struct strbuf *out, uint64_t id, int rc, const char *msg);
int engine_wire_get_submitted(const struct engine_wire_frame *f, struct engine_wire_submitted *s,
                              struct err *err);

/* EVENT: one drain's news for request id (text, token records, ids, counts, the finish) and,
 * with the finish of an embedding request, its vector. */
struct engine_wire_event {
    uint64_t id;
    struct gen_news news; /* its arrays owned (gen_news_free) */
    float *embedding;     /* owned; n_embedding floats, or NULL */
    int32_t n_embedding;
};
bool engine_wire_put_event(struct strbuf *out, uint64_t id, const struct gen_news *n,
                           const float *embedding, int n_embedding);
int engine_wire_get_event(const struct engine_wire_frame *f, struct engine_wire_event *e,
                          struct err *err);
void engine_wire_event_free(struct engine_wire_event *e);

/* CANCEL: the request's id. */
bool engine_wire_put_cancel(struct strbuf *out, uint64_t id);
int engine_wire_get_cancel(const struct engine_wire_frame *f, uint64_t *id, struct err *err);

/* CALL: a question for the engine, answered by a REPLY with the same call id. */
enum engine_wire_call_kind {
    ENGINE_CALL_STATS = 1,     /* engine_get_stats */
    ENGINE_CALL_FLUSH,         /* engine_flush_cache(timeout_ms) */
    ENGINE_CALL_CLOSE_SESSION, /* engine_close_session(session) */
    ENGINE_CALL_ADAPTERS,      /* adapter_list: the reply's adapters */
    ENGINE_CALL_ADAPTERS_AVAILABLE, /* adapter_available: the reply's found */
    ENGINE_CALL_ADAPTER_MOUNT, /* adapter_mount(adapter_id, path): the reply's one adapter */
    ENGINE_CALL_ADAPTER_UNMOUNT, /* adapter_unmount(adapter_id): result, the modules removed */
    ENGINE_CALL_KIND_END,
};
struct engine_wire_call {
    uint64_t call;
    int32_t kind;
    int32_t timeout_ms;
    char session[256]; /* "" but for CLOSE_SESSION */
    char adapter_id[ADAPTER_ID_MAX]; /* "" but for ADAPTER_MOUNT and ADAPTER_UNMOUNT */
    char path[1024];                 /* "" but for ADAPTER_MOUNT */
};
bool engine_wire_put_call(struct strbuf *out, const struct engine_wire_call *c);
int engine_wire_get_call(const struct engine_wire_frame *f, struct engine_wire_call *c,
                         struct err *err);

/* REPLY: the call's return code and result (a closed session's blocks, an unmount's modules),
 * its message, the engine's stats and SSD tier counters as it answered, and an adapter call's
 * lists. The stats' string pointers (spec_kind, state, the tier's dir) are NULL on the wire:
 * their texts travel beside them. The lists are owned: engine_wire_reply_free releases them
 * (a struct copy moves them). */
struct engine_wire_reply {
    uint64_t call;
    int32_t rc;
    int32_t result;
    char msg[512];
    struct engine_stats stats;
    struct kv_tier_stats tier;
    char spec_kind[32], state[32], ssd_dir[1024];
    struct adapter_info *adapters; /* owned; n_adapters */
    int32_t n_adapters;            /* at most ENGINE_WIRE_MAX_ADAPTERS */
    struct adapter_found *found;   /* owned; n_found */
    int32_t n_found;               /* at most ENGINE_WIRE_MAX_ADAPTERS */
};
#define ENGINE_WIRE_MAX_ADAPTERS 256
bool engine_wire_put_reply(struct strbuf *out, const struct engine_wire_reply *r);
int engine_wire_get_reply(const struct engine_wire_frame *f, struct engine_wire_reply *r,
                          struct err *err);
void engine_wire_reply_free(struct engine_wire_reply *r);

/* PROGRESS: forward steps since the engine started, and requests it holds. */
struct engine_wire_progress {
    uint64_t steps;
    int32_t active;
};
bool engine_wire_put_progress(struct strbuf *out, const struct engine_wire_progress *p);
int engine_wire_get_progress(const struct engine_wire_frame *f, struct engine_wire_progress *p,
                             struct err *err);

#endif
