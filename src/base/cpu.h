/* base/cpu.h — what the processor can do, detected once at run time. */
#ifndef INFERD_BASE_CPU_H
#define INFERD_BASE_CPU_H

#include <stdbool.h>

struct cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512_bf16;
    bool amx_tile, amx_bf16;  /* hardware support (CPUID) */
    bool amx_usable;          /* the kernel granted this process the AMX tile state */
    int n_cores;              /* online logical processors */
};

/* Detects features on first call (requesting AMX permission from the kernel
 * when the hardware has it) and returns the cached result afterwards.
 * INFERD_CPU=avx2|avx512|avx512bf16|amx in the environment caps the level
 * used, so every path can be exercised on a machine that has a higher one. */
const struct cpu_features *cpu_features(void);

/* "amx", "avx512bf16", "avx512", "avx2" or "scalar": the best level in use. */
const char *cpu_level_name(void);

#endif
