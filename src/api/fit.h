/* api/fit.h — whether a model fits a machine: the largest safe context for a memory budget,
 * and GET /fit, which reports the sizes, the budget and the predicted decode speed. */
#ifndef INFERD_API_FIT_H
#define INFERD_API_FIT_H

#include <stdint.h>

#include "api/http.h"

/* Positions of KV (kv_bytes_per_token each) that fit in memory bytes beside
 * weights and transient buffers; 0 when not even the weights and buffers do. */
int64_t fit_max_context(uint64_t memory, uint64_t weights, uint64_t transient,
                        uint64_t kv_bytes_per_token);

/* GET /fit: srv->fit as JSON, with the context the engine enforces. */
void fit_report(struct http_exchange *x);

#endif
