/* backend/cuda/attention_quant.cu — a quantized KV cache (backend/kv_quant.h) on the GPU: quantize-on-write (a warp per record, the CPU's bytes), flash-decoding over tiles of records (a per-record split-K kernel for QJL keys and other head dims), and prefill from tiles decoded into shared memory (fp16 on tensor cores in FAST mode, f32 otherwise), all reading the records directly, or in FAST mode a prefill step's records decoded once into an f16 window for the f16 cache's kernel; TurboQuant rotates each query once and each output row back once. */
#include <cuda_fp16.h>
#include <float.h>
#include <limits.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fa_mma.cuh"
#include "backend/cuda/fa_wgmma.cuh"
#include "backend/cuda/kv_records.cuh"
#include "backend/cuda/kv_rotate.cuh"
#include "backend/cuda/wgmma.cuh"

/* The attention scratch (cu_attention_part_floats, attention.cu): this many
 * merge counters first, then the split partials, PART_STRIDE floats each:
 * m, l, acc[hd] from the third. */
#define Q_COUNTERS 4096
#define Q_PART_STRIDE(hd) ((hd) + 4)
#define QD_WARPS 4
#define QP_BQ 32
#define QP_BK 32
#define QP_THREADS 128
#define QP_WARPS (QP_THREADS / 32)
#define FULL 0xffffffffu

/* ---- records -------------------------------------------------------------- */

static __device__ __forceinline__ size_t qrow_off(const struct cu_kv &kv, int layer,
                                                  uint32_t block, int slot, bool v)
{
    return (((size_t)layer * kv.n_blocks + block) * kv.block_size + slot) *
           (v ? kv.v_row_bytes : kv.k_row_bytes);
}

/* The record of kv head h at position pos (block table bt). */
static __device__ __forceinline__ const uint8_t *qrecord(const struct cu_kv &kv, int layer,
                                                         const uint32_t *bt, int pos, int h,
                                                         bool v)
{
    const uint8_t *base = (const uint8_t *)(v ? kv.v : kv.k);
    return base + qrow_off(kv, layer, bt[pos / kv.block_size], pos % kv.block_size, v) +
           (size_t)h * kvq_head_bytes(&kv.fmt, kv.head_dim, v);
}

static __device__ __forceinline__ float ld_f16(const uint8_t *p)
{
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* Element d of a record in attention's frame (the rotated one for TURBO);
 * QJL keys give their Lloyd–Max part only. levels: the books' levels at the
 * record's code width. The CPU kernels' arithmetic: fmaf(code, scale, bias),
 * s * level. */
static __device__ __forceinline__ float q_elem(const struct kv_quant_layer &f, bool v, int hd,
                                               const uint8_t *rec, int d, const float *levels)
{
    if (f.scheme == KV_QUANT_AFFINE) {
        int bits = v ? f.v_bits : f.k_bits;
        const uint8_t *sc = rec + hd * bits / 8 + (d / f.group_size) * 4;
        return fmaf((float)kvq_get_code(rec, d, bits), ld_f16(sc), ld_f16(sc + 2));
    }
    if (f.scheme == KV_QUANT_TURBO) {
        bool qjl = !v && f.qjl;
        int bits = kvq_code_bits(&f, v);
        return ld_f16(rec) * levels[kvq_get_code(rec + (qjl ? 4 : 2), d, bits)];
    }
    return ((const float *)rec)[d];
}

/* The value kvq_quantize_head's serial scan keeps for a group of x[0..n):
 * m = x[0], then m = x[d] wherever x[d] beats it (MAX: x[d] > m, else
 * x[d] < m). That is the first element, in index order, of those no other
 * element beats (ties such as -0 and +0 keep the earlier one; a NaN never
 * beats, a NaN x[0] is never beaten), found by lanes together: each lane
 * sees its elements in order, then the lanes' picks meet, the earlier index
 * winning a tie. */
template <bool MAX>
struct serial_extreme {
    float best = 0.0f;
    int at = INT_MAX;

    __device__ __forceinline__ void see(float v, int d)
    {
        if (v == v && (at == INT_MAX || (MAX ? v > best : v < best))) {
            best = v;
            at = d;
        }
    }

    /* The picks of `lanes` consecutive lanes meet (a power of two, the
     * groups aligned). */
    __device__ __forceinline__ void meet(int lanes)
    {
        for (int o = lanes / 2; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(FULL, best, o);
            const int oat = __shfl_xor_sync(FULL, at, o);
            const bool beats = MAX ? ob > best : ob < best, beaten = MAX ? best > ob : best < ob;
            if (oat != INT_MAX && (at == INT_MAX || beats || (!beaten && oat < at))) {
                best = ob;
                at = oat;
            }
        }
    }

    /* The scan's value, given the group's first element. */
    __device__ __forceinline__ float value(float first) const
    {
        return first != first ? first : best;
    }
};

/* serial_extreme over x[0..n) by the warp, lane l seeing x[l], x[l + 32], .. */
template <bool MAX>
static __device__ __forceinline__ float warp_serial_extreme(const float *x, int n, int lane)
{
    serial_extreme<MAX> e;
    for (int d = lane; d < n; d += 32)
        e.see(x[d], d);
    e.meet(32);
    return e.value(x[0]);
}

/* kvq_f16_to_f32(kvq_f32_to_f16(x)) and kvq_f32_to_f16(x): the hardware's
 * rounding, except where it would overflow or x is NaN (kvq_f32_to_f16
 * saturates and writes one NaN). */
static __device__ __forceinline__ uint16_t f16_bits(float x)
{
    return fabsf(x) < 65520.0f ? __half_as_ushort(__float2half_rn(x)) : kvq_f32_to_f16(x);
}

static __device__ __forceinline__ float f16_round(float x)
{
    return fabsf(x) < 65520.0f ? __half2float(__float2half_rn(x))
                               : kvq_f16_to_f32(kvq_f32_to_f16(x));
}

/* serial_extreme over a group held E elements a lane, in index order, by L
 * consecutive lanes (L a power of two, the groups aligned). first: the
 * group's first element; idx0: the index of this lane's x[0]. */
template <bool MAX, int E>
static __device__ __forceinline__ float lanes_serial_extreme(const float (&x)[E], int idx0, int L,
                                                             float first)
{
    serial_extreme<MAX> e;
#pragma unroll
    for (int i = 0; i < E; i++)
        e.see(x[i], idx0 + i);
    e.meet(L);
    return e.value(first);
}

/* An affine record of src (hd = 32 E floats) into rec by one warp in
 * kvq_quantize_head's arithmetic, so the bytes are the CPU's: lane l holds
 * elements E l .. E l + E - 1 in registers, a group's group_size / E lanes
 * find its extrema together, and each lane writes its codes' whole bytes. */
template <int E>
static __device__ void warp_quantize_affine(const struct kv_quant_layer &f, bool v,
                                            const float *src, uint8_t *rec, int lane)
{
    const int hd = 32 * E, bits = kvq_code_bits(&f, v), g = f.group_size, L = g / E;
    const int levels = (1 << bits) - 1;
    float x[E];
#pragma unroll
    for (int i = 0; i < E; i++)
        x[i] = src[E * lane + i];
    const float first = __shfl_sync(FULL, x[0], lane & ~(L - 1));
    const float mn = lanes_serial_extreme<false, E>(x, E * lane, L, first);
    const float mx = lanes_serial_extreme<true, E>(x, E * lane, L, first);
    const float bias = f16_round(mn);
    const float scale = f16_round(__fdiv_rn(mx - bias, (float)levels));
    const float inv = scale > 0 ? __fdiv_rn(1.0f, scale) : 0.0f;
    uint64_t word = 0; /* the lane's codes as kvq_put_code lays them out */
#pragma unroll
    for (int i = 0; i < E; i++) {
        int c = (int)lrintf(__fmul_rn(x[i] - bias, inv));
        c = c < 0 ? 0 : c > levels ? levels : c;
        word |= (uint64_t)(unsigned)c << (i * bits);
    }
    const int bytes = E * bits / 8;
    for (int b = 0; b < bytes; b++)
        rec[lane * bytes + b] = (uint8_t)(word >> (8 * b));
    if ((lane & (L - 1)) == 0) {
        uint8_t *pair = rec + hd * bits / 8 + (E * lane / g) * 4;
        const uint16_t sb = f16_bits(scale), bb = f16_bits(bias);
        pair[0] = (uint8_t)sb, pair[1] = (uint8_t)(sb >> 8);
        pair[2] = (uint8_t)bb, pair[3] = (uint8_t)(bb >> 8);
    }
}

/* kvq_sum_squares' butterfly over the lanes' partial sums, every lane
 * returning the total. */
static __device__ __forceinline__ double warp_sum_partials(double p)
{
    for (int o = 16; o >= 1; o >>= 1)
        p += __shfl_xor_sync(FULL, p, o);
    return p;
}

/* kvq_sum_squares of x (shared, n floats) by a warp, every lane returning
 * it: lane j's partial sum, then the butterfly of shuffles. */
static __device__ __forceinline__ double warp_sum_squares(const float *x, int n)
{
    const int lane = threadIdx.x & 31;
    double p = 0;
    for (int d = lane; d < n; d += 32)
        p = fma((double)x[d], (double)x[d], p);
    return warp_sum_partials(p);
}

/* The same of a vector held strided in registers (lane l: elements l,
 * l + 32, ..): partial sum l is the lane's own, in order. */
template <int E>
static __device__ __forceinline__ double lanes_sum_squares(const float (&x)[E])
{
    double p = 0;
#pragma unroll
    for (int e = 0; e < E; e++)
        p = fma((double)x[e], (double)x[e], p);
    return warp_sum_partials(p);
}

/* Codes held strided (lane l: codes of elements l, l + 32, ..) written as
 * kvq_put_code lays them out: codes 8 g .. 8 g + 7, eight lanes' for one e,
 * are bytes bits g .. bits g + bits - 1, gathered by shuffles and written a
 * byte a lane. */
template <int E>
static __device__ __forceinline__ void warp_put_codes_strided(uint8_t *codes,
                                                              const uint32_t (&c)[E], int bits,
                                                              int lane)
{
    const int t = lane & 7;
#pragma unroll
    for (int e = 0; e < E; e++) {
        if (bits == 8) {
            codes[lane + 32 * e] = (uint8_t)c[e];
            continue;
        }
        uint8_t *group = codes + (lane / 8 + 4 * e) * bits;
        if (bits <= 4) {
            uint32_t w = c[e] << (t * bits);
            for (int o = 1; o < 8; o <<= 1)
                w |= __shfl_xor_sync(FULL, w, o);
            if (t < bits)
                group[t] = (uint8_t)(w >> (8 * t));
        } else {
            unsigned long long w = (unsigned long long)c[e] << (t * bits);
            for (int o = 1; o < 8; o <<= 1)
                w |= __shfl_xor_sync(FULL, w, o);
            if (t < bits)
                group[t] = (uint8_t)(w >> (8 * t));
        }
    }
}

/* A TurboQuant record of src (HD floats, HD a power of two) into rec by one
 * warp in kvq_quantize_head's arithmetic, so the bytes are the CPU's: lane l
 * holds elements l, l + 32, .. in registers (kvq_sum_squares' partial sums
 * are then the lanes' own), rotated by shuffles (warp_rotate_regs); lv, bd:
 * the levels and bounds of the record's side, signs_side and signs_qjl the
 * sign words (lane_signs) of its rotation and of the QJL one, all in shared
 * memory. */
template <int HD>
static __device__ void warp_quantize_turbo(const struct cu_kv &kv, bool v, const float *src,
                                           uint8_t *rec, const float *lv, const float *bd,
                                           const uint64_t *signs_side, const uint64_t *signs_qjl,
                                           int lane)
{
    constexpr int E = HD / 32;
    const int bits = kvq_code_bits(&kv.fmt, v);
    const bool qjl = !v && kv.fmt.qjl;
    float x[E];
#pragma unroll
    for (int e = 0; e < E; e++)
        x[e] = src[lane + 32 * e];
    const float s = f16_round((float)sqrt(lanes_sum_squares<E>(x) / HD));
    if (lane == 0)
        kvq_store_f16(rec, s);
    warp_rotate_regs<HD, true>(x, lane_signs<HD, true>(signs_side, lane), lane, false);
    const float inv = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
    uint32_t c[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        c[e] = (uint32_t)kvq_nearest(bd, bits, __fmul_rn(x[e], inv));
        x[e] = fmaf(-s, lv[c[e]], x[e]);
    }
    uint8_t *codes = rec + (qjl ? 4 : 2);
    warp_put_codes_strided<E>(codes, c, bits, lane);
    if (!qjl)
        return;
    const float r = (float)sqrt(lanes_sum_squares<E>(x));
    if (lane == 0)
        kvq_store_f16(rec + 2, r);
    warp_rotate_regs<HD, true>(x, lane_signs<HD, true>(signs_qjl, lane), lane, false);
    uint8_t *signs = codes + HD * bits / 8;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const uint32_t b = __ballot_sync(FULL, x[e] >= 0); /* elements 32 e + lane */
        if (lane < 4)
            signs[4 * e + lane] = (uint8_t)(b >> (8 * lane));
    }
}

/* One record of x (shared, hd floats; clobbered) into rec by one warp, in
 * kvq_quantize_head's arithmetic and order (TURBO's sums of squares as
 * kvq_sum_squares forms them, warp_sum_squares; the extrema of an affine
 * group are the serial scan's, warp_serial_extreme), so the bytes are the
 * CPU's. codes: hd ints of shared scratch. */
static __device__ void warp_quantize(const struct cu_kv &kv, int layer, bool v, float *x,
                                     int *codes, uint8_t *rec)
{
    const struct kv_quant_layer f = kv.fmt;
    const int lane = threadIdx.x & 31, hd = kv.head_dim;
    __syncwarp();
    if (f.scheme == KV_QUANT_NONE) {
        for (int d = lane; d < hd; d += 32)
            ((float *)rec)[d] = x[d];
        return;
    }
    const int bits = kvq_code_bits(&f, v);
    uint8_t *code_base = rec;
    if (f.scheme == KV_QUANT_AFFINE) {
        const int g = f.group_size, levels = (1 << bits) - 1;
        uint8_t *scales = rec + hd * bits / 8;
        for (int g0 = 0; g0 < hd; g0 += g) {
            const float mn = warp_serial_extreme<false>(x + g0, g, lane);
            const float mx = warp_serial_extreme<true>(x + g0, g, lane);
            float bias = kvq_f16_to_f32(kvq_f32_to_f16(mn));
            float scale = kvq_f16_to_f32(kvq_f32_to_f16(__fdiv_rn(mx - bias, (float)levels)));
            float inv = scale > 0 ? __fdiv_rn(1.0f, scale) : 0.0f;
            for (int d = g0 + lane; d < g0 + g; d += 32) {
                int c = (int)lrintf(__fmul_rn(x[d] - bias, inv));
                codes[d] = c < 0 ? 0 : c > levels ? levels : c;
            }
            if (lane == 0) {
                kvq_store_f16(scales + (g0 / g) * 4, scale);
                kvq_store_f16(scales + (g0 / g) * 4 + 2, bias);
            }
        }
    } else {
        const bool qjl = !v && f.qjl;
        const float *lv = kv.cb->levels[bits], *bd = kv.cb->bounds[bits];
        const float s = kvq_f16_to_f32(kvq_f32_to_f16((float)sqrt(warp_sum_squares(x, hd) / hd)));
        if (lane == 0)
            kvq_store_f16(rec, s);
        warp_rotate(x, hd, kv.seed, v ? 1 : 0, layer, false);
        float inv = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
        for (int d = lane; d < hd; d += 32) {
            int c = kvq_nearest(bd, bits, __fmul_rn(x[d], inv));
            codes[d] = c;
            x[d] = fmaf(-s, lv[c], x[d]);
        }
        code_base = rec + (qjl ? 4 : 2);
        if (qjl) {
            __syncwarp();
            const float r = (float)sqrt(warp_sum_squares(x, hd));
            if (lane == 0)
                kvq_store_f16(rec + 2, r);
            warp_rotate(x, hd, kv.seed, 2, layer, false);
            uint8_t *signs = code_base + hd * bits / 8;
            for (int i = lane; i < hd / 8; i += 32) {
                unsigned byte = 0;
                for (int t = 0; t < 8; t++)
                    byte |= (x[8 * i + t] >= 0 ? 1u : 0u) << t;
                signs[i] = (uint8_t)byte;
            }
        }
    }
    __syncwarp();
    /* each lane packs whole bytes: no two lanes write one */
    if (bits == 8) {
        for (int i = lane; i < hd; i += 32)
            code_base[i] = (uint8_t)codes[i];
        return;
    }
    if (bits == 4) {
        for (int i = lane; i < hd / 2; i += 32)
            code_base[i] = (uint8_t)((codes[2 * i] & 15) | (codes[2 * i + 1] & 15) << 4);
        return;
    }
    /* codes are a little-endian bit stream (kvq_put_code): codes 8 g .. 8 g + 7
     * are bytes bits g .. bits g + bits - 1, one lane's */
    for (int g = lane; g < hd / 8; g += 32) {
        uint64_t word = 0;
        for (int t = 0; t < 8; t++)
            word |= (uint64_t)(unsigned)codes[8 * g + t] << (t * bits);
        for (int b = 0; b < bits; b++)
            code_base[g * bits + b] = (uint8_t)(word >> (8 * b));
    }
}

/* ---- quantize on write: a warp per record ------------------------------ */

/* A block takes QS_ROWS rows of one kv head: warp 2 r + 0 the K record of
 * row r, 2 r + 1 its V record. Affine and TurboQuant records of head dims
 * 64, 128 and 256 (E = head dim / 32) are quantized from registers
 * (warp_quantize_affine, warp_quantize_turbo); the others (E = 0) go
 * through shared memory (warp_quantize). */
#define QS_ROWS 4

template <int E, bool TURBO>
static __global__ void __launch_bounds__(64 * QS_ROWS)
qkv_store_kernel(struct cu_kv kv, int layer, const float *k, const float *v, uint32_t spans_off,
                 int n_spans, int n_rows, const uint8_t *params)
{
    __shared__ float xs[2 * QS_ROWS][E ? 1 : CU_MAX_HEAD_DIM];
    __shared__ int cs[2 * QS_ROWS][E ? 1 : CU_MAX_HEAD_DIM];
    __shared__ float books[TURBO ? 2 : 1][2][TURBO ? 256 : 1]; /* [K, V][levels, bounds] */
    __shared__ uint64_t sign_words[TURBO ? 3 : 1][TURBO ? E / 2 : 1]; /* K, V, QJL */
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int row = blockIdx.x * QS_ROWS + w / 2, head = blockIdx.y;
    if constexpr (TURBO) {
        /* the sides' 2^bits levels and bounds, then the rotations' sign words */
        const int kbits = kvq_code_bits(&kv.fmt, false), vbits = kvq_code_bits(&kv.fmt, true);
        const int kn = 2 << kbits, n = kn + (2 << vbits);
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const bool side = i >= kn;
            const int bits = side ? vbits : kbits, at = side ? i - kn : i;
            const bool bound = at >= 1 << bits;
            books[side][bound][at & ((1 << bits) - 1)] =
                (bound ? kv.cb->bounds : kv.cb->levels)[bits][at & ((1 << bits) - 1)];
        }
        if (threadIdx.x >= 64 * QS_ROWS - 3 * E / 2) { /* threads the books leave idle */
            const int i = threadIdx.x - (64 * QS_ROWS - 3 * E / 2);
            const int which = i / (E / 2), k = i % (E / 2);
            sign_words[which][k] = kvq_sign_word(kv.seed, which, layer, 64 * k);
        }
        __syncthreads();
    }
    const struct cu_span *spans = (const struct cu_span *)(params + spans_off);
    const int *rowmap = (const int *)(spans + n_spans);
    if (row >= n_rows || rowmap[row] < 0)
        return;
    const struct cu_span *sp = &spans[rowmap[row]];
    const int pos = sp->pos0 + (row - sp->row0), hd = kv.head_dim;
    const bool isv = w & 1;
    const float *src = (isv ? v : k) + ((size_t)row * kv.n_kv_heads + head) * hd;
    const uint32_t *bt = (const uint32_t *)(params + sp->bt_off);
    uint8_t *rec = (uint8_t *)qrecord(kv, layer, bt, pos, head, isv);
    if constexpr (TURBO) {
        warp_quantize_turbo<32 * E>(kv, isv, src, rec, books[isv][0], books[isv][1],
                                    sign_words[isv], sign_words[2], lane);
    } else if constexpr (E > 0) {
        warp_quantize_affine<E>(kv.fmt, isv, src, rec, lane);
    } else {
        for (int d = lane; d < hd; d += 32)
            xs[w][d] = src[d];
        warp_quantize(kv, layer, isv, xs[w], cs[w], rec);
    }
}

cudaError_t cu_launch_kv_store_quant(cudaStream_t s, const struct cu_op *op,
                                     const uint8_t *params)
{
    if (op->n_rows == 0)
        return cudaSuccess;
    const struct cu_kv *kv = &op->u.store.kv;
    const int hd = kv->head_dim;
    if (hd > CU_MAX_HEAD_DIM || hd % 16)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)((op->n_rows + QS_ROWS - 1) / QS_ROWS), (unsigned)kv->n_kv_heads);
    const bool affine = kv->fmt.scheme == KV_QUANT_AFFINE;
    const bool turbo = kv->fmt.scheme == KV_QUANT_TURBO;
    /* a group's lanes must be a power of two: group sizes 32 and 64 are */
    auto kernel = qkv_store_kernel<0, false>;
    if (affine && hd == 64)
        kernel = qkv_store_kernel<2, false>;
    else if (affine && hd == 128)
        kernel = qkv_store_kernel<4, false>;
    else if (affine && hd == 256)
        kernel = qkv_store_kernel<8, false>;
    else if (turbo && hd == 64)
        kernel = qkv_store_kernel<2, true>;
    else if (turbo && hd == 128)
        kernel = qkv_store_kernel<4, true>;
    else if (turbo && hd == 256)
        kernel = qkv_store_kernel<8, true>;
    kernel<<<grid, 64 * QS_ROWS, 0, s>>>(*kv, op->u.store.layer, op->u.store.k, op->u.store.v,
                                         op->u.store.spans_off, op->u.store.n_spans,
                                         (int)op->n_rows, params);
    return cudaGetLastError();
}

/* ---- rows and their positions ------------------------------------------- */

/* The positions row attends to, [*first, *last], and its block table;
 * false for a row no span covers. */
static __device__ __forceinline__ bool q_row(const struct cu_op &op, const uint8_t *params,
                                             int row, int *first, int *last, const uint32_t **bt)
{
    const struct cu_span *spans = (const struct cu_span *)(params + op.u.attn.spans_off);
    const int *rowmap = (const int *)(spans + op.u.attn.n_spans);
    if (rowmap[row] < 0)
        return false;
    const struct cu_span *sp = &spans[rowmap[row]];
    *bt = (const uint32_t *)(params + sp->bt_off);
    *last = sp->pos0 + (row - sp->row0);
    *first = 0;
    if (op.u.attn.window > 0 && *last - op.u.attn.window + 1 > 0)
        *first = *last - op.u.attn.window + 1;
    return true;
}

/* What a decode block takes: blockIdx.x a kv head and a chunk of up to gp of
 * its query heads (ng of them, the first h0), blockIdx.y a split of the
 * positions ([begin, end] of the row's), blockIdx.z the row. */
struct q_block {
    int kvh, h0, ng, split, n_splits, row, begin, end;
    const uint32_t *bt;
};

/* false for a row no span covers (the block has nothing to do) */
static __device__ __forceinline__ bool q_block_of(const struct cu_op &op, const uint8_t *params,
                                                  int gp, q_block *b)
{
    const int group = op.u.attn.n_heads / op.u.attn.kv.n_kv_heads;
    const int chunks_per_kv = (group + gp - 1) / gp;
    const int hc = blockIdx.x % chunks_per_kv;
    b->kvh = blockIdx.x / chunks_per_kv;
    b->h0 = b->kvh * group + hc * gp;
    b->ng = group - hc * gp < gp ? group - hc * gp : gp;
    b->split = blockIdx.y, b->n_splits = gridDim.y, b->row = blockIdx.z;
    int first, last;
    if (!q_row(op, params, b->row, &first, &last, &b->bt))
        return false;
    const int chunk = (op.u.attn.ctx_bucket + b->n_splits - 1) / b->n_splits;
    b->begin = b->split * chunk > first ? b->split * chunk : first;
    b->end = b->split * chunk + chunk - 1 < last ? b->split * chunk + chunk - 1 : last;
    return true;
}

/* TURBO's Lloyd–Max levels for the key and value code widths into shared
 * memory (lv[0..255] keys, lv[256..511] values), by the block's threads. */
static __device__ __forceinline__ void q_levels_to_shared(const struct cu_kv &kv, int kbits,
                                                          int vbits, float *lv)
{
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        lv[i] = i < (1 << kbits) ? kv.cb->levels[kbits][i] : 0.0f;
        lv[256 + i] = i < (1 << vbits) ? kv.cb->levels[vbits][i] : 0.0f;
    }
}

/* ---- decode: a row, up to GP query heads of one kv head, a split --------- */

/* QD_WARPS warps take interleaved positions of the split; lane l holds head
 * dims [l * DPL, l * DPL + DPL) of the query, of every K and V record it
 * decodes (contiguous codes: a warp reads a record front to back) and of the
 * accumulator. Each warp keeps an online softmax per query head; the warps
 * merge through shared memory. One split writes out; more leave (m, l, acc)
 * in part for qattn_combine_kernel. TURBO: the queries are rotated once in
 * shared memory (keys' R, and R' after it for the QJL signs) and the output
 * stays in the values' rotated frame for qattn_unrotate_kernel. */
template <int DPL, int GP>
static __global__ void __launch_bounds__(QD_WARPS * 32)
qattn_decode_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    constexpr int QS = DPL * 32; /* shared floats per head */
    __shared__ __align__(16) float buf[QD_WARPS * GP * QS];
    __shared__ float lv_sm[2][256];
    __shared__ float sm_m[QD_WARPS][GP], sm_l[QD_WARPS][GP];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int hd = kv.head_dim, layer = op.u.attn.layer;
    q_block b;
    if (!q_block_of(op, params, GP, &b))
        return;
    const int kvh = b.kvh, h0 = b.h0, ng = b.ng, split = b.split, n_splits = b.n_splits;
    const int row = b.row, begin = b.begin, end = b.end;
    const uint32_t *bt = b.bt;

    const bool turbo = f.scheme == KV_QUANT_TURBO, qjl = turbo && f.qjl;
    const int kbits = kvq_code_bits(&f, false), vbits = kvq_code_bits(&f, true);
    if (turbo)
        q_levels_to_shared(kv, kbits, vbits, &lv_sm[0][0]);
    const int q_dim = op.u.attn.n_heads * hd;
    float *q_sm = buf, *qs_sm = buf + GP * QS;
    for (int i = threadIdx.x; i < GP * QS; i += blockDim.x) {
        int g = i / QS, d = i % QS;
        q_sm[i] = g < ng && d < hd ? op.u.attn.q[(size_t)row * q_dim + (size_t)(h0 + g) * hd + d]
                                   : 0.0f;
    }
    __syncthreads();
    if (turbo)
        for (int g = warp; g < ng; g += QD_WARPS) {
            warp_rotate(q_sm + g * QS, hd, kv.seed, 0, layer, false);
            if (qjl) {
                for (int d = lane; d < hd; d += 32)
                    qs_sm[g * QS + d] = q_sm[g * QS + d];
                warp_rotate(qs_sm + g * QS, hd, kv.seed, 2, layer, false);
            }
        }
    __syncthreads();

    const int d0 = lane * DPL;
    float q[GP][DPL], qs[GP][DPL], acc[GP][DPL], m[GP], l[GP];
#pragma unroll
    for (int g = 0; g < GP; g++) {
        m[g] = -FLT_MAX;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            q[g][j] = q_sm[g * QS + d0 + j];
            qs[g][j] = qjl ? qs_sm[g * QS + d0 + j] : 0.0f;
            acc[g][j] = 0.0f;
        }
    }
    const bool mine = d0 < hd; /* lanes past head_dim hold zeros */
    const float qjl_unit = 1.2533141373155003f / sqrtf((float)hd); /* sqrt(pi/2) / sqrt(hd) */
    for (int p = begin + warp; p <= end; p += QD_WARPS) {
        const uint8_t *kr = qrecord(kv, layer, bt, p, kvh, false);
        const uint8_t *vr = qrecord(kv, layer, bt, p, kvh, true);
        float kd[DPL], vd[DPL], z[DPL];
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            kd[j] = mine ? q_elem(f, false, hd, kr, d0 + j, lv_sm[0]) : 0.0f;
            vd[j] = mine ? q_elem(f, true, hd, vr, d0 + j, lv_sm[1]) : 0.0f;
            z[j] = 0.0f;
        }
        float coef = 0.0f;
        if (qjl) {
            const uint8_t *signs = kr + 4 + hd * kbits / 8;
            coef = ld_f16(kr + 2) * qjl_unit;
#pragma unroll
            for (int j = 0; j < DPL; j++)
                z[j] = !mine ? 0.0f : ((signs[(d0 + j) >> 3] >> ((d0 + j) & 7)) & 1) ? 1.0f : -1.0f;
        }
#pragma unroll
        for (int g = 0; g < GP; g++) {
            if (g < ng) {
                float s = 0.0f, sz = 0.0f;
#pragma unroll
                for (int j = 0; j < DPL; j++) {
                    s = fmaf(q[g][j], kd[j], s);
                    sz = fmaf(qs[g][j], z[j], sz);
                }
                for (int o = 16; o > 0; o >>= 1) {
                    s += __shfl_xor_sync(FULL, s, o);
                    sz += __shfl_xor_sync(FULL, sz, o);
                }
                s = (qjl ? fmaf(coef, sz, s) : s) * op.u.attn.scale;
                osm_add_score(s, vd, m[g], l[g], acc[g]);
            }
        }
    }
    /* merge the warps: buf now holds every warp's accumulators */
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GP; g++) {
        if (g < ng) {
            if (lane == 0) {
                sm_m[warp][g] = m[g];
                sm_l[warp][g] = l[g];
            }
#pragma unroll
            for (int j = 0; j < DPL; j++)
                buf[(warp * GP + g) * QS + d0 + j] = acc[g][j];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        float M = osm_max(QD_WARPS, &sm_m[0][g], GP), L, A;
        osm_merge(QD_WARPS, &sm_m[0][g], &sm_l[0][g], GP, buf + g * QS + d, GP * QS, M, &L, &A);
        int head = h0 + g;
        if (n_splits == 1) {
            op.u.attn.out[(size_t)row * q_dim + (size_t)head * hd + d] = A / L;
        } else {
            float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) *
                                   (size_t)Q_PART_STRIDE(hd);
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
}

static __global__ void qattn_combine_kernel(struct cu_op op, const uint8_t *params,
                                            const float *part, int n_splits)
{
    int head = blockIdx.x, row = blockIdx.y;
    int first, last;
    const uint32_t *bt;
    if (!q_row(op, params, row, &first, &last, &bt))
        return;
    int hd = op.u.attn.kv.head_dim;
    const float *pp = part + ((size_t)row * op.u.attn.n_heads + head) * n_splits *
                                 (size_t)Q_PART_STRIDE(hd);
    float M = osm_max(n_splits, pp, Q_PART_STRIDE(hd));
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float L, A;
        osm_merge(n_splits, pp, pp + 1, Q_PART_STRIDE(hd), pp + 2 + d, Q_PART_STRIDE(hd), M, &L,
                  &A);
        op.u.attn.out[(size_t)row * op.u.attn.n_heads * hd + (size_t)head * hd + d] = A / L;
    }
}

/* TURBO: each output row (a warp per row and head) back from the values'
 * rotated frame, R^T, once. */
static __global__ void qattn_unrotate_kernel(struct cu_op op, const uint8_t *params)
{
    __shared__ float x[CU_MAX_HEAD_DIM];
    const int row = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    int first, last;
    const uint32_t *bt;
    if (!q_row(op, params, row, &first, &last, &bt))
        return;
    const int hd = op.u.attn.kv.head_dim;
    float *o = op.u.attn.out + ((size_t)row * op.u.attn.n_heads + head) * hd;
    for (int d = lane; d < hd; d += 32)
        x[d] = o[d];
    warp_rotate(x, hd, op.u.attn.kv.seed, 1, op.u.attn.layer, true);
    for (int d = lane; d < hd; d += 32)
        o[d] = x[d];
}

/* ---- decode: tiles of records, the group's query heads, a split -------- */

/* The bytes of a record a lane reads, in aligned 32-bit words as loaded (the
 * row pitch is a multiple of 16 bytes, so no word leaves the record's row),
 * kept raw until a tile's loads are all in flight. */
struct q_raw {
    uint32_t w[5];
    uint32_t shift; /* bits of w[0] before the first byte */
};

/* n (<= 16) bytes from p: one 16- or 8-byte load when p is aligned to it
 * (8-bit keys, 8- and 4-bit values of affine records), else 32-bit words. */
static __device__ __forceinline__ q_raw q_load(const uint8_t *p, int n)
{
    q_raw r;
    if (n == 16 && ((uintptr_t)p & 15) == 0) {
        const uint4 v = __ldg((const uint4 *)p);
        return q_raw{{v.x, v.y, v.z, v.w, 0u}, 0u};
    }
    if (n <= 8 && ((uintptr_t)p & 7) == 0) {
        const uint2 v = __ldg((const uint2 *)p);
        return q_raw{{v.x, v.y, 0u, 0u, 0u}, 0u};
    }
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const int lead = (int)((uintptr_t)p & 3), nw = (lead + n + 3) / 4;
    r.shift = 8u * (uint32_t)lead;
#pragma unroll
    for (int i = 0; i < 5; i++)
        r.w[i] = i < nw ? __ldg(a + i) : 0u;
    return r;
}

/* Codes 0..N-1 of B bits each, packed from the raw's first byte on. */
template <int B, int N>
static __device__ __forceinline__ void q_codes(const q_raw &r, uint32_t (&c)[N])
{
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = __funnelshift_r(r.w[i], r.w[i + 1], r.shift);
#pragma unroll
    for (int j = 0; j < N; j++) {
        constexpr uint32_t mask = (1u << B) - 1;
        const int bit = j * B, word = bit >> 5, off = bit & 31;
        uint32_t v = off + B <= 32 ? w[word] >> off : __funnelshift_r(w[word], w[word + 1], off);
        c[j] = v & mask;
    }
}

/* N elements of a record from its codes: affine as bare codes (the caller
 * applies scale and bias per lane), TURBO as levels (the caller applies the
 * norm). */
template <int B, int N>
static __device__ __forceinline__ void q_values_b(const q_raw &r, bool turbo, const float *levels,
                                                  float (&x)[N])
{
    uint32_t c[N];
    q_codes<B, N>(r, c);
/* a code below 2^23 as a float: its bits under 2^23's exponent, less 2^23 */
#pragma unroll
    for (int j = 0; j < N; j++)
        x[j] = turbo ? levels[c[j]] : __uint_as_float(0x4B000000u | c[j]) - 8388608.0f;
}

template <int N>
static __device__ __forceinline__ void q_values(const q_raw &r, int bits, bool turbo,
                                                const float *levels, float (&x)[N])
{
    switch (bits) {
    case 2: q_values_b<2, N>(r, turbo, levels, x); break;
    case 3: q_values_b<3, N>(r, turbo, levels, x); break;
    case 4: q_values_b<4, N>(r, turbo, levels, x); break;
    case 5: q_values_b<5, N>(r, turbo, levels, x); break;
    default: q_values_b<8, N>(r, turbo, levels, x); break;
    }
}

/* The records of one kv head in one layer, found from positions without a
 * division when the block size is a power of two (it always is in practice). */
struct q_addr {
    const uint8_t *base; /* slot 0 of block 0 */
    size_t block_bytes;
    uint32_t row_bytes, block_size, shift;
    bool pow2;
};

static __device__ __forceinline__ q_addr q_addr_of(const struct cu_kv &kv, int layer, int h,
                                                   bool v)
{
    q_addr a;
    a.row_bytes = v ? kv.v_row_bytes : kv.k_row_bytes;
    a.block_size = (uint32_t)kv.block_size;
    a.block_bytes = (size_t)a.block_size * a.row_bytes;
    a.base = (const uint8_t *)(v ? kv.v : kv.k) + (size_t)layer * kv.n_blocks * a.block_bytes +
             (size_t)h * kvq_head_bytes(&kv.fmt, kv.head_dim, v);
    a.pow2 = (a.block_size & (a.block_size - 1)) == 0;
    a.shift = (uint32_t)__ffs((int)a.block_size) - 1;
    return a;
}

static __device__ __forceinline__ const uint8_t *q_at(const q_addr &a, const uint32_t *bt,
                                                      int pos)
{
    const uint32_t p = (uint32_t)pos;
    const uint32_t blk = a.pow2 ? p >> a.shift : p / a.block_size;
    const uint32_t slot = p - blk * a.block_size;
    return a.base + (size_t)__ldg(bt + blk) * a.block_bytes + (size_t)slot * a.row_bytes;
}

/* Where a lane's (scale, bias) pair sits in a record: affine the offset of
 * the pair of the group holding dim d (pairs start on multiples of 4 bytes);
 * TURBO -1, for its norm at the record's front (a 16-bit load: records start
 * on even bytes). */
static __device__ __forceinline__ int q_pair_at(const struct kv_quant_layer &f, bool v, int hd,
                                                int d)
{
    return f.scheme == KV_QUANT_TURBO ? -1 : hd * kvq_code_bits(&f, v) / 8 + (d / f.group_size) * 4;
}

/* The raw pair, left as loaded until its tile is decoded. */
static __device__ __forceinline__ uint32_t q_pair_load(const uint8_t *rec, int at)
{
    return at < 0 ? (uint32_t)__ldg((const unsigned short *)rec)
                  : __ldg((const uint32_t *)(rec + at));
}

/* (scale, bias) of a raw pair: TURBO's norm and 0 (its high half is zero). */
static __device__ __forceinline__ float2 q_pair(uint32_t raw)
{
    return make_float2(__half2float(__ushort_as_half((unsigned short)(raw & 0xffff))),
                       __half2float(__ushort_as_half((unsigned short)(raw >> 16))));
}

#define QF_WARPS 4
#define QF_THREADS (QF_WARPS * 32)

/* Flash-decoding over records, head dims 64 and 128, affine and TURBO
 * without QJL: a block of QF_WARPS warps takes one row, up to GP query heads
 * of one kv head (the records are read and decoded once for all of them)
 * and one split of positions, walked in tiles of T. All of a tile's record
 * loads go out before the first is decoded. Scores: HD / 16 lanes share a
 * position, each with 16 contiguous dims (2 B bytes of codes: a record's
 * codes are read front to back by consecutive lanes); affine records enter
 * as scale (q . codes) + bias (sum of q), TURBO ones as norm (q . levels)
 * with the query rotated once. P V: HD / 8 lanes cover a V record, 8 dims
 * each; the accumulators take p scale codes, and p bias once per position
 * into a per-lane bias sum added at the end. Online softmax across tiles as
 * attention.cu's flash-decoding; partials leave (m, l, acc) for
 * qattn_combine_kernel. */
template <int HD, int GP>
static __global__ void __launch_bounds__(QF_THREADS)
qattn_decode_fd_kernel(struct cu_op op, const uint8_t *params, float *part)
{
    constexpr int T = 64;                  /* positions per tile */
    constexpr int LPK = HD / 16;           /* lanes per K record */
    constexpr int PPW = 32 / LPK;          /* K records per warp at a time */
    constexpr int KR = T / (QF_WARPS * PPW);
    constexpr int LPV = HD / 8;            /* lanes per V record */
    constexpr int VPW = 32 / LPV;          /* V records per warp at a time */
    constexpr int VR = T / (QF_WARPS * VPW);
    static_assert(KR >= 1 && VR >= 1 && GP <= QF_WARPS, "decode tile shape");
    __shared__ __align__(16) float q_sm[GP][HD];
    __shared__ float4 qk_sm[GP][HD / 4]; /* the scores' copy of q, swizzled */
    __shared__ float s_sm[GP][T];
    __shared__ float m_sm[GP], l_sm[GP], c_sm[GP];
    __shared__ float lv_sm[2][256];
    __shared__ __align__(16) float red[QF_WARPS][HD];

    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int layer = op.u.attn.layer;
    q_block b;
    if (!q_block_of(op, params, GP, &b))
        return;
    const int kvh = b.kvh, h0 = b.h0, ng = b.ng, split = b.split, n_splits = b.n_splits;
    const int row = b.row, begin = b.begin, end = b.end;
    const uint32_t *bt = b.bt;

    const bool turbo = f.scheme == KV_QUANT_TURBO;
    const int kbits = kvq_code_bits(&f, false), vbits = kvq_code_bits(&f, true);
    const int kcode = turbo ? 2 : 0; /* where a record's codes start */
    if (turbo)
        q_levels_to_shared(kv, kbits, vbits, &lv_sm[0][0]);
    const int q_dim = op.u.attn.n_heads * HD;
    for (int i = threadIdx.x; i < GP * HD; i += QF_THREADS) {
        int g = i / HD;
        q_sm[g][i % HD] =
            g < ng ? op.u.attn.q[(size_t)row * q_dim + (size_t)h0 * HD + i] * op.u.attn.scale
                   : 0.0f;
    }
    if (threadIdx.x < GP) {
        m_sm[threadIdx.x] = -FLT_MAX;
        l_sm[threadIdx.x] = 0.0f;
        c_sm[threadIdx.x] = 1.0f;
    }
    __syncthreads();
    if (turbo) {
        for (int g = warp; g < ng; g += QF_WARPS)
            warp_rotate(q_sm[g], HD, kv.seed, 0, layer, false);
        __syncthreads();
    }
    /* lane kl's four float4 of dims 16 kl.. go to 4 kl + ((i + kl / 2) & 3):
     * the eight lanes of a 16-byte load's phase then read eight bank groups */
    for (int i = threadIdx.x; i < GP * HD / 4; i += QF_THREADS) {
        const int g = i / (HD / 4), j = i % (HD / 4), l = j / 4;
        qk_sm[g][4 * l + ((j % 4 + (l >> 1)) & 3)] = *(const float4 *)&q_sm[g][4 * j];
    }
    __syncthreads();

    /* lane roles: K record kg of the warp's PPW, dims 16 kl..; V record vg
     * of its VPW, dims 8 vl.. */
    const int kg = lane / LPK, kl = lane % LPK;
    const int vg = lane / LPV, vl = lane % LPV;
    const q_addr ka = q_addr_of(kv, layer, kvh, false), va = q_addr_of(kv, layer, kvh, true);
    const int kpair = q_pair_at(f, false, HD, 16 * kl), vpair = q_pair_at(f, true, HD, 8 * vl);
    float qsum[GP]; /* the sum of this lane's 16 query dims, per head */
#pragma unroll
    for (int g = 0; g < GP; g++) {
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; j++)
            a += q_sm[g][16 * kl + j];
        qsum[g] = a;
    }
    float acc[GP][8], bias_acc[GP];
#pragma unroll
    for (int g = 0; g < GP; g++) {
        bias_acc[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[g][j] = 0.0f;
    }

    for (int t0 = begin; t0 <= end; t0 += T) {
        /* every load of the tile out first; pairs stay raw until used */
        q_raw kr[KR], vr[VR];
        uint32_t ksb[KR], vsb[VR];
#pragma unroll
        for (int r = 0; r < KR; r++) {
            const int p = t0 + r * (QF_WARPS * PPW) + warp * PPW + kg;
            if (p <= end) {
                const uint8_t *rec = q_at(ka, bt, p);
                kr[r] = q_load(rec + kcode + kl * 2 * kbits, 2 * kbits);
                ksb[r] = q_pair_load(rec, kpair);
            } else {
                kr[r] = q_raw{{0, 0, 0, 0, 0}, 0};
                ksb[r] = 0u;
            }
        }
#pragma unroll
        for (int r = 0; r < VR; r++) {
            const int p = t0 + r * (QF_WARPS * VPW) + warp * VPW + vg;
            if (p <= end) {
                const uint8_t *rec = q_at(va, bt, p);
                vr[r] = q_load(rec + (turbo ? 2 : 0) + vl * vbits, vbits);
                vsb[r] = q_pair_load(rec, vpair);
            } else {
                vr[r] = q_raw{{0, 0, 0, 0, 0}, 0};
                vsb[r] = 0u;
            }
        }
        /* scores */
#pragma unroll
        for (int r = 0; r < KR; r++) {
            const int c = r * (QF_WARPS * PPW) + warp * PPW + kg;
            float x[16];
            q_values<16>(kr[r], kbits, turbo, lv_sm[0], x);
            const float2 sb = q_pair(ksb[r]);
#pragma unroll
            for (int g = 0; g < GP; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 qq = qk_sm[g][4 * kl + ((i + (kl >> 1)) & 3)];
                    dot = fmaf(qq.x, x[4 * i], dot);
                    dot = fmaf(qq.y, x[4 * i + 1], dot);
                    dot = fmaf(qq.z, x[4 * i + 2], dot);
                    dot = fmaf(qq.w, x[4 * i + 3], dot);
                }
                float sc = fmaf(sb.x, dot, sb.y * qsum[g]);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1)
                    sc += __shfl_xor_sync(FULL, sc, o);
                if (kl == 0)
                    s_sm[g][c] = sc;
            }
        }
        __syncthreads();
        /* online softmax: warp g rescales query head g over the tile */
        if (warp < ng) {
            const int g = warp;
            float sv[T / 32];
            float mx = -FLT_MAX;
#pragma unroll
            for (int j = 0; j < T / 32; j++) {
                int c = lane + 32 * j;
                sv[j] = t0 + c <= end ? s_sm[g][c] : -FLT_MAX;
                mx = fmaxf(mx, sv[j]);
            }
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
            float m_old = m_sm[g];
            float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < T / 32; j++) {
                int c = lane + 32 * j;
                float pr = t0 + c <= end ? expf(sv[j] - m_new) : 0.0f;
                s_sm[g][c] = pr;
                sum += pr;
            }
            for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(FULL, sum, o);
            if (lane == 0) {
                float corr = expf(m_old - m_new);
                c_sm[g] = corr;
                l_sm[g] = fmaf(l_sm[g], corr, sum);
                m_sm[g] = m_new;
            }
        }
        __syncthreads();
        /* P V */
#pragma unroll
        for (int g = 0; g < GP; g++) {
            const float corr = c_sm[g];
            bias_acc[g] *= corr;
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[g][j] *= corr;
        }
#pragma unroll
        for (int r = 0; r < VR; r++) {
            const int c = r * (QF_WARPS * VPW) + warp * VPW + vg;
            float x[8];
            q_values<8>(vr[r], vbits, turbo, lv_sm[1], x);
            const float2 sb = q_pair(vsb[r]);
#pragma unroll
            for (int g = 0; g < GP; g++) {
                const float pw = s_sm[g][c];
                const float w = pw * sb.x;
                bias_acc[g] = fmaf(pw, sb.y, bias_acc[g]);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[g][j] = fmaf(w, x[j], acc[g][j]);
            }
        }
        __syncthreads();
    }

    /* the lanes of a warp that held other V records, then the warps */
#pragma unroll
    for (int o = LPV; o < 32; o <<= 1)
#pragma unroll
        for (int g = 0; g < GP; g++) {
            bias_acc[g] += __shfl_xor_sync(FULL, bias_acc[g], o);
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[g][j] += __shfl_xor_sync(FULL, acc[g][j], o);
        }
    /* g runs to GP, not ng, so acc stays in registers (indexed by constants) */
#pragma unroll
    for (int g = 0; g < GP; g++) {
        if (g >= ng)
            break;
        if (vg == 0)
#pragma unroll
            for (int j = 0; j < 8; j++)
                red[warp][8 * vl + j] = acc[g][j] + bias_acc[g];
        __syncthreads();
        for (int d = threadIdx.x; d < HD; d += QF_THREADS) {
            float a = red[0][d];
#pragma unroll
            for (int w = 1; w < QF_WARPS; w++)
                a += red[w][d];
            const int head = h0 + g;
            if (n_splits == 1) {
                op.u.attn.out[(size_t)row * q_dim + (size_t)head * HD + d] = a / l_sm[g];
            } else {
                float *pp = part + (((size_t)row * op.u.attn.n_heads + head) * n_splits + split) *
                                       (size_t)Q_PART_STRIDE(HD);
                if (d == 0) {
                    pp[0] = m_sm[g];
                    pp[1] = l_sm[g];
                }
                pp[2 + d] = a;
            }
        }
        __syncthreads();
    }
}

/* ---- prefill: tiles of QP_BQ queries of one head against QP_BK keys ----- */

/* attention.cu's f32 tiled kernel with the tile loads decoding records into
 * shared memory: thread t owns query row t / 4 and every fourth key column /
 * head dim from t % 4. TURBO: the tile's queries are rotated once after they
 * are loaded; a QJL key enters as its Lloyd–Max part plus coef R'^T z (the
 * vector whose inner product with R q is the estimator's), unrotated by a
 * warp per key. */
template <int HPT>
static __global__ void __launch_bounds__(QP_THREADS) qattn_prefill_kernel(struct cu_op op,
                                                                          const uint8_t *params)
{
    extern __shared__ float smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int hd = kv.head_dim, ldk = hd + 1, layer = op.u.attn.layer;
    float *sq = smem;                   /* QP_BQ x (hd + 1) */
    float *sk = sq + QP_BQ * ldk;       /* QP_BK x (hd + 1) */
    float *sv = sk + QP_BK * ldk;       /* QP_BK x hd */
    float *sp_ = sv + QP_BK * hd;       /* QP_BQ x (QP_BK + 1) */
    float *zs = sp_ + QP_BQ * (QP_BK + 1); /* QP_WARPS x hd */
    float *lv = zs + QP_WARPS * hd;     /* 2 x 256 */
    const int tid = threadIdx.x, r = tid / 4, sub = tid % 4, warp = tid / 32, lane = tid & 31;
    const int head = blockIdx.y;
    const int group = op.u.attn.n_heads / kv.n_kv_heads;
    const int kvh = head / group;
    const struct cu_span *spans = (const struct cu_span *)(params + op.u.attn.spans_off);
    const struct cu_span *span = &spans[blockIdx.z];
    const int q0 = blockIdx.x * QP_BQ;
    if (q0 >= span->n_tokens)
        return;
    const int nq = span->n_tokens - q0 < QP_BQ ? span->n_tokens - q0 : QP_BQ;
    const uint32_t *bt = (const uint32_t *)(params + span->bt_off);
    const int q_dim = op.u.attn.n_heads * hd;
    const int window = op.u.attn.window;
    const bool turbo = f.scheme == KV_QUANT_TURBO, qjl = turbo && f.qjl;
    const int kbits = kvq_code_bits(&f, false), vbits = kvq_code_bits(&f, true);
    if (turbo)
        q_levels_to_shared(kv, kbits, vbits, lv);
    for (int i = tid; i < QP_BQ * hd; i += QP_THREADS) {
        int qi = i / hd, d = i % hd;
        sq[qi * ldk + d] =
            qi < nq ? op.u.attn.q[(size_t)(span->row0 + q0 + qi) * q_dim + (size_t)head * hd + d] *
                          op.u.attn.scale
                    : 0.0f;
    }
    __syncthreads();
    if (turbo)
        for (int qi = warp; qi < nq; qi += QP_WARPS)
            warp_rotate(sq + qi * ldk, hd, kv.seed, 0, layer, false);
    const struct osm_quad_rows rows = osm_quad_rows_at(span->pos0, q0, nq, r, window);
    const float qjl_unit = 1.2533141373155003f / sqrtf((float)hd);
    float acc[HPT], m, l;
    osm_init(acc, m, l);

    for (int k0 = rows.first_pos - rows.first_pos % QP_BK; k0 <= rows.last_pos; k0 += QP_BK) {
        __syncthreads();
        for (int i = tid; i < QP_BK * hd; i += QP_THREADS) {
            int c = i / hd, d = i % hd;
            int p = k0 + c;
            float kval = 0.0f, vval = 0.0f;
            if (p <= rows.last_pos) {
                kval = q_elem(f, false, hd, qrecord(kv, layer, bt, p, kvh, false), d, lv);
                vval = q_elem(f, true, hd, qrecord(kv, layer, bt, p, kvh, true), d, lv + 256);
            }
            sk[c * ldk + d] = kval;
            sv[c * hd + d] = vval;
        }
        if (qjl) {
            __syncthreads();
            float *z = zs + warp * hd;
            for (int c = warp; c < QP_BK && k0 + c <= rows.last_pos; c += QP_WARPS) {
                const uint8_t *kr = qrecord(kv, layer, bt, k0 + c, kvh, false);
                const uint8_t *signs = kr + 4 + hd * kbits / 8;
                for (int d = lane; d < hd; d += 32)
                    z[d] = ((signs[d >> 3] >> (d & 7)) & 1) ? 1.0f : -1.0f;
                warp_rotate(z, hd, kv.seed, 2, layer, true);
                float coef = ld_f16(kr + 2) * qjl_unit;
                for (int d = lane; d < hd; d += 32)
                    sk[c * ldk + d] = fmaf(coef, z[d], sk[c * ldk + d]);
                __syncwarp();
            }
        }
        __syncthreads();
        float s[QP_BK / 4];
        float tile_max = osm_quad_scores<QP_BK>(s, sq + r * ldk, sk, ldk, hd, sub, k0,
                                                rows.row_valid, rows.my_first, rows.my_pos);
        osm_quad_tile<QP_BK>(s, tile_max, sp_ + r * (QP_BK + 1), sv, hd, sub, m, l, acc);
    }
    if (!rows.row_valid)
        return;
    float *out = op.u.attn.out + (size_t)(span->row0 + q0 + r) * q_dim + (size_t)head * hd;
    osm_quad_store(acc, l, out, hd, sub);
}

/* ---- prefill on tensor cores: records decoded into fp16 tiles ---------- */

/* attention_prefill.cu's FlashAttention-2 step (fa_mma.cuh) with the K/V
 * tiles decoded from the records into fp16 shared memory instead of copied.
 * A block of QM_WARPS warps takes HPB query heads of one kv head (the tile
 * is decoded once for all of them) and BQ = 16 QM_WARPS / HPB query rows:
 * warp w runs head w % HPB over rows 16 (w / HPB).. The tiles' records come
 * through kv_records.cuh: warp w < 4 copies those of positions 16 w .. of
 * each tile, two tiles ahead of the tile attended (cp.async), and warp w
 * decodes the K records (w < 4) or the V records (w >= 4) of positions
 * 16 (w % 4) .. into the fp16 tiles, one tile ahead: tile it + 1 is decoded
 * into one pair of fp16 tiles while tile it is attended from the other, with
 * one barrier a tile. The K decoders decode before they attend and the V
 * decoders after, so that at any time some warps keep the tensor cores busy
 * while others decode. TURBO: the queries are rotated once
 * (keys' R) in shared memory before they become fragments; the output stays
 * in the values' frame for qattn_unrotate_kernel. */
#define QM_WARPS 8
#define QM_COPIERS (FA_BK / DQ_ROWS) /* warps that copy a tile's records */
#define QM_STAGES 2

/* The prefill's shared memory: the level tables, then either TURBO's query
 * rows (before the first tile) or two pairs of fp16 tiles (K, V) and the
 * records' rooms. */
static __host__ __device__ __forceinline__ size_t qm_block_bytes(const struct kv_quant_layer &f,
                                                                 int hd)
{
    const size_t tiles = 4 * (size_t)FA_BK * hd * sizeof(__half);
    const size_t raw = (size_t)QM_STAGES * FA_BK *
                       (dq_record_room(kvq_head_bytes(&f, hd, false)) +
                        dq_record_room(kvq_head_bytes(&f, hd, true)));
    const size_t qrows = (size_t)QM_WARPS * 16 * hd * sizeof(float);
    return 2 * DQ_TABLE_BYTES + (tiles + raw > qrows ? tiles + raw : qrows) + 16;
}

/* A warp's state started for query rows wrow0 .. wrow0 + 15 of `head`: its
 * positions and Q fragments (scaled into base-2 scores). TURBO (rot, 16
 * rows of HD floats in shared memory, else NULL): the rows are rotated by
 * the keys' R there first. */
template <int HD>
static __device__ __forceinline__ void qm_load_queries(fa_warp<HD> &w, const struct cu_op &op,
                                                       const struct cu_span &span, int head,
                                                       int wrow0, float *rot, int lane)
{
    const int g = lane >> 2, t = lane & 3, n_tokens = span.n_tokens, pos0 = span.pos0;
    const int q_dim = op.u.attn.n_heads * HD;
    w.init();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int i = wrow0 + g + 8 * h;
        w.qpos[h] = pos0 + (i < n_tokens ? i : n_tokens - 1);
    }
    const float *qr[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        qr[h] = op.u.attn.q + (size_t)(span.row0 + w.qpos[h] - pos0) * q_dim + (size_t)head * HD;
    if (rot) {
        for (int r = 0; r < 16; r++) {
            const int i = wrow0 + r;
            const float *src = op.u.attn.q +
                               (size_t)(span.row0 + (i < n_tokens ? i : n_tokens - 1)) * q_dim +
                               (size_t)head * HD;
            for (int d = lane; d < HD; d += 32)
                rot[r * HD + d] = src[d];
            warp_rotate(rot + r * HD, HD, op.u.attn.kv.seed, 0, op.u.attn.layer, false);
        }
        qr[0] = rot + g * HD;
        qr[1] = rot + (g + 8) * HD;
    }
    w.load_q(qr, op.u.attn.scale * FA_LOG2E, t);
}

/* What a prefill block of either tensor-core kernel takes: blockIdx.x a kv
 * head and a run of hpb of its query heads (attending warp aw runs head
 * kvh group + .. + aw % hpb), blockIdx.y bq = 16 QM_WARPS / hpb rows of the
 * span blockIdx.z, the longest rows first. */
struct qm_block {
    int kvh, head, bq, q0;
    const struct cu_span *span;
};

static __device__ __forceinline__ qm_block qm_block_of(const struct cu_op &op,
                                                       const uint8_t *params, int hpb, int aw)
{
    qm_block b;
    const int group = op.u.attn.n_heads / op.u.attn.kv.n_kv_heads;
    const int chunks_per_kv = group / hpb;
    b.kvh = blockIdx.x / chunks_per_kv;
    b.head = b.kvh * group + (blockIdx.x % chunks_per_kv) * hpb + aw % hpb;
    b.bq = 16 * QM_WARPS / hpb;
    b.span = (const struct cu_span *)(params + op.u.attn.spans_off) + blockIdx.z;
    b.q0 = (gridDim.y - 1 - blockIdx.y) * b.bq;
    return b;
}

template <int HD>
static __global__ void __launch_bounds__(QM_WARPS * 32, 1)
qattn_prefill_mma_kernel(struct cu_op op, const uint8_t *params, int hpb)
{
    constexpr uint32_t TILE_BYTES = FA_BK * HD * sizeof(__half);
    extern __shared__ __align__(128) uint8_t qm_smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int layer = op.u.attn.layer;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const qm_block blk = qm_block_of(op, params, hpb, warp);
    const int kvh = blk.kvh, head = blk.head, bq = blk.bq, q0 = blk.q0;
    const struct cu_span *span = blk.span;
    const int n_tokens = span->n_tokens, pos0 = span->pos0;
    if (q0 >= n_tokens)
        return;
    const uint32_t *bt = (const uint32_t *)(params + span->bt_off);
    const fa_rows rows(pos0, n_tokens, q0, bq, op.u.attn.window, warp / hpb);
    const bool turbo = f.scheme == KV_QUANT_TURBO;
    /* the level tables, then the K and V tiles and the records' rooms;
     * TURBO's query rows first take that space (QM_WARPS x 16 rows of HD
     * floats) */
    uint8_t *ktab = qm_smem, *vtab = ktab + DQ_TABLE_BYTES;
    uint8_t *tiles = vtab + DQ_TABLE_BYTES; /* pair j: K at 2 j TILE_BYTES, V after it */
    uint8_t *raw = tiles + 4 * TILE_BYTES;
    float *qs = (float *)tiles;
    const dq_side ks = dq_side_of(kv, layer, kvh, HD, false), vs = dq_side_of(kv, layer, kvh, HD, true);
    if (turbo) {
        dq_levels(kv, ks.bits, ktab);
        dq_levels(kv, vs.bits, vtab);
    }

    fa_warp<HD> w;
    qm_load_queries(w, op, *span, head, rows.wrow0, turbo ? qs + warp * 16 * HD : NULL, lane);
    const int q_dim = op.u.attn.n_heads * HD;
    __syncthreads(); /* the query rows' space becomes the tiles' */

    const int kroom = dq_record_room(kvq_head_bytes(&f, HD, false));
    const int vroom = dq_record_room(kvq_head_bytes(&f, HD, true));
    const uint32_t warp_rooms = (uint32_t)QM_STAGES * DQ_ROWS * (kroom + vroom);
    const int quarter = warp % QM_COPIERS; /* the positions this warp decodes */
    dq_stream st;
    st.init(ks, vs, bt, kv.block_size, rows.last_pos,
            smem_addr(raw) + (uint32_t)quarter * warp_rooms, kroom, vroom, QM_STAGES, lane);
    const int n_tiles = rows.n_tiles;
    const bool decodes_v = warp >= QM_COPIERS;
    const dq_side mine = decodes_v ? vs : ks;
    const uint8_t *my_tab = decodes_v ? vtab : ktab;
    const int my_off = decodes_v ? DQ_ROWS * kroom : 0, my_room = decodes_v ? vroom : kroom;
    const uint32_t tiles0 = smem_addr(tiles);
    const uint32_t my_dst = tiles0 + (decodes_v ? TILE_BYTES : 0) +
                            (uint32_t)(quarter * DQ_ROWS * HD * 2);
    /* tile j's records into stage j % QM_STAGES, its fp16 tiles into pair j % 2 */
    auto copy = [&](int j) {
        if (warp < QM_COPIERS && j < n_tiles)
            st.copy(rows.k_begin + j * FA_BK + DQ_ROWS * warp, j, lane);
        cp_async_commit();
    };
    auto decode = [&](int j) {
        if (j >= n_tiles)
            return;
        const uint8_t *stage = raw + (size_t)quarter * warp_rooms +
                               (size_t)(j % QM_STAGES) * st.stage_bytes + my_off;
        /* every chunk's loads at once: nothing else hides their latency */
        dq_decode<HD, DQ_ROWS * HD / 256>(stage, my_room, mine, my_tab,
                                          my_dst + (uint32_t)(j % 2) * 2 * TILE_BYTES, lane);
    };
    auto attend = [&](int j) {
        const int k0 = rows.k_begin + j * FA_BK;
        const uint32_t kt = tiles0 + (uint32_t)(j % 2) * 2 * TILE_BYTES;
        if (!rows.skips(k0))
            w.attend(kt, kt + TILE_BYTES, k0, rows.straddles(k0), op.u.attn.window, lane);
    };
    copy(0);
    copy(1);
    cp_async_wait<1>();
    __syncthreads(); /* tile 0's records are in */
    decode(0);
    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<0>();
        __syncthreads(); /* tile it is decoded and it + 1's records are in; tile it - 1's
                            fp16 pair and tile it's stage are free */
        copy(it + 2);
        if (decodes_v) {
            attend(it);
            decode(it + 1);
        } else {
            decode(it + 1);
            attend(it);
        }
    }
    cp_async_wait<0>();
    if (rows.warp_live)
        w.store(op.u.attn.out + (size_t)span->row0 * q_dim + (size_t)head * HD, q_dim,
                rows.wrow0, n_tokens, lane);
}

/* ---- prefill on tensor cores, decoding warps beside attending ones ------ */

/* qattn_prefill_mma_kernel's attention with the decoding moved to warps of
 * its own, so that it takes the issue slots the tensor-core warps leave
 * idle instead of holding them up. Warp group 0 (QW_PRODUCERS warps, their
 * registers given back) copies the records of each tile (warp p those of
 * positions DQ_ROWS p .., cp.async, QW_RAW_STAGES - 1 tiles ahead) and
 * decodes them, K and V, into one of QW_STAGES pairs of fp16 tiles; the
 * QM_WARPS consumer warps (registers taken) hold HPB query heads' rows as
 * the other kernel's warps do and attend each pair in turn. Named barriers
 * hand a pair over: qw_full(s) opens when the producers have decoded into
 * pair s (they arrive, the consumers wait), qw_empty(s) when the consumers
 * are done with it (they arrive, the producers wait). A waiting warp issues
 * nothing; mbarriers, which the consumers would wait on without waiting for
 * each other, measured slower (their waits spin). With WG the producers
 * decode into wgmma's swizzled layout instead (QW_WG_STAGES pairs) and the
 * consumers, two warp groups, attend on wgmma (fa_wgmma.cuh's loop and
 * barriers). Needs setmaxnreg (sm_90a machine code): launched elsewhere,
 * every warp would keep the launch's 168 registers and the producers spill. */
#define QW_PRODUCERS QM_COPIERS
#define QW_THREADS ((QW_PRODUCERS + QM_WARPS) * 32)
#define QW_STAGES 2
#define QW_RAW_STAGES 3
#define QW_PRODUCER_REGS 120
#define QW_CONSUMER_REGS 192
static_assert(QW_PRODUCERS == 4, "the producers are one warp group");
static_assert(QW_PRODUCERS * 32 * QW_PRODUCER_REGS + QM_WARPS * 32 * QW_CONSUMER_REGS <= 65536,
              "the warps' registers fit the register file");

static __device__ __forceinline__ int qw_full(int s)
{
    return 1 + s;
}

static __device__ __forceinline__ int qw_empty(int s)
{
    return 1 + QW_STAGES + s;
}

/* With wgmma consumers (sm_90a): three pairs of tiles (the consumers hold
 * two while a tile's S goes out with the previous tile's P V), laid out as
 * wgmma reads them (1,024-byte aligned), handed over by fa_wgmma.cuh's
 * barriers. */
#define QW_WG_STAGES 3
using qw_wg_bars = wg_bars<QW_WG_STAGES>;

/* With wgmma consumers the blocks may also run as pairs (PAIR): blocks y and
 * y ^ 1 of a span's kv head, a cluster of two, attend the same tiles (their
 * rows are neighbours, so one tile range covers both), and each decodes one
 * side of every tile, K in rank 0 and V in rank 1, and sends its tile to
 * its peer by the copy engine: half the decoding a query row costs, which is
 * what bounds the kernel (the producers take longer than the consumers).
 * Two mbarriers a stage hand tiles between the blocks: pair full counts the
 * peer's tile landing (the block's producers arrive expecting its bytes; the
 * first warp of each consumer group waits on it beside the named full
 * barrier, so the producers go on decoding) and pair empty opens when the
 * peer's consumers are done with the stage (the peer's 4 producer warps
 * arrive, after their own empty barrier; warp 0 waits, then the producers
 * meet at a named barrier of their own). A block with no rows of its own
 * (past a span's end) still decodes for its peer. */
#define QW_PAIR_BAR_BYTES (2 * QW_WG_STAGES * 8)
#define QW_PAIR_PRODUCERS_BAR qw_wg_bars::unused

static __device__ __forceinline__ uint32_t qw_pair_full(uint32_t bars, int s)
{
    return bars + 8u * (uint32_t)s;
}

static __device__ __forceinline__ uint32_t qw_pair_empty(uint32_t bars, int s)
{
    return bars + 8u * (uint32_t)(QW_WG_STAGES + s);
}

static __host__ __device__ __forceinline__ size_t qw_block_bytes(const struct kv_quant_layer &f,
                                                                 int hd, bool wg)
{
    const size_t tiles =
        (size_t)(wg ? QW_WG_STAGES : QW_STAGES) * 2 * FA_BK * hd * sizeof(__half);
    const size_t raw = (size_t)QW_RAW_STAGES * FA_BK *
                       (dq_record_room(kvq_head_bytes(&f, hd, false)) +
                        dq_record_room(kvq_head_bytes(&f, hd, true)));
    const size_t qrows = (size_t)QM_WARPS * 16 * hd * sizeof(float);
    return 2 * DQ_TABLE_BYTES + (wg ? 1024 + QW_PAIR_BAR_BYTES : 0) +
           (tiles > qrows ? tiles : qrows) + raw;
}

template <int HD, bool WG, bool PAIR>
static __global__ void __launch_bounds__(QW_THREADS, 1)
qattn_prefill_ws_kernel(struct cu_op op, const uint8_t *params, int hpb)
{
    static_assert(WG || !PAIR, "pairs hand over wgmma's tiles");
    constexpr int STAGES = WG ? QW_WG_STAGES : QW_STAGES;
    constexpr uint32_t TILE_BYTES = FA_BK * HD * sizeof(__half);
    constexpr uint32_t QROWS = QM_WARPS * 16 * HD * sizeof(float);
    constexpr uint32_t TILES = STAGES * 2 * TILE_BYTES;
    extern __shared__ __align__(128) uint8_t qw_smem[];
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int layer = op.u.attn.layer;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const bool producer = warp < QW_PRODUCERS;
    const int cw = producer ? 0 : warp - QW_PRODUCERS; /* a consumer's warp */
    const qm_block blk = qm_block_of(op, params, hpb, cw);
    const int kvh = blk.kvh, head = blk.head, bq = blk.bq, q0 = blk.q0;
    const struct cu_span *span = blk.span;
    const int n_tokens = span->n_tokens;
    const bool live = q0 < n_tokens;
    const int peer_q0 = (int)(gridDim.y - 1 - (blockIdx.y ^ 1u)) * bq;
    const bool peer_live = PAIR && peer_q0 < n_tokens;
    if (!live && !peer_live) /* a pair leaves together */
        return;
    fa_rows rows(span->pos0, n_tokens, live ? q0 : peer_q0, bq, op.u.attn.window, cw / hpb);
    int last = rows.last_pos; /* the pair's last position */
    if (!live) {
        rows.warp_live = false;
    } else if (peer_live) {
        const fa_rows pr(span->pos0, n_tokens, peer_q0, bq, op.u.attn.window, 0);
        last = last > pr.last_pos ? last : pr.last_pos;
        rows.k_begin = rows.k_begin < pr.k_begin ? rows.k_begin : pr.k_begin;
        rows.n_tiles = (last - rows.k_begin) / FA_BK + 1;
    }
    const int n_tiles = rows.n_tiles;
    const bool turbo = f.scheme == KV_QUANT_TURBO;
    /* the level tables, the pairs of fp16 tiles (pair s: K at 2 s
     * TILE_BYTES, V after it; TURBO's query rows take that space first),
     * then the producers' rooms for records and a pair's mbarriers */
    uint8_t *ktab = qw_smem, *vtab = ktab + DQ_TABLE_BYTES;
    uint8_t *tiles = vtab + DQ_TABLE_BYTES;
    if (WG) /* wgmma's swizzle is by address: 1,024-byte aligned tiles */
        tiles += (1024u - (smem_addr(tiles) & 1023u)) & 1023u;
    uint8_t *raw = tiles + (TILES > QROWS ? TILES : QROWS);
    const dq_side ks = dq_side_of(kv, layer, kvh, HD, false), vs = dq_side_of(kv, layer, kvh, HD, true);
    if (turbo) {
        dq_levels(kv, ks.bits, ktab);
        dq_levels(kv, vs.bits, vtab);
    }
    const int kroom = dq_record_room(kvq_head_bytes(&f, HD, false));
    const int vroom = dq_record_room(kvq_head_bytes(&f, HD, true));
    const uint32_t warp_rooms = (uint32_t)QW_RAW_STAGES * DQ_ROWS * (kroom + vroom);
    const uint32_t tiles0 = smem_addr(tiles);
    const uint32_t bars = smem_addr(raw) + (uint32_t)QW_PRODUCERS * warp_rooms;
    const int rank = PAIR ? cluster_rank() : 0;
    if (PAIR && threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(qw_pair_full(bars, s), 1);
            mbar_init(qw_pair_empty(bars, s), QW_PRODUCERS);
        }
        cluster_mbar_init_fence();
    }

    if (producer) {
        const int first = rows.k_begin + DQ_ROWS * warp;
        dq_side kc = ks, vc = vs; /* the sides this block copies */
        if (PAIR)
            (rank ? kc : vc).chunks = 0;
        dq_stream st;
        st.init(kc, vc, (const uint32_t *)(params + span->bt_off), kv.block_size, last,
                smem_addr(raw) + (uint32_t)warp * warp_rooms, kroom, vroom, QW_RAW_STAGES, lane);
        st.prime<QW_RAW_STAGES>(first, n_tiles, lane);
        /* first: the consumers' raise waits for these registers */
        regs_lower_to<QW_PRODUCER_REGS>();
        __syncthreads(); /* the level tables are in; the query rows are fragments */
        const dq_side my_side = dq_side_of(kv, layer, kvh, HD, rank != 0); /* PAIR's */
        uint32_t peer = 0, peer_bars = 0;
        if (PAIR) { /* the peer's barriers are made and its query rows' space is free */
            cluster_sync();
            peer = cluster_map(tiles0, rank ^ 1) - tiles0;
            peer_bars = cluster_map(bars, rank ^ 1);
        }
        const uint8_t *mine = raw + (size_t)warp * warp_rooms;
        const uint32_t my_dst = tiles0 + (uint32_t)(warp * DQ_ROWS * (WG ? 128 : HD * 2));
        for (int j = 0; j < n_tiles; j++) {
            const uint32_t stage = st.arrive<QW_RAW_STAGES>(j, first, n_tiles, lane);
            const int s = j % STAGES;
            if (j >= STAGES) { /* the consumers are done with tile j - STAGES */
                if (live)
                    bar_sync(WG ? qw_wg_bars::empty(s) : qw_empty(s), QW_THREADS);
                if (PAIR && live && lane == 0) /* the peer may write our stage */
                    mbar_arrive_cluster(qw_pair_empty(peer_bars, s));
                if (PAIR && peer_live) { /* and we the peer's */
                    if (warp == 0)
                        mbar_wait_cluster(qw_pair_empty(bars, s), (uint32_t)(j / STAGES - 1) & 1u);
                    bar_sync(QW_PAIR_PRODUCERS_BAR, QW_PRODUCERS * 32);
                }
            }
            const uint32_t dst = my_dst + (uint32_t)s * 2 * TILE_BYTES;
            if (PAIR) {
                const uint32_t side = rank ? TILE_BYTES : 0u; /* this block's tile of the pair */
                if (live && threadIdx.x == 0) /* the peer's tile, for our consumers to wait on */
                    mbar_arrive_expect_tx(qw_pair_full(bars, s), TILE_BYTES);
                dq_decode<HD, 4, true>(mine + stage + (rank ? DQ_ROWS * kroom : 0),
                                       rank ? vroom : kroom, my_side, rank ? vtab : ktab,
                                       dst + side, lane);
                fence_proxy_async_smem(); /* the wgmma reads and the copy engine see the stores */
                if (peer_live) {
                    __syncwarp();
                    if (lane == 0) {
                        for (int sl = 0; sl < HD / 64; sl++) { /* the warp's rows of each slab */
                            const uint32_t a = dst + side + (uint32_t)(sl * FA_BK * 128);
                            bulk_copy_to_cluster(a + peer, a, DQ_ROWS * 128,
                                                 qw_pair_full(peer_bars, s));
                        }
                        bulk_commit();
                    }
                }
            } else {
                dq_decode<HD, 4, WG>(mine + stage, kroom, ks, ktab, dst, lane);
                dq_decode<HD, 4, WG>(mine + stage + DQ_ROWS * kroom, vroom, vs, vtab,
                                     dst + TILE_BYTES, lane);
                if (WG)
                    fence_proxy_async_smem(); /* the wgmma reads see the stores */
            }
            if (!live)
                continue;
            if (WG) {
                bar_arrive(qw_wg_bars::full(s, 0), 256);
                bar_arrive(qw_wg_bars::full(s, 1), 256);
            } else {
                bar_arrive(qw_full(s), QW_THREADS);
            }
        }
        cp_async_wait<0>();
        if (PAIR) { /* neither block leaves while the other may reach into it */
            if (lane == 0)
                bulk_wait_all();
            cluster_sync();
        }
        return;
    }

    regs_raise_to<QW_CONSUMER_REGS>();
    fa_warp<HD> w;
    if (live)
        qm_load_queries(w, op, *span, head, rows.wrow0,
                        turbo ? (float *)tiles + cw * 16 * HD : NULL, lane);
    __syncthreads(); /* the query rows' space becomes the tiles' */
    if (PAIR)
        cluster_arrive(); /* the peer's producers may write our tiles */
    if (WG && live) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        wg_attend<HD, FA_BK, QW_WG_STAGES, QW_THREADS>(w, rows, tiles0, cw / 4, op.u.attn.window,
                                                       lane, PAIR ? qw_pair_full(bars, 0) : 0u);
#endif
    } else if (!WG) {
        for (int j = 0; j < n_tiles; j++) {
            const int s = j % QW_STAGES, k0 = rows.k_begin + j * FA_BK;
            const uint32_t kt = tiles0 + (uint32_t)s * 2 * TILE_BYTES;
            bar_sync(qw_full(s), QW_THREADS);
            if (!rows.skips(k0))
                w.attend(kt, kt + TILE_BYTES, k0, rows.straddles(k0), op.u.attn.window, lane);
            if (j + QW_STAGES < n_tiles) /* the producers wait for it */
                bar_arrive(qw_empty(s), QW_THREADS);
        }
    }
    if (rows.warp_live) {
        const int q_dim = op.u.attn.n_heads * HD;
        w.store(op.u.attn.out + (size_t)span->row0 * q_dim + (size_t)head * HD, q_dim,
                rows.wrow0, n_tokens, lane);
    }
    if (PAIR) {
        cluster_wait();
        cluster_sync();
    }
}

/* A launch of `grid` blocks of QW_THREADS as clusters of two along y (attr:
 * the caller's, which cfg points to). */
static cudaLaunchConfig_t qprefill_pair_config(dim3 grid, size_t smem, cudaStream_t s,
                                               cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(QW_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = 1;
    attr->val.clusterDim.y = 2;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* Launches a prefill kernel over (query head runs, rows, spans); pair:
 * as clusters of two blocks along the rows (an even count of them). */
template <typename K>
static cudaError_t launch_qprefill_kernel(K kernel, cudaStream_t s, const struct cu_op *op,
                                          const uint8_t *params, size_t smem, int threads,
                                          int hpb, bool pair = false)
{
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    const int bq = 16 * QM_WARPS / hpb;
    unsigned rows = (unsigned)((op->u.attn.max_span_tokens + bq - 1) / bq);
    if (pair)
        rows += rows & 1u;
    const dim3 grid((unsigned)(op->u.attn.n_heads / hpb), rows, (unsigned)op->u.attn.n_spans);
    if (!pair) {
        kernel<<<grid, threads, smem, s>>>(*op, params, hpb);
        return cudaGetLastError();
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = qprefill_pair_config(grid, smem, s, &attr);
    return cudaLaunchKernelEx(&cfg, kernel, *op, params, hpb);
}

/* Whether clusters of two blocks of `kernel` with smem bytes each fit this
 * GPU: asked once, *cache keeps the answer (-1 before). */
template <typename K>
static bool qprefill_pairs_fit(K kernel, size_t smem, int *cache)
{
    if (*cache < 0) {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = qprefill_pair_config(dim3(1, 2, 1), smem, 0, &attr);
        int clusters = 0;
        *cache = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)smem) == cudaSuccess &&
                 cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess &&
                 clusters > 0;
        (void)cudaGetLastError();
    }
    return *cache == 1;
}

/* The tensor-core prefill for head dims 64 and 128 without QJL keys: with
 * decoding warps of its own where it runs as sm_90a code (k.prefill_ws),
 * their consumers on wgmma (k.prefill_wgmma) or mma.sync, else the warps
 * decode and attend in turn; cudaErrorNotSupported otherwise (the caller
 * runs the f32 kernel). */
template <int HD>
static cudaError_t launch_qprefill_mma_hd(cudaStream_t s, const struct cu_op *op,
                                          const uint8_t *params, int smem_optin,
                                          struct cu_attn_kernels k)
{
    const int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    const int hpb = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
    static int native = -1, native_wg = -1, pairs_fit = -1;
    const size_t wg_smem = qw_block_bytes(op->u.attn.kv.fmt, HD, true);
    if (k.prefill_ws && k.prefill_wgmma && wg_smem <= (size_t)smem_optin &&
        kernel_runs_sm90a(qattn_prefill_ws_kernel<HD, true, false>, &native_wg)) {
        if (k.prefill_pair &&
            qprefill_pairs_fit(qattn_prefill_ws_kernel<HD, true, true>, wg_smem, &pairs_fit))
            return launch_qprefill_kernel(qattn_prefill_ws_kernel<HD, true, true>, s, op, params,
                                          wg_smem, QW_THREADS, hpb, true);
        return launch_qprefill_kernel(qattn_prefill_ws_kernel<HD, true, false>, s, op, params,
                                      wg_smem, QW_THREADS, hpb);
    }
    const size_t ws_smem = qw_block_bytes(op->u.attn.kv.fmt, HD, false);
    if (k.prefill_ws && ws_smem <= (size_t)smem_optin &&
        kernel_runs_sm90a(qattn_prefill_ws_kernel<HD, false, false>, &native))
        return launch_qprefill_kernel(qattn_prefill_ws_kernel<HD, false, false>, s, op, params,
                                      ws_smem, QW_THREADS, hpb);
    const size_t smem = qm_block_bytes(op->u.attn.kv.fmt, HD);
    if (smem > (size_t)smem_optin)
        return cudaErrorNotSupported;
    return launch_qprefill_kernel(qattn_prefill_mma_kernel<HD>, s, op, params, smem,
                                  QM_WARPS * 32, hpb);
}

static cudaError_t launch_qprefill_mma(cudaStream_t s, const struct cu_op *op,
                                       const uint8_t *params, int smem_optin,
                                       struct cu_attn_kernels k)
{
    const struct kv_quant_layer *f = &op->u.attn.kv.fmt;
    if (f->scheme == KV_QUANT_TURBO && f->qjl)
        return cudaErrorNotSupported;
    if (f->scheme != KV_QUANT_TURBO && f->scheme != KV_QUANT_AFFINE)
        return cudaErrorNotSupported;
    switch (op->u.attn.kv.head_dim) {
    case 64: return launch_qprefill_mma_hd<64>(s, op, params, smem_optin, k);
    case 128: return launch_qprefill_mma_hd<128>(s, op, params, smem_optin, k);
    default: return cudaErrorNotSupported;
    }
}

/* ---- prefill through an f16 window --------------------------------------- */

/* A tile of K/V in a prefill chunk serves every block of query rows after
 * it, so the kernels above decode each position once for every block that
 * attends it (a 4,096-token chunk: ~16 times, halved by the pairs). With
 * cu_attn.window_blocks set, each position the spans attend is decoded once
 * a step into an f16 window in the attention scratch, laid out as an f16
 * cache of one layer whose blocks are the spans' blocks in order, and the
 * f16 cache's prefill kernel attends over it. The window holds K and V in
 * the model's frame (kvq_dequantize_head's vectors: TurboQuant's rotated
 * back, QJL keys with their residual), so queries and outputs are not
 * rotated. After the scratch's counters: the window's spans (cu_span, their
 * bt_off from the window's start) and block tables, then K, then V. */
struct qwindow {
    size_t tables, k, v, bytes; /* byte offsets from the window's start */
};

static __host__ __device__ __forceinline__ int qwindow_span_blocks(const struct cu_span &sp,
                                                                   int block_size)
{
    return (sp.pos0 + sp.n_tokens + block_size - 1) / block_size;
}

static __host__ __device__ __forceinline__ qwindow qwindow_of(const struct cu_op &op)
{
    const struct cu_kv &kv = op.u.attn.kv;
    const size_t side = (size_t)op.u.attn.window_blocks * kv.block_size * kv.n_kv_heads *
                        kv.head_dim * sizeof(__half);
    qwindow w;
    w.tables = (size_t)op.u.attn.n_spans * sizeof(struct cu_span);
    w.k = (w.tables + (size_t)op.u.attn.window_blocks * sizeof(uint32_t) + 255) & ~(size_t)255;
    w.v = w.k + side;
    w.bytes = w.v + side;
    return w;
}

size_t cu_qwindow_bytes(const struct cu_op *op)
{
    return op->u.attn.window_blocks > 0 ? qwindow_of(*op).bytes : 0;
}

/* A lane's share of a record as loaded: the codes of its E = HD / 32
 * consecutive elements, and the record's scale and bias (affine) or norm and
 * QJL coefficient with the sign bits of its elements (TURBO); a layer left
 * unquantized, its f32 values' bits as codes. */
template <int HD>
struct qwin_raw {
    uint32_t code[HD / 32];
    float s, b;
    uint32_t qjl_bits;
};

template <int HD>
static __device__ __forceinline__ qwin_raw<HD> qwin_load(const struct kv_quant_layer &f, bool v,
                                                         const uint8_t *rec, int lane)
{
    constexpr int E = HD / 32;
    const int bits = kvq_code_bits(&f, v), d0 = E * lane;
    qwin_raw<HD> r;
    r.qjl_bits = 0;
    if (f.scheme != KV_QUANT_AFFINE && f.scheme != KV_QUANT_TURBO) {
#pragma unroll
        for (int e = 0; e < E; e++)
            r.code[e] = __float_as_uint(((const float *)rec)[d0 + e]);
        return r;
    }
    if (f.scheme == KV_QUANT_AFFINE) {
        const uint8_t *sc = rec + HD * bits / 8 + (d0 / f.group_size) * 4;
        r.s = ld_f16(sc);
        r.b = ld_f16(sc + 2);
#pragma unroll
        for (int e = 0; e < E; e++)
            r.code[e] = (uint32_t)kvq_get_code(rec, d0 + e, bits);
        return r;
    }
    const bool qjl = !v && f.qjl;
    const uint8_t *codes = rec + (qjl ? 4 : 2);
    r.s = ld_f16(rec);
    r.b = qjl ? ld_f16(rec + 2) * 1.2533141373155003f / sqrtf((float)HD) : 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++)
        r.code[e] = (uint32_t)kvq_get_code(codes, d0 + e, bits);
    if (qjl) {
        const uint8_t *sb = codes + HD * bits / 8;
#pragma unroll
        for (int e = 0; e < E; e++)
            r.qjl_bits |= ((sb[(d0 + e) >> 3] >> ((d0 + e) & 7)) & 1u) << e;
    }
    return r;
}

#define QWIN_WARPS 8
#define QWIN_UNROLL 4 /* records a warp has in flight */

/* A block per window block j (x) and kv head (y): its positions' K and V
 * records, a warp per record, each lane E = HD / 32 consecutive elements in
 * registers (kvq_dequantize_head's arithmetic; positions past the span's
 * context as zeros); a warp's next records are loaded before the first is
 * decoded. The blocks of kv head 0 write the table entries, block (0, 0)
 * the window's spans. */
template <int HD>
static __global__ void __launch_bounds__(QWIN_WARPS * 32)
qwindow_fill_kernel(struct cu_op op, const uint8_t *params, uint8_t *win)
{
    constexpr int E = HD / 32;
    __shared__ float lv[2][256]; /* TURBO's levels, K and V */
    __shared__ uint64_t sign_words[3][HD / 64]; /* TURBO's rotations: K, V, QJL */
    const struct cu_kv kv = op.u.attn.kv;
    const struct kv_quant_layer f = kv.fmt;
    const int layer = op.u.attn.layer, bs = kv.block_size;
    const qwindow w = qwindow_of(op);
    const struct cu_span *spans = (const struct cu_span *)(params + op.u.attn.spans_off);
    const int j = blockIdx.x, h = blockIdx.y;
    const bool turbo = f.scheme == KV_QUANT_TURBO;
    if (turbo) {
        for (int i = threadIdx.x; i < 512; i += blockDim.x) {
            const int side = i >> 8, bits = kvq_code_bits(&f, side != 0);
            if ((i & 255) < (1 << bits))
                lv[side][i & 255] = kv.cb->levels[bits][i & 255];
        }
        if (threadIdx.x < 3 * HD / 64)
            sign_words[threadIdx.x / (HD / 64)][threadIdx.x % (HD / 64)] = kvq_sign_word(
                kv.seed, threadIdx.x / (HD / 64), layer, 64 * (threadIdx.x % (HD / 64)));
    }
    int s = 0, base = 0;
    for (; s < op.u.attn.n_spans - 1; s++) {
        const int nb = qwindow_span_blocks(spans[s], bs);
        if (j < base + nb)
            break;
        base += nb;
    }
    if (threadIdx.x == 0 && h == 0) {
        ((uint32_t *)(win + w.tables))[j] = (uint32_t)j;
        if (j == 0)
            for (int t = 0, b = 0; t < op.u.attn.n_spans; t++) {
                struct cu_span ws = spans[t];
                ws.n_blocks = qwindow_span_blocks(ws, bs);
                ws.bt_off = (uint32_t)(w.tables + (size_t)b * sizeof(uint32_t));
                ((struct cu_span *)win)[t] = ws;
                b += ws.n_blocks;
            }
    }
    __syncthreads();
    const struct cu_span sp = spans[s];
    const uint32_t *bt = (const uint32_t *)(params + sp.bt_off);
    const int ctx = sp.pos0 + sp.n_tokens, pos_first = (j - base) * bs;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const size_t kv_dim = (size_t)kv.n_kv_heads * HD;
    /* the rotations' signs of this lane's elements: keys, values, QJL */
    uint32_t sign_k = 0, sign_v = 0, sign_z = 0;
    if (turbo) {
        sign_k = lane_signs<HD, false>(sign_words[0], lane);
        sign_v = lane_signs<HD, false>(sign_words[1], lane);
        sign_z = lane_signs<HD, false>(sign_words[2], lane);
    }
    for (int r0 = warp; r0 < bs * 2; r0 += QWIN_WARPS * QWIN_UNROLL) {
        qwin_raw<HD> raw[QWIN_UNROLL];
#pragma unroll
        for (int u = 0; u < QWIN_UNROLL; u++) {
            const int r = r0 + u * QWIN_WARPS, pos = pos_first + (r >> 1);
            if (r < bs * 2 && pos < ctx)
                raw[u] = qwin_load<HD>(f, r & 1, qrecord(kv, layer, bt, pos, h, r & 1), lane);
        }
#pragma unroll
        for (int u = 0; u < QWIN_UNROLL; u++) {
            const int r = r0 + u * QWIN_WARPS, slot = r >> 1, pos = pos_first + slot;
            const bool v = r & 1;
            if (r >= bs * 2)
                break;
            float x[E];
            if (pos >= ctx) {
#pragma unroll
                for (int e = 0; e < E; e++)
                    x[e] = 0.0f;
            } else if (f.scheme == KV_QUANT_AFFINE) {
#pragma unroll
                for (int e = 0; e < E; e++)
                    x[e] = raw[u].s * (float)raw[u].code[e] + raw[u].b;
            } else if (!turbo) {
#pragma unroll
                for (int e = 0; e < E; e++)
                    x[e] = __uint_as_float(raw[u].code[e]);
            } else {
                const float *levels = lv[v];
#pragma unroll
                for (int e = 0; e < E; e++)
                    x[e] = raw[u].s * levels[raw[u].code[e]];
                if (!v && f.qjl) {
                    float z[E];
#pragma unroll
                    for (int e = 0; e < E; e++)
                        z[e] = ((raw[u].qjl_bits >> e) & 1) ? 1.0f : -1.0f;
                    warp_rotate_regs<HD, false>(z, sign_z, lane, true); /* R'^T z */
#pragma unroll
                    for (int e = 0; e < E; e++)
                        x[e] += raw[u].b * z[e];
                }
                warp_rotate_regs<HD, false>(x, v ? sign_v : sign_k, lane, true);
            }
            __half2 *dst = (__half2 *)(win + (v ? w.v : w.k) +
                                       (((size_t)j * bs + slot) * kv_dim + (size_t)h * HD +
                                        (size_t)E * lane) *
                                           sizeof(__half));
#pragma unroll
            for (int e = 0; e < E; e += 2)
                dst[e / 2] = __floats2half2_rn(x[e], x[e + 1]);
        }
    }
}

/* The prefill of an op with window_blocks: the window filled from the
 * records, then the f16 cache's kernel over it (win: the scratch after its
 * counters). */
static cudaError_t launch_qprefill_window(cudaStream_t s, const struct cu_op *op,
                                          const uint8_t *params, uint8_t *win, int smem_optin,
                                          bool wgmma)
{
    const dim3 grid((unsigned)op->u.attn.window_blocks, (unsigned)op->u.attn.kv.n_kv_heads);
    if (op->u.attn.kv.head_dim == 64)
        qwindow_fill_kernel<64><<<grid, QWIN_WARPS * 32, 0, s>>>(*op, params, win);
    else
        qwindow_fill_kernel<128><<<grid, QWIN_WARPS * 32, 0, s>>>(*op, params, win);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    const qwindow w = qwindow_of(*op);
    struct cu_op f = *op;
    struct cu_kv *kv = &f.u.attn.kv;
    memset(kv, 0, sizeof *kv);
    kv->k = win + w.k;
    kv->v = win + w.v;
    kv->n_blocks = op->u.attn.window_blocks;
    kv->block_size = op->u.attn.kv.block_size;
    kv->n_kv_heads = op->u.attn.kv.n_kv_heads;
    kv->head_dim = op->u.attn.kv.head_dim;
    kv->f16 = 1;
    f.u.attn.layer = 0;
    f.u.attn.spans_off = 0;
    f.u.attn.window_blocks = 0;
    return cu_launch_attention_prefill_f16(s, &f, win, smem_optin, wgmma);
}

/* ---- dispatch ----------------------------------------------------------- */

template <int HPT>
static cudaError_t launch_qprefill(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                   int smem_optin)
{
    int hd = op->u.attn.kv.head_dim;
    size_t smem = sizeof(float) * ((size_t)QP_BQ * (hd + 1) + (size_t)QP_BK * (hd + 1) +
                                   (size_t)QP_BK * hd + (size_t)QP_BQ * (QP_BK + 1) +
                                   (size_t)QP_WARPS * hd + 512);
    if (smem > (size_t)smem_optin)
        return cudaErrorInvalidConfiguration;
    cudaError_t e = cudaFuncSetAttribute(qattn_prefill_kernel<HPT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((op->u.attn.max_span_tokens + QP_BQ - 1) / QP_BQ),
              (unsigned)op->u.attn.n_heads, (unsigned)op->u.attn.n_spans);
    qattn_prefill_kernel<HPT><<<grid, QP_THREADS, smem, s>>>(*op, params);
    return cudaGetLastError();
}

template <int DPL, int GP>
static cudaError_t launch_qdecode_gp(cudaStream_t s, const struct cu_op *op,
                                     const uint8_t *params, float *part)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)(op->u.attn.kv.n_kv_heads * ((group + GP - 1) / GP)), (unsigned)n_splits,
              (unsigned)op->n_rows);
    float *partials = n_splits > 1 ? part + Q_COUNTERS : NULL;
    qattn_decode_kernel<DPL, GP><<<grid, QD_WARPS * 32, 0, s>>>(*op, params, partials);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_splits == 1)
        return e;
    dim3 cgrid((unsigned)op->u.attn.n_heads, (unsigned)op->n_rows);
    qattn_combine_kernel<<<cgrid, 128, 0, s>>>(*op, params, partials, n_splits);
    return cudaGetLastError();
}

/* The query heads per block: the group rounded up to a power of two, at
 * most 8 (4 for head dims past 128, whose registers run out first). */
template <int DPL>
static cudaError_t launch_qdecode(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                  float *part)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    if (group == 1)
        return launch_qdecode_gp<DPL, 1>(s, op, params, part);
    if (group == 2)
        return launch_qdecode_gp<DPL, 2>(s, op, params, part);
    if (group <= 4 || DPL > 4)
        return launch_qdecode_gp<DPL, 4>(s, op, params, part);
    return launch_qdecode_gp<DPL, 8>(s, op, params, part);
}

template <int HD, int GP>
static cudaError_t launch_qdecode_fd_gp(cudaStream_t s, const struct cu_op *op,
                                       const uint8_t *params, float *part)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    int n_splits = op->u.attn.n_splits;
    dim3 grid((unsigned)(op->u.attn.kv.n_kv_heads * ((group + GP - 1) / GP)), (unsigned)n_splits,
              (unsigned)op->n_rows);
    float *partials = n_splits > 1 ? part + Q_COUNTERS : NULL;
    qattn_decode_fd_kernel<HD, GP><<<grid, QF_THREADS, 0, s>>>(*op, params, partials);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_splits == 1)
        return e;
    dim3 cgrid((unsigned)op->u.attn.n_heads, (unsigned)op->n_rows);
    qattn_combine_kernel<<<cgrid, 128, 0, s>>>(*op, params, partials, n_splits);
    return cudaGetLastError();
}

template <int HD>
static cudaError_t launch_qdecode_fd_hd(cudaStream_t s, const struct cu_op *op,
                                       const uint8_t *params, float *part)
{
    int group = op->u.attn.n_heads / op->u.attn.kv.n_kv_heads;
    if (group == 1)
        return launch_qdecode_fd_gp<HD, 1>(s, op, params, part);
    if (group == 2)
        return launch_qdecode_fd_gp<HD, 2>(s, op, params, part);
    return launch_qdecode_fd_gp<HD, 4>(s, op, params, part);
}

/* The flash-decoding kernel for head dims 64 and 128, affine or TURBO
 * without QJL; cudaErrorNotSupported otherwise (the caller runs
 * qattn_decode_kernel, which reads every format). */
static cudaError_t launch_qdecode_fd(cudaStream_t s, const struct cu_op *op,
                                    const uint8_t *params, float *part)
{
    const struct kv_quant_layer *f = &op->u.attn.kv.fmt;
    if (!(f->scheme == KV_QUANT_AFFINE || (f->scheme == KV_QUANT_TURBO && !f->qjl)))
        return cudaErrorNotSupported;
    switch (op->u.attn.kv.head_dim) {
    case 64: return launch_qdecode_fd_hd<64>(s, op, params, part);
    case 128: return launch_qdecode_fd_hd<128>(s, op, params, part);
    default: return cudaErrorNotSupported;
    }
}

/* The f32 prefill, any head dim and format. */
static cudaError_t launch_qprefill_f32(cudaStream_t s, const struct cu_op *op,
                                       const uint8_t *params, int smem_optin)
{
    const int hd = op->u.attn.kv.head_dim;
    return hd <= 64    ? launch_qprefill<16>(s, op, params, smem_optin)
           : hd <= 128 ? launch_qprefill<32>(s, op, params, smem_optin)
                       : launch_qprefill<64>(s, op, params, smem_optin);
}

cudaError_t cu_launch_attention_quant(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part, int smem_optin,
                                      struct cu_attn_kernels kernels)
{
    const int hd = op->u.attn.kv.head_dim;
    if (op->n_rows == 0)
        return cudaSuccess;
    if (hd > CU_MAX_HEAD_DIM || hd % 16)
        return cudaErrorInvalidValue;
    cudaError_t e;
    if (cu_attention_uses_prefill(op) && op->u.attn.window_blocks > 0 && kernels.tensor_cores)
        return launch_qprefill_window(s, op, params, (uint8_t *)(part + Q_COUNTERS), smem_optin,
                                      kernels.prefill_wgmma);
    if (cu_attention_uses_prefill(op)) {
        e = kernels.tensor_cores ? launch_qprefill_mma(s, op, params, smem_optin, kernels)
                                 : cudaErrorNotSupported;
        if (e == cudaErrorNotSupported)
            e = launch_qprefill_f32(s, op, params, smem_optin);
    } else {
        e = kernels.decode_tc ? cu_launch_attention_decode_quant(s, op, params, part, smem_optin)
                      : cudaErrorNotSupported;
        if (e == cudaErrorNotSupported)
            e = launch_qdecode_fd(s, op, params, part);
        if (e == cudaErrorNotSupported)
            e = hd <= 64    ? launch_qdecode<2>(s, op, params, part)
                : hd <= 128 ? launch_qdecode<4>(s, op, params, part)
                            : launch_qdecode<8>(s, op, params, part);
    }
    if (e != cudaSuccess || op->u.attn.kv.fmt.scheme != KV_QUANT_TURBO)
        return e;
    dim3 grid((unsigned)op->n_rows, (unsigned)op->u.attn.n_heads);
    qattn_unrotate_kernel<<<grid, 32, 0, s>>>(*op, params);
    return cudaGetLastError();
}
