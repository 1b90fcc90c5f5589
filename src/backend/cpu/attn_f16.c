/* backend/cpu/attn_f16.c — an f16 cache's element conversions (F16C, or the scalar ones of backend/kv_quant.h), and its group decode kernel for any head size, widening a row at a time. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_f16.h"
#include "backend/cpu/vec_avx2.h"
#include "backend/kv_quant.h"

void cpu_f16_from_f32(uint16_t *dst, const float *src, size_t n, bool f16c)
{
    size_t i = 0;
    if (f16c) {
        /* clamped first, so what would round past the largest finite f16
         * saturates as kvq_f32_to_f16 does; min and max return their
         * second operand when one is a NaN, so a NaN passes through */
        const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
        for (; i + 8 <= n; i += 8) {
            __m256 x = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_loadu_ps(src + i)));
            _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        }
    }
    for (; i < n; i++)
        dst[i] = kvq_f32_to_f16(src[i]);
}

void cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n, bool f16c)
{
    size_t i = 0;
    if (f16c)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = kvq_f16_to_f32(src[i]);
}

/* The group kernel for any head_dim, one query row of the item: each K and V
 * row widened into floats once, then dotted with (added into) every head. */
static void group_row(const struct tattn_args *a, const struct hattn_item *it, int q_row, bool f16c)
{
    const struct kv_cache *kv = a->kv;
    const struct attn_span *sp = it->sp;
    const uint16_t *kc = kv->k, *vc = kv->v;
    int hd = kv->head_dim, G = it->n_heads;
    size_t q_stride = (size_t)a->n_heads * hd;
    int last = sp->pos0 + (q_row - sp->row0);
    int first = a->sliding_window > 0 && last - a->sliding_window + 1 > 0
                    ? last - a->sliding_window + 1
                    : 0;

    float q[HATTN_MAX_QUERY_FLOATS], o[HATTN_MAX_QUERY_FLOATS];
    float s[HATTN_MAX_HEADS][HATTN_CHUNK];
    float rmax[HATTN_MAX_HEADS], rsum[HATTN_MAX_HEADS];
    float row[HATTN_MAX_HEAD_DIM];
    size_t offs[HATTN_CHUNK];

    const float *qrow = a->q + (size_t)q_row * q_stride + (size_t)it->head0 * hd;
    for (int i = 0; i < G * hd; i++)
        q[i] = qrow[i] * a->scale;
    memset(o, 0, (size_t)G * hd * sizeof(float));
    for (int g = 0; g < G; g++) {
        rmax[g] = -FLT_MAX;
        rsum[g] = 0.0f;
    }

    size_t head_off = (size_t)it->kv_head * hd;
    for (int c0 = first, n; c0 <= last; c0 += n) {
        n = last + 1 - c0 < HATTN_CHUNK ? last + 1 - c0 : HATTN_CHUNK;
        for (int j = 0; j < n; j++) {
            int pos = c0 + j;
            uint32_t block = sp->block_ids[pos / kv->block_size];
            offs[j] = tattn_slot_offset(kv, a->layer, block, pos % kv->block_size) + head_off;
            cpu_f16_to_f32(row, kc + offs[j], (size_t)hd, f16c);
            for (int g = 0; g < G; g++)
                s[g][j] = vec_dot(q + (size_t)g * hd, row, hd);
        }
        for (int g = 0; g < G; g++) {
            float bmax = -FLT_MAX;
            for (int j = 0; j < n; j++)
                bmax = s[g][j] > bmax ? s[g][j] : bmax;
            float nmax = bmax > rmax[g] ? bmax : rmax[g];
            float corr = expf(rmax[g] - nmax);
            rsum[g] *= corr;
            for (int j = 0; j < n; j++) {
                s[g][j] = expf(s[g][j] - nmax);
                rsum[g] += s[g][j];
            }
            rmax[g] = nmax;
            for (int d = 0; d < hd; d++)
                o[(size_t)g * hd + d] *= corr;
        }
        for (int j = 0; j < n; j++) {
            cpu_f16_to_f32(row, vc + offs[j], (size_t)hd, f16c);
            for (int g = 0; g < G; g++)
                vec_scale_axpy(o + (size_t)g * hd, 1.0f, s[g][j], row, hd);
        }
    }

    float *out = a->out + (size_t)q_row * q_stride + (size_t)it->head0 * hd;
    for (int g = 0; g < G; g++) {
        float inv = 1.0f / rsum[g];
        for (int d = 0; d < hd; d++)
            out[(size_t)g * hd + d] = o[(size_t)g * hd + d] * inv;
    }
}

/* The portable kernels take an item's rows one after another, and its kv heads one after
 * another. */
static void group_rows(const struct tattn_args *a, const struct hattn_item *it, bool f16c)
{
    for (int k = 0; k < hattn_item_kv_heads(it); k++) {
        struct hattn_item one = *it;
        one.kv_head = it->kv_head + k;
        one.head0 = it->head0 + k * it->n_heads;
        one.n_kv = 1;
        for (int r = 0; r < it->n_rows; r++)
            group_row(a, &one, it->row + r, f16c);
    }
}

void cpu_hattn_group_f16c(const struct tattn_args *a, const struct hattn_item *it)
{
    group_rows(a, it, true);
}

void cpu_hattn_group_scalar(const struct tattn_args *a, const struct hattn_item *it)
{
    group_rows(a, it, false);
}

