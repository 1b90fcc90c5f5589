/* base/dtype.h — element types of tensors on disk and in memory: dense floats and GGUF's block-quantized formats. */
#ifndef INFERD_BASE_DTYPE_H
#define INFERD_BASE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Dense types first; the block types store a row of n elements as n / block
 * elements blocks of block bytes each (GGUF's layouts, base/quant.h), so
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

/* Bytes per block (per element for the dense types). A switch rather than
 * a table: this header is compiled as C++ by nvcc as well. */
static inline size_t dtype_block_bytes(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return 4;
    case DTYPE_BF16: case DTYPE_F16: return 2;
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
    default: return 0;
    }
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
    default: return "?";
    }
}

#endif
