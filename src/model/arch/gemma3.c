/* model/arch/gemma3.c — the Gemma 3 text layer: local (sliding-window) and global attention with their own RoPE, q/k norms, sandwich norms and a GeGLU MLP.
 *
 * Gemma3DecoderLayer in transformers: x += post_attn_norm(attn(input_norm(x)));
 * x += post_ffw_norm(mlp(pre_ffw_norm(x))). Every RMSNorm weight is an offset
 * (x / rms(x) * (1 + w)), folded at load (model_load_norm); the embedding's
 * sqrt(hidden) scale and the final soft-cap are the shared driver's
 * (forward.c), read from config. */
#include <stdio.h>

#include "model/arch.h"
#include "model/lora.h"

#define NAME_CAP 160

static int gemma3_load_layer(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    const struct model_config *c = &m->config;
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    char n[NAME_CAP];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "%slayers.%d.%s", m->prefix, i, suffix), n)
    if ((rc = model_load_norm(m, NAME("input_layernorm.weight"), hidden, &L->attn_norm, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.q_proj.weight"), q_dim, hidden, &L->wq, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.k_proj.weight"), kv_dim, hidden, &L->wk, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.v_proj.weight"), kv_dim, hidden, &L->wv, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.o_proj.weight"), hidden, q_dim, &L->wo, err)) ||
        (rc = model_load_norm(m, NAME("self_attn.q_norm.weight"), c->head_dim, &L->q_norm, err)) ||
        (rc = model_load_norm(m, NAME("self_attn.k_norm.weight"), c->head_dim, &L->k_norm, err)) ||
        (rc = model_load_norm(m, NAME("post_attention_layernorm.weight"), hidden,
                              &L->attn_post_norm, err)) ||
        (rc = model_load_norm(m, NAME("pre_feedforward_layernorm.weight"), hidden, &L->mlp_norm,
                              err)) ||
        (rc = model_load_norm(m, NAME("post_feedforward_layernorm.weight"), hidden,
                              &L->mlp_post_norm, err)) ||
        (rc = model_load_matrix(m, NAME("mlp.gate_proj.weight"), inter, hidden, &L->w_gate, err)) ||
        (rc = model_load_matrix(m, NAME("mlp.up_proj.weight"), inter, hidden, &L->w_up, err)) ||
        (rc = model_load_matrix(m, NAME("mlp.down_proj.weight"), hidden, inter, &L->w_down, err)))
        return rc;
    /* Gemma3TextConfig's attention_bias covers q, k, v and o */
    if (c->attention_bias &&
        ((rc = model_load_vector(m, NAME("self_attn.q_proj.bias"), q_dim, &L->bq, err)) ||
         (rc = model_load_vector(m, NAME("self_attn.k_proj.bias"), kv_dim, &L->bk, err)) ||
         (rc = model_load_vector(m, NAME("self_attn.v_proj.bias"), kv_dim, &L->bv, err)) ||
         (rc = model_load_vector(m, NAME("self_attn.o_proj.bias"), hidden, &L->bo, err))))
        return rc;
#undef NAME
    return 0;
}

/* norm -> q/k/v -> q/k norms -> RoPE (the layer's base) -> paged KV ->
 * attention (the layer's window, scale query_pre_attn_scalar^-1/2) -> o_proj
 * -> post-norm -> residual. A local layer's K/V are in the window slots of a
 * windowed pool (arch_layer_kv), else in every block, read within its window. */
static void attention_block(const struct model *m, struct forward_state *st,
                            const struct layer_weights *lw, struct kv_cache *kv, int layer,
                            int n_rows, int n_spans)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    bool local = c->layer_sliding[layer];
    const struct rope_table *rope = local && m->rope_local_inv_freq ? &m->rope_local : &m->rope;

    op->rmsnorm(be, st->x, lw->attn_norm, n_rows, c->hidden_size, c->rms_norm_eps, st->xn);
    const struct weight_matrix *qkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    const float *qkv_bias[3] = {lw->bq, lw->bk, lw->bv};
    float *qkv_out[3] = {st->q, st->k, st->v};
    op->matmul_group(be, st->xn, n_rows, 3, qkv, qkv_bias, qkv_out);
    forward_lora(m, st, layer, LORA_Q, st->xn, c->hidden_size, lw->wq.rows, st->q);
    forward_lora(m, st, layer, LORA_K, st->xn, c->hidden_size, lw->wk.rows, st->k);
    forward_lora(m, st, layer, LORA_V, st->xn, c->hidden_size, lw->wv.rows, st->v);
    op->rmsnorm(be, st->q, lw->q_norm, (int64_t)n_rows * c->n_heads, c->head_dim,
                c->rms_norm_eps, st->q);
    op->rmsnorm(be, st->k, lw->k_norm, (int64_t)n_rows * c->n_kv_heads, c->head_dim,
                c->rms_norm_eps, st->k);
    op->rope(be, st->q, n_rows, c->n_heads, c->head_dim, st->positions, rope);
    op->rope(be, st->k, n_rows, c->n_kv_heads, c->head_dim, st->positions, rope);
    int kl;
    const struct attn_span *spans;
    struct kv_cache *lkv = arch_layer_kv(kv, st, layer, &kl, &spans);
    op->kv_store(be, lkv, kl, st->k, st->v, spans, n_spans);
    op->attention(be, st->q, lkv, kl, spans, n_spans, c->n_heads, c->query_scale,
                  local ? c->sliding_window : 0, st->attn);
    op->matmul(be, st->attn, n_rows, &lw->wo, lw->bo, st->proj);
    forward_lora(m, st, layer, LORA_O, st->attn, lw->wo.cols, c->hidden_size, st->proj);
    op->rmsnorm(be, st->proj, lw->attn_post_norm, n_rows, c->hidden_size, c->rms_norm_eps,
                st->proj);
    op->add(be, st->x, st->proj, (int64_t)n_rows * c->hidden_size);
}

/* pre-norm -> gate and up -> gelu_tanh(gate) * up -> down -> post-norm -> residual. */
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
    op->gelu_tanh_mul(be, st->gate, st->up, st->gate, (int64_t)n_rows * c->intermediate_size);
    op->matmul(be, st->gate, n_rows, &lw->w_down, NULL, st->proj);
    forward_lora(m, st, layer, LORA_DOWN, st->gate, lw->w_down.cols, c->hidden_size, st->proj);
    op->rmsnorm(be, st->proj, lw->mlp_post_norm, n_rows, c->hidden_size, c->rms_norm_eps,
                st->proj);
    op->add(be, st->x, st->proj, (int64_t)n_rows * c->hidden_size);
}

static void gemma3_layer(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                         int layer, int n_rows, int n_spans)
{
    const struct layer_weights *lw = &m->weights.layers[layer];
    attention_block(m, st, lw, kv, layer, n_rows, n_spans);
    mlp_block(m, st, lw, n_rows);
}

static const enum model_arch gemma3_serves[] = {ARCH_GEMMA3};

const struct arch arch_gemma3 = {
    .name = "gemma3",
    .serves = gemma3_serves,
    .n_serves = (int)(sizeof gemma3_serves / sizeof gemma3_serves[0]),
    .load_layer = gemma3_load_layer,
    .layer = gemma3_layer,
};
