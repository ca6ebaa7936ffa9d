/* LowRAM predictor files: offline key bases and value predictors per layer group, fitted
 * on calibration text, stored as GGUF with the model fingerprint (like ridge maps).
 *   general.type = "ridgekv.lowram_predictor"; lowram.group, lowram.rank, lowram.n_group
 *   lowram.<g>.mean  f32 (D)        mean pre-RoPE stacked key of group g
 *   lowram.<g>.basis f32 (D, rank)  rows: principal directions, decreasing eigenvalue
 *   lowram.<g>.eig   f32 (rank)     eigenvalues (per row, of the centred key covariance)
 *   lowram.<l>.w     f32 (kv_dim, rank)  V̂ = coef W + b in the group's coefficients
 *   lowram.<l>.b     f32 (kv_dim)
 * Coefficients are uncorrelated on the calibration rows (the basis diagonalises their
 * covariance), so the ridge predictor decouples per coefficient and its first r rows are
 * the predictor of the rank-r truncation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "ridgefill_impl.h"
#include "rk_kernels.h"

static const rk_gguf_tensor *tensor(const rk_gguf *g, const char *fmt, int i) {
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    return rk_gguf_find_tensor(g, name);
}

static bool shape_ok(const rk_gguf_tensor *t, int64_t ne0, int64_t ne1) {
    return t && t->type == RK_DT_F32 && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1;
}

rk_status lr_pred_open(rk_kv_codec *c, const rk_model *m, char *warning, size_t cap, rk_err *err) {
    const char *path = c->p.predictor;
    rk_status st = rk_mapping_open(path, &c->pmap, err);
    if (st) return st;
    if ((st = rk_gguf_parse(c->pmap.data, c->pmap.len, &c->pgguf, err))) return rk_err_wrap(err, "lowram: %s: ", path);
    rk_str kind;
    if (rk_gguf_get_str(c->pgguf, "general.type", &kind, NULL) != RK_OK || !rk_str_eq(kind, "ridgekv.lowram_predictor"))
        return rk_err_set(err, RK_E_MISMATCH, "lowram: %s is not a predictor file (general.type is not "
                                              "'ridgekv.lowram_predictor')", path);
    if ((st = rk_fingerprint_check(c->pgguf, "lowram.model", m, "lowram predictor", warning, cap, err))) return st;
    uint32_t group, rank;
    if (rk_gguf_get_u32(c->pgguf, "lowram.group", &group, NULL) || rk_gguf_get_u32(c->pgguf, "lowram.rank", &rank, NULL))
        return rk_err_set(err, RK_E_NOT_FOUND, "lowram: %s lacks lowram.group / lowram.rank", path);
    if ((int)group != c->p.group)
        return rk_err_set(err, RK_E_MISMATCH, "lowram: %s was fitted with groups of %u layers but the session uses %d "
                                              "(pass group=%u)", path, group, c->p.group, group);
    if (rank < 1 || rank > (uint32_t)c->D_max)
        return rk_err_set(err, RK_E_MISMATCH, "lowram: %s: rank %u outside 1..%d", path, rank, c->D_max);
    for (int gi = 0; gi < c->n_group; gi++) {
        const int D = c->g[gi].D, r = rank < (uint32_t)D ? (int)rank : D;
        if (!shape_ok(tensor(c->pgguf, "lowram.%d.mean", gi), D, 1) || !shape_ok(tensor(c->pgguf, "lowram.%d.basis", gi), D, r) ||
            !shape_ok(tensor(c->pgguf, "lowram.%d.eig", gi), r, 1))
            return rk_err_set(err, RK_E_MISMATCH, "lowram: %s: group %d tensors missing or not f32 (D %d, rank %d)", path,
                              gi, D, r);
        for (int li = 0; li < c->g[gi].n_l; li++) {
            const int l = c->g[gi].l0 + li;
            if (!shape_ok(tensor(c->pgguf, "lowram.%d.w", l), c->kvd, r) || !shape_ok(tensor(c->pgguf, "lowram.%d.b", l), c->kvd, 1))
                return rk_err_set(err, RK_E_MISMATCH, "lowram: %s: layer %d predictor missing or not f32 (%d x %d)", path, l,
                                  r, c->kvd);
        }
    }
    c->prank = (int32_t)rank;
    return RK_OK;
}

static int file_rank(const rk_kv_codec *c, int gi) { return c->prank < c->g[gi].D ? c->prank : c->g[gi].D; }

bool lr_pred_eig(const rk_kv_codec *c, int gi, double *w) {
    const rk_gguf_tensor *t = tensor(c->pgguf, "lowram.%d.eig", gi);
    if (!t) return false;
    const float *e = t->data;
    for (int i = 0; i < c->prank; i++) w[i] = i < file_rank(c, gi) ? e[i] : 0.0;
    return true;
}

bool lr_pred_basis(const rk_kv_codec *c, int gi, int r, float *mean, float *basis) {
    const rk_gguf_tensor *tm = tensor(c->pgguf, "lowram.%d.mean", gi), *tb = tensor(c->pgguf, "lowram.%d.basis", gi);
    const int D = c->g[gi].D;
    if (!tm || !tb || r > file_rank(c, gi)) return false;
    memcpy(mean, tm->data, (size_t)D * sizeof(float));
    memcpy(basis, tb->data, (size_t)r * D * sizeof(float));
    return true;
}

bool lr_pred_value(const rk_kv_codec *c, int l, int r, float *W, float *b) {
    const rk_gguf_tensor *tw = tensor(c->pgguf, "lowram.%d.w", l), *tb = tensor(c->pgguf, "lowram.%d.b", l);
    if (!tw || !tb || r > file_rank(c, c->ly[l].grp)) return false;
    memcpy(W, tw->data, (size_t)r * c->kvd * sizeof(float));
    memcpy(b, tb->data, (size_t)c->kvd * sizeof(float));
    return true;
}

/* ---- offline fit ----------------------------------------------------------------------- */

typedef struct calib_group {
    int64_t n;
    double *sx;   /* (D) */
    double *xx;   /* (D, D) upper triangle */
    double *sv;   /* (m) m = n_l * kv_dim */
    double *xv;   /* (D, m) */
} calib_group;

rk_status rk_lowram_calibrate(const rk_model *m, const int32_t *ids, size_t n_ids, const rk_lowram_calib_params *pp,
                              rk_progress_fn progress, void *ud, void **bytes, size_t *n_bytes, rk_err *err) {
    const rk_hparams *hp = rk_model_hparams(m);
    rk_lowram_calib_params p = pp ? *pp : (rk_lowram_calib_params){0};
    if (p.group <= 0) p.group = 3;
    if (p.group > hp->n_layer) p.group = hp->n_layer;
    if (p.seg_len <= 0) p.seg_len = 2048;
    if (p.seg_len > hp->n_ctx_train) p.seg_len = hp->n_ctx_train;
    if (p.stride <= 0) p.stride = 2;
    if (!(p.lambda > 0)) p.lambda = 1e-3f;
    const int sink = 4;
    if (n_ids < (size_t)sink + 16)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram calibrate: %zu tokens are too few (need at least 20)", n_ids);
    /* a codec shell for its RoPE table and dimensions */
    rk_kv_codec c = {0};
    c.n_layer = hp->n_layer, c.n_head = hp->n_head, c.n_head_kv = hp->n_head_kv, c.hd = hp->head_dim;
    c.kvd = c.n_head_kv * c.hd, c.n_rot = hp->n_rot, c.rope_mode = hp->rope_mode, c.n_ctx = p.seg_len;
    const int n_group = (hp->n_layer + p.group - 1) / p.group;
    calib_group *cg = calloc((size_t)n_group, sizeof *cg);
    rk_session *s = NULL;
    rk_gguf_writer *w = NULL;
    int32_t *seg = malloc((size_t)p.seg_len * sizeof(int32_t));
    float *x = malloc(((size_t)64 * 3 + (size_t)p.group * c.kvd) * p.group * c.kvd * sizeof(float)); /* X, Vb, Xt, t */
    double *A = NULL, *V = NULL, *ev = NULL, *bx = NULL;
    float *fb = NULL;
    c.freq = malloc((size_t)(c.n_rot / 2 + 1) * sizeof(double));
    c.rope = malloc((size_t)p.seg_len * (c.n_rot > 0 ? c.n_rot : 1) * sizeof(float));
    rk_status st = RK_E_NOMEM;
    if (!cg || !seg || !x || !c.freq || !c.rope) goto nomem;
    for (int i = 0; i < c.n_rot / 2; i++) c.freq[i] = pow((double)hp->rope_base, -2.0 * i / c.n_rot);
    lr_rope_fill(&c, p.seg_len);
    const int D_max = p.group * c.kvd;
    for (int gi = 0; gi < n_group; gi++) {
        const int n_l = hp->n_layer - gi * p.group < p.group ? hp->n_layer - gi * p.group : p.group;
        const size_t D = (size_t)n_l * c.kvd;
        cg[gi].sx = calloc(D, sizeof(double));
        cg[gi].xx = calloc(D * D, sizeof(double));
        cg[gi].sv = calloc(D, sizeof(double));
        cg[gi].xv = calloc(D * D, sizeof(double));
        if (!cg[gi].sx || !cg[gi].xx || !cg[gi].sv || !cg[gi].xv) goto nomem;
    }
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = p.seg_len;
    sp.kv_type = RK_DT_F32;
    sp.n_threads = p.n_threads;
    if ((st = rk_session_create(m, &sp, &s, err))) goto fail;
    const int32_t bos = rk_model_token_bos(m);
    int64_t n_tok = 0;
    for (size_t done = 0; done < n_ids;) {
        int k = 0;
        if (bos >= 0) seg[k++] = bos;
        while (k < p.seg_len && done < n_ids) seg[k++] = ids[done++];
        if (k < sink + 16) break;
        rk_session_reset(s);
        if ((st = rk_session_eval(s, seg, (size_t)k, NULL, false, err))) goto fail;
        n_tok += k;
        for (int gi = 0; gi < n_group; gi++) {
            calib_group *q = &cg[gi];
            const int l0 = gi * p.group, n_l = hp->n_layer - l0 < p.group ? hp->n_layer - l0 : p.group;
            const int D = n_l * c.kvd;
            /* blocks of 64 sampled rows: X (64, D) keys, Vb (64, D) values, Xt = Xᵀ */
            float *Vb = x + (size_t)64 * D_max, *Xt = Vb + (size_t)64 * D_max, *t = Xt + (size_t)64 * D_max;
            for (int64_t r = sink; r < k;) {
                int nb = 0;
                for (; nb < 64 && r < k; nb++, r += p.stride)
                    for (int li = 0; li < n_l; li++) {
                        float *xr = x + (size_t)nb * D + (size_t)li * c.kvd;
                        lr_plain_row(s, l0 + li, false, r, xr);
                        lr_rope_row(&c, xr, c.n_head_kv, r, true);
                        lr_plain_row(s, l0 + li, true, r, Vb + (size_t)nb * D + (size_t)li * c.kvd);
                    }
                for (int a = 0; a < nb; a++)
                    for (int i = 0; i < D; i++) {
                        const float xi = x[(size_t)a * D + i];
                        Xt[(size_t)i * nb + a] = xi;
                        q->sx[i] += xi, q->sv[i] += Vb[(size_t)a * D + i];
                    }
                lr_gram_add(D, nb, x, q->xx);
                lr_matmul(D, D, nb, Xt, nb, Vb, D, t, D);
                for (size_t i = 0; i < (size_t)D * D; i++) q->xv[i] += t[i];
                q->n += nb;
            }
        }
        if (progress && !progress(ud, (int64_t)done, (int64_t)n_ids)) {
            st = rk_err_set(err, RK_E_CANCELLED, "lowram calibrate: cancelled");
            goto fail;
        }
    }
    if (cg[0].n < 16) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "lowram calibrate: only %lld rows sampled", (long long)cg[0].n);
        goto fail;
    }
    /* ---- solve and write ---- */
    A = malloc((size_t)D_max * D_max * sizeof(double));
    V = malloc((size_t)D_max * D_max * sizeof(double));
    ev = malloc((size_t)D_max * sizeof(double));
    bx = malloc((size_t)D_max * D_max * sizeof(double));
    fb = malloc((size_t)D_max * D_max * sizeof(float));
    if (!A || !V || !ev || !bx || !fb) goto nomem;
    const int rank = p.rank > 0 && p.rank < D_max ? p.rank : D_max;
    if ((st = rk_gguf_writer_create(32, &w, err)) ||
        (st = rk_gguf_writer_set_str(w, "general.type", "ridgekv.lowram_predictor", err)) ||
        (st = rk_gguf_writer_set_str(w, "general.name", "ridgekv lowram predictor", err)) ||
        (st = rk_gguf_writer_set_u32(w, "lowram.group", (uint32_t)p.group, err)) ||
        (st = rk_gguf_writer_set_u32(w, "lowram.rank", (uint32_t)rank, err)) ||
        (st = rk_gguf_writer_set_u32(w, "lowram.n_group", (uint32_t)n_group, err)) ||
        (st = rk_gguf_writer_set_u64(w, "lowram.calib_tokens", (uint64_t)n_tok, err)) ||
        (st = rk_gguf_writer_set_u64(w, "lowram.calib_rows", (uint64_t)cg[0].n, err)) ||
        (st = rk_gguf_writer_set_f32(w, "lowram.lambda", p.lambda, err)) ||
        (st = rk_write_fingerprint(w, "lowram.model", m, err)))
        goto fail;
    for (int gi = 0; gi < n_group; gi++) {
        calib_group *q = &cg[gi];
        const int l0 = gi * p.group, n_l = hp->n_layer - l0 < p.group ? hp->n_layer - l0 : p.group;
        const int D = n_l * c.kvd, r = rank < D ? rank : D;
        const double n = (double)q->n;
        for (int i = 0; i < D; i++)
            for (int j = i; j < D; j++)
                A[(size_t)i * D + j] = A[(size_t)j * D + i] = q->xx[(size_t)i * D + j] - q->sx[i] * q->sx[j] / n;
        lr_eig eg;
        bool ok = lr_eig_values(&eg, D, A);
        if (ok) {
            memcpy(ev, eg.w, (size_t)D * sizeof(double));
            ok = lr_eig_vectors(&eg, r, V);
            lr_eig_free(&eg);
        }
        if (!ok) {
            st = rk_err_set(err, RK_E_INTERNAL, "lowram calibrate: eigensolver failed for group %d", gi);
            goto fail;
        }
        /* B Σxv (centred): (r, m) */
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) q->xv[(size_t)i * D + j] -= q->sx[i] * q->sv[j] / n;
        double lam_mean = 0;
        for (int k = 0; k < r; k++) lam_mean += ev[k] > 0 ? ev[k] : 0;
        const double lam = p.lambda * lam_mean / r;
        for (int k = 0; k < r; k++) {
            const double *bk = V + (size_t)k * D;
            for (int j = 0; j < D; j++) {
                double acc = 0;
                for (int i = 0; i < D; i++) acc += bk[i] * q->xv[(size_t)i * D + j];
                bx[(size_t)k * D + j] = acc / ((ev[k] > 0 ? ev[k] : 0) + lam); /* W row k */
            }
        }
        char name[64];
        int64_t ne[2] = {D, 1};
        for (int i = 0; i < D; i++) fb[i] = (float)(q->sx[i] / n);
        snprintf(name, sizeof name, "lowram.%d.mean", gi);
        if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 1, ne, fb, (uint64_t)D * 4, err))) goto fail;
        for (size_t i = 0; i < (size_t)r * D; i++) fb[i] = (float)V[i];
        ne[1] = r;
        snprintf(name, sizeof name, "lowram.%d.basis", gi);
        if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 2, ne, fb, (uint64_t)r * D * 4, err))) goto fail;
        for (int k = 0; k < r; k++) fb[k] = (float)(ev[k] / n);
        ne[0] = r;
        snprintf(name, sizeof name, "lowram.%d.eig", gi);
        if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 1, ne, fb, (uint64_t)r * 4, err))) goto fail;
        for (int li = 0; li < n_l; li++) {
            int64_t nw[2] = {c.kvd, r};
            for (int k = 0; k < r; k++)
                for (int j = 0; j < c.kvd; j++) fb[(size_t)k * c.kvd + j] = (float)bx[(size_t)k * D + li * c.kvd + j];
            snprintf(name, sizeof name, "lowram.%d.w", l0 + li);
            if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 2, nw, fb, (uint64_t)r * c.kvd * 4, err))) goto fail;
            for (int j = 0; j < c.kvd; j++) fb[j] = (float)(q->sv[li * c.kvd + j] / n); /* coefficients have mean 0 */
            snprintf(name, sizeof name, "lowram.%d.b", l0 + li);
            if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 1, nw, fb, (uint64_t)c.kvd * 4, err))) goto fail;
        }
    }
    st = rk_gguf_writer_finish(w, bytes, n_bytes, err);
    goto fail;
nomem:
    st = rk_err_set(err, RK_E_NOMEM, "lowram calibrate: out of memory");
fail:
    rk_gguf_writer_destroy(w);
    rk_session_destroy(s);
    for (int gi = 0; cg && gi < n_group; gi++) free(cg[gi].sx), free(cg[gi].xx), free(cg[gi].sv), free(cg[gi].xv);
    free(cg), free(seg), free(x), free(A), free(V), free(ev), free(bx), free(fb), free(c.freq), free(c.rope);
    return st;
}
