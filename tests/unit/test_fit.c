/* tests/unit/test_fit.c — the memory budget's arithmetic: the largest safe context beside the
 * weights and transient buffers. */
#include <criterion/criterion.h>

#include "api/fit.h"

Test(fit, the_safe_context_is_the_kv_positions_left_beside_weights_and_buffers)
{
    cr_assert_eq(fit_max_context(1000 + 200 + 100 * 8, 1000, 200, 8), 100);
    cr_assert_eq(fit_max_context(1000 + 200 + 100 * 8 + 7, 1000, 200, 8), 100, "rounds down");
}

Test(fit, a_budget_below_weights_and_buffers_leaves_no_context)
{
    cr_assert_eq(fit_max_context(999, 1000, 0, 8), 0);
    cr_assert_eq(fit_max_context(1100, 1000, 200, 8), 0);
    cr_assert_eq(fit_max_context(1200, 1000, 200, 8), 0);
}

Test(fit, huge_numbers_do_not_wrap)
{
    cr_assert_eq(fit_max_context(UINT64_MAX, UINT64_MAX - 1, 2, 1), 0);
    cr_assert_eq(fit_max_context(UINT64_MAX, 0, 0, 0), 0, "no KV per position: nothing to size");
}
