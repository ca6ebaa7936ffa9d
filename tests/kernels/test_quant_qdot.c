/* Integer dots against 8-bit activations (rk_qdot_ref, rk_qdot_fast): the tables,
 * the activation quantiser, dots against the exact sum and the f32 reference, NaN
 * rows, and the multi-row kernels (dot_x4, dot_2w) bit for bit against dot. Part of
 * the kernels_quant test (test_quant.c); helpers in quant_rows.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant_rows.h"
#include "tb.h"

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
static double act_err_bound(float d) { return (double)d * (0.5 + 127 * 4 * 0x1p-24); }

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
        const bool has =
            type == RK_DT_Q8_0 || type == RK_DT_Q4_0 || type == RK_DT_Q4_1 || type == RK_DT_Q4_K || type == RK_DT_Q6_K;
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
            for (int64_t i = 0; i < B; i++) x[B + i] = 0.0f;                      /* block 1: zeros */
            for (int64_t i = 0; i < B; i++) x[2 * B + i] = i ? 0 : -1.5f;         /* block 2: one value */
            for (int64_t i = 0; i < B; i++) x[3 * B + i] *= 1e-33f;               /* block 3: tiny */
            x[4 * B + 7] = NAN;                                                   /* block 4: NaN */
            x[5 * B + B - 1] = rep % 2 ? INFINITY : -INFINITY;                    /* block 5: Inf */
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
                    if (want_d == 0) cr_assert(c == 0 && fabsf(x[i]) < 1e-30f);
                    else
                        cr_assert_leq(e, act_err_bound(d), "B=%lld x[%lld]=%g: d %g q %d", (long long)B, (long long)i,
                                      (double)x[i], (double)d, c);
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
