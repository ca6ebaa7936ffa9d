/* RidgeFill calibration: one exact forward over calibration text; rows sampled with a
 * stride; fp64 accumulation of XᵀX, XᵀY_l and the means (X = split stream, Y_l = input
 * of late layer l); λ chosen on held-out rows; one Cholesky per λ; maps serialised. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_fitters.h"
#include "rk_linalg.h"

/* Raw fp64 moments of one set of rows (training or held-out). */
typedef struct moments {
    int64_t n;
    double *xx;  /* (d, d) Σ x xᵀ */
    double *x;   /* (d) Σ x */
    double *xy;  /* (n_late, d, d) Σ x y_lᵀ */
    double *y;   /* (n_late, d) Σ y_l */
    double *yy;  /* (n_late) Σ ||y_l||² */
    double *xdy; /* (n_late) Σ x·y_l  (identity baseline) */
    double xxt;  /* Σ ||x||² */
} moments;

typedef struct calib {
    const rk_model *m;
    int d, split, n_late, stride;
    int64_t row_counter;
    moments tr, ho;
    /* chunk buffers: sampled rows of X, and which set each went to */
    double *xc;    /* (n_batch, d) */
    double *yc;    /* (n_batch, d) */
    int32_t *rows; /* (n_batch) chunk row index of each sample */
    bool *heldout; /* (n_batch) */
    int n_s;
    /* probe rows for the token score table: X and Y at probe layers, plus token ids */
    float *probe_x; /* (cap, d) */
    float *probe_y; /* (cap, n_probe, d) */
    int32_t *probe_id;
    int64_t *probe_slot; /* (n_batch) probe row of each sample of the chunk, or -1 */
    int64_t n_probe_rows, probe_cap;
    int probe_layers[3], n_probe;
    bool normalized; /* fit rmsnorm(x_S) -> rmsnorm(x_l): the space the cache writers see */
    float eps;
    const int32_t *chunk_ids; /* ids of the segment being run */
    int64_t seg_pos0;
    /* K/V targets: Y_l = [pre-RoPE K, V, zeros] of layer l (n_embd wide: the zero columns
     * fit W = 0, b = 0 and are not written), read from the cache once the chunk has
     * written layer l, i.e. at the tap of layer l + 1 */
    bool target_kv;
    int kvd;
    const rk_session *s;
    int64_t chunk_pos0;
    double *seg_x;    /* (seg_cap, d) sampled X rows of the segment */
    int64_t *seg_pos; /* (seg_cap) their positions */
    bool *seg_ho;     /* (seg_cap) held out? */
    int seg_n, seg_cap;
    float *kvrow; /* (seg_cap, d) */
} calib;

static void moments_free(moments *mo) {
    free(mo->xx), free(mo->x), free(mo->xy), free(mo->y), free(mo->yy), free(mo->xdy);
}

static bool moments_alloc(moments *mo, int d, int n_late) {
    memset(mo, 0, sizeof *mo);
    mo->xx = calloc((size_t)d * d, sizeof(double));
    mo->x = calloc((size_t)d, sizeof(double));
    mo->xy = calloc((size_t)n_late * d * d, sizeof(double));
    mo->y = calloc((size_t)n_late * d, sizeof(double));
    mo->yy = calloc((size_t)n_late, sizeof(double));
    mo->xdy = calloc((size_t)n_late, sizeof(double));
    return mo->xx && mo->x && mo->xy && mo->y && mo->yy && mo->xdy;
}

/* 1 / rms(x), the factor RMSNorm applies before its weight. */
static double row_inv_rms(const float *x, int d, float eps) {
    double ss = 0;
    for (int j = 0; j < d; j++) ss += (double)x[j] * x[j];
    return 1.0 / sqrt(ss / d + eps);
}

/* Adds n sampled rows to the moments of late layer li: X rows (n, d) with their set
 * (held out or not), targets Y row i at y + (idx ? idx[i] : i) * d. Scratch: yc (2n rows). */
static void accum_y(calib *c, int li, int n, const double *X, const bool *heldout, const float *y_rows,
                    const int32_t *idx) {
    const int d = c->d;
    for (int set = 0; set < 2; set++) {
        moments *mo = set ? &c->ho : &c->tr;
        double *xs = c->yc + (size_t)n * d; /* second half of yc: X rows of this set */
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (heldout[i] != (set == 1)) continue;
            const float *y = y_rows + (size_t)(idx ? idx[i] : i) * d;
            const double sy = c->normalized ? row_inv_rms(y, d, c->eps) : 1.0;
            double dot = 0, sq = 0;
            for (int j = 0; j < d; j++) {
                double v = y[j] * sy;
                c->yc[(size_t)k * d + j] = v;
                mo->y[(size_t)li * d + j] += v;
                sq += v * v;
                dot += v * X[(size_t)i * d + j];
            }
            mo->yy[li] += sq;
            mo->xdy[li] += dot;
            memcpy(xs + (size_t)k * d, X + (size_t)i * d, (size_t)d * sizeof(double));
            k++;
        }
        if (k) rk_linalg_dgemm_atb_acc(d, d, k, xs, c->yc, mo->xy + (size_t)li * d * d);
    }
}

/* K/V targets, after a segment's eval (the cache holds its rows): Y_l = [pre-RoPE K, V,
 * zeros] of every sampled row of the segment, for every late layer. */
static rk_status accum_kv(calib *c, rk_err *err) {
    const int d = c->d;
    for (int li = 0; li < c->n_late; li++) {
        const int l = c->split + 1 + li;
        memset(c->kvrow, 0, (size_t)c->seg_n * d * sizeof(float));
        for (int i = 0; i < c->seg_n; i++) {
            rk_status st = rk_session_kv_rows(c->s, l, false, true, c->seg_pos[i], 1, c->kvrow + (size_t)i * d, err);
            if (!st)
                st = rk_session_kv_rows(c->s, l, true, false, c->seg_pos[i], 1, c->kvrow + (size_t)i * d + c->kvd, err);
            if (st) return rk_err_wrap(err, "calibrate: K/V targets of layer %d", l);
        }
        accum_y(c, li, c->seg_n, c->seg_x, c->seg_ho, c->kvrow, NULL);
    }
    c->seg_n = 0;
    return RK_OK;
}

static void tap(void *ud, int layer, const float *x, int64_t n, int64_t pos0) {
    calib *c = ud;
    const int d = c->d;
    if (layer == c->split) {
        c->n_s = 0;
        c->chunk_pos0 = pos0;
        for (int64_t r = 0; r < n; r++) {
            if ((c->row_counter++ % c->stride) != 0) continue;
            int i = c->n_s++;
            c->rows[i] = (int32_t)r;
            /* every 5th sampled row is held out for choosing λ */
            c->heldout[i] = (c->tr.n + c->ho.n) % 5 == 4;
            moments *mo = c->heldout[i] ? &c->ho : &c->tr;
            mo->n++;
            const double sx = c->normalized ? row_inv_rms(x + r * d, d, c->eps) : 1.0;
            for (int j = 0; j < d; j++) {
                double v = x[r * d + j] * sx;
                c->xc[(size_t)i * d + j] = v;
                mo->x[j] += v;
                mo->xxt += v * v;
            }
            c->probe_slot[i] = -1;
            if (c->probe_x && !c->heldout[i] && c->n_probe_rows < c->probe_cap) {
                for (int j = 0; j < d; j++) c->probe_x[c->n_probe_rows * d + j] = (float)c->xc[(size_t)i * d + j];
                c->probe_id[c->n_probe_rows] = c->chunk_ids[pos0 - c->seg_pos0 + r];
                c->probe_slot[i] = c->n_probe_rows++;
            }
        }
        if (c->target_kv) /* kept for accum_kv after the segment */
            for (int i = 0; i < c->n_s && c->seg_n < c->seg_cap; i++) {
                memcpy(c->seg_x + (size_t)c->seg_n * d, c->xc + (size_t)i * d, (size_t)d * sizeof(double));
                c->seg_pos[c->seg_n] = pos0 + c->rows[i];
                c->seg_ho[c->seg_n++] = c->heldout[i];
            }
        /* XᵀX for each set: gather the set's rows contiguously in yc as scratch */
        for (int set = 0; set < 2; set++) {
            moments *mo = set ? &c->ho : &c->tr;
            int k = 0;
            for (int i = 0; i < c->n_s; i++)
                if (c->heldout[i] == (set == 1))
                    memcpy(c->yc + (size_t)k++ * d, c->xc + (size_t)i * d, (size_t)d * sizeof(double));
            if (k) rk_linalg_dgemm_atb_acc(d, d, k, c->yc, c->yc, mo->xx);
        }
        return;
    }
    if (layer <= c->split || layer >= c->split + 1 + c->n_late || c->n_s == 0 || c->target_kv) return;
    accum_y(c, layer - c->split - 1, c->n_s, c->xc, c->heldout, x, c->rows);
    for (int p = 0; p < c->n_probe; p++)
        if (layer == c->probe_layers[p] && c->probe_x)
            for (int i = 0; i < c->n_s; i++)
                if (c->probe_slot[i] >= 0) {
                    const float *y = x + (size_t)c->rows[i] * d;
                    const double sy = c->normalized ? row_inv_rms(y, d, c->eps) : 1.0;
                    float *dst = c->probe_y + ((size_t)c->probe_slot[i] * c->n_probe + p) * d;
                    for (int j = 0; j < d; j++) dst[j] = (float)(y[j] * sy);
                }
}

/* Σ over a set of (a - μa)(b - μb)ᵀ from raw sums: S_ab - s_a μbᵀ - μa s_bᵀ + n μa μbᵀ. */
static void centre(int d, const double *s_ab, const double *s_a, const double *s_b, const double *mu_a,
                   const double *mu_b, double n, double *out) {
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++)
            out[(size_t)i * d + j] =
                s_ab[(size_t)i * d + j] - s_a[i] * mu_b[j] - mu_a[i] * s_b[j] + n * mu_a[i] * mu_b[j];
}

static void moments_add(moments *dst, const moments *src, int d, int n_late) {
    dst->n += src->n;
    dst->xxt += src->xxt;
    for (size_t i = 0; i < (size_t)d * d; i++) dst->xx[i] += src->xx[i];
    for (int i = 0; i < d; i++) dst->x[i] += src->x[i];
    for (size_t i = 0; i < (size_t)n_late * d * d; i++) dst->xy[i] += src->xy[i];
    for (size_t i = 0; i < (size_t)n_late * d; i++) dst->y[i] += src->y[i];
    for (int i = 0; i < n_late; i++) dst->yy[i] += src->yy[i], dst->xdy[i] += src->xdy[i];
}

/* Fits W (d x n_late·d, W_l in column block l) for relative λ from the moments mo.
 * Also returns the means. false when the system is singular. */
static bool fit(const moments *mo, int d, int n_late, double lambda_rel, double *W, double *mu_x, double *mu_y,
                double *A) {
    const double n = (double)mo->n;
    for (int i = 0; i < d; i++) mu_x[i] = mo->x[i] / n;
    for (int i = 0; i < n_late * d; i++) mu_y[i] = mo->y[i] / n;
    centre(d, mo->xx, mo->x, mo->x, mu_x, mu_x, n, A);
    double tr = 0;
    for (int i = 0; i < d; i++) tr += A[(size_t)i * d + i];
    double lam = lambda_rel * (tr / d);
    if (!(lam > 0)) lam = 1e-12;
    for (int i = 0; i < d; i++) A[(size_t)i * d + i] += lam;
    double *tmp = malloc((size_t)d * d * sizeof(double));
    if (!tmp) return false;
    for (int l = 0; l < n_late; l++) {
        centre(d, mo->xy + (size_t)l * d * d, mo->x, mo->y + (size_t)l * d, mu_x, mu_y + (size_t)l * d, n, tmp);
        for (int i = 0; i < d; i++)
            memcpy(W + (size_t)i * n_late * d + (size_t)l * d, tmp + (size_t)i * d, (size_t)d * sizeof(double));
    }
    free(tmp);
    if (!rk_linalg_cholesky(d, A)) return false;
    rk_linalg_chol_solve(d, A, W, n_late * d);
    return true;
}

/* Held-out relative error per late layer of the fit (W, means from training). */
static bool heldout_err(const moments *ho, int d, int n_late, const double *W, const double *mu_x, const double *mu_y,
                        float *rel, float *rel_identity) {
    const double nh = (double)ho->n;
    double *sxx = malloc((size_t)d * d * sizeof(double));
    double *sxy = malloc((size_t)d * d * sizeof(double));
    double *aw = malloc((size_t)d * n_late * d * sizeof(double));
    if (!sxx || !sxy || !aw) {
        free(sxx), free(sxy), free(aw);
        return false;
    }
    centre(d, ho->xx, ho->x, ho->x, mu_x, mu_x, nh, sxx);
    rk_linalg_dgemm(d, n_late * d, d, sxx, W, aw);
    for (int l = 0; l < n_late; l++) {
        const double *my = mu_y + (size_t)l * d, *hy = ho->y + (size_t)l * d;
        centre(d, ho->xy + (size_t)l * d * d, ho->x, hy, mu_x, my, nh, sxy);
        double syy = ho->yy[l], hy2 = 0;
        for (int j = 0; j < d; j++) syy += -2 * my[j] * hy[j] + nh * my[j] * my[j], hy2 += hy[j] * hy[j];
        double e = syy;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                double w = W[(size_t)i * n_late * d + (size_t)l * d + j];
                e += -2 * w * sxy[(size_t)i * d + j] + w * aw[(size_t)i * n_late * d + (size_t)l * d + j];
            }
        double var = ho->yy[l] - hy2 / nh;
        rel[l] = (float)(e / var);
        if (rel_identity) rel_identity[l] = (float)((ho->yy[l] - 2 * ho->xdy[l] + ho->xxt) / var);
    }
    free(sxx), free(sxy), free(aw);
    return true;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Map rows quantised to the file dtype: row o of M_l holds column o of W_l. */
static rk_status add_map(rk_gguf_writer *w, int l, int d, int n_out, int n_late, int li, const double *W,
                         uint32_t dtype, const double *bias, rk_err *err) {
    uint64_t row_bytes;
    if (!rk_dtype_row_bytes(dtype, (uint64_t)d, &row_bytes))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "calibrate: map dtype %s needs n_embd %d to be a multiple of its block", rk_dtype_name(dtype),
                          d);
    unsigned char *buf = malloc((size_t)row_bytes * n_out);
    float *row = malloc((size_t)d * sizeof(float));
    if (!buf || !row) {
        free(buf), free(row);
        return rk_err_set(err, RK_E_NOMEM, "calibrate: out of memory");
    }
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < d; i++) row[i] = (float)W[(size_t)i * n_late * d + (size_t)li * d + o];
        unsigned char *dst = buf + (size_t)o * row_bytes;
        if (dtype == RK_DT_F32) {
            memcpy(dst, row, (size_t)d * sizeof(float));
        } else if (dtype == RK_DT_F16 || dtype == RK_DT_BF16) {
            for (int i = 0; i < d; i++) {
                uint16_t h = dtype == RK_DT_F16 ? rk_f32_to_f16(row[i]) : rk_f32_to_bf16(row[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
        } else { /* q8_0: per 32 values an f16 scale amax/127 and int8 round(x/scale) */
            for (int b = 0; b < d / 32; b++) {
                float amax = 0;
                for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(row[b * 32 + i]));
                float sc = amax / 127.0f, inv = sc > 0 ? 1.0f / sc : 0.0f;
                uint16_t h = rk_f32_to_f16(sc);
                memcpy(dst + b * 34, &h, 2);
                for (int i = 0; i < 32; i++) {
                    long q = lrintf(row[b * 32 + i] * inv);
                    dst[b * 34 + 2 + i] = (unsigned char)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
                }
            }
        }
    }
    char name[64];
    int64_t ne[2] = {d, n_out}, ne_b[1] = {n_out};
    snprintf(name, sizeof name, "ridge.%d.weight", l);
    rk_status st = rk_gguf_writer_add_tensor(w, name, dtype, 2, ne, buf, row_bytes * (uint64_t)n_out, err);
    for (int i = 0; i < n_out; i++) row[i] = (float)bias[i];
    snprintf(name, sizeof name, "ridge.%d.bias", l);
    if (!st) st = rk_gguf_writer_add_tensor(w, name, RK_DT_F32, 1, ne_b, row, (uint64_t)n_out * sizeof(float), err);
    free(buf), free(row);
    return st;
}

/* Per-token-id hard-token scores from the probe rows: the mean relative prediction
 * error of rows with that id (shrunk towards the global mean with 5 pseudo-rows), and
 * the quantiles of the row scores, so a keep share maps to a threshold. */
static rk_status token_scores(calib *c, const double *W, const double *mu_x, const double *mu_y, float *score,
                              float *quant, int n_vocab, rk_err *err) {
    const int d = c->d, nl = c->n_late;
    int64_t n = c->n_probe_rows;
    double *cnt = calloc((size_t)n_vocab, sizeof(double)), *sum = calloc((size_t)n_vocab, sizeof(double));
    float *row_err = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    double *xc = malloc((size_t)d * sizeof(double));
    if (!cnt || !sum || !row_err || !xc) {
        free(cnt), free(sum), free(row_err), free(xc);
        return rk_err_set(err, RK_E_NOMEM, "calibrate: out of memory for token scores");
    }
    double total = 0;
    for (int64_t r = 0; r < n; r++) {
        for (int i = 0; i < d; i++) xc[i] = c->probe_x[r * d + i] - mu_x[i];
        double e = 0, v = 0;
        for (int p = 0; p < c->n_probe; p++) {
            int li = c->probe_layers[p] - c->split - 1;
            const float *y = c->probe_y + ((size_t)r * c->n_probe + p) * d;
            for (int j = 0; j < d; j++) {
                double yhat = mu_y[(size_t)li * d + j];
                for (int i = 0; i < d; i++) yhat += W[(size_t)i * nl * d + (size_t)li * d + j] * xc[i];
                double dy = y[j] - yhat, cy = y[j] - mu_y[(size_t)li * d + j];
                e += dy * dy;
                v += cy * cy;
            }
        }
        row_err[r] = (float)(v > 0 ? e / v : 0);
        int32_t id = c->probe_id[r];
        if (id >= 0 && id < n_vocab) cnt[id] += 1, sum[id] += row_err[r];
        total += row_err[r];
    }
    double g = n > 0 ? total / (double)n : 0;
    for (int v = 0; v < n_vocab; v++) score[v] = (float)((sum[v] + 5.0 * g) / (cnt[v] + 5.0));
    for (int64_t r = 0; r < n; r++) {
        int32_t id = c->probe_id[r];
        row_err[r] = id >= 0 && id < n_vocab ? score[id] : (float)g;
    }
    qsort(row_err, (size_t)n, sizeof(float), cmp_float);
    for (int q = 0; q <= 100; q++) quant[q] = n > 0 ? row_err[(size_t)((double)q / 100.0 * (double)(n - 1))] : 0.0f;
    free(cnt), free(sum), free(row_err), free(xc);
    return RK_OK;
}

rk_status rk_calibrate(const rk_model *m, const int32_t *ids, size_t n_ids, const rk_calib_params *pp,
                       rk_progress_fn progress, void *ud, void **bytes, size_t *n_bytes, rk_calib_report *rep,
                       rk_err *err) {
    const rk_hparams *hp = rk_model_hparams(m);
    rk_calib_params p = *pp;
    if (p.stride <= 0) p.stride = 8;
    if (p.seg_len <= 0) p.seg_len = 1024;
    if (p.keep_share <= 0) p.keep_share = 0.1f;
    if (p.split < 1 || p.split > hp->n_layer - 2)
        return rk_err_set(err, RK_E_INVALID_ARG, "calibrate: split %d outside 1..%d", p.split, hp->n_layer - 2);
    if (p.dtype != RK_DT_F16 && p.dtype != RK_DT_BF16 && p.dtype != RK_DT_Q8_0 && p.dtype != RK_DT_F32)
        return rk_err_set(err, RK_E_UNSUPPORTED, "calibrate: map dtype %s (use f16, bf16, int8 or f32)",
                          rk_dtype_name(p.dtype));
    if (p.seg_len > hp->n_ctx_train) p.seg_len = hp->n_ctx_train;
    if (n_ids < (size_t)p.stride * 16)
        return rk_err_set(err, RK_E_INVALID_ARG, "calibrate: %zu tokens is too little text (need at least %d)", n_ids,
                          p.stride * 16);
    const int d = hp->n_embd, n_late = hp->n_layer - p.split - 1;
    {
        /* Refuse too little text before the forward pass (on a 1.5B model that pass takes
         * many minutes): at most n_ids rows + one BOS per segment pass the tap, every
         * stride-th is sampled and every 5th sample held out; the exact count is checked
         * again after the pass. */
        const bool has_bos = rk_model_add_bos(m);
        const size_t per_seg = (size_t)p.seg_len - (has_bos ? 1 : 0);
        const size_t n_seg = per_seg ? (n_ids + per_seg - 1) / per_seg : 0;
        const size_t rows = n_ids + (has_bos ? n_seg : 0);
        const size_t sampled = (rows + (size_t)p.stride - 1) / (size_t)p.stride;
        const size_t fit_rows = sampled - sampled / 5, held = sampled / 5;
        if (fit_rows < (size_t)(2 * d) || held < 8) {
            const double need_tokens = ceil((double)(2 * d) * 1.25 * p.stride);
            return rk_err_set(err, RK_E_INVALID_ARG,
                              "calibrate: %zu tokens at stride %d give at most %zu fitting rows, too few for n_embd %d "
                              "(need %d, about %.0f tokens): give more text or a smaller --stride",
                              n_ids, p.stride, fit_rows, d, 2 * d, need_tokens);
        }
    }
    rk_calib_report report;
    memset(&report, 0, sizeof report);
    calib c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.d = d;
    c.split = p.split;
    c.n_late = n_late;
    c.stride = p.stride;
    c.normalized = p.normalized_space;
    c.eps = hp->rms_eps;
    c.target_kv = p.target_kv;
    c.kvd = hp->n_head_kv * hp->head_dim;
    if (c.target_kv && (c.normalized || 2 * c.kvd > d))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          c.normalized
                              ? "calibrate: K/V targets are fitted in the raw space only (drop --normalized-space)"
                              : "calibrate: K/V targets need 2 kv_dim (%d) <= n_embd (%d)",
                          2 * c.kvd, d);
    rk_session *s = NULL;
    int32_t *seg = NULL;
    double *W = NULL, *A = NULL, *mu_x = NULL, *mu_y = NULL, *Wbest = NULL;
    float *score = NULL, *quant = NULL;
    rk_gguf_writer *w = NULL;
    rk_status st;
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = p.seg_len;
    sp.n_threads = p.n_threads;
    if ((st = rk_session_create(m, &sp, &s, err))) return st;
    c.s = s;
    const size_t nb = (size_t)sp.n_batch;
    /* sampled rows of one segment (stride-th rows, counted across segments) */
    c.seg_cap = p.seg_len / p.stride + 2;
    c.probe_cap = (int64_t)(n_ids / (size_t)p.stride) + 1;
    if (c.probe_cap > 16384) c.probe_cap = 16384;
    c.n_probe = n_late >= 3 ? 3 : n_late;
    for (int i = 0; i < c.n_probe; i++)
        c.probe_layers[i] = p.split + 1 + (int)((double)(i + 1) * n_late / (c.n_probe + 1));
    if (!moments_alloc(&c.tr, d, n_late) || !moments_alloc(&c.ho, d, n_late) ||
        !(c.xc = malloc(nb * d * sizeof(double))) ||
        !(c.yc = malloc(2 * (nb > (size_t)c.seg_cap ? nb : (size_t)c.seg_cap) * d * sizeof(double))) ||
        !(c.rows = malloc(nb * sizeof(int32_t))) || !(c.heldout = malloc(nb * sizeof(bool))) ||
        !(c.probe_slot = malloc(nb * sizeof(int64_t))) ||
        !(c.probe_x = malloc((size_t)c.probe_cap * d * sizeof(float))) ||
        !(c.probe_y = malloc((size_t)c.probe_cap * c.n_probe * d * sizeof(float))) ||
        !(c.probe_id = malloc((size_t)c.probe_cap * sizeof(int32_t))) ||
        !(seg = malloc((size_t)p.seg_len * sizeof(int32_t))) ||
        (c.target_kv && (!(c.kvrow = malloc((size_t)c.seg_cap * d * sizeof(float))) ||
                         !(c.seg_x = malloc((size_t)c.seg_cap * d * sizeof(double))) ||
                         !(c.seg_pos = malloc((size_t)c.seg_cap * sizeof(int64_t))) ||
                         !(c.seg_ho = malloc((size_t)c.seg_cap * sizeof(bool)))))) {
        st = rk_err_set(err, RK_E_NOMEM, "calibrate: out of memory for the accumulators (n_embd %d, %d late layers)", d,
                        n_late);
        goto fail;
    }
    rk_session_set_tap(s, tap, &c);
    /* ---- one exact forward over the text, in segments that start with BOS ---- */
    double t0 = rk_time_now();
    int32_t bos = rk_model_add_bos(m) ? rk_model_token_bos(m) : -1;
    size_t pos = 0;
    while (pos < n_ids) {
        size_t k = 0;
        if (bos >= 0) seg[k++] = bos;
        while (k < (size_t)p.seg_len && pos < n_ids) seg[k++] = ids[pos++];
        if (k < 16) break;
        c.chunk_ids = seg;
        c.seg_pos0 = 0;
        rk_session_reset(s);
        if ((st = rk_session_eval(s, seg, k, NULL, false, err))) goto fail;
        if (c.target_kv && (st = accum_kv(&c, err))) goto fail;
        report.n_tokens += (int64_t)k;
        if (progress && !progress(ud, (int64_t)pos, (int64_t)n_ids)) {
            st = rk_err_set(err, RK_E_CANCELLED, "calibrate: cancelled after %zu of %zu tokens", pos, n_ids);
            goto fail;
        }
    }
    report.seconds_forward = rk_time_now() - t0;
    report.n_rows = c.tr.n + c.ho.n;
    report.n_heldout = c.ho.n;
    if (c.tr.n < 2 * d || c.ho.n < 8) {
        st = rk_err_set(
            err, RK_E_INVALID_ARG,
            "calibrate: %lld sampled rows is too few for n_embd %d (need %d): give more text or a smaller --stride",
            (long long)report.n_rows, d, 2 * d);
        goto fail;
    }
    /* ---- λ on held-out rows, then the final fit on every row ---- */
    t0 = rk_time_now();
    const size_t wsz = (size_t)d * n_late * d;
    W = malloc(wsz * sizeof(double));
    Wbest = malloc(wsz * sizeof(double));
    A = malloc((size_t)d * d * sizeof(double));
    mu_x = malloc((size_t)d * sizeof(double));
    mu_y = malloc((size_t)n_late * d * sizeof(double));
    if (!W || !Wbest || !A || !mu_x || !mu_y) {
        st = rk_err_set(err, RK_E_NOMEM, "calibrate: out of memory for the solve");
        goto fail;
    }
    static const double grid[] = {1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1};
    double best = INFINITY, lam = p.lambda;
    float rel[256], rel_id[256];
    const int n_rep = n_late < 256 ? n_late : 256;
    for (size_t gi = 0; gi < sizeof grid / sizeof grid[0]; gi++) {
        if (p.lambda >= 0 && gi > 0) break;
        double l_try = p.lambda >= 0 ? p.lambda : grid[gi];
        if (!fit(&c.tr, d, n_late, l_try, W, mu_x, mu_y, A)) continue;
        float r[256];
        float *big = malloc((size_t)n_late * sizeof(float)), *big_id = malloc((size_t)n_late * sizeof(float));
        if (!big || !big_id || !heldout_err(&c.ho, d, n_late, W, mu_x, mu_y, big, big_id)) {
            free(big), free(big_id);
            st = rk_err_set(err, RK_E_NOMEM, "calibrate: out of memory for held-out errors");
            goto fail;
        }
        double mean = 0;
        for (int l = 0; l < n_late; l++) mean += big[l] / n_late;
        if (report.n_lambda < 16) {
            report.lambda_tried[report.n_lambda] = (float)l_try;
            report.lambda_err[report.n_lambda++] = (float)mean;
        }
        for (int l = 0; l < n_rep; l++) r[l] = big[l], rel_id[l] = big_id[l];
        free(big), free(big_id);
        if (mean < best) {
            best = mean;
            lam = l_try;
            memcpy(rel, r, sizeof(float) * (size_t)n_rep);
        }
    }
    if (!isfinite(best)) {
        st = rk_err_set(err, RK_E_INTERNAL, "calibrate: XᵀX + λI is not positive definite for any λ tried");
        goto fail;
    }
    report.lambda = (float)lam;
    for (int l = 0; l < n_rep; l++)
        report.heldout_rel_err[l] = rel[l], report.identity_rel_err[l] = c.target_kv ? NAN : rel_id[l];
    moments_add(&c.tr, &c.ho, d, n_late);
    if (!fit(&c.tr, d, n_late, lam, W, mu_x, mu_y, A)) {
        st = rk_err_set(err, RK_E_INTERNAL, "calibrate: final fit failed (λ %g)", lam);
        goto fail;
    }
    score = malloc((size_t)hp->n_vocab * sizeof(float));
    quant = malloc(101 * sizeof(float));
    if (!score || !quant) {
        st = rk_err_set(err, RK_E_NOMEM, "calibrate: out of memory");
        goto fail;
    }
    if (!c.target_kv && (st = token_scores(&c, W, mu_x, mu_y, score, quant, hp->n_vocab, err))) goto fail;
    report.seconds_solve = rk_time_now() - t0;
    /* ---- the map file ---- */
    const char *dt = p.dtype == RK_DT_Q8_0 ? "int8" : rk_dtype_name(p.dtype);
    if ((st = rk_gguf_writer_create(32, &w, err)) ||
        (st = rk_gguf_writer_set_str(w, "general.type", "ridgekv.ridge_maps", err)) ||
        (st = rk_gguf_writer_set_str(w, "general.name", "ridgekv ridge maps", err)) ||
        (st = rk_gguf_writer_set_u32(w, "ridge.split", (uint32_t)p.split, err)) ||
        (st = rk_gguf_writer_set_f32(w, "ridge.lambda", (float)lam, err)) ||
        (st = rk_gguf_writer_set_str(w, "ridge.lambda_rule", p.lambda >= 0 ? "given" : "heldout", err)) ||
        (st = rk_gguf_writer_set_u64(w, "ridge.calib_tokens", (uint64_t)report.n_tokens, err)) ||
        (st = rk_gguf_writer_set_u64(w, "ridge.calib_rows", (uint64_t)report.n_rows, err)) ||
        (st = rk_gguf_writer_set_u32(w, "ridge.stride", (uint32_t)p.stride, err)) ||
        (st = rk_gguf_writer_set_str(w, "ridge.dtype", dt, err)) ||
        (st = rk_gguf_writer_set_str(w, "ridge.space", c.normalized ? "normalized" : "raw", err)) ||
        (st = rk_gguf_writer_set_str(w, "ridge.target", c.target_kv ? "kv" : "input", err)) ||
        (st = rk_gguf_writer_set_f32(w, "ridge.keep_share", p.keep_share, err)) ||
        (st = rk_fingerprint_write(w, "ridge.model", m, err)))
        goto fail;
    for (int l = p.split + 1; l < hp->n_layer; l++) {
        int li = l - p.split - 1;
        /* b_l = μy - Wᵀ μx: the map acts on uncentred x */
        double *bias = Wbest; /* scratch */
        for (int j = 0; j < d; j++) {
            double b = mu_y[(size_t)li * d + j];
            for (int i = 0; i < d; i++) b -= W[(size_t)i * n_late * d + (size_t)li * d + j] * mu_x[i];
            bias[j] = b;
        }
        if ((st = add_map(w, l, d, c.target_kv ? 2 * c.kvd : d, n_late, li, W, p.dtype, bias, err))) goto fail;
    }
    int64_t ne1[1] = {hp->n_vocab}, ne101[1] = {101}, nel[1] = {n_rep};
    if ((!c.target_kv && (st = rk_gguf_writer_add_tensor(w, "ridge.token_score", RK_DT_F32, 1, ne1, score,
                                                         (uint64_t)hp->n_vocab * sizeof(float), err))) ||
        (!c.target_kv && (st = rk_gguf_writer_add_tensor(w, "ridge.score_quantiles", RK_DT_F32, 1, ne101, quant,
                                                         101 * sizeof(float), err))) ||
        (st = rk_gguf_writer_add_tensor(w, "ridge.heldout_rel_err", RK_DT_F32, 1, nel, rel,
                                        (uint64_t)n_rep * sizeof(float), err)) ||
        (st = rk_gguf_writer_finish(w, bytes, n_bytes, err)))
        goto fail;
    if (rep) *rep = report;
    st = RK_OK;
fail:
    rk_gguf_writer_destroy(w);
    free(W), free(Wbest), free(A), free(mu_x), free(mu_y), free(score), free(quant), free(seg);
    moments_free(&c.tr);
    moments_free(&c.ho);
    free(c.xc), free(c.yc), free(c.rows), free(c.heldout), free(c.probe_slot), free(c.probe_x), free(c.probe_y);
    free(c.probe_id), free(c.kvrow), free(c.seg_x), free(c.seg_pos), free(c.seg_ho);
    rk_session_destroy(s);
    return st;
}

bool rk_ridge_fit_rows(int d, int m, int64_t n, const double *X, const double *Y, double lambda_rel, double *W,
                       double *b) {
    /* the same centring, Cholesky and solve as calibration, on rows given directly */
    if (m % d != 0) return false;
    moments mo;
    if (!moments_alloc(&mo, d, m / d)) {
        moments_free(&mo);
        return false;
    }
    const int n_late = m / d;
    mo.n = n;
    rk_linalg_dgemm_atb_acc(d, d, (int)n, X, X, mo.xx);
    for (int64_t r = 0; r < n; r++)
        for (int i = 0; i < d; i++) mo.x[i] += X[r * d + i];
    double *yl = malloc((size_t)n * d * sizeof(double));
    double *mu_x = malloc((size_t)d * sizeof(double)), *mu_y = malloc((size_t)m * sizeof(double));
    double *A = malloc((size_t)d * d * sizeof(double));
    bool ok = yl && mu_x && mu_y && A;
    for (int l = 0; ok && l < n_late; l++) {
        for (int64_t r = 0; r < n; r++)
            for (int j = 0; j < d; j++) {
                yl[r * d + j] = Y[r * m + (int64_t)l * d + j];
                mo.y[(size_t)l * d + j] += yl[r * d + j];
            }
        rk_linalg_dgemm_atb_acc(d, d, (int)n, X, yl, mo.xy + (size_t)l * d * d);
    }
    ok = ok && fit(&mo, d, n_late, lambda_rel, W, mu_x, mu_y, A);
    for (int j = 0; ok && j < m; j++) {
        double v = mu_y[j];
        for (int i = 0; i < d; i++) v -= W[(size_t)i * m + j] * mu_x[i];
        b[j] = v;
    }
    free(yl), free(mu_x), free(mu_y), free(A);
    moments_free(&mo);
    return ok;
}
