/* backend/cuda/kernels.cu — elementwise CUDA kernels: embedding, RMSNorm, fused q/k norm + RoPE + KV write, SwiGLU, adds. */
#include <cuda_bf16.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/warp.cuh"


/* ---- embedding ---------------------------------------------------------- */

static __global__ void embed_kernel(const void *table, int64_t dim, int dtype,
                                    const int32_t *tokens, float *out)
{
    int64_t row = tokens[blockIdx.x];
    float *dst = out + (int64_t)blockIdx.x * dim;
    if (dtype == DTYPE_F32) {
        const float *src = (const float *)table + row * dim;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
            dst[i] = src[i];
    } else {
        const uint16_t *src = (const uint16_t *)table + row * dim;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
            dst[i] = bf16_bits_to_f32(src[i]);
    }
}

cudaError_t cu_launch_embed(cudaStream_t s, const struct cu_op *op, const uint8_t *params)
{
    if (dtype_is_block((enum dtype)op->u.embed.dtype))
        return cu_launch_embed_blocks(s, op, params);
    embed_kernel<<<op->n_rows, 256, 0, s>>>(op->u.embed.table, op->u.embed.cols, op->u.embed.dtype,
                                            (const int32_t *)(params + op->u.embed.tok_off),
                                            op->u.embed.out);
    return cudaGetLastError();
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* torch: x * rsqrt(mean(x^2) + eps), then * weight, all in f32. One warp per
 * row for short rows (per-head norms), one block per row otherwise. With add
 * (a residual add folded in, fuse.h rule 4), x += add first: each element is
 * summed, stored and read back by one thread, so x and y get the bits of the
 * two launches. With ybf (fuse.h rule 6) y is also written rounded to bf16
 * there, for the cuBLASLt GEMM after it; y NULL: only there. */
static __global__ void rmsnorm_warp_kernel(float *x, const float *add, const float *w,
                                           int64_t n_rows, int64_t dim, float eps, float *y,
                                           uint16_t *ybf)
{
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= n_rows)
        return;
    float *xr = x + row * dim;
    float sum = 0;
    for (int64_t i = lane; i < dim; i += 32) {
        float v = xr[i];
        if (add) {
            v += add[row * dim + i];
            xr[i] = v;
        }
        sum += v * v;
    }
    sum = warp_sum(sum);
    float inv = 1.0f / sqrtf(sum / (float)dim + eps);
    for (int64_t i = lane; i < dim; i += 32) {
        float v = w[i] * (xr[i] * inv);
        if (y)
            y[row * dim + i] = v;
        if (ybf)
            ybf[row * dim + i] = f32_to_bf16_bits(v);
    }
}

/* The block's sum of each thread's v (whole warps; partial: 32 floats of shared memory),
 * warp by warp, then the warps' sums in one warp. */
static __device__ __forceinline__ float block_sum(float v, float *partial)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float p = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        p = warp_sum(p);
        if (threadIdx.x == 0)
            partial[0] = p;
    }
    __syncthreads();
    return partial[0];
}

static __global__ void rmsnorm_block_kernel(float *x, const float *add, const float *w,
                                            int64_t dim, float eps, float *y, uint16_t *ybf)
{
    __shared__ float partial[32];
    float *xr = x + (int64_t)blockIdx.x * dim;
    float sum = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (add) {
            v += add[(int64_t)blockIdx.x * dim + i];
            xr[i] = v;
        }
        sum += v * v;
    }
    float inv = 1.0f / sqrtf(block_sum(sum, partial) / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = w[i] * (xr[i] * inv);
        if (y)
            y[(int64_t)blockIdx.x * dim + i] = v;
        if (ybf)
            ybf[(int64_t)blockIdx.x * dim + i] = f32_to_bf16_bits(v);
    }
}

/* The block kernel's arithmetic per element with the row held in registers:
 * each thread loads VPT float4s of x (and add) once, stores the sums back,
 * and normalizes from its registers (the sum of squares in another order:
 * per thread over its float4s, then the block). dim = 4 VPT blockDim. */
template <int VPT>
static __global__ void rmsnorm_rows4_kernel(float *x, const float *add, const float *w,
                                            int64_t dim, float eps, float *y, uint16_t *ybf)
{
    __shared__ float partial[32];
    const int64_t base = (int64_t)blockIdx.x * dim;
    float4 *xr = (float4 *)(x + base);
    const float4 *ar = (const float4 *)(add ? add + base : NULL);
    float4 v[VPT];
    float sum = 0;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = xr[i];
        if (add) {
            const float4 a = __ldcs(ar + i);
            v[k].x += a.x;
            v[k].y += a.y;
            v[k].z += a.z;
            v[k].w += a.w;
            xr[i] = v[k];
        }
        sum += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    const float inv = 1.0f / sqrtf(block_sum(sum, partial) / (float)dim + eps);
    const float4 *w4 = (const float4 *)w;
    float4 *yr = (float4 *)(y ? y + base : NULL);
    uint2 *yb = (uint2 *)(ybf ? ybf + base : NULL);
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        const float4 wk = w4[i];
        const float4 o = make_float4(wk.x * (v[k].x * inv), wk.y * (v[k].y * inv),
                                     wk.z * (v[k].z * inv), wk.w * (v[k].w * inv));
        if (y)
            yr[i] = o;
        if (ybf)
            yb[i] = make_uint2(
                (uint32_t)f32_to_bf16_bits(o.x) | ((uint32_t)f32_to_bf16_bits(o.y) << 16),
                (uint32_t)f32_to_bf16_bits(o.z) | ((uint32_t)f32_to_bf16_bits(o.w) << 16));
    }
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* Threads a block for rmsnorm_rows4_kernel at VPT float4s a thread, or 0
 * where dim does not split so (whole warps, 128 to 1024 threads). */
static int rows4_threads(int64_t dim, int vpt)
{
    if (dim % (4 * vpt) != 0)
        return 0;
    const int64_t t = dim / (4 * vpt);
    return t % 32 == 0 && t >= 128 && t <= 1024 ? (int)t : 0;
}

/* The RMSNorm of op (norm) over x, after x += add when add is not NULL (x is then the
 * add's output; without add it is only read), y also in bf16 into ybf when not NULL (only
 * there when bf16_only). */
static cudaError_t launch_rmsnorm(cudaStream_t s, const struct cu_op *op, float *x, const float *add,
                                  uint16_t *ybf, bool bf16_only)
{
    int64_t rows = op->u.norm.n_rows, dim = op->u.norm.dim;
    if (rows == 0)
        return cudaSuccess;
    if (bf16_only && !ybf)
        return cudaErrorInvalidValue;
    const float *w = op->u.norm.w;
    float *y = bf16_only ? NULL : op->u.norm.y;
    if (dim <= 512) {
        unsigned blocks = (unsigned)((rows + 7) / 8);
        rmsnorm_warp_kernel<<<blocks, 256, 0, s>>>(x, add, w, rows, dim, op->u.norm.eps, y, ybf);
        return cudaGetLastError();
    }
    if (aligned16(x) && (!add || aligned16(add)) && aligned16(w) && aligned16(y) &&
        (uintptr_t)ybf % 8 == 0) {
        int t;
        if ((t = rows4_threads(dim, 4)))
            rmsnorm_rows4_kernel<4><<<(unsigned)rows, t, 0, s>>>(x, add, w, dim,
                                                                  op->u.norm.eps, y, ybf);
        else if ((t = rows4_threads(dim, 2)))
            rmsnorm_rows4_kernel<2><<<(unsigned)rows, t, 0, s>>>(x, add, w, dim,
                                                                  op->u.norm.eps, y, ybf);
        else if ((t = rows4_threads(dim, 1)))
            rmsnorm_rows4_kernel<1><<<(unsigned)rows, t, 0, s>>>(x, add, w, dim,
                                                                  op->u.norm.eps, y, ybf);
        if (t)
            return cudaGetLastError();
    }
    rmsnorm_block_kernel<<<(unsigned)rows, dim >= 4096 ? 1024 : 512, 0, s>>>(
        x, add, w, dim, op->u.norm.eps, y, ybf);
    return cudaGetLastError();
}

cudaError_t cu_launch_rmsnorm(cudaStream_t s, const struct cu_op *op, uint16_t *ybf,
                              bool bf16_only)
{
    return launch_rmsnorm(s, op, (float *)op->u.norm.x, NULL, ybf, bf16_only);
}

cudaError_t cu_launch_add_rmsnorm(cudaStream_t s, const struct cu_op *add, const struct cu_op *norm,
                                  uint16_t *ybf, bool bf16_only)
{
    return launch_rmsnorm(s, norm, add->u.ew.out, add->u.ew.a, ybf, bf16_only);
}

/* ---- elementwise -------------------------------------------------------- */

static __global__ void add_kernel(float *y, const float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

static __device__ __forceinline__ float silu_mul1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

static __global__ void silu_mul_kernel(const float *gate, const float *up, float *out,
                                       uint16_t *outbf, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = silu_mul1(gate[i], up[i]);
        if (out)
            out[i] = v;
        if (outbf)
            outbf[i] = f32_to_bf16_bits(v);
    }
}

/* The same per element, four at a time (n a multiple of 4, every pointer
 * 16-byte aligned): a prefill's SwiGLU streams ~0.6 GB a layer, and 16-byte
 * loads keep four times the bytes in flight a thread. */
static __global__ void silu_mul4_kernel(const float4 *gate, const float4 *up, float4 *out,
                                        uint2 *outbf, int64_t n4)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 g = __ldcs(gate + i), u = __ldcs(up + i);
        const float4 v = make_float4(silu_mul1(g.x, u.x), silu_mul1(g.y, u.y),
                                     silu_mul1(g.z, u.z), silu_mul1(g.w, u.w));
        if (out)
            out[i] = v;
        if (outbf)
            outbf[i] = make_uint2((uint32_t)f32_to_bf16_bits(v.x) |
                                      ((uint32_t)f32_to_bf16_bits(v.y) << 16),
                                  (uint32_t)f32_to_bf16_bits(v.z) |
                                      ((uint32_t)f32_to_bf16_bits(v.w) << 16));
    }
}

static unsigned elementwise_blocks(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

cudaError_t cu_launch_add(cudaStream_t s, const struct cu_op *op)
{
    add_kernel<<<elementwise_blocks(op->u.ew.n), 256, 0, s>>>(op->u.ew.out, op->u.ew.a,
                                                              op->u.ew.n);
    return cudaGetLastError();
}

/* Fuse rule 10: gate and up in bf16 (as the GEMM before wrote them), h in
 * bf16 only; eight elements a thread where n is a multiple of 8 and every
 * pointer 16-byte aligned (vec), else one. */
template <bool VEC>
static __global__ void silu_mul_bf16_kernel(const uint16_t *gate, const uint16_t *up,
                                            uint16_t *out, int64_t n)
{
    const int64_t items = VEC ? n / 8 : n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < items;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (!VEC) {
            out[i] = f32_to_bf16_bits(silu_mul1(bf16_bits_to_f32(gate[i]),
                                                bf16_bits_to_f32(up[i])));
            continue;
        }
        const uint4 g = __ldcs((const uint4 *)gate + i), u = __ldcs((const uint4 *)up + i);
        const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
        uint32_t o[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float lo = silu_mul1(bf16_bits_to_f32((uint16_t)gw[k]),
                                       bf16_bits_to_f32((uint16_t)uw[k]));
            const float hi = silu_mul1(bf16_bits_to_f32((uint16_t)(gw[k] >> 16)),
                                       bf16_bits_to_f32((uint16_t)(uw[k] >> 16)));
            o[k] = (uint32_t)f32_to_bf16_bits(lo) | ((uint32_t)f32_to_bf16_bits(hi) << 16);
        }
        ((uint4 *)out)[i] = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

cudaError_t cu_launch_silu_mul(cudaStream_t s, const struct cu_op *op, uint16_t *outbf,
                               bool bf16_only, bool from_bf16)
{
    const int64_t n = op->u.ew.n;
    if ((bf16_only || from_bf16) && !outbf)
        return cudaErrorInvalidValue;
    if (from_bf16) {
        const uint16_t *g = (const uint16_t *)op->u.ew.a, *u = (const uint16_t *)op->u.ew.b;
        if (n % 8 == 0 && aligned16(g) && aligned16(u) && aligned16(outbf))
            silu_mul_bf16_kernel<true><<<elementwise_blocks(n / 8), 256, 0, s>>>(g, u, outbf, n);
        else
            silu_mul_bf16_kernel<false><<<elementwise_blocks(n), 256, 0, s>>>(g, u, outbf, n);
        return cudaGetLastError();
    }
    float *out = bf16_only ? NULL : op->u.ew.out;
    if (n % 4 == 0 && aligned16(op->u.ew.a) && aligned16(op->u.ew.b) && aligned16(out) &&
        (uintptr_t)outbf % 8 == 0) {
        silu_mul4_kernel<<<elementwise_blocks(n / 4), 256, 0, s>>>(
            (const float4 *)op->u.ew.a, (const float4 *)op->u.ew.b, (float4 *)out,
            (uint2 *)outbf, n / 4);
    } else {
        silu_mul_kernel<<<elementwise_blocks(n), 256, 0, s>>>(op->u.ew.a, op->u.ew.b, out, outbf,
                                                              n);
    }
    return cudaGetLastError();
}

/* Gemma 3's elementwise ops, as the CPU backend computes them (backend.h). */
static __global__ void gelu_tanh_mul_kernel(const float *gate, const float *up, float *out,
                                            int64_t n)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = gate[i];
        float inner = __fmul_rn(k, __fadd_rn(x, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x)));
        out[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), 1.0f + tanhf(inner)), up[i]);
    }
}

static __global__ void scale_kernel(float *x, int64_t n, float s)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

static __global__ void softcap_kernel(float *x, int64_t n, float cap)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(__fdiv_rn(x[i], cap));
}

cudaError_t cu_launch_ew_gemma(cudaStream_t s, const struct cu_op *op)
{
    unsigned blocks = elementwise_blocks(op->u.ew.n);
    if (op->kind == CU_GELU_TANH_MUL)
        gelu_tanh_mul_kernel<<<blocks, 256, 0, s>>>(op->u.ew.a, op->u.ew.b, op->u.ew.out,
                                                    op->u.ew.n);
    else if (op->kind == CU_SCALE)
        scale_kernel<<<blocks, 256, 0, s>>>(op->u.ew.out, op->u.ew.n, op->u.ew.s);
    else
        softcap_kernel<<<blocks, 256, 0, s>>>(op->u.ew.out, op->u.ew.n, op->u.ew.s);
    return cudaGetLastError();
}

/* Round to nearest even, as the CPU backend's f32_to_bf16. */
static __global__ void to_bf16_kernel(const float *x, int64_t n, uint16_t *out)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = f32_to_bf16_bits(x[i]);
    }
}

cudaError_t cu_launch_to_bf16(cudaStream_t s, const float *x, int64_t n, uint16_t *out)
{
    to_bf16_kernel<<<elementwise_blocks(n), 256, 0, s>>>(x, n, out);
    return cudaGetLastError();
}

static __global__ void bias_add_kernel(float *y, const float *bias, int64_t rows, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % rows];
}

cudaError_t cu_launch_bias_add(cudaStream_t s, float *y, const float *bias, int64_t rows,
                               int n_rows)
{
    int64_t n = rows * n_rows;
    bias_add_kernel<<<elementwise_blocks(n), 256, 0, s>>>(y, bias, rows, n);
    return cudaGetLastError();
}

/* ---- paged KV addressing ------------------------------------------------ */

/* The span that activation row `row` belongs to, and its position. */
static __device__ __forceinline__ const struct cu_span *row_span(const uint8_t *params,
                                                                 uint32_t spans_off, int n_spans,
                                                                 int row, int *pos)
{
    const struct cu_span *spans = (const struct cu_span *)(params + spans_off);
    const int *rowmap = (const int *)(spans + n_spans);
    if (rowmap[row] < 0)
        return NULL;
    const struct cu_span *sp = &spans[rowmap[row]];
    *pos = sp->pos0 + (row - sp->row0);
    return sp;
}

static __device__ __forceinline__ size_t kv_slot(const struct cu_kv *kv, int layer,
                                                 const uint8_t *params, const struct cu_span *sp,
                                                 int pos)
{
    const uint32_t *bt = (const uint32_t *)(params + sp->bt_off);
    uint32_t block = bt[pos / kv->block_size];
    size_t kv_dim = (size_t)kv->n_kv_heads * kv->head_dim;
    return (((size_t)layer * kv->n_blocks + block) * kv->block_size + pos % kv->block_size) * kv_dim;
}

static __global__ void kv_store_kernel(struct cu_kv kv, int layer, const float *k, const float *v,
                                       uint32_t spans_off, int n_spans, const uint8_t *params)
{
    int row = blockIdx.x, pos;
    const struct cu_span *sp = row_span(params, spans_off, n_spans, row, &pos);
    if (!sp)
        return;
    size_t off = kv_slot(&kv, layer, params, sp, pos);
    int kv_dim = kv.n_kv_heads * kv.head_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kv_put(kv.k, off + i, k[(size_t)row * kv_dim + i], kv.f16);
        kv_put(kv.v, off + i, v[(size_t)row * kv_dim + i], kv.f16);
    }
}

cudaError_t cu_launch_kv_store(cudaStream_t s, const struct cu_op *op, const uint8_t *params)
{
    if (op->n_rows == 0)
        return cudaSuccess;
    if (op->u.store.kv.quant)
        return cu_launch_kv_store_quant(s, op, params);
    kv_store_kernel<<<op->n_rows, 256, 0, s>>>(op->u.store.kv, op->u.store.layer, op->u.store.k,
                                               op->u.store.v, op->u.store.spans_off,
                                               op->u.store.n_spans, params);
    return cudaGetLastError();
}

/* One thread block per (layer, K or V): slots [0, n) of a block are
 * contiguous, so the copy is of 32-bit words where the rows allow (n * kv_dim
 * elements of 2 or 4 bytes; kv_dim is even wherever head_dim is), of bytes
 * otherwise (a quantized cache's rows of records). */
static __global__ void kv_copy_kernel(struct cu_kv kv, uint32_t src, uint32_t dst, int n)
{
    int layer = blockIdx.x;
    void *base = blockIdx.y ? kv.v : kv.k;
    size_t kv_dim = (size_t)kv.n_kv_heads * kv.head_dim;
    size_t row = kv.quant ? (blockIdx.y ? kv.v_row_bytes : kv.k_row_bytes)
                          : kv_dim * (kv.f16 ? 2 : 4);
    size_t per_block = (size_t)kv.block_size * row;
    size_t bytes = (size_t)n * row;
    const uint8_t *from = (const uint8_t *)base + ((size_t)layer * kv.n_blocks + src) * per_block;
    uint8_t *to = (uint8_t *)base + ((size_t)layer * kv.n_blocks + dst) * per_block;
    if (bytes % 4 == 0) {
        for (size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
            ((uint32_t *)to)[i] = ((const uint32_t *)from)[i];
    } else {
        for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
            to[i] = from[i];
    }
}

cudaError_t cu_launch_kv_copy(cudaStream_t s, const struct cu_op *op)
{
    if (op->u.copy.n <= 0)
        return cudaSuccess;
    dim3 grid((unsigned)op->u.copy.n_layers, 2);
    kv_copy_kernel<<<grid, 256, 0, s>>>(op->u.copy.kv, op->u.copy.src, op->u.copy.dst,
                                        op->u.copy.n);
    return cudaGetLastError();
}

/* ---- q/k: norm, RoPE, KV write ------------------------------------------ */

#define QK_WARPS 4

/* One warp per (row, head) of q then k. The head goes through shared memory
 * so RoPE's rotate-half pairs (i, i + half) can live in different lanes. */
static __global__ void qk_prep_kernel(struct cu_qk_args a, const uint8_t *params)
{
    __shared__ float vec[QK_WARPS][CU_MAX_HEAD_DIM];
    pdl_release();
    pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int row = blockIdx.x;
    int h = blockIdx.y * QK_WARPS + warp;
    if (h >= a.n_q_heads + a.n_k_heads)
        return;
    bool is_k = h >= a.n_q_heads;
    int head = is_k ? h - a.n_q_heads : h;
    int n_heads = is_k ? a.n_k_heads : a.n_q_heads;
    int hd = a.head_dim;
    float *x = (is_k ? a.k : a.q) + ((size_t)row * n_heads + head) * hd;
    float *v = vec[warp];
    float pos;
    const float *freq = qk_row_freqs(a, params, row, &pos);
    qk_head_prep(x, is_k ? a.k_norm : a.q_norm, a.eps, hd, a.rot_dim, pos, freq, a.factor, v);
    bool store = false;
    size_t off = 0;
    const float *vsrc = NULL;
    const int f16 = a.kv.f16;
    if (is_k && a.store) {
        int p;
        const struct cu_span *sp = row_span(params, a.spans_off, a.n_spans, row, &p);
        if (sp) {
            off = kv_slot(&a.kv, a.layer, params, sp, p) + (size_t)head * hd;
            vsrc = a.v + ((size_t)row * n_heads + head) * hd;
            store = true;
        }
    }
    for (int i = lane; i < hd; i += 32) {
        x[i] = v[i];
        if (store) {
            kv_put(a.kv.k, off + i, v[i], f16);
            kv_put(a.kv.v, off + i, vsrc[i], f16);
        }
    }
}

cudaError_t cu_launch_qk_prep(const struct cu_device *dev, cudaStream_t s,
                              const struct cu_qk_args *a, const uint8_t *params)
{
    int heads = a->n_q_heads + a->n_k_heads;
    if (a->n_rows == 0 || heads == 0)
        return cudaSuccess;
    dim3 grid((unsigned)a->n_rows, (unsigned)((heads + QK_WARPS - 1) / QK_WARPS));
    return cu_launch_dependent(dev->pdl, qk_prep_kernel, grid, dim3(QK_WARPS * 32), 0, s, *a, params);
}
