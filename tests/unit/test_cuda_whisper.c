/* tests/unit/test_cuda_whisper.c — Whisper on the CUDA backend against the CPU backend: the four
 * encoder-decoder ops on odd shapes (one test each), the whisper-tiny shape's encoder output and decoder logits,
 * decode steps replayed from CUDA graphs against eager ones, and a whole greedy transcription. Skipped, saying why, without a GPU.
 *
 * Tolerance: both backends compute in f32 (EXACT mode); they differ only in
 * the order of their sums (the CPU's blocked matmul against the GPU's GEMV,
 * a two-pass softmax against an online one), each ~1e-7 relative per
 * operation. Through four pre-LN layers that stays under 1e-4 of the
 * activations' scale in practice; the bound asserted is 1e-3 of the scale,
 * the one the transformers parity test holds the CPU to, so CUDA is held to
 * the same standard. The ops alone are held to 1e-4. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "backend/cuda/cuda.h"
#include "engine/transcribe.h"
#include "model/whisper.h"
#include "test_support.h"
#include "tools/mkwhisper.h"

static void skip_without_gpu(void)
{
    if (!backend_cuda_compiled())
        cr_skip_test("inferd was built without CUDA: Whisper on CUDA not checked");
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA GPU on this machine: Whisper on CUDA not checked");
}

/* The CPU backend, or CUDA's (with gemm_f32, the many-row f32 matmuls on cuBLASLt's GEMM, as
 * serve's Whisper backend runs them). */
static struct backend *make_backend_gemm(bool cuda, bool gemm_f32)
{
    struct backend *be = NULL;
    struct err err = {0};
    struct backend_options opt = {.mode = COMPUTE_EXACT, .threads = 2,
                                  .cuda_gemm_f32 = gemm_f32 ? BACKEND_ON : BACKEND_DEFAULT};
    int rc = cuda ? backend_cuda_create(0, &opt, &be, &err) : backend_cpu_create(&opt, &be, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    return be;
}

static struct backend *make_backend(bool cuda) { return make_backend_gemm(cuda, false); }

/* Fails the test, naming what ran, when the backend has failed (a CUDA error is sticky in the
 * backend: every op after it does nothing, and status reports the first). */
static void check(struct backend *be, const char *what)
{
    if (!be->ops->status) /* a backend without deferred errors (the CPU's) */
        return;
    struct err err = {0};
    int rc = be->ops->status(be, &err);
    cr_assert_eq(rc, 0, "%s on %s: %s (rc %d)", what, be->ops->name, err.msg, rc);
}

static float *upload(struct backend *be, const float *host, size_t n, const char *what)
{
    float *d = be->ops->alloc(be, n * sizeof *d);
    cr_assert_not_null(d, "%s: no %zu bytes on %s", what, n * sizeof *d, be->ops->name);
    be->ops->to_device(be, d, host, n * sizeof *d);
    check(be, what);
    return d;
}

static float *download(struct backend *be, const float *dev, size_t n, const char *what)
{
    check(be, what); /* the op itself, before the copy syncs with it */
    float *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    be->ops->to_host(be, h, dev, n * sizeof *h);
    check(be, what);
    return h;
}

static void fill(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }
}

static float max_rel_diff(const float *a, const float *b, size_t n)
{
    float worst = 0, scale = 1e-6f;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(b[i]), "element %zu is %g", i, b[i]);
        worst = fmaxf(worst, fabsf(a[i] - b[i]));
        scale = fmaxf(scale, fabsf(a[i]));
    }
    return worst / scale;
}

/* The ops on both backends, on the same inputs: shapes that are not multiples of the kernels'
 * tiles, causal and full attention, the stride-2 convolution, LayerNorm in place. One test per
 * op, each checking the backend after every call, so a failing op is named rather than
 * leaving the ones after it to fail (or fault) on a backend already broken. */
enum { ROWS = 37, DIM = 200, HEADS = 3, HD = 64, NKV = 101, CIN = 13, COUT = 24, NIN = 29 };

Test(cuda_whisper, layer_norm_and_gelu_match_the_cpu, .timeout = 300)
{
    skip_without_gpu();
    struct backend *cpu = make_backend(false), *gpu = make_backend(true);
    size_t nx = (size_t)ROWS * DIM;
    float *x = malloc(nx * sizeof *x), *w = malloc(DIM * sizeof *w), *b = malloc(DIM * sizeof *b);
    fill(x, nx, 1);
    fill(w, DIM, 2);
    fill(b, DIM, 3);
    float *outs[2];
    for (int k = 0; k < 2; k++) {
        struct backend *be = k ? gpu : cpu;
        float *dx = upload(be, x, nx, "upload x"), *dw = upload(be, w, DIM, "upload weight"),
              *db = upload(be, b, DIM, "upload bias");
        be->ops->layer_norm(be, dx, dw, db, ROWS, DIM, 1e-5f, dx); /* in place */
        check(be, "layer_norm");
        be->ops->gelu(be, dx, (int64_t)nx);
        outs[k] = download(be, dx, nx, "gelu");
        be->ops->release(be, dx);
        be->ops->release(be, dw);
        be->ops->release(be, db);
        check(be, "release");
    }
    cr_assert_leq(max_rel_diff(outs[0], outs[1], nx), 1e-5f, "layer_norm + gelu");
    free(outs[0]);
    free(outs[1]);
    free(x), free(w), free(b);
    backend_destroy(cpu);
    backend_destroy(gpu);
}

/* Row counts and key counts of the dense attention: many queries (one split), a decode step
 * and a short prompt over the decoder's keys and over the encoder's 1,500 (split keys, merged). */
static const struct { int rows, n_kv; } dense_shapes[] = {{ROWS, NKV}, {1, NKV}, {5, NKV},
                                                          {1, 1500}, {3, 1500}, {1, 300}};

Test(cuda_whisper, dense_attention_matches_the_cpu, .timeout = 300)
{
    skip_without_gpu();
    struct backend *cpu = make_backend(false), *gpu = make_backend(true);
    /* q rows x (HEADS * HD), K/V rows strided wider than the heads */
    int64_t qd = HEADS * HD, stride = qd + 16;
    for (size_t sh = 0; sh < sizeof dense_shapes / sizeof dense_shapes[0]; sh++) {
        int rows = dense_shapes[sh].rows, n_kv = dense_shapes[sh].n_kv;
        size_t nq = (size_t)rows * qd, nk = (size_t)n_kv * stride;
        float *q = malloc(nq * sizeof *q), *kv = malloc(2 * nk * sizeof *kv), *outs[2];
        fill(q, nq, 4 + sh);
        fill(kv, 2 * nk, 5 + sh);
        /* full, causal from the start, and a decode step's causal (the last rows' keys) */
        int64_t causals[] = {-1, 40, n_kv - rows};
        for (int c = 0; c < 3; c++) {
            int64_t causal = causals[c];
            for (int k = 0; k < 2; k++) {
                struct backend *be = k ? gpu : cpu;
                float *dq = upload(be, q, nq, "upload q"), *dk = upload(be, kv, nk, "upload k"),
                      *dv = upload(be, kv + nk, nk, "upload v");
                float *dout = be->ops->alloc(be, nq * sizeof(float));
                cr_assert_not_null(dout);
                be->ops->attention_dense(be, dq, rows, dk, dv, n_kv, stride, HEADS, HD,
                                         1.0f / sqrtf((float)HD), causal, dout);
                outs[k] = download(be, dout, nq, "attention_dense");
                be->ops->release(be, dq);
                be->ops->release(be, dk);
                be->ops->release(be, dv);
                be->ops->release(be, dout);
                check(be, "release");
            }
            cr_assert_leq(max_rel_diff(outs[0], outs[1], nq), 1e-5f,
                          "attention of %d rows over %d keys (causal %lld)", rows, n_kv,
                          (long long)causal);
            free(outs[0]);
            free(outs[1]);
        }
        free(q), free(kv);
    }
    backend_destroy(cpu);
    backend_destroy(gpu);
}

Test(cuda_whisper, scatter_rows_matches_the_cpu, .timeout = 300)
{
    skip_without_gpu();
    struct backend *cpu = make_backend(false), *gpu = make_backend(true);
    enum { SRC = 6, DST = 23, COLS = 77 };
    const int32_t rows[SRC] = {22, 0, 7, 8, 15, 3};
    float src[SRC * COLS], dst[DST * COLS], *outs[2];
    fill(src, SRC * COLS, 9);
    fill(dst, DST * COLS, 10);
    for (int k = 0; k < 2; k++) {
        struct backend *be = k ? gpu : cpu;
        float *ds = upload(be, src, SRC * COLS, "upload src"),
              *dd = upload(be, dst, DST * COLS, "upload dst");
        be->ops->scatter_rows(be, ds, SRC, COLS, rows, dd);
        outs[k] = download(be, dd, DST * COLS, "scatter_rows");
        be->ops->release(be, ds);
        be->ops->release(be, dd);
        check(be, "release");
    }
    for (int r = 0; r < DST; r++) { /* the rows named hold src's, every other row is untouched */
        const float *want = dst + r * COLS;
        for (int i = 0; i < SRC; i++)
            if (rows[i] == r)
                want = src + i * COLS;
        cr_assert_eq(memcmp(outs[0] + r * COLS, want, COLS * sizeof(float)), 0, "cpu row %d", r);
        cr_assert_eq(memcmp(outs[1] + r * COLS, want, COLS * sizeof(float)), 0, "cuda row %d", r);
    }
    free(outs[0]);
    free(outs[1]);
    backend_destroy(cpu);
    backend_destroy(gpu);
}

Test(cuda_whisper, conv1d_matches_the_cpu, .timeout = 300)
{
    skip_without_gpu();
    struct backend *cpu = make_backend(false), *gpu = make_backend(true);
    /* kernel 3, padding 1, strides 1 and 2 */
    size_t ncx = (size_t)NIN * CIN, nw = (size_t)COUT * CIN * 3;
    float *cx = malloc(ncx * sizeof *cx), *cw = malloc(nw * sizeof *cw),
          *cb = malloc(COUT * sizeof *cb), *outs[2];
    fill(cx, ncx, 6);
    fill(cw, nw, 7);
    fill(cb, COUT, 8);
    for (int s = 1; s <= 2; s++) {
        int64_t n_out = (NIN + 2 - 3) / s + 1;
        for (int k = 0; k < 2; k++) {
            struct backend *be = k ? gpu : cpu;
            float *dx = upload(be, cx, ncx, "upload x"), *dw = upload(be, cw, nw, "upload weight"),
                  *db = upload(be, cb, COUT, "upload bias");
            float *dy = be->ops->alloc(be, (size_t)n_out * COUT * sizeof(float));
            cr_assert_not_null(dy);
            struct weight_matrix wm = {.dtype = DTYPE_F32, .rows = COUT, .cols = CIN * 3,
                                       .data = dw};
            be->ops->conv1d(be, dx, NIN, CIN, &wm, db, 3, s, 1, dy);
            outs[k] = download(be, dy, (size_t)n_out * COUT, s == 1 ? "conv1d" : "conv1d stride 2");
            be->ops->release(be, dx);
            be->ops->release(be, dw);
            be->ops->release(be, db);
            be->ops->release(be, dy);
            check(be, "release");
        }
        cr_assert_leq(max_rel_diff(outs[0], outs[1], (size_t)n_out * COUT), 1e-5f,
                      "conv1d stride %d", s);
        free(outs[0]);
        free(outs[1]);
    }
    free(cx), free(cw), free(cb);
    backend_destroy(cpu);
    backend_destroy(gpu);
}

/* A random-weight whisper-tiny directory (the caller removes and frees it) and one window of
 * synthetic features, a(i) = a1 sin(w1 i) + a2 cos(w2 i) (the caller frees it). */
static char *tiny_model(float a1, float w1, float a2, float w2, float **mel)
{
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-tiny", 1, dir, &err), 0, "%s", err.msg);
    *mel = malloc((size_t)80 * AUDIO_WINDOW_FRAMES * sizeof **mel);
    cr_assert_not_null(*mel);
    for (int i = 0; i < 80 * AUDIO_WINDOW_FRAMES; i++)
        (*mel)[i] = a1 * sinf((float)i * w1) + a2 * cosf((float)i * w2);
    return dir;
}

/* The whisper-tiny shape (random weights): the encoder's output for one window and the logits
 * of a four-token prompt fed one token at a time. */
Test(cuda_whisper, tiny_encoder_output_and_logits_match_the_cpu, .timeout = 300)
{
    skip_without_gpu();
    struct err err = {0};
    float *mel;
    char *dir = tiny_model(0.8f, 0.0013f, 0.1f, 0.37f, &mel);
    int32_t prompt[] = {50258, 50259, 50359, 50363};
    /* the CPU, CUDA with the encoder on the GEMV kernels, CUDA with it on cuBLASLt */
    float *enc[3], *logits[3];
    size_t n_enc = 0;
    int vocab = 0;
    for (int k = 0; k < 3; k++) {
        struct backend *be = make_backend_gemm(k >= 1, k == 2);
        struct whisper_model *m;
        struct whisper_state *st;
        cr_assert_eq(whisper_load(dir, be, &m, &err), 0, "%s", err.msg);
        cr_assert_eq(whisper_state_create(m, &st, &err), 0, "%s", err.msg);
        cr_assert_eq(whisper_encode(st, mel, &err), 0, "%s", err.msg);
        n_enc = (size_t)m->config.max_source_positions * m->config.d_model;
        vocab = m->config.vocab_size;
        enc[k] = malloc(n_enc * sizeof(float));
        cr_assert_eq(whisper_encoder_output(st, enc[k], &err), 0, "%s", err.msg);
        logits[k] = malloc((size_t)4 * vocab * sizeof(float));
        for (int p = 0; p < 4; p++)
            cr_assert_eq(whisper_decode(st, &prompt[p], 1, logits[k] + (size_t)p * vocab, &err), 0,
                         "%s", err.msg);
        whisper_state_free(st);
        whisper_free(m);
        backend_destroy(be);
    }
    for (int g = 1; g < 3; g++) {
        float e = max_rel_diff(enc[0], enc[g], n_enc);
        cr_assert_leq(e, 1e-3f, "encoder output (%s) differs by %g of its scale",
                      g == 2 ? "cuBLASLt" : "GEMV", e);
        for (int p = 0; p < 4; p++) {
            const float *a = logits[0] + (size_t)p * vocab, *b = logits[g] + (size_t)p * vocab;
            int ia = 0, ib = 0;
            for (int i = 1; i < vocab; i++) {
                if (a[i] > a[ia])
                    ia = i;
                if (b[i] > b[ib])
                    ib = i;
            }
            cr_assert_eq(ia, ib, "position %d: argmax %d on the CPU, %d on CUDA", p, ia, ib);
            float d = max_rel_diff(a, b, (size_t)vocab);
            cr_assert_leq(d, 1e-3f, "position %d: logits differ by %g of their scale", p, d);
        }
    }
    for (int k = 0; k < 3; k++) {
        free(enc[k]);
        free(logits[k]);
    }
    free(mel);
    test_rmtree(dir);
    free(dir);
}

/* Decode steps replayed from CUDA graphs (the step's ops name no position: the new K/V rows,
 * the positional rows and the attention's key count are read from the step's parameters) give
 * the bits of the same steps launched eagerly, across the splits' buckets (256 and 512 keys),
 * and the CPU's argmax within the tolerance above. */
Test(cuda_whisper, decode_steps_from_graphs_equal_eager_steps, .timeout = 300)
{
    skip_without_gpu();
    struct err err = {0};
    float *mel;
    char *dir = tiny_model(0.5f, 0.0021f, -0.2f, 0.11f, &mel);
    enum { STEPS = 300, PROMPT = 4 };
    int32_t tokens[PROMPT + STEPS] = {50258, 50259, 50359, 50363};
    for (int i = PROMPT; i < PROMPT + STEPS; i++)
        tokens[i] = (int32_t)((i * 7919) % 50000);
    float *logits[3];
    int vocab = 0;
    for (int k = 0; k < 3; k++) { /* the CPU, CUDA with graphs, CUDA launching eagerly */
        struct backend *be = NULL;
        struct backend_options opt = {.mode = COMPUTE_EXACT, .threads = 2,
                                      .cuda_graphs = k == 2 ? BACKEND_OFF : BACKEND_ON};
        int rc = k ? backend_cuda_create(0, &opt, &be, &err) : backend_cpu_create(&opt, &be, &err);
        cr_assert_eq(rc, 0, "%s", err.msg);
        struct whisper_model *m;
        struct whisper_state *st;
        cr_assert_eq(whisper_load(dir, be, &m, &err), 0, "%s", err.msg);
        cr_assert_eq(whisper_state_create(m, &st, &err), 0, "%s", err.msg);
        vocab = m->config.vocab_size;
        logits[k] = malloc((size_t)(STEPS + 1) * vocab * sizeof(float));
        /* two windows: the second replays what the first captured */
        for (int w = 0; w < 2; w++) {
            cr_assert_eq(whisper_encode(st, mel, &err), 0, "%s", err.msg);
            cr_assert_eq(whisper_decode(st, tokens, PROMPT, logits[k], &err), 0, "%s", err.msg);
            for (int i = 0; i < STEPS; i++)
                cr_assert_eq(whisper_decode(st, &tokens[PROMPT + i], 1,
                                            logits[k] + (size_t)(i + 1) * vocab, &err),
                             0, "step %d: %s", i, err.msg);
        }
        whisper_state_free(st);
        whisper_free(m);
        backend_destroy(be);
    }
    size_t n = (size_t)(STEPS + 1) * vocab;
    cr_assert_eq(memcmp(logits[1], logits[2], n * sizeof(float)), 0,
                 "logits from graphs differ from the eager launches'");
    for (int p = 0; p <= STEPS; p += 1) {
        const float *a = logits[0] + (size_t)p * vocab, *b = logits[1] + (size_t)p * vocab;
        float d = max_rel_diff(a, b, (size_t)vocab);
        cr_assert_leq(d, 1e-3f, "step %d: logits differ by %g of their scale", p, d);
    }
    for (int k = 0; k < 3; k++)
        free(logits[k]);
    free(mel);
    test_rmtree(dir);
    free(dir);
}

/* A whole transcription (windows, rules, beam search) decodes the same text on both. */
Test(cuda_whisper, greedy_and_beam_transcriptions_equal_the_cpus, .timeout = 300)
{
    skip_without_gpu();
    char *dir = test_mkdtemp();
    struct err err = {0};
    cr_assert_eq(mkwhisper_write("whisper-test", 1, dir, &err), 0, "%s", err.msg);
    size_t n = 16000 * 3;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = 0.3f * sinf(2 * (float)M_PI * (200.0f + (float)(i / 4000) * 50.0f) * i / 16000);
    char *text[2][2];
    for (int k = 0; k < 2; k++) {
        struct backend *be = make_backend_gemm(k == 1, true);
        struct transcriber *t;
        cr_assert_eq(transcriber_create(dir, be, &t, &err), 0, "%s", err.msg);
        for (int beam = 0; beam < 2; beam++) {
            struct transcribe_options o = {.language = "en", .timestamps = true,
                                           .beam_size = beam ? 3 : 1};
            struct transcribe_result r;
            cr_assert_eq(transcriber_run(t, x, n, &o, &r, &err), 0, "%s", err.msg);
            text[k][beam] = strdup(r.text);
            transcribe_result_free(&r);
        }
        transcriber_free(t);
        backend_destroy(be);
    }
    for (int beam = 0; beam < 2; beam++) {
        cr_assert_str_eq(text[0][beam], text[1][beam], "beam %d", beam);
        free(text[0][beam]);
        free(text[1][beam]);
    }
    free(x);
    test_rmtree(dir);
    free(dir);
}
