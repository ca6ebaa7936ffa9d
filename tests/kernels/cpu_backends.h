/* The CPU backends the kernel suites compare, by number: 0 cpu_ref, 1 cpu x1,
 * 2 cpu x2, 3 cpu portable x2 (no AVX2 kernels, the ref row functions). */
#pragma once
#include <criterion/criterion.h>

#include "rk_kernels.h"

static inline rk_backend *cpu_backend(int which) {
    rk_backend *be = NULL;
    rk_err err = {0};
    rk_status st = which == 0   ? rk_backend_cpu_ref_create(&be, &err)
                   : which == 3 ? rk_backend_cpu_portable_create(2, &be, &err)
                                : rk_backend_cpu_create(which, &be, &err);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    return be;
}
