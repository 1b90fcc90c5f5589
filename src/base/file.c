/* base/file.c — reading a small file whole. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int file_read_all(const char *path, size_t cap, char **out, size_t *len_out, bool *missing,
                  struct err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (missing && errno == ENOENT) {
            *missing = true;
            return 0;
        }
        return err_set(err, INFERD_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, INFERD_EIO, "%s is not a readable regular file", path);
    }
    if ((uint64_t)st.st_size > cap) {
        close(fd);
        return err_set(err, INFERD_EFORMAT, "%s is %lld bytes (limit %zu)", path,
                       (long long)st.st_size, cap);
    }
    size_t len = (size_t)st.st_size, got = 0;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return err_set(err, INFERD_ENOMEM, "out of memory reading %s", path);
    }
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            free(buf);
            return err_set(err, INFERD_EIO, "short read on %s%s%s", path, e ? ": " : "",
                           e ? strerror(e) : "");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *out = buf;
    *len_out = len;
    return 0;
}
