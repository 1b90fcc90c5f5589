/* model/arch/qwen3_moe.c — the Qwen3-MoE layer: Qwen3's attention, then a router choosing top-k experts of many (or, in the layers the config keeps dense, a plain SwiGLU MLP).
 *
 * Tensors as Hugging Face checkpoints hold them: the router mlp.gate.weight
 * (num_experts x hidden) and one SwiGLU MLP per expert,
 * mlp.experts.E.{gate,up,down}_proj.weight (moe_intermediate_size). A config
 * with shared_expert_intermediate_size (Qwen2-MoE's layout) adds
 * mlp.shared_expert.{gate,up,down}_proj.weight, which every token runs,
 * scaled by sigmoid(mlp.shared_expert_gate.weight · x). */
#include <stdio.h>
#include <stdlib.h>

#include "model/arch.h"

#define NAME_CAP 160

static int load_experts(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    const struct model_config *c = &m->config;
    int64_t hidden = c->hidden_size, inter = c->moe_intermediate_size;
    struct moe_experts *ex = &L->experts;
    char n[NAME_CAP];
    int rc;
    if (!m->backend->ops->moe_route || !m->backend->ops->moe_ffn || !m->backend->ops->gated_add)
        return err_set(err, INFERD_EUNSUPPORTED, "the %s backend has no mixture-of-experts ops",
                       m->backend->ops->name);
    ex->n_experts = c->n_experts;
    ex->hidden = hidden;
    ex->inter = inter;
    ex->gate = calloc((size_t)c->n_experts, sizeof *ex->gate);
    ex->up = calloc((size_t)c->n_experts, sizeof *ex->up);
    ex->down = calloc((size_t)c->n_experts, sizeof *ex->down);
    if (!ex->gate || !ex->up || !ex->down)
        return err_set(err, INFERD_ENOMEM, "out of memory for %d experts", c->n_experts);
    if ((rc = model_load_matrix(m, (snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", i), n),
                                c->n_experts, hidden, &L->router, err)))
        return rc;
    for (int e = 0; e < c->n_experts; e++) {
#define NAME(proj) (snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", i, e, proj), n)
        if ((rc = model_load_matrix(m, NAME("gate_proj"), inter, hidden, &ex->gate[e], err)) ||
            (rc = model_load_matrix(m, NAME("up_proj"), inter, hidden, &ex->up[e], err)) ||
            (rc = model_load_matrix(m, NAME("down_proj"), hidden, inter, &ex->down[e], err)))
            return rc;
#undef NAME
        /* one dtype per projection (a GGUF file stacks each into one tensor);
         * dense ones one dtype for all three, which the CUDA kernels read as
         * one. Quantized files may mix types between projections (llama-quantize
         * gives ffn_down more bits, or a fallback type for its rows): the CPU
         * runs each matrix in its own type. */
        const struct weight_matrix *w[3] = {&ex->gate[e], &ex->up[e], &ex->down[e]};
        const struct weight_matrix *w0[3] = {&ex->gate[0], &ex->up[0], &ex->down[0]};
        bool dense = !dtype_is_block(w0[0]->dtype) && !dtype_is_block(w0[1]->dtype) &&
                     !dtype_is_block(w0[2]->dtype);
        for (int p = 0; p < 3; p++)
            if (w[p]->dtype != w0[p]->dtype || (dense && w[p]->dtype != w0[0]->dtype))
                return err_set(err, INFERD_EFORMAT,
                               "layer %d: the experts' %s matrices differ in dtype (%s and %s)",
                               i, (const char *[]){"gate", "up", "down"}[p],
                               dtype_name(ex->gate[0].dtype), dtype_name(w[p]->dtype));
    }
    int64_t shared = c->shared_expert_intermediate_size;
    if (shared == 0)
        return 0;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.mlp.%s", i, suffix), n)
    if ((rc = model_load_matrix(m, NAME("shared_expert.gate_proj.weight"), shared, hidden,
                                &L->shared_gate, err)) ||
        (rc = model_load_matrix(m, NAME("shared_expert.up_proj.weight"), shared, hidden,
                                &L->shared_up, err)) ||
        (rc = model_load_matrix(m, NAME("shared_expert.down_proj.weight"), hidden, shared,
                                &L->shared_down, err)) ||
        (rc = model_load_matrix(m, NAME("shared_expert_gate.weight"), 1, hidden,
                                &L->shared_expert_gate, err)))
        return rc;
#undef NAME
    return 0;
}

static int qwen3_moe_load_layer(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    int rc = arch_llama_load_attention(m, i, L, err);
    if (rc)
        return rc;
    if (!model_config_layer_sparse(&m->config, i))
        return arch_llama_load_mlp(m, i, m->config.intermediate_size, L, err);
    return load_experts(m, i, L, err);
}

/* norm -> router logits -> softmax top-k -> the chosen experts, weighted ->
 * (+ the gated shared expert) -> residual. */
static void moe_block(const struct model *m, struct forward_state *st,
                      const struct layer_weights *lw, int n_rows)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    int64_t hidden = c->hidden_size;

    op->rmsnorm(be, st->x, lw->mlp_norm, n_rows, hidden, c->rms_norm_eps, st->xn);
    op->matmul(be, st->xn, n_rows, &lw->router, NULL, st->router);
    op->moe_route(be, st->router, n_rows, c->n_experts, c->n_experts_per_tok, c->norm_topk_prob,
                  st->moe_ids, st->moe_weights);
    op->moe_ffn(be, st->xn, n_rows, &lw->experts, st->moe_ids, st->moe_weights,
                c->n_experts_per_tok, st->moe_scratch, st->proj);
    if (lw->shared_gate.rows) {
        const struct weight_matrix *gate_up[2] = {&lw->shared_gate, &lw->shared_up};
        const float *no_bias[2] = {NULL, NULL};
        float *gate_up_out[2] = {st->gate, st->up};
        op->matmul_group(be, st->xn, n_rows, 2, gate_up, no_bias, gate_up_out);
        op->silu_mul(be, st->gate, st->up, st->gate, (int64_t)n_rows * lw->shared_gate.rows);
        op->matmul(be, st->gate, n_rows, &lw->shared_down, NULL, st->shared_out);
        op->matmul(be, st->xn, n_rows, &lw->shared_expert_gate, NULL, st->shared_gate);
        op->gated_add(be, st->proj, st->shared_out, st->shared_gate, n_rows, hidden);
    }
    op->add(be, st->x, st->proj, (int64_t)n_rows * hidden);
}

static void qwen3_moe_layer(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                            int layer, int n_rows, int n_spans)
{
    const struct layer_weights *lw = &m->weights.layers[layer];
    arch_llama_attention(m, st, lw, kv, layer, n_rows, n_spans);
    if (lw->experts.n_experts)
        moe_block(m, st, lw, n_rows);
    else
        arch_llama_mlp(m, st, lw, n_rows);
}

static const enum model_arch qwen3_moe_serves[] = {ARCH_QWEN3_MOE};

const struct arch arch_qwen3_moe = {
    .name = "qwen3_moe",
    .serves = qwen3_moe_serves,
    .n_serves = (int)(sizeof qwen3_moe_serves / sizeof qwen3_moe_serves[0]),
    .load_layer = qwen3_moe_load_layer,
    .layer = qwen3_moe_layer,
};
