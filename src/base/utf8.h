/* base/utf8.h — UTF-8 validation and code-point-safe cut points for streamed text. */
#ifndef INFERD_BASE_UTF8_H
#define INFERD_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
bool utf8_valid(const unsigned char *s, size_t n);

/* Moves cut (<= n) back so that s[0, cut) ends on a code-point boundary and
 * an incomplete sequence at the end of s is not released: what a streaming
 * filter may emit now, holding the rest back for the next piece. */
size_t utf8_safe_cut(const unsigned char *s, size_t n, size_t cut);

#endif
