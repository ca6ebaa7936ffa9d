/* Vector helpers shared by the kernels and the runtime (LowRAM attention): header-only,
 * static inline, so that they inline into the hot loops that call them.
 *   rk_simd_dot8      plain C, any target (the compiler vectorises it)
 *   rk_simd_hsum8,
 *   rk_simd_exp8_poly AVX2/FMA only: defined in translation units compiled with -mavx2
 *                     -mfma (the *_avx2.c units and the AVX2 builds of LowRAM's phases),
 *                     reached after rk_cpu_has_avx2(). */
#pragma once
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define RK_SIMD_INLINE static inline __attribute__((always_inline))
#else
#define RK_SIMD_INLINE static inline
#endif

/* a·b over n floats with 8 partial sums (lane u takes the elements i ≡ u mod 8 below the
 * last multiple of 8), then the tail, reduced as t + ((p0 + p4) + (p1 + p5)) + ((p2 + p6) +
 * (p3 + p7)). The order is a contract: LowRAM's AVX2 landmark dots and the cpu_ref LR_ATTN
 * oracle reproduce it bit for bit. */
RK_SIMD_INLINE float rk_simd_dot8(const float *restrict a, const float *restrict b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
    float t = 0;
    for (; i < n; i++) t += a[i] * b[i];
    return t + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* Sum of the 8 lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
RK_SIMD_INLINE float rk_simd_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Cephes' expf core on 8 lanes for arguments x already clamped to the caller's range:
 * x = n ln2 + r (n = round(x log2 e), ln2 in two parts), returns e^r from the degree-7
 * polynomial (relative error ~1e-7, the class of libm's expf) and n in *n. The caller scales
 * by 2^n and handles its range's ends. */
RK_SIMD_INLINE __m256 rk_simd_exp8_poly(__m256 x, __m256 *n) {
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    *n = fx;
    return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}
#endif
