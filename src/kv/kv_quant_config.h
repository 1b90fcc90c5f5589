/* kv/kv_quant_config.h — KV quantization formats by name (--kv-quant) and the per-layer
 * kv_config.json reader. */
#ifndef INFERD_KV_KV_QUANT_CONFIG_H
#define INFERD_KV_KV_QUANT_CONFIG_H

#include <stddef.h>

#include "backend/kv_quant.h"
#include "base/err.h"

/* The rotation seed TURBO layers use unless a kv_config.json names another. */
#define KV_QUANT_DEFAULT_SEED 0x7475726271756e74ull

/* One layer's format from its name: "off" (or "bf16", "f32": not quantized),
 * "8", "4" (affine, group 64), "8g32", "4g32", "8g64", "4g64", "turbo" (k8v3),
 * "turbo:kXvY" with X, Y in {2, 3, 4, 5, 8}, and ":qjl" after it (X in 3..5)
 * for the QJL residual on keys. -INFERD_EINVAL with a message naming the text. */
int kv_quant_layer_parse(const char *text, struct kv_quant_layer *out, struct err *err);

/* A whole cache's format from a --kv-quant value other than "config": every
 * layer alike (out->n_layers 0). *quantized false for "off". */
int kv_quant_parse(const char *text, struct kv_quant *out, bool *quantized, struct err *err);

/* A per-layer kv_config.json for a model of n_layers layers:
 *   {"default": FORMAT,                      optional; "off" when absent
 *    "layers": [FORMAT | null, ...]          exactly n_layers entries (null: default)
 *           or {"<layer index>": FORMAT, ...} only the layers that differ,
 *    "seed": integer}                        optional; the TURBO rotation's seed
 * where FORMAT is a name as kv_quant_layer_parse reads, or
 * {"format": NAME, "group_size": 32 | 64}. Unknown keys are refused. Errors
 * (-INFERD_EFORMAT, -INFERD_EINVAL, -INFERD_ERANGE) name the file (what), the
 * layer and the field: "kv_config.json: layer 3: format: 'turbo:k9v3' ...". */
int kv_quant_config_parse(const char *text, size_t len, const char *what, int n_layers,
                          struct kv_quant *out, struct err *err);
/* kv_quant_config_parse of the file at path. */
int kv_quant_config_load(const char *path, int n_layers, struct kv_quant *out, struct err *err);

#endif
