/* backend/cuda/attention_quant.cu — a quantized KV cache (backend/kv_quant.h) on the GPU: quantize-on-write (a warp per record, the CPU's bytes), split-K flash-decoding and tiled prefill attention that read the records in their inner loops; TurboQuant rotates each query once and each output row back once. */
#include <cuda_fp16.h>
#include <float.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/online_softmax.cuh"

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

/* x (shared, n floats) = R x, or R^T x when inverse, by one warp:
 * kvq_rotate's and kvq_unrotate's operations, each butterfly of a stage on a
 * lane of its own, so the CPU's bits. */
static __device__ void warp_rotate(float *x, int n, uint64_t seed, int which, int layer,
                                   bool inverse)
{
    const int lane = threadIdx.x & 31;
    __syncwarp();
    if (!inverse) {
        for (int d = lane; d < n; d += 32)
            x[d] *= kvq_sign(seed, which, layer, d);
        __syncwarp();
    }
    for (int off = 0; off < n;) {
        int len = 1;
        while (len * 2 <= n - off)
            len *= 2;
        float *b = x + off;
        for (int h = 1; h < len; h *= 2) {
            for (int p = lane; p < len / 2; p += 32) {
                int i = (p / h) * 2 * h + p % h;
                float a = b[i], c = b[i + h];
                b[i] = a + c;
                b[i + h] = a - c;
            }
            __syncwarp();
        }
        float norm = 1.0f / sqrtf((float)len);
        for (int i = lane; i < len; i += 32)
            b[i] *= norm;
        __syncwarp();
        off += len;
    }
    if (inverse) {
        for (int d = lane; d < n; d += 32)
            x[d] *= kvq_sign(seed, which, layer, d);
        __syncwarp();
    }
}

/* One record of x (shared, hd floats; clobbered) into rec by one warp, in
 * kvq_quantize_head's arithmetic and order (extrema and sums of squares run
 * serially on lane 0), so the bytes are the CPU's. codes: hd ints of shared
 * scratch. */
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
            float mn = 0.0f, mx = 0.0f;
            if (lane == 0) {
                mn = x[g0];
                mx = x[g0];
                for (int d = g0 + 1; d < g0 + g; d++) {
                    mn = x[d] < mn ? x[d] : mn;
                    mx = x[d] > mx ? x[d] : mx;
                }
            }
            mn = __shfl_sync(FULL, mn, 0);
            mx = __shfl_sync(FULL, mx, 0);
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
        float s = 0.0f;
        if (lane == 0) {
            double n2 = 0;
            for (int d = 0; d < hd; d++)
                n2 = fma((double)x[d], (double)x[d], n2);
            s = kvq_f16_to_f32(kvq_f32_to_f16((float)sqrt(n2 / hd)));
            kvq_store_f16(rec, s);
        }
        s = __shfl_sync(FULL, s, 0);
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
            if (lane == 0) {
                double r2 = 0;
                for (int d = 0; d < hd; d++)
                    r2 = fma((double)x[d], (double)x[d], r2);
                kvq_store_f16(rec + 2, (float)sqrt(r2));
            }
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
    for (int i = lane; i < hd * bits / 8; i += 32) {
        unsigned byte = 0;
        for (int t = 0; t < 8; t++) {
            int bit = i * 8 + t;
            byte |= (((unsigned)codes[bit / bits] >> (bit % bits)) & 1u) << t;
        }
        code_base[i] = (uint8_t)byte;
    }
}

/* ---- quantize on write: a block per (row, kv head), warp 0 K, warp 1 V ---- */

static __global__ void __launch_bounds__(64)
qkv_store_kernel(struct cu_kv kv, int layer, const float *k, const float *v, uint32_t spans_off,
                 int n_spans, const uint8_t *params)
{
    __shared__ float xs[2][CU_MAX_HEAD_DIM];
    __shared__ int cs[2][CU_MAX_HEAD_DIM];
    const int row = blockIdx.x, head = blockIdx.y, w = threadIdx.x / 32, lane = threadIdx.x & 31;
    const struct cu_span *spans = (const struct cu_span *)(params + spans_off);
    const int *rowmap = (const int *)(spans + n_spans);
    if (rowmap[row] < 0)
        return;
    const struct cu_span *sp = &spans[rowmap[row]];
    const int pos = sp->pos0 + (row - sp->row0), hd = kv.head_dim;
    const bool isv = w == 1;
    const float *src = (isv ? v : k) + ((size_t)row * kv.n_kv_heads + head) * hd;
    for (int d = lane; d < hd; d += 32)
        xs[w][d] = src[d];
    const uint32_t *bt = (const uint32_t *)(params + sp->bt_off);
    uint8_t *rec = (uint8_t *)qrecord(kv, layer, bt, pos, head, isv);
    warp_quantize(kv, layer, isv, xs[w], cs[w], rec);
}

cudaError_t cu_launch_kv_store_quant(cudaStream_t s, const struct cu_op *op,
                                     const uint8_t *params)
{
    if (op->n_rows == 0)
        return cudaSuccess;
    if (op->u.store.kv.head_dim > CU_MAX_HEAD_DIM || op->u.store.kv.head_dim % 16)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)op->n_rows, (unsigned)op->u.store.kv.n_kv_heads);
    qkv_store_kernel<<<grid, 64, 0, s>>>(op->u.store.kv, op->u.store.layer, op->u.store.k,
                                         op->u.store.v, op->u.store.spans_off,
                                         op->u.store.n_spans, params);
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
    const int group = op.u.attn.n_heads / kv.n_kv_heads;
    const int chunks_per_kv = (group + GP - 1) / GP;
    const int kvh = blockIdx.x / chunks_per_kv, hc = blockIdx.x % chunks_per_kv;
    const int h0 = kvh * group + hc * GP;
    const int ng = group - hc * GP < GP ? group - hc * GP : GP;
    const int split = blockIdx.y, n_splits = gridDim.y, row = blockIdx.z;

    int first, last;
    const uint32_t *bt;
    if (!q_row(op, params, row, &first, &last, &bt))
        return;
    const int chunk = (op.u.attn.ctx_bucket + n_splits - 1) / n_splits;
    const int begin = split * chunk > first ? split * chunk : first;
    const int end = split * chunk + chunk - 1 < last ? split * chunk + chunk - 1 : last;

    const bool turbo = f.scheme == KV_QUANT_TURBO, qjl = turbo && f.qjl;
    const int kbits = kvq_code_bits(&f, false), vbits = kvq_code_bits(&f, true);
    if (turbo)
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
            lv_sm[0][i] = i < (1 << kbits) ? kv.cb->levels[kbits][i] : 0.0f;
            lv_sm[1][i] = i < (1 << vbits) ? kv.cb->levels[vbits][i] : 0.0f;
        }
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
    for (int i = tid; i < 256; i += QP_THREADS) {
        lv[i] = turbo && i < (1 << kbits) ? kv.cb->levels[kbits][i] : 0.0f;
        lv[256 + i] = turbo && i < (1 << vbits) ? kv.cb->levels[vbits][i] : 0.0f;
    }
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

cudaError_t cu_launch_attention_quant(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part, int smem_optin)
{
    const int hd = op->u.attn.kv.head_dim;
    if (op->n_rows == 0)
        return cudaSuccess;
    if (hd > CU_MAX_HEAD_DIM || hd % 16)
        return cudaErrorInvalidValue;
    cudaError_t e;
    if (cu_attention_uses_prefill(op))
        e = hd <= 64    ? launch_qprefill<16>(s, op, params, smem_optin)
            : hd <= 128 ? launch_qprefill<32>(s, op, params, smem_optin)
                        : launch_qprefill<64>(s, op, params, smem_optin);
    else
        e = hd <= 64    ? launch_qdecode<2>(s, op, params, part)
            : hd <= 128 ? launch_qdecode<4>(s, op, params, part)
                        : launch_qdecode<8>(s, op, params, part);
    if (e != cudaSuccess || op->u.attn.kv.fmt.scheme != KV_QUANT_TURBO)
        return e;
    dim3 grid((unsigned)op->n_rows, (unsigned)op->u.attn.n_heads);
    qattn_unrotate_kernel<<<grid, 32, 0, s>>>(*op, params);
    return cudaGetLastError();
}
