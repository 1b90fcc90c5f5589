/* fuzz/fuzz_safetensors.c — libFuzzer target: st_header_parse on arbitrary file images. */
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct st_header h;
    struct err err = {0};
    if (st_header_parse(data, size, &h, &err) == 0) {
        /* Every accepted tensor must lie inside the data section. */
        uint64_t data_len = size - 8 - h.header_len;
        for (int i = 0; i < h.n_tensors; i++)
            if (h.tensors[i].offset + h.tensors[i].nbytes > data_len)
                __builtin_trap();
        st_header_free(&h);
    }
    return 0;
}
