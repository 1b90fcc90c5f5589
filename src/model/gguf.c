/* model/gguf.c — GGUF parsing with every length checked against the image, and the mapping of llama.cpp's names and keys onto ours. */
#include "model/gguf.h"

#include "text/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" read little-endian */
#define GGUF_MAX_ENTRIES (1u << 24) /* keys or tensors: more is a corrupt count */

/* ---------------------------------------------------------------- ggml types */

static const struct {
    uint32_t id;
    const char *name;
    enum dtype dtype; /* DTYPE_COUNT: a type inferd does not load */
} ggml_types[] = {
    {0, "F32", DTYPE_F32},          {1, "F16", DTYPE_F16},         {2, "Q4_0", DTYPE_Q4_0},
    {3, "Q4_1", DTYPE_Q4_1},        {6, "Q5_0", DTYPE_Q5_0},       {7, "Q5_1", DTYPE_Q5_1},
    {8, "Q8_0", DTYPE_Q8_0},        {9, "Q8_1", DTYPE_COUNT},      {10, "Q2_K", DTYPE_Q2_K},
    {11, "Q3_K", DTYPE_Q3_K},       {12, "Q4_K", DTYPE_Q4_K},      {13, "Q5_K", DTYPE_Q5_K},
    {14, "Q6_K", DTYPE_Q6_K},       {15, "Q8_K", DTYPE_COUNT},     {16, "IQ2_XXS", DTYPE_COUNT},
    {17, "IQ2_XS", DTYPE_COUNT},    {18, "IQ3_XXS", DTYPE_COUNT},  {19, "IQ1_S", DTYPE_COUNT},
    {20, "IQ4_NL", DTYPE_COUNT},    {21, "IQ3_S", DTYPE_COUNT},    {22, "IQ2_S", DTYPE_COUNT},
    {23, "IQ4_XS", DTYPE_COUNT},    {24, "I8", DTYPE_COUNT},       {25, "I16", DTYPE_COUNT},
    {26, "I32", DTYPE_COUNT},       {27, "I64", DTYPE_COUNT},      {28, "F64", DTYPE_COUNT},
    {29, "IQ1_M", DTYPE_COUNT},     {30, "BF16", DTYPE_BF16},      {34, "TQ1_0", DTYPE_COUNT},
    {35, "TQ2_0", DTYPE_COUNT},     {39, "MXFP4", DTYPE_COUNT},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *gguf_type_name(uint32_t ggml_type)
{
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].id == ggml_type)
            return ggml_types[i].name;
    return "unknown";
}

uint32_t gguf_ggml_type(enum dtype t)
{
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].dtype == t)
            return ggml_types[i].id;
    return UINT32_MAX;
}

/* ---------------------------------------------------------------- the cursor */

/* Reads advance pos; a read past the end fails and names what was read. */
struct cursor {
    const uint8_t *buf;
    size_t len, pos;
    struct err *err;
};

static int need(struct cursor *c, uint64_t n, const char *what)
{
    if (n > c->len - c->pos)
        return err_set(c->err, INFERD_EFORMAT,
                       "truncated at byte %zu: %s needs %llu bytes, %zu remain", c->pos, what,
                       (unsigned long long)n, c->len - c->pos);
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int read_uint(struct cursor *c, int n, const char *what, uint64_t *out)
{
    int rc = need(c, (uint64_t)n, what);
    if (rc)
        return rc;
    *out = le(c->buf + c->pos, n);
    c->pos += (size_t)n;
    return 0;
}

static int read_u32(struct cursor *c, const char *what, uint32_t *out)
{
    uint64_t v = 0;
    int rc = read_uint(c, 4, what, &v);
    *out = (uint32_t)v;
    return rc;
}

/* A string's bytes stay in the image: *s points at them. */
static int read_string(struct cursor *c, const char *what, const uint8_t **s, uint64_t *len)
{
    int rc = read_uint(c, 8, what, len);
    if (rc || (rc = need(c, *len, what)))
        return rc;
    *s = c->buf + c->pos;
    c->pos += (size_t)*len;
    return 0;
}

static char *dup_name(const uint8_t *s, uint64_t len)
{
    char *d = malloc((size_t)len + 1);
    if (d) {
        memcpy(d, s, (size_t)len);
        d[len] = '\0';
    }
    return d;
}

static int scalar_bytes(enum gguf_type t)
{
    static const signed char sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, -1, -1, 8, 8, 8};
    return (unsigned)t < sizeof sizes ? sizes[t] : -1;
}

static bool type_known(uint32_t t) { return t <= GGUF_F64; }

/* A scalar of type t at p into kv's i and f. */
static void scalar_value(enum gguf_type t, const uint8_t *p, int64_t *i, double *f)
{
    uint64_t u = le(p, scalar_bytes(t));
    switch (t) {
    case GGUF_I8: *i = (int8_t)u; break;
    case GGUF_I16: *i = (int16_t)u; break;
    case GGUF_I32: *i = (int32_t)u; break;
    case GGUF_I64: *i = (int64_t)u; break;
    case GGUF_F32: {
        uint32_t b = (uint32_t)u;
        float x;
        memcpy(&x, &b, 4);
        *f = x;
        *i = 0;
        return;
    }
    case GGUF_F64: memcpy(f, &u, 8); *i = 0; return;
    default: *i = (int64_t)u; break; /* unsigned and bool; U64 above 2^63 wraps and is range-checked by readers */
    }
    *f = (double)*i;
}

static int parse_value(struct cursor *c, struct gguf_kv *kv)
{
    int rc;
    if (kv->type == GGUF_STRING)
        return read_string(c, kv->key, &kv->data, &kv->len);
    if (kv->type != GGUF_ARRAY) {
        int n = scalar_bytes(kv->type);
        if ((rc = need(c, (uint64_t)n, kv->key)))
            return rc;
        if (kv->type == GGUF_BOOL && c->buf[c->pos] > 1)
            return err_set(c->err, INFERD_EFORMAT, "key %.200s: bool value %u is neither 0 nor 1",
                           kv->key, c->buf[c->pos]);
        scalar_value(kv->type, c->buf + c->pos, &kv->i, &kv->f);
        kv->n = 1;
        c->pos += (size_t)n;
        return 0;
    }
    uint32_t et;
    if ((rc = read_u32(c, kv->key, &et)) || (rc = read_uint(c, 8, kv->key, &kv->n)))
        return rc;
    if (!type_known(et))
        return err_set(c->err, INFERD_EFORMAT, "key %.200s: array of unknown type %u", kv->key, et);
    if (et == GGUF_ARRAY)
        return err_set(c->err, INFERD_EUNSUPPORTED,
                       "key %.200s: arrays of arrays are not supported", kv->key);
    kv->elem_type = (enum gguf_type)et;
    kv->data = c->buf + c->pos;
    if (et != GGUF_STRING) {
        uint64_t bytes;
        if (__builtin_mul_overflow(kv->n, (uint64_t)scalar_bytes(kv->elem_type), &bytes))
            return err_set(c->err, INFERD_EFORMAT, "key %.200s: array of %llu elements overflows",
                           kv->key, (unsigned long long)kv->n);
        if ((rc = need(c, bytes, kv->key)))
            return rc;
        c->pos += (size_t)bytes;
        return 0;
    }
    /* Each string is at least its 8-byte length: a count the rest of the file
     * cannot hold is refused before anything is allocated for it. */
    if (kv->n > (c->len - c->pos) / 8)
        return err_set(c->err, INFERD_EFORMAT,
                       "key %.200s: %llu strings cannot fit in the %zu bytes left", kv->key,
                       (unsigned long long)kv->n, c->len - c->pos);
    kv->str_offsets = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str_offsets);
    if (!kv->str_offsets)
        return err_set(c->err, INFERD_ENOMEM, "out of memory for key %.200s", kv->key);
    for (uint64_t k = 0; k < kv->n; k++) {
        const uint8_t *s;
        uint64_t len;
        kv->str_offsets[k] = (uint64_t)(c->buf + c->pos - kv->data);
        if ((rc = read_string(c, kv->key, &s, &len)))
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- the file */

static int cmp_kv(const void *a, const void *b)
{
    return strcmp(((const struct gguf_kv *)a)->key, ((const struct gguf_kv *)b)->key);
}

static int parse_kvs(struct cursor *c, uint64_t n, struct gguf_file *f)
{
    f->kvs = calloc((size_t)(n ? n : 1), sizeof *f->kvs);
    if (!f->kvs)
        return err_set(c->err, INFERD_ENOMEM, "out of memory for %llu metadata keys",
                       (unsigned long long)n);
    for (uint64_t k = 0; k < n; k++) {
        struct gguf_kv *kv = &f->kvs[f->n_kvs];
        const uint8_t *key;
        uint64_t key_len;
        uint32_t type;
        int rc = read_string(c, "a metadata key", &key, &key_len);
        if (rc)
            return rc;
        if (!(kv->key = dup_name(key, key_len)))
            return err_set(c->err, INFERD_ENOMEM, "out of memory for metadata keys");
        f->n_kvs++;
        if (strlen(kv->key) != key_len)
            return err_set(c->err, INFERD_EFORMAT, "metadata key %llu contains a NUL byte",
                           (unsigned long long)k);
        if ((rc = read_u32(c, kv->key, &type)))
            return rc;
        if (!type_known(type))
            return err_set(c->err, INFERD_EFORMAT, "key %.200s has unknown value type %u",
                           kv->key, type);
        kv->type = (enum gguf_type)type;
        if ((rc = parse_value(c, kv)))
            return rc;
    }
    qsort(f->kvs, (size_t)f->n_kvs, sizeof *f->kvs, cmp_kv);
    for (int k = 1; k < f->n_kvs; k++)
        if (strcmp(f->kvs[k - 1].key, f->kvs[k].key) == 0)
            return err_set(c->err, INFERD_EFORMAT, "metadata key %.200s appears twice",
                           f->kvs[k].key);
    return 0;
}

static enum dtype tensor_dtype(uint32_t ggml_type, bool *known)
{
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].id == ggml_type) {
            *known = true;
            return ggml_types[i].dtype;
        }
    *known = false;
    return DTYPE_COUNT;
}

static int parse_tensor_info(struct cursor *c, struct gguf_tensor *t)
{
    const uint8_t *name;
    uint64_t name_len, n_dims;
    int rc = read_string(c, "a tensor name", &name, &name_len);
    if (rc)
        return rc;
    if (!(t->name = dup_name(name, name_len)))
        return err_set(c->err, INFERD_ENOMEM, "out of memory for tensor names");
    if (strlen(t->name) != name_len)
        return err_set(c->err, INFERD_EFORMAT, "a tensor name contains a NUL byte");
    if ((rc = read_uint(c, 4, t->name, &n_dims)))
        return rc;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(c->err, INFERD_EFORMAT, "tensor %.200s has %llu dimensions (1..%d)",
                       t->name, (unsigned long long)n_dims, GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t numel = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((rc = read_uint(c, 8, t->name, &ne)))
            return rc;
        if (ne == 0 || ne > INT64_MAX || __builtin_mul_overflow(numel, ne, &numel) ||
            numel > INT64_MAX)
            return err_set(c->err, INFERD_EFORMAT,
                           "tensor %.200s: dimension %d is %llu (empty or overflowing)", t->name,
                           d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((rc = read_u32(c, t->name, &t->ggml_type)) || (rc = read_uint(c, 8, t->name, &t->offset)))
        return rc;
    bool known;
    t->dtype = tensor_dtype(t->ggml_type, &known);
    if (!known)
        return err_set(c->err, INFERD_EFORMAT, "tensor %.200s has unknown type %u", t->name,
                       t->ggml_type);
    if (t->dtype == DTYPE_COUNT)
        return err_set(c->err, INFERD_EUNSUPPORTED,
                       "tensor %.200s has type %s, which inferd does not load (supported: F32, "
                       "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                       t->name, gguf_type_name(t->ggml_type));
    int block = dtype_block_elems(t->dtype);
    if (t->ne[0] % block != 0)
        return err_set(c->err, INFERD_EFORMAT,
                       "tensor %.200s: rows of %lld elements are not whole %s blocks of %d",
                       t->name, (long long)t->ne[0], dtype_name(t->dtype), block);
    if (__builtin_mul_overflow(numel / (uint64_t)block, (uint64_t)dtype_block_bytes(t->dtype),
                               &t->nbytes))
        return err_set(c->err, INFERD_EFORMAT, "tensor %.200s: size overflows", t->name);
    return 0;
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a,
                             *y = *(const struct gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static int cmp_tensor_name_p(const void *a, const void *b)
{
    return strcmp((*(const struct gguf_tensor *const *)a)->name,
                  (*(const struct gguf_tensor *const *)b)->name);
}

/* Places tensors in the data section: aligned, inside the file, disjoint, named once. */
static int check_tensor_layout(struct cursor *c, struct gguf_file *f)
{
    uint64_t data_len = c->len - f->data_offset;
    for (int i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            return err_set(c->err, INFERD_EFORMAT,
                           "tensor %.200s: offset %llu is not a multiple of the alignment %u",
                           t->name, (unsigned long long)t->offset, f->alignment);
        if (t->offset > data_len || t->nbytes > data_len - t->offset)
            return err_set(c->err, INFERD_EFORMAT,
                           "tensor %.200s: bytes [%llu, +%llu) lie outside the %llu-byte data "
                           "section",
                           t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                           (unsigned long long)data_len);
        t->data = c->buf + f->data_offset + t->offset;
    }
    if (f->n_tensors < 2)
        return 0;
    const struct gguf_tensor **order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order)
        return err_set(c->err, INFERD_ENOMEM, "out of memory checking %d tensors", f->n_tensors);
    for (int i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    int rc = 0;
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_tensor_offset);
    for (int i = 1; i < f->n_tensors && !rc; i++)
        if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset)
            rc = err_set(c->err, INFERD_EFORMAT, "tensors %.200s and %.200s overlap",
                         order[i - 1]->name, order[i]->name);
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_tensor_name_p);
    for (int i = 1; i < f->n_tensors && !rc; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            rc = err_set(c->err, INFERD_EFORMAT, "tensor %.200s appears twice", order[i]->name);
    free(order);
    return rc;
}

int gguf_parse(const uint8_t *buf, size_t len, struct gguf_file *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    struct cursor c = {.buf = buf, .len = len, .err = err};
    uint32_t magic;
    uint64_t n_tensors, n_kvs;
    int rc = read_u32(&c, "the magic", &magic);
    if (rc)
        return err_set(err, INFERD_EFORMAT, "file is %zu bytes, too short for a GGUF header", len);
    if (magic != GGUF_MAGIC)
        return err_set(err, INFERD_EFORMAT, "not a GGUF file (magic %08x)", magic);
    if ((rc = read_u32(&c, "the version", &out->version)))
        return rc;
    if (out->version != 2 && out->version != 3) {
        uint32_t swapped = __builtin_bswap32(out->version);
        if (swapped == 2 || swapped == 3)
            return err_set(err, INFERD_EUNSUPPORTED, "big-endian GGUF files are not supported");
        return err_set(err, INFERD_EUNSUPPORTED, "GGUF version %u is not supported (2 or 3)",
                       out->version);
    }
    if ((rc = read_uint(&c, 8, "the tensor count", &n_tensors)) ||
        (rc = read_uint(&c, 8, "the metadata count", &n_kvs)))
        return rc;
    if (n_tensors > GGUF_MAX_ENTRIES || n_kvs > GGUF_MAX_ENTRIES)
        return err_set(err, INFERD_EFORMAT, "implausible counts: %llu tensors, %llu keys",
                       (unsigned long long)n_tensors, (unsigned long long)n_kvs);
    if ((rc = parse_kvs(&c, n_kvs, out)))
        goto fail;
    out->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find(out, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32 || al->i == 0 || (al->i & (al->i - 1)) != 0 || al->i > 65536) {
            rc = err_set(err, INFERD_EFORMAT,
                         "general.alignment must be a u32 power of two up to 65536");
            goto fail;
        }
        out->alignment = (uint32_t)al->i;
    }
    /* Each tensor record is at least 8 + 4 + 8 + 4 + 8 bytes. */
    if (n_tensors > (len - c.pos) / 32) {
        rc = err_set(err, INFERD_EFORMAT, "%llu tensors cannot fit in the %zu bytes left",
                     (unsigned long long)n_tensors, len - c.pos);
        goto fail;
    }
    out->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *out->tensors);
    if (!out->tensors) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for %llu tensors",
                     (unsigned long long)n_tensors);
        goto fail;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        out->n_tensors++;
        if ((rc = parse_tensor_info(&c, &out->tensors[i])))
            goto fail;
    }
    uint64_t pad = (out->alignment - c.pos % out->alignment) % out->alignment;
    if (n_tensors && (rc = need(&c, pad, "the padding before the data section")))
        goto fail;
    out->data_offset = c.pos + (n_tensors ? pad : 0);
    if ((rc = check_tensor_layout(&c, out)))
        goto fail;
    out->image = buf;
    out->image_len = len;
    return 0;
fail:
    gguf_close(out);
    return rc;
}

int gguf_open(const char *path, struct gguf_file *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, INFERD_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        return err_set(err, INFERD_EIO, "%s is not a readable, non-empty regular file", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (map == MAP_FAILED) {
        close(fd);
        return err_set(err, INFERD_EIO, "cannot map %s: %s", path, strerror(map_errno));
    }
    madvise(map, len, MADV_WILLNEED); /* hints, as for safetensors */
    madvise(map, len, MADV_HUGEPAGE);
    int rc = gguf_parse(map, len, out, err);
    if (rc) {
        munmap(map, len);
        close(fd);
        return err_wrap(err, "%s", path);
    }
    out->map = map;
    out->map_len = len;
    out->fd = fd;
    return 0;
}

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_kvs; i++) {
        free(f->kvs[i].key);
        free(f->kvs[i].str_offsets);
    }
    free(f->kvs);
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->map)
        munmap(f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

bool gguf_is_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    uint8_t magic[4];
    bool yes = read(fd, magic, 4) == 4 && le(magic, 4) == GGUF_MAGIC;
    close(fd);
    return yes;
}

/* ---------------------------------------------------------------- lookups */

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key)
{
    struct gguf_kv probe = {.key = (char *)key};
    if (!f->n_kvs)
        return NULL;
    return bsearch(&probe, f->kvs, (size_t)f->n_kvs, sizeof *f->kvs, cmp_kv);
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

static bool is_integer(enum gguf_type t)
{
    return t <= GGUF_I32 || t == GGUF_U64 || t == GGUF_I64;
}

int gguf_get_int(const struct gguf_file *f, const char *key, bool required, int64_t lo,
                 int64_t hi, int64_t *out, struct err *err)
{
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return required ? err_set(err, INFERD_EFORMAT, "missing metadata key %s", key) : 0;
    if (!is_integer(kv->type))
        return err_set(err, INFERD_EFORMAT, "metadata key %s must be an integer", key);
    if ((kv->type == GGUF_U64 && kv->i < 0) || kv->i < lo || kv->i > hi)
        return err_set(err, INFERD_ERANGE, "metadata key %s = %lld is out of range (%lld..%lld)",
                       key, (long long)kv->i, (long long)lo, (long long)hi);
    *out = kv->i;
    return 0;
}

int gguf_get_float(const struct gguf_file *f, const char *key, bool required, double *out,
                   struct err *err)
{
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return required ? err_set(err, INFERD_EFORMAT, "missing metadata key %s", key) : 0;
    if (kv->type != GGUF_F32 && kv->type != GGUF_F64 && !is_integer(kv->type))
        return err_set(err, INFERD_EFORMAT, "metadata key %s must be a number", key);
    *out = kv->f;
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool required, bool *out,
                  struct err *err)
{
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return required ? err_set(err, INFERD_EFORMAT, "missing metadata key %s", key) : 0;
    if (kv->type != GGUF_BOOL)
        return err_set(err, INFERD_EFORMAT, "metadata key %s must be a bool", key);
    *out = kv->i != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, bool required, const char **s,
                 size_t *len, struct err *err)
{
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return required ? err_set(err, INFERD_EFORMAT, "missing metadata key %s", key) : 0;
    if (kv->type != GGUF_STRING)
        return err_set(err, INFERD_EFORMAT, "metadata key %s must be a string", key);
    *s = (const char *)kv->data;
    if (len)
        *len = (size_t)kv->len;
    return 0;
}

void gguf_array_str(const struct gguf_kv *kv, uint64_t k, const char **s, size_t *len)
{
    const uint8_t *p = kv->data + kv->str_offsets[k];
    *len = (size_t)le(p, 8);
    *s = (const char *)p + 8;
}

double gguf_array_num(const struct gguf_kv *kv, uint64_t k)
{
    int64_t i;
    double f;
    scalar_value(kv->elem_type, kv->data + k * (uint64_t)scalar_bytes(kv->elem_type), &i, &f);
    return f;
}

/* ---------------------------------------------------------------- model config */

static const struct {
    const char *gguf, *class_name;
    enum model_arch arch;
    bool permuted; /* llama.cpp's converter reorders q/k rows for its interleaved rope */
} gguf_archs[] = {
    {"llama", "LlamaForCausalLM", ARCH_LLAMA, true},
    {"mistral", "MistralForCausalLM", ARCH_MISTRAL, true},
    {"qwen2", "Qwen2ForCausalLM", ARCH_QWEN2, false},
    {"qwen3", "Qwen3ForCausalLM", ARCH_QWEN3, false},
    {"qwen3moe", "Qwen3MoeForCausalLM", ARCH_QWEN3_MOE, false},
    {"gemma3", "Gemma3ForCausalLM", ARCH_GEMMA3, false},
    {"phi3", "Phi3ForCausalLM", ARCH_PHI3, false},
};

static int find_arch(const struct gguf_file *f, const char **name, int *index, struct err *err)
{
    size_t len;
    int rc = gguf_get_str(f, "general.architecture", true, name, &len, err);
    if (rc)
        return rc;
    for (int i = 0; i < (int)(sizeof gguf_archs / sizeof gguf_archs[0]); i++)
        if (strlen(gguf_archs[i].gguf) == len && memcmp(gguf_archs[i].gguf, *name, len) == 0) {
            *name = gguf_archs[i].gguf;
            *index = i;
            return 0;
        }
    return err_set(err, INFERD_EUNSUPPORTED,
                   "general.architecture '%.*s' is not supported (llama, mistral, qwen2, qwen3, "
                   "qwen3moe, gemma3, phi3)",
                   (int)(len < 100 ? len : 100), *name);
}

/* {arch}.suffix as an int in [lo, hi]. */
static int arch_int(const struct gguf_file *f, const char *arch, const char *suffix, bool required,
                    int64_t lo, int64_t hi, int *out, struct err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v = *out;
    int rc = gguf_get_int(f, key, required, lo, hi, &v, err);
    *out = (int)v;
    return rc;
}

static int arch_float(const struct gguf_file *f, const char *arch, const char *suffix,
                      float *inout, struct err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v = *inout;
    int rc = gguf_get_float(f, key, false, &v, err);
    *inout = (float)v;
    return rc;
}

static void add_eos(struct model_config *c, int64_t id)
{
    if (id < 0 || id >= c->vocab_size || c->n_eos == CONFIG_MAX_EOS)
        return;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == id)
            return;
    c->eos_token_ids[c->n_eos++] = (int)id;
}

static int config_rope(const struct gguf_file *f, const char *arch, struct model_config *c,
                       struct err *err)
{
    c->rope_theta = 10000.0f;
    int rc = arch_float(f, arch, "rope.freq_base", &c->rope_theta, err);
    if (rc)
        return rc;
    if (!(c->rope_theta > 0))
        return err_set(err, INFERD_ERANGE, "%s.rope.freq_base must be positive", arch);
    int rot = c->head_dim;
    if ((rc = arch_int(f, arch, "rope.dimension_count", false, 1, 1024, &rot, err)))
        return rc;
    if (rot != c->head_dim && (c->arch != ARCH_PHI3 || rot > c->head_dim || rot % 2 != 0))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "%s.rope.dimension_count = %d: partial rotary embeddings (head_dim %d) are "
                       "only supported for phi3, and must be even and within head_dim",
                       arch, rot, c->head_dim);
    c->rope_dim = rot; /* Phi-4-mini rotates part of each head */
    char key[128];
    const char *type = NULL;
    size_t type_len = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if ((rc = gguf_get_str(f, key, false, &type, &type_len, err)))
        return rc;
    c->rope_scaling = ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    if (!type || (type_len == 4 && !memcmp(type, "none", 4)))
        return 0;
    if (type_len == 6 && !memcmp(type, "linear", 6)) {
        if ((rc = arch_float(f, arch, "rope.scaling.factor", &c->rope_factor, err)))
            return rc;
        if (!(c->rope_factor > 0))
            return err_set(err, INFERD_ERANGE, "%s.rope.scaling.factor must be positive", arch);
        c->rope_scaling = c->rope_factor == 1.0f ? ROPE_SCALING_NONE : ROPE_SCALING_LINEAR;
        return 0;
    }
    return err_set(err, INFERD_EUNSUPPORTED, "%s.rope.scaling.type '%.*s' is not supported",
                   arch, (int)(type_len < 40 ? type_len : 40), type);
}

/* Gemma 3 as llama.cpp stores it: every RMSNorm weight already 1 + w (its
 * converter adds the offset), one window, every sixth layer global, the local
 * layers' RoPE base 10000 and the query scale by the released sizes' rule,
 * unless the file says otherwise (attention.sliding_window_pattern: a period
 * or a per-layer bool array, rope.freq_base_swa, attention.scale). */
static int config_gemma3(const struct gguf_file *f, const char *arch, struct model_config *c,
                         struct err *err)
{
    char key[128];
    int rc;
    c->qk_norm = c->embed_scale = c->gelu_tanh = true;
    c->gemma_norm = false;
    if ((rc = arch_int(f, arch, "attention.sliding_window", false, 0, INT32_MAX,
                       &c->sliding_window, err)))
        return rc;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const struct gguf_kv *pat = gguf_find(f, key);
    if (pat && pat->type == GGUF_ARRAY) {
        if (pat->n != (uint64_t)c->n_layers ||
            (pat->elem_type != GGUF_BOOL && (pat->elem_type > GGUF_I32)))
            return err_set(err, INFERD_EFORMAT, "%s must be %d bools (one per layer)", key,
                           c->n_layers);
        for (int i = 0; i < c->n_layers; i++)
            c->layer_sliding[i] = gguf_array_num(pat, (uint64_t)i) != 0;
    } else {
        int pattern = 6;
        if ((rc = arch_int(f, arch, "attention.sliding_window_pattern", false, 1, INT32_MAX,
                           &pattern, err)))
            return rc;
        for (int i = 0; i < c->n_layers; i++)
            c->layer_sliding[i] = (i + 1) % pattern != 0;
    }
    if (!c->sliding_window)
        memset(c->layer_sliding, 0, sizeof c->layer_sliding);
    c->rope_local_theta = 10000.0f;
    if ((rc = arch_float(f, arch, "rope.freq_base_swa", &c->rope_local_theta, err)))
        return rc;
    if (!(c->rope_local_theta > 0))
        return err_set(err, INFERD_ERANGE, "%s.rope.freq_base_swa must be positive", arch);
    /* llama.cpp: 1/sqrt(head_dim), but hidden / heads for the 27B (62 layers) */
    double qpas = c->n_layers == 62 ? (double)(c->hidden_size / c->n_heads) : c->head_dim;
    c->query_scale = (float)pow(qpas, -0.5);
    if ((rc = arch_float(f, arch, "attention.scale", &c->query_scale, err)))
        return rc;
    float attn_cap = 0;
    if ((rc = arch_float(f, arch, "final_logit_softcapping", &c->final_logit_softcap, err)) ||
        (rc = arch_float(f, arch, "attn_logit_softcapping", &attn_cap, err)))
        return rc;
    if (!(c->query_scale > 0) || !(c->final_logit_softcap >= 0))
        return err_set(err, INFERD_ERANGE, "%s.attention.scale must be positive and "
                       "%s.final_logit_softcapping not negative", arch, arch);
    if (attn_cap != 0)
        return err_set(err, INFERD_EUNSUPPORTED, "%s.attn_logit_softcapping (soft-capped "
                       "attention scores) is not supported", arch);
    return 0;
}

/* One of Phi-3's longrope factor tensors: model_rope_dim / 2 positive F32s. */
static int rope_factor_tensor(const struct gguf_tensor *t, int n, float *out, struct err *err)
{
    if (t->dtype != DTYPE_F32 || t->n_dims != 1 || t->ne[0] != n)
        return err_set(err, INFERD_EFORMAT, "%s must be F32 of rope.dimension_count / 2 = %d "
                       "elements", t->name, n);
    memcpy(out, t->data, (size_t)n * sizeof *out);
    for (int i = 0; i < n; i++)
        if (!(out[i] > 0) || out[i] > 1e9f)
            return err_set(err, INFERD_ERANGE, "%s[%d] = %g is not a positive factor", t->name,
                           i, (double)out[i]);
    return 0;
}

/* Phi-3 as llama.cpp stores it: longrope as the F32 tensors rope_factors_short
 * and rope_factors_long with rope.scaling.original_context_length and
 * rope.scaling.attn_factor; a window of 0 is none (Phi-4). */
static int config_phi3(const struct gguf_file *f, const char *arch, struct model_config *c,
                       struct err *err)
{
    int rc;
    if ((rc = arch_int(f, arch, "attention.sliding_window", false, 0, INT32_MAX,
                       &c->sliding_window, err)))
        return rc;
    const struct gguf_tensor *sf = gguf_find_tensor(f, "rope_factors_short.weight"),
                             *lf = gguf_find_tensor(f, "rope_factors_long.weight");
    if (!sf && !lf)
        return 0;
    if (!sf || !lf)
        return err_set(err, INFERD_EFORMAT,
                       "rope_factors_short.weight and rope_factors_long.weight come together");
    c->n_rope_factors = model_rope_dim(c) / 2;
    if (c->n_rope_factors > CONFIG_MAX_ROPE_FACTORS)
        return err_set(err, INFERD_ERANGE, "longrope needs %d factors (at most %d are supported)",
                       c->n_rope_factors, CONFIG_MAX_ROPE_FACTORS);
    if ((rc = rope_factor_tensor(sf, c->n_rope_factors, c->rope_short_factor, err)) ||
        (rc = rope_factor_tensor(lf, c->n_rope_factors, c->rope_long_factor, err)))
        return rc;
    c->rope_original_max_position = c->max_position_embeddings;
    if ((rc = arch_int(f, arch, "rope.scaling.original_context_length", false, 1, 16 << 20,
                       &c->rope_original_max_position, err)))
        return rc;
    /* transformers' (and the converter's) attention factor when none is stored */
    double factor = (double)c->max_position_embeddings / c->rope_original_max_position;
    c->rope_attention_factor =
        (float)(factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(c->rope_original_max_position)));
    if ((rc = arch_float(f, arch, "rope.scaling.attn_factor", &c->rope_attention_factor, err)))
        return rc;
    if (!(c->rope_attention_factor > 0) || c->rope_attention_factor > 1e6f)
        return err_set(err, INFERD_ERANGE, "%s.rope.scaling.attn_factor must be positive", arch);
    c->rope_scaling = ROPE_SCALING_LONGROPE;
    return 0;
}

/* Qwen3-MoE as llama.cpp stores it: expert counts and sizes as keys, the
 * router blk.N.ffn_gate_inp; a layer without one is dense (mlp_only_layers). */
static int config_qwen3moe(const struct gguf_file *f, const char *arch, struct model_config *c,
                           struct err *err)
{
    int rc;
    c->qk_norm = true;
    c->norm_topk_prob = true; /* llama.cpp's qwen3moe graph always renormalizes */
    c->decoder_sparse_step = 1;
    if ((rc = arch_int(f, arch, "expert_count", true, 1, CONFIG_MAX_EXPERTS, &c->n_experts,
                       err)) ||
        (rc = arch_int(f, arch, "expert_used_count", true, 1,
                       c->n_experts < CONFIG_MAX_EXPERTS_PER_TOK ? c->n_experts
                                                                 : CONFIG_MAX_EXPERTS_PER_TOK,
                       &c->n_experts_per_tok, err)) ||
        (rc = arch_int(f, arch, "expert_feed_forward_length", true, 1, 1 << 20,
                       &c->moe_intermediate_size, err)) ||
        (rc = arch_int(f, arch, "expert_shared_feed_forward_length", false, 0, 1 << 20,
                       &c->shared_expert_intermediate_size, err)))
        return rc;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if ((rc = gguf_get_bool(f, key, false, &c->norm_topk_prob, err)))
        return rc;
    for (int i = 0; i < c->n_layers; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
        c->mlp_only_layers[i] = gguf_find_tensor(f, name) == NULL;
    }
    return 0;
}

int gguf_model_config(const struct gguf_file *f, struct model_config *cfg,
                      struct generation_defaults *gen, struct err *err)
{
    const char *arch;
    int ai = 0, rc;
    if ((rc = find_arch(f, &arch, &ai, err)))
        return rc;
    struct model_config c = {.arch = gguf_archs[ai].arch, .bos_token_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "%s", gguf_archs[ai].class_name);
    c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-6f;
    if ((rc = arch_int(f, arch, "embedding_length", true, 1, 65536, &c.hidden_size, err)) ||
        (rc = arch_int(f, arch, "feed_forward_length", true, 1, 1 << 20, &c.intermediate_size,
                       err)) ||
        (rc = arch_int(f, arch, "block_count", true, 1, 1024, &c.n_layers, err)) ||
        (rc = arch_int(f, arch, "attention.head_count", true, 1, 1024, &c.n_heads, err)))
        return rc;
    c.n_kv_heads = c.n_heads;
    if ((rc = arch_int(f, arch, "attention.head_count_kv", false, 1, 1024, &c.n_kv_heads, err)) ||
        (rc = arch_int(f, arch, "context_length", false, 1, 16 << 20, &c.max_position_embeddings,
                       err)) ||
        (rc = arch_float(f, arch, "attention.layer_norm_rms_epsilon", &c.rms_norm_eps, err)))
        return rc;
    if (c.n_heads % c.n_kv_heads != 0)
        return err_set(err, INFERD_ERANGE,
                       "%s.attention.head_count (%d) is not a multiple of head_count_kv (%d)",
                       arch, c.n_heads, c.n_kv_heads);
    if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
        return err_set(err, INFERD_ERANGE, "%s.attention.layer_norm_rms_epsilon must be in (0, 1)",
                       arch);
    c.head_dim = c.hidden_size % c.n_heads == 0 ? c.hidden_size / c.n_heads : 0;
    if ((rc = arch_int(f, arch, "attention.key_length", c.head_dim == 0, 2, 1024, &c.head_dim,
                       err)))
        return rc;
    int v_dim = c.head_dim;
    if ((rc = arch_int(f, arch, "attention.value_length", false, 1, 1024, &v_dim, err)))
        return rc;
    if (v_dim != c.head_dim || c.head_dim % 2 != 0)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "head sizes key %d, value %d: inferd needs them equal and even", c.head_dim,
                       v_dim);
    if ((rc = config_rope(f, arch, &c, err)))
        return rc;

    const struct gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    if (!embd || embd->n_dims != 2 || embd->ne[0] != c.hidden_size)
        return err_set(err, INFERD_EFORMAT,
                       "token_embd.weight is missing or not a [vocab, %d] matrix", c.hidden_size);
    if (embd->ne[1] > (4 << 20))
        return err_set(err, INFERD_ERANGE, "vocabulary of %lld tokens is too large",
                       (long long)embd->ne[1]);
    c.vocab_size = (int)embd->ne[1];
    c.tie_word_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    c.attention_bias = c.arch == ARCH_QWEN2 || gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    c.qk_norm = c.arch == ARCH_QWEN3;
    c.torch_dtype = embd->dtype <= DTYPE_F16 ? embd->dtype : DTYPE_F32;
    if (c.arch == ARCH_MISTRAL &&
        (rc = arch_int(f, arch, "attention.sliding_window", false, 0, INT32_MAX,
                       &c.sliding_window, err)))
        return rc;
    if ((c.arch == ARCH_GEMMA3 && (rc = config_gemma3(f, arch, &c, err))) ||
        (c.arch == ARCH_PHI3 && (rc = config_phi3(f, arch, &c, err))) ||
        (c.arch == ARCH_QWEN3_MOE && (rc = config_qwen3moe(f, arch, &c, err))))
        return rc;

    int64_t id = -1;
    if ((rc = gguf_get_int(f, "tokenizer.ggml.bos_token_id", false, 0, c.vocab_size - 1, &id,
                           err)))
        return rc;
    c.bos_token_id = (int)id;
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (int k = 0; k < 3; k++) {
        id = -1;
        if ((rc = gguf_get_int(f, eos_keys[k], false, 0, c.vocab_size - 1, &id, err)))
            return rc;
        add_eos(&c, id);
    }
    *cfg = c;
    if (gen) {
        generation_defaults_init(gen);
        gen->bos_token_id = c.bos_token_id;
        memcpy(gen->eos_token_ids, c.eos_token_ids, sizeof c.eos_token_ids);
        gen->n_eos = c.n_eos;
    }
    return 0;
}

/* ---------------------------------------------------------------- tensor names */

static const struct {
    const char *gguf, *hf;
} layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

/* Names that differ by family, looked up before the shared ones: Gemma 3's
 * sandwich norms (its ffn_norm is the pre-feedforward norm), Phi-3's fused
 * projections (ffn_up holds gate and up, gate first), Qwen3-MoE's router and
 * a Qwen2-MoE-style shared expert. */
static const struct {
    enum model_arch arch;
    const char *gguf, *hf;
} arch_layer_names[] = {
    {ARCH_GEMMA3, "post_attention_norm.weight", "post_attention_layernorm.weight"},
    {ARCH_GEMMA3, "ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {ARCH_GEMMA3, "post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    {ARCH_PHI3, "attn_qkv.weight", "self_attn.qkv_proj.weight"},
    {ARCH_PHI3, "ffn_up.weight", "mlp.gate_up_proj.weight"},
    {ARCH_QWEN3_MOE, "ffn_gate_inp.weight", "mlp.gate.weight"},
    {ARCH_QWEN3_MOE, "ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    {ARCH_QWEN3_MOE, "ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {ARCH_QWEN3_MOE, "ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {ARCH_QWEN3_MOE, "ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
};

/* Qwen3-MoE's experts: one 3-D tensor per projection (ne = {cols, rows,
 * n_experts}), presented as one matrix per expert. */
static const struct {
    const char *gguf, *proj;
} expert_names[] = {
    {"ffn_gate_exps.weight", "gate_proj"},
    {"ffn_up_exps.weight", "up_proj"},
    {"ffn_down_exps.weight", "down_proj"},
};

/* The projection name of a GGUF expert tensor and its layer, or NULL. */
static const char *expert_proj(const char *name, unsigned *layer)
{
    int end = 0;
    if (sscanf(name, "blk.%u.%n", layer, &end) != 1 || end == 0 || *layer > 100000)
        return NULL;
    for (size_t i = 0; i < sizeof expert_names / sizeof expert_names[0]; i++)
        if (!strcmp(name + end, expert_names[i].gguf))
            return expert_names[i].proj;
    return NULL;
}

/* The Hugging Face name of a GGUF tensor into hf, or false when it has none
 * (the loader then reports it as unexpected under its GGUF name). */
static bool hf_name(enum model_arch arch, const char *name, char *hf, size_t cap)
{
    if (!strcmp(name, "token_embd.weight"))
        return snprintf(hf, cap, "model.embed_tokens.weight"), true;
    if (!strcmp(name, "output_norm.weight"))
        return snprintf(hf, cap, "model.norm.weight"), true;
    if (!strcmp(name, "output.weight"))
        return snprintf(hf, cap, "lm_head.weight"), true;
    unsigned layer;
    int end = 0;
    if (sscanf(name, "blk.%u.%n", &layer, &end) != 1 || end == 0 || layer > 100000)
        return false;
    for (size_t i = 0; i < sizeof arch_layer_names / sizeof arch_layer_names[0]; i++)
        if (arch_layer_names[i].arch == arch && !strcmp(name + end, arch_layer_names[i].gguf))
            return snprintf(hf, cap, "model.layers.%u.%s", layer, arch_layer_names[i].hf), true;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
        if (!strcmp(name + end, layer_names[i].gguf))
            return snprintf(hf, cap, "model.layers.%u.%s", layer, layer_names[i].hf), true;
    return false;
}

static bool is_qk(const char *name)
{
    size_t n = strlen(name);
    return (n > 14 && (!strcmp(name + n - 14, ".attn_q.weight") ||
                       !strcmp(name + n - 14, ".attn_k.weight"))) ||
           (n > 12 &&
            (!strcmp(name + n - 12, ".attn_q.bias") || !strcmp(name + n - 12, ".attn_k.bias")));
}

static int cmp_st_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

int gguf_tensor_set(struct gguf_file *f, const struct model_config *cfg, const char *path,
                    struct st_set *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    int ai = 0;
    for (int i = 0; i < (int)(sizeof gguf_archs / sizeof gguf_archs[0]); i++)
        if (gguf_archs[i].arch == cfg->arch)
            ai = i;
    /* each expert tensor becomes n_experts entries */
    size_t n_entries = (size_t)f->n_tensors + 1;
    for (int i = 0; i < f->n_tensors; i++) {
        unsigned layer;
        const struct gguf_tensor *g = &f->tensors[i];
        if (cfg->arch == ARCH_QWEN3_MOE && expert_proj(g->name, &layer)) {
            if (g->n_dims != 3 || g->ne[2] < 1 || g->ne[2] > CONFIG_MAX_EXPERTS)
                return err_set(err, INFERD_EFORMAT,
                               "%s must be a 3-D tensor of at most %d experts", g->name,
                               CONFIG_MAX_EXPERTS);
            n_entries += (size_t)g->ne[2] - 1;
        }
    }
    out->tensors = calloc(n_entries, sizeof *out->tensors);
    out->maps = calloc(1, sizeof *out->maps);
    out->map_lens = calloc(1, sizeof *out->map_lens);
    out->file_names = calloc(1, sizeof *out->file_names);
    out->fds = malloc(sizeof *out->fds);
    out->used = calloc(n_entries, 1);
    if (out->fds)
        out->fds[0] = -1;
    if (!out->tensors || !out->maps || !out->map_lens || !out->file_names || !out->fds ||
        !out->used || !(out->file_names[0] = strdup(path))) {
        st_set_close(out);
        return err_set(err, INFERD_ENOMEM, "out of memory for the tensor table");
    }
    out->n_files = 1;
    for (int i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *g = &f->tensors[i];
        if (!strcmp(g->name, "rope_freqs.weight") ||
            (cfg->arch == ARCH_PHI3 && (!strcmp(g->name, "rope_factors_short.weight") ||
                                        !strcmp(g->name, "rope_factors_long.weight"))))
            continue;
        unsigned layer;
        const char *proj = cfg->arch == ARCH_QWEN3_MOE ? expert_proj(g->name, &layer) : NULL;
        if (proj) {
            /* views into the file, one per expert: rows of whole blocks, so
             * expert e's matrix starts e * rows * row_bytes in */
            uint64_t slice = dtype_row_bytes(g->dtype, (uint64_t)g->ne[0]) * (uint64_t)g->ne[1];
            for (int64_t e = 0; e < g->ne[2]; e++) {
                struct st_tensor *t = &out->tensors[out->n_tensors];
                char name[256];
                snprintf(name, sizeof name, "model.layers.%u.mlp.experts.%lld.%s.weight", layer,
                         (long long)e, proj);
                if (!(t->name = strdup(name))) {
                    st_set_close(out);
                    return err_set(err, INFERD_ENOMEM, "out of memory for the tensor table");
                }
                out->n_tensors++;
                t->dtype = g->dtype;
                t->n_dims = 2;
                t->shape[0] = g->ne[1];
                t->shape[1] = g->ne[0];
                t->offset = g->offset + (uint64_t)e * slice;
                t->nbytes = slice;
                t->data = g->data + (uint64_t)e * slice;
            }
            continue;
        }
        char name[256];
        if (!hf_name(cfg->arch, g->name, name, sizeof name))
            snprintf(name, sizeof name, "%s", g->name);
        struct st_tensor *t = &out->tensors[out->n_tensors];
        if (!(t->name = strdup(name))) {
            st_set_close(out);
            return err_set(err, INFERD_ENOMEM, "out of memory for the tensor table");
        }
        out->n_tensors++;
        t->dtype = g->dtype;
        t->n_dims = g->n_dims;
        for (int d = 0; d < g->n_dims; d++)
            t->shape[d] = g->ne[g->n_dims - 1 - d];
        if (g->n_dims == 1 && strstr(name, ".mlp.shared_expert_gate.")) {
            /* llama.cpp keeps the shared expert's gate as a vector; ours is 1 x hidden */
            t->n_dims = 2;
            t->shape[0] = 1;
            t->shape[1] = g->ne[0];
        }
        t->offset = g->offset;
        t->nbytes = g->nbytes;
        t->data = g->data;
        if (gguf_archs[ai].permuted && is_qk(g->name))
            t->unpermute_heads = strstr(g->name, ".attn_q.") ? cfg->n_heads : cfg->n_kv_heads;
    }
    /* Sorted by name, as st_set_find expects (a large MoE has tens of thousands) */
    qsort(out->tensors, (size_t)out->n_tensors, sizeof *out->tensors, cmp_st_name);
    for (int i = 1; i < out->n_tensors; i++)
        if (!strcmp(out->tensors[i - 1].name, out->tensors[i].name)) {
            int rc = err_set(err, INFERD_EFORMAT, "tensor %.200s appears twice",
                             out->tensors[i].name);
            st_set_close(out);
            return rc;
        }
    out->maps[0] = f->map;
    out->map_lens[0] = f->map_len;
    out->fds[0] = f->fd;
    f->map = NULL; /* the set unmaps it and closes the file; f's pointers stay valid while */
    f->fd = -1;    /* the set lives */
    return 0;
}

int gguf_rope_freqs(const struct gguf_file *f, int head_dim, float **factors, struct err *err)
{
    *factors = NULL;
    const struct gguf_tensor *t = gguf_find_tensor(f, "rope_freqs.weight");
    if (!t)
        return 0;
    if (t->dtype != DTYPE_F32 || t->n_dims != 1 || t->ne[0] != head_dim / 2)
        return err_set(err, INFERD_EFORMAT,
                       "rope_freqs.weight must be F32 of head_dim / 2 = %d elements",
                       head_dim / 2);
    float *v = malloc((size_t)(head_dim / 2) * sizeof *v);
    if (!v)
        return err_set(err, INFERD_ENOMEM, "out of memory for rope_freqs");
    memcpy(v, t->data, (size_t)(head_dim / 2) * sizeof *v);
    for (int i = 0; i < head_dim / 2; i++)
        if (!(v[i] > 0) || v[i] > 1e9f) {
            int rc = err_set(err, INFERD_ERANGE,
                             "rope_freqs.weight[%d] = %g is not a positive factor", i,
                             (double)v[i]);
            free(v);
            return rc;
        }
    *factors = v;
    return 0;
}

/* ---------------------------------------------------------------- tokenizer */

/* A string array of exactly n elements (n < 0: any length, stored in *n). */
static int str_array(const struct gguf_file *f, const char *key, bool required, int *n,
                     struct tok_piece **out, struct err *err)
{
    *out = NULL;
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return required ? err_set(err, INFERD_EFORMAT, "missing metadata key %s", key) : 0;
    if (kv->type != GGUF_ARRAY || kv->elem_type != GGUF_STRING || kv->n > (4u << 20))
        return err_set(err, INFERD_EFORMAT, "metadata key %s must be an array of at most %u strings",
                       key, 4u << 20);
    *n = (int)kv->n;
    *out = malloc((size_t)(kv->n ? kv->n : 1) * sizeof **out);
    if (!*out)
        return err_set(err, INFERD_ENOMEM, "out of memory reading %s", key);
    for (uint64_t k = 0; k < kv->n; k++)
        gguf_array_str(kv, k, &(*out)[k].s, &(*out)[k].len);
    return 0;
}

/* A numeric array of n elements converted to int32 or float. */
static int num_array(const struct gguf_file *f, const char *key, int n, int32_t **ints,
                     float **floats, struct err *err)
{
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return 0;
    if (kv->type != GGUF_ARRAY || kv->elem_type == GGUF_STRING || kv->n != (uint64_t)n)
        return err_set(err, INFERD_EFORMAT, "metadata key %s must be an array of %d numbers", key,
                       n);
    void *buf = malloc((size_t)(n ? n : 1) * 4);
    if (!buf)
        return err_set(err, INFERD_ENOMEM, "out of memory reading %s", key);
    for (int k = 0; k < n; k++) {
        double x = gguf_array_num(kv, (uint64_t)k);
        if (ints)
            ((int32_t *)buf)[k] = (int32_t)x;
        else
            ((float *)buf)[k] = (float)x;
    }
    if (ints)
        *ints = buf;
    else
        *floats = buf;
    return 0;
}

int gguf_tokenizer_load(const char *path, struct tokenizer **out, struct err *err)
{
    *out = NULL;
    struct gguf_file f;
    int rc = gguf_open(path, &f, err);
    if (rc)
        return rc;
    rc = gguf_tokenizer_build(&f, out, err);
    gguf_close(&f);
    if (rc)
        err_wrap(err, "%s", path);
    return rc;
}

int gguf_tokenizer_build(const struct gguf_file *fp, struct tokenizer **out, struct err *err)
{
    *out = NULL;
    const struct gguf_file f = *fp; /* a view: the pointers stay fp's */
    int rc;
    struct tok_gguf_vocab v = {.bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1,
                               .add_bos = -1, .add_space_prefix = true};
    struct tok_piece *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    static const char *const id_keys[] = {"tokenizer.ggml.bos_token_id",
                                          "tokenizer.ggml.eos_token_id",
                                          "tokenizer.ggml.unknown_token_id",
                                          "tokenizer.ggml.padding_token_id"};
    int *ids[] = {&v.bos_id, &v.eos_id, &v.unk_id, &v.pad_id};
    bool add_bos = false;
    if ((rc = gguf_get_str(&f, "tokenizer.ggml.model", true, &v.model, &v.model_len, err)) ||
        (rc = gguf_get_str(&f, "tokenizer.ggml.pre", false, &v.pre, &v.pre_len, err)) ||
        (rc = str_array(&f, "tokenizer.ggml.tokens", true, &v.n_tokens, &tokens, err)) ||
        (rc = str_array(&f, "tokenizer.ggml.merges", false, &v.n_merges, &merges, err)) ||
        (rc = num_array(&f, "tokenizer.ggml.token_type", v.n_tokens, &types, NULL, err)) ||
        (rc = num_array(&f, "tokenizer.ggml.scores", v.n_tokens, NULL, &scores, err)) ||
        (rc = gguf_get_bool(&f, "tokenizer.ggml.add_space_prefix", false, &v.add_space_prefix,
                            err)) ||
        (rc = gguf_get_str(&f, "tokenizer.chat_template", false, &v.chat_template,
                           &v.chat_template_len, err)))
        goto out;
    if (gguf_find(&f, "tokenizer.ggml.add_bos_token")) {
        if ((rc = gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", true, &add_bos, err)))
            goto out;
        v.add_bos = add_bos;
    }
    for (int k = 0; k < 4; k++) {
        int64_t id = -1;
        if ((rc = gguf_get_int(&f, id_keys[k], false, 0, v.n_tokens - 1, &id, err)))
            goto out;
        *ids[k] = (int)id;
    }
    v.tokens = tokens;
    v.merges = merges;
    v.types = types;
    v.scores = scores;
    rc = tok_load_gguf_vocab(&v, out, err);
out:
    free(tokens);
    free(merges);
    free(types);
    free(scores);
    return rc;
}
