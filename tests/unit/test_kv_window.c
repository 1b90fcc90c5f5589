/* tests/unit/test_kv_window.c — windowed KV pools: Gemma 3's local layers keep only their window's slots (bounded for a long sequence), give the same logits bit for bit as a plain pool, and a prefix cache hit past the window equals the cold run, or is cut where the window's slots are gone. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "kv/kv.h"
#include "model/model.h"
#include "tools/mkmodel.h"
#include "test_support.h"

#define BS 4
#define LONG 120 /* positions: the window (16) many times over */

struct rig {
    char *dir;
    struct backend *be;
    struct model *m;
    struct forward_state *st;
    int vocab, window;
};

typedef int (*backend_maker)(const struct backend_options *, struct backend **, struct err *);

static int make_cpu(const struct backend_options *opt, struct backend **out, struct err *err)
{
    return backend_cpu_create(opt, out, err);
}

static int make_cuda(const struct backend_options *opt, struct backend **out, struct err *err)
{
    return backend_cuda_create(0, opt, out, err);
}

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: windowed pools on CUDA not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: windowed pools on CUDA not checked");
}

static void rig_open_on(struct rig *r, backend_maker make)
{
    struct err err = {0};
    r->dir = test_mkdtemp();
    struct mkmodel_opts o = {.preset = "tiny-gemma3", .seed = 5, .out_dir = r->dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    cr_assert_eq(make(&(struct backend_options){.threads = 2, .mode = COMPUTE_EXACT}, &r->be, &err),
                 0, "%s", err.msg);
    cr_assert_eq(model_load(r->dir, r->be, &r->m, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(r->m, LONG + 8, &r->st, &err), 0, "%s", err.msg);
    r->vocab = r->m->config.vocab_size;
    r->window = r->m->config.sliding_window;
    cr_assert_eq(r->window, 16);
}

static void rig_open(struct rig *r) { rig_open_on(r, make_cpu); }

static void rig_close(struct rig *r)
{
    forward_state_free(r->st);
    model_free(r->m);
    backend_destroy(r->be);
    test_rmtree(r->dir);
    free(r->dir);
}

static void prompt_of(int32_t *t, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % 331);
    }
}

/* Computes tokens[seq->n_tokens, n) in chunks of chunk through mgr, publishing
 * after each step; logits of every position computed go to logits (rows by
 * position). Returns the most window slots the sequence held at once. */
static int run(struct rig *r, struct kv_manager *mgr, struct kv_seq *seq, const int32_t *tokens,
               int n, int chunk, float *logits)
{
    struct err err = {0};
    int most = 0, total = kv_manager_total_slots(mgr);
    (void)total;
    while (seq->n_tokens < n) {
        int pos0 = seq->n_tokens, k = n - pos0 < chunk ? n - pos0 : chunk;
        cr_assert_eq(kv_manager_allocate_slots(mgr, seq, k, &err), 0, "%s", err.msg);
        struct batch_seq bs = {.tokens = tokens + pos0, .n_tokens = k, .pos0 = pos0,
                               .block_ids = seq->table.blocks, .n_block_ids = seq->table.n_blocks,
                               .all_logits = true};
        struct batch b = {&bs, 1};
        cr_assert_eq(model_forward(r->m, r->st, kv_manager_cache(mgr), &b,
                                   logits + (size_t)pos0 * r->vocab, &err),
                     0, "%s", err.msg);
        kv_manager_publish(mgr, seq, tokens, seq->n_tokens);
        /* what the sequence itself holds (the cache may keep more while slots are free) */
        int held = total ? seq->table.n_blocks - seq->window_from : 0;
        most = held > most ? held : most;
    }
    return most;
}

/* The whole prompt in one step of a plain pool: the reference. */
static float *cold(struct rig *r, const int32_t *tokens, int n)
{
    struct err err = {0};
    struct kv_manager *mgr;
    cr_assert_eq(kv_manager_create(r->m, r->be, kv_blocks_for(n, BS), BS, &mgr, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(kv_manager_total_slots(mgr), 0);
    struct kv_seq seq;
    kv_seq_init(&seq);
    float *logits = malloc((size_t)n * r->vocab * sizeof *logits);
    run(r, mgr, &seq, tokens, n, n, logits);
    kv_manager_free(mgr, &seq);
    kv_manager_destroy(mgr);
    return logits;
}

static struct kv_manager *windowed(struct rig *r, int n_blocks, int n_slots, bool cached)
{
    struct err err = {0};
    struct kv_manager *mgr;
    cr_assert_eq(kv_manager_create_windowed(r->m, r->be, n_blocks, n_slots, BS, &mgr, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(kv_manager_total_slots(mgr), n_slots);
    if (cached) {
        struct kv_prefix_config cfg = {.max_bytes = 1 << 24, .model_digest = 7};
        cr_assert_eq(kv_manager_prefix_enable(mgr, &cfg, &err), 0, "%s", err.msg);
    }
    return mgr;
}

static void expect_rows_equal(struct rig *r, const float *a, const float *b, int from, int to,
                              const char *what)
{
    size_t row = (size_t)r->vocab;
    cr_assert_eq(memcmp(a + from * row, b + from * row, (size_t)(to - from) * row * sizeof *a), 0,
                 "%s: logits of positions %d..%d differ from the cold run", what, from, to - 1);
}

static void check_long(backend_maker make)
{
    struct rig r;
    rig_open_on(&r, make);
    int32_t tokens[LONG];
    prompt_of(tokens, LONG, 1);
    float *want = cold(&r, tokens, LONG);
    for (int chunk = 1; chunk <= 7; chunk += 6) {
        int per_seq = kv_manager_slots_per_seq(&r.m->config, BS, chunk);
        struct kv_manager *mgr = windowed(&r, kv_blocks_for(LONG, BS), per_seq, false);
        struct kv_seq seq;
        kv_seq_init(&seq);
        float *got = malloc((size_t)LONG * r.vocab * sizeof *got);
        int most = run(&r, mgr, &seq, tokens, LONG, chunk, got);
        /* the global layers keep every block, the local ones their window's */
        cr_assert_eq(seq.table.n_blocks, LONG / BS);
        cr_assert_leq(most, per_seq, "chunk %d: %d slots held, the window needs %d", chunk, most,
                      per_seq);
        cr_assert_lt(per_seq, LONG / BS / 2);
        expect_rows_equal(&r, want, got, 0, LONG, chunk == 1 ? "token by token" : "chunks of 7");
        kv_manager_free(mgr, &seq);
        cr_assert_eq(kv_manager_free_slots(mgr), per_seq, "a slot leaked");
        cr_assert_eq(kv_manager_free_blocks(mgr), kv_blocks_for(LONG, BS), "a block leaked");
        kv_manager_destroy(mgr);
        free(got);
    }
    free(want);
    rig_close(&r);
}

Test(kv_window, a_long_sequence_holds_only_its_windows_slots_and_matches_a_plain_pool,
     .timeout = 120)
{
    check_long(make_cpu);
}

Test(kv_window, on_cuda_a_long_sequence_holds_only_its_windows_slots_and_matches_a_plain_pool,
     .timeout = 300)
{
    skip_without_gpu();
    check_long(make_cuda);
}

/* A sequence longer than the window leaves its blocks' slots with the cache
 * while slots are free: a prompt that continues it reuses all of it, one
 * that leaves it earlier reuses up to there, and both compute the rest to the
 * cold run's bits. */
static void check_hit(backend_maker make)
{
    struct rig r;
    rig_open_on(&r, make);
    enum { FIRST = 42, MORE = 58 };
    int32_t a[MORE], b[MORE];
    prompt_of(a, MORE, 2);
    memcpy(b, a, sizeof b);
    prompt_of(b + 26, MORE - 26, 3); /* leaves a at 26, well behind a's window at 42 */
    float *want_a = cold(&r, a, MORE), *want_b = cold(&r, b, MORE);
    float *got = malloc((size_t)MORE * r.vocab * sizeof *got);
    int per_seq = kv_manager_slots_per_seq(&r.m->config, BS, 5);
    struct kv_manager *mgr = windowed(&r, 64, 3 * per_seq, true);

    struct kv_seq first;
    kv_seq_init(&first);
    run(&r, mgr, &first, a, FIRST, 5, got);
    kv_manager_retire(mgr, &first, a, FIRST);
    int kept = kv_manager_total_slots(mgr) - kv_manager_free_slots(mgr);
    cr_assert_eq(kept, kv_blocks_for(FIRST, BS), "the cache keeps the slots while they are free");

    struct kv_seq again;
    kv_seq_init(&again);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &again, a, MORE), FIRST);
    run(&r, mgr, &again, a, MORE, 5, got);
    expect_rows_equal(&r, want_a, got, FIRST, MORE, "after a hit on 42 positions");
    kv_manager_retire(mgr, &again, a, MORE);

    struct kv_seq other;
    kv_seq_init(&other);
    int reused = kv_manager_computed_blocks(mgr, &other, b, MORE);
    cr_assert_eq(reused, 26, "b shares 26 positions with a");
    run(&r, mgr, &other, b, MORE, 5, got);
    expect_rows_equal(&r, want_b, got, reused, MORE, "after a hit on 26 positions");
    kv_manager_free(mgr, &other);

    kv_manager_prefix_clear(mgr);
    cr_assert_eq(kv_manager_free_slots(mgr), kv_manager_total_slots(mgr), "a slot leaked");
    cr_assert_eq(kv_manager_free_blocks(mgr), 64, "a block leaked");
    kv_manager_destroy(mgr);
    free(got);
    free(want_a);
    free(want_b);
    rig_close(&r);
}

Test(kv_window, a_cache_hit_past_the_window_equals_the_cold_run, .timeout = 120)
{
    check_hit(make_cpu);
}

Test(kv_window, on_cuda_a_cache_hit_past_the_window_equals_the_cold_run, .timeout = 300)
{
    skip_without_gpu();
    check_hit(make_cuda);
}

/* Slots the cache keeps are given up when running sequences need them: a
 * hit that needs them is then cut (here to nothing), never served without
 * them, and still exact. */
Test(kv_window, cached_slots_give_way_to_running_sequences_and_the_hit_is_cut, .timeout = 120)
{
    struct rig r;
    rig_open(&r);
    int32_t a[60], b[60];
    prompt_of(a, 60, 4);
    prompt_of(b, 60, 5);
    float *want_a = cold(&r, a, 60);
    float *got = malloc((size_t)60 * r.vocab * sizeof *got);
    int per_seq = kv_manager_slots_per_seq(&r.m->config, BS, 5);
    struct kv_manager *mgr = windowed(&r, 64, per_seq, true);
    struct kv_seq s;
    kv_seq_init(&s);
    run(&r, mgr, &s, a, 40, 5, got);
    kv_manager_retire(mgr, &s, a, 40);
    cr_assert_lt(kv_manager_free_slots(mgr), per_seq);
    /* another sequence takes every slot */
    kv_seq_init(&s);
    run(&r, mgr, &s, b, 60, 5, got);
    kv_manager_retire(mgr, &s, b, 60);
    kv_seq_init(&s);
    int reused = kv_manager_computed_blocks(mgr, &s, a, 60);
    cr_assert_eq(reused, 0, "a's window slots went to b");
    run(&r, mgr, &s, a, 60, 5, got);
    expect_rows_equal(&r, want_a, got, reused, 60, "after the cached slots were taken");
    kv_manager_free(mgr, &s);
    kv_manager_destroy(mgr);
    free(got);
    free(want_a);
    rig_close(&r);
}

/* A truncation by one position keeps the window (the last token computed
 * again); one further back than the slots reach empties the sequence. */
Test(kv_window, truncating_behind_the_slots_empties_the_sequence, .timeout = 120)
{
    struct rig r;
    rig_open(&r);
    int32_t a[60];
    prompt_of(a, 60, 6);
    float *want = cold(&r, a, 60);
    float *got = malloc((size_t)60 * r.vocab * sizeof *got);
    struct kv_manager *mgr = windowed(&r, 64, 16, false);
    struct kv_seq s;
    kv_seq_init(&s);
    run(&r, mgr, &s, a, 50, 5, got);
    kv_manager_truncate(mgr, &s, 49);
    cr_assert_eq(s.n_tokens, 49);
    run(&r, mgr, &s, a, 60, 5, got);
    expect_rows_equal(&r, want, got, 49, 60, "after a truncation by one");
    kv_manager_truncate(mgr, &s, 20);
    cr_assert_eq(s.n_tokens, 0);
    cr_assert_eq(kv_manager_free_slots(mgr), 16);
    run(&r, mgr, &s, a, 60, 5, got);
    expect_rows_equal(&r, want, got, 0, 60, "computed again");
    kv_manager_free(mgr, &s);
    kv_manager_destroy(mgr);
    free(got);
    free(want);
    rig_close(&r);
}

/* The SSD tier stores blocks of every layer: a windowed pool refuses it, and
 * the scheduler makes a plain pool when a tier is asked for. */
Test(kv_window, the_ssd_tier_is_refused_over_a_windowed_pool, .timeout = 60)
{
    struct rig r;
    rig_open(&r);
    struct kv_manager *mgr = windowed(&r, 16, 8, true);
    struct kv_tier_config cfg = {0};
    struct err err = {0};
    cr_assert_eq(kv_manager_tier_enable(mgr, &cfg, &err), -INFERD_EINVAL);
    cr_assert(strstr(err.msg, "sliding-window"), "%s", err.msg);
    kv_manager_destroy(mgr);
    rig_close(&r);
}

/* A forward whose table's window block has no slot is an error, never a
 * read of other K/V. */
Test(kv_window, a_window_block_without_a_slot_is_refused_by_the_forward, .timeout = 60)
{
    struct rig r;
    rig_open(&r);
    struct kv_manager *mgr = windowed(&r, 16, 8, false);
    struct kv_pool *pool = kv_manager_pool(mgr);
    struct kv_seq s;
    kv_seq_init(&s);
    struct err err = {0};
    int32_t t[8];
    prompt_of(t, 8, 7);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 8, &err), 0, "%s", err.msg);
    kv_pool_slot_release(pool, s.table.blocks[0]);
    struct batch_seq bs = {.tokens = t + 4, .n_tokens = 4, .pos0 = 4,
                           .block_ids = s.table.blocks, .n_block_ids = s.table.n_blocks};
    struct batch b = {&bs, 1};
    float *logits = malloc((size_t)r.vocab * sizeof *logits);
    cr_assert_eq(model_forward(r.m, r.st, kv_manager_cache(mgr), &b, logits, &err),
                 -INFERD_EINVAL);
    cr_assert(strstr(err.msg, "sliding window"), "%s", err.msg);
    free(logits);
    kv_manager_destroy(mgr);
    rig_close(&r);
}

/* Slots the running sequences hold are theirs: another sequence's allocation
 * fails (the scheduler then preempts), and the cached blocks stay. */
Test(kv_window, slots_held_by_running_sequences_make_allocation_fail_and_keep_the_cache,
     .timeout = 60)
{
    struct rig r;
    rig_open(&r);
    int32_t a[40];
    prompt_of(a, 40, 8);
    float *got = malloc((size_t)40 * r.vocab * sizeof *got);
    int per_seq = kv_manager_slots_per_seq(&r.m->config, BS, 5);
    struct kv_manager *mgr = windowed(&r, 64, per_seq, true);
    struct kv_seq s, t;
    kv_seq_init(&s);
    kv_seq_init(&t);
    run(&r, mgr, &s, a, 40, 5, got);
    struct kv_prefix_stats before, after;
    kv_manager_prefix_stats(mgr, &before);
    cr_assert_gt(before.blocks, 0);
    struct err err = {0};
    int free_before = kv_manager_free_slots(mgr);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &t, 5 * per_seq, &err), -INFERD_ENOMEM);
    cr_assert(strstr(err.msg, "window slots"), "%s", err.msg);
    cr_assert_eq(t.n_tokens, 0);
    kv_manager_prefix_stats(mgr, &after);
    cr_assert_eq(after.blocks, before.blocks, "the cache was evicted for nothing");
    cr_assert_eq(kv_manager_free_slots(mgr), free_before, "the cache's slots went for nothing");
    kv_manager_free(mgr, &t);
    kv_manager_free(mgr, &s);
    kv_manager_destroy(mgr);
    free(got);
    rig_close(&r);
}
