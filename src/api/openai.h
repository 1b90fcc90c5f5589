/* api/openai.h — the OpenAI API's route handlers: POST /v1/chat/completions, POST
 * /v1/completions, GET /v1/models and /v1/models/{id}. */
#ifndef INFERD_API_OPENAI_H
#define INFERD_API_OPENAI_H

#include "api/http.h"

void openai_chat_completions(struct http_exchange *x);
void openai_completions(struct http_exchange *x);
/* Lists the model, or (x->id set) describes it. */
void openai_models(struct http_exchange *x);

#endif
