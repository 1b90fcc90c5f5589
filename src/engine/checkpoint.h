/* engine/checkpoint.h — generation checkpoints: every N generated tokens an in-flight
 * generation's token records and sampler state go to disk (on a writer thread, atomically),
 * beside the SSD tier's blocks that hold its K/V, keyed by the request's content; an identical
 * request after a restart resumes from the newest one and continues with the tokens an
 * uninterrupted run would have produced. */
#ifndef INFERD_ENGINE_CHECKPOINT_H
#define INFERD_ENGINE_CHECKPOINT_H

#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"

/* ---- on disk -------------------------------------------------------------------
 *   DIR/<key, 16 hex>.ckpt, written as .tmp, fsynced, renamed, the directory fsynced:
 *     0  magic "inferdCK"        8   version u32 (1)     12  token record bytes u32
 *    16  key u64                 24  rng state u64       32  n_generated u32
 *    36  n_prompt u32            40  records, n_generated x sizeof(struct gen_token)
 *    ..  XXH3-64 of everything before it (8 bytes)
 * in the host's byte order: a checkpoint lives beside K/V blocks that are only usable by the
 * same numeric identity anyway. A file that does not parse is ignored (and removed). */

struct ckpt_store;

/* A loaded checkpoint. */
struct ckpt {
    uint64_t key;
    uint64_t rng_state;         /* the sampler's after its last pick */
    struct gen_token *tokens;   /* owned; n_generated records, as the reader got them */
    int n_generated;
};

struct ckpt_stats {
    uint64_t saved, resumed, removed, failed; /* failed: writes that did not make it to disk */
    uint64_t pending;                         /* queued for the writer */
};

/* The request's content key: prompt, sampling (the seed only when sampling is random),
 * max_tokens, stop strings, end-of-sequence ids, logprobs and cache namespace. */
uint64_t ckpt_key_of(const struct gen_params *p);

/* Opens (creating) dir and starts the writer. */
int ckpt_store_open(const char *dir, struct ckpt_store **out, struct err *err);
/* Writes what is queued, then stops the writer and frees s. */
void ckpt_store_close(struct ckpt_store *s);

/* Queues a checkpoint (tokens copied); a newer one for the same key replaces an older one
 * still queued. Returns 0 or -INFERD_ENOMEM. */
int ckpt_store_save(struct ckpt_store *s, uint64_t key, uint64_t rng_state, int n_prompt,
                    const struct gen_token *tokens, int n_generated);
/* Reads key's checkpoint for a prompt of n_prompt tokens: 0 with *out filled (release with
 * ckpt_free), -INFERD_ENOENT when there is none (or it does not parse, or is for another
 * prompt length). */
int ckpt_store_load(struct ckpt_store *s, uint64_t key, int n_prompt, struct ckpt *out);
/* Queues the removal of key's checkpoint (a generation that completed). */
void ckpt_store_remove(struct ckpt_store *s, uint64_t key);
void ckpt_store_stats(struct ckpt_store *s, struct ckpt_stats *out);
/* Counts one resumed generation. */
void ckpt_store_note_resumed(struct ckpt_store *s);

void ckpt_free(struct ckpt *c);

#endif
