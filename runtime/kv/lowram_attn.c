/* LowRAM attention: exact softmax attention over sinks + window (exact rows) and over
 * compressed chunks rebuilt on the fly (K = RoPE(mean + C·B)); values are accumulated in
 * coefficient space (Σ a·c, then one product with the predictor W) plus the stored
 * residuals. Decode picks chunks by landmark score within the token budget; dense mode
 * and longer evals visit every chunk, one chunk at a time (the cache is never rebuilt
 * whole). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "lowram_tier.h"
#include "rk_kernels.h"

#include "lowram_simd.h"

/* One (layer, KV head, query tile) of work. State row j = local query i * grp + jj. */
typedef struct head_task {
    rk_kv_codec *c;
    lr_scratch *x;
    int l, h, grp, ns;       /* ns state rows */
    int64_t i0, pos0;        /* first query row of the tile and its position */
    const float *q;          /* (n_q, q_dim) */
    float *out;
    bool sparse, use_c;      /* use_c: values have a predictor (acc_c is needed) */
    const int32_t *sel;      /* sparse decode: chunks chosen and rebuilt beforehand (n_sel), */
    const int32_t *slot;     /* their key-cache slots */
    int64_t n_sel;
    bool avx2;               /* the fused decode loops may use acc_rows_avx2 */
    bool vsum;               /* unselected chunks from the layer's value summaries (L->vsm) */
    int part, n_part;        /* sparse decode: this task attends share `part` of n_part (> 1)
                              * of the head's rows and writes its unnormalised state to pout
                              * ((ns, head_dim + 2): Σ a·v, max, Σ a) */
    float *pout;
    const float *qdot;       /* sparse decode: q_j·landmark of every chunk from the selection
                              * ((ns, n_ch) rows), or NULL */
    const float *pre;        /* sparse decode: every chunk's landmark score, computed over the
                              * pool beforehand (score_worker), or NULL: select_chunks scores */
} head_task;

LR_AI const float *q_of(const head_task *t, int j) {
    const int qd = t->c->n_head * t->c->hd;
    return t->q + (t->i0 + j / t->grp) * qd + (size_t)(t->h * t->grp + j % t->grp) * t->c->hd;
}

#include "lowram_spread.h" /* spread_prep, spread_gain: the chunks' spread correction */

/* Online softmax for state row j: rescale the running state to the new maximum (from mx,
 * the block's maximum), turn the block's nv scores in sc into weights exp(s - m) and add
 * their sum. */
LR_AI void online_update(const head_task *t, int j, float *sc, int nv, float mx) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd, rc = lr_vr(c, &c->g[c->ly[t->l].grp]);
    const float m_new = mx > x->st_m[j] ? mx : x->st_m[j];
    if (m_new > x->st_m[j]) {
        const float a = expf(x->st_m[j] - m_new); /* 0 on the first block */
        x->st_l[j] *= a, x->st_a[j] *= a;
        scal(x->acc_v + (size_t)j * hd, a, hd);
        if (t->use_c) scal(x->acc_c + (size_t)j * c->r_max, a, rc);
        x->st_m[j] = m_new;
    }
    float sum = 0;
#ifdef LR_HAVE_ACC_AVX2
    if (t->avx2) sum = exp_sum_avx2(sc, nv, m_new);
    else
#endif
        for (int k = 0; k < nv; k++) sum += sc[k] = expf(sc[k] - m_new);
    x->st_l[j] += sum;
}

/* Scores of nb keys kb for every state row, then the online-softmax rescale; returns per
 * state row the weights in x->sc (0 for keys a query may not see). kpos0 >= 0: keys sit
 * at kpos0.. and are causal-masked; < 0: every key is visible. */
LR_AI void scores(const head_task *t, const float *kb, int nb, int64_t kpos0, const float *bias) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int j = 0; j < t->ns; j++) {
        const float *qv = q_of(t, j);
        float *sc = x->sc + (size_t)j * c->sc_ld;
        int nv = nb;
        if (kpos0 >= 0) {
            const int64_t lim = t->pos0 + j / t->grp - kpos0 + 1; /* keys kpos0 + k, k < lim */
            nv = lim < 0 ? 0 : lim < nb ? (int)lim : nb;
        }
        float mx = -INFINITY;
        for (int k = 0; k < nv; k++) {
            sc[k] = dotf(qv, kb + (size_t)k * hd, hd) * scale + (bias ? bias[k] : 0.0f);
            mx = sc[k] > mx ? sc[k] : mx;
        }
        for (int k = nv; k < nb; k++) sc[k] = 0;
        if (nv == 0) continue;
        online_update(t, j, sc, nv, mx);
    }
}

/* The online-softmax part of scores() for nb scores already in x->sc (every key visible). */
LR_AI void softmax_block(const head_task *t, int nb) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    for (int j = 0; j < t->ns; j++) {
        float *sc = x->sc + (size_t)j * c->sc_ld, mx = -INFINITY;
        for (int k = 0; k < nb; k++) mx = sc[k] > mx ? sc[k] : mx;
        if (mx == -INFINITY) {
            for (int k = 0; k < nb; k++) sc[k] = 0;
            continue;
        }
        online_update(t, j, sc, nb, mx);
    }
}

/* Plain rows [p0, p1) of the layer: exact keys and values. */
LR_AI void plain_rows(const head_task *t, int64_t p0, int64_t p1) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd, C = c->p.chunk;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    for (int64_t b0 = p0; b0 < p1; b0 += C) {
        const int nb = p1 - b0 < C ? (int)(p1 - b0) : C;
        for (int k = 0; k < nb; k++) {
            const size_t off = (size_t)t->h * hd * (c->exact_type == RK_DT_F32 ? 4 : 2);
            const uint8_t *kr = lr_exact_ptr(c, t->l, false, b0 + k) + off, *vr = lr_exact_ptr(c, t->l, true, b0 + k) + off;
            if (c->exact_type == RK_DT_F32) {
                memcpy(x->kb + (size_t)k * hd, kr, (size_t)hd * sizeof(float));
                memcpy(x->vb + (size_t)k * hd, vr, (size_t)hd * sizeof(float));
            } else {
                f16->to_f32(kr, x->kb + (size_t)k * hd, hd);
                f16->to_f32(vr, x->vb + (size_t)k * hd, hd);
            }
        }
        scores(t, x->kb, nb, b0, NULL);
        for (int j = 0; j < t->ns; j++) {
            const float *w = x->sc + (size_t)j * c->sc_ld;
            float *av = x->acc_v + (size_t)j * hd;
            for (int k = 0; k < nb; k++)
                if (w[k] != 0) axpy(av, w[k], x->vb + (size_t)k * hd, hd);
        }
        x->n_attended += (uint64_t)nb;
    }
}

/* Key-cache slot s of head H (nb rows) as f32 into dst (nb, head_dim). */
LR_AI void kc_load(const rk_kv_codec *c, const lr_head *H, int s, int nb, float *dst) {
    const uint8_t *src = H->kc + (size_t)s * c->p.chunk * c->kc_row;
    const int hd = c->hd;
    if (c->p.kc_type != RK_DT_Q8_0) {
        rk_quant_fast(RK_DT_F16)->to_f32(src, dst, (int64_t)nb * hd);
        return;
    }
    for (int k = 0; k < nb; k++, src += c->kc_row) { /* f16 scale, then head_dim int8 (lr_encode_row) */
        const float sc = rk_f16_to_f32((uint16_t)(src[0] | (src[1] << 8)));
        const int8_t *restrict qv = (const int8_t *)(src + 2);
        float *restrict o = dst + (size_t)k * hd;
        for (int d = 0; d < hd; d++) o[d] = (float)qv[d] * sc;
    }
}

#ifdef LR_HAVE_ACC_AVX2
/* Whether the chunks of this task's key-cache slots can be scored by kc_scores. */
LR_AI bool kc_direct(const head_task *t) {
    return t->avx2 && t->c->p.kc_type == RK_DT_Q8_0 && t->ns >= 1 && t->ns <= LR_DOT_MAX && t->c->hd % 8 == 0;
}
/* Scores of chunks sel[0..cnt) from their int8 key-cache slots slot[] for every state row,
 * straight from the codes (each row's scale applied to the dot product), then the
 * online-softmax update: what kc_load + scores do, without the f32 copy of the keys and with
 * the key row read once for every query head. */
LR_AI int kc_scores(const head_task *t, const lr_head *H, const int32_t *sel, const int32_t *slot, int cnt) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_group *g = &c->g[c->ly[t->l].grp];
    const int C = c->p.chunk, hd = c->hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *qs[LR_DOT_MAX];
    float d[LR_DOT_MAX];
    for (int j = 0; j < t->ns; j++) qs[j] = q_of(t, j);
    int nb = 0;
    for (int m = 0; m < cnt; m++) {
        const int64_t r0 = (int64_t)sel[m] * C;
        const int nbm = g->n_rows - r0 < C ? (int)(g->n_rows - r0) : C;
        const uint8_t *src = H->kc + (size_t)slot[m] * C * c->kc_row;
        for (int k = 0; k < nbm; k++, nb++, src += c->kc_row) {
            const float s = rk_f16_to_f32((uint16_t)(src[0] | (src[1] << 8))) * scale;
            kc_dots_avx2(qs, t->ns, (const int8_t *)(src + 2), hd, d);
            for (int j = 0; j < t->ns; j++) x->sc[(size_t)j * c->sc_ld + nb] = d[j] * s;
        }
    }
    softmax_block(t, nb);
    return nb;
}
#endif

/* Rebuilt post-RoPE keys of chunk ch into x->kb: from the key cache when it holds them
 * (sparse decode), else K = RoPE(mean + (C·B)/s), then cached over the least recently used
 * slot that this call has not used. */
LR_AI void chunk_keys(const head_task *t, int64_t ch, int nb, int slot) {
    rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    lr_head *H = &c->ly[t->l].h[t->h];
    const int hd = c->hd, C = c->p.chunk, r = g->r;
    const int64_t r0 = ch * C;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    int victim = -1;
    if (slot >= 0) { /* rebuilt by the LR_KEYS op before this task (sparse decode) */
        kc_load(c, H, slot, nb, x->kb);
        return;
    }
    if (t->sparse && H->n_kc && !c->p.no_cache) {
        for (int i = 0; i < H->n_kc; i++)
            if (H->kc_ch[i] == ch && H->kc_rows[i] == nb && H->kc_epoch[i] == c->epoch) {
                H->kc_used[i] = c->n_calls;
                kc_load(c, H, i, nb, x->kb);
                return;
            }
        for (int i = 0; i < H->n_kc; i++)
            if (H->kc_used[i] != c->n_calls && (victim < 0 || H->kc_used[i] < H->kc_used[victim])) victim = i;
    }
    const size_t off = (size_t)L->li * c->kvd + (size_t)t->h * hd;
    const int kr = c->p.key_rank > 0 && c->p.key_rank < r ? c->p.key_rank : r;
    rk_linalg_matmul(nb, hd, kr, x->cf, r, x->bsl, hd, x->kb, hd);
    const float *mu = g->mean + off, *wi = g->winv + off;
    for (int k = 0; k < nb; k++) {
        float *kr = x->kb + (size_t)k * hd;
        for (int d = 0; d < hd; d++) kr[d] = kr[d] * wi[d] + mu[d];
        lr_rope_row(c, kr, 1, g->pos[r0 + k], false);
    }
    x->n_rebuilt += (uint64_t)nb;
    if (victim >= 0) {
        uint8_t *dst = H->kc + (size_t)victim * C * c->kc_row;
        if (c->p.kc_type == RK_DT_Q8_0) {
            for (int k = 0; k < nb; k++)
                lr_encode_row(RK_DT_Q8_0, x->kb + (size_t)k * hd, hd, dst + (size_t)k * c->kc_row);
        } else {
            uint16_t *d16 = (uint16_t *)dst;
            for (int i = 0; i < nb * hd; i++) d16[i] = rk_f32_to_f16(x->kb[i]);
            f16->to_f32(d16, x->kb, (int64_t)nb * hd);
        } /* a hit later sees exactly these keys */
        H->kc_ch[victim] = (int32_t)ch, H->kc_rows[victim] = nb, H->kc_epoch[victim] = c->epoch;
        H->kc_used[victim] = c->n_calls;
    }
}

/* Compressed chunk ch: its keys for this (layer, head), scores, accumulation. */
LR_AI void comp_chunk(const head_task *t, int64_t ch, int kslot) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const lr_head *H = &L->h[t->h];
    const int hd = c->hd, C = c->p.chunk, r = g->r, rv = lr_vr(c, g);
    const int64_t r0 = ch * C;
    const int nb = g->n_rows - r0 < C ? (int)(g->n_rows - r0) : C;
    /* decode with int8 coefficients and keys rebuilt beforehand: Σ a·c straight from the
     * int8 rows (the row's scale folded into the weights), every query head in one pass */
    const bool i8 = kslot >= 0 && t->use_c && c->p.coef_type == RK_DT_Q8_0 && t->ns <= LR_WMAX && t->ns < LR_VREBUILD_MIN;
    if (!i8) lr_coef_rows(c, g, r0, nb, x->cf);
#ifdef LR_HAVE_ACC_AVX2
    if (kslot >= 0 && kc_direct(t)) {
        const int32_t s1 = kslot, c1 = (int32_t)ch;
        (void)kc_scores(t, H, &c1, &s1, 1);
    } else
#endif
    {
        chunk_keys(t, ch, nb, kslot);
        scores(t, x->kb, nb, -1, NULL);
    }
    const uint32_t mask = H->mask[ch];
    int64_t slot = H->base[ch];
#ifdef LR_HAVE_ACC_AVX2
    if (i8 && t->avx2) {
        acc_rows_avx2(x->acc_c, (size_t)c->r_max, t->ns, x->sc, 1, (size_t)c->sc_ld, g->coef + (size_t)r0 * g->coef_bytes,
                      g->coef_bytes, LR_R_I8, nb, rv);
        float w[LR_WMAX];
        for (int k = 0; k < nb; k++) {
            for (int j = 0; j < t->ns; j++) x->st_a[j] += w[j] = x->sc[(size_t)j * c->sc_ld + k];
            if ((mask >> k) & 1u) {
                lr_res_row(c, H, slot++, x->row);
                axpy_rows(x->acc_v, (size_t)hd, w, t->ns, x->row, hd);
            }
        }
        x->n_attended += (uint64_t)nb;
        return;
    }
#endif
    if (i8) {
        float w[LR_WMAX];
        for (int k = 0; k < nb; k++) {
            const uint8_t *row = g->coef + (size_t)(r0 + k) * g->coef_bytes;
            const float s = rk_f16_to_f32((uint16_t)(row[0] | (row[1] << 8)));
            bool any = false;
            for (int j = 0; j < t->ns; j++) {
                const float a = x->sc[(size_t)j * c->sc_ld + k];
                x->st_a[j] += a;
                w[j] = a * s;
                any |= a != 0;
            }
            if (any) axpy_rows_i8(x->acc_c, (size_t)c->r_max, w, t->ns, (const int8_t *)(row + 2), rv);
            if ((mask >> k) & 1u) {
                lr_res_row(c, H, slot++, x->row);
                for (int j = 0; j < t->ns; j++) w[j] = x->sc[(size_t)j * c->sc_ld + k];
                axpy_rows(x->acc_v, (size_t)hd, w, t->ns, x->row, hd);
            }
        }
        x->n_attended += (uint64_t)nb;
        return;
    }
    if (t->use_c && t->ns >= LR_VREBUILD_MIN) {
        /* many query rows (a long eval): rebuild the chunk's values once, V̂ = c·W + b + δ,
         * instead of r coefficients per (query, key) pair */
        rk_linalg_matmul(nb, hd, rv, x->cf, r, x->wsl, hd, x->vb, hd);
        const float *bias = L->b + (size_t)t->h * hd;
        for (int k = 0; k < nb; k++) {
            float *vr = x->vb + (size_t)k * hd;
            axpy(vr, 1.0f, bias, hd);
            if ((mask >> k) & 1u) {
                lr_res_row(c, H, slot++, x->row);
                axpy(vr, 1.0f, x->row, hd);
            }
        }
        for (int j = 0; j < t->ns; j++) {
            const float *w = x->sc + (size_t)j * c->sc_ld;
            float *av = x->acc_v + (size_t)j * hd;
            for (int k = 0; k < nb; k++)
                if (w[k] != 0) axpy(av, w[k], x->vb + (size_t)k * hd, hd);
        }
        x->n_attended += (uint64_t)nb;
        return;
    }
    for (int k = 0; k < nb; k++) {
        const bool has_res = (mask >> k) & 1u;
        if (has_res) lr_res_row(c, H, slot++, x->row);
        for (int j = 0; j < t->ns; j++) {
            const float w = x->sc[(size_t)j * c->sc_ld + k];
            if (t->use_c) axpy(x->acc_c + (size_t)j * c->r_max, w, x->cf + (size_t)k * r, rv);
            x->st_a[j] += w;
            if (has_res) axpy(x->acc_v + (size_t)j * hd, w, x->row, hd);
        }
    }
    x->n_attended += (uint64_t)nb;
}

#ifdef LR_HAVE_ACC_AVX2
/* Sparse decode with int8 coefficients on AVX2 (comp_chunk's fused path): cnt consecutive
 * chunks sel[0..cnt) whose keys are in key-cache slots slot[], attended as one block of at
 * most sc_ld rows (their coefficient rows are contiguous): one online-softmax update and one
 * pass of the fused accumulation instead of one per chunk (fine chunks: chunk=8). */
LR_AI void comp_run(const head_task *t, const int32_t *sel, const int32_t *slot, int cnt) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const lr_head *H = &L->h[t->h];
    const int hd = c->hd, C = c->p.chunk, rv = lr_vr(c, g);
    int nb = 0;
    if (kc_direct(t)) {
        nb = kc_scores(t, H, sel, slot, cnt);
    } else {
        for (int m = 0; m < cnt; m++) {
            const int64_t r0 = (int64_t)sel[m] * C;
            const int nbm = g->n_rows - r0 < C ? (int)(g->n_rows - r0) : C;
            kc_load(c, H, slot[m], nbm, x->kb + (size_t)nb * hd);
            nb += nbm;
        }
        scores(t, x->kb, nb, -1, NULL);
    }
    acc_rows_avx2(x->acc_c, (size_t)c->r_max, t->ns, x->sc, 1, (size_t)c->sc_ld,
                  g->coef + (size_t)sel[0] * C * g->coef_bytes, g->coef_bytes, LR_R_I8, nb, rv);
    float w[LR_WMAX];
    for (int m = 0, k = 0; m < cnt; m++) {
        const int64_t r0 = (int64_t)sel[m] * C;
        const int nbm = g->n_rows - r0 < C ? (int)(g->n_rows - r0) : C;
        const uint32_t mask = H->mask[sel[m]];
        int64_t rs = H->base[sel[m]];
        for (int kk = 0; kk < nbm; kk++, k++) {
            for (int j = 0; j < t->ns; j++) x->st_a[j] += w[j] = x->sc[(size_t)j * c->sc_ld + k];
            if ((mask >> kk) & 1u) {
                lr_res_row(c, H, rs++, x->row);
                axpy_rows(x->acc_v, (size_t)hd, w, t->ns, x->row, hd);
            }
        }
    }
    x->n_attended += (uint64_t)nb;
}
#endif

#include "lowram_select.h" /* kc_valid, chunk scores, select_chunks, select_topp */

/* Chunks not selected: one row each, key = landmark, value = V̂ of the mean coefficients,
 * weight = chunk size (log added to the score). Residuals are left out (mean ~ 0). */
LR_AI void summaries(const head_task *t, int64_t n_ch) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const int hd = c->hd, C = c->p.chunk, r = g->r;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
#ifdef LR_HAVE_ACC_AVX2
    /* windows of C consecutive chunks, the selected ones at weight 0 (bias -inf): Σ a·c is read
     * straight from the f16 mean-coefficient rows (no f32 copy of r values per chunk and head) */
    if (t->use_c && t->avx2 && !c->wide) {
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
#ifdef LR_HAVE_ACC_AVX2
        if (t->use_c && t->avx2) {
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
LR_AI void vsummaries(const head_task *t, int64_t n_ch) {
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
#ifdef LR_HAVE_ACC_AVX2
        if (t->avx2) {
            acc_rows_avx2(x->acc_v, (size_t)hd, t->ns, x->sc, 1, (size_t)c->sc_ld, rows, vrow, LR_R_I8, nb, hd);
            for (int j = 0; j < t->ns; j++)
                for (int k = 0; k < nb; k++) x->st_a[j] += x->sc[(size_t)j * c->sc_ld + k];
            continue;
        }
#endif
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
    }
}

LR_AI void head_run(head_task *t) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const int hd = c->hd, qd = c->n_head * hd;
    for (int j = 0; j < t->ns; j++) {
        x->st_m[j] = -INFINITY, x->st_l[j] = 0, x->st_a[j] = 0;
        memset(x->acc_v + (size_t)j * hd, 0, (size_t)hd * sizeof(float));
        if (t->use_c) memset(x->acc_c + (size_t)j * c->r_max, 0, (size_t)g->r * sizeof(float));
    }
    const int64_t last = t->pos0 + t->ns / t->grp; /* one past the last query position */
    const int off = L->li * c->kvd + t->h * hd;
    if (!t->slot) lr_mat_f32(c, g->basis, (size_t)g->D, 0, g->r, off, hd, x->bsl);
    /* decode: W is applied row by row at the end (no f32 copy of it per step) */
    const bool fuse_w = t->use_c && t->sparse && t->ns < LR_VREBUILD_MIN && t->ns <= LR_WMAX;
    if (t->use_c && !fuse_w) lr_mat_f32(c, L->W, (size_t)c->kvd, 0, lr_vr(c, g), t->h * hd, hd, x->wsl);
    const bool split = t->n_part > 1 && t->sel;
    const int np = split ? t->n_part : 1, pt = split ? t->part : 0;
    if (pt == 0) plain_rows(t, 0, c->p.n_sink < last ? c->p.n_sink : last);
    const int64_t n_ch = (g->n_rows + c->p.chunk - 1) / c->p.chunk;
    if (t->sparse) {
        const int32_t *sel = t->sel ? t->sel : x->sel;
        const int64_t n = t->sel ? t->n_sel : select_chunks(t, n_ch);
#ifdef LR_HAVE_ACC_AVX2
        /* runs of consecutive chosen chunks as one block (comp_chunk's fused int8 path only) */
        const bool runs = t->slot && t->avx2 && t->use_c && c->p.coef_type == RK_DT_Q8_0 &&
                          t->ns <= LR_WMAX && t->ns < LR_VREBUILD_MIN && 2 * c->p.chunk <= c->sc_ld;
#else
        const bool runs = false;
#endif
        /* a split head: part pt attends its contiguous share of the chosen chunks */
        const int64_t i_hi = n * (pt + 1) / np;
        for (int64_t i = n * pt / np; i < i_hi; i++) {
            int cnt = 1;
            while (runs && i + cnt < i_hi && sel[i + cnt] == sel[i] + cnt && (cnt + 1) * c->p.chunk <= c->sc_ld &&
                   t->slot[i] >= 0 && t->slot[i + cnt] >= 0)
                cnt++;
#ifdef LR_HAVE_ACC_AVX2
            if (cnt > 1) {
                comp_run(t, sel + i, t->slot + i, cnt);
                i += cnt - 1;
                continue;
            }
#endif
            comp_chunk(t, sel[i], t->slot ? t->slot[i] : -1);
        }
        if (n < n_ch && !c->p.no_summary) {
            memset(x->mark, 0, (size_t)n_ch);
            for (int64_t i = 0; i < n; i++) x->mark[sel[i]] = 1;
            if (t->vsum) vsummaries(t, n_ch); /* (a split head's parts share its blocks) */
            else if (pt == 0) summaries(t, n_ch);
        }
    } else {
        for (int64_t ch = 0; ch < n_ch; ch++) comp_chunk(t, ch, -1);
    }
    if (pt == np - 1) plain_rows(t, c->comp_end, last);
#ifdef LR_HAVE_ACC_AVX2
    if (fuse_w && t->avx2 && !c->wide) {
        acc_rows_avx2(x->acc_v, (size_t)hd, t->ns, x->acc_c, 1, (size_t)c->r_max,
                      (const uint8_t *)((const uint16_t *)L->W + (size_t)t->h * hd), (size_t)c->kvd * 2, LR_R_F16, lr_vr(c, g), hd);
    } else
#endif
    if (fuse_w) { /* acc_v += (Σ a·c) W, one f16 row of W at a time for every query head */
        float w[LR_WMAX];
        for (int k = 0; k < lr_vr(c, g); k++) {
            for (int j = 0; j < t->ns; j++) w[j] = x->acc_c[(size_t)j * c->r_max + k];
            lr_mat_f32(c, L->W, (size_t)c->kvd, k, 1, t->h * hd, hd, x->row);
            axpy_rows(x->acc_v, (size_t)hd, w, t->ns, x->row, hd);
        }
    }
    for (int j = 0; j < t->ns; j++) {
        float *o = t->out + (t->i0 + j / t->grp) * qd + (size_t)(t->h * t->grp + j % t->grp) * hd;
        float *av = x->acc_v + (size_t)j * hd;
        if (t->use_c && !fuse_w) {
            rk_linalg_matmul(1, hd, lr_vr(c, g), x->acc_c + (size_t)j * c->r_max, g->r, x->wsl, hd, o, hd);
            axpy(av, 1.0f, o, hd);
        }
        axpy(av, x->st_a[j], L->b + (size_t)t->h * hd, hd);
        if (split) { /* merged with the other parts by the caller */
            float *po = t->pout + (size_t)j * (hd + 2);
            memcpy(po, av, (size_t)hd * sizeof(float));
            po[hd] = x->st_m[j], po[hd + 1] = x->st_l[j];
            continue;
        }
        const float inv = 1.0f / x->st_l[j];
        for (int d = 0; d < hd; d++) o[d] = av[d] * inv;
    }
}

static void head_run_plain(head_task *t) { head_run(t); }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma,f16c"))) static void head_run_avx2(head_task *t) { head_run(t); }
#define LR_HAVE_AVX2_CLONES 1
#endif

typedef struct attn_job {
    rk_kv_codec *c;
    int l;
    const float *q;
    int64_t n_q, pos0, n_tiles, tile;
    float *out;
    bool sparse, avx2;
} attn_job;

static void attn_worker(void *vp, int tid, int nt) {
    attn_job *a = vp;
    rk_kv_codec *c = a->c;
    const int grp = c->n_head / c->n_head_kv;
    const int64_t n_items = a->n_tiles * c->n_head_kv;
    for (int64_t it = tid; it < n_items; it += nt) {
        const int64_t tile = it / c->n_head_kv, i0 = tile * a->tile;
        const int64_t ni = a->n_q - i0 < a->tile ? a->n_q - i0 : a->tile;
        head_task t = {c, &c->scr[tid], a->l, (int)(it % c->n_head_kv), grp, (int)(ni * grp), i0, a->pos0 + i0,
                       a->q, a->out, a->sparse, !c->p.values_exact, NULL, NULL, 0, a->avx2, false, 0, 1, NULL, NULL, NULL};
#ifdef LR_HAVE_AVX2_CLONES
        if (a->avx2) {
            head_run_avx2(&t);
            continue;
        }
#endif
        head_run_plain(&t);
    }
}

typedef struct dec_job {
    rk_kv_codec *c;
    int l;
    const float *q;
    int64_t n_q, pos0;
    float *out;
    bool avx2, vsum;
    int n_part;           /* > 1: each head's rows in n_part tasks (balance over the threads) */
    float *pout;          /* (n_head_kv * n_part, ns, head_dim + 2) their states */
    const float *qdot;    /* per head (qd_head floats apart) the selection's landmark dots, or NULL */
    size_t qd_head;
} dec_job;

/* Sparse decode, second phase: every KV head attends its preselected, rebuilt chunks. */
static void dec_worker(void *vp, int tid, int nt) {
    dec_job *a = vp;
    rk_kv_codec *c = a->c;
    const int grp = c->n_head / c->n_head_kv;
    const int np = a->n_part > 1 ? a->n_part : 1, ns = (int)(a->n_q * grp);
    for (int it = tid; it < c->n_head_kv * np; it += nt) {
        const int h = it / np;
        const size_t o = (size_t)h * (size_t)c->cap_chunks;
        head_task t = {c, &c->scr[tid], a->l, h, grp, ns, 0, a->pos0, a->q, a->out, true,
                       !c->p.values_exact, c->dsel + o, c->dslot + o, c->dn[h], a->avx2, a->vsum, 0, 1, NULL,
                       a->qdot ? a->qdot + (size_t)h * a->qd_head : NULL, NULL};
        if (np > 1) t.part = it % np, t.n_part = np, t.pout = a->pout + (size_t)it * ns * (c->hd + 2);
#ifdef LR_HAVE_AVX2_CLONES
        if (a->avx2) {
            head_run_avx2(&t);
            continue;
        }
#endif
        head_run_plain(&t);
    }
}

static void select_plain(head_task *t, int64_t n_ch, int64_t *n) {
    *n = t->c->p.topp > 0 ? select_topp(t, n_ch) : select_chunks(t, n_ch);
}
#ifdef LR_HAVE_AVX2_CLONES
__attribute__((target("avx2,fma,f16c"))) static void select_avx2(head_task *t, int64_t n_ch, int64_t *n) {
    *n = t->c->p.topp > 0 ? select_topp(t, n_ch) : select_chunks(t, n_ch);
}
#endif

/* Sparse decode, first phase: the landmark scores of every (KV head, share of its chunks)
 * over the pool. Scoring is most of the selection, and as whole heads it would leave a thread
 * idle (3 KV heads on 2 threads); the scores are the ones select_chunks would compute, so the
 * choice does not depend on the split. */
typedef struct score_job {
    rk_kv_codec *c;
    int l, grp, ns, n_part;
    int64_t n_ch, pos0;
    const float *q;
    bool avx2;
    float *qdot;          /* c->dqd (per head qd_head floats apart) or NULL */
    size_t qd_head;
} score_job;

LR_AI void score_range(const head_task *t, int64_t a, int64_t b, int64_t n_ch, float *out) {
    const float *qp[LR_WMAX];
    const float *const *qs = dot_queries(t, 0, qp);
    for (int64_t ch = a; ch < b; ch++) out[ch] = chunk_score(t, ch, n_ch, 0, NULL, NULL, NULL, qs);
    t->x->n_lmk += (uint64_t)(b - a);
}
static void score_range_plain(const head_task *t, int64_t a, int64_t b, int64_t n_ch, float *out) {
    score_range(t, a, b, n_ch, out);
}
#ifdef LR_HAVE_AVX2_CLONES
__attribute__((target("avx2,fma,f16c"))) static void score_range_avx2(const head_task *t, int64_t a, int64_t b,
                                                                       int64_t n_ch, float *out) {
    score_range(t, a, b, n_ch, out);
}
#endif

static void score_worker(void *vp, int tid, int nt) {
    score_job *a = vp;
    rk_kv_codec *c = a->c;
    for (int it = tid; it < c->n_head_kv * a->n_part; it += nt) {
        const int h = it / a->n_part, p = it % a->n_part;
        head_task t = {c,    &c->scr[tid], a->l, h, a->grp, a->ns, 0, a->pos0, a->q, NULL, true, !c->p.values_exact,
                       NULL, NULL,         0,    a->avx2, false, 0, 1, NULL, NULL, NULL};
        t.qdot = a->qdot ? a->qdot + (size_t)h * a->qd_head : NULL;
        const int64_t lo = a->n_ch * p / a->n_part, hi = a->n_ch * (p + 1) / a->n_part;
        float *out = c->dcs + (size_t)h * (size_t)c->cap_chunks;
#ifdef LR_HAVE_AVX2_CLONES
        if (a->avx2) {
            score_range_avx2(&t, lo, hi, a->n_ch, out);
            continue;
        }
#endif
        score_range_plain(&t, lo, hi, a->n_ch, out);
    }
}

/* Tasks per KV head so that the tasks divide over the threads (at most 4; 1 when they
 * already do or there are few chunks to share). */
static int head_parts(int n_head_kv, int nthr, int64_t n_items, int64_t min_items) {
    if (nthr <= 1 || n_head_kv % nthr == 0 || n_items < 2 * min_items) return 1;
    int a = n_head_kv, b = nthr;
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    const int np = nthr / a;
    return np > 4 ? 4 : np;
}

#ifdef LR_HAVE_AVX2_CLONES
#include <immintrin.h>
__attribute__((target("avx2,f16c"))) static void store_f16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = rk_f32_to_f16(src[i]);
}
#endif
/* n floats into f16 (round to nearest even, as rk_f32_to_f16) */
static void store_f16(const float *src, uint16_t *dst, int64_t n, bool avx2) {
#ifdef LR_HAVE_AVX2_CLONES
    if (avx2) {
        store_f16_avx2(src, dst, n);
        return;
    }
#endif
    (void)avx2;
    for (int64_t i = 0; i < n; i++) dst[i] = rk_f32_to_f16(src[i]);
}

/* Head h's batch area of sparse decode's key rebuild (per head, so that the heads gather over
 * the pool): coefficient rows, cos/sin rows, table rows, output rows, slots rebuilt. */
static float *hb_cf(const rk_kv_codec *c, int h) { return c->bcf + (size_t)h * (size_t)(c->bch * c->p.chunk) * (size_t)c->r_max; }
static float *hb_kb(const rk_kv_codec *c, int h) { return c->bkb + (size_t)h * (size_t)(c->bch * c->p.chunk) * (size_t)c->hd; }
static float *hb_cs(const rk_kv_codec *c, int h) {
    return c->bcs + (size_t)h * (size_t)(c->bch * c->p.chunk) * (size_t)(c->n_rot > 0 ? c->n_rot : 1);
}
static int32_t *hb_pos(const rk_kv_codec *c, int h) { return c->bpos + (size_t)h * (size_t)(c->bch * c->p.chunk); }
static int32_t *hb_miss(const rk_kv_codec *c, int h) { return c->bmiss + (size_t)h * (size_t)c->bch; }

/* The rebuilt keys of head h's batch (hb_kb, gathering order) into their key-cache slots
 * (q8_0 or f16): the misses m with m % nt == tid. */
static void keys_encode(rk_kv_codec *c, const lr_layer *L, int h, int tid, int nt, bool avx2) {
    const lr_head *H = &L->h[h];
    const int hd = c->hd, C = c->p.chunk, n_miss = c->dhq[h].n_miss;
    const int32_t *miss = hb_miss(c, h);
    const float *kb = hb_kb(c, h);
    int64_t r0 = 0;
    for (int m = 0; m < n_miss; m++) {
        const int s = miss[m], nb = H->kc_rows[s];
        if (m % nt == tid) {
            uint8_t *dst = H->kc + (size_t)s * C * c->kc_row;
            if (c->p.kc_type == RK_DT_Q8_0)
                for (int k = 0; k < nb; k++)
                    lr_encode_row(RK_DT_Q8_0, (float *)kb + (size_t)(r0 + k) * hd, hd, dst + (size_t)k * c->kc_row);
            else store_f16(kb + (size_t)r0 * hd, (uint16_t *)dst, (int64_t)nb * hd, avx2);
        }
        r0 += nb;
    }
}

/* One batch of sparse decode's key rebuild: the rows gathered in head h's batch area run
 * through the backend's RK_OP_LR_KEYS (its threads); encode: into their key-cache slots now
 * (else the caller encodes them over the pool). */
static rk_status keys_batch(rk_kv_codec *c, const lr_group *g, const lr_layer *L, int h, int kr, int r, bool encode,
                            bool avx2, rk_err *err) {
    const int hd = c->hd;
    const int64_t rows = c->dhq[h].rows;
    const size_t off = (size_t)L->li * c->kvd + (size_t)h * hd, el = c->wide ? 4 : 2;
    memcpy(c->bmw, g->mean + off, (size_t)hd * sizeof(float));
    memcpy(c->bmw + hd, g->winv + off, (size_t)hd * sizeof(float));
    rk_op_args a = {.op = RK_OP_LR_KEYS,
                    .dst = {RK_DT_F32, {hd, rows}, (size_t)hd * sizeof(float), hb_kb(c, h)},
                    .src0 = {RK_DT_F32, {kr, rows}, (size_t)r * sizeof(float), hb_cf(c, h)},
                    .src1 = {c->wide ? RK_DT_F32 : RK_DT_F16, {hd, kr}, (size_t)g->D * el, (uint8_t *)g->basis + off * el},
                    .src2 = {RK_DT_F32, {hd, 2}, (size_t)hd * sizeof(float), c->bmw},
                    .ids = hb_pos(c, h),
                    .rope = {c->rope_mode, c->n_rot, c->rope_base, 0},
                    .lr_rope_cs = hb_cs(c, h),
                    .lr_rope_rows = rows};
    rk_status st = rk_backend_run(c->be, &a, err);
    if (st != RK_OK) return st;
    if (encode) keys_encode(c, L, h, 0, 1, avx2);
    c->scr[0].n_rebuilt += (uint64_t)rows;
    return RK_OK;
}

/* Gathers head h's missing chosen chunks from hq->next_i on into its batch area, each into
 * the next victim slot, until the area is full (hq->next_i: where it stopped; n: done).
 * False when no slot is left (hq->slot_err). */
static bool keys_gather(rk_kv_codec *c, const lr_group *g, lr_head *H, int h, int64_t n) {
    struct lr_hq *hq = &c->dhq[h];
    const int C = c->p.chunk, r = g->r;
    const size_t o = (size_t)h * (size_t)c->cap_chunks;
    const int32_t *sel = c->dsel + o;
    int32_t *slot = c->dslot + o, *bpos = hb_pos(c, h), *miss = hb_miss(c, h);
    const struct lr_vic *vic = c->kvic + (size_t)h * c->kvic_cap;
    float *cf = hb_cf(c, h), *cs = hb_cs(c, h);
    const int64_t cap = c->bch * C; /* a full layer's misses can take several batches */
    hq->rows = 0, hq->n_miss = 0;
    for (int64_t i = hq->next_i; i < n; i++) {
        if (slot[i] >= 0) continue;
        const int64_t ch = sel[i];
        const int nb = g->n_rows - ch * C < C ? (int)(g->n_rows - ch * C) : C;
        if (hq->next >= hq->n_vic) {
            hq->slot_err = 1, hq->next_i = n;
            return false;
        }
        if (hq->rows + nb > cap) {
            hq->next_i = i;
            return true;
        }
        const int s = vic[hq->next++].k;
        H->kc_ch[s] = (int32_t)ch, H->kc_rows[s] = nb, H->kc_epoch[s] = c->epoch;
        lr_coef_rows(c, g, ch * C, nb, cf + (size_t)hq->rows * r);
        for (int k = 0; k < nb; k++) { /* the op reads row k's angles at table row bpos[k] = k */
            lr_rope_cs(c, g->pos[ch * C + k], cs + (size_t)(hq->rows + k) * c->n_rot);
            bpos[hq->rows + k] = (int32_t)(hq->rows + k);
        }
        miss[hq->n_miss++] = s;
        hq->rows += nb;
        H->kc_used[s] = c->n_calls;
        slot[i] = s;
    }
    hq->next_i = n;
    return true;
}

/* Sparse decode, second step: head h chooses its chunks (x: the thread's scratch, kmap: the
 * thread's chunk -> slot map), finds them in the key cache, orders the victims for the misses
 * and gathers the first batch of them. */
static rk_status head_choose(rk_kv_codec *c, int layer, int h, lr_scratch *x, int32_t *kmap, const float *q, int ns,
                             int64_t pos0, bool avx2, const float *qdot, const float *pre, rk_err *err) {
    const lr_group *g = &c->g[c->ly[layer].grp];
    const int grp = c->n_head / c->n_head_kv, C = c->p.chunk;
    const int64_t n_ch = (g->n_rows + C - 1) / C;
    head_task t = {c,    x,    layer, h, grp, ns, 0, pos0, q, NULL, true, !c->p.values_exact,
                   NULL, NULL, 0,     avx2, false, 0, 1, NULL, qdot, pre};
    int64_t n = 0;
#ifdef LR_HAVE_AVX2_CLONES
    if (avx2) select_avx2(&t, n_ch, &n);
    else
#endif
        select_plain(&t, n_ch, &n);
    const size_t o = (size_t)h * (size_t)c->cap_chunks;
    int32_t *sel = c->dsel + o, *slot = c->dslot + o;
    memcpy(sel, x->sel, (size_t)n * sizeof *sel);
    c->dn[h] = n;
    struct lr_hq *hq = &c->dhq[h];
    *hq = (struct lr_hq){0};
    if (c->tier) { /* lowram_tier.c: the selected chunks' rows resident before they are read (serial) */
        rk_status ts = lr_tier_need(c, layer, h, sel, n, err);
        if (ts) return ts;
    }
    lr_head *H = &c->ly[layer].h[h];
    /* first the hits (so that no chosen chunk is evicted by another one's miss), through a
     * chunk -> slot map (kmap, -1 outside this block): O(chosen + slots), not their product;
     * of two slots holding the same valid chunk the lower one, as a scan would find */
    if (!c->p.no_cache) {
        for (int k = H->n_kc - 1; k >= 0; k--)
            if (kc_valid(c, g, H, k, n_ch)) kmap[H->kc_ch[k]] = k;
        for (int64_t i = 0; i < n; i++)
            if ((slot[i] = kmap[sel[i]]) >= 0) H->kc_used[slot[i]] = c->n_calls;
        for (int k = 0; k < H->n_kc; k++)
            if (H->kc_ch[k] >= 0 && H->kc_ch[k] < c->cap_chunks) kmap[H->kc_ch[k]] = -1;
    } else {
        for (int64_t i = 0; i < n; i++) slot[i] = -1;
    }
    /* then the misses, each over an empty or stale slot, else over the unchosen cached chunk
     * of the lowest score now (x->csc: this head's scores from the selection); the victims
     * in that order (score, then least recently used, then slot) sorted once */
    struct lr_vic *vic = c->kvic + (size_t)h * c->kvic_cap;
    for (int64_t i = 0; i < n && !hq->n_vic; i++) {
        if (slot[i] >= 0) continue;
        for (int k = 0; k < H->n_kc; k++) {
            if (H->kc_used[k] == c->n_calls) continue;
            const float v = c->p.topp > 0 || n >= n_ch || !kc_valid(c, g, H, k, n_ch) ? -INFINITY : x->csc[H->kc_ch[k]];
            vic[hq->n_vic++] = (struct lr_vic){v, H->kc_used[k], k};
        }
        qsort(vic, (size_t)hq->n_vic, sizeof *vic, cmp_vic);
        if (!hq->n_vic) hq->n_vic = -1;
    }
    keys_gather(c, g, H, h, n);
    return RK_OK;
}

typedef struct choose_job {
    rk_kv_codec *c;
    int l, ns;
    int64_t pos0;
    const float *q;
    bool avx2;
    const float *qdot, *pre; /* c->dqd / c->dcs or NULL */
    size_t qd_head;
    rk_err *err;             /* serial runs only (a tier's reads) */
    rk_status st;
} choose_job;

static void choose_worker(void *vp, int tid, int nt) {
    choose_job *a = vp;
    rk_kv_codec *c = a->c;
    for (int h = tid; h < c->n_head_kv; h += nt) {
        rk_status st = head_choose(c, a->l, h, &c->scr[tid], c->kmap + (size_t)tid * (size_t)c->cap_chunks, a->q, a->ns,
                                   a->pos0, a->avx2, a->qdot ? a->qdot + (size_t)h * a->qd_head : NULL,
                                   a->pre ? a->pre + (size_t)h * (size_t)c->cap_chunks : NULL, a->err);
        if (st) a->st = st;
    }
}

typedef struct encode_job {
    rk_kv_codec *c;
    const lr_layer *L;
    bool avx2;
} encode_job;

static void encode_worker(void *vp, int tid, int nt) {
    encode_job *a = vp;
    for (int h = 0; h < a->c->n_head_kv; h++)
        if (a->c->dhq[h].rows) keys_encode(a->c, a->L, h, tid, nt, a->avx2);
}

/* Sparse decode (<= LR_SPARSE_MAX_Q query rows): landmark scores (over the pool); per KV head
 * (over the pool) the chosen chunks, their key-cache slots and the misses gathered; the
 * misses rebuilt by RK_OP_LR_KEYS on the backend (its threads) and encoded into their slots
 * (over the pool); then attention (heads over the pool). */
static rk_status sparse_decode(rk_kv_codec *c, int layer, const float *q, int64_t n_q, int64_t pos0, float *out,
                               rk_err *err) {
    const lr_layer *L = &c->ly[layer];
    const lr_group *g = &c->g[L->grp];
    const int grp = c->n_head / c->n_head_kv, C = c->p.chunk, hd = c->hd, r = g->r;
    const int kr = c->p.key_rank > 0 && c->p.key_rank < r ? c->p.key_rank : r;
    const int64_t n_ch = (g->n_rows + C - 1) / C;
    const bool avx2 = rk_cpu_has_avx2();
    /* unselected chunks in value space (the summaries are built once per chunk), scored with
     * the selection's landmark dot products */
    const int ns = (int)(n_q * grp);
    const bool vsum = !c->wide && !c->p.values_exact && !c->p.no_summary && !c->p.coef_summary && ns <= LR_WMAX &&
                      lr_vsum_update(c, layer);
    const size_t qd_head = (size_t)LR_SPARSE_MAX_Q * grp * (size_t)c->cap_chunks;
    /* (two-level selection scores only some chunks: the summaries convert their own landmarks) */
    const bool sel_dots = vsum && c->p.topp <= 0 && !c->p.bound && !c->p.coarse;
    if (sel_dots && !c->dqd) c->dqd = malloc((size_t)c->n_head_kv * qd_head * sizeof(float));
    const bool qdot = sel_dots && c->dqd;
    const int nthr = c->pool ? rk_pool_size(c->pool) : 1;
    /* the one-level landmark scores over the pool first (top-p, two-level and spread score
     * inside the selection, head by head) */
    const int64_t n_sel = lr_n_sel(c, layer);
    bool pre = c->p.topp <= 0 && c->p.coarse <= 1 && c->p.spread <= 0 && n_sel < n_ch;
    if (pre && !c->dcs) {
        c->dcs = malloc((size_t)c->n_head_kv * (size_t)c->cap_chunks * sizeof(float));
        if (c->dcs) c->scratch_bytes += (size_t)c->n_head_kv * (size_t)c->cap_chunks * sizeof(float);
    }
    if ((pre = pre && c->dcs)) {
        score_job sj = {c,    layer, grp, ns, head_parts(c->n_head_kv, nthr, n_ch, 16), n_ch, pos0, q, avx2,
                        qdot ? c->dqd : NULL, qd_head};
        if (c->pool) rk_pool_run(c->pool, score_worker, &sj);
        else score_worker(&sj, 0, 1);
    }
    /* choices and misses per head: over the pool, except under a tier (its reads) */
    choose_job cj = {c, layer, ns, pos0, q, avx2, qdot ? c->dqd : NULL, pre ? c->dcs : NULL, qd_head, NULL, RK_OK};
    if (c->pool && !c->tier && c->n_head_kv > 1) rk_pool_run(c->pool, choose_worker, &cj);
    else cj.err = err, choose_worker(&cj, 0, 1);
    if (cj.st) return cj.st;
    int64_t rebuilt = 0;
    for (int h = 0; h < c->n_head_kv; h++) {
        lr_head *H = &c->ly[layer].h[h];
        struct lr_hq *hq = &c->dhq[h];
        const int64_t n = c->dn[h];
        for (;;) {
            if (hq->slot_err) return rk_err_set(err, RK_E_INTERNAL, "lowram: no free key-cache slot (%d)", H->n_kc);
            if (hq->rows) {
                rk_status st = keys_batch(c, g, L, h, kr, r, hq->next_i < n, avx2, err);
                if (st != RK_OK) return st;
            }
            if (hq->next_i >= n) break;
            keys_gather(c, g, H, h, n); /* a full layer's misses past one batch */
        }
        rebuilt += hq->rows;
        /* with hyst: every other chunk still valid in the cache is attended exactly too (its
         * keys cost nothing now; it replaces that chunk's summary row). Like the hysteresis
         * itself this makes a step depend on the cache's history, not only on the stored rows
         * (an imported state or a replay after truncation may decode slightly differently). */
        const size_t o = (size_t)h * (size_t)c->cap_chunks;
        int32_t *sel = c->dsel + o, *slot = c->dslot + o;
        for (int k = 0; k < H->n_kc && !c->p.no_cache && c->p.hyst > 0; k++) {
            if (H->kc_used[k] == c->n_calls || !kc_valid(c, g, H, k, n_ch)) continue;
            sel[c->dn[h]] = H->kc_ch[k], slot[c->dn[h]] = k;
            c->dn[h]++;
        }
    }
    /* the last batch of every head into its slots */
    if (rebuilt) {
        encode_job ej = {c, L, avx2};
        if (c->pool && rebuilt >= 2 * C) rk_pool_run(c->pool, encode_worker, &ej);
        else encode_worker(&ej, 0, 1);
    }
    /* heads that do not divide over the threads are split into parts (3 KV heads on 2
     * threads: 6 tasks, each a contiguous share of the head's chosen chunks), merged here */
    int np = ns < LR_VREBUILD_MIN ? head_parts(c->n_head_kv, nthr, 1, 0) : 1;
    if (np > 1 && !c->dpo) c->dpo = malloc((size_t)c->n_head_kv * 4 * LR_WMAX * (hd + 2) * sizeof(float));
    if (!c->dpo) np = 1;
    dec_job d = {c, layer, q, n_q, pos0, out, avx2, vsum, np, c->dpo, qdot ? c->dqd : NULL, qd_head};
    if (c->pool) rk_pool_run(c->pool, dec_worker, &d);
    else dec_worker(&d, 0, 1);
    if (np > 1) { /* log-sum-exp merge of each head's parts */
        const int qd = c->n_head * hd;
        for (int h = 0; h < c->n_head_kv; h++)
            for (int j = 0; j < ns; j++) {
                float m = -INFINITY;
                for (int p = 0; p < np; p++) {
                    const float mp = c->dpo[((size_t)(h * np + p) * ns + j) * (hd + 2) + hd];
                    m = mp > m ? mp : m;
                }
                float *o = out + (size_t)(j / grp) * qd + (size_t)(h * grp + j % grp) * hd, l = 0;
                for (int e = 0; e < hd; e++) o[e] = 0;
                for (int p = 0; p < np; p++) {
                    const float *po = c->dpo + ((size_t)(h * np + p) * ns + j) * (hd + 2);
                    if (!(po[hd + 1] > 0)) continue;
                    const float w = expf(po[hd] - m);
                    l += w * po[hd + 1];
                    for (int e = 0; e < hd; e++) o[e] += w * po[e];
                }
                const float inv = 1.0f / l;
                for (int e = 0; e < hd; e++) o[e] *= inv;
            }
    }
    return RK_OK;
}

rk_status lr_attention(rk_kv_codec *c, int layer, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    if (!c->scr) return rk_err_set(err, RK_E_INTERNAL, "lowram: attention before the scratch exists");
    const bool sparse = !c->p.dense && n_q <= LR_SPARSE_MAX_Q && !(layer >= c->p.dense_l0 && layer < c->p.dense_l1);
    /* two-level selection: coarse landmarks up to the stored chunks (without them: one level) */
    if (sparse && c->p.coarse > 1) (void)lr_coarse_update(c, layer);
    if (c->tier) { /* lowram_tier.c: rows under a budget (every chunk resident unless selective) */
        rk_status ts = lr_tier_begin(c, layer, sparse && c->keys_op, err);
        if (ts) return ts;
    }
    if (sparse && c->keys_op) {
        c->n_calls++;
        rk_status st = sparse_decode(c, layer, q, n_q, pos0, out, err);
        if (c->tier) lr_tier_end(c, layer);
        return st;
    }
    attn_job a = {c, layer, q, n_q, pos0, 0, sparse ? LR_SPARSE_MAX_Q : LR_TILE, out, sparse, rk_cpu_has_avx2()};
    c->n_calls++;
    a.n_tiles = (n_q + a.tile - 1) / a.tile;
    /* decode stays on the caller's thread: a second pool spinning next to the backend's
     * costs more than the few heads of one step gain */
    if (c->pool && !sparse && n_q > LR_SPARSE_MAX_Q) rk_pool_run(c->pool, attn_worker, &a);
    else attn_worker(&a, 0, 1);
    if (c->tier) lr_tier_end(c, layer);
    return RK_OK;
}
