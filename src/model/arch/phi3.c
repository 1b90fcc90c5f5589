/* model/arch/phi3.c — the Phi-3 layer (Phi-3, Phi-3.5, Phi-4-mini): fused qkv and gate_up projections, split at load, over the Llama-shaped blocks.
 *
 * Phi3DecoderLayer computes what a Llama layer does; its checkpoints store
 * q, k and v as one qkv_proj (rows q, then k, then v) and gate and up as one
 * gate_up_proj (gate first), which are split at load (views where the layout
 * allows: model_load_matrix_parts), so the backend sees the same grouped
 * matmuls and fuses them as it does Llama's.
 * Partial rotary (Phi-4-mini) and longrope live in the rope table (load.c). */
#include <stdio.h>

#include "model/arch.h"

#define NAME_CAP 160

static int phi3_load_layer(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    const struct model_config *c = &m->config;
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    char n[NAME_CAP];
    int rc;
    const int64_t qkv_rows[3] = {q_dim, kv_dim, kv_dim}, gate_up_rows[2] = {inter, inter};
    struct weight_matrix qkv[3], gate_up[2];
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
    if ((rc = model_load_vector(m, NAME("input_layernorm.weight"), hidden, &L->attn_norm, err)) ||
        (rc = model_load_matrix_parts(m, NAME("self_attn.qkv_proj.weight"), hidden, 3, qkv_rows,
                                      qkv, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.o_proj.weight"), hidden, q_dim, &L->wo, err)) ||
        (rc = model_load_vector(m, NAME("post_attention_layernorm.weight"), hidden, &L->mlp_norm,
                                err)) ||
        (rc = model_load_matrix_parts(m, NAME("mlp.gate_up_proj.weight"), hidden, 2,
                                      gate_up_rows, gate_up, err)) ||
        (rc = model_load_matrix(m, NAME("mlp.down_proj.weight"), hidden, inter, &L->w_down, err)))
        return rc;
#undef NAME
    L->wq = qkv[0];
    L->wk = qkv[1];
    L->wv = qkv[2];
    L->w_gate = gate_up[0];
    L->w_up = gate_up[1];
    return 0;
}

static void phi3_layer(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                       int layer, int n_rows, int n_spans)
{
    const struct layer_weights *lw = &m->weights.layers[layer];
    /* no biases, no q/k norms: Llama's blocks run exactly Phi3DecoderLayer's ops */
    arch_llama_attention(m, st, lw, kv, layer, n_rows, n_spans);
    arch_llama_mlp(m, st, lw, n_rows);
}

static const enum model_arch phi3_serves[] = {ARCH_PHI3};

const struct arch arch_phi3 = {
    .name = "phi3",
    .serves = phi3_serves,
    .n_serves = (int)(sizeof phi3_serves / sizeof phi3_serves[0]),
    .load_layer = phi3_load_layer,
    .layer = phi3_layer,
};
