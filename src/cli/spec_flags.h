/* cli/spec_flags.h — the speculative decoding flags every generating command takes, and the
 * draft model they name loaded beside the target (same backend, tokenizer checked). */
#ifndef INFERD_CLI_SPEC_FLAGS_H
#define INFERD_CLI_SPEC_FLAGS_H

#include <stdbool.h>

#include "engine/speculate.h"

struct tokenizer;

struct cli_spec_options {
    const char *draft_dir;  /* --draft-model DIR, or NULL */
    const char *kind;       /* --draft-kind two-model|ngram, or NULL (two-model with a draft) */
    long num_draft_tokens;  /* --num-draft-tokens; 0: the kind's default */
    long ngram_max, ngram_min; /* 0: defaults */
    long max_batch;         /* --spec-max-batch; 0: SPEC_MAX_BATCH_DEFAULT */
    long draft_vocab;       /* --draft-vocab N; 0: auto (the default); all: 1 << 30 */
    bool draft_vocab_set;   /* --draft-vocab was given */
};

#define CLI_SPEC_USAGE                                                                           \
    "Speculative decoding: --draft-model DIR (a smaller model with the same tokenizer;\n"       \
    "--draft-kind two-model, the default with it) or --draft-kind ngram (prompt lookup: the\n"  \
    "continuation of the latest earlier match of the last --ngram-max 3 .. --ngram-min 1\n"      \
    "tokens; takes no --draft-model); --num-draft-tokens K (default 3, ngram 10) is the most\n"  \
    "drafts one step verifies (fewer while few are accepted); --spec-max-batch N (default 4):\n" \
    "steps where more sequences decode than N run without drafts; --draft-vocab auto|all|N:\n"  \
    "the draft proposes only token ids below N (its LM head's first rows); auto (the default)\n" \
    "reads the rows that held 97% of its picks when every 16th forward read them all. The\n"    \
    "output is the model's own.\n"

/* 1 when flag a (value v) is one of the speculative flags and was taken, 0 when it is not one,
 * -1 after printing why its value is bad. */
int cli_spec_flag(const char *a, const char *v, struct cli_spec_options *o);

/* The configuration the options ask for over target (on its backend): none, ngram, or the
 * draft model loaded into *draft (owned by the caller; NULL otherwise), its tokenizer checked
 * against tok (when given). Returns 0 or a negative error with err filled. */
int cli_spec_load(const struct cli_spec_options *o, const struct model *target,
                  const struct tokenizer *tok, struct model **draft, struct spec_config *out,
                  struct err *err);

#endif
