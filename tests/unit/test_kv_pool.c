/* tests/unit/test_kv_pool.c — KV blocks are handed out once, counted, returned, and block tables grow as needed. */
#include <criterion/criterion.h>

#include "kv/kv.h"

static struct backend *be;
static struct model model;

static void setup(void)
{
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1}, &be, &err), 0, "%s", err.msg);
    model.config.n_layers = 2;
    model.config.n_kv_heads = 2;
    model.config.head_dim = 8;
    model.backend = be;
}

static void teardown(void) { backend_destroy(be); }

TestSuite(kv_pool, .init = setup, .fini = teardown);

Test(kv_pool, exhausting_the_pool_is_a_clear_error_and_release_makes_room)
{
    struct kv_pool *pool;
    struct err err = {0};
    cr_assert_eq(kv_pool_create(&model, be, 4, 16, &pool, &err), 0, "%s", err.msg);
    uint32_t ids[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kv_pool_alloc(pool, &ids[i], &err), 0);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            cr_assert_neq(ids[i], ids[j]);
    uint32_t extra;
    cr_assert_eq(kv_pool_alloc(pool, &extra, &err), -INFERD_ENOMEM);
    cr_assert(strstr(err.msg, "exhausted"));
    kv_pool_release(pool, ids[2]);
    cr_assert_eq(kv_pool_alloc(pool, &extra, &err), 0);
    cr_assert_eq(extra, ids[2]);
    kv_pool_free(pool);
}

Test(kv_pool, a_retained_block_survives_one_release)
{
    struct kv_pool *pool;
    struct err err = {0};
    cr_assert_eq(kv_pool_create(&model, be, 1, 16, &pool, &err), 0);
    uint32_t id, other;
    cr_assert_eq(kv_pool_alloc(pool, &id, &err), 0);
    kv_pool_retain(pool, id);
    kv_pool_release(pool, id);
    cr_assert_eq(kv_pool_alloc(pool, &other, &err), -INFERD_ENOMEM);
    kv_pool_release(pool, id);
    cr_assert_eq(kv_pool_alloc(pool, &other, &err), 0);
    kv_pool_free(pool);
}

Test(kv_pool, block_table_reserve_covers_positions_and_clear_returns_blocks)
{
    struct kv_pool *pool;
    struct err err = {0};
    cr_assert_eq(kv_pool_create(&model, be, 10, 16, &pool, &err), 0);
    struct block_table bt;
    block_table_init(&bt);
    cr_assert_eq(block_table_reserve(pool, &bt, 1, &err), 0);
    cr_assert_eq(bt.n_blocks, 1);
    cr_assert_eq(block_table_reserve(pool, &bt, 16, &err), 0);
    cr_assert_eq(bt.n_blocks, 1);
    cr_assert_eq(block_table_reserve(pool, &bt, 17, &err), 0);
    cr_assert_eq(bt.n_blocks, 2);
    cr_assert_eq(block_table_reserve(pool, &bt, 160, &err), 0);
    cr_assert_eq(pool->n_free, 0);
    cr_assert_eq(block_table_reserve(pool, &bt, 161, &err), -INFERD_ENOMEM);
    block_table_clear(pool, &bt);
    cr_assert_eq(pool->n_free, 10);
    kv_pool_free(pool);
}

Test(kv_pool, bad_geometry_is_refused)
{
    struct kv_pool *pool;
    struct err err = {0};
    cr_assert_eq(kv_pool_create(&model, be, 4, 0, &pool, &err), -INFERD_ERANGE);
    cr_assert_eq(kv_pool_create(&model, be, 4, 4096, &pool, &err), -INFERD_ERANGE);
    cr_assert_eq(kv_pool_create(&model, be, 0, 16, &pool, &err), -INFERD_ERANGE);
}
