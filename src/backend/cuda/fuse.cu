/* backend/cuda/fuse.cu — the executors of the fusion plan (fuse.h): one planned launch onto the stream. */
#include <string.h>

#include "backend/cuda/cuda_internal.h"

/* The GEMV of matmul op, with the norm (when given) and epilogue l planned. */
static bool exec_gemv(struct cu_impl *im, const struct cu_op *ops, const struct cu_launch *l)
{
    const struct cu_op *op = &ops[l->op + (l->norm ? 1 : 0)];
    struct cu_gemv_args a;
    memset(&a, 0, sizeof a);
    a.x = op->u.mm.x;
    a.cols = op->u.mm.cols;
    a.dtype = op->u.mm.dtype;
    a.n_mat = op->u.mm.n;
    a.n_rows = op->n_rows;
    for (int i = 0; i < op->u.mm.n; i++)
        a.m[i] = op->u.mm.m[i];
    a.round_bf16 = im->fuse.fast;
    a.row_invariant = !im->fuse.fast;
    if (im->fuse.fast && im->qgemv_int8) {
        a.xq = im->xq;
        a.xq_bytes = im->xq_bytes;
    }
    if (l->norm) {
        const struct cu_op *norm = &ops[l->op];
        a.x = norm->u.norm.x;
        a.norm_w = norm->u.norm.w;
        a.norm_out = norm->u.norm.y;
        a.norm_eps = norm->u.norm.eps;
    }
    if (l->residual)
        a.res = op[1].u.ew.out;
    a.pair = l->swiglu;
    if (l->skinny && a.n_rows > CU_SKINNY_MAX_ROWS) {
        a.work = im->gemm_work;
        a.work_bytes = im->gemm_work_bytes;
        return CU_TRY(im, cu_launch_gemm_batch(&im->dev, im->stream, &a));
    }
    if (l->skinny)
        return CU_TRY(im, cu_launch_gemm_skinny(&im->dev, im->stream, &a));
    return CU_TRY(im, cu_launch_gemv(&im->dev, im->stream, &a));
}

bool cu_exec_launch(struct cu_impl *im, const struct cu_op *ops, const struct cu_launch *l)
{
    const struct cu_op *op = &ops[l->op];
    cudaStream_t s = im->stream;
    switch (l->kind) {
    case CU_LAUNCH_QK_ATTENTION:
        return CU_TRY(im, cu_launch_attention_qk(s, &ops[l->op + l->n_ops - 1], &l->qk,
                                                 im->arena_dev, im->attn_part));
    case CU_LAUNCH_QK:
    case CU_LAUNCH_ROPE:
        return CU_TRY(im, cu_launch_qk_prep(&im->dev, s, &l->qk, im->arena_dev));
    case CU_LAUNCH_GEMV:
        return exec_gemv(im, ops, l);
    case CU_LAUNCH_GEMM:
        return cu_exec_gemm(im, op);
    case CU_LAUNCH_EMBED:
        return CU_TRY(im, cu_launch_embed(s, op, im->arena_dev));
    case CU_LAUNCH_RMSNORM:
        return CU_TRY(im, cu_launch_rmsnorm(s, op));
    case CU_LAUNCH_SILU_MUL:
        return CU_TRY(im, cu_launch_silu_mul(s, op));
    case CU_LAUNCH_ADD:
        return CU_TRY(im, cu_launch_add(s, op));
    case CU_LAUNCH_KV_STORE:
        return CU_TRY(im, cu_launch_kv_store(s, op, im->arena_dev));
    case CU_LAUNCH_KV_COPY:
        return CU_TRY(im, cu_launch_kv_copy(s, op));
    case CU_LAUNCH_MOE_ROUTE:
        return CU_TRY(im, cu_launch_moe_route(&im->dev, s, op, im->moe_kernels));
    case CU_LAUNCH_MOE_FFN:
        return cu_exec_moe_ffn(im, op);
    case CU_LAUNCH_GATED_ADD:
        return CU_TRY(im, cu_launch_gated_add(s, op));
    case CU_LAUNCH_LORA:
        return CU_TRY(im, cu_launch_lora(s, op, im->arena_dev));
    case CU_LAUNCH_GELU_TANH_MUL:
    case CU_LAUNCH_SCALE:
    case CU_LAUNCH_SOFTCAP:
        return CU_TRY(im, cu_launch_ew_gemma(s, op));
    case CU_LAUNCH_LAYER_NORM:
        return CU_TRY(im, cu_launch_layer_norm(s, op));
    case CU_LAUNCH_GELU:
        return CU_TRY(im, cu_launch_gelu(s, op));
    case CU_LAUNCH_ATTN_DENSE:
        return CU_TRY(im, cu_launch_attention_dense(
                              s, op, im->arena_dev,
                              im->attn_part ? im->attn_part + CU_ATTN_COUNTERS : NULL));
    case CU_LAUNCH_SCATTER_ROWS:
        return CU_TRY(im, cu_launch_scatter_rows(s, op, im->arena_dev));
    case CU_LAUNCH_ATTENTION:
        if (im->fuse.decode_mma && cu_attention_uses_mma(op))
            return CU_TRY(im, cu_launch_attention_decode_f16(s, op, im->arena_dev, im->attn_part,
                                                             im->dev.smem_optin));
        return CU_TRY(im, cu_launch_attention(s, op, im->arena_dev, im->attn_part,
                                              im->dev.smem_optin,
                                              im->fuse.fast && im->prefill_tc));
    }
    cu_fail(im, INFERD_EINVAL, "unknown planned launch %d", (int)l->kind);
    return false;
}
