/* model/whisper.h — Whisper (transformers' WhisperForConditionalGeneration): its config, weights, encoder and decoder steps over a backend's ops. */
#ifndef INFERD_MODEL_WHISPER_H
#define INFERD_MODEL_WHISPER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/err.h"

#define WHISPER_MAX_SUPPRESS 256

/* config.json (and generation_config.json's decoding lists) of a Whisper directory. */
struct whisper_config {
    int d_model, vocab_size, n_mels;
    int encoder_layers, encoder_heads, encoder_ffn;
    int decoder_layers, decoder_heads, decoder_ffn;
    int max_source_positions; /* 1500: encoder frames of a 30 s window */
    int max_target_positions; /* 448: decoder positions */
    bool scale_embedding;     /* embeddings times sqrt(d_model) (false in every release) */
    bool multilingual;        /* language and task tokens in the prompt: generation_config.json's
                                 is_multilingual, else vocab_size >= 51865 */
    /* generation_config.json: tokens never sampled, and those not sampled first */
    int32_t suppress[WHISPER_MAX_SUPPRESS];
    int n_suppress;
    int32_t begin_suppress[WHISPER_MAX_SUPPRESS];
    int n_begin_suppress;
};

/* Parses config.json text; -INFERD_EFORMAT / -INFERD_EUNSUPPORTED name the field. */
int whisper_config_parse(const char *text, size_t len, struct whisper_config *out,
                         struct err *err);

struct whisper_attn_w {
    float *q_w, *q_b, *k_w, *v_w, *v_b, *o_w, *o_b; /* backend memory, f32; k has no bias */
    float *ln_w, *ln_b;                             /* the LayerNorm before the block */
};

struct whisper_layer_w {
    struct whisper_attn_w self, cross;   /* cross: decoder layers only */
    float *fc1_w, *fc1_b, *fc2_w, *fc2_b, *ln_w, *ln_b;
};

struct whisper_model {
    struct whisper_config config;
    struct backend *backend;             /* borrowed */
    float *conv1_w, *conv1_b, *conv2_w, *conv2_b;
    float *enc_pos;                      /* max_source_positions x d_model */
    struct whisper_layer_w *enc, *dec;   /* owned arrays; their tensors backend memory */
    float *enc_ln_w, *enc_ln_b, *dec_ln_w, *dec_ln_b;
    float *embed;                        /* vocab x d_model; also the output head (tied) */
    float *dec_pos;                      /* max_target_positions x d_model */
    void **buffers;                      /* owned: every backend buffer above */
    int n_buffers, cap_buffers;
    uint64_t weight_bytes;
};

/* Loads DIR's config.json, generation_config.json (optional) and safetensors
 * (every tensor converted to f32 in backend memory) onto be, which must have
 * the encoder-decoder ops. The encoder's positions are the checkpoint's
 * embed_positions, or Whisper's sinusoids when it has none; proj_out, when
 * present, must equal the token embedding's shape (the head is tied). */
int whisper_load(const char *dir, struct backend *be, struct whisper_model **out,
                 struct err *err);
void whisper_free(struct whisper_model *m);

/* One transcription's activations and caches: the encoder output's K/V per
 * decoder layer (computed once per 30 s window), the decoder's own K/V. */
struct whisper_state {
    const struct whisper_model *m; /* borrowed */
    int n_past;                    /* decoder positions filled */
    float *cross_k, *cross_v;      /* decoder_layers x max_source_positions x d_model */
    float *self_k, *self_v;        /* decoder_layers x max_target_positions x d_model */
    float *enc_out;                /* max_source_positions x d_model: the last window encoded */
    float *mel, *conv;             /* 2 * max_source_positions rows: the input and conv1's output */
    float *x, *xn, *q, *k, *v, *attn, *ffn; /* scratch, max_source_positions rows */
    float *logits;                 /* vocab floats */
};

int whisper_state_create(const struct whisper_model *m, struct whisper_state **out,
                         struct err *err);
void whisper_state_free(struct whisper_state *st);

/* Encodes one window's features (n_mels x 3000 floats, host memory, as
 * audio_mel_window writes them) and fills every decoder layer's cross K/V;
 * resets the decoder (n_past = 0). */
int whisper_encode(struct whisper_state *st, const float *mel, struct err *err);

/* The encoder's output of the last whisper_encode, max_source_positions x
 * d_model floats copied to host memory (tests compare it to transformers). */
int whisper_encoder_output(struct whisper_state *st, float *out, struct err *err);

/* Feeds n tokens at positions [n_past, n_past + n) and writes the last one's
 * logits (vocab floats) into logits (host memory). -INFERD_ERANGE past
 * max_target_positions. */
int whisper_decode(struct whisper_state *st, const int32_t *tokens, int n, float *logits,
                   struct err *err);

/* Forgets decoder positions from n onwards (a new prompt after position n). */
void whisper_rewind(struct whisper_state *st, int n);

#endif
