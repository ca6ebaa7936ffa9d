/* The op-case table of test_ops.c for another backend's suite (test_cuda.c):
 * test_ops.c compiled with RK_OPS_TABLE_ONLY and RK_OPS_TWIN exports its
 * cases, fixtures and comparison through these functions, so every backend
 * runs the one table against its cpu_ref twin. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "rk_kernels.h"

typedef struct op_twin_info {
    const char *name;
    rk_op op;
    uint32_t type; /* weight (GET_ROWS, MATMUL), caches (ATTN), dst (CPY_ROWS) */
    int64_t n;     /* rows (MATMUL: activation rows) */
    double nmse;   /* the table's bound */
} op_twin_info;

/* Runs the op of a fixture: rk_backend_run on host views when NULL, else the
 * caller's way (e.g. views moved to device memory and the results copied back
 * into the fixture's host buffers before it returns). */
typedef rk_status (*op_twin_runner)(rk_backend *be, const rk_op_args *host_args, bool weight_src0, void *ud,
                                    rk_err *err);

int op_twin_count(void);
op_twin_info op_twin_case(int i);
/* Case i on be from a fresh fixture (the same seed for every backend): the
 * buffer the op writes, as doubles (f16 and q8_0 decoded); *n_out entries. */
double *op_twin_run(int i, rk_backend *be, op_twin_runner run, void *ud, size_t *n_out);
/* test_ops.c's comparison (padding, NaN/Inf parity, NMSE <= nmse, NaN reach). */
void op_twin_compare(int i, const char *be_name, double nmse, const double *got, const double *want, size_t n);
