/* tests/unit/test_fusion.c — the CUDA backend's launches for every tiny model's steps, checked without a GPU.
 *
 * Forward steps are recorded as the CUDA backend records them (record.h)
 * and planned by its fusion planner (fuse.h). Each step is pinned as text,
 * one word per launch: "rmsnorm+gemvx3" is an RMSNorm folded into the GEMV
 * of a group of three matrices, "gemv+add" a GEMV with the residual add
 * folded in, "rope_qk+kv_store+attention" the q/k RoPE and KV write folded
 * into decode attention, "gemmx2" the cuBLASLt path of a pair. A change in the order or the buffers of model/forward.c's ops
 * that costs (or wins) a fusion changes the text and fails here. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/fuse.h"
#include "backend/cuda/record.h"
#include "kv/kv_quant_config.h"
#include "tools/mkmodel.h"
#include "model/model.h"
#include "test_support.h"

/* ---- a backend that records as the CUDA backend does ---------------------
 * Its ops go through the CUDA backend's recorder; where the CUDA backend
 * would launch the recorded step (a copy to or from the device, a release,
 * status), the step's op list is kept instead. Memory is host memory. The
 * split-attention scratch counts as grown already: the CUDA backend launches
 * what it has recorded before an attention op whose scratch must grow, once
 * per larger size, and never for these contexts (one split). */

#define ARENA_BYTES ((size_t)1 << 20) /* the CUDA backend's first arena */
#define H200_SMS 132

struct rec_backend {
    struct backend be;
    struct cu_rec rec;
    bool failed;
    struct err error;
    struct cu_op *step; /* owned; the last step launched */
    int n_step;
    int launches;       /* steps launched so far */
};

static struct rec_backend *rb_of(struct backend *be) { return (struct rec_backend *)be; }

static struct rec_backend *rb_of_rec(struct cu_rec *rec)
{
    return (struct rec_backend *)((char *)rec - offsetof(struct rec_backend, rec));
}

/* Where the CUDA backend launches the recorded step: the step is kept. */
static void rb_flush(struct rec_backend *rb)
{
    if (rb->rec.n_ops == 0)
        return;
    free(rb->step);
    rb->n_step = rb->rec.n_ops;
    rb->step = malloc((size_t)rb->n_step * sizeof *rb->step);
    cr_assert_not_null(rb->step);
    memcpy(rb->step, rb->rec.ops, (size_t)rb->n_step * sizeof *rb->step);
    rb->launches++;
    cu_rec_clear(&rb->rec);
}

static bool rb_ok(struct cu_rec *rec) { return !rb_of_rec(rec)->failed; }

static void rb_fail(struct cu_rec *rec, int code, const char *msg)
{
    struct rec_backend *rb = rb_of_rec(rec);
    if (!rb->failed)
        err_set(&rb->error, code, "%s", msg);
    rb->failed = true;
}

/* As the CUDA backend: a step that does not fit is launched, then the arena grows. */
static bool rb_arena_room(struct cu_rec *rec, size_t bytes)
{
    if (rec->arena_used + bytes <= rec->arena_cap)
        return true;
    rb_flush(rb_of_rec(rec));
    if (bytes <= rec->arena_cap)
        return true;
    size_t cap = rec->arena_cap;
    while (cap < bytes)
        cap *= 2;
    uint8_t *grown = realloc(rec->arena, cap);
    cr_assert_not_null(grown);
    rec->arena = grown;
    rec->arena_cap = cap;
    return true;
}

static bool rb_attn_scratch(struct cu_rec *rec, struct cu_op *probe)
{
    (void)rec;
    (void)probe;
    return true;
}

static const struct cu_rec_hooks rb_hooks = {rb_ok, rb_fail, rb_arena_room, rb_attn_scratch};

static void rb_destroy(struct backend *be)
{
    struct rec_backend *rb = rb_of(be);
    cu_rec_free(&rb->rec);
    free(rb->rec.arena);
    free(rb->step);
    free(rb);
}

static void *rb_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    return calloc(1, bytes ? bytes : 1);
}

static void rb_release(struct backend *be, void *ptr)
{
    rb_flush(rb_of(be));
    free(ptr);
}

static void rb_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    rb_flush(rb_of(be));
    memcpy(dst, src, bytes);
}

static void rb_embed(struct backend *be, const struct weight_matrix *table, const int32_t *tokens,
                     int64_t n_tokens, float *out)
{
    cu_rec_embed(&rb_of(be)->rec, table, tokens, n_tokens, out);
}

static void rb_matmul(struct backend *be, const float *x, int64_t n_tokens,
                      const struct weight_matrix *w, const float *bias, float *y)
{
    cu_rec_matmul_group(&rb_of(be)->rec, x, n_tokens, 1, &w, &bias, &y);
}

static void rb_matmul_group(struct backend *be, const float *x, int64_t n_tokens, int n,
                            const struct weight_matrix *const *w, const float *const *bias,
                            float *const *y)
{
    cu_rec_matmul_group(&rb_of(be)->rec, x, n_tokens, n, w, bias, y);
}

static void rb_rmsnorm(struct backend *be, const float *x, const float *weight, int64_t n_rows,
                       int64_t dim, float eps, float *y)
{
    cu_rec_rmsnorm(&rb_of(be)->rec, x, weight, n_rows, dim, eps, y);
}

static void rb_rope(struct backend *be, float *x, int64_t n_tokens, int n_heads, int head_dim,
                    const int32_t *positions, const struct rope_table *rope)
{
    cu_rec_rope(&rb_of(be)->rec, x, n_tokens, n_heads, head_dim, positions, rope);
}

static void rb_silu_mul(struct backend *be, const float *gate, const float *up, float *out,
                        int64_t n)
{
    cu_rec_silu_mul(&rb_of(be)->rec, gate, up, out, n);
}

static void rb_add(struct backend *be, float *y, const float *x, int64_t n)
{
    cu_rec_add(&rb_of(be)->rec, y, x, n);
}

static void rb_kv_store(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                        const float *v, const struct attn_span *spans, int n_spans)
{
    cu_rec_kv_store(&rb_of(be)->rec, kv, layer, k, v, spans, n_spans);
}

static void rb_attention(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                         const struct attn_span *spans, int n_spans, int n_heads, float scale,
                         int sliding_window, float *out)
{
    cu_rec_attention(&rb_of(be)->rec, q, kv, layer, spans, n_spans, n_heads, scale,
                     sliding_window, out);
}

static void rb_moe_route(struct backend *be, const float *logits, int64_t n_rows, int n_experts,
                         int top_k, bool norm, int32_t *ids, float *weights)
{
    cu_rec_moe_route(&rb_of(be)->rec, logits, n_rows, n_experts, top_k, norm, ids, weights);
}

static void rb_moe_ffn(struct backend *be, const float *x, int64_t n_rows,
                       const struct moe_experts *ex, const int32_t *ids, const float *weights,
                       int top_k, float *scratch, float *y)
{
    cu_rec_moe_ffn(&rb_of(be)->rec, x, n_rows, ex, ids, weights, top_k, scratch, y);
}

static void rb_gated_add(struct backend *be, float *y, const float *x, const float *g,
                         int64_t n_rows, int64_t dim)
{
    cu_rec_gated_add(&rb_of(be)->rec, y, x, g, n_rows, dim);
}

static void rb_gelu_tanh_mul(struct backend *be, const float *gate, const float *up, float *out,
                             int64_t n)
{
    cu_rec_gelu_tanh_mul(&rb_of(be)->rec, gate, up, out, n);
}

static void rb_scale(struct backend *be, float *x, int64_t n, float s)
{
    cu_rec_scale(&rb_of(be)->rec, x, n, s);
}

static void rb_softcap(struct backend *be, float *x, int64_t n, float cap)
{
    cu_rec_softcap(&rb_of(be)->rec, x, n, cap);
}

static int rb_status(struct backend *be, struct err *err)
{
    struct rec_backend *rb = rb_of(be);
    rb_flush(rb);
    return rb->failed ? err_set(err, rb->error.code, "%s", rb->error.msg) : 0;
}

static const struct backend_ops rb_ops = {
    .name = "cuda-recorder",
    .destroy = rb_destroy,
    .alloc = rb_alloc,
    .release = rb_release,
    .to_device = rb_copy,
    .to_host = rb_copy,
    .embed = rb_embed,
    .matmul = rb_matmul,
    .matmul_group = rb_matmul_group,
    .rmsnorm = rb_rmsnorm,
    .rope = rb_rope,
    .silu_mul = rb_silu_mul,
    .add = rb_add,
    .kv_store = rb_kv_store,
    .attention = rb_attention,
    .status = rb_status,
    .moe_route = rb_moe_route,
    .moe_ffn = rb_moe_ffn,
    .gated_add = rb_gated_add,
    .gelu_tanh_mul = rb_gelu_tanh_mul,
    .scale = rb_scale,
    .softcap = rb_softcap,
};

/* As backend_cuda_create sets it up for mode. */
static struct backend *recorder_create(enum compute_mode mode)
{
    struct rec_backend *rb = calloc(1, sizeof *rb);
    cr_assert_not_null(rb);
    rb->be.ops = &rb_ops;
    rb->be.mode = mode;
    rb->be.copy_weights = true;
    rb->be.kv_dtype = mode == COMPUTE_FAST ? DTYPE_F16 : DTYPE_F32;
    rb->be.impl = rb;
    rb->rec.hooks = &rb_hooks;
    rb->rec.n_sm = H200_SMS;
    rb->rec.row_invariant = mode == COMPUTE_EXACT;
    rb->rec.qprefill_window = mode == COMPUTE_FAST;
    rb->rec.arena = malloc(ARENA_BYTES);
    cr_assert_not_null(rb->rec.arena);
    rb->rec.arena_cap = ARENA_BYTES;
    return &rb->be;
}

/* ---- a model on the recorder, and its steps ------------------------------ */

#define BLOCK_SIZE 16
#define BLOCKS_PER_SEQ 4 /* 64 positions */
#define MAX_SEQS 9 /* CU_ATTN_MMA_MIN_ROWS */
#define PREFILL_TOKENS 20

struct rig {
    const char *preset;
    char *dir;
    struct backend *be;
    struct model *model;
    struct forward_state *state;
    struct kv_cache kv;
    uint32_t blocks[MAX_SEQS][BLOCKS_PER_SEQ];
    float *logits;
    bool all_logits; /* steps want every row's logits (a speculative verify step) */
};

static void rig_open(struct rig *r, const char *preset, enum compute_mode mode)
{
    struct err err = {0};
    memset(r, 0, sizeof *r);
    r->preset = preset;
    r->dir = test_mkdtemp();
    cr_assert_not_null(r->dir);
    struct mkmodel_opts opts = {.preset = preset, .seed = 1, .out_dir = r->dir};
    cr_assert_eq(mkmodel_write(&opts, &err), 0, "%s: %s", preset, err.msg);
    r->be = recorder_create(mode);
    cr_assert_eq(model_load(r->dir, r->be, &r->model, &err), 0, "%s: %s", preset, err.msg);
    cr_assert_eq(forward_state_create(r->model, PREFILL_TOKENS, &r->state, &err), 0, "%s",
                 err.msg);
    const struct model_config *c = &r->model->config;
    int n_blocks = MAX_SEQS * BLOCKS_PER_SEQ;
    size_t bytes = (size_t)c->n_layers * n_blocks * BLOCK_SIZE * c->n_kv_heads * c->head_dim *
                   dtype_size(r->be->kv_dtype);
    r->kv = (struct kv_cache){.k = r->be->ops->alloc(r->be, bytes),
                              .v = r->be->ops->alloc(r->be, bytes),
                              .dtype = r->be->kv_dtype,
                              .n_layers = c->n_layers,
                              .n_blocks = n_blocks,
                              .block_size = BLOCK_SIZE,
                              .n_kv_heads = c->n_kv_heads,
                              .head_dim = c->head_dim};
    for (int s = 0; s < MAX_SEQS; s++)
        for (int b = 0; b < BLOCKS_PER_SEQ; b++)
            r->blocks[s][b] = (uint32_t)(s * BLOCKS_PER_SEQ + b);
    r->logits = malloc((size_t)MAX_SEQS * c->vocab_size * sizeof(float));
    cr_assert_not_null(r->logits);
}

static void rig_close(struct rig *r)
{
    free(r->logits);
    r->be->ops->release(r->be, r->kv.k);
    r->be->ops->release(r->be, r->kv.v);
    forward_state_free(r->state);
    model_free(r->model);
    backend_destroy(r->be);
    test_rmtree(r->dir);
    free(r->dir);
}

/* One forward step of n_seqs sequences of n_tokens tokens each (a decode
 * step when n_tokens is 1); returns the step as the CUDA backend launches it. */
static const struct cu_op *rig_step(struct rig *r, int n_seqs, int n_tokens, int *n_ops)
{
    static const int pos0[MAX_SEQS] = {20, 7, 33, 12, 40, 3, 25, 50, 9};
    int32_t tokens[MAX_SEQS][PREFILL_TOKENS];
    struct batch_seq seqs[MAX_SEQS];
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < n_tokens; i++)
            tokens[s][i] = (int32_t)((s * 31 + i * 7 + 1) % r->model->config.vocab_size);
        seqs[s] = (struct batch_seq){.tokens = tokens[s],
                                     .n_tokens = n_tokens,
                                     .pos0 = n_tokens == 1 ? pos0[s] : 0,
                                     .block_ids = r->blocks[s],
                                     .n_block_ids = BLOCKS_PER_SEQ,
                                     .all_logits = r->all_logits};
    }
    struct batch batch = {seqs, n_seqs};
    struct rec_backend *rb = rb_of(r->be);
    int before = rb->launches;
    struct err err = {0};
    cr_assert_eq(model_forward(r->model, r->state, &r->kv, &batch, r->logits, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(rb->launches, before + 1, "the step was launched in %d parts",
                 rb->launches - before);
    *n_ops = rb->n_step;
    return rb->step;
}

/* ---- the plan, as text ---------------------------------------------------- */

static void append(char *buf, size_t cap, const char *word)
{
    size_t len = strlen(buf);
    snprintf(buf + len, cap - len, "%s%s", len ? " " : "", word);
}

static void launch_word(const struct cu_op *ops, const struct cu_launch *l, char *w, size_t cap)
{
    const struct cu_op *op = &ops[l->op];
    const char *qk_norm = l->qk.q_norm ? "qk_norm+" : "";
    switch (l->kind) {
    case CU_LAUNCH_EMBED: snprintf(w, cap, "embed"); break;
    case CU_LAUNCH_RMSNORM: snprintf(w, cap, "rmsnorm"); break;
    case CU_LAUNCH_ROPE: snprintf(w, cap, "rope"); break;
    case CU_LAUNCH_QK:
        snprintf(w, cap, "%srope_qk%s", qk_norm, l->qk.store ? "+kv_store" : "");
        break;
    case CU_LAUNCH_QK_ATTENTION: snprintf(w, cap, "%srope_qk+kv_store+attention", qk_norm); break;
    case CU_LAUNCH_SILU_MUL: snprintf(w, cap, "silu_mul"); break;
    case CU_LAUNCH_GELU_TANH_MUL: snprintf(w, cap, "gelu_tanh_mul"); break;
    case CU_LAUNCH_SCALE: snprintf(w, cap, "scale"); break;
    case CU_LAUNCH_SOFTCAP: snprintf(w, cap, "softcap"); break;
    case CU_LAUNCH_ADD: snprintf(w, cap, "add"); break;
    case CU_LAUNCH_ADD_RMSNORM: snprintf(w, cap, "add+rmsnorm"); break;
    case CU_LAUNCH_KV_STORE: snprintf(w, cap, "kv_store"); break;
    case CU_LAUNCH_ATTENTION: snprintf(w, cap, "attention"); break;
    case CU_LAUNCH_MOE_ROUTE: snprintf(w, cap, "moe_route"); break;
    case CU_LAUNCH_MOE_FFN: snprintf(w, cap, "moe_ffn%s", l->residual ? "+add" : ""); break;
    case CU_LAUNCH_GATED_ADD: snprintf(w, cap, "gated_add"); break;
    case CU_LAUNCH_GEMM: {
        char group[16] = "";
        if (op->u.mm.n > 1)
            snprintf(group, sizeof group, "x%d", op->u.mm.n);
        snprintf(w, cap, "gemm%s%s", group, l->residual ? "+add" : "");
        break;
    }
    case CU_LAUNCH_GEMV: {
        int n = ops[l->op + (l->norm ? 1 : 0)].u.mm.n;
        char group[16] = "";
        if (n > 1)
            snprintf(group, sizeof group, "x%d", n);
        snprintf(w, cap, "%s%s%s%s%s%s", l->norm ? "rmsnorm+" : "", l->skinny ? "skinny" : "gemv",
                 group, l->residual ? "+add" : "", l->norm_sums ? "+sums" : "",
                 l->swiglu ? "+swiglu" : "");
        break;
    }
    default: snprintf(w, cap, "?%d", (int)l->kind);
    }
}

#define MAX_LAUNCHES 512

/* The plan of ops as text; *n_launches gets its length. Also checks that the
 * launches cover every op once, in order. */
static void plan_text(const struct cu_fuse_config *cfg, const struct cu_op *ops, int n_ops,
                      char *buf, size_t cap, int *n_launches)
{
    static struct cu_launch plan[MAX_LAUNCHES];
    int n = cu_fuse_plan(cfg, ops, n_ops, plan, MAX_LAUNCHES);
    cr_assert_gt(n, 0, "the planner refused the step");
    cr_assert_leq(n, MAX_LAUNCHES);
    buf[0] = '\0';
    int next = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(plan[i].op, next, "launch %d starts at op %d, not %d", i, plan[i].op, next);
        cr_assert_geq(plan[i].n_ops, 1);
        next += plan[i].n_ops;
        char w[64];
        launch_word(ops, &plan[i], w, sizeof w);
        append(buf, cap, w);
    }
    cr_assert_eq(next, n_ops, "the plan covers %d of %d ops", next, n_ops);
    *n_launches = n;
}

/* "embed" [after_embed], n_layers times layer, then head [after_head]: the
 * text a whole step must plan to. A layer text with " | " in it lists every
 * layer's own text instead (a model whose layers differ: Qwen3-MoE's dense
 * mlp_only_layers). */
static void step_text(const char *layer, int n_layers, const char *head, const char *after_embed,
                      const char *after_head, char *buf, size_t cap)
{
    buf[0] = '\0';
    append(buf, cap, "embed");
    if (after_embed)
        append(buf, cap, after_embed);
    if (strstr(layer, " | ")) {
        char each[4096];
        snprintf(each, sizeof each, "%s", layer);
        for (char *part = each, *bar; part; part = bar ? bar + 3 : NULL) {
            if ((bar = strstr(part, " | ")))
                *bar = '\0';
            append(buf, cap, part);
        }
    } else {
        for (int l = 0; l < n_layers; l++)
            append(buf, cap, layer);
    }
    append(buf, cap, head);
    if (after_head)
        append(buf, cap, after_head);
}

/* Launch words in text ("|" separates layers and is not one). */
static int words(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        n += (p == text || p[-1] == ' ') && *p != ' ' && *p != '|';
    return n;
}

/* ---- what each tiny model's steps must plan to --------------------------- */

/* Decode, bf16 weights: five launches a layer. */
#define DECODE_BF16 \
    "rmsnorm+gemvx3 rope_qk+kv_store+attention gemv+add rmsnorm+gemvx2+swiglu gemv+add"
#define DECODE_BF16_QK_NORM \
    "rmsnorm+gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm+gemvx2+swiglu gemv+add"
/* Decode, f32 weights (F32, or F16 widened at load), and decode in exact
 * mode, whose batch invariance keeps the norms apart (the folded norm sums in
 * another order than the RMSNorm kernel that prefill steps use). */
#define DECODE_F32 \
    "rmsnorm gemvx3 rope_qk+kv_store+attention gemv+add rmsnorm gemvx2+swiglu gemv+add"
#define DECODE_EXACT_QK_NORM \
    "rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm gemvx2+swiglu gemv+add"
/* Prefill in fast mode, bf16 weights: cuBLASLt, nothing folded into it. */
#define PREFILL_GEMM \
    "rmsnorm gemmx3 rope_qk+kv_store attention gemm add rmsnorm gemmx2 silu_mul gemm add"
#define PREFILL_GEMM_QK_NORM \
    "rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm add rmsnorm gemmx2 silu_mul gemm add"
/* Prefill on the GEMV kernels (exact mode, or f32 weights): epilogues only. */
#define PREFILL_GEMV \
    "rmsnorm gemvx3 rope_qk+kv_store attention gemv+add rmsnorm gemvx2+swiglu gemv+add"
#define PREFILL_GEMV_QK_NORM \
    "rmsnorm gemvx3 qk_norm+rope_qk+kv_store attention gemv+add rmsnorm gemvx2+swiglu gemv+add"

/* Qwen3-MoE's sparse layer: the router's matmul (its norm folded in where
 * rule 2 allows), routing, the experts with the residual add (rule 8); layer 1 of
 * tiny-qwen3_moe is dense (mlp_only_layers). */
#define MOE_DECODE_BF16 \
    "rmsnorm+gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm+gemv moe_route moe_ffn+add"
#define MOE_DECODE_EXACT \
    "rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm gemv moe_route moe_ffn+add"
#define MOE_PREFILL_GEMM \
    "rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm add rmsnorm gemm moe_route moe_ffn+add"
#define MOE_PREFILL_GEMV \
    "rmsnorm gemvx3 qk_norm+rope_qk+kv_store attention gemv+add rmsnorm gemv moe_route moe_ffn+add"
#define MOE_LAYERS(sparse, dense) sparse " | " dense " | " sparse
/* Gemma 3: the sandwich norms sit between the o/down GEMVs and their residual
 * adds, and GeGLU has no GEMV epilogue, so a layer takes five launches more
 * than Llama's in fast decode; the embedding is scaled and the logits
 * soft-capped in launches of their own. */
#define GEMMA3_DECODE_BF16                                                                       \
    "rmsnorm+gemvx3 qk_norm+rope_qk+kv_store+attention gemv rmsnorm add rmsnorm+gemvx2 "        \
    "gelu_tanh_mul gemv rmsnorm add"
#define GEMMA3_DECODE_EXACT                                                                      \
    "rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv rmsnorm add rmsnorm gemvx2 "        \
    "gelu_tanh_mul gemv rmsnorm add"
#define GEMMA3_PREFILL_GEMM                                                                      \
    "rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm rmsnorm add rmsnorm gemmx2 "        \
    "gelu_tanh_mul gemm rmsnorm add"
#define GEMMA3_PREFILL_GEMV                                                                      \
    "rmsnorm gemvx3 qk_norm+rope_qk+kv_store attention gemv rmsnorm add rmsnorm gemvx2 "        \
    "gelu_tanh_mul gemv rmsnorm add"

struct expectation {
    const char *preset;
    const char *decode;        /* a layer of a decode step, fast mode */
    int decode_launches;       /* launches of that layer */
    const char *decode_exact;  /* a layer of a decode step, exact mode */
    int decode_exact_launches;
    const char *prefill_fast;  /* a layer of a prefill step, fast mode */
    int prefill_fast_launches;
    const char *prefill_exact; /* a layer of a prefill step, exact mode */
    int prefill_exact_launches;
    bool bf16;                 /* the final RMSNorm folds into the LM head's GEMV (fast mode) */
    const char *after_embed;   /* launches between the embedding and the first layer, or NULL */
    const char *after_head;    /* launches after the LM head, or NULL */
};

static const struct expectation expectations[] = {
    {"tiny-llama", DECODE_BF16, 5, DECODE_F32, 7, PREFILL_GEMM, 11, PREFILL_GEMV, 8, true, NULL, NULL},
    {"tiny-llama3", DECODE_BF16, 5, DECODE_F32, 7, PREFILL_GEMM, 11, PREFILL_GEMV, 8, true, NULL, NULL},
    {"tiny-llama-linear", DECODE_F32, 7, DECODE_F32, 7, PREFILL_GEMV, 8, PREFILL_GEMV, 8, false, NULL, NULL},
    {"tiny-mistral", DECODE_F32, 7, DECODE_F32, 7, PREFILL_GEMV, 8, PREFILL_GEMV, 8, false, NULL, NULL},
    {"tiny-qwen2", DECODE_BF16, 5, DECODE_F32, 7, PREFILL_GEMM, 11, PREFILL_GEMV, 8, true, NULL, NULL},
    {"tiny-qwen3", DECODE_BF16_QK_NORM, 5, DECODE_EXACT_QK_NORM, 7, PREFILL_GEMM_QK_NORM, 11,
     PREFILL_GEMV_QK_NORM, 8, true, NULL, NULL},
    {"tiny-qwen3-gqa1", DECODE_BF16_QK_NORM, 5, DECODE_EXACT_QK_NORM, 7, PREFILL_GEMM_QK_NORM,
     11, PREFILL_GEMV_QK_NORM, 8, true, NULL, NULL},
    /* launches: every layer's together */
    {"tiny-qwen3_moe", MOE_LAYERS(MOE_DECODE_BF16, DECODE_BF16_QK_NORM), 6 + 5 + 6,
     MOE_LAYERS(MOE_DECODE_EXACT, DECODE_EXACT_QK_NORM), 8 + 7 + 8,
     MOE_LAYERS(MOE_PREFILL_GEMM, PREFILL_GEMM_QK_NORM), 10 + 11 + 10,
     MOE_LAYERS(MOE_PREFILL_GEMV, PREFILL_GEMV_QK_NORM), 9 + 8 + 9, true, NULL, NULL},
    {"tiny-gemma3", GEMMA3_DECODE_BF16, 10, GEMMA3_DECODE_EXACT, 12, GEMMA3_PREFILL_GEMM, 13,
     GEMMA3_PREFILL_GEMV, 13, true, "scale", "softcap"},
    /* Phi-3's fused projections are views into one tensor each: Llama's launches */
    {"tiny-phi3", DECODE_BF16, 5, DECODE_F32, 7, PREFILL_GEMM, 11, PREFILL_GEMV, 8, true, NULL, NULL},
};

static const struct expectation *expectation_of(const char *preset)
{
    for (size_t i = 0; i < sizeof expectations / sizeof expectations[0]; i++)
        if (!strcmp(expectations[i].preset, preset))
            return &expectations[i];
    return NULL;
}

#define TEXT_CAP 8192

/* Plans one step of the rig's model and checks it against layer and head. */
static void check_step(struct rig *r, const char *what, const struct cu_fuse_config *cfg,
                       int n_seqs, int n_tokens, const char *layer, int layer_launches,
                       const char *head)
{
    static char got[TEXT_CAP], want[TEXT_CAP];
    int n_layers = r->model->config.n_layers;
    cr_assert_eq(words(layer), layer_launches, "%s: the layer text has %d launches, not %d",
                 what, words(layer), layer_launches);
    int n_ops = 0, n_launches = 0;
    const struct cu_op *ops = rig_step(r, n_seqs, n_tokens, &n_ops);
    plan_text(cfg, ops, n_ops, got, sizeof got, &n_launches);
    const struct expectation *x = expectation_of(r->preset);
    const char *after_embed = x ? x->after_embed : NULL, *after_head = x ? x->after_head : NULL;
    step_text(layer, n_layers, head, after_embed, after_head, want, sizeof want);
    cr_expect_str_eq(got, want, "%s:\n  planned  %s\n  expected %s", what, got, want);
    int per_layers = strstr(layer, " | ") ? layer_launches : n_layers * layer_launches;
    cr_expect_eq(n_launches,
                 1 + per_layers + words(head) + (after_embed ? words(after_embed) : 0) +
                     (after_head ? words(after_head) : 0),
                 "%s: %d launches for %d layers", what, n_launches, n_layers);
}

/* Every tiny preset `inferd mkmodel --list` offers. */
static int tiny_presets(const struct mkmodel_preset **out)
{
    int n, count = 0;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    for (int i = 0; i < n; i++)
        if (!p[i].real)
            out[count++] = &p[i];
    return count;
}

/* Rule 4 (add + RMSNorm, on in the backend) is off in these two, so that each layer's text
 * stands alone; its own test pins it. */
static const struct cu_fuse_config fast_all = {.fast = true, .norm_gemv = true,
                                               .qk_attention = true,
                                               .gemv_max_rows = CU_GEMV_MAX_ROWS};
/* As backend_cuda_create configures exact mode: the norm fold stays off. */
static const struct cu_fuse_config exact_all = {.fast = false, .norm_gemv = false,
                                                .qk_attention = true,
                                                .gemv_max_rows = CU_GEMV_MAX_ROWS};

Test(fusion, every_tiny_model_decodes_one_sequence_in_the_pinned_launches)
{
    const struct mkmodel_preset *presets[64];
    int n = tiny_presets(presets);
    cr_assert_geq(n, 4);
    for (int i = 0; i < n; i++) {
        const struct expectation *x = expectation_of(presets[i]->name);
        cr_assert_not_null(x, "%s: no expected launches; add the preset to expectations[]",
                           presets[i]->name);
        for (int mode = 0; mode < 2; mode++) {
            struct rig r;
            rig_open(&r, x->preset, mode ? COMPUTE_FAST : COMPUTE_EXACT);
            char what[128];
            snprintf(what, sizeof what, "%s, %s decode, one sequence", x->preset,
                     mode ? "fast" : "exact");
            if (mode)
                check_step(&r, what, &fast_all, 1, 1, x->decode, x->decode_launches,
                           x->bf16 ? "rmsnorm+gemv" : "rmsnorm gemv");
            else
                check_step(&r, what, &exact_all, 1, 1, x->decode_exact, x->decode_exact_launches,
                           "rmsnorm gemv");
            rig_close(&r);
        }
    }
}

/* Several sequences: one final RMSNorm of all their rows (they follow each other), folded
 * into the LM head's GEMV as one sequence's is. */
Test(fusion, every_tiny_model_decodes_three_sequences_in_the_pinned_launches)
{
    const struct mkmodel_preset *presets[64];
    int n = tiny_presets(presets);
    for (int i = 0; i < n; i++) {
        const struct expectation *x = expectation_of(presets[i]->name);
        cr_assert_not_null(x, "%s: no expected launches", presets[i]->name);
        struct rig r;
        rig_open(&r, x->preset, COMPUTE_FAST);
        char what[128];
        snprintf(what, sizeof what, "%s, fast decode, three sequences", x->preset);
        check_step(&r, what, &fast_all, 3, 1, x->decode, x->decode_launches,
                   x->bf16 ? "rmsnorm+gemv" : "rmsnorm gemv");
        rig_close(&r);
    }
}

Test(fusion, every_tiny_model_prefills_in_the_pinned_launches)
{
    const struct mkmodel_preset *presets[64];
    int n = tiny_presets(presets);
    for (int i = 0; i < n; i++) {
        const struct expectation *x = expectation_of(presets[i]->name);
        cr_assert_not_null(x, "%s: no expected launches", presets[i]->name);
        const char *head = x->bf16 ? "rmsnorm+gemv" : "rmsnorm gemv"; /* the last row only */
        struct rig r;
        char what[128];
        rig_open(&r, x->preset, COMPUTE_FAST);
        snprintf(what, sizeof what, "%s, fast prefill of %d tokens", x->preset, PREFILL_TOKENS);
        check_step(&r, what, &fast_all, 1, PREFILL_TOKENS, x->prefill_fast,
                   x->prefill_fast_launches, head);
        rig_close(&r);
        rig_open(&r, x->preset, COMPUTE_EXACT);
        snprintf(what, sizeof what, "%s, exact prefill of %d tokens", x->preset, PREFILL_TOKENS);
        check_step(&r, what, &exact_all, 1, PREFILL_TOKENS, x->prefill_exact,
                   x->prefill_exact_launches, "rmsnorm gemv");
        rig_close(&r);
    }
}

/* Exact mode's attention reduces each query row in an order fixed by its own
 * position: one split and the decode kernels, whatever the step's rows and
 * contexts; fast mode keeps its split decode and its prefill kernels. */
Test(fusion, exact_mode_attention_never_splits_nor_takes_the_prefill_kernels)
{
    const struct mkmodel_preset *presets[64];
    int n = tiny_presets(presets);
    for (int i = 0; i < n; i++) {
        for (int mode = 0; mode < 2; mode++) {
            struct rig r;
            rig_open(&r, presets[i]->name, mode ? COMPUTE_FAST : COMPUTE_EXACT);
            const int shapes[][2] = {{1, PREFILL_TOKENS}, {3, 1}, {2, 5}};
            for (int sh = 0; sh < 3; sh++) {
                int n_ops = 0;
                const struct cu_op *ops = rig_step(&r, shapes[sh][0], shapes[sh][1], &n_ops);
                for (int k = 0; k < n_ops; k++) {
                    if (ops[k].kind != CU_ATTENTION)
                        continue;
                    bool prefill = cu_attention_uses_prefill(&ops[k]);
                    if (mode) {
                        cr_expect_eq(prefill, shapes[sh][1] > CU_GEMV_MAX_ROWS,
                                     "%s fast: %d tokens a sequence", presets[i]->name,
                                     shapes[sh][1]);
                    } else {
                        cr_expect(!prefill && ops[k].u.attn.n_splits == 1,
                                  "%s exact, %d x %d tokens: attention on the %s kernels with "
                                  "%d splits",
                                  presets[i]->name, shapes[sh][0], shapes[sh][1],
                                  prefill ? "prefill" : "decode", ops[k].u.attn.n_splits);
                    }
                }
            }
            rig_close(&r);
        }
    }
}

/* backend_options' fusion switches turn exactly their fusion off. */
Test(fusion, switched_off_fusions_leave_their_ops_as_separate_launches)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    struct cu_fuse_config no_norm = fast_all, no_qk = fast_all;
    no_norm.norm_gemv = false;
    no_qk.qk_attention = false;
    check_step(&r, "tiny-qwen3 decode, norm fusion off", &no_norm, 1, 1,
               "rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm gemvx2+swiglu "
               "gemv+add",
               7, "rmsnorm gemv");
    check_step(&r, "tiny-qwen3 decode, q/k fusion off", &no_qk, 1, 1,
               "rmsnorm+gemvx3 qk_norm+rope_qk+kv_store attention gemv+add rmsnorm+gemvx2+swiglu "
               "gemv+add",
               6, "rmsnorm+gemv");
    rig_close(&r);
}

/* "first | rest | rest ...": n_layers layers' texts, as check_step takes them. */
static const char *layers_text(const char *first, const char *rest, int n_layers)
{
    static char buf[TEXT_CAP];
    snprintf(buf, sizeof buf, "%s", first);
    for (int l = 1; l < n_layers; l++) {
        size_t len = strlen(buf);
        snprintf(buf + len, sizeof buf - len, " | %s", rest);
    }
    return buf;
}

/* Rule 4: a standalone residual add and the RMSNorm of all its rows after it are one
 * launch, across layers too (a layer's last add, the next layer's first norm or the final
 * norm); not where the norm reads only some rows (a prefill's final norm) or where rule 2
 * folds it into a GEMV; nothing to fuse where the adds ride on the GEMVs. */
Test(fusion, a_residual_add_and_the_rmsnorm_of_its_sum_are_one_launch)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    int n_layers = r.model->config.n_layers;
    struct cu_fuse_config on = fast_all;
    on.add_norm = true;
    check_step(&r, "tiny-qwen3, 9 sequences decoding", &on, 9, 1,
               layers_text("rmsnorm gemmx3 qk_norm+rope_qk+kv_store+attention gemm add+rmsnorm "
                           "gemmx2 silu_mul gemm",
                           "add+rmsnorm gemmx3 qk_norm+rope_qk+kv_store+attention gemm "
                           "add+rmsnorm gemmx2 silu_mul gemm",
                           n_layers),
               8 * n_layers, "add+rmsnorm gemm");
    check_step(&r, "tiny-qwen3, fast prefill", &on, 1, PREFILL_TOKENS,
               layers_text("rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm add+rmsnorm "
                           "gemmx2 silu_mul gemm",
                           "add+rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm "
                           "add+rmsnorm gemmx2 silu_mul gemm",
                           n_layers),
               9 * n_layers, "add rmsnorm+gemv");
    check_step(&r, "tiny-qwen3, one sequence decoding", &on, 1, 1, DECODE_BF16_QK_NORM, 5,
               "rmsnorm+gemv");
    rig_close(&r);
    /* Gemma 3's sandwich norms in exact mode: the post-norm, then the add and the next norm */
    rig_open(&r, "tiny-gemma3", COMPUTE_EXACT);
    n_layers = r.model->config.n_layers;
    on = exact_all;
    on.add_norm = true;
    check_step(&r, "tiny-gemma3, exact decode", &on, 1, 1,
               layers_text("rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv rmsnorm "
                           "add+rmsnorm gemvx2 gelu_tanh_mul gemv rmsnorm",
                           "add+rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv rmsnorm "
                           "add+rmsnorm gemvx2 gelu_tanh_mul gemv rmsnorm",
                           n_layers),
               10 * n_layers, "add+rmsnorm gemv");
    rig_close(&r);
}

/* The launches of a step that write the next GEMM's x in bf16 (rule 6), each checked to be
 * followed by a GEMM launch reading its output. */
static int gemm_x_writers(struct rig *r, const struct cu_fuse_config *cfg, int n_seqs,
                          int n_tokens)
{
    int n_ops = 0, count = 0;
    const struct cu_op *ops = rig_step(r, n_seqs, n_tokens, &n_ops);
    static struct cu_launch plan[MAX_LAUNCHES];
    int n = cu_fuse_plan(cfg, ops, n_ops, plan, MAX_LAUNCHES);
    cr_assert(n > 0 && n <= MAX_LAUNCHES);
    for (int k = 0; k < n; k++) {
        if (!plan[k].to_gemm_x)
            continue;
        const struct cu_op *last = &ops[plan[k].op + plan[k].n_ops - 1];
        const float *out = last->kind == CU_RMSNORM ? last->u.norm.y : last->u.ew.out;
        cr_assert(k + 1 < n && plan[k + 1].kind == CU_LAUNCH_GEMM &&
                      ops[plan[k + 1].op].u.mm.x == out,
                  "launch %d writes a bf16 x that no GEMM right after it reads", k);
        count++;
    }
    return count;
}

/* Rule 6: the RMSNorms before the q/k/v, gate/up and LM-head GEMMs and the SwiGLU before the
 * down GEMM write their GEMM's x in bf16 (a decode step of 9 sequences, a prefill); none on
 * the GEMV path or with the rule off. */
Test(fusion, the_norm_or_swiglu_before_a_cublaslt_gemm_writes_its_x_in_bf16)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    int n_layers = r.model->config.n_layers;
    struct cu_fuse_config on = fast_all, off = fast_all;
    on.gemm_x = true;
    on.add_norm = true;
    off.add_norm = true;
    cr_expect_eq(gemm_x_writers(&r, &on, 9, 1), 3 * n_layers + 1);
    cr_expect_eq(gemm_x_writers(&r, &off, 9, 1), 0);
    /* prefill: the final norm reads the last row only, into the LM head's GEMV */
    cr_expect_eq(gemm_x_writers(&r, &on, 1, PREFILL_TOKENS), 3 * n_layers);
    cr_expect_eq(gemm_x_writers(&r, &on, 1, 1), 0);
    rig_close(&r);
}

/* --cuda-gemv-rows: fast-mode matmuls of more rows than the cap go to
 * cuBLASLt (and their norms stay separate launches); exact mode's GEMV, whose
 * reduction order is its batch invariance, ignores the cap and the skinny
 * GEMM. */
Test(fusion, matmuls_of_more_rows_than_the_gemv_cap_go_to_cublaslt_in_fast_mode_only)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    struct cu_fuse_config capped = fast_all;
    capped.gemv_max_rows = 2;
    check_step(&r, "tiny-qwen3, 2 sequences decoding, cap 2", &capped, 2, 1,
               "rmsnorm+gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm+gemvx2+swiglu "
               "gemv+add",
               5, "rmsnorm+gemv");
    check_step(&r, "tiny-qwen3, 3 sequences decoding, cap 2", &capped, 3, 1,
               "rmsnorm gemmx3 qk_norm+rope_qk+kv_store+attention gemm add rmsnorm gemmx2 "
               "silu_mul gemm add",
               10, "rmsnorm gemm");
    rig_close(&r);
    rig_open(&r, "tiny-qwen3", COMPUTE_EXACT);
    struct cu_fuse_config exact_capped = exact_all;
    exact_capped.gemv_max_rows = 2;
    exact_capped.skinny_max_rows = CU_SKINNY_MAX_ROWS; /* and not the skinny GEMM */
    check_step(&r, "tiny-qwen3 exact, 3 sequences decoding, cap 2", &exact_capped, 3, 1,
               "rmsnorm gemvx3 qk_norm+rope_qk+kv_store+attention gemv+add rmsnorm gemvx2+swiglu "
               "gemv+add",
               7, "rmsnorm gemv");
    rig_close(&r);
}

/* One bf16 matmul of a tensor-core GEMM's limits: its rows and row length,
 * x and w offset from 16-byte alignment (in elements), the launch kind and
 * whether it is on a tensor-core GEMM (skinny). */
struct mm_limit {
    int rows, cols, x_off, w_off, kind;
    bool skinny;
};

static void expect_matmul_plans(const struct cu_fuse_config *cfg, const struct mm_limit *cases,
                                size_t n)
{
    static _Alignas(16) float x[(CU_BATCH_MAX_ROWS + 1) * 208 + 4];
    static _Alignas(16) uint16_t w[64 * 208 + 8];
    struct cu_op op;
    memset(&op, 0, sizeof op);
    op.kind = CU_MATMUL;
    op.u.mm.dtype = DTYPE_BF16;
    op.u.mm.n = 1;
    op.u.mm.m[0].rows = 64;
    for (size_t i = 0; i < n; i++) {
        op.n_rows = cases[i].rows;
        op.u.mm.cols = cases[i].cols;
        op.u.mm.x = x + cases[i].x_off;
        op.u.mm.m[0].w = w + cases[i].w_off;
        struct cu_launch plan[2];
        cr_assert_eq(cu_fuse_plan(cfg, &op, 1, plan, 2), 1);
        bool batch = cases[i].skinny && cases[i].rows > CU_SKINNY_MAX_ROWS;
        cr_expect(plan[0].kind == cases[i].kind && plan[0].skinny == cases[i].skinny &&
                      cu_fuse_uses_batch_gemm(cfg, &op) == batch,
                  "%d rows of %d, x + %d, w + %d: launch kind %d, skinny %d", cases[i].rows,
                  cases[i].cols, cases[i].x_off, cases[i].w_off, (int)plan[0].kind,
                  (int)plan[0].skinny);
    }
}

/* The skinny GEMM: fast-mode bf16 matmuls of more rows than the GEMV cap and
 * at most skinny_max_rows run on it, with the GEMV launches' epilogues (the
 * norms stay separate launches); more rows, rows of a length not a multiple
 * of 8 and unaligned operands do not (nor exact mode: the test above). */
/* fast_all with the backend's GEMV cap and the skinny GEMM on. */
static struct cu_fuse_config skinny_config(void)
{
    struct cu_fuse_config cfg = fast_all;
    cfg.gemv_max_rows = 2;
    cfg.skinny_max_rows = CU_SKINNY_MAX_ROWS;
    return cfg;
}

Test(fusion, fast_matmuls_of_a_few_rows_past_the_gemv_cap_run_on_the_skinny_gemm)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    struct cu_fuse_config skinny = skinny_config();
    check_step(&r, "tiny-qwen3, 3 sequences decoding", &skinny, 3, 1,
               "rmsnorm skinnyx3 qk_norm+rope_qk+kv_store+attention skinny+add rmsnorm "
               "skinnyx2+swiglu skinny+add",
               7, "rmsnorm skinny");
    rig_close(&r);
    /* its limits: rows, row length, alignment */
    static const struct mm_limit cases[] = {
        {CU_SKINNY_MAX_ROWS, 208, 0, 0, CU_LAUNCH_GEMV, true},
        {CU_SKINNY_MAX_ROWS + 1, 208, 0, 0, CU_LAUNCH_GEMM, false},
        {3, 200, 0, 0, CU_LAUNCH_GEMV, true},
        {3, 204, 0, 0, CU_LAUNCH_GEMV, false}, /* GEMV kernels' element reads, as before */
        {3, 208, 1, 0, CU_LAUNCH_GEMM, false},
        {3, 208, 0, 4, CU_LAUNCH_GEMM, false},
    };
    expect_matmul_plans(&skinny, cases, sizeof cases / sizeof cases[0]);
}

/* A speculative verify step (one sequence, 5 tokens, every row's logits) on the skinny GEMM:
 * rule 1 folds its span's q/k work into the attention (qk_spans), rule 9 its RMSNorms into the
 * skinny GEMMs after them (norm_sums) - the final norm into the LM head's too - where the GEMM
 * before adds into the residual stream: only the first layer's first norm stays a launch. */
Test(fusion, a_verify_steps_qk_work_and_norms_fold_into_the_launches_after_them)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    r.all_logits = true;
    const int n_layers = r.model->config.n_layers;
    struct cu_fuse_config cfg = skinny_config();
    check_step(&r, "tiny-qwen3, a 5-token span, no span rules", &cfg, 1, 5,
               "rmsnorm skinnyx3 qk_norm+rope_qk+kv_store attention skinny+add rmsnorm "
               "skinnyx2+swiglu skinny+add",
               8, "rmsnorm skinny");
    cfg.qk_spans = true;
    cfg.norm_sums = true;
    const char *rest = "rmsnorm+skinnyx3 qk_norm+rope_qk+kv_store+attention skinny+add+sums "
                       "rmsnorm+skinnyx2+swiglu skinny+add+sums";
    check_step(&r, "tiny-qwen3, a 5-token span", &cfg, 1, 5,
               layers_text("rmsnorm skinnyx3 qk_norm+rope_qk+kv_store+attention skinny+add+sums "
                           "rmsnorm+skinnyx2+swiglu skinny+add+sums",
                           rest, n_layers),
               5 * n_layers + 1, "rmsnorm+skinny");
    /* a prompt chunk wants its last row's logits alone: the final norm of that row is rule
     * 2's, into the LM head's GEMV, and the last layer leaves no sums */
    r.all_logits = false;
    static char layers[TEXT_CAP];
    snprintf(layers, sizeof layers, "%s",
             n_layers > 1 ? layers_text("rmsnorm skinnyx3 qk_norm+rope_qk+kv_store+attention "
                                        "skinny+add+sums rmsnorm+skinnyx2+swiglu skinny+add+sums",
                                        rest, n_layers - 1)
                          : "");
    size_t len = strlen(layers);
    snprintf(layers + len, sizeof layers - len, "%s%s", len ? " | " : "",
             n_layers > 1 ? "rmsnorm+skinnyx3 qk_norm+rope_qk+kv_store+attention skinny+add+sums "
                            "rmsnorm+skinnyx2+swiglu skinny+add"
                          : "rmsnorm skinnyx3 qk_norm+rope_qk+kv_store+attention skinny+add+sums "
                            "rmsnorm+skinnyx2+swiglu skinny+add");
    check_step(&r, "tiny-qwen3, a 5-token prompt chunk", &cfg, 1, 5, layers, 5 * n_layers + 1,
               "rmsnorm+gemv");
    /* a MoE layer's experts read the norm's output the router reads: that norm stays a
     * launch (its buffer would hold the unnormalised rows), the dense layers' fold */
    rig_close(&r);
    rig_open(&r, "tiny-qwen3_moe", COMPUTE_FAST);
    r.all_logits = true;
    int moe_ops = 0, moe_n = 0, folded = 0;
    const struct cu_op *moe = rig_step(&r, 1, 5, &moe_ops);
    static struct cu_launch moe_plan[MAX_LAUNCHES];
    moe_n = cu_fuse_plan(&cfg, moe, moe_ops, moe_plan, MAX_LAUNCHES);
    cr_assert_gt(moe_n, 0);
    for (int i = 0; i < moe_n; i++) {
        if (!(moe_plan[i].norm && moe_plan[i].skinny))
            continue;
        folded++;
        /* until the next norm writes that buffer again */
        const float *y = moe[moe_plan[i].op].u.norm.y;
        for (int j = moe_plan[i].op + 1;
             j < moe_ops && !(moe[j].kind == CU_RMSNORM && moe[j].u.norm.y == y); j++)
            cr_expect(!(moe[j].kind == CU_MOE_FFN && moe[j].u.moe.x == y),
                      "launch %d folds the norm whose output the experts at op %d read", i, j);
    }
    cr_expect_gt(folded, 0, "no norm of tiny-qwen3_moe's dense layers folded");
    /* a span past CU_QK_MAX_SPAN takes the prefill kernels: no q/k fold */
    r.all_logits = true;
    int n_ops = 0;
    const struct cu_op *ops = rig_step(&r, 1, CU_QK_MAX_SPAN + 1, &n_ops);
    static struct cu_launch plan[MAX_LAUNCHES];
    int n = cu_fuse_plan(&cfg, ops, n_ops, plan, MAX_LAUNCHES);
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++)
        cr_expect_neq(plan[i].kind, CU_LAUNCH_QK_ATTENTION, "launch %d of a %d-token span", i,
                      CU_QK_MAX_SPAN + 1);
    rig_close(&r);
}

/* Launches of the step of n_seqs sequences of n_tokens tokens each that leave rule 9's sums. */
static int sums_launches(struct rig *r, const struct cu_fuse_config *cfg, int n_seqs, int n_tokens)
{
    int n_ops = 0, sums = 0;
    const struct cu_op *ops = rig_step(r, n_seqs, n_tokens, &n_ops);
    static struct cu_launch plan[MAX_LAUNCHES];
    int n = cu_fuse_plan(cfg, ops, n_ops, plan, MAX_LAUNCHES);
    cr_assert_gt(n, 0);
    for (int i = 0; i < n && i < MAX_LAUNCHES; i++)
        sums += plan[i].norm_sums;
    return sums;
}

/* Rule 9 by default (norm_sums_spans): in a step whose attention has a span of several tokens
 * (a verify step), every layer's residual GEMMs leave their sums as with norm_sums; in a step
 * of one token a sequence (batched decode, where it measured slower) none do. */
Test(fusion, rule_9_by_default_folds_the_norms_of_verify_steps_and_not_of_batched_decode)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    r.all_logits = true;
    const int n_layers = r.model->config.n_layers;
    struct cu_fuse_config always = skinny_config(), spans = skinny_config();
    always.norm_sums = true;
    spans.norm_sums_spans = true;
    cr_expect_eq(sums_launches(&r, &spans, 1, 5), 2 * n_layers, "a 5-token verify span");
    cr_expect_eq(sums_launches(&r, &spans, 1, 5), sums_launches(&r, &always, 1, 5));
    cr_expect_eq(sums_launches(&r, &spans, 3, 2), 2 * n_layers, "3 sequences of 2 tokens");
    cr_expect_eq(sums_launches(&r, &spans, 5, 1), 0, "5 sequences decoding");
    cr_expect_eq(sums_launches(&r, &always, 5, 1), 2 * n_layers, "5 sequences, rule 9 on");
    rig_close(&r);
}

/* cuda_gemm_f32 (Whisper's backend): an f32 matmul of more rows than the GEMV kernels take goes
 * to cuBLASLt in either mode; without it, or with few rows, it stays on the GEMV kernels. */
Test(fusion, f32_matmuls_of_many_rows_go_to_cublaslt_only_when_gemm_f32_is_on)
{
    struct cu_op op;
    memset(&op, 0, sizeof op);
    op.kind = CU_MATMUL;
    op.u.mm.dtype = DTYPE_F32;
    op.u.mm.cols = 512;
    op.u.mm.n = 1;
    op.u.mm.m[0].rows = 512;
    const struct cu_fuse_config *modes[2] = {&fast_all, &exact_all};
    for (int mode = 0; mode < 2; mode++)
        for (int on = 0; on < 2; on++)
            for (int many = 0; many < 2; many++) {
                struct cu_fuse_config cfg = *modes[mode];
                cfg.gemm_f32 = on;
                op.n_rows = many ? 1500 : CU_GEMV_MAX_ROWS;
                struct cu_launch plan[2];
                cr_assert_eq(cu_fuse_plan(&cfg, &op, 1, plan, 2), 1);
                int want = on && many ? CU_LAUNCH_GEMM : CU_LAUNCH_GEMV;
                cr_expect_eq(plan[0].kind, want, "%s mode, gemm_f32 %s, %d rows: launch kind %d",
                             mode ? "exact" : "fast", on ? "on" : "off", op.n_rows,
                             (int)plan[0].kind);
            }
}

/* The planner only reads the op list: an op list that is not a known kind is refused. */
Test(fusion, an_unknown_op_kind_is_refused)
{
    struct cu_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].kind = CU_ADD;
    ops[0].u.ew.n = 4;
    ops[1].kind = 99;
    struct cu_launch plan[4];
    cr_expect_eq(cu_fuse_plan(&fast_all, ops, 1, plan, 4), 1);
    cr_expect_eq(cu_fuse_plan(&fast_all, ops, 2, plan, 4), -1);
}

/* The tensor-core decode attention (decode_mma) takes steps of more than
 * CU_GEMV_MAX_ROWS rows over an f16 cache, the q/k launch before it folded in
 * as into the flash-decoding kernel; fewer rows, and exact mode, stay on that one. */
Test(fusion, decode_attention_of_many_rows_on_tensor_cores_takes_the_qk_launch_in_too)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    cr_assert_eq(r.model->config.head_dim % 64, 0, "a head dim the tensor-core kernel takes");
    struct cu_fuse_config mma = fast_all;
    mma.decode_mma = true;
    mma.skinny_max_rows = CU_SKINNY_MAX_ROWS;
    int n_ops = 0;
    const struct cu_op *ops = rig_step(&r, CU_ATTN_MMA_MIN_ROWS, 1, &n_ops);
    int n_attn = 0;
    for (int i = 0; i < n_ops; i++)
        if (ops[i].kind == CU_ATTENTION) {
            cr_expect(cu_attention_uses_mma(&ops[i]), "op %d: a decode of %d rows", i,
                      ops[i].n_rows);
            n_attn++;
        }
    cr_assert_gt(n_attn, 0);
    check_step(&r, "tiny-qwen3, 9 sequences decoding, tensor-core attention", &mma,
               CU_ATTN_MMA_MIN_ROWS, 1,
               "rmsnorm gemmx3 qk_norm+rope_qk+kv_store+attention gemm add rmsnorm gemmx2 "
               "silu_mul gemm add",
               10, "rmsnorm gemm");
    check_step(&r, "tiny-qwen3, 9 sequences decoding, flash-decoding attention", &fast_all,
               CU_ATTN_MMA_MIN_ROWS, 1,
               "rmsnorm gemmx3 qk_norm+rope_qk+kv_store+attention gemm add rmsnorm gemmx2 "
               "silu_mul gemm add",
               10, "rmsnorm gemm");
    ops = rig_step(&r, CU_GEMV_MAX_ROWS, 1, &n_ops);
    for (int i = 0; i < n_ops; i++)
        if (ops[i].kind == CU_ATTENTION)
            cr_expect(!cu_attention_uses_mma(&ops[i]), "op %d: a decode of %d rows", i,
                      ops[i].n_rows);
    rig_close(&r);
    rig_open(&r, "tiny-qwen3", COMPUTE_EXACT);
    ops = rig_step(&r, CU_ATTN_MMA_MIN_ROWS, 1, &n_ops);
    for (int i = 0; i < n_ops; i++)
        if (ops[i].kind == CU_ATTENTION)
            cr_expect(!cu_attention_uses_mma(&ops[i]), "exact mode, op %d", i);
    rig_close(&r);
}

/* The batched tile GEMM (batch_max_rows): fast-mode bf16 matmuls of
 * CU_SKINNY_MAX_ROWS + 1 .. CU_BATCH_MAX_ROWS rows run on it with the GEMV
 * launches' epilogues, the LM head too; with the tensor-core decode
 * attention on as well, a 9-sequence step is the backend's default plan.
 * More rows, rows of a length not a multiple of 8 and unaligned operands go
 * to cuBLASLt. */
Test(fusion, fast_matmuls_of_9_to_64_rows_run_on_the_batched_tile_gemm)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    struct cu_fuse_config batch = fast_all;
    batch.skinny_max_rows = CU_SKINNY_MAX_ROWS;
    batch.batch_max_rows = CU_BATCH_MAX_ROWS;
    batch.decode_mma = true;
    check_step(&r, "tiny-qwen3, 9 sequences decoding", &batch, CU_ATTN_MMA_MIN_ROWS, 1,
               "rmsnorm skinnyx3 qk_norm+rope_qk+kv_store+attention skinny+add rmsnorm "
               "skinnyx2+swiglu skinny+add",
               7, "rmsnorm skinny");
    rig_close(&r);
    static const struct mm_limit cases[] = {
        {CU_SKINNY_MAX_ROWS + 1, 208, 0, 0, CU_LAUNCH_GEMV, true},
        {CU_BATCH_MAX_ROWS, 208, 0, 0, CU_LAUNCH_GEMV, true},
        {CU_BATCH_MAX_ROWS + 1, 208, 0, 0, CU_LAUNCH_GEMM, false},
        {20, 204, 0, 0, CU_LAUNCH_GEMV, false}, /* the GEMV kernels, as at fewer rows */
        {20, 208, 1, 0, CU_LAUNCH_GEMM, false},
        {20, 208, 0, 4, CU_LAUNCH_GEMM, false},
    };
    expect_matmul_plans(&batch, cases, sizeof cases / sizeof cases[0]);
}

/* Rule 2 on block-quantized weights (qgemv_norm): an RMSNorm before a FAST
 * Q4_K or Q8_0 GEMV is folded into it (the stream kernel, or the int8 path's
 * quantize launch, normalises x while it quantizes it); before Q6_K, with
 * qgemv_norm off, or with more rows than the GEMV kernels take, the norm
 * stays a launch of its own. */
Test(fusion, an_rmsnorm_before_a_q4_k_or_q8_0_gemv_folds_into_its_int8_path)
{
    static _Alignas(16) float x[16 * 512], y[16 * 512], nw[512];
    static _Alignas(16) uint8_t w[64 * 288];
    struct cu_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].kind = CU_RMSNORM;
    ops[0].u.norm.x = x;
    ops[0].u.norm.y = y;
    ops[0].u.norm.w = nw;
    ops[0].u.norm.dim = 512;
    ops[1].kind = CU_MATMUL;
    ops[1].u.mm.x = y;
    ops[1].u.mm.cols = 512;
    ops[1].u.mm.n = 1;
    ops[1].u.mm.m[0].rows = 64;
    ops[1].u.mm.m[0].w = w;
    struct {
        enum dtype dtype;
        bool qgemv_norm;
        int rows, launches;
    } cases[] = {
        {DTYPE_Q4_K, true, 1, 1},  {DTYPE_Q4_K, true, CU_GEMV_MAX_ROWS, 1},
        {DTYPE_Q4_K, false, 1, 2}, {DTYPE_Q4_K, true, CU_GEMV_MAX_ROWS + 1, 2},
        {DTYPE_Q6_K, true, 1, 2},  {DTYPE_Q8_0, true, 1, 1},
        {DTYPE_Q8_0, true, CU_GEMV_MAX_ROWS, 1}, {DTYPE_Q8_0, false, 1, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cu_fuse_config cfg = fast_all;
        cfg.qgemv_norm = cases[i].qgemv_norm;
        ops[0].u.norm.n_rows = ops[0].n_rows = ops[1].n_rows = cases[i].rows;
        ops[1].u.mm.dtype = cases[i].dtype;
        struct cu_launch plan[2];
        int n = cu_fuse_plan(&cfg, ops, 2, plan, 2);
        cr_expect_eq(n, cases[i].launches, "%s, %d rows, qgemv_norm %d: %d launches",
                     dtype_name(cases[i].dtype), cases[i].rows, (int)cases[i].qgemv_norm, n);
        if (n == 1)
            cr_expect(plan[0].kind == CU_LAUNCH_GEMV && plan[0].norm, "one GEMV with the norm");
    }
    struct cu_fuse_config exact = exact_all;
    exact.qgemv_norm = true;
    ops[0].u.norm.n_rows = ops[0].n_rows = ops[1].n_rows = 1;
    ops[1].u.mm.dtype = DTYPE_Q4_K;
    struct cu_launch plan[2];
    cr_expect_eq(cu_fuse_plan(&exact, ops, 2, plan, 2), 2, "EXACT mode keeps the norm apart");
}

/* Rule 3's mix (qgemv_mixed): a FAST Q4_K GEMV takes the Q6_K matmul right
 * after it over the same x (Q4_K_M's q and k, then v) into one launch, or the
 * other way round, with the norm before them folded in too; not when the
 * second one has an epilogue of its own, reads another x, has another width,
 * is of the same type, in EXACT mode, or with the switch off. */
Test(fusion, a_q4_k_gemv_and_the_q6_k_one_after_it_over_one_x_are_one_launch)
{
    static _Alignas(16) float x[2048], xn[2048], nw[2048], y[3][512], res[512], other[2048];
    static _Alignas(16) uint8_t w[3][64 * 210];
    struct cu_op ops[4];
    const struct cu_fuse_config mixed = {.fast = true, .norm_gemv = true, .qgemv_norm = true,
                                         .qgemv_mixed = true, .gemv_max_rows = CU_GEMV_MAX_ROWS};
    struct {
        const char *what;
        bool norm, residual, exact, off, same_type, other_x, other_cols, q6_first;
        int launches;
    } cases[] = {
        {"q/k then v", false, false, false, false, false, false, false, false, 1},
        {"Q6_K first, then Q4_K", false, false, false, false, false, false, false, true, 1},
        {"the norm, q/k then v", true, false, false, false, false, false, false, false, 1},
        {"v with a residual add", false, true, false, false, false, false, false, false, 2},
        {"EXACT mode", false, false, true, false, false, false, false, false, 2},
        {"the switch off", true, false, false, true, false, false, false, false, 2},
        {"one type", false, false, false, false, true, false, false, false, 2},
        {"another x", false, false, false, false, false, true, false, false, 2},
        {"another width", false, false, false, false, false, false, true, false, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(ops, 0, sizeof ops);
        int n = 0;
        const float *mx = cases[i].norm ? xn : x;
        if (cases[i].norm) {
            ops[n].kind = CU_RMSNORM;
            ops[n].n_rows = 1;
            ops[n].u.norm.x = x;
            ops[n].u.norm.w = nw;
            ops[n].u.norm.y = xn;
            ops[n].u.norm.n_rows = 1;
            ops[n].u.norm.dim = 2048;
            ops[n].u.norm.eps = 1e-5f;
            n++;
        }
        struct cu_op *qk = &ops[n++], *v = &ops[n++];
        qk->kind = v->kind = CU_MATMUL;
        qk->n_rows = v->n_rows = 1;
        qk->u.mm.x = mx;
        qk->u.mm.cols = 2048;
        qk->u.mm.dtype = cases[i].q6_first ? DTYPE_Q6_K : DTYPE_Q4_K;
        qk->u.mm.n = 2;
        for (int k = 0; k < 2; k++)
            qk->u.mm.m[k] = (struct cu_mat){.w = w[k], .rows = 64, .y = y[k]};
        v->u.mm.x = cases[i].other_x ? other : mx;
        v->u.mm.cols = cases[i].other_cols ? 1024 : 2048;
        v->u.mm.dtype = cases[i].same_type || cases[i].q6_first ? DTYPE_Q4_K : DTYPE_Q6_K;
        v->u.mm.n = 1;
        v->u.mm.m[0] = (struct cu_mat){.w = w[2], .rows = 64, .y = y[2]};
        if (cases[i].residual) {
            ops[n].kind = CU_ADD;
            ops[n].n_rows = 1;
            ops[n].u.ew.a = y[2];
            ops[n].u.ew.b = res;
            ops[n].u.ew.out = res;
            ops[n].u.ew.n = 64;
            n++;
        }
        struct cu_fuse_config cfg = mixed;
        cfg.fast = !cases[i].exact;
        cfg.qgemv_mixed = !cases[i].off;
        struct cu_launch plan[4];
        int got = cu_fuse_plan(&cfg, ops, n, plan, 4);
        cr_expect_eq(got, cases[i].launches, "%s: %d launches", cases[i].what, got);
        if (cases[i].launches == 1) {
            cr_expect(plan[0].kind == CU_LAUNCH_GEMV && plan[0].mixed, "%s: one mixed GEMV",
                      cases[i].what);
            cr_expect_eq(plan[0].norm, cases[i].norm, "%s: the norm folded", cases[i].what);
            cr_expect_eq(plan[0].n_ops, n, "%s: every op covered", cases[i].what);
        } else {
            cr_expect(!plan[0].mixed, "%s", cases[i].what);
        }
    }
}

/* A matmul group records each run of consecutive matrices of one type as one
 * op (one launch reading x once): Q4_K_M's q and k together and v (Q6_K)
 * apart; all of one type, one op; no two matrices of a type apart, two ops. */
Test(fusion, a_matmul_group_is_one_op_per_run_of_one_weight_type)
{
    struct backend *be = recorder_create(COMPUTE_FAST);
    struct rec_backend *rb = rb_of(be);
    static _Alignas(16) float x[256], y[3][64];
    static _Alignas(16) uint8_t w[3][64 * 210];
    struct {
        enum dtype types[3];
        int n_ops, first_n;
    } cases[] = {
        {{DTYPE_Q4_K, DTYPE_Q4_K, DTYPE_Q6_K}, 2, 2},
        {{DTYPE_Q4_K, DTYPE_Q4_K, DTYPE_Q4_K}, 1, 3},
        {{DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q4_K}, 3, 1},
        {{DTYPE_Q6_K, DTYPE_Q4_K, DTYPE_Q4_K}, 2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct weight_matrix m[3];
        const struct weight_matrix *ws[3];
        float *ys[3];
        for (int k = 0; k < 3; k++) {
            m[k] = (struct weight_matrix){.dtype = cases[i].types[k], .rows = 64, .cols = 256,
                                          .data = w[k]};
            ws[k] = &m[k];
            ys[k] = y[k];
        }
        be->ops->matmul_group(be, x, 1, 3, ws, NULL, ys);
        cr_assert_eq(rb->rec.n_ops, cases[i].n_ops, "case %zu: %d ops", i, rb->rec.n_ops);
        cr_expect_eq(rb->rec.ops[0].u.mm.n, cases[i].first_n, "case %zu", i);
        int total = 0;
        for (int k = 0; k < rb->rec.n_ops; k++) {
            const struct cu_op *op = &rb->rec.ops[k];
            cr_expect_eq(op->kind, CU_MATMUL);
            for (int j = 0; j < op->u.mm.n; j++, total++) {
                cr_expect_eq(op->u.mm.m[j].w, m[total].data, "case %zu: matrix %d in order", i, total);
                cr_expect_eq(op->u.mm.m[j].y, ys[total]);
                cr_expect_eq(op->u.mm.dtype, m[total].dtype);
            }
        }
        cr_expect_eq(total, 3);
        cu_rec_clear(&rb->rec);
    }
    be->ops->destroy(be);
}

/* Rule 5's adapter groups: lora ops right after one another over the same x
 * are one launch, up to CU_LORA_MAX_GROUP of them, each writing its own y;
 * another x, or a y already written in the group, starts a new launch. */
Test(fusion, lora_ops_over_one_x_are_one_launch)
{
    float x1[1], x2[1], y[CU_LORA_MAX_GROUP + 2][1];
    struct cu_op ops[CU_LORA_MAX_GROUP + 4];
    memset(ops, 0, sizeof ops);
    int n = 0;
    for (int i = 0; i < CU_LORA_MAX_GROUP + 1; i++, n++) /* a full group, then one more */
        ops[n] = (struct cu_op){.kind = CU_LORA, .n_rows = 4,
                                .u.lora = {.x = x1, .y = y[i], .in = 64, .out = 32, .n_segs = 1}};
    ops[n++] = (struct cu_op){.kind = CU_LORA, .n_rows = 4,
                              .u.lora = {.x = x2, .y = y[0], .in = 64, .out = 32, .n_segs = 1}};
    ops[n++] = (struct cu_op){.kind = CU_LORA, .n_rows = 4,
                              .u.lora = {.x = x2, .y = y[0], .in = 64, .out = 32, .n_segs = 1}};
    ops[n++] = (struct cu_op){.kind = CU_ADD, .n_rows = 4, .u.ew.n = 4};
    struct cu_launch plan[16];
    cr_assert_eq(cu_fuse_plan(&fast_all, ops, n, plan, 16), 5);
    int want[5] = {CU_LORA_MAX_GROUP, 1, 1, 1, 1};
    for (int i = 0; i < 5; i++)
        cr_expect_eq(plan[i].n_ops, want[i], "launch %d covers %d ops, not %d", i,
                     plan[i].n_ops, want[i]);
    cr_expect_eq(plan[0].kind, CU_LAUNCH_LORA);
    cr_expect_eq(plan[3].kind, CU_LAUNCH_LORA);
    cr_expect_eq(plan[4].kind, CU_LAUNCH_ADD);
}

/* A Llama layer's ops at 16 rows with an adapter on every projection (the shapes
 * scaled down), as the forward pass records them. */
struct adapter_layer {
    float res[1], xn[1], q[1], k[1], v[1], attn[1], proj[1], gate[1], up[1];
    struct cu_op ops[18];
};

static struct cu_op lora_op(const float *x, float *y, int64_t in, int64_t out)
{
    return (struct cu_op){.kind = CU_LORA, .n_rows = 16,
                          .u.lora = {.x = x, .y = y, .in = in, .out = out, .n_segs = 2,
                                     .u_floats = 256, .rank_max = 16, .rank_sum = 32,
                                     .rows_ok = 1}};
}

static struct cu_op matmul_op(const float *x, int64_t cols, int n, float *y0, float *y1,
                              float *y2, int64_t rows)
{
    struct cu_op op = {.kind = CU_MATMUL, .n_rows = 16,
                       .u.mm = {.x = x, .cols = cols, .dtype = DTYPE_BF16, .n = n}};
    float *ys[3] = {y0, y1, y2};
    for (int i = 0; i < n; i++)
        op.u.mm.m[i] = (struct cu_mat){.w = ys[i], .rows = rows, .y = ys[i]};
    return op;
}

static void adapter_layer_init(struct adapter_layer *L)
{
    struct cu_op *o = L->ops;
    const int64_t hidden = 64, inter = 128, n = 16;
    o[0] = (struct cu_op){.kind = CU_RMSNORM, .n_rows = 16,
                          .u.norm = {.x = L->res, .y = L->xn, .n_rows = n, .dim = hidden}};
    o[1] = matmul_op(L->xn, hidden, 3, L->q, L->k, L->v, hidden);
    o[2] = lora_op(L->xn, L->q, hidden, hidden);
    o[3] = lora_op(L->xn, L->k, hidden, hidden);
    o[4] = lora_op(L->xn, L->v, hidden, hidden);
    o[5] = (struct cu_op){.kind = CU_SCALE, .n_rows = 16}; /* stands for the attention */
    o[6] = matmul_op(L->attn, hidden, 1, L->proj, NULL, NULL, hidden);
    o[7] = lora_op(L->attn, L->proj, hidden, hidden);
    o[8] = (struct cu_op){.kind = CU_ADD, .n_rows = 16,
                          .u.ew = {.a = L->proj, .out = L->res, .n = n * hidden}};
    o[9] = o[0];
    o[10] = matmul_op(L->xn, hidden, 2, L->gate, L->up, NULL, inter);
    o[11] = lora_op(L->xn, L->gate, hidden, inter);
    o[12] = lora_op(L->xn, L->up, hidden, inter);
    o[13] = (struct cu_op){.kind = CU_SILU_MUL, .n_rows = 16,
                           .u.ew = {.a = L->gate, .b = L->up, .out = L->gate, .n = n * inter}};
    o[14] = matmul_op(L->gate, inter, 1, L->proj, NULL, NULL, hidden);
    o[15] = lora_op(L->gate, L->proj, inter, hidden);
    o[16] = o[8];
    o[17] = o[0];
}

/* Rule 7: each lora group's shrink runs in the launch that writes its x (the RMSNorms,
 * the SiLU-mul), o_proj's and down_proj's expands in the add-and-RMSNorm after them,
 * gate/up's in the SiLU-mul; q/k/v keep an expand launch and o_proj its shrink (in
 * the add-and-RMSNorm's launch). Without rule 7, or with an op the row kernels cannot
 * read, rule 5's launches. */
Test(fusion, adapters_fold_into_the_row_launches)
{
    static struct adapter_layer L;
    adapter_layer_init(&L);
    struct cu_fuse_config cfg = fast_all;
    cfg.add_norm = true;
    const struct cu_fuse_config rule5 = cfg;
    cfg.lora_rows = true;
    cfg.lora_rows_smem = 200 * 1024;
    struct cu_launch plan[32];
    cr_assert_eq(cu_fuse_plan(&cfg, L.ops, 18, plan, 32), 10);
    const struct {
        int kind, op, n_ops, lora_in, shrunk, lora_out, lora_out_op;
    } want[10] = {
        {CU_LAUNCH_RMSNORM, 0, 1, 0, 0, 3, 2},      {CU_LAUNCH_GEMM, 1, 1, 0, 0, 0, 0},
        {CU_LAUNCH_LORA, 2, 3, 0, 1, 0, 0},         {CU_LAUNCH_SCALE, 5, 1, 0, 0, 0, 0},
        {CU_LAUNCH_GEMM, 6, 1, 0, 0, 0, 0},         {CU_LAUNCH_ADD_RMSNORM, 7, 3, 1, 0, 2, 11},
        {CU_LAUNCH_GEMM, 10, 1, 0, 0, 0, 0},        {CU_LAUNCH_SILU_MUL, 11, 3, 2, 1, 1, 15},
        {CU_LAUNCH_GEMM, 14, 1, 0, 0, 0, 0},        {CU_LAUNCH_ADD_RMSNORM, 15, 3, 1, 1, 0, 0},
    };
    for (int i = 0; i < 10; i++) {
        const struct cu_launch *l = &plan[i];
        cr_expect(l->kind == want[i].kind && l->op == want[i].op && l->n_ops == want[i].n_ops &&
                      l->lora_in == want[i].lora_in && l->lora_in_shrunk == want[i].shrunk &&
                      l->lora_out == want[i].lora_out &&
                      (l->lora_out == 0 || l->lora_out_op == want[i].lora_out_op),
                  "launch %d: kind %d ops [%d, +%d) in %d shrunk %d out %d at %d", i, l->kind,
                  l->op, l->n_ops, l->lora_in, l->lora_in_shrunk, l->lora_out, l->lora_out_op);
    }

    /* rule 5 alone: a launch for each group, the adds and norms as rule 4 has them */
    cr_expect_eq(cu_fuse_plan(&rule5, L.ops, 18, plan, 32), 13);
    for (int i = 0; i < 13; i++)
        cr_expect(plan[i].lora_in == 0 && plan[i].lora_out == 0 && !plan[i].lora_in_shrunk);

    /* gate/up's adapters in f32: the norm before them keeps its shrink to itself, the
     * SiLU-mul runs alone, down_proj's group is still shrunk there */
    L.ops[11].u.lora.rows_ok = 0;
    int n = cu_fuse_plan(&cfg, L.ops, 18, plan, 32);
    cr_assert_eq(n, 11);
    cr_expect(plan[5].kind == CU_LAUNCH_ADD_RMSNORM && plan[5].lora_in == 1 &&
              plan[5].lora_out == 0);
    cr_expect(plan[7].kind == CU_LAUNCH_LORA && plan[7].n_ops == 2 && !plan[7].lora_in_shrunk);
    cr_expect(plan[8].kind == CU_LAUNCH_SILU_MUL && plan[8].lora_in == 0 &&
              plan[8].lora_out == 1 && plan[8].lora_out_op == 15);

    /* too little shared memory for a slice: rule 5 again */
    L.ops[11].u.lora.rows_ok = 1;
    cfg.lora_rows_smem = 64;
    cr_expect_eq(cu_fuse_plan(&cfg, L.ops, 18, plan, 32), 13);
}

/* ---- rules 6 and 10: outputs nobody reads in f32 ------------------------- */

/* The launches of a step that write their GEMM's x in bf16 only (x_bf16_only), and the
 * GEMMs that write bf16 gate/up products (y_bf16), each checked to be followed by the
 * SiLU-mul launch reading them. */
static void bf16_only_launches(struct rig *r, const struct cu_fuse_config *cfg, int n_seqs,
                               int n_tokens, int *x_only, int *y_bf16)
{
    int n_ops = 0;
    const struct cu_op *ops = rig_step(r, n_seqs, n_tokens, &n_ops);
    static struct cu_launch plan[MAX_LAUNCHES];
    int n = cu_fuse_plan(cfg, ops, n_ops, plan, MAX_LAUNCHES);
    cr_assert(n > 0 && n <= MAX_LAUNCHES);
    *x_only = *y_bf16 = 0;
    for (int k = 0; k < n; k++) {
        cr_assert(!plan[k].x_bf16_only || plan[k].to_gemm_x, "launch %d", k);
        *x_only += plan[k].x_bf16_only;
        if (!plan[k].y_bf16)
            continue;
        (*y_bf16)++;
        cr_assert(plan[k].kind == CU_LAUNCH_GEMM && k + 1 < n &&
                      plan[k + 1].kind == CU_LAUNCH_SILU_MUL && plan[k + 1].from_bf16 &&
                      plan[k + 1].x_bf16_only,
                  "launch %d writes bf16 products that no SiLU-mul right after it reads", k);
    }
    for (int k = 0; k < n; k++)
        cr_assert(!plan[k].from_bf16 || (k > 0 && plan[k - 1].y_bf16), "launch %d", k);
}

/* In a step of tiny-qwen3, each layer's two norms and its SwiGLU write their GEMM's x in
 * bf16 only: the next norm overwrites the first norm's output, the next layer's gate/up GEMM
 * the SwiGLU's; the last layer's second norm and SwiGLU keep their f32 outputs (nothing in
 * the step overwrites them: the host could read them). Rule 10 in every layer but the last. */
Test(fusion, outputs_read_only_in_bf16_are_written_only_in_bf16)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    const int n_layers = r.model->config.n_layers;
    struct cu_fuse_config on = fast_all;
    on.gemm_x = true;
    on.add_norm = true;
    on.gemm_bf16_swiglu = true;
    struct cu_fuse_config no_swiglu = on, no_gemm_x = on;
    no_swiglu.gemm_bf16_swiglu = false;
    no_gemm_x.gemm_x = false;
    const struct {
        int n_seqs, n_tokens;
    } shapes[] = {{1, PREFILL_TOKENS}, {9, 1}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        int x_only, y_bf16;
        bf16_only_launches(&r, &on, shapes[sh].n_seqs, shapes[sh].n_tokens, &x_only, &y_bf16);
        cr_expect_eq(x_only, 3 * n_layers - 2, "%d sequences of %d tokens", shapes[sh].n_seqs,
                     shapes[sh].n_tokens);
        cr_expect_eq(y_bf16, n_layers - 1);
        bf16_only_launches(&r, &no_swiglu, shapes[sh].n_seqs, shapes[sh].n_tokens, &x_only,
                           &y_bf16);
        cr_expect_eq(x_only, 3 * n_layers - 2);
        cr_expect_eq(y_bf16, 0);
        bf16_only_launches(&r, &no_gemm_x, shapes[sh].n_seqs, shapes[sh].n_tokens, &x_only,
                           &y_bf16);
        cr_expect_eq(x_only + y_bf16, 0);
    }
    rig_close(&r);
}

/* Buffers of a synthetic step: rows x dim floats each, apart. */
enum { SYN_ROWS = 16, SYN_DIM = 64, SYN_BUFS = 8 };
static _Alignas(16) float syn_buf[SYN_BUFS][SYN_ROWS * SYN_DIM];
static _Alignas(16) uint16_t syn_w[SYN_DIM * SYN_DIM];
static _Alignas(16) float syn_norm_w[SYN_DIM];

static struct cu_op syn_norm(int x, int y, int rows)
{
    struct cu_op op = {.kind = CU_RMSNORM, .n_rows = rows};
    op.u.norm.x = syn_buf[x];
    op.u.norm.y = syn_buf[y];
    op.u.norm.w = syn_norm_w;
    op.u.norm.n_rows = rows;
    op.u.norm.dim = SYN_DIM;
    op.u.norm.eps = 1e-6f;
    return op;
}

/* A bf16 matmul of SYN_ROWS rows of x into n outputs (ys[i]), each SYN_DIM wide. */
static struct cu_op syn_matmul(int x, int n, const int *ys)
{
    struct cu_op op = {.kind = CU_MATMUL, .n_rows = SYN_ROWS};
    op.u.mm.x = syn_buf[x];
    op.u.mm.cols = SYN_DIM;
    op.u.mm.dtype = DTYPE_BF16;
    op.u.mm.n = n;
    for (int i = 0; i < n; i++)
        op.u.mm.m[i] = (struct cu_mat){.w = syn_w, .rows = SYN_DIM, .y = syn_buf[ys[i]]};
    return op;
}

static struct cu_op syn_ew(int kind, int a, int b, int out)
{
    struct cu_op op = {.kind = kind};
    op.u.ew.a = syn_buf[a];
    op.u.ew.b = b >= 0 ? syn_buf[b] : NULL;
    op.u.ew.out = syn_buf[out];
    op.u.ew.n = SYN_ROWS * SYN_DIM;
    return op;
}

static struct cu_launch syn_first(const struct cu_op *ops, int n)
{
    struct cu_fuse_config cfg = fast_all;
    cfg.gemm_x = true;
    cfg.gemm_bf16_swiglu = true;
    struct cu_launch plan[16];
    cr_assert(cu_fuse_plan(&cfg, ops, n, plan, 16) > 1);
    cr_assert(plan[0].kind == CU_LAUNCH_RMSNORM && plan[0].to_gemm_x && plan[1].kind == CU_LAUNCH_GEMM);
    return plan[0];
}

/* What makes a norm's f32 output dead after its GEMM: a later op that overwrites all of it
 * before any op reads any of it, within the step, through ops whose buffers are known. */
Test(fusion, an_output_is_dead_only_when_overwritten_before_any_read)
{
    const int q[1] = {2}, k[1] = {3};
    struct cu_op ops[6];
    /* 0: residual, 1: the norm's output, 2-3: products */
    ops[0] = syn_norm(0, 1, SYN_ROWS);
    ops[1] = syn_matmul(1, 1, q);
    cr_expect(!syn_first(ops, 2).x_bf16_only, "the step ends: the host may read it");
    ops[2] = syn_norm(0, 1, SYN_ROWS);
    cr_expect(syn_first(ops, 3).x_bf16_only, "the next norm overwrites it");
    ops[2] = syn_ew(CU_ADD, 1, -1, 0);
    ops[3] = syn_norm(0, 1, SYN_ROWS);
    cr_expect(!syn_first(ops, 4).x_bf16_only, "an add reads it first");
    ops[2] = syn_norm(0, 1, SYN_ROWS / 2);
    ops[3] = syn_matmul(1, 1, k);
    cr_expect(!syn_first(ops, 4).x_bf16_only, "half of it overwritten, then read");
    ops[2] = syn_matmul(0, 1, k);
    ops[3] = syn_norm(0, 1, SYN_ROWS);
    cr_expect(syn_first(ops, 4).x_bf16_only, "an op on other buffers, then overwritten");
    ops[2] = (struct cu_op){.kind = CU_MOE_ROUTE, .n_rows = SYN_ROWS};
    cr_expect(!syn_first(ops, 4).x_bf16_only, "an op whose buffers are not listed comes first");
    ops[2] = (struct cu_op){.kind = CU_ROPE, .n_rows = SYN_ROWS};
    ops[2].u.rope.x = syn_buf[1] + SYN_DIM;
    ops[2].u.rope.n_heads = 1;
    ops[2].u.rope.head_dim = SYN_DIM;
    cr_expect(!syn_first(ops, 4).x_bf16_only, "rows of it rotated in place");
}

/* Rule 10 in a synthetic step: gate/up GEMM, SiLU-mul into gate, down GEMM, then the next
 * gate/up GEMM overwriting both products; not when up is read before it is overwritten. */
Test(fusion, gate_and_up_in_bf16_only_where_the_swiglu_alone_reads_them)
{
    const int gu[2] = {2, 3}, down[1] = {4}, g_only[1] = {2};
    struct cu_op ops[6];
    ops[0] = syn_norm(0, 1, SYN_ROWS);
    ops[1] = syn_matmul(1, 2, gu);
    ops[2] = syn_ew(CU_SILU_MUL, 2, 3, 2);
    ops[3] = syn_matmul(2, 1, down);
    ops[4] = syn_matmul(1, 2, gu);
    struct cu_fuse_config cfg = fast_all;
    cfg.gemm_x = true;
    cfg.gemm_bf16_swiglu = true;
    struct cu_launch plan[16];
    cr_assert_eq(cu_fuse_plan(&cfg, ops, 5, plan, 16), 5);
    cr_expect(plan[1].y_bf16 && plan[2].from_bf16 && plan[2].x_bf16_only);
    ops[4] = syn_matmul(1, 1, g_only);
    ops[5] = syn_ew(CU_ADD, 3, -1, 0);
    cr_assert_eq(cu_fuse_plan(&cfg, ops, 6, plan, 16), 6);
    cr_expect(!plan[1].y_bf16 && !plan[2].from_bf16 && plan[2].x_bf16_only,
              "up is read after the SwiGLU: f32 products");
    ops[4] = syn_matmul(1, 2, gu);
    ops[0].u.norm.n_rows = SYN_ROWS; /* a bias on gate: no rule 10 */
    ops[1].u.mm.m[0].bias = syn_norm_w;
    cr_assert_eq(cu_fuse_plan(&cfg, ops, 5, plan, 16), 5);
    cr_expect(!plan[1].y_bf16 && !plan[2].from_bf16);
}

/* Rule 11: the o and down GEMMs add into the residual stream themselves, the norms after
 * them launched alone; not the last down GEMM, whose product nothing in the step overwrites
 * (the host could read it), nor with the rule off. */
Test(fusion, a_gemm_whose_product_only_the_residual_add_reads_adds_into_the_stream)
{
    struct rig r;
    rig_open(&r, "tiny-qwen3", COMPUTE_FAST);
    const int n_layers = r.model->config.n_layers;
    struct cu_fuse_config on = fast_all;
    on.add_norm = true;
    on.gemm_residual = true;
    static char layers[TEXT_CAP];
    snprintf(layers, sizeof layers, "%s",
             "rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm+add rmsnorm gemmx2 "
             "silu_mul gemm+add");
    for (int l = 1; l < n_layers; l++)
        snprintf(layers + strlen(layers), sizeof layers - strlen(layers), " | %s",
                 l + 1 < n_layers ? "rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm+add "
                                    "rmsnorm gemmx2 silu_mul gemm+add"
                                  : "rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm+add "
                                    "rmsnorm gemmx2 silu_mul gemm");
    check_step(&r, "tiny-qwen3, fast prefill, rule 11", &on, 1, PREFILL_TOKENS, layers,
               9 * n_layers, "add rmsnorm+gemv");
    on.gemm_residual = false;
    check_step(&r, "tiny-qwen3, fast prefill, rule 11 off", &on, 1, PREFILL_TOKENS,
               layers_text("rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm add+rmsnorm "
                           "gemmx2 silu_mul gemm",
                           "add+rmsnorm gemmx3 qk_norm+rope_qk+kv_store attention gemm "
                           "add+rmsnorm gemmx2 silu_mul gemm",
                           n_layers),
               9 * n_layers, "add rmsnorm+gemv");
    rig_close(&r);
}

/* The window_blocks of the one attention op recorded over cache kv for
 * spans. */
static int recorded_window_blocks(struct backend *be, const struct kv_cache *kv,
                                  const struct attn_span *spans, int n_spans, int n_heads)
{
    struct rec_backend *rb = rb_of(be);
    rb_attention(be, NULL, kv, 0, spans, n_spans, n_heads, 0.125f, 0, NULL);
    cr_assert(!rb->failed, "%s", rb->error.msg);
    cr_assert_eq(rb->rec.n_ops, 1, "one attention op recorded");
    const int blocks = rb->rec.ops[0].u.attn.window_blocks;
    cu_rec_clear(&rb->rec);
    return blocks;
}

/* A prefill over a quantized cache attends through an f16 window of every
 * block its spans' contexts reach; decode steps, EXACT mode, the switch off,
 * an f16 cache, head dims without an f16 prefill kernel and windows past
 * CU_QWINDOW_MAX_BYTES read the records directly. */
Test(fusion, a_quantized_prefill_attends_through_an_f16_window_of_its_spans_blocks)
{
    struct kv_quant q;
    bool on = false;
    struct err err = {0};
    cr_assert_eq(kv_quant_parse("turbo:k4v3", &q, &on, &err), 0, "%s", err.msg);
    static uint32_t ids[8192];
    for (uint32_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        ids[i] = i;
    struct kv_cache kv = {.dtype = DTYPE_F16, .n_layers = 1, .n_blocks = 8192, .block_size = 16,
                          .n_kv_heads = 8, .head_dim = 128, .quant = &q,
                          .k_row_bytes = 8 * 80, .v_row_bytes = 8 * 64};
    /* 40 new tokens after 100 (nine blocks), 33 from the start (three) */
    const struct attn_span two[] = {{0, 40, 100, ids, 16}, {40, 33, 0, ids + 16, 16}};
    const struct attn_span decode[] = {{0, 1, 100, ids, 16}, {1, 1, 7, ids + 16, 16}};
    /* 16,384 + 17 positions: 1,026 blocks, 64.1 MiB of K and V */
    const struct attn_span long_ctx[] = {{0, 17, 16384, ids, 1100}};
    const struct attn_span too_long[] = {{0, 64, 65536 - 64, ids, 4096},
                                         {64, 64, 1024, ids + 4096, 4096}};
    struct backend *fast = recorder_create(COMPUTE_FAST);
    cr_expect_eq(recorded_window_blocks(fast, &kv, two, 2, 32), 12);
    cr_expect_eq(recorded_window_blocks(fast, &kv, decode, 2, 32), 0, "decode rows");
    cr_expect_eq(recorded_window_blocks(fast, &kv, long_ctx, 1, 32), 1026);
    cr_expect_eq(recorded_window_blocks(fast, &kv, too_long, 2, 32), 0,
                 "64k + 1k positions: a 260.3 MiB window");
    struct kv_cache f16 = kv;
    f16.quant = NULL;
    f16.k_row_bytes = f16.v_row_bytes = 0;
    cr_expect_eq(recorded_window_blocks(fast, &f16, two, 2, 32), 0, "an f16 cache");
    struct kv_cache hd96 = kv;
    hd96.head_dim = 96;
    cr_expect_eq(recorded_window_blocks(fast, &hd96, two, 2, 24), 0, "head dim 96");
    rb_of(fast)->rec.qprefill_window = false;
    cr_expect_eq(recorded_window_blocks(fast, &kv, two, 2, 32), 0, "switched off");
    backend_destroy(fast);
    struct backend *exact = recorder_create(COMPUTE_EXACT);
    kv.dtype = DTYPE_F32;
    cr_expect_eq(recorded_window_blocks(exact, &kv, two, 2, 32), 0, "EXACT mode");
    backend_destroy(exact);
}
