/* tests/unit/test_support.h — helpers shared by the unit tests: temp dirs, files, model fixtures. */
#ifndef INFERD_TEST_SUPPORT_H
#define INFERD_TEST_SUPPORT_H

#include <stddef.h>

#include "backend/backend.h"

/* A fresh directory under the system temp dir; the returned string is static per call site
 * only until the next call. Caller removes it with test_rmtree. */
char *test_mkdtemp(void);
void test_rmtree(const char *path);
int test_write_file(const char *path, const void *data, size_t len);
/* Reads a whole file; *len_out gets its size. Caller frees. NULL on error. */
char *test_read_file(const char *path, size_t *len_out);
/* A CPU backend of two threads in mode; fails the test when it cannot be made. */
struct backend *test_cpu_backend(enum compute_mode mode);

#endif
