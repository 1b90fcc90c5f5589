/* kv/kv.h — the paged KV cache: its block size, its element format, the pool of fixed-size
 * blocks with reference counts, and the narrow manager the engine schedules through. */
#ifndef INFERD_KV_KV_H
#define INFERD_KV_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"
#include "kv/ssd.h"
#include "model/model.h"

/* ---- layout ----------------------------------------------------------------
 * The cache is cut into blocks of block_size token positions. A sequence owns
 * a block table: position p of the sequence lives in slot p % block_size of
 * block table[p / block_size]. Blocks are shared between sequences by
 * reference count (a prefix found in a cache), so a table's blocks need not be
 * contiguous or distinct from another table's:
 *
 *     sequence A  table [ 7 | 2 | 9 ]      positions 0..47 (block_size 16)
 *     sequence B  table [ 7 | 4 ]          shares A's first 16 positions
 *     pool        refcount[7] = 2, refcount[2] = refcount[9] = refcount[4] = 1
 *
 * In memory (struct kv_cache, which the backend reads), element
 * (layer, block, slot, kv_head, d) of K is at
 *     k + ((layer * n_blocks + block) * block_size + slot) * kv_dim + kv_head * head_dim + d
 * with kv_dim = n_kv_heads * head_dim, each element kv_format.dtype; V likewise.
 * A quantized format (kv_format.quant, backend/kv_quant.h: affine 8/4-bit or
 * TurboQuant, per layer) keeps each slot's row as n_kv_heads records, codes
 * with their scales inside, at a byte pitch of kv_format_row_bytes: the widest
 * layer's row, so every layer of a block is one strided run as before. */

/* The block size every cache is created with unless a caller asks otherwise.
 * Everything else reads the size from the pool or manager it holds. */
#define KV_BLOCK_SIZE_DEFAULT 16

/* Blocks of block_size positions that cover n_positions positions. */
static inline int kv_blocks_for(int n_positions, int block_size)
{
    return (n_positions + block_size - 1) / block_size;
}

enum kv_scale_layout {
    KV_SCALES_NONE = 0,  /* values are stored as they are (f32, f16, bf16) */
    KV_SCALES_IN_RECORD, /* quantized: each head's record holds its codes and scales */
};

/* How one K or V element is stored. */
struct kv_format {
    enum dtype dtype;            /* element type of the stored values */
    int group_size;              /* values sharing one scale; 0: no scales */
    enum kv_scale_layout scales; /* where the scales live; KV_SCALES_NONE when group_size is 0 */
    int scale_bytes;             /* bytes of one scale; 0 without scales */
    const struct kv_quant *quant; /* borrowed (the backend's); NULL: not quantized */
};

/* The format of a cache whose elements are dtype (no scales). */
struct kv_format kv_format_of_dtype(enum dtype dtype);
/* The format of the caches be reads and writes (its kv_dtype and kv_quant). */
struct kv_format kv_format_of_backend(const struct backend *be);
/* Bytes of one slot's K (v false) or V row in one layer:
 *   kv_dim * dtype_size + kv_dim / group_size * scale_bytes, or, quantized,
 *   n_kv_heads * kvq_head_bytes of the widest layer, rounded up to 16 bytes. */
size_t kv_format_row_bytes(const struct model_config *c, const struct kv_format *f, bool v);
/* Bytes of K and V together, over every layer, for one token position:
 *   n_layers * (K row bytes + V row bytes). */
size_t kv_format_bytes_per_token(const struct model_config *c, const struct kv_format *f);
/* kv_format_bytes_per_token * block_size: one block in every layer, K and V. */
size_t kv_format_bytes_per_block(const struct model_config *c, const struct kv_format *f,
                                 int block_size);

/* The cache key of the format, as clients of local servers know them: "bf16" (or "f32",
 * "f16"), "kv8", "kv4" (group 64; "kv8g32" at group 32), "turbo-k8v3"
 * ("-qjl" with the QJL residual), "config" for a per-layer config. */
void kv_format_name(const struct kv_format *f, char *buf, size_t cap);
/* The name of one layer's format (as above, never "config"). */
void kv_format_layer_name(const struct kv_format *f, int layer, char *buf, size_t cap);
/* Identity of the stored bytes: dtype, scheme of every layer, rotation seed
 * and config digest; what the prefix cache's namespace mixes in. */
uint64_t kv_format_digest(const struct kv_format *f);
/* -INFERD_EINVAL or -INFERD_EUNSUPPORTED when f cannot hold model c's K/V
 * (a per-layer config for another layer count, head_dim not a multiple of
 * 16, a group size that does not divide it). */
int kv_format_check(const struct model_config *c, const struct kv_format *f, struct err *err);

/* ---- codec: a block in another format ---------------------------------------
 * A block as the tiers lay it out - layer by layer, block_size K rows then
 * block_size V rows, each kv_format_row_bytes wide - re-encoded record by
 * record from a live format into a colder (quantized, smaller) one and back:
 * each record dequantized (kvq_dequantize_head; f32, f16 or bf16 elements
 * widened) and quantized again (kvq_quantize_head; elements rounded). What
 * the SSD tier's --ssd-kv-format stores; a restored block carries the cold
 * format's error (and, into a quantized live format, the live one's again). */
struct kv_codec;
/* -INFERD_EINVAL when cold is not quantized or either format cannot hold c's K/V. */
int kv_codec_create(const struct model_config *c, int block_size, const struct kv_format *live,
                    const struct kv_format *cold, struct kv_codec **out, struct err *err);
void kv_codec_free(struct kv_codec *k);
/* Bytes of one block in the cold format (cold) or the live one. */
size_t kv_codec_block_bytes(const struct kv_codec *k, bool cold);
/* live block -> cold block, and back; not thread-safe (scratch inside). */
void kv_codec_encode(struct kv_codec *k, const void *live, void *cold);
void kv_codec_decode(struct kv_codec *k, const void *cold, void *live);

/* ---- pool ----------------------------------------------------------------- */

/* A windowed pool keeps the sliding-window layers (model_config_layer_windowed)
 * apart from the others, so that a block behind every window stops costing
 * them memory:
 *
 *     cache         the other layers, n_blocks blocks      (block b)
 *     cache.window  the window layers, n_slots slots       (slot window_slot[b])
 *
 *     sequence  table [ 7 | 2 | 9 | 4 ]   positions 0..63, window 24, block_size 16
 *     slots           [ - | - | 3 | 0 ]   blocks 7 and 2 lie before the window of
 *                                         every query to come: no slot; 9 and 4 have one
 *
 * A block has at most one slot, taken when the block is allocated for new
 * positions (or copied), with its own reference count: the sequences whose
 * window still covers the block hold one each, and the prefix cache one for
 * each block it caches while the block still has its slot (published blocks
 * have theirs, and so do a retired sequence's last window's), which it gives
 * up, least recently used first, when running sequences need slots. A slot
 * is given back when its last holder lets go, and always when its block is
 * freed. The slots are sized for the running sequences' windows, not their
 * contexts: the memory the window layers save. */
#define KV_NO_SLOT UINT32_MAX

struct kv_pool {
    struct kv_cache cache;   /* storage; cache.k/v owned (backend memory) */
    struct kv_format format; /* the backend's (kv_format_of_backend) */
    struct backend *backend; /* borrowed */
    uint32_t *refcount;      /* owned; n_blocks */
    uint32_t *free_list;     /* owned; stack of free block ids */
    int n_free;
    /* Windowed pools only (window.n_blocks slots; 0 otherwise): */
    struct kv_cache window;  /* the window layers' storage; k/v owned */
    uint32_t *window_slot;   /* owned; n_blocks: block b's slot, or KV_NO_SLOT */
    uint32_t *slot_refs;     /* owned; window.n_blocks */
    uint32_t *slot_free;     /* owned; stack of free slots */
    int n_slot_free;
    bool *cache_slot;        /* owned; n_blocks: the prefix cache holds a reference to b's slot */
    int32_t *layer_index;    /* owned; the model's n_layers (kv_cache.layer_index) */
};

/* Sizes the pool for n_blocks blocks of block_size tokens for model m, in the
 * format of be (kv_format_of_backend). */
int kv_pool_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                   struct kv_pool **out, struct err *err);
/* The same with the window layers apart in n_slots slots (at most n_blocks).
 * A plain pool when m has no window layer or the KV format is quantized (its
 * per-layer formats are indexed by model layer). */
int kv_pool_create_windowed(const struct model *m, struct backend *be, int n_blocks, int n_slots,
                            int block_size, struct kv_pool **out, struct err *err);
void kv_pool_free(struct kv_pool *pool);
static inline bool kv_pool_windowed(const struct kv_pool *pool) { return pool->window_slot; }

/* Returns a block with refcount 1, or -INFERD_ENOMEM when none is free. */
int kv_pool_alloc(struct kv_pool *pool, uint32_t *block_out, struct err *err);
void kv_pool_retain(struct kv_pool *pool, uint32_t block);
/* The last release frees the block and its slot, whoever held the slot. */
void kv_pool_release(struct kv_pool *pool, uint32_t block);
/* Gives block (which has no slot) a slot with one reference; -INFERD_ENOMEM
 * when none is free. */
int kv_pool_slot_alloc(struct kv_pool *pool, uint32_t block, struct err *err);
/* Another reference to block's slot (which it has), or one fewer. */
void kv_pool_slot_retain(struct kv_pool *pool, uint32_t block);
void kv_pool_slot_release(struct kv_pool *pool, uint32_t block);

/* Blocks that cover n_positions positions. */
int kv_pool_blocks_for(const struct kv_pool *pool, int n_positions);

/* A sequence's blocks in position order. */
struct block_table {
    uint32_t *blocks; /* owned; n_blocks used of cap */
    int n_blocks, cap;
};

void block_table_init(struct block_table *bt);
/* Room in bt for n_blocks entries (no blocks allocated); -INFERD_ENOMEM leaves bt as it was. */
int block_table_grow(struct block_table *bt, int n_blocks, struct err *err);
/* Grows bt with fresh blocks until it covers n_positions token positions. */
int block_table_reserve(struct kv_pool *pool, struct block_table *bt, int n_positions,
                        struct err *err);
/* Releases every block back to the pool and empties bt. */
void block_table_clear(struct kv_pool *pool, struct block_table *bt);

/* ---- manager ---------------------------------------------------------------
 * What the engine asks of the cache, in the shape of a scheduler's KV manager:
 * how much of a sequence is already computed, slots for its next tokens (all
 * or nothing), and giving blocks back. */

/* One sequence's share of the cache. The first n_cached positions sit in
 * blocks that were found already computed (attached with a reference each,
 * possibly shared with other sequences, never written); slots for positions
 * [0, n_tokens) are allocated. */
struct kv_seq {
    struct block_table table;
    int n_tokens; /* positions with a slot: computed, or being computed this step */
    int n_cached; /* leading positions whose K/V came from a cache; <= n_tokens */
    /* Set by the owner before the first lookup: */
    uint64_t ns;          /* the requester's namespace (gen_params.cache_ns); 0: the default */
    const char *session;  /* borrowed; session affinity of what this sequence publishes, or NULL */
    int n_retain;         /* a retention hint: full blocks within the first n_retain positions
                             are published as a session's (under one named after ns when
                             session is NULL), so they are evicted after plain blocks; 0: none */
    /* The prefix cache's bookkeeping (kv_manager_publish): */
    int n_published;      /* leading full blocks whose content is in the cache */
    int64_t chain_block;  /* the cache entry holding block n_published - 1 (-1: none) */
    uint64_t chain_gen;   /* that entry's generation, to notice it was evicted meanwhile */
    uint64_t chain_hash;  /* the hash chain up to it */
    /* The SSD tier's reads into this sequence's blocks (kv_manager_loading): */
    int n_loading;        /* blocks still being read */
    int loading_from;     /* the first block read from disk (valid while n_loading > 0) */
    /* A windowed pool: the sequence holds a reference to the slot of each of
     * its blocks from this one on (those before are behind its window). */
    int window_from;
};

struct kv_manager;

/* A manager over a fresh pool of n_blocks blocks of block_size positions. */
int kv_manager_create(const struct model *m, struct backend *be, int n_blocks, int block_size,
                      struct kv_manager **out, struct err *err);
void kv_manager_destroy(struct kv_manager *mgr);

void kv_seq_init(struct kv_seq *seq);

/* How many leading tokens of tokens[0, n) already have K/V for seq, called as
 * a sequence is admitted. For an empty seq with the prefix cache on, this is
 * the cache lookup (kv_prefix_lookup under seq->ns): the longest verified
 * chain of cached full blocks is attached (one reference each), then the
 * longest prefix of a cached child block that matches the next tokens is
 * copied into a fresh block of seq's own (backend kv_copy_slots); at most
 * n - 1 tokens are reused, so the last one is always computed. seq->n_tokens
 * and n_cached become the answer. For a seq that already holds blocks (or
 * with the cache off) nothing is looked up: the answer is seq->n_cached. */
int kv_manager_computed_blocks(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                               int n);

/* Slots for n_new_tokens positions after seq's n_tokens. Returns 0, or
 * -INFERD_ENOMEM when the pool (or memory for the table) cannot hold them:
 * then neither seq nor the pool has changed. */
int kv_manager_allocate_slots(struct kv_manager *mgr, struct kv_seq *seq, int n_new_tokens,
                              struct err *err);

/* Drops positions from n_tokens on; blocks no longer covering a position are
 * released (a shared block lives on in its other tables). */
void kv_manager_truncate(struct kv_manager *mgr, struct kv_seq *seq, int n_tokens);

/* Gives every block of seq back and empties it (it stays usable). */
void kv_manager_free(struct kv_manager *mgr, struct kv_seq *seq);

/* Appends blocks that already hold computed K/V (n_blocks full blocks, e.g.
 * found in a prefix cache) to the empty seq, one reference each; they count
 * as cached positions. Returns 0, -INFERD_EINVAL when seq is not empty, or
 * -INFERD_ENOMEM (seq unchanged). */
int kv_manager_attach(struct kv_manager *mgr, struct kv_seq *seq, const uint32_t *blocks,
                      int n_blocks, struct err *err);

/* Makes the empty dst continue src, a sequence in its final step: dst takes
 * a reference to each of src's blocks and counts src's n_tokens positions as
 * cached, chain state included, so it publishes on from where src left off.
 * The one exception to copy on write: src's last block may be partial and is
 * then shared while src writes its last slot (in its final step, which runs
 * no later than dst's first) and dst the slots after it; src never writes
 * again and, sharing the block, never caches it as a partial entry. Counts as
 * a lookup that reused src->n_tokens tokens. Returns 0, -INFERD_EINVAL when
 * dst is not empty, or -INFERD_ENOMEM (dst unchanged). */
int kv_manager_continue(struct kv_manager *mgr, struct kv_seq *dst, const struct kv_seq *src,
                        struct err *err);

/* A manager whose pool keeps the window layers apart in n_slots slots
 * (kv_pool_create_windowed; a plain one for a model without window layers or
 * with a quantized KV format). A sequence then holds slots only for blocks
 * its window still covers: those holding positions from
 * n_tokens - 1 - (sliding_window - 1) on, n_tokens as at its last
 * allocate_slots, so a truncation by one position (a recomputed last token)
 * keeps its window; one further back than its slots reach empties it (to be
 * computed again). A prefix cache hit is cut to the longest prefix whose
 * window has all its slots (the cache keeps them while slots are free). No
 * SSD tier (its blocks carry every layer): kv_manager_tier_enable refuses. */
int kv_manager_create_windowed(const struct model *m, struct backend *be, int n_blocks,
                               int n_slots, int block_size, struct kv_manager **out,
                               struct err *err);
/* Window slots nobody holds, and all of them (0 and 0 for a plain pool). */
int kv_manager_free_slots(const struct kv_manager *mgr);
int kv_manager_total_slots(const struct kv_manager *mgr);
/* Slots a sequence may hold at once while it computes up to chunk tokens a
 * step: its window behind the chunk and the chunk, in blocks. */
int kv_manager_slots_per_seq(const struct model_config *c, int block_size, int chunk);

/* Blocks nobody holds. */
int kv_manager_free_blocks(const struct kv_manager *mgr);
/* What admission may count on: free blocks plus cached blocks that only the
 * cache holds (allocation evicts them before it fails). An upper bound: a
 * cached block whose cached child is still held cannot go before its child. */
int kv_manager_available_blocks(const struct kv_manager *mgr);
int kv_manager_total_blocks(const struct kv_manager *mgr);
int kv_manager_block_size(const struct kv_manager *mgr);
/* Blocks that cover n_tokens positions. */
int kv_manager_blocks_for(const struct kv_manager *mgr, int n_tokens);
/* The storage the forward pass reads and writes. */
struct kv_cache *kv_manager_cache(struct kv_manager *mgr);
/* The pool underneath, for reference counts in tests. */
struct kv_pool *kv_manager_pool(struct kv_manager *mgr);

/* ---- prefix cache ------------------------------------------------------------
 * Full blocks of computed K/V, content-addressed, kept after their sequence is
 * gone so that a later prompt with the same prefix skips computing it. The
 * manager owns the cache (kv_manager_prefix_enable); the engine thread is its
 * only user, so nothing here locks.
 *
 *   h(block i) = H(h(block i - 1), tokens of block i, ns)      h(block -1) = ns
 *   ns         = H(model digest, KV format, block size, the request's cache_ns)
 *
 * A hash only finds candidates: every cached block keeps its token ids, its
 * parent entry and its namespace, and a hit is verified token by token against
 * the prompt and by parent identity, so a collision can never hand out K/V
 * computed for other tokens. The cache holds one pool reference per cached
 * block, running sequences one each; a block only the cache holds is
 * "unreferenced".
 *
 * The partially filled last block of a sequence that is let go of (finished,
 * cancelled, preempted: kv_manager_retire) is cached too, as a partial entry:
 * its valid length n < block_size is kept, it is a leaf (never a parent), it
 * is never written again (its sequence is gone and nothing else holds it) and
 * never attached by reference: lookups copy its matching slots, as for any
 * block the prompt only partly matches. It costs a whole block against
 * max_bytes. One entry per prefix relation: under one parent (and namespace),
 * a partial entry whose tokens start another entry's (a full block, or a
 * longer partial one) is dropped when that entry is cached, and a partial
 * block whose tokens start an entry already cached is not cached at all.
 *
 *     prompt   [a b c d][e f g h][i j k]        block_size 4
 *     cache    X=[a b c d] ── Y=[e f g h] ── Z=[i j x y]
 *                                        └── P=[i j k .] (partial, n = 3)
 *     lookup   attaches X, Y (shared), copies the longest match among Y's
 *              children, slots 0..1 of Z or P ([i j]; n - 1 = 10 caps it) into
 *              a fresh block of the sequence's own; n_cached = 10; k is computed.
 *
 * Eviction (when allocation finds no free block, or when unreferenced cached
 * bytes pass max_bytes) takes unreferenced leaves only (never a block whose
 * child is still cached), blocks of open sessions after all others, and among
 * equals the least recently used (lru) or the lowest GreedyDual-Size priority
 * (cost-size: priority = clock + reused tokens / block bytes at the block's
 * last use; the clock becomes each victim's priority). */

enum kv_retention { KV_RETAIN_LRU = 0, KV_RETAIN_COST_SIZE };

struct kv_prefix_config {
    size_t max_bytes;             /* cap on unreferenced cached bytes; 0: the cache is off */
    enum kv_retention retention;
    uint64_t model_digest;        /* identity of the weights, tokenizer and architecture */
    uint64_t session_idle_ns;     /* a session unused this long closes; 0: never */
};

struct kv_prefix_stats {
    uint64_t blocks;              /* cached blocks (held by sequences or not) */
    uint64_t partial_blocks;      /* of which partial entries */
    uint64_t bytes;               /* their K/V bytes */
    uint64_t unreferenced_blocks; /* cached blocks only the cache holds */
    uint64_t max_bytes;           /* the cap on unreferenced bytes */
    uint64_t hits, misses;        /* lookups that reused at least one token / none */
    uint64_t hit_tokens;          /* tokens reused */
    uint64_t evictions;           /* blocks evicted */
    uint64_t session_hits, session_misses; /* lookups of sequences with a session */
    uint64_t sessions;            /* open sessions */
};

/* Turns the prefix cache on (max_bytes > 0) over mgr's pool, which must hold
 * no blocks yet. */
int kv_manager_prefix_enable(struct kv_manager *mgr, const struct kv_prefix_config *cfg,
                             struct err *err);
bool kv_manager_prefix_enabled(const struct kv_manager *mgr);

/* Publishes seq's full blocks among tokens[0, n_computed) (positions whose
 * K/V are computed) that are not yet in the cache, continuing seq's chain;
 * a block whose content is already cached (a concurrent sequence published
 * it first) is skipped and the chain continues through the cached one. Blocks
 * are marked with seq->session when it is set, and those within seq->n_retain
 * positions with the retention session of seq->ns when it is not. No-op with
 * the cache off. */
void kv_manager_publish(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                        int n_computed);

/* Lets go of a sequence that is done (finished, cancelled, or preempted to be
 * recomputed): publishes its full blocks among tokens[0, n_computed) as
 * kv_manager_publish does, then its partially filled last block as a partial
 * entry (when seq alone holds that block), then frees seq as
 * kv_manager_free. With the cache off it only frees. */
void kv_manager_retire(struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
                       int n_computed);

/* Ends session affinity for session_id: its blocks become plain LRU blocks.
 * Returns how many blocks it marked (>= 0), or -1 when no such session is open. */
int kv_manager_close_session(struct kv_manager *mgr, const char *session_id);

/* Advances the manager's clock to now_ns (monotonic) and closes the sessions
 * idle for longer than session_idle_ns. */
void kv_manager_tick(struct kv_manager *mgr, uint64_t now_ns);

/* Evicts every cached block only the cache holds and forgets the rest (their
 * sequences keep them); the statistics stay. */
void kv_manager_prefix_clear(struct kv_manager *mgr);

void kv_manager_prefix_stats(const struct kv_manager *mgr, struct kv_prefix_stats *out);

/* ---- the SSD tier ------------------------------------------------------------
 * Below the prefix cache, through kv/ssd.h's block store (kv/tier.c). Every
 * full block the cache takes in is copied to host memory and queued for
 * writing (write-behind, on the store's I/O thread); when the queue is full
 * the block is remembered and queued later, and one that must leave memory
 * before that waits for room. A lookup whose verified chain ends in memory
 * goes on on disk (ssd_store_contains, the same hashes): when the cost model
 * predicts that reading those blocks is faster than computing them (their
 * bytes at the store's measured read rate against their tokens at
 * prefill_tokens_per_s), they are read into fresh blocks of the sequence
 * while other sequences keep stepping; the sequence waits until they are in
 * (kv_manager_loading). A block that fails its verification is dropped with
 * every block after it, and the sequence computes them. Durable blocks unused
 * for demote_idle_ns may leave memory. */

/* Which disk blocks a lookup reads: as the cost model says, every one found, or none. */
enum kv_tier_restore { KV_RESTORE_AUTO = 0, KV_RESTORE_ALWAYS, KV_RESTORE_NEVER };

struct kv_tier_config {
    struct ssd_config store;       /* dir, cap, verification, fingerprint; dir NULL: no SSD tier */
    size_t host_bytes;             /* the host-RAM tier under a device pool: blocks leaving it
                                      are kept in host memory up to this many bytes (0: none) */
    uint64_t demote_idle_ns;       /* durable cached blocks unused this long leave memory; 0: never */
    double prefill_tokens_per_s;   /* the recompute rate of the cost model; 0: always read */
    enum kv_tier_restore restore;  /* AUTO: the cost model decides */
    /* --ssd-kv-format: blocks go to disk in this (quantized) format and are
     * restored into the live one (kv_codec); NULL: the live format */
    const struct kv_quant *cold;
};

struct kv_tier_stats {
    bool enabled;
    struct ssd_stats store;
    double read_bytes_per_s;       /* the store's measured read rate */
    double prefill_tokens_per_s;   /* the cost model's recompute rate */
    double predicted_restore_ms, predicted_recompute_ms; /* of the last decision */
    uint64_t decisions_restore, decisions_recompute;
    uint64_t recomputes;           /* blocks found on disk but computed after a failed read */
    uint64_t loading;              /* blocks being read now */
    uint64_t unsaved;              /* cached blocks waiting for room in the write queue */
    uint64_t demoted;              /* durable blocks that left memory after demote_idle_ns */
    uint64_t host_blocks, host_bytes, host_max_bytes; /* the host-RAM tier now */
    uint64_t host_hits;            /* blocks copied back from it into the pool */
    uint64_t host_stores, host_evictions;
    /* --ssd-kv-format: the disk's format and what it saves: blocks written
     * in it, and their bytes in the live format less on disk */
    char cold_format[32];          /* "" without one */
    uint64_t cold_blocks, cold_bytes_saved;
};

/* Opens the store and hangs the tier under the prefix cache (which must be
 * on). Only a DIR that cannot be created or written is an error. */
int kv_manager_tier_enable(struct kv_manager *mgr, const struct kv_tier_config *cfg,
                           struct err *err);
bool kv_manager_tier_enabled(const struct kv_manager *mgr);
/* Takes the store's finished operations: written blocks' host copies freed,
 * read blocks copied into their pool blocks (or, failed, dropped with the
 * rest of their sequence's disk blocks); queues remembered blocks while the
 * write queue has room; demotes idle durable blocks now and then. */
void kv_manager_tier_poll(struct kv_manager *mgr, bool idle);
/* Cached blocks not yet queued for writing (0 without a tier). */
int kv_manager_tier_unsaved(const struct kv_manager *mgr);
/* True while reads are in flight (the engine then waits on the store). */
bool kv_manager_tier_busy(const struct kv_manager *mgr);
/* Blocks up to timeout_ms until the store has something finished. */
void kv_manager_tier_wait(struct kv_manager *mgr, int timeout_ms);
/* True while some of seq's blocks are still being read. */
bool kv_manager_loading(const struct kv_manager *mgr, const struct kv_seq *seq);
/* Queues every cached block not yet written and waits until all is durable:
 * 0; -INFERD_EBUSY when timeout_ms (< 0: no limit) passed first;
 * -INFERD_EIO when the tier is off; -INFERD_EINVAL when there is no tier. */
int kv_manager_tier_flush(struct kv_manager *mgr, int timeout_ms, struct err *err);
void kv_manager_tier_stats(const struct kv_manager *mgr, struct kv_tier_stats *out);

/* The tier itself, driven by the manager. */
struct kv_tier;
struct kv_prefix;
int kv_tier_create(struct kv_pool *pool, struct kv_prefix *prefix, size_t block_bytes,
                   const struct kv_tier_config *cfg, struct kv_tier **out, struct err *err);
void kv_tier_free(struct kv_tier *t);
/* Continues seq's verified chain (ending at chain_hash, n_blocks blocks in,
 * under ns) on disk for tokens[0, limit): returns how many blocks it queued
 * reads for, appended to seq's table (0 when none, or when computing them is
 * predicted to be faster). make_free gives a free pool block. */
int kv_tier_continue(struct kv_tier *t, struct kv_seq *seq, const int32_t *tokens, int limit,
                     uint64_t chain_hash, uint64_t ns, bool (*make_free)(void *ctx), void *ctx);
/* The manager is being destroyed: blocks leaving the cache from now on are
 * not kept in host memory (their writes, if still owed, are). */
void kv_tier_closing(struct kv_tier *t);
/* seq is let go of: its reads in flight write nowhere. */
void kv_tier_forget(struct kv_tier *t, const struct kv_seq *seq);
/* The manager whose sequences the tier's failed reads truncate. */
void kv_tier_set_manager(struct kv_tier *t, struct kv_manager *mgr);
/* idle: the engine has nothing to run, so remembered blocks are copied and
 * queued for a slice of time; else for a small share of the time since the
 * last poll. */
void kv_tier_poll(struct kv_tier *t, bool idle);
bool kv_tier_busy(const struct kv_tier *t);
/* Cached blocks not yet copied and queued for writing. */
int kv_tier_unsaved(const struct kv_tier *t);
void kv_tier_wait(struct kv_tier *t, int timeout_ms);
int kv_tier_flush(struct kv_tier *t, int timeout_ms, struct err *err);
void kv_tier_stats(const struct kv_tier *t, struct kv_tier_stats *out);

/* The cache itself (kv/prefix.c), driven by the manager, which routes every
 * reference count change of a block through kv_prefix_after_refcount. */
struct kv_prefix;
int kv_prefix_create(struct kv_pool *pool, size_t block_bytes, const struct kv_prefix_config *cfg,
                     struct kv_prefix **out, struct err *err);
void kv_prefix_free(struct kv_prefix *p);
/* The longest verified chain of cached full blocks for tokens[0, limit) under
 * cache_ns into chain (room for limit / block_size); returns its length.
 * *partial_src is the cached child of the chain's end sharing the longest
 * prefix (*partial_n >= 1 tokens, within limit) with the tokens after it, or
 * -1. Nothing is retained: the caller attaches. */
int kv_prefix_lookup(struct kv_prefix *p, uint64_t cache_ns, const int32_t *tokens, int limit,
                     uint32_t *chain, int *partial_src, int *partial_n);
/* Counts one lookup that reused n_reused tokens (session: the sequence's, or NULL). */
void kv_prefix_note_lookup(struct kv_prefix *p, const char *session, int n_reused);
void kv_prefix_publish(struct kv_prefix *p, struct kv_seq *seq, const int32_t *tokens,
                       int n_computed);
/* Caches seq's block holding positions [n_computed / bs * bs, n_computed) as a
 * partial entry under seq's (re-walked if evicted) chain; nothing when that
 * block is full, shared, or its prefix is already covered. */
void kv_prefix_publish_partial(struct kv_prefix *p, struct kv_seq *seq, const int32_t *tokens,
                               int n_computed);
/* What the tier below the cache (kv/tier.c) is told: a full block was just
 * cached (inserted), or is about to leave the cache (leaving; its K/V are
 * still in the pool then). Both run on the cache's thread, inside the
 * publish or eviction that caused them. */
struct kv_prefix_hooks {
    void (*inserted)(void *ctx, uint32_t block);
    void (*leaving)(void *ctx, uint32_t block);
    void *ctx;
};
void kv_prefix_set_hooks(struct kv_prefix *p, const struct kv_prefix_hooks *hooks);

/* A cached block as the tier below addresses it. */
struct kv_prefix_entry {
    uint64_t hash, parent_hash, ns; /* parent_hash: the namespace for a first block */
    const int32_t *tokens;          /* borrowed; n_tokens, valid while the block is cached */
    int n_tokens;                   /* block_size, or fewer for a partial entry */
    uint64_t gen;                   /* changes whenever the block is cached anew */
    uint64_t used_ns;               /* the manager's clock at its last use */
};
/* False when block is not cached. */
bool kv_prefix_entry(const struct kv_prefix *p, uint32_t block, struct kv_prefix_entry *out);
/* Evicts the full, unreferenced leaves last used before idle_since_ns that
 * may_go allows; returns how many went. */
int kv_prefix_evict_idle(struct kv_prefix *p, uint64_t idle_since_ns,
                         bool (*may_go)(void *ctx, uint32_t block), void *ctx);
/* After block's pool reference count changed: keeps the eviction order. */
void kv_prefix_after_refcount(struct kv_prefix *p, uint32_t block);
/* Evicts the first victim; false when no cached block is evictable. */
bool kv_prefix_evict_one(struct kv_prefix *p);
/* Evicts until the unreferenced cached bytes are within max_bytes. */
void kv_prefix_enforce_cap(struct kv_prefix *p);
int kv_prefix_unreferenced_blocks(const struct kv_prefix *p);
int kv_prefix_close_session(struct kv_prefix *p, const char *session_id);
void kv_prefix_tick(struct kv_prefix *p, uint64_t now_ns);
void kv_prefix_clear(struct kv_prefix *p);
void kv_prefix_get_stats(const struct kv_prefix *p, struct kv_prefix_stats *out);

/* The namespace a request's blocks are addressed under (the ns above). */
uint64_t kv_prefix_namespace(uint64_t model_digest, const struct kv_format *format,
                             int block_size, uint64_t cache_ns);
/* The namespace of a request's cache_ns in p (kv_prefix_namespace with p's model and format). */
uint64_t kv_prefix_namespace_of(const struct kv_prefix *p, uint64_t cache_ns);
/* The chain hash of cached block (up to and including it). */
uint64_t kv_prefix_block_hash(const struct kv_prefix *p, uint32_t block);
/* One link of the hash chain: H(parent, tokens[0, n), ns). */
uint64_t kv_prefix_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t ns);

#endif
