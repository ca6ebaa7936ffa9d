/* Everything together on a generated model with YaRN on (factor 4 over a 1024-token original
 * context): RidgeFill's default (quality, grouped: rk_fill_params_default() with fitted maps),
 * the KV policies f16, q8 and LowRAM, each with and without a KV budget (spill to disk), and
 * the document cache. The flow is ask's: the document is one eval, the question another (it
 * re-scores the document's rows where the cache is writable), then decode steps.
 * - A budget changes where rows live, never a number: the budgeted run's logits equal the
 *   unbudgeted one's bit for bit.
 * - The document cache changes how the document gets in, never a number: a second ask on the
 *   document loaded from the cache (with its kept stream) equals the first within float
 *   rounding (1e-5, as test_rescore.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_cache.h"
#include "rk_ext.h"
#include "rk_fitters.h"
#include "rk_io.h"
#include "tb.h"

enum { N_CTX = 4096, N_DOC = 2700, N_Q = 40, N_DEC = 3 };

static rk_model *g_m;
static rk_ridge_maps *g_maps;
static char g_model_path[512], g_maps_path[512];

static void ids_of(int32_t *ids, size_t n, uint64_t seed) {
    const uint64_t nv = (uint64_t)rk_model_hparams(g_m)->n_vocab;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % nv);
}

/* The model (YaRN in its GGUF) and split-2 maps fitted on it. */
static void setup(void) {
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2,
                         .n_layer = 5,
                         .n_embd = 64,
                         .n_head = 4,
                         .n_head_kv = 2,
                         .n_ctx_train = 1024,
                         .rope_scaling = "yarn",
                         .rope_factor = 4.0f,
                         .seed = 23};
    cr_assert(tb_tiny_model(&spec, g_model_path, sizeof g_model_path), "%s", g_model_path);
    rk_err e = {0};
    cr_assert_eq(rk_model_load(g_model_path, &g_m, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_model_hparams(g_m)->rope_scaling.type, RK_ROPE_SCALING_YARN);
    int32_t *ids = malloc(1800 * sizeof(int32_t));
    ids_of(ids, 1800, 5);
    rk_calib_params cp = {.split = 2, .stride = 2, .seg_len = 256, .lambda = -1, .dtype = RK_DT_F16, .n_threads = 2};
    void *bytes;
    size_t nb;
    rk_calib_report rep;
    cr_assert_eq(rk_calibrate(g_m, ids, 1800, &cp, NULL, NULL, &bytes, &nb, &rep, &e), RK_OK, "%s", e.msg);
    cr_assert(tb_tmp_path(g_maps_path, sizeof g_maps_path, "rk_compose", ".maps.gguf"), "%s", g_maps_path);
    cr_assert_eq(rk_io_write_file_atomic(g_maps_path, bytes, nb, &e), RK_OK, "%s", e.msg);
    free(bytes), free(ids);
    char warn[256];
    cr_assert_eq(rk_ridge_maps_load(g_maps_path, g_m, &g_maps, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
}

static void teardown(void) {
    rk_ridge_maps_destroy(g_maps);
    rk_model_destroy(g_m);
    unlink(g_maps_path), unlink(g_model_path);
}

/* A session of kv spec with budget bytes (0: none) and the default fill with the maps. */
static rk_session *session(const char *kv, uint64_t budget) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = N_CTX, sp.n_batch = 256, sp.n_threads = 2;
    rk_err e = {0};
    cr_assert_eq(rk_kv_params_parse(kv, &sp.kv, &e), RK_OK, "%s", e.msg);
    sp.kv.budget = budget;
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(g_m, &sp, &s, &e), RK_OK, "%s: %s", kv, e.msg);
    rk_fill_params fp = rk_fill_params_default();
    fp.maps = g_maps;
    fp.tail = 512; /* the default 2048 would leave this 2700-row document few bulk rows */
    cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    return s;
}

/* The question's last-row logits and N_DEC decode steps' (teacher-forced by q): (N_DEC + 1, nv). */
static float *ask(rk_session *s, const int32_t *q) {
    const size_t nv = (size_t)rk_model_hparams(g_m)->n_vocab;
    float *lg = malloc((N_DEC + 1) * nv * sizeof(float));
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, q, N_Q, lg, false, &e), RK_OK, "%s", e.msg);
    for (int i = 0; i < N_DEC; i++)
        cr_assert_eq(rk_session_eval(s, &q[i], 1, lg + (size_t)(i + 1) * nv, false, &e), RK_OK, "%s", e.msg);
    return lg;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void compose(const char *kv) {
    const size_t nv = (size_t)rk_model_hparams(g_m)->n_vocab, n = (N_DEC + 1) * nv;
    int32_t *doc = malloc(N_DOC * sizeof(int32_t)), q[N_Q];
    ids_of(doc, N_DOC, 31), ids_of(q, N_Q, 32);
    rk_err e = {0};
    /* the first ask: the document, then the question */
    rk_session *a = session(kv, 0);
    cr_assert_eq(rk_session_eval(a, doc, N_DOC, NULL, false, &e), RK_OK, "%s", e.msg);
    float *la = ask(a, q);
    for (size_t i = 0; i < n; i++) cr_assert(isfinite(la[i]), "%s: logit %zu is %g", kv, i, (double)la[i]);
    uint64_t filled = 0;
    rk_session_layer_rows(a, rk_model_hparams(g_m)->n_layer - 1, NULL, &filled);
    cr_expect_gt(filled, 0, "%s: RidgeFill filled no row", kv);

    /* under a budget of a quarter of the rows that can move at the document's end (LowRAM:
     * its coefficient and residual rows; the per-step state stays on top): the same numbers */
    rk_kv_bytes kb;
    rk_session_kv_bytes(a, &kb);
    const uint64_t budget = (kb.coef + kb.residuals ? kb.coef + kb.residuals : kb.total) / 4;
    rk_session *b = session(kv, budget);
    cr_assert_eq(rk_session_eval(b, doc, N_DOC, NULL, false, &e), RK_OK, "%s", e.msg);
    float *lb = ask(b, q);
    rk_kv_tier_stats ts;
    rk_session_kv_tier_stats(b, &ts);
    cr_expect(ts.on, "%s: no tier under %llu bytes", kv, (unsigned long long)budget);
    /* plain rows spill as they leave the window; LowRAM's cells go when their writes complete
     * after a decode layer, which a few steps may not see (test_tiers.c counts them) */
    if (!kb.coef)
        cr_expect_gt(ts.spilled_bytes, 0, "%s: nothing spilled under %llu bytes", kv, (unsigned long long)budget);
    cr_expect_eq(ts.spill_errors, 0);
    cr_expect(!memcmp(la, lb, n * sizeof(float)), "%s: budgeted logits differ by %g", kv, max_diff(la, lb, n));

    /* the second ask: the document from the document cache (and its kept stream) */
    char dir[] = "/tmp/rk_compose_XXXXXX";
    cr_assert(mkdtemp(dir));
    rk_doc_cache_params cp = rk_doc_cache_params_default();
    cp.dir = dir;
    rk_doc_cache *c = NULL;
    cr_assert_eq(rk_doc_cache_open(&cp, &c, &e), RK_OK, "%s", e.msg);
    char key[65];
    cr_assert_eq(rk_doc_cache_session_key(a, doc, N_DOC, key, &e), RK_OK, "%s", e.msg);
    rk_session *w = session(kv, 0);
    cr_assert_eq(rk_session_eval(w, doc, N_DOC, NULL, false, &e), RK_OK, "%s", e.msg);
    rk_kv_params kvp;
    cr_assert_eq(rk_kv_params_parse(kv, &kvp, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_cache_save(c, key, g_m, &kvp, w, N_DOC, "doc", &e), RK_OK, "%s: %s", kv, e.msg);
    cr_assert_eq(rk_doc_stream_save(c, key, w, &e), RK_OK, "%s", e.msg);
    for (int budgeted = 0; budgeted < 2; budgeted++) {
        rk_session *r = session(kv, budgeted ? budget : 0);
        int64_t nt = 0;
        cr_assert_eq(rk_doc_cache_load(c, key, r, &nt, &e), RK_OK, "%s: %s", kv, e.msg);
        cr_expect_eq(nt, N_DOC);
        const rk_status sst = rk_doc_stream_load(c, key, r, &e);
        cr_expect(sst == RK_OK || sst == RK_E_NOT_FOUND, "%s: %s", kv, e.msg);
        float *lr = ask(r, q);
        cr_expect(max_diff(la, lr, n) <= 1e-5, "%s%s: the cached ask differs by %g", kv, budgeted ? " (budget)" : "",
                  max_diff(la, lr, n));
        free(lr);
        rk_session_destroy(r);
    }
    rk_doc_cache_close(c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
    free(la), free(lb), free(doc);
    rk_session_destroy(a), rk_session_destroy(b), rk_session_destroy(w);
}

TestSuite(compose, .init = setup, .fini = teardown, .timeout = 600);

Test(compose, f16_fill_budget_cache) { compose("f16"); }
Test(compose, q8_fill_budget_cache) { compose("q8"); }
Test(compose, lowram_fill_budget_cache) { compose("lowram"); }
