/* Internal to kernels/: ggml block layouts and the per-dtype row functions that
 * quant_table.c gathers into the rk_quant_fns tables. Blocks are packed byte
 * arrays with no alignment guarantee inside a row (18, 20, 34, 210 bytes), so
 * code reads their f16 fields with memcpy and vectors with unaligned loads. */
#pragma once
#include "rk_kernels.h"

#define RK_QK4_0 32
#define RK_QK4_1 32
#define RK_QK8_0 32
#define RK_QK_K 256

typedef struct rk_block_q4_0 {
    uint16_t d;               /* f16 scale */
    uint8_t qs[RK_QK4_0 / 2]; /* element j: low nibble of qs[j]; j+16: high nibble */
} rk_block_q4_0;              /* w = (q - 8) * d */

typedef struct rk_block_q4_1 {
    uint16_t d, m;            /* f16 scale and minimum */
    uint8_t qs[RK_QK4_1 / 2]; /* nibbles as in q4_0 */
} rk_block_q4_1;              /* w = q * d + m */

typedef struct rk_block_q8_0 {
    uint16_t d;
    int8_t qs[RK_QK8_0];
} rk_block_q8_0; /* w = q * d */

/* 8 sub-blocks of 32. scales[12] packs eight 6-bit scales and eight 6-bit mins:
 * j < 4: sc = scales[j] & 63, m = scales[j+4] & 63;
 * j >= 4: low 4 bits from scales[j+4] (sc: low nibble, m: high nibble), high 2
 * bits from the top bits of scales[j-4] (sc) and scales[j] (m).
 * Chunk c (64 elements) uses qs[32c..32c+31]: low nibbles are sub-block 2c,
 * high nibbles sub-block 2c+1. w = (d*sc) * q - (dmin*m). */
typedef struct rk_block_q4_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[RK_QK_K / 2];
} rk_block_q4_K;

/* Two halves of 128. In half h, for l < 32 with ql = ql + 64h, qh = qh + 32h:
 * element l      : low nibble of ql[l]    | bits 0-1 of qh[l] << 4
 * element l + 32 : low nibble of ql[l+32] | bits 2-3 of qh[l] << 4
 * element l + 64 : high nibble of ql[l]   | bits 4-5 of qh[l] << 4
 * element l + 96 : high nibble of ql[l+32]| bits 6-7 of qh[l] << 4
 * each a 6-bit q; w = (d * scales[8h + l/16 + 2k]) * (q - 32) for part k. */
typedef struct rk_block_q6_K {
    uint8_t ql[RK_QK_K / 2];
    uint8_t qh[RK_QK_K / 4];
    int8_t scales[RK_QK_K / 16];
    uint16_t d;
} rk_block_q6_K;

_Static_assert(sizeof(rk_block_q4_0) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(rk_block_q4_1) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(rk_block_q8_0) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(rk_block_q4_K) == 144, "q4_K block is 144 bytes");
_Static_assert(sizeof(rk_block_q6_K) == 210, "q6_K block is 210 bytes");

/* Unpacks sub-block j (0..7) of a q4_K scales[12] array. */
static inline void rk_q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Row functions: to_f32(src, dst, n) and dot(w, x, n), n a multiple of the block. */
#define RK_QUANT_DECL(prefix, t)                                        \
    void prefix##_##t##_to_f32(const void *src, float *dst, int64_t n); \
    float prefix##_##t##_dot(const void *w, const float *x, int64_t n);

#define RK_QUANT_DECL_ALL(prefix) \
    RK_QUANT_DECL(prefix, f32)    \
    RK_QUANT_DECL(prefix, f16)    \
    RK_QUANT_DECL(prefix, bf16)   \
    RK_QUANT_DECL(prefix, q8_0)   \
    RK_QUANT_DECL(prefix, q4_0)   \
    RK_QUANT_DECL(prefix, q4_1)   \
    RK_QUANT_DECL(prefix, q4_K)   \
    RK_QUANT_DECL(prefix, q6_K)

RK_QUANT_DECL_ALL(rk_quant_ref)
#ifdef RK_HAVE_AVX2
RK_QUANT_DECL_ALL(rk_quant_avx2)
#endif

/* ---- 8-bit activation blocks (rk_qdot_fns) ------------------------------ */
typedef struct rk_act_q8_32 {
    float d;     /* amax / 127; NaN when the block held a NaN or +-Inf */
    int32_t sum; /* sum of qs */
    int8_t qs[32];
} rk_act_q8_32; /* x ~ d * q */

typedef struct rk_act_q8_K {
    float d;
    int16_t bsums[RK_QK_K / 16]; /* sums of qs[16k .. 16k+15] */
    int8_t qs[RK_QK_K];
} rk_act_q8_K;

_Static_assert(sizeof(rk_act_q8_32) == 40, "act q8_32 block is 40 bytes");
_Static_assert(sizeof(rk_act_q8_K) == 292, "act q8_K block is 292 bytes");

void rk_qref_act_q8_32(const float *x, void *dst, int64_t n);
void rk_qref_act_q8_K(const float *x, void *dst, int64_t n);
float rk_qref_q8_0_dot(const void *w, const void *xq, int64_t n);
float rk_qref_q4_0_dot(const void *w, const void *xq, int64_t n);
float rk_qref_q4_1_dot(const void *w, const void *xq, int64_t n);
float rk_qref_q4_K_dot(const void *w, const void *xq, int64_t n);
float rk_qref_q6_K_dot(const void *w, const void *xq, int64_t n);
#ifdef RK_HAVE_AVX2
void rk_qavx2_act_q8_32(const float *x, void *dst, int64_t n);
void rk_qavx2_act_q8_K(const float *x, void *dst, int64_t n);
float rk_qavx2_q8_0_dot(const void *w, const void *xq, int64_t n);
void rk_qavx2_q8_0_dot_x4(const void *w, const void *xq, size_t ys, int64_t n, float *out);
float rk_qavx2_q4_0_dot(const void *w, const void *xq, int64_t n);
void rk_qavx2_q4_0_dot_x4(const void *w, const void *xq, size_t ys, int64_t n, float *out);
float rk_qavx2_q4_1_dot(const void *w, const void *xq, int64_t n);
void rk_qavx2_q4_1_dot_x4(const void *w, const void *xq, size_t ys, int64_t n, float *out);
float rk_qavx2_q4_K_dot(const void *w, const void *xq, int64_t n);
void rk_qavx2_q4_K_dot_x4(const void *w, const void *xq, size_t ys, int64_t n, float *out);
float rk_qavx2_q6_K_dot(const void *w, const void *xq, int64_t n);
void rk_qavx2_q6_K_dot_x4(const void *w, const void *xq, size_t ys, int64_t n, float *out);
/* out[i] = dot(w + i * ws, xq, n) for i < 2, bit for bit (decode: two weight rows per call;
 * only Q4_1, where sharing the activation loads paid) */
void rk_qavx2_q4_1_dot_2w(const void *w, size_t ws, const void *xq, int64_t n, float *out);
#endif
