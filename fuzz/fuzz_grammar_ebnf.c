/* fuzz/fuzz_grammar_ebnf.c — libFuzzer target: the GBNF parser and compiler on arbitrary text, then a walk
 * through whatever compiled (masks checked against accepting each token). */
#include <stddef.h>
#include <stdint.h>

#include "grammar_exercise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct grammar_options o = {.max_states = FUZZ_MAX_STATES};
    struct grammar *g = NULL;
    struct err err = {0};
    int rc = grammar_compile_ebnf((const char *)data, size, &o, &g, &err);
    if (rc > 0 || (rc && (err.msg[0] == '\0' || g)))
        __builtin_trap();
    if (!rc) {
        grammar_exercise(g, data, size);
        grammar_free(g);
    }
    return 0;
}
