/* The layer loop: one prompt chunk (or decode step) through every layer of llama /
 * qwen2 / qwen3 over the session's KV cache, following the chunk's prefill plan. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session_impl.h"

static rk_view act(float *data, int64_t cols, int64_t rows) {
    rk_view v = {RK_DT_F32, {cols, rows, 1, 1}, (size_t)cols * sizeof(float), data};
    return v;
}

/* ---- op helpers --------------------------------------------------------- */
static rk_status run(rk_session *s, rk_op_args *a, rk_err *err) { return rk_backend_run(s->be, a, err); }

/* y (n, w.ne[1]) = x (n, w.ne[0]) W^T (+ bias) */
static rk_status matmul(rk_session *s, rk_view w, const rk_view *bias, float *x, int64_t n, float *y,
                        rk_err *err) {
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
    a.rope.mode = hp->rope_mode;
    a.rope.n_rot = hp->n_rot;
    a.rope.freq_base = hp->rope_base;
    a.rope.pos0 = pos0;
    return run(s, &a, err);
}

static rk_status add(rk_session *s, float *dst, const float *src, int64_t cols, int64_t n, rk_err *err) {
    rk_op_args a = {.op = RK_OP_ADD};
    a.dst = act(dst, cols, n);
    a.src0 = act((float *)src, cols, n);
    return run(s, &a, err);
}

static rk_status cache_write(rk_session *s, void *cache, const float *src, int64_t n, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    rk_op_args a = {.op = RK_OP_CPY_ROWS, .dst_row0 = s->n_past};
    a.dst.type = s->kv_type;
    a.dst.ne[0] = kvd;
    a.dst.ne[1] = s->n_ctx;
    a.dst.ne[2] = a.dst.ne[3] = 1;
    a.dst.nb1 = s->kv_row_bytes;
    a.dst.data = cache;
    a.src0 = act((float *)src, kvd, n);
    return run(s, &a, err);
}

static void gather_rows(float *dst, const float *src, const int32_t *idx, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) memmove(dst + i * d, src + (int64_t)idx[i] * d, (size_t)d * sizeof(float));
}

static void scatter_rows(float *dst, const float *src, const int32_t *idx, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) memcpy(dst + (int64_t)idx[i] * d, src + i * d, (size_t)d * sizeof(float));
}

static rk_status attention(rk_session *s, int l, float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    if (s->kvc) {
        bool handled = false;
        rk_status st = rk_kvc_attention(s->kvc, s, l, q, n_q, pos0, out, &handled, err);
        if (st || handled) return st;
    }
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    rk_op_args at = {.op = RK_OP_ATTN};
    at.src0 = act(q, qd, n_q);
    at.src1.type = at.src2.type = s->kv_type;
    at.src1.ne[0] = at.src2.ne[0] = kvd;
    at.src1.ne[1] = at.src2.ne[1] = pos0 + n_q;
    at.src1.ne[2] = at.src2.ne[2] = at.src1.ne[3] = at.src2.ne[3] = 1;
    at.src1.nb1 = at.src2.nb1 = s->kv_row_bytes;
    at.src1.data = s->k_cache[l];
    at.src2.data = s->v_cache[l];
    at.dst = act(out, qd, n_q);
    at.attn.n_head = hp->n_head;
    at.attn.n_head_kv = hp->n_head_kv;
    at.attn.head_dim = hp->head_dim;
    at.attn.scale = 1.0f / sqrtf((float)hp->head_dim);
    at.attn.pos0 = pos0;
    return run(s, &at, err);
}

/* Which rows of a chunk are filled in late layers (see rk_fill_params). */
static bool row_is_filled(const rk_session *s, int64_t pos, int32_t id, int64_t bulk_end) {
    if (pos >= bulk_end) return false;
    if (s->fill.mode == RK_FILL_QUALITY) {
        if (pos < s->fill.n_sink) return false;
        const rk_ridge_maps *r = s->fill.maps;
        if (r->token_score && id < r->n_vocab && r->token_score[id] >= s->score_threshold) return false;
    }
    return true;
}

/* One chunk of n <= n_batch tokens at positions n_past... Rows at positions below
 * bulk_end are bulk rows (fill applies to them when a fill mode is set). */
rk_status rk_forward_chunk(rk_session *s, const int32_t *ids, int64_t n, float *logits,
                               bool all_rows, int64_t bulk_end, rk_err *err) {
    const rk_model *m = s->m;
    const rk_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    const int64_t pos0 = s->n_past;
    const rk_fill_mode mode = s->fill.mode;
    rk_status st;

    /* row plan: exact rows ex_idx (all rows in early layers), filled rows fill_idx */
    int64_t n_fill = 0, n_ex = 0;
    for (int64_t r = 0; r < n; r++) {
        bool f = mode != RK_FILL_OFF && row_is_filled(s, pos0 + r, ids[r], bulk_end);
        if (f) s->fill_idx[n_fill++] = (int32_t)r;
        if (!f || mode == RK_FILL_PLUMB) s->ex_idx[n_ex++] = (int32_t)r;
    }
    const int split = n_fill == 0 ? hp->n_layer : s->fill.maps ? s->fill.maps->split : s->fill.split;
    /* After the split, exact rows live compacted in x[0..n_ex) and filled rows' split
     * stream in xs[0..n_fill) (PLUMB keeps every row exact and uncompacted). */
    bool compacted = false;

    rk_op_args a = {.op = RK_OP_GET_ROWS, .ids = ids};
    a.src0 = m->tok_embd;
    a.dst = act(s->x, d, n);
    if ((st = run(s, &a, err))) return st;

    for (int l = 0; l < hp->n_layer; l++) {
        const rk_layer *L = &m->layers[l];
        const bool late = l >= split;
        if (s->tap && !compacted) s->tap(s->tap_ud, l, s->x, n, pos0);
        /* ---- cache writers: every row ---- */
        const float *src = s->x;
        if (late) {
            if (mode == RK_FILL_PLUMB) {
                /* the fill path fed exact inputs: gather, then scatter back through xin */
                gather_rows(s->xs, s->x, s->fill_idx, n_fill, d);
                memcpy(s->xin, s->x, (size_t)(n * d) * sizeof(float));
                scatter_rows(s->xin, s->xs, s->fill_idx, n_fill, d);
            } else {
                if (!compacted) {
                    gather_rows(s->xs, s->x, s->fill_idx, n_fill, d);
                    gather_rows(s->x, s->x, s->ex_idx, n_ex, d); /* idx increasing: in place is safe */
                    compacted = true;
                    /* normalised maps take rmsnorm(x_S); the cache writers' own RMSNorm makes
                     * this invisible to identity fill and to layer S itself */
                    if (s->fill.maps && s->fill.maps->normalized && n_fill > 0) {
                        rk_view none = {RK_DT_F32, {d, 1, 1, 1}, (size_t)d * sizeof(float), NULL};
                        if ((st = rmsnorm(s, s->xs, s->xs, none, n_fill, err))) return st;
                    }
                }
                scatter_rows(s->xin, s->x, s->ex_idx, n_ex, d);
                if (mode == RK_FILL_IDENTITY || l == split) {
                    scatter_rows(s->xin, s->xs, s->fill_idx, n_fill, d);
                } else {
                    rk_view b = {RK_DT_F32, {d, 1, 1, 1}, (size_t)d * sizeof(float), (void *)s->fill.maps->b[l]};
                    if ((st = matmul(s, s->fill.maps->w[l], &b, s->xs, n_fill, s->t, err))) return st;
                    scatter_rows(s->xin, s->t, s->fill_idx, n_fill, d);
                }
            }
            src = s->xin;
            if (l < 256) s->counters.filled_rows[l] += (uint64_t)n_fill;
        }
        if ((st = rmsnorm(s, src, s->h, L->attn_norm, n, err)) ||
            (st = matmul(s, L->wk, &L->bk, s->h, n, s->k, err)) ||
            (st = matmul(s, L->wv, &L->bv, s->h, n, s->v, err)))
            return st;
        if (hp->has_qk_norm && (st = rmsnorm(s, s->k, s->k, L->k_norm, n * hp->n_head_kv, err))) return st;
        if ((st = rope(s, s->k, n, hp->n_head_kv, pos0, err)) ||
            (st = cache_write(s, s->k_cache[l], s->k, n, err)) ||
            (st = cache_write(s, s->v_cache[l], s->v, n, err)))
            return st;
        /* ---- exact rows: queries, attention, output projection, MLP ---- */
        const int64_t ne = compacted ? n_ex : n;
        if (l < 256) s->counters.exact_rows[l] += (uint64_t)ne;
        if (ne == 0) continue;
        if (compacted) gather_rows(s->h, s->h, s->ex_idx, n_ex, d);
        if ((st = matmul(s, L->wq, &L->bq, s->h, ne, s->q, err))) return st;
        if (hp->has_qk_norm && (st = rmsnorm(s, s->q, s->q, L->q_norm, ne * hp->n_head, err))) return st;
        /* rope + attention over each run of consecutive positions */
        for (int64_t i0 = 0; i0 < ne;) {
            int64_t i1 = i0 + 1;
            const int64_t p_i0 = pos0 + (compacted ? s->ex_idx[i0] : i0);
            while (i1 < ne && (!compacted || s->ex_idx[i1] == s->ex_idx[i1 - 1] + 1)) i1++;
            if ((st = rope(s, s->q + i0 * qd, i1 - i0, hp->n_head, p_i0, err)) ||
                (st = attention(s, l, s->q + i0 * qd, i1 - i0, p_i0, s->h + i0 * qd, err)))
                return st;
            i0 = i1;
        }
        if ((st = matmul(s, L->wo, NULL, s->h, ne, s->t, err)) || (st = add(s, s->x, s->t, d, ne, err)))
            return st;
        rk_op_args sm = {.op = RK_OP_SILU_MUL};
        sm.dst = sm.src0 = act(s->gate, hp->n_ff, ne);
        sm.src1 = act(s->up, hp->n_ff, ne);
        if ((st = rmsnorm(s, s->x, s->h, L->ffn_norm, ne, err)) ||
            (st = matmul(s, L->w_gate, NULL, s->h, ne, s->gate, err)) ||
            (st = matmul(s, L->w_up, NULL, s->h, ne, s->up, err)) ||
            (st = run(s, &sm, err)) ||
            (st = matmul(s, L->w_down, NULL, s->gate, ne, s->t, err)) ||
            (st = add(s, s->x, s->t, d, ne, err)))
            return st;
    }
    if (s->tap && !compacted) s->tap(s->tap_ud, hp->n_layer, s->x, n, pos0);
    if (logits) {
        /* only rows whose logits are wanted go through the output head; filled rows
         * have no final residual: their rows are NaN */
        const int64_t ne = compacted ? n_ex : n;
        const size_t nv = (size_t)hp->n_vocab;
        if (!all_rows && (ne == 0 || (compacted && s->ex_idx[n_ex - 1] != n - 1)))
            return rk_err_set(err, RK_E_INTERNAL, "forward: logits asked for a filled row");
        if (all_rows && compacted)
            for (size_t r = 0; r < (size_t)n * nv; r++) logits[r] = NAN;
        if (ne > 0) {
            int64_t first = all_rows ? 0 : ne - 1, rows = ne - first;
            float *dst = all_rows && !compacted ? logits : s->logits;
            if ((st = rmsnorm(s, s->x + first * d, s->h, m->output_norm, rows, err)) ||
                (st = matmul(s, m->output, NULL, s->h, rows, dst, err)))
                return st;
            if (!all_rows) memcpy(logits, s->logits, nv * sizeof(float));
            else if (compacted) scatter_rows(logits, s->logits, s->ex_idx, n_ex, (int64_t)nv);
        }
    }
    s->n_past += n;
    return RK_OK;
}

