/* fuzz/fuzz_keys.c — libFuzzer target: API key files (--api-keys). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api/keys.h"

/* Every key taken must match itself and carry its namespace; a refusal
 * must say why. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct api_keys k = {0};
    struct err err = {0};
    int rc = api_keys_parse(&k, (const char *)data, size, "fuzz", &err);
    if (rc < 0 && err.msg[0] == '\0')
        __builtin_trap();
    for (size_t i = 0; i < k.n; i++) {
        size_t len = strlen(k.keys[i]);
        if (len == 0 || len > API_KEY_MAX_BYTES)
            __builtin_trap();
        if (api_keys_match(&k, k.keys[i], len) != (int)i)
            __builtin_trap();
        if (k.ns[i] == 0 || k.ns[i] != api_keys_namespace(k.keys[i], len))
            __builtin_trap();
    }
    api_keys_free(&k);
    return 0;
}
