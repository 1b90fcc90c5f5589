/* api/prompt.c — requests made into prompt tokens and generation parameters. */
#include "api/prompt.h"

#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api/reencode.h"
#include "base/json.h"
#include "base/timer.h"

static bool fail(struct api_error *e, int status, const char *param, const char *code,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static bool fail(struct api_error *e, int status, const char *param, const char *code,
                 const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    api_error_setv(e, status, status >= 500 ? API_ERROR_SERVER : API_ERROR_INVALID_REQUEST,
                   param, code, fmt, ap);
    va_end(ap);
    return false;
}

static uint64_t random_seed(void)
{
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        s = now_ns();
    return s;
}

bool prompt_model_thinks(const struct tokenizer *tok)
{
    return tok_piece_to_id(tok, "<think>") >= 0 && tok_piece_to_id(tok, "</think>") >= 0;
}

/* True when the rendered prompt leaves the model inside an open <think>. */
static bool ends_inside_think(const char *text, size_t len)
{
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' '))
        len--;
    static const char tag[] = "<think>";
    return len >= sizeof tag - 1 && !memcmp(text + len - (sizeof tag - 1), tag, sizeof tag - 1);
}

bool prompt_structured(const struct gen_request *req)
{
    bool forced_call = req->kind == GEN_REQUEST_CHAT && req->tools &&
                       json_object_array_length(req->tools) > 0 && req->has_tool_choice &&
                       (req->tool_choice == GEN_TOOL_CHOICE_REQUIRED ||
                        req->tool_choice == GEN_TOOL_CHOICE_FUNCTION);
    return forced_call || req->structured.kind != STRUCTURED_NONE;
}

bool prompt_thinking_asked(const struct gen_request *req)
{
    json_object *v = NULL;
    if (req->chat_template_kwargs &&
        json_object_object_get_ex(req->chat_template_kwargs, "enable_thinking", &v))
        return json_object_get_boolean(v);
    return req->think_open ||
           (req->has_reasoning_effort && req->reasoning_effort != GEN_REASONING_NONE);
}


/* The thinking switch a chat request renders with, as template_kwargs sets it: 1 on, 0 off,
 * -1 when the template's own default decides (or the request's value is not a boolean). */
static int thinking_switch(const struct server *srv, const struct gen_request *req)
{
    json_object *v = NULL;
    if (req->chat_template_kwargs &&
        json_object_object_get_ex(req->chat_template_kwargs, "enable_thinking", &v))
        return json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : -1;
    if (req->has_reasoning_effort)
        return req->reasoning_effort != GEN_REASONING_NONE;
    if (prompt_structured(req)) /* its grammar applies from the first token */
        return 0;
    if (srv->thinking != SERVER_THINKING_TEMPLATE)
        return srv->thinking == SERVER_THINKING_ON;
    return -1;
}

/* A reply without thinking is sampled cooler: with no temperature from the
 * request or --temperature, a chat turn whose thinking is switched off runs at
 * most PROMPT_NO_THINK_TEMPERATURE (generation_config.json's temperature is
 * the thinking one, published by authors who recommend a cooler direct reply). */
#define PROMPT_NO_THINK_TEMPERATURE 0.7f

static float default_temperature(const struct server *srv, const struct served_model *sm,
                                 const struct gen_request *req)
{
    float t = sm->defaults.temperature;
    if (!sm->defaults.temperature_set && req->kind == GEN_REQUEST_CHAT &&
        thinking_switch(srv, req) == 0 && t > PROMPT_NO_THINK_TEMPERATURE)
        t = PROMPT_NO_THINK_TEMPERATURE;
    return t;
}

/* Tokens XTC never removes: the end-of-sequence ids and the newline's, so it
 * cannot keep a reply from ending or a line from breaking. */
static void fill_xtc_keep(const struct served_model *sm, struct sampler_params *s)
{
    s->n_xtc_keep = 0;
    for (int i = 0; i < sm->n_eos && s->n_xtc_keep < SAMPLER_MAX_XTC_KEEP; i++)
        s->xtc_keep[s->n_xtc_keep++] = sm->eos_ids[i];
    int32_t *ids = NULL;
    int n = 0;
    struct err err = {0};
    if (sm->tok && tok_encode(sm->tok, "\n", 1, false, &ids, &n, &err) == 0)
        for (int i = 0; i < n && s->n_xtc_keep < SAMPLER_MAX_XTC_KEEP; i++)
            s->xtc_keep[s->n_xtc_keep++] = ids[i];
    free(ids);
}

/* enable_thinking: the request's own, else its reasoning effort, else off for structured
 * output (its grammar applies from the first token), else --thinking. */
static json_object *template_kwargs(const struct server *srv, const struct gen_request *req)
{
    json_object *kwargs = json_object_new_object();
    if (!kwargs)
        return NULL;
    if (req->chat_template_kwargs) {
        json_object_object_foreach(req->chat_template_kwargs, k, v)
            json_object_object_add(kwargs, k, json_object_get(v));
    }
    if (req->has_reasoning_effort && !json_object_object_get_ex(kwargs, "enable_thinking", NULL))
        json_object_object_add(
            kwargs, "enable_thinking",
            json_object_new_boolean(req->reasoning_effort != GEN_REASONING_NONE));
    if (prompt_structured(req) && !json_object_object_get_ex(kwargs, "enable_thinking", NULL))
        json_object_object_add(kwargs, "enable_thinking", json_object_new_boolean(false));
    if (srv->thinking != SERVER_THINKING_TEMPLATE &&
        !json_object_object_get_ex(kwargs, "enable_thinking", NULL))
        json_object_object_add(kwargs, "enable_thinking",
                               json_object_new_boolean(srv->thinking == SERVER_THINKING_ON));
    return kwargs;
}

/* The arguments string of each assistant tool call parsed into its object, as
 * the template expects it (transformers' templates write tool_call.arguments
 * with tojson); a string that is not a JSON object stays a string. messages is
 * the caller's copy. */
static void parse_call_arguments(json_object *messages)
{
    size_t n = json_object_array_length(messages);
    for (size_t i = 0; i < n; i++) {
        json_object *calls = NULL;
        if (!json_object_object_get_ex(json_object_array_get_idx(messages, i), "tool_calls",
                                       &calls) ||
            !json_object_is_type(calls, json_type_array))
            continue;
        size_t n_calls = json_object_array_length(calls);
        for (size_t k = 0; k < n_calls; k++) {
            json_object *call = json_object_array_get_idx(calls, k), *fn = NULL, *args = NULL;
            if (!json_object_object_get_ex(call, "function", &fn))
                fn = call;
            if (!json_object_object_get_ex(fn, "arguments", &args) ||
                !json_object_is_type(args, json_type_string))
                continue;
            json_object *parsed = NULL;
            struct err err = {0};
            if (json_text_parse(json_object_get_string(args),
                                (size_t)json_object_get_string_len(args), GEN_REQUEST_MAX_DEPTH,
                                true, &parsed, &err) == 0 &&
                json_object_is_type(parsed, json_type_object))
                json_object_object_add(fn, "arguments", parsed);
            else
                json_object_put(parsed);
        }
    }
}

static bool build_chat(const struct server *srv, const struct served_model *sm,
                       const struct gen_request *req, struct prompt *out, struct api_error *e)
{
    struct err err = {0};
    if (!sm->tmpl)
        return fail(e, 400, "messages", "no_chat_template",
                    "this model's tokenizer_config.json has no chat_template; use "
                    "/v1/completions with a raw prompt");
    json_object *kwargs = template_kwargs(srv, req);
    json_object *messages = NULL;
    if (!kwargs || chat_template_join_content(req->messages, &messages, &err) < 0) {
        json_object_put(kwargs);
        json_object_put(messages);
        return fail(e, 500, NULL, NULL, "out of memory");
    }
    parse_call_arguments(messages);
    json_object *tools =
        req->has_tool_choice && req->tool_choice == GEN_TOOL_CHOICE_NONE ? NULL : req->tools;
    char *text = NULL;
    size_t len = 0;
    int rc = chat_template_render(sm->tmpl, messages, tools, true, kwargs, &text, &len, &err);
    json_object_put(messages);
    json_object_put(kwargs);
    if (rc < 0)
        return fail(e, rc == -INFERD_ENOMEM ? 500 : 400, "messages", "template_error", "%s",
                    err.msg);
    out->starts_inside_think = ends_inside_think(text, len);
    out->text = text;
    out->text_len = len;
    return true;
}

/* out->text as ids: through the re-encoding map when the server has one. */
static int encode_text(const struct served_model *sm, uint64_t cache_ns, struct prompt *out,
                       struct err *err)
{
    if (sm->reencode)
        return reencode_encode(sm->reencode, cache_ns, out->add_special, out->text,
                               out->text_len, &out->ids, &out->n_ids, &out->n_reused, err);
    return tok_encode(sm->tok, out->text, out->text_len, out->add_special, &out->ids,
                      &out->n_ids, err);
}

bool prompt_build(const struct server *srv, const struct served_model *sm,
                  const struct gen_request *req, uint64_t cache_ns, struct prompt *out,
                  struct api_error *e)
{
    struct err err = {0};
    memset(out, 0, sizeof *out);
    bool ok;
    if (req->kind == GEN_REQUEST_CHAT) {
        ok = build_chat(srv, sm, req, out, e);
        if (ok && encode_text(sm, cache_ns, out, &err) < 0)
            ok = fail(e, err.code == INFERD_ENOMEM ? 500 : 400, "messages", NULL, "%s", err.msg);
    } else if (req->prompt_kind == GEN_PROMPT_TOKENS) {
        out->ids = malloc((req->n_prompt_tokens ? req->n_prompt_tokens : 1) * sizeof(int32_t));
        if (!out->ids)
            return fail(e, 500, NULL, NULL, "out of memory for the prompt");
        memcpy(out->ids, req->prompt_tokens, req->n_prompt_tokens * sizeof(int32_t));
        out->n_ids = (int)req->n_prompt_tokens;
        ok = true;
    } else {
        out->text = malloc(req->prompt_text_len + 1);
        if (!out->text)
            return fail(e, 500, NULL, NULL, "out of memory for the prompt");
        memcpy(out->text, req->prompt_text, req->prompt_text_len);
        out->text[req->prompt_text_len] = '\0';
        out->text_len = req->prompt_text_len;
        out->add_special = true;
        ok = encode_text(sm, cache_ns, out, &err) == 0 ||
             fail(e, err.code == INFERD_ENOMEM ? 500 : 400, "prompt", NULL, "%s", err.msg);
    }
    if (ok && out->n_ids == 0)
        ok = fail(e, 400, req->kind == GEN_REQUEST_CHAT ? "messages" : "prompt", NULL,
                  "the prompt is empty after tokenization");
    if (!ok)
        prompt_free(out);
    return ok;
}

void prompt_free(struct prompt *p)
{
    free(p->ids);
    free(p->text);
    memset(p, 0, sizeof *p);
}

/* Tokens each penalty looks back over when the request does not say (mlx-lm's default). */
#define PROMPT_PENALTY_CONTEXT_SIZE 20

/* Request fields over CLI flags over generation_config.json. */
void prompt_fill_params(const struct server *srv, const struct served_model *sm,
                        const struct gen_request *req, struct gen_params *p,
                        struct sampler_logit_bias *bias)
{
    const struct server_defaults *d = &sm->defaults;
    struct sampler_params *s = &p->sampling;
    s->temperature = req->has_temperature ? (float)req->temperature : default_temperature(srv, sm, req);
    s->top_p = req->has_top_p ? (float)req->top_p : d->top_p;
    s->top_k = req->has_top_k ? (req->top_k < 0 ? 0 : (int)req->top_k) : d->top_k;
    s->min_p = req->has_min_p ? (float)req->min_p : d->min_p;
    s->repetition_penalty =
        req->has_repetition_penalty ? (float)req->repetition_penalty : d->repetition_penalty;
    s->presence_penalty = req->has_presence_penalty ? (float)req->presence_penalty : 0;
    s->frequency_penalty = req->has_frequency_penalty ? (float)req->frequency_penalty : 0;
    s->repetition_context_size = req->has_repetition_context_size
                                     ? (int)req->repetition_context_size
                                     : PROMPT_PENALTY_CONTEXT_SIZE;
    s->presence_context_size = req->has_presence_context_size ? (int)req->presence_context_size
                                                              : PROMPT_PENALTY_CONTEXT_SIZE;
    s->frequency_context_size = req->has_frequency_context_size
                                    ? (int)req->frequency_context_size
                                    : PROMPT_PENALTY_CONTEXT_SIZE;
    s->xtc_probability = req->has_xtc_probability ? (float)req->xtc_probability : 0;
    s->xtc_threshold = req->has_xtc_threshold ? (float)req->xtc_threshold : 0;
    if (s->xtc_probability > 0)
        fill_xtc_keep(sm, s);
    s->seed = req->has_seed ? (uint64_t)req->seed : random_seed();
    for (size_t i = 0; i < req->n_logit_bias; i++)
        bias[i] = (struct sampler_logit_bias){req->logit_bias[i].token, req->logit_bias[i].bias};
    s->logit_bias = bias;
    s->n_logit_bias = (int)req->n_logit_bias;
    p->no_speculation = req->has_speculative && !req->speculative;
    int64_t max = req->has_max_tokens ? req->max_tokens : d->max_tokens;
    p->max_tokens = max > 0 && max < INT32_MAX ? (int)max : INT32_MAX;
    p->stop = (const char *const *)req->stop;
    p->n_stop = (int)req->n_stop;
    p->logprobs = req->has_logprobs && req->logprobs
                      ? (req->has_top_logprobs ? req->top_logprobs : 0)
                      : -1;
    p->eos_ids = sm->eos_ids;
    p->n_eos = sm->n_eos;
    p->retain_tokens = req->retain_tokens;
    p->think_open = req->think_open;
    p->think_budget = req->think_budget;
}

