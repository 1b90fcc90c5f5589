/* tests/unit/test_ssd_store.c — the SSD tier's block store: round trips, restarts, foreign
 * fingerprints, verification, corruption, torn tails, kill -9, a full disk, flush, back-pressure
 * and the cap; never wrong bytes with status 0. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/hash.h"
#include "base/log.h"
#include "kv/kv.h"
#include "kv/ssd.h"
#include "test_support.h"

/* A block as the pool lays it out: N_CHUNKS separate chunks (2 * n_layers of them). */
#define BS 16
#define N_CHUNKS 8
#define CHUNK 3000
#define BLOCK_BYTES (N_CHUNKS * CHUNK)
#define NS 7

struct blk {
    int32_t tokens[BS];
    uint8_t data[N_CHUNKS][CHUNK];
    struct iovec iov[N_CHUNKS];
    struct ssd_block_key key;
};

/* Block i of a chain (parent: block i - 1) from its parent's hash: its tokens and content;
 * variant changes the content only, so two stores can hold the same keys with other K/V. */
static void blk_fill(struct blk *b, int i, uint64_t parent, int variant)
{
    for (int t = 0; t < BS; t++)
        b->tokens[t] = i * 1000 + t;
    b->key = (struct ssd_block_key){.hash = kv_prefix_hash(parent, b->tokens, BS, NS),
                                    .parent_hash = parent, .ns = NS, .n_tokens = BS,
                                    .tokens = b->tokens};
    uint64_t x = hash_mix64(b->key.hash + (uint64_t)variant);
    for (int c = 0; c < N_CHUNKS; c++) {
        for (int o = 0; o < CHUNK; o++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b->data[c][o] = (uint8_t)(x >> 56);
        }
        b->iov[c] = (struct iovec){b->data[c], CHUNK};
    }
}

static struct blk *blks_make(int n, int variant)
{
    struct blk *b = malloc((size_t)n * sizeof *b);
    cr_assert_not_null(b);
    for (int i = 0; i < n; i++)
        blk_fill(&b[i], i, i ? b[i - 1].key.hash : NS, variant);
    return b;
}

static struct ssd_config config(const char *dir, const char *kv_format)
{
    struct ssd_config c = {.dir = dir, .queue_max_bytes = 64 << 20, .segment_bytes = 256 << 10,
                           .probe_bytes = 1 << 20};
    c.fp.model_digest = 0x1234;
    c.fp.tokenizer_digest = 0x5678;
    snprintf(c.fp.kv_format, sizeof c.fp.kv_format, "%s", kv_format);
    c.fp.block_size = BS;
    snprintf(c.fp.backend_identity, sizeof c.fp.backend_identity, "cpu-test");
    return c;
}

static struct ssd_store *open_store(const struct ssd_config *c)
{
    struct ssd_store *s = NULL;
    struct err err = {0};
    int rc = ssd_store_open(c, &s, &err);
    cr_assert_eq(rc, 0, "open: %s", err.msg);
    return s;
}

/* Queues writes of b[0, n), waits until each cookie is back; returns how many succeeded. */
static int write_all(struct ssd_store *s, struct blk *b, int n)
{
    int queued = 0, ok = 0;
    for (int i = 0; i < n; i++) {
        struct err err = {0};
        int rc;
        while ((rc = ssd_store_write(s, &b[i].key, b[i].iov, N_CHUNKS, (uint64_t)i, &err)) ==
               -INFERD_EBUSY)
            ssd_store_wait(s, 100);
        cr_assert(rc == 0 || rc == -INFERD_EEXIST, "write %d: %d %s", i, rc, err.msg);
        queued += rc == 0;
    }
    cr_assert_eq(ssd_store_flush(s, -1), 0);
    struct ssd_done d[64];
    for (int got = 0; got < queued;) {
        int k = ssd_store_poll(s, d, 64);
        for (int i = 0; i < k; i++) {
            cr_assert_eq(d[i].kind, SSD_DONE_WRITE);
            ok += d[i].status == 0;
        }
        got += k;
        if (!k)
            ssd_store_wait(s, 1000);
    }
    return ok;
}

/* Reads block b into out (a scatter list like the pool's) and returns the completion status. */
static int read_one(struct ssd_store *s, const struct ssd_block_key *key, uint8_t *out)
{
    struct iovec dst[N_CHUNKS];
    for (int c = 0; c < N_CHUNKS; c++)
        dst[c] = (struct iovec){out + (size_t)c * CHUNK, CHUNK};
    struct err err = {0};
    int rc = ssd_store_read(s, key, dst, N_CHUNKS, 42, &err);
    if (rc)
        return rc;
    struct ssd_done d;
    while (ssd_store_poll(s, &d, 1) == 0)
        ssd_store_wait(s, 1000);
    cr_assert_eq(d.cookie, 42);
    cr_assert_eq(d.kind, SSD_DONE_READ);
    return d.status;
}

static bool same_data(const struct blk *b, const uint8_t *out)
{
    for (int c = 0; c < N_CHUNKS; c++)
        if (memcmp(b->data[c], out + (size_t)c * CHUNK, CHUNK) != 0)
            return false;
    return true;
}

/* Every block the store offers reads back exactly, or fails: never wrong bytes with status 0.
 * Returns how many read back. */
static int check_offered(struct ssd_store *s, struct blk *b, int n)
{
    uint8_t out[BLOCK_BYTES];
    int good = 0;
    for (int i = 0; i < n; i++) {
        if (!ssd_store_contains(s, b[i].key.hash, NS, NULL))
            continue;
        int st = read_one(s, &b[i].key, out);
        if (st == 0) {
            cr_assert(same_data(&b[i], out), "block %d read back status 0 with wrong bytes", i);
            good++;
        } else {
            cr_assert(st == -INFERD_ECORRUPT || st == -INFERD_ENOENT || st == -INFERD_EIO,
                      "block %d: status %d", i, st);
            cr_assert_not(ssd_store_contains(s, b[i].key.hash, NS, NULL),
                          "a block that failed its read stays offered");
        }
    }
    return good;
}

static char *fp_dir_of(struct ssd_store *s)
{
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    return strdup(st.dir);
}

static void quiet(void)
{
    log_set_level(LOG_ERROR + 1);
}

TestSuite(ssd_store, .init = quiet);
TestSuite(ssd_store_buffered, .init = quiet);

/* The restart and recovery tests run on both write paths: ssd_store's with the default (O_DIRECT
 * where the file system takes it), ssd_store_buffered's through the page cache. */
#define BOTH_PATHS(name, ...)                                                                     \
    static void name(enum ssd_direct_io mode);                                                    \
    Test(ssd_store, name, __VA_ARGS__) { name(SSD_DIRECT_AUTO); }                                 \
    Test(ssd_store_buffered, name, __VA_ARGS__) { name(SSD_DIRECT_OFF); }                         \
    static void name(enum ssd_direct_io mode)

/* Whether an O_DIRECT write of one aligned page works in dir. */
static bool direct_works(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/direct-check", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    bool ok = false;
    if (fd >= 0) {
        void *buf = NULL;
        if (posix_memalign(&buf, 4096, 4096) == 0) {
            memset(buf, 0, 4096);
            ok = pwrite(fd, buf, 4096, 0) == 4096;
            free(buf);
        }
        close(fd);
    }
    unlink(path);
    return ok;
}

Test(ssd_store, many_blocks_round_trip_through_scatter_gather_lists)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    struct ssd_store *s = open_store(&c);
    struct blk *b = blks_make(120, 0);
    cr_assert_eq(write_all(s, b, 120), 120);
    uint8_t out[BLOCK_BYTES];
    for (int i = 0; i < 120; i++) {
        uint32_t nt = 0;
        cr_assert(ssd_store_contains(s, b[i].key.hash, NS, &nt));
        cr_assert_eq(nt, BS);
        memset(out, 0, sizeof out);
        cr_assert_eq(read_one(s, &b[i].key, out), 0);
        cr_assert(same_data(&b[i], out), "block %d", i);
    }
    cr_assert_not(ssd_store_contains(s, b[0].key.hash, NS + 1, NULL), "namespaces are separate");
    struct err err = {0};
    cr_assert_eq(ssd_store_write(s, &b[3].key, b[3].iov, N_CHUNKS, 1, &err), -INFERD_EEXIST);
    struct ssd_block_key too_long = b[3].key;
    too_long.n_tokens = BS + 1;
    too_long.hash ^= 1;
    cr_assert_eq(ssd_store_write(s, &too_long, b[3].iov, N_CHUNKS, 1, &err), -INFERD_EINVAL);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.blocks, 120);
    cr_assert_eq(st.writes, 120);
    cr_assert_eq(st.write_bytes, 120ull * BLOCK_BYTES);
    cr_assert_eq(st.restores, 120);
    cr_assert_eq(st.pending, 0);
    cr_assert_eq(st.verify_failures, 0);
    cr_assert_gt(st.bytes, 120ull * BLOCK_BYTES);
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

BOTH_PATHS(blocks_survive_a_restart_bit_identical, .timeout = 60)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    struct blk *b = blks_make(60, 0);
    struct ssd_store *s = open_store(&c);
    cr_assert_eq(write_all(s, b, 60), 60);
    ssd_store_touch(s, b[0].key.hash, NS);
    ssd_store_close(s);

    s = open_store(&c);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.blocks, 60);
    cr_assert_eq(st.dropped_at_start, 0);
    cr_assert_eq(st.recovered_blocks, 0, "a clean close leaves nothing to recover");
    cr_assert_not(st.index_rebuilt);
    cr_assert_eq(st.direct_io, mode != SSD_DIRECT_OFF && direct_works(dir));
    cr_assert_eq(check_offered(s, b, 60), 60);
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, a_foreign_fingerprint_is_neither_seen_nor_deleted)
{
    char *dir = test_mkdtemp();
    struct ssd_config ca = config(dir, "bf16"), cb = config(dir, "q8g32");
    struct blk *a = blks_make(20, 0), *b = blks_make(20, 1); /* same keys, other K/V */
    struct ssd_store *sa = open_store(&ca), *sb = open_store(&cb);
    char *da = fp_dir_of(sa), *db = fp_dir_of(sb);
    cr_assert_str_neq(da, db);
    cr_assert_eq(write_all(sa, a, 20), 20);
    cr_assert_eq(write_all(sb, b, 10), 10);
    ssd_store_close(sa);
    ssd_store_close(sb);

    sa = open_store(&ca);
    cr_assert_eq(check_offered(sa, a, 20), 20, "a reads its own K/V, never b's");
    ssd_store_close(sa);
    sb = open_store(&cb);
    for (int i = 10; i < 20; i++)
        cr_assert_not(ssd_store_contains(sb, b[i].key.hash, NS, NULL));
    cr_assert_eq(check_offered(sb, b, 20), 10);
    ssd_store_close(sb);
    struct stat st;
    cr_assert_eq(stat(da, &st), 0);
    cr_assert_eq(stat(db, &st), 0);
    free(da);
    free(db);
    free(a);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, a_read_whose_chain_does_not_match_fails_and_drops_the_block)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    struct ssd_store *s = open_store(&c);
    struct blk *b = blks_make(10, 0);
    cr_assert_eq(write_all(s, b, 10), 10);
    uint8_t out[BLOCK_BYTES];

    struct ssd_block_key wrong_parent = b[4].key;
    wrong_parent.parent_hash ^= 1;
    cr_assert_eq(read_one(s, &wrong_parent, out), -INFERD_ECORRUPT);
    cr_assert_not(ssd_store_contains(s, b[4].key.hash, NS, NULL));
    cr_assert_eq(read_one(s, &b[4].key, out), -INFERD_ENOENT, "the row is gone");

    int32_t toks[BS];
    memcpy(toks, b[6].tokens, sizeof toks);
    toks[BS - 1]++;
    struct ssd_block_key wrong_tokens = b[6].key;
    wrong_tokens.tokens = toks;
    cr_assert_eq(read_one(s, &wrong_tokens, out), -INFERD_ECORRUPT);
    cr_assert_not(ssd_store_contains(s, b[6].key.hash, NS, NULL));

    struct iovec short_dst = {out, BLOCK_BYTES - 1};
    struct err err = {0};
    cr_assert_eq(ssd_store_read(s, &b[5].key, &short_dst, 1, 1, &err), -INFERD_EINVAL);
    cr_assert_eq(read_one(s, &b[5].key, out), 0, "the other blocks still read");
    cr_assert(same_data(&b[5], out));

    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.verify_failures, 2);
    cr_assert_eq(st.blocks, 8);
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

static char *only_segment(const char *fpdir);

/* XORs n bytes in the middle of path. */
static void flip_middle(const char *path, int n)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0, "%s", path);
    struct stat st;
    fstat(fd, &st);
    off_t mid = st.st_size / 2;
    uint8_t buf[64];
    ssize_t r = pread(fd, buf, (size_t)n, mid);
    for (ssize_t i = 0; i < r; i++)
        buf[i] ^= 0xa5;
    if (r > 0)
        cr_assert_eq(pwrite(fd, buf, (size_t)r, mid), r);
    close(fd);
}

static int flip_every_file(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) || !S_ISREG(st.st_mode) || st.st_size == 0)
            continue;
        flip_middle(path, 16);
        n++;
    }
    closedir(d);
    return n;
}

BOTH_PATHS(flipped_bytes_in_every_file_never_yield_wrong_data, .timeout = 60)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    struct blk *b = blks_make(80, 0);
    struct ssd_store *s = open_store(&c);
    cr_assert_eq(write_all(s, b, 80), 80);
    char *fpdir = fp_dir_of(s);
    ssd_store_close(s);
    cr_assert_geq(flip_every_file(fpdir), 4, "segments and the index");

    s = open_store(&c); /* never a refusal */
    int good = check_offered(s, b, 80);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_lt(good, 80, "a flipped segment middle costs its block");
    cr_assert_gt(st.verify_failures + st.dropped_at_start + (st.index_rebuilt ? 1 : 0), 0);
    ssd_store_close(s);

    /* what is left keeps reading back right after another restart, checksummed again */
    s = open_store(&c);
    cr_assert_eq(check_offered(s, b, 80), good);
    ssd_store_close(s);
    free(fpdir);
    free(b);
    test_rmtree(dir);
    free(dir);
}

BOTH_PATHS(a_damaged_index_is_rebuilt_from_the_segments, .timeout = 60)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    struct blk *b = blks_make(30, 0);
    struct ssd_store *s = open_store(&c);
    cr_assert_eq(write_all(s, b, 30), 30);
    char *fpdir = fp_dir_of(s);
    ssd_store_close(s);
    char path[4096];
    snprintf(path, sizeof path, "%s/index.sqlite", fpdir);
    cr_assert_eq(test_write_file(path, "this is not a database, not even close..........", 48), 0);

    s = open_store(&c);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert(st.index_rebuilt);
    cr_assert_eq(st.recovered_blocks, 30);
    cr_assert_eq(check_offered(s, b, 30), 30);
    ssd_store_close(s);
    free(fpdir);
    free(b);
    test_rmtree(dir);
    free(dir);
}

BOTH_PATHS(a_flipped_segment_middle_fails_the_first_reads_checksum, .timeout = 60)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    c.segment_bytes = 64 << 20;
    struct blk *b = blks_make(9, 0);
    struct ssd_store *s = open_store(&c);
    cr_assert_eq(write_all(s, b, 9), 9);
    char *fpdir = fp_dir_of(s);
    ssd_store_close(s);
    char *seg = only_segment(fpdir);
    flip_middle(seg, 16); /* inside block 4's data: 9 records of equal length */

    s = open_store(&c);
    cr_assert_eq(check_offered(s, b, 9), 8);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.verify_failures, 1);
    cr_assert_not(ssd_store_contains(s, b[4].key.hash, NS, NULL));
    ssd_store_close(s);
    free(seg);
    free(fpdir);
    free(b);
    test_rmtree(dir);
    free(dir);
}

static char *only_segment(const char *fpdir)
{
    DIR *d = opendir(fpdir);
    struct dirent *de;
    char *seg = NULL;
    int n = 0;
    while ((de = readdir(d)))
        if (strncmp(de->d_name, "seg-", 4) == 0) {
            free(seg);
            cr_assert_geq(asprintf(&seg, "%s/%s", fpdir, de->d_name), 0);
            n++;
        }
    closedir(d);
    cr_assert_eq(n, 1);
    return seg;
}

static off_t file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    return st.st_size;
}

BOTH_PATHS(a_truncated_segment_loses_only_its_cut_block_and_a_torn_tail_is_cut_off, .timeout = 60)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    c.segment_bytes = 64 << 20;
    struct blk *b = blks_make(12, 0);
    struct ssd_store *s = open_store(&c);
    cr_assert_eq(write_all(s, b, 12), 12);
    char *fpdir = fp_dir_of(s);
    ssd_store_close(s);
    char *seg = only_segment(fpdir);
    off_t size = file_size(seg);
    cr_assert_eq(truncate(seg, size - 1000), 0);

    s = open_store(&c);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.dropped_at_start, 1);
    cr_assert_eq(st.torn_tails, 1, "the cut record's first part is cut off too");
    cr_assert_not(ssd_store_contains(s, b[11].key.hash, NS, NULL));
    cr_assert_eq(check_offered(s, b, 12), 11);
    ssd_store_close(s);
    off_t clean = file_size(seg);
    cr_assert_lt(clean, size, "the cut record's remains are gone");

    /* a torn append: half a record's worth of garbage after the last good one */
    int fd = open(seg, O_WRONLY | O_APPEND);
    uint8_t junk[10000];
    memset(junk, 0x77, sizeof junk);
    memcpy(junk, SSD_RECORD_MAGIC, 8);
    cr_assert_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    s = open_store(&c);
    ssd_store_stats(s, &st);
    cr_assert_eq(st.torn_tails, 1);
    cr_assert_eq(st.recovered_blocks, 0);
    cr_assert_eq(check_offered(s, b, 12), 11);
    ssd_store_close(s);
    cr_assert_eq(file_size(seg), clean);
    free(seg);
    free(fpdir);
    free(b);
    test_rmtree(dir);
    free(dir);
}

#define CRASH_BLOCKS 2400

/* The child of the crash loop: writes blocks from first on as fast as the store takes them,
 * never flushing, until it is killed. */
static void crash_child(const struct ssd_config *c, struct blk *b, int first)
{
    struct ssd_store *s = NULL;
    if (ssd_store_open(c, &s, NULL))
        _exit(3);
    for (int i = first;; i = (i + 1) % CRASH_BLOCKS) {
        int rc;
        while ((rc = ssd_store_write(s, &b[i].key, b[i].iov, N_CHUNKS, (uint64_t)i, NULL)) ==
               -INFERD_EBUSY)
            ssd_store_wait(s, 10);
        struct ssd_done d[64];
        while (ssd_store_poll(s, d, 64) > 0)
            ;
        if (rc == -INFERD_EIO)
            _exit(4);
    }
}

BOTH_PATHS(kill_9_while_writing_never_leads_to_a_wrong_read, .timeout = 120)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    c.queue_max_bytes = 16 * BLOCK_BYTES;
    struct blk *b = blks_make(CRASH_BLOCKS, 0);
    srand((unsigned)time(NULL));
    int best = 0;
    for (int it = 0; it < 10; it++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            crash_child(&c, b, it * CRASH_BLOCKS / 10);
        usleep(20000 + (useconds_t)(rand() % 150000));
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the writer died on its own: %d", status);
        struct ssd_store *s = open_store(&c);
        int good = check_offered(s, b, CRASH_BLOCKS);
        if (good > best)
            best = good;
        ssd_store_close(s);
    }
    cr_assert_gt(best, 0, "the writer made some blocks durable");
    free(b);
    test_rmtree(dir);
    free(dir);
}

BOTH_PATHS(a_full_disk_turns_the_tier_off_and_reads_go_on, .timeout = 60)
{
    if (geteuid() != 0)
        cr_skip_test("disk full: not root, cannot mount a tmpfs");
    char *dir = test_mkdtemp();
    if (mount("tmpfs", dir, "tmpfs", 0, "size=4m") != 0) {
        test_rmtree(dir);
        free(dir);
        cr_skip_test("disk full: mounting a tmpfs failed (%s)", strerror(errno));
    }
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = mode;
    struct blk *b = blks_make(40, 0);
    struct ssd_store *s = open_store(&c);
    cr_assert_eq(write_all(s, b, 10), 10);

    /* someone else fills the disk */
    char filler[4096];
    snprintf(filler, sizeof filler, "%s/filler", dir);
    int fd = open(filler, O_WRONLY | O_CREAT, 0644);
    static uint8_t chunk[65536];
    while (write(fd, chunk, sizeof chunk) > 0)
        ;
    while (write(fd, chunk, 512) > 0)
        ;
    close(fd);

    int failed_cookies = 0, refused = 0;
    for (int i = 10; i < 40; i++) {
        struct err err = {0};
        int rc = ssd_store_write(s, &b[i].key, b[i].iov, N_CHUNKS, (uint64_t)i, &err);
        if (rc == -INFERD_EIO)
            refused++;
        else
            cr_assert_eq(rc, 0, "%s", err.msg);
        if (rc == 0) {
            struct ssd_done d;
            while (ssd_store_poll(s, &d, 1) == 0)
                ssd_store_wait(s, 1000);
            failed_cookies += d.status == -INFERD_EIO;
        }
    }
    cr_assert_gt(failed_cookies, 0);
    cr_assert_gt(refused, 0, "once off, writes are refused at once");
    cr_assert_eq(ssd_store_flush(s, -1), -INFERD_EIO);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert(st.disabled);
    cr_assert_gt(st.failed, 0);
    cr_assert_gt(strlen(st.disable_reason), 0);
    cr_assert_eq(check_offered(s, b, 40), 10, "durable blocks still read back");
    ssd_store_close(s);

    unlink(filler);
    s = open_store(&c); /* room again: a fresh open writes */
    cr_assert_eq(check_offered(s, b, 40), 10);
    ssd_store_close(s);
    umount2(dir, MNT_DETACH);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, flush_returns_zero_only_once_everything_queued_is_durable)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    struct ssd_store *s = open_store(&c);
    struct blk *b = blks_make(100, 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(ssd_store_write(s, &b[i].key, b[i].iov, N_CHUNKS, (uint64_t)i, NULL), 0);
    int rc = ssd_store_flush(s, 0);
    cr_assert(rc == 0 || rc == -INFERD_EBUSY, "no wait: durable already, or busy");
    cr_assert_eq(ssd_store_flush(s, -1), 0);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.pending, 0);
    cr_assert_eq(st.pending_bytes, 0);
    cr_assert_eq(st.blocks, 100);
    for (int i = 0; i < 100; i++)
        cr_assert(ssd_store_contains(s, b[i].key.hash, NS, NULL));
    struct ssd_done d[128];
    cr_assert_eq(ssd_store_poll(s, d, 128), 100, "every write's cookie is back by then");
    for (int i = 0; i < 100; i++)
        cr_assert_eq(d[i].status, 0);
    cr_assert_eq(ssd_store_flush(s, 0), 0, "nothing queued: durable at once");
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, a_full_queue_says_busy_and_queues_nothing)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    c.queue_max_bytes = BLOCK_BYTES;
    struct ssd_store *s = open_store(&c);
    struct blk *b = blks_make(300, 0);
    bool queued[300] = {0};
    int busy = 0, n_queued = 0;
    for (int i = 0; i < 300; i++) {
        struct err err = {0};
        int rc = ssd_store_write(s, &b[i].key, b[i].iov, N_CHUNKS, (uint64_t)i, &err);
        if (rc == -INFERD_EBUSY) {
            busy++;
            ssd_store_note_dropped(s, 1);
            continue;
        }
        cr_assert_eq(rc, 0, "%s", err.msg);
        queued[i] = true;
        n_queued++;
    }
    cr_assert_gt(busy, 0, "300 writes against a one-block queue");
    cr_assert_eq(ssd_store_flush(s, -1), 0);
    struct ssd_done d[300];
    cr_assert_eq(ssd_store_poll(s, d, 300), n_queued, "a cookie for each queued write only");
    for (int i = 0; i < 300; i++)
        cr_assert_eq(ssd_store_contains(s, b[i].key.hash, NS, NULL), queued[i]);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_eq(st.dropped, (uint64_t)busy);
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, the_cap_evicts_the_least_recently_used_segments)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    uint64_t rec = ssd_record_len(BS, BLOCK_BYTES);
    c.segment_bytes = 5 * rec;
    c.max_bytes = 4 * c.segment_bytes;
    struct ssd_store *s = open_store(&c);
    struct blk *b = blks_make(60, 0);
    for (int round = 0; round < 12; round++) {
        cr_assert_eq(write_all(s, b + 5 * round, 5), 5);
        usleep(3000);
        ssd_store_touch(s, b[0].key.hash, NS);
    }
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_leq(st.bytes, c.max_bytes);
    cr_assert_gt(st.evicted_blocks, 0);
    cr_assert(ssd_store_contains(s, b[0].key.hash, NS, NULL), "the touched block's segment stays");
    cr_assert_not(ssd_store_contains(s, b[5].key.hash, NS, NULL), "an untouched old one goes");
    cr_assert(ssd_store_contains(s, b[59].key.hash, NS, NULL));
    cr_assert_eq(check_offered(s, b, 60), (int)st.blocks);
    ssd_store_close(s);

    s = open_store(&c);
    ssd_store_stats(s, &st);
    cr_assert_leq(st.bytes, c.max_bytes);
    cr_assert(ssd_store_contains(s, b[0].key.hash, NS, NULL));
    cr_assert_not(ssd_store_contains(s, b[5].key.hash, NS, NULL), "evicted blocks stay gone");
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, last_use_survives_a_restart_and_orders_eviction_there)
{
    char *dir = test_mkdtemp();
    struct ssd_config c = config(dir, "bf16");
    uint64_t rec = ssd_record_len(BS, BLOCK_BYTES);
    c.segment_bytes = 5 * rec;
    struct ssd_store *s = open_store(&c);
    struct blk *b = blks_make(15, 0);
    for (int seg = 0; seg < 3; seg++) {
        cr_assert_eq(write_all(s, b + 5 * seg, 5), 5);
        usleep(3000);
    }
    ssd_store_touch(s, b[0].key.hash, NS); /* the oldest segment is now the most recently used */
    ssd_store_close(s);

    c.max_bytes = 2 * c.segment_bytes; /* room for two of the three */
    s = open_store(&c);
    cr_assert(ssd_store_contains(s, b[0].key.hash, NS, NULL));
    cr_assert_not(ssd_store_contains(s, b[5].key.hash, NS, NULL), "the least recently used went");
    cr_assert(ssd_store_contains(s, b[10].key.hash, NS, NULL));
    ssd_store_close(s);
    free(b);
    test_rmtree(dir);
    free(dir);
}

Test(ssd_store, a_record_with_any_flipped_byte_fails_to_parse)
{
    struct blk b;
    blk_fill(&b, 3, 12345, 0);
    uint64_t len = ssd_record_len(BS, BLOCK_BYTES);
    uint8_t *rec = calloc(1, len);
    struct ssd_record_header h = {.hash = b.key.hash, .parent_hash = b.key.parent_hash, .ns = NS,
                                  .n_tokens = BS, .data_len = BLOCK_BYTES};
    ssd_record_header_encode(&h, rec);
    uint64_t head = ssd_record_head_len(BS);
    cr_assert_eq(head % SSD_RECORD_ALIGN, 0, "the data starts on a 4 KiB boundary");
    memcpy(rec + SSD_RECORD_HEADER_BYTES, b.tokens, sizeof b.tokens);
    memcpy(rec + head, b.data, BLOCK_BYTES);
    size_t body = head + BLOCK_BYTES;
    struct ssd_record_header got;
    cr_assert_eq(ssd_record_parse(rec, len, &got, NULL, NULL, NULL), -INFERD_ECORRUPT,
                 "no checksum yet");
    XXH128_canonical_t ck;
    XXH128_canonicalFromHash(&ck, XXH3_128bits(rec, body));
    memcpy(rec + body, ck.digest, 16);
    const uint8_t *toks = NULL, *data = NULL;
    cr_assert_eq(ssd_record_parse(rec, len, &got, &toks, &data, NULL), 0);
    cr_assert_eq(got.hash, b.key.hash);
    cr_assert_eq(got.parent_hash, b.key.parent_hash);
    cr_assert_eq(got.record_len, len);
    cr_assert_eq(memcmp(data, b.data, BLOCK_BYTES), 0);
    cr_assert_eq(ssd_record_parse(rec, body + 15, &got, NULL, NULL, NULL), -INFERD_ECORRUPT,
                 "one byte short");
    for (size_t at = 0; at < body + 16; at += (at < 256 ? 1 : 97)) {
        rec[at] ^= 0x10;
        cr_assert_neq(ssd_record_parse(rec, len, &got, NULL, NULL, NULL), 0, "byte %zu", at);
        rec[at] ^= 0x10;
    }
    free(rec);
}

/* ---- how segments are written: O_DIRECT, and the page cache where it is refused ---- */

TestSuite(ssd_direct, .init = quiet);

/* The segment files under fpdir, sorted by name; returns how many (at most max). */
static int list_segments(const char *fpdir, char names[][32], int max)
{
    DIR *d = opendir(fpdir);
    cr_assert_not_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        if (strncmp(de->d_name, "seg-", 4) == 0 && n < max)
            snprintf(names[n++], 32, "%.31s", de->d_name);
    closedir(d);
    qsort(names, (size_t)n, 32, (int (*)(const void *, const void *))strcmp);
    return n;
}

static uint8_t *read_whole(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "%s", path);
    struct stat st;
    fstat(fd, &st);
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    cr_assert_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return buf;
}

/* Pages of path in the page cache, and of the file, in *total. */
static size_t resident_pages(const char *path, size_t *total)
{
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    struct stat st;
    fstat(fd, &st);
    long page = sysconf(_SC_PAGESIZE);
    size_t n = ((size_t)st.st_size + (size_t)page - 1) / (size_t)page, in = 0;
    *total = n;
    if (n) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        cr_assert_neq(m, MAP_FAILED);
        unsigned char *vec = malloc(n);
        cr_assert_eq(mincore(m, (size_t)st.st_size, vec), 0);
        for (size_t i = 0; i < n; i++)
            in += vec[i] & 1;
        free(vec);
        munmap(m, (size_t)st.st_size);
    }
    close(fd);
    return in;
}

/* The segment files of fingerprint directories fa and fb hold the same bytes, and the reader's
 * parser takes every record in them, the first one first_hash's; returns how many segments and
 * counts the records in *records. */
static int same_segments(const char *fa, const char *fb, int *records, uint64_t first_hash)
{
    char na[64][32], nb[64][32];
    int n = list_segments(fa, na, 64);
    cr_assert_eq(list_segments(fb, nb, 64), n);
    *records = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(na[i], nb[i]);
        char pa[4096], pb[4096];
        snprintf(pa, sizeof pa, "%s/%s", fa, na[i]);
        snprintf(pb, sizeof pb, "%s/%s", fb, nb[i]);
        size_t la, lb;
        uint8_t *xa = read_whole(pa, &la), *xb = read_whole(pb, &lb);
        cr_assert_eq(la, lb, "%s", na[i]);
        cr_assert_eq(la % SSD_RECORD_ALIGN, 0);
        cr_assert_eq(memcmp(xa, xb, la), 0, "%s: the same bytes either way", na[i]);
        for (size_t off = 0; off < la;) {
            struct ssd_record_header h;
            cr_assert_eq(ssd_record_parse(xa + off, la - off, &h, NULL, NULL, NULL), 0,
                         "%s at %zu", na[i], off);
            cr_assert(*records > 0 || h.hash == first_hash);
            off += h.record_len;
            (*records)++;
        }
        free(xa);
        free(xb);
    }
    return n;
}

/* Two fresh directories for stores to compare; the test is skipped where O_DIRECT does not work. */
static void two_dirs_taking_o_direct(char **da, char **db)
{
    *da = test_mkdtemp();
    *db = test_mkdtemp();
    if (!direct_works(*da)) {
        test_rmtree(*da);
        test_rmtree(*db);
        cr_skip_test("O_DIRECT does not work on the test directory's file system");
    }
}

Test(ssd_direct, direct_writes_lay_out_the_same_bytes_as_buffered_ones, .timeout = 60)
{
    char *da, *db;
    two_dirs_taking_o_direct(&da, &db);
    struct blk *b = blks_make(50, 0);
    /* a staging buffer of 5 pages against records of 7: records straddle every write */
    struct ssd_config ca = config(da, "bf16"), cb = config(db, "bf16");
    ca.direct_io = SSD_DIRECT_ON;
    ca.write_buffer_bytes = 5 * 4096 - 100;
    cb.direct_io = SSD_DIRECT_OFF;
    struct ssd_store *sa = open_store(&ca), *sb = open_store(&cb);
    cr_assert_eq(write_all(sa, b, 50), 50);
    cr_assert_eq(write_all(sb, b, 50), 50);
    struct ssd_stats st;
    ssd_store_stats(sa, &st);
    cr_assert(st.direct_io);
    cr_assert_eq(st.writes, 50);
    cr_assert_gt(st.write_calls, 50, "a record of 7 pages takes more than one 5-page write");
    cr_assert_eq(st.in_place_writes, 0, "pieces of 3,000 bytes are staged");
    ssd_store_stats(sb, &st);
    cr_assert_not(st.direct_io);
    char *fa = fp_dir_of(sa), *fb = fp_dir_of(sb);
    ssd_store_close(sa);
    ssd_store_close(sb);

    int records = 0;
    cr_assert_gt(same_segments(fa, fb, &records, b[0].key.hash), 1,
                 "the blocks fill several segments");
    cr_assert_eq(records, 50);

    /* either store reads what the other path wrote */
    ca.direct_io = SSD_DIRECT_OFF;
    cb.direct_io = SSD_DIRECT_ON;
    sa = open_store(&ca);
    cr_assert_eq(check_offered(sa, b, 50), 50);
    ssd_store_close(sa);
    sb = open_store(&cb);
    cr_assert_eq(check_offered(sb, b, 50), 50);
    ssd_store_close(sb);
    free(fa);
    free(fb);
    free(b);
    test_rmtree(da);
    test_rmtree(db);
    free(da);
    free(db);
}

/* Blocks whose pieces are whole pages in page-aligned memory, as a KV pool in host memory holds
 * them: with O_DIRECT their data goes to disk from where it lies, and the files are the same. */
Test(ssd_direct, aligned_data_is_written_from_where_it_lies, .timeout = 60)
{
    char *da, *db;
    two_dirs_taking_o_direct(&da, &db);
    enum { N = 40, PIECES = 4, PIECE = 4096 };
    uint8_t *mem = NULL;
    cr_assert_eq(posix_memalign((void **)&mem, 4096, (size_t)N * PIECES * PIECE), 0);
    static int32_t tokens[N][BS];
    struct ssd_block_key keys[N];
    struct iovec iov[N][PIECES];
    uint64_t parent = NS, x = 99;
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < BS; t++)
            tokens[i][t] = i * 1000 + t;
        keys[i] = (struct ssd_block_key){.hash = kv_prefix_hash(parent, tokens[i], BS, NS),
                                         .parent_hash = parent, .ns = NS, .n_tokens = BS,
                                         .tokens = tokens[i]};
        parent = keys[i].hash;
        for (int c = 0; c < PIECES; c++) {
            uint8_t *p = mem + ((size_t)i * PIECES + c) * PIECE;
            for (int o = 0; o < PIECE; o++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                p[o] = (uint8_t)(x >> 56);
            }
            iov[i][c] = (struct iovec){p, PIECE};
        }
    }
    struct ssd_config ca = config(da, "bf16"), cb = config(db, "bf16");
    ca.direct_io = SSD_DIRECT_ON;
    ca.write_buffer_bytes = 3 * 4096; /* smaller than a record: data never fits in the buffer */
    cb.direct_io = SSD_DIRECT_OFF;
    struct ssd_store *sa = open_store(&ca), *sb = open_store(&cb);
    struct ssd_store *both[2] = {sa, sb};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N; i++) {
            struct err err = {0};
            cr_assert_eq(ssd_store_write(both[k], &keys[i], iov[i], PIECES, (uint64_t)i, &err), 0,
                         "%s", err.msg);
        }
        cr_assert_eq(ssd_store_flush(both[k], -1), 0);
    }
    struct ssd_stats st;
    ssd_store_stats(sa, &st);
    cr_assert(st.direct_io);
    cr_assert_eq(st.writes, N);
    cr_assert_eq(st.in_place_writes, N, "every record's data went from where it lies");
    cr_assert_leq(st.write_calls, 2 * N + 4, "a record's head and data in one call");
    ssd_store_stats(sb, &st);
    cr_assert_eq(st.in_place_writes, 0);
    char *fa = fp_dir_of(sa), *fb = fp_dir_of(sb);
    ssd_store_close(sa);
    ssd_store_close(sb);
    int records = 0;
    cr_assert_gt(same_segments(fa, fb, &records, keys[0].hash), 0);
    cr_assert_eq(records, N);

    char segs[64][32]; /* out of the page cache again (same_segments read them) */
    for (int i = 0, n = list_segments(fa, segs, 64); i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", fa, segs[i]);
        int sfd = open(path, O_RDONLY);
        cr_assert_geq(sfd, 0);
        posix_fadvise(sfd, 0, 0, POSIX_FADV_DONTNEED);
        close(sfd);
    }
    /* read back, verified, all at once so the batch is shared between threads: into aligned
     * pages (O_DIRECT: the records are not in the page cache), then into one unaligned buffer
     * (through the page cache) */
    uint8_t *out = NULL;
    cr_assert_eq(posix_memalign((void **)&out, 4096, (size_t)2 * N * PIECES * PIECE + 64), 0);
    for (int pass = 0; pass < 2; pass++) {
        sa = open_store(&ca);
        for (int i = 0; i < N; i++) {
            uint8_t *o = out + ((size_t)2 * i + 1) * PIECES * PIECE;
            struct iovec dst[PIECES + 1] = {{out + 16 + (size_t)2 * i * PIECES * PIECE,
                                             PIECES * PIECE}};
            int n_dst = 1;
            if (pass == 0)
                for (n_dst = 0; n_dst < PIECES; n_dst++)
                    dst[n_dst] = (struct iovec){o + (size_t)n_dst * PIECE, PIECE};
            struct err err = {0};
            cr_assert_eq(ssd_store_read(sa, &keys[i], dst, n_dst, (uint64_t)i, &err), 0, "%s",
                         err.msg);
        }
        struct ssd_done d[N];
        for (int got = 0; got < N;) {
            int k = ssd_store_poll(sa, d, N);
            for (int i = 0; i < k; i++)
                cr_assert_eq(d[i].status, 0, "block %lu, pass %d", (unsigned long)d[i].cookie, pass);
            got += k;
            if (!k)
                ssd_store_wait(sa, 1000);
        }
        for (int i = 0; i < N; i++) {
            const uint8_t *o = pass == 0 ? out + ((size_t)2 * i + 1) * PIECES * PIECE
                                         : out + 16 + (size_t)2 * i * PIECES * PIECE;
            cr_assert_eq(memcmp(o, mem + (size_t)i * PIECES * PIECE, PIECES * PIECE), 0,
                         "block %d, pass %d", i, pass);
        }
        ssd_store_close(sa);
    }
    /* a byte flipped in block 0's data fails the aligned read's checks too */
    char p0[4096];
    snprintf(p0, sizeof p0, "%s/%s", fa, segs[0]);
    int fd = open(p0, O_RDWR);
    cr_assert_geq(fd, 0);
    off_t at = (off_t)ssd_record_head_len(BS) + 100;
    uint8_t byte;
    cr_assert_eq(pread(fd, &byte, 1, at), 1);
    byte ^= 0x01;
    cr_assert_eq(pwrite(fd, &byte, 1, at), 1);
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    sa = open_store(&ca);
    struct iovec dst[PIECES];
    for (int c = 0; c < PIECES; c++)
        dst[c] = (struct iovec){out + (size_t)c * PIECE, PIECE};
    struct err err = {0};
    cr_assert_eq(ssd_store_read(sa, &keys[0], dst, PIECES, 1, &err), 0, "%s", err.msg);
    struct ssd_done d;
    while (ssd_store_poll(sa, &d, 1) == 0)
        ssd_store_wait(sa, 1000);
    cr_assert_eq(d.status, -INFERD_ECORRUPT);
    cr_assert_not(ssd_store_contains(sa, keys[0].hash, NS, NULL), "the damaged block is dropped");
    ssd_store_close(sa);
    free(out);
    free(mem);
    free(fa);
    free(fb);
    test_rmtree(da);
    test_rmtree(db);
    free(da);
    free(db);
}

Test(ssd_direct, written_segments_do_not_stay_in_the_page_cache, .timeout = 60)
{
    enum ssd_direct_io modes[] = {SSD_DIRECT_AUTO, SSD_DIRECT_OFF};
    for (int m = 0; m < 2; m++) {
        char *dir = test_mkdtemp();
        struct ssd_config c = config(dir, "bf16");
        c.direct_io = modes[m];
        struct blk *b = blks_make(60, 0);
        struct ssd_store *s = open_store(&c);
        cr_assert_eq(write_all(s, b, 60), 60);
        char *fp = fp_dir_of(s);
        ssd_store_close(s);
        char names[64][32];
        int n = list_segments(fp, names, 64);
        size_t in = 0, total = 0;
        for (int i = 0; i < n; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", fp, names[i]);
            size_t t;
            in += resident_pages(path, &t);
            total += t;
        }
        cr_assert_gt(total, 0);
        cr_assert_leq(in * 4, total, "mode %d: %zu of %zu pages cached after the writes",
                      (int)modes[m], in, total);
        free(fp);
        free(b);
        test_rmtree(dir);
        free(dir);
    }
}

Test(ssd_direct, a_file_system_that_refuses_o_direct_gets_buffered_writes, .timeout = 60)
{
    if (geteuid() != 0)
        cr_skip_test("O_DIRECT refused: not root, cannot mount a ramfs");
    char *dir = test_mkdtemp();
    if (mount("ramfs", dir, "ramfs", 0, NULL) != 0) {
        test_rmtree(dir);
        free(dir);
        cr_skip_test("O_DIRECT refused: mounting a ramfs failed (%s)", strerror(errno));
    }
    if (direct_works(dir)) {
        umount2(dir, MNT_DETACH);
        test_rmtree(dir);
        free(dir);
        cr_skip_test("this kernel's ramfs takes O_DIRECT");
    }
    struct ssd_config c = config(dir, "bf16");
    c.direct_io = SSD_DIRECT_ON;
    struct ssd_store *s = NULL;
    struct err err = {0};
    cr_assert_eq(ssd_store_open(&c, &s, &err), -INFERD_EINVAL, "on: O_DIRECT or no store");
    cr_assert_null(s);
    cr_assert_not_null(strstr(err.msg, "O_DIRECT"), "%s", err.msg);

    c.direct_io = SSD_DIRECT_AUTO;
    struct blk *b = blks_make(30, 0);
    s = open_store(&c);
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    cr_assert_not(st.direct_io, "auto falls back");
    cr_assert_eq(write_all(s, b, 30), 30);
    char *fp = fp_dir_of(s);
    ssd_store_close(s);
    s = open_store(&c);
    ssd_store_stats(s, &st);
    cr_assert_not(st.direct_io);
    cr_assert_eq(st.blocks, 30);
    cr_assert_eq(check_offered(s, b, 30), 30);
    ssd_store_close(s);
    DIR *d = opendir(fp);
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        cr_assert(len < 4 || strcmp(de->d_name + len - 4, ".tmp") != 0, "%s left", de->d_name);
    }
    closedir(d);
    free(fp);
    free(b);
    umount2(dir, MNT_DETACH);
    test_rmtree(dir);
    free(dir);
}
