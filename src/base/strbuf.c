/* base/strbuf.c — growable byte string. */
#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool strbuf_reserve(struct strbuf *b, size_t extra)
{
    if (b->failed)
        return false;
    if (extra > (size_t)-1 / 2 - b->len || (b->limit && b->len + extra > b->limit)) {
        b->failed = true;
        return false;
    }
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

bool strbuf_append(struct strbuf *b, const char *s, size_t len)
{
    if (!strbuf_reserve(b, len))
        return false;
    if (len)
        memcpy(b->data + b->len, s, len);
    b->len += len;
    b->data[b->len] = '\0';
    return true;
}

bool strbuf_putc(struct strbuf *b, char c)
{
    return strbuf_append(b, &c, 1);
}

bool strbuf_puts(struct strbuf *b, const char *s)
{
    return strbuf_append(b, s, strlen(s));
}

bool strbuf_printf(struct strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !strbuf_reserve(b, (size_t)n))
        return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void strbuf_consume(struct strbuf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data)
        b->data[b->len] = '\0';
}

void strbuf_reset(struct strbuf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data)
        b->data[0] = '\0';
}

char *strbuf_take(struct strbuf *b, size_t *len)
{
    char *s = b->data;
    size_t n = b->len;
    if (b->failed) {
        free(s);
        s = NULL;
    } else if (!s) {
        s = calloc(1, 1);
    }
    size_t limit = b->limit;
    *b = (struct strbuf){.limit = limit};
    if (len)
        *len = s ? n : 0;
    return s;
}

void strbuf_free(struct strbuf *b)
{
    free(b->data);
    *b = (struct strbuf){0};
}
