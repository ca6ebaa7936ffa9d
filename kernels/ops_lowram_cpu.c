/* cpu LR_KEYS: LowRAM's key rebuild on the backend's pool. The basis columns are turned
 * into a (hd, r) f32 block once per op (shared scratch), then each task multiplies its rows
 * of coefficients by it with the instance's gemm_nt (AVX2 where the CPU has it), scales,
 * adds the mean and rotates. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LRK_AVX2 1
/* y (n rows, ldy) = c (n rows of r, ldc) · B (r rows of hd, row stride ldb bytes; f16 or f32):
 * basis rows are read as they are stored (no f32 transposed copy per call); 4 output rows ×
 * 16 columns of accumulators per pass over the r basis rows. */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 lrk_ld8(const uint8_t *p, bool f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)p);
}
__attribute__((target("avx2,fma,f16c"))) static void lrk_gemm_avx2(int64_t n, int64_t hd, int64_t r, const float *c,
                                                                   int64_t ldc, const uint8_t *B, size_t ldb, bool f16,
                                                                   float *y, int64_t ldy) {
    const size_t el = f16 ? 2 : 4;
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
        const int nj = n - j0 < 4 ? (int)(n - j0) : 4;
        const float *cr[4];
        for (int jj = 0; jj < 4; jj++) cr[jj] = c + (j0 + (jj < nj ? jj : 0)) * ldc;
        int64_t i = 0;
        for (; i + 16 <= hd; i += 16) {
            __m256 a[4][2];
            for (int jj = 0; jj < 4; jj++) a[jj][0] = a[jj][1] = _mm256_setzero_ps();
            for (int64_t k = 0; k < r; k++) {
                const uint8_t *b = B + (size_t)k * ldb + (size_t)i * el;
                const __m256 b0 = lrk_ld8(b, f16), b1 = lrk_ld8(b + 8 * el, f16);
                for (int jj = 0; jj < 4; jj++) {
                    const __m256 w = _mm256_broadcast_ss(cr[jj] + k);
                    a[jj][0] = _mm256_fmadd_ps(w, b0, a[jj][0]);
                    a[jj][1] = _mm256_fmadd_ps(w, b1, a[jj][1]);
                }
            }
            for (int jj = 0; jj < nj; jj++) {
                _mm256_storeu_ps(y + (j0 + jj) * ldy + i, a[jj][0]);
                _mm256_storeu_ps(y + (j0 + jj) * ldy + i + 8, a[jj][1]);
            }
        }
        for (; i < hd; i++)
            for (int jj = 0; jj < nj; jj++) {
                float t = 0;
                for (int64_t k = 0; k < r; k++) {
                    const uint8_t *b = B + (size_t)k * ldb + (size_t)i * el;
                    t += cr[jj][k] * (f16 ? _cvtsh_ss(*(const uint16_t *)b) : *(const float *)b);
                }
                y[(j0 + jj) * ldy + i] = t;
            }
    }
}
#endif

typedef struct lrk_ctx {
    const rk_op_args *a;
    const rk_cpu_kern *k;
    const float *bt; /* (hd, r) */
    const double *freq;
    bool direct; /* lrk_gemm_avx2 on the stored basis rows (bt unused) */
} lrk_ctx;

static void lrk_range(void *vp, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const lrk_ctx *x = vp;
    const rk_op_args *a = x->a;
    const rk_rope_params *p = &a->rope;
    const int64_t r = a->src0.ne[0], hd = a->dst.ne[0];
    const int half = p->n_rot / 2;
#ifdef LRK_AVX2
    if (x->direct)
        lrk_gemm_avx2(i1 - i0, hd, r, rk_row_f32(&a->src0, i0), (int64_t)(a->src0.nb1 / sizeof(float)),
                      (const uint8_t *)a->src1.data, a->src1.nb1, a->src1.type == RK_DT_F16, rk_row_f32(&a->dst, i0),
                      (int64_t)(a->dst.nb1 / sizeof(float)));
    else
#endif
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
    bool direct = false;
#ifdef LRK_AVX2
    direct = rk_cpu_has_avx2();
#endif
    for (int64_t j = 0; j < r && !direct; j++) {
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
    lrk_ctx x = {a, k, bt, freq, direct};
    /* serial below ~512K multiply-adds (under one 32-row chunk of a decode step, ~50 us on one
     * core, where waking the pool costs about what it saves); else 16-row tasks */
    rk_cpu_par_for(be, n, n * r * hd < (int64_t)1 << 19 ? n : 16, lrk_range, &x);
    return RK_OK;
}
