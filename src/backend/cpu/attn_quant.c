/* backend/cpu/attn_quant.c — quantize-on-write KV stores and causal attention that reads the
 * quantized records (affine and TurboQuant, backend/kv_quant.h) directly, one row at a time;
 * in FAST mode a prefill's records decoded once into an f32 window for the tiled kernels. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/attn_quant_kernels.h"
#include "backend/cpu/attn_tiled.h"
#include "backend/cpu/vec_avx2.h"
#include "backend/kv_quant.h"

/* ---- quantize on write --------------------------------------------------------------- */

struct qstore_job {
    const struct cpu_impl *impl;
    struct kv_cache *kv;
    int layer;
    const float *k, *v;
    const struct attn_span *spans;
    int n_spans;
    long n_rows;
};

static void store_rows(void *ctx, int ith, int nth)
{
    struct qstore_job *job = ctx;
    struct kv_cache *kv = job->kv;
    const struct kv_quant_layer *l = kvq_layer(kv->quant, job->layer);
    int hd = kv->head_dim;
    size_t kv_dim = (size_t)kv->n_kv_heads * hd;
    int kb = kvq_head_bytes(l, hd, false), vb = kvq_head_bytes(l, hd, true);
    float scratch[QATTN_MAX_HEAD_DIM];
    long row = 0;
    for (int s = 0; s < job->n_spans; s++) {
        const struct attn_span *sp = &job->spans[s];
        for (int i = 0; i < sp->n_tokens; i++, row++) {
            if (row % nth != ith)
                continue;
            int pos = sp->pos0 + i;
            uint32_t block = sp->block_ids[pos / kv->block_size];
            int slot = pos % kv->block_size;
            uint8_t *krow = (uint8_t *)kv->k + row_offset(kv, job->layer, block, slot, false);
            uint8_t *vrow = (uint8_t *)kv->v + row_offset(kv, job->layer, block, slot, true);
            const float *k = job->k + (size_t)(sp->row0 + i) * kv_dim;
            const float *v = job->v + (size_t)(sp->row0 + i) * kv_dim;
            for (int h = 0; h < kv->n_kv_heads; h++) {
                if (l->scheme == KV_QUANT_NONE) {
                    memcpy(krow + (size_t)h * kb, k + (size_t)h * hd, (size_t)hd * sizeof(float));
                    memcpy(vrow + (size_t)h * vb, v + (size_t)h * hd, (size_t)hd * sizeof(float));
                    continue;
                }
                cpu_kvq_quantize_head(l, &job->impl->codebooks, kv->quant->seed, job->layer, hd,
                                      false, k + (size_t)h * hd, krow + (size_t)h * kb, scratch);
                cpu_kvq_quantize_head(l, &job->impl->codebooks, kv->quant->seed, job->layer, hd,
                                      true, v + (size_t)h * hd, vrow + (size_t)h * vb, scratch);
            }
        }
    }
}

void cpu_kv_store_quant(struct backend *be, struct kv_cache *kv, int layer, const float *k,
                        const float *v, const struct attn_span *spans, int n_spans)
{
    struct cpu_impl *impl = be->impl;
    long n_rows = 0;
    for (int s = 0; s < n_spans; s++)
        n_rows += spans[s].n_tokens;
    struct qstore_job job = {impl, kv, layer, k, v, spans, n_spans, n_rows};
    if (n_rows * kv->n_kv_heads < 16) /* a decode step: not worth waking the pool */
        store_rows(&job, 0, 1);
    else
        threadpool_run(impl->pool, store_rows, &job);
}

/* ---- decoding one record into floats ------------------------------------------------- */

/* Codes d .. d + 7 (d a multiple of 8) as eight 32-bit indices. */
static inline __m256i codes8(const uint8_t *codes, int d, int bits)
{
    if (bits == 8)
        return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + d)));
    if (bits == 5) {
        int32_t c[8];
        for (int i = 0; i < 8; i++)
            c[i] = kvq_get_code(codes, d + i, 5);
        return _mm256_loadu_si256((const __m256i *)c);
    }
    uint32_t w = (uint32_t)qattn_load_le(codes + d * bits / 8, bits); /* eight codes fill `bits` bytes */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i shift = _mm256_mullo_epi32(lane, _mm256_set1_epi32(bits));
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shift),
                            _mm256_set1_epi32((1 << bits) - 1));
}

/* levels[idx] for eight indices: a register permute for up to 16 levels. */
static inline __m256 lookup8(__m256i idx, int bits, const float *levels)
{
    if (bits <= 3)
        return _mm256_permutevar8x32_ps(_mm256_loadu_ps(levels), idx);
    if (bits == 4) {
        __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(levels), idx);
        __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(levels + 8), idx);
        __m256 upper = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
        return _mm256_blendv_ps(lo, hi, upper);
    }
    return _mm256_i32gather_ps(levels, idx, 4);
}

/* out = the record in the frame attention works in: the original one for
 * AFFINE, the rotated one (y ~= s * level[code]) for TURBO. */
static inline void decode_record(const struct kv_quant_layer *l, const float *levels, int hd,
                                 bool v, const uint8_t *rec, float *out)
{
    int bits = kvq_code_bits(l, v);
    if (l->scheme == KV_QUANT_AFFINE) {
        int g = l->group_size;
        const uint8_t *sb = rec + hd * bits / 8; /* each group's f16 scale and bias */
        for (int g0 = 0; g0 < hd; g0 += g, sb += 4) {
            __m256 scale = _mm256_set1_ps(qattn_load_f16(sb));
            __m256 bias = _mm256_set1_ps(qattn_load_f16(sb + 2));
            for (int d = g0; d < g0 + g; d += 8)
                _mm256_storeu_ps(out + d, _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes8(rec, d, bits)),
                                                          scale, bias));
        }
        return;
    }
    if (l->scheme == KV_QUANT_TURBO) {
        bool qjl = !v && l->qjl;
        __m256 s = _mm256_set1_ps(qattn_load_f16(rec));
        const uint8_t *codes = rec + (qjl ? 4 : 2);
        for (int d = 0; d < hd; d += 8)
            _mm256_storeu_ps(out + d, _mm256_mul_ps(s, lookup8(codes8(codes, d, bits), bits, levels)));
        return;
    }
    memcpy(out, rec, (size_t)hd * sizeof(float));
}

/* z[d] = +1 or -1 from the QJL sign bits of a key record. */
static inline void decode_signs(const struct kv_quant_layer *l, int hd, const uint8_t *rec,
                                float *z)
{
    const uint8_t *signs = rec + 4 + hd * kvq_code_bits(l, false) / 8;
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-1.0f);
    for (int d = 0; d < hd; d += 8) {
        __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(signs[d >> 3]), bit), bit);
        _mm256_storeu_ps(z + d, _mm256_blendv_ps(minus, one, _mm256_castsi256_ps(set)));
    }
}

/* ---- attention ------------------------------------------------------------------------ */


/* The largest of s[0, n). */
static inline float row_max8(const float *s, int n)
{
    __m256 m = _mm256_set1_ps(-FLT_MAX);
    int j = 0;
    for (; j + 8 <= n; j += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    float lanes[8], r = -FLT_MAX;
    _mm256_storeu_ps(lanes, m);
    for (int i = 0; i < 8; i++)
        r = lanes[i] > r ? lanes[i] : r;
    for (; j < n; j++)
        r = s[j] > r ? s[j] : r;
    return r;
}

/* s[j] = exp(s[j] - shift) for j < n by vec_exp8; returns their sum: positions j of each
 * sixteen with j % 16 < 8 in one accumulator, the rest in another (the AVX-512 kernel's two
 * halves), a masked tail's other lanes adding nothing, then hsum256's tree. */
static inline float row_exp8(float *s, int n, float shift)
{
    const __m256 vs = _mm256_set1_ps(shift);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int j = 0; j < n; j += 8) {
        __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane);
        __m256 e = vec_exp8(_mm256_sub_ps(_mm256_maskload_ps(s + j, k), vs));
        _mm256_maskstore_ps(s + j, k, e);
        sum[(j / 8) % 2] = _mm256_add_ps(sum[(j / 8) % 2], _mm256_and_ps(e, _mm256_castsi256_ps(k)));
    }
    __m256 h = _mm256_add_ps(sum[0], sum[1]);
    return _mm_cvtss_f32(qattn_reduce4(h, h, h, h));
}

/* Sixteen floats as two registers, elements 0-7 and 8-15: vec_dot's two accumulators. */
typedef struct {
    __m256 lo, hi;
} qa_v16;

static inline qa_v16 qa_v16_load(const float *p)
{
    return (qa_v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}

static inline void qa_v16_store(float *p, qa_v16 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}

static inline qa_v16 qa_v16_set1(float x)
{
    __m256 v = _mm256_set1_ps(x);
    return (qa_v16){v, v};
}

static inline qa_v16 qa_v16_fma(qa_v16 a, qa_v16 b, qa_v16 c)
{
    return (qa_v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}

static inline qa_v16 qa_v16_mul(qa_v16 a, qa_v16 b)
{
    return (qa_v16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}

#define QA_V qa_v16
#define QA_V_LOAD(p) qa_v16_load(p)
#define QA_V_STORE(p, v) qa_v16_store((p), (v))
#define QA_V_ZERO() qa_v16_set1(0.0f)
#define QA_V_SET1(x) qa_v16_set1(x)
#define QA_V_FMA(a, b, c) qa_v16_fma((a), (b), (c))
#define QA_V_MUL(a, b) qa_v16_mul((a), (b))
#define QA_V_HALVES(v) _mm256_add_ps((v).lo, (v).hi)
#define QA_QK_HEADS 1  /* 16 registers: one head's four positions' sums */
#define QA_PV_SLICES 1

#define QA_DECODE_RECORD decode_record
#define QA_DECODE_SIGNS decode_signs
#define QA_DOT vec_dot
#define QA_ROW_MAX row_max8
#define QA_ROW_EXP row_exp8
#define QA_GROUP attend_group_avx2
#define QA_ROWS cpu_qattn_rows_avx2
#include "backend/cpu/attn_quant_group.h"

void cpu_attention_quant(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                         const struct attn_span *spans, int n_spans, int n_heads, float scale,
                         int sliding_window, float *out)
{
    struct cpu_impl *impl = be->impl;
    struct qattn_job job = {impl, q, kv, layer, spans, n_spans, n_heads, scale, sliding_window, out};
    threadpool_run(impl->pool, impl->qattn_rows, &job);
}

int cpu_kv_quant_check(const struct kv_quant *q, struct err *err)
{
    int n = q->n_layers > 0 ? q->n_layers : 1;
    if (q->n_layers < 0 || q->n_layers > KV_QUANT_MAX_LAYERS)
        return err_set(err, INFERD_EINVAL, "KV quantization for %d layers (at most %d)",
                       q->n_layers, KV_QUANT_MAX_LAYERS);
    for (int i = 0; i < n; i++) {
        const struct kv_quant_layer *l = &q->layer[i];
        bool ok = kvq_layer_readable(l);
        if (!ok)
            return err_set(err, INFERD_EINVAL, "layer %d: KV format scheme %d k%d v%d group %d is "
                           "not one the backend reads", i, l->scheme, l->k_bits, l->v_bits,
                           l->group_size);
    }
    return 0;
}

/* ---- prefill through an f32 window ---------------------------------------------------- */

/* The window's blocks of a span: every block its context reaches. */
static int window_blocks(const struct attn_span *sp, int block_size)
{
    return (sp->pos0 + sp->n_tokens + block_size - 1) / block_size;
}

struct qwindow_job {
    const struct cpu_impl *impl;
    const struct kv_cache *kv;
    int layer;
    const struct attn_span *spans; /* the cache's */
    const int *span_of;            /* window block -> span */
    const int *first;              /* span -> its first window block */
    float *k, *v;                  /* the window */
    long n_items;                  /* window blocks x kv heads */
};

/* Items (window block, kv head): the block's positions' K and V records of that head, each
 * decode_record'ed and, for TURBO, rotated back (QJL keys with their residual first), as
 * kvq_dequantize_head forms them; positions past the span's context as zeros. */
static void qwindow_items(void *ctx, int ith, int nth)
{
    const struct qwindow_job *job = ctx;
    const struct kv_cache *kv = job->kv;
    const struct kv_quant_layer *l = kvq_layer(kv->quant, job->layer);
    const int hd = kv->head_dim, bs = kv->block_size, nkv = kv->n_kv_heads;
    const size_t kv_dim = (size_t)nkv * hd;
    const size_t krow = kv_cache_row_bytes(kv, false), vrow = kv_cache_row_bytes(kv, true);
    const float *klv = job->impl->codebooks.levels[kvq_code_bits(l, false)];
    const float *vlv = job->impl->codebooks.levels[kvq_code_bits(l, true)];
    float z[TATTN_MAX_HEAD_DIM];
    long i0 = job->n_items * ith / nth, i1 = job->n_items * (ith + 1) / nth;
    for (long it = i0; it < i1; it++) {
        const int j = (int)(it / nkv), h = (int)(it % nkv);
        const struct attn_span *sp = &job->spans[job->span_of[j]];
        const int ctx_end = sp->pos0 + sp->n_tokens, b = j - job->first[job->span_of[j]];
        const uint32_t blk = sp->block_ids[b];
        for (int slot = 0; slot < bs; slot++) {
            const size_t at = ((size_t)j * bs + slot) * kv_dim + (size_t)h * hd;
            float *xk = job->k + at, *xv = job->v + at;
            if (b * bs + slot >= ctx_end) {
                memset(xk, 0, (size_t)hd * sizeof *xk);
                memset(xv, 0, (size_t)hd * sizeof *xv);
                continue;
            }
            const size_t s = ((size_t)job->layer * kv->n_blocks + blk) * bs + slot;
            const uint8_t *rk = (const uint8_t *)kv->k + s * krow +
                                (size_t)h * kvq_head_bytes(l, hd, false);
            const uint8_t *rv = (const uint8_t *)kv->v + s * vrow +
                                (size_t)h * kvq_head_bytes(l, hd, true);
            decode_record(l, klv, hd, false, rk, xk);
            decode_record(l, vlv, hd, true, rv, xv);
            if (l->scheme != KV_QUANT_TURBO)
                continue;
            if (l->qjl) {
                float coef = qattn_load_f16(rk + 2) * 1.2533141373155003f / sqrtf((float)hd);
                decode_signs(l, hd, rk, z);
                cpu_kvq_rotate(z, hd, kv->quant->seed, 2, job->layer, true);
                for (int d = 0; d < hd; d++)
                    xk[d] += coef * z[d];
            }
            cpu_kvq_rotate(xk, hd, kv->quant->seed, 0, job->layer, true);
            cpu_kvq_rotate(xv, hd, kv->quant->seed, 1, job->layer, true);
        }
    }
}

bool cpu_attention_quant_window(struct backend *be, const float *q, const struct kv_cache *kv,
                                int layer, const struct attn_span *spans, int n_spans,
                                int n_heads, float scale, int sliding_window, float *out)
{
    struct cpu_impl *impl = be->impl;
    const int hd = kv->head_dim, bs = kv->block_size;
    bool long_span = false;
    for (int s = 0; s < n_spans && !long_span; s++)
        long_span = spans[s].n_tokens >= CPU_TILED_MIN_ROWS;
    if (be->mode != COMPUTE_FAST || !long_span || hd % 8 || hd > TATTN_MAX_HEAD_DIM)
        return false;
    long n_blocks = 0;
    for (int s = 0; s < n_spans; s++)
        n_blocks += window_blocks(&spans[s], bs);
    const size_t side = (size_t)n_blocks * bs * kv->n_kv_heads * hd * sizeof(float);
    if (n_blocks == 0 || 2 * side > CPU_QWINDOW_MAX_BYTES)
        return false;
    if (impl->qwindow_bytes < 2 * side) {
        float *grown = realloc(impl->qwindow, 2 * side);
        if (!grown)
            return false;
        impl->qwindow = grown;
        impl->qwindow_bytes = 2 * side;
    }
    int *span_of = malloc((size_t)n_blocks * sizeof *span_of);
    int *first = malloc((size_t)n_spans * sizeof *first);
    uint32_t *ids = malloc((size_t)n_blocks * sizeof *ids);
    struct attn_span *wspans = malloc((size_t)n_spans * sizeof *wspans);
    bool ok = span_of && first && ids && wspans;
    if (ok) {
        for (int s = 0, j = 0; s < n_spans; s++) {
            const int nb = window_blocks(&spans[s], bs);
            first[s] = j;
            wspans[s] = spans[s];
            wspans[s].block_ids = ids + j;
            wspans[s].n_block_ids = nb;
            for (int b = 0; b < nb; b++, j++) {
                span_of[j] = s;
                ids[j] = (uint32_t)j;
            }
        }
        float *wk = impl->qwindow, *wv = wk + side / sizeof(float);
        struct qwindow_job job = {impl, kv, layer, spans, span_of, first, wk, wv,
                                  n_blocks * kv->n_kv_heads};
        threadpool_run(impl->pool, qwindow_items, &job);
        const struct kv_cache window = {.k = wk, .v = wv, .dtype = DTYPE_F32, .n_layers = 1,
                                        .n_blocks = (int)n_blocks, .block_size = bs,
                                        .n_kv_heads = kv->n_kv_heads, .head_dim = hd};
        cpu_attention(be, q, &window, 0, wspans, n_spans, n_heads, scale, sliding_window, out);
    }
    free(span_of);
    free(first);
    free(ids);
    free(wspans);
    return ok;
}
