/* backend/cuda/fuse.h — which recorded ops the CUDA backend launches together: the fusion planner, plain host code that runs without a GPU.
 *
 * A recorded step (record.h) is cut greedily, from its first op, into
 * launches. At each op the first rule that matches decides:
 *
 *   1. [rmsnorm q heads, rmsnorm k heads,] rope q, rope k [, kv_store]: one
 *      q/k launch (norms in place over the tensors the ropes rotate, both
 *      ropes at the same positions, the store writing the roped k; not a
 *      store into a quantized cache, whose own launch quantizes). When the
 *      decode attention right after reads that q and that cache layer, and
 *      every sequence has one token, the q/k work is folded into the
 *      attention launch (qk_attention; unquantized caches only), the
 *      flash-decoding kernel's or the tensor-core decode kernel's of many
 *      rows (decode_mma); with qk_spans also when sequences have up to
 *      CU_QK_MAX_SPAN tokens (a speculative verify step) over an f16 cache,
 *      on the flash-decoding kernel, each block preparing the K and V of the
 *      span's positions its split holds.
 *   2. rmsnorm, then a GEMV-path bf16 matmul of at most CU_GEMV_MAX_ROWS rows
 *      reading the norm's output (not in place): the GEMV normalises x itself
 *      while staging it (norm_gemv), and takes rule 3's epilogue too; with
 *      qgemv_norm also a FAST Q4_K or Q8_0 one, whose int8 stream kernel or
 *      quantize launch normalises x while it quantizes it (qgemv.cu; where
 *      neither int8 path runs, the executor launches the norm first). Off by
 *      default in EXACT mode: the folded sum of squares is reduced in another
 *      order than the RMSNorm kernel's, so a token's bits would depend on
 *      whether its step had more than CU_GEMV_MAX_ROWS rows.
 *   3. matmul: FAST-mode bf16 matmuls of more than gemv_max_rows rows run on
 *      the tensor-core skinny GEMM up to skinny_max_rows rows, and on the
 *      batched tile GEMM from CU_SKINNY_MAX_ROWS + 1 to batch_max_rows rows
 *      (rows a multiple of 8 long), else go to cuBLASLt alone, as do block-quantized
 *      ones of more than CU_GEMV_MAX_ROWS (dequantized to bf16 first); the
 *      others (EXACT mode's at every row count, each output then reduced by
 *      one warp in column order) run on the GEMV kernels. The GEMV and skinny
 *      launches fold in the op after when it is the residual add of the
 *      matmul's single output (res += y, into another buffer) or the SwiGLU
 *      of its gate/up pair (in place into gate, no biases); with
 *      qgemv_mixed, a FAST Q4_K (Q6_K) GEMV also takes the matmul right
 *      after it when that one reads the same x with Q6_K (Q4_K) weights and
 *      needs no epilogue (Q4_K_M's v after q and k): one launch of the stream
 *      kernel with both types (mixed; where that kernel does not run, the
 *      executor launches the two apart).
 *   4. add (y += x), then an RMSNorm of all of the sum's rows (reading y): one
 *      launch that adds and normalises each row (add_rmsnorm), writing y as
 *      the add would and reading it back in the same thread, so the bits are
 *      the two launches' bits. Not taken when rule 2 folds that RMSNorm into
 *      the GEMV after it. Across layers too: a layer's last add and the next
 *      layer's first norm (or the final norm before the LM head).
 *   5. anything else: one launch per op; except lora ops: one and those
 *      right after it over the same x (up to CU_LORA_MAX_GROUP, each with
 *      its own y) are one launch of shrinks and expands (lora.cu).
 *   6. (a flag on launches of rules 4 and 5) an RMSNorm or a SiLU-mul whose
 *      output is all of the x of the cuBLASLt GEMM right after it also writes
 *      that x rounded to bf16 where the GEMM reads it (gemm_x, to_gemm_x),
 *      and the GEMM skips its own conversion launch: the same rounding, the
 *      same bits. Where no op after the GEMM reads that output before one
 *      overwrites all of it (x_bf16_only: ops of the kinds whose buffers the
 *      planner knows, up to such a write; never past the step's end, which
 *      the host may read), only the bf16 x is written.
 *
 *   7. (lora_rows, FAST mode, off by default) adapters folded into the row launches around
 *      their matmuls (lora_rows.cu): a launch that writes the x of a matmul
 *      (an RMSNorm, with rule 4's add or without; a SiLU-mul not folded into
 *      a GEMV) also does the shrink of the lora group right after that
 *      matmul (lora_out), which then launches only its expand; and the
 *      expand of a lora op whose y the residual add of rule 4 adds (o_proj's,
 *      down_proj's), or of the gate/up pair the SiLU-mul reads, is folded
 *      into that add-and-RMSNorm or SiLU-mul launch (lora_in; the group's
 *      shrink launched first where no launch before did it). Each row is a
 *      cluster of CU_LORA_ROWS_CLUSTER blocks, a slice of the row each,
 *      whose sums meet in distributed shared memory. Taken where every
 *      segment is lora_rows-ready (record.h) and the launch's shared memory
 *      fits (cu_lora_rows_layout_of); u of two groups can be live at once
 *      (one expanded, the next shrunk), so u has two slots.
 *   8. the experts of a MoE layer, then the residual add of their output
 *      (res += y): the experts' last launch adds each row's weighted sum into
 *      res instead of writing y (the add's rounding, the same bits). The
 *      launch notes when the routing whose ids it reads is the launch right
 *      before it (after_routing): its first kernel may then read x before
 *      waiting for that launch to end.
 *
 *   9. (norm_sums, FAST mode) a skinny GEMM of up to CU_SKINNY_MAX_ROWS rows
 *      with rule 3's residual add, then an RMSNorm of every row of that sum,
 *      then a skinny GEMM reading the norm's output: the first launch also
 *      leaves each row's sum of squares per tile of 16 outputs (norm_sums,
 *      into the backend's workspace) and writes the sum times the norm's
 *      weight where the norm writes its output, and the norm is folded into
 *      the second (a GEMV launch with norm set and skinny), which adds a
 *      row's sums in tile order and scales the row's products by its inverse
 *      RMS (the RMSNorm kernel's 1 / sqrt(mean + eps)) in its epilogue. The
 *      norm's output buffer never holds the normalised rows. By default
 *      (norm_sums_spans) only in layers whose decode attention has a span of
 *      several tokens: a speculative verify step's.
 *
 *  10. (gemm_bf16_swiglu, FAST mode) a cuBLASLt GEMM of a gate/up pair (no
 *      biases), then the SiLU-mul of its two products whose output rule 6
 *      writes in bf16 only, where no op after the next GEMM reads gate or up
 *      before they are overwritten: the GEMM writes both products rounded to
 *      bf16, each at the start of its own buffer (y_bf16), and the SiLU-mul
 *      reads them there (from_bf16). Half the bytes out of the GEMM and into
 *      the SiLU-mul; gate and up are rounded to bf16 before the SiLU, as
 *      transformers computes a bf16 model's MLP, not after.
 *  11. (gemm_residual, FAST mode) a cuBLASLt GEMM of one matrix (no bias),
 *      then the residual add of its product (res += y, res apart from x),
 *      where nothing reads y after the add before it is overwritten: the GEMM
 *      adds its products into res itself (cuBLASLt's C and D both res, beta
 *      1) and y is never written; the RMSNorm after the add then reads res
 *      in a launch of its own (rule 4 has no add left to take).
 *
 * Rules 2 and 9 are not taken when a lora op right after the matmul reads
 * the norm's output, which the folded norm never writes.
 *
 * The rules match on kinds, pointers and row counts only, so a model whose
 * ops come in another order loses the fusions it no longer lines up for;
 * tests/unit/test_fusion.c pins the launches each tiny model's step gets. */
#ifndef INFERD_BACKEND_CUDA_FUSE_H
#define INFERD_BACKEND_CUDA_FUSE_H

#include <stdbool.h>

#include "backend/cuda/record.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The q/k launch: optional per-head RMSNorm of q and k, RoPE of both, and
 * (when store) the K/V write into the paged cache. Either of q / k may be
 * absent (n_heads 0). */
struct cu_qk_args {
    float *q, *k;
    const float *v;
    int n_q_heads, n_k_heads, head_dim, rot_dim, n_rows;
    const float *q_norm, *k_norm;
    float eps;
    uint32_t pos_off, freq_off;
    float factor;
    int long_from; /* rope_table.long_from: the frequencies at freq_off + rot_dim / 2 from it on */
    bool store;
    struct cu_kv kv;
    int layer;
    uint32_t spans_off;
    int n_spans;
};

/* Which fusions the planner may make. */
struct cu_fuse_config {
    bool fast;         /* COMPUTE_FAST: large bf16 matmuls go to cuBLASLt */
    bool norm_gemv;    /* rule 2 (the backend leaves it off in EXACT mode unless asked) */
    bool qgemv_norm;   /* rule 2 also before FAST-mode Q4_K and Q8_0 GEMVs on an int8 path: the
                          stream kernel or the quantize launch quantizes the normed x (qgemv.cu) */
    bool qk_attention; /* rule 1's fold into the decode attention */
    bool qk_spans;     /* ... also of spans of several tokens (a verify step's) */
    bool add_norm;     /* rule 4 */
    bool gemm_x;       /* rule 6 */
    bool gemm_bf16_swiglu; /* rule 10 */
    bool gemm_residual;    /* rule 11 */
    bool qgemv_mixed;  /* rule 3's mix of Q4_K and Q6_K matmuls over one x (the stream kernel) */
    bool decode_mma;   /* decode attention that cu_attention_uses_mma takes runs on the
                          tensor-core kernel (rule 1's q/k launch folded in as well), and
                          so does decode over a quantized cache where its kernel applies */
    int gemv_max_rows; /* rule 3: FAST-mode bf16 matmuls of more rows go past the GEMV
                          kernels (1..CU_GEMV_MAX_ROWS) */
    int skinny_max_rows; /* rule 3: ... to the skinny GEMM up to this many rows, cuBLASLt
                            above (0: cuBLASLt for all of them) */
    int batch_max_rows;  /* rule 3: those of more than CU_SKINNY_MAX_ROWS rows to the batched
                            tile GEMM up to this many (at most CU_BATCH_MAX_ROWS; 0: none) */
    bool gemm_f32;     /* rule 3: f32 matmuls of more than CU_GEMV_MAX_ROWS rows go to
                          cuBLASLt's f32 GEMM, in either mode (backend_options.cuda_gemm_f32) */
    bool lora_rows;    /* rule 7 */
    bool norm_sums;    /* rule 9 */
    bool norm_sums_spans; /* ... only in the layers whose decode attention has a span of
                             several tokens (a speculative verify step, a short prompt chunk) */
    int lora_rows_smem; /* rule 7: the shared memory a block may have, bytes */
};

enum cu_launch_kind {
    CU_LAUNCH_EMBED = 1,
    CU_LAUNCH_RMSNORM,
    CU_LAUNCH_ROPE,         /* a rope that rule 1 did not pair: the q/k kernel on one tensor */
    CU_LAUNCH_QK,           /* rule 1 */
    CU_LAUNCH_QK_ATTENTION, /* rule 1, folded into the decode attention */
    CU_LAUNCH_SILU_MUL,
    CU_LAUNCH_ADD,
    CU_LAUNCH_KV_STORE,
    CU_LAUNCH_ATTENTION,
    CU_LAUNCH_GEMV,         /* rules 2 and 3 on the GEMV kernels, or (skinny) rule 3's
                               tensor-core GEMM of a few rows */
    CU_LAUNCH_GEMM,         /* cuBLASLt: x to bf16, then a GEMM (+ bias) per matrix (rule 11:
                               with the add after it) */
    CU_LAUNCH_KV_COPY,      /* backend_ops.kv_copy_slots */
    CU_LAUNCH_MOE_ROUTE,    /* softmax + top-k per row, on the device */
    CU_LAUNCH_MOE_FFN,      /* the chosen experts (kernels of their own, moe.cu) */
    CU_LAUNCH_GATED_ADD,
    CU_LAUNCH_GELU_TANH_MUL, /* Gemma 3's GeGLU (not folded into the GEMV) */
    CU_LAUNCH_SCALE,
    CU_LAUNCH_SOFTCAP,
    CU_LAUNCH_LORA,         /* low-rank adapters: shrink, then expand (lora.cu) */
    CU_LAUNCH_LAYER_NORM,   /* the encoder-decoder ops (encdec.cu) */
    CU_LAUNCH_GELU,
    CU_LAUNCH_ATTN_DENSE,   /* and the merge of its key splits */
    CU_LAUNCH_SCATTER_ROWS,
    CU_LAUNCH_ADD_RMSNORM,  /* rule 4: the add is ops[op], the norm ops[op + 1] */
};

/* One launch of the plan: the ops [op, op + n_ops) it covers. */
struct cu_launch {
    enum cu_launch_kind kind;
    int op, n_ops;
    /* GEMV: the matmul is ops[op + norm] */
    bool norm;     /* the RMSNorm at ops[op] folded in (skinny: from rule 9's sums) */
    bool norm_sums; /* rule 9: the residual sum's rows' sums of squares left for the next */
    bool residual; /* the add after the matmul (MOE_FFN: after the experts; GEMM: rule 11)
                      folded in */
    bool after_routing; /* MOE_FFN: the launch right before is the routing of its ids */
    bool swiglu;   /* the silu_mul after the gate/up pair folded in */
    bool mixed;    /* the matmul after it, of the other stream type over the same x, taken in */
    bool skinny;   /* on a tensor-core GEMM of a few rows (gemm_skinny.cu, or gemm_batch.cu
                      past CU_SKINNY_MAX_ROWS rows), not the GEMV kernels */
    /* RMSNORM, ADD_RMSNORM, SILU_MUL: rule 6, the output also in bf16 for the GEMM after */
    bool to_gemm_x;
    bool x_bf16_only; /* ... and only in bf16: the f32 output is never read */
    bool y_bf16;      /* GEMM: rule 10, the gate/up products in bf16 for the SiLU-mul after */
    bool from_bf16;   /* SILU_MUL: rule 10, gate and up read in bf16 */
    /* rule 7. ADD_RMSNORM, SILU_MUL: the lora ops [op, op + lora_in) expanded into the row
     * op after them (ops[op + lora_in]); LORA: lora_in_shrunk alone, the group's expand
     * only. lora_in_shrunk: an earlier launch did their shrink. RMSNORM, ADD_RMSNORM,
     * SILU_MUL: the lora group [lora_out_op, lora_out_op + lora_out) shrunk over the
     * launch's output. */
    int lora_in, lora_out, lora_out_op;
    bool lora_in_shrunk;
    /* QK, QK_ATTENTION (the attention is the last op covered), ROPE */
    struct cu_qk_args qk;
};

/* The launch starting at ops[i] (i < n) into *out; returns the ops it covers
 * (at least 1), or 0 when ops[i] is of no known kind. */
int cu_fuse_next(const struct cu_fuse_config *cfg, const struct cu_op *ops, int i, int n,
                 struct cu_launch *out);

/* The whole plan of ops[0, n): up to cap launches into out; returns how many
 * launches the step takes (more than cap: only cap were written), or -1 when
 * an op is of no known kind. */
int cu_fuse_plan(const struct cu_fuse_config *cfg, const struct cu_op *ops, int n,
                 struct cu_launch *out, int cap);

/* Rule 7's row launches: each row a cluster of CU_LORA_ROWS_CLUSTER blocks, block r
 * the columns [r slice, (r + 1) slice) of the row (slice a multiple of 8). Its shared
 * memory (byte offsets): the jobs' segment tables, the slice's output (f32), per folded expand the first
 * covering segment's B rows of the slice and its u, per shrunk op the first covering
 * segment's A columns of the slice, then the shrink's partial sums (each block's, of the
 * items the block adds up). */
#define CU_LORA_ROWS_CLUSTER 8
struct cu_lora_rows_layout {
    int64_t dim, slice;
    uint32_t y, b_in[2], u_in[2], a_out[CU_LORA_MAX_GROUP], part, bytes;
    uint32_t segs[2 + CU_LORA_MAX_GROUP]; /* the jobs' segment tables: in[0], in[1], out[] */
    uint32_t items; /* the shrink's items a row may have (part: CU_LORA_ROWS_CLUSTER floats
                       an item, over the cluster's blocks) */
};
/* The layout of a row launch over rows of dim with the lora ops in[0..2) expanded
 * (NULL: none) and out[0..n_out) shrunk; false when dim is not a multiple of 8 or
 * the shared memory passes max_bytes. */
bool cu_lora_rows_layout_of(int64_t dim, const struct cu_op *const in[2], const struct cu_op *out,
                            int n_out, int max_bytes, struct cu_lora_rows_layout *lay);

/* Rule 9's rows: the residual stream's width a skinny GEMM leaves sums of
 * squares for, in tiles of 16, and the workspace they take (floats). */
#define CU_NORM_SUMS_MAX_DIM 32768
#define CU_NORM_SUMS_FLOATS (CU_SKINNY_MAX_ROWS * (CU_NORM_SUMS_MAX_DIM / 16))

/* Whether the skinny GEMM takes n_rows token rows of cols columns. */
bool cu_skinny_takes(int64_t n_rows, int64_t cols);

/* Whether matmul op runs on the batched tile GEMM (rule 3; it then needs
 * cu_gemm_batch_work_bytes of workspace). */
bool cu_fuse_uses_batch_gemm(const struct cu_fuse_config *cfg, const struct cu_op *op);

/* Whether matmul op goes to cuBLASLt (rule 3), whose launches stay out of
 * CUDA graphs. */
bool cu_fuse_uses_gemm(const struct cu_fuse_config *cfg, const struct cu_op *op);

/* Whether the decode attention op can take the q/k launch qk (rule 1's fold). */
bool cu_attention_takes_qk(const struct cu_op *op, const struct cu_qk_args *qk);

#ifdef __cplusplus
}
#endif

#endif
