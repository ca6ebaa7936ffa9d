/* RidgeFill's grouped attention (rk_fill_params.group, runtime/prefill/fill_group.c) on
 * stories260K: group 1 runs the positioned-list path without grouping and must give the
 * logits of the plain path (the same f16 rows, the same sums in another order); a larger
 * group changes the tail's logits (the filled runs enter as their means: how close it
 * stays is measured in docs/RIDGEFILL.md, not here) while the cache keeps every filled
 * row's own K/V; a call that does not start at row 0 does not group; out-of-range groups
 * are refused. That a grouped row equals the identical rows it stands for is
 * tests/kernels/test_attn_pos.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"
#include "rk_ext.h"
#include "rt_shared.h"
#include "tb.h"

/* A session (f16 cache, 64-row chunks) after one eval of ids[0, n0) and, when n1 > n0, a
 * second of ids[n0, n1); logits of the last call's rows in *lg. */
static rk_session *run_kv(const rk_model *m, rk_kv_kind kind, const int32_t *ids, size_t n0, size_t n1,
                          const rk_fill_params *fp, float **lg) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = 64, sp.kv.kind = kind, sp.n_threads = 2;
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_set_fill(s, fp, &e), RK_OK, "%s", e.msg);
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab, last = n1 > n0 ? n1 - n0 : n0;
    *lg = malloc(last * nv * sizeof(float));
    cr_assert_eq(rk_session_eval(s, ids, n0, n1 > n0 ? NULL : *lg, n1 <= n0, &e), RK_OK, "%s", e.msg);
    if (n1 > n0) cr_assert_eq(rk_session_eval(s, ids + n0, n1 - n0, *lg, true, &e), RK_OK, "%s", e.msg);
    return s;
}

static rk_session *run(const rk_model *m, const int32_t *ids, size_t n0, size_t n1, const rk_fill_params *fp,
                       float **lg) {
    return run_kv(m, RK_KV_F16, ids, n0, n1, fp, lg);
}

static double max_diff(const float *a, const float *b, size_t from, size_t to) {
    double mx = 0;
    for (size_t i = from; i < to; i++) mx = fmax(mx, fabs((double)a[i] - b[i]));
    return mx;
}

Test(fill_group, group_one_equals_the_plain_path_and_larger_groups_keep_the_cache) {
    rk_model *m = rt_stories_like(1);
    const size_t n = 400, tail = 96, nv = (size_t)rk_model_hparams(m)->n_vocab;
    const int L = rk_model_hparams(m)->n_layer, kvd = rk_model_hparams(m)->n_head_kv * rk_model_hparams(m)->head_dim;
    int32_t *ids = rt_random_ids(m, (size_t)(n), 11);
    /* identity: filled rows' late inputs are their split stream (no maps needed), so their
     * K/V do not depend on any attention after the split */
    rk_fill_params f0 = {.mode = RK_FILL_IDENTITY, .tail = (int32_t)tail, .split = 2}, f1 = f0, f8 = f0;
    f1.group = 1, f8.group = 8;
    float *l0, *l1, *l8;
    rk_session *s0 = run(m, ids, n, 0, &f0, &l0), *s1 = run(m, ids, n, 0, &f1, &l1), *s8 = run(m, ids, n, 0, &f8, &l8);
    /* the tail's logits (the bulk rows' are NaN: no final residual) */
    const double d1 = max_diff(l0, l1, (n - tail) * nv, n * nv), d8 = max_diff(l0, l8, (n - tail) * nv, n * nv);
    cr_expect(d1 <= 1e-4, "group 1 vs plain: max |dlogit| %g", d1);
    cr_expect(d8 > 1e-3 && isfinite(d8), "group 8 should move the tail's logits (max |dlogit| %g)", d8);
    /* the cache: every filled row keeps its own K/V in every layer, grouped or not */
    float *ka = malloc((size_t)n * kvd * sizeof(float)), *kb = malloc((size_t)n * kvd * sizeof(float));
    rk_err e = {0};
    for (int l = 0; l < L; l++)
        for (int vals = 0; vals <= 1; vals++) {
            cr_assert_eq(rk_session_kv_rows(s0, l, vals, false, 0, (int64_t)(n - tail), ka, &e), RK_OK, "%s", e.msg);
            cr_assert_eq(rk_session_kv_rows(s8, l, vals, false, 0, (int64_t)(n - tail), kb, &e), RK_OK, "%s", e.msg);
            cr_expect(max_diff(ka, kb, 0, (n - tail) * kvd) == 0, "layer %d %s: bulk rows differ", l, vals ? "V" : "K");
        }
    free(ka), free(kb);
    rk_session_destroy(s0), rk_session_destroy(s1), rk_session_destroy(s8);
    free(l0), free(l1), free(l8);
    free(ids);
    rk_model_destroy(m);
}

/* With a q8 cache the lists hold q8 rows, quantised as the cache quantises its own: group 1
 * then gives the logits of the plain q8 path (a list of f16 rows would not: the exact rows
 * would be finer than the cache's). Heads of 32 values (whole q8 blocks). */
Test(fill_group, q8_cache_lists_hold_the_cache_rows) {
    static const tb_tiny_spec SPEC = {.arch = TB_ARCH_LLAMA,
                                      .n_layer = 4,
                                      .n_embd = 128,
                                      .n_head = 4,
                                      .n_head_kv = 2,
                                      .n_ctx_train = 1024,
                                      .seed = 5};
    char path[512];
    cr_assert(tb_tiny_model(&SPEC, path, sizeof path), "%s", path);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(path, &m, &e), RK_OK, "%s", e.msg);
    const size_t n = 400, tail = 96, nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t *ids = rt_random_ids(m, n, 13);
    rk_fill_params f0 = {.mode = RK_FILL_IDENTITY, .tail = (int32_t)tail, .split = 2}, f1 = f0;
    f1.group = 1;
    float *l0, *l1, *lf;
    rk_session *s0 = run_kv(m, RK_KV_Q8, ids, n, 0, &f0, &l0), *s1 = run_kv(m, RK_KV_Q8, ids, n, 0, &f1, &l1);
    rk_session *sf = run_kv(m, RK_KV_F16, ids, n, 0, &f1, &lf);
    const double d1 = max_diff(l0, l1, (n - tail) * nv, n * nv), df = max_diff(l0, lf, (n - tail) * nv, n * nv);
    cr_expect(d1 <= 1e-4, "q8: group 1 vs plain: max |dlogit| %g", d1);
    cr_expect(df > 10 * d1 && df > 1e-4, "the f16 cache's logits should differ from q8's (%g)", df);
    rk_session_destroy(s0), rk_session_destroy(s1), rk_session_destroy(sf);
    free(l0), free(l1), free(lf), free(ids);
    rk_model_destroy(m);
}

Test(fill_group, only_a_call_from_row_zero_groups) {
    rk_model *m = rt_stories_like(1);
    const size_t n0 = 64, n = 400, nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t *ids = rt_random_ids(m, (size_t)(n), 11);
    rk_fill_params f0 = {.mode = RK_FILL_IDENTITY, .tail = 96, .split = 2}, f8 = f0;
    f8.group = 8;
    float *a, *b;
    rk_session *sa = run(m, ids, n0, n, &f0, &a), *sb = run(m, ids, n0, n, &f8, &b);
    const double d = max_diff(a, b, 0, (n - n0) * nv);
    cr_expect(d == 0 || isnan(d), "a second call grouped (max |dlogit| %g)", d);
    rk_session_destroy(sa), rk_session_destroy(sb);
    free(a), free(b), free(ids);
    rk_model_destroy(m);
}

Test(fill_group, out_of_range_group_refused) {
    rk_model *m = rt_stories_like(1);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 128;
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_fill_params f = {.mode = RK_FILL_PLUMB, .tail = 32, .split = 2, .group = -1};
    cr_expect_eq(rk_session_set_fill(s, &f, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "group"), "%s", e.msg);
    f.group = 5000;
    cr_expect_eq(rk_session_set_fill(s, &f, &e), RK_E_INVALID_ARG);
    rk_session_destroy(s);
    rk_model_destroy(m);
}
