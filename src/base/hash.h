/* base/hash.h — the library's non-cryptographic hashes, for hash tables and identities: one
 * 64-bit finalizer and FNV-1a. Nothing here resists an adversary; callers that must never
 * confuse two inputs verify the input itself after a hash matches (kv/prefix.c does). */
#ifndef INFERD_BASE_HASH_H
#define INFERD_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HASH_FNV_OFFSET 0xcbf29ce484222325ull
#define HASH_FNV_PRIME 0x100000001b3ull

/* MurmurHash3's 64-bit finalizer: every input bit reaches every output bit. */
static inline uint64_t hash_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* FNV-1a over n bytes, continuing from h (HASH_FNV_OFFSET to start). */
static inline uint64_t hash_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * HASH_FNV_PRIME;
    return h;
}

/* One FNV-1a step over a whole word (for digests of many small values). */
static inline uint64_t hash_fnv1a_word(uint64_t h, uint64_t v)
{
    return (h ^ v) * HASH_FNV_PRIME;
}

#endif
