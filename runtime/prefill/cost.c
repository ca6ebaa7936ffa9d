/* The cost model of prefill progress (plan_impl.h): weighted FLOPs of the work a chunk
 * plan runs, so that progress moves in step with time whatever the order (chunk-major,
 * layer-major, staged) and however few rows the late layers of a fill run. */
#include "plan_impl.h"

/* FLOPs of one row through one layer's matrices: Q and O (d x q each), K and V (d x kv
 * each), the gated MLP (3 d x ff). */
static double full_row(const rk_hparams *hp) {
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

double rk_cost_chunk(const rk_session *s, const rk_cost_ctx *c, const rk_chunk_plan *p) {
    const rk_hparams *hp = &s->m->hp;
    const double q = (double)hp->n_head * hp->head_dim, n = (double)p->n, pos0 = (double)p->pos0;
    const double all_keys = n * pos0 + 0.5 * n * (n + 1.0); /* sum of (pos + 1) over the rows */
    const double mid = pos0 + 0.5 * (n - 1.0);
    double mat = 0, attn = 0;
    for (int l = p->layer_lo; l < p->layer_hi; l++) {
        if (l < p->split) {
            mat += n * full_row(hp);
            attn += all_keys;
        } else {
            mat += (double)p->n_ex * full_row(hp) + (double)p->n_fill * fill_row(hp, p, l);
            attn += (double)p->n_ex * late_keys(c, mid);
        }
    }
    if (p->layer_hi == hp->n_layer && c->logits) { /* the output projection of the rows that get logits */
        const double rows = c->all_rows ? n : p->pos0 + p->n == c->end ? 1.0 : 0.0;
        mat += rows * 2.0 * hp->n_embd * hp->n_vocab;
    }
    return mat + RK_COST_ATTN_WEIGHT * 4.0 * q * attn;
}
