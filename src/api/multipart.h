/* api/multipart.h — multipart/form-data bodies (RFC 7578) split into their parts, binary-safe,
 * without copying the parts' data. */
#ifndef INFERD_API_MULTIPART_H
#define INFERD_API_MULTIPART_H

#include <stddef.h>

#include "base/err.h"

#define MULTIPART_MAX_PARTS 64
#define MULTIPART_MAX_BOUNDARY 70 /* RFC 2046 §5.1.1 */
#define MULTIPART_MAX_NAME 256    /* name and filename, with the NUL */
#define MULTIPART_MAX_TYPE 128    /* a part's Content-Type, with the NUL */
#define MULTIPART_MAX_HEADERS 8192 /* one part's header block */

struct multipart_part {
    char name[MULTIPART_MAX_NAME];         /* Content-Disposition: form-data; name="…" */
    char filename[MULTIPART_MAX_NAME];     /* filename="…"; "" when absent */
    char content_type[MULTIPART_MAX_TYPE]; /* the part's Content-Type; "" when absent */
    const char *data;                      /* borrowed: points into the body; data_len bytes */
    size_t data_len;
};

struct multipart_form {
    struct multipart_part *parts; /* owned; n_parts entries, in body order */
    size_t n_parts;
};

/* The boundary named by a Content-Type header value
 * ("multipart/form-data; boundary=…", the parameter quoted or not), copied into
 * out (MULTIPART_MAX_BOUNDARY + 1 bytes). Returns 0, or -INFERD_EINVAL when the
 * type is not multipart/form-data or has no valid boundary. */
int multipart_boundary(const char *content_type, char *out, struct err *err);

/* Splits len bytes of body at boundary. Every part must carry a
 * Content-Disposition of form-data with a name; the preamble before the first
 * delimiter and the epilogue after the last are ignored. Returns 0 and fills
 * out (release with multipart_free; its data pointers live as long as body), or
 * -INFERD_EINVAL with a message that says what is malformed (out left empty),
 * or -INFERD_ENOMEM. */
int multipart_parse(const char *body, size_t len, const char *boundary,
                    struct multipart_form *out, struct err *err);

/* The first part named name, or NULL. */
const struct multipart_part *multipart_find(const struct multipart_form *f, const char *name);

void multipart_free(struct multipart_form *f);

#endif
