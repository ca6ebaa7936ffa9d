/* RoPE scaling and the context rule on generated tiny models (tests/tb): the GGUF's
 * rope.scaling keys are read; rk_model_set_rope (the CLI's llama.cpp flags) overrides them
 * and refuses what cannot work; rk_model_n_ctx_max is n_ctx_train or orig x factor; a session
 * past it is refused with the numbers unless ctx_overflow_ok (then warned); and the logits
 * of a YaRN model at positions past its original context match the independent
 * double-precision forward (tb_ref_logits, which implements YaRN from the published
 * formulas itself). Tolerance as test_tiny.c: f32 rounding, 2e-5 * (1 + max |logit|). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_ext.h"
#include "tb.h"

static rk_model *tiny(tb_tiny_spec spec, char *path, size_t cap) {
    cr_assert(tb_tiny_model(&spec, path, cap), "%s", path);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(path, &m, &e), RK_OK, "%s", e.msg);
    return m;
}

Test(rope, gguf_yarn_keys_and_effective_context) {
    char path[512];
    rk_model *m = tiny(
        (tb_tiny_spec){
            .arch = TB_ARCH_QWEN2, .n_ctx_train = 64, .rope_scaling = "yarn", .rope_factor = 4.0f, .seed = 3},
        path, sizeof path);
    const rk_rope_scaling *r = &rk_model_hparams(m)->rope_scaling;
    cr_expect_eq(r->type, RK_ROPE_SCALING_YARN);
    cr_expect_float_eq(r->factor, 4.0f, 0);
    cr_expect_eq(r->orig_ctx, 64);
    cr_expect_float_eq(r->ext_factor, 1.0f, 0);
    cr_expect_float_eq(r->beta_fast, 32.0f, 0);
    cr_expect_float_eq(r->beta_slow, 1.0f, 0);
    cr_expect_eq(rk_model_n_ctx_max(m), 256);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 256;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_expect_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_session_destroy(s);
    s = NULL;
    sp.n_ctx = 257;
    cr_expect_eq(rk_session_create(m, &sp, &s, &e), RK_E_CONTEXT);
    cr_expect(strstr(e.msg, "257") && strstr(e.msg, "256") && strstr(e.msg, "yarn") && strstr(e.msg, "64"), "%s",
              e.msg);
    cr_expect_null(s);
    rk_model_destroy(m);
    unlink(path);
}

Test(rope, context_past_training_refused_unless_scaled_or_opted_in) {
    char path[512];
    rk_model *m = tiny((tb_tiny_spec){.arch = TB_ARCH_LLAMA, .n_ctx_train = 64, .seed = 4}, path, sizeof path);
    cr_expect_eq(rk_model_hparams(m)->rope_scaling.type, RK_ROPE_SCALING_NONE);
    cr_expect_eq(rk_model_n_ctx_max(m), 64);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 128;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_E_CONTEXT);
    cr_expect(strstr(e.msg, "128") && strstr(e.msg, "64") && strstr(e.msg, "factor >= 2"), "%s", e.msg);
    /* the opt-in: accepted, and the session says why it may be garbage */
    sp.ctx_overflow_ok = true;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    cr_expect(strstr(rk_session_warning(s), "past the 64 tokens"), "%s", rk_session_warning(s));
    rk_session_destroy(s);
    s = NULL;
    sp.ctx_overflow_ok = false;
    /* scaling without a factor on a model that has none: refused, naming the flag */
    rk_rope_override o = rk_rope_override_default();
    o.type = RK_ROPE_SCALING_YARN;
    cr_expect_eq(rk_model_set_rope(m, &o, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "--rope-scale"), "%s", e.msg);
    cr_expect_eq(rk_model_n_ctx_max(m), 64, "a refused override changes nothing");
    o.factor = 2.0f;
    cr_assert_eq(rk_model_set_rope(m, &o, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_model_n_ctx_max(m), 128);
    cr_expect_float_eq(rk_model_hparams(m)->rope_scaling.ext_factor, 1.0f, 0);
    cr_expect_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    cr_expect_str_empty(rk_session_warning(s));
    rk_session_destroy(s);
    /* --rope-scale alone on an unscaled model means linear; bad values name their flag */
    rk_rope_override l = rk_rope_override_default();
    l.type = RK_ROPE_SCALING_NONE;
    cr_assert_eq(rk_model_set_rope(m, &l, &e), RK_OK, "%s", e.msg);
    l = rk_rope_override_default();
    l.factor = 3.0f;
    cr_assert_eq(rk_model_set_rope(m, &l, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_model_hparams(m)->rope_scaling.type, RK_ROPE_SCALING_LINEAR);
    cr_expect_eq(rk_model_n_ctx_max(m), 192);
    l = rk_rope_override_default();
    l.beta_fast = 0.5f; /* below beta_slow 1 */
    cr_expect_eq(rk_model_set_rope(m, &l, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "--yarn-beta-fast"), "%s", e.msg);
    rk_model_destroy(m);
    unlink(path);
}

static void logits_vs_reference(tb_arch arch, const char *scaling) {
    char path[512];
    rk_model *m = tiny((tb_tiny_spec){.arch = arch,
                                      .n_ctx_train = 32,
                                      .rope_scaling = scaling,
                                      .rope_factor = 8.0f,
                                      .rope_base = 500.0f,
                                      .seed = 11 + (uint64_t)arch},
                       path, sizeof path);
    cr_assert_eq(rk_model_n_ctx_max(m), 256);
    const size_t n = 200; /* well past the 32 trained positions */
    int32_t ids[200];
    uint64_t st = 99;
    const int32_t nv = rk_model_hparams(m)->n_vocab;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(rk_splitmix64(&st) % (uint64_t)(nv - 8));
    char why[512];
    int32_t rnv = 0;
    float *want = tb_ref_logits(path, ids, n, &rnv, why, sizeof why);
    cr_assert(want, "%s", why);
    const rk_backend_kind kinds[2] = {RK_BACKEND_CPU_REF, RK_BACKEND_CPU};
    for (int b = 0; b < 2; b++) {
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = 256;
        sp.n_batch = 64;
        sp.backend = kinds[b];
        sp.kv.kind = RK_KV_F32;
        sp.n_threads = 2;
        rk_session *s = NULL;
        rk_err e = {0};
        cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
        float *got = malloc(n * (size_t)nv * sizeof(float));
        cr_assert_eq(rk_session_eval(s, ids, n, got, true, &e), RK_OK, "%s", e.msg);
        double worst = 0, scale = 0;
        size_t at = 0;
        for (size_t i = 0; i < n * (size_t)nv; i++) {
            scale = fmax(scale, fabs(want[i]));
            double d = fabs((double)got[i] - want[i]);
            if (d > worst) worst = d, at = i;
        }
        cr_expect(worst <= 2e-5 * (1 + scale), "%s %s: logit %zu (position %zu) off by %.3g (scale %.3g)",
                  rk_backend_kind_name(kinds[b]), scaling, at, at / (size_t)nv, worst, scale);
        free(got);
        rk_session_destroy(s);
    }
    free(want);
    rk_model_destroy(m);
    unlink(path);
}

Test(rope, yarn_logits_past_original_context_match_reference_qwen2) { logits_vs_reference(TB_ARCH_QWEN2, "yarn"); }
Test(rope, yarn_logits_past_original_context_match_reference_llama) { logits_vs_reference(TB_ARCH_LLAMA, "yarn"); }
Test(rope, linear_logits_past_original_context_match_reference) { logits_vs_reference(TB_ARCH_QWEN3, "linear"); }

/* The reference itself notices the scaling: without it the logits past 32 differ. */
Test(rope, scaling_changes_the_logits) {
    char p1[512], p2[512];
    tb_tiny_spec sp = {.arch = TB_ARCH_QWEN2, .n_ctx_train = 32, .rope_base = 500.0f, .seed = 12};
    cr_assert(tb_tiny_model(&sp, p1, sizeof p1), "%s", p1);
    sp.rope_scaling = "yarn", sp.rope_factor = 8.0f;
    cr_assert(tb_tiny_model(&sp, p2, sizeof p2), "%s", p2);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = (i * 37) % 200;
    char why[512];
    int32_t nv;
    float *a = tb_ref_logits(p1, ids, 100, &nv, why, sizeof why),
          *b = tb_ref_logits(p2, ids, 100, &nv, why, sizeof why);
    cr_assert(a && b, "%s", why);
    double d = 0;
    for (size_t i = 99 * (size_t)nv; i < 100 * (size_t)nv; i++) d = fmax(d, fabs(a[i] - b[i]));
    cr_expect(d > 1e-2, "yarn moved the last logits by only %g", d);
    free(a), free(b);
    unlink(p1), unlink(p2);
}

/* The KV caches undo the scaled rotation and its magnitude: layer 0's keys "without RoPE"
 * (rk_session_kv_rows, what the fitters read) do not depend on the scaling, so a YaRN model
 * and the same weights unscaled give the same rows (to f32 rounding of the rotation and
 * its inverse, ~1e-6 of |k|), while the rotated rows differ past position 0. */
Test(rope, kv_rows_pre_rope_undo_the_scaling) {
    char p1[512], p2[512];
    tb_tiny_spec sp = {.arch = TB_ARCH_QWEN2, .n_ctx_train = 32, .rope_base = 500.0f, .seed = 21};
    cr_assert(tb_tiny_model(&sp, p1, sizeof p1), "%s", p1);
    sp.rope_scaling = "yarn", sp.rope_factor = 8.0f;
    cr_assert(tb_tiny_model(&sp, p2, sizeof p2), "%s", p2);
    rk_model *m[2] = {NULL, NULL};
    rk_err e = {0};
    cr_assert_eq(rk_model_load(p1, &m[0], &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_model_load(p2, &m[1], &e), RK_OK, "%s", e.msg);
    const rk_hparams *hp = rk_model_hparams(m[0]);
    const int64_t n = 100, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    int32_t ids[100];
    for (int i = 0; i < n; i++) ids[i] = (i * 53 + 7) % 250;
    float *pre[2], *post[2];
    for (int k = 0; k < 2; k++) {
        rk_session_params prm = rk_session_params_default();
        prm.n_ctx = 128;
        prm.ctx_overflow_ok = true; /* the unscaled one trains on 32 */
        prm.kv.kind = RK_KV_F32;
        rk_session *s = NULL;
        cr_assert_eq(rk_session_create(m[k], &prm, &s, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_eval(s, ids, (size_t)n, NULL, false, &e), RK_OK, "%s", e.msg);
        pre[k] = malloc((size_t)(n * kvd) * sizeof(float));
        post[k] = malloc((size_t)(n * kvd) * sizeof(float));
        cr_assert_eq(rk_session_kv_rows(s, 0, false, true, 0, n, pre[k], &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_kv_rows(s, 0, false, false, 0, n, post[k], &e), RK_OK, "%s", e.msg);
        rk_session_destroy(s);
    }
    double worst = 0, scale = 0, moved = 0;
    for (int64_t i = 0; i < n * kvd; i++) {
        scale = fmax(scale, fabs(pre[0][i]));
        worst = fmax(worst, fabs(pre[0][i] - pre[1][i]));
        if (i >= kvd) moved = fmax(moved, fabs(post[0][i] - post[1][i]));
    }
    cr_expect(worst <= 1e-5 * scale, "pre-RoPE keys differ by %g (scale %g)", worst, scale);
    cr_expect(moved > 1e-2 * scale, "rotated keys moved by only %g (scale %g)", moved, scale);
    for (int k = 0; k < 2; k++) free(pre[k]), free(post[k]), rk_model_destroy(m[k]);
    unlink(p1), unlink(p2);
}
