/* tests/unit/test_tensor_parallel.c — tensor parallelism: N host-communicator CPU ranks give N = 1's logits and greedy tokens, the host all-reduce sums in rank order, splits that cannot be made and a missing NCCL are clear errors, and (with GPUs) the NCCL path runs.
 *
 * Tolerance. In EXACT mode a rank computes the same f32 products as one
 * model; only the order of additions differs, in the row-parallel
 * projections (o_proj, down_proj): one model sums K products in its
 * kernel's order, N ranks sum K / N each and then the N partials in rank
 * order (the host all-reduce's fixed order, so a run is deterministic). Two
 * orders of one sum differ by at most about K * 2^-24 times the sum of the
 * |products| (the classical bound; K <= 344 in these presets: 2e-5 of it),
 * and the tiny presets' activations and logits are O(1), through at most
 * four layers. The logits are held to 1e-4 absolute (measured: under 6e-6
 * on every preset and rank count) and the argmax must be the same at every
 * position. Not bit-identical: matching one kernel's order would mean giving
 * up its blocking; a wrong slice or a missed sum is off by O(1). CUDA's one
 * rank through NCCL sums nothing, so it is held to 1e-5. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/collective.h"
#include "backend/cuda/cuda.h"
#include "engine/generate.h"
#include "kv/kv.h"
#include "model/model.h"
#include "test_support.h"
#include "tools/mkmodel.h"

#define LOGIT_TOL_ABS 1e-4f
#define PROMPT 20
#define DECODE 6
#define MAX_RANKS 4

/* N ranks of one preset: backends, communicators and the group's model. */
struct ranks {
    int n;
    struct backend *bes[MAX_RANKS];
    struct collective *comms[MAX_RANKS];
    struct model *m;
};

static char *make_model(const char *preset)
{
    struct err err = {0};
    char *dir = test_mkdtemp();
    cr_assert_not_null(dir);
    struct mkmodel_opts o = {.preset = preset, .seed = 7, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    return dir;
}

static int ranks_load_mode(const char *dir, int n, enum compute_mode mode, struct ranks *r,
                           struct err *err)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    for (int i = 0; i < n; i++)
        cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1, .mode = mode},
                                        &r->bes[i], err),
                     0, "%s", err->msg);
    cr_assert_eq(collective_host_create(n, r->comms, err), 0, "%s", err->msg);
    return model_load_parallel(dir, r->bes, r->comms, n, NULL, &r->m, err);
}

static int ranks_load(const char *dir, int n, struct ranks *r, struct err *err)
{
    return ranks_load_mode(dir, n, COMPUTE_EXACT, r, err);
}

static void ranks_free(struct ranks *r)
{
    model_free(r->m);
    for (int i = 0; i < r->n; i++) {
        collective_destroy(r->comms[i]);
        backend_destroy(r->bes[i]);
    }
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Logits of every prompt position, then DECODE greedy steps, into out
 * ((PROMPT + DECODE) x vocab). */
static void run_steps(const struct model *m, struct backend *be, const int32_t *prompt, float *out)
{
    struct err err = {0};
    struct kv_pool *pool;
    struct forward_state *st;
    cr_assert_eq(kv_pool_create(m, be, 8, 16, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(m, 64, &st, &err), 0, "%s", err.msg);
    uint32_t blocks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int vocab = m->config.vocab_size;
    struct batch_seq seq = {.tokens = prompt, .n_tokens = PROMPT, .pos0 = 0, .block_ids = blocks,
                            .n_block_ids = 8, .all_logits = true};
    struct batch b = {&seq, 1};
    cr_assert_eq(model_forward(m, st, &pool->cache, &b, out, &err), 0, "%s", err.msg);
    int32_t tok = argmax(out + (size_t)(PROMPT - 1) * vocab, vocab);
    for (int i = 0; i < DECODE; i++) {
        struct batch_seq d = {.tokens = &tok, .n_tokens = 1, .pos0 = PROMPT + i,
                              .block_ids = blocks, .n_block_ids = 8};
        struct batch db = {&d, 1};
        float *row = out + (size_t)(PROMPT + i) * vocab;
        cr_assert_eq(model_forward(m, st, &pool->cache, &db, row, &err), 0, "%s", err.msg);
        tok = argmax(row, vocab);
    }
    forward_state_free(st);
    kv_pool_free(pool);
}

/* N ranks against one model on the same prompt, in mode: the same argmax at
 * every position, logits within tol. */
static void check_parity_mode(const char *preset, int n, enum compute_mode mode, float tol)
{
    struct err err = {0};
    char *dir = make_model(preset);
    struct backend *be;
    struct model *one;
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1, .mode = mode}, &be, &err),
                 0);
    cr_assert_eq(model_load(dir, be, &one, &err), 0, "%s", err.msg);
    struct ranks r;
    cr_assert_eq(ranks_load_mode(dir, n, mode, &r, &err), 0, "%s: %s", preset, err.msg);
    cr_assert_eq(r.m->config.n_heads * n, one->config.n_heads);
    int vocab = one->config.vocab_size;
    cr_assert_eq(r.m->config.vocab_size, vocab);
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % vocab);
    size_t rows = PROMPT + DECODE;
    float *a = calloc(rows * (size_t)vocab, sizeof *a), *b = calloc(rows * (size_t)vocab, sizeof *b);
    run_steps(one, be, prompt, a);
    run_steps(r.m, r.m->backend, prompt, b);
    float worst = 0;
    for (size_t p = 0; p < rows; p++) {
        const float *x = a + p * vocab, *y = b + p * vocab;
        for (int i = 0; i < vocab; i++) {
            float d = fabsf(x[i] - y[i]);
            worst = fmaxf(worst, d);
            cr_assert(d <= tol,
                      "%s N=%d: position %zu logit %d: %.7g against %.7g", preset, n, p, i,
                      (double)y[i], (double)x[i]);
        }
        cr_assert_eq(argmax(y, vocab), argmax(x, vocab), "%s N=%d: argmax differs at position %zu",
                     preset, n, p);
    }
    cr_log_info("%s N=%d: largest logit difference %.3g", preset, n, (double)worst);
    free(a);
    free(b);
    ranks_free(&r);
    model_free(one);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

static void check_parity(const char *preset, int n)
{
    check_parity_mode(preset, n, COMPUTE_EXACT, LOGIT_TOL_ABS);
}

Test(tensor_parallel, llama_two_and_four_ranks_match_one)
{
    check_parity("tiny-llama", 2);
    check_parity("tiny-llama", 4);
}

Test(tensor_parallel, qwen3_two_and_four_ranks_match_one)
{
    check_parity("tiny-qwen3", 2);
    check_parity("tiny-qwen3", 4);
}

/* FAST mode, where an AVX512-BF16 CPU lays BF16 weights out in panels of 32
 * rows: a tied head's vocabulary split (tiny-qwen2's 501 rows in 251 and
 * 250) starts rank 1 inside a panel, so its rows are copied into panels of
 * their own; tiny-llama3's (512) splits at a panel. The partial sums differ
 * as in EXACT mode, but FAST rounds every matmul's input to bf16, where a
 * difference of an ulp of f32 can move a value by one of bf16's (2^-8):
 * measured, the logits within 0.017 (qwen2) and 0.001 (llama3). A row of
 * the wrong vocabulary would be off by the logits' size, O(1). */
#define LOGIT_TOL_FAST 0.05f

Test(tensor_parallel, fast_mode_ranks_match_one_with_a_tied_head_split_inside_a_panel)
{
    check_parity_mode("tiny-qwen2", 2, COMPUTE_FAST, LOGIT_TOL_FAST);
    check_parity_mode("tiny-llama3", 2, COMPUTE_FAST, LOGIT_TOL_FAST);
}

Test(tensor_parallel, qwen2_biases_split_over_two_ranks)
{
    check_parity("tiny-qwen2", 2);
}

/* n_kv_heads < N: each KV head is held by N / n_kv_heads ranks. */
Test(tensor_parallel, kv_heads_replicated_when_fewer_than_ranks)
{
    check_parity("tiny-llama-linear", 4); /* 2 KV heads, f32 weights */
    check_parity("tiny-mistral", 2);      /* 1 KV head, f16 widened, sliding window */
    check_parity("tiny-mistral", 4);
}

/* One rank is the plain model through the group's code (front backend,
 * mirrors, the collective as identity). */
Test(tensor_parallel, one_rank_is_the_plain_model)
{
    check_parity("tiny-qwen3", 1);
}

/* The serving loop (scheduler, KV manager, windowed pool) over a group:
 * greedy tokens identical to one model's. */
static void greedy(const struct model *m, int32_t *out, int n)
{
    struct err err = {0};
    struct generator *g;
    cr_assert_eq(generator_create(m, 128, 8, &g, &err), 0, "%s", err.msg);
    int32_t prompt[13];
    for (int i = 0; i < 13; i++)
        prompt[i] = (int32_t)(i * 5 + 3);
    cr_assert_eq(generator_feed(g, prompt, 13, &err), 0, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        out[i] = argmax(g->logits, m->config.vocab_size);
        cr_assert_eq(generator_feed(g, &out[i], 1, &err), 0, "%s", err.msg);
    }
    generator_free(g);
}

Test(tensor_parallel, serving_loop_generates_the_same_tokens)
{
    const char *presets[] = {"tiny-qwen3", "tiny-mistral"};
    for (int p = 0; p < 2; p++) {
        struct err err = {0};
        char *dir = make_model(presets[p]);
        struct backend *be;
        struct model *one;
        cr_assert_eq(backend_cpu_create(&(struct backend_options){.threads = 1}, &be, &err), 0);
        cr_assert_eq(model_load(dir, be, &one, &err), 0, "%s", err.msg);
        struct ranks r;
        cr_assert_eq(ranks_load(dir, 2, &r, &err), 0, "%s", err.msg);
        int32_t a[40], b[40];
        greedy(one, a, 40);
        greedy(r.m, b, 40);
        for (int i = 0; i < 40; i++)
            cr_assert_eq(b[i], a[i], "%s: token %d is %d, one model's %d", presets[p], i, b[i],
                         a[i]);
        ranks_free(&r);
        model_free(one);
        backend_destroy(be);
        test_rmtree(dir);
        free(dir);
    }
}

/* A block copy on the group's backend (the prefix cache reusing part of a
 * block) is made in every rank's KV, so a sequence continued from the copy
 * matches one that computed it. */
Test(tensor_parallel, block_copy_reaches_every_rank)
{
    struct err err = {0};
    char *dir = make_model("tiny-qwen3");
    struct ranks r;
    cr_assert_eq(ranks_load(dir, 2, &r, &err), 0, "%s", err.msg);
    const struct model *m = r.m;
    int vocab = m->config.vocab_size;
    struct kv_pool *pool;
    struct forward_state *st;
    cr_assert_eq(kv_pool_create(m, m->backend, 8, 16, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(m, 64, &st, &err), 0, "%s", err.msg);
    int32_t toks[12];
    for (int i = 0; i < 12; i++)
        toks[i] = (int32_t)(i * 7 + 1);
    float *want = malloc((size_t)vocab * sizeof *want), *got = malloc((size_t)vocab * sizeof *got);
    uint32_t b0[1] = {0}, b1[1] = {1};
    struct batch_seq s = {.tokens = toks, .n_tokens = 12, .block_ids = b0, .n_block_ids = 1};
    cr_assert_eq(model_forward(m, st, &pool->cache, &(struct batch){&s, 1}, want, &err), 0,
                 "%s", err.msg);
    /* block 1 gets the first 11 positions of block 0, then position 11 is computed there */
    m->backend->ops->kv_copy_slots(m->backend, &pool->cache, 0, 1, 11);
    struct batch_seq t = {.tokens = toks + 11, .n_tokens = 1, .pos0 = 11, .block_ids = b1,
                          .n_block_ids = 1};
    cr_assert_eq(model_forward(m, st, &pool->cache, &(struct batch){&t, 1}, got, &err), 0,
                 "%s", err.msg);
    for (int i = 0; i < vocab; i++)
        cr_assert_float_eq(got[i], want[i], 1e-5f, "logit %d", i);
    free(want);
    free(got);
    forward_state_free(st);
    kv_pool_free(pool);
    ranks_free(&r);
    test_rmtree(dir);
    free(dir);
}

static void check_refused(const char *preset, int n, int code, const char *needle)
{
    struct err err = {0};
    char *dir = make_model(preset);
    struct ranks r;
    cr_assert_eq(ranks_load(dir, n, &r, &err), -code, "%s N=%d: %s", preset, n, err.msg);
    cr_assert_null(r.m);
    cr_assert(strstr(err.msg, needle), "%s N=%d: %s", preset, n, err.msg);
    ranks_free(&r);
    test_rmtree(dir);
    free(dir);
}

Test(tensor_parallel, ranks_that_do_not_divide_the_heads_are_refused)
{
    check_refused("tiny-qwen2", 4, INFERD_EINVAL, "6 attention heads");
    check_refused("tiny-qwen3-gqa1", 2, INFERD_EINVAL, "3 attention heads");
}

Test(tensor_parallel, families_it_cannot_split_are_refused)
{
    check_refused("tiny-qwen3_moe", 2, INFERD_EUNSUPPORTED, "tensor parallelism");
    check_refused("tiny-phi3", 2, INFERD_EUNSUPPORTED, "Llama family");
}

/* The host all-reduce: every rank ends with ((b0 + b1) + b2) + ..., the
 * same bits, whatever order the threads arrive in. */
struct reduce_arg {
    struct collective *c;
    float *buf;
    int rc;
};

static void *reduce_main(void *p)
{
    struct reduce_arg *a = p;
    struct err err = {0};
    for (int rep = 0; rep < 50 && a->rc == 0; rep++)
        a->rc = collective_all_reduce_sum(a->c, NULL, a->buf + rep * 7, 7, &err);
    return NULL;
}

Test(tensor_parallel, host_all_reduce_sums_in_rank_order_on_every_rank)
{
    enum { N = 3, LEN = 50 * 7 };
    struct err err = {0};
    struct collective *c[N];
    cr_assert_eq(collective_host_create(N, c, &err), 0, "%s", err.msg);
    static float bufs[N][LEN], want[LEN];
    for (int i = 0; i < LEN; i++) {
        bufs[0][i] = 1e8f;
        bufs[1][i] = (float)i * 0.37f - 3.0f;
        bufs[2][i] = -1e8f;
        want[i] = (bufs[0][i] + bufs[1][i]) + bufs[2][i]; /* order matters: loses bufs[1] */
    }
    pthread_t th[N];
    struct reduce_arg args[N];
    for (int r = 0; r < N; r++) {
        args[r] = (struct reduce_arg){c[r], bufs[r], 0};
        pthread_create(&th[r], NULL, reduce_main, &args[r]);
    }
    for (int r = 0; r < N; r++) {
        pthread_join(th[r], NULL);
        cr_assert_eq(args[r].rc, 0);
    }
    for (int r = 0; r < N; r++)
        cr_assert_eq(memcmp(bufs[r], want, sizeof want), 0, "rank %d", r);
    for (int r = 0; r < N; r++)
        collective_destroy(c[r]);
}

Test(tensor_parallel, missing_nccl_is_a_clear_error)
{
    struct err err = {0};
    int version = 0;
    cr_assert_eq(collective_nccl_probe("/nonexistent/libnccl.so.2", &version, &err),
                 -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "/nonexistent/libnccl.so.2") && strstr(err.msg, "--nccl-lib"),
              "%s", err.msg);
    struct collective *c[2] = {0};
    int devices[2] = {0, 1};
    memset(&err, 0, sizeof err);
    cr_assert_eq(collective_nccl_create(2, devices, "/nonexistent/libnccl.so.2", c, &err),
                 -INFERD_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "NCCL"), "%s", err.msg);
    cr_assert_null(c[0]);
}

/* ---- CUDA: the NCCL path (skipped without a GPU) ----
 * One GPU: one rank whose all-reduces go through NCCL (the library opened,
 * a communicator made, a reduction queued on the backend's stream each
 * projection) gives the plain CUDA model's logits. Two GPUs or more: two
 * ranks against one, with the CPU test's tolerance. */
static void cuda_check(int n)
{
    struct err err = {0};
    if (backend_cuda_device_count() < n)
        cr_skip_test("fewer than %d CUDA GPUs: the NCCL path with %d ranks not run", n, n);
    int version = 0;
    if (collective_nccl_probe(NULL, &version, &err) < 0) {
        cr_assert(!getenv("INFERD_NCCL_LIB"), "INFERD_NCCL_LIB is set but: %s", err.msg);
        cr_skip_test("%s", err.msg);
    }
    cr_log_info("NCCL %d", version);
    char *dir = make_model("tiny-qwen3");
    struct backend *be;
    struct model *one;
    cr_assert_eq(backend_cuda_create(0, &(struct backend_options){0}, &be, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(model_load(dir, be, &one, &err), 0, "%s", err.msg);
    struct backend *bes[2];
    struct collective *comms[2];
    int devices[2] = {0, 1};
    for (int i = 0; i < n; i++)
        cr_assert_eq(backend_cuda_create(i, &(struct backend_options){0}, &bes[i], &err), 0,
                     "%s", err.msg);
    cr_assert_eq(collective_nccl_create(n, devices, NULL, comms, &err), 0, "%s", err.msg);
    struct model *tp;
    cr_assert_eq(model_load_parallel(dir, bes, comms, n, NULL, &tp, &err), 0, "%s", err.msg);
    int vocab = one->config.vocab_size;
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % vocab);
    size_t rows = PROMPT + DECODE;
    float *a = calloc(rows * (size_t)vocab, sizeof *a), *b = calloc(rows * (size_t)vocab, sizeof *b);
    run_steps(one, be, prompt, a);
    run_steps(tp, tp->backend, prompt, b);
    for (size_t p = 0; p < rows; p++) {
        cr_assert_eq(argmax(b + p * vocab, vocab), argmax(a + p * vocab, vocab), "position %zu", p);
        for (int i = 0; i < vocab; i++)
            cr_assert_float_eq(b[p * vocab + i], a[p * vocab + i], n == 1 ? 1e-5f : LOGIT_TOL_ABS,
                               "position %zu logit %d", p, i);
    }
    free(a);
    free(b);
    model_free(tp);
    for (int i = 0; i < n; i++) {
        collective_destroy(comms[i]);
        backend_destroy(bes[i]);
    }
    model_free(one);
    backend_destroy(be);
    test_rmtree(dir);
    free(dir);
}

Test(tensor_parallel_cuda, one_gpu_through_nccl_matches_the_plain_model)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: the NCCL path not checked");
    cuda_check(1);
}

Test(tensor_parallel_cuda, two_gpus_match_one)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: the NCCL path not checked");
    cuda_check(2);
}
