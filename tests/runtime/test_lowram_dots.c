/* LowRAM's AVX2 kernels (runtime/kv/lowram_simd.h, lowram_avx2.c): the selection's landmark
 * dots against rk_simd_dot8 (bit for bit), decode's int8 key-cache dots against double
 * precision, the exp-sum against expf and the f16 stores against rk_f32_to_f16. Part of the
 * runtime_lowram test binary, compiled with the AVX2 flags (tests/runtime/meson.build). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lowram_impl.h"
#include "lowram_simd.h" /* lmk_dots_avx2, kc_dots_avx2 */
#include "rk_kernels.h"

/* ns query rows of hd values in [-10, 10] (steps of 1e-3) from the LCG state st, into q,
 * and their row pointers into qs. */
static inline void query_rows(uint64_t *st, float *q, int ns, int hd, const float **qs) {
    for (int i = 0; i < ns * hd; i++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        q[i] = (float)((int64_t)(*st >> 33) % 20001 - 10000) * 1e-3f;
    }
    for (int j = 0; j < ns; j++) qs[j] = q + (size_t)j * hd;
}

/* The selection's AVX2 landmark dots sum as rk_simd_dot8 sums (8 lanes, multiply then add, the
 * same reduction), so they equal it on the landmark converted to f32 bit for bit, for f16 and int8
 * rows, 1..LR_DOT_MAX query rows and head dims 8..256 (any difference would be a reordering). */
Test(lowram, landmark_dots_equal_dot8) {
#ifdef LR_HAVE_ACC_AVX2
    if (!rk_cpu_has_avx2()) cr_skip_test("no AVX2");
    uint64_t st = 0x2545f4914f6cdd1dull;
    float q[LR_DOT_MAX * 256], row[256], d[LR_DOT_MAX];
    uint16_t h[256];
    uint8_t i8[256];
    int n_cmp = 0;
    for (int hd = 8; hd <= 256; hd *= 2)
        for (int ns = 1; ns <= LR_DOT_MAX; ns++) {
            const float *qs[LR_DOT_MAX];
            query_rows(&st, q, ns, hd, qs);
            for (int ty = 0; ty < 2; ty++) {
                for (int e = 0; e < hd; e++) {
                    st = st * 6364136223846793005ull + 1442695040888963407ull;
                    const int v = (int)((st >> 40) % 255) - 127;
                    i8[e] = (uint8_t)(int8_t)v;
                    h[e] = rk_f32_to_f16((float)v * 0.0371f);
                    row[e] = ty ? (float)v : rk_f16_to_f32(h[e]);
                }
                lmk_dots_avx2(qs, ns, ty ? i8 : (const uint8_t *)h, ty ? LR_R_I8 : LR_R_F16, hd, d);
                for (int j = 0; j < ns; j++, n_cmp++) {
                    const float ref = rk_simd_dot8(qs[j], row, hd);
                    cr_expect(memcmp(&d[j], &ref, sizeof ref) == 0, "hd %d ns %d %s row %d: %.9g vs rk_simd_dot8 %.9g",
                              hd, ns, ty ? "int8" : "f16", j, (double)d[j], (double)ref);
                }
            }
        }
    cr_expect_eq(n_cmp, 6 * 2 * LR_DOT_MAX * (LR_DOT_MAX + 1) / 2);
#else
    cr_skip_test("no AVX2 build");
#endif
}

/* kc_dots_avx2 (decode's scores over the int8 key cache) against the double-precision dot
 * product of the same query and codes, for 1..LR_DOT_MAX query rows and head dims 8..256. It
 * sums with FMAs in 8 lanes and a pairwise reduction: a float sum of hd products is within
 * hd · 2^-24 · Σ|q_i k_i| of the exact one (each of at most hd roundings errs by at most
 * 2^-24 of a partial sum no larger than Σ|q_i k_i|); the bound is that, and a dropped or
 * repeated block of 8 (the kernel's step) breaks it by orders of magnitude. */
Test(lowram, key_cache_dots_within_rounding) {
#ifdef LR_HAVE_ACC_AVX2
    if (!rk_cpu_has_avx2()) cr_skip_test("no AVX2");
    uint64_t st = 0x9e3779b97f4a7c15ull;
    float q[LR_DOT_MAX * 256], d[LR_DOT_MAX];
    int8_t k[256];
    int n_cmp = 0;
    for (int hd = 8; hd <= 256; hd *= 2)
        for (int ns = 1; ns <= LR_DOT_MAX; ns++) {
            const float *qs[LR_DOT_MAX];
            query_rows(&st, q, ns, hd, qs);
            for (int e = 0; e < hd; e++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                k[e] = (int8_t)((int)((st >> 40) % 255) - 127);
            }
            for (int j = 0; j < LR_DOT_MAX; j++) d[j] = NAN;
            kc_dots_avx2(qs, ns, k, hd, d);
            for (int j = 0; j < ns; j++, n_cmp++) {
                double ref = 0, mag = 0;
                for (int e = 0; e < hd; e++) ref += (double)qs[j][e] * k[e], mag += fabs((double)qs[j][e] * k[e]);
                const double tol = hd * ldexp(1.0, -24) * mag;
                cr_expect(fabs(d[j] - ref) <= tol, "hd %d ns %d row %d: %.9g vs %.9g (tol %.3g)", hd, ns, j,
                          (double)d[j], ref, tol);
            }
            for (int j = ns; j < LR_DOT_MAX; j++) cr_expect(isnan(d[j]), "row %d written past ns %d", j, ns);
        }
    cr_expect_eq(n_cmp, 6 * LR_DOT_MAX * (LR_DOT_MAX + 1) / 2);
#else
    cr_skip_test("no AVX2 build");
#endif
}

/* lr_exp_sum_avx2 (the fit's attention mass; exp_sum_avx2 in decode's online softmax): each
 * sc[k] becomes exp(sc[k] - m) within the polynomial's error (Cephes' expf: under 2 ulp, so
 * 2^-22 relative with a margin, plus one subnormal step where libm's expf takes the tail past
 * the last 8 lanes below the normal range), 0 exactly below -87.33654 in the lanes, and the
 * sum returned is the sum of the stored values to float rounding (n additions of values at
 * most 1: n · 2^-24 of the sum). Arguments from -100 to 0
 * in steps that cross the cut-off, for lengths 1..67 (every tail length). */
Test(lowram, exp_sum_within_ulps) {
#ifdef LR_HAVE_ACC_AVX2
    if (!rk_cpu_has_avx2()) cr_skip_test("no AVX2");
    float sc[67], x[67];
    int n_cmp = 0, n_zero = 0;
    for (int n = 1; n <= 67; n++) {
        const float m = 3.25f;
        for (int k = 0; k < n; k++) x[k] = -100.0f * (float)((k * 37 + n * 11) % 67) / 66.0f, sc[k] = x[k] + m;
        const float sum = lr_exp_sum_avx2(sc, n, m);
        double ref_sum = 0;
        for (int k = 0; k < n; k++, n_cmp++) {
            ref_sum += sc[k];
            if (x[k] < -87.33654f && k < n / 8 * 8) {
                cr_expect(sc[k] == 0.0f, "n %d k %d: exp(%.9g) = %.9g, 0 expected", n, k, (double)x[k], (double)sc[k]);
                n_zero++;
                continue;
            }
            const double ref = exp((double)x[k]);
            cr_expect(fabs(sc[k] - ref) <= ldexp(ref, -22) + ldexp(1.0, -149), "n %d k %d: exp(%.9g) = %.9g vs %.9g", n,
                      k, (double)x[k], (double)sc[k], ref);
        }
        cr_expect(fabs(sum - ref_sum) <= n * ldexp(ref_sum, -24) + 1e-30, "n %d: sum %.9g vs %.9g", n, (double)sum,
                  ref_sum);
    }
    cr_expect_eq(n_cmp, 67 * 68 / 2);
    cr_expect_gt(n_zero, 0);
#else
    cr_skip_test("no AVX2 build");
#endif
}

/* lr_store_f16_avx2 (the key cache's f16 slots) rounds as rk_f32_to_f16, bit for bit: normal,
 * subnormal and overflowing magnitudes of both signs, ties included, every tail length. */
Test(lowram, store_f16_equals_scalar) {
#ifdef LR_HAVE_ACC_AVX2
    if (!rk_cpu_has_avx2()) cr_skip_test("no AVX2");
    float src[4099];
    uint16_t got[4099];
    uint64_t st = 0x853c49e6748fea9bull;
    for (int i = 0; i < 4099; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const int e = (int)((st >> 33) % 44) - 28;                      /* 2^-28 .. 2^15: subnormal f16 to overflow */
        const float mant = 1.0f + (float)((st >> 45) % 2048) / 2048.0f; /* 11 bits: ties at the f16 rounding */
        src[i] = ldexpf((st >> 63) ? -mant : mant, e);
    }
    for (int n = 4091; n <= 4099; n++) {
        memset(got, 0, sizeof got);
        lr_store_f16_avx2(src, got, n);
        int bad = 0;
        for (int i = 0; i < n; i++) bad += got[i] != rk_f32_to_f16(src[i]);
        cr_expect_eq(bad, 0, "n %d: %d values differ from rk_f32_to_f16", n, bad);
    }
#else
    cr_skip_test("no AVX2 build");
#endif
}
