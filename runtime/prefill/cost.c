/* The cost model of prefill progress (plan_impl.h): weighted FLOPs of the work a chunk
 * plan runs, so that progress moves in step with time whatever the order (chunk-major,
 * layer-major, staged), however few rows the late layers of a fill run, and however much
 * of the attention sparse attention leaves out. */
#include <math.h>

#include "plan_impl.h"

/* FLOPs of one row through one layer's matrices: Q and O (d x q each), K and V (d x kv
 * each), the gated MLP (3 d x ff). */
double rk_cost_full_row(const rk_hparams *hp) {
    const double d = hp->n_embd, q = (double)hp->n_head * hp->head_dim, kv = (double)hp->n_head_kv * hp->head_dim;
    return 2.0 * (2.0 * d * q + 2.0 * d * kv + 3.0 * d * hp->n_ff);
}

/* A filled row at late layer l: the K and V projections, and its predicted input
 * x̂_l = W_l x_S (d x d) past the split layer (W_S = I). */
static double fill_row(const rk_hparams *hp, const rk_chunk_plan *p, int l) {
    const double d = hp->n_embd, kv = (double)hp->n_head_kv * hp->head_dim;
    return 2.0 * 2.0 * d * kv + (p->src == RK_SRC_RIDGE && l > p->split ? 2.0 * d * d : 0.0);
}

/* Keys a late-layer exact row at position pos attends to: every row before it, or with
 * grouped attention the exact rows and one row per run of `group` filled rows, of which
 * (1 - share) of the bulk rows [start, bulk_end) are. */
static double late_keys(const rk_cost_ctx *c, double pos) {
    double bulk = (pos < (double)c->bulk_end ? pos : (double)c->bulk_end) - (double)c->start;
    if (bulk < 0) bulk = 0;
    const double filled = bulk * (1.0 - c->share);
    return c->group > 0 ? pos + 1.0 - filled * (1.0 - 1.0 / c->group) : pos + 1.0;
}

/* (query, key) pairs of the rows [pos0, pos0 + n) of one full-attention layer: what the
 * dense kernel pays (into *fixed), or, when the call goes sparse (kernels/attn_sparse.c:
 * rows below dense_from, the last of them seeing min_kv keys or more, more rows than n_est),
 * the sinks' and window's blocks and the estimation (into *fixed) and the other causal
 * blocks (into *lines: the share the estimated lines select is measured as the call runs). */
static void full_pairs(const rk_cost_ctx *c, int64_t pos0, int64_t n, double *fixed, double *lines) {
    int64_t n_s = c->sp_on ? c->sp_dense_from - pos0 : 0;
    n_s = n_s < 0 ? 0 : n_s > n ? n : n_s;
    if (n_s <= c->sp_n_est || pos0 + n_s < c->sp_min_kv) n_s = 0;
    const double dn = (double)(n - n_s), p0 = (double)(pos0 + n_s);
    *fixed += dn * p0 + 0.5 * dn * (dn + 1.0); /* the dense rows: sum of (pos + 1) */
    if (n_s == 0) return;
    const int64_t B = c->sp_block, last = pos0 + n_s - 1;
    *fixed += RK_COST_EST_WEIGHT * (double)c->sp_n_est * (double)(last + 1);
    for (int64_t qb = pos0 / B; qb <= last / B; qb++) {
        const int64_t r0 = qb * B > pos0 ? qb * B : pos0, r1 = (qb + 1) * B - 1 < last ? (qb + 1) * B - 1 : last;
        const double rows = (double)(r1 - r0 + 1);
        int64_t wlo = qb * B - c->sp_window <= 0 ? 0 : (qb * B - c->sp_window) / B;
        const int64_t sinks = c->sp_sink_b < qb + 1 ? c->sp_sink_b : qb + 1;
        if (wlo < sinks) wlo = sinks;
        const double forced = (double)(sinks + (qb + 1 - wlo)), causal = (double)(qb + 1);
        *fixed += rows * forced * (double)B;
        *lines += rows * (causal - forced) * (double)B;
    }
}

rk_cost rk_cost_chunk(const rk_session *s, const rk_cost_ctx *c, const rk_chunk_plan *p) {
    const rk_hparams *hp = &s->m->hp;
    const double q = (double)hp->n_head * hp->head_dim, n = (double)p->n;
    const double mid = (double)p->pos0 + 0.5 * (n - 1.0);
    double mat = 0, attn = 0, lines = 0, early_fixed = 0, early_lines = 0;
    full_pairs(c, p->pos0, p->n, &early_fixed, &early_lines);
    for (int l = p->layer_lo; l < p->layer_hi; l++) {
        if (l < p->split) {
            mat += n * rk_cost_full_row(hp);
            attn += early_fixed, lines += early_lines;
        } else {
            mat += (double)p->n_ex * rk_cost_full_row(hp) + (double)p->n_fill * fill_row(hp, p, l);
            attn += (double)p->n_ex * late_keys(c, mid);
        }
    }
    if (p->layer_hi == hp->n_layer && c->logits) { /* the output projection of the rows that get logits */
        const double rows = c->all_rows ? n : p->pos0 + p->n == c->end ? 1.0 : 0.0;
        mat += rows * 2.0 * hp->n_embd * hp->n_vocab;
    }
    return (rk_cost){mat, 4.0 * q * attn, 4.0 * q * lines};
}

/* ---- the online fit --------------------------------------------------------------------- */
void rk_cost_fit_add(rk_cost_fit *f, double x1, double x2, double y) {
    f->s11 += x1 * x1, f->s12 += x1 * x2, f->s22 += x2 * x2, f->s1y += x1 * y, f->s2y += x2 * y;
    f->n++;
}

double rk_cost_attn_prior(const rk_hparams *hp) {
    const double w = hp->head_dim > 0 ? (double)hp->head_dim : 128.0, k = 1.2 * pow(128.0 / w, 1.32);
    return k < 0.5 ? 0.5 : k > 4.0 ? 4.0 : k;
}

double rk_cost_fit_ratio(const rk_cost_fit *f) {
    const double k = f->prior > 0 ? f->prior : RK_COST_ATTN_WEIGHT;
    if (f->n < 2 || f->s11 <= 0 || f->s22 <= 0) return k;
    /* least squares of y = a x1 + b x2, ridge toward b = k a worth two steps of x2 */
    const double lam = 2.0 * f->s22 / (double)f->n;
    const double a11 = f->s11 + lam * k * k, a12 = f->s12 - lam * k, a22 = f->s22 + lam;
    const double det = a11 * a22 - a12 * a12;
    if (!(det > 0)) return k;
    const double a = (f->s1y * a22 - f->s2y * a12) / det, b = (f->s2y * a11 - f->s1y * a12) / det;
    if (!(a > 0)) return k;
    const double r = b / a;
    return r < 0.05 * k ? 0.05 * k : r > 20.0 * k ? 20.0 * k : r;
}
