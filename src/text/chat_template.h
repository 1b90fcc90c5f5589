/* text/chat_template.h — a model's chat template rendered from messages the way transformers' apply_chat_template does. */
#ifndef INFERD_TEXT_CHAT_TEMPLATE_H
#define INFERD_TEXT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

struct json_object;
struct tokenizer;
struct jinja_template;

struct chat_template {
    struct jinja_template *tmpl; /* owned */
    char *bos_token, *eos_token; /* owned copies; NULL when the tokenizer has none */
};

/* Parses the tokenizer's chat_template (tokenizer_config.json). A tokenizer
 * without one is -INFERD_EUNSUPPORTED, with a message saying so. */
int chat_template_load(const struct tokenizer *tok, struct chat_template *out, struct err *err);
void chat_template_free(struct chat_template *ct);

/* Renders messages (a JSON array of {role, content, ...}; borrowed) with the
 * context transformers builds: messages, tools (when non-NULL),
 * add_generation_prompt, bos_token, eos_token, and every member of kwargs
 * (chat_template_kwargs such as enable_thinking; may be NULL) on top. *out is
 * malloc'd and NUL-terminated. */
int chat_template_render(const struct chat_template *ct, struct json_object *messages,
                         struct json_object *tools, bool add_generation_prompt,
                         struct json_object *kwargs, char **out, size_t *len, struct err *err);

/* A copy of messages (a JSON array; borrowed) as chat templates expect them,
 * the way OpenAI-compatible servers hand them over: a content given as an
 * array of text parts is joined into one string (an array with any other
 * part stays as it is), and a null content (an assistant turn that only
 * calls tools) becomes "". *out is the caller's (json_object_put).
 * -INFERD_EINVAL when messages is not an array, -INFERD_ENOMEM when the
 * copy cannot be made. */
int chat_template_join_content(struct json_object *messages, struct json_object **out,
                               struct err *err);

#endif
