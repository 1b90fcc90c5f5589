/* api/admin.h — the server's own routes: GET /health, /stats and /metrics, the prefix
 * cache's POST /admin/cache/session/close, the SSD tier's POST /admin/cache/flush, and GET
 * /engine. */
#ifndef INFERD_API_ADMIN_H
#define INFERD_API_ADMIN_H

#include "api/http.h"

void admin_health(struct http_exchange *x);
void admin_stats(struct http_exchange *x);
void admin_metrics(struct http_exchange *x);
/* POST /admin/cache/session/close {"session_id": "..."}: 200 {"closed": true,
 * "blocks_released": N}, or 200 {"closed": false} for a session not open; 400
 * for a body that is not that. The API key is needed when one is set. */
void admin_session_close(struct http_exchange *x);
/* POST /admin/cache/flush [{"timeout_ms": N}] (default 30000): makes everything the prefix
 * cache holds durable in the SSD tier. 200 {"durable": true, counters} once it is; 503
 * {"durable": false, counters, "reason"} when the timeout passed first (the writes go on) or
 * the tier turned itself off; 400 without --ssd-cache, or for a body that is not that. The
 * counters: pending, pending_bytes, unqueued (cached blocks not yet queued), blocks, bytes,
 * writes, write_bytes, failed, dropped, disabled, elapsed_ms. The API key is needed when one
 * is set. */
void admin_cache_flush(struct http_exchange *x);
/* GET /engine: how the engines run: {isolated, pid, restarts, socket, pool: {default,
 * resident: [ids]} (null without a pool)}. Without --isolate engines run in the server's own
 * process: isolated false, pid the server's, restarts 0, socket null. With it: isolated true,
 * pid and socket the default model's engine child's, restarts every child's restarts summed,
 * and supervisor_pid, admin_socket, watchdog_s, leases, response_store {entries, bytes,
 * max_bytes, ttl_ms} (the supervisor's) and engines: [{id, pid, state, restarts, crashes, hangs,
 * socket, in_flight, paused}] (one per running child). */
void admin_engine(struct http_exchange *x);

#endif
