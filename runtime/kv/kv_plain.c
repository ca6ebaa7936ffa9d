/* Plain KV cache: f16 or f32 rows per layer, (n_ctx, kv_dim) each; rows are written by
 * the backend's CPY_ROWS and attended by its ATTN, exactly as the layer loop did before
 * the interface existed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_impl.h"

typedef struct plain {
    uint32_t type;    /* RK_DT_F16 or RK_DT_F32 */
    bool dev;         /* caches in the backend's own memory (cuda): host access goes through download/upload */
    uint8_t **k, **v; /* (n_layer) of (n_ctx, kv_dim); calloc'd: untouched context costs no memory */
} plain;

static rk_view cache_view(const rk_kv *kv, uint32_t type, void *data, int64_t rows) {
    rk_view v = {type, {kv->kv_dim, rows, 1, 1}, kv->row_bytes, data};
    return v;
}

static rk_view f32_view(const float *data, int64_t cols, int64_t rows) {
    rk_view v = {RK_DT_F32, {cols, rows, 1, 1}, (size_t)cols * sizeof(float), (void *)data};
    return v;
}

static rk_status plain_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    plain *c = kv->impl;
    rk_op_args a = {.op = RK_OP_CPY_ROWS, .dst_row0 = pos0};
    a.dst = cache_view(kv, c->type, c->k[l], kv->n_ctx);
    a.src0 = f32_view(k, kv->kv_dim, n);
    rk_status st = rk_backend_run(kv->be, &a, err);
    if (st) return st;
    a.dst.data = c->v[l];
    a.src0.data = (void *)v;
    return rk_backend_run(kv->be, &a, err);
}

static rk_status plain_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    plain *c = kv->impl;
    rk_op_args at = rk_kv_attn_args(kv, q, n_q, pos0, out);
    at.src1 = cache_view(kv, c->type, c->k[l], pos0 + n_q);
    at.src2 = cache_view(kv, c->type, c->v[l], pos0 + n_q);
    return rk_backend_run(kv->be, &at, err);
}

static rk_status plain_read(const rk_kv *kv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                            rk_err *err) {
    const plain *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, kv->n_ctx, err);
    if (st) return st;
    const uint8_t *src = (const uint8_t *)(values ? c->v[l] : c->k[l]) + (size_t)row0 * kv->row_bytes;
    if (c->dev) { /* through a host copy of the rows */
        size_t bytes = (size_t)n * kv->row_bytes;
        uint8_t *tmp = malloc(bytes ? bytes : 1);
        if (!tmp) return rk_err_set(err, RK_E_NOMEM, "kv: read of %lld rows", (long long)n);
        st = rk_backend_download(kv->be, tmp, src, bytes, err);
        if (!st) rk_kv_rows_to_f32(c->type, tmp, n, kv->kv_dim, dst);
        free(tmp);
        if (st) return st;
    } else {
        rk_kv_rows_to_f32(c->type, src, n, kv->kv_dim, dst);
    }
    if (!values && pre_rope)
        for (int64_t i = 0; i < n; i++) rk_kv_unrope(kv, dst + i * kv->kv_dim, row0 + i);
    return RK_OK;
}

static rk_status plain_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    plain *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, kv->n_ctx, err);
    if (st) return st;
    uint8_t *dst = (uint8_t *)(values ? c->v[l] : c->k[l]) + (size_t)row0 * kv->row_bytes;
    if (c->dev) {
        size_t bytes = (size_t)n * kv->row_bytes;
        uint8_t *tmp = malloc(bytes ? bytes : 1);
        if (!tmp) return rk_err_set(err, RK_E_NOMEM, "kv: write of %lld rows", (long long)n);
        rk_kv_rows_from_f32(c->type, src, n, kv->kv_dim, tmp);
        st = rk_backend_upload(kv->be, dst, tmp, bytes, err);
        free(tmp);
        return st;
    }
    rk_kv_rows_from_f32(c->type, src, n, kv->kv_dim, dst);
    return RK_OK;
}

static void plain_bytes(const rk_kv *kv, rk_kv_bytes *o) {
    rk_kv_bytes_base(kv, o);
    o->n_exact_rows = kv->n_past;
    o->exact = (uint64_t)kv->n_past * 2ull * (uint64_t)kv->n_layer * kv->row_bytes;
    o->total = o->exact;
}

static int plain_params(const rk_kv *kv, rk_kv_param *out) {
    const plain *c = kv->impl;
    out[0] = (rk_kv_param){"dtype", (double)c->type};
    return 1;
}

/* Device caches: the payload of rk_kv_rows_export / _import, one layer's rows at a time
 * through a host buffer. */
static rk_status dev_export(const rk_kv *kv, const plain *c, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    const size_t off = (size_t)row0 * kv->row_bytes, len = (size_t)(row1 - row0) * kv->row_bytes;
    uint8_t *tmp = malloc(len ? len : 1);
    if (!tmp) return rk_err_set(err, RK_E_NOMEM, "kv: export of %lld rows", (long long)(row1 - row0));
    rk_status st = RK_OK;
    for (int l = 0; l < kv->n_layer && !st; l++)
        for (int part = 0; part < 2 && !st; part++)
            if (!(st = rk_backend_download(kv->be, tmp, (part ? c->v[l] : c->k[l]) + off, len, err)))
                rk_kv_put(out, tmp, len);
    free(tmp);
    return st;
}

static rk_status dev_import(rk_kv *kv, plain *c, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n,
                            rk_err *err) {
    uint64_t want;
    if (!rk_mul_u64((uint64_t)n_rows, kv->row_bytes, &want) || !rk_mul_u64(want, 2ull * (uint64_t)kv->n_layer, &want) ||
        want != n)
        return rk_err_set(err, RK_E_FORMAT, "kv: plain payload of %zu bytes for %lld rows (expected %llu)", n,
                          (long long)n_rows, (unsigned long long)want);
    const size_t off = (size_t)row0 * kv->row_bytes, len = (size_t)n_rows * kv->row_bytes;
    rk_status st = RK_OK;
    for (int l = 0; l < kv->n_layer && !st; l++)
        if (!(st = rk_backend_upload(kv->be, c->k[l] + off, p + (size_t)(2 * l) * len, len, err)))
            st = rk_backend_upload(kv->be, c->v[l] + off, p + (size_t)(2 * l + 1) * len, len, err);
    if (!st) kv->n_past = row0 + n_rows;
    return st;
}

static rk_status plain_export(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    const plain *c = kv->impl;
    if (c->dev) return dev_export(kv, c, row0, row1, out, err);
    rk_kv_rows_export(kv, c->k, c->v, row0, row1, out);
    return RK_OK;
}

static rk_status plain_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    plain *c = kv->impl;
    if (c->dev) return dev_import(kv, c, row0, n_rows, p, n, err);
    return rk_kv_rows_import(kv, c->k, c->v, row0, n_rows, p, n, "plain", NULL, err);
}

static rk_status plain_import_part(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const uint8_t *p,
                                   rk_err *err) {
    plain *c = kv->impl;
    uint8_t *dst = (values ? c->v[l] : c->k[l]) + (size_t)row0 * kv->row_bytes;
    const size_t len = (size_t)n * kv->row_bytes;
    if (c->dev) return rk_backend_upload(kv->be, dst, p, len, err);
    memcpy(dst, p, len);
    return RK_OK;
}

static void plain_destroy(rk_kv *kv) {
    plain *c = kv->impl;
    if (!c) return;
    for (int l = 0; l < kv->n_layer; l++) {
        if (c->dev) {
            if (c->k) rk_backend_free(kv->be, c->k[l]);
            if (c->v) rk_backend_free(kv->be, c->v[l]);
            continue;
        }
        if (c->k) free(c->k[l]);
        if (c->v) free(c->v[l]);
    }
    free(c->k), free(c->v), free(c);
    kv->impl = NULL;
}

static const rk_kv_ops plain_ops = {
    .name = "plain",
    .mem = RK_KV_MEM_BACKEND,
    .writable = true,
    .recordable = true,
    .append = plain_append,
    .attend = plain_attend,
    .commit = rk_kv_rows_commit,
    .truncate = rk_kv_rows_truncate,
    .reset = rk_kv_rows_reset,
    .read = plain_read,
    .write = plain_write,
    .bytes = plain_bytes,
    .stats = NULL,
    .params = plain_params,
    .export_rows = plain_export,
    .export_bytes = rk_kv_rows_export_bytes,
    .import_part = plain_import_part,
    .import_rows = plain_import,
    .destroy = plain_destroy,
};

rk_status rk_kv_plain_init(rk_kv *kv, uint32_t type, rk_err *err) {
    plain *c = calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    kv->ops = &plain_ops;
    kv->impl = c;
    c->type = type;
    kv->row_bytes = (size_t)kv->kv_dim * (type == RK_DT_F32 ? 4 : 2);
    c->k = calloc((size_t)kv->n_layer, sizeof *c->k);
    c->v = calloc((size_t)kv->n_layer, sizeof *c->v);
    if (!c->k || !c->v) goto nomem;
    c->dev = kv->be && kv->be->ops->mem_alloc;
    for (int l = 0; l < kv->n_layer; l++) {
        if (c->dev) { /* zeroed backend memory, like calloc */
            size_t bytes = (size_t)kv->n_ctx * kv->row_bytes;
            void *pk = NULL, *pv = NULL;
            if (rk_backend_alloc(kv->be, bytes, &pk, NULL) == RK_OK) c->k[l] = pk;
            if (rk_backend_alloc(kv->be, bytes, &pv, NULL) == RK_OK) c->v[l] = pv;
        } else {
            c->k[l] = calloc((size_t)kv->n_ctx, kv->row_bytes);
            c->v[l] = calloc((size_t)kv->n_ctx, kv->row_bytes);
        }
        if (!c->k[l] || !c->v[l]) goto nomem;
    }
    return RK_OK;
nomem:
    return rk_err_set(err, RK_E_NOMEM, "kv: cannot allocate the %s cache for n_ctx %lld", rk_dtype_name(type),
                      (long long)kv->n_ctx);
}
