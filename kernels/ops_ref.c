/* cpu_ref: the oracle. Scalar, single-threaded, fp64 accumulation, written
 * straight from the math (golden/README.md §2); never optimised. Every other
 * backend is tested against it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"

/* Row r of src in f32 (dequantised into buf unless it already is f32). */
static const float *row_f32(const rk_view *v, int64_t r, float *buf) {
    const char *row = (const char *)v->data + (size_t)r * v->nb1;
    if (v->type == RK_DT_F32) return (const float *)row;
    rk_quant_ref(v->type)->to_f32(row, buf, v->ne[0]);
    return buf;
}

static rk_status ref_get_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    (void)err;
    int64_t n = rk_view_rows(&a->dst), d = a->dst.ne[0];
    for (int64_t i = 0; i < n; i++) {
        float *out = rk_row_f32(&a->dst, i);
        const float *src = row_f32(&a->src0, a->ids[i], out);
        if (src != out) memcpy(out, src, (size_t)d * sizeof(float));
    }
    return RK_OK;
}

static rk_status ref_matmul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    int64_t k = a->src0.ne[0], m = rk_view_rows(&a->src0), n = rk_view_rows(&a->src1);
    float *buf = malloc((size_t)(k > 0 ? k : 1) * sizeof(float)); /* (k) one dequantised weight row */
    if (!buf) return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: MATMUL row buffer (%lld floats)", (long long)k);
    for (int64_t j = 0; j < m; j++) {
        const float *w = row_f32(&a->src0, j, buf);
        for (int64_t t = 0; t < n; t++) {
            const float *x = rk_row_f32(&a->src1, t);
            double s = 0;
            for (int64_t p = 0; p < k; p++) s += (double)w[p] * x[p];
            rk_row_f32(&a->dst, t)[j] = (float)s;
        }
    }
    free(buf);
    return RK_OK;
}

/* MATMUL_N: its MATMULs, one after the other. */
static rk_status ref_matmul_n(rk_backend *be, const rk_op_args *a, rk_err *err) {
    for (int i = 0; i < a->mm->n_w; i++) {
        rk_op_args p = {.op = RK_OP_MATMUL, .src0 = a->mm->w[i], .src1 = a->src1, .dst = a->mm->dst[i]};
        rk_status st = ref_matmul(be, &p, err);
        if (st != RK_OK) return st;
    }
    return RK_OK;
}

static rk_status ref_rmsnorm(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    (void)err;
    int64_t n = rk_view_rows(&a->src0), d = a->src0.ne[0];
    const float *w = a->src1.data;
    for (int64_t r = 0; r < n; r++) {
        const float *x = rk_row_f32(&a->src0, r);
        float *y = rk_row_f32(&a->dst, r);
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
        double scale = 1.0 / sqrt(ss / (double)d + (double)a->eps);
        for (int64_t i = 0; i < d; i++) y[i] = (float)(x[i] * scale * (w ? w[i] : 1.0));
    }
    return RK_OK;
}

static rk_status ref_rope(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    const rk_rope_params *p = &a->rope;
    int64_t n = rk_view_rows(&a->src0), hd = a->src0.ne[0], n_head = a->src0.ne[1];
    int half = p->n_rot / 2;
    const rk_view *out = a->dst.data ? &a->dst : &a->src0;
    double *freq = malloc((size_t)half * sizeof(double)); /* (n_rot/2) */
    if (!freq) return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: ROPE frequencies");
    rk_rope_freqs(p, freq);
    const double ms = rk_rope_mscale(p);
    for (int64_t r = 0; r < n; r++) {
        const float *x = rk_row_f32(&a->src0, r);
        float *y = rk_row_f32(out, r);
        double pos = (double)(p->pos0 + r / n_head);
        for (int i = 0; i < half; i++) {
            int64_t i0 = p->mode == RK_ROPE_NEOX ? i : 2 * i;
            int64_t i1 = p->mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
            double c = cos(pos * freq[i]) * ms, s = sin(pos * freq[i]) * ms;
            double x0 = x[i0], x1 = x[i1];
            y[i0] = (float)(x0 * c - x1 * s);
            y[i1] = (float)(x0 * s + x1 * c);
        }
        if (y != x) memcpy(y + p->n_rot, x + p->n_rot, (size_t)(hd - p->n_rot) * sizeof(float));
    }
    free(freq);
    return RK_OK;
}

/* Plain two-pass softmax per (query row, head): scores of every visible key,
 * max, exp, normalise. */
static rk_status ref_attn(rk_backend *be, const rk_op_args *a, rk_err *err) {
    if (a->attn_sparse) return rk_attn_sparse_run(be, a, true, ref_attn, err);
    const rk_attn_params *p = &a->attn;
    rk_heads q, k, v, o;
    rk_heads_of(&a->src0, p->n_head, p->head_dim, &q);
    rk_heads_of(&a->src1, p->n_head_kv, p->head_dim, &k);
    rk_heads_of(&a->src2, p->n_head_kv, p->head_dim, &v);
    rk_heads_of(&a->dst, p->n_head, p->head_dim, &o);
    int64_t n_kv = a->attn_kv_pos ? a->attn_n_kv : p->pos0 + q.n_tok, hd = p->head_dim;
    int group = p->n_head / p->n_head_kv;
    /* f32, f16 and q8_0 head rows all go through the reference dequantiser */
    const rk_quant_fns *kq = rk_quant_ref(a->src1.type), *vq = rk_quant_ref(a->src2.type);
    double *sc = malloc((size_t)(n_kv > 0 ? n_kv : 1) * sizeof(double)); /* (n_kv) */
    double *acc = malloc((size_t)hd * sizeof(double));                   /* (head_dim) */
    float *row = malloc((size_t)hd * sizeof(float));                     /* (head_dim) one K or V head */
    if (!sc || !acc || !row) {
        free(sc);
        free(acc);
        free(row);
        return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: ATTN scores (%lld)", (long long)n_kv);
    }
    for (int64_t t = 0; t < q.n_tok; t++) {
        int64_t nk = p->pos0 + t + 1;
        if (a->attn_kv_pos)
            for (nk = 0; nk < n_kv && a->attn_kv_pos[nk] <= p->pos0 + t;) nk++;
        for (int h = 0; h < p->n_head; h++) {
            int hk = h / group;
            const float *qr = (const float *)(q.data + t * q.tok_nb + h * q.head_nb);
            double mx = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                kq->to_f32(k.data + j * k.tok_nb + hk * k.head_nb, row, hd);
                double s = 0;
                for (int64_t d = 0; d < hd; d++) s += (double)qr[d] * row[d];
                sc[j] = s * p->scale + (a->attn_kv_bias ? a->attn_kv_bias[j] : 0.0);
                if (sc[j] > mx) mx = sc[j];
            }
            double sum = 0;
            for (int64_t j = 0; j < nk; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int64_t d = 0; d < hd; d++) acc[d] = 0;
            for (int64_t j = 0; j < nk; j++) {
                vq->to_f32(v.data + j * v.tok_nb + hk * v.head_nb, row, hd);
                for (int64_t d = 0; d < hd; d++) acc[d] += sc[j] * row[d];
            }
            float *out = (float *)(o.data + t * o.tok_nb + h * o.head_nb);
            for (int64_t d = 0; d < hd; d++) out[d] = (float)(acc[d] / sum);
        }
    }
    free(sc);
    free(acc);
    free(row);
    return RK_OK;
}

static rk_status ref_silu_mul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    (void)err;
    int64_t n = rk_view_rows(&a->dst), d = a->dst.ne[0];
    for (int64_t r = 0; r < n; r++) {
        const float *x = rk_row_f32(&a->src0, r), *g = rk_row_f32(&a->src1, r);
        float *y = rk_row_f32(&a->dst, r);
        for (int64_t i = 0; i < d; i++) y[i] = (float)((double)x[i] / (1.0 + exp(-(double)x[i])) * g[i]);
    }
    return RK_OK;
}

static rk_status ref_add(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    (void)err;
    int64_t n = rk_view_rows(&a->dst), d = a->dst.ne[0];
    for (int64_t r = 0; r < n; r++) {
        const float *x = rk_row_f32(&a->src0, a->op == RK_OP_ADD ? r : 0);
        float *y = rk_row_f32(&a->dst, r);
        for (int64_t i = 0; i < d; i++) y[i] += x[i];
    }
    return RK_OK;
}

static rk_status ref_cpy_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    (void)err;
    int64_t n = rk_view_rows(&a->src0), d = a->src0.ne[0];
    for (int64_t r = 0; r < n; r++) {
        const float *x = rk_row_f32(&a->src0, r);
        char *y = (char *)a->dst.data + (size_t)(a->dst_row0 + r) * a->dst.nb1;
        if (a->dst.type == RK_DT_Q8_0) {
            rk_quant_q8_0_from_f32(x, y, d);
            continue;
        }
        for (int64_t i = 0; i < d; i++) {
            if (a->dst.type == RK_DT_F16) ((uint16_t *)y)[i] = rk_f32_to_f16(x[i]);
            else ((float *)y)[i] = x[i];
        }
    }
    return RK_OK;
}

static bool ref_supports(const rk_backend *be, const rk_op_args *a) {
    (void)be;
    return rk_cpu_supports_common(a, rk_quant_ref);
}

static void ref_destroy(rk_backend *be) { free(be); }

static const rk_backend_ops ref_ops = {
    .name = "cpu_ref",
    .op =
        {
            [RK_OP_GET_ROWS] = ref_get_rows,
            [RK_OP_MATMUL] = ref_matmul,
            [RK_OP_RMSNORM] = ref_rmsnorm,
            [RK_OP_ROPE] = ref_rope,
            [RK_OP_ATTN] = ref_attn,
            [RK_OP_SILU_MUL] = ref_silu_mul,
            [RK_OP_ADD] = ref_add,
            [RK_OP_ADD_ROW] = ref_add,
            [RK_OP_CPY_ROWS] = ref_cpy_rows,
            [RK_OP_LR_KEYS] = rk_ref_lr_keys,
            [RK_OP_SCATTER_ROWS] = rk_ref_scatter_rows,
            [RK_OP_LR_ATTN] = rk_ref_lr_attn,
            [RK_OP_MATMUL_N] = ref_matmul_n,
        },
    .supports = ref_supports,
    .destroy = ref_destroy,
};
_Static_assert(RK_OP_COUNT == 13, "op count changed: add the op to ref_ops");

rk_status rk_backend_cpu_ref_create(rk_backend **out, rk_err *err) {
    if (!out) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: cpu_ref: NULL out");
    rk_backend *be = calloc(1, sizeof *be);
    if (!be) return rk_err_set(err, RK_E_NOMEM, "kernels: cpu_ref: backend allocation");
    be->ops = &ref_ops;
    be->n_threads = 1;
    *out = be;
    return RK_OK;
}
