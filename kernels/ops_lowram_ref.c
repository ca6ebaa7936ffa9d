/* cpu_ref LR_KEYS: LowRAM's key rebuild, scalar, double accumulation (the oracle of the
 * cpu version in ops_lowram_cpu.c and of any device version). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"
#include "rk_simd.h" /* rk_simd_dot8: the order of LowRAM's dot products */

static double basis_at(const rk_view *b, int64_t j, int64_t d) {
    const char *row = (const char *)b->data + (size_t)j * b->nb1;
    return b->type == RK_DT_F16 ? (double)rk_f16_to_f32(((const uint16_t *)row)[d]) : (double)((const float *)row)[d];
}

rk_status rk_ref_lr_keys(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    const rk_rope_params *p = &a->rope;
    const int64_t n = rk_view_rows(&a->src0), r = a->src0.ne[0], hd = a->dst.ne[0];
    const int half = p->n_rot / 2;
    double *acc = malloc((size_t)(hd + half) * sizeof(double));
    if (!acc) return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: LR_KEYS scratch");
    double *freq = acc + hd;
    rk_rope_freqs(p, freq);
    const float *mean = rk_row_f32(&a->src2, 0), *winv = rk_row_f32(&a->src2, 1);
    for (int64_t k = 0; k < n; k++) {
        const float *cf = rk_row_f32(&a->src0, k);
        float *y = rk_row_f32(&a->dst, k);
        for (int64_t d = 0; d < hd; d++) {
            double s = 0;
            for (int64_t j = 0; j < r; j++) s += (double)cf[j] * basis_at(&a->src1, j, d);
            acc[d] = s * winv[d] + mean[d];
        }
        const int64_t pos = a->ids[k];
        for (int i = 0; i < half; i++) {
            const int64_t i0 = p->mode == RK_ROPE_NEOX ? i : 2 * i, i1 = p->mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
            double co, si;
            if (a->lr_rope_cs) {
                co = a->lr_rope_cs[pos * p->n_rot + 2 * i], si = a->lr_rope_cs[pos * p->n_rot + 2 * i + 1];
            } else {
                co = cos((double)pos * freq[i]), si = sin((double)pos * freq[i]);
            }
            const double x0 = acc[i0], x1 = acc[i1];
            acc[i0] = x0 * co - x1 * si;
            acc[i1] = x0 * si + x1 * co;
        }
        for (int64_t d = 0; d < hd; d++) y[d] = (float)acc[d];
    }
    free(acc);
    return RK_OK;
}

/* ---- cpu_ref LR_ATTN: LowRAM's sparse decode, fused (selection, key rebuild, attention) --
 * The order of runtime/kv/lowram_attn.c's sparse path (head_run with int8 coefficients):
 * sinks, selected chunks by index, summary rows in blocks of `chunk`, the exact window;
 * online softmax per block; values in coefficient space, W applied once per state row. */
static float lr_h2f(const void *p, size_t i) {
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return rk_f16_to_f32(h);
}

typedef struct lr_ref_state {
    int ns, hd, r, C;
    float *m, *l, *a, *acc_v, *acc_c, *sc; /* (ns), (ns), (ns), (ns, hd), (ns, r), (ns, C) */
} lr_ref_state;

/* scores of nb keys kb (nb, hd) for every state row (q rows qs (ns, hd)), bias per key or
 * NULL, vis[j]: keys visible to row j (<= nb); then the online-softmax rescale; weights in sc */
static void lr_ref_scores(lr_ref_state *s, const float *qs, const float *kb, int nb, const int *vis, const float *bias,
                          float scale) {
    for (int j = 0; j < s->ns; j++) {
        float *sc = s->sc + (size_t)j * s->C;
        const int nv = vis ? vis[j] : nb;
        float mx = -INFINITY;
        for (int k = 0; k < nv; k++) {
            sc[k] =
                rk_simd_dot8(qs + (size_t)j * s->hd, kb + (size_t)k * s->hd, s->hd) * scale + (bias ? bias[k] : 0.0f);
            mx = sc[k] > mx ? sc[k] : mx;
        }
        for (int k = nv; k < nb; k++) sc[k] = 0;
        if (nv == 0) continue;
        const float m_new = mx > s->m[j] ? mx : s->m[j];
        if (m_new > s->m[j]) {
            const float f = expf(s->m[j] - m_new);
            s->l[j] *= f, s->a[j] *= f;
            for (int d = 0; d < s->hd; d++) s->acc_v[(size_t)j * s->hd + d] *= f;
            for (int t = 0; t < s->r; t++) s->acc_c[(size_t)j * s->r + t] *= f;
            s->m[j] = m_new;
        }
        float sum = 0;
        for (int k = 0; k < nv; k++) sum += sc[k] = expf(sc[k] - m_new);
        s->l[j] += sum;
    }
}

/* exact rows [p0, p1) of head h (f16, kv_dim apart), rows at row(p) */
static void lr_ref_exact(lr_ref_state *s, const rk_lr_attn_args *L, int h, int kvd, const float *qs, bool sinks,
                         int64_t p0, int64_t p1, int64_t qpos0, int grp, float scale, float *kb, float *vb) {
    const int hd = s->hd, C = s->C;
    for (int64_t b0 = p0; b0 < p1; b0 += C) {
        const int nb = p1 - b0 < C ? (int)(p1 - b0) : C;
        for (int k = 0; k < nb; k++) {
            const int64_t row = sinks ? b0 + k : (b0 + k) % L->x_cap;
            const void *kr = (const uint8_t *)(sinks ? L->sk : L->xk) + ((size_t)row * kvd + (size_t)h * hd) * 2;
            const void *vr = (const uint8_t *)(sinks ? L->sv : L->xv) + ((size_t)row * kvd + (size_t)h * hd) * 2;
            for (int d = 0; d < hd; d++) kb[(size_t)k * hd + d] = lr_h2f(kr, d), vb[(size_t)k * hd + d] = lr_h2f(vr, d);
        }
        int vis[RK_LR_ATTN_MAX_STATE];
        for (int j = 0; j < s->ns; j++) {
            const int64_t lim = qpos0 + j / grp - b0 + 1;
            vis[j] = lim < 0 ? 0 : lim < nb ? (int)lim : nb;
        }
        lr_ref_scores(s, qs, kb, nb, vis, NULL, scale);
        for (int j = 0; j < s->ns; j++)
            for (int k = 0; k < nb; k++) {
                const float w = s->sc[(size_t)j * C + k];
                if (w != 0)
                    for (int d = 0; d < hd; d++) s->acc_v[(size_t)j * hd + d] += w * vb[(size_t)k * hd + d];
            }
    }
}

rk_status rk_ref_lr_attn(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    const rk_lr_attn_args *L = a->lr;
    const int n_head = a->attn.n_head, n_kv = a->attn.n_head_kv, hd = a->attn.head_dim;
    const int grp = n_head / n_kv, kvd = n_kv * hd, C = L->chunk, r = L->r, half = L->n_rot / 2;
    const int64_t n_q = rk_view_rows(&a->src0), pos0 = a->attn.pos0, last = pos0 + n_q;
    const int64_t n_ch = (L->n_rows + C - 1) / C;
    const int ns = (int)(n_q * grp);
    const float scale = a->attn.scale;
    const size_t nf = (size_t)ns * (3 + hd + r + C) + (size_t)ns * hd + 2 * (size_t)C * hd + (size_t)C * r + hd + C +
                      2 * (size_t)n_ch + (size_t)hd;
    float *buf = calloc(nf, sizeof(float));
    int32_t *sel = malloc(((size_t)n_ch + 1) * sizeof(int32_t));
    uint8_t *mark = calloc((size_t)n_ch + 1, 1);
    if (!buf || !sel || !mark) {
        free(buf), free(sel), free(mark);
        return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: LR_ATTN scratch");
    }
    lr_ref_state s = {ns, hd, r, C, buf, buf + ns, buf + 2 * ns, buf + 3 * ns, NULL, NULL};
    s.acc_c = s.acc_v + (size_t)ns * hd;
    s.sc = s.acc_c + (size_t)ns * r;
    float *qs = s.sc + (size_t)ns * C, *kb = qs + (size_t)ns * hd, *vb = kb + (size_t)C * hd, *cf = vb + (size_t)C * hd;
    float *row = cf + (size_t)C * r, *bias = row + hd, *csc = bias + C, *wrow = csc + 2 * n_ch;
    for (int h = 0; h < n_kv; h++) {
        for (int j = 0; j < ns; j++) {
            const float *qv = rk_row_f32(&a->src0, j / grp) + (size_t)(h * grp + j % grp) * hd;
            memcpy(qs + (size_t)j * hd, qv, (size_t)hd * sizeof(float));
            s.m[j] = -INFINITY, s.l[j] = 0, s.a[j] = 0;
        }
        memset(s.acc_v, 0, (size_t)ns * hd * sizeof(float));
        memset(s.acc_c, 0, (size_t)ns * r * sizeof(float));
        /* selection: max over state rows of q . landmark; stable rank < n_sel */
        int64_t n = 0;
        for (int64_t ch = 0; ch < n_ch; ch++) {
            for (int d = 0; d < hd; d++) row[d] = lr_h2f(L->lmk, (size_t)ch * kvd + (size_t)h * hd + d);
            float best = -INFINITY;
            for (int j = 0; j < ns; j++) {
                const float d = rk_simd_dot8(qs + (size_t)j * hd, row, hd);
                best = d > best ? d : best;
            }
            csc[ch] = best;
        }
        for (int64_t ch = 0; ch < n_ch; ch++) {
            int64_t rank = 0;
            for (int64_t o = 0; o < n_ch && rank < L->n_sel; o++)
                rank += csc[o] > csc[ch] || (csc[o] == csc[ch] && o < ch);
            mark[ch] = rank < L->n_sel && n < L->n_sel; /* NaN scores rank 0: at most n_sel */
            if (mark[ch]) sel[n++] = (int32_t)ch;
        }
        lr_ref_exact(&s, L, h, kvd, qs, true, 0, L->n_sink < last ? L->n_sink : last, pos0, grp, scale, kb, vb);
        const uint8_t *res = L->res + (size_t)h * L->res_hstride;
        const uint32_t *mask = L->mask + (size_t)h * L->mb_hstride;
        const int32_t *base = L->base + (size_t)h * L->mb_hstride;
        for (int64_t i = 0; i < n; i++) { /* chosen chunks: keys rebuilt, values in coefficient space */
            const int64_t ch = sel[i], r0 = ch * C;
            const int nb = L->n_rows - r0 < C ? (int)(L->n_rows - r0) : C;
            for (int k = 0; k < nb; k++) {
                const uint8_t *cr = L->coef + (size_t)(r0 + k) * L->coef_bytes;
                const float sc = lr_h2f(cr, 0);
                for (int t = 0; t < r; t++) cf[(size_t)k * r + t] = (float)((const int8_t *)(cr + 2))[t] * sc;
                float *kr = kb + (size_t)k * hd;
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int t = 0; t < r; t++)
                        acc +=
                            (double)cf[(size_t)k * r + t] * lr_h2f(L->basis, (size_t)t * L->ldb + (size_t)h * hd + d);
                    kr[d] = (float)acc * L->winv[h * hd + d] + L->mean[h * hd + d];
                }
                const double p = (double)L->pos[r0 + k];
                for (int e = 0; e < half; e++) {
                    const int i0 = L->rope_mode == RK_ROPE_NEOX ? e : 2 * e,
                              i1 = L->rope_mode == RK_ROPE_NEOX ? e + half : 2 * e + 1;
                    const float co = (float)cos(p * L->freq[e]), si = (float)sin(p * L->freq[e]), x0 = kr[i0],
                                x1 = kr[i1];
                    kr[i0] = x0 * co - x1 * si;
                    kr[i1] = x0 * si + x1 * co;
                }
                if (L->key_int8) { /* the codec's int8 key cache (lr_encode_row) */
                    float mx = 0;
                    for (int d = 0; d < hd; d++) mx = fmaxf(mx, fabsf(kr[d]));
                    const float ks = rk_f16_to_f32(rk_f32_to_f16(mx / 127.0f)), inv = ks > 0 ? 1.0f / ks : 0;
                    for (int d = 0; d < hd; d++) {
                        long q = lrintf(kr[d] * inv);
                        q = q > 127 ? 127 : q < -127 ? -127 : q;
                        kr[d] = (float)q * ks;
                    }
                } else {
                    for (int d = 0; d < hd; d++) kr[d] = rk_f16_to_f32(rk_f32_to_f16(kr[d]));
                }
            }
            lr_ref_scores(&s, qs, kb, nb, NULL, NULL, scale);
            int64_t slot = base[ch];
            for (int k = 0; k < nb; k++) {
                const bool has = (mask[ch] >> k) & 1u;
                if (has) {
                    const uint8_t *rr = res + (size_t)slot++ * L->res_bytes;
                    const float rs = lr_h2f(rr, 0);
                    for (int d = 0; d < hd; d++) row[d] = (float)((const int8_t *)(rr + 2))[d] * rs;
                }
                for (int j = 0; j < ns; j++) {
                    const float w = s.sc[(size_t)j * C + k];
                    s.a[j] += w;
                    for (int t = 0; t < r; t++) s.acc_c[(size_t)j * r + t] += w * cf[(size_t)k * r + t];
                    if (has)
                        for (int d = 0; d < hd; d++) s.acc_v[(size_t)j * hd + d] += w * row[d];
                }
            }
        }
        if (n < n_ch && L->summaries) /* one row per other chunk: landmark key, mean coefficients */
            for (int64_t ch = 0; ch < n_ch;) {
                int nb = 0;
                for (; nb < C && ch < n_ch; ch++) {
                    if (mark[ch]) continue;
                    const int64_t rows = L->n_rows - ch * C < C ? L->n_rows - ch * C : C;
                    for (int d = 0; d < hd; d++)
                        kb[(size_t)nb * hd + d] = lr_h2f(L->lmk, (size_t)ch * kvd + (size_t)h * hd + d);
                    for (int t = 0; t < r; t++) cf[(size_t)nb * r + t] = lr_h2f(L->cmean, (size_t)ch * r + t);
                    bias[nb++] = logf((float)rows);
                }
                if (!nb) break;
                lr_ref_scores(&s, qs, kb, nb, NULL, bias, scale);
                for (int k = 0; k < nb; k++)
                    for (int j = 0; j < ns; j++) {
                        const float w = s.sc[(size_t)j * C + k];
                        s.a[j] += w;
                        for (int t = 0; t < r; t++) s.acc_c[(size_t)j * r + t] += w * cf[(size_t)k * r + t];
                    }
            }
        lr_ref_exact(&s, L, h, kvd, qs, false, L->x_lo, last, pos0, grp, scale, kb, vb);
        for (int t = 0; t < r; t++) { /* acc_v += (Σ a c) W, one row of W at a time */
            for (int d = 0; d < hd; d++) wrow[d] = lr_h2f(L->W, (size_t)t * kvd + (size_t)h * hd + d);
            for (int j = 0; j < ns; j++) {
                const float w = s.acc_c[(size_t)j * r + t];
                for (int d = 0; d < hd; d++) s.acc_v[(size_t)j * hd + d] += w * wrow[d];
            }
        }
        for (int j = 0; j < ns; j++) {
            float *o = rk_row_f32(&a->dst, j / grp) + (size_t)(h * grp + j % grp) * hd;
            const float inv = 1.0f / s.l[j];
            for (int d = 0; d < hd; d++) o[d] = (s.acc_v[(size_t)j * hd + d] + s.a[j] * L->b[h * hd + d]) * inv;
        }
    }
    free(buf), free(sel), free(mark);
    return RK_OK;
}
