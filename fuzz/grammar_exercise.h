/* fuzz/grammar_exercise.h — what the grammar fuzz targets do with a grammar that compiled: walk it
 * with a small vocabulary, checking every mask against accepting each token. */
#ifndef INFERD_FUZZ_GRAMMAR_EXERCISE_H
#define INFERD_FUZZ_GRAMMAR_EXERCISE_H

#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

/* Compile limit for fuzzing: small enough that no input takes long, large enough for real shapes. */
#define FUZZ_MAX_STATES 4096

static void grammar_exercise(struct grammar *g, const uint8_t *data, size_t size)
{
    static const char *const words[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "0", "1", "-",
                                        ".", "e", "a", "z", "\\", "null", "true", "false", "{\"",
                                        "\":", "\",", "\xC3", "\xA9", "\xC3\xA9", "x\"}", "ab"};
    enum { NW = sizeof words / sizeof words[0] };
    size_t lens[NW];
    for (int i = 0; i < NW; i++)
        lens[i] = strlen(words[i]);
    struct grammar_vocab *v = NULL;
    struct grammar_matcher *m = NULL;
    struct err e = {0};
    if (grammar_vocab_from_bytes(words, lens, NW, NULL, &v, &e) ||
        grammar_matcher_create(g, v, &m, &e)) {
        grammar_vocab_free(v);
        return;
    }
    uint32_t bits[(NW + 31) / 32];
    char forced[32];
    for (size_t step = 0; step < 24; step++) {
        bool eos;
        if (grammar_matcher_fill_mask(m, bits, &eos))
            break;
        if (eos != grammar_matcher_is_accepting(m))
            __builtin_trap();
        int allowed[NW], na = 0;
        for (int t = 0; t < NW; t++) {
            bool bit = bits[t >> 5] >> (t & 31) & 1;
            int rc = grammar_matcher_accept_token(m, t);
            bool ok = rc == 0;
            if (ok && grammar_matcher_rollback(m, 1))
                __builtin_trap();
            /* a position past the ambiguity limit is refused as such, never silently */
            if (rc == -INFERD_ERANGE)
                continue;
            if (bit != ok)
                __builtin_trap();
            if (ok)
                allowed[na++] = t;
        }
        size_t nf = grammar_matcher_forced_bytes(m, forced, sizeof forced);
        if (nf && eos) /* forced bytes exist only where the grammar cannot end */
            __builtin_trap();
        if (!na)
            break;
        int t = allowed[(size > step ? data[step] : step) % (size_t)na];
        if (grammar_matcher_accept_token(m, t))
            __builtin_trap();
    }
    grammar_matcher_free(m);
    grammar_vocab_free(v);
}

#endif
