/* base/sha1.h — SHA-1 (FIPS 180-4) and base64 (RFC 4648), for the WebSocket handshake's
 * Sec-WebSocket-Accept. SHA-1 is broken for signatures; nothing here may be used to trust
 * an input. */
#ifndef INFERD_BASE_SHA1_H
#define INFERD_BASE_SHA1_H

#include <stddef.h>
#include <stdint.h>

#define SHA1_DIGEST_BYTES 20

struct sha1 {
    uint32_t h[5];
    uint64_t total;       /* bytes hashed so far */
    uint8_t block[64];    /* the partial block, block_len bytes */
    size_t block_len;
};

void sha1_init(struct sha1 *s);
void sha1_update(struct sha1 *s, const void *data, size_t n);
void sha1_final(struct sha1 *s, uint8_t out[SHA1_DIGEST_BYTES]);
/* One call: the digest of n bytes. */
void sha1_digest(const void *data, size_t n, uint8_t out[SHA1_DIGEST_BYTES]);

/* The base64 encoding length of n bytes (with padding), without the NUL. */
#define BASE64_LEN(n) ((((n) + 2) / 3) * 4)
/* Writes the padded base64 of n bytes to out (BASE64_LEN(n) + 1 bytes, NUL-terminated). */
void base64_encode(const void *data, size_t n, char *out);

#endif
