/* kv/ssd_record.c — the SSD tier's on-disk block record: encoding its header, parsing and
 * verifying one record (bounds-checked for any bytes), and the fingerprint digest. */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "kv/ssd.h"

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Up to max bytes of s, stopping at its end; the rest of out stays zero. */
static void copy_str(uint8_t *out, const char *s, size_t max)
{
    for (size_t i = 0; i < max && s[i]; i++)
        out[i] = (uint8_t)s[i];
}

/* A canonical byte string of the fingerprint (fixed widths, strings zero-padded), so the digest
 * does not depend on struct padding or on bytes after a string's end. */
void ssd_fingerprint_digest(const struct ssd_fingerprint *fp, uint8_t digest[16])
{
    uint8_t buf[16 + 8 + 8 + 32 + 4 + 64] = {0};
    /* the record format's version is part of the name: a directory of older records is foreign */
    snprintf((char *)buf, 16, "inferd-ssd-fp-%d", SSD_RECORD_VERSION);
    put_u64(buf + 16, fp->model_digest);
    put_u64(buf + 24, fp->tokenizer_digest);
    copy_str(buf + 32, fp->kv_format, sizeof fp->kv_format - 1);
    put_u32(buf + 64, (uint32_t)fp->block_size);
    copy_str(buf + 68, fp->backend_identity, sizeof fp->backend_identity - 1);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, sizeof buf));
    memcpy(digest, c.digest, 16);
}

static uint64_t align_up(uint64_t n) { return (n + SSD_RECORD_ALIGN - 1) / SSD_RECORD_ALIGN * SSD_RECORD_ALIGN; }

uint64_t ssd_record_head_len(uint32_t n_tokens)
{
    return align_up(SSD_RECORD_HEADER_BYTES + (uint64_t)n_tokens * 4);
}

uint64_t ssd_record_len(uint32_t n_tokens, uint64_t data_len)
{
    return ssd_record_head_len(n_tokens) + align_up(data_len + SSD_RECORD_CHECKSUM_BYTES);
}

void ssd_record_header_encode(const struct ssd_record_header *h, uint8_t *out)
{
    memset(out, 0, SSD_RECORD_HEADER_BYTES);
    memcpy(out, SSD_RECORD_MAGIC, 8);
    put_u32(out + 8, SSD_RECORD_VERSION);
    put_u32(out + 12, SSD_RECORD_HEADER_BYTES);
    memcpy(out + 16, h->fp_digest, 16);
    put_u64(out + 32, h->hash);
    put_u64(out + 40, h->parent_hash);
    put_u64(out + 48, h->ns);
    put_u32(out + 56, h->n_tokens);
    put_u32(out + 60, 0);
    put_u64(out + 64, h->data_len);
    put_u64(out + 72, 0);
}

int ssd_record_header_parse(const void *buf, size_t len, struct ssd_record_header *out,
                            struct err *err)
{
    const uint8_t *p = buf;
    if (len < SSD_RECORD_HEADER_BYTES)
        return err_set(err, INFERD_EFORMAT, "block record: %zu bytes, a header needs %d", len,
                       SSD_RECORD_HEADER_BYTES);
    if (memcmp(p, SSD_RECORD_MAGIC, 8) != 0)
        return err_set(err, INFERD_EFORMAT, "block record: bad magic");
    uint32_t version = get_u32(p + 8), header = get_u32(p + 12), flags = get_u32(p + 60);
    if (version != SSD_RECORD_VERSION || header != SSD_RECORD_HEADER_BYTES)
        return err_set(err, INFERD_EFORMAT, "block record: version %u header %u bytes (want %d, %d)",
                       version, header, SSD_RECORD_VERSION, SSD_RECORD_HEADER_BYTES);
    if (flags != 0 || get_u64(p + 72) != 0)
        return err_set(err, INFERD_EFORMAT, "block record: unknown flags %u", flags);
    memcpy(out->fp_digest, p + 16, 16);
    out->hash = get_u64(p + 32);
    out->parent_hash = get_u64(p + 40);
    out->ns = get_u64(p + 48);
    out->n_tokens = get_u32(p + 56);
    out->data_len = get_u64(p + 64);
    if (out->n_tokens > SSD_RECORD_MAX_TOKENS || out->data_len > SSD_RECORD_MAX_DATA)
        return err_set(err, INFERD_EFORMAT, "block record: %u tokens, %llu data bytes: too large",
                       out->n_tokens, (unsigned long long)out->data_len);
    out->head_len = ssd_record_head_len(out->n_tokens);
    out->record_len = ssd_record_len(out->n_tokens, out->data_len);
    return 0;
}

int ssd_record_parse(const void *buf, size_t len, struct ssd_record_header *out,
                     const uint8_t **tokens, const uint8_t **data, struct err *err)
{
    int rc = ssd_record_header_parse(buf, len, out, err);
    if (rc)
        return rc;
    const uint8_t *p = buf;
    uint64_t body = out->head_len + out->data_len; /* what the checksum covers */
    if (body + SSD_RECORD_CHECKSUM_BYTES > len)
        return err_set(err, INFERD_ECORRUPT, "block record: %llu bytes needed, %zu there",
                       (unsigned long long)(body + SSD_RECORD_CHECKSUM_BYTES), len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, (size_t)body));
    if (memcmp(c.digest, p + body, 16) != 0)
        return err_set(err, INFERD_ECORRUPT, "block record %016llx: checksum mismatch",
                       (unsigned long long)out->hash);
    if (tokens)
        *tokens = p + SSD_RECORD_HEADER_BYTES;
    if (data)
        *data = p + out->head_len;
    return 0;
}
