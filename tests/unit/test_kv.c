/* tests/unit/test_kv.c — the KV manager hands out slots across block boundaries, fails whole
 * when the pool is full, truncates and frees through reference counts, and the KV format
 * states the bytes a token and a block cost. */
#include <criterion/criterion.h>
#include <string.h>

#include "kv/kv.h"

static struct backend *be;
static struct model model;

static void setup(void)
{
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1, .mode = COMPUTE_EXACT}, &be, &err), 0, "%s", err.msg);
    model.config.n_layers = 2;
    model.config.n_kv_heads = 2;
    model.config.head_dim = 8;
    model.backend = be;
}

static void teardown(void) { backend_destroy(be); }

TestSuite(kv, .init = setup, .fini = teardown);

static struct kv_manager *manager(int n_blocks, int block_size)
{
    struct kv_manager *mgr = NULL;
    struct err err = {0};
    cr_assert_eq(kv_manager_create(&model, be, n_blocks, block_size, &mgr, &err), 0, "%s",
                 err.msg);
    return mgr;
}

Test(kv, slots_grow_a_block_at_each_boundary)
{
    struct kv_manager *mgr = manager(8, 4);
    struct err err = {0};
    struct kv_seq s;
    kv_seq_init(&s);
    cr_assert_eq(kv_manager_block_size(mgr), 4);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &s, (const int32_t[]){1, 2, 3}, 3), 0,
                 "no prefix cache on this manager: nothing is looked up");
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(s.n_tokens, 3);
    cr_assert_eq(s.table.n_blocks, 1);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(s.table.n_blocks, 1, "position 3 is the first block's last slot");
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(s.table.n_blocks, 2, "position 4 opens a second block");
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 9, &err), 0, "%s", err.msg);
    cr_assert_eq(s.n_tokens, 14);
    cr_assert_eq(s.table.n_blocks, 4);
    cr_assert_eq(kv_manager_free_blocks(mgr), 4);
    cr_assert_eq(kv_manager_blocks_for(mgr, 14), 4);
    kv_manager_free(mgr, &s);
    cr_assert_eq(s.n_tokens, 0);
    cr_assert_eq(s.table.n_blocks, 0);
    cr_assert_eq(kv_manager_free_blocks(mgr), 8);
    kv_manager_destroy(mgr);
}

Test(kv, a_full_pool_fails_whole_and_changes_nothing)
{
    struct kv_manager *mgr = manager(3, 4);
    struct err err = {0};
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &a, 6, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_manager_free_blocks(mgr), 0);
    /* b needs two more blocks for 8 more positions: none is free, nothing moves. */
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 8, &err), -INFERD_ENOMEM);
    cr_assert(strstr(err.msg, "exhausted"), "%s", err.msg);
    cr_assert_eq(b.n_tokens, 2);
    cr_assert_eq(b.table.n_blocks, 1);
    cr_assert_eq(kv_manager_free_blocks(mgr), 0);
    /* Filling b's own block needs no new one and still works. */
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 2, &err), 0, "%s", err.msg);
    kv_manager_free(mgr, &a);
    cr_assert_eq(kv_manager_free_blocks(mgr), 2);
    /* Two free blocks, three wanted: still all or nothing. */
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 12, &err), -INFERD_ENOMEM);
    cr_assert_eq(kv_manager_free_blocks(mgr), 2);
    cr_assert_eq(b.table.n_blocks, 1);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 8, &err), 0, "%s", err.msg);
    cr_assert_eq(b.table.n_blocks, 3);
    kv_manager_free(mgr, &b);
    kv_manager_destroy(mgr);
}

Test(kv, truncate_releases_the_blocks_past_the_end)
{
    struct kv_manager *mgr = manager(8, 4);
    struct err err = {0};
    struct kv_seq s;
    kv_seq_init(&s);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 13, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_manager_free_blocks(mgr), 4);
    kv_manager_truncate(mgr, &s, 9); /* 9 positions still need 3 blocks */
    cr_assert_eq(s.n_tokens, 9);
    cr_assert_eq(s.table.n_blocks, 3);
    cr_assert_eq(kv_manager_free_blocks(mgr), 5);
    kv_manager_truncate(mgr, &s, 4);
    cr_assert_eq(s.table.n_blocks, 1);
    cr_assert_eq(kv_manager_free_blocks(mgr), 7);
    kv_manager_truncate(mgr, &s, 20); /* past the end: nothing to drop */
    cr_assert_eq(s.n_tokens, 4);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &s, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(s.table.n_blocks, 2, "slots after a truncation come from fresh blocks");
    kv_manager_truncate(mgr, &s, 0);
    cr_assert_eq(s.table.n_blocks, 0);
    cr_assert_eq(kv_manager_free_blocks(mgr), 8);
    kv_manager_free(mgr, &s);
    kv_manager_destroy(mgr);
}

Test(kv, shared_blocks_live_until_their_last_holder_lets_go)
{
    struct kv_manager *mgr = manager(4, 4);
    struct kv_pool *pool = kv_manager_pool(mgr);
    struct err err = {0};
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &a, 8, &err), 0, "%s", err.msg);
    /* b takes a's first block as a computed prefix, as a prefix cache would. */
    cr_assert_eq(kv_manager_attach(mgr, &b, a.table.blocks, 1, &err), 0, "%s", err.msg);
    uint32_t shared = a.table.blocks[0];
    cr_assert_eq(b.table.blocks[0], shared);
    cr_assert_eq(b.n_tokens, 4);
    cr_assert_eq(b.n_cached, 4);
    cr_assert_eq(pool->refcount[shared], 2);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &b, NULL, 0), 4);
    cr_assert_eq(kv_manager_attach(mgr, &b, a.table.blocks, 1, &err), -INFERD_EINVAL,
                 "attaching to a sequence that holds blocks is refused");
    cr_assert_eq(kv_manager_allocate_slots(mgr, &b, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_manager_free_blocks(mgr), 1);
    /* a lets go: its own second block frees, the shared one lives on in b. */
    kv_manager_free(mgr, &a);
    cr_assert_eq(pool->refcount[shared], 1);
    cr_assert_eq(kv_manager_free_blocks(mgr), 2);
    /* Truncating b into its cached prefix keeps the block and the cached count honest. */
    kv_manager_truncate(mgr, &b, 3);
    cr_assert_eq(b.n_cached, 3);
    cr_assert_eq(b.table.n_blocks, 1);
    cr_assert_eq(kv_manager_free_blocks(mgr), 3);
    kv_manager_free(mgr, &b);
    cr_assert_eq(pool->refcount[shared], 0);
    cr_assert_eq(kv_manager_free_blocks(mgr), 4);
    kv_manager_destroy(mgr);
}

Test(kv, bytes_per_token_and_block_follow_the_format)
{
    /* 2 layers x (K + V) x 2 kv heads x 8 dims = 64 elements per token. */
    struct kv_format f32 = kv_format_of_dtype(DTYPE_F32), f16 = kv_format_of_dtype(DTYPE_F16);
    cr_assert_eq(f32.group_size, 0);
    cr_assert_eq(f32.scales, KV_SCALES_NONE);
    cr_assert_eq(kv_format_bytes_per_token(&model.config, &f32), 256);
    cr_assert_eq(kv_format_bytes_per_token(&model.config, &f16), 128);
    cr_assert_eq(kv_format_bytes_per_block(&model.config, &f32, 16), 4096);
    cr_assert_eq(kv_format_bytes_per_block(&model.config, &f16, KV_BLOCK_SIZE_DEFAULT),
                 128 * KV_BLOCK_SIZE_DEFAULT);
    /* The pool takes its format from the backend and sizes its storage by it. */
    struct kv_pool *pool = NULL;
    struct err err = {0};
    cr_assert_eq(kv_pool_create(&model, be, 3, 16, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(pool->format.dtype, be->kv_dtype);
    cr_assert_eq(pool->cache.dtype, be->kv_dtype);
    cr_assert_eq(kv_pool_blocks_for(pool, 33), 3);
    kv_pool_free(pool);
}
