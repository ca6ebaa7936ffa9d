/* cpu LR_KEYS: LowRAM's key rebuild on the backend's pool. The basis columns are turned
 * into a (hd, r) f32 block once per op (shared scratch), then each task multiplies its rows
 * of coefficients by it with the instance's gemm_nt (AVX2 where the CPU has it), scales,
 * adds the mean and rotates. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops_impl.h"

typedef struct lrk_ctx {
    const rk_op_args *a;
    const rk_cpu_kern *k;
    const float *bt;   /* (hd, r) */
    const double *freq;
} lrk_ctx;

static void lrk_range(void *vp, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const lrk_ctx *x = vp;
    const rk_op_args *a = x->a;
    const rk_rope_params *p = &a->rope;
    const int64_t r = a->src0.ne[0], hd = a->dst.ne[0];
    const int half = p->n_rot / 2;
    x->k->gemm_nt(i1 - i0, hd, r, rk_row_f32(&a->src0, i0), (int64_t)(a->src0.nb1 / sizeof(float)), x->bt, r,
                  rk_row_f32(&a->dst, i0), (int64_t)(a->dst.nb1 / sizeof(float)));
    const float *mean = rk_row_f32(&a->src2, 0), *winv = rk_row_f32(&a->src2, 1);
    for (int64_t k = i0; k < i1; k++) {
        float *y = rk_row_f32(&a->dst, k);
        for (int64_t d = 0; d < hd; d++) y[d] = y[d] * winv[d] + mean[d];
        const int64_t pos = a->ids[k];
        const float *cs = a->lr_rope_cs ? a->lr_rope_cs + pos * p->n_rot : NULL;
        for (int i = 0; i < half; i++) {
            const int64_t j0 = p->mode == RK_ROPE_NEOX ? i : 2 * i, j1 = p->mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
            float co, si;
            if (cs) {
                co = cs[2 * i], si = cs[2 * i + 1];
            } else {
                const double th = (double)pos * x->freq[i];
                co = (float)cos(th), si = (float)sin(th);
            }
            const float x0 = y[j0], x1 = y[j1];
            y[j0] = x0 * co - x1 * si;
            y[j1] = x0 * si + x1 * co;
        }
    }
}

rk_status rk_cpu_lr_keys(rk_backend *be, const rk_op_args *a, rk_err *err) {
    const int64_t n = rk_view_rows(&a->src0), r = a->src0.ne[0], hd = a->dst.ne[0];
    if (n == 0) return RK_OK;
    const int half = a->rope.n_rot / 2;
    float *const *tls = NULL;
    float *sh = NULL;
    /* shared: (hd, r) basis block, then n_rot/2 doubles of frequencies */
    rk_status st = rk_cpu_scratch(be, 0, (size_t)(hd * r) + 2 * (size_t)half + 8 + (size_t)hd, &tls, &sh, err);
    if (st != RK_OK) return st;
    const rk_cpu_kern *k = rk_cpu_kern_of(be);
    float *bt = sh;
    float *tmp = sh + hd * r + 2 * (size_t)half + 8; /* one basis row as f32 */
    for (int64_t j = 0; j < r; j++) {
        const char *src = (const char *)a->src1.data + (size_t)j * a->src1.nb1;
        const float *row = (const float *)src;
        if (a->src1.type == RK_DT_F16) {
            k->f16_to_f32((const uint16_t *)src, tmp, hd);
            row = tmp;
        }
        for (int64_t d = 0; d < hd; d++) bt[d * r + j] = row[d];
    }
    double *freq = (double *)(((uintptr_t)(sh + hd * r) + 7) & ~(uintptr_t)7);
    rk_rope_freqs(&a->rope, freq);
    lrk_ctx x = {a, k, bt, freq};
    /* serial below ~2M multiply-adds (one chunk or two of a decode step: ~100 us on one core,
     * where waking the pool costs more than it saves on a busy machine); else 32-row tasks */
    rk_cpu_par_for(be, n, n * r * hd < (int64_t)1 << 21 ? n : 32, lrk_range, &x);
    return RK_OK;
}
