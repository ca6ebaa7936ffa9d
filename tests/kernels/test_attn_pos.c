/* ATTN over positioned rows (rk_op_args.attn_kv_pos / attn_kv_bias, RidgeFill's grouped
 * filled rows, runtime/prefill/fill_group.c): a row standing for c identical rows with
 * bias log c gives exactly the attention of the c rows, so the positioned list of a cache
 * whose runs of rows are identical must equal plain attention over the whole cache (to
 * float rounding: the same f16 rows, the sums in another order); the causal cut follows
 * the positions; malformed lists are refused by rk_backend_run. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backends.h"
#include "tb.h"

enum { NH = 4, NKV = 2, HD = 32, KVD = NKV * HD, QD = NH * HD, N_CTX = 40, N_Q = 6, POS0 = 34 };

/* runs of identical rows [a, b] (inclusive), all before the queries */
static const int runs[][2] = {{4, 11}, {12, 15}, {17, 19}, {21, 29}, {30, 33}};

static int run_of(int j) {
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
        if (j >= runs[r][0] && j <= runs[r][1]) return (int)r;
    return -1;
}

Test(attn_pos, grouped_rows_equal_the_identical_rows_they_stand_for) {
    uint64_t rng = 0x5eedull;
    static uint16_t k[N_CTX * KVD], v[N_CTX * KVD], gk[N_CTX * KVD], gv[N_CTX * KVD];
    static float q[N_Q * QD], ref[N_Q * QD], out[N_Q * QD];
    int32_t pos[N_CTX];
    float bias[N_CTX];
    for (int j = 0; j < N_CTX; j++) {
        const int r = run_of(j);
        if (r >= 0 && j > runs[r][0]) { /* a copy of the run's first row */
            memcpy(k + j * KVD, k + runs[r][0] * KVD, KVD * sizeof *k);
            memcpy(v + j * KVD, v + runs[r][0] * KVD, KVD * sizeof *v);
            continue;
        }
        for (int e = 0; e < KVD; e++) {
            k[j * KVD + e] = rk_f32_to_f16(1.5f * tb_rand_normal(&rng));
            v[j * KVD + e] = rk_f32_to_f16(tb_rand_normal(&rng));
        }
    }
    for (int i = 0; i < N_Q * QD; i++) q[i] = tb_rand_normal(&rng);
    /* the positioned list: one row per run (at its last position, bias log count), the rest as they are */
    int64_t n = 0;
    for (int j = 0; j < N_CTX; j++) {
        const int r = run_of(j);
        if (r >= 0 && j != runs[r][1]) continue;
        memcpy(gk + n * KVD, k + j * KVD, KVD * sizeof *k);
        memcpy(gv + n * KVD, v + j * KVD, KVD * sizeof *v);
        pos[n] = j;
        bias[n] = r >= 0 ? logf((float)(runs[r][1] - runs[r][0] + 1)) : 0.0f;
        n++;
    }
    cr_assert_lt(n, N_CTX - 20, "the list should be much shorter than the cache (%lld rows)", (long long)n);
    rk_backend *rb = cpu_backend(0);
    rk_op_args a = {.op = RK_OP_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {QD, N_Q, 1, 1}, QD * sizeof(float), q};
    a.dst = (rk_view){RK_DT_F32, {QD, N_Q, 1, 1}, QD * sizeof(float), ref};
    a.src1 = (rk_view){RK_DT_F16, {KVD, N_CTX, 1, 1}, KVD * 2, k};
    a.src2 = (rk_view){RK_DT_F16, {KVD, N_CTX, 1, 1}, KVD * 2, v};
    a.attn = (rk_attn_params){NH, NKV, HD, 1.0f / sqrtf((float)HD), POS0};
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(rb, &a, &err), RK_OK, "%s", err.msg);
    rk_backend_destroy(rb);
    for (int which = 0; which <= 3; which++) {
        rk_backend *be = cpu_backend(which);
        rk_op_args g = a;
        g.dst.data = out;
        g.src1 = (rk_view){RK_DT_F16, {KVD, n, 1, 1}, KVD * 2, gk};
        g.src2 = (rk_view){RK_DT_F16, {KVD, n, 1, 1}, KVD * 2, gv};
        g.attn_kv_pos = pos, g.attn_kv_bias = bias, g.attn_n_kv = n;
        memset(out, 0, sizeof out);
        cr_assert_eq(rk_backend_run(be, &g, &err), RK_OK, "%s", err.msg);
        /* outputs are convex combinations of N(0,1) values: |o| < 4; f32 sums of <= 40
         * terms in another order: a few ulps of 4 */
        double worst = 0;
        for (int i = 0; i < N_Q * QD; i++) worst = fmax(worst, fabs((double)out[i] - ref[i]));
        cr_assert_lt(worst, 2e-5, "%s: grouped vs whole cache differ by %g", be->ops->name, worst);
        /* without the bias each run counts once: a different answer (the test can fail) */
        g.attn_kv_bias = NULL;
        cr_assert_eq(rk_backend_run(be, &g, &err), RK_OK, "%s", err.msg);
        double moved = 0;
        for (int i = 0; i < N_Q * QD; i++) moved = fmax(moved, fabs((double)out[i] - ref[i]));
        cr_assert_gt(moved, 1e-3, "%s: the bias changed nothing", be->ops->name);
        rk_backend_destroy(be);
    }
}

/* ATTN of one 2-dim query row at pos0 over four f32 key/value rows (one head) */
static rk_op_args attn4(float *q, float *o, float *kf, float *vf, int64_t pos0) {
    rk_op_args a = {.op = RK_OP_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {2, 1, 1, 1}, 8, q};
    a.dst = (rk_view){RK_DT_F32, {2, 1, 1, 1}, 8, o};
    a.src1 = (rk_view){RK_DT_F32, {2, 4, 1, 1}, 8, kf};
    a.src2 = (rk_view){RK_DT_F32, {2, 4, 1, 1}, 8, vf};
    a.attn = (rk_attn_params){1, 1, 2, 1.0f, pos0};
    return a;
}

Test(attn_pos, causal_cut_follows_the_positions) {
    /* keys at positions 0, 3, 3, 7; a query at position 5 sees the first three only, one at 2 only the first */
    float q[2] = {0.4f, -1.1f}, o[2] = {0};
    float kf[8] = {1, 0, 0.5f, 2, -1, 1, 3, 3}, vf[8] = {1, 2, 3, 4, 5, 6, 1000, 1000};
    int32_t pos[4] = {0, 3, 3, 7};
    for (int which = 0; which <= 3; which++) {
        rk_backend *be = cpu_backend(which);
        rk_op_args a = attn4(q, o, kf, vf, 5);
        a.attn_kv_pos = pos, a.attn_n_kv = 4;
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        double s[3], z = 0, e0 = 0, e1 = 0;
        for (int j = 0; j < 3; j++) z += (s[j] = exp(q[0] * kf[2 * j] + q[1] * kf[2 * j + 1]));
        for (int j = 0; j < 3; j++) e0 += s[j] / z * vf[2 * j], e1 += s[j] / z * vf[2 * j + 1];
        cr_assert_float_eq(o[0], e0, 1e-5, "%s", be->ops->name);
        cr_assert_float_eq(o[1], e1, 1e-5, "%s", be->ops->name);
        a.attn.pos0 = 2;
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        cr_assert_float_eq(o[0], 1.0f, 1e-6, "%s", be->ops->name);
        cr_assert_float_eq(o[1], 2.0f, 1e-6, "%s", be->ops->name);
        rk_backend_destroy(be);
    }
}

Test(attn_pos, malformed_lists_refused) {
    float q[2] = {0}, o[2], kf[8] = {0}, vf[8] = {0}, bias[4] = {0, 0, NAN, 0};
    int32_t down[4] = {0, 3, 2, 7}, up[4] = {0, 1, 2, 3};
    rk_backend *be = cpu_backend(1);
    rk_op_args a = attn4(q, o, kf, vf, 9);
    rk_err err = {0};
    a.attn_kv_pos = down, a.attn_n_kv = 4;
    cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
    cr_assert(strstr(err.msg, "kv_pos"), "%s", err.msg);
    a.attn_kv_pos = up, a.attn_n_kv = 5;
    cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
    a.attn_n_kv = 4, a.attn_kv_bias = bias;
    cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
    cr_assert(strstr(err.msg, "kv_bias"), "%s", err.msg);
    a.attn_kv_pos = NULL;
    bias[2] = 0;
    cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
    rk_backend_destroy(be);
}
