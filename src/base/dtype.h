/* base/dtype.h — element types of tensors on disk and in memory: dense floats and GGUF's block-quantized formats. */
#ifndef INFERD_BASE_DTYPE_H
#define INFERD_BASE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Dense types first; the block types store a row of n elements as n / block
 * elements blocks of block bytes each (GGUF's layouts, model/quant.h), so
 * their size is per block, never per element: use dtype_row_bytes for them. */
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
    DTYPE_COUNT
};

static inline bool dtype_is_block(enum dtype t) { return t > DTYPE_F16 && t < DTYPE_COUNT; }

/* Elements per block: 1 for the dense types, 32 for Q*_0/Q*_1, 256 for the K types. */
static inline int dtype_block_elems(enum dtype t)
{
    return t <= DTYPE_F16 ? 1 : t <= DTYPE_Q5_1 ? 32 : 256;
}

/* Bytes per block (per element for the dense types). */
static inline size_t dtype_block_bytes(enum dtype t)
{
    static const unsigned char bytes[DTYPE_COUNT] = {
        [DTYPE_F32] = 4,    [DTYPE_BF16] = 2,   [DTYPE_F16] = 2,    [DTYPE_Q8_0] = 34,
        [DTYPE_Q4_0] = 18,  [DTYPE_Q4_1] = 20,  [DTYPE_Q5_0] = 22,  [DTYPE_Q5_1] = 24,
        [DTYPE_Q2_K] = 84,  [DTYPE_Q3_K] = 110, [DTYPE_Q4_K] = 144, [DTYPE_Q5_K] = 176,
        [DTYPE_Q6_K] = 210,
    };
    return t < DTYPE_COUNT ? bytes[t] : 0;
}

/* Bytes of one element of a dense type; 0 for a block type, whose elements
 * have no size of their own. */
static inline size_t dtype_size(enum dtype t)
{
    return dtype_is_block(t) ? 0 : dtype_block_bytes(t);
}

/* Bytes of n elements (n a multiple of the block size for a block type). */
static inline uint64_t dtype_row_bytes(enum dtype t, uint64_t n)
{
    return n / (uint64_t)dtype_block_elems(t) * dtype_block_bytes(t);
}

static inline const char *dtype_name(enum dtype t)
{
    static const char *const names[DTYPE_COUNT] = {
        [DTYPE_F32] = "F32",   [DTYPE_BF16] = "BF16", [DTYPE_F16] = "F16",
        [DTYPE_Q8_0] = "Q8_0", [DTYPE_Q4_0] = "Q4_0", [DTYPE_Q4_1] = "Q4_1",
        [DTYPE_Q5_0] = "Q5_0", [DTYPE_Q5_1] = "Q5_1", [DTYPE_Q2_K] = "Q2_K",
        [DTYPE_Q3_K] = "Q3_K", [DTYPE_Q4_K] = "Q4_K", [DTYPE_Q5_K] = "Q5_K",
        [DTYPE_Q6_K] = "Q6_K",
    };
    return t < DTYPE_COUNT ? names[t] : "?";
}

#endif
