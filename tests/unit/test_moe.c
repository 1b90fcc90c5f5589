/* tests/unit/test_moe.c — mixture-of-experts: routing picks what torch.topk picks (ties included), the expert op equals a plain per-row reference and reads only the chosen experts, and the Qwen3-MoE family loads and runs. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/moe_route.h"
#include "base/bf16.h"
#include "golden_support.h"
#include "kv/kv.h"
#include "model/model.h"
#include "test_support.h"
#include "tools/mkmodel.h"

/* ---- routing ---- */

/* Rows of logits -1/0/+1 (as '-', '0', '+') and the experts libstdc++'s
 * std::nth_element (std::partial_sort for 128 experts, top 2) leaves in
 * front over their softmax, as torch.topk runs them: equal probabilities go
 * where the algorithm leaves them, not to the lower ids. */
static const struct {
    int n, k;
    const char *levels;
    int ids[8];
} libstdcxx_cases[] = {
    {6, 2, "-00+0-", {1, 3}},
    {6, 2, "++0+00", {1, 3}},
    {6, 2, "+-+0-0", {0, 2}},
    {6, 2, "---0+-", {3, 4}},
    {128, 8, "0++0-+-0-00--+++0+-++00++0-++---+00-0-+++-0++++++++0-++0000+--++00--+-00-+0+--0+0-++0--+0-000+-00++0+0-+-+--------000+0+-+++000-", {38, 39, 40, 59, 79, 93, 97, 100}},
    {128, 8, "0+0-0+++++-0-0+-++0-0+-+-+0-+--0--+-+0--0+--0+-+-0++-0-++++-++--00-++0000+-+---0000-0-++00000+-+0--+-0--+0-----0++---000-0-0000-", {28, 34, 36, 41, 45, 47, 86, 87}},
    {128, 8, "-00-++0++--+000-000+++-0--++0+0++--+000-+-+0+00-0++0000+--++0+---+-+-+000++0+-0++0+--+0-0-00000+---0000+0++++0-0-0000+0+0++-0000", {27, 31, 32, 35, 59, 80, 105, 106}},
    {128, 8, "+-+0+0++0++--0+--0++-++0-++0+0++00-+--+0--00+0--+-000+--00--+++---+0-0-++-+++-0-00+00+-0--+-++0+0-+-+0-+000+00+000++---+--+-0-0+", {0, 48, 53, 60, 61, 62, 107, 110}},
    {128, 2, "0+0+--0+0---+-+0-0+-+0+-00+0-00+0--0-0-0+00-0+0-+0++--00--00----+--+-0-+-+--+0--+00+-0+-++0++00--0-00-+0++-+++0+--0-0-+++++-+-+-", {1, 3}},
    {128, 2, "+0++00+-0+00-+0++++00+++++--000+-+++00+-+0-00---0-++-0-+-+-00+0+++00+0++00+00+++00+0-+-0+-++++000+++---+++000+0++0--00--0++0+0-0", {0, 2}},
    {128, 2, "0-00++++00--+-+0-++-0+0--000+000+0-+++0+0+---0+00++-0--0+0-0+-+-0+0-0+-+00--00++-00+-+0++0+0000+-000+0--+0+00-+-00-+++-+-+-0-00-", {4, 5}},
    {128, 2, "-00--0---++--------+--+---+0-++0-+0-0++-+0++000-0+0+00-+++0++-0+0-++00-+-+0+-+-0-0+00+--++-++-00-+--0--+00-00+0++0+-00-0-++00+-+", {9, 10}},
};

static int cmp_int(const void *a, const void *b)
{
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Routes one row on be; its ids sorted into ids_sorted, weights into w. */
static void route_row(struct backend *be, const float *logits, int n, int k, bool norm,
                      int32_t *ids_sorted, float *w)
{
    float *dl = be->ops->alloc(be, (size_t)n * sizeof(float));
    int32_t *di = be->ops->alloc(be, (size_t)k * sizeof(int32_t));
    float *dw = be->ops->alloc(be, (size_t)k * sizeof(float));
    be->ops->to_device(be, dl, logits, (size_t)n * sizeof(float));
    be->ops->moe_route(be, dl, 1, n, k, norm, di, dw);
    be->ops->to_host(be, ids_sorted, di, (size_t)k * sizeof(int32_t));
    be->ops->to_host(be, w, dw, (size_t)k * sizeof(float));
    be->ops->release(be, dl);
    be->ops->release(be, di);
    be->ops->release(be, dw);
    qsort(ids_sorted, (size_t)k, sizeof *ids_sorted, cmp_int);
}

Test(moe_route, exact_ties_go_where_libstdcxx_selection_leaves_them)
{
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    for (size_t c = 0; c < sizeof libstdcxx_cases / sizeof libstdcxx_cases[0]; c++) {
        float logits[128];
        int n = libstdcxx_cases[c].n, k = libstdcxx_cases[c].k;
        for (int e = 0; e < n; e++) {
            char ch = libstdcxx_cases[c].levels[e];
            logits[e] = ch == '+' ? 1.0f : ch == '-' ? -1.0f : 0.0f;
        }
        int32_t ids[8];
        float w[8];
        route_row(be, logits, n, k, true, ids, w);
        for (int j = 0; j < k; j++)
            cr_expect_eq(ids[j], libstdcxx_cases[c].ids[j], "case %zu: pick %d is %d, want %d", c,
                         j, ids[j], libstdcxx_cases[c].ids[j]);
        float sum = 0;
        for (int j = 0; j < k; j++)
            sum += w[j];
        cr_expect_float_eq(sum, 1.0f, 1e-6f, "case %zu: normalised weights sum to %g", c, sum);
    }
    backend_destroy(be);
}

Test(moe_route, weights_are_softmax_probabilities_by_descending_order)
{
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    float logits[5] = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f};
    int32_t *di = be->ops->alloc(be, 3 * sizeof(int32_t));
    float *dw = be->ops->alloc(be, 3 * sizeof(float));
    be->ops->moe_route(be, logits, 1, 5, 3, false, di, dw);
    double z = 0;
    for (int e = 0; e < 5; e++)
        z += exp(logits[e] - 2.0);
    cr_assert_eq(di[0], 1);
    cr_assert_eq(di[1], 3);
    cr_assert_eq(di[2], 0);
    cr_expect_float_eq(dw[0], (float)(1.0 / z), 1e-6f);
    cr_expect_float_eq(dw[1], (float)(exp(-1.0) / z), 1e-6f);
    cr_expect_float_eq(dw[2], (float)(exp(-1.5) / z), 1e-6f);
    be->ops->release(be, di);
    be->ops->release(be, dw);
    backend_destroy(be);
}

/* The goldens' probes: router rows with ties and the experts torch.topk
 * picked on the reference machine. */
Test(moe_route, ties_pick_what_torch_topk_picked_in_the_goldens)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-qwen3_moe.json", golden_dir());
    json_object *root = json_object_from_file(path);
    if (!root)
        cr_skip_test("%s is absent: make it with tools/make_goldens.py (tests/goldens/README.md)",
                     path);
    json_object *probes = json_object_object_get(root, "topk_probes");
    cr_assert_not_null(probes, "%s has no topk_probes", path);
    int k = json_object_get_int(json_object_object_get(probes, "top_k"));
    json_object *rows = json_object_object_get(probes, "rows");
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    size_t n_rows = json_object_array_length(rows);
    cr_assert_gt(n_rows, 0);
    for (size_t r = 0; r < n_rows; r++) {
        json_object *row = json_object_array_get_idx(rows, r);
        json_object *jl = json_object_object_get(row, "logits"), *ji = json_object_object_get(row, "ids");
        int n = (int)json_object_array_length(jl);
        cr_assert(n <= MOE_MAX_EXPERTS && k <= 32);
        float logits[MOE_MAX_EXPERTS];
        int32_t want[32], got[32];
        float w[32];
        for (int e = 0; e < n; e++)
            logits[e] = (float)json_object_get_double(json_object_array_get_idx(jl, (size_t)e));
        for (int j = 0; j < k; j++)
            want[j] = json_object_get_int(json_object_array_get_idx(ji, (size_t)j));
        qsort(want, (size_t)k, sizeof *want, cmp_int);
        route_row(be, logits, n, k, false, got, w);
        for (int j = 0; j < k; j++)
            cr_expect_eq(got[j], want[j], "probe %zu: pick %d is expert %d, torch.topk's is %d", r,
                         j, got[j], want[j]);
    }
    backend_destroy(be);
    json_object_put(root);
}

/* ---- the expert op ---- */

#define E 5
#define K 2
#define HID 24
#define INTER 12

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

/* y = sum in ascending expert order of w * down(silu(gate x) * up x), in doubles. */
static void reference_row(const float *x, const float *const *g, const float *const *u,
                          const float *const *d, const int32_t *ids, const float *w, double *y)
{
    for (int i = 0; i < HID; i++)
        y[i] = 0;
    for (int e = 0; e < E; e++)
        for (int j = 0; j < K; j++) {
            if (ids[j] != e)
                continue;
            double h[INTER];
            for (int r = 0; r < INTER; r++) {
                double a = 0, b = 0;
                for (int c = 0; c < HID; c++) {
                    a += (double)g[e][r * HID + c] * x[c];
                    b += (double)u[e][r * HID + c] * x[c];
                }
                h[r] = a / (1 + exp(-a)) * b;
            }
            for (int o = 0; o < HID; o++) {
                double s = 0;
                for (int r = 0; r < INTER; r++)
                    s += (double)d[e][o * INTER + r] * h[r];
                y[o] += w[j] * s;
            }
        }
}

static void check_ffn(enum compute_mode mode, double tol)
{
    struct backend *be = test_cpu_backend(mode);
    uint64_t s = 42;
    static float gw[E][INTER * HID], uw[E][INTER * HID], dw[E][HID * INTER];
    struct weight_matrix gm[E], um[E], dm[E];
    const float *gp[E], *up[E], *dp[E];
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < INTER * HID; i++) {
            gw[e][i] = frand(&s) * 0.3f;
            uw[e][i] = frand(&s) * 0.3f;
            dw[e][i] = frand(&s) * 0.3f;
        }
        gm[e] = (struct weight_matrix){DTYPE_F32, INTER, HID, gw[e]};
        um[e] = (struct weight_matrix){DTYPE_F32, INTER, HID, uw[e]};
        dm[e] = (struct weight_matrix){DTYPE_F32, HID, INTER, dw[e]};
        gp[e] = gw[e];
        up[e] = uw[e];
        dp[e] = dw[e];
    }
    /* expert 4 is never chosen: NaN weights that would poison any row that read them */
    for (int i = 0; i < INTER * HID; i++)
        gw[4][i] = uw[4][i] = dw[4][i] = NAN;
    struct moe_experts ex = {E, HID, INTER, gm, um, dm};
    enum { ROWS = 9 };
    float x[ROWS * HID], y[ROWS * HID], y1[HID], w[ROWS * K];
    int32_t ids[ROWS * K];
    for (int i = 0; i < ROWS * HID; i++)
        x[i] = frand(&s);
    for (int r = 0; r < ROWS; r++) {
        ids[r * K] = r % 4;
        ids[r * K + 1] = (r + 1 + r / 4) % 4;
        if (ids[r * K + 1] == ids[r * K])
            ids[r * K + 1] = (ids[r * K] + 1) % 4;
        w[r * K] = 0.7f;
        w[r * K + 1] = 0.3f;
    }
    float *scratch = calloc(moe_scratch_floats(ROWS, K, INTER, HID), sizeof(float));
    be->ops->moe_ffn(be, x, ROWS, &ex, ids, w, K, scratch, y);
    for (int r = 0; r < ROWS; r++) {
        double want[HID];
        reference_row(x + r * HID, gp, up, dp, ids + r * K, w + r * K, want);
        for (int i = 0; i < HID; i++)
            cr_expect(fabs(y[r * HID + i] - want[i]) <= tol * (1 + fabs(want[i])),
                      "row %d [%d]: %g, want %g", r, i, y[r * HID + i], want[i]);
        /* the same row alone gives the same bits in EXACT mode */
        if (mode == COMPUTE_EXACT) {
            be->ops->moe_ffn(be, x + r * HID, 1, &ex, ids + r * K, w + r * K, K, scratch, y1);
            cr_expect_eq(memcmp(y1, y + r * HID, sizeof y1), 0, "row %d alone differs", r);
        }
    }
    free(scratch);
    backend_destroy(be);
}

Test(moe_ffn, equals_the_per_row_reference_and_reads_only_chosen_experts)
{
    check_ffn(COMPUTE_EXACT, 1e-5);
}

Test(moe_ffn, fast_mode_stays_within_bf16_rounding)
{
    check_ffn(COMPUTE_FAST, 2e-2);
}

Test(moe_ffn, gated_add_scales_by_the_sigmoid_of_the_gate)
{
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    float y[4] = {1, 1, 1, 1}, x[4] = {2, 4, 6, 8}, g[2] = {0.0f, 100.0f};
    be->ops->gated_add(be, y, x, g, 2, 2);
    cr_expect_float_eq(y[0], 2.0f, 1e-6f);
    cr_expect_float_eq(y[1], 3.0f, 1e-6f);
    cr_expect_float_eq(y[2], 7.0f, 1e-5f);
    cr_expect_float_eq(y[3], 9.0f, 1e-5f);
    backend_destroy(be);
}

/* ---- the family ---- */

static struct model *load_preset(struct backend *be, const char *dir)
{
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-qwen3_moe", .seed = 1, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    struct model *m = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), 0, "%s", err.msg);
    return m;
}

Test(qwen3_moe, loads_experts_in_sparse_layers_and_a_dense_mlp_in_mlp_only_layers)
{
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    char *dir = test_mkdtemp();
    struct model *m = load_preset(be, dir);
    const struct model_config *c = &m->config;
    cr_assert_eq(c->arch, ARCH_QWEN3_MOE);
    cr_assert_eq(c->n_experts, 6);
    cr_assert_eq(c->n_experts_per_tok, 2);
    cr_assert(c->norm_topk_prob);
    cr_assert(c->qk_norm);
    cr_assert_eq(m->weights.layers[0].experts.n_experts, 6);
    cr_assert_eq(m->weights.layers[1].experts.n_experts, 0, "layer 1 is in mlp_only_layers");
    cr_assert_eq(m->weights.layers[1].w_gate.rows, c->intermediate_size);
    cr_assert_eq(m->weights.layers[2].experts.n_experts, 6);
    cr_assert_eq(m->weights.layers[2].experts.down[5].rows, c->hidden_size);
    cr_assert_eq(m->weights.layers[2].experts.down[5].cols, c->moe_intermediate_size);
    /* a step reads the router and 2 experts of 6 per sparse layer */
    uint64_t all = model_weight_bytes(m), step = model_weight_bytes_per_token(m);
    uint64_t expert = 3ull * 88 * 160 * 2;
    cr_assert_eq(all - step, 2 * 4 * expert + (uint64_t)c->vocab_size * c->hidden_size * 2 -
                                 (uint64_t)c->hidden_size * 2,
                 "unread: %llu", (unsigned long long)(all - step));
    model_free(m);
    test_rmtree(dir);
    free(dir);
    backend_destroy(be);
}

Test(qwen3_moe, a_missing_expert_tensor_is_named)
{
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    char *dir = test_mkdtemp();
    struct err err = {0};
    struct mkmodel_opts o = {.preset = "tiny-qwen3_moe", .seed = 1, .out_dir = dir};
    cr_assert_eq(mkmodel_write(&o, &err), 0, "%s", err.msg);
    /* one expert more than the file holds */
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = test_read_file(path, NULL);
    cr_assert_not_null(text);
    char *at = strstr(text, "\"num_experts\": 6");
    cr_assert_not_null(at);
    at[strlen("\"num_experts\": ")] = '7';
    cr_assert_eq(test_write_file(path, text, strlen(text)), 0);
    free(text);
    struct model *m = NULL;
    cr_assert_eq(model_load(dir, be, &m, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "model.layers.0.mlp.gate.weight") ||
                  strstr(err.msg, "experts.6"),
              "%s", err.msg);
    test_rmtree(dir);
    free(dir);
    backend_destroy(be);
}

Test(qwen3_moe, config_refuses_more_experts_per_token_than_experts)
{
    struct model_config c;
    struct err err = {0};
    const char *json = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 10, "
                       "\"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
                       "\"num_attention_heads\": 2, \"head_dim\": 4, \"num_experts\": 4, "
                       "\"num_experts_per_tok\": 5, \"moe_intermediate_size\": 4}";
    cr_assert_eq(model_config_parse(json, strlen(json), &c, &err), -INFERD_ERANGE);
    cr_assert(strstr(err.msg, "num_experts_per_tok (5)"), "%s", err.msg);
}

/* Prefill, prefill + decode through the paged KV and a batch of two prompts
 * give the same logits bit for bit in EXACT mode. */
Test(qwen3_moe, prefill_decode_and_batches_agree_bit_for_bit)
{
    struct backend *be = test_cpu_backend(COMPUTE_EXACT);
    char *dir = test_mkdtemp();
    struct model *m = load_preset(be, dir);
    struct err err = {0};
    struct kv_pool *pool = NULL;
    struct forward_state *st = NULL;
    cr_assert_eq(kv_pool_create(m, be, 16, 16, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_state_create(m, 64, &st, &err), 0, "%s", err.msg);
    int vocab = m->config.vocab_size;
    enum { N = 23 };
    int32_t toks[N], other[11];
    for (int i = 0; i < N; i++)
        toks[i] = (int32_t)((i * 37 + 11) % vocab);
    for (int i = 0; i < 11; i++)
        other[i] = (int32_t)((i * 53 + 7) % vocab);
    uint32_t blocks_a[2] = {0, 1}, blocks_b[2] = {2, 3};
    float *all = malloc((size_t)(N + 11) * vocab * sizeof(float));
    float *one = malloc((size_t)vocab * sizeof(float));
    struct batch_seq seq = {toks, N, 0, blocks_a, 2, true, false, NULL};
    cr_assert_eq(model_forward(m, st, &pool->cache, &(struct batch){&seq, 1}, all, &err), 0, "%s",
                 err.msg);
    for (int i = 0; i < N; i++) {
        struct batch_seq s1 = {toks + i, 1, i, blocks_b, 2, false, false, NULL};
        cr_assert_eq(model_forward(m, st, &pool->cache, &(struct batch){&s1, 1}, one, &err), 0);
        cr_expect_eq(memcmp(one, all + (size_t)i * vocab, (size_t)vocab * sizeof(float)), 0,
                     "decode position %d differs from prefill", i);
    }
    struct batch_seq two[2] = {{other, 11, 0, blocks_b, 2, true, false, NULL},
                               {toks, N, 0, blocks_a, 2, true, false, NULL}};
    float *both = malloc((size_t)(N + 11) * vocab * sizeof(float));
    cr_assert_eq(model_forward(m, st, &pool->cache, &(struct batch){two, 2}, both, &err), 0);
    cr_expect_eq(memcmp(both + (size_t)11 * vocab, all, (size_t)N * vocab * sizeof(float)), 0,
                 "a prompt batched with another differs");
    free(both);
    free(all);
    free(one);
    forward_state_free(st);
    kv_pool_free(pool);
    model_free(m);
    test_rmtree(dir);
    free(dir);
    backend_destroy(be);
}
