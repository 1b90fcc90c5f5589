/* fuzz/fuzz_kv_config.c — libFuzzer target: the per-layer kv_config.json reader on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kv/kv_quant_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the first byte picks the model's layer count, the rest is the file */
    int n_layers = size ? 1 + data[0] % 64 : 1;
    const char *text = size ? (const char *)data + 1 : "";
    size_t len = size ? size - 1 : 0;
    struct kv_quant q;
    struct err err = {0};
    if (kv_quant_config_parse(text, len, "kv_config.json", n_layers, &q, &err) == 0) {
        /* an accepted config covers every layer with a format the backends read */
        if (q.n_layers != n_layers || !q.per_layer)
            __builtin_trap();
        for (int l = 0; l < n_layers; l++) {
            const struct kv_quant_layer *x = &q.layer[l];
            if (x->scheme == KV_QUANT_AFFINE &&
                ((x->k_bits != 4 && x->k_bits != 8) || x->v_bits != x->k_bits ||
                 (x->group_size != 32 && x->group_size != 64)))
                __builtin_trap();
            if (x->scheme == KV_QUANT_TURBO && (x->k_bits < 2 || x->k_bits > 8 || x->v_bits < 2 ||
                                                x->v_bits > 8 || (x->qjl && x->k_bits > 5)))
                __builtin_trap();
            if (x->scheme > KV_QUANT_TURBO)
                __builtin_trap();
        }
    } else if (!err.msg[0] || strncmp(err.msg, "kv_config.json", 14) != 0) {
        __builtin_trap(); /* every refusal names the file */
    }
    return 0;
}
