/* base/quant.h — the block formats (GGUF's, bit-compatible with llama.cpp's files, and MLX's affine groups): reference quantizers and dequantizers. */
#ifndef INFERD_BASE_QUANT_H
#define INFERD_BASE_QUANT_H

#include <stdint.h>

#include "base/dtype.h"

/* Block layouts (little-endian, packed; d/dmin/m are IEEE half floats):
 *   Q8_0  (32, 34 B):  d, int8 q[32]                      x = d * q
 *   Q4_0  (32, 18 B):  d, u8 qs[16]                       x[j] = d * ((qs[j] & 15) - 8), x[j+16] from qs[j] >> 4
 *   Q4_1  (32, 20 B):  d, m, u8 qs[16]                    x = d * q + m
 *   Q5_0  (32, 22 B):  d, u32 qh, u8 qs[16]               bit 4 of element j is bit j of qh; x = d * (q - 16)
 *   Q5_1  (32, 24 B):  d, m, u32 qh, u8 qs[16]            x = d * q + m
 *   Q2_K  (256, 84 B): u8 scales[16], u8 qs[64], d, dmin  16 groups of 16: x = d*(sc&15)*q - dmin*(sc>>4)
 *   Q3_K  (256, 110 B): u8 hmask[32], u8 qs[64], u8 scales[12], d      6-bit signed group scales
 *   Q4_K  (256, 144 B): d, dmin, u8 scales[12], u8 qs[128]   8 groups of 32, 6-bit scale and min each
 *   Q5_K  (256, 176 B): d, dmin, u8 scales[12], u8 qh[32], u8 qs[128]
 *   Q6_K  (256, 210 B): u8 ql[128], u8 qh[64], int8 scales[16], d   x = d * scale * (q - 32)
 * The K formats interleave their quants in 32- or 64-element strips; the
 * exact order is in quant.c, one function per format in each direction.
 *   MLX<b>_G<g>_<S> (g elements; 2 * sizeof(S) + g * b / 8 B): S scale, S bias,
 *     u32 words[g * b / 32]   element j = bits [j*b, j*b + b) of the little-endian
 *     words (word j*b/32, shift j*b%32), x = scale * q + bias in f32
 *   One MLX block is one group of an mlx-community checkpoint: its scale and
 *   bias (BF16, F16 or F32, as stored) followed by the group's bytes of the
 *   packed uint32 weight, unchanged, so no value moves in the conversion. */

/* dst[0..n) = the n elements (a multiple of t's block) stored at src in
 * type t; any dtype, dense ones included. */
void quant_dequantize_row(enum dtype t, const void *src, float *dst, int64_t n);

/* Writes n floats (a multiple of t's block) into dst in type t
 * (dtype_row_bytes(t, n) bytes) by llama.cpp's reference rules without an
 * importance matrix, so a file we write holds what its quantizer writes for
 * the same input. Dense types round to nearest even. */
void quant_quantize_row(enum dtype t, const float *src, void *dst, int64_t n);

/* IEEE half from float, rounded to nearest even (what F16C's vcvtps2ph does). */
uint16_t quant_f32_to_f16(float f);

#endif
