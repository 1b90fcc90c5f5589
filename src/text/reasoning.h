/* text/reasoning.h — splits generated text into reasoning (inside <think>…</think>) and content, streaming. */
#ifndef INFERD_TEXT_REASONING_H
#define INFERD_TEXT_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

#define REASONING_TAG_MAX 64

struct reasoning_opts {
    const char *start_tag; /* NULL: "<think>"; 1..REASONING_TAG_MAX bytes */
    const char *end_tag;   /* NULL: "</think>"; 1..REASONING_TAG_MAX bytes */
    bool starts_inside;    /* the prompt ended inside an open start tag */
};

/* One push's output; both pointers are owned by the splitter and valid until
 * its next call. Tags themselves appear in neither; whitespace around them is
 * passed on exactly as generated. */
struct reasoning_delta {
    const char *reasoning;
    size_t reasoning_len;
    const char *content;
    size_t content_len;
};

struct reasoning_splitter;

/* opts may be NULL (default tags, starting outside). */
int reasoning_splitter_create(const struct reasoning_opts *opts, struct reasoning_splitter **out,
                              struct err *err);
void reasoning_splitter_free(struct reasoning_splitter *r);

/* Feeds decoded text. A suffix that could be the start of the next tag is
 * held back (cut on a code-point boundary) until later text decides it. */
int reasoning_splitter_push(struct reasoning_splitter *r, const char *text, size_t len,
                            struct reasoning_delta *out, struct err *err);

/* End of generation: the held-back tail goes where the text currently is
 * (reasoning inside an unclosed start tag, content otherwise). */
int reasoning_splitter_flush(struct reasoning_splitter *r, struct reasoning_delta *out,
                             struct err *err);

/* True while the stream is inside a reasoning block. */
bool reasoning_splitter_inside(const struct reasoning_splitter *r);

/* Whole-text split with the default tags. *reasoning and *content are
 * malloc'd, NUL-terminated, owned by the caller; lengths exclude the NUL. */
int reasoning_split_all(const char *text, size_t len, bool starts_inside, char **reasoning,
                        size_t *reasoning_len, char **content, size_t *content_len,
                        struct err *err);

#endif
