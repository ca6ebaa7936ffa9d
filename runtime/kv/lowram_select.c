/* LowRAM decode's chunk selection (built per ISA, lowram_task.h): landmark scores (one
 * level, or two with coarse=G: only the best groups' chunks scored; with spread, the chunks'
 * spread correction), the top budget/chunk chunks, or top-p over the estimated attention
 * mass (topp); and the one-level scores of a range of chunks that sparse decode computes over
 * the pool before the per-head choice. */
#include <stdlib.h>

#include "lowram_task.h"

/* spread: the landmark k̄ underestimates a chunk's mass (exp(q·k̄) <= mean exp(q·k)); with
 * q·k Gaussian over the chunk's rows the log-mass gains Var(q·k) / 2hd. Per RoPE pair p (the
 * rotation spreads a far chunk's pairs over every angle, so each pair's spread is taken as
 * isotropic): Var(q·k) ~ Σ_p |q_p|² (E|k_p|² - |k̄_p|²) / 2, E|k_p|² from the exact window rows
 * (a pair's norm does not depend on its position). Prepares per state row the pair weights
 * |q_p|² · f (f = 1/2 for a pair, 1 for an unrotated dim) in spr and the window's E|k_p|²
 * after them; returns the number of pairs (0: no exact rows to estimate from). */
LR_AI int spread_prep(const head_task *t, int *ia, int *ib) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd, half = c->n_rot / 2;
    int np = 0;
    for (int i = 0; i < half; i++)
        ia[np] = c->rope_mode == RK_ROPE_NEOX ? i : 2 * i,
        ib[np++] = c->rope_mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
    for (int d = c->n_rot; d < hd; d++) ia[np] = ib[np] = d, np++;
    const int64_t last = t->pos0 + t->ns / t->grp;
    float *M = x->spr + (size_t)t->ns * np;
    for (int p = 0; p < np; p++) M[p] = 0;
    if (last <= c->comp_end) return 0;
    for (int64_t pos = c->comp_end; pos < last; pos++) {
        const uint8_t *kr = lr_exact_ptr(c, t->l, false, pos);
        if (c->exact_type == RK_DT_F32)
            memcpy(x->row, (const float *)kr + (size_t)t->h * hd, (size_t)hd * sizeof(float));
        else rk_quant_fast(RK_DT_F16)->to_f32((const uint16_t *)kr + (size_t)t->h * hd, x->row, hd);
        for (int p = 0; p < np; p++)
            M[p] += x->row[ia[p]] * x->row[ia[p]] + (ia[p] != ib[p] ? x->row[ib[p]] * x->row[ib[p]] : 0);
    }
    for (int p = 0; p < np; p++) M[p] /= (float)(last - c->comp_end);
    for (int j = 0; j < t->ns; j++) {
        const float *qv = q_of(t, j);
        for (int p = 0; p < np; p++)
            x->spr[(size_t)j * np + p] =
                ia[p] != ib[p] ? 0.5f * (qv[ia[p]] * qv[ia[p]] + qv[ib[p]] * qv[ib[p]]) : qv[ia[p]] * qv[ia[p]];
    }
    return np;
}

/* The raw-dot-product units a chunk with landmark row lm gains for state row j (see spread_prep):
 * sqrt(hd) times min(4, spread · Var / 2hd) nats. u: np floats of scratch, filled at j == 0. */
LR_AI float spread_gain(const head_task *t, int np, const int *ia, const int *ib, const float *lm, float *u, int j) {
    const rk_kv_codec *c = t->c;
    const float *M = t->x->spr + (size_t)t->ns * np, *w = t->x->spr + (size_t)j * np;
    if (j == 0)
        for (int p = 0; p < np; p++) {
            const float l2 = lm[ia[p]] * lm[ia[p]] + (ia[p] != ib[p] ? lm[ib[p]] * lm[ib[p]] : 0);
            u[p] = M[p] > l2 ? M[p] - l2 : 0.0f;
        }
    float v = 0;
    for (int p = 0; p < np; p++) v += w[p] * u[p];
    const float g = c->p.spread * v / (2.0f * (float)c->hd);
    return sqrtf((float)c->hd) * (g < 4.0f ? g : 4.0f);
}

/* The k-th largest (k from 0) of v[0..n), as v sorted in decreasing order would hold it at k:
 * quickselect (expected O(n), v is reordered), not a sort of the whole array per head and layer. */
LR_AI float kth_largest(float *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const float a = v[lo], b = v[lo + (hi - lo) / 2], z = v[hi];
        const float piv = a > b ? (b > z ? b : a > z ? z : a) : (a > z ? a : b > z ? z : b); /* median of 3 */
        int64_t i = lo, j = hi;
        while (i <= j) { /* [lo, i) >= piv, (j, hi] <= piv */
            while (v[i] > piv) i++;
            while (v[j] < piv) j--;
            if (i <= j) {
                const float t = v[i];
                v[i++] = v[j], v[j--] = t;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return v[k]; /* between the two parts: equal to piv */
    }
    return v[k];
}

/* Landmark score of chunk ch for the selection: max over the state rows of q·landmark (with
 * spread, plus its gain); the dot products go to t->qdot for the summaries. qs: the state
 * rows' queries when the AVX2 dots apply (the AVX2 build, head_dim % 8 == 0, ns <=
 * LR_DOT_MAX, no spread), else NULL. */
LR_AI float chunk_score(const head_task *t, int64_t ch, int64_t n_ch, int np, const int *ia, const int *ib, float *u,
                        const float *const *qs) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const int hd = c->hd;
    float best = -INFINITY;
#ifdef LR_ISA_AVX2
    if (qs && !L->lmin) {
        float d[LR_DOT_MAX];
        lmk_dots_avx2(qs, t->ns, (const uint8_t *)(L->lmk + (size_t)ch * c->kvd + (size_t)t->h * hd), LR_R_F16, hd, d);
        for (int j = 0; j < t->ns; j++) {
            if (t->qdot) ((float *)t->qdot)[(size_t)j * n_ch + ch] = d[j];
            best = d[j] > best ? d[j] : best;
        }
        return best;
    }
#else
    (void)qs;
#endif
    if (L->lmin) { /* max over keys in the box [min, max] of q·k: Σ_d max(q_d min_d, q_d max_d) */
        const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
        float *lo = x->kb, *hi = x->vb;
        f16->to_f32(L->lmin + (size_t)ch * c->kvd + (size_t)t->h * hd, lo, hd);
        f16->to_f32(L->lmax + (size_t)ch * c->kvd + (size_t)t->h * hd, hi, hd);
        for (int j = 0; j < t->ns; j++) {
            const float *qv = q_of(t, j);
            float d = 0;
            for (int e = 0; e < hd; e++) d += fmaxf(qv[e] * lo[e], qv[e] * hi[e]);
            best = d > best ? d : best;
        }
        return best;
    }
    rk_quant_fast(RK_DT_F16)->to_f32(L->lmk + (size_t)ch * c->kvd + (size_t)t->h * hd, x->row, hd);
    for (int j = 0; j < t->ns; j++) {
        float d = rk_simd_dot8(q_of(t, j), x->row, hd);
        if (np) d += spread_gain(t, np, ia, ib, x->row, u, j);
        if (t->qdot) ((float *)t->qdot)[(size_t)j * n_ch + ch] = d; /* for the summaries */
        best = d > best ? d : best;
    }
    return best;
}

/* The state rows' query pointers for lmk_dots_avx2, or NULL where it does not apply. */
LR_AI const float *const *dot_queries(const head_task *t, int np, const float **qs) {
#ifdef LR_ISA_AVX2
    if (t->c->hd % 8 == 0 && t->ns <= LR_DOT_MAX && !np) {
        for (int j = 0; j < t->ns; j++) qs[j] = q_of(t, j);
        return qs;
    }
#endif
    (void)t, (void)np, (void)qs;
    return NULL;
}

/* Two-level candidates (coarse=G): scores the layer's coarse landmarks, keeps the best
 * coarse_keep x n_sel / G groups (ties by index, as the chunks below) and marks their chunks
 * in x->mark. Returns false (nothing marked) when the coarse landmarks are unavailable. */
LR_AI bool coarse_mark(const head_task *t, int64_t n_ch, int64_t n_sel) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const int hd = c->hd, G = c->p.coarse;
    if (!L->clmk) return false;
    const int64_t n_cg = (n_ch + G - 1) / G;
    int64_t keep = (int64_t)ceil((double)c->p.coarse_keep * (double)n_sel / G);
    if (keep < (n_sel + G - 1) / G) keep = (n_sel + G - 1) / G;
    if (keep > n_cg) keep = n_cg;
    float *cs = x->ccs, *cs2 = x->ccs + c->cap_chunks;
    const size_t crow = (size_t)c->n_head_kv * (2u + (size_t)hd);
    const float *qp[LR_WMAX];
    const float *const *qs = dot_queries(t, 0, qp);
    (void)qs;                            /* (the baseline build has no AVX2 dots) */
    for (int64_t k = 0; k < n_cg; k++) { /* int8 rows: the scale multiplies the dot product */
        const uint8_t *rw = L->clmk + (size_t)k * crow + (size_t)t->h * (2u + (size_t)hd);
        float best = -INFINITY;
#ifdef LR_ISA_AVX2
        if (qs) {
            float d[LR_DOT_MAX];
            lmk_dots_avx2(qs, t->ns, rw + 2, LR_R_I8, hd, d);
            for (int j = 0; j < t->ns; j++) best = d[j] > best ? d[j] : best;
        } else
#endif
        {
            const int8_t *qv = (const int8_t *)(rw + 2);
            for (int e = 0; e < hd; e++) x->row[e] = (float)qv[e];
            for (int j = 0; j < t->ns; j++) {
                const float d = rk_simd_dot8(q_of(t, j), x->row, hd);
                best = d > best ? d : best;
            }
        }
        cs[k] = best * rk_f16_to_f32((uint16_t)(rw[0] | (rw[1] << 8)));
    }
    x->n_clmk += (uint64_t)n_cg;
    memcpy(cs2, cs, (size_t)n_cg * sizeof(float));
    const float th = kth_largest(cs2, n_cg, keep - 1);
    memset(x->mark, 0, (size_t)n_ch);
    int64_t n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t k = 0; k < n_cg && n < keep; k++)
            if (pass ? cs[k] == th : cs[k] > th) {
                for (int64_t ch = k * G; ch < (k + 1) * G && ch < n_ch; ch++) x->mark[ch] = 1;
                n++;
            }
    return true;
}

/* Chunks whose landmark scores highest (max over the state rows), budget / chunk of them.
 * With coarse=G only the chunks of the best coarse groups are scored (the others score
 * -inf); keeping every group gives the one-level choice. */
LR_AI int64_t select_chunks(const head_task *t, int64_t n_ch) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const int hd = c->hd;
    int ia[LR_ROPE_MAX], ib[LR_ROPE_MAX];
    float u[LR_ROPE_MAX];
    int64_t n_sel = lr_n_sel(c, t->l);
    if (n_sel >= n_ch) {
        for (int64_t i = 0; i < n_ch; i++) x->sel[i] = (int32_t)i;
        return n_ch;
    }
    const int np = c->p.spread > 0 && !L->lmin && hd <= LR_ROPE_MAX ? spread_prep(t, ia, ib) : 0;
    const bool two = !t->pre && c->p.coarse > 1 && !L->lmin && !t->qdot && coarse_mark(t, n_ch, n_sel);
    const float *qp[LR_WMAX];
    const float *const *qs = dot_queries(t, np, qp);
    int64_t m = 0; /* scored chunks, their scores compacted in csc2 */
    for (int64_t ch = 0; ch < n_ch; ch++) {
        if (two && !x->mark[ch]) {
            x->csc[ch] = -INFINITY;
            continue;
        }
        x->csc2[m++] = x->csc[ch] = t->pre ? t->pre[ch] : chunk_score(t, ch, n_ch, np, ia, ib, u, qs);
    }
    if (!t->pre) x->n_lmk += (uint64_t)m; /* (score_worker counts its own) */
    /* hysteresis: chunks whose keys are cached (and still valid) score hyst nats higher */
    const lr_head *H = &L->h[t->h];
    if (c->p.hyst > 0 && !c->p.no_cache) {
        const float bonus = c->p.hyst * sqrtf((float)hd);
        const lr_group *g = &c->g[L->grp];
        for (int i = 0; i < H->n_kc; i++)
            if (kc_valid(c, g, H, i, n_ch) && (!two || x->mark[H->kc_ch[i]])) x->csc[H->kc_ch[i]] += bonus;
        m = 0;
        for (int64_t ch = 0; ch < n_ch; ch++)
            if (!two || x->mark[ch]) x->csc2[m++] = x->csc[ch];
    }
    /* pinned chunks (mass_pin) first: they take their share of the budget whatever they score */
    if (H->n_pin && !c->p.dense) {
        m = 0;
        for (int i = 0; i < H->n_pin; i++)
            if (H->pin[i] < n_ch) x->csc[H->pin[i]] = INFINITY;
        for (int64_t ch = 0; ch < n_ch; ch++)
            if (!two || x->mark[ch] || x->csc[ch] == INFINITY) x->csc2[m++] = x->csc[ch];
        if (two)
            for (int i = 0; i < H->n_pin; i++)
                if (H->pin[i] < n_ch) x->mark[H->pin[i]] = 1;
    }
    if (m <= n_sel) { /* every scored chunk */
        int64_t n = 0;
        for (int64_t ch = 0; ch < n_ch; ch++)
            if (!two || x->mark[ch]) x->sel[n++] = (int32_t)ch;
        return n;
    }
    const float th = kth_largest(x->csc2, m, n_sel - 1);
    int64_t n = 0;
    for (int64_t ch = 0; ch < n_ch && n < n_sel; ch++)
        if (x->csc[ch] > th && (!two || x->mark[ch])) x->sel[n++] = (int32_t)ch;
    for (int64_t ch = 0; ch < n_ch && n < n_sel; ch++)
        if (x->csc[ch] == th && (!two || x->mark[ch])) x->sel[n++] = (int32_t)ch;
    return n;
}

/* Per state row j, log Σ exp(q_j·k / sqrt(hd)) over the exact rows the query sees (sinks,
 * and [comp_end, last)) into lse (ns). */
LR_AI void exact_lse(const head_task *t, int64_t last, float *lse) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd, C = c->p.chunk;
    const float scale = 1.0f / sqrtf((float)hd);
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    float *m = x->st_m, *l = x->st_a; /* reset by lr_head_run later */
    for (int j = 0; j < t->ns; j++) m[j] = -INFINITY, l[j] = 0;
    const int64_t ranges[2][2] = {{0, c->p.n_sink < last ? c->p.n_sink : last}, {c->comp_end, last}};
    for (int rg = 0; rg < 2; rg++)
        for (int64_t b0 = ranges[rg][0]; b0 < ranges[rg][1]; b0 += C) {
            const int nb = ranges[rg][1] - b0 < C ? (int)(ranges[rg][1] - b0) : C;
            for (int k = 0; k < nb; k++) {
                const uint8_t *kr = lr_exact_ptr(c, t->l, false, b0 + k);
                if (c->exact_type == RK_DT_F32)
                    memcpy(x->kb + (size_t)k * hd, (const float *)kr + (size_t)t->h * hd, (size_t)hd * sizeof(float));
                else f16->to_f32((const uint16_t *)kr + (size_t)t->h * hd, x->kb + (size_t)k * hd, hd);
            }
            for (int j = 0; j < t->ns; j++) {
                const float *qv = q_of(t, j);
                for (int k = 0; k < nb; k++) {
                    const float sc = rk_simd_dot8(qv, x->kb + (size_t)k * hd, hd) * scale;
                    if (sc > m[j]) l[j] = l[j] * expf(m[j] - sc) + 1.0f, m[j] = sc;
                    else l[j] += expf(sc - m[j]);
                }
            }
        }
    for (int j = 0; j < t->ns; j++) lse[j] = l[j] > 0 ? m[j] + logf(l[j]) : -INFINITY;
}

static int cmp_ord(const void *a, const void *b) {
    const struct lr_ord *u = a, *v = b;
    return (u->v < v->v) - (u->v > v->v) ? (u->v < v->v) - (u->v > v->v) : (u->i > v->i) - (u->i < v->i);
}
static int cmp_i32(const void *a, const void *b) {
    const int32_t u = *(const int32_t *)a, v = *(const int32_t *)b;
    return (u > v) - (u < v);
}

/* Top-p: each chunk's estimated share of every query head's attention (landmark score +
 * log of its rows, against the exact rows' and every chunk's), chunks by decreasing largest
 * share, kept until every query head's left-out share is at most 1 - topp (at least
 * min_chunks, at most budget / chunk). Returns the chosen chunks in x->sel, by index. */
LR_AI int64_t select_topp(const head_task *t, int64_t n_ch) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const lr_layer *L = &c->ly[t->l];
    const lr_group *g = &c->g[L->grp];
    const int hd = c->hd, C = c->p.chunk, ns = t->ns;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t n_max = lr_n_sel(c, t->l), n_min = c->p.min_chunks < n_max ? c->p.min_chunks : n_max;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    float *lse = x->st_l; /* reset by lr_head_run later */
    exact_lse(t, t->pos0 + ns / t->grp, lse);
    float *drop = x->st_m;
    for (int64_t ch = 0; ch < n_ch; ch++) {
        const int64_t rows = g->n_rows - ch * C < C ? g->n_rows - ch * C : C;
        const float bias = logf((float)rows);
        if (L->lmin) { /* bound: the largest q·k over the chunk's per-dim key box (Quest) */
            float *lo = x->kb, *hi = x->vb;
            f16->to_f32(L->lmin + (size_t)ch * c->kvd + (size_t)t->h * hd, lo, hd);
            f16->to_f32(L->lmax + (size_t)ch * c->kvd + (size_t)t->h * hd, hi, hd);
            for (int j = 0; j < ns; j++) {
                const float *qv = q_of(t, j);
                float d = 0;
                for (int e = 0; e < hd; e++) d += fmaxf(qv[e] * lo[e], qv[e] * hi[e]);
                x->pm[(size_t)j * n_ch + ch] = d * scale + bias;
            }
            continue;
        }
        f16->to_f32(L->lmk + (size_t)ch * c->kvd + (size_t)t->h * hd, x->row, hd);
        for (int j = 0; j < ns; j++) x->pm[(size_t)j * n_ch + ch] = rk_simd_dot8(q_of(t, j), x->row, hd) * scale + bias;
    }
    for (int64_t ch = 0; ch < n_ch; ch++) x->ord[ch] = (struct lr_ord){0.0f, (int32_t)ch};
    for (int j = 0; j < ns; j++) {
        float *pj = x->pm + (size_t)j * n_ch;
        float mx = lse[j];
        for (int64_t ch = 0; ch < n_ch; ch++) mx = pj[ch] > mx ? pj[ch] : mx;
        float z = isfinite(lse[j]) ? expf(lse[j] - mx) : 0.0f;
        for (int64_t ch = 0; ch < n_ch; ch++) z += pj[ch] = expf(pj[ch] - mx);
        const float iz = 1.0f / z;
        float d = 0;
        for (int64_t ch = 0; ch < n_ch; ch++) {
            pj[ch] *= iz;
            d += pj[ch];
            if (pj[ch] > x->ord[ch].v) x->ord[ch].v = pj[ch];
        }
        drop[j] = d;
    }
    qsort(x->ord, (size_t)n_ch, sizeof *x->ord, cmp_ord);
    const float tol = 1.0f - c->p.topp;
    int64_t n = 0;
    while (n < n_max && n < n_ch) {
        if (n >= n_min) {
            float worst = 0;
            for (int j = 0; j < ns; j++) worst = drop[j] > worst ? drop[j] : worst;
            if (worst <= tol) break;
        }
        const int32_t ch = x->ord[n].i;
        for (int j = 0; j < ns; j++) drop[j] -= x->pm[(size_t)j * n_ch + ch];
        x->sel[n++] = ch;
    }
    qsort(x->sel, (size_t)n, sizeof *x->sel, cmp_i32);
    return n;
}

int64_t LR_ISA(lr_select_chunks)(const head_task *t, int64_t n_ch) { return select_chunks(t, n_ch); }
int64_t LR_ISA(lr_select_topp)(const head_task *t, int64_t n_ch) { return select_topp(t, n_ch); }

void LR_ISA(lr_score_range)(const head_task *t, int64_t a, int64_t b, int64_t n_ch, float *out) {
    const float *qp[LR_WMAX];
    const float *const *qs = dot_queries(t, 0, qp);
    for (int64_t ch = a; ch < b; ch++) out[ch] = chunk_score(t, ch, n_ch, 0, NULL, NULL, NULL, qs);
    t->x->n_lmk += (uint64_t)(b - a);
}
