/* backend/cpu/attention.c — paged KV writes and causal attention read through block tables: the row kernel (an f32 cache's EXACT mode and decode), the driver of an f16 cache's group kernels and of FAST mode's tiled prefill kernels, also for the dense attention of encoder-decoder models. */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/attn_f16.h"
#include "backend/cpu/attn_tiled.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/vec_avx2.h"

/* Dense attention (attention_dense) takes the row kernel for a single query from this many keys */
#define DENSE_TILED_MIN_KEYS 128

static inline size_t kv_slot_offset(const struct kv_cache *kv, int layer, uint32_t block, int slot)
{
    return tattn_slot_offset(kv, layer, block, slot);
}

struct kv_store_job {
    struct kv_cache *kv;
    int layer;
    bool f16c;
    const float *k, *v;
    const struct attn_span *spans;
    int n_spans;
    long rows; /* the spans' rows: thread ith stores its threadpool_split share of them */
};

static void kv_store_rows(void *ctx, int ith, int nth)
{
    const struct kv_store_job *job = ctx;
    const struct kv_cache *kv = job->kv;
    size_t kv_dim = (size_t)kv->n_kv_heads * kv->head_dim;
    bool f16 = kv->dtype == DTYPE_F16;
    long begin, end;
    threadpool_split(job->rows, ith, nth, 1, &begin, &end);
    for (int s = 0; s < job->n_spans; s++) {
        const struct attn_span *sp = &job->spans[s];
        int first = begin > sp->row0 ? (int)(begin - sp->row0) : 0;
        int last = end < sp->row0 + sp->n_tokens ? (int)(end - sp->row0) : sp->n_tokens;
        for (int i = first; i < last; i++) {
            int pos = sp->pos0 + i;
            uint32_t block = sp->block_ids[pos / kv->block_size];
            size_t off = kv_slot_offset(kv, job->layer, block, pos % kv->block_size);
            size_t row = (size_t)(sp->row0 + i) * kv_dim;
            if (f16) {
                cpu_f16_from_f32((uint16_t *)kv->k + off, job->k + row, kv_dim, job->f16c);
                cpu_f16_from_f32((uint16_t *)kv->v + off, job->v + row, kv_dim, job->f16c);
            } else {
                memcpy((float *)kv->k + off, job->k + row, kv_dim * sizeof(float));
                memcpy((float *)kv->v + off, job->v + row, kv_dim * sizeof(float));
            }
        }
    }
}

void cpu_kv_store(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                  const float *v, const struct attn_span *spans, int n_spans)
{
    struct cpu_impl *impl = be->impl;
    if (kv->quant) {
        cpu_settle(be);
        cpu_kv_store_quant(be, kv, layer, k, v, spans, n_spans);
        return;
    }
    struct kv_store_job job = {kv, layer, impl->f16c, k, v, spans, n_spans, 0};
    for (int s = 0; s < n_spans; s++)
        job.rows += spans[s].n_tokens;
    /* held, the spans (host memory the step keeps) are read when the loop runs */
    if (job.rows > 0 && job.rows == impl->hold_tokens) {
        threadpool_hold(impl->pool, kv_store_rows, &job, sizeof job, job.rows);
        return;
    }
    cpu_settle(be);
    kv_store_rows(&job, 0, 1);
}

void cpu_kv_copy_slots(struct backend *be, struct kv_cache *kv, uint32_t src, uint32_t dst, int n)
{
    cpu_settle(be);
    /* the slots [0, n) of one block in one layer are contiguous */
    for (int v = 0; v < 2; v++) {
        size_t row = kv_cache_row_bytes(kv, v);
        char *base = v ? kv->v : kv->k;
        for (int layer = 0; layer < kv->n_layers; layer++) {
            size_t from = (((size_t)layer * kv->n_blocks + src) * kv->block_size) * row;
            size_t to = (((size_t)layer * kv->n_blocks + dst) * kv->block_size) * row;
            memcpy(base + to, base + from, (size_t)n * row);
        }
    }
}

struct attention_job {
    const float *q;
    const struct kv_cache *kv;
    int layer;
    const struct attn_span *spans;
    int n_spans;
    int n_heads;
    float scale;
    int sliding_window;
    float *out;
};

/* scores[j] = exp(scores[j] - shift), eight at a time. */
static void exp_shifted(float *scores, int n, float shift)
{
    __m256 vshift = _mm256_set1_ps(shift);
    int j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(scores + j, vec_exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vshift)));
    for (; j < n; j++)
        scores[j] = expf(scores[j] - shift);
}

/* One query row of one head over positions [first_pos, last_pos] of an f32
 * cache, one block at a time with a running (online) softmax, so no buffer
 * grows with context. */
static void attend_one(const struct attention_job *job, const struct attn_span *sp, int row,
                       int head)
{
    const struct kv_cache *kv = job->kv;
    const float *kc = kv->k, *vc = kv->v;
    int hd = kv->head_dim;
    int group = job->n_heads / kv->n_kv_heads;
    int kv_head = head / group;
    const float *q = job->q + ((size_t)row * job->n_heads + head) * hd;
    float *out = job->out + ((size_t)row * job->n_heads + head) * hd;
    int last_pos = sp->pos0 + (row - sp->row0);
    int first_pos = 0;
    if (job->sliding_window > 0 && last_pos - job->sliding_window + 1 > 0)
        first_pos = last_pos - job->sliding_window + 1;

    float acc[1024];
    float scores[256];
    memset(acc, 0, (size_t)hd * sizeof(float));
    float running_max = -FLT_MAX, running_sum = 0.0f;

    for (int start = first_pos; start <= last_pos;) {
        uint32_t block = sp->block_ids[start / kv->block_size];
        int slot0 = start % kv->block_size;
        int n = kv->block_size - slot0;
        if (start + n > last_pos + 1)
            n = last_pos + 1 - start;
        start += n;
        size_t base = kv_slot_offset(kv, job->layer, block, slot0) + (size_t)kv_head * hd;
        size_t stride = (size_t)kv->n_kv_heads * hd;
        float block_max = -FLT_MAX;
        for (int j = 0; j < n; j++) {
            scores[j] = vec_dot(q, kc + base + j * stride, hd) * job->scale;
            if (scores[j] > block_max)
                block_max = scores[j];
        }
        float new_max = block_max > running_max ? block_max : running_max;
        float correction = expf(running_max - new_max);
        running_sum *= correction;
        exp_shifted(scores, n, new_max);
        for (int j = 0; j < n; j++) {
            running_sum += scores[j];
            vec_scale_axpy(acc, j == 0 ? correction : 1.0f, scores[j], vc + base + j * stride, hd);
        }
        running_max = new_max;
    }
    float inv = 1.0f / running_sum;
    for (int d = 0; d < hd; d++)
        out[d] = acc[d] * inv;
}

/* Work items are (row, head) pairs dealt round-robin, which balances the
 * causal triangle: later rows attend over more positions. */
static void attention_rows(void *ctx, int ith, int nth)
{
    struct attention_job *job = ctx;
    long item = 0;
    for (int s = 0; s < job->n_spans; s++) {
        const struct attn_span *sp = &job->spans[s];
        for (int r = 0; r < sp->n_tokens; r++) {
            for (int h = 0; h < job->n_heads; h++, item++) {
                if (item % nth == ith)
                    attend_one(job, sp, sp->row0 + r, h);
            }
        }
    }
}

/* ---- FAST mode: tiles of query rows x a kv head's group ------------------ */

struct tiled_job {
    struct attention_job rows; /* the row kernel's view, for short spans */
    struct tattn_args args;
    void (*tile)(const struct tattn_args *a, const struct tattn_tile *t);
    int tile_rows;   /* query rows per tile */
    int tile_heads;  /* heads of a group per tile */
    int head_chunks; /* tiles across one group */
    /* an f16 cache's rows (short spans; every span outside FAST's tiles) run
     * the group kernel, an item of item_heads heads at a time; NULL: an f32
     * cache's, the row kernel a head at a time */
    void (*group)(const struct tattn_args *a, const struct hattn_item *it);
    int item_heads;
    int item_rows; /* consecutive query rows of a span one group item takes (1: the row kernel) */
    /* each group item takes every kv head of its rows, one after another: a slot holds the kv
     * heads' rows side by side, so one core then reads whole cache lines of it (the other
     * heads' parts come in with the first's), where items of one kv head each had two cores
     * fetch the same lines */
    bool kv_heads_together;
    atomic_long next_item;           /* the tiles' */
    struct threadpool_shares shares; /* the row items' */
};

/* Items of one bundle of query rows outside the tiles (item_rows rows of a
 * span, fewer at its end): (kv head, share of its group) pairs for the group
 * kernel (shares alone when the kv heads go together), heads for the row
 * kernel (a bundle is one row there). */
static long row_items(const struct tiled_job *job)
{
    if (!job->group)
        return job->rows.n_heads;
    int group = job->rows.n_heads / job->rows.kv->n_kv_heads;
    long shares = (group + job->item_heads - 1) / job->item_heads;
    return job->kv_heads_together ? shares : job->rows.kv->n_kv_heads * shares;
}

/* Bundles of query rows of a span of n rows outside the tiles. */
static long row_bundles(const struct tiled_job *job, int n)
{
    return (n + job->item_rows - 1) / job->item_rows;
}

/* Item i (below row_items) of bundle b of span sp. */
static void row_item(const struct tiled_job *job, const struct attn_span *sp, long b, long i)
{
    int row = sp->row0 + (int)b * job->item_rows;
    if (!job->group) {
        attend_one(&job->rows, sp, row, (int)i);
        return;
    }
    int group = job->rows.n_heads / job->rows.kv->n_kv_heads;
    int shares = (group + job->item_heads - 1) / job->item_heads;
    int kv_head = (int)(i / shares), share = (int)(i % shares);
    int kv_end = kv_head + 1;
    if (job->kv_heads_together) {
        kv_head = 0;
        kv_end = job->rows.kv->n_kv_heads;
    }
    int head0 = share * job->item_heads, left = sp->row0 + sp->n_tokens - row;
    int n_rows = left < job->item_rows ? left : job->item_rows;
    /* whole groups of every kv head fit one item: each slot row read in one pass */
    int n_kv = kv_end - kv_head;
    if (n_kv > 1 && (shares > 1 || n_rows * n_kv * group > HATTN_MAX_HEADS ||
                     n_rows * n_kv * group * job->rows.kv->head_dim > HATTN_MAX_QUERY_FLOATS))
        n_kv = 1;
    for (; kv_head < kv_end; kv_head += n_kv) {
        struct hattn_item it = {.sp = sp, .row = row, .kv_head = kv_head,
                                .head0 = kv_head * group + head0,
                                .n_heads = group - head0 < job->item_heads ? group - head0
                                                                           : job->item_heads,
                                .n_rows = n_rows, .n_kv = n_kv};
        job->group(&job->args, &it);
    }
}

/* Every query row through row_item, items taken through threadpool_shares:
 * each thread its own run of items first, the same sequences' rows step
 * after step (their K/V stay in that core's caches), then whatever the
 * others have left. Dealt round-robin with no taking, a thread that lost its
 * core for a while (HTTP threads and the clients share a small machine's
 * cores) held its whole share back and the others waited at the join: 5-6%
 * of an 8-stream decode step's samples; now it holds back one item (a row
 * and kv head: tens of microseconds), and the causal triangle evens out as
 * well. */
static void attention_row_items(void *ctx, int ith, int nth)
{
    (void)nth;
    struct tiled_job *job = ctx;
    const struct attention_job *rj = &job->rows;
    long per_bundle = row_items(job), base = 0;
    int s = 0;
    for (long item; (item = threadpool_shares_next(&job->shares, ith)) >= 0;) {
        if (item < base) { /* taken from behind this thread's last one: scan from the start */
            s = 0;
            base = 0;
        }
        while (s < rj->n_spans &&
               item >= base + row_bundles(job, rj->spans[s].n_tokens) * per_bundle)
            base += row_bundles(job, rj->spans[s++].n_tokens) * per_bundle;
        if (s >= rj->n_spans)
            return;
        const struct attn_span *sp = &rj->spans[s];
        long k = item - base;
        row_item(job, sp, k / per_bundle, k % per_bundle);
    }
}

/* Work items of span sp: (tile, kv head, head chunk) triples for a long
 * span, row_items per row for a short one. */
static long span_items(const struct tiled_job *job, const struct attn_span *sp)
{
    if (sp->n_tokens < CPU_TILED_MIN_ROWS)
        return row_bundles(job, sp->n_tokens) * row_items(job);
    long tiles = (sp->n_tokens + job->tile_rows - 1) / job->tile_rows;
    return tiles * job->args.kv->n_kv_heads * job->head_chunks;
}

/* Threads claim items one at a time from a shared counter. A span's tiles
 * are dealt last rows first: later rows attend over more positions, so the
 * costliest items go first and the cheap ones even out the threads' ends. */
static void attention_tiles(void *ctx, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct tiled_job *job = ctx;
    const struct attention_job *rj = &job->rows;
    int group = rj->n_heads / rj->kv->n_kv_heads;
    int s = 0;
    long base = 0, n_items = rj->n_spans ? span_items(job, &rj->spans[0]) : 0;
    for (;;) {
        long item = atomic_fetch_add_explicit(&job->next_item, 1, memory_order_relaxed);
        while (s < rj->n_spans && item >= base + n_items) {
            base += n_items;
            if (++s < rj->n_spans)
                n_items = span_items(job, &rj->spans[s]);
        }
        if (s >= rj->n_spans)
            return;
        const struct attn_span *sp = &rj->spans[s];
        long i = item - base;
        if (sp->n_tokens < CPU_TILED_MIN_ROWS) {
            long per_bundle = row_items(job);
            row_item(job, sp, i / per_bundle, i % per_bundle);
            continue;
        }
        long per_tile = (long)rj->kv->n_kv_heads * job->head_chunks;
        int n_tiles = (sp->n_tokens + job->tile_rows - 1) / job->tile_rows;
        int tile = n_tiles - 1 - (int)(i / per_tile);
        int kv_head = (int)(i % per_tile) / job->head_chunks;
        int chunk = (int)(i % per_tile) % job->head_chunks;
        struct tattn_tile t = {.sp = sp, .row0 = sp->row0 + tile * job->tile_rows,
                               .kv_head = kv_head, .head0 = kv_head * group + chunk * job->tile_heads};
        t.n_rows = sp->n_tokens - tile * job->tile_rows < job->tile_rows
                       ? sp->n_tokens - tile * job->tile_rows
                       : job->tile_rows;
        t.n_heads = group - chunk * job->tile_heads < job->tile_heads ? group - chunk * job->tile_heads
                                                                        : job->tile_heads;
        job->tile(&job->args, &t);
    }
}

/* Whether FAST mode's tiles run this call: some span is long enough and a
 * tile kernel takes the head size. Fills the kernel and its tile shape. */
static bool tiled_plan(struct backend *be, const struct kv_cache *kv, const struct attn_span *spans,
                       int n_spans, int n_heads, struct tiled_job *job)
{
    if (be->mode != COMPUTE_FAST)
        return false;
    bool long_span = false;
    for (int s = 0; s < n_spans && !long_span; s++)
        long_span = spans[s].n_tokens >= CPU_TILED_MIN_ROWS;
    int hd = kv->head_dim, max_queries;
    struct cpu_impl *impl = be->impl;
    if (!long_span || hd > TATTN_MAX_HEAD_DIM || (kv->dtype == DTYPE_F16 && !impl->f16c))
        return false;
    /* the matmul level carries the processor's and the cpu_isa cap's AVX-512 */
    if (cpu_matmul_get_level(impl->matmul) >= CPU_MATMUL_AVX512 && hd % 16 == 0) {
        job->tile = cpu_tattn_tile_avx512;
        max_queries = TATTN_MAX_QUERIES_AVX512;
    } else if (hd % 8 == 0) {
        job->tile = cpu_tattn_tile_avx2;
        max_queries = TATTN_MAX_QUERIES_AVX2;
    } else {
        return false;
    }
    int group = n_heads / kv->n_kv_heads;
    job->tile_heads = group < max_queries ? group : max_queries;
    job->head_chunks = (group + job->tile_heads - 1) / job->tile_heads;
    job->tile_rows = max_queries / job->tile_heads;
    return true;
}

/* The f16 cache's group kernel for heads of head_dim hd: AVX-512 or AVX2
 * vectors where the processor (and the cpu_isa cap) and hd allow, else the
 * portable one, with F16C where the processor has it. */
static void (*group_kernel(struct backend *be, int hd))(const struct tattn_args *,
                                                         const struct hattn_item *)
{
    struct cpu_impl *impl = be->impl;
    if (!impl->f16c)
        return cpu_hattn_group_scalar;
    if (cpu_matmul_get_level(impl->matmul) >= CPU_MATMUL_AVX512 && hd % 16 == 0)
        return cpu_hattn_group_avx512;
    return hd % 8 == 0 ? cpu_hattn_group_avx2 : cpu_hattn_group_f16c;
}

void cpu_attention(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                   const struct attn_span *spans, int n_spans, int n_heads, float scale,
                   int sliding_window, float *out)
{
    if (kv->quant) {
        cpu_settle(be);
        if (!cpu_attention_quant_window(be, q, kv, layer, spans, n_spans, n_heads, scale,
                                        sliding_window, out))
            cpu_attention_quant(be, q, kv, layer, spans, n_spans, n_heads, scale,
                                sliding_window, out);
        return;
    }
    /* what the pool holds (the step's K/V stores among it) runs first in the job below: the
     * lines up to it read only the spans */
    struct attention_job job = {q, kv, layer, spans, n_spans, n_heads, scale, sliding_window, out};
    struct cpu_impl *impl = be->impl;
    struct tiled_job tj = {.rows = job, .item_rows = 1};
    tj.args = (struct tattn_args){q, kv, layer, n_heads, scale, sliding_window, out, -1};
    if (kv->dtype == DTYPE_F16) {
        int group = n_heads / kv->n_kv_heads, nth = threadpool_size(impl->pool);
        tj.group = group_kernel(be, kv->head_dim);
        tj.item_heads = hattn_item_heads(group, kv->head_dim);
        /* a short span's consecutive rows (a verify entry's) share their K/V
         * reads in one item; a row's bits do not depend on the rows beside it */
        tj.item_rows = hattn_item_rows(tj.item_heads, kv->head_dim);
        /* fewer (bundle, kv head) items than threads (one sequence decoding,
         * few kv heads): groups are shared out, each share reading its kv
         * head's rows; a head's bits do not depend on which heads share its
         * item */
        long bundles = 0;
        for (int s = 0; s < n_spans; s++)
            bundles += row_bundles(&tj, spans[s].n_tokens);
        long items = bundles * kv->n_kv_heads;
        /* kv heads together while that still leaves two items a thread (8 sequences
         * decoding on two cores: 0.67-0.71 against 0.86-0.99 ms a step of the house
         * model's attention at 576 positions) */
        tj.kv_heads_together = kv->n_kv_heads > 1 && bundles >= 2L * nth;
        if (items > 0 && items < nth) {
            int shares = (int)((nth + items - 1) / items);
            int heads = (group + shares - 1) / shares;
            tj.item_heads = heads < tj.item_heads ? heads : tj.item_heads;
            tj.item_rows = hattn_item_rows(tj.item_heads, kv->head_dim);
        }
    }
    if (tiled_plan(be, kv, spans, n_spans, n_heads, &tj)) {
        atomic_init(&tj.next_item, 0);
        threadpool_run(impl->pool, attention_tiles, &tj);
        return;
    }
    if (tj.group) {
        long items = 0;
        for (int s = 0; s < n_spans; s++)
            items += row_bundles(&tj, spans[s].n_tokens) * row_items(&tj);
        threadpool_shares_init(&tj.shares, items, threadpool_size(impl->pool));
        threadpool_run(impl->pool, attention_row_items, &tj);
    }
    else
        threadpool_run(impl->pool, attention_rows, &job);
}

/* ---- dense attention (encoder-decoder models) through the same kernels ------------------ */

/* Dense K/V read as a one-layer cache of blocks of this many positions (the row kernel's
 * score buffer holds one block) */
#define DENSE_BLOCK 256

bool cpu_attention_dense_tiled(struct backend *be, const float *q, int64_t n_q, const float *k,
                               const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                               int head_dim, float scale, int64_t causal, float *out)
{
    /* FAST mode, spans of four queries or more through the tiles; a single query over many
     * keys (cross-attention while decoding) through the row kernel, whose K and V reads are
     * vectors, one thread per head; dense K/V rows of exactly n_heads heads, read as the
     * blocks of a one-layer cache with a kv head per query head */
    bool tiles = n_q >= CPU_TILED_MIN_ROWS;
    bool rows = !tiles && n_kv >= DENSE_TILED_MIN_KEYS && (n_q == 1 || causal >= 0);
    if (be->mode != COMPUTE_FAST || !(tiles || rows) || head_dim <= 0 || n_heads <= 0 ||
        head_dim > 1024 || kv_stride != (int64_t)n_heads * head_dim || n_kv < 1 ||
        n_kv > INT32_MAX || n_q > INT32_MAX || (causal >= 0 && causal + n_q > n_kv))
        return false;
    int n_blocks = (int)((n_kv + DENSE_BLOCK - 1) / DENSE_BLOCK);
    uint32_t few[64], *ids = n_blocks <= 64 ? few : malloc((size_t)n_blocks * sizeof *ids);
    if (!ids)
        return false;
    for (int b = 0; b < n_blocks; b++)
        ids[b] = (uint32_t)b;
    struct kv_cache kv = {.k = (void *)k, .v = (void *)v, .dtype = DTYPE_F32, .n_layers = 1,
                          .n_blocks = n_blocks, .block_size = DENSE_BLOCK, .n_kv_heads = n_heads,
                          .head_dim = head_dim};
    /* causal: query i at position causal + i; dense: every query at the last position */
    struct attn_span span = {.row0 = 0, .n_tokens = (int)n_q,
                             .pos0 = causal >= 0 ? (int)causal : (int)n_kv - 1,
                             .block_ids = ids, .n_block_ids = n_blocks};
    struct tiled_job tj = {.rows = {q, &kv, 0, &span, 1, n_heads, scale, 0, out}};
    struct cpu_impl *impl = be->impl;
    bool done = false;
    if (tiles && tiled_plan(be, &kv, &span, 1, n_heads, &tj)) {
        tj.args = (struct tattn_args){q, &kv, 0, n_heads, scale, 0, out,
                                      causal >= 0 ? -1 : (int)n_kv - 1};
        atomic_init(&tj.next_item, 0);
        threadpool_run(impl->pool, attention_tiles, &tj);
        done = true;
    } else if (rows) {
        threadpool_run(impl->pool, attention_rows, &tj.rows);
        done = true;
    }
    if (ids != few)
        free(ids);
    return done;
}
