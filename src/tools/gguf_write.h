/* tools/gguf_write.h — a Hugging Face model directory written as one GGUF file, as llama.cpp's converter and quantizer would (not part of libinferd). */
#ifndef INFERD_TOOLS_GGUF_WRITE_H
#define INFERD_TOOLS_GGUF_WRITE_H

#include <stdbool.h>

#include "base/err.h"

/* The file types mkmodel writes, named as llama-quantize names them. */
enum gguf_ftype { GGUF_FTYPE_BF16, GGUF_FTYPE_Q8_0, GGUF_FTYPE_Q4_0, GGUF_FTYPE_Q4_K_M,
                  GGUF_FTYPE_Q6_K };

/* "bf16", "q8_0", "q4_0", "q4_k_m", "q6_k"; false for another name. */
bool gguf_ftype_parse(const char *name, enum gguf_ftype *out);

/* Writes dir's model (config.json, safetensors, and tokenizer.json with
 * tokenizer_config.json when present) to path, under a temporary name
 * renamed into place. Metadata: general.*, the {arch}.* sizes and rope keys
 * (Llama 3 scaling as an F32 rope_freqs.weight tensor), tokenizer.ggml.*
 * (gpt2-style vocabularies only) and tokenizer.chat_template. Tensors: GGUF
 * names and shapes, Llama-family q/k rows in llama.cpp's rope order, vectors
 * F32; matrices in the file type's types chosen as llama-quantize chooses
 * them (output.weight, or the tied token_embd.weight, Q6_K for the 4-bit
 * types; Q4_K_M's attn_v and ffn_down Q6_K in its "more bits" layers), and
 * a K type whose rows are not whole 256-blocks falls back to Q5_0 (Q4_K) or
 * Q8_0 (Q6_K), then any type to F16 when rows are not whole 32-blocks. The
 * bytes depend only on the inputs. */
int gguf_write_model(const char *dir, enum gguf_ftype ftype, const char *path, struct err *err);

#endif
