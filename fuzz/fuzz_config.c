/* fuzz/fuzz_config.c — libFuzzer target: config.json and generation_config.json parsing on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct model_config cfg;
    struct err err = {0};
    if (model_config_parse((const char *)data, size, &cfg, &err) == 0) {
        /* Accepted configs must satisfy the invariants the loader relies on. */
        if (cfg.head_dim <= 0 || cfg.head_dim % 2 || cfg.n_kv_heads <= 0 ||
            cfg.n_heads % cfg.n_kv_heads || cfg.n_eos > CONFIG_MAX_EOS || !(cfg.rope_theta > 0))
            __builtin_trap();
        float inv_freq[512];
        model_rope_inv_freq(&cfg, inv_freq);
    }
    struct generation_defaults gen;
    generation_defaults_init(&gen);
    generation_config_parse((const char *)data, size, &gen, &err);
    return 0;
}
