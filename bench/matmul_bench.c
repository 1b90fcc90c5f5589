/* bench/matmul_bench.c — CPU matmul speed against the machine's own limits: GEMV vs read bandwidth, GEMM vs FMA peak.
 *
 * Usage: matmul_bench [THREADS [LEVEL [DTYPE [prefill|prefill-cpu|house]]]]
 *   THREADS 0 (default) = one per core; LEVEL scalar|avx2|avx512|avx512bf16|amx;
 *   DTYPE bf16 (default) or a GGUF block type: q8_0, q4_0, q4_1, q5_0, q5_1,
 *   q2_k, q3_k, q4_k, q5_k, q6_k (the int8 kernels of qmatmul*.c);
 *   prefill: only the quantized prefill table (each GEMM kernel the level
 *   and CPU allow against the decode kernels, T = 16, 128, 512);
 *   prefill-cpu: the same over the process's CPU time rather than the wall
 *   clock (per thread), so a loaded machine's time given to other
 *   processes is not counted (the pool's spinning is: never flattering);
 *   house: only a decode step's matmuls of the house model (models/house:
 *   6 layers of 384, 1024 MLP, 8192 vocabulary, 25 MB of bf16 weights, each
 *   matrix its own buffer, grouped as model/forward.c groups them), FAST,
 *   T = 1..8 rows: median us per step and its cost against one row's.
 * Shapes are Qwen3-0.6B's projections (K = in_features, N = out_features). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/qgemm.h"
#include "backend/cpu/qmatmul.h"
#include "base/cpu.h"
#include "base/bf16.h"
#include "base/panels.h"
#include "base/quant.h"
#include "base/threadpool.h"
#include "base/timer.h"

#define BANDWIDTH_BYTES ((size_t)1 << 30)
/* GEMV weights are cycled through copies adding up to at least this, so
 * every call streams from DRAM as it does in a real decode step. */
#define GEMV_STREAM_BYTES ((size_t)768 << 20)
#define GEMV_PASSES 10
#define GEMM_T 128
#define GEMM_RUNS 10

static const struct { long K, N; const char *what; } shapes[] = {
    {1024, 2048, "q_proj"},      {1024, 1024, "k/v_proj"}, {1024, 3072, "gate/up_proj"},
    {3072, 1024, "down_proj"},   {1024, 151936, "lm_head"},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static uint32_t rng = 2463534242u;

static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return (float)(int32_t)rng / 2147483648.0f;
}

/* Weights in transparent huge pages where the kernel grants them, as the
 * bandwidth probe's buffer is: 4 KiB pages cost about 10% of streaming
 * bandwidth on Zen 3 (TLB misses, prefetchers stopping at page ends). */
static uint16_t *random_bf16(size_t n)
{
    size_t huge = (size_t)2 << 20, bytes = (n * sizeof(uint16_t) + huge - 1) / huge * huge;
    uint16_t *w = aligned_alloc(huge, bytes);
    if (w && !getenv("BENCH_SMALL_PAGES"))
        madvise(w, bytes, MADV_HUGEPAGE);
    if (w)
        for (size_t i = 0; i < n; i++)
            w[i] = f32_to_bf16(rnd() * 0.05f);
    return w;
}

static float *random_f32(size_t n);

/* The weight type every shape is made in (main's DTYPE argument). */
struct bench_weights {
    enum dtype dtype;
    /* One quantized matrix per shape, made once: quantizing the K types is
     * slow, and copies of the same bytes stream from DRAM all the same. */
    void *proto[8];
    long proto_k[8], proto_n[8];
};

static size_t weight_bytes(enum dtype t, long K, long N)
{
    return (size_t)dtype_row_bytes(t, (uint64_t)K) * (size_t)N;
}

/* K x N weights of type t, in huge pages like random_bf16's. */
static void *random_weights(struct bench_weights *bw, long K, long N)
{
    if (bw->dtype == DTYPE_BF16)
        return random_bf16((size_t)K * (size_t)N);
    size_t huge = (size_t)2 << 20, bytes = weight_bytes(bw->dtype, K, N);
    void *proto = NULL;
    for (int i = 0; i < 8 && !proto; i++)
        if (bw->proto[i] && bw->proto_k[i] == K && bw->proto_n[i] == N)
            proto = bw->proto[i];
    if (!proto) {
        float *row = random_f32((size_t)K);
        proto = malloc(bytes);
        int slot = 0;
        while (slot < 7 && bw->proto[slot])
            slot++;
        if (!row || !proto) {
            free(row);
            free(proto);
            return NULL;
        }
        size_t rb = (size_t)dtype_row_bytes(bw->dtype, (uint64_t)K);
        for (long r = 0; r < N; r++) {
            for (long c = 0; c < K; c++)
                row[c] = rnd() * 0.05f;
            quant_quantize_row(bw->dtype, row, (uint8_t *)proto + (size_t)r * rb, K);
        }
        free(row);
        free(bw->proto[slot]);
        bw->proto[slot] = proto;
        bw->proto_k[slot] = K;
        bw->proto_n[slot] = N;
    }
    void *w = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (w && !getenv("BENCH_SMALL_PAGES"))
        madvise(w, (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
    if (w)
        memcpy(w, proto, bytes);
    return w;
}

static float *random_f32(size_t n)
{
    float *x = malloc(n * sizeof *x);
    if (x)
        for (size_t i = 0; i < n; i++)
            x[i] = rnd();
    return x;
}

/* Decode: T = 1, every call reading its weights from DRAM. Returns GB/s
 * over the best time of each call across passes: other work on the machine
 * only ever slows a call down, so the minimum is the undisturbed time. */
static double bench_gemv(struct cpu_matmul *mm, struct bench_weights *bw, long K, long N)
{
    size_t bytes = weight_bytes(bw->dtype, K, N);
    int copies = (int)((GEMV_STREAM_BYTES + bytes - 1) / bytes);
    struct weight_matrix *w = calloc((size_t)copies, sizeof *w);
    float *x = random_f32((size_t)K), *y = malloc((size_t)N * sizeof *y);
    double best = 0.0;
    if (!w || !x || !y)
        goto out;
    for (int c = 0; c < copies; c++) {
        w[c] = (struct weight_matrix){.dtype = bw->dtype, .rows = N, .cols = K,
                                      .data = random_weights(bw, K, N)};
        if (!w[c].data)
            goto out;
    }
    double *best_s = malloc((size_t)copies * sizeof *best_s);
    if (!best_s)
        goto out;
    for (int c = 0; c < copies; c++)
        best_s[c] = 1e30;
    for (int pass = 0; pass <= GEMV_PASSES; pass++) {
        for (int c = 0; c < copies; c++) {
            double t0 = now_s();
            cpu_matmul_run(mm, COMPUTE_EXACT, x, 1, &w[c], NULL, y);
            double dt = now_s() - t0;
            if (pass > 0 && dt < best_s[c]) /* pass 0 warms up */
                best_s[c] = dt;
        }
    }
    double total = 0.0;
    for (int c = 0; c < copies; c++)
        total += best_s[c];
    best = (double)bytes * copies / total * 1e-9;
    free(best_s);
out:
    for (int c = 0; w && c < copies; c++)
        free((void *)w[c].data);
    free(w);
    free(x);
    free(y);
    return best;
}

/* Prefill: T = 128 tokens. Returns GFLOP/s. */
static double bench_gemm(struct cpu_matmul *mm, struct bench_weights *bw, enum compute_mode mode,
                         long K, long N)
{
    void *wd = random_weights(bw, K, N);
    float *x = random_f32((size_t)GEMM_T * (size_t)K);
    float *y = malloc((size_t)GEMM_T * (size_t)N * sizeof *y);
    double best = 0.0;
    if (wd && x && y) {
        struct weight_matrix w = {.dtype = bw->dtype, .rows = N, .cols = K, .data = wd};
        cpu_matmul_run(mm, mode, x, GEMM_T, &w, NULL, y);
        for (int run = 0; run < GEMM_RUNS; run++) {
            double t0 = now_s();
            cpu_matmul_run(mm, mode, x, GEMM_T, &w, NULL, y);
            double g = 2.0 * GEMM_T * K * N / (now_s() - t0) * 1e-9;
            best = g > best ? g : best;
        }
    }
    free(wd);
    free(x);
    free(y);
    return best;
}

/* Batched decode: T tokens (one per sequence) through one matrix whose
 * weights come from DRAM each call (copies rotate past the caches). Returns
 * GFLOP/s. */
static double bench_small_batch(struct cpu_matmul *mm, struct bench_weights *bw, long K, long N,
                                long T)
{
    const int copies = 4;
    struct weight_matrix w[4];
    float *x = random_f32((size_t)T * (size_t)K);
    float *y = malloc((size_t)T * (size_t)N * sizeof *y);
    double best = 0.0;
    int made = 0;
    for (; made < copies; made++) {
        void *wd = random_weights(bw, K, N);
        if (!wd)
            break;
        w[made] = (struct weight_matrix){.dtype = bw->dtype, .rows = N, .cols = K, .data = wd};
    }
    if (made == copies && x && y) {
        for (int run = 0; run < 4 * copies; run++) {
            double t0 = now_s();
            cpu_matmul_run(mm, COMPUTE_FAST, x, T, &w[run % copies], NULL, y);
            double g = 2.0 * T * K * N / (now_s() - t0) * 1e-9;
            best = run >= copies && g > best ? g : best;
        }
    }
    for (int c = 0; c < made; c++)
        free((void *)w[c].data);
    free(x);
    free(y);
    return best;
}

/* Quantized prefill of T tokens through one matrix: gemm NULL runs the
 * decode kernels (EXACT, as a step below QGEMM_MIN_T does), else that GEMM
 * kernel by way of cpu_qmm_run, as cpu_matmul_run runs the level's in FAST
 * mode (x quantized and laid out inside the timing). Returns GFLOP/s, best
 * of PREFILL_RUNS after a warm-up. */
#define PREFILL_RUNS 10 /* prefill-cpu: 3 of 0.1 s each */

static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double bench_prefill(struct cpu_matmul *mm, struct threadpool *pool,
                            struct bench_weights *bw, qgemm_fn gemm, long K, long N, long T,
                            bool cpu_time)
{
    void *wd = random_weights(bw, K, N);
    float *x = random_f32((size_t)T * (size_t)K);
    float *y = malloc((size_t)T * (size_t)N * sizeof *y);
    struct qmm_scratch s = {0};
    double best = 0.0;
    if (wd && x && y) {
        const struct weight_matrix w = {.dtype = bw->dtype, .rows = N, .cols = K, .data = wd};
        const struct weight_matrix *wp = &w;
        const float *bias = NULL;
        const struct qmm_kernels *k = cpu_qmm_kernels_for(cpu_matmul_get_level(mm));
        int threads = threadpool_size(pool);
        for (int run = 0; run <= (cpu_time ? 3 : PREFILL_RUNS); run++) {
            double t0 = cpu_time ? process_cpu_s() : now_s(), w0 = now_s();
            int calls = 0;
            do { /* CPU time: calls for 0.1 s, the other threads' clocks
                    being read to a scheduler tick */
                if (gemm)
                    cpu_qmm_run(pool, k, gemm, COMPUTE_FAST, &s, x, T, 1, &wp, &bias, &y);
                else
                    cpu_matmul_run(mm, COMPUTE_EXACT, x, T, &w, NULL, y);
                calls++;
            } while (cpu_time && now_s() - w0 < 0.1);
            double dt = cpu_time ? (process_cpu_s() - t0) / threads : now_s() - t0;
            double g = 2.0 * T * K * N * calls / dt * 1e-9;
            best = run > 0 && g > best ? g : best;
        }
    }
    cpu_qmm_scratch_free(&s);
    free(wd);
    free(x);
    free(y);
    return best;
}

static void prefill_table(struct cpu_matmul *mm, struct threadpool *pool, struct bench_weights *bw,
                          bool cpu_time)
{
    enum cpu_matmul_level level = cpu_matmul_get_level(mm);
    const struct cpu_features *f = cpu_features();
    const struct {
        const char *name;
        qgemm_fn fn;
        bool runs;
    } all[] = {
        {"decode", NULL, true},
        {"avx2", cpu_qgemm_avx2, level >= CPU_MATMUL_AVX2},
        {"avxvnni", cpu_qgemm_avxvnni, level >= CPU_MATMUL_AVX2 && f->avx_vnni},
        {"vnni", cpu_qgemm_vnni, level >= CPU_MATMUL_AVX512 && f->avx512_vnni},
        {"amx", cpu_qgemm_amx, level == CPU_MATMUL_AMX && f->amx_int8 && f->amx_usable},
    };
    static const long ts[] = {16, 128, 512};
    qgemm_fn chosen = cpu_qgemm_kernel_for(level);
    printf("\nQuantized prefill, %s weights (GFLOP/s%s; decode = the decode kernels, EXACT;\n"
           "the others each GEMM kernel, FAST; * the one level %s runs)\n",
           dtype_name(bw->dtype), cpu_time ? " of CPU time per thread" : "",
           cpu_matmul_level_name(level));
    printf("  %-13s %6s %7s %5s", "shape", "K", "N", "T");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].runs)
            printf(" %8s%c", all[i].name, all[i].fn && all[i].fn == chosen ? '*' : ' ');
    printf("\n");
    for (int sh = 0; sh < N_SHAPES; sh++) {
        if (shapes[sh].N > 8192)
            continue; /* the LM head: minutes on the decode kernels */
        for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
            printf("  %-13s %6ld %7ld %5ld", shapes[sh].what, shapes[sh].K, shapes[sh].N, ts[ti]);
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                if (all[i].runs)
                    printf(" %9.1f", bench_prefill(mm, pool, bw, all[i].fn, shapes[sh].K,
                                                   shapes[sh].N, ts[ti], cpu_time));
            printf("\n");
            fflush(stdout);
        }
    }
}

/* The house model's decode step (see the usage note): q/k/v as one group,
 * o, gate/up as one group, down, per layer, then the tied LM head. */
#define HOUSE_LAYERS 6
#define HOUSE_STEPS 301

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* w (BF16, row-major) laid out in panels of 32 rows, as the loader does where
 * the CPU backend asks for it (backend.bf16_panels). */
static struct weight_matrix house_panels(const struct weight_matrix *w)
{
    void *packed = aligned_alloc(64, (panels_bytes(w->rows, w->cols) + 63) / 64 * 64);
    if (!packed) {
        fprintf(stderr, "matmul_bench: out of memory\n");
        exit(1);
    }
    panels_pack(w->data, w->rows, w->cols, packed);
    return (struct weight_matrix){.dtype = DTYPE_BF16_P32, .rows = w->rows, .cols = w->cols,
                                  .data = packed};
}

/* One decode step's matmuls over w (per layer: q, k, v, o, gate, up, down) and head. */
static void house_step(struct cpu_matmul *mm, struct weight_matrix w[HOUSE_LAYERS][7],
                       const struct weight_matrix *head, const float *x, long T, float **y)
{
    for (int l = 0; l < HOUSE_LAYERS; l++) {
        const struct weight_matrix *qkv[3] = {&w[l][0], &w[l][1], &w[l][2]};
        const struct weight_matrix *gu[2] = {&w[l][4], &w[l][5]};
        const float *nob[3] = {NULL, NULL, NULL};
        cpu_matmul_run_group(mm, COMPUTE_FAST, x, T, 3, qkv, nob, y);
        cpu_matmul_run(mm, COMPUTE_FAST, x, T, &w[l][3], NULL, y[3]);
        cpu_matmul_run_group(mm, COMPUTE_FAST, x, T, 2, gu, nob, y);
        cpu_matmul_run(mm, COMPUTE_FAST, x, T, &w[l][6], NULL, y[3]);
    }
    cpu_matmul_run(mm, COMPUTE_FAST, x, T, head, NULL, y[0]);
}

/* The step's median time in us at T rows. */
static double house_median(struct cpu_matmul *mm, struct weight_matrix w[HOUSE_LAYERS][7],
                           const struct weight_matrix *head, const float *x, long T, float **y)
{
    static double times[HOUSE_STEPS];
    for (int it = 0; it < HOUSE_STEPS; it++) {
        double t0 = now_s();
        house_step(mm, w, head, x, T, y);
        times[it] = (now_s() - t0) * 1e6;
    }
    qsort(times, HOUSE_STEPS, sizeof times[0], cmp_double);
    return times[HOUSE_STEPS / 2];
}

/* Row-major BF16 weights and, where the level has the kernels for them
 * (AVX512-BF16 and up), the same weights in panels, the layouts taking turns
 * at each T. */
static void house_table(struct cpu_matmul *mm)
{
    enum { D = 384, KV = 128, F = 1024, V = 8192 };
    struct weight_matrix w[2][HOUSE_LAYERS][7], head[2];
    static const long dims[7][2] = {{D, D}, {D, KV}, {D, KV}, {D, D}, {D, F}, {D, F}, {F, D}};
    bool panels = cpu_matmul_get_level(mm) >= CPU_MATMUL_AVX512BF16;
    for (int l = 0; l < HOUSE_LAYERS; l++)
        for (int m = 0; m < 7; m++) {
            w[0][l][m] = (struct weight_matrix){.dtype = DTYPE_BF16, .rows = dims[m][1],
                                                .cols = dims[m][0],
                                                .data = random_bf16((size_t)dims[m][0] * dims[m][1])};
            if (panels)
                w[1][l][m] = house_panels(&w[0][l][m]);
        }
    head[0] = (struct weight_matrix){.dtype = DTYPE_BF16, .rows = V, .cols = D,
                                     .data = random_bf16((size_t)V * D)};
    if (panels)
        head[1] = house_panels(&head[0]);
    float *x = random_f32((size_t)8 * F), *y[4];
    for (int i = 0; i < 4; i++)
        y[i] = malloc(sizeof(float) * 8 * V);
    printf("\nHouse model decode step, bf16 weights, FAST (us per step, median of %d)\n",
           HOUSE_STEPS);
    printf("  %-5s %20s %s\n", "rows", "row-major", panels ? "            in panels" : "");
    double one[2] = {0.0, 0.0};
    for (long T = 1; T <= 8; T++) {
        printf("  T=%-3ld", T);
        for (int layout = 0; layout <= (int)panels; layout++) {
            double med = house_median(mm, w[layout], &head[layout], x, T, y);
            if (T == 1)
                one[layout] = med;
            printf(" %9.1f us (%5.2fx)", med, med / one[layout]);
        }
        printf("\n");
    }
    for (int i = 0; i < 4; i++)
        free(y[i]);
    free(x);
    for (int layout = 0; layout <= (int)panels; layout++) {
        free((void *)head[layout].data);
        for (int l = 0; l < HOUSE_LAYERS; l++)
            for (int m = 0; m < 7; m++)
                free((void *)w[layout][l][m].data);
    }
}

int main(int argc, char **argv)
{
    int n_threads = argc > 1 ? atoi(argv[1]) : 0;
    struct threadpool *pool = NULL;
    struct cpu_matmul *mm = NULL;
    struct err err = {0};
    if (threadpool_create(n_threads, &pool, &err) < 0 || cpu_matmul_create(pool, &mm, &err) < 0) {
        fprintf(stderr, "matmul_bench: %s\n", err.msg);
        return 1;
    }
    struct bench_weights wt = {.dtype = DTYPE_BF16};
    if (argc > 3) {
        int t = -1;
        for (int d = DTYPE_BF16; d < DTYPE_COUNT; d++)
            if (!strcasecmp(argv[3], dtype_name((enum dtype)d)))
                t = d;
        if (t < 0 || t == DTYPE_F16) {
            fprintf(stderr, "matmul_bench: unknown weight type '%s'\n", argv[3]);
            return 1;
        }
        wt.dtype = (enum dtype)t;
    }
    if (argc > 2 && strcmp(argv[2], "best")) {
        int level = -1;
        for (int l = 0; l < CPU_MATMUL_N_LEVELS; l++)
            if (!strcmp(argv[2], cpu_matmul_level_name((enum cpu_matmul_level)l)))
                level = l;
        if (cpu_matmul_set_level(mm, (enum cpu_matmul_level)level, &err) < 0) {
            fprintf(stderr, "matmul_bench: %s\n", err.msg);
            return 1;
        }
    }
    printf("level            %s, %d threads, %s weights\n",
           cpu_matmul_level_name(cpu_matmul_get_level(mm)), threadpool_size(pool),
           dtype_name(wt.dtype));
    if (argc > 4 && !strcmp(argv[4], "house")) {
        house_table(mm);
        cpu_matmul_free(mm);
        threadpool_free(pool);
        return 0;
    }
    if (argc > 4 && (!strcmp(argv[4], "prefill") || !strcmp(argv[4], "prefill-cpu"))) {
        if (!cpu_qgemm_takes(wt.dtype)) {
            fprintf(stderr, "matmul_bench: %s weights have no prefill GEMM\n",
                    dtype_name(wt.dtype));
            return 1;
        }
        prefill_table(mm, pool, &wt, !strcmp(argv[4], "prefill-cpu"));
        for (int i = 0; i < 8; i++)
            free(wt.proto[i]);
        cpu_matmul_free(mm);
        threadpool_free(pool);
        return 0;
    }
    double bw = 0.0, peak = 0.0;
    for (int i = 0; i < 3; i++) { /* best of three: the machine may be shared */
        double b = cpu_measure_read_bandwidth(pool, BANDWIDTH_BYTES);
        double p = cpu_measure_fma_peak_gflops(pool, cpu_matmul_detect_level());
        bw = b > bw ? b : bw;
        peak = p > peak ? p : peak;
    }
    printf("read bandwidth   %.1f GB/s (1 GiB buffer, best of 15 passes)\n", bw);
    printf("fma peak         %.1f GFLOP/s (f32 FMA on the widest vectors)\n", peak);

    printf("\nGEMV, T=1, %s weights streamed from DRAM\n", dtype_name(wt.dtype));
    printf("  %-13s %6s %7s %9s %9s\n", "shape", "K", "N", "GB/s", "of bw");
    for (int s = 0; s < N_SHAPES; s++) {
        double g = bench_gemv(mm, &wt, shapes[s].K, shapes[s].N);
        printf("  %-13s %6ld %7ld %9.1f %8.0f%%\n", shapes[s].what, shapes[s].K, shapes[s].N, g,
               100.0 * g / bw);
    }

    static const long batch_t[] = {2, 4, 8, 12, 16};
    printf("\nBatched decode, %s weights from DRAM, FAST (GFLOP/s)\n", dtype_name(wt.dtype));
    printf("  %-13s %6s %7s", "shape", "K", "N");
    for (size_t i = 0; i < sizeof batch_t / sizeof batch_t[0]; i++)
        printf("  T=%-5ld", batch_t[i]);
    printf("\n");
    for (int s = 0; s < N_SHAPES; s++) {
        if (shapes[s].N > 8192)
            continue; /* the LM head: too large to rotate copies of */
        printf("  %-13s %6ld %7ld", shapes[s].what, shapes[s].K, shapes[s].N);
        for (size_t i = 0; i < sizeof batch_t / sizeof batch_t[0]; i++)
            printf("  %7.1f", bench_small_batch(mm, &wt, shapes[s].K, shapes[s].N, batch_t[i]));
        printf("\n");
    }

    printf("\nGEMM, T=%d, %s weights\n", GEMM_T, dtype_name(wt.dtype));
    printf("  %-13s %6s %7s %12s %8s %12s %8s\n", "shape", "K", "N", "EXACT GF/s", "of peak",
           "FAST GF/s", "of peak");
    for (int s = 0; s < N_SHAPES; s++) {
        double e = bench_gemm(mm, &wt, COMPUTE_EXACT, shapes[s].K, shapes[s].N);
        double f = bench_gemm(mm, &wt, COMPUTE_FAST, shapes[s].K, shapes[s].N);
        printf("  %-13s %6ld %7ld %12.1f %7.0f%% %12.1f %7.0f%%\n", shapes[s].what, shapes[s].K,
               shapes[s].N, e, 100.0 * e / peak, f, 100.0 * f / peak);
    }
    printf("\ngemm rate        %.1f GFLOP/s (cpu_measure_gemm_gflops, FAST)\n",
           cpu_measure_gemm_gflops(mm, COMPUTE_FAST));
    for (int i = 0; i < 8; i++)
        free(wt.proto[i]);
    cpu_matmul_free(mm);
    threadpool_free(pool);
    return 0;
}
