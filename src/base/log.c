/* base/log.c — leveled logging to stderr. */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

static _Atomic int current_level = LOG_INFO;

void log_set_level(enum log_level level) { current_level = level; }

void log_msg(enum log_level level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if ((int)level < current_level)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "inferd %s: %s\n", names[level], line);
}
