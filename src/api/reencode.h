/* api/reencode.h — exact re-encoding: a prompt that resends text the model generated earlier gets
 * the model's own token ids for it back, instead of the tokenizer's encoding of that text.
 *
 * Why: a sampled reply ("Hel" + "lo") often re-tokenizes differently ("Hello"), so without this
 * the next turn's prompt ids diverge where the previous answer starts and the prefix cache misses
 * everything after it.
 *
 * The rule. After a request finishes, its whole sequence is remembered as one entry: the text
 * (the prompt's text, then the generated text the client was given) and its ids (the prompt's
 * ids, then the generated ids), with a list of cuts — (bytes of text, ids) pairs at the end of a
 * generation, where the text before the cut decodes from exactly the ids before it. A new prompt
 * text is encoded as ids[0..n) + tok_encode(text[off..]) (the remainder as the tokenizer encodes
 * it on its own, so special tokens in template text still become their ids), where (off, n) is
 * the longest cut of any entry of the same namespace whose text[0..off) is a prefix of the new
 * text; with no such cut, as plain tok_encode. Cuts sit only where a generation ended, never at
 * the end of a prompt, so the only non-canonical splits ever introduced are the model's own.
 *
 * - Consistency: a generation is remembered only as far as its ids decode to exactly the text
 *   the client got. When a stop string cut the text while tokens ran on, or the last bytes were
 *   held back as incomplete UTF-8, the entry ends at the last token whose text lies wholly inside
 *   the emitted text (checked by decoding); nothing is kept when no token does.
 * - One entry per conversation branch: a new entry whose leading text and ids equal an older
 *   entry's (up to the older one's last cut) takes over its cuts and replaces it, so a chat of N
 *   turns costs one entry, not N.
 * - Namespaces: entries are keyed by the requester's cache namespace (gen_params.cache_ns) and by
 *   whether the prompt was encoded with the tokenizer's added special tokens (completions) or
 *   without (chat); one tenant's text never selects another tenant's ids.
 * - Bounded: the bytes of all entries (text, ids, cuts, bookkeeping) stay under a fixed cap
 *   (REENCODE_MAX_BYTES in the server); past it the least recently used entries are dropped.
 * - Threads: HTTP handler threads call this twice per request (when the prompt is built, before
 *   the submit, and after the reply is finished); the engine thread never does, so the one lock
 *   here is off the engine's hot path. Tokenizing and the decode check run outside the lock.
 */
#ifndef INFERD_API_REENCODE_H
#define INFERD_API_REENCODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "text/tokenizer.h"

/* The server's cap on the bytes the map holds: 64 MiB (about a million tokens of conversation). */
#define REENCODE_MAX_BYTES ((size_t)64 << 20)

struct reencode;

/* A map over tok (borrowed; must outlive it) holding at most max_bytes (0: remembers nothing,
 * encodes plainly). */
int reencode_create(const struct tokenizer *tok, size_t max_bytes, struct reencode **out,
                    struct err *err);
void reencode_free(struct reencode *r);

/* Encodes len bytes of text for namespace ns as tok_encode(tok, text, len, add_special) would,
 * except for the longest remembered cut (see the rule above). *ids is malloc'd (caller frees);
 * *n_reused (may be NULL) gets how many leading ids came from memory (0: plain encoding). */
int reencode_encode(struct reencode *r, uint64_t ns, bool add_special, const char *text,
                    size_t len, int32_t **ids, int *n_ids, int *n_reused, struct err *err);

/* A finished generation of namespace ns: prompt_text was encoded (by reencode_encode with the same
 * ns and add_special) as prompt_ids, then the model generated gen_ids (end-of-sequence excluded)
 * and the client was given gen_text. Remembers the consistent part (see the rule above). Returns
 * 0, also when nothing was kept; -INFERD_ENOMEM when memory ran out (nothing changed). */
int reencode_remember(struct reencode *r, uint64_t ns, bool add_special, const char *prompt_text,
                      size_t prompt_len, const int32_t *prompt_ids, int n_prompt,
                      const char *gen_text, size_t gen_len, const int32_t *gen_ids, int n_gen,
                      struct err *err);

struct reencode_stats {
    size_t entries, bytes, max_bytes;
    uint64_t hits;      /* encodes that reused remembered ids */
    uint64_t misses;    /* encodes that found no cut */
    uint64_t evictions; /* entries dropped for space (not those replaced by a longer branch) */
};
void reencode_get_stats(struct reencode *r, struct reencode_stats *out);

#endif
