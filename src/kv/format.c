/* kv/format.c — how K/V elements are stored, and what that costs per token and per block. */
#include "kv/kv.h"

struct kv_format kv_format_of_dtype(enum dtype dtype)
{
    return (struct kv_format){.dtype = dtype, .group_size = 0, .scales = KV_SCALES_NONE,
                              .scale_bytes = 0};
}

size_t kv_format_bytes_per_token(const struct model_config *c, const struct kv_format *f)
{
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t per_layer = kv_dim * dtype_size(f->dtype);
    if (f->group_size > 0)
        per_layer += kv_dim / (size_t)f->group_size * (size_t)f->scale_bytes;
    return 2 * (size_t)c->n_layers * per_layer;
}

size_t kv_format_bytes_per_block(const struct model_config *c, const struct kv_format *f,
                                 int block_size)
{
    return kv_format_bytes_per_token(c, f) * (size_t)block_size;
}
