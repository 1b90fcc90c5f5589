/* api/keys.c — the API keys a server accepts: from flags and key files, matched in constant
 * time, and hashed into prefix-cache namespaces. */
#include "api/keys.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/hash.h"

/* A key file bigger than this is not a list of keys. */
#define API_KEYS_FILE_MAX_BYTES ((size_t)16 << 20)

int api_keys_add(struct api_keys *k, const char *key, struct err *err)
{
    size_t len = strlen(key);
    if (len == 0)
        return err_set(err, INFERD_EINVAL, "an API key must not be empty");
    if (len > API_KEY_MAX_BYTES)
        return err_set(err, INFERD_EINVAL, "an API key is %zu bytes; the limit is %d", len,
                       API_KEY_MAX_BYTES);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)key[i] <= ' ' || key[i] == 0x7f)
            return err_set(err, INFERD_EINVAL,
                           "an API key must not hold spaces or control characters (byte %zu)",
                           i);
    for (size_t i = 0; i < k->n; i++)
        if (!strcmp(k->keys[i], key))
            return 0;
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 4;
        char **keys = realloc(k->keys, cap * sizeof *keys);
        if (keys)
            k->keys = keys;
        uint64_t *ns = keys ? realloc(k->ns, cap * sizeof *ns) : NULL;
        if (!ns)
            return err_set(err, INFERD_ENOMEM, "out of memory for %zu API keys", cap);
        k->ns = ns;
        k->cap = cap;
    }
    char *copy = strdup(key);
    if (!copy)
        return err_set(err, INFERD_ENOMEM, "out of memory for an API key");
    k->keys[k->n] = copy;
    k->ns[k->n] = api_keys_namespace(copy, len);
    k->n++;
    return 0;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

int api_keys_parse(struct api_keys *k, const char *text, size_t len, const char *where,
                   struct err *err)
{
    size_t line_no = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t a = at, b = end;
        line_no++;
        at = end + 1;
        while (a < b && is_blank(text[a]))
            a++;
        while (b > a && is_blank(text[b - 1]))
            b--;
        if (a == b || text[a] == '#')
            continue;
        if (b - a > API_KEY_MAX_BYTES)
            return err_set(err, INFERD_EINVAL, "%s:%zu: the key is %zu bytes; the limit is %d",
                           where, line_no, b - a, API_KEY_MAX_BYTES);
        char key[API_KEY_MAX_BYTES + 1];
        memcpy(key, text + a, b - a);
        key[b - a] = '\0';
        if (memchr(key, '\0', b - a))
            return err_set(err, INFERD_EINVAL, "%s:%zu: the key holds a NUL byte", where,
                           line_no);
        int rc = api_keys_add(k, key, err);
        if (rc < 0)
            return err_wrap(err, "%s:%zu", where, line_no);
    }
    return 0;
}

int api_keys_load_file(struct api_keys *k, const char *path, struct err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = file_read_all(path, API_KEYS_FILE_MAX_BYTES, &text, &len, NULL, err);
    if (rc < 0)
        return rc;
    size_t before = k->n;
    rc = api_keys_parse(k, text, len, path, err);
    free(text);
    if (rc == 0 && k->n == before)
        rc = err_set(err, INFERD_EINVAL,
                     "%s holds no key (one per line; blank lines and # comments "
                     "are skipped)",
                     path);
    return rc;
}

void api_keys_free(struct api_keys *k)
{
    for (size_t i = 0; i < k->n; i++) {
        /* a key is a secret: gone from memory, not only freed */
        volatile char *p = k->keys[i];
        for (size_t j = 0; p[j]; j++)
            p[j] = 0;
        free(k->keys[i]);
    }
    free(k->keys);
    free(k->ns);
    memset(k, 0, sizeof *k);
}

/* Compares every byte of want whatever given holds: time depends on lengths only. */
static bool constant_time_equal(const char *want, const char *given, size_t given_len)
{
    size_t want_len = strlen(want);
    unsigned char diff = want_len != given_len;
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(given_len ? given[i % given_len] : 0);
    return diff == 0;
}

int api_keys_match(const struct api_keys *k, const char *given, size_t given_len)
{
    int found = -1;
    for (size_t i = 0; i < k->n; i++)
        if (constant_time_equal(k->keys[i], given, given_len) & (found < 0))
            found = (int)i;
    return found;
}

/* FNV-1a over bytes from seed, then mixed. */
static uint64_t hash_bytes(uint64_t seed, const char *s, size_t len)
{
    uint64_t h = hash_fnv1a(HASH_FNV_OFFSET ^ hash_mix64(seed), s, len);
    return hash_mix64(h ^ len);
}

/* Distinct seeds keep a key and a salt with the same bytes apart. */
#define SEED_TENANT 0x74656e616e74ull
#define SEED_SALT 0x73616c74ull

uint64_t api_keys_namespace(const char *key, size_t len)
{
    uint64_t h = hash_bytes(SEED_TENANT, key, len);
    return h ? h : 1;
}

uint64_t api_cache_namespace(uint64_t tenant_ns, const char *salt, size_t salt_len)
{
    if (!salt)
        return tenant_ns;
    uint64_t h = hash_bytes(SEED_SALT ^ tenant_ns, salt, salt_len);
    return h ? h : 1;
}
