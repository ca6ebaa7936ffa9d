/* LowRAM attention of one head task (built per ISA, lowram_task.h): exact softmax attention
 * over sinks + window (exact rows) and over compressed chunks whose keys come from decode's
 * key cache or are rebuilt on the fly (K = RoPE(mean + C·B)); values are accumulated in
 * coefficient space (Σ a·c, then one product with the predictor W) plus the stored
 * residuals. Decode attends the chunks chosen beforehand (lowram_keys.c) and the others as
 * summary rows (lowram_summary.c); dense mode and longer evals visit every chunk, one chunk
 * at a time (the cache is never rebuilt whole). */
#include "lowram_task.h"

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
            const uint8_t *kr = lr_exact_ptr(c, t->l, false, b0 + k) + off,
                          *vr = lr_exact_ptr(c, t->l, true, b0 + k) + off;
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

#ifdef LR_ISA_AVX2
/* Whether the chunks of this task's key-cache slots can be scored by kc_scores. */
LR_AI bool kc_direct(const head_task *t) {
    return t->c->p.kc_type == RK_DT_Q8_0 && t->ns >= 1 && t->ns <= LR_DOT_MAX && t->c->hd % 8 == 0;
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
    const bool i8 =
        kslot >= 0 && t->use_c && c->p.coef_type == RK_DT_Q8_0 && t->ns <= LR_WMAX && t->ns < LR_VREBUILD_MIN;
    if (!i8) lr_coef_rows(c, g, r0, nb, x->cf);
#ifdef LR_ISA_AVX2
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
#ifdef LR_ISA_AVX2
    if (i8) {
        acc_rows_avx2(x->acc_c, (size_t)c->r_max, t->ns, x->sc, 1, (size_t)c->sc_ld,
                      g->coef + (size_t)r0 * g->coef_bytes, g->coef_bytes, LR_R_I8, nb, rv);
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

#ifdef LR_ISA_AVX2
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

void LR_ISA(lr_head_run)(head_task *t) {
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
        const int64_t n = t->sel ? t->n_sel : LR_ISA(lr_select_chunks)(t, n_ch);
#ifdef LR_ISA_AVX2
        /* runs of consecutive chosen chunks as one block (comp_chunk's fused int8 path only) */
        const bool runs = t->slot && t->use_c && c->p.coef_type == RK_DT_Q8_0 && t->ns <= LR_WMAX &&
                          t->ns < LR_VREBUILD_MIN && 2 * c->p.chunk <= c->sc_ld;
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
#ifdef LR_ISA_AVX2
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
            if (t->vsum) LR_ISA(lr_vsummaries)(t, n_ch); /* (a split head's parts share its blocks) */
            else if (pt == 0) LR_ISA(lr_summaries)(t, n_ch);
        }
    } else {
        for (int64_t ch = 0; ch < n_ch; ch++) comp_chunk(t, ch, -1);
    }
    if (pt == np - 1) plain_rows(t, c->comp_end, last);
#ifdef LR_ISA_AVX2
    if (fuse_w && !c->wide) {
        acc_rows_avx2(x->acc_v, (size_t)hd, t->ns, x->acc_c, 1, (size_t)c->r_max,
                      (const uint8_t *)((const uint16_t *)L->W + (size_t)t->h * hd), (size_t)c->kvd * 2, LR_R_F16,
                      lr_vr(c, g), hd);
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
