/* model/safetensors.h — safetensors files read by mmap: header parsing and tensor lookup across shards. */
#ifndef INFERD_MODEL_SAFETENSORS_H
#define INFERD_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"

#define ST_MAX_DIMS 4
#define ST_MAX_HEADER_BYTES (100u << 20) /* larger headers are refused as corrupt */

struct st_tensor {
    char *name;            /* owned */
    enum dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset;       /* byte offset of the data within the file's data section */
    uint64_t nbytes;
    const void *data;      /* points into the mapping; NULL until mapped */
    int file_index;        /* which shard holds it */
    int unpermute_heads;   /* GGUF q/k of Llama-family models: rows are in llama.cpp's
                              rope order over this many heads, which the loader undoes;
                              0 for everything else */
};

/* Parsed safetensors header. Validates: 8-byte little-endian length, JSON
 * object, known dtypes (F32, BF16, F16, U32 for MLX-quantized weights;
 * others are refused by name), shapes,
 * data_offsets consistent with dtype x shape, inside data_len, and not
 * overlapping. __metadata__ is skipped. */
struct st_header {
    struct st_tensor *tensors; /* owned; n_tensors */
    int n_tensors;
    uint64_t header_len;       /* JSON bytes after the 8-byte prefix */
};

/* Parses a whole file image (prefix + JSON + data) of file_len bytes.
 * Never reads outside buf. This is the fuzzed entry point. */
int st_header_parse(const uint8_t *buf, size_t file_len, struct st_header *out, struct err *err);
void st_header_free(struct st_header *h);

/* All tensors of one model directory: model.safetensors, or the shards
 * listed in model.safetensors.index.json. Files are mmap'd read-only and
 * stay mapped until st_set_close. */
struct st_set {
    struct st_tensor *tensors; /* owned; n_tensors, data points into maps */
    int n_tensors;
    void **maps;               /* owned mappings; n_files */
    size_t *map_lens;
    int *fds;                  /* owned: the open file each mapping was made from (-1: none),
                                  for loaders that read a tensor's bytes instead of mapping them */
    char **file_names;         /* owned; n_files paths, for messages */
    int n_files;
    unsigned char *used;       /* per tensor: claimed by the loader (for "extra tensor" checks) */
};

int st_set_open(const char *dir, struct st_set *out, struct err *err);
void st_set_close(struct st_set *set);

/* The tensor named name, or NULL. Marks it used. */
const struct st_tensor *st_set_find(struct st_set *set, const char *name);

#endif
