/* The prefill plan: chunk-major and layer-major passes give the same cache and logits
 * (the layer order of independent rows does not change any value), the row plan of each
 * fill mode, progress and cancel through both passes, the question-aware selection's
 * scoring and ranking (white-box: plan_impl.h). Runs on generated tiny models
 * (tests/tb) of each architecture: no ../shared needed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "rk.h"
#include "rk_ext.h"
#include "rt_shared.h"
#include "tb.h"
#include "tb_counters.h"

/* A 6-layer tiny model of the given architecture with a context of 512 (the file is
 * removed once mapped: the mapping keeps it alive). */
static rk_model *load_tiny(tb_arch arch) {
    tb_tiny_spec spec = {.arch = arch, .n_layer = 6, .n_ctx_train = 512, .seed = 5 + (uint64_t)arch};
    return rt_tiny_loaded(&spec);
}


static int32_t *ids_for(const rk_model *m, size_t n) {
    int32_t *ids = malloc(n * sizeof(int32_t));
    uint64_t st = 11;
    const int32_t nv = rk_model_hparams(m)->n_vocab;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64(&st) % (uint64_t)nv);
    return ids;
}

/* All-rows logits of n ids (row i predicts after ids[i]), in chunks of n_batch. */
static float *run(const rk_model *m, const int32_t *ids, size_t n, int n_batch, const rk_fill_params *fp,
                  tb_counters *cnt) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.n_batch = n_batch;
    sp.n_threads = 1;
    sp.kv.kind = RK_KV_F32;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    if (fp) cr_assert_eq(rk_session_set_fill(s, fp, &e), RK_OK, "%s", e.msg);
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    float *lg = malloc((n + 1) * nv * sizeof(float));
    cr_assert_eq(rk_session_eval(s, ids, n, lg, true, &e), RK_OK, "%s", e.msg);
    /* one decode step after the prompt: it reads every cache row the prefill wrote */
    int32_t next = ids[0];
    cr_assert_eq(rk_session_eval(s, &next, 1, lg + n * nv, false, &e), RK_OK, "%s", e.msg);
    if (cnt) *cnt = tb_counters_get(s, rk_model_hparams(m)->n_layer);
    rk_session_destroy(s);
    return lg;
}

/* max |a - b| over finite rows; NaN rows (filled rows have no logits) must match */
static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(isnan(a[i]), isnan(b[i]), "NaN pattern differs at %zu", i);
        if (!isnan(a[i])) d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return d;
}

/* Layer-major runs the same ops on the same rows (only the order of independent chunks
 * and layers changes), so the results are bit-identical to chunk-major. */
Test(prefill, layer_major_equals_chunk_major) {
    for (int arch = TB_ARCH_LLAMA; arch <= TB_ARCH_QWEN3; arch++) {
        rk_model *m = load_tiny((tb_arch)arch);
        const rk_hparams *hp = rk_model_hparams(m);
        const size_t n = 200, nv = (size_t)hp->n_vocab, all = (n + 1) * nv;
        int32_t *ids = ids_for(m, n);
        const rk_fill_mode modes[] = {RK_FILL_IDENTITY, RK_FILL_PLUMB};
        for (int mi = 0; mi < 2; mi++) {
            rk_fill_params fp = {.mode = modes[mi], .tail = 64, .split = 2};
            tb_counters c1, c2;
            float *a = run(m, ids, n, 48, &fp, &c1);
            fp.layer_major = true;
            float *b = run(m, ids, n, 48, &fp, &c2);
            cr_expect_eq(max_diff(a, b, all), 0.0, "%s: layer-major differs by %g", rk_fill_mode_name(modes[mi]),
                         max_diff(a, b, all));
            for (int l = 0; l < hp->n_layer; l++) {
                cr_expect_eq(c1.exact_rows[l], c2.exact_rows[l], "layer %d exact rows", l);
                cr_expect_eq(c1.filled_rows[l], c2.filled_rows[l], "layer %d filled rows", l);
            }
            free(a), free(b);
        }
        free(ids);
        rk_model_destroy(m);
    }
}

/* The plan of identity fill at split S with tail T: bulk rows (n - T of them) run every
 * layer below S and only the cache writers at and above S; plumb runs them exactly
 * through the fill path and equals off to float tolerance. */
Test(prefill, row_plan_counts_and_plumb_oracle) {
    rk_model *m = load_tiny(TB_ARCH_QWEN2);
    const rk_hparams *hp = rk_model_hparams(m);
    const size_t n = 200, nv = (size_t)hp->n_vocab, all = (n + 1) * nv;
    const int split = 2, tail = 64;
    int32_t *ids = ids_for(m, n);
    tb_counters c;
    rk_fill_params fp = {.mode = RK_FILL_IDENTITY, .tail = tail, .split = split, .layer_major = true};
    float *fi = run(m, ids, n, 32, &fp, &c);
    for (int l = 0; l < hp->n_layer; l++) {
        const uint64_t bulk = l >= split ? n - tail : 0;
        cr_expect_eq(c.filled_rows[l], bulk, "layer %d filled %llu", l, (unsigned long long)c.filled_rows[l]);
        cr_expect_eq(c.exact_rows[l], n + 1 - bulk, "layer %d exact %llu", l, (unsigned long long)c.exact_rows[l]);
    }
    /* filled rows have no logits; the tail and the decode step do */
    cr_expect(isnan(fi[0]) && !isnan(fi[(n - tail) * nv]) && !isnan(fi[n * nv]));
    float *off = run(m, ids, n, 32, NULL, NULL);
    fp.mode = RK_FILL_PLUMB;
    float *pl = run(m, ids, n, 32, &fp, NULL);
    /* the same arithmetic on the same inputs: equal up to the last bit of f32 sums */
    double d = max_diff(off, pl, all);
    cr_expect(d <= 1e-5, "plumb differs from off by %g", d);
    free(fi), free(off), free(pl), free(ids);
    rk_model_destroy(m);
}

typedef struct prog {
    int64_t last, calls, stop_at;
    bool monotone;
} prog;

static bool on_progress(void *ud, int64_t done, int64_t total) {
    prog *p = ud;
    p->monotone = p->monotone && done >= p->last && done <= total;
    p->last = done;
    p->calls++;
    return p->stop_at < 0 || p->calls < p->stop_at;
}

/* Progress is monotone and ends at the total through both passes; a cancel in the
 * layer-major first phase leaves the session as it was. */
Test(prefill, progress_and_cancel_in_layer_major) {
    rk_model *m = load_tiny(TB_ARCH_QWEN2);
    const size_t n = 200, nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t *ids = ids_for(m, n);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.n_batch = 32;
    sp.n_threads = 1;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_fill_params fp = {.mode = RK_FILL_IDENTITY, .tail = 64, .split = 2, .layer_major = true};
    cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    prog p = {0, 0, -1, true};
    rk_session_set_progress(s, on_progress, &p);
    float *lg = malloc(nv * sizeof(float));
    cr_assert_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_OK, "%s", e.msg);
    cr_expect(p.monotone && p.last == (int64_t)n, "last %lld", (long long)p.last);
    cr_expect(p.calls >= 2 * 7, "%lld calls: both passes report", (long long)p.calls);
    rk_session_reset(s);
    p = (prog){0, 0, 3, true};
    cr_expect_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_E_CANCELLED);
    cr_expect_eq(rk_session_n_past(s), 0);
    free(lg), free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
}

/* ---- question-aware selection (runtime/prefill/select.c) ---------------------------- */

/* Max-pooling spreads a peak over `radius` rows either side; the top rows by pooled score
 * are kept, ties going to the earlier row; rows already marked stay marked. */
Test(prefill, select_top_pools_then_ranks) {
    float sc[60] = {0};
    for (int j = 0; j < 60; j++) sc[j] = 0.001f * (float)(j % 7);
    sc[10] = 5.0f, sc[50] = 4.0f, sc[30] = 1.0f;
    uint8_t keep[60] = {0};
    rk_err e = {0};
    cr_assert_eq(rk_select_top(sc, 60, 0, 2, keep, &e), RK_OK);
    int n = 0;
    for (int j = 0; j < 60; j++) n += keep[j];
    cr_expect(n == 2 && keep[10] && keep[50]);
    memset(keep, 0, sizeof keep);
    cr_assert_eq(rk_select_top(sc, 60, 1, 7, keep, &e), RK_OK);
    n = 0;
    for (int j = 0; j < 60; j++) n += keep[j];
    /* pooled: 9..11 hold 5, 49..51 hold 4, 29 (tie with 30, 31: the earliest) holds 1 */
    cr_expect(n == 7 && keep[9] && keep[10] && keep[11] && keep[49] && keep[50] && keep[51] && keep[29], "n %d", n);
    /* more rows than exist: all of them */
    memset(keep, 0, sizeof keep);
    cr_assert_eq(rk_select_top(sc, 60, 2, 100, keep, &e), RK_OK);
    n = 0;
    for (int j = 0; j < 60; j++) n += keep[j];
    cr_expect_eq(n, 60);
}

/* A later question's rows: a peak's score reaches `after` rows after it and `radius` rows
 * before it; rows of the base stay and are not counted; at most max_new rows are added, and
 * none whose pooled score is 0. */
Test(prefill, select_extra_pools_after_the_peak) {
    float sc[60] = {0};
    sc[10] = 5.0f, sc[40] = 3.0f;
    uint8_t base[60] = {0}, keep[60];
    base[12] = 1;
    rk_err e = {0};
    int64_t n_new = 0;
    cr_assert_eq(rk_select_extra(sc, 60, 2, 5, base, 100, keep, &n_new, &e), RK_OK);
    /* 10's score covers rows 8..15, 40's 38..45: 16 rows, 12 already in the base */
    cr_expect_eq(n_new, 15);
    for (int j = 0; j < 60; j++) {
        const bool want = (j >= 8 && j <= 15) || (j >= 38 && j <= 45);
        cr_expect_eq(keep[j], want, "row %d", j);
    }
    /* at most 4 new rows: the higher peak's, earliest first */
    cr_assert_eq(rk_select_extra(sc, 60, 2, 5, base, 4, keep, &n_new, &e), RK_OK);
    cr_expect_eq(n_new, 4);
    cr_expect(keep[8] && keep[9] && keep[10] && keep[11] && keep[12] && !keep[13] && !keep[38]);
}

/* The score is the causal softmax attention of the query rows over the layer's keys,
 * summed over query heads: checked against a double-precision reference over keys read
 * back through rk_session_kv_rows, for every architecture (GQA groups of 1 and more). */
Test(prefill, select_score_is_softmax_attention) {
    for (int arch = TB_ARCH_LLAMA; arch <= TB_ARCH_QWEN3; arch++) {
        rk_model *m = load_tiny((tb_arch)arch);
        const rk_hparams *hp = rk_model_hparams(m);
        const int nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim, group = nh / nkv;
        const int64_t n = 150, n_obs = 6, obs0 = n - n_obs, row0 = 3, row1 = 120;
        const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
        int32_t *ids = ids_for(m, (size_t)n);
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = 512, sp.n_batch = 64, sp.n_threads = 1, sp.kv.kind = RK_KV_F32;
        rk_session *s = NULL;
        rk_err e = {0};
        cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
        float *lg = malloc((size_t)hp->n_vocab * sizeof(float));
        cr_assert_eq(rk_session_eval(s, ids, (size_t)n, lg, false, &e), RK_OK, "%s", e.msg);
        /* queries of a plausible size: random, norm about that of a key */
        float *q = malloc((size_t)(n_obs * qd) * sizeof(float)), *k = malloc((size_t)(n * kvd) * sizeof(float));
        cr_assert_eq(rk_session_kv_rows(s, 1, false, false, 0, n, k, &e), RK_OK, "%s", e.msg);
        uint64_t st = 99;
        for (int64_t i = 0; i < n_obs * qd; i++)
            q[i] = (float)((double)(tb_rand_u64(&st) % 2001) / 1000.0 - 1.0) * 2.0f;
        float *sc = calloc((size_t)(row1 - row0), sizeof(float));
        cr_assert_eq(rk_select_score(s, 1, q, n_obs, obs0, row0, row1, sc, &e), RK_OK, "%s", e.msg);
        double *ref = calloc((size_t)(row1 - row0), sizeof(double)), mass = 0, worst = 0, lo_mass = 0;
        for (int64_t i = 0; i < n_obs; i++)
            for (int h = 0; h < nh; h++) {
                const int64_t nk = obs0 + i + 1;
                double *lgt = malloc((size_t)nk * sizeof(double)), mx = -INFINITY, z = 0;
                for (int64_t j = 0; j < nk; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++)
                        d += (double)q[i * qd + h * hd + c] * k[j * kvd + (h / group) * hd + c];
                    lgt[j] = d / sqrt((double)hd);
                    mx = fmax(mx, lgt[j]);
                }
                for (int64_t j = 0; j < nk; j++) z += exp(lgt[j] - mx);
                for (int64_t j = row0; j < row1; j++) ref[j - row0] += exp(lgt[j] - mx) / z;
                free(lgt);
            }
        for (int64_t j = 0; j < row1 - row0; j++) {
            worst = fmax(worst, fabs(sc[j] - ref[j]));
            mass += ref[j];
            lo_mass += sc[j];
        }
        /* float logits over 16-64 dims and float sums of at most n terms: 1e-5 of a weight of at most 1 */
        cr_expect(worst <= 1e-5 * (double)(n_obs * nh), "arch %d: score differs from the reference by %g", arch, worst);
        /* each query head spreads weight 1 over its keys; the scored rows get part of it */
        cr_expect(mass > 0 && mass < (double)(n_obs * nh) && fabs(lo_mass - mass) <= 1e-4 * mass, "mass %g vs %g",
                  lo_mass, mass);
        /* rows outside [0, obs0) are refused */
        cr_expect_eq(rk_select_score(s, 1, q, n_obs, obs0, row0, obs0 + 1, sc, &e), RK_E_INTERNAL);
        free(q), free(k), free(sc), free(ref), free(lg), free(ids);
        rk_session_destroy(s);
        rk_model_destroy(m);
    }
}

/* Question-aware identity fill keeps the sinks and round(share x the other bulk rows)
 * exact in every late layer; share 0 keeps only the sinks; share 1 keeps every row and
 * equals off (no filled row is left, the same arithmetic runs). */
Test(prefill, question_aware_row_counts_and_share_one_is_exact) {
    rk_model *m = load_tiny(TB_ARCH_LLAMA);
    const rk_hparams *hp = rk_model_hparams(m);
    const size_t n = 200, nv = (size_t)hp->n_vocab, all = (n + 1) * nv;
    const int split = 3, tail = 64;
    const uint64_t bulk = n - tail;
    int32_t *ids = ids_for(m, n);
    float *off = run(m, ids, n, 48, NULL, NULL);
    const float shares[] = {0.0f, 0.25f, 1.0f};
    for (int si = 0; si < 3; si++) {
        /* keep_selection: no stream kept for re-scoring, so no f16 rounding of the split stream */
        rk_fill_params fp = {.mode = RK_FILL_IDENTITY,
                             .tail = tail,
                             .split = split,
                             .question_aware = true,
                             .keep_share = shares[si],
                             .obs = 16,
                             .score_layers = 2,
                             .pool = 2,
                             .keep_selection = true};
        tb_counters c;
        float *lg = run(m, ids, n, 48, &fp, &c);
        const uint64_t kept = 4 + (uint64_t)llround((double)shares[si] * (double)(bulk - 4));
        for (int l = 0; l < hp->n_layer; l++) {
            const uint64_t filled = l >= split ? bulk - kept : 0;
            cr_expect_eq(c.filled_rows[l], filled, "share %.2f layer %d filled %llu", shares[si], l,
                         (unsigned long long)c.filled_rows[l]);
            cr_expect_eq(c.exact_rows[l], n + 1 - filled, "share %.2f layer %d exact", shares[si], l);
        }
        /* the sinks are exact rows: they have logits */
        cr_expect(!isnan(lg[0]) && !isnan(lg[3 * nv]));
        if (si == 2)
            cr_expect(max_diff(off, lg, all) <= 1e-5, "share 1 differs from off by %g", max_diff(off, lg, all));
        free(lg);
    }
    free(off), free(ids);
    rk_model_destroy(m);
}

/* With the map's share (keep_share < 0: 0.1 without maps), quality keeps at least
 * keep_rows bulk rows exact (RK_FILL_KEEP_ROWS when 0) while they are at most a quarter of the
 * scored rows; a share given, or keep_rows -1, keeps round(share x rows) alone. Expected:
 * max(round(share x m), min(rows, round(m / 4))) of the m = bulk - 4 rows after the sinks. */
Test(prefill, the_map_share_keeps_a_floor_of_rows_up_to_a_quarter) {
    rk_model *m = load_tiny(TB_ARCH_LLAMA);
    const rk_hparams *hp = rk_model_hparams(m);
    const size_t n = 200;
    const int split = 3, tail = 64;
    const int64_t scored = (int64_t)n - tail - 4;
    int32_t *ids = ids_for(m, n);
    const struct {
        float share;         /* < 0: the default's */
        int32_t rows, floor; /* floor: the rows the formula takes, -1 none */
    } cases[] = {{-1.0f, 0, 4096}, {-1.0f, 20, 20}, {-1.0f, -1, -1}, {0.1f, 0, -1}, {0.3f, 20, 20}, {0.1f, 50, 50}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        rk_fill_params fp = {.mode = RK_FILL_IDENTITY,
                             .tail = tail,
                             .split = split,
                             .question_aware = true,
                             .keep_share = cases[ci].share,
                             .keep_rows = cases[ci].rows,
                             .obs = 16,
                             .score_layers = 2,
                             .pool = 2,
                             .keep_selection = true};
        tb_counters c;
        free(run(m, ids, n, 48, &fp, &c));
        const double share = cases[ci].share < 0 ? 0.1 : cases[ci].share;
        int64_t want = llround(share * (double)scored);
        const int64_t quarter = llround(0.25 * (double)scored);
        if (cases[ci].floor > 0) {
            const int64_t r = cases[ci].floor < quarter ? cases[ci].floor : quarter;
            if (r > want) want = r;
        }
        const uint64_t filled = (uint64_t)(scored - want);
        for (int l = split; l < hp->n_layer; l++)
            cr_expect_eq(c.filled_rows[l], filled, "case %zu layer %d: %llu filled, want %llu", ci, l,
                         (unsigned long long)c.filled_rows[l], (unsigned long long)filled);
    }
    free(ids);
    rk_model_destroy(m);
}

/* rk_session_fill_kept reads the last selection: -1 before any, the sinks alone at share
 * 0, every bulk row at share 1, nothing outside the bulk region. */
Test(prefill, fill_kept_reports_the_last_selection) {
    rk_model *m = load_tiny(TB_ARCH_QWEN3);
    const size_t n = 160, nv = (size_t)rk_model_hparams(m)->n_vocab;
    const int tail = 48;
    int32_t *ids = ids_for(m, n);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = 40, sp.n_threads = 1;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    float *lg = malloc(nv * sizeof(float));
    cr_expect_eq(rk_session_fill_kept(s, 0, (int64_t)n), -1);
    const float shares[] = {0.0f, 1.0f, 0.5f};
    const int64_t bulk = (int64_t)n - tail, expect[] = {4, bulk, 4 + (int64_t)llround(0.5 * (double)(bulk - 4))};
    for (int i = 0; i < 3; i++) {
        rk_fill_params fp = {
            .mode = RK_FILL_IDENTITY, .tail = tail, .split = 3, .question_aware = true, .keep_share = shares[i]};
        cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
        rk_session_reset(s);
        cr_assert_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_OK, "%s", e.msg);
        cr_expect_eq(rk_session_fill_kept(s, 0, (int64_t)n), expect[i], "share %.1f: %lld", shares[i],
                     (long long)rk_session_fill_kept(s, 0, (int64_t)n));
        cr_expect_eq(rk_session_fill_kept(s, bulk, tail), 0, "tail rows are not selected, they are exact anyway");
        cr_expect_eq(rk_session_fill_kept(s, 0, 4), 4, "the sinks");
    }
    free(lg), free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
}

/* The recency band is part of the share: the last min(band, n_keep) rows are marked, the
 * rest of the share goes by pooled score over the rows before them; the count never
 * changes with the band. */
Test(prefill, select_rows_band_comes_out_of_the_share) {
    float sc[60] = {0};
    for (int j = 0; j < 60; j++) sc[j] = 0.001f * (float)(j % 7);
    sc[10] = 5.0f, sc[50] = 4.0f, sc[57] = 9.0f;
    rk_err e = {0};
    uint8_t keep[60] = {0}, ref[60] = {0};
    /* band 0 is rk_select_top */
    cr_assert_eq(rk_select_rows(sc, 60, 1, 7, 0, keep, &e), RK_OK);
    cr_assert_eq(rk_select_top(sc, 60, 1, 7, ref, &e), RK_OK);
    cr_expect(!memcmp(keep, ref, sizeof keep));
    /* band 5 of 7: rows 55..59, then the two best of rows 0..54 without pooling (10, 50);
     * row 57's score is inside the band, so it does not pull its pooled neighbours in */
    memset(keep, 0, sizeof keep);
    cr_assert_eq(rk_select_rows(sc, 60, 0, 7, 5, keep, &e), RK_OK);
    int n = 0;
    for (int j = 0; j < 60; j++) n += keep[j];
    cr_expect(n == 7 && keep[10] && keep[50], "n %d", n);
    for (int j = 55; j < 60; j++) cr_expect(keep[j], "row %d in the band", j);
    /* pooling stops at the band: radius 2 over rows 0..54 must not see row 57 */
    memset(keep, 0, sizeof keep);
    cr_assert_eq(rk_select_rows(sc, 60, 2, 6, 5, keep, &e), RK_OK);
    n = 0;
    for (int j = 0; j < 55; j++) n += keep[j];
    cr_expect(n == 1 && keep[8], "one row by score, the earliest of 10's pooled span (n %d)", n);
    /* a band wider than the share: the share's rows are the last n_keep, nothing by score */
    memset(keep, 0, sizeof keep);
    cr_assert_eq(rk_select_rows(sc, 60, 1, 7, 40, keep, &e), RK_OK);
    n = 0;
    for (int j = 0; j < 60; j++) n += keep[j];
    cr_expect(n == 7 && keep[53] && keep[59] && !keep[10] && !keep[52], "n %d", n);
    /* nothing to keep: nothing marked, whatever the band */
    memset(keep, 0, sizeof keep);
    cr_assert_eq(rk_select_rows(sc, 60, 1, 0, 10, keep, &e), RK_OK);
    n = 0;
    for (int j = 0; j < 60; j++) n += keep[j];
    cr_expect_eq(n, 0);
}

/* Through a session: with a band the last `band` bulk rows are exact, the total kept is
 * the same as without it (the band does not change the cost), and the rows filled in
 * every late layer match that count; a band past the share keeps only the last rows. */
Test(prefill, band_keeps_the_rows_nearest_the_tail) {
    rk_model *m = load_tiny(TB_ARCH_QWEN2);
    const rk_hparams *hp = rk_model_hparams(m);
    const size_t n = 200, nv = (size_t)hp->n_vocab;
    const int split = 3, tail = 64;
    const int64_t bulk = (int64_t)n - tail, n_keep = llround(0.25 * (double)(bulk - 4));
    int32_t *ids = ids_for(m, n);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = 48, sp.n_threads = 1;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    float *lg = malloc(nv * sizeof(float));
    const int bands[] = {0, 16, 1000};
    int64_t kept_near[3];
    for (int i = 0; i < 3; i++) {
        rk_fill_params fp = {.mode = RK_FILL_IDENTITY,
                             .tail = tail,
                             .split = split,
                             .question_aware = true,
                             .keep_share = 0.25f,
                             .obs = 16,
                             .score_layers = 2,
                             .pool = 2,
                             .band = bands[i]};
        cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
        rk_session_reset(s);
        const tb_counters c0 = tb_counters_get(s, hp->n_layer); /* counters add up over calls */
        cr_assert_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_OK, "%s", e.msg);
        cr_expect_eq(rk_session_fill_kept(s, 0, (int64_t)n), 4 + n_keep, "band %d: %lld kept", bands[i],
                     (long long)rk_session_fill_kept(s, 0, (int64_t)n));
        const tb_counters cnt = tb_counters_get(s, hp->n_layer), *c = &cnt;
        for (int l = split; l < hp->n_layer; l++)
            cr_expect_eq(c->filled_rows[l] - c0.filled_rows[l], (uint64_t)(bulk - 4 - n_keep), "band %d layer %d",
                         bands[i], l);
        kept_near[i] = rk_session_fill_kept(s, bulk - 16, 16);
        if (i == 2) {
            cr_expect_eq(rk_session_fill_kept(s, bulk - n_keep, n_keep), n_keep, "the last n_keep bulk rows");
            cr_expect_eq(rk_session_fill_kept(s, 4, bulk - n_keep - 4), 0, "no row by score");
        }
    }
    cr_expect_eq(kept_near[1], 16, "band 16: the 16 rows before the tail are exact");
    cr_expect_lt(kept_near[0], 16, "without the band the score does not keep all 16 (else the test shows nothing)");
    free(lg), free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
}

/* The progress fit (cost.c): chunks whose seconds are 2e-11 s a matrix FLOP and 5e-11 s an
 * attention FLOP, with a +-1% wobble, give b / a = 2.5 within the wobble once the prior's
 * two steps are outweighed; before two chunks the prior holds; attention that costs nothing
 * falls far below the prior, but never under 1/20 of it. */
Test(prefill, cost_fit_finds_the_attention_ratio) {
    rk_cost_fit f = {0};
    cr_expect_eq(rk_cost_fit_ratio(&f), RK_COST_ATTN_WEIGHT);
    rk_cost_fit_add(&f, 1e9, 1e8, 0.025);
    cr_expect_eq(rk_cost_fit_ratio(&f), RK_COST_ATTN_WEIGHT, "one chunk: the prior");
    for (int i = 1; i < 400; i++) {
        const double x1 = 1e9 * (1.0 + 0.3 * (i % 7)), x2 = 1e8 * (double)(i % 23), wob = 1.0 + 0.01 * ((i % 3) - 1);
        rk_cost_fit_add(&f, x1, x2, (2e-11 * x1 + 5e-11 * x2) * wob);
    }
    cr_expect(fabs(rk_cost_fit_ratio(&f) - 2.5) < 0.05, "ratio %g, expected 2.5", rk_cost_fit_ratio(&f));
    rk_cost_fit z = {0};
    for (int i = 0; i < 50; i++) rk_cost_fit_add(&z, 1e9, 1e8 * (double)(i % 5), 0.02);
    /* the data say 0; the prior, worth 2 of 50 chunks, keeps about k / 25 of it */
    const double rz = rk_cost_fit_ratio(&z);
    cr_expect(rz >= 0.05 * RK_COST_ATTN_WEIGHT && rz < 0.2 * RK_COST_ATTN_WEIGHT, "free attention: %g", rz);
}

/* The prior of the progress fit runs through the two measured head widths: 3.0 for 64-wide
 * heads, 1.2 for 128-wide ones, falling between them (a power of the width) and held within
 * 0.5 .. 4 outside; a fit given it starts from it and moves off it with data. */
Test(prefill, cost_fit_prior_follows_the_head_width) {
    rk_hparams hp = {0};
    hp.head_dim = 64;
    const double k64 = rk_cost_attn_prior(&hp);
    hp.head_dim = 96;
    const double k96 = rk_cost_attn_prior(&hp);
    hp.head_dim = 128;
    const double k128 = rk_cost_attn_prior(&hp);
    hp.head_dim = 16;
    const double k16 = rk_cost_attn_prior(&hp);
    hp.head_dim = 512;
    const double k512 = rk_cost_attn_prior(&hp);
    cr_expect(fabs(k64 - 3.0) < 0.01 && fabs(k128 - 1.2) < 1e-9, "k64 %g, k128 %g", k64, k128);
    cr_expect(k96 < k64 && k96 > k128, "k96 %g", k96);
    cr_expect(k16 == 4.0 && k512 == 0.5, "k16 %g, k512 %g", k16, k512);
    rk_cost_fit f = {.prior = k128};
    cr_expect_eq(rk_cost_fit_ratio(&f), k128);
    rk_cost_fit_add(&f, 1e9, 1e8, 0.025);
    cr_expect_eq(rk_cost_fit_ratio(&f), k128, "one chunk: the prior");
    for (int i = 1; i < 400; i++) {
        const double x1 = 1e9 * (1.0 + 0.3 * (i % 7)), x2 = 1e8 * (double)(i % 23);
        rk_cost_fit_add(&f, x1, x2, 2e-11 * x1 + 5e-11 * x2);
    }
    /* the prior, worth two of the 400 chunks, keeps about 3% of the way back to 1.2 */
    const double r = rk_cost_fit_ratio(&f);
    cr_expect(r > 2.4 && r < 2.5, "ratio %g, expected 2.5 less the prior's pull", r);
}

/* The cost of sparse rows (cost.c): with no window a query block always computes its sink
 * blocks and its own block, so of its qb + 1 causal blocks qb - sink_b are left to the lines;
 * the estimation pays n_est rows over every key; rows at or past dense_from, and calls whose
 * last row sees fewer than min_kv keys, are dense pairs. */
Test(prefill, sparse_rows_cost_their_forced_blocks_and_the_estimation) {
    rk_model *m = load_tiny(TB_ARCH_LLAMA);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    const rk_hparams *hp = rk_model_hparams(m);
    const double q4 = 4.0 * hp->n_head * hp->head_dim;
    rk_cost_ctx c = {.start = 0,
                     .bulk_end = 0,
                     .end = 512,
                     .sp_on = true,
                     .sp_min_kv = 0,
                     .sp_dense_from = 512,
                     .sp_block = 16,
                     .sp_sink_b = 1,
                     .sp_window = 0,
                     .sp_n_est = 4};
    rk_chunk_plan p = {.pos0 = 256, .n = 64, .layer_lo = 0, .layer_hi = 1, .split = hp->n_layer, .n_ex = 64};
    rk_cost k = rk_cost_chunk(s, &c, &p);
    /* query blocks 16..19, 16 rows each: forced 2 blocks of 16 keys, lines qb - 1 blocks */
    double lines = 0, forced = 0;
    for (int qb = 16; qb < 20; qb++) lines += 16.0 * (qb - 1) * 16.0, forced += 16.0 * 2 * 16.0;
    const double est = RK_COST_EST_WEIGHT * 4 * 320.0;
    cr_expect(fabs(k.lines - q4 * lines) < 1e-6 * q4 * lines, "lines %g, expected %g", k.lines, q4 * lines);
    cr_expect(fabs(k.attn - q4 * (forced + est)) < 1e-6 * q4 * forced, "paid %g, expected %g", k.attn,
              q4 * (forced + est));
    /* past dense_from, or under min_kv: every causal pair, densely */
    const double dense = 64.0 * 256 + 0.5 * 64 * 65;
    c.sp_dense_from = 256;
    k = rk_cost_chunk(s, &c, &p);
    cr_expect(k.lines == 0 && fabs(k.attn - q4 * dense) < 1e-6 * q4 * dense, "dense_from: %g %g", k.lines, k.attn);
    c.sp_dense_from = 512, c.sp_min_kv = 321;
    k = rk_cost_chunk(s, &c, &p);
    cr_expect(k.lines == 0 && fabs(k.attn - q4 * dense) < 1e-6 * q4 * dense, "min_kv: %g %g", k.lines, k.attn);
    rk_session_destroy(s);
    rk_model_destroy(m);
}
