/* backend/cuda/cuda_internal.h — the CUDA backend's private state: recorded ops, the parameter arena, kernel launchers. */
#ifndef INFERD_BACKEND_CUDA_INTERNAL_H
#define INFERD_BACKEND_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
}

/* Rows (tokens) up to which matmuls run through our GEMV kernels and a step
 * may be replayed from a CUDA graph; above it, cuBLASLt and eager launches. */
#define CU_GEMV_MAX_ROWS 8
#define CU_GROUP_MAX 4
#define CU_GRAPH_CACHE 4
#define CU_MAX_HEAD_DIM 256
/* decode attention splits per (row, head group) at most (cu_attention_splits
 * picks them): 64 measured ahead of 32 on an H200 after an 8k prompt
 * (Llama-3.1-8B shape 177 -> 190 tok/s, Llama-3.2-1B 663 -> 762) */
#define CU_ATTN_MAX_SPLITS 64

enum cu_op_kind {
    CU_EMBED = 1,
    CU_MATMUL,
    CU_RMSNORM,
    CU_ROPE,
    CU_SILU_MUL,
    CU_ADD,
    CU_KV_STORE,
    CU_ATTENTION,
};

struct cu_mat {
    const void *w;
    int64_t rows;
    const float *bias;
    float *y;
};

/* A span as the kernels read it from the parameter arena. */
struct cu_span {
    int row0, n_tokens, pos0, n_blocks;
    uint32_t bt_off; /* byte offset of its block ids in the arena */
    int pad[3];
};

/* The geometry of a kv_cache, by value. Elements are __half when f16, else
 * float (exact mode); every kernel that reads or writes the cache takes both. */
struct cu_kv {
    void *k, *v;
    int n_blocks, block_size, n_kv_heads, head_dim;
    int f16;
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

/* Whether this device takes programmatic dependent launches (asked once). */
bool cu_pdl_supported(void);

/* kernel<<<grid, block, smem, s>>>(args...) as a programmatic dependent of
 * the launch before it, where the device supports that. */
template <typename... KArgs, typename... Args>
static cudaError_t cu_launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block,
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
    cfg.numAttrs = cu_pdl_supported() ? 1 : 0;
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

/* Stores x as element off of a KV cache, rounded to fp16 when the cache is. */
static __device__ __forceinline__ void kv_put(void *base, size_t off, float x, int f16)
{
    if (f16)
        ((__half *)base)[off] = __float2half_rn(x);
    else
        ((float *)base)[off] = x;
}
#endif

/* One backend op as called, with every host array it was given already
 * copied into the parameter arena (offsets). Two steps whose op lists are
 * byte-for-byte equal launch the same kernels with the same arguments, which
 * is what lets a step be replayed from a captured CUDA graph. Zero-filled
 * before use so padding compares equal. */
struct cu_op {
    int kind;
    int n_rows;
    union {
        struct {
            const void *table;
            int64_t cols;
            int dtype;
            uint32_t tok_off;
            float *out;
        } embed;
        struct {
            const float *x;
            int64_t cols;
            int dtype, n;
            struct cu_mat m[CU_GROUP_MAX];
        } mm;
        struct {
            const float *x, *w;
            int64_t n_rows, dim;
            float eps;
            float *y;
        } norm;
        struct {
            float *x;
            int n_heads, head_dim, rot_dim;
            uint32_t pos_off, freq_off;
            float factor;
        } rope;
        struct {
            const float *a, *b;
            float *out;
            int64_t n;
        } ew;
        struct {
            struct cu_kv kv;
            int layer, n_spans;
            const float *k, *v;
            uint32_t spans_off; /* n_spans cu_span, then n_rows ints: row -> span */
        } store;
        struct {
            struct cu_kv kv;
            int layer, n_spans, n_heads, window;
            int max_span_tokens, ctx_bucket, n_splits;
            float scale;
            const float *q;
            float *out;
            uint32_t spans_off;
        } attn;
    } u;
};

struct cu_graph_entry {
    struct cu_op *ops; /* owned; the op list the graph was captured from */
    int n_ops;
    size_t arena_used;
    cudaGraphExec_t exec;
    uint64_t last_used;
};

struct cu_dedup {
    const void *key;
    size_t bytes;
    uint32_t off;
};

#define CU_DEDUP_MAX 16
#define CU_UPLOAD_SLOTS 4
#define CU_UPLOAD_SLOT_BYTES ((size_t)32 << 20)

struct cu_impl {
    int device;
    int n_sm;
    char describe[160];
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace; /* device; CU_LT_WORKSPACE bytes */
    size_t lt_workspace_bytes;

    /* The step being recorded: ops not yet launched. */
    struct cu_op *ops; /* owned */
    int n_ops, cap_ops;

    /* Host arrays the recorded ops use, staged in pinned memory and copied
     * to the device in one transfer when the step is launched. */
    uint8_t *arena_host;  /* pinned, owned */
    uint8_t *arena_dev;   /* device, owned */
    size_t arena_cap, arena_used;
    cudaEvent_t arena_free; /* the last arena upload has been read */
    bool arena_pending;
    struct cu_dedup dedup[CU_DEDUP_MAX];
    int n_dedup;
    uint8_t *blob;        /* host scratch for building span blobs; owned */
    size_t blob_cap;

    /* Scratch. */
    uint16_t *xb;         /* device, bf16 activations for cuBLASLt; owned */
    size_t xb_bytes;
    float *attn_part;     /* device, split-attention partials; owned */
    size_t attn_part_bytes;

    struct cu_graph_entry graphs[CU_GRAPH_CACHE];
    uint64_t graph_clock;
    bool graphs_enabled;
    /* RMSNorm folded into the decode GEMV after it (INFERD_CUDA_NORM_FUSION=0: off) */
    bool fuse_norm;
    bool prefill_tc; /* fast-mode prefill attention on tensor cores (INFERD_CUDA_PREFILL_TC=0: off) */
    /* the q/k launch folded into decode attention (INFERD_CUDA_QK_ATTN=0: off) */
    bool fuse_qk_attn;

    /* Pinned staging for uploads and downloads. */
    uint8_t *upload_slot[CU_UPLOAD_SLOTS];
    cudaEvent_t upload_done[CU_UPLOAD_SLOTS];
    int upload_next;
    uint64_t uploaded_bytes, upload_reported;
    uint8_t *download;    /* pinned; download_cap bytes */
    size_t download_cap;

    /* INFERD_CUDA_PROFILE=ops: steps run eagerly with an event around each
     * launch, and the time per kind of launch is logged at destroy;
     * =graphs: only how often graphs were captured and replayed. */
    int profile; /* 0 off, 1 graphs, 2 ops */
    cudaEvent_t *prof_ev; /* owned; prof_ev_cap events */
    int prof_ev_cap;
    double prof_ms[24];
    long prof_calls[24];
    long graph_hits, graph_captures, steps_eager;
    /* =graphs: the GPU time of each replayed step, between events around it */
    cudaEvent_t replay_ev[2];
    double replay_ms;
    long replays_timed;
    /* =graphs: host time per sampled step - from the previous step's tokens
     * to this step's flush (the engine, recording), the flush, the sampling */
    uint64_t sampled_at_ns;
    double host_engine_us, host_flush_us, host_sample_us;
    long host_steps;

    /* The first error an op met; ops become no-ops until status() reports it. */
    struct err error;
    bool failed;
    int smem_optin;
};

/* Kernel launchers (kernels.cu, gemv.cu, attention.cu). Each enqueues on
 * stream and returns the launch's cudaError_t. */
cudaError_t cu_launch_embed(cudaStream_t s, const struct cu_op *op, const uint8_t *params);
cudaError_t cu_launch_rmsnorm(cudaStream_t s, const struct cu_op *op);
cudaError_t cu_launch_add(cudaStream_t s, const struct cu_op *op);
cudaError_t cu_launch_silu_mul(cudaStream_t s, const struct cu_op *op);
cudaError_t cu_launch_to_bf16(cudaStream_t s, const float *x, int64_t n, uint16_t *out);
cudaError_t cu_launch_bias_add(cudaStream_t s, float *y, const float *bias, int64_t rows,
                               int n_rows);

/* q/k head post-processing, fused: optional per-head RMSNorm of q and k,
 * RoPE of both, and (when store) the K/V write into the paged cache. Any of
 * q / k may be absent (n_heads 0). */
struct cu_qk_args {
    float *q, *k;
    const float *v;
    int n_q_heads, n_k_heads, head_dim, rot_dim, n_rows;
    const float *q_norm, *k_norm;
    float eps;
    uint32_t pos_off, freq_off;
    float factor;
    bool store;
    struct cu_kv kv;
    int layer;
    uint32_t spans_off;
    int n_spans;
};
cudaError_t cu_launch_qk_prep(cudaStream_t s, const struct cu_qk_args *a, const uint8_t *params);
cudaError_t cu_launch_kv_store(cudaStream_t s, const struct cu_op *op, const uint8_t *params);

/* GEMV for up to any rows; fused epilogues: residual add (res += y) and the
 * SwiGLU pair (matrices 0 and 1: y0 = silu(y0) * y1). */
struct cu_gemv_args {
    const float *x;
    int64_t cols;
    int dtype, n_mat, n_rows;
    struct cu_mat m[CU_GROUP_MAX];
    float *res;
    bool pair;
    bool round_bf16;
    /* fused RMSNorm of x (n_rows rows of cols) before the product; its result
     * is also written to norm_out, as the unfused op would */
    const float *norm_w;
    float *norm_out;
    float norm_eps;
};
cudaError_t cu_launch_gemv(cudaStream_t s, const struct cu_gemv_args *a, int n_sm);

/* tensor_cores: prefill in fp16 on tensor cores (fast mode), else f32. */
cudaError_t cu_launch_attention(cudaStream_t s, const struct cu_op *op, const uint8_t *params,
                                float *part, int smem_optin, bool tensor_cores);
/* Splits and scratch floats for an attention op with these dimensions. */
int cu_attention_splits(int n_kv_heads, int n_rows, int ctx_bucket, int n_sm);
size_t cu_attention_part_floats(const struct cu_op *op);
bool cu_attention_uses_prefill(const struct cu_op *op);
/* Decode attention with the q/k launch before it folded in (q/k norms,
 * RoPE, the new K/V written to the cache): for steps of one token per
 * sequence whose q the attention reads; cu_attention_takes_qk says whether
 * the pair qualifies. */
bool cu_attention_takes_qk(const struct cu_op *op, const struct cu_qk_args *qk);
cudaError_t cu_launch_attention_qk(cudaStream_t s, const struct cu_op *op,
                                   const struct cu_qk_args *qk, const uint8_t *params, float *part);
/* Prefill attention over an f16 cache (attention_prefill.cu): FlashAttention-2
 * on mma.sync tensor cores; cudaErrorNotSupported for an f32 cache or a
 * head dim other than 64 and 128. */
cudaError_t cu_launch_attention_prefill_f16(cudaStream_t s, const struct cu_op *op,
                                            const uint8_t *params, int smem_optin);

#endif
