/* api/request.h — OpenAI chat/completions request bodies parsed into struct gen_request. */
#ifndef INFERD_API_REQUEST_H
#define INFERD_API_REQUEST_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/errors.h"
#include "api/structured.h"
#include "base/json.h"

#define GEN_REQUEST_MAX_STOP 4
#define GEN_REQUEST_MAX_DEPTH 64
/* The longest session_id, prompt_cache_key or cache_salt taken, in bytes. */
#define GEN_REQUEST_MAX_KEY_BYTES 256

enum gen_request_kind {
    GEN_REQUEST_CHAT,       /* POST /v1/chat/completions */
    GEN_REQUEST_COMPLETION, /* POST /v1/completions */
};

enum gen_prompt_kind {
    GEN_PROMPT_NONE,   /* chat requests */
    GEN_PROMPT_TEXT,   /* "prompt": "..." or ["..."] */
    GEN_PROMPT_TOKENS, /* "prompt": [1, 2, 3] */
};

enum gen_tool_choice {
    GEN_TOOL_CHOICE_AUTO,
    GEN_TOOL_CHOICE_NONE,
    GEN_TOOL_CHOICE_REQUIRED,
    GEN_TOOL_CHOICE_FUNCTION, /* tool_choice_name names the function */
};

enum gen_reasoning_effort {
    GEN_REASONING_NONE,
    GEN_REASONING_MINIMAL,
    GEN_REASONING_LOW,
    GEN_REASONING_MEDIUM,
    GEN_REASONING_HIGH,
    GEN_REASONING_XHIGH,
};

struct gen_logit_bias {
    int32_t token;
    float bias; /* [-100, 100] */
};

/* Every optional field has a has_x flag so defaults (generation_config.json,
 * then CLI flags) can be filled in later only where the client said nothing.
 * JSON null counts as absent. */
struct gen_request {
    enum gen_request_kind kind;

    /* chat: owned reference; validated array of message objects */
    json_object *messages;

    /* completions */
    enum gen_prompt_kind prompt_kind;
    char *prompt_text;      /* owned; NUL-terminated, valid UTF-8 */
    size_t prompt_text_len; /* bytes, without the NUL */
    int32_t *prompt_tokens; /* owned; n_prompt_tokens ids, each >= 0 */
    size_t n_prompt_tokens;

    char *model; /* owned; NULL when absent */

    /* max_completion_tokens wins over max_tokens when both are sent */
    bool has_max_tokens;
    int64_t max_tokens; /* >= 1 */

    bool has_temperature;
    double temperature; /* [0, 2] */
    bool has_top_p;
    double top_p; /* (0, 1] */
    bool has_top_k;
    int64_t top_k; /* >= 0, or -1 for off */
    bool has_min_p;
    double min_p; /* [0, 1] */
    bool has_repetition_penalty;
    double repetition_penalty; /* (0, 10] */
    bool has_presence_penalty;
    double presence_penalty; /* [-2, 2] */
    bool has_frequency_penalty;
    double frequency_penalty; /* [-2, 2] */
    /* Penalty windows in tokens (mlx-lm's names), [0, INT32_MAX]; 0: the whole history. */
    bool has_repetition_context_size;
    int64_t repetition_context_size;
    bool has_presence_context_size;
    int64_t presence_context_size;
    bool has_frequency_context_size;
    int64_t frequency_context_size;
    bool has_xtc_probability;
    double xtc_probability; /* [0, 1] */
    bool has_xtc_threshold;
    double xtc_threshold; /* [0, 0.5] */
    bool has_seed;
    int64_t seed;

    size_t n_stop;
    char *stop[GEN_REQUEST_MAX_STOP]; /* owned; n_stop non-empty strings */

    struct gen_logit_bias *logit_bias; /* owned; n_logit_bias entries */
    size_t n_logit_bias;

    bool has_logprobs;
    bool logprobs;
    bool has_top_logprobs;
    int top_logprobs; /* [0, 20]; requires logprobs true */

    bool has_stream;
    bool stream;
    bool has_speculative;
    bool speculative;   /* false: no speculative decoding for this request (default true) */
    bool has_include_usage;
    bool include_usage; /* stream_options.include_usage */

    json_object *tools; /* owned reference; validated array of function tools, NULL when absent */
    bool has_tool_choice;
    enum gen_tool_choice tool_choice;
    char *tool_choice_name; /* owned; set for GEN_TOOL_CHOICE_FUNCTION */

    json_object *chat_template_kwargs; /* owned reference; object, NULL when absent */

    bool has_reasoning_effort;
    enum gen_reasoning_effort reasoning_effort;

    /* Structured output (api/structured.h): response_format, structured_outputs, guided_*. */
    struct structured_spec structured;
    /* Tokens allowed inside <think> when structured output runs with thinking on. */
    bool has_max_reasoning_tokens;
    int max_reasoning_tokens; /* >= 1 */

    /* Prefix-cache identity: 1..GEN_REQUEST_MAX_KEY_BYTES bytes each, NULL when absent. */
    char *cache_salt; /* owned; narrows the requester's cache namespace (vLLM's name) */
    char *adapter;    /* owned; LoRA adapters to apply: "id", "a+b", "none"; NULL: none */
    char *session_id; /* owned; session_id, else prompt_cache_key (OpenAI's name) */

    /* Set by APIs that offer them (Anthropic Messages); gen_params has their meaning. */
    int retain_tokens; /* > 0: a prefix-cache retention hint over the prompt's first tokens */
    bool think_open;   /* the reply must think: it starts inside <think> */
    int think_budget;  /* > 0: tokens allowed inside <think> before </think> is forced */
};

/* Parses len bytes of body (need not be NUL-terminated) as a request of the
 * given kind. Returns 0 and fills out (release with gen_request_free), or
 * -INFERD_EINVAL (status 400) / -INFERD_ENOMEM (status 500) with err filled
 * and out left empty. */
int gen_request_parse(const char *body, size_t len, enum gen_request_kind kind,
                      struct gen_request *out, struct api_error *err);

/* Releases everything r owns and zeroes it; safe on a zeroed struct. */
void gen_request_free(struct gen_request *r);

/* ---- for the parsers of other APIs' bodies (api/responses.c) ---- */

/* The body as a JSON object, refused as chat bodies are: empty, not JSON, nested deeper than
 * GEN_REQUEST_MAX_DEPTH, an integer beyond 64 bits, not an object. Returns 0 with *out the
 * caller's (json_object_put), or -INFERD_EINVAL / -INFERD_ENOMEM with err filled. */
int gen_request_parse_object(const char *body, size_t len, json_object **out,
                             struct api_error *err);

/* The document settings chat bodies are read with (valid UTF-8 text, 3.0 as an integer). */
#define GEN_REQUEST_DOC_FLAGS (JSON_TEXT | JSON_INTEGRAL_DOUBLES)

/* The sampling fields every generation API shares, read from root as chat reads them:
 * temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty,
 * the sampler extras (gen_request_read_sampler_extras), seed, n (1 only), stop, logit_bias. Returns 0 or a base/json reader error (the path in
 * root's doc). */
int gen_request_read_sampling(const struct json_reader *root, struct gen_request *r);
/* mlx-lm's sampler extras: xtc_probability, xtc_threshold, repetition_context_size,
 * presence_context_size, frequency_context_size. Returns 0 or a base/json reader error. */
int gen_request_read_sampler_extras(const struct json_reader *root, struct gen_request *r);
/* The adapter, and the session: session_id, else prompt_cache_key (both checked, so a
 * malformed one is refused either way); each 1..GEN_REQUEST_MAX_KEY_BYTES bytes. */
int gen_request_read_session(const struct json_reader *root, struct gen_request *r);
/* cache_salt, then gen_request_read_session's fields, as chat reads them. */
int gen_request_read_cache_identity(const struct json_reader *root, struct gen_request *r);
/* A reader error rc (from a document read with doc) as a 400 naming the path it was about
 * (-INFERD_EINVAL), or a 500 when memory ran out (-INFERD_ENOMEM). */
int gen_request_reader_error(int rc, const struct json_doc *doc, struct api_error *err);

#endif
