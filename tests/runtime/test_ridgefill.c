/* RidgeFill: the map file checks and the filled forward pass
 * (plumb == off, identity == W=I, bulk rows never run late Q/attention/MLP). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_fitters.h"
#include "rk_io.h"
#include "tb.h"
#include "tb_counters.h"

/* ---- models and maps ----------------------------------------------------------- */

/* A generated model of stories260K's shape with random weights (seed picks them). */
static rk_model *load_tiny(uint64_t seed) {
    const tb_tiny_spec spec = tb_tiny_stories_spec(seed);
    char p[1024];
    cr_assert(tb_tiny_model(&spec, p, sizeof p), "%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    unlink(p); /* the mapping keeps it */
    return m;
}

/* The trained stories260K from ../shared (skips without it). */
static rk_model *load_shared(void) {
    char p[1024];
    if (!tb_shared_path(p, sizeof p, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    return m;
}

/* Tokens of the TinyStories sample from ../shared (the text the trained model knows). */
static int32_t *story_text_ids(const rk_model *m, size_t want, size_t *n) {
    char p[1024];
    if (!tb_shared_path(p, sizeof p, "golden/perplexity/tinystories_sample_clean.txt")) cr_skip_test("%s", p);
    size_t len;
    char *txt = tb_read_file(p, &len);
    cr_assert(txt);
    rk_err e = {0};
    int32_t *ids;
    cr_assert_eq(rk_model_tokenize(m, txt, len, true, false, &ids, n, &e), RK_OK, "%s", e.msg);
    free(txt);
    cr_assert(*n >= want, "only %zu tokens", *n);
    *n = want;
    return ids;
}

/* Set by a test on the trained model (each Criterion test runs in its own process): the fits
 * and prompts read the TinyStories text there. */
static bool use_text;

/* want token ids (*n = want): pseudo-random ids of m's vocabulary, or with use_text the
 * TinyStories text. */
static int32_t *story_ids(const rk_model *m, size_t want, size_t *n) {
    if (use_text) return story_text_ids(m, want, n);
    int32_t *ids = malloc(want * sizeof *ids);
    cr_assert(ids);
    uint64_t rng = 11;
    const uint64_t nv = (uint64_t)rk_model_hparams(m)->n_vocab;
    for (size_t i = 0; i < want; i++) ids[i] = (int32_t)(tb_rand_u64(&rng) % nv);
    *n = want;
    return ids;
}

/* Writes the maps to a fresh unique path (stem-XXXXXX.maps.gguf under $TMPDIR) in path. */
static const char *calibrate_to(const rk_model *m, int split, uint32_t dtype, const char *stem, char *path,
                                size_t cap) {
    size_t n;
    int32_t *ids = story_ids(m, 1800, &n);
    rk_calib_params cp = {.split = split, .stride = 2, .seg_len = 256, .lambda = -1, .dtype = dtype, .n_threads = 1};
    void *bytes;
    size_t nb;
    rk_calib_report rep;
    rk_err e = {0};
    cr_assert_eq(rk_calibrate(m, ids, n, &cp, NULL, NULL, &bytes, &nb, &rep, &e), RK_OK, "%s", e.msg);
    /* the fitted map must beat identity on held-out rows at every late layer */
    for (int l = 0; l < rk_model_hparams(m)->n_layer - split - 1; l++)
        cr_expect(rep.heldout_rel_err[l] < rep.identity_rel_err[l], "layer %d: fitted %g vs identity %g", split + 1 + l,
                  rep.heldout_rel_err[l], rep.identity_rel_err[l]);
    cr_assert(tb_tmp_path(path, cap, stem, ".maps.gguf"), "%s", path);
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, nb, &e), RK_OK, "%s", e.msg);
    free(bytes);
    free(ids);
    return path;
}

static const char *calibrate_kv_to(const rk_model *m, int split, const char *stem, char *path, size_t cap) {
    size_t n;
    int32_t *ids = story_ids(m, 1800, &n);
    rk_calib_params cp = {.split = split,
                          .stride = 2,
                          .seg_len = 256,
                          .lambda = -1,
                          .dtype = RK_DT_F32,
                          .n_threads = 1,
                          .target_kv = true};
    void *bytes;
    size_t nb;
    rk_calib_report rep;
    rk_err e = {0};
    cr_assert_eq(rk_calibrate(m, ids, n, &cp, NULL, NULL, &bytes, &nb, &rep, &e), RK_OK, "%s", e.msg);
    /* better than predicting each K/V column's mean on held-out rows (relative error < 1);
     * there is no identity baseline for K/V targets */
    for (int l = 0; l < rk_model_hparams(m)->n_layer - split - 1; l++) {
        cr_expect(rep.heldout_rel_err[l] > 0 && rep.heldout_rel_err[l] < 1, "layer %d: K/V held-out %g", split + 1 + l,
                  rep.heldout_rel_err[l]);
        cr_expect(isnan(rep.identity_rel_err[l]));
    }
    cr_assert(tb_tmp_path(path, cap, stem, ".maps.gguf"), "%s", path);
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, nb, &e), RK_OK, "%s", e.msg);
    free(bytes);
    free(ids);
    return path;
}

static float *eval_logits(const rk_model *m, const int32_t *ids, size_t n, const rk_fill_params *fp, tb_counters *cnt) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.kv.kind = RK_KV_F32;
    sp.n_batch = 64; /* several chunks, some all-bulk, one crossing into the tail */
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    if (fp) cr_assert_eq(rk_session_set_fill(s, fp, &e), RK_OK, "%s", e.msg);
    int nv = rk_model_hparams(m)->n_vocab;
    float *lg = malloc(n * (size_t)nv * sizeof(float));
    cr_assert_eq(rk_session_eval(s, ids, n, lg, true, &e), RK_OK, "%s", e.msg);
    if (cnt) *cnt = tb_counters_get(s, rk_model_hparams(m)->n_layer);
    rk_session_destroy(s);
    return lg;
}

Test(ridgefill, plumb_equals_off) {
    rk_model *m = load_tiny(1);
    size_t n;
    int32_t *ids = story_ids(m, 400, &n);
    int nv = rk_model_hparams(m)->n_vocab;
    rk_fill_params fp = {.mode = RK_FILL_PLUMB, .tail = 100, .split = 2};
    float *a = eval_logits(m, ids, n, NULL, NULL), *b = eval_logits(m, ids, n, &fp, NULL);
    double mx = 0;
    for (size_t i = 0; i < n * (size_t)nv; i++) mx = fmax(mx, fabs((double)a[i] - b[i]));
    /* the same arithmetic in the same order: identical up to float noise */
    cr_expect(mx <= 1e-5, "plumb vs off: max |dlogit| %g", mx);
    free(a), free(b), free(ids);
    rk_model_destroy(m);
}

/* Fits split-2 f16 maps of m to a fresh path (in path) and loads them; no warning expected. */
static rk_ridge_maps *fit_and_load(const rk_model *m, const char *stem, char *path, size_t cap) {
    calibrate_to(m, 2, RK_DT_F16, stem, path, cap);
    rk_err e = {0};
    rk_ridge_maps *maps = NULL;
    char warn[256];
    cr_assert_eq(rk_ridge_maps_load(path, m, &maps, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    cr_expect_str_empty(warn);
    return maps;
}

/* Speed mode: bulk rows skip the late layers' work (the counters, on any model); on the
 * trained model (trained) the tail rows' logits also stay within mean KL 0.05 of exact. */
static void speed_mode(bool trained) {
    use_text = trained;
    rk_model *m = trained ? load_shared() : load_tiny(1);
    char maps_path[512];
    rk_ridge_maps *maps = fit_and_load(m, "rk_test_stories", maps_path, sizeof maps_path);
    size_t n;
    int32_t *ids = story_ids(m, 400, &n);
    const int tail = 100, split = 2, L = rk_model_hparams(m)->n_layer, nv = rk_model_hparams(m)->n_vocab;
    rk_fill_params fp = {.mode = RK_FILL_SPEED, .tail = tail, .maps = maps};
    tb_counters c;
    float *off = eval_logits(m, ids, n, NULL, NULL), *sp = eval_logits(m, ids, n, &fp, &c);
    const uint64_t bulk = n - tail;
    for (int l = 0; l < L; l++) {
        if (l < split) {
            cr_expect_eq(c.exact_rows[l], n, "layer %d exact rows", l);
            cr_expect_eq(c.filled_rows[l], 0);
        } else { /* late layers: only tail rows ran Q/attention/O/MLP */
            cr_expect_eq(c.exact_rows[l], n - bulk, "layer %d exact rows %llu", l, (unsigned long long)c.exact_rows[l]);
            cr_expect_eq(c.filled_rows[l], bulk, "layer %d filled rows", l);
        }
    }
    /* filled rows have no logits; the tail rows are close to exact */
    cr_expect(isnan(sp[0]) && isnan(sp[(bulk - 1) * nv]));
    double sum_kl = 0;
    for (size_t r = bulk; r < n; r++) {
        const float *p = off + r * nv, *q = sp + r * nv;
        double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, kl = 0;
        for (int v = 0; v < nv; v++) mp = fmax(mp, p[v]), mq = fmax(mq, q[v]);
        for (int v = 0; v < nv; v++) zp += exp(p[v] - mp), zq += exp(q[v] - mq);
        for (int v = 0; v < nv; v++) {
            double lp = p[v] - mp - log(zp), lq = q[v] - mq - log(zq);
            kl += exp(lp) * (lp - lq);
        }
        cr_expect(isfinite(kl));
        sum_kl += kl;
    }
    cr_log_info("speed mode, tail rows: mean KL %.4g", sum_kl / (double)(n - bulk));
    /* the tail is exact given its cache: the damage is bounded (a broken fill gives KL ~ 1) */
    if (trained) cr_expect(sum_kl / (double)(n - bulk) < 0.05, "mean KL %g", sum_kl / (double)(n - bulk));
    /* quality mode keeps the 4 sinks and round(share x the other bulk rows) exact, chosen
     * by the question's attention; with share 1 nothing is filled and it is exact */
    fp.mode = RK_FILL_QUALITY;
    fp.keep_share = 0.2f;
    float *q = eval_logits(m, ids, n, &fp, &c);
    const uint64_t kept = 4 + (uint64_t)llround(0.2 * (double)(bulk - 4));
    for (int l = split; l < L; l++) {
        cr_expect_eq(c.exact_rows[l], n - bulk + kept, "quality layer %d exact rows %llu", l,
                     (unsigned long long)c.exact_rows[l]);
        cr_expect_eq(c.filled_rows[l], bulk - kept, "quality layer %d filled rows", l);
    }
    fp.keep_share = 1.0f;
    fp.keep_selection = true; /* no stream kept for re-scoring: the late layers read the f32 split stream */
    float *q1 = eval_logits(m, ids, n, &fp, &c);
    double d1 = 0;
    for (size_t i = 0; i < n * (size_t)nv; i++) d1 = fmax(d1, fabs((double)q1[i] - off[i]));
    cr_expect(d1 <= 1e-4, "quality with share 1 differs from off by %g", d1);
    cr_expect_eq(c.filled_rows[L - 1], 0);
    free(off), free(sp), free(q), free(q1), free(ids);
    rk_ridge_maps_destroy(maps);
    unlink(maps_path);
    rk_model_destroy(m);
}

Test(ridgefill, speed_mode_bulk_rows_skip_late_work) { speed_mode(false); }
Test(ridgefill_shared, speed_mode_bulk_rows_skip_late_work_and_last_rows_stay_close) { speed_mode(true); }

/* A map file whose W is the identity and b is zero makes speed mode equal identity mode. */
Test(ridgefill, identity_mode_equals_identity_map) {
    rk_model *m = load_tiny(1);
    const int d = rk_model_hparams(m)->n_embd, L = rk_model_hparams(m)->n_layer, split = 2;
    rk_err e = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(32, &w, &e), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.type", "ridgekv.ridge_maps", &e), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "ridge.split", split, &e), RK_OK);
    cr_assert_eq(rk_fingerprint_write(w, "ridge.model", m, &e), RK_OK, "%s", e.msg);
    float *eye = calloc((size_t)d * d, sizeof(float)), *zero = calloc((size_t)d, sizeof(float));
    for (int i = 0; i < d; i++) eye[i * d + i] = 1.0f;
    for (int l = split + 1; l < L; l++) {
        char nm[64];
        int64_t ne[2] = {d, d};
        snprintf(nm, sizeof nm, "ridge.%d.weight", l);
        cr_assert_eq(rk_gguf_writer_add_tensor(w, nm, RK_DT_F32, 2, ne, eye, (uint64_t)d * d * 4, &e), RK_OK, "%s",
                     e.msg);
        snprintf(nm, sizeof nm, "ridge.%d.bias", l);
        cr_assert_eq(rk_gguf_writer_add_tensor(w, nm, RK_DT_F32, 1, ne, zero, (uint64_t)d * 4, &e), RK_OK, "%s", e.msg);
    }
    void *bytes;
    size_t nb;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &nb, &e), RK_OK, "%s", e.msg);
    rk_gguf_writer_destroy(w);
    char eye_path[512];
    cr_assert(tb_tmp_path(eye_path, sizeof eye_path, "rk_test_eye", ".maps.gguf"), "%s", eye_path);
    cr_assert_eq(rk_io_write_file_atomic(eye_path, bytes, nb, &e), RK_OK);
    free(bytes), free(eye), free(zero);
    rk_ridge_maps *maps = NULL;
    cr_assert_eq(rk_ridge_maps_load(eye_path, m, &maps, NULL, 0, &e), RK_OK, "%s", e.msg);
    size_t n;
    int32_t *ids = story_ids(m, 300, &n);
    rk_fill_params a = {.mode = RK_FILL_IDENTITY, .tail = 64, .split = split};
    rk_fill_params b = {.mode = RK_FILL_SPEED, .tail = 64, .maps = maps};
    float *la = eval_logits(m, ids, n, &a, NULL), *lb = eval_logits(m, ids, n, &b, NULL);
    size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    double mx = 0;
    for (size_t i = (n - 64) * nv; i < n * nv; i++) mx = fmax(mx, fabs((double)la[i] - lb[i]));
    cr_expect(mx <= 1e-6, "identity vs W=I map: %g", mx);
    free(la), free(lb), free(ids);
    rk_ridge_maps_destroy(maps);
    unlink(eye_path);
    rk_model_destroy(m);
}

Test(ridgefill, map_for_another_model_is_refused_by_name) {
    rk_model *st = load_tiny(1);
    char int8_buf[512], trunc_path[512];
    const char *path = calibrate_to(st, 2, RK_DT_Q8_0, "rk_test_stories_int8", int8_buf, sizeof int8_buf);
    rk_model *other = load_tiny(2);
    rk_err e = {0};
    rk_ridge_maps *maps = NULL;
    rk_status s = rk_ridge_maps_load(path, other, &maps, NULL, 0, &e);
    cr_expect_eq(s, RK_E_MISMATCH, "%s", e.msg);
    cr_expect(strstr(e.msg, rk_model_name(st)) != NULL, "names the fitted model: %s", e.msg);
    cr_expect(maps == NULL);
    /* not a map file at all: the model itself */
    char mp[1024];
    const tb_tiny_spec ms = tb_tiny_stories_spec(1);
    cr_assert(tb_tiny_model(&ms, mp, sizeof mp), "%s", mp);
    cr_expect_eq(rk_ridge_maps_load(mp, st, &maps, NULL, 0, &e), RK_E_MISMATCH, "%s", e.msg);
    unlink(mp);
    /* truncated map file */
    size_t len;
    char *bytes = tb_read_file(path, &len);
    cr_assert(bytes);
    rk_err we = {0};
    cr_assert(tb_tmp_path(trunc_path, sizeof trunc_path, "rk_test_trunc", ".maps.gguf"), "%s", trunc_path);
    cr_assert_eq(rk_io_write_file_atomic(trunc_path, bytes, len / 2, &we), RK_OK);
    s = rk_ridge_maps_load(trunc_path, st, &maps, NULL, 0, &e);
    cr_expect(s == RK_E_GGUF_TRUNCATED || s == RK_E_GGUF_BOUNDS, "truncated: %s", e.msg);
    cr_expect(strstr(e.msg, trunc_path) != NULL, "%s", e.msg);
    free(bytes);
    unlink(trunc_path);
    unlink(path);
    rk_model_destroy(other);
    rk_model_destroy(st);
}

/* Same weights, another quantisation: accepted with a warning. */
Test(ridgefill, other_quantisation_of_same_weights_warns) {
    /* one seed in q8_0 and in f32: the same underlying weights (tb_tiny) */
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2, .wtype = RK_DT_Q8_0, .seed = 5};
    char qp[1024], tp[1024];
    cr_assert(tb_tiny_model(&spec, qp, sizeof qp), "%s", qp);
    spec.wtype = RK_DT_F32;
    cr_assert(tb_tiny_model(&spec, tp, sizeof tp), "%s", tp);
    rk_err e = {0};
    rk_model *q = NULL, *t = NULL;
    cr_assert_eq(rk_model_load(qp, &q, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_model_load(tp, &t, &e), RK_OK, "%s", e.msg);
    unlink(qp), unlink(tp);
    /* a 1-row-per-layer identity-ish map file is enough to test the fingerprint check */
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(32, &w, &e), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.type", "ridgekv.ridge_maps", &e), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "ridge.split", 1, &e), RK_OK);
    cr_assert_eq(rk_fingerprint_write(w, "ridge.model", q, &e), RK_OK);
    const int d = rk_model_hparams(q)->n_embd;
    float *z = calloc((size_t)d * d, sizeof(float));
    int64_t ne[2] = {d, d};
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "ridge.2.weight", RK_DT_F32, 2, ne, z, (uint64_t)d * d * 4, &e), RK_OK);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "ridge.2.bias", RK_DT_F32, 1, ne, z, (uint64_t)d * 4, &e), RK_OK);
    void *bytes;
    size_t nb;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &nb, &e), RK_OK, "%s", e.msg);
    rk_gguf_writer_destroy(w);
    char q8_path[512];
    cr_assert(tb_tmp_path(q8_path, sizeof q8_path, "rk_test_q8", ".maps.gguf"), "%s", q8_path);
    cr_assert_eq(rk_io_write_file_atomic(q8_path, bytes, nb, &e), RK_OK);
    free(bytes), free(z);
    rk_ridge_maps *maps = NULL;
    char warn[512];
    cr_expect_eq(rk_ridge_maps_load(q8_path, q, &maps, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    cr_expect_str_empty(warn);
    rk_ridge_maps_destroy(maps);
    maps = NULL;
    cr_expect_eq(rk_ridge_maps_load(q8_path, t, &maps, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    cr_expect(strstr(warn, "another quantisation") != NULL, "warning: '%s'", warn);
    rk_ridge_maps_destroy(maps);
    unlink(q8_path);
    rk_model_destroy(t);
    rk_model_destroy(q);
}

static rk_session *eval_session(const rk_model *m, const int32_t *ids, size_t n, const rk_fill_params *fp) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.kv.kind = RK_KV_F32;
    sp.n_batch = 64;
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    if (fp) cr_assert_eq(rk_session_set_fill(s, fp, &e), RK_OK, "%s", e.msg);
    float *lg = malloc((size_t)rk_model_hparams(m)->n_vocab * sizeof(float));
    cr_assert_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_OK, "%s", e.msg);
    free(lg);
    return s;
}

/* K/V maps (calibrate target_kv) write the filled rows' late-layer K and V straight from
 * the split stream: the file holds [n_embd, 2 kv_dim] maps, speed mode runs the same row
 * plan, and on the calibration text the filled cache is closer to the exact one than the
 * input maps' (which fit the layer input, not what the cache needs: the least-squares fit
 * of K/V is the better linear predictor of K/V on these rows). */
Test(ridgefill, kv_maps_fill_the_cache_closer_than_input_maps) {
    rk_model *m = load_tiny(1);
    const rk_hparams *hp = rk_model_hparams(m);
    const int split = 2, tail = 100, L = hp->n_layer;
    char pa[512], pb[512];
    calibrate_to(m, split, RK_DT_F32, "rk_test_in", pa, sizeof pa);
    calibrate_kv_to(m, split, "rk_test_kv", pb, sizeof pb);
    rk_err e = {0};
    rk_ridge_maps *ma = NULL, *mb = NULL;
    char warn[256];
    cr_assert_eq(rk_ridge_maps_load(pa, m, &ma, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_ridge_maps_load(pb, m, &mb, warn, sizeof warn, &e), RK_OK, "%s", e.msg);
    size_t n;
    int32_t *ids = story_ids(m, 400, &n);
    rk_fill_params fa = {.mode = RK_FILL_SPEED, .tail = tail, .maps = ma}, fb = fa;
    fb.maps = mb;
    rk_session *ex = eval_session(m, ids, n, NULL), *sa = eval_session(m, ids, n, &fa),
               *sb = eval_session(m, ids, n, &fb);
    const tb_counters cnt_a = tb_counters_get(sa, L), cnt_b = tb_counters_get(sb, L), *ca = &cnt_a, *cb = &cnt_b;
    double ea = 0, eb = 0, ref = 0;
    for (int l = 0; l < L; l++) {
        cr_expect_eq(ca->filled_rows[l], cb->filled_rows[l], "layer %d: same row plan", l);
        if (l <= split) continue;
        for (int vals = 0; vals < 2; vals++) {
            rk_kv_error a, b;
            cr_assert_eq(rk_session_kv_compare(sa, ex, l, 0, (int64_t)n - tail, vals, &a, &e), RK_OK, "%s", e.msg);
            cr_assert_eq(rk_session_kv_compare(sb, ex, l, 0, (int64_t)n - tail, vals, &b, &e), RK_OK, "%s", e.msg);
            ea += a.total, eb += b.total, ref += a.ref_energy;
        }
    }
    cr_log_info("filled late K/V relative error: input maps %.4g, K/V maps %.4g", ea / ref, eb / ref);
    cr_expect(eb > 0 && eb < ea, "K/V maps %g vs input maps %g (relative to %g)", eb, ea, ref);
    /* the split layer itself and the early layers are exact in both */
    rk_kv_error z;
    cr_assert_eq(rk_session_kv_compare(sb, ex, split, 0, (int64_t)n - tail, true, &z, &e), RK_OK, "%s", e.msg);
    cr_expect(z.total <= 1e-8 * z.ref_energy, "layer S values are exact: %g", z.total);
    rk_session_destroy(ex), rk_session_destroy(sa), rk_session_destroy(sb);
    free(ids);
    rk_ridge_maps_destroy(ma), rk_ridge_maps_destroy(mb);
    unlink(pa), unlink(pb);
    rk_model_destroy(m);
}

static bool count_progress(void *ud, int64_t done, int64_t total) {
    (void)done, (void)total;
    ++*(int *)ud;
    return true;
}

/* Too little text for 2 n_embd fitting rows is refused before the forward pass (no segment
 * runs: the progress callback is never called), naming the tokens needed; just enough text
 * passes that check. stories260K: n_embd 64, so 128 fitting rows; at stride 8 and 256-token
 * segments 600 tokens give at most 76 samples (61 fitting), 1800 tokens at stride 2 give 720. */
Test(ridgefill, too_little_text_is_refused_before_the_forward) {
    rk_model *m = load_tiny(1);
    cr_assert_eq(rk_model_hparams(m)->n_embd, 64);
    size_t n;
    int32_t *ids = story_ids(m, 1800, &n);
    rk_calib_params cp = {.split = 2, .stride = 8, .seg_len = 256, .lambda = -1, .dtype = RK_DT_F32, .n_threads = 1};
    void *bytes = NULL;
    size_t nb;
    rk_calib_report rep;
    rk_err e = {0};
    int calls = 0;
    cr_expect_eq(rk_calibrate(m, ids, 600, &cp, count_progress, &calls, &bytes, &nb, &rep, &e), RK_E_INVALID_ARG);
    cr_expect_eq(calls, 0, "refused after %d segments, not before the forward", calls);
    cr_expect(strstr(e.msg, "too few for n_embd 64") && strstr(e.msg, "about 1280 tokens"), "%s", e.msg);
    cr_expect_null(bytes);
    cp.stride = 2;
    e = (rk_err){0};
    cr_assert_eq(rk_calibrate(m, ids, n, &cp, count_progress, &calls, &bytes, &nb, &rep, &e), RK_OK, "%s", e.msg);
    cr_expect_gt(calls, 0);
    cr_expect_geq(rep.n_rows - rep.n_heldout, 128);
    free(bytes);
    free(ids);
    rk_model_destroy(m);
}

/* tail 0 means the mode's default: 1536 rows for speed, 2048 for the others. On an
 * 1800-row prompt speed mode fills the first 1800 - 1536 rows of every late layer and
 * quality mode fills none (the whole prompt is within its tail). */
Test(ridgefill, default_tail_depends_on_the_mode) {
    cr_expect_eq(rk_fill_default_tail(RK_FILL_SPEED), 1536);
    cr_expect_eq(rk_fill_default_tail(RK_FILL_QUALITY), 2048);
    cr_expect_eq(rk_fill_default_tail(RK_FILL_IDENTITY), 2048);
    rk_model *m = load_tiny(1);
    char maps_path[512];
    rk_ridge_maps *maps = fit_and_load(m, "rk_test_tail", maps_path, sizeof maps_path);
    rk_err e = {0};
    size_t n;
    int32_t *ids = story_ids(m, 1800, &n);
    const int L = rk_model_hparams(m)->n_layer;
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 2048;
    sp.ctx_overflow_ok = true; /* stories260K was trained on 512: only the row plan is checked */
    sp.kv.kind = RK_KV_F32;
    const rk_fill_mode modes[2] = {RK_FILL_SPEED, RK_FILL_QUALITY};
    const uint64_t filled[2] = {1800 - 1536, 0};
    for (int i = 0; i < 2; i++) {
        rk_session *s = NULL;
        cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
        rk_fill_params fp = {.mode = modes[i], .maps = maps};
        cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_eval(s, ids, n, NULL, false, &e), RK_OK, "%s", e.msg);
        const tb_counters cnt = tb_counters_get(s, L), *c = &cnt;
        for (int l = 2; l < L; l++)
            cr_expect_eq(c->filled_rows[l], filled[i], "%s, layer %d: %llu filled rows", rk_fill_mode_name(modes[i]), l,
                         (unsigned long long)c->filled_rows[l]);
        rk_session_destroy(s);
    }
    free(ids);
    rk_ridge_maps_destroy(maps);
    unlink(maps_path);
    rk_model_destroy(m);
}
