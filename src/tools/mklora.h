/* tools/mklora.h — writes a deterministic random PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) for a model directory, for tests and benchmarks. */
#ifndef INFERD_TOOLS_MKLORA_H
#define INFERD_TOOLS_MKLORA_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

struct mklora_opts {
    const char *model_dir; /* the base: its config.json decides names and shapes */
    const char *out_dir;   /* created if missing; its two files are overwritten */
    int rank;              /* r, 1..256 */
    double alpha;          /* lora_alpha */
    bool rslora;           /* use_rslora */
    /* comma-separated module names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj;
     * Phi-3: qkv_proj,gate_up_proj,o_proj,down_proj), or NULL: every projection the
     * architecture has; "regex:PATTERN" writes target_modules as that regular
     * expression and targets the projections it fully matches */
    const char *targets;
    uint64_t seed;
};

/* Writes the adapter: lora_A uniform in +-1/sqrt(in), lora_B uniform in +-0.5/sqrt(r)
 * (PEFT starts B at zero; a random B makes the adapter change the output), f32, drawn
 * from seed and each tensor's name. -INFERD_EINVAL for a bad rank or target list. */
int mklora_write(const struct mklora_opts *o, struct err *err);

#endif
