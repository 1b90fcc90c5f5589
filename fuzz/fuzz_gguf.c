/* fuzz/fuzz_gguf.c — libFuzzer target: gguf_parse on arbitrary file images, then the model and tokenizer mappings over what it accepts. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/gguf.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file f;
    struct err err = {0};
    if (gguf_parse(data, size, &f, &err) != 0)
        return 0;
    /* Every accepted tensor lies inside the data section; every string array element inside the image. */
    for (int i = 0; i < f.n_tensors; i++)
        if (f.tensors[i].data < data || f.tensors[i].data + f.tensors[i].nbytes > data + size)
            __builtin_trap();
    for (int i = 0; i < f.n_kvs; i++) {
        const struct gguf_kv *kv = &f.kvs[i];
        if (kv->type == GGUF_ARRAY && kv->elem_type == GGUF_STRING)
            for (uint64_t k = 0; k < kv->n; k++) {
                const char *s;
                size_t len;
                gguf_array_str(kv, k, &s, &len);
                if ((const uint8_t *)s < data || (const uint8_t *)s + len > data + size)
                    __builtin_trap();
            }
        else if (kv->type == GGUF_ARRAY)
            for (uint64_t k = 0; k < kv->n && k < 64; k++)
                (void)gguf_array_num(kv, k);
    }
    struct model_config cfg;
    struct generation_defaults gen;
    if (gguf_model_config(&f, &cfg, &gen, &err) == 0) {
        float *factors = NULL;
        if (gguf_rope_freqs(&f, cfg.head_dim, &factors, &err) == 0)
            free(factors);
    }
    struct tokenizer *tok;
    if (gguf_tokenizer_build(&f, &tok, &err) == 0) {
        int32_t *ids;
        int n;
        if (tok_encode(tok, "ab <|e|>", 8, true, &ids, &n, &err) == 0)
            free(ids);
        tok_free(tok);
    }
    gguf_close(&f);
    return 0;
}
