/* api/response_store.h — the Responses API's stored responses: what previous_response_id chains
 * from and GET / DELETE /v1/responses/{id} read, kept in memory, bounded by bytes and by age.
 *
 * An entry is an id and two texts the store does not interpret: the response as the client sees
 * it (the Response object's JSON) and its context (what a later turn needs to rebuild the
 * conversation). Entries live at most ttl_ms from when they were put; past max_bytes the least
 * recently used ones are dropped. Every call takes one lock: HTTP handler threads share a store.
 * Nothing survives a restart. */
#ifndef INFERD_API_RESPONSE_STORE_H
#define INFERD_API_RESPONSE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* The server's defaults: 64 MiB and one hour. */
#define RESPONSE_STORE_DEFAULT_MB 64
#define RESPONSE_STORE_DEFAULT_TTL_S 3600
/* The longest id kept, in bytes. */
#define RESPONSE_STORE_MAX_ID 128

struct response_store;

struct response_store_config {
    size_t max_bytes;                 /* every entry's bytes (texts, id, bookkeeping); 0: keeps
                                         nothing */
    uint64_t ttl_ms;                  /* an entry's life from its put; 0: until evicted */
    uint64_t (*clock_ms)(void *ctx);  /* a monotonic clock in ms; NULL: the system's */
    void *clock_ctx;
};

int response_store_create(const struct response_store_config *cfg, struct response_store **out,
                          struct err *err);
void response_store_free(struct response_store *s);

/* Keeps copies of response and context under id (1..RESPONSE_STORE_MAX_ID bytes), replacing an
 * entry of that id, evicting the least recently used entries until it fits. Returns 0;
 * -INFERD_ERANGE when the entry alone is over max_bytes (nothing kept, nothing evicted);
 * -INFERD_EINVAL for a bad id; -INFERD_ENOMEM. */
int response_store_put(struct response_store *s, const char *id, const char *response,
                       size_t response_len, const char *context, size_t context_len,
                       struct err *err);

/* Copies out the entry of id (marking it recently used): *response and *context are malloc'd and
 * NUL-terminated (either pointer may be NULL when that text is not wanted). Returns 1 when
 * found, 0 when there is none or it expired, -INFERD_ENOMEM. */
int response_store_get(struct response_store *s, const char *id, char **response,
                       size_t *response_len, char **context, size_t *context_len);

/* Drops the entry of id; false when there was none (or it had expired). */
bool response_store_delete(struct response_store *s, const char *id);

struct response_store_stats {
    size_t entries, bytes, max_bytes;
    uint64_t ttl_s;
    uint64_t evictions;   /* entries dropped for space */
    uint64_t expirations; /* entries dropped for age */
};
void response_store_get_stats(struct response_store *s, struct response_store_stats *out);

#endif
