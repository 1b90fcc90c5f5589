/* backend/cpu/encdec.c — the CPU's encoder-decoder ops: LayerNorm, GELU, 1-D convolution and attention over contiguous K/V. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

static struct threadpool *pool_of(struct backend *be)
{
    return ((struct cpu_impl *)be->impl)->pool;
}

struct norm_job {
    const float *x, *w, *b;
    int64_t n_rows, dim;
    float eps;
    float *y;
};

/* One row at a time in a fixed order (double sums), so a row's bits never
 * depend on the rows beside it. */
static void layer_norm_rows(void *ctx, int ith, int nth)
{
    struct norm_job *j = ctx;
    long begin, end;
    threadpool_split(j->n_rows, ith, nth, 1, &begin, &end);
    for (long r = begin; r < end; r++) {
        const float *x = j->x + r * j->dim;
        float *y = j->y + r * j->dim;
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < j->dim; i++)
            sum += x[i];
        double mean = sum / (double)j->dim;
        for (int64_t i = 0; i < j->dim; i++) {
            double d = x[i] - mean;
            sq += d * d;
        }
        float inv = (float)(1.0 / sqrt(sq / (double)j->dim + j->eps));
        float m = (float)mean;
        for (int64_t i = 0; i < j->dim; i++)
            y[i] = (x[i] - m) * inv * j->w[i] + (j->b ? j->b[i] : 0.0f);
    }
}

void cpu_layer_norm(struct backend *be, const float *x, const float *weight, const float *bias,
                    int64_t n_rows, int64_t dim, float eps, float *y)
{
    cpu_settle(be);
    struct norm_job job = {x, weight, bias, n_rows, dim, eps, y};
    if (n_rows < 8)
        layer_norm_rows(&job, 0, 1);
    else
        threadpool_run(pool_of(be), layer_norm_rows, &job);
}

struct gelu_job {
    float *x;
    int64_t n;
};

static void gelu_range(void *ctx, int ith, int nth)
{
    struct gelu_job *j = ctx;
    long begin, end;
    threadpool_split(j->n, ith, nth, 64, &begin, &end);
    for (long i = begin; i < end; i++)
        j->x[i] = 0.5f * j->x[i] * (1.0f + erff(j->x[i] * (float)M_SQRT1_2));
}

void cpu_gelu(struct backend *be, float *x, int64_t n)
{
    cpu_settle(be);
    struct gelu_job job = {x, n};
    if (n < 16384)
        gelu_range(&job, 0, 1);
    else
        threadpool_run(pool_of(be), gelu_range, &job);
}

/* im2col into a scratch matrix, then the backend's matmul: row t of the
 * scratch is the (in, kernel) window ending the same way the weight's row does. */
void cpu_conv1d(struct backend *be, const float *x, int64_t n_in, int64_t c_in,
                const struct weight_matrix *w, const float *bias, int kernel, int stride, int pad,
                float *y)
{
    cpu_settle(be);
    int64_t n_out = (n_in + 2 * pad - kernel) / stride + 1, cols = c_in * kernel;
    if (n_out <= 0)
        return;
    float *col = malloc((size_t)n_out * (size_t)cols * sizeof *col);
    if (!col)
        abort(); /* scratch of a few MB; the op has no error path, like every CPU op */
    for (int64_t t = 0; t < n_out; t++) {
        float *row = col + t * cols;
        for (int j = 0; j < kernel; j++) {
            int64_t src = t * stride + j - pad;
            for (int64_t c = 0; c < c_in; c++)
                row[c * kernel + j] = src >= 0 && src < n_in ? x[src * c_in + c] : 0.0f;
        }
    }
    be->ops->matmul(be, col, n_out, w, bias, y);
    free(col);
}

struct dense_job {
    const float *q, *k, *v;
    int64_t n_q, n_kv, kv_stride, causal;
    int n_heads, head_dim;
    float scale;
    float *out;
};

/* Each (query, head) pair alone, its sums in key order, so a row's result
 * never depends on the other rows of the call. */
static void dense_pairs(void *ctx, int ith, int nth)
{
    struct dense_job *j = ctx;
    long begin, end;
    threadpool_split(j->n_q * j->n_heads, ith, nth, 1, &begin, &end);
    float *score = malloc((size_t)(j->n_kv ? j->n_kv : 1) * sizeof *score);
    if (!score)
        abort();
    int64_t qd = (int64_t)j->n_heads * j->head_dim;
    for (long p = begin; p < end; p++) {
        int64_t i = p / j->n_heads;
        int h = (int)(p % j->n_heads);
        int64_t n = j->n_kv;
        if (j->causal >= 0 && j->causal + i + 1 < n)
            n = j->causal + i + 1;
        const float *q = j->q + i * qd + (int64_t)h * j->head_dim;
        float *o = j->out + i * qd + (int64_t)h * j->head_dim;
        float mx = -INFINITY;
        for (int64_t r = 0; r < n; r++) {
            const float *k = j->k + r * j->kv_stride + (int64_t)h * j->head_dim;
            float s = 0;
            for (int d = 0; d < j->head_dim; d++)
                s += q[d] * k[d];
            score[r] = s * j->scale;
            if (score[r] > mx)
                mx = score[r];
        }
        float sum = 0;
        for (int64_t r = 0; r < n; r++) {
            score[r] = expf(score[r] - mx);
            sum += score[r];
        }
        float inv = sum > 0 ? 1.0f / sum : 0.0f;
        for (int d = 0; d < j->head_dim; d++)
            o[d] = 0;
        for (int64_t r = 0; r < n; r++) {
            const float *v = j->v + r * j->kv_stride + (int64_t)h * j->head_dim;
            float a = score[r] * inv;
            for (int d = 0; d < j->head_dim; d++)
                o[d] += a * v[d];
        }
    }
    free(score);
}

void cpu_attention_dense(struct backend *be, const float *q, int64_t n_q, const float *k,
                         const float *v, int64_t n_kv, int64_t kv_stride, int n_heads,
                         int head_dim, float scale, int64_t causal, float *out)
{
    cpu_settle(be);
    /* FAST mode: blocks of queries against blocks of keys (EXACT keeps each row's sums in
     * key order, independent of the other rows) */
    if (cpu_attention_dense_tiled(be, q, n_q, k, v, n_kv, kv_stride, n_heads, head_dim, scale,
                                  causal, out))
        return;
    struct dense_job job = {q, k, v, n_q, n_kv, kv_stride, causal, n_heads, head_dim, scale, out};
    if (n_q * n_heads < 4)
        dense_pairs(&job, 0, 1);
    else
        threadpool_run(pool_of(be), dense_pairs, &job);
}

void cpu_scatter_rows(struct backend *be, const float *src, int64_t n_rows, int64_t cols,
                      const int32_t *rows, float *dst)
{
    cpu_settle(be);
    (void)be;
    for (int64_t r = 0; r < n_rows; r++)
        memcpy(dst + (int64_t)rows[r] * cols, src + r * cols, (size_t)cols * sizeof *src);
}
