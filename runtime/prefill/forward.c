/* The layer loop: one prompt chunk (or decode step) through every layer of llama /
 * qwen2 / qwen3 over the session's KV cache, following the chunk's prefill plan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "rk_attn_sparse.h"

static rk_view act(float *data, int64_t cols, int64_t rows) {
    rk_view v = {RK_DT_F32, {cols, rows, 1, 1}, (size_t)cols * sizeof(float), data};
    return v;
}

/* ---- op helpers --------------------------------------------------------- */
static rk_status run(rk_session *s, rk_op_args *a, rk_err *err) { return rk_backend_run(s->be, a, err); }

/* y (n, w.ne[1]) = x (n, w.ne[0]) W^T (+ bias) */
static rk_status matmul(rk_session *s, rk_view w, const rk_view *bias, float *x, int64_t n, float *y, rk_err *err) {
    rk_op_args a = {.op = RK_OP_MATMUL};
    a.dst = act(y, w.ne[1], n);
    a.src0 = w;
    a.src1 = act(x, w.ne[0], n);
    rk_status st = run(s, &a, err);
    if (st || !bias || !bias->data) return st;
    rk_op_args b = {.op = RK_OP_ADD_ROW};
    b.dst = a.dst;
    b.src0 = *bias;
    return run(s, &b, err);
}

/* y[i] (n, w[i].ne[1]) = x (n, w[i].ne[0]) W_i^T (+ bias[i]) for the weights that read one
 * input, as one MATMUL_N: one pool dispatch on the cpu backend, the activation quantised
 * once; the same bits as one matmul() per weight. */
static rk_status matmul_set(rk_session *s, int n_w, const rk_view *const *w, const rk_view *const *bias, float *x,
                            int64_t n, float *const *y, rk_err *err) {
    rk_matmul_n_args mm = {.n_w = n_w};
    for (int i = 0; i < n_w; i++) {
        mm.w[i] = *w[i];
        mm.dst[i] = act(y[i], w[i]->ne[1], n);
    }
    rk_op_args a = {.op = RK_OP_MATMUL_N, .mm = &mm};
    a.src1 = act(x, w[0]->ne[0], n);
    rk_status st = run(s, &a, err);
    for (int i = 0; i < n_w && !st; i++)
        if (bias[i] && bias[i]->data) {
            rk_op_args b = {.op = RK_OP_ADD_ROW};
            b.dst = mm.dst[i];
            b.src0 = *bias[i];
            st = run(s, &b, err);
        }
    return st;
}

static rk_status rmsnorm(rk_session *s, const float *x, float *y, rk_view w, int64_t rows, rk_err *err) {
    rk_op_args a = {.op = RK_OP_RMSNORM, .eps = s->m->hp.rms_eps};
    a.src0 = act((float *)x, w.ne[0], rows);
    a.src1 = w;
    a.dst = act(y, w.ne[0], rows);
    return run(s, &a, err);
}

static rk_status rope(rk_session *s, float *x, int64_t n, int n_heads, int64_t pos0, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    rk_op_args a = {.op = RK_OP_ROPE};
    a.src0 = act(x, hp->head_dim, n * n_heads);
    a.src0.ne[1] = n_heads;
    a.src0.ne[2] = n;
    a.src0.nb1 = (size_t)hp->head_dim * sizeof(float);
    a.dst = a.src0;
    rk_model_rope_params(s->m, pos0, &a.rope);
    return run(s, &a, err);
}

static rk_status add(rk_session *s, float *dst, const float *src, int64_t cols, int64_t n, rk_err *err) {
    rk_op_args a = {.op = RK_OP_ADD};
    a.dst = act(dst, cols, n);
    a.src0 = act((float *)src, cols, n);
    return run(s, &a, err);
}


/* ---- row moves of the plan (session_impl.h) ----------------------------------- */
rk_status rk_session_rows_gather(rk_session *s, float *dst, int64_t ldd, const float *src, int64_t lds,
                                 const int32_t *idx, int64_t n, int64_t d, rk_err *err) {
    if (n <= 0) return RK_OK;
    if (!s->dev) {
        for (int64_t i = 0; i < n; i++) memmove(dst + i * ldd, src + (int64_t)idx[i] * lds, (size_t)d * sizeof(float));
        return RK_OK;
    }
    if (dst == src)
        return rk_err_set(err, RK_E_INTERNAL, "forward: an in-place row gather on backend %s", s->be->ops->name);
    /* GET_ROWS of f32 rows: the source spans rows 0..idx[n-1] (idx increasing) */
    rk_op_args a = {.op = RK_OP_GET_ROWS, .ids = idx};
    a.src0 = (rk_view){RK_DT_F32, {d, (int64_t)idx[n - 1] + 1, 1, 1}, (size_t)lds * sizeof(float), (void *)src};
    a.dst = (rk_view){RK_DT_F32, {d, n, 1, 1}, (size_t)ldd * sizeof(float), dst};
    return run(s, &a, err);
}

rk_status rk_session_rows_scatter(rk_session *s, float *dst, int64_t ldd, const float *src, int64_t lds,
                                  const int32_t *idx, int64_t n, int64_t d, rk_err *err) {
    if (n <= 0) return RK_OK;
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) rows = idx[i] >= rows ? (int64_t)idx[i] + 1 : rows;
    if (!s->dev) {
        for (int64_t i = 0; i < n; i++) memcpy(dst + (int64_t)idx[i] * ldd, src + i * lds, (size_t)d * sizeof(float));
        return RK_OK;
    }
    rk_op_args a = {.op = RK_OP_SCATTER_ROWS, .ids = idx};
    a.src0 = (rk_view){RK_DT_F32, {d, n, 1, 1}, (size_t)lds * sizeof(float), (void *)src};
    a.dst = (rk_view){RK_DT_F32, {d, rows, 1, 1}, (size_t)ldd * sizeof(float), dst};
    return run(s, &a, err);
}

rk_status rk_session_rows_copy(rk_session *s, float *dst, const float *src, int64_t n, int64_t d, rk_err *err) {
    if (n <= 0 || dst == src) return RK_OK;
    if (!s->dev) {
        memcpy(dst, src, (size_t)(n * d) * sizeof(float));
        return RK_OK;
    }
    rk_op_args a = {.op = RK_OP_CPY_ROWS}; /* f32 -> f32 rows: a device-side copy */
    a.src0 = act((float *)src, d, n);
    a.dst = act(dst, d, n);
    return run(s, &a, err);
}

/* In place on a device backend: through a free buffer of at least n x d floats. */
static rk_status gather_in_place(rk_session *s, float *x, const int32_t *idx, int64_t n, int64_t d, float *spare,
                                 rk_err *err) {
    if (!s->dev) return rk_session_rows_gather(s, x, d, x, d, idx, n, d, err);
    rk_status st = rk_session_rows_gather(s, spare, d, x, d, idx, n, d, err);
    return st ? st : rk_session_rows_copy(s, x, spare, n, d, err);
}

/* The question-aware selection's queries (select.c reads host rows): on a device backend
 * the rows it asks for come back through downloads. */
static rk_status keep_queries(rk_session *s, const rk_chunk_plan *p, int l, rk_err *err) {
    if (!s->dev) {
        rk_plan_keep_queries(s, p, l);
        return RK_OK;
    }
    if (!p->q_keep || l < p->q_lo || l >= p->q_hi) return RK_OK;
    const int64_t qd = (int64_t)s->m->hp.n_head * s->m->hp.head_dim;
    int64_t r0 = p->q_pos0 - p->pos0, r1 = p->q_pos0 + p->q_n - p->pos0; /* chunk rows in the question */
    if (r0 < 0) r0 = 0;
    if (r1 > p->n) r1 = p->n;
    if (r1 <= r0) return RK_OK;
    const int64_t i0 = p->pos0 + r0 - p->q_pos0;
    return rk_backend_download(s->be, p->q_keep + ((int64_t)(l - p->q_lo) * p->q_n + i0) * qd, s->q + r0 * qd,
                               (size_t)((r1 - r0) * qd) * sizeof(float), err);
}

/* causal GQA attention of n_q query rows at pos0.. over the layer's cache, whatever it
 * stores and wherever (q and out are the session's buffers: the cache does any staging) */
static rk_status attention(rk_session *s, int l, float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    if (rk_fill_group_on(s, l)) return rk_fill_group_attend(s, l, q, n_q, pos0, out, err); /* fill_group.c */
    rk_attn_sparse sp;
    if (!rk_sparse_layout(s, l, &sp)) return s->kv->ops->attend(s->kv, l, q, n_q, pos0, out, err);
    s->kv->attn_sparse = &sp; /* sparse.c: the cache hands it to the backend's ATTN */
    rk_status st = s->kv->ops->attend(s->kv, l, q, n_q, pos0, out, err);
    s->kv->attn_sparse = NULL;
    return st;
}

/* The cache write of layer l: n rows of k and v (post-RoPE), from the session's buffers. */
static rk_status kv_append(rk_session *s, int l, int64_t pos0, int64_t n, rk_err *err) {
    return s->kv->ops->append(s->kv, l, pos0, s->k, s->v, n, err);
}

/* The cache writers of layer l for all n rows of the chunk, from their input x: attention
 * norm, K and V projections (+bias), k-norm, RoPE, cache write. h keeps the normed input.
 * with_q (every row of the chunk goes on as exact, from this h): the Q projection comes in
 * the same matmul set, into q. */
static rk_status cache_writers(rk_session *s, const rk_chunk_plan *p, int l, bool late, bool with_q, const float *x,
                               int64_t pos0, int64_t n, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    const rk_layer *L = &s->w_layers[l];
    const rk_view *w[3] = {&L->wk, &L->wv, &L->wq}, *b[3] = {&L->bk, &L->bv, &L->bq};
    float *y[3] = {s->k, s->v, s->q};
    rk_status st;
    if ((st = rmsnorm(s, x, s->h, L->attn_norm, n, err)) || (st = matmul_set(s, with_q ? 3 : 2, w, b, s->h, n, y, err)))
        return st;
    if (hp->has_qk_norm && (st = rmsnorm(s, s->k, s->k, L->k_norm, n * hp->n_head_kv, err))) return st;
    if (late && (st = rk_plan_predict_kv(s, p, l, s->xs, s->k, s->v, err))) return st; /* K/V maps */
    if ((st = rope(s, s->k, n, hp->n_head_kv, pos0, err)) ||
        (rk_fill_group_on(s, l) && (st = rk_fill_group_append(s, p, l, late, err))) ||
        (st = kv_append(s, l, pos0, n, err)))
        return st;
    return RK_OK;
}

/* The rest of layer l for ne exact rows: queries from the normed input h (unless
 * q_done: the cache writers' set made them), attention over each run of consecutive
 * positions, output projection, MLP; x (ne, n_embd) updated in place. idx: the rows'
 * chunk indices when compacted, else NULL (rows 0..ne-1). */
static rk_status exact_rows(rk_session *s, int l, int64_t pos0, int64_t ne, const int32_t *idx, bool q_done,
                            rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    const rk_layer *L = &s->w_layers[l];
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const rk_view *w_mlp[2] = {&L->w_gate, &L->w_up}, *no_bias[2] = {NULL, NULL};
    float *y_mlp[2] = {s->gate, s->up};
    rk_status st;
    if (!q_done && (st = matmul(s, L->wq, &L->bq, s->h, ne, s->q, err))) return st;
    if (hp->has_qk_norm && (st = rmsnorm(s, s->q, s->q, L->q_norm, ne * hp->n_head, err))) return st;
    for (int64_t i0 = 0; i0 < ne;) {
        int64_t i1 = i0 + 1;
        const int64_t p_i0 = pos0 + (idx ? idx[i0] : i0);
        while (i1 < ne && (!idx || idx[i1] == idx[i1 - 1] + 1)) i1++;
        if ((st = rope(s, s->q + i0 * qd, i1 - i0, hp->n_head, p_i0, err)) ||
            (st = attention(s, l, s->q + i0 * qd, i1 - i0, p_i0, s->h + i0 * qd, err)))
            return st;
        i0 = i1;
    }
    if ((st = matmul(s, L->wo, NULL, s->h, ne, s->t, err)) || (st = add(s, s->x, s->t, d, ne, err))) return st;
    rk_op_args sm = {.op = RK_OP_SILU_MUL};
    sm.dst = sm.src0 = act(s->gate, hp->n_ff, ne);
    sm.src1 = act(s->up, hp->n_ff, ne);
    if ((st = rmsnorm(s, s->x, s->h, L->ffn_norm, ne, err)) ||
        (st = matmul_set(s, 2, w_mlp, no_bias, s->h, ne, y_mlp, err)) || (st = run(s, &sm, err)) ||
        (st = matmul(s, L->w_down, NULL, s->gate, ne, s->t, err)) || (st = add(s, s->x, s->t, d, ne, err)))
        return st;
    return RK_OK;
}

/* Output head for the rows whose logits are wanted; filled rows have no final residual:
 * their rows are NaN. */
static rk_status output_head(rk_session *s, const rk_chunk_plan *p, bool compacted, float *logits, bool all_rows,
                             rk_err *err) {
    const rk_model *m = s->m;
    const int64_t d = m->hp.n_embd, n = p->n;
    const int64_t ne = compacted ? p->n_ex : n;
    const size_t nv = (size_t)m->hp.n_vocab;
    rk_status st;
    if (!all_rows && (ne == 0 || (compacted && p->ex_idx[p->n_ex - 1] != n - 1)))
        return rk_err_set(err, RK_E_INTERNAL, "forward: logits asked for a filled row");
    if (all_rows && compacted)
        for (size_t r = 0; r < (size_t)n * nv; r++) logits[r] = NAN;
    if (ne == 0) return RK_OK;
    int64_t first = all_rows ? 0 : ne - 1, rows = ne - first;
    float *dst = all_rows && !compacted && !s->dev ? logits : s->logits;
    if ((st = rmsnorm(s, s->x + first * d, s->h, s->w_output_norm, rows, err)) ||
        (st = matmul(s, s->w_output, NULL, s->h, rows, dst, err)))
        return st;
    if (s->dev && all_rows && compacted) { /* exact rows back to their chunk rows; filled rows stay NaN */
        for (int64_t i = 0; i < rows; i++)
            if ((st = rk_backend_download(s->be, logits + (size_t)p->ex_idx[i] * nv, dst + (size_t)i * nv,
                                          nv * sizeof(float), err)))
                return st;
        return RK_OK;
    }
    if (s->graphs.capturing) { /* a recorded step: it runs now, before the download waits for it */
        s->graphs.capturing = false;
        if ((st = rk_backend_step_end(s->be, true, err))) return st;
    }
    if (s->dev) /* the one host sync of a step: the wanted logits rows */
        return rk_backend_download(s->be, logits, dst, (size_t)rows * nv * sizeof(float), err);
    if (!all_rows) memcpy(logits, s->logits, nv * sizeof(float));
    else if (compacted) rk_rows_scatter(logits, s->logits, p->ex_idx, p->n_ex, (int64_t)nv);
    return RK_OK;
}

/* One pass of the plan: layers [layer_lo, layer_hi) for the chunk's rows. Every row
 * writes its K/V in every layer; in late layers (>= split) the filled rows' writer input
 * comes from the plan (rk_plan_late_inputs) and only the exact rows go on through
 * attention and the MLP. After the split, exact rows live compacted in x[0..n_ex) and
 * the filled rows' split stream in xs[0..n_fill) (the exact source keeps every row). */
static rk_status forward_chunk(rk_session *s, const rk_chunk_plan *p, const int32_t *ids, float *logits, bool all_rows,
                               rk_err *err);

rk_status rk_forward_init(rk_session *s, rk_err *err) {
    s->graphs.on = s->p.cuda_graphs && s->dev && s->be->ops->step_begin && s->kv->ops->recordable;
    if (!s->graphs.on) return RK_OK;
    s->graphs.saved_rows = malloc((size_t)s->m->hp.n_layer * 2 * sizeof(uint64_t));
    if (!s->graphs.saved_rows) return rk_err_set(err, RK_E_NOMEM, "forward: out of memory");
    return RK_OK;
}

void rk_forward_deinit(rk_session *s) {
    free(s->graphs.saved_rows);
    s->graphs.saved_rows = NULL;
}

/* A decode step as one recorded unit (CUDA graphs): recorded, then run by output_head
 * before its download. When the recording breaks (an op that needs the host while the
 * stream records, a refused instantiation) nothing of the step ran: it runs again
 * unrecorded, with the counters as they were; three failures in a row turn graphs off for
 * the session. Decode steps only: one row, every layer, no fill, a cache whose step can be
 * recorded (rk_kv_ops.recordable). */
rk_status rk_forward_chunk(rk_session *s, const rk_chunk_plan *p, const int32_t *ids, float *logits, bool all_rows,
                           rk_err *err) {
    if (!s->graphs.on || p->n != 1 || p->layer_lo != 0 || p->layer_hi != s->m->hp.n_layer || p->n_fill > 0 || !logits ||
        s->tap)
        return forward_chunk(s, p, ids, logits, all_rows, err);
    const rk_session_counters saved = s->counters;
    const size_t rows_bytes = (size_t)s->m->hp.n_layer * 2 * sizeof(uint64_t);
    memcpy(s->graphs.saved_rows, s->layer_rows, rows_bytes);
    rk_err rec = {0};
    rk_status st = rk_backend_step_begin(s->be, &rec);
    if (st == RK_OK) {
        s->graphs.capturing = true;
        st = forward_chunk(s, p, ids, logits, all_rows, &rec);
        if (s->graphs.capturing) { /* stopped before output_head ended the recording */
            s->graphs.capturing = false;
            rk_backend_step_end(s->be, false, NULL);
            if (st == RK_OK) st = rk_err_set(&rec, RK_E_INTERNAL, "forward: a recorded step without its end");
        }
    }
    if (st == RK_OK) {
        s->counters.graph_steps++;
        s->graphs.fail_run = 0;
        return RK_OK;
    }
    s->counters = saved;
    memcpy(s->layer_rows, s->graphs.saved_rows, rows_bytes);
    s->counters.graph_fallbacks++;
    if (++s->graphs.fail_run >= 3) {
        s->graphs.on = false;
        snprintf(s->warning, sizeof s->warning,
                 "recorded decode steps (cuda_graphs) turned off after 3 failures: %.300s", rec.msg);
    }
    return forward_chunk(s, p, ids, logits, all_rows, err);
}

static rk_status forward_chunk(rk_session *s, const rk_chunk_plan *p, const int32_t *ids, float *logits, bool all_rows,
                               rk_err *err) {
    const rk_model *m = s->m;
    const rk_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, n = p->n, pos0 = p->pos0;
    rk_status st;
    bool compacted = false;
    if (s->dev && s->tap)
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "forward: taps read activations on the host; backend %s keeps them in its own memory (use a "
                          "CPU backend)",
                          s->be->ops->name);

    if (p->layer_lo == 0) {
        rk_op_args a = {.op = RK_OP_GET_ROWS, .ids = ids};
        a.src0 = s->w_tok_embd;
        a.dst = act(s->x, d, n);
        if ((st = run(s, &a, err))) return st;
    } else if (s->dev) { /* the layer-major split stream lives on the host (prefill.c) */
        if ((st = rk_backend_upload(s->be, s->x, p->x_in, (size_t)(n * d) * sizeof(float), err))) return st;
    } else {
        memcpy(s->x, p->x_in, (size_t)(n * d) * sizeof(float));
    }
    for (int l = p->layer_lo; l < p->layer_hi; l++) {
        const bool late = l >= p->split && p->n_fill > 0;
        if (s->tap && !compacted) s->tap(s->tap_ud, l, s->x, n, pos0);
        const float *src = s->x;
        if (late) {
            if (!compacted && p->src != RK_SRC_EXACT) {
                /* idx increasing: in place is safe (a device backend goes through h, free here) */
                if ((st = rk_session_rows_gather(s, s->xs, d, s->x, d, p->fill_idx, p->n_fill, d, err)) ||
                    (st = gather_in_place(s, s->x, p->ex_idx, p->n_ex, d, s->h, err)))
                    return st;
                compacted = true;
                if ((st = rk_plan_split_stream(s, p, s->xs, err))) return st;
            } else if (p->src == RK_SRC_EXACT) {
                if ((st = rk_session_rows_gather(s, s->xs, d, s->x, d, p->fill_idx, p->n_fill, d, err))) return st;
            }
            if ((st = rk_plan_late_inputs(s, p, l, s->x, compacted, s->xs, s->xin, err))) return st;
            src = s->xin;
            s->layer_rows[2 * l + 1] += (uint64_t)p->n_fill;
        }
        /* before the split every row is exact and reads the h the cache writers leave */
        const bool with_q = !late && !compacted;
        if ((st = cache_writers(s, p, l, late, with_q, src, pos0, n, err))) return st;
        const int64_t ne = compacted ? p->n_ex : n;
        s->layer_rows[2 * l] += (uint64_t)ne;
        if (ne == 0) continue;
        /* (a device backend goes through xin: the cache writers are done with it) */
        if (compacted && (st = gather_in_place(s, s->h, p->ex_idx, p->n_ex, d, s->xin, err))) return st;
        if ((st = exact_rows(s, l, pos0, ne, compacted ? p->ex_idx : NULL, with_q, err))) return st;
        if (p->q_keep && !compacted && (st = keep_queries(s, p, l, err))) return st; /* question-aware selection */
    }
    if (p->layer_hi < hp->n_layer) {
        if (compacted)
            return rk_err_set(err, RK_E_INTERNAL, "forward: a pass ending at layer %d after the split %d", p->layer_hi,
                              p->split);
        if (s->dev) return rk_backend_download(s->be, p->x_out, s->x, (size_t)(n * d) * sizeof(float), err);
        memcpy(p->x_out, s->x, (size_t)(n * d) * sizeof(float));
        return RK_OK;
    }
    if (s->tap && !compacted) s->tap(s->tap_ud, hp->n_layer, s->x, n, pos0);
    return logits ? output_head(s, p, compacted, logits, all_rows, err) : RK_OK;
}
