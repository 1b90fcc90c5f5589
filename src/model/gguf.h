/* model/gguf.h — GGUF files (v2, v3): header, metadata, tensor index, and their mapping onto a model config and tensor set. */
#ifndef INFERD_MODEL_GGUF_H
#define INFERD_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "model/config.h"
#include "model/safetensors.h"

/* File layout (all little-endian):
 *   "GGUF" u32 version (2 or 3) u64 n_tensors u64 n_kv
 *   n_kv x { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to general.alignment (default 32), then the data section; each
 *   tensor's offset is relative to it and a multiple of the alignment.
 * A string is u64 length + bytes (no NUL); an array is u32 element type +
 * u64 count + elements. ne[0] is the contiguous dimension: a matrix of
 * ne = {cols, rows} is rows x cols row-major. */

enum gguf_type {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12,
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_kv {
    char *key;                 /* owned, NUL-terminated */
    enum gguf_type type;
    enum gguf_type elem_type;  /* arrays: their elements' type */
    uint64_t n;                /* arrays: element count */
    int64_t i;                 /* integer and bool scalars */
    double f;                  /* float scalars (and integers, converted) */
    const uint8_t *data;       /* into the image: a string's bytes, an array's first element */
    uint64_t len;              /* strings: bytes */
    uint64_t *str_offsets;     /* owned; string arrays: element k's length prefix at data + str_offsets[k] */
};

struct gguf_tensor {
    char *name;                /* owned, NUL-terminated */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] contiguous */
    uint32_t ggml_type;
    enum dtype dtype;
    uint64_t offset;           /* within the data section */
    uint64_t nbytes;
    const uint8_t *data;       /* into the image */
};

struct gguf_file {
    uint32_t version;
    uint32_t alignment;
    struct gguf_kv *kvs;       /* owned; n_kvs, sorted by key */
    int n_kvs;
    struct gguf_tensor *tensors; /* owned; n_tensors, in file order */
    int n_tensors;
    uint64_t data_offset;      /* where the data section starts in the image */
    const uint8_t *image;      /* the whole file */
    size_t image_len;
    void *map;                 /* owned mapping when opened from a path, else NULL */
    size_t map_len;
    int fd;                    /* owned: the file the mapping was made from, else -1 */
};

/* Parses a whole file image of len bytes: every count, length, type, shape
 * and offset is checked against the image before it is used; duplicate keys
 * or tensor names, overlapping tensors, bad alignment and tensor types
 * inferd does not load (named) are errors. Never reads outside buf. Fuzzed. */
int gguf_parse(const uint8_t *buf, size_t len, struct gguf_file *out, struct err *err);
/* Maps path read-only and parses it. */
int gguf_open(const char *path, struct gguf_file *out, struct err *err);
void gguf_close(struct gguf_file *f);

/* True when path names a regular file that starts with the GGUF magic. */
bool gguf_is_file(const char *path);

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key); /* NULL if absent */
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Typed reads of one key: -INFERD_EFORMAT naming the key when it has another
 * type or (required) is absent; absent and optional leaves *out as it is. */
int gguf_get_int(const struct gguf_file *f, const char *key, bool required, int64_t lo,
                 int64_t hi, int64_t *out, struct err *err);
int gguf_get_float(const struct gguf_file *f, const char *key, bool required, double *out,
                   struct err *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool required, bool *out,
                  struct err *err);
int gguf_get_str(const struct gguf_file *f, const char *key, bool required, const char **s,
                 size_t *len, struct err *err);

/* Element k of an array kv (k < kv->n, element type as asked). */
void gguf_array_str(const struct gguf_kv *kv, uint64_t k, const char **s, size_t *len);
double gguf_array_num(const struct gguf_kv *kv, uint64_t k);

/* GGUF's name for a ggml tensor type ("Q4_K", "IQ2_XS", ...) or "unknown". */
const char *gguf_type_name(uint32_t ggml_type);
/* The ggml type id of a dtype. */
uint32_t gguf_ggml_type(enum dtype t);

/* ---------------------------------------------------------------- models */

/* The model config a GGUF file describes: general.architecture llama,
 * mistral, qwen2 or qwen3 and its {arch}.* keys (sizes, rms eps, rope base
 * and scaling), the vocabulary from token_embd.weight, tied embeddings when
 * there is no output.weight, biases and q/k norms from the tensors present,
 * eos from tokenizer.ggml.eos/eot/eom_token_id. */
int gguf_model_config(const struct gguf_file *f, struct model_config *cfg,
                      struct generation_defaults *gen, struct err *err);

/* The file's tensors under their Hugging Face names (blk.N.attn_q.weight →
 * model.layers.N.self_attn.q_proj.weight, ...) with Hugging Face shapes
 * (rows first); Llama-family q/k projections (weights and biases) are marked
 * for the loader to undo llama.cpp's rope row permutation (st_tensor.
 * unpermute_heads). rope_freqs.weight is left out (gguf_rope_freqs reads it),
 * and so are Phi-3's rope_factors_{short,long}.weight (gguf_model_config reads
 * them); Qwen3-MoE's stacked blk.N.ffn_*_exps tensors become one matrix per
 * expert (mlp.experts.E.*_proj.weight), each a view into the mapping.
 * Moves f's mapping into out (out's st_set_close unmaps it); f stays
 * usable until gguf_close but must be closed before out. */
int gguf_tensor_set(struct gguf_file *f, const struct model_config *cfg, const char *path,
                    struct st_set *out, struct err *err);

/* Llama 3 rope scaling as llama.cpp carries it: rope_freqs.weight, head_dim/2
 * F32 divisors of the inverse frequencies. *factors is malloc'd (caller
 * frees) or NULL when the file has none. */
int gguf_rope_freqs(const struct gguf_file *f, int head_dim, float **factors, struct err *err);

/* The tokenizer a GGUF file carries (tokenizer.ggml.*, tokenizer.chat_template),
 * built by text/tok_load_gguf_vocab. -INFERD_EFORMAT when the file has none. */
struct tokenizer;
int gguf_tokenizer_load(const char *path, struct tokenizer **out, struct err *err);
/* The same from a parsed file (fuzzed). */
int gguf_tokenizer_build(const struct gguf_file *f, struct tokenizer **out, struct err *err);

#endif
