/* model/load.c — model_load: config + safetensors checked against each other and placed on a backend. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#ifdef __F16C__
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/panels.h"
#include "model/arch.h"
#include "model/gguf.h"
#include "model/tensor_parallel.h"
#include "base/quant.h"
#include "text/tokenizer.h"

#define WIDEN_CHUNK 65536 /* elements converted per host staging pass */

/* ---------------------------------------------------------------- backend buffers */

static int own_buffer(struct model *m, void *p, struct err *err)
{
    if (m->n_owned_buffers == m->cap_owned_buffers) {
        int cap = m->cap_owned_buffers ? m->cap_owned_buffers * 2 : 64;
        void **b = realloc(m->owned_buffers, (size_t)cap * sizeof *b);
        if (!b) {
            m->backend->ops->release(m->backend, p);
            return err_set(err, INFERD_ENOMEM, "out of memory tracking weight buffers");
        }
        m->owned_buffers = b;
        m->cap_owned_buffers = cap;
    }
    m->owned_buffers[m->n_owned_buffers++] = p;
    return 0;
}

/* Backend memory that model_free releases. */
static int alloc_owned(struct model *m, size_t bytes, const char *name, void **out,
                       struct err *err)
{
    *out = m->backend->ops->alloc(m->backend, bytes ? bytes : 1);
    if (!*out)
        return err_set(err, INFERD_ENOMEM, "out of backend memory for tensor '%s' (%zu bytes)",
                       name, bytes);
    return own_buffer(m, *out, err);
}

/* Element i of src (dtype dt, possibly unaligned) as f32. */
static float element_f32(const uint8_t *src, enum dtype dt, size_t i)
{
    if (dt == DTYPE_F32) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    return dt == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* dst[i] = element i0 + i of t as f32, for i < k. */
static void convert_f32(const struct st_tensor *t, size_t i0, size_t k, float *dst)
{
    const uint8_t *src = t->data;
    size_t i = 0;
#ifdef __F16C__
    /* Hardware half->float is exact, and keeps multi-GB F16 checkpoints' load memory-bound. */
    if (t->dtype == DTYPE_F16)
        for (; i + 8 <= k; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                          (const __m128i *)(src + 2 * (i0 + i)))));
#endif
    for (; i < k; i++)
        dst[i] = element_f32(src, t->dtype, i0 + i);
}

/* n elements of src converted to f32 in backend memory, staged through a
 * bounded host buffer so huge tensors do not need a second full copy on the host. */
static int upload_f32(struct model *m, const struct st_tensor *t, size_t n, float **out,
                      struct err *err)
{
    void *buf;
    int rc = alloc_owned(m, n * sizeof(float), t->name, &buf, err);
    if (rc)
        return rc;
    float *dst = buf;
    size_t chunk = n < WIDEN_CHUNK ? n : WIDEN_CHUNK;
    float *stage = malloc((chunk ? chunk : 1) * sizeof *stage);
    if (!stage)
        return err_set(err, INFERD_ENOMEM, "out of memory converting tensor '%s'", t->name);
    for (size_t i0 = 0; i0 < n; i0 += chunk) {
        size_t k = n - i0 < chunk ? n - i0 : chunk;
        convert_f32(t, i0, k, stage);
        m->backend->ops->to_device(m->backend, dst + i0, stage, k * sizeof *stage);
    }
    free(stage);
    *out = dst;
    return 0;
}

/* ---------------------------------------------------------------- tensor lookup */

static void format_shape(char *buf, size_t cap, const int64_t *shape, int n_dims)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < n_dims && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "",
                                 (long long)shape[d]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/* The tensor name with exactly the shape config.json implies, marked used. */
static int find_tensor(struct model *m, const char *name, const int64_t *want, int want_dims,
                       const struct st_tensor **out, struct err *err)
{
    char want_s[96], have_s[96];
    format_shape(want_s, sizeof want_s, want, want_dims);
    const struct st_tensor *t = st_set_find(&m->files, name);
    if (!t)
        return err_set(err, INFERD_EFORMAT, "missing tensor '%s' (config.json implies shape %s)",
                       name, want_s);
    bool same = t->n_dims == want_dims;
    for (int d = 0; same && d < want_dims; d++)
        same = t->shape[d] == want[d];
    if (!same) {
        format_shape(have_s, sizeof have_s, t->shape, t->n_dims);
        return err_set(err, INFERD_EFORMAT, "tensor %s has shape %s, config.json implies %s", name,
                       have_s, want_s);
    }
    *out = t;
    return 0;
}

/* The stored row holding row r in Hugging Face order. llama.cpp's
 * converter stores Llama-family q/k with each head's two rotary halves
 * interleaved (its rope pairs adjacent elements): HF row h*hd + i*hd/2 + j
 * (i in {0, 1}) is stored at h*hd + 2j + i. */
static int64_t source_row(const struct st_tensor *t, int64_t rows, int64_t r)
{
    if (!t->unpermute_heads)
        return r;
    int64_t hd = rows / t->unpermute_heads, half = hd / 2;
    int64_t h = r / hd, k = r % hd, i = k / half, j = k % half;
    return h * hd + 2 * j + i;
}

static int check_unpermutable(const struct st_tensor *t, int64_t rows, struct err *err)
{
    if (t->unpermute_heads && (rows % t->unpermute_heads || (rows / t->unpermute_heads) % 2))
        return err_set(err, INFERD_EFORMAT, "tensor %s: %lld rows do not split into %d heads of "
                       "an even size", t->name, (long long)rows, t->unpermute_heads);
    return 0;
}

/* A block-quantized matrix as F32 in backend memory, row by row (rows
 * reordered as source_row says). */
static int upload_dequantized(struct model *m, const struct st_tensor *t, int64_t rows,
                              int64_t cols, float **out, struct err *err)
{
    void *buf;
    int rc = alloc_owned(m, (size_t)rows * (size_t)cols * sizeof(float), t->name, &buf, err);
    if (rc)
        return rc;
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row)
        return err_set(err, INFERD_ENOMEM, "out of memory converting tensor '%s'", t->name);
    uint64_t row_bytes = dtype_row_bytes(t->dtype, (uint64_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        quant_dequantize_row(t->dtype, (const uint8_t *)t->data +
                                           (uint64_t)source_row(t, rows, r) * row_bytes,
                             row, cols);
        m->backend->ops->to_device(m->backend, (float *)buf + r * cols, row,
                                   (size_t)cols * sizeof *row);
    }
    free(row);
    *out = buf;
    return 0;
}

/* The rows of a dense matrix in Hugging Face order, copied to backend memory. */
static int upload_unpermuted(struct model *m, const struct st_tensor *t, int64_t rows,
                             int64_t cols, const void **out, struct err *err)
{
    void *buf;
    int rc = alloc_owned(m, t->nbytes, t->name, &buf, err);
    if (rc)
        return rc;
    uint64_t row_bytes = dtype_row_bytes(t->dtype, (uint64_t)cols);
    for (int64_t r = 0; r < rows; r++)
        m->backend->ops->to_device(m->backend, (uint8_t *)buf + (uint64_t)r * row_bytes,
                                   (const uint8_t *)t->data +
                                       (uint64_t)source_row(t, rows, r) * row_bytes,
                                   row_bytes);
    *out = buf;
    return 0;
}

/* The block type --quantize turns dense matrix name (cols wide) into, or
 * DTYPE_F32 to keep it as stored. */
static enum dtype quantize_target(struct model *m, const char *name, int64_t cols)
{
    enum dtype q = m->quantize;
    if (!dtype_is_block(q))
        return DTYPE_F32;
    bool head = !strcmp(name, "lm_head.weight") ||
                (!strcmp(name, "model.embed_tokens.weight") && m->config.tie_word_embeddings &&
                 !st_set_find(&m->files, "lm_head.weight"));
    if (q == DTYPE_Q4_K && head)
        q = DTYPE_Q6_K; /* llama-quantize's Q4_K_M keeps the head at 6 bits */
    if (cols % dtype_block_elems(q))
        q = DTYPE_Q8_0;
    return cols % dtype_block_elems(q) ? DTYPE_F32 : q;
}

/* A dense matrix quantized to q in backend memory, row by row (rows in
 * Hugging Face order, as source_row says). */
static int upload_quantized(struct model *m, const struct st_tensor *t, int64_t rows,
                            int64_t cols, enum dtype q, const void **out, struct err *err)
{
    uint64_t rb = dtype_row_bytes(q, (uint64_t)cols);
    void *buf;
    int rc = alloc_owned(m, (size_t)(rb * (uint64_t)rows), t->name, &buf, err);
    if (rc)
        return rc;
    float *row = malloc((size_t)cols * sizeof *row);
    uint8_t *qrow = malloc((size_t)rb);
    if (!row || !qrow) {
        free(row);
        free(qrow);
        return err_set(err, INFERD_ENOMEM, "out of memory quantizing tensor '%s'", t->name);
    }
    for (int64_t r = 0; r < rows; r++) {
        convert_f32(t, (size_t)source_row(t, rows, r) * (size_t)cols, (size_t)cols, row);
        quant_quantize_row(q, row, qrow, cols);
        m->backend->ops->to_device(m->backend, (uint8_t *)buf + (uint64_t)r * rb, qrow, rb);
    }
    free(row);
    free(qrow);
    *out = buf;
    return 0;
}

/* ---------------------------------------------------------------- MLX-quantized matrices */

/* Whole rows per host staging pass when grouping MLX weights (about 4 MB). */
static int64_t mlx_chunk_rows(uint64_t row_bytes)
{
    int64_t n = (int64_t)(((uint64_t)4 << 20) / (row_bytes ? row_bytes : 1));
    return n > 0 ? n : 1;
}

/* NAME.scales or NAME.biases of an MLX-quantized matrix whose packed
 * weight is base + ".weight". */
static int mlx_part(struct model *m, const char *base, const char *part, int64_t rows,
                    const struct st_tensor **out, struct err *err)
{
    char name[320];
    snprintf(name, sizeof name, "%s.%s", base, part);
    const struct st_tensor *t = st_set_find(&m->files, name);
    if (!t)
        return err_set(err, INFERD_EFORMAT, "MLX-quantized weight %s.weight has no %s", base,
                       name);
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] <= 0)
        return err_set(err, INFERD_EFORMAT, "%s must have shape [%lld, groups per row]", name,
                       (long long)rows);
    if (t->dtype != DTYPE_BF16 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_F32)
        return err_set(err, INFERD_EFORMAT, "%s is %s; scales and biases must be BF16, F16 or F32",
                       name, dtype_name(t->dtype));
    *out = t;
    return 0;
}

/* An MLX-quantized matrix (rows x cols): t holds its packed uint32 words
 * ([rows, cols * bits / 32]), NAME.scales and NAME.biases beside it one value
 * per group ([rows, cols / group], one float type). Bits and group size are
 * read from the shapes (so per-module overrides in config.json need nothing
 * more); each group becomes one MLX block (base/quant.h) of the same bytes,
 * in backend memory, or F32 on a backend that does not take the type. */
static int load_mlx_matrix(struct model *m, const struct st_tensor *t, int64_t rows,
                           int64_t cols, struct weight_matrix *w, struct err *err)
{
    size_t len = strlen(t->name);
    if (!m->config.quant_bits)
        return err_set(err, INFERD_EFORMAT, "tensor %s is U32 (packed quantized weights), but "
                       "config.json has no quantization", t->name);
    if (len < 8 || len >= 300 || strcmp(t->name + len - 7, ".weight"))
        return err_set(err, INFERD_EFORMAT, "U32 tensor %.200s is not a quantized module's weight",
                       t->name);
    char base[300];
    snprintf(base, sizeof base, "%.*s", (int)(len - 7), t->name);
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] <= 0)
        return err_set(err, INFERD_EFORMAT, "packed weight %s must have shape [%lld, %lld * bits "
                       "/ 32] (config.json implies %lld x %lld)", t->name, (long long)rows,
                       (long long)cols, (long long)rows, (long long)cols);
    const struct st_tensor *sc, *bi;
    int rc;
    if ((rc = mlx_part(m, base, "scales", rows, &sc, err)) ||
        (rc = mlx_part(m, base, "biases", rows, &bi, err)))
        return rc;
    if (bi->shape[1] != sc->shape[1] || bi->dtype != sc->dtype)
        return err_set(err, INFERD_EFORMAT, "%s.biases (%s, %lld per row) does not match "
                       "%s.scales (%s, %lld per row)", base, dtype_name(bi->dtype),
                       (long long)bi->shape[1], base, dtype_name(sc->dtype),
                       (long long)sc->shape[1]);
    int64_t n_groups = sc->shape[1], n_words = t->shape[1];
    if (cols % n_groups || (n_words * 32) % cols)
        return err_set(err, INFERD_EFORMAT, "%s: %lld columns do not split into %lld groups and "
                       "%lld words of whole elements", t->name, (long long)cols,
                       (long long)n_groups, (long long)n_words);
    int64_t group = cols / n_groups, bits = n_words * 32 / cols;
    enum dtype q = dtype_mlx((int)bits, (int)group, sc->dtype);
    if (q == DTYPE_COUNT)
        return err_set(err, INFERD_EUNSUPPORTED, "%s: MLX quantization of %lld bits in groups "
                       "of %lld is not supported (4 or 8 bits, groups of 32, 64 or 128)",
                       t->name, (long long)bits, (long long)group);
    bool keep = backend_takes_blocks(m->backend, q);
    uint64_t rb = dtype_row_bytes(q, (uint64_t)cols);
    size_t ssz = dtype_size(sc->dtype), qbytes = (size_t)(group * bits / 8);
    size_t out_row = keep ? (size_t)rb : (size_t)cols * sizeof(float);
    void *buf;
    if ((rc = alloc_owned(m, out_row * (size_t)rows, t->name, &buf, err)))
        return rc;
    int64_t chunk = mlx_chunk_rows(rb);
    chunk = chunk < rows ? chunk : rows;
    uint8_t *stage = malloc((size_t)chunk * rb); /* owned; chunk rows of blocks */
    float *wide = keep ? NULL : malloc((size_t)cols * sizeof *wide);
    if (!stage || (!keep && !wide)) {
        free(stage);
        free(wide);
        return err_set(err, INFERD_ENOMEM, "out of memory grouping tensor '%s'", t->name);
    }
    const uint8_t *words = t->data, *scales = sc->data, *biases = bi->data;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        for (int64_t r = 0; r < nr; r++)
            for (int64_t g = 0; g < n_groups; g++) {
                uint8_t *blk = stage + (size_t)r * rb + (size_t)g * dtype_block_bytes(q);
                size_t gi = (size_t)((r0 + r) * n_groups + g);
                memcpy(blk, scales + gi * ssz, ssz);
                memcpy(blk + ssz, biases + gi * ssz, ssz);
                memcpy(blk + 2 * ssz, words + gi * qbytes, qbytes);
            }
        if (keep) {
            m->backend->ops->to_device(m->backend, (uint8_t *)buf + (size_t)r0 * rb, stage,
                                       (size_t)(nr * (int64_t)rb));
            continue;
        }
        for (int64_t r = 0; r < nr; r++) {
            quant_dequantize_row(q, stage + (size_t)r * rb, wide, cols);
            m->backend->ops->to_device(m->backend, (float *)buf + (r0 + r) * cols, wide,
                                       (size_t)cols * sizeof *wide);
        }
    }
    free(stage);
    free(wide);
    w->dtype = keep ? q : DTYPE_F32;
    w->data = buf;
    return 0;
}

/* A weight matrix: BF16/F32, and the block formats on a backend that takes
 * them (be->block_weights), used in place from the mapping unless the backend
 * asks for copies (be->copy_weights); F16, and the block formats elsewhere,
 * widened to F32 in backend memory. Misaligned data (a header whose length is not a
 * multiple of the element size) is copied so kernels may assume natural
 * alignment; so are GGUF q/k rows, put back in Hugging Face order. */
/* A tensor-parallel rank's slice of t (model/tensor_parallel.h) in *part:
 * rows stay in the mapping; a column slice is gathered into *staging (host
 * memory the caller frees once the slice is uploaded). */
static int shard_tensor(struct model *m, const char *name, const struct st_tensor *t,
                        struct st_tensor *part, void **staging, struct err *err)
{
    struct shard_part sp;
    model_shard_part(m, name, &sp);
    *part = *t;
    *staging = NULL;
    if (sp.axis == SHARD_WHOLE)
        return 0;
    if (t->unpermute_heads)
        return err_set(err, INFERD_EUNSUPPORTED, "tensor parallelism over a GGUF file's q/k "
                       "rows is not supported (%s)", name);
    int64_t rows = t->shape[0], cols = t->n_dims > 1 ? t->shape[1] : 1;
    uint64_t row_bytes = dtype_row_bytes(t->dtype, (uint64_t)cols);
    if (sp.axis == SHARD_ROWS) {
        part->shape[0] = sp.n;
        part->data = (const uint8_t *)t->data + (uint64_t)sp.lo * row_bytes;
        part->nbytes = (uint64_t)sp.n * row_bytes;
        return 0;
    }
    if (dtype_is_block(t->dtype) &&
        (sp.lo % dtype_block_elems(t->dtype) || sp.n % dtype_block_elems(t->dtype)))
        return err_set(err, INFERD_EUNSUPPORTED, "%s: a rank's %lld columns are not whole %s "
                       "blocks", name, (long long)sp.n, dtype_name(t->dtype));
    uint64_t off = dtype_row_bytes(t->dtype, (uint64_t)sp.lo),
             part_bytes = dtype_row_bytes(t->dtype, (uint64_t)sp.n);
    uint8_t *buf = malloc(part_bytes * (uint64_t)rows + 1);
    if (!buf)
        return err_set(err, INFERD_ENOMEM, "out of memory slicing tensor '%s'", name);
    for (int64_t r = 0; r < rows; r++)
        memcpy(buf + (uint64_t)r * part_bytes,
               (const uint8_t *)t->data + (uint64_t)r * row_bytes + off, part_bytes);
    part->shape[1] = sp.n;
    part->data = buf;
    part->nbytes = part_bytes * (uint64_t)rows;
    *staging = buf;
    return 0;
}

static int load_matrix_tensor(struct model *m, const char *name, const struct st_tensor *t,
                              int64_t rows, int64_t cols, bool staged, struct weight_matrix *w,
                              struct err *err);

int model_load_matrix(struct model *m, const char *name, int64_t rows, int64_t cols,
                      struct weight_matrix *w, struct err *err)
{
    int64_t want[2] = {rows, cols};
    const struct st_tensor *t = st_set_find(&m->files, name);
    w->rows = rows;
    w->cols = cols;
    if (t && t->dtype == DTYPE_U32) {
        if (m->tp_ranks > 1)
            return err_set(err, INFERD_EUNSUPPORTED, "tensor parallelism over MLX-quantized "
                           "weights is not supported (%s)", name);
        return load_mlx_matrix(m, t, rows, cols, w, err);
    }
    int rc = find_tensor(m, name, want, 2, &t, err);
    if (rc || (rc = check_unpermutable(t, rows, err)))
        return rc;
    if (m->tp_ranks <= 1)
        return load_matrix_tensor(m, name, t, rows, cols, false, w, err);
    struct st_tensor part;
    void *staging;
    if ((rc = shard_tensor(m, name, t, &part, &staging, err)))
        return rc;
    w->rows = part.shape[0];
    w->cols = part.shape[1];
    rc = load_matrix_tensor(m, name, &part, w->rows, w->cols, staging != NULL, w, err);
    free(staging);
    return rc;
}

int model_matrix_rows_owned(struct model *m, const char *name, const struct weight_matrix *whole,
                            int64_t r0, int64_t n, struct weight_matrix *part, struct err *err)
{
    if (whole->dtype != DTYPE_BF16_P32 || r0 % PANEL_ROWS == 0) {
        *part = model_matrix_rows(whole, r0, n);
        return 0;
    }
    struct backend *be = m->backend;
    int64_t cols = whole->cols;
    if (!be->ops->memory_is_host)
        return err_set(err, INFERD_EUNSUPPORTED, "cannot split '%s' outside host memory", name);
    uint16_t *rows = malloc((size_t)n * (size_t)cols * 2 + 2);
    if (!rows)
        return err_set(err, INFERD_ENOMEM, "out of memory splitting tensor '%s'", name);
    panels_unpack_rows(whole->data, cols, r0, n, rows);
    void *dst;
    int rc = alloc_owned(m, panels_bytes(n, cols), name, &dst, err);
    if (rc == 0) {
        panels_pack(rows, n, cols, dst);
        *part = (struct weight_matrix){.dtype = DTYPE_BF16_P32, .rows = n, .cols = cols, .data = dst};
    }
    free(rows);
    return rc;
}

int model_load_matrix_parts(struct model *m, const char *name, int64_t cols, int n_parts,
                            const int64_t *part_rows, struct weight_matrix *parts,
                            struct err *err)
{
    int64_t rows = 0;
    for (int i = 0; i < n_parts; i++)
        rows += part_rows[i];
    struct weight_matrix whole;
    int rc = model_load_matrix(m, name, rows, cols, &whole, err);
    for (int64_t i = 0, r0 = 0; rc == 0 && i < n_parts; r0 += part_rows[i++])
        rc = model_matrix_rows_owned(m, name, &whole, r0, part_rows[i], &parts[i], err);
    return rc;
}

/* t's bytes read from the open file its mapping was made from into host memory
 * dst: the kernel copies from the page cache through its own huge mapping,
 * where copying from the process's mapping of the file would walk it 4 KB at
 * a time. 0, or -1 where the set kept no file or a read failed (the caller
 * then copies from the mapping). */
static int read_tensor(const struct st_set *set, const struct st_tensor *t, void *dst)
{
    if (!set->fds || t->file_index < 0 || t->file_index >= set->n_files ||
        set->fds[t->file_index] < 0)
        return -1;
    const uint8_t *base = set->maps[t->file_index], *src = t->data;
    if (src < base || (size_t)(src - base) > set->map_lens[t->file_index] ||
        t->nbytes > set->map_lens[t->file_index] - (size_t)(src - base))
        return -1;
    const off_t at = (off_t)(src - base);
    for (uint64_t done = 0; done < t->nbytes;) {
        ssize_t n = pread(set->fds[t->file_index], (uint8_t *)dst + done,
                          (size_t)(t->nbytes - done), at + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (uint64_t)n;
    }
    return 0;
}

/* A BF16 matrix laid out in panels of 32 rows (backend.bf16_panels): read
 * into aligned host memory (GGUF's q/k rows put back in Hugging Face order),
 * then packed where the backend keeps it. */
static int upload_panels(struct model *m, const char *name, const struct st_tensor *t,
                         int64_t rows, int64_t cols, bool staged, struct weight_matrix *w,
                         struct err *err)
{
    struct backend *be = m->backend;
    uint64_t bytes = panels_bytes(rows, cols);
    uint16_t *src = malloc(t->nbytes ? t->nbytes : 1);
    uint16_t *packed = be->ops->memory_is_host ? NULL : malloc(bytes);
    void *dst = NULL;
    int rc = !src || (!be->ops->memory_is_host && !packed)
                 ? err_set(err, INFERD_ENOMEM, "out of memory laying out tensor '%s'", name)
                 : alloc_owned(m, bytes, name, &dst, err);
    if (rc == 0) {
        if (t->unpermute_heads) {
            uint64_t row_bytes = (uint64_t)cols * 2;
            for (int64_t r = 0; r < rows; r++)
                memcpy((uint8_t *)src + (uint64_t)r * row_bytes,
                       (const uint8_t *)t->data + (uint64_t)source_row(t, rows, r) * row_bytes,
                       row_bytes);
        } else if (staged || !be->read_weights || read_tensor(&m->files, t, src) < 0) {
            memcpy(src, t->data, t->nbytes);
        }
        panels_pack(src, rows, cols, packed ? packed : dst);
        if (packed)
            be->ops->to_device(be, dst, packed, bytes);
        w->dtype = DTYPE_BF16_P32;
        w->data = dst;
    }
    free(src);
    free(packed);
    return rc;
}

/* model_load_matrix once t is found: staged says t's data is not the
 * mapping's (a column slice gathered by shard_tensor) and must not be pointed at. */
static int load_matrix_tensor(struct model *m, const char *name, const struct st_tensor *t,
                              int64_t rows, int64_t cols, bool staged, struct weight_matrix *w,
                              struct err *err)
{
    int rc;
    enum dtype q = dtype_is_block(t->dtype) ? DTYPE_F32 : quantize_target(m, name, cols);
    if (q != DTYPE_F32) {
        w->dtype = q;
        return upload_quantized(m, t, rows, cols, q, &w->data, err);
    }
    bool keep_blocks = backend_takes_blocks(m->backend, t->dtype);
    if (t->dtype == DTYPE_F16 || (dtype_is_block(t->dtype) && !keep_blocks)) {
        float *wide;
        if (dtype_is_block(t->dtype) || t->unpermute_heads)
            rc = upload_dequantized(m, t, rows, cols, &wide, err);
        else
            rc = upload_f32(m, t, (size_t)rows * (size_t)cols, &wide, err);
        if (rc)
            return rc;
        w->dtype = DTYPE_F32;
        w->data = wide;
        return 0;
    }
    w->dtype = t->dtype;
    if (t->dtype == DTYPE_BF16 && m->backend->bf16_panels && m->backend->mode == COMPUTE_FAST)
        return upload_panels(m, name, t, rows, cols, staged, w, err);
    if (t->unpermute_heads)
        return upload_unpermuted(m, t, rows, cols, &w->data, err);
    /* Block kernels load unaligned: a block type is used in place wherever it lies. */
    size_t align = keep_blocks ? 1 : dtype_size(t->dtype);
    struct backend *be = m->backend;
    if (!staged && !be->copy_weights && !be->read_weights && (uintptr_t)t->data % align == 0) {
        w->data = t->data;
        return 0;
    }
    void *copy;
    if ((rc = alloc_owned(m, t->nbytes, name, &copy, err)))
        return rc;
    if (staged || !be->read_weights || read_tensor(&m->files, t, copy) < 0)
        be->ops->to_device(be, copy, t->data, t->nbytes);
    w->data = copy;
    return 0;
}

/* A vector (norm weight or bias) of any dense dtype, as f32 in backend memory. */
int model_load_vector(struct model *m, const char *name, int64_t n, float **out, struct err *err)
{
    const struct st_tensor *t;
    int rc = find_tensor(m, name, &n, 1, &t, err);
    if (rc || (rc = check_unpermutable(t, n, err)))
        return rc;
    struct st_tensor part;
    void *staging = NULL;
    if (m->tp_ranks > 1) { /* a bias: rows of its projection's slice, never staged */
        if ((rc = shard_tensor(m, name, t, &part, &staging, err)))
            return rc;
        t = &part;
        n = part.shape[0];
    }
    if (dtype_is_block(t->dtype) || t->dtype == DTYPE_U32)
        return err_set(err, INFERD_EFORMAT, "vector %s is stored as %s; vectors must be F32, "
                       "F16 or BF16", name, dtype_name(t->dtype));
    if (!t->unpermute_heads)
        return upload_f32(m, t, (size_t)n, out, err);
    /* a GGUF q/k bias: a one-column matrix */
    return upload_dequantized(m, t, n, 1, out, err);
}

int model_load_norm(struct model *m, const char *name, int64_t n, float **out, struct err *err)
{
    if (!m->config.gemma_norm)
        return model_load_vector(m, name, n, out, err);
    const struct st_tensor *t;
    int rc = find_tensor(m, name, &n, 1, &t, err);
    if (rc)
        return rc;
    if (dtype_is_block(t->dtype) || t->unpermute_heads)
        return err_set(err, INFERD_EFORMAT, "norm %s is stored as %s; norms must be F32, F16 or "
                       "BF16", name, dtype_name(t->dtype));
    float *host = malloc((size_t)n * sizeof *host);
    if (!host)
        return err_set(err, INFERD_ENOMEM, "out of memory converting tensor '%s'", name);
    convert_f32(t, 0, (size_t)n, host);
    /* Gemma's RMSNorm scales by (1.0 + weight.float()): the same f32 sum here,
     * once, so the backend's plain RMSNorm computes the same products */
    for (int64_t i = 0; i < n; i++)
        host[i] = 1.0f + host[i];
    void *buf;
    if ((rc = alloc_owned(m, (size_t)n * sizeof(float), name, &buf, err))) {
        free(host);
        return rc;
    }
    m->backend->ops->to_device(m->backend, buf, host, (size_t)n * sizeof(float));
    free(host);
    *out = buf;
    return 0;
}

/* ---------------------------------------------------------------- the model */

static bool ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

static int check_no_extra_tensors(struct model *m, struct err *err)
{
    const struct st_set *set = &m->files;
    for (int i = 0; i < set->n_tensors; i++) {
        const char *name = set->tensors[i].name;
        if (set->used[i] || ends_with(name, "rotary_emb.inv_freq"))
            continue;
        /* a multimodal checkpoint's vision tower and projector: text-only here */
        if (m->config.multimodal && strncmp(name, m->prefix, strlen(m->prefix)) != 0 &&
            strcmp(name, "lm_head.weight") != 0)
            continue;
        return err_set(err, INFERD_EFORMAT, "unexpected tensor %.200s in %s (not used by %s)",
                       name, set->file_names[set->tensors[i].file_index],
                       model_arch_name(m->config.arch));
    }
    return 0;
}

/* Where the text model's tensors are: "model.", or in a
 * Gemma3ForConditionalGeneration checkpoint "language_model.model." (as
 * released) or "model.language_model." (as transformers 4.52+ saves it). */
static void pick_prefix(struct model *m)
{
    snprintf(m->prefix, sizeof m->prefix, "model.");
    if (!m->config.multimodal)
        return;
    static const char *const prefixes[] = {"language_model.model.", "model.language_model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (st_set_find(&m->files, name)) {
            snprintf(m->prefix, sizeof m->prefix, "%s", prefixes[i]);
            return;
        }
    }
}

static int load_weights(struct model *m, struct err *err)
{
    const struct model_config *c = &m->config;
    struct model_weights *W = &m->weights;
    char name[96];
    pick_prefix(m);
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->prefix);
    int rc = model_load_matrix(m, name, c->vocab_size, c->hidden_size, &W->embed, err);
    if (rc)
        return rc;
    W->layers = calloc((size_t)c->n_layers, sizeof *W->layers);
    if (!W->layers)
        return err_set(err, INFERD_ENOMEM, "out of memory for %d layers", c->n_layers);
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = m->arch->load_layer(m, i, &W->layers[i], err)))
            return rc;
    snprintf(name, sizeof name, "%snorm.weight", m->prefix);
    if ((rc = model_load_norm(m, name, c->hidden_size, &W->final_norm, err)))
        return rc;
    /* Tied checkpoints sometimes still carry lm_head.weight; when present it is what runs. */
    if (c->tie_word_embeddings && !st_set_find(&m->files, "lm_head.weight"))
        W->lm_head = W->embed;
    else if ((rc = model_load_matrix(m, "lm_head.weight", c->vocab_size, c->hidden_size,
                                     &W->lm_head, err)))
        return rc;
    return check_no_extra_tensors(m, err);
}

/* factors: GGUF's rope_freqs.weight (Llama 3 scaling as divisors of the
 * unscaled frequencies), or NULL to scale as config says. Outside the band
 * where transformers blends the two, dividing gives the same float as its
 * formula; inside it the blend rounds differently by an ulp or so. */
static int build_rope(struct model *m, const float *factors, struct err *err)
{
    const struct model_config *c = &m->config;
    int half = model_rope_dim(c) / 2;
    bool longrope = c->rope_scaling == ROPE_SCALING_LONGROPE;
    /* longrope: the short frequencies, then the long ones (rope_table) */
    m->rope_inv_freq = malloc((size_t)(longrope ? 2 * half : half) * sizeof *m->rope_inv_freq);
    if (!m->rope_inv_freq)
        return err_set(err, INFERD_ENOMEM, "out of memory for the rope table");
    model_rope_inv_freq(c, m->rope_inv_freq);
    for (int i = 0; factors && i < half; i++)
        m->rope_inv_freq[i] = (float)((double)m->rope_inv_freq[i] / factors[i]);
    m->rope.rot_dim = 2 * half;
    m->rope.inv_freq = m->rope_inv_freq;
    m->rope.attention_factor = 1.0f;
    if (longrope) {
        model_rope_inv_freq_long(c, m->rope_inv_freq + half);
        /* transformers switches to the long factors once a forward's last
         * position passes original_max_position_embeddings; here each token
         * picks by its own position, which keeps a token's K independent of
         * its step (the prefix cache, batch invariance) and equals a
         * transformers run whose forwards split there */
        m->rope.long_from = c->rope_original_max_position;
        m->rope.attention_factor = c->rope_attention_factor;
    }
    if (c->rope_local_theta > 0) {
        m->rope_local_inv_freq = malloc((size_t)half * sizeof *m->rope_local_inv_freq);
        if (!m->rope_local_inv_freq)
            return err_set(err, INFERD_ENOMEM, "out of memory for the rope table");
        model_rope_inv_freq_local(c, m->rope_local_inv_freq);
        m->rope_local = (struct rope_table){.rot_dim = 2 * half,
                                            .inv_freq = m->rope_local_inv_freq,
                                            .attention_factor = 1.0f};
    }
    return 0;
}

/* Gemma 3's embedding scale. transformers multiplies by sqrt(hidden_size)
 * cast to the dtype the model runs in: float32 for inferd's f32 activations
 * (EXACT, the goldens' run); FAST mode, whose matmuls take bf16 inputs,
 * rounds it as a bf16 run of a bf16 checkpoint does (sqrt(1152) = 33.94
 * becomes 34). */
static float embed_scale_of(const struct model *m)
{
    const struct model_config *c = &m->config;
    if (!c->embed_scale)
        return 0.0f;
    float s = (float)sqrt((double)c->hidden_size);
    if (m->backend->mode == COMPUTE_FAST && c->torch_dtype == DTYPE_BF16)
        s = bf16_to_f32(f32_to_bf16(s));
    return s;
}

/* Config and tensors of a model directory, or of one GGUF file. */
static int open_checkpoint(struct model *m, const char *path, float **rope_factors,
                           struct err *err)
{
    *rope_factors = NULL;
    if (!gguf_is_file(path)) {
        int rc = model_config_load(path, &m->config, &m->generation, err);
        return rc ? rc : st_set_open(path, &m->files, err);
    }
    struct gguf_file f;
    int rc = gguf_open(path, &f, err);
    if (rc)
        return rc;
    if ((rc = gguf_model_config(&f, &m->config, &m->generation, err)) ||
        (rc = gguf_rope_freqs(&f, m->config.head_dim, rope_factors, err)) ||
        (rc = gguf_tensor_set(&f, &m->config, path, &m->files, err)))
        err_wrap(err, "%s", path);
    gguf_close(&f);
    return rc;
}

int model_load(const char *dir, struct backend *be, struct model **out, struct err *err)
{
    return model_load_with(dir, be, &(struct model_load_options){0}, out, err);
}

int model_load_with(const char *dir, struct backend *be, const struct model_load_options *o,
                    struct model **out, struct err *err)
{
    *out = NULL;
    if (!be || !be->ops || !be->ops->alloc || !be->ops->release || !be->ops->to_device)
        return err_set(err, INFERD_EINVAL, "model_load needs a backend with memory ops");
    if (o->quantize != DTYPE_F32 && o->quantize != DTYPE_Q8_0 && o->quantize != DTYPE_Q4_K)
        return err_set(err, INFERD_EINVAL, "weights can be quantized at load to Q8_0 or Q4_K, "
                       "not %s", dtype_name(o->quantize));
    if (o->quantize != DTYPE_F32 &&
        !(backend_takes_blocks(be, o->quantize) && backend_takes_blocks(be, DTYPE_Q8_0) &&
          (o->quantize != DTYPE_Q4_K || backend_takes_blocks(be, DTYPE_Q6_K))))
        return err_set(err, INFERD_EUNSUPPORTED, "the %s backend does not run quantized weights "
                       "of type %s (quantizing to it at load needs a backend that does)", be->ops->name,
                       dtype_name(o->quantize));
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(err, INFERD_ENOMEM, "out of memory for the model");
    m->backend = be;
    m->quantize = o->quantize;
    m->tp_rank = o->tp_rank;
    m->tp_ranks = o->tp_ranks;
    float *rope_factors = NULL;
    int rc;
    if ((rc = open_checkpoint(m, dir, &rope_factors, err)))
        goto fail;
    /* config.json's architectures picks the family; config parsing already
     * refused the ones inferd does not know, so a miss here is a family
     * table that forgot an architecture. */
    if (!(m->arch = arch_find(m->config.arch))) {
        rc = err_set(err, INFERD_EUNSUPPORTED, "no model family runs %s",
                     model_arch_name(m->config.arch));
        goto fail;
    }
    if (m->tp_ranks > 1 && (rc = model_shard_check(m, err)))
        goto fail;
    if ((rc = load_weights(m, err))) {
        err_wrap(err, "loading %s", dir);
        goto fail;
    }
    if (m->tp_ranks > 1 && (rc = model_shard_finish(m, err)))
        goto fail;
    if ((rc = build_rope(m, rope_factors, err)))
        goto fail;
    if (!model_path_is_gguf(dir) && (rc = model_embedding_load(dir, &m->embedding, err)))
        goto fail;
    m->embed_scale = embed_scale_of(m);
    if ((m->config.arch == ARCH_GEMMA3) &&
        (!be->ops->gelu_tanh_mul || !be->ops->scale || !be->ops->softcap)) {
        rc = err_set(err, INFERD_EUNSUPPORTED, "the %s backend lacks the ops %s needs",
                     be->ops->name, model_arch_name(m->config.arch));
        goto fail;
    }
    free(rope_factors);
    *out = m;
    return 0;
fail:
    free(rope_factors);
    model_free(m);
    return rc;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    if (m->tp) { /* a group's front: its ranks own everything it points at */
        tp_group_free(m->tp);
        free(m);
        return;
    }
    for (int i = 0; i < m->n_owned_buffers; i++)
        m->backend->ops->release(m->backend, m->owned_buffers[i]);
    free(m->owned_buffers);
    for (int i = 0; m->weights.layers && i < m->config.n_layers; i++) {
        free(m->weights.layers[i].experts.gate);
        free(m->weights.layers[i].experts.up);
        free(m->weights.layers[i].experts.down);
    }
    free(m->weights.layers);
    free(m->rope_inv_freq);
    free(m->rope_local_inv_freq);
    st_set_close(&m->files);
    free(m);
}

static uint64_t matrix_bytes(const struct weight_matrix *w)
{
    return (uint64_t)w->rows * dtype_row_bytes(w->dtype, (uint64_t)w->cols);
}

uint64_t model_weight_bytes_per_token(const struct model *m)
{
    const struct model_config *c = &m->config;
    const uint64_t f = sizeof(float);
    uint64_t q_dim = (uint64_t)c->n_heads * c->head_dim,
             kv_dim = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t total = dtype_row_bytes(m->weights.embed.dtype, (uint64_t)c->hidden_size); /* one row */
    for (int i = 0; i < c->n_layers; i++) {
        const struct layer_weights *L = &m->weights.layers[i];
        total += matrix_bytes(&L->wq) + matrix_bytes(&L->wk) + matrix_bytes(&L->wv) +
                 matrix_bytes(&L->wo) + matrix_bytes(&L->w_gate) + matrix_bytes(&L->w_up) +
                 matrix_bytes(&L->w_down);
        /* a sparse layer reads its router and the top-k experts of n (their average share) */
        if (L->experts.n_experts)
            total += matrix_bytes(&L->router) + matrix_bytes(&L->shared_gate) +
                     matrix_bytes(&L->shared_up) + matrix_bytes(&L->shared_down) +
                     matrix_bytes(&L->shared_expert_gate) +
                     (uint64_t)c->n_experts_per_tok *
                         (matrix_bytes(&L->experts.gate[0]) + matrix_bytes(&L->experts.up[0]) +
                          matrix_bytes(&L->experts.down[0]));
        total += (L->attn_post_norm ? 4 : 2) * (uint64_t)c->hidden_size * f;
        if (L->bq)
            total += (q_dim + 2 * kv_dim) * f;
        if (L->q_norm)
            total += 2 * (uint64_t)c->head_dim * f;
    }
    total += (uint64_t)c->hidden_size * f + matrix_bytes(&m->weights.lm_head);
    return total;
}

uint64_t model_weight_bytes(const struct model *m)
{
    const struct weight_matrix *e = &m->weights.embed;
    uint64_t one_row = dtype_row_bytes(e->dtype, (uint64_t)m->config.hidden_size);
    uint64_t total = model_weight_bytes_per_token(m) - one_row;
    /* the experts a step does not read */
    for (int i = 0; i < m->config.n_layers; i++) {
        const struct moe_experts *ex = &m->weights.layers[i].experts;
        if (ex->n_experts)
            total += (uint64_t)(ex->n_experts - m->config.n_experts_per_tok) *
                     (matrix_bytes(&ex->gate[0]) + matrix_bytes(&ex->up[0]) +
                      matrix_bytes(&ex->down[0]));
    }
    if (m->weights.lm_head.data != e->data)
        total += matrix_bytes(e); /* untied: the table is not the head the step read */
    return total;
}

int model_tokenizer_load(const char *path, struct tokenizer **out, struct err *err)
{
    return gguf_is_file(path) ? gguf_tokenizer_load(path, out, err) : tok_load(path, out, err);
}

bool model_path_is_gguf(const char *path)
{
    return gguf_is_file(path);
}
