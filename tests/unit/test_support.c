/* tests/unit/test_support.c — temp dirs and file helpers for the unit tests. */
#define _GNU_SOURCE
#include "test_support.h"

#include <criterion/criterion.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *test_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/inferd-test-XXXXXX", base && *base ? base : "/tmp");
    char *dir = mkdtemp(tmpl);
    return dir ? strdup(dir) : NULL;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

void test_rmtree(const char *path)
{
    if (path)
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, len, f);
    fclose(f);
    return w == len ? 0 : -1;
}

char *test_read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len_out)
            *len_out = (size_t)n;
    }
    return buf;
}

struct backend *test_cpu_backend(enum compute_mode mode)
{
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode, .threads = 2}, &be,
                                    &err),
                 0, "%s", err.msg);
    return be;
}
