/* backend/moe_route.h — mixture-of-experts routing of one row (softmax, then torch.topk's choice), shared by the backends so they pick the same experts.
 *
 * The reference (transformers on the CPU) picks the top k of the softmaxed
 * router logits with torch.topk, whose CPU kernel runs libstdc++'s
 * std::nth_element (or std::partial_sort when k * 64 <= n) over (value,
 * index) pairs with the comparator "x > y". Equal probabilities — experts
 * whose router rows give the same logit — are then resolved by where those
 * algorithms happen to leave them, not by index. moe_route_row replays the
 * same algorithms step for step, so an exact tie goes the reference's way.
 * Plain C that nvcc also compiles as device code (one thread per row). */
#ifndef INFERD_BACKEND_MOE_ROUTE_H
#define INFERD_BACKEND_MOE_ROUTE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MOE_FN static __host__ __device__ inline
#else
#define MOE_FN static inline
#endif

/* Experts one router may have (the row's scratch is this big). */
#define MOE_MAX_EXPERTS 512

struct moe_pair {
    float p;
    int32_t id;
};

/* torch's comparator for largest: NaN first, then larger values. */
MOE_FN bool moe_comp(struct moe_pair a, struct moe_pair b)
{
    return (isnan(a.p) && !isnan(b.p)) || a.p > b.p;
}

MOE_FN void moe_swap(struct moe_pair *a, struct moe_pair *b)
{
    struct moe_pair t = *a;
    *a = *b;
    *b = t;
}

/* libstdc++'s __push_heap and __adjust_heap. */
MOE_FN void moe_push_heap(struct moe_pair *f, long hole, long top, struct moe_pair v)
{
    long parent = (hole - 1) / 2;
    while (hole > top && moe_comp(f[parent], v)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = v;
}

MOE_FN void moe_adjust_heap(struct moe_pair *f, long hole, long len, struct moe_pair v)
{
    long top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (moe_comp(f[child], f[child - 1]))
            child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    moe_push_heap(f, hole, top, v);
}

/* libstdc++'s __heap_select: afterwards [0, mid) holds mid largest. */
MOE_FN void moe_heap_select(struct moe_pair *f, long mid, long last)
{
    if (mid >= 2)
        for (long parent = (mid - 2) / 2;; parent--) {
            moe_adjust_heap(f, parent, mid, f[parent]);
            if (parent == 0)
                break;
        }
    for (long i = mid; i < last; i++)
        if (moe_comp(f[i], f[0])) {
            struct moe_pair v = f[i];
            f[i] = f[0];
            moe_adjust_heap(f, 0, mid, v);
        }
}

/* libstdc++'s __insertion_sort. */
MOE_FN void moe_insertion_sort(struct moe_pair *f, long first, long last)
{
    if (first == last)
        return;
    for (long i = first + 1; i < last; i++) {
        struct moe_pair v = f[i];
        if (moe_comp(v, f[first])) {
            for (long j = i; j > first; j--)
                f[j] = f[j - 1];
            f[first] = v;
        } else {
            long j = i;
            while (moe_comp(v, f[j - 1])) {
                f[j] = f[j - 1];
                j--;
            }
            f[j] = v;
        }
    }
}

/* libstdc++'s std::nth_element (__introselect, depth limit 2 * floor(log2 n)). */
MOE_FN void moe_nth_element(struct moe_pair *f, long nth, long last)
{
    long first = 0;
    if (nth == last)
        return;
    int depth = 0;
    for (long n = last; n > 1; n >>= 1)
        depth++;
    depth *= 2;
    while (last - first > 3) {
        if (depth == 0) {
            moe_heap_select(f + first, nth + 1 - first, last - first);
            moe_swap(&f[first], &f[nth]);
            return;
        }
        depth--;
        /* __unguarded_partition_pivot: the median of (first + 1, mid, last - 1) to first */
        long a = first + 1, b = first + (last - first) / 2, c = last - 1;
        long m;
        if (moe_comp(f[a], f[b]))
            m = moe_comp(f[b], f[c]) ? b : moe_comp(f[a], f[c]) ? c : a;
        else
            m = moe_comp(f[a], f[c]) ? a : moe_comp(f[b], f[c]) ? c : b;
        moe_swap(&f[first], &f[m]);
        long lo = first + 1, hi = last;
        for (;;) {
            while (moe_comp(f[lo], f[first]))
                lo++;
            hi--;
            while (moe_comp(f[first], f[hi]))
                hi--;
            if (!(lo < hi))
                break;
            moe_swap(&f[lo], &f[hi]);
            lo++;
        }
        if (lo <= nth)
            first = lo;
        else
            last = lo;
    }
    moe_insertion_sort(f, first, last);
}

/* One row: softmax of logits[0, n), torch.topk's k experts, ids by
 * probability descending (ties lower id first) and their weights
 * (normalised to sum 1 when norm). scratch: n pairs. */
MOE_FN void moe_route_row(const float *logits, int n, int k, bool norm, struct moe_pair *scratch,
                          int32_t *ids, float *weights)
{
    float mx = -INFINITY;
    for (int e = 0; e < n; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0;
    for (int e = 0; e < n; e++) {
        scratch[e].p = expf(logits[e] - mx);
        scratch[e].id = e;
        sum += scratch[e].p;
    }
    float inv = 1.0f / sum;
    for (int e = 0; e < n; e++)
        scratch[e].p *= inv;
    if ((long)k * 64 <= (long)n)
        moe_heap_select(scratch, k, n);
    else
        moe_nth_element(scratch, k - 1, n);
    /* the chosen k by p descending, ties lower id first (a selection sort: k is small) */
    for (int i = 0; i < k; i++) {
        int best = i;
        for (int j = i + 1; j < k; j++)
            if (scratch[j].p > scratch[best].p ||
                (scratch[j].p == scratch[best].p && scratch[j].id < scratch[best].id))
                best = j;
        moe_swap(&scratch[i], &scratch[best]);
    }
    float total = 0;
    for (int i = 0; i < k; i++)
        total += scratch[i].p;
    for (int i = 0; i < k; i++) {
        ids[i] = scratch[i].id;
        weights[i] = norm ? scratch[i].p / total : scratch[i].p;
    }
}

#endif
