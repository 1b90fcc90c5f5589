/* engine/checkpoint.c — generation checkpoints written by their own thread (tmp file, fsync,
 * rename, directory fsync), read back and verified at submit. */
#define _GNU_SOURCE
#include "engine/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/hash.h"
#include "base/log.h"

#define CKPT_MAGIC "inferdCK"
#define CKPT_VERSION 1
#define CKPT_HEADER 40

enum ckpt_op { CKPT_SAVE, CKPT_REMOVE };

struct ckpt_job {
    enum ckpt_op op;
    uint64_t key;
    uint8_t *bytes; /* owned; a whole file for CKPT_SAVE */
    size_t len;
    struct ckpt_job *next;
};

struct ckpt_store {
    char *dir; /* owned */
    int dir_fd;
    pthread_t writer;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ckpt_job *head, *tail; /* under mu */
    bool stopping;                /* under mu */
    struct ckpt_stats stats;      /* under mu */
};

uint64_t ckpt_key_of(const struct gen_params *p)
{
    uint64_t h = hash_fnv1a(HASH_FNV_OFFSET, "inferd checkpoint 1", 19);
    h = hash_fnv1a_word(h, (uint64_t)p->n_prompt);
    h = hash_fnv1a(h, p->prompt, (size_t)p->n_prompt * sizeof *p->prompt);
    const struct sampler_params *s = &p->sampling;
    float f[] = {s->temperature, s->top_p, s->min_p, s->repetition_penalty, s->presence_penalty,
                 s->frequency_penalty};
    h = hash_fnv1a(h, f, sizeof f);
    h = hash_fnv1a_word(h, (uint64_t)(int64_t)s->top_k);
    int32_t windows[] = {s->repetition_context_size, s->presence_context_size,
                         s->frequency_context_size};
    h = hash_fnv1a(h, windows, sizeof windows);
    float xtc[] = {s->xtc_probability, s->xtc_threshold};
    h = hash_fnv1a(h, xtc, sizeof xtc);
    h = hash_fnv1a(h, s->xtc_keep, (size_t)s->n_xtc_keep * sizeof *s->xtc_keep);
    /* greedy picks never draw from the random stream: its seed changes nothing */
    h = hash_fnv1a_word(h, s->temperature > 0 ? s->seed : 0);
    h = hash_fnv1a_word(h, (uint64_t)s->n_logit_bias);
    for (int i = 0; i < s->n_logit_bias; i++) {
        h = hash_fnv1a_word(h, (uint64_t)s->logit_bias[i].token);
        h = hash_fnv1a(h, &s->logit_bias[i].bias, sizeof s->logit_bias[i].bias);
    }
    h = hash_fnv1a_word(h, (uint64_t)p->max_tokens);
    h = hash_fnv1a_word(h, (uint64_t)(int64_t)p->logprobs);
    h = hash_fnv1a_word(h, (uint64_t)p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        h = hash_fnv1a(h, p->stop[i], strlen(p->stop[i]) + 1);
    h = hash_fnv1a_word(h, (uint64_t)p->n_eos);
    for (int i = 0; i < p->n_eos; i++)
        h = hash_fnv1a_word(h, (uint64_t)p->eos_ids[i]);
    h = hash_fnv1a_word(h, p->cache_ns);
    return hash_mix64(h);
}

static void file_name(uint64_t key, const char *suffix, char *out, size_t cap)
{
    snprintf(out, cap, "%016llx.%s", (unsigned long long)key, suffix);
}

/* ---- the writer ------------------------------------------------------------------ */

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static bool do_save(struct ckpt_store *s, const struct ckpt_job *j)
{
    char tmp[64], name[64];
    file_name(j->key, "tmp", tmp, sizeof tmp);
    file_name(j->key, "ckpt", name, sizeof name);
    int fd = openat(s->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return false;
    bool ok = write_all(fd, j->bytes, j->len) == 0 && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (ok)
        ok = renameat(s->dir_fd, tmp, s->dir_fd, name) == 0 && fsync(s->dir_fd) == 0;
    if (!ok)
        unlinkat(s->dir_fd, tmp, 0);
    return ok;
}

static void *writer_main(void *arg)
{
    struct ckpt_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        struct ckpt_job *j = s->head;
        if (!j)
            break;
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        s->stats.pending--;
        pthread_mutex_unlock(&s->mu);
        bool ok = true;
        if (j->op == CKPT_SAVE) {
            ok = do_save(s, j);
        } else {
            char name[64];
            file_name(j->key, "ckpt", name, sizeof name);
            if (unlinkat(s->dir_fd, name, 0) == 0)
                fsync(s->dir_fd);
        }
        pthread_mutex_lock(&s->mu);
        if (j->op == CKPT_SAVE && ok)
            s->stats.saved++;
        else if (j->op == CKPT_SAVE)
            s->stats.failed++;
        else
            s->stats.removed++;
        pthread_cond_broadcast(&s->cv);
        free(j->bytes);
        free(j);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Queues j, dropping a queued save of the same key it replaces. */
static void enqueue(struct ckpt_store *s, struct ckpt_job *j)
{
    pthread_mutex_lock(&s->mu);
    struct ckpt_job **link = &s->head, *prev = NULL;
    while (*link) {
        struct ckpt_job *q = *link;
        if (q->key == j->key && q->op == CKPT_SAVE) {
            *link = q->next;
            s->stats.pending--;
            free(q->bytes);
            free(q);
            continue;
        }
        prev = q;
        link = &q->next;
    }
    s->tail = prev;
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->stats.pending++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int ckpt_store_save(struct ckpt_store *s, uint64_t key, uint64_t rng_state, int n_prompt,
                    const struct gen_token *tokens, int n_generated)
{
    size_t rec = (size_t)n_generated * sizeof *tokens;
    size_t len = CKPT_HEADER + rec + 8;
    struct ckpt_job *j = calloc(1, sizeof *j);
    uint8_t *b = malloc(len);
    if (!j || !b) {
        free(j);
        free(b);
        return -INFERD_ENOMEM;
    }
    memcpy(b, CKPT_MAGIC, 8);
    uint32_t u32[] = {CKPT_VERSION, (uint32_t)sizeof *tokens};
    memcpy(b + 8, u32, sizeof u32);
    memcpy(b + 16, &key, 8);
    memcpy(b + 24, &rng_state, 8);
    uint32_t counts[] = {(uint32_t)n_generated, (uint32_t)n_prompt};
    memcpy(b + 32, counts, sizeof counts);
    memcpy(b + CKPT_HEADER, tokens, rec);
    uint64_t sum = XXH3_64bits(b, CKPT_HEADER + rec);
    memcpy(b + CKPT_HEADER + rec, &sum, 8);
    *j = (struct ckpt_job){.op = CKPT_SAVE, .key = key, .bytes = b, .len = len};
    enqueue(s, j);
    return 0;
}

void ckpt_store_remove(struct ckpt_store *s, uint64_t key)
{
    struct ckpt_job *j = calloc(1, sizeof *j);
    if (!j)
        return;
    *j = (struct ckpt_job){.op = CKPT_REMOVE, .key = key};
    enqueue(s, j);
}

/* ---- reading ------------------------------------------------------------------- */

static int parse(const uint8_t *b, size_t len, uint64_t key, int n_prompt, struct ckpt *out)
{
    if (len < CKPT_HEADER + 8 || memcmp(b, CKPT_MAGIC, 8))
        return -INFERD_EFORMAT;
    uint32_t version, rec_size, n_generated, prompt;
    memcpy(&version, b + 8, 4);
    memcpy(&rec_size, b + 12, 4);
    memcpy(&n_generated, b + 32, 4);
    memcpy(&prompt, b + 36, 4);
    if (version != CKPT_VERSION || rec_size != sizeof(struct gen_token) || n_generated == 0 ||
        (uint64_t)n_generated * rec_size != len - CKPT_HEADER - 8 || (int)prompt != n_prompt)
        return -INFERD_EFORMAT;
    uint64_t sum, k;
    memcpy(&sum, b + len - 8, 8);
    memcpy(&k, b + 16, 8);
    if (sum != XXH3_64bits(b, len - 8) || k != key)
        return -INFERD_EFORMAT;
    out->tokens = malloc((size_t)n_generated * rec_size);
    if (!out->tokens)
        return -INFERD_ENOMEM;
    memcpy(out->tokens, b + CKPT_HEADER, (size_t)n_generated * rec_size);
    out->key = key;
    memcpy(&out->rng_state, b + 24, 8);
    out->n_generated = (int)n_generated;
    return 0;
}

int ckpt_store_load(struct ckpt_store *s, uint64_t key, int n_prompt, struct ckpt *out)
{
    memset(out, 0, sizeof *out);
    char name[64];
    file_name(key, "ckpt", name, sizeof name);
    int fd = openat(s->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -INFERD_ENOENT;
    struct stat st;
    uint8_t *b = NULL;
    int rc = -INFERD_ENOENT;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && st.st_size < (1 << 30) &&
        (b = malloc((size_t)st.st_size)) && pread(fd, b, (size_t)st.st_size, 0) == st.st_size)
        rc = parse(b, (size_t)st.st_size, key, n_prompt, out) == 0 ? 0 : -INFERD_ENOENT;
    close(fd);
    free(b);
    if (rc < 0) {
        log_warn("checkpoint %s does not parse: ignored", name);
        ckpt_store_remove(s, key);
    }
    return rc;
}

void ckpt_free(struct ckpt *c)
{
    free(c->tokens);
    memset(c, 0, sizeof *c);
}

/* ---- lifetime ------------------------------------------------------------------- */

int ckpt_store_open(const char *dir, struct ckpt_store **out, struct err *err)
{
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return err_set(err, INFERD_EIO, "cannot create the checkpoint directory %s: %s", dir,
                       strerror(errno));
    struct ckpt_store *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir))) {
        free(s);
        return err_set(err, INFERD_ENOMEM, "out of memory for the checkpoint store");
    }
    s->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dir_fd < 0) {
        int e = errno;
        free(s->dir);
        free(s);
        return err_set(err, INFERD_EIO, "cannot open the checkpoint directory %s: %s", dir,
                       strerror(e));
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        close(s->dir_fd);
        free(s->dir);
        free(s);
        return err_set(err, INFERD_ENOMEM, "cannot start the checkpoint writer");
    }
    *out = s;
    return 0;
}

void ckpt_store_close(struct ckpt_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->writer, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    close(s->dir_fd);
    free(s->dir);
    free(s);
}

void ckpt_store_stats(struct ckpt_store *s, struct ckpt_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

void ckpt_store_note_resumed(struct ckpt_store *s)
{
    pthread_mutex_lock(&s->mu);
    s->stats.resumed++;
    pthread_mutex_unlock(&s->mu);
}
