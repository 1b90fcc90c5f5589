/* base/cpu.h — what the processor can do, detected at run time, and caps on the instruction sets used. */
#ifndef INFERD_BASE_CPU_H
#define INFERD_BASE_CPU_H

#include <stdbool.h>

struct cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512_bf16;
    bool avx512_vnni;         /* vpdpbusd: the int8 dot products of quantized weights */
    bool avx_vnni;            /* vpdpbusd in VEX form on ymm, without AVX-512 (Alder Lake, Zen 5) */
    bool amx_tile, amx_bf16;  /* hardware support (CPUID) */
    bool amx_int8;            /* tdpbsud and kin: the quantized prefill GEMM's tiles (CPUID) */
    bool amx_usable;          /* the kernel granted this process the AMX tile state */
    int n_cores;              /* online logical processors */
};

/* Instruction-set levels, lowest first, as a cap on what is used, so every
 * path can be exercised on a machine that has a higher one. */
enum cpu_isa {
    CPU_ISA_BEST = 0,   /* no cap */
    CPU_ISA_SCALAR,     /* nothing past x86-64 (the CPU backend then refuses to start) */
    CPU_ISA_AVX2,       /* AVX2 + FMA */
    CPU_ISA_AVX512,     /* AVX-512 F/BW/VL */
    CPU_ISA_AVX512BF16, /* + AVX512-BF16 */
    CPU_ISA_AMX,        /* + AMX-BF16 and AMX-INT8: the same as no cap */
};

/* Detects the processor's features into out, reporting every level above cap
 * as absent. AMX tile state is requested from the kernel only when the
 * hardware has it and cap allows it. */
void cpu_features_detect(enum cpu_isa cap, struct cpu_features *out);

/* cpu_features_detect(CPU_ISA_BEST), run on the first call; the same result
 * afterwards. */
const struct cpu_features *cpu_features(void);

/* "amx", "avx512bf16", "avx512", "avx2" or "scalar": the best level f has. */
const char *cpu_level_name(const struct cpu_features *f);

/* "scalar", "avx2", "avx512", "avx512bf16" or "amx" into *out; false for
 * anything else. */
bool cpu_isa_parse(const char *text, enum cpu_isa *out);

#endif
