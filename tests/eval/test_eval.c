/* `ridgekv eval needle|nll|splice`: the eval library's statistics (eval/, pure functions)
 * against hand and closed-form computations (suite cli), and short runs of the three
 * commands on the default model (suite model; skips without it). */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rk_eval.h"
#include "eval_test_util.h"
#include "tb.h"

/* ---- statistics ---------------------------------------------------------------- */

/* P(X <= k), X ~ Bin(n, 1/2), from Pascal's triangle in exact doubles (n <= 40). */
static double binom_cdf_half(int n, int k) {
    double row[41] = {1};
    for (int i = 1; i <= n; i++)
        for (int j = i; j > 0; j--) row[j] += row[j - 1];
    double s = 0;
    for (int j = 0; j <= k; j++) s += row[j];
    return s / ldexp(1.0, n);
}

Test(eval, mcnemar_known_tables) {
    /* b=10, c=2: 2 * (1 + 12 + 66) / 4096 */
    cr_expect(fabs(ev_mcnemar_p(10, 2) - 2.0 * 79.0 / 4096.0) < 1e-12, "%.10f", ev_mcnemar_p(10, 2));
    cr_expect(fabs(ev_mcnemar_p(10, 2) - 0.0386) < 5e-5);
    cr_expect_eq(ev_mcnemar_p(2, 10), ev_mcnemar_p(10, 2), "symmetric in b and c");
    cr_expect_eq(ev_mcnemar_p(0, 0), 1.0, "no discordant pairs: no evidence");
    cr_expect_eq(ev_mcnemar_p(5, 5), 1.0, "capped at 1");
    cr_expect(fabs(ev_mcnemar_p(0, 6) - 2.0 / 64.0) < 1e-15);
    cr_expect(fabs(ev_mcnemar_p(1, 0) - 1.0) < 1e-15);
}

Test(eval, mcnemar_matches_pascal_triangle) {
    for (int b = 0; b <= 20; b++)
        for (int c = 0; c <= 20; c++) {
            if (b + c == 0) continue;
            double want = 2 * binom_cdf_half(b + c, b < c ? b : c);
            want = want > 1 ? 1 : want;
            double got = ev_mcnemar_p(b, c);
            cr_expect(fabs(got - want) <= 1e-12 * (want > 1e-300 ? 1 : 0) + 1e-10 * want, "b=%d c=%d: %.15g vs %.15g",
                      b, c, got, want);
        }
}

Test(eval, mcnemar_large_counts_stay_finite) {
    /* 400 vs 600: normal approximation z = 200/sqrt(1000) = 6.32, p ~ 2.6e-10 */
    double p = ev_mcnemar_p(400, 600);
    cr_expect(p > 5e-11 && p < 1e-9, "%g", p);
    cr_expect(fabs(ev_mcnemar_p(5000, 5000) - 1.0) < 1e-12);
}

Test(eval, nll_of_hand_made_logits) {
    /* softmax(0, ln2, ln3) = (1/6, 2/6, 3/6) */
    float row[3] = {0.0f, logf(2.0f), logf(3.0f)};
    cr_expect(fabs(ev_nll_row(row, 3, 0) - log(6.0)) < 1e-6);
    cr_expect(fabs(ev_nll_row(row, 3, 1) - log(3.0)) < 1e-6);
    cr_expect(fabs(ev_nll_row(row, 3, 2) - log(2.0)) < 1e-6);
    /* shift invariance, no overflow at large logits */
    float big[3] = {1000.0f, 1000.0f + logf(2.0f), 1000.0f + logf(3.0f)};
    cr_expect(fabs(ev_nll_row(big, 3, 2) - log(2.0)) < 1e-4, "%g", ev_nll_row(big, 3, 2));
    /* uniform over V: log V */
    float uni[1000];
    for (int i = 0; i < 1000; i++) uni[i] = -7.5f;
    cr_expect(fabs(ev_nll_row(uni, 1000, 123) - log(1000.0)) < 1e-9);
    float nanrow[3] = {0.0f, NAN, 1.0f};
    cr_expect(isnan(ev_nll_row(nanrow, 3, 0)), "a filled (NaN) row must not score");
    cr_expect(isnan(ev_nll_row(row, 3, 3)), "target outside the vocab");
}

Test(eval, nll_rows_index_targets) {
    /* 3 rows over a vocab of 2; row r predicts ids[r + 1] */
    float lg[6] = {0, 0, 0, logf(3.0f), logf(3.0f), 0};
    int32_t ids[4] = {0, 1, 1, 0};
    double out[2];
    cr_assert(ev_nll_rows(lg, 2, ids, 1, 2, out));
    cr_expect(fabs(out[0] - log(4.0 / 3.0)) < 1e-6, "row 1 -> ids[2]=1 with p 3/4: %g", out[0]);
    cr_expect(fabs(out[1] - log(4.0 / 3.0)) < 1e-6, "row 2 -> ids[3]=0 with p 3/4: %g", out[1]);
    lg[2] = NAN;
    cr_expect(!ev_nll_rows(lg, 2, ids, 0, 3, out));
}

Test(eval, quantile_interpolates) {
    double v[5] = {5, 1, 4, 2, 3};
    cr_expect_eq(ev_quantile(v, 5, 0.0), 1.0);
    cr_expect_eq(ev_quantile(v, 5, 1.0), 5.0);
    cr_expect_eq(ev_quantile(v, 5, 0.5), 3.0);
    cr_expect(fabs(ev_quantile(v, 5, 0.9) - 4.6) < 1e-12);
    cr_expect(isnan(ev_quantile(v, 0, 0.5)));
}

Test(eval, bootstrap_ci_brackets_the_mean) {
    uint64_t st = 99;
    enum { N = 64 };
    double x[N], mean = 0, var = 0;
    for (int i = 0; i < N; i++) mean += (x[i] = 0.3 + 0.1 * tb_rand_normal(&st));
    mean /= N;
    for (int i = 0; i < N; i++) var += (x[i] - mean) * (x[i] - mean);
    double se = sqrt(var / (N - 1) / N);
    ev_ci ci = ev_bootstrap_ratio(x, NULL, N, 4000, 7, 0.95);
    cr_expect(fabs(ci.est - mean) < 1e-12);
    cr_expect(ci.lo < mean && mean < ci.hi, "[%g, %g] vs %g", ci.lo, ci.hi, mean);
    /* the percentile interval is close to mean +- 1.96 se for a mean of normal data */
    cr_expect(fabs((ci.hi - ci.lo) / (2 * 1.96 * se) - 1) < 0.2, "width %g vs %g", ci.hi - ci.lo, 2 * 1.96 * se);
    ev_ci again = ev_bootstrap_ratio(x, NULL, N, 4000, 7, 0.95);
    cr_expect(again.lo == ci.lo && again.hi == ci.hi, "seeded: repeatable");
    double c[4] = {2, 2, 2, 2};
    ev_ci flat = ev_bootstrap_ratio(c, NULL, 4, 100, 1, 0.95);
    cr_expect(flat.lo == 2 && flat.hi == 2 && flat.est == 2);
}

Test(eval, bootstrap_ratio_of_sums) {
    /* per-window sums over different token counts: the estimate pools tokens */
    double num[3] = {1.0, 3.0, 0.0}, den[3] = {2, 6, 0};
    ev_ci ci = ev_bootstrap_ratio(num, den, 3, 500, 3, 0.95);
    cr_expect(fabs(ci.est - 0.5) < 1e-12);
    cr_expect(fabs(ci.lo - 0.5) < 1e-12 && fabs(ci.hi - 0.5) < 1e-12, "every resample has ratio 0.5");
    double z[2] = {0, 0};
    cr_expect(isnan(ev_bootstrap_ratio(z, z, 2, 10, 1, 0.95).est), "zero denominator: undefined");
}

Test(eval, flag_and_list_parsing) {
    rk_fill_mode m[6];
    rk_err e = {0};
    int n = ev_parse_modes("speed,quality", m, 6, &e);
    cr_assert_eq(n, 3);
    cr_expect(m[0] == RK_FILL_OFF && m[1] == RK_FILL_SPEED && m[2] == RK_FILL_QUALITY);
    n = ev_parse_modes("identity,off,identity", m, 6, &e);
    cr_assert_eq(n, 2, "off first, duplicates dropped");
    cr_expect(m[0] == RK_FILL_OFF && m[1] == RK_FILL_IDENTITY);
    cr_expect_eq(ev_parse_modes("speed,bogus", m, 6, &e), -1);
    cr_expect(strstr(e.msg, "speed,bogus"), "the message quotes the list: %s", e.msg);
    cr_expect_eq(ev_parse_modes("", m, 6, &e), -1);
    double d[4];
    int nd;
    cr_expect(ev_parse_doubles("0.1,0.5,0.9", 0, 1, d, 4, &nd, "--depths", &e) == RK_OK && nd == 3 && d[2] == 0.9);
    cr_expect_eq(ev_parse_doubles("0.1,1.5", 0, 1, d, 4, &nd, "--depths", &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "--depths") && strstr(e.msg, "1.5"), "names the flag and the value: %s", e.msg);
    cr_expect_eq(ev_parse_doubles("0.1,,0.2", 0, 1, d, 4, &nd, "--depths", &e), RK_E_INVALID_ARG);
    cr_expect_eq(ev_parse_doubles("1,2,3,4,5", 0, 10, d, 4, &nd, "--depths", &e), RK_E_INVALID_ARG, "too many");
    cr_expect(strstr(e.msg, "at most 4"), "%s", e.msg);
    int li[4];
    cr_expect(ev_parse_ints("1024,2048", 64, 1 << 20, li, 4, &nd, "--lengths", &e) == RK_OK && nd == 2 &&
              li[1] == 2048);
    cr_expect_eq(ev_parse_ints("1024,2x", 64, 1 << 20, li, 4, &nd, "--lengths", &e), RK_E_INVALID_ARG);
    long lv;
    cr_expect(ev_parse_int("17", 1, 20, &lv, "--trials", &e) == RK_OK && lv == 17);
    cr_expect_eq(ev_parse_int("21", 1, 20, &lv, "--trials", &e), RK_E_INVALID_ARG);
    const char *depths = NULL, *trials = NULL;
    ev_flag fl[] = {{"--depths", &depths}, {"--trials", &trials}};
    char *argv[] = {"ridgekv", "eval", "needle", "--depths", "0.5", "-t", "2", "--trials", "4", NULL};
    char **av = NULL;
    int ac = 0;
    cr_assert_eq(ev_take_flags(9, argv, fl, 2, &av, &ac, &e), RK_OK);
    cr_expect_eq(ac, 5);
    cr_expect_str_eq(av[3], "-t");
    cr_expect_str_eq(depths, "0.5");
    cr_expect_str_eq(trials, "4");
    free(av);
    char *bad[] = {"ridgekv", "eval", "needle", "--trials", NULL};
    cr_expect_eq(ev_take_flags(4, bad, fl, 2, &av, &ac, &e), RK_E_INVALID_ARG, "a flag without its value");
    cr_expect(strstr(e.msg, "--trials needs a value"), "%s", e.msg);
}

/* --fill variants: settings per item over the common ones, named by the item; off first
 * and bare, repeats dropped, bad keys / values / off with settings refused by name. */
Test(eval, fill_variants_parse_and_apply) {
    ev_modes m = {.fill = {.keep_share = 0.1f, .tail = 1024, .band = 0}};
    rk_err e = {0};
    cr_assert_eq(ev_parse_variants("speed:tail=1536,quality,quality:share=0.2:band=256,quality", 512, &m, &e), RK_OK,
                 "%s", e.msg);
    cr_assert_eq(m.n, 4, "off added first, the repeated quality dropped");
    cr_expect_str_eq(ev_modes_label(&m, 0), "off");
    cr_expect_str_eq(ev_modes_label(&m, 1), "speed:tail=1536");
    cr_expect_str_eq(ev_modes_label(&m, 2), "quality");
    cr_expect_str_eq(ev_modes_label(&m, 3), "quality:share=0.2:band=256");
    cr_expect(ev_modes_have_variants(&m));
    rk_fill_params f;
    ev_modes_params(&m, 1, &f);
    cr_expect(f.mode == RK_FILL_SPEED && f.tail == 1536 && f.keep_share == 0.1f && f.band == 0);
    ev_modes_params(&m, 2, &f);
    cr_expect(f.mode == RK_FILL_QUALITY && f.tail == 1024 && f.keep_share == 0.1f && f.band == 0, "plain: the common");
    ev_modes_params(&m, 3, &f);
    cr_expect(f.mode == RK_FILL_QUALITY && f.tail == 1024 && fabsf(f.keep_share - 0.2f) < 1e-7f && f.band == 256);
    ev_modes p = {0};
    cr_assert_eq(ev_parse_variants("quality:share=0", 512, &p, &e), RK_OK, "%s", e.msg);
    ev_modes_params(&p, 1, &f);
    cr_expect(f.keep_share == 0.0f, "share 0 is a setting, not 'unset'");
    cr_assert_eq(ev_parse_variants("speed,quality", 512, &p, &e), RK_OK);
    cr_expect(!ev_modes_have_variants(&p) && p.n == 3);
    const char *bad[] = {"quality:share=1.5", "quality:shares=0.2", "quality:band",   "speed:tail=256",
                         "off:tail=1024",     "bogus:share=0.1",    "quality:band=-1"};
    const char *why[] = {"--fill share", "shares", "band", "--fill tail", "off takes no", "bogus", "--fill band"};
    for (int i = 0; i < 7; i++) {
        e = (rk_err){0};
        cr_expect_eq(ev_parse_variants(bad[i], 512, &p, &e), RK_E_INVALID_ARG, "%s accepted", bad[i]);
        cr_expect(strstr(e.msg, why[i]), "%s: %s", bad[i], e.msg);
    }
    cr_expect_eq(ev_parse_variants("speed,q1,q2,q3,q4,q5,q6,q7", 512, &p, &e), RK_E_INVALID_ARG);
    /* default: a mode of its own (the caller makes it ask's), not a variant; no settings */
    cr_assert_eq(ev_parse_variants("off,quality,default,default", 512, &p, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(p.n, 3, "off, quality, default once");
    cr_expect_str_eq(ev_modes_label(&p, 2), "default");
    cr_expect(p.set[2] == EV_SET_DEFAULT && p.mode[2] == RK_FILL_OFF && !(p.set[1] & EV_SET_DEFAULT));
    cr_expect(!ev_modes_have_variants(&p), "default is not a variant");
    e = (rk_err){0};
    cr_expect_eq(ev_parse_variants("default:share=0.2", 512, &p, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "default takes no settings"), "%s", e.msg);
}

Test(eval, bootstrap_of_a_constant_is_that_constant) {
    /* every resample of identical units has the same mean: a zero-width interval at it */
    double c[7] = {-1.25, -1.25, -1.25, -1.25, -1.25, -1.25, -1.25};
    for (int n_boot = 1; n_boot <= 1000; n_boot *= 10) {
        ev_ci ci = ev_bootstrap_ratio(c, NULL, 7, n_boot, 11, 0.9);
        cr_expect(ci.est == -1.25 && ci.lo == -1.25 && ci.hi == -1.25, "n_boot %d: %g [%g, %g]", n_boot, ci.est, ci.lo,
                  ci.hi);
    }
    /* a ratio whose units all have num = 3 den: 3 whatever the resample */
    double num[5] = {3, 6, 9, 0.3, 30}, den[5] = {1, 2, 3, 0.1, 10};
    ev_ci r = ev_bootstrap_ratio(num, den, 5, 200, 5, 0.95);
    cr_expect(fabs(r.est - 3) < 1e-12 && fabs(r.lo - 3) < 1e-12 && fabs(r.hi - 3) < 1e-12, "%g [%g, %g]", r.est, r.lo,
              r.hi);
    /* no resamples: the estimate without an interval */
    ev_ci none = ev_bootstrap_ratio(num, den, 5, 0, 5, 0.95);
    cr_expect(fabs(none.est - 3) < 1e-12 && isnan(none.lo) && isnan(none.hi));
}

Test(eval, long_range_selection_on_a_synthetic_gain_vector) {
    /* gain = NLL(short) - NLL(full) for 10 tokens */
    const double gain[10] = {0.9, -0.2, 0.5, 0.0, 2.0, 0.5, 0.1, 1.5, -1.0, 0.7};
    unsigned char sel[10];
    /* LongPPL: gain > 0.5 (strict): 0.9, 2.0, 1.5, 0.7 */
    cr_expect_eq(ev_gain_select(gain, 10, 0.5, true, sel), 4u);
    const unsigned char want_strict[10] = {1, 0, 0, 0, 1, 0, 0, 1, 0, 1};
    cr_expect_arr_eq(sel, want_strict, 10);
    /* >= 0.5 adds the two tokens at exactly 0.5 */
    cr_expect_eq(ev_gain_select(gain, 10, 0.5, false, sel), 6u);
    cr_expect(sel[2] && sel[5]);
    /* -inf selects every token (the "last" set) */
    cr_expect_eq(ev_gain_select(gain, 10, -INFINITY, false, sel), 10u);
    /* top 20%: the 0.8 quantile of the sorted gains
     * (-1, -0.2, 0, 0.1, 0.5, 0.5, 0.7, 0.9, 1.5, 2.0): position 0.8 * 9 = 7.2,
     * 0.9 + 0.2 * (1.5 - 0.9) = 1.02; >= 1.02 selects 1.5 and 2.0 */
    const double thr = ev_top_threshold(gain, 10, 0.2);
    cr_expect(fabs(thr - 1.02) < 1e-12, "%.15g", thr);
    cr_expect_eq(ev_gain_select(gain, 10, thr, false, sel), 2u);
    cr_expect(sel[4] && sel[7]);
    cr_expect_eq(gain[0], 0.9, "the gain vector is not sorted in place");
    cr_expect(isnan(ev_top_threshold(gain, 0, 0.1)));
    /* top 100%: the minimum, so every token */
    cr_expect_eq(ev_top_threshold(gain, 10, 1.0), -1.0);
}

Test(eval, set_sums_pool_tokens_per_window) {
    /* 2 windows x 3 scored tokens, 2 modes (off, mode); tokens 0, 2 (window 0) and 4 selected */
    const double off[6] = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, md[6] = {1.5, 2.0, 2.0, 4.0, 6.0, 6.0};
    const double *nll[2] = {off, md};
    const unsigned char sel[6] = {1, 0, 1, 0, 1, 0};
    double den[2] = {0}, s0[2] = {0}, s1[2] = {0}, n0[2] = {0}, n1[2] = {0};
    double *sum[2] = {s0, s1}, *num[2] = {n0, n1};
    ev_set_sums(sel, nll, 2, 2, 3, den, sum, num);
    cr_expect(den[0] == 2 && den[1] == 1);
    cr_expect(s0[0] == 4.0 && s0[1] == 5.0, "off: 1 + 3, 5");
    cr_expect(s1[0] == 3.5 && s1[1] == 6.0, "mode: 1.5 + 2, 6");
    cr_expect(n0[0] == 0 && n0[1] == 0, "off minus off");
    cr_expect(n1[0] == -0.5 && n1[1] == 1.0, "mode minus off: (0.5 - 1), 1");
    /* the pooled ΔNLL is Σnum / Σden = 0.5 / 3 */
    ev_ci ci = ev_bootstrap_ratio(n1, den, 2, 0, 1, 0.95);
    cr_expect(fabs(ci.est - 0.5 / 3.0) < 1e-15, "%g", ci.est);
}

Test(eval, corpus_windows_in_range_and_disjoint) {
    char buf[1024];
    if (!tb_shared_path(buf, sizeof buf, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(buf, &m, NULL), RK_OK);
    char dir[] = "/tmp/rkevalXXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/doc.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < 200; i++) fprintf(f, "Once upon a time there was a little girl named Lily. ");
    fclose(f);
    ev_corpus c;
    rk_err e = {0};
    cr_assert_eq(ev_corpus_load(&c, m, "doc.txt", dir, &e), RK_OK, "bare names are looked up in the corpus dir: %s",
                 e.msg);
    cr_assert_eq(c.n_docs, 1);
    cr_expect(c.docs[0].n > 1000, "%zu tokens", c.docs[0].n);
    cr_expect_eq(c.bos, rk_model_token_bos(m), "llama vocab asks for BOS");
    uint64_t rng = 5;
    ev_window w[8];
    size_t n = 100;
    cr_assert(ev_corpus_pick(&c, n, 8, &rng, w));
    for (int i = 0; i < 8; i++) {
        cr_expect(w[i].doc == 0 && w[i].off + n <= c.docs[0].n);
        for (int j = 0; j < i; j++)
            cr_expect(w[j].off + n <= w[i].off || w[i].off + n <= w[j].off, "windows %d and %d overlap", i, j);
    }
    int32_t ids[101];
    ev_window_ids(&c, w[0], 101, ids);
    cr_expect_eq(ids[0], c.bos);
    cr_expect_eq(ids[1], c.docs[0].ids[w[0].off]);
    cr_expect_eq(ev_window_doc_tokens(&c, 101), 100u);
    cr_expect(!ev_corpus_pick(&c, c.docs[0].n + 1, 1, &rng, w), "no document that long");
    ev_corpus_deinit(&c);
    cr_expect_eq(ev_corpus_load(&c, m, "no_such_file.txt", dir, &e), RK_E_NOT_FOUND);
    cr_expect(strstr(e.msg, "no_such_file.txt") && strstr(e.msg, dir), "names the file and the dir: %s", e.msg);
    unlink(path);
    rmdir(dir);
    rk_model_destroy(m);
}

/* ---- the commands on the default model -------------------------------------------- */

typedef tb_result result;

static result run(const char *args) { return et_run(args); }

static void done(result *r) { tb_result_free(r); }

static const char *need_model(char *buf, size_t cap) {
    const char *p = tb_default_model(buf, cap);
    if (!p) cr_skip_test("default model not in the cache (ridgekv pull)");
    char c[1024];
    if (!tb_shared_path(c, sizeof c, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", c);
    return p;
}


static double num(json_object *o, const char *path) {
    char key[128];
    snprintf(key, sizeof key, "%s", path);
    json_object *cur = o;
    for (char *k = strtok(key, "."); k; k = strtok(NULL, ".")) cur = json_object_object_get(cur, k);
    cr_assert(cur, "no %s", path);
    return json_object_get_double(cur);
}

Test(eval, usage_errors) {
    result r = run("eval needle --trials 2 --lengths 1024");
    cr_expect_eq(r.code, 2, "no maps and no split: nothing to compare");
    cr_expect(strstr(r.err, "nothing to compare"), "%s", r.err);
    done(&r);
    r = run("eval needle --split 12 --fill off,identity --depths 0.5,1.5");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "--depths"), "%s", r.err);
    done(&r);
    r = run("eval nll --split 12 --tail 256");
    cr_expect_eq(r.code, 2, "the CLI keeps the tail >= 512");
    done(&r);
    r = run("eval nll --split 12 --len 512");
    cr_expect_eq(r.code, 2, "a window of 512 with a tail of 512 has nothing to fill");
    cr_expect(strstr(r.err, "--len"), "%s", r.err);
    done(&r);
    r = run("eval splice --fill off --split 12");
    cr_expect_eq(r.code, 2);
    done(&r);
    r = run("eval needle --help");
    cr_expect_eq(r.code, 0);
    cr_expect(strstr(r.out, "McNemar"), "%s", r.out);
    done(&r);
}

/* eval ppl's driver (eval/eval_ppl.c) against the double-precision reference forward:
 * chunks from an empty cache, BOS in front of each, the second half scored. */
Test(eval, ppl_matches_the_reference_forward) {
    char path[512];
    const tb_tiny_spec spec = {
        .arch = TB_ARCH_QWEN2, .vocab = TB_VOCAB_GPT2, .add_bos = true, .n_ctx_train = 64, .seed = 11};
    cr_assert(tb_tiny_model(&spec, path, sizeof path), "%s", path);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(path, &m, &e), RK_OK, "%s", e.msg);
    cr_assert(rk_model_add_bos(m) && rk_model_token_bos(m) >= 0);
    enum { C = 24, N = 3 * C + 5 };
    int32_t ids[N];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % 250) + 3;
    int32_t keep[N];
    memcpy(keep, ids, sizeof ids);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = C;
    sp.n_threads = 1;
    sp.kv.kind = RK_KV_F32; /* f16 rows would add their rounding to the comparison */
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    const ev_ppl_params pp = {.n_ctx = C, .max_chunks = 2};
    cr_expect_eq(ev_ppl_n_chunks(N, &pp), 2);
    cr_expect_eq(ev_ppl_n_chunks(N, &(ev_ppl_params){.n_ctx = C}), 3);
    cr_expect_eq(ev_ppl_n_chunks(C - 1, &pp), 0);
    ev_ppl_result r = {0};
    cr_assert_eq(ev_ppl_run(m, s, ids, N, &pp, NULL, NULL, &r, &e), RK_OK, "%s", e.msg);
    cr_expect(!memcmp(ids, keep, sizeof ids), "the ids are not changed");
    /* rows C/2 .. C-2 of each chunk predict tokens C/2+1 .. C-1 */
    cr_expect_eq(r.n_chunk, 2);
    cr_expect_eq(r.n_scored, 2 * (C - 1 - C / 2));
    double sum = 0, sum2 = 0;
    for (int ch = 0; ch < 2; ch++) {
        int32_t chunk[C];
        memcpy(chunk, ids + ch * C, sizeof chunk);
        chunk[0] = rk_model_token_bos(m);
        int32_t nv = 0;
        char why[256];
        float *ref = tb_ref_logits(path, chunk, C, &nv, why, sizeof why);
        cr_assert(ref, "%s", why);
        for (int j = C / 2; j < C - 1; j++) {
            const double l = ev_nll_row(ref + (size_t)j * (size_t)nv, nv, chunk[j + 1]);
            sum += l, sum2 += l * l;
        }
        free(ref);
    }
    const double n = (double)r.n_scored, mean = sum / n;
    /* f32 forward and KV against f64 on a 2-layer model: logits agree to ~1e-5, NLLs likewise */
    cr_expect(fabs(r.nll - mean) < 2e-5, "mean NLL %.8f, reference %.8f", r.nll, mean);
    cr_expect(fabs(r.ppl - exp(mean)) < 2e-5 * exp(mean), "ppl %.6f, reference %.6f", r.ppl, exp(mean));
    const double sd = sqrt((sum2 / n - mean * mean) / (n - 1));
    cr_expect(fabs(r.ppl_err - exp(mean) * sd) < 1e-3 * exp(mean) * sd + 1e-9, "ppl_err %.6f, reference %.6f",
              r.ppl_err, exp(mean) * sd);
    /* fewer tokens than one chunk, a chunk under 4 tokens: refused */
    cr_expect_eq(ev_ppl_run(m, s, ids, C - 1, &pp, NULL, NULL, &r, &e), RK_E_INVALID_ARG);
    cr_expect_eq(ev_ppl_run(m, s, ids, N, &(ev_ppl_params){.n_ctx = 3}, NULL, NULL, &r, &e), RK_E_INVALID_ARG);
    /* one trailing newline is dropped before tokenizing, BOS first */
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    cr_assert_eq(ev_ppl_tokenize(m, "the cat\n", 8, &a, &na, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_model_tokenize(m, "the cat", 7, true, false, &b, &nb, &e), RK_OK, "%s", e.msg);
    cr_expect(na == nb && !memcmp(a, b, na * sizeof *a) && a[0] == rk_model_token_bos(m));
    free(a), free(b);
    rk_session_destroy(s);
    rk_model_destroy(m);
    unlink(path);
}

/* The commands take --kv like every other (the session's policy): short runs on the tiny
 * stories260K model (suite cli). */
Test(eval, needle_nll_splice_take_kv_on_a_tiny_model) {
    char sp[1024], c[1024], args[2048];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(c, sizeof c, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", c);
    snprintf(
        args, sizeof args,
        "eval needle -m '%s' --ctx-overflow-ok --split 2 --fill identity,plumb --lengths 1024 --depths 0.5 --trials 2 --gen 4 "
        "--kv lowram:window=32 --json",
        sp);
    result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out);
    cr_assert(j, "%s", r.out);
    cr_expect_str_eq(json_object_get_string(json_object_object_get(j, "kv")), "lowram:window=32");
    json_object *pl = et_mode_obj(j, "plumb");
    cr_expect_eq(num(pl, "b") + num(pl, "c"), 0, "plumb answers as off");
    json_object_put(j);
    done(&r);
    snprintf(
        args, sizeof args,
        "eval nll -m '%s' --ctx-overflow-ok --split 2 --fill plumb --len 1024 --windows 1 --short 128 --boot 10 --kv f32 --json",
        sp);
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    j = json_tokener_parse(r.out);
    cr_assert(j, "%s", r.out);
    cr_expect_str_eq(json_object_get_string(json_object_object_get(j, "kv")), "f32");
    cr_expect(fabs(num(et_mode_obj(j, "plumb"), "last.delta.est")) < 1e-6, "f32 plumb vs off: %g",
              num(et_mode_obj(j, "plumb"), "last.delta.est"));
    /* the per-window sums (for pooling runs of other seeds) add up to the run's means */
    json_object *w0 = json_object_array_get_idx(json_object_object_get(j, "window_list"), 0);
    cr_assert(w0, "window_list[0]");
    const char *mn[2] = {"off", "plumb"};
    for (int i = 0; i < 2; i++) {
        json_object *mo = et_mode_obj(j, mn[i]);
        char key[64];
        snprintf(key, sizeof key, "nll_sum.%s", mn[i]);
        cr_expect(fabs(num(w0, key) / num(j, "n_tokens") - num(mo, "last.nll")) < 1e-9 * (1 + num(mo, "last.nll")),
                  "%s: window sum %g / %g tokens vs mean %g", mn[i], num(w0, key), num(j, "n_tokens"),
                  num(mo, "last.nll"));
        cr_expect_eq(num(w0, "n_long_range"), num(j, "n_long_range"));
        snprintf(key, sizeof key, "long_range_nll_sum.%s", mn[i]);
        if (num(j, "n_long_range") > 0)
            cr_expect(fabs(num(w0, key) / num(j, "n_long_range") - num(mo, "long_range.nll")) <
                          1e-9 * (1 + num(mo, "long_range.nll")),
                      "%s: long-range window sum %g vs mean %g", mn[i], num(w0, key), num(mo, "long_range.nll"));
    }
    json_object_put(j);
    done(&r);
    /* a variant is the same run as its settings given as flags: same windows, same sums */
    snprintf(args, sizeof args,
             "eval nll -m '%s' --ctx-overflow-ok --split 2 --fill identity,identity:tail=768 --len 1024 --windows 1 "
             "--short 128 --boot 10 --kv f32 --json",
             sp);
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    j = json_tokener_parse(r.out);
    cr_assert(j, "%s", r.out);
    snprintf(args, sizeof args,
             "eval nll -m '%s' --ctx-overflow-ok --split 2 --fill identity --tail 768 --len 1024 --windows 1 "
             "--short 128 --boot 10 --kv f32 --json",
             sp);
    result r2 = run(args);
    cr_assert_eq(r2.code, 0, "%s", r2.err);
    json_object *j2 = json_tokener_parse(r2.out);
    cr_assert(j2, "%s", r2.out);
    w0 = json_object_array_get_idx(json_object_object_get(j, "window_list"), 0);
    json_object *w2 = json_object_array_get_idx(json_object_object_get(j2, "window_list"), 0);
    const double v = num(w0, "nll_sum.identity:tail=768"), v2 = num(w2, "nll_sum.identity"),
                 d512 = num(w0, "nll_sum.identity");
    cr_expect(fabs(v - v2) <= 1e-9 * fabs(v2), "variant %.9g vs flags %.9g", v, v2);
    cr_expect(fabs(d512 - v) > 1e-6 * fabs(v), "tail 512 and 768 differ (%.9g vs %.9g): else the check shows nothing",
              d512, v);
    json_object_put(j), json_object_put(j2);
    done(&r), done(&r2);
    r = run("eval needle --split 2 --fill off,identity:tail=768 --lengths 1024 --trials 1");
    cr_expect_eq(r.code, 2, "needle takes plain modes");
    cr_expect(strstr(r.err, "variants"), "%s", r.err);
    done(&r);
    snprintf(
        args, sizeof args,
        "eval splice -m '%s' --ctx-overflow-ok --split 2 --fill identity --len 1024 --windows 1 --groups 1 --boot 10 --kv f32 --json",
        sp);
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    j = json_tokener_parse(r.out);
    cr_assert(j, "%s", r.out);
    json_object *all_kv = json_object_array_get_idx(json_object_object_get(j, "splices"), 4);
    cr_expect_str_eq(json_object_get_string(json_object_object_get(all_kv, "splice")), "kv");
    cr_expect(fabs(num(all_kv, "delta")) < 1e-6, "exact K and V everywhere late: no gap left: %g",
              num(all_kv, "delta"));
    json_object_put(j);
    done(&r);
}


static void append_text(const char *path, const char *text) {
    FILE *f = fopen(path, "a");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

/* the per-trial records of an --json run: key, needle position and every answer */
static char *trial_answers(const char *out) {
    json_object *j = json_tokener_parse(out);
    cr_assert(j, "not JSON: %s", out);
    json_object *tr = json_object_object_get(j, "trial_results");
    json_object *keep = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(tr); i++) {
        json_object *t = json_object_array_get_idx(tr, i), *k = json_object_new_object();
        json_object_object_add(k, "key", json_object_get(json_object_object_get(t, "key")));
        json_object_object_add(k, "needle_pos", json_object_get(json_object_object_get(t, "needle_pos")));
        json_object_object_add(k, "answers", json_object_get(json_object_object_get(t, "answers")));
        json_object_array_add(keep, k);
    }
    char *s = strdup(json_object_to_json_string_ext(keep, JSON_C_TO_STRING_PLAIN));
    json_object_put(keep);
    json_object_put(j);
    return s;
}

/* --results: trials appended as they end, resumed in pieces to the same answers as one
 * run, other settings refused by name, a torn last line dropped, a bad line refused,
 * --budget stops between trials (suite cli, stories260K). */
Test(eval, needle_results_file_resumes_to_the_same_answers) {
    char sp[1024], c[1024], args[4096], dir[] = "/tmp/rk_needle_log_XXXXXX", path[1100];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(c, sizeof c, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", c);
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/needle.jsonl", dir);
    const char *base = "eval needle -m '%s' --ctx-overflow-ok --split 2 --fill identity,plumb --lengths 1024 "
                       "--depths 0.3,0.7 --gen 4 -t 1 --json --trials %d %s %s";
    /* the reference: one run of 4 trials, no file */
    snprintf(args, sizeof args, base, sp, 4, "", "");
    result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    char *ref = trial_answers(r.out);
    done(&r);
    char res[1200];
    snprintf(res, sizeof res, "--results '%s'", path);
    snprintf(args, sizeof args, base, sp, 2, res, "");
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    done(&r);
    cr_expect_eq(et_count_lines(path), 3, "header + 2 trials");
    snprintf(args, sizeof args, base, sp, 4, res, "");
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "4 trials (2 new in this run)"), "%s", r.err);
    char *got = trial_answers(r.out);
    cr_expect_str_eq(got, ref, "2 + 2 resumed trials are the 4 of one run");
    free(got);
    json_object *j = json_tokener_parse(r.out);
    cr_expect_eq(num(et_mode_obj(j, "off"), "n"), 4);
    json_object_put(j);
    done(&r);
    cr_expect_eq(et_count_lines(path), 5);
    /* another seed: refused, naming it; the file is left alone */
    snprintf(args, sizeof args, base, sp, 4, res, "--seed 2");
    r = run(args);
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "other settings") && strstr(r.err, "seed"), "%s", r.err);
    done(&r);
    cr_expect_eq(et_count_lines(path), 5);
    /* a killed run's half line: dropped, the run goes on from the whole lines */
    append_text(path, "{\"trial\":4,\"length\":10");
    snprintf(args, sizeof args, base, sp, 5, res, "");
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "cut short"), "%s", r.err);
    cr_expect(strstr(r.err, "5 trials (1 new in this run)"), "%s", r.err);
    done(&r);
    cr_expect_eq(et_count_lines(path), 6);
    /* a whole line that is not a record: refused by line number, nothing appended */
    append_text(path, "not json\n");
    snprintf(args, sizeof args, base, sp, 6, res, "");
    r = run(args);
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "line 7"), "%s", r.err);
    done(&r);
    cr_expect_eq(et_count_lines(path), 7);
    /* --budget: a new file, one trial (it takes longer than the budget), then it stops */
    char path2[1100], res2[1200];
    snprintf(path2, sizeof path2, "%s/budget.jsonl", dir);
    snprintf(res2, sizeof res2, "--results '%s'", path2);
    snprintf(args, sizeof args, base, sp, 4, res2, "--budget 0.05");
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "1 trials (1 new in this run); the budget ran out"), "%s", r.err);
    done(&r);
    cr_expect_eq(et_count_lines(path2), 2);
    snprintf(args, sizeof args, base, sp, 4, "", "--budget 5");
    r = run(args);
    cr_expect_eq(r.code, 2, "--budget without --results");
    done(&r);
    free(ref);
    unlink(path), unlink(path2), rmdir(dir);
}

Test(eval_model, needle_paired_and_plumb_equals_off, .timeout = 900) {
    char buf[1024];
    const char *model = need_model(buf, sizeof buf);
    char args[2048];
    snprintf(
        args, sizeof args,
        "eval needle -m '%s' --split 12 --fill identity,plumb --lengths 1024 --depths 0.2,0.8 --trials 4 --tail 512 "
        "--seed 3 --json",
        model);
    result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out);
    cr_assert(j, "not JSON: %s", r.out);
    json_object *off = et_mode_obj(j, "off"), *id = et_mode_obj(j, "identity"), *pl = et_mode_obj(j, "plumb");
    cr_expect_eq(num(off, "n"), 4);
    /* paired arithmetic: correct(mode) - correct(off) = c - b */
    cr_expect_eq(num(id, "correct") - num(off, "correct"), num(id, "c") - num(id, "b"));
    cr_expect_eq(num(pl, "b") + num(pl, "c"), 0, "plumb is off through the fill path: the same answers");
    cr_expect_eq(num(pl, "p_mcnemar"), 1.0);
    json_object *trials = json_object_object_get(j, "trial_results");
    cr_assert_eq(json_object_array_length(trials), 4);
    for (size_t i = 0; i < 4; i++) {
        json_object *t = json_object_array_get_idx(trials, i);
        /* the needle (about a dozen tokens) ends before the exact tail */
        cr_expect(num(t, "needle_pos") + 12 <= num(t, "bulk_end"), "needle at %g, bulk ends %g", num(t, "needle_pos"),
                  num(t, "bulk_end"));
        cr_expect_eq(num(t, "bulk_end"), 1024 - 512);
        json_object *a = json_object_object_get(t, "answers");
        cr_expect_str_eq(json_object_get_string(json_object_object_get(json_object_object_get(a, "plumb"), "answer")),
                         json_object_get_string(json_object_object_get(json_object_object_get(a, "off"), "answer")));
    }
    json_object_put(j);
    done(&r);
}

Test(eval_model, nll_plumb_zero_identity_positive, .timeout = 900) {
    char buf[1024];
    const char *model = need_model(buf, sizeof buf);
    char args[2048];
    snprintf(args, sizeof args,
             "eval nll -m '%s' --split 12 --fill identity,plumb --len 1024 --windows 2 --short 128 --boot 200 --json",
             model);
    result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out);
    cr_assert(j, "not JSON: %s", r.out);
    cr_expect_eq(num(j, "n_tokens"), 2 * 512);
    cr_expect(num(j, "n_top") >= 100 && num(j, "n_top") <= 110, "top 10%% of 1024 tokens: %g", num(j, "n_top"));
    cr_expect(num(j, "mean_gain") > 0, "far context helps the exact model on average: %g", num(j, "mean_gain"));
    json_object *off = et_mode_obj(j, "off"), *id = et_mode_obj(j, "identity"), *pl = et_mode_obj(j, "plumb");
    double nll_off = num(off, "last.nll");
    cr_expect(nll_off > 1 && nll_off < 8, "NLL of English text: %g", nll_off);
    cr_expect(fabs(num(pl, "last.delta.est")) < 2e-3, "plumb vs off: %g", num(pl, "last.delta.est"));
    cr_expect(fabs(num(pl, "long_range.delta.est")) < 5e-3 || num(j, "n_long_range") == 0);
    /* identity fill skips 18 of 30 layers for half the window: the loss must rise */
    cr_expect(num(id, "last.delta.est") > 0.01, "identity ΔNLL %g", num(id, "last.delta.est"));
    cr_expect(num(id, "last.delta.lo") <= num(id, "last.delta.est") &&
              num(id, "last.delta.est") <= num(id, "last.delta.hi"));
    json_object_put(j);
    done(&r);
}

Test(eval_model, splice_all_late_kv_recovers_everything, .timeout = 900) {
    char buf[1024];
    const char *model = need_model(buf, sizeof buf);
    char args[2048];
    snprintf(args, sizeof args,
             "eval splice -m '%s' --split 12 --fill identity --len 1024 --windows 1 --groups 2 --boot 50 --json",
             model);
    result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out);
    cr_assert(j, "not JSON: %s", r.out);
    cr_expect(num(j, "delta_fill.est") > 0.01, "identity ΔNLL %g", num(j, "delta_fill.est"));
    json_object *sp = json_object_object_get(j, "splices");
    cr_assert_eq(json_object_array_length(sp), 2 * 2 + 3);
    json_object *all_kv = json_object_array_get_idx(sp, 6);
    cr_expect_str_eq(json_object_get_string(json_object_object_get(all_kv, "splice")), "kv");
    /* exact K and V in every late layer: the tail sees the exact cache, so no gap is left */
    cr_expect(fabs(num(all_kv, "delta")) < 1e-4, "%g", num(all_kv, "delta"));
    cr_expect(fabs(num(all_kv, "recovered.est") - 1) < 1e-2, "%g", num(all_kv, "recovered.est"));
    json_object *layers = json_object_object_get(j, "layers");
    cr_assert_eq(json_object_array_length(layers), 30 - 12);
    /* the split layer's input is the exact split stream (W_S = I): its K/V are exact */
    json_object *l0 = json_object_array_get_idx(layers, 0), *l5 = json_object_array_get_idx(layers, 5);
    cr_expect(num(l0, "k_rel_err") < 1e-6 && num(l0, "v_rel_err") < 1e-6);
    cr_expect(num(l5, "k_rel_err") > 1e-3, "identity fill moves keys: %g", num(l5, "k_rel_err"));
    cr_expect(fabs(num(l5, "k_norm_share") + num(l5, "k_dir_share") - 1) < 1e-6, "norm + direction = total");
    json_object_put(j);
    done(&r);
}
