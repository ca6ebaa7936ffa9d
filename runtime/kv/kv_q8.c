/* Quantised KV caches: every row as llama.cpp's blocks of 32 values, q8_0 {f16 d; int8
 * qs[32]} (34 bytes: 1.0625 bytes per value, 1.88x less than f16) or q4_0 {f16 d; 4-bit
 * qs[16]} (18 bytes: 0.5625 bytes per value, 3.56x less than f16). Quantised here on
 * append. Attention: the backend's ATTN on the blocks when its supports() takes that type
 * for K/V (asked once, at creation); otherwise the layer's rows [0, pos0 + n_q) are
 * dequantised into an f32 scratch pair and the f32 ATTN runs over them (the same numbers,
 * slower). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_impl.h"

typedef struct q8 {
    uint32_t type;    /* RK_DT_Q8_0 or RK_DT_Q4_0 */
    uint8_t **k, **v; /* (n_layer) of (n_ctx, kv_dim / 32) blocks; calloc'd, touched as filled */
    bool direct;      /* the backend attends on the blocks itself */
    float *sk, *sv;   /* fallback scratch: (cap, kv_dim) dequantised rows of one layer */
    int64_t cap;
} q8;

void rk_q8_quantize(const float *x, int64_t n, uint8_t *dst) {
    for (int64_t b = 0; b < n / RK_Q8_BLOCK; b++) {
        const float *xb = x + b * RK_Q8_BLOCK;
        uint8_t *yb = dst + b * RK_Q8_BLOCK_BYTES;
        float amax = 0.0f;
        for (int j = 0; j < RK_Q8_BLOCK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = rk_f32_to_f16(d);
        memcpy(yb, &h, 2);
        for (int j = 0; j < RK_Q8_BLOCK; j++) yb[2 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
    }
}

void rk_q8_dequantize(const uint8_t *src, int64_t n, float *dst) { rk_quant_fast(RK_DT_Q8_0)->to_f32(src, dst, n); }

void rk_q4_quantize(const float *x, int64_t n, uint8_t *dst) {
    for (int64_t b = 0; b < n / RK_Q4_BLOCK; b++) {
        const float *xb = x + b * RK_Q4_BLOCK;
        uint8_t *yb = dst + b * RK_Q4_BLOCK_BYTES;
        float amax = 0.0f, m = 0.0f; /* m: the value of largest magnitude, with its sign */
        for (int j = 0; j < RK_Q4_BLOCK; j++)
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), m = xb[j];
        const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = rk_f32_to_f16(d);
        memcpy(yb, &h, 2);
        for (int j = 0; j < RK_Q4_BLOCK / 2; j++) {
            /* x / d in [-8, 8]: + 8.5 truncated is the nearest code, 16 (x = -m) clamped to 15 */
            const int c0 = (int)(xb[j] * id + 8.5f), c1 = (int)(xb[j + RK_Q4_BLOCK / 2] * id + 8.5f);
            yb[2 + j] = (uint8_t)((c0 < 15 ? c0 : 15) | (c1 < 15 ? c1 : 15) << 4);
        }
    }
}

void rk_q4_dequantize(const uint8_t *src, int64_t n, float *dst) { rk_quant_fast(RK_DT_Q4_0)->to_f32(src, dst, n); }

static void quantize(uint32_t type, const float *x, int64_t n, uint8_t *dst) {
    if (type == RK_DT_Q4_0) rk_q4_quantize(x, n, dst);
    else rk_q8_quantize(x, n, dst);
}

static void dequantize(uint32_t type, const uint8_t *src, int64_t n, float *dst) {
    rk_quant_fast(type)->to_f32(src, dst, n);
}

bool rk_kv_quant_direct(const rk_kv *kv) {
    return (kv->kind == RK_KV_Q8 || kv->kind == RK_KV_Q4) && kv->ops->tier_stats == NULL &&
           ((const q8 *)kv->impl)->direct; /* not the tier's */
}


static rk_view f32_view(const float *data, int64_t cols, int64_t rows) {
    rk_view v = {RK_DT_F32, {cols, rows, 1, 1}, (size_t)cols * sizeof(float), (void *)data};
    return v;
}

static rk_status q8_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    q8 *c = kv->impl;
    if (pos0 < 0 || n < 0 || pos0 > kv->n_ctx - n)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: %s rows %lld..%lld past n_ctx %lld", kv->ops->name,
                          (long long)pos0, (long long)(pos0 + n), (long long)kv->n_ctx);
    quantize(c->type, k, n * kv->kv_dim, c->k[l] + (size_t)pos0 * kv->row_bytes);
    quantize(c->type, v, n * kv->kv_dim, c->v[l] + (size_t)pos0 * kv->row_bytes);
    return RK_OK;
}

static rk_status q8_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    q8 *c = kv->impl;
    const int64_t rows = pos0 + n_q, kvd = kv->kv_dim;
    rk_op_args at = rk_kv_attn_args(kv, q, n_q, pos0, out);
    if (c->direct) {
        at.src1 = (rk_view){c->type, {kvd, rows, 1, 1}, kv->row_bytes, c->k[l]};
        at.src2 = (rk_view){c->type, {kvd, rows, 1, 1}, kv->row_bytes, c->v[l]};
        return rk_backend_run(kv->be, &at, err);
    }
    if (rows > c->cap) {
        /* grows by halves: a decode loop reallocates O(log n_ctx) times */
        int64_t cap = c->cap + c->cap / 2 > rows ? c->cap + c->cap / 2 : rows;
        if (cap < 256) cap = 256;
        if (cap > kv->n_ctx) cap = kv->n_ctx;
        float *sk = realloc(c->sk, (size_t)(cap * kvd) * sizeof(float));
        if (sk) c->sk = sk;
        float *sv = sk ? realloc(c->sv, (size_t)(cap * kvd) * sizeof(float)) : NULL;
        if (sv) c->sv = sv;
        if (!sk || !sv)
            return rk_err_set(err, RK_E_NOMEM, "kv: no memory for %s attention scratch of %lld rows", kv->ops->name,
                              (long long)cap);
        c->cap = cap;
    }
    dequantize(c->type, c->k[l], rows * kvd, c->sk);
    dequantize(c->type, c->v[l], rows * kvd, c->sv);
    at.src1 = f32_view(c->sk, kvd, rows);
    at.src2 = f32_view(c->sv, kvd, rows);
    return rk_backend_run(kv->be, &at, err);
}

static rk_status q8_read(const rk_kv *kv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                         rk_err *err) {
    const q8 *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, kv->n_ctx, err);
    if (st) return st;
    dequantize(c->type, (values ? c->v[l] : c->k[l]) + (size_t)row0 * kv->row_bytes, n * kv->kv_dim, dst);
    if (!values && pre_rope)
        for (int64_t i = 0; i < n; i++) rk_kv_unrope(kv, dst + i * kv->kv_dim, row0 + i);
    return RK_OK;
}

static rk_status q8_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    q8 *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, kv->n_ctx, err);
    if (st) return st;
    quantize(c->type, src, n * kv->kv_dim, (values ? c->v[l] : c->k[l]) + (size_t)row0 * kv->row_bytes);
    return RK_OK;
}

static void q8_bytes(const rk_kv *kv, rk_kv_bytes *o) {
    const q8 *c = kv->impl;
    rk_kv_bytes_base(kv, o);
    o->n_exact_rows = kv->n_past;
    o->exact = (uint64_t)kv->n_past * 2ull * (uint64_t)kv->n_layer * kv->row_bytes;
    o->total = o->exact;
    o->scratch = 2ull * (uint64_t)c->cap * (uint64_t)kv->kv_dim * sizeof(float);
}

static int q8_params(const rk_kv *kv, rk_kv_param *out) {
    out[0] = (rk_kv_param){"dtype", (double)((const q8 *)kv->impl)->type};
    out[1] = (rk_kv_param){"block", (double)RK_Q8_BLOCK};
    return 2;
}

static rk_status q8_export(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    (void)err;
    const q8 *c = kv->impl;
    rk_kv_rows_export(kv, c->k, c->v, row0, row1, out);
    return RK_OK;
}

/* every block scale must be a finite f16: a NaN or Inf scale is corruption */
static rk_status scales_check(const uint8_t *p, size_t n, size_t block, const char *what, rk_err *err) {
    for (size_t b = 0; b + 2 <= n; b += block) {
        uint16_t h;
        memcpy(&h, p + b, 2);
        if ((h & 0x7c00u) == 0x7c00u)
            return rk_err_set(err, RK_E_FORMAT, "kv: %s payload block %zu has a non-finite scale", what, b / block);
    }
    return RK_OK;
}

static rk_status q8_check(const uint8_t *p, size_t n, rk_err *err) {
    return scales_check(p, n, RK_Q8_BLOCK_BYTES, "q8", err);
}

static rk_status q4_check(const uint8_t *p, size_t n, rk_err *err) {
    return scales_check(p, n, RK_Q4_BLOCK_BYTES, "q4", err);
}

static rk_status q8_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    q8 *c = kv->impl;
    const bool q4 = c->type == RK_DT_Q4_0;
    return rk_kv_rows_import(kv, c->k, c->v, row0, n_rows, p, n, kv->ops->name, q4 ? q4_check : q8_check, err);
}

static rk_status q8_import_part(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const uint8_t *p, rk_err *err) {
    q8 *c = kv->impl;
    const size_t len = (size_t)n * kv->row_bytes;
    rk_status st = c->type == RK_DT_Q4_0 ? q4_check(p, len, err) : q8_check(p, len, err);
    if (!st) memcpy((values ? c->v[l] : c->k[l]) + (size_t)row0 * kv->row_bytes, p, len);
    return st;
}

static void q8_destroy(rk_kv *kv) {
    q8 *c = kv->impl;
    if (!c) return;
    for (int l = 0; l < kv->n_layer; l++) {
        if (c->k) free(c->k[l]);
        if (c->v) free(c->v[l]);
    }
    free(c->k), free(c->v), free(c->sk), free(c->sv), free(c);
    kv->impl = NULL;
}

/* the same functions under each type's name ("q8", "q4": errors and KV blocks say which) */
#define QUANT_OPS(nm)                                                                                                 \
    {                                                                                                                 \
        .name = nm, .mem = RK_KV_MEM_HOST, .writable = true, .recordable = false, .append = q8_append,                \
        .attend = q8_attend, .commit = rk_kv_rows_commit, .truncate = rk_kv_rows_truncate, .reset = rk_kv_rows_reset, \
        .read = q8_read, .write = q8_write, .bytes = q8_bytes, .stats = NULL, .params = q8_params,                    \
        .export_rows = q8_export, .export_bytes = rk_kv_rows_export_bytes, .import_part = q8_import_part,             \
        .import_rows = q8_import, .destroy = q8_destroy,                                                              \
    }
static const rk_kv_ops q8_ops = QUANT_OPS("q8"), q4_ops = QUANT_OPS("q4");

static rk_status quant_init(rk_kv *kv, uint32_t type, rk_err *err) {
    const bool q4 = type == RK_DT_Q4_0;
    if (kv->kv_dim % RK_Q8_BLOCK)
        return rk_err_set(err, RK_E_UNSUPPORTED, "kv: %s needs kv_dim a multiple of %d (model has %d)",
                          q4 ? "q4" : "q8", RK_Q8_BLOCK, kv->kv_dim);
    q8 *c = calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    c->type = type;
    kv->ops = q4 ? &q4_ops : &q8_ops;
    kv->impl = c;
    kv->row_bytes = (size_t)(kv->kv_dim / RK_Q8_BLOCK) * (q4 ? RK_Q4_BLOCK_BYTES : RK_Q8_BLOCK_BYTES);
    c->k = calloc((size_t)kv->n_layer, sizeof(uint8_t *));
    c->v = calloc((size_t)kv->n_layer, sizeof(uint8_t *));
    if (!c->k || !c->v) goto nomem;
    for (int l = 0; l < kv->n_layer; l++) {
        c->k[l] = calloc((size_t)kv->n_ctx, kv->row_bytes);
        c->v[l] = calloc((size_t)kv->n_ctx, kv->row_bytes);
        if (!c->k[l] || !c->v[l]) goto nomem;
    }
    /* does the backend attend on these blocks? (the kernels may add it; the fallback is exact) */
    float q[1] = {0}, o[1];
    rk_op_args at = rk_kv_attn_args(kv, q, 1, 0, o);
    at.src1 = (rk_view){type, {kv->kv_dim, 1, 1, 1}, kv->row_bytes, c->k[0]};
    at.src2 = (rk_view){type, {kv->kv_dim, 1, 1, 1}, kv->row_bytes, c->v[0]};
    const rk_backend_ops *bo = kv->be->ops;
    c->direct = bo->op[RK_OP_ATTN] && (!bo->supports || bo->supports(kv->be, &at));
    return RK_OK;
nomem:
    return rk_err_set(err, RK_E_NOMEM, "kv: cannot allocate the %s cache for n_ctx %lld", q4 ? "q4" : "q8",
                      (long long)kv->n_ctx);
}

rk_status rk_kv_q8_init(rk_kv *kv, rk_err *err) { return quant_init(kv, RK_DT_Q8_0, err); }

rk_status rk_kv_q4_init(rk_kv *kv, rk_err *err) { return quant_init(kv, RK_DT_Q4_0, err); }
