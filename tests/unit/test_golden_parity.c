/* tests/unit/test_golden_parity.c — logits equal the Hugging Face reference (tests/goldens) for every tiny model:
 * one-shot prefill, prefill then token-by-token decode through the paged KV,
 * and several sequences of different lengths in one batch; exact and fast modes. */
#include <criterion/criterion.h>

#include "golden_support.h"

static int cpu_backend(enum compute_mode mode, struct backend **out, struct err *err)
{
    return backend_cpu_create(2, mode, out, err);
}

Test(golden_parity, exact_mode_matches_transformers_for_prefill_decode_and_batches, .timeout = 600)
{
    golden_check_all("cpu", cpu_backend, COMPUTE_EXACT, &GOLDEN_EXACT);
}

Test(golden_parity, fast_mode_stays_within_bf16_tolerance, .timeout = 600)
{
    golden_check_all("cpu", cpu_backend, COMPUTE_FAST, &GOLDEN_FAST);
}
