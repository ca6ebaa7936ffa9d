/* Long evals over a fitted LowRAM codec (runtime/kv/lowram_dense.c): the layer's compressed
 * rows rebuilt once for the backend's ATTN compute the same function as the row-by-row dense
 * path (the `rowattn` ablation), for a prompt compressed while it streams (pfit) and for a
 * long second eval after the fit (a chat turn). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "rt_shared.h"
#include "session_impl.h"

static rk_session *session(const rk_model *m, uint32_t exact_type, const char *lowram, int n_batch) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.n_threads = 2;
    sp.n_batch = n_batch;
    rk_err e = {0};
    sp.kv.kind = RK_KV_LOWRAM;
    cr_assert_eq(rk_lowram_parse(lowram, &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
    sp.kv.lowram.exact_type = exact_type;
    if (sp.kv.lowram.fit_min == 0) sp.kv.lowram.fit_min = -1; /* no start threshold on 512 rows */
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

static const rk_kv_codec *codec(const rk_session *s) { return s->kv->impl; }

/* Logits after each of the evals [0, cut[0]), [cut[0], cut[1]), ... (n_cut evals). */
static float *evals(rk_session *s, const int32_t *ids, const int *cut, int n_cut, int nv) {
    float *lg = malloc((size_t)n_cut * nv * sizeof(float));
    rk_err e = {0};
    for (int i = 0, p = 0; i < n_cut; p = cut[i++])
        cr_assert_eq(rk_session_eval(s, ids + p, (size_t)(cut[i] - p), lg + (size_t)i * nv, false, &e), RK_OK, "%s",
                     e.msg);
    return lg;
}

static double max_abs(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static double range(const float *a, size_t n) {
    float lo = a[0], hi = a[0];
    for (size_t i = 1; i < n; i++) lo = fminf(lo, a[i]), hi = fmaxf(hi, a[i]);
    return (double)hi - lo;
}

/* The two paths sum the same terms in another order (the backend's tiles against one
 * online softmax per row), so with f32 rows they agree to float rounding: 1e-4 of the logit
 * range over ~10 layers of 300 rows is generous for fp32 (2^-24 per add, a few thousand
 * adds per output) and far below what a wrong row moves them (a missing residual, bias or
 * RoPE angle, a row at the wrong position: each more than 1e-2 of the range when tried by
 * hand on this path). With f16 rows the rebuilt K and V are rounded to f16 as the exact
 * rows are: bound 2e-3 of the range (f16's 2^-11 relative step through the same layers). */
static void compare_on(bool trained, const char *spec, uint32_t type, int n_batch, const int *cut, int n_cut,
                       double tol) {
    rk_model *m = trained ? rt_load_shared("models/stories260K/stories260K-f32.gguf") : rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab;
    int32_t *ids = trained ? rt_story_ids(m, (size_t)cut[n_cut - 1]) : rt_random_ids(m, (size_t)cut[n_cut - 1], 11);
    char row[256];
    snprintf(row, sizeof row, "%s,rowattn", spec);
    rk_session *a = session(m, type, spec, n_batch), *b = session(m, type, row, n_batch);
    float *la = evals(a, ids, cut, n_cut, nv), *lb = evals(b, ids, cut, n_cut, nv);
    const rk_kv_codec *ca = codec(a), *cb = codec(b);
    cr_assert(ca->fitted && cb->fitted);
    cr_expect_gt(ca->n_dense, 0, "%s: the rebuild-once path never ran", spec);
    cr_expect_eq(cb->n_dense, 0, "%s: rowattn took the rebuild-once path", spec);
    const double d = max_abs(la, lb, (size_t)n_cut * nv), rg = range(lb, (size_t)n_cut * nv);
    cr_log_info("%s (%s rows, batch %d): rebuilt-once vs row-by-row max |dlogit| %.3g of range %.3g (%lld calls)", spec,
                type == RK_DT_F32 ? "f32" : "f16", n_batch, d, rg, (long long)ca->n_dense);
    cr_expect_leq(d, tol * rg, "%s: max |dlogit| %g, range %g", spec, d, rg);
    free(la), free(lb), free(ids);
    rk_session_destroy(a), rk_session_destroy(b);
    rk_model_destroy(m);
}

/* On a generated model of stories260K's shape (random weights). */
static void compare(const char *spec, uint32_t type, int n_batch, const int *cut, int n_cut, double tol) {
    compare_on(false, spec, type, n_batch, cut, n_cut, tol);
}

/* A prompt fed in batches of 64 with pfit=128: every batch after the fit attends compressed rows. */
Test(lowram_dense, pfit_prompt_matches_row_path) {
    const int cut[] = {448};
    compare("window=32,chunk=16,pfit=128", RK_DT_F32, 64, cut, 1, 1e-4);
}

/* The same with f16 rows, on the trained model: its layers carry the f16 rounding through at
 * about the step itself (random weights amplify it: 3.3e-3 of the range measured there). */
Test(lowram_dense_shared, pfit_prompt_f16_rows_match_row_path) {
    const int cut[] = {448};
    compare_on(true, "window=32,chunk=16,pfit=128", RK_DT_F16, 64, cut, 1, 2e-3);
}

/* Fit at the end of a 256-row prompt, then a 96-row turn and a 100-row turn. */
Test(lowram_dense, long_turn_after_fit_matches_row_path) {
    const int cut[] = {256, 352, 452};
    compare("window=32,chunk=16", RK_DT_F32, 512, cut, 3, 1e-4);
    compare("window=32,chunk=16,keys_only", RK_DT_F32, 512, cut, 3, 1e-4);
}

/* Positions the path cannot take as contiguous (eviction) keep the row-by-row path. */
Test(lowram_dense, eviction_keeps_row_path) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, cut[] = {256, 352};
    int32_t *ids = rt_random_ids(m, (size_t)(352), 11);
    rk_session *s = session(m, RK_DT_F32, "window=32,chunk=16,evict=0.3", 512);
    float *lg = evals(s, ids, cut, 2, nv);
    const rk_kv_codec *c = codec(s);
    cr_assert(c->fitted);
    cr_expect_gt(c->n_evicted, 0);
    cr_expect_eq(c->n_dense, 0);
    for (int i = 0; i < 2 * nv; i++) cr_assert(isfinite(lg[i]));
    free(lg), free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
}
