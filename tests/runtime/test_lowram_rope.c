/* LowRAM under RoPE scaling, on a generated model of stories260K's shape with YaRN (factor
 * 4: scaled frequencies and mscale 1 + 0.1 ln 4) or linear scaling in its GGUF. The codec
 * rebuilds keys as RoPE(mean + C·B): the rebuild must turn by the scaled angles and carry
 * the mscale the model's RoPE put on every key, or the rebuilt keys are not the model's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"
#include "rk_ext.h"
#include "rt_shared.h"
#include "tb.h"

static rk_model *scaled_model(const char *scaling) {
    tb_tiny_spec spec = tb_tiny_stories_spec(1);
    spec.n_ctx_train = 128; /* the session's 512 rows are 4x the original context */
    spec.rope_scaling = scaling;
    spec.rope_factor = 4.0f;
    rk_model *m = rt_tiny_loaded(&spec);
    cr_assert_neq(rk_model_hparams(m)->rope_scaling.type, RK_ROPE_SCALING_NONE);
    return m;
}

/* A plain cache of kv_type, or (lowram != NULL) LowRAM with that spec over exact rows of kv_type. */
static rk_session *session(const rk_model *m, uint32_t kv_type, const char *lowram) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.n_threads = 2;
    sp.kv.kind = kv_type == RK_DT_F32 ? RK_KV_F32 : RK_KV_F16;
    rk_err e = {0};
    if (lowram) {
        sp.kv.kind = RK_KV_LOWRAM;
        cr_assert_eq(rk_lowram_parse(lowram, &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
        sp.kv.lowram.exact_type = kv_type;
        if (sp.kv.lowram.fit_min == 0) sp.kv.lowram.fit_min = -1; /* compress these 512-row sessions */
    }
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

/* Prefill n_prompt tokens, then n_dec teacher-forced steps: (n_dec + 1, nv) logits. */
static float *trace(rk_session *s, const int32_t *ids, int n_prompt, int n_dec, int nv) {
    float *lg = malloc((size_t)(n_dec + 1) * nv * sizeof(float));
    cr_assert(lg);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, (size_t)n_prompt, lg, false, &e), RK_OK, "%s", e.msg);
    for (int i = 0; i < n_dec; i++)
        cr_assert_eq(rk_session_eval(s, &ids[n_prompt + i], 1, lg + (size_t)(i + 1) * nv, false, &e), RK_OK, "%s",
                     e.msg);
    return lg;
}

/* Full rank, f32 coefficients, every residual kept in f16: lossless up to rounding, so the
 * bound is test_lowram.c's for the lossless codec: within twice the distance between the f16
 * and f32 plain caches, plus 1e-4. Dense (every compressed row rebuilt by the host's
 * rotation) and sparse with a budget above the rows (keys rebuilt by RK_OP_LR_KEYS into the
 * f16 key cache), for YaRN and for linear scaling. A missing mscale would scale every
 * compressed key by 1 / 1.139 and a wrong angle turns it: both far outside the bound. */
static void exact_rank_case(const char *scaling) {
    rk_model *m = scaled_model(scaling);
    const int nv = rk_model_hparams(m)->n_vocab, n_prompt = 300, n_dec = 24;
    int32_t *ids = rt_random_ids(m, (size_t)(n_prompt + n_dec), 11);
    ids[290] = ids[20]; /* one token at a compressed position and in the exact window */
    rk_session *s16 = session(m, RK_DT_F16, NULL), *s32 = session(m, RK_DT_F32, NULL);
    const char *specs[] = {"rank=100000,resid=1,rtype=f16,coef=f32,dense,window=64",
                           "rank=100000,resid=1,rtype=f16,coef=f32,window=64,budget=100000,kcache=f16,full=0,vpin=0"};
    float *a = trace(s16, ids, n_prompt, n_dec, nv), *b = trace(s32, ids, n_prompt, n_dec, nv);
    const size_t n = (size_t)(n_dec + 1) * nv;
    const double d16_32 = rt_max_abs_diff(a, b, n);
    for (int i = 0; i < 2; i++) {
        rk_session *lr = session(m, RK_DT_F16, specs[i]);
        float *c = trace(lr, ids, n_prompt, n_dec, nv);
        rk_lowram_stats st;
        rk_session_lowram_stats(lr, &st);
        cr_assert(st.fitted, "%s: the codec should have compressed the prompt", specs[i]);
        rk_kv_bytes kb;
        rk_session_kv_bytes(lr, &kb);
        cr_assert_gt(kb.n_compressed_rows, 200, "rows compressed: %lld", (long long)kb.n_compressed_rows);
        const double dlr = rt_max_abs_diff(a, c, n);
        cr_log_info("%s %s: lowram vs f16 %.3g, f16 vs f32 %.3g", scaling, specs[i], dlr, d16_32);
        cr_expect(dlr <= 2 * d16_32 + 1e-4, "%s, %s: lowram vs f16 %g, f16 vs f32 %g", scaling, specs[i], dlr, d16_32);
        /* the pre-RoPE read divides YaRN's mscale out, as the plain caches' read does */
        rk_err e = {0};
        const int kvd = rk_model_hparams(m)->n_head_kv * rk_model_hparams(m)->head_dim;
        float *kl = malloc((size_t)kvd * sizeof(float)), *kp = malloc((size_t)kvd * sizeof(float));
        cr_assert_eq(rk_session_kv_rows(lr, 2, false, true, 100, 1, kl, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_kv_rows(s32, 2, false, true, 100, 1, kp, &e), RK_OK, "%s", e.msg);
        double num = 0, den = 0;
        for (int k = 0; k < kvd; k++) num += (kl[k] - kp[k]) * (double)(kl[k] - kp[k]), den += kp[k] * (double)kp[k];
        cr_expect_lt(sqrt(num / den), 2e-3, "%s: pre-RoPE key of a compressed row off by %g (relative)", scaling,
                     sqrt(num / den));
        /* layer 0's pre-RoPE key depends on the token only: the compressed row 20 (un-rotated
         * by the codec's angles at the fit, rebuilt, mscale divided out) equals the exact row
         * 290 (un-rotated by the cache's read) up to f16 rounding; a wrong angle or mscale on
         * either side would not */
        cr_assert_eq(rk_session_kv_rows(lr, 0, false, true, 20, 1, kl, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_kv_rows(lr, 0, false, true, 290, 1, kp, &e), RK_OK, "%s", e.msg);
        num = den = 0;
        for (int k = 0; k < kvd; k++) num += (kl[k] - kp[k]) * (double)(kl[k] - kp[k]), den += kp[k] * (double)kp[k];
        cr_expect_lt(sqrt(num / den), 2e-3, "%s: layer 0's pre-RoPE keys of one token differ by %g (relative)", scaling,
                     sqrt(num / den));
        free(kl), free(kp), free(c);
        rk_session_destroy(lr);
    }
    free(a), free(b), free(ids);
    rk_session_destroy(s16), rk_session_destroy(s32);
    rk_model_destroy(m);
}

Test(lowram_rope, yarn_exact_rank_reproduces_f16) { exact_rank_case("yarn"); }
Test(lowram_rope, linear_exact_rank_reproduces_f16) { exact_rank_case("linear"); }

/* Mean KL per token and top-1 agreement of b against a over rows (n_dec + 1) of nv. */
static double kl_top1(const float *a, const float *b, int rows, int nv, int *agree) {
    *agree = 0;
    for (int r = 0; r < rows; r++) {
        int ta = 0, tb = 0;
        for (int v = 1; v < nv; v++) {
            if (a[(size_t)r * nv + v] > a[(size_t)r * nv + ta]) ta = v;
            if (b[(size_t)r * nv + v] > b[(size_t)r * nv + tb]) tb = v;
        }
        *agree += ta == tb;
    }
    return rt_mean_kl(a, b, rows, nv);
}

/* Prompt = ids[0], a story, then the same story again: predicting the second copy leans on
 * the first, which lies in the compressed rows. */
static int32_t *copy_prompt(const rk_model *m, int n_story, int n_prefix, int n_dec) {
    int32_t *ids = rt_story_ids(m, (size_t)n_story + 1);
    int32_t *out = malloc((size_t)(1 + n_story + n_prefix + n_dec) * sizeof(int32_t));
    cr_assert(out);
    out[0] = ids[0];
    memcpy(out + 1, ids + 1, (size_t)n_story * sizeof(int32_t));
    memcpy(out + 1 + n_story, ids + 1, (size_t)(n_prefix + n_dec) * sizeof(int32_t));
    free(ids);
    return out;
}

/* The trained stories260K (../shared) with YaRN switched on (factor 4 over an original
 * context of 128): the codec at the tiny model's scale (window 64, budget 96, chunk 16: int8
 * coefficients, predicted values with a quarter of int4 residuals, sparse selection) copying
 * from compressed rows stays within test_lowram.c's decode_stays_close_to_exact bound against
 * the f16 cache under the same RoPE: mean KL under 0.02 nats per token and top-1 agreement of
 * at least 90%. At ratio 2: this model, not trained for YaRN, is far more sensitive to key
 * error under it (the default ratio 6 gives KL 0.14 here against 0.005 without scaling, at the
 * same discarded key energy, 0.30; f16 against f32 rows moves its logits 10x more too). */
Test(lowram_rope_shared, yarn_decode_stays_close_to_f16) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    rk_rope_override o = rk_rope_override_default();
    o.type = RK_ROPE_SCALING_YARN, o.factor = 4.0f, o.orig_ctx = 128;
    rk_err e = {0};
    cr_assert_eq(rk_model_set_rope(m, &o, &e), RK_OK, "%s", e.msg);
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 60;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL), *lr = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,ratio=2");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *b = trace(lr, ids, n_prompt, n_dec, nv);
    int agree;
    const double kl = kl_top1(a, b, n_dec + 1, nv, &agree);
    rk_kv_bytes kb;
    rk_session_kv_bytes(lr, &kb);
    cr_log_info("yarn: decode KL lowram %.5f, top-1 %d/%d", kl, agree, n_dec + 1);
    cr_expect_gt(kb.n_compressed_rows, 200);
    cr_expect_lt(kl, 0.02, "KL %g", kl);
    cr_expect_geq(agree * 10, (n_dec + 1) * 9, "top-1 agreement %d of %d", agree, n_dec + 1);
    free(a), free(b), free(ids);
    rk_session_destroy(ex), rk_session_destroy(lr);
    rk_model_destroy(m);
}
