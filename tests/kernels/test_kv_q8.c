/* q8_0 KV caches: CPY_ROWS writes llama.cpp's block_q8_0 bytes exactly (vs the
 * independent oracle in q8_ref.h), and attention over such a cache stays
 * within the error its quantisation explains. The op-case rows (every
 * backend vs cpu_ref on q8_0 caches) are in test_ops.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "q8_ref.h"
#include "rk_kernels.h"
#include "cpu_backends.h"
#include "tb.h"

static rk_backend *make_be(int which) { return cpu_backend(which); }

#define FOR_EACH_BACKEND(be)                    \
    for (int which_ = 0; which_ <= 3; which_++) \
        for (rk_backend *be = make_be(which_); be; rk_backend_destroy(be), be = NULL)

static rk_view v2(uint32_t type, int64_t d, int64_t rows, void *data) {
    size_t elt = type == RK_DT_F16 ? 2 : 4;
    return (rk_view){.type = type, .ne = {d, rows, 1, 1}, .nb1 = (size_t)d * elt, .data = data};
}

Test(q8_kv, cpy_rows_bytes) {
    /* llama.cpp's block_q8_0: f16 d = amax/127, q = roundf(x / d) (ties away from zero) */
    float x[128] = {127, 2.5f, -2.5f, 0.5f, -0.5f, 1.4999f};
    x[31] = -127;
    x[64 + 3] = INFINITY;                                      /* block 2: not representable -> NaN block */
    for (int j = 0; j < 32; j++) x[96 + j] = 0.01f * j - 0.1f; /* block 3: a plain row */
    uint8_t want[4 * 34];
    tq8_quant(x, want, 128);
    const int8_t q0[6] = {127, 3, -3, 1, -1, 1};
    cr_assert_eq(want[0] | want[1] << 8, 0x3c00); /* d = 1 */
    for (int j = 0; j < 6; j++) cr_assert_eq((int8_t)want[2 + j], q0[j], "tq8 at %d", j);
    cr_assert_eq((int8_t)want[2 + 31], -127);
    cr_assert_eq(want[34] | want[35] << 8, 0, "all-zero block: d = 0");
    cr_assert_eq(want[68] | want[69] << 8, 0x7e00, "Inf block: NaN scale");
    FOR_EACH_BACKEND(be) {
        uint8_t dst[3 * 4 * 34];
        memset(dst, 0xab, sizeof dst);
        rk_op_args a = {.op = RK_OP_CPY_ROWS,
                        .src0 = v2(RK_DT_F32, 128, 1, x),
                        .dst = {RK_DT_Q8_0, {128, 3, 1, 1}, 4 * 34, dst},
                        .dst_row0 = 2};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        for (int i = 0; i < (int)sizeof dst; i++)
            cr_assert_eq(dst[i], i >= 2 * 136 ? want[i - 2 * 136] : 0xab, "%s at byte %d", be->ops->name, i);
    }
    uint8_t lib[4 * 34];
    rk_quant_q8_0_from_f32(x, lib, 128);
    cr_assert_eq(memcmp(lib, want, sizeof lib), 0);
}

static double nmse_f(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return num / den;
}

/* Attention over K/V written into q8_0 caches by CPY_ROWS vs cpu_ref over the
 * f32 rows themselves. With eps_k, eps_v the NMSE of the quantised caches:
 * a V error enters the output as the same weighted average as V, so NMSE ~
 * eps_v; a K error e moves score j by scale*q.e, variance scale^2 |q|^2 eps_k
 * E[k^2] = eps_k here (q, k ~ N(0,1), scale = 1/sqrt(hd)), which moves the
 * output by sum_j p_j ds_j (v_j - out): NMSE ~ eps_k again. Bound: 4 (eps_k +
 * eps_v). And eps itself: q8_0 rounds to d = amax/127 steps, error variance
 * d^2/12; a block of 32 N(0,1) values has amax ~ 2.5 (P(amax > 4.4) < 1e-3),
 * so eps ~ 3e-5 and < 1e-4. */
Test(q8_kv, attention_error_from_quantisation) {
    const int n_head = 8, n_kv = 2, hd = 64, n_q = 5;
    const int64_t pos0 = 300, n_ctx = pos0 + n_q, kvd = (int64_t)n_kv * hd, qd = (int64_t)n_head * hd;
    uint64_t s = 0x9a8b;
    float *k = malloc((size_t)(n_ctx * kvd) * 4), *v = malloc((size_t)(n_ctx * kvd) * 4);
    float *q = malloc((size_t)(n_q * qd) * 4), *want = malloc((size_t)(n_q * qd) * 4);
    float *got = malloc((size_t)(n_q * qd) * 4), *deq = malloc((size_t)(n_ctx * kvd) * 4);
    size_t rb = (size_t)kvd / 32 * 34;
    uint8_t *kq = malloc((size_t)n_ctx * rb), *vq = malloc((size_t)n_ctx * rb);
    cr_assert(k && v && q && want && got && deq && kq && vq);
    for (int64_t i = 0; i < n_ctx * kvd; i++) k[i] = tb_rand_normal(&s), v[i] = tb_rand_normal(&s);
    for (int64_t i = 0; i < n_q * qd; i++) q[i] = tb_rand_normal(&s);
    rk_op_args at = {.op = RK_OP_ATTN,
                     .src0 = v2(RK_DT_F32, qd, n_q, q),
                     .dst = v2(RK_DT_F32, qd, n_q, want),
                     .src1 = v2(RK_DT_F32, kvd, n_ctx, k),
                     .src2 = v2(RK_DT_F32, kvd, n_ctx, v)};
    at.attn = (rk_attn_params){n_head, n_kv, hd, 1.0f / sqrtf((float)hd), pos0};
    rk_backend *ref = make_be(0);
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(ref, &at, &err), RK_OK, "%s", err.msg);
    rk_backend_destroy(ref);
    FOR_EACH_BACKEND(be) {
        rk_op_args c = {.op = RK_OP_CPY_ROWS,
                        .src0 = v2(RK_DT_F32, kvd, n_ctx, k),
                        .dst = {RK_DT_Q8_0, {kvd, n_ctx, 1, 1}, rb, kq}};
        cr_assert_eq(rk_backend_run(be, &c, &err), RK_OK, "%s", err.msg);
        c.src0.data = v, c.dst.data = vq;
        cr_assert_eq(rk_backend_run(be, &c, &err), RK_OK, "%s", err.msg);
        double eps[2];
        for (int w = 0; w < 2; w++) {
            for (int64_t i = 0; i < n_ctx * kvd; i++) deq[i] = tq8_get((w ? vq : kq) + i / kvd * rb, i % kvd);
            eps[w] = nmse_f(deq, w ? v : k, (size_t)(n_ctx * kvd));
            cr_assert(eps[w] > 1e-6 && eps[w] < 1e-4, "%s: q8_0 cache NMSE %g (expected ~3e-5)", be->ops->name, eps[w]);
        }
        rk_op_args a8 = at;
        a8.src1 = (rk_view){RK_DT_Q8_0, {kvd, n_ctx, 1, 1}, rb, kq};
        a8.src2 = (rk_view){RK_DT_Q8_0, {kvd, n_ctx, 1, 1}, rb, vq};
        a8.dst.data = got;
        cr_assert_eq(rk_backend_run(be, &a8, &err), RK_OK, "%s", err.msg);
        double e = nmse_f(got, want, (size_t)(n_q * qd));
        cr_assert_leq(e, 4 * (eps[0] + eps[1]), "%s: q8_0 attention NMSE %g vs f32 (eps_k %g, eps_v %g)", be->ops->name,
                      e, eps[0], eps[1]);
        cr_assert_gt(e, 0.0, "%s: q8_0 attention identical to f32: the cache was not quantised", be->ops->name);
    }
    free(k), free(v), free(q), free(want), free(got), free(deq), free(kq), free(vq);
}

/* ATTN on q4_0 K/V (llama.cpp's block_q4_0: the q4 KV cache of runtime/kv) on every CPU
 * backend equals ATTN on f32 rows holding the same values (decoded by the reference Q4_0
 * decoder): the values are identical, only the summation order may differ, so within
 * 1e-5 relative (f32 sums of ~300 terms). Blocks are random codes under random f16 scales. */
Test(q8_kv, attention_on_q4_0_blocks_equals_f32_rows) {
    const int n_head = 4, n_kv = 2, hd = 64, n_q = 3;
    const int64_t pos0 = 290, n_ctx = pos0 + n_q, kvd = (int64_t)n_kv * hd, qd = (int64_t)n_head * hd;
    const size_t rb = (size_t)kvd / 32 * 18;
    uint64_t s = 0x4a11;
    uint8_t *kq = malloc((size_t)n_ctx * rb), *vq = malloc((size_t)n_ctx * rb);
    float *k = malloc((size_t)(n_ctx * kvd) * 4), *v = malloc((size_t)(n_ctx * kvd) * 4);
    float *q = malloc((size_t)(n_q * qd) * 4), *want = malloc((size_t)(n_q * qd) * 4);
    float *got = malloc((size_t)(n_q * qd) * 4);
    cr_assert(kq && vq && k && v && q && want && got);
    for (int w = 0; w < 2; w++) {
        uint8_t *b = w ? vq : kq;
        for (size_t blk = 0; blk < (size_t)n_ctx * rb / 18; blk++) {
            const uint16_t d = rk_f32_to_f16(0.05f + 0.3f * (float)(tb_rand_u64(&s) % 1000) / 1000.0f);
            memcpy(b + blk * 18, &d, 2);
            for (int j = 0; j < 16; j++) b[blk * 18 + 2 + j] = (uint8_t)tb_rand_u64(&s);
        }
        rk_quant_ref(RK_DT_Q4_0)->to_f32(b, w ? v : k, n_ctx * kvd);
    }
    for (int64_t i = 0; i < n_q * qd; i++) q[i] = tb_rand_normal(&s);
    rk_op_args at = {.op = RK_OP_ATTN,
                     .src0 = v2(RK_DT_F32, qd, n_q, q),
                     .dst = v2(RK_DT_F32, qd, n_q, want),
                     .src1 = v2(RK_DT_F32, kvd, n_ctx, k),
                     .src2 = v2(RK_DT_F32, kvd, n_ctx, v)};
    at.attn = (rk_attn_params){n_head, n_kv, hd, 1.0f / sqrtf((float)hd), pos0};
    rk_backend *ref = make_be(0);
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(ref, &at, &err), RK_OK, "%s", err.msg);
    rk_backend_destroy(ref);
    FOR_EACH_BACKEND(be) {
        rk_op_args a4 = at;
        a4.src1 = (rk_view){RK_DT_Q4_0, {kvd, n_ctx, 1, 1}, rb, kq};
        a4.src2 = (rk_view){RK_DT_Q4_0, {kvd, n_ctx, 1, 1}, rb, vq};
        a4.dst.data = got;
        cr_assert_eq(rk_backend_run(be, &a4, &err), RK_OK, "%s: %s", be->ops->name, err.msg);
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < n_q * qd; i++)
            worst = fmax(worst, fabs((double)got[i] - want[i])), scale = fmax(scale, fabs((double)want[i]));
        cr_expect_leq(worst, 1e-5 * scale, "%s: q4_0 ATTN differs from f32 rows by %g (scale %g)", be->ops->name, worst,
                      scale);
        cr_expect_gt(scale, 0.0);
    }
    free(kq), free(vq), free(k), free(v), free(q), free(want), free(got);
}
