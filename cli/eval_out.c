/* Helpers of `ridgekv eval needle|nll|splice`: see eval_cli.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval_cli.h"
#include "long_cli.h"

int cli_ev_fail(const char *cmd, const rk_err *e) {
    fprintf(stderr, "ridgekv %s: %s\n", cmd, e->msg[0] ? e->msg : "unknown error");
    return e->code == RK_E_NOMEM ? RK_EXIT_ERROR : RK_EXIT_USAGE;
}

const char *cli_ev_corpus_dir(const char *flag) {
    if (flag && *flag) return flag;
    const char *env = getenv("RIDGEKV_CORPUS");
    return env && *env ? env : "../shared/corpus";
}

int cli_ev_corpus(ev_corpus *c, const rk_model *m, const char *files, const char *dir, const char *cmd) {
    rk_err e = {0};
    rk_status st = ev_corpus_load(c, m, files, dir, &e);
    if (!st) return 0;
    fprintf(stderr, "ridgekv %s: %s\n", cmd, e.msg);
    return st == RK_E_INVALID_ARG ? RK_EXIT_USAGE : st == RK_E_NOMEM ? RK_EXIT_ERROR : RK_EXIT_IO;
}

bool cli_ev_lists_default(const char *fill) {
    for (const char *p = fill; p && *p;) {
        const size_t n = strcspn(p, ",");
        if (n >= 7 && !strncmp(p, "default", 7) && (n == 7 || p[7] == ':')) return true; /* settings: refused later */
        p += n + (p[n] == ',');
    }
    return false;
}

int cli_ev_default(const ev_modes *mo) {
    for (int mi = 0; mi < mo->n; mi++)
        if (mo->set[mi] & EV_SET_DEFAULT) return mi;
    return -1;
}

int cli_ev_modes(cli_opts *o, const rk_model *m, rk_session *s, rk_ridge_maps **maps, ev_modes *out, const char *cmd) {
    const char *fill = o->fill ? o->fill : o->ridgefill ? "off,speed,quality" : o->split ? "off,identity" : NULL;
    if (!fill) {
        fprintf(stderr,
                "ridgekv %s: nothing to compare: give --ridgefill MAPS (or --split S with --fill off,identity)\n", cmd);
        return RK_EXIT_USAGE;
    }
    rk_err e = {0};
    ev_modes mo = {0};
    /* variants (quality:share=0.2, ...) only where each mode's results are keyed by label */
    if (ev_parse_variants(fill, 512, &mo, &e)) return cli_ev_fail(cmd, &e);
    if (ev_modes_have_variants(&mo) && strcmp(cmd, "eval nll")) {
        fprintf(stderr, "ridgekv %s: --fill takes plain modes here (mode:key=value variants are for eval nll)\n", cmd);
        return RK_EXIT_USAGE;
    }
    /* default: ask's fill (the cached maps become --ridgefill's) */
    const int dm = cli_ev_default(&mo);
    const char *df = dm >= 0 ? cli_long_default_fill(o, m, cmd) : NULL;
    int rc = cli_fill_params(o, m, maps, "off", &mo.fill);
    if (rc) return rc;
    /* --sparse: the settings of the :sparse=1 variants (default: the library's); default's
     * sparse attention is ask's (cli_sparse_params: on unless --sparse off or --no-ridgefill) */
    if (dm >= 0 && mo.fill.sparse.on) mo.set[dm] |= EV_SET_SPARSE;
    if (dm >= 0) (void)rk_fill_mode_parse(df, &mo.mode[dm]);
    mo.sparse = mo.fill.sparse.on ? mo.fill.sparse : rk_sparse_params_default();
    mo.fill.sparse = (rk_sparse_params){0};
    /* each mode's grouping: --fill-group or the default of its mode (cli_fill_group), unless
     * its item set one; the header records the group of quality and speed modes */
    mo.fill.group = cli_fill_group(o, RK_FILL_QUALITY);
    for (int mi = 0; mi < mo.n; mi++)
        if (!(mo.set[mi] & EV_SET_GROUP)) mo.set[mi] |= EV_SET_GROUP, mo.group[mi] = cli_fill_group(o, mo.mode[mi]);
    for (int mi = mo.n - 1; mi >= 0; mi--) { /* every mode checked before the long run; ends on off */
        rk_fill_params fp;
        ev_modes_params(&mo, mi, &fp);
        if (rk_session_set_fill(s, &fp, &e)) {
            cli_print_error(&e);
            return RK_EXIT_USAGE;
        }
    }
    *out = mo;
    return 0;
}

/* Same policy: kind, budgets and spec. */
static bool same_kv(const rk_kv_params *a, const rk_kv_params *b) {
    char fa[256], fb[256];
    rk_kv_params_format(a, fa, sizeof fa);
    rk_kv_params_format(b, fb, sizeof fb);
    return a->kind == b->kind && a->budget == b->budget && a->host_budget == b->host_budget && !strcmp(fa, fb);
}

/* The policy as stderr names it: its spec, and its budget when it has one. */
static void kv_name(const rk_kv_params *kv, char *buf, size_t cap) {
    rk_kv_params_format(kv, buf, cap);
    if (kv->budget)
        snprintf(buf + strlen(buf), cap - strlen(buf), " (budget %lluM)", (unsigned long long)(kv->budget >> 20));
}

int cli_ev_sessions(const cli_opts *o, const rk_model *m, const int *lens, int n_lens, int extra_rows, int n_ctx,
                    rk_session *base, ev_modes *mo, rk_session **s, rk_session **owned, const char *cmd) {
    rk_session_params sp;
    int rc = cli_session_params(o, &sp);
    if (rc) return rc;
    sp.n_ctx = n_ctx;
    const rk_kv_params base_kv = sp.kv;
    const int base_batch = sp.n_batch, dm = cli_ev_default(mo);
    int batch[EV_MAX_MODES];
    for (int mi = 0; mi < mo->n; mi++) {
        s[mi] = base, owned[mi] = NULL, mo->kv[mi] = base_kv, batch[mi] = base_batch;
        if (dm < 0 || (mi != 0 && mi != dm)) continue;
        /* off and default: their policy at every length, which must be one */
        for (int li = 0; li < n_lens; li++) {
            const char *name = mi ? "default" : "off", *mode = name;
            rk_kv_params kv = base_kv;
            int nb = base_batch;
            if ((rc = cli_long_mode(o, m, lens[li], (int64_t)lens[li] + extra_rows, &mode, "off", &kv, &nb))) return rc;
            if (li > 0 && (!same_kv(&kv, &mo->kv[mi]) || nb != batch[mi])) {
                char a[256], b[256];
                kv_name(&mo->kv[mi], a, sizeof a);
                kv_name(&kv, b, sizeof b);
                if (same_kv(&kv, &mo->kv[mi])) /* the chunk differs: sparse attention acts at one length only */
                    snprintf(a, sizeof a, "chunk %d", batch[mi]), snprintf(b, sizeof b, "chunk %d", nb);
                fprintf(stderr,
                        "ridgekv %s: --fill %s: the default %s is %s at %d tokens but %s at %d; run these lengths "
                        "apart\n",
                        cmd, name, same_kv(&kv, &mo->kv[mi]) ? "prefill chunk" : "KV policy", a, lens[0], b, lens[li]);
                return RK_EXIT_USAGE;
            }
            mo->kv[mi] = kv, batch[mi] = nb;
        }
        for (int mj = 0; mj < mi && s[mi] == base; mj++) /* a session of this policy already made */
            if (owned[mj] && same_kv(&mo->kv[mj], &mo->kv[mi]) && batch[mj] == batch[mi]) s[mi] = owned[mj];
        if (s[mi] != base || (same_kv(&mo->kv[mi], &base_kv) && batch[mi] == base_batch)) continue;
        sp.kv = mo->kv[mi], sp.n_batch = batch[mi];
        rk_err e = {0};
        rk_status st = rk_session_create(m, &sp, &owned[mi], &e);
        if (st) {
            cli_print_error(&e);
            return cli_exit_code(st);
        }
        s[mi] = owned[mi];
        if ((rc = cli_setup_kv(o, s[mi], NULL))) return rc;
    }
    if (dm >= 0) {
        char kv[256], sparse[64] = "dense attention";
        kv_name(&mo->kv[dm], kv, sizeof kv);
        if (mo->set[dm] & EV_SET_SPARSE)
            snprintf(sparse, sizeof sparse, "sparse attention past %lld keys",
                     (long long)(mo->sparse.min_kv ? mo->sparse.min_kv : 8192));
        fprintf(stderr,
                "ridgekv %s: default runs what ask runs at this length: fill %s, KV %s, %s; off: fill off, KV f16, "
                "dense attention\n",
                cmd, rk_fill_mode_name(mo->mode[dm]), kv, sparse);
    }
    return 0;
}

void cli_ev_progress_init(cli_ev_progress *p, const char *what) {
    p->what = what;
    p->t0 = rk_time_now();
    p->tty = isatty(2);
}

void cli_ev_progress_fn(void *ud, int64_t k, int64_t n, const char *detail) {
    cli_ev_progress *p = ud;
    double el = rk_time_now() - p->t0;
    double eta = k > 0 ? el / (double)k * (double)(n - k) : 0;
    fprintf(stderr, "%s%s %lld/%lld  %s  elapsed %.0f s, ETA %.0f s%s", p->tty ? "\r" : "", p->what, (long long)k,
            (long long)n, detail ? detail : "", el, eta, p->tty ? (k == n ? "   \n" : "   ") : "\n");
}

void ev_json_num(json_object *o, const char *key, double v) {
    json_object_object_add(o, key, isfinite(v) ? json_object_new_double(v) : NULL);
}

void ev_json_ci(json_object *o, const char *key, ev_ci ci) {
    json_object *c = json_object_new_object();
    ev_json_num(c, "est", ci.est);
    ev_json_num(c, "lo", ci.lo);
    ev_json_num(c, "hi", ci.hi);
    json_object_object_add(o, key, c);
}

void ev_json_str(json_object *o, const char *key, const char *v) {
    json_object_object_add(o, key, v ? json_object_new_string(v) : NULL);
}

void ev_json_int(json_object *o, const char *key, int64_t v) {
    json_object_object_add(o, key, json_object_new_int64(v));
}

void ev_json_print(json_object *o, bool pretty) {
    int flags = JSON_C_TO_STRING_NOSLASHESCAPE | (pretty ? JSON_C_TO_STRING_PRETTY : JSON_C_TO_STRING_PLAIN);
    printf("%s\n", json_object_to_json_string_ext(o, flags));
    fflush(stdout);
    json_object_put(o);
}
