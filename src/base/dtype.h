/* base/dtype.h — element types of tensors on disk and in memory. */
#ifndef INFERD_BASE_DTYPE_H
#define INFERD_BASE_DTYPE_H

#include <stddef.h>

enum dtype { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_F16 = 2 };

static inline size_t dtype_size(enum dtype t) { return t == DTYPE_F32 ? 4 : 2; }

static inline const char *dtype_name(enum dtype t)
{
    return t == DTYPE_F32 ? "F32" : t == DTYPE_BF16 ? "BF16" : "F16";
}

#endif
