/* LowRAM's AVX2/FMA/F16C row kernels for callers built for the baseline target (lowram_simd.h
 * declares them): compiled with -mavx2 -mfma -mf16c, reached only after rk_cpu_has_avx2(). */
#include <immintrin.h>

#include "lowram_impl.h"
#include "lowram_simd.h"

#ifndef LR_HAVE_ACC_AVX2
#error "lowram_avx2.c needs -mavx2 -mfma -mf16c"
#endif

float lr_exp_sum_avx2(float *sc, int n, float m) { return exp_sum_avx2(sc, n, m); }

void lr_store_f16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = rk_f32_to_f16(src[i]);
}
