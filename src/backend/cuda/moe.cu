/* backend/cuda/moe.cu — mixture-of-experts on the GPU: routing (softmax + torch.topk's choice) per row, and the chosen experts' SwiGLU MLPs read by the ids routing left in device memory.
 *
 * Nothing crosses to the host: the expert ids stay where routing wrote
 * them and the experts' matrices are found through a pointer table in the
 * step's parameter arena, so a decode step stays one capturable graph. Every
 * output is reduced by one warp in column order, so a row's bits never depend
 * on the rows beside it (EXACT mode's batch invariance); an expert no row
 * chose is never read. */
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/moe_route.h"

#define MOE_WARPS 8

static __global__ void moe_route_kernel(const float *logits, int n_rows, int n_experts, int top_k,
                                        int norm, int32_t *ids, float *weights)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows)
        return;
    struct moe_pair scratch[MOE_MAX_EXPERTS];
    moe_route_row(logits + (size_t)r * n_experts, n_experts, top_k, norm != 0, scratch,
                  ids + (size_t)r * top_k, weights + (size_t)r * top_k);
}

cudaError_t cu_launch_moe_route(cudaStream_t s, const struct cu_op *op)
{
    int threads = 32, blocks = (op->n_rows + threads - 1) / threads;
    moe_route_kernel<<<blocks, threads, 0, s>>>(op->u.route.logits, op->n_rows,
                                                 op->u.route.n_experts, op->u.route.top_k,
                                                 op->u.route.norm, op->u.route.ids,
                                                 op->u.route.weights);
    return cudaGetLastError();
}

static __device__ __forceinline__ float round_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return x;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

/* Element c of row of a matrix of dtype (bf16 or f32). */
static __device__ __forceinline__ float w_at(const void *row, int64_t c, int bf16)
{
    return bf16 ? __uint_as_float((uint32_t)((const uint16_t *)row)[c] << 16)
                : ((const float *)row)[c];
}

/* sum over c of w[c] * x[c], lanes striding the columns, then a fixed tree. */
static __device__ __forceinline__ float warp_dot(const void *w, const float *x, int64_t cols,
                                                 int bf16, bool rnd)
{
    int lane = threadIdx.x & 31;
    float acc = 0;
    for (int64_t c = lane; c < cols; c += 32) {
        float xv = rnd ? round_bf16(x[c]) : x[c];
        acc = fmaf(w_at(w, c, bf16), xv, acc);
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

/* h[p, o] = silu(gate[e] x[r]) * up[e] x[r] for pair p = (row r, slot j),
 * e = ids[p]; one warp per (p, o). */
static __global__ void moe_gate_up_kernel(const float *x, int64_t hidden, int64_t inter, int top_k,
                                          int n_experts, const void *const *mats,
                                          const int32_t *ids, int bf16, int rnd, float *h)
{
    int64_t o = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    int p = blockIdx.y;
    if (o >= inter)
        return;
    int e = ids[p];
    size_t esz = bf16 ? 2 : 4;
    const uint8_t *g = (const uint8_t *)mats[e] + (size_t)o * hidden * esz;
    const uint8_t *u = (const uint8_t *)mats[n_experts + e] + (size_t)o * hidden * esz;
    const float *xr = x + (size_t)(p / top_k) * hidden;
    float gv = warp_dot(g, xr, hidden, bf16, rnd != 0);
    float uv = warp_dot(u, xr, hidden, bf16, rnd != 0);
    if ((threadIdx.x & 31) == 0)
        h[(size_t)p * inter + o] = gv / (1.0f + expf(-gv)) * uv;
}

/* y[r, o] = sum over the row's experts in ascending id of w * down[e][o] . h[p];
 * one warp per (r, o). */
static __global__ void moe_down_kernel(const float *h, int64_t hidden, int64_t inter, int top_k,
                                       int n_experts, const void *const *mats, const int32_t *ids,
                                       const float *weights, int bf16, int rnd, float *y)
{
    int64_t o = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    int r = blockIdx.y;
    if (o >= hidden)
        return;
    size_t esz = bf16 ? 2 : 4;
    const int32_t *ri = ids + (size_t)r * top_k;
    float acc = 0;
    int32_t done = -1;
    for (int k = 0; k < top_k; k++) {
        int best = -1;
        for (int j = 0; j < top_k; j++)
            if (ri[j] > done && (best < 0 || ri[j] < ri[best]))
                best = j;
        done = ri[best];
        const uint8_t *d = (const uint8_t *)mats[2 * n_experts + done] + (size_t)o * inter * esz;
        float dv = warp_dot(d, h + ((size_t)r * top_k + best) * inter, inter, bf16, rnd != 0);
        float term = weights[(size_t)r * top_k + best] * dv;
        acc += term;
    }
    if ((threadIdx.x & 31) == 0)
        y[(size_t)r * hidden + o] = acc;
}

cudaError_t cu_launch_moe_ffn(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                              bool round)
{
    const void *const *mats = (const void *const *)(params + op->u.moe.mats_off);
    int bf16 = op->u.moe.dtype == DTYPE_BF16;
    int64_t hidden = op->u.moe.hidden, inter = op->u.moe.inter;
    int k = op->u.moe.top_k;
    float *h = op->u.moe.scratch;
    dim3 g1((unsigned)((inter + MOE_WARPS - 1) / MOE_WARPS), (unsigned)(op->n_rows * k));
    moe_gate_up_kernel<<<g1, 32 * MOE_WARPS, 0, s>>>(op->u.moe.x, hidden, inter, k,
                                                     op->u.moe.n_experts, mats, op->u.moe.ids,
                                                     bf16, round, h);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((hidden + MOE_WARPS - 1) / MOE_WARPS), (unsigned)op->n_rows);
    moe_down_kernel<<<g2, 32 * MOE_WARPS, 0, s>>>(h, hidden, inter, k, op->u.moe.n_experts, mats,
                                                  op->u.moe.ids, op->u.moe.weights, bf16, round,
                                                  op->u.moe.y);
    return cudaGetLastError();
}

static __global__ void gated_add_kernel(float *y, const float *x, const float *g, int64_t n_rows,
                                        int64_t dim)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * dim;
         i += (int64_t)gridDim.x * blockDim.x) {
        float sg = 1.0f / (1.0f + expf(-g[i / dim]));
        y[i] += sg * x[i];
    }
}

cudaError_t cu_launch_gated_add(cudaStream_t s, const struct cu_op *op)
{
    int64_t n = (int64_t)op->n_rows * op->u.gated.dim;
    int blocks = (int)((n + 255) / 256);
    blocks = blocks < 1024 ? blocks : 1024;
    gated_add_kernel<<<blocks, 256, 0, s>>>(op->u.gated.y, op->u.gated.x, op->u.gated.g,
                                            op->n_rows, op->u.gated.dim);
    return cudaGetLastError();
}
