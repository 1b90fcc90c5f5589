/* model/lora.h — PEFT LoRA adapters of a loaded model: read and checked against its base, held in backend memory, reference-counted; or merged into the weights once at start-up. */
#ifndef INFERD_MODEL_LORA_H
#define INFERD_MODEL_LORA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* The projections an adapter may target, per layer. Phi-3's fused qkv_proj
 * and gate_up_proj are split into Q, K, V and GATE, UP (one A, B's rows split). */
enum lora_target { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_TARGETS };

/* An adapter on one model's backend. Shared by every request that names it:
 * the mount holds one reference, each running sequence one more; the last
 * release frees its backend memory. */
struct lora_adapter {
    int rank;
    float alpha, scale;      /* scale = alpha / rank, or alpha / sqrt(rank) with rsLoRA */
    bool rslora;
    bool bf16;               /* A and B kept in bf16 (FAST mode over bf16 weights), else f32 */
    int n_layers;
    struct lora_pair *pairs; /* owned; n_layers * LORA_N_TARGETS, a == NULL: not targeted */
    int mounted_modules;     /* modules of the base the adapter changes (layers x modules) */
    uint64_t digest;         /* its content (adapter_model.safetensors and the scale):
                                the prefix cache's namespace mixes it in */
    uint64_t file_bytes;     /* adapter_model.safetensors's size */
    uint64_t ram_bytes;      /* backend bytes it holds */
    char base_model[256];    /* adapter_config.json's base_model_name_or_path, or "" */
    struct backend *be;      /* borrowed */
    void **bufs;             /* owned backend memory */
    int n_bufs;
    atomic_int refs;
};

/* Reads DIR/adapter_config.json and DIR/adapter_model.safetensors and checks
 * them against m: r, lora_alpha, target_modules (a list of module names, or a
 * regular expression a module's full name must match), use_rslora,
 * fan_in_fan_out and bias "none" only (no DoRA, no rank or alpha patterns, no
 * modules_to_save); every tensor a lora_A / lora_B of a projection the base
 * has (q/k/v/o, gate/up/down, or Phi-3's qkv_proj and gate_up_proj), of shape
 * rank x in and out x rank; every target module matches some projection.
 * -INFERD_EFORMAT (or EIO, ENOMEM, EUNSUPPORTED for a backend without the
 * lora op) with a message naming what is wrong. *out holds one reference. */
int lora_load(const struct model *m, const char *dir, struct lora_adapter **out,
              struct err *err);
void lora_retain(struct lora_adapter *a);
/* Drops one reference; the last frees. NULL is ignored. */
void lora_release(struct lora_adapter *a);

/* W += scale * B A for every projection a targets, into f32 copies of those
 * matrices in backend memory (the model owns them): the adapter is then part
 * of the weights (--merge-adapter; and the reference the unit tests compare
 * the unmerged path with). -INFERD_EUNSUPPORTED for block-quantized weights. */
int lora_merge(struct model *m, const struct lora_adapter *a, struct err *err);

#endif
