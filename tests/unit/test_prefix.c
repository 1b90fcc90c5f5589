/* tests/unit/test_prefix.c — the prefix cache (kv/prefix.c through the KV manager): verified hash
 * chains, longest and token-exact partial matches, copy on write, partial entries (a retired
 * sequence's last block), eviction order (leaves first, LRU, cost-size, sessions), the cap on
 * unreferenced bytes, namespaces, and no leaked block. */
#include <criterion/criterion.h>
#include <string.h>

#include "kv/kv.h"

#define BS 4

static struct backend *be;
static struct model model;

static void setup(void)
{
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1, .mode = COMPUTE_EXACT},
                                    &be, &err),
                 0, "%s", err.msg);
    model.config.n_layers = 2;
    model.config.n_kv_heads = 2;
    model.config.head_dim = 8;
    model.backend = be;
}

static void teardown(void) { backend_destroy(be); }

TestSuite(prefix_cache, .init = setup, .fini = teardown);

static size_t block_bytes(void)
{
    struct kv_format f = kv_format_of_dtype(be->kv_dtype);
    return kv_format_bytes_per_block(&model.config, &f, BS);
}

static struct kv_manager *cache(int n_blocks, size_t max_bytes, enum kv_retention retention)
{
    struct kv_manager *mgr = NULL;
    struct err err = {0};
    cr_assert_eq(kv_manager_create(&model, be, n_blocks, BS, &mgr, &err), 0, "%s", err.msg);
    struct kv_prefix_config cfg = {.max_bytes = max_bytes, .retention = retention,
                                   .model_digest = 42, .session_idle_ns = 1000};
    cr_assert_eq(kv_manager_prefix_enable(mgr, &cfg, &err), 0, "%s", err.msg);
    cr_assert(kv_manager_prefix_enabled(mgr));
    return mgr;
}

/* The value every K/V element of a position holds once "computed": a function
 * of its token and position, so copied slots can be checked. */
static float kv_value(int32_t token, int pos, int layer, int e, bool v)
{
    return (float)(token * 1000 + pos) + (float)layer * 0.25f + (float)e * 1e-3f + (v ? 0.5f : 0);
}

static float *slot_k(struct kv_manager *mgr, uint32_t block, int layer, int slot, bool v)
{
    struct kv_cache *kv = kv_manager_cache(mgr);
    size_t kv_dim = (size_t)kv->n_kv_heads * kv->head_dim;
    float *base = v ? kv->v : kv->k;
    return base + (((size_t)layer * kv->n_blocks + block) * kv->block_size + slot) * kv_dim;
}

/* Writes the K/V of tokens[from, to) into s's slots, as computing them would. */
static void compute(struct kv_manager *mgr, const struct kv_seq *s, const int32_t *tokens,
                    int from, int to)
{
    int kv_dim = model.config.n_kv_heads * model.config.head_dim;
    for (int pos = from; pos < to; pos++)
        for (int layer = 0; layer < model.config.n_layers; layer++)
            for (int e = 0; e < kv_dim; e++) {
                uint32_t b = s->table.blocks[pos / BS];
                slot_k(mgr, b, layer, pos % BS, false)[e] = kv_value(tokens[pos], pos, layer, e, false);
                slot_k(mgr, b, layer, pos % BS, true)[e] = kv_value(tokens[pos], pos, layer, e, true);
            }
}

/* Admits tokens[0, n) as a sequence would: lookup, slots for the rest, the
 * rest "computed" (written), then its full blocks published. Returns n_cached. */
static int run_seq(struct kv_manager *mgr, struct kv_seq *s, const int32_t *tokens, int n,
                   uint64_t ns, const char *session)
{
    struct err err = {0};
    kv_seq_init(s);
    s->ns = ns;
    s->session = session;
    int cached = kv_manager_computed_blocks(mgr, s, tokens, n);
    cr_assert_eq(s->n_tokens, cached);
    cr_assert_eq(kv_manager_allocate_slots(mgr, s, n - cached, &err), 0, "%s", err.msg);
    compute(mgr, s, tokens, cached, n);
    kv_manager_publish(mgr, s, tokens, n);
    return cached;
}

/* run_seq, then the sequence is done: retired with its partial last block. */
static int run_retired(struct kv_manager *mgr, const int32_t *tokens, int n, const char *session)
{
    struct kv_seq s;
    int cached = run_seq(mgr, &s, tokens, n, 0, session);
    kv_manager_retire(mgr, &s, tokens, n);
    cr_assert_eq(s.table.n_blocks, 0, "retiring frees the sequence");
    return cached;
}

/* Every position of s below n_tokens holds the K/V computed for tokens. */
static void assert_kv_of(struct kv_manager *mgr, const struct kv_seq *s, const int32_t *tokens)
{
    int kv_dim = model.config.n_kv_heads * model.config.head_dim;
    for (int pos = 0; pos < s->n_tokens; pos++)
        for (int layer = 0; layer < model.config.n_layers; layer++)
            for (int e = 0; e < kv_dim; e++) {
                uint32_t b = s->table.blocks[pos / BS];
                cr_assert_eq(slot_k(mgr, b, layer, pos % BS, false)[e],
                             kv_value(tokens[pos], pos, layer, e, false), "K at %d", pos);
                cr_assert_eq(slot_k(mgr, b, layer, pos % BS, true)[e],
                             kv_value(tokens[pos], pos, layer, e, true), "V at %d", pos);
            }
}

/* How many leading tokens of tokens[0, n) a new sequence reuses; nothing kept. */
static int probe(struct kv_manager *mgr, const int32_t *tokens, int n)
{
    struct kv_seq s;
    kv_seq_init(&s);
    int cached = kv_manager_computed_blocks(mgr, &s, tokens, n);
    assert_kv_of(mgr, &s, tokens);
    kv_manager_free(mgr, &s);
    return cached;
}

/* Clears the cache and checks that every block went back: no reference leaked. */
static void finish(struct kv_manager *mgr)
{
    kv_manager_prefix_clear(mgr);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.blocks, 0);
    cr_assert_eq(st.unreferenced_blocks, 0);
    cr_assert_eq(kv_manager_free_blocks(mgr), kv_manager_total_blocks(mgr), "a block leaked");
    kv_manager_destroy(mgr);
}

static const int32_t A[12] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33};

Test(prefix_cache, hash_chain_depends_on_parent_tokens_and_namespace)
{
    int32_t t[BS] = {1, 2, 3, 4}, u[BS] = {1, 2, 3, 5};
    uint64_t h = kv_prefix_hash(7, t, BS, 9);
    cr_assert_eq(h, kv_prefix_hash(7, t, BS, 9), "deterministic");
    cr_assert_neq(h, kv_prefix_hash(8, t, BS, 9), "parent");
    cr_assert_neq(h, kv_prefix_hash(7, u, BS, 9), "tokens");
    cr_assert_neq(h, kv_prefix_hash(7, t, BS, 10), "namespace");
    cr_assert_neq(h, kv_prefix_hash(7, t, BS - 1, 9), "length");
    struct kv_format f32 = kv_format_of_dtype(DTYPE_F32), f16 = kv_format_of_dtype(DTYPE_F16);
    uint64_t ns = kv_prefix_namespace(1, &f32, 16, 0);
    cr_assert_neq(ns, kv_prefix_namespace(2, &f32, 16, 0), "model digest");
    cr_assert_neq(ns, kv_prefix_namespace(1, &f16, 16, 0), "KV format");
    cr_assert_neq(ns, kv_prefix_namespace(1, &f32, 32, 0), "block size");
    cr_assert_neq(ns, kv_prefix_namespace(1, &f32, 16, 5), "the request's cache_ns");
}

Test(prefix_cache, off_by_default_and_with_a_zero_cap)
{
    struct kv_manager *mgr = NULL;
    struct err err = {0};
    cr_assert_eq(kv_manager_create(&model, be, 8, BS, &mgr, &err), 0, "%s", err.msg);
    cr_assert_not(kv_manager_prefix_enabled(mgr));
    struct kv_prefix_config off = {.max_bytes = 0};
    cr_assert_eq(kv_manager_prefix_enable(mgr, &off, &err), 0);
    cr_assert_not(kv_manager_prefix_enabled(mgr));
    struct kv_seq a, b;
    run_seq(mgr, &a, A, 12, 0, NULL);
    kv_manager_free(mgr, &a);
    cr_assert_eq(run_seq(mgr, &b, A, 12, 0, NULL), 0, "no cache, no hit");
    kv_manager_free(mgr, &b);
    cr_assert_eq(kv_manager_close_session(mgr, "x"), -1);
    cr_assert_eq(kv_manager_free_blocks(mgr), 8);
    kv_manager_destroy(mgr);
}

Test(prefix_cache, longest_verified_chain_is_shared_by_reference)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_pool *pool = kv_manager_pool(mgr);
    struct kv_seq a, b;
    cr_assert_eq(run_seq(mgr, &a, A, 12, 0, NULL), 0, "a cold cache");
    int32_t bt[12] = {10, 11, 12, 13, 20, 21, 22, 23, 99, 98, 97, 96};
    cr_assert_eq(run_seq(mgr, &b, bt, 12, 0, NULL), 8, "two blocks match, the third differs at once");
    cr_assert_eq(b.n_cached, 8);
    cr_assert_eq(b.table.blocks[0], a.table.blocks[0]);
    cr_assert_eq(b.table.blocks[1], a.table.blocks[1]);
    cr_assert_neq(b.table.blocks[2], a.table.blocks[2]);
    cr_assert_eq(pool->refcount[a.table.blocks[0]], 3, "a, b and the cache");
    assert_kv_of(mgr, &b, bt);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.hits, 1);
    cr_assert_eq(st.misses, 1);
    cr_assert_eq(st.hit_tokens, 8);
    cr_assert_eq(st.blocks, 4, "a's three blocks and b's own third");
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    finish(mgr);
}

Test(prefix_cache, a_whole_prompt_hit_stops_one_token_short_and_copies_on_write)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_pool *pool = kv_manager_pool(mgr);
    struct kv_seq a, b;
    run_seq(mgr, &a, A, 12, 0, NULL);
    uint32_t a_last = a.table.blocks[2];
    kv_manager_free(mgr, &a);
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &b, A, 12), 11, "the last token is computed");
    cr_assert_eq(b.table.n_blocks, 3);
    cr_assert_neq(b.table.blocks[2], a_last, "a partly reused block is a copy");
    cr_assert_eq(pool->refcount[b.table.blocks[2]], 1, "the copy is b's alone");
    cr_assert_eq(pool->refcount[a_last], 1, "the original is the cache's alone");
    assert_kv_of(mgr, &b, A);
    kv_manager_free(mgr, &b);
    finish(mgr);
}

Test(prefix_cache, a_partial_block_match_reuses_exactly_the_matching_tokens)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, b, c;
    run_seq(mgr, &a, A, 12, 0, NULL);
    int32_t bt[14] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 77, 78, 79, 80};
    cr_assert_eq(run_seq(mgr, &b, bt, 14, 0, NULL), 10);
    assert_kv_of(mgr, &b, bt);
    /* A prompt shorter than a block matches part of a cached first block. */
    int32_t ct[3] = {10, 11, 55};
    cr_assert_eq(run_seq(mgr, &c, ct, 3, 0, NULL), 2);
    assert_kv_of(mgr, &c, ct);
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    kv_manager_free(mgr, &c);
    finish(mgr);
}

Test(prefix_cache, a_running_sequence_shares_its_published_prompt_blocks)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_pool *pool = kv_manager_pool(mgr);
    struct kv_seq a, b;
    /* a computes its 12 prompt tokens and publishes them while it keeps running */
    run_seq(mgr, &a, A, 12, 0, NULL);
    int32_t bt[13];
    memcpy(bt, A, sizeof A);
    bt[12] = 5;
    cr_assert_eq(run_seq(mgr, &b, bt, 13, 0, NULL), 12);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pool->refcount[a.table.blocks[i]], 3);
    /* b computed nothing of a's; publishing again adds nothing */
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.blocks, 3);
    kv_manager_free(mgr, &b);
    kv_manager_free(mgr, &a);
    finish(mgr);
}

Test(prefix_cache, a_duplicate_block_is_not_cached_twice_and_the_chain_goes_on)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, b, c;
    /* a and b are admitted before either publishes: both compute block 0 */
    kv_seq_init(&a);
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &a, A, 12), 0);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &b, A, 12), 0);
    struct err err = {0};
    cr_assert_eq(kv_manager_allocate_slots(mgr, &a, 4, &err), 0);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 8, &err), 0);
    kv_manager_publish(mgr, &a, A, 4);
    kv_manager_publish(mgr, &b, A, 8); /* block 0 is a's; b's block 1 hangs under it */
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.blocks, 2);
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &c, A, 12), 8);
    cr_assert_eq(c.table.blocks[0], a.table.blocks[0]);
    cr_assert_eq(c.table.blocks[1], b.table.blocks[1]);
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    kv_manager_free(mgr, &c);
    finish(mgr);
}

Test(prefix_cache, namespaces_never_share)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, b, c;
    run_seq(mgr, &a, A, 12, 1, NULL);
    cr_assert_eq(run_seq(mgr, &b, A, 12, 2, NULL), 0, "another tenant's KV is never reused");
    cr_assert_eq(run_seq(mgr, &c, A, 12, 1, NULL), 11);
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    kv_manager_free(mgr, &c);
    finish(mgr);
}

Test(prefix_cache, allocation_evicts_leaves_first_least_recently_used)
{
    /* 6 blocks: a's chain of 3 and b's chain of 2 cached, 1 free */
    struct kv_manager *mgr = cache(6, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, b, c, probe;
    run_seq(mgr, &a, A, 12, 0, NULL);
    int32_t bt[8] = {40, 41, 42, 43, 50, 51, 52, 53};
    run_seq(mgr, &b, bt, 8, 0, NULL);
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    cr_assert_eq(kv_manager_free_blocks(mgr), 1);
    cr_assert_eq(kv_manager_available_blocks(mgr), 6);
    /* c needs 2 blocks: one free, one evicted: a's leaf, the oldest leaf */
    struct err err = {0};
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 8, &err), 0, "%s", err.msg);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.evictions, 1);
    kv_seq_init(&probe);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &probe, A, 12), 8, "a keeps its first two blocks");
    kv_manager_free(mgr, &probe);
    /* the probe made a's blocks the most recent: b's leaf goes next */
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 4, &err), 0, "%s", err.msg);
    kv_seq_init(&probe);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &probe, bt, 8), 4);
    kv_manager_free(mgr, &probe);
    /* everything cached can go, children before their parents */
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 12, &err), 0, "%s", err.msg);
    cr_assert_eq(c.table.n_blocks, 6);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 4, &err), -INFERD_ENOMEM);
    kv_manager_free(mgr, &c);
    finish(mgr);
}

Test(prefix_cache, a_block_held_by_a_sequence_is_never_evicted)
{
    struct kv_manager *mgr = cache(4, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, c;
    run_seq(mgr, &a, A, 12, 0, NULL);
    struct err err = {0};
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 4, &err), 0);
    cr_assert_eq(kv_manager_available_blocks(mgr), 0);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 4, &err), -INFERD_ENOMEM);
    assert_kv_of(mgr, &a, A);
    kv_manager_free(mgr, &c);
    kv_manager_free(mgr, &a);
    finish(mgr);
}

Test(prefix_cache, cost_size_keeps_the_reused_block_that_lru_would_drop)
{
    int32_t bt[8] = {40, 41, 42, 43, 50, 51, 52, 53};
    for (int policy = 0; policy < 2; policy++) {
        struct kv_manager *mgr = cache(6, 1 << 20, policy ? KV_RETAIN_COST_SIZE : KV_RETAIN_LRU);
        struct kv_seq a, b, hit, c, probe;
        int32_t at[8];
        memcpy(at, A, sizeof at);
        run_seq(mgr, &a, at, 8, 0, NULL);
        kv_manager_free(mgr, &a);
        for (int i = 0; i < 2; i++) { /* a's prefix is reused twice */
            cr_assert_eq(run_seq(mgr, &hit, at, 8, 0, NULL), 7);
            kv_manager_free(mgr, &hit);
        }
        run_seq(mgr, &b, bt, 8, 0, NULL); /* b is newer, never reused */
        kv_manager_free(mgr, &b);
        struct err err = {0};
        kv_seq_init(&c);
        /* 6 blocks: a's 2, b's 2 cached, 2 free; c takes 3 */
        cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 12, &err), 0, "%s", err.msg);
        kv_manager_free(mgr, &c); /* so the probes below evict nothing more */
        kv_seq_init(&probe);
        int a_left = kv_manager_computed_blocks(mgr, &probe, at, 8);
        kv_manager_free(mgr, &probe);
        kv_seq_init(&probe);
        int b_left = kv_manager_computed_blocks(mgr, &probe, bt, 8);
        kv_manager_free(mgr, &probe);
        if (policy) {
            cr_assert_eq(a_left, 7, "cost-size keeps the reused block");
            cr_assert_eq(b_left, 4, "and evicts the newer one nobody reused");
        } else {
            cr_assert_eq(a_left, 4, "LRU evicts the older one");
            cr_assert_eq(b_left, 7);
        }
        finish(mgr);
    }
}

Test(prefix_cache, unreferenced_bytes_stay_under_the_cap)
{
    struct kv_manager *mgr = cache(16, 2 * block_bytes(), KV_RETAIN_LRU);
    struct kv_seq a;
    run_seq(mgr, &a, A, 12, 0, NULL);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.blocks, 3, "blocks a sequence holds do not count against the cap");
    cr_assert_eq(st.max_bytes, 2 * block_bytes());
    kv_manager_free(mgr, &a);
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.unreferenced_blocks, 2);
    cr_assert_eq(st.bytes, 2 * block_bytes());
    cr_assert_eq(st.evictions, 1);
    struct kv_seq probe;
    kv_seq_init(&probe);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &probe, A, 12), 8, "the leaf went first");
    kv_manager_free(mgr, &probe);
    finish(mgr);
}

Test(prefix_cache, session_blocks_outlive_plain_ones_until_the_session_closes)
{
    struct kv_manager *mgr = cache(6, 1 << 20, KV_RETAIN_LRU);
    kv_manager_tick(mgr, 100);
    struct kv_seq a, b, c, probe;
    int32_t at[8], bt[8] = {40, 41, 42, 43, 50, 51, 52, 53};
    memcpy(at, A, sizeof at);
    run_seq(mgr, &a, at, 8, 0, "s1"); /* older, but in a session */
    run_seq(mgr, &b, bt, 8, 0, NULL);
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 1);
    struct err err = {0};
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 16, &err), 0, "%s", err.msg); /* 2 evicted */
    kv_manager_free(mgr, &c);
    kv_seq_init(&probe);
    probe.session = "s1";
    cr_assert_eq(kv_manager_computed_blocks(mgr, &probe, at, 8), 7, "the session's blocks stay");
    kv_manager_free(mgr, &probe);
    kv_seq_init(&probe);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &probe, bt, 8), 0, "b's went first");
    kv_manager_free(mgr, &probe);
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.session_hits, 1);
    cr_assert_eq(st.session_misses, 1, "a's own first lookup");
    cr_assert_eq(kv_manager_close_session(mgr, "nobody"), -1);
    cr_assert_eq(kv_manager_close_session(mgr, "s1"), 2, "released its two blocks");
    cr_assert_eq(kv_manager_close_session(mgr, "s1"), -1, "closed once");
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 0);
    finish(mgr);
}

Test(prefix_cache, an_idle_session_closes_by_itself)
{
    struct kv_manager *mgr = cache(8, 1 << 20, KV_RETAIN_LRU);
    kv_manager_tick(mgr, 5000);
    struct kv_seq a;
    run_seq(mgr, &a, A, 8, 0, "s1");
    kv_manager_free(mgr, &a);
    struct kv_prefix_stats st;
    kv_manager_tick(mgr, 5900); /* idle 900 of the 1000 allowed */
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 1);
    kv_manager_tick(mgr, 6001);
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 0);
    cr_assert_eq(kv_manager_close_session(mgr, "s1"), -1);
    finish(mgr);
}

Test(prefix_cache, truncating_into_a_shared_block_writes_a_copy)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_pool *pool = kv_manager_pool(mgr);
    struct kv_seq a;
    run_seq(mgr, &a, A, 12, 0, NULL);
    uint32_t cached_last = a.table.blocks[2];
    kv_manager_truncate(mgr, &a, 10);
    cr_assert_eq(a.n_tokens, 10);
    cr_assert_neq(a.table.blocks[2], cached_last, "the cached block is never written again");
    cr_assert_eq(pool->refcount[a.table.blocks[2]], 1);
    assert_kv_of(mgr, &a, A);
    kv_manager_free(mgr, &a);
    finish(mgr);
}

/* ---- partial entries: the last, partly filled block of a retired sequence ---- */

static struct kv_prefix_stats stats_of(struct kv_manager *mgr)
{
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    return st;
}

Test(prefix_cache, a_retired_sequences_partial_block_is_cached_and_reused_by_copy)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    struct kv_pool *pool = kv_manager_pool(mgr);
    run_retired(mgr, A, 10, "s1"); /* [10 11 12 13][20 21 22 23][30 31 . .] */
    struct kv_prefix_stats st = stats_of(mgr);
    cr_assert_eq(st.blocks, 3);
    cr_assert_eq(st.partial_blocks, 1);
    cr_assert_eq(st.unreferenced_blocks, 3, "the sequence let go of all three");
    cr_assert_eq(kv_manager_free_blocks(mgr), 13);
    /* The next turn: all 10 tokens reused, the partial ones by copy. */
    struct kv_seq b;
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &b, A, 12), 10);
    cr_assert_eq(b.table.n_blocks, 3);
    cr_assert_eq(pool->refcount[b.table.blocks[2]], 1, "the copy is b's own");
    assert_kv_of(mgr, &b, A);
    st = stats_of(mgr);
    cr_assert_eq(st.blocks, 3, "nothing new is cached by a lookup");
    cr_assert_eq(st.unreferenced_blocks, 1, "the partial entry stays the cache's alone");
    kv_manager_free(mgr, &b);
    /* Only the matching tokens of a partial entry are reused, never past its length. */
    int32_t other[11] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 99, 98};
    cr_assert_eq(probe(mgr, other, 11), 9);
    int32_t longer[14] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33, 1, 2};
    cr_assert_eq(probe(mgr, longer, 14), 10, "the entry holds 2 valid tokens, not 4");
    /* A prompt shorter than a block: a partial entry with no parent. */
    int32_t short_prompt[3] = {60, 61, 62}, again[5] = {60, 61, 62, 63, 64};
    run_retired(mgr, short_prompt, 3, NULL);
    cr_assert_eq(stats_of(mgr).partial_blocks, 2);
    cr_assert_eq(probe(mgr, again, 5), 3);
    /* The session's blocks count the partial one. */
    cr_assert_eq(kv_manager_close_session(mgr, "s1"), 3);
    finish(mgr);
}

Test(prefix_cache, a_full_block_supersedes_the_partial_entry_it_extends)
{
    struct kv_manager *mgr = cache(16, 1 << 20, KV_RETAIN_LRU);
    run_retired(mgr, A, 9, NULL); /* partial [30] */
    cr_assert_eq(stats_of(mgr).partial_blocks, 1);
    cr_assert_eq(run_retired(mgr, A, 11, NULL), 9, "[30] reused by copy");
    struct kv_prefix_stats st = stats_of(mgr);
    cr_assert_eq(st.partial_blocks, 1, "[30 31 32] superseded [30]");
    cr_assert_eq(st.blocks, 3);
    cr_assert_eq(st.evictions, 0, "superseding is not evicting");
    cr_assert_eq(kv_manager_free_blocks(mgr), 13, "the superseded block went back to the pool");
    /* A partial block whose tokens differ stands beside it. */
    int32_t fork[10] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 77};
    run_retired(mgr, fork, 10, NULL);
    cr_assert_eq(stats_of(mgr).partial_blocks, 2);
    /* One that an entry already covers is not cached again. */
    run_retired(mgr, A, 10, NULL);
    st = stats_of(mgr);
    cr_assert_eq(st.partial_blocks, 2, "[30 31] starts [30 31 32]");
    cr_assert_eq(st.blocks, 4);
    /* The full block supersedes every partial entry it extends, not the fork. */
    run_retired(mgr, A, 12, NULL);
    st = stats_of(mgr);
    cr_assert_eq(st.partial_blocks, 1, "only the fork is left");
    cr_assert_eq(st.blocks, 4);
    cr_assert_eq(kv_manager_free_blocks(mgr), 12);
    cr_assert_eq(probe(mgr, A, 12), 11);
    cr_assert_eq(probe(mgr, fork, 10), 9);
    int32_t fork_more[11] = {10, 11, 12, 13, 20, 21, 22, 23, 30, 77, 5};
    cr_assert_eq(probe(mgr, fork_more, 11), 10);
    finish(mgr);
}

Test(prefix_cache, partial_entries_are_evicted_as_leaves_and_cost_a_whole_block)
{
    /* 4 blocks: A's two full blocks and its partial one cached, one free. */
    struct kv_manager *mgr = cache(4, 1 << 20, KV_RETAIN_LRU);
    run_retired(mgr, A, 10, NULL);
    cr_assert_eq(kv_manager_free_blocks(mgr), 1);
    cr_assert_eq(kv_manager_available_blocks(mgr), 4);
    struct err err = {0};
    struct kv_seq c;
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 8, &err), 0, "%s", err.msg);
    struct kv_prefix_stats st = stats_of(mgr);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(st.partial_blocks, 0, "the partial entry was the only leaf");
    cr_assert_eq(probe(mgr, A, 12), 8);
    kv_manager_free(mgr, &c);
    finish(mgr);

    /* Under a cap of two blocks, the partial entry counts as a whole one. */
    mgr = cache(16, 2 * block_bytes(), KV_RETAIN_LRU);
    run_retired(mgr, A, 10, NULL);
    st = stats_of(mgr);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(st.blocks, 2);
    cr_assert_eq(st.bytes, 2 * block_bytes());
    cr_assert_eq(st.partial_blocks, 0);
    finish(mgr);
}

Test(prefix_cache, a_partial_entry_hangs_under_its_chain_walked_again_after_eviction)
{
    struct kv_manager *mgr = cache(8, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, b, c;
    struct err err = {0};
    kv_seq_init(&a);
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &a, A, 12), 0);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &b, A, 12), 0);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &a, 8, &err), 0);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 10, &err), 0);
    compute(mgr, &a, A, 0, 8);
    compute(mgr, &b, A, 0, 10);
    kv_manager_publish(mgr, &a, A, 8);
    kv_manager_publish(mgr, &b, A, 8); /* b's chain goes through a's blocks */
    kv_manager_free(mgr, &a);
    /* a's blocks are evicted, b's chain end with them */
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 20, &err), 0, "%s", err.msg);
    cr_assert_eq(stats_of(mgr).evictions, 2);
    kv_manager_retire(mgr, &b, A, 10);
    struct kv_prefix_stats st = stats_of(mgr);
    cr_assert_eq(st.blocks, 3, "b's own two full blocks, then its partial one");
    cr_assert_eq(st.partial_blocks, 1);
    kv_manager_free(mgr, &c);
    cr_assert_eq(probe(mgr, A, 12), 10);
    finish(mgr);
}

Test(prefix_cache, retiring_with_the_cache_off_only_frees)
{
    struct kv_manager *mgr = NULL;
    struct err err = {0};
    cr_assert_eq(kv_manager_create(&model, be, 8, BS, &mgr, &err), 0, "%s", err.msg);
    struct kv_seq a;
    kv_seq_init(&a);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &a, 10, &err), 0);
    kv_manager_retire(mgr, &a, A, 10);
    cr_assert_eq(kv_manager_free_blocks(mgr), 8);
    kv_manager_destroy(mgr);
}

/* run_seq for a sequence with a retention hint over its first n_retain positions. */
static void run_retained(struct kv_manager *mgr, struct kv_seq *s, const int32_t *tokens, int n,
                         uint64_t ns, int n_retain)
{
    struct err err = {0};
    kv_seq_init(s);
    s->ns = ns;
    s->n_retain = n_retain;
    int cached = kv_manager_computed_blocks(mgr, s, tokens, n);
    cr_assert_eq(kv_manager_allocate_slots(mgr, s, n - cached, &err), 0, "%s", err.msg);
    compute(mgr, s, tokens, cached, n);
    kv_manager_publish(mgr, s, tokens, n);
}

static int probe_ns(struct kv_manager *mgr, const int32_t *tokens, int n, uint64_t ns)
{
    struct kv_seq s;
    kv_seq_init(&s);
    s.ns = ns;
    int cached = kv_manager_computed_blocks(mgr, &s, tokens, n);
    kv_manager_free(mgr, &s);
    return cached;
}

Test(prefix_cache, a_retention_hint_keeps_the_blocks_up_to_it_ahead_of_plain_ones)
{
    struct kv_manager *mgr = cache(6, 1 << 20, KV_RETAIN_LRU);
    kv_manager_tick(mgr, 100);
    struct kv_seq a, b, c;
    int32_t bt[8] = {40, 41, 42, 43, 50, 51, 52, 53};
    run_retained(mgr, &a, A, 12, 7, 6); /* older; its first block (positions 0..3) retained */
    run_seq(mgr, &b, bt, 8, 7, NULL);
    kv_manager_free(mgr, &a);
    kv_manager_free(mgr, &b);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 1, "the hint opens the namespace's retention session");
    /* 1 free block and 3 evictions: a's two plain blocks (older), then b's leaf */
    struct err err = {0};
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 16, &err), 0, "%s", err.msg);
    cr_assert_eq(probe_ns(mgr, A, 12, 7), 4, "a's retained block stays");
    /* one more: b's first block goes although a's retained one is older */
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 4, &err), 0, "%s", err.msg);
    cr_assert_eq(probe_ns(mgr, bt, 8, 7), 0, "b's plain blocks went first");
    cr_assert_eq(probe_ns(mgr, A, 12, 7), 4, "the retained block outlives them");
    kv_manager_free(mgr, &c);
    /* The hint lapses like a session: idle past session_idle_ns, the blocks turn plain. */
    kv_manager_tick(mgr, 2000);
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 0);
    finish(mgr);
}

Test(prefix_cache, a_later_request_with_the_hint_marks_the_cached_prefix_it_finds)
{
    struct kv_manager *mgr = cache(6, 1 << 20, KV_RETAIN_LRU);
    struct kv_seq a, a2, b, c;
    int32_t bt[8] = {40, 41, 42, 43, 50, 51, 52, 53};
    run_seq(mgr, &a, A, 8, 7, NULL);      /* no hint: plain */
    kv_manager_free(mgr, &a);
    run_retained(mgr, &a2, A, 8, 7, 8);   /* same prefix, with a hint over both blocks */
    kv_manager_free(mgr, &a2);
    run_seq(mgr, &b, bt, 8, 7, NULL);
    kv_manager_free(mgr, &b);
    struct err err = {0};
    kv_seq_init(&c);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &c, 16, &err), 0, "%s", err.msg); /* 2 evicted */
    kv_manager_free(mgr, &c); /* room for the probes' copies of partly matching blocks */
    cr_assert_eq(probe_ns(mgr, bt, 8, 7), 0, "the plain blocks went");
    cr_assert_eq(probe_ns(mgr, A, 8, 7), 7, "the hinted prefix stayed");
    /* Another namespace gets its own retention session. */
    run_retained(mgr, &a, A, 8, 8, 8);
    kv_manager_free(mgr, &a);
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    cr_assert_eq(st.sessions, 2);
    finish(mgr);
}
