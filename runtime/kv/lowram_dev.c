/* LowRAM on a device backend (docs/GPU.md): a device copy of the codec's decode-time state
 * and the fused decode attention RK_OP_LR_ATTN over it.
 *
 * The codec (runtime/kv/lowram*.c) stays the owner of the state: it fits and compresses on
 * the host at commit time, exactly as on the CPU (the fit is an eigendecomposition and
 * Cholesky solves once per prompt: off the decode path). This file mirrors what decode
 * reads: per group the basis, mean, 1/s, positions, int8 coefficient rows and chunk mean
 * coefficients; per layer W, b, landmarks, the sinks and a ring of the exact window rows;
 * per (layer, KV head) the int8 residuals with their masks and bases. Uploads are deltas:
 * after a commit only the rows / chunks / residual slots past what the device holds (the
 * last, partial chunk's landmark and mean again); a truncation, reset or import drops the
 * device copy and the next sync uploads it whole. Window rows that a decode step appends go
 * into the ring with CPY_ROWS from the step's own K / V (device to device); rows appended
 * by host-path evals (prefill) are uploaded at the next sync.
 *
 * The fused path takes an attention when the codec is fitted, the eval has at most
 * LR_SPARSE_MAX_Q rows and the options are the ones the op implements (int8 coefficients
 * and residuals, f16 exact rows and bases, the fixed-budget one-level selection: topp 0, no
 * bound, no coarse, krank, hyst, keys_only, dense, and no memory tier); otherwise the host staging of kv_stage.c
 * runs the codec's own attention (correct, slower). In a fused step the K / V rows go to the
 * ring and to a small pending buffer on the device (no transfer inside the step); after the
 * step (rk_lrdev_flush, before the commit) one download brings every layer's rows to the
 * host codec, which compresses them at later commits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"

typedef struct lrd_group {
    int r;
    void *basis, *mean, *winv, *pos, *coef, *cmean; /* device blocks */
    int64_t up_rows;                                /* stored rows on the device */
} lrd_group;

typedef struct lrd_layer {
    void *W, *b, *lmk, *sk, *sv, *xk, *xv, *res, *mask, *base;
    int64_t ring_hi; /* exact positions [ring_hi - x_cap, ring_hi) valid in the ring */
    int64_t *up_res; /* (n_head_kv) residual slots on the device */
} lrd_layer;

struct rk_lrdev {
    rk_kv *kv; /* the LowRAM cache (borrowed) */
    rk_kv_codec *c;
    rk_backend *be;
    bool ok_params; /* the codec's options are the op's */
    bool built;     /* device buffers exist for the current fit */
    bool dirty;     /* the codec changed since the last sync */
    int64_t x_cap;
    void *freq;
    void *pend;   /* (n_layer, 2, LR_SPARSE_MAX_Q, kv_dim) f32: the step's K / V rows for the host codec */
    float *hpend; /* host copy */
    int64_t *pend_pos, *pend_n; /* (n_layer) rows pending per layer (n 0: none) */
    bool any_pend;
    lrd_group *g;
    lrd_layer *ly;
};

static bool params_ok(const rk_kv_codec *c) {
    const rk_lowram_params *p = &c->p;
    return !c->wide && p->coef_type == RK_DT_Q8_0 && p->resid_type == RK_DT_Q8_0 && c->exact_type == RK_DT_F16 &&
           !(p->topp > 0) && !p->bound && p->coarse <= 1 && (p->key_rank <= 0) && !(p->hyst > 0) && !p->values_exact &&
           !p->dense && p->mass_pin <= 0 && /* pinned chunks: the host path */
           !(p->early_budget > 0 && p->early_l0 < p->early_l1) && p->full_layers <= 0 && /* one budget per session */
           c->hd <= 128 && c->n_rot <= c->hd &&
           /* the op rounds its rebuilt keys as either key cache holds them (key_int8) */
           (p->kc_type == RK_DT_F16 || p->kc_type == RK_DT_Q8_0);
}

static void free_state(rk_lrdev *d) {
    rk_backend *be = d->be;
    if (d->g)
        for (int i = 0; i < d->c->n_group; i++) {
            lrd_group *G = &d->g[i];
            rk_backend_free(be, G->basis), rk_backend_free(be, G->mean), rk_backend_free(be, G->winv);
            rk_backend_free(be, G->pos), rk_backend_free(be, G->coef), rk_backend_free(be, G->cmean);
        }
    if (d->ly)
        for (int l = 0; l < d->c->n_layer; l++) {
            lrd_layer *L = &d->ly[l];
            void *bl[] = {L->W, L->b, L->lmk, L->sk, L->sv, L->xk, L->xv, L->res, L->mask, L->base};
            for (size_t k = 0; k < sizeof bl / sizeof bl[0]; k++) rk_backend_free(be, bl[k]);
            free(L->up_res);
        }
    free(d->g), free(d->ly);
    d->g = NULL, d->ly = NULL;
    d->built = false;
}

rk_status rk_lrdev_create(rk_kv *kv, rk_lrdev **out, rk_err *err) {
    *out = NULL;
    rk_lrdev *d = calloc(1, sizeof *d);
    if (!d) return rk_err_set(err, RK_E_NOMEM, "lowram: device state");
    d->kv = kv, d->c = kv->impl, d->be = kv->be, d->dirty = true;
    d->ok_params = params_ok(d->c);
    d->x_cap = d->c->p.window + 2 * (int64_t)d->c->p.chunk + 2 * LR_SPARSE_MAX_Q;
    *out = d;
    return RK_OK;
}

void rk_lrdev_destroy(rk_lrdev *d) {
    if (!d) return;
    free_state(d);
    rk_backend_free(d->be, d->freq);
    rk_backend_free(d->be, d->pend);
    free(d->hpend), free(d->pend_pos), free(d->pend_n);
    free(d);
}

void rk_lrdev_changed(rk_lrdev *d, bool rows_dropped) {
    if (!d) return;
    d->dirty = true;
    if (rows_dropped) { /* truncation / reset / import / a failed eval: the next sync uploads everything */
        free_state(d);
        if (d->pend_n) memset(d->pend_n, 0, (size_t)d->c->n_layer * sizeof(int64_t));
        d->any_pend = false;
    }
}

static rk_status dalloc(rk_lrdev *d, size_t bytes, void **p, rk_err *err) {
    return rk_backend_alloc(d->be, bytes, p, err);
}
static rk_status up(rk_lrdev *d, void *dst, size_t off, const void *src, size_t bytes, rk_err *err) {
    if (!bytes) return RK_OK;
    return rk_backend_upload(d->be, (uint8_t *)dst + off, src, bytes, err);
}

/* Device buffers for the codec's current fit (ranks known), constants uploaded. */
static rk_status build(rk_lrdev *d, rk_err *err) {
    rk_kv_codec *c = d->c;
    rk_status st = lr_cmean_need(c, err); /* LR_ATTN sums the unselected chunks' mean coefficients */
    if (st) return st;
    const size_t kvd = (size_t)c->kvd, C = (size_t)c->p.chunk, chunks = (size_t)c->cap_chunks, rows = (size_t)c->n_ctx;
    d->g = calloc((size_t)c->n_group, sizeof *d->g);
    d->ly = calloc((size_t)c->n_layer, sizeof *d->ly);
    if (!d->g || !d->ly) return rk_err_set(err, RK_E_NOMEM, "lowram: device state");
    const size_t pend_f = (size_t)c->n_layer * 2 * LR_SPARSE_MAX_Q * kvd;
    if (!d->pend) {
        d->hpend = malloc(pend_f * sizeof(float));
        d->pend_pos = calloc((size_t)c->n_layer, sizeof(int64_t));
        d->pend_n = calloc((size_t)c->n_layer, sizeof(int64_t));
        if (!d->hpend || !d->pend_pos || !d->pend_n) return rk_err_set(err, RK_E_NOMEM, "lowram: device state");
        if ((st = dalloc(d, pend_f * sizeof(float), &d->pend, err))) return st;
    }
    if (!d->freq) {
        if ((st = dalloc(d, (size_t)(c->n_rot / 2) * sizeof(double), &d->freq, err)) ||
            (st = up(d, d->freq, 0, c->freq, (size_t)(c->n_rot / 2) * sizeof(double), err)))
            return st;
    }
    for (int i = 0; i < c->n_group; i++) {
        const lr_group *g = &c->g[i];
        lrd_group *G = &d->g[i];
        G->r = g->r;
        const size_t D = (size_t)g->D, r = (size_t)g->r;
        if ((st = dalloc(d, r * D * 2, &G->basis, err)) || (st = dalloc(d, D * 4, &G->mean, err)) ||
            (st = dalloc(d, D * 4, &G->winv, err)) || (st = dalloc(d, rows * 4, &G->pos, err)) ||
            (st = dalloc(d, rows * g->coef_bytes, &G->coef, err)) || (st = dalloc(d, chunks * r * 2, &G->cmean, err)))
            return st;
        if ((st = up(d, G->basis, 0, g->basis, r * D * 2, err)) || (st = up(d, G->mean, 0, g->mean, D * 4, err)) ||
            (st = up(d, G->winv, 0, g->winv, D * 4, err)))
            return st;
    }
    const size_t sink = (size_t)c->p.n_sink;
    for (int l = 0; l < c->n_layer; l++) {
        const lr_layer *L = &c->ly[l];
        lrd_layer *X = &d->ly[l];
        const size_t r = (size_t)c->g[L->grp].r;
        X->up_res = calloc((size_t)c->n_head_kv, sizeof(int64_t));
        if (!X->up_res) return rk_err_set(err, RK_E_NOMEM, "lowram: device state");
        const size_t res_h = rows * c->res_bytes, mb_h = chunks * 4;
        if ((st = dalloc(d, r * kvd * 2, &X->W, err)) || (st = dalloc(d, kvd * 4, &X->b, err)) ||
            (st = dalloc(d, chunks * kvd * 2, &X->lmk, err)) ||
            (st = dalloc(d, (sink ? sink : 1) * kvd * 2, &X->sk, err)) ||
            (st = dalloc(d, (sink ? sink : 1) * kvd * 2, &X->sv, err)) ||
            (st = dalloc(d, (size_t)d->x_cap * kvd * 2, &X->xk, err)) ||
            (st = dalloc(d, (size_t)d->x_cap * kvd * 2, &X->xv, err)) ||
            (st = dalloc(d, (size_t)c->n_head_kv * res_h, &X->res, err)) ||
            (st = dalloc(d, (size_t)c->n_head_kv * mb_h, &X->mask, err)) ||
            (st = dalloc(d, (size_t)c->n_head_kv * mb_h, &X->base, err)))
            return st;
        /* the host stores the value-rank rows of W only; LR_ATTN reads r rows: the rest are 0 */
        const size_t rv = (size_t)lr_vr(c, &c->g[L->grp]);
        if ((st = up(d, X->W, 0, L->W, rv * kvd * 2, err)) || (st = up(d, X->b, 0, L->b, kvd * 4, err))) return st;
        if (rv < r) {
            void *z = calloc((r - rv) * kvd, 2);
            if (!z) return rk_err_set(err, RK_E_NOMEM, "lowram: device state");
            st = up(d, X->W, rv * kvd * 2, z, (r - rv) * kvd * 2, err);
            free(z);
            if (st) return st;
        }
        if (sink && ((st = up(d, X->sk, 0, c->sk[l], sink * c->xrow, err)) ||
                     (st = up(d, X->sv, 0, c->sv[l], sink * c->xrow, err))))
            return st;
        X->ring_hi = 0;
    }
    (void)C;
    d->built = true;
    return RK_OK;
}

/* Deltas since the last sync: stored rows, chunk summaries, residual slots. */
static rk_status sync_rows(rk_lrdev *d, rk_err *err) {
    rk_kv_codec *c = d->c;
    const int64_t C = c->p.chunk;
    const size_t kvd = (size_t)c->kvd;
    rk_status st;
    for (int i = 0; i < c->n_group; i++) {
        const lr_group *g = &c->g[i];
        lrd_group *G = &d->g[i];
        const int64_t r0 = G->up_rows, r1 = g->n_rows;
        if (r1 < r0) return rk_err_set(err, RK_E_INTERNAL, "lowram: device copy ahead of the codec");
        if (r1 == r0) continue;
        const int64_t ch0 = r0 / C, ch1 = (r1 + C - 1) / C; /* the partial chunk of r0 again */
        const size_t r = (size_t)g->r;
        if ((st = up(d, G->pos, (size_t)r0 * 4, g->pos + r0, (size_t)(r1 - r0) * 4, err)) ||
            (st = up(d, G->coef, (size_t)r0 * g->coef_bytes, g->coef + (size_t)r0 * g->coef_bytes,
                     (size_t)(r1 - r0) * g->coef_bytes, err)) ||
            (st = up(d, G->cmean, (size_t)ch0 * r * 2, g->cmean + (size_t)ch0 * r, (size_t)(ch1 - ch0) * r * 2, err)))
            return st;
        for (int li = 0; li < g->n_l; li++) {
            const int l = g->l0 + li;
            const lr_layer *L = &c->ly[l];
            lrd_layer *X = &d->ly[l];
            if ((st = up(d, X->lmk, (size_t)ch0 * kvd * 2, L->lmk + (size_t)ch0 * kvd, (size_t)(ch1 - ch0) * kvd * 2,
                         err)))
                return st;
            for (int h = 0; h < c->n_head_kv; h++) {
                const lr_head *H = &L->h[h];
                const size_t res_h = (size_t)c->n_ctx * c->res_bytes, mb_h = (size_t)c->cap_chunks * 4;
                const int64_t s0 = X->up_res[h], s1 = H->n_res;
                if ((st = up(d, X->res, h * res_h + (size_t)s0 * c->res_bytes, H->res + (size_t)s0 * c->res_bytes,
                             (size_t)(s1 - s0) * c->res_bytes, err)) ||
                    (st = up(d, X->mask, h * mb_h + (size_t)ch0 * 4, H->mask + ch0, (size_t)(ch1 - ch0) * 4, err)) ||
                    (st = up(d, X->base, h * mb_h + (size_t)ch0 * 4, H->base + ch0, (size_t)(ch1 - ch0) * 4, err)))
                    return st;
                X->up_res[h] = s1;
            }
        }
        G->up_rows = r1;
    }
    return RK_OK;
}

/* The ring of layer l holds exact positions [comp_end, hi): uploads what it lacks. */
static rk_status sync_ring(rk_lrdev *d, int l, int64_t hi, rk_err *err) {
    rk_kv_codec *c = d->c;
    lrd_layer *X = &d->ly[l];
    const int64_t lo = c->comp_end;
    if (X->ring_hi < lo || X->ring_hi - d->x_cap > lo || X->ring_hi > hi) X->ring_hi = lo;
    for (int64_t p = X->ring_hi; p < hi;) {
        const int64_t row = p % d->x_cap, n = hi - p < d->x_cap - row ? hi - p : d->x_cap - row;
        rk_status st;
        if ((st = up(d, X->xk, (size_t)row * c->xrow, lr_exact_ptr(c, l, false, p), (size_t)n * c->xrow, err)) ||
            (st = up(d, X->xv, (size_t)row * c->xrow, lr_exact_ptr(c, l, true, p), (size_t)n * c->xrow, err)))
            return st;
        p += n;
    }
    X->ring_hi = hi;
    return RK_OK;
}

bool rk_lrdev_takes(const rk_lrdev *d, int64_t n_q, int64_t pos0) {
    if (!d || !d->ok_params || !d->c->fitted || d->c->tier || n_q > LR_SPARSE_MAX_Q) return false;
    const int grp = d->c->n_head / d->c->n_head_kv;
    if (n_q * grp > RK_LR_ATTN_MAX_STATE) return false;
    if (pos0 + n_q - d->c->comp_end > d->x_cap || d->c->comp_end < d->c->p.n_sink) return false;
    /* the backend's limits (cuda: shared memory of the state rows) for the largest rank */
    const rk_kv_codec *c = d->c;
    const int64_t qd = (int64_t)c->n_head * c->hd;
    rk_lr_attn_args L = {.chunk = c->p.chunk, .r = c->r_max};
    rk_op_args a = {.op = RK_OP_LR_ATTN, .lr = &L};
    a.src0 = a.dst = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * 4, NULL};
    a.attn = (rk_attn_params){c->n_head, c->n_head_kv, c->hd, 1.0f, pos0};
    return d->be->ops->op[RK_OP_LR_ATTN] && (!d->be->ops->supports || d->be->ops->supports(d->be, &a));
}

static rk_status ready(rk_lrdev *d, rk_err *err) {
    rk_status st;
    if (!d->built && (st = build(d, err))) {
        free_state(d);
        return st;
    }
    if (d->dirty) {
        if ((st = sync_rows(d, err))) return st;
        d->dirty = false;
    }
    return RK_OK;
}

static rk_status cpy_rows(rk_lrdev *d, const float *src, int64_t n, uint32_t type, void *dst, int64_t cap, int64_t row0,
                          rk_err *err) {
    const int64_t kvd = d->c->kvd;
    rk_op_args a = {.op = RK_OP_CPY_ROWS, .dst_row0 = row0};
    a.src0 = (rk_view){RK_DT_F32, {kvd, n, 1, 1}, (size_t)kvd * 4, (void *)src};
    a.dst = (rk_view){type, {kvd, cap, 1, 1}, (size_t)kvd * (type == RK_DT_F16 ? 2 : 4), dst};
    return rk_backend_run(d->be, &a, err);
}

/* A fused step's rows [pos0, pos0 + n) of layer l (device K / V): into the ring and into
 * the pending buffer; the host codec gets them at rk_lrdev_flush. */
rk_status rk_lrdev_append(rk_lrdev *d, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    rk_status st;
    if ((st = ready(d, err)) || (st = sync_ring(d, l, pos0, err))) return st;
    lrd_layer *X = &d->ly[l];
    const int64_t kvd = d->c->kvd;
    for (int64_t i = 0; i < n;) {
        const int64_t row = (pos0 + i) % d->x_cap, m = n - i < d->x_cap - row ? n - i : d->x_cap - row;
        if ((st = cpy_rows(d, k + i * kvd, m, RK_DT_F16, X->xk, d->x_cap, row, err)) ||
            (st = cpy_rows(d, v + i * kvd, m, RK_DT_F16, X->xv, d->x_cap, row, err)))
            return st;
        i += m;
    }
    const int64_t slot = (int64_t)l * 2 * LR_SPARSE_MAX_Q;
    if ((st = cpy_rows(d, k, n, RK_DT_F32, d->pend, (int64_t)d->c->n_layer * 2 * LR_SPARSE_MAX_Q, slot, err)) ||
        (st = cpy_rows(d, v, n, RK_DT_F32, d->pend, (int64_t)d->c->n_layer * 2 * LR_SPARSE_MAX_Q,
                       slot + LR_SPARSE_MAX_Q, err)))
        return st;
    X->ring_hi = pos0 + n;
    d->pend_pos[l] = pos0, d->pend_n[l] = n, d->any_pend = true;
    return RK_OK;
}

/* After a fused step: one download of every layer's pending rows, appended to the host codec. */
rk_status rk_lrdev_flush(rk_lrdev *d, rk_err *err) {
    if (!d || !d->any_pend) return RK_OK;
    rk_kv_codec *c = d->c;
    const size_t kvd = (size_t)c->kvd, bytes = (size_t)c->n_layer * 2 * LR_SPARSE_MAX_Q * kvd * sizeof(float);
    d->any_pend = false;
    rk_status st = rk_backend_download(d->be, d->hpend, d->pend, bytes, err);
    for (int l = 0; !st && l < c->n_layer; l++) {
        if (!d->pend_n[l]) continue;
        const float *k = d->hpend + (size_t)l * 2 * LR_SPARSE_MAX_Q * kvd, *v = k + LR_SPARSE_MAX_Q * kvd;
        st = d->kv->ops->append(d->kv, l, d->pend_pos[l], k, v, d->pend_n[l], err);
        d->pend_n[l] = 0;
    }
    for (int l = 0; l < c->n_layer; l++) d->pend_n[l] = 0;
    return st;
}

rk_status rk_lrdev_attend(rk_lrdev *d, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    rk_kv_codec *c = d->c;
    rk_status st;
    if ((st = ready(d, err)) || (st = sync_ring(d, l, pos0 + n_q, err))) return st;
    const lr_layer *L = &c->ly[l];
    const lr_group *g = &c->g[L->grp];
    const lrd_group *G = &d->g[L->grp];
    const lrd_layer *X = &d->ly[l];
    const size_t kvd = (size_t)c->kvd, off = (size_t)L->li * kvd;
    rk_lr_attn_args A = {0};
    A.chunk = c->p.chunk, A.r = g->r, A.n_sel = (int)lr_n_sel(c, l);
    A.summaries = !c->p.no_summary;
    A.key_int8 = c->p.kc_type == RK_DT_Q8_0;
    A.n_rot = c->n_rot, A.rope_mode = c->rope_mode, A.freq = d->freq;
    A.n_sink = c->p.n_sink, A.x_lo = c->comp_end, A.x_cap = d->x_cap, A.n_rows = g->n_rows;
    A.sk = X->sk, A.sv = X->sv, A.xk = X->xk, A.xv = X->xv;
    A.pos = G->pos, A.coef = G->coef, A.coef_bytes = g->coef_bytes;
    A.basis = (const uint16_t *)G->basis + off, A.ldb = g->D;
    A.mean = (const float *)G->mean + off, A.winv = (const float *)G->winv + off;
    A.lmk = X->lmk, A.cmean = G->cmean, A.W = X->W, A.b = X->b;
    A.res = X->res, A.res_bytes = c->res_bytes, A.res_hstride = (size_t)c->n_ctx * c->res_bytes;
    A.mask = X->mask, A.base = X->base, A.mb_hstride = c->cap_chunks;
    const int64_t qd = (int64_t)c->n_head * c->hd;
    rk_op_args a = {.op = RK_OP_LR_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * 4, (void *)q};
    a.dst = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * 4, out};
    a.attn = (rk_attn_params){c->n_head, c->n_head_kv, c->hd, 1.0f / sqrtf((float)c->hd), pos0};
    a.lr = &A;
    return rk_backend_run(d->be, &a, err);
}
