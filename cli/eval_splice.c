/* `ridgekv eval splice`: which filled caches carry the loss gap. Exact keys or values
 * are spliced over the bulk rows of one layer group at a time and the recovered share
 * of ΔNLL is reported, with the per-layer norm/direction split of the K and V error
 * (SPEC §2, line 3). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eval_common.h"

static const char *help =
    "usage: ridgekv eval splice [-m MODEL] --ridgefill MAPS [--fill speed] [--tail 512] [--len 2048]\n"
    "                          [--windows 8] [--score 512] [--groups 4] [--boot 1000] [--files F1,F2]\n"
    "                          [--seed N] [--json]\n"
    "\n"
    "For each random window of --len tokens (as in `eval nll`): an exact run (kept: its caches are\n"
    "the splice source), a run with the fill mode, then one filled run per layer group and per\n"
    "kind in which the exact keys (or values) of that group's layers replace the filled ones over\n"
    "the bulk rows before any tail row reads them. Each run scores the last --score tokens.\n"
    "  ΔNLL_fill    = NLL(fill) - NLL(off), per token\n"
    "  recovered    = (ΔNLL_fill - ΔNLL_spliced) / ΔNLL_fill   (1: the splice closes the gap)\n"
    "Groups split the late layers [split, n_layer) into --groups equal runs; the rows 'all'\n"
    "splice every late layer (K+V there must recover 1 up to float noise: a check of the hook).\n"
    "Per late layer, over the bulk rows of the filled run: relative error Σ||k-k*||²/Σ||k*||², and\n"
    "its split into norm part Σ(|k|-|k*|)² and direction part Σ2|k||k*|(1-cos); same for values.\n"
    "CIs: percentile bootstrap over windows (ratio of sums), 95%.\n"
    "\n"
    "  --fill MODE    one of speed (default with maps), quality, identity (needs --split without maps)\n"
    "  --groups N     layer groups over the late layers (default 4)\n"
    "  --files, --corpus, --len, --windows, --score, --boot, --tail: as in `eval nll`\n";

#define MAX_GROUPS 64

/* A splice variant: layers [lo, hi), keys and/or values. */
typedef struct variant {
    int lo, hi;
    bool k, v;
    double *delta; /* (n_win) ΔNLL of the spliced run vs off */
} variant;

/* Errors pool over windows: sums, so the shares are token-weighted. */
static void kv_add(rk_kv_error *acc, const rk_kv_error *e) {
    acc->total += e->total;
    acc->norm_part += e->norm_part;
    acc->dir_part += e->dir_part;
    acc->ref_energy += e->ref_energy;
}

static double mean_delta(const double *a, const double *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d += a[i] - b[i];
    return d / n;
}

int cmd_eval_splice(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    const char *f_len = "2048", *f_win = "8", *f_score = "512", *f_groups = "4", *f_boot = "1000",
               *f_files = EV_DEFAULT_FILES, *f_corpus = NULL;
    ev_flag flags[] = {{"--len", &f_len},   {"--windows", &f_win}, {"--score", &f_score}, {"--groups", &f_groups},
                       {"--boot", &f_boot}, {"--files", &f_files}, {"--corpus", &f_corpus}};
    const char *cmd = "eval splice";
    char **av = NULL;
    int ac = 0, n_pos = 0;
    int rc = ev_take_flags(argc, argv, flags, 7, &av, &ac, cmd);
    if (rc) return rc;
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = -1.0f};
    o.sp.seed = 1;
    const char *pos[1];
    rc = cli_parse(ac, av, 3, &o, pos, 0, &n_pos, cmd);
    free(av);
    if (rc) return rc;
    long len, n_win, score, n_groups, boot;
    if (!ev_parse_int(f_len, 16, 1 << 20, &len, cmd, "--len") ||
        !ev_parse_int(f_win, 1, 100000, &n_win, cmd, "--windows") ||
        !ev_parse_int(f_score, 1, 1 << 20, &score, cmd, "--score") ||
        !ev_parse_int(f_groups, 1, MAX_GROUPS, &n_groups, cmd, "--groups") ||
        !ev_parse_int(f_boot, 0, 1000000, &boot, cmd, "--boot"))
        return RK_EXIT_USAGE;
    if (!o.tail) o.tail = 512;
    if (score > o.tail || len - o.tail < 1) {
        fprintf(stderr, "ridgekv %s: need --score (%ld) <= --tail (%d) < --len (%ld)\n", cmd, score, o.tail, len);
        return RK_EXIT_USAGE;
    }
    const char *fill = o.fill ? o.fill : o.ridgefill ? "speed" : o.split ? "identity" : NULL;
    rk_fill_mode mode;
    if (!fill || !rk_fill_mode_parse(fill, &mode) || mode == RK_FILL_OFF) {
        fprintf(stderr, "ridgekv %s: --fill expects one mode other than off (speed, quality, identity, plumb)%s\n", cmd,
                fill ? "" : "; give --ridgefill MAPS (or --split S for identity)");
        return RK_EXIT_USAGE;
    }
    if (!f_corpus) f_corpus = getenv("RIDGEKV_CORPUS");
    if (!f_corpus || !*f_corpus) f_corpus = "../shared/corpus";

    rk_model *m = NULL;
    rk_session *ex = NULL, *fs = NULL;
    rk_ridge_maps *maps = NULL;
    ev_corpus corpus = {0};
    ev_window *wins = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    double *nll_off = NULL, *nll = NULL, *d_fill = NULL, *num = NULL;
    variant var[2 * MAX_GROUPS + 3] = {{0}};
    int n_var = 0;
    rk_kv_error *kerr = NULL, *verr = NULL;
    rk_err e = {0};
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) return rc;
    const rk_hparams *hp = rk_model_hparams(m);
    if ((rc = ev_corpus_load(&corpus, m, f_files, f_corpus, cmd))) goto done;
    rk_session_params sp;
    cli_session_params(&o, &sp);
    sp.n_ctx = o.n_ctx > len ? o.n_ctx : (int)len;
    if ((st = rk_session_create(m, &sp, &ex, &e)) || (st = rk_session_create(m, &sp, &fs, &e))) goto fail;
    if ((rc = cli_setup_fill(&o, m, fs, &maps, fill)) || (rc = cli_setup_fill(&o, m, ex, &maps, "off"))) goto done;
    const int split = maps ? rk_ridge_maps_split(maps) : o.split;
    const int n_late = hp->n_layer - split;
    if (n_groups > n_late) n_groups = n_late;
    for (int g = 0; g < n_groups; g++)
        for (int kv = 0; kv < 2; kv++)
            var[n_var++] = (variant){split + (int)(g * n_late / n_groups), split + (int)((g + 1) * n_late / n_groups),
                                     kv == 0, kv == 1, NULL};
    for (int kv = 0; kv < 3; kv++) var[n_var++] = (variant){split, hp->n_layer, kv != 1, kv != 0, NULL};
    const size_t nv = (size_t)hp->n_vocab;
    const int64_t row0 = len - score, bulk_end = len - o.tail;
    wins = calloc((size_t)n_win, sizeof *wins);
    ids = malloc(((size_t)len + 1) * sizeof *ids);
    logits = malloc((size_t)len * nv * sizeof *logits);
    nll_off = malloc((size_t)score * sizeof(double));
    nll = malloc((size_t)score * sizeof(double));
    d_fill = calloc((size_t)n_win, sizeof(double));
    num = calloc((size_t)n_win, sizeof(double));
    kerr = calloc((size_t)n_late, sizeof *kerr);
    verr = calloc((size_t)n_late, sizeof *verr);
    bool ok = wins && ids && logits && nll_off && nll && d_fill && num && kerr && verr;
    for (int i = 0; i < n_var; i++) ok = ok && (var[i].delta = calloc((size_t)n_win, sizeof(double)));
    if (!ok) {
        st = rk_err_set(&e, RK_E_NOMEM, "eval splice: out of memory (%ld x %zu logits)", len, nv);
        goto fail;
    }
    uint64_t rng = o.sp.seed * 0x2545f4914f6cdd1dull + 29; /* the same windows as eval nll */
    if (!ev_corpus_pick(&corpus, ev_window_doc_tokens(&corpus, (size_t)len + 1), (int)n_win, &rng, wins)) {
        fprintf(stderr, "ridgekv %s: no corpus file holds a window of %ld tokens\n", cmd, len + 1);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    ev_progress prog;
    ev_progress_init(&prog);
    for (int w = 0; w < n_win; w++) {
        ev_window_ids(&corpus, wins[w], (size_t)len + 1, ids);
        rk_session_reset(ex);
        if ((st = rk_session_eval(ex, ids, (size_t)len, logits, true, &e))) goto fail;
        if (!ev_nll_rows(logits, hp->n_vocab, ids, row0, score, nll_off)) {
            st = rk_err_set(&e, RK_E_INTERNAL, "eval splice: NaN logits in the exact run");
            goto fail;
        }
        /* -1: the plain filled run; then each splice variant on a fresh filled run */
        for (int vi = -1; vi < n_var; vi++) {
            rk_session_reset(fs);
            if (vi >= 0 && (st = rk_session_set_splice(fs, ex, var[vi].lo, var[vi].hi, var[vi].k, var[vi].v, &e)))
                goto fail;
            st = rk_session_eval(fs, ids, (size_t)len, logits, true, &e);
            rk_session_clear_splice(fs);
            if (st) goto fail;
            if (!ev_nll_rows(logits, hp->n_vocab, ids, row0, score, nll)) {
                st = rk_err_set(&e, RK_E_INTERNAL, "eval splice: a scored row came back filled");
                goto fail;
            }
            double d = mean_delta(nll, nll_off, (int)score);
            if (vi >= 0) {
                var[vi].delta[w] = d;
                continue;
            }
            d_fill[w] = d;
            for (int l = split; l < hp->n_layer; l++) {
                rk_kv_error ke, ve;
                if ((st = rk_session_kv_compare(fs, ex, l, 0, bulk_end, false, &ke, &e)) ||
                    (st = rk_session_kv_compare(fs, ex, l, 0, bulk_end, true, &ve, &e)))
                    goto fail;
                kv_add(&kerr[l - split], &ke);
                kv_add(&verr[l - split], &ve);
            }
        }
        char detail[96];
        snprintf(detail, sizeof detail, "dNLL %s %+.4f, all K+V spliced %+.4f", fill, d_fill[w],
                 var[n_var - 1].delta[w]);
        ev_progress_line(&prog, "eval splice: window", w + 1, n_win, detail);
    }
    const uint64_t bseed = o.sp.seed * 7919 + 5;
    ev_ci ci_fill = ev_bootstrap_ratio(d_fill, NULL, (int)n_win, (int)boot, bseed, 0.95);
    ev_ci rec[2 * MAX_GROUPS + 3];
    double dmean[2 * MAX_GROUPS + 3];
    for (int vi = 0; vi < n_var; vi++) {
        double sum = 0;
        for (int w = 0; w < n_win; w++) {
            num[w] = d_fill[w] - var[vi].delta[w];
            sum += var[vi].delta[w];
        }
        dmean[vi] = sum / (double)n_win;
        rec[vi] = ev_bootstrap_ratio(num, d_fill, (int)n_win, (int)boot, bseed, 0.95);
    }
    if (o.json) {
        json_object *j = json_object_new_object();
        ev_json_str(j, "command", "splice");
        ev_json_str(j, "model", rk_model_name(m));
        ev_json_str(j, "maps", o.ridgefill);
        ev_json_str(j, "mode", fill);
        ev_json_int(j, "split", split);
        ev_json_int(j, "n_layer", hp->n_layer);
        ev_json_int(j, "tail", o.tail);
        ev_json_int(j, "len", len);
        ev_json_int(j, "bulk_rows", bulk_end);
        ev_json_int(j, "windows", n_win);
        ev_json_int(j, "score", score);
        ev_json_int(j, "seed", (int64_t)o.sp.seed);
        ev_json_ci(j, "delta_fill", ci_fill);
        json_object *va = json_object_new_array();
        for (int vi = 0; vi < n_var; vi++) {
            json_object *vj = json_object_new_object();
            if (vi >= n_var - 3) ev_json_str(vj, "group", "all");
            else ev_json_int(vj, "group", vi / 2 + 1);
            ev_json_int(vj, "lo", var[vi].lo);
            ev_json_int(vj, "hi", var[vi].hi);
            ev_json_str(vj, "splice", var[vi].k && var[vi].v ? "kv" : var[vi].k ? "k" : "v");
            ev_json_num(vj, "delta", dmean[vi]);
            ev_json_ci(vj, "recovered", rec[vi]);
            json_object_array_add(va, vj);
        }
        json_object_object_add(j, "splices", va);
        json_object *la = json_object_new_array();
        for (int l = split; l < hp->n_layer; l++) {
            const rk_kv_error *a = &kerr[l - split], *b = &verr[l - split];
            json_object *lj = json_object_new_object();
            ev_json_int(lj, "layer", l);
            ev_json_num(lj, "k_rel_err", a->total / a->ref_energy);
            ev_json_num(lj, "k_norm_share", a->norm_part / a->total);
            ev_json_num(lj, "k_dir_share", a->dir_part / a->total);
            ev_json_num(lj, "v_rel_err", b->total / b->ref_energy);
            ev_json_num(lj, "v_norm_share", b->norm_part / b->total);
            ev_json_num(lj, "v_dir_share", b->dir_part / b->total);
            json_object_array_add(la, lj);
        }
        json_object_object_add(j, "layers", la);
        ev_json_num(j, "seconds", rk_time_now() - prog.t0);
        ev_json_print(j, false);
    } else {
        printf("eval splice: %s, fill %s, split %d of %d layers, %ld windows of %ld tokens (%lld bulk rows), last "
               "%ld scored, tail %d, seed %llu%s%s\n",
               rk_model_name(m), fill, split, hp->n_layer, n_win, len, (long long)bulk_end, score, o.tail,
               (unsigned long long)o.sp.seed, o.ridgefill ? ", maps " : "", o.ridgefill ? o.ridgefill : "");
        printf("ΔNLL_fill (%s - off) = %+.4f [%+.4f, %+.4f]\n\n", fill, ci_fill.est, ci_fill.lo, ci_fill.hi);
        printf("%-6s %-9s %-6s %12s   %-30s\n", "group", "layers", "splice", "ΔNLL", "recovered share [95% CI]");
        for (int vi = 0; vi < n_var; vi++) {
            char lay[32], gname[16];
            snprintf(lay, sizeof lay, "%d-%d", var[vi].lo, var[vi].hi - 1);
            if (vi >= n_var - 3) snprintf(gname, sizeof gname, "all");
            else snprintf(gname, sizeof gname, "%d", vi / 2 + 1);
            printf("%-6s %-9s %-6s %+12.4f   %+.3f [%+.3f, %+.3f]\n", gname, lay,
                   var[vi].k && var[vi].v ? "K+V" : var[vi].k ? "K" : "V", dmean[vi], rec[vi].est, rec[vi].lo,
                   rec[vi].hi);
        }
        printf("\nper late layer, bulk rows of the %s run vs exact (rel = Σ||x-x*||²/Σ||x*||²; shares of that error)\n",
               fill);
        printf("%-6s %10s %10s %10s   %10s %10s %10s\n", "layer", "K rel", "K norm", "K dir", "V rel", "V norm",
               "V dir");
        for (int l = split; l < hp->n_layer; l++) {
            const rk_kv_error *a = &kerr[l - split], *b = &verr[l - split];
            char kn[16] = "-", kd[16] = "-", vn[16] = "-", vd[16] = "-"; /* "-": no error to split */
            if (a->total > 0) {
                snprintf(kn, sizeof kn, "%.3f", a->norm_part / a->total);
                snprintf(kd, sizeof kd, "%.3f", a->dir_part / a->total);
            }
            if (b->total > 0) {
                snprintf(vn, sizeof vn, "%.3f", b->norm_part / b->total);
                snprintf(vd, sizeof vd, "%.3f", b->dir_part / b->total);
            }
            printf("%-6d %10.4f %10s %10s   %10.4f %10s %10s\n", l, a->total / a->ref_energy, kn, kd,
                   b->total / b->ref_energy, vn, vd);
        }
    }
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    for (int i = 0; i < n_var; i++) free(var[i].delta);
    free(kerr);
    free(verr);
    free(d_fill);
    free(num);
    free(nll_off);
    free(nll);
    free(wins);
    free(ids);
    free(logits);
    ev_corpus_deinit(&corpus);
    rk_session_destroy(fs);
    rk_session_destroy(ex);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
