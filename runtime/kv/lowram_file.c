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
#include "model_impl.h"
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
        return rk_err_set(err, RK_E_MISMATCH,
                          "lowram: %s is not a predictor file (general.type is not "
                          "'ridgekv.lowram_predictor')",
                          path);
    if ((st = rk_fingerprint_check(c->pgguf, "lowram.model", m, "lowram predictor", warning, cap, err))) return st;
    uint32_t group, rank;
    if (rk_gguf_get_u32(c->pgguf, "lowram.group", &group, NULL) ||
        rk_gguf_get_u32(c->pgguf, "lowram.rank", &rank, NULL))
        return rk_err_set(err, RK_E_NOT_FOUND, "lowram: %s lacks lowram.group / lowram.rank", path);
    if ((int)group != c->p.group)
        return rk_err_set(err, RK_E_MISMATCH,
                          "lowram: %s was fitted with groups of %u layers but the session uses %d "
                          "(pass group=%u)",
                          path, group, c->p.group, group);
    if (rank < 1 || rank > (uint32_t)c->D_max)
        return rk_err_set(err, RK_E_MISMATCH, "lowram: %s: rank %u outside 1..%d", path, rank, c->D_max);
    for (int gi = 0; gi < c->n_group; gi++) {
        const int D = c->g[gi].D, r = rank < (uint32_t)D ? (int)rank : D;
        if (!shape_ok(tensor(c->pgguf, "lowram.%d.mean", gi), D, 1) ||
            !shape_ok(tensor(c->pgguf, "lowram.%d.basis", gi), D, r) ||
            !shape_ok(tensor(c->pgguf, "lowram.%d.eig", gi), r, 1))
            return rk_err_set(err, RK_E_MISMATCH, "lowram: %s: group %d tensors missing or not f32 (D %d, rank %d)",
                              path, gi, D, r);
        for (int li = 0; li < c->g[gi].n_l; li++) {
            const int l = c->g[gi].l0 + li;
            if (!shape_ok(tensor(c->pgguf, "lowram.%d.w", l), c->kvd, r) ||
                !shape_ok(tensor(c->pgguf, "lowram.%d.b", l), c->kvd, 1))
                return rk_err_set(err, RK_E_MISMATCH, "lowram: %s: layer %d predictor missing or not f32 (%d x %d)",
                                  path, l, r, c->kvd);
        }
    }
    /* values: a NaN basis or predictor would turn every rebuilt key or value into NaN */
    const uint64_t n_tensor = rk_gguf_n_tensors(c->pgguf);
    for (uint64_t i = 0; i < n_tensor; i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(c->pgguf, i);
        if (t->name.len > 7 && !memcmp(t->name.ptr, "lowram.", 7) && (st = rk_tensor_check_finite(t, path, err))) {
            rk_err_wrap(err, "lowram");
            return st;
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
    for (int i = 0; i < c->prank; i++) w[i] = i < file_rank(c, gi) ? e[i] * c->rope_ms * c->rope_ms : 0.0;
    return true;
}

bool lr_pred_basis(const rk_kv_codec *c, int gi, int r, float *mean, float *basis) {
    const rk_gguf_tensor *tm = tensor(c->pgguf, "lowram.%d.mean", gi), *tb = tensor(c->pgguf, "lowram.%d.basis", gi);
    const int D = c->g[gi].D;
    if (!tm || !tb || r > file_rank(c, gi)) return false;
    /* the file holds true pre-RoPE keys; the codec's carry YaRN's mscale (lowram_impl.h: freq) */
    const float *fm = tm->data;
    for (int d = 0; d < D; d++) mean[d] = (float)(fm[d] * c->rope_ms);
    memcpy(basis, tb->data, (size_t)r * D * sizeof(float));
    return true;
}

bool lr_pred_value(const rk_kv_codec *c, int l, int r, float *W, float *b) {
    const rk_gguf_tensor *tw = tensor(c->pgguf, "lowram.%d.w", l), *tb = tensor(c->pgguf, "lowram.%d.b", l);
    if (!tw || !tb || r > file_rank(c, c->ly[l].grp)) return false;
    /* coefficients of the codec's keys are mscale times the file's: W by 1 / mscale */
    const float *fw = tw->data;
    for (size_t i = 0; i < (size_t)r * c->kvd; i++) W[i] = (float)(fw[i] / c->rope_ms);
    memcpy(b, tb->data, (size_t)c->kvd * sizeof(float));
    return true;
}

/* ---- offline fit ----------------------------------------------------------------------- */
