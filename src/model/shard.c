/* model/shard.c — which slice of each tensor a tensor-parallel rank loads, and the rank's config after (model/tensor_parallel.h). */
#include <string.h>

#include "model/tensor_parallel.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* Rank r's vocabulary rows: ceil(V / N) each, the last rank the rest. */
static void vocab_slice(int64_t vocab, int r, int n, int64_t *lo, int64_t *count)
{
    int64_t per = (vocab + n - 1) / n;
    *lo = per * r;
    *count = *lo + per <= vocab ? per : vocab - *lo;
}

/* The first of rank r's KV heads and how many it holds. */
static void kv_heads_of(const struct model_config *c, int r, int n, int *first, int *count)
{
    if (c->n_kv_heads >= n) {
        *count = c->n_kv_heads / n;
        *first = r * *count;
    } else { /* the KV head every query head of rank r reads */
        *count = 1;
        *first = r * c->n_kv_heads / n;
    }
}

void model_shard_part(const struct model *m, const char *name, struct shard_part *out)
{
    const struct model_config *c = &m->config;
    int r = m->tp_rank, n = m->tp_ranks;
    int64_t hd = c->head_dim, q_heads = c->n_heads / n, inter = c->intermediate_size / n;
    int kv_first, kv_count;
    kv_heads_of(c, r, n, &kv_first, &kv_count);
    *out = (struct shard_part){.axis = SHARD_WHOLE};
    if (ends_with(name, "self_attn.q_proj.weight") || ends_with(name, "self_attn.q_proj.bias"))
        *out = (struct shard_part){SHARD_ROWS, r * q_heads * hd, q_heads * hd};
    else if (ends_with(name, "self_attn.k_proj.weight") || ends_with(name, "self_attn.k_proj.bias") ||
             ends_with(name, "self_attn.v_proj.weight") || ends_with(name, "self_attn.v_proj.bias"))
        *out = (struct shard_part){SHARD_ROWS, kv_first * hd, kv_count * hd};
    else if (ends_with(name, "self_attn.o_proj.weight"))
        *out = (struct shard_part){SHARD_COLS, r * q_heads * hd, q_heads * hd};
    else if (ends_with(name, "mlp.gate_proj.weight") || ends_with(name, "mlp.up_proj.weight"))
        *out = (struct shard_part){SHARD_ROWS, r * inter, inter};
    else if (ends_with(name, "mlp.down_proj.weight"))
        *out = (struct shard_part){SHARD_COLS, r * inter, inter};
    else if (strcmp(name, "lm_head.weight") == 0) {
        out->axis = SHARD_ROWS;
        vocab_slice(c->vocab_size, r, n, &out->lo, &out->n);
    }
}

int model_shard_check(const struct model *m, struct err *err)
{
    const struct model_config *c = &m->config;
    int n = m->tp_ranks;
    if (m->arch != &arch_llama)
        return err_set(err, INFERD_EUNSUPPORTED, "tensor parallelism runs the Llama family "
                       "(Llama, Mistral, Qwen2, Qwen3), not %s", model_arch_name(c->arch));
    if (c->n_experts > 0)
        return err_set(err, INFERD_EUNSUPPORTED, "tensor parallelism does not split "
                       "mixture-of-experts layers");
    if (m->backend->kv_quant)
        return err_set(err, INFERD_EUNSUPPORTED, "tensor parallelism with a quantized KV cache "
                       "is not supported");
    if (c->n_heads % n)
        return err_set(err, INFERD_EINVAL, "--tensor-parallel %d does not divide the model's %d "
                       "attention heads", n, c->n_heads);
    if (c->n_kv_heads % n && n % c->n_kv_heads)
        return err_set(err, INFERD_EINVAL, "--tensor-parallel %d neither divides nor is a "
                       "multiple of the model's %d KV heads", n, c->n_kv_heads);
    if (c->intermediate_size % n)
        return err_set(err, INFERD_EINVAL, "--tensor-parallel %d does not divide the MLP's %d "
                       "rows (intermediate_size)", n, c->intermediate_size);
    int64_t lo, count;
    vocab_slice(c->vocab_size, n - 1, n, &lo, &count);
    if (count < 1)
        return err_set(err, INFERD_EINVAL, "--tensor-parallel %d leaves the last rank no "
                       "vocabulary rows of %d", n, c->vocab_size);
    return 0;
}

int model_shard_finish(struct model *m, struct err *err)
{
    struct model_config *c = &m->config;
    int r = m->tp_rank, n = m->tp_ranks;
    int64_t lo, count;
    vocab_slice(c->vocab_size, r, n, &lo, &count);
    m->vocab_lo = lo;
    if (m->weights.lm_head.rows == c->vocab_size) { /* tied: the embedding's rows */
        struct weight_matrix head = m->weights.lm_head;
        int rc = model_matrix_rows_owned(m, "the LM head", &head, lo, count, &m->weights.lm_head, err);
        if (rc)
            return rc;
    }
    for (int l = 0; r > 0 && l < c->n_layers; l++)
        m->weights.layers[l].bo = NULL; /* still in owned_buffers: freed with the model */
    int kv_first, kv_count;
    kv_heads_of(c, r, n, &kv_first, &kv_count);
    c->n_heads /= n;
    c->n_kv_heads = kv_count;
    c->intermediate_size /= n;
    return 0;
}
