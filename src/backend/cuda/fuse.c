/* backend/cuda/fuse.c — the fusion planner: which recorded ops the CUDA backend launches together (rules in fuse.h). */
#include "backend/cuda/fuse.h"

#include <string.h>

/* Rule 1: [rmsnorm q heads, rmsnorm k heads,] rope q, rope k [, kv_store] as
 * one kernel; returns how many ops it covers, 0 when the pattern is not there. */
static int match_qk(const struct cu_op *ops, int i, int n, struct cu_qk_args *a)
{
    memset(a, 0, sizeof *a);
    int j = i;
    const struct cu_op *nq = NULL, *nk = NULL;
    if (j + 1 < n && ops[j].kind == CU_RMSNORM && ops[j + 1].kind == CU_RMSNORM) {
        nq = &ops[j];
        nk = &ops[j + 1];
        j += 2;
    }
    if (j + 1 >= n || ops[j].kind != CU_ROPE || ops[j + 1].kind != CU_ROPE)
        return 0;
    const struct cu_op *rq = &ops[j], *rk = &ops[j + 1];
    if (rq->n_rows != rk->n_rows || rq->u.rope.head_dim != rk->u.rope.head_dim ||
        rq->u.rope.rot_dim != rk->u.rope.rot_dim || rq->u.rope.pos_off != rk->u.rope.pos_off ||
        rq->u.rope.freq_off != rk->u.rope.freq_off || rq->u.rope.factor != rk->u.rope.factor ||
        rq->u.rope.long_from != rk->u.rope.long_from ||
        rq->u.rope.x == rk->u.rope.x)
        return 0;
    int hd = rq->u.rope.head_dim;
    if (nq) {
        if (nq->u.norm.x != rq->u.rope.x || nq->u.norm.y != rq->u.rope.x ||
            nk->u.norm.x != rk->u.rope.x || nk->u.norm.y != rk->u.rope.x ||
            nq->u.norm.dim != hd || nk->u.norm.dim != hd ||
            nq->u.norm.n_rows != (int64_t)rq->n_rows * rq->u.rope.n_heads ||
            nk->u.norm.n_rows != (int64_t)rk->n_rows * rk->u.rope.n_heads ||
            nq->u.norm.eps != nk->u.norm.eps)
            return 0;
        a->q_norm = nq->u.norm.w;
        a->k_norm = nk->u.norm.w;
        a->eps = nq->u.norm.eps;
    }
    a->q = rq->u.rope.x;
    a->k = rk->u.rope.x;
    a->n_q_heads = rq->u.rope.n_heads;
    a->n_k_heads = rk->u.rope.n_heads;
    a->head_dim = hd;
    a->rot_dim = rq->u.rope.rot_dim;
    a->n_rows = rq->n_rows;
    a->pos_off = rq->u.rope.pos_off;
    a->freq_off = rq->u.rope.freq_off;
    a->factor = rq->u.rope.factor;
    a->long_from = rq->u.rope.long_from;
    j += 2;
    /* a quantized cache's rows are written by the kv_store launch, which
     * quantizes them (a warp per record) */
    if (j < n && ops[j].kind == CU_KV_STORE && !ops[j].u.store.kv.quant &&
        ops[j].u.store.k == rk->u.rope.x &&
        ops[j].n_rows == rk->n_rows && ops[j].u.store.kv.head_dim == hd &&
        ops[j].u.store.kv.n_kv_heads == rk->u.rope.n_heads) {
        a->store = true;
        a->v = ops[j].u.store.v;
        a->kv = ops[j].u.store.kv;
        a->layer = ops[j].u.store.layer;
        a->spans_off = ops[j].u.store.spans_off;
        a->n_spans = ops[j].u.store.n_spans;
        j++;
    }
    return j - i;
}

bool cu_attention_takes_qk(const struct cu_op *op, const struct cu_qk_args *qk)
{
    const struct cu_kv *kv = &op->u.attn.kv;
    int hd = kv->head_dim;
    /* spans of several new positions: the flash-decoding kernels over an f16 cache */
    const bool spans = op->u.attn.max_span_tokens <= CU_QK_MAX_SPAN && kv->f16 && hd <= 128 &&
                       !cu_attention_uses_mma(op);
    return op->kind == CU_ATTENTION && !kv->quant && !cu_attention_uses_prefill(op) &&
           (op->u.attn.max_span_tokens == 1 || spans) && (hd == 64 || hd == 128 || hd == 256) &&
           qk->store && qk->q == op->u.attn.q && qk->head_dim == hd && qk->rot_dim <= hd &&
           qk->n_rows == op->n_rows && qk->n_q_heads == op->u.attn.n_heads &&
           qk->n_k_heads == kv->n_kv_heads && qk->layer == op->u.attn.layer &&
           qk->kv.k == kv->k && qk->kv.v == kv->v && qk->kv.f16 == kv->f16 &&
           qk->kv.block_size == kv->block_size && qk->kv.n_blocks == kv->n_blocks;
}

bool cu_skinny_takes(int64_t n_rows, int64_t cols)
{
    return n_rows >= 1 && n_rows <= CU_SKINNY_MAX_ROWS && cols >= 8 && cols % 8 == 0 &&
           cols <= INT32_MAX;
}

/* Rule 3's tensor-core GEMMs of a few rows (16-byte aligned operands): the
 * skinny GEMM, or past CU_SKINNY_MAX_ROWS rows the batched tile GEMM. */
static bool uses_skinny(const struct cu_fuse_config *cfg, const struct cu_op *op)
{
    int64_t rows = op->n_rows, cols = op->u.mm.cols;
    bool skinny = rows <= cfg->skinny_max_rows && cu_skinny_takes(rows, cols);
    bool batch = rows > CU_SKINNY_MAX_ROWS && rows <= cfg->batch_max_rows &&
                 rows <= CU_BATCH_MAX_ROWS && cols % 8 == 0 && cols <= INT32_MAX;
    if (!cfg->fast || op->u.mm.dtype != DTYPE_BF16 || rows <= cfg->gemv_max_rows ||
        !(skinny || batch) || (uintptr_t)op->u.mm.x % 16 != 0)
        return false;
    for (int i = 0; i < op->u.mm.n; i++)
        if ((uintptr_t)op->u.mm.m[i].w % 16 != 0)
            return false;
    return true;
}

/* Rule 3's split: the GEMV kernels (the skinny GEMM among them), or
 * cuBLASLt. Block-quantized weights stream through their GEMV kernels up to
 * CU_GEMV_MAX_ROWS rows (past two rows they still read a fraction of bf16's
 * bytes); above, FAST mode dequantizes them to bf16 for cuBLASLt. */
static bool uses_gemv(const struct cu_fuse_config *cfg, const struct cu_op *op)
{
    if (uses_skinny(cfg, op))
        return true;
    if (dtype_is_block((enum dtype)op->u.mm.dtype))
        return !cfg->fast || op->n_rows <= CU_GEMV_MAX_ROWS;
    if (op->u.mm.dtype == DTYPE_F32 && cfg->gemm_f32)
        return op->n_rows <= CU_GEMV_MAX_ROWS;
    return !cfg->fast || op->n_rows <= cfg->gemv_max_rows || op->u.mm.dtype != DTYPE_BF16 ||
           op->u.mm.cols % 8 != 0;
}

bool cu_fuse_uses_batch_gemm(const struct cu_fuse_config *cfg, const struct cu_op *op)
{
    return op->kind == CU_MATMUL && op->n_rows > CU_SKINNY_MAX_ROWS && uses_skinny(cfg, op);
}

bool cu_fuse_uses_gemm(const struct cu_fuse_config *cfg, const struct cu_op *op)
{
    return op->kind == CU_MATMUL && !uses_gemv(cfg, op);
}

/* Rule 2: an RMSNorm of the rows the decode-path GEMV right after it reads;
 * the GEMV's blocks (one wave of them) normalise x themselves while staging it
 * (bf16 weights; with qgemv_norm Q4_K ones, and Q8_0 ones, whose quantize
 * launch normalises x first). */
static bool norm_feeds_gemv(const struct cu_fuse_config *cfg, const struct cu_op *norm,
                            const struct cu_op *mm)
{
    const bool bf16 = mm->u.mm.dtype == DTYPE_BF16 && mm->u.mm.cols % 8 == 0;
    const bool q4k = cfg->qgemv_norm && mm->u.mm.dtype == DTYPE_Q4_K && mm->u.mm.cols % 256 == 0;
    const bool q8 = cfg->qgemv_norm && mm->u.mm.dtype == DTYPE_Q8_0 && mm->u.mm.cols % 32 == 0;
    return cfg->norm_gemv && mm->kind == CU_MATMUL && uses_gemv(cfg, mm) &&
           !uses_skinny(cfg, mm) && mm->n_rows <= CU_GEMV_MAX_ROWS && (bf16 || q4k || q8) &&
           mm->u.mm.x == norm->u.norm.y &&
           norm->u.norm.y != norm->u.norm.x && mm->n_rows == norm->u.norm.n_rows &&
           mm->u.mm.cols == norm->u.norm.dim;
}

static int plan_gemv(const struct cu_fuse_config *cfg, const struct cu_op *ops, int m, int n,
                     struct cu_launch *l);

/* ---- which step buffers are read again (rules 6, 9, 10 and 11) ---------- */

struct buf_range {
    const char *p;
    int64_t bytes;
};

static struct buf_range floats_at(const void *p, int64_t n)
{
    return (struct buf_range){(const char *)p, n * (int64_t)sizeof(float)};
}

#define BUF_MAX 4

/* The step buffers (activations: not weights, the arena or a cache) that op reads, into r,
 * and writes whole, into w; returns false for the kinds not listed here, which may read
 * anything. */
static bool op_buffers(const struct cu_op *op, struct buf_range *r, int *n_r, struct buf_range *w,
                       int *n_w)
{
    *n_r = *n_w = 0;
    const int64_t rows = op->n_rows;
    switch (op->kind) {
    case CU_EMBED:
        w[(*n_w)++] = floats_at(op->u.embed.out, rows * op->u.embed.cols);
        return true;
    case CU_MATMUL:
        r[(*n_r)++] = floats_at(op->u.mm.x, rows * op->u.mm.cols);
        for (int i = 0; i < op->u.mm.n && i < BUF_MAX; i++)
            w[(*n_w)++] = floats_at(op->u.mm.m[i].y, rows * op->u.mm.m[i].rows);
        return op->u.mm.n <= BUF_MAX;
    case CU_RMSNORM:
    case CU_LAYER_NORM:
        r[(*n_r)++] = floats_at(op->u.norm.x, op->u.norm.n_rows * op->u.norm.dim);
        w[(*n_w)++] = floats_at(op->u.norm.y, op->u.norm.n_rows * op->u.norm.dim);
        return true;
    case CU_ROPE:
        r[(*n_r)++] = floats_at(op->u.rope.x, rows * op->u.rope.n_heads * op->u.rope.head_dim);
        w[(*n_w)++] = r[0];
        return true;
    case CU_SILU_MUL:
    case CU_GELU_TANH_MUL:
    case CU_ADD: /* out += a */
    case CU_SCALE:
    case CU_SOFTCAP:
        r[(*n_r)++] = floats_at(op->u.ew.a, op->u.ew.n);
        if (op->u.ew.b)
            r[(*n_r)++] = floats_at(op->u.ew.b, op->u.ew.n);
        if (op->kind != CU_SILU_MUL && op->kind != CU_GELU_TANH_MUL)
            r[(*n_r)++] = floats_at(op->u.ew.out, op->u.ew.n);
        w[(*n_w)++] = floats_at(op->u.ew.out, op->u.ew.n);
        return true;
    case CU_KV_STORE: {
        const int64_t n = rows * op->u.store.kv.n_kv_heads * op->u.store.kv.head_dim;
        r[(*n_r)++] = floats_at(op->u.store.k, n);
        r[(*n_r)++] = floats_at(op->u.store.v, n);
        return true;
    }
    case CU_ATTENTION: {
        const int64_t n = rows * op->u.attn.n_heads * op->u.attn.kv.head_dim;
        r[(*n_r)++] = floats_at(op->u.attn.q, n);
        w[(*n_w)++] = floats_at(op->u.attn.out, n);
        return true;
    }
    case CU_KV_COPY: return true; /* cache slots only */
    default: return false;
    }
}

static bool ranges_meet(struct buf_range a, struct buf_range b)
{
    return a.p < b.p + b.bytes && b.p < a.p + a.bytes;
}

enum buf_use {
    USE_NONE,     /* the step ends first (the host may read them after it) */
    USE_READ,     /* an op reads some of them, or is of a kind op_buffers does not list */
    USE_OVERWRITE /* an op overwrites all of them without reading them */
};

/* What happens first to the n floats at p from ops[from] on. xb_first: ops[from] is a GEMM
 * that reads its x in bf16 from the launch before it (rule 6), not its f32 x. */
static enum buf_use next_use(const struct cu_op *ops, int from, int n, const float *p,
                             int64_t n_floats, bool xb_first)
{
    const struct buf_range t = floats_at(p, n_floats);
    for (int k = from; k < n; k++) {
        struct buf_range r[BUF_MAX], w[BUF_MAX];
        int n_r, n_w;
        if (!op_buffers(&ops[k], r, &n_r, w, &n_w))
            return USE_READ;
        for (int j = k == from && xb_first ? 1 : 0; j < n_r; j++) /* a matmul's x is r[0] */
            if (ranges_meet(r[j], t))
                return USE_READ;
        for (int j = 0; j < n_w; j++)
            if (w[j].p <= t.p && t.p + t.bytes <= w[j].p + w[j].bytes)
                return USE_OVERWRITE;
    }
    return USE_NONE;
}

/* Whether the n floats at p are dead from ops[from] on: overwritten before anything reads
 * them, within the step. */
static bool dead_from(const struct cu_op *ops, int from, int n, const float *p, int64_t n_floats,
                      bool xb_first)
{
    return next_use(ops, from, n, p, n_floats, xb_first) == USE_OVERWRITE;
}

/* Rule 3's residual epilogue: the op after the single-output matmul at ops[m] adds its output
 * into another buffer (res += y). */
static bool adds_into_residual(const struct cu_op *ops, int m, int n)
{
    const struct cu_op *op = &ops[m];
    if (m + 1 >= n || op->kind != CU_MATMUL || op->u.mm.n != 1)
        return false;
    const struct cu_op *next = &ops[m + 1];
    return next->kind == CU_ADD && next->u.ew.a == op->u.mm.m[0].y &&
           next->u.ew.n == (int64_t)op->n_rows * op->u.mm.m[0].rows &&
           next->u.ew.out != op->u.mm.m[0].y;
}

/* Ops a layer's matmul that adds into the residual stream may lie after its attention. */
#define LAYER_OPS_MAX 64

/* Whether the attention the matmul at ops[m] follows (its layer's) attends for a span of
 * several tokens. */
static bool after_span_attention(const struct cu_op *ops, int m)
{
    for (int i = m - 1; i >= 0 && i >= m - LAYER_OPS_MAX; i--)
        if (ops[i].kind == CU_ATTENTION)
            return ops[i].u.attn.max_span_tokens > 1;
    return false;
}

/* Rule 9: the skinny GEMM at ops[m] adds into the residual stream, the RMSNorm at ops[m + 2]
 * normalises every row of that sum, and the skinny GEMM at ops[m + 3] reads its output, which
 * nothing after it reads (a MoE layer's experts read the output of the norm before its router,
 * a lora op the x of its matmul). With norm_sums_spans alone, only after an attention of
 * several-token spans: there it measured faster than the norm's launch on an H100 and an H200,
 * in steps of one token a sequence faster on the one and slower on the other (bench/RESULTS.md). */
static bool sums_feed_norm(const struct cu_fuse_config *cfg, const struct cu_op *ops, int m, int n)
{
    if (!(cfg->norm_sums || cfg->norm_sums_spans) || m < 0 || m + 3 >= n ||
        !adds_into_residual(ops, m, n))
        return false;
    const struct cu_op *mm = &ops[m], *add = &ops[m + 1], *norm = &ops[m + 2];
    const struct cu_op *next = &ops[m + 3];
    if (!uses_skinny(cfg, mm) || mm->n_rows > CU_SKINNY_MAX_ROWS || norm->kind != CU_RMSNORM ||
        norm->u.norm.x != add->u.ew.out || norm->u.norm.y == norm->u.norm.x ||
        norm->u.norm.n_rows != mm->n_rows || norm->u.norm.dim != mm->u.mm.m[0].rows ||
        norm->u.norm.dim > CU_NORM_SUMS_MAX_DIM)
        return false;
    if (next->kind != CU_MATMUL || !uses_skinny(cfg, next) || next->n_rows != mm->n_rows ||
        next->u.mm.x != norm->u.norm.y || next->u.mm.cols != norm->u.norm.dim)
        return false;
    if (!cfg->norm_sums && !after_span_attention(ops, m))
        return false;
    return next_use(ops, m + 4, n, norm->u.norm.y, norm->u.norm.n_rows * norm->u.norm.dim,
                    false) != USE_READ;
}

/* Whether a FAST Q4_K or Q6_K GEMV of up to CU_GEMV_MAX_ROWS rows, one of
 * the stream kernel's weight types. */
static bool stream_type_gemv(const struct cu_fuse_config *cfg, const struct cu_op *op)
{
    const int dt = op->u.mm.dtype;
    return cfg->fast && op->kind == CU_MATMUL && (dt == DTYPE_Q4_K || dt == DTYPE_Q6_K) &&
           op->n_rows <= CU_GEMV_MAX_ROWS && uses_gemv(cfg, op);
}

/* Rule 3's mix: the matmul at ops[m + 1] reads the x of the one at ops[m]
 * into other outputs with the other stream type (Q4_K_M's v after q and k),
 * wants no epilogue of its own, and both fit one launch. */
static bool mixes_with_next(const struct cu_fuse_config *cfg, const struct cu_op *ops, int m,
                            int n)
{
    if (!cfg->qgemv_mixed || m + 1 >= n)
        return false;
    const struct cu_op *a = &ops[m], *b = &ops[m + 1];
    if (!stream_type_gemv(cfg, a) || !stream_type_gemv(cfg, b) || a->u.mm.dtype == b->u.mm.dtype ||
        b->u.mm.x != a->u.mm.x || b->u.mm.cols != a->u.mm.cols || b->n_rows != a->n_rows ||
        a->u.mm.n + b->u.mm.n > CU_GROUP_MAX)
        return false;
    struct cu_launch alone;
    memset(&alone, 0, sizeof alone);
    return plan_gemv(cfg, ops, m + 1, n, &alone) == 1;
}

/* The GEMV launch of the matmul at ops[m] with rule 3's epilogue or mix;
 * returns the ops covered from m. */
static int plan_gemv(const struct cu_fuse_config *cfg, const struct cu_op *ops, int m, int n,
                     struct cu_launch *l)
{
    const struct cu_op *op = &ops[m];
    const struct cu_op *next = m + 1 < n ? &ops[m + 1] : NULL;
    int64_t out_n = (int64_t)op->n_rows * op->u.mm.m[0].rows;
    l->kind = CU_LAUNCH_GEMV;
    if (adds_into_residual(ops, m, n)) {
        l->residual = true;
        l->norm_sums = l->skinny && sums_feed_norm(cfg, ops, m, n);
        return 2;
    }
    if (next && op->u.mm.n == 2 && next->kind == CU_SILU_MUL &&
        op->u.mm.m[0].rows == op->u.mm.m[1].rows && !op->u.mm.m[0].bias &&
        !op->u.mm.m[1].bias && next->u.ew.a == op->u.mm.m[0].y &&
        next->u.ew.b == op->u.mm.m[1].y && next->u.ew.out == op->u.mm.m[0].y &&
        next->u.ew.n == out_n) {
        l->swiglu = true;
        return 2;
    }
    if (mixes_with_next(cfg, ops, m, n)) {
        l->mixed = true;
        return 2;
    }
    return 1;
}

/* Rule 6: the RMSNorm or SiLU-mul at ops[p] writes all of the x of the cuBLASLt GEMM (bf16 or
 * block-quantized weights: x converted to bf16) at ops[p + 1]. */
static bool feeds_gemm_x(const struct cu_fuse_config *cfg, const struct cu_op *ops, int p, int n)
{
    if (!cfg->gemm_x || p + 1 >= n)
        return false;
    const struct cu_op *op = &ops[p], *mm = &ops[p + 1];
    if (!cu_fuse_uses_gemm(cfg, mm) || mm->u.mm.dtype == DTYPE_F32)
        return false;
    int64_t n_x = (int64_t)mm->n_rows * mm->u.mm.cols;
    if (op->kind == CU_RMSNORM)
        return mm->u.mm.x == op->u.norm.y && (int64_t)op->u.norm.n_rows * op->u.norm.dim == n_x;
    if (op->kind == CU_SILU_MUL)
        return mm->u.mm.x == op->u.ew.out && op->u.ew.n == n_x;
    return false;
}

/* Rule 6's launch at ops[p], whose GEMM is ops[p + 1]: whether the f32 output (n floats at
 * out) is dead once that GEMM has read its bf16 copy, so only the copy is written. */
static bool gemm_x_only(const struct cu_op *ops, int p, int n, const float *out, int64_t n_floats)
{
    return dead_from(ops, p + 1, n, out, n_floats, true);
}

/* Rule 10: the cuBLASLt GEMM of a gate/up pair at ops[i] (bf16 or block weights, no biases),
 * whose SiLU-mul at ops[i + 1] writes the x of the GEMM after it in bf16 only (rule 6): gate
 * and up are read by that SiLU-mul alone, so the GEMM may write them in bf16. */
static bool swiglu_from_bf16(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i,
                             int n)
{
    if (!cfg->gemm_bf16_swiglu || i < 0 || i + 2 >= n)
        return false;
    const struct cu_op *mm = &ops[i], *silu = &ops[i + 1];
    if (!cu_fuse_uses_gemm(cfg, mm) || mm->u.mm.dtype == DTYPE_F32 || mm->u.mm.n != 2 ||
        mm->u.mm.m[0].bias || mm->u.mm.m[1].bias || silu->kind != CU_SILU_MUL)
        return false;
    const int64_t n_out = (int64_t)mm->n_rows * mm->u.mm.m[0].rows;
    if (mm->u.mm.m[1].rows != mm->u.mm.m[0].rows || silu->u.ew.a != mm->u.mm.m[0].y ||
        silu->u.ew.b != mm->u.mm.m[1].y || silu->u.ew.n != n_out ||
        !feeds_gemm_x(cfg, ops, i + 1, n))
        return false;
    return gemm_x_only(ops, i + 1, n, silu->u.ew.out, n_out) &&
           dead_from(ops, i + 2, n, silu->u.ew.a, n_out, true) &&
           dead_from(ops, i + 2, n, silu->u.ew.b, n_out, true);
}

/* Rule 11: the cuBLASLt GEMM of one matrix (no bias) at ops[i] whose product the add after
 * it adds into the residual stream, where nothing reads the product after that add before it
 * is overwritten: the GEMM adds into the stream itself. */
static bool gemm_adds_residual(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i,
                               int n)
{
    if (!cfg->gemm_residual || !cu_fuse_uses_gemm(cfg, &ops[i]) || !adds_into_residual(ops, i, n))
        return false;
    const struct cu_op *mm = &ops[i], *add = &ops[i + 1];
    return !mm->u.mm.m[0].bias &&
           !ranges_meet(floats_at(mm->u.mm.x, (int64_t)mm->n_rows * mm->u.mm.cols),
                        floats_at(add->u.ew.out, add->u.ew.n)) &&
           dead_from(ops, i + 2, n, mm->u.mm.m[0].y, add->u.ew.n, false);
}

/* Whether rule 2 takes the RMSNorm at ops[i] into the GEMV after it (not when a lora op
 * after the matmul reads the norm's output, which the folded norm never writes). */
static bool norm_folds(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i, int n)
{
    const struct cu_op *op = &ops[i];
    return op->kind == CU_RMSNORM && i + 1 < n && norm_feeds_gemv(cfg, op, &ops[i + 1]) &&
           !(i + 2 < n && ops[i + 2].kind == CU_LORA && ops[i + 2].u.lora.x == op->u.norm.y);
}

/* Rule 4: the add at ops[i] and the RMSNorm after it of every row of the sum, unless rule 2
 * takes that norm. */
static bool add_feeds_norm(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i, int n)
{
    if (!cfg->add_norm || ops[i].kind != CU_ADD || i + 1 >= n || ops[i + 1].kind != CU_RMSNORM)
        return false;
    const struct cu_op *norm = &ops[i + 1];
    if (norm->u.norm.x != ops[i].u.ew.out ||
        (int64_t)norm->u.norm.n_rows * norm->u.norm.dim != ops[i].u.ew.n)
        return false;
    return !norm_folds(cfg, ops, i + 1, n);
}

/* Rule 5's adapter group: the lora op at ops[i] and those right after it over the same
 * x (a layer's q/k/v or gate/up adapters), up to CU_LORA_MAX_GROUP, each writing its own
 * y (the launch's expands run after all its shrinks: a y may be an x). */
static int lora_group(const struct cu_op *ops, int i, int n)
{
    const struct cu_op *first = &ops[i];
    int k = 1;
    while (k < CU_LORA_MAX_GROUP && i + k < n) {
        const struct cu_op *op = &ops[i + k];
        bool fits = op->kind == CU_LORA && op->u.lora.x == first->u.lora.x &&
                    op->u.lora.in == first->u.lora.in;
        for (int j = 0; fits && j < k; j++)
            fits = ops[i + j].u.lora.y != op->u.lora.y;
        if (!fits)
            break;
        k++;
    }
    return k;
}

bool cu_lora_rows_layout_of(int64_t dim, const struct cu_op *const in[2], const struct cu_op *out,
                            int n_out, int max_bytes, struct cu_lora_rows_layout *lay)
{
    memset(lay, 0, sizeof *lay);
    if (dim < 8 || dim % 8 != 0)
        return false;
    int64_t slice = (dim + CU_LORA_ROWS_CLUSTER - 1) / CU_LORA_ROWS_CLUSTER;
    slice = (slice + 7) / 8 * 8;
    lay->dim = dim;
    lay->slice = slice;
    int64_t off = 0;
    for (int j = 0; j < 2 + n_out && j < 2 + CU_LORA_MAX_GROUP; j++) {
        const struct cu_op *op = j < 2 ? in[j] : &out[j - 2];
        lay->segs[j] = (uint32_t)off;
        if (op)
            off += (int64_t)op->u.lora.n_segs * (int64_t)sizeof(struct cu_lora_seg);
    }
    lay->y = (uint32_t)off;
    off += slice * (int64_t)sizeof(float);
    for (int i = 0; i < 2; i++) {
        if (!in[i])
            continue;
        lay->b_in[i] = (uint32_t)off;
        off += slice * in[i]->u.lora.rank_max * 2;
        lay->u_in[i] = (uint32_t)off;
        off += (int64_t)in[i]->u.lora.rank_max * (int64_t)sizeof(float);
    }
    int64_t part = 0;
    for (int j = 0; j < n_out && j < CU_LORA_MAX_GROUP; j++) {
        lay->a_out[j] = (uint32_t)off;
        off += (int64_t)out[j].u.lora.rank_max * slice * 2;
        part += out[j].u.lora.rank_sum;
    }
    lay->part = (uint32_t)off; /* each block's partial sum of an item, eight to an item */
    lay->items = (uint32_t)part;
    off += (part + CU_LORA_ROWS_CLUSTER - 1) / CU_LORA_ROWS_CLUSTER * CU_LORA_ROWS_CLUSTER *
           (int64_t)sizeof(float);
    off = (off + 15) / 16 * 16;
    lay->bytes = (uint32_t)(off < UINT32_MAX ? off : UINT32_MAX);
    return n_out <= CU_LORA_MAX_GROUP && off <= max_bytes;
}

/* Rule 7: whether the row kernels can read lora op op over up to rows rows. */
static bool lora_rows_ready(const struct cu_fuse_config *cfg, const struct cu_op *op, int64_t rows)
{
    return cfg->lora_rows && op->kind == CU_LORA && op->u.lora.rows_ok && op->n_rows <= rows;
}

/* Rule 7's shrink in the launch of the row op at ops[p] (an RMSNorm, or a SiLU-mul that
 * no GEMV launch takes in): the lora group two ops on, after a matmul that reads the row
 * op's output, over that output. Returns the group's ops; 0 when there is none to take. */
static int lora_shrink_after(const struct cu_fuse_config *cfg, const struct cu_op *ops, int p,
                             int n)
{
    if (!cfg->lora_rows || p + 2 >= n || ops[p + 1].kind != CU_MATMUL ||
        ops[p + 2].kind != CU_LORA)
        return 0;
    const struct cu_op *row = &ops[p], *mm = &ops[p + 1];
    const int64_t dim = mm->u.mm.cols;
    const float *x;
    int64_t rows;
    if (row->kind == CU_RMSNORM && row->u.norm.dim == dim) {
        x = row->u.norm.y;
        rows = row->u.norm.n_rows;
    } else if (row->kind == CU_SILU_MUL && dim > 0 && row->u.ew.n % dim == 0 &&
               !(p > 0 && ops[p - 1].kind == CU_MATMUL && uses_gemv(cfg, &ops[p - 1]))) {
        x = row->u.ew.out;
        rows = row->u.ew.n / dim;
    } else {
        return 0;
    }
    if (mm->u.mm.x != x || mm->n_rows != rows)
        return 0;
    int k = lora_group(ops, p + 2, n);
    for (int j = 0; j < k; j++) {
        const struct cu_op *lo = &ops[p + 2 + j];
        if (!lora_rows_ready(cfg, lo, rows) || lo->u.lora.x != x || lo->u.lora.in != dim)
            return 0;
    }
    const struct cu_op *none[2] = {NULL, NULL};
    struct cu_lora_rows_layout lay;
    return cu_lora_rows_layout_of(dim, none, &ops[p + 2], k, cfg->lora_rows_smem, &lay) ? k : 0;
}

/* Rule 7's expand folded into the row launch after the lora group ops[i, i + k): the
 * add-and-RMSNorm whose addend is the one op's y (rows of dim), or the SiLU-mul reading
 * the ops' ys as gate and up; in[] gets the op expanded into each of its two inputs.
 * Returns the ops the launch covers (the group's and the row ops), 0 when not taken. */
static int lora_expand_into(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i,
                            int k, int n, const struct cu_op *in[2])
{
    in[0] = in[1] = NULL;
    if (!cfg->lora_rows || i + k >= n)
        return 0;
    const struct cu_op *row = &ops[i + k];
    int64_t dim, rows;
    int covers, row_op;
    if (k == 1 && row->kind == CU_ADD && add_feeds_norm(cfg, ops, i + 1, n)) {
        const struct cu_op *norm = &ops[i + 2];
        dim = norm->u.norm.dim;
        rows = norm->u.norm.n_rows;
        if (ops[i].u.lora.y != row->u.ew.a || row->u.ew.out == row->u.ew.a)
            return 0;
        in[0] = &ops[i];
        covers = 3;
        row_op = i + 2; /* the norm */
    } else if (row->kind == CU_SILU_MUL && k <= 2) {
        dim = ops[i].u.lora.out;
        if (dim <= 0 || row->u.ew.n % dim != 0 || row->u.ew.out != row->u.ew.a)
            return 0;
        rows = row->u.ew.n / dim;
        for (int j = 0; j < k; j++) {
            const struct cu_op *lo = &ops[i + j];
            int slot = lo->u.lora.y == row->u.ew.a ? 0 : lo->u.lora.y == row->u.ew.b ? 1 : -1;
            if (slot < 0 || in[slot] || lo->u.lora.out != dim)
                return 0;
            in[slot] = lo;
        }
        covers = k + 1;
        row_op = i + k;
    } else {
        return 0;
    }
    for (int j = 0; j < 2; j++)
        if (in[j] && (!lora_rows_ready(cfg, in[j], rows) || in[j]->u.lora.out != dim))
            return 0;
    int n_out = lora_shrink_after(cfg, ops, row_op, n);
    struct cu_lora_rows_layout lay;
    if (!cu_lora_rows_layout_of(dim, in, &ops[row_op + 2], n_out, cfg->lora_rows_smem, &lay)) {
        in[0] = in[1] = NULL;
        return 0;
    }
    return covers;
}

/* Rule 8: the routing at ops[i] (a launch of its own) and the experts right after it
 * that read its ids and weights, of the same rows. */
static bool routes_next(const struct cu_op *ops, int i, int n)
{
    if (i + 1 >= n || ops[i + 1].kind != CU_MOE_FFN)
        return false;
    const struct cu_op *route = &ops[i], *moe = &ops[i + 1];
    return moe->u.moe.ids == route->u.route.ids && moe->u.moe.weights == route->u.route.weights &&
           moe->n_rows == route->n_rows && moe->u.moe.n_experts == route->u.route.n_experts &&
           moe->u.moe.top_k == route->u.route.top_k;
}

/* Rule 8: the experts at ops[i] and the residual add right after them of their whole
 * output (res += y, res neither y nor the experts' x). */
static bool moe_takes_add(const struct cu_op *ops, int i, int n)
{
    if (i + 1 >= n || ops[i + 1].kind != CU_ADD)
        return false;
    const struct cu_op *moe = &ops[i], *add = &ops[i + 1];
    return add->u.ew.a == moe->u.moe.y && add->u.ew.n == (int64_t)moe->n_rows * moe->u.moe.hidden &&
           add->u.ew.out != moe->u.moe.y && add->u.ew.out != moe->u.moe.x;
}

/* Rule 6's launch l of the row op at ops[p]: only the bf16 copy where the f32 output is dead
 * (not with rule 7's adapter work, whose launches write both). */
static void plan_x_only(const struct cu_op *ops, int p, int n, struct cu_launch *l)
{
    const struct cu_op *op = &ops[p];
    if (!l->to_gemm_x || l->lora_in || l->lora_out)
        return;
    l->x_bf16_only = op->kind == CU_RMSNORM
                         ? gemm_x_only(ops, p, n, op->u.norm.y, op->u.norm.n_rows * op->u.norm.dim)
                         : gemm_x_only(ops, p, n, op->u.ew.out, op->u.ew.n);
}

/* Rule 7: the shrink the row launch at ops[p] (its row op) does, into l. */
static void plan_lora_out(const struct cu_fuse_config *cfg, const struct cu_op *ops, int p, int n,
                          struct cu_launch *l)
{
    l->lora_out = lora_shrink_after(cfg, ops, p, n);
    l->lora_out_op = l->lora_out ? p + 2 : 0;
}

int cu_fuse_next(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i, int n,
                 struct cu_launch *out)
{
    struct cu_launch *l = out;
    memset(l, 0, sizeof *l);
    l->op = i;
    const struct cu_op *op = &ops[i];
    int used = match_qk(ops, i, n, &l->qk);
    if (used > 0 && cfg->qk_attention && i + used < n &&
        cu_attention_takes_qk(&ops[i + used], &l->qk) &&
        (cfg->qk_spans || ops[i + used].u.attn.max_span_tokens == 1)) {
        l->kind = CU_LAUNCH_QK_ATTENTION;
        return l->n_ops = used + 1;
    }
    if (used > 0) {
        l->kind = CU_LAUNCH_QK;
        return l->n_ops = used;
    }
    if (op->kind == CU_RMSNORM && sums_feed_norm(cfg, ops, i - 2, n)) {
        l->norm = true;
        l->skinny = true;
        return l->n_ops = 1 + plan_gemv(cfg, ops, i + 1, n, l);
    }
    if (norm_folds(cfg, ops, i, n)) {
        l->norm = true;
        return l->n_ops = 1 + plan_gemv(cfg, ops, i + 1, n, l);
    }
    if (add_feeds_norm(cfg, ops, i, n)) {
        l->kind = CU_LAUNCH_ADD_RMSNORM;
        l->to_gemm_x = feeds_gemm_x(cfg, ops, i + 1, n);
        plan_lora_out(cfg, ops, i + 1, n, l);
        plan_x_only(ops, i + 1, n, l);
        return l->n_ops = 2;
    }
    switch (op->kind) {
    case CU_EMBED: l->kind = CU_LAUNCH_EMBED; break;
    case CU_RMSNORM:
        l->kind = CU_LAUNCH_RMSNORM;
        l->to_gemm_x = feeds_gemm_x(cfg, ops, i, n);
        plan_lora_out(cfg, ops, i, n, l);
        plan_x_only(ops, i, n, l);
        break;
    case CU_ROPE:
        l->kind = CU_LAUNCH_ROPE;
        memset(&l->qk, 0, sizeof l->qk);
        l->qk.q = op->u.rope.x;
        l->qk.n_q_heads = op->u.rope.n_heads;
        l->qk.head_dim = op->u.rope.head_dim;
        l->qk.rot_dim = op->u.rope.rot_dim;
        l->qk.n_rows = op->n_rows;
        l->qk.pos_off = op->u.rope.pos_off;
        l->qk.freq_off = op->u.rope.freq_off;
        l->qk.factor = op->u.rope.factor;
        l->qk.long_from = op->u.rope.long_from;
        break;
    case CU_SILU_MUL:
        l->kind = CU_LAUNCH_SILU_MUL;
        l->to_gemm_x = feeds_gemm_x(cfg, ops, i, n);
        plan_lora_out(cfg, ops, i, n, l);
        plan_x_only(ops, i, n, l);
        l->from_bf16 = swiglu_from_bf16(cfg, ops, i - 1, n);
        break;
    case CU_ADD: l->kind = CU_LAUNCH_ADD; break;
    case CU_KV_STORE: l->kind = CU_LAUNCH_KV_STORE; break;
    case CU_ATTENTION: l->kind = CU_LAUNCH_ATTENTION; break;
    case CU_KV_COPY: l->kind = CU_LAUNCH_KV_COPY; break;
    case CU_MOE_ROUTE: l->kind = CU_LAUNCH_MOE_ROUTE; break;
    case CU_MOE_FFN:
        l->kind = CU_LAUNCH_MOE_FFN;
        l->after_routing = i > 0 && routes_next(ops, i - 1, n);
        l->residual = moe_takes_add(ops, i, n);
        return l->n_ops = 1 + l->residual;
    case CU_GATED_ADD: l->kind = CU_LAUNCH_GATED_ADD; break;
    case CU_GELU_TANH_MUL: l->kind = CU_LAUNCH_GELU_TANH_MUL; break;
    case CU_SCALE: l->kind = CU_LAUNCH_SCALE; break;
    case CU_SOFTCAP: l->kind = CU_LAUNCH_SOFTCAP; break;
    case CU_LORA: {
        int k = lora_group(ops, i, n);
        l->lora_in_shrunk =
            i >= 2 && ops[i - 1].kind == CU_MATMUL && lora_shrink_after(cfg, ops, i - 2, n) == k;
        const struct cu_op *in[2];
        int covers = lora_expand_into(cfg, ops, i, k, n, in);
        if (covers == 0) {
            l->kind = CU_LAUNCH_LORA;
            return l->n_ops = k;
        }
        const int row_op = i + covers - 1; /* the norm, or the SiLU-mul */
        l->kind = ops[row_op].kind == CU_RMSNORM ? CU_LAUNCH_ADD_RMSNORM : CU_LAUNCH_SILU_MUL;
        l->lora_in = k;
        l->to_gemm_x = feeds_gemm_x(cfg, ops, row_op, n);
        plan_lora_out(cfg, ops, row_op, n, l);
        return l->n_ops = covers;
    }
    case CU_LAYER_NORM: l->kind = CU_LAUNCH_LAYER_NORM; break;
    case CU_GELU: l->kind = CU_LAUNCH_GELU; break;
    case CU_ATTN_DENSE: l->kind = CU_LAUNCH_ATTN_DENSE; break;
    case CU_SCATTER_ROWS: l->kind = CU_LAUNCH_SCATTER_ROWS; break;
    case CU_MATMUL:
        if (!uses_gemv(cfg, op)) {
            l->kind = CU_LAUNCH_GEMM;
            l->y_bf16 = swiglu_from_bf16(cfg, ops, i, n);
            l->residual = gemm_adds_residual(cfg, ops, i, n);
            return l->n_ops = 1 + l->residual;
        }
        l->skinny = uses_skinny(cfg, op);
        return l->n_ops = plan_gemv(cfg, ops, i, n, l);
    default:
        return 0;
    }
    return l->n_ops = 1;
}

int cu_fuse_plan(const struct cu_fuse_config *cfg, const struct cu_op *ops, int n,
                 struct cu_launch *out, int cap)
{
    int count = 0;
    for (int i = 0; i < n; count++) {
        struct cu_launch l;
        int used = cu_fuse_next(cfg, ops, i, n, &l);
        if (used <= 0)
            return -1;
        if (count < cap)
            out[count] = l;
        i += used;
    }
    return count;
}
