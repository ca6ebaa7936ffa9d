/* Device dequantisation of one element of a weight / cache row, in the same
 * operations and order as kernels/quant_ref.c (so every value is bit-identical
 * to the CPU oracle's: with f16 scales and small integer codes each product is
 * exact in f32, and the one rounding left is the same). Byte loads only: block
 * types have odd sizes (18, 20, 34, 210 bytes) and no alignment. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_impl.h"

__device__ __forceinline__ float rk_dq_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ float rk_dq_bf16(const uint8_t *p) {
    return __uint_as_float((unsigned)(p[0] | (p[1] << 8)) << 16);
}

/* Element i of a row of type T (an RK_DT_* value). */
template <uint32_t T> __device__ __forceinline__ float rk_dq(const uint8_t *__restrict__ row, int64_t i) {
    if constexpr (T == RK_DT_F32) {
        return ((const float *)row)[i];
    } else if constexpr (T == RK_DT_F16) {
        return __half2float(((const __half *)row)[i]);
    } else if constexpr (T == RK_DT_BF16) {
        return __bfloat162float(((const __nv_bfloat16 *)row)[i]);
    } else if constexpr (T == RK_DT_Q8_0) {
        const uint8_t *b = row + (i >> 5) * 34;
        return (float)(int8_t)b[2 + (i & 31)] * rk_dq_f16(b);
    } else if constexpr (T == RK_DT_Q4_0) {
        const uint8_t *b = row + (i >> 5) * 18;
        int j = (int)(i & 31);
        int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return (float)(q - 8) * rk_dq_f16(b);
    } else if constexpr (T == RK_DT_Q4_1) {
        const uint8_t *b = row + (i >> 5) * 20;
        int j = (int)(i & 31);
        int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, rk_dq_f16(b)), rk_dq_f16(b + 2));
    } else if constexpr (T == RK_DT_Q4_K) {
        const uint8_t *b = row + (i >> 8) * 144, *s = b + 4, *qs = b + 16;
        int j = (int)(i & 255), c = j >> 6, l = j & 63, sub = 2 * c + (l >= 32);
        int sc, m;
        if (sub < 4) {
            sc = s[sub] & 63;
            m = s[sub + 4] & 63;
        } else {
            sc = (s[sub + 4] & 0xF) | ((s[sub - 4] >> 6) << 4);
            m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
        }
        int q = l < 32 ? (qs[32 * c + l] & 0xF) : (qs[32 * c + l - 32] >> 4);
        float d1 = __fmul_rn(rk_dq_f16(b), (float)sc), m1 = __fmul_rn(rk_dq_f16(b + 2), (float)m);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    } else if constexpr (T == RK_DT_Q6_K) {
        const uint8_t *b = row + (i >> 8) * 210;
        int j = (int)(i & 255), h = j >> 7, r = j & 127, quarter = r >> 5, l = r & 31;
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        int lo = quarter & 1 ? ql[l + 32] : ql[l];
        lo = quarter & 2 ? lo >> 4 : lo & 0xF;
        int q = (lo | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return __fmul_rn(__fmul_rn(rk_dq_f16(b + 208), (float)sc[l / 16 + 2 * quarter]), (float)q);
    } else {
        return __int_as_float(0x7fc00000);
    }
}

/* Calls f.template operator()<T>() for a runtime type; false for a type
 * without a device dequantiser. */
#define RK_CUDA_DISPATCH_TYPE(type, CALL)                                                          \
    switch (type) {                                                                                \
    case RK_DT_F32: CALL(RK_DT_F32); break;                                                        \
    case RK_DT_F16: CALL(RK_DT_F16); break;                                                        \
    case RK_DT_BF16: CALL(RK_DT_BF16); break;                                                      \
    case RK_DT_Q8_0: CALL(RK_DT_Q8_0); break;                                                      \
    case RK_DT_Q4_0: CALL(RK_DT_Q4_0); break;                                                      \
    case RK_DT_Q4_1: CALL(RK_DT_Q4_1); break;                                                      \
    case RK_DT_Q4_K: CALL(RK_DT_Q4_K); break;                                                      \
    case RK_DT_Q6_K: CALL(RK_DT_Q6_K); break;                                                      \
    default: return cudaErrorInvalidValue;                                                         \
    }

static inline bool rk_cuda_weight_type(uint32_t t) {
    return t == RK_DT_F32 || t == RK_DT_F16 || t == RK_DT_BF16 || t == RK_DT_Q8_0 || t == RK_DT_Q4_0 ||
           t == RK_DT_Q4_1 || t == RK_DT_Q4_K || t == RK_DT_Q6_K;
}
