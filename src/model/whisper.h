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
    /* generation_config.json's alignment_heads, (layer, head) pairs flattened; when it has
     * none, every head of the last half of the decoder layers (as openai-whisper and
     * transformers choose) */
    int alignment_heads[2 * WHISPER_MAX_SUPPRESS];
    int n_alignment_heads;
    /* generation_config.json's max_previous_text_tokens (inferd's own key): the most tokens of
     * previous text or prompt after <|startofprev|> the model was trained to read; without it
     * openai-whisper's n_text_ctx / 2 - 1 */
    int max_previous_text;
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

#define WHISPER_MAX_SEQS 16 /* decoder sequences (beams) one state holds at most */

/* One transcription's activations and caches: the encoder output's K/V per
 * decoder layer (computed once per 30 s window, shared by every sequence),
 * the decoder's own K/V for n_seqs sequences (beams) that share n_past. The
 * sequences' rows of one position sit side by side, scattered there from the
 * step's K/V product (backend_ops.scatter_rows):
 *   self_k[((layer * max_target_positions + pos) * n_seqs + seq) * d_model + e]
 * and sequence s's keys are rows of stride n_seqs * d_model from seq s's first. */
struct whisper_state {
    const struct whisper_model *m; /* borrowed */
    int n_past;                    /* decoder positions filled */
    int n_seqs;                    /* sequences the self K/V holds (1 until whisper_state_reserve) */
    float *cross_k, *cross_v;      /* decoder_layers x max_source_positions x d_model */
    float *self_k, *self_v;        /* decoder_layers x max_target_positions x n_seqs x d_model */
    float *spare_k, *spare_v;      /* as self_k/self_v (n_seqs > 1): whisper_seqs_select's target */
    float *enc_out;                /* max_source_positions x d_model: the last window encoded */
    float *mel, *conv;             /* 2 * max_source_positions rows: the input and conv1's output */
    float *x, *xn, *q, *k, *v, *attn, *ffn; /* scratch, max_source_positions rows */
    float *logits;                 /* WHISPER_MAX_SEQS x vocab floats */
    /* host memory, max(max_target_positions, WHISPER_MAX_SEQS) entries each: a step's
     * positions and its rows of the self K/V (indices the backend reads at the step) */
    int32_t *step_pos, *step_rows;
    /* whisper_cross_scores: each decoder layer's cross-attention queries of the pass, copied
     * to host memory (capture_q[layer] owned, NULL for layers not asked for) */
    float **capture_q;
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

/* Feeds n tokens of sequence 0 at positions [n_past, n_past + n) and writes
 * the last one's logits (vocab floats) into logits (host memory; NULL: none).
 * -INFERD_ERANGE past max_target_positions. */
int whisper_decode(struct whisper_state *st, const int32_t *tokens, int n, float *logits,
                   struct err *err);

/* Forgets decoder positions from n onwards (a new prompt after position n). */
void whisper_rewind(struct whisper_state *st, int n);

/* Makes the state hold n_seqs (1..WHISPER_MAX_SEQS) decoder sequences,
 * reallocating the self K/V when the count changes (the decoder is reset,
 * n_past = 0; the window's cross K/V stay). whisper_decode feeds sequence 0. */
int whisper_state_reserve(struct whisper_state *st, int n_seqs, struct err *err);

/* One token per sequence: tokens[s] goes to sequence s (s < n <= n_seqs) at
 * position n_past, then n_past advances; logits gets n x vocab floats (host
 * memory), row s sequence s's. Sequences [n, n_seqs) are left as they were. */
int whisper_decode_seqs(struct whisper_state *st, const int32_t *tokens, int n, float *logits,
                        struct err *err);

/* Beam reordering: sequence s's self K/V over positions [0, n_past) become
 * what sequence src[s]'s were, for every s < n (src[s] < n_seqs; sources may
 * repeat); sequences [n, n_seqs) keep theirs. */
int whisper_seqs_select(struct whisper_state *st, const int *src, int n, struct err *err);

/* The decoder's cross-attention scores for alignment (word timestamps):
 * tokens [0, n) are fed to sequence 0 from position 0 (the state's decoder
 * is reset), and for each of the n_pairs (layer, head) pairs heads[2p],
 * heads[2p + 1] the scaled scores q . k / sqrt(head_dim) of every token
 * against encoder frames [0, n_frames) go to out + p * n * n_frames
 * (row-major tokens x frames, host memory), before any softmax. */
int whisper_cross_scores(struct whisper_state *st, const int32_t *tokens, int n,
                         const int *heads, int n_pairs, int n_frames, float *out,
                         struct err *err);

#endif
