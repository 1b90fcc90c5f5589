/* backend/cuda/record.h — the CUDA backend's step as recorded: one cu_op per backend op; plain C, runs without a GPU.
 *
 * The CUDA backend launches nothing when an op is called: the op is recorded
 * here, with every host array it was given (token ids, positions, block
 * tables, rotary frequencies) copied into the arena, and the whole step is
 * launched when something needs its results. The recorder owns the op list
 * and the arena's bookkeeping; whoever launches the step (the CUDA backend,
 * or a test) supplies the arena memory and the few decisions that need a
 * device through cu_rec_hooks. */
#ifndef INFERD_BACKEND_CUDA_RECORD_H
#define INFERD_BACKEND_CUDA_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

/* Rows (tokens) up to which matmuls run through our GEMV kernels and a step
 * may be replayed from a CUDA graph; above it, cuBLASLt and eager launches. */
#define CU_GEMV_MAX_ROWS 8
/* Rows up to which FAST-mode bf16 matmuls take the GEMV kernels unless
 * --cuda-gemv-rows says otherwise: past 2 rows cuBLASLt is faster on an H200
 * (Llama-3.1-8B decode through the server, 4 streams: 589 against 443 tok/s;
 * 8 streams: 1,166 against 373): the GEMVs stage x in shared memory, which
 * leaves one block per SM at 8 rows of 4,096 and does not fit the 14,336-wide
 * down projection at all. */
#define CU_GEMV_DEFAULT_ROWS 2
/* Rows up to which FAST-mode bf16 matmuls past the GEMV kernels' rows run on
 * the tensor-core skinny GEMM (gemm_skinny.cu) instead of cuBLASLt: on an
 * H200 (Llama-3.1-8B, 512-token prompts) 4 rows decode 610 against 512
 * tok/s, 8 rows 989 against 884; 16 rows, measured before x was loaded a
 * stage ahead, were slower (1,162 against 1,408), their x twice the L2
 * traffic. */
#define CU_SKINNY_MAX_ROWS 8
/* Rows up to which FAST-mode bf16 matmuls of more than CU_SKINNY_MAX_ROWS
 * rows run on the batched tile GEMM (gemm_batch.cu), cuBLASLt above. */
#define CU_BATCH_MAX_ROWS 64
#define CU_GROUP_MAX 4
#define CU_MAX_HEAD_DIM 256
/* decode attention splits per (row, head group) at most (cu_attention_splits
 * picks them): 64 measured ahead of 32 on an H200 after an 8k prompt
 * (Llama-3.1-8B shape 177 -> 190 tok/s, Llama-3.2-1B 663 -> 762) */
#define CU_ATTN_MAX_SPLITS 64
/* Host arrays a step's arena remembers, so one put per layer of the same
 * array (a sequence's block table) is stored once: an open-addressed table
 * kept at most half full. A 64-sequence step puts 64 block tables per layer;
 * with 16 entries they were copied again for every layer. */
#define CU_DEDUP_SLOTS 1024
/* The MoE GEMVs keep a row's expert order in shared memory: top_k up to this. */
#define CU_MOE_MAX_TOP_K 32
/* Dense attention (Whisper): steps of at most CU_DENSE_SPLIT_MAX_Q queries
 * split their keys into kv_bucket / CU_DENSE_SPLIT_KEYS parts (at most
 * CU_DENSE_MAX_SPLITS) merged by a second launch; one query over the
 * encoder's 1,500 keys is otherwise a single block per head walking them
 * all. */
#define CU_DENSE_SPLIT_MAX_Q 8
#define CU_DENSE_MIN_BUCKET 256
#define CU_DENSE_SPLIT_KEYS 128
#define CU_DENSE_MAX_SPLITS 32

enum cu_op_kind {
    CU_EMBED = 1,
    CU_MATMUL,
    CU_RMSNORM,
    CU_ROPE,
    CU_SILU_MUL,
    CU_ADD,
    CU_KV_STORE,
    CU_ATTENTION,
    CU_KV_COPY,
    CU_MOE_ROUTE,
    CU_MOE_FFN,
    CU_GATED_ADD,
    CU_GELU_TANH_MUL,
    CU_SCALE,
    CU_SOFTCAP,
    CU_LORA,
    /* the encoder-decoder ops (Whisper; encdec.cu) */
    CU_LAYER_NORM,
    CU_GELU,
    CU_ATTN_DENSE,
    CU_SCATTER_ROWS,
};

struct cu_mat {
    const void *w;
    int64_t rows;
    const float *bias;
    float *y;
};

/* one row an item: on an H200 a warp per row ran 1 adapter over 16 rows at 71.6% of no
 * adapter, eight rows a warp at 47.3% (too few warps for the loads in flight) */
#define CU_LORA_TILE_ROWS 1
#define CU_LORA_MAX_GROUP 4 /* lora ops over one x that fuse rule 5 launches together */

/* One segment of a lora op as the kernels read it from the parameter arena:
 * rows [row0, row0 + n_rows) take a (rank x in) and b (out x rank, rows
 * b_stride apart), f32 or (bf16 != 0) bf16; their u = A x sit u_off floats
 * into the op's u (n_rows x rank). The op's shrink work items from item0 on
 * are this segment's: one per tile of CU_LORA_TILE_ROWS rows and rank index. */
struct cu_lora_seg {
    const void *a, *b;
    int row0, n_rows, rank, b_stride;
    float scale;
    uint32_t u_off, item0;
    int32_t bf16;
};

/* A span as the kernels read it from the parameter arena. */
struct cu_span {
    int row0, n_tokens, pos0, n_blocks;
    uint32_t bt_off; /* byte offset of its block ids in the arena */
    int pad[3];
};

/* The geometry of a kv_cache, by value. Elements are __half when f16, else
 * float (exact mode); every kernel that reads or writes the cache takes both.
 * A quantized cache (quant set, backend/kv_quant.h) holds records instead:
 * rows of k_row_bytes (v_row_bytes) per slot and layer, each n_kv_heads
 * records of the op's layer format fmt, with the rotation's seed and the
 * Lloyd–Max books (device memory, the backend's). */
/* The f16 window of a prefill over a quantized cache (cu_attn.window_blocks,
 * attention_quant.cu) holds at most this many bytes of K and V; a step past
 * it reads the records directly. */
#define CU_QWINDOW_MAX_BYTES ((size_t)256 << 20)

struct cu_kv {
    void *k, *v;
    int n_blocks, block_size, n_kv_heads, head_dim;
    int f16;
    int quant;
    struct kv_quant_layer fmt; /* the op's layer; zero for ops of every layer */
    uint8_t pad_[3];
    uint32_t k_row_bytes, v_row_bytes; /* 0 unless quant */
    uint64_t seed;
    const struct kvq_codebooks *cb; /* device; NULL unless quant */
};

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
            const float *b; /* layer_norm's bias (NULL: none); rmsnorm has none */
        } norm;
        struct {
            float *x;
            int n_heads, head_dim, rot_dim;
            uint32_t pos_off, freq_off;
            float factor;
            int long_from; /* rope_table.long_from */
        } rope;
        struct {
            const float *a, *b;
            float *out;
            int64_t n;
            float s; /* scale's factor, softcap's cap */
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
            int row_invariant; /* recorded with cu_rec.row_invariant: never the prefill kernels */
            int narrow;        /* cu_attention_narrow when recorded */
            /* a prefill over a quantized cache through an f16 window: its
             * spans' blocks (cu_qwindow_blocks), else 0 */
            int window_blocks;
            float scale;
            const float *q;
            float *out;
            uint32_t spans_off;
        } attn;
        struct {
            struct cu_kv kv;
            int n_layers, n; /* slots [0, n) */
            uint32_t src, dst;
        } copy;
        struct {
            const float *logits;
            int n_experts, top_k, norm;
            int32_t *ids;
            float *weights;
        } route;
        struct {
            const float *x;
            int64_t hidden, inter;
            int n_experts, top_k, dtype;
            uint32_t mats_off; /* gate, up, down pointers: 3 x n_experts in the arena */
            /* the vectorised kernels can read it: bf16 or f32, hidden and inter
             * multiples of 8, every matrix and x, y, scratch 16-byte aligned,
             * top_k <= CU_MOE_MAX_TOP_K */
            int vec;
            const int32_t *ids;
            const float *weights;
            float *scratch, *y;
        } moe;
        struct {
            float *y;
            const float *x, *g;
            int64_t dim;
        } gated;
        struct {
            const float *x;
            float *y;
            int64_t in, out;
            int n_segs;
            uint32_t n_items;  /* shrink work items (the launch's grid) */
            uint32_t u_floats; /* the segments' u: the sum of n_rows x rank */
            uint32_t segs_off; /* n_segs cu_lora_seg in the arena */
            int rank_max;      /* the largest segment rank */
            int rank_sum;      /* the segments' ranks added up: a row's u at most */
            /* every segment bf16 with a rank and a B row stride that are multiples of 8
             * and 16-byte aligned matrices: what lora_rows.cu's kernels read (fuse rule 7) */
            int rows_ok;
        } lora;
        struct {
            const float *q, *k, *v;
            float *out;
            int64_t kv_stride;
            int n_heads, head_dim;
            /* keys per split are derived on the device from the arena's n_kv; the
             * split count follows kv_bucket (the power of two at or above n_kv, at
             * least CU_DENSE_MIN_BUCKET) so every decode step of a window that
             * stays in one bucket is the same op */
            int kv_bucket, n_splits;
            float scale;
            uint32_t len_off; /* in the arena: int64_t n_kv, causal (attention_dense's) */
        } dense;
        struct {
            const float *src;
            float *dst;
            int64_t cols;
            uint32_t idx_off; /* in the arena: n_rows int32 destination rows */
        } scatter;
    } u;
};

struct cu_dedup {
    const void *key;
    size_t bytes;
    uint32_t off;
};

struct cu_rec;

/* What recording asks of whoever launches the step. */
struct cu_rec_hooks {
    /* False once an op has failed: recording stops until the failure is reported. */
    bool (*ok)(struct cu_rec *rec);
    /* Records the first failure (-INFERD_E* code, message). */
    void (*fail)(struct cu_rec *rec, int code, const char *msg);
    /* Makes room for bytes more arena bytes (rec->arena_used + bytes <=
     * rec->arena_cap); may launch the ops recorded so far first, which empties
     * the list and the arena, and may move the arena. False when it failed. */
    bool (*arena_room)(struct cu_rec *rec, size_t bytes);
    /* Makes the split-attention scratch large enough for attention op probe
     * (not yet recorded); may launch the ops recorded so far first. A prefill
     * window (cu_attn.window_blocks) the GPU's free memory cannot hold is
     * taken away (set to 0: the op reads the records directly). */
    bool (*attn_scratch)(struct cu_rec *rec, struct cu_op *probe);
};

/* The step being recorded. */
struct cu_rec {
    const struct cu_rec_hooks *hooks;
    int n_sm;              /* the device's multiprocessors: attention split counts */
    /* EXACT mode: every attention op runs on the decode kernels with one
     * split, whatever the rows and context of the step, so each query row is
     * reduced in an order fixed by its own position (batch invariance) */
    bool row_invariant;
    /* FAST mode's prefill over a quantized cache through an f16 window
     * (cu_attn.window_blocks) where the op qualifies */
    bool qprefill_window;
    struct cu_op *ops;     /* owned; n_ops recorded, not yet launched */
    int n_ops, cap_ops;
    uint8_t *arena;        /* the launcher's (pinned memory on a GPU); arena_cap bytes */
    size_t arena_cap, arena_used;
    struct cu_dedup dedup[CU_DEDUP_SLOTS]; /* host arrays put in the arena this step, by key */
    int n_dedup;                           /* slots used */
    uint8_t *blob;         /* owned; scratch for building span blobs */
    size_t blob_cap;
    /* quantized caches: the Lloyd–Max books in device memory (the launcher's) */
    const struct kvq_codebooks *kvq_books;
    uint32_t lora_u_max;   /* the largest u_floats of this step's lora ops (0: none) */
};

/* Frees what rec owns (not the arena). */
void cu_rec_free(struct cu_rec *rec);

/* Forgets the recorded ops and the arena's contents, once they are launched. */
void cu_rec_clear(struct cu_rec *rec);

/* The backend ops, recorded. Same arguments and meaning as backend_ops. */
void cu_rec_embed(struct cu_rec *rec, const struct weight_matrix *table, const int32_t *tokens,
                  int64_t n_tokens, float *out);
void cu_rec_matmul_group(struct cu_rec *rec, const float *x, int64_t n_tokens, int n,
                         const struct weight_matrix *const *w, const float *const *bias,
                         float *const *y);
void cu_rec_rmsnorm(struct cu_rec *rec, const float *x, const float *weight, int64_t n_rows,
                    int64_t dim, float eps, float *y);
void cu_rec_rope(struct cu_rec *rec, float *x, int64_t n_tokens, int n_heads, int head_dim,
                 const int32_t *positions, const struct rope_table *rope);
void cu_rec_silu_mul(struct cu_rec *rec, const float *gate, const float *up, float *out,
                     int64_t n);
void cu_rec_add(struct cu_rec *rec, float *y, const float *x, int64_t n);
void cu_rec_gelu_tanh_mul(struct cu_rec *rec, const float *gate, const float *up, float *out,
                          int64_t n);
void cu_rec_scale(struct cu_rec *rec, float *x, int64_t n, float s);
void cu_rec_softcap(struct cu_rec *rec, float *x, int64_t n, float cap);
void cu_rec_kv_store(struct cu_rec *rec, struct kv_cache *kv, int layer, const float *k,
                     const float *v, const struct attn_span *spans, int n_spans);
void cu_rec_attention(struct cu_rec *rec, const float *q, const struct kv_cache *kv, int layer,
                      const struct attn_span *spans, int n_spans, int n_heads, float scale,
                      int sliding_window, float *out);

/* The encoder-decoder ops (backend.h's layer_norm, gelu, attention_dense,
 * scatter_rows). attention_dense puts n_kv and causal in the arena (not in
 * the op), so decode steps at every position of a bucket replay one graph. */
void cu_rec_layer_norm(struct cu_rec *rec, const float *x, const float *weight, const float *bias,
                       int64_t n_rows, int64_t dim, float eps, float *y);
void cu_rec_gelu(struct cu_rec *rec, float *x, int64_t n);
void cu_rec_attention_dense(struct cu_rec *rec, const float *q, int64_t n_q, const float *k,
                            const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                            int head_dim, float scale, int64_t causal, float *out);
void cu_rec_scatter_rows(struct cu_rec *rec, const float *src, int64_t n_rows, int64_t cols,
                         const int32_t *rows, float *dst);

void cu_rec_kv_copy_slots(struct cu_rec *rec, const struct kv_cache *kv, uint32_t src,
                          uint32_t dst, int n);
void cu_rec_moe_route(struct cu_rec *rec, const float *logits, int64_t n_rows, int n_experts,
                      int top_k, bool norm, int32_t *ids, float *weights);
void cu_rec_moe_ffn(struct cu_rec *rec, const float *x, int64_t n_rows,
                    const struct moe_experts *ex, const int32_t *ids, const float *weights,
                    int top_k, float *scratch, float *y);
void cu_rec_gated_add(struct cu_rec *rec, float *y, const float *x, const float *g,
                      int64_t n_rows, int64_t dim);
void cu_rec_lora(struct cu_rec *rec, const float *x, int64_t in, int64_t out,
                 const struct lora_seg *segs, int n_segs, float *y);

/* Splits of decode attention op (its n_splits, given its other fields): for
 * the narrow kernel, a tile of positions a split as long as the blocks fit
 * two an SM; otherwise splits of a length that grows with the context, for
 * a quantized cache attention_quant.cu's. */
int cu_attention_splits(const struct cu_op *op, int n_sm);
/* Positions a tile of the narrow flash-decoding kernel takes: what its eight
 * warps cover in one pass of the scores (a position every HD/16 lanes), at
 * least 32 (the softmax's warp). */
#define CU_ATTN_NARROW_TILE(hd) (4096 / (hd) > 32 ? 4096 / (hd) : 32)
/* True when decode attention op runs narrow (attention.cu): a block per query
 * head instead of per kv head's group, in tiles of CU_ATTN_NARROW_TILE
 * positions, so that a short context is spread over many blocks of a short
 * dependent chain each. Steps of at most CU_GEMV_MAX_ROWS rows over an
 * unquantized cache, head dims 64, 128 and 256, context buckets up to
 * CU_ATTN_NARROW_MAX_CTX. Never in a row-invariant step: the choice follows
 * the step's longest context. */
bool cu_attention_narrow(const struct cu_op *op);
/* The longest context bucket decode attention runs narrow at. A query head a
 * block reads its group's K and V once a head: past a few hundred positions
 * that traffic outweighs the shorter chain. On an H200, narrow against wide
 * (tg128, one sequence): +9% Llama-3.1-8B Q4_K_M, +4% bf16, +7% Llama-3.2-1B,
 * +6% Qwen3-0.6B after 16-token prompts; +7%, +3%, +4% after 384 (bucket
 * 512); -6% on the 8B and 1B after 1,024 (bucket 2,048); -36% on the 8B
 * after 8k. */
#define CU_ATTN_NARROW_MAX_CTX 512
/* The most new positions a row's span may have for the q/k work to fold into
 * the decode attention (fuse.h rule 1): a speculative verify span of the
 * pending token and up to CU_QK_MAX_SPAN - 1 drafts. */
#define CU_QK_MAX_SPAN CU_GEMV_MAX_ROWS
/* True when attention op runs on the prefill kernels (a span of more than
 * CU_GEMV_MAX_ROWS tokens, outside EXACT mode), false for the decode ones. */
bool cu_attention_uses_prefill(const struct cu_op *op);
/* Decode attention of at least CU_ATTN_MMA_MIN_ROWS rows over an f16 cache,
 * head dim 64 or 128, at most CU_ATTN_MMA_MAX_GROUP query heads per kv head,
 * outside EXACT mode: what the tensor-core decode kernel takes
 * (attention_decode_f16.cu; the backend uses it in FAST mode unless
 * backend_options.cuda_decode_tc is off). */
#define CU_ATTN_MMA_MIN_ROWS (CU_GEMV_MAX_ROWS + 1)
#define CU_ATTN_MMA_MAX_GROUP 16
bool cu_attention_uses_mma(const struct cu_op *op);

#ifdef __cplusplus
}
#endif

#endif
