/* fuzz/fuzz_toolcall.c — libFuzzer target: the tool-call parsers of every syntax fed arbitrary bytes in arbitrary chunks. */
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/toolcall.h"

/* Typed parameters for the Qwen3-Coder form. */
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{"
    "\"n\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"},\"b\":{\"type\":\"boolean\"},"
    "\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},\"m\":{\"type\":[\"integer\",\"null\"]},"
    "\"s\":{\"type\":\"string\"}}}}}]";

/* What a run gave: text outside calls, and each call as name NUL arguments NUL. */
struct result {
    struct strbuf text, calls;
    int n_calls;
};

static void take(struct result *r, const struct toolcall_events *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        const struct toolcall_event *e = &ev->events[i];
        if (e->kind == TOOLCALL_TEXT) {
            strbuf_append(&r->text, e->text, e->len);
        } else if (e->kind == TOOLCALL_CALL_START) {
            if (e->index != r->n_calls++ || e->len == 0 || strlen(e->text) != e->len)
                __builtin_trap();
            strbuf_append(&r->calls, e->text, e->len + 1);
        } else if (e->kind == TOOLCALL_ARGUMENTS) {
            if (e->index != r->n_calls - 1)
                __builtin_trap();
            strbuf_append(&r->calls, e->text, e->len);
        } else {
            /* A call's arguments end here: they must be one JSON object. */
            strbuf_putc(&r->calls, '\0');
            const char *end = r->calls.data + r->calls.len - 1, *args = end;
            while (args > r->calls.data && args[-1] != '\0')
                args--;
            json_tokener *tk = json_tokener_new();
            json_tokener_set_flags(tk, JSON_TOKENER_STRICT);
            json_object *o = json_tokener_parse_ex(tk, args, (int)(end - args));
            if (!o || !json_object_is_type(o, json_type_object) ||
                tk->char_offset != (int)(end - args))
                __builtin_trap();
            json_object_put(o);
            json_tokener_free(tk);
        }
    }
}

/* data fed in chunks whose sizes come from seed; 0 for one piece. */
static void run(enum toolcall_syntax syntax, json_object *tools, const char *data, size_t size,
                uint32_t seed, struct result *r)
{
    struct toolcall_parser *p;
    struct toolcall_events ev;
    struct err err = {0};
    memset(r, 0, sizeof *r);
    if (toolcall_parser_create(syntax, tools, &p, &err) < 0)
        return;
    size_t at = 0;
    while (at < size) {
        size_t n = seed ? 1 + (seed % 7) : size - at;
        seed = seed * 1103515245u + 12345u;
        if (n > size - at)
            n = size - at;
        if (toolcall_parser_push(p, data + at, n, &ev, &err) < 0)
            __builtin_trap();
        take(r, &ev);
        at += n;
    }
    if (toolcall_parser_finish(p, &ev, &err) < 0)
        __builtin_trap();
    take(r, &ev);
    if (toolcall_parser_calls(p) != r->n_calls)
        __builtin_trap();
    toolcall_parser_free(p);
}

static bool same(const struct strbuf *a, const struct strbuf *b)
{
    return a->len == b->len && (a->len == 0 || !memcmp(a->data, b->data, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t seed = 1u + data[0];
    const char *text = (const char *)data + 1;
    size--;
    json_object *tools = json_tokener_parse(TOOLS);
    static const enum toolcall_syntax all[] = {TOOLCALL_HERMES, TOOLCALL_QWEN3_CODER,
                                               TOOLCALL_LLAMA_JSON, TOOLCALL_MISTRAL};
    for (size_t s = 0; s < sizeof all / sizeof all[0]; s++) {
        struct result whole, cut;
        run(all[s], tools, text, size, 0, &whole);
        run(all[s], tools, text, size, seed, &cut);
        /* However the text is split, the same content and calls. */
        if (whole.n_calls != cut.n_calls || !same(&whole.text, &cut.text) ||
            !same(&whole.calls, &cut.calls))
            __builtin_trap();
        strbuf_free(&whole.text);
        strbuf_free(&whole.calls);
        strbuf_free(&cut.text);
        strbuf_free(&cut.calls);
    }
    json_object_put(tools);
    /* The near-JSON reader alone: what it takes serialises to strict JSON. */
    json_object *v = NULL;
    struct err err = {0};
    if (toolcall_json_repair(text, size, &v, &err) == 0 && v) {
        const char *s = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
        json_tokener *tk = json_tokener_new();
        json_tokener_set_flags(tk, JSON_TOKENER_STRICT);
        /* The NUL counted in, so a bare number ends there. */
        json_object *back = json_tokener_parse_ex(tk, s, (int)strlen(s) + 1);
        if (!back)
            __builtin_trap();
        json_object_put(back);
        json_tokener_free(tk);
    }
    json_object_put(v);
    return 0;
}
