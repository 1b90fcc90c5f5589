/* api/admin.h — the server's own routes: GET /health, /stats and /metrics. */
#ifndef INFERD_API_ADMIN_H
#define INFERD_API_ADMIN_H

#include "api/http.h"

void admin_health(struct http_exchange *x);
void admin_stats(struct http_exchange *x);
void admin_metrics(struct http_exchange *x);

#endif
