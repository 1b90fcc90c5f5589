/* backend/cuda/lora.cu — the low-rank adapter op on the GPU: a segmented shrink (u = A x) and expand (y += scale B u), as Punica's SGMV, reading the step's segments from the parameter arena. */
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

/* Element i of an adapter matrix, f32 or bf16 (widened exactly). */
static __device__ __forceinline__ float lora_at(const void *m, size_t i, int bf16)
{
    if (bf16)
        return __uint_as_float((uint32_t)((const uint16_t *)m)[i] << 16);
    return ((const float *)m)[i];
}

#define SHRINK_WARPS 4
#define EXPAND_THREADS 128

/* One warp per (row of a segment, rank index): lanes stride over x's
 * columns, then a butterfly sum; the order is fixed by in alone, so a row's
 * u never depends on the other rows of the step. */
static __global__ void lora_shrink(const float *x, int64_t in, const struct cu_lora_seg *segs,
                                   int max_rank, float *scratch)
{
    const struct cu_lora_seg sg = segs[blockIdx.y];
    int warp = (int)(blockIdx.x * SHRINK_WARPS + threadIdx.x / 32), lane = threadIdx.x % 32;
    int t = warp / max_rank, k = warp % max_rank;
    if (t >= sg.n_rows || k >= sg.rank)
        return;
    const float *xr = x + (size_t)(sg.row0 + t) * (size_t)in;
    size_t a0 = (size_t)k * (size_t)in;
    float acc = 0.0f;
    for (int64_t c = lane; c < in; c += 32)
        acc = fmaf(lora_at(sg.a, a0 + (size_t)c, sg.bf16), xr[c], acc);
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0)
        scratch[sg.u_off + (uint32_t)(t * sg.rank + k)] = acc;
}

/* One thread per (row, output): every segment covering the row, in order. */
static __global__ void lora_expand(const struct cu_lora_seg *segs, int n_segs, int64_t out,
                                   const float *scratch, float *y)
{
    int64_t r = (int64_t)blockIdx.x * EXPAND_THREADS + threadIdx.x;
    int t = (int)blockIdx.y;
    if (r >= out)
        return;
    float yv = y[(size_t)t * (size_t)out + (size_t)r];
    for (int i = 0; i < n_segs; i++) {
        const struct cu_lora_seg sg = segs[i];
        if (t < sg.row0 || t >= sg.row0 + sg.n_rows)
            continue;
        const float *u = scratch + sg.u_off + (size_t)(t - sg.row0) * (size_t)sg.rank;
        size_t b0 = (size_t)r * (size_t)sg.b_stride;
        float v = 0.0f;
        for (int k = 0; k < sg.rank; k++)
            v = fmaf(lora_at(sg.b, b0 + (size_t)k, sg.bf16), u[k], v);
        yv += sg.scale * v;
    }
    y[(size_t)t * (size_t)out + (size_t)r] = yv;
}

cudaError_t cu_launch_lora(cudaStream_t s, const struct cu_op *op, const uint8_t *params)
{
    const struct cu_lora_seg *segs = (const struct cu_lora_seg *)(params + op->u.lora.segs_off);
    int warps = op->u.lora.max_seg_rows * op->u.lora.max_rank;
    dim3 shrink_grid((unsigned)((warps + SHRINK_WARPS - 1) / SHRINK_WARPS), (unsigned)op->u.lora.n_segs);
    lora_shrink<<<shrink_grid, SHRINK_WARPS * 32, 0, s>>>(op->u.lora.x, op->u.lora.in, segs,
                                                         op->u.lora.max_rank, op->u.lora.scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    dim3 expand_grid((unsigned)((op->u.lora.out + EXPAND_THREADS - 1) / EXPAND_THREADS),
                     (unsigned)op->n_rows);
    lora_expand<<<expand_grid, EXPAND_THREADS, 0, s>>>(segs, op->u.lora.n_segs, op->u.lora.out,
                                                       op->u.lora.scratch, op->u.lora.y);
    return cudaGetLastError();
}
