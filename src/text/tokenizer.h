/* text/tokenizer.h — Hugging Face tokenizer.json semantics: encode text to ids, decode ids to text, stream decoding. */
#ifndef INFERD_TEXT_TOKENIZER_H
#define INFERD_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct tokenizer;

/* Loads DIR/tokenizer.json plus DIR/tokenizer_config.json and
 * DIR/special_tokens_map.json when present. */
int tok_load(const char *dir, struct tokenizer **out, struct err *err);

/* The same from memory: tokenizer.json text and optional tokenizer_config.json
 * text (NULL/0 when absent). Neither needs NUL termination. Fuzzed. */
int tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                  size_t config_len, struct tokenizer **out, struct err *err);
void tok_free(struct tokenizer *tok);

/* A GGUF file's tokenizer.ggml.* metadata, read by whoever parses the file
 * (model/gguf.c); strings point into it and need no NUL. */
struct tok_piece {
    const char *s;
    size_t len;
};
struct tok_gguf_vocab {
    const char *model;            /* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece) */
    size_t model_len;
    const char *pre;              /* tokenizer.ggml.pre, or NULL ("default") */
    size_t pre_len;
    const struct tok_piece *tokens; /* n_tokens, the id's piece */
    int n_tokens;
    const int32_t *types;         /* n_tokens or NULL (all normal): 1 normal, 2 unknown, 3 control,
                                     4 user-defined, 5 unused, 6 byte */
    const float *scores;          /* n_tokens or NULL; required for "llama" */
    const struct tok_piece *merges; /* n_merges "left right" pairs; required for "gpt2" */
    int n_merges;
    int bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos;                  /* 1, 0, or -1 when unset (SentencePiece then adds it) */
    bool add_space_prefix;        /* SentencePiece: prepend U+2581 */
    const char *chat_template;    /* or NULL */
    size_t chat_template_len;
};

/* Builds the tokenizer that vocabulary describes, as the tokenizer.json
 * Hugging Face ships with the model would: gpt2 vocabularies through the
 * pre-tokenizer tokenizer.ggml.pre names (qwen2, llama-bpe, default/gpt-2;
 * others are refused by name), SentencePiece ones as byte-fallback BPE with
 * merges ranked by score; control and user-defined tokens are added tokens
 * (control ones special), unused ones left out; the chat template and
 * bos/eos/pad/unk become tokenizer_config.json's. */
int tok_load_gguf_vocab(const struct tok_gguf_vocab *v, struct tokenizer **out, struct err *err);

/* The tokenizer.ggml.pre name of a gpt2-style split regex as a tokenizer.json
 * writes it ("default" for none: GPT-2's own), or NULL when none matches. */
const char *tok_gguf_pre_name(const char *regex);

/* Encodes len bytes of text (any bytes: invalid UTF-8 has defined behaviour,
 * as the Rust reference gives it for the lossily decoded string). With
 * add_special, the post-processor adds what HF adds (e.g. BOS). *ids is
 * malloc'd; caller frees. */
int tok_encode(const struct tokenizer *tok, const char *text, size_t len, bool add_special,
               int32_t **ids, int *n_ids, struct err *err);

/* Decodes ids through the tokenizer's decoder; *text is malloc'd and
 * NUL-terminated. skip_special drops special added tokens, as HF does. */
int tok_decode(const struct tokenizer *tok, const int32_t *ids, int n_ids, bool skip_special,
               char **text, size_t *len, struct err *err);

int tok_vocab_size(const struct tokenizer *tok);          /* including added tokens */
int32_t tok_piece_to_id(const struct tokenizer *tok, const char *piece); /* -1 if absent */
const char *tok_id_to_piece(const struct tokenizer *tok, int32_t id);    /* NULL if absent */
bool tok_is_special(const struct tokenizer *tok, int32_t id);

/* Special tokens named by tokenizer_config.json (NULL when unset). */
const char *tok_bos_token(const struct tokenizer *tok);
const char *tok_eos_token(const struct tokenizer *tok);
const char *tok_pad_token(const struct tokenizer *tok);
/* tokenizer_config.json's chat_template (the "default" one when it is a list), or NULL. */
const char *tok_chat_template(const struct tokenizer *tok);

/* Streaming detokenizer: feed ids one at a time; text comes out only when it
 * forms complete UTF-8 and matches what decoding the whole sequence gives. */
struct detok;
int detok_create(const struct tokenizer *tok, bool skip_special, struct detok **out,
                 struct err *err);
void detok_free(struct detok *d);
/* Appends id; *text (owned by d, valid until the next call) gets the newly
 * completed text, possibly empty. */
int detok_push(struct detok *d, int32_t id, const char **text, size_t *len, struct err *err);
/* At the end: whatever is held back (an incomplete sequence comes out as U+FFFD). */
int detok_flush(struct detok *d, const char **text, size_t *len, struct err *err);

#endif
