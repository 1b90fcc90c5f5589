/* backend/cuda/cuda_internal.h — the CUDA backend's private state: the device, the recorded step, caches, kernel launchers. */
#ifndef INFERD_BACKEND_CUDA_INTERNAL_H
#define INFERD_BACKEND_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

#include "backend/cuda/fuse.h"
#include "backend/cuda/record.h"

extern "C" {
#include "backend/backend.h"
}

#define CU_GRAPH_CACHE 8
/* Recent eager steps remembered, so that steps alternating between a few op
 * lists (a draft model's and its target's) are captured too. */
#define CU_EAGER_RECENT 4

/* Streaming GEMV kernels (gemv.cu): 4 row counts x 2 matrix counts x with
 * or without the folded RMSNorm. */
#define CU_GEMV_STREAM_KERNELS 16
/* MoE kernels whose shared memory may pass the default 48 KB (moe.cu). */
#define CU_MOE_SMEM_KERNELS 12
/* MoE rows from which the GEMVs group the pairs by expert (a plan launch
 * first), so an expert several rows chose is read once for all of them; the
 * bits of each row stay those of the row alone. */
#define CU_MOE_SHARE_MIN_ROWS 4
/* FAST-mode MoE rows from which the experts run as a grouped tensor-core
 * GEMM. Below it the GEMVs read each chosen expert once, which is what a
 * batched decode step costs anyway; the GEMM pads each expert's rows to its
 * tiles (32 rows, 128 once the experts average 64). Not yet measured. */
#define CU_MOE_GEMM_MIN_ROWS 32

/* One GPU: what was asked of it when the backend was created, and what has
 * been set up on it since. CUDA keeps kernel attributes per device, so they
 * are tracked here, with the device, not in statics. */
struct cu_device {
    int index;
    int n_sm;          /* streaming multiprocessors */
    int smem_optin;    /* shared memory one block may opt in to, bytes */
    bool pdl;          /* launches may be programmatic dependents: sm_90+ and the option on */
    /* dynamic shared memory each streaming GEMV kernel has been allowed
     * (cudaFuncAttributeMaxDynamicSharedMemorySize), bytes; 0: not yet */
    size_t gemv_smem[CU_GEMV_STREAM_KERNELS];
    /* the same for qgemv.cu's stream kernels: Q4_K, Q6_K, then the mixed ones (one matrix
     * a row, so half as many) */
    size_t qgemv_smem[2 * CU_GEMV_STREAM_KERNELS + CU_GEMV_STREAM_KERNELS / 2];
    size_t moe_smem[CU_MOE_SMEM_KERNELS]; /* the same for the MoE kernels */
    size_t skinny_smem[6];                 /* and the skinny GEMM's (pair, plain deep, plain;
                                              then the same normalising x, fuse rule 9) */
};

#ifdef __CUDACC__
#include <cuda_fp16.h>

/* Programmatic dependent launch (sm_90): a kernel launched with
 * cu_launch_dependent may start while the launch before it drains; it must
 * call pdl_wait() before it reads anything that launch wrote (or writes
 * anything it reads), and calls pdl_release() to let the launch after it
 * start early in turn. Both are no-ops otherwise. */
static __device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The block's barrier, or with `threads` > 0 one its first `threads` threads
 * (a multiple of 32) meet at alone (named barrier 1), the others gone. */
static __device__ __forceinline__ void block_part_sync(int threads)
{
    if (threads > 0)
        asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
    else
        __syncthreads();
}

/* Called by all threads of a block (or its first `threads`, block_part_sync's)
 * after each wrote its share of the block's partial result: true in every
 * thread of the block that arrives last of n_arrivals at counter (which it
 * then resets to zero for the next launch), whose later reads (__ldcg) see
 * every arrived block's partials. One thread fences, after the barrier that
 * orders the block's writes before it (the fence is cumulative), and again on
 * the last block's side. */
static __device__ __forceinline__ bool block_arrives_last(unsigned *counter, unsigned n_arrivals,
                                                          int threads = 0)
{
    __shared__ bool last;
    block_part_sync(threads);
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counter, 1u) == n_arrivals - 1;
        if (last) {
            __threadfence();
            *counter = 0;
        }
    }
    block_part_sync(threads);
    return last;
}

/* Lets kernel use smem bytes of dynamic shared memory (set once per device:
 * *allowed remembers the most set so far) and finds how many of its blocks of
 * `threads` threads fit on an SM (*per_sm, at least 1). */
template <typename Kernel>
static cudaError_t cu_kernel_fit(Kernel kernel, int threads, size_t smem, size_t *allowed,
                                 int *per_sm)
{
    if (smem > *allowed) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess)
            return e;
        *allowed = smem;
    }
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, kernel, threads, smem);
    if (e == cudaSuccess && *per_sm < 1)
        *per_sm = 1;
    return e;
}

/* kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent of
 * the launch before it when pdl (the device's cu_device.pdl). */
template <typename... KArgs, typename... Args>
static cudaError_t cu_launch_dependent(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t s, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
/* Element off of a KV cache (K or V), widened to f32. */
static __device__ __forceinline__ float kv_get(const void *base, size_t off, int f16)
{
    return f16 ? __half2float(((const __half *)base)[off]) : ((const float *)base)[off];
}

/* One warp prepares a q or k head: x (hd floats) into v (shared memory, hd
 * floats), RMSNorm'ed with norm when given, then rotated by RoPE at pos over
 * its first rot_dim dims. Every launch that prepares heads goes through here,
 * so fused and unfused steps compute the same bits. */
static __device__ __forceinline__ void qk_head_prep(const float *x, const float *norm, float eps,
                                                    int hd, int rot_dim, float pos,
                                                    const float *inv_freq, float factor, float *v)
{
    const int lane = threadIdx.x & 31;
    float sum = 0;
    for (int i = lane; i < hd; i += 32) {
        float t = x[i];
        v[i] = t;
        sum += t * t;
    }
    if (norm) {
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        float inv = 1.0f / sqrtf(sum / (float)hd + eps);
        for (int i = lane; i < hd; i += 32)
            v[i] = norm[i] * (v[i] * inv);
    }
    __syncwarp();
    const int half = rot_dim / 2;
    for (int i = lane; i < half; i += 32) {
        /* the angle is rounded to f32 first, as transformers computes it */
        float angle = pos * inv_freq[i];
        float c = cosf(angle) * factor, s = sinf(angle) * factor;
        float lo = v[i], hi = v[i + half];
        v[i] = lo * c - hi * s;
        v[i + half] = hi * c + lo * s;
    }
    __syncwarp();
}

/* Row row's position (into *pos) and the RoPE frequencies it takes, from the launch
 * parameters of a q/k launch a (the long-context ones from long_from on). */
static __device__ __forceinline__ const float *qk_row_freqs(const struct cu_qk_args &a,
                                                            const uint8_t *params, int row,
                                                            float *pos)
{
    *pos = (float)((const int32_t *)(params + a.pos_off))[row];
    return (const float *)(params + a.freq_off) +
           (a.long_from > 0 && *pos >= (float)a.long_from ? a.rot_dim / 2 : 0);
}

/* Stores x as element off of a KV cache, rounded to fp16 when the cache is. */
static __device__ __forceinline__ void kv_put(void *base, size_t off, float x, int f16)
{
    if (f16)
        ((__half *)base)[off] = __float2half_rn(x);
    else
        ((float *)base)[off] = x;
}
#endif

struct cu_graph_entry {
    struct cu_op *ops; /* owned; the op list the graph was captured from */
    int n_ops;
    size_t arena_used;
    cudaGraphExec_t exec;
    uint64_t last_used;
};

#define CU_LT_CACHE 32
#define CU_LT_TUNED_MAX 64

/* A cuBLASLt GEMM shape with its descriptors and chosen algorithm. */
struct cu_lt_plan {
    int64_t n, k, t, ldc;
    bool f32; /* f32 operands (else bf16) */
    bool y_bf16; /* a bf16 product (else f32) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool used;
};

/* The timed winner for a GEMM shape and a power-of-two bucket of rows. */
struct cu_lt_tuned {
    int64_t n, k;
    bool f32, y_bf16;
    int bucket;
    cublasLtMatmulAlgo_t algo;
    bool used;
};

#define CU_UPLOAD_SLOTS 4
#define CU_UPLOAD_SLOT_BYTES ((size_t)32 << 20)

/* BACKEND_PROFILE_GRAPHS: the wall-clock timeline of each sampled step
 * without prefill, from the previous step's tokens on the host to this
 * step's: the engine's work, recording the ops, launching them (a replay is
 * timed, so this includes its GPU time), the host's work before the picks,
 * then sampling. */
struct cu_step_times {
    uint64_t sampled_at, first_op, flush_start, flush_end; /* ns; this step's marks */
    uint64_t queued_ns; /* this step's wait for work queued before its sampling */
    /* this step's timed replay: host time from the flush to the graph's
     * launch (a capture apart), in cudaGraphLaunch, then waiting for the end */
    uint64_t replay_prep_ns, replay_call_ns, replay_wait_ns;
    bool prefill;                                           /* this step prefills */
    double engine_us, record_us, launch_us, picks_us, sample_us; /* sums */
    double sample_queued_us; /* of sample_us: waiting for work queued before the sampling */
    double replay_prep_us, replay_call_us, replay_wait_us; /* of launch_us, summed as above */
    long steps;
};

struct cu_impl {
    struct cu_device dev;
    char describe[160];
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace; /* device; CU_LT_WORKSPACE bytes */
    size_t lt_workspace_bytes;
    /* cuBLASLt plans and tuned algorithms of this device (lt_lock guards both) */
    pthread_mutex_t lt_lock;
    struct cu_lt_plan lt_plans[CU_LT_CACHE];
    int lt_next;
    struct cu_lt_tuned lt_tuned[CU_LT_TUNED_MAX];
    int lt_tuned_next;

    /* The step being recorded: ops not yet launched, and the host arrays they
     * use, staged in pinned memory (rec.arena, owned) and copied to the
     * device in one transfer when the step is launched. */
    struct cu_rec rec;
    uint8_t *arena_dev;   /* device, owned; rec.arena_cap bytes */
    cudaEvent_t arena_free; /* the last arena upload has been read */
    bool arena_pending;

    /* Scratch. */
    uint16_t *xb;         /* device, bf16 activations for cuBLASLt; owned */
    size_t xb_bytes;
    const float *xb_of;   /* the f32 activations the launch just before wrote into xb in bf16
                             (fuse.h rule 6), for the GEMM launch right after it; else NULL */
    int64_t xb_n;         /* how many */
    bool after_qstream;   /* the launch just before ran on the block-quantized stream GEMV
                             (qgemv.cu): a decode attention after it may start early */
    uint16_t *wb;         /* device, a block matrix's rows dequantized to bf16 for cuBLASLt; owned */
    size_t wb_bytes;
    float *attn_part;     /* device, split-attention partials; owned */
    size_t attn_part_bytes;
    bool dense_smem_set;  /* the dense attention kernel may take its largest shared memory */
    void *xq;             /* device, x as int8 blocks for the block GEMVs (cu_gemv_args.xq); owned */
    size_t xq_bytes;
    void *gemm_work;      /* device, the batched tile GEMM's split-K workspace; owned */
    bool wgmma_gemm;      /* the GEMM path's 9-128-row bf16 matmuls on gemm_wgmma.cu */
    void *wgmma_work;     /* device, its split-K workspace (cu_gemm_wgmma_work_bytes); owned */
    size_t wgmma_work_bytes;
    float *norm_sums;     /* device, CU_NORM_SUMS_FLOATS: fuse rule 9's sums of squares; owned */
    size_t lora_work_bytes;
    void *lora_work;      /* device, the adapter launches' u, two slots; owned */
    int lora_slot_op[2];
    long planned_launches; /* backend_cuda_planned_launches */  /* the lora group (its first op) whose u each slot holds, -1: none */
    size_t gemm_work_bytes;

    struct cu_graph_entry graphs[CU_GRAPH_CACHE];
    uint64_t graph_clock;
    /* Digests of the last CU_EAGER_RECENT steps launched eagerly: a step of
     * more than CU_GEMV_MAX_ROWS rows is captured when it repeats one. */
    uint64_t eager_recent[CU_EAGER_RECENT];
    int eager_next;
    bool graphs_enabled;   /* backend_options.cuda_graphs */
    struct cu_fuse_config fuse; /* the mode and backend_options' fusion switches */
    bool prefill_tc;       /* backend_options.cuda_prefill_tc */
    bool qprefill_ws;      /* backend_options.cuda_qprefill_ws */
    bool prefill_wgmma;    /* backend_options.cuda_prefill_wgmma */
    bool qprefill_pair;    /* backend_options.cuda_qprefill_pair */
    bool moe_kernels;      /* backend_options.cuda_moe: the vectorised and grouped MoE kernels */
    bool qgemv_int8;       /* backend_options.cuda_qgemv_dp4a: FAST-mode block GEMVs on int8 x */
    bool qgemv_stream;     /* backend_options.cuda_qgemv_stream: ... in one launch that stages x */

    /* Pinned staging for uploads and downloads. */
    uint8_t *upload_slot[CU_UPLOAD_SLOTS];
    cudaEvent_t upload_done[CU_UPLOAD_SLOTS];
    int upload_next;
    uint64_t uploaded_bytes, upload_reported;
    uint8_t *download;    /* pinned; download_cap bytes */
    size_t download_cap;

    /* BACKEND_PROFILE_OPS: steps run eagerly with an event around each
     * launch, and the time per kind of launch is logged at destroy;
     * BACKEND_PROFILE_GRAPHS: how often graphs were captured and replayed. */
    enum backend_profile profile;
    cudaEvent_t *prof_ev; /* owned; prof_ev_cap events */
    int prof_ev_cap;
    /* per step class: [0] one-row steps, [1] steps of several rows without
     * prefill attention (batched decode, speculative verify), [2] steps with it */
    double prof_ms[3][32];
    long prof_calls[3][32];
    long prof_steps[3];
    long graph_hits, graph_captures, steps_eager;
    /* graphs: the GPU time of each replayed step, between events around it */
    cudaEvent_t replay_ev[2];
    double replay_ms;
    long replays_timed;
    /* host time capturing and instantiating graphs (the graphs profile), and
     * the longest one's: a capture that first launches kernels loads them */
    double capture_ms, longest_capture_ms;
    /* graphs: where a decode step's wall time goes (cu_step_times) */
    struct cu_step_times host;

    /* A quantized KV cache's format (backend.kv_quant points here when set)
     * and its Lloyd–Max books in device memory (owned; NULL without one). */
    struct kv_quant kv_quant;
    struct kvq_codebooks *kvq_books;

    /* The first error an op met; ops become no-ops until status() reports it. */
    struct err error;
    bool failed;
};

/* Error bookkeeping (cuda_backend.cu): cu_fail records the first failure;
 * cu_ok records e when it is one and says whether the call succeeded. */
void cu_fail(struct cu_impl *im, int code, const char *fmt, ...);
bool cu_ok(struct cu_impl *im, cudaError_t e, const char *what);
#define CU_TRY(im, call) cu_ok((im), (call), #call)

/* Launches the recorded step eagerly, never from a graph (cuda_backend.cu):
 * for ops that launch kernels of their own between recorded ones (encdec.cu). */
void cu_flush_eager(struct cu_impl *im);

/* The encoder-decoder ops (encdec.cu), as backend.h specifies them. */
void cu_layer_norm(struct backend *be, const float *x, const float *weight, const float *bias,
                   int64_t n_rows, int64_t dim, float eps, float *y);
void cu_gelu(struct backend *be, float *x, int64_t n);
void cu_conv1d(struct backend *be, const float *x, int64_t n_in, int64_t c_in,
               const struct weight_matrix *w, const float *bias, int kernel, int stride, int pad,
               float *y);
void cu_attention_dense(struct backend *be, const float *q, int64_t n_q, const float *k,
                        const float *v, int64_t n_kv, int64_t kv_stride, int n_heads, int head_dim,
                        float scale, int64_t causal, float *out);
void cu_scatter_rows(struct backend *be, const float *src, int64_t n_rows, int64_t cols,
                     const int32_t *rows, float *dst);
/* Their launchers (the recorded CU_LAYER_NORM, CU_GELU, CU_ATTN_DENSE and
 * CU_SCATTER_ROWS ops); part is the dense attention's split partials
 * (cu_dense_part_floats of them, past the scratch's counters). */
cudaError_t cu_launch_layer_norm(cudaStream_t s, const struct cu_op *op);
cudaError_t cu_launch_gelu(cudaStream_t s, const struct cu_op *op);
cudaError_t cu_launch_attention_dense(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part);
cudaError_t cu_launch_scatter_rows(cudaStream_t s, const struct cu_op *op, const uint8_t *params);
size_t cu_dense_part_floats(const struct cu_op *op);

/* x (n_rows x cols, f32) to bf16 and one cuBLASLt GEMM (+ bias) per matrix
 * of matmul op (cuda_backend.cu); false when it failed (recorded). */
/* x_ready: the launch before wrote op's x in bf16 into im->xb. y_bf16: each product in bf16
 * at the start of its matrix's y (fuse.h rule 10). acc: the products added into acc instead
 * of written to y (one matrix; fuse.h rule 11). */
bool cu_exec_gemm(struct cu_impl *im, const struct cu_op *op, bool x_ready, bool y_bf16,
                  float *acc);
/* im->xb grown to hold n bf16 values (within a flush: no launch of the recorded step). */
bool cu_xb_reserve(struct cu_impl *im, int64_t n);

/* Launches one planned launch of ops (fuse.cu); false when it failed (recorded). */
bool cu_exec_launch(struct cu_impl *im, const struct cu_op *ops, const struct cu_launch *l);

/* Kernel launchers (kernels.cu, gemv.cu, attention.cu). Each enqueues on
 * stream and returns the launch's cudaError_t. */
cudaError_t cu_launch_embed(cudaStream_t s, const struct cu_op *op, const uint8_t *params);
/* ybf (and outbf below): the output also rounded to bf16 there (fuse.h rule 6); NULL: not.
 * bf16_only: only there (x_bf16_only; ybf then required). */
cudaError_t cu_launch_rmsnorm(cudaStream_t s, const struct cu_op *op, uint16_t *ybf,
                              bool bf16_only);
cudaError_t cu_launch_add(cudaStream_t s, const struct cu_op *op);
/* add (y += x) and the RMSNorm after it of every row of y, in one launch (fuse.h rule 4). */
cudaError_t cu_launch_add_rmsnorm(cudaStream_t s, const struct cu_op *add, const struct cu_op *norm,
                                  uint16_t *ybf, bool bf16_only);
/* from_bf16 (fuse.h rule 10): gate and up are bf16 at a and b, and h goes to outbf only. */
cudaError_t cu_launch_silu_mul(cudaStream_t s, const struct cu_op *op, uint16_t *outbf,
                               bool bf16_only, bool from_bf16);
/* CU_GELU_TANH_MUL, CU_SCALE and CU_SOFTCAP ops, one launch each. */
cudaError_t cu_launch_ew_gemma(cudaStream_t s, const struct cu_op *op);
cudaError_t cu_launch_to_bf16(cudaStream_t s, const float *x, int64_t n, uint16_t *out);
cudaError_t cu_launch_bias_add(cudaStream_t s, float *y, const float *bias, int64_t rows,
                               int n_rows);

/* The q/k launch (struct cu_qk_args, fuse.h). */
cudaError_t cu_launch_qk_prep(const struct cu_device *dev, cudaStream_t s,
                              const struct cu_qk_args *a, const uint8_t *params);
/* CU_KV_STORE; a quantized cache's rows go through cu_launch_kv_store_quant. */
cudaError_t cu_launch_kv_store(cudaStream_t s, const struct cu_op *op, const uint8_t *params);
/* Quantize-on-write (attention_quant.cu): a warp per record, in
 * kvq_quantize_head's arithmetic and order, so the bytes are the CPU's. */
cudaError_t cu_launch_kv_store_quant(cudaStream_t s, const struct cu_op *op,
                                     const uint8_t *params);
/* CU_KV_COPY: slots [0, n) of block src to dst in every layer, K and V, bit for bit. */
cudaError_t cu_launch_kv_copy(cudaStream_t s, const struct cu_op *op);

/* GEMV for up to any rows; fused epilogues: residual add (res += y) and the
 * SwiGLU pair (matrices 0 and 1: y0 = silu(y0) * y1). */
struct cu_gemv_args {
    const float *x;
    int64_t cols;
    int dtype, n_mat, n_rows;
    /* a mixed launch (the stream kernel: Q4_K with Q6_K): matrices from
     * m[n_mat1] on are of dtype2; otherwise n_mat1 is 0 and every one is of dtype */
    int dtype2, n_mat1;
    struct cu_mat m[CU_GROUP_MAX];
    float *res;
    bool pair;
    bool round_bf16;
    /* EXACT mode: each output reduced by one warp, chunks in column order
     * (no split-K), so the general kernel sums as the streaming one does and
     * a row's bits do not depend on how many rows the launch has */
    bool row_invariant;
    /* fused RMSNorm of x (n_rows rows of cols) before the product; its result
     * is also written to norm_out, as the unfused op would */
    const float *norm_w;
    float *norm_out;
    float norm_eps;
    /* the skinny GEMM (fuse.h rule 9): with res, each token row's sum of squares of the
     * new res over each tile of 16 outputs into sums_out[t * ceil(rows / 16) + tile], and
     * the new res times xw_w (the norm's weight) into xw_out (the norm's output); with
     * sums_in (over ceil(cols / 16) tiles), each token row's products times its inverse
     * RMS from them (norm_eps) */
    float *sums_out;
    const float *sums_in;
    float *xw_out;
    const float *xw_w;
    /* FAST mode: device workspace (16-byte aligned, xq_bytes) where a block
     * GEMV of Q8_0, Q4_K or Q6_K quantizes x to int8 for its __dp4a kernel
     * when cu_qgemv_int8_bytes fits in it; NULL: the float kernels */
    void *xq;
    size_t xq_bytes;
    /* with xq: Q4_K and Q6_K run on the stream kernel where it takes them,
     * which quantizes x (and folds norm_w) in shared memory itself
     * (cu_qgemv_stream_runs) */
    bool qstream;
    /* the batched tile GEMM's split-K workspace (zeroed once: its counters
     * are back at zero after every launch), work_bytes long */
    void *work;
    size_t work_bytes;
};
cudaError_t cu_launch_gemv(struct cu_device *dev, cudaStream_t s, const struct cu_gemv_args *a);
/* The same product in FAST mode for bf16 weights on tensor cores
 * (gemm_skinny.cu): n_rows and cols as cu_skinny_takes allows, x and every w
 * 16-byte aligned, no folded RMSNorm; x is rounded to bf16. */
cudaError_t cu_launch_gemm_skinny(struct cu_device *dev, cudaStream_t s,
                                  const struct cu_gemv_args *a);
/* The same product for CU_SKINNY_MAX_ROWS < n_rows <= CU_BATCH_MAX_ROWS
 * (gemm_batch.cu), same conditions, with a split-K workspace of
 * cu_gemm_batch_work_bytes in a->work. */
cudaError_t cu_launch_gemm_batch(struct cu_device *dev, cudaStream_t s,
                                 const struct cu_gemv_args *a);
size_t cu_gemm_batch_work_bytes(const struct cu_device *dev, const struct cu_gemv_args *a);

/* Tiles of tile_rows weight rows over n_mat matrices, each matrix's rows in tiles of its
 * own, one matrix after the other (gemm_batch.cu, gemm_wgmma.cu). */
static inline int64_t cu_row_tiles(const struct cu_mat *m, int n_mat, int64_t tile_rows)
{
    int64_t n = 0;
    for (int i = 0; i < n_mat; i++)
        n += (m[i].rows + tile_rows - 1) / tile_rows;
    return n;
}

/* Splits of a split-K launch's tiles (gemm_batch.cu, gemm_wgmma.cu): as many as keep one
 * wave of blocks, a block an SM, within the n_sm SMs, each split at least min_stages of the
 * n_stages stages and none left without any. */
static inline int cu_split_k(int64_t n_tiles, int64_t n_stages, int n_sm, int min_stages)
{
    int64_t s = n_sm / (n_tiles > 0 ? n_tiles : 1);
    if (s > n_stages / min_stages)
        s = n_stages / min_stages;
    if (s <= 1)
        return 1;
    int64_t per = (n_stages + s - 1) / s;
    return (int)((n_stages + per - 1) / per);
}

/* FAST-mode bf16 matmuls of CU_SKINNY_MAX_ROWS + 1 to CU_WGMMA_GEMM_MAX_ROWS token rows
 * on warp-group tensor cores (gemm_wgmma.cu, sm_90a): y (t x rows) = x w^T for up to
 * CU_WGMMA_GEMM_MAX_MATS matrices over one x (t x k bf16), each y in f32 or (y_bf16) bf16,
 * or with acc (one matrix) the products added into acc instead, as the GEMM path's
 * cuBLASLt call leaves them. x and every w 16-byte aligned; work holds
 * cu_gemm_wgmma_work_bytes (zeroed once: the counters are back at zero after every
 * launch). cudaErrorNotSupported where the GPU does not run the sm_90a code. */
#define CU_WGMMA_GEMM_MAX_ROWS 128
#define CU_WGMMA_GEMM_MAX_MATS 3
struct cu_wg_gemm {
    const uint16_t *x;
    int t, k;
    int n_mat;
    struct cu_mat m[CU_WGMMA_GEMM_MAX_MATS]; /* w, rows and y of each (bias unused) */
    bool y_bf16;
    float *acc;
    void *work;
    size_t work_bytes;
};
bool cu_gemm_wgmma_takes(int64_t t, int64_t k);
bool cu_gemm_wgmma_runs(const struct cu_device *dev); /* sm_90a code, the shared memory */
size_t cu_gemm_wgmma_work_bytes(const struct cu_device *dev);
cudaError_t cu_launch_gemm_wgmma(struct cu_device *dev, cudaStream_t s, const struct cu_wg_gemm *g);

/* Mixture of experts (moe.cu): routing per row (backend/moe_route.h's
 * choice, bit for bit: a block a row, or with parallel false the first
 * kernel's one thread a row); the experts by the ids routing left in device
 * memory, and the shared expert's gate. cu_exec_moe_ffn picks the kernels: with
 * moe_kernels, GEMVs with 16-byte loads (a row alone, or the rows grouped by
 * expert from CU_MOE_SHARE_MIN_ROWS rows, the same bits either way) or, in
 * FAST mode from CU_MOE_GEMM_MIN_ROWS bf16 rows, a grouped tensor-core GEMM;
 * otherwise (or for a shape they cannot read) the first kernels, a warp per
 * output reading an element per lane. Every one reduces a row's outputs in an
 * order fixed by the row, and FAST mode rounds x and the hidden activations to
 * bf16 as the GEMVs do. False when a launch failed (recorded). */
cudaError_t cu_launch_moe_route(const struct cu_device *dev, cudaStream_t s,
                                const struct cu_op *op, bool parallel);
/* add: the residual add right after op (fuse rule 8), done by op's last launch (y +=
 * the experts' sum), or NULL; after_routing: the launch right before is the routing
 * whose ids op reads (x, written before it, may be read before waiting for it). */
bool cu_exec_moe_ffn(struct cu_impl *im, const struct cu_op *op, const struct cu_op *add,
                     bool after_routing);
cudaError_t cu_launch_gated_add(cudaStream_t s, const struct cu_op *op);
/* Low-rank adapters (lora.cu): n_ops (at most CU_LORA_MAX_GROUP) lora ops
 * over the same x, fuse rule 5's group, in two launches: the shrink u = A x
 * per (segment, tile of rows, rank index), then the expand y += scale * B u
 * per (op, row, run of outputs), walking the segments in order (stacked
 * adapters add in order). work: device memory for the ops' u (the sum of
 * their u_floats). */
struct cu_lora_job {
    float *y;
    int64_t out;
    int n_segs;
    uint32_t segs_off, u_base, n_items;
    uint32_t item0, expand0; /* the job's first shrink and expand blocks */
};
struct cu_lora_group {
    const float *x;
    int64_t in;
    int n_jobs;
    unsigned n_shrink, n_expand;
    struct cu_lora_job job[CU_LORA_MAX_GROUP];
};
void cu_lora_group_of(const struct cu_op *ops, int n_ops, struct cu_lora_group *g);
cudaError_t cu_launch_lora_shrink(const struct cu_device *dev, cudaStream_t s,
                                  const struct cu_lora_group *g, const uint8_t *params,
                                  void *work);
cudaError_t cu_launch_lora_expand(const struct cu_device *dev, cudaStream_t s,
                                  const struct cu_lora_group *g, const uint8_t *params,
                                  const void *work);
/* Fuse rule 7's row launches (lora_rows.cu): an add-and-RMSNorm, an RMSNorm or a
 * SiLU-mul over n_rows rows, each row a cluster of CU_LORA_ROWS_CLUSTER blocks laid out
 * as lay says, with the expand of the lora jobs in[] folded into its inputs (in[0]
 * into a, in[1] into b; their u in u_in, written back to a and b as the lora ops would)
 * and the shrink of the jobs out[] over its output (into u_out). add-and-RMSNorm: x +=
 * a (a NULL: a plain RMSNorm of x), y = norm(x) w; SiLU-mul: a = silu(a) b, in place
 * (y is a). ybf: y also in bf16 (rule 6) when not NULL. A job's u_base is where its u
 * starts, as cu_lora_group_of lays a group out. */
struct cu_lora_rows_job {
    uint32_t segs_off, u_base;
    int n_segs;
};
struct cu_lora_rows_args {
    struct cu_lora_rows_layout lay;
    int n_rows;
    bool silu;
    float *x, *a, *b, *y;
    const float *w;
    float eps;
    uint16_t *ybf;
    bool has_in[2];
    struct cu_lora_rows_job in[2];
    int n_out;
    struct cu_lora_rows_job out[CU_LORA_MAX_GROUP];
    const float *u_in;
    float *u_out;
    const uint8_t *params;
};
cudaError_t cu_launch_lora_rows(const struct cu_device *dev, cudaStream_t s,
                                const struct cu_lora_rows_args *a);
/* Forgets which lora groups' u the two slots hold: at the start of a step's launches. */
void cu_lora_slots_reset(struct cu_impl *im);
/* Block-quantized weights (qgemv.cu). cu_block_types: the block types the
 * kernels below take (bit 1 << dtype each: Q8_0, Q4_K, Q6_K and the MLX
 * types), what the backend sets as block_types; the loader widens the others
 * to F32. cu_launch_qgemv: the GEMV of cu_gemv_args for such a dtype (no
 * folded RMSNorm; cu_launch_gemv hands it block dtypes), one warp per output
 * row at every row count, its sum fixed by the row alone. The dequantizers
 * write the CPU reference's values: rows x cols of w as bf16 (out, row-major)
 * for cuBLASLt, and embedding rows (CU_EMBED of a block table) as f32. */
extern "C" uint64_t cu_block_types(void);
/* The workspace (cu_gemv_args.xq) the int8 path of a block GEMV needs for
 * n_rows rows of x of cols, or 0 when it does not take dtype or that shape:
 * Q8_0, Q4_K and Q6_K of 1..CU_GEMV_MAX_ROWS rows. That path (FAST mode,
 * cu_gemv_args.row_invariant false) quantizes x to int8 blocks of 32 with an
 * f32 scale in one launch, then multiplies the weights' codes with __dp4a:
 * each output is within sum|w| times half an x block's step of the float
 * kernel's, and still a function of its own row alone. */
extern "C" size_t cu_qgemv_int8_bytes(int dtype, int n_rows, int64_t cols);
/* Whether cu_launch_qgemv runs a on the int8 stream kernel: qstream, FAST
 * mode, Q4_K or Q6_K (cols a multiple of 2048) over 1..CU_GEMV_MAX_ROWS
 * rows, its shared memory within the device's, x, weights and norm_w
 * 16-byte aligned. */
bool cu_qgemv_stream_runs(const struct cu_device *dev, const struct cu_gemv_args *a);
/* Whether it runs a on the int8 path of two launches instead (quantize x,
 * then __dp4a; cu_qgemv_int8_bytes within xq_bytes, FAST mode, x, xq and
 * norm_w 16-byte aligned). Only these two paths take a folded RMSNorm
 * (norm_w): the stream kernel normalises x while it quantizes it, the
 * two-launch path's quantize launch becomes a norm-and-quantize one. */
bool cu_qgemv_int8_runs(const struct cu_device *dev, const struct cu_gemv_args *a);
cudaError_t cu_launch_qgemv(struct cu_device *dev, cudaStream_t s, const struct cu_gemv_args *a);
cudaError_t cu_launch_dequant_bf16(cudaStream_t s, int dtype, const void *w, int64_t rows,
                                   int64_t cols, uint16_t *out);
cudaError_t cu_launch_embed_blocks(cudaStream_t s, const struct cu_op *op, const uint8_t *params);

/* The attention kernels a launch may take (FAST mode and backend_options'
 * switches). */
struct cu_attn_kernels {
    bool tensor_cores; /* prefill in fp16 on tensor cores, else f32 */
    bool decode_tc;    /* decode over a quantized cache on tensor cores as well */
    bool prefill_ws;   /* quantized prefill with decoding warps beside the attending ones */
    bool prefill_wgmma; /* prefill on warp-group tensor cores (sm_90a), either cache */
    bool prefill_pair;  /* that quantized prefill as clusters of two blocks sharing the decoding */
};

cudaError_t cu_launch_attention(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                float *part, int smem_optin, struct cu_attn_kernels kernels);
/* Scratch floats for an attention op (its split partials and counters), a
 * CU_ATTENTION or a CU_ATTN_DENSE one. The scratch starts with
 * CU_ATTN_COUNTERS floats of the decode attention's merge counters (zero
 * between launches), the partials after them. */
size_t cu_attention_part_floats(const struct cu_op *op);
/* The bytes of the f16 window a prefill over a quantized cache attends
 * through (cu_attn.window_blocks; attention_quant.cu), 0 without one. */
size_t cu_qwindow_bytes(const struct cu_op *op);
#define CU_ATTN_COUNTERS 4096
/* Decode attention with the q/k launch before it folded in (q/k norms,
 * RoPE, the new K/V written to the cache): for steps of one token per
 * sequence whose q the attention reads; cu_attention_takes_qk (fuse.h) says
 * whether the pair qualifies. */
cudaError_t cu_launch_attention_qk(cudaStream_t s, const struct cu_op *op,
                                   const struct cu_qk_args *qk, const uint8_t *params, float *part,
                                   bool early);
/* Attention over a quantized cache (attention_quant.cu; cu_launch_attention
 * hands it such ops): split-K flash-decoding or, for prefill, tiles decoded
 * into shared memory (fp16 for tensor cores when kernels.tensor_cores, FAST
 * mode, by warps of their own beside the attending ones when
 * kernels.prefill_ws and the GPU runs sm_90a code; f32 otherwise), both
 * reading the records directly, or with kernels.decode_tc the tensor-core
 * decode kernel where it applies; TURBO rotates the queries once and the
 * output rows back once (a launch of its own). A prefill recorded with
 * window_blocks (and kernels.tensor_cores) decodes its spans' records once
 * into an f16 window in part, after the counters, and runs
 * cu_launch_attention_prefill_f16 over it. */
cudaError_t cu_launch_attention_quant(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part, int smem_optin,
                                      struct cu_attn_kernels kernels);
/* Decode attention over a quantized cache on tensor cores
 * (attention_decode_quant.cu): records decoded to fp16 tiles in shared
 * memory, head dims 64 and 128, affine and TURBO without QJL keys, at most
 * CU_ATTN_MMA_MAX_GROUP query heads per kv head; cudaErrorNotSupported for
 * other ops. The output of a TURBO cache stays in the values' frame. */
cudaError_t cu_launch_attention_decode_quant(cudaStream_t s, const struct cu_op *op,
                                             const uint8_t *params, float *part, int smem_optin);
/* Decode attention over an f16 cache on tensor cores
 * (attention_decode_f16.cu), for the ops cu_attention_uses_mma takes, with
 * the q/k launch qk folded in when not NULL (ops cu_attention_takes_qk
 * takes); cudaErrorNotSupported for others. */
cudaError_t cu_launch_attention_decode_f16(cudaStream_t s, const struct cu_op *op,
                                           const uint8_t *params, float *part, int smem_optin,
                                           const struct cu_qk_args *qk);
/* The merge of a decode attention's split partials (m, l, acc at
 * PART_STRIDE floats a split, after the CU_ATTN_COUNTERS counters in part)
 * into its output, for rows whose positions fall in more than one split;
 * head dims 64 and 128. */
cudaError_t cu_launch_attention_merge(cudaStream_t s, const struct cu_op *op,
                                      const uint8_t *params, float *part);
/* Prefill attention over an f16 cache (attention_prefill.cu): FlashAttention
 * on warp-group tensor cores with producer warps (wgmma) where asked and the
 * GPU runs sm_90a code, else FlashAttention-2 on mma.sync tensor cores;
 * cudaErrorNotSupported for an f32 cache or a head dim other than 64 and 128. */
cudaError_t cu_launch_attention_prefill_f16(cudaStream_t s, const struct cu_op *op,
                                            const uint8_t *params, int smem_optin, bool wgmma);

#endif
