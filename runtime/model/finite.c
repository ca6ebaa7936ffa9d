/* The finite-value check of tensors read from files (model vectors, ridge maps, LowRAM
 * predictors): one NaN or Inf there turns every later activation it touches into NaN. */
#include <math.h>
#include <stdlib.h>

#include "model_impl.h"

rk_status rk_tensor_check_finite(const rk_gguf_tensor *t, const char *file, rk_err *err) {
    const rk_quant_fns *q = rk_quant_ref(t->type);
    uint64_t row_bytes = 0;
    const int64_t n0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (!q || n0 < 1 || !rk_dtype_row_bytes(t->type, (uint64_t)n0, &row_bytes) ||
        (uint64_t)rows > t->n_bytes / (row_bytes ? row_bytes : 1))
        return rk_err_set(err, RK_E_UNSUPPORTED, "%s: tensor '%.*s' has type %s, which cannot be read as numbers", file,
                          (int)(t->name.len > 96 ? 96 : t->name.len), t->name.ptr, rk_dtype_name(t->type));
    float *row = malloc((size_t)n0 * sizeof *row);
    if (!row) return rk_err_set(err, RK_E_NOMEM, "%s: out of memory checking tensor values", file);
    const unsigned char *p = t->data;
    for (int64_t r = 0; r < rows; r++) {
        q->to_f32(p + (size_t)r * row_bytes, row, n0);
        for (int64_t i = 0; i < n0; i++) {
            if (isfinite(row[i])) continue;
            const float v = row[i];
            free(row);
            return rk_err_set(err, RK_E_FORMAT,
                              "%s: tensor '%.*s' holds a non-finite value (%s at row %lld, column %lld)", file,
                              (int)(t->name.len > 96 ? 96 : t->name.len), t->name.ptr,
                              isnan(v) ? "NaN"
                              : v > 0  ? "+Inf"
                                       : "-Inf",
                              (long long)r, (long long)i);
        }
    }
    free(row);
    return RK_OK;
}
