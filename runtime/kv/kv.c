/* The KV-cache interface: creation by policy, the codec thread pool, shared row helpers
 * and the byte buffers of export / import. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_impl.h"
#include "model_impl.h"

rk_status rk_kv_create(const rk_model *m, const rk_kv_params *pp, int64_t n_ctx, rk_backend *be, int n_threads,
                       char *warning, size_t warning_cap, rk_kv **out, rk_err *err) {
    const rk_hparams *hp = rk_model_hparams(m);
    if (warning && warning_cap) warning[0] = '\0';
    if ((unsigned)pp->kind > RK_KV_KIND_LAST)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: KV policy %d unknown", (int)pp->kind);
    /* a backend with its own memory (cuda): host caches go behind kv_stage.c */
    const bool dev = be && be->ops->mem_alloc;
    rk_kv_params q = *pp;
    const rk_kv_params *p = &q;
    if (q.kind == RK_KV_LOWRAM) {
        /* LowRAM's residuals when unset: int4 on the CPU (fewer bytes at the same KL,
         * docs/LOWRAM.md), int8 on a device, whose fused decode op reads int8 residuals */
        if (q.lowram.resid_type == RK_DT_F32) q.lowram.resid_type = dev ? RK_DT_Q8_0 : RK_DT_Q4_0;
        /* pinned chunks when unset: 4 on the CPU; none on a device, whose fused op selects by landmarks */
        if (q.lowram.mass_pin < 0) q.lowram.mass_pin = dev ? 0 : 4;
        /* full layers likewise: the fused op takes one chunk count for every layer */
        if (q.lowram.full_layers < 0) q.lowram.full_layers = dev ? 0 : 2;
    }
    if (n_ctx <= 0) return rk_err_set(err, RK_E_INVALID_ARG, "kv: n_ctx %lld", (long long)n_ctx);
    rk_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    kv->kind = p->kind;
    kv->n_layer = hp->n_layer, kv->n_head = hp->n_head, kv->n_head_kv = hp->n_head_kv, kv->head_dim = hp->head_dim;
    kv->kv_dim = hp->n_head_kv * hp->head_dim;
    kv->n_rot = hp->n_rot, kv->rope_mode = hp->rope_mode, kv->rope_base = hp->rope_base;
    kv->n_ctx = n_ctx;
    kv->be = be;
    rk_rope_params rp;
    rk_model_rope_params(m, 0, &rp);
    kv->rope_freq = malloc((size_t)(kv->n_rot / 2 + 1) * sizeof(double));
    if (!kv->rope_freq) {
        free(kv);
        return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    }
    rk_rope_freqs(&rp, kv->rope_freq);
    kv->rope_mscale = rk_rope_mscale(&rp);
    kv->rope = rp;
    rk_status st;
    const uint32_t dt = p->kind == RK_KV_F32 ? RK_DT_F32 : RK_DT_F16; /* GPU KV tiers (kv_dev.c) */
    if ((p->kind == RK_KV_F16 || p->kind == RK_KV_F32) && rk_kv_dev_takes(kv, dt, p)) {
        st = rk_kv_dev_init(kv, dt, p, err);
        goto made;
    }
    switch (p->kind) {
    case RK_KV_F16:
        st = p->budget ? rk_kv_tier_init(kv, RK_DT_F16, p, err) : rk_kv_plain_init(kv, RK_DT_F16, err);
        break;
    case RK_KV_F32:
        st = p->budget ? rk_kv_tier_init(kv, RK_DT_F32, p, err) : rk_kv_plain_init(kv, RK_DT_F32, err);
        break;
    case RK_KV_Q8: st = p->budget ? rk_kv_tier_init(kv, RK_DT_Q8_0, p, err) : rk_kv_q8_init(kv, err); break;
    case RK_KV_Q4:
        st = p->budget
                 ? rk_err_set(err, RK_E_INVALID_ARG,
                              "kv: q4 has no memory tiers (--kv-budget): use f16, f32, q8 or lowram with a budget")
                 : rk_kv_q4_init(kv, err);
        break;
    default:
        st = p->budget ? rk_kv_lowram_tier_init(kv, m, p, n_threads, warning, warning_cap, err)
                       : rk_kv_lowram_init(kv, m, &p->lowram, n_threads, warning, warning_cap, err);
        break;
    }
made:
    if (!st && dev && kv->ops->mem == RK_KV_MEM_HOST) st = rk_kv_stage_wrap(&kv, p->kind == RK_KV_LOWRAM, err);
    if (st) {
        rk_kv_destroy(kv);
        return st;
    }
    *out = kv;
    return RK_OK;
}

void rk_kv_destroy(rk_kv *kv) {
    if (!kv) return;
    if (kv->ops) kv->ops->destroy(kv);
    free(kv->rope_freq);
    free(kv);
}

rk_status rk_kv_pool_create(rk_backend *be, int n_threads, rk_pool **pool, bool *owned, int *n_out, rk_err *err) {
    *pool = NULL;
    *owned = false;
    int n = n_threads > 0 ? n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    /* one thread pool per process: the cpu backend's, when it has the threads asked for */
    rk_pool *bp = be ? rk_backend_pool(be) : NULL;
    if (bp && rk_pool_size(bp) == n) {
        *pool = bp;
        *n_out = n;
        return RK_OK;
    }
    if (n > 1) {
        rk_status st = rk_pool_create(n, pool, err);
        if (st) return st;
        *owned = true;
        n = rk_pool_size(*pool);
    }
    *n_out = n;
    return RK_OK;
}

void rk_kv_unrope(const rk_kv *kv, float *x, int64_t p) {
    const int half = kv->n_rot / 2;
    for (int h = 0; h < kv->n_head_kv; h++) {
        float *y = x + (size_t)h * kv->head_dim;
        for (int j = 0; j < half; j++) {
            const double th = (double)p * kv->rope_freq[j];
            const float co = (float)(cos(th) / kv->rope_mscale), si = -(float)(sin(th) / kv->rope_mscale);
            const int i0 = kv->rope_mode == RK_ROPE_NEOX ? j : 2 * j;
            const int i1 = kv->rope_mode == RK_ROPE_NEOX ? j + half : 2 * j + 1;
            const float x0 = y[i0], x1 = y[i1];
            y[i0] = x0 * co - x1 * si;
            y[i1] = x0 * si + x1 * co;
        }
    }
}

void rk_kv_rows_to_f32(uint32_t type, const void *src, int64_t n, int64_t kv_dim, float *dst) {
    if (type == RK_DT_F32) memcpy(dst, src, (size_t)(n * kv_dim) * sizeof(float));
    else rk_quant_fast(RK_DT_F16)->to_f32(src, dst, n * kv_dim);
}

void rk_kv_rows_from_f32(uint32_t type, const float *src, int64_t n, int64_t kv_dim, void *dst) {
    if (type == RK_DT_F32) {
        memcpy(dst, src, (size_t)(n * kv_dim) * sizeof(float));
        return;
    }
    uint16_t *d = dst;
    for (int64_t i = 0; i < n * kv_dim; i++) d[i] = rk_f32_to_f16(src[i]);
}

void rk_kv_bytes_base(const rk_kv *kv, rk_kv_bytes *o) {
    memset(o, 0, sizeof *o);
    o->n_tokens = kv->n_past;
    o->f16_equiv = (uint64_t)kv->n_past * 2ull * (uint64_t)kv->n_layer * (uint64_t)kv->kv_dim * 2ull;
}

rk_status rk_kv_check_rows(const rk_kv *kv, int layer, int64_t row0, int64_t n, int64_t held, rk_err *err) {
    if (layer < 0 || layer >= kv->n_layer || row0 < 0 || n < 0 || row0 > held || n > held - row0)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: rows [%lld, %lld) of layer %d outside [0, %lld) x %d layers",
                          (long long)row0, (long long)row0 + (long long)n, layer, (long long)held, kv->n_layer);
    return RK_OK;
}

/* ---- byte buffers ---------------------------------------------------------------------- */

void rk_kv_flush(rk_kv_buf *b) {
    if (b->sink && !b->fail && b->n) b->sink(b->ctx, b->p, b->n);
    if (b->sink) b->n = 0;
}

void rk_kv_put(rk_kv_buf *b, const void *src, size_t n) {
    if (b->fail || n == 0) return;
    b->total += n;
    if (b->dry) return;
    if (b->sink) {
        if (n > b->cap - b->n) rk_kv_flush(b);
        if (n >= b->cap) {
            b->sink(b->ctx, src, n);
            return;
        }
        memcpy(b->p + b->n, src, n);
        b->n += n;
        return;
    }
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->fail = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->fail = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

void rk_kv_put_u32(rk_kv_buf *b, uint32_t v) {
    uint8_t t[4];
    for (int i = 0; i < 4; i++) t[i] = (uint8_t)(v >> (8 * i));
    rk_kv_put(b, t, 4);
}

void rk_kv_put_u64(rk_kv_buf *b, uint64_t v) {
    uint8_t t[8];
    for (int i = 0; i < 8; i++) t[i] = (uint8_t)(v >> (8 * i));
    rk_kv_put(b, t, 8);
}

void rk_kv_put_f64(rk_kv_buf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    rk_kv_put_u64(b, u);
}

const uint8_t *rk_kv_get(rk_kv_rd *r, size_t n) {
    if (r->fail || r->off > r->n || n > r->n - r->off) {
        r->fail = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

const uint8_t *rk_kv_get_n(rk_kv_rd *r, uint64_t count, size_t size) {
    uint64_t b;
    if (!rk_mul_u64(count, size, &b) || b > SIZE_MAX) {
        r->fail = true;
        return NULL;
    }
    return rk_kv_get(r, (size_t)b);
}

uint32_t rk_kv_get_u32(rk_kv_rd *r) {
    const uint8_t *p = rk_kv_get(r, 4);
    uint32_t v = 0;
    for (int i = 0; p && i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

uint64_t rk_kv_get_u64(rk_kv_rd *r) {
    const uint8_t *p = rk_kv_get(r, 8);
    uint64_t v = 0;
    for (int i = 0; p && i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

double rk_kv_get_f64(rk_kv_rd *r) {
    uint64_t u = rk_kv_get_u64(r);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

/* ---- row caches ------------------------------------------------------------------------- */

rk_status rk_kv_rows_commit(rk_kv *kv, int64_t n_past, rk_err *err) {
    (void)err;
    kv->n_past = n_past;
    return RK_OK;
}

/* rows past n are overwritten by the next append before anything reads them */
void rk_kv_rows_truncate(rk_kv *kv, int64_t n) {
    if (n < kv->n_past) kv->n_past = n;
}

void rk_kv_rows_reset(rk_kv *kv) { kv->n_past = 0; }

rk_op_args rk_kv_attn_args(const rk_kv *kv, const float *q, int64_t n_q, int64_t pos0, float *out) {
    const int64_t qd = (int64_t)kv->n_head * kv->head_dim;
    rk_op_args at = {.op = RK_OP_ATTN};
    at.src0 = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * sizeof(float), (void *)q};
    at.dst = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * sizeof(float), out};
    at.attn.n_head = kv->n_head;
    at.attn.n_head_kv = kv->n_head_kv;
    at.attn.head_dim = kv->head_dim;
    at.attn.scale = 1.0f / sqrtf((float)kv->head_dim);
    at.attn.pos0 = pos0;
    at.attn_sparse = kv->attn_sparse;
    return at;
}

void rk_kv_rows_export(const rk_kv *kv, uint8_t *const *k, uint8_t *const *v, int64_t row0, int64_t row1,
                       rk_kv_buf *out) {
    const size_t off = (size_t)row0 * kv->row_bytes, len = (size_t)(row1 - row0) * kv->row_bytes;
    for (int l = 0; l < kv->n_layer; l++) {
        rk_kv_put(out, k[l] + off, len);
        rk_kv_put(out, v[l] + off, len);
    }
}

uint64_t rk_kv_rows_export_bytes(const rk_kv *kv, int64_t row0, int64_t row1) {
    return 2ull * (uint64_t)kv->n_layer * (uint64_t)(row1 - row0) * (uint64_t)kv->row_bytes;
}

rk_status rk_kv_rows_import(rk_kv *kv, uint8_t *const *k, uint8_t *const *v, int64_t row0, int64_t n_rows,
                            const uint8_t *p, size_t n, const char *what,
                            rk_status (*check)(const uint8_t *p, size_t n, rk_err *err), rk_err *err) {
    uint64_t want;
    if (!rk_mul_u64((uint64_t)n_rows, kv->row_bytes, &want) || !rk_mul_u64(want, 2ull * (uint64_t)kv->n_layer, &want) ||
        want != n)
        return rk_err_set(err, RK_E_FORMAT, "kv: %s payload of %zu bytes for %lld rows (expected %llu)", what, n,
                          (long long)n_rows, (unsigned long long)want);
    rk_status st = check ? check(p, n, err) : RK_OK;
    if (st) return st;
    const size_t off = (size_t)row0 * kv->row_bytes, len = (size_t)n_rows * kv->row_bytes;
    for (int l = 0; l < kv->n_layer; l++) {
        memcpy(k[l] + off, p + (size_t)(2 * l) * len, len);
        memcpy(v[l] + off, p + (size_t)(2 * l + 1) * len, len);
    }
    kv->n_past = row0 + n_rows;
    return RK_OK;
}
