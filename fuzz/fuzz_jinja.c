/* fuzz/fuzz_jinja.c — libFuzzer target: Jinja template parsing and rendering on arbitrary bytes with a fixed chat context. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "text/jinja/jinja.h"

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9 <think>x</think>\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"n\": 7, \"x\": 0.25}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct jinja_template *t = NULL;
    struct err err = {0};
    if (jinja_parse((const char *)data, size, &t, &err) != 0) {
        if (t != NULL || err.code == 0 || err.msg[0] == 0)
            __builtin_trap(); /* a failed parse must leave nothing behind and say why */
        return 0;
    }
    struct json_object *ctx = json_tokener_parse(CONTEXT);
    struct jinja_limits lim;
    jinja_limits_default(&lim);
    lim.max_steps = 20000;
    lim.max_output_bytes = 1 << 16;
    lim.max_depth = 32;
    char *out = NULL;
    size_t len = 0;
    int rc = jinja_render(t, ctx, &lim, &out, &len, &err);
    if (rc == 0) {
        if (!out || len > lim.max_output_bytes || out[len] != 0)
            __builtin_trap();
        free(out);
    } else if (out != NULL || err.code == 0) {
        __builtin_trap();
    }
    json_object_put(ctx);
    jinja_free(t);
    return 0;
}
