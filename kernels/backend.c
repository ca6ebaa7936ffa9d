/* Backend-independent parts: op names, the shape check every backend relies
 * on, support limits shared by the two CPU backends, dispatch. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"

static const char *const op_names[RK_OP_COUNT] = {
    [RK_OP_GET_ROWS] = "GET_ROWS",
    [RK_OP_MATMUL] = "MATMUL",
    [RK_OP_RMSNORM] = "RMSNORM",
    [RK_OP_ROPE] = "ROPE",
    [RK_OP_ATTN] = "ATTN",
    [RK_OP_SILU_MUL] = "SILU_MUL",
    [RK_OP_ADD] = "ADD",
    [RK_OP_ADD_ROW] = "ADD_ROW",
    [RK_OP_CPY_ROWS] = "CPY_ROWS",
    [RK_OP_LR_KEYS] = "LR_KEYS",
    [RK_OP_SCATTER_ROWS] = "SCATTER_ROWS",
    [RK_OP_LR_ATTN] = "LR_ATTN",
    [RK_OP_MATMUL_N] = "MATMUL_N",
};
_Static_assert(RK_OP_COUNT == 13, "op count changed: name the new op");

const char *rk_op_name(rk_op op) { return (unsigned)op < RK_OP_COUNT ? op_names[op] : "UNKNOWN_OP"; }

void rk_backend_destroy(rk_backend *be) {
    if (!be) return;
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
}

bool rk_heads_of(const rk_view *v, int n_heads, int head_dim, rk_heads *out) {
    const rk_dtype_traits *t = rk_dtype_get(v->type);
    uint64_t hb = 0; /* bytes of one head row: whole blocks for a block type */
    if (!t || n_heads <= 0 || head_dim <= 0 || !rk_dtype_row_bytes(v->type, (uint64_t)head_dim, &hb)) return false;
    int64_t rows = rk_view_rows(v);
    if (t->blck_size == 1 && v->nb1 % t->type_size) return false;
    if (v->ne[0] == (int64_t)n_heads * head_dim && rows >= 0) {
        if (v->nb1 < (size_t)hb * (size_t)n_heads) return false;
        *out = (rk_heads){v->data, v->nb1, (size_t)hb, rows};
        return true;
    }
    if (v->ne[0] == head_dim && v->ne[1] == n_heads && rows >= 0) {
        if (v->nb1 < (size_t)hb) return false;
        *out = (rk_heads){v->data, v->nb1 * (size_t)n_heads, v->nb1, rows / n_heads};
        return true;
    }
    return false;
}

#define BAD(...) return rk_err_set(err, RK_E_INVALID_ARG, __VA_ARGS__)

/* data non-NULL (unless empty), ne >= 0, f32-style row stride large enough */
static rk_status check_view(const char *op, const char *name, const rk_view *v, rk_err *err) {
    for (int i = 0; i < 4; i++)
        if (rk_view_dim(v, i) < 0) BAD("kernels: %s: %s ne[%d] negative (%lld)", op, name, i, (long long)v->ne[i]);
    uint64_t row_bytes;
    if (!rk_dtype_row_bytes(v->type, (uint64_t)v->ne[0], &row_bytes))
        BAD("kernels: %s: %s row of %lld is not whole %s blocks", op, name, (long long)v->ne[0],
            rk_dtype_name(v->type));
    const rk_dtype_traits *t = rk_dtype_get(v->type);
    if (t->blck_size == 1 && v->nb1 % t->type_size)
        BAD("kernels: %s: %s nb1 %zu not a multiple of the element size %u", op, name, v->nb1, t->type_size);
    if (rk_view_rows(v) > 1 && v->nb1 < row_bytes)
        BAD("kernels: %s: %s nb1 too small (>= %llu vs %zu)", op, name, (unsigned long long)row_bytes, v->nb1);
    if (!v->data && v->ne[0] > 0 && rk_view_rows(v) > 0) BAD("kernels: %s: %s data is NULL", op, name);
    return RK_OK;
}

static rk_status same_shape(const char *op, const char *na, const rk_view *a, const char *nb, const rk_view *b,
                            rk_err *err) {
    if (a->ne[0] != b->ne[0] || rk_view_rows(a) != rk_view_rows(b))
        BAD("kernels: %s: %s shape (%lld x %lld) vs %s (%lld x %lld)", op, na, (long long)rk_view_rows(a),
            (long long)a->ne[0], nb, (long long)rk_view_rows(b), (long long)b->ne[0]);
    return RK_OK;
}

#define TRY(x)                        \
    do {                              \
        rk_status st_ = (x);          \
        if (st_ != RK_OK) return st_; \
    } while (0)

static rk_status check_attn(const char *on, const rk_op_args *a, rk_err *err) {
    const rk_attn_params *p = &a->attn;
    if (p->n_head <= 0 || p->n_head_kv <= 0 || p->head_dim <= 0 || p->n_head % p->n_head_kv)
        BAD("kernels: %s: heads %d / kv heads %d / head_dim %d (n_head a positive multiple of n_head_kv)", on,
            p->n_head, p->n_head_kv, p->head_dim);
    if (p->pos0 < 0) BAD("kernels: %s: pos0 %lld negative", on, (long long)p->pos0);
    if (!isfinite(p->scale)) BAD("kernels: %s: scale not finite", on);
    rk_heads q, k, v, d;
    if (!rk_heads_of(&a->src0, p->n_head, p->head_dim, &q))
        BAD("kernels: %s: q view is neither {%d, n} nor {%d, %d, n} (ne[0] %lld)", on, p->n_head * p->head_dim,
            p->head_dim, p->n_head, (long long)a->src0.ne[0]);
    if (!rk_heads_of(&a->dst, p->n_head, p->head_dim, &d) || d.n_tok != q.n_tok)
        BAD("kernels: %s: dst view does not match q (%lld tokens of %d x %d)", on, (long long)q.n_tok, p->n_head,
            p->head_dim);
    if (!rk_heads_of(&a->src1, p->n_head_kv, p->head_dim, &k) || !rk_heads_of(&a->src2, p->n_head_kv, p->head_dim, &v))
        BAD("kernels: %s: K/V cache views are not {%d, n_ctx} or {%d, %d, n_ctx}", on, p->n_head_kv * p->head_dim,
            p->head_dim, p->n_head_kv);
    if (a->attn_kv_pos) { /* positioned rows: n_kv of them, positions non-decreasing and >= 0 */
        if (a->attn_n_kv < 0 || a->attn_n_kv > k.n_tok || a->attn_n_kv > v.n_tok)
            BAD("kernels: %s: n_kv %lld positioned rows vs K %lld, V %lld", on, (long long)a->attn_n_kv,
                (long long)k.n_tok, (long long)v.n_tok);
        for (int64_t j = 0; j < a->attn_n_kv; j++)
            if (a->attn_kv_pos[j] < 0 || (j && a->attn_kv_pos[j] < a->attn_kv_pos[j - 1]))
                BAD("kernels: %s: kv_pos[%lld] = %d is not non-decreasing from 0", on, (long long)j, a->attn_kv_pos[j]);
        for (int64_t j = 0; a->attn_kv_bias && j < a->attn_n_kv; j++)
            if (!isfinite(a->attn_kv_bias[j])) BAD("kernels: %s: kv_bias[%lld] not finite", on, (long long)j);
    } else if (a->attn_kv_bias) {
        BAD("kernels: %s: kv_bias without kv_pos", on);
    } else if (p->pos0 > INT64_MAX - q.n_tok || p->pos0 + q.n_tok > k.n_tok || p->pos0 + q.n_tok > v.n_tok)
        BAD("kernels: %s: cache rows (>= pos0 + n_q = %lld vs K %lld, V %lld)", on, (long long)(p->pos0 + q.n_tok),
            (long long)k.n_tok, (long long)v.n_tok);
    if (q.n_tok > 0 && (!q.data || !k.data || !v.data || !d.data)) BAD("kernels: %s: NULL data", on);
    return RK_OK;
}

/* Weight i of a MATMUL_N as the MATMUL it equals. */
static rk_op_args matmul_n_part(const rk_op_args *a, int i) {
    rk_op_args p = {.op = RK_OP_MATMUL, .src1 = a->src1};
    p.src0 = a->mm->w[i];
    p.dst = a->mm->dst[i];
    return p;
}

rk_status rk_op_check(const rk_op_args *a, rk_err *err) {
    if (!a) BAD("kernels: NULL op args");
    if ((unsigned)a->op >= RK_OP_COUNT) BAD("kernels: op %d out of range (< %d)", (int)a->op, RK_OP_COUNT);
    const char *on = op_names[a->op];
    switch (a->op) {
    case RK_OP_GET_ROWS: {
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        if (a->dst.ne[0] != a->src0.ne[0])
            BAD("kernels: %s: row length (%lld vs %lld)", on, (long long)a->src0.ne[0], (long long)a->dst.ne[0]);
        int64_t n = rk_view_rows(&a->dst), vocab = rk_view_rows(&a->src0);
        if (n > 0 && !a->ids) BAD("kernels: %s: ids is NULL", on);
        for (int64_t i = 0; i < n; i++)
            if (a->ids[i] < 0 || a->ids[i] >= vocab)
                BAD("kernels: %s: id %d at %lld out of range (< %lld)", on, a->ids[i], (long long)i, (long long)vocab);
        return RK_OK;
    }
    case RK_OP_MATMUL:
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "src1", &a->src1, err));
        TRY(check_view(on, "dst", &a->dst, err));
        if (a->src1.ne[0] != a->src0.ne[0])
            BAD("kernels: %s: k (src0 %lld vs src1 %lld)", on, (long long)a->src0.ne[0], (long long)a->src1.ne[0]);
        if (a->dst.ne[0] != rk_view_rows(&a->src0) || rk_view_rows(&a->dst) != rk_view_rows(&a->src1))
            BAD("kernels: %s: dst shape (%lld x %lld vs %lld x %lld)", on, (long long)rk_view_rows(&a->src1),
                (long long)rk_view_rows(&a->src0), (long long)rk_view_rows(&a->dst), (long long)a->dst.ne[0]);
        return RK_OK;
    case RK_OP_RMSNORM:
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        TRY(same_shape(on, "src0", &a->src0, "dst", &a->dst, err));
        if (a->src1.data && a->src1.ne[0] != a->src0.ne[0])
            BAD("kernels: %s: weight length (%lld vs %lld)", on, (long long)a->src0.ne[0], (long long)a->src1.ne[0]);
        if (!(a->eps >= 0) || !isfinite(a->eps)) BAD("kernels: %s: eps %g", on, (double)a->eps);
        return RK_OK;
    case RK_OP_ROPE: {
        const rk_rope_params *p = &a->rope;
        TRY(check_view(on, "src0", &a->src0, err));
        if (a->dst.data && a->dst.data != a->src0.data) {
            TRY(check_view(on, "dst", &a->dst, err));
            TRY(same_shape(on, "src0", &a->src0, "dst", &a->dst, err));
        }
        if (p->n_rot <= 0 || p->n_rot % 2 || p->n_rot > a->src0.ne[0])
            BAD("kernels: %s: n_rot %d (even, 1..head_dim %lld)", on, p->n_rot, (long long)a->src0.ne[0]);
        if (p->mode != RK_ROPE_NORM && p->mode != RK_ROPE_NEOX) BAD("kernels: %s: mode %d", on, p->mode);
        if (!(p->freq_base > 0) || !isfinite(p->freq_base)) BAD("kernels: %s: freq_base %g", on, (double)p->freq_base);
        if (p->pos0 < 0) BAD("kernels: %s: pos0 %lld negative", on, (long long)p->pos0);
        return RK_OK;
    }
    case RK_OP_ATTN: return check_attn(on, a, err);
    case RK_OP_SILU_MUL:
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "src1", &a->src1, err));
        TRY(check_view(on, "dst", &a->dst, err));
        TRY(same_shape(on, "src0", &a->src0, "dst", &a->dst, err));
        return same_shape(on, "src1", &a->src1, "dst", &a->dst, err);
    case RK_OP_ADD:
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        return same_shape(on, "src0", &a->src0, "dst", &a->dst, err);
    case RK_OP_ADD_ROW:
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        if (a->src0.ne[0] != a->dst.ne[0] || (a->dst.ne[0] > 0 && rk_view_rows(&a->dst) > 0 && !a->src0.data))
            BAD("kernels: %s: bias length (%lld vs %lld)", on, (long long)a->dst.ne[0], (long long)a->src0.ne[0]);
        return RK_OK;
    case RK_OP_CPY_ROWS: {
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        int64_t n = rk_view_rows(&a->src0), cap = rk_view_rows(&a->dst);
        if (a->src0.ne[0] != a->dst.ne[0])
            BAD("kernels: %s: row length (%lld vs %lld)", on, (long long)a->dst.ne[0], (long long)a->src0.ne[0]);
        if (a->dst_row0 < 0 || a->dst_row0 > cap || n > cap - a->dst_row0)
            BAD("kernels: %s: rows %lld..%lld past dst (%lld rows)", on, (long long)a->dst_row0,
                (long long)(a->dst_row0 + n), (long long)cap);
        return RK_OK;
    }
    case RK_OP_LR_KEYS: {
        const rk_rope_params *p = &a->rope;
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "src1", &a->src1, err));
        TRY(check_view(on, "src2", &a->src2, err));
        TRY(check_view(on, "dst", &a->dst, err));
        const int64_t n = rk_view_rows(&a->src0), hd = a->dst.ne[0];
        if (rk_view_rows(&a->dst) != n)
            BAD("kernels: %s: dst rows (%lld vs src0 %lld)", on, (long long)rk_view_rows(&a->dst), (long long)n);
        if (a->src1.ne[0] != hd || rk_view_rows(&a->src1) != a->src0.ne[0])
            BAD("kernels: %s: basis shape (%lld x %lld vs r %lld x hd %lld)", on, (long long)rk_view_rows(&a->src1),
                (long long)a->src1.ne[0], (long long)a->src0.ne[0], (long long)hd);
        if (a->src2.ne[0] != hd || rk_view_rows(&a->src2) != 2)
            BAD("kernels: %s: mean / 1/s rows (%lld x %lld vs 2 x %lld)", on, (long long)rk_view_rows(&a->src2),
                (long long)a->src2.ne[0], (long long)hd);
        if (p->n_rot <= 0 || p->n_rot % 2 || p->n_rot > hd)
            BAD("kernels: %s: n_rot %d (even, 1..head_dim %lld)", on, p->n_rot, (long long)hd);
        if (p->mode != RK_ROPE_NORM && p->mode != RK_ROPE_NEOX) BAD("kernels: %s: mode %d", on, p->mode);
        if (!(p->freq_base > 0) || !isfinite(p->freq_base)) BAD("kernels: %s: freq_base %g", on, (double)p->freq_base);
        if (n > 0 && (!a->ids || !a->src0.data || !a->src1.data || !a->src2.data || !a->dst.data))
            BAD("kernels: %s: NULL data or ids", on);
        if (a->lr_rope_cs && a->lr_rope_rows < 0)
            BAD("kernels: %s: rope table rows %lld", on, (long long)a->lr_rope_rows);
        for (int64_t i = 0; i < n; i++)
            if (a->ids[i] < 0 || (a->lr_rope_cs && a->ids[i] >= a->lr_rope_rows))
                BAD("kernels: %s: position %d at %lld out of range (0..%lld)", on, a->ids[i], (long long)i,
                    a->lr_rope_cs ? (long long)a->lr_rope_rows - 1 : (long long)INT32_MAX);
        return RK_OK;
    }
    case RK_OP_SCATTER_ROWS: {
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        if (a->dst.ne[0] != a->src0.ne[0])
            BAD("kernels: %s: row length (%lld vs %lld)", on, (long long)a->src0.ne[0], (long long)a->dst.ne[0]);
        int64_t n = rk_view_rows(&a->src0), rows = rk_view_rows(&a->dst);
        if (n > 0 && !a->ids) BAD("kernels: %s: ids is NULL", on);
        for (int64_t i = 0; i < n; i++)
            if (a->ids[i] < 0 || a->ids[i] >= rows)
                BAD("kernels: %s: id %d at %lld out of range (< %lld)", on, a->ids[i], (long long)i, (long long)rows);
        return RK_OK;
    }
    case RK_OP_LR_ATTN: {
        const rk_lr_attn_args *L = a->lr;
        const rk_attn_params *p = &a->attn;
        TRY(check_view(on, "src0", &a->src0, err));
        TRY(check_view(on, "dst", &a->dst, err));
        if (!L) BAD("kernels: %s: NULL lr args", on);
        if (p->n_head <= 0 || p->n_head_kv <= 0 || p->n_head % p->n_head_kv || p->head_dim <= 0)
            BAD("kernels: %s: heads %d / %d, head_dim %d", on, p->n_head, p->n_head_kv, p->head_dim);
        const int64_t n_q = rk_view_rows(&a->src0), qd = (int64_t)p->n_head * p->head_dim;
        if (a->src0.ne[0] != qd || a->dst.ne[0] != qd || rk_view_rows(&a->dst) != n_q)
            BAD("kernels: %s: q / dst shape (%lld x %lld, %lld x %lld; q_dim %lld)", on, (long long)n_q,
                (long long)a->src0.ne[0], (long long)rk_view_rows(&a->dst), (long long)a->dst.ne[0], (long long)qd);
        if (n_q < 1 || n_q * (p->n_head / p->n_head_kv) > RK_LR_ATTN_MAX_STATE)
            BAD("kernels: %s: %lld query rows x %d heads per KV head (1..%d state rows)", on, (long long)n_q,
                p->n_head / p->n_head_kv, RK_LR_ATTN_MAX_STATE);
        if (L->chunk < 1 || L->chunk > 32 || L->r < 1 || L->n_sel < 0 || L->n_rows < 0 || L->n_sink < 0 ||
            L->x_cap < 1 || L->x_lo < L->n_sink || L->x_lo > p->pos0 || p->pos0 + n_q - L->x_lo > L->x_cap)
            BAD("kernels: %s: chunk %d, rank %d, n_sel %d, rows %lld, sinks %lld, exact [%lld, %lld) in %lld rows", on,
                L->chunk, L->r, L->n_sel, (long long)L->n_rows, (long long)L->n_sink, (long long)L->x_lo,
                (long long)(p->pos0 + n_q), (long long)L->x_cap);
        if (L->coef_bytes < 2 + (size_t)L->r || L->ldb < (int64_t)p->n_head_kv * p->head_dim ||
            L->res_bytes < 2 + (size_t)p->head_dim)
            BAD("kernels: %s: coefficient row %zu bytes, basis row %lld, residual row %zu bytes", on, L->coef_bytes,
                (long long)L->ldb, L->res_bytes);
        if (L->n_rot <= 0 || L->n_rot % 2 || L->n_rot > p->head_dim ||
            (L->rope_mode != RK_ROPE_NORM && L->rope_mode != RK_ROPE_NEOX))
            BAD("kernels: %s: RoPE n_rot %d mode %d", on, L->n_rot, L->rope_mode);
        if (!a->src0.data || !a->dst.data || !L->freq || !L->xk || !L->xv || !L->mean || !L->winv || !L->W || !L->b ||
            (L->n_sink && (!L->sk || !L->sv)) ||
            (L->n_rows &&
             (!L->pos || !L->coef || !L->basis || !L->lmk || !L->cmean || !L->res || !L->mask || !L->base)))
            BAD("kernels: %s: NULL data", on);
        return RK_OK;
    }
    case RK_OP_MATMUL_N:
        if (!a->mm) BAD("kernels: %s: NULL mm args", on);
        if (a->mm->n_w < 1 || a->mm->n_w > RK_MATMUL_N_MAX)
            BAD("kernels: %s: %d weights (1..%d)", on, a->mm->n_w, RK_MATMUL_N_MAX);
        for (int i = 0; i < a->mm->n_w; i++) {
            rk_op_args p = matmul_n_part(a, i);
            rk_err e = {0};
            rk_status st = rk_op_check(&p, &e);
            if (st != RK_OK) return rk_err_set(err, st, "kernels: %s: weight %d: %s", on, i, e.msg);
        }
        return RK_OK;
    case RK_OP_COUNT: break;
    }
    BAD("kernels: op %d out of range", (int)a->op);
}

static bool is_f32(const rk_view *v) { return v->type == RK_DT_F32; }
static bool is_cache_type(const rk_view *v) {
    return v->type == RK_DT_F32 || v->type == RK_DT_F16 || v->type == RK_DT_Q8_0;
}
/* q8_0 / q4_0 caches need whole blocks per head row (ATTN dequantises tiles with the
 * type's own decoder; only CPY_ROWS writes q8_0, q4_0 rows are quantised by their cache) */
static bool attn_cache_ok(const rk_view *v, int head_dim) {
    return v->type == RK_DT_F32 || v->type == RK_DT_F16 ||
           ((v->type == RK_DT_Q8_0 || v->type == RK_DT_Q4_0) && head_dim % 32 == 0);
}

bool rk_cpu_supports_common(const rk_op_args *a, const rk_quant_fns *(*fns)(uint32_t)) {
    if (!a || (unsigned)a->op >= RK_OP_COUNT) return false;
    switch (a->op) {
    case RK_OP_GET_ROWS:
        return is_f32(&a->dst) && (is_f32(&a->src0) || (fns(a->src0.type) && fns(a->src0.type)->to_f32));
    case RK_OP_MATMUL:
        /* the GEMM path dequantises, the GEMV path dots: both are needed */
        return is_f32(&a->dst) && is_f32(&a->src1) &&
               (is_f32(&a->src0) || (fns(a->src0.type) && fns(a->src0.type)->to_f32 && fns(a->src0.type)->dot));
    case RK_OP_RMSNORM: return is_f32(&a->dst) && is_f32(&a->src0) && (!a->src1.data || is_f32(&a->src1));
    case RK_OP_ROPE: return is_f32(&a->src0) && (!a->dst.data || is_f32(&a->dst)) && a->src0.ne[0] % 2 == 0;
    case RK_OP_ATTN:
        return is_f32(&a->dst) && is_f32(&a->src0) && attn_cache_ok(&a->src1, a->attn.head_dim) &&
               attn_cache_ok(&a->src2, a->attn.head_dim);
    case RK_OP_SILU_MUL: return is_f32(&a->dst) && is_f32(&a->src0) && is_f32(&a->src1);
    case RK_OP_ADD:
    case RK_OP_ADD_ROW: return is_f32(&a->dst) && is_f32(&a->src0);
    case RK_OP_CPY_ROWS: return is_f32(&a->src0) && is_cache_type(&a->dst);
    case RK_OP_LR_KEYS:
        return is_f32(&a->dst) && is_f32(&a->src0) && (is_f32(&a->src1) || a->src1.type == RK_DT_F16) &&
               is_f32(&a->src2);
    case RK_OP_SCATTER_ROWS: return is_f32(&a->dst) && is_f32(&a->src0);
    case RK_OP_LR_ATTN: return is_f32(&a->dst) && is_f32(&a->src0);
    case RK_OP_MATMUL_N:
        if (!a->mm || a->mm->n_w < 1 || a->mm->n_w > RK_MATMUL_N_MAX) return false;
        for (int i = 0; i < a->mm->n_w; i++) {
            rk_op_args p = matmul_n_part(a, i);
            if (!rk_cpu_supports_common(&p, fns)) return false;
        }
        return true;
    case RK_OP_COUNT: break;
    }
    return false;
}

/* llama.cpp's ggml_rope_yarn_corr_dim: the pair index whose wavelength makes n_rot
 * rotations over the original context. */
static double yarn_corr_dim(int n_dims, int n_ctx_orig, double n_rot, double base) {
    return n_dims * log(n_ctx_orig / (n_rot * 2.0 * M_PI)) / (2.0 * log(base));
}

void rk_rope_yarn_corr_dims(const rk_rope_params *p, double dims[2]) {
    const int n_orig = p->n_ctx_orig > 0 ? p->n_ctx_orig : 1;
    const double lo = floor(yarn_corr_dim(p->n_rot, n_orig, p->beta_fast, p->freq_base));
    const double hi = ceil(yarn_corr_dim(p->n_rot, n_orig, p->beta_slow, p->freq_base));
    dims[0] = lo > 0 ? lo : 0;
    dims[1] = hi < p->n_rot - 1 ? hi : p->n_rot - 1;
}

void rk_rope_freqs(const rk_rope_params *p, double *freq) {
    const double fs = p->freq_scale > 0 ? p->freq_scale : 1.0;
    double dims[2] = {0, 0};
    if (p->ext_factor != 0) rk_rope_yarn_corr_dims(p, dims);
    for (int i = 0; i < p->n_rot / 2; i++) {
        double mix = fs;
        if (p->ext_factor != 0) {
            double y = (i - dims[0]) / fmax(0.001, dims[1] - dims[0]);
            double r = (1.0 - fmin(1.0, fmax(0.0, y))) * p->ext_factor;
            mix = fs * (1.0 - r) + r;
        }
        freq[i] = pow((double)p->freq_base, -2.0 * i / p->n_rot) * mix;
    }
}

double rk_rope_mscale(const rk_rope_params *p) {
    const double fs = p->freq_scale > 0 ? p->freq_scale : 1.0;
    double m = p->attn_factor > 0 ? p->attn_factor : 1.0;
    if (p->ext_factor != 0) m *= 1.0 + 0.1 * log(1.0 / fs);
    return m;
}

rk_status rk_backend_run(rk_backend *be, const rk_op_args *a, rk_err *err) {
    if (!be || !be->ops) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: NULL backend");
    if (!a) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: %s: NULL op args", be->ops->name);
    if ((unsigned)a->op >= RK_OP_COUNT)
        return rk_err_set(err, RK_E_INVALID_ARG, "kernels: %s: op %d out of range (< %d)", be->ops->name, (int)a->op,
                          RK_OP_COUNT);
    const char *on = op_names[a->op];
    if (a->op == RK_OP_MATMUL_N) { /* the shapes first (mm is read below), then the parts */
        rk_status st = rk_op_check(a, err);
        if (st != RK_OK) return st;
        if (!be->ops->op[a->op] && be->ops->op[RK_OP_MATMUL]) { /* as its MATMULs, in order */
            for (int i = 0; i < a->mm->n_w; i++) {
                rk_op_args p = matmul_n_part(a, i);
                if ((st = rk_backend_run(be, &p, err)) != RK_OK) return st;
            }
            return RK_OK;
        }
    }
    if (!be->ops->op[a->op])
        return rk_err_set(err, RK_E_UNSUPPORTED, "kernels: %s: %s not implemented", be->ops->name, on);
    if (be->ops->supports && !be->ops->supports(be, a)) {
        const rk_view *w = a->op == RK_OP_CPY_ROWS   ? &a->dst
                           : a->op == RK_OP_ATTN     ? &a->src1
                           : a->op == RK_OP_MATMUL_N ? &a->mm->w[0]
                                                     : &a->src0;
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "kernels: %s: %s unsupported for %s (dst %s, src0 %s, src1 %s, src2 %s; "
                          "ne[0] %lld, n_rot %d)",
                          be->ops->name, on, rk_dtype_name(w->type), rk_dtype_name(a->dst.type),
                          rk_dtype_name(a->src0.type), rk_dtype_name(a->src1.type), rk_dtype_name(a->src2.type),
                          (long long)a->src0.ne[0], a->rope.n_rot);
    }
    rk_status st = rk_op_check(a, err);
    if (st != RK_OK) return st;
    return be->ops->op[a->op](be, a, err);
}

rk_status rk_backend_check_ops(const rk_backend *be, const rk_op *ops, int n, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (n < 0 || (n > 0 && !ops)) BAD("kernels: %s: check_ops of %d ops at %p", be->ops->name, n, (const void *)ops);
    for (int i = 0; i < n; i++) {
        if ((unsigned)ops[i] >= RK_OP_COUNT)
            BAD("kernels: %s: op %d at %d out of range (< %d)", be->ops->name, (int)ops[i], i, RK_OP_COUNT);
        if (!be->ops->op[ops[i]] && !(ops[i] == RK_OP_MATMUL_N && be->ops->op[RK_OP_MATMUL])) {
            const char *hint = be->ops->missing_hint;
            return rk_err_set(err, RK_E_UNSUPPORTED, "%s: op %s not implemented yet%s%s%s", be->ops->name,
                              op_names[ops[i]], hint ? " (" : "", hint ? hint : "", hint ? ")" : "");
        }
    }
    return RK_OK;
}

/* ---- memory --------------------------------------------------------------- */
/* Host blocks: calloc (large blocks stay lazily zero-mapped: an untouched KV
 * cache costs no RSS), aligned by hand to 64 bytes; the calloc pointer sits
 * just below the aligned address. */
static rk_status host_alloc(const char *be_name, size_t bytes, void **out, rk_err *err) {
    const size_t extra = 64 + sizeof(void *);
    if (bytes > SIZE_MAX - extra) return rk_err_set(err, RK_E_NOMEM, "kernels: %s: alloc of %zu bytes", be_name, bytes);
    char *raw = calloc(1, bytes + extra);
    if (!raw) return rk_err_set(err, RK_E_NOMEM, "kernels: %s: alloc of %zu bytes", be_name, bytes);
    uintptr_t at = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    memcpy((char *)at - sizeof(void *), &raw, sizeof raw);
    *out = (void *)at;
    return RK_OK;
}

static void host_free(void *p) {
    char *raw;
    memcpy(&raw, (char *)p - sizeof(void *), sizeof raw);
    free(raw);
}

rk_status rk_backend_prepare(rk_backend *be, const rk_view *w, rk_view *out, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (!w || !out) BAD("kernels: %s: prepare: NULL view", be->ops->name);
    if (!rk_dtype_get(w->type)) BAD("kernels: %s: prepare: unknown dtype %u", be->ops->name, w->type);
    TRY(check_view("prepare", "weight", w, err));
    if (!w->data) BAD("kernels: %s: prepare: weight data is NULL", be->ops->name);
    if (be->ops->prepare) return be->ops->prepare(be, w, out, err);
    *out = *w;
    return RK_OK;
}

rk_status rk_backend_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (!out) BAD("kernels: %s: alloc: NULL out", be->ops->name);
    if (be->ops->mem_alloc) return be->ops->mem_alloc(be, bytes, out, err);
    return host_alloc(be->ops->name, bytes, out, err);
}

void rk_backend_free(rk_backend *be, void *p) {
    if (!be || !be->ops || !p) return;
    if (be->ops->mem_free) be->ops->mem_free(be, p);
    else host_free(p);
}

rk_status rk_backend_upload(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (bytes == 0) return RK_OK;
    if (!dst || !src) BAD("kernels: %s: upload of %zu bytes: NULL pointer", be->ops->name, bytes);
    if (be->ops->upload) return be->ops->upload(be, dst, src, bytes, err);
    memmove(dst, src, bytes);
    return RK_OK;
}

rk_status rk_backend_download(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (bytes == 0) return rk_backend_sync(be, err);
    if (!dst || !src) BAD("kernels: %s: download of %zu bytes: NULL pointer", be->ops->name, bytes);
    if (be->ops->download) return be->ops->download(be, dst, src, bytes, err);
    memmove(dst, src, bytes);
    return RK_OK;
}

rk_status rk_backend_sync(rk_backend *be, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    return be->ops->sync ? be->ops->sync(be, err) : RK_OK;
}

rk_status rk_backend_step_begin(rk_backend *be, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (!be->ops->step_begin || !be->ops->step_end)
        return rk_err_set(err, RK_E_UNSUPPORTED, "kernels: %s records no steps", be->ops->name);
    return be->ops->step_begin(be, err);
}

rk_status rk_backend_step_end(rk_backend *be, bool run, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (!be->ops->step_end) return rk_err_set(err, RK_E_UNSUPPORTED, "kernels: %s records no steps", be->ops->name);
    return be->ops->step_end(be, run, err);
}

rk_status rk_backend_host_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (!out) BAD("kernels: %s: host_alloc: NULL out", be->ops->name);
    if (be->ops->host_alloc) return be->ops->host_alloc(be, bytes, out, err);
    return host_alloc(be->ops->name, bytes, out, err);
}

void rk_backend_host_free(rk_backend *be, void *p) {
    if (!be || !be->ops || !p) return;
    if (be->ops->host_free) be->ops->host_free(be, p);
    else host_free(p);
}

rk_status rk_backend_lane_copy(rk_backend *be, void *dst, const void *src, size_t bytes, bool to_device, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    if (bytes == 0) return RK_OK;
    if (!dst || !src) BAD("kernels: %s: lane copy of %zu bytes: NULL pointer", be->ops->name, bytes);
    if (be->ops->lane_copy) return be->ops->lane_copy(be, dst, src, bytes, to_device, err);
    return to_device ? rk_backend_upload(be, dst, src, bytes, err) : rk_backend_download(be, dst, src, bytes, err);
}

rk_status rk_backend_lane_join(rk_backend *be, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    return be->ops->lane_join ? be->ops->lane_join(be, err) : RK_OK;
}

rk_status rk_backend_lane_sync(rk_backend *be, rk_err *err) {
    if (!be || !be->ops) BAD("kernels: NULL backend");
    return be->ops->lane_sync ? be->ops->lane_sync(be, err) : RK_OK;
}

rk_pool *rk_backend_pool(rk_backend *be) { return be && be->ops && be->ops->pool ? be->ops->pool(be) : NULL; }
