/* `ridgekv eval splice`: which filled caches carry the loss gap. Exact keys or values
 * are spliced over the bulk rows of one layer group at a time and the recovered share
 * of ΔNLL is reported, with the per-layer norm/direction split of the K and V error
 * (SPEC §2, line 3). The run is the eval library's (ev_splice_run); this file parses
 * flags, computes the CIs and prints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_gen.h"
#include "eval_cli.h"
#include "rk_experimental.h"

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

typedef struct splice_out {
    ev_ci ci_fill;
    ev_ci rec[2 * 64 + 3];
    double dmean[2 * 64 + 3];
} splice_out;

static const char *kind(const ev_splice_variant *v) { return v->k && v->v ? "kv" : v->k ? "k" : "v"; }

static void print_json(const ev_splice_params *p, const ev_splice_result *r, const splice_out *so, const rk_model *m,
                       const cli_opts *o, double seconds) {
    json_object *j = json_object_new_object();
    ev_json_str(j, "command", "splice");
    ev_json_str(j, "model", rk_model_name(m));
    ev_json_str(j, "maps", o->ridgefill);
    ev_json_str(j, "kv", o->kv ? o->kv : "f16");
    ev_json_str(j, "mode", rk_fill_mode_name(p->fill.mode));
    ev_json_int(j, "split", r->split);
    ev_json_int(j, "n_layer", rk_model_hparams(m)->n_layer);
    ev_json_int(j, "tail", o->tail);
    ev_json_int(j, "len", p->len);
    ev_json_int(j, "bulk_rows", r->bulk_end);
    ev_json_int(j, "windows", p->n_win);
    ev_json_int(j, "score", p->score);
    ev_json_int(j, "seed", (int64_t)p->seed);
    ev_json_ci(j, "delta_fill", so->ci_fill);
    json_object *va = json_object_new_array();
    for (int vi = 0; vi < r->n_var; vi++) {
        const ev_splice_variant *v = &r->var[vi];
        json_object *vj = json_object_new_object();
        if (v->all) ev_json_str(vj, "group", "all");
        else ev_json_int(vj, "group", vi / 2 + 1);
        ev_json_int(vj, "lo", v->lo);
        ev_json_int(vj, "hi", v->hi);
        ev_json_str(vj, "splice", kind(v));
        ev_json_num(vj, "delta", so->dmean[vi]);
        ev_json_ci(vj, "recovered", so->rec[vi]);
        json_object_array_add(va, vj);
    }
    json_object_object_add(j, "splices", va);
    json_object *la = json_object_new_array();
    for (int l = 0; l < r->n_late; l++) {
        const rk_kv_error *a = &r->kerr[l], *b = &r->verr[l];
        json_object *lj = json_object_new_object();
        ev_json_int(lj, "layer", r->split + l);
        ev_json_num(lj, "k_rel_err", a->total / a->ref_energy);
        ev_json_num(lj, "k_norm_share", a->norm_part / a->total);
        ev_json_num(lj, "k_dir_share", a->dir_part / a->total);
        ev_json_num(lj, "v_rel_err", b->total / b->ref_energy);
        ev_json_num(lj, "v_norm_share", b->norm_part / b->total);
        ev_json_num(lj, "v_dir_share", b->dir_part / b->total);
        json_object_array_add(la, lj);
    }
    json_object_object_add(j, "layers", la);
    ev_json_num(j, "seconds", seconds);
    ev_json_print(j, false);
}

static void print_table(const ev_splice_params *p, const ev_splice_result *r, const splice_out *so, const rk_model *m,
                        const cli_opts *o) {
    const char *fill = rk_fill_mode_name(p->fill.mode);
    printf("eval splice: %s, fill %s, split %d of %d layers, %d windows of %lld tokens (%lld bulk rows), last "
           "%lld scored, tail %d, seed %llu%s%s\n",
           rk_model_name(m), fill, r->split, rk_model_hparams(m)->n_layer, p->n_win, (long long)p->len,
           (long long)r->bulk_end, (long long)p->score, o->tail, (unsigned long long)p->seed,
           o->ridgefill ? ", maps " : "", o->ridgefill ? o->ridgefill : "");
    printf("ΔNLL_fill (%s - off) = %+.4f [%+.4f, %+.4f]\n\n", fill, so->ci_fill.est, so->ci_fill.lo, so->ci_fill.hi);
    printf("%-6s %-9s %-6s %12s   %-30s\n", "group", "layers", "splice", "ΔNLL", "recovered share [95% CI]");
    for (int vi = 0; vi < r->n_var; vi++) {
        const ev_splice_variant *v = &r->var[vi];
        char lay[32], gname[16];
        snprintf(lay, sizeof lay, "%d-%d", v->lo, v->hi - 1);
        if (v->all) snprintf(gname, sizeof gname, "all");
        else snprintf(gname, sizeof gname, "%d", vi / 2 + 1);
        printf("%-6s %-9s %-6s %+12.4f   %+.3f [%+.3f, %+.3f]\n", gname, lay,
               v->k && v->v ? "K+V"
               : v->k       ? "K"
                            : "V",
               so->dmean[vi], so->rec[vi].est, so->rec[vi].lo, so->rec[vi].hi);
    }
    printf("\nper late layer, bulk rows of the %s run vs exact (rel = Σ||x-x*||²/Σ||x*||²; shares of that error)\n",
           fill);
    printf("%-6s %10s %10s %10s   %10s %10s %10s\n", "layer", "K rel", "K norm", "K dir", "V rel", "V norm", "V dir");
    for (int l = 0; l < r->n_late; l++) {
        const rk_kv_error *a = &r->kerr[l], *b = &r->verr[l];
        char kn[16] = "-", kd[16] = "-", vn[16] = "-", vd[16] = "-"; /* "-": no error to split */
        if (a->total > 0) {
            snprintf(kn, sizeof kn, "%.3f", a->norm_part / a->total);
            snprintf(kd, sizeof kd, "%.3f", a->dir_part / a->total);
        }
        if (b->total > 0) {
            snprintf(vn, sizeof vn, "%.3f", b->norm_part / b->total);
            snprintf(vd, sizeof vd, "%.3f", b->dir_part / b->total);
        }
        printf("%-6d %10.4f %10s %10s   %10.4f %10s %10s\n", r->split + l, a->total / a->ref_energy, kn, kd,
               b->total / b->ref_energy, vn, vd);
    }
}

/* Bootstrap CIs of ΔNLL_fill and of the share each splice recovers. */
static bool summarize(const ev_splice_result *r, int n_boot, uint64_t seed, splice_out *so) {
    double *num = calloc((size_t)r->n_win, sizeof *num);
    if (!num) return false;
    so->ci_fill = ev_bootstrap_ratio(r->d_fill, NULL, r->n_win, n_boot, seed, 0.95);
    for (int vi = 0; vi < r->n_var; vi++) {
        double sum = 0;
        for (int w = 0; w < r->n_win; w++) {
            num[w] = r->d_fill[w] - r->var[vi].delta[w];
            sum += r->var[vi].delta[w];
        }
        so->dmean[vi] = sum / (double)r->n_win;
        so->rec[vi] = ev_bootstrap_ratio(num, r->d_fill, r->n_win, n_boot, seed, 0.95);
    }
    free(num);
    return true;
}

int cmd_eval_splice(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    const char *cmd = "eval splice", *f_len = "2048", *f_win = "8", *f_score = "512", *f_groups = "4", *f_boot = "1000",
               *files = EV_DEFAULT_FILES, *corpus = NULL;
    ev_flag flags[] = {{"--len", &f_len},   {"--windows", &f_win}, {"--score", &f_score}, {"--groups", &f_groups},
                       {"--boot", &f_boot}, {"--files", &files},   {"--corpus", &corpus}};
    char **av = NULL;
    int ac = 0, n_pos = 0;
    rk_err e = {0};
    if (ev_take_flags(argc, argv, flags, 7, &av, &ac, &e)) return cli_ev_fail(cmd, &e);
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = -1.0f};
    o.sp.seed = 1;
    const char *pos[1];
    int rc = cli_parse(ac, av, 3, &o, pos, 0, &n_pos, cmd);
    free(av);
    if (rc) return rc;
    long len, n_win, score, n_groups, boot;
    if (ev_parse_int(f_len, 16, 1 << 20, &len, "--len", &e) ||
        ev_parse_int(f_win, 1, 100000, &n_win, "--windows", &e) ||
        ev_parse_int(f_score, 1, 1 << 20, &score, "--score", &e) ||
        ev_parse_int(f_groups, 1, 64, &n_groups, "--groups", &e) ||
        ev_parse_int(f_boot, 0, 1000000, &boot, "--boot", &e))
        return cli_ev_fail(cmd, &e);
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
    ev_splice_params p = {
        .len = len, .score = score, .n_win = (int)n_win, .n_groups = (int)n_groups, .seed = o.sp.seed};
    rk_model *m = NULL;
    rk_session *ex = NULL, *fs = NULL;
    rk_ridge_maps *maps = NULL;
    ev_corpus c = {0};
    ev_splice_result r = {0};
    splice_out so;
    const int n_ctx = o.n_ctx > len ? o.n_ctx : (int)len;
    if ((rc = cli_load_model(&o, &m)) || (rc = cli_ev_corpus(&c, m, files, cli_ev_corpus_dir(corpus), cmd)) ||
        (rc = cli_open_session(&o, m, n_ctx, &ex)) || (rc = cli_open_session(&o, m, n_ctx, &fs)) ||
        (rc = cli_fill_params(&o, m, &maps, fill, &p.fill)))
        goto done;
    cli_ev_progress prog;
    cli_ev_progress_init(&prog, "eval splice: window");
    p.progress = cli_ev_progress_fn;
    p.progress_ud = &prog;
    rk_status st = ev_splice_run(m, ex, fs, &c, &p, &r, &e);
    if (st) {
        cli_print_error(&e);
        rc = st == RK_E_INVALID_ARG ? RK_EXIT_USAGE : cli_exit_code(st);
        goto done;
    }
    if (!summarize(&r, (int)boot, o.sp.seed * 7919 + 5, &so)) {
        fprintf(stderr, "ridgekv %s: out of memory\n", cmd);
        rc = RK_EXIT_ERROR;
        goto done;
    }
    if (o.json) print_json(&p, &r, &so, m, &o, rk_time_now() - prog.t0);
    else print_table(&p, &r, &so, m, &o);
    rc = RK_EXIT_OK;
done:
    ev_splice_result_free(&r);
    ev_corpus_deinit(&c);
    rk_session_destroy(fs);
    rk_session_destroy(ex);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
