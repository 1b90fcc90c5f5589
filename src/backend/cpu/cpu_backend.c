/* backend/cpu/cpu_backend.c — the CPU backend's op table: memory, elementwise ops, norms, RoPE, embedding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/attn_quant_kernels.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/vec_avx2.h"
#include "base/bf16.h"
#include "base/cpu.h"
#include "base/panels.h"
#include "base/quant.h"

/* Elementwise jobs are split in chunks of this many floats (a multiple of
 * the vector width) so threads never share a cache line. */
#define ELEMENTWISE_ALIGN 64

static struct cpu_impl *impl_of(struct backend *be) { return be->impl; }

static void cpu_destroy(struct backend *be)
{
    struct cpu_impl *impl = impl_of(be);
    cpu_matmul_free(impl->matmul);
    threadpool_free(impl->pool);
    free(impl->qwindow);
    for (int i = 0; i < CPU_ROPE_ANGLE_SETS; i++) {
        free(impl->angles[i].positions);
        free(impl->angles[i].cos_sin);
        free(impl->angles[i].freq);
    }
    free(impl);
    free(be);
}

/* Backend memory is an anonymous mapping: zeroed lazily by the kernel (a
 * large KV pool costs nothing until used), page aligned, and eligible for
 * transparent huge pages, which cut TLB misses when kernels stream it. The
 * mapping's length sits in the first page, before the pointer returned, so
 * what the caller gets is page aligned too (the SSD tier writes KV blocks to
 * disk from the pool with O_DIRECT, which wants aligned buffers). */
#define ALLOC_HEADER 4096

static void *cpu_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    size_t len = ALLOC_HEADER + (bytes ? bytes : 1);
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    if (len >= ((size_t)2 << 20))
        madvise(base, len, MADV_HUGEPAGE);
    *(size_t *)base = len;
    return (char *)base + ALLOC_HEADER;
}

static void cpu_release(struct backend *be, void *ptr)
{
    cpu_settle(be);
    if (!ptr)
        return;
    char *base = (char *)ptr - ALLOC_HEADER;
    munmap(base, *(size_t *)base);
}

static void cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    cpu_settle(be);
    memcpy(dst, src, bytes);
}

/* ---- embedding ---------------------------------------------------------- */

struct embed_job {
    const struct weight_matrix *table;
    const int32_t *tokens;
    int64_t n_tokens;
    float *out;
};

static void embed_rows(void *ctx, int ith, int nth)
{
    struct embed_job *job = ctx;
    int64_t dim = job->table->cols;
    long begin, end;
    threadpool_split(job->n_tokens, ith, nth, 1, &begin, &end);
    for (long t = begin; t < end; t++) {
        int64_t row = job->tokens[t];
        float *dst = job->out + t * dim;
        if (dtype_is_block(job->table->dtype)) {
            uint64_t rb = dtype_row_bytes(job->table->dtype, (uint64_t)dim);
            quant_dequantize_row(job->table->dtype,
                                 (const uint8_t *)job->table->data + (uint64_t)row * rb, dst, dim);
        } else if (job->table->dtype == DTYPE_F32) {
            memcpy(dst, (const float *)job->table->data + row * dim, (size_t)dim * sizeof(float));
        } else if (job->table->dtype == DTYPE_BF16_P32) { /* a tied head's table */
            const uint32_t *pairs = panels_row_pairs(job->table->data, dim, row);
            for (int64_t i = 0; i < dim; i += 2) {
                uint32_t w = pairs[(i / 2) * PANEL_ROWS];
                dst[i] = bf16_to_f32((uint16_t)w);
                if (i + 1 < dim)
                    dst[i + 1] = bf16_to_f32((uint16_t)(w >> 16));
            }
        } else {
            const uint16_t *src = (const uint16_t *)job->table->data + row * dim;
            for (int64_t i = 0; i < dim; i++)
                dst[i] = bf16_to_f32(src[i]);
        }
    }
}

static void cpu_embed(struct backend *be, const struct weight_matrix *table, const int32_t *tokens,
                      int64_t n_tokens, float *out)
{
    cpu_settle(be);
    struct embed_job job = {table, tokens, n_tokens, out};
    threadpool_run(impl_of(be)->pool, embed_rows, &job);
}

/* ---- matmul ------------------------------------------------------------- */

static void cpu_matmul_op(struct backend *be, const float *x, int64_t n_tokens,
                          const struct weight_matrix *w, const float *bias, float *y)
{
    cpu_matmul_run(impl_of(be)->matmul, be->mode, x, n_tokens, w, bias, y);
}

static void cpu_matmul_group_op(struct backend *be, const float *x, int64_t n_tokens, int n,
                                const struct weight_matrix *const *w, const float *const *bias,
                                float *const *y)
{
    cpu_matmul_run_group(impl_of(be)->matmul, be->mode, x, n_tokens, n, w, bias, y);
}

/* ---- RMSNorm ------------------------------------------------------------ */

struct rmsnorm_job {
    const float *x, *weight;
    int64_t n_rows, dim;
    float eps;
    float *y;
    long items; /* held: the step's token rows, each n_rows / items rows; else 0 */
};

/* Thread ith's rows of n: whole items (the step's token rows) when items > 0, as every loop
 * held for one job splits them, else rows evenly. */
static void share_of(long n, long items, int ith, int nth, long *begin, long *end)
{
    long per = items > 0 ? n / items : 1;
    threadpool_split(items > 0 ? items : n, ith, nth, 1, begin, end);
    *begin *= per;
    *end *= per;
}

/* Holds job (a loop over n rows or elements) for the next job of the pool when row ops are
 * held and n is whole token rows, with *items set to them; false otherwise, with whatever is
 * held run first, for the caller to run it now. */
static bool hold(struct backend *be, threadpool_fn fn, void *job, size_t bytes, long *items,
                 int64_t n)
{
    struct cpu_impl *impl = impl_of(be);
    int64_t t = impl->hold_tokens;
    if (t > 0 && n > 0 && n % t == 0) {
        *items = (long)t;
        threadpool_hold(impl->pool, fn, job, bytes, (long)t);
        return true;
    }
    cpu_settle(be);
    return false;
}

/* sum x[i]^2 in double: 16 lanes (four chains of four, so the adds'
 * latency overlaps) in an order fixed by n alone, then the tail in order.
 * A square of a float is exact in double; a one-chain loop took ~4 cycles
 * an element, so a decode step's norms (8 rows: 60k elements) cost as much as a
 * small matmul, on one thread while the others waited. */
static double sum_squares(const float *x, int64_t n)
{
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int u = 0; u < 4; u++) {
            __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * u));
            acc[u] = _mm256_add_pd(acc[u], _mm256_mul_pd(v, v));
        }
    __m256d s4 = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    double sum = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
    for (; i < n; i++)
        sum += (double)x[i] * x[i];
    return sum;
}

static void rmsnorm_rows(void *ctx, int ith, int nth)
{
    struct rmsnorm_job *job = ctx;
    long begin, end;
    share_of(job->n_rows, job->items, ith, nth, &begin, &end);
    for (long r = begin; r < end; r++) {
        const float *x = job->x + r * job->dim;
        float *y = job->y + r * job->dim;
        double sum = sum_squares(x, job->dim);
        /* torch: x * rsqrt(mean(x^2) + eps), then * weight, all in f32 */
        float inv = 1.0f / sqrtf((float)(sum / (double)job->dim) + job->eps);
        for (int64_t i = 0; i < job->dim; i++)
            y[i] = job->weight[i] * (x[i] * inv);
    }
}

static void cpu_rmsnorm(struct backend *be, const float *x, const float *weight, int64_t n_rows,
                        int64_t dim, float eps, float *y)
{
    struct rmsnorm_job job = {x, weight, n_rows, dim, eps, y, 0};
    if (hold(be, rmsnorm_rows, &job, sizeof job, &job.items, n_rows))
        return;
    if (n_rows * dim < 16384) {
        rmsnorm_rows(&job, 0, 1);
        return;
    }
    threadpool_run(impl_of(be)->pool, rmsnorm_rows, &job);
}

/* ---- RoPE --------------------------------------------------------------- */

struct rope_job {
    float *x;
    int64_t n_tokens;
    int n_heads, head_dim;
    const int32_t *positions;
    const struct rope_table *rope;
    /* n_tokens x rot_dim: each token's cos then sin, read (computed false) or written as they
     * are computed; NULL: computed on the stack and dropped */
    float *cos_sin;
    bool computed;
};

static void rope_tokens(void *ctx, int ith, int nth)
{
    struct rope_job *job = ctx;
    int half = job->rope->rot_dim / 2;
    float buf[1024];
    long begin, end;
    threadpool_split(job->n_tokens, ith, nth, 1, &begin, &end);
    for (long t = begin; t < end; t++) {
        float *cs = job->cos_sin ? job->cos_sin + t * 2 * half : buf;
        if (!job->computed) {
            float pos = (float)job->positions[t];
            const struct rope_table *rt = job->rope;
            const float *freq =
                rt->inv_freq + (rt->long_from > 0 && job->positions[t] >= rt->long_from ? half : 0);
            for (int i = 0; i < half; i++) {
                /* the angle is rounded to f32 first, as transformers computes it */
                float angle = pos * freq[i];
                cs[i] = cosf(angle) * rt->attention_factor;
                cs[half + i] = sinf(angle) * rt->attention_factor;
            }
        }
        const float *cos_v = cs, *sin_v = cs + half;
        for (int h = 0; h < job->n_heads; h++) {
            float *v = job->x + (t * job->n_heads + h) * job->head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cos_v[i] - b * sin_v[i];
                v[i + half] = b * cos_v[i] + a * sin_v[i];
            }
        }
    }
}

/* Frequencies of a rope table: short and long ones for longrope */
static int64_t table_freqs(const struct rope_table *t)
{
    return t->long_from > 0 ? t->rot_dim : t->rot_dim / 2;
}

static bool same_table(const struct rope_table *kept, const struct rope_table *t)
{
    return kept->rot_dim == t->rot_dim && kept->attention_factor == t->attention_factor &&
           kept->long_from == t->long_from &&
           !memcmp(kept->inv_freq, t->inv_freq, (size_t)table_freqs(t) * sizeof(float));
}

/* Grows *p to hold n elements of size each; false when memory is short. */
static bool grow(void **p, int64_t *cap, int64_t n, size_t size)
{
    if (n <= *cap)
        return true;
    void *q = realloc(*p, (size_t)n * size);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

/* The angle set holding these positions' cos and sin for table rope (its values, not its
 * address, compared), moved to the front with *computed true; else the least recently used
 * set, refilled with the key and sized for the angles the call computes (*computed false), or
 * NULL when memory is short. */
static struct cpu_rope_angles *rope_angles(struct cpu_impl *impl, const int32_t *positions,
                                           int64_t n, const struct rope_table *rope, bool *computed)
{
    struct cpu_rope_angles *sets = impl->angles, found;
    int i = 0;
    for (; i < CPU_ROPE_ANGLE_SETS; i++)
        if (sets[i].valid && sets[i].n == n && same_table(&sets[i].table, rope) &&
            !memcmp(sets[i].positions, positions, (size_t)n * sizeof *positions))
            break;
    *computed = i < CPU_ROPE_ANGLE_SETS;
    if (!*computed) {
        i = CPU_ROPE_ANGLE_SETS - 1;
        struct cpu_rope_angles *a = &sets[i];
        a->valid = false;
        int64_t nf = table_freqs(rope);
        if (!grow((void **)&a->positions, &a->positions_cap, n, sizeof *a->positions) ||
            !grow((void **)&a->cos_sin, &a->cos_sin_cap, n * rope->rot_dim, sizeof(float)) ||
            !grow((void **)&a->freq, &a->freq_cap, nf, sizeof(float)))
            return NULL;
        memcpy(a->positions, positions, (size_t)n * sizeof *positions);
        memcpy(a->freq, rope->inv_freq, (size_t)nf * sizeof(float));
        a->n = n;
        a->table = *rope;
        a->table.inv_freq = a->freq;
        a->valid = true;
    }
    found = sets[i];
    memmove(sets + 1, sets, (size_t)i * sizeof *sets);
    sets[0] = found;
    return &sets[0];
}

static void cpu_rope(struct backend *be, float *x, int64_t n_tokens, int n_heads, int head_dim,
                     const int32_t *positions, const struct rope_table *rope)
{
    struct cpu_impl *impl = impl_of(be);
    struct rope_job job = {x, n_tokens, n_heads, head_dim, positions, rope, NULL, false};
    struct cpu_rope_angles *a = rope_angles(impl, positions, n_tokens, rope, &job.computed);
    job.cos_sin = a ? a->cos_sin : NULL;
    /* held, a set's angles are computed when the loop runs, by the thread whose tokens they
     * are: the loops after it that read them split the same tokens */
    long items = 0;
    if (n_tokens == impl->hold_tokens && hold(be, rope_tokens, &job, sizeof job, &items, n_tokens))
        return;
    cpu_settle(be);
    if (n_tokens < 4) {
        rope_tokens(&job, 0, 1);
        return;
    }
    threadpool_run(impl->pool, rope_tokens, &job);
}

/* ---- elementwise -------------------------------------------------------- */

struct elementwise_job {
    const float *a, *b;
    float *out;
    int64_t n;
    long items; /* held: the step's token rows, each n / items elements; else 0 */
};

/* Thread ith's elements of job: whole token rows when held, else ELEMENTWISE_ALIGN blocks. */
static void elementwise_share(const struct elementwise_job *job, int ith, int nth, long *begin,
                              long *end)
{
    if (job->items > 0)
        share_of(job->n, job->items, ith, nth, begin, end);
    else
        threadpool_split(job->n, ith, nth, ELEMENTWISE_ALIGN, begin, end);
}

static void silu_mul_range(void *ctx, int ith, int nth)
{
    struct elementwise_job *job = ctx;
    long begin, end;
    elementwise_share(job, ith, nth, &begin, &end);
    long i = begin;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= end; i += 8) {
        __m256 g = _mm256_loadu_ps(job->a + i);
        __m256 e = vec_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(job->out + i, _mm256_mul_ps(s, _mm256_loadu_ps(job->b + i)));
    }
    if (i < end) {
        /* the tail through the same vector code, so an element's bits do not
         * depend on whether it ends the call (EXACT mode's batch invariance) */
        float g8[8] = {0}, u8[8] = {0}, o8[8];
        memcpy(g8, job->a + i, (size_t)(end - i) * sizeof(float));
        memcpy(u8, job->b + i, (size_t)(end - i) * sizeof(float));
        __m256 g = _mm256_loadu_ps(g8);
        __m256 e = vec_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 sg = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(o8, _mm256_mul_ps(sg, _mm256_loadu_ps(u8)));
        memcpy(job->out + i, o8, (size_t)(end - i) * sizeof(float));
    }
}

static void cpu_silu_mul(struct backend *be, const float *gate, const float *up, float *out,
                         int64_t n)
{
    struct elementwise_job job = {gate, up, out, n, 0};
    if (hold(be, silu_mul_range, &job, sizeof job, &job.items, n))
        return;
    if (n < 32768) {
        silu_mul_range(&job, 0, 1);
        return;
    }
    threadpool_run(impl_of(be)->pool, silu_mul_range, &job);
}

static void add_range(void *ctx, int ith, int nth)
{
    struct elementwise_job *job = ctx;
    long begin, end;
    elementwise_share(job, ith, nth, &begin, &end);
    for (long i = begin; i < end; i++)
        job->out[i] += job->a[i];
}

static void cpu_add(struct backend *be, float *y, const float *x, int64_t n)
{
    struct elementwise_job job = {x, NULL, y, n, 0};
    if (hold(be, add_range, &job, sizeof job, &job.items, n))
        return;
    if (n < 65536) {
        add_range(&job, 0, 1);
        return;
    }
    threadpool_run(impl_of(be)->pool, add_range, &job);
}

/* Gemma 3's elementwise ops: scalar libm, one element at a time, so an
 * element's bits never depend on its neighbours or the call's length. */
struct scalar_job {
    const float *a, *b;
    float *out;
    int64_t n;
    float s;
};

static void gelu_tanh_mul_range(void *ctx, int ith, int nth)
{
    struct scalar_job *job = ctx;
    long begin, end;
    threadpool_split(job->n, ith, nth, ELEMENTWISE_ALIGN, &begin, &end);
    const float k = 0.7978845608028654f; /* sqrt(2 / pi), as PyTorch's kBeta */
    for (long i = begin; i < end; i++) {
        float x = job->a[i];
        float inner = k * (x + 0.044715f * x * x * x);
        job->out[i] = 0.5f * x * (1.0f + tanhf(inner)) * job->b[i];
    }
}

static void scale_range(void *ctx, int ith, int nth)
{
    struct scalar_job *job = ctx;
    long begin, end;
    threadpool_split(job->n, ith, nth, ELEMENTWISE_ALIGN, &begin, &end);
    for (long i = begin; i < end; i++)
        job->out[i] *= job->s;
}

static void softcap_range(void *ctx, int ith, int nth)
{
    struct scalar_job *job = ctx;
    long begin, end;
    threadpool_split(job->n, ith, nth, ELEMENTWISE_ALIGN, &begin, &end);
    for (long i = begin; i < end; i++)
        job->out[i] = job->s * tanhf(job->out[i] / job->s);
}

static void run_scalar(struct backend *be, void (*fn)(void *, int, int), struct scalar_job *job)
{
    if (job->n < 16384) {
        fn(job, 0, 1);
        return;
    }
    threadpool_run(impl_of(be)->pool, fn, job);
}

static void cpu_gelu_tanh_mul(struct backend *be, const float *gate, const float *up, float *out,
                              int64_t n)
{
    cpu_settle(be);
    struct scalar_job job = {.a = gate, .b = up, .out = out, .n = n};
    run_scalar(be, gelu_tanh_mul_range, &job);
}

static void cpu_scale(struct backend *be, float *x, int64_t n, float s)
{
    cpu_settle(be);
    struct scalar_job job = {.out = x, .n = n, .s = s};
    run_scalar(be, scale_range, &job);
}

static void cpu_softcap(struct backend *be, float *x, int64_t n, float cap)
{
    cpu_settle(be);
    struct scalar_job job = {.out = x, .n = n, .s = cap};
    run_scalar(be, softcap_range, &job);
}

static void cpu_hold_row_ops(struct backend *be, int64_t n_tokens)
{
    impl_of(be)->hold_tokens = n_tokens > 0 ? n_tokens : 0;
    if (n_tokens <= 0)
        cpu_settle(be);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .memory_is_host = true,
    .embed = cpu_embed,
    .matmul = cpu_matmul_op,
    .matmul_group = cpu_matmul_group_op,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .kv_copy_slots = cpu_kv_copy_slots,
    .layer_norm = cpu_layer_norm,
    .gelu = cpu_gelu,
    .conv1d = cpu_conv1d,
    .attention_dense = cpu_attention_dense,
    .scatter_rows = cpu_scatter_rows,
    .moe_route = cpu_moe_route,
    .moe_ffn = cpu_moe_ffn,
    .gated_add = cpu_gated_add,
    .gelu_tanh_mul = cpu_gelu_tanh_mul,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .lora = cpu_lora,
    .hold_row_ops = cpu_hold_row_ops,
};

int backend_cpu_create(const struct backend_options *opt, struct backend **out,
                       struct err *err)
{
    struct cpu_features features;
    cpu_features_detect(opt->cpu_isa, &features);
    if (!features.avx2)
        return err_set(err, INFERD_EUNSUPPORTED,
                       opt->cpu_isa == CPU_ISA_SCALAR
                           ? "the CPU backend requires AVX2/FMA, which the scalar cap rules out"
                           : "this CPU lacks AVX2/FMA, which the CPU backend requires");
    if (opt->kv_quant) {
        int rc = cpu_kv_quant_check(opt->kv_quant, err);
        if (rc < 0)
            return rc;
    }
    struct backend *be = calloc(1, sizeof *be);
    struct cpu_impl *impl = calloc(1, sizeof *impl);
    if (!be || !impl) {
        free(be);
        free(impl);
        return err_set(err, INFERD_ENOMEM, "out of memory creating the CPU backend");
    }
    int rc = threadpool_create(opt->threads, &impl->pool, err);
    if (rc == 0)
        rc = cpu_matmul_create(impl->pool, &impl->matmul, err);
    if (rc == 0)
        rc = cpu_matmul_set_level(impl->matmul, cpu_matmul_level_of(&features), err);
    if (rc < 0) {
        cpu_matmul_free(impl->matmul);
        threadpool_free(impl->pool);
        free(impl);
        free(be);
        return rc;
    }
    be->ops = &cpu_ops;
    be->mode = opt->mode;
    /* FAST mode keeps K and V in f16: half the bytes decode attention
     * streams. EXACT mode's default stays f32; a quantized cache's records
     * (and the f32 rows of its unquantized layers) are what they are. */
    impl->f16c = features.f16c;
    be->kv_dtype = opt->kv_quant                      ? DTYPE_F32
                   : opt->kv_type == BACKEND_KV_F16   ? DTYPE_F16
                   : opt->kv_type == BACKEND_KV_F32   ? DTYPE_F32
                   : opt->mode == COMPUTE_FAST        ? DTYPE_F16
                                                      : DTYPE_F32;
    if (opt->kv_quant) {
        impl->kv_quant = *opt->kv_quant;
        kvq_codebooks_init(&impl->codebooks);
        impl->qattn_rows = features.avx512f && features.avx512bw && features.avx512vl
                               ? cpu_qattn_rows_avx512
                               : cpu_qattn_rows_avx2;
        be->kv_quant = &impl->kv_quant;
    }
    be->block_weights = true;
    be->copy_weights = false;
    be->read_weights = true; /* its allocations of 2 MB and more are huge pages */
    /* the vdpbf16ps kernels where they are the GEMM too (no AMX: on Sapphire
     * Rapids prompts go to AMX, which packs row-major weights itself) */
    be->bf16_panels = cpu_matmul_level_of(&features) == CPU_MATMUL_AVX512BF16 &&
                      !features.amx_bf16;
    be->impl = impl;
    *out = be;
    return 0;
}

struct threadpool *backend_cpu_threadpool(struct backend *be)
{
    return be && be->ops == &cpu_ops ? impl_of(be)->pool : NULL;
}

struct cpu_matmul *backend_cpu_matmul(struct backend *be)
{
    return be && be->ops == &cpu_ops ? impl_of(be)->matmul : NULL;
}
