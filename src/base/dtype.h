/* base/dtype.h — element types of tensors on disk and in memory: dense floats and GGUF's block-quantized formats. */
#ifndef INFERD_BASE_DTYPE_H
#define INFERD_BASE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Dense types first; the block types store a row of n elements as n / block
 * elements blocks of block bytes each (GGUF's layouts and MLX's affine
 * groups, base/quant.h), so their size is per block, never per element: use
 * dtype_row_bytes for them. DTYPE_U32 follows them: raw words (MLX's packed
 * weights as a safetensors file holds them, before the loader groups them);
 * last, a backend's own layout of BF16 weights. */
enum dtype {
    DTYPE_F32 = 0,
    DTYPE_BF16 = 1,
    DTYPE_F16 = 2,
    DTYPE_Q8_0,
    DTYPE_Q4_0,
    DTYPE_Q4_1,
    DTYPE_Q5_0,
    DTYPE_Q5_1,
    DTYPE_Q2_K,
    DTYPE_Q3_K,
    DTYPE_Q4_K,
    DTYPE_Q5_K,
    DTYPE_Q6_K,
    /* MLX's affine groups: bits 4 or 8, a group of 32, 64 or 128 elements,
     * its scale and bias in BF16, F16 or F32 (as the file stores them); in
     * that order, so dtype_mlx_* compute them from the offset. */
    DTYPE_MLX4_G32_BF16, DTYPE_MLX4_G32_F16, DTYPE_MLX4_G32_F32,
    DTYPE_MLX4_G64_BF16, DTYPE_MLX4_G64_F16, DTYPE_MLX4_G64_F32,
    DTYPE_MLX4_G128_BF16, DTYPE_MLX4_G128_F16, DTYPE_MLX4_G128_F32,
    DTYPE_MLX8_G32_BF16, DTYPE_MLX8_G32_F16, DTYPE_MLX8_G32_F32,
    DTYPE_MLX8_G64_BF16, DTYPE_MLX8_G64_F16, DTYPE_MLX8_G64_F32,
    DTYPE_MLX8_G128_BF16, DTYPE_MLX8_G128_F16, DTYPE_MLX8_G128_F32,
    DTYPE_U32,
    /* BF16 laid out by a backend for its kernels, never on disk: panels of 32
     * rows, each column pair of a panel one 128-byte line (rows 0-15's pairs,
     * then rows 16-31's), rows past the matrix's last and an odd K's last
     * column zero. A row-major matrix's first r rows are the first r / 32
     * panels when r is a multiple of 32 (dtype_row_bytes), so such row views
     * still work. base/panels.h packs and reads them. */
    DTYPE_BF16_P32,
    DTYPE_COUNT
};

static inline bool dtype_is_block(enum dtype t) { return t > DTYPE_F16 && t < DTYPE_U32; }

static inline bool dtype_is_mlx(enum dtype t)
{
    return t >= DTYPE_MLX4_G32_BF16 && t <= DTYPE_MLX8_G128_F32;
}

/* An MLX type's bits (4, 8), group size (32, 64, 128) and scale/bias type. */
static inline int dtype_mlx_bits(enum dtype t) { return (t - DTYPE_MLX4_G32_BF16) / 9 ? 8 : 4; }
static inline int dtype_mlx_group(enum dtype t) { return 32 << ((t - DTYPE_MLX4_G32_BF16) / 3 % 3); }
static inline enum dtype dtype_mlx_scale(enum dtype t)
{
    int k = (t - DTYPE_MLX4_G32_BF16) % 3;
    return k == 0 ? DTYPE_BF16 : k == 1 ? DTYPE_F16 : DTYPE_F32;
}

/* The MLX type of bits, group and scale type, or DTYPE_COUNT when there is none. */
static inline enum dtype dtype_mlx(int bits, int group, enum dtype scale)
{
    int b = bits == 4 ? 0 : bits == 8 ? 1 : -1;
    int g = group == 32 ? 0 : group == 64 ? 1 : group == 128 ? 2 : -1;
    int k = scale == DTYPE_BF16 ? 0 : scale == DTYPE_F16 ? 1 : scale == DTYPE_F32 ? 2 : -1;
    if (b < 0 || g < 0 || k < 0)
        return DTYPE_COUNT;
    return (enum dtype)(DTYPE_MLX4_G32_BF16 + b * 9 + g * 3 + k);
}

/* Elements per block: 1 for the dense types, 32 for Q*_0/Q*_1, 256 for the
 * K types, the group for the MLX types. */
static inline int dtype_block_elems(enum dtype t)
{
    if (dtype_is_mlx(t))
        return dtype_mlx_group(t);
    return t <= DTYPE_F16 || t >= DTYPE_U32 ? 1 : t <= DTYPE_Q5_1 ? 32 : 256;
}

/* Bytes per block (per element for the dense types). A switch rather than
 * a table: this header is compiled as C++ by nvcc as well. */
static inline size_t dtype_block_bytes(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return 4;
    case DTYPE_BF16: case DTYPE_F16: case DTYPE_BF16_P32: return 2;
    case DTYPE_Q8_0: return 34;
    case DTYPE_Q4_0: return 18;
    case DTYPE_Q4_1: return 20;
    case DTYPE_Q5_0: return 22;
    case DTYPE_Q5_1: return 24;
    case DTYPE_Q2_K: return 84;
    case DTYPE_Q3_K: return 110;
    case DTYPE_Q4_K: return 144;
    case DTYPE_Q5_K: return 176;
    case DTYPE_Q6_K: return 210;
    case DTYPE_U32: return 4;
    default:
        if (dtype_is_mlx(t)) /* scale, bias, then the packed words */
            return 2 * (dtype_mlx_scale(t) == DTYPE_F32 ? 4 : 2) +
                   (size_t)(dtype_mlx_group(t) * dtype_mlx_bits(t) / 8);
        return 0;
    }
}

/* Bytes of one element of a dense type; 0 for a block type, whose elements
 * have no size of their own. */
static inline size_t dtype_size(enum dtype t)
{
    return dtype_is_block(t) ? 0 : dtype_block_bytes(t);
}

/* Bytes of n elements (n a multiple of the block size for a block type); for
 * panels, a row's share of its panel (columns padded to pairs). */
static inline uint64_t dtype_row_bytes(enum dtype t, uint64_t n)
{
    if (t == DTYPE_BF16_P32)
        return (n + 1) / 2 * 4;
    return n / (uint64_t)dtype_block_elems(t) * dtype_block_bytes(t);
}

static inline const char *dtype_name(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return "F32";
    case DTYPE_BF16: return "BF16";
    case DTYPE_F16: return "F16";
    case DTYPE_Q8_0: return "Q8_0";
    case DTYPE_Q4_0: return "Q4_0";
    case DTYPE_Q4_1: return "Q4_1";
    case DTYPE_Q5_0: return "Q5_0";
    case DTYPE_Q5_1: return "Q5_1";
    case DTYPE_Q2_K: return "Q2_K";
    case DTYPE_Q3_K: return "Q3_K";
    case DTYPE_Q4_K: return "Q4_K";
    case DTYPE_Q5_K: return "Q5_K";
    case DTYPE_Q6_K: return "Q6_K";
    case DTYPE_U32: return "U32";
    case DTYPE_BF16_P32: return "BF16 (panels of 32 rows)";
    default: break;
    }
    if (dtype_is_mlx(t)) {
        static const char *const names[] = {
            "MLX4_G32_BF16",  "MLX4_G32_F16",  "MLX4_G32_F32",  "MLX4_G64_BF16",
            "MLX4_G64_F16",   "MLX4_G64_F32",  "MLX4_G128_BF16", "MLX4_G128_F16",
            "MLX4_G128_F32",  "MLX8_G32_BF16", "MLX8_G32_F16",  "MLX8_G32_F32",
            "MLX8_G64_BF16",  "MLX8_G64_F16",  "MLX8_G64_F32",  "MLX8_G128_BF16",
            "MLX8_G128_F16",  "MLX8_G128_F32"};
        return names[t - DTYPE_MLX4_G32_BF16];
    }
    return "?";
}

#endif
