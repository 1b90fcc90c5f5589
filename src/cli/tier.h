/* cli/tier.h — what `serve --ssd-cache` works out before the engine starts: the identity of the
 * K/V the SSD tier stores (weights, tokenizer, numeric backend) and the prefill rate its cost
 * model weighs restores against. */
#ifndef INFERD_CLI_TIER_H
#define INFERD_CLI_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"
#include "model/model.h"

/* XXH3-64 of the content of every safetensors file of m (their mappings, in order, each
 * followed by its length), so other weights under the same names never share stored K/V. */
uint64_t cli_tier_weights_digest(const struct model *m);

/* XXH3-64 of DIR/tokenizer.json, then of DIR/tokenizer_config.json when there is one.
 * -INFERD_EIO when tokenizer.json cannot be read. */
int cli_tier_tokenizer_digest(const char *dir, uint64_t *out, struct err *err);

/* What decides be's numbers beyond the KV format: "cpu-avx512-exact" (the matmul kernels'
 * instruction set) or "cuda-NVIDIA H200-sm_90-fast" (device name, compute capability), so
 * K/V computed by another numeric identity is never reused. */
void cli_tier_backend_identity(struct backend *be, char *buf, size_t cap);

/* Prefill speed in tokens per second: n_tokens pseudo-random ids fed in chunks of chunk
 * through the single-sequence generator (the serving loop's step code), the better of two
 * runs, the first of which also warms the weights and buffers up. */
int cli_tier_measure_prefill(const struct model *m, int n_tokens, int chunk, double *tokens_per_s,
                             struct err *err);

#endif
