/* Per-dtype row functions (rk_quant_ref, rk_quant_fast):
 *   layout  - blocks built by hand, values by the published ggml formulas
 *   f16     - every half / bfloat16 bit pattern through both to_f32 paths
 *   exact   - dyadic scales and small integer x: every dot must be exact
 *   random  - fast vs ref on random rows: to_f32 bit-exact, dot within a bound
 *   nonfinite - NaN/Inf parity of the dot products
 *   twin    - dequantised shared/golden models vs llama.cpp's F32 twins, bit for bit
 * The oracle (elem(), quant_rows.c) decodes one element straight from the byte
 * layout, independently of kernels/quant_ref.c. The integer dots against 8-bit
 * activations are in test_quant_qdot.c (same executable). */
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

#include "quant_rows.h"

/* Asserts dst[0..n) equals the oracle bit for bit. */
static void check_decode(const char *what, uint32_t type, const uint8_t *row, const float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double mag;
        const float want = elem(type, row, i, &mag);
        if (!same_bits(dst[i], want))
            cr_assert_fail("%s %s: element %lld is %a, formula gives %a", what, rk_dtype_name(type), (long long)i,
                           (double)dst[i], (double)want);
    }
}

/* ---- dispatch ----------------------------------------------------------- */

Test(quant, tables) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const rk_quant_fns *r = rk_quant_ref(all_types[t]), *f = rk_quant_fast(all_types[t]);
        cr_assert(r && r->to_f32 && r->dot, "ref %s", rk_dtype_name(all_types[t]));
        cr_assert(f && f->to_f32 && f->dot, "fast %s", rk_dtype_name(all_types[t]));
        if (rk_cpu_has_avx2()) cr_assert(f->dot != r->dot, "fast %s is the reference", rk_dtype_name(all_types[t]));
        else cr_assert(f == r, "no AVX2 but fast %s is not ref", rk_dtype_name(all_types[t]));
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
            cr_assert(same_bits(dst[i], want[i]), "%s %s to_f32[%lld] = %a, expected %a", name[v], rk_dtype_name(type),
                      (long long)i, (double)dst[i], (double)want[i]);
        for (int64_t i = 0; i < n; i++) {
            x[i] = 1.0f; /* == rather than bits: a zero sum may be +0 where w is -0 */
            const float got = impl[v]->dot(row, x, n);
            cr_assert(got == want[i], "%s %s dot(e_%lld) = %a, expected %a", name[v], rk_dtype_name(type), (long long)i,
                      (double)got, (double)want[i]);
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
    cr_assert_eq(s[0], 0x81);  /* sc[0] = 1 in bits 0-5; bits 4-5 of sc[4] = 33 in bits 6-7 */
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
            cr_assert(same_bits(dst[i], value(h[i])), "%s %s 0x%04x -> %a, expected %a", v ? "fast" : "ref",
                      rk_dtype_name(type), (unsigned)h[i], (double)dst[i], (double)value(h[i]));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++) {
                const int64_t s0 = starts[si] + lens[li] <= n ? starts[si] : n - lens[li];
                impl[v]->to_f32(h + s0, dst, lens[li]);
                for (int64_t k = 0; k < lens[li]; k++)
                    cr_assert(same_bits(dst[k], value(h[s0 + k])), "%s %s len %lld 0x%04x", v ? "fast" : "ref",
                              rk_dtype_name(type), (long long)lens[li], (unsigned)h[s0 + k]);
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
    cr_assert_eq(rk_f32_to_f16(1.0f + 0x1p-11f), 0x3C00); /* tie -> even (down) */
    cr_assert_eq(rk_f32_to_f16(1.0f + 0x3p-11f), 0x3C02); /* tie -> even (up) */
    cr_assert_eq(rk_f32_to_f16(65520.0f), 0x7C00);        /* rounds past max -> inf */
    cr_assert_eq(rk_f32_to_f16(65519.0f), 0x7BFF);
    cr_assert_eq(rk_f32_to_f16(0x1p-25f), 0x0000); /* half the min subnormal: even */
    cr_assert_eq(rk_f32_to_f16(0x1.8p-25f), 0x0001);
    cr_assert_eq(rk_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(rk_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80); /* tie -> even */
    cr_assert_eq(rk_f32_to_bf16(1.0f + 0x3p-8f), 0x3F82);
    cr_assert(isnan(bf16_value(rk_f32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 65536; h++) /* every finite half survives the round trip */
        if (((h >> 10) & 31) != 31) cr_assert_eq(rk_f32_to_f16(half_value((uint16_t)h)), h, "0x%04x", h);
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
        const size_t nl = plain ? sizeof lens_elt / sizeof lens_elt[0] : sizeof lens_blk / sizeof lens_blk[0];
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
                    cr_assert(same_bits(a[i], b[i]), "%s n=%lld to_f32[%lld]: fast %a ref %a", rk_dtype_name(type),
                              (long long)n, (long long)i, (double)b[i], (double)a[i]);
                double mag = 0, exact = 0;
                for (int64_t i = 0; i < n; i++) {
                    double m;
                    exact += (double)elem(type, w, i, &m) * x[i];
                    mag += m * fabs((double)x[i]);
                }
                const float dr = ref->dot(w, x, n), df = fast->dot(w, x, n);
                /* same products (exact in double), same order: the same double sum */
                cr_assert(dr == (float)exact, "%s n=%lld ref dot %a vs oracle %a", rk_dtype_name(type), (long long)n,
                          (double)dr, exact);
                cr_assert(fabs((double)df - dr) <= dot_tol(n, mag),
                          "%s n=%lld fast dot %.9g ref %.9g (|diff| %.3g > tol %.3g)", rk_dtype_name(type),
                          (long long)n, (double)df, (double)dr, fabs((double)df - dr), dot_tol(n, mag));
                free(a);
                free(b);
                free(xmem);
                free(base);
            }
        }
    }
}

static int small_int(uint64_t *rng, int lo, int hi) { return lo + (int)(tb_rand_u64(rng) % (uint64_t)(hi - lo + 1)); }

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
            case RK_DT_BF16: put16(w + 2 * i, rk_f32_to_bf16((float)small_int(&rng, -32, 32))); break;
            case RK_DT_Q8_0: put16(w + 34 * i, d); break;
            case RK_DT_Q4_0: put16(w + 18 * i, d); break;
            case RK_DT_Q4_1:
                put16(w + 20 * i, d);
                put16(w + 20 * i + 2, m);
                break;
            case RK_DT_Q4_K:
                put16(w + 144 * i, d);
                put16(w + 144 * i + 2, m);
                break;
            case RK_DT_Q6_K:
                put16(w + 210 * i + 208, d);
                for (int j = 0; j < 16; j++) w[210 * i + 192 + j] = (uint8_t)(int8_t)small_int(&rng, -20, 20);
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

static int fp_class(float v) { return isnan(v) ? 0 : isinf(v) ? (v > 0 ? 1 : 2) : 3; }

/* Zeroes the scale (and min) of the block holding element i: w_i = 0 there. */
static void zero_block(uint32_t type, uint8_t *w, int64_t i) {
    const rk_dtype_traits *t = rk_dtype_get(type);
    uint8_t *b = w + (size_t)(i / t->blck_size) * t->type_size;
    switch (type) {
    case RK_DT_F32: memset(b, 0, 4); break;
    case RK_DT_F16:
    case RK_DT_BF16:
    case RK_DT_Q8_0:
    case RK_DT_Q4_0: memset(b, 0, 2); break;
    case RK_DT_Q4_1:
    case RK_DT_Q4_K: memset(b, 0, 4); break;
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
                cr_assert(isnan(dr), "%s case %d: Inf * 0 gave %a", rk_dtype_name(type), c, (double)dr);
            cr_assert_eq(fp_class(dr), fp_class(df), "%s case %d: ref %a fast %a", rk_dtype_name(type), c, (double)dr,
                         (double)df);
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
    cr_assert_eq(rk_gguf_parse(c->tbytes, c->tlen, &c->t, &err), RK_OK, "%s twin: %s", name, err.msg);
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
        cr_assert(ref, "%s: %.*s has unsupported type %u", name, (int)qt->name.len, qt->name.ptr, qt->type);
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
                    cr_assert_fail("%s %s: %.*s row %lld elem %lld = %a, twin %a", name, v ? "fast" : "ref",
                                   (int)qt->name.len, qt->name.ptr, (long long)r, (long long)i, (double)buf[i],
                                   (double)trow[i]);
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
            cr_assert_eq(dr, (float)exact, "%s %.*s row %lld: ref dot %a, twin %a", name, (int)qt->name.len,
                         qt->name.ptr, (long long)r, (double)dr, exact);
            cr_assert(fabs((double)df - dr) <= dot_tol(n, mag), "%s %.*s row %lld: fast %a ref %a", name,
                      (int)qt->name.len, qt->name.ptr, (long long)r, (double)df, (double)dr);
        }
        free(buf);
        free(x);
    }
    twin_close(&c);
    return seen;
}

#define BIT(t) (1ull << (t))
Test(quant_shared, twin_q8_0) { cr_assert_eq(check_twin("qwen2-tiny-q8_0"), BIT(RK_DT_Q8_0) | BIT(RK_DT_F32)); }
Test(quant_shared, twin_q4_0) {
    cr_assert_eq(check_twin("llama-tiny-q4_0"), BIT(RK_DT_Q4_0) | BIT(RK_DT_Q6_K) | BIT(RK_DT_F32));
}
Test(quant_shared, twin_q4_1) {
    cr_assert_eq(check_twin("llama-tiny-q4_1"), BIT(RK_DT_Q4_1) | BIT(RK_DT_Q6_K) | BIT(RK_DT_F32));
}
Test(quant_shared, twin_q4_k_m) {
    cr_assert_eq(check_twin("llama-tiny-q4_k_m"), BIT(RK_DT_Q4_K) | BIT(RK_DT_Q6_K) | BIT(RK_DT_F32));
}
