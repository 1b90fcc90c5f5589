/* kv/ssd.h — the SSD tier's durable block store: KV blocks written behind on an I/O thread into
 * append-only segment files, indexed in SQLite, verified (chain + XXH3-128) on restore, crash-safe. */
#ifndef INFERD_KV_SSD_H
#define INFERD_KV_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/err.h"

/* ---- what is on disk ----------------------------------------------------------
 *
 *   DIR/                                    --ssd-cache DIR (created if missing)
 *     <fingerprint digest, 32 hex>/         one directory per fingerprint; others are never touched
 *       fingerprint.json                    what the digest stands for (for people; never read back)
 *       lock                                flock'd by the one process that has the directory open
 *       index.sqlite (+ -wal, -shm)         hash + ns -> segment, offset, length, parent, tokens,
 *                                           checksum, last use (WAL mode; the I/O thread only)
 *       seg-00000001.dat ...                append-only segments of block records
 *       *.tmp                               temporary files, reaped at open
 *
 * A block record (all integers little-endian) starts on a 4 KiB boundary of its segment, and so
 * does its data (so the data can go to disk straight from the caller's memory, see below):
 *
 *     0  magic "inferdKV"           8      56  n_tokens u32
 *     8  version u32 (2)                   60  flags u32 (0)
 *    12  header bytes u32 (80)             64  data length u64
 *    16  fingerprint digest (16 bytes)     72  reserved u64 (0)
 *    32  hash u64                          80  token ids, n_tokens x i32
 *    40  parent hash u64                   ..  zeros up to the next 4 KiB boundary (the head ends)
 *    48  ns u64                            ..  data (the block's K/V, data length bytes)
 *                                          ..  XXH3-128 of everything above (canonical, 16 bytes)
 *                                          ..  zeros up to the next 4 KiB boundary
 *
 * so a record describes itself: the index can be rebuilt from the segments alone.
 *
 * Durability order: records are written, the segment fsynced (and the directory after a new
 * segment), then the index rows committed; a block is reported durable (its write cookie, and
 * ssd_store_contains) only after that commit. After kill -9 or power loss, rows whose data is
 * missing are dropped at the next open, records past the index's end are re-verified and
 * re-indexed or cut off, and every read checks the record against what the caller expects, so
 * a crash can lose blocks but never hand out wrong K/V with status 0.
 *
 * Writes go around the page cache (O_DIRECT) where the file system takes it: a record's head and
 * tail are staged in a page-aligned buffer and appended in large aligned writes (a record's length
 * and offset are already multiples of SSD_RECORD_ALIGN, so the format is the same either way);
 * data whose pieces are aligned as O_DIRECT wants (a KV pool in host memory) is written from where
 * it lies, in the same write call, and hashed there, else it is staged too. The group commit's
 * fdatasync still makes them durable (O_DIRECT alone does not flush the device's cache). Where
 * O_DIRECT is refused (tmpfs, some overlay file systems) the store writes through the page cache
 * and drops the written pages once they are durable. */

#define SSD_RECORD_MAGIC "inferdKV"
#define SSD_RECORD_VERSION 2
#define SSD_RECORD_HEADER_BYTES 80
#define SSD_RECORD_CHECKSUM_BYTES 16
#define SSD_RECORD_ALIGN 4096
#define SSD_RECORD_MAX_TOKENS 65536
#define SSD_RECORD_MAX_DATA ((uint64_t)1 << 32)
#define SSD_MAX_IOV 512

struct ssd_fingerprint {            /* what must match for stored K/V to be usable */
    uint64_t model_digest;          /* weights + architecture (the caller's) */
    uint64_t tokenizer_digest;
    char kv_format[32];             /* e.g. "bf16", later "q8g32" */
    int block_size;
    char backend_identity[64];      /* numeric identity, e.g. "cpu-avx512" or "cuda-sm90-exact" */
};

enum ssd_direct_io {                /* --ssd-direct-io */
    SSD_DIRECT_AUTO = 0,            /* O_DIRECT where the file system takes it, else buffered */
    SSD_DIRECT_ON,                  /* O_DIRECT or the open fails (-INFERD_EINVAL) */
    SSD_DIRECT_OFF,                 /* buffered writes */
};

struct ssd_config {
    const char *dir;                /* --ssd-cache DIR; created if missing */
    uint64_t max_bytes;             /* --ssd-cache-max (GiB -> bytes); 0: no cap (then the disk's free space) */
    bool verify_on_read;            /* --ssd-cache-verify: checksum every block read (the chain check is always done) */
    size_t queue_max_bytes;         /* bound on bytes waiting to be written; 0: 1 GiB */
    struct ssd_fingerprint fp;
    /* Added; 0 picks the default: */
    uint64_t segment_bytes;         /* a segment is closed once this full (64 MiB; cap / 8 when smaller, >= 1 MiB) */
    size_t probe_bytes;             /* size of the read-bandwidth probe at open (32 MiB) */
    enum ssd_direct_io direct_io;   /* how segments are written (default auto) */
    size_t write_buffer_bytes;      /* O_DIRECT staging buffer, rounded up to SSD_RECORD_ALIGN (8 MiB) */
};

struct ssd_block_key {              /* a block's identity, as the prefix cache knows it */
    uint64_t hash, parent_hash, ns;
    int n_tokens;                   /* == block_size for full blocks */
    const int32_t *tokens;          /* borrowed (copied by the calls that take a key) */
};

struct ssd_stats {
    const char *dir;                /* owned by the store: its fingerprint directory; valid until close */
    uint64_t blocks;                /* blocks in the index (durable, readable) */
    uint64_t bytes;                 /* bytes of the segment files on disk */
    uint64_t max_bytes;             /* the configured cap (0: none) */
    uint64_t cap_bytes;             /* the cap in force: max_bytes or, if smaller, what the disk could
                                       take at open (what is there + free space - a small reserve) */
    uint64_t writes, write_bytes;   /* blocks made durable since open, and their data bytes */
    uint64_t restores, restore_bytes; /* verified reads since open, and their data bytes */
    double restore_ms_last;         /* the last batch of reads: first queued to last done */
    uint64_t pending, pending_bytes;/* writes queued or in flight (not yet durable), their data bytes */
    uint64_t pending_reads;         /* reads queued or in flight */
    uint64_t dropped;               /* blocks the caller could not queue (ssd_store_note_dropped) */
    uint64_t failed;                /* writes or reads that failed on I/O */
    uint64_t verify_failures;       /* reads whose record did not match (chain, checksum, length) */
    uint64_t evicted_blocks;        /* blocks dropped to stay under the cap */
    uint64_t recovered_blocks;      /* at open: records past the index's end, verified and indexed */
    uint64_t dropped_at_start;      /* at open: index rows dropped (data missing or short, bad rows) */
    uint64_t torn_tails;            /* at open: segments whose bytes after the last good record were cut */
    bool index_rebuilt;             /* at open: the index was damaged and rebuilt from the segments */
    bool disabled;                  /* the tier turned itself off (disk full or unwritable) */
    char disable_reason[128];
    bool direct_io;                 /* segments are written with O_DIRECT now (false: through the
                                       page cache: --ssd-direct-io off, or the file system refused) */
    uint64_t write_calls;           /* write system calls that appended records (pwrite/pwritev) */
    uint64_t in_place_writes;       /* records whose data went to disk straight from the caller's
                                       memory (O_DIRECT, aligned pieces), not through the staging copy */
    uint64_t io_cpu_ns;             /* CPU time the I/O thread has used (checksums, copies, system calls) */
};

enum ssd_done_kind { SSD_DONE_READ = 1, SSD_DONE_WRITE = 2 };

struct ssd_done {                   /* one finished operation, handed back by ssd_store_poll */
    uint64_t cookie;                /* the caller's, as given to ssd_store_read / ssd_store_write */
    enum ssd_done_kind kind;
    int status;                     /* 0, or a negative -INFERD_E* code (see the calls) */
};

struct ssd_store;

/* Opens (creating what is missing) DIR/<fingerprint digest>/, reaps temporary files, checks the
 * index against the data: rows whose segment is missing or too short are dropped; records past
 * the last indexed one in each segment are verified and indexed (recovered) and a torn tail is
 * cut off; a damaged index (SQLite errors, a failed quick_check, a wrong schema) is discarded
 * and rebuilt from the records. Logs what it found, measures the read bandwidth, starts the I/O
 * thread. Only a DIR that cannot be created or written is an error (-INFERD_EIO; -INFERD_EBUSY
 * when another process has the same fingerprint directory open; -INFERD_EINVAL when direct_io
 * is SSD_DIRECT_ON and the file system refuses O_DIRECT); a damaged index or damaged segments
 * never are. Whether O_DIRECT is taken is probed once here (a small aligned write to a
 * temporary file) and logged. *out is owned by the caller (ssd_store_close). */
int ssd_store_open(const struct ssd_config *cfg, struct ssd_store **out, struct err *err);

/* Completes every queued operation (writes made durable, reads done; bound the wait by calling
 * ssd_store_flush first), stops the I/O thread, frees s. Unpolled completions are discarded. */
void ssd_store_close(struct ssd_store *s);

/* True when the block (hash, ns) is durable and in the index; *n_tokens_out (may be NULL) gets
 * its token count. An in-memory lookup (O(1), one short lock): never touches SQLite or the disk. */
bool ssd_store_contains(struct ssd_store *s, uint64_t hash, uint64_t ns, uint32_t *n_tokens_out);

/* Queues the block for writing (write-behind): its token ids are copied, its data (n_iov pieces,
 * gathered in order) is read on the I/O thread, so data must stay valid and unchanged until the
 * cookie comes back from ssd_store_poll: status 0 once durable, -INFERD_EIO when the write
 * failed (the tier then turns itself off). Returns 0 (queued), -INFERD_EBUSY when the queue is
 * full (nothing queued; keep the block and retry later, or count a drop with
 * ssd_store_note_dropped), -INFERD_EEXIST when the block is already stored or queued (nothing
 * queued, no cookie will come), -INFERD_EIO when the tier is off, -INFERD_ERANGE when the block
 * alone is larger than the cap, -INFERD_EINVAL for a bad key (n_tokens outside [1, block_size])
 * or more than SSD_MAX_IOV pieces. */
int ssd_store_write(struct ssd_store *s, const struct ssd_block_key *key, const struct iovec *data,
                    int n_iov, uint64_t cookie, struct err *err);

/* Queues a read of the block expect names into dst (n_iov pieces, scattered in order; their
 * total must be the stored data length): the I/O thread reads it while the engine keeps
 * stepping, and the cookie comes back from ssd_store_poll with status 0 (dst holds the verified
 * K/V), -INFERD_ENOENT (the block left the index meanwhile), -INFERD_ECORRUPT (the record does
 * not match expect's hash, parent hash, ns and token ids, or fails its checksum — checked on the
 * first read of a block after open, and on every read with verify_on_read: the block is dropped
 * from the index and counted in verify_failures; recompute it), or -INFERD_EIO. On any failure
 * dst's content is undefined. dst must stay valid and untouched until the cookie comes back.
 * Returns 0 (queued), -INFERD_ENOENT when the block is not durable in the index now, or
 * -INFERD_EINVAL when dst's length differs from the stored data length (nothing queued). */
int ssd_store_read(struct ssd_store *s, const struct ssd_block_key *expect, const struct iovec *dst,
                   int n_iov, uint64_t cookie, struct err *err);

/* Up to max finished operations into done, oldest first; returns how many (never blocks). */
int ssd_store_poll(struct ssd_store *s, struct ssd_done *done, int max);

/* Blocks until a finished operation is waiting to be polled or timeout_ms passes (< 0: no
 * limit); returns how many are waiting (0 on timeout). */
int ssd_store_wait(struct ssd_store *s, int timeout_ms);

/* Waits until every write queued before the call is durable: 0 then; -INFERD_EBUSY when
 * timeout_ms (< 0: no limit) passed first, -INFERD_EIO when one of them failed or the tier is
 * off (a failed write turns the tier off). Pending ssd_store_touch updates go out on the I/O
 * thread's next pass (they are hints, not part of durability). */
int ssd_store_flush(struct ssd_store *s, int timeout_ms);

/* A snapshot of the counters; any thread. */
void ssd_store_stats(struct ssd_store *s, struct ssd_stats *out);

/* Bytes per second read from a temporary file in the fingerprint directory at open (O_DIRECT
 * where the file system allows it, else after dropping the file's cached pages); 0 when the
 * probe could not run. */
double ssd_store_read_bandwidth(struct ssd_store *s);
/* The same file's bytes per second once they are in the page cache; 0 when the probe could not
 * run. Both are read as a restore reads its blocks (as many threads, in pieces of a block). */
double ssd_store_cache_bandwidth(struct ssd_store *s);
/* Bytes of the stored records of hashes[0, n) (namespace ns) that are in the page cache now. */
uint64_t ssd_store_cached_bytes(struct ssd_store *s, const uint64_t *hashes, int n, uint64_t ns);

/* Marks the block used now; the I/O thread persists it lazily (capacity evicts the least
 * recently used first). No-op for a block not in the index. */
void ssd_store_touch(struct ssd_store *s, uint64_t hash, uint64_t ns);

/* Counts n blocks the caller gave up writing (e.g. after -INFERD_EBUSY), for the stats. */
void ssd_store_note_dropped(struct ssd_store *s, uint64_t n);

/* ---- the record format (kv/ssd_record.c), for the store, its index rebuild and the fuzzer ---- */

/* The digest that names a fingerprint directory and is stamped in every record. */
void ssd_fingerprint_digest(const struct ssd_fingerprint *fp, uint8_t digest[16]);

struct ssd_record_header {
    uint8_t fp_digest[16];
    uint64_t hash, parent_hash, ns;
    uint32_t n_tokens;
    uint64_t data_len;
    uint64_t head_len;              /* derived: header + tokens, 4 KiB aligned: where the data starts */
    uint64_t record_len;            /* derived: head + data + checksum, 4 KiB aligned */
};

/* Bytes of a record's head (header and token ids, padded): the data's offset in the record. */
uint64_t ssd_record_head_len(uint32_t n_tokens);
/* Bytes of a record with n_tokens tokens and data_len bytes of data, padding included. */
uint64_t ssd_record_len(uint32_t n_tokens, uint64_t data_len);

/* Fills the SSD_RECORD_HEADER_BYTES bytes of a record's header. */
void ssd_record_header_encode(const struct ssd_record_header *h, uint8_t *out);

/* Parses the header in buf[0, len): -INFERD_EFORMAT unless len >= SSD_RECORD_HEADER_BYTES and
 * magic, version, header size, flags, reserved and the limits on n_tokens and data length hold. */
int ssd_record_header_parse(const void *buf, size_t len, struct ssd_record_header *out,
                            struct err *err);

/* Parses one whole record at the start of buf[0, len): header as above, then the token ids and
 * data must fit in len and the checksum must match (-INFERD_ECORRUPT otherwise). *tokens and
 * *data point into buf. Bounds-checked for any input. */
int ssd_record_parse(const void *buf, size_t len, struct ssd_record_header *out,
                     const uint8_t **tokens, const uint8_t **data, struct err *err);

#endif
