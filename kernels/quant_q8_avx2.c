/* AVX2 activation quantisers and integer dot products (rk_qdot_fast): the
 * decode GEMV of the cpu backend. Weights stay in their ggml blocks; the f32
 * activation row is quantised once per MATMUL to 8-bit blocks (quant_impl.h)
 * and every weight row is dotted with it in integers: maddubs (u8 x s8 pairs
 * -> s16) and madd (s16 pairs -> s32), then one f32 FMA per block (Q4_0,
 * Q4_1, Q8_0) or per 256 elements (Q4_K, Q6_K). No s16 step can saturate:
 *   Q8_0 |q| <= 128 (sign trick: |w| as u8, y carries w's sign), |y| <= 127:
 *        2 * 128 * 127 = 32512;  Q4_0 |q - 8| <= 8: 2 * 8 * 127;
 *   Q4_1, Q4_K q <= 15: 2 * 15 * 127;  Q6_K q <= 63: 2 * 63 * 127 = 16002.
 * Only reached after rk_cpu_has_avx2(). Blocks are byte arrays at any
 * alignment: every load is unaligned. The quantisers produce the same bytes
 * as quant_q8_ref.c (same f32 operations; cvtps rounds to nearest even like
 * nearbyintf). */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quant_impl.h"
#include "rk_simd.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define RK_ACT_TINY 1e-30f /* as quant_q8_ref.c */
#ifndef RK_PF_DIST
#define RK_PF_DIST 2048 /* as quant_avx2.c: the weight stream, read once */
#endif

/* always_inline: as a plain static inline void function, GCC 12 took pf for const
 * (__builtin_prefetch has no side effects) and deleted its calls (docs/PERFORMANCE.md). */
static inline __attribute__((always_inline)) void pf(const uint8_t *p) {
#if RK_PF_DIST > 0
    _mm_prefetch((const char *)((uintptr_t)p + RK_PF_DIST), _MM_HINT_T0);
#else
    (void)p;
#endif
}


static inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m256i ldu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- quantisers ---------------------------------------------------------- */

/* amax of n (a multiple of 8) floats; false when one is NaN or +-Inf. */
static inline bool amax_of(const float *x, int n, float *amax) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 m = _mm256_setzero_ps(), bad = m;
    for (int j = 0; j < n; j += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* NaN or Inf */
        m = _mm256_max_ps(m, a);
    }
    if (_mm256_movemask_ps(bad)) return false;
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    *amax = _mm_cvtss_f32(s);
    return true;
}

/* 32 floats -> 32 int8 codes at dst, the four int32 code vectors in q[]. */
static inline void quant32(const float *x, __m256 id, int8_t *dst, __m256i q[4]) {
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
    /* packs work per 128-bit lane: the permute puts the 4-element groups back in order */
    const __m256i a = _mm256_packs_epi32(q[0], q[1]), b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i c = _mm256_packs_epi16(a, b);
    _mm256_storeu_si256((__m256i *)(void *)dst,
                        _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

static inline bool scale_of(const float *x, int n, float *d, float *id) {
    float amax;
    if (!amax_of(x, n, &amax)) return false;
    if (amax < RK_ACT_TINY) {
        *d = 0.0f;
        *id = 0.0f;
    } else {
        *d = amax / 127.0f;
        *id = 127.0f / amax;
    }
    return true;
}

void rk_qavx2_act_q8_32(const float *x, void *dst, int64_t n) {
    rk_act_q8_32 *b = dst;
    for (int64_t i = 0; i < n / 32; i++, b++, x += 32) {
        float d, id;
        if (!scale_of(x, 32, &d, &id)) {
            memset(b, 0, sizeof *b);
            b->d = NAN;
            continue;
        }
        __m256i q[4];
        b->d = d;
        quant32(x, _mm256_set1_ps(id), b->qs, q);
        b->sum = hsum8i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    }
}

void rk_qavx2_act_q8_K(const float *x, void *dst, int64_t n) {
    rk_act_q8_K *b = dst;
    for (int64_t i = 0; i < n / RK_QK_K; i++, b++, x += RK_QK_K) {
        float d, id;
        if (!scale_of(x, RK_QK_K, &d, &id)) {
            memset(b, 0, sizeof *b);
            b->d = NAN;
            continue;
        }
        b->d = d;
        const __m256 vid = _mm256_set1_ps(id);
        for (int g = 0; g < RK_QK_K / 32; g++) {
            __m256i q[4];
            quant32(x + 32 * g, vid, b->qs + 32 * g, q);
            /* [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, ...] -> lanes 0/1 + 4/5: the two sums of 16 */
            __m256i t = _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            t = _mm256_hadd_epi32(t, t);
            const __m128i r = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            b->bsums[2 * g] = (int16_t)_mm_cvtsi128_si32(r);
            b->bsums[2 * g + 1] = (int16_t)_mm_extract_epi32(r, 1);
        }
    }
}

/* ---- dots ----------------------------------------------------------------
 * Each kernel takes one weight row and R activation rows (R = 1: the GEMV dot;
 * R = 4: prefill, the weight unpacked once for four rows). Every pair has its
 * own accumulators and sees the same operations in the same order whatever R,
 * so dot_x4 returns exactly what four dot calls would. */
#define RK_AI static inline __attribute__((always_inline))
#define FOR_R _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)

/* |a| as u8 and b with a's sign: their maddubs is sum a_i b_i for s8 a (any
 * value) and s8 b in [-127, 127]. */
RK_AI __m256i madd1(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

static inline float hsum4(__m128 m) {
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 16 bytes of nibbles -> 32 u8: low nibbles elements 0..15, high 16..31. */
RK_AI __m256i nib32(const uint8_t *qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

/* Q8_0 (signed codes, any value) and Q4_0 (q - 8): sign trick per block. */
RK_AI void q8_0_rows(const uint8_t *p, const uint8_t *xq, size_t ys, int64_t n, int R, float *out, bool is_q4) {
    const size_t bs = is_q4 ? sizeof(rk_block_q4_0) : sizeof(rk_block_q8_0);
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc[4];
    FOR_R acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++, p += bs) {
        if (!(i & 1)) pf(p);
        const __m256i q = is_q4 ? _mm256_sub_epi8(nib32(p + 2), eight) : ldu(p + 2);
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float dw = f16(p);
        FOR_R {
            const rk_act_q8_32 *y = (const rk_act_q8_32 *)(const void *)(xq + r * ys) + i;
            const __m256i s = madd1(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(ldu(y->qs), q)));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y->d), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    FOR_R out[r] = rk_simd_hsum8(acc[r]);
}

/* Q4_1: w = q d + m, so sum w x = d dx sum(q y) + m dx sum(y). */
RK_AI void q4_1_rows(const uint8_t *p, const uint8_t *xq, size_t ys, int64_t n, int R, float *out) {
    __m256 acc[4];
    float summ[4];
    FOR_R acc[r] = _mm256_setzero_ps(), summ[r] = 0.0f;
    for (int64_t i = 0; i < n / 32; i++, p += sizeof(rk_block_q4_1)) {
        if (!(i & 1)) pf(p);
        const __m256i q = nib32(p + 4);
        const float dw = f16(p), mw = f16(p + 2);
        FOR_R {
            const rk_act_q8_32 *y = (const rk_act_q8_32 *)(const void *)(xq + r * ys) + i;
            const __m256i s = madd1(_mm256_maddubs_epi16(q, ldu(y->qs)));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y->d), _mm256_cvtepi32_ps(s), acc[r]);
            summ[r] += mw * (y->d * (float)y->sum);
        }
    }
    FOR_R out[r] = rk_simd_hsum8(acc[r]) + summ[r];
}

/* The 8 scales and 8 mins of a q4_K block as bytes (see quant_avx2.c). */
RK_AI void q4k_sm(const uint8_t *s12, uint64_t *sc8, uint64_t *m8) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
    *sc8 = (uint64_t)sc_hi << 32 | sc_lo;
    *m8 = (uint64_t)m_hi << 32 | m_lo;
}

/* Per block: dx * (d * sum_j sc_j sum(q y) - dmin * sum_j m_j sum(y)), the
 * min part from the activation's 16-sums (pairs of them per sub-block). */
RK_AI void q4_K_rows(const uint8_t *p, const uint8_t *xq, size_t ys, int64_t n, int R, float *out) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc[4];
    __m128 accm[4];
    FOR_R acc[r] = _mm256_setzero_ps(), accm[r] = _mm_setzero_ps();
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q4_K)) {
        const uint8_t *qs = p + offsetof(rk_block_q4_K, qs);
        pf(qs);
        pf(qs + 64);
        uint64_t sc8, m8;
        q4k_sm(p + offsetof(rk_block_q4_K, scales), &sc8, &m8);
        const float dw = f16(p), dmw = f16(p + 2);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m8));
        /* the 8 scales as s16 in both lanes; chunk c's two are picked by a byte shuffle */
        const __m256i scb = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        __m256i sumi[4];
        FOR_R {
            const rk_act_q8_K *y = (const rk_act_q8_K *)(const void *)(xq + r * ys) + i;
            const __m256i bs = ldu(y->bsums);
            const __m128i bsp = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            accm[r] = _mm_fmadd_ps(_mm_set1_ps(y->d * dmw), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bsp)), accm[r]);
            sumi[r] = _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) {
            const __m256i b = ldu(qs + 32 * c);
            const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            const __m256i slo = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
            const __m256i shi = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
            FOR_R {
                const rk_act_q8_K *y = (const rk_act_q8_K *)(const void *)(xq + r * ys) + i;
                const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ldu(y->qs + 64 * c)), slo);
                const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ldu(y->qs + 64 * c + 32)), shi);
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(plo, phi));
            }
        }
        FOR_R {
            const rk_act_q8_K *y = (const rk_act_q8_K *)(const void *)(xq + r * ys) + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    FOR_R out[r] = rk_simd_hsum8(acc[r]) - hsum4(accm[r]);
}

/* Per block: dx * d * (sum_e sc[e/16] q_e y_e - 32 sum_k sc_k bsums_k), q the
 * unsigned 6-bit code (0..63), so maddubs takes it as the u8 operand. */
RK_AI void q6_K_rows(const uint8_t *p, const uint8_t *xq, size_t ys, int64_t n, int R, float *out) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m256i m0c = _mm256_set1_epi8(0x0c), m30 = _mm256_set1_epi8(0x30), mc0 = _mm256_set1_epi8((char)0xc0);
    __m256 acc[4];
    FOR_R acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q6_K)) {
        const uint8_t *ql = p + offsetof(rk_block_q6_K, ql);
        const uint8_t *qh = p + offsetof(rk_block_q6_K, qh);
        const int8_t *sc = (const int8_t *)(p + offsetof(rk_block_q6_K, scales));
        pf(ql);
        pf(ql + 64);
        pf(ql + 128);
        pf(ql + 192);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc));
        /* half h's 8 scales (s16) in both lanes: part k takes 2k in the low lane, 2k + 1 in the high */
        const __m256i sch[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
        const float dw = f16(p + offsetof(rk_block_q6_K, d));
        __m256i sumi[4];
        FOR_R {
            const rk_act_q8_K *y = (const rk_act_q8_K *)(const void *)(xq + r * ys) + i;
            sumi[r] = _mm256_setzero_si256();
            sumi[r] = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(_mm256_madd_epi16(sc16, ldu(y->bsums)), 5));
        }
        for (int h = 0; h < 2; h++) {
            const __m256i a = ldu(ql + 64 * h), b = ldu(ql + 64 * h + 32), hb = ldu(qh + 32 * h);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m0c), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                   _mm256_srli_epi16(_mm256_and_si256(hb, mc0), 2));
            for (int k = 0; k < 4; k++) {
                /* elements 128h + 32k + l: scale 8h + 2k for l < 16 (low lane), 8h + 2k + 1 above */
                const __m256i sv = _mm256_shuffle_epi8(
                    sch[h], _mm256_setr_m128i(_mm_set1_epi16((short)((4 * k + 1) << 8 | 4 * k)),
                                              _mm_set1_epi16((short)((4 * k + 3) << 8 | (4 * k + 2)))));
                FOR_R {
                    const rk_act_q8_K *y = (const rk_act_q8_K *)(const void *)(xq + r * ys) + i;
                    const __m256i pq = _mm256_maddubs_epi16(q[k], ldu(y->qs + 128 * h + 32 * k));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(pq, sv));
                }
            }
        }
        FOR_R {
            const rk_act_q8_K *y = (const rk_act_q8_K *)(const void *)(xq + r * ys) + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    FOR_R out[r] = rk_simd_hsum8(acc[r]);
}

/* ---- W weight rows against one activation row (decode) --------------------
 * Weight rows w + r ws (r < W), the activation loads shared. Q4_1 per block and
 * row: the 16 nibble bytes broadcast to both lanes, the high lane shifted right by
 * 4 (srlv on 64-bit lanes; the mask drops what crossed a byte), one maddubs/madd;
 * the block's f16 pair (d, m) converted as a vector [d, m, d, m, ...] and
 * multiplied once by the activation's [dy, dy * sum(y), ...]: lane 0 is the FMA's
 * scale d dy, lane 1 the min term m dy sum(y), accumulated lane-wise (lane 1 sees
 * the same additions in the same order as a scalar sum). The same f32 operations
 * as a per-block scalar dw * dy and summ += m (dy sum), so every W gives the
 * same bits for a row. */
#define FOR_W _Pragma("GCC unroll 4") for (int r = 0; r < W; r++)

RK_AI __m256 dm_pair(const uint8_t *p) { /* f16 (d, m) at p -> [d, m, d, m, ...] */
    float v;
    memcpy(&v, p, 4);
    return _mm256_cvtph_ps(_mm_castps_si128(_mm_set1_ps(v)));
}

RK_AI void q4_1_w(const uint8_t *p, size_t ws, const uint8_t *xq, int64_t n, int W, float *out) {
    const __m256i m4 = _mm256_set1_epi8(15), sh = _mm256_setr_epi64x(0, 0, 4, 4);
    __m256 acc[4], accm[4];
    FOR_W acc[r] = _mm256_setzero_ps(), accm[r] = _mm256_setzero_ps();
    const rk_act_q8_32 *y = (const rk_act_q8_32 *)(const void *)xq;
    for (int64_t i = 0; i < n / 32; i++, p += sizeof(rk_block_q4_1), y++) {
        const __m256i yq = ldu(y->qs);
        const float dy = y->d, ys = dy * (float)y->sum;
        const __m256 yy = _mm256_setr_ps(dy, ys, dy, ys, dy, ys, dy, ys);
        FOR_W {
            const uint8_t *pr = p + r * ws;
            if (!(i & 1)) pf(pr);
            const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(pr + 4)));
            const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(b, sh), m4);
            const __m256i s = madd1(_mm256_maddubs_epi16(q, yq));
            const __m256 pm = _mm256_mul_ps(dm_pair(pr), yy); /* [d dy, m dy sum(y), ...] */
            acc[r] = _mm256_fmadd_ps(_mm256_moveldup_ps(pm), _mm256_cvtepi32_ps(s), acc[r]);
            accm[r] = _mm256_add_ps(accm[r], pm);
        }
    }
    FOR_W out[r] = rk_simd_hsum8(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(_mm256_castps256_ps128(accm[r])));
}

void rk_qavx2_q4_1_dot_2w(const void *w, size_t ws, const void *xq, int64_t n, float *out) {
    q4_1_w(w, ws, xq, n, 2, out);
}

#define RK_QDOT_PAIR(t, call1, call4)                                    \
    float rk_qavx2_##t##_dot(const void *w, const void *xq, int64_t n) { \
        float o[1];                                                      \
        call1;                                                           \
        return o[0];                                                     \
    }                                                                    \
    void rk_qavx2_##t##_dot_x4(const void *w, const void *xq, size_t ys, int64_t n, float *o) { call4; }

RK_QDOT_PAIR(q8_0, q8_0_rows(w, xq, 0, n, 1, o, false), q8_0_rows(w, xq, ys, n, 4, o, false))
RK_QDOT_PAIR(q4_0, q8_0_rows(w, xq, 0, n, 1, o, true), q8_0_rows(w, xq, ys, n, 4, o, true))
RK_QDOT_PAIR(q4_1, q4_1_w(w, 0, xq, n, 1, o), q4_1_rows(w, xq, ys, n, 4, o))
RK_QDOT_PAIR(q4_K, q4_K_rows(w, xq, 0, n, 1, o), q4_K_rows(w, xq, ys, n, 4, o))
RK_QDOT_PAIR(q6_K, q6_K_rows(w, xq, 0, n, 1, o), q6_K_rows(w, xq, ys, n, 4, o))
