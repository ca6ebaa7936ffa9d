/* AVX2/FMA/F16C vector kernels of the cpu backend. Compiled with -mavx2 -mfma
 * -mf16c; reached only through rk_cpu_kern_avx2 after rk_cpu_has_avx2(). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops_impl.h"
#include "rk_simd.h"

/* Lanes [0, r) set: mask for a partial 8-float load or store, 0 < r < 8. */
static inline __m256i tail_mask(int64_t r) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - r));
}

/* {hsum(a), hsum(b), hsum(c), hsum(d)} */
static inline __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 t0 = _mm256_hadd_ps(a, b);
    __m256 t1 = _mm256_hadd_ps(c, d);
    __m256 t2 = _mm256_hadd_ps(t0, t1);
    return _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
}

/* exp with ~1 ulp error on [-86.5, 88.72]; +inf above, 0 below, NaN kept
 * (max/min put x second so a NaN passes through). */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.7228391f), lo = _mm256_set1_ps(-86.5f);
    __m256 n, y = rk_simd_exp8_poly(_mm256_min_ps(hi, _mm256_max_ps(lo, x)), &n);
    /* 2^n as 2^(n-1) * 2: n reaches 128 near the top of the range */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
    y = _mm256_mul_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
}

static float avx2_dot(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
    }
    return rk_simd_hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* 3x4 block of dot products over k: x rows x[0..2] against w rows w[0..3].
 * 12 accumulators + 3 x vectors + 1 w vector = the 16 ymm registers; per 8
 * elements 7 loads feed 12 FMAs. Rows/columns past the edge point at valid
 * memory (the caller clamps); only the nr x nc valid part is stored. */
static void gemm_nt_3x4(int64_t k, const float *const x[3], const float *const w[4], float *y, int64_t ldy, int nr,
                        int nc) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
    __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2];
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
#define RK_STEP(LOAD)                                                     \
    do {                                                                  \
        __m256 a0 = LOAD(x0), a1 = LOAD(x1), a2 = LOAD(x2), b = LOAD(w0); \
        c00 = _mm256_fmadd_ps(a0, b, c00);                                \
        c10 = _mm256_fmadd_ps(a1, b, c10);                                \
        c20 = _mm256_fmadd_ps(a2, b, c20);                                \
        b = LOAD(w1);                                                     \
        c01 = _mm256_fmadd_ps(a0, b, c01);                                \
        c11 = _mm256_fmadd_ps(a1, b, c11);                                \
        c21 = _mm256_fmadd_ps(a2, b, c21);                                \
        b = LOAD(w2);                                                     \
        c02 = _mm256_fmadd_ps(a0, b, c02);                                \
        c12 = _mm256_fmadd_ps(a1, b, c12);                                \
        c22 = _mm256_fmadd_ps(a2, b, c22);                                \
        b = LOAD(w3);                                                     \
        c03 = _mm256_fmadd_ps(a0, b, c03);                                \
        c13 = _mm256_fmadd_ps(a1, b, c13);                                \
        c23 = _mm256_fmadd_ps(a2, b, c23);                                \
    } while (0)
    int64_t p = 0;
#define RK_LD(ptr) _mm256_loadu_ps((ptr) + p)
    for (; p + 8 <= k; p += 8) RK_STEP(RK_LD);
#undef RK_LD
    if (p < k) {
        __m256i m = tail_mask(k - p);
#define RK_LD(ptr) _mm256_maskload_ps((ptr) + p, m)
        RK_STEP(RK_LD);
#undef RK_LD
    }
#undef RK_STEP
    __m128 s[3] = {hsum8x4(c00, c01, c02, c03), hsum8x4(c10, c11, c12, c13), hsum8x4(c20, c21, c22, c23)};
    for (int r = 0; r < nr; r++) {
        if (nc == 4) {
            _mm_storeu_ps(y + r * ldy, s[r]);
        } else {
            float t[4];
            _mm_storeu_ps(t, s[r]);
            memcpy(y + r * ldy, t, (size_t)nc * sizeof(float));
        }
    }
}

static void avx2_gemm_nt(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                         float *y, int64_t ldy) {
    /* x rows in blocks of 3 stay in L1 while the weight tile (sized by the
     * caller to sit in L2) streams past them. */
    for (int64_t i = 0; i < n; i += 3) {
        int nr = n - i < 3 ? (int)(n - i) : 3;
        const float *xr[3];
        for (int r = 0; r < 3; r++) xr[r] = x + (i + (r < nr ? r : nr - 1)) * ldx;
        for (int64_t j = 0; j < m; j += 4) {
            int nc = m - j < 4 ? (int)(m - j) : 4;
            const float *wr[4];
            for (int q = 0; q < 4; q++) wr[q] = w + (j + (q < nc ? q : nc - 1)) * ldw;
            gemm_nt_3x4(k, xr, wr, y + i * ldy + j, ldy, nr, nc);
        }
    }
}

static void avx2_f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = rk_f16_to_f32(src[i]);
}

static void avx2_f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = rk_f32_to_f16(src[i]);
}

static float avx2_sumsq(const float *x, int64_t n) { return avx2_dot(x, x, n); }

static void avx2_scale_mul(float *dst, const float *x, float s, const float *w, int64_t n) {
    __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) dst[i] = x[i] * s * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
        for (; i < n; i++) dst[i] = x[i] * s;
    }
}

static void avx2_silu_mul(float *dst, const float *a, const float *b, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 av = _mm256_loadu_ps(a + i);
        __m256 e = exp8(_mm256_xor_ps(av, neg));
        __m256 s = _mm256_div_ps(av, _mm256_add_ps(one, e));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(s, _mm256_loadu_ps(b + i)));
    }
    for (; i < n; i++) dst[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

static void avx2_add(float *dst, const float *a, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(a + i)));
    for (; i < n; i++) dst[i] += a[i];
}

static float avx2_exp_sub(float *s, int64_t n, float m) {
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float tail = 0;
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(s + i, mk), mv));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(s + i, mk, e);
        tail = rk_simd_hsum8(e);
    }
    return rk_simd_hsum8(sum) + tail;
}

static void avx2_pv(float *acc, float alpha, const float *p, const float *v, int64_t ldv, int64_t n, int64_t hd) {
    const __m256 al = _mm256_set1_ps(alpha);
    int64_t d = 0;
    /* 64 columns = 8 accumulators held across the key loop */
    for (; d + 64 <= hd; d += 64) {
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8 * u), al);
        for (int64_t j = 0; j < n; j++) {
            __m256 pj = _mm256_set1_ps(p[j]);
            const float *vr = v + j * ldv + d;
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * u), a[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + d + 8 * u, a[u]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d), al);
        for (int64_t j = 0; j < n; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * ldv + d), a);
        _mm256_storeu_ps(acc + d, a);
    }
    for (; d < hd; d++) {
        float a = acc[d] * alpha;
        for (int64_t j = 0; j < n; j++) a += p[j] * v[j * ldv + d];
        acc[d] = a;
    }
}

/* ---- decode-shaped attention on cache rows as stored -------------------------------- */
/* 8 values of a cache row's head from element e (e % 8 == 0) as f32; for q8_0, d is the
 * scale of the block holding e (the caller reads it once per block). Inlined with a
 * constant type, so each kernel below is compiled once per type. */
static inline __attribute__((always_inline)) __m256 row8(uint32_t type, const char *row, int64_t e, __m256 d) {
    if (type == RK_DT_F32) return _mm256_loadu_ps((const float *)row + e);
    if (type == RK_DT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e)));
    const int8_t *q = (const int8_t *)(row + (e / 32) * 34 + 2 + e % 32);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), d);
}

/* the q8_0 scale of the block holding element e, broadcast (other types: unused) */
static inline __attribute__((always_inline)) __m256 row_scale(uint32_t type, const char *row, int64_t e) {
    if (type != RK_DT_Q8_0) return _mm256_setzero_ps();
    uint16_t h;
    memcpy(&h, row + (e / 32) * 34, 2);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

/* The head's bytes of the row pf rows ahead (0: none), into L2: a long cache streams from
 * memory, and the hardware's prefetch does not keep up with rows read a head at a time
 * (a prefetch past the cache's end never faults and is dropped). */
static inline __attribute__((always_inline)) void prefetch_ahead(uint32_t type, const char *row, size_t nb, int64_t hd,
                                                                 int64_t pf) {
    if (pf <= 0) return;
    const size_t bytes = type == RK_DT_F32 ? (size_t)hd * 4 : type == RK_DT_F16 ? (size_t)hd * 2 : (size_t)hd / 32 * 34;
    const char *p = row + (size_t)pf * nb;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 1);
}

/* R query rows (R <= 6) against K keys at once (R * K <= 12 accumulators): every key
 * vector is converted once and meets the R rows in registers. */
static inline __attribute__((always_inline)) void qk_block(uint32_t type, int R, int K, const float *q, int64_t ldq,
                                                           const char *const *kr, size_t nb, int64_t hd, float *s,
                                                           int64_t lds, int nk, int64_t pf) {
    __m256 acc[12];
    for (int i = 0; i < R * K; i++) acc[i] = _mm256_setzero_ps();
    for (int c = 0; c < K; c++) prefetch_ahead(type, kr[c], nb, hd, pf);
    for (int64_t e0 = 0; e0 < hd; e0 += 32) {
        __m256 d[4];
        for (int c = 0; c < K; c++) d[c] = row_scale(type, kr[c], e0);
        for (int64_t e = e0; e < e0 + 32; e += 8) {
            __m256 kv[4];
            for (int c = 0; c < K; c++) kv[c] = row8(type, kr[c], e, d[c]);
            for (int r = 0; r < R; r++) {
                const __m256 qv = _mm256_loadu_ps(q + r * ldq + e);
                for (int c = 0; c < K; c++) acc[r * K + c] = _mm256_fmadd_ps(qv, kv[c], acc[r * K + c]);
            }
        }
    }
    float sums[12];
    for (int i = 0; i < R * K; i += 4) { /* R * K is 4, 6, 8, 10 or 12 */
        const __m256 z = _mm256_setzero_ps();
        _mm_storeu_ps(sums + i,
                      hsum8x4(acc[i], acc[i + 1], i + 2 < R * K ? acc[i + 2] : z, i + 3 < R * K ? acc[i + 3] : z));
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < nk; c++) s[r * lds + c] = sums[r * K + c];
}

static inline __attribute__((always_inline)) void qk_type(uint32_t type, int nr, const float *q, int64_t ldq,
                                                          const char *k, size_t nb, int64_t n, int64_t hd, float *s,
                                                          int64_t lds, int64_t pf) {
    for (int r0 = 0; r0 < nr; r0 += 6) {
        const int R = nr - r0 < 6 ? nr - r0 : 6;
        const float *qr = q + r0 * ldq;
        float *sr = s + r0 * lds;
        const int K = R <= 3 ? 4 : 2;
        for (int64_t j = 0; j < n; j += K) {
            const int nk = n - j < K ? (int)(n - j) : K;
            const char *kr[4];
            for (int c = 0; c < K; c++) kr[c] = k + (size_t)(j + (c < nk ? c : nk - 1)) * nb;
            switch (R) { /* constant R and K: the accumulators stay in registers */
            case 1: qk_block(type, 1, 4, qr, ldq, kr, nb, hd, sr + j, lds, nk, pf); break;
            case 2: qk_block(type, 2, 4, qr, ldq, kr, nb, hd, sr + j, lds, nk, pf); break;
            case 3: qk_block(type, 3, 4, qr, ldq, kr, nb, hd, sr + j, lds, nk, pf); break;
            case 4: qk_block(type, 4, 2, qr, ldq, kr, nb, hd, sr + j, lds, nk, pf); break;
            case 5: qk_block(type, 5, 2, qr, ldq, kr, nb, hd, sr + j, lds, nk, pf); break;
            default: qk_block(type, 6, 2, qr, ldq, kr, nb, hd, sr + j, lds, nk, pf); break;
            }
        }
    }
}

static void avx2_qk_rows(uint32_t type, int nr, const float *q, int64_t ldq, const char *k, size_t nb, int64_t n,
                         int64_t hd, float *s, int64_t lds, int64_t pf) {
    if (type == RK_DT_F16) qk_type(RK_DT_F16, nr, q, ldq, k, nb, n, hd, s, lds, pf);
    else if (type == RK_DT_Q8_0) qk_type(RK_DT_Q8_0, nr, q, ldq, k, nb, n, hd, s, lds, pf);
    else qk_type(RK_DT_F32, nr, q, ldq, k, nb, n, hd, s, lds, pf);
}

/* R rows (R <= 6) over C vectors of 8 columns (R * C <= 12 accumulators) from column d0:
 * each value vector is converted once per key and meets the R rows' probabilities. */
static inline __attribute__((always_inline)) void pv_block(uint32_t type, int R, int C, float *acc, int64_t ldacc,
                                                           const float *alpha, const float *p, int64_t ldp,
                                                           const char *v, size_t nb, int64_t n, int64_t hd, int64_t d0,
                                                           int64_t pf) {
    __m256 a[12];
    for (int r = 0; r < R; r++) {
        const __m256 al = _mm256_set1_ps(alpha[r]);
        for (int c = 0; c < C; c++) a[r * C + c] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * ldacc + d0 + 8 * c), al);
    }
    for (int64_t j = 0; j < n; j++) {
        const char *row = v + (size_t)j * nb;
        if (d0 == 0) prefetch_ahead(type, row, nb, hd, pf);
        const __m256 d = row_scale(type, row, d0); /* C * 8 <= 32 columns: one block */
        __m256 vv[4];
        for (int c = 0; c < C; c++) vv[c] = row8(type, row, d0 + 8 * c, d);
        for (int r = 0; r < R; r++) {
            const __m256 pj = _mm256_broadcast_ss(p + r * ldp + j);
            for (int c = 0; c < C; c++) a[r * C + c] = _mm256_fmadd_ps(pj, vv[c], a[r * C + c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) _mm256_storeu_ps(acc + r * ldacc + d0 + 8 * c, a[r * C + c]);
}

static inline __attribute__((always_inline)) void pv_type(uint32_t type, int nr, float *acc, int64_t ldacc,
                                                          const float *alpha, const float *p, int64_t ldp,
                                                          const char *v, size_t nb, int64_t n, int64_t hd, int64_t pf) {
    for (int r0 = 0; r0 < nr; r0 += 6) {
        const int R = nr - r0 < 6 ? nr - r0 : 6;
        float *ar = acc + r0 * ldacc;
        const float *al = alpha + r0, *pr = p + r0 * ldp;
        const int64_t step = R <= 3 ? 32 : 16;
        for (int64_t d0 = 0; d0 < hd; d0 += step) switch (R) {
            case 1: pv_block(type, 1, 4, ar, ldacc, al, pr, ldp, v, nb, n, hd, d0, pf); break;
            case 2: pv_block(type, 2, 4, ar, ldacc, al, pr, ldp, v, nb, n, hd, d0, pf); break;
            case 3: pv_block(type, 3, 4, ar, ldacc, al, pr, ldp, v, nb, n, hd, d0, pf); break;
            case 4: pv_block(type, 4, 2, ar, ldacc, al, pr, ldp, v, nb, n, hd, d0, pf); break;
            case 5: pv_block(type, 5, 2, ar, ldacc, al, pr, ldp, v, nb, n, hd, d0, pf); break;
            default: pv_block(type, 6, 2, ar, ldacc, al, pr, ldp, v, nb, n, hd, d0, pf); break;
            }
    }
}

static void avx2_pv_rows(uint32_t type, int nr, float *acc, int64_t ldacc, const float *alpha, const float *p,
                         int64_t ldp, const char *v, size_t nb, int64_t n, int64_t hd, int64_t pf) {
    if (type == RK_DT_F16) pv_type(RK_DT_F16, nr, acc, ldacc, alpha, p, ldp, v, nb, n, hd, pf);
    else if (type == RK_DT_Q8_0) pv_type(RK_DT_Q8_0, nr, acc, ldacc, alpha, p, ldp, v, nb, n, hd, pf);
    else pv_type(RK_DT_F32, nr, acc, ldacc, alpha, p, ldp, v, nb, n, hd, pf);
}

const rk_cpu_kern rk_cpu_kern_avx2 = {
    .name = "avx2",
    .dot = avx2_dot,
    .gemm_nt = avx2_gemm_nt,
    .f16_to_f32 = avx2_f16_to_f32,
    .f32_to_f16 = avx2_f32_to_f16,
    .sumsq = avx2_sumsq,
    .scale_mul = avx2_scale_mul,
    .silu_mul = avx2_silu_mul,
    .add = avx2_add,
    .exp_sub = avx2_exp_sub,
    .pv = avx2_pv,
    .qk_rows = avx2_qk_rows,
    .pv_rows = avx2_pv_rows,
};
