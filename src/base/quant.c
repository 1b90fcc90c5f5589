/* base/quant.c — the block formats in both directions: llama.cpp's reference quantizers and its dequantizers format by format, and MLX's affine groups. */
#include "base/quant.h"

#include <math.h>
#include <string.h>

#include "base/bf16.h"

/* Files must not depend on the compiler fusing a*b+c into one rounding. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define QK 32   /* elements per Q*_0 / Q*_1 block */
#define QK_K 256 /* elements per K-format super-block */
#define GROUP_MAX_EPS 1e-15f

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

uint16_t quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
    if (abs >= 0x477ff000u) /* rounds to beyond the largest half */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* a subnormal half (or zero): round at 2^-24 */
        float a;
        memcpy(&a, &abs, 4);
        float scaled = a * 16777216.0f; /* exact: a power of two */
        return (uint16_t)(sign | (uint32_t)rintf(scaled));
    }
    uint32_t mant = abs & 0x7fffffu, exp = (abs >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is still the right value */
    return (uint16_t)(sign | h);
}

static float half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

static void put_half(uint8_t *p, float f)
{
    uint16_t h = quant_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Round to nearest, ties to even, by the float trick llama.cpp uses (|x| < 2^22). */
static int nearest_int(float x)
{
    float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---------------------------------------------------------------- 32-element formats */

static void dequant_q8_0(const uint8_t *b, float *y)
{
    float d = half(b);
    for (int j = 0; j < QK; j++)
        y[j] = (int8_t)b[2 + j] * d;
}

static void quant_q8_0(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int j = 0; j < QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    put_half(b, d);
    for (int j = 0; j < QK; j++)
        b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* The element of largest magnitude, sign kept (the first one on ties). */
static float signed_absmax(const float *x, int n)
{
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void dequant_q4_0(const uint8_t *b, float *y)
{
    float d = half(b);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = ((b[2 + j] & 15) - 8) * d;
        y[j + QK / 2] = ((b[2 + j] >> 4) - 8) * d;
    }
}

static void quant_q4_0(const float *x, uint8_t *b)
{
    float d = signed_absmax(x, QK) / -8, id = d ? 1.0f / d : 0.0f;
    put_half(b, d);
    for (int j = 0; j < QK / 2; j++) {
        int lo = imin(15, (int8_t)(x[j] * id + 8.5f));
        int hi = imin(15, (int8_t)(x[j + QK / 2] * id + 8.5f));
        b[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

static void min_max(const float *x, int n, float *mn, float *mx)
{
    *mn = INFINITY;
    *mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        if (x[j] < *mn)
            *mn = x[j];
        if (x[j] > *mx)
            *mx = x[j];
    }
}

static void dequant_q4_1(const uint8_t *b, float *y)
{
    float d = half(b), m = half(b + 2);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (b[4 + j] & 15) * d + m;
        y[j + QK / 2] = (b[4 + j] >> 4) * d + m;
    }
}

static void quant_q4_1(const float *x, uint8_t *b)
{
    float mn, mx;
    min_max(x, QK, &mn, &mx);
    float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
    put_half(b, d);
    put_half(b + 2, mn);
    for (int j = 0; j < QK / 2; j++) {
        int lo = imin(15, (int8_t)((x[j] - mn) * id + 0.5f));
        int hi = imin(15, (int8_t)((x[j + QK / 2] - mn) * id + 0.5f));
        b[4 + j] = (uint8_t)(lo | hi << 4);
    }
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Q5_0 and Q5_1 share the quant layout: qs low nibbles, bit 4 in qh. */
static void unpack_q5(const uint8_t *qh4, const uint8_t *qs, int *q)
{
    uint32_t qh = le32(qh4);
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        q[j + QK / 2] = (qs[j] >> 4) | (int)((qh >> (j + QK / 2)) & 1) << 4;
    }
}

static void pack_q5(const int *q, uint8_t *qh4, uint8_t *qs)
{
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + QK / 2] & 15) << 4);
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + QK / 2] >> 4) & 1) << (j + QK / 2);
    }
    put_le32(qh4, qh);
}

static void dequant_q5_0(const uint8_t *b, float *y)
{
    float d = half(b);
    int q[QK];
    unpack_q5(b + 2, b + 6, q);
    for (int j = 0; j < QK; j++)
        y[j] = (q[j] - 16) * d;
}

static void quant_q5_0(const float *x, uint8_t *b)
{
    float d = signed_absmax(x, QK) / -16, id = d ? 1.0f / d : 0.0f;
    put_half(b, d);
    int q[QK];
    for (int j = 0; j < QK; j++)
        q[j] = (uint8_t)imin(31, (int8_t)(x[j] * id + 16.5f));
    pack_q5(q, b + 2, b + 6);
}

static void dequant_q5_1(const uint8_t *b, float *y)
{
    float d = half(b), m = half(b + 2);
    int q[QK];
    unpack_q5(b + 4, b + 8, q);
    for (int j = 0; j < QK; j++)
        y[j] = q[j] * d + m;
}

static void quant_q5_1(const float *x, uint8_t *b)
{
    float mn, mx;
    min_max(x, QK, &mn, &mx);
    float d = (mx - mn) / 31, id = d ? 1.0f / d : 0.0f;
    put_half(b, d);
    put_half(b + 2, mn);
    int q[QK];
    for (int j = 0; j < QK; j++)
        q[j] = (uint8_t)((x[j] - mn) * id + 0.5f);
    pack_q5(q, b + 4, b + 8);
}

/* ---------------------------------------------------------------- K-format helpers */

/* Symmetric levels in [-nmax, nmax) for n values, the scale refined by a
 * weighted least-squares fit (weights x^2) over 19 trial scales; L gets
 * level + nmax. Returns the scale. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float max = signed_absmax(x, n);
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's group fit: levels in [-nmax, nmax) refined coordinate by coordinate. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
    float max = signed_absmax(x, n);
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = imax(-nmax, imin(nmax - 1, nearest_int(x[i] * sl2 / slx)));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Levels in [0, nmax] with a scale and a (non-positive) offset fitted by
 * weighted least squares over nstep + 1 trial scales; *the_min gets -offset. */
static float fit_affine(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                        float *the_min, float rmin, float rdelta, int nstep, bool use_mad)
{
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)imax(0, imin(nmax, nearest_int(iscale * (x[i] - min))));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(0, imin(nmax, nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Q4_K/Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 15) | (q[j - 4] >> 6) << 4);
        *m = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

static void put_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t *q)
{
    if (j < 4) {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
        q[j - 4] |= (uint8_t)((ls >> 4) << 6);
        q[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* Q4_K/Q5_K: 8 groups of 32 with affine fits, scales and mins quantized to
 * 6 bits against the block's largest, then the levels recomputed against
 * the stored scales. scales12 gets the packed scales; L the levels. */
static void fit_k4(const float *x, int nmax, float rmin, int nstep, uint8_t *d_half,
                   uint8_t *dmin_half, uint8_t *scales12, uint8_t *L)
{
    float mins[QK_K / 32], scales[QK_K / 32], weights[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_affine(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], rmin, 0.1f,
                               nstep, false);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales12, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)imin(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        uint8_t lm = (uint8_t)imin(63, (uint8_t)nearest_int(inv_min * mins[j]));
        put_scale_min_k4(j, ls, lm, scales12);
    }
    put_half(d_half, max_scale / 63.f);
    put_half(dmin_half, max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        scale_min_k4(j, scales12, &sc, &m);
        float d = half(d_half) * sc;
        if (!d)
            continue;
        float dm = half(dmin_half) * m;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)imax(0, imin(nmax, nearest_int((x[32 * j + i] + dm) / d)));
    }
}

/* ---------------------------------------------------------------- Q2_K */

static void dequant_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *scales = b, *q = b + 16;
    float d = half(b + 80), min = half(b + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2)
            for (int h = 0; h < 2; h++) {
                uint8_t sc = scales[is++];
                float dl = d * (sc & 15), ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * ((q[l + 16 * h] >> shift) & 3) - ml;
            }
        q += 32;
    }
}

static void quant_q2_k(const float *x, uint8_t *b)
{
    uint8_t L[QK_K], *scales = b, *qs = b + 16;
    float weights[16], mins[QK_K / 16], sc[QK_K / 16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        for (int l = 0; l < 16; l++)
            weights[l] = fabsf(x[16 * j + l]);
        sc[j] = fit_affine(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15,
                           true);
        if (sc[j] > max_scale)
            max_scale = sc[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    if (max_scale > 0) {
        float iscale = 15.f / max_scale;
        for (int j = 0; j < QK_K / 16; j++)
            scales[j] = (uint8_t)nearest_int(iscale * sc[j]);
        put_half(b + 80, max_scale / 15.f);
    } else {
        memset(scales, 0, 16);
        put_half(b + 80, 0.f);
    }
    if (max_min > 0) {
        float iscale = 15.f / max_min;
        for (int j = 0; j < QK_K / 16; j++)
            scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
        put_half(b + 82, max_min / 15.f);
    } else {
        put_half(b + 82, 0.f);
    }
    for (int j = 0; j < QK_K / 16; j++) {
        float d = half(b + 80) * (scales[j] & 15);
        if (!d)
            continue;
        float dm = half(b + 82) * (scales[j] >> 4);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)imax(0, imin(3, nearest_int((x[16 * j + i] + dm) / d)));
    }
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 |
                                      L[j + l + 96] << 6);
}

/* ---------------------------------------------------------------- Q3_K */

/* Scale j (0..15) of a Q3_K block: 4 low bits in scales[0..8), 2 high bits in scales[8..12). */
static int q3_scale(const uint8_t *s, int j)
{
    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    return (lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
}

static void dequant_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32, *s = b + 96;
    float d_all = half(b + 108);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int h = 0; h < 2; h++) {
                float dl = d_all * q3_scale(s, is++);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (((q[l + 16 * h] >> shift) & 3) - ((hm[l + 16 * h] & m) ? 0 : 4));
            }
            m <<= 1;
        }
        q += 32;
    }
}

static void quant_q3_k(const float *x, uint8_t *b)
{
    int8_t L[QK_K];
    float sc[QK_K / 16];
    uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        sc[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
        if (fabsf(sc[j]) > amax) {
            amax = fabsf(sc[j]);
            max_scale = sc[j];
        }
    }
    memset(s, 0, 12);
    if (max_scale) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < QK_K / 16; j++) {
            int8_t l = (int8_t)nearest_int(iscale * sc[j]);
            l = (int8_t)(imax(-32, imin(31, l)) + 32);
            if (j < 8)
                s[j] = l & 15;
            else
                s[j - 8] |= (uint8_t)((l & 15) << 4);
            l >>= 4;
            s[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
        }
        put_half(b + 108, 1 / iscale);
    } else {
        put_half(b + 108, 0.f);
    }
    for (int j = 0; j < QK_K / 16; j++) {
        float d = half(b + 108) * q3_scale(s, j);
        if (!d)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(imax(-4, imin(3, nearest_int(x[16 * j + i] / d))) + 4);
    }
    memset(hmask, 0, QK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; j++) {
        if (L[j] > 3) {
            hmask[m] |= hm;
            L[j] -= 4;
        }
        if (++m == QK_K / 8) {
            m = 0;
            hm <<= 1;
        }
    }
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 |
                                      L[j + l + 96] << 6);
}

/* ---------------------------------------------------------------- Q4_K, Q5_K */

static void dequant_q4_k(const uint8_t *b, float *y)
{
    float d = half(b), min = half(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
        uint8_t sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * sc, m1 = min * m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (q[l] & 15) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (q[l] >> 4) - m2;
    }
}

static void quant_q4_k(const float *x, uint8_t *b)
{
    uint8_t L[QK_K];
    fit_k4(x, 15, -1.f, 20, b, b + 2, b + 4, L);
    uint8_t *q = b + 16;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++)
            q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
}

static void dequant_q5_k(const uint8_t *b, float *y)
{
    float d = half(b), min = half(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        uint8_t sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * sc, m1 = min * m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * ((ql[l] & 15) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}

static void quant_q5_k(const float *x, uint8_t *b)
{
    uint8_t L[QK_K];
    fit_k4(x, 31, -0.5f, 15, b, b + 2, b + 4, L);
    uint8_t *qh = b + 16, *ql = b + 48;
    memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, m1 <<= 2, m2 <<= 2, ql += 32)
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | l2 << 4);
        }
}

/* ---------------------------------------------------------------- Q6_K */

static void dequant_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half(b + 208);
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            int q2 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
}

static void quant_q6_k(const float *x, uint8_t *b)
{
    int8_t L[QK_K];
    float sc[QK_K / 16];
    float max_scale = 0, max_abs = 0;
    for (int ib = 0; ib < QK_K / 16; ib++) {
        sc[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
        if (fabsf(sc[ib]) > max_abs) {
            max_abs = fabsf(sc[ib]);
            max_scale = sc[ib];
        }
    }
    memset(b, 0, 210);
    if (max_abs < GROUP_MAX_EPS)
        return; /* all zero, d = 0 */
    int8_t *scales = (int8_t *)(b + 192);
    float iscale = -128.f / max_scale;
    put_half(b + 208, 1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ib++)
        scales[ib] = (int8_t)imin(127, nearest_int(iscale * sc[ib]));
    for (int j = 0; j < QK_K / 16; j++) {
        float d = half(b + 208) * scales[j];
        if (!d)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(imax(-32, imin(31, nearest_int(x[16 * j + i] / d))) + 32);
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((L[j + l] & 15) | (L[j + l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((L[j + l + 32] & 15) | (L[j + l + 96] & 15) << 4);
            qh[l] = (uint8_t)((L[j + l] >> 4) | (L[j + l + 32] >> 4) << 2 |
                              (L[j + l + 64] >> 4) << 4 | (L[j + l + 96] >> 4) << 6);
        }
}

/* ---------------------------------------------------------------- MLX affine groups */

static float mlx_scalar(enum dtype st, const uint8_t *p)
{
    if (st == DTYPE_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return st == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static void mlx_put_scalar(enum dtype st, float f, uint8_t *p)
{
    if (st == DTYPE_F32) {
        memcpy(p, &f, 4);
        return;
    }
    uint16_t h = st == DTYPE_BF16 ? f32_to_bf16(f) : quant_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* x = scale * q + bias, q element j of the little-endian words at bit j * bits. */
static void dequant_mlx(enum dtype t, const uint8_t *b, float *y)
{
    enum dtype st = dtype_mlx_scale(t);
    size_t w = st == DTYPE_F32 ? 4 : 2;
    int bits = dtype_mlx_bits(t), g = dtype_mlx_group(t);
    float scale = mlx_scalar(st, b), bias = mlx_scalar(st, b + w);
    const uint8_t *q = b + 2 * w;
    uint32_t mask = (1u << bits) - 1;
    for (int j = 0; j < g; j++) {
        uint32_t word;
        memcpy(&word, q + (size_t)(j * bits / 32) * 4, 4);
        y[j] = scale * (float)((word >> (j * bits % 32)) & mask) + bias;
    }
}

/* MLX's affine_quantize: the range's larger-magnitude end is the edge, the
 * scale (range / (2^bits - 1), at least 1e-7, negative when the edge is the
 * maximum) is adjusted so the edge is a whole number of steps, and the bias
 * is that edge (0 when it rounds to no steps). Codes come from the scale and
 * bias as stored. */
static void quant_mlx(enum dtype t, const float *x, uint8_t *b)
{
    enum dtype st = dtype_mlx_scale(t);
    size_t w = st == DTYPE_F32 ? 4 : 2;
    int bits = dtype_mlx_bits(t), g = dtype_mlx_group(t), n_bins = (1 << bits) - 1;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < g; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    bool min_edge = fabsf(lo) > fabsf(hi);
    float scale = (hi - lo) / (float)n_bins;
    scale = scale > 1e-7f ? scale : 1e-7f;
    scale = min_edge ? scale : -scale;
    float edge = min_edge ? lo : hi;
    float q0 = rintf(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }
    mlx_put_scalar(st, scale, b);
    mlx_put_scalar(st, bias, b + w);
    scale = mlx_scalar(st, b);
    bias = mlx_scalar(st, b + w);
    uint8_t *q = b + 2 * w;
    memset(q, 0, (size_t)(g * bits / 8));
    for (int j = 0; j < g; j++) {
        float v = scale != 0.0f ? rintf((x[j] - bias) / scale) : 0.0f;
        uint32_t c = v < 0.0f ? 0u : v > (float)n_bins ? (uint32_t)n_bins : (uint32_t)v;
        uint32_t word;
        memcpy(&word, q + (size_t)(j * bits / 32) * 4, 4);
        word |= c << (j * bits % 32);
        memcpy(q + (size_t)(j * bits / 32) * 4, &word, 4);
    }
}

/* ---------------------------------------------------------------- rows */

typedef void (*dequant_fn)(const uint8_t *block, float *y);
typedef void (*quant_fn)(const float *x, uint8_t *block);

static const struct {
    dequant_fn dequant;
    quant_fn quant;
} formats[DTYPE_COUNT] = {
    [DTYPE_Q8_0] = {dequant_q8_0, quant_q8_0}, [DTYPE_Q4_0] = {dequant_q4_0, quant_q4_0},
    [DTYPE_Q4_1] = {dequant_q4_1, quant_q4_1}, [DTYPE_Q5_0] = {dequant_q5_0, quant_q5_0},
    [DTYPE_Q5_1] = {dequant_q5_1, quant_q5_1}, [DTYPE_Q2_K] = {dequant_q2_k, quant_q2_k},
    [DTYPE_Q3_K] = {dequant_q3_k, quant_q3_k}, [DTYPE_Q4_K] = {dequant_q4_k, quant_q4_k},
    [DTYPE_Q5_K] = {dequant_q5_k, quant_q5_k}, [DTYPE_Q6_K] = {dequant_q6_k, quant_q6_k},
};

void quant_dequantize_row(enum dtype t, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    if (t == DTYPE_F32) {
        memcpy(dst, s, (size_t)n * 4);
        return;
    }
    if (t == DTYPE_BF16 || t == DTYPE_F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = t == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        return;
    }
    int qk = dtype_block_elems(t);
    size_t bytes = dtype_block_bytes(t);
    for (int64_t i = 0; i < n / qk; i++)
        if (dtype_is_mlx(t))
            dequant_mlx(t, s + (size_t)i * bytes, dst + i * qk);
        else
            formats[t].dequant(s + (size_t)i * bytes, dst + i * qk);
}

void quant_quantize_row(enum dtype t, const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    if (t == DTYPE_F32) {
        memcpy(d, src, (size_t)n * 4);
        return;
    }
    if (t == DTYPE_BF16 || t == DTYPE_F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = t == DTYPE_BF16 ? f32_to_bf16(src[i]) : quant_f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return;
    }
    int qk = dtype_block_elems(t);
    size_t bytes = dtype_block_bytes(t);
    for (int64_t i = 0; i < n / qk; i++)
        if (dtype_is_mlx(t))
            quant_mlx(t, src + i * qk, d + (size_t)i * bytes);
        else
            formats[t].quant(src + i * qk, d + (size_t)i * bytes);
}
