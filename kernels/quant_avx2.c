/* AVX2/FMA/F16C row functions: the decode GEMV inner loop (dot) and the weight
 * tile dequantiser for prefill (to_f32). Only reached after rk_cpu_has_avx2().
 *
 * to_f32 matches quant_ref.c bit for bit: the same f32 operations in the same
 * order, never fused (contraction is off). dot products differ from the
 * reference only by f32 rounding: integers are unpacked to 32-bit lanes,
 * converted to f32 and combined with x by FMA, 8 lanes wide with several
 * independent accumulators. Per-block scales are applied either per element
 * (w = fma(q, d, m)) or once per block (d * sum q*x), whichever measured faster;
 * both round once per step, so the error stays relative to sum |parts * x|.
 *
 * Blocks are byte arrays at any alignment: every vector load is unaligned
 * (loadu / loadl_epi64 / memcpy). */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "quant_impl.h"
#include "rk_simd.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- helpers ---------------------------------------------------------- */

/* Software prefetch this far ahead of the weight stream: GEMV rows are read once,
 * sequentially, and the hardware prefetcher alone left the Q8_0 output matrix
 * (30 MB) 10-25% slower. Prefetches never fault; the address is formed as an
 * integer because it may lie past the end of the row. */
#define RK_PF_DIST 2048
static inline void pf(const uint8_t *p) { _mm_prefetch((const char *)((uintptr_t)p + RK_PF_DIST), _MM_HINT_T0); }


/* Two f16 at p (p[0..1], p[2..3]) -> [a, b, a, b, ...]. moveldup/movehdup then
 * broadcast a or b: one load, one conversion, no scalar round trip. */
static inline __m256 ld_f16x2(const uint8_t *p) {
    float v; /* as a float, the broadcast is a plain vbroadcastss load */
    memcpy(&v, p, 4);
    return _mm256_cvtph_ps(_mm_castps_si128(_mm_set1_ps(v)));
}

/* 8 bytes at p, zero- or sign-extended to 8 x int32. */
static inline __m256i ld_u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}
static inline __m256i ld_i8x8(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

static inline __m256 cvt(__m256i v) { return _mm256_cvtepi32_ps(v); }

/* ---- f32 ---------------------------------------------------------------- */

static inline __m256 ld_f32x8(const uint8_t *p) { return _mm256_loadu_ps((const float *)(const void *)p); }

void rk_quant_avx2_f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

float rk_quant_avx2_f32_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *a = w; /* any alignment: loadu and memcpy */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        pf(a + 4 * i);
        pf(a + 4 * i + 64);
        acc0 = _mm256_fmadd_ps(ld_f32x8(a + 4 * i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(ld_f32x8(a + 4 * i + 32), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(ld_f32x8(a + 4 * i + 64), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(ld_f32x8(a + 4 * i + 96), _mm256_loadu_ps(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(ld_f32x8(a + 4 * i), _mm256_loadu_ps(x + i), acc0);
    float s = rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) {
        float v;
        memcpy(&v, a + 4 * i, 4);
        s += v * x[i];
    }
    return s;
}

/* ---- f16 (F16C) ------------------------------------------------------- */

static inline __m256 ld_f16x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline float f16_scalar(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

void rk_quant_avx2_f16_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, ld_f16x8(p + 2 * i));
        _mm256_storeu_ps(dst + i + 8, ld_f16x8(p + 2 * i + 16));
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_f16x8(p + 2 * i));
    for (; i < n; i++) dst[i] = f16_scalar(p + 2 * i);
}

float rk_quant_avx2_f16_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        pf(p + 2 * i);
        acc0 = _mm256_fmadd_ps(ld_f16x8(p + 2 * i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(ld_f16x8(p + 2 * i + 16), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(ld_f16x8(p + 2 * i + 32), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(ld_f16x8(p + 2 * i + 48), _mm256_loadu_ps(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(ld_f16x8(p + 2 * i), _mm256_loadu_ps(x + i), acc0);
    float s = rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) s += f16_scalar(p + 2 * i) * x[i];
    return s;
}

/* ---- bf16: the high half of an f32 ---------------------------------- */

static inline __m256 ld_bf16x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

void rk_quant_avx2_bf16_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_bf16x8(p + 2 * i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = rk_bf16_to_f32(h);
    }
}

float rk_quant_avx2_bf16_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        pf(p + 2 * i);
        acc0 = _mm256_fmadd_ps(ld_bf16x8(p + 2 * i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(ld_bf16x8(p + 2 * i + 16), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(ld_bf16x8(p + 2 * i + 32), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(ld_bf16x8(p + 2 * i + 48), _mm256_loadu_ps(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(ld_bf16x8(p + 2 * i), _mm256_loadu_ps(x + i), acc0);
    float s = rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        s += rk_bf16_to_f32(h) * x[i];
    }
    return s;
}

/* ---- q8_0 ---------------------------------------------------------------- */

void rk_quant_avx2_q8_0_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / RK_QK8_0; i++, p += sizeof(rk_block_q8_0), dst += RK_QK8_0) {
        const __m256 d = _mm256_moveldup_ps(ld_f16x2(p)); /* d and qs[0..1]: low half = d */
        const uint8_t *qs = p + offsetof(rk_block_q8_0, qs);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(cvt(ld_i8x8(qs + 8 * k)), d));
    }
}

/* d * sum(q * x) per block: the f32 sum of q*x is exact to one rounding per step
 * and |d * q| = |w| before w's own rounding, so the error is relative to sum|w x|. */
static inline __m256 q8_0_block(const uint8_t *p, const float *x) {
    const uint8_t *qs = p + offsetof(rk_block_q8_0, qs);
    __m256 t = _mm256_mul_ps(cvt(ld_i8x8(qs)), _mm256_loadu_ps(x));
    t = _mm256_fmadd_ps(cvt(ld_i8x8(qs + 8)), _mm256_loadu_ps(x + 8), t);
    t = _mm256_fmadd_ps(cvt(ld_i8x8(qs + 16)), _mm256_loadu_ps(x + 16), t);
    return _mm256_fmadd_ps(cvt(ld_i8x8(qs + 24)), _mm256_loadu_ps(x + 24), t);
}

float rk_quant_avx2_q8_0_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    const size_t bs = sizeof(rk_block_q8_0);
    const int64_t nb = n / RK_QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, p += 2 * bs, x += 2 * RK_QK8_0) {
        pf(p);
        acc0 = _mm256_fmadd_ps(_mm256_moveldup_ps(ld_f16x2(p)), q8_0_block(p, x), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_moveldup_ps(ld_f16x2(p + bs)), q8_0_block(p + bs, x + 32), acc1);
    }
    if (i < nb) acc0 = _mm256_fmadd_ps(_mm256_moveldup_ps(ld_f16x2(p)), q8_0_block(p, x), acc0);
    return rk_simd_hsum8(_mm256_add_ps(acc0, acc1));
}

/* ---- q4_0 ----------------------------------------------------------------
 * qs[0..7] and qs[8..15] zero-extended to int32 lanes: the low nibbles are
 * elements 0..15, the high nibbles (>> 4, already < 16) elements 16..31. */

static inline void q4_unpack(const uint8_t *qs, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi32(0xF);
    const __m256i b0 = ld_u8x8(qs), b1 = ld_u8x8(qs + 8);
    q[0] = _mm256_and_si256(b0, m4);
    q[1] = _mm256_and_si256(b1, m4);
    q[2] = _mm256_srli_epi32(b0, 4);
    q[3] = _mm256_srli_epi32(b1, 4);
}

void rk_quant_avx2_q4_0_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i eight = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < n / RK_QK4_0; i++, p += sizeof(rk_block_q4_0), dst += RK_QK4_0) {
        const __m256 d = _mm256_moveldup_ps(ld_f16x2(p));
        __m256i q[4];
        q4_unpack(p + offsetof(rk_block_q4_0, qs), q);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(cvt(_mm256_sub_epi32(q[k], eight)), d));
    }
}

static inline __m256 q4_0_block(const uint8_t *p, const float *x) {
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i q[4];
    q4_unpack(p + offsetof(rk_block_q4_0, qs), q);
    __m256 t = _mm256_mul_ps(cvt(_mm256_sub_epi32(q[0], eight)), _mm256_loadu_ps(x));
    t = _mm256_fmadd_ps(cvt(_mm256_sub_epi32(q[1], eight)), _mm256_loadu_ps(x + 8), t);
    t = _mm256_fmadd_ps(cvt(_mm256_sub_epi32(q[2], eight)), _mm256_loadu_ps(x + 16), t);
    return _mm256_fmadd_ps(cvt(_mm256_sub_epi32(q[3], eight)), _mm256_loadu_ps(x + 24), t);
}

float rk_quant_avx2_q4_0_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    const size_t bs = sizeof(rk_block_q4_0);
    const int64_t nb = n / RK_QK4_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, p += 2 * bs, x += 2 * RK_QK4_0) {
        pf(p);
        acc0 = _mm256_fmadd_ps(_mm256_moveldup_ps(ld_f16x2(p)), q4_0_block(p, x), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_moveldup_ps(ld_f16x2(p + bs)), q4_0_block(p + bs, x + 32), acc1);
    }
    if (i < nb) acc0 = _mm256_fmadd_ps(_mm256_moveldup_ps(ld_f16x2(p)), q4_0_block(p, x), acc0);
    return rk_simd_hsum8(_mm256_add_ps(acc0, acc1));
}

/* ---- q4_1 ---------------------------------------------------------------- */

void rk_quant_avx2_q4_1_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / RK_QK4_1; i++, p += sizeof(rk_block_q4_1), dst += RK_QK4_1) {
        const __m256 dm = ld_f16x2(p);
        const __m256 d = _mm256_moveldup_ps(dm), m = _mm256_movehdup_ps(dm);
        __m256i q[4];
        q4_unpack(p + offsetof(rk_block_q4_1, qs), q);
        for (int k = 0; k < 4; k++) /* q*d rounded, then + m rounded: as ggml */
            _mm256_storeu_ps(dst + 8 * k, _mm256_add_ps(_mm256_mul_ps(cvt(q[k]), d), m));
    }
}

/* w = fma(q, d, m) per element (one rounding of the exact q*d + m), then
 * fma(w, x, acc): 8 FMA-port ops per block, fewer than d*sum(q x) + m*sum(x). */
static inline void q4_1_block(const uint8_t *p, const float *x, __m256 acc[4]) {
    const __m256 dm = ld_f16x2(p);
    const __m256 d = _mm256_moveldup_ps(dm), m = _mm256_movehdup_ps(dm);
    __m256i q[4];
    q4_unpack(p + offsetof(rk_block_q4_1, qs), q);
    for (int k = 0; k < 4; k++)
        acc[k] = _mm256_fmadd_ps(_mm256_fmadd_ps(cvt(q[k]), d, m), _mm256_loadu_ps(x + 8 * k), acc[k]);
}

float rk_quant_avx2_q4_1_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    const size_t bs = sizeof(rk_block_q4_1);
    const int64_t nb = n / RK_QK4_1;
    __m256 acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 3 <= nb; i += 3, p += 3 * bs, x += 3 * RK_QK4_1) { /* 60 bytes: one prefetch */
        pf(p);
        q4_1_block(p, x, acc);
        q4_1_block(p + bs, x + RK_QK4_1, acc);
        q4_1_block(p + 2 * bs, x + 2 * RK_QK4_1, acc);
    }
    for (; i < nb; i++, p += bs, x += RK_QK4_1) q4_1_block(p, x, acc);
    return rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

/* ---- q4_K ----------------------------------------------------------------
 * The eight 6-bit scales and mins, unpacked four bytes at a time (x86 is little
 * endian): sc[0..3] = s[0..3] & 63, m[0..3] = s[4..7] & 63,
 * sc[4..7] = low nibbles of s[8..11] | top two bits of s[0..3] moved to bits 4-5,
 * m[4..7] = high nibbles of s[8..11] | top two bits of s[4..7] moved to bits 4-5.
 * D[j] = d * sc[j] and M[j] = dmin * m[j], rounded as ggml does. They go
 * through small arrays and come back with _mm256_broadcast_ss: a broadcast load
 * needs no shuffle uop, while set1 of a vector element compiles to two
 * shuffles (the loop was 40% slower that way). */
static inline void q4_K_scales(const uint8_t *p, float D[8], float M[8]) {
    uint32_t u[3];
    memcpy(u, p + offsetof(rk_block_q4_K, scales), 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3fu;
    const uint32_t m_lo = u[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
    const __m256 dd = ld_f16x2(p); /* [d, dmin, ...] */
    const uint64_t sc8 = (uint64_t)sc_hi << 32 | sc_lo, m8 = (uint64_t)m_hi << 32 | m_lo;
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8));
    const __m256i mn = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8));
    _mm256_storeu_ps(D, _mm256_mul_ps(_mm256_moveldup_ps(dd), cvt(sc)));
    _mm256_storeu_ps(M, _mm256_mul_ps(_mm256_movehdup_ps(dd), cvt(mn)));
}

void rk_quant_avx2_q4_K_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q4_K)) {
        float D[8], M[8];
        q4_K_scales(p, D, M);
        const uint8_t *qs = p + offsetof(rk_block_q4_K, qs);
        for (int c = 0; c < 4; c++, qs += 32, dst += 64) {
            const __m256 d1 = _mm256_broadcast_ss(&D[2 * c]), m1 = _mm256_broadcast_ss(&M[2 * c]);
            const __m256 d2 = _mm256_broadcast_ss(&D[2 * c + 1]);
            const __m256 m2 = _mm256_broadcast_ss(&M[2 * c + 1]);
            for (int k = 0; k < 4; k++) {
                const __m256i b = ld_u8x8(qs + 8 * k);
                const __m256 lo = cvt(_mm256_and_si256(b, m4)), hi = cvt(_mm256_srli_epi32(b, 4));
                _mm256_storeu_ps(dst + 8 * k, _mm256_sub_ps(_mm256_mul_ps(lo, d1), m1));
                _mm256_storeu_ps(dst + 32 + 8 * k, _mm256_sub_ps(_mm256_mul_ps(hi, d2), m2));
            }
        }
    }
}

/* w = fmsub(q, D, M) per element (one rounding), then fma into 4 accumulators
 * (8 would spill: 16 ymm registers). */
float rk_quant_avx2_q4_K_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    const __m256i m4 = _mm256_set1_epi32(0xF);
    __m256 acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q4_K)) {
        float D[8], M[8];
        q4_K_scales(p, D, M);
        const uint8_t *qs = p + offsetof(rk_block_q4_K, qs);
        for (int c = 0; c < 4; c++, qs += 32, x += 64) {
            pf(qs);
            const __m256 d1 = _mm256_broadcast_ss(&D[2 * c]), m1 = _mm256_broadcast_ss(&M[2 * c]);
            const __m256 d2 = _mm256_broadcast_ss(&D[2 * c + 1]);
            const __m256 m2 = _mm256_broadcast_ss(&M[2 * c + 1]);
            for (int k = 0; k < 4; k++) {
                const __m256i b = ld_u8x8(qs + 8 * k);
                const __m256 lo = cvt(_mm256_and_si256(b, m4)), hi = cvt(_mm256_srli_epi32(b, 4));
                acc[k] = _mm256_fmadd_ps(_mm256_fmsub_ps(lo, d1, m1), _mm256_loadu_ps(x + 8 * k), acc[k]);
                acc[k] = _mm256_fmadd_ps(_mm256_fmsub_ps(hi, d2, m2), _mm256_loadu_ps(x + 32 + 8 * k), acc[k]);
            }
        }
    }
    return rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

/* ---- q6_K ----------------------------------------------------------------
 * For 8 consecutive l in a half: A = ql[l..], B = ql[l+32..], H = qh[l..] as int32
 * lanes; the four parts (elements l, l+32, l+64, l+96) are 6-bit q - 32. */
static inline void q6_unpack(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3);
    const __m256i m30 = _mm256_set1_epi32(0x30), c32 = _mm256_set1_epi32(32);
    const __m256i a = ld_u8x8(ql), b = ld_u8x8(ql + 32), h = ld_u8x8(qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(h, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi32(h, 2), m30));
    q[2] = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(h, m30));
    q[3] = _mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_and_si256(_mm256_srli_epi32(h, 2), m30));
    for (int k = 0; k < 4; k++) q[k] = _mm256_sub_epi32(q[k], c32);
}

/* D[j] = d * scales[j] for the 16 sub-blocks of 16. d is the block's last two
 * bytes: read 4 bytes ending there (inside the block) and take the high half. */
static inline void q6_K_scales(const uint8_t *p, float D[16]) {
    const __m256 d = _mm256_movehdup_ps(ld_f16x2(p + offsetof(rk_block_q6_K, d) - 2));
    const uint8_t *sc = p + offsetof(rk_block_q6_K, scales);
    _mm256_storeu_ps(D, _mm256_mul_ps(d, cvt(ld_i8x8(sc))));
    _mm256_storeu_ps(D + 8, _mm256_mul_ps(d, cvt(ld_i8x8(sc + 8))));
}

void rk_quant_avx2_q6_K_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q6_K)) {
        float D[16];
        q6_K_scales(p, D);
        const uint8_t *ql = p + offsetof(rk_block_q6_K, ql);
        const uint8_t *qh = p + offsetof(rk_block_q6_K, qh);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, dst += 128) {
            for (int l = 0; l < 32; l += 8) {
                __m256i q[4];
                q6_unpack(ql + l, qh + l, q);
                for (int k = 0; k < 4; k++) {
                    const __m256 s = _mm256_broadcast_ss(&D[8 * h + l / 16 + 2 * k]);
                    _mm256_storeu_ps(dst + 32 * k + l, _mm256_mul_ps(s, cvt(q[k])));
                }
            }
        }
    }
}

/* Scales change every 16 elements: t = q*x over the 16, then fma(D, t, acc). */
float rk_quant_avx2_q6_K_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    __m256 acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q6_K)) {
        float D[16];
        q6_K_scales(p, D);
        const uint8_t *ql = p + offsetof(rk_block_q6_K, ql);
        const uint8_t *qh = p + offsetof(rk_block_q6_K, qh);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, x += 128) {
            for (int l = 0; l < 32; l += 16) {
                pf(ql + l);
                __m256i q0[4], q1[4];
                q6_unpack(ql + l, qh + l, q0);
                q6_unpack(ql + l + 8, qh + l + 8, q1);
                for (int k = 0; k < 4; k++) {
                    const float *xk = x + 32 * k + l;
                    __m256 t = _mm256_mul_ps(cvt(q0[k]), _mm256_loadu_ps(xk));
                    t = _mm256_fmadd_ps(cvt(q1[k]), _mm256_loadu_ps(xk + 8), t);
                    acc[k] = _mm256_fmadd_ps(_mm256_broadcast_ss(&D[8 * h + l / 16 + 2 * k]), t, acc[k]);
                }
            }
        }
    }
    return rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}
