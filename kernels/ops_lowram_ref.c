/* cpu_ref LR_KEYS: LowRAM's key rebuild, scalar, double accumulation (the oracle of the
 * cpu version in ops_lowram_cpu.c and of any device version). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"

static double basis_at(const rk_view *b, int64_t j, int64_t d) {
    const char *row = (const char *)b->data + (size_t)j * b->nb1;
    return b->type == RK_DT_F16 ? (double)rk_f16_to_f32(((const uint16_t *)row)[d]) : (double)((const float *)row)[d];
}

rk_status rk_ref_lr_keys(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    const rk_rope_params *p = &a->rope;
    const int64_t n = rk_view_rows(&a->src0), r = a->src0.ne[0], hd = a->dst.ne[0];
    const int half = p->n_rot / 2;
    double *acc = malloc((size_t)(hd + half) * sizeof(double));
    if (!acc) return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: LR_KEYS scratch");
    double *freq = acc + hd;
    rk_rope_freqs(p, freq);
    const float *mean = rk_row_f32(&a->src2, 0), *winv = rk_row_f32(&a->src2, 1);
    for (int64_t k = 0; k < n; k++) {
        const float *cf = rk_row_f32(&a->src0, k);
        float *y = rk_row_f32(&a->dst, k);
        for (int64_t d = 0; d < hd; d++) {
            double s = 0;
            for (int64_t j = 0; j < r; j++) s += (double)cf[j] * basis_at(&a->src1, j, d);
            acc[d] = s * winv[d] + mean[d];
        }
        const int64_t pos = a->ids[k];
        for (int i = 0; i < half; i++) {
            const int64_t i0 = p->mode == RK_ROPE_NEOX ? i : 2 * i, i1 = p->mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
            double co, si;
            if (a->lr_rope_cs) {
                co = a->lr_rope_cs[pos * p->n_rot + 2 * i], si = a->lr_rope_cs[pos * p->n_rot + 2 * i + 1];
            } else {
                co = cos((double)pos * freq[i]), si = sin((double)pos * freq[i]);
            }
            const double x0 = acc[i0], x1 = acc[i1];
            acc[i0] = x0 * co - x1 * si;
            acc[i1] = x0 * si + x1 * co;
        }
        for (int64_t d = 0; d < hd; d++) y[d] = (float)acc[d];
    }
    free(acc);
    return RK_OK;
}
