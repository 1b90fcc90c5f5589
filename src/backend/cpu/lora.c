/* backend/cpu/lora.c — the low-rank adapter op: each row's shrink (A x) and expand (B u) for the adapters its run of rows takes. */
#include "backend/cpu/cpu_internal.h"

struct lora_job {
    const float *x;
    float *y;
    int64_t in, out;
    const struct lora_seg *segs;
    int n_segs;
    int row_lo, row_hi; /* rows any seg covers */
};

/* The CPU backend runs only where AVX2 and FMA are (backend_cpu_create checks):
 * the eight lanes below are one register. */
#if defined(__x86_64__)
#define LORA_TARGET __attribute__((target("avx2,fma")))
#else
#define LORA_TARGET
#endif

/* x . w over n floats in eight fixed lanes, summed pairwise at the end: the
 * order depends on n alone, so a row's bits never depend on its batch. */
LORA_TARGET static float dot(const float *x, const float *w, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += x[i + l] * w[i + l];
    for (int l = 0; i < n; i++, l++)
        acc[l] += x[i] * w[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Threads split the rows, so stacked segs over one row stay on one thread
 * and add in seg order. */
LORA_TARGET static void lora_rows(void *ctx, int ith, int nth)
{
    const struct lora_job *j = ctx;
    long n = j->row_hi - j->row_lo;
    long begin = j->row_lo + n * ith / nth, end = j->row_lo + n * (ith + 1) / nth;
    float u[LORA_MAX_RANK];
    for (long t = begin; t < end; t++) {
        const float *x = j->x + (size_t)t * (size_t)j->in;
        float *y = j->y + (size_t)t * (size_t)j->out;
        for (int s = 0; s < j->n_segs; s++) {
            const struct lora_seg *sg = &j->segs[s];
            if (t < sg->row0 || t >= sg->row0 + sg->n_rows)
                continue;
            const struct lora_pair *p = &sg->p;
            for (int k = 0; k < p->rank; k++)
                u[k] = dot(x, p->a + (size_t)k * (size_t)j->in, j->in);
            for (int64_t r = 0; r < j->out; r++)
                y[r] += p->scale * dot(u, p->b + (size_t)r * (size_t)p->b_stride, p->rank);
        }
    }
}

void cpu_lora(struct backend *be, const float *x, int64_t in, int64_t out,
              const struct lora_seg *segs, int n_segs, float *scratch, float *y)
{
    (void)scratch; /* each thread keeps its row's u on its stack */
    if (n_segs < 1)
        return;
    struct lora_job job = {.x = x, .y = y, .in = in, .out = out, .segs = segs, .n_segs = n_segs,
                           .row_lo = segs[0].row0, .row_hi = segs[0].row0 + segs[0].n_rows};
    long work = 0;
    for (int s = 0; s < n_segs; s++) {
        if (segs[s].row0 < job.row_lo)
            job.row_lo = segs[s].row0;
        if (segs[s].row0 + segs[s].n_rows > job.row_hi)
            job.row_hi = segs[s].row0 + segs[s].n_rows;
        work += (long)segs[s].n_rows * segs[s].p.rank * (long)(in + out);
    }
    struct cpu_impl *impl = be->impl;
    if (work < 65536 || job.row_hi - job.row_lo < 2) {
        lora_rows(&job, 0, 1);
        return;
    }
    threadpool_run(impl->pool, lora_rows, &job);
}
