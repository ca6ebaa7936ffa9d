/* Scalar activation quantisers and integer dot products (rk_qdot_ref): the
 * definition the AVX2 versions (quant_q8_avx2.c) are tested against. The
 * integer part of every block is exact; the scales combine in double. */
#include <math.h>
#include <string.h>

#include "quant_impl.h"

/* Below this amax, 127 / amax would overflow f32: the block reads as zeros
 * (every |x| < 1e-30, an error far under any f32 rounding of the dot). */
#define RK_ACT_TINY 1e-30f

/* d and 1/d of a block, or false when it holds a NaN or +-Inf. */
static bool act_scale(const float *x, int n, float *d, float *id) {
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < n; j++) {
        const float a = fabsf(x[j]);
        finite = finite && isfinite(a);
        amax = a > amax ? a : amax;
    }
    if (!finite) return false;
    if (amax < RK_ACT_TINY) {
        *d = 0.0f;
        *id = 0.0f;
    } else {
        *d = amax / 127.0f;
        *id = 127.0f / amax;
    }
    return true;
}

void rk_qref_act_q8_32(const float *x, void *dst, int64_t n) {
    rk_act_q8_32 *b = dst;
    for (int64_t i = 0; i < n / 32; i++, b++, x += 32) {
        float d, id;
        memset(b, 0, sizeof *b);
        if (!act_scale(x, 32, &d, &id)) {
            b->d = NAN;
            continue;
        }
        b->d = d;
        for (int j = 0; j < 32; j++) {
            b->qs[j] = (int8_t)nearbyintf(x[j] * id);
            b->sum += b->qs[j];
        }
    }
}

void rk_qref_act_q8_K(const float *x, void *dst, int64_t n) {
    rk_act_q8_K *b = dst;
    for (int64_t i = 0; i < n / RK_QK_K; i++, b++, x += RK_QK_K) {
        float d, id;
        memset(b, 0, sizeof *b);
        if (!act_scale(x, RK_QK_K, &d, &id)) {
            b->d = NAN;
            continue;
        }
        b->d = d;
        for (int j = 0; j < RK_QK_K; j++) {
            b->qs[j] = (int8_t)nearbyintf(x[j] * id);
            b->bsums[j / 16] = (int16_t)(b->bsums[j / 16] + b->qs[j]);
        }
    }
}

static float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rk_f16_to_f32(h);
}

float rk_qref_q8_0_dot(const void *w, const void *xq, int64_t n) {
    const uint8_t *p = w;
    const rk_act_q8_32 *y = xq;
    double acc = 0.0;
    for (int64_t i = 0; i < n / 32; i++, p += sizeof(rk_block_q8_0), y++) {
        const int8_t *q = (const int8_t *)(p + offsetof(rk_block_q8_0, qs));
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += q[j] * y->qs[j];
        acc += (double)f16(p) * y->d * s;
    }
    return (float)acc;
}

float rk_qref_q4_0_dot(const void *w, const void *xq, int64_t n) {
    const uint8_t *p = w;
    const rk_act_q8_32 *y = xq;
    double acc = 0.0;
    for (int64_t i = 0; i < n / 32; i++, p += sizeof(rk_block_q4_0), y++) {
        const uint8_t *q = p + offsetof(rk_block_q4_0, qs);
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += ((q[j] & 15) - 8) * y->qs[j] + ((q[j] >> 4) - 8) * y->qs[j + 16];
        acc += (double)f16(p) * y->d * s;
    }
    return (float)acc;
}

float rk_qref_q4_1_dot(const void *w, const void *xq, int64_t n) {
    const uint8_t *p = w;
    const rk_act_q8_32 *y = xq;
    double acc = 0.0;
    for (int64_t i = 0; i < n / 32; i++, p += sizeof(rk_block_q4_1), y++) {
        const uint8_t *q = p + offsetof(rk_block_q4_1, qs);
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += (q[j] & 15) * y->qs[j] + (q[j] >> 4) * y->qs[j + 16];
        acc += (double)f16(p) * y->d * s + (double)f16(p + 2) * y->d * y->sum;
    }
    return (float)acc;
}

float rk_qref_q4_K_dot(const void *w, const void *xq, int64_t n) {
    const uint8_t *p = w;
    const rk_act_q8_K *y = xq;
    double acc = 0.0;
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q4_K), y++) {
        const uint8_t *s = p + offsetof(rk_block_q4_K, scales);
        const uint8_t *q = p + offsetof(rk_block_q4_K, qs);
        int32_t sum_q = 0, sum_m = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            rk_q4k_scale_min(j, s, &sc, &m);
            const uint8_t *qc = q + 32 * (j / 2);
            const int8_t *yc = y->qs + 32 * j;
            int32_t t = 0;
            for (int l = 0; l < 32; l++) t += (j % 2 ? qc[l] >> 4 : qc[l] & 15) * yc[l];
            sum_q += sc * t;
            sum_m += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
        }
        acc += (double)y->d * ((double)f16(p) * sum_q - (double)f16(p + 2) * sum_m);
    }
    return (float)acc;
}

float rk_qref_q6_K_dot(const void *w, const void *xq, int64_t n) {
    const uint8_t *p = w;
    const rk_act_q8_K *y = xq;
    double acc = 0.0;
    for (int64_t i = 0; i < n / RK_QK_K; i++, p += sizeof(rk_block_q6_K), y++) {
        const uint8_t *ql = p + offsetof(rk_block_q6_K, ql);
        const uint8_t *qh = p + offsetof(rk_block_q6_K, qh);
        const int8_t *sc = (const int8_t *)(p + offsetof(rk_block_q6_K, scales));
        int32_t sub[16] = {0};
        for (int h = 0; h < 2; h++) {
            const uint8_t *l4 = ql + 64 * h, *hb = qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                const int q[4] = {(l4[l] & 15) | ((hb[l] & 3) << 4), (l4[l + 32] & 15) | (((hb[l] >> 2) & 3) << 4),
                                  (l4[l] >> 4) | (((hb[l] >> 4) & 3) << 4),
                                  (l4[l + 32] >> 4) | (((hb[l] >> 6) & 3) << 4)};
                for (int k = 0; k < 4; k++) {
                    const int e = 128 * h + 32 * k + l;
                    sub[e / 16] += (q[k] - 32) * y->qs[e];
                }
            }
        }
        int32_t s = 0;
        for (int k = 0; k < 16; k++) s += sc[k] * sub[k];
        acc += (double)y->d * f16(p + offsetof(rk_block_q6_K, d)) * s;
    }
    return (float)acc;
}
