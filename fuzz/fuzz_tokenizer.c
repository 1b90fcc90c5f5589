/* fuzz/fuzz_tokenizer.c — libFuzzer target: tokenizer.json loading, then encode/decode/stream of a text on whatever loaded. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

/* Input: tokenizer.json bytes, a NUL byte, then the text to encode (no NUL: all of it is JSON
 * and the text is empty). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t text_len = nul ? size - json_len - 1 : 0;
    struct tokenizer *tok = NULL;
    struct err err = {0};
    if (tok_load_json((const char *)data, json_len, NULL, 0, &tok, &err) != 0) {
        if (tok)
            __builtin_trap();
        return 0;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(tok, text, text_len, true, &ids, &n, &err) == 0) {
        char *out = NULL;
        size_t len = 0;
        if (tok_decode(tok, ids, n, false, &out, &len, &err) == 0 && strlen(out) != len &&
            !memchr(out, 0, len))
            __builtin_trap();
        free(out);
        struct detok *d = NULL;
        if (detok_create(tok, true, &d, &err) == 0) {
            const char *t;
            size_t tl;
            for (int i = 0; i < n; i++)
                if (detok_push(d, ids[i], &t, &tl, &err) != 0)
                    break;
            detok_flush(d, &t, &tl, &err);
            detok_free(d);
        }
        free(ids);
    }
    /* Arbitrary ids too, including ones outside the vocab. */
    int32_t junk[4] = {-1, 0, tok_vocab_size(tok), (int32_t)(text_len * 7919u)};
    char *out = NULL;
    if (tok_decode(tok, junk, 4, false, &out, NULL, &err) == 0)
        free(out);
    tok_free(tok);
    return 0;
}
