/* api/metrics.h — request counters by route and status, and their Prometheus and /stats views. */
#ifndef INFERD_API_METRICS_H
#define INFERD_API_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/strbuf.h"

enum api_route {
    ROUTE_CHAT_COMPLETIONS,
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_STATS,
    ROUTE_METRICS,
    ROUTE_OTHER, /* unknown paths */
    ROUTE_COUNT,
};

/* Statuses counted individually; anything else lands in the last slot. */
#define METRICS_STATUSES {200, 400, 401, 404, 405, 413, 415, 429, 500, 503}
#define METRICS_N_STATUSES 11

struct api_metrics {
    atomic_uint_fast64_t requests[ROUTE_COUNT][METRICS_N_STATUSES];
};

struct engine;
struct server;

const char *api_route_path(enum api_route r);
void api_metrics_init(struct api_metrics *m);
void api_metrics_count(struct api_metrics *m, enum api_route route, int status);
uint64_t api_metrics_total(const struct api_metrics *m);

/* GET /metrics: Prometheus text exposition format 0.0.4. */
void api_metrics_prometheus(const struct server *srv, struct strbuf *out);
/* GET /stats: JSON. */
void api_metrics_stats_json(const struct server *srv, struct strbuf *out);

#endif
