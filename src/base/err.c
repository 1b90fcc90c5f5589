/* base/err.c — filling and wrapping struct err. */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int err_set(struct err *err, int code, const char *fmt, ...)
{
    if (code < 0)
        code = -code;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -code;
}

int err_wrap(struct err *err, const char *fmt, ...)
{
    if (!err)
        return -INFERD_EINVAL;
    char prefix[256];
    char old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    if (err->code == 0)
        err->code = INFERD_EINVAL;
    return -err->code;
}

void err_clear(struct err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

const char *err_code_name(int code)
{
    if (code < 0)
        code = -code;
    switch (code) {
    case INFERD_OK: return "ok";
    case INFERD_EINVAL: return "invalid";
    case INFERD_ENOMEM: return "out of memory";
    case INFERD_EIO: return "i/o";
    case INFERD_EFORMAT: return "format";
    case INFERD_EUNSUPPORTED: return "unsupported";
    case INFERD_ERANGE: return "range";
    case INFERD_EBUSY: return "busy";
    case INFERD_EEXIST: return "exists";
    case INFERD_ENOENT: return "not found";
    case INFERD_ECORRUPT: return "corrupt";
    default: return "unknown";
    }
}
