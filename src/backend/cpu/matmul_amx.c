/* backend/cpu/matmul_amx.c — AMX-BF16 GEMM for FAST-mode prefill with bf16 weights: 32x32 output tiles from 16x16 f32 accumulator tiles. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/vec_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Tile registers: 0-3 hold a 2x2 block of 16x16 f32 results, 4-5 two 16-row
 * slices of x (16 tokens x 32 bf16), 6-7 two 16-column slices of W (16 K-pairs
 * x 16 columns x 2 bf16). All eight are 16 rows of 64 bytes. Each K step of
 * 32 then does 4 tile loads for 4 tile products, the most reuse 8 tiles allow.
 * KC = 512 makes the W panel (32 x 512 bf16 = 32 KiB) fit L1 and halves the
 * per-call result spill against KC = 256; MC = 256 tokens keep the x block
 * (256 KiB) in the 2 MiB L2. */
#define MR 32
#define NR 32
#define KC 512
#define MC 256
#define K_STEP 32 /* bf16 per tile row: 64 bytes */

/* The 64-byte LDTILECFG operand, palette 1. */
struct tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* A constant in memory on purpose: GCC's _tile_loadconfig tells the
 * compiler it reads only 8 bytes, so the rows and colsb stores of a stack
 * copy can be optimised away, leaving the tiles unconfigured (#UD). */
static const struct tile_config amx_config = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static void amx_thread_begin(void) { _tile_loadconfig(&amx_config); }

static void amx_thread_end(void) { _tile_release(); }

/* Panels of 32 token rows, each row k bf16 zero-padded to kpad (a multiple
 * of 32): plain row-major, so a 16-row slice at column kb is one tile load
 * with stride kpad * 2 bytes. Rows past m are zero. */
static void pack_x(const float *x, int64_t ldx, int m, int k, bool round, void *dst_)
{
    uint16_t *dst = dst_;
    int kpad = (k + K_STEP - 1) / K_STEP * K_STEP;
    (void)round; /* always rounded: AMX runs only in FAST mode */
    for (int p = 0; p < m; p += MR) {
        uint16_t *d = dst + (size_t)(p / MR) * MR * (size_t)kpad;
        for (int i = 0; i < MR; i++) {
            uint16_t *di = d + (size_t)i * kpad;
            if (p + i >= m) {
                memset(di, 0, (size_t)kpad * 2);
                continue;
            }
            const float *xi = x + (p + i) * ldx;
            for (int c = 0; c < kpad; c += 16) {
                __m512 v = _mm512_maskz_loadu_ps(mask16(k - c), xi + c);
                _mm256_storeu_si256((__m256i *)(di + c), _mm512_cvtepi32_epi16(bf16_bits(v)));
            }
        }
    }
}

/* The vdpbf16ps layout, [pair][32 columns] 32-bit words, is exactly two B
 * tiles side by side (stride 128 bytes); pairs up to kpad / 2 are zeroed. */
static void pack_w(const void *w, enum dtype dtype, int64_t ldw, int n, int k, void *dst)
{
    int pairs = (k + 1) / 2;
    int kpad = (k + K_STEP - 1) / K_STEP * K_STEP;
    cpu_mm_pack_w_bf16_pairs32(w, dtype, ldw, n, k, dst);
    memset((uint32_t *)dst + (size_t)pairs * NR, 0, (size_t)(kpad / 2 - pairs) * NR * 4);
}

/* The four result tiles go through a stack buffer, then are added to y
 * (or to the bias on the first K block) under column masks. */
static void kernel(int m, int n, int k, const void *a_, const void *b_, float *c, int64_t ldc,
                   const float *bias, bool first)
{
    const uint16_t *a = a_;
    const uint32_t *b = b_;
    int kpad = (k + K_STEP - 1) / K_STEP * K_STEP;
    size_t a_stride = (size_t)kpad * 2;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int kb = 0; kb < kpad; kb += K_STEP) {
        const uint32_t *bk = b + (size_t)(kb / 2) * NR;
        _tile_loadd(4, a + kb, a_stride);
        _tile_loadd(5, a + (size_t)16 * kpad + kb, a_stride);
        _tile_loadd(6, bk, NR * 4);
        _tile_loadd(7, bk + 16, NR * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float out[MR][NR] __attribute__((aligned(64)));
    _tile_stored(0, &out[0][0], NR * 4);
    _tile_stored(1, &out[0][16], NR * 4);
    _tile_stored(2, &out[16][0], NR * 4);
    _tile_stored(3, &out[16][16], NR * 4);

    __mmask16 k0 = mask16(n), k1 = mask16(n - 16);
    for (int i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        __m512 c0, c1;
        if (first) {
            c0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
            c1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
        } else {
            c0 = _mm512_maskz_loadu_ps(k0, ci);
            c1 = _mm512_maskz_loadu_ps(k1, ci + 16);
        }
        _mm512_mask_storeu_ps(ci, k0, _mm512_add_ps(c0, _mm512_load_ps(out[i])));
        _mm512_mask_storeu_ps(ci + 16, k1, _mm512_add_ps(c1, _mm512_load_ps(out[i] + 16)));
    }
}

const struct mm_gemm cpu_mm_gemm_amx = {
    .mr = MR, .nr = NR, .kc = KC, .mc = MC, .k_align = K_STEP,
    .a_elem = 2, .b_elem = 2,
    .thread_begin = amx_thread_begin, .thread_end = amx_thread_end,
    .pack_x = pack_x, .pack_w = pack_w, .kernel = kernel,
};
