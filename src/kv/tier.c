/* kv/tier.c — the SSD tier under the prefix cache: full blocks written behind through kv/ssd.h's
 * store, chains continued on disk and read back into a sequence's blocks while the engine
 * steps (when reading beats computing), idle durable blocks demoted out of memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/timer.h"
#include "kv/kv.h"

/* A block that leaves memory before its write could be queued waits this
 * long for room in the queue before it is given up (counted as dropped). */
#define TIER_FORCE_WAIT_MS 2000
/* Idle durable blocks are looked for at most this often. */
#define TIER_DEMOTE_EVERY_NS 1000000000ull
#define TIER_POLL_BATCH 64
/* Write buffers kept for reuse. */
#define TIER_SPARE_BUFFERS 64
/* The share of the engine's time spent copying cached blocks to host memory
 * for writing while it has work: decode with write-behind running is to stay
 * within 2% of the tier off, and the tier's other per-step work (polling the
 * store and the remembered blocks) measured about 1% on an H200 (8B decode:
 * -2.5% at a 1.5% share). */
#ifndef TIER_COPY_SHARE
#define TIER_COPY_SHARE 0.008
#endif
/* Idle, copies go on in slices this long, so a request that comes waits at most one. */
#define TIER_IDLE_SLICE_NS 20000000ull

/* A read in flight into one block of a sequence. */
struct tier_read {
    struct kv_seq *seq; /* NULL: free slot, or forgotten (the sequence went away) */
    bool used;
    int index;          /* the block's place in seq's table */
    uint32_t block;     /* held by the read while it is in flight when it reads in place */
    void *host;         /* owned; the block's bytes as the store hands them back; NULL: read
                           straight into the pool block (in_place) */
};

/* A block kept in host memory after it left a device pool (the host-RAM
 * tier), found again by its chain hash and namespace. */
struct host_block {
    uint64_t hash, ns;
    char *data;       /* owned; block_bytes, laid out as copy_out writes it (allocated when
                         first filled: a tier never filled costs no memory) */
    int32_t bucket_next, newer, older; /* hash chain (free chain when unused); LRU list */
    bool used;
};

/* The host-RAM tier: a fixed number of block-sized buffers, least recently
 * used out first. */
struct host_tier {
    struct host_block *blocks; /* owned; cap */
    int cap, n_used;
    int32_t *buckets;          /* owned; mask + 1 chain heads */
    uint32_t mask;
    int32_t newest, oldest, free_head;
};

/* A cached block whose write found the queue full. */
struct tier_unsaved {
    uint32_t block;
    uint64_t gen; /* the cache entry it was: a block cached anew is another */
};

struct kv_tier {
    struct kv_manager *mgr;    /* borrowed; truncates a sequence whose read failed */
    struct kv_pool *pool;      /* borrowed */
    struct kv_prefix *prefix;  /* borrowed */
    struct ssd_store *store;   /* owned; NULL without the SSD tier (a host-RAM tier alone) */
    struct host_tier host;     /* cap 0: none */
    struct kv_tier_config cfg;
    size_t block_bytes;        /* one block in every layer, K and V */
    struct kv_codec *codec;    /* owned; --ssd-kv-format's re-encoding; NULL: disk holds the live format */
    bool in_place;             /* blocks are written from the pool itself, held until written (a
                                  pool in host memory, the live format on disk): no copy at all */
    size_t disk_bytes;         /* one block as the store keeps it */
    struct tier_read *reads;   /* owned; cap_reads slots */
    int cap_reads, n_reads;
    struct tier_unsaved *unsaved; /* owned; n_unsaved of cap_unsaved */
    int n_unsaved, cap_unsaved;
    uint8_t *is_unsaved;       /* owned; one flag per pool block */
    struct ssd_done deferred[TIER_POLL_BATCH]; /* reads polled inside a hook, for kv_tier_poll */
    int n_deferred;
    uint64_t last_demote_ns;
    uint64_t last_poll_ns;
    bool closing;              /* the manager is being destroyed (kv_tier_closing) */
    char *spare[TIER_SPARE_BUFFERS]; /* owned; write buffers to reuse */
    int n_spare;
    double copy_ns;            /* a block's copy and queueing, as they took lately */
    double credit_ns;          /* the engine thread's time the copies may still take */
    struct kv_tier_stats stats; /* the tier's own counters (store and rates filled on demand) */
};

/* ---- a block's bytes in the pool ---------------------------------------------
 * On the host a block is laid out layer by layer, K before V: 2 * n_layers
 * chunks of block_size rows (K rows and V rows may differ in width, as in a
 * quantized format's), each contiguous in the pool too. */

static size_t chunk_of(const struct kv_tier *t, bool v)
{
    return (size_t)t->pool->cache.block_size * kv_cache_row_bytes(&t->pool->cache, v);
}

/* Where the chunk of layer 0 sits in a host block; layers follow each other
 * every chunk_of(K) + chunk_of(V) bytes. */
static size_t host_offset(const struct kv_tier *t, bool v) { return v ? chunk_of(t, false) : 0; }

static char *chunk_in_pool(const struct kv_tier *t, uint32_t block, int layer, bool v)
{
    const struct kv_cache *c = &t->pool->cache;
    size_t at = ((size_t)layer * (size_t)c->n_blocks + block) * chunk_of(t, v);
    return (char *)(v ? c->v : c->k) + at;
}

static void copy_out(struct kv_tier *t, uint32_t block, char *host)
{
    struct backend *be = t->pool->backend;
    int n_layers = t->pool->cache.n_layers;
    size_t host_pitch = chunk_of(t, false) + chunk_of(t, true);
    for (int v = 0; v < 2; v++) {
        size_t chunk = chunk_of(t, v), layer_pitch = (size_t)t->pool->cache.n_blocks * chunk;
        if (be->ops->to_host_2d) { /* every layer's K, then V, each in one transfer */
            be->ops->to_host_2d(be, host + host_offset(t, v), host_pitch,
                                chunk_in_pool(t, block, 0, v), layer_pitch, chunk,
                                (size_t)n_layers);
            continue;
        }
        for (int l = 0; l < n_layers; l++)
            be->ops->to_host(be, host + (size_t)l * host_pitch + host_offset(t, v),
                             chunk_in_pool(t, block, l, v), chunk);
    }
}

/* The host-RAM tier's copies: queued on the device's stream into or out of
 * page-locked buffers where the backend has them (nothing waits: later ops,
 * the step that reuses the block included, run after), else as copy_out and
 * copy_in. */
static void host_copy_out(struct kv_tier *t, uint32_t block, char *host)
{
    struct backend *be = t->pool->backend;
    if (!be->ops->to_host_2d_async || !be->ops->host_alloc) {
        copy_out(t, block, host);
        return;
    }
    size_t host_pitch = chunk_of(t, false) + chunk_of(t, true);
    for (int v = 0; v < 2; v++) {
        size_t chunk = chunk_of(t, v), layer_pitch = (size_t)t->pool->cache.n_blocks * chunk;
        be->ops->to_host_2d_async(be, host + host_offset(t, v), host_pitch,
                                  chunk_in_pool(t, block, 0, v), layer_pitch, chunk,
                                  (size_t)t->pool->cache.n_layers);
    }
}

static void copy_in(struct kv_tier *t, uint32_t block, const char *host);

static void host_copy_in(struct kv_tier *t, uint32_t block, const char *host)
{
    struct backend *be = t->pool->backend;
    if (!be->ops->to_device_2d_async || !be->ops->host_alloc) {
        copy_in(t, block, host);
        return;
    }
    size_t host_pitch = chunk_of(t, false) + chunk_of(t, true);
    for (int v = 0; v < 2; v++) {
        size_t chunk = chunk_of(t, v), layer_pitch = (size_t)t->pool->cache.n_blocks * chunk;
        be->ops->to_device_2d_async(be, chunk_in_pool(t, block, 0, v), layer_pitch,
                                    host + host_offset(t, v), host_pitch, chunk,
                                    (size_t)t->pool->cache.n_layers);
    }
}

static void copy_in(struct kv_tier *t, uint32_t block, const char *host)
{
    struct backend *be = t->pool->backend;
    int n_layers = t->pool->cache.n_layers;
    size_t host_pitch = chunk_of(t, false) + chunk_of(t, true);
    for (int v = 0; v < 2; v++) {
        size_t chunk = chunk_of(t, v), layer_pitch = (size_t)t->pool->cache.n_blocks * chunk;
        if (be->ops->to_device_2d) {
            be->ops->to_device_2d(be, chunk_in_pool(t, block, 0, v), layer_pitch,
                                  host + host_offset(t, v), host_pitch, chunk, (size_t)n_layers);
            continue;
        }
        for (int l = 0; l < n_layers; l++)
            be->ops->to_device(be, chunk_in_pool(t, block, l, v),
                               host + (size_t)l * host_pitch + host_offset(t, v), chunk);
    }
}

/* ---- the host-RAM tier ----------------------------------------------------------- */

static uint32_t host_bucket(const struct host_tier *h, uint64_t hash, uint64_t ns)
{
    return (uint32_t)hash_mix64(hash ^ (ns * 0x9e3779b97f4a7c15ull)) & h->mask;
}

static int32_t host_find(const struct host_tier *h, uint64_t hash, uint64_t ns)
{
    if (h->cap == 0)
        return -1;
    for (int32_t i = h->buckets[host_bucket(h, hash, ns)]; i >= 0; i = h->blocks[i].bucket_next)
        if (h->blocks[i].hash == hash && h->blocks[i].ns == ns)
            return i;
    return -1;
}

static void lru_unlink(struct host_tier *h, int32_t i)
{
    struct host_block *b = &h->blocks[i];
    if (b->newer >= 0)
        h->blocks[b->newer].older = b->older;
    else
        h->newest = b->older;
    if (b->older >= 0)
        h->blocks[b->older].newer = b->newer;
    else
        h->oldest = b->newer;
    b->newer = b->older = -1;
}

static void lru_push_newest(struct host_tier *h, int32_t i)
{
    struct host_block *b = &h->blocks[i];
    b->older = h->newest;
    b->newer = -1;
    if (h->newest >= 0)
        h->blocks[h->newest].newer = i;
    h->newest = i;
    if (h->oldest < 0)
        h->oldest = i;
}

/* Takes slot i out of its bucket and the LRU list, onto the free chain (its
 * buffer kept for the next block). */
static void host_drop(struct host_tier *h, int32_t i)
{
    struct host_block *b = &h->blocks[i];
    int32_t *link = &h->buckets[host_bucket(h, b->hash, b->ns)];
    while (*link != i)
        link = &h->blocks[*link].bucket_next;
    *link = b->bucket_next;
    lru_unlink(h, i);
    b->used = false;
    b->bucket_next = h->free_head;
    h->free_head = i;
    h->n_used--;
}

/* Keeps pool block b, about to leave a device pool, in host memory under its
 * entry e; the least recently used host block makes room. */
static void host_keep(struct kv_tier *t, uint32_t b, const struct kv_prefix_entry *e)
{
    struct host_tier *h = &t->host;
    int32_t i = host_find(h, e->hash, e->ns);
    if (i >= 0) { /* the same content is there already */
        lru_unlink(h, i);
        lru_push_newest(h, i);
        return;
    }
    if (h->free_head < 0) {
        host_drop(h, h->oldest);
        t->stats.host_evictions++;
    }
    i = h->free_head;
    struct host_block *hb = &h->blocks[i];
    struct backend *be = t->pool->backend;
    if (!hb->data)
        hb->data = be->ops->host_alloc ? be->ops->host_alloc(be, t->block_bytes)
                                       : malloc(t->block_bytes);
    if (!hb->data)
        return;
    h->free_head = hb->bucket_next;
    host_copy_out(t, b, hb->data);
    hb->hash = e->hash;
    hb->ns = e->ns;
    hb->used = true;
    uint32_t k = host_bucket(h, e->hash, e->ns);
    hb->bucket_next = h->buckets[k];
    h->buckets[k] = i;
    lru_push_newest(h, i);
    h->n_used++;
    t->stats.host_stores++;
}

static void host_free(struct host_tier *h, struct backend *be)
{
    for (int i = 0; i < h->cap; i++) {
        if (be->ops->host_free)
            be->ops->host_free(be, h->blocks[i].data);
        else
            free(h->blocks[i].data);
    }
    free(h->blocks);
    free(h->buckets);
    memset(h, 0, sizeof *h);
}

static int host_create(struct host_tier *h, int cap, struct err *err)
{
    memset(h, 0, sizeof *h);
    h->newest = h->oldest = h->free_head = -1;
    if (cap <= 0)
        return 0;
    uint32_t n_buckets = 16;
    while (n_buckets < (uint32_t)cap)
        n_buckets *= 2;
    h->blocks = calloc((size_t)cap, sizeof *h->blocks);
    h->buckets = malloc((size_t)n_buckets * sizeof *h->buckets);
    if (!h->blocks || !h->buckets) {
        free(h->blocks);
        free(h->buckets);
        memset(h, 0, sizeof *h);
        return err_set(err, INFERD_ENOMEM, "out of memory for a host-RAM tier of %d blocks", cap);
    }
    h->cap = cap;
    h->mask = n_buckets - 1;
    for (uint32_t i = 0; i < n_buckets; i++)
        h->buckets[i] = -1;
    for (int i = cap - 1; i >= 0; i--) {
        h->blocks[i] = (struct host_block){.bucket_next = h->free_head, .newer = -1, .older = -1};
        h->free_head = i;
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------------ */

/* A block-sized host buffer for a write: a spare one, else a new one
 * (page-locked where the backend has such memory, so the copy out of the
 * device goes straight into it). Written blocks give theirs back, so the
 * engine thread neither maps nor unmaps memory per block. */
static char *take_buffer(struct kv_tier *t)
{
    if (t->n_spare > 0)
        return t->spare[--t->n_spare];
    struct backend *be = t->pool->backend;
    return be->ops->host_alloc ? be->ops->host_alloc(be, t->block_bytes) : malloc(t->block_bytes);
}

static void drop_buffer(struct kv_tier *t, char *p)
{
    struct backend *be = t->pool->backend;
    if (be->ops->host_alloc)
        be->ops->host_free(be, p);
    else
        free(p);
}

static void give_buffer(struct kv_tier *t, char *p)
{
    if (t->n_spare < TIER_SPARE_BUFFERS)
        t->spare[t->n_spare++] = p;
    else
        drop_buffer(t, p);
}

/* A write's buffer, once the store is done with it: a cold one is freed,
 * a live-format one kept for the next write. */
static void written_back(struct kv_tier *t, char *p)
{
    if (t->codec)
        free(p);
    else
        give_buffer(t, p);
}

/* A write's cookie names what to give back when it is done: the host
 * buffer it was copied into (malloc'd: the low bit clear), or the pool
 * block it is written from, held until then (the low bit set). */
static uint64_t cookie_of_block(uint32_t b) { return (uint64_t)b << 1 | 1; }
static bool cookie_is_block(uint64_t cookie) { return cookie & 1; }

/* A reference to cached block b that keeps it in the pool (and out of the
 * cache's eviction order) while the store writes it from there; let go of
 * when its write is done. */
static void hold_block(struct kv_tier *t, uint32_t b)
{
    kv_pool_retain(t->pool, b);
    kv_prefix_after_refcount(t->prefix, b);
}

static void let_go_block(struct kv_tier *t, uint32_t b)
{
    kv_pool_release(t->pool, b);
    kv_prefix_after_refcount(t->prefix, b);
}

/* Block b where it lies in the pool: one piece per layer's K and V, in the
 * order copy_out lays them out, so a record is the same either way.
 * Returns the number of pieces, or 0 when they are too many for the store. */
static int pieces_in_pool(const struct kv_tier *t, uint32_t b, struct iovec *iov)
{
    int n_layers = t->pool->cache.n_layers;
    if (2 * n_layers > SSD_MAX_IOV)
        return 0;
    for (int l = 0; l < n_layers; l++)
        for (int v = 0; v < 2; v++)
            iov[2 * l + v] = (struct iovec){chunk_in_pool(t, b, l, v), chunk_of(t, v)};
    return 2 * n_layers;
}

/* Queues block b's write from the pool itself. */
static int write_in_place(struct kv_tier *t, uint32_t b, const struct ssd_block_key *key)
{
    struct iovec iov[SSD_MAX_IOV];
    int n = pieces_in_pool(t, b, iov);
    if (n == 0)
        return -INFERD_EIO;
    hold_block(t, b);
    struct err err = {0};
    int rc = ssd_store_write(t->store, key, iov, n, cookie_of_block(b), &err);
    if (rc != 0)
        let_go_block(t, b);
    return rc;
}

/* Queues cached block b for writing unless the store has it: 0 (queued, or
 * nothing to do), -INFERD_EBUSY (queue full), -INFERD_EIO (the tier is off).
 * may_hold: the block may be held in the pool until written (not while it is
 * leaving the cache: then its bytes are copied out first). */
static int write_block(struct kv_tier *t, uint32_t b, bool may_hold)
{
    if (!t->store)
        return 0;
    struct kv_prefix_entry e;
    if (!kv_prefix_entry(t->prefix, b, &e) || e.n_tokens != t->pool->cache.block_size)
        return 0;
    if (ssd_store_contains(t->store, e.hash, e.ns, NULL))
        return 0;
    if (t->in_place && may_hold) {
        struct ssd_block_key key = {.hash = e.hash, .parent_hash = e.parent_hash, .ns = e.ns,
                                    .n_tokens = e.n_tokens, .tokens = e.tokens};
        int rc = write_in_place(t, b, &key);
        if (rc == 0 || rc == -INFERD_EEXIST)
            return 0;
        return rc == -INFERD_EBUSY ? rc : -INFERD_EIO;
    }
    char *host = take_buffer(t);
    if (!host)
        return -INFERD_EBUSY;
    copy_out(t, b, host);
    if (t->codec) { /* the live copy goes back at once: the cold one is written */
        char *cold = malloc(t->disk_bytes);
        if (cold)
            kv_codec_encode(t->codec, host, cold);
        give_buffer(t, host);
        host = cold;
        if (!host)
            return -INFERD_EBUSY;
    }
    struct ssd_block_key key = {.hash = e.hash, .parent_hash = e.parent_hash, .ns = e.ns,
                                .n_tokens = e.n_tokens, .tokens = e.tokens};
    struct iovec iov = {host, t->disk_bytes};
    struct err err = {0};
    int rc = ssd_store_write(t->store, &key, &iov, 1, (uint64_t)(uintptr_t)host, &err);
    if (rc == 0) {
        if (t->codec) {
            t->stats.cold_blocks++;
            t->stats.cold_bytes_saved += t->block_bytes - t->disk_bytes;
        }
        return 0;
    }
    written_back(t, host);
    if (rc == -INFERD_EEXIST)
        return 0;
    if (rc == -INFERD_EBUSY)
        return rc;
    return -INFERD_EIO; /* off, or a block the store will never take: nothing to retry */
}

static void remember_unsaved(struct kv_tier *t, uint32_t b)
{
    struct kv_prefix_entry e;
    if (t->is_unsaved[b] || !kv_prefix_entry(t->prefix, b, &e))
        return;
    if (t->n_unsaved == t->cap_unsaved) {
        int cap = t->cap_unsaved ? 2 * t->cap_unsaved : 64;
        struct tier_unsaved *grown = realloc(t->unsaved, (size_t)cap * sizeof *grown);
        if (!grown) {
            ssd_store_note_dropped(t->store, 1);
            return;
        }
        t->unsaved = grown;
        t->cap_unsaved = cap;
    }
    t->unsaved[t->n_unsaved++] = (struct tier_unsaved){b, e.gen};
    t->is_unsaved[b] = 1;
}

static void handle_done(struct kv_tier *t, const struct ssd_done *d);

/* Takes finished operations off the store; reads are kept for kv_tier_poll
 * when defer_reads (inside a cache hook, where no sequence may change). */
static void drain(struct kv_tier *t, bool defer_reads)
{
    struct ssd_done done[TIER_POLL_BATCH];
    int room = defer_reads ? TIER_POLL_BATCH - t->n_deferred : TIER_POLL_BATCH;
    int n;
    if (!t->store)
        return;
    while (room > 0 && (n = ssd_store_poll(t->store, done, room)) > 0) {
        for (int i = 0; i < n; i++) {
            if (done[i].kind == SSD_DONE_READ && defer_reads)
                t->deferred[t->n_deferred++] = done[i];
            else
                handle_done(t, &done[i]);
        }
        if (defer_reads)
            room = TIER_POLL_BATCH - t->n_deferred;
    }
}

/* A block just cached is only remembered: its copy to host memory and its
 * write are queued later, in kv_tier_poll's time budget, so that neither
 * the step that computed it nor its request's first token waits for them. */
static void hook_inserted(void *ctx, uint32_t b)
{
    struct kv_tier *t = ctx;
    t->is_unsaved[b] = 0; /* a flag left by the entry this block was before */
    if (t->store)
        remember_unsaved(t, b);
}

/* A block leaving memory whose write never found room waits for room now. */
static void hook_leaving(void *ctx, uint32_t b)
{
    struct kv_tier *t = ctx;
    struct kv_prefix_entry e;
    if (t->host.cap > 0 && !t->closing && kv_prefix_entry(t->prefix, b, &e) &&
        e.n_tokens == t->pool->cache.block_size)
        host_keep(t, b, &e);
    if (!t->is_unsaved[b])
        return;
    t->is_unsaved[b] = 0;
    uint64_t deadline = now_ns() + (uint64_t)TIER_FORCE_WAIT_MS * 1000000ull;
    int rc;
    while ((rc = write_block(t, b, false)) == -INFERD_EBUSY && now_ns() < deadline) {
        ssd_store_wait(t->store, 50);
        drain(t, true);
    }
    if (rc == -INFERD_EBUSY)
        ssd_store_note_dropped(t->store, 1);
}

/* Queues remembered blocks while the queue has room and, with a credit (the
 * engine thread's time it may spend; NULL: no limit), while the credit covers
 * a block's copy to host memory as long as the copies so far took. */
static void retry_unsaved(struct kv_tier *t, double *credit_ns)
{
    int kept = 0;
    bool full = false;
    for (int i = 0; i < t->n_unsaved; i++) {
        if (!full && credit_ns && *credit_ns < t->copy_ns)
            full = true; /* out of time: the rest stay remembered */
        struct tier_unsaved u = t->unsaved[i];
        struct kv_prefix_entry e;
        if (!t->is_unsaved[u.block] || !kv_prefix_entry(t->prefix, u.block, &e) ||
            e.gen != u.gen)
            continue; /* written, or no longer that entry */
        uint64_t t0 = now_ns();
        if (!full && write_block(t, u.block, true) == -INFERD_EBUSY)
            full = true;
        if (!full) {
            double took = (double)(now_ns() - t0);
            t->copy_ns = t->copy_ns > 0 ? 0.9 * t->copy_ns + 0.1 * took : took;
            if (credit_ns)
                *credit_ns -= took;
        }
        if (full) {
            t->unsaved[kept++] = u;
            continue;
        }
        t->is_unsaved[u.block] = 0;
    }
    t->n_unsaved = kept;
}

/* ---- reading ------------------------------------------------------------------ */

static int read_slot(struct kv_tier *t)
{
    for (int i = 0; i < t->cap_reads; i++)
        if (!t->reads[i].used)
            return i;
    int cap = t->cap_reads ? 2 * t->cap_reads : 64;
    struct tier_read *grown = realloc(t->reads, (size_t)cap * sizeof *grown);
    if (!grown)
        return -1;
    memset(grown + t->cap_reads, 0, (size_t)(cap - t->cap_reads) * sizeof *grown);
    t->reads = grown;
    int slot = t->cap_reads;
    t->cap_reads = cap;
    return slot;
}

static void release_read(struct kv_tier *t, struct tier_read *r)
{
    if (!r->host)
        let_go_block(t, r->block); /* the reference a read into the pool block took */
    free(r->host);
    *r = (struct tier_read){0};
    t->n_reads--;
}

int kv_tier_continue(struct kv_tier *t, struct kv_seq *seq, const int32_t *tokens, int limit,
                     uint64_t chain_hash, uint64_t ns, bool (*make_free)(void *ctx), void *ctx)
{
    int bs = t->pool->cache.block_size;
    struct err err = {0};
    /* first in host memory, each block copied back into the pool at once */
    int from_host = 0;
    while ((seq->table.n_blocks + 1) * bs <= limit) {
        uint64_t hn = kv_prefix_hash(chain_hash, tokens + (size_t)seq->table.n_blocks * bs, bs, ns);
        int32_t i = host_find(&t->host, hn, ns);
        uint32_t block;
        if (i < 0 || block_table_grow(&seq->table, seq->table.n_blocks + 1, &err) < 0 ||
            !make_free(ctx) || kv_pool_alloc(t->pool, &block, &err) < 0)
            break;
        host_copy_in(t, block, t->host.blocks[i].data);
        lru_unlink(&t->host, i);
        lru_push_newest(&t->host, i);
        seq->table.blocks[seq->table.n_blocks++] = block;
        chain_hash = hn;
        from_host++;
        t->stats.host_hits++;
    }
    if (!t->store)
        return from_host;
    int first = seq->table.n_blocks;
    /* how far the chain goes on on disk */
    int k = 0, cap_k = 0;
    uint64_t h = chain_hash, *hashes = NULL;
    while ((first + k + 1) * bs <= limit) {
        uint64_t hn = kv_prefix_hash(h, tokens + (size_t)(first + k) * bs, bs, ns);
        if (!ssd_store_contains(t->store, hn, ns, NULL))
            break;
        if (k == cap_k) {
            cap_k = cap_k ? 2 * cap_k : 64;
            uint64_t *grown = realloc(hashes, (size_t)cap_k * sizeof *grown);
            if (!grown)
                break;
            hashes = grown;
        }
        hashes[k++] = hn;
        h = hn;
    }
    if (k == 0) {
        free(hashes);
        return from_host;
    }
    /* the cost model: read them (what the page cache holds at its rate, the rest at the
     * disk's), or compute them? */
    double read_rate = ssd_store_read_bandwidth(t->store);
    double cache_rate = ssd_store_cache_bandwidth(t->store);
    double bytes = (double)k * (double)t->disk_bytes;
    double cached = cache_rate > 0 ? (double)ssd_store_cached_bytes(t->store, hashes, k, ns) : 0;
    cached = cached < bytes ? cached : bytes;
    free(hashes);
    double restore_s = read_rate > 0 ? (bytes - cached) / read_rate : 0;
    if (cached > 0)
        restore_s += cached / cache_rate;
    double recompute_s = t->cfg.prefill_tokens_per_s > 0
                             ? (double)k * bs / t->cfg.prefill_tokens_per_s
                             : 1e300;
    t->stats.predicted_restore_ms = restore_s * 1e3;
    t->stats.predicted_recompute_ms = recompute_s < 1e299 ? recompute_s * 1e3 : 0;
    bool compute = t->cfg.restore == KV_RESTORE_NEVER ||
                   (t->cfg.restore == KV_RESTORE_AUTO && restore_s >= recompute_s);
    if (compute) {
        t->stats.decisions_recompute++;
        return from_host;
    }
    t->stats.decisions_restore++;
    if (block_table_grow(&seq->table, first + k, &err) < 0)
        return from_host;
    int queued = 0;
    h = chain_hash;
    for (int i = 0; i < k; i++) {
        const int32_t *tb = tokens + (size_t)(first + i) * bs;
        uint64_t hn = kv_prefix_hash(h, tb, bs, ns);
        int slot = read_slot(t);
        /* over a pool in host memory the store reads straight into the block (held by the
         * read, so a sequence that goes meanwhile cannot hand it to another); else into a
         * buffer copied in when the read is done */
        char *host = slot >= 0 && !t->in_place ? malloc(t->disk_bytes) : NULL;
        uint32_t block;
        if (slot < 0 || (!t->in_place && !host) || !make_free(ctx) ||
            kv_pool_alloc(t->pool, &block, &err) < 0) {
            free(host);
            break;
        }
        struct ssd_block_key expect = {.hash = hn, .parent_hash = h, .ns = ns, .n_tokens = bs,
                                       .tokens = tb};
        struct iovec iov[SSD_MAX_IOV] = {{host, t->disk_bytes}};
        int n_iov = host ? 1 : pieces_in_pool(t, block, iov);
        if (n_iov > 0 && !host)
            kv_pool_retain(t->pool, block);
        if (n_iov == 0 || ssd_store_read(t->store, &expect, iov, n_iov, (uint64_t)slot, &err) < 0) {
            if (n_iov > 0 && !host)
                kv_pool_release(t->pool, block);
            kv_pool_release(t->pool, block);
            free(host);
            break;
        }
        t->reads[slot] = (struct tier_read){.seq = seq, .used = true, .index = first + i,
                                            .block = block, .host = host};
        t->n_reads++;
        seq->table.blocks[seq->table.n_blocks++] = block;
        queued++;
        h = hn;
    }
    if (queued > 0) {
        if (seq->n_loading == 0)
            seq->loading_from = first;
        seq->n_loading += queued;
    }
    return from_host + queued;
}

void kv_tier_forget(struct kv_tier *t, const struct kv_seq *seq)
{
    if (seq->n_loading == 0)
        return;
    for (int i = 0; i < t->cap_reads; i++)
        if (t->reads[i].used && t->reads[i].seq == seq)
            t->reads[i].seq = NULL;
}

/* seq's block at index failed to load: it and every block after it go, and
 * their reads in flight write nowhere. */
static void drop_from(struct kv_tier *t, struct kv_seq *seq, int index)
{
    for (int i = 0; i < t->cap_reads; i++) {
        struct tier_read *r = &t->reads[i];
        if (r->used && r->seq == seq && r->index > index) {
            r->seq = NULL;
            seq->n_loading--;
        }
    }
    int dropped = seq->table.n_blocks - index;
    t->stats.recomputes += (uint64_t)(dropped > 0 ? dropped : 0);
    kv_manager_truncate(t->mgr, seq, index * t->pool->cache.block_size);
}

static void handle_done(struct kv_tier *t, const struct ssd_done *d)
{
    if (d->kind == SSD_DONE_WRITE) {
        if (cookie_is_block(d->cookie))
            let_go_block(t, (uint32_t)(d->cookie >> 1));
        else
            written_back(t, (char *)(uintptr_t)d->cookie);
        return;
    }
    if (d->cookie >= (uint64_t)t->cap_reads || !t->reads[d->cookie].used)
        return;
    struct tier_read *r = &t->reads[d->cookie];
    struct kv_seq *seq = r->seq;
    if (seq) {
        seq->n_loading--;
        bool still_there = r->index < seq->table.n_blocks && seq->table.blocks[r->index] == r->block;
        bool ok = d->status == 0 && still_there;
        if (ok && r->host) { /* read into a buffer: decoded from a colder format, copied in */
            char *live = t->codec ? malloc(t->block_bytes) : NULL;
            if (t->codec && !live)
                ok = false;
            else if (live)
                kv_codec_decode(t->codec, r->host, live);
            if (ok)
                copy_in(t, r->block, live ? live : r->host);
            free(live);
        }
        if (!ok && still_there)
            drop_from(t, seq, r->index);
    }
    release_read(t, r);
}

/* ---- demotion ----------------------------------------------------------------- */

static bool durable(void *ctx, uint32_t b)
{
    struct kv_tier *t = ctx;
    struct kv_prefix_entry e;
    return !t->is_unsaved[b] && kv_prefix_entry(t->prefix, b, &e) &&
           ssd_store_contains(t->store, e.hash, e.ns, NULL);
}

static void demote_idle(struct kv_tier *t)
{
    uint64_t now = now_ns();
    if (!t->store || t->cfg.demote_idle_ns == 0 || now - t->last_demote_ns < TIER_DEMOTE_EVERY_NS ||
        now < t->cfg.demote_idle_ns)
        return;
    t->last_demote_ns = now;
    t->stats.demoted +=
        (uint64_t)kv_prefix_evict_idle(t->prefix, now - t->cfg.demote_idle_ns, durable, t);
}

/* ---- the manager's calls ------------------------------------------------------ */

void kv_tier_set_manager(struct kv_tier *t, struct kv_manager *mgr) { t->mgr = mgr; }

void kv_tier_closing(struct kv_tier *t) { t->closing = true; }

void kv_tier_poll(struct kv_tier *t, bool idle)
{
    /* Busy, the remembered blocks' copies earn TIER_COPY_SHARE of the time
     * since the last poll (about one step) and wait until it covers one;
     * idle, a slice. */
    uint64_t now = now_ns();
    uint64_t since = now - t->last_poll_ns;
    t->last_poll_ns = now;
    if (idle)
        t->credit_ns = (double)TIER_IDLE_SLICE_NS;
    else if ((t->credit_ns += (double)since * TIER_COPY_SHARE) > (double)TIER_IDLE_SLICE_NS)
        t->credit_ns = (double)TIER_IDLE_SLICE_NS; /* what a long pause earned is not spent at once */
    for (int i = 0; i < t->n_deferred; i++)
        handle_done(t, &t->deferred[i]);
    t->n_deferred = 0;
    drain(t, false);
    retry_unsaved(t, &t->credit_ns);
    /* an idle slice is spent now or never: work that resumes starts with no credit */
    if (t->credit_ns < 0 || idle)
        t->credit_ns = 0;
    demote_idle(t);
}

bool kv_tier_busy(const struct kv_tier *t) { return t->n_reads > 0 || t->n_deferred > 0; }

int kv_tier_unsaved(const struct kv_tier *t) { return t->n_unsaved; }

void kv_tier_wait(struct kv_tier *t, int timeout_ms)
{
    if (t->n_deferred == 0 && t->store)
        ssd_store_wait(t->store, timeout_ms);
}

int kv_tier_flush(struct kv_tier *t, int timeout_ms, struct err *err)
{
    if (!t->store)
        return err_set(err, INFERD_EINVAL, "no SSD tier (--ssd-cache DIR)");
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        drain(t, true);
        retry_unsaved(t, NULL);
        if (t->n_unsaved == 0)
            break;
        if (now_ns() >= deadline)
            return err_set(err, INFERD_EBUSY, "%d cached blocks still wait for room to be written",
                           t->n_unsaved);
        ssd_store_wait(t->store, 50);
    }
    int left = timeout_ms;
    if (timeout_ms >= 0) {
        uint64_t now = now_ns();
        left = now >= deadline ? 0 : (int)((deadline - now) / 1000000ull);
    }
    int rc = ssd_store_flush(t->store, left);
    drain(t, true);
    if (rc == -INFERD_EBUSY)
        return err_set(err, rc, "the SSD tier's writes are not all durable yet");
    if (rc < 0)
        return err_set(err, INFERD_EIO, "the SSD tier is off: its writes failed");
    return 0;
}

void kv_tier_stats(const struct kv_tier *t, struct kv_tier_stats *out)
{
    *out = t->stats;
    out->enabled = t->store != NULL;
    if (t->store) {
        ssd_store_stats(t->store, &out->store);
        out->read_bytes_per_s = ssd_store_read_bandwidth(t->store);
    }
    out->host_blocks = (uint64_t)t->host.n_used;
    out->host_bytes = (uint64_t)t->host.n_used * t->block_bytes;
    out->host_max_bytes = (uint64_t)t->host.cap * t->block_bytes;
    out->prefill_tokens_per_s = t->cfg.prefill_tokens_per_s;
    out->loading = (uint64_t)t->n_reads;
    out->unsaved = (uint64_t)t->n_unsaved;
}

int kv_tier_create(struct kv_pool *pool, struct kv_prefix *prefix, size_t block_bytes,
                   const struct kv_tier_config *cfg, struct kv_tier **out, struct err *err)
{
    struct kv_tier *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, INFERD_ENOMEM, "out of memory for the SSD tier");
    const struct kv_cache *c = &pool->cache;
    t->pool = pool;
    t->prefix = prefix;
    t->cfg = *cfg;
    t->block_bytes = (size_t)c->n_layers * (size_t)c->block_size *
                     (kv_cache_row_bytes(c, false) + kv_cache_row_bytes(c, true));
    (void)block_bytes;
    t->is_unsaved = calloc((size_t)c->n_blocks, 1);
    if (!t->is_unsaved) {
        free(t);
        return err_set(err, INFERD_ENOMEM, "out of memory for the SSD tier");
    }
    t->disk_bytes = t->block_bytes;
    t->in_place = pool->backend->ops->memory_is_host && !cfg->cold;
    struct ssd_config store = cfg->store;
    int rc = 0;
    if (cfg->cold && cfg->store.dir) {
        /* the disk's format joins the fingerprint: blocks of another cold
         * format are another directory's */
        struct model_config mc = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                                  .head_dim = c->head_dim};
        struct kv_format cold = kv_format_of_dtype(DTYPE_F32);
        cold.quant = cfg->cold;
        cold.scales = KV_SCALES_IN_RECORD;
        rc = kv_codec_create(&mc, c->block_size, &pool->format, &cold, &t->codec, err);
        if (rc == 0) {
            t->disk_bytes = kv_codec_block_bytes(t->codec, true);
            kv_format_name(&cold, t->stats.cold_format, sizeof t->stats.cold_format);
            size_t n = strlen(store.fp.kv_format);
            snprintf(store.fp.kv_format + n, sizeof store.fp.kv_format - n, ">%s",
                     t->stats.cold_format);
        }
    }
    if (rc == 0)
        rc = host_create(&t->host, (int)(cfg->host_bytes / t->block_bytes), err);
    if (rc == 0 && cfg->store.dir)
        rc = ssd_store_open(&store, &t->store, err);
    if (rc < 0) {
        kv_codec_free(t->codec);
        host_free(&t->host, pool->backend);
        free(t->is_unsaved);
        free(t);
        return rc;
    }
    t->last_demote_ns = now_ns();
    kv_prefix_set_hooks(prefix, &(struct kv_prefix_hooks){hook_inserted, hook_leaving, t});
    *out = t;
    return 0;
}

void kv_tier_free(struct kv_tier *t)
{
    if (!t)
        return;
    /* What is queued goes to disk first; every write's host copy comes back
     * through a completion (the store discards the ones left unpolled). */
    uint64_t deadline = now_ns() + 60ull * 1000000000ull;
    for (; t->store;) {
        drain(t, true);
        t->n_deferred = 0; /* reads of sequences already gone: their slots are freed below */
        struct ssd_stats st;
        ssd_store_stats(t->store, &st);
        if ((st.pending == 0 && st.pending_reads == 0) || now_ns() >= deadline)
            break;
        ssd_store_wait(t->store, 100);
    }
    if (t->store)
        ssd_store_close(t->store);
    host_free(&t->host, t->pool->backend);
    while (t->n_spare > 0)
        drop_buffer(t, t->spare[--t->n_spare]);
    for (int i = 0; i < t->cap_reads; i++)
        if (t->reads[i].used)
            free(t->reads[i].host);
    free(t->reads);
    free(t->unsaved);
    free(t->is_unsaved);
    kv_codec_free(t->codec);
    free(t);
}
