/* RK_OP_LR_KEYS, LowRAM's decode key rebuild as a backend op: cpu against cpu_ref, and plain
 * RoPE as an independent check. Part of the runtime_lowram test binary. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "rk_kernels.h"
static uint64_t lrk_seed = 0x9e3779b97f4a7c15ull;
static float lrk_rand(void) {
    lrk_seed = lrk_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lrk_seed >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* cpu (1 and 2 threads) against cpu_ref on random rows, f16 and f32 bases with a row stride
 * wider than the head, both RoPE layouts, with and without the cos/sin table. Bound: f32
 * against double accumulation of r products, |Δ| <= 1e-5 · Σ_j |c_j B_jd| / s_d + |mean|
 * per element (r · 2^-24 · that sum is 1.2e-6 at r = 20), plus the table's f32 rounding of
 * cos and sin (6e-8 relative to the rotated magnitude). Independently of either backend:
 * with r = hd, an identity basis, 1/s = 1 and mean 0 the op is plain RoPE of the
 * coefficients, compared with RK_OP_ROPE. */
Test(lowram, lr_keys_op_matches_cpu_ref) {
    enum { N = 37, R = 20, HD = 16, LD = 40, NR = 12, NP = 6000 };
    float cf[N * R], mw[2 * HD], bf[R * LD], *tab = malloc((size_t)NP * NR * sizeof(float));
    uint16_t bh[R * LD];
    int32_t pos[N];
    for (int i = 0; i < N * R; i++) cf[i] = lrk_rand();
    for (int i = 0; i < R * LD; i++) bf[i] = rk_f16_to_f32(bh[i] = rk_f32_to_f16(lrk_rand()));
    for (int d = 0; d < HD; d++) mw[d] = lrk_rand(), mw[HD + d] = 0.5f + lrk_rand() * 0.25f;
    for (int k = 0; k < N; k++) pos[k] = (int32_t)((lrk_rand() + 1.0f) * 0.5f * (NP - 1));
    rk_backend *ref = NULL, *cpu1 = NULL, *cpu2 = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_backend_cpu_ref_create(&ref, &e), RK_OK);
    cr_assert_eq(rk_backend_cpu_create(1, &cpu1, &e), RK_OK);
    cr_assert_eq(rk_backend_cpu_create(2, &cpu2, &e), RK_OK);
    rk_backend *bes[2] = {cpu1, cpu2};
    for (int mode = 0; mode < 2; mode++) {
        const rk_rope_params rp = {.mode = mode ? RK_ROPE_NEOX : RK_ROPE_NORM, .n_rot = NR, .freq_base = 10000.0f};
        double freq[NR / 2];
        for (int i = 0; i < NR / 2; i++) freq[i] = pow(10000.0, -2.0 * i / NR);
        for (int p = 0; p < NP; p++)
            for (int i = 0; i < NR / 2; i++)
                tab[p * NR + 2 * i] = (float)cos(p * freq[i]), tab[p * NR + 2 * i + 1] = (float)sin(p * freq[i]);
        for (int f16 = 0; f16 < 2; f16++)
            for (int use_tab = 0; use_tab < 2; use_tab++) {
                float want[N * HD], got[N * HD];
                rk_op_args a = {.op = RK_OP_LR_KEYS,
                                .dst = {RK_DT_F32, {HD, N}, HD * 4, want},
                                .src0 = {RK_DT_F32, {R, N}, R * 4, cf},
                                .src1 = {f16 ? RK_DT_F16 : RK_DT_F32,
                                         {HD, R},
                                         (size_t)LD * (f16 ? 2 : 4),
                                         f16 ? (void *)(bh + 3) : (void *)(bf + 3)},
                                .src2 = {RK_DT_F32, {HD, 2}, HD * 4, mw},
                                .ids = pos,
                                .rope = rp,
                                .lr_rope_cs = use_tab ? tab : NULL,
                                .lr_rope_rows = use_tab ? NP : 0};
                cr_assert_eq(rk_backend_run(ref, &a, &e), RK_OK, "%s", e.msg);
                for (int b = 0; b < 2; b++) {
                    a.dst.data = got;
                    cr_assert_eq(rk_backend_run(bes[b], &a, &e), RK_OK, "%s", e.msg);
                    for (int k = 0; k < N; k++) {
                        double sc = 0;
                        for (int d = 0; d < HD; d++) {
                            double s = fabs(mw[d]);
                            for (int j = 0; j < R; j++) s += fabs(cf[k * R + j] * bf[j * LD + 3 + d]) * mw[HD + d];
                            sc = fmax(sc, s);
                        }
                        for (int d = 0; d < HD; d++)
                            cr_assert_leq(fabs(got[k * HD + d] - want[k * HD + d]), 1e-5 * sc + 1e-7,
                                          "mode %d f16 %d table %d threads %d: row %d dim %d: %g vs %g", mode, f16,
                                          use_tab, b + 1, k, d, got[k * HD + d], want[k * HD + d]);
                    }
                }
            }
        /* identity basis: plain RoPE of the coefficients */
        float eye[HD * HD] = {0}, mw0[2 * HD] = {0}, x[N * HD], y[N * HD];
        for (int d = 0; d < HD; d++) eye[d * HD + d] = 1, mw0[HD + d] = 1;
        for (int i = 0; i < N * HD; i++) x[i] = lrk_rand();
        for (int k = 0; k < N; k++) {
            rk_op_args a = {.op = RK_OP_LR_KEYS,
                            .dst = {RK_DT_F32, {HD, 1}, HD * 4, y + k * HD},
                            .src0 = {RK_DT_F32, {HD, 1}, HD * 4, x + k * HD},
                            .src1 = {RK_DT_F32, {HD, HD}, HD * 4, eye},
                            .src2 = {RK_DT_F32, {HD, 2}, HD * 4, mw0},
                            .ids = &pos[k],
                            .rope = rp};
            cr_assert_eq(rk_backend_run(cpu2, &a, &e), RK_OK, "%s", e.msg);
            rk_op_args ro = {.op = RK_OP_ROPE, .src0 = {RK_DT_F32, {HD, 1, 1}, HD * 4, x + k * HD}, .rope = rp};
            ro.rope.pos0 = pos[k];
            cr_assert_eq(rk_backend_run(ref, &ro, &e), RK_OK, "%s", e.msg); /* in place */
            for (int d = 0; d < HD; d++)
                cr_assert_leq(fabs(y[k * HD + d] - x[k * HD + d]), 1e-6 * (1 + fabs(x[k * HD + d])),
                              "identity basis row %d dim %d: %g vs RoPE %g", k, d, y[k * HD + d], x[k * HD + d]);
        }
    }
    /* bad arguments are named, nothing written */
    float out[N * HD];
    rk_op_args a = {.op = RK_OP_LR_KEYS,
                    .dst = {RK_DT_F32, {HD, N}, HD * 4, out},
                    .src0 = {RK_DT_F32, {R, N}, R * 4, cf},
                    .src1 = {RK_DT_F32, {HD, R}, LD * 4, bf},
                    .src2 = {RK_DT_F32, {HD, 2}, HD * 4, mw},
                    .ids = pos,
                    .rope = {RK_ROPE_NORM, NR, 10000.0f, 0},
                    .lr_rope_cs = tab,
                    .lr_rope_rows = 100};
    cr_expect_eq(rk_backend_run(cpu2, &a, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "LR_KEYS") && strstr(e.msg, "position"), "%s", e.msg);
    a.lr_rope_cs = NULL, a.src1.ne[1] = R - 1;
    cr_expect_eq(rk_backend_run(ref, &a, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "basis shape"), "%s", e.msg);
    a.src1.ne[1] = R, a.src2.ne[1] = 1;
    cr_expect_eq(rk_backend_run(cpu1, &a, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "mean"), "%s", e.msg);
    a.src2.ne[1] = 2, a.src1.type = RK_DT_Q8_0, a.src1.ne[0] = 32;
    cr_expect_neq(rk_backend_run(cpu1, &a, &e), RK_OK);
    free(tab);
    rk_backend_destroy(ref), rk_backend_destroy(cpu1), rk_backend_destroy(cpu2);
}


/* Stored rows into f32 (lr_decode_row: the AVX2 path where the CPU has it) against the
 * format's definition written out here: int8 = q·scale, q4 = (nibble - 8)·scale with the
 * low nibble first; one product per value, so equal bit for bit. Lengths around the 8- and
 * 32-value steps (the tails take the scalar loop), every byte value, odd f16 scales. */
Test(lowram, stored_rows_decode_to_their_definition) {
    const int lens[] = {2, 8, 30, 32, 34, 64, 70, 180, 360};
    uint8_t src[2 + 360];
    float got[360];
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
        const int n = lens[li];
        for (int trial = 0; trial < 4; trial++) {
            const uint16_t h = rk_f32_to_f16(0.0137f * (float)(trial + 1) * (trial & 1 ? -1.0f : 1.0f));
            const float sc = rk_f16_to_f32(h);
            src[0] = (uint8_t)(h & 255), src[1] = (uint8_t)(h >> 8);
            for (int i = 0; i < 360; i++) src[2 + i] = (uint8_t)(i * 37 + trial * 101 + li);
            lr_decode_row(RK_DT_Q8_0, src, n, got);
            for (int i = 0; i < n; i++)
                cr_assert_eq(got[i], (float)(int8_t)src[2 + i] * sc, "int8 n=%d i=%d: %g", n, i, (double)got[i]);
            lr_decode_row(RK_DT_Q4_0, src, n, got);
            for (int i = 0; i < n; i++) {
                const uint8_t b = src[2 + i / 2];
                const int q = (i & 1 ? b >> 4 : b & 15) - 8;
                cr_assert_eq(got[i], (float)q * sc, "q4 n=%d i=%d: %g want %g", n, i, (double)got[i],
                             (double)((float)q * sc));
            }
        }
    }
}
