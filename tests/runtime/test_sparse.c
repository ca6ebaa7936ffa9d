/* Sparse attention of long prefills through a session (rk_fill_params.sparse,
 * runtime/prefill/sparse.c) on a generated model of stories260K's shape: prompts shorter
 * than min_kv, and a tail covering the whole prompt, give the logits of sparse off bit for
 * bit; a long prompt goes sparse in its later chunks and computes fewer blocks; decode
 * steps stay dense; the calibration file round-trips and a file of another model, with a
 * NaN or out-of-range mass, or of garbage is refused; the calibration pass writes a file
 * that loads and runs; settings parse and bad ones are refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_experimental.h"
#include "rt_shared.h"
#include "tb.h"

/* block 16, 16 sinks, a 32-row window, 16 estimating rows, sparse from 128 keys, no tail */
static rk_sparse_params small(void) {
    rk_sparse_params p = rk_sparse_params_default();
    p.block = 16, p.n_sink = 16, p.window = 32, p.n_est = 16, p.min_kv = 128, p.mass = 0.8f, p.tail = -1;
    return p;
}

/* all rows' logits of one eval of ids[0, n) (64-row chunks), and the session */
static rk_session *run(const rk_model *m, const int32_t *ids, size_t n, const rk_sparse_params *sp, float **lg) {
    rk_session_params p = rk_session_params_default();
    p.n_ctx = 512, p.n_batch = 64, p.n_threads = 2;
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &p, &s, &e), RK_OK, "%s", e.msg);
    rk_fill_params fp = {.mode = RK_FILL_OFF};
    if (sp) fp.sparse = *sp;
    cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    *lg = malloc(n * (size_t)rk_model_hparams(m)->n_vocab * sizeof(float));
    cr_assert_eq(rk_session_eval(s, ids, n, *lg, true, &e), RK_OK, "%s", e.msg);
    return s;
}

Test(sparse, short_prompts_and_a_whole_tail_are_exact_bit_for_bit) {
    rk_model *m = rt_stories_like(3);
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t *ids = rt_random_ids(m, 400, 5);
    rk_sparse_params sp = small(), whole = small();
    whole.tail = 400;
    float *l0, *l1, *l2, *l3;
    rk_session *s0 = run(m, ids, 120, NULL, &l0), *s1 = run(m, ids, 120, &sp, &l1);
    rk_session *s2 = run(m, ids, 400, NULL, &l2), *s3 = run(m, ids, 400, &whole, &l3);
    cr_expect(!memcmp(l0, l1, 120 * nv * sizeof(float)), "120 rows (< min 128) differ with sparse on");
    cr_expect(!memcmp(l2, l3, 400 * nv * sizeof(float)), "a tail of the whole prompt differs from sparse off");
    rk_sparse_stats st;
    rk_session_sparse_stats(s1, &st);
    cr_expect(st.calls_sparse == 0 && st.calls_dense > 0, "short prompt: %llu sparse calls",
              (unsigned long long)st.calls_sparse);
    rk_session_destroy(s0), rk_session_destroy(s1), rk_session_destroy(s2), rk_session_destroy(s3);
    free(l0), free(l1), free(l2), free(l3), free(ids);
    rk_model_destroy(m);
}

Test(sparse, a_long_prompt_goes_sparse_and_decode_stays_dense) {
    rk_model *m = rt_stories_like(4);
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab, n = 448;
    int32_t *ids = rt_random_ids(m, n + 1, 6);
    rk_sparse_params sp = small();
    float *l0, *l1;
    rk_session *s0 = run(m, ids, n, NULL, &l0), *s1 = run(m, ids, n, &sp, &l1);
    /* the first chunk (its last row sees 64 keys < 128) is exact */
    cr_expect(!memcmp(l0, l1, 64 * nv * sizeof(float)), "rows below min_kv changed");
    double worst = 0;
    for (size_t i = 64 * nv; i < n * nv; i++) worst = fmax(worst, fabs((double)l0[i] - l1[i]));
    cr_expect(isfinite(worst) && worst > 0, "sparse rows: max |dlogit| %g", worst);
    rk_sparse_stats st;
    rk_session_sparse_stats(s1, &st);
    const int L = rk_model_hparams(m)->n_layer;
    /* chunks whose last row sees >= 128 keys: 6 of 7, every layer */
    cr_expect_eq(st.calls_sparse, (uint64_t)(6 * L), "%llu sparse calls", (unsigned long long)st.calls_sparse);
    cr_expect(st.blocks_done < st.blocks_causal, "%llu of %llu blocks", (unsigned long long)st.blocks_done,
              (unsigned long long)st.blocks_causal);
    rk_err e = {0};
    float *lg = malloc(nv * sizeof(float));
    cr_assert_eq(rk_session_eval(s1, ids + n, 1, lg, false, &e), RK_OK, "%s", e.msg);
    rk_sparse_stats st2;
    rk_session_sparse_stats(s1, &st2);
    cr_expect_eq(st2.calls_sparse, st.calls_sparse, "a decode step went sparse");
    cr_expect_eq(st2.calls_dense, st.calls_dense + (uint64_t)L);
    rk_session_destroy(s0), rk_session_destroy(s1);
    free(l0), free(l1), free(lg), free(ids);
    rk_model_destroy(m);
}

static const char *write_tmp(const void *bytes, size_t len, char *path, size_t cap) {
    tb_tmp_path(path, cap, "sparse", ".gguf");
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(bytes, 1, len, f) == len && fclose(f) == 0, "writing %s", path);
    return path;
}

Test(sparse, calibration_file_round_trip_and_refusals) {
    rk_model *m = rt_stories_like(7), *other = rt_stories_like(8);
    const rk_hparams *hp = rk_model_hparams(m);
    const int n = hp->n_layer * hp->n_head;
    float *mass = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) mass[i] = 0.5f + 0.5f * (float)i / (float)n;
    rk_sparse_params geo = small();
    void *bytes = NULL;
    size_t len = 0;
    rk_err e = {0};
    cr_assert_eq(rk_sparse_calib_write(m, mass, &geo, 0.95f, 1000, &bytes, &len, &e), RK_OK, "%s", e.msg);
    char path[512], warn[256] = "";
    write_tmp(bytes, len, path, sizeof path);
    rk_sparse_calib *c = NULL;
    cr_assert_eq(rk_sparse_calib_load(path, m, &c, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    for (int l = 0; l < hp->n_layer; l++)
        for (int h = 0; h < hp->n_head; h++)
            cr_expect_eq(rk_sparse_calib_mass(c, l, h), mass[l * hp->n_head + h], "layer %d head %d", l, h);
    cr_expect_eq(rk_sparse_calib_mass(c, hp->n_layer, 0), -1.0f);
    rk_sparse_calib *bad = NULL;
    cr_expect_eq(rk_sparse_calib_load(path, other, &bad, warn, sizeof warn, &e), RK_E_MISMATCH,
                 "another model's file: %s", e.msg);
    cr_expect_null(bad);
    /* the calibration in a session: it runs, and a long prompt goes sparse with it */
    rk_sparse_params sp = small();
    sp.calib = c;
    float *lg;
    int32_t *ids = rt_random_ids(m, 300, 9);
    rk_session *s = run(m, ids, 300, &sp, &lg);
    rk_sparse_stats st;
    rk_session_sparse_stats(s, &st);
    cr_expect_gt(st.calls_sparse, 0);
    rk_session_destroy(s);
    free(lg), free(ids), free(bytes);
    unlink(path);
    /* NaN and out-of-range masses */
    for (int k = 0; k < 2; k++) {
        mass[3] = k ? 1.5f : NAN;
        cr_assert_eq(rk_sparse_calib_write(m, mass, &geo, 0.95f, 1000, &bytes, &len, &e), RK_OK, "%s", e.msg);
        write_tmp(bytes, len, path, sizeof path);
        cr_expect_eq(rk_sparse_calib_load(path, m, &bad, warn, sizeof warn, &e), RK_E_FORMAT, "mass %g", mass[3]);
        cr_expect(strstr(e.msg, "mass of layer 0 head 3") != NULL, "%s", e.msg);
        free(bytes);
        unlink(path);
    }
    /* garbage */
    char junk[256];
    memset(junk, 0x5a, sizeof junk);
    write_tmp(junk, sizeof junk, path, sizeof path);
    cr_expect_neq(rk_sparse_calib_load(path, m, &bad, warn, sizeof warn, &e), RK_OK);
    unlink(path);
    rk_sparse_calib_destroy(c);
    free(mass);
    rk_model_destroy(m), rk_model_destroy(other);
}

Test(sparse, the_calibration_pass_writes_a_file_that_loads) {
    rk_model *m = rt_stories_like(10);
    int32_t *ids = rt_random_ids(m, 512, 12);
    rk_sparse_fit_params fp = {.target = 0.9f, .segment = 512, .min_kv = 128, .n_threads = 2, .geometry = small()};
    void *bytes = NULL;
    size_t len = 0;
    rk_sparse_fit_report rep = {0};
    rk_err e = {0};
    cr_assert_eq(rk_sparse_fit(m, ids, 512, &fp, &bytes, &len, &rep, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rep.n_tokens, 512);
    cr_expect_gt(rep.rows, 0);
    cr_expect(rep.mean_cover >= 0.9 - 1e-9 && rep.mean_cover <= 1 + 1e-6, "mean cover %g", rep.mean_cover);
    char path[512], warn[256];
    write_tmp(bytes, len, path, sizeof path);
    rk_sparse_calib *c = NULL;
    cr_assert_eq(rk_sparse_calib_load(path, m, &c, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    const rk_hparams *hp = rk_model_hparams(m);
    for (int l = 0; l < hp->n_layer; l++)
        for (int h = 0; h < hp->n_head; h++) {
            const float x = rk_sparse_calib_mass(c, l, h);
            cr_expect(x > 0 && x <= 1, "layer %d head %d: %g", l, h, x);
        }
    fp.segment = 100; /* too short to reach min_kv */
    cr_expect_eq(rk_sparse_fit(m, ids, 512, &fp, &bytes, &len, &rep, &e), RK_E_INVALID_ARG);
    rk_sparse_calib_destroy(c);
    unlink(path);
    free(bytes), free(ids);
    rk_model_destroy(m);
}

Test(sparse, settings_parse_and_bad_ones_are_refused) {
    rk_sparse_params p = {0};
    rk_err e = {0};
    cr_expect_eq(rk_sparse_params_parse("on:mass=0.9:min=4096:tail=0", &p, &e), RK_OK, "%s", e.msg);
    cr_expect(p.on && p.mass == 0.9f && p.min_kv == 4096 && p.tail == -1);
    cr_expect_eq(rk_sparse_params_parse("off", &p, &e), RK_OK);
    cr_expect(!p.on && p.min_kv == 4096, "off keeps the other fields");
    cr_expect_eq(rk_sparse_params_parse("on:mass=1.5", &p, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "mass") != NULL, "%s", e.msg);
    cr_expect_eq(rk_sparse_params_parse("on:block=2.5", &p, &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_sparse_params_parse("on:bogus=1", &p, &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_sparse_params_parse("maybe", &p, &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_sparse_params_parse("off:mass=0.9", &p, &e), RK_E_INVALID_ARG);
    rk_sparse_params d = rk_sparse_params_default();
    cr_expect(d.on && !d.calib, "the default is on, online estimation");
    rk_model *m = rt_stories_like(1);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 128;
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_fill_params fp = {.mode = RK_FILL_OFF};
    fp.sparse = d;
    fp.sparse.mass = 2.0f;
    cr_expect_eq(rk_session_set_fill(s, &fp, &e), RK_E_INVALID_ARG);
    rk_session_destroy(s);
    rk_model_destroy(m);
}
