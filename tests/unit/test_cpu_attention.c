/* tests/unit/test_cpu_attention.c — the CPU backend's attention over an f32 and an f16 cache: FAST mode's tiled prefill kernels against an f64 reference within a derived float bound (several spans of different lengths in one step, chunked prefill from mid-sequence, GQA groups 1/2/4/8, head sizes 64/128/256, block sizes 1/16/64, sliding windows, the AVX2 and AVX-512 kernels; dense attention unmasked and causal from an offset, as encoder-decoder models call it), the f16 cache's group decode kernels (AVX2, AVX-512, portable with and without F16C) against the same reference over head sizes 20 to 1024, groups 1 to 12 and every length from 1 to 128, the same bits whatever the thread count, and EXACT mode's row kernels: batched rows give the bits of one row per call. The reference reads the f16 cache's values as stored, so its bound is the f32 one. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/attn_f16.h"
#include "backend/kv_quant.h"
#include "base/cpu.h"

#define N_SEQ 4
#define MAX_POS 128
#define N_KV_HEADS 2

/* Two steps of a batch of four sequences: a first prefill of each (one of
 * them short enough for the row kernel), then a chunked prefill that starts
 * mid-sequence, a decode row, a 3-row verification and a 5-row chunk. */
struct seq_chunk {
    int seq, pos0, n;
};
static const struct seq_chunk step1[N_SEQ] = {{0, 0, 70}, {1, 0, 50}, {2, 0, 31}, {3, 0, 2}};
static const struct seq_chunk step2[N_SEQ] = {{1, 50, 45}, {2, 31, 1}, {3, 2, 3}, {0, 70, 5}};
static const struct seq_chunk *const steps[2] = {step1, step2};

static int step_rows(const struct seq_chunk *st)
{
    int rows = 0;
    for (int i = 0; i < N_SEQ; i++)
        rows += st[i].n;
    return rows;
}

/* Every sequence's queries, keys and values at every position, made once. */
struct data {
    int hd, n_heads, group;
    float scale;
    float *q; /* [seq][pos][n_heads * hd] */
    float *k; /* [seq][pos][N_KV_HEADS * hd] */
    float *v;
    float *kh, *vh; /* k and v as an f16 cache holds them (rounded to f16, widened back) */
    float vmax;
};

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void data_make(struct data *d, int hd, int group)
{
    d->hd = hd;
    d->group = group;
    d->n_heads = group * N_KV_HEADS;
    d->scale = 1.0f / sqrtf((float)hd);
    size_t qn = (size_t)N_SEQ * MAX_POS * d->n_heads * hd, kn = (size_t)N_SEQ * MAX_POS * N_KV_HEADS * hd;
    d->q = malloc(qn * sizeof(float));
    d->k = malloc(kn * sizeof(float));
    d->v = malloc(kn * sizeof(float));
    d->kh = malloc(kn * sizeof(float));
    d->vh = malloc(kn * sizeof(float));
    cr_assert(d->q && d->k && d->v && d->kh && d->vh);
    uint64_t seed = 0x5eed + (uint64_t)hd * 131 + (uint64_t)group;
    for (size_t i = 0; i < qn; i++)
        d->q[i] = 2.0f * frand(&seed);
    d->vmax = 0;
    for (size_t i = 0; i < kn; i++) {
        /* one large dimension per head makes some softmax rows peaked */
        d->k[i] = frand(&seed) * (i % (size_t)hd == 3 ? 8.0f : 1.0f);
        d->v[i] = frand(&seed);
        d->kh[i] = kvq_f16_to_f32(kvq_f32_to_f16(d->k[i]));
        d->vh[i] = kvq_f16_to_f32(kvq_f32_to_f16(d->v[i]));
        /* rounding to f16 moves |v| by at most half an ulp, never past a power of two */
        float m = fabsf(d->v[i]) > fabsf(d->vh[i]) ? fabsf(d->v[i]) : fabsf(d->vh[i]);
        d->vmax = m > d->vmax ? m : d->vmax;
    }
}

static void data_free(struct data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->kh);
    free(d->vh);
}

static const float *q_at(const struct data *d, int seq, int pos)
{
    return d->q + ((size_t)seq * MAX_POS + pos) * d->n_heads * d->hd;
}
static const float *k_at(const struct data *d, const float *base, int seq, int pos)
{
    return base + ((size_t)seq * MAX_POS + pos) * N_KV_HEADS * d->hd;
}

static int first_pos(int pos, int window)
{
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* The attention of (seq, pos, head) in f64, and a bound on how far an f32
 * computation of it may be. With u = 2^-24 and gamma(n) = n u / (1 - n u):
 * a score (scale folded into q: hd products and one more rounding) is off by
 * at most ds = gamma(hd + 1) * scale * sum_d |q_d k_d|; a probability
 * exp(s_j - max) is then off relatively by at most
 * eps = 2 ds + u |s_j - max| + 4u (the shift's rounding, the vector exp's
 * few ulp); normalised sums of probabilities times values move by at most
 * 2 eps max|v|; the two running sums of n terms add 2 gamma(n) max|v|, and
 * each chunk's rescaling by a factor exp() rounded to a few ulp 5u per
 * chunk. Twice the total leaves room for the second-order terms. With f16
 * true, K and V are the values an f16 cache holds: the kernels widen them
 * exactly, so the same bound holds. */
static void reference(const struct data *d, bool f16, int seq, int pos, int head, int window,
                      double *out, double *bound)
{
    const float *kb = f16 ? d->kh : d->k, *vb = f16 ? d->vh : d->v;
    int hd = d->hd, kvh = head / d->group, f = first_pos(pos, window), n = pos - f + 1;
    const float *q = q_at(d, seq, pos) + (size_t)head * hd;
    double *s = malloc((size_t)n * sizeof(double));
    double smax = -INFINITY, smin = INFINITY, sabs = 0;
    for (int j = 0; j < n; j++) {
        const float *k = k_at(d, kb, seq, f + j) + (size_t)kvh * hd;
        double dot = 0, abs_dot = 0;
        for (int e = 0; e < hd; e++) {
            dot += (double)q[e] * k[e];
            abs_dot += fabs((double)q[e] * k[e]);
        }
        s[j] = dot * d->scale;
        smax = s[j] > smax ? s[j] : smax;
        smin = s[j] < smin ? s[j] : smin;
        sabs = abs_dot * d->scale > sabs ? abs_dot * d->scale : sabs;
    }
    double sum = 0;
    for (int e = 0; e < hd; e++)
        out[e] = 0;
    for (int j = 0; j < n; j++) {
        double p = exp(s[j] - smax);
        sum += p;
        const float *v = k_at(d, vb, seq, f + j) + (size_t)kvh * hd;
        for (int e = 0; e < hd; e++)
            out[e] += p * v[e];
    }
    for (int e = 0; e < hd; e++)
        out[e] /= sum;
    free(s);
    const double u = ldexp(1.0, -24);
#define GAMMA(m) ((m) * u / (1 - (m) * u))
    double ds = GAMMA(hd + 1.0) * sabs;
    double eps = 2 * ds + u * (smax - smin) + 4 * u;
    int chunks = n / 64 + 2; /* more chunks than any kernel's */
    *bound = 2 * d->vmax * (2 * eps + 2 * GAMMA((double)n) + 5 * u * chunks + 4 * u);
#undef GAMMA
}

/* A cache of n_blocks blocks whose sequences' blocks interleave: sequence s's
 * b-th block is block b * N_SEQ + s, so every table jumps. */
struct cache {
    struct backend *be;
    struct kv_cache kv;
    uint32_t tables[N_SEQ][MAX_POS];
    int n_table;
};

static void cache_make(struct cache *c, struct backend *be, int hd, int block_size,
                       enum dtype dtype)
{
    c->be = be;
    c->n_table = (MAX_POS + block_size - 1) / block_size;
    int n_blocks = c->n_table * N_SEQ;
    size_t bytes = (size_t)n_blocks * block_size * N_KV_HEADS * hd * dtype_size(dtype);
    c->kv = (struct kv_cache){.k = be->ops->alloc(be, bytes), .v = be->ops->alloc(be, bytes),
                              .dtype = dtype, .n_layers = 1, .n_blocks = n_blocks,
                              .block_size = block_size, .n_kv_heads = N_KV_HEADS, .head_dim = hd};
    cr_assert(c->kv.k && c->kv.v);
    for (int s = 0; s < N_SEQ; s++)
        for (int b = 0; b < c->n_table; b++)
            c->tables[s][b] = (uint32_t)(b * N_SEQ + s);
}

static void cache_free(struct cache *c)
{
    c->be->ops->release(c->be, c->kv.k);
    c->be->ops->release(c->be, c->kv.v);
}

/* Stores the chunks' K and V and runs one attention call over them; out
 * receives step_rows(st) rows, the chunks' rows in order. */
static void run_step(struct cache *c, const struct data *d, const struct seq_chunk *st, int n_chunks,
                     int window, float *out)
{
    int rows = 0;
    for (int i = 0; i < n_chunks; i++)
        rows += st[i].n;
    size_t q_dim = (size_t)d->n_heads * d->hd, kv_dim = (size_t)N_KV_HEADS * d->hd;
    float *q = malloc((size_t)rows * q_dim * sizeof(float));
    float *k = malloc((size_t)rows * kv_dim * sizeof(float));
    float *v = malloc((size_t)rows * kv_dim * sizeof(float));
    struct attn_span spans[N_SEQ];
    int row = 0;
    for (int i = 0; i < n_chunks; i++) {
        spans[i] = (struct attn_span){row, st[i].n, st[i].pos0, c->tables[st[i].seq], c->n_table};
        for (int r = 0; r < st[i].n; r++, row++) {
            int pos = st[i].pos0 + r;
            memcpy(q + row * q_dim, q_at(d, st[i].seq, pos), q_dim * sizeof(float));
            memcpy(k + row * kv_dim, k_at(d, d->k, st[i].seq, pos), kv_dim * sizeof(float));
            memcpy(v + row * kv_dim, k_at(d, d->v, st[i].seq, pos), kv_dim * sizeof(float));
        }
    }
    c->be->ops->kv_store(c->be, &c->kv, 0, k, v, spans, n_chunks);
    c->be->ops->attention(c->be, q, &c->kv, 0, spans, n_chunks, d->n_heads, d->scale, window, out);
    free(q);
    free(k);
    free(v);
}

static struct backend *cpu_backend(enum compute_mode mode, enum cpu_isa isa, int threads)
{
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode, .threads = threads,
                                                              .cpu_isa = isa},
                                    &be, &err),
                 0, "%s", err.msg);
    return be;
}

static const enum dtype cache_dtypes[2] = {DTYPE_F32, DTYPE_F16};

static bool have_avx512(void)
{
    const struct cpu_features *cf = cpu_features();
    return cf->avx512f && cf->avx512bw && cf->avx512vl;
}

Test(cpu_attention, fast_tiles_match_an_f64_reference_within_the_float_bound)
{
    static const int hds[] = {64, 128, 256}, groups[] = {1, 2, 4, 8}, blocks[] = {1, 16, 64};
    static const int windows[] = {0, 37};
    enum cpu_isa isas[2] = {CPU_ISA_AVX2, CPU_ISA_BEST};
    int n_isas = have_avx512() ? 2 : 1;
    struct backend *be[2];
    for (int i = 0; i < n_isas; i++)
        be[i] = cpu_backend(COMPUTE_FAST, isas[i], 2);
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            struct data d;
            data_make(&d, hds[h], groups[g]);
            int hd = d.hd;
            size_t q_dim = (size_t)d.n_heads * hd;
            for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
                for (int x = 0; x < 2; x++) {
                    bool f16 = cache_dtypes[x] == DTYPE_F16;
                    /* the reference and its bound per step row and head */
                    double *ref[2], *bound[2];
                    for (int s = 0; s < 2; s++) {
                        int rows = step_rows(steps[s]);
                        ref[s] = malloc((size_t)rows * q_dim * sizeof(double));
                        bound[s] = malloc((size_t)rows * d.n_heads * sizeof(double));
                        int row = 0;
                        for (int i = 0; i < N_SEQ; i++)
                            for (int r = 0; r < steps[s][i].n; r++, row++)
                                for (int head = 0; head < d.n_heads; head++)
                                    reference(&d, f16, steps[s][i].seq, steps[s][i].pos0 + r,
                                              head, windows[w],
                                              ref[s] + row * q_dim + (size_t)head * hd,
                                              &bound[s][(size_t)row * d.n_heads + head]);
                    }
                    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
                        for (int i = 0; i < n_isas; i++) {
                            struct cache c;
                            cache_make(&c, be[i], hd, blocks[b], cache_dtypes[x]);
                            for (int s = 0; s < 2; s++) {
                                int rows = step_rows(steps[s]);
                                float *out = malloc((size_t)rows * q_dim * sizeof(float));
                                run_step(&c, &d, steps[s], N_SEQ, windows[w], out);
                                double worst = 0;
                                int worst_row = 0, worst_head = 0;
                                for (int row = 0; row < rows; row++)
                                    for (int head = 0; head < d.n_heads; head++) {
                                        double tol = bound[s][(size_t)row * d.n_heads + head];
                                        for (int e = 0; e < hd; e++) {
                                            size_t at = row * q_dim + (size_t)head * hd + e;
                                            double ratio = fabs(out[at] - ref[s][at]) / tol;
                                            if (!(ratio <= worst)) {
                                                worst = ratio;
                                                worst_row = row;
                                                worst_head = head;
                                            }
                                        }
                                    }
                                cr_expect(worst <= 1.0,
                                          "%s cache hd %d group %d block %d window %d %s step "
                                          "%d: row %d head %d is %.3g of the bound off",
                                          f16 ? "f16" : "f32", hd, d.group, blocks[b], windows[w],
                                          isas[i] == CPU_ISA_AVX2 ? "avx2" : "best", s + 1,
                                          worst_row, worst_head, worst);
                                free(out);
                            }
                            cache_free(&c);
                        }
                    }
                    for (int s = 0; s < 2; s++) {
                        free(ref[s]);
                        free(bound[s]);
                    }
                }
            }
            data_free(&d);
        }
    }
    for (int i = 0; i < n_isas; i++)
        backend_destroy(be[i]);
}

/* The f16 cache's group kernels called directly against the f64 reference:
 * each kernel the processor runs (AVX2 and AVX-512 where the head size
 * allows, the portable one with and without F16C), head sizes 20 to 1024,
 * groups 1 to 12 (dealt as items of at most hattn_item_heads heads, as the
 * driver deals them), every query position of a 128-position sequence
 * (lengths 1 to 128: every remainder of the vector widths, of the register
 * blocks and of the 64-position chunk), blocks of 1 and 16 positions, with
 * and without a sliding window; every row alone and in items of several rows,
 * which must give the same bits. */
Test(cpu_attention, f16_group_kernels_match_an_f64_reference_within_the_float_bound)
{
    static const struct {
        int hd, group;
    } shapes[] = {{20, 3}, {40, 2}, {64, 1}, {64, 3}, {64, 5}, {128, 4}, {128, 8}, {256, 12},
                  {1024, 12}};
    static const int blocks[] = {1, 16}, windows[] = {0, 37};
    const struct cpu_features *cf = cpu_features();
    static const struct {
        const char *name;
        void (*fn)(const struct tattn_args *, const struct hattn_item *);
        int hd_multiple;
    } kernels[] = {{"avx2", cpu_hattn_group_avx2, 8},
                   {"avx512", cpu_hattn_group_avx512, 16},
                   {"portable f16c", cpu_hattn_group_f16c, 1},
                   {"portable scalar", cpu_hattn_group_scalar, 1}};
    bool runs[4] = {cf->f16c, cf->f16c && have_avx512(), cf->f16c, true};
    struct backend *be = cpu_backend(COMPUTE_FAST, CPU_ISA_BEST, 1);
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        struct data d;
        data_make(&d, shapes[sh].hd, shapes[sh].group);
        int hd = d.hd, share = hattn_item_heads(d.group, hd);
        size_t q_dim = (size_t)d.n_heads * hd;
        float *out = malloc(MAX_POS * q_dim * sizeof(float));
        float *out_bundled = malloc(MAX_POS * q_dim * sizeof(float));
        double *ref = malloc(MAX_POS * q_dim * sizeof(double));
        double *bound = malloc(MAX_POS * (size_t)d.n_heads * sizeof(double));
        cr_assert(out && out_bundled && ref && bound);
        for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
            for (int pos = 0; pos < MAX_POS; pos++)
                for (int head = 0; head < d.n_heads; head++)
                    reference(&d, true, 0, pos, head, windows[w],
                              ref + pos * q_dim + (size_t)head * hd,
                              &bound[(size_t)pos * d.n_heads + head]);
            for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
                struct cache c;
                cache_make(&c, be, hd, blocks[b], DTYPE_F16);
                struct attn_span sp = {0, MAX_POS, 0, c.tables[0], c.n_table};
                be->ops->kv_store(be, &c.kv, 0, k_at(&d, d.k, 0, 0), k_at(&d, d.v, 0, 0), &sp, 1);
                struct tattn_args a = {q_at(&d, 0, 0), &c.kv, 0, d.n_heads, d.scale, windows[w],
                                       out, -1};
                for (int kn = 0; kn < 4; kn++) {
                    if (!runs[kn] || hd % kernels[kn].hd_multiple)
                        continue;
                    /* every row alone, then in items of the most rows the limits allow (a
                     * verify entry's rows): the same bits */
                    int bundle = hattn_item_rows(share, hd);
                    for (int pass = 0; pass < 2; pass++) {
                        float *dst = pass ? out_bundled : out;
                        int rows = pass ? bundle : 1;
                        a.out = dst;
                        /* NaN: nothing left unwritten */
                        memset(dst, 0xff, MAX_POS * q_dim * sizeof(float));
                        for (int pos = 0; pos < MAX_POS; pos += rows)
                            for (int kvh = 0; kvh < N_KV_HEADS; kvh++)
                                for (int h0 = 0; h0 < d.group; h0 += share) {
                                    struct hattn_item it = {
                                        &sp, pos, kvh, kvh * d.group + h0,
                                        d.group - h0 < share ? d.group - h0 : share,
                                        MAX_POS - pos < rows ? MAX_POS - pos : rows, 1};
                                    kernels[kn].fn(&a, &it);
                                }
                    }
                    cr_expect(!memcmp(out, out_bundled, MAX_POS * q_dim * sizeof(float)),
                              "%s: hd %d group %d block %d window %d: rows in items of %d differ "
                              "from the rows alone", kernels[kn].name, hd, d.group, blocks[b],
                              windows[w], bundle);
                    /* every kv head's whole group in one item (a slot row read in one pass),
                     * where the limits allow it: the same bits again */
                    int all_rows = HATTN_MAX_HEADS / (N_KV_HEADS * d.group);
                    if (share == d.group && all_rows >= 1 &&
                        N_KV_HEADS * d.group * hd <= HATTN_MAX_QUERY_FLOATS) {
                        int rows = all_rows < bundle ? all_rows : bundle;
                        while (rows > 1 && rows * N_KV_HEADS * d.group * hd > HATTN_MAX_QUERY_FLOATS)
                            rows--;
                        a.out = out_bundled;
                        memset(out_bundled, 0xff, MAX_POS * q_dim * sizeof(float));
                        for (int pos = 0; pos < MAX_POS; pos += rows) {
                            struct hattn_item it = {
                                &sp, pos, 0, 0, d.group,
                                MAX_POS - pos < rows ? MAX_POS - pos : rows, N_KV_HEADS};
                            kernels[kn].fn(&a, &it);
                        }
                        cr_expect(!memcmp(out, out_bundled, MAX_POS * q_dim * sizeof(float)),
                                  "%s: hd %d group %d block %d window %d: items of every kv head "
                                  "(%d rows) differ from the rows alone", kernels[kn].name, hd,
                                  d.group, blocks[b], windows[w], rows);
                    }
                    double worst = 0;
                    int worst_pos = 0, worst_head = 0;
                    for (int pos = 0; pos < MAX_POS; pos++)
                        for (int head = 0; head < d.n_heads; head++)
                            for (int e = 0; e < hd; e++) {
                                size_t at = pos * q_dim + (size_t)head * hd + e;
                                double ratio = fabs(out[at] - ref[at]) /
                                               bound[(size_t)pos * d.n_heads + head];
                                if (!(ratio <= worst)) {
                                    worst = ratio;
                                    worst_pos = pos;
                                    worst_head = head;
                                }
                            }
                    cr_expect(worst <= 1.0,
                              "%s: hd %d group %d block %d window %d: position %d head %d is "
                              "%.3g of the bound off",
                              kernels[kn].name, hd, d.group, blocks[b], windows[w], worst_pos,
                              worst_head, worst);
                }
                cache_free(&c);
            }
        }
        free(out);
        free(out_bundled);
        free(ref);
        free(bound);
        data_free(&d);
    }
    backend_destroy(be);
}

/* A tile is computed by one thread from start to end, so how many threads
 * share the tiles changes no bit; nor does how an f16 cache's group kernel
 * shares a group's heads out between items, or whether an item takes every
 * kv head of its rows. */
Test(cpu_attention, fast_tiles_give_the_same_bits_on_one_and_three_threads)
{
    struct data d;
    data_make(&d, 128, 2);
    size_t q_dim = (size_t)d.n_heads * d.hd;
    struct backend *be[2] = {cpu_backend(COMPUTE_FAST, CPU_ISA_BEST, 1),
                             cpu_backend(COMPUTE_FAST, CPU_ISA_BEST, 3)};
    for (int x = 0; x < 2; x++) {
        struct cache c[2];
        for (int i = 0; i < 2; i++)
            cache_make(&c[i], be[i], d.hd, 16, cache_dtypes[x]);
        for (int s = 0; s < 2; s++) {
            int rows = step_rows(steps[s]);
            float *out[2];
            for (int i = 0; i < 2; i++) {
                out[i] = malloc((size_t)rows * q_dim * sizeof(float));
                run_step(&c[i], &d, steps[s], N_SEQ, 0, out[i]);
            }
            cr_expect(!memcmp(out[0], out[1], (size_t)rows * q_dim * sizeof(float)),
                      "%s cache step %d", dtype_name(cache_dtypes[x]), s + 1);
            free(out[0]);
            free(out[1]);
        }
        /* one decode row: with three threads its group is shared out between them */
        float *out[2];
        struct seq_chunk one = {0, 75, 1}; /* sequence 0 after both steps */
        for (int i = 0; i < 2; i++) {
            out[i] = malloc(q_dim * sizeof(float));
            run_step(&c[i], &d, &one, 1, 0, out[i]);
        }
        cr_expect(!memcmp(out[0], out[1], q_dim * sizeof(float)), "%s cache, one decode row",
                  dtype_name(cache_dtypes[x]));
        free(out[0]);
        free(out[1]);
        /* a decode row of every sequence: one thread takes each row's kv heads in one item,
         * three threads each kv head on its own */
        struct seq_chunk rows[N_SEQ] = {{0, 75, 1}, {1, 95, 1}, {2, 32, 1}, {3, 5, 1}};
        for (int i = 0; i < 2; i++) {
            out[i] = malloc(N_SEQ * q_dim * sizeof(float));
            run_step(&c[i], &d, rows, N_SEQ, 0, out[i]);
        }
        cr_expect(!memcmp(out[0], out[1], N_SEQ * q_dim * sizeof(float)),
                  "%s cache, a decode row of every sequence", dtype_name(cache_dtypes[x]));
        free(out[0]);
        free(out[1]);
        for (int i = 0; i < 2; i++)
            cache_free(&c[i]);
    }
    for (int i = 0; i < 2; i++)
        backend_destroy(be[i]);
    data_free(&d);
}

/* EXACT mode attends each row alone, whatever else the step holds, so a
 * batched prefill gives the bits of one row per call; FAST mode's one-row
 * calls (decode) run the same row kernel and give the same bits too. */
static void check_exact_rows(int hd, int group, int block_size, int window, enum dtype dtype)
{
    struct data d;
    data_make(&d, hd, group);
    size_t q_dim = (size_t)d.n_heads * hd;
    struct backend *exact = cpu_backend(COMPUTE_EXACT, CPU_ISA_BEST, 2);
    struct backend *fast = cpu_backend(COMPUTE_FAST, CPU_ISA_BEST, 2);
    struct cache batched, one[2];
    cache_make(&batched, exact, hd, block_size, dtype);
    cache_make(&one[0], exact, hd, block_size, dtype);
    cache_make(&one[1], fast, hd, block_size, dtype);
    float *row_out[2] = {malloc(q_dim * sizeof(float)), malloc(q_dim * sizeof(float))};
    for (int s = 0; s < 2; s++) {
        int rows = step_rows(steps[s]);
        float *out = malloc((size_t)rows * q_dim * sizeof(float));
        run_step(&batched, &d, steps[s], N_SEQ, window, out);
        int row = 0, mismatched = 0;
        for (int i = 0; i < N_SEQ; i++) {
            for (int r = 0; r < steps[s][i].n; r++, row++) {
                struct seq_chunk alone = {steps[s][i].seq, steps[s][i].pos0 + r, 1};
                for (int m = 0; m < 2; m++) {
                    run_step(&one[m], &d, &alone, 1, window, row_out[m]);
                    mismatched += memcmp(row_out[m], out + row * q_dim, q_dim * sizeof(float)) != 0;
                }
            }
        }
        cr_expect_eq(mismatched, 0,
                     "%s cache hd %d group %d block %d window %d step %d: %d rows differ from "
                     "one-row calls",
                     dtype_name(dtype), hd, group, block_size, window, s + 1, mismatched);
        free(out);
    }
    free(row_out[0]);
    free(row_out[1]);
    cache_free(&batched);
    cache_free(&one[0]);
    cache_free(&one[1]);
    backend_destroy(exact);
    backend_destroy(fast);
    data_free(&d);
}

Test(cpu_attention, exact_batched_rows_give_the_bits_of_one_row_per_call)
{
    for (int x = 0; x < 2; x++) {
        check_exact_rows(128, 2, 16, 0, cache_dtypes[x]);
        check_exact_rows(64, 4, 1, 37, cache_dtypes[x]);
        check_exact_rows(256, 1, 64, 0, cache_dtypes[x]);
    }
    check_exact_rows(40, 3, 16, 0, DTYPE_F16); /* AVX2's group kernel, also under AVX-512 */
    check_exact_rows(20, 3, 16, 37, DTYPE_F16); /* the portable one */
}

/* Dense attention (the encoder-decoder models' attention_dense) in FAST mode runs the same
 * kernels over K/V rows read as the blocks of a one-layer cache: 37 queries through the tiles
 * and one query (cross-attention while decoding) through the row kernel, without a mask (an
 * encoder) and causal from an offset (a decoder's prompt), against an f64 reference, within a
 * float bound (a few float epsilons per term summed, times the largest |v|). */
Test(cpu_attention, dense_fast_kernels_match_an_f64_reference)
{
    enum { HEADS = 3, HD = 64, MAXQ = 37, NKV = 160 };
    static const int nqs[] = {MAXQ, 1};
    static const long causals[] = {-1, 16, 0};
    size_t dim = (size_t)HEADS * HD;
    float *q = malloc(MAXQ * dim * sizeof *q), *k = malloc(NKV * dim * sizeof *k),
          *v = malloc(NKV * dim * sizeof *v), *out = malloc(MAXQ * dim * sizeof *out);
    uint64_t seed = 11;
    for (size_t i = 0; i < MAXQ * dim; i++)
        q[i] = 2.0f * frand(&seed);
    for (size_t i = 0; i < NKV * dim; i++) {
        k[i] = frand(&seed);
        v[i] = frand(&seed);
    }
    enum cpu_isa isas[2] = {CPU_ISA_AVX2, CPU_ISA_BEST};
    int n_isas = have_avx512() ? 2 : 1;
    for (int i = 0; i < n_isas; i++) {
        struct backend *be = cpu_backend(COMPUTE_FAST, isas[i], 2);
        for (size_t a = 0; a < sizeof nqs / sizeof nqs[0]; a++)
            for (size_t c = 0; c < sizeof causals / sizeof causals[0]; c++) {
                int nq = nqs[a];
                long causal = causals[c];
                be->ops->attention_dense(be, q, nq, k, v, NKV, (int64_t)dim, HEADS, HD, 0.125f,
                                         causal, out);
                for (int r = 0; r < nq; r++)
                    for (int h = 0; h < HEADS; h++) {
                        int n = causal >= 0 ? (int)causal + r + 1 : NKV;
                        double s[NKV], mx = -INFINITY, sum = 0, vmax = 0;
                        for (int j = 0; j < n; j++) {
                            double dot = 0;
                            for (int d = 0; d < HD; d++)
                                dot += (double)q[r * dim + h * HD + d] * k[j * dim + h * HD + d];
                            s[j] = dot * 0.125;
                            mx = s[j] > mx ? s[j] : mx;
                        }
                        for (int j = 0; j < n; j++)
                            sum += (s[j] = exp(s[j] - mx));
                        for (int d = 0; d < HD; d++) {
                            double ref = 0;
                            for (int j = 0; j < n; j++) {
                                double vj = v[j * dim + h * HD + d];
                                ref += s[j] / sum * vj;
                                vmax = fabs(vj) > vmax ? fabs(vj) : vmax;
                            }
                            double tol = 16.0 * (HD + n) * FLT_EPSILON * (vmax > 1 ? vmax : 1);
                            cr_assert_leq(fabs(out[r * dim + h * HD + d] - ref), tol,
                                          "%s %d queries, causal %ld: row %d head %d dim %d: %g "
                                          "against %g",
                                          isas[i] == CPU_ISA_AVX2 ? "avx2" : "best", nq, causal,
                                          r, h, d, out[r * dim + h * HD + d], ref);
                        }
                    }
            }
        backend_destroy(be);
    }
    free(q);
    free(k);
    free(v);
    free(out);
}
