/* Included by lowram_attn.c only (after head_task and q_of): the spread correction of a
 * chunk's landmark score (rk_lowram_params.spread, docs/LOWRAM.md). */
#pragma once

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
        ia[np] = c->rope_mode == RK_ROPE_NEOX ? i : 2 * i, ib[np++] = c->rope_mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
    for (int d = c->n_rot; d < hd; d++) ia[np] = ib[np] = d, np++;
    const int64_t last = t->pos0 + t->ns / t->grp;
    float *M = x->spr + (size_t)t->ns * np;
    for (int p = 0; p < np; p++) M[p] = 0;
    if (last <= c->comp_end) return 0;
    for (int64_t pos = c->comp_end; pos < last; pos++) {
        const uint8_t *kr = lr_exact_ptr(c, t->l, false, pos);
        if (c->exact_type == RK_DT_F32) memcpy(x->row, (const float *)kr + (size_t)t->h * hd, (size_t)hd * sizeof(float));
        else rk_quant_fast(RK_DT_F16)->to_f32((const uint16_t *)kr + (size_t)t->h * hd, x->row, hd);
        for (int p = 0; p < np; p++) M[p] += x->row[ia[p]] * x->row[ia[p]] + (ia[p] != ib[p] ? x->row[ib[p]] * x->row[ib[p]] : 0);
    }
    for (int p = 0; p < np; p++) M[p] /= (float)(last - c->comp_end);
    for (int j = 0; j < t->ns; j++) {
        const float *qv = q_of(t, j);
        for (int p = 0; p < np; p++)
            x->spr[(size_t)j * np + p] = ia[p] != ib[p] ? 0.5f * (qv[ia[p]] * qv[ia[p]] + qv[ib[p]] * qv[ib[p]]) : qv[ia[p]] * qv[ia[p]];
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

