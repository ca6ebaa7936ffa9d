/* LowRAM fit: pre-RoPE keys of a layer group are stacked and projected on the rank-r
 * eigenbasis of their centred Gram matrix; values get a ridge predictor in coefficient
 * space; the hardest residuals are kept. Optional SnapKV eviction and mass-weighted
 * residual choice use the attention mass of the last prefill queries. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "lowram_impl.h"
#include "lowram_simd.h"
#include "rk_kernels.h"

/* ---- the fit ------------------------------------------------------------------------ */

typedef struct fit_job {
    rk_kv_codec *c;
    int64_t n_past, comp_new; /* fit rows [n_sink, n_past); stored rows [n_sink, comp_new) */
    const float *mass;        /* (n_layer, n_head_kv, n_past - n_sink) or NULL */
    const uint8_t *keep;      /* (n_group, comp_new - n_sink) or NULL: keep all */
    rk_status *st;            /* (n_group) */
    const uint8_t *todo;      /* (n_group) groups to fit, or NULL: all */
} fit_job;

/* Rank for a target ratio: bytes per compressed row and layer allowed by the ratio,
 * less landmarks, positions, masks and residuals, buy key coefficients. */
static int rank_for_ratio(const rk_kv_codec *c, const lr_group *g) {
    const rk_lowram_params *p = &c->p;
    /* keys_only keeps values exact: the ratio then applies to the keys alone */
    double allowed = (p->values_exact ? 2.0 : 4.0) * c->kvd / p->ratio;
    double fixed = 2.0 * c->kvd / p->chunk + 4.0 / g->n_l + 8.0 * c->n_head_kv / p->chunk;
    double resid = p->values_exact ? 0 : p->resid_share * c->n_head_kv * (double)c->res_bytes;
    double key = (allowed - fixed - resid) * g->n_l;
    double elt = p->coef_type == RK_DT_F32 ? 4 : p->coef_type == RK_DT_F16 ? 2 : 1;
    /* each coefficient also costs its share of the chunk's f16 mean coefficients */
    int r = (int)((key - (p->coef_type == RK_DT_Q8_0 ? 2 : 0)) / (elt + 2.0 / p->chunk));
    return r < 4 ? 4 : r;
}

static int choose_rank(const rk_kv_codec *c, const lr_group *g, const double *w, int n_w) {
    int r;
    if (c->p.rank > 0) {
        r = c->p.rank;
    } else if (c->p.energy > 0) {
        double tot = 0, acc = 0;
        for (int i = 0; i < n_w; i++) tot += w[i] > 0 ? w[i] : 0;
        for (r = 0; r < n_w && acc < c->p.energy * tot; r++) acc += w[r] > 0 ? w[r] : 0;
        if (r < 1) r = 1;
    } else {
        r = rank_for_ratio(c, g);
    }
    return r > n_w ? n_w : r;
}

bool lr_group_alloc(rk_kv_codec *c, lr_group *g) {
    const rk_lowram_params *p = &c->p;
    g->coef_bytes = p->coef_type == RK_DT_F32 ? 4u * g->r : p->coef_type == RK_DT_F16 ? 2u * g->r : 2u + g->r;
    free(g->mean), free(g->wdim), free(g->winv), free(g->basis), free(g->pos), free(g->coef), free(g->cmean);
    free(g->open_c);
    g->mean = malloc((size_t)g->D * sizeof(float));
    g->wdim = malloc((size_t)g->D * sizeof(float));
    g->winv = malloc((size_t)g->D * sizeof(float));
    g->basis = malloc((size_t)g->r * g->D * (c->wide ? 4 : 2));
    g->pos = malloc((size_t)c->n_ctx * sizeof(int32_t));
    g->coef = malloc((size_t)c->n_ctx * g->coef_bytes);
    g->cmean = malloc((size_t)c->cap_chunks * g->r * sizeof(uint16_t));
    g->open_c = calloc((size_t)g->r, sizeof(float));
    g->n_rows = 0;
    bool ok = g->mean && g->wdim && g->winv && g->basis && g->pos && g->coef && g->cmean && g->open_c;
    for (int li = 0; li < g->n_l && ok; li++) {
        lr_layer *L = &c->ly[g->l0 + li];
        free(L->W), free(L->b);
        /* only the value-rank rows of the predictor are stored (the rows past them are 0) */
        L->W = calloc((size_t)lr_vr(c, g) * c->kvd, c->wide ? 4 : 2);
        L->b = calloc((size_t)c->kvd, sizeof(float));
        L->vs_n = 0, L->vs_last = 0; /* a new W: summaries are rebuilt */
        if (!L->lmk) L->lmk = malloc((size_t)c->cap_chunks * c->kvd * sizeof(uint16_t));
        if (!L->open_sum) L->open_sum = calloc((size_t)c->kvd, sizeof(float));
        ok = L->W && L->b && L->lmk && L->open_sum;
        if (ok && c->p.bound && !L->lmin) {
            L->lmin = malloc((size_t)c->cap_chunks * c->kvd * sizeof(uint16_t));
            L->lmax = malloc((size_t)c->cap_chunks * c->kvd * sizeof(uint16_t));
            L->open_min = calloc((size_t)c->kvd, sizeof(float));
            L->open_max = calloc((size_t)c->kvd, sizeof(float));
            ok = L->lmin && L->lmax && L->open_min && L->open_max;
        }
        for (int h = 0; h < c->n_head_kv && ok; h++) {
            lr_head *H = &L->h[h];
            if (!H->res) H->res = malloc((size_t)c->n_ctx * c->res_bytes);
            if (!H->mask) H->mask = malloc((size_t)c->cap_chunks * sizeof(uint32_t));
            if (!H->base) H->base = malloc((size_t)c->cap_chunks * sizeof(int32_t));
            H->n_res = 0;
            ok = H->res && H->mask && H->base;
        }
    }
    return ok;
}

/* Mean and eigenbasis of the stacked keys of rows [n_sink, n_past) (strided). */
/* Per-dim weights s (D) of group g: sqrt of the prefill queries' second moment on that
 * key dim (rotation pairs averaged: RoPE spins each pair, so only its energy is stable),
 * relative to the group mean, floored at 1e-3. E[(q·Δk)²] ≈ Σ_d w_d Δk_d², so the PCA of
 * s-weighted keys minimises the expected logit error. All ones without query data. */
static void dim_weights(const rk_kv_codec *c, const lr_group *g, float *s) {
    const int half = c->n_rot / 2;
    double tot = 0;
    for (int d = 0; d < g->D; d++) tot += c->qsq ? c->qsq[(size_t)g->l0 * c->kvd + d] : 0;
    if (!c->p.query_pca || !(tot > 0)) {
        for (int d = 0; d < g->D; d++) s[d] = 1.0f;
        return;
    }
    const double mean = tot / g->D;
    for (int d = 0; d < g->D; d++) {
        const int li = d / c->kvd, e = d % c->hd;
        double w = c->qsq[(size_t)g->l0 * c->kvd + d];
        if (e < c->n_rot) {
            const int pe = c->rope_mode == RK_ROPE_NEOX ? (e < half ? e + half : e - half) : (e ^ 1);
            w = 0.5 * (w + c->qsq[(size_t)(g->l0 + li) * c->kvd + (d % c->kvd) - e + pe]);
        }
        s[d] = (float)sqrt(fmax(w / mean, 1e-3));
    }
}

static rk_status fit_basis(rk_kv_codec *c, lr_group *g, int64_t n_past) {
    const int D = g->D;
    const int64_t n_fit = n_past - c->p.n_sink, stride = (n_fit + c->p.max_fit_rows - 1) / c->p.max_fit_rows;
    double *G = calloc((size_t)D * D, sizeof(double)), *sum = calloc((size_t)D, sizeof(double));
    double *V = NULL;
    float *x = malloc((size_t)64 * D * sizeof(float)), *w = malloc((size_t)D * sizeof(float)), *bf = NULL;
    float *sh = calloc((size_t)D, sizeof(float)), *gw = malloc(((size_t)64 * D + (size_t)D * D) * sizeof(float));
    rk_eig eg = {0};
    rk_status st = RK_E_NOMEM;
    if (!G || !sum || !x || !w || !sh || !gw) goto done;
    dim_weights(c, g, w);
    /* rows shifted by the mean of the first block, so that the f32 block sums of the Gram
     * matrix see nearly centred data (the centring below then cancels little) */
    int64_t n_g = 0;
    for (int64_t p = c->p.n_sink; p < n_past;) {
        int nb = 0;
        for (; nb < 64 && p < n_past; nb++, p += stride) {
            float *xr = x + (size_t)nb * D;
            lr_stacked_key(c, g, p, xr);
            for (int d = 0; d < D; d++) xr[d] *= w[d];
        }
        if (n_g == 0)
            for (int d = 0; d < D; d++) {
                double m = 0;
                for (int a = 0; a < nb; a++) m += x[(size_t)a * D + d];
                sh[d] = (float)(m / nb);
            }
        for (int a = 0; a < nb; a++)
            for (int d = 0; d < D; d++) sum[d] += x[(size_t)a * D + d] -= sh[d];
        rk_linalg_gram_add_f32(D, nb, x, gw, G);
        n_g += nb;
    }
    for (int i = 0; i < D; i++) {
        const double mi = sum[i] / (double)n_g;
        for (int j = i; j < D; j++) {
            double v = G[(size_t)i * D + j] - (double)n_g * mi * (sum[j] / (double)n_g);
            G[(size_t)i * D + j] = G[(size_t)j * D + i] = v;
        }
    }
    /* the block buffers (gw: 4 D² bytes) go before the eigensolver's own D x D, and the Gram
     * matrix (8 D²) once reduced (the solver destroys it; its Householder vectors are in
     * eg): neither is then held beside the basis V, so each fitting thread peaks at 16 D²
     * bytes instead of 20 D² + 8 r D */
    free(gw), free(x);
    gw = NULL, x = NULL;
    st = RK_E_INTERNAL;
    const bool eig_ok = rk_linalg_eig_values(&eg, D, G);
    free(G);
    G = NULL;
    if (!eig_ok) goto done;
    g->r = choose_rank(c, g, eg.w, D);
    st = RK_E_NOMEM;
    if (!(V = malloc((size_t)g->r * D * sizeof(double))) || !lr_group_alloc(c, g)) goto done;
    st = RK_E_INTERNAL;
    if (!rk_linalg_eig_vectors(&eg, g->r, V)) goto done;
    for (int d = 0; d < D; d++) {
        g->wdim[d] = w[d], g->winv[d] = 1.0f / w[d];
        g->mean[d] = (float)(sum[d] / (double)n_g + sh[d]) / w[d];
    }
    st = RK_E_NOMEM;
    if (!(bf = malloc((size_t)g->r * D * sizeof(float)))) goto done;
    for (size_t i = 0; i < (size_t)g->r * D; i++) bf[i] = (float)V[i];
    lr_mat_store(c, g->basis, (size_t)g->r * D, bf);
    st = RK_OK;
done:
    free(G), free(sum), free(V), free(x), free(w), free(bf), free(sh), free(gw);
    rk_linalg_eig_free(&eg);
    return st;
}

static rk_status file_basis(rk_kv_codec *c, lr_group *g, int gi) {
    double *w = malloc((size_t)c->prank * sizeof(double));
    if (!w) return RK_E_NOMEM;
    bool ok = lr_pred_eig(c, gi, w);
    g->r = choose_rank(c, g, w, c->prank);
    free(w);
    if (!ok) return RK_E_INTERNAL;
    if (!lr_group_alloc(c, g)) return RK_E_NOMEM;
    for (int d = 0; d < g->D; d++) g->wdim[d] = g->winv[d] = 1.0f; /* offline bases are unweighted */
    float *bf = malloc((size_t)g->r * g->D * sizeof(float));
    if (!bf) return RK_E_NOMEM;
    bool got = lr_pred_basis(c, gi, g->r, g->mean, bf);
    if (got) lr_mat_store(c, g->basis, (size_t)g->r * g->D, bf);
    free(bf);
    return got ? RK_OK : RK_E_INTERNAL;
}

/* Ridge predictor of each layer's values from the dequantised coefficients Cq of the
 * fit rows (strided): centred, one Cholesky per group for all its layers; with a file,
 * shrunk towards the file's predictor instead of towards 0. */
static rk_status fit_predictor(rk_kv_codec *c, lr_group *g, const float *Cq, int64_t n_fit, int64_t stride) {
    /* value_rank: the predictor from the first rv coefficients only, so only the leading
     * (rv, rv) block of CᵀC and the first rv rows of CᵀV are accumulated (rows rv.. of W
     * are 0); the ridge λ still comes from the trace over all r coefficients */
    const int r = g->r, rv = lr_vr(c, g), m = g->n_l * c->kvd;
    double *A = calloc((size_t)rv * rv, sizeof(double)), *B = calloc((size_t)rv * m, sizeof(double));
    double *mc = calloc((size_t)r, sizeof(double)), *mv = calloc((size_t)m, sizeof(double));
    double *sq = calloc((size_t)r, sizeof(double));
    float *cb = malloc((size_t)64 * rv * sizeof(float)), *ct = malloc((size_t)64 * rv * sizeof(float));
    float *vb = malloc((size_t)64 * m * sizeof(float)), *t = malloc((size_t)rv * m * sizeof(float));
    float *wp = malloc((size_t)r * c->kvd * sizeof(float)), *bp = malloc((size_t)c->kvd * sizeof(float));
    rk_status st = RK_E_NOMEM;
    if (!A || !B || !mc || !mv || !sq || !cb || !ct || !vb || !t || !wp || !bp) goto done;
    int64_t n = 0;
    for (int64_t i = 0; i < n_fit;) {
        int nb = 0;
        for (; nb < 64 && i < n_fit; nb++, i += stride) {
            const float *ci = Cq + (size_t)i * r;
            memcpy(cb + (size_t)nb * rv, ci, (size_t)rv * sizeof(float));
            for (int k = 0; k < r; k++) mc[k] += ci[k], sq[k] += (double)ci[k] * ci[k];
            for (int li = 0; li < g->n_l; li++)
                lr_plain_row(c, g->l0 + li, true, c->p.n_sink + i, vb + (size_t)nb * m + (size_t)li * c->kvd);
        }
        for (int a = 0; a < nb; a++) {
            for (int k = 0; k < rv; k++) ct[(size_t)k * nb + a] = cb[(size_t)a * rv + k];
            for (int j = 0; j < m; j++) mv[j] += vb[(size_t)a * m + j];
        }
        rk_linalg_gram_add(rv, nb, cb, A);
        rk_linalg_matmul(rv, m, nb, ct, nb, vb, m, t, m); /* (rv, m) = Cbᵀ Vb */
        for (size_t k = 0; k < (size_t)rv * m; k++) B[k] += t[k];
        n += nb;
    }
    double tr = 0;
    for (int k = 0; k < r; k++) mc[k] /= (double)n;
    for (int j = 0; j < m; j++) mv[j] /= (double)n;
    for (int i = 0; i < rv; i++)
        for (int j = i; j < rv; j++) {
            double v = A[(size_t)i * rv + j] - (double)n * mc[i] * mc[j];
            A[(size_t)i * rv + j] = A[(size_t)j * rv + i] = v;
        }
    for (int i = 0; i < r; i++) tr += sq[i] - (double)n * mc[i] * mc[i];
    const double lam = c->p.lambda * (tr > 0 ? tr / r : 1.0);
    for (int i = 0; i < rv; i++) {
        A[(size_t)i * rv + i] += lam;
        for (int j = 0; j < m; j++) B[(size_t)i * m + j] -= (double)n * mc[i] * mv[j];
    }
    if (c->pgguf)
        for (int li = 0; li < g->n_l; li++)
            if (lr_pred_value(c, g->l0 + li, r, wp, bp))
                for (int i = 0; i < rv; i++)
                    for (int j = 0; j < c->kvd; j++)
                        B[(size_t)i * m + li * c->kvd + j] += lam * wp[(size_t)i * c->kvd + j];
    st = RK_E_INTERNAL;
    if (!rk_linalg_spd_solve(rv, A, B, m)) goto done;
    for (int li = 0; li < g->n_l; li++) {
        lr_layer *L = &c->ly[g->l0 + li];
        for (int j = 0; j < c->kvd; j++) {
            double bj = mv[li * c->kvd + j];
            for (int i = 0; i < r; i++) {
                const double wij = i < rv ? B[(size_t)i * m + li * c->kvd + j] : 0.0;
                wp[(size_t)i * c->kvd + j] = (float)wij;
                bj -= mc[i] * wij;
            }
            L->b[j] = (float)bj;
        }
        lr_mat_store(c, L->W, (size_t)rv * c->kvd, wp);
    }
    st = RK_OK;
done:
    free(A), free(B), free(mc), free(mv), free(sq), free(cb), free(ct), free(vb), free(t), free(wp), free(bp);
    return st;
}

/* k-th largest of v (n), k >= 1: quickselect on a copy (Hoare partition, middle pivot);
 * the value equals that of a full sort. */
static float kth_largest(const float *v, int64_t n, int64_t k, float *tmp) {
    memcpy(tmp, v, (size_t)n * sizeof(float));
    int64_t lo = 0, hi = n - 1;
    const int64_t want = k - 1; /* index in decreasing order */
    while (lo < hi) {
        const float piv = tmp[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (tmp[i] > piv) i++;
            while (tmp[j] < piv) j--;
            if (i <= j) {
                const float t = tmp[i];
                tmp[i++] = tmp[j], tmp[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return tmp[want];
    }
    return tmp[want];
}

/* Σ x² in fp64 over eight independent chains (one chain was a serial add per element) */
static double sumsq(const float *x, size_t n) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) a[u] += (double)x[i + u] * x[i + u];
    double t = 0;
    for (; i < n; i++) t += (double)x[i] * x[i];
    return t + ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* The rows the last prompt queries point at keep their residuals (mass_keep): the mass of
 * one (layer, KV head), max-pooled over mass_pool rows either side (a fact's value tokens
 * follow the words the question matches), ranked over the stored rows; the best m_keep get
 * an infinite score, so the ||δ||² choice that follows takes them first. */
static void mass_force(const rk_kv_codec *c, const float *ms, const uint8_t *keep, int64_t n_cand, int64_t n_keep,
                       int64_t m_keep, float *score, float *tmp) {
    const int64_t w = c->p.mass_pool > 0 ? c->p.mass_pool : 0;
    float *pm = tmp + n_keep; /* tmp holds 2 n_keep floats */
    for (int64_t k = 0, i = 0; i < n_cand; i++) {
        if (keep && !keep[i]) continue;
        float mx = ms[i];
        for (int64_t d = i - w < 0 ? 0 : i - w; d <= i + w && d < n_cand; d++) mx = ms[d] > mx ? ms[d] : mx;
        pm[k++] = mx;
    }
    const float th = kth_largest(pm, n_keep, m_keep, tmp);
    int64_t n = 0;
    for (int64_t k = 0; k < n_keep; k++)
        if (pm[k] > th) score[k] = INFINITY, n++;
    for (int64_t k = 0; k < n_keep && n < m_keep; k++)
        if (pm[k] == th && score[k] != INFINITY) score[k] = INFINITY, n++;
}

/* The mass_pin chunks (stored index order) that hold the most pooled mass of one (layer, KV
 * head): sparse decode attends them at every step (select_chunks), so a fact the question
 * pointed at is read however its chunk's landmark scores for the token being written. */
static void mass_pins(const rk_kv_codec *c, const float *ms, const uint8_t *keep, int64_t n_cand, int64_t n_keep,
                      lr_head *H, float *tmp) {
    const int64_t w = c->p.mass_pool > 0 ? c->p.mass_pool : 0, C = c->p.chunk, n_ch = (n_keep + C - 1) / C;
    float *cm = tmp; /* (n_ch) best pooled mass of a row of the chunk */
    for (int64_t ch = 0; ch < n_ch; ch++) cm[ch] = -1.0f;
    for (int64_t k = 0, i = 0; i < n_cand; i++) {
        if (keep && !keep[i]) continue;
        float mx = ms[i];
        for (int64_t d = i - w < 0 ? 0 : i - w; d <= i + w && d < n_cand; d++) mx = ms[d] > mx ? ms[d] : mx;
        cm[k / C] = mx > cm[k / C] ? mx : cm[k / C];
        k++;
    }
    const int n = c->p.mass_pin < n_ch ? c->p.mass_pin : (int)n_ch;
    for (int p = 0; p < n; p++) { /* n <= 32: repeated arg-max */
        int64_t b = 0;
        for (int64_t ch = 1; ch < n_ch; ch++) b = cm[ch] > cm[b] ? ch : b;
        H->pin[p] = (int32_t)b;
        cm[b] = -INFINITY;
    }
    H->n_pin = n;
}

static rk_status fit_group(fit_job *j, int gi) {
    rk_kv_codec *c = j->c;
    lr_group *g = &c->g[gi];
    const int64_t sink = c->p.n_sink, n_fit = j->n_past - sink, n_cand = j->comp_new - sink;
    const int nh = c->n_head_kv, n_lh = g->n_l * nh;
    rk_status st = c->pgguf ? file_basis(c, g, gi) : fit_basis(c, g, j->n_past);
    if (st) return st;
    const int r = g->r;
    float *B = NULL, *W = NULL;
    const uint8_t *keep = j->keep ? j->keep + (size_t)gi * n_cand : NULL;
    int64_t n_keep = 0;
    for (int64_t i = 0; i < n_cand; i++) n_keep += !keep || keep[i];
    const size_t nk = (size_t)(n_keep ? n_keep : 1);
    float *Cq = malloc((size_t)n_fit * r * sizeof(float)), *x = malloc((size_t)64 * g->D * sizeof(float));
    uint8_t *ecoef = malloc(nk * g->coef_bytes), *crow = malloc(g->coef_bytes);
    uint8_t *eres = malloc(nk * n_lh * c->res_bytes), *sel = malloc(nk * n_lh);
    float *e2 = malloc(nk * n_lh * sizeof(float)), *score = malloc(nk * sizeof(float));
    float *e2u = malloc(nk * sizeof(float)), *tmp = malloc(2 * nk * sizeof(float));
    float *v = malloc((size_t)64 * c->kvd * sizeof(float)), *vh = malloc((size_t)64 * c->kvd * sizeof(float));
    float *cqb = malloc((size_t)64 * r * sizeof(float));
    const uint8_t **res = malloc((size_t)n_lh * sizeof *res);
    double *sse = calloc((size_t)n_lh, sizeof(double)), *sst = calloc((size_t)n_lh * (c->hd + 1), sizeof(double));
    st = RK_E_NOMEM;
    if (!Cq || !x || !ecoef || !crow || !eres || !sel || !e2 || !score || !e2u || !tmp || !v || !vh || !cqb || !res ||
        !sse || !sst || !lr_working_copies(c, g, &B, &W))
        goto done;
    /* coefficients of every fit row (as decoding will see them), 64 rows at a time; the
     * stored rows encoded in order */
    double e_tot = 0, e_kept = 0;
    for (int64_t i0 = 0, k = 0; i0 < n_fit; i0 += 64) {
        const int nb = n_fit - i0 < 64 ? (int)(n_fit - i0) : 64;
        for (int a = 0; a < nb; a++) lr_stacked_key(c, g, sink + i0 + a, x + (size_t)a * g->D);
        lr_project(g, B, nb, x, Cq + (size_t)i0 * r);
        e_tot += sumsq(x, (size_t)nb * g->D);
        e_kept += sumsq(Cq + (size_t)i0 * r, (size_t)nb * r);
        for (int a = 0; a < nb; a++) {
            const int64_t i = i0 + a;
            float *cq = Cq + (size_t)i * r;
            const bool stored = i < n_cand && (!keep || keep[i]);
            lr_encode_row(c->p.coef_type, cq, r, stored ? ecoef + (size_t)k++ * g->coef_bytes : crow);
        }
    }
    g->energy_total = e_tot, g->energy_kept = e_kept;
    const int64_t stride = (n_fit + c->p.max_fit_rows - 1) / c->p.max_fit_rows;
    if (!c->p.values_exact && (st = fit_predictor(c, g, Cq, n_fit, stride))) goto done;
    for (int li = 0; li < g->n_l; li++) /* the residuals see the stored (rounded) predictor */
        lr_mat_f32(c, c->ly[g->l0 + li].W, (size_t)c->kvd, 0, lr_vr(c, g), 0, c->kvd, W + (size_t)li * r * c->kvd);
    st = RK_E_NOMEM;
    /* residuals of the stored rows, 64 at a time, and R² over them */
    for (int64_t i = 0, k0 = 0; i < n_cand;) {
        int64_t pos[64];
        int nb = 0;
        for (; nb < 64 && i < n_cand; i++)
            if (!keep || keep[i]) {
                pos[nb] = sink + i;
                memcpy(cqb + (size_t)nb * r, Cq + (size_t)i * r, (size_t)r * sizeof(float));
                nb++;
            }
        for (int li = 0; li < g->n_l; li++) {
            for (int a = 0; a < nb; a++) {
                lr_plain_row(c, g->l0 + li, true, pos[a], v);
                for (int h = 0; h < nh; h++) {
                    double *t = sst + (size_t)(li * nh + h) * (c->hd + 1);
                    for (int d = 0; d < c->hd; d++) t[d] += v[h * c->hd + d];
                    t[c->hd] += sumsq(v + h * c->hd, (size_t)c->hd);
                }
            }
            float *ek = e2 + (size_t)k0 * n_lh + (size_t)li * nh;
            lr_residuals(c, g, W, li, nb, pos, cqb, v, vh, eres + ((size_t)k0 * n_lh + (size_t)li * nh) * c->res_bytes,
                         (size_t)n_lh * c->res_bytes, ek, (size_t)n_lh);
            for (int a = 0; a < nb; a++)
                for (int h = 0; h < nh; h++) sse[li * nh + h] += ek[(size_t)a * n_lh + h];
        }
        k0 += nb;
    }
    /* per (layer, head): the hardest share of rows by (optionally mass-weighted) ||δ||² */
    const int64_t k_keep = (int64_t)llround(c->p.resid_share * (double)n_keep);
    int64_t m_keep = (int64_t)llround(c->p.mass_keep * (double)n_keep);
    m_keep = m_keep < k_keep ? m_keep : k_keep;
    for (int q = 0; q < n_lh; q++) {
        const int l = g->l0 + q / nh;
        lr_head *H = &c->ly[l].h[q % nh];
        double *t = sst + (size_t)q * (c->hd + 1), tot = t[c->hd];
        for (int d = 0; d < c->hd; d++) tot -= t[d] * t[d] / (double)nk;
        H->r2 = tot > 0 ? (float)(1.0 - sse[q] / tot) : 0.0f;
        const float *m_all = j->mass ? j->mass + ((size_t)l * nh + q % nh) * n_fit : NULL;
        const float *ms = c->p.resid_mass ? m_all : NULL;
        double m_mean = 0;
        for (int64_t i = 0; ms && i < n_cand; i++) m_mean += ms[i];
        m_mean = m_mean > 0 ? m_mean / (double)n_cand : 1.0;
        for (int64_t k = 0, i = 0; i < n_cand; i++) {
            if (keep && !keep[i]) continue;
            e2u[k] = e2[(size_t)k * n_lh + q];
            /* weight 1/2 .. : rows the last queries attend to more than uniformly count more */
            score[k] = ms ? e2u[k] * (float)(0.5 + 0.5 * ms[i] / m_mean) : e2u[k];
            k++;
        }
        if (m_all && m_keep > 0) mass_force(c, m_all, keep, n_cand, n_keep, m_keep, score, tmp);
        H->n_pin = 0;
        if (m_all && c->p.mass_pin > 0) mass_pins(c, m_all, keep, n_cand, n_keep, H, tmp);
        if (k_keep <= 0) {
            H->tau = INFINITY;
            for (int64_t k = 0; k < n_keep; k++) sel[(size_t)k * n_lh + q] = 0;
        } else if (k_keep >= n_keep) {
            H->tau = -1.0f;
            for (int64_t k = 0; k < n_keep; k++) sel[(size_t)k * n_lh + q] = 1;
        } else {
            const float tw = kth_largest(score, n_keep, k_keep, tmp);
            H->tau = kth_largest(e2u, n_keep, k_keep, tmp);
            int64_t n_sel = 0;
            for (int64_t k = 0; k < n_keep; k++) n_sel += sel[(size_t)k * n_lh + q] = score[k] > tw;
            for (int64_t k = 0; k < n_keep && n_sel < k_keep; k++)
                if (score[k] == tw) sel[(size_t)k * n_lh + q] = 1, n_sel++;
        }
    }
    /* store: coefficients, chosen residuals, landmarks */
    for (int64_t i = 0, k = 0; i < n_cand; i++) {
        if (keep && !keep[i]) continue;
        for (int q = 0; q < n_lh; q++)
            res[q] = sel[(size_t)k * n_lh + q] ? eres + ((size_t)k * n_lh + q) * c->res_bytes : NULL;
        lr_append_row(c, g, sink + i, ecoef + (size_t)k * g->coef_bytes, Cq + (size_t)i * r, res, v);
        k++;
    }
    lr_append_close(c, g);
    st = RK_OK;
done:
    free(Cq), free(x), free(ecoef), free(crow), free(eres), free(sel), free(e2), free(score), free(e2u), free(tmp);
    free(v), free(vh), free(cqb), free(res), free(sse), free(sst), free(B), free(W);
    return st;
}

static void fit_worker(void *vp, int t, int nt) {
    fit_job *j = vp;
    for (int gi = 0, k = 0; gi < j->c->n_group; gi++) /* the groups to fit, dealt out in turn */
        if (!j->todo || j->todo[gi])
            if (k++ % nt == t) j->st[gi] = fit_group(j, gi);
}

/* ---- attention mass of the observed queries (SnapKV) ------------------------------- */

typedef struct mass_job {
    rk_kv_codec *c;
    int64_t n_past;
    float *mass;           /* (n_layer, n_head_kv, n_past - n_sink) */
    float *miss;           /* (n_layer) the selection's missed share (sel_miss), or NULL */
    const uint8_t *todo_l; /* (n_layer) layers to do, or NULL: all */
    bool fail;
} mass_job;

/* How much of the observed queries' attention decode's landmark selection leaves out, for
 * one KV head (keys Kh: row p at Kh + p * kv_dim, post-RoPE; queries Q and their softmax
 * weights S, rows g * n_obs + o). Per observed row o, as decode selects for one token: the
 * n_sel chunks whose landmark (mean key) scores highest against any of the group's query
 * heads; its miss is the weight of the other chunks, averaged over the group. (The miss
 * less that of the best n_sel chunks by weight, the landmarks' error alone, chose layers
 * that lost the needle.) w: scratch of
 * miss_scratch(n_ch, hd) floats; adds the misses into w[0] and their count into w[1]. */
static size_t miss_scratch(int64_t n_ch, int hd) { return 2 + (size_t)n_ch * (3 + (size_t)hd); }
static void miss_head(const rk_kv_codec *c, const float *Kh, const float *Q, const float *S, int64_t n, int nq,
                      int n_obs, int l, int64_t n_ch, int64_t n_sel, float *w) {
    const int hd = c->hd, grp = nq / n_obs;
    const int64_t C = c->p.chunk, sink = c->p.n_sink;
    float *sc = w + 2, *cm = sc + n_ch, *tmp = cm + n_ch, *lm = tmp + n_ch;
    memset(lm, 0, (size_t)n_ch * hd * sizeof(float)); /* landmark sums (the mean's scale ranks alike) */
    for (int64_t ch = 0; ch < n_ch; ch++)
        for (int64_t p = sink + ch * C; p < sink + (ch + 1) * C; p++)
            for (int d = 0; d < hd; d++) lm[(size_t)ch * hd + d] += Kh[(size_t)p * c->kvd + d];
    for (int o = 0; o < n_obs; o++) {
        const int64_t pq = c->obs_pos[(size_t)l * c->p.obs_window + o];
        if (pq >= n) continue;
        for (int64_t ch = 0; ch < n_ch; ch++) {
            float best = -INFINITY;
            double m = 0;
            for (int g = 0; g < grp; g++) {
                const float *qv = Q + ((size_t)g * n_obs + o) * hd, *lv = lm + (size_t)ch * hd;
                const float *wr = S + ((size_t)g * n_obs + o) * n;
                float dt = 0;
                for (int d = 0; d < hd; d++) dt += qv[d] * lv[d];
                best = dt > best ? dt : best;
                for (int64_t p = sink + ch * C; p < sink + (ch + 1) * C && p <= pq; p++) m += wr[p];
            }
            sc[ch] = best;
            cm[ch] = (float)(m / grp);
        }
        const float th = kth_largest(sc, n_ch, n_sel, tmp);
        double lost = 0;
        for (int64_t ch = 0; ch < n_ch; ch++)
            if (sc[ch] < th) lost += cm[ch];
        w[0] += (float)lost;
        w[1] += 1.0f;
    }
}

/* Per KV head: the observed queries of its query heads (grp * n_obs rows, gathered) times
 * the transposed keys (hd, n) in one product (6 x 16 tiles over k = hd; the old per-head
 * dot products ran at a third of its speed on hd = 64), then per query the softmax over the
 * keys it sees (8-lane exp where the CPU has AVX2) added into the row masses. */
static void mass_layer(mass_job *j, int l) {
    rk_kv_codec *c = j->c;
    const int64_t n = j->n_past, sink = c->p.n_sink;
    const int grp = c->n_head / c->n_head_kv, qd = c->n_head * c->hd, W = c->p.obs_window, hd = c->hd;
    const int n_obs = c->obs_n[l] < W ? c->obs_n[l] : W, nq = grp * (n_obs ? n_obs : 1);
    float *K = malloc((size_t)n * c->kvd * sizeof(float)), *Kt = malloc((size_t)n * hd * sizeof(float));
    float *S = malloc((size_t)nq * n * sizeof(float)), *Q = malloc((size_t)nq * hd * sizeof(float));
    if (!K || !Kt || !S || !Q) {
        j->fail = true;
        free(K), free(Kt), free(S), free(Q);
        return;
    }
    for (int64_t p = 0; p < n; p++) lr_plain_row(c, l, false, p, K + (size_t)p * c->kvd);
    float *ms = j->mass + (size_t)l * c->n_head_kv * (n - sink);
    const float scale = 1.0f / sqrtf((float)hd);
    /* the selection's miss: full chunks of the compressed range [sink, n - window) against
     * the budget's chunk count (0 where the budget holds them all) */
    const int64_t C = c->p.chunk, n_sel = (c->p.budget + C - 1) / C;
    const int64_t n_ch = n - c->p.window > sink ? (n - c->p.window - sink) / C : 0;
    float *miss = j->miss && n_ch > n_sel ? calloc(miss_scratch(n_ch, hd), sizeof(float)) : NULL;
    if (j->miss && n_ch > n_sel && !miss) {
        j->fail = true;
        free(K), free(Kt), free(S), free(Q);
        return;
    }
#ifdef RK_HAVE_AVX2
    const bool avx2 = rk_cpu_has_avx2();
#endif
    for (int h = 0; h < c->n_head_kv && n_obs > 0; h++) {
        for (int64_t p = 0; p < n; p++)
            for (int d = 0; d < hd; d++) Kt[(size_t)d * n + p] = K[(size_t)p * c->kvd + (size_t)h * hd + d];
        for (int g = 0; g < grp; g++)
            for (int o = 0; o < n_obs; o++)
                memcpy(Q + ((size_t)g * n_obs + o) * hd,
                       c->obs_q + ((size_t)l * W + o) * qd + (size_t)(h * grp + g) * hd, (size_t)hd * sizeof(float));
        /* scores of every observed query of the KV head against every key: (grp * n_obs, n) */
        rk_linalg_matmul(nq, (int)n, hd, Q, hd, Kt, (int)n, S, (int)n);
        float *mh = ms + (size_t)h * (n - sink);
        for (int q = 0; q < nq; q++) {
            const int64_t pq = c->obs_pos[(size_t)l * W + q % n_obs];
            if (pq >= n) continue;
            float *sc = S + (size_t)q * n, mx = -INFINITY;
            const int nv = (int)pq + 1;
            for (int p = 0; p < nv; p++) {
                sc[p] *= scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            double sum = 0;
#ifdef RK_HAVE_AVX2
            if (avx2) sum = lr_exp_sum_avx2(sc, nv, mx);
            else
#endif
                for (int p = 0; p < nv; p++) sum += sc[p] = expf(sc[p] - mx);
            const float inv = (float)(1.0 / sum);
            for (int64_t p = sink; p < nv; p++) mh[p - sink] += sc[p] *= inv; /* S: weights from here */
        }
        if (miss && n_ch > n_sel) miss_head(c, K + (size_t)h * hd, Q, S, n, nq, n_obs, l, n_ch, n_sel, miss);
    }
    if (j->miss) j->miss[l] = !miss ? 0.0f : miss[1] > 0 ? miss[0] / miss[1] : -1.0f;
    free(K), free(Kt), free(S), free(Q), free(miss);
}

static void mass_worker(void *vp, int t, int nt) {
    mass_job *j = vp;
    for (int l = t; l < j->c->n_layer; l += nt)
        if (!j->todo_l || j->todo_l[l]) mass_layer(j, l);
}

/* SnapKV keep set per group: max-pooled (±3 rows) mass summed over the group's layers and
 * heads; the top (1 - evict) share of the candidate rows survive. */
static bool evict_plan(const rk_kv_codec *c, const float *mass, int64_t n_fit, int64_t n_cand, uint8_t *keep) {
    float *sc = malloc((size_t)n_cand * sizeof(float)), *pool = malloc((size_t)n_cand * sizeof(float));
    float *tmp = malloc((size_t)n_cand * sizeof(float));
    if (!sc || !pool || !tmp) {
        free(sc), free(pool), free(tmp);
        return false;
    }
    const int64_t k_keep = n_cand - (int64_t)llround(c->p.evict * (double)n_cand);
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        uint8_t *kp = keep + (size_t)gi * n_cand;
        memset(sc, 0, (size_t)n_cand * sizeof(float));
        for (int l = g->l0; l < g->l0 + g->n_l; l++)
            for (int h = 0; h < c->n_head_kv; h++) {
                const float *ms = mass + ((size_t)l * c->n_head_kv + h) * n_fit;
                for (int64_t i = 0; i < n_cand; i++) sc[i] += ms[i];
            }
        for (int64_t i = 0; i < n_cand; i++) {
            float mx = sc[i];
            for (int64_t d = i - 3; d <= i + 3; d++)
                if (d >= 0 && d < n_cand && sc[d] > mx) mx = sc[d];
            pool[i] = mx;
        }
        if (k_keep <= 0) {
            memset(kp, 0, (size_t)n_cand);
            continue;
        }
        const float th = kth_largest(pool, n_cand, k_keep, tmp);
        int64_t n = 0;
        for (int64_t i = 0; i < n_cand; i++) n += kp[i] = pool[i] > th;
        for (int64_t i = 0; i < n_cand && n < k_keep; i++)
            if (!kp[i] && pool[i] == th) kp[i] = 1, n++;
    }
    free(sc), free(pool), free(tmp);
    return true;
}

/* Fits the groups marked in todo (NULL: all) on rows [sink, n_past): attention mass of
 * their layers, then one group per task on the pool. Nothing is dropped. */
static rk_status fit_groups(rk_kv_codec *c, int64_t n_past, const uint8_t *todo, rk_err *err) {
    const int64_t sink = c->p.n_sink, n_fit = n_past - sink;
    const int64_t comp_new = n_past - c->p.window, n_cand = comp_new - sink;
    rk_status st = RK_OK;
    float *mass = NULL;
    uint8_t *keep = NULL, *todo_l = NULL;
    rk_status *gst = calloc((size_t)c->n_group, sizeof *gst);
    if (!gst) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory");
    lr_rope_fill(c, n_past);
    const bool want_miss = c->p.full_layers > 0;
    const bool want_mass =
        (c->p.evict > 0 || c->p.resid_mass || c->p.mass_keep > 0 || c->p.mass_pin > 0 || want_miss) && c->obs_q;
    if (want_mass) {
        mass = calloc((size_t)c->n_layer * c->n_head_kv * n_fit, sizeof(float));
        if (todo && (todo_l = calloc((size_t)c->n_layer, 1)))
            for (int gi = 0; gi < c->n_group; gi++)
                for (int li = 0; todo[gi] && li < c->g[gi].n_l; li++) todo_l[c->g[gi].l0 + li] = 1;
        mass_job mj = {.c = c,
                       .n_past = n_past,
                       .mass = mass,
                       .miss = want_miss ? c->sel_miss : NULL,
                       .todo_l = todo_l,
                       .fail = mass == NULL || (todo && !todo_l)};
        if (!mj.fail) {
            if (c->pool) rk_pool_run(c->pool, mass_worker, &mj);
            else mass_worker(&mj, 0, 1);
        }
        if (mj.fail) {
            st = rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for attention mass");
            goto done;
        }
        if (c->p.evict > 0) { /* (every group: lr_prefit does not run with eviction) */
            keep = malloc((size_t)c->n_group * n_cand);
            if (!keep || !evict_plan(c, mass, n_fit, n_cand, keep)) {
                st = rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for the eviction plan");
                goto done;
            }
        }
    }
    fit_job j = {c, n_past, comp_new, mass, keep, gst, todo};
    if (c->pool) rk_pool_run(c->pool, fit_worker, &j);
    else fit_worker(&j, 0, 1);
    for (int gi = 0; gi < c->n_group; gi++)
        if (gst[gi]) {
            st = rk_err_set(err, gst[gi],
                            gst[gi] == RK_E_NOMEM ? "lowram: out of memory fitting layer group %d"
                                                  : "lowram: fit of layer group %d failed (eigensolver, "
                                                    "solve or predictor file)",
                            gi);
            goto done;
        }
done:
    free(gst), free(mass), free(keep), free(todo_l);
    return st;
}

/* The full layers: at most full_layers of them, by decreasing sel_miss, each at least
 * full_min (ties: the lower layer). Layers not measured (sel_miss < 0) are never full. */
void lr_choose_full(rk_kv_codec *c) {
    rk_lowram_stats *S = &c->stats;
    S->n_full = 0;
    for (int l = 0; l < c->n_layer; l++) c->ly[l].full = false;
    const int want = c->p.full_layers < LR_FULL_MAX ? c->p.full_layers : LR_FULL_MAX;
    if (!c->obs_q) return;
    while (S->n_full < want) {
        int best = -1;
        for (int l = 0; l < c->n_layer; l++)
            if (!c->ly[l].full && c->sel_miss[l] >= c->p.full_min && (best < 0 || c->sel_miss[l] > c->sel_miss[best]))
                best = l;
        if (best < 0) break;
        c->ly[best].full = true;
        S->full_l[S->n_full++] = best;
    }
}

bool lr_fit_due(const rk_kv_codec *c, int64_t n) {
    const int64_t sink = c->p.n_sink;
    /* enough rows to fit on, at least one chunk to compress, and past the start threshold */
    return !c->fitted && n - sink - c->p.window >= c->p.chunk && n - sink >= 128 && n >= c->p.fit_min;
}

/* Gives the pages of exact rows [p0, p1) of layer l back to the system (their contents are
 * not read again: the group is compressed); whole pages inside the range only. */
static void release_rows(const rk_kv_codec *c, int l, int64_t p0, int64_t p1) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    if (p1 <= p0) return;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int v = 0; v < 2; v++) {
        uintptr_t a = (uintptr_t)lr_exact_ptr(c, l, v, p0), b = (uintptr_t)lr_exact_ptr(c, l, v, p1 - 1) + c->xrow;
        a = (a + pg - 1) & ~(pg - 1), b &= ~(pg - 1);
        if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: on refusal the pages stay */
    }
#else
    (void)c, (void)l, (void)p0, (void)p1;
#endif
}

rk_status lr_prefit(rk_kv_codec *c, int l_end, int64_t n_past, int64_t n_before, rk_err *err) {
    if (!lr_fit_due(c, n_past) || c->p.prefill_fit > 0 || c->p.evict > 0 || c->x0 != 0) return RK_OK;
    uint8_t *todo = calloc((size_t)c->n_group, 1);
    if (!todo) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory");
    int n_todo = 0;
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        todo[gi] = !g->prefit && g->l0 + g->n_l <= l_end;
        n_todo += todo[gi];
    }
    rk_status st = RK_OK;
    for (int l = 0; l < l_end && n_todo; l++)
        if (c->x_hi[l] != n_past) {
            st = rk_err_set(err, RK_E_INVALID_ARG,
                            "lowram: early fit below layer %d but layer %d holds %lld of %lld rows", l_end, l,
                            (long long)c->x_hi[l], (long long)n_past);
            break;
        }
    const double t0 = rk_time_now();
    if (!st && n_todo) st = fit_groups(c, n_past, todo, err);
    if (st || !n_todo) { /* (on failure the eval fails and truncates: lr_prefit_undo) */
        free(todo);
        return st;
    }
    const int64_t sink = c->p.n_sink, lo = n_before > sink ? n_before : sink, hi = n_past - c->p.window;
    for (int gi = 0; gi < c->n_group; gi++)
        if (todo[gi]) {
            c->g[gi].prefit = true;
            for (int li = 0; li < c->g[gi].n_l; li++) release_rows(c, c->g[gi].l0 + li, lo, hi);
        }
    c->prefit_s += rk_time_now() - t0;
    free(todo);
    return RK_OK;
}

void lr_prefit_undo(rk_kv_codec *c) {
    bool any = false;
    for (int gi = 0; gi < c->n_group; gi++) any |= c->g[gi].prefit, c->g[gi].prefit = false;
    if (any && !c->fitted) lr_truncate(c, c->p.n_sink); /* their stored rows go; the exact rows were kept */
    c->prefit_s = 0;
}

rk_status lr_fit(rk_kv_codec *c, int64_t n_past, rk_err *err) {
    const double t0 = rk_time_now();
    const int64_t sink = c->p.n_sink, n_cand = n_past - c->p.window - sink;
    uint8_t *todo = calloc((size_t)c->n_group, 1);
    if (!todo) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory");
    bool some = false;
    for (int gi = 0; gi < c->n_group; gi++) todo[gi] = !c->g[gi].prefit, some |= c->g[gi].prefit;
    rk_status st = fit_groups(c, n_past, some ? todo : NULL, err);
    if (st) goto done;
    lr_choose_full(c);
    /* scratch before the exact copies go: after that there is no way back */
    if ((st = lr_scratch_alloc(c, err))) goto done;
    c->comp_end = n_past - c->p.window;
    if (!lr_exact_compact(c, true)) {
        c->comp_end = sink;
        lr_scratch_free(c);
        st = rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for the sink rows");
        goto done;
    }
    c->fitted = true;
    for (int gi = 0; gi < c->n_group; gi++) c->g[gi].prefit = false;
    c->n_evicted = c->p.evict > 0 ? n_cand - c->g[0].n_rows : 0;
    c->stats.seconds_fit = c->prefit_s + (rk_time_now() - t0);
    c->prefit_s = 0;
done:
    free(todo);
#ifdef __GLIBC__
    malloc_trim(0); /* the fit's transients (tens of MB at 8K) go back to the system, so RSS shows the compression */
#endif
    return st;
}
