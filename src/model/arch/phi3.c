/* model/arch/phi3.c — the Phi-3 layer (Phi-3, Phi-3.5, Phi-4-mini): fused qkv and gate_up projections, split at load, over the Llama-shaped blocks.
 *
 * Phi3DecoderLayer computes what a Llama layer does; its checkpoints store
 * q, k and v as one qkv_proj (rows q, then k, then v) and gate and up as one
 * gate_up_proj (gate first), which are views here (model_matrix_rows), so the
 * backend sees the same grouped matmuls and fuses them as it does Llama's.
 * Partial rotary (Phi-4-mini) and longrope live in the rope table (load.c). */
#include <math.h>
#include <stdio.h>

#include "model/arch.h"
#include "model/lora.h"

#define NAME_CAP 160

static int phi3_load_layer(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    const struct model_config *c = &m->config;
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    struct weight_matrix qkv, gate_up;
    char n[NAME_CAP];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
    if ((rc = model_load_vector(m, NAME("input_layernorm.weight"), hidden, &L->attn_norm, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.qkv_proj.weight"), q_dim + 2 * kv_dim, hidden,
                                &qkv, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.o_proj.weight"), hidden, q_dim, &L->wo, err)) ||
        (rc = model_load_vector(m, NAME("post_attention_layernorm.weight"), hidden, &L->mlp_norm,
                                err)) ||
        (rc = model_load_matrix(m, NAME("mlp.gate_up_proj.weight"), 2 * inter, hidden, &gate_up,
                                err)) ||
        (rc = model_load_matrix(m, NAME("mlp.down_proj.weight"), hidden, inter, &L->w_down, err)))
        return rc;
#undef NAME
    L->wq = model_matrix_rows(&qkv, 0, q_dim);
    L->wk = model_matrix_rows(&qkv, q_dim, kv_dim);
    L->wv = model_matrix_rows(&qkv, q_dim + kv_dim, kv_dim);
    L->w_gate = model_matrix_rows(&gate_up, 0, inter);
    L->w_up = model_matrix_rows(&gate_up, inter, inter);
    return 0;
}

/* norm -> q/k/v (one grouped matmul over the qkv views) -> RoPE (partial,
 * longrope) -> paged KV -> attention -> o_proj -> residual. */
static void attention_block(const struct model *m, struct forward_state *st,
                            const struct layer_weights *lw, struct kv_cache *kv, int layer,
                            int n_rows, int n_spans)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;

    op->rmsnorm(be, st->x, lw->attn_norm, n_rows, c->hidden_size, c->rms_norm_eps, st->xn);
    const struct weight_matrix *qkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    const float *no_bias[3] = {NULL, NULL, NULL};
    float *qkv_out[3] = {st->q, st->k, st->v};
    op->matmul_group(be, st->xn, n_rows, 3, qkv, no_bias, qkv_out);
    forward_lora(m, st, layer, LORA_Q, st->xn, c->hidden_size, lw->wq.rows, st->q);
    forward_lora(m, st, layer, LORA_K, st->xn, c->hidden_size, lw->wk.rows, st->k);
    forward_lora(m, st, layer, LORA_V, st->xn, c->hidden_size, lw->wv.rows, st->v);
    op->rope(be, st->q, n_rows, c->n_heads, c->head_dim, st->positions, &m->rope);
    op->rope(be, st->k, n_rows, c->n_kv_heads, c->head_dim, st->positions, &m->rope);
    int kl;
    const struct attn_span *spans;
    struct kv_cache *lkv = arch_layer_kv(kv, st, layer, &kl, &spans);
    op->kv_store(be, lkv, kl, st->k, st->v, spans, n_spans);
    op->attention(be, st->q, lkv, kl, spans, n_spans, c->n_heads,
                  1.0f / sqrtf((float)c->head_dim), c->sliding_window, st->attn);
    op->matmul(be, st->attn, n_rows, &lw->wo, NULL, st->proj);
    forward_lora(m, st, layer, LORA_O, st->attn, lw->wo.cols, c->hidden_size, st->proj);
    op->add(be, st->x, st->proj, (int64_t)n_rows * c->hidden_size);
}

/* norm -> gate and up (one grouped matmul over the gate_up views) ->
 * SiLU(gate) * up -> down -> residual. */
static void mlp_block(const struct model *m, struct forward_state *st,
                      const struct layer_weights *lw, int n_rows)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;

    op->rmsnorm(be, st->x, lw->mlp_norm, n_rows, c->hidden_size, c->rms_norm_eps, st->xn);
    const struct weight_matrix *gate_up[2] = {&lw->w_gate, &lw->w_up};
    const float *no_bias[2] = {NULL, NULL};
    float *gate_up_out[2] = {st->gate, st->up};
    op->matmul_group(be, st->xn, n_rows, 2, gate_up, no_bias, gate_up_out);
    int layer = (int)(lw - m->weights.layers);
    forward_lora(m, st, layer, LORA_GATE, st->xn, c->hidden_size, lw->w_gate.rows, st->gate);
    forward_lora(m, st, layer, LORA_UP, st->xn, c->hidden_size, lw->w_up.rows, st->up);
    op->silu_mul(be, st->gate, st->up, st->gate, (int64_t)n_rows * c->intermediate_size);
    op->matmul(be, st->gate, n_rows, &lw->w_down, NULL, st->proj);
    forward_lora(m, st, layer, LORA_DOWN, st->gate, lw->w_down.cols, c->hidden_size, st->proj);
    op->add(be, st->x, st->proj, (int64_t)n_rows * c->hidden_size);
}

static void phi3_layer(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                       int layer, int n_rows, int n_spans)
{
    const struct layer_weights *lw = &m->weights.layers[layer];
    attention_block(m, st, lw, kv, layer, n_rows, n_spans);
    mlp_block(m, st, lw, n_rows);
}

static const enum model_arch phi3_serves[] = {ARCH_PHI3};

const struct arch arch_phi3 = {
    .name = "phi3",
    .serves = phi3_serves,
    .n_serves = (int)(sizeof phi3_serves / sizeof phi3_serves[0]),
    .load_layer = phi3_load_layer,
    .layer = phi3_layer,
};
