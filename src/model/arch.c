/* model/arch.c — the model families inferd runs, and which one runs a config's architecture. */
#include "model/arch.h"

/* One line per family; a new family adds its table here. */
static const struct arch *const families[] = {
    &arch_llama,
    &arch_qwen3_moe,
    &arch_gemma3,
    &arch_phi3,
};

const struct arch *arch_find(enum model_arch a)
{
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (int i = 0; i < families[f]->n_serves; i++)
            if (families[f]->serves[i] == a)
                return families[f];
    return NULL;
}
