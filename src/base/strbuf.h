/* base/strbuf.h — the growable byte string: responses, tokenizer text, template output, held-back stream tails. */
#ifndef INFERD_BASE_STRBUF_H
#define INFERD_BASE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

/* A zeroed struct is an empty buffer with no limit. Appends are all-or-nothing:
 * one that fails changes nothing but sets failed, and every later append is
 * dropped, so a caller may append many times and check failed once. */
struct strbuf {
    char *data;   /* owned; NUL-terminated when non-NULL; NULL until the first append */
    size_t len, cap;
    size_t limit; /* 0: none; otherwise len never passes it (an append that would, fails) */
    bool failed;  /* an allocation failed or the limit was reached */
};

/* Room for extra more bytes (plus the NUL) without another allocation. */
bool strbuf_reserve(struct strbuf *b, size_t extra);
bool strbuf_append(struct strbuf *b, const char *s, size_t len);
bool strbuf_putc(struct strbuf *b, char c);
bool strbuf_puts(struct strbuf *b, const char *s);
bool strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void strbuf_consume(struct strbuf *b, size_t n);
/* Empties b but keeps its memory (and limit) for reuse; clears failed. */
void strbuf_reset(struct strbuf *b);
/* Hands the bytes to the caller (malloc'd, NUL-terminated; NULL when b had
 * failed or memory ran out; len may be NULL) and leaves b empty, limit kept. */
char *strbuf_take(struct strbuf *b, size_t *len);
void strbuf_free(struct strbuf *b);

#endif
