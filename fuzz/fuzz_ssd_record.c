/* fuzz/fuzz_ssd_record.c — libFuzzer target: the SSD tier's block record parser on arbitrary
 * bytes; with the first input byte odd, the checksum is fixed up first so the fuzzer also reaches
 * accepted records, which must lie inside the input and re-encode to the same header. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kv/ssd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool fix = data[0] & 1;
    data++, size--;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct ssd_record_header h;
    if (fix && ssd_record_header_parse(buf, size, &h, NULL) == 0) {
        uint64_t body = h.head_len + h.data_len;
        if (body + SSD_RECORD_CHECKSUM_BYTES <= size) {
            XXH128_canonical_t c;
            XXH128_canonicalFromHash(&c, XXH3_128bits(buf, (size_t)body));
            memcpy(buf + body, c.digest, 16);
        }
    }
    const uint8_t *tokens = NULL, *payload = NULL;
    if (ssd_record_parse(buf, size, &h, &tokens, &payload, NULL) == 0) {
        const uint8_t *end = buf + size;
        if (tokens != buf + SSD_RECORD_HEADER_BYTES || payload != buf + h.head_len ||
            (size_t)(end - payload) < h.data_len + SSD_RECORD_CHECKSUM_BYTES ||
            h.head_len < SSD_RECORD_HEADER_BYTES + (uint64_t)h.n_tokens * 4)
            __builtin_trap();
        if (h.record_len % SSD_RECORD_ALIGN != 0 || h.head_len % SSD_RECORD_ALIGN != 0 ||
            h.record_len < h.head_len + h.data_len + 16)
            __builtin_trap();
        uint8_t again[SSD_RECORD_HEADER_BYTES];
        ssd_record_header_encode(&h, again);
        if (memcmp(again, buf, SSD_RECORD_HEADER_BYTES) != 0)
            __builtin_trap();
    }
    free(buf);
    return 0;
}
