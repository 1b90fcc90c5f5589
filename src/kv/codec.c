/* kv/codec.c — a block's K/V re-encoded from one format into another, record by record: what lets the SSD tier keep blocks in a colder, smaller format than the live cache and restore them into it. */
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "kv/kv.h"

struct kv_codec {
    struct kv_format live, cold;
    struct kv_quant live_quant, cold_quant; /* the formats' copies (theirs are borrowed) */
    struct kvq_codebooks books;
    int n_layers, n_kv_heads, head_dim, block_size;
    size_t row[2][2]; /* [cold][v]: row bytes of one slot of one layer */
    float *x, *scratch; /* owned; head_dim floats each */
};

int kv_codec_create(const struct model_config *c, int block_size, const struct kv_format *live,
                    const struct kv_format *cold, struct kv_codec **out, struct err *err)
{
    *out = NULL;
    if (!cold->quant)
        return err_set(err, INFERD_EINVAL, "a cold KV format must be a quantized one");
    int rc = kv_format_check(c, live, err);
    if (rc == 0)
        rc = kv_format_check(c, cold, err);
    if (rc < 0)
        return rc;
    if (!live->quant && live->dtype != DTYPE_F32 && live->dtype != DTYPE_F16 &&
        live->dtype != DTYPE_BF16)
        return err_set(err, INFERD_EUNSUPPORTED, "a live KV cache of %s cannot be re-encoded",
                       dtype_name(live->dtype));
    struct kv_codec *k = calloc(1, sizeof *k);
    if (!k)
        return err_set(err, INFERD_ENOMEM, "out of memory for the KV codec");
    k->x = malloc((size_t)c->head_dim * sizeof(float));
    k->scratch = malloc((size_t)c->head_dim * sizeof(float));
    if (!k->x || !k->scratch) {
        kv_codec_free(k);
        return err_set(err, INFERD_ENOMEM, "out of memory for the KV codec");
    }
    k->live = *live;
    k->cold = *cold;
    if (live->quant) {
        k->live_quant = *live->quant;
        k->live.quant = &k->live_quant;
    }
    k->cold_quant = *cold->quant;
    k->cold.quant = &k->cold_quant;
    kvq_codebooks_init(&k->books);
    k->n_layers = c->n_layers;
    k->n_kv_heads = c->n_kv_heads;
    k->head_dim = c->head_dim;
    k->block_size = block_size;
    for (int v = 0; v < 2; v++) {
        k->row[0][v] = kv_format_row_bytes(c, &k->live, v);
        k->row[1][v] = kv_format_row_bytes(c, &k->cold, v);
    }
    *out = k;
    return 0;
}

void kv_codec_free(struct kv_codec *k)
{
    if (!k)
        return;
    free(k->x);
    free(k->scratch);
    free(k);
}

size_t kv_codec_block_bytes(const struct kv_codec *k, bool cold)
{
    return (size_t)k->n_layers * (size_t)k->block_size * (k->row[cold][0] + k->row[cold][1]);
}

/* Head h of a row of format f (layer's) into x, f32. */
static void head_read(struct kv_codec *k, const struct kv_format *f, int layer, bool v,
                      const uint8_t *row, int h, float *x)
{
    int hd = k->head_dim;
    if (f->quant) {
        const struct kv_quant_layer *l = kvq_layer(f->quant, layer);
        kvq_dequantize_head(l, &k->books, f->quant->seed, layer, hd, v,
                            row + (size_t)h * kvq_head_bytes(l, hd, v), x, k->scratch);
        return;
    }
    const uint8_t *e = row + (size_t)h * hd * dtype_size(f->dtype);
    for (int d = 0; d < hd; d++) {
        uint16_t u;
        if (f->dtype == DTYPE_F32) {
            memcpy(&x[d], e + (size_t)d * 4, 4);
            continue;
        }
        memcpy(&u, e + (size_t)d * 2, 2);
        x[d] = f->dtype == DTYPE_F16 ? kvq_f16_to_f32(u) : bf16_to_f32(u);
    }
}

/* x, f32, as head h of a row of format f (layer's). */
static void head_write(struct kv_codec *k, const struct kv_format *f, int layer, bool v,
                       const float *x, uint8_t *row, int h)
{
    int hd = k->head_dim;
    if (f->quant) {
        const struct kv_quant_layer *l = kvq_layer(f->quant, layer);
        kvq_quantize_head(l, &k->books, f->quant->seed, layer, hd, v, x,
                          row + (size_t)h * kvq_head_bytes(l, hd, v), k->scratch);
        return;
    }
    uint8_t *e = row + (size_t)h * hd * dtype_size(f->dtype);
    for (int d = 0; d < hd; d++) {
        if (f->dtype == DTYPE_F32) {
            memcpy(e + (size_t)d * 4, &x[d], 4);
            continue;
        }
        uint16_t u = f->dtype == DTYPE_F16 ? kvq_f32_to_f16(x[d]) : f32_to_bf16(x[d]);
        memcpy(e + (size_t)d * 2, &u, 2);
    }
}

/* Every record of a block from the format on side `from` (0 live, 1 cold)
 * into the other's. Rows past a layer's records (a narrower layer of a
 * per-layer format) are zeroed, so equal blocks give equal bytes. */
static void transcode(struct kv_codec *k, int from, const uint8_t *src, uint8_t *dst)
{
    const struct kv_format *fi = from ? &k->cold : &k->live, *fo = from ? &k->live : &k->cold;
    int to = !from;
    memset(dst, 0, kv_codec_block_bytes(k, to));
    for (int layer = 0; layer < k->n_layers; layer++)
        for (int v = 0; v < 2; v++) {
            /* this layer's chunk of K (V after it): block_size rows */
            size_t in_at = (size_t)layer * k->block_size * (k->row[from][0] + k->row[from][1]) +
                           (v ? (size_t)k->block_size * k->row[from][0] : 0);
            size_t out_at = (size_t)layer * k->block_size * (k->row[to][0] + k->row[to][1]) +
                            (v ? (size_t)k->block_size * k->row[to][0] : 0);
            for (int s = 0; s < k->block_size; s++)
                for (int h = 0; h < k->n_kv_heads; h++) {
                    head_read(k, fi, layer, v, src + in_at + (size_t)s * k->row[from][v], h, k->x);
                    head_write(k, fo, layer, v, k->x, dst + out_at + (size_t)s * k->row[to][v], h);
                }
        }
}

void kv_codec_encode(struct kv_codec *k, const void *live, void *cold)
{
    transcode(k, 0, live, cold);
}

void kv_codec_decode(struct kv_codec *k, const void *cold, void *live)
{
    transcode(k, 1, cold, live);
}
