/* backend/cpu/qgemm.c — the prefill GEMM over block-quantized weights: unpacking blocks into int8 panels, x into token groups, the scalar reference kernel and the threaded driver. */
#include "backend/cpu/qgemm.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/qmatmul.h"
#include "base/cpu.h"
#include "base/threadpool.h"

/* ---- weights ----------------------------------------------------------- *
 * Why unpack per call rather than repack once at load: the loader borrows
 * the weights from the file's mapping, and a repacked copy (1 byte per
 * code plus 12 per block of 32) would add 1.4x the model in memory for
 * Q8_0 and 2.4x for Q4_K on top of it; the decode kernels read the file's
 * blocks anyway. Unpacking costs O(N * K) a call against O(N * K * T) of
 * dot products: a few percent from QGEMM_MIN_T on. */

bool cpu_qgemm_takes(enum dtype t)
{
    return t == DTYPE_Q8_0 || t == DTYPE_Q4_0 || t == DTYPE_Q4_1 || t == DTYPE_Q4_K ||
           t == DTYPE_Q5_K || t == DTYPE_Q6_K;
}

/* Elements per weight scale in the panel. */
static int blk_of(enum dtype t) { return t == DTYPE_Q6_K ? 16 : 32; }

static bool has_min(enum dtype t)
{
    return t == DTYPE_Q4_1 || t == DTYPE_Q4_K || t == DTYPE_Q5_K;
}

/* The largest |code| unpack_row can write for type t, whatever the file's
 * bytes. */
static int code_max_of(enum dtype t)
{
    switch (t) {
    case DTYPE_Q4_0: return 8;   /* 0..15 - 8 */
    case DTYPE_Q4_1:
    case DTYPE_Q4_K: return 15;  /* 0..15 */
    case DTYPE_Q5_K: return 31;  /* 0..31 */
    case DTYPE_Q6_K: return 32;  /* 0..63 - 32 */
    default: return 128;         /* Q8_0's bytes */
    }
}

/* One panel's writable arrays. */
struct panel {
    int8_t *q;
    int32_t *corr;
    float *scale, *min;
};

/* corr of each block of blk (32 or 16) codes of a row of K at q, into
 * corr[b * QGEMM_ROWS]. Each block's sum in a horizontal reduction of its
 * own cost as much as the kernel's dot products at T = 128; here vpsadbw
 * (on the codes + 128, as unsigned bytes) sums 8 bytes a lane and one
 * reduction serves two (or four) blocks. */
static void corr_row(const int8_t *q, int64_t K, int blk, int32_t *corr)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    int64_t c = 0;
    for (; c + 64 <= K; c += 64, q += 64) {
        __m256i a = _mm256_sad_epu8(
            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q), bias), zero);
        __m256i b = _mm256_sad_epu8(
            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 32)), bias), zero);
        /* lanes: a0+a1, b0+b1, a2+a3, b2+b3 */
        __m256i h = _mm256_add_epi64(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
        if (blk == 32) {
            __m128i t = _mm_add_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            corr[(c / 32) * QGEMM_ROWS] = (int32_t)(-128 * (_mm_cvtsi128_si64(t) - 32 * 128));
            corr[(c / 32 + 1) * QGEMM_ROWS] =
                (int32_t)(-128 * (_mm_extract_epi64(t, 1) - 32 * 128));
        } else {
            int64_t s[4] = {_mm256_extract_epi64(h, 0), _mm256_extract_epi64(h, 2),
                            _mm256_extract_epi64(h, 1), _mm256_extract_epi64(h, 3)};
            for (int i = 0; i < 4; i++)
                corr[(c / 16 + i) * QGEMM_ROWS] = (int32_t)(-128 * (s[i] - 16 * 128));
        }
    }
    for (; c < K; c += blk, q += blk) { /* a last block of 32 (K = 64 n + 32) */
        int32_t sum = 0;
        for (int j = 0; j < blk; j++)
            sum += q[j];
        corr[(c / blk) * QGEMM_ROWS] = -128 * sum;
    }
}

/* Row r of panel p from the row's blocks at src; meta index [b][r]. */
static void unpack_row(enum dtype t, const uint8_t *src, int64_t K, const struct panel *p, int r)
{
    int8_t *q = p->q + (size_t)r * (size_t)K;
    float *scale = p->scale + r, *min = p->min + r;
    switch (t) {
    case DTYPE_Q8_0:
        for (int64_t b = 0; b < K / 32; b++, src += 34, q += 32) {
            memcpy(q, src + 2, 32);
            scale[b * QGEMM_ROWS] = qmm_half(src);
        }
        break;
    case DTYPE_Q4_0:
    case DTYPE_Q4_1: {
        int off = t == DTYPE_Q4_0 ? 8 : 0, hdr = t == DTYPE_Q4_0 ? 2 : 4;
        for (int64_t b = 0; b < K / 32; b++, src += hdr + 16, q += 32) {
            for (int j = 0; j < 16; j++) {
                q[j] = (int8_t)((src[hdr + j] & 15) - off);
                q[j + 16] = (int8_t)((src[hdr + j] >> 4) - off);
            }
            scale[b * QGEMM_ROWS] = qmm_half(src);
            if (t == DTYPE_Q4_1)
                min[b * QGEMM_ROWS] = qmm_half(src + 2);
        }
        break;
    }
    case DTYPE_Q4_K:
    case DTYPE_Q5_K: {
        bool q5 = t == DTYPE_Q5_K;
        size_t bytes = q5 ? 176 : 144;
        for (int64_t sb = 0; sb < K / 256; sb++, src += bytes) {
            uint8_t sm[16];
            qmm_scales_mins_k4(src + 4, sm);
            float d = qmm_half(src), dmin = qmm_half(src + 2);
            const uint8_t *qs = q5 ? src + 48 : src + 16, *qh = src + 16;
            for (int j = 0; j < 8; j++, q += 32) {
                const uint8_t *c = qs + 32 * (j / 2);
                for (int l = 0; l < 32; l++) {
                    int v = j & 1 ? c[l] >> 4 : c[l] & 15;
                    if (q5)
                        v |= ((qh[l] >> j) & 1) << 4;
                    q[l] = (int8_t)v;
                }
                int64_t b = sb * 8 + j;
                scale[b * QGEMM_ROWS] = d * (float)sm[j];
                min[b * QGEMM_ROWS] = -dmin * (float)sm[8 + j];
            }
        }
        break;
    }
    case DTYPE_Q6_K:
        for (int64_t sb = 0; sb < K / 256; sb++, src += 210) {
            const int8_t *sc = (const int8_t *)(src + 192);
            float d = qmm_half(src + 208);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = src + 64 * h, *qh = src + 128 + 32 * h;
                for (int g = 0; g < 4; g++, q += 32) {
                    for (int l = 0; l < 32; l++) {
                        int lo = g & 1 ? ql[l + 32] : ql[l];
                        int v = (g & 2 ? lo >> 4 : lo & 15) | ((qh[l] >> (2 * g)) & 3) << 4;
                        q[l] = (int8_t)(v - 32);
                    }
                    for (int half = 0; half < 2; half++) {
                        int gi = 8 * h + 2 * g + half;
                        int64_t b = sb * 16 + gi;
                        scale[b * QGEMM_ROWS] = d * (float)sc[gi];
                    }
                }
            }
        }
        break;
    default:
        break;
    }
}

/* Bytes of one panel: codes, then corr, scale and min per block. */
static size_t panel_bytes(int64_t K)
{
    size_t nb = (size_t)(K / 16); /* the most blocks any type has */
    return (size_t)QGEMM_ROWS * (size_t)K + 3 * nb * QGEMM_ROWS * 4;
}

static struct panel panel_at(void *buf, int64_t K)
{
    size_t nb = (size_t)(K / 16);
    struct panel p = {.q = buf};
    p.corr = (int32_t *)((char *)buf + (size_t)QGEMM_ROWS * (size_t)K);
    p.scale = (float *)(p.corr + nb * QGEMM_ROWS);
    p.min = p.scale + nb * QGEMM_ROWS;
    return p;
}

/* Rows [r0, r0 + nr) of w (nr <= QGEMM_ROWS) into the panel at buf; the
 * rest of the panel zero. */
static void unpack_panel(enum dtype t, const uint8_t *w, size_t row_bytes, int64_t r0, int nr,
                         int64_t K, void *buf, struct qgemm_w *out)
{
    struct panel p = panel_at(buf, K);
    int blk = blk_of(t);
    size_t nb = (size_t)(K / blk);
    for (int r = 0; r < nr; r++) {
        unpack_row(t, w + (size_t)(r0 + r) * row_bytes, K, &p, r);
        corr_row(p.q + (size_t)r * (size_t)K, K, blk, p.corr + r);
    }
    if (nr < QGEMM_ROWS) {
        memset(p.q + (size_t)nr * (size_t)K, 0, (size_t)(QGEMM_ROWS - nr) * (size_t)K);
        for (size_t b = 0; b < nb; b++)
            for (int r = nr; r < QGEMM_ROWS; r++) {
                p.corr[b * QGEMM_ROWS + r] = 0;
                p.scale[b * QGEMM_ROWS + r] = p.min[b * QGEMM_ROWS + r] = 0.0f;
            }
    }
    *out = (struct qgemm_w){.q = p.q, .corr = p.corr, .scale = p.scale,
                            .min = has_min(t) ? p.min : NULL, .code_max = code_max_of(t)};
}

/* ---- x ----------------------------------------------------------------- */

static size_t x_group_bytes(int64_t K)
{
    return (size_t)K / 4 * 64 + 2 * (size_t)(K / 32) * QGEMM_TOKENS * 4;
}

static struct qgemm_x x_group_at(const void *base, int64_t K, int64_t g)
{
    const char *p = (const char *)base + (size_t)g * x_group_bytes(K);
    const float *d = (const float *)(p + (size_t)K / 4 * 64);
    return (struct qgemm_x){.q = (const uint8_t *)p, .d = d, .s = d + (K / 32) * QGEMM_TOKENS};
}

/* Tokens [t0, t0 + nt) of the quantized x rows into group g. */
static void pack_x_group(const void *xa, size_t act_size, int64_t xs, bool k_act, int64_t t0,
                         int nt, int64_t K, void *base, int64_t g)
{
    struct qgemm_x gx = x_group_at(base, K, g);
    uint32_t *q = (uint32_t *)gx.q;
    float *d = (float *)gx.d, *s = (float *)gx.s;
    for (int t = 0; t < QGEMM_TOKENS; t++) {
        const char *row = t < nt ? (const char *)xa + (size_t)((t0 + t) * xs) * act_size : NULL;
        for (int64_t b = 0; b < K / 32; b++) {
            const int8_t *codes;
            float db, sb;
            if (t >= nt) {
                codes = NULL;
                db = sb = 0.0f;
            } else if (k_act) {
                const struct qmm_act_k *a = (const struct qmm_act_k *)row + b / 8;
                int c = (int)(b % 8);
                codes = a->q + 32 * c;
                db = a->d * (float)a->m[c];
                sb = a->d * (float)(a->bsums[2 * c] + a->bsums[2 * c + 1]);
            } else {
                const struct qmm_act *a = (const struct qmm_act *)row + b;
                codes = a->q;
                db = a->d;
                sb = a->s;
            }
            for (int k = 0; k < 8; k++) {
                uint32_t v = 0;
                if (codes)
                    memcpy(&v, codes + 4 * k, 4);
                q[(size_t)(b * 8 + k) * QGEMM_TOKENS + t] = v ^ 0x80808080u; /* + 128 */
            }
            d[b * QGEMM_TOKENS + t] = db;
            s[b * QGEMM_TOKENS + t] = sb;
        }
    }
}

/* ---- the scalar reference kernel -------------------------------------- *
 * The vector kernels' float steps written out (fmaf rounds once, as their
 * FMAs do), so every kernel's bits can be checked against this one. */

static void gemm_scalar(int64_t K, int blk, const struct qgemm_w *w, const struct qgemm_x *x,
                        float out[QGEMM_ROWS][QGEMM_TOKENS])
{
    memset(out, 0, sizeof(float) * QGEMM_ROWS * QGEMM_TOKENS);
    for (int64_t b = 0; b < K / blk; b++) {
        int64_t bx = b * blk / 32;
        for (int r = 0; r < QGEMM_ROWS; r++)
            for (int t = 0; t < QGEMM_TOKENS; t++) {
                int32_t sum = w->corr[b * QGEMM_ROWS + r];
                for (int64_t c = b * blk; c < (b + 1) * blk; c++)
                    sum += w->q[r * K + c] * x->q[(c / 4) * 64 + 4 * t + c % 4];
                float acc = fmaf((float)sum,
                                 x->d[bx * QGEMM_TOKENS + t] * w->scale[b * QGEMM_ROWS + r],
                                 out[r][t]);
                if (w->min)
                    acc = fmaf(x->s[bx * QGEMM_TOKENS + t], w->min[b * QGEMM_ROWS + r], acc);
                out[r][t] = acc;
            }
    }
}

const qgemm_fn cpu_qgemm_scalar = gemm_scalar;

qgemm_fn cpu_qgemm_kernel_for(enum cpu_matmul_level level)
{
    const struct cpu_features *f = cpu_features();
    if (level == CPU_MATMUL_AMX && f->amx_int8 && f->amx_usable)
        return cpu_qgemm_amx;
    if (level >= CPU_MATMUL_AVX512 && f->avx512_vnni)
        return cpu_qgemm_vnni;
    if (level == CPU_MATMUL_SCALAR)
        return cpu_qgemm_scalar;
    return f->avx_vnni ? cpu_qgemm_avxvnni : cpu_qgemm_avx2;
}

/* ---- driver ------------------------------------------------------------ */

/* Threads take chunks of QGEMM_CHUNK_ROWS rows (of the members'
 * concatenated rows) from a shared counter, unpack them into their panels
 * (in L2: 64 x K bytes), then sweep the step's token groups over them, so
 * each group's x (16 x K bytes) is read from L2 once per chunk and each
 * weight byte from DRAM once per call. */
#define QGEMM_CHUNK_ROWS 64
#define QGEMM_PANELS (QGEMM_CHUNK_ROWS / QGEMM_ROWS)

struct qgemm_job {
    qgemm_fn fn;
    struct qgemm_scratch *s;
    int64_t T, K, groups;
    enum dtype dtype;
    size_t row_bytes;
    struct {
        const uint8_t *w;
        int64_t N;
        const float *bias;
        float *y;
    } m[CPU_MATMUL_MAX_GROUP];
    int n;
    int64_t total_rows;
    _Atomic int64_t next_row;
    /* packing x */
    const void *xa;
    size_t act_size;
    int64_t xs;
    bool k_act;
};

/* The weight bytes of a chunk to come, prefetched a slice per token
 * group while this chunk computes: a chunk's rows are read once, cold, and
 * their short runs (64 rows of a member, a few KB each) leave the hardware
 * prefetchers no time to ramp up; unpacking them cold cost as much as
 * the dot products. */
struct prefetch {
    const char *p[2]; /* up to two members' runs (a chunk spans at most two) */
    size_t left[2];
    size_t per_step;  /* bytes per token group */
};

static void prefetch_plan(const struct qgemm_job *j, int64_t b, struct prefetch *pf)
{
    memset(pf, 0, sizeof *pf);
    if (b >= j->total_rows)
        return;
    int64_t e = b + QGEMM_CHUNK_ROWS < j->total_rows ? b + QGEMM_CHUNK_ROWS : j->total_rows;
    int64_t base = 0;
    int k = 0;
    size_t total = 0;
    for (int i = 0; i < j->n && k < 2; i++) {
        int64_t r0 = b - base, r1 = e - base;
        if (r0 < j->m[i].N && r1 > 0) {
            r0 = r0 < 0 ? 0 : r0;
            r1 = r1 > j->m[i].N ? j->m[i].N : r1;
            pf->p[k] = (const char *)j->m[i].w + (size_t)r0 * j->row_bytes;
            pf->left[k] = (size_t)(r1 - r0) * j->row_bytes;
            total += pf->left[k++];
        }
        base += j->m[i].N;
    }
    pf->per_step = (total / (size_t)j->groups + 63) / 64 * 64 + 64;
}

static void prefetch_step(struct prefetch *pf)
{
    size_t n = pf->per_step;
    for (int k = 0; k < 2 && n > 0; k++) {
        size_t m = pf->left[k] < n ? pf->left[k] : n;
        for (size_t o = 0; o < m; o += 64)
            __builtin_prefetch(pf->p[k] + o);
        pf->p[k] += m;
        pf->left[k] -= m;
        n -= m;
    }
}

static void qgemm_rows(const struct qgemm_job *j, int i, int64_t r0, int64_t r1, void *buf,
                       struct prefetch *pf)
{
    struct qgemm_w pw[QGEMM_PANELS];
    int np = (int)((r1 - r0 + QGEMM_ROWS - 1) / QGEMM_ROWS);
    size_t pb = panel_bytes(j->K);
    for (int p = 0; p < np; p++) {
        int64_t rp = r0 + (int64_t)p * QGEMM_ROWS;
        int nr = r1 - rp < QGEMM_ROWS ? (int)(r1 - rp) : QGEMM_ROWS;
        unpack_panel(j->dtype, j->m[i].w, j->row_bytes, rp, nr, j->K, (char *)buf + p * pb, &pw[p]);
    }
    int blk = blk_of(j->dtype);
    int64_t N = j->m[i].N;
    const float *bias = j->m[i].bias;
    float out[QGEMM_ROWS][QGEMM_TOKENS] __attribute__((aligned(64)));
    for (int64_t g = 0; g < j->groups; g++) {
        struct qgemm_x gx = x_group_at(j->s->x, j->K, g);
        int64_t t0 = g * QGEMM_TOKENS;
        int nt = j->T - t0 < QGEMM_TOKENS ? (int)(j->T - t0) : QGEMM_TOKENS;
        prefetch_step(pf);
        for (int p = 0; p < np; p++) {
            j->fn(j->K, blk, &pw[p], &gx, out);
            int64_t rp = r0 + (int64_t)p * QGEMM_ROWS;
            int nr = r1 - rp < QGEMM_ROWS ? (int)(r1 - rp) : QGEMM_ROWS;
            for (int t = 0; t < nt; t++) {
                float *yt = j->m[i].y + (t0 + t) * N + rp;
                for (int r = 0; r < nr; r++)
                    yt[r] = out[r][t] + (bias ? bias[rp + r] : 0.0f);
            }
        }
    }
}

/* Each thread claims its next chunk before computing the current one, so
 * the next one's weights can be prefetched meanwhile. */
static void qgemm_thread(void *ctx, int ith, int nth)
{
    struct qgemm_job *j = ctx;
    (void)nth;
    void *buf = j->s->panels[ith];
    int64_t next = atomic_fetch_add_explicit(&j->next_row, QGEMM_CHUNK_ROWS, memory_order_relaxed);
    while (next < j->total_rows) {
        int64_t b = next;
        next = atomic_fetch_add_explicit(&j->next_row, QGEMM_CHUNK_ROWS, memory_order_relaxed);
        struct prefetch pf;
        prefetch_plan(j, next, &pf);
        int64_t e = b + QGEMM_CHUNK_ROWS < j->total_rows ? b + QGEMM_CHUNK_ROWS : j->total_rows;
        int64_t base = 0;
        for (int i = 0; i < j->n && b < e; i++) {
            int64_t r0 = b - base, r1 = e - base;
            if (r0 < j->m[i].N && r1 > 0)
                qgemm_rows(j, i, r0 < 0 ? 0 : r0, r1 > j->m[i].N ? j->m[i].N : r1, buf, &pf);
            base += j->m[i].N;
        }
    }
}

static void pack_x_thread(void *ctx, int ith, int nth)
{
    const struct qgemm_job *j = ctx;
    for (int64_t g = ith; g < j->groups; g += nth) {
        int64_t t0 = g * QGEMM_TOKENS;
        int nt = j->T - t0 < QGEMM_TOKENS ? (int)(j->T - t0) : QGEMM_TOKENS;
        pack_x_group(j->xa, j->act_size, j->xs, j->k_act, t0, nt, j->K, j->s->x, g);
    }
}

void cpu_qgemm_scratch_free(struct qgemm_scratch *s)
{
    free(s->x);
    for (int i = 0; i < s->n_panels; i++)
        free(s->panels[i]);
    free(s->panels);
    memset(s, 0, sizeof *s);
}

static bool reserve(struct qgemm_scratch *s, size_t x_bytes, int n_threads, size_t pbytes)
{
    if (x_bytes > s->x_bytes) {
        void *p = aligned_alloc(64, (x_bytes + 63) / 64 * 64);
        if (!p)
            return false;
        free(s->x);
        s->x = p;
        s->x_bytes = x_bytes;
    }
    if (n_threads > s->n_panels || pbytes > s->panel_bytes) {
        for (int i = 0; i < s->n_panels; i++)
            free(s->panels[i]);
        free(s->panels);
        s->n_panels = 0;
        s->panel_bytes = 0;
        s->panels = calloc((size_t)n_threads, sizeof *s->panels);
        if (!s->panels)
            return false;
        for (int i = 0; i < n_threads; i++) {
            s->panels[i] = aligned_alloc(64, (pbytes + 63) / 64 * 64);
            if (!s->panels[i]) {
                for (int k = 0; k < i; k++)
                    free(s->panels[k]);
                free(s->panels);
                s->panels = NULL;
                return false;
            }
        }
        s->n_panels = n_threads;
        s->panel_bytes = pbytes;
    }
    return true;
}

bool cpu_qgemm_run(struct threadpool *pool, qgemm_fn fn, struct qgemm_scratch *s, const void *xa,
                   size_t act_size, int64_t xs, int64_t T, int n,
                   const struct weight_matrix *const *w, const float *const *bias,
                   float *const *y)
{
    int64_t K = w[0]->cols;
    enum dtype dt = w[0]->dtype;
    if (!fn || !cpu_qgemm_takes(dt) || K % 32 || T <= 0)
        return false;
    struct qgemm_job job = {
        .fn = fn, .s = s, .T = T, .K = K, .groups = (T + QGEMM_TOKENS - 1) / QGEMM_TOKENS,
        .dtype = dt, .row_bytes = (size_t)dtype_row_bytes(dt, (uint64_t)K), .n = n, .xa = xa,
        .act_size = act_size, .xs = xs, .k_act = qmm_act_k_of(dt),
    };
    if (!reserve(s, (size_t)job.groups * x_group_bytes(K), threadpool_size(pool),
                 QGEMM_PANELS * panel_bytes(K)))
        return false;
    atomic_init(&job.next_row, 0);
    for (int i = 0; i < n; i++) {
        job.m[i].w = w[i]->data;
        job.m[i].N = w[i]->rows;
        job.m[i].bias = bias[i];
        job.m[i].y = y[i];
        job.total_rows += w[i]->rows;
    }
    threadpool_run(pool, pack_x_thread, &job);
    threadpool_run(pool, qgemm_thread, &job);
    return true;
}
