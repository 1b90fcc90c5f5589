/* model/safetensors.c — safetensors header validation and the mmap'd tensor set of a model directory. */
#include "model/safetensors.h"

#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_SINGLE_FILE "model.safetensors"
#define ST_INDEX_FILE "model.safetensors.index.json"
#define ST_MAX_INDEX_BYTES (64u << 20)

/* ---------------------------------------------------------------- header */

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Dtypes the safetensors format defines that inferd does not run; naming
 * them lets the error say "unsupported" rather than "corrupt". */
static const char *const st_unsupported_dtypes[] = {
    "BOOL", "U8",  "I8",  "I16", "U16",     "I32",     "I64",     "U64", "F64",
    "C64",  "F4",  "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", NULL,
};

static int parse_dtype(const char *s, const char *tname, enum dtype *out, struct err *err)
{
    if (strcmp(s, "F32") == 0) {
        *out = DTYPE_F32;
        return 0;
    }
    if (strcmp(s, "BF16") == 0) {
        *out = DTYPE_BF16;
        return 0;
    }
    if (strcmp(s, "F16") == 0) {
        *out = DTYPE_F16;
        return 0;
    }
    if (strcmp(s, "U32") == 0) { /* MLX's packed quantized weights */
        *out = DTYPE_U32;
        return 0;
    }
    for (int i = 0; st_unsupported_dtypes[i]; i++)
        if (strcmp(s, st_unsupported_dtypes[i]) == 0)
            return err_set(err, INFERD_EUNSUPPORTED,
                           "tensor '%.200s' has dtype %s, which inferd does not load "
                           "(supported: F32, BF16, F16, and U32 for MLX-quantized weights)",
                           tname, s);
    return err_set(err, INFERD_EFORMAT, "tensor '%.200s' has unknown dtype '%.40s'", tname, s);
}

/* A top-level key of the header JSON as it appears in the raw text. */
struct key_span {
    const char *p;
    size_t n;
};

static int key_span_cmp(const void *a, const void *b)
{
    const struct key_span *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, n);
    if (c)
        return c;
    return (x->n > y->n) - (x->n < y->n);
}

/* json-c silently keeps the last of duplicate keys, so duplicates are found
 * in the raw text: collects the keys of the top-level object of json, which
 * json-c has already accepted (strict mode: no comments; keys may be quoted
 * with ' or "). Returns the count, or -1 when out of memory. */
static long scan_top_level_keys(const char *json, size_t len, struct key_span **out)
{
    size_t cap = 16, n = 0;
    struct key_span *keys = malloc(cap * sizeof *keys);
    if (!keys)
        return -1;
    int depth = 0;
    bool expect_key = false;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (c == '"' || c == '\'') {
            size_t start = i + 1, j = start;
            while (j < len && json[j] != c)
                j += json[j] == '\\' ? 2 : 1;
            if (depth == 1 && expect_key) {
                if (n == cap) {
                    cap *= 2;
                    struct key_span *k = realloc(keys, cap * sizeof *keys);
                    if (!k) {
                        free(keys);
                        return -1;
                    }
                    keys = k;
                }
                keys[n].p = json + start;
                keys[n].n = (j < len ? j : len) - start;
                n++;
                expect_key = false;
            }
            i = j;
        } else if (c == '{' || c == '[') {
            depth++;
            expect_key = depth == 1 && c == '{';
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth == 1) {
            expect_key = true;
        }
    }
    *out = keys;
    return (long)n;
}

static int check_no_duplicate_keys(const char *json, size_t len, int n_distinct, struct err *err)
{
    struct key_span *keys = NULL;
    long n = scan_top_level_keys(json, len, &keys);
    if (n < 0)
        return err_set(err, INFERD_ENOMEM, "out of memory checking the safetensors header");
    if (n == n_distinct) {
        free(keys);
        return 0;
    }
    qsort(keys, (size_t)n, sizeof *keys, key_span_cmp);
    for (long i = 1; i < n; i++) {
        if (key_span_cmp(&keys[i - 1], &keys[i]) == 0) {
            int shown = keys[i].n > 200 ? 200 : (int)keys[i].n;
            int rc = err_set(err, INFERD_EFORMAT, "duplicate tensor name '%.*s' in header", shown,
                             keys[i].p);
            free(keys);
            return rc;
        }
    }
    free(keys);
    return err_set(err, INFERD_EFORMAT,
                   "duplicate tensor name in header (two keys decode to the same name)");
}

/* A JSON integer >= 0 as uint64 (json-c clamps larger literals to UINT64_MAX). */
static int get_nonneg_int(struct json_object *v, const char *tname, const char *field,
                          uint64_t *out, struct err *err)
{
    if (!json_object_is_type(v, json_type_int))
        return err_set(err, INFERD_EFORMAT, "tensor '%.200s': %s must hold integers", tname, field);
    if (json_object_get_int64(v) < 0)
        return err_set(err, INFERD_EFORMAT, "tensor '%.200s': %s holds a negative value %lld",
                       tname, field, (long long)json_object_get_int64(v));
    *out = json_object_get_uint64(v);
    return 0;
}

static int parse_tensor_entry(const char *name, struct json_object *entry, uint64_t data_len,
                              struct st_tensor *t, struct err *err)
{
    if (!json_object_is_type(entry, json_type_object))
        return err_set(err, INFERD_EFORMAT, "tensor '%.200s': entry is not a JSON object", name);

    struct json_object *dtype, *shape, *offsets;
    if (!json_object_object_get_ex(entry, "dtype", &dtype) ||
        !json_object_is_type(dtype, json_type_string))
        return err_set(err, INFERD_EFORMAT, "tensor '%.200s': missing string field 'dtype'", name);
    int rc = parse_dtype(json_object_get_string(dtype), name, &t->dtype, err);
    if (rc)
        return rc;

    if (!json_object_object_get_ex(entry, "shape", &shape) ||
        !json_object_is_type(shape, json_type_array))
        return err_set(err, INFERD_EFORMAT, "tensor '%.200s': missing array field 'shape'", name);
    size_t n_dims = json_object_array_length(shape);
    if (n_dims > ST_MAX_DIMS)
        return err_set(err, INFERD_EFORMAT, "tensor '%.200s' has %zu dimensions (at most %d)", name,
                       n_dims, ST_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < n_dims; d++) {
        uint64_t dim = 0;
        rc = get_nonneg_int(json_object_array_get_idx(shape, d), name, "shape", &dim, err);
        if (rc)
            return rc;
        if (dim > INT64_MAX)
            return err_set(err, INFERD_EFORMAT,
                           "tensor '%.200s': shape dimension %llu is too large", name,
                           (unsigned long long)dim);
        t->shape[d] = (int64_t)dim;
        overflow |= __builtin_mul_overflow(numel, dim, &numel);
    }
    uint64_t want_bytes = 0;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)dtype_size(t->dtype), &want_bytes);

    if (!json_object_object_get_ex(entry, "data_offsets", &offsets) ||
        !json_object_is_type(offsets, json_type_array) || json_object_array_length(offsets) != 2)
        return err_set(err, INFERD_EFORMAT,
                       "tensor '%.200s': data_offsets must be an array [begin, end]", name);
    uint64_t begin, end;
    if ((rc = get_nonneg_int(json_object_array_get_idx(offsets, 0), name, "data_offsets", &begin,
                             err)) ||
        (rc = get_nonneg_int(json_object_array_get_idx(offsets, 1), name, "data_offsets", &end,
                             err)))
        return rc;
    if (begin > end)
        return err_set(err, INFERD_EFORMAT,
                       "tensor '%.200s': data_offsets [%llu, %llu] end before they begin", name,
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return err_set(err, INFERD_EFORMAT,
                       "tensor '%.200s': data_offsets end %llu is past the end of the data "
                       "section (%llu bytes; file truncated?)",
                       name, (unsigned long long)end, (unsigned long long)data_len);
    if (overflow || end - begin != want_bytes)
        return err_set(err, INFERD_EFORMAT,
                       "tensor '%.200s': data_offsets span %llu bytes, but dtype %s and its shape "
                       "need %s%llu",
                       name, (unsigned long long)(end - begin), dtype_name(t->dtype),
                       overflow ? "more than " : "",
                       (unsigned long long)(overflow ? UINT64_MAX : want_bytes));
    t->offset = begin;
    t->nbytes = end - begin;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static int check_no_overlap(const struct st_header *h, struct err *err)
{
    const struct st_tensor **order =
        malloc((size_t)(h->n_tensors ? h->n_tensors : 1) * sizeof *order);
    if (!order)
        return err_set(err, INFERD_ENOMEM, "out of memory checking the safetensors header");
    int n = 0;
    for (int i = 0; i < h->n_tensors; i++)
        if (h->tensors[i].nbytes > 0) /* empty tensors occupy no bytes */
            order[n++] = &h->tensors[i];
    qsort(order, (size_t)n, sizeof *order, cmp_by_offset);
    int rc = 0;
    for (int i = 1; i < n; i++) {
        const struct st_tensor *a = order[i - 1], *b = order[i];
        if (b->offset < a->offset + a->nbytes) {
            unsigned long long a0 = a->offset, a1 = a->offset + a->nbytes;
            unsigned long long b0 = b->offset, b1 = b->offset + b->nbytes;
            rc = err_set(err, INFERD_EFORMAT,
                         "tensors '%.150s' (bytes %llu..%llu) and '%.150s' (bytes %llu..%llu) "
                         "overlap",
                         a->name, a0, a1, b->name, b0, b1);
            break;
        }
    }
    free(order);
    return rc;
}

static bool is_json_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void st_header_free(struct st_header *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n_tensors; i++)
        free(h->tensors[i].name);
    free(h->tensors);
    memset(h, 0, sizeof *h);
}

int st_header_parse(const uint8_t *buf, size_t file_len, struct st_header *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    if (file_len < 8)
        return err_set(err, INFERD_EFORMAT,
                       "file is %zu bytes, too short for the 8-byte safetensors header length",
                       file_len);
    uint64_t header_len = read_le64(buf);
    if (header_len > ST_MAX_HEADER_BYTES)
        return err_set(err, INFERD_EFORMAT,
                       "header length %llu exceeds the %u-byte limit (corrupt file?)",
                       (unsigned long long)header_len, ST_MAX_HEADER_BYTES);
    if (header_len > file_len - 8)
        return err_set(err, INFERD_EFORMAT,
                       "header length %llu is larger than the %zu bytes after it (truncated file?)",
                       (unsigned long long)header_len, file_len - 8);
    if (header_len == 0)
        return err_set(err, INFERD_EFORMAT, "header is empty");
    const char *json = (const char *)buf + 8;
    uint64_t data_len = file_len - 8 - header_len;

    struct json_tokener *tok = json_tokener_new();
    if (!tok)
        return err_set(err, INFERD_ENOMEM, "out of memory parsing the safetensors header");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *root = json_tokener_parse_ex(tok, json, (int)header_len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        if (jerr == json_tokener_continue)
            return err_set(err, INFERD_EFORMAT, "header JSON ends before it is complete");
        return err_set(err, INFERD_EFORMAT, "header is not valid JSON: %s at byte %zu",
                       json_tokener_error_desc(jerr), end);
    }
    for (size_t i = end; i < header_len; i++) {
        if (!is_json_space((uint8_t)json[i])) {
            json_object_put(root);
            return err_set(err, INFERD_EFORMAT,
                           "header has unexpected bytes after its JSON object (byte %zu)", i);
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "header is not a JSON object");
    }

    int n_keys = json_object_object_length(root);
    int rc = check_no_duplicate_keys(json, end, n_keys, err);
    if (rc) {
        json_object_put(root);
        return rc;
    }
    out->header_len = header_len;
    out->tensors = calloc((size_t)(n_keys ? n_keys : 1), sizeof *out->tensors);
    if (!out->tensors) {
        json_object_put(root);
        return err_set(err, INFERD_ENOMEM, "out of memory for %d tensor entries", n_keys);
    }
    json_object_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        struct st_tensor *t = &out->tensors[out->n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory for tensor names");
            break;
        }
        out->n_tensors++;
        rc = parse_tensor_entry(key, val, data_len, t, err);
        if (rc)
            break;
    }
    json_object_put(root);
    if (!rc)
        rc = check_no_overlap(out, err);
    if (rc)
        st_header_free(out);
    return rc;
}

/* ---------------------------------------------------------------- tensor set */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int join_path(char *buf, size_t cap, const char *dir, const char *file, struct err *err)
{
    int n = snprintf(buf, cap, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= cap)
        return err_set(err, INFERD_EINVAL, "path too long: %.200s/%.100s", dir, file);
    return 0;
}

/* Maps path read-only, validates its header and appends its tensors to set
 * (tensor data pointers into the new mapping). */
static int set_add_file(struct st_set *set, const char *path, struct err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, INFERD_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat stbuf;
    if (fstat(fd, &stbuf) != 0 || !S_ISREG(stbuf.st_mode)) {
        close(fd);
        return err_set(err, INFERD_EIO, "%s is not a readable regular file", path);
    }
    size_t len = (size_t)stbuf.st_size;
    if (len < 8) {
        close(fd);
        return err_set(err, INFERD_EFORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte safetensors header length",
                       path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (map == MAP_FAILED) {
        close(fd);
        return err_set(err, INFERD_EIO, "cannot map %s: %s", path, strerror(map_errno));
    }
    /* Weights are streamed once per decoded token: read ahead now, and let
     * the kernel back the mapping with huge pages where the file system can,
     * which spares the TLB a miss every 4 KB. Both are hints; failure is fine. */
    madvise(map, len, MADV_WILLNEED);
    madvise(map, len, MADV_HUGEPAGE);

    void **maps = realloc(set->maps, (size_t)(set->n_files + 1) * sizeof *maps);
    if (maps)
        set->maps = maps;
    size_t *lens = maps ? realloc(set->map_lens, (size_t)(set->n_files + 1) * sizeof *lens) : NULL;
    if (lens)
        set->map_lens = lens;
    char **names =
        lens ? realloc(set->file_names, (size_t)(set->n_files + 1) * sizeof *names) : NULL;
    if (names)
        set->file_names = names;
    int *fds = names ? realloc(set->fds, (size_t)(set->n_files + 1) * sizeof *fds) : NULL;
    if (fds)
        set->fds = fds;
    char *name = fds ? strdup(path) : NULL;
    if (!name) {
        munmap(map, len);
        close(fd);
        return err_set(err, INFERD_ENOMEM, "out of memory opening %s", path);
    }
    int file_index = set->n_files++;
    set->maps[file_index] = map;
    set->map_lens[file_index] = len;
    set->file_names[file_index] = name;
    set->fds[file_index] = fd;

    struct st_header h;
    int rc = st_header_parse(map, len, &h, err);
    if (rc)
        return err_wrap(err, "%s", path);
    struct st_tensor *all =
        realloc(set->tensors, (size_t)(set->n_tensors + h.n_tensors + 1) * sizeof *all);
    if (!all) {
        st_header_free(&h);
        return err_set(err, INFERD_ENOMEM, "out of memory reading %s", path);
    }
    set->tensors = all;
    const uint8_t *data = (const uint8_t *)map + 8 + h.header_len;
    for (int i = 0; i < h.n_tensors; i++) {
        struct st_tensor *t = &set->tensors[set->n_tensors++];
        *t = h.tensors[i]; /* takes ownership of the name */
        t->data = data + t->offset;
        t->file_index = file_index;
    }
    free(h.tensors);
    return 0;
}

static const char *file_base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Sorts tensors by name for lookup and refuses a name present in two shards. */
static int set_finish(struct st_set *set, struct err *err)
{
    if (set->n_tensors > 1)
        qsort(set->tensors, (size_t)set->n_tensors, sizeof *set->tensors, cmp_tensor_name);
    for (int i = 1; i < set->n_tensors; i++) {
        const struct st_tensor *a = &set->tensors[i - 1], *b = &set->tensors[i];
        if (strcmp(a->name, b->name) == 0)
            return err_set(err, INFERD_EFORMAT, "tensor '%.200s' appears in both %s and %s",
                           a->name, set->file_names[a->file_index],
                           set->file_names[b->file_index]);
    }
    set->used = calloc((size_t)(set->n_tensors ? set->n_tensors : 1), 1);
    if (!set->used)
        return err_set(err, INFERD_ENOMEM, "out of memory for the tensor table");
    return 0;
}

static struct st_tensor *set_lookup(const struct st_set *set, const char *name)
{
    struct st_tensor key = {.name = (char *)name};
    if (!set->tensors || set->n_tensors == 0)
        return NULL;
    return bsearch(&key, set->tensors, (size_t)set->n_tensors, sizeof *set->tensors,
                   cmp_tensor_name);
}

static bool shard_name_is_safe(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strchr(s, '\\') == NULL &&
           strstr(s, "..") == NULL;
}

static int shard_index_of(const struct st_set *set, const char *dir, const char *shard)
{
    size_t dl = strlen(dir);
    for (int i = 0; i < set->n_files; i++) {
        const char *p = set->file_names[i];
        if (strncmp(p, dir, dl) == 0 && p[dl] == '/' && strcmp(p + dl + 1, shard) == 0)
            return i;
    }
    return -1;
}

/* Opens every shard model.safetensors.index.json names (each once) and checks
 * each tensor the index lists sits in the shard the index says. */
static int set_open_index(struct st_set *set, const char *dir, const char *index_path,
                          struct err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = file_read_all(index_path, ST_MAX_INDEX_BYTES, &text, &len, NULL, err);
    if (rc)
        return rc;
    struct json_tokener *tok = json_tokener_new();
    if (!tok) {
        free(text);
        return err_set(err, INFERD_ENOMEM, "out of memory parsing %s", index_path);
    }
    struct json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    json_tokener_free(tok);
    free(text);
    struct json_object *map = NULL;
    if (!root || jerr != json_tokener_success) {
        rc = err_set(err, INFERD_EFORMAT, "%s is not valid JSON: %s", index_path,
                     json_tokener_error_desc(jerr == json_tokener_success ? json_tokener_continue
                                                                          : jerr));
        goto out;
    }
    if (!json_object_is_type(root, json_type_object) ||
        !json_object_object_get_ex(root, "weight_map", &map) ||
        !json_object_is_type(map, json_type_object)) {
        rc = err_set(err, INFERD_EFORMAT, "%s has no \"weight_map\" object", index_path);
        goto out;
    }

    char path[4096];
    json_object_object_foreach(map, name, shard_obj)
    {
        if (!json_object_is_type(shard_obj, json_type_string)) {
            rc = err_set(err, INFERD_EFORMAT, "%s: weight_map entry '%.200s' is not a file name",
                         index_path, name);
            goto out;
        }
        const char *shard = json_object_get_string(shard_obj);
        if (!shard_name_is_safe(shard)) {
            rc = err_set(err, INFERD_EFORMAT,
                         "%s: shard file name '%.200s' for tensor '%.200s' must be a plain file "
                         "name in the model directory",
                         index_path, shard, name);
            goto out;
        }
        if (shard_index_of(set, dir, shard) >= 0)
            continue;
        if ((rc = join_path(path, sizeof path, dir, shard, err)) ||
            (rc = set_add_file(set, path, err)))
            goto out;
    }
    if ((rc = set_finish(set, err)))
        goto out;
    json_object_object_foreach(map, name2, shard_obj2)
    {
        const char *shard = json_object_get_string(shard_obj2);
        const struct st_tensor *t = set_lookup(set, name2);
        int want = shard_index_of(set, dir, shard);
        if (!t) {
            rc = err_set(err, INFERD_EFORMAT,
                         "%s maps tensor '%.200s' to %s, which does not hold it", index_path, name2,
                         shard);
            goto out;
        }
        if (t->file_index != want) {
            rc = err_set(err, INFERD_EFORMAT, "%s maps tensor '%.200s' to %s, but it is in %s",
                         index_path, name2, shard, file_base(set->file_names[t->file_index]));
            goto out;
        }
    }
out:
    json_object_put(root);
    return rc;
}

int st_set_open(const char *dir, struct st_set *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    char single[4096], index[4096];
    int rc;
    if ((rc = join_path(single, sizeof single, dir, ST_SINGLE_FILE, err)) ||
        (rc = join_path(index, sizeof index, dir, ST_INDEX_FILE, err)))
        return rc;
    struct stat stbuf;
    if (stat(single, &stbuf) == 0) {
        rc = set_add_file(out, single, err);
        if (!rc)
            rc = set_finish(out, err);
    } else if (stat(index, &stbuf) == 0) {
        rc = set_open_index(out, dir, index, err);
    } else {
        rc = err_set(err, INFERD_EIO, "no weights in %s: neither %s nor %s exists", dir, single,
                     index);
    }
    if (rc)
        st_set_close(out);
    return rc;
}

void st_set_close(struct st_set *set)
{
    if (!set)
        return;
    for (int i = 0; i < set->n_tensors; i++)
        free(set->tensors[i].name);
    free(set->tensors);
    for (int i = 0; i < set->n_files; i++) {
        munmap(set->maps[i], set->map_lens[i]);
        free(set->file_names[i]);
        if (set->fds && set->fds[i] >= 0)
            close(set->fds[i]);
    }
    free(set->maps);
    free(set->map_lens);
    free(set->file_names);
    free(set->fds);
    free(set->used);
    memset(set, 0, sizeof *set);
}

const struct st_tensor *st_set_find(struct st_set *set, const char *name)
{
    struct st_tensor *t = set_lookup(set, name);
    if (t && set->used)
        set->used[t - set->tensors] = 1;
    return t;
}
