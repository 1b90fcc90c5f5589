/* base/file.h — reading a small file whole, with a size limit and clear errors. */
#ifndef INFERD_BASE_FILE_H
#define INFERD_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

/* Reads the regular file path (at most cap bytes) into a malloc'd buffer with
 * a NUL after the last byte; *len_out gets its length. When missing is
 * non-NULL and the file does not exist, *missing is set, *out is NULL and 0
 * is returned without an error. */
int file_read_all(const char *path, size_t cap, char **out, size_t *len_out, bool *missing,
                  struct err *err);

#endif
