/* api/structured.h — structured output requests made into engine constraints: the request
 * fields (response_format, structured_outputs, guided_grammar/json/regex/choice, Responses'
 * text.format) read into one spec, forced tool calls built from the model family's call
 * syntax and the tools' parameter schemas, and a bounded, server-wide LRU cache of compiled
 * grammars keyed by content, so a repeated schema compiles once. */
#ifndef INFERD_API_STRUCTURED_H
#define INFERD_API_STRUCTURED_H

#include <json-c/json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/json.h"
#include "engine/engine.h"

/* The cache's default size in compiled grammars (`inferd serve --grammar-cache N`). */
#define GRAMMAR_CACHE_DEFAULT 64

enum structured_kind {
    STRUCTURED_NONE = 0,
    STRUCTURED_JSON_SCHEMA, /* text: the schema (JSON) */
    STRUCTURED_JSON_OBJECT, /* any JSON object; text empty */
    STRUCTURED_REGEX,       /* text: the expression */
    STRUCTURED_CHOICE,      /* text: a JSON array of strings */
    STRUCTURED_GRAMMAR,     /* text: GBNF */
    STRUCTURED_TOOL_CALL,   /* text: {"syntax": "...", "tools": [{"name", "parameters"}...]} */
};

/* What a request asks its reply to be. */
struct structured_spec {
    enum structured_kind kind;
    char *text;            /* owned; NUL-terminated, len bytes */
    size_t len;
    bool free_whitespace;  /* JSON: any whitespace (any_whitespace); default compact */
    const char *param;     /* static; the request field it came from, for errors */
};

void structured_spec_free(struct structured_spec *s);

/* Reads the chat/completions fields from root, by precedence guided_grammar >
 * response_format json_schema > json_object > structured_outputs (a bare schema) >
 * guided_json > guided_regex > guided_choice; response_format {"type":"text"} asks for
 * nothing. Returns 0 (out->kind NONE when nothing is asked) or a base/json reader error. */
int structured_read_request(const struct json_reader *root, struct structured_spec *out);

/* Reads Responses' text.format (format: the object; {"type":"json_schema","name","schema",
 * "strict"} or {"type":"json_object"} or {"type":"text"}). */
int structured_read_text_format(const struct json_reader *format, struct structured_spec *out);

/* A forced tool call: the reply is one call, in syntax (text/toolcall.h's enum, by name:
 * "hermes", "qwen3_coder", "llama_json", "mistral"), of the function named name (NULL: any of
 * tools), its arguments valid under that tool's parameters schema. tools: the request's
 * validated array of OpenAI function tools. */
int structured_tool_call_spec(const char *syntax, json_object *tools, const char *name,
                              struct structured_spec *out, struct err *err);

struct grammar_cache;
struct grammar_cache_stats {
    uint64_t hits, misses;
    int entries, capacity;
};

/* vocab: borrowed, the tokenizer's (built once at start-up); capacity >= 1. */
int grammar_cache_create(const struct grammar_vocab *vocab, int capacity,
                         struct grammar_cache **out, struct err *err);
void grammar_cache_free(struct grammar_cache *c);
/* The compiled constraint for spec: one reference for the caller (gen_grammar_release).
 * Compile errors: -INFERD_EFORMAT (malformed), -INFERD_EUNSUPPORTED (a construct named with
 * its JSON path), -INFERD_EINVAL, -INFERD_ERANGE (too large), -INFERD_ENOMEM. Thread-safe. */
int grammar_cache_get(struct grammar_cache *c, const struct structured_spec *spec,
                      struct gen_grammar **out, struct err *err);
void grammar_cache_stats(struct grammar_cache *c, struct grammar_cache_stats *out);

#endif
