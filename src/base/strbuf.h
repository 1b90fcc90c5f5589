/* base/strbuf.h — a growable byte string for building responses. */
#ifndef INFERD_BASE_STRBUF_H
#define INFERD_BASE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf {
    char *data; /* owned; NUL-terminated when non-NULL */
    size_t len, cap;
    bool failed; /* an allocation failed; later appends are dropped */
};

bool strbuf_append(struct strbuf *b, const char *s, size_t len);
bool strbuf_puts(struct strbuf *b, const char *s);
bool strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void strbuf_consume(struct strbuf *b, size_t n);
void strbuf_free(struct strbuf *b);

#endif
