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
        a.qstream = im->qgemv_stream;
    }
    if (l->norm && l->skinny) { /* rule 9: x is the norm's output buffer, the GEMM before
                                   wrote it unnormalised */
        a.sums_in = im->norm_sums;
        a.norm_eps = ops[l->op].u.norm.eps;
    } else if (l->norm) {
        const struct cu_op *norm = &ops[l->op];
        a.x = norm->u.norm.x;
        a.norm_w = norm->u.norm.w;
        a.norm_out = norm->u.norm.y;
        a.norm_eps = norm->u.norm.eps;
    }
    if (l->residual)
        a.res = op[1].u.ew.out;
    if (l->norm_sums) { /* rule 9: the norm after the add is op[2] */
        const struct cu_op *norm = &op[2];
        a.sums_out = im->norm_sums;
        a.xw_out = norm->u.norm.y;
        a.xw_w = norm->u.norm.w;
    }
    a.pair = l->swiglu;
    if (l->mixed) {
        const struct cu_op *next = &op[1];
        struct cu_gemv_args mixed = a;
        mixed.dtype2 = next->u.mm.dtype;
        mixed.n_mat1 = a.n_mat;
        for (int i = 0; i < next->u.mm.n; i++)
            mixed.m[mixed.n_mat++] = next->u.mm.m[i];
        if (cu_qgemv_stream_runs(&im->dev, &mixed)) {
            im->after_qstream = true;
            return CU_TRY(im, cu_launch_gemv(&im->dev, im->stream, &mixed));
        }
        /* apart: this one (with its norm) as planned alone, then the next one */
        struct cu_launch first = *l;
        first.mixed = false;
        first.n_ops = l->n_ops - 1;
        if (!exec_gemv(im, ops, &first))
            return false;
        struct cu_launch second;
        memset(&second, 0, sizeof second);
        second.kind = CU_LAUNCH_GEMV;
        second.op = (int)(next - ops);
        second.n_ops = 1;
        return exec_gemv(im, ops, &second);
    }
    /* rule 2 on block weights holds only where an int8 path runs; elsewhere
     * the norm is launched on its own first */
    if (l->norm && dtype_is_block((enum dtype)a.dtype) && !cu_qgemv_stream_runs(&im->dev, &a) &&
        !cu_qgemv_int8_runs(&im->dev, &a)) {
        if (!CU_TRY(im, cu_launch_rmsnorm(im->stream, &ops[l->op], NULL, false)))
            return false;
        a.x = op->u.mm.x;
        a.norm_w = NULL;
        a.norm_out = NULL;
    }
    if (l->skinny && a.n_rows > CU_SKINNY_MAX_ROWS) {
        a.work = im->gemm_work;
        a.work_bytes = im->gemm_work_bytes;
        return CU_TRY(im, cu_launch_gemm_batch(&im->dev, im->stream, &a));
    }
    if (l->skinny)
        return CU_TRY(im, cu_launch_gemm_skinny(&im->dev, im->stream, &a));
    im->after_qstream = dtype_is_block((enum dtype)a.dtype) && cu_qgemv_stream_runs(&im->dev, &a);
    return CU_TRY(im, cu_launch_gemv(&im->dev, im->stream, &a));
}

/* Rule 6: where a launch that writes n floats at out leaves them in bf16 for the GEMM launch
 * after it (im->xb); NULL when l feeds none, or xb cannot grow (the GEMM then converts). */
static uint16_t *gemm_x_out(struct cu_impl *im, const struct cu_launch *l, const float *out,
                            int64_t n)
{
    if (!l->to_gemm_x || !cu_xb_reserve(im, n))
        return NULL;
    im->xb_of = out;
    im->xb_n = n;
    return im->xb;
}

/* The adapter groups' u: two slots of the workspace (fuse rule 7 keeps a group's u
 * while it shrinks the next group's), each named by the group's first op. */
void cu_lora_slots_reset(struct cu_impl *im)
{
    im->lora_slot_op[0] = im->lora_slot_op[1] = -1;
}

static float *lora_slot_u(struct cu_impl *im, int slot)
{
    return (float *)im->lora_work + (size_t)slot * im->rec.lora_u_max * CU_LORA_MAX_GROUP;
}

/* The slot group_op's shrink writes: the one holding the older group, never avoid. */
static int lora_slot_claim(struct cu_impl *im, int group_op, int avoid)
{
    int slot = avoid >= 0 ? 1 - avoid : im->lora_slot_op[0] <= im->lora_slot_op[1] ? 0 : 1;
    im->lora_slot_op[slot] = group_op;
    return slot;
}

/* The slot an earlier launch shrank group_op into (-1, recorded: none did). */
static int lora_slot_of(struct cu_impl *im, int group_op)
{
    for (int slot = 0; slot < 2; slot++)
        if (im->lora_slot_op[slot] == group_op)
            return slot;
    cu_fail(im, INFERD_EINVAL, "the lora group at op %d was never shrunk", group_op);
    return -1;
}

/* The shrink of group g (its first op at op) into a slot claimed for it: the slot, or -1
 * (recorded) when the launch failed. */
static int lora_shrink_into_slot(struct cu_impl *im, const struct cu_lora_group *g, int op)
{
    int slot = lora_slot_claim(im, op, -1);
    return CU_TRY(im, cu_launch_lora_shrink(&im->dev, im->stream, g, im->arena_dev,
                                            lora_slot_u(im, slot)))
               ? slot
               : -1;
}

/* An adapter group: its shrink (unless rule 7 did it), then its expand. */
static bool exec_lora(struct cu_impl *im, const struct cu_op *ops, const struct cu_launch *l)
{
    struct cu_lora_group g;
    cu_lora_group_of(&ops[l->op], l->n_ops, &g);
    int slot = l->lora_in_shrunk ? lora_slot_of(im, l->op) : lora_shrink_into_slot(im, &g, l->op);
    return slot >= 0 && CU_TRY(im, cu_launch_lora_expand(&im->dev, im->stream, &g, im->arena_dev,
                                                         lora_slot_u(im, slot)));
}

/* Rule 7's jobs of the lora ops ops[0, n): their segments and where each one's u starts
 * (cu_lora_group_of's layout). */
static void lora_rows_jobs(const struct cu_op *ops, int n, struct cu_lora_rows_job *jobs)
{
    uint32_t u_base = 0;
    for (int j = 0; j < n; j++) {
        jobs[j] = (struct cu_lora_rows_job){.segs_off = ops[j].u.lora.segs_off,
                                            .u_base = u_base,
                                            .n_segs = ops[j].u.lora.n_segs};
        u_base += ops[j].u.lora.u_floats;
    }
}

/* A row launch with rule 7's adapter work: the add-and-RMSNorm, RMSNorm or SiLU-mul at
 * ops[l->op + l->lora_in], the lora ops before it expanded into it (their shrink first
 * where no launch did it), the group l->lora_out_op shrunk over its output. */
static bool exec_lora_rows(struct cu_impl *im, const struct cu_op *ops, const struct cu_launch *l,
                           uint16_t *ybf)
{
    const struct cu_op *row = &ops[l->op + l->lora_in];
    const struct cu_op *out = l->lora_out ? &ops[l->lora_out_op] : NULL;
    struct cu_lora_rows_args a;
    memset(&a, 0, sizeof a);
    int64_t dim;
    if (row->kind == CU_SILU_MUL) {
        a.silu = true;
        a.a = (float *)row->u.ew.a;
        a.b = (float *)row->u.ew.b;
        a.y = row->u.ew.out;
        dim = l->lora_in ? ops[l->op].u.lora.out : out->u.lora.in;
        a.n_rows = (int)(row->u.ew.n / dim);
    } else {
        const struct cu_op *norm = row->kind == CU_ADD ? row + 1 : row;
        if (row->kind == CU_ADD) {
            a.x = row->u.ew.out;
            a.a = (float *)row->u.ew.a;
        } else {
            a.x = (float *)norm->u.norm.x;
        }
        a.w = norm->u.norm.w;
        a.eps = norm->u.norm.eps;
        a.y = norm->u.norm.y;
        dim = norm->u.norm.dim;
        a.n_rows = (int)norm->u.norm.n_rows;
    }
    const struct cu_op *in[2] = {NULL, NULL};
    int in_slot = -1;
    if (l->lora_in) {
        struct cu_lora_rows_job jobs[CU_LORA_MAX_GROUP];
        lora_rows_jobs(&ops[l->op], l->lora_in, jobs);
        for (int j = 0; j < l->lora_in; j++) {
            const struct cu_op *lo = &ops[l->op + j];
            int which = a.silu && lo->u.lora.y == a.b ? 1 : 0;
            in[which] = lo;
            a.has_in[which] = true;
            a.in[which] = jobs[j];
        }
        if (l->lora_in_shrunk) {
            in_slot = lora_slot_of(im, l->op);
        } else {
            struct cu_lora_group g;
            cu_lora_group_of(&ops[l->op], l->lora_in, &g);
            in_slot = lora_shrink_into_slot(im, &g, l->op);
        }
        if (in_slot < 0)
            return false;
        a.u_in = lora_slot_u(im, in_slot);
    }
    if (out) {
        a.n_out = l->lora_out;
        lora_rows_jobs(out, l->lora_out, a.out);
        a.u_out = lora_slot_u(im, lora_slot_claim(im, l->lora_out_op, in_slot));
    }
    if (!cu_lora_rows_layout_of(dim, in, out, l->lora_out, im->fuse.lora_rows_smem, &a.lay)) {
        cu_fail(im, INFERD_EINVAL, "a planned adapter row launch does not fit");
        return false;
    }
    a.ybf = ybf;
    a.params = im->arena_dev;
    return CU_TRY(im, cu_launch_lora_rows(&im->dev, im->stream, &a));
}

bool cu_exec_launch(struct cu_impl *im, const struct cu_op *ops, const struct cu_launch *l)
{
    const struct cu_op *op = &ops[l->op];
    cudaStream_t s = im->stream;
    /* rule 6: what the launch just before left in im->xb is for this launch only */
    const float *xb_of = im->xb_of;
    int64_t xb_n = im->xb_n;
    im->xb_of = NULL;
    /* the attention's early start: see launch_decode_fd (attention.cu) */
    const bool after_qstream = im->after_qstream;
    im->after_qstream = false;
    switch (l->kind) {
    case CU_LAUNCH_QK_ATTENTION: {
        const struct cu_op *attn = &ops[l->op + l->n_ops - 1];
        if (im->fuse.decode_mma && cu_attention_uses_mma(attn))
            return CU_TRY(im, cu_launch_attention_decode_f16(s, attn, im->arena_dev, im->attn_part,
                                                             im->dev.smem_optin, &l->qk));
        return CU_TRY(im, cu_launch_attention_qk(s, attn, &l->qk, im->arena_dev, im->attn_part,
                                                 im->dev.pdl && after_qstream));
    }
    case CU_LAUNCH_QK:
    case CU_LAUNCH_ROPE:
        return CU_TRY(im, cu_launch_qk_prep(&im->dev, s, &l->qk, im->arena_dev));
    case CU_LAUNCH_GEMV:
        return exec_gemv(im, ops, l);
    case CU_LAUNCH_GEMM:
        return cu_exec_gemm(im, op,
                            xb_of && xb_of == op->u.mm.x &&
                                xb_n == (int64_t)op->n_rows * op->u.mm.cols,
                            l->y_bf16, l->residual ? ops[l->op + 1].u.ew.out : NULL);
    case CU_LAUNCH_EMBED:
        return CU_TRY(im, cu_launch_embed(s, op, im->arena_dev));
    case CU_LAUNCH_RMSNORM: {
        uint16_t *ybf =
            gemm_x_out(im, l, op->u.norm.y, (int64_t)op->u.norm.n_rows * op->u.norm.dim);
        if (l->lora_out)
            return exec_lora_rows(im, ops, l, ybf);
        return CU_TRY(im, cu_launch_rmsnorm(s, op, ybf, l->x_bf16_only));
    }
    case CU_LAUNCH_SILU_MUL: {
        const struct cu_op *silu = &ops[l->op + l->lora_in];
        uint16_t *ybf = gemm_x_out(im, l, silu->u.ew.out, silu->u.ew.n);
        if (l->lora_in || l->lora_out)
            return exec_lora_rows(im, ops, l, ybf);
        return CU_TRY(im, cu_launch_silu_mul(s, op, ybf, l->x_bf16_only, l->from_bf16));
    }
    case CU_LAUNCH_ADD:
        return CU_TRY(im, cu_launch_add(s, op));
    case CU_LAUNCH_ADD_RMSNORM: {
        const struct cu_op *add = &ops[l->op + l->lora_in];
        uint16_t *ybf = gemm_x_out(im, l, add[1].u.norm.y,
                                   (int64_t)add[1].u.norm.n_rows * add[1].u.norm.dim);
        if (l->lora_in || l->lora_out)
            return exec_lora_rows(im, ops, l, ybf);
        return CU_TRY(im, cu_launch_add_rmsnorm(s, add, add + 1, ybf, l->x_bf16_only));
    }
    case CU_LAUNCH_KV_STORE:
        return CU_TRY(im, cu_launch_kv_store(s, op, im->arena_dev));
    case CU_LAUNCH_KV_COPY:
        return CU_TRY(im, cu_launch_kv_copy(s, op));
    case CU_LAUNCH_MOE_ROUTE:
        return CU_TRY(im, cu_launch_moe_route(&im->dev, s, op, im->moe_kernels));
    case CU_LAUNCH_MOE_FFN:
        return cu_exec_moe_ffn(im, op, l->residual ? &ops[l->op + 1] : NULL, l->after_routing);
    case CU_LAUNCH_GATED_ADD:
        return CU_TRY(im, cu_launch_gated_add(s, op));
    case CU_LAUNCH_LORA:
        return exec_lora(im, ops, l);
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
    case CU_LAUNCH_ATTENTION: {
        if (im->fuse.decode_mma && cu_attention_uses_mma(op))
            return CU_TRY(im, cu_launch_attention_decode_f16(s, op, im->arena_dev, im->attn_part,
                                                             im->dev.smem_optin, NULL));
        const struct cu_attn_kernels kernels = {.tensor_cores = im->fuse.fast && im->prefill_tc,
                                                .decode_tc = im->fuse.decode_mma,
                                                .prefill_ws = im->qprefill_ws,
                                                .prefill_wgmma = im->prefill_wgmma,
                                                .prefill_pair = im->qprefill_pair};
        return CU_TRY(im, cu_launch_attention(s, op, im->arena_dev, im->attn_part,
                                              im->dev.smem_optin, kernels));
    }
    }
    cu_fail(im, INFERD_EINVAL, "unknown planned launch %d", (int)l->kind);
    return false;
}
