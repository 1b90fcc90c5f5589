/* base/cpu.c — CPUID/XGETBV feature detection, instruction-set caps and the AMX permission request. */
#include "base/cpu.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* The uncapped features: facts of the machine, detected once. */
static struct cpu_features detected;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux keeps AMX tile data disabled until the process asks for it. */
static bool request_amx_permission(void)
{
    unsigned long bitmask = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return false;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) != 0)
        return false;
    return (bitmask & (1ul << XFEATURE_XTILEDATA)) != 0;
}

void cpu_features_detect(enum cpu_isa cap, struct cpu_features *out)
{
    struct cpu_features f;
    memset(&f, 0, sizeof f);
    unsigned a, b, c, d;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    f.n_cores = n > 0 ? (int)n : 1;

    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        *out = f;
        return;
    }
    bool osxsave = (c >> 27) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    bool os_avx = (xcr0 & 0x6) == 0x6;
    bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
    bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);

    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = os_avx && ((b >> 5) & 1) && f.fma;
    f.avx512f = os_avx512 && ((b >> 16) & 1);
    f.avx512bw = f.avx512f && ((b >> 30) & 1);
    f.avx512vl = f.avx512f && ((b >> 31) & 1);
    f.avx512_vnni = f.avx512vl && ((c >> 11) & 1);
    f.amx_bf16 = os_amx && ((d >> 22) & 1);
    f.amx_tile = os_amx && ((d >> 24) & 1);
    f.amx_int8 = os_amx && ((d >> 25) & 1);
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512bw && ((a >> 5) & 1);
    f.avx_vnni = f.avx2 && ((a >> 4) & 1);

    if (cap != CPU_ISA_BEST) {
        if (cap < CPU_ISA_AMX)
            f.amx_tile = f.amx_bf16 = f.amx_int8 = false;
        if (cap < CPU_ISA_AVX512BF16)
            f.avx512_bf16 = false;
        if (cap < CPU_ISA_AVX512)
            f.avx512f = f.avx512bw = f.avx512vl = f.avx512_vnni = false;
        if (cap < CPU_ISA_AVX2)
            f.avx2 = f.fma = f.avx_vnni = false;
    }
    if (f.amx_tile && (f.amx_bf16 || f.amx_int8))
        f.amx_usable = request_amx_permission();
    *out = f;
}

static void detect_best(void) { cpu_features_detect(CPU_ISA_BEST, &detected); }

const struct cpu_features *cpu_features(void)
{
    pthread_once(&detect_once, detect_best);
    return &detected;
}

const char *cpu_level_name(const struct cpu_features *f)
{
    if (f->amx_usable)
        return "amx";
    if (f->avx512_bf16)
        return "avx512bf16";
    if (f->avx512bw)
        return "avx512";
    if (f->avx2)
        return "avx2";
    return "scalar";
}

bool cpu_isa_parse(const char *text, enum cpu_isa *out)
{
    static const char *const names[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(text, names[i])) {
            *out = (enum cpu_isa)(CPU_ISA_SCALAR + i);
            return true;
        }
    return false;
}
