/* api/metrics.h — request counters by route (of the server's route table) and status, and their
 * Prometheus and /stats views. */
#ifndef INFERD_API_METRICS_H
#define INFERD_API_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/strbuf.h"

/* Statuses counted individually; anything else lands in the last slot. */
#define METRICS_STATUSES {200, 400, 401, 404, 405, 413, 415, 429, 500, 503}
#define METRICS_N_STATUSES 11
#define API_METRICS_MAX_ROUTES 32

/* Request counters, one set per route of the server's table and one more
 * (labelled "other") for paths no route has. */
struct api_metrics {
    size_t n_routes;
    const char *labels[API_METRICS_MAX_ROUTES + 1]; /* borrowed; [n_routes] is "other" */
    atomic_uint_fast64_t requests[API_METRICS_MAX_ROUTES + 1][METRICS_N_STATUSES];
};

struct engine;
struct server;

/* One counter set per label (labels borrowed; routes with the same label are
 * reported together), zeroed. -INFERD_EINVAL past API_METRICS_MAX_ROUTES. */
int api_metrics_init(struct api_metrics *m, const char *const *labels, size_t n, struct err *err);
/* Counts an answer of route slot (out of range: "other"). */
void api_metrics_count(struct api_metrics *m, int slot, int status);
uint64_t api_metrics_total(const struct api_metrics *m);

/* GET /metrics: Prometheus text exposition format 0.0.4. */
void api_metrics_prometheus(const struct server *srv, struct strbuf *out);
/* GET /stats: JSON. */
void api_metrics_stats_json(const struct server *srv, struct strbuf *out);

#endif
