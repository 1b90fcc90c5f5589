/* backend/cpu/attn_quant_kernels.h — contract between quantized attention's driver (attn_quant.c), its per-ISA row kernels (AVX2 there, AVX-512 in attn_quant_avx512.c) and the vectorized quantize-on-write (kv_quantize.c); private to backend/cpu. */
#ifndef INFERD_BACKEND_CPU_ATTN_QUANT_KERNELS_H
#define INFERD_BACKEND_CPU_ATTN_QUANT_KERNELS_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/kv_quant.h"

#define QATTN_MAX_HEAD_DIM 512
#define QATTN_MAX_GROUP 16
#define QATTN_MAX_BLOCK 256

/* One attention call over a quantized cache (cpu_attention_quant's arguments). */
struct qattn_job {
    const struct cpu_impl *impl;
    const float *q;
    const struct kv_cache *kv;
    int layer;
    const struct attn_span *spans;
    int n_spans;
    int n_heads;
    float scale;
    int sliding_window;
    float *out;
};

/* Byte offset of slot's K (v false) or V row of layer in block. */
static inline size_t row_offset(const struct kv_cache *kv, int layer, uint32_t block, int slot,
                                bool v)
{
    return (((size_t)layer * kv->n_blocks + block) * kv->block_size + slot) *
           kv_cache_row_bytes(kv, v);
}

/* n (2 to 8) bytes at p, little-endian: loads of whole integers joined in registers (a
 * partial copy into a wider variable makes its load wait for the stores it cannot be
 * forwarded from), no call to memcpy in the decoders' inner loops, and no byte past p + n
 * read. */
static inline uint64_t qattn_load_le(const uint8_t *p, int n)
{
    uint64_t w = 0;
    uint32_t w32;
    uint16_t w16;
    switch (n) {
    case 2: memcpy(&w16, p, 2); w = w16; break;
    case 3: memcpy(&w16, p, 2); w = w16 | (uint64_t)p[2] << 16; break;
    case 4: memcpy(&w32, p, 4); w = w32; break;
    case 6:
        memcpy(&w32, p, 4);
        memcpy(&w16, p + 4, 2);
        w = w32 | (uint64_t)w16 << 32;
        break;
    case 8: memcpy(&w, p, 8); break;
    default:
        for (int i = 0; i < n; i++)
            w |= (uint64_t)p[i] << (8 * i);
    }
    return w;
}

/* kvq_load_f16's value by one F16C conversion (every x86-64-v3 machine) instead of its
 * branches: the conversion is exact, so the same float for every f16 a record holds (the
 * store writes one quiet NaN). */
static inline float qattn_load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Asks for the cache lines of a record of `bytes` at rec, into L2 as the f16 kernel's rows: a
 * block's records are a slot row apart and blocks lie anywhere, which the hardware
 * prefetchers do not follow. */
static inline void qattn_prefetch_record(const uint8_t *rec, int bytes)
{
    const uintptr_t first = (uintptr_t)rec & ~(uintptr_t)63;
    for (uintptr_t line = first; line < (uintptr_t)rec + (uintptr_t)bytes; line += 64)
        __builtin_prefetch((const void *)line, 0, 2);
}

/* Four dot products' horizontal sums from their eight-lane halves' sums t0..t3 (lane i the sum
 * of elements i and i + 8 of each 16): the order of vec_dot's hsum256 for each (lanes i and
 * i + 4, then i and i + 2, then 0 and 1), four at once. */
static inline __m128 qattn_reduce4(__m256 t0, __m256 t1, __m256 t2, __m256 t3)
{
    __m128 u0 = _mm_add_ps(_mm256_castps256_ps128(t0), _mm256_extractf128_ps(t0, 1));
    __m128 u1 = _mm_add_ps(_mm256_castps256_ps128(t1), _mm256_extractf128_ps(t1, 1));
    __m128 u2 = _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
    __m128 u3 = _mm_add_ps(_mm256_castps256_ps128(t3), _mm256_extractf128_ps(t3, 1));
    /* w01 = (u0[0] + u0[2], u0[1] + u0[3], u1[0] + u1[2], u1[1] + u1[3]), w23 the same */
    __m128 w01 = _mm_add_ps(_mm_shuffle_ps(u0, u1, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m128 w23 = _mm_add_ps(_mm_shuffle_ps(u2, u3, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm_shuffle_ps(u2, u3, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_add_ps(_mm_shuffle_ps(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm_shuffle_ps(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* kvq_quantize_head's record of x, the same bytes, vectorized (kv_quantize.c). */
void cpu_kvq_quantize_head(const struct kv_quant_layer *l, const struct kvq_codebooks *cb,
                           uint64_t seed, int layer, int head_dim, bool v, const float *x,
                           uint8_t *rec, float *scratch);

/* kvq_rotate (x = R x) or, inverse, kvq_unrotate of x[0, n), the same bits, vectorized
 * where n is a power of two (kv_quantize.c). */
void cpu_kvq_rotate(float *x, int n, uint64_t seed, int which, int layer, bool inverse);

/* threadpool_run bodies: thread ith of nth takes every nth (row, kv head)
 * pair of job (a struct qattn_job). Both variants compute the same bits: they
 * decode the same floats and sum them in the same order (the AVX-512 dot
 * product keeps the AVX2 one's two 8-lane accumulators as its two halves). */
void cpu_qattn_rows_avx2(void *job, int ith, int nth);
void cpu_qattn_rows_avx512(void *job, int ith, int nth);

#endif
