/* api/response_store.c — stored responses: a hash table of entries on two lists, by use (for
 * eviction) and by age (for expiry), under one lock. */
#include "api/response_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/timer.h"

#define MIN_BUCKETS 64

struct entry {
    struct entry *chain;                /* next in its bucket */
    struct entry *lru_prev, *lru_next;  /* most recently used first */
    struct entry *age_prev, *age_next;  /* oldest first */
    uint64_t hash;
    uint64_t put_ms;
    size_t bytes;                       /* what it counts against max_bytes */
    char *response, *context;           /* point into the same allocation, after id */
    size_t response_len, context_len;
    char id[];                          /* NUL-terminated */
};

struct response_store {
    pthread_mutex_t mu;
    struct response_store_config cfg;
    struct entry **buckets;             /* owned; n_buckets (a power of two) chains */
    size_t n_buckets;
    struct entry *lru_head, *lru_tail;
    struct entry *age_head, *age_tail;
    size_t entries, bytes;
    uint64_t evictions, expirations;
};

static uint64_t system_clock_ms(void *ctx)
{
    (void)ctx;
    return now_ns() / 1000000u;
}

static uint64_t hash_id(const char *id, size_t len)
{
    return hash_mix64(hash_fnv1a(HASH_FNV_OFFSET, id, len));
}

int response_store_create(const struct response_store_config *cfg, struct response_store **out,
                          struct err *err)
{
    *out = NULL;
    struct response_store *s = calloc(1, sizeof *s);
    if (!s || !(s->buckets = calloc(MIN_BUCKETS, sizeof *s->buckets))) {
        free(s);
        return err_set(err, INFERD_ENOMEM, "out of memory for the response store");
    }
    s->n_buckets = MIN_BUCKETS;
    s->cfg = *cfg;
    if (!s->cfg.clock_ms)
        s->cfg.clock_ms = system_clock_ms;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void response_store_free(struct response_store *s)
{
    if (!s)
        return;
    for (struct entry *e = s->lru_head, *next; e; e = next) {
        next = e->lru_next;
        free(e);
    }
    free(s->buckets);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- lists and table (called with mu held) ---- */

static void lru_unlink(struct response_store *s, struct entry *e)
{
    *(e->lru_prev ? &e->lru_prev->lru_next : &s->lru_head) = e->lru_next;
    *(e->lru_next ? &e->lru_next->lru_prev : &s->lru_tail) = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

static void lru_push_front(struct response_store *s, struct entry *e)
{
    e->lru_prev = NULL;
    e->lru_next = s->lru_head;
    *(s->lru_head ? &s->lru_head->lru_prev : &s->lru_tail) = e;
    s->lru_head = e;
}

static void age_unlink(struct response_store *s, struct entry *e)
{
    *(e->age_prev ? &e->age_prev->age_next : &s->age_head) = e->age_next;
    *(e->age_next ? &e->age_next->age_prev : &s->age_tail) = e->age_prev;
    e->age_prev = e->age_next = NULL;
}

static void age_push_back(struct response_store *s, struct entry *e)
{
    e->age_next = NULL;
    e->age_prev = s->age_tail;
    *(s->age_tail ? &s->age_tail->age_next : &s->age_head) = e;
    s->age_tail = e;
}

static struct entry **slot_of(struct response_store *s, const char *id, uint64_t hash)
{
    struct entry **p = &s->buckets[hash & (s->n_buckets - 1)];
    while (*p && ((*p)->hash != hash || strcmp((*p)->id, id) != 0))
        p = &(*p)->chain;
    return p;
}

static void drop(struct response_store *s, struct entry *e)
{
    struct entry **p = slot_of(s, e->id, e->hash);
    *p = e->chain;
    lru_unlink(s, e);
    age_unlink(s, e);
    s->entries--;
    s->bytes -= e->bytes;
    free(e);
}

/* Entries are put in clock order, so the expired ones are a prefix of the age list. */
static void expire(struct response_store *s)
{
    if (s->cfg.ttl_ms == 0)
        return;
    uint64_t now = s->cfg.clock_ms(s->cfg.clock_ctx);
    while (s->age_head && now - s->age_head->put_ms >= s->cfg.ttl_ms) {
        drop(s, s->age_head);
        s->expirations++;
    }
}

/* Doubles the table when it holds more entries than buckets; a failed grow only costs speed. */
static void maybe_grow(struct response_store *s)
{
    if (s->entries < s->n_buckets)
        return;
    size_t n = s->n_buckets * 2;
    struct entry **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < s->n_buckets; i++) {
        for (struct entry *e = s->buckets[i], *next; e; e = next) {
            next = e->chain;
            struct entry **head = &b[e->hash & (n - 1)];
            e->chain = *head;
            *head = e;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->n_buckets = n;
}

/* ---- the contract ---- */

int response_store_put(struct response_store *s, const char *id, const char *response,
                       size_t response_len, const char *context, size_t context_len,
                       struct err *err)
{
    size_t id_len = id ? strlen(id) : 0;
    if (id_len == 0 || id_len > RESPONSE_STORE_MAX_ID)
        return err_set(err, INFERD_EINVAL, "a stored response's id must be 1 to %d bytes, got %zu",
                       RESPONSE_STORE_MAX_ID, id_len);
    size_t bytes = sizeof(struct entry) + id_len + 1 + response_len + 1 + context_len + 1;
    if (bytes > s->cfg.max_bytes)
        return err_set(err, INFERD_ERANGE,
                       "the response takes %zu bytes, over the store's %zu (--response-store-mb)",
                       bytes, s->cfg.max_bytes);
    struct entry *e = malloc(bytes);
    if (!e)
        return err_set(err, INFERD_ENOMEM, "out of memory storing a response of %zu bytes", bytes);
    memset(e, 0, sizeof *e);
    memcpy(e->id, id, id_len + 1);
    e->response = e->id + id_len + 1;
    e->context = e->response + response_len + 1;
    if (response_len)
        memcpy(e->response, response, response_len);
    e->response[response_len] = '\0';
    if (context_len)
        memcpy(e->context, context, context_len);
    e->context[context_len] = '\0';
    e->response_len = response_len;
    e->context_len = context_len;
    e->bytes = bytes;
    e->hash = hash_id(id, id_len);

    pthread_mutex_lock(&s->mu);
    e->put_ms = s->cfg.clock_ms(s->cfg.clock_ctx);
    expire(s);
    struct entry *old = *slot_of(s, id, e->hash);
    if (old)
        drop(s, old);
    while (s->lru_tail && s->bytes + bytes > s->cfg.max_bytes) {
        drop(s, s->lru_tail);
        s->evictions++;
    }
    maybe_grow(s);
    struct entry **head = &s->buckets[e->hash & (s->n_buckets - 1)];
    e->chain = *head;
    *head = e;
    lru_push_front(s, e);
    age_push_back(s, e);
    s->entries++;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static char *copy_text(const char *s, size_t len)
{
    char *c = malloc(len + 1);
    if (c)
        memcpy(c, s, len + 1);
    return c;
}

int response_store_get(struct response_store *s, const char *id, char **response,
                       size_t *response_len, char **context, size_t *context_len)
{
    if (response)
        *response = NULL;
    if (context)
        *context = NULL;
    pthread_mutex_lock(&s->mu);
    expire(s);
    struct entry *e = *slot_of(s, id, hash_id(id, strlen(id)));
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    lru_unlink(s, e);
    lru_push_front(s, e);
    /* Copied under the lock: a put may drop the entry the moment it is released. */
    char *r = response ? copy_text(e->response, e->response_len) : NULL;
    char *c = context ? copy_text(e->context, e->context_len) : NULL;
    size_t rl = e->response_len, cl = e->context_len;
    pthread_mutex_unlock(&s->mu);
    if ((response && !r) || (context && !c)) {
        free(r);
        free(c);
        return -INFERD_ENOMEM;
    }
    if (response) {
        *response = r;
        if (response_len)
            *response_len = rl;
    }
    if (context) {
        *context = c;
        if (context_len)
            *context_len = cl;
    }
    return 1;
}

bool response_store_delete(struct response_store *s, const char *id)
{
    pthread_mutex_lock(&s->mu);
    expire(s);
    struct entry *e = *slot_of(s, id, hash_id(id, strlen(id)));
    bool found = e != NULL;
    if (found)
        drop(s, e);
    pthread_mutex_unlock(&s->mu);
    return found;
}

void response_store_get_stats(struct response_store *s, struct response_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    expire(s);
    *out = (struct response_store_stats){
        .entries = s->entries,
        .bytes = s->bytes,
        .max_bytes = s->cfg.max_bytes,
        .ttl_s = s->cfg.ttl_ms / 1000,
        .evictions = s->evictions,
        .expirations = s->expirations,
    };
    pthread_mutex_unlock(&s->mu);
}
