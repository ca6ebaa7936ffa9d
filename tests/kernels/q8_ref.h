/* Test oracle for q8_0 rows, shared by test_ops.c and test_kv_q8.c. */
#pragma once
#include <math.h>
#include <stdint.h>

#include "rk_base.h"

/* q8_0 written independently of kernels/ (llama.cpp's quantize_row_q8_0_ref:
 * d = amax/127 as f16, q = roundf(x/d) with the f32 d), plus the NaN block for
 * rows int8 cannot hold; and one element read back. */
static inline void tq8_quant(const float *x, uint8_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 34) {
        float amax = 0;
        int bad = 0;
        for (int j = 0; j < 32; j++) {
            bad |= !isfinite(x[i + j]);
            if (fabsf(x[i + j]) > amax) amax = fabsf(x[i + j]);
        }
        float d = amax / 127, id = d != 0 ? 1 / d : 0;
        uint16_t dh = rk_f32_to_f16(d);
        if (bad || isinf(rk_f16_to_f32(dh))) dh = 0x7e00;
        b[0] = (uint8_t)dh;
        b[1] = (uint8_t)(dh >> 8);
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(dh == 0x7e00 ? 0 : roundf(x[i + j] * id));
    }
}

static inline float tq8_get(const uint8_t *row, int64_t i) {
    const uint8_t *b = row + (i / 32) * 34;
    return (float)(int8_t)b[2 + i % 32] * rk_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
}
