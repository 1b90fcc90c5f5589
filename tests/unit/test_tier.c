/* tests/unit/test_tier.c — the SSD tier under the prefix cache, through the engine (CPU, exact
 * mode): a prompt computed by one engine is read back from disk by the next one and gives the
 * cold run's tokens and logprobs bit for bit; damaged block files, another fingerprint and a
 * cost model that prefers computing all fall back to computing, never to wrong tokens; blocks
 * kept on disk in a colder format (--ssd-kv-format) take fewer bytes and restore. The restart,
 * the checkpoint and the colder format again over an f16 cache (fast mode's, here in exact
 * mode, whose f16 rows are batch invariant too). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kv/kv_quant_config.h"
#include "test_support.h"
#include "text/tokenizer.h"

#define PROMPT 100 /* 6 full blocks of 16 before the last token */
#define GEN 8

static char *model_dir, *cache_dir;
static struct backend *be;
static struct model *model;
static struct tokenizer *tok;

static void setup_kv(enum backend_kv_type kv_type)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set");
    model_dir = test_mkdtemp();
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset tiny-qwen3 --seed 9 --tokenizer %s/qwen3 --out %s >/dev/null",
             INFERD_BINARY, data, model_dir);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 2, .mode = COMPUTE_EXACT,
                                                              .kv_type = kv_type},
                                    &be, &err),
                 0, "%s", err.msg);
    cr_assert_eq(model_load(model_dir, be, &model, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(model_dir, &tok, &err), 0, "%s", err.msg);
    char *d = test_mkdtemp();
    cache_dir = strdup(d);
}

static void setup(void) { setup_kv(BACKEND_KV_AUTO); }

static void setup_f16(void)
{
    setup_kv(BACKEND_KV_F16);
    cr_assert_eq(be->kv_dtype, DTYPE_F16);
}

static void teardown(void)
{
    tok_free(tok);
    model_free(model);
    backend_destroy(be);
    if (model_dir)
        test_rmtree(model_dir);
    if (cache_dir)
        test_rmtree(cache_dir);
    free(cache_dir);
    tok = NULL;
    model = NULL;
    be = NULL;
    model_dir = cache_dir = NULL;
}

TestSuite(tier, .init = setup, .fini = teardown, .timeout = 300);
TestSuite(tier_f16, .init = setup_f16, .fini = teardown, .timeout = 300);

/* An engine with the prefix cache, and the SSD tier at cache_dir unless tier is NULL. */
static struct engine *start(const struct kv_tier_config *tier)
{
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                .max_queue = 8, .prompt_cache_bytes = 16u << 20, .tier = tier};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

static struct kv_tier_config tier_config(uint64_t weights_digest, double prefill_rate)
{
    struct kv_tier_config t = {.prefill_tokens_per_s = prefill_rate};
    t.store.dir = cache_dir;
    t.store.fp.model_digest = weights_digest;
    t.store.fp.tokenizer_digest = 1;
    return t;
}

struct run {
    struct gen_token tokens[GEN];
    int n_cached;
};

static void make_prompt(int32_t *out, int n)
{
    uint32_t s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        out[i] = 1 + (int32_t)((s >> 8) % 299);
    }
}

static struct run run_prompt(struct engine *e)
{
    int32_t prompt[PROMPT];
    make_prompt(prompt, PROMPT);
    struct gen_params p = {.prompt = prompt, .n_prompt = PROMPT, .max_tokens = GEN,
                           .sampling = {.temperature = 0, .top_p = 1}, .logprobs = 1};
    struct gen_output *o;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
    cr_assert_eq(o->finish, GEN_FINISH_LENGTH, "%s", o->error);
    struct run r = {.n_cached = o->n_cached};
    cr_assert_eq(o->n_tokens, GEN);
    memcpy(r.tokens, gen_output_tokens(o), sizeof r.tokens);
    gen_output_release(o);
    return r;
}

static void expect_same(const struct run *got, const struct run *want, const char *how)
{
    for (int i = 0; i < GEN; i++)
        cr_assert(got->tokens[i].id == want->tokens[i].id &&
                      got->tokens[i].logprob == want->tokens[i].logprob,
                  "%s, token %d: %d (%.9g) against a cold run's %d (%.9g)", how, i,
                  got->tokens[i].id, got->tokens[i].logprob, want->tokens[i].id,
                  want->tokens[i].logprob);
}

/* The cold run, on an engine without any cache. */
static struct run cold_run(void)
{
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                .max_queue = 8};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    struct run r = run_prompt(e);
    engine_free(e);
    return r;
}

static int nothing(void *ctx, struct err *err)
{
    (void)ctx;
    (void)err;
    return 0;
}

/* One engine computes the prompt and flushes; returns its stats after. */
static void compute_and_flush(const struct kv_tier_config *t)
{
    struct engine *e = start(t);
    run_prompt(e);
    struct kv_tier_stats after;
    struct err err = {0};
    cr_assert_eq(engine_flush_cache(e, 10000, &after, &err), 0, "%s", err.msg);
    cr_assert_geq(after.store.blocks, PROMPT / 16, "%lu blocks durable",
                  (unsigned long)after.store.blocks);
    cr_assert_eq(after.store.pending, 0);
    if (after.store.direct_io && !t->cold)
        cr_assert_eq(after.store.in_place_writes, after.store.writes,
                     "a CPU pool's blocks go to disk from where they lie (%lu of %lu)",
                     (unsigned long)after.store.in_place_writes, (unsigned long)after.store.writes);
    /* the blocks held in the pool while they were written are let go of: only the cache holds
     * them now (the stats of the engine's step after the flush) */
    cr_assert_eq(engine_run(e, nothing, NULL, &err), 0);
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_gt(st.prompt_cache.blocks, 0);
    cr_assert_eq(st.prompt_cache.unreferenced_blocks, st.prompt_cache.blocks);
    engine_free(e);
}

static void check_restart_reads_the_prefix_back(void)
{
    struct run want = cold_run();
    struct kv_tier_config t = tier_config(42, 0);
    compute_and_flush(&t);
    struct engine *e = start(&t);
    struct run got = run_prompt(e);
    cr_assert_eq(got.n_cached, (PROMPT - 1) / 16 * 16, "%d tokens reused", got.n_cached);
    expect_same(&got, &want, "read back from disk");
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert(st.ssd_cache.enabled);
    cr_assert_eq(st.ssd_cache.decisions_restore, 1);
    cr_assert_geq(st.ssd_cache.store.restores, (PROMPT - 1) / 16);
    cr_assert_eq(st.ssd_cache.store.verify_failures, 0);
    engine_free(e);
}

Test(tier, a_restarted_engine_reads_the_prefix_back_and_gives_the_cold_tokens)
{
    check_restart_reads_the_prefix_back();
}

Test(tier_f16, a_restarted_engine_reads_f16_blocks_back_and_gives_the_cold_tokens)
{
    check_restart_reads_the_prefix_back();
}

Test(tier, another_fingerprint_reuses_nothing)
{
    struct kv_tier_config t = tier_config(42, 0);
    compute_and_flush(&t);
    struct kv_tier_config other = tier_config(43, 0); /* other weights */
    struct engine *e = start(&other);
    struct run got = run_prompt(e);
    cr_assert_eq(got.n_cached, 0);
    engine_free(e);
}

Test(tier, reading_is_skipped_when_computing_is_predicted_faster)
{
    struct run want = cold_run();
    struct kv_tier_config t = tier_config(42, 0);
    compute_and_flush(&t);
    struct kv_tier_config fast_prefill = tier_config(42, 1e15);
    struct engine *e = start(&fast_prefill);
    struct run got = run_prompt(e);
    cr_assert_eq(got.n_cached, 0);
    expect_same(&got, &want, "computed instead");
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.ssd_cache.decisions_recompute, 1);
    cr_assert_eq(st.ssd_cache.decisions_restore, 0);
    engine_free(e);
}

/* Flips bytes in the middle of every file under dir (segments and index alike). */
static int damage_files(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        struct stat stt;
        if (stat(path, &stt) < 0)
            continue;
        if (S_ISDIR(stt.st_mode)) {
            n += damage_files(path);
            continue;
        }
        if (stt.st_size < 2 || !strcmp(ent->d_name, "lock"))
            continue;
        int fd = open(path, O_RDWR);
        cr_assert_geq(fd, 0, "%s", path);
        for (off_t at = stt.st_size / 2; at < stt.st_size && at < stt.st_size / 2 + 64; at++) {
            unsigned char c;
            cr_assert_eq(pread(fd, &c, 1, at), 1);
            c ^= 0x5a;
            cr_assert_eq(pwrite(fd, &c, 1, at), 1);
        }
        close(fd);
        n++;
    }
    closedir(d);
    return n;
}

Test(tier, damaged_files_give_the_cold_tokens_and_are_counted)
{
    struct run want = cold_run();
    struct kv_tier_config t = tier_config(42, 0);
    compute_and_flush(&t);
    cr_assert_gt(damage_files(cache_dir), 0);
    struct engine *e = start(&t);
    struct run got = run_prompt(e);
    expect_same(&got, &want, "after damage");
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert(st.ssd_cache.enabled);
    /* whatever was read and failed was computed instead, and counted */
    cr_assert_eq(st.ssd_cache.store.verify_failures > 0, st.ssd_cache.recomputes > 0);
    engine_free(e);
}

/* ---- generation checkpoints ------------------------------------------------------ */

#define LONG_GEN 24

static struct gen_params sampled_params(const int32_t *prompt)
{
    return (struct gen_params){.prompt = prompt, .n_prompt = PROMPT, .max_tokens = LONG_GEN,
                               .sampling = {.temperature = 1.0f, .top_p = 1, .seed = 99},
                               .logprobs = 2};
}

/* Runs the sampled request to its end on e; its token records into out. */
static void run_sampled(struct engine *e, struct gen_token *out)
{
    int32_t prompt[PROMPT];
    make_prompt(prompt, PROMPT);
    struct gen_params p = sampled_params(prompt);
    struct gen_output *o;
    struct err err = {0};
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
    cr_assert_eq(o->finish, GEN_FINISH_LENGTH, "%s", o->error);
    cr_assert_eq(o->n_tokens, LONG_GEN);
    memcpy(out, gen_output_tokens(o), LONG_GEN * sizeof *out);
    gen_output_release(o);
}

static struct engine *start_checkpointed(const struct kv_tier_config *tier)
{
    struct engine_config cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                .max_queue = 8, .prompt_cache_bytes = 16u << 20, .tier = tier,
                                .checkpoint_every = 4};
    struct engine *e;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cfg, &e, &err), 0, "%s", err.msg);
    return e;
}

static void check_checkpoint_resumes(void)
{
    /* uninterrupted, without any cache */
    struct gen_token want[LONG_GEN], got[LONG_GEN];
    struct engine_config cold_cfg = {.n_ctx = 256, .max_seqs = 4, .max_step_tokens = 64,
                                     .max_queue = 8};
    struct engine *cold;
    struct err err = {0};
    cr_assert_eq(engine_create(model, tok, &cold_cfg, &cold, &err), 0, "%s", err.msg);
    run_sampled(cold, want);
    engine_free(cold);

    /* interrupted by its client after some tokens: the checkpoint stays */
    struct kv_tier_config t = tier_config(42, 0);
    struct engine *e = start_checkpointed(&t);
    int32_t prompt[PROMPT];
    make_prompt(prompt, PROMPT);
    struct gen_params p = sampled_params(prompt);
    struct gen_output *o;
    cr_assert_eq(engine_submit(e, &p, &o, &err), 0, "%s", err.msg);
    pthread_mutex_lock(&o->mu);
    while (o->n_generated < 10 && o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
    atomic_store(&o->cancel, true);
    pthread_mutex_lock(&o->mu);
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    int n_before = (int)o->n_tokens;
    pthread_mutex_unlock(&o->mu);
    cr_assert_eq(o->finish, GEN_FINISH_CANCELLED);
    cr_assert_lt(n_before, LONG_GEN);
    gen_output_release(o);
    engine_free(e); /* a restart: what is queued goes to disk first */

    /* the same request resumes: the same tokens and logprobs as uninterrupted */
    e = start_checkpointed(&t);
    run_sampled(e, got);
    for (int i = 0; i < LONG_GEN; i++)
        cr_assert(got[i].id == want[i].id && got[i].logprob == want[i].logprob,
                  "token %d: %d (%.9g) against an uninterrupted run's %d (%.9g)", i, got[i].id,
                  got[i].logprob, want[i].id, want[i].logprob);
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert(st.checkpoints);
    cr_assert_eq(st.checkpoints_resumed, 1);
    engine_free(e);

    /* completed: its checkpoint is gone, a third run starts from nothing */
    e = start_checkpointed(&t);
    run_sampled(e, got);
    engine_get_stats(e, &st);
    cr_assert_eq(st.checkpoints_resumed, 0);
    engine_free(e);
}

Test(tier, an_interrupted_generation_resumes_from_its_checkpoint_with_the_same_tokens)
{
    check_checkpoint_resumes();
}

Test(tier_f16, an_interrupted_generation_resumes_from_its_checkpoint_over_an_f16_cache)
{
    check_checkpoint_resumes();
}

/* ---- the host-RAM tier ----------------------------------------------------------------
 * Under a device pool, blocks leaving the cache stay in host memory and come back on a hit;
 * driven here through the manager on the CPU pool, whose bytes the test can read. */

/* The bytes of block b in every layer, K then V, as the pool holds them. */
static void block_bytes_of(struct kv_manager *mgr, uint32_t b, unsigned char *out, size_t *len)
{
    const struct kv_cache *c = kv_manager_cache(mgr);
    size_t chunk = (size_t)c->block_size * c->n_kv_heads * c->head_dim * dtype_size(c->dtype);
    size_t at = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int v = 0; v < 2; v++) {
            const char *base = v ? c->v : c->k;
            memcpy(out + at, base + ((size_t)l * c->n_blocks + b) * chunk, chunk);
            at += chunk;
        }
    *len = at;
}

Test(tier, blocks_leaving_the_cache_come_back_from_host_memory_with_their_bytes)
{
    struct kv_manager *mgr;
    struct err err = {0};
    cr_assert_eq(kv_manager_create(model, be, 16, 16, &mgr, &err), 0, "%s", err.msg);
    struct kv_prefix_config pc = {.max_bytes = 64u << 20, .model_digest = 1};
    cr_assert_eq(kv_manager_prefix_enable(mgr, &pc, &err), 0, "%s", err.msg);
    size_t block = kv_format_bytes_per_block(&model->config, &kv_manager_pool(mgr)->format, 16);
    struct kv_tier_config tc = {.host_bytes = 4 * block};
    cr_assert_eq(kv_manager_tier_enable(mgr, &tc, &err), 0, "%s", err.msg);

    int32_t tokens[49];
    make_prompt(tokens, 49);
    struct kv_seq a;
    kv_seq_init(&a);
    cr_assert_eq(kv_manager_allocate_slots(mgr, &a, 48, &err), 0, "%s", err.msg);
    /* recognisable K/V in the three blocks */
    struct kv_cache *c = kv_manager_cache(mgr);
    size_t all = (size_t)c->n_layers * c->n_blocks * c->block_size * c->n_kv_heads * c->head_dim *
                 dtype_size(c->dtype);
    for (size_t i = 0; i < all; i++) {
        ((unsigned char *)c->k)[i] = (unsigned char)(i * 7 + 1);
        ((unsigned char *)c->v)[i] = (unsigned char)(i * 13 + 5);
    }
    unsigned char *want[3], *got = malloc(block);
    size_t len;
    for (int i = 0; i < 3; i++) {
        want[i] = malloc(block);
        block_bytes_of(mgr, a.table.blocks[i], want[i], &len);
        cr_assert_eq(len, block);
    }
    kv_manager_publish(mgr, &a, tokens, 48);
    kv_manager_free(mgr, &a);
    kv_manager_prefix_clear(mgr); /* out of the pool: into host memory */
    memset(c->k, 0, all);
    memset(c->v, 0, all);

    struct kv_seq b;
    kv_seq_init(&b);
    cr_assert_eq(kv_manager_computed_blocks(mgr, &b, tokens, 49), 48);
    cr_assert_eq(b.n_loading, 0, "host memory is copied back at once");
    for (int i = 0; i < 3; i++) {
        block_bytes_of(mgr, b.table.blocks[i], got, &len);
        cr_assert(!memcmp(got, want[i], block), "block %d came back with other bytes", i);
    }
    struct kv_tier_stats st;
    kv_manager_tier_stats(mgr, &st);
    cr_assert_eq(st.host_hits, 3);
    cr_assert_eq(st.host_blocks, 3);
    cr_assert(!st.enabled, "no SSD tier here");
    kv_manager_free(mgr, &b);
    for (int i = 0; i < 3; i++)
        free(want[i]);
    free(got);
    kv_manager_destroy(mgr);
}

/* --ssd-kv-format: blocks written in a colder format take fewer bytes on
 * disk, are restored into the live cache and give the cold run's tokens (an
 * 8-bit copy of the tiny model's K/V moves no greedy pick here; logprobs
 * within 0.05); a restart with another cold format is another fingerprint. */
static void check_colder_disk_format(void)
{
    struct run want = cold_run();
    struct kv_quant kv8;
    bool on = false;
    struct err err = {0};
    cr_assert_eq(kv_quant_parse("8", &kv8, &on, &err), 0, "%s", err.msg);
    struct kv_tier_config t = tier_config(42, 0);
    t.cold = &kv8;
    struct engine *e = start(&t);
    run_prompt(e);
    struct kv_tier_stats after;
    cr_assert_eq(engine_flush_cache(e, 10000, &after, &err), 0, "%s", err.msg);
    engine_free(e);
    size_t live = kv_format_bytes_per_block(&model->config,
                                            &(struct kv_format){.dtype = be->kv_dtype}, 16);
    cr_assert_str_eq(after.cold_format, "kv8");
    cr_assert_geq(after.cold_blocks, PROMPT / 16);
    cr_assert_gt(after.cold_bytes_saved, 0);
    cr_assert_eq(after.store.write_bytes + after.cold_bytes_saved,
                 (uint64_t)after.cold_blocks * live,
                 "%lu bytes written and %lu saved of %lu blocks of %zu",
                 (unsigned long)after.store.write_bytes, (unsigned long)after.cold_bytes_saved,
                 (unsigned long)after.cold_blocks, live);
    /* 8-bit records are under a third of f32's bytes, so under two thirds of f16's */
    cr_assert_lt(after.store.write_bytes * 3 * dtype_size(be->kv_dtype),
                 (uint64_t)after.cold_blocks * live * 4, "8-bit records are under a third of f32");

    e = start(&t);
    struct run got = run_prompt(e);
    cr_assert_eq(got.n_cached, (PROMPT - 1) / 16 * 16, "%d tokens reused", got.n_cached);
    for (int i = 0; i < GEN; i++) {
        cr_assert_eq(got.tokens[i].id, want.tokens[i].id, "token %d", i);
        cr_assert_float_eq(got.tokens[i].logprob, want.tokens[i].logprob, 0.05, "token %d", i);
    }
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.ssd_cache.decisions_restore, 1);
    engine_free(e);

    struct kv_quant kv4;
    cr_assert_eq(kv_quant_parse("4", &kv4, &on, &err), 0, "%s", err.msg);
    struct kv_tier_config other = tier_config(42, 0);
    other.cold = &kv4;
    e = start(&other);
    cr_assert_eq(run_prompt(e).n_cached, 0, "blocks kept as kv8 are not read as kv4");
    engine_free(e);
}

Test(tier, a_colder_disk_format_stores_fewer_bytes_and_restores_into_the_live_cache)
{
    check_colder_disk_format();
}

Test(tier_f16, a_colder_disk_format_restores_into_an_f16_cache)
{
    check_colder_disk_format();
}
