/* Vector helpers of LowRAM attention (lowram_task.h and the phases under it; the fit's
 * attention mass in lowram_fit.c uses the exp-sum through lr_exp_sum_avx2): axpy loops the
 * compiler vectorises, and in translation units compiled for AVX2/FMA/F16C (the AVX2 builds
 * of the phases, lowram_avx2.c) the fused accumulation over int8/f16/f32 rows, the
 * landmark and key-cache dots and an 8-lane exp-sum. The dot product and the exp polynomial
 * are the kernels' (rk_simd.h). */
#ifndef RK_LOWRAM_SIMD_H
#define RK_LOWRAM_SIMD_H
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rk_simd.h"

#define LR_AI static inline __attribute__((always_inline))

LR_AI void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

LR_AI void scal(float *restrict y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

/* acc row j (row stride ld) += w[j] * v for every j < ns: v is read once for up to 4 rows. */
LR_AI void axpy_rows(float *acc, size_t ld, const float *w, int ns, const float *restrict v, int n) {
    int j = 0;
    for (; j + 4 <= ns; j += 4) {
        float *restrict a0 = acc + (size_t)j * ld, *restrict a1 = a0 + ld, *restrict a2 = a1 + ld,
                        *restrict a3 = a2 + ld;
        const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
        for (int i = 0; i < n; i++) {
            const float x = v[i];
            a0[i] += w0 * x, a1[i] += w1 * x, a2[i] += w2 * x, a3[i] += w3 * x;
        }
    }
    if (ns - j == 3) {
        float *restrict a0 = acc + (size_t)j * ld, *restrict a1 = a0 + ld, *restrict a2 = a1 + ld;
        const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2];
        for (int i = 0; i < n; i++) {
            const float x = v[i];
            a0[i] += w0 * x, a1[i] += w1 * x, a2[i] += w2 * x;
        }
    } else {
        for (; j < ns; j++) axpy(acc + (size_t)j * ld, w[j], v, n);
    }
}

/* The same with v an int8 row (the scale is in w). */
LR_AI void axpy_rows_i8(float *acc, size_t ld, const float *w, int ns, const int8_t *restrict v, int n) {
    int j = 0;
    for (; j + 4 <= ns; j += 4) {
        float *restrict a0 = acc + (size_t)j * ld, *restrict a1 = a0 + ld, *restrict a2 = a1 + ld,
                        *restrict a3 = a2 + ld;
        const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
        for (int i = 0; i < n; i++) {
            const float x = (float)v[i];
            a0[i] += w0 * x, a1[i] += w1 * x, a2[i] += w2 * x, a3[i] += w3 * x;
        }
    }
    if (ns - j == 3) {
        float *restrict a0 = acc + (size_t)j * ld, *restrict a1 = a0 + ld, *restrict a2 = a1 + ld;
        const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2];
        for (int i = 0; i < n; i++) {
            const float x = (float)v[i];
            a0[i] += w0 * x, a1[i] += w1 * x, a2[i] += w2 * x;
        }
        j += 3;
    }
    for (; j < ns; j++) {
        float *restrict a = acc + (size_t)j * ld;
        const float wj = w[j];
        for (int i = 0; i < n; i++) a[i] += wj * (float)v[i];
    }
}

/* acc (ns rows of stride ld, n floats each) += Σ_k w(k, j) · s_k · row_k for nb rows at
 * rows + k·stride: int8 rows (i8: an f16 scale s_k, then n codes) or f16 rows (s_k = 1);
 * w(k, j) = w[k·wk + j·wj]. The fused decode loops: rows are read once for every query
 * head, 16 columns × up to 4 heads of accumulators stay in registers over 32 rows. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LR_HAVE_ACC_AVX2 1
enum { LR_R_I8, LR_R_F16, LR_R_F32 };
LR_AI __m256 ld8(const uint8_t *p, int ty) {
    if (ty == LR_R_I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    if (ty == LR_R_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_loadu_ps((const float *)p);
}
__attribute__((unused)) static void acc_rows_avx2(float *acc, size_t ld, int ns, const float *w, size_t wk, size_t wj,
                                                  const uint8_t *rows, size_t stride, int ty, int nb, int n) {
    const bool i8 = ty == LR_R_I8;
    const size_t el = i8 ? 1 : ty == LR_R_F16 ? 2 : 4, hdr = i8 ? 2 : 0;
    float ws[32 * 4];
    for (int k0 = 0; k0 < nb; k0 += 32) {
        const int kn = nb - k0 < 32 ? nb - k0 : 32;
        for (int j0 = 0; j0 < ns; j0 += 4) {
            const int nj = ns - j0 < 4 ? ns - j0 : 4;
            for (int k = 0; k < kn; k++) {
                const uint8_t *rw = rows + (size_t)(k0 + k) * stride;
                const float sk = i8 ? _cvtsh_ss((unsigned short)(rw[0] | (rw[1] << 8))) : 1.0f;
                for (int jj = 0; jj < 4; jj++)
                    ws[k * 4 + jj] = jj < nj ? w[(size_t)(k0 + k) * wk + (size_t)(j0 + jj) * wj] * sk : 0.0f;
            }
            int i = 0;
            for (; i + 16 <= n; i += 16) {
                __m256 a[4][2];
                for (int jj = 0; jj < 4; jj++)
                    for (int u = 0; u < 2; u++)
                        a[jj][u] =
                            jj < nj ? _mm256_loadu_ps(acc + (size_t)(j0 + jj) * ld + i + 8 * u) : _mm256_setzero_ps();
                for (int k = 0; k < kn; k++) {
                    const uint8_t *rw = rows + (size_t)(k0 + k) * stride + hdr + (size_t)i * el;
                    const __m256 v0 = ld8(rw, ty), v1 = ld8(rw + 8 * el, ty);
                    for (int jj = 0; jj < 4; jj++) {
                        const __m256 b = _mm256_set1_ps(ws[k * 4 + jj]);
                        a[jj][0] = _mm256_fmadd_ps(b, v0, a[jj][0]);
                        a[jj][1] = _mm256_fmadd_ps(b, v1, a[jj][1]);
                    }
                }
                for (int jj = 0; jj < nj; jj++)
                    for (int u = 0; u < 2; u++) _mm256_storeu_ps(acc + (size_t)(j0 + jj) * ld + i + 8 * u, a[jj][u]);
            }
            for (; i < n; i++) /* tail */
                for (int k = 0; k < kn; k++) {
                    const uint8_t *rw = rows + (size_t)(k0 + k) * stride + hdr;
                    const float v = i8               ? (float)((const int8_t *)rw)[i]
                                    : ty == LR_R_F16 ? _cvtsh_ss(((const uint16_t *)rw)[i])
                                                     : ((const float *)rw)[i];
                    for (int jj = 0; jj < nj; jj++) acc[(size_t)(j0 + jj) * ld + i] += ws[k * 4 + jj] * v;
                }
        }
    }
}
/* d[j] = q_j · k for ns <= LR_DOT_MAX query rows qs[j] (hd floats, hd % 8 == 0) and one
 * landmark row k of hd f16 (LR_R_F16) or int8 (LR_R_I8, unscaled) values, summed as
 * rk_simd_dot8 sums (8 lanes, multiply then add, its final reduction): bit for bit
 * rk_simd_dot8 on the row as f32, with the row converted in registers and the query rows' chains interleaved (the
 * selection's scoring was latency-bound on one chain at a time). */
enum { LR_DOT_MAX = 12 };
__attribute__((unused)) static void lmk_dots_avx2(const float *const *qs, int ns, const uint8_t *k, int ty, int hd,
                                                  float *d) {
    __m256 acc[LR_DOT_MAX];
    const size_t el = ty == LR_R_I8 ? 1 : 2;
    for (int j = 0; j < ns; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        const __m256 kv = ld8(k + (size_t)i * el, ty);
        for (int j = 0; j < ns; j++) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(qs[j] + i), kv));
    }
    for (int j = 0; j < ns; j++) {
        float a[8];
        _mm256_storeu_ps(a, acc[j]);
        d[j] = 0.0f + (((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])));
    }
}
/* d[j] = q_j · k for NS query rows qs[j] (hd floats, hd % 8 == 0) and one int8 row k (its
 * scale left to the caller), NS a constant at each call site so that the NS accumulators stay
 * in registers: the key row is converted once in registers for every query row (decode's
 * scores over the int8 key cache, without an f32 copy of the keys). */
LR_AI void kc_dots_n(const float *const *qs, const int8_t *k, int hd, float *d, const int NS) {
    __m256 acc[LR_DOT_MAX];
    for (int j = 0; j < NS; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        const __m256 kv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(k + i))));
        for (int j = 0; j < NS; j++) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qs[j] + i), kv, acc[j]);
    }
    for (int j = 0; j < NS; j++) d[j] = rk_simd_hsum8(acc[j]);
}
/* kc_dots_n for 1 <= ns <= LR_DOT_MAX rows. */
__attribute__((unused)) static void kc_dots_avx2(const float *const *qs, int ns, const int8_t *k, int hd, float *d) {
    switch (ns) {
#define LR_KC_CASE(n) \
    case n: kc_dots_n(qs, k, hd, d, n); return;
        LR_KC_CASE(1)
        LR_KC_CASE(2)
        LR_KC_CASE(3)
        LR_KC_CASE(4)
        LR_KC_CASE(5)
        LR_KC_CASE(6)
        LR_KC_CASE(7)
        LR_KC_CASE(8)
        LR_KC_CASE(9)
        LR_KC_CASE(10)
        LR_KC_CASE(11)
        LR_KC_CASE(12)
#undef LR_KC_CASE
    default: return;
    }
}
/* sc[k] = exp(sc[k] - m) for k < n, returns their sum: Cephes' expf polynomial on 8 lanes
 * (rk_simd_exp8_poly; relative error ~1e-7, the same class as libm's expf), arguments below
 * -87.3 give 0. */
__attribute__((unused)) static float exp_sum_avx2(float *sc, int n, float m) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762626647949f), mm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(sc + k), mm);
        const __m256 z = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
        __m256 fx, y = rk_simd_exp8_poly(_mm256_min_ps(_mm256_max_ps(x, lo), hi), &fx);
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
        y = _mm256_andnot_ps(z, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
        _mm256_storeu_ps(sc + k, y);
        acc = _mm256_add_ps(acc, y);
    }
    float t[8], sum = 0;
    _mm256_storeu_ps(t, acc);
    for (int i = 0; i < 8; i++) sum += t[i];
    for (; k < n; k++) sum += sc[k] = expf(sc[k] - m);
    return sum;
}
#endif

/* Out of line, in lowram_avx2.c (compiled for AVX2/FMA/F16C; call after rk_cpu_has_avx2()):
 * exp_sum_avx2 for callers compiled for the baseline (the fit's attention mass), and n floats
 * into f16 rounded to nearest even as rk_f32_to_f16 (the key cache's f16 slots). */
float lr_exp_sum_avx2(float *sc, int n, float m);
void lr_store_f16_avx2(const float *src, uint16_t *dst, int64_t n);

#endif
