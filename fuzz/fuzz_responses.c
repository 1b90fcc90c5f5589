/* fuzz/fuzz_responses.c — libFuzzer target: OpenAI Responses request bodies, joined into a
 * conversation, answered by a writer, and its stored context read back by the next turn. */
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"

static void check_error(const struct api_error *e)
{
    if (e->status != 400 && e->status != 404 && e->status != 500)
        __builtin_trap();
    if (!memchr(e->message, '\0', sizeof e->message) || e->message[0] == '\0')
        __builtin_trap();
    char *json = NULL;
    if (api_error_to_json(e, &json) == 0)
        free(json);
}

/* A finished answer for r; its stored context must be what a next turn can join. */
static void answer(struct responses_request *r)
{
    struct responses_writer_config cfg = {.id = "resp_fuzz", .model = "m", .created_at = 1,
                                          .temperature = 1, .top_p = 1};
    struct responses_writer *w = NULL;
    if (responses_writer_create(r, &cfg, &w) < 0)
        return;
    struct generation_news n;
    memset(&n, 0, sizeof n);
    n.split = true;
    n.text.reasoning = (char *)"why";
    n.text.reasoning_len = 3;
    n.text.content = (char *)"answer";
    n.text.content_len = 6;
    struct generation_tool_delta call = {.index = 0, .id = "call_f", .name = "f",
                                         .arguments = "{}"};
    n.tools = &call;
    n.n_tools = 1;
    n.out.finish = GEN_FINISH_STOP;
    responses_writer_feed(w, &n, NULL);
    if (!responses_writer_succeeded(w))
        __builtin_trap();
    json_object *resp = responses_writer_response(w);
    if (!resp || !json_object_to_json_string(resp))
        __builtin_trap();
    json_object_put(resp);
    size_t len = 0;
    char *ctx = responses_writer_context(w, r, &len);
    responses_writer_free(w);
    if (!ctx)
        return;
    static const char next_body[] =
        "{\"previous_response_id\":\"resp_fuzz\",\"input\":[{\"type\":\"function_call_output\","
        "\"call_id\":\"call_f\",\"output\":\"ok\"}]}";
    struct responses_request next;
    struct api_error e;
    if (responses_parse(next_body, sizeof next_body - 1, &next, &e) != 0)
        __builtin_trap();
    /* The answer's call is in the context, so its output joins. */
    if (responses_join(&next, ctx, len, &e) != 0 && e.status != 500)
        __builtin_trap();
    responses_request_free(&next);
    free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct responses_request r;
    struct api_error e;
    int rc = responses_parse((const char *)data, size, &r, &e);
    if (rc != 0) {
        check_error(&e);
        return 0;
    }
    if (!r.input || !r.echo || (r.gen.has_max_tokens && r.gen.max_tokens < 1))
        __builtin_trap();
    static const char prev[] =
        "{\"instructions\":\"I\",\"messages\":[{\"role\":\"user\",\"content\":\"u\"}]}";
    rc = responses_join(&r, r.previous_response_id ? prev : NULL,
                        r.previous_response_id ? sizeof prev - 1 : 0, &e);
    if (rc != 0)
        check_error(&e);
    else if (!r.gen.messages || json_object_array_length(r.gen.messages) == 0)
        __builtin_trap();
    else
        answer(&r);
    responses_request_free(&r);
    return 0;
}
