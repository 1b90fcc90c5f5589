/* api/anthropic.h — the Anthropic Messages wire format: POST /v1/messages (a message object or
 * its Server-Sent Events) and POST /v1/messages/count_tokens, translated onto the API-neutral
 * request (api/request.h) and generation path (api/generation.h). */
#ifndef INFERD_API_ANTHROPIC_H
#define INFERD_API_ANTHROPIC_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/generation.h"
#include "api/http.h"
#include "api/request.h"
#include "api/server.h"
#include "base/strbuf.h"

/* The most tools one request may define, and the longest tool name, in bytes. */
#define ANTHROPIC_MAX_TOOLS 512
#define ANTHROPIC_MAX_TOOL_NAME 128

/* Route handlers (api/routes.c). Errors go out in Anthropic's shape (api_error_anthropic);
 * the server's 503 (loading, stopping, out of memory) as 529 overloaded_error. */
void anthropic_messages(struct http_exchange *x);
void anthropic_count_tokens(struct http_exchange *x);

/* ---- the request ------------------------------------------------------------ */

enum anthropic_body {
    ANTHROPIC_MESSAGES,     /* POST /v1/messages: max_tokens required */
    ANTHROPIC_COUNT_TOKENS, /* POST /v1/messages/count_tokens: max_tokens and stream ignored */
};

/* A Messages body translated. req holds the conversation in OpenAI's shape (kind
 * GEN_REQUEST_CHAT): system → a system message; text blocks → text parts; tool_use →
 * the assistant's tool_calls (arguments as JSON text); tool_result → role "tool" messages
 * with tool_call_id; thinking → the assistant's reasoning_content; tools → function tools
 * (input_schema as parameters); tool_choice auto|any|tool|none → auto|required|function|none;
 * thinking enabled|adaptive|disabled → chat_template_kwargs.enable_thinking, with
 * think_open and think_budget for enabled. */
struct anthropic_request {
    struct gen_request req;
    /* The conversation cut right after the last cache_control breakpoint (same shape as
     * req.messages), whose rendering ends where the retention hint does; NULL when the
     * request has no breakpoint, or only one on tools with no system prompt. */
    json_object *retain_messages; /* owned reference */
};

/* Parses len bytes of body. Returns 0 and fills out (release with anthropic_request_free),
 * or -INFERD_EINVAL (400, the message naming the field's path, e.g.
 * "messages[1].content[0].type ...") / -INFERD_ENOMEM (500) with e filled. */
int anthropic_request_parse(const char *body, size_t len, enum anthropic_body kind,
                            struct anthropic_request *out, struct api_error *e);
void anthropic_request_free(struct anthropic_request *r);

/* Prompt tokens up to the last cache_control breakpoint: the length of the rendering of
 * r->retain_messages (without the generation prompt), encoded as sm encodes chat prompts; 0 when
 * there is none or it cannot be rendered (a hint, never an error). */
int anthropic_retain_tokens(const struct served_model *sm, const struct anthropic_request *r);

/* ---- the reply ---------------------------------------------------------------- */

/* What a reply says besides the generation's own output. */
struct anthropic_reply {
    char id[40];                              /* "msg_" and 24 hex digits */
    const char *model;                        /* borrowed */
    char *stop[GEN_REQUEST_MAX_STOP];         /* owned; the request's stop_sequences */
    size_t n_stop;
    int cache_block_size;                     /* the prefix cache's block, in positions;
                                                 0: the cache is off */
};

/* The message object for a finished generation (all from generation_collect):
 * content [thinking?, text?, tool_use*], stop_reason end_turn | max_tokens | stop_sequence |
 * tool_use, stop_sequence, usage. Returns 0 or -INFERD_ENOMEM. */
int anthropic_message_json(const struct anthropic_reply *r, const struct generation_news *all,
                           struct strbuf *out);

/* A reply streamed as Server-Sent Events: message_start, then per block in order
 * content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) /
 * content_block_stop, then message_delta and message_stop; or an error event. */
enum anthropic_block { ANTHROPIC_BLOCK_NONE, ANTHROPIC_BLOCK_THINKING, ANTHROPIC_BLOCK_TEXT,
                       ANTHROPIC_BLOCK_TOOL_USE };

struct anthropic_stream {
    struct anthropic_reply reply;
    bool started;              /* message_start is out */
    int n_blocks;              /* blocks opened so far (the next block's index) */
    enum anthropic_block open; /* the block now open */
    int open_call;             /* with ANTHROPIC_BLOCK_TOOL_USE: the call's index */
};

/* Appends the events for one piece of news (message_start first, with the prompt's counts);
 * at the finish the closing events, *done set. */
void anthropic_stream_news(struct anthropic_stream *s, const struct generation_news *n,
                           struct strbuf *out, bool *done);
/* The keep-alive event: event: ping. */
void anthropic_stream_ping(struct strbuf *out);

#endif
