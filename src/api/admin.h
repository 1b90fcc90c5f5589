/* api/admin.h — the server's own routes: GET /health, /stats and /metrics, and the prefix
 * cache's POST /admin/cache/session/close. */
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

#endif
