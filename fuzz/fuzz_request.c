/* fuzz/fuzz_request.c — libFuzzer target: OpenAI chat and completion request bodies. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"

/* Accepted requests must satisfy what later stages rely on; refused ones
 * must carry a complete error object. */
static void check(int rc, const struct gen_request *r, const struct api_error *e)
{
    if (rc != 0) {
        if (e->status != 400 && e->status != 500)
            __builtin_trap();
        if (!memchr(e->message, '\0', sizeof e->message) || e->message[0] == '\0')
            __builtin_trap();
        char *json = NULL;
        if (api_error_to_json(e, &json) == 0)
            free(json);
        return;
    }
    if (r->kind == GEN_REQUEST_CHAT && !r->messages)
        __builtin_trap();
    if (r->kind == GEN_REQUEST_COMPLETION && r->prompt_kind == GEN_PROMPT_NONE)
        __builtin_trap();
    if (r->n_stop > GEN_REQUEST_MAX_STOP || (r->has_max_tokens && r->max_tokens < 1))
        __builtin_trap();
    if (r->has_top_logprobs && !r->logprobs)
        __builtin_trap();
    for (size_t i = 0; i < r->n_prompt_tokens; i++)
        if (r->prompt_tokens[i] < 0)
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gen_request r;
    struct api_error e;
    int rc = gen_request_parse((const char *)data, size, GEN_REQUEST_CHAT, &r, &e);
    check(rc, &r, &e);
    gen_request_free(&r);
    rc = gen_request_parse((const char *)data, size, GEN_REQUEST_COMPLETION, &r, &e);
    check(rc, &r, &e);
    gen_request_free(&r);
    return 0;
}
