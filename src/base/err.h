/* base/err.h — error codes and the caller-owned error record every fallible function fills. */
#ifndef INFERD_BASE_ERR_H
#define INFERD_BASE_ERR_H

#include <stddef.h>

/* Functions return 0 on success or one of these, negated. */
enum inferd_errcode {
    INFERD_OK = 0,
    INFERD_EINVAL = 1,       /* bad argument or bad input value */
    INFERD_ENOMEM = 2,       /* allocation failed or pool exhausted */
    INFERD_EIO = 3,          /* file missing, unreadable, short read */
    INFERD_EFORMAT = 4,      /* malformed file contents (JSON, safetensors, ...) */
    INFERD_EUNSUPPORTED = 5, /* well-formed but not something inferd runs */
    INFERD_ERANGE = 6,       /* value outside the allowed range */
    INFERD_EBUSY = 7,        /* a queue or budget is full; try again later */
    INFERD_EEXIST = 8,       /* already there (a stored or queued block) */
    INFERD_ENOENT = 9,       /* not there (any more): nothing to read */
    INFERD_ECORRUPT = 10,    /* stored data failed its verification (checksum, identity) */
};

struct err {
    int code;       /* enum inferd_errcode, positive; 0 when no error */
    char msg[512];  /* human-readable, one line */
};

/* Records code and message in err (which may be NULL) and returns -code,
 * so callers can write `return err_set(err, INFERD_EIO, "...", ...);`. */
int err_set(struct err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with context ("loading x: <old msg>"); returns -err->code. */
int err_wrap(struct err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void err_clear(struct err *err);

const char *err_code_name(int code);

#endif
