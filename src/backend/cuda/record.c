/* backend/cuda/record.c — recording the CUDA backend's ops: the op list, the parameter arena's contents, attention split counts. */
#include "backend/cuda/record.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* Positions per decode-attention split at least: fewer, longer splits at
 * short contexts (64 measured ahead of 32 and 128 on an H200 after a
 * 512-token prompt). */
#define ATTN_MIN_CHUNK 64
#define ATTN_QUANT_BLOCKS 8

static void rec_fail(struct cu_rec *rec, int code, const char *fmt, ...)
{
    char msg[sizeof ((struct err *)0)->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rec->hooks->fail(rec, code, msg);
}

void cu_rec_free(struct cu_rec *rec)
{
    free(rec->ops);
    free(rec->blob);
    rec->ops = NULL;
    rec->blob = NULL;
    rec->n_ops = rec->cap_ops = 0;
    rec->blob_cap = 0;
}

void cu_rec_clear(struct cu_rec *rec)
{
    rec->n_ops = 0;
    rec->arena_used = 0;
    rec->lora_u_max = 0;
    if (rec->n_dedup)
        memset(rec->dedup, 0, sizeof rec->dedup);
    rec->n_dedup = 0;
}

/* ---- the parameter arena ------------------------------------------------ */

/* The dedup slot to probe first for key. */
static unsigned dedup_slot(const void *key)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 32) & (CU_DEDUP_SLOTS - 1);
}

/* Copies bytes of src into the arena (reserving padded bytes, zero-filled
 * past bytes) and returns its offset; the same key and contents already put
 * during this step are reused. Callers have made room (arena_room). */
static uint32_t arena_put(struct cu_rec *rec, const void *key, const void *src, size_t bytes,
                          size_t padded)
{
    unsigned slot = key ? dedup_slot(key) : 0;
    for (; key && rec->dedup[slot].key; slot = (slot + 1) & (CU_DEDUP_SLOTS - 1)) {
        const struct cu_dedup *d = &rec->dedup[slot];
        if (d->key == key && d->bytes == bytes && !memcmp(rec->arena + d->off, src, bytes))
            return d->off;
    }
    if (padded < bytes)
        padded = bytes;
    size_t off = (rec->arena_used + 15) & ~(size_t)15;
    memcpy(rec->arena + off, src, bytes);
    memset(rec->arena + off + bytes, 0, padded - bytes);
    rec->arena_used = off + padded;
    if (key && rec->n_dedup < CU_DEDUP_SLOTS / 2) { /* slot: the probe's empty end */
        rec->dedup[slot] = (struct cu_dedup){.key = key, .bytes = bytes, .off = (uint32_t)off};
        rec->n_dedup++;
    }
    return (uint32_t)off;
}

static size_t pow2_at_least(size_t n, size_t min)
{
    size_t p = min;
    while (p < n)
        p *= 2;
    return p;
}

/* Arena bytes the spans and their block tables may take. */
static size_t spans_bytes(const struct attn_span *spans, int n_spans, int n_rows)
{
    size_t total = (size_t)n_spans * sizeof(struct cu_span) + (size_t)n_rows * sizeof(int) + 32;
    for (int s = 0; s < n_spans; s++)
        total += pow2_at_least((size_t)spans[s].n_block_ids, 16) * sizeof(uint32_t) + 16;
    return total;
}

/* Puts the spans (with their block tables, padded to powers of two so a
 * growing context keeps the arena's layout) and the row -> span map. */
static uint32_t put_spans(struct cu_rec *rec, const struct attn_span *spans, int n_spans,
                          int n_rows)
{
    size_t blob = (size_t)n_spans * sizeof(struct cu_span) + (size_t)n_rows * sizeof(int);
    if (blob > rec->blob_cap) {
        uint8_t *grown = realloc(rec->blob, blob);
        if (!grown) {
            rec_fail(rec, INFERD_ENOMEM, "out of host memory for %d attention spans", n_spans);
            return 0;
        }
        rec->blob = grown;
        rec->blob_cap = blob;
    }
    struct cu_span *cs = (struct cu_span *)rec->blob;
    int *rowmap = (int *)(cs + n_spans);
    memset(cs, 0, (size_t)n_spans * sizeof *cs);
    for (int r = 0; r < n_rows; r++)
        rowmap[r] = -1;
    for (int s = 0; s < n_spans; s++) {
        const struct attn_span *sp = &spans[s];
        cs[s].row0 = sp->row0;
        cs[s].n_tokens = sp->n_tokens;
        cs[s].pos0 = sp->pos0;
        cs[s].n_blocks = sp->n_block_ids;
        cs[s].bt_off = arena_put(rec, sp->block_ids, sp->block_ids,
                                 (size_t)sp->n_block_ids * sizeof(uint32_t),
                                 pow2_at_least((size_t)sp->n_block_ids, 16) * sizeof(uint32_t));
        for (int i = 0; i < sp->n_tokens; i++)
            if (sp->row0 + i < n_rows)
                rowmap[sp->row0 + i] = s;
    }
    return arena_put(rec, spans, rec->blob, blob, blob);
}

static int spans_rows(const struct attn_span *spans, int n_spans)
{
    int rows = 0;
    for (int s = 0; s < n_spans; s++)
        if (spans[s].row0 + spans[s].n_tokens > rows)
            rows = spans[s].row0 + spans[s].n_tokens;
    return rows;
}

/* ---- recording ---------------------------------------------------------- */

static struct cu_op *op_new(struct cu_rec *rec, int kind, int n_rows)
{
    if (rec->n_ops == rec->cap_ops) {
        int cap = rec->cap_ops ? rec->cap_ops * 2 : 1024;
        struct cu_op *grown = realloc(rec->ops, (size_t)cap * sizeof *grown);
        if (!grown) {
            rec_fail(rec, INFERD_ENOMEM, "out of host memory recording GPU work");
            return NULL;
        }
        rec->ops = grown;
        rec->cap_ops = cap;
    }
    struct cu_op *op = &rec->ops[rec->n_ops++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->n_rows = n_rows;
    return op;
}

void cu_rec_embed(struct cu_rec *rec, const struct weight_matrix *table, const int32_t *tokens,
                  int64_t n_tokens, float *out)
{
    if (!rec->hooks->ok(rec) || n_tokens <= 0 ||
        !rec->hooks->arena_room(rec, (size_t)n_tokens * 4 + 32))
        return;
    uint32_t off = arena_put(rec, tokens, tokens, (size_t)n_tokens * sizeof(int32_t), 0);
    struct cu_op *op = op_new(rec, CU_EMBED, (int)n_tokens);
    if (!op)
        return;
    op->u.embed.table = table->data;
    op->u.embed.cols = table->cols;
    op->u.embed.dtype = table->dtype;
    op->u.embed.tok_off = off;
    op->u.embed.out = out;
}

static void record_matmul(struct cu_rec *rec, const float *x, int64_t n_tokens, int n,
                          const struct weight_matrix *const *w, const float *const *bias,
                          float *const *y)
{
    if (!rec->hooks->ok(rec) || n_tokens <= 0)
        return;
    struct cu_op *op = op_new(rec, CU_MATMUL, (int)n_tokens);
    if (!op)
        return;
    op->u.mm.x = x;
    op->u.mm.cols = w[0]->cols;
    op->u.mm.dtype = w[0]->dtype;
    op->u.mm.n = n;
    for (int i = 0; i < n; i++) {
        op->u.mm.m[i].w = w[i]->data;
        op->u.mm.m[i].rows = w[i]->rows;
        op->u.mm.m[i].bias = bias ? bias[i] : NULL;
        op->u.mm.m[i].y = y[i];
    }
}

/* Matrices of one group share x, so each run of consecutive ones whose cols
 * and dtype agree is one op (one launch reads x once): q, k and v in one, or
 * q and k in one and v in another where v's type differs (Q4_K_M files). */
void cu_rec_matmul_group(struct cu_rec *rec, const float *x, int64_t n_tokens, int n,
                         const struct weight_matrix *const *w, const float *const *bias,
                         float *const *y)
{
    if (n < 1 || n > CU_GROUP_MAX) {
        rec_fail(rec, INFERD_EINVAL, "matmul group of %d matrices (at most %d)", n, CU_GROUP_MAX);
        return;
    }
    for (int i = 0, run; i < n; i += run) {
        for (run = 1; i + run < n; run++)
            if (w[i + run]->cols != w[i]->cols || w[i + run]->dtype != w[i]->dtype)
                break;
        record_matmul(rec, x, n_tokens, run, &w[i], bias ? &bias[i] : NULL, &y[i]);
    }
}

/* A row norm (rmsnorm, or layer_norm with its bias b). */
static void record_norm(struct cu_rec *rec, int kind, const float *x, const float *weight,
                        const float *bias, int64_t n_rows, int64_t dim, float eps, float *y)
{
    if (!rec->hooks->ok(rec))
        return;
    struct cu_op *op = op_new(rec, kind, (int)(n_rows < INT32_MAX ? n_rows : INT32_MAX));
    if (!op)
        return;
    op->u.norm.x = x;
    op->u.norm.w = weight;
    op->u.norm.b = bias;
    op->u.norm.n_rows = n_rows;
    op->u.norm.dim = dim;
    op->u.norm.eps = eps;
    op->u.norm.y = y;
}

void cu_rec_rmsnorm(struct cu_rec *rec, const float *x, const float *weight, int64_t n_rows,
                    int64_t dim, float eps, float *y)
{
    record_norm(rec, CU_RMSNORM, x, weight, NULL, n_rows, dim, eps, y);
}

void cu_rec_rope(struct cu_rec *rec, float *x, int64_t n_tokens, int n_heads, int head_dim,
                 const int32_t *positions, const struct rope_table *rope)
{
    if (!rec->hooks->ok(rec) || n_tokens <= 0)
        return;
    if (head_dim > CU_MAX_HEAD_DIM || rope->rot_dim > head_dim) {
        rec_fail(rec, INFERD_EUNSUPPORTED, "head_dim %d exceeds the CUDA backend's %d", head_dim,
                 CU_MAX_HEAD_DIM);
        return;
    }
    /* longrope: the short frequencies, then the long ones */
    size_t n_freq = (size_t)rope->rot_dim / (rope->long_from > 0 ? 1 : 2);
    if (!rec->hooks->arena_room(rec, (size_t)n_tokens * 4 + n_freq * 4 + 64))
        return;
    uint32_t pos_off = arena_put(rec, positions, positions, (size_t)n_tokens * sizeof(int32_t), 0);
    uint32_t freq_off = arena_put(rec, rope->inv_freq, rope->inv_freq, n_freq * sizeof(float), 0);
    struct cu_op *op = op_new(rec, CU_ROPE, (int)n_tokens);
    if (!op)
        return;
    op->u.rope.x = x;
    op->u.rope.n_heads = n_heads;
    op->u.rope.head_dim = head_dim;
    op->u.rope.rot_dim = rope->rot_dim;
    op->u.rope.pos_off = pos_off;
    op->u.rope.freq_off = freq_off;
    op->u.rope.factor = rope->attention_factor;
    op->u.rope.long_from = rope->long_from;
}

static void record_ew(struct cu_rec *rec, int kind, const float *a, const float *b, float *out,
                      int64_t n)
{
    if (!rec->hooks->ok(rec) || n <= 0)
        return;
    struct cu_op *op = op_new(rec, kind, 0);
    if (!op)
        return;
    op->u.ew.a = a;
    op->u.ew.b = b;
    op->u.ew.out = out;
    op->u.ew.n = n;
}

void cu_rec_silu_mul(struct cu_rec *rec, const float *gate, const float *up, float *out,
                     int64_t n)
{
    record_ew(rec, CU_SILU_MUL, gate, up, out, n);
}

void cu_rec_add(struct cu_rec *rec, float *y, const float *x, int64_t n)
{
    record_ew(rec, CU_ADD, x, NULL, y, n);
}

void cu_rec_gelu_tanh_mul(struct cu_rec *rec, const float *gate, const float *up, float *out,
                          int64_t n)
{
    record_ew(rec, CU_GELU_TANH_MUL, gate, up, out, n);
}

/* An in-place op on x with one float parameter. */
static void record_ew_param(struct cu_rec *rec, int kind, float *x, int64_t n, float s)
{
    if (!rec->hooks->ok(rec) || n <= 0)
        return;
    struct cu_op *op = op_new(rec, kind, 0);
    if (!op)
        return;
    op->u.ew.a = x;
    op->u.ew.out = x;
    op->u.ew.n = n;
    op->u.ew.s = s;
}

void cu_rec_scale(struct cu_rec *rec, float *x, int64_t n, float s)
{
    record_ew_param(rec, CU_SCALE, x, n, s);
}

void cu_rec_softcap(struct cu_rec *rec, float *x, int64_t n, float cap)
{
    record_ew_param(rec, CU_SOFTCAP, x, n, cap);
}

/* The cache as kernels see it; layer -1 for ops over every layer. */
static struct cu_kv kv_of(const struct cu_rec *rec, const struct kv_cache *kv, int layer)
{
    struct cu_kv c;
    memset(&c, 0, sizeof c);
    c.k = kv->k;
    c.v = kv->v;
    c.n_blocks = kv->n_blocks;
    c.block_size = kv->block_size;
    c.n_kv_heads = kv->n_kv_heads;
    c.head_dim = kv->head_dim;
    if (kv->quant) {
        c.quant = 1;
        if (layer >= 0)
            c.fmt = *kvq_layer(kv->quant, layer);
        c.k_row_bytes = (uint32_t)kv_cache_row_bytes(kv, false);
        c.v_row_bytes = (uint32_t)kv_cache_row_bytes(kv, true);
        c.seed = kv->quant->seed;
        c.cb = rec->kvq_books;
    } else {
        c.f16 = kv->dtype == DTYPE_F16;
    }
    return c;
}

void cu_rec_kv_store(struct cu_rec *rec, struct kv_cache *kv, int layer, const float *k,
                     const float *v, const struct attn_span *spans, int n_spans)
{
    int rows = spans_rows(spans, n_spans);
    if (!rec->hooks->ok(rec) || n_spans <= 0 ||
        !rec->hooks->arena_room(rec, spans_bytes(spans, n_spans, rows)))
        return;
    uint32_t off = put_spans(rec, spans, n_spans, rows);
    struct cu_op *op = op_new(rec, CU_KV_STORE, rows);
    if (!op)
        return;
    op->u.store.kv = kv_of(rec, kv, layer);
    op->u.store.layer = layer;
    op->u.store.n_spans = n_spans;
    op->u.store.k = k;
    op->u.store.v = v;
    op->u.store.spans_off = off;
}

/* The blocks of the f16 window a prefill over a quantized cache attends
 * through (every position of each span's context), or 0 where the op reads
 * the records directly: not asked for, not a prefill, a head dim the f16
 * prefill kernels lack, or a window past CU_QWINDOW_MAX_BYTES. */
static int qwindow_blocks(const struct cu_rec *rec, const struct cu_op *probe,
                          const struct attn_span *spans, int n_spans)
{
    const struct cu_kv *kv = &probe->u.attn.kv;
    if (!rec->qprefill_window || !kv->quant || !cu_attention_uses_prefill(probe) ||
        (kv->head_dim != 64 && kv->head_dim != 128))
        return 0;
    size_t blocks = 0;
    for (int s = 0; s < n_spans; s++)
        blocks += ((size_t)spans[s].pos0 + (size_t)spans[s].n_tokens + kv->block_size - 1) /
                  (size_t)kv->block_size;
    const size_t bytes =
        blocks * kv->block_size * kv->n_kv_heads * kv->head_dim * 2 * sizeof(uint16_t);
    return bytes <= CU_QWINDOW_MAX_BYTES ? (int)blocks : 0;
}

void cu_rec_attention(struct cu_rec *rec, const float *q, const struct kv_cache *kv, int layer,
                      const struct attn_span *spans, int n_spans, int n_heads, float scale,
                      int sliding_window, float *out)
{
    if (!rec->hooks->ok(rec) || n_spans <= 0)
        return;
    if (kv->head_dim > CU_MAX_HEAD_DIM || n_heads % kv->n_kv_heads) {
        rec_fail(rec, INFERD_EUNSUPPORTED, "attention with head_dim %d, %d heads over %d kv heads",
                 kv->head_dim, n_heads, kv->n_kv_heads);
        return;
    }
    int rows = spans_rows(spans, n_spans);
    int max_tokens = 0, max_ctx = 0;
    for (int s = 0; s < n_spans; s++) {
        if (spans[s].n_tokens > max_tokens)
            max_tokens = spans[s].n_tokens;
        if (spans[s].pos0 + spans[s].n_tokens > max_ctx)
            max_ctx = spans[s].pos0 + spans[s].n_tokens;
    }
    struct cu_op probe;
    memset(&probe, 0, sizeof probe);
    probe.kind = CU_ATTENTION;
    probe.n_rows = rows;
    probe.u.attn.kv = kv_of(rec, kv, layer);
    probe.u.attn.layer = layer;
    probe.u.attn.n_spans = n_spans;
    probe.u.attn.n_heads = n_heads;
    probe.u.attn.window = sliding_window;
    probe.u.attn.max_span_tokens = max_tokens;
    probe.u.attn.ctx_bucket = (int)pow2_at_least((size_t)max_ctx, 64);
    /* the split count follows the step's rows and its longest context; with
     * one split a row's sum no longer depends on either */
    probe.u.attn.row_invariant = rec->row_invariant;
    probe.u.attn.narrow = cu_attention_narrow(&probe);
    probe.u.attn.n_splits = rec->row_invariant ? 1 : cu_attention_splits(&probe, rec->n_sm);
    probe.u.attn.scale = scale;
    probe.u.attn.q = q;
    probe.u.attn.out = out;
    probe.u.attn.window_blocks = qwindow_blocks(rec, &probe, spans, n_spans);
    if (!rec->hooks->attn_scratch(rec, &probe))
        return;
    if (!rec->hooks->arena_room(rec, spans_bytes(spans, n_spans, rows)))
        return;
    probe.u.attn.spans_off = put_spans(rec, spans, n_spans, rows);
    struct cu_op *op = op_new(rec, CU_ATTENTION, rows);
    if (op)
        *op = probe;
}

void cu_rec_layer_norm(struct cu_rec *rec, const float *x, const float *weight, const float *bias,
                       int64_t n_rows, int64_t dim, float eps, float *y)
{
    if (n_rows > 0 && dim > 0)
        record_norm(rec, CU_LAYER_NORM, x, weight, bias, n_rows, dim, eps, y);
}

void cu_rec_gelu(struct cu_rec *rec, float *x, int64_t n)
{
    record_ew(rec, CU_GELU, x, NULL, x, n);
}

void cu_rec_attention_dense(struct cu_rec *rec, const float *q, int64_t n_q, const float *k,
                            const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                            int head_dim, float scale, int64_t causal, float *out)
{
    if (!rec->hooks->ok(rec) || n_q <= 0 || n_heads <= 0)
        return;
    if (n_q > INT32_MAX || n_kv <= 0) {
        rec_fail(rec, INFERD_EINVAL, "dense attention of %lld queries over %lld keys",
                 (long long)n_q, (long long)n_kv);
        return;
    }
    struct cu_op probe;
    memset(&probe, 0, sizeof probe);
    probe.kind = CU_ATTN_DENSE;
    probe.n_rows = (int)n_q;
    probe.u.dense.q = q;
    probe.u.dense.k = k;
    probe.u.dense.v = v;
    probe.u.dense.out = out;
    probe.u.dense.kv_stride = kv_stride;
    probe.u.dense.n_heads = n_heads;
    probe.u.dense.head_dim = head_dim;
    probe.u.dense.kv_bucket = (int)pow2_at_least((size_t)n_kv, CU_DENSE_MIN_BUCKET);
    int splits = 1;
    if (n_q <= CU_DENSE_SPLIT_MAX_Q) {
        splits = probe.u.dense.kv_bucket / CU_DENSE_SPLIT_KEYS;
        splits = splits < 1 ? 1 : splits > CU_DENSE_MAX_SPLITS ? CU_DENSE_MAX_SPLITS : splits;
    }
    probe.u.dense.n_splits = splits;
    probe.u.dense.scale = scale;
    if (!rec->hooks->attn_scratch(rec, &probe) || !rec->hooks->arena_room(rec, 2 * 8 + 32))
        return;
    int64_t len[2] = {n_kv, causal};
    /* no dedup key: the values change every step while the layout must not */
    probe.u.dense.len_off = arena_put(rec, NULL, len, sizeof len, 0);
    struct cu_op *op = op_new(rec, CU_ATTN_DENSE, (int)n_q);
    if (op)
        *op = probe;
}

void cu_rec_scatter_rows(struct cu_rec *rec, const float *src, int64_t n_rows, int64_t cols,
                         const int32_t *rows, float *dst)
{
    if (!rec->hooks->ok(rec) || n_rows <= 0 || cols <= 0)
        return;
    if (n_rows > INT32_MAX ||
        !rec->hooks->arena_room(rec, (size_t)n_rows * sizeof(int32_t) + 32))
        return;
    uint32_t off = arena_put(rec, rows, rows, (size_t)n_rows * sizeof(int32_t), 0);
    struct cu_op *op = op_new(rec, CU_SCATTER_ROWS, (int)n_rows);
    if (!op)
        return;
    op->u.scatter.src = src;
    op->u.scatter.dst = dst;
    op->u.scatter.cols = cols;
    op->u.scatter.idx_off = off;
}

void cu_rec_kv_copy_slots(struct cu_rec *rec, const struct kv_cache *kv, uint32_t src,
                          uint32_t dst, int n)
{
    if (!rec->hooks->ok(rec) || n <= 0)
        return;
    struct cu_op *op = op_new(rec, CU_KV_COPY, 0);
    if (!op)
        return;
    op->u.copy.kv = kv_of(rec, kv, -1);
    op->u.copy.n_layers = kv->n_layers;
    op->u.copy.n = n;
    op->u.copy.src = src;
    op->u.copy.dst = dst;
}

/* ---- attention shape rules ---------------------------------------------- */

void cu_rec_moe_route(struct cu_rec *rec, const float *logits, int64_t n_rows, int n_experts,
                      int top_k, bool norm, int32_t *ids, float *weights)
{
    if (!rec->hooks->ok(rec) || n_rows <= 0)
        return;
    struct cu_op *op = op_new(rec, CU_MOE_ROUTE, (int)n_rows);
    if (!op)
        return;
    op->u.route.logits = logits;
    op->u.route.n_experts = n_experts;
    op->u.route.top_k = top_k;
    op->u.route.norm = norm;
    op->u.route.ids = ids;
    op->u.route.weights = weights;
}

/* The experts' matrices go into the arena as one table of device pointers
 * (gate[0..n), up[0..n), down[0..n)): the kernels pick a row's expert there
 * by the id routing left in device memory, so no id crosses to the host. */
void cu_rec_moe_ffn(struct cu_rec *rec, const float *x, int64_t n_rows,
                    const struct moe_experts *ex, const int32_t *ids, const float *weights,
                    int top_k, float *scratch, float *y)
{
    size_t bytes = 3 * (size_t)ex->n_experts * sizeof(void *);
    if (!rec->hooks->ok(rec) || n_rows <= 0 || !rec->hooks->arena_room(rec, bytes + 32))
        return;
    if (bytes > rec->blob_cap) {
        uint8_t *grown = realloc(rec->blob, bytes);
        if (!grown) {
            rec_fail(rec, INFERD_ENOMEM, "out of host memory recording GPU work");
            return;
        }
        rec->blob = grown;
        rec->blob_cap = bytes;
    }
    const void **table = (const void **)(void *)rec->blob;
    enum dtype dt = ex->gate[0].dtype;
    bool vec = (dt == DTYPE_BF16 || dt == DTYPE_F32) && ex->hidden % 8 == 0 &&
               ex->inter % 8 == 0 && top_k <= CU_MOE_MAX_TOP_K &&
               ((uintptr_t)x | (uintptr_t)y | (uintptr_t)scratch) % 16 == 0;
    for (int e = 0; e < ex->n_experts; e++) {
        table[e] = ex->gate[e].data;
        table[ex->n_experts + e] = ex->up[e].data;
        table[2 * ex->n_experts + e] = ex->down[e].data;
        vec = vec && ((uintptr_t)table[e] | (uintptr_t)table[ex->n_experts + e] |
                      (uintptr_t)table[2 * ex->n_experts + e]) % 16 == 0;
    }
    uint32_t off = arena_put(rec, ex->gate, table, bytes, 0);
    struct cu_op *op = op_new(rec, CU_MOE_FFN, (int)n_rows);
    if (!op)
        return;
    op->u.moe.x = x;
    op->u.moe.hidden = ex->hidden;
    op->u.moe.inter = ex->inter;
    op->u.moe.n_experts = ex->n_experts;
    op->u.moe.top_k = top_k;
    op->u.moe.dtype = ex->gate[0].dtype;
    op->u.moe.mats_off = off;
    op->u.moe.vec = vec;
    op->u.moe.ids = ids;
    op->u.moe.weights = weights;
    op->u.moe.scratch = scratch;
    op->u.moe.y = y;
}

void cu_rec_gated_add(struct cu_rec *rec, float *y, const float *x, const float *g,
                      int64_t n_rows, int64_t dim)
{
    if (!rec->hooks->ok(rec) || n_rows <= 0)
        return;
    struct cu_op *op = op_new(rec, CU_GATED_ADD, (int)n_rows);
    if (!op)
        return;
    op->u.gated.y = y;
    op->u.gated.x = x;
    op->u.gated.g = g;
    op->u.gated.dim = dim;
}

/* The segments go into the arena as a table (device pointers, rows, the
 * scratch offset of each one's u), so a replayed graph reads the step's
 * adapters from there; the op keeps only the grid's bounds. n_rows is the
 * end of the last row any segment covers. */
void cu_rec_lora(struct cu_rec *rec, const float *x, int64_t in, int64_t out,
                 const struct lora_seg *segs, int n_segs, float *y)
{
    size_t bytes = (size_t)n_segs * sizeof(struct cu_lora_seg);
    if (!rec->hooks->ok(rec) || n_segs <= 0 || !rec->hooks->arena_room(rec, bytes + 32))
        return;
    if (bytes > rec->blob_cap) {
        uint8_t *grown = realloc(rec->blob, bytes);
        if (!grown) {
            rec_fail(rec, INFERD_ENOMEM, "out of host memory recording GPU work");
            return;
        }
        rec->blob = grown;
        rec->blob_cap = bytes;
    }
    struct cu_lora_seg *t = (struct cu_lora_seg *)(void *)rec->blob;
    memset(t, 0, bytes);
    uint32_t u_off = 0, items = 0;
    int rows = 0, rank_max = 0, rank_sum = 0;
    bool rows_ok = true;
    for (int i = 0; i < n_segs; i++) {
        const struct lora_seg *sg = &segs[i];
        t[i] = (struct cu_lora_seg){.a = sg->p.a, .b = sg->p.b, .row0 = sg->row0,
                                    .n_rows = sg->n_rows, .rank = sg->p.rank,
                                    .b_stride = sg->p.b_stride, .scale = sg->p.scale,
                                    .u_off = u_off, .item0 = items, .bf16 = sg->p.bf16};
        u_off += (uint32_t)(sg->n_rows * sg->p.rank);
        items += (uint32_t)((sg->n_rows + CU_LORA_TILE_ROWS - 1) / CU_LORA_TILE_ROWS * sg->p.rank);
        rows = sg->row0 + sg->n_rows > rows ? sg->row0 + sg->n_rows : rows;
        rank_max = sg->p.rank > rank_max ? sg->p.rank : rank_max;
        rank_sum += sg->p.rank;
        rows_ok = rows_ok && sg->p.bf16 && sg->p.rank % 8 == 0 && sg->p.b_stride % 8 == 0 &&
                  (uintptr_t)sg->p.a % 16 == 0 && (uintptr_t)sg->p.b % 16 == 0;
    }
    uint32_t off = arena_put(rec, NULL, t, bytes, 0);
    struct cu_op *op = op_new(rec, CU_LORA, rows);
    if (!op)
        return;
    op->u.lora.x = x;
    op->u.lora.y = y;
    op->u.lora.in = in;
    op->u.lora.out = out;
    op->u.lora.n_segs = n_segs;
    op->u.lora.n_items = items;
    op->u.lora.u_floats = u_off;
    if (u_off > rec->lora_u_max)
        rec->lora_u_max = u_off;
    op->u.lora.segs_off = off;
    op->u.lora.rank_max = rank_max;
    op->u.lora.rank_sum = rank_sum;
    op->u.lora.rows_ok = rows_ok;
}

bool cu_attention_uses_prefill(const struct cu_op *op)
{
    int hd = op->u.attn.kv.head_dim;
    return !op->u.attn.row_invariant && op->u.attn.max_span_tokens > CU_GEMV_MAX_ROWS &&
           hd % 4 == 0 && hd <= CU_MAX_HEAD_DIM;
}

bool cu_attention_uses_mma(const struct cu_op *op)
{
    const struct cu_kv *kv = &op->u.attn.kv;
    int hd = kv->head_dim;
    return op->kind == CU_ATTENTION && !op->u.attn.row_invariant && !cu_attention_uses_prefill(op) &&
           kv->f16 && !kv->quant && (hd == 64 || hd == 128) && op->n_rows >= CU_ATTN_MMA_MIN_ROWS &&
           op->u.attn.n_heads <= kv->n_kv_heads * CU_ATTN_MMA_MAX_GROUP;
}

bool cu_attention_narrow(const struct cu_op *op)
{
    const struct cu_kv *kv = &op->u.attn.kv;
    int hd = kv->head_dim;
    return op->kind == CU_ATTENTION && !op->u.attn.row_invariant && !kv->quant &&
           op->n_rows <= CU_GEMV_MAX_ROWS && !cu_attention_uses_prefill(op) &&
           (hd == 64 || hd == 128 || hd == 256) && op->u.attn.ctx_bucket <= CU_ATTN_NARROW_MAX_CTX;
}

int cu_attention_splits(const struct cu_op *op, int n_sm)
{
    const int ctx_bucket = op->u.attn.ctx_bucket, n_rows = op->n_rows;
    int splits = 1;
    if (op->u.attn.narrow) {
        /* a tile a split where the blocks, a query head each, fit two an SM */
        const int tile = CU_ATTN_NARROW_TILE(op->u.attn.kv.head_dim);
        while (splits < CU_ATTN_MAX_SPLITS && ctx_bucket / (splits * 2) >= tile &&
               (long)op->u.attn.n_heads * n_rows * splits * 2 <= 2L * n_sm)
            splits *= 2;
        return splits;
    }
    /* positions per split at least: ATTN_MIN_CHUNK, growing with the square
     * root of the context past 1k (2 sqrt(bucket): 128 at 4k, 256 at 16k).
     * On an H200, three shapes with 8 kv heads: after a 2k prompt splits of
     * 64 positions were 4-17% slower than 128; after 8k, splits of 512 were
     * 7-13% slower and of 128 2-5% slower than 256. A quantized cache's
     * kernel runs blocks of four warps, at most three of them an SM: it is
     * given ATTN_QUANT_BLOCKS blocks an SM, so the last wave is a small part
     * of the step, and splits of at least four of its 64-position tiles. */
    const bool quantized = op->u.attn.kv.quant != 0;
    int min_chunk = quantized ? 4 * 64 : ATTN_MIN_CHUNK;
    while (!quantized && (long)min_chunk * min_chunk < 4L * ctx_bucket)
        min_chunk *= 2;
    const long blocks = quantized ? (long)ATTN_QUANT_BLOCKS * n_sm : 2L * n_sm;
    while (splits < CU_ATTN_MAX_SPLITS && ctx_bucket / (splits * 2) >= min_chunk &&
           (long)op->u.attn.kv.n_kv_heads * n_rows * splits < blocks)
        splits *= 2;
    return splits;
}
