/* The splice driver: exact keys or values spliced over the bulk rows of one layer group
 * at a time, the loss of each spliced run, and the K/V error of the filled run per late
 * layer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_eval.h"

void ev_splice_result_free(ev_splice_result *r) {
    for (int i = 0; i < r->n_var; i++) free(r->var[i].delta);
    free(r->d_fill);
    free(r->kerr);
    free(r->verr);
    memset(r, 0, sizeof *r);
}

/* Errors pool over windows: sums, so the shares are token-weighted. */
static void kv_add(rk_kv_error *acc, const rk_kv_error *e) {
    acc->total += e->total;
    acc->norm_part += e->norm_part;
    acc->dir_part += e->dir_part;
    acc->ref_energy += e->ref_energy;
}

static double mean_delta(const double *a, const double *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] - b[i];
    return d / (double)n;
}

rk_status ev_splice_run(const rk_model *m, rk_session *ex, rk_session *fs, const ev_corpus *c,
                        const ev_splice_params *p, ev_splice_result *out, rk_err *err) {
    const rk_hparams *hp = rk_model_hparams(m);
    const int64_t len = p->len, score = p->score;
    const int n_win = p->n_win;
    const int split = p->fill.maps ? rk_ridge_maps_split(p->fill.maps) : p->fill.split;
    ev_splice_result *r = calloc(1, sizeof *r);
    int32_t *ids = NULL;
    float *logits = NULL;
    double *nll_off = NULL, *nll = NULL;
    rk_status st = RK_OK;
    if (!r) return rk_err_set(err, RK_E_NOMEM, "eval splice: out of memory");
    r->n_win = n_win;
    r->split = split;
    r->n_late = hp->n_layer - split;
    r->bulk_end = len - (p->fill.tail > 0 ? p->fill.tail : 2048);
    rk_fill_params off = p->fill;
    off.mode = RK_FILL_OFF;
    if ((st = rk_session_set_fill(fs, &p->fill, err)) || (st = rk_session_set_fill(ex, &off, err))) goto fail;
    if (r->n_late < 1) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "eval splice: split %d leaves no late layer of %d", split, hp->n_layer);
        goto fail;
    }
    const int n_groups = p->n_groups > r->n_late ? r->n_late : p->n_groups > 64 ? 64 : p->n_groups;
    for (int g = 0; g < n_groups; g++)
        for (int kv = 0; kv < 2; kv++)
            r->var[r->n_var++] = (ev_splice_variant){split + (int)(g * r->n_late / n_groups),
                                                     split + (int)((g + 1) * r->n_late / n_groups),
                                                     kv == 0,
                                                     kv == 1,
                                                     false,
                                                     NULL};
    for (int kv = 0; kv < 3; kv++)
        r->var[r->n_var++] = (ev_splice_variant){split, hp->n_layer, kv != 1, kv != 0, true, NULL};
    const size_t nv = (size_t)hp->n_vocab;
    const int64_t row0 = len - score;
    ev_window *wins = calloc((size_t)n_win, sizeof *wins);
    ids = malloc(((size_t)len + 1) * sizeof *ids);
    logits = malloc((size_t)len * nv * sizeof *logits);
    nll_off = malloc((size_t)score * sizeof(double));
    nll = malloc((size_t)score * sizeof(double));
    r->d_fill = calloc((size_t)n_win, sizeof(double));
    r->kerr = calloc((size_t)r->n_late, sizeof *r->kerr);
    r->verr = calloc((size_t)r->n_late, sizeof *r->verr);
    bool ok = wins && ids && logits && nll_off && nll && r->d_fill && r->kerr && r->verr;
    for (int i = 0; i < r->n_var; i++) ok = ok && (r->var[i].delta = calloc((size_t)n_win, sizeof(double)));
    if (!ok) {
        free(wins);
        st = rk_err_set(err, RK_E_NOMEM, "eval splice: out of memory (%lld x %zu logits)", (long long)len, nv);
        goto fail;
    }
    uint64_t rng = p->seed * 0x2545f4914f6cdd1dull + 29; /* the same windows as eval nll */
    if (!ev_corpus_pick(c, ev_window_doc_tokens(c, (size_t)len + 1), n_win, &rng, wins)) {
        free(wins);
        st = rk_err_set(err, RK_E_INVALID_ARG, "eval splice: no corpus file holds a window of %lld tokens",
                        (long long)len + 1);
        goto fail;
    }
    for (int w = 0; w < n_win && !st; w++) {
        ev_window_ids(c, wins[w], (size_t)len + 1, ids);
        rk_session_reset(ex);
        if ((st = rk_session_eval(ex, ids, (size_t)len, logits, true, err))) break;
        if (!ev_nll_rows(logits, hp->n_vocab, ids, row0, score, nll_off)) {
            st = rk_err_set(err, RK_E_INTERNAL, "eval splice: NaN logits in the exact run");
            break;
        }
        /* -1: the plain filled run; then each splice variant on a fresh filled run */
        for (int vi = -1; vi < r->n_var && !st; vi++) {
            rk_session_reset(fs);
            const ev_splice_variant *v = vi >= 0 ? &r->var[vi] : NULL;
            if (v && (st = rk_session_set_splice(fs, ex, v->lo, v->hi, v->k, v->v, err))) break;
            st = rk_session_eval(fs, ids, (size_t)len, logits, true, err);
            rk_session_clear_splice(fs);
            if (st) break;
            if (!ev_nll_rows(logits, hp->n_vocab, ids, row0, score, nll)) {
                st = rk_err_set(err, RK_E_INTERNAL, "eval splice: a scored row came back filled");
                break;
            }
            const double d = mean_delta(nll, nll_off, score);
            if (v) {
                r->var[vi].delta[w] = d;
                continue;
            }
            r->d_fill[w] = d;
            for (int l = split; l < hp->n_layer && !st; l++) {
                rk_kv_error ke, ve;
                if ((st = rk_session_kv_compare(fs, ex, l, 0, r->bulk_end, false, &ke, err)) ||
                    (st = rk_session_kv_compare(fs, ex, l, 0, r->bulk_end, true, &ve, err)))
                    break;
                kv_add(&r->kerr[l - split], &ke);
                kv_add(&r->verr[l - split], &ve);
            }
        }
        if (!st && p->progress) {
            char detail[96];
            snprintf(detail, sizeof detail, "dNLL %s %+.4f, all K+V spliced %+.4f", rk_fill_mode_name(p->fill.mode),
                     r->d_fill[w], r->var[r->n_var - 1].delta[w]);
            p->progress(p->progress_ud, w + 1, n_win, detail);
        }
    }
    free(wins);
    if (st) goto fail;
    *out = *r;
    free(r);
    r = NULL;
fail:
    if (r) ev_splice_result_free(r);
    free(r);
    free(ids);
    free(logits);
    free(nll_off);
    free(nll);
    return st;
}
