/* fuzz/fuzz_anthropic.c — libFuzzer target: Anthropic Messages request bodies (and the
 * count_tokens variant), with the message object and event stream rendered for what parses. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/anthropic.h"

/* Accepted requests must satisfy what later stages rely on; refused ones must carry a
 * complete error that renders in Anthropic's shape. */
static void check(int rc, const struct anthropic_request *a, const struct api_error *e,
                  enum anthropic_body kind)
{
    if (rc != 0) {
        if (e->status != 400 && e->status != 500)
            __builtin_trap();
        if (!memchr(e->message, '\0', sizeof e->message) || e->message[0] == '\0')
            __builtin_trap();
        struct strbuf b = {0};
        api_error_anthropic.render(e, &b);
        strbuf_free(&b);
        return;
    }
    const struct gen_request *r = &a->req;
    if (r->kind != GEN_REQUEST_CHAT || !r->messages ||
        !json_object_is_type(r->messages, json_type_array) ||
        json_object_array_length(r->messages) == 0)
        __builtin_trap();
    if (r->n_stop > GEN_REQUEST_MAX_STOP)
        __builtin_trap();
    if (kind == ANTHROPIC_MESSAGES && (!r->has_max_tokens || r->max_tokens < 1))
        __builtin_trap();
    if (r->think_budget < 0 || (r->think_budget > 0 && kind == ANTHROPIC_MESSAGES &&
                                r->think_budget >= r->max_tokens))
        __builtin_trap();
    if (r->tools && json_object_array_length(r->tools) > ANTHROPIC_MAX_TOOLS)
        __builtin_trap();
    if (r->has_tool_choice && r->tool_choice == GEN_TOOL_CHOICE_FUNCTION && !r->tool_choice_name)
        __builtin_trap();
    if (a->retain_messages && json_object_array_length(a->retain_messages) == 0)
        __builtin_trap();
}

/* A reply rendered from the parsed request's fields, whole and streamed. */
static void render(const struct anthropic_request *a)
{
    struct anthropic_stream s;
    memset(&s, 0, sizeof s);
    snprintf(s.reply.id, sizeof s.reply.id, "msg_fuzz");
    s.reply.model = a->req.model;
    for (size_t i = 0; i < a->req.n_stop; i++)
        s.reply.stop[i] = a->req.stop[i];
    s.reply.n_stop = a->req.n_stop;
    s.reply.cache_block_size = 16;
    struct generation_news n;
    memset(&n, 0, sizeof n);
    n.out.finish = GEN_FINISH_STOP;
    n.out.text = a->req.stop[0];
    n.out.text_len = a->req.stop[0] ? strlen(a->req.stop[0]) : 0;
    n.out.stop_string = (int)a->req.n_stop;
    n.out.n_prompt = (int)json_object_array_length(a->req.messages);
    struct generation_tool_delta d = {.index = 0, .name = a->req.model,
                                      .arguments = a->req.n_stop > 1 ? a->req.stop[1] : ""};
    if (a->req.model) {
        n.tools = &d;
        n.n_tools = 1;
    }
    struct strbuf out = {0};
    bool done = false;
    anthropic_message_json(&s.reply, &n, &out);
    anthropic_stream_news(&s, &n, &out, &done);
    if (!done)
        __builtin_trap();
    strbuf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const enum anthropic_body kinds[] = {ANTHROPIC_MESSAGES, ANTHROPIC_COUNT_TOKENS};
    for (size_t k = 0; k < 2; k++) {
        struct anthropic_request a;
        struct api_error e;
        int rc = anthropic_request_parse((const char *)data, size, kinds[k], &a, &e);
        check(rc, &a, &e, kinds[k]);
        if (rc == 0)
            render(&a);
        anthropic_request_free(&a);
    }
    return 0;
}
