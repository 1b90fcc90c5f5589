/* backend/cpu/moe.c — the CPU's mixture-of-experts ops: routing per row, and the experts' SwiGLU MLPs over the rows gathered per expert.
 *
 * moe_ffn sorts the (row, expert) pairs by expert, gathers each chosen
 * expert's rows into one block and runs its three matrices over that block
 * (GEMV for a decode step, GEMM for a prefill chunk): an expert no row chose
 * is never read. The matmul reduces each output in an order fixed by its
 * row alone (EXACT mode), so gathering changes no bits; the rows' outputs are
 * then added per row in ascending expert order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/moe_route.h"

static struct threadpool *pool_of(struct backend *be)
{
    return ((struct cpu_impl *)be->impl)->pool;
}

struct route_job {
    const float *logits;
    int64_t n_rows;
    int n_experts, top_k;
    bool norm;
    int32_t *ids;
    float *weights;
};

static void route_rows(void *ctx, int ith, int nth)
{
    struct route_job *j = ctx;
    struct moe_pair scratch[MOE_MAX_EXPERTS];
    long begin, end;
    threadpool_split(j->n_rows, ith, nth, 1, &begin, &end);
    for (long r = begin; r < end; r++)
        moe_route_row(j->logits + r * j->n_experts, j->n_experts, j->top_k, j->norm, scratch,
                      j->ids + r * j->top_k, j->weights + r * j->top_k);
}

void cpu_moe_route(struct backend *be, const float *logits, int64_t n_rows, int n_experts,
                   int top_k, bool norm, int32_t *ids, float *weights)
{
    cpu_settle(be);
    struct route_job job = {logits, n_rows, n_experts, top_k, norm, ids, weights};
    if (n_rows < 16)
        route_rows(&job, 0, 1);
    else
        threadpool_run(pool_of(be), route_rows, &job);
}

void cpu_moe_ffn(struct backend *be, const float *x, int64_t n_rows, const struct moe_experts *ex,
                 const int32_t *ids, const float *weights, int top_k, float *scratch, float *y)
{
    cpu_settle(be);
    int64_t n_pairs = n_rows * top_k, hidden = ex->hidden, inter = ex->inter;
    int n_experts = ex->n_experts;
    /* pairs sorted by expert (a counting sort, stable: rows in order) */
    int64_t *start = calloc((size_t)n_experts + 1, sizeof *start);
    int64_t *order = malloc((size_t)n_pairs * sizeof *order); /* position -> pair */
    int64_t *where = malloc((size_t)n_pairs * sizeof *where); /* pair -> position */
    if (!start || !order || !where)
        abort(); /* a few KB; the op has no error path, like every CPU op */
    for (int64_t p = 0; p < n_pairs; p++)
        start[ids[p] + 1]++;
    for (int e = 0; e < n_experts; e++)
        start[e + 1] += start[e];
    int64_t *fill = malloc((size_t)n_experts * sizeof *fill);
    if (!fill)
        abort();
    memcpy(fill, start, (size_t)n_experts * sizeof *fill);
    for (int64_t p = 0; p < n_pairs; p++) {
        int64_t pos = fill[ids[p]]++;
        order[pos] = p;
        where[p] = pos;
    }
    free(fill);
    float *gate = scratch, *up = scratch + n_pairs * inter, *out = scratch + 2 * n_pairs * inter;
    for (int e = 0; e < n_experts; e++) {
        int64_t p0 = start[e], cnt = start[e + 1] - start[e];
        if (cnt == 0)
            continue;
        float *xe = out + p0 * hidden;
        for (int64_t i = 0; i < cnt; i++)
            memcpy(xe + i * hidden, x + (order[p0 + i] / top_k) * hidden,
                   (size_t)hidden * sizeof(float));
        const struct weight_matrix *gu[2] = {&ex->gate[e], &ex->up[e]};
        const float *no_bias[2] = {NULL, NULL};
        float *gu_out[2] = {gate + p0 * inter, up + p0 * inter};
        be->ops->matmul_group(be, xe, cnt, 2, gu, no_bias, gu_out);
        be->ops->silu_mul(be, gate + p0 * inter, up + p0 * inter, gate + p0 * inter, cnt * inter);
        /* the gathered x of these pairs is read: the expert's outputs take its place */
        be->ops->matmul(be, gate + p0 * inter, cnt, &ex->down[e], NULL, xe);
    }
    for (int64_t r = 0; r < n_rows; r++) {
        float *yr = y + r * hidden;
        memset(yr, 0, (size_t)hidden * sizeof(float));
        /* ascending expert id: the order of the row's pairs by position */
        int32_t done = -1;
        for (int k = 0; k < top_k; k++) {
            int best = -1;
            for (int j = 0; j < top_k; j++) {
                int32_t id = ids[r * top_k + j];
                if (id > done && (best < 0 || id < ids[r * top_k + best]))
                    best = j;
            }
            done = ids[r * top_k + best];
            const float *o = out + where[r * top_k + best] * hidden;
            float w = weights[r * top_k + best];
            for (int64_t i = 0; i < hidden; i++)
                yr[i] += w * o[i];
        }
    }
    free(start);
    free(order);
    free(where);
}

void cpu_gated_add(struct backend *be, float *y, const float *x, const float *g, int64_t n_rows,
                   int64_t dim)
{
    cpu_settle(be);
    (void)be;
    for (int64_t r = 0; r < n_rows; r++) {
        float s = 1.0f / (1.0f + expf(-g[r]));
        for (int64_t i = 0; i < dim; i++)
            y[r * dim + i] += s * x[r * dim + i];
    }
}
