/* text/toolcall.h — tool calls parsed out of a model's generated text, per model family, streaming. */
#ifndef INFERD_TEXT_TOOLCALL_H
#define INFERD_TEXT_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

struct json_object;

/* How a model family writes a tool call in its reply. */
enum toolcall_syntax {
    TOOLCALL_HERMES,      /* Qwen/Hermes: <tool_call>{"name":…,"arguments":{…}}</tool_call>, any number */
    TOOLCALL_QWEN3_CODER, /* <tool_call><function=NAME><parameter=KEY>VALUE</parameter>…</function></tool_call>
                             (the Hermes JSON form is taken inside <tool_call> too) */
    TOOLCALL_LLAMA_JSON,  /* Llama 3.1+: the whole reply is {"name":…,"parameters":{…}}, after an optional
                             <|python_tag|>; several separated by ';' or newlines */
    TOOLCALL_MISTRAL,     /* [TOOL_CALLS][{"name":…,"arguments":{…}}, …] (the marker is a special token the
                             detokenizer drops, so a reply that starts with the array counts too) */
};

/* The syntax the chat template teaches the model, from what it writes:
 * "<tool_call>" → Hermes, unless it also writes "<function=" → Qwen3-Coder;
 * "[TOOL_CALLS]" → Mistral; "<|python_tag|>" or Llama 3.1's "parameters" JSON
 * → Llama JSON; anything else (or NULL) → Hermes, the most common. When why is
 * non-NULL it gets a static phrase saying which of these decided it. */
enum toolcall_syntax toolcall_syntax_for_template(const char *chat_template_source,
                                                  const char **why);

/* "hermes", "qwen3_coder", "llama_json", "mistral". */
const char *toolcall_syntax_name(enum toolcall_syntax s);

enum toolcall_event_kind {
    TOOLCALL_TEXT,       /* content outside any call: text, len */
    TOOLCALL_CALL_START, /* a call begins: text is its name (NUL-terminated) */
    TOOLCALL_ARGUMENTS,  /* the next bytes of the call's arguments JSON text: text, len */
    TOOLCALL_CALL_END,   /* the call is complete; its arguments were one compact JSON object */
};

struct toolcall_event {
    enum toolcall_event_kind kind;
    int index;        /* the call's position among this reply's calls, from 0 (not for TEXT) */
    const char *text; /* owned by the parser; valid until its next call */
    size_t len;
};

/* One push's events, in the order of the reply; owned by the parser and valid
 * until its next call. */
struct toolcall_events {
    const struct toolcall_event *events;
    size_t n;
};

struct toolcall_parser;

/* tools: the request's tools array (borrowed; kept referenced by the parser; may
 * be NULL), whose JSON Schemas type Qwen3-Coder parameter values. */
int toolcall_parser_create(enum toolcall_syntax syntax, struct json_object *tools,
                           struct toolcall_parser **out, struct err *err);
void toolcall_parser_free(struct toolcall_parser *p);

/* Feeds the next len bytes of content (any split, even inside a UTF-8
 * sequence or a tag). Text is held back only while it may be the start of a
 * call (and whitespace that may turn out to stand next to one, and an
 * incomplete UTF-8 sequence); a call is held until it closes, then comes out
 * whole: CALL_START, ARGUMENTS (the compact JSON object: the text parsed, near-JSON
 * repaired, and serialised again), CALL_END. A call that does not parse is
 * given back as text, markers and all. Whitespace between a call and what stands
 * next to it is dropped. Whatever the split, the events concatenate to the same
 * as one push of the whole text. -INFERD_ENOMEM is the only failure. */
int toolcall_parser_push(struct toolcall_parser *p, const char *text, size_t len,
                         struct toolcall_events *out, struct err *err);

/* End of the reply: what was held back. A call whose JSON never closed is
 * returned as text, never as a broken call. */
int toolcall_parser_finish(struct toolcall_parser *p, struct toolcall_events *out,
                           struct err *err);

/* Calls completed so far. */
int toolcall_parser_calls(const struct toolcall_parser *p);

/* The near-JSON reader the parser uses, for anyone holding model-written
 * JSON: standard JSON, plus trailing commas, single-quoted strings and keys,
 * unquoted keys, and Python's True/False/None; whitespace around the value and
 * a ```json fence are allowed. Returns the value (the caller's,
 * json_object_put; NULL for null) or -INFERD_EFORMAT / -INFERD_ENOMEM. */
int toolcall_json_repair(const char *text, size_t len, struct json_object **out,
                         struct err *err);

#endif
