/* backend/cuda/cuda_backend.cu — the CUDA backend's op table: memory, uploads, the recorded step's launch, cuBLASLt and CUDA-graph replay.
 *
 * Ops are not launched when called: each is recorded (record.h, with the
 * host arrays it was given copied into a pinned parameter arena) until
 * something needs its results on the host — to_host, to_device, release or
 * status — and the whole step is launched at once: the arena goes to the
 * device in one copy, neighbouring ops are fused as fuse.h plans them
 * (RMSNorm into the decode GEMV after it; q/k norm + RoPE + KV write, into
 * the decode attention after them when every sequence has one token; matmul
 * + residual add; gate/up matmul + SwiGLU), and a step of few rows is
 * replayed from a CUDA graph captured the first time the same op list was
 * seen. Decode steps differ only in the arena's
 * contents (token, position, block table), so one graph serves every step
 * until the context crosses a power of two. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/sample.h"

extern "C" {
#include "base/log.h"
#include "base/timer.h"
}

#define CU_LT_WORKSPACE ((size_t)32 << 20)
#define CU_ARENA_INITIAL ((size_t)1 << 20)
#define CU_ARENA_MAX ((size_t)64 << 20)
#define CU_UPLOAD_DIRECT ((size_t)1 << 20)
#define CU_UPLOAD_THREADS 4
#define CU_DOWNLOAD_MAX ((size_t)64 << 20)

static struct cu_impl *impl_of(struct backend *be) { return (struct cu_impl *)be->impl; }

/* ---- errors ------------------------------------------------------------- */

void cu_fail(struct cu_impl *im, int code, const char *fmt, ...)
{
    if (im->failed)
        return;
    im->failed = true;
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof im->error.msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(&im->error, code, "%s", msg);
    log_error("cuda: %s", msg);
}

bool cu_ok(struct cu_impl *im, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return true;
    if (e == cudaErrorMemoryAllocation)
        cu_fail(im, INFERD_ENOMEM, "out of GPU memory (%s)", what);
    else
        cu_fail(im, INFERD_EIO, "%s failed: %s", what, cudaGetErrorString(e));
    return false;
}

/* ---- cuBLASLt ------------------------------------------------------------ */

static void lt_plan_clear(struct cu_lt_plan *p)
{
    if (!p->used)
        return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = false;
}

/* GEMMs of at least LT_TUNE_ROWS rows try the heuristic's first
 * LT_CANDIDATES algorithms once, timed, and keep the fastest: on an H200 its
 * first pick was often not it (Llama-3.1-8B shape prefill, pp512 ~20k ->
 * 32k tok/s, pp4096 27.5k -> 32.5k). Timing loads each candidate's kernels,
 * tens of ms, so it happens once per (n, k, power-of-two bucket of rows):
 * other row counts of the bucket reuse the winner when cuBLASLt accepts it
 * for their shape. Decode-sized GEMMs gained nothing from it (64 sequences of
 * Llama-3.1-8B through the server, tuned from 9 rows: 6,097 against 6,346
 * tok/s). Nothing is timed while a graph is being captured. */
#define LT_TUNE_ROWS 256
#define LT_CANDIDATES 8

static int rows_bucket(int64_t t)
{
    int b = 0;
    while (t >> (b + 1))
        b++;
    return b;
}

/* The fastest of the found candidates for plan p, timed on its real operands
 * (y is overwritten); the first when there is one, when the stream is being
 * captured, or when timing fails. */
static cublasLtMatmulAlgo_t lt_fastest(struct cu_impl *im, const struct cu_lt_plan *p,
                                       const cublasLtMatmulHeuristicResult_t *res, int found,
                                       const void *w, const void *xb, void *y)
{
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (found < 2 || cudaStreamIsCapturing(im->stream, &cap) != cudaSuccess ||
        cap != cudaStreamCaptureStatusNone)
        return res[0].algo;
    cudaEvent_t ev[2];
    if (cudaEventCreate(&ev[0]) != cudaSuccess)
        return res[0].algo;
    if (cudaEventCreate(&ev[1]) != cudaSuccess) {
        cudaEventDestroy(ev[0]);
        return res[0].algo;
    }
    float alpha = 1.0f, beta = 0.0f, best_ms = 0;
    int best = 0;
    for (int i = 0; i < found; i++) {
        float ms = 0;
        bool ok = true;
        for (int rep = 0; rep < 2 && ok; rep++) /* the first run warms up */
            ok = cudaEventRecord(ev[0], im->stream) == cudaSuccess &&
                 cublasLtMatmul(im->lt, p->desc, &alpha, w, p->a, xb, p->b, &beta, y, p->c, y,
                                p->c, &res[i].algo, im->lt_workspace, im->lt_workspace_bytes,
                                im->stream) == CUBLAS_STATUS_SUCCESS &&
                 cudaEventRecord(ev[1], im->stream) == cudaSuccess &&
                 cudaEventSynchronize(ev[1]) == cudaSuccess &&
                 cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess;
        if (ok && (i == 0 || ms < best_ms)) {
            best = i;
            best_ms = ms;
        }
    }
    cudaGetLastError();
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    log_debug("cuda: GEMM %lld x %lld x %lld: cuBLASLt algorithm %d of %d is the fastest (%.3f ms)",
              (long long)p->t, (long long)p->n, (long long)p->k, best + 1, found, best_ms);
    return res[best].algo;
}

/* The algorithm for new plan p: the winner tuned for its bucket when cuBLASLt
 * takes it for this shape, else the heuristic's pick, timed among its
 * runners-up when p is large enough and its bucket has no winner yet. */
static cublasStatus_t lt_choose(struct cu_impl *im, struct cu_lt_plan *p,
                                cublasLtMatmulPreference_t pref, const void *w,
                                const void *xb, void *y)
{
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    bool capturing = cudaStreamIsCapturing(im->stream, &cap) != cudaSuccess ||
                     cap != cudaStreamCaptureStatusNone;
    bool tune = p->t >= LT_TUNE_ROWS;
    int bucket = rows_bucket(p->t);
    for (int i = 0; tune && i < CU_LT_TUNED_MAX; i++) {
        struct cu_lt_tuned *tu = &im->lt_tuned[i];
        if (!tu->used || tu->n != p->n || tu->k != p->k || tu->f32 != p->f32 ||
            tu->y_bf16 != p->y_bf16 || tu->bucket != bucket)
            continue;
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(im->lt, p->desc, p->a, p->b, p->c, p->c, &tu->algo, &check) ==
                CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= im->lt_workspace_bytes) {
            p->algo = tu->algo;
            return CUBLAS_STATUS_SUCCESS;
        }
        tune = false; /* the winner does not fit this shape: the heuristic decides */
    }
    cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        im->lt, p->desc, p->a, p->b, p->c, p->c, pref, tune && !capturing ? LT_CANDIDATES : 1, res,
        &found);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (found == 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!tune || capturing) { /* nothing is timed in a capture, nor kept as a winner */
        p->algo = res[0].algo;
        return CUBLAS_STATUS_SUCCESS;
    }
    p->algo = lt_fastest(im, p, res, found, w, xb, y);
    struct cu_lt_tuned *tu = &im->lt_tuned[im->lt_tuned_next];
    im->lt_tuned_next = (im->lt_tuned_next + 1) % CU_LT_TUNED_MAX;
    *tu = (struct cu_lt_tuned){.n = p->n,
                               .k = p->k,
                               .f32 = p->f32,
                               .y_bf16 = p->y_bf16,
                               .bucket = bucket,
                               .algo = p->algo,
                               .used = true};
    return CUBLAS_STATUS_SUCCESS;
}

/* y (t x n, f32, rows ldc floats apart; bf16 when y_bf16, rows ldc halves
 * apart) = x (t x k) * w (n x k)^T, x and w bf16, or both f32 when f32 (f32
 * arithmetic throughout, no TF32). In cuBLAS's column-major terms: C (n x t,
 * leading dimension ldc) = op(A) B with A = w stored k x n, op = T. With acc
 * (f32, as y) the products are added into acc instead (beta 1) and y, which
 * nobody reads, only serves the first timing of the shape's candidates. */
static bool lt_matmul(struct cu_impl *im, const void *x, bool f32, int64_t t, int64_t k,
                      const void *w, int64_t n, int64_t ldc, void *y, bool y_bf16, float *acc)
{
    const cudaDataType_t in_type = f32 ? CUDA_R_32F : CUDA_R_16BF;
    pthread_mutex_lock(&im->lt_lock);
    struct cu_lt_plan *p = NULL;
    for (int i = 0; i < CU_LT_CACHE; i++)
        if (im->lt_plans[i].used && im->lt_plans[i].n == n && im->lt_plans[i].k == k &&
            im->lt_plans[i].t == t && im->lt_plans[i].ldc == ldc && im->lt_plans[i].f32 == f32 &&
            im->lt_plans[i].y_bf16 == y_bf16)
            p = &im->lt_plans[i];
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!p) {
        p = &im->lt_plans[im->lt_next];
        im->lt_next = (im->lt_next + 1) % CU_LT_CACHE;
        lt_plan_clear(p);
        p->n = n;
        p->k = k;
        p->t = t;
        p->ldc = ldc;
        p->f32 = f32;
        p->y_bf16 = y_bf16;
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulPreference_t pref = NULL;
        size_t ws = im->lt_workspace_bytes;
        if ((st = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
            (st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
            (st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
            (st = cublasLtMatrixLayoutCreate(&p->a, in_type, (uint64_t)k, (uint64_t)n, k)) ||
            (st = cublasLtMatrixLayoutCreate(&p->b, in_type, (uint64_t)k, (uint64_t)t, k)) ||
            (st = cublasLtMatrixLayoutCreate(&p->c, y_bf16 ? CUDA_R_16BF : CUDA_R_32F,
                                             (uint64_t)n, (uint64_t)t, ldc)) ||
            (st = cublasLtMatmulPreferenceCreate(&pref)) ||
            (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &ws, sizeof ws)) ||
            (st = lt_choose(im, p, pref, w, x, y))) {
        }
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        p->used = true;
        if (st != CUBLAS_STATUS_SUCCESS) {
            lt_plan_clear(p);
            pthread_mutex_unlock(&im->lt_lock);
            cu_fail(im, INFERD_EIO, "cuBLASLt has no %s GEMM for %lld x %lld x %lld (status %d)",
                    f32 ? "f32" : "bf16", (long long)t, (long long)n, (long long)k, (int)st);
            return false;
        }
    }
    float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    void *out = acc ? (void *)acc : y;
    st = cublasLtMatmul(im->lt, p->desc, &alpha, w, p->a, x, p->b, &beta, out, p->c, out, p->c,
                        &p->algo, im->lt_workspace, im->lt_workspace_bytes, im->stream);
    pthread_mutex_unlock(&im->lt_lock);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cu_fail(im, INFERD_EIO, "cuBLASLt matmul failed (status %d)", (int)st);
        return false;
    }
    return true;
}

/* ---- graphs --------------------------------------------------------------- */

static void graph_clear(struct cu_graph_entry *g)
{
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    free(g->ops);
    memset(g, 0, sizeof *g);
}

static void graphs_clear(struct cu_impl *im)
{
    for (int i = 0; i < CU_GRAPH_CACHE; i++)
        graph_clear(&im->graphs[i]);
}

/* ---- the parameter arena ------------------------------------------------ */

static void flush(struct cu_impl *im);

static size_t pow2_at_least(size_t n, size_t min)
{
    size_t p = min;
    while (p < n)
        p *= 2;
    return p;
}

/* Replaces the arena by one of cap bytes, the recorded step's parameters
 * carried over (its ops refer to them by offset). */
static bool arena_resize(struct cu_impl *im, size_t cap)
{
    if (!CU_TRY(im, cudaStreamSynchronize(im->stream))) /* launched steps read the device arena */
        return false;
    im->arena_pending = false;
    graphs_clear(im); /* they read the old device arena */
    uint8_t *host = NULL;
    uint8_t *dev = NULL;
    if (!CU_TRY(im, cudaMallocHost((void **)&host, cap)) ||
        !CU_TRY(im, cudaMalloc((void **)&dev, cap))) {
        cudaFreeHost(host);
        return false;
    }
    if (im->rec.arena_used)
        memcpy(host, im->rec.arena, im->rec.arena_used);
    cudaFreeHost(im->rec.arena);
    cudaFree(im->arena_dev);
    im->rec.arena = host;
    im->arena_dev = dev;
    im->rec.arena_cap = cap;
    return true;
}

/* Makes room for `bytes` more arena bytes. The arena grows (up to
 * CU_ARENA_MAX) so that a whole step's parameters fit: a step launched in
 * parts is never replayed from a graph. Past that, the recorded step is
 * launched first (its ops refer to the current arena). */
static bool arena_ensure(struct cu_impl *im, size_t bytes)
{
    if (im->rec.arena_used == 0 && im->arena_pending) {
        /* the pinned arena may still be on its way to the device */
        if (!CU_TRY(im, cudaEventSynchronize(im->arena_free)))
            return false;
        im->arena_pending = false;
    }
    size_t need = im->rec.arena_used + bytes;
    if (need <= im->rec.arena_cap)
        return true;
    if (need > CU_ARENA_MAX) {
        flush(im);
        if (im->failed)
            return false;
        if (im->arena_pending) {
            if (!CU_TRY(im, cudaEventSynchronize(im->arena_free)))
                return false;
            im->arena_pending = false;
        }
        need = bytes;
        if (need <= im->rec.arena_cap)
            return true;
    }
    return arena_resize(im, pow2_at_least(need, im->rec.arena_cap));
}

/* Grows a device scratch buffer; graphs captured with the old one are
 * dropped. While recording, the ops already recorded are launched first
 * (they may use the old buffer); while launching (in_flush), the launches
 * so far only need to finish. */
static bool scratch_grow(struct cu_impl *im, void **buf, size_t *have, size_t need, bool in_flush)
{
    if (need <= *have)
        return true;
    if (!in_flush)
        flush(im);
    if (im->failed)
        return false;
    cudaStreamSynchronize(im->stream);
    graphs_clear(im);
    cudaFree(*buf);
    *buf = NULL;
    *have = 0;
    size_t bytes = pow2_at_least(need, (size_t)1 << 20);
    /* on the step's stream: the legacy stream does not order a non-blocking one */
    if (!CU_TRY(im, cudaMalloc(buf, bytes)) ||
        !CU_TRY(im, cudaMemsetAsync(*buf, 0, bytes, im->stream)))
        return false; /* zeroed: the split-attention counters start at 0 */
    *have = bytes;
    return true;
}

/* ---- recording (record.h) ---------------------------------------------------- */

static struct cu_impl *impl_of_rec(struct cu_rec *rec)
{
    return (struct cu_impl *)((char *)rec - offsetof(struct cu_impl, rec));
}

static bool rec_ok(struct cu_rec *rec)
{
    struct cu_impl *im = impl_of_rec(rec);
    if (im->profile == BACKEND_PROFILE_GRAPHS && rec->n_ops == 0 && !im->host.first_op)
        im->host.first_op = now_ns(); /* the step's first op */
    return !im->failed;
}

static void rec_fail(struct cu_rec *rec, int code, const char *msg)
{
    cu_fail(impl_of_rec(rec), code, "%s", msg);
}

static bool rec_arena_room(struct cu_rec *rec, size_t bytes)
{
    return arena_ensure(impl_of_rec(rec), bytes);
}

/* What a prefill window leaves free of the GPU's memory at least, for the
 * allocations of other steps (the KV pool may have taken the rest). */
#define QWINDOW_FREE_MARGIN ((size_t)256 << 20)

static bool rec_attn_scratch(struct cu_rec *rec, struct cu_op *probe)
{
    struct cu_impl *im = impl_of_rec(rec);
    size_t need = cu_attention_part_floats(probe) * sizeof(float);
    if (probe->kind == CU_ATTENTION && probe->u.attn.window_blocks > 0 &&
        need > im->attn_part_bytes) {
        size_t free_bytes = 0, total = 0;
        const size_t grown = pow2_at_least(need, (size_t)1 << 20);
        if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess ||
            grown + QWINDOW_FREE_MARGIN > free_bytes + im->attn_part_bytes) {
            (void)cudaGetLastError();
            probe->u.attn.window_blocks = 0;
            need = cu_attention_part_floats(probe) * sizeof(float);
        }
    }
    return scratch_grow(im, (void **)&im->attn_part, &im->attn_part_bytes, need, false);
}

static const struct cu_rec_hooks rec_hooks = {rec_ok, rec_fail, rec_arena_room, rec_attn_scratch};

static struct cu_rec *rec_of(struct backend *be) { return &impl_of(be)->rec; }

static void cu_embed(struct backend *be, const struct weight_matrix *table, const int32_t *tokens,
                     int64_t n_tokens, float *out)
{
    cu_rec_embed(rec_of(be), table, tokens, n_tokens, out);
}

static void cu_matmul(struct backend *be, const float *x, int64_t n_tokens,
                      const struct weight_matrix *w, const float *bias, float *y)
{
    cu_rec_matmul_group(rec_of(be), x, n_tokens, 1, &w, &bias, &y);
}

static void cu_matmul_group(struct backend *be, const float *x, int64_t n_tokens, int n,
                            const struct weight_matrix *const *w, const float *const *bias,
                            float *const *y)
{
    cu_rec_matmul_group(rec_of(be), x, n_tokens, n, w, bias, y);
}

static void cu_rmsnorm(struct backend *be, const float *x, const float *weight, int64_t n_rows,
                       int64_t dim, float eps, float *y)
{
    cu_rec_rmsnorm(rec_of(be), x, weight, n_rows, dim, eps, y);
}

static void cu_rope(struct backend *be, float *x, int64_t n_tokens, int n_heads, int head_dim,
                    const int32_t *positions, const struct rope_table *rope)
{
    cu_rec_rope(rec_of(be), x, n_tokens, n_heads, head_dim, positions, rope);
}

static void cu_silu_mul(struct backend *be, const float *gate, const float *up, float *out,
                        int64_t n)
{
    cu_rec_silu_mul(rec_of(be), gate, up, out, n);
}

static void cu_moe_route(struct backend *be, const float *logits, int64_t n_rows, int n_experts,
                         int top_k, bool norm, int32_t *ids, float *weights)
{
    cu_rec_moe_route(rec_of(be), logits, n_rows, n_experts, top_k, norm, ids, weights);
}

static void cu_moe_ffn(struct backend *be, const float *x, int64_t n_rows,
                       const struct moe_experts *ex, const int32_t *ids, const float *weights,
                       int top_k, float *scratch, float *y)
{
    cu_rec_moe_ffn(rec_of(be), x, n_rows, ex, ids, weights, top_k, scratch, y);
}

/* scratch goes unused: the launches keep u in the backend's own workspace, where the
 * ops one launch groups find theirs apart (lora_workspace) */
static void cu_lora(struct backend *be, const float *x, int64_t in, int64_t out,
                    const struct lora_seg *segs, int n_segs, float *scratch, float *y)
{
    (void)scratch;
    cu_rec_lora(rec_of(be), x, in, out, segs, n_segs, y);
}

static void cu_gated_add(struct backend *be, float *y, const float *x, const float *g,
                         int64_t n_rows, int64_t dim)
{
    cu_rec_gated_add(rec_of(be), y, x, g, n_rows, dim);
}

static void cu_add(struct backend *be, float *y, const float *x, int64_t n)
{
    cu_rec_add(rec_of(be), y, x, n);
}

static void cu_gelu_tanh_mul(struct backend *be, const float *gate, const float *up, float *out,
                             int64_t n)
{
    cu_rec_gelu_tanh_mul(rec_of(be), gate, up, out, n);
}

static void cu_scale(struct backend *be, float *x, int64_t n, float s)
{
    cu_rec_scale(rec_of(be), x, n, s);
}

static void cu_softcap(struct backend *be, float *x, int64_t n, float cap)
{
    cu_rec_softcap(rec_of(be), x, n, cap);
}

static void cu_kv_store(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                        const float *v, const struct attn_span *spans, int n_spans)
{
    cu_rec_kv_store(rec_of(be), kv, layer, k, v, spans, n_spans);
}

static void cu_attention(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                         const struct attn_span *spans, int n_spans, int n_heads, float scale,
                         int sliding_window, float *out)
{
    cu_rec_attention(rec_of(be), q, kv, layer, spans, n_spans, n_heads, scale, sliding_window,
                     out);
}

static void cu_kv_copy_slots(struct backend *be, struct kv_cache *kv, uint32_t src, uint32_t dst,
                             int n)
{
    cu_rec_kv_copy_slots(rec_of(be), kv, src, dst, n);
}

/* ---- execution ------------------------------------------------------------ */

/* Block-quantized weights in prefill: CU_DEQUANT_BYTES of a matrix's rows at
 * a time dequantized to bf16 (the CPU reference's values, rounded), each
 * slice one cuBLASLt GEMM into its columns of y. 64 MB holds every matrix of
 * a Llama-3.1-8B layer whole; an LM head takes a few slices. */
#define CU_DEQUANT_BYTES ((size_t)64 << 20)

static bool gemm_blocks(struct cu_impl *im, const struct cu_op *op, const struct cu_mat *m,
                        bool y_bf16, float *acc)
{
    int64_t k = op->u.mm.cols;
    int64_t slice = (int64_t)(CU_DEQUANT_BYTES / 2 / (size_t)k);
    slice = slice < 1 ? 1 : slice > m->rows ? m->rows : slice;
    if (!scratch_grow(im, (void **)&im->wb, &im->wb_bytes, (size_t)(slice * k) * 2, true))
        return false;
    uint64_t rb = dtype_row_bytes((enum dtype)op->u.mm.dtype, (uint64_t)k);
    for (int64_t r0 = 0; r0 < m->rows; r0 += slice) {
        int64_t n = m->rows - r0 < slice ? m->rows - r0 : slice;
        if (!CU_TRY(im, cu_launch_dequant_bf16(im->stream, op->u.mm.dtype,
                                               (const uint8_t *)m->w + (uint64_t)r0 * rb, n, k,
                                               im->wb)) ||
            !lt_matmul(im, im->xb, false, op->n_rows, k, im->wb, n, m->rows,
                       y_bf16 ? (void *)((uint16_t *)m->y + r0) : (void *)(m->y + r0), y_bf16,
                       acc ? acc + r0 : NULL))
            return false;
    }
    return true;
}

bool cu_xb_reserve(struct cu_impl *im, int64_t n)
{
    return scratch_grow(im, (void **)&im->xb, &im->xb_bytes, (size_t)n * 2, true);
}

/* Whether op's matmuls go to gemm_wgmma.cu instead of cuBLASLt: bf16 weights, FAST mode,
 * a shape it takes (9-128 rows), one matrix where the products are added into acc. */
static bool wgmma_gemm_takes(const struct cu_impl *im, const struct cu_op *op, const float *acc)
{
    return im->wgmma_gemm && op->u.mm.dtype == DTYPE_BF16 &&
           cu_gemm_wgmma_takes(op->n_rows, op->u.mm.cols) && op->u.mm.n >= 1 &&
           op->u.mm.n <= CU_WGMMA_GEMM_MAX_MATS && (!acc || op->u.mm.n == 1) &&
           ((uintptr_t)im->xb % 16) == 0;
}

/* op's matmuls in one launch of gemm_wgmma.cu over im->xb, then their biases. */
static bool exec_gemm_wgmma(struct cu_impl *im, const struct cu_op *op, bool y_bf16, float *acc)
{
    struct cu_wg_gemm g;
    memset(&g, 0, sizeof g);
    g.x = im->xb;
    g.t = (int)op->n_rows;
    g.k = (int)op->u.mm.cols;
    g.n_mat = op->u.mm.n;
    for (int i = 0; i < op->u.mm.n; i++)
        g.m[i] = op->u.mm.m[i];
    g.y_bf16 = y_bf16;
    g.acc = acc;
    g.work = im->wgmma_work;
    g.work_bytes = im->wgmma_work_bytes;
    if (!CU_TRY(im, cu_launch_gemm_wgmma(&im->dev, im->stream, &g)))
        return false;
    for (int i = 0; i < op->u.mm.n; i++) {
        const struct cu_mat *m = &op->u.mm.m[i];
        if (m->bias && !CU_TRY(im, cu_launch_bias_add(im->stream, m->y, m->bias, m->rows,
                                                      op->n_rows)))
            return false;
    }
    return true;
}

bool cu_exec_gemm(struct cu_impl *im, const struct cu_op *op, bool x_ready, bool y_bf16,
                  float *acc)
{
    const bool f32 = op->u.mm.dtype == DTYPE_F32; /* x as it is; else x in bf16 */
    int64_t n_x = (int64_t)op->n_rows * op->u.mm.cols;
    if (!f32 && !x_ready &&
        (!cu_xb_reserve(im, n_x) ||
         !CU_TRY(im, cu_launch_to_bf16(im->stream, op->u.mm.x, n_x, im->xb))))
        return false;
    bool blocks = dtype_is_block((enum dtype)op->u.mm.dtype);
    if (wgmma_gemm_takes(im, op, acc))
        return exec_gemm_wgmma(im, op, y_bf16, acc);
    for (int i = 0; i < op->u.mm.n; i++) {
        const struct cu_mat *m = &op->u.mm.m[i];
        if (blocks ? !gemm_blocks(im, op, m, y_bf16, acc)
                   : !lt_matmul(im, f32 ? (const void *)op->u.mm.x : (const void *)im->xb, f32,
                                op->n_rows, op->u.mm.cols, m->w, m->rows, m->rows, m->y, y_bf16,
                                acc))
            return false;
        if (m->bias && !CU_TRY(im, cu_launch_bias_add(im->stream, m->y, m->bias, m->rows,
                                                      op->n_rows)))
            return false;
    }
    return true;
}

enum prof_label {
    PL_EMBED, PL_GEMV, PL_GEMV_GROUP, PL_GEMV_RES, PL_GEMV_SWIGLU, PL_GEMM, PL_RMSNORM, PL_QK,
    PL_ROPE, PL_SILU, PL_ADD, PL_KV_STORE, PL_ATTN_DECODE, PL_ATTN_PREFILL, PL_NORM_GEMV,
    PL_QK_ATTN, PL_KV_COPY, PL_MOE_ROUTE, PL_MOE_FFN, PL_GATED_ADD, PL_GEMMA_EW, PL_LORA,
    PL_ENCDEC_EW, PL_ATTN_DENSE, PL_GEMM_SKINNY, PL_GEMM_BATCH, PL_ADD_RMSNORM, PL_LORA_ROWS,
    PL_GEMM_WGMMA, PL_N
};
static const char *const prof_names[PL_N] = {
    "embed", "gemv", "gemv group", "gemv + residual add", "gemv gate/up + swiglu",
    "cublasLt gemm", "rmsnorm", "q/k norm + rope + kv write", "rope", "silu_mul", "add",
    "kv_store", "attention decode", "attention prefill", "rmsnorm + gemv (+ epilogue)",
    "q/k prep + attention decode", "kv copy slots", "moe routing", "moe experts",
    "shared expert gate + add", "gelu_tanh_mul, scale, softcap", "lora shrink and expand",
    "layer_norm, gelu, scatter_rows", "attention dense (+ merge)",
    "skinny gemm, tensor cores (+ epilogue)", "batched tile gemm, tensor cores (+ epilogue)",
    "add + rmsnorm", "rmsnorm or silu_mul with lora expand/shrink",
    "warp-group gemm, 9-128 rows"};

static int prof_label_of(const struct cu_impl *im, const struct cu_op *ops,
                         const struct cu_launch *l)
{
    const struct cu_op *op = &ops[l->op];
    if (l->lora_in || l->lora_out)
        return PL_LORA_ROWS;
    switch (l->kind) {
    case CU_LAUNCH_EMBED: return PL_EMBED;
    case CU_LAUNCH_RMSNORM: return PL_RMSNORM;
    case CU_LAUNCH_ROPE: return PL_ROPE;
    case CU_LAUNCH_QK: return PL_QK;
    case CU_LAUNCH_QK_ATTENTION: return PL_QK_ATTN;
    case CU_LAUNCH_SILU_MUL: return PL_SILU;
    case CU_LAUNCH_ADD: return PL_ADD;
    case CU_LAUNCH_ADD_RMSNORM: return PL_ADD_RMSNORM;
    case CU_LAUNCH_KV_STORE: return PL_KV_STORE;
    case CU_LAUNCH_KV_COPY: return PL_KV_COPY;
    case CU_LAUNCH_MOE_ROUTE: return PL_MOE_ROUTE;
    case CU_LAUNCH_MOE_FFN: return PL_MOE_FFN;
    case CU_LAUNCH_GATED_ADD: return PL_GATED_ADD;
    case CU_LAUNCH_GELU_TANH_MUL:
    case CU_LAUNCH_SCALE:
    case CU_LAUNCH_SOFTCAP: return PL_GEMMA_EW;
    case CU_LAUNCH_LORA: return PL_LORA;
    case CU_LAUNCH_LAYER_NORM:
    case CU_LAUNCH_GELU:
    case CU_LAUNCH_SCATTER_ROWS: return PL_ENCDEC_EW;
    case CU_LAUNCH_ATTN_DENSE: return PL_ATTN_DENSE;
    case CU_LAUNCH_ATTENTION:
        return cu_attention_uses_prefill(op) ? PL_ATTN_PREFILL : PL_ATTN_DECODE;
    case CU_LAUNCH_GEMM:
        return wgmma_gemm_takes(im, op, l->residual ? ops[l->op + 1].u.ew.out : NULL)
                   ? PL_GEMM_WGMMA
                   : PL_GEMM;
    case CU_LAUNCH_GEMV:
        if (l->skinny)
            return op->n_rows > CU_SKINNY_MAX_ROWS ? PL_GEMM_BATCH : PL_GEMM_SKINNY;
        if (l->norm)
            return PL_NORM_GEMV;
        if (l->residual)
            return PL_GEMV_RES;
        if (l->swiglu)
            return PL_GEMV_SWIGLU;
        return op->u.mm.n > 1 ? PL_GEMV_GROUP : PL_GEMV;
    }
    return PL_EMBED;
}

/* The next launch of the step at ops[i] into l; false (recorded) for an op
 * of no known kind. */
static bool plan_next(struct cu_impl *im, const struct cu_op *ops, int i, int n,
                      struct cu_launch *l)
{
    if (cu_fuse_next(&im->fuse, ops, i, n, l) > 0) {
        im->planned_launches++;
        return true;
    }
    cu_fail(im, INFERD_EINVAL, "unknown recorded op %d", ops[i].kind);
    return false;
}

/* Whether ops (a step) prefill: some attention runs on the prefill kernels. */
static bool step_prefills(const struct cu_op *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (ops[i].kind == CU_ATTENTION && cu_attention_uses_prefill(&ops[i]))
            return true;
    return false;
}

/* Eager launches with an event pair around each, timed per kind of launch. */
static bool exec_ops_profiled(struct cu_impl *im, const struct cu_op *ops, int n)
{
    if (im->prof_ev_cap < 2 * n + 2) {
        int cap = 2 * n + 2;
        cudaEvent_t *ev = (cudaEvent_t *)realloc(im->prof_ev, (size_t)cap * sizeof *ev);
        if (!ev)
            return false;
        for (int i = im->prof_ev_cap; i < cap; i++)
            cudaEventCreate(&ev[i]);
        im->prof_ev = ev;
        im->prof_ev_cap = cap;
    }
    int labels[4096], n_launch = 0;
    cu_lora_slots_reset(im);
    for (int i = 0; i < n;) {
        struct cu_launch l;
        cudaEventRecord(im->prof_ev[2 * n_launch], im->stream);
        if (!plan_next(im, ops, i, n, &l) || !cu_exec_launch(im, ops, &l))
            return false;
        cudaEventRecord(im->prof_ev[2 * n_launch + 1], im->stream);
        if (n_launch < 4096)
            labels[n_launch++] = prof_label_of(im, ops, &l);
        i += l.n_ops;
    }
    cudaStreamSynchronize(im->stream);
    int cls = step_prefills(ops, n) ? 2 : n > 0 && ops[0].n_rows > 1 ? 1 : 0;
    for (int k = 0; k < n_launch; k++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, im->prof_ev[2 * k], im->prof_ev[2 * k + 1]);
        im->prof_ms[cls][labels[k]] += ms;
        im->prof_calls[cls][labels[k]]++;
    }
    im->prof_steps[cls]++;
    return true;
}

static void profile_report(struct cu_impl *im)
{
    if (!im->profile)
        return;
    log_info("cuda profile: %ld steps replayed from graphs, %ld graphs captured, %ld steps launched eagerly",
             im->graph_hits, im->graph_captures, im->steps_eager);
    if (im->replays_timed)
        log_info("cuda profile: replayed steps took %.1f us of GPU time each (%ld timed)",
                 1e3 * im->replay_ms / im->replays_timed, im->replays_timed);
    if (im->graph_captures)
        log_info("cuda profile: capturing and instantiating %ld graphs took %.2f ms of host time, "
                 "the longest %.2f ms (a capture that first launches kernels loads them)",
                 im->graph_captures, im->capture_ms, im->longest_capture_ms);
    const struct cu_step_times *h = &im->host;
    if (h->steps)
        log_info("cuda profile: per sampled step without prefill (%ld): %.1f us engine after the "
                 "last tokens, %.1f us recording, %.1f us launching (replays timed: includes "
                 "their GPU time), %.1f us host work before the picks, %.1f us sampling (of it "
                 "%.1f us waiting for GPU work queued before)",
                 h->steps, h->engine_us / h->steps, h->record_us / h->steps,
                 h->launch_us / h->steps, h->picks_us / h->steps, h->sample_us / h->steps,
                 h->sample_queued_us / h->steps);
    if (h->steps)
        log_info("cuda profile: of the launching: %.1f us from the flush to the graph's launch "
                 "(captures apart), %.1f us in cudaGraphLaunch, %.1f us waiting for its end",
                 h->replay_prep_us / h->steps, h->replay_call_us / h->steps,
                 h->replay_wait_us / h->steps);
    static const char *const classes[3] = {"one-row steps", "steps of several rows without prefill",
                                           "steps with prefill"};
    for (int cls = 0; cls < 3; cls++) {
        if (!im->prof_steps[cls])
            continue;
        double total = 0;
        for (int k = 0; k < PL_N; k++)
            total += im->prof_ms[cls][k];
        log_info("cuda profile: %s: %ld, %.1f us of launches each", classes[cls],
                 im->prof_steps[cls], 1e3 * total / im->prof_steps[cls]);
        for (int k = 0; k < PL_N; k++)
            if (im->prof_calls[cls][k])
                log_info("cuda profile:   %-38s %8ld launches %10.3f ms %9.2f us each",
                         prof_names[k], im->prof_calls[cls][k], im->prof_ms[cls][k],
                         1e3 * im->prof_ms[cls][k] / im->prof_calls[cls][k]);
    }
}

static bool exec_ops(struct cu_impl *im, const struct cu_op *ops, int n)
{
    cu_lora_slots_reset(im);
    for (int i = 0; i < n;) {
        struct cu_launch l;
        if (!plan_next(im, ops, i, n, &l) || !cu_exec_launch(im, ops, &l))
            return false;
        i += l.n_ops;
    }
    return true;
}

/* Which steps are replayed from graphs: decode steps of up to
 * CU_GEMV_MAX_ROWS rows always; larger steps without prefill attention (the
 * decode steps of many sequences, on cuBLASLt) once they repeat one of the
 * last CU_EAGER_RECENT eager steps or a captured one, so a one-off step is
 * never captured. */
enum step_graph { STEP_EAGER, STEP_GRAPH, STEP_GRAPH_IF_REPEATED };

static enum step_graph step_graphable(const struct cu_impl *im)
{
    if (!im->graphs_enabled || step_prefills(im->rec.ops, im->rec.n_ops))
        return STEP_EAGER;
    enum step_graph how = STEP_GRAPH;
    for (int i = 0; i < im->rec.n_ops; i++) {
        const struct cu_op *op = &im->rec.ops[i];
        /* a prefix-cache copy comes once per admission: not worth a graph */
        if (op->kind == CU_KV_COPY)
            return STEP_EAGER;
        /* norms and elementwise ops count heads or elements, not tokens */
        bool per_token = op->kind == CU_EMBED || op->kind == CU_MATMUL || op->kind == CU_ROPE ||
                         op->kind == CU_KV_STORE || op->kind == CU_ATTENTION ||
                         op->kind == CU_MOE_ROUTE || op->kind == CU_MOE_FFN ||
                         op->kind == CU_ATTN_DENSE || op->kind == CU_SCATTER_ROWS ||
                         op->kind == CU_LAYER_NORM;
        if ((per_token && op->n_rows > CU_GEMV_MAX_ROWS) || cu_fuse_uses_gemm(&im->fuse, op))
            how = STEP_GRAPH_IF_REPEATED;
    }
    return how;
}

static bool ops_equal(const struct cu_op *a, int n_a, size_t arena_a, const struct cu_op *b,
                      int n_b, size_t arena_b)
{
    return n_a == n_b && arena_a == arena_b && !memcmp(a, b, (size_t)n_a * sizeof *a);
}

/* The graph captured from an op list identical to the recorded step's, or NULL. */
static struct cu_graph_entry *graph_of_step(struct cu_impl *im)
{
    const struct cu_rec *rec = &im->rec;
    for (int i = 0; i < CU_GRAPH_CACHE; i++) {
        struct cu_graph_entry *g = &im->graphs[i];
        if (g->exec && ops_equal(g->ops, g->n_ops, g->arena_used, rec->ops, rec->n_ops,
                                 rec->arena_used))
            return g;
    }
    return NULL;
}

/* A digest of the recorded step's op list and parameter bytes used; never
 * 0. Only the choice to capture rests on it: a capture launches the ops. */
static uint64_t step_digest(const struct cu_rec *rec)
{
    const uint64_t prime = 0x100000001b3ull; /* FNV-1a over words */
    uint64_t h = (0xcbf29ce484222325ull ^ (uint64_t)rec->arena_used) * prime;
    h = (h ^ (uint64_t)rec->n_ops) * prime;
    const uint64_t *w = (const uint64_t *)rec->ops; /* ops are zeroed before they are filled */
    size_t n = (size_t)rec->n_ops * sizeof *rec->ops / sizeof *w;
    for (size_t i = 0; i < n; i++)
        h = (h ^ w[i]) * prime;
    return h ? h : 1;
}

/* Whether the recorded step repeats one of the last steps launched eagerly. */
static bool step_repeats_recent(const struct cu_impl *im, uint64_t digest)
{
    for (int i = 0; i < CU_EAGER_RECENT; i++)
        if (im->eager_recent[i] == digest)
            return true;
    return false;
}

static void remember_eager_step(struct cu_impl *im, uint64_t digest)
{
    im->eager_recent[im->eager_next] = digest;
    im->eager_next = (im->eager_next + 1) % CU_EAGER_RECENT;
}

/* Whether the recorded step is replayed from a graph; a step that could be
 * once it repeats is remembered (digest) when it is not. */
static bool graph_wanted(struct cu_impl *im, uint64_t *digest)
{
    *digest = 0;
    switch (step_graphable(im)) {
    case STEP_GRAPH:
        return true;
    case STEP_GRAPH_IF_REPEATED:
        if (graph_of_step(im))
            return true;
        *digest = step_digest(&im->rec);
        return step_repeats_recent(im, *digest);
    default:
        return false;
    }
}

/* Replays the graph captured from an identical op list, capturing it first. */
static bool run_graph(struct cu_impl *im)
{
    const struct cu_rec *rec = &im->rec;
    size_t ops_bytes = (size_t)rec->n_ops * sizeof(struct cu_op);
    struct cu_graph_entry *hit = graph_of_step(im), *victim = &im->graphs[0];
    uint64_t capture_ns = 0;
    for (int i = 0; !hit && i < CU_GRAPH_CACHE; i++) {
        struct cu_graph_entry *g = &im->graphs[i];
        if (!g->exec || (victim->exec && g->last_used < victim->last_used))
            victim = g;
    }
    if (!hit) {
        graph_clear(victim);
        victim->ops = (struct cu_op *)malloc(ops_bytes);
        if (!victim->ops) {
            cu_fail(im, INFERD_ENOMEM, "out of host memory for a CUDA graph");
            return false;
        }
        memcpy(victim->ops, rec->ops, ops_bytes);
        victim->n_ops = rec->n_ops;
        victim->arena_used = rec->arena_used;
        cudaGraph_t graph = NULL;
        uint64_t t_capture = now_ns();
        if (!CU_TRY(im, cudaStreamBeginCapture(im->stream, cudaStreamCaptureModeThreadLocal)))
            return false;
        bool ok = exec_ops(im, rec->ops, rec->n_ops);
        cudaError_t e = cudaStreamEndCapture(im->stream, &graph);
        if (!ok || !CU_TRY(im, e)) {
            if (graph)
                cudaGraphDestroy(graph);
            graph_clear(victim);
            return false;
        }
        e = cudaGraphInstantiate(&victim->exec, graph, 0);
        cudaGraphDestroy(graph);
        if (!CU_TRY(im, e)) {
            victim->exec = NULL;
            graph_clear(victim);
            return false;
        }
        hit = victim;
        capture_ns = now_ns() - t_capture;
        im->capture_ms += 1e-6 * (double)capture_ns;
        if (1e-6 * (double)capture_ns > im->longest_capture_ms)
            im->longest_capture_ms = 1e-6 * (double)capture_ns;
        im->graph_captures++;
    } else {
        im->graph_hits++;
    }
    hit->last_used = ++im->graph_clock;
    if (im->profile != BACKEND_PROFILE_GRAPHS)
        return CU_TRY(im, cudaGraphLaunch(hit->exec, im->stream));
    /* timed replay: the step's GPU time without the host's share of it */
    if (!im->replay_ev[0] && (!CU_TRY(im, cudaEventCreate(&im->replay_ev[0])) ||
                              !CU_TRY(im, cudaEventCreate(&im->replay_ev[1]))))
        return false;
    float ms = 0;
    uint64_t t_launch = now_ns(), t_launched = t_launch;
    bool ok = CU_TRY(im, cudaEventRecord(im->replay_ev[0], im->stream)) &&
              CU_TRY(im, cudaGraphLaunch(hit->exec, im->stream)) &&
              (t_launched = now_ns(), CU_TRY(im, cudaEventRecord(im->replay_ev[1], im->stream))) &&
              CU_TRY(im, cudaEventSynchronize(im->replay_ev[1])) &&
              CU_TRY(im, cudaEventElapsedTime(&ms, im->replay_ev[0], im->replay_ev[1]));
    if (im->host.flush_start && t_launch > im->host.flush_start + capture_ns) {
        im->host.replay_prep_ns = t_launch - im->host.flush_start - capture_ns;
        im->host.replay_call_ns = t_launched - t_launch;
        im->host.replay_wait_ns = now_ns() - t_launched;
    }
    im->replay_ms += ms;
    im->replays_timed++;
    return ok;
}

/* The int8 workspace of the step's block GEMVs (cu_gemv_args.xq), grown
 * before anything is launched or captured: a graph never allocates. */
static bool qgemv_workspace(struct cu_impl *im)
{
    if (!im->fuse.fast || !im->qgemv_int8)
        return true;
    size_t need = 0;
    for (int i = 0; i < im->rec.n_ops; i++) {
        const struct cu_op *op = &im->rec.ops[i];
        if (op->kind != CU_MATMUL)
            continue;
        size_t b = cu_qgemv_int8_bytes(op->u.mm.dtype, op->n_rows, op->u.mm.cols);
        need = b > need ? b : need;
    }
    return need == 0 || scratch_grow(im, &im->xq, &im->xq_bytes, need, true);
}

/* The split-K workspace of the step's batched tile GEMMs, grown (zeroed)
 * before anything is launched or captured. Sized for either reading of a
 * two-matrix op (a SwiGLU pair or a group), whichever the plan makes. */
static bool gemm_batch_workspace(struct cu_impl *im)
{
    if (!im->fuse.fast || im->fuse.batch_max_rows == 0)
        return true; /* off (the default): no walk over the step's ops */
    size_t need = 0;
    for (int i = 0; i < im->rec.n_ops; i++) {
        const struct cu_op *op = &im->rec.ops[i];
        if (!cu_fuse_uses_batch_gemm(&im->fuse, op))
            continue;
        struct cu_gemv_args a;
        memset(&a, 0, sizeof a);
        a.cols = op->u.mm.cols;
        a.n_rows = op->n_rows;
        a.n_mat = op->u.mm.n;
        for (int m = 0; m < op->u.mm.n; m++)
            a.m[m] = op->u.mm.m[m];
        for (int pair = 0; pair <= (a.n_mat == 2); pair++) {
            a.pair = pair;
            size_t b = cu_gemm_batch_work_bytes(&im->dev, &a);
            need = b > need ? b : need;
        }
    }
    return need == 0 || scratch_grow(im, &im->gemm_work, &im->gemm_work_bytes, need, true);
}

/* The adapter launches' u, grown before anything is launched or captured:
 * two slots (fuse rule 7), each room for the largest group rule 5 may make of
 * the step's lora ops. */
static bool lora_workspace(struct cu_impl *im)
{
    size_t need = (size_t)im->rec.lora_u_max * sizeof(float) * CU_LORA_MAX_GROUP * 2;
    return need == 0 || scratch_grow(im, &im->lora_work, &im->lora_work_bytes, need, true);
}

/* Launches the recorded step. */
static void flush(struct cu_impl *im)
{
    struct cu_rec *rec = &im->rec;
    if (rec->n_ops == 0)
        return;
    if (!im->failed) {
        uint64_t digest = 0;
        cudaSetDevice(im->dev.index);
        qgemv_workspace(im);
        gemm_batch_workspace(im);
        lora_workspace(im);
        if (rec->arena_used &&
            CU_TRY(im, cudaMemcpyAsync(im->arena_dev, rec->arena, rec->arena_used,
                                       cudaMemcpyHostToDevice, im->stream)) &&
            CU_TRY(im, cudaEventRecord(im->arena_free, im->stream)))
            im->arena_pending = true;
        if (im->profile == BACKEND_PROFILE_GRAPHS) {
            if (!im->host.flush_start)
                im->host.flush_start = now_ns();
            im->host.prefill = im->host.prefill || step_prefills(rec->ops, rec->n_ops);
        }
        if (!im->failed) {
            if (im->profile == BACKEND_PROFILE_OPS) {
                exec_ops_profiled(im, rec->ops, rec->n_ops);
                im->steps_eager++;
            } else if (graph_wanted(im, &digest)) {
                run_graph(im);
            } else {
                exec_ops(im, rec->ops, rec->n_ops);
                im->steps_eager++;
                if (digest)
                    remember_eager_step(im, digest);
            }
        }
        if (im->profile == BACKEND_PROFILE_GRAPHS)
            im->host.flush_end = now_ns();
    }
    cu_rec_clear(rec);
}

void cu_flush_eager(struct cu_impl *im)
{
    bool graphs = im->graphs_enabled;
    im->graphs_enabled = false;
    flush(im);
    im->graphs_enabled = graphs;
}

/* ---- memory ----------------------------------------------------------------- */

/* One live allocation of alloc, while a memory cap is set. */
struct cu_alloc_rec {
    void *ptr;
    size_t bytes;
};

struct cu_backend {
    struct backend be;
    struct cu_impl im;
    struct cu_sampler *sampler; /* owned; made by the first sample call */
    /* backend_options.memory_cap_bytes: alloc's live bytes stay within it (0: no cap) */
    size_t mem_cap, mem_used;
    struct cu_alloc_rec *allocs; /* owned; n_allocs live allocations (only with a cap) */
    size_t n_allocs, cap_allocs;
};

/* Counts an allocation against the cap; false (nothing counted) when it
 * would pass the cap or the record cannot grow. */
static bool cap_take(struct cu_backend *cb, void *p, size_t bytes)
{
    if (!cb->mem_cap)
        return true;
    if (bytes > cb->mem_cap - cb->mem_used)
        return false;
    if (cb->n_allocs == cb->cap_allocs) {
        size_t cap = cb->cap_allocs ? cb->cap_allocs * 2 : 256;
        struct cu_alloc_rec *grown =
            (struct cu_alloc_rec *)realloc(cb->allocs, cap * sizeof *grown);
        if (!grown)
            return false;
        cb->allocs = grown;
        cb->cap_allocs = cap;
    }
    cb->allocs[cb->n_allocs++] = (struct cu_alloc_rec){p, bytes};
    cb->mem_used += bytes;
    return true;
}

static void cap_give_back(struct cu_backend *cb, void *p)
{
    for (size_t i = 0; i < cb->n_allocs; i++)
        if (cb->allocs[i].ptr == p) {
            cb->mem_used -= cb->allocs[i].bytes;
            cb->allocs[i] = cb->allocs[--cb->n_allocs];
            return;
        }
}

static void *cu_alloc(struct backend *be, size_t bytes)
{
    struct cu_impl *im = impl_of(be);
    struct cu_backend *cb = (struct cu_backend *)be;
    if (cb->mem_cap && bytes > cb->mem_cap - cb->mem_used)
        return NULL; /* past the memory budget: the caller reports -INFERD_ENOMEM */
    cudaSetDevice(im->dev.index);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: the caller reports it */
        return NULL;
    }
    if (!CU_TRY(im, cudaMemsetAsync(p, 0, bytes ? bytes : 1, im->stream)) ||
        !cap_take(cb, p, bytes)) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_release(struct backend *be, void *ptr)
{
    struct cu_impl *im = impl_of(be);
    if (!ptr)
        return;
    cap_give_back((struct cu_backend *)be, ptr);
    flush(im);
    cudaSetDevice(im->dev.index);
    cudaStreamSynchronize(im->stream);
    cudaFree(ptr);
}

struct copy_part {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
};

static void *copy_part_run(void *arg)
{
    struct copy_part *p = (struct copy_part *)arg;
    memcpy(p->dst, p->src, p->n);
    return NULL;
}

/* memcpy from (possibly not yet faulted-in, mapped) host memory on a few threads. */
static void parallel_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n < ((size_t)4 << 20)) {
        memcpy(dst, src, n);
        return;
    }
    pthread_t th[CU_UPLOAD_THREADS];
    struct copy_part parts[CU_UPLOAD_THREADS];
    size_t per = (n / CU_UPLOAD_THREADS + 4095) & ~(size_t)4095;
    int started = 0;
    for (int i = 0; i < CU_UPLOAD_THREADS; i++) {
        size_t b = (size_t)i * per;
        if (b >= n)
            break;
        parts[i].dst = dst + b;
        parts[i].src = src + b;
        parts[i].n = n - b < per ? n - b : per;
        if (i > 0 && pthread_create(&th[i], NULL, copy_part_run, &parts[i]) == 0) {
            started |= 1 << i;
        } else if (i > 0) {
            copy_part_run(&parts[i]);
        }
    }
    copy_part_run(&parts[0]);
    for (int i = 1; i < CU_UPLOAD_THREADS; i++)
        if (started & (1 << i))
            pthread_join(th[i], NULL);
}

static bool upload_slots_ready(struct cu_impl *im)
{
    if (im->upload_slot[0])
        return true;
    for (int i = 0; i < CU_UPLOAD_SLOTS; i++) {
        if (!CU_TRY(im, cudaMallocHost((void **)&im->upload_slot[i], CU_UPLOAD_SLOT_BYTES)) ||
            !CU_TRY(im, cudaEventCreateWithFlags(&im->upload_done[i], cudaEventDisableTiming)))
            return false;
    }
    return true;
}

/* Large copies go through pinned slots: the host copy into one slot overlaps
 * the DMA of the others. */
static void cu_to_device(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cu_impl *im = impl_of(be);
    flush(im);
    if (im->failed || bytes == 0)
        return;
    cudaSetDevice(im->dev.index);
    if (bytes <= CU_UPLOAD_DIRECT) {
        CU_TRY(im, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, im->stream));
        CU_TRY(im, cudaStreamSynchronize(im->stream));
        return;
    }
    if (!upload_slots_ready(im))
        return;
    for (size_t off = 0; off < bytes; off += CU_UPLOAD_SLOT_BYTES) {
        size_t n = bytes - off < CU_UPLOAD_SLOT_BYTES ? bytes - off : CU_UPLOAD_SLOT_BYTES;
        int slot = im->upload_next;
        im->upload_next = (slot + 1) % CU_UPLOAD_SLOTS;
        if (!CU_TRY(im, cudaEventSynchronize(im->upload_done[slot])))
            return;
        parallel_copy(im->upload_slot[slot], (const uint8_t *)src + off, n);
        if (!CU_TRY(im, cudaMemcpyAsync((uint8_t *)dst + off, im->upload_slot[slot], n,
                                        cudaMemcpyHostToDevice, im->stream)) ||
            !CU_TRY(im, cudaEventRecord(im->upload_done[slot], im->stream)))
            return;
    }
    im->uploaded_bytes += bytes;
    if (im->uploaded_bytes - im->upload_reported >= ((uint64_t)2 << 30)) {
        im->upload_reported = im->uploaded_bytes;
        log_info("cuda: %.1f GB copied to %s", im->uploaded_bytes / 1e9, im->describe);
    }
}

static void cu_to_host_2d(struct backend *be, void *host, size_t host_pitch, const void *dev,
                          size_t dev_pitch, size_t width, size_t height)
{
    struct cu_impl *im = impl_of(be);
    flush(im);
    if (im->failed || width == 0 || height == 0)
        return;
    cudaSetDevice(im->dev.index);
    if (CU_TRY(im, cudaMemcpy2DAsync(host, host_pitch, dev, dev_pitch, width, height,
                                     cudaMemcpyDeviceToHost, im->stream)))
        CU_TRY(im, cudaStreamSynchronize(im->stream));
}

static void cu_to_device_2d(struct backend *be, void *dev, size_t dev_pitch, const void *host,
                            size_t host_pitch, size_t width, size_t height)
{
    struct cu_impl *im = impl_of(be);
    flush(im);
    if (im->failed || width == 0 || height == 0)
        return;
    cudaSetDevice(im->dev.index);
    /* synchronous: host may be reused as soon as this returns */
    if (CU_TRY(im, cudaMemcpy2DAsync(dev, dev_pitch, host, host_pitch, width, height,
                                     cudaMemcpyHostToDevice, im->stream)))
        CU_TRY(im, cudaStreamSynchronize(im->stream));
}

static void *cu_host_alloc(struct backend *be, size_t bytes)
{
    struct cu_impl *im = impl_of(be);
    void *p = NULL;
    cudaSetDevice(im->dev.index);
    return cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
}

static void cu_host_free(struct backend *be, void *ptr)
{
    (void)be;
    if (ptr)
        cudaFreeHost(ptr);
}

static void cu_to_host_2d_async(struct backend *be, void *host, size_t host_pitch,
                                const void *dev, size_t dev_pitch, size_t width, size_t height)
{
    struct cu_impl *im = impl_of(be);
    flush(im); /* the ops before it run first, in stream order */
    if (im->failed || width == 0 || height == 0)
        return;
    cudaSetDevice(im->dev.index);
    CU_TRY(im, cudaMemcpy2DAsync(host, host_pitch, dev, dev_pitch, width, height,
                                 cudaMemcpyDeviceToHost, im->stream));
}

static void cu_to_device_2d_async(struct backend *be, void *dev, size_t dev_pitch,
                                  const void *host, size_t host_pitch, size_t width,
                                  size_t height)
{
    struct cu_impl *im = impl_of(be);
    flush(im);
    if (im->failed || width == 0 || height == 0)
        return;
    cudaSetDevice(im->dev.index);
    CU_TRY(im, cudaMemcpy2DAsync(dev, dev_pitch, host, host_pitch, width, height,
                                 cudaMemcpyHostToDevice, im->stream));
}

static void cu_to_host(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cu_impl *im = impl_of(be);
    flush(im);
    if (im->failed || bytes == 0)
        return;
    cudaSetDevice(im->dev.index);
    size_t want = bytes < CU_DOWNLOAD_MAX ? bytes : CU_DOWNLOAD_MAX;
    if (want > im->download_cap) {
        cudaFreeHost(im->download);
        im->download = NULL;
        im->download_cap = 0;
        size_t cap = pow2_at_least(want, (size_t)1 << 20);
        if (!CU_TRY(im, cudaMallocHost((void **)&im->download, cap)))
            return;
        im->download_cap = cap;
    }
    for (size_t off = 0; off < bytes; off += im->download_cap) {
        size_t n = bytes - off < im->download_cap ? bytes - off : im->download_cap;
        if (!CU_TRY(im, cudaMemcpyAsync(im->download, (const uint8_t *)src + off, n,
                                        cudaMemcpyDeviceToHost, im->stream)) ||
            !CU_TRY(im, cudaStreamSynchronize(im->stream)))
            return;
        memcpy((uint8_t *)dst + off, im->download, n);
    }
}

static int cu_status(struct backend *be, struct err *err);

/* The recorded ops are launched (a decode step's graph replayed); the host
 * goes on while the GPU runs them. */
static void cu_submit(struct backend *be)
{
    flush(impl_of(be));
}

/* Adds a sampled step's timeline (sampling from t_sample to t_done) to h
 * when it did not prefill, and starts the next step's. */
static void step_times_add(struct cu_step_times *h, uint64_t t_sample, uint64_t t_done)
{
    if (h->sampled_at && !h->prefill && h->first_op > h->sampled_at && h->flush_start) {
        uint64_t flush_end = h->flush_end > h->flush_start ? h->flush_end : h->flush_start;
        h->engine_us += 1e-3 * (double)(h->first_op - h->sampled_at);
        h->record_us += 1e-3 * (double)(h->flush_start - h->first_op);
        h->launch_us += 1e-3 * (double)(flush_end - h->flush_start);
        h->picks_us += 1e-3 * (double)(t_sample > flush_end ? t_sample - flush_end : 0);
        h->sample_us += 1e-3 * (double)(t_done - t_sample);
        h->sample_queued_us += 1e-3 * (double)h->queued_ns;
        h->replay_prep_us += 1e-3 * (double)h->replay_prep_ns;
        h->replay_call_us += 1e-3 * (double)h->replay_call_ns;
        h->replay_wait_us += 1e-3 * (double)h->replay_wait_ns;
        h->steps++;
    }
    h->sampled_at = t_done;
    h->first_op = h->flush_start = h->flush_end = h->queued_ns = 0;
    h->replay_prep_ns = h->replay_call_ns = h->replay_wait_ns = 0;
    h->prefill = false;
}

/* Token sampling (sample.cu) runs after the step: the recorded ops are
 * launched (replayed from a graph for decode steps), then the sampling
 * kernels eagerly on the same stream, then one small copy of the results. */
static int cu_sample(struct backend *be, const float *logits, int n_rows, int vocab,
                     const struct sample_spec *specs, struct sample_result *out, float *host_rows,
                     struct err *err)
{
    struct cu_impl *im = impl_of(be);
    struct cu_backend *cb = (struct cu_backend *)be;
    uint64_t t0 = im->profile == BACKEND_PROFILE_GRAPHS ? now_ns() : 0;
    flush(im);
    if (im->profile == BACKEND_PROFILE_GRAPHS && !im->failed) {
        /* apart from the sampling's own time: the GPU work still queued */
        uint64_t t1 = now_ns();
        cudaStreamSynchronize(im->stream);
        im->host.queued_ns = now_ns() - t1;
    }
    if (!im->failed && n_rows > 0) {
        cudaSetDevice(im->dev.index);
        if (cb->sampler || CU_TRY(im, cu_sampler_create(&cb->sampler))) {
            const char *what = "sampling";
            cu_ok(im, cu_sampler_run(cb->sampler, im->stream, (float *)logits, n_rows, vocab,
                                     specs, out, host_rows, &what),
                  what);
        }
    }
    if (im->profile == BACKEND_PROFILE_GRAPHS) {
        uint64_t t2 = now_ns();
        step_times_add(&im->host, t0, t2);
    }
    return cu_status(be, err);
}

static int cu_status(struct backend *be, struct err *err)
{
    struct cu_impl *im = impl_of(be);
    flush(im);
    if (!im->failed) {
        cudaError_t e = cudaStreamSynchronize(im->stream);
        if (e != cudaSuccess)
            cu_ok(im, e, "a GPU kernel");
    }
    if (!im->failed)
        return 0;
    int code = im->error.code ? im->error.code : INFERD_EIO;
    int rc = err_set(err, code, "%s", im->error.msg);
    if (code == INFERD_ENOMEM) { /* recoverable: the next step may fit */
        im->failed = false;
        err_clear(&im->error);
    }
    return rc;
}

static void cu_destroy(struct backend *be)
{
    struct cu_impl *im = impl_of(be);
    cudaSetDevice(im->dev.index);
    cu_rec_clear(&im->rec);
    cudaStreamSynchronize(im->stream);
    profile_report(im);
    for (int i = 0; i < 2; i++)
        if (im->replay_ev[i])
            cudaEventDestroy(im->replay_ev[i]);
    for (int i = 0; i < im->prof_ev_cap; i++)
        cudaEventDestroy(im->prof_ev[i]);
    free(im->prof_ev);
    graphs_clear(im);
    cu_sampler_destroy(((struct cu_backend *)be)->sampler);
    for (int i = 0; i < CU_LT_CACHE; i++)
        lt_plan_clear(&im->lt_plans[i]);
    pthread_mutex_destroy(&im->lt_lock);
    for (int i = 0; i < CU_UPLOAD_SLOTS; i++) {
        if (im->upload_slot[i])
            cudaFreeHost(im->upload_slot[i]);
        if (im->upload_done[i])
            cudaEventDestroy(im->upload_done[i]);
    }
    cudaFreeHost(im->download);
    cudaFreeHost(im->rec.arena);
    cudaFree(im->arena_dev);
    cudaFree(im->xb);
    cudaFree(im->wb);
    cudaFree(im->attn_part);
    cudaFree(im->norm_sums);
    cudaFree(im->xq);
    cudaFree(im->gemm_work);
    cudaFree(im->wgmma_work);
    cudaFree(im->lora_work);
    cudaFree(im->kvq_books);
    cudaFree(im->lt_workspace);
    free(((struct cu_backend *)be)->allocs);
    if (im->arena_free)
        cudaEventDestroy(im->arena_free);
    if (im->lt)
        cublasLtDestroy(im->lt);
    if (im->stream)
        cudaStreamDestroy(im->stream);
    cu_rec_free(&im->rec);
    free(be);
}

static const struct backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cu_destroy,
    /* .alloc = */ cu_alloc,
    /* .release = */ cu_release,
    /* .to_device = */ cu_to_device,
    /* .to_host = */ cu_to_host,
    /* .embed = */ cu_embed,
    /* .matmul = */ cu_matmul,
    /* .matmul_group = */ cu_matmul_group,
    /* .rmsnorm = */ cu_rmsnorm,
    /* .rope = */ cu_rope,
    /* .silu_mul = */ cu_silu_mul,
    /* .add = */ cu_add,
    /* .kv_store = */ cu_kv_store,
    /* .attention = */ cu_attention,
    /* .status = */ cu_status,
    /* .sample = */ cu_sample,
    /* .kv_copy_slots = */ cu_kv_copy_slots,
    /* .to_host_2d = */ cu_to_host_2d,
    /* .to_device_2d = */ cu_to_device_2d,
    /* .host_alloc = */ cu_host_alloc,
    /* .host_free = */ cu_host_free,
    /* .to_host_2d_async = */ cu_to_host_2d_async,
    /* .to_device_2d_async = */ cu_to_device_2d_async,
    /* .submit = */ cu_submit,
    /* .hold_row_ops = */ NULL,
    /* the encoder-decoder ops (Whisper; encdec.cu) */
    /* .layer_norm = */ cu_layer_norm,
    /* .gelu = */ cu_gelu,
    /* .conv1d = */ cu_conv1d,
    /* .attention_dense = */ cu_attention_dense,
    /* .scatter_rows = */ cu_scatter_rows,
    /* .moe_route = */ cu_moe_route,
    /* .moe_ffn = */ cu_moe_ffn,
    /* .gated_add = */ cu_gated_add,
    /* .gelu_tanh_mul = */ cu_gelu_tanh_mul,
    /* .scale = */ cu_scale,
    /* .softcap = */ cu_softcap,
    /* .lora = */ cu_lora,
    /* .memory_is_host = */ false,
};

/* backend_options.gpu_sampling off: logits go to the host and are sampled there. */
static struct backend_ops without_sampling(struct backend_ops ops)
{
    ops.sample = NULL;
    return ops;
}
static const struct backend_ops cuda_ops_host_sampling = without_sampling(cuda_ops);

static bool is_cuda(const struct backend *be)
{
    return be && (be->ops == &cuda_ops || be->ops == &cuda_ops_host_sampling);
}

/* ---- creation ----------------------------------------------------------- */

extern "C" int backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" bool backend_cuda_compiled(void) { return true; }

extern "C" void backend_cuda_describe(struct backend *be, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = '\0';
    if (is_cuda(be))
        snprintf(buf, cap, "%s", impl_of(be)->describe);
}

static __global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) /* practically never: keeps the loads alive */
        *sink = acc;
}

extern "C" void *backend_cuda_stream(struct backend *be)
{
    return is_cuda(be) ? (void *)impl_of(be)->stream : NULL;
}

extern "C" long backend_cuda_planned_launches(struct backend *be)
{
    return is_cuda(be) ? impl_of(be)->planned_launches : 0;
}

extern "C" size_t backend_cuda_free_memory(struct backend *be)
{
    if (!is_cuda(be))
        return 0;
    struct cu_impl *im = impl_of(be);
    cudaSetDevice(im->dev.index);
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return free_bytes;
}

extern "C" double backend_cuda_read_bandwidth(struct backend *be, size_t bytes)
{
    if (!is_cuda(be))
        return 0.0;
    struct cu_impl *im = impl_of(be);
    flush(im);
    cudaSetDevice(im->dev.index);
    void *buf = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    double best = 0.0;
    if (cudaMalloc(&buf, bytes + 64) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    cudaMemsetAsync(buf, 1, bytes + 64, im->stream);
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    size_t n = bytes / 16;
    for (int rep = 0; rep < 5; rep++) {
        cudaEventRecord(t0, im->stream);
        read_kernel<<<im->dev.n_sm * 8, 512, 0, im->stream>>>((const uint4 *)buf, n,
                                                          (unsigned *)((char *)buf + bytes));
        cudaEventRecord(t1, im->stream);
        if (cudaEventSynchronize(t1) != cudaSuccess)
            break;
        float ms = 0;
        cudaEventElapsedTime(&ms, t0, t1);
        double gbs = n * 16.0 / (ms * 1e-3) / 1e9;
        if (gbs > best)
            best = gbs;
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(buf);
    cudaGetLastError();
    return best;
}

extern "C" int backend_cuda_create(int device, const struct backend_options *opt,
                                   struct backend **out, struct err *err)
{
    *out = NULL;
    if (opt->kv_quant) {
        const struct kv_quant *q = opt->kv_quant;
        if (q->n_layers < 0 || q->n_layers > KV_QUANT_MAX_LAYERS)
            return err_set(err, INFERD_EINVAL, "KV quantization for %d layers (at most %d)",
                           q->n_layers, KV_QUANT_MAX_LAYERS);
        for (int i = 0; i < (q->n_layers > 0 ? q->n_layers : 1); i++)
            if (!kvq_layer_readable(&q->layer[i]))
                return err_set(err, INFERD_EINVAL,
                               "layer %d: KV format scheme %d k%d v%d group %d is not one the "
                               "backend reads", i, q->layer[i].scheme, q->layer[i].k_bits,
                               q->layer[i].v_bits, q->layer[i].group_size);
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return err_set(err, INFERD_EUNSUPPORTED, "no usable CUDA GPU: %s", cudaGetErrorString(e));
    }
    if (device < 0 || device >= n)
        return err_set(err, INFERD_EUNSUPPORTED, "no CUDA GPU %d (this machine has %d)", device, n);
    struct cu_backend *cb = (struct cu_backend *)calloc(1, sizeof *cb);
    if (!cb)
        return err_set(err, INFERD_ENOMEM, "out of memory creating the CUDA backend");
    struct backend *be = &cb->be;
    struct cu_impl *im = &cb->im;
    pthread_mutex_init(&im->lt_lock, NULL);
    be->ops = opt->gpu_sampling == BACKEND_OFF ? &cuda_ops_host_sampling : &cuda_ops;
    be->mode = opt->mode;
    be->copy_weights = true;
    /* Q8_0, Q4_K, Q6_K and MLX blocks stay blocks in device memory (qgemv.cu) */
    be->block_weights = true;
    be->block_types = cu_block_types();
    cb->mem_cap = opt->memory_cap_bytes;
    /* fast mode keeps K and V in fp16 (half the bytes attention reads) */
    be->kv_dtype = opt->kv_type == BACKEND_KV_F16 ? DTYPE_F16
                 : opt->kv_type == BACKEND_KV_F32 ? DTYPE_F32
                 : opt->mode == COMPUTE_FAST      ? DTYPE_F16
                                                  : DTYPE_F32;
    be->impl = im;
    im->dev.index = device;
    im->rec.hooks = &rec_hooks;
    im->rec.row_invariant = opt->mode == COMPUTE_EXACT;
    im->graphs_enabled = opt->cuda_graphs != BACKEND_OFF;
    im->fuse.fast = opt->mode == COMPUTE_FAST;
    /* The folded norm sums x^2 in an order of its own, which depends on the
     * rows of the step: EXACT mode keeps the RMSNorm kernel unless asked. */
    im->fuse.norm_gemv = opt->cuda_norm_fusion == BACKEND_ON ||
                         (opt->cuda_norm_fusion == BACKEND_DEFAULT && opt->mode == COMPUTE_FAST);
    im->fuse.qk_attention = opt->cuda_qk_fusion != BACKEND_OFF;
    /* rule 1 over verify spans: off unless asked (level with the q/k launch on an H200 and
     * an H100); rule 9: by default in the layers of steps with several-token spans */
    im->fuse.qk_spans = opt->cuda_qk_span_fusion == BACKEND_ON;
    im->fuse.norm_sums = im->fuse.fast && opt->cuda_norm_sums == BACKEND_ON;
    im->fuse.norm_sums_spans = im->fuse.fast && opt->cuda_norm_sums != BACKEND_OFF;
    im->fuse.add_norm = opt->cuda_add_norm_fusion != BACKEND_OFF;
    im->fuse.gemm_x = opt->cuda_gemm_x_fusion != BACKEND_OFF;
    im->fuse.gemm_bf16_swiglu = im->fuse.fast && opt->cuda_gemm_bf16_swiglu != BACKEND_OFF;
    im->fuse.gemm_residual = im->fuse.fast && opt->cuda_gemm_residual != BACKEND_OFF;
    im->fuse.gemv_max_rows = opt->cuda_gemv_rows >= 1 && opt->cuda_gemv_rows <= CU_GEMV_MAX_ROWS
                                 ? opt->cuda_gemv_rows
                                 : CU_GEMV_DEFAULT_ROWS;
    im->fuse.skinny_max_rows = opt->cuda_skinny_gemm != BACKEND_OFF ? CU_SKINNY_MAX_ROWS : 0;
    im->fuse.batch_max_rows = opt->cuda_batch_gemm == BACKEND_ON ? CU_BATCH_MAX_ROWS : 0;
    im->prefill_tc = opt->cuda_prefill_tc != BACKEND_OFF;
    im->qprefill_ws = opt->cuda_qprefill_ws != BACKEND_OFF;
    im->prefill_wgmma = opt->cuda_prefill_wgmma != BACKEND_OFF;
    im->qprefill_pair = opt->cuda_qprefill_pair != BACKEND_OFF;
    im->rec.qprefill_window =
        im->fuse.fast && im->prefill_tc && opt->cuda_qprefill_window != BACKEND_OFF;
    im->fuse.decode_mma = im->fuse.fast && opt->cuda_decode_tc != BACKEND_OFF;
    im->fuse.gemm_f32 = opt->cuda_gemm_f32 == BACKEND_ON;
    im->moe_kernels = opt->cuda_moe != BACKEND_OFF;
    im->qgemv_int8 = opt->cuda_qgemv_dp4a != BACKEND_OFF;
    im->qgemv_stream = im->qgemv_int8 && opt->cuda_qgemv_stream != BACKEND_OFF;
    im->fuse.qgemv_norm = im->fuse.fast && im->qgemv_int8;
    im->fuse.qgemv_mixed =
        im->fuse.fast && im->qgemv_stream && opt->cuda_qgemv_mixed != BACKEND_OFF;
    im->profile = opt->profile;
    cudaDeviceProp prop;
    bool ok = CU_TRY(im, cudaSetDevice(device)) && CU_TRY(im, cudaGetDeviceProperties(&prop, device));
    if (ok) {
        im->dev.n_sm = prop.multiProcessorCount;
        im->dev.smem_optin = (int)prop.sharedMemPerBlockOptin;
        im->dev.pdl = opt->cuda_pdl != BACKEND_OFF && prop.major >= 9;
        /* fuse rule 7 runs thread-block clusters (compute capability 9.0); off unless
         * asked: its row launches still cost more than the launches they save */
        im->fuse.lora_rows =
            im->fuse.fast && prop.major >= 9 && opt->cuda_lora_rows == BACKEND_ON;
        im->fuse.lora_rows_smem = im->dev.smem_optin - 1024;
        im->rec.n_sm = im->dev.n_sm;
        snprintf(im->describe, sizeof im->describe, "%.100s, %.1f GiB, sm_%d%d", prop.name,
                 prop.totalGlobalMem / (double)(1 << 30), prop.major, prop.minor);
        ok = CU_TRY(im, cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) &&
             CU_TRY(im, cudaEventCreateWithFlags(&im->arena_free, cudaEventDisableTiming)) &&
             CU_TRY(im, cudaMalloc(&im->lt_workspace, CU_LT_WORKSPACE)) &&
             CU_TRY(im, cudaMallocHost((void **)&im->rec.arena, CU_ARENA_INITIAL)) &&
             CU_TRY(im, cudaMalloc((void **)&im->arena_dev, CU_ARENA_INITIAL)) &&
             (!(im->fuse.norm_sums || im->fuse.norm_sums_spans) ||
              CU_TRY(im, cudaMalloc((void **)&im->norm_sums,
                                    CU_NORM_SUMS_FLOATS * sizeof(float))));
        im->lt_workspace_bytes = CU_LT_WORKSPACE;
        im->rec.arena_cap = CU_ARENA_INITIAL;
        im->wgmma_gemm = ok && im->fuse.fast && opt->cuda_wgmma_gemm == BACKEND_ON &&
                         cu_gemm_wgmma_runs(&im->dev);
        if (im->wgmma_gemm) {
            im->wgmma_work_bytes = cu_gemm_wgmma_work_bytes(&im->dev);
            ok = CU_TRY(im, cudaMalloc(&im->wgmma_work, im->wgmma_work_bytes)) &&
                 CU_TRY(im, cudaMemset(im->wgmma_work, 0, im->wgmma_work_bytes));
        }
    }
    if (ok && opt->kv_quant) {
        /* the books are computed on the host, as the CPU backend's, and uploaded once */
        struct kvq_codebooks *books = (struct kvq_codebooks *)malloc(sizeof *books);
        ok = books != NULL;
        if (!books)
            cu_fail(im, INFERD_ENOMEM, "out of memory for the KV codebooks");
        if (ok) {
            kvq_codebooks_init(books);
            ok = CU_TRY(im, cudaMalloc((void **)&im->kvq_books, sizeof *books)) &&
                 CU_TRY(im, cudaMemcpy(im->kvq_books, books, sizeof *books, cudaMemcpyHostToDevice));
            free(books);
        }
        if (ok) {
            im->kv_quant = *opt->kv_quant;
            im->rec.kvq_books = im->kvq_books;
            be->kv_quant = &im->kv_quant;
        }
    }
    if (ok && cublasLtCreate(&im->lt) != CUBLAS_STATUS_SUCCESS) {
        cu_fail(im, INFERD_EIO, "cuBLASLt could not be initialised");
        ok = false;
    }
    if (!ok) {
        int rc = err_set(err, im->error.code ? im->error.code : INFERD_EIO, "CUDA GPU %d: %s",
                         device, im->error.msg);
        cu_destroy(be);
        return rc;
    }
    *out = be;
    return 0;
}
