/* backend/cpu/matmul.c — matmul dispatch: picks GEMV or GEMM per ISA level, splits the work over threads; the scalar reference path. */
#include "backend/cpu/matmul.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/qmatmul.h"
#include "base/bf16.h"
#include "base/cpu.h"
#include "base/panels.h"
#include "base/threadpool.h"

/* Threads split GEMV outputs in multiples of 16 floats so no two threads
 * write the same 64-byte line of y. */
#define GEMV_ROW_ALIGN 16

struct mm_thread_scratch {
    void *a; /* owned; packed x block, 64-byte aligned */
    void *b; /* owned; packed W panel, 64-byte aligned */
};

struct cpu_matmul {
    struct threadpool *pool; /* borrowed */
    int n_threads;
    enum cpu_matmul_level level;
    struct mm_thread_scratch *scratch; /* owned; n_threads */
    void *xbuf;                        /* owned; x prepared for a FAST-mode GEMV */
    size_t xbuf_bytes;
    struct qmm_scratch qmm;            /* owned; x as int8 blocks for quantized weights */
};

/* One cpu_matmul_run call, as every thread sees it. */
struct mm_job {
    struct cpu_matmul *mm;
    const struct mm_gemv *gemv; /* one of gemv / gemm is set; neither: scalar */
    const struct mm_gemm *gemm;
    const void *x;              /* f32, or what gemv->prepare_x made */
    int64_t T, K, N;
    const void *w;
    enum dtype dtype;
    const float *bias;
    float *y;
    bool round_bf16;            /* FAST mode: x still needs rounding (GEMM, scalar) */
};

static const struct mm_gemm *const all_gemms[] = {
    &cpu_mm_gemm_avx2, &cpu_mm_gemm_avx512, &cpu_mm_gemm_avx512bf16, &cpu_mm_gemm_amx,
};

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* ---- levels ------------------------------------------------------------ */

enum cpu_matmul_level cpu_matmul_level_of(const struct cpu_features *f)
{
    bool avx512 = f->avx512f && f->avx512bw && f->avx512vl;
    if (avx512 && f->avx512_bf16 && f->amx_usable)
        return CPU_MATMUL_AMX;
    if (avx512 && f->avx512_bf16)
        return CPU_MATMUL_AVX512BF16;
    if (avx512)
        return CPU_MATMUL_AVX512;
    if (f->avx2 && f->fma && f->f16c)
        return CPU_MATMUL_AVX2;
    return CPU_MATMUL_SCALAR;
}

enum cpu_matmul_level cpu_matmul_detect_level(void) { return cpu_matmul_level_of(cpu_features()); }

const char *cpu_matmul_level_name(enum cpu_matmul_level level)
{
    static const char *const names[CPU_MATMUL_N_LEVELS] = {"scalar", "avx2", "avx512",
                                                            "avx512bf16", "amx"};
    return (unsigned)level < CPU_MATMUL_N_LEVELS ? names[level] : "unknown";
}

int cpu_matmul_set_level(struct cpu_matmul *mm, enum cpu_matmul_level level, struct err *err)
{
    if ((unsigned)level >= CPU_MATMUL_N_LEVELS)
        return err_set(err, INFERD_EINVAL, "matmul level %d does not exist", (int)level);
    enum cpu_matmul_level best = cpu_matmul_detect_level();
    if (level > best)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "matmul level %s needs a CPU this one is not (best: %s)",
                       cpu_matmul_level_name(level), cpu_matmul_level_name(best));
    mm->level = level;
    return 0;
}

enum cpu_matmul_level cpu_matmul_get_level(const struct cpu_matmul *mm) { return mm->level; }

/* ---- context ----------------------------------------------------------- */

void cpu_matmul_free(struct cpu_matmul *mm)
{
    if (!mm)
        return;
    if (mm->scratch) {
        for (int i = 0; i < mm->n_threads; i++) {
            free(mm->scratch[i].a);
            free(mm->scratch[i].b);
        }
        free(mm->scratch);
    }
    free(mm->xbuf);
    cpu_qmm_scratch_free(&mm->qmm);
    free(mm);
}

int cpu_matmul_create(struct threadpool *pool, struct cpu_matmul **out, struct err *err)
{
    struct cpu_matmul *mm = calloc(1, sizeof *mm);
    if (!mm)
        return err_set(err, INFERD_ENOMEM, "out of memory creating the matmul context");
    mm->pool = pool;
    mm->n_threads = threadpool_size(pool);
    mm->level = cpu_matmul_detect_level();

    /* Scratch fits every kernel set, so a context can switch levels freely. */
    size_t a_bytes = 0, b_bytes = 0;
    for (size_t i = 0; i < sizeof all_gemms / sizeof all_gemms[0]; i++) {
        const struct mm_gemm *g = all_gemms[i];
        size_t kpad = round_up((size_t)g->kc, (size_t)g->k_align);
        size_t a = round_up((size_t)g->mc, (size_t)g->mr) * kpad * g->a_elem;
        size_t b = (size_t)g->nr * kpad * g->b_elem;
        a_bytes = a > a_bytes ? a : a_bytes;
        b_bytes = b > b_bytes ? b : b_bytes;
    }
    mm->scratch = calloc((size_t)mm->n_threads, sizeof *mm->scratch);
    if (!mm->scratch) {
        cpu_matmul_free(mm);
        return err_set(err, INFERD_ENOMEM, "out of memory creating the matmul context");
    }
    for (int i = 0; i < mm->n_threads; i++) {
        mm->scratch[i].a = aligned_alloc(64, round_up(a_bytes, 64));
        mm->scratch[i].b = aligned_alloc(64, round_up(b_bytes, 64));
        if (!mm->scratch[i].a || !mm->scratch[i].b) {
            cpu_matmul_free(mm);
            return err_set(err, INFERD_ENOMEM, "out of memory for matmul packing scratch");
        }
    }
    *out = mm;
    return 0;
}

/* ---- scalar reference -------------------------------------------------- */

/* Element (r, c) of a K-column matrix. */
static float weight_at(const void *w, enum dtype dtype, int64_t K, int64_t r, int64_t c)
{
    int64_t i = r * K + c;
    switch (dtype) {
    case DTYPE_BF16_P32:
        return bf16_to_f32(((const uint16_t *)w)[panels_index(K, r, c)]);
    case DTYPE_BF16:
        return bf16_to_f32(((const uint16_t *)w)[i]);
    case DTYPE_F16:
        return f16_to_f32(((const uint16_t *)w)[i]);
    default:
        return ((const float *)w)[i];
    }
}

/* Four tokens at a time: four independent sums keep the adder busy, each
 * still summed strictly in column order. */
static void scalar_rows(const struct mm_job *j, int64_t r0, int64_t r1)
{
    const float *x = j->x;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t0 = 0; t0 < j->T; t0 += 4) {
            int nt = j->T - t0 < 4 ? (int)(j->T - t0) : 4;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int64_t c = 0; c < j->K; c++) {
                float wv = weight_at(j->w, j->dtype, j->K, r, c);
                for (int i = 0; i < nt; i++) {
                    float xv = x[(t0 + i) * j->K + c];
                    if (j->round_bf16)
                        xv = bf16_to_f32(f32_to_bf16(xv));
                    acc[i] += xv * wv;
                }
            }
            for (int i = 0; i < nt; i++)
                j->y[(t0 + i) * j->N + r] = acc[i] + (j->bias ? j->bias[r] : 0.0f);
        }
    }
}

/* ---- threads ----------------------------------------------------------- */

/* Several GEMVs of one input (cpu_matmul_run_group): members[i] shares x,
 * T, K, dtype and kernel with the first and holds its own w, bias, y, N.
 * Weights in panels count whole panels of rows (each member's last one
 * padded), so every chunk starts a panel.
 * Threads take chunks of the members' concatenated rows through
 * threadpool_shares: each its own chunks first, the same ones step after
 * step (their weights stay in that core's caches), then the others' that are
 * left, so on a shared machine a thread that loses its core for a moment
 * delays the step by one chunk, not by half of it. A chunk is still long
 * enough (tens of KB of W) for the prefetchers. */
struct mm_group_job {
    struct mm_job members[CPU_MATMUL_MAX_GROUP];
    int n;
    int64_t total_rows;      /* the members' rows, each padded to row_align */
    int64_t row_align;       /* GEMV_ROW_ALIGN, or PANEL_ROWS for weights in panels */
    int64_t chunk_rows;      /* a multiple of row_align */
    struct threadpool_shares chunks;
};

#define GEMV_CHUNKS_PER_THREAD 8
#define GEMV_MIN_CHUNK_ROWS 32
/* Weights in panels: the panel GEMV multiplies up to 4 panels at once (more
 * sums in flight for 2-6 token rows); chunks of one panel left it 8 of them
 * at 4 rows. 3 panels still split a 384-row matrix in 4 chunks. */
#define GEMV_MIN_CHUNK_PANELS 3
/* A product of at most this many weight bytes (times the rows of x) runs on the calling
 * thread: waking the workers costs more than its work (a draft model's projections at
 * hidden 192). Each row's bits are the same whichever thread computes it. */
#ifndef GEMV_INLINE_BYTES
#define GEMV_INLINE_BYTES (128 * 1024)
#endif

static int64_t padded_rows(const struct mm_group_job *g, int64_t n)
{
    return (int64_t)round_up((size_t)n, (size_t)g->row_align);
}

static void group_rows(const struct mm_group_job *g, int64_t b, int64_t e)
{
    int64_t base = 0;
    for (int i = 0; i < g->n && b < e; i++) {
        const struct mm_job *j = &g->members[i];
        int64_t r0 = b - base, r1 = e - base;
        if (r0 < j->N && r1 > 0) {
            r0 = r0 < 0 ? 0 : r0;
            r1 = r1 > j->N ? j->N : r1;
            j->gemv->run(j->x, j->T, j->K, j->w, j->dtype, j->bias, j->y, j->N, r0, r1);
        }
        base += padded_rows(g, j->N);
    }
}

static void group_split_job(void *ctx, int ith, int nth)
{
    struct mm_group_job *g = ctx;
    (void)nth;
    for (long c; (c = threadpool_shares_next(&g->chunks, ith)) >= 0;) {
        int64_t b = c * g->chunk_rows;
        int64_t e = b + g->chunk_rows < g->total_rows ? b + g->chunk_rows : g->total_rows;
        group_rows(g, b, e);
    }
}

static void scalar_job(void *ctx, int ith, int nth)
{
    const struct mm_job *j = ctx;
    long r0, r1;
    threadpool_split((long)j->N, ith, nth, GEMV_ROW_ALIGN, &r0, &r1);
    if (r0 < r1)
        scalar_rows(j, r0, r1);
}

/* Where W's rows [n0, n0 + nr), columns [pc, pc + kc) begin: a row-major
 * row, or for weights in panels (n0 a multiple of 32) the block's first pair
 * in its panel. */
static const void *w_block(const struct mm_job *j, int64_t n0, int64_t pc)
{
    if (j->dtype == DTYPE_BF16_P32)
        return (const uint16_t *)j->w + 2 * (((uint64_t)(n0 / PANEL_ROWS) * (uint64_t)panels_pairs(j->K) +
                                               (uint64_t)(pc / 2)) * PANEL_ROWS);
    return (const char *)j->w + ((size_t)n0 * (size_t)j->K + (size_t)pc) * dtype_size(j->dtype);
}

/* The next W panel's rows are K-strided pieces of DRAM that the hardware
 * prefetchers cannot guess; packing them cold cost 10-15% of a GEMM on
 * Zen 3. So while the kernels work on this panel, its successor's cache
 * lines are prefetched a few per kernel call. */
struct prefetch_plan {
    const char *row;   /* the row being prefetched */
    size_t row_stride; /* bytes between rows */
    long rows_left;    /* rows after this one */
    long lines_per_row, line, per_step;
};

static void plan_next_panel(const struct mm_job *j, const struct mm_gemm *g, long n1, long ne,
                            int64_t pc, int k, int m, struct prefetch_plan *p)
{
    size_t esize = dtype_size(j->dtype);
    long rows = n1 < ne ? (ne - n1 < g->nr ? ne - n1 : g->nr) : 0;
    long steps = (m + g->mr - 1) / g->mr;
    if (j->dtype == DTYPE_BF16_P32 && rows > 0) { /* the next panel's K block: one stretch */
        p->row = w_block(j, n1, pc);
        p->row_stride = 0;
        p->rows_left = 0;
        p->lines_per_row = (long)(((size_t)(k + 1) / 2 * PANEL_ROWS * 4 + 63) / 64);
        p->line = 0;
        p->per_step = (p->lines_per_row + steps - 1) / steps;
        return;
    }
    p->row = (const char *)j->w + ((size_t)n1 * (size_t)j->K + (size_t)pc) * esize;
    p->row_stride = (size_t)j->K * esize;
    p->rows_left = rows - 1;
    p->lines_per_row = (long)(((size_t)k * esize + 63) / 64);
    p->line = rows > 0 ? 0 : p->lines_per_row;
    p->per_step = (rows * p->lines_per_row + steps - 1) / steps;
}

static void prefetch_step(struct prefetch_plan *p)
{
    for (long q = 0; q < p->per_step; q++) {
        if (p->line == p->lines_per_row) {
            if (p->rows_left <= 0)
                return;
            p->rows_left--;
            p->row += p->row_stride;
            p->line = 0;
        }
        __builtin_prefetch(p->row + (size_t)p->line++ * 64);
    }
}

/* The next kernel call's tile of y (read and written): with the pc loop
 * outside the N sweep, y is far out of cache each time a tile comes round. */
static void prefetch_c_tile(const struct mm_job *j, long t, long te, long n0, int mr, int nr)
{
    for (int i = 0; i < mr && t + i < te; i++) {
        const float *row = j->y + (t + i) * j->N + n0;
        for (int c = 0; c < nr; c += 16)
            __builtin_prefetch(row + c, 1);
        __builtin_prefetch(row + nr - 1, 1);
    }
}

/* A thread's rectangle of y: whole nr-wide output panels when there are
 * enough of them to go round (each thread then streams its own part of W
 * once), else whole mr-tall token panels (few outputs, a long prompt). */
static void gemm_job(void *ctx, int ith, int nth)
{
    const struct mm_job *j = ctx;
    const struct mm_gemm *g = j->gemm;
    struct mm_thread_scratch *s = &j->mm->scratch[ith];
    long n_panels = (long)((j->N + g->nr - 1) / g->nr);
    long t_panels = (long)((j->T + g->mr - 1) / g->mr);
    long nb = 0, ne = (long)j->N, tb = 0, te = (long)j->T;
    if (n_panels >= nth || n_panels >= t_panels) {
        threadpool_split(n_panels, ith, nth, 1, &nb, &ne);
        nb *= g->nr;
        ne = ne * g->nr < j->N ? ne * g->nr : (long)j->N;
    } else {
        threadpool_split(t_panels, ith, nth, 1, &tb, &te);
        tb *= g->mr;
        te = te * g->mr < j->T ? te * g->mr : (long)j->T;
    }
    if (nb >= ne || tb >= te)
        return;

    /* Token chunks of equal size (in whole panels), so a prompt just over
     * mc does not leave a sliver of a chunk that repacks all of W. */
    long m_total = te - tb;
    long n_chunks = (m_total + g->mc - 1) / g->mc;
    long chunk = (long)round_up((size_t)((m_total + n_chunks - 1) / n_chunks), (size_t)g->mr);
    const float *x = j->x;

    if (g->thread_begin)
        g->thread_begin();
    for (long tc = tb; tc < te; tc += chunk) {
        int m = (int)(te - tc < chunk ? te - tc : chunk);
        for (int64_t pc = 0; pc < j->K; pc += g->kc) {
            int k = (int)(j->K - pc < g->kc ? j->K - pc : g->kc);
            size_t kpad = round_up((size_t)k, (size_t)g->k_align);
            size_t panel_bytes = (size_t)g->mr * kpad * g->a_elem;
            g->pack_x(x + tc * j->K + pc, j->K, m, k, j->round_bf16, s->a);
            for (long n0 = nb; n0 < ne; n0 += g->nr) {
                int n = (int)(ne - n0 < g->nr ? ne - n0 : g->nr);
                g->pack_w(w_block(j, n0, pc), j->dtype, j->K, n, k, s->b);
                struct prefetch_plan next;
                plan_next_panel(j, g, n0 + g->nr, ne, pc, k, m, &next);
                for (int i = 0; i < m; i += g->mr) {
                    prefetch_step(&next);
                    prefetch_c_tile(j, tc + i + g->mr, te, n0, g->mr, g->nr);
                    g->kernel(m - i < g->mr ? m - i : g->mr, n, k,
                              (const char *)s->a + (size_t)(i / g->mr) * panel_bytes, s->b,
                              j->y + (tc + i) * j->N + n0, j->N, j->bias ? j->bias + n0 : NULL,
                              pc == 0);
                }
            }
        }
    }
    if (g->thread_end)
        g->thread_end();
}

/* ---- dispatch ---------------------------------------------------------- */

/* The kernels for this call; both NULL means the scalar path. Vector kernels
 * take F32 and BF16 weights; bf16 dot-product hardware is only used where it
 * computes exactly what FAST mode promises (bf16 weights, rounded x). EXACT
 * mode's GEMV sums in its GEMM's order, so a row's bits do not depend on T. */
static void choose_kernels(enum cpu_matmul_level level, enum compute_mode mode, enum dtype dtype,
                           int64_t T, const struct mm_gemv **gemv, const struct mm_gemm **gemm)
{
    *gemv = NULL;
    *gemm = NULL;
    if (dtype == DTYPE_BF16_P32) { /* packed for these kernels; elsewhere the scalar path */
        if (mode == COMPUTE_FAST && level >= CPU_MATMUL_AVX512BF16) {
            if (T <= cpu_mm_gemv_avx512bf16_panels.max_t)
                *gemv = &cpu_mm_gemv_avx512bf16_panels;
            else
                *gemm = &cpu_mm_gemm_avx512bf16;
        }
        return;
    }
    if (level == CPU_MATMUL_SCALAR || (dtype != DTYPE_F32 && dtype != DTYPE_BF16))
        return;
    bool bf16_dot = mode == COMPUTE_FAST && dtype == DTYPE_BF16 && level >= CPU_MATMUL_AVX512BF16;
    const struct mm_gemv *v;
    const struct mm_gemm *m;
    if (level == CPU_MATMUL_AVX2) {
        v = mode == COMPUTE_EXACT ? &cpu_mm_gemv_exact_avx2 : &cpu_mm_gemv_avx2;
        m = &cpu_mm_gemm_avx2;
    } else if (mode == COMPUTE_EXACT) {
        v = &cpu_mm_gemv_exact_avx512;
        m = &cpu_mm_gemm_avx512;
    } else if (bf16_dot) {
        v = &cpu_mm_gemv_avx512bf16;
        /* AMX works on 32 tokens at a time, but even mostly zero padding it
         * beat the vdpbf16ps kernel at every T past GEMV on Sapphire Rapids
         * (16 threads, K=1024 N=3072: 130 us at T=16 against 180-230 us at
         * T=10-15). */
        /* Below AMX, prompts go to the vdpbf16ps GEMM where the processor has
         * no AMX at all (Zen 4/5: twice the f32 FMA's flops), else to the f32
         * AVX-512 kernel (it rounds x to bf16 as it packs): on Sapphire
         * Rapids capped below AMX the vdpbf16ps GEMM measured half its speed
         * (2 threads, Qwen3-0.6B prefill: 88 vs 183 tok/s). */
        m = level == CPU_MATMUL_AMX ? &cpu_mm_gemm_amx
            : cpu_features()->amx_bf16 ? &cpu_mm_gemm_avx512
                                       : &cpu_mm_gemm_avx512bf16;
    } else {
        v = &cpu_mm_gemv_avx512;
        m = &cpu_mm_gemm_avx512;
    }
    if (T <= v->max_t)
        *gemv = v;
    else
        *gemm = m;
}

/* Room for a GEMV's prepared x; false when memory is short (the caller then
 * takes the scalar path, which rounds as it goes). */
static bool reserve_xbuf(struct cpu_matmul *mm, size_t bytes)
{
    if (bytes <= mm->xbuf_bytes)
        return true;
    void *p = aligned_alloc(64, round_up(bytes, 64));
    if (!p)
        return false;
    free(mm->xbuf);
    mm->xbuf = p;
    mm->xbuf_bytes = round_up(bytes, 64);
    return true;
}

/* FAST mode's prepared x: thread ith converts its share of the token rows, as a loop the
 * pool holds for the GEMV's job (threadpool_hold). */
struct prepare_x_job {
    void (*prepare_x)(const float *x, int64_t n, void *dst);
    const float *x;
    int64_t T, K;
    size_t elem; /* bytes of a prepared element */
    void *xbuf;
};

static void prepare_x_rows(void *ctx, int ith, int nth)
{
    const struct prepare_x_job *j = ctx;
    long begin, end;
    threadpool_split((long)j->T, ith, nth, 1, &begin, &end);
    if (begin < end)
        j->prepare_x(j->x + begin * j->K, (end - begin) * j->K,
                     (char *)j->xbuf + (size_t)(begin * j->K) * j->elem);
}

/* The GEMV path of one or more matrices sharing x; false (nothing done)
 * when FAST mode's prepared x does not fit in memory. */
static bool run_gemv_group(struct cpu_matmul *mm, enum compute_mode mode, const struct mm_gemv *gemv,
                           const float *x, int64_t T, int n, const struct weight_matrix *const *w,
                           const float *const *bias, float *const *y)
{
    const void *xv = x;
    struct prepare_x_job prep = {gemv->prepare_x, x, T, w[0]->cols, gemv->x_bf16 ? 2 : 4, NULL};
    if (mode == COMPUTE_FAST) {
        if (!reserve_xbuf(mm, (size_t)T * (size_t)w[0]->cols * prep.elem))
            return false;
        prep.xbuf = mm->xbuf;
        xv = mm->xbuf;
    }
    struct mm_group_job job = {
        .n = n, .row_align = w[0]->dtype == DTYPE_BF16_P32 ? PANEL_ROWS : GEMV_ROW_ALIGN};
    for (int i = 0; i < n; i++) {
        job.members[i] = (struct mm_job){
            .mm = mm, .gemv = gemv, .x = xv, .T = T, .K = w[i]->cols, .N = w[i]->rows,
            .w = w[i]->data, .dtype = w[i]->dtype, .bias = bias[i], .y = y[i],
        };
        job.total_rows += padded_rows(&job, w[i]->rows);
    }
    int64_t chunk = job.total_rows / ((int64_t)mm->n_threads * GEMV_CHUNKS_PER_THREAD);
    int64_t min_chunk = w[0]->dtype == DTYPE_BF16_P32 ? GEMV_MIN_CHUNK_PANELS * PANEL_ROWS
                                                      : GEMV_MIN_CHUNK_ROWS;
    chunk = chunk < min_chunk ? min_chunk : chunk;
    job.chunk_rows = (int64_t)round_up((size_t)chunk, (size_t)job.row_align);
    long n_chunks = (long)((job.total_rows + job.chunk_rows - 1) / job.chunk_rows);
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += (size_t)w[i]->rows * (size_t)w[i]->cols * dtype_size(w[i]->dtype);
    /* a small product on this thread: the same rows in the same chunks */
    bool inline_job = bytes * (size_t)T <= GEMV_INLINE_BYTES;
    threadpool_shares_init(&job.chunks, n_chunks, inline_job ? 1 : mm->n_threads);
    if (inline_job) {
        threadpool_flush(mm->pool, true);
        if (prep.xbuf)
            prepare_x_rows(&prep, 0, 1);
        group_split_job(&job, 0, 1);
    } else {
        /* x is prepared, after whatever else the pool holds, in the GEMV's own job */
        if (prep.xbuf)
            threadpool_hold(mm->pool, prepare_x_rows, &prep, sizeof prep, (long)T);
        threadpool_run(mm->pool, group_split_job, &job);
    }
    return true;
}

void cpu_matmul_run(struct cpu_matmul *mm, enum compute_mode mode, const float *x, int64_t T,
                    const struct weight_matrix *w, const float *bias, float *y)
{
    int64_t K = w->cols, N = w->rows;
    if (T <= 0 || N <= 0)
        return;
    if (dtype_is_block(w->dtype) || K <= 0) /* paths that read or write before a job */
        threadpool_flush(mm->pool, false);
    if (dtype_is_block(w->dtype) && K > 0) {
        cpu_qmm_run(mm->pool, cpu_qmm_kernels_for(mm->level), cpu_qgemm_kernel_for(mm->level),
                    mode, &mm->qmm, x, T, 1, &w, &bias, &y);
        return;
    }
    if (K <= 0) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < N; r++)
                y[t * N + r] = bias ? bias[r] : 0.0f;
        return;
    }
    struct mm_job job = {
        .mm = mm, .x = x, .T = T, .K = K, .N = N, .w = w->data, .dtype = w->dtype,
        .bias = bias, .y = y, .round_bf16 = mode == COMPUTE_FAST,
    };
    choose_kernels(mm->level, mode, w->dtype, T, &job.gemv, &job.gemm);
    if (job.gemv && run_gemv_group(mm, mode, job.gemv, x, T, 1, &w, &bias, &y))
        return;
    job.gemv = NULL; /* out of memory for FAST mode's x: the scalar path rounds as it goes */
    threadpool_run(mm->pool, job.gemm ? gemm_job : scalar_job, &job);
}

void cpu_matmul_run_group(struct cpu_matmul *mm, enum compute_mode mode, const float *x, int64_t T,
                          int n, const struct weight_matrix *const *w, const float *const *bias,
                          float *const *y)
{
    const struct mm_gemv *gemv = NULL;
    const struct mm_gemm *gemm = NULL;
    bool groupable = n >= 1 && n <= CPU_MATMUL_MAX_GROUP && T > 0 && w[0]->cols > 0;
    for (int i = 1; groupable && i < n; i++)
        groupable = w[i]->cols == w[0]->cols && w[i]->dtype == w[0]->dtype;
    if (groupable && dtype_is_block(w[0]->dtype)) {
        threadpool_flush(mm->pool, false);
        cpu_qmm_run(mm->pool, cpu_qmm_kernels_for(mm->level), cpu_qgemm_kernel_for(mm->level),
                    mode, &mm->qmm, x, T, n, w, bias, y);
        return;
    }
    if (groupable)
        choose_kernels(mm->level, mode, w[0]->dtype, T, &gemv, &gemm);
    if (gemv && run_gemv_group(mm, mode, gemv, x, T, n, w, bias, y))
        return;
    for (int i = 0; i < n; i++)
        cpu_matmul_run(mm, mode, x, T, w[i], bias[i], y[i]);
}
