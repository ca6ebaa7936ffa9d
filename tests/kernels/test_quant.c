/* Per-dtype row functions (rk_quant_ref, rk_quant_fast):
 *   layout  - blocks built by hand, values by the published ggml formulas
 *   f16     - every half / bfloat16 bit pattern through both to_f32 paths
 *   exact   - dyadic scales and small integer x: every dot must be exact
 *   random  - fast vs ref on random rows: to_f32 bit-exact, dot within a bound
 *   nonfinite - NaN/Inf parity of the dot products
 *   twin    - dequantised shared/golden models vs llama.cpp's F32 twins, bit for bit
 * The oracle here (elem()) decodes one element straight from the byte layout,
 * independently of kernels/quant_ref.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_gguf.h"
#include "rk_kernels.h"
#include "tb.h"

/* The oracle rounds like ggml: every product and sum separately. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static const uint32_t all_types[] = {RK_DT_F32,  RK_DT_F16,  RK_DT_BF16, RK_DT_Q8_0,
                                     RK_DT_Q4_0, RK_DT_Q4_1, RK_DT_Q4_K, RK_DT_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

/* ---- the test's own decoder ------------------------------------------ */

static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* binary16 from its fields: (-1)^s * 2^(e-15) * 1.m, subnormal 2^-14 * 0.m. */
static float half_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
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
static float elem(uint32_t type, const uint8_t *row, int64_t i, double *mag) {
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

static uint32_t blck(uint32_t type) {
    return rk_dtype_get(type)->blck_size;
}

static size_t row_bytes(uint32_t type, int64_t n) {
    uint64_t b = 0;
    cr_assert(rk_dtype_row_bytes(type, (uint64_t)n, &b), "%s n=%lld", rk_dtype_name(type),
              (long long)n);
    return (size_t)b;
}

static bool same_bits(float a, float b) {
    if (isnan(a) && isnan(b)) return true; /* F16C quiets signalling NaNs */
    return memcmp(&a, &b, 4) == 0;
}

/* Asserts dst[0..n) equals the oracle bit for bit. */
static void check_decode(const char *what, uint32_t type, const uint8_t *row, const float *dst,
                         int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double mag;
        const float want = elem(type, row, i, &mag);
        if (!same_bits(dst[i], want))
            cr_assert_fail("%s %s: element %lld is %a, formula gives %a", what,
                           rk_dtype_name(type), (long long)i, (double)dst[i], (double)want);
    }
}

/* ---- dispatch ----------------------------------------------------------- */

Test(quant, tables) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const rk_quant_fns *r = rk_quant_ref(all_types[t]), *f = rk_quant_fast(all_types[t]);
        cr_assert(r && r->to_f32 && r->dot, "ref %s", rk_dtype_name(all_types[t]));
        cr_assert(f && f->to_f32 && f->dot, "fast %s", rk_dtype_name(all_types[t]));
        if (rk_cpu_has_avx2())
            cr_assert(f->dot != r->dot, "fast %s is the reference", rk_dtype_name(all_types[t]));
        else
            cr_assert(f == r, "no AVX2 but fast %s is not ref", rk_dtype_name(all_types[t]));
    }
    const uint32_t unsupported[] = {RK_DT_Q8_1, RK_DT_Q8_K, 4, 5, 16, 29, 31, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        cr_assert_null(rk_quant_ref(unsupported[i]), "type %u", unsupported[i]);
        cr_assert_null(rk_quant_fast(unsupported[i]), "type %u", unsupported[i]);
    }
    if (!rk_cpu_has_avx2()) cr_log_warn("CPU without AVX2/FMA/F16C: fast == ref here");
}

/* ---- hand-made blocks ----------------------------------------------------
 * Each block is written byte by byte; the expected values are computed here
 * from the published formula. Both implementations must match exactly, and
 * dot with a one-hot x must return the element itself (reference: exactly;
 * fast: exactly too, as the scales below make every operation exact). */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* row holds nb blocks whose values are want[0..n). */
static void check_hand(uint32_t type, const uint8_t *row, const float *want, int64_t n) {
    const rk_quant_fns *impl[2] = {rk_quant_ref(type), rk_quant_fast(type)};
    const char *name[2] = {"ref", "fast"};
    float *dst = calloc((size_t)n, sizeof *dst);
    float *x = calloc((size_t)n, sizeof *x);
    cr_assert(dst && x);
    for (int v = 0; v < 2; v++) {
        impl[v]->to_f32(row, dst, n);
        for (int64_t i = 0; i < n; i++)
            cr_assert(same_bits(dst[i], want[i]), "%s %s to_f32[%lld] = %a, expected %a",
                      name[v], rk_dtype_name(type), (long long)i, (double)dst[i], (double)want[i]);
        for (int64_t i = 0; i < n; i++) {
            x[i] = 1.0f; /* == rather than bits: a zero sum may be +0 where w is -0 */
            const float got = impl[v]->dot(row, x, n);
            cr_assert(got == want[i], "%s %s dot(e_%lld) = %a, expected %a", name[v],
                      rk_dtype_name(type), (long long)i, (double)got, (double)want[i]);
            x[i] = 0.0f;
        }
    }
    check_decode("oracle", type, row, want, n);
    free(dst);
    free(x);
}

Test(quant, layout_q4_0) {
    uint8_t b[2 * 18];
    float want[64];
    const uint16_t d[2] = {0x3800 /* 0.5 */, 0xC400 /* -4 */};
    for (int k = 0; k < 2; k++) {
        put16(b + 18 * k, d[k]);
        for (int j = 0; j < 16; j++) {
            const int lo = (j + 5 * k) % 16, hi = 15 - j;
            b[18 * k + 2 + j] = (uint8_t)(lo | hi << 4);
            want[32 * k + j] = (float)(lo - 8) * half_value(d[k]);
            want[32 * k + 16 + j] = (float)(hi - 8) * half_value(d[k]);
        }
    }
    cr_assert_eq(want[0], -4.0f); /* (0 - 8) * 0.5 */
    check_hand(RK_DT_Q4_0, b, want, 64);
}

Test(quant, layout_q4_1) {
    uint8_t b[2 * 20];
    float want[64];
    const uint16_t d[2] = {0x3400 /* 0.25 */, 0x4000 /* 2 */};
    const uint16_t m[2] = {0xC280 /* -3.25 */, 0x4900 /* 10 */};
    for (int k = 0; k < 2; k++) {
        put16(b + 20 * k, d[k]);
        put16(b + 20 * k + 2, m[k]);
        for (int j = 0; j < 16; j++) {
            const int lo = (3 * j + k) % 16, hi = j;
            b[20 * k + 4 + j] = (uint8_t)(lo | hi << 4);
            want[32 * k + j] = (float)lo * half_value(d[k]) + half_value(m[k]);
            want[32 * k + 16 + j] = (float)hi * half_value(d[k]) + half_value(m[k]);
        }
    }
    cr_assert_eq(want[0], -3.25f);
    cr_assert_eq(want[63], 40.0f); /* 15 * 2 + 10 */
    check_hand(RK_DT_Q4_1, b, want, 64);
}

Test(quant, layout_q8_0) {
    uint8_t b[2 * 34];
    float want[64];
    const uint16_t d[2] = {0x3C00 /* 1 */, 0xB000 /* -0.125 */};
    for (int k = 0; k < 2; k++) {
        put16(b + 34 * k, d[k]);
        for (int j = 0; j < 32; j++) {
            const int q = k ? 127 - 8 * j : -128 + 7 * j;
            b[34 * k + 2 + j] = (uint8_t)(int8_t)q;
            want[32 * k + j] = (float)q * half_value(d[k]);
        }
    }
    cr_assert_eq(want[0], -128.0f);
    check_hand(RK_DT_Q8_0, b, want, 64);
}

Test(quant, layout_q4_K) {
    /* scales and mins chosen to use all six bits, including the two high bits
     * of sub-blocks 4..7, which live in the top bits of bytes 0..7 */
    const int sc[8] = {1, 63, 17, 40, 33, 48, 5, 62};
    const int mn[8] = {0, 7, 63, 21, 60, 16, 47, 2};
    uint8_t b[144];
    memset(b, 0, sizeof b);
    put16(b, 0x3400);     /* d = 0.25 */
    put16(b + 2, 0x3800); /* dmin = 0.5 */
    uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    float want[256];
    for (int e = 0; e < 256; e++) { /* q of element e, then pack its nibble */
        const int q = (e * 7 + e / 32) % 16, c = e / 64, sub = e / 32;
        uint8_t *byte = &b[16 + 32 * c + e % 32];
        *byte = (uint8_t)(e % 64 < 32 ? (*byte & 0xF0) | q : (*byte & 0x0F) | q << 4);
        want[e] = 0.25f * (float)sc[sub] * (float)q - 0.5f * (float)mn[sub];
    }
    cr_assert_eq(s[0], 0x81); /* sc[0] = 1 in bits 0-5; bits 4-5 of sc[4] = 33 in bits 6-7 */
    cr_assert_eq(s[11], 0x2E); /* sc[7] = 62: low nibble 0xE; mn[7] = 2: high nibble 0x2 */
    check_hand(RK_DT_Q4_K, b, want, 256);
}

Test(quant, layout_q6_K) {
    const int8_t sc[16] = {1, -1, 127, -128, 3, -7, 64, 0, 12, -33, 100, -100, 2, 5, -2, 9};
    uint8_t b[210];
    memset(b, 0, sizeof b);
    memcpy(b + 192, sc, 16);
    put16(b + 208, 0x3000); /* d = 0.125 */
    float want[256];
    for (int e = 0; e < 256; e++) {
        const int q = (e * 11 + 5) % 64; /* 6-bit, stored; the value is q - 32 */
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        uint8_t *ql = &b[64 * h + l + 32 * (k & 1)];
        *ql = (uint8_t)(k < 2 ? (*ql & 0xF0) | (q & 15) : (*ql & 0x0F) | (q & 15) << 4);
        b[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
        want[e] = 0.125f * (float)sc[e / 16] * (float)(q - 32);
    }
    check_hand(RK_DT_Q6_K, b, want, 256);
}

/* ---- half floats ------------------------------------------------------------ */

/* All 65536 patterns as one row (vector path), then short runs (tails) that
 * start at zero, at 1.0, near max/inf/NaN and in the negative range. */
static void check_all_halves(uint32_t type, float (*value)(uint16_t)) {
    const int64_t n = 65536;
    uint16_t *h = malloc((size_t)n * 2);
    float *dst = malloc((size_t)n * sizeof *dst);
    cr_assert(h && dst);
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)i;
    const rk_quant_fns *impl[2] = {rk_quant_ref(type), rk_quant_fast(type)};
    const int64_t lens[] = {1, 7, 9, 13, 17, 31};
    const int64_t starts[] = {0, 0x3bff, 0x7bf8, 0x7f79, 0xfbf8, 0xfff0};
    for (int v = 0; v < 2; v++) {
        impl[v]->to_f32(h, dst, n);
        for (int64_t i = 0; i < n; i++)
            cr_assert(same_bits(dst[i], value(h[i])), "%s %s 0x%04x -> %a, expected %a",
                      v ? "fast" : "ref", rk_dtype_name(type), (unsigned)h[i], (double)dst[i],
                      (double)value(h[i]));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++) {
                const int64_t s0 = starts[si] + lens[li] <= n ? starts[si] : n - lens[li];
                impl[v]->to_f32(h + s0, dst, lens[li]);
                for (int64_t k = 0; k < lens[li]; k++)
                    cr_assert(same_bits(dst[k], value(h[s0 + k])), "%s %s len %lld 0x%04x",
                              v ? "fast" : "ref", rk_dtype_name(type), (long long)lens[li],
                              (unsigned)h[s0 + k]);
            }
        }
    }
    free(h);
    free(dst);
}

Test(quant, f16_all_values) {
    check_all_halves(RK_DT_F16, half_value);
    /* named edge cases, in case half_value and the kernels agree on a wrong rule */
    cr_assert_eq(half_value(0x0001), 0x1p-24f);
    cr_assert_eq(half_value(0x03FF), 0x3FFp-24f);
    cr_assert_eq(half_value(0x0400), 0x1p-14f);
    cr_assert_eq(half_value(0x3C00), 1.0f);
    cr_assert_eq(half_value(0x7BFF), 65504.0f);
    cr_assert_eq(half_value(0xC000), -2.0f);
    cr_assert(signbit(half_value(0x8000)) && half_value(0x8000) == 0.0f);
    cr_assert(isinf(half_value(0xFC00)) && half_value(0xFC00) < 0);
    cr_assert(isnan(half_value(0x7C01)) && isnan(half_value(0xFE00)));
}

Test(quant, bf16_all_values) {
    check_all_halves(RK_DT_BF16, bf16_value);
    cr_assert_eq(bf16_value(0x3F80), 1.0f);
    cr_assert_eq(bf16_value(0xC040), -3.0f);
    cr_assert_eq(bf16_value(0x0001), 0x1p-133f);
    cr_assert_eq(bf16_value(0x7F7F), 0x1.FEp127f);
    cr_assert(isinf(bf16_value(0x7F80)) && isnan(bf16_value(0x7FC0)));
}

/* f32 -> half rounding used when building test rows and by the runtime's F16 KV cache. */
Test(quant, f32_to_half_rounding) {
    cr_assert_eq(rk_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);  /* tie -> even (down) */
    cr_assert_eq(rk_f32_to_f16(1.0f + 0x3p-11f), 0x3C02);  /* tie -> even (up) */
    cr_assert_eq(rk_f32_to_f16(65520.0f), 0x7C00);         /* rounds past max -> inf */
    cr_assert_eq(rk_f32_to_f16(65519.0f), 0x7BFF);
    cr_assert_eq(rk_f32_to_f16(0x1p-25f), 0x0000);         /* half the min subnormal: even */
    cr_assert_eq(rk_f32_to_f16(0x1.8p-25f), 0x0001);
    cr_assert_eq(rk_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(rk_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);  /* tie -> even */
    cr_assert_eq(rk_f32_to_bf16(1.0f + 0x3p-8f), 0x3F82);
    cr_assert(isnan(bf16_value(rk_f32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 65536; h++) /* every finite half survives the round trip */
        if (((h >> 10) & 31) != 31)
            cr_assert_eq(rk_f32_to_f16(half_value((uint16_t)h)), h, "0x%04x", h);
}

/* ---- random rows ------------------------------------------------------------ */

static uint16_t rand_half(uint64_t *rng, float scale) {
    return rk_f32_to_f16(tb_rand_normal(rng) * scale);
}

/* A row of n elements of type, at byte offset 1 of an exact-size allocation: odd
 * alignment, and ASan flags any read past its last byte. Free with free(*base). */
static uint8_t *rand_row(uint32_t type, int64_t n, uint64_t *rng, void **base) {
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

static float *rand_x(int64_t n, uint64_t *rng) {
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
static double dot_tol(int64_t n, double mag) {
    return ((double)n / 8 + 21) * 0x1p-24 * mag + 1e-30;
}

Test(quant, fast_vs_ref_random) {
    uint64_t rng = 42;
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = all_types[t];
        const rk_quant_fns *ref = rk_quant_ref(type), *fast = rk_quant_fast(type);
        const int64_t bl = blck(type);
        const int64_t lens_blk[] = {1, 2, 3, 7, 18, 48, 64}; /* 576 = 18 * 32 */
        const int64_t lens_elt[] = {1, 5, 8, 15, 16, 31, 33, 576, 1000, 1536, 4099};
        const bool plain = bl == 1;
        const size_t nl = plain ? sizeof lens_elt / sizeof lens_elt[0]
                                : sizeof lens_blk / sizeof lens_blk[0];
        for (size_t li = 0; li < nl; li++) {
            const int64_t n = plain ? lens_elt[li] : lens_blk[li] * bl;
            for (int rep = 0; rep < 4; rep++) {
                void *base;
                const uint8_t *w = rand_row(type, n, &rng, &base);
                float *xmem = rand_x(n + 1, &rng), *x = xmem + 1; /* 4- not 32-byte aligned */
                float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
                cr_assert(a && b);
                ref->to_f32(w, a, n);
                fast->to_f32(w, b, n);
                check_decode("ref", type, w, a, n);
                for (int64_t i = 0; i < n; i++)
                    cr_assert(same_bits(a[i], b[i]), "%s n=%lld to_f32[%lld]: fast %a ref %a",
                              rk_dtype_name(type), (long long)n, (long long)i, (double)b[i],
                              (double)a[i]);
                double mag = 0, exact = 0;
                for (int64_t i = 0; i < n; i++) {
                    double m;
                    exact += (double)elem(type, w, i, &m) * x[i];
                    mag += m * fabs((double)x[i]);
                }
                const float dr = ref->dot(w, x, n), df = fast->dot(w, x, n);
                /* same products (exact in double), same order: the same double sum */
                cr_assert(dr == (float)exact, "%s n=%lld ref dot %a vs oracle %a",
                          rk_dtype_name(type), (long long)n, (double)dr, exact);
                cr_assert(fabs((double)df - dr) <= dot_tol(n, mag),
                          "%s n=%lld fast dot %.9g ref %.9g (|diff| %.3g > tol %.3g)",
                          rk_dtype_name(type), (long long)n, (double)df, (double)dr,
                          fabs((double)df - dr), dot_tol(n, mag));
                free(a);
                free(b);
                free(xmem);
                free(base);
            }
        }
    }
}

static int small_int(uint64_t *rng, int lo, int hi) {
    return lo + (int)(tb_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

/* Dyadic scales (powers of two >= 1/4), small integer q and x: every product is
 * a multiple of 1/4, and while sum |parts * x| < 2^22 every partial sum in any
 * order is exact in f32, so fast and ref must both return the exact sum. */
Test(quant, exact_dot_dyadic) {
    uint64_t rng = 7;
    const uint16_t pow2[] = {0x3400, 0x3800, 0x3C00, 0xB800, 0x4000}; /* 1/4 1/2 1 -1/2 2 */
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = all_types[t];
        const int64_t bl = blck(type), n = bl == 1 ? 203 : bl == 32 ? 8 * bl : 2 * bl;
        void *base;
        uint8_t *w = rand_row(type, n, &rng, &base);
        const int64_t nb = n / blck(type);
        for (int64_t i = 0; i < nb; i++) {
            const uint16_t d = pow2[tb_rand_u64(&rng) % 5], m = pow2[tb_rand_u64(&rng) % 5];
            switch (type) {
            case RK_DT_F32: {
                const float v = (float)small_int(&rng, -16, 16) * 0.25f;
                memcpy(w + 4 * i, &v, 4);
                break;
            }
            case RK_DT_F16: put16(w + 2 * i, rk_f32_to_f16((float)small_int(&rng, -32, 32))); break;
            case RK_DT_BF16:
                put16(w + 2 * i, rk_f32_to_bf16((float)small_int(&rng, -32, 32)));
                break;
            case RK_DT_Q8_0: put16(w + 34 * i, d); break;
            case RK_DT_Q4_0: put16(w + 18 * i, d); break;
            case RK_DT_Q4_1: put16(w + 20 * i, d); put16(w + 20 * i + 2, m); break;
            case RK_DT_Q4_K: put16(w + 144 * i, d); put16(w + 144 * i + 2, m); break;
            case RK_DT_Q6_K:
                put16(w + 210 * i + 208, d);
                for (int j = 0; j < 16; j++)
                    w[210 * i + 192 + j] = (uint8_t)(int8_t)small_int(&rng, -20, 20);
                break;
            default: break;
            }
        }
        float *x = malloc((size_t)n * sizeof *x);
        cr_assert(x);
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            double m;
            x[i] = (float)small_int(&rng, -4, 4);
            exact += (double)elem(type, w, i, &m) * x[i];
            mag += m * fabs((double)x[i]);
        }
        cr_assert(mag < 0x1p22, "%s: test data too large for exactness", rk_dtype_name(type));
        const char *tn = rk_dtype_name(type);
        const float dr = rk_quant_ref(type)->dot(w, x, n), df = rk_quant_fast(type)->dot(w, x, n);
        cr_assert_eq((double)dr, exact, "%s ref %a exact %a", tn, (double)dr, exact);
        cr_assert_eq((double)df, exact, "%s fast %a exact %a", tn, (double)df, exact);
        free(x);
        free(base);
    }
}

/* ---- NaN / Inf parity -------------------------------------------------------- */

static int fp_class(float v) {
    return isnan(v) ? 0 : isinf(v) ? (v > 0 ? 1 : 2) : 3;
}

/* Zeroes the scale (and min) of the block holding element i: w_i = 0 there. */
static void zero_block(uint32_t type, uint8_t *w, int64_t i) {
    const rk_dtype_traits *t = rk_dtype_get(type);
    uint8_t *b = w + (size_t)(i / t->blck_size) * t->type_size;
    switch (type) {
    case RK_DT_F32: memset(b, 0, 4); break;
    case RK_DT_F16: case RK_DT_BF16: case RK_DT_Q8_0: case RK_DT_Q4_0: memset(b, 0, 2); break;
    case RK_DT_Q4_1: case RK_DT_Q4_K: memset(b, 0, 4); break;
    case RK_DT_Q6_K: memset(b + 208, 0, 2); break;
    default: cr_assert_fail("type %u", type);
    }
}

/* Modes: non-finite weights (f32/f16 only; others use x), non-finite x, and
 * Inf * 0 (w_i = Inf with x_i = 0, or x_i = Inf against a zeroed block). One or
 * two of +Inf, -Inf, NaN per case. The class of the result (NaN, +Inf, -Inf,
 * finite) does not depend on summation order, so fast and ref must agree. */
Test(quant, nonfinite_parity) {
    uint64_t rng = 99;
    const float vals[] = {INFINITY, -INFINITY, NAN};
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = all_types[t];
        const rk_quant_fns *ref = rk_quant_ref(type), *fast = rk_quant_fast(type);
        const int64_t n = blck(type) == 1 ? 45 : 3 * (int64_t)blck(type);
        const bool plain = type == RK_DT_F32 || type == RK_DT_F16;
        for (int c = 0; c < 36; c++) {
            void *base;
            uint8_t *w = rand_row(type, n, &rng, &base);
            float *x = rand_x(n, &rng);
            const int mode = c % 3, count = 1 + (c / 3) % 2;
            const int64_t i = (int64_t)(tb_rand_u64(&rng) % (uint64_t)n);
            const int64_t j = (i + 1 + (int64_t)(tb_rand_u64(&rng) % (uint64_t)(n - 1))) % n;
            for (int k = 0; k < count; k++) {
                const int64_t at = k ? j : i;
                const float v = mode == 2 && k == 0 ? INFINITY : vals[(c / 6 + k) % 3];
                if (plain && mode != 1 && type == RK_DT_F32) memcpy(w + 4 * at, &v, 4);
                else if (plain && mode != 1) put16(w + 2 * at, rk_f32_to_f16(v));
                else x[at] = v;
            }
            if (mode == 2 && plain) x[i] = 0.0f;
            if (mode == 2 && !plain) zero_block(type, w, i);
            const float dr = ref->dot(w, x, n), df = fast->dot(w, x, n);
            if (mode == 2 && count == 1)
                cr_assert(isnan(dr), "%s case %d: Inf * 0 gave %a", rk_dtype_name(type), c,
                          (double)dr);
            cr_assert_eq(fp_class(dr), fp_class(df), "%s case %d: ref %a fast %a",
                         rk_dtype_name(type), c, (double)dr, (double)df);
            free(x);
            free(base);
        }
    }
}

/* ---- llama.cpp F32 twins ------------------------------------------------------ */

typedef struct twin_ctx {
    void *qbytes, *tbytes;
    size_t qlen, tlen;
    rk_gguf *q, *t;
} twin_ctx;

static void twin_close(twin_ctx *c) {
    rk_gguf_destroy(c->q);
    rk_gguf_destroy(c->t);
    free(c->qbytes);
    free(c->tbytes);
}

/* Loads models/<name>.gguf and its twin models/<name>.f32-twin.gguf.xz,
 * decompressed with xz into a fresh directory under $TMPDIR (or /tmp) that is removed again
 * before anything can fail. Skips when the files or xz are absent. */
static void twin_open(twin_ctx *c, const char *name) {
    memset(c, 0, sizeof *c);
    char rel[256], qpath[1024], xzpath[1024];
    snprintf(rel, sizeof rel, "golden/models/%s.gguf", name);
    if (!tb_shared_path(qpath, sizeof qpath, rel)) cr_skip_test("%s", qpath);
    snprintf(rel, sizeof rel, "golden/models/%s.f32-twin.gguf.xz", name);
    if (!tb_shared_path(xzpath, sizeof xzpath, rel)) cr_skip_test("%s", xzpath);
    if (system("xz --version >/dev/null 2>&1") != 0) cr_skip_test("xz not installed");
    if (strchr(xzpath, '\'')) cr_skip_test("path with a quote: %s", xzpath);
    char dir[512], raw[600], cmd[2300];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk_quant_twin"), "%s", dir);
    snprintf(raw, sizeof raw, "%s/twin.gguf", dir);
    snprintf(cmd, sizeof cmd, "xz -dc '%s' > '%s'", xzpath, raw);
    const int rc = system(cmd);
    c->tbytes = rc == 0 ? tb_read_file(raw, &c->tlen) : NULL;
    unlink(raw);
    rmdir(dir);
    cr_assert_eq(rc, 0, "%s failed", cmd);
    c->qbytes = tb_read_file(qpath, &c->qlen);
    cr_assert(c->qbytes && c->tbytes, "reading %s / the decompressed twin", qpath);
    rk_err err = {0};
    cr_assert_eq(rk_gguf_parse(c->qbytes, c->qlen, &c->q, &err), RK_OK, "%s: %s", qpath, err.msg);
    cr_assert_eq(rk_gguf_parse(c->tbytes, c->tlen, &c->t, &err), RK_OK, "%s twin: %s", name,
                 err.msg);
}

/* Every tensor, through both to_f32 paths, equals the twin bit for bit; every
 * row's reference dot equals the double-accumulated dot with the twin row, and
 * the fast dot is within dot_tol of it. Returns a bit set of 1 << type seen. */
static uint64_t check_twin(const char *name) {
    twin_ctx c;
    twin_open(&c, name);
    cr_assert_eq(rk_gguf_n_tensors(c.q), rk_gguf_n_tensors(c.t), "%s tensor counts", name);
    uint64_t seen = 0, rng = 5;
    for (uint64_t ti = 0; ti < rk_gguf_n_tensors(c.q); ti++) {
        const rk_gguf_tensor *qt = rk_gguf_tensor_at(c.q, ti), *tt = rk_gguf_tensor_at(c.t, ti);
        cr_assert(qt->name.len == tt->name.len && !memcmp(qt->name.ptr, tt->name.ptr, qt->name.len),
                  "%s: tensor %llu order differs", name, (unsigned long long)ti);
        cr_assert_eq(tt->type, RK_DT_F32);
        for (int k = 0; k < 4; k++) cr_assert_eq(qt->ne[k], tt->ne[k]);
        const rk_quant_fns *ref = rk_quant_ref(qt->type), *fast = rk_quant_fast(qt->type);
        cr_assert(ref, "%s: %.*s has unsupported type %u", name, (int)qt->name.len,
                  qt->name.ptr, qt->type);
        seen |= 1ull << qt->type;
        const int64_t n = qt->ne[0], rows = qt->ne[1] * qt->ne[2] * qt->ne[3];
        const size_t rb = row_bytes(qt->type, n);
        float *buf = malloc((size_t)n * sizeof *buf);
        float *x = rand_x(n, &rng);
        cr_assert(buf);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *qrow = (const uint8_t *)qt->data + (size_t)r * rb;
            const float *trow = (const float *)tt->data + (size_t)r * (size_t)n;
            for (int v = 0; v < 2; v++) {
                (v ? fast : ref)->to_f32(qrow, buf, n);
                if (memcmp(buf, trow, (size_t)n * sizeof *buf) != 0) {
                    int64_t i = 0;
                    while (same_bits(buf[i], trow[i])) i++;
                    cr_assert_fail("%s %s: %.*s row %lld elem %lld = %a, twin %a", name,
                                   v ? "fast" : "ref", (int)qt->name.len, qt->name.ptr,
                                   (long long)r, (long long)i, (double)buf[i], (double)trow[i]);
                }
            }
            double exact = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                double m;
                (void)elem(qt->type, qrow, i, &m);
                exact += (double)trow[i] * x[i];
                mag += m * fabs((double)x[i]);
            }
            const float dr = ref->dot(qrow, x, n), df = fast->dot(qrow, x, n);
            cr_assert_eq(dr, (float)exact, "%s %.*s row %lld: ref dot %a, twin %a", name,
                         (int)qt->name.len, qt->name.ptr, (long long)r, (double)dr, exact);
            cr_assert(fabs((double)df - dr) <= dot_tol(n, mag), "%s %.*s row %lld: fast %a ref %a",
                      name, (int)qt->name.len, qt->name.ptr, (long long)r, (double)df, (double)dr);
        }
        free(buf);
        free(x);
    }
    twin_close(&c);
    return seen;
}

#define BIT(t) (1ull << (t))
Test(quant, twin_q8_0) {
    cr_assert_eq(check_twin("qwen2-tiny-q8_0"), BIT(RK_DT_Q8_0) | BIT(RK_DT_F32));
}
Test(quant, twin_q4_0) {
    cr_assert_eq(check_twin("llama-tiny-q4_0"), BIT(RK_DT_Q4_0) | BIT(RK_DT_Q6_K) | BIT(RK_DT_F32));
}
Test(quant, twin_q4_1) {
    cr_assert_eq(check_twin("llama-tiny-q4_1"), BIT(RK_DT_Q4_1) | BIT(RK_DT_Q6_K) | BIT(RK_DT_F32));
}
Test(quant, twin_q4_k_m) {
    cr_assert_eq(check_twin("llama-tiny-q4_k_m"),
                 BIT(RK_DT_Q4_K) | BIT(RK_DT_Q6_K) | BIT(RK_DT_F32));
}

/* ---- integer dots against 8-bit activations (rk_qdot_ref / rk_qdot_fast) ----
 * The activation blocks are read here from their documented layout (rk_kernels.h):
 * block size 32: f32 d, int32 sum, 32 int8 codes; 256: f32 d, 16 int16 sums, 256 codes. */

static const uint32_t qdot_types[] = {RK_DT_Q8_0, RK_DT_Q4_0, RK_DT_Q4_1, RK_DT_Q4_K, RK_DT_Q6_K};
#define N_QDOT (sizeof qdot_types / sizeof qdot_types[0])

static float act_d(const rk_qdot_fns *f, const uint8_t *xq, int64_t blk) {
    float d;
    memcpy(&d, xq + (size_t)blk * f->act_bytes, 4);
    return d;
}
static int act_q(const rk_qdot_fns *f, const uint8_t *xq, int64_t i) {
    const uint8_t *b = xq + (size_t)(i / f->act_block) * f->act_bytes;
    return (int8_t)b[(f->act_block == 32 ? 8 : 36) + i % f->act_block];
}
/* |x - d q| per element: nearbyint leaves 1/2, and x * (127/amax) carries two
 * f32 roundings against d = amax/127 (one more), so d (1/2 + 127 * 3u) with room. */
static double act_err_bound(float d) {
    return (double)d * (0.5 + 127 * 4 * 0x1p-24);
}

static uint8_t *act_alloc(const rk_qdot_fns *f, int64_t n, void **base) {
    const size_t bytes = (size_t)(n / f->act_block) * f->act_bytes;
    uint8_t *mem = malloc(bytes + 4);
    cr_assert(mem);
    *base = mem;
    return mem + 4; /* 4-byte aligned as documented, not 16- or 32-byte */
}

Test(quant, qdot_tables) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = all_types[t];
        const bool has = type == RK_DT_Q8_0 || type == RK_DT_Q4_0 || type == RK_DT_Q4_1 ||
                         type == RK_DT_Q4_K || type == RK_DT_Q6_K;
        const rk_qdot_fns *r = rk_qdot_ref(type), *f = rk_qdot_fast(type);
        cr_assert_eq(r != NULL, has, "%s", rk_dtype_name(type));
        if (f) cr_assert(has && f->act_block == r->act_block && f->act_bytes == r->act_bytes);
        if (has) {
            const int want = type == RK_DT_Q4_K || type == RK_DT_Q6_K ? 256 : 32;
            cr_assert_eq(r->act_block, want, "%s", rk_dtype_name(type));
            cr_assert_eq(r->act_bytes, (size_t)(want == 32 ? 40 : 292));
            cr_assert_eq((int)blck(type), want);
        }
    }
    cr_assert_null(rk_qdot_ref(RK_DT_Q8_1));
    cr_assert_null(rk_qdot_fast(RK_DT_F16));
#if defined(__x86_64__)
    if (rk_cpu_has_avx2()) cr_assert_not_null(rk_qdot_fast(RK_DT_Q4_K));
#endif
}

/* The quantiser: codes in [-127, 127], d = amax / 127, |x - d q| within the bound,
 * the block sums, the NaN/Inf and tiny-block rules; AVX2 bytes = scalar bytes. */
Test(quant, qdot_activation_blocks) {
    uint64_t rng = 99;
    const uint32_t by_block[] = {RK_DT_Q4_0, RK_DT_Q4_K};
    for (int bi = 0; bi < 2; bi++) {
        const rk_qdot_fns *r = rk_qdot_ref(by_block[bi]), *f = rk_qdot_fast(by_block[bi]);
        const int64_t B = r->act_block, nb = 9, n = nb * B;
        for (int rep = 0; rep < 6; rep++) {
            float *x = rand_x(n, &rng);
            const float scale[] = {1.0f, 1e3f, 1e-3f, 3e-20f, 1e25f, 1.0f};
            for (int64_t i = 0; i < n; i++) x[i] *= scale[rep];
            for (int64_t i = 0; i < B; i++) x[B + i] = 0.0f;             /* block 1: zeros */
            for (int64_t i = 0; i < B; i++) x[2 * B + i] = i ? 0 : -1.5f; /* block 2: one value */
            for (int64_t i = 0; i < B; i++) x[3 * B + i] *= 1e-33f;      /* block 3: tiny */
            x[4 * B + 7] = NAN;                                          /* block 4: NaN */
            x[5 * B + B - 1] = rep % 2 ? INFINITY : -INFINITY;           /* block 5: Inf */
            for (int64_t i = 0; i < B; i++) x[6 * B + i] = (float)(i % 5) - 2.0f; /* ties at 127 * k / 2 */
            void *b1, *b2;
            uint8_t *q = act_alloc(r, n, &b1), *qf = act_alloc(r, n, &b2);
            r->quant_act(x, q, n);
            for (int64_t b = 0; b < nb; b++) {
                const float d = act_d(r, q, b);
                if (b == 4 || b == 5) {
                    cr_assert(isnan(d), "block %lld: non-finite input, d %g", (long long)b, (double)d);
                    for (int64_t i = b * B; i < (b + 1) * B; i++) cr_assert_eq(act_q(r, q, i), 0);
                    continue;
                }
                float amax = 0;
                for (int64_t i = b * B; i < (b + 1) * B; i++) amax = fmaxf(amax, fabsf(x[i]));
                const float want_d = amax < 1e-30f ? 0.0f : amax / 127.0f;
                cr_assert(same_bits(d, want_d), "B=%lld block %lld: d %a want %a", (long long)B, (long long)b,
                          (double)d, (double)want_d);
                long sum = 0, sub = 0;
                for (int64_t i = b * B; i < (b + 1) * B; i++) {
                    const int c = act_q(r, q, i);
                    cr_assert(c >= -127 && c <= 127);
                    const double e = fabs((double)x[i] - (double)d * c);
                    if (want_d == 0)
                        cr_assert(c == 0 && fabsf(x[i]) < 1e-30f);
                    else
                        cr_assert_leq(e, act_err_bound(d), "B=%lld x[%lld]=%g: d %g q %d", (long long)B,
                                      (long long)i, (double)x[i], (double)d, c);
                    sum += c;
                    sub += c;
                    if (B == 256 && (i + 1) % 16 == 0) { /* int16 bsums at offset 4 */
                        int16_t bs;
                        memcpy(&bs, q + (size_t)b * r->act_bytes + 4 + 2 * ((i % 256) / 16), 2);
                        cr_assert_eq(bs, sub, "block %lld bsum %lld", (long long)b, (long long)((i % 256) / 16));
                        sub = 0;
                    }
                }
                if (B == 32) {
                    int32_t s;
                    memcpy(&s, q + (size_t)b * r->act_bytes + 4, 4);
                    cr_assert_eq(s, sum, "block %lld sum", (long long)b);
                }
                if (b == 2) cr_assert_eq(act_q(r, q, b * B), -127); /* |x| = amax maps to 127 */
            }
            if (f) {
                f->quant_act(x, qf, n);
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *pa = q + (size_t)b * r->act_bytes, *pb = qf + (size_t)b * r->act_bytes;
                    if (b == 4 || b == 5) { /* NaN payloads may differ */
                        cr_assert(isnan(act_d(f, qf, b)));
                        cr_assert(memcmp(pa + 4, pb + 4, r->act_bytes - 4) == 0);
                    } else {
                        cr_assert(memcmp(pa, pb, r->act_bytes) == 0, "B=%lld rep %d block %lld: fast bytes differ",
                                  (long long)B, rep, (long long)b);
                    }
                }
            }
            free(b1);
            free(b2);
            free(x);
        }
    }
}

/* Dots on the quantised activation: against the exact sum of w_i * d q_i (test's
 * own decoder, double). Integer parts are exact; each block adds at most three f32
 * roundings (d_w * d_x, int -> f32, the lane's FMA), each lane accumulates nb
 * blocks, merges cost a handful: (nb + 12) u sum |parts * d q| bounds the fast
 * dot; the scalar one sums in double (one final f32 rounding). Then the contract
 * the cpu backend's MATMUL relies on, against the f32 reference on the original
 * x: |e| <= sum_i |w_i| |x_i - d q_i| (the activation bound above) plus rounding. */
Test(quant, qdot_random_vs_exact_and_ref) {
    uint64_t rng = 1234;
    for (size_t t = 0; t < N_QDOT; t++) {
        const uint32_t type = qdot_types[t];
        const rk_qdot_fns *r = rk_qdot_ref(type), *f = rk_qdot_fast(type);
        const rk_quant_fns *fr = rk_quant_ref(type);
        const int64_t B = r->act_block;
        const int64_t lens[] = {1, 2, 3, 6, 7, 35};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t nb = lens[li], n = nb * B;
            for (int rep = 0; rep < 3; rep++) {
                void *wb, *xb;
                const uint8_t *w = rand_row(type, n, &rng, &wb);
                float *x = rand_x(n, &rng);
                if (rep == 2)
                    for (int64_t i = 0; i < n; i++) x[i] *= (float)(1 + i % 7) * 0.3f; /* uneven blocks */
                uint8_t *xq = act_alloc(r, n, &xb);
                r->quant_act(x, xq, n);
                double exact = 0, mag = 0, qerr = 0, magx = 0;
                for (int64_t i = 0; i < n; i++) {
                    double m;
                    const double wi = elem(type, w, i, &m), d = act_d(r, xq, i / B);
                    const double xh = d * act_q(r, xq, i);
                    exact += wi * xh;
                    mag += m * fabs(xh);
                    magx += m * fabs((double)x[i]);
                    qerr += fabs(wi) * act_err_bound((float)d);
                }
                const float dr = r->dot(w, xq, n);
                cr_assert_leq(fabs((double)dr - exact), 0x1p-24 * fabs(exact) + 0x1p-40 * mag,
                              "%s n=%lld: scalar qdot %.9g vs exact %.9g", rk_dtype_name(type), (long long)n,
                              (double)dr, exact);
                const double tol = (double)(nb + 12) * 0x1p-24 * mag + 1e-30;
                if (f) {
                    const float df = f->dot(w, xq, n);
                    cr_assert_leq(fabs((double)df - exact), tol, "%s n=%lld: AVX2 qdot %.9g vs exact %.9g (tol %.3g)",
                                  rk_dtype_name(type), (long long)n, (double)df, exact, tol);
                }
                /* the f32 reference on x: within the quantisation bound */
                const double want = fr->dot(w, x, n);
                const float got = (f ? f : r)->dot(w, xq, n);
                const double bound = qerr + tol + dot_tol(n, magx);
                cr_assert_leq(fabs((double)got - want), bound, "%s n=%lld: qdot %.9g vs f32 ref %.9g (bound %.3g)",
                              rk_dtype_name(type), (long long)n, (double)got, want, bound);
                free(xb);
                free(x);
                free(wb);
            }
        }
    }
}

/* A NaN or Inf in an activation block makes the dot NaN (never a finite value). */
Test(quant, qdot_nonfinite) {
    uint64_t rng = 5;
    for (size_t t = 0; t < N_QDOT; t++) {
        const uint32_t type = qdot_types[t];
        const rk_qdot_fns *fns[2] = {rk_qdot_ref(type), rk_qdot_fast(type)};
        const int64_t n = 3 * fns[0]->act_block;
        void *wb, *xb;
        const uint8_t *w = rand_row(type, n, &rng, &wb);
        for (int k = 0; k < 2; k++) {
            if (!fns[k]) continue;
            for (int v = 0; v < 3; v++) {
                float *x = rand_x(n, &rng);
                x[n / 2 + 1] = v == 0 ? NAN : v == 1 ? INFINITY : -INFINITY;
                uint8_t *xq = act_alloc(fns[k], n, &xb);
                fns[k]->quant_act(x, xq, n);
                cr_assert(isnan(fns[k]->dot(w, xq, n)), "%s %s: non-finite x gave a number", rk_dtype_name(type),
                          k ? "avx2" : "scalar");
                free(xb);
                free(x);
            }
        }
        free(wb);
    }
}

/* dot_x4 (prefill: one weight row, four activation rows) is the same computation
 * as dot for each pair: bit for bit, with an odd-aligned weight row and a stride
 * that is not a multiple of the row. */
Test(quant, qdot_x4_equals_dot) {
    uint64_t rng = 77;
    for (size_t t = 0; t < N_QDOT; t++) {
        const uint32_t type = qdot_types[t];
        const rk_qdot_fns *f = rk_qdot_fast(type);
        if (!f || !f->dot_x4) continue;
        const int64_t lens[] = {1, 3, 6, 35};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li] * f->act_block;
            const size_t row = (size_t)(n / f->act_block) * f->act_bytes, stride = row + 4;
            void *wb;
            const uint8_t *w = rand_row(type, n, &rng, &wb);
            uint8_t *mem = malloc(4 * stride + 4), *xq = mem + 4;
            cr_assert(mem);
            for (int r = 0; r < 4; r++) {
                float *x = rand_x(n, &rng);
                if (r == 2) x[n - 1] = NAN; /* one NaN row: only its output is NaN */
                f->quant_act(x, xq + r * stride, n);
                free(x);
            }
            float o[4];
            f->dot_x4(w, xq, stride, n, o);
            for (int r = 0; r < 4; r++) {
                const float want = f->dot(w, xq + r * stride, n);
                cr_assert(same_bits(o[r], want), "%s n=%lld row %d: dot_x4 %a, dot %a", rk_dtype_name(type),
                          (long long)n, r, (double)o[r], (double)want);
                cr_assert_eq(isnan(o[r]), r == 2);
            }
            free(mem);
            free(wb);
        }
    }
}

/* dot_2w (decode: two weight rows, one activation row) is dot on each row, bit for
 * bit, with the rows at an odd offset and a stride that is not the row size; a NaN
 * activation makes both NaN. */
Test(quant, qdot_2w_equals_dot) {
    uint64_t rng = 91;
    int checked = 0;
    for (size_t t = 0; t < N_QDOT; t++) {
        const uint32_t type = qdot_types[t];
        const rk_qdot_fns *f = rk_qdot_fast(type);
        if (!f || !f->dot_2w) continue;
        const int64_t lens[] = {1, 2, 3, 18, 35};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li] * f->act_block;
            const size_t rb = row_bytes(type, n), ws = rb + 5;
            uint8_t *mem = malloc(2 * ws + 1), *w = mem + 1;
            cr_assert(mem);
            for (int r = 0; r < 2; r++) {
                void *wb;
                const uint8_t *row = rand_row(type, n, &rng, &wb);
                memcpy(w + r * ws, row, rb);
                free(wb);
            }
            void *xb;
            uint8_t *xq = act_alloc(f, n, &xb);
            for (int nan = 0; nan < 2; nan++) {
                float *x = rand_x(n, &rng);
                if (nan) x[n / 2] = NAN;
                f->quant_act(x, xq, n);
                free(x);
                float o[2];
                f->dot_2w(w, ws, xq, n, o);
                for (int r = 0; r < 2; r++) {
                    const float want = f->dot(w + r * ws, xq, n);
                    cr_assert(same_bits(o[r], want), "%s n=%lld row %d: dot_2w %a, dot %a", rk_dtype_name(type),
                              (long long)n, r, (double)o[r], (double)want);
                    cr_assert_eq(isnan(o[r]), nan == 1);
                }
                checked++;
            }
            free(xb);
            free(mem);
        }
    }
    if (rk_cpu_has_avx2()) cr_assert_gt(checked, 0, "no dot_2w kernel was checked");
}
