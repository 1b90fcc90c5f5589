/* backend/cpu/attn_quant.c — quantize-on-write KV stores and causal attention that reads the
 * quantized records (affine and TurboQuant, backend/kv_quant.h) directly, one row at a time. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/vec_avx2.h"
#include "backend/kv_quant.h"

#define QATTN_MAX_HEAD_DIM 512
#define QATTN_MAX_GROUP 16
#define QATTN_MAX_BLOCK 256

static inline size_t row_offset(const struct kv_cache *kv, int layer, uint32_t block, int slot,
                                bool v)
{
    return (((size_t)layer * kv->n_blocks + block) * kv->block_size + slot) *
           kv_cache_row_bytes(kv, v);
}

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
                kvq_quantize_head(l, &job->impl->codebooks, kv->quant->seed, job->layer, hd,
                                  false, k + (size_t)h * hd, krow + (size_t)h * kb, scratch);
                kvq_quantize_head(l, &job->impl->codebooks, kv->quant->seed, job->layer, hd,
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
    uint32_t w = 0;
    memcpy(&w, codes + d * bits / 8, (size_t)bits); /* eight codes fill `bits` bytes */
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
        const uint8_t *scales = rec + hd * bits / 8;
        for (int g0 = 0; g0 < hd; g0 += g) {
            __m256 scale = _mm256_set1_ps(kvq_load_f16(scales + (g0 / g) * 4));
            __m256 bias = _mm256_set1_ps(kvq_load_f16(scales + (g0 / g) * 4 + 2));
            for (int d = g0; d < g0 + g; d += 8)
                _mm256_storeu_ps(out + d, _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes8(rec, d, bits)),
                                                          scale, bias));
        }
        return;
    }
    if (l->scheme == KV_QUANT_TURBO) {
        bool qjl = !v && l->qjl;
        __m256 s = _mm256_set1_ps(kvq_load_f16(rec));
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

struct qattn_job {
    const struct cpu_impl *impl;
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

/* One query row of every head sharing kv_head, over positions [first_pos,
 * last_pos], a block at a time with a running softmax: each K and V record is
 * decoded once into a row of floats and used by the whole group. */
static void attend_group(const struct qattn_job *job, const struct attn_span *sp, int row,
                         int kv_head)
{
    const struct kv_cache *kv = job->kv;
    const struct kv_quant_layer *l = kvq_layer(kv->quant, job->layer);
    const struct kvq_codebooks *cb = &job->impl->codebooks;
    uint64_t seed = kv->quant->seed;
    int hd = kv->head_dim;
    int group = job->n_heads / kv->n_kv_heads;
    bool turbo = l->scheme == KV_QUANT_TURBO, qjl = turbo && l->qjl;
    const float *k_levels = cb->levels[kvq_code_bits(l, false)];
    const float *v_levels = cb->levels[kvq_code_bits(l, true)];
    int kb = kvq_head_bytes(l, hd, false), vb = kvq_head_bytes(l, hd, true);
    int last_pos = sp->pos0 + (row - sp->row0);
    int first_pos = 0;
    if (job->sliding_window > 0 && last_pos - job->sliding_window + 1 > 0)
        first_pos = last_pos - job->sliding_window + 1;

    float qr[QATTN_MAX_GROUP][QATTN_MAX_HEAD_DIM]; /* queries, rotated for TURBO keys */
    float qs[QATTN_MAX_GROUP][QATTN_MAX_HEAD_DIM]; /* and once more for the QJL signs */
    float acc[QATTN_MAX_GROUP][QATTN_MAX_HEAD_DIM];
    float scores[QATTN_MAX_GROUP][QATTN_MAX_BLOCK];
    float running_max[QATTN_MAX_GROUP], running_sum[QATTN_MAX_GROUP], corr[QATTN_MAX_GROUP];
    float krow[QATTN_MAX_HEAD_DIM], vrow[QATTN_MAX_HEAD_DIM], z[QATTN_MAX_HEAD_DIM];
    float qjl_coef_unit = 1.2533141373155003f / sqrtf((float)hd); /* sqrt(pi/2) / sqrt(hd) */
    for (int g = 0; g < group; g++) {
        int head = kv_head * group + g;
        memcpy(qr[g], job->q + ((size_t)row * job->n_heads + head) * hd, (size_t)hd * sizeof(float));
        if (turbo)
            kvq_rotate(qr[g], hd, seed, 0, job->layer);
        if (qjl) {
            memcpy(qs[g], qr[g], (size_t)hd * sizeof(float));
            kvq_rotate(qs[g], hd, seed, 2, job->layer);
        }
        memset(acc[g], 0, (size_t)hd * sizeof(float));
        running_max[g] = -FLT_MAX;
        running_sum[g] = 0.0f;
    }
    size_t head_k = (size_t)kv_head * kb, head_v = (size_t)kv_head * vb;

    for (int start = first_pos; start <= last_pos;) {
        uint32_t block = sp->block_ids[start / kv->block_size];
        int slot0 = start % kv->block_size;
        int n = kv->block_size - slot0;
        if (start + n > last_pos + 1)
            n = last_pos + 1 - start;
        start += n;
        const uint8_t *kbase = (const uint8_t *)kv->k + row_offset(kv, job->layer, block, slot0, false);
        const uint8_t *vbase = (const uint8_t *)kv->v + row_offset(kv, job->layer, block, slot0, true);
        size_t kstride = kv_cache_row_bytes(kv, false), vstride = kv_cache_row_bytes(kv, true);
        for (int j = 0; j < n; j++) {
            const uint8_t *rec = kbase + j * kstride + head_k;
            decode_record(l, k_levels, hd, false, rec, krow);
            float coef = 0;
            if (qjl) {
                decode_signs(l, hd, rec, z);
                coef = kvq_load_f16(rec + 2) * qjl_coef_unit;
            }
            for (int g = 0; g < group; g++) {
                float s = vec_dot(qr[g], krow, hd);
                if (qjl)
                    s += coef * vec_dot(qs[g], z, hd);
                scores[g][j] = s * job->scale;
            }
        }
        for (int g = 0; g < group; g++) {
            float block_max = -FLT_MAX;
            for (int j = 0; j < n; j++)
                block_max = scores[g][j] > block_max ? scores[g][j] : block_max;
            float new_max = block_max > running_max[g] ? block_max : running_max[g];
            corr[g] = expf(running_max[g] - new_max);
            running_sum[g] *= corr[g];
            for (int j = 0; j < n; j++) {
                scores[g][j] = expf(scores[g][j] - new_max);
                running_sum[g] += scores[g][j];
            }
            running_max[g] = new_max;
        }
        for (int j = 0; j < n; j++) {
            decode_record(l, v_levels, hd, true, vbase + j * vstride + head_v, vrow);
            for (int g = 0; g < group; g++)
                vec_scale_axpy(acc[g], j == 0 ? corr[g] : 1.0f, scores[g][j], vrow, hd);
        }
    }
    for (int g = 0; g < group; g++) {
        int head = kv_head * group + g;
        float *out = job->out + ((size_t)row * job->n_heads + head) * hd;
        float inv = 1.0f / running_sum[g];
        for (int d = 0; d < hd; d++)
            out[d] = acc[g][d] * inv;
        if (turbo) /* values were accumulated in their rotated frame */
            kvq_unrotate(out, hd, seed, 1, job->layer);
    }
}

/* Work items are (row, kv head) pairs dealt round-robin, which balances the
 * causal triangle: later rows attend over more positions. */
static void qattention_rows(void *ctx, int ith, int nth)
{
    struct qattn_job *job = ctx;
    long item = 0;
    for (int s = 0; s < job->n_spans; s++) {
        const struct attn_span *sp = &job->spans[s];
        for (int r = 0; r < sp->n_tokens; r++)
            for (int h = 0; h < job->kv->n_kv_heads; h++, item++)
                if (item % nth == ith)
                    attend_group(job, sp, sp->row0 + r, h);
    }
}

void cpu_attention_quant(struct backend *be, const float *q, const struct kv_cache *kv, int layer,
                         const struct attn_span *spans, int n_spans, int n_heads, float scale,
                         int sliding_window, float *out)
{
    struct cpu_impl *impl = be->impl;
    struct qattn_job job = {impl, q, kv, layer, spans, n_spans, n_heads, scale, sliding_window, out};
    threadpool_run(impl->pool, qattention_rows, &job);
}

int cpu_kv_quant_check(const struct kv_quant *q, struct err *err)
{
    int n = q->n_layers > 0 ? q->n_layers : 1;
    if (q->n_layers < 0 || q->n_layers > KV_QUANT_MAX_LAYERS)
        return err_set(err, INFERD_EINVAL, "KV quantization for %d layers (at most %d)",
                       q->n_layers, KV_QUANT_MAX_LAYERS);
    for (int i = 0; i < n; i++) {
        const struct kv_quant_layer *l = &q->layer[i];
        bool ok = true;
        if (l->scheme == KV_QUANT_AFFINE)
            ok = (l->k_bits == 4 || l->k_bits == 8) && l->v_bits == l->k_bits &&
                 (l->group_size == 32 || l->group_size == 64);
        else if (l->scheme == KV_QUANT_TURBO)
            ok = (l->k_bits == 2 || l->k_bits == 3 || l->k_bits == 4 || l->k_bits == 5 ||
                  l->k_bits == 8) &&
                 (l->v_bits == 2 || l->v_bits == 3 || l->v_bits == 4 || l->v_bits == 5 ||
                  l->v_bits == 8) &&
                 (!l->qjl || (l->k_bits >= 3 && l->k_bits <= 5));
        else
            ok = l->scheme == KV_QUANT_NONE;
        if (!ok)
            return err_set(err, INFERD_EINVAL, "layer %d: KV format scheme %d k%d v%d group %d is "
                           "not one the backend reads", i, l->scheme, l->k_bits, l->v_bits,
                           l->group_size);
    }
    return 0;
}
