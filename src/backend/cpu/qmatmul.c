/* backend/cpu/qmatmul.c — block-quantized matmul: x quantized to int8 blocks, the scalar reference kernels, the generic dequantizing path, and the threaded driver. */
#include "backend/cpu/qmatmul.h"

#include <math.h>
#include <stdlib.h>

#include "base/cpu.h"
#include "base/quant.h"
#include "base/threadpool.h"

/* ---- activations ------------------------------------------------------- */

void cpu_qmm_quantize_x(const float *x, int64_t n, struct qmm_act *out)
{
    for (int64_t b = 0; b < n / QMM_ACT_ELEMS; b++, x += QMM_ACT_ELEMS) {
        float amax = 0.0f;
        for (int j = 0; j < QMM_ACT_ELEMS; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QMM_ACT_ELEMS; j++) {
            int q = (int)rintf(x[j] * id);
            out[b].q[j] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].s = d * (float)sum;
    }
}

void cpu_qmm_quantize_x_k(const float *x, int64_t n, struct qmm_act_k *out)
{
    for (int64_t b = 0; b < n / QMM_ACT_K_ELEMS; b++, x += QMM_ACT_K_ELEMS) {
        float bmax[8], amax = 0.0f;
        for (int c = 0; c < 8; c++) {
            bmax[c] = 0.0f;
            for (int j = 0; j < 32; j++)
                bmax[c] = fmaxf(bmax[c], fabsf(x[32 * c + j]));
            amax = fmaxf(amax, bmax[c]);
        }
        float d = amax / (127.0f * 16.0f), inv = amax > 0.0f ? 16.0f / amax : 0.0f;
        for (int c = 0; c < 8; c++) {
            int m = qmm_act_k_multiplier(bmax[c], inv);
            float dm = d * (float)m, id = dm > 0.0f ? 1.0f / dm : 0.0f;
            for (int g = 2 * c; g < 2 * c + 2; g++) {
                int sum = 0;
                for (int j = 16 * g; j < 16 * g + 16; j++) {
                    int q = (int)rintf(x[j] * id);
                    out[b].q[j] = (int8_t)q;
                    sum += q;
                }
                out[b].bsums[g] = (int16_t)(m * sum);
            }
            out[b].m[c] = (uint8_t)m;
        }
        out[b].d = d;
    }
}

static void quantize_x_ref(const float *x, int64_t n, void *out)
{
    cpu_qmm_quantize_x(x, n, out);
}

static void quantize_x_k_ref(const float *x, int64_t n, void *out)
{
    cpu_qmm_quantize_x_k(x, n, out);
}

/* ---- scalar reference kernels ----------------------------------------- */

static void dot_q8_0(int64_t K, const void *w, const void *x, int64_t xs, int nt, float *out)
{
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const struct qmm_act *a = (const struct qmm_act *)x + t * xs;
        float acc = 0.0f;
        for (int64_t i = 0; i < K / 32; i++, b += 34, a++) {
            int sumi = 0;
            for (int j = 0; j < 32; j++)
                sumi += (int8_t)b[2 + j] * a->q[j];
            acc += (float)sumi * (qmm_half(b) * a->d);
        }
        out[t] = acc;
    }
}

static void dot_q4_0(int64_t K, const void *w, const void *x, int64_t xs, int nt, float *out)
{
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const struct qmm_act *a = (const struct qmm_act *)x + t * xs;
        float acc = 0.0f;
        for (int64_t i = 0; i < K / 32; i++, b += 18, a++) {
            int sumi = 0;
            for (int j = 0; j < 16; j++)
                sumi += ((b[2 + j] & 15) - 8) * a->q[j] + ((b[2 + j] >> 4) - 8) * a->q[j + 16];
            acc += (float)sumi * (qmm_half(b) * a->d);
        }
        out[t] = acc;
    }
}

/* Q4_1: x = d * q + m, so the block's dot is d * d_x * (q . q_x) + m * s_x. */
static void dot_q4_1(int64_t K, const void *w, const void *x, int64_t xs, int nt, float *out)
{
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const struct qmm_act *a = (const struct qmm_act *)x + t * xs;
        float acc = 0.0f, mins = 0.0f;
        for (int64_t i = 0; i < K / 32; i++, b += 20, a++) {
            int sumi = 0;
            for (int j = 0; j < 16; j++)
                sumi += (b[4 + j] & 15) * a->q[j] + (b[4 + j] >> 4) * a->q[j + 16];
            acc += (float)sumi * (qmm_half(b) * a->d);
            mins += qmm_half(b + 2) * a->s;
        }
        out[t] = acc + mins;
    }
}

/* Q4_K and Q5_K against one x super-block: sum over the 8 groups of scale *
 * (q . q_x) and of min * (the group's two block sums), both exact. */
static void k4_sums(const uint8_t *sm, const uint8_t *qs, const uint8_t *qh,
                    const struct qmm_act_k *a, int *sumi, int *summ)
{
    *sumi = *summ = 0;
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = qs + 32 * (j / 2);
        int dot = 0;
        for (int l = 0; l < 32; l++) {
            int v = j & 1 ? q[l] >> 4 : q[l] & 15;
            if (qh)
                v |= ((qh[l] >> j) & 1) << 4;
            dot += v * a->q[32 * j + l];
        }
        *sumi += sm[j] * a->m[j] * dot;
        *summ += sm[8 + j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
}

static void dot_k4(bool q5, int64_t K, const void *w, const void *x, int64_t xs, int nt,
                   float *out)
{
    size_t bytes = q5 ? 176 : 144;
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const struct qmm_act_k *a = (const struct qmm_act_k *)x + t * xs;
        float acc = 0.0f, mins = 0.0f;
        for (int64_t i = 0; i < K / 256; i++, b += bytes, a++) {
            uint8_t sm[16];
            int sumi, summ;
            qmm_scales_mins_k4(b + 4, sm);
            k4_sums(sm, q5 ? b + 48 : b + 16, q5 ? b + 16 : NULL, a, &sumi, &summ);
            acc += (float)sumi * (qmm_half(b) * a->d);
            mins += (float)summ * (qmm_half(b + 2) * a->d);
        }
        out[t] = acc - mins;
    }
}

static void dot_q4_k(int64_t K, const void *w, const void *x, int64_t xs, int nt, float *out)
{
    dot_k4(false, K, w, x, xs, nt, out);
}

static void dot_q5_k(int64_t K, const void *w, const void *x, int64_t xs, int nt, float *out)
{
    dot_k4(true, K, w, x, xs, nt, out);
}

/* Q6_K: codes 0..63 taken as they are, the offset of 32 off through the
 * block sums: sum over 16 groups of scale * (q . q_x - 32 * bsum). */
static void dot_q6_k(int64_t K, const void *w, const void *x, int64_t xs, int nt, float *out)
{
    for (int t = 0; t < nt; t++) {
        const uint8_t *b = w;
        const struct qmm_act_k *a = (const struct qmm_act_k *)x + t * xs;
        float acc = 0.0f;
        for (int64_t i = 0; i < K / 256; i++, b += 210, a++) {
            const int8_t *sc = (const int8_t *)(b + 192);
            int sumi = 0;
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                for (int g = 0; g < 4; g++) {
                    int s[2] = {0, 0};
                    for (int l = 0; l < 32; l++) {
                        int lo = g & 1 ? ql[l + 32] : ql[l];
                        int q = (g & 2 ? lo >> 4 : lo & 15) | ((qh[l] >> (2 * g)) & 3) << 4;
                        s[l / 16] += q * a->q[128 * h + 32 * g + l];
                    }
                    int gi = 8 * h + 2 * g;
                    int m = a->m[gi / 2];
                    sumi += sc[gi] * (m * s[0] - 32 * a->bsums[gi]) +
                            sc[gi + 1] * (m * s[1] - 32 * a->bsums[gi + 1]);
                }
            }
            acc += (float)sumi * (qmm_half(b + 208) * a->d);
        }
        out[t] = acc;
    }
}

const struct qmm_kernels cpu_qmm_scalar = {
    .dot = {[DTYPE_Q8_0] = dot_q8_0, [DTYPE_Q4_0] = dot_q4_0, [DTYPE_Q4_1] = dot_q4_1,
            [DTYPE_Q4_K] = dot_q4_k, [DTYPE_Q5_K] = dot_q5_k, [DTYPE_Q6_K] = dot_q6_k},
    .quantize_x = quantize_x_ref,
    .quantize_x_k = quantize_x_k_ref,
};

const struct qmm_kernels *cpu_qmm_kernels_for(enum cpu_matmul_level level)
{
    if (level >= CPU_MATMUL_AVX512 && cpu_features()->avx512_vnni)
        return &cpu_qmm_avx512;
    if (level >= CPU_MATMUL_AVX2)
        return &cpu_qmm_avx2;
    return &cpu_qmm_scalar;
}

/* ---- the generic path -------------------------------------------------- */

/* A type without int8 kernels: each block of the row dequantized on the
 * stack (never the whole matrix) and dotted with every token's f32 x, in
 * block order and within a block in column order, whatever nt. */
static void dot_generic(enum dtype dt, int64_t K, const void *w, const float *x, int nt,
                        float *out)
{
    int qk = dtype_block_elems(dt);
    size_t bytes = dtype_block_bytes(dt);
    float blk[256];
    float acc[QMM_MAX_T] = {0};
    for (int64_t i = 0; i < K / qk; i++) {
        quant_dequantize_row(dt, (const uint8_t *)w + (size_t)i * bytes, blk, qk);
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * K + i * qk;
            float s = 0.0f;
            for (int j = 0; j < qk; j++)
                s += blk[j] * xt[j];
            acc[t] += s;
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = acc[t];
}

/* ---- driver ------------------------------------------------------------ */

/* Threads take chunks of the members' concatenated rows through
 * threadpool_shares (as the dense GEMV does). Inside a chunk, tiles of rows
 * are swept by groups of QMM_MAX_T tokens, so a prompt reads each tile from
 * cache once per token group and DRAM once. */
#define QMM_CHUNKS_PER_THREAD 8
#define QMM_MIN_CHUNK_ROWS 16
#define QMM_TILE_ROWS 16

struct qmm_job {
    const struct qmm_kernels *k;
    const float *x;            /* T x K f32 (the generic path) */
    const void *xa;            /* T rows of x quantized (act_size bytes each), or NULL: generic */
    size_t act_size;           /* bytes of one struct qmm_act or struct qmm_act_k */
    int64_t xs;                /* activation blocks per row */
    int64_t T, K;
    enum dtype dtype;
    size_t row_bytes;
    struct {
        const uint8_t *w;
        int64_t N;
        const float *bias;
        float *y;
    } m[CPU_MATMUL_MAX_GROUP];
    int n;
    int64_t total_rows, chunk_rows;
    struct threadpool_shares chunks; /* each thread's chunks stay its own from step to step */
};

static void qmm_rows(const struct qmm_job *j, int i, int64_t r0, int64_t r1)
{
    qmm_dot_fn dot = j->xa ? j->k->dot[j->dtype] : NULL;
    int64_t xs = j->xs, N = j->m[i].N;
    float out[QMM_MAX_T];
    for (int64_t tr = r0; tr < r1; tr += QMM_TILE_ROWS) {
        int64_t te = tr + QMM_TILE_ROWS < r1 ? tr + QMM_TILE_ROWS : r1;
        for (int64_t t0 = 0; t0 < j->T; t0 += QMM_MAX_T) {
            int nt = j->T - t0 < QMM_MAX_T ? (int)(j->T - t0) : QMM_MAX_T;
            for (int64_t r = tr; r < te; r++) {
                const uint8_t *w = j->m[i].w + (size_t)r * j->row_bytes;
                if (dot)
                    dot(j->K, w, (const char *)j->xa + (size_t)(t0 * xs) * j->act_size, xs, nt,
                        out);
                else
                    dot_generic(j->dtype, j->K, w, j->x + t0 * j->K, nt, out);
                float b = j->m[i].bias ? j->m[i].bias[r] : 0.0f;
                for (int t = 0; t < nt; t++)
                    j->m[i].y[(t0 + t) * N + r] = out[t] + b;
            }
        }
    }
}

static void qmm_thread(void *ctx, int ith, int nth)
{
    struct qmm_job *j = ctx;
    (void)nth;
    for (long c; (c = threadpool_shares_next(&j->chunks, ith)) >= 0;) {
        int64_t b = c * j->chunk_rows;
        int64_t e = b + j->chunk_rows < j->total_rows ? b + j->chunk_rows : j->total_rows;
        int64_t base = 0;
        for (int i = 0; i < j->n && b < e; i++) {
            int64_t r0 = b - base, r1 = e - base;
            if (r0 < j->m[i].N && r1 > 0)
                qmm_rows(j, i, r0 < 0 ? 0 : r0, r1 > j->m[i].N ? j->m[i].N : r1);
            base += j->m[i].N;
        }
    }
}

void cpu_qmm_scratch_free(struct qmm_scratch *s)
{
    free(s->act);
    s->act = NULL;
    s->act_bytes = 0;
    cpu_qgemm_scratch_free(&s->gemm);
}

/* Room for n bytes of activations; false when memory is short. */
static bool reserve_act(struct qmm_scratch *s, size_t n)
{
    if (n <= s->act_bytes)
        return true;
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p)
        return false;
    free(s->act);
    s->act = p;
    s->act_bytes = n;
    return true;
}

/* Prompts quantize x on every thread, a slice of rows each. */
#define QMM_PARALLEL_QUANTIZE_T 16

struct qmm_quantize_job {
    qmm_quantize_fn fn;
    const float *x;
    void *out;
    int64_t T, K;
    size_t row_bytes;
};

static void qmm_quantize_thread(void *ctx, int ith, int nth)
{
    const struct qmm_quantize_job *q = ctx;
    int64_t t0 = q->T * ith / nth, t1 = q->T * (ith + 1) / nth;
    for (int64_t t = t0; t < t1; t++)
        q->fn(q->x + t * q->K, q->K, (char *)q->out + (size_t)t * q->row_bytes);
}

void cpu_qmm_run(struct threadpool *pool, const struct qmm_kernels *k, qgemm_fn gemm,
                 enum compute_mode mode, struct qmm_scratch *s, const float *x, int64_t T, int n,
                 const struct weight_matrix *const *w, const float *const *bias,
                 float *const *y)
{
    int64_t K = w[0]->cols;
    struct qmm_job job = {.k = k, .x = x, .T = T, .K = K, .dtype = w[0]->dtype, .n = n,
                          .row_bytes = (size_t)dtype_row_bytes(w[0]->dtype, (uint64_t)K)};
    for (int i = 0; i < n; i++) {
        job.m[i].w = w[i]->data;
        job.m[i].N = w[i]->rows;
        job.m[i].bias = bias[i];
        job.m[i].y = y[i];
        job.total_rows += w[i]->rows;
    }
    /* Out of memory for the int8 x, every type takes the generic path. */
    bool k_act = qmm_act_k_of(job.dtype);
    job.act_size = k_act ? sizeof(struct qmm_act_k) : sizeof(struct qmm_act);
    job.xs = K / (k_act ? QMM_ACT_K_ELEMS : QMM_ACT_ELEMS);
    size_t row_bytes = (size_t)job.xs * job.act_size;
    if (k->dot[job.dtype] && reserve_act(s, (size_t)T * row_bytes)) {
        struct qmm_quantize_job q = {.fn = k_act ? k->quantize_x_k : k->quantize_x, .x = x,
                                     .out = s->act, .T = T, .K = K, .row_bytes = row_bytes};
        if (T >= QMM_PARALLEL_QUANTIZE_T)
            threadpool_run(pool, qmm_quantize_thread, &q);
        else
            qmm_quantize_thread(&q, 0, 1);
        job.xa = s->act;
        if (mode == COMPUTE_FAST && T >= QGEMM_MIN_T &&
            cpu_qgemm_run(pool, gemm, &s->gemm, s->act, job.act_size, job.xs, T, n, w, bias, y))
            return;
    }
    int64_t chunk = job.total_rows / ((int64_t)threadpool_size(pool) * QMM_CHUNKS_PER_THREAD);
    chunk = chunk < QMM_MIN_CHUNK_ROWS ? QMM_MIN_CHUNK_ROWS : chunk;
    job.chunk_rows = (chunk + QMM_MIN_CHUNK_ROWS - 1) / QMM_MIN_CHUNK_ROWS * QMM_MIN_CHUNK_ROWS;
    long n_chunks = (long)((job.total_rows + job.chunk_rows - 1) / job.chunk_rows);
    threadpool_shares_init(&job.chunks, n_chunks, threadpool_size(pool));
    threadpool_run(pool, qmm_thread, &job);
}
