/* backend/cuda/encdec.cu — the CUDA backend's encoder-decoder ops (Whisper): LayerNorm, GELU, 1-D convolution, attention over contiguous K/V and the row scatter.
 *
 * LayerNorm, GELU, the attention and the row scatter are recorded like every
 * other op (record.h) and launched with the step, so a decoder step is one
 * op list that the backend replays from a CUDA graph: the attention's key
 * count and the rows the scatter writes live in the parameter arena, not in
 * the op, so every step of a window replays the same graph. The convolution
 * (the encoder's stem, once per window) launches what was recorded and then
 * its own kernels, eagerly. Their arithmetic follows the CPU's
 * (backend/cpu/encdec.c) so the two stay within float rounding of each
 * other: LayerNorm sums in double in row order, attention sums each dot
 * product in head-dim order and normalises once at the end (online softmax:
 * the same value up to the rounding of the running rescale and, for steps of
 * few queries, of the merge of the key splits). */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

static struct cu_impl *impl_of(struct backend *be) { return (struct cu_impl *)be->impl; }

/* Launches what was recorded before the op; false when the backend has failed. */
static bool op_begin(struct cu_impl *im)
{
    cu_flush_eager(im);
    if (im->failed)
        return false;
    return CU_TRY(im, cudaSetDevice(im->dev.index));
}

/* A launch's grid within CUDA's limits (x < 2^31, y and z < 2^16), else the backend fails
 * naming the op: a grid past them is a launch error at best, and the ops have no other error
 * path. */
static bool grid_fits(struct cu_impl *im, const char *op, int64_t x, int64_t y)
{
    if (x >= 1 && x <= INT32_MAX && y >= 1 && y <= 65535)
        return true;
    cu_fail(im, INFERD_EUNSUPPORTED, "%s: a grid of %lld x %lld blocks is past CUDA's limits",
            op, (long long)x, (long long)y);
    return false;
}

/* ---- LayerNorm ------------------------------------------------------------ */

#define LN_THREADS 256

static __device__ double block_sum(double v, double *partial)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x / 32] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < LN_THREADS / 32; w++)
        s += partial[w];
    __syncthreads();
    return s;
}

/* One block per row; y may alias x (each element is read before it is written, by one thread). */
static __global__ void layer_norm_kernel(const float *x, const float *w, const float *b,
                                         int64_t dim, float eps, float *y)
{
    __shared__ double partial[LN_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    double sum = 0;
    for (int64_t i = threadIdx.x; i < dim; i += LN_THREADS)
        sum += xr[i];
    double mean = block_sum(sum, partial) / (double)dim;
    double sq = 0;
    for (int64_t i = threadIdx.x; i < dim; i += LN_THREADS) {
        double d = xr[i] - mean;
        sq += d * d;
    }
    sq = block_sum(sq, partial);
    float inv = (float)(1.0 / sqrt(sq / (double)dim + eps)), m = (float)mean;
    for (int64_t i = threadIdx.x; i < dim; i += LN_THREADS)
        yr[i] = (xr[i] - m) * inv * w[i] + (b ? b[i] : 0.0f);
}

void cu_layer_norm(struct backend *be, const float *x, const float *weight, const float *bias,
                   int64_t n_rows, int64_t dim, float eps, float *y)
{
    struct cu_impl *im = impl_of(be);
    if (n_rows > 0 && grid_fits(im, "layer_norm", n_rows, 1))
        cu_rec_layer_norm(&im->rec, x, weight, bias, n_rows, dim, eps, y);
}

cudaError_t cu_launch_layer_norm(cudaStream_t s, const struct cu_op *op)
{
    layer_norm_kernel<<<(unsigned)op->u.norm.n_rows, LN_THREADS, 0, s>>>(
        op->u.norm.x, op->u.norm.w, op->u.norm.b, op->u.norm.dim, op->u.norm.eps, op->u.norm.y);
    return cudaGetLastError();
}

/* ---- GELU ------------------------------------------------------------------- */

static __global__ void gelu_kernel(float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

void cu_gelu(struct backend *be, float *x, int64_t n)
{
    cu_rec_gelu(&impl_of(be)->rec, x, n);
}

cudaError_t cu_launch_gelu(cudaStream_t s, const struct cu_op *op)
{
    int64_t blocks = (op->u.ew.n + 255) / 256;
    gelu_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, s>>>(op->u.ew.out,
                                                                          op->u.ew.n);
    return cudaGetLastError();
}

/* ---- 1-D convolution ------------------------------------------------------------ */

/* col[t, c * kernel + j] = x[t * stride + j - pad, c] (0 outside the rows), the
 * layout of the weight's rows, as the CPU's im2col. */
static __global__ void im2col_kernel(const float *x, int64_t n_in, int64_t c_in, int kernel,
                                     int stride, int pad, int64_t n_out, float *col)
{
    int64_t cols = c_in * kernel, total = n_out * cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = e / cols, r = e % cols, c = r / kernel;
        int j = (int)(r % kernel);
        int64_t src = t * stride + j - pad;
        col[e] = src >= 0 && src < n_in ? x[src * c_in + c] : 0.0f;
    }
}

/* im2col into stream-ordered scratch, then the backend's own matmul (recorded,
 * launched here), so the product is the same GEMM every other matmul runs. */
void cu_conv1d(struct backend *be, const float *x, int64_t n_in, int64_t c_in,
               const struct weight_matrix *w, const float *bias, int kernel, int stride, int pad,
               float *y)
{
    struct cu_impl *im = impl_of(be);
    if (kernel <= 0 || stride <= 0 || pad < 0 || c_in <= 0 || w->cols != c_in * kernel) {
        cu_fail(im, INFERD_EINVAL, "conv1d: kernel %d, stride %d, pad %d over %lld channels "
                "with a %lld-column weight", kernel, stride, pad, (long long)c_in,
                (long long)w->cols);
        return;
    }
    int64_t n_out = (n_in + 2 * pad - kernel) / stride + 1, cols = c_in * kernel;
    if (n_out <= 0 || !op_begin(im))
        return;
    float *col = NULL;
    if (!CU_TRY(im, cudaMallocAsync((void **)&col, (size_t)n_out * (size_t)cols * sizeof *col,
                                    im->stream)))
        return;
    int64_t blocks = (n_out * cols + 255) / 256;
    im2col_kernel<<<(unsigned)(blocks < 16384 ? blocks : 16384), 256, 0, im->stream>>>(
        x, n_in, c_in, kernel, stride, pad, n_out, col);
    if (CU_TRY(im, cudaGetLastError())) {
        be->ops->matmul(be, col, n_out, w, bias, y);
        cu_flush_eager(im); /* the matmul reads col: it runs before col is freed */
    }
    cudaFreeAsync(col, im->stream);
}

/* ---- attention over contiguous K/V ------------------------------------------------ */

#define DA_WARPS 8   /* queries of one head per block, a warp each */
#define DA_KEYS 32   /* keys per shared-memory tile: one per lane while scoring */
#define DA_DIMS (CU_MAX_HEAD_DIM / 32)

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float warp_add(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block (x, h, z): queries [x * DA_WARPS, +DA_WARPS) of head h over split z
 * of the keys (all of them when n_splits is 1). The block walks its keys in
 * tiles staged in shared memory; in a tile lane j scores key j (its dot
 * product summed in head-dim order, as the CPU sums it), then the warp folds
 * the tile into its running max, sum and output (lane l holds dims l, l + 32,
 * ...). One split writes the normalised output; several write their max, sum
 * and unnormalised output to part for attention_dense_merge. n_kv and causal
 * are read from len (the arena), so the launch is the same at every
 * position. */
static __global__ void attention_dense_kernel(const float *q, int64_t n_q, const float *k,
                                              const float *v, const int64_t *len,
                                              int64_t kv_stride, int n_heads, int hd, float scale,
                                              int n_splits, float *part, float *out)
{
    extern __shared__ float sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, h = blockIdx.y, z = blockIdx.z;
    const int64_t n_kv = len[0], causal = len[1];
    const int64_t qd = (int64_t)n_heads * hd;
    float *qs = sm + warp * hd;
    float *ks = sm + DA_WARPS * hd;            /* DA_KEYS rows of hd + 1 (no bank conflicts) */
    float *vs = ks + DA_KEYS * (hd + 1);       /* DA_KEYS rows of hd */
    const int64_t i = (int64_t)blockIdx.x * DA_WARPS + warp;
    const bool active = i < n_q;
    int64_t n = n_kv;
    if (causal >= 0 && causal + i + 1 < n)
        n = causal + i + 1;
    int64_t last = (int64_t)blockIdx.x * DA_WARPS + DA_WARPS - 1;
    if (last > n_q - 1)
        last = n_q - 1;
    int64_t n_block = n_kv; /* the keys any query of the block reads */
    if (causal >= 0 && causal + last + 1 < n_block)
        n_block = causal + last + 1;
    /* this split's keys: whole tiles, the last split taking what is left */
    int64_t chunk = (n_kv + n_splits - 1) / n_splits;
    chunk = (chunk + DA_KEYS - 1) / DA_KEYS * DA_KEYS;
    const int64_t lo = (int64_t)z * chunk;
    const int64_t hi = lo + chunk < n_block ? lo + chunk : n_block;
    const int64_t end = n < hi ? n : hi; /* this query's keys in the split: [lo, end) */
    if (active)
        for (int d = lane; d < hd; d += 32)
            qs[d] = q[i * qd + (int64_t)h * hd + d];
    float acc[DA_DIMS];
    for (int c = 0; c < DA_DIMS; c++)
        acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t t0 = lo; t0 < hi; t0 += DA_KEYS) {
        __syncthreads(); /* the previous tile is consumed */
        for (int e = threadIdx.x; e < DA_KEYS * hd; e += blockDim.x) {
            int j = e / hd, d = e % hd;
            int64_t r = t0 + j;
            bool in = r < hi;
            ks[j * (hd + 1) + d] = in ? k[r * kv_stride + (int64_t)h * hd + d] : 0.0f;
            vs[j * hd + d] = in ? v[r * kv_stride + (int64_t)h * hd + d] : 0.0f;
        }
        __syncthreads();
        if (!active || t0 >= end)
            continue;
        int64_t r = t0 + lane;
        float s = -INFINITY;
        if (r < end) {
            const float *kr = ks + lane * (hd + 1);
            float dot = 0.0f;
            for (int d = 0; d < hd; d++)
                dot += qs[d] * kr[d];
            s = dot * scale;
        }
        float m_new = fmaxf(m, warp_max(s));
        float corr = expf(m - m_new); /* 0 on the first tile (m = -inf) */
        float p = r < end ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_add(p);
        for (int c = 0; c < DA_DIMS; c++)
            acc[c] *= corr;
        int keys = end - t0 < DA_KEYS ? (int)(end - t0) : DA_KEYS;
        for (int j = 0; j < keys; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            for (int c = 0; c < DA_DIMS; c++) {
                int d = lane + 32 * c;
                if (d < hd)
                    acc[c] += pj * vs[j * hd + d];
            }
        }
        m = m_new;
    }
    if (!active)
        return;
    if (n_splits > 1) { /* max, sum, then the unnormalised output */
        float *pr = part + (((int64_t)z * n_q + i) * n_heads + h) * (hd + 2);
        if (lane == 0) {
            pr[0] = m;
            pr[1] = l;
        }
        for (int c = 0; c < DA_DIMS; c++) {
            int d = lane + 32 * c;
            if (d < hd)
                pr[2 + d] = acc[c];
        }
        return;
    }
    float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int c = 0; c < DA_DIMS; c++) {
        int d = lane + 32 * c;
        if (d < hd)
            out[i * qd + (int64_t)h * hd + d] = acc[c] * inv;
    }
}

/* Block (i, h): query i of head h from its n_splits partials, in split order. */
static __global__ void attention_dense_merge(const float *part, int64_t n_q, int n_heads, int hd,
                                             int n_splits, float *out)
{
    const int64_t i = blockIdx.x;
    const int h = blockIdx.y;
    const int64_t stride = (int64_t)n_q * n_heads * (hd + 2);
    const float *p0 = part + (i * n_heads + h) * (hd + 2);
    float m = -INFINITY;
    for (int z = 0; z < n_splits; z++)
        m = fmaxf(m, p0[z * stride]);
    float l = 0.0f;
    for (int z = 0; z < n_splits; z++)
        l += p0[z * stride + 1] * expf(p0[z * stride] - m);
    float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < n_splits; z++)
            acc += p0[z * stride + 2 + d] * expf(p0[z * stride] - m);
        out[i * (int64_t)n_heads * hd + (int64_t)h * hd + d] = acc * inv;
    }
}

static size_t dense_smem(int head_dim)
{
    return (size_t)(DA_WARPS * head_dim + DA_KEYS * (head_dim + 1) + DA_KEYS * head_dim) *
           sizeof(float);
}

size_t cu_dense_part_floats(const struct cu_op *op)
{
    if (op->u.dense.n_splits <= 1)
        return 0;
    return (size_t)op->u.dense.n_splits * (size_t)op->n_rows * (size_t)op->u.dense.n_heads *
           (size_t)(op->u.dense.head_dim + 2);
}

void cu_attention_dense(struct backend *be, const float *q, int64_t n_q, const float *k,
                        const float *v, int64_t n_kv, int64_t kv_stride, int n_heads, int head_dim,
                        float scale, int64_t causal, float *out)
{
    struct cu_impl *im = impl_of(be);
    if (n_q <= 0 || n_heads <= 0 || im->failed)
        return;
    if (head_dim <= 0 || head_dim > CU_MAX_HEAD_DIM) {
        cu_fail(im, INFERD_EUNSUPPORTED, "dense attention with head dim %d (at most %d)",
                head_dim, CU_MAX_HEAD_DIM);
        return;
    }
    if (kv_stride < (int64_t)n_heads * head_dim) {
        cu_fail(im, INFERD_EINVAL, "dense attention: K/V rows %lld floats apart hold fewer than "
                "%d heads of %d", (long long)kv_stride, n_heads, head_dim);
        return;
    }
    if (!grid_fits(im, "attention_dense", (n_q + DA_WARPS - 1) / DA_WARPS, n_heads))
        return;
    size_t smem = dense_smem(head_dim);
    if (smem > (size_t)im->dev.smem_optin) {
        cu_fail(im, INFERD_EUNSUPPORTED, "dense attention with head dim %d needs %zu bytes of "
                "shared memory; the device allows %d", head_dim, smem, im->dev.smem_optin);
        return;
    }
    /* a function attribute, set now: never while a graph is being captured */
    if (smem > 48 * 1024 && !im->dense_smem_set &&
        !CU_TRY(im, cudaFuncSetAttribute(attention_dense_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)dense_smem(CU_MAX_HEAD_DIM))))
        return;
    im->dense_smem_set = im->dense_smem_set || smem > 48 * 1024;
    cu_rec_attention_dense(&im->rec, q, n_q, k, v, n_kv, kv_stride, n_heads, head_dim, scale,
                           causal, out);
}

cudaError_t cu_launch_attention_dense(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part)
{
    const int n_q = op->n_rows, heads = op->u.dense.n_heads, hd = op->u.dense.head_dim,
              splits = op->u.dense.n_splits;
    dim3 grid((unsigned)((n_q + DA_WARPS - 1) / DA_WARPS), (unsigned)heads, (unsigned)splits);
    attention_dense_kernel<<<grid, DA_WARPS * 32, dense_smem(hd), s>>>(
        op->u.dense.q, n_q, op->u.dense.k, op->u.dense.v,
        (const int64_t *)(params + op->u.dense.len_off), op->u.dense.kv_stride, heads, hd,
        op->u.dense.scale, splits, part, op->u.dense.out);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || splits <= 1)
        return e;
    attention_dense_merge<<<dim3((unsigned)n_q, (unsigned)heads), 64, 0, s>>>(
        part, n_q, heads, hd, splits, op->u.dense.out);
    return cudaGetLastError();
}

/* ---- row scatter ------------------------------------------------------------------ */

static __global__ void scatter_rows_kernel(const float *src, int64_t cols, const int32_t *rows,
                                           float *dst)
{
    const int64_t r = blockIdx.x;
    float *d = dst + (int64_t)rows[r] * cols;
    const float *x = src + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        d[c] = x[c];
}

void cu_scatter_rows(struct backend *be, const float *src, int64_t n_rows, int64_t cols,
                     const int32_t *rows, float *dst)
{
    struct cu_impl *im = impl_of(be);
    if (n_rows > 0 && grid_fits(im, "scatter_rows", n_rows, 1))
        cu_rec_scatter_rows(&im->rec, src, n_rows, cols, rows, dst);
}

cudaError_t cu_launch_scatter_rows(cudaStream_t s, const struct cu_op *op, const uint8_t *params)
{
    scatter_rows_kernel<<<(unsigned)op->n_rows, 128, 0, s>>>(
        op->u.scatter.src, op->u.scatter.cols,
        (const int32_t *)(params + op->u.scatter.idx_off), op->u.scatter.dst);
    return cudaGetLastError();
}
