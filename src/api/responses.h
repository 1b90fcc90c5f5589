/* api/responses.h — the OpenAI Responses API: POST /v1/responses (a Response object or its event
 * stream), GET and DELETE /v1/responses/{id}. A body is translated into the chat-shaped
 * gen_request (api/request.h) that api/generation.h runs; the output is written back as output
 * items; stored responses (api/response_store.h) let a later request continue the conversation
 * through previous_response_id. */
#ifndef INFERD_API_RESPONSES_H
#define INFERD_API_RESPONSES_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "api/errors.h"
#include "api/generation.h"
#include "api/http.h"
#include "api/request.h"
#include "base/strbuf.h"
#include "text/tokenizer.h"

/* The longest previous_response_id taken, in bytes. */
#define RESPONSES_MAX_ID 128

/* An output of a function_call whose call_id the input itself does not show: it must be one of
 * the previous response's calls (checked by responses_join). */
struct responses_pending_output {
    size_t index;  /* input[index] */
    char *call_id; /* owned */
};

/* A parsed POST /v1/responses body. */
struct responses_request {
    /* What runs: kind GEN_REQUEST_CHAT; messages NULL until responses_join; tools in the chat
     * shape ([{type:"function", function:{name, description, parameters}}]). */
    struct gen_request gen;
    json_object *input;            /* owned; the input as chat messages (developer → system,
                                      function_call → assistant tool_calls, function_call_output
                                      → tool, reasoning → the next assistant's
                                      reasoning_content) */
    json_object *conversation;     /* owned; after responses_join: the previous response's
                                      messages, then input (what a later turn continues) */
    char *instructions;            /* owned; NULL when absent (after responses_join: the previous
                                      response's when absent here) */
    char *previous_response_id;    /* owned; NULL when absent */
    bool store;                    /* default true */
    bool stream;
    json_object *echo;             /* owned; the request's fields as the Response object repeats
                                      them: instructions, max_output_tokens, metadata,
                                      parallel_tool_calls, previous_response_id, reasoning, store,
                                      text, tool_choice, tools (flat function tools), truncation,
                                      user, ...; temperature and top_p only when given */
    struct responses_pending_output *pending; /* owned; n_pending entries */
    size_t n_pending;
};

/* Parses len bytes of body. Returns 0 and fills out (release with responses_request_free), or
 * -INFERD_EINVAL (400 naming the field's path, e.g. "input[2].content[0].type") /
 * -INFERD_ENOMEM (500) with e filled. */
int responses_parse(const char *body, size_t len, struct responses_request *out,
                    struct api_error *e);
void responses_request_free(struct responses_request *r);

/* Makes r's conversation and r->gen.messages: the instructions as a leading system message
 * (merged into a system message that starts the conversation), then the previous response's
 * stored messages, then the input. context is that response's stored context
 * (responses_writer_context), or NULL without previous_response_id. Returns 0, or 400
 * (an output whose call_id no call shows, an empty conversation) / 500 with e filled. */
int responses_join(struct responses_request *r, const char *context, size_t context_len,
                   struct api_error *e);

/* ---- output ---- */

/* One response's output, built from generation news: its items (reasoning, message,
 * function_call), the Response object, and, when streaming, the events. */
struct responses_writer;

struct responses_writer_config {
    const char *id;          /* "resp_…"; copied */
    const char *model;       /* copied */
    time_t created_at;
    double temperature;      /* what sampling used when the request gave none */
    double top_p;
    const struct tokenizer *tok; /* borrowed; counts reasoning tokens (NULL: only the tags) */
};

/* A writer for r (its echo fields are copied). Returns 0 or -INFERD_ENOMEM. */
int responses_writer_create(const struct responses_request *r,
                            const struct responses_writer_config *cfg,
                            struct responses_writer **out);
void responses_writer_free(struct responses_writer *w);

/* Appends response.created and response.in_progress to out. */
void responses_writer_start(struct responses_writer *w, struct strbuf *out);

/* Takes one piece of news (or, from generation_collect, all of it): reasoning text, content text
 * and tool-call pieces, in that order, each opening (and closing what was open) or extending an
 * output item; at the finish closes the items and sets the status (completed; incomplete with
 * max_output_tokens; failed with the error). With out non-NULL the events for all of it are
 * appended, each `event: TYPE` + `data: JSON` with its sequence_number. */
void responses_writer_feed(struct responses_writer *w, const struct generation_news *n,
                           struct strbuf *out);

/* True once a fed news carried the finish. */
bool responses_writer_finished(const struct responses_writer *w);
/* True when it finished as "completed" or "incomplete" (what is stored). */
bool responses_writer_succeeded(const struct responses_writer *w);

/* The Response object as of now (a new object, the caller's). */
json_object *responses_writer_response(const struct responses_writer *w);

/* The stored context for a later turn (malloc'd JSON text, the caller's; NULL when memory ran
 * out): the instructions and r's conversation followed by this answer as one assistant message
 * (content, reasoning_content, tool_calls). */
char *responses_writer_context(const struct responses_writer *w,
                               const struct responses_request *r, size_t *len);

/* ---- routes ---- */

/* POST /v1/responses. */
void responses_create(struct http_exchange *x);
/* GET /v1/responses/{id}: the stored Response object, or 404. */
void responses_get(struct http_exchange *x);
/* DELETE /v1/responses/{id}: {id, object:"response.deleted", deleted:true}, or 404. */
void responses_delete(struct http_exchange *x);

#endif
