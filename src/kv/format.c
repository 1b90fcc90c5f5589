/* kv/format.c — how K/V elements are stored (plain or quantized), what that costs per token and
 * per block, and the format's name and identity. */
#include <stdio.h>
#include <string.h>

#include "base/hash.h"
#include "kv/kv.h"

struct kv_format kv_format_of_dtype(enum dtype dtype)
{
    return (struct kv_format){.dtype = dtype, .group_size = 0, .scales = KV_SCALES_NONE,
                              .scale_bytes = 0, .quant = NULL};
}

struct kv_format kv_format_of_backend(const struct backend *be)
{
    struct kv_format f = kv_format_of_dtype(be->kv_dtype);
    if (be->kv_quant) {
        f.quant = be->kv_quant;
        f.scales = KV_SCALES_IN_RECORD;
    }
    return f;
}

size_t kv_format_row_bytes(const struct model_config *c, const struct kv_format *f, bool v)
{
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    if (!f->quant) {
        size_t per_layer = kv_dim * dtype_size(f->dtype);
        if (f->group_size > 0)
            per_layer += kv_dim / (size_t)f->group_size * (size_t)f->scale_bytes;
        return per_layer;
    }
    /* every layer's rows are as wide as the widest layer's (one pitch for all),
     * rounded up to 16 bytes: every row starts on a 16-byte boundary, so the
     * GPU kernels read a record's bytes in aligned words without leaving its
     * row */
    size_t widest = 0;
    int n = f->quant->n_layers > 0 ? f->quant->n_layers : 1;
    for (int l = 0; l < n; l++) {
        size_t b = (size_t)c->n_kv_heads *
                   (size_t)kvq_head_bytes(&f->quant->layer[l], c->head_dim, v);
        widest = b > widest ? b : widest;
    }
    return (widest + 15) / 16 * 16;
}

size_t kv_format_bytes_per_token(const struct model_config *c, const struct kv_format *f)
{
    return (size_t)c->n_layers * (kv_format_row_bytes(c, f, false) + kv_format_row_bytes(c, f, true));
}

size_t kv_format_bytes_per_block(const struct model_config *c, const struct kv_format *f,
                                 int block_size)
{
    return kv_format_bytes_per_token(c, f) * (size_t)block_size;
}

static int layer_name(const struct kv_quant_layer *l, enum dtype dtype, char *buf, size_t cap)
{
    switch (l->scheme) {
    case KV_QUANT_AFFINE:
        return l->group_size == 64 ? snprintf(buf, cap, "kv%d", l->k_bits)
                                   : snprintf(buf, cap, "kv%dg%d", l->k_bits, l->group_size);
    case KV_QUANT_TURBO:
        return snprintf(buf, cap, "turbo-k%dv%d%s", l->k_bits, l->v_bits, l->qjl ? "-qjl" : "");
    default:
        return snprintf(buf, cap, "%s", dtype == DTYPE_F32 ? "f32" : dtype == DTYPE_F16 ? "f16"
                                                                                     : "bf16");
    }
}

void kv_format_name(const struct kv_format *f, char *buf, size_t cap)
{
    if (!f->quant) {
        struct kv_quant_layer none = {0};
        layer_name(&none, f->dtype, buf, cap);
    } else if (f->quant->per_layer) {
        snprintf(buf, cap, "config");
    } else {
        layer_name(&f->quant->layer[0], f->dtype, buf, cap);
    }
}

void kv_format_layer_name(const struct kv_format *f, int layer, char *buf, size_t cap)
{
    struct kv_quant_layer none = {0};
    layer_name(f->quant ? kvq_layer(f->quant, layer) : &none, f->dtype, buf, cap);
}

uint64_t kv_format_digest(const struct kv_format *f)
{
    uint64_t h = hash_mix64((uint64_t)f->dtype ^ 0x2545f4914f6cdd1dull);
    h = hash_mix64(h ^ ((uint64_t)f->group_size << 8) ^ ((uint64_t)f->scales << 40) ^
                   ((uint64_t)f->scale_bytes << 48));
    if (!f->quant)
        return h;
    const struct kv_quant *q = f->quant;
    int n = q->n_layers > 0 ? q->n_layers : 1;
    h = hash_mix64(h ^ (uint64_t)n ^ ((uint64_t)q->per_layer << 32));
    h = hash_mix64(h ^ q->seed);
    h = hash_mix64(h ^ q->digest);
    for (int l = 0; l < n; l++) {
        const struct kv_quant_layer *x = &q->layer[l];
        h = hash_mix64(h ^ ((uint64_t)x->scheme | (uint64_t)x->k_bits << 8 |
                            (uint64_t)x->v_bits << 16 | (uint64_t)x->group_size << 24 |
                            (uint64_t)x->qjl << 32));
    }
    return h;
}

int kv_format_check(const struct model_config *c, const struct kv_format *f, struct err *err)
{
    if (!f->quant)
        return 0;
    const struct kv_quant *q = f->quant;
    if (q->n_layers > 0 && q->n_layers != c->n_layers)
        return err_set(err, INFERD_EINVAL,
                       "the KV quantization config describes %d layers, the model has %d",
                       q->n_layers, c->n_layers);
    int n = q->n_layers > 0 ? q->n_layers : 1;
    for (int l = 0; l < n; l++) {
        const struct kv_quant_layer *x = &q->layer[l];
        if (x->scheme == KV_QUANT_NONE)
            continue;
        if (c->head_dim % 16 != 0 || c->head_dim > 512)
            return err_set(err, INFERD_EUNSUPPORTED,
                           "KV quantization needs head_dim a multiple of 16 up to 512, the model "
                           "has %d", c->head_dim);
        if (c->n_heads / c->n_kv_heads > 16)
            return err_set(err, INFERD_EUNSUPPORTED,
                           "KV quantization reads at most 16 query heads per KV head, the model "
                           "has %d", c->n_heads / c->n_kv_heads);
        if (x->scheme == KV_QUANT_AFFINE && c->head_dim % x->group_size != 0)
            return err_set(err, INFERD_EINVAL,
                           "layer %d: KV group size %d does not divide head_dim %d", l,
                           x->group_size, c->head_dim);
    }
    return 0;
}
