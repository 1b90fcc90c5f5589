/* backend/cpu/lora.c — the low-rank adapter op: a segmented shrink (u = A x) then expand (y += scale B u), each adapter's A and B (f32 or bf16) read once per call for every row that takes it.
 *
 * Shrink: the work items are (distinct A, k < rank); an item runs A's row k over
 * every row of every seg taking that A, so the row stays in L1 while the rows
 * pass. Expand: threads split the outputs in blocks of eight and walk the segs
 * in order, each seg's blocks in turn (its B one sequential stream), each
 * block's eight rows of B read once for all the rows of the seg; stacked segs
 * over one row add in seg order. Between the two, u waits in scratch.
 *
 * Batch invariance: a row's dot products have a fixed lane layout and a fixed
 * reduction tree that depend on in and rank alone; which thread runs them and
 * what else the call holds change nothing in its bits. */
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

/* The CPU backend runs only where AVX2 and FMA are (backend_cpu_create checks). */
#define LORA_TARGET __attribute__((target("avx2,fma")))
#define STACK_SEGS 256
#define BLOCK 8 /* outputs per expand block: one register */

struct lora_job {
    const float *x;
    float *y;
    int64_t in, out;
    const struct lora_seg *segs;
    int n_segs;
    float *u;            /* scratch: seg s's n_rows x rank at u_off[s] */
    const size_t *u_off; /* n_segs */
    /* Segs grouped by A: group g is perm[start[g] .. start[g + 1]); its items are
     * [item0[g], item0[g] + rank) of the n_items. */
    const int *perm, *start, *item0;
    int n_groups, n_items;
};

/* Lanes 0..7 of v summed in one fixed tree. */
LORA_TARGET static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The first n (< 8) lanes on, for masked loads of a tail. */
LORA_TARGET static inline __m256i tail_mask(int64_t n)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lanes);
}

/* Elements [i, i + 8) of an adapter matrix (f32, or bf16 widened exactly). */
LORA_TARGET static inline __m256 load8(const void *m, int64_t i, bool bf16)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)m + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)m + i);
}

/* Elements [i, i + n) (n < 8) of an adapter matrix, the other lanes zero. */
LORA_TARGET static inline __m256 load_tail(const void *m, int64_t i, int64_t n, bool bf16)
{
    if (bf16) {
        uint16_t t[8] = {0};
        memcpy(t, (const uint16_t *)m + i, (size_t)n * sizeof t[0]);
        return load8(t, 0, true);
    }
    return _mm256_maskload_ps((const float *)m + i, tail_mask(n));
}

/* x . a over n elements: four accumulators of eight lanes over 32-element steps,
 * then eight-element steps and a zero-padded tail into the first, summed
 * ((0 + 1) + (2 + 3)) and across lanes; the order depends on n alone. */
LORA_TARGET static float dot(const float *x, const void *a, int64_t n, bool bf16)
{
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(a, i, bf16), c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load8(a, i + 8, bf16), c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), load8(a, i + 16, bf16), c2);
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), load8(a, i + 24, bf16), c3);
    }
    for (; i + 8 <= n; i += 8)
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(a, i, bf16), c0);
    if (i < n)
        c0 = _mm256_fmadd_ps(_mm256_maskload_ps(x + i, tail_mask(n - i)),
                             load_tail(a, i, n - i, bf16), c0);
    return hsum8(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
}

/* Shrink: items [begin, end) of the job's (group, k) list. */
LORA_TARGET static void shrink_items(void *ctx, int ith, int nth)
{
    const struct lora_job *j = ctx;
    int begin = (int)((long)j->n_items * ith / nth), end = (int)((long)j->n_items * (ith + 1) / nth);
    int g = 0;
    for (int it = begin; it < end; it++) {
        while (it >= j->item0[g] + j->segs[j->perm[j->start[g]]].p.rank)
            g++;
        int k = it - j->item0[g];
        const struct lora_pair *p = &j->segs[j->perm[j->start[g]]].p;
        size_t row_bytes = (size_t)j->in * (p->bf16 ? 2 : 4);
        const void *a = (const uint8_t *)p->a + (size_t)k * row_bytes;
        for (int q = j->start[g]; q < j->start[g + 1]; q++) {
            int s = j->perm[q];
            const struct lora_seg *sg = &j->segs[s];
            float *u = j->u + j->u_off[s] + k;
            for (int t = 0; t < sg->n_rows; t++)
                u[(size_t)t * (size_t)p->rank] =
                    dot(j->x + (size_t)(sg->row0 + t) * (size_t)j->in, a, j->in, p->bf16);
        }
    }
}

/* The eight sums of a0..a7, lane i holding ai's, in one fixed tree. */
LORA_TARGET static inline __m256 hsum8x8(const __m256 a[BLOCK])
{
    __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 t0 = _mm256_hadd_ps(s01, s23), t1 = _mm256_hadd_ps(s45, s67);
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* y[r0 .. r0 + n) += scale * B[r0 + i] . u for one row, n <= 8 (fewer only at the end of
 * out: the missing rows repeat the last one and are not stored). Each output's dot runs
 * rank in eight-lane steps (a masked tail) into its own accumulator, then hsum8x8. */
LORA_TARGET static inline __attribute__((always_inline)) void expand_block(const struct lora_pair *p, int64_t r0, int n,
                                     const float *u, float *y)
{
    __m256 acc[BLOCK];
    const void *b[BLOCK];
    size_t row_bytes = (size_t)p->b_stride * (p->bf16 ? 2 : 4);
    for (int i = 0; i < BLOCK; i++) {
        acc[i] = _mm256_setzero_ps();
        b[i] = (const uint8_t *)p->b + (size_t)(r0 + (i < n ? i : n - 1)) * row_bytes;
    }
    int k = 0;
    for (; k + 8 <= p->rank; k += 8) {
        __m256 uk = _mm256_loadu_ps(u + k);
        for (int i = 0; i < BLOCK; i++)
            acc[i] = _mm256_fmadd_ps(load8(b[i], k, p->bf16), uk, acc[i]);
    }
    if (k < p->rank) {
        __m256 uk = _mm256_maskload_ps(u + k, tail_mask(p->rank - k));
        for (int i = 0; i < BLOCK; i++)
            acc[i] = _mm256_fmadd_ps(load_tail(b[i], k, p->rank - k, p->bf16), uk, acc[i]);
    }
    __m256 v = hsum8x8(acc);
    if (n == BLOCK) {
        _mm256_storeu_ps(y + r0, _mm256_fmadd_ps(_mm256_set1_ps(p->scale), v, _mm256_loadu_ps(y + r0)));
    } else {
        __m256i m = tail_mask(n);
        __m256 yv = _mm256_maskload_ps(y + r0, m);
        _mm256_maskstore_ps(y + r0, m, _mm256_fmadd_ps(_mm256_set1_ps(p->scale), v, yv));
    }
}

/* Expand: thread ith's share of the output blocks, seg by seg in order (so a seg's B is one
 * sequential stream, and stacked segs add in their order), each block over the seg's rows. */
LORA_TARGET static void expand_outputs(void *ctx, int ith, int nth)
{
    const struct lora_job *j = ctx;
    int64_t blocks = (j->out + BLOCK - 1) / BLOCK;
    int64_t begin = blocks * ith / nth, end = blocks * (ith + 1) / nth;
    for (int s = 0; s < j->n_segs; s++) {
        const struct lora_seg *sg = &j->segs[s];
        const float *u = j->u + j->u_off[s];
        for (int64_t blk = begin; blk < end; blk++) {
            int64_t r0 = blk * BLOCK;
            int n = j->out - r0 < BLOCK ? (int)(j->out - r0) : BLOCK;
            for (int t = 0; t < sg->n_rows; t++)
                expand_block(&sg->p, r0, n, u + (size_t)t * (size_t)sg->p.rank,
                             j->y + (size_t)(sg->row0 + t) * (size_t)j->out);
        }
    }
}

void cpu_lora(struct backend *be, const float *x, int64_t in, int64_t out,
              const struct lora_seg *segs, int n_segs, float *scratch, float *y)
{
    cpu_settle(be);
    if (n_segs < 1)
        return;
    /* n_segs is the step's runs (at most a few per sequence): the stack, else the heap */
    int stack[4 * STACK_SEGS + 1];
    size_t stack_off[STACK_SEGS];
    int *ints = n_segs <= STACK_SEGS ? stack : malloc((size_t)(4 * n_segs + 1) * sizeof *ints);
    size_t *u_off = n_segs <= STACK_SEGS ? stack_off : malloc((size_t)n_segs * sizeof *u_off);
    if (!ints || !u_off) {
        /* no memory for the grouping: one seg at a time, the same arithmetic */
        if (ints != stack)
            free(ints);
        if (u_off != stack_off)
            free(u_off);
        for (int s = 0; s < n_segs; s++)
            cpu_lora(be, x, in, out, &segs[s], 1, scratch, y);
        return;
    }
    int *perm = ints, *start = ints + n_segs, *item0 = ints + 2 * n_segs + 1,
        *group = ints + 3 * n_segs + 1;
    /* group each seg with the earlier ones that share its A (a handful of distinct ones) */
    int n_groups = 0;
    size_t off = 0;
    long work = 0;
    for (int s = 0; s < n_segs; s++) {
        u_off[s] = off;
        off += (size_t)segs[s].n_rows * (size_t)segs[s].p.rank;
        work += (long)segs[s].n_rows * segs[s].p.rank * (long)(in + out);
        int g = 0;
        while (g < n_groups && segs[start[g]].p.a != segs[s].p.a)
            g++;
        if (g == n_groups)
            start[n_groups++] = s; /* its first seg, for now */
        group[s] = g;
    }
    int n_items = 0;
    for (int g = 0, q = 0; g < n_groups; g++) {
        int rank = segs[start[g]].p.rank;
        start[g] = q;
        for (int s = 0; s < n_segs; s++)
            if (group[s] == g)
                perm[q++] = s;
        item0[g] = n_items;
        n_items += rank;
    }
    start[n_groups] = n_segs;
    struct lora_job job = {.x = x, .y = y, .in = in, .out = out, .segs = segs, .n_segs = n_segs,
                           .u = scratch, .u_off = u_off, .perm = perm, .start = start,
                           .item0 = item0, .n_groups = n_groups, .n_items = n_items};
    struct cpu_impl *impl = be->impl;
    if (work < 65536) {
        shrink_items(&job, 0, 1);
        expand_outputs(&job, 0, 1);
    } else {
        threadpool_run(impl->pool, shrink_items, &job);
        threadpool_run(impl->pool, expand_outputs, &job);
    }
    if (ints != stack)
        free(ints);
    if (u_off != stack_off)
        free(u_off);
}
