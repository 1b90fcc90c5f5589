/* engine/stop.h — stop strings matched on streamed decoded text, across token boundaries. */
#ifndef INFERD_ENGINE_STOP_H
#define INFERD_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

#define STOP_MAX_STRINGS 16
#define STOP_MAX_LEN 256

struct stop_matcher;

/* Copies up to STOP_MAX_STRINGS stop strings (each 1..STOP_MAX_LEN bytes of
 * valid UTF-8, NUL-terminated). n == 0 gives a matcher that passes text
 * through. -INFERD_EINVAL / -INFERD_ERANGE on bad stops, -INFERD_ENOMEM. */
int stop_matcher_create(const char *const *stops, int n, struct stop_matcher **out,
                        struct err *err);
void stop_matcher_free(struct stop_matcher *m);

/* Feeds newly decoded text. *emit (owned by m, valid until the next call)
 * receives the text that can no longer be part of a stop string; a suffix
 * that could still start one is held back, always cut on a code-point
 * boundary (an incomplete trailing sequence is held back too).
 * When a stop string completes, *stopped is set and *emit ends just before
 * it; nothing after it is ever emitted. The stop that completes first wins;
 * of two completing on the same byte, the one starting earlier (the longer).
 * After a stop, pushes emit nothing and keep *stopped set. */
int stop_matcher_push(struct stop_matcher *m, const char *text, size_t len, const char **emit,
                      size_t *emit_len, bool *stopped, struct err *err);

/* End of generation: emits the held-back tail (nothing after a stop). */
int stop_matcher_flush(struct stop_matcher *m, const char **emit, size_t *emit_len,
                       struct err *err);

/* Index of the stop string that matched, or -1. */
int stop_matcher_which(const struct stop_matcher *m);

#endif
