/* api/generation.h — what every API does to answer a generation request: the readiness checks,
 * the prompt and the engine's parameters, submitting (the engine's refusals mapped to HTTP
 * statuses), taking the output as it comes while watching the client, splitting the text into
 * reasoning and content, and parsing tool calls out of the content. An API file adds only its
 * wire format. */
#ifndef INFERD_API_GENERATION_H
#define INFERD_API_GENERATION_H

#include <stdbool.h>
#include <stddef.h>

#include "api/errors.h"
#include "api/http.h"
#include "api/request.h"
#include "engine/engine.h"

/* A reply's (or one of its parts') id: prefix, then 24 random hex digits, in
 * out (cap bytes, NUL-terminated; cut short when cap is too small). */
void generation_random_id(char *out, size_t cap, const char *prefix);

/* A request on its way through the engine. */
struct generation;

/* 0 when the server takes generations now; else e is a 503 (shutting_down,
 * model_loading) and -INFERD_EBUSY is returned. Call before reading the body,
 * so a loading server says so whatever the request. */
int generation_admit(const struct server *srv, struct api_error *e);

/* Builds req's prompt and parameters and submits them to sm's engine (sm from
 * served_model_acquire: the generation takes that reference over, and lets it
 * go in generation_free, or before returning an error). Returns 0 with *out
 * (release with generation_free), or a negative code with e filled: the
 * prompt's own errors, 429 rate_limit_exceeded (queue full), 400
 * context_length_exceeded naming "messages" or "prompt", 503 out_of_memory,
 * else 400. The reply is split into reasoning and content when req is a chat
 * and the model thinks in <think>…</think>; tool calls are parsed out of the
 * content when req is a chat whose tools array is non-empty and whose
 * tool_choice is not "none" (the syntax chosen from the chat template,
 * text/toolcall.h). */
int generation_start(const struct http_exchange *x, struct served_model *sm,
                     const struct gen_request *req, struct generation **out, struct api_error *e);

/* The model the generation runs on (its id, tokenizer and defaults for the reply). */
struct served_model *generation_model(const struct generation *g);

/* A generation over an output the caller feeds itself (srv's one model, no
 * pool), as generation_start builds one less the prompt and the engine: the same reading, reasoning split
 * and tool-call parsing, with no client to watch. Takes over one reference of
 * out. Tests drive the output path with token ids of their own through it. */
int generation_open_output(struct server *srv, const struct gen_request *req,
                           struct gen_output *out, bool starts_inside, struct generation **g,
                           struct api_error *e);

/* The logprobs the engine reports per token: -1 none, else the alternatives. */
int generation_logprobs(const struct generation *g);

/* Text split into reasoning and content; both owned, NUL-terminated, never
 * NULL once filled. */
struct generation_text {
    char *reasoning;
    size_t reasoning_len;
    char *content;
    size_t content_len;
};

/* One piece of a tool call the model made, in the order they were made. */
struct generation_tool_delta {
    int index;        /* the call's position among this answer's calls, from 0 */
    char *id;         /* owned; on a call's first piece only ("call_" + 24 random alphanumerics), else NULL */
    char *name;       /* owned; on a call's first piece only, else NULL */
    char *arguments;  /* owned, NUL-terminated; the next bytes of the call's arguments JSON text (may be "") */
    size_t content_offset; /* bytes of this news' content (text.content, then tail.content) that
                              the model wrote before this piece: where the call stands among the text */
};

struct generation_news {
    struct gen_news out;         /* what the engine produced: text, tokens, finish, counts */
    bool split;                  /* the reply is in text (and tail), not out.text: reasoning apart
                                    (<think>) and/or tool calls out of the content */
    struct generation_text text;
    struct generation_text tail; /* at the finish of a split generation: the text the split
                                    held back, to send after text */
    struct generation_tool_delta *tools;  /* owned; n_tools pieces found in this news (text.content
                                             then holds only the text outside calls) */
    size_t n_tools;
    bool tool_calls;  /* at the finish: the answer made at least one call (finish reason "tool_calls") */
};

/* Waits up to timeout_ms (-1: as long as it takes) for text or tokens past
 * what was taken, or the finish, and takes them. Returns 0 (news empty and
 * still running when the time ran out), -INFERD_EIO when the client went away
 * (the generation is cancelled), or -INFERD_ENOMEM. Release news with
 * generation_news_free. */
int generation_next(struct generation *g, int timeout_ms, struct generation_news *news);

/* Waits for the finish and takes the whole output at once (out.text_from 0),
 * split when the generation splits (whole-text rules); each tool call is one
 * delta with id, name and the whole arguments. Returns 0 when it
 * finished normally (stop or length); else e says why: 503 cancelled (client
 * gone, or the server stopping), 503 out_of_memory, 500 with the engine's
 * message. */
int generation_collect(struct generation *g, struct generation_news *all, struct api_error *e);

void generation_news_free(struct generation_news *news);

/* Cancels the generation if it has not finished, and frees it. */
void generation_free(struct generation *g);

#endif
