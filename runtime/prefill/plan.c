/* The prefill plan (plan_impl.h): which rows of a chunk run the late layers exactly, and
 * where the late-layer inputs of the other (filled) rows come from. */
#include <math.h>
#include <string.h>

#include "plan_impl.h"

static rk_view act(float *data, int64_t cols, int64_t rows) {
    rk_view v = {RK_DT_F32, {cols, rows, 1, 1}, (size_t)cols * sizeof(float), data};
    return v;
}

/* Which bulk rows are filled: every bulk row, except those the question-aware selection
 * of this call keeps exact (sinks and the rows the question attends to, select.c). */
static bool row_is_filled(const rk_session *s, int64_t pos, int64_t bulk_end) {
    if (pos >= bulk_end) return false;
    if (s->pf->selecting && pos >= s->pf->keep_lo && pos < s->pf->keep_hi) return !s->pf->keep[pos - s->pf->keep_lo];
    return true;
}

void rk_plan_chunk(rk_session *s, int64_t pos0, int64_t n, int64_t bulk_end, int lo, int hi, rk_chunk_plan *p) {
    const rk_fill_mode mode = s->fill.mode;
    int64_t n_fill = 0, n_ex = 0;
    for (int64_t r = 0; r < n; r++) {
        const bool f = mode != RK_FILL_OFF && row_is_filled(s, pos0 + r, bulk_end);
        if (f) s->fill_idx[n_fill++] = (int32_t)r;
        if (!f || mode == RK_FILL_PLUMB) s->ex_idx[n_ex++] = (int32_t)r;
    }
    memset(p, 0, sizeof *p);
    p->pos0 = pos0;
    p->n = n;
    p->layer_lo = lo;
    p->layer_hi = hi;
    p->n_ex = n_ex;
    p->n_fill = n_fill;
    p->ex_idx = s->ex_idx;
    p->fill_idx = s->fill_idx;
    p->split = n_fill == 0 ? s->m->hp.n_layer : rk_plan_split(s);
    p->src = mode == RK_FILL_PLUMB ? RK_SRC_EXACT : mode == RK_FILL_IDENTITY ? RK_SRC_IDENTITY : RK_SRC_RIDGE;
}

int rk_plan_split(const rk_session *s) {
    if (s->fill.mode == RK_FILL_OFF) return s->m->hp.n_layer;
    return s->fill.maps ? s->fill.maps->split : s->fill.split;
}


rk_status rk_plan_late_inputs(rk_session *s, const rk_chunk_plan *p, int l, const float *x, bool compacted,
                              const float *xs, float *xin, rk_err *err) {
    const int64_t d = s->m->hp.n_embd;
    /* row moves through the session: backend ops when its buffers are device memory */
    rk_status st = compacted ? rk_session_rows_scatter(s, xin, d, x, d, p->ex_idx, p->n_ex, d, err)
                             : rk_session_rows_copy(s, xin, x, p->n, d, err);
    if (st) return st;
    if (p->src != RK_SRC_RIDGE || l == p->split || s->fill.maps->kv_target) {
        /* (K/V maps: the filled rows' K and V are replaced after the projections,
         * rk_plan_predict_kv; their input here only has to be finite) */
        /* W_S = I; identity fill; the exact source goes through the same gather/scatter */
        return rk_session_rows_scatter(s, xin, d, xs, d, p->fill_idx, p->n_fill, d, err);
    }
    const rk_ridge_maps *r = s->fill.maps;
    /* the backend caches prepared maps by host pointer: uploaded once for CUDA */
    rk_op_args a = {.op = RK_OP_MATMUL};
    if ((st = rk_backend_prepare(s->be, &r->w[l], &a.src0, err))) return st;
    a.dst = act(s->t, r->w[l].ne[1], p->n_fill);
    a.src1 = act((float *)xs, r->w[l].ne[0], p->n_fill);
    st = rk_backend_run(s->be, &a, err);
    if (st) return st;
    rk_op_args b = {.op = RK_OP_ADD_ROW};
    b.dst = a.dst;
    const rk_view bias = {RK_DT_F32, {d, 1, 1, 1}, (size_t)d * sizeof(float), (void *)r->b[l]};
    if ((st = rk_backend_prepare(s->be, &bias, &b.src0, err)) || (st = rk_backend_run(s->be, &b, err))) return st;
    return rk_session_rows_scatter(s, xin, d, s->t, d, p->fill_idx, p->n_fill, d, err);
}

rk_status rk_plan_split_stream(rk_session *s, const rk_chunk_plan *p, float *xs, rk_err *err) {
    /* normalised maps take rmsnorm(x_S); the cache writers' own RMSNorm makes this
     * invisible to identity fill and to layer S itself */
    if (p->src != RK_SRC_RIDGE || !s->fill.maps || !s->fill.maps->normalized || p->n_fill == 0) return RK_OK;
    const int64_t d = s->m->hp.n_embd;
    rk_op_args a = {.op = RK_OP_RMSNORM, .eps = s->m->hp.rms_eps};
    a.src0 = act(xs, d, p->n_fill);
    a.src1 = (rk_view){RK_DT_F32, {d, 1, 1, 1}, (size_t)d * sizeof(float), NULL};
    a.dst = a.src0;
    return rk_backend_run(s->be, &a, err);
}

rk_status rk_plan_predict_kv(rk_session *s, const rk_chunk_plan *p, int l, const float *xs, float *k, float *v,
                             rk_err *err) {
    if (p->src != RK_SRC_RIDGE || l <= p->split || p->n_fill == 0 || !s->fill.maps || !s->fill.maps->kv_target)
        return RK_OK;
    const rk_ridge_maps *r = s->fill.maps;
    const int64_t kvd = (int64_t)s->m->hp.n_head_kv * s->m->hp.head_dim;
    rk_op_args a = {.op = RK_OP_MATMUL};
    rk_status st = rk_backend_prepare(s->be, &r->w[l], &a.src0, err);
    if (st) return st;
    a.dst = act(s->t, 2 * kvd, p->n_fill);
    a.src1 = act((float *)xs, r->w[l].ne[0], p->n_fill);
    if ((st = rk_backend_run(s->be, &a, err))) return st;
    rk_op_args b = {.op = RK_OP_ADD_ROW};
    b.dst = a.dst;
    const rk_view bias = {RK_DT_F32, {2 * kvd, 1, 1, 1}, (size_t)(2 * kvd) * sizeof(float), (void *)r->b[l]};
    if ((st = rk_backend_prepare(s->be, &bias, &b.src0, err)) || (st = rk_backend_run(s->be, &b, err))) return st;
    /* K then V of each filled row, back to its chunk row */
    if ((st = rk_session_rows_scatter(s, k, kvd, s->t, 2 * kvd, p->fill_idx, p->n_fill, kvd, err))) return st;
    return rk_session_rows_scatter(s, v, kvd, s->t + kvd, 2 * kvd, p->fill_idx, p->n_fill, kvd, err);
}
