/* tools/mlx_write.h — a Hugging Face model directory written as an MLX-quantized one, as mlx-lm's converter would (not part of libinferd). */
#ifndef INFERD_TOOLS_MLX_WRITE_H
#define INFERD_TOOLS_MLX_WRITE_H

#include "base/err.h"

/* Writes dir's model to out_dir (created if missing) quantized as mlx-lm
 * quantizes: every matrix whose rows are whole groups (the linear layers, the
 * embedding, an untied LM head) becomes NAME.weight (U32 [rows, cols * bits
 * / 32], element j of a group at bits j * bits of its little-endian words),
 * NAME.scales and NAME.biases ([rows, cols / group_size], in the matrix's own
 * float type), by MLX's affine rule (base/quant.c's reference quantizer);
 * vectors and other matrices are copied. config.json gains quantization and
 * quantization_config {group_size, bits}; generation_config.json and the
 * tokenizer files are copied. bits 4 or 8, group_size 32, 64 or 128. The
 * bytes depend only on the inputs; each file is written under a temporary
 * name and renamed into place. */
int mlx_write_model(const char *dir, int bits, int group_size, const char *out_dir,
                    struct err *err);

#endif
