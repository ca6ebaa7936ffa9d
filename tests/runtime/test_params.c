/* The API's version and the settings tables of rk_experimental.h: every key settable at its
 * bounds, refused just past them with a message naming the key and the range, flags and
 * their negations, choices, the "0 means none" keys, --kv lowram parsing through the table,
 * and the per-layer LowRAM statistics sized by the model. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_experimental.h"
#include "rt_shared.h"
#include "tb.h"

Test(params, version_matches_the_project) {
    cr_expect_str_eq(rk_version_string(), RK_PROJECT_VERSION, "rk.h says %s, meson.build %s", rk_version_string(),
                     RK_PROJECT_VERSION);
    cr_expect_str_eq(RK_VERSION_STRING, RK_PROJECT_VERSION);
    cr_expect_eq(rk_version_number(), RK_VERSION_NUMBER);
    cr_expect_eq(RK_VERSION_NUMBER, RK_VERSION_MAJOR * 10000 + RK_VERSION_MINOR * 100 + RK_VERSION_PATCH);
}

/* x as the text a caller would write: an integer for INTEGER keys. */
static void format_num(char *buf, size_t cap, double x, bool integer) {
    if (integer) snprintf(buf, cap, "%.0f", x);
    else snprintf(buf, cap, "%.17g", x);
}

static void check_table(const char *what, const rk_param_key *keys, size_t n, void *p0, size_t size,
                        rk_status (*set)(void *, const char *, const char *, rk_err *)) {
    cr_assert_gt(n, 0);
    void *p = malloc(size), *q = malloc(size);
    cr_assert(p && q);
    for (size_t i = 0; i < n; i++) {
        const rk_param_key *k = &keys[i];
        cr_assert(k->key && k->key[0] && k->help && k->help[0], "%s key %zu", what, i);
        for (size_t j = 0; j < i; j++) cr_expect_str_neq(keys[j].key, k->key, "%s: duplicate key %s", what, k->key);
        rk_err e = {0};
        char v[64];
        memcpy(p, p0, size);
        switch (k->kind) {
        case RK_PARAM_NUMBER:
        case RK_PARAM_INTEGER: {
            const bool integer = k->kind == RK_PARAM_INTEGER;
            cr_expect_lt(k->lo, k->hi, "%s: %s", what, k->key);
            format_num(v, sizeof v, k->lo, integer);
            cr_expect_eq(set(p, k->key, v, &e), RK_OK, "%s=%s: %s", k->key, v, e.msg);
            format_num(v, sizeof v, k->hi, integer);
            cr_expect_eq(set(p, k->key, v, &e), RK_OK, "%s=%s: %s", k->key, v, e.msg);
            /* past either end: refused, naming the key and the range, p unchanged */
            const double out[2] = {integer ? k->lo - 1 : k->lo - fmax(1e-3, fabs(k->lo) * 1e-3),
                                   integer ? k->hi + 1 : k->hi + fmax(1e-3, fabs(k->hi) * 1e-3)};
            for (int s = 0; s < 2; s++) {
                format_num(v, sizeof v, out[s], integer);
                memcpy(q, p, size);
                e = (rk_err){0};
                cr_expect_eq(set(p, k->key, v, &e), RK_E_INVALID_ARG, "%s=%s accepted", k->key, v);
                char want[64];
                snprintf(want, sizeof want, "%s=", k->key);
                cr_expect(strstr(e.msg, want) && strstr(e.msg, "[") && strstr(e.msg, v), "%s (%s)", e.msg, v);
                cr_expect_eq(memcmp(p, q, size), 0, "%s=%s changed the params", k->key, v);
            }
            cr_expect_eq(set(p, k->key, "x", &e), RK_E_INVALID_ARG, "%s=x", k->key);
            cr_expect_eq(set(p, k->key, NULL, &e), RK_E_INVALID_ARG, "%s without a value", k->key);
            if (integer && k->hi > k->lo) {
                snprintf(v, sizeof v, "%.17g", k->lo + 0.5);
                cr_expect_eq(set(p, k->key, v, &e), RK_E_INVALID_ARG, "%s=%s (not an integer)", k->key, v);
            }
            break;
        }
        case RK_PARAM_FLAG:
            cr_expect_eq(set(p, k->key, NULL, &e), RK_OK, "%s: %s", k->key, e.msg);
            cr_expect_eq(set(p, k->key, "0", &e), RK_OK, "%s=0: %s", k->key, e.msg);
            cr_expect_eq(set(p, k->key, "1", &e), RK_OK, "%s=1: %s", k->key, e.msg);
            cr_expect_eq(set(p, k->key, "yes", &e), RK_E_INVALID_ARG, "%s=yes", k->key);
            break;
        case RK_PARAM_CHOICE: {
            cr_assert(k->choices && k->choices[0]);
            char words[128];
            snprintf(words, sizeof words, "%s", k->choices);
            for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
                cr_expect_eq(set(p, k->key, w, &e), RK_OK, "%s=%s: %s", k->key, w, e.msg);
            cr_expect_eq(set(p, k->key, "f64", &e), RK_E_INVALID_ARG, "%s=f64", k->key);
            cr_expect(strstr(e.msg, k->choices), "%s", e.msg);
            break;
        }
        case RK_PARAM_PATH: cr_expect_eq(set(p, k->key, "/some/file.gguf", &e), RK_OK, "%s: %s", k->key, e.msg); break;
        }
    }
    rk_err e = {0};
    cr_expect_eq(set(p, "no_such_key", "1", &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "no_such_key"), "%s", e.msg);
    free(p), free(q);
}

static rk_status lowram_set(void *p, const char *k, const char *v, rk_err *e) {
    return rk_lowram_params_set(p, k, v, e);
}
static rk_status fill_set(void *p, const char *k, const char *v, rk_err *e) { return rk_fill_params_set(p, k, v, e); }
static rk_status kv_set(void *p, const char *k, const char *v, rk_err *e) { return rk_kv_params_set(p, k, v, e); }

Test(params, every_key_at_and_past_its_bounds) {
    size_t n = 0;
    rk_lowram_params lp = rk_lowram_params_default();
    const rk_param_key *k = rk_lowram_params_keys(&n);
    check_table("lowram", k, n, &lp, sizeof lp, lowram_set);
    rk_fill_params fp = rk_fill_params_default();
    k = rk_fill_params_keys(&n);
    check_table("ridgefill", k, n, &fp, sizeof fp, fill_set);
    rk_kv_params kp = rk_kv_params_default();
    k = rk_kv_params_keys(&n);
    check_table("kv", k, n, &kp, sizeof kp, kv_set);
    rk_err e = {0};
    cr_assert_eq(rk_kv_params_set(&kp, "budget", "536870912", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_kv_params_set(&kp, "spill_level", "3", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_kv_params_set(&kp, "budget_whole", NULL, &e), RK_OK, "%s", e.msg);
    cr_expect(kp.budget == 536870912u && kp.spill_level == 3 && kp.budget_whole);
}

/* The keys land in their fields, with the table's conventions: a negated flag, "0 means none"
 * stored as -1, dtype words. */
Test(params, keys_set_their_fields) {
    rk_lowram_params p = rk_lowram_params_default();
    rk_err e = {0};
    cr_assert_eq(rk_lowram_parse("budget=1024,ratio=8,nomass,summ,keys_only,sinks=0,start=0,vpool=0,hyst=0,"
                                 "kcache=f16,rtype=int8,coef=f32,exact=f32,chunk=8,threads=3,pred=/a,b.gguf",
                                 &p, &e),
                 RK_OK, "%s", e.msg);
    cr_expect_eq(p.budget, 1024);
    cr_expect_float_eq(p.ratio, 8.0f, 0);
    cr_expect(!p.resid_mass && !p.no_summary && p.values_exact);
    cr_expect_eq(p.n_sink, -1);
    cr_expect_eq(p.fit_min, -1);
    cr_expect_eq(p.mass_pool, -1);
    cr_expect_float_eq(p.hyst, -1.0f, 0);
    cr_expect_eq(p.kc_type, RK_DT_F16);
    cr_expect_eq(p.resid_type, RK_DT_Q8_0);
    cr_expect_eq(p.coef_type, RK_DT_F32);
    cr_expect_eq(p.exact_type, RK_DT_F32);
    cr_expect_eq(p.chunk, 8);
    cr_expect_eq(p.n_threads, 3);
    cr_expect_str_eq(p.predictor, "/a,b.gguf", "pred= takes the rest of the spec");
    /* a bad item anywhere leaves *p as it was */
    rk_lowram_params q = p;
    cr_expect_eq(rk_lowram_parse("budget=2048,chunk=33", &p, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "chunk=") && strstr(e.msg, "[1, 32]"), "%s", e.msg);
    cr_expect_eq(memcmp(&p, &q, sizeof p), 0, "a refused spec changed the params");
    /* --kv's parser goes through the same table */
    rk_kv_params kp;
    cr_expect_eq(rk_kv_params_parse("lowram:vpin=33", &kp, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "vpin=") && strstr(e.msg, "[0, 32]"), "%s", e.msg);
    cr_assert_eq(rk_kv_params_parse("lowram:budget=512,dense", &kp, &e), RK_OK, "%s", e.msg);
    cr_expect(kp.kind == RK_KV_LOWRAM && kp.lowram.budget == 512 && kp.lowram.dense);

    rk_fill_params f = rk_fill_params_default();
    cr_expect_eq(f.mode, RK_FILL_QUALITY, "the product's fill");
    cr_expect_eq(f.group, rk_fill_default_group(RK_FILL_QUALITY));
    cr_expect_lt(f.keep_share, 0.0f, "the map file's share unless set");
    cr_assert_eq(rk_fill_params_set(&f, "score_skip", "0", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_fill_params_set(&f, "obs", "16", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_fill_params_set(&f, "question_aware", NULL, &e), RK_OK, "%s", e.msg);
    cr_expect(f.score_skip == -1 && f.obs == 16 && f.question_aware);
}

Test(params, model_and_backend_settings) {
    cr_expect(rk_model_params_default().huge_pages, "huge pages are the default");
    rk_err e = {0};
    cr_expect_eq(rk_backend_cuda_module("", &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_backend_cuda_module(NULL, &e), RK_E_INVALID_ARG);
    /* without huge pages the model is the plain mapping: the same model either way */
    char path[1024];
    const tb_tiny_spec spec = tb_tiny_stories_spec(33);
    cr_assert(tb_tiny_model(&spec, path, sizeof path), "%s", path);
    rk_model_params mp = rk_model_params_default();
    mp.huge_pages = false;
    rk_model *a = NULL, *b = NULL;
    cr_assert_eq(rk_model_load_with(path, &mp, &a, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_model_load_with(path, NULL, &b, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_model_weight_bytes(a), rk_model_weight_bytes(b));
    rk_fingerprint fa, fb;
    rk_model_fingerprint(a, &fa), rk_model_fingerprint(b, &fb);
    cr_expect(fa.weights_hash == fb.weights_hash && fa.quant_hash == fb.quant_hash);
    rk_model_destroy(a), rk_model_destroy(b);
    remove(path);
}

/* value_r2 and sel_miss have n_layer (x n_head_kv) entries, borrowed from the session; the
 * R² mean is the mean of value_r2. */
Test(params, lowram_stats_sized_by_the_model) {
    rk_model *m = rt_stories_like(34);
    const rk_hparams *hp = rk_model_hparams(m);
    rk_session *s = rt_lowram_session(m, "start=0,window=32,full=2,fullmin=0.000001", 0);
    rk_lowram_stats st;
    rk_session_lowram_stats(s, &st);
    cr_expect(!st.fitted && st.value_r2 == NULL, "no fit yet");
    int32_t *ids = rt_random_ids(m, 300, 35);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, 300, NULL, false, &e), RK_OK, "%s", e.msg);
    rk_session_lowram_stats(s, &st);
    cr_assert(st.fitted);
    cr_assert_eq(st.n_layer, hp->n_layer);
    cr_assert_eq(st.n_head_kv, hp->n_head_kv);
    cr_assert(st.value_r2 && st.sel_miss);
    double sum = 0;
    for (int i = 0; i < hp->n_layer * hp->n_head_kv; i++) {
        cr_expect(st.value_r2[i] <= 1.0f + 1e-6f, "R² %g above 1", (double)st.value_r2[i]);
        sum += st.value_r2[i];
    }
    cr_expect_float_eq(sum / (hp->n_layer * hp->n_head_kv), st.value_r2_mean, 1e-5);
    for (int l = 0; l < hp->n_layer; l++)
        cr_expect(st.sel_miss[l] == -1.0f || (st.sel_miss[l] >= 0 && st.sel_miss[l] <= 1.0f + 1e-6f), "layer %d: %g", l,
                  (double)st.sel_miss[l]);
    for (int f = 0; f < st.n_full; f++) cr_expect_geq(st.sel_miss[st.full_l[f]], 0.000001f);
    free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
}
