/* engine/scheduler.h — the serving loop without a thread: the waiting and running sequences,
 * the KV manager they draw on, and one forward step at a time. The engine thread drives it
 * for the server (engine.c); generate.c drives it on the caller's thread for run and bench. */
#ifndef INFERD_ENGINE_SCHEDULER_H
#define INFERD_ENGINE_SCHEDULER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/sequence.h"
#include "kv/kv.h"

struct sched_config {
    int n_ctx;           /* positions per sequence */
    int max_seqs;        /* sequences in one step */
    int max_step_tokens; /* tokens in one step */
    int kv_blocks;       /* KV pool size in blocks of block_size; 0: max_seqs full contexts
                            plus prefix.max_bytes of blocks; never fewer than one full context */
    int block_size;      /* positions per KV block; 0: KV_BLOCK_SIZE_DEFAULT */
    uint64_t kv_budget_bytes; /* projected KV of the running sequences; 0: no budget */
    struct kv_prefix_config prefix; /* max_bytes 0: no prefix cache */
    const struct kv_tier_config *tier; /* the SSD tier below the prefix cache; NULL: none */
    const struct spec_config *spec;    /* speculative decoding (checked); NULL: none */
};

/* Counters any thread may read while the driving thread writes them. */
struct sched_counters {
    atomic_int n_queued; /* submitted, never yet admitted (the submitter adds) */
    atomic_uint_fast64_t requests_admitted, requests_finished, requests_cancelled, prompt_tokens,
        generated_tokens, steps, preemptions;
    /* Speculative decoding: drafts verified, drafts kept, verify entries, draft forwards. */
    atomic_uint_fast64_t spec_drafted, spec_accepted, spec_verify_steps, spec_draft_steps;
};

struct sched {
    const struct model *model;     /* borrowed */
    struct sched_config cfg;       /* kv_blocks as created */
    struct engine_metrics *metrics;/* borrowed; token timings go here (NULL: nowhere) */
    struct kv_manager *kv;         /* owned */
    struct forward_state *fwd;     /* owned */
    float *logits;                 /* owned; max_seqs rows of vocab_size (max_seqs * (1 + the
                                      most drafts) with speculation: a verify entry's rows) */
    struct spec_drafter *spec;     /* owned; NULL: no speculation */
    struct seq **spec_seqs;        /* owned; max_seqs: the step's sequences that may draft */
    int spec_max_batch;            /* spec_config.max_batch: more decoding, no drafts; 0: any */
    struct sample_spec *specs;     /* owned; max_seqs: the step's picks, for a sampling backend */
    struct sample_result *results; /* owned; max_seqs */
    /* A step holds the running sequences and the finishing ones: */
    struct batch_seq *batch_seqs;  /* owned; 2 * max_seqs */
    struct seq **batch_owner;      /* owned; 2 * max_seqs: which sequence each batch entry is */
    int *batch_chunk;              /* owned; 2 * max_seqs */
    struct seq **waiting;          /* owned array; FIFO, preempted sequences go first */
    int n_waiting, cap_waiting;
    struct seq **running;          /* owned array; max_seqs, in admission order */
    int n_running;
    /* Finished sequences whose readers were told, kept for the next step only,
     * which computes their last token's K/V before they publish and go (with
     * the prefix cache on). Not running: neither counted nor budgeted. */
    struct seq **finishing;        /* owned array; max_seqs */
    int n_finishing;
    /* Running sequences whose step's news waits to reach their readers: handed over
     * while the device computes the next step (waking a reader is a system call). */
    struct seq **unpublished;      /* owned array; max_seqs */
    int n_unpublished;
    uint64_t admissions;
    struct sched_counters counters;
    struct ckpt_store *ckpt;       /* borrowed; generation checkpoints, or NULL */
    int ckpt_every;                /* generated tokens between two checkpoints */
};

int sched_init(struct sched *sc, const struct model *m, const struct sched_config *cfg,
               struct engine_metrics *metrics, struct err *err);
/* Frees the buffers; the sets must be empty (every sequence retired). */
void sched_free(struct sched *sc);

/* ---- policy (scheduler.c) ---- */

/* Queues s behind the waiting ones (in front when it was preempted); false
 * when out of memory. */
bool sched_enqueue(struct sched *sc, struct seq *s, bool front);
/* KV bytes n_positions positions take, of which n_shared sit in blocks shared
 * from the prefix cache (counted once, by the cache, not per sequence). */
uint64_t sched_kv_bytes(const struct sched *sc, int n_positions, int n_shared);
/* Moves waiting sequences into the running set while the rule allows. */
void sched_admit(struct sched *sc);
/* True when nothing waits, runs or finishes: the driver may sleep. */
bool sched_idle(const struct sched *sc);
/* Fills the batch for this step; returns how many sequences take part. May
 * preempt the youngest running sequences when KV blocks run out. */
int sched_build_batch(struct sched *sc);
/* Retires every sequence whose reader asked to cancel (all when cancel_all). */
void sched_drop_cancelled(struct sched *sc, bool cancel_all);
/* Takes s out of the running set or the waiting queue, wherever it is. */
void sched_remove(struct sched *sc, struct seq *s);
/* Saves s's checkpoint when ckpt_every tokens were generated since the last
 * one (or any, with force); nothing for a sequence without checkpoints. */
void sched_checkpoint(struct sched *sc, struct seq *s, bool force);
/* Hands s's computed full blocks to the prefix cache, so concurrent requests
 * with the same prefix share them. */
void sched_publish(struct sched *sc, struct seq *s);
/* Counts s out, stages its finish, publishes it (and its computed blocks to
 * the prefix cache, the partial last one included, unless it failed) and
 * frees it. A detached sequence stays with its driver; only its KV slots go
 * back. */
void sched_retire(struct sched *sc, struct seq *s, enum gen_finish why, int error_code,
                  const char *error);
/* s, taken out of the running set, ended normally this step (why: STOP or
 * LENGTH). Its reader is told now; with the prefix cache on, s stays one more
 * step among the finishing so that its last sampled token's K/V are computed
 * and published with the rest, else it retires at once. */
void sched_finish(struct sched *sc, struct seq *s, enum gen_finish why);
/* After the step that computed a finishing s's last token: publishes it
 * (unless the step failed: ok false) and frees it. */
void sched_retire_finishing(struct sched *sc, struct seq *s, bool ok);

/* Hands the news of every sequence in sc->unpublished to its reader (seq_publish). */
void sched_publish_news(struct sched *sc);

/* ---- execution (step.c) ---- */

/* One step: the batch through the model, each sequence's row to it, finished
 * ones retired, every sequence's news published once. Returns how many
 * sequences took part (0: nothing could run), or the forward pass's negative
 * error (the batch's sequences are retired with it; err filled). */
int sched_step(struct sched *sc, struct err *err);

#endif
