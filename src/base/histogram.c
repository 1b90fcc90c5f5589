/* base/histogram.c — fixed-bucket latency histogram with atomic counters. */
#include "base/histogram.h"

#include <string.h>

void histogram_init_latency(struct histogram *h)
{
    static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1,    0.25,  0.5,    1,     2.5,  5,     10,
                                    30,     60};
    memset(h, 0, sizeof *h);
    h->n_bounds = (int)(sizeof bounds / sizeof bounds[0]);
    memcpy(h->bounds, bounds, sizeof bounds);
    for (int i = 0; i <= HISTOGRAM_MAX_BUCKETS; i++)
        atomic_init(&h->counts[i], 0);
    atomic_init(&h->sum_ns, 0);
}

void histogram_observe(struct histogram *h, double seconds)
{
    if (!(seconds >= 0))
        seconds = 0;
    int b = 0;
    while (b < h->n_bounds && seconds > h->bounds[b])
        b++;
    atomic_fetch_add_explicit(&h->counts[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint_fast64_t)(seconds * 1e9), memory_order_relaxed);
}

uint64_t histogram_count(const struct histogram *h)
{
    uint64_t n = 0;
    for (int b = 0; b <= h->n_bounds; b++)
        n += atomic_load_explicit(&h->counts[b], memory_order_relaxed);
    return n;
}
