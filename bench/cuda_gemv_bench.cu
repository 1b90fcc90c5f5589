/* bench/cuda_gemv_bench.cu — the decode GEMVs of a layer alone on the GPU: each bf16 matrix shape of
 * a model's layer (q/k/v with its RMSNorm folded in, o and down with the residual add, the gate/up
 * SwiGLU pair) through cu_launch_gemv as a decode step launches it, timed back to back over enough
 * copies of the weights that none comes from L2, against a plain read of the same bytes.
 *
 * Usage: cuda_gemv_bench [MODEL [TOKENS [REPS [gemv|skinny [TYPE]]]]]
 *   MODEL llama-3.1-8b (default), llama-3.2-1b or qwen3-0.6b: the layer shapes; TOKENS token rows
 *   per product (default 1, at most 8); REPS timed launches per shape (default 200); the kernel:
 *   the GEMV kernels, or the tensor-core skinny GEMM (gemm_skinny.cu) of a speculative verify or
 *   small batched step, by default as a step routes TOKENS rows (the skinny GEMM past
 *   CU_GEMV_DEFAULT_ROWS; a step launches its RMSNorms on their own there, not timed here); TYPE
 *   the weights: bf16 (default), q8_0, q4_k, q6_k, or q4_k_m (down in Q6_K, the rest Q4_K, as the
 *   heavier layers of a Q4_K_M file), random codes with small scales, through the block GEMVs a
 *   FAST-mode step runs (x quantized to int8 blocks). Prints, per
 *   shape and for the whole layer in order, µs per launch, the bytes of weights read per second and
 *   that rate over the read kernel's in the same run. FAST mode (x rounded to bf16), programmatic
 *   dependent launches on where the GPU has them: what `inferd bench --device cuda` replays. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

struct layer_shape {
    const char *model;
    int64_t hidden, q_rows, kv_rows, o_cols, inter;
};

static const struct layer_shape shapes[] = {
    {"llama-3.1-8b", 4096, 4096, 1024, 4096, 14336},
    {"llama-3.2-1b", 2048, 2048, 512, 2048, 8192},
    {"qwen3-0.6b", 1024, 2048, 1024, 2048, 3072},
};

enum gemv_kind { GK_QKV, GK_O, GK_PAIR, GK_DOWN, GK_N };
static const char *const kind_names[GK_N] = {"q/k/v + RMSNorm", "o + residual", "gate/up pair",
                                             "down + residual"};

#define CHECK(call)                                                                           \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "cuda_gemv_bench: %s: %s\n", #call, cudaGetErrorString(e_));      \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* One kind's matrices: copies enough that their bytes pass L2 many times over. */
struct kind_bufs {
    int64_t rows[2], cols; /* rows of each matrix (the pair: gate, up; q/k/v: all in one) */
    int n_mat;
    enum dtype dtype;
    size_t bytes;          /* weights read by one launch */
    int copies;
    void **w;              /* copies x n_mat */
    float *y[2];
};

/* A well-mixed 32-bit value of index i and seed. */
static __device__ __forceinline__ uint32_t fill_hash(size_t i, uint32_t seed)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    return h ^ h >> 13;
}

static __global__ void fill_bf16(uint16_t *w, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = fill_hash(i, seed);
        float v = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.05f;
        w[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}

/* n_blocks blocks of a block type, random codes, each block's scales set to
 * small finite halves (at bytes [scale_at, scale_at + 2 * n_scales)) so no
 * product overflows. */
static __global__ void fill_blocks(uint8_t *w, size_t n_blocks, int block_bytes, int scale_at,
                                   int n_scales, uint32_t seed)
{
    size_t n = n_blocks * (size_t)block_bytes;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = fill_hash(i, seed);
        int at = (int)(i % (size_t)block_bytes) - scale_at;
        if (at >= 0 && at < 2 * n_scales)
            h = at & 1 ? 0x1c : 0x00; /* the half 0x1c00: 2^-8 */
        w[i] = (uint8_t)h;
    }
}

static void fill_weights(void *w, enum dtype dt, int64_t rows, int64_t cols, uint32_t seed)
{
    size_t n = (size_t)rows * (size_t)cols;
    if (dt == DTYPE_BF16) {
        fill_bf16<<<1024, 256>>>((uint16_t *)w, n, seed);
        return;
    }
    int bb = (int)dtype_block_bytes(dt), at = dt == DTYPE_Q6_K ? 208 : 0;
    int ns = dt == DTYPE_Q4_K ? 2 : 1; /* Q4_K: d and dmin */
    fill_blocks<<<1024, 256>>>((uint8_t *)w, n / (size_t)dtype_block_elems(dt), bb, at, ns, seed);
}

/* Reads n 16-byte words (the reference: what a kernel that does nothing else reaches). */
static __global__ void read_all(const uint4 *p, size_t n, unsigned *sink)
{
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u)
        *sink = acc;
}

static void kind_setup(struct kind_bufs *k, enum gemv_kind kind, const struct layer_shape *s,
                       int tokens, enum dtype dt)
{
    memset(k, 0, sizeof *k);
    k->n_mat = 1;
    k->dtype = dt;
    switch (kind) {
    case GK_QKV:
        k->rows[0] = s->q_rows + 2 * s->kv_rows;
        k->cols = s->hidden;
        break;
    case GK_O:
        k->rows[0] = s->hidden;
        k->cols = s->o_cols;
        break;
    case GK_PAIR:
        k->rows[0] = k->rows[1] = s->inter;
        k->cols = s->hidden;
        k->n_mat = 2;
        break;
    default:
        k->rows[0] = s->hidden;
        k->cols = s->inter;
        break;
    }
    k->bytes = 0;
    for (int m = 0; m < k->n_mat; m++)
        k->bytes += (size_t)k->rows[m] * dtype_row_bytes(dt, (uint64_t)k->cols);
    size_t want = (size_t)1 << 30; /* 1 GiB of copies: ~20 times L2 */
    k->copies = (int)((want + k->bytes - 1) / k->bytes);
    if (k->copies < 2)
        k->copies = 2;
    k->w = (void **)calloc((size_t)k->copies * k->n_mat, sizeof *k->w);
    for (int c = 0; c < k->copies; c++)
        for (int m = 0; m < k->n_mat; m++) {
            CHECK(cudaMalloc(&k->w[c * k->n_mat + m],
                             (size_t)k->rows[m] * dtype_row_bytes(dt, (uint64_t)k->cols)));
            fill_weights(k->w[c * k->n_mat + m], dt, k->rows[m], k->cols, (uint32_t)(c * 7 + m + 1));
        }
    for (int m = 0; m < k->n_mat; m++)
        CHECK(cudaMalloc(&k->y[m], (size_t)tokens * (size_t)k->rows[m] * sizeof(float)));
    CHECK(cudaGetLastError());
}

static void kind_free(struct kind_bufs *k)
{
    for (int i = 0; i < k->copies * k->n_mat; i++)
        cudaFree(k->w[i]);
    free(k->w);
    for (int m = 0; m < k->n_mat; m++)
        cudaFree(k->y[m]);
}

/* Everything one launch of kind over copy c reads and writes. */
struct io {
    float *x, *res, *norm_w, *norm_out;
    void *xq; /* the int8 image of x the block GEMVs quantize into */
    size_t xq_bytes;
};

static struct cu_gemv_args kind_args(const struct kind_bufs *k, enum gemv_kind kind, int c,
                                     int tokens, bool skinny, const struct io *io)
{
    struct cu_gemv_args a;
    memset(&a, 0, sizeof a);
    a.x = io->x;
    a.cols = k->cols;
    a.dtype = k->dtype;
    a.n_rows = tokens;
    a.xq = io->xq;
    a.xq_bytes = io->xq_bytes;
    a.qstream = true;
    a.n_mat = k->n_mat;
    a.round_bf16 = true;
    a.pair = kind == GK_PAIR;
    for (int m = 0; m < k->n_mat; m++) {
        a.m[m].w = k->w[c * k->n_mat + m];
        a.m[m].rows = k->rows[m];
        a.m[m].y = k->y[m];
    }
    if (skinny) {
        if (kind == GK_O || kind == GK_DOWN)
            a.res = io->res;
    } else if (kind == GK_QKV || kind == GK_PAIR) {
        a.norm_w = io->norm_w;
        a.norm_out = io->norm_out;
        a.norm_eps = 1e-5f;
    } else {
        a.res = io->res;
    }
    return a;
}

static cudaError_t launch(struct cu_device *dev, cudaStream_t st, const struct cu_gemv_args *a,
                          bool skinny)
{
    return skinny ? cu_launch_gemm_skinny(dev, st, a) : cu_launch_gemv(dev, st, a);
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : "llama-3.1-8b";
    int tokens = argc > 2 ? atoi(argv[2]) : 1;
    int reps = argc > 3 ? atoi(argv[3]) : 200;
    bool skinny = argc > 4 ? !strcmp(argv[4], "skinny") : tokens > CU_GEMV_DEFAULT_ROWS;
    const struct layer_shape *s = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].model, model))
            s = &shapes[i];
    bool kernel_ok = argc <= 4 || !strcmp(argv[4], "gemv") || !strcmp(argv[4], "skinny");
    const char *type = argc > 5 ? argv[5] : "bf16";
    /* each kind's weights: q/k/v, o, the pair, down */
    enum dtype kind_dt[GK_N] = {DTYPE_BF16, DTYPE_BF16, DTYPE_BF16, DTYPE_BF16};
    bool type_ok = true;
    if (!strcmp(type, "q4_k_m")) {
        kind_dt[GK_QKV] = kind_dt[GK_O] = kind_dt[GK_PAIR] = DTYPE_Q4_K;
        kind_dt[GK_DOWN] = DTYPE_Q6_K;
    } else if (strcmp(type, "bf16")) {
        enum dtype dt = !strcmp(type, "q8_0")   ? DTYPE_Q8_0
                        : !strcmp(type, "q4_k") ? DTYPE_Q4_K
                        : !strcmp(type, "q6_k") ? DTYPE_Q6_K
                                                : DTYPE_COUNT;
        type_ok = dt != DTYPE_COUNT;
        for (int i = 0; i < GK_N; i++)
            kind_dt[i] = dt;
    }
    if (!s || tokens < 1 || tokens > 8 || reps < 1 || !kernel_ok || !type_ok ||
        (skinny && (kind_dt[0] != DTYPE_BF16 || !cu_skinny_takes(tokens, s->hidden)))) {
        fprintf(stderr, "usage: cuda_gemv_bench [llama-3.1-8b|llama-3.2-1b|qwen3-0.6b [TOKENS 1-8 "
                        "[REPS [gemv|skinny [bf16|q8_0|q4_k|q6_k|q4_k_m]]]]] (the skinny GEMM: "
                        "bf16 only)\n");
        return 2;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    struct cu_device dev;
    memset(&dev, 0, sizeof dev);
    dev.n_sm = prop.multiProcessorCount;
    dev.smem_optin = (int)prop.sharedMemPerBlockOptin;
    dev.pdl = prop.major >= 9;
    printf("%s, %d SMs; %s layer, %s weights, %d token row(s), %s, %d launches per shape\n",
           prop.name, dev.n_sm, s->model, type, tokens, skinny ? "skinny GEMM" : "GEMV kernels",
           reps);

    int64_t widest = s->inter > s->hidden ? s->inter : s->hidden;
    struct io io;
    size_t xbytes = (size_t)tokens * (size_t)widest * sizeof(float);
    CHECK(cudaMalloc(&io.x, xbytes));
    CHECK(cudaMalloc(&io.res, xbytes));
    CHECK(cudaMalloc(&io.norm_out, xbytes));
    CHECK(cudaMalloc(&io.norm_w, (size_t)widest * sizeof(float)));
    io.xq_bytes = cu_qgemv_int8_bytes(DTYPE_Q8_0, tokens, widest); /* the largest image */
    CHECK(cudaMalloc(&io.xq, io.xq_bytes));
    {
        float *h = (float *)malloc(xbytes);
        for (size_t i = 0; i < xbytes / sizeof(float); i++)
            h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        CHECK(cudaMemcpy(io.x, h, xbytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(io.res, h, xbytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(io.norm_w, h, (size_t)widest * sizeof(float), cudaMemcpyHostToDevice));
        free(h);
    }
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    unsigned *sink;
    CHECK(cudaMalloc(&sink, sizeof *sink));

    /* the reference: a plain read of 1 GiB */
    size_t ref_bytes = (size_t)1 << 30;
    uint4 *ref;
    CHECK(cudaMalloc(&ref, ref_bytes));
    CHECK(cudaMemset(ref, 1, ref_bytes));
    float best = 1e30f;
    for (int i = 0; i < 5; i++) {
        CHECK(cudaEventRecord(e0, st));
        read_all<<<dev.n_sm * 8, 512, 0, st>>>(ref, ref_bytes / 16, sink);
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best = ms < best ? ms : best;
    }
    CHECK(cudaFree(ref));
    double ref_gbs = (double)ref_bytes / (best * 1e-3) / 1e9;
    printf("read kernel: %.0f GB/s (1 GiB, best of 5)\n", ref_gbs);

    struct kind_bufs k[GK_N];
    for (int i = 0; i < GK_N; i++)
        kind_setup(&k[i], (enum gemv_kind)i, s, tokens, kind_dt[i]);
    CHECK(cudaDeviceSynchronize());

    double layer_bytes = 0;
    for (int i = 0; i < GK_N; i++) {
        struct kind_bufs *kb = &k[i];
        layer_bytes += (double)kb->bytes;
        for (int pass = 0; pass < 2; pass++) { /* a warm-up pass, then the timed one */
            CHECK(cudaEventRecord(e0, st));
            for (int r = 0; r < reps; r++) {
                struct cu_gemv_args a =
                    kind_args(kb, (enum gemv_kind)i, r % kb->copies, tokens, skinny, &io);
                CHECK(launch(&dev, st, &a, skinny));
            }
            CHECK(cudaEventRecord(e1, st));
            CHECK(cudaEventSynchronize(e1));
        }
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        double us = 1e3 * ms / reps, gbs = (double)kb->bytes / (us * 1e-6) / 1e9;
        printf("%-16s %6lld x %-6lld %8.1f MB %8.2f us %6.0f GB/s %5.1f%% of read\n",
               kind_names[i], (long long)(kb->rows[0] * kb->n_mat), (long long)kb->cols,
               kb->bytes / 1e6, us, gbs, 100.0 * gbs / ref_gbs);
    }
    /* the layer in order, layer after layer (each its own copy) */
    int layers = k[GK_DOWN].copies;
    for (int i = 0; i < GK_N; i++)
        layers = k[i].copies < layers ? k[i].copies : layers;
    for (int pass = 0; pass < 2; pass++) {
        CHECK(cudaEventRecord(e0, st));
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < GK_N; i++) {
                struct cu_gemv_args a =
                    kind_args(&k[i], (enum gemv_kind)i, r % layers, tokens, skinny, &io);
                CHECK(launch(&dev, st, &a, skinny));
            }
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
    }
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    double us = 1e3 * ms / reps, gbs = layer_bytes / (us * 1e-6) / 1e9;
    printf("%-16s %24.1f MB %8.2f us %6.0f GB/s %5.1f%% of read (floor at the read rate %.2f us)\n",
           "layer", layer_bytes / 1e6, us, gbs, 100.0 * gbs / ref_gbs,
           layer_bytes / (ref_gbs * 1e9) * 1e6);
    for (int i = 0; i < GK_N; i++)
        kind_free(&k[i]);
    return 0;
}
