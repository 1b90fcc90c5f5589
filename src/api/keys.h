/* api/keys.h — the API keys a server accepts (flags and a key file), which one a request
 * presented, and the prefix-cache namespace a tenant and a cache_salt give it. */
#ifndef INFERD_API_KEYS_H
#define INFERD_API_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* The longest key taken, in bytes. */
#define API_KEY_MAX_BYTES 1024

/* Every accepted key with its tenant's namespace. Zero-initialized: no keys. */
struct api_keys {
    char **keys;   /* owned; n NUL-terminated keys, each owned */
    uint64_t *ns;  /* owned; n namespaces, ns[i] = api_keys_namespace(keys[i]) */
    size_t n, cap;
};

/* Adds key (copied). -INFERD_EINVAL for an empty key, one over
 * API_KEY_MAX_BYTES or one with control characters or spaces (a header could
 * not carry it); -INFERD_ENOMEM. A key already there is not added twice. */
int api_keys_add(struct api_keys *k, const char *key, struct err *err);

/* Adds the keys of text (len bytes): one per line, surrounding blanks
 * trimmed, blank lines and lines starting with '#' skipped. where names the
 * source in messages ("keys.txt:3: ..."). */
int api_keys_parse(struct api_keys *k, const char *text, size_t len, const char *where,
                   struct err *err);

/* api_keys_parse over the file at path. -INFERD_EIO when it cannot be read,
 * -INFERD_EINVAL when it holds no key. */
int api_keys_load_file(struct api_keys *k, const char *path, struct err *err);

void api_keys_free(struct api_keys *k);

/* The index of the key given matches, or -1. Every key is compared in time
 * that depends only on the lengths, and all are compared whatever matched,
 * so the time taken says nothing about which key came close. */
int api_keys_match(const struct api_keys *k, const char *given, size_t given_len);

/* A tenant's namespace: a 64-bit hash of its key, never 0 (0 is the
 * namespace of a server without keys). The key cannot be read back from it. */
uint64_t api_keys_namespace(const char *key, size_t len);

/* A request's prefix-cache namespace: the tenant's (0 without keys),
 * narrowed by cache_salt when one is sent (salt_len bytes, NULL for none), so
 * equal salts share a namespace and different salts never do. */
uint64_t api_cache_namespace(uint64_t tenant_ns, const char *salt, size_t salt_len);

#endif
