/* kv/ssd.c — the SSD tier's block store: an in-memory index for the engine, a write-behind queue,
 * one I/O thread that appends records to segment files and keeps the SQLite index, recovery at
 * open, verification on restore, and whole-segment eviction under the cap.
 *
 * Why append-only segments and not a file per block (bench/ssd_store_bench.c, bench/RESULTS.md
 * "SSD store"): a file per block pays a create, an fsync of its own and a rename + directory
 * fsync for every ~2 MiB block, and a read pays an open; a segment takes a whole batch of queued
 * blocks with one fdatasync (group commit), and recovery after a crash only has to look past the
 * last indexed record of each segment. Measured on the development machine's disk with 1.75 MiB
 * blocks (medians of five runs): a burst of 256 blocks made durable at 335 MB/s as segments
 * against 154 as files, cold checksummed reads at 869 against 346 MB/s (readahead carries across
 * a segment's records), and one block made durable at a time within that disk's noise of each
 * other (216 against 270 MB/s, ranges overlapping).
 *
 * Capacity: when the segment files pass the cap, whole segments go, the one whose most recently
 * used block is the oldest first (LRU at segment granularity, never the segment being written).
 * No compaction: a hot block in an old segment keeps its segment, and the bytes of blocks dropped
 * for failing verification stay until their segment goes.
 *
 * Writes around the page cache: a decode's thread pool spins on every core, so what the writer
 * costs beside it is CPU time on those cores. Buffered writes cost a copy into the page cache
 * inside the system call (not preemptible on most kernels, whatever the thread's priority),
 * page allocation and reclaim, and writeback; with O_DIRECT the writer copies each record once
 * into a page-aligned staging buffer in user space (preemptible, hashed while the bytes are in
 * cache), and the device takes the buffer by DMA in writes of up to write_buffer_bytes, while
 * the thread sleeps. The records' 4 KiB alignment (offset and length) is what O_DIRECT needs,
 * so the format does not change. Where O_DIRECT is refused (probed once at open; a write that
 * still gets EINVAL turns it off for good under auto) the records go through the page cache as
 * before, gathered straight from the caller's buffers, and the pages are dropped
 * (POSIX_FADV_DONTNEED) once the group commit has made them durable.
 *
 * Threads: the owner (engine) thread calls the public functions; they only touch the queue, the
 * in-memory index and the counters under s->mu. The I/O thread alone touches SQLite and the
 * segments (open does, before it starts the thread), without holding s->mu during I/O. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kv/ssd.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/timer.h"

#define SEGMENT_BYTES_DEFAULT ((uint64_t)64 << 20)
#define SEGMENT_BYTES_MIN ((uint64_t)1 << 20)
#define QUEUE_BYTES_DEFAULT ((size_t)1 << 30)
#define PROBE_BYTES_DEFAULT ((size_t)32 << 20)
#define PROBE_CHUNK ((size_t)1 << 20)
#define WRITE_BATCH_BYTES ((uint64_t)256 << 20)   /* most data one fdatasync covers */
#define TOUCH_PERSIST_NS 1000000000ull            /* idle touches reach SQLite within this */
#define FREE_SPACE_RESERVE ((uint64_t)256 << 20)  /* left free on the disk when there is no cap */
#define WRITE_BUFFER_DEFAULT ((size_t)8 << 20)    /* O_DIRECT staging: the largest single write */
#define HASH_PIECE ((size_t)256 << 10)            /* copied then hashed while still in cache */
#define BACKGROUND_PIECE ((size_t)64 << 10)       /* hashed or copied between yields at idle priority */
#define READ_THREADS 8                            /* threads that read one batch, the I/O thread's included */
#define READ_BLOCKS_PER_THREAD 4                  /* a batch's blocks for each of them */
#define INDEX_FILE "index.sqlite"
#define SCHEMA_VERSION 1

/* ---- the in-memory index: (hash, ns) -> where the record is ---------------------------------- */

enum entry_state { ENTRY_EMPTY = 0, ENTRY_QUEUED, ENTRY_DURABLE };

struct entry {
    uint64_t hash, ns;
    uint64_t off, len, data_len; /* len: the whole record, padding included */
    uint64_t parent;
    uint64_t last_use;           /* wall-clock ms */
    uint32_t seg, n_tokens;
    uint8_t state, verified, dirty;
    uint8_t checksum[16];        /* the index row's copy of the record's checksum */
};

struct key {
    uint64_t hash, ns;
};

/* ---- queued operations ------------------------------------------------------------------------ */

struct job {
    struct job *next;
    enum ssd_done_kind kind;
    uint64_t cookie, seq, queued_ns;
    uint64_t hash, parent, ns, data_len;
    uint32_t n_tokens;
    int32_t *tokens;    /* owned (inside this allocation) */
    struct iovec *iov;  /* owned array (inside this allocation); the buffers are the caller's */
    int n_iov;
    int status;
    bool drop;          /* a read whose block is to leave the store (it failed its checks) */
    bool cached;        /* a read whose record is mostly in the page cache (read through it) */
    /* set by a write once its record is on disk */
    uint32_t seg;
    uint64_t off, len;
    uint8_t checksum[16];
};

struct segment {
    uint32_t id;
    uint64_t size;
};

struct ssd_store {
    struct ssd_config cfg;      /* cfg.dir points at root */
    char *root;                 /* owned: DIR */
    char *dir;                  /* owned: DIR/<digest> */
    uint8_t fp_digest[16];
    uint64_t seg_bytes, cap_bytes;
    double read_bw;             /* bytes/s: the disk, read as a restore reads it (the probe at open) */
    double cache_bw;            /* bytes/s: the same bytes from the page cache */

    /* I/O thread only (and open, before the thread starts): */
    sqlite3 *db;
    sqlite3_stmt *st_insert, *st_delete, *st_touch, *st_delete_seg;
    struct segment *segs;       /* owned; n_segs, ordered by id */
    int n_segs, cap_segs;
    int active_fd;              /* the segment being appended to (the last in segs), or -1 */
    int lock_fd;                /* flock'd: one process per fingerprint directory */
    uint32_t next_seg_id;
    bool direct;                /* segments are opened with O_DIRECT (records staged in wbuf) */
    size_t dio_mem_align;       /* O_DIRECT: the alignment a buffer's address needs (statx, else a page) */
    size_t dio_len_align;       /* O_DIRECT: the alignment a buffer's length needs (likewise) */
    uint8_t *wbuf;              /* owned: the page-aligned staging buffer (direct only) */
    size_t wbuf_cap, wbuf_used; /* empty between batches */
    uint64_t wbuf_off;          /* where wbuf[0] goes in the active segment */
    uint64_t batch_off;         /* buffered: where this batch began in the active segment */
    uint64_t write_calls;       /* system calls that appended records */
    uint64_t in_place_writes;   /* records whose data went to disk from the caller's memory */
    _Atomic uint64_t reader_cpu_ns; /* CPU time of the threads that helped with reads */

    pthread_t thread;
    bool thread_started;
    /* I/O thread only: it runs at idle priority now (io_set_background); it may go back to
     * normal priority (probed when it starts; else it stays at normal priority) */
    bool io_background, io_can_background;
    pthread_mutex_t mu;         /* everything below */
    pthread_cond_t work;        /* the I/O thread waits here */
    pthread_cond_t done_cv;     /* ssd_store_wait and ssd_store_flush wait here */
    bool stopping;
    int flush_waiters;          /* ssd_store_flush calls waiting: their writes are urgent */
    struct job *wq_head, *wq_tail, *rq_head, *rq_tail;
    uint64_t write_seq_next;    /* seq of the next write queued */
    uint64_t write_seq_done;    /* every write with seq < this has finished */
    struct entry *slots;        /* owned; cap slots, linear probing */
    size_t cap, count;
    struct key *dirty;          /* owned; touched blocks whose last use is not in SQLite yet */
    size_t n_dirty, cap_dirty;
    uint64_t last_touch_persist_ns;
    struct ssd_done *done;      /* owned; done_n finished operations from done_head, ring */
    size_t done_head, done_n, done_cap;
    struct ssd_stats st;        /* st.dir points at dir */
};

/* CPU time of the calling thread (the I/O thread's, for the stats). */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static size_t slot_of(uint64_t hash, uint64_t ns, size_t mask)
{
    return (size_t)(hash_mix64(hash ^ hash_mix64(ns + 0x9e3779b97f4a7c15ull)) & mask);
}

static struct entry *map_find(struct ssd_store *s, uint64_t hash, uint64_t ns)
{
    if (!s->cap)
        return NULL;
    size_t mask = s->cap - 1;
    for (size_t i = slot_of(hash, ns, mask);; i = (i + 1) & mask) {
        struct entry *e = &s->slots[i];
        if (e->state == ENTRY_EMPTY)
            return NULL;
        if (e->hash == hash && e->ns == ns)
            return e;
    }
}

static void map_place(struct entry *slots, size_t cap, const struct entry *e)
{
    size_t mask = cap - 1, i = slot_of(e->hash, e->ns, mask);
    while (slots[i].state != ENTRY_EMPTY)
        i = (i + 1) & mask;
    slots[i] = *e;
}

/* Inserts e (its key must not be present); NULL when memory runs out. Pointers into the map are
 * invalid after an insert or a remove. */
static struct entry *map_insert(struct ssd_store *s, const struct entry *e)
{
    if ((s->count + 1) * 2 > s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 1024;
        struct entry *ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return NULL;
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i].state != ENTRY_EMPTY)
                map_place(ns, ncap, &s->slots[i]);
        free(s->slots);
        s->slots = ns;
        s->cap = ncap;
    }
    map_place(s->slots, s->cap, e);
    s->count++;
    return map_find(s, e->hash, e->ns);
}

/* Linear probing's backward-shift deletion: no tombstones, lookups stay O(1). */
static void map_remove(struct ssd_store *s, uint64_t hash, uint64_t ns)
{
    struct entry *e = map_find(s, hash, ns);
    if (!e)
        return;
    size_t mask = s->cap - 1, i = (size_t)(e - s->slots);
    s->slots[i].state = ENTRY_EMPTY;
    s->count--;
    for (size_t j = (i + 1) & mask; s->slots[j].state != ENTRY_EMPTY; j = (j + 1) & mask) {
        size_t k = slot_of(s->slots[j].hash, s->slots[j].ns, mask);
        bool stays = (j > i) ? (k > i && k <= j) : (k > i || k <= j);
        if (!stays) {
            s->slots[i] = s->slots[j];
            s->slots[j].state = ENTRY_EMPTY;
            i = j;
        }
    }
}

/* Drops a durable block from the in-memory index (under mu). */
static void forget_durable(struct ssd_store *s, uint64_t hash, uint64_t ns)
{
    struct entry *e = map_find(s, hash, ns);
    if (e && e->state == ENTRY_DURABLE) {
        map_remove(s, hash, ns);
        s->st.blocks--;
    }
}

static void push_done(struct ssd_store *s, uint64_t cookie, enum ssd_done_kind kind, int status)
{
    if (s->done_n == s->done_cap) {
        size_t ncap = s->done_cap ? s->done_cap * 2 : 256;
        struct ssd_done *nd = malloc(ncap * sizeof *nd);
        if (!nd) {
            log_error("ssd cache: out of memory queueing a completion; cookie %" PRIu64 " is lost",
                      cookie);
            return;
        }
        for (size_t i = 0; i < s->done_n; i++)
            nd[i] = s->done[(s->done_head + i) % s->done_cap];
        free(s->done);
        s->done = nd;
        s->done_cap = ncap;
        s->done_head = 0;
    }
    s->done[(s->done_head + s->done_n) % s->done_cap] =
        (struct ssd_done){.cookie = cookie, .kind = kind, .status = status};
    s->done_n++;
}

/* ---- file helpers ---------------------------------------------------------------------------- */

/* preadv/pwritev until every byte of iov moved; iov is consumed. Returns 0, -errno, or -EIO for
 * a read that hit the end of the file. */
static int io_full(int fd, struct iovec *iov, int n, off_t off, bool write)
{
    while (n > 0) {
        ssize_t r = write ? pwritev(fd, iov, n, off) : preadv(fd, iov, n, off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return write ? -EIO : -ENODATA;
        off += r;
        while (n > 0 && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

static int mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return -ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) && errno != EEXIST)
                return -errno;
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st))
        return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

static char *path_in(const struct ssd_store *s, const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s/%s", s->dir, name) < 0)
        return NULL;
    return p;
}

static void seg_name(uint32_t id, char out[32])
{
    snprintf(out, 32, "seg-%08x.dat", id);
}

static int seg_open(const struct ssd_store *s, uint32_t id, int flags)
{
    char name[32], path[4096];
    seg_name(id, name);
    snprintf(path, sizeof path, "%s/%s", s->dir, name);
    return open(path, flags | O_CLOEXEC, 0644);
}

static void seg_unlink(const struct ssd_store *s, uint32_t id)
{
    char name[32], path[4096];
    seg_name(id, name);
    snprintf(path, sizeof path, "%s/%s", s->dir, name);
    unlink(path);
}

static int seg_find(const struct ssd_store *s, uint32_t id)
{
    int lo = 0, hi = s->n_segs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->segs[mid].id == id)
            return mid;
        if (s->segs[mid].id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static int seg_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct segment *)a)->id, y = ((const struct segment *)b)->id;
    return (x > y) - (x < y);
}

static int seg_append(struct ssd_store *s, uint32_t id, uint64_t size)
{
    if (s->n_segs == s->cap_segs) {
        int ncap = s->cap_segs ? s->cap_segs * 2 : 64;
        struct segment *n = realloc(s->segs, (size_t)ncap * sizeof *n);
        if (!n)
            return -ENOMEM;
        s->segs = n;
        s->cap_segs = ncap;
    }
    s->segs[s->n_segs++] = (struct segment){.id = id, .size = size};
    return 0;
}

static uint64_t disk_bytes_of(const struct ssd_store *s)
{
    uint64_t b = 0;
    for (int i = 0; i < s->n_segs; i++)
        b += s->segs[i].size;
    return b;
}

/* ---- turning the tier off --------------------------------------------------------------------- */

/* Under mu. Writes stop for good (later ones get -INFERD_EIO at once); reads go on. */
static void disable_locked(struct ssd_store *s, const char *what, int errnum)
{
    if (s->st.disabled)
        return;
    s->st.disabled = true;
    snprintf(s->st.disable_reason, sizeof s->st.disable_reason, "%s: %s", what,
             errnum ? strerror(errnum) : "failed");
    log_error("ssd cache %s: %s; the SSD tier is off, serving continues from memory", s->dir,
              s->st.disable_reason);
}

/* ---- SQLite ------------------------------------------------------------------------------------ */

static int db_exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

static void db_close(struct ssd_store *s)
{
    sqlite3_finalize(s->st_insert);
    sqlite3_finalize(s->st_delete);
    sqlite3_finalize(s->st_touch);
    sqlite3_finalize(s->st_delete_seg);
    s->st_insert = s->st_delete = s->st_touch = s->st_delete_seg = NULL;
    if (s->db)
        sqlite3_close(s->db);
    s->db = NULL;
}

/* Opens DIR/<digest>/index.sqlite and checks it is ours and whole; SQLITE_OK or the failing code. */
static int db_open(struct ssd_store *s)
{
    char *path = path_in(s, INDEX_FILE);
    if (!path)
        return SQLITE_NOMEM;
    int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                               SQLITE_OPEN_NOMUTEX, NULL);
    free(path);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_busy_timeout(s->db, 5000);
    sqlite3_stmt *q = NULL;
    /* journal_mode answers with a row; anything but "wal" means the file is not usable as ours. */
    rc = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL", -1, &q, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW)
        rc = strcmp((const char *)sqlite3_column_text(q, 0), "wal") == 0 ? SQLITE_OK : SQLITE_CORRUPT;
    sqlite3_finalize(q);
    if (rc != SQLITE_OK)
        return rc;
    if ((rc = db_exec(s->db, "PRAGMA synchronous=NORMAL")) != SQLITE_OK)
        return rc;
    rc = sqlite3_prepare_v2(s->db, "PRAGMA quick_check", -1, &q, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW)
        rc = strcmp((const char *)sqlite3_column_text(q, 0), "ok") == 0 ? SQLITE_OK : SQLITE_CORRUPT;
    sqlite3_finalize(q);
    if (rc != SQLITE_OK)
        return rc;
    int version = -1;
    rc = sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &q, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        version = sqlite3_column_int(q, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_OK)
        return rc;
    if (version != 0 && version != SCHEMA_VERSION)
        return SQLITE_CORRUPT;
    rc = db_exec(s->db,
                 "CREATE TABLE IF NOT EXISTS blocks("
                 " hash INTEGER NOT NULL, ns INTEGER NOT NULL, seg INTEGER NOT NULL,"
                 " off INTEGER NOT NULL, len INTEGER NOT NULL, data_len INTEGER NOT NULL,"
                 " parent INTEGER NOT NULL, n_tokens INTEGER NOT NULL, checksum BLOB NOT NULL,"
                 " last_use INTEGER NOT NULL, PRIMARY KEY(hash, ns)) WITHOUT ROWID;"
                 "PRAGMA user_version=1;");
    if (rc != SQLITE_OK)
        return rc;
    if ((rc = sqlite3_prepare_v2(s->db,
                                 "INSERT OR REPLACE INTO blocks(hash, ns, seg, off, len, data_len,"
                                 " parent, n_tokens, checksum, last_use)"
                                 " VALUES(?,?,?,?,?,?,?,?,?,?)", -1, &s->st_insert, NULL)) ||
        (rc = sqlite3_prepare_v2(s->db, "DELETE FROM blocks WHERE hash=? AND ns=?", -1,
                                 &s->st_delete, NULL)) ||
        (rc = sqlite3_prepare_v2(s->db, "UPDATE blocks SET last_use=? WHERE hash=? AND ns=?", -1,
                                 &s->st_touch, NULL)) ||
        (rc = sqlite3_prepare_v2(s->db, "DELETE FROM blocks WHERE seg=?", -1, &s->st_delete_seg,
                                 NULL)))
        return rc;
    return SQLITE_OK;
}

static int db_insert(struct ssd_store *s, const struct entry *e)
{
    sqlite3_stmt *q = s->st_insert;
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, (sqlite3_int64)e->hash);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)e->ns);
    sqlite3_bind_int64(q, 3, e->seg);
    sqlite3_bind_int64(q, 4, (sqlite3_int64)e->off);
    sqlite3_bind_int64(q, 5, (sqlite3_int64)e->len);
    sqlite3_bind_int64(q, 6, (sqlite3_int64)e->data_len);
    sqlite3_bind_int64(q, 7, (sqlite3_int64)e->parent);
    sqlite3_bind_int64(q, 8, e->n_tokens);
    sqlite3_bind_blob(q, 9, e->checksum, 16, SQLITE_STATIC);
    sqlite3_bind_int64(q, 10, (sqlite3_int64)e->last_use);
    int rc = sqlite3_step(q);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int db_delete(struct ssd_store *s, uint64_t hash, uint64_t ns)
{
    sqlite3_stmt *q = s->st_delete;
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, (sqlite3_int64)hash);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)ns);
    int rc = sqlite3_step(q);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Removes the index files: the index is rebuilt from the records. */
static void db_discard(struct ssd_store *s)
{
    db_close(s);
    static const char *const names[] = {INDEX_FILE, INDEX_FILE "-wal", INDEX_FILE "-shm",
                                        INDEX_FILE "-journal"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *p = path_in(s, names[i]);
        if (p)
            unlink(p);
        free(p);
    }
}

/* ---- open: the directory, the index, recovery ---------------------------------------------------- */

static void json_string(FILE *f, const char *v, size_t max)
{
    fputc('"', f);
    for (size_t i = 0; i < max && v[i]; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* Writes fingerprint.json once (tmp, fsync, rename): a failure here means DIR is not writable. */
static int write_fingerprint_json(struct ssd_store *s)
{
    char *path = path_in(s, "fingerprint.json"), *tmp = path_in(s, "fingerprint.json.tmp");
    int rc = 0;
    if (!path || !tmp) {
        rc = -ENOMEM;
        goto out;
    }
    if (access(path, F_OK) == 0)
        goto out;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        rc = -errno;
        goto out;
    }
    const struct ssd_fingerprint *fp = &s->cfg.fp;
    fprintf(f, "{\"model_digest\":\"%016" PRIx64 "\",\"tokenizer_digest\":\"%016" PRIx64 "\","
               "\"kv_format\":", fp->model_digest, fp->tokenizer_digest);
    json_string(f, fp->kv_format, sizeof fp->kv_format);
    fprintf(f, ",\"block_size\":%d,\"backend_identity\":", fp->block_size);
    json_string(f, fp->backend_identity, sizeof fp->backend_identity);
    fprintf(f, ",\"record_version\":%d}\n", SSD_RECORD_VERSION);
    if (fflush(f) || fsync(fileno(f)))
        rc = -errno;
    if (fclose(f) && !rc)
        rc = -errno;
    if (!rc && rename(tmp, path))
        rc = -errno;
    if (rc)
        unlink(tmp);
    else
        fsync_dir(s->dir);
out:
    free(path);
    free(tmp);
    return rc;
}

/* Reaps temporary files and lists the segments (sorted by id). */
static int scan_dir(struct ssd_store *s)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return -errno;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (len > 4 && strcmp(n + len - 4, ".tmp") == 0) {
            if (unlinkat(dirfd(d), n, 0) == 0)
                log_info("ssd cache %s: reaped temporary file %s", s->dir, n);
            continue;
        }
        unsigned id;
        char tail[8];
        if (len == 16 && sscanf(n, "seg-%8x%4s", &id, tail) == 2 && strcmp(tail, ".dat") == 0) {
            struct stat st;
            if (fstatat(dirfd(d), n, &st, 0) == 0 && S_ISREG(st.st_mode) &&
                (rc = seg_append(s, id, (uint64_t)st.st_size)))
                break;
        }
    }
    closedir(d);
    if (s->n_segs)
        qsort(s->segs, (size_t)s->n_segs, sizeof *s->segs, seg_cmp);
    s->next_seg_id = s->n_segs ? s->segs[s->n_segs - 1].id + 1 : 1;
    return rc;
}

/* Loads the index rows into the map; a row that cannot describe a record in an existing segment
 * is deleted. Returns SQLITE_OK, or an SQLite error (the index is then treated as damaged). */
static int load_index(struct ssd_store *s)
{
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db, "SELECT hash, ns, seg, off, len, data_len, parent, n_tokens,"
                                       " checksum, last_use FROM blocks", -1, &q, NULL);
    if (rc != SQLITE_OK)
        return rc;
    struct key *bad = NULL;
    size_t n_bad = 0, cap_bad = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        struct entry e = {
            .hash = (uint64_t)sqlite3_column_int64(q, 0),
            .ns = (uint64_t)sqlite3_column_int64(q, 1),
            .off = (uint64_t)sqlite3_column_int64(q, 3),
            .len = (uint64_t)sqlite3_column_int64(q, 4),
            .data_len = (uint64_t)sqlite3_column_int64(q, 5),
            .parent = (uint64_t)sqlite3_column_int64(q, 6),
            .last_use = (uint64_t)sqlite3_column_int64(q, 9),
            .state = ENTRY_DURABLE,
        };
        sqlite3_int64 seg = sqlite3_column_int64(q, 2), nt = sqlite3_column_int64(q, 7);
        const void *ck = sqlite3_column_blob(q, 8);
        int si = (seg >= 0 && seg <= UINT32_MAX) ? seg_find(s, (uint32_t)seg) : -1;
        bool ok = si >= 0 && nt >= 0 && nt <= SSD_RECORD_MAX_TOKENS &&
                  e.data_len <= SSD_RECORD_MAX_DATA && ck && sqlite3_column_bytes(q, 8) == 16 &&
                  e.off % SSD_RECORD_ALIGN == 0 &&
                  e.len == ssd_record_len((uint32_t)nt, e.data_len) &&
                  e.off <= s->segs[si].size && e.len <= s->segs[si].size - e.off;
        if (ok) {
            e.seg = (uint32_t)seg;
            e.n_tokens = (uint32_t)nt;
            memcpy(e.checksum, ck, 16);
            if (!map_insert(s, &e)) {
                rc = SQLITE_NOMEM;
                break;
            }
            s->st.blocks++;
            continue;
        }
        s->st.dropped_at_start++;
        if (n_bad == cap_bad) {
            size_t nc = cap_bad ? cap_bad * 2 : 64;
            struct key *nb = realloc(bad, nc * sizeof *nb);
            if (!nb) {
                rc = SQLITE_NOMEM;
                break;
            }
            bad = nb;
            cap_bad = nc;
        }
        bad[n_bad++] = (struct key){e.hash, e.ns};
    }
    sqlite3_finalize(q);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc == SQLITE_OK && n_bad) {
        rc = db_exec(s->db, "BEGIN");
        for (size_t i = 0; rc == SQLITE_OK && i < n_bad; i++)
            rc = db_delete(s, bad[i].hash, bad[i].ns);
        rc = rc == SQLITE_OK ? db_exec(s->db, "COMMIT") : rc;
        if (rc != SQLITE_OK)
            db_exec(s->db, "ROLLBACK");
    }
    free(bad);
    return rc;
}

/* Reads and verifies the whole record at off of fd; 0 and *h filled when it is one of ours. */
static int read_record_at(struct ssd_store *s, int fd, uint64_t off, uint64_t file_size,
                          struct ssd_record_header *h, uint8_t **buf_out)
{
    uint8_t hdr[SSD_RECORD_HEADER_BYTES];
    struct iovec v = {hdr, sizeof hdr};
    if (off + sizeof hdr > file_size || io_full(fd, &v, 1, (off_t)off, false))
        return -1;
    if (ssd_record_header_parse(hdr, sizeof hdr, h, NULL) || h->record_len > file_size - off ||
        memcmp(h->fp_digest, s->fp_digest, 16) != 0)
        return -1;
    uint8_t *buf = malloc(h->record_len);
    if (!buf)
        return -1;
    v = (struct iovec){buf, h->record_len};
    if (io_full(fd, &v, 1, (off_t)off, false) ||
        ssd_record_parse(buf, h->record_len, h, NULL, NULL, NULL)) {
        free(buf);
        return -1;
    }
    *buf_out = buf;
    return 0;
}

/* Past the last indexed record of each segment: records that verify are indexed (their write was
 * durable but its index row was not, or the index was rebuilt), and the bytes after the last good
 * one (a torn write) are cut off. Segments left with no block are removed. */
static int recover_segments(struct ssd_store *s)
{
    int rc = SQLITE_OK;
    uint64_t *end = calloc((size_t)s->n_segs + 1, sizeof *end), *live = calloc((size_t)s->n_segs + 1, sizeof *live);
    if (!end || !live) {
        free(end);
        free(live);
        return SQLITE_NOMEM;
    }
    for (size_t i = 0; i < s->cap; i++) {
        const struct entry *e = &s->slots[i];
        if (e->state != ENTRY_DURABLE)
            continue;
        int si = seg_find(s, e->seg);
        if (e->off + e->len > end[si])
            end[si] = e->off + e->len;
        live[si]++;
    }
    bool in_tx = false;
    uint64_t now = wall_ms();
    for (int si = 0; si < s->n_segs && rc == SQLITE_OK; si++) {
        struct segment *sg = &s->segs[si];
        if (end[si] >= sg->size)
            continue;
        int fd = seg_open(s, sg->id, O_RDWR);
        if (fd < 0)
            continue;
        uint64_t pos = end[si], good_end = end[si];
        while (pos + SSD_RECORD_HEADER_BYTES <= sg->size) {
            struct ssd_record_header h;
            uint8_t *buf = NULL;
            if (read_record_at(s, fd, pos, sg->size, &h, &buf)) {
                pos += SSD_RECORD_ALIGN; /* records start on 4 KiB boundaries: look at the next */
                continue;
            }
            if (!map_find(s, h.hash, h.ns)) {
                struct entry e = {.hash = h.hash, .ns = h.ns, .off = pos, .len = h.record_len,
                                  .data_len = h.data_len, .parent = h.parent_hash, .last_use = now,
                                  .seg = sg->id, .n_tokens = h.n_tokens, .state = ENTRY_DURABLE};
                memcpy(e.checksum, buf + h.head_len + h.data_len, 16);
                if (!in_tx && (rc = db_exec(s->db, "BEGIN")) == SQLITE_OK)
                    in_tx = true;
                if (rc == SQLITE_OK && map_insert(s, &e) && (rc = db_insert(s, &e)) == SQLITE_OK) {
                    s->st.blocks++;
                    s->st.recovered_blocks++;
                    live[si]++;
                }
            }
            free(buf);
            pos += h.record_len;
            good_end = pos;
            if (rc != SQLITE_OK)
                break;
        }
        if (good_end < sg->size) {
            log_warn("ssd cache %s: segment %08x: %" PRIu64 " bytes after its last good record cut off",
                     s->dir, sg->id, sg->size - good_end);
            s->st.torn_tails++;
            if (ftruncate(fd, (off_t)good_end) == 0) {
                fdatasync(fd);
                sg->size = good_end;
            }
        }
        close(fd);
    }
    if (in_tx) {
        if (rc == SQLITE_OK)
            rc = db_exec(s->db, "COMMIT");
        if (rc != SQLITE_OK)
            db_exec(s->db, "ROLLBACK");
    }
    if (rc == SQLITE_OK) {
        int w = 0;
        for (int si = 0; si < s->n_segs; si++) {
            if (live[si] == 0) {
                char name[32];
                seg_name(s->segs[si].id, name);
                char *p = path_in(s, name);
                if (p)
                    unlink(p);
                free(p);
                continue;
            }
            s->segs[w++] = s->segs[si];
        }
        s->n_segs = w;
    }
    free(end);
    free(live);
    return rc;
}

/* How many threads read one large batch of blocks (read_batch), at most. */
static int read_threads_max(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 && cores < READ_THREADS ? (int)cores : READ_THREADS;
}

/* One thread's stripe of a timed read of the probe file. */
struct probe_stripe {
    const char *path;
    bool direct;
    size_t from, to;
    bool ok;
};

static void *probe_read_stripe(void *arg)
{
    struct probe_stripe *ps = arg;
    void *buf = NULL;
    int fd = open(ps->path, O_RDONLY | O_CLOEXEC | (ps->direct ? O_DIRECT : 0));
    if (fd < 0 || posix_memalign(&buf, SSD_RECORD_ALIGN, PROBE_CHUNK)) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t at = ps->from;
    while (at < ps->to) {
        ssize_t r = pread(fd, buf, PROBE_CHUNK, (off_t)at);
        if (r <= 0)
            break;
        at += (size_t)r;
    }
    ps->ok = at >= ps->to;
    free(buf);
    close(fd);
    return NULL;
}

/* Reads the first size bytes of path with n threads, each a stripe in PROBE_CHUNK reads, as
 * read_batch reads a restore's blocks; bytes/s, or 0 when a read failed. */
static double probe_read(const char *path, size_t size, int n, bool direct)
{
    struct probe_stripe ps[READ_THREADS];
    pthread_t th[READ_THREADS];
    size_t chunks = size / PROBE_CHUNK;
    int started = 0;
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        ps[i] = (struct probe_stripe){.path = path, .direct = direct,
                                      .from = chunks * (size_t)i / (size_t)n * PROBE_CHUNK,
                                      .to = chunks * (size_t)(i + 1) / (size_t)n * PROBE_CHUNK};
        if (i == 0 || pthread_create(&th[i], NULL, probe_read_stripe, &ps[i]) != 0)
            continue;
        started |= 1 << i;
    }
    probe_read_stripe(&ps[0]);
    for (int i = 1; i < n; i++)
        if (started & (1 << i))
            pthread_join(th[i], NULL);
        else
            probe_read_stripe(&ps[i]);
    uint64_t dt = now_ns() - t0;
    for (int i = 0; i < n; i++)
        if (!ps[i].ok)
            return 0;
    return dt > 0 ? (double)(chunks * PROBE_CHUNK) / ((double)dt * 1e-9) : 0;
}

/* Writes a temporary file of up to probe bytes and reads it back as a restore would: from the
 * disk (O_DIRECT, or after dropping its cached pages where O_DIRECT is refused, as on tmpfs)
 * into read_bw, then from the page cache into cache_bw. -errno only when the file cannot be
 * created. */
static int probe_bandwidth(struct ssd_store *s, size_t probe)
{
    struct statvfs vfs;
    if (statvfs(s->dir, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        if (probe > avail / 4)
            probe = (size_t)(avail / 4) / PROBE_CHUNK * PROBE_CHUNK;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/probe-%d.tmp", s->dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    void *buf = NULL;
    if (probe < PROBE_CHUNK || posix_memalign(&buf, SSD_RECORD_ALIGN, PROBE_CHUNK)) {
        close(fd);
        unlink(path);
        return 0;
    }
    memset(buf, 0x5a, PROBE_CHUNK);
    size_t written = 0;
    while (written < probe) {
        ssize_t w = pwrite(fd, buf, PROBE_CHUNK, (off_t)written);
        if (w != (ssize_t)PROBE_CHUNK)
            break;
        written += PROBE_CHUNK;
    }
    free(buf);
    int n = read_threads_max();
    if (written == probe && fdatasync(fd) == 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        s->read_bw = probe_read(path, probe, n, true);
        if (s->read_bw == 0) { /* O_DIRECT refused: the page cache, emptied first */
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            s->read_bw = probe_read(path, probe, n, false);
        }
        probe_read(path, probe, 1, false); /* into the page cache */
        s->cache_bw = probe_read(path, probe, n, false);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    close(fd);
    unlink(path);
    return 0;
}

/* What O_DIRECT asks of a buffer written from where it lies, for the file open as fd: the kernel
 * says (statx's STATX_DIOALIGN, Linux 6.1 on), else a page for both, which every file system
 * that takes O_DIRECT accepts. */
static void dio_alignment_of(struct ssd_store *s, int fd)
{
    long page = sysconf(_SC_PAGESIZE);
    s->dio_mem_align = s->dio_len_align = page > 0 ? (size_t)page : SSD_RECORD_ALIGN;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_mem_align > 0 && sx.stx_dio_offset_align > 0) {
        s->dio_mem_align = sx.stx_dio_mem_align;
        s->dio_len_align = sx.stx_dio_offset_align;
    }
#else
    (void)fd;
#endif
}

/* Whether the file system under the directory takes an O_DIRECT write of SSD_RECORD_ALIGN
 * aligned bytes at an aligned offset: one such write to a temporary file. Only a refusal
 * (EINVAL, EOPNOTSUPP, at open or at the write) says no; any other failure leaves the answer to
 * the segments' writes. why gets the refusal. */
static bool direct_supported(struct ssd_store *s, char *why, size_t why_len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/direct-%d.tmp", s->dir, (int)getpid());
    bool ok = true;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) {
        ok = errno != EINVAL && errno != EOPNOTSUPP;
        snprintf(why, why_len, "open: %s", strerror(errno));
    } else {
        dio_alignment_of(s, fd);
        void *buf = NULL;
        if (posix_memalign(&buf, SSD_RECORD_ALIGN, SSD_RECORD_ALIGN) == 0) {
            memset(buf, 0, SSD_RECORD_ALIGN);
            if (pwrite(fd, buf, SSD_RECORD_ALIGN, 0) < 0) {
                ok = errno != EINVAL && errno != EOPNOTSUPP;
                snprintf(why, why_len, "write: %s", strerror(errno));
            }
            free(buf);
        }
        close(fd);
    }
    unlink(path); /* also where the open created the file before refusing O_DIRECT */
    return ok;
}

/* Picks how segments are written (cfg.direct_io, the probe) and sets up the staging buffer.
 * -INFERD_EINVAL when O_DIRECT is demanded and refused. */
static int setup_writes(struct ssd_store *s, struct err *err)
{
    s->direct = false;
    if (s->cfg.direct_io != SSD_DIRECT_OFF) {
        char why[128] = "";
        s->direct = direct_supported(s, why, sizeof why);
        if (!s->direct && s->cfg.direct_io == SSD_DIRECT_ON)
            return err_set(err, INFERD_EINVAL, "ssd cache: the file system under %s refuses "
                           "O_DIRECT (%s); --ssd-direct-io auto writes through the page cache "
                           "there", s->dir, why);
        if (!s->direct)
            log_info("ssd cache %s: the file system refuses O_DIRECT (%s); segments are "
                     "written through the page cache", s->dir, why);
    }
    if (s->direct) {
        size_t cap = s->cfg.write_buffer_bytes ? s->cfg.write_buffer_bytes : WRITE_BUFFER_DEFAULT;
        cap = (cap + SSD_RECORD_ALIGN - 1) / SSD_RECORD_ALIGN * SSD_RECORD_ALIGN;
        long page = sysconf(_SC_PAGESIZE);
        size_t align = page > SSD_RECORD_ALIGN ? (size_t)page : SSD_RECORD_ALIGN;
        void *buf = NULL;
        if (posix_memalign(&buf, align, cap))
            return err_set(err, INFERD_ENOMEM, "ssd cache: out of memory for a %zu-byte write "
                           "buffer", cap);
        s->wbuf = buf;
        s->wbuf_cap = cap;
    }
    s->st.direct_io = s->direct;
    return 0;
}

/* ---- the I/O thread: writes ----------------------------------------------------------------------- */

static const uint8_t zero_pad[SSD_RECORD_ALIGN];

/* Writes go through the page cache from now on: the file system refused an O_DIRECT open or
 * write (errnum) after the probe at open let it through. */
static void direct_off(struct ssd_store *s, const char *what, int errnum)
{
    s->direct = false;
    if (s->active_fd >= 0) {
        int fl = fcntl(s->active_fd, F_GETFL);
        if (fl >= 0)
            fcntl(s->active_fd, F_SETFL, fl & ~O_DIRECT);
    }
    log_warn("ssd cache %s: %s with O_DIRECT: %s; writing through the page cache from now on",
             s->dir, what, strerror(errnum));
    pthread_mutex_lock(&s->mu);
    s->st.direct_io = false;
    pthread_mutex_unlock(&s->mu);
}

/* Starts a new segment: created, and the directory fsynced so the name survives a crash. */
static int start_segment(struct ssd_store *s)
{
    uint32_t id = s->next_seg_id;
    int fd = seg_open(s, id, O_WRONLY | O_CREAT | O_EXCL | (s->direct ? O_DIRECT : 0));
    if (fd < 0 && errno == EINVAL && s->direct && s->cfg.direct_io == SSD_DIRECT_AUTO) {
        /* some file systems create the file before refusing O_DIRECT: the name is ours */
        seg_unlink(s, id);
        direct_off(s, "opening a segment", EINVAL);
        fd = seg_open(s, id, O_WRONLY | O_CREAT | O_EXCL);
    }
    if (fd < 0)
        return -errno;
    int rc = fsync_dir(s->dir);
    if (rc == 0)
        rc = seg_append(s, id, 0);
    if (rc) {
        close(fd);
        return rc;
    }
    s->next_seg_id = id + 1;
    s->active_fd = fd;
    s->wbuf_off = s->batch_off = 0;
    return 0;
}

/* At idle priority the I/O thread hands its core back between pieces of hashing or copying: a
 * decode's pool workers yield while they wait between jobs, and a thread that then kept the core
 * for a whole time slice would hold up the step. How much to do before the next yield: */
static size_t io_piece(const struct ssd_store *s)
{
    return s->io_background ? BACKGROUND_PIECE : HASH_PIECE;
}

static void io_yield(const struct ssd_store *s)
{
    if (s->io_background)
        sched_yield();
}

/* Hashes len bytes of p into st, yielding between pieces (io_piece). */
static void hash_paced(const struct ssd_store *s, XXH3_state_t *st, const void *p, size_t len)
{
    const uint8_t *b = p;
    for (size_t piece = io_piece(s); len > 0;) {
        size_t n = len < piece ? len : piece;
        XXH3_128bits_update(st, b, n);
        b += n;
        len -= n;
        if (len)
            io_yield(s);
    }
}

/* Writes the staged bytes at their place in the active segment, then n_data pieces of data
 * (data_len bytes, aligned as O_DIRECT asks) from where they lie, in one call. Under auto, a
 * direct write the file system refuses (EINVAL) turns O_DIRECT off for good and goes again
 * through the page cache (the staged bytes are still there). */
static int wbuf_flush_with(struct ssd_store *s, const struct iovec *data, int n_data,
                           uint64_t data_len)
{
    if (!s->wbuf_used && !data_len)
        return 0;
    struct iovec v[SSD_MAX_IOV + 1];
    for (bool again = false;; again = true) {
        int n = 0;
        if (s->wbuf_used)
            v[n++] = (struct iovec){s->wbuf, s->wbuf_used};
        for (int i = 0; i < n_data; i++)
            if (data[i].iov_len)
                v[n++] = data[i];
        s->write_calls++;
        int rc = io_full(s->active_fd, v, n, (off_t)s->wbuf_off, true);
        if (rc == -EINVAL && !again && s->direct && s->cfg.direct_io == SSD_DIRECT_AUTO) {
            direct_off(s, "a write", EINVAL);
            continue;
        }
        if (rc)
            return rc;
        break;
    }
    s->wbuf_off += s->wbuf_used + data_len;
    s->wbuf_used = 0;
    return 0;
}

static int wbuf_flush(struct ssd_store *s) { return wbuf_flush_with(s, NULL, 0, 0); }

/* Appends len bytes of src (NULL: zeros) to the staging buffer, writing it out whenever it
 * fills; st (may be NULL) hashes the copy in pieces small enough to still be in cache. */
static int wbuf_put(struct ssd_store *s, const void *src, size_t len, XXH3_state_t *st)
{
    const uint8_t *p = src;
    while (len) {
        size_t n = s->wbuf_cap - s->wbuf_used;
        if (n > len)
            n = len;
        if (n > io_piece(s))
            n = io_piece(s);
        uint8_t *dst = s->wbuf + s->wbuf_used;
        if (p) {
            memcpy(dst, p, n);
            p += n;
        } else {
            memset(dst, 0, n);
        }
        if (st)
            XXH3_128bits_update(st, dst, n);
        s->wbuf_used += n;
        len -= n;
        if (s->wbuf_used == s->wbuf_cap) {
            int rc = wbuf_flush(s);
            if (rc)
                return rc;
        }
        if (len)
            io_yield(s);
    }
    return 0;
}

/* Whether j's data can go to disk from where it lies: O_DIRECT, every piece's address and length
 * aligned as the file system asks, and whole SSD_RECORD_ALIGN pages in all, so the record's tail
 * starts on a boundary of the staging buffer again. */
static bool data_in_place(const struct ssd_store *s, const struct job *j)
{
    if (!s->direct || j->data_len == 0 || j->data_len % SSD_RECORD_ALIGN != 0)
        return false;
    for (int i = 0; i < j->n_iov; i++)
        if ((uintptr_t)j->iov[i].iov_base % s->dio_mem_align != 0 ||
            j->iov[i].iov_len % s->dio_len_align != 0)
            return false;
    return true;
}

/* O_DIRECT: the head is copied into the staging buffer and hashed from the copy; the data is
 * hashed and written from where it lies when data_in_place, else staged and hashed likewise;
 * then the checksum and the tail's padding are staged. */
static int stage_record(struct ssd_store *s, struct job *j, const uint8_t *hdr, uint64_t head_pad,
                        uint64_t tail_pad)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return -ENOMEM;
    XXH3_128bits_reset(st);
    int rc = wbuf_put(s, hdr, SSD_RECORD_HEADER_BYTES, st);
    if (!rc)
        rc = wbuf_put(s, j->tokens, (size_t)j->n_tokens * 4, st);
    if (!rc)
        rc = wbuf_put(s, NULL, head_pad, st);
    if (!rc && data_in_place(s, j)) {
        for (int i = 0; i < j->n_iov; i++)
            hash_paced(s, st, j->iov[i].iov_base, j->iov[i].iov_len);
        rc = wbuf_flush_with(s, j->iov, j->n_iov, j->data_len);
        s->in_place_writes++;
    } else {
        for (int i = 0; !rc && i < j->n_iov; i++)
            rc = wbuf_put(s, j->iov[i].iov_base, j->iov[i].iov_len, st);
    }
    XXH128_canonical_t ck;
    XXH128_canonicalFromHash(&ck, XXH3_128bits_digest(st));
    XXH3_freeState(st);
    memcpy(j->checksum, ck.digest, 16);
    if (!rc)
        rc = wbuf_put(s, j->checksum, 16, NULL);
    if (!rc)
        rc = wbuf_put(s, NULL, tail_pad, NULL);
    return rc;
}

/* Through the page cache: hashed from the caller's buffers, then gathered into one pwritev. */
static int pwrite_record(struct ssd_store *s, struct job *j, uint8_t *hdr, uint64_t head_pad,
                         uint64_t tail_pad, uint64_t off)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return -ENOMEM;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, hdr, SSD_RECORD_HEADER_BYTES);
    XXH3_128bits_update(st, j->tokens, (size_t)j->n_tokens * 4);
    XXH3_128bits_update(st, zero_pad, head_pad);
    for (int i = 0; i < j->n_iov; i++)
        hash_paced(s, st, j->iov[i].iov_base, j->iov[i].iov_len);
    XXH128_canonical_t ck;
    XXH128_canonicalFromHash(&ck, XXH3_128bits_digest(st));
    XXH3_freeState(st);
    memcpy(j->checksum, ck.digest, 16);

    struct iovec v[SSD_MAX_IOV + 5];
    int n = 0;
    v[n++] = (struct iovec){hdr, SSD_RECORD_HEADER_BYTES};
    if (j->n_tokens)
        v[n++] = (struct iovec){j->tokens, (size_t)j->n_tokens * 4};
    if (head_pad)
        v[n++] = (struct iovec){(void *)zero_pad, head_pad};
    for (int i = 0; i < j->n_iov; i++)
        if (j->iov[i].iov_len)
            v[n++] = j->iov[i];
    v[n++] = (struct iovec){j->checksum, 16};
    if (tail_pad)
        v[n++] = (struct iovec){(void *)zero_pad, tail_pad};
    s->write_calls++;
    return io_full(s->active_fd, v, n, (off_t)off, true);
}

/* Drops a durable range's pages from the page cache (buffered writes only): what was written
 * behind is read back, if ever, after a restart, and meanwhile it would crowd out what the
 * process uses. */
static void drop_written(struct ssd_store *s, int fd, uint64_t off)
{
    if (!s->direct)
        posix_fadvise(fd, (off_t)off, 0, POSIX_FADV_DONTNEED);
}

/* Appends one record for j to the active segment (starting one when it is full). With O_DIRECT
 * the record may still be (partly) in the staging buffer on return: the batch writes it out
 * before its fdatasync. */
static int write_record(struct ssd_store *s, struct job *j)
{
    uint64_t len = ssd_record_len(j->n_tokens, j->data_len);
    struct segment *sg = s->active_fd >= 0 ? &s->segs[s->n_segs - 1] : NULL;
    if (!sg || (sg->size > 0 && sg->size + len > s->seg_bytes)) {
        if (s->active_fd >= 0) {
            int rc = wbuf_flush(s);
            int fd = s->active_fd;
            s->active_fd = -1;
            if (!rc && fdatasync(fd))
                rc = -errno;
            if (!rc)
                drop_written(s, fd, s->batch_off);
            close(fd);
            if (rc)
                return rc;
        }
        int rc = start_segment(s);
        if (rc)
            return rc;
        sg = &s->segs[s->n_segs - 1];
    }
    if (!s->direct && s->wbuf_used) { /* O_DIRECT went off in this batch: the staged bytes first */
        int rc = wbuf_flush(s);
        if (rc)
            return rc;
    }
    struct ssd_record_header h = {.hash = j->hash, .parent_hash = j->parent, .ns = j->ns,
                                  .n_tokens = j->n_tokens, .data_len = j->data_len};
    memcpy(h.fp_digest, s->fp_digest, 16);
    uint8_t hdr[SSD_RECORD_HEADER_BYTES];
    ssd_record_header_encode(&h, hdr);
    /* token ids little-endian, as everything else in the record (in place: the job owns them) */
    for (uint32_t i = 0; i < j->n_tokens; i++) {
        uint32_t v = (uint32_t)j->tokens[i];
        uint8_t *p = (uint8_t *)&j->tokens[i];
        p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
    }
    uint64_t head = ssd_record_head_len(j->n_tokens);
    uint64_t head_pad = head - (SSD_RECORD_HEADER_BYTES + (uint64_t)j->n_tokens * 4);
    uint64_t tail_pad = len - (head + j->data_len + SSD_RECORD_CHECKSUM_BYTES);
    int rc;
    if (s->direct) {
        if (!s->wbuf_used)
            s->wbuf_off = sg->size;
        rc = stage_record(s, j, hdr, head_pad, tail_pad);
    } else {
        rc = pwrite_record(s, j, hdr, head_pad, tail_pad, sg->size);
    }
    if (rc)
        return rc;
    j->seg = sg->id;
    j->off = sg->size;
    j->len = len;
    sg->size += len;
    return 0;
}

/* The segment whose most recently used block is the oldest (never the active one), or -1. */
static int eviction_victim(struct ssd_store *s)
{
    int last = s->active_fd >= 0 ? s->n_segs - 1 : s->n_segs;
    if (last <= 0)
        return -1;
    uint64_t *mru = calloc((size_t)s->n_segs, sizeof *mru);
    if (!mru)
        return -1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->cap; i++) {
        const struct entry *e = &s->slots[i];
        if (e->state != ENTRY_DURABLE)
            continue;
        int si = seg_find(s, e->seg);
        if (si >= 0 && e->last_use > mru[si])
            mru[si] = e->last_use;
    }
    pthread_mutex_unlock(&s->mu);
    int victim = 0;
    for (int si = 1; si < last; si++)
        if (mru[si] < mru[victim])
            victim = si;
    free(mru);
    return victim;
}

/* Removes whole segments until the files fit the cap: blocks leave the map first (no read is
 * issued against them after), then the file goes, then the rows. A crash in between leaves rows
 * whose segment is missing, which the next open drops. */
static void enforce_cap(struct ssd_store *s)
{
    while (disk_bytes_of(s) > s->cap_bytes) {
        int si = eviction_victim(s);
        if (si < 0)
            return;
        uint32_t id = s->segs[si].id;
        uint64_t n = 0;
        pthread_mutex_lock(&s->mu);
        for (size_t i = 0; i < s->cap;) {
            struct entry *e = &s->slots[i];
            if (e->state == ENTRY_DURABLE && e->seg == id) {
                forget_durable(s, e->hash, e->ns); /* shifts a later entry into slot i: look again */
                n++;
                continue;
            }
            i++;
        }
        s->st.evicted_blocks += n;
        pthread_mutex_unlock(&s->mu);
        char name[32];
        seg_name(id, name);
        char *p = path_in(s, name);
        if (p)
            unlink(p);
        free(p);
        sqlite3_reset(s->st_delete_seg);
        sqlite3_bind_int64(s->st_delete_seg, 1, id);
        if (sqlite3_step(s->st_delete_seg) != SQLITE_DONE)
            log_warn("ssd cache %s: removing segment %08x's rows: %s", s->dir, id,
                     sqlite3_errmsg(s->db));
        memmove(&s->segs[si], &s->segs[si + 1], (size_t)(s->n_segs - si - 1) * sizeof *s->segs);
        s->n_segs--;
        log_debug("ssd cache %s: evicted segment %08x (%" PRIu64 " blocks) to stay under %" PRIu64
                  " bytes", s->dir, id, n, s->cap_bytes);
    }
}

/* Persists touched blocks' last use (inside the caller's transaction when there is one). */
static int persist_touches(struct ssd_store *s)
{
    pthread_mutex_lock(&s->mu);
    struct key *keys = s->dirty;
    size_t n = s->n_dirty;
    s->dirty = NULL;
    s->n_dirty = s->cap_dirty = 0;
    s->last_touch_persist_ns = now_ns();
    pthread_mutex_unlock(&s->mu);
    int rc = SQLITE_OK;
    for (size_t i = 0; i < n && rc == SQLITE_OK; i++) {
        pthread_mutex_lock(&s->mu);
        struct entry *e = map_find(s, keys[i].hash, keys[i].ns);
        bool live = e && e->state == ENTRY_DURABLE;
        uint64_t lu = live ? e->last_use : 0;
        if (e)
            e->dirty = 0;
        pthread_mutex_unlock(&s->mu);
        if (!live)
            continue;
        sqlite3_reset(s->st_touch);
        sqlite3_bind_int64(s->st_touch, 1, (sqlite3_int64)lu);
        sqlite3_bind_int64(s->st_touch, 2, (sqlite3_int64)keys[i].hash);
        sqlite3_bind_int64(s->st_touch, 3, (sqlite3_int64)keys[i].ns);
        rc = sqlite3_step(s->st_touch) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(s->db);
    }
    free(keys);
    return rc;
}

/* One group commit: every record written, the segments fdatasynced, then the rows committed in
 * one transaction; only then are the blocks durable. Any failure fails the whole batch and turns
 * the tier off (what reached the segments unindexed is re-verified or cut off at the next open). */
static void run_write_batch(struct ssd_store *s, struct job *batch)
{
    int err_no = 0;
    const char *what = NULL;
    bool disabled;
    pthread_mutex_lock(&s->mu);
    disabled = s->st.disabled;
    pthread_mutex_unlock(&s->mu);
    int first_seg = s->n_segs; /* segments at or after this index were started by this batch */
    uint64_t active_size_before = s->active_fd >= 0 ? s->segs[s->n_segs - 1].size : 0;
    s->batch_off = active_size_before;
    if (s->active_fd >= 0)
        first_seg = s->n_segs - 1;
    struct job *j;
    for (j = batch; j && !disabled && !err_no; j = j->next) {
        int rc = write_record(s, j);
        if (rc) {
            err_no = -rc;
            what = "writing a block";
        }
    }
    if (!disabled && !err_no && s->active_fd >= 0) {
        int rc = wbuf_flush(s);
        if (rc) {
            err_no = -rc;
            what = "writing a block";
        } else if (fdatasync(s->active_fd)) {
            err_no = errno;
            what = "syncing a segment";
        } else {
            drop_written(s, s->active_fd, s->batch_off);
        }
    }
    s->wbuf_used = 0; /* written, or failed with the batch */
    uint64_t now = wall_ms();
    if (!disabled && !err_no) {
        int rc = db_exec(s->db, "BEGIN");
        for (j = batch; rc == SQLITE_OK && j; j = j->next) {
            struct entry e = {.hash = j->hash, .ns = j->ns, .off = j->off, .len = j->len,
                              .data_len = j->data_len, .parent = j->parent, .last_use = now,
                              .seg = j->seg, .n_tokens = j->n_tokens};
            memcpy(e.checksum, j->checksum, 16);
            rc = db_insert(s, &e);
        }
        if (rc == SQLITE_OK)
            rc = persist_touches(s);
        if (rc == SQLITE_OK)
            rc = db_exec(s->db, "COMMIT");
        if (rc != SQLITE_OK) {
            db_exec(s->db, "ROLLBACK");
            err_no = rc == SQLITE_FULL ? ENOSPC : EIO;
            what = "committing the index";
            log_error("ssd cache %s: index: %s", s->dir, sqlite3_errmsg(s->db));
        }
    }
    if (err_no && s->active_fd >= 0 && first_seg < s->n_segs) {
        /* give back what the failed batch appended, where the disk still lets us */
        struct segment *sg = &s->segs[s->n_segs - 1];
        uint64_t keep = (s->n_segs - 1 == first_seg) ? active_size_before : 0;
        if (ftruncate(s->active_fd, (off_t)keep) == 0)
            sg->size = keep;
    }
    bool ok = !err_no && !disabled;
    pthread_mutex_lock(&s->mu);
    if (err_no)
        disable_locked(s, what, err_no);
    for (j = batch; j; j = j->next) {
        struct entry *e = map_find(s, j->hash, j->ns);
        if (ok && e) {
            e->state = ENTRY_DURABLE;
            e->seg = j->seg;
            e->off = j->off;
            e->len = j->len;
            e->last_use = now;
            memcpy(e->checksum, j->checksum, 16);
            s->st.blocks++;
            s->st.writes++;
            s->st.write_bytes += j->data_len;
        } else {
            if (e)
                map_remove(s, j->hash, j->ns);
            s->st.failed++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    /* under the cap before the cookies come back, so a caller that flushed sees the cap hold */
    if (ok)
        enforce_cap(s);
    pthread_mutex_lock(&s->mu);
    for (j = batch; j; j = j->next) {
        s->st.pending--;
        s->st.pending_bytes -= j->data_len;
        s->write_seq_done = j->seq + 1;
        push_done(s, j->cookie, SSD_DONE_WRITE, ok ? 0 : -INFERD_EIO);
    }
    s->st.bytes = disk_bytes_of(s);
    s->st.write_calls = s->write_calls;
    s->st.in_place_writes = s->in_place_writes;
    s->st.io_cpu_ns = thread_cpu_ns() + atomic_load(&s->reader_cpu_ns);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the I/O thread: reads ------------------------------------------------------------------------ */

/* Which pages of one segment file are in the page cache: one mincore over a mapping of the whole
 * file, asked once for a run of records in it (a restore's chain lies in few segments). */
struct seg_residency {
    uint32_t seg;
    bool valid;
    unsigned char *vec;  /* owned; one byte per page, bit 0: resident */
    size_t n_pages;
    long page;
};

static void residency_load(struct ssd_store *s, struct seg_residency *r, uint32_t seg)
{
    free(r->vec);
    *r = (struct seg_residency){.seg = seg, .valid = true, .page = sysconf(_SC_PAGESIZE)};
    int fd = seg_open(s, seg, O_RDONLY);
    struct stat st;
    if (fd < 0 || r->page <= 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t len = (size_t)st.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    r->n_pages = (len + (size_t)r->page - 1) / (size_t)r->page;
    r->vec = malloc(r->n_pages);
    if (r->vec && mincore(m, len, r->vec) != 0) {
        free(r->vec);
        r->vec = NULL;
    }
    munmap(m, len);
}

/* Bytes of [off, off + len) of the loaded segment in the page cache; 0 where that cannot be told. */
static uint64_t residency_bytes(const struct seg_residency *r, uint64_t off, uint64_t len)
{
    if (!r->vec || len == 0)
        return 0;
    size_t first = (size_t)(off / (uint64_t)r->page);
    size_t last = (size_t)((off + len - 1) / (uint64_t)r->page);
    uint64_t in = 0;
    for (size_t i = first; i <= last && i < r->n_pages; i++)
        in += r->vec[i] & 1;
    return in * (uint64_t)r->page;
}

/* The page-cache bytes of the durable record of hash under ns (0 when it is not stored), its
 * segment's residency kept in r for the records after it; *len gets the record's length. */
static uint64_t record_cached(struct ssd_store *s, struct seg_residency *r, uint64_t hash,
                              uint64_t ns, uint64_t *len)
{
    pthread_mutex_lock(&s->mu);
    const struct entry *e = map_find(s, hash, ns);
    struct entry at = e && e->state == ENTRY_DURABLE ? *e : (struct entry){0};
    pthread_mutex_unlock(&s->mu);
    *len = at.state == ENTRY_DURABLE ? at.len : 0;
    if (at.state != ENTRY_DURABLE)
        return 0;
    if (!r->valid || r->seg != at.seg)
        residency_load(s, r, at.seg);
    uint64_t in = residency_bytes(r, at.off, at.len);
    return in < at.len ? in : at.len;
}

/* Reads the record of entry at into j's buffers and the head and tail buffers: through the page
 * cache, or with O_DIRECT when direct (the data's pieces aligned as O_DIRECT asks: the disk puts
 * it where it goes, with no copy, and many such reads keep the disk busy). 0 or -errno (-ENODATA:
 * the file ends first). */
static int read_record(struct ssd_store *s, const struct job *j, const struct entry *at,
                       bool direct, uint8_t *head, size_t head_len, uint8_t *tail, size_t tail_len)
{
    int fd = seg_open(s, at->seg, O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0)
        return -errno;
    struct iovec v[SSD_MAX_IOV + 2];
    int n = 0;
    v[n++] = (struct iovec){head, head_len};
    for (int i = 0; i < j->n_iov; i++)
        if (j->iov[i].iov_len)
            v[n++] = j->iov[i];
    v[n++] = (struct iovec){tail, direct ? tail_len : SSD_RECORD_CHECKSUM_BYTES};
    int io = io_full(fd, v, n, (off_t)at->off, false);
    close(fd);
    return io;
}

/* Reads and checks one block into the caller's buffers; 0 or a negative -INFERD_E* code. */
static int read_block(struct ssd_store *s, struct job *j, bool *drop)
{
    pthread_mutex_lock(&s->mu);
    struct entry *e = map_find(s, j->hash, j->ns);
    struct entry at = e && e->state == ENTRY_DURABLE ? *e : (struct entry){0};
    pthread_mutex_unlock(&s->mu);
    if (at.state != ENTRY_DURABLE)
        return -INFERD_ENOENT;
    *drop = true;
    if (at.data_len != j->data_len || at.n_tokens != j->n_tokens || at.parent != j->parent)
        return -INFERD_ECORRUPT;
    /* the head (header, token ids, padding) and the tail (checksum, padding) in one aligned
     * buffer, as O_DIRECT wants them */
    size_t head_len = (size_t)ssd_record_head_len(j->n_tokens);
    size_t tail_len = (size_t)(at.len - head_len - at.data_len);
    uint8_t *head = NULL;
    if (posix_memalign((void **)&head, SSD_RECORD_ALIGN, head_len + tail_len)) {
        *drop = false;
        return -INFERD_ENOMEM;
    }
    uint8_t *tail = head + head_len;
    bool direct = data_in_place(s, j) && !j->cached;
    int io = read_record(s, j, &at, direct, head, head_len, tail, tail_len);
    if (direct && io == -EINVAL) /* O_DIRECT refused after all: through the page cache */
        io = read_record(s, j, &at, false, head, head_len, tail, tail_len);
    int rc = 0;
    struct ssd_record_header h;
    if (io == -ENOENT)
        rc = -INFERD_ENOENT;
    else if (io == -ENODATA)
        rc = -INFERD_ECORRUPT; /* the segment is shorter than the index says */
    else if (io)
        rc = -INFERD_EIO;
    else if (ssd_record_header_parse(head, head_len, &h, NULL) ||
             memcmp(h.fp_digest, s->fp_digest, 16) != 0 || h.hash != j->hash || h.ns != j->ns ||
             h.parent_hash != j->parent || h.n_tokens != j->n_tokens || h.data_len != j->data_len)
        rc = -INFERD_ECORRUPT;
    for (uint32_t i = 0; rc == 0 && i < j->n_tokens; i++) {
        const uint8_t *p = head + SSD_RECORD_HEADER_BYTES + 4 * (size_t)i;
        uint32_t t = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (t != (uint32_t)j->tokens[i])
            rc = -INFERD_ECORRUPT;
    }
    if (rc == 0 && (!at.verified || s->cfg.verify_on_read)) {
        XXH3_state_t *st = XXH3_createState();
        if (!st) {
            free(head);
            *drop = false;
            return -INFERD_ENOMEM;
        }
        XXH3_128bits_reset(st);
        XXH3_128bits_update(st, head, head_len);
        for (int i = 0; i < j->n_iov; i++)
            XXH3_128bits_update(st, j->iov[i].iov_base, j->iov[i].iov_len);
        XXH128_canonical_t ck;
        XXH128_canonicalFromHash(&ck, XXH3_128bits_digest(st));
        XXH3_freeState(st);
        if (memcmp(ck.digest, tail, 16) != 0 || memcmp(ck.digest, at.checksum, 16) != 0)
            rc = -INFERD_ECORRUPT;
    }
    free(head);
    if (rc == 0) {
        *drop = false;
        pthread_mutex_lock(&s->mu);
        if ((e = map_find(s, j->hash, j->ns)))
            e->verified = 1;
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* A batch of reads shared out between the I/O thread and helpers: each takes the next job. */
struct read_share {
    struct ssd_store *s;
    struct job **jobs;
    int n;
    _Atomic int next;
};

static void read_share_run(struct read_share *sh)
{
    for (int i; (i = atomic_fetch_add(&sh->next, 1)) < sh->n;) {
        struct job *j = sh->jobs[i];
        j->status = read_block(sh->s, j, &j->drop);
    }
}

static void *read_helper(void *arg)
{
    struct read_share *sh = arg;
    read_share_run(sh);
    atomic_fetch_add(&sh->s->reader_cpu_ns, thread_cpu_ns());
    return NULL;
}

/* Reads every job of the batch into its caller's buffers. A request waits for these (in its
 * "loading" state), and one thread copying and hashing block after block reaches a fraction of
 * what the disk delivers, so a large batch is shared with up to READ_THREADS - 1 helpers, one
 * for every READ_BLOCKS_PER_THREAD blocks, no more than the machine has cores. Each job's status
 * (and whether its block leaves the store) is set; nothing else is touched. */
static void read_batch(struct ssd_store *s, struct job *batch)
{
    int n = 0;
    for (struct job *j = batch; j; j = j->next)
        n++;
    struct job **jobs = malloc((size_t)n * sizeof *jobs);
    if (!jobs) { /* one by one, here */
        for (struct job *j = batch; j; j = j->next)
            j->status = read_block(s, j, &j->drop);
        return;
    }
    n = 0;
    struct seg_residency r = {0};
    for (struct job *j = batch; j; j = j->next) {
        jobs[n++] = j;
        uint64_t len;
        if (data_in_place(s, j)) /* O_DIRECT unless the page cache holds most of the record */
            j->cached = 2 * record_cached(s, &r, j->hash, j->ns, &len) >= len && len > 0;
    }
    free(r.vec);
    struct read_share sh = {.s = s, .jobs = jobs, .n = n};
    int want = (n + READ_BLOCKS_PER_THREAD - 1) / READ_BLOCKS_PER_THREAD;
    want = want < read_threads_max() ? want : read_threads_max();
    pthread_t helpers[READ_THREADS];
    int started = 0;
    while (started + 1 < want && pthread_create(&helpers[started], NULL, read_helper, &sh) == 0)
        started++;
    read_share_run(&sh);
    for (int i = 0; i < started; i++)
        pthread_join(helpers[i], NULL);
    free(jobs);
}

static void run_reads(struct ssd_store *s, struct job *batch)
{
    uint64_t first_queued = UINT64_MAX;
    bool in_tx = false;
    read_batch(s, batch);
    for (struct job *j = batch; j; j = j->next) {
        if (j->queued_ns < first_queued)
            first_queued = j->queued_ns;
        if (!j->drop)
            continue;
        pthread_mutex_lock(&s->mu);
        forget_durable(s, j->hash, j->ns);
        if (j->status == -INFERD_ECORRUPT)
            s->st.verify_failures++;
        else if (j->status == -INFERD_EIO)
            s->st.failed++;
        pthread_mutex_unlock(&s->mu);
        if (j->status == -INFERD_ECORRUPT)
            log_warn("ssd cache %s: block %016" PRIx64 " failed verification; dropped", s->dir,
                     j->hash);
        if (!in_tx)
            in_tx = db_exec(s->db, "BEGIN") == SQLITE_OK;
        db_delete(s, j->hash, j->ns);
    }
    if (in_tx && db_exec(s->db, "COMMIT") != SQLITE_OK)
        db_exec(s->db, "ROLLBACK");
    pthread_mutex_lock(&s->mu);
    for (struct job *j = batch; j; j = j->next) {
        if (j->status == 0) {
            s->st.restores++;
            s->st.restore_bytes += j->data_len;
        }
        s->st.pending_reads--;
        push_done(s, j->cookie, SSD_DONE_READ, j->status);
    }
    s->st.restore_ms_last = (double)(now_ns() - first_queued) * 1e-6;
    s->st.io_cpu_ns = thread_cpu_ns() + atomic_load(&s->reader_cpu_ns);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

static void free_jobs(struct job *j)
{
    while (j) {
        struct job *next = j->next;
        free(j);
        j = next;
    }
}

/* Reads first (a request waits on them), then one batch of writes, then idle touches. */
/* Write-behind must not slow decoding: the engine's workers fill every core while a step
 * runs, and a writer taking one of them (checksums, copies, the index) holds the whole step
 * at its barrier. So the I/O thread writes at SCHED_IDLE, on the cores the engine leaves
 * idle, and goes back to normal priority for reads (a request waits on them), for flushes
 * someone waits for, and at shutdown. Going back needs CAP_SYS_NICE or an RLIMIT_NICE of 20;
 * the thread probes it once and, where it cannot, stays at normal priority. */
static bool io_policy(int policy)
{
    struct sched_param sp = {0};
    return pthread_setschedparam(pthread_self(), policy, &sp) == 0;
}

static void io_probe_background(struct ssd_store *s)
{
    s->io_can_background = io_policy(SCHED_IDLE) && io_policy(SCHED_OTHER);
    if (!s->io_can_background) {
        io_policy(SCHED_OTHER);
        log_info("ssd cache: write-behind runs at normal priority (the I/O thread could not "
                 "return from idle priority: no CAP_SYS_NICE, RLIMIT_NICE below 20)");
    }
}

static void io_set_background(struct ssd_store *s, bool background)
{
    if (!s->io_can_background || background == s->io_background)
        return;
    if (io_policy(background ? SCHED_IDLE : SCHED_OTHER))
        s->io_background = background;
    else if (!background)
        s->io_can_background = false; /* stays where it is; never lowered again */
}

static void *io_main(void *arg)
{
    struct ssd_store *s = arg;
    io_probe_background(s);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* the mutex is held here: this pass's work decides the priority */
        io_set_background(s, !s->rq_head && !s->flush_waiters && !s->stopping);
        if (s->rq_head) {
            struct job *reads = s->rq_head;
            s->rq_head = s->rq_tail = NULL;
            pthread_mutex_unlock(&s->mu);
            run_reads(s, reads);
            free_jobs(reads);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        if (s->wq_head) {
            struct job *batch = s->wq_head, *last = batch;
            uint64_t bytes = last->data_len;
            while (last->next && bytes + last->next->data_len <= WRITE_BATCH_BYTES) {
                last = last->next;
                bytes += last->data_len;
            }
            s->wq_head = last->next;
            if (!s->wq_head)
                s->wq_tail = NULL;
            last->next = NULL;
            pthread_mutex_unlock(&s->mu);
            run_write_batch(s, batch);
            free_jobs(batch);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        bool touches_due = s->n_dirty && (s->stopping || now_ns() - s->last_touch_persist_ns >= TOUCH_PERSIST_NS);
        if (touches_due) {
            pthread_mutex_unlock(&s->mu);
            if (db_exec(s->db, "BEGIN") == SQLITE_OK) {
                if (persist_touches(s) == SQLITE_OK && db_exec(s->db, "COMMIT") == SQLITE_OK)
                    ;
                else
                    db_exec(s->db, "ROLLBACK");
            }
            pthread_mutex_lock(&s->mu);
            continue;
        }
        if (s->stopping)
            break;
        if (s->n_dirty) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&s->work, &s->mu, &ts);
        } else {
            pthread_cond_wait(&s->work, &s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- public ---------------------------------------------------------------------------------------- */

static void store_free(struct ssd_store *s)
{
    if (!s)
        return;
    if (s->active_fd >= 0)
        close(s->active_fd);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    db_close(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done_cv);
    free(s->wbuf);
    free(s->segs);
    free(s->slots);
    free(s->dirty);
    free(s->done);
    free(s->root);
    free(s->dir);
    free(s);
}

/* Opens the index and reconciles it with the segments; a damaged index is discarded and rebuilt
 * from the records (then every record is re-verified and re-indexed by recover_segments). */
static int open_index(struct ssd_store *s, struct err *err)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = db_open(s);
        if (rc == SQLITE_OK)
            rc = load_index(s);
        if (rc == SQLITE_OK)
            rc = recover_segments(s);
        if (rc == SQLITE_OK)
            return 0;
        const char *msg = sqlite3_errstr(rc);
        /* a full, read-only or failing disk is not a damaged index: keep it for a better day */
        int primary = rc & 0xff;
        bool environment = primary == SQLITE_FULL || primary == SQLITE_READONLY ||
                           primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN ||
                           primary == SQLITE_BUSY || primary == SQLITE_LOCKED ||
                           primary == SQLITE_NOMEM || primary == SQLITE_PERM;
        if (attempt == 1 || environment)
            return err_set(err, INFERD_EIO, "ssd cache %s: cannot open the index: %s", s->dir, msg);
        log_warn("ssd cache %s: the index is damaged (%s); rebuilding it from the segments", s->dir,
                 msg);
        db_discard(s);
        free(s->slots);
        s->slots = NULL;
        s->cap = s->count = 0;
        s->st.blocks = 0;
        s->st.recovered_blocks = 0;
        s->st.torn_tails = 0;
        s->st.index_rebuilt = true;
    }
    return 0;
}

int ssd_store_open(const struct ssd_config *cfg, struct ssd_store **out, struct err *err)
{
    *out = NULL;
    if (!cfg->dir || !*cfg->dir)
        return err_set(err, INFERD_EINVAL, "ssd cache: no directory given");
    if (cfg->fp.block_size <= 0)
        return err_set(err, INFERD_EINVAL, "ssd cache: block size %d", cfg->fp.block_size);
    struct ssd_store *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(err, INFERD_ENOMEM, "ssd cache: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->active_fd = s->lock_fd = -1;
    s->cfg = *cfg;
    s->root = strdup(cfg->dir);
    ssd_fingerprint_digest(&cfg->fp, s->fp_digest);
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", s->fp_digest[i]);
    if (!s->root || asprintf(&s->dir, "%s/%s", cfg->dir, hex) < 0) {
        s->dir = NULL;
        store_free(s);
        return err_set(err, INFERD_ENOMEM, "ssd cache: out of memory");
    }
    s->cfg.dir = s->root;
    s->st.dir = s->dir;
    s->st.max_bytes = cfg->max_bytes;
    if (!s->cfg.queue_max_bytes)
        s->cfg.queue_max_bytes = QUEUE_BYTES_DEFAULT;

    int rc = mkdir_p(s->dir);
    if (rc == 0) {
        char *lock = path_in(s, "lock");
        s->lock_fd = lock ? open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
        rc = s->lock_fd < 0 ? -errno : 0;
        free(lock);
    }
    if (rc == 0 && flock(s->lock_fd, LOCK_EX | LOCK_NB)) {
        err_set(err, INFERD_EBUSY, "ssd cache: %s is in use by another process", s->dir);
        store_free(s);
        return -INFERD_EBUSY;
    }
    if (rc == 0)
        rc = write_fingerprint_json(s);
    if (rc == 0)
        rc = probe_bandwidth(s, cfg->probe_bytes ? cfg->probe_bytes : PROBE_BYTES_DEFAULT);
    if (rc) {
        err_set(err, INFERD_EIO, "ssd cache: %s cannot be created or written: %s", s->dir,
                strerror(-rc));
        store_free(s);
        return -INFERD_EIO;
    }
    if ((rc = setup_writes(s, err))) {
        store_free(s);
        return rc;
    }
    if ((rc = scan_dir(s))) {
        err_set(err, INFERD_EIO, "ssd cache: listing %s: %s", s->dir, strerror(-rc));
        store_free(s);
        return -INFERD_EIO;
    }
    if ((rc = open_index(s, err))) {
        store_free(s);
        return rc;
    }

    /* The cap: what the caller set, and never more than the disk can take beside what is there. */
    uint64_t on_disk = disk_bytes_of(s), cap = UINT64_MAX;
    struct statvfs vfs;
    /* a file system that reports no size (ramfs) sets no cap of its own */
    if (statvfs(s->dir, &vfs) == 0 && vfs.f_blocks > 0) {
        uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        uint64_t reserve = total / 20 < FREE_SPACE_RESERVE ? total / 20 : FREE_SPACE_RESERVE;
        cap = on_disk + (avail > reserve ? avail - reserve : 0);
    }
    if (cfg->max_bytes && cfg->max_bytes < cap)
        cap = cfg->max_bytes;
    s->cap_bytes = cap;
    s->st.cap_bytes = cap;
    s->seg_bytes = cfg->segment_bytes;
    if (!s->seg_bytes) {
        s->seg_bytes = SEGMENT_BYTES_DEFAULT;
        if (cap / 8 < s->seg_bytes)
            s->seg_bytes = cap / 8 > SEGMENT_BYTES_MIN ? cap / 8 : SEGMENT_BYTES_MIN;
    }
    enforce_cap(s);
    s->st.bytes = disk_bytes_of(s);
    log_info("ssd cache %s: %" PRIu64 " blocks, %.1f MiB in %d segments; recovered %" PRIu64
             ", dropped %" PRIu64 "%s; cap %.1f MiB; read %.0f MB/s (%.0f MB/s from the page "
             "cache); writes %s",
             s->dir, s->st.blocks, (double)s->st.bytes / (1 << 20), s->n_segs,
             s->st.recovered_blocks, s->st.dropped_at_start,
             s->st.index_rebuilt ? " (index rebuilt)" : "", (double)cap / (1 << 20),
             s->read_bw / 1e6, s->cache_bw / 1e6, s->direct ? "O_DIRECT" : "through the page cache");

    if (pthread_create(&s->thread, NULL, io_main, s)) {
        store_free(s);
        return err_set(err, INFERD_ENOMEM, "ssd cache: cannot start the I/O thread");
    }
    s->thread_started = true;
    *out = s;
    return 0;
}

void ssd_store_close(struct ssd_store *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->active_fd >= 0)
        fdatasync(s->active_fd);
    store_free(s);
}

bool ssd_store_contains(struct ssd_store *s, uint64_t hash, uint64_t ns, uint32_t *n_tokens_out)
{
    pthread_mutex_lock(&s->mu);
    struct entry *e = map_find(s, hash, ns);
    bool found = e && e->state == ENTRY_DURABLE;
    if (found && n_tokens_out)
        *n_tokens_out = e->n_tokens;
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* One allocation holding the job, its token ids and its iovec array. */
static struct job *job_new(enum ssd_done_kind kind, const struct ssd_block_key *key,
                           const struct iovec *iov, int n_iov, uint64_t cookie)
{
    size_t toks = (size_t)key->n_tokens * sizeof(int32_t);
    struct job *j = calloc(1, sizeof *j + (size_t)n_iov * sizeof *iov + toks);
    if (!j)
        return NULL;
    j->kind = kind;
    j->cookie = cookie;
    j->hash = key->hash;
    j->parent = key->parent_hash;
    j->ns = key->ns;
    j->n_tokens = (uint32_t)key->n_tokens;
    j->iov = (struct iovec *)(j + 1);
    j->n_iov = n_iov;
    if (n_iov)
        memcpy(j->iov, iov, (size_t)n_iov * sizeof *iov);
    j->tokens = (int32_t *)(j->iov + n_iov);
    if (toks)
        memcpy(j->tokens, key->tokens, toks);
    for (int i = 0; i < n_iov; i++)
        j->data_len += iov[i].iov_len;
    j->queued_ns = now_ns();
    return j;
}

static int check_args(const struct ssd_store *s, const struct ssd_block_key *key,
                      const struct iovec *iov, int n_iov, struct err *err)
{
    if (key->n_tokens <= 0 || key->n_tokens > s->cfg.fp.block_size || !key->tokens)
        return err_set(err, INFERD_EINVAL, "ssd cache: a block of %d tokens (block size %d)",
                       key->n_tokens, s->cfg.fp.block_size);
    if (n_iov < 0 || n_iov > SSD_MAX_IOV || (n_iov > 0 && !iov))
        return err_set(err, INFERD_EINVAL, "ssd cache: %d pieces (at most %d)", n_iov, SSD_MAX_IOV);
    uint64_t total = 0;
    for (int i = 0; i < n_iov; i++)
        total += iov[i].iov_len;
    if (total > SSD_RECORD_MAX_DATA)
        return err_set(err, INFERD_EINVAL, "ssd cache: block of %" PRIu64 " bytes", total);
    return 0;
}

int ssd_store_write(struct ssd_store *s, const struct ssd_block_key *key, const struct iovec *data,
                    int n_iov, uint64_t cookie, struct err *err)
{
    int rc = check_args(s, key, data, n_iov, err);
    if (rc)
        return rc;
    struct job *j = job_new(SSD_DONE_WRITE, key, data, n_iov, cookie);
    if (!j)
        return err_set(err, INFERD_ENOMEM, "ssd cache: out of memory queueing a block");
    uint64_t len = ssd_record_len(j->n_tokens, j->data_len);
    pthread_mutex_lock(&s->mu);
    if (s->st.disabled)
        rc = err_set(err, INFERD_EIO, "ssd cache is off: %s", s->st.disable_reason);
    else if (len > s->cap_bytes)
        rc = err_set(err, INFERD_ERANGE, "ssd cache: a block of %" PRIu64 " bytes exceeds the cap "
                     "of %" PRIu64, len, s->cap_bytes);
    else if (map_find(s, key->hash, key->ns))
        rc = -INFERD_EEXIST;
    else if (s->st.pending && s->st.pending_bytes + j->data_len > s->cfg.queue_max_bytes)
        rc = err_set(err, INFERD_EBUSY, "ssd cache: %" PRIu64 " bytes already waiting to be written "
                     "(bound %zu)", s->st.pending_bytes, s->cfg.queue_max_bytes);
    else {
        struct entry e = {.hash = key->hash, .ns = key->ns, .parent = key->parent_hash,
                          .data_len = j->data_len, .n_tokens = j->n_tokens, .state = ENTRY_QUEUED};
        if (!map_insert(s, &e))
            rc = err_set(err, INFERD_ENOMEM, "ssd cache: out of memory queueing a block");
    }
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        if (rc == -INFERD_EEXIST)
            err_set(err, INFERD_EEXIST, "ssd cache: block %016" PRIx64 " is already stored or queued",
                    key->hash);
        free(j);
        return rc;
    }
    j->seq = s->write_seq_next++;
    if (s->wq_tail)
        s->wq_tail->next = j;
    else
        s->wq_head = j;
    s->wq_tail = j;
    s->st.pending++;
    s->st.pending_bytes += j->data_len;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int ssd_store_read(struct ssd_store *s, const struct ssd_block_key *expect, const struct iovec *dst,
                   int n_iov, uint64_t cookie, struct err *err)
{
    int rc = check_args(s, expect, dst, n_iov, err);
    if (rc)
        return rc;
    struct job *j = job_new(SSD_DONE_READ, expect, dst, n_iov, cookie);
    if (!j)
        return err_set(err, INFERD_ENOMEM, "ssd cache: out of memory queueing a read");
    pthread_mutex_lock(&s->mu);
    struct entry *e = map_find(s, expect->hash, expect->ns);
    if (!e || e->state != ENTRY_DURABLE)
        rc = err_set(err, INFERD_ENOENT, "ssd cache: block %016" PRIx64 " is not stored",
                     expect->hash);
    else if (e->data_len != j->data_len)
        rc = err_set(err, INFERD_EINVAL, "ssd cache: block %016" PRIx64 " holds %" PRIu64
                     " bytes, the read asks for %" PRIu64, expect->hash, e->data_len, j->data_len);
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        free(j);
        return rc;
    }
    if (s->rq_tail)
        s->rq_tail->next = j;
    else
        s->rq_head = j;
    s->rq_tail = j;
    s->st.pending_reads++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int ssd_store_poll(struct ssd_store *s, struct ssd_done *done, int max)
{
    pthread_mutex_lock(&s->mu);
    int n = 0;
    while (n < max && s->done_n) {
        done[n++] = s->done[s->done_head];
        s->done_head = (s->done_head + 1) % s->done_cap;
        s->done_n--;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* An absolute CLOCK_REALTIME deadline timeout_ms from now (pthread_cond_timedwait's clock). */
static struct timespec deadline_after(int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

int ssd_store_wait(struct ssd_store *s, int timeout_ms)
{
    struct timespec until = deadline_after(timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&s->mu);
    while (!s->done_n && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->done_cv, &s->mu);
        else if (pthread_cond_timedwait(&s->done_cv, &s->mu, &until) == ETIMEDOUT)
            break;
    }
    int n = (int)s->done_n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int ssd_store_flush(struct ssd_store *s, int timeout_ms)
{
    struct timespec until = deadline_after(timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->write_seq_next;
    /* let idle touches go out with the next pass of the thread, at normal priority */
    s->last_touch_persist_ns = 0;
    s->flush_waiters++;
    pthread_cond_signal(&s->work);
    int rc = 0;
    while (s->write_seq_done < target) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->done_cv, &s->mu);
        else if (timeout_ms == 0 ||
                 pthread_cond_timedwait(&s->done_cv, &s->mu, &until) == ETIMEDOUT) {
            rc = s->write_seq_done < target ? -INFERD_EBUSY : 0;
            break;
        }
    }
    s->flush_waiters--;
    if (rc == 0 && s->st.disabled)
        rc = -INFERD_EIO;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void ssd_store_stats(struct ssd_store *s, struct ssd_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

double ssd_store_read_bandwidth(struct ssd_store *s)
{
    return s->read_bw;
}

double ssd_store_cache_bandwidth(struct ssd_store *s)
{
    return s->cache_bw;
}

uint64_t ssd_store_cached_bytes(struct ssd_store *s, const uint64_t *hashes, int n, uint64_t ns)
{
    struct seg_residency r = {0};
    uint64_t total = 0, len;
    for (int i = 0; i < n; i++)
        total += record_cached(s, &r, hashes[i], ns, &len);
    free(r.vec);
    return total;
}

void ssd_store_touch(struct ssd_store *s, uint64_t hash, uint64_t ns)
{
    pthread_mutex_lock(&s->mu);
    struct entry *e = map_find(s, hash, ns);
    if (e && e->state == ENTRY_DURABLE) {
        e->last_use = wall_ms();
        if (!e->dirty) {
            if (s->n_dirty == s->cap_dirty) {
                size_t nc = s->cap_dirty ? s->cap_dirty * 2 : 256;
                struct key *nk = realloc(s->dirty, nc * sizeof *nk);
                if (nk) {
                    s->dirty = nk;
                    s->cap_dirty = nc;
                }
            }
            if (s->n_dirty < s->cap_dirty) {
                s->dirty[s->n_dirty++] = (struct key){hash, ns};
                e->dirty = 1;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void ssd_store_note_dropped(struct ssd_store *s, uint64_t n)
{
    pthread_mutex_lock(&s->mu);
    s->st.dropped += n;
    pthread_mutex_unlock(&s->mu);
}
