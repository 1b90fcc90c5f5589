/* tests/unit/test_golden_parity.c — logits equal the Hugging Face reference (tests/goldens) for every tiny model:
 * one-shot prefill, prefill then token-by-token decode through the paged KV,
 * and several sequences of different lengths in one batch; exact and fast modes.
 * INFERD_CPU=avx2|avx512|avx512bf16|amx caps the kernels used, as for the CLI,
 * so bench/cpu-isa-check.sh can check every level a machine has. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "golden_support.h"

static int cpu_backend(enum compute_mode mode, struct backend **out, struct err *err)
{
    struct backend_options opt = {.mode = mode, .threads = 2};
    const char *isa = getenv("INFERD_CPU");
    if (isa && *isa && !cpu_isa_parse(isa, &opt.cpu_isa))
        opt.cpu_isa = CPU_ISA_BEST;
    return backend_cpu_create(&opt, out, err);
}

Test(golden_parity, exact_mode_matches_transformers_for_prefill_decode_and_batches, .timeout = 600)
{
    golden_check_all("cpu", cpu_backend, COMPUTE_EXACT, &GOLDEN_EXACT);
}

Test(golden_parity, fast_mode_stays_within_bf16_tolerance, .timeout = 600)
{
    golden_check_all("cpu", cpu_backend, COMPUTE_FAST, &GOLDEN_FAST);
}
