/* bench/ssd_store_bench.c — the SSD tier's layout choice measured: append-only segments (the store
 * itself) against one file per block, writes and cold/warm reads; and the kill -9 loop's writer
 * and checker (bench/ssd_crash.sh).
 *
 * Usage: ssd_store_bench [DIR [N_BLOCKS]]          layouts compared under DIR (made, then removed)
 *        ssd_store_bench --crash-writer DIR FIRST  writes blocks from FIRST on until killed
 *        ssd_store_bench --crash-check DIR         reads every block the store offers; exit 1 on
 *                                                  a wrong block read with status 0
 *        ssd_store_bench --writer-cost DIR [N]     what writing N blocks (default 256) costs the
 *                                                  CPUs with O_DIRECT and through the page cache:
 *                                                  the I/O thread's CPU time, the process's, the
 *                                                  whole machine's busy time (kernel threads
 *                                                  included: writeback, reclaim), write calls
 * Blocks have Qwen3-0.6B's shape: 28 layers, K and V apart (56 chunks), 16 tokens of
 * 8 x 128 bf16 values = 1.75 MiB. Cold reads drop the files' cached pages first
 * (posix_fadvise DONTNEED after an fsync; no root needed). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/timer.h"
#include "kv/kv.h"
#include "kv/ssd.h"

#define BS 16
#define NS 3

struct shape {
    int n_chunks;
    size_t chunk;
};

/* The bench's blocks (Qwen3-0.6B) and the crash loop's (smaller, so 100 rounds stay short). */
static const struct shape BENCH_SHAPE = {56, (size_t)BS * 8 * 128 * 2};
static const struct shape CRASH_SHAPE = {56, (size_t)BS * 2 * 128 * 2};
#define CRASH_BLOCKS 4000

struct block {
    int32_t tokens[BS];
    struct ssd_block_key key;
    uint8_t *data;        /* owned; n_chunks * chunk */
    struct iovec *iov;    /* owned; n_chunks */
};

static void block_fill(struct block *b, const struct shape *sh, int i, uint64_t parent)
{
    for (int t = 0; t < BS; t++)
        b->tokens[t] = i * 1000 + t;
    b->key = (struct ssd_block_key){.hash = kv_prefix_hash(parent, b->tokens, BS, NS),
                                    .parent_hash = parent, .ns = NS, .n_tokens = BS,
                                    .tokens = b->tokens};
    size_t n = (size_t)sh->n_chunks * sh->chunk;
    if (!b->data) {
        b->data = malloc(n);
        b->iov = malloc((size_t)sh->n_chunks * sizeof *b->iov);
        if (!b->data || !b->iov) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
    }
    uint64_t x = hash_mix64(b->key.hash);
    uint64_t *w = (uint64_t *)b->data;
    for (size_t k = 0; k < n / 8; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w[k] = x ^ (x >> 29);
    }
    for (int c = 0; c < sh->n_chunks; c++)
        b->iov[c] = (struct iovec){b->data + (size_t)c * sh->chunk, sh->chunk};
}

static struct block *blocks_make(const struct shape *sh, int n)
{
    struct block *b = calloc((size_t)n, sizeof *b);
    for (int i = 0; b && i < n; i++)
        block_fill(&b[i], sh, i, i ? b[i - 1].key.hash : NS);
    return b;
}

static struct ssd_config bench_config(const char *dir)
{
    struct ssd_config c = {.dir = dir, .queue_max_bytes = (size_t)1 << 30};
    c.fp.model_digest = 0xbe7c;
    c.fp.tokenizer_digest = 1;
    snprintf(c.fp.kv_format, sizeof c.fp.kv_format, "bf16");
    c.fp.block_size = BS;
    snprintf(c.fp.backend_identity, sizeof c.fp.backend_identity, "bench");
    return c;
}

static struct ssd_store *store_open(const struct ssd_config *c)
{
    struct ssd_store *s = NULL;
    struct err err = {0};
    if (ssd_store_open(c, &s, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        exit(2);
    }
    return s;
}

static int drain(struct ssd_store *s, int n)
{
    struct ssd_done d[256];
    int got = 0, bad = 0;
    while (got < n) {
        int k = ssd_store_poll(s, d, 256);
        for (int i = 0; i < k; i++)
            bad += d[i].status != 0;
        got += k;
        if (!k)
            ssd_store_wait(s, 1000);
    }
    return bad;
}

/* Drops the cached pages of every regular file under dir (they are clean: fsynced). */
static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        int fd = open(p, O_RDONLY);
        if (fd >= 0) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    if (d)
        closedir(d);
}

static void rm_rf(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static double mbps(uint64_t bytes, uint64_t ns)
{
    return (double)bytes / ((double)ns * 1e-9) / 1e6;
}

/* ---- segments: the store ---- */

static void bench_segments(const char *root, struct block *b, int n, size_t block_bytes,
                           bool trickle)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/segments", root);
    struct ssd_config c = bench_config(dir);
    struct ssd_store *s = store_open(&c);
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        struct err err = {0};
        int rc;
        while ((rc = ssd_store_write(s, &b[i].key, b[i].iov, BENCH_SHAPE.n_chunks, (uint64_t)i,
                                     &err)) == -INFERD_EBUSY)
            drain(s, 1);
        if (rc) {
            fprintf(stderr, "write: %s\n", err.msg);
            exit(2);
        }
        if (trickle && ssd_store_flush(s, -1)) {
            fprintf(stderr, "flush failed\n");
            exit(2);
        }
    }
    if (ssd_store_flush(s, -1)) {
        fprintf(stderr, "flush failed\n");
        exit(2);
    }
    uint64_t tw = now_ns() - t0;
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    char fpdir[4096];
    snprintf(fpdir, sizeof fpdir, "%s", st.dir);
    double bw = ssd_store_read_bandwidth(s);
    ssd_store_close(s);
    printf("segments %-8s write: %8.1f MB/s  (%d blocks, %s)\n", trickle ? "trickle" : "batched",
           mbps((uint64_t)n * block_bytes, tw), n,
           trickle ? "a flush after each" : "written behind, one flush at the end");
    if (trickle) {
        rm_rf(dir);
        return;
    }
    printf("segments probe   read:  %8.1f MB/s  (ssd_store_read_bandwidth, O_DIRECT)\n", bw / 1e6);

    uint8_t *out = malloc(block_bytes);
    struct iovec *dst = malloc((size_t)BENCH_SHAPE.n_chunks * sizeof *dst);
    for (int c2 = 0; c2 < BENCH_SHAPE.n_chunks; c2++)
        dst[c2] = (struct iovec){out + (size_t)c2 * BENCH_SHAPE.chunk, BENCH_SHAPE.chunk};
    for (int pass = 0; pass < 2; pass++) {
        drop_cache(fpdir);
        s = store_open(&c);
        if (pass == 1) { /* warm: read once to fill the page cache and verify, then time */
            for (int i = 0; i < n; i++) {
                ssd_store_read(s, &b[i].key, dst, BENCH_SHAPE.n_chunks, (uint64_t)i, NULL);
                drain(s, 1);
            }
        }
        t0 = now_ns();
        int bad = 0;
        for (int i = 0; i < n; i++) { /* one at a time: the same buffer is the destination */
            if (ssd_store_read(s, &b[i].key, dst, BENCH_SHAPE.n_chunks, (uint64_t)i, NULL))
                bad++;
            else
                bad += drain(s, 1);
        }
        uint64_t tr = now_ns() - t0;
        printf("segments %-8s read:  %8.1f MB/s  (%s%s)\n", pass ? "warm" : "cold",
               mbps((uint64_t)n * block_bytes, tr),
               pass ? "page cache, chain check only" : "page cache dropped, checksummed",
               bad ? ", FAILURES" : "");
        ssd_store_close(s);
    }
    free(out);
    free(dst);
    rm_rf(dir);
}

/* ---- one file per block: tmp, fdatasync, rename, directory fsync ---- */

static void file_write(const char *dir, const struct block *b, size_t block_bytes,
                       bool sync_now, int *fd_out)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/%016" PRIx64 ".tmp", dir, b->key.hash);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(tmp);
        exit(2);
    }
    struct ssd_record_header h = {.hash = b->key.hash, .parent_hash = b->key.parent_hash,
                                  .ns = NS, .n_tokens = BS, .data_len = block_bytes};
    uint8_t hdr[SSD_RECORD_HEADER_BYTES];
    ssd_record_header_encode(&h, hdr);
    XXH3_state_t *st = XXH3_createState();
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, hdr, sizeof hdr);
    XXH3_128bits_update(st, b->tokens, sizeof b->tokens);
    XXH3_128bits_update(st, b->data, block_bytes);
    XXH128_canonical_t ck;
    XXH128_canonicalFromHash(&ck, XXH3_128bits_digest(st));
    XXH3_freeState(st);
    struct iovec v[BENCH_SHAPE.n_chunks + 3];
    int k = 0;
    v[k++] = (struct iovec){hdr, sizeof hdr};
    v[k++] = (struct iovec){(void *)b->tokens, sizeof b->tokens};
    for (int c = 0; c < BENCH_SHAPE.n_chunks; c++)
        v[k++] = b->iov[c];
    v[k++] = (struct iovec){ck.digest, 16};
    if (pwritev(fd, v, k, 0) < (ssize_t)block_bytes) {
        perror("pwritev");
        exit(2);
    }
    if (sync_now) {
        fdatasync(fd);
        close(fd);
        char fin[4200];
        snprintf(fin, sizeof fin, "%s/%016" PRIx64 ".blk", dir, b->key.hash);
        rename(tmp, fin);
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        fsync(dfd);
        close(dfd);
    } else {
        *fd_out = fd;
    }
}

static void bench_files(const char *root, struct block *b, int n, size_t block_bytes, bool trickle)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/files", root);
    mkdir(dir, 0755);
    int *fds = malloc((size_t)n * sizeof *fds);
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++)
        file_write(dir, &b[i], block_bytes, trickle, &fds[i]);
    if (!trickle) { /* group commit as far as files allow: every file synced, then one dir fsync */
        for (int i = 0; i < n; i++) {
            fdatasync(fds[i]);
            close(fds[i]);
            char tmp[4200], fin[4200];
            snprintf(tmp, sizeof tmp, "%s/%016" PRIx64 ".tmp", dir, b[i].key.hash);
            snprintf(fin, sizeof fin, "%s/%016" PRIx64 ".blk", dir, b[i].key.hash);
            rename(tmp, fin);
        }
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        fsync(dfd);
        close(dfd);
    }
    uint64_t tw = now_ns() - t0;
    printf("files    %-8s write: %8.1f MB/s  (%d files, %d fsyncs + %d directory fsyncs)\n",
           trickle ? "trickle" : "batched", mbps((uint64_t)n * block_bytes, tw), n, n,
           trickle ? n : 1);
    free(fds);
    if (trickle) {
        rm_rf(dir);
        return;
    }
    uint8_t *out = malloc(block_bytes);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            drop_cache(dir);
        t0 = now_ns();
        int bad = 0;
        for (int i = 0; i < n; i++) {
            char fin[4200];
            snprintf(fin, sizeof fin, "%s/%016" PRIx64 ".blk", dir, b[i].key.hash);
            int fd = open(fin, O_RDONLY);
            uint8_t hdr[SSD_RECORD_HEADER_BYTES], toks[BS * 4], ck[16];
            struct iovec v[4] = {{hdr, sizeof hdr}, {toks, sizeof toks}, {out, block_bytes},
                                 {ck, 16}};
            ssize_t r = preadv(fd, v, 4, 0);
            close(fd);
            if (r != (ssize_t)(sizeof hdr + sizeof toks + block_bytes + 16)) {
                bad++;
                continue;
            }
            if (pass == 0) {
                XXH3_state_t *st = XXH3_createState();
                XXH3_128bits_reset(st);
                XXH3_128bits_update(st, hdr, sizeof hdr);
                XXH3_128bits_update(st, toks, sizeof toks);
                XXH3_128bits_update(st, out, block_bytes);
                XXH128_canonical_t c;
                XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
                XXH3_freeState(st);
                bad += memcmp(c.digest, ck, 16) != 0;
            }
        }
        uint64_t tr = now_ns() - t0;
        printf("files    %-8s read:  %8.1f MB/s  (%s%s)\n", pass ? "warm" : "cold",
               mbps((uint64_t)n * block_bytes, tr),
               pass ? "page cache" : "page cache dropped, checksummed", bad ? ", FAILURES" : "");
    }
    free(out);
    rm_rf(dir);
}

/* ---- the kill -9 loop (bench/ssd_crash.sh) ---- */

static struct ssd_config crash_config(const char *dir)
{
    struct ssd_config c = bench_config(dir);
    c.max_bytes = (uint64_t)128 << 20;
    c.segment_bytes = (uint64_t)8 << 20;
    c.queue_max_bytes = (size_t)16 << 20;
    c.probe_bytes = (size_t)1 << 20;
    return c;
}

/* The chain's hashes only (blocks are filled when used). */
static uint64_t *crash_chain(void)
{
    uint64_t *h = malloc((CRASH_BLOCKS + 1) * sizeof *h);
    int32_t toks[BS];
    h[0] = NS; /* h[i + 1] is block i's hash; h[i] its parent's */
    for (int i = 0; i < CRASH_BLOCKS; i++) {
        for (int t = 0; t < BS; t++)
            toks[t] = i * 1000 + t;
        h[i + 1] = kv_prefix_hash(h[i], toks, BS, NS);
    }
    return h;
}

static int crash_writer(const char *dir, int first)
{
    log_set_level(LOG_ERROR);
    struct ssd_config c = crash_config(dir);
    struct ssd_store *s = store_open(&c);
    uint64_t *h = crash_chain();
    enum { RING = 64 };
    struct block ring[RING] = {0}; /* a block's buffer is reused once its cookie is back */
    bool busy[RING] = {0};
    for (int k = 0, i = first % CRASH_BLOCKS;; k++, i = (i + 1) % CRASH_BLOCKS) {
        int slot = k % RING;
        while (busy[slot]) {
            struct ssd_done d[RING];
            int got = ssd_store_poll(s, d, RING);
            for (int j = 0; j < got; j++)
                busy[d[j].cookie] = false;
            if (!got)
                ssd_store_wait(s, 100);
        }
        block_fill(&ring[slot], &CRASH_SHAPE, i, h[i]);
        int rc;
        while ((rc = ssd_store_write(s, &ring[slot].key, ring[slot].iov, CRASH_SHAPE.n_chunks,
                                     (uint64_t)slot, NULL)) == -INFERD_EBUSY) {
            struct ssd_done d[RING];
            ssd_store_wait(s, 100);
            int got = ssd_store_poll(s, d, RING);
            for (int j = 0; j < got; j++)
                busy[d[j].cookie] = false;
        }
        if (rc == 0)
            busy[slot] = true;
        else if (rc != -INFERD_EEXIST)
            return 3;
    }
}

static int crash_check(const char *dir)
{
    log_set_level(LOG_WARN);
    struct ssd_config c = crash_config(dir);
    struct ssd_store *s = store_open(&c);
    uint64_t *h = crash_chain();
    struct block want = {0};
    size_t bytes = (size_t)CRASH_SHAPE.n_chunks * CRASH_SHAPE.chunk;
    uint8_t *out = malloc(bytes);
    struct iovec *dst = malloc((size_t)CRASH_SHAPE.n_chunks * sizeof *dst);
    for (int k = 0; k < CRASH_SHAPE.n_chunks; k++)
        dst[k] = (struct iovec){out + (size_t)k * CRASH_SHAPE.chunk, CRASH_SHAPE.chunk};
    int offered = 0, good = 0, failed = 0, wrong = 0;
    for (int i = 0; i < CRASH_BLOCKS; i++) {
        if (!ssd_store_contains(s, h[i + 1], NS, NULL))
            continue;
        offered++;
        block_fill(&want, &CRASH_SHAPE, i, h[i]);
        memset(out, 0, bytes);
        struct ssd_done d = {0};
        if (ssd_store_read(s, &want.key, dst, CRASH_SHAPE.n_chunks, 1, NULL)) {
            failed++;
            continue;
        }
        while (ssd_store_poll(s, &d, 1) == 0)
            ssd_store_wait(s, 1000);
        if (d.status != 0)
            failed++;
        else if (memcmp(out, want.data, bytes) != 0)
            wrong++;
        else
            good++;
    }
    struct ssd_stats st;
    ssd_store_stats(s, &st);
    printf("offered %d good %d failed %d wrong %d recovered %" PRIu64 " dropped_at_start %" PRIu64
           " verify_failures %" PRIu64 " index_rebuilt %d torn_tails %" PRIu64 " bytes %" PRIu64 "\n",
           offered, good, failed, wrong, st.recovered_blocks, st.dropped_at_start,
           st.verify_failures, st.index_rebuilt, st.torn_tails, st.bytes);
    ssd_store_close(s);
    free(h);
    free(out);
    free(dst);
    free(want.data);
    free(want.iov);
    return wrong ? 1 : 0;
}

/* Busy time of every CPU together (user, nice, system, irq, softirq, steal), in ms. */
static double machine_busy_ms(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (!f)
        return 0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8)
        return 0;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static double process_cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3;
}

/* Writes b[0, n) into a fresh store under root with the given --ssd-direct-io, all queued at
 * once, and prints what it cost; rounds alternate the modes so drift hits both alike. */
static int writer_cost(const char *root, int n)
{
    log_set_level(LOG_WARN);
    if (mkdir(root, 0755) && errno != EEXIST) {
        perror(root);
        return 2;
    }
    size_t block_bytes = (size_t)BENCH_SHAPE.n_chunks * BENCH_SHAPE.chunk;
    struct block *b = blocks_make(&BENCH_SHAPE, n);
    if (!b)
        return 2;
    double mib = (double)n * (double)block_bytes / (1 << 20);
    printf("%d blocks of %.2f MiB (%.0f MiB) queued at once, then flushed, under %s\n", n,
           (double)block_bytes / (1 << 20), mib, root);
    printf("| --ssd-direct-io | direct_io | durable MB/s | I/O thread CPU ms | process CPU ms "
           "| machine busy ms | write calls |\n|---|---|---|---|---|---|---|\n");
    static const char *const names[] = {"auto", "off"};
    for (int round = 0; round < 6; round++) {
        int m = (round % 2) ^ (round / 2 % 2);
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s-%d", root, names[m], round);
        struct ssd_config c = bench_config(dir);
        c.direct_io = m ? SSD_DIRECT_OFF : SSD_DIRECT_AUTO;
        c.probe_bytes = 1 << 20;
        struct ssd_store *s = store_open(&c);
        struct ssd_stats st0, st;
        ssd_store_stats(s, &st0);
        double busy0 = machine_busy_ms(), cpu0 = process_cpu_ms();
        uint64_t t0 = now_ns();
        for (int i = 0; i < n; i++)
            if (ssd_store_write(s, &b[i].key, b[i].iov, BENCH_SHAPE.n_chunks, (uint64_t)i, NULL)) {
                fprintf(stderr, "writer-cost: block %d not queued\n", i);
                return 2;
            }
        int rc = ssd_store_flush(s, -1);
        double secs = (double)(now_ns() - t0) * 1e-9;
        double busy = machine_busy_ms() - busy0, cpu = process_cpu_ms() - cpu0;
        ssd_store_stats(s, &st);
        int bad = drain(s, n);
        ssd_store_close(s);
        rm_rf(dir);
        if (rc || bad) {
            fprintf(stderr, "writer-cost: flush %d, %d writes failed\n", rc, bad);
            return 2;
        }
        printf("| %s | %s | %.0f | %.1f | %.1f | %.0f | %" PRIu64 " |\n", names[m],
               st.direct_io ? "true" : "false", mib * (1 << 20) / secs / 1e6,
               (double)(st.io_cpu_ns - st0.io_cpu_ns) * 1e-6, cpu, busy,
               st.write_calls - st0.write_calls);
    }
    for (int i = 0; i < n; i++) {
        free(b[i].data);
        free(b[i].iov);
    }
    free(b);
    rm_rf(root);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--writer-cost") == 0)
        return writer_cost(argv[2], argc > 3 ? atoi(argv[3]) : 256);
    if (argc >= 4 && strcmp(argv[1], "--crash-writer") == 0)
        return crash_writer(argv[2], atoi(argv[3]));
    if (argc >= 3 && strcmp(argv[1], "--crash-check") == 0)
        return crash_check(argv[2]);
    log_set_level(LOG_WARN);
    const char *root = argc > 1 ? argv[1] : "ssd-bench-tmp";
    int n = argc > 2 ? atoi(argv[2]) : 256;
    if (mkdir(root, 0755) && errno != EEXIST) {
        perror(root);
        return 2;
    }
    size_t block_bytes = (size_t)BENCH_SHAPE.n_chunks * BENCH_SHAPE.chunk;
    printf("%d blocks of %.2f MiB (%d chunks of %zu KiB) under %s\n", n,
           (double)block_bytes / (1 << 20), BENCH_SHAPE.n_chunks, BENCH_SHAPE.chunk >> 10, root);
    struct block *b = blocks_make(&BENCH_SHAPE, n);
    if (!b)
        return 2;
    int n_trickle = n < 64 ? n : 64;
    bench_segments(root, b, n_trickle, block_bytes, true);
    bench_files(root, b, n_trickle, block_bytes, true);
    bench_segments(root, b, n, block_bytes, false);
    bench_files(root, b, n, block_bytes, false);
    rm_rf(root);
    for (int i = 0; i < n; i++) {
        free(b[i].data);
        free(b[i].iov);
    }
    free(b);
    return 0;
}
