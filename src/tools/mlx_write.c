/* tools/mlx_write.c — writes a model directory as an MLX-quantized one: config.json with its quantization, and the safetensors file with packed weights, scales and biases. */
#include "tools/mlx_write.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/bf16.h"
#include "base/file.h"
#include "base/quant.h"
#include "base/strbuf.h"
#include "model/safetensors.h"

#define MAX_SIDE_FILE_BYTES (64u << 20)

/* One tensor of the output file: a source tensor copied, or one of the three
 * parts of a quantized one. */
enum part { PART_COPY, PART_WEIGHT, PART_SCALES, PART_BIASES };

struct out_tensor {
    char name[320];
    const struct st_tensor *src;
    enum part part;
    enum dtype dtype;
    int n_dims;
    int64_t shape[2];
    uint64_t bytes, offset;
};

static int out_cmp(const void *a, const void *b)
{
    return strcmp(((const struct out_tensor *)a)->name, ((const struct out_tensor *)b)->name);
}

static bool quantizable(const struct st_tensor *t, int group)
{
    size_t n = strlen(t->name);
    return t->n_dims == 2 && n > 7 && !strcmp(t->name + n - 7, ".weight") &&
           t->shape[1] % group == 0 &&
           (t->dtype == DTYPE_BF16 || t->dtype == DTYPE_F16 || t->dtype == DTYPE_F32);
}

static float element(const struct st_tensor *t, uint64_t i)
{
    const uint8_t *p = t->data;
    if (t->dtype == DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* The output's tensors, sorted by name, with offsets; *n gets the count. */
static struct out_tensor *plan_tensors(const struct st_set *set, int bits, int group, int *n)
{
    struct out_tensor *ts = calloc((size_t)set->n_tensors * 3 + 1, sizeof *ts);
    if (!ts)
        return NULL;
    int k = 0;
    for (int i = 0; i < set->n_tensors; i++) {
        const struct st_tensor *s = &set->tensors[i];
        if (!quantizable(s, group)) {
            struct out_tensor *t = &ts[k++];
            snprintf(t->name, sizeof t->name, "%s", s->name);
            t->src = s;
            t->part = PART_COPY;
            t->dtype = s->dtype;
            t->n_dims = s->n_dims;
            t->shape[0] = s->shape[0];
            t->shape[1] = s->n_dims == 2 ? s->shape[1] : 0;
            t->bytes = s->nbytes;
            continue;
        }
        size_t len = strlen(s->name) - 7;
        for (int p = PART_WEIGHT; p <= PART_BIASES; p++) {
            struct out_tensor *t = &ts[k++];
            snprintf(t->name, sizeof t->name, "%.*s.%s", (int)len, s->name,
                     p == PART_WEIGHT ? "weight" : p == PART_SCALES ? "scales" : "biases");
            t->src = s;
            t->part = (enum part)p;
            t->n_dims = 2;
            t->shape[0] = s->shape[0];
            t->shape[1] = p == PART_WEIGHT ? s->shape[1] * bits / 32 : s->shape[1] / group;
            t->dtype = p == PART_WEIGHT ? DTYPE_U32 : s->dtype;
            t->bytes = (uint64_t)t->shape[0] * (uint64_t)t->shape[1] * dtype_size(t->dtype);
        }
    }
    qsort(ts, (size_t)k, sizeof *ts, out_cmp);
    uint64_t off = 0;
    for (int i = 0; i < k; i++) {
        ts[i].offset = off;
        off += ts[i].bytes;
    }
    *n = k;
    return ts;
}

static void header_json(const struct out_tensor *ts, int n, struct strbuf *b)
{
    strbuf_printf(b, "{\"__metadata__\":{\"format\":\"mlx\"}");
    for (int i = 0; i < n; i++) {
        const struct out_tensor *t = &ts[i];
        strbuf_printf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name,
                       dtype_name(t->dtype), (long long)t->shape[0]);
        if (t->n_dims == 2)
            strbuf_printf(b, ",%lld", (long long)t->shape[1]);
        strbuf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                       (unsigned long long)(t->offset + t->bytes));
    }
    strbuf_printf(b, "}");
    while (!b->failed && b->len % 8)
        strbuf_printf(b, " ");
}

/* One quantized part of source matrix s, row by row: rows quantized to MLX
 * blocks, then the part's bytes of each block. */
static int write_part(FILE *fp, const struct out_tensor *t, int bits, int group, struct err *err)
{
    const struct st_tensor *s = t->src;
    enum dtype q = dtype_mlx(bits, group, s->dtype);
    int64_t cols = s->shape[1], n_groups = cols / group;
    uint64_t rb = dtype_row_bytes(q, (uint64_t)cols);
    size_t ssz = dtype_size(s->dtype), bb = dtype_block_bytes(q);
    float *row = malloc((size_t)cols * sizeof *row);
    uint8_t *blocks = malloc((size_t)rb), *out = malloc((size_t)rb);
    int rc = 0;
    if (!row || !blocks || !out)
        rc = err_set(err, INFERD_ENOMEM, "out of memory quantizing %s", s->name);
    for (int64_t r = 0; r < s->shape[0] && !rc; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = element(s, (uint64_t)(r * cols + c));
        quant_quantize_row(q, row, blocks, cols);
        size_t len = 0;
        for (int64_t g = 0; g < n_groups; g++) {
            const uint8_t *blk = blocks + (size_t)g * bb;
            size_t at = t->part == PART_SCALES ? 0 : t->part == PART_BIASES ? ssz : 2 * ssz;
            size_t k = t->part == PART_WEIGHT ? bb - 2 * ssz : ssz;
            memcpy(out + len, blk + at, k);
            len += k;
        }
        if (fwrite(out, 1, len, fp) != len)
            rc = err_set(err, INFERD_EIO, "writing %s: %s", t->name, strerror(errno));
    }
    free(row);
    free(blocks);
    free(out);
    return rc;
}

static int write_safetensors(const struct st_set *set, int bits, int group, const char *path,
                             struct err *err)
{
    int n = 0;
    struct out_tensor *ts = plan_tensors(set, bits, group, &n);
    if (!ts)
        return err_set(err, INFERD_ENOMEM, "out of memory for %d tensors", set->n_tensors);
    struct strbuf hdr = {0};
    header_json(ts, n, &hdr);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    int rc = 0;
    if (hdr.failed)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the safetensors header");
    else if (!fp)
        rc = err_set(err, INFERD_EIO, "cannot create %s: %s", tmp, strerror(errno));
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    if (!rc && (fwrite(prefix, 1, 8, fp) != 8 || fwrite(hdr.data, 1, hdr.len, fp) != hdr.len))
        rc = err_set(err, INFERD_EIO, "writing %s: %s", tmp, strerror(errno));
    for (int i = 0; i < n && !rc; i++) {
        const struct out_tensor *t = &ts[i];
        if (t->part != PART_COPY)
            rc = write_part(fp, t, bits, group, err);
        else if (fwrite(t->src->data, 1, (size_t)t->bytes, fp) != t->bytes)
            rc = err_set(err, INFERD_EIO, "writing %s: %s", t->name, strerror(errno));
    }
    if (fp && fclose(fp) && !rc)
        rc = err_set(err, INFERD_EIO, "closing %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path))
        rc = err_set(err, INFERD_EIO, "renaming %s: %s", tmp, strerror(errno));
    if (rc)
        remove(tmp);
    strbuf_free(&hdr);
    free(ts);
    return rc;
}

static int write_file(const char *path, const void *data, size_t len, struct err *err)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp)
        return err_set(err, INFERD_EIO, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, fp) == len;
    ok = !fclose(fp) && ok;
    if (!ok || rename(tmp, path)) {
        remove(tmp);
        return err_set(err, INFERD_EIO, "writing %s: %s", path, strerror(errno));
    }
    return 0;
}

/* config.json with quantization and quantization_config added, pretty-printed. */
static int write_config(const char *dir, int bits, int group, const char *out_dir,
                        struct err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    int rc = file_read_all(path, MAX_SIDE_FILE_BYTES, &text, &len, NULL, err);
    if (rc)
        return rc;
    json_object *root = json_tokener_parse(text);
    free(text);
    if (!root || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "%s is not a JSON object", path);
    }
    for (int i = 0; i < 2; i++) {
        json_object *q = json_object_new_object();
        json_object_object_add(q, "group_size", json_object_new_int(group));
        json_object_object_add(q, "bits", json_object_new_int(bits));
        json_object_object_add(root, i ? "quantization_config" : "quantization", q);
    }
    const char *out = json_object_to_json_string_ext(
        root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    rc = write_file(path, out, strlen(out), err);
    json_object_put(root);
    return rc;
}

/* dir/name copied to out_dir when it exists. */
static int copy_side_file(const char *dir, const char *name, const char *out_dir,
                          struct err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text;
    size_t len;
    bool missing = false;
    int rc = file_read_all(path, MAX_SIDE_FILE_BYTES, &text, &len, &missing, err);
    if (rc || missing)
        return rc;
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    rc = write_file(path, text, len, err);
    free(text);
    return rc;
}

int mlx_write_model(const char *dir, int bits, int group_size, const char *out_dir,
                    struct err *err)
{
    if (bits != 4 && bits != 8)
        return err_set(err, INFERD_EINVAL, "MLX quantization takes 4 or 8 bits, not %d", bits);
    if (group_size != 32 && group_size != 64 && group_size != 128)
        return err_set(err, INFERD_EINVAL, "MLX quantization takes groups of 32, 64 or 128, "
                       "not %d", group_size);
    if (mkdir(out_dir, 0755) && errno != EEXIST)
        return err_set(err, INFERD_EIO, "cannot create %s: %s", out_dir, strerror(errno));
    struct st_set set;
    int rc = st_set_open(dir, &set, err);
    if (rc)
        return rc;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    static const char *const side[] = {"generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json", "special_tokens_map.json"};
    rc = write_config(dir, bits, group_size, out_dir, err);
    for (size_t i = 0; !rc && i < sizeof side / sizeof side[0]; i++)
        rc = copy_side_file(dir, side[i], out_dir, err);
    if (!rc)
        rc = write_safetensors(&set, bits, group_size, path, err);
    st_set_close(&set);
    return rc;
}
