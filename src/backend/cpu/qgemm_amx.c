/* backend/cpu/qgemm_amx.c — the quantized prefill GEMM on AMX-INT8 tiles (tdpbsud: signed weight codes against unsigned x codes), chosen only where CPUID reports AMX-INT8 and the kernel granted the tile state. */
#include <immintrin.h>

#include "backend/cpu/qgemm.h"

#define QGEMM_TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define QGEMM_TILE_ZERO(t) _tile_zero(t)
#define QGEMM_TILE_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define QGEMM_TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define QGEMM_TILE_STORE(t, p, stride) _tile_stored(t, p, stride)
#define QGEMM_TILE_RELEASE() _tile_release()
#define QGEMM_AMX_KERNEL gemm_amx

#include "backend/cpu/qgemm_amx_body.h"

const qgemm_fn cpu_qgemm_amx = gemm_amx;
