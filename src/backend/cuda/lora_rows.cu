/* backend/cuda/lora_rows.cu — fuse rule 7: adapter work folded into the row launches around the matmuls, an add-and-RMSNorm, an RMSNorm or a SiLU-mul that also expands the lora ops whose outputs it reads and shrinks the lora group over what it writes.
 *
 * A decode step with adapters otherwise runs two launches a lora group
 * (lora.cu), eight a Llama layer, each a short latency chain; at 16 rows
 * they cost more than the adapters' bytes by an order of magnitude. The row
 * launches around the matmuls already hold what those launches need: the
 * add-and-RMSNorm after o_proj reads o_proj's output (the expand's y) and
 * writes the gate/up matmul's x (the next shrink's x); the SiLU-mul reads
 * gate and up and writes down_proj's x. Folded in, a layer keeps two adapter
 * launches (q/k/v's expand, o_proj's shrink).
 *
 * A row is a cluster of CU_LORA_ROWS_CLUSTER blocks, block r owning the
 * columns [r slice, (r + 1) slice). Before waiting for the launch before
 * (programmatic dependent launch), each block copies into shared memory what
 * no step writes: the B rows of its slice of each folded expand's first
 * covering segment and the A columns of its slice of each shrunk op's. Then,
 * per element: the expand (y += scale B u, segments in order, each B row
 * times u in rank order: lora_expand_kernel's sums), the add and the row
 * op. The RMSNorm's sum of squares and the shrink's dot products are partial
 * sums per block, added in block order through distributed shared memory,
 * so a row's bits depend on the row alone: each block pushes its partial
 * into the block that adds it (a store into that block's shared memory)
 * before the cluster's barrier, so nothing is read across blocks after it.
 * A row covered by more than one segment of an op (stacked adapters) reads
 * the later ones from global memory.
 *
 * Off by default (--cuda-lora-rows on). On an H200 (Llama-3.2-1B shape, 16
 * sequences over 16 rank-16 adapters) a replayed step took 2,131 us against
 * 2,111 with the group launches: the six launches a layer it saves were worth
 * ~440 us a step, and each of its 48 row launches cost ~10 us more than the
 * plain RMSNorm or SiLU-mul (a chain of four memory round trips and one or
 * two cluster barriers, where the plain kernels have two round trips). At
 * the Llama-3.1-8B shape, whose SiLU-mul slices stage ~180 KB a block, it
 * lost more (72.3% of no adapter against 76.7%). */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/warp.cuh"

#define LR_THREADS 256
#define LR_WARPS (LR_THREADS / 32)
#define LR_CLUSTER CU_LORA_ROWS_CLUSTER

/* Thread-block clusters (compute capability 9.0; the planner takes rule 7 nowhere else):
 * warp.cuh's barrier of the cluster's threads orders shared memory writes before it against
 * reads after it (or its relaxed arrival at the start and the wait for the others before
 * the first store into another block, which needs every block of the cluster running); v
 * into the float at p's place in block b's shared memory. */
static __device__ __forceinline__ void lr_cluster_store(float *p, int b, float v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t remote = cluster_map((uint32_t)__cvta_generic_to_shared(p), b);
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ bool lr_covers(const struct cu_lora_seg &sg, int t)
{
    return t >= sg.row0 && t < sg.row0 + sg.n_rows;
}

#define LR_JOBS (2 + CU_LORA_MAX_GROUP) /* in[0], in[1], out[]: a launch's lora jobs */

static_assert(sizeof(struct cu_lora_seg) % 16 == 0, "segment tables copy in 16-byte pieces");

/* A B row of the slice's first covering segment (rank a multiple of 8, in shared memory)
 * times u, in rank order. */
static __device__ __forceinline__ float lr_dot_shared(const uint16_t *br, const float *u, int rank)
{
    float d = 0.0f;
    for (int k = 0; k < rank; k += 8) {
        const uint4 q = *(const uint4 *)(br + k);
#pragma unroll
        for (int p = 0; p < 8; p++)
            d = fmaf(bf16x8_at(q, p), u[k + p], d);
    }
    return d;
}

static __global__ void __launch_bounds__(LR_THREADS) lora_rows_kernel(struct cu_lora_rows_args a)
{
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float warp_ss[LR_WARPS];
    __shared__ float cluster_ss[LR_CLUSTER]; /* the blocks' sums of squares, by rank */
    __shared__ int n_cover[LR_JOBS], cover[LR_JOBS][LORA_MAX_STACK];
    const int r = cluster_rank();
    const int t = (int)(blockIdx.x / LR_CLUSTER);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t dim = a.lay.dim, slice = a.lay.slice, c0 = (int64_t)r * slice;
    const int nc = dim - c0 <= 0 ? 0 : (int)(dim - c0 < slice ? dim - c0 : slice);
    float *ys = (float *)(sm + a.lay.y);
    const bool remote = !a.silu || a.n_out > 0; /* stores into the other blocks */
    if (remote)
        cluster_arrive_relaxed();

    /* the jobs' segment tables, in one round trip */
    /* (the loops over jobs are unrolled: the arguments stay in the parameter space) */
    const int n_jobs = 2 + a.n_out;
#pragma unroll
    for (int j = 0; j < LR_JOBS; j++) {
        const bool on = j < 2 ? a.has_in[j < 2 ? j : 0] : j < n_jobs;
        const struct cu_lora_rows_job job = j < 2 ? a.in[j < 2 ? j : 0] : a.out[j < 2 ? 0 : j - 2];
        const int pieces = on ? job.n_segs * (int)(sizeof(struct cu_lora_seg) / 16) : 0;
        for (int q = tid; q < pieces; q += LR_THREADS)
            cp_async16(sm + a.lay.segs[j] + (size_t)q * 16, a.params + job.segs_off + (size_t)q * 16,
                       true);
        if (tid == 0)
            n_cover[j] = on ? job.n_segs : 0; /* the job's segments, until counted below */
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    /* which of each job's segments cover row t, in order (at most a stack of them) */
    if (tid < LR_JOBS) {
        const int n_segs = n_cover[tid];
        const struct cu_lora_seg *segs = (const struct cu_lora_seg *)(sm + a.lay.segs[tid]);
        int n = 0;
        for (int i = 0; i < n_segs && n < LORA_MAX_STACK; i++)
            if (lr_covers(segs[i], t))
                cover[tid][n++] = i;
        n_cover[tid] = n;
    }
    __syncthreads();
#define LR_SEG(j, m) (((const struct cu_lora_seg *)(sm + a.lay.segs[j]))[cover[j][m]])

    /* what no step writes, before the wait: the first covering segments' B rows and A
     * columns of the slice */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (n_cover[j] == 0)
            continue;
        const struct cu_lora_seg sg = LR_SEG(j, 0);
        uint8_t *dst = sm + a.lay.b_in[j];
        for (int e = tid; e < nc; e += LR_THREADS)
            for (int w = 0; w < sg.rank; w += 8)
                cp_async16(dst + ((size_t)e * sg.rank + (size_t)w) * 2,
                           (const uint16_t *)sg.b + (size_t)(c0 + e) * (size_t)sg.b_stride + w,
                           true);
    }
#pragma unroll
    for (int j = 2; j < LR_JOBS; j++) {
        if (j >= n_jobs || n_cover[j] == 0)
            continue;
        const struct cu_lora_seg sg = LR_SEG(j, 0);
        uint8_t *dst = sm + a.lay.a_out[j - 2];
        for (int k = warp; k < sg.rank; k += LR_WARPS)
            for (int w = lane; w < nc / 8; w += 32)
                cp_async16(dst + ((size_t)k * (size_t)slice + (size_t)w * 8) * 2,
                           (const uint16_t *)sg.a + (size_t)k * (size_t)dim + (size_t)c0 + w * 8,
                           true);
    }
    cp_async_commit();
    pdl_release();
    pdl_wait();

    /* the first covering segments' u */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (n_cover[j] == 0)
            continue;
        const struct cu_lora_seg sg = LR_SEG(j, 0);
        float *us = (float *)(sm + a.lay.u_in[j]);
        for (int k = tid; k < sg.rank; k += LR_THREADS)
            us[k] = __ldcg(a.u_in + a.in[j].u_base + sg.u_off +
                           (size_t)(t - sg.row0) * (size_t)sg.rank + k);
    }
    cp_async_wait<0>();
    __syncthreads();

    /* the expands (y += scale B u, covering segments in order), the add, the row op */
    float ss = 0.0f;
    const size_t row = (size_t)t * (size_t)dim;
    for (int e = tid; e < nc; e += LR_THREADS) {
        const int64_t c = c0 + e;
        const size_t idx = row + (size_t)c;
        float v[2] = {0.0f, 0.0f};
        float *in_ptr[2] = {a.a, a.silu ? a.b : NULL};
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (!in_ptr[j])
                continue;
            v[j] = in_ptr[j][idx];
            if (n_cover[j] == 0)
                continue;
            for (int m = 0; m < n_cover[j]; m++) {
                const struct cu_lora_seg sg = LR_SEG(j, m);
                float d = 0.0f;
                if (m == 0) {
                    d = lr_dot_shared((const uint16_t *)(sm + a.lay.b_in[j]) +
                                          (size_t)e * (size_t)sg.rank,
                                      (const float *)(sm + a.lay.u_in[j]), sg.rank);
                } else {
                    const uint16_t *br = (const uint16_t *)sg.b + (size_t)c * (size_t)sg.b_stride;
                    const float *u = a.u_in + a.in[j].u_base + sg.u_off +
                                     (size_t)(t - sg.row0) * (size_t)sg.rank;
                    for (int k = 0; k < sg.rank; k++)
                        d = fmaf(bf16_bits_to_f32(__ldg(br + k)), __ldcg(u + k), d);
                }
                v[j] += sg.scale * d;
            }
            if (in_ptr[j] != a.y)
                in_ptr[j][idx] = v[j]; /* the lora op's y, as it would leave it */
        }
        if (a.silu) {
            const float o = v[0] / (1.0f + expf(-v[0])) * v[1];
            a.y[idx] = o;
            if (a.ybf)
                a.ybf[idx] = f32_to_bf16_bits(o);
            ys[e] = o;
        } else {
            float x = a.x[idx];
            if (a.a) {
                x += v[0];
                a.x[idx] = x;
            }
            ys[e] = x;
            ss += x * x;
        }
    }

    if (!a.silu) {
        /* the sum of squares: the block's, then the cluster's in block order */
        ss = warp_sum(ss);
        if (lane == 0)
            warp_ss[warp] = ss;
        __syncthreads();
        cluster_wait(); /* every block of the cluster runs */
        if (warp == 0) { /* the block's sum, into slot r of every block of the cluster */
            float s = 0.0f;
            for (int w = 0; w < LR_WARPS; w++)
                s += warp_ss[w];
            if (lane < LR_CLUSTER)
                lr_cluster_store(&cluster_ss[r], lane, s);
        }
        cluster_sync();
        float total = 0.0f; /* in block order */
        for (int b = 0; b < LR_CLUSTER; b++)
            total += cluster_ss[b];
        const float inv = 1.0f / sqrtf(total / (float)dim + a.eps);
        for (int e = tid; e < nc; e += LR_THREADS) {
            const size_t idx = row + (size_t)(c0 + e);
            const float o = a.w[c0 + e] * (ys[e] * inv);
            a.y[idx] = o;
            if (a.ybf)
                a.ybf[idx] = f32_to_bf16_bits(o);
            ys[e] = o;
        }
    }
    if (a.n_out == 0)
        return;
    if (a.silu)
        cluster_wait(); /* every block of the cluster runs */
    __syncthreads();

    /* the shrink: item (job, covering segment, rank index k) dots its A row's slice with
     * the slice's output, a warp an item (items in order, warp w the w-th of each eight);
     * its partial sum goes into slot r of item i's row in block i % LR_CLUSTER, which adds
     * the slots in block order */
    float *part = (float *)(sm + a.lay.part); /* [item / LR_CLUSTER][LR_CLUSTER] */
    unsigned n_items = 0;
#pragma unroll
    for (int j = 2; j < LR_JOBS; j++) {
        for (int m = 0; j < n_jobs && m < n_cover[j]; m++) {
            const struct cu_lora_seg sg = LR_SEG(j, m);
            const int k0 = (int)(((unsigned)warp + LR_WARPS - n_items % LR_WARPS) % LR_WARPS);
            for (int k = k0; k < sg.rank; k += LR_WARPS) {
                const unsigned item = n_items + (unsigned)k;
                const uint16_t *ar =
                    m == 0 ? (const uint16_t *)(sm + a.lay.a_out[j - 2]) + (size_t)k * (size_t)slice
                           : (const uint16_t *)sg.a + (size_t)k * (size_t)dim + (size_t)c0;
                float d = 0.0f;
                for (int w = lane; w < nc / 8; w += 32) {
                    const uint4 q = m == 0 ? *(const uint4 *)(ar + w * 8)
                                           : __ldg((const uint4 *)(ar + w * 8));
                    const float4 y0 = *(const float4 *)(ys + w * 8);
                    const float4 y1 = *(const float4 *)(ys + w * 8 + 4);
                    const float yv[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
                    for (int p = 0; p < 8; p++)
                        d = fmaf(bf16x8_at(q, p), yv[p], d);
                }
                d = warp_sum(d);
                if (lane == 0 && item < a.lay.items)
                    lr_cluster_store(&part[(item / LR_CLUSTER) * LR_CLUSTER + (unsigned)r],
                                     (int)(item % LR_CLUSTER), d);
            }
            n_items += (unsigned)sg.rank;
        }
    }
    cluster_sync();
    /* this block's items: r, r + LR_CLUSTER, ...; where each one's u goes */
    unsigned item = 0;
#pragma unroll
    for (int j = 2; j < LR_JOBS; j++) {
        for (int m = 0; j < n_jobs && m < n_cover[j]; m++) {
            const struct cu_lora_seg sg = LR_SEG(j, m);
            const uint32_t u0 =
                a.out[j - 2].u_base + sg.u_off + (uint32_t)((t - sg.row0) * sg.rank);
            for (int k = tid; k < sg.rank; k += LR_THREADS) {
                const unsigned i = item + (unsigned)k;
                if (i % LR_CLUSTER != (unsigned)r || i >= a.lay.items)
                    continue;
                float s = 0.0f;
                for (int b = 0; b < LR_CLUSTER; b++)
                    s += part[(i / LR_CLUSTER) * LR_CLUSTER + b];
                a.u_out[u0 + (uint32_t)k] = s;
            }
            item += (unsigned)sg.rank;
        }
    }
#undef LR_SEG
}

cudaError_t cu_launch_lora_rows(const struct cu_device *dev, cudaStream_t s,
                                const struct cu_lora_rows_args *a)
{
    if (a->n_rows <= 0)
        return cudaSuccess;
    if (a->n_out > CU_LORA_MAX_GROUP || (int)a->lay.bytes > dev->smem_optin)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(lora_rows_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)a->lay.bytes);
    if (e != cudaSuccess)
        return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)a->n_rows * LR_CLUSTER);
    cfg.blockDim = dim3(LR_THREADS);
    cfg.dynamicSmemBytes = a->lay.bytes;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = LR_CLUSTER;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = dev->pdl ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, lora_rows_kernel, *a);
}
