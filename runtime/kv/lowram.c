/* LowRAM: asymmetric KV compression (SPEC §3): the parameters' resolution against the
 * model (their defaults and key table are in runtime/params.c), the session hooks called by
 * forward.c, byte accounting and the codec's lifetime. The fit lives in lowram_fit.c,
 * attention in lowram_attn.c, the eigensolver in runtime/linalg/linalg.c, files in lowram_file.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lowram_impl.h"
#include "rk_kernels.h"

/* Fills defaults for zero fields and checks ranges against the model. */
static rk_status resolve(rk_lowram_params *p, const rk_kv *hp, rk_err *err) {
    const rk_lowram_params d = rk_lowram_params_default();
    if (!(p->ratio > 0)) p->ratio = d.ratio;
    if (p->group <= 0) p->group = d.group;
    if (p->group > hp->n_layer) p->group = hp->n_layer;
    if (p->window <= 0) p->window = d.window;
    p->n_sink = p->n_sink == 0 ? d.n_sink : p->n_sink < 0 ? 0 : p->n_sink;
    if (p->chunk <= 0) p->chunk = d.chunk;
    if (p->chunk > 32) return rk_err_set(err, RK_E_INVALID_ARG, "lowram: chunk %d above 32", p->chunk);
    if (p->resid_share < 0) p->resid_share = d.resid_share;
    if (p->resid_share > 1)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: resid share %g above 1", (double)p->resid_share);
    if (!(p->mass_keep >= 0 && p->mass_keep <= 1)) /* (more than resid_share: all of the residual rows) */
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: vkeep %g outside [0, 1]", (double)p->mass_keep);
    if (p->mass_pool == 0) p->mass_pool = 8; /* -1 (vpool=0) stays: no pooling */
    if (p->mass_pin < 0) p->mass_pin = 4;
    if (p->full_layers < 0) p->full_layers = 2;
    if (p->full_layers > LR_FULL_MAX)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: full %d above %d", p->full_layers, LR_FULL_MAX);
    if (!(p->full_min > 0)) p->full_min = 0.02f;
    if (p->mass_pin > LR_PIN_MAX)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: vpin %d above %d", p->mass_pin, LR_PIN_MAX);
    if (p->budget <= 0) p->budget = d.budget;
    if (!(p->topp >= 0 && p->topp <= 1))
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: topp %g outside [0, 1]", (double)p->topp);
    if (p->min_chunks <= 0) p->min_chunks = 2;
    if (p->key_rank < 0) p->key_rank = 0;
    if (p->value_rank < 0) p->value_rank = 0;
    if (p->hyst == 0) p->hyst = d.hyst;
    /* kc_extra <= 0: spare key-cache slots sized when the key cache is allocated, from the
     * compressed rows then (lr_kc_spare) */
    if (p->kc_extra < 0) p->kc_extra = 0;
    if (p->coarse <= 1) p->coarse = 0;
    if (!(p->coarse_keep >= 1)) p->coarse_keep = 4.0f;
    if (p->coarse && (p->topp > 0 || p->bound))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "lowram: coarse=%d selects by landmark under a fixed budget (not with %s)", p->coarse,
                          p->topp > 0 ? "topp" : "bound");
    if (p->fit_min < 0) p->fit_min = 0; /* start=0 (stored as -1): no threshold; 0: the default, set at init */
    if (p->kc_type == RK_DT_F32) p->kc_type = d.kc_type;
    if (p->kc_type != RK_DT_F16 && p->kc_type != RK_DT_Q8_0)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: key-cache type %s (f16 or int8)", rk_dtype_name(p->kc_type));
    if (p->hyst < 0) p->hyst = 0; /* resolved: 0 is off */
    if (p->coef_type != RK_DT_F16 && p->coef_type != RK_DT_F32 && p->coef_type != RK_DT_Q8_0)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: coefficient type %s (f16, f32 or int8)",
                          rk_dtype_name(p->coef_type));
    if (p->resid_type == RK_DT_F32) p->resid_type = RK_DT_Q4_0; /* unset: int4 (docs/LOWRAM.md) */
    if (p->resid_type != RK_DT_Q8_0 && p->resid_type != RK_DT_Q4_0 && p->resid_type != RK_DT_F16)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: residual type %s (int8, int4 or f16)",
                          rk_dtype_name(p->resid_type));
    if (p->resid_type == RK_DT_Q4_0 && hp->head_dim % 2)
        return rk_err_set(err, RK_E_UNSUPPORTED, "lowram: int4 residuals need an even head dim (%d)", hp->head_dim);
    if (!(p->evict >= 0 && p->evict <= 0.95f))
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: evict share %g outside [0, 0.95]", (double)p->evict);
    if (p->obs_window <= 0) p->obs_window = d.obs_window;
    if (!(p->lambda > 0)) p->lambda = d.lambda;
    if (p->max_fit_rows <= 0) p->max_fit_rows = d.max_fit_rows;
    if (p->exact_type != RK_DT_F16 && p->exact_type != RK_DT_F32)
        return rk_err_set(err, RK_E_INVALID_ARG, "lowram: exact row type %s (f16 or f32)",
                          rk_dtype_name(p->exact_type));
    if (p->values_exact) p->resid_share = 1.0f, p->resid_type = RK_DT_F16;
    if (hp->n_head_kv > 64) return rk_err_set(err, RK_E_UNSUPPORTED, "lowram: %d KV heads (at most 64)", hp->n_head_kv);
    if (hp->n_rot % 2 || hp->n_rot > hp->head_dim || hp->n_rot > LR_ROPE_MAX)
        return rk_err_set(err, RK_E_UNSUPPORTED, "lowram: rotary dims %d of head dim %d", hp->n_rot, hp->head_dim);
    return RK_OK;
}

/* ---- the codec's lifetime ------------------------------------------------------------- */

void lr_fit_release(rk_kv_codec *c) {
    lr_scratch_free(c);
    for (int gi = 0; c->g && gi < c->n_group; gi++) {
        lr_group *g = &c->g[gi];
        free(g->mean), free(g->wdim), free(g->winv), free(g->basis), free(g->pos), free(g->coef), free(g->cmean);
        free(g->open_c);
        g->mean = g->wdim = g->winv = NULL, g->basis = NULL, g->pos = NULL, g->coef = NULL, g->cmean = NULL;
        g->open_c = NULL, g->n_rows = 0;
    }
    for (int l = 0; c->ly && l < c->n_layer; l++) {
        lr_layer *L = &c->ly[l];
        free(L->W), free(L->b), free(L->lmk), free(L->open_sum), free(L->lmin), free(L->lmax), free(L->open_min);
        free(L->open_max), free(L->vsm), free(L->clmk);
        L->W = NULL, L->b = NULL, L->lmk = NULL, L->open_sum = NULL, L->lmin = L->lmax = NULL;
        L->open_min = L->open_max = NULL, L->vsm = NULL, L->clmk = NULL;
        L->vs_n = 0, L->vs_last = 0, L->cl_n = 0;
        for (int h = 0; L->h && h < c->n_head_kv; h++) {
            lr_head *H = &L->h[h];
            free(H->res), free(H->mask), free(H->base);
            H->res = NULL, H->mask = NULL, H->base = NULL, H->n_res = 0;
        }
    }
}

void lr_codec_free(rk_kv_codec *c) {
    if (!c) return;
    lr_fit_release(c);
    for (int l = 0; c->ly && l < c->n_layer; l++) free(c->ly[l].h);
    if (c->x_hi) lr_exact_free(c);
    lr_dense_free(c);
    free(c->xk), free(c->xv), free(c->x_hi);
    free(c->g), free(c->ly), free(c->freq), free(c->rope_hi), free(c->rope_lo), free(c->qsq), free(c->obs_q),
        free(c->obs_pos), free(c->obs_n);
    free(c->sel_miss), free(c->r2);
    rk_gguf_destroy(c->pgguf);
    rk_mapping_close(&c->pmap);
    if (c->own_pool) rk_pool_destroy(c->pool);
    free(c);
}

rk_status lr_codec_new(const rk_kv *kv, const rk_lowram_params *p, int n_threads, rk_kv_codec **out, rk_err *err) {
    rk_kv_codec *c = calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory");
    c->p = *p;
    c->cmean_on = !p->no_summary; /* summary rows read the chunk means */
    c->n_layer = kv->n_layer, c->n_head = kv->n_head, c->n_head_kv = kv->n_head_kv, c->hd = kv->head_dim;
    c->kvd = kv->kv_dim, c->n_rot = kv->n_rot, c->rope_mode = kv->rope_mode;
    c->n_ctx = kv->n_ctx;
    c->be = kv->be;
    c->n_threads = n_threads;
    c->cap_chunks = (c->n_ctx + c->p.chunk - 1) / c->p.chunk;
    c->res_bytes = c->p.resid_type == RK_DT_Q8_0   ? 2u + (size_t)c->hd
                   : c->p.resid_type == RK_DT_Q4_0 ? 2u + (size_t)c->hd / 2
                                                   : 2u * (size_t)c->hd;
    c->wide = c->p.coef_type == RK_DT_F32;
    c->comp_end = c->p.n_sink;
    c->exact_type = c->p.exact_type;
    c->xrow = (size_t)c->kvd * (c->exact_type == RK_DT_F32 ? 4 : 2);
    c->kc_row = c->p.kc_type == RK_DT_Q8_0 ? 2u + (size_t)c->hd : 2u * (size_t)c->hd;
    c->n_group = (c->n_layer + c->p.group - 1) / c->p.group;
    c->g = calloc((size_t)c->n_group, sizeof *c->g);
    c->ly = calloc((size_t)c->n_layer, sizeof *c->ly);
    c->freq = malloc((size_t)(c->n_rot / 2 + 1) * sizeof(double));
    const size_t nr = c->n_rot > 0 ? (size_t)c->n_rot : 1;
    c->rope_hi = malloc(((size_t)c->n_ctx / LR_ROPE_LO + 1) * nr * sizeof(float));
    c->rope_lo = malloc((size_t)LR_ROPE_LO * nr * sizeof(float));
    c->qsq = calloc((size_t)c->n_layer * c->kvd, sizeof(double));
    c->xk = calloc((size_t)c->n_layer, sizeof *c->xk);
    c->xv = calloc((size_t)c->n_layer, sizeof *c->xv);
    c->x_hi = calloc((size_t)c->n_layer, sizeof *c->x_hi);
    c->sel_miss = malloc((size_t)c->n_layer * sizeof(float));
    c->r2 = calloc((size_t)c->n_layer * c->n_head_kv, sizeof(float));
    if (!c->g || !c->ly || !c->freq || !c->rope_hi || !c->rope_lo || !c->qsq || !c->xk || !c->xv || !c->x_hi ||
        !c->sel_miss || !c->r2)
        goto nomem;
    for (int l = 0; l < c->n_layer; l++) c->sel_miss[l] = -1.0f; /* not measured */
    for (int i = 0; i < c->n_rot / 2; i++) c->freq[i] = kv->rope_freq[i];
    c->rope_ms = kv->rope_mscale;
    c->rope = kv->rope;
    for (int64_t k = 0; k <= c->n_ctx / LR_ROPE_LO || k < LR_ROPE_LO; k++)
        for (int i = 0; i < c->n_rot / 2; i++) {
            const double th = (double)k * c->freq[i];
            if (k <= c->n_ctx / LR_ROPE_LO)
                c->rope_hi[k * c->n_rot + 2 * i] = (float)cos(th * LR_ROPE_LO),
                                              c->rope_hi[k * c->n_rot + 2 * i + 1] = (float)sin(th * LR_ROPE_LO);
            if (k < LR_ROPE_LO)
                c->rope_lo[k * c->n_rot + 2 * i] = (float)cos(th),
                                              c->rope_lo[k * c->n_rot + 2 * i + 1] = (float)sin(th);
        }
    c->rope_base = kv->rope_base;
    for (int gi = 0; gi < c->n_group; gi++) {
        lr_group *g = &c->g[gi];
        g->l0 = gi * c->p.group;
        g->n_l = c->n_layer - g->l0 < c->p.group ? c->n_layer - g->l0 : c->p.group;
        g->D = g->n_l * c->kvd;
        if (g->D > c->D_max) c->D_max = g->D;
        for (int li = 0; li < g->n_l; li++) {
            lr_layer *L = &c->ly[g->l0 + li];
            L->grp = gi, L->li = li;
            L->h = calloc((size_t)c->n_head_kv, sizeof *L->h);
            if (!L->h) goto nomem;
        }
    }
    if (c->p.evict > 0 || c->p.resid_mass || c->p.mass_keep > 0 || c->p.mass_pin > 0) {
        const size_t W = (size_t)c->p.obs_window, qd = (size_t)c->n_head * c->hd;
        c->obs_q = malloc((size_t)c->n_layer * W * qd * sizeof(float));
        c->obs_pos = malloc((size_t)c->n_layer * W * sizeof(int64_t));
        c->obs_n = calloc((size_t)c->n_layer, sizeof(int32_t));
        if (!c->obs_q || !c->obs_pos || !c->obs_n) goto nomem;
    }
    *out = c;
    return RK_OK;
nomem:
    lr_codec_free(c);
    return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory creating the codec");
}

/* The session went back to position n < n_past (truncate / reset). */
static void rewind_to(rk_kv_codec *c, int64_t n) {
    lr_truncate(c, n);
    if (n <= c->p.n_sink) {
        c->fitted = false; /* a new prompt: the next fit starts from scratch */
        c->comp_end = c->p.n_sink;
        memset(c->qsq, 0, (size_t)c->n_layer * c->kvd * sizeof(double));
        lr_exact_unfit(c, n);
    }
    if (c->obs_n) memset(c->obs_n, 0, (size_t)c->n_layer * sizeof(int32_t));
}

static void observe(rk_kv_codec *c, int l, const float *q, int64_t n_q, int64_t pos0) {
    const int W = c->p.obs_window, qd = c->n_head * c->hd;
    for (int64_t i = n_q > W ? n_q - W : 0; i < n_q; i++) {
        const int slot = c->obs_n[l] % W;
        memcpy(c->obs_q + ((size_t)l * W + slot) * qd, q + i * qd, (size_t)qd * sizeof(float));
        c->obs_pos[(size_t)l * W + slot] = pos0 + i;
        c->obs_n[l] = c->obs_n[l] + 1 == 2 * W ? W : c->obs_n[l] + 1; /* stays >= W once full */
    }
}

/* ---- the rk_kv ops ----------------------------------------------------------------------- */

/* Compression inside a long eval (pfit): when layer 0 is about to receive rows at pos0 and
 * every layer holds [0, pos0), rows before pos0 are final. Fit once pfit rows are there,
 * afterwards compress each chunk that leaves the window, so the exact rows of the whole
 * prompt never coexist with the compressed ones. A failed eval truncates back (lr_truncate
 * forgets the compressed rows, a cut at the sinks the fit). */
static rk_status prefill_step(rk_kv_codec *c, int64_t pos0, rk_err *err) {
    for (int l = 0; l < c->n_layer; l++)
        if (c->x_hi[l] != pos0) return RK_OK;
    const int64_t sink = c->p.n_sink, C = c->p.chunk;
    lr_rope_fill(c, pos0);
    if (!c->fitted) {
        if (pos0 - sink - c->p.window >= C && pos0 - sink >= 128 && pos0 >= c->p.prefill_fit && pos0 >= c->p.fit_min)
            return lr_fit(c, pos0, err);
        return RK_OK;
    }
    int64_t end = pos0 - c->p.window;
    end = end > c->comp_end ? c->comp_end + (end - c->comp_end) / C * C : c->comp_end;
    return end > c->comp_end ? lr_compress(c, end, err) : RK_OK;
}

static rk_status lowram_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    rk_kv_codec *c = kv->impl;
    if (l == 0 && c->p.prefill_fit > 0 && pos0 > c->n_past && pos0 >= c->p.prefill_fit) {
        rk_status st = prefill_step(c, pos0, err);
        if (st) return st;
    }
    if (pos0 < c->x0 || pos0 > c->x_hi[l] || n < 0 || pos0 > c->n_ctx - n)
        return rk_err_set(err, RK_E_INTERNAL, "lowram: append of rows %lld..%lld to layer %d holding [%lld, %lld)",
                          (long long)pos0, (long long)(pos0 + n), l, (long long)c->x0, (long long)c->x_hi[l]);
    if (!lr_exact_reserve(c, pos0 + n))
        return rk_err_set(err, RK_E_NOMEM, "lowram: no memory for %lld exact rows", (long long)(pos0 + n - c->x0));
    /* the backend's conversion, as for a plain cache: exact rows hold the same bits */
    rk_op_args a = {.op = RK_OP_CPY_ROWS, .dst_row0 = pos0 - c->x0};
    a.dst = (rk_view){c->exact_type, {c->kvd, c->x_cap, 1, 1}, c->xrow, c->xk[l]};
    a.src0 = (rk_view){RK_DT_F32, {c->kvd, n, 1, 1}, (size_t)c->kvd * sizeof(float), (void *)k};
    rk_status st = rk_backend_run(c->be, &a, err);
    if (st) return st;
    a.dst.data = c->xv[l];
    a.src0.data = (void *)v;
    if ((st = rk_backend_run(c->be, &a, err))) return st;
    c->x_hi[l] = pos0 + n;
    if (c->x_hi[l] - c->x0 > c->x_peak) c->x_peak = c->x_hi[l] - c->x0;
    return RK_OK;
}

/* Before the fit every row is exact and contiguous from 0: the backend's ATTN over them. */
static rk_status exact_attend(rk_kv *kv, rk_kv_codec *c, int l, const float *q, int64_t n_q, int64_t pos0, float *out,
                              rk_err *err) {
    rk_op_args at = rk_kv_attn_args(kv, q, n_q, pos0, out);
    at.src1 = (rk_view){c->exact_type, {c->kvd, pos0 + n_q, 1, 1}, c->xrow, c->xk[l]};
    at.src2 = (rk_view){c->exact_type, {c->kvd, pos0 + n_q, 1, 1}, c->xrow, c->xv[l]};
    return rk_backend_run(c->be, &at, err);
}

static rk_status lowram_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    rk_kv_codec *c = kv->impl;
    if (pos0 + n_q > c->x_hi[l])
        return rk_err_set(err, RK_E_INTERNAL, "lowram: attention over rows up to %lld of layer %d holding %lld",
                          (long long)(pos0 + n_q), l, (long long)c->x_hi[l]);
    if (c->fitted)
        return lr_dense_wanted(c, l, n_q) ? lr_dense_attend(kv, c, l, q, n_q, pos0, out, err)
                                          : lr_attention(c, l, q, n_q, pos0, out, err);
    /* prefill queries: second moments per KV-head dim for the key basis, and the last rows
     * for SnapKV / mass-weighted residuals */
    const int grp = c->n_head / c->n_head_kv, hd = c->hd;
    double *qs = c->qsq + (size_t)l * c->kvd;
    for (int64_t i = 0; i < n_q; i++)
        for (int qh = 0; qh < c->n_head; qh++) {
            const float *qv = q + (i * c->n_head + qh) * hd;
            double *t = qs + (size_t)(qh / grp) * hd;
            for (int d = 0; d < hd; d++) t[d] += (double)qv[d] * qv[d];
        }
    if (c->obs_q) observe(c, l, q, n_q, pos0);
    return exact_attend(kv, c, l, q, n_q, pos0, out, err);
}

static rk_status lowram_commit(rk_kv *kv, int64_t n, rk_err *err) {
    rk_kv_codec *c = kv->impl;
    lr_dense_free(c); /* one eval's rebuilt rows */
    lr_rope_fill(c, n);
    rk_status st = RK_OK;
    const int64_t C = c->p.chunk;
    if (!c->fitted) {
        if (lr_fit_due(c, n) && (st = lr_fit(c, n, err))) return st; /* nothing dropped: every row is still exact */
    } else {
        int64_t end = n - c->p.window;
        end = end > c->comp_end ? c->comp_end + (end - c->comp_end) / C * C : c->comp_end;
        if ((st = lr_compress(c, end, err))) return st;
    }
    c->n_past = kv->n_past = n;
    return RK_OK;
}

static void lowram_truncate(rk_kv *kv, int64_t n) {
    rk_kv_codec *c = kv->impl;
    if (!c->fitted) lr_prefit_undo(c);                     /* a staged eval that failed after its early fits */
    if (n < c->n_past || (c->fitted && n < c->comp_end)) { /* also rows compressed inside a failed eval */
        rewind_to(c, n);
        c->n_past = kv->n_past = n;
    }
    if (c->x0 > n) c->x0 = n; /* cut inside the compressed rows: comp_end = n, no exact row past it */
    for (int l = 0; l < c->n_layer; l++) c->x_hi[l] = c->x_hi[l] > n ? n : c->x_hi[l] < c->x0 ? c->x0 : c->x_hi[l];
}

/* What a fit allocated (the stores of compressed rows, sized for the context, and the
 * decode work areas) goes back after a reset: otherwise the next prompt's exact rows,
 * which grow until its own fit, sit on top of the last prompt's stores (second prompt of
 * 8000 tokens in one session on SmolLM2: peak 371 against 247 MiB for the first). The next
 * fit allocates them again (lr_group_alloc, lr_scratch_alloc). */
static void lowram_reset(rk_kv *kv) {
    rk_kv_codec *c = kv->impl;
    lowram_truncate(kv, 0);
    lr_exact_free(c); /* a new prompt grows them again */
    lr_dense_free(c);
    if (!c->fitted) lr_fit_release(c);
}

/* Row p of layer l: stored index in the layer's group, or -1 (evicted). */
static int64_t stored_index(const lr_group *g, int64_t p) {
    int64_t lo = 0, hi = g->n_rows;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (g->pos[mid] < p) lo = mid + 1;
        else hi = mid;
    }
    return lo < g->n_rows && g->pos[lo] == p ? lo : -1;
}

static rk_status lowram_read(const rk_kv *kv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                             rk_err *err) {
    const rk_kv_codec *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, c->x_hi[l], err);
    if (st) return st;
    const lr_layer *L = &c->ly[l];
    const lr_group *g = &c->g[L->grp];
    float *M = NULL, *cf = NULL, *row = NULL;
    for (int64_t i = 0; i < n; i++) {
        const int64_t p = row0 + i;
        float *d = dst + i * c->kvd;
        if (!c->fitted || p < c->p.n_sink || p >= c->comp_end) {
            lr_plain_row(c, l, values, p, d);
            if (!values && pre_rope) rk_kv_unrope(kv, d, p);
            continue;
        }
        const int64_t j = stored_index(g, p);
        if (j < 0) {
            st = rk_err_set(err, RK_E_NOT_FOUND, "lowram: row %lld of layer %d was evicted", (long long)p, l);
            break;
        }
        if (!M) { /* this layer's slice of the basis (keys) or its predictor (values), (r, kv_dim) */
            M = malloc((size_t)g->r * c->kvd * sizeof(float));
            cf = malloc((size_t)g->r * sizeof(float));
            row = malloc((size_t)c->hd * sizeof(float));
            if (!M || !cf || !row) {
                st = rk_err_set(err, RK_E_NOMEM, "lowram: out of memory reading rows");
                break;
            }
            if (values) lr_mat_f32(c, L->W, (size_t)c->kvd, 0, lr_vr(c, g), 0, c->kvd, M);
            else lr_mat_f32(c, g->basis, (size_t)g->D, 0, g->r, L->li * c->kvd, c->kvd, M);
        }
        lr_coef_rows(c, g, j, 1, cf);
        rk_linalg_matmul(1, c->kvd, values ? lr_vr(c, g) : g->r, cf, g->r, M, c->kvd, d, c->kvd);
        if (!values) { /* K = RoPE(mean + (C·B)/s) */
            const size_t off = (size_t)L->li * c->kvd;
            for (int e = 0; e < c->kvd; e++) d[e] = d[e] * g->winv[off + e] + g->mean[off + e];
            if (!pre_rope) lr_rope_row(c, d, c->n_head_kv, p, false);
            else if (c->rope_ms != 1.0)
                for (int e = 0; e < c->kvd; e++) d[e] = (float)(d[e] / c->rope_ms); /* YaRN's mscale */
            continue;
        }
        /* V = V̂ + δ where a residual is stored: out = C·W + b + δ */
        for (int e = 0; e < c->kvd; e++) d[e] += L->b[e];
        const int64_t ch = j / c->p.chunk;
        const int bit = (int)(j % c->p.chunk);
        for (int h = 0; h < c->n_head_kv; h++) {
            const lr_head *H = &L->h[h];
            if (!((H->mask[ch] >> bit) & 1u)) continue;
            const int64_t slot = H->base[ch] + __builtin_popcount(H->mask[ch] & ((1u << bit) - 1u));
            lr_res_row(c, H, slot, row);
            for (int e = 0; e < c->hd; e++) d[(size_t)h * c->hd + e] += row[e];
        }
    }
    free(M), free(cf), free(row);
    return st;
}

static rk_status lowram_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    rk_kv_codec *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, c->x_hi[l], err);
    if (st) return st;
    for (int64_t p = row0; p < row0 + n; p++)
        if (c->fitted && p >= c->p.n_sink && p < c->comp_end)
            return rk_err_set(err, RK_E_UNSUPPORTED,
                              "lowram: row %lld of layer %d is compressed: it cannot be replaced", (long long)p, l);
    for (int64_t i = 0; i < n; i++)
        rk_kv_rows_from_f32(c->exact_type, src + i * c->kvd, 1, c->kvd, (void *)lr_exact_ptr(c, l, values, row0 + i));
    return RK_OK;
}

static void lowram_bytes(const rk_kv *kv, rk_kv_bytes *o) {
    const rk_kv_codec *c = kv->impl;
    rk_kv_bytes_base(kv, o);
    const int64_t n_past = kv->n_past;
    const uint64_t row_all = 2ull * (uint64_t)c->n_layer * c->xrow; /* K and V, every layer */
    o->scratch = c->scratch_bytes;
    if (c->obs_q)
        o->scratch +=
            (uint64_t)c->n_layer * c->p.obs_window * ((uint64_t)c->n_head * c->hd * 4 + 8) + 4ull * c->n_layer;
    if (!c->fitted || c->comp_end <= c->p.n_sink) {
        o->n_exact_rows = n_past;
        o->exact = (uint64_t)n_past * row_all;
        o->total = o->exact;
        return;
    }
    const int64_t sink = c->p.n_sink < n_past ? c->p.n_sink : n_past;
    o->n_exact_rows = sink + (n_past - c->comp_end);
    o->exact = (uint64_t)o->n_exact_rows * row_all;
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        const uint64_t n_ch = (uint64_t)((g->n_rows + c->p.chunk - 1) / c->p.chunk);
        o->coef += (uint64_t)g->n_rows * g->coef_bytes;
        const uint64_t elt = c->wide ? 4 : 2;
        o->bases += 3ull * g->D * sizeof(float) + (uint64_t)g->r * g->D * elt;
        o->landmarks += (c->cmean_on ? n_ch * g->r * sizeof(uint16_t) : 0) + (uint64_t)g->r * sizeof(float);
        o->meta += (uint64_t)g->n_rows * sizeof(int32_t);
        for (int li = 0; li < g->n_l; li++) {
            const lr_layer *L = &c->ly[g->l0 + li];
            if (!c->p.values_exact)
                o->predictors += (uint64_t)lr_vr(c, g) * c->kvd * elt + (uint64_t)c->kvd * sizeof(float);
            o->landmarks += n_ch * c->kvd * sizeof(uint16_t) + (uint64_t)c->kvd * sizeof(float);
            if (c->p.bound) o->landmarks += 2 * (n_ch * c->kvd * sizeof(uint16_t) + (uint64_t)c->kvd * sizeof(float));
            /* decode's value summaries, counted for every stored chunk as soon as decode would
             * build them (they are built at its first step: an imported state counts the same) */
            if (!c->wide && !c->p.values_exact && !c->p.no_summary && !c->p.coef_summary && !c->p.dense)
                o->landmarks += n_ch * c->n_head_kv * (2u + (uint64_t)c->hd);
            /* two-level selection's coarse landmarks (per group and KV head an f16 scale and head_dim
             * int8), likewise counted once decode would build them */
            if (c->p.coarse > 1 && !c->p.dense)
                o->landmarks +=
                    (n_ch + (uint64_t)c->p.coarse - 1) / (uint64_t)c->p.coarse * c->n_head_kv * (2u + (uint64_t)c->hd);
            for (int h = 0; h < c->n_head_kv; h++) {
                o->residuals += (uint64_t)L->h[h].n_res * c->res_bytes;
                o->meta += n_ch * (sizeof(uint32_t) + sizeof(int32_t)) + sizeof(float);
                const uint64_t kc = (uint64_t)L->h[h].n_kc * ((uint64_t)c->p.chunk * c->kc_row + 16);
                if (c->p.no_cache) o->scratch += kc; /* slots live one call only */
                else o->key_cache += kc;
            }
        }
    }
    o->meta += ((uint64_t)c->n_ctx / LR_ROPE_LO + 1 + LR_ROPE_LO) * c->n_rot * sizeof(float);
    o->n_compressed_rows = c->g[0].n_rows;
    o->n_evicted_rows = (c->comp_end - c->p.n_sink) - c->g[0].n_rows;
    o->total = o->exact + o->coef + o->bases + o->predictors + o->residuals + o->landmarks + o->meta + o->key_cache;
}

static void lowram_stats(const rk_kv *kv, rk_lowram_stats *o) {
    rk_kv_codec *c = kv->impl; /* r2 is written here: the caller holds the session */
    memset(o, 0, sizeof *o);
    *o = c->stats;
    o->fitted = c->fitted;
    o->n_layer = c->n_layer, o->n_head_kv = c->n_head_kv;
    o->sel_miss = c->sel_miss;
    if (!c->fitted) return;
    o->value_r2 = c->r2;
    o->n_group = c->n_group;
    o->rank_min = 1 << 30;
    double et = 0, ek = 0, r2 = 0;
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        o->rank_min = g->r < o->rank_min ? g->r : o->rank_min;
        o->rank_max = g->r > o->rank_max ? g->r : o->rank_max;
        et += g->energy_total, ek += g->energy_kept;
    }
    o->key_rel_err = et > 0 ? 1.0 - ek / et : 0;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv; h++) {
            r2 += c->ly[l].h[h].r2;
            o->n_resid_rows += c->ly[l].h[h].n_res;
            c->r2[(size_t)l * c->n_head_kv + h] = c->ly[l].h[h].r2;
        }
    o->value_r2_mean = r2 / ((double)c->n_layer * c->n_head_kv);
    for (int t = 0; c->scr && t < c->n_threads; t++) {
        o->rows_rebuilt += c->scr[t].n_rebuilt;
        o->rows_attended += c->scr[t].n_attended;
        o->lmk_scored += c->scr[t].n_lmk;
        o->lmk_coarse += c->scr[t].n_clmk;
    }
}

static int lowram_params(const rk_kv *kv, rk_kv_param *out) { return lr_params(kv->impl, out); }

static rk_status lowram_export(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    if (row0 != 0 || row1 != kv->n_past)
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "lowram: exports its whole state only (rows [0, %lld), asked [%lld, %lld))",
                          (long long)kv->n_past, (long long)row0, (long long)row1);
    return lr_export(kv->impl, out, err);
}

static rk_status lowram_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    rk_kv_codec *c = kv->impl;
    if (row0 != 0 || kv->n_past != 0)
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "lowram: imports a whole state into an empty session only (block row0 %lld, session at %lld)",
                          (long long)row0, (long long)kv->n_past);
    /* the state goes into a new codec; only a complete, checked one replaces the old state */
    rk_kv_codec *nc = NULL;
    rk_status st = lr_codec_new(kv, &c->p, c->n_threads, &nc, err);
    if (st) return st;
    if ((st = lr_import(nc, kv, n_rows, p, n, err))) {
        lr_codec_free(nc);
        return st;
    }
    /* the pool, the predictor file and the statistics stay with the session's codec */
    rk_kv_codec t = *c;
    *c = *nc;
    *nc = t;
    c->pool = nc->pool, nc->pool = NULL;
    c->own_pool = nc->own_pool, nc->own_pool = false;
    c->pmap = nc->pmap, nc->pmap = (rk_mapping){0};
    c->pgguf = nc->pgguf, nc->pgguf = NULL;
    c->prank = nc->prank;
    const rk_lowram_stats imp = c->stats; /* the imported state's full layers (lr_import) */
    c->stats = nc->stats;
    memcpy(c->sel_miss, nc->sel_miss, (size_t)c->n_layer * sizeof(float));
    c->stats.n_full = imp.n_full;
    memcpy(c->stats.full_l, imp.full_l, sizeof imp.full_l);
    lr_codec_free(nc);
    c->n_past = kv->n_past = n_rows;
    return RK_OK;
}

static void lowram_destroy(rk_kv *kv) {
    lr_codec_free(kv->impl);
    kv->impl = NULL;
}

/* Staged prefill of the eval that fits: one stage per n_threads layer groups, so the early
 * fits run a group per thread as the end-of-eval fit does. Not with pfit or eviction (they
 * choose rows across the whole prompt), nor on a device backend (the caller's check). */
static int lowram_stages(const rk_kv *kv, int64_t n_past, int *ends, int max) {
    const rk_kv_codec *c = kv->impl;
    if (!lr_fit_due(c, n_past) || c->p.no_stage || c->p.prefill_fit > 0 || c->p.evict > 0 || c->x0 != 0 ||
        c->n_group < 2)
        return 0;
    const int per = c->n_threads > 1 ? c->n_threads : 1;
    int n = 0;
    for (int gi = per; gi < c->n_group && n < max; gi += per) ends[n++] = c->g[gi].l0;
    return n;
}

static rk_status lowram_layers_done(rk_kv *kv, int l_end, int64_t n_past, int64_t n_before, rk_err *err) {
    return lr_prefit(kv->impl, l_end, n_past, n_before, err);
}

static const rk_kv_ops lowram_ops = {
    .stages = lowram_stages,
    .layers_done = lowram_layers_done,
    .name = "lowram",
    .mem = RK_KV_MEM_HOST,
    .writable = false,
    .recordable = false,
    .append = lowram_append,
    .attend = lowram_attend,
    .commit = lowram_commit,
    .truncate = lowram_truncate,
    .reset = lowram_reset,
    .read = lowram_read,
    .write = lowram_write,
    .bytes = lowram_bytes,
    .stats = lowram_stats,
    .params = lowram_params,
    .export_rows = lowram_export,
    .import_rows = lowram_import,
    .destroy = lowram_destroy,
};

rk_status rk_kv_lowram_init(rk_kv *kv, const rk_model *m, const rk_lowram_params *pp, int n_threads, char *warning,
                            size_t warning_cap, rk_err *err) {
    rk_lowram_params p = *pp;
    /* start: by default the decode crossover (LR_START_DEFAULT rows, docs/LOWRAM.md), at
     * most half the model's trained context (a model made for short
     * contexts, such as the test models of 512, compresses its second half) */
    if (p.fit_min == 0) {
        const int64_t half = rk_model_n_ctx_max(m) / 2;
        p.fit_min = (int32_t)(half > 0 && half < LR_START_DEFAULT ? half : LR_START_DEFAULT);
    }
    rk_status st = resolve(&p, kv, err);
    if (st) return st;
    rk_kv_codec *c = NULL;
    if ((st = lr_codec_new(kv, &p, 1, &c, err))) return st;
    kv->ops = &lowram_ops;
    kv->impl = c;
    kv->row_bytes = c->xrow;
    if (c->p.predictor[0] && (st = lr_pred_open(c, m, warning, warning_cap, err))) return st;
    return rk_kv_pool_create(kv->be, c->p.n_threads > 0 ? c->p.n_threads : n_threads, &c->pool, &c->own_pool,
                             &c->n_threads, err);
}
