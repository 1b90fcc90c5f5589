/* cli/bench_adapters.h — `inferd bench --adapters 0,1,4,16`: decode speed of a batch of sequences spread over that many distinct LoRA adapters. */
#ifndef INFERD_CLI_BENCH_ADAPTERS_H
#define INFERD_CLI_BENCH_ADAPTERS_H

#include "base/err.h"
#include "model/model.h"

#define BENCH_ADAPTER_MAX_COUNTS 8

struct bench_adapter_options {
    int counts[BENCH_ADAPTER_MAX_COUNTS]; /* distinct adapters per run; 0: the base model */
    int n_counts;
    int rank;       /* every adapter's r (alpha = 2 r), every projection targeted */
    int batch;      /* sequences decoding together; sequence i takes adapter i mod count */
    int prompt_len, gen_len, reps;
};

/* Parses "0,1,4,16" into o->counts; false (message printed) when it is not such a list. */
bool bench_adapter_counts_parse(const char *v, struct bench_adapter_options *o);

/* Writes the random adapters (mkmodel --lora-for) for m, loaded from model_dir, into a
 * temporary directory, then runs every count once per repetition, alternating, and prints
 * each count's median decode tok/s against the base model's (count 0). */
int bench_adapters_run(const struct model *m, const char *model_dir,
                       const struct bench_adapter_options *o, struct err *err);

#endif
