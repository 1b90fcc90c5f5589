/* api/embeddings.c — POST /v1/embeddings (OpenAI's shape): each input's last-token hidden state, computed by the engine beside the generations, L2-normalised, as floats or base64.
 *
 * Pooling is the last token's final-normed hidden state (what the LM head
 * would read), L2-normalised: Qwen3-Embedding's, which its directory declares
 * with sentence-transformers' modules.json and a Pooling module whose
 * pooling_mode_lasttoken is on. A directory without those files is pooled
 * the same way (any served model answers, its last-token state); one that
 * declares another pooling (mean, CLS, ...) is refused with a 400 rather
 * than answered with vectors it did not mean. Inputs are encoded with the
 * tokenizer's special tokens added (the post-processor's, e.g. the
 * end-of-text token Qwen3-Embedding appends); token-id inputs go as given. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/embeddings.h"
#include "api/engine_proxy.h"
#include "api/generation.h"
#include "api/keys.h"
#include "api/model_pool.h"
#include "base/json.h"
#include "base/sha1.h"
#include "base/strbuf.h"

/* Inputs one request may carry (OpenAI's limit). */
#define EMBED_MAX_INPUTS 2048
/* How long a request waits on the engine between checks of the client. */
#define EMBED_WAIT_MS 1000
/* Nesting a body may have: an array of token arrays is 3 deep. */
#define EMBED_MAX_DEPTH 8

struct embed_input {
    int32_t *ids; /* owned; n */
    int n;
};

struct embed_request {
    struct embed_input *inputs; /* owned; n_inputs */
    int n_inputs;
    bool base64;
    int dimensions; /* 0: all */
};

static void embed_request_free(struct embed_request *r)
{
    for (int i = 0; i < r->n_inputs; i++)
        free(r->inputs[i].ids);
    free(r->inputs);
}

/* One token array; false with e filled. */
static bool read_ids(json_object *a, int vocab, const char *where, struct embed_input *in,
                     struct api_error *e)
{
    size_t n = json_object_array_length(a);
    if (n == 0) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                      "%s: an input must not be empty", where);
        return false;
    }
    if (!(in->ids = malloc(n * sizeof *in->ids))) {
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory",
                      "out of memory for the input");
        return false;
    }
    in->n = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(a, i);
        int64_t id = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || id < 0 || id >= vocab) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                          "%s[%zu]: a token id must be an integer in [0, %d)", where, i, vocab);
            return false;
        }
        in->ids[i] = (int32_t)id;
    }
    return true;
}

static bool read_text(const struct served_model *sm, const char *s, size_t len, const char *where,
                      struct embed_input *in, struct api_error *e)
{
    if (len == 0) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                      "%s: an input must not be empty", where);
        return false;
    }
    struct err err = {0};
    if (tok_encode(sm->tok, s, len, true, &in->ids, &in->n, &err) < 0) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL, "%s: %s", where, err.msg);
        return false;
    }
    if (in->n == 0) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                      "%s encodes to no tokens", where);
        return false;
    }
    return true;
}

/* input: a string, an array of strings, an array of token ids, or an array
 * of arrays of token ids. */
static bool read_inputs(const struct served_model *sm, json_object *input, struct embed_request *r,
                        struct api_error *e)
{
    int vocab = sm->model->config.vocab_size;
    if (!input) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL, "'input' is required");
        return false;
    }
    if (json_object_is_type(input, json_type_string)) {
        if (!(r->inputs = calloc(1, sizeof *r->inputs)))
            goto oom;
        r->n_inputs = 1;
        return read_text(sm, json_object_get_string(input),
                         (size_t)json_object_get_string_len(input), "input", &r->inputs[0], e);
    }
    if (!json_object_is_type(input, json_type_array)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                      "'input' must be a string, an array of strings, an array of token ids or "
                      "an array of token arrays");
        return false;
    }
    size_t n = json_object_array_length(input);
    json_object *first = n ? json_object_array_get_idx(input, 0) : NULL;
    if (json_object_is_type(first, json_type_int)) { /* one array of token ids: the context
                                                        bounds its length */
        if (!(r->inputs = calloc(1, sizeof *r->inputs)))
            goto oom;
        r->n_inputs = 1;
        return read_ids(input, vocab, "input", &r->inputs[0], e);
    }
    if (n == 0 || n > EMBED_MAX_INPUTS) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                      "'input' holds %zu items; 1 to %d are allowed", n, EMBED_MAX_INPUTS);
        return false;
    }
    if (!(r->inputs = calloc(n, sizeof *r->inputs)))
        goto oom;
    r->n_inputs = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_object *item = json_object_array_get_idx(input, i);
        char where[32];
        snprintf(where, sizeof where, "input[%zu]", i);
        bool ok;
        if (json_object_is_type(item, json_type_string))
            ok = read_text(sm, json_object_get_string(item),
                           (size_t)json_object_get_string_len(item), where, &r->inputs[i], e);
        else if (json_object_is_type(item, json_type_array))
            ok = read_ids(item, vocab, where, &r->inputs[i], e);
        else {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL,
                          "%s must be a string or an array of token ids", where);
            ok = false;
        }
        if (!ok)
            return false;
    }
    return true;
oom:
    api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "out of memory for the inputs");
    return false;
}

static bool parse_request(const struct served_model *sm, json_object *root, struct embed_request *r,
                          struct api_error *e)
{
    if (!json_object_is_type(root, json_type_object)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, NULL, NULL,
                      "the body must be a JSON object");
        return false;
    }
    json_object *v;
    if ((v = json_object_object_get(root, "encoding_format")) &&
        !json_object_is_type(v, json_type_null)) {
        const char *f = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
        if (strcmp(f, "float") && strcmp(f, "base64")) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "encoding_format", NULL,
                          "'encoding_format' must be \"float\" or \"base64\"");
            return false;
        }
        r->base64 = !strcmp(f, "base64");
    }
    int hidden = sm->model->config.hidden_size;
    if ((v = json_object_object_get(root, "dimensions")) &&
        !json_object_is_type(v, json_type_null)) {
        int64_t d = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || d < 1 || d > hidden) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "dimensions", NULL,
                          "'dimensions' must be an integer in [1, %d] (the model's hidden size)",
                          hidden);
            return false;
        }
        r->dimensions = (int)d;
    }
    if ((v = json_object_object_get(root, "model")) && !json_object_is_type(v, json_type_string) &&
        !json_object_is_type(v, json_type_null)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "model", NULL, "'model' must be a string");
        return false;
    }
    if ((v = json_object_object_get(root, "user")) && !json_object_is_type(v, json_type_string) &&
        !json_object_is_type(v, json_type_null)) {
        api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "user", NULL, "'user' must be a string");
        return false;
    }
    if (!read_inputs(sm, json_object_object_get(root, "input"), r, e))
        return false;
    int n_ctx = served_engine_config(sm)->n_ctx;
    for (int i = 0; i < r->n_inputs; i++)
        if (r->inputs[i].n > n_ctx) {
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", "context_length_exceeded",
                          "input[%d] is %d tokens but the context holds %d", i, r->inputs[i].n,
                          n_ctx);
            return false;
        }
    return true;
}

/* The first d of the hidden state, scaled to unit length (in double). */
static void normalise(const float *h, int d, float *out)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += (double)h[i] * h[i];
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int i = 0; i < d; i++)
        out[i] = (float)(h[i] * inv);
}

static void embedding_json(struct strbuf *out, const float *v, int d, bool b64)
{
    if (b64) {
        /* little-endian f32, as the OpenAI SDK decodes it */
        uint8_t *bytes = malloc((size_t)d * 4);
        char *text = malloc(BASE64_LEN((size_t)d * 4) + 1);
        if (!bytes || !text) {
            free(bytes);
            free(text);
            out->failed = true;
            return;
        }
        for (int i = 0; i < d; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int b = 0; b < 4; b++)
                bytes[i * 4 + b] = (uint8_t)(u >> (8 * b));
        }
        base64_encode(bytes, (size_t)d * 4, text);
        strbuf_printf(out, "\"%s\"", text);
        free(bytes);
        free(text);
        return;
    }
    strbuf_append(out, "[", 1);
    for (int i = 0; i < d; i++)
        strbuf_printf(out, "%s%.9g", i ? "," : "", (double)v[i]);
    strbuf_append(out, "]", 1);
}

/* Submits every input, then collects them in order; all are in the engine
 * at once, so they share its steps with each other and with generations. */
static bool run_inputs(struct http_exchange *x, const struct served_model *sm,
                       const struct embed_request *r, float *vectors, struct api_error *e)
{
    int hidden = sm->model->config.hidden_size;
    struct gen_output **outs = calloc((size_t)r->n_inputs, sizeof *outs);
    if (!outs) {
        api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "out of memory");
        return false;
    }
    bool ok = true;
    for (int i = 0; i < r->n_inputs && ok; i++) {
        struct gen_params p = {
            .prompt = r->inputs[i].ids,
            .n_prompt = r->inputs[i].n,
            .max_tokens = 1,
            .logprobs = -1,
            .cache_ns = api_cache_namespace(x->tenant_ns, NULL, 0),
            .embed = true,
            .sampling = {.temperature = 0, .top_p = 1, .repetition_penalty = 1},
        };
        struct err err = {0};
        int rc = served_engine_submit(sm, &p, NULL, NULL, &outs[i], &err);
        if (rc == -INFERD_EBUSY)
            api_error_set(e, 429, API_ERROR_RATE_LIMIT, NULL, "rate_limit_exceeded", "%s", err.msg);
        else if (rc == -INFERD_ERANGE)
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", "context_length_exceeded",
                          "input[%d]: %s", i, err.msg);
        else if (rc == -INFERD_ENOMEM)
            api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "%s", err.msg);
        else if (rc < 0)
            api_error_set(e, 400, API_ERROR_INVALID_REQUEST, "input", NULL, "%s", err.msg);
        ok = rc == 0;
    }
    for (int i = 0; i < r->n_inputs && ok; i++) {
        struct gen_output *o = outs[i];
        struct gen_cursor cur = {0};
        for (;;) {
            struct gen_news news = {0};
            if (gen_output_drain(o, &cur, EMBED_WAIT_MS, &news) < 0) {
                api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "out of memory");
                ok = false;
                break;
            }
            enum gen_finish f = news.finish;
            if (f == GEN_FINISH_ERROR)
                api_error_set(e, news.error_code == INFERD_ENOMEM ? 503 : 500, API_ERROR_UNSET,
                              NULL, NULL, "input[%d]: %s", i, news.error);
            gen_news_free(&news);
            if (f == GEN_FINISH_STOP) {
                pthread_mutex_lock(&o->mu);
                memcpy(vectors + (size_t)i * hidden, o->embedding, (size_t)hidden * sizeof(float));
                pthread_mutex_unlock(&o->mu);
                break;
            }
            if (f != GEN_RUNNING) {
                if (f != GEN_FINISH_ERROR)
                    api_error_set(e, 503, API_ERROR_UNAVAILABLE, NULL, NULL,
                                  "input[%d] was cancelled", i);
                ok = false;
                break;
            }
            if (http_client_gone(x->client_fd)) {
                api_error_set(e, 499, API_ERROR_UNSET, NULL, NULL, "the client went away");
                ok = false;
                break;
            }
        }
    }
    for (int i = 0; i < r->n_inputs; i++)
        if (outs[i]) {
            atomic_store(&outs[i]->cancel, true);
            gen_output_release(outs[i]);
        }
    free(outs);
    return ok;
}

void openai_embeddings(struct http_exchange *x)
{
    struct server *srv = x->srv;
    struct api_error e = {0};
    if (generation_admit(srv, &e) < 0) {
        http_send_error(x, &e);
        return;
    }
    json_object *root = NULL;
    struct embed_request r = {0};
    float *vectors = NULL;
    struct strbuf out = {0};
    struct err err = {0};
    struct served_model *sm = NULL;
    if (json_text_parse(x->body, x->body_len, EMBED_MAX_DEPTH, false, &root, &err) < 0) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL,
                         "the body is not valid JSON: %s", err.msg);
        return;
    }
    json_object *model_field = json_object_is_type(root, json_type_object)
                                   ? json_object_object_get(root, "model")
                                   : NULL;
    const char *model_id = json_object_is_type(model_field, json_type_string)
                               ? json_object_get_string(model_field)
                               : NULL;
    if (served_model_acquire(srv, model_id, &sm, &e) < 0)
        goto fail;
    const struct model_embedding *me = &sm->model->embedding;
    if (me->pooling == MODEL_POOLING_OTHER) {
        api_error_set(&e, 400, API_ERROR_INVALID_REQUEST, "model", "unsupported_pooling",
                      "this model pools its embeddings by '%s' (its modules.json); inferd "
                      "computes last-token pooling only",
                      me->mode);
        goto fail;
    }
    if (!parse_request(sm, root, &r, &e))
        goto fail;
    int hidden = sm->model->config.hidden_size, d = r.dimensions ? r.dimensions : hidden;
    if (!(vectors = malloc((size_t)r.n_inputs * hidden * sizeof(float)))) {
        api_error_set(&e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory", "out of memory");
        goto fail;
    }
    if (!run_inputs(x, sm, &r, vectors, &e))
        goto fail;
    long tokens = 0;
    strbuf_printf(&out, "{\"object\":\"list\",\"data\":[");
    float *unit = malloc((size_t)d * sizeof(float));
    if (!unit)
        out.failed = true;
    for (int i = 0; i < r.n_inputs && unit; i++) {
        /* truncated to dimensions first, then normalised: the shortened
         * vector is a unit vector too */
        normalise(vectors + (size_t)i * hidden, d, unit);
        strbuf_printf(&out, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":",
                       i ? "," : "", i);
        embedding_json(&out, unit, d, r.base64);
        strbuf_append(&out, "}", 1);
        tokens += r.inputs[i].n;
    }
    free(unit);
    json_object *model = json_object_new_string(sm->id);
    strbuf_printf(&out, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}",
                   json_object_to_json_string_ext(model, JSON_C_TO_STRING_PLAIN |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE),
                   tokens, tokens);
    json_object_put(model);
    if (out.failed) {
        api_error_set(&e, 503, API_ERROR_UNAVAILABLE, NULL, "out_of_memory",
                      "out of memory for the response");
        goto fail;
    }
    http_send_json(x, 200, out.data, out.len);
    strbuf_free(&out);
    free(vectors);
    embed_request_free(&r);
    json_object_put(root);
    served_model_release(srv, sm);
    return;
fail:
    strbuf_free(&out);
    free(vectors);
    embed_request_free(&r);
    json_object_put(root);
    if (sm)
        served_model_release(srv, sm);
    if (e.status != 499)
        http_send_error(x, &e);
}
