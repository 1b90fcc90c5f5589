/* model/arch/llama.c — the Llama-family layer (Llama, Mistral, Qwen2, Qwen3): its tensors and its attention and SwiGLU MLP blocks.
 *
 * The four differ only in which optional weights exist: q/k/v biases
 * (Qwen2; Llama's attention_bias, which covers o_proj too), per-head q/k
 * RMSNorm (Qwen3), and a sliding window (Mistral), all read from config. */
#include <math.h>
#include <stdio.h>

#include "model/arch.h"
#include "model/lora.h"

#define NAME_CAP 160

int arch_llama_load_attention(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    const struct model_config *c = &m->config;
    int64_t hidden = c->hidden_size;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    char n[NAME_CAP];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
    if ((rc = model_load_vector(m, NAME("input_layernorm.weight"), hidden, &L->attn_norm, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.q_proj.weight"), q_dim, hidden, &L->wq, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.k_proj.weight"), kv_dim, hidden, &L->wk, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.v_proj.weight"), kv_dim, hidden, &L->wv, err)) ||
        (rc = model_load_matrix(m, NAME("self_attn.o_proj.weight"), hidden, q_dim, &L->wo, err)))
        return rc;
    /* Llama's and Qwen3's attention_bias covers o_proj too; Qwen2 biases q/k/v only. */
    if (c->attention_bias && c->arch != ARCH_QWEN2 &&
        (rc = model_load_vector(m, NAME("self_attn.o_proj.bias"), hidden, &L->bo, err)))
        return rc;
    if (c->attention_bias &&
        ((rc = model_load_vector(m, NAME("self_attn.q_proj.bias"), q_dim, &L->bq, err)) ||
         (rc = model_load_vector(m, NAME("self_attn.k_proj.bias"), kv_dim, &L->bk, err)) ||
         (rc = model_load_vector(m, NAME("self_attn.v_proj.bias"), kv_dim, &L->bv, err))))
        return rc;
    if (c->qk_norm &&
        ((rc = model_load_vector(m, NAME("self_attn.q_norm.weight"), c->head_dim, &L->q_norm, err)) ||
         (rc = model_load_vector(m, NAME("self_attn.k_norm.weight"), c->head_dim, &L->k_norm, err))))
        return rc;
    return model_load_vector(m, NAME("post_attention_layernorm.weight"), hidden, &L->mlp_norm, err);
#undef NAME
}

int arch_llama_load_mlp(struct model *m, int i, int64_t inter, struct layer_weights *L,
                        struct err *err)
{
    int64_t hidden = m->config.hidden_size;
    char n[NAME_CAP];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
    if ((rc = model_load_matrix(m, NAME("mlp.gate_proj.weight"), inter, hidden, &L->w_gate, err)) ||
        (rc = model_load_matrix(m, NAME("mlp.up_proj.weight"), inter, hidden, &L->w_up, err)) ||
        (rc = model_load_matrix(m, NAME("mlp.down_proj.weight"), hidden, inter, &L->w_down, err)))
        return rc;
#undef NAME
    return 0;
}

static int llama_load_layer(struct model *m, int i, struct layer_weights *L, struct err *err)
{
    int rc = arch_llama_load_attention(m, i, L, err);
    return rc ? rc : arch_llama_load_mlp(m, i, m->config.intermediate_size, L, err);
}

/* norm -> q/k/v (one grouped matmul) -> optional q/k norm -> RoPE -> paged KV
 * -> attention -> o_proj -> residual. */
void arch_llama_attention(const struct model *m, struct forward_state *st,
                          const struct layer_weights *lw, struct kv_cache *kv, int layer,
                          int n_rows, int n_spans)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;

    op->rmsnorm(be, st->x, lw->attn_norm, n_rows, c->hidden_size, c->rms_norm_eps, st->xn);
    const struct weight_matrix *qkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    const float *qkv_bias[3] = {lw->bq, lw->bk, lw->bv};
    float *qkv_out[3] = {st->q, st->k, st->v};
    op->matmul_group(be, st->xn, n_rows, 3, qkv, qkv_bias, qkv_out);
    forward_lora(m, st, layer, LORA_Q, st->xn, c->hidden_size, lw->wq.rows, st->q);
    forward_lora(m, st, layer, LORA_K, st->xn, c->hidden_size, lw->wk.rows, st->k);
    forward_lora(m, st, layer, LORA_V, st->xn, c->hidden_size, lw->wv.rows, st->v);
    if (lw->q_norm) {
        op->rmsnorm(be, st->q, lw->q_norm, (int64_t)n_rows * c->n_heads, c->head_dim,
                    c->rms_norm_eps, st->q);
        op->rmsnorm(be, st->k, lw->k_norm, (int64_t)n_rows * c->n_kv_heads, c->head_dim,
                    c->rms_norm_eps, st->k);
    }
    op->rope(be, st->q, n_rows, c->n_heads, c->head_dim, st->positions, &m->rope);
    op->rope(be, st->k, n_rows, c->n_kv_heads, c->head_dim, st->positions, &m->rope);
    int kl;
    const struct attn_span *spans;
    struct kv_cache *lkv = arch_layer_kv(kv, st, layer, &kl, &spans);
    op->kv_store(be, lkv, kl, st->k, st->v, spans, n_spans);
    op->attention(be, st->q, lkv, kl, spans, n_spans, c->n_heads,
                  1.0f / sqrtf((float)c->head_dim), c->sliding_window, st->attn);
    op->matmul(be, st->attn, n_rows, &lw->wo, lw->bo, st->proj);
    forward_lora(m, st, layer, LORA_O, st->attn, lw->wo.cols, c->hidden_size, st->proj);
    forward_all_reduce(m, st, st->proj, (int64_t)n_rows * c->hidden_size);
    op->add(be, st->x, st->proj, (int64_t)n_rows * c->hidden_size);
}

/* norm -> gate and up (one grouped matmul) -> SiLU(gate) * up -> down -> residual. */
void arch_llama_mlp(const struct model *m, struct forward_state *st,
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
    op->silu_mul(be, st->gate, st->up, st->gate, (int64_t)n_rows * lw->w_gate.rows);
    op->matmul(be, st->gate, n_rows, &lw->w_down, NULL, st->proj);
    forward_lora(m, st, layer, LORA_DOWN, st->gate, lw->w_down.cols, c->hidden_size, st->proj);
    forward_all_reduce(m, st, st->proj, (int64_t)n_rows * c->hidden_size);
    op->add(be, st->x, st->proj, (int64_t)n_rows * c->hidden_size);
}

static void llama_layer(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                        int layer, int n_rows, int n_spans)
{
    const struct layer_weights *lw = &m->weights.layers[layer];
    arch_llama_attention(m, st, lw, kv, layer, n_rows, n_spans);
    arch_llama_mlp(m, st, lw, n_rows);
}

static const enum model_arch llama_serves[] = {ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3};

const struct arch arch_llama = {
    .name = "llama",
    .serves = llama_serves,
    .n_serves = (int)(sizeof llama_serves / sizeof llama_serves[0]),
    .load_layer = llama_load_layer,
    .layer = llama_layer,
};
