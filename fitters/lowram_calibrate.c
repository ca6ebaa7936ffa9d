/* LowRAM predictor file (SPEC §3): one exact forward over calibration text (segments
 * starting with BOS), fp64 moments of the stacked pre-RoPE keys per layer group and of
 * keys x values per layer, one eigendecomposition per group, closed-form value
 * predictors in coefficient space, serialised with the model fingerprint. The runtime
 * side (reading the file) is runtime/kv/lowram_file.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_fitters.h"
#include "rk_linalg.h"

typedef struct calib_group {
    int64_t n;
    double *sx; /* (D) */
    double *xx; /* (D, D) upper triangle */
    double *sv; /* (m) m = n_l * kv_dim */
    double *xv; /* (D, m) */
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
    const int kvd = hp->n_head_kv * hp->head_dim;
    const int n_group = (hp->n_layer + p.group - 1) / p.group;
    calib_group *cg = calloc((size_t)n_group, sizeof *cg);
    rk_session *s = NULL;
    rk_gguf_writer *w = NULL;
    int32_t *seg = malloc((size_t)p.seg_len * sizeof(int32_t));
    float *x = malloc(((size_t)64 * 3 + (size_t)p.group * kvd) * p.group * kvd * sizeof(float)); /* X, Vb, Xt, t */
    double *A = NULL, *V = NULL, *ev = NULL, *bx = NULL;
    float *fb = NULL;
    rk_status st = RK_E_NOMEM;
    if (!cg || !seg || !x) goto nomem;
    const int D_max = p.group * kvd;
    for (int gi = 0; gi < n_group; gi++) {
        const int n_l = hp->n_layer - gi * p.group < p.group ? hp->n_layer - gi * p.group : p.group;
        const size_t D = (size_t)n_l * kvd;
        cg[gi].sx = calloc(D, sizeof(double));
        cg[gi].xx = calloc(D * D, sizeof(double));
        cg[gi].sv = calloc(D, sizeof(double));
        cg[gi].xv = calloc(D * D, sizeof(double));
        if (!cg[gi].sx || !cg[gi].xx || !cg[gi].sv || !cg[gi].xv) goto nomem;
    }
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = p.seg_len;
    sp.kv.kind = RK_KV_F32; /* the moments see the keys as computed */
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
            const int D = n_l * kvd;
            /* blocks of 64 sampled rows: X (64, D) keys, Vb (64, D) values, Xt = Xᵀ */
            float *Vb = x + (size_t)64 * D_max, *Xt = Vb + (size_t)64 * D_max, *t = Xt + (size_t)64 * D_max;
            for (int64_t r = sink; r < k;) {
                int nb = 0;
                for (; nb < 64 && r < k; nb++, r += p.stride)
                    for (int li = 0; li < n_l; li++) {
                        float *xr = x + (size_t)nb * D + (size_t)li * kvd;
                        if ((st = rk_session_kv_rows(s, l0 + li, false, true, r, 1, xr, err)) ||
                            (st = rk_session_kv_rows(s, l0 + li, true, false, r, 1,
                                                     Vb + (size_t)nb * D + (size_t)li * kvd, err)))
                            goto fail;
                    }
                for (int a = 0; a < nb; a++)
                    for (int i = 0; i < D; i++) {
                        const float xi = x[(size_t)a * D + i];
                        Xt[(size_t)i * nb + a] = xi;
                        q->sx[i] += xi, q->sv[i] += Vb[(size_t)a * D + i];
                    }
                rk_linalg_gram_add(D, nb, x, q->xx);
                rk_linalg_matmul(D, D, nb, Xt, nb, Vb, D, t, D);
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
        (st = rk_fingerprint_write(w, "lowram.model", m, err)))
        goto fail;
    for (int gi = 0; gi < n_group; gi++) {
        calib_group *q = &cg[gi];
        const int l0 = gi * p.group, n_l = hp->n_layer - l0 < p.group ? hp->n_layer - l0 : p.group;
        const int D = n_l * kvd, r = rank < D ? rank : D;
        const double n = (double)q->n;
        for (int i = 0; i < D; i++)
            for (int j = i; j < D; j++)
                A[(size_t)i * D + j] = A[(size_t)j * D + i] = q->xx[(size_t)i * D + j] - q->sx[i] * q->sx[j] / n;
        rk_eig eg;
        bool ok = rk_linalg_eig_values(&eg, D, A);
        if (ok) {
            memcpy(ev, eg.w, (size_t)D * sizeof(double));
            ok = rk_linalg_eig_vectors(&eg, r, V);
            rk_linalg_eig_free(&eg);
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
            int64_t nw[2] = {kvd, r};
            for (int k = 0; k < r; k++)
                for (int j = 0; j < kvd; j++) fb[(size_t)k * kvd + j] = (float)bx[(size_t)k * D + li * kvd + j];
            snprintf(name, sizeof name, "lowram.%d.w", l0 + li);
            if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 2, nw, fb, (uint64_t)r * kvd * 4, err))) goto fail;
            for (int j = 0; j < kvd; j++) fb[j] = (float)(q->sv[li * kvd + j] / n); /* coefficients have mean 0 */
            snprintf(name, sizeof name, "lowram.%d.b", l0 + li);
            if ((st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 1, nw, fb, (uint64_t)kvd * 4, err))) goto fail;
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
    free(cg), free(seg), free(x), free(A), free(V), free(ev), free(bx), free(fb);
    return st;
}
