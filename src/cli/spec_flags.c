/* cli/spec_flags.c — parsing the speculative decoding flags and loading the draft model. */
#include "cli/spec_flags.h"

#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "text/tokenizer.h"

int cli_spec_flag(const char *a, const char *v, struct cli_spec_options *o)
{
    if (!strcmp(a, "--draft-model")) {
        o->draft_dir = v;
        return 1;
    }
    if (!strcmp(a, "--draft-kind")) {
        if (strcmp(v, "two-model") && strcmp(v, "ngram")) {
            fprintf(stderr, "inferd: --draft-kind: '%s' is neither 'two-model' nor 'ngram'\n", v);
            return -1;
        }
        o->kind = v;
        return 1;
    }
    if (!strcmp(a, "--num-draft-tokens"))
        return arg_int(a, v, 1, SPEC_MAX_DRAFTS, &o->num_draft_tokens) ? 1 : -1;
    if (!strcmp(a, "--ngram-max"))
        return arg_int(a, v, 1, 64, &o->ngram_max) ? 1 : -1;
    if (!strcmp(a, "--ngram-min"))
        return arg_int(a, v, 1, 64, &o->ngram_min) ? 1 : -1;
    if (!strcmp(a, "--spec-max-batch"))
        return arg_int(a, v, 1, 1 << 16, &o->max_batch) ? 1 : -1;
    if (!strcmp(a, "--draft-vocab")) {
        o->draft_vocab_set = true;
        if (!strcmp(v, "auto")) {
            o->draft_vocab = 0;
            return 1;
        }
        if (!strcmp(v, "all")) {
            o->draft_vocab = 1 << 30; /* clamped to the draft's vocabulary */
            return 1;
        }
        return arg_int(a, v, 1, 1 << 30, &o->draft_vocab) ? 1 : -1;
    }
    return 0;
}

int cli_spec_load(const struct cli_spec_options *o, const struct model *target,
                  const struct tokenizer *tok, struct model **draft, struct spec_config *out,
                  struct err *err)
{
    *draft = NULL;
    *out = (struct spec_config){.kind = SPEC_NONE};
    bool ngram = o->kind && !strcmp(o->kind, "ngram");
    if (o->draft_vocab_set && !o->draft_dir)
        return err_set(err, INFERD_EINVAL, "--draft-vocab limits a draft model's proposals and "
                       "needs a --draft-model");
    if (!o->draft_dir && !o->kind)
        return 0;
    out->kind = ngram ? SPEC_NGRAM : SPEC_TWO_MODEL;
    out->num_draft_tokens = (int)o->num_draft_tokens;
    out->ngram_max = (int)o->ngram_max;
    out->ngram_min = (int)o->ngram_min;
    out->max_batch = o->max_batch ? (int)o->max_batch : SPEC_MAX_BATCH_DEFAULT;
    out->draft_vocab = (int)o->draft_vocab;
    if (ngram && o->draft_dir)
        return err_set(err, INFERD_EINVAL,
                       "--draft-kind ngram drafts from the prompt and takes no --draft-model");
    if (!ngram && !o->draft_dir)
        return err_set(err, INFERD_EINVAL, "--draft-kind two-model needs a --draft-model DIR");
    int rc = 0;
    if (o->draft_dir) {
        struct tokenizer *dtok = NULL;
        if ((rc = model_load(o->draft_dir, target->backend, draft, err)) < 0)
            return rc;
        if (tok && (rc = tok_load(o->draft_dir, &dtok, err)) == 0)
            rc = spec_check_tokenizers(tok, dtok, err);
        tok_free(dtok);
        out->draft = *draft;
    }
    if (rc == 0)
        rc = spec_config_check(out, target, err);
    if (rc < 0) {
        model_free(*draft);
        *draft = NULL;
    }
    return rc;
}
