/* backend/cpu/kv_quantize.c — quantize on write in AVX2: kvq_quantize_head's records
 * (backend/kv_quant.h) eight coordinates an instruction, and TurboQuant's rotation both
 * ways, with the reference's bytes and bits (the same operations on each coordinate in
 * the same order; the scalar reference takes the cases where a vector instruction would
 * round or saturate differently). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_quant_kernels.h"
#include "backend/kv_quant.h"

/* kvq_sum_squares of x[0, n) (n a multiple of 32): partial sum j is lane j % 4 of
 * register j / 4, and the butterfly's partner j ^ o is register (j / 4) ^ (o / 4) for
 * o = 16, 8, 4, then the other half and the neighbouring lane. */
static double sum_squares(const float *x, int n)
{
    __m256d p[8];
    for (int i = 0; i < 8; i++)
        p[i] = _mm256_setzero_pd();
    for (int d = 0; d < n; d += 32)
        for (int i = 0; i < 8; i++) {
            __m256d e = _mm256_cvtps_pd(_mm_loadu_ps(x + d + 4 * i));
            p[i] = _mm256_fmadd_pd(e, e, p[i]);
        }
    for (int o = 4; o >= 1; o >>= 1) {
        __m256d q[8];
        for (int i = 0; i < 8; i++)
            q[i] = _mm256_add_pd(p[i], p[i ^ o]);
        memcpy(p, q, sizeof q);
    }
    __m256d s = _mm256_add_pd(p[0], _mm256_permute2f128_pd(p[0], p[0], 1));
    s = _mm256_add_pd(s, _mm256_permute_pd(s, 5));
    return _mm256_cvtsd_f64(s);
}

/* +1 or -1 for the eight coordinates whose signs are bits[0, 8) (set: -1). */
static inline __m256 signs8(unsigned bits)
{
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), bit), bit);
    return _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(-1.0f),
                            _mm256_castsi256_ps(set));
}

/* The butterfly stages of pairs 1, 2 and 4 apart, inside one register: the lower of a
 * pair gets a + c, the upper a - c (p - x there). */
static inline __m256 butterflies_in(__m256 x)
{
    __m256 p = _mm256_permute_ps(x, 0xb1);
    x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xaa);
    p = _mm256_permute_ps(x, 0x4e);
    x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xcc);
    p = _mm256_permute2f128_ps(x, x, 1);
    return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xf0);
}

/* x *= the rotation's signs (kvq_apply_signs). */
static void apply_signs(float *x, int n, uint64_t seed, int which, int layer)
{
    for (int d0 = 0; d0 < n; d0 += 64) {
        uint64_t w = kvq_sign_word(seed, which, layer, d0);
        for (int d = d0; d < n && d < d0 + 64; d += 8)
            _mm256_storeu_ps(x + d, _mm256_mul_ps(_mm256_loadu_ps(x + d),
                                                  signs8((unsigned)(w >> (d & 63)) & 255)));
    }
}

/* kvq_fwht for n a power of two of at least 8: the butterflies stage by stage, then the
 * scale. */
static void fwht(float *x, int n)
{
    for (int d = 0; d < n; d += 8)
        _mm256_storeu_ps(x + d, butterflies_in(_mm256_loadu_ps(x + d)));
    for (int h = 8; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j += 8) {
                __m256 a = _mm256_loadu_ps(x + j), c = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, c));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, c));
            }
    __m256 norm = _mm256_set1_ps(1.0f / sqrtf((float)n));
    for (int d = 0; d < n; d += 8)
        _mm256_storeu_ps(x + d, _mm256_mul_ps(_mm256_loadu_ps(x + d), norm));
}

void cpu_kvq_rotate(float *x, int n, uint64_t seed, int which, int layer, bool inverse)
{
    if (n < 8 || (n & (n - 1))) {
        (inverse ? kvq_unrotate : kvq_rotate)(x, n, seed, which, layer);
        return;
    }
    if (!inverse)
        apply_signs(x, n, seed, which, layer);
    fwht(x, n);
    if (inverse)
        apply_signs(x, n, seed, which, layer);
}

/* n (2 to 5 or 8) bytes of w at p, little-endian. */
static inline void store_le(uint8_t *p, uint64_t w, int n)
{
    switch (n) {
    case 2: memcpy(p, &w, 2); break;
    case 3: memcpy(p, &w, 3); break;
    case 4: memcpy(p, &w, 4); break;
    case 5: memcpy(p, &w, 5); break;
    default: memcpy(p, &w, 8);
    }
}

/* Codes d .. d + 7 (d a multiple of 8, each below 2^bits) as kvq_put_code lays them out:
 * eight codes are bits whole bytes. */
static inline void put_codes8(uint8_t *codes, int d, __m256i c, int bits)
{
    if (bits == 8) {
        __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(codes + d), _mm_packus_epi16(w, w));
        return;
    }
    __m256i sh = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                    _mm256_set1_epi32(bits));
    __m256i lo = _mm256_sllv_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(c)),
                                   _mm256_cvtepu32_epi64(_mm256_castsi256_si128(sh)));
    __m256i hi = _mm256_sllv_epi64(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(c, 1)),
                                   _mm256_cvtepu32_epi64(_mm256_extracti128_si256(sh, 1)));
    __m256i w4 = _mm256_or_si256(lo, hi);
    __m128i w2 = _mm_or_si128(_mm256_castsi256_si128(w4), _mm256_extracti128_si256(w4, 1));
    uint64_t w = (uint64_t)_mm_cvtsi128_si64(w2) | (uint64_t)_mm_extract_epi64(w2, 1);
    store_le(codes + d / 8 * bits, w, bits);
}

/* kvq_nearest for eight values: below 32 levels, how many of the ascending bounds each is
 * above (the binary search's answer; NaN above none); else the search itself. */
static inline __m256i nearest8(__m256 t, const float *bounds, int bits)
{
    __m256i c = _mm256_setzero_si256();
    if (bits <= 5) {
        for (int i = 0; i + 1 < 1 << bits; i++)
            c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(
                                        t, _mm256_set1_ps(bounds[i]), _CMP_GT_OQ)));
        return c;
    }
    for (int step = 1 << (bits - 1); step >= 1; step >>= 1) {
        __m256 b = _mm256_i32gather_ps(bounds, _mm256_add_epi32(c, _mm256_set1_epi32(step - 1)), 4);
        __m256i above = _mm256_castps_si256(_mm256_cmp_ps(t, b, _CMP_GT_OQ));
        c = _mm256_add_epi32(c, _mm256_and_si256(above, _mm256_set1_epi32(step)));
    }
    return c;
}

/* levels[c] for eight indices. */
static inline __m256 lookup8(__m256i c, const float *levels, int bits)
{
    if (bits <= 3)
        return _mm256_permutevar8x32_ps(_mm256_loadu_ps(levels), c);
    if (bits == 4)
        return _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(levels), c),
                                _mm256_permutevar8x32_ps(_mm256_loadu_ps(levels + 8), c),
                                _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
    return _mm256_i32gather_ps(levels, c, 4);
}

static void quantize_turbo(const struct kv_quant_layer *l, const struct kvq_codebooks *cb,
                           uint64_t seed, int layer, int n, bool v, const float *x, uint8_t *rec,
                           float *y)
{
    int bits = kvq_code_bits(l, v);
    memcpy(y, x, (size_t)n * sizeof *y);
    double norm2 = sum_squares(x, n);
    cpu_kvq_rotate(y, n, seed, v ? 1 : 0, layer, false);
    float s = kvq_f16_to_f32(kvq_f32_to_f16((float)sqrt(norm2 / n)));
    kvq_store_f16(rec, s);
    bool qjl = !v && l->qjl;
    uint8_t *codes = rec + (qjl ? 4 : 2);
    __m256 inv = _mm256_set1_ps(s > 0 ? 1.0f / s : 0.0f), neg_s = _mm256_set1_ps(-s);
    for (int d = 0; d < n; d += 8) {
        __m256 yd = _mm256_loadu_ps(y + d);
        __m256i c = nearest8(_mm256_mul_ps(yd, inv), cb->bounds[bits], bits);
        put_codes8(codes, d, c, bits);
        /* the residual, for QJL: fmaf(-s, level, y) */
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(neg_s, lookup8(c, cb->levels[bits], bits), yd));
    }
    if (!qjl)
        return;
    kvq_store_f16(rec + 2, (float)sqrt(sum_squares(y, n)));
    cpu_kvq_rotate(y, n, seed, 2, layer, false);
    uint8_t *signs = codes + n * bits / 8;
    for (int d = 0; d < n; d += 8)
        signs[d / 8] = (uint8_t)_mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_loadu_ps(y + d), _mm256_setzero_ps(), _CMP_GE_OQ));
}

/* The scalar scan's extremum of x[0, g) (g a multiple of 8): x[0] when it is NaN (the scan
 * never leaves it), else the first element equal to the extreme value (only zeros of both
 * signs compare equal with different bits). MIN and MAX keep the scan's operand order, so
 * NaNs past the first are skipped as the scan skips them. */
static float serial_extreme(const float *x, int g, bool max)
{
    if (x[0] != x[0])
        return x[0];
    __m256 m = _mm256_set1_ps(x[0]);
    for (int d = 0; d < g; d += 8) {
        __m256 xd = _mm256_loadu_ps(x + d);
        m = max ? _mm256_max_ps(xd, m) : _mm256_min_ps(xd, m);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float r = lanes[0];
    for (int i = 1; i < 8; i++)
        r = max ? (lanes[i] > r ? lanes[i] : r) : (lanes[i] < r ? lanes[i] : r);
    if (r == 0.0f)
        for (int d = 0; d < g; d++)
            if (x[d] == 0.0f)
                return x[d];
    return r;
}

/* false where a code's float lies outside int's range and lrintf's long would wrap
 * differently from the vector conversion's saturation (the caller then takes the
 * reference). */
static bool quantize_affine(const struct kv_quant_layer *l, int n, bool v, const float *x,
                            uint8_t *rec)
{
    int bits = kvq_code_bits(l, v), g = l->group_size, levels = (1 << bits) - 1;
    uint8_t *scales = rec + n * bits / 8;
    const __m256 big = _mm256_set1_ps(2147483648.0f), inf = _mm256_set1_ps(INFINITY);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int g0 = 0; g0 < n; g0 += g) {
        float mn = serial_extreme(x + g0, g, false), mx = serial_extreme(x + g0, g, true);
        float bias = kvq_f16_to_f32(kvq_f32_to_f16(mn));
        float scale = kvq_f16_to_f32(kvq_f32_to_f16((mx - bias) / (float)levels));
        __m256 vbias = _mm256_set1_ps(bias), inv = _mm256_set1_ps(scale > 0 ? 1.0f / scale : 0.0f);
        for (int d = g0; d < g0 + g; d += 8) {
            __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + d), vbias), inv);
            __m256 a = _mm256_and_ps(t, abs_mask);
            if (_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(a, big, _CMP_GE_OQ),
                                                 _mm256_cmp_ps(a, inf, _CMP_LT_OQ))))
                return false;
            __m256i c = _mm256_cvtps_epi32(t); /* lrintf; NaN and ±inf: INT_MIN, as lrintf's 0 */
            c = _mm256_min_epi32(_mm256_max_epi32(c, _mm256_setzero_si256()),
                                 _mm256_set1_epi32(levels));
            put_codes8(rec, d, c, bits);
        }
        kvq_store_f16(scales + (g0 / g) * 4, scale);
        kvq_store_f16(scales + (g0 / g) * 4 + 2, bias);
    }
    return true;
}

void cpu_kvq_quantize_head(const struct kv_quant_layer *l, const struct kvq_codebooks *cb,
                           uint64_t seed, int layer, int head_dim, bool v, const float *x,
                           uint8_t *rec, float *scratch)
{
    bool pow2 = head_dim >= 32 && (head_dim & (head_dim - 1)) == 0;
    if (l->scheme == KV_QUANT_TURBO && pow2) {
        quantize_turbo(l, cb, seed, layer, head_dim, v, x, rec, scratch);
        return;
    }
    if (l->scheme == KV_QUANT_AFFINE && head_dim % 8 == 0 &&
        quantize_affine(l, head_dim, v, x, rec))
        return;
    kvq_quantize_head(l, cb, seed, layer, head_dim, v, x, rec, scratch);
}
