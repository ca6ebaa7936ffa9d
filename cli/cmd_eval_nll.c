/* `ridgekv eval nll`: ΔNLL on the last tokens of long windows and loss on long-range
 * tokens (LongPPL's definition), every fill mode against off on the same windows
 * (SPEC §2, line 2). The run and the statistics are the eval library's; this file parses
 * flags and prints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_gen.h"
#include "eval_cli.h"
#include "long_cli.h"

static const char *help =
    "usage: ridgekv eval nll [-m MODEL] [--ridgefill MAPS] [--fill off,speed,quality|off,default] [--tail 512]\n"
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
    "Variants: a --fill item may carry its own settings, MODE:share=X:band=N:tail=T:group=G (keep\n"
    "share, recency band, exact tail, grouped attention to runs of G filled rows; any subset),\n"
    "e.g. --fill off,quality,quality:share=0.2:band=256,quality:group=16;\n"
    "MODE:sparse=1 runs that mode with sparse attention as --sparse SPEC sets it (default: on at\n"
    "the library's defaults), e.g. --sparse on:min=2048 --fill off,off:sparse=1 (the other modes\n"
    "stay exact);\n"
    "each is named by the item in the table and the JSON, and all run on the same windows\n"
    "against the one off run.\n"
    "--fill off,default measures ask's defaults against exact, as bench's does: default is what\n"
    "ask runs with no flag at --len tokens (KV policy and budget from the length and the free\n"
    "memory, on a session of its own; the fill of the model's cached maps; sparse attention), off\n"
    "stays exact (no fill, f16 KV, no budget, dense attention). --kv / --kv-budget given apply to\n"
    "default (and the other modes), never to off; --sparse SPEC sets default's sparse attention\n"
    "(off: dense); the RoPE scaling --len needs is applied for both (stderr lines say so and what\n"
    "default runs). The JSON names each mode's KV policy.\n"
    "\n"
    "Default files " EV_DEFAULT_FILES " (looked up in --corpus DIR,\n"
    "default $RIDGEKV_CORPUS or ../shared/corpus): held out from the calibration texts\n"
    "(calibrate on the Austen files). --tail defaults to 512 here.\n";

typedef struct nll_opts {
    ev_nll_params p;
    double thr, top;
    long boot;
    const char *files, *corpus;
} nll_opts;

static const char *const set_names[EV_SET_COUNT] = {"last", "long_range", "top"};

static void print_json(const nll_opts *n, const ev_nll_result *r, const ev_nll_summary *sm, const ev_corpus *c,
                       const rk_model *m, const cli_opts *o, int split, double seconds) {
    const ev_nll_params *p = &n->p;
    json_object *j = json_object_new_object();
    ev_json_str(j, "command", "nll");
    ev_json_str(j, "model", rk_model_name(m));
    ev_json_str(j, "maps", o->ridgefill);
    ev_json_str(j, "kv", o->kv ? o->kv : "f16");
    ev_json_int(j, "split", split);
    ev_json_int(j, "tail", o->tail);
    ev_json_num(j, "keep_share", o->keep_share); /* < 0: the map's */
    ev_json_int(j, "band", o->band);
    ev_json_int(j, "len", p->len);
    ev_json_int(j, "windows", p->n_win);
    ev_json_int(j, "score", p->score);
    ev_json_int(j, "short", p->n_short);
    ev_json_int(j, "seed", (int64_t)p->seed);
    ev_json_int(j, "boot", n->boot);
    ev_json_num(j, "gain_threshold", n->thr);
    ev_json_num(j, "top_share", n->top);
    ev_json_num(j, "top_gain_threshold", sm->top_thr);
    ev_json_num(j, "mean_gain", sm->mean_gain);
    ev_json_int(j, "n_tokens", (int64_t)sm->n_tok);
    ev_json_int(j, "n_long_range", (int64_t)sm->n_long_range);
    ev_json_int(j, "n_top", (int64_t)sm->n_top);
    json_object *wa = json_object_new_array();
    for (int w = 0; w < r->n_win; w++) {
        json_object *wj = json_object_new_object();
        ev_json_str(wj, "file", c->docs[r->wins[w].doc].path);
        ev_json_int(wj, "offset", (int64_t)r->wins[w].off);
        /* per window and mode: the NLL summed over the scored tokens and over this window's
         * long-range tokens (gain > --gain-threshold), so that runs of a few windows each
         * (other --seed) can be pooled exactly */
        const double *off = r->nll[0] + (size_t)w * (size_t)r->score, *sh = r->nll_short + (size_t)w * (size_t)r->score;
        int64_t n_lr = 0;
        for (int64_t k = 0; k < r->score; k++) n_lr += sh[k] - off[k] > n->thr;
        ev_json_int(wj, "n_long_range", n_lr);
        json_object *sa = json_object_new_object(), *la = json_object_new_object();
        for (int mi = 0; mi < r->n_modes; mi++) {
            const double *x = r->nll[mi] + (size_t)w * (size_t)r->score;
            double all = 0, lr = 0;
            for (int64_t k = 0; k < r->score; k++) {
                all += x[k];
                if (sh[k] - off[k] > n->thr) lr += x[k];
            }
            ev_json_num(sa, ev_modes_label(&p->modes, mi), all);
            ev_json_num(la, ev_modes_label(&p->modes, mi), lr);
        }
        json_object_object_add(wj, "nll_sum", sa);
        json_object_object_add(wj, "long_range_nll_sum", la);
        json_object_array_add(wa, wj);
    }
    json_object_object_add(j, "window_list", wa);
    json_object *ma = json_object_new_array();
    for (int mi = 0; mi < r->n_modes; mi++) {
        json_object *mj = json_object_new_object();
        ev_json_str(mj, "mode", ev_modes_label(&p->modes, mi));
        char kv[256];
        rk_kv_params_format(&p->modes.kv[mi], kv, sizeof kv);
        ev_json_str(mj, "kv", kv);
        ev_json_num(mj, "prefill_s_mean", r->prefill_s[mi] / (double)r->n_win);
        for (int si = 0; si < EV_SET_COUNT; si++) {
            json_object *sj = json_object_new_object();
            ev_json_num(sj, "nll", sm->mean[si][mi]);
            ev_json_ci(sj, "delta", sm->delta[si][mi]);
            json_object_object_add(mj, set_names[si], sj);
        }
        json_object_array_add(ma, mj);
    }
    json_object_object_add(j, "modes", ma);
    ev_json_num(j, "seconds", seconds);
    ev_json_print(j, false);
}

static void print_table(const nll_opts *n, const ev_nll_result *r, const ev_nll_summary *sm, const rk_model *m,
                        const cli_opts *o, int split) {
    const ev_nll_params *p = &n->p;
    printf("eval nll: %s, %d windows of %lld tokens, last %lld scored, tail %d, split %d, seed %llu%s%s\n",
           rk_model_name(m), p->n_win, (long long)p->len, (long long)p->score, o->tail, split,
           (unsigned long long)p->seed, o->ridgefill ? ", maps " : "", o->ridgefill ? o->ridgefill : "");
    printf("files: %s\n", n->files);
    printf("long-range tokens (exact model, gain = NLL with a %lld-token prefix - NLL with the full window; "
           "mean gain %.4f):\n  gain > %g: %zu of %zu tokens (%.1f%%);  top %.0f%%: gain >= %.4f (%zu tokens)\n",
           (long long)p->n_short, sm->mean_gain, n->thr, sm->n_long_range, sm->n_tok,
           100.0 * (double)sm->n_long_range / (double)sm->n_tok, 100 * n->top, sm->top_thr, sm->n_top);
    const char *heads[EV_SET_COUNT] = {"last", "gain>thr", "top"};
    int w = 9;
    for (int mi = 0; mi < r->n_modes; mi++) {
        const int l = (int)strlen(ev_modes_label(&p->modes, mi));
        w = l > w ? l : w;
    }
    printf("%-*s", w, "mode");
    for (int si = 0; si < EV_SET_COUNT; si++) printf(" %9s-NLL %-28s", heads[si], " Δ vs off [95% CI]");
    printf(" %10s\n", "prefill s");
    for (int mi = 0; mi < r->n_modes; mi++) {
        printf("%-*s", w, ev_modes_label(&p->modes, mi));
        for (int si = 0; si < EV_SET_COUNT; si++) {
            char cis[64] = "-";
            const ev_ci *ci = &sm->delta[si][mi];
            if (mi > 0) snprintf(cis, sizeof cis, "%+.4f [%+.4f, %+.4f]", ci->est, ci->lo, ci->hi);
            printf(" %13.4f %-28s", sm->mean[si][mi], cis);
        }
        printf(" %10.3f\n", r->prefill_s[mi] / (double)r->n_win);
    }
}

static int parse(int argc, char **argv, cli_opts *o, nll_opts *n) {
    const char *cmd = "eval nll", *f_len = "2048", *f_win = "8", *f_score = "512", *f_short = "256", *f_thr = "0.5",
               *f_top = "0.1", *f_boot = "1000";
    ev_flag flags[] = {{"--len", &f_len},     {"--windows", &f_win},        {"--score", &f_score},
                       {"--short", &f_short}, {"--gain-threshold", &f_thr}, {"--top", &f_top},
                       {"--boot", &f_boot},   {"--files", &n->files},       {"--corpus", &n->corpus}};
    char **av = NULL;
    int ac = 0, n_pos = 0;
    rk_err e = {0};
    if (ev_take_flags(argc, argv, flags, 9, &av, &ac, &e)) return cli_ev_fail(cmd, &e);
    const char *pos[1];
    int rc = cli_parse(ac, av, 3, o, pos, 0, &n_pos, cmd);
    free(av);
    if (rc) return rc;
    long len, n_win, score, n_short;
    if (ev_parse_int(f_len, 16, 1 << 20, &len, "--len", &e) ||
        ev_parse_int(f_win, 1, 100000, &n_win, "--windows", &e) ||
        ev_parse_int(f_score, 1, 1 << 20, &score, "--score", &e) ||
        ev_parse_int(f_short, 0, 1 << 20, &n_short, "--short", &e) ||
        ev_parse_double(f_thr, -100, 100, &n->thr, "--gain-threshold", &e) ||
        ev_parse_double(f_top, 0.001, 1, &n->top, "--top", &e) ||
        ev_parse_int(f_boot, 0, 1000000, &n->boot, "--boot", &e))
        return cli_ev_fail(cmd, &e);
    n->p.len = len, n->p.n_win = (int)n_win, n->p.score = score, n->p.n_short = n_short, n->p.seed = o->sp.seed;
    if (!o->tail) o->tail = 512;
    if (score > o->tail || len - o->tail < 1 || n_short + score + 1 > len) {
        fprintf(stderr,
                "ridgekv %s: need --score (%ld) <= --tail (%d) < --len (%ld) and --short + --score < --len "
                "(the scored rows must be exact tail rows and there must be bulk rows to fill)\n",
                cmd, score, o->tail, len);
        return RK_EXIT_USAGE;
    }
    if (!o->fill && !o->ridgefill && !o->split) {
        fprintf(stderr,
                "ridgekv %s: nothing to compare: give --ridgefill MAPS (or --split S with --fill off,identity)\n", cmd);
        return RK_EXIT_USAGE;
    }
    return 0;
}

int cmd_eval_nll(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    const char *cmd = "eval nll";
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = -1.0f};
    o.sp.seed = 1;
    nll_opts n = {.files = EV_DEFAULT_FILES};
    int rc = parse(argc, argv, &o, &n);
    if (rc) return rc;
    rk_model *m = NULL;
    rk_session *s = NULL, *ms[EV_MAX_MODES] = {0}, *owned[EV_MAX_MODES] = {0};
    rk_ridge_maps *maps = NULL;
    ev_corpus c = {0};
    ev_nll_result r = {0};
    ev_nll_summary sm;
    rk_err e = {0};
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) return rc;
    if (cli_ev_lists_default(o.fill)) { /* the RoPE scaling --len needs, as ask applies it (one line says so) */
        cli_opts lo = o;
        lo.kv = "f16"; /* RoPE only here; default's KV: cli_ev_sessions */
        if ((rc = cli_long_apply(cmd, &lo, m, n.p.len, n.p.len, NULL))) goto done;
    }
    if (n.p.len > rk_model_n_ctx_max(m))
        fprintf(stderr, "ridgekv %s: warning: --len %lld exceeds the model's context %lld\n", cmd, (long long)n.p.len,
                (long long)rk_model_n_ctx_max(m));
    const int n_ctx = o.n_ctx > n.p.len ? o.n_ctx : (int)n.p.len;
    if ((rc = cli_ev_corpus(&c, m, n.files, cli_ev_corpus_dir(n.corpus), cmd)) ||
        (rc = cli_open_session(&o, m, n_ctx, &s)) || (rc = cli_ev_modes(&o, m, s, &maps, &n.p.modes, cmd)) ||
        (rc = cli_ev_sessions(&o, m, (const int[]){(int)n.p.len}, 1, 0, n_ctx, s, &n.p.modes, ms, owned, cmd)))
        goto done;
    for (int mi = 1; mi < n.p.modes.n; mi++)
        if ((n.p.modes.set[mi] & EV_SET_TAIL) && (n.p.modes.tail[mi] < n.p.score || n.p.modes.tail[mi] >= n.p.len)) {
            fprintf(stderr, "ridgekv %s: %s: need --score (%lld) <= tail < --len (%lld)\n", cmd,
                    ev_modes_label(&n.p.modes, mi), (long long)n.p.score, (long long)n.p.len);
            rc = RK_EXIT_USAGE;
            goto done;
        }
    cli_ev_progress prog;
    cli_ev_progress_init(&prog, "eval nll: window");
    n.p.progress = cli_ev_progress_fn;
    n.p.progress_ud = &prog;
    if ((st = ev_nll_run(m, ms, &c, &n.p, &r, &e)) ||
        (st = ev_nll_summarize(&r, n.thr, n.top, (int)n.boot, n.p.seed * 7919 + 3, &sm, &e))) {
        cli_print_error(&e);
        rc = st == RK_E_INVALID_ARG ? RK_EXIT_USAGE : cli_exit_code(st);
        goto done;
    }
    const int split = maps ? rk_ridge_maps_split(maps) : o.split;
    if (o.json) print_json(&n, &r, &sm, &c, m, &o, split, rk_time_now() - prog.t0);
    else print_table(&n, &r, &sm, m, &o, split);
    rc = RK_EXIT_OK;
done:
    ev_nll_result_free(&r);
    ev_corpus_deinit(&c);
    for (int mi = 0; mi < EV_MAX_MODES; mi++) rk_session_destroy(owned[mi]);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
