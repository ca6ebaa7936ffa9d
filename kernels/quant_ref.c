/* Scalar reference row functions: the oracle every faster version is tested
 * against. Dequantisation reproduces ggml's to_float bit for bit (same operations
 * in the same order, each rounded to f32); dot products dequantise to f32 and
 * accumulate w*x in double. Never optimised. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quant_impl.h"

/* Same operations in ggml's order, each rounded to f32. (With f16 scales and
 * small integers every product here is exact, so only the last operation of an
 * element rounds; keeping the order makes that argument unnecessary.) */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rk_f16_to_f32(h);
}

static float ld_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rk_bf16_to_f32(h);
}

/* ---- one block -> f32 ---------------------------------------------- */

static void blk_q4_0(const uint8_t *b, float *y) {
    const float d = ld_f16(b + offsetof(rk_block_q4_0, d));
    const uint8_t *qs = b + offsetof(rk_block_q4_0, qs);
    for (int j = 0; j < RK_QK4_0 / 2; j++) {
        const int x0 = (qs[j] & 0xF) - 8;
        const int x1 = (qs[j] >> 4) - 8;
        y[j] = (float)x0 * d;
        y[j + RK_QK4_0 / 2] = (float)x1 * d;
    }
}

static void blk_q4_1(const uint8_t *b, float *y) {
    const float d = ld_f16(b + offsetof(rk_block_q4_1, d));
    const float m = ld_f16(b + offsetof(rk_block_q4_1, m));
    const uint8_t *qs = b + offsetof(rk_block_q4_1, qs);
    for (int j = 0; j < RK_QK4_1 / 2; j++) {
        y[j] = (float)(qs[j] & 0xF) * d + m;
        y[j + RK_QK4_1 / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

static void blk_q8_0(const uint8_t *b, float *y) {
    const float d = ld_f16(b + offsetof(rk_block_q8_0, d));
    const int8_t *qs = (const int8_t *)(b + offsetof(rk_block_q8_0, qs));
    for (int j = 0; j < RK_QK8_0; j++) y[j] = (float)qs[j] * d;
}

static void blk_q4_K(const uint8_t *b, float *y) {
    const float d = ld_f16(b + offsetof(rk_block_q4_K, d));
    const float dmin = ld_f16(b + offsetof(rk_block_q4_K, dmin));
    const uint8_t *s = b + offsetof(rk_block_q4_K, scales);
    const uint8_t *q = b + offsetof(rk_block_q4_K, qs);
    for (int c = 0; c < 4; c++, q += 32) {
        uint8_t sc, m;
        rk_q4k_scale_min(2 * c, s, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        rk_q4k_scale_min(2 * c + 1, s, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
    }
}

static void blk_q6_K(const uint8_t *b, float *y) {
    const float d = ld_f16(b + offsetof(rk_block_q6_K, d));
    const uint8_t *ql = b + offsetof(rk_block_q6_K, ql);
    const uint8_t *qh = b + offsetof(rk_block_q6_K, qh);
    const int8_t *sc = (const int8_t *)(b + offsetof(rk_block_q6_K, scales));
    for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is + 0] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

/* ---- rows ------------------------------------------------------------ */

void rk_quant_ref_f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

float rk_quant_ref_f32_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        acc += (double)v * (double)x[i];
    }
    return (float)acc;
}

void rk_quant_ref_f16_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ld_f16(p + 2 * i);
}

float rk_quant_ref_f16_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) acc += (double)ld_f16(p + 2 * i) * (double)x[i];
    return (float)acc;
}

void rk_quant_ref_bf16_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ld_bf16(p + 2 * i);
}

float rk_quant_ref_bf16_dot(const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) acc += (double)ld_bf16(p + 2 * i) * (double)x[i];
    return (float)acc;
}

/* Block types: dequantise one block into tmp, then accumulate in double. */
#define RK_REF_BLOCK_ROW(t, QK, BYTES)                                                      \
    void rk_quant_ref_##t##_to_f32(const void *src, float *dst, int64_t n) {                \
        const uint8_t *p = src;                                                             \
        for (int64_t i = 0; i < n / (QK); i++) blk_##t(p + i * (BYTES), dst + i * (QK));    \
    }                                                                                       \
    float rk_quant_ref_##t##_dot(const void *w, const float *x, int64_t n) {                \
        const uint8_t *p = w;                                                               \
        float tmp[QK];                                                                      \
        double acc = 0.0;                                                                   \
        for (int64_t i = 0; i < n / (QK); i++) {                                            \
            blk_##t(p + i * (BYTES), tmp);                                                  \
            for (int j = 0; j < (QK); j++) acc += (double)tmp[j] * (double)x[i * (QK) + j]; \
        }                                                                                   \
        return (float)acc;                                                                  \
    }

RK_REF_BLOCK_ROW(q4_0, RK_QK4_0, sizeof(rk_block_q4_0))
RK_REF_BLOCK_ROW(q4_1, RK_QK4_1, sizeof(rk_block_q4_1))
RK_REF_BLOCK_ROW(q8_0, RK_QK8_0, sizeof(rk_block_q8_0))
RK_REF_BLOCK_ROW(q4_K, RK_QK_K, sizeof(rk_block_q4_K))
RK_REF_BLOCK_ROW(q6_K, RK_QK_K, sizeof(rk_block_q6_K))

/* ---- f32 -> q8_0 ------------------------------------------------------ */
/* llama.cpp's quantize_row_q8_0_ref (q from the f32 scale, roundf: ties away
 * from zero), plus a NaN block where the int8 codes cannot represent the row. */
void rk_quant_q8_0_from_f32(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n / RK_QK8_0; i++, p += sizeof(rk_block_q8_0), src += RK_QK8_0) {
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < RK_QK8_0; j++) {
            const float a = fabsf(src[j]);
            finite = finite && isfinite(a);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f;
        uint16_t dh = rk_f32_to_f16(d);
        int8_t *qs = (int8_t *)(p + offsetof(rk_block_q8_0, qs));
        if (!finite || (dh & 0x7c00u) == 0x7c00u) {
            dh = 0x7e00u; /* f16 quiet NaN */
            memset(qs, 0, RK_QK8_0);
        } else {
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < RK_QK8_0; j++) qs[j] = (int8_t)roundf(src[j] * id);
        }
        memcpy(p + offsetof(rk_block_q8_0, d), &dh, 2);
    }
}
