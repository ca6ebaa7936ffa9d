/* LowRAM decode's summary rows (built per ISA, lowram_task.h): each chunk the selection left
 * out attends as one row, its landmark as the key and its chunk size as the weight, from the
 * chunks' mean coefficients or from the layer's value summaries. */
#include "lowram_task.h"

/* Chunks not selected: one row each, key = landmark, value = V̂ of the mean coefficients,
 * weight = chunk size (log added to the score). Residuals are left out (mean ~ 0). */
void LR_ISA(lr_summaries)(const head_task *t, int64_t n_ch) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const int hd = c->hd, C = c->p.chunk, r = g->r;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
#ifdef LR_ISA_AVX2
    /* windows of C consecutive chunks, the selected ones at weight 0 (bias -inf): Σ a·c is read
     * straight from the f16 mean-coefficient rows (no f32 copy of r values per chunk and head) */
    if (t->use_c && !c->wide) {
        for (int64_t ch0 = 0; ch0 < n_ch; ch0 += C) {
            const int nb = n_ch - ch0 < C ? (int)(n_ch - ch0) : C;
            int live = 0;
            for (int k = 0; k < nb; k++) {
                const int64_t ch = ch0 + k, rows = g->n_rows - ch * C < C ? g->n_rows - ch * C : C;
                f16->to_f32(L->lmk + (size_t)ch * c->kvd + (size_t)t->h * hd, x->kb + (size_t)k * hd, hd);
                x->bias[k] = x->mark[ch] ? -INFINITY : logf((float)rows);
                live += !x->mark[ch];
            }
            if (!live) continue;
            scores(t, x->kb, nb, -1, x->bias);
            acc_rows_avx2(x->acc_c, (size_t)c->r_max, t->ns, x->sc, 1, (size_t)c->sc_ld,
                          (const uint8_t *)(g->cmean + (size_t)ch0 * r), (size_t)r * 2, LR_R_F16, nb, lr_vr(c, g));
            for (int j = 0; j < t->ns; j++)
                for (int k = 0; k < nb; k++) x->st_a[j] += x->sc[(size_t)j * c->sc_ld + k];
        }
        return;
    }
#endif
    for (int64_t ch = 0; ch < n_ch;) {
        int nb = 0;
        for (; nb < C && ch < n_ch; ch++) {
            if (x->mark[ch]) continue;
            const int64_t rows = g->n_rows - ch * C < C ? g->n_rows - ch * C : C;
            f16->to_f32(L->lmk + (size_t)ch * c->kvd + (size_t)t->h * hd, x->kb + (size_t)nb * hd, hd);
            f16->to_f32(g->cmean + (size_t)ch * r, x->cf + (size_t)nb * r, r);
            x->bias[nb++] = logf((float)rows);
        }
        if (!nb) break;
        scores(t, x->kb, nb, -1, x->bias);
#ifdef LR_ISA_AVX2
        if (t->use_c) {
            acc_rows_avx2(x->acc_c, (size_t)c->r_max, t->ns, x->sc, 1, (size_t)c->sc_ld, (const uint8_t *)x->cf,
                          (size_t)r * sizeof(float), LR_R_F32, nb, lr_vr(c, g));
            for (int j = 0; j < t->ns; j++)
                for (int k = 0; k < nb; k++) x->st_a[j] += x->sc[(size_t)j * c->sc_ld + k];
            continue;
        }
#endif
        for (int k = 0; k < nb; k++) {
            if (t->use_c && t->ns <= LR_WMAX) {
                float w[LR_WMAX];
                for (int j = 0; j < t->ns; j++) x->st_a[j] += w[j] = x->sc[(size_t)j * c->sc_ld + k];
                axpy_rows(x->acc_c, (size_t)c->r_max, w, t->ns, x->cf + (size_t)k * r, lr_vr(c, g));
                continue;
            }
            for (int j = 0; j < t->ns; j++) {
                const float w = x->sc[(size_t)j * c->sc_ld + k];
                if (t->use_c) axpy(x->acc_c + (size_t)j * c->r_max, w, x->cf + (size_t)k * r, lr_vr(c, g));
                x->st_a[j] += w;
            }
        }
    }
}

/* The same rows from the layer's value summaries: Σ a·(V̂(cmean) - b) per query head straight
 * from the int8 rows (head_dim per chunk and query head instead of r coefficients). */
void LR_ISA(lr_vsummaries)(const head_task *t, int64_t n_ch) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const int hd = c->hd, C = c->p.chunk;
    const size_t vrow = (size_t)c->n_head_kv * (2u + (size_t)hd);
    const uint8_t *vs = L->vsm + (size_t)t->h * (2u + (size_t)hd);
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    const float scale = 1.0f / sqrtf((float)hd), lnC = logf((float)C);
    const int np = t->n_part > 1 ? t->n_part : 1;
    for (int64_t ch0 = (int64_t)(np > 1 ? t->part : 0) * C; ch0 < n_ch; ch0 += (int64_t)np * C) {
        const int nb = n_ch - ch0 < C ? (int)(n_ch - ch0) : C;
        int live = 0;
        for (int k = 0; k < nb; k++) {
            const int64_t ch = ch0 + k, rows = g->n_rows - ch * C < C ? g->n_rows - ch * C : C;
            if (x->mark[ch]) {
                x->bias[k] = -INFINITY;
                if (!t->qdot) memset(x->kb + (size_t)k * hd, 0, (size_t)hd * sizeof(float));
                continue;
            }
            if (!t->qdot) f16->to_f32(L->lmk + (size_t)ch * c->kvd + (size_t)t->h * hd, x->kb + (size_t)k * hd, hd);
            x->bias[k] = rows == C ? lnC : logf((float)rows);
            live++;
        }
        if (!live) continue;
        if (t->qdot) { /* the selection's landmark dot products */
            for (int j = 0; j < t->ns; j++) {
                const float *qd = t->qdot + (size_t)j * n_ch + ch0;
                float *sc = x->sc + (size_t)j * c->sc_ld;
                for (int k = 0; k < nb; k++) sc[k] = qd[k] * scale + x->bias[k];
            }
            softmax_block(t, nb);
        } else {
            scores(t, x->kb, nb, -1, x->bias);
        }
        const uint8_t *rows = vs + (size_t)ch0 * vrow;
#ifdef LR_ISA_AVX2
        acc_rows_avx2(x->acc_v, (size_t)hd, t->ns, x->sc, 1, (size_t)c->sc_ld, rows, vrow, LR_R_I8, nb, hd);
        for (int j = 0; j < t->ns; j++)
            for (int k = 0; k < nb; k++) x->st_a[j] += x->sc[(size_t)j * c->sc_ld + k];
#else
        float w[LR_WMAX];
        for (int k = 0; k < nb; k++) {
            if (x->mark[ch0 + k]) continue;
            const uint8_t *rw = rows + (size_t)k * vrow;
            const float sc = rk_f16_to_f32((uint16_t)(rw[0] | (rw[1] << 8)));
            for (int j = 0; j < t->ns; j++) {
                const float a = x->sc[(size_t)j * c->sc_ld + k];
                x->st_a[j] += a;
                w[j] = a * sc;
            }
            axpy_rows_i8(x->acc_v, (size_t)hd, w, t->ns, (const int8_t *)(rw + 2), hd);
        }
#endif
    }
}
