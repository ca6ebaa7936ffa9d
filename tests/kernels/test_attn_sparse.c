/* Block-sparse ATTN (rk_op_args.attn_sparse, kernels/attn_sparse.c) on the CPU backends:
 * every block selected equals dense attention; a given mask equals this file's own
 * double-precision masked attention, with the sinks' and the window's blocks always in;
 * calls too short to go sparse are bit for bit the dense kernel's; a planted vertical line
 * is found by the estimation and keeps the output near dense at a fraction of the blocks;
 * the greedy opens only the blocks its mass needs; the calibration counters cover all the mass at the last threshold; bad settings are
 * refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backends.h"
#include "rk_attn_sparse.h"
#include "tb.h"

enum { NH = 6, NKV = 2, HD = 32, KVD = NKV * HD, QD = NH * HD, N_CTX = 320, POS0 = 96, N_Q = 224, B = 16 };
enum { N_KB = (POS0 + N_Q - 1) / B + 1, QB0 = POS0 / B, N_QB = (POS0 + N_Q - 1) / B - QB0 + 1 };

static uint16_t kc[N_CTX * KVD], vc[N_CTX * KVD];
static float q[N_Q * QD];

/* K, V ~ N(0, 1) as f16; q ~ N(0, 1); `vertical` >= 0 plants a key every query favours */
static void fill(uint64_t seed, int vertical) {
    uint64_t rng = seed;
    float u[HD];
    for (int d = 0; d < HD; d++) u[d] = tb_rand_normal(&rng);
    for (int j = 0; j < N_CTX; j++)
        for (int e = 0; e < KVD; e++) kc[j * KVD + e] = rk_f32_to_f16(tb_rand_normal(&rng));
    for (int e = 0; e < KVD * N_CTX; e++) vc[e] = rk_f32_to_f16(tb_rand_normal(&rng));
    for (int i = 0; i < N_Q * QD; i++) q[i] = 0.5f * tb_rand_normal(&rng);
    if (vertical < 0) return;
    for (int hk = 0; hk < NKV; hk++)
        for (int d = 0; d < HD; d++) kc[vertical * KVD + hk * HD + d] = rk_f32_to_f16(4.0f * u[d]);
    for (int i = 0; i < N_Q; i++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < HD; d++) q[i * QD + h * HD + d] += 4.0f * u[d];
}

static rk_op_args args(float *out) {
    rk_op_args a = {.op = RK_OP_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {QD, N_Q, 1, 1}, QD * sizeof(float), q};
    a.dst = (rk_view){RK_DT_F32, {QD, N_Q, 1, 1}, QD * sizeof(float), out};
    a.src1 = (rk_view){RK_DT_F16, {KVD, N_CTX, 1, 1}, KVD * 2, kc};
    a.src2 = (rk_view){RK_DT_F16, {KVD, N_CTX, 1, 1}, KVD * 2, vc};
    a.attn = (rk_attn_params){NH, NKV, HD, 1.0f / sqrtf((float)HD), POS0};
    return a;
}

static rk_attn_sparse layout(const uint8_t *mask, rk_attn_sparse_stats *stats) {
    return (rk_attn_sparse){.block = B,
                            .min_kv = 0,
                            .dense_from = INT64_MAX,
                            .n_sink = 8,
                            .window = 24,
                            .n_est = 16,
                            .mass = 0.95f,
                            .mask = mask,
                            .stats = stats};
}

static void run(int which, const rk_op_args *a) {
    rk_backend *be = cpu_backend(which);
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(be, a, &err), RK_OK, "%s: %s", be->ops->name, err.msg);
    rk_backend_destroy(be);
}

/* the test's own masked attention in double: key j is in for the row at position p when
 * its block is selected, a sink block, within the window, and j <= p */
static void masked_ref(const uint8_t *mask, const rk_attn_sparse *sp, double *out) {
    const float scale = 1.0f / sqrtf((float)HD);
    for (int t = 0; t < N_Q; t++) {
        const int p = POS0 + t, qb = p / B;
        const int lo = qb * B - sp->window <= 0 ? 0 : (qb * B - sp->window) / B, sink_b = (sp->n_sink + B - 1) / B;
        for (int h = 0; h < NH; h++) {
            const int hk = h / (NH / NKV);
            double sc[N_CTX], mx = -INFINITY, sum = 0, acc[HD] = {0};
            for (int j = 0; j <= p; j++) {
                const int jb = j / B;
                sc[j] = -INFINITY;
                if (!(mask[((qb - QB0) * NH + h) * N_KB + jb] || jb < sink_b || jb >= lo)) continue;
                double s = 0;
                for (int d = 0; d < HD; d++)
                    s += (double)q[t * QD + h * HD + d] * rk_f16_to_f32(kc[j * KVD + hk * HD + d]);
                sc[j] = s * scale;
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= p; j++) {
                if (sc[j] == -INFINITY) continue;
                const double w = exp(sc[j] - mx);
                sum += w;
                for (int d = 0; d < HD; d++) acc[d] += w * rk_f16_to_f32(vc[j * KVD + hk * HD + d]);
            }
            for (int d = 0; d < HD; d++) out[t * QD + h * HD + d] = acc[d] / sum;
        }
    }
}

static double worst_vs(const float *o, const double *ref) {
    double w = 0;
    for (int i = 0; i < N_Q * QD; i++) w = fmax(w, fabs((double)o[i] - ref[i]));
    return w;
}

/* Outputs are convex combinations of N(0,1) values (|o| < 5); cpu_ref sums in double (1e-6
 * covers the f32 store), cpu in f32 over <= 320 terms with a 1e-7 exp: a few 1e-6. */
static double tol(int which) { return which == 0 ? 1e-6 : 3e-5; }

Test(attn_sparse, every_block_selected_equals_dense) {
    fill(1, -1);
    static uint8_t all[N_QB * NH * N_KB];
    memset(all, 1, sizeof all);
    static double ref[N_Q * QD];
    rk_attn_sparse sp = layout(all, NULL);
    masked_ref(all, &sp, ref);
    static float dense[N_Q * QD], out[N_Q * QD];
    rk_op_args a = args(dense);
    run(0, &a);
    cr_assert_lt(worst_vs(dense, ref), 1e-6, "cpu_ref dense vs the test's reference: %g", worst_vs(dense, ref));
    for (int which = 0; which <= 3; which++) {
        rk_attn_sparse_stats st = {0};
        sp = layout(all, &st);
        rk_op_args s = args(out);
        s.attn_sparse = &sp;
        run(which, &s);
        cr_expect_lt(worst_vs(out, ref), tol(which), "backend %d: all blocks vs dense %g", which, worst_vs(out, ref));
        cr_expect_eq(st.blocks_done, st.blocks_causal, "backend %d: %llu of %llu blocks", which,
                     (unsigned long long)st.blocks_done, (unsigned long long)st.blocks_causal);
        cr_expect_eq(st.calls_sparse, 1);
    }
}

Test(attn_sparse, a_given_mask_equals_masked_attention_with_sinks_and_window) {
    fill(2, -1);
    static uint8_t mask[N_QB * NH * N_KB], none[N_QB * NH * N_KB];
    uint64_t rng = 9;
    for (size_t i = 0; i < sizeof mask; i++) mask[i] = tb_rand_u64(&rng) % 3 == 0;
    static double ref[N_Q * QD];
    static float out[N_Q * QD];
    for (int pass = 0; pass < 2; pass++) { /* a random mask; an empty one: sinks and window only */
        const uint8_t *m = pass ? none : mask;
        rk_attn_sparse sp = layout(m, NULL);
        masked_ref(m, &sp, ref);
        uint64_t expect = 0, causal = 0; /* the blocks the rule above selects */
        for (int b = 0; b < N_QB; b++)
            for (int h = 0; h < NH; h++)
                for (int jb = 0; jb <= QB0 + b; jb++) {
                    const int qb = QB0 + b, lo = qb * B - sp.window <= 0 ? 0 : (qb * B - sp.window) / B;
                    expect += m[(b * NH + h) * N_KB + jb] || jb < 1 || jb >= lo;
                    causal++;
                }
        for (int which = 0; which <= 3; which++) {
            rk_attn_sparse_stats st = {0};
            sp.stats = &st;
            rk_op_args a = args(out);
            a.attn_sparse = &sp;
            run(which, &a);
            cr_expect_lt(worst_vs(out, ref), tol(which), "pass %d backend %d: %g", pass, which, worst_vs(out, ref));
            cr_expect_eq(st.blocks_done, expect, "pass %d backend %d: %llu blocks, expected %llu", pass, which,
                         (unsigned long long)st.blocks_done, (unsigned long long)expect);
            cr_expect_eq(st.blocks_causal, causal);
        }
        if (pass) cr_expect_lt(expect, causal / 2, "sinks and window alone should be a minority of blocks");
    }
}

Test(attn_sparse, short_calls_and_the_dense_tail_are_the_dense_kernel_bit_for_bit) {
    fill(3, -1);
    static float dense[N_Q * QD], out[N_Q * QD];
    for (int which = 0; which <= 3; which++) {
        rk_op_args a = args(dense);
        run(which, &a);
        rk_attn_sparse_stats st = {0};
        rk_attn_sparse sp = layout(NULL, &st);
        sp.min_kv = POS0 + N_Q + 1; /* the last row sees fewer keys */
        rk_op_args s = args(out);
        s.attn_sparse = &sp;
        run(which, &s);
        cr_expect(!memcmp(out, dense, sizeof out), "backend %d: below min_kv differs from dense", which);
        sp.min_kv = 0, sp.dense_from = POS0 + sp.n_est; /* no more than n_est sparse rows */
        memset(out, 0, sizeof out);
        run(which, &s);
        cr_expect(!memcmp(out, dense, sizeof out), "backend %d: a short sparse part differs from dense", which);
        cr_expect_eq(st.calls_dense, 2);
        cr_expect_eq(st.calls_sparse, 0);
    }
}

Test(attn_sparse, a_planted_vertical_line_is_found) {
    const int vert = 5 * B + 3; /* outside the sinks and, for most query blocks, the window */
    fill(4, vert);
    static float dense[N_Q * QD], out[N_Q * QD];
    for (int which = 0; which <= 3; which++) {
        rk_op_args a = args(dense);
        run(which, &a);
        rk_attn_sparse_stats st = {0};
        rk_attn_sparse sp = layout(NULL, &st);
        sp.mass = 0.9f;
        rk_op_args s = args(out);
        s.attn_sparse = &sp;
        run(which, &s);
        /* the line holds most of every row's mass (its logit is ~16 above the rest), so the
         * blocks left out hold at most a few percent: |o - o_dense| <= 2 * dropped * max|v| */
        double w = 0, vmax = 0;
        for (int i = 0; i < N_Q * QD; i++) w = fmax(w, fabs((double)out[i] - dense[i]));
        for (int i = 0; i < N_CTX * KVD; i++) vmax = fmax(vmax, fabs(rk_f16_to_f32(vc[i])));
        cr_expect_lt(w, 2 * 0.02 * vmax, "backend %d: planted line: %g from dense", which, w);
        cr_expect_lt(st.blocks_done, st.blocks_causal * 6 / 10, "backend %d: %llu of %llu blocks", which,
                     (unsigned long long)st.blocks_done, (unsigned long long)st.blocks_causal);
        cr_expect_eq(st.calls_sparse, 1);
    }
}

/* Uniform attention (q = 0: every visible key has probability 1 / (p + 1) in the row at p)
 * has no lines, so the greedy's picks are arbitrary; what it must not do is open more
 * blocks than the mass needs. A call of the last two query blocks estimates from the last
 * block's rows; each pick opens one key block for all of them (a column its block, a
 * diagonal one or two block offsets), so k openings past the always-computed blocks hold
 * sum_p (f_p + k B / (p + 1)) of their mass, f_p the computed share. The greedy stops at the
 * first k that reaches `mass` of it, plus at most one opening (a diagonal's second offset),
 * and each opening computes at most one block per query block and head. Counting each
 * line's own mass instead picks about mass - f of the keys one by one, scattered over
 * nearly every block. */
Test(attn_sparse, the_greedy_opens_only_the_blocks_the_mass_needs) {
    fill(7, -1);
    memset(q, 0, sizeof q);
    const float mass = 0.6f;
    enum { NQ = 2 * B, P0 = N_CTX - NQ, QB_FIRST = P0 / B, QB_LAST = (N_CTX - 1) / B };
    rk_attn_sparse sp0 = layout(NULL, NULL);
    sp0.n_est = B;
    const int sink_b = (sp0.n_sink + B - 1) / B;
    /* the blocks query block qb always computes: the sinks' and [lo, qb] */
    int forced_cells = 0, causal_cells = 0, lo_last = 0;
    for (int qb = QB_FIRST; qb <= QB_LAST; qb++) {
        const int lo = qb * B - sp0.window <= 0 ? 0 : (qb * B - sp0.window) / B;
        forced_cells += (lo > sink_b ? sink_b : lo) + (qb - lo + 1), causal_cells += qb + 1, lo_last = lo;
    }
    int k = 0;
    for (;; k++) {
        double held = 0;
        for (int p = N_CTX - B; p < N_CTX; p++) held += (double)(sink_b * B + (p - lo_last * B + 1) + k * B) / (p + 1);
        if (held >= mass * B * (1 - 1e-6)) break;
    }
    cr_assert(k >= 3 && k + 1 < lo_last - sink_b, "the case needs a few openings out of many: %d of %d", k,
              lo_last - sink_b);
    for (int which = 0; which <= 3; which++) {
        rk_attn_sparse_stats st = {0};
        rk_attn_sparse sp = layout(NULL, &st);
        sp.n_est = B, sp.mass = mass;
        static float out[NQ * QD];
        rk_op_args s = args(out);
        s.src0.ne[1] = s.dst.ne[1] = NQ;
        s.attn.pos0 = P0;
        s.attn_sparse = &sp;
        run(which, &s);
        cr_expect_eq(st.calls_sparse, 1, "backend %d", which);
        cr_expect_eq(st.blocks_causal, (uint64_t)causal_cells * NH, "backend %d", which);
        cr_expect_leq(st.blocks_done, (uint64_t)(forced_cells + (k + 1) * (QB_LAST - QB_FIRST + 1)) * NH,
                      "backend %d: %llu blocks, %d always computed, %d openings needed", which,
                      (unsigned long long)st.blocks_done, forced_cells * NH, k);
        /* and at least the k that the last query block needs */
        cr_expect_geq(st.blocks_done, (uint64_t)(forced_cells + k) * NH, "backend %d", which);
    }
}

/* At mass 1 every line with mass is kept, so the estimating rows (the last n_est) see every
 * key they saw densely; the calibration counters sum each measured row's probabilities
 * inside the mask: all of them when the window covers every block, and no more at a lower
 * threshold than at a higher one. */
Test(attn_sparse, mass_one_keeps_the_estimating_rows_exact_and_calibration_counts_mass) {
    fill(5, -1);
    static float dense[N_Q * QD], out[N_Q * QD];
    const float tau[2] = {0.3f, 1.0f};
    for (int which = 0; which <= 3; which += 3) {
        rk_op_args a = args(dense);
        run(which, &a);
        for (int wide = 0; wide < 2; wide++) {
            double cover[NH * 2] = {0}, rows[NH] = {0};
            rk_attn_sparse_cal cal = {.n_tau = 2, .tau = tau, .stride = 4, .cover = cover, .rows = rows};
            rk_attn_sparse sp = layout(NULL, NULL);
            sp.mass = 1.0f, sp.cal = &cal;
            if (wide) sp.window = N_CTX;
            rk_op_args s = args(out);
            s.attn_sparse = &sp;
            run(which, &s);
            double w = 0;
            for (int i = (N_Q - sp.n_est) * QD; i < N_Q * QD; i++) w = fmax(w, fabs((double)out[i] - dense[i]));
            cr_expect_lt(w, 2 * tol(which) + 1e-6, "backend %d: estimating rows vs dense %g", which, w);
            for (int h = 0; h < NH; h++) {
                cr_expect_eq(rows[h], (double)(N_Q / 4), "head %d: %g rows measured", h, rows[h]);
                /* probabilities sum to 1 per row (f32 exp, double sums) */
                cr_expect_leq(cover[h * 2 + 1], rows[h] * (1 + 1e-4), "head %d: %g of %g", h, cover[h * 2 + 1],
                              rows[h]);
                if (wide)
                    cr_expect_lt(fabs(cover[h * 2] - rows[h]), 1e-4 * rows[h],
                                 "head %d: the window covers all: %g of %g", h, cover[h * 2], rows[h]);
                cr_expect_leq(cover[h * 2], cover[h * 2 + 1] + 1e-9, "head %d: the ladder is not monotone", h);
            }
        }
    }
}

Test(attn_sparse, bad_settings_are_refused) {
    fill(6, -1);
    static float out[N_Q * QD];
    rk_attn_sparse sp = layout(NULL, NULL);
    sp.block = 0;
    rk_op_args a = args(out);
    a.attn_sparse = &sp;
    for (int which = 0; which <= 1; which++) {
        rk_backend *be = cpu_backend(which);
        rk_err err = {0};
        cr_expect_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
        cr_expect(strstr(err.msg, "block") != NULL, "%s", err.msg);
        rk_backend_destroy(be);
    }
    sp = layout(NULL, NULL);
    sp.mass = NAN;
    rk_backend *be = cpu_backend(1);
    rk_err err = {0};
    cr_expect_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
    rk_backend_destroy(be);
}

/* Identical keys give every row the same probability on every key, so many lines tie on
 * their mass: the estimation's greedy must still end (it once traded two tied lines back
 * and forth forever, a double marginal a rounding below its float key) and keep at least
 * `mass` of the estimating rows' attention: the output stays finite and every block it
 * computes is causal. */
Test(attn_sparse, tied_lines_end_the_estimation, .timeout = 20) {
    fill(6, -1);
    for (int j = 1; j < N_CTX; j++) memcpy(kc + j * KVD, kc, KVD * sizeof kc[0]);
    static float out[N_Q * QD];
    for (int which = 0; which <= 3; which++) {
        rk_attn_sparse_stats st = {0};
        rk_attn_sparse sp = layout(NULL, &st);
        rk_op_args s = args(out);
        s.attn_sparse = &sp;
        run(which, &s);
        for (int i = 0; i < N_Q * QD; i++) cr_assert(isfinite(out[i]), "backend %d: out[%d] = %g", which, i, out[i]);
        cr_expect_leq(st.blocks_done, st.blocks_causal, "backend %d", which);
        cr_expect_eq(st.calls_sparse, 1, "backend %d", which);
    }
}
