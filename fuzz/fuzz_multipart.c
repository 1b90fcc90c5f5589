/* fuzz/fuzz_multipart.c — libFuzzer target: multipart/form-data on arbitrary bytes. The input's
 * first line is the Content-Type header's value; the rest is the body. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/multipart.h"

static void check_part(const struct multipart_part *p, const char *body, size_t len)
{
    if (!memchr(p->name, '\0', sizeof p->name) || p->name[0] == '\0' ||
        !memchr(p->filename, '\0', sizeof p->filename) ||
        !memchr(p->content_type, '\0', sizeof p->content_type))
        __builtin_trap();
    /* Data lies inside the body, so a handler may keep the body and drop the form. */
    if (p->data < body || p->data + p->data_len > body + len)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *nl = memchr(data, '\n', size);
    size_t ct_len = nl ? (size_t)(nl - (const char *)data) : size;
    char *ct = malloc(ct_len + 1);
    if (!ct)
        return 0;
    memcpy(ct, data, ct_len);
    ct[ct_len] = '\0';
    /* The body in a buffer of its own size, so reads past it are caught. */
    size_t len = nl ? size - ct_len - 1 : 0;
    char *body = malloc(len ? len : 1);
    if (!body) {
        free(ct);
        return 0;
    }
    memcpy(body, nl ? nl + 1 : "", len);

    char boundary[MULTIPART_MAX_BOUNDARY + 1];
    struct err err = {0};
    if (multipart_boundary(ct, boundary, &err) == 0) {
        size_t blen = strlen(boundary);
        if (blen == 0 || blen > MULTIPART_MAX_BOUNDARY)
            __builtin_trap();
        struct multipart_form form;
        int rc = multipart_parse(body, len, boundary, &form, &err);
        if (rc == 0) {
            if (form.n_parts == 0 || form.n_parts > MULTIPART_MAX_PARTS)
                __builtin_trap();
            for (size_t i = 0; i < form.n_parts; i++)
                check_part(&form.parts[i], body, len);
            if (multipart_find(&form, form.parts[0].name) != &form.parts[0])
                __builtin_trap();
        } else if (form.n_parts != 0 || form.parts || err.msg[0] == '\0') {
            __builtin_trap();
        }
        multipart_free(&form);
    }
    free(body);
    free(ct);
    return 0;
}
