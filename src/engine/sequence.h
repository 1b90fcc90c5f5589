/* engine/sequence.h — one request inside the engine: its tokens, KV slots, sampler,
 * detokenizer and stop strings, and what it has produced since it last told its reader.
 * Used only by the thread that drives the serving loop. */
#ifndef INFERD_ENGINE_SEQUENCE_H
#define INFERD_ENGINE_SEQUENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "engine/constrain.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculate.h"
#include "engine/stop.h"
#include "kv/kv.h"
#include "text/tokenizer.h"

/* What a sequence produced since it last published: filled token by token
 * without a lock, handed to the reader in one go (gen_output_publish). */
struct gen_pending {
    struct strbuf text;        /* emitted text */
    struct strbuf tokens;      /* struct gen_token entries; text_end counts from text's start */
    struct strbuf ids;         /* int32_t generated ids (end-of-sequence excluded) */
    int n_generated;           /* tokens sampled */
    enum gen_finish finish;    /* GEN_RUNNING, or how the sequence ended */
    int error_code;            /* with GEN_FINISH_ERROR */
    char error[256];           /* with GEN_FINISH_ERROR */
    int stop_string;           /* with GEN_FINISH_STOP: 1 + the stop string's index; 0: none */
    struct gen_spec_usage spec; /* speculation since the last publish (shared: ever) */
};

/* Where a thinking sequence stands (gen_params.think_open, think_budget). */
struct seq_think {
    bool on;                   /* steering applies: asked for, and the tokenizer has both tags */
    int32_t start_id, end_id;  /* <think>, </think> */
    bool open_first;           /* the first generated token is forced to <think> */
    bool inside;               /* the last tag seen (prompt, then generated) was <think> */
    int budget;                /* tokens allowed inside <think>; 0: no limit */
    int count;                 /* tokens generated inside the current <think> */
};

struct seq {
    struct gen_output *out;     /* one reference, dropped by seq_free; NULL for a sequence a
                                   generator drives (seq_create_detached) */
    int32_t *tokens;            /* owned; prompt then generated, room for n_prompt + max_tokens */
    int n_prompt;
    int n_tokens;               /* prompt + generated so far */
    int n_computed;             /* leading tokens whose K/V are in the cache */
    int max_tokens;
    int logprobs;               /* -1: none */
    int32_t *eos_ids;           /* owned; n_eos */
    int n_eos;
    struct kv_seq kv;           /* slots in the KV cache */
    struct lora_adapter *adapters[LORA_MAX_STACK]; /* one reference each; n_adapters */
    int n_adapters;
    /* Picks this sequence's tokens: &own_sampler for a request; for a detached
     * sequence its driver's (borrowed), or NULL when the driver reads the logits. */
    struct sampler *sampler;
    struct sampler own_sampler;
    bool sampler_ready;         /* own_sampler needs sampler_free */
    int32_t last_pick;          /* the latest token picked (a detached sequence's result) */
    struct detok *detok;        /* owned */
    struct stop_matcher *stop;  /* owned */
    struct gen_pending pending; /* not yet published to out */
    struct seq_think think;
    struct constrain con;       /* structured output; off when the request has no grammar */
    bool mask_due;              /* a pick since the mask was computed: seq_prepare_pick owes it */
    bool grammar_done;          /* the grammar allows nothing more: the next row finishes it */
    bool pick_void;             /* no mask for the next pick (out of memory): it is cancelled */
    uint64_t t_submit_ns, t_last_token_ns;
    uint64_t t_admit_ns; /* first admission into the running set (0 before it) */
    uint64_t admit_order;       /* later admissions are preempted first */
    char *session_id;           /* owned; session affinity (kv.session points here), or NULL */
    bool looked_up;             /* the prefix cache was asked since the blocks were last freed */
    bool finishing;             /* its reader was told it is done; one more step computes the
                                   last token's K/V for the prefix cache (sched_finish) */
    /* A handoff (sched_admit): a new sequence whose prompt continues a
     * finishing one takes its blocks, the last token included, while the
     * finishing one's final step computes that token. Both point at each
     * other until that step is done. */
    /* Generation checkpoints (engine/checkpoint.h): */
    bool ckpt;                  /* this generation is checkpointed under ckpt_key */
    uint64_t ckpt_key;
    int ckpt_saved;             /* generated tokens the last checkpoint held */
    struct strbuf records;      /* struct gen_token per generated token, while ckpt */
    bool cached_told;           /* its reader has the reused prompt tokens (gen_output.n_cached) */
    bool loading;               /* admitted while some of its cached blocks are read from disk:
                                   it joins a batch once they are in (kv_manager_loading) */
    struct seq_spec spec;       /* speculative decoding (off unless the engine drafts) */
    bool no_speculation;        /* the request turned speculation off */
    struct seq *continues;      /* the finishing sequence this one took over, or NULL */
    struct seq *continued_by;   /* the sequence that took this finishing one over, or NULL */
    bool embed;                 /* gen_params.embed: its last prompt row goes to out->embedding */
};

/* The engine's side of struct gen_output (engine/gen_output.c; gen_output_create is
 * engine.h's). */
/* Moves p's text, tokens, count and finish into o under one lock with one
 * wake-up for the reader, and empties p; nothing (no lock) when p holds no
 * news. False when memory ran out (the news is lost). */
bool gen_output_publish(struct gen_output *o, struct gen_pending *p);
void gen_pending_free(struct gen_pending *p);

/* A sequence for p (copied), with a fresh gen_output holding two references
 * (the sequence's and the caller's). */
int seq_create(const struct gen_params *p, const struct tokenizer *tok, int n_vocab,
               struct seq **out, struct gen_output **output, struct err *err);

/* An empty sequence with room for n_ctx tokens and no reader, for a caller
 * that drives the serving loop itself: it appends tokens, sets sampler, and
 * takes last_pick or the logits row after each step. */
int seq_create_detached(int n_ctx, struct seq **out, struct err *err);

/* Gives the KV slots back to kv (when non-NULL) and drops the output reference. */
void seq_free(struct seq *s, struct kv_manager *kv);

/* Consumes the logits that predict the token after tokens[n_tokens - 1]:
 * samples it and stages its text. Returns GEN_RUNNING, or why the
 * sequence is finished: GEN_FINISH_STOP (end-of-sequence token or stop
 * string) or GEN_FINISH_LENGTH (max_tokens reached or the context full).
 * A detached sequence only records the pick in last_pick. */
enum gen_finish seq_take_token(struct seq *s, const float *logits, int n_ctx, struct engine_metrics *metrics);

/* seq_take_token for a token the backend sampled: spec is what
 * sampler_fill_spec gave for this step, res the backend's result and
 * host_row the row's processed logits when res->need_host. */
enum gen_finish seq_take_result(struct seq *s, const struct sample_spec *spec,
                                const struct sample_result *res, const float *host_row, int n_ctx,
                                struct engine_metrics *metrics);

/* The next pick's mask, when a pick left it due: computed on the engine
 * thread while the device runs the step whose row it applies to. */
void seq_prepare_pick(struct seq *s, struct engine_metrics *metrics);

/* seq_take_token for a verify row (speculative decoding): the pick is
 * sampler_pick_draft's for draft at this position; *accepted says whether the
 * draft was taken (the pick is the draft). A detached sequence only records
 * the pick. */
enum gen_finish seq_take_draft(struct seq *s, const float *logits, int32_t draft, int n_ctx,
                               struct engine_metrics *metrics, bool *accepted);

/* seq_take_draft for a verify row the backend picked (res, for spec, as seq_take_result):
 * a greedy pick the drafts cannot have changed (step.c checks), taken; *accepted when it
 * is the draft. */
enum gen_finish seq_take_draft_result(struct seq *s, const struct sample_spec *spec,
                                      const struct sample_result *res, const float *host_row,
                                      int32_t draft, int n_ctx, struct engine_metrics *metrics,
                                      bool *accepted);

/* Whether the backend may pick every row of s's verify span with the spec of its first row:
 * greedy, and nothing the drafts before a row would change (no penalties or biases over
 * tokens seen, no structured output). */
bool seq_verify_rows_on_backend(const struct seq *s, const struct sample_spec *spec);

/* Replays n generated tokens of a checkpoint (their records as the reader
 * got them) as if they had just been picked, then restores the sampler's
 * random stream: the generation goes on as it would have. Returns
 * GEN_RUNNING, or how the replay ended it (GEN_FINISH_ERROR: a record
 * outside the vocabulary). */
enum gen_finish seq_replay(struct seq *s, const struct gen_token *tokens, int n,
                           uint64_t rng_state, int n_ctx);

/* Stages the held-back text (unless a stop string fired) and the finish reason. */
void seq_finish(struct seq *s, enum gen_finish why, int error_code, const char *error);

/* Hands what the sequence staged since the last call to its reader (one
 * lock, one wake-up; nothing when there is no news). */
void seq_publish(struct seq *s);

#endif
