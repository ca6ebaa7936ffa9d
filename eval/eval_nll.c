/* The nll driver: teacher-forced loss on the last tokens of long windows for every fill
 * mode (paired), and the exact model's loss with a short prefix for LongPPL's gain. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_eval.h"

void ev_nll_result_free(ev_nll_result *r) {
    for (int i = 0; i < EV_MAX_MODES; i++) free(r->nll[i]);
    free(r->nll_short);
    free(r->wins);
    memset(r, 0, sizeof *r);
}

rk_status ev_nll_run(const rk_model *m, rk_session *const *ss, const ev_corpus *c, const ev_nll_params *p,
                     ev_nll_result *out, rk_err *err) {
    const rk_hparams *hp = rk_model_hparams(m);
    const int64_t len = p->len, score = p->score, n_short = p->n_short;
    const int n_modes = p->modes.n, bos = c->bos >= 0 ? 1 : 0;
    const size_t nv = (size_t)hp->n_vocab, n_tok = (size_t)p->n_win * (size_t)score;
    const size_t n_sids = (size_t)(bos + n_short + score);
    ev_nll_result r = {.n_win = p->n_win, .n_modes = n_modes, .score = score};
    rk_status st = RK_OK;
    int32_t *ids = malloc(((size_t)len + 1) * sizeof *ids), *sids = malloc((n_sids + 1) * sizeof *sids);
    float *logits = malloc((size_t)len * nv * sizeof *logits);
    r.wins = calloc((size_t)p->n_win, sizeof *r.wins);
    r.nll_short = malloc(n_tok * sizeof(double));
    bool ok = ids && sids && logits && r.wins && r.nll_short;
    for (int mi = 0; mi < n_modes; mi++) ok = ok && (r.nll[mi] = malloc(n_tok * sizeof(double)));
    if (!ok) {
        st = rk_err_set(err, RK_E_NOMEM, "eval nll: out of memory (%lld x %zu logits)", (long long)len, nv);
        goto fail;
    }
    uint64_t rng = p->seed * 0x2545f4914f6cdd1dull + 29;
    if (!ev_corpus_pick(c, ev_window_doc_tokens(c, (size_t)len + 1), p->n_win, &rng, r.wins)) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "eval nll: no corpus file holds a window of %lld tokens",
                        (long long)len + 1);
        goto fail;
    }
    const int64_t row0 = len - score;
    for (int w = 0; w < p->n_win; w++) {
        /* ids[0..len]: len evaluated tokens plus the target of the last row */
        ev_window_ids(c, r.wins[w], (size_t)len + 1, ids);
        for (int mi = 0; mi < n_modes; mi++) {
            rk_session *s = ss[mi];
            rk_fill_params fp;
            ev_modes_params(&p->modes, mi, &fp);
            if ((st = rk_session_set_fill(s, &fp, err))) goto fail;
            rk_session_reset(s);
            double t0 = rk_time_now();
            if ((st = rk_session_eval(s, ids, (size_t)len, logits, true, err))) goto fail;
            r.prefill_s[mi] += rk_time_now() - t0;
            if (!ev_nll_rows(logits, hp->n_vocab, ids, row0, score, r.nll[mi] + (size_t)w * (size_t)score)) {
                st = rk_err_set(err, RK_E_INTERNAL, "eval nll: a scored row came back filled (mode %s)",
                                ev_modes_label(&p->modes, mi));
                goto fail;
            }
        }
        /* the exact model with only a short prefix before the scored region */
        rk_session *s = ss[0];
        rk_fill_params off = p->modes.fill;
        off.mode = RK_FILL_OFF;
        if ((st = rk_session_set_fill(s, &off, err))) goto fail;
        if (bos) sids[0] = ids[0];
        memcpy(sids + bos, ids + row0 - n_short, ((size_t)(n_short + score) + 1) * sizeof *sids);
        rk_session_reset(s);
        if ((st = rk_session_eval(s, sids, n_sids, logits, true, err))) goto fail;
        if (!ev_nll_rows(logits, hp->n_vocab, sids, bos + n_short, score, r.nll_short + (size_t)w * (size_t)score)) {
            st = rk_err_set(err, RK_E_INTERNAL, "eval nll: NaN logits in the short-context eval");
            goto fail;
        }
        if (p->progress) {
            const char *path = c->docs[r.wins[w].doc].path, *slash = strrchr(path, '/');
            char detail[640];
            int dl = snprintf(detail, sizeof detail, "%s+%zu:", slash ? slash + 1 : path, r.wins[w].off);
            for (int mi = 1; mi < n_modes && dl > 0 && (size_t)dl < sizeof detail; mi++) {
                double d = 0;
                for (int64_t j = 0; j < score; j++)
                    d += r.nll[mi][(size_t)w * score + j] - r.nll[0][(size_t)w * score + j];
                dl += snprintf(detail + dl, sizeof detail - (size_t)dl, " d%s %+.4f", ev_modes_label(&p->modes, mi),
                               d / (double)score);
            }
            p->progress(p->progress_ud, w + 1, p->n_win, detail);
        }
    }
    *out = r;
    r = (ev_nll_result){0};
fail:
    ev_nll_result_free(&r);
    free(ids);
    free(sids);
    free(logits);
    return st;
}

rk_status ev_nll_summarize(const ev_nll_result *r, double thr, double top, int n_boot, uint64_t seed,
                           ev_nll_summary *out, rk_err *err) {
    const size_t n_tok = (size_t)r->n_win * (size_t)r->score;
    const int n_win = r->n_win, n_modes = r->n_modes;
    ev_nll_summary sm = {.n_tok = n_tok};
    double *gain = malloc((n_tok + 1) * sizeof *gain), *den = calloc((size_t)n_win * EV_SET_COUNT, sizeof *den);
    double *buf = calloc((size_t)n_win * 2 * EV_MAX_MODES * EV_SET_COUNT, sizeof *buf);
    unsigned char *sel = malloc(n_tok + 1);
    rk_status st = RK_OK;
    if (!gain || !den || !buf || !sel) {
        st = rk_err_set(err, RK_E_NOMEM, "eval nll: out of memory");
        goto done;
    }
    double mean_gain = 0;
    for (size_t k = 0; k < n_tok; k++) mean_gain += (gain[k] = r->nll_short[k] - r->nll[0][k]);
    sm.mean_gain = n_tok ? mean_gain / (double)n_tok : NAN;
    sm.top_thr = ev_top_threshold(gain, n_tok, top);
    const double *const *nll = (const double *const *)r->nll;
    for (int si = 0; si < EV_SET_COUNT; si++) {
        size_t k = si == EV_SET_LAST         ? ev_gain_select(gain, n_tok, -INFINITY, false, sel)
                   : si == EV_SET_LONG_RANGE ? ev_gain_select(gain, n_tok, thr, true, sel)
                                             : ev_gain_select(gain, n_tok, sm.top_thr, false, sel);
        if (si == EV_SET_LONG_RANGE) sm.n_long_range = k;
        if (si == EV_SET_TOP) sm.n_top = k;
        double *d = den + (size_t)si * n_win, *sum[EV_MAX_MODES], *num[EV_MAX_MODES];
        for (int mi = 0; mi < EV_MAX_MODES; mi++) {
            sum[mi] = buf + ((size_t)si * 2 * EV_MAX_MODES + (size_t)mi) * (size_t)n_win;
            num[mi] = sum[mi] + (size_t)EV_MAX_MODES * n_win;
        }
        ev_set_sums(sel, nll, n_modes, n_win, r->score, d, sum, num);
        double dn = 0;
        for (int w = 0; w < n_win; w++) dn += d[w];
        for (int mi = 0; mi < n_modes; mi++) {
            double sn = 0;
            for (int w = 0; w < n_win; w++) sn += sum[mi][w];
            sm.mean[si][mi] = dn > 0 ? sn / dn : NAN;
            sm.delta[si][mi] = ev_bootstrap_ratio(num[mi], d, n_win, n_boot, seed, 0.95);
        }
    }
    *out = sm;
done:
    free(gain);
    free(den);
    free(buf);
    free(sel);
    return st;
}
