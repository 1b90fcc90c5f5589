/* base/histogram.h — a latency histogram with fixed bucket bounds, safe to observe from any thread. */
#ifndef INFERD_BASE_HISTOGRAM_H
#define INFERD_BASE_HISTOGRAM_H

#include <stdatomic.h>
#include <stdint.h>

#define HISTOGRAM_MAX_BUCKETS 24

struct histogram {
    int n_bounds;
    double bounds[HISTOGRAM_MAX_BUCKETS]; /* upper bounds, ascending; +Inf is implicit */
    atomic_uint_fast64_t counts[HISTOGRAM_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
    atomic_uint_fast64_t sum_ns;          /* sum of observations, in nanoseconds */
};

/* Buckets for latencies in seconds, from 0.5 ms to 60 s. */
void histogram_init_latency(struct histogram *h);
void histogram_observe(struct histogram *h, double seconds);
uint64_t histogram_count(const struct histogram *h);

#endif
