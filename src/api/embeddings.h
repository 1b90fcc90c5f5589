/* api/embeddings.h — the OpenAI embeddings route: POST /v1/embeddings. */
#ifndef INFERD_API_EMBEDDINGS_H
#define INFERD_API_EMBEDDINGS_H

#include "api/http.h"

/* input (a string, strings, token ids or arrays of them), encoding_format
 * float | base64 (little-endian f32), dimensions (the first d, re-normalised),
 * model and user; each input's last-token hidden state from the engine,
 * L2-normalised (api/embeddings.c says why). */
void openai_embeddings(struct http_exchange *x);

#endif
