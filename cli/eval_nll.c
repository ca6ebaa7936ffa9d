/* `ridgekv eval nll`: ΔNLL on the last tokens of long windows and loss on long-range
 * tokens (LongPPL's definition), every fill mode against off on the same windows
 * (SPEC §2, line 2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eval_common.h"

static const char *help =
    "usage: ridgekv eval nll [-m MODEL] [--ridgefill MAPS] [--fill off,speed,quality] [--tail 512]\n"
    "                       [--len 2048] [--windows 8] [--score 512] [--short 256]\n"
    "                       [--gain-threshold 0.5] [--top 0.1] [--boot 1000] [--files F1,F2] [--seed N] [--json]\n"
    "\n"
    "Teacher-forced loss on --windows random windows of --len tokens (BOS first when the vocab\n"
    "wants it) from held-out corpus files. Each mode evaluates the whole window in one call (rows\n"
    "with >= --tail tokens after them are bulk rows) and scores the --score targets predicted by\n"
    "the last --score rows, which lie in the exact tail. ΔNLL = mode - off per token, averaged.\n"
    "\n"
    "Long-range tokens (LongPPL): for the exact model, the gain of a scored token is\n"
    "NLL(short context) - NLL(full window), where the short context is a second exact eval of\n"
    "BOS + the --short tokens before the scored region + the scored region (so a scored token\n"
    "sees --short to --short+--score-1 tokens instead of the whole window). Tokens with gain >\n"
    "--gain-threshold, and the top --top share by gain (pooled over windows), are long-range;\n"
    "each mode's mean NLL on them is compared with off.\n"
    "CIs: percentile bootstrap over windows (--boot resamples, ratio of sums), 95%.\n"
    "\n"
    "Default files " EV_DEFAULT_FILES " (looked up in --corpus DIR,\n"
    "default $RIDGEKV_CORPUS or ../shared/corpus): held out from the calibration texts\n"
    "(calibrate on the Austen files). --tail defaults to 512 here.\n";

#define MAX_MODES 6

typedef struct nll_sets {
    double *num[MAX_MODES], *den; /* per window: Σ(mode - off) and count over the set */
    double *sum[MAX_MODES];       /* per window: Σ NLL of the mode over the set */
} nll_sets;

static void set_free(nll_sets *s) {
    for (int i = 0; i < MAX_MODES; i++) free(s->num[i]), free(s->sum[i]);
    free(s->den);
}

static bool set_alloc(nll_sets *s, int n_win) {
    memset(s, 0, sizeof *s);
    s->den = calloc((size_t)n_win, sizeof(double));
    bool ok = s->den != NULL;
    for (int i = 0; i < MAX_MODES; i++) {
        s->num[i] = calloc((size_t)n_win, sizeof(double));
        s->sum[i] = calloc((size_t)n_win, sizeof(double));
        ok = ok && s->num[i] && s->sum[i];
    }
    return ok;
}

/* Fills a token set (selected where gain >= thr (strict when strict)) from the per-token NLLs. */
static void set_fill(nll_sets *s, double *const nll[MAX_MODES], const double *gain, int n_modes, int n_win, int score,
                     double thr, bool strict) {
    for (int w = 0; w < n_win; w++)
        for (int j = 0; j < score; j++) {
            size_t k = (size_t)w * (size_t)score + (size_t)j;
            if (strict ? !(gain[k] > thr) : !(gain[k] >= thr)) continue;
            s->den[w] += 1;
            for (int mi = 0; mi < n_modes; mi++) {
                s->sum[mi][w] += nll[mi][k];
                s->num[mi][w] += nll[mi][k] - nll[0][k];
            }
        }
}

static double total(const double *v, int n) {
    double a = 0;
    for (int i = 0; i < n; i++) a += v[i];
    return a;
}

int cmd_eval_nll(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    const char *f_len = "2048", *f_win = "8", *f_score = "512", *f_short = "256", *f_thr = "0.5", *f_top = "0.1",
               *f_boot = "1000", *f_files = EV_DEFAULT_FILES, *f_corpus = NULL;
    ev_flag flags[] = {{"--len", &f_len},     {"--windows", &f_win}, {"--score", &f_score},
                       {"--short", &f_short}, {"--gain-threshold", &f_thr}, {"--top", &f_top},
                       {"--boot", &f_boot},   {"--files", &f_files}, {"--corpus", &f_corpus}};
    const char *cmd = "eval nll";
    char **av = NULL;
    int ac = 0, n_pos = 0;
    int rc = ev_take_flags(argc, argv, flags, 9, &av, &ac, cmd);
    if (rc) return rc;
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = -1.0f};
    o.sp.seed = 1;
    const char *pos[1];
    rc = cli_parse(ac, av, 3, &o, pos, 0, &n_pos, cmd);
    free(av);
    if (rc) return rc;
    long len, n_win, score, n_short, boot;
    double thr, top;
    if (!ev_parse_int(f_len, 16, 1 << 20, &len, cmd, "--len") ||
        !ev_parse_int(f_win, 1, 100000, &n_win, cmd, "--windows") ||
        !ev_parse_int(f_score, 1, 1 << 20, &score, cmd, "--score") ||
        !ev_parse_int(f_short, 0, 1 << 20, &n_short, cmd, "--short") ||
        !ev_parse_double(f_thr, -100, 100, &thr, cmd, "--gain-threshold") ||
        !ev_parse_double(f_top, 0.001, 1, &top, cmd, "--top") ||
        !ev_parse_int(f_boot, 0, 1000000, &boot, cmd, "--boot"))
        return RK_EXIT_USAGE;
    if (!o.tail) o.tail = 512;
    if (score > o.tail || len - o.tail < 1 || n_short + score + 1 > len) {
        fprintf(stderr, "ridgekv %s: need --score (%ld) <= --tail (%d) < --len (%ld) and --short + --score < --len "
                        "(the scored rows must be exact tail rows and there must be bulk rows to fill)\n",
                cmd, score, o.tail, len);
        return RK_EXIT_USAGE;
    }
    const char *fill = o.fill ? o.fill : o.ridgefill ? "off,speed,quality" : o.split ? "off,identity" : NULL;
    if (!fill) {
        fprintf(stderr, "ridgekv %s: nothing to compare: give --ridgefill MAPS (or --split S with --fill off,identity)\n",
                cmd);
        return RK_EXIT_USAGE;
    }
    rk_fill_mode modes[MAX_MODES];
    int n_modes = ev_parse_modes(fill, modes, MAX_MODES, cmd);
    if (n_modes < 0) return RK_EXIT_USAGE;
    if (!f_corpus) f_corpus = getenv("RIDGEKV_CORPUS");
    if (!f_corpus || !*f_corpus) f_corpus = "../shared/corpus";

    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_ridge_maps *maps = NULL;
    ev_corpus corpus = {0};
    ev_window *wins = NULL;
    int32_t *ids = NULL, *sids = NULL;
    float *logits = NULL;
    double *nll[MAX_MODES] = {0}, *nll_short = NULL, *gain = NULL, *tmp = NULL;
    double prefill_s[MAX_MODES] = {0};
    nll_sets lr = {0}, tp = {0}, all = {0};
    rk_err e = {0};
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) return rc;
    const rk_hparams *hp = rk_model_hparams(m);
    if (len > hp->n_ctx_train)
        fprintf(stderr, "ridgekv %s: warning: --len %ld exceeds the model's training context %d\n", cmd, len,
                hp->n_ctx_train);
    if ((rc = ev_corpus_load(&corpus, m, f_files, f_corpus, cmd))) goto done;
    rk_session_params sp;
    cli_session_params(&o, &sp);
    sp.n_ctx = o.n_ctx > len ? o.n_ctx : (int)len;
    if ((st = rk_session_create(m, &sp, &s, &e))) goto fail;
    for (int mi = n_modes - 1; mi >= 0; mi--)
        if ((rc = cli_setup_fill(&o, m, s, &maps, rk_fill_mode_name(modes[mi])))) goto done;
    const int split = maps ? rk_ridge_maps_split(maps) : o.split;
    const size_t nv = (size_t)hp->n_vocab, n_tok = (size_t)n_win * (size_t)score;
    const int bos = corpus.bos >= 0 ? 1 : 0;
    const size_t n_sids = (size_t)(bos + n_short + score);
    wins = calloc((size_t)n_win, sizeof *wins);
    ids = malloc(((size_t)len + 1) * sizeof *ids);
    sids = malloc((n_sids + 1) * sizeof *sids);
    logits = malloc((size_t)len * nv * sizeof *logits);
    nll_short = malloc(n_tok * sizeof(double));
    gain = malloc(n_tok * sizeof(double));
    tmp = malloc(n_tok * sizeof(double));
    bool ok = wins && ids && sids && logits && nll_short && gain && tmp;
    for (int mi = 0; mi < n_modes; mi++) ok = ok && (nll[mi] = malloc(n_tok * sizeof(double)));
    if (!ok || !set_alloc(&lr, (int)n_win) || !set_alloc(&tp, (int)n_win) || !set_alloc(&all, (int)n_win)) {
        st = rk_err_set(&e, RK_E_NOMEM, "eval nll: out of memory (%ld x %zu logits)", len, nv);
        goto fail;
    }
    uint64_t rng = o.sp.seed * 0x2545f4914f6cdd1dull + 29;
    if (!ev_corpus_pick(&corpus, ev_window_doc_tokens(&corpus, (size_t)len + 1), (int)n_win, &rng, wins)) {
        fprintf(stderr, "ridgekv %s: no corpus file holds a window of %ld tokens\n", cmd, len + 1);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    ev_progress prog;
    ev_progress_init(&prog);
    const int64_t row0 = len - score;
    for (int w = 0; w < n_win; w++) {
        /* ids[0..len]: len evaluated tokens plus the target of the last row */
        ev_window_ids(&corpus, wins[w], (size_t)len + 1, ids);
        double *out = NULL;
        for (int mi = 0; mi < n_modes; mi++) {
            if ((rc = cli_setup_fill(&o, m, s, &maps, rk_fill_mode_name(modes[mi])))) goto done;
            rk_session_reset(s);
            double t0 = rk_time_now();
            if ((st = rk_session_eval(s, ids, (size_t)len, logits, true, &e))) goto fail;
            prefill_s[mi] += rk_time_now() - t0;
            out = nll[mi] + (size_t)w * (size_t)score;
            if (!ev_nll_rows(logits, hp->n_vocab, ids, row0, score, out)) {
                st = rk_err_set(&e, RK_E_INTERNAL, "eval nll: a scored row came back filled (mode %s)",
                                rk_fill_mode_name(modes[mi]));
                goto fail;
            }
        }
        /* the exact model with only a short prefix before the scored region */
        if ((rc = cli_setup_fill(&o, m, s, &maps, "off"))) goto done;
        if (bos) sids[0] = ids[0];
        memcpy(sids + bos, ids + row0 - n_short, ((size_t)(n_short + score) + 1) * sizeof *sids);
        rk_session_reset(s);
        if ((st = rk_session_eval(s, sids, n_sids, logits, true, &e))) goto fail;
        out = nll_short + (size_t)w * (size_t)score;
        if (!ev_nll_rows(logits, hp->n_vocab, sids, bos + n_short, score, out)) {
            st = rk_err_set(&e, RK_E_INTERNAL, "eval nll: NaN logits in the short-context eval");
            goto fail;
        }
        char detail[160];
        int dl = snprintf(detail, sizeof detail, "%s+%zu:", strrchr(corpus.docs[wins[w].doc].path, '/')
                                                              ? strrchr(corpus.docs[wins[w].doc].path, '/') + 1
                                                              : corpus.docs[wins[w].doc].path, wins[w].off);
        for (int mi = 1; mi < n_modes && dl > 0 && (size_t)dl < sizeof detail; mi++) {
            double d = 0;
            for (int j = 0; j < score; j++) d += nll[mi][(size_t)w * score + j] - nll[0][(size_t)w * score + j];
            dl += snprintf(detail + dl, sizeof detail - (size_t)dl, " d%s %+.4f", rk_fill_mode_name(modes[mi]),
                           d / (double)score);
        }
        ev_progress_line(&prog, "eval nll: window", w + 1, n_win, detail);
    }
    for (size_t k = 0; k < n_tok; k++) gain[k] = nll_short[k] - nll[0][k];
    memcpy(tmp, gain, n_tok * sizeof *tmp);
    const double top_thr = ev_quantile(tmp, n_tok, 1.0 - top);
    set_fill(&all, nll, gain, n_modes, (int)n_win, (int)score, -INFINITY, false);
    set_fill(&lr, nll, gain, n_modes, (int)n_win, (int)score, thr, true);
    set_fill(&tp, nll, gain, n_modes, (int)n_win, (int)score, top_thr, false);
    const double n_lr = total(lr.den, (int)n_win), n_tp = total(tp.den, (int)n_win);
    double mean_gain = 0;
    for (size_t k = 0; k < n_tok; k++) mean_gain += gain[k];
    mean_gain /= (double)n_tok;
    const uint64_t bseed = o.sp.seed * 7919 + 3;
    nll_sets *sets[3] = {&all, &lr, &tp};
    ev_ci ci[3][MAX_MODES];
    double mean[3][MAX_MODES];
    for (int si = 0; si < 3; si++)
        for (int mi = 0; mi < n_modes; mi++) {
            double dn = total(sets[si]->den, (int)n_win);
            mean[si][mi] = dn > 0 ? total(sets[si]->sum[mi], (int)n_win) / dn : NAN;
            ci[si][mi] = ev_bootstrap_ratio(sets[si]->num[mi], sets[si]->den, (int)n_win, (int)boot, bseed, 0.95);
        }
    const char *set_names[3] = {"last", "long_range", "top"};
    if (o.json) {
        json_object *j = json_object_new_object();
        ev_json_str(j, "command", "nll");
        ev_json_str(j, "model", rk_model_name(m));
        ev_json_str(j, "maps", o.ridgefill);
        ev_json_int(j, "split", split);
        ev_json_int(j, "tail", o.tail);
        ev_json_int(j, "len", len);
        ev_json_int(j, "windows", n_win);
        ev_json_int(j, "score", score);
        ev_json_int(j, "short", n_short);
        ev_json_int(j, "seed", (int64_t)o.sp.seed);
        ev_json_int(j, "boot", boot);
        ev_json_num(j, "gain_threshold", thr);
        ev_json_num(j, "top_share", top);
        ev_json_num(j, "top_gain_threshold", top_thr);
        ev_json_num(j, "mean_gain", mean_gain);
        ev_json_int(j, "n_tokens", (int64_t)n_tok);
        ev_json_int(j, "n_long_range", (int64_t)n_lr);
        ev_json_int(j, "n_top", (int64_t)n_tp);
        json_object *wa = json_object_new_array();
        for (int w = 0; w < n_win; w++) {
            json_object *wj = json_object_new_object();
            ev_json_str(wj, "file", corpus.docs[wins[w].doc].path);
            ev_json_int(wj, "offset", (int64_t)wins[w].off);
            json_object_array_add(wa, wj);
        }
        json_object_object_add(j, "window_list", wa);
        json_object *ma = json_object_new_array();
        for (int mi = 0; mi < n_modes; mi++) {
            json_object *mj = json_object_new_object();
            ev_json_str(mj, "mode", rk_fill_mode_name(modes[mi]));
            ev_json_num(mj, "prefill_s_mean", prefill_s[mi] / (double)n_win);
            for (int si = 0; si < 3; si++) {
                json_object *sj = json_object_new_object();
                ev_json_num(sj, "nll", mean[si][mi]);
                ev_json_ci(sj, "delta", ci[si][mi]);
                json_object_object_add(mj, set_names[si], sj);
            }
            json_object_array_add(ma, mj);
        }
        json_object_object_add(j, "modes", ma);
        ev_json_num(j, "seconds", rk_time_now() - prog.t0);
        ev_json_print(j, false);
    } else {
        printf("eval nll: %s, %ld windows of %ld tokens, last %ld scored, tail %d, split %d, seed %llu%s%s\n",
               rk_model_name(m), n_win, len, score, o.tail, split, (unsigned long long)o.sp.seed,
               o.ridgefill ? ", maps " : "", o.ridgefill ? o.ridgefill : "");
        printf("files: %s\n", f_files);
        printf("long-range tokens (exact model, gain = NLL with a %ld-token prefix - NLL with the full window; "
               "mean gain %.4f):\n  gain > %g: %.0f of %zu tokens (%.1f%%);  top %.0f%%: gain >= %.4f (%.0f tokens)\n",
               n_short, mean_gain, thr, n_lr, n_tok, 100.0 * n_lr / (double)n_tok, 100 * top, top_thr, n_tp);
        const char *heads[3] = {"last", "gain>thr", "top"};
        printf("%-9s", "mode");
        for (int si = 0; si < 3; si++) printf(" %9s-NLL %-28s", heads[si], " Δ vs off [95% CI]");
        printf(" %10s\n", "prefill s");
        for (int mi = 0; mi < n_modes; mi++) {
            printf("%-9s", rk_fill_mode_name(modes[mi]));
            for (int si = 0; si < 3; si++) {
                char cis[64] = "-";
                if (mi > 0)
                    snprintf(cis, sizeof cis, "%+.4f [%+.4f, %+.4f]", ci[si][mi].est, ci[si][mi].lo, ci[si][mi].hi);
                printf(" %13.4f %-28s", mean[si][mi], cis);
            }
            printf(" %10.3f\n", prefill_s[mi] / (double)n_win);
        }
    }
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    set_free(&lr);
    set_free(&tp);
    set_free(&all);
    for (int mi = 0; mi < MAX_MODES; mi++) free(nll[mi]);
    free(nll_short);
    free(gain);
    free(tmp);
    free(wins);
    free(ids);
    free(sids);
    free(logits);
    ev_corpus_deinit(&corpus);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
