/* engine/speculate.h — speculative decoding's drafting side: proposals for a sequence's next
 * tokens (a draft model of the target's tokenizer with its own paged KV, or prompt lookup over
 * the sequence's own tokens), the adaptive number of drafts per sequence, and the counters of
 * what verification kept. The target verifies inside the normal varlen batch (step.c: the
 * pending token and its drafts as one entry with every row's logits) and picks through the
 * sequence's sampler (sampler_pick_draft), so the output is the target's own.
 *
 *   step:    propose ─▶ build_batch ─▶ forward ─▶ per verify entry: rows 0..k picked in turn
 *   row i:   the pick at position n_computed + 1 + i; draft i taken while the pick equals it
 *            (greedy) or passes the rejection test (sampling); the first miss is replaced
 *            by the pick, and after k kept drafts row k gives one more token
 *   after:   K/V past the kept positions are truncated (target and draft), then published */
#ifndef INFERD_ENGINE_SPECULATE_H
#define INFERD_ENGINE_SPECULATE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "kv/kv.h"
#include "model/model.h"

struct seq;
struct tokenizer;

enum spec_kind {
    SPEC_NONE = 0,  /* no speculation: the step is the plain one */
    SPEC_TWO_MODEL, /* a draft model proposes greedily */
    SPEC_NGRAM,     /* prompt lookup: the continuation of an earlier match of the last tokens */
    SPEC_CALLBACK,  /* the caller's function proposes (tests place misses where they want) */
};

/* SPEC_CALLBACK's drafter: up to cap drafts to follow tokens[0..n) into out; returns how
 * many. Called on the thread that drives the serving loop. */
typedef int (*spec_draft_fn)(void *ctx, const int32_t *tokens, int n, int32_t *out, int cap);

#define SPEC_MAX_DRAFTS 16
/* Sequences decoding in a step above which it runs without drafts, unless configured. */
#define SPEC_MAX_BATCH_DEFAULT 4
#define SPEC_DRAFTS_TWO_MODEL 3 /* --num-draft-tokens' default per kind */
#define SPEC_DRAFTS_NGRAM 10
#define SPEC_DRAFTS_START 3     /* a sequence's first number of drafts (adaptive after) */
/* The draft's automatic head (--draft-vocab auto, the default) on a backend whose memory is
 * the host's (a GPU's reads every row): every 16th forward reads every row and counts its
 * picks by buckets of 256 ids, each survey weighing the earlier ones by 0.98; the rest read
 * the first rows that held 97% of the counted picks. */
#define SPEC_SURVEY_EVERY 16
#define SPEC_SURVEY_BUCKET 256
#define SPEC_SURVEY_SHARE 0.97
#define SPEC_SURVEY_DECAY 0.98f
/* Timed verify steps after which a row count's measured cost no longer counts
 * (spec_costs_current). */
#define SPEC_COST_STALE 16
#define SPEC_NGRAM_MAX 3
#define SPEC_NGRAM_MIN 1

struct spec_config {
    enum spec_kind kind;
    const struct model *draft; /* borrowed; SPEC_TWO_MODEL only: on the target's backend */
    int num_draft_tokens;      /* most drafts per verification, [1, SPEC_MAX_DRAFTS]; 0: the
                                  kind's default */
    int ngram_max, ngram_min;  /* prompt lookup's match lengths, 1 <= min <= max; 0: 3 and 1 */
    int max_batch;             /* drafts only in steps where at most this many sequences decode
                                  (a verifying step picks every row on the host, and extra rows
                                  cost a full batch more than they save); 0: any number */
    int draft_vocab;           /* SPEC_TWO_MODEL: the draft proposes only token ids below this
                                  (its LM head's first rows: a BPE vocabulary numbers its tokens
                                  in the order their merges were learned, the most frequent
                                  first); 0: chosen as it runs, from surveys of the whole head
                                  (SPEC_SURVEY_*); the vocabulary's size: every row */
    spec_draft_fn draft_fn;    /* SPEC_CALLBACK only, with its draft_ctx */
    void *draft_ctx;
};

/* One sequence's speculation (struct seq holds it). */
struct seq_spec {
    bool on;                  /* this sequence drafts (configured, not turned off by the request,
                                 and nothing it uses changes tokens after the pick) */
    int k;                    /* drafts asked for next: adaptive, [1, the configured most] */
    int rest;                 /* steps left without drafting (backing off after misses) */
    int misses;               /* pauses in a row (each twice as long, up to 64 steps) */
    float rate;               /* moving average of the share of drafts kept */
    /* decayed counts, per draft position i, of verifications that reached draft i (every
     * draft before it kept) and of those that kept it */
    float reached[SPEC_MAX_DRAFTS], kept[SPEC_MAX_DRAFTS];
    int n_drafts;             /* drafts in this step's verify entry; 0: a plain row */
    int32_t verify[1 + SPEC_MAX_DRAFTS]; /* the verify entry: the pending token, the drafts */
    int32_t emitted[1 + SPEC_MAX_DRAFTS]; /* the last verification's picks, in order */
    int n_emitted;
    struct kv_seq dkv;        /* the draft model's KV of this sequence */
    int d_valid;              /* leading positions of dkv known to hold this sequence's tokens */
    uint64_t drafted, accepted, verify_steps;
};

/* Checks c against the target model: the kind's requirements (a draft model for two-model and
 * none for ngram), ranges, and the draft's vocabulary size. Fills in the defaults. */
int spec_config_check(struct spec_config *c, const struct model *target, struct err *err);

/* Refuses a draft model whose tokenizer differs from the target's: vocabulary size, or a
 * special token's id (the message names the first difference). */
int spec_check_tokenizers(const struct tokenizer *target, const struct tokenizer *draft,
                          struct err *err);

/* The drafting state of one serving loop: the draft model's KV manager (its own pool, no
 * prefix cache), forward state and logits. */
struct spec_drafter;

int spec_drafter_create(const struct spec_config *c, int max_seqs, int n_ctx, int max_step_tokens,
                        struct spec_drafter **out, struct err *err);
void spec_drafter_free(struct spec_drafter *d);
/* The most drafts one verify entry carries. */
int spec_drafter_max(const struct spec_drafter *d);
/* Draft model forward steps so far. */
uint64_t spec_drafter_steps(const struct spec_drafter *d);
/* The draft's LM head rows its proposals come from now (0 without a draft model). */
int spec_drafter_head_rows(const struct spec_drafter *d);

/* Sets up s's speculation (s->spec.on, k) for its sampler and request: off when speculative
 * is false, with XTC, or with thinking steered by the engine. */
void spec_seq_init(const struct spec_drafter *d, struct seq *s, bool speculative);

/* Proposes drafts for seqs[0..n) (each decoding: exactly one token without K/V), bounded by
 * what the sequence may still generate within n_ctx, cut where its grammar would refuse them:
 * fills each one's spec.verify[1..] and spec.n_drafts (0: none this step). The draft model
 * catches up on every sequence's tokens first (what spec_follow did not read, in chunks), all
 * sequences in the same draft forward. Returns 0, or a negative error of the draft forward (no
 * drafts then). */
int spec_propose(struct spec_drafter *d, struct seq **seqs, int n, int n_ctx, struct err *err);

/* The draft model reads along with the target's prefill: each of seqs[0..n) gets its draft KV
 * up to position upto[i] (the end of the prompt chunk the target computes this step, any
 * cached prefix before it included), without logits, so its first proposal has only the
 * pending token left to read. A no-op for drafters without a model. Returns 0, or a negative
 * error of the draft forward (the sequences it carried catch up at their next proposal). */
int spec_follow(struct spec_drafter *d, struct seq **seqs, const int *upto, int n,
                struct err *err);

/* After s's verify entry: n_drafts were verified, n_accepted of them kept; s->n_computed
 * holds the positions that stay. Drops the draft KV past them and adapts k. */
void spec_after_verify(struct spec_drafter *d, struct seq *s, int n_drafts, int n_accepted);

/* What drafting costs on this machine, measured as the loop runs: a step whose batch was one
 * sequence's verify entry of `rows` rows (its pending token and rows - 1 drafts) took
 * `seconds` (the target's forward and the picks), and proposing took `seconds` for
 * `forwards` draft forwards. A sequence drafts at most the number that these costs and its
 * acceptance make best (spec_best_drafts): where verify rows are nearly free (a GPU) that is
 * the configured most, where each row is arithmetic (a CPU) fewer. */
void spec_note_step(struct spec_drafter *d, int rows, double seconds);
void spec_note_drafting(struct spec_drafter *d, uint64_t forwards, double seconds);

/* What verify steps of r rows cost on this machine (seconds, a moving average of each r; 0:
 * not measured), and when each was last measured (in timed steps). The machine's speed moves
 * (other processes, what its caches hold): a cost not measured for SPEC_COST_STALE timed steps
 * counts as unmeasured, so spec_best_drafts tries that row count again where it could be best
 * (one measured once in a slow moment would otherwise never be chosen again), and its next
 * measurement replaces the old average instead of moving it. Zeroed: nothing measured. */
struct spec_costs {
    double step[SPEC_MAX_DRAFTS + 2];
    uint64_t timed_at[SPEC_MAX_DRAFTS + 2];
    uint64_t timed; /* steps timed so far */
};

/* A step of rows rows took seconds. */
void spec_costs_note(struct spec_costs *c, int rows, double seconds);
/* out[r]: the cost of r rows as spec_best_drafts weighs it now (0 where unmeasured or stale). */
void spec_costs_current(const struct spec_costs *c, double *out);

/* The number of drafts k in [1, max_drafts] that brings most tokens per second, where draft i
 * (from 0) is kept with chance keep[i] once those before it were: (1 + keep[0] + keep[0]
 * keep[1] + ...) / (step_cost[1 + k] + k * draft_cost). step_cost[r]: seconds of a step of r
 * rows, 0 where not measured yet: such k are not weighed; with none measured the answer is
 * max_drafts, and while a neighbour of the best k is unmeasured and could beat it (its step
 * costing at most in proportion to its rows), that neighbour (the one below first). */
int spec_best_drafts(const double *keep, const double *step_cost, int max_drafts,
                     double draft_cost);

/* The draft's head rows that held SPEC_SURVEY_SHARE of the surveyed picks: survey[i] counts
 * the picks of ids [i, i + 1) * SPEC_SURVEY_BUCKET; whole buckets, at most vocab; vocab
 * when nothing was counted. */
int spec_surveyed_rows(const float *survey, int n_buckets, int vocab);

/* Gives s's draft KV back (it is recomputed on the next proposal). */
void spec_seq_release(struct spec_drafter *d, struct seq *s);

/* Prompt lookup over tokens[0..n): the continuation (at most cap tokens, into out) of the
 * latest earlier occurrence of the longest suffix of length in [min_n, max_n] that occurred
 * before. Returns how many tokens were written (0: no match). */
int spec_ngram_lookup(const int32_t *tokens, int n, int min_n, int max_n, int32_t *out, int cap);

#endif
