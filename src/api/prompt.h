/* api/prompt.h — a parsed request made into what the engine takes: the prompt's tokens (the
 * chat template and the tokenizer, or a raw prompt) and the generation parameters (request
 * fields over CLI flags over generation_config.json). */
#ifndef INFERD_API_PROMPT_H
#define INFERD_API_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "api/request.h"
#include "api/server.h"
#include "engine/engine.h"

struct prompt {
    int32_t *ids;             /* owned; n_ids token ids */
    int n_ids;
    int n_reused;             /* leading ids the model generated earlier (api/reencode.h) */
    char *text;               /* owned; the rendered or given text the ids encode, text_len
                                 bytes; NULL for a prompt given as token ids */
    size_t text_len;
    bool add_special;         /* text was encoded with the tokenizer's added special tokens */
    bool starts_inside_think; /* the rendered prompt ends inside an open <think> */
};

/* Renders (chat, with sm's template and srv's --thinking) or takes (completions) the prompt
 * and encodes it with sm's tokenizer; where sm has a re-encoding map, text the model generated
 * earlier under cache_ns gets its own ids back. Returns false with e filled (400, or 500 when
 * memory ran out). */
bool prompt_build(const struct server *srv, const struct served_model *sm,
                  const struct gen_request *req, uint64_t cache_ns, struct prompt *out,
                  struct api_error *e);
void prompt_free(struct prompt *p);

/* The engine's parameters for req, all but the prompt (prompt, n_prompt),
 * which is encoded after them, under their cache_ns. bias must hold
 * req->n_logit_bias entries; p keeps pointers into req, bias and sm (sm's defaults
 * below the request's fields). */
void prompt_fill_params(const struct server *srv, const struct served_model *sm,
                        const struct gen_request *req, struct gen_params *p,
                        struct sampler_logit_bias *bias);

/* True when req constrains its reply: structured output fields, or a forced tool call
 * (tool_choice "required" or a named function, with tools). */
bool prompt_structured(const struct gen_request *req);
/* True when req itself turns thinking on: chat_template_kwargs.enable_thinking true, a
 * reasoning effort other than none, or a thinking block that opens the reply. With structured
 * output, thinking is off unless this holds. */
bool prompt_thinking_asked(const struct gen_request *req);

/* True when the model's tokenizer has <think> and </think>: its replies are
 * split into reasoning and content. */
bool prompt_model_thinks(const struct tokenizer *tok);

#endif
