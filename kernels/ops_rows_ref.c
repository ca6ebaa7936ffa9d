/* SCATTER_ROWS for both CPU backends: dst row ids[i] = src0 row i. A row copy has nothing
 * to vectorise beyond memcpy, so cpu_ref and cpu share this one kernel. */
#include <string.h>

#include "ops_impl.h"

rk_status rk_ref_scatter_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be, (void)err;
    const int64_t n = rk_view_rows(&a->src0), d = a->src0.ne[0];
    for (int64_t i = 0; i < n; i++)
        memcpy(rk_row_f32(&a->dst, a->ids[i]), rk_row_f32(&a->src0, i), (size_t)d * sizeof(float));
    return RK_OK;
}
