/* Shared by test_quant.c and test_quant_qdot.c: the test's own decoder of every
 * dtype's byte layout (elem(), independent of kernels/quant_ref.c) and the random
 * row generators. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant_rows.h"
#include "tb.h"

/* The oracle rounds like ggml: every product and sum separately. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

const uint32_t all_types[N_TYPES] = {RK_DT_F32,  RK_DT_F16,  RK_DT_BF16, RK_DT_Q8_0,
                                     RK_DT_Q4_0, RK_DT_Q4_1, RK_DT_Q4_K, RK_DT_Q6_K};

/* ---- the test's own decoder ------------------------------------------ */

uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* binary16 from its fields: (-1)^s * 2^(e-15) * 1.m, subnormal 2^-14 * 0.m. */
float half_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Element i of a row. *mag = sum of the magnitudes of the parts combined to make
 * it (|scale * q| + |min term|): rounding errors of any evaluation order are
 * bounded relative to it. */
float elem(uint32_t type, const uint8_t *row, int64_t i, double *mag) {
    float w = 0, part = 0;
    switch (type) {
    case RK_DT_F32: memcpy(&w, row + 4 * i, 4); break;
    case RK_DT_F16: w = half_value(rd16(row + 2 * i)); break;
    case RK_DT_BF16: w = bf16_value(rd16(row + 2 * i)); break;
    case RK_DT_Q8_0: {
        const uint8_t *b = row + (i / 32) * 34;
        w = (float)(int8_t)b[2 + i % 32] * half_value(rd16(b));
        break;
    }
    case RK_DT_Q4_0: {
        const uint8_t *b = row + (i / 32) * 18;
        const int j = (int)(i % 32), byte = b[2 + j % 16];
        const int q = j < 16 ? byte & 15 : byte >> 4;
        w = (float)(q - 8) * half_value(rd16(b));
        break;
    }
    case RK_DT_Q4_1: {
        const uint8_t *b = row + (i / 32) * 20;
        const int j = (int)(i % 32), byte = b[4 + j % 16];
        const int q = j < 16 ? byte & 15 : byte >> 4;
        const float qd = (float)q * half_value(rd16(b)), m = half_value(rd16(b + 2));
        w = qd + m;
        part = fabsf(qd) + fabsf(m);
        break;
    }
    case RK_DT_Q4_K: {
        const uint8_t *b = row + (i / 256) * 144;
        const int e = (int)(i % 256), byte = b[16 + 32 * (e / 64) + e % 32];
        const int q = e % 64 < 32 ? byte & 15 : byte >> 4;
        int sc, m;
        q4k_scale_min(b + 4, e / 32, &sc, &m);
        const float dq = half_value(rd16(b)) * (float)sc * (float)q;
        const float mm = half_value(rd16(b + 2)) * (float)m;
        w = dq - mm;
        part = fabsf(dq) + fabsf(mm);
        break;
    }
    case RK_DT_Q6_K: {
        const uint8_t *b = row + (i / 256) * 210;
        const int e = (int)(i % 256), h = e / 128, k = (e % 128) / 32, l = e % 32;
        const int lbyte = b[64 * h + l + 32 * (k & 1)];
        const int lo = k < 2 ? lbyte & 15 : lbyte >> 4;
        const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        const int sc = (int8_t)b[192 + e / 16];
        w = half_value(rd16(b + 208)) * (float)sc * (float)((lo | hi << 4) - 32);
        break;
    }
    default: cr_assert_fail("no oracle for type %u", type);
    }
    *mag = type == RK_DT_Q4_1 || type == RK_DT_Q4_K ? part : fabsf(w);
    return w;
}

uint32_t blck(uint32_t type) { return rk_dtype_get(type)->blck_size; }

size_t row_bytes(uint32_t type, int64_t n) {
    uint64_t b = 0;
    cr_assert(rk_dtype_row_bytes(type, (uint64_t)n, &b), "%s n=%lld", rk_dtype_name(type), (long long)n);
    return (size_t)b;
}

bool same_bits(float a, float b) {
    if (isnan(a) && isnan(b)) return true; /* F16C quiets signalling NaNs */
    return memcmp(&a, &b, 4) == 0;
}


void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ---- random rows ------------------------------------------------------------ */

uint16_t rand_half(uint64_t *rng, float scale) { return rk_f32_to_f16(tb_rand_normal(rng) * scale); }

/* A row of n elements of type, at byte offset 1 of an exact-size allocation: odd
 * alignment, and ASan flags any read past its last byte. Free with free(*base). */
uint8_t *rand_row(uint32_t type, int64_t n, uint64_t *rng, void **base) {
    const size_t nbytes = row_bytes(type, n);
    uint8_t *mem = malloc(nbytes + 1);
    cr_assert(mem);
    uint8_t *r = mem + 1;
    for (size_t i = 0; i < nbytes; i++) r[i] = (uint8_t)tb_rand_u64(rng);
    const int64_t nb = n / blck(type);
    for (int64_t i = 0; i < nb; i++) {
        switch (type) {
        case RK_DT_F32: {
            const float v = tb_rand_normal(rng);
            memcpy(r + 4 * i, &v, 4);
            break;
        }
        case RK_DT_F16: put16(r + 2 * i, rand_half(rng, 1.0f)); break;
        case RK_DT_BF16: put16(r + 2 * i, rk_f32_to_bf16(tb_rand_normal(rng))); break;
        case RK_DT_Q8_0: put16(r + 34 * i, rand_half(rng, 0.01f)); break;
        case RK_DT_Q4_0: put16(r + 18 * i, rand_half(rng, 0.05f)); break;
        case RK_DT_Q4_1:
            put16(r + 20 * i, rand_half(rng, 0.05f));
            put16(r + 20 * i + 2, rand_half(rng, 0.3f));
            break;
        case RK_DT_Q4_K:
            put16(r + 144 * i, rand_half(rng, 0.01f));
            put16(r + 144 * i + 2, rand_half(rng, 0.01f));
            break;
        case RK_DT_Q6_K: put16(r + 210 * i + 208, rand_half(rng, 0.001f)); break;
        default: break;
        }
    }
    *base = mem;
    return r;
}

float *rand_x(int64_t n, uint64_t *rng) {
    float *x = malloc((size_t)n * sizeof *x);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = tb_rand_normal(rng);
    return x;
}

/* Error bound of the fast dot. Each of the n products reaches the result
 * through at most n/8 + 20 roundings: one or two to form w (one fma, or a
 * scale product), one per step of a lane's sequential accumulation (n/8 steps
 * for 8 lanes, fewer with per-block partial sums), and at most 6 to merge the
 * accumulators and lanes. With u = 2^-24, |fast - exact| <= k*u*sum|parts*x|
 * (first order, k*u << 1); the reference (double sum, one final rounding) is
 * within u*|result| of exact. A wrong element costs ~mag/n, far above this. */
double dot_tol(int64_t n, double mag) { return ((double)n / 8 + 21) * 0x1p-24 * mag + 1e-30; }
