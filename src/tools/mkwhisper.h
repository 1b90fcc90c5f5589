/* tools/mkwhisper.h — deterministic random-weight Whisper directories (config, weights, tokenizer, feature extractor) for tests. */
#ifndef INFERD_TOOLS_MKWHISPER_H
#define INFERD_TOOLS_MKWHISPER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

struct mkwhisper_preset {
    const char *name;
    int d_model, encoder_layers, decoder_layers, heads, ffn, n_mels;
    bool real_vocab; /* 51865 ids laid out as the multilingual releases (else 1865: bytes + specials) */
};

/* Every Whisper preset ("whisper-test", "whisper-test-128", "whisper-tiny", "whisper-base"); *n the count. */
const struct mkwhisper_preset *mkwhisper_presets(int *n);
const struct mkwhisper_preset *mkwhisper_preset_find(const char *name);

/* Writes dir/config.json, generation_config.json, preprocessor_config.json,
 * tokenizer.json, tokenizer_config.json and model.safetensors (f32). The
 * tokenizer is byte-level BPE over the 256 bytes (ids 0..255, no merges) and
 * Whisper's special tokens: <|endoftext|>, <|startoftranscript|>, the 100
 * language tokens, <|translate|>, <|transcribe|>, <|startoflm|>,
 * <|startofprev|>, <|nospeech|>, <|notimestamps|> and the 1501 timestamps
 * <|0.00|>..<|30.00|>, at 256.. (at the releases' 50257.. with real_vocab).
 * Element i of tensor NAME is a * u with u uniform in [-1, 1) drawn from
 * splitmix64 seeded by FNV-1a(NAME) ^ seed, a = sqrt(3) / sqrt(in) for linear
 * weights, 0.1 for biases, 1 + 0.1 u for norm weights, 0.5 for embeddings; the
 * encoder's positions are Whisper's sinusoids. */
int mkwhisper_write(const char *preset, uint64_t seed, const char *dir, struct err *err);

#endif
