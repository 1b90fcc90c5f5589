/* tests/unit/test_golden_parity.c — logits equal the Hugging Face reference (tests/goldens) for every tiny model:
 * one-shot prefill, prefill then token-by-token decode through the paged KV,
 * and several sequences of different lengths in one batch; exact and fast modes.
 * INFERD_CPU=avx2|avx512|avx512bf16|amx caps the kernels used, as for the CLI,
 * so bench/cpu-isa-check.sh can check every level a machine has. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "golden_support.h"
#include "tools/mkmodel.h"

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

/* Every tiny preset has its golden. Goldens are made on a machine with
 * transformers; a preset whose file has not been made yet is named, with the
 * command that makes it, and the test skips (the parity tests above check
 * whatever goldens exist). */
Test(golden_parity, every_tiny_preset_has_a_golden)
{
    int n;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    char missing[1024] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].real)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.json", golden_dir(), p[i].name);
        if (access(path, R_OK) == 0) {
            struct golden g;
            cr_assert_eq(golden_load(path, &g), 0, "cannot read %s", path);
            cr_expect_str_eq(g.name, p[i].name, "%s holds another model's golden", path);
            golden_free(&g);
            continue;
        }
        if (used < sizeof missing)
            used += (size_t)snprintf(missing + used, sizeof missing - used, " %s", p[i].name);
    }
    if (used)
        cr_skip_test("no golden yet for%s: on a machine with torch and transformers run "
                     "'python3 tools/make_goldens.py --presets%s --out tests/goldens'",
                     missing, missing);
}
