/* engine/engine.h — the serving engine: one thread owns the model and the KV pool and
 * decodes every admitted request together (continuous batching, chunked prefill). */
#ifndef INFERD_ENGINE_ENGINE_H
#define INFERD_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/histogram.h"
#include "base/strbuf.h"
#include "engine/sampler.h"
#include "engine/speculate.h"
#include "kv/kv.h"
#include "model/model.h"

struct tokenizer;
struct grammar;
struct device_turns;
struct grammar_vocab;

#define GEN_MAX_TOP_LOGPROBS 20
#define GEN_MAX_STOP 16

struct engine_config {
    int n_ctx;           /* positions per sequence: prompt + generated */
    int max_seqs;        /* sequences in one forward step; 1: strictly one request at a time */
    int max_step_tokens; /* tokens in one forward step (prefill chunks + decodes): the
                            prefill chunk */
    int max_queue;       /* requests waiting for admission; one more is refused */
    int kv_blocks;       /* KV pool size in blocks; 0: max_seqs full contexts, plus the
                            prompt cache's cap in blocks */
    int kv_block_size;   /* positions per KV block; 0: KV_BLOCK_SIZE_DEFAULT (kv/ checks it) */
    /* Running sequences are admitted while their projected KV bytes (prompt +
     * max_tokens positions, less blocks shared from the cache) fit; a request
     * that alone does not is refused at submit. 0: no budget. */
    uint64_t kv_budget_bytes;
    /* Positions a sequence may hold under the memory budget (max_tokens is
     * clamped to what the prompt leaves; a prompt that does not fit is
     * refused); 0: no budget. The engine keeps min(n_ctx, budget_ctx). */
    int budget_ctx;
    /* The prefix cache (kv/kv.h): cached blocks only the cache holds take at
     * most prompt_cache_bytes of the pool; 0 turns the cache off. */
    size_t prompt_cache_bytes;
    enum kv_retention cache_retention;
    int session_idle_s;  /* a session's blocks lose their priority after this long unused;
                            0: only an explicit close ends it */
    /* The SSD tier below the prefix cache (kv/kv.h); NULL: none. Its
     * fingerprint's model_digest is the weights' content digest: the engine
     * mixes the architecture and tokenizer identity of the prefix cache in. */
    const struct kv_tier_config *tier;
    /* Generation checkpoints every this many generated tokens (needs tier; 0: none):
     * an identical request after a restart resumes from the newest one. */
    int checkpoint_every;
    /* Speculative decoding (engine/speculate.h); NULL or kind SPEC_NONE: none. */
    const struct spec_config *spec;
    /* The device's turns (engine/turns.h) when another user (the transcriber) shares it: each
     * forward step runs in a turn of its own. NULL: the engine has the device alone. */
    struct device_turns *turns;
};

/* A compiled constraint on a reply (structured output), shared by every request that asks for
 * it: reference-counted, freed with its last reference (a server-wide cache holds one; each
 * sequence holds one while it runs). Its stages are grammars matched one after another: stage
 * i + 1 starts where stage i is finished (accepting, nothing more can follow), so a tool call
 * can be a literal opening, a JSON Schema and a literal closing. The reply may end (EOS) only
 * where the last stage accepts. */
#define GEN_GRAMMAR_MAX_STAGES 4
struct gen_grammar;
/* Takes ownership of stages[0..n) (1 <= n <= GEN_GRAMMAR_MAX_STAGES; freed on failure too);
 * vocab is borrowed and must outlive the result and every sequence using it. Prepares each
 * stage's mask cache for vocab now (grammar_matcher_prepare), so the engine thread never
 * pays a first visit. The result holds one reference. */
int gen_grammar_create(struct grammar *const *stages, int n, const struct grammar_vocab *vocab,
                       struct gen_grammar **out, struct err *err);
void gen_grammar_retain(struct gen_grammar *g);
/* Drops one reference; the last frees the grammars. NULL is ignored. */
void gen_grammar_release(struct gen_grammar *g);

/* What one request asks the engine for. Everything is copied at submit. */
struct gen_params {
    const int32_t *prompt;
    int n_prompt;
    int max_tokens;                /* >= 1; never more than the context leaves */
    struct sampler_params sampling;
    const char *const *stop;       /* n_stop stop strings matched on decoded text */
    int n_stop;
    int logprobs;                  /* -1: none; 0..20: the sampled token's and that many alternatives */
    const int32_t *eos_ids;        /* tokens that end the generation (not emitted as text) */
    int n_eos;
    /* Prefix-cache identity of the requester: KV computed under one namespace
     * is never reused under another (tenants, cache_salt). 0: the default. */
    uint64_t cache_ns;
    const char *session_id;        /* session affinity (NULL: none); copied at submit */
    /* A retention hint: the full KV blocks among the prompt's first retain_tokens
     * positions are kept ahead of plain LRU, as a session's are (without a session,
     * under one derived from cache_ns, so the next request with the prefix finds
     * them). 0: none. */
    int retain_tokens;
    /* Thinking, for a tokenizer with <think> and </think> (else ignored): the
     * reply starts with <think> (forced when the prompt does not already leave
     * the model inside one) when think_open; once think_budget tokens were
     * generated inside <think>, </think> is forced next (0: no budget). */
    bool think_open;
    int think_budget;
    /* Structured output (NULL: unconstrained): each token is picked among those the grammar
     * allows (engine/constrain.h); the sequence takes its own reference at submit. With
     * grammar_after_think it applies from the first token outside <think> (steered as
     * above), else from the first token. jump_forward: text the grammar forces is appended
     * as a prefill chunk (its tokens' logprob 0) instead of being sampled token by token. */
    struct gen_grammar *grammar;
    bool grammar_after_think;
    bool jump_forward;
    /* Speculative decoding, where the engine is configured with it: true turns it off for
     * this request (usage.speculation stays zero, the lane is never "serial+spec"). */
    bool no_speculation;
    /* An embedding instead of a generation: the prompt is computed (in chunks, batched
     * with the generations like any prefill) and the last token's final-normed hidden
     * state goes to gen_output.embedding; nothing is sampled, max_tokens is ignored, and
     * the prompt may fill the whole context. */
    bool embed;
    /* Low-rank adapters (model/lora.h) of the engine's model, applied in order and summed
     * ("a+b"); n_adapters 0: the base model. The sequence takes its own references at
     * submit and drops them when it is done. Their content digests are mixed into
     * cache_ns: KV computed under one stack is never reused under another. */
    struct lora_adapter *adapters[LORA_MAX_STACK];
    int n_adapters;
};

enum gen_finish {
    GEN_RUNNING = 0,
    GEN_FINISH_STOP,      /* an end-of-sequence token or a stop string */
    GEN_FINISH_LENGTH,    /* max_tokens or the context filled */
    GEN_FINISH_CANCELLED, /* the client went away or the server is stopping */
    GEN_FINISH_ERROR,     /* an internal fault; message in error */
};

/* How a request's tokens were decoded: speculation's counts (usage.speculation) and whether
 * it shared a step with another sequence (usage.lane). */
struct gen_spec_usage {
    int drafted;      /* drafts verified */
    int accepted;     /* of which kept */
    int target_calls; /* target forward steps that verified drafts */
    bool shared;      /* a step computed it together with another sequence */
    bool on;          /* it speculates (a drafter is configured and the request allows it) */
};

/* usage.lane: "serial+spec" when drafts were verified, else "batch" when it shared a step,
 * else "serial". */
static inline const char *gen_spec_lane(const struct gen_spec_usage *u)
{
    return u->target_calls > 0 ? "serial+spec" : u->shared ? "batch" : "serial";
}

struct gen_token {
    int32_t id;
    float logprob;
    int n_top;
    struct token_logprob top[GEN_MAX_TOP_LOGPROBS];
    size_t text_end; /* bytes of emitted text once this token was decoded */
};

/* The hand-off from the engine thread to the request's HTTP thread. The engine
 * appends a step's news under mu and signals cv once per step; the reader
 * copies out under mu (gen_output_drain). Owned jointly (refs): whoever drops
 * the last reference frees it. */
struct gen_output {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct strbuf text;        /* emitted text (stop strings never appear) */
    struct strbuf tokens;      /* n_tokens struct gen_token entries, one per generated token
                                  when logprobs >= 0 (gen_output_tokens) */
    size_t n_tokens;
    struct strbuf ids;         /* n_ids int32_t: every generated token id in order, kept
                                  whatever logprobs says, including tokens whose text is held
                                  back or hidden, but not the end-of-sequence token that ended it */
    size_t n_ids;
    int n_prompt;              /* prompt tokens */
    int n_cached;              /* prompt tokens whose KV was reused */
    int n_generated;           /* tokens sampled so far */
    uint64_t t_admit_ns;       /* when the engine admitted it into the running batch
                                  (base/timer.h's clock, shared by the processes of one
                                  host); 0 until then */
    enum gen_finish finish;    /* GEN_RUNNING until the engine is done with it */
    char error[256];           /* set with GEN_FINISH_ERROR */
    int error_code;            /* with GEN_FINISH_ERROR: the INFERD_E* code, e.g. INFERD_ENOMEM */
    int stop_string;           /* with GEN_FINISH_STOP: 1 + the index of the stop string that
                                  fired (gen_params.stop); 0: an end-of-sequence token */
    struct gen_spec_usage spec; /* speculation and lane, as of the last publish */
    atomic_bool cancel;        /* set by the reader; honoured at the next step */
    bool held;                 /* the reader is in gen_output_hold: a publish wakes it only with
                                  the finish */
    float *embedding;          /* owned; n_embedding floats (hidden_size) for a gen_params.embed
                                  request, written before the finish (GEN_FINISH_STOP) is
                                  published and read after it; NULL otherwise */
    int n_embedding;
    int refs;
};

/* The token records of o, n_tokens of them; read under mu. */
static inline const struct gen_token *gen_output_tokens(const struct gen_output *o)
{
    return (const struct gen_token *)(const void *)o->tokens.data;
}

/* Blocks until the output has more than text_len bytes / n_tokens tokens,
 * or is finished, or timeout_ms passes. Call with mu held. */
void gen_output_wait(struct gen_output *o, size_t text_len, size_t n_tokens, int timeout_ms);

/* How far a reader has read an output. */
struct gen_cursor {
    size_t text;   /* bytes of text taken */
    size_t tokens; /* entries of tokens taken */
    size_t ids;    /* generated ids taken */
};

/* What one drain took: everything past the cursor at that moment. */
struct gen_news {
    char *text;               /* owned (malloc'd, NUL-terminated); text_len bytes, or NULL */
    size_t text_len;
    size_t text_from;         /* offset of text within the whole output */
    struct gen_token *tokens; /* owned; n_tokens entries, or NULL */
    size_t n_tokens;
    int32_t *ids;             /* owned; n_ids generated token ids (see gen_output.ids), or NULL */
    size_t n_ids;
    enum gen_finish finish;   /* GEN_RUNNING while more may come */
    int n_prompt, n_cached, n_generated; /* counts as of this drain */
    uint64_t t_admit_ns;      /* gen_output.t_admit_ns as of this drain */
    int error_code;           /* with GEN_FINISH_ERROR */
    char error[256];          /* with GEN_FINISH_ERROR */
    int stop_string;          /* with GEN_FINISH_STOP: 1 + the stop string's index; 0: none */
    struct gen_spec_usage spec; /* speculation and lane, as of this drain */
};

/* The reader's one call: waits up to timeout_ms for text or tokens past cur
 * (or the finish), then copies out whatever is new (text, tokens, ids) and advances cur, so the
 * engine may keep writing while the caller formats. news->finish says whether
 * the output is done; an empty news with GEN_RUNNING means the wait timed out.
 * Returns 0, or -INFERD_ENOMEM (cur unchanged, news empty). Release news with
 * gen_news_free. */
int gen_output_drain(struct gen_output *o, struct gen_cursor *cur, int timeout_ms,
                     struct gen_news *news);
void gen_news_free(struct gen_news *news);
/* Blocks until until_ns (CLOCK_MONOTONIC, base/timer.h's now_ns) unless the output finishes
 * first; returns whether it is finished. Text and tokens published meanwhile do not wake the
 * caller (the engine skips the broadcast) and wait for its next drain, so a reader that takes
 * its tokens a window at a time is woken once a window instead of once a step. */
bool gen_output_hold(struct gen_output *o, uint64_t until_ns);
/* Drops the caller's reference (the reader's, after it asked to cancel if unfinished). */
void gen_output_release(struct gen_output *o);
/* A new record with two references (the producer's and the reader's), for the engine and
 * for a producer that is not the engine thread (the isolation proxy); NULL without memory. */
struct gen_output *gen_output_create(int n_prompt);

struct engine_stats {
    uint64_t requests_admitted, requests_finished, requests_cancelled, requests_refused;
    uint64_t prompt_tokens, generated_tokens, steps;
    uint64_t preemptions; /* sequences that gave their KV blocks back to be recomputed */
    uint64_t requests_rejected; /* refused at submit for any reason (queue full, too long) */
    int queued, running, kv_blocks_total, kv_blocks_free;
    int waiting;                /* sequences waiting for admission, preempted ones included */
    uint64_t kv_bytes;          /* KV bytes of the blocks running sequences hold */
    uint64_t kv_budget_bytes;   /* the admission budget on KV bytes; 0: none */
    struct kv_prefix_stats prompt_cache; /* as of the engine's last step */
    struct kv_tier_stats ssd_cache;      /* as of the engine's last step; enabled false: no tier */
    bool checkpoints;                    /* generation checkpoints are on */
    uint64_t checkpoints_saved, checkpoints_resumed, checkpoints_removed, checkpoints_failed;
    /* Structured output: masks computed, tokens appended by jump-forward (never sampled), and
     * the per-token mask time over the last ENGINE_MASK_WINDOW masks (median, p99). */
    uint64_t grammar_masks, grammar_forced_tokens;
    double grammar_mask_us_p50, grammar_mask_us_p99;
    /* Speculative decoding (spec_kind "none" when off): drafts verified and kept, target
     * steps that verified drafts, draft model forward steps; a draft model's proposals are
     * the token ids below spec_draft_vocab (0 for the other kinds). */
    const char *spec_kind;
    int spec_max_drafts, spec_draft_vocab;
    bool spec_draft_vocab_auto; /* spec_draft_vocab is chosen as the draft runs */
    uint64_t spec_drafted, spec_accepted, spec_verify_steps, spec_draft_steps;
    const char *state; /* "idle", "running", "stopping" */
    /* The KV cache's format (kv_format_name: "f32", "kv8", "turbo-k8v3", "config", ...), its
     * bytes per token over every layer, and, for a per-layer config, each layer's format. */
    char kv_quant[32];
    uint64_t kv_bytes_per_token;
    int kv_quant_layers;                          /* 0: one format for every layer */
    char kv_quant_layer[KV_QUANT_MAX_LAYERS][24];
};

#define ENGINE_MASK_WINDOW 4096

struct engine_metrics {
    struct histogram ttft;          /* seconds from submit to the first generated token */
    struct histogram queue_time;    /* seconds from submit to admission into the running set */
    struct histogram prefill_time;  /* seconds from admission to the first generated token */
    struct histogram inter_token;   /* seconds between a sequence's consecutive tokens */
    /* Structured output, written by the engine thread: masks computed (mask_ns[i %
     * ENGINE_MASK_WINDOW] holds mask i's nanoseconds) and tokens jump-forward appended. */
    atomic_uint_fast64_t grammar_masks;
    atomic_uint_fast64_t grammar_forced;
    _Atomic uint32_t mask_ns[ENGINE_MASK_WINDOW];
};

struct engine;

/* Starts the engine thread over m (borrowed; tok borrowed, used to decode
 * text for stop strings). */
int engine_create(const struct model *m, const struct tokenizer *tok,
                  const struct engine_config *cfg, struct engine **out, struct err *err);

/* Queues a request. -INFERD_EBUSY when the admission queue is full;
 * -INFERD_ERANGE when the prompt does not fit the context (message says both
 * numbers); -INFERD_EINVAL for bad params. On success *out holds one
 * reference for the caller. */
int engine_submit(struct engine *e, const struct gen_params *p, struct gen_output **out,
                  struct err *err);

/* Stops admitting (submits get -INFERD_EBUSY), lets running requests finish
 * for up to grace_ms, cancels the rest, and joins the engine thread. The
 * engine stays valid for submits (refused) and stats until engine_free. */
void engine_shutdown(struct engine *e, int grace_ms);
/* Shuts down (without grace) if still running, then frees. */
void engine_free(struct engine *e);

/* Ends session affinity for session_id in the prefix cache (its blocks become
 * plain LRU blocks). The engine thread does it between two steps (the cache
 * is its alone); the caller waits. *blocks_released gets how many blocks the
 * session held, or -1 when no such session is open (or the cache is off).
 * Returns 0, or -INFERD_EBUSY when the engine is stopping. */
int engine_close_session(struct engine *e, const char *session_id, int *blocks_released,
                         struct err *err);

/* Makes everything the prefix cache holds durable in the SSD tier: 0 once it
 * is, -INFERD_EBUSY when timeout_ms passed first (the writes go on),
 * -INFERD_EIO when the tier turned itself off, -INFERD_EINVAL without a tier.
 * The engine thread does it between two steps; the caller waits. *after (may
 * be NULL) gets the tier's counters as it answered. */
int engine_flush_cache(struct engine *e, int timeout_ms, struct kv_tier_stats *after,
                       struct err *err);

/* Runs fn(ctx, err) on the engine thread between two steps and returns its result; the
 * caller waits. What touches the model's backend from another thread (mounting or
 * unmounting an adapter) goes through here, as the backend has one driver at a time.
 * -INFERD_EBUSY when the engine is stopping. */
int engine_run(struct engine *e, int (*fn)(void *ctx, struct err *err), void *ctx,
               struct err *err);

void engine_get_stats(struct engine *e, struct engine_stats *out);
const struct engine_metrics *engine_metrics(const struct engine *e);
const struct engine_config *engine_config(const struct engine *e);

#endif
