/* tests/unit/test_cpu_kv_f16.c — the CPU backend's f16 KV cache: the F16C conversions give the scalar reference's bits (backend/kv_quant.h) for every f16 and a sweep of f32 values (ties, subnormals, saturation), kv_store writes each row rounded where the paged layout puts it, kv_copy_slots copies f16 blocks, and which element type each mode and flag gives the cache. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/attn_f16.h"
#include "backend/kv_quant.h"
#include "base/cpu.h"
#include "kv/kv.h"

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Test(cpu_kv_f16, widening_gives_the_scalar_bits_for_every_f16)
{
    if (!cpu_features()->f16c)
        cr_skip_test("no F16C on this processor");
    uint16_t *h = malloc(65536 * sizeof *h);
    float *x = malloc(65536 * sizeof *x);
    cr_assert(h && x);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    cpu_f16_to_f32(x, h, 65536, true);
    int wrong = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float want = kvq_f16_to_f32(h[i]);
        bool ok = f16_is_nan(h[i]) ? isnan(x[i]) : bits_of(x[i]) == bits_of(want);
        if (!ok && wrong++ < 5)
            cr_log_error("f16 %04x: %08x, the scalar widening gives %08x", i, bits_of(x[i]),
                         bits_of(want));
    }
    cr_expect_eq(wrong, 0, "%d f16 values widen differently", wrong);
    free(h);
    free(x);
}

/* Every finite f16 comes back from its widening unchanged; f32 values in
 * between (a sweep of bit patterns over the whole range, and the edges:
 * ties to even, the subnormal range and its underflow, the largest finite
 * and what saturates to it) round as kvq_f32_to_f16 rounds them, through
 * the F16C path and the scalar tail alike (a length that is no multiple of 8). */
Test(cpu_kv_f16, rounding_gives_the_scalar_bits_for_f32_values)
{
    if (!cpu_features()->f16c)
        cr_skip_test("no F16C on this processor");
    static const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, INFINITY,
                                  -INFINITY, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0x1p-24f,
                                  0x1p-25f, 0x1.8p-25f, 0x3p-26f, 0x1p-14f, 0x1.ff8p-15f,
                                  0x1p-126f, 0x1p-149f, 2049.0f, 2051.0f, -65504.0f, -70000.0f};
    enum { SWEEP = (1 << 20) + 3 };
    size_t n = SWEEP + sizeof edges / sizeof edges[0] + 65536;
    float *x = malloc(n * sizeof *x);
    uint16_t *h = malloc(n * sizeof *h);
    cr_assert(x && h);
    size_t m = 0;
    for (uint32_t i = 0; i < SWEEP; i++)
        x[m++] = float_of(i * 4093u + 17u); /* every exponent, both signs, NaNs included */
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        x[m++] = edges[i];
    for (uint32_t i = 0; i < 65536; i++)
        x[m++] = kvq_f16_to_f32((uint16_t)i);
    cpu_f16_from_f32(h, x, m, true);
    int wrong = 0;
    for (size_t i = 0; i < m; i++) {
        uint16_t want = kvq_f32_to_f16(x[i]);
        bool ok = isnan(x[i]) ? f16_is_nan(h[i]) : h[i] == want;
        if (!ok && wrong++ < 5)
            cr_log_error("f32 %08x: %04x, the scalar rounding gives %04x", bits_of(x[i]), h[i],
                         want);
    }
    cr_expect_eq(wrong, 0, "%d of %zu values round differently", wrong, m);
    for (uint32_t i = 0; i < 65536; i++)
        if (!f16_is_nan((uint16_t)i) && (i & 0x7c00) != 0x7c00)
            cr_expect_eq(h[m - 65536 + i], (uint16_t)i, "f16 %04x does not round trip", i);
    free(x);
    free(h);
}

static struct backend *cpu_backend(enum compute_mode mode, enum backend_kv_type kv_type,
                                   const struct kv_quant *quant)
{
    struct backend *be = NULL;
    struct err err = {0};
    cr_assert_eq(backend_cpu_create(&(struct backend_options){.mode = mode, .threads = 2,
                                                              .kv_type = kv_type,
                                                              .kv_quant = quant},
                                    &be, &err),
                 0, "%s", err.msg);
    return be;
}

/* Two layers of blocks of four slots, two kv heads of 9 dimensions (rows of
 * 18 elements: the F16C path and the scalar tail); two spans over block
 * tables that jump, one of them starting mid-block. */
Test(cpu_kv_f16, store_writes_each_row_rounded_where_the_paged_layout_puts_it)
{
    enum { LAYERS = 2, BLOCKS = 6, BS = 4, HEADS = 2, HD = 9, DIM = HEADS * HD, ROWS = 11 };
    struct backend *be = cpu_backend(COMPUTE_FAST, BACKEND_KV_AUTO, NULL);
    cr_assert_eq(be->kv_dtype, DTYPE_F16);
    size_t elems = (size_t)LAYERS * BLOCKS * BS * DIM;
    struct kv_cache kv = {.k = be->ops->alloc(be, elems * 2), .v = be->ops->alloc(be, elems * 2),
                          .dtype = DTYPE_F16, .n_layers = LAYERS, .n_blocks = BLOCKS,
                          .block_size = BS, .n_kv_heads = HEADS, .head_dim = HD};
    cr_assert(kv.k && kv.v);
    float k[ROWS * DIM], v[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++) {
        k[i] = (float)(i % 97) * 0.37f - 17.0f + 1e-4f * (float)i;
        v[i] = 1000.0f / (float)(i + 1) - 3.0f;
    }
    k[5] = 1e6f; /* saturates */
    v[7] = 3e-8f; /* an f16 subnormal */
    static const uint32_t table_a[] = {4, 1, 5}, table_b[] = {0, 3};
    /* a: positions 2..8 (rows 0..6); b: positions 0..3 (rows 7..10) */
    struct attn_span spans[2] = {{0, 7, 2, table_a, 3}, {7, 4, 0, table_b, 2}};
    be->ops->kv_store(be, &kv, 1, k, v, spans, 2);
    const uint16_t *kc = kv.k, *vc = kv.v;
    int wrong = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < spans[s].n_tokens; i++) {
            int pos = spans[s].pos0 + i, row = spans[s].row0 + i;
            uint32_t block = spans[s].block_ids[pos / BS];
            size_t at = (((size_t)1 * BLOCKS + block) * BS + (size_t)(pos % BS)) * DIM;
            for (int e = 0; e < DIM; e++) {
                wrong += kc[at + e] != kvq_f32_to_f16(k[row * DIM + e]);
                wrong += vc[at + e] != kvq_f32_to_f16(v[row * DIM + e]);
            }
        }
    cr_expect_eq(wrong, 0, "%d stored elements differ from their rounding", wrong);
    /* layer 0 and the slots no span names are untouched */
    size_t written = 0;
    for (size_t i = 0; i < elems; i++)
        written += kc[i] != 0 || vc[i] != 0;
    size_t stored = 0;
    for (int i = 0; i < ROWS * DIM; i++)
        stored += kvq_f32_to_f16(k[i]) != 0 || kvq_f32_to_f16(v[i]) != 0;
    cr_expect_eq(written, stored, "%zu nonzero elements where the store wrote %zu", written,
                 stored);

    /* block 1's first three slots onto block 2, every layer, K and V */
    be->ops->kv_copy_slots(be, &kv, 1, 2, 3);
    for (int layer = 0; layer < LAYERS; layer++) {
        size_t src = ((size_t)layer * BLOCKS + 1) * BS * DIM, dst = ((size_t)layer * BLOCKS + 2) * BS * DIM;
        cr_expect(!memcmp(kc + dst, kc + src, 3 * DIM * 2), "layer %d: K slots not copied", layer);
        cr_expect(!memcmp(vc + dst, vc + src, 3 * DIM * 2), "layer %d: V slots not copied", layer);
        for (int e = 0; e < DIM; e++)
            cr_expect(kc[dst + 3 * DIM + e] == 0 && vc[dst + 3 * DIM + e] == 0,
                      "layer %d: slot 3 written", layer);
    }
    be->ops->release(be, kv.k);
    be->ops->release(be, kv.v);
    backend_destroy(be);
}

/* auto is f16 in FAST mode and f32 in EXACT mode (whose bit-for-bit promises
 * were made over f32); an explicit type wins in either mode; a quantized
 * cache keeps its records whatever the type says. */
Test(cpu_kv_f16, kv_dtype_is_f16_in_fast_mode_and_f32_in_exact_mode_unless_asked)
{
    static const struct {
        enum compute_mode mode;
        enum backend_kv_type type;
        bool quant;
        enum dtype want;
        const char *name;
    } cases[] = {
        {COMPUTE_FAST, BACKEND_KV_AUTO, false, DTYPE_F16, "f16"},
        {COMPUTE_EXACT, BACKEND_KV_AUTO, false, DTYPE_F32, "f32"},
        {COMPUTE_FAST, BACKEND_KV_F32, false, DTYPE_F32, "f32"},
        {COMPUTE_EXACT, BACKEND_KV_F16, false, DTYPE_F16, "f16"},
        {COMPUTE_FAST, BACKEND_KV_AUTO, true, DTYPE_F32, "kv8"},
        {COMPUTE_FAST, BACKEND_KV_F16, true, DTYPE_F32, "kv8"},
    };
    static struct kv_quant q8 = {.layer = {{.scheme = KV_QUANT_AFFINE, .k_bits = 8, .v_bits = 8,
                                            .group_size = 64}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct backend *be = cpu_backend(cases[i].mode, cases[i].type, cases[i].quant ? &q8 : NULL);
        cr_expect_eq(be->kv_dtype, cases[i].want, "case %zu: %s", i, dtype_name(be->kv_dtype));
        struct kv_format f = kv_format_of_backend(be);
        char name[32];
        kv_format_name(&f, name, sizeof name);
        cr_expect_str_eq(name, cases[i].name, "case %zu", i);
        backend_destroy(be);
    }
}
