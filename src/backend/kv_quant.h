/* backend/kv_quant.h — quantized KV formats (affine and TurboQuant): their record layout, the
 * randomized Hadamard rotation and the Lloyd–Max codebooks, shared by the CPU and CUDA backends so
 * both read and write the same bytes. */
#ifndef INFERD_BACKEND_KV_QUANT_H
#define INFERD_BACKEND_KV_QUANT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KVQ_FN static inline __host__ __device__
#else
#define KVQ_FN static inline
#endif

/* ---- formats -------------------------------------------------------------------
 * Each layer's K and V rows are stored per KV head as one record of
 * kvq_head_bytes bytes; a slot's row is n_kv_heads records side by side.
 *
 * AFFINE (mlx-lm style), bits b in {4, 8}, group g in {32, 64} along head_dim:
 *     record = codes[head_dim * b / 8] | (f16 scale, f16 bias)[head_dim / g]
 *     x[d] ~= scale[d / g] * code[d] + bias[d / g],   code in [0, 2^b - 1]
 * TURBO (TurboQuant, Zandieh et al. 2025), bits b in {2, 3, 4, 5, 8}:
 *     y = R x, R = H D the randomized Hadamard rotation (D random signs from the
 *     seed, H the orthonormal Walsh–Hadamard transform, block-diagonal over
 *     power-of-two blocks when head_dim is not one, e.g. 96 = 64 + 32);
 *     s = |x| / sqrt(head_dim); code[d] = the Lloyd–Max level of N(0, 1) at b
 *     bits nearest y[d] / s;
 *     record = f16 s | codes[head_dim * b / 8]
 *     y[d] ~= s * level[code[d]]
 *   with QJL (keys only): the codes take b - 1 bits and the residual
 *   r = y - s * level[code] gets one more bit per coordinate, its sign after a
 *   second rotation R' (independent signs): z = sign(R' r), plus f16 |r|:
 *     record = f16 s | f16 |r| | codes[head_dim * (b - 1) / 8] | z bits[head_dim / 8]
 *     <q, x> ~= s * sum level[code[d]] (R q)[d]
 *               + |r| sqrt(pi / 2) / sqrt(head_dim) * sum z[d] (R' R q)[d]
 *   (the QJL estimator of <R q, r> with the rows of sqrt(head_dim) R' as its
 *   projections). Attention rotates each query once (R q) instead of
 *   un-rotating keys, accumulates values in the rotated frame and rotates each
 *   output row back once (R^T). Codes are packed little-endian, lowest
 *   coordinate in the lowest bits. */

enum kv_quant_scheme { KV_QUANT_NONE = 0, KV_QUANT_AFFINE = 1, KV_QUANT_TURBO = 2 };

/* One layer's K and V format. */
struct kv_quant_layer {
    uint8_t scheme;     /* enum kv_quant_scheme */
    uint8_t k_bits, v_bits; /* AFFINE: equal, 4 or 8; TURBO: 2, 3, 4, 5 or 8 each */
    uint8_t group_size; /* AFFINE: 32 or 64 */
    uint8_t qjl;        /* TURBO: keys spend one of their k_bits on the QJL residual */
};

#define KV_QUANT_MAX_LAYERS 256

/* A whole cache's format: every layer's (n_layers 0: layer[0] for all). */
struct kv_quant {
    int n_layers;
    bool per_layer;     /* from a kv_config.json */
    uint64_t seed;      /* TURBO: the rotation's signs */
    uint64_t digest;    /* the per-layer config's identity (0 without one) */
    struct kv_quant_layer layer[KV_QUANT_MAX_LAYERS];
};

KVQ_FN const struct kv_quant_layer *kvq_layer(const struct kv_quant *q, int layer)
{
    return &q->layer[q->n_layers > 0 ? layer : 0];
}

/* Whether both backends' kernels read l: affine 4 or 8 bits alike in groups
 * of 32 or 64; TurboQuant 2, 3, 4, 5 or 8 bits each, QJL with 3 to 5 key bits. */
KVQ_FN bool kvq_layer_readable(const struct kv_quant_layer *l)
{
    if (l->scheme == KV_QUANT_AFFINE)
        return (l->k_bits == 4 || l->k_bits == 8) && l->v_bits == l->k_bits &&
               (l->group_size == 32 || l->group_size == 64);
    if (l->scheme == KV_QUANT_TURBO) {
        bool k = l->k_bits == 2 || l->k_bits == 3 || l->k_bits == 4 || l->k_bits == 5 ||
                 l->k_bits == 8;
        bool v = l->v_bits == 2 || l->v_bits == 3 || l->v_bits == 4 || l->v_bits == 5 ||
                 l->v_bits == 8;
        return k && v && (!l->qjl || (l->k_bits >= 3 && l->k_bits <= 5));
    }
    return l->scheme == KV_QUANT_NONE;
}

/* Bits per code as stored (QJL keys give one to the residual). */
KVQ_FN int kvq_code_bits(const struct kv_quant_layer *l, bool v)
{
    int b = v ? l->v_bits : l->k_bits;
    return (!v && l->scheme == KV_QUANT_TURBO && l->qjl) ? b - 1 : b;
}

/* Bytes of one head's record (head_dim a multiple of 16). */
KVQ_FN int kvq_head_bytes(const struct kv_quant_layer *l, int head_dim, bool v)
{
    int code_bytes = head_dim * kvq_code_bits(l, v) / 8;
    if (l->scheme == KV_QUANT_AFFINE)
        return code_bytes + head_dim / l->group_size * 4;
    if (l->scheme == KV_QUANT_TURBO)
        return 2 + code_bytes + ((!v && l->qjl) ? 2 + head_dim / 8 : 0);
    return head_dim * 4;
}

/* ---- f16 ------------------------------------------------------------------------ */

KVQ_FN float kvq_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; overflow saturates to the largest finite f16; every NaN is
 * the one quiet NaN 0x7e00 (its sign and payload depend on which operand an
 * instruction propagated, which differs between equal computations). */
KVQ_FN uint16_t kvq_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x477ff000) /* >= 65520 rounds past the largest finite: saturate */
        return (uint16_t)(ax > 0x7f800000 ? 0x7e00 : sign | 0x7bff);
    if (ax < 0x38800000) { /* subnormal or zero in f16 */
        if (ax < 0x33000000)
            return (uint16_t)sign;
        uint32_t man = (ax & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(ax >> 23);
        uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rest > half || (rest == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000; /* rebias exponent */
    uint32_t low = r & 0x1fff;
    r >>= 13;
    if (low > 0x1000 || (low == 0x1000 && (r & 1)))
        r++;
    return (uint16_t)(sign | r);
}

KVQ_FN float kvq_load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kvq_f16_to_f32(h);
}

KVQ_FN void kvq_store_f16(uint8_t *p, float f)
{
    uint16_t h = kvq_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* ---- packing ------------------------------------------------------------------ */

KVQ_FN int kvq_get_code(const uint8_t *codes, int i, int bits)
{
    if (bits == 8)
        return codes[i];
    int bit = i * bits, sh = bit & 7;
    uint32_t w = codes[bit >> 3];
    if (sh + bits > 8) /* the code reaches into the next byte */
        w |= (uint32_t)codes[(bit >> 3) + 1] << 8;
    return (int)((w >> sh) & ((1u << bits) - 1));
}

KVQ_FN void kvq_put_code(uint8_t *codes, int i, int bits, int code)
{
    if (bits == 8) {
        codes[i] = (uint8_t)code;
        return;
    }
    int bit = i * bits;
    uint32_t mask = ((1u << bits) - 1) << (bit & 7);
    uint32_t v = (uint32_t)code << (bit & 7);
    codes[bit >> 3] = (uint8_t)((codes[bit >> 3] & ~mask) | (v & mask));
    if ((bit & 7) + bits > 8)
        codes[(bit >> 3) + 1] =
            (uint8_t)((codes[(bit >> 3) + 1] & ~(mask >> 8)) | ((v & mask) >> 8));
}

/* ---- the rotation ----------------------------------------------------------------
 * R = H D over head_dim split into power-of-two blocks, largest first. */

KVQ_FN uint64_t kvq_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The signs of coordinates 64 * (d >> 6) .. + 63, one bit each (set: -1). */
KVQ_FN uint64_t kvq_sign_word(uint64_t seed, int which, int layer, int d)
{
    return kvq_mix64(seed ^ kvq_mix64(((uint64_t)which << 40) ^ ((uint64_t)layer << 20) ^
                                      (uint64_t)(d >> 6) ^ 0x9e3779b97f4a7c15ull));
}

/* which: 0 keys, 1 values, 2 the QJL rotation. +1 or -1. */
KVQ_FN float kvq_sign(uint64_t seed, int which, int layer, int d)
{
    return ((kvq_sign_word(seed, which, layer, d) >> (d & 63)) & 1) ? -1.0f : 1.0f;
}

/* x[d] *= kvq_sign(..., d) for d < n, each 64 signs drawn once. */
KVQ_FN void kvq_apply_signs(float *x, int n, uint64_t seed, int which, int layer)
{
    for (int d0 = 0; d0 < n; d0 += 64) {
        uint64_t w = kvq_sign_word(seed, which, layer, d0);
        for (int d = d0; d < n && d < d0 + 64; d++)
            x[d] *= ((w >> (d & 63)) & 1) ? -1.0f : 1.0f;
    }
}

/* In-place orthonormal Walsh–Hadamard transform of x[0, n), block-diagonal. */
KVQ_FN void kvq_fwht(float *x, int n)
{
    int off = 0;
    while (off < n) {
        int len = 1;
        while (len * 2 <= n - off)
            len *= 2;
        float *b = x + off;
        for (int h = 1; h < len; h *= 2)
            for (int i = 0; i < len; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    float a = b[j], c = b[j + h];
                    b[j] = a + c;
                    b[j + h] = a - c;
                }
        float norm = 1.0f / sqrtf((float)len);
        for (int i = 0; i < len; i++)
            b[i] *= norm;
        off += len;
    }
}

/* y = R x in place (signs, then H). */
KVQ_FN void kvq_rotate(float *x, int n, uint64_t seed, int which, int layer)
{
    kvq_apply_signs(x, n, seed, which, layer);
    kvq_fwht(x, n);
}

/* x = R^T y in place (H is symmetric: H, then the signs). */
KVQ_FN void kvq_unrotate(float *x, int n, uint64_t seed, int which, int layer)
{
    kvq_fwht(x, n);
    kvq_apply_signs(x, n, seed, which, layer);
}

/* ---- Lloyd–Max codebooks for N(0, 1) ------------------------------------------------
 * levels[b][0, 2^b) ascending, and the decision thresholds between them
 * (midpoints). Computed on the host by Lloyd's iteration from a uniform start;
 * the 3-bit book is ±{0.2451, 0.7560, 1.3439, 2.1520}. */

struct kvq_codebooks {
    float levels[9][256];
    float bounds[9][256]; /* bounds[b][i]: between levels i and i + 1 */
};

/* Host functions (in .cu files too: the CUDA backend uploads the books it computes). */
static inline double kvq_phi(double x) { return exp(-0.5 * x * x) * 0.3989422804014327; }
static inline double kvq_cdf(double x) { return 0.5 * erfc(-x * 0.7071067811865476); }

static inline void kvq_codebooks_init(struct kvq_codebooks *cb)
{
    memset(cb, 0, sizeof *cb);
    double lv[256], bd[257];
    for (int b = 1; b <= 8; b++) {
        int n = 1 << b;
        double span = b == 1 ? 1.0 : 1.0 + 0.5 * b; /* a start inside the mass */
        for (int i = 0; i < n; i++)
            lv[i] = -span + 2.0 * span * (i + 0.5) / n;
        int iters = b <= 5 ? 2000 : 400;
        for (int it = 0; it < iters; it++) {
            bd[0] = -1e30;
            bd[n] = 1e30;
            for (int i = 1; i < n; i++)
                bd[i] = 0.5 * (lv[i - 1] + lv[i]);
            for (int i = 0; i < n; i++) {
                double a = bd[i], c = bd[i + 1];
                double mass = kvq_cdf(c) - kvq_cdf(a);
                double pa = a < -1e29 ? 0 : kvq_phi(a), pc = c > 1e29 ? 0 : kvq_phi(c);
                if (mass > 1e-300)
                    lv[i] = (pa - pc) / mass;
            }
        }
        for (int i = 0; i < n; i++)
            cb->levels[b][i] = (float)lv[i];
        for (int i = 0; i + 1 < n; i++)
            cb->bounds[b][i] = 0.5f * (cb->levels[b][i] + cb->levels[b][i + 1]);
    }
}

/* The level index nearest v among 2^bits levels: how many of the ascending
 * bounds v is above (a branchless binary search; NaN is above none). */
KVQ_FN int kvq_nearest(const float *bounds, int bits, float v)
{
    int lo = 0;
    for (int step = 1 << (bits - 1); step >= 1; step >>= 1)
        lo += v > bounds[lo + step - 1] ? step : 0;
    return lo;
}

/* The sum of x[d]^2 over d < n in double as every backend forms it: 32
 * partial sums (partial j fuses x[j]^2, x[j + 32]^2, .. in order), then
 * pairwise sums in a butterfly (partial j plus partial j ^ o for o = 16, 8,
 * 4, 2, 1; each pair's sums are equal, addition being commutative), the
 * order of a warp's lanes and shuffles. */
static inline double kvq_sum_squares(const float *x, int n)
{
    double p[32], q[32];
    for (int j = 0; j < 32; j++) {
        p[j] = 0;
        for (int d = j; d < n; d += 32)
            p[j] = fma((double)x[d], (double)x[d], p[j]);
    }
    for (int o = 16; o >= 1; o >>= 1) {
        for (int j = 0; j < 32; j++)
            q[j] = p[j] + p[j ^ o];
        memcpy(p, q, sizeof p);
    }
    return p[0];
}

/* ---- one head's record: quantize and dequantize (the reference) ---------------------
 * scratch: head_dim floats. The dequantized vector is in the original frame. */

KVQ_FN void kvq_quantize_head(const struct kv_quant_layer *l, const struct kvq_codebooks *cb,
                              uint64_t seed, int layer, int head_dim, bool v, const float *x,
                              uint8_t *rec, float *scratch)
{
    int bits = kvq_code_bits(l, v);
    if (l->scheme == KV_QUANT_AFFINE) {
        int g = l->group_size, levels = (1 << bits) - 1;
        uint8_t *codes = rec, *scales = rec + head_dim * bits / 8;
        for (int g0 = 0; g0 < head_dim; g0 += g) {
            float mn = x[g0], mx = x[g0];
            for (int d = g0 + 1; d < g0 + g; d++) {
                mn = x[d] < mn ? x[d] : mn;
                mx = x[d] > mx ? x[d] : mx;
            }
            /* quantize against the f16-rounded scale and bias the reader will see */
            float bias = kvq_f16_to_f32(kvq_f32_to_f16(mn));
            float scale = kvq_f16_to_f32(kvq_f32_to_f16((mx - bias) / (float)levels));
            float inv = scale > 0 ? 1.0f / scale : 0.0f;
            for (int d = g0; d < g0 + g; d++) {
                int c = (int)lrintf((x[d] - bias) * inv);
                c = c < 0 ? 0 : c > levels ? levels : c;
                kvq_put_code(codes, d, bits, c);
            }
            kvq_store_f16(scales + (g0 / g) * 4, scale);
            kvq_store_f16(scales + (g0 / g) * 4 + 2, bias);
        }
        return;
    }
    /* TURBO */
    int which = v ? 1 : 0;
    float *y = scratch;
    memcpy(y, x, (size_t)head_dim * sizeof *y);
    double norm2 = kvq_sum_squares(x, head_dim);
    kvq_rotate(y, head_dim, seed, which, layer);
    float s = kvq_f16_to_f32(kvq_f32_to_f16((float)sqrt(norm2 / head_dim)));
    kvq_store_f16(rec, s);
    bool qjl = !v && l->qjl;
    uint8_t *codes = rec + (qjl ? 4 : 2);
    float inv = s > 0 ? 1.0f / s : 0.0f;
    const float *lv = cb->levels[bits];
    for (int d = 0; d < head_dim; d++) {
        int c = kvq_nearest(cb->bounds[bits], bits, y[d] * inv);
        kvq_put_code(codes, d, bits, c);
        y[d] = fmaf(-s, lv[c], y[d]); /* the residual, for QJL; fused on every backend */
    }
    if (!qjl)
        return;
    kvq_store_f16(rec + 2, (float)sqrt(kvq_sum_squares(y, head_dim)));
    kvq_rotate(y, head_dim, seed, 2, layer);
    uint8_t *signs = codes + head_dim * bits / 8;
    for (int i = 0; i < head_dim / 8; i++)
        signs[i] = 0;
    for (int d = 0; d < head_dim; d++)
        if (y[d] >= 0)
            signs[d >> 3] |= (uint8_t)(1u << (d & 7));
}

/* x = the record's vector in the original frame (for QJL keys: the vector
 * whose inner products are the estimator's). */
KVQ_FN void kvq_dequantize_head(const struct kv_quant_layer *l, const struct kvq_codebooks *cb,
                                uint64_t seed, int layer, int head_dim, bool v,
                                const uint8_t *rec, float *x, float *scratch)
{
    int bits = kvq_code_bits(l, v);
    if (l->scheme == KV_QUANT_AFFINE) {
        int g = l->group_size;
        const uint8_t *scales = rec + head_dim * bits / 8;
        for (int d = 0; d < head_dim; d++) {
            float scale = kvq_load_f16(scales + (d / g) * 4);
            float bias = kvq_load_f16(scales + (d / g) * 4 + 2);
            x[d] = scale * (float)kvq_get_code(rec, d, bits) + bias;
        }
        return;
    }
    bool qjl = !v && l->qjl;
    float s = kvq_load_f16(rec);
    const uint8_t *codes = rec + (qjl ? 4 : 2);
    for (int d = 0; d < head_dim; d++)
        x[d] = s * cb->levels[bits][kvq_get_code(codes, d, bits)];
    if (qjl) {
        float coef = kvq_load_f16(rec + 2) * 1.2533141373155003f / sqrtf((float)head_dim);
        const uint8_t *signs = codes + head_dim * bits / 8;
        for (int d = 0; d < head_dim; d++)
            scratch[d] = ((signs[d >> 3] >> (d & 7)) & 1) ? 1.0f : -1.0f;
        kvq_unrotate(scratch, head_dim, seed, 2, layer); /* R'^T z */
        for (int d = 0; d < head_dim; d++)
            x[d] += coef * scratch[d];
    }
    kvq_unrotate(x, head_dim, seed, v ? 1 : 0, layer);
}

#endif
