/* GPU KV tiers (issue 14 item 3; docs/GPU.md "KV tiers on the device"): f16 / f32 rows
 * under --kv-budget on a backend with memory of its own (cuda).
 *
 * Every layer's K and V are (n_ctx, kv_dim) arrays, as in the plain cache. The budget buys
 * whole layers of device memory (a layer = its K and V arrays at n_ctx rows): the first
 * n_res layers stay in device memory (resident, used in place like the plain cache); the
 * other, cold, layers keep their rows in pinned host blocks (rk_backend_host_alloc:
 * cudaHostAlloc) and share two device staging slots of one layer each, so the device holds
 * n_res + 2 layers at most: n_res = budget / layer bytes - 2.
 * - append of a cold layer: its slot is made to hold the layer (the rows [0, held) uploaded
 *   on the copy lane unless the slot holds them already, then joined: the compute stream
 *   waits for the lane, no host sync), CPY_ROWS writes the new rows into the slot, and a lane
 *   copy brings them down to the host block (ordered after the CPY_ROWS).
 * - prefetch: right after a cold layer's slot is joined, the next cold layer's rows (the
 *   layers in order, wrapping to the first for the next chunk or decode step) go up into
 *   the other slot on the lane, behind every op queued so far (the attention that last read
 *   that slot included), so the copy runs beside this layer's attention and FFN and the next
 *   layer's projections.
 * - attention of a cold layer: the backend's ATTN on its slot (the same arrays, the same
 *   kernel and the same rows as the plain cache: bit-identical results).
 * - read / export (host side): resident rows through downloads, cold rows from the host
 *   block after a lane sync; write / import: resident rows through uploads, cold rows into
 *   the host block (a slot holding the layer is dropped).
 * With two or fewer cold layers the slots hold them for good and nothing moves after the
 * first pass. What is not built: the disk step (the cold rows stay in pinned host memory;
 * kv_tier.c's block store takes host-side budgets on the host path only), chunk-granular
 * device residency and, for LowRAM, moving only the selected chunks.
 * A budget below two layers (no room for the slots) takes the host tier (kv_tier.c) with
 * staged attention, as before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_impl.h"

typedef struct devtier {
    uint32_t type;       /* RK_DT_F16 or RK_DT_F32 */
    int n_res, n_cold;   /* layers [0, n_res) resident, [n_res, n_layer) cold */
    size_t arr_bytes;    /* one K (or V) array: n_ctx rows */
    uint8_t **k, **v;    /* (n_layer) resident: device arrays; cold: pinned host blocks */
    uint8_t *sk[2], *sv[2]; /* staging slots (device) */
    int slot_layer[2];   /* the cold layer a slot holds (rows [0, held) valid once joined), -1 none */
    bool slot_pending[2]; /* a lane upload into the slot is queued and not joined yet */
    bool slot_ahead[2];  /* that upload was a prefetch (queued before its layer came) */
    int cur;             /* the slot of the layer being computed, -1 none */
    int64_t *held;       /* (n_layer) rows appended */
    rk_kv_tier_stats st;
} devtier;

static rk_view cache_view(const rk_kv *kv, uint32_t type, void *data, int64_t rows) {
    rk_view v = {type, {kv->kv_dim, rows, 1, 1}, kv->row_bytes, data};
    return v;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The host waits for the lane (before the host touches a cold block). */
static rk_status lane_sync(rk_kv *kv, rk_err *err) {
    devtier *c = kv->impl;
    const double t0 = now_s();
    rk_status st = rk_backend_lane_sync(kv->be, err);
    c->st.stall_s += now_s() - t0;
    return st;
}

static bool cold(const devtier *c, int l) { return l >= c->n_res; }

/* Queues the upload of cold layer l's held rows into slot s on the lane. */
static rk_status fill_slot(rk_kv *kv, int s, int l, bool ahead, rk_err *err) {
    devtier *c = kv->impl;
    const size_t bytes = (size_t)c->held[l] * kv->row_bytes;
    rk_status st = rk_backend_lane_copy(kv->be, c->sk[s], c->k[l], bytes, true, err);
    if (!st) st = rk_backend_lane_copy(kv->be, c->sv[s], c->v[l], bytes, true, err);
    c->slot_layer[s] = st ? -1 : l; /* a failed copy leaves the slot unknown */
    c->slot_pending[s] = !st;
    c->slot_ahead[s] = ahead;
    if (!st) c->st.bytes_read += 2 * bytes, c->st.bytes_read_stored += 2 * bytes;
    return st;
}

/* Makes a slot hold cold layer l for the ops queued next; returns it in *out. Then
 * prefetches the next cold layer into the other slot. */
static rk_status use_slot(rk_kv *kv, int l, bool count, int *out, rk_err *err) {
    devtier *c = kv->impl;
    int s = c->slot_layer[0] == l ? 0 : c->slot_layer[1] == l ? 1 : -1;
    rk_status st = RK_OK;
    if (s < 0) { /* not prefetched: the slot not in use by the layer before */
        s = c->cur == 0 ? 1 : 0;
        if ((st = fill_slot(kv, s, l, false, err))) return st;
    }
    if (c->slot_pending[s]) {
        if ((st = rk_backend_lane_join(kv->be, err))) return st;
        if (count) c->st.misses++, c->st.prefetched += c->slot_ahead[s];
        c->slot_pending[s] = c->slot_pending[!s] = false; /* the join covers every copy queued */
    } else if (count) {
        c->st.hits++;
    }
    c->cur = s;
    *out = s;
    if (c->n_cold > 2) { /* the next cold layer (wrapping) into the other slot, behind this one */
        const int nx = l + 1 < kv->n_layer ? l + 1 : c->n_res;
        if (c->slot_layer[!s] != nx && (st = fill_slot(kv, !s, nx, true, err))) return st;
    }
    return RK_OK;
}

static rk_status dt_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    devtier *c = kv->impl;
    if (l < 0 || l >= kv->n_layer || pos0 < 0 || n < 0 || pos0 > kv->n_ctx || n > kv->n_ctx - pos0)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: devtier: append of rows [%lld, %lld) to layer %d (holding %lld of %lld)",
                          (long long)pos0, (long long)(pos0 + n), l, (long long)(l >= 0 && l < kv->n_layer ? c->held[l] : 0),
                          (long long)kv->n_ctx);
    uint8_t *dk = c->k[l], *dv = c->v[l];
    int s = -1;
    rk_status st;
    if (cold(c, l)) {
        if ((st = use_slot(kv, l, true, &s, err))) return st;
        dk = c->sk[s], dv = c->sv[s];
    } else {
        c->st.hits++;
    }
    rk_op_args a = {.op = RK_OP_CPY_ROWS, .dst_row0 = pos0};
    a.dst = cache_view(kv, c->type, dk, kv->n_ctx);
    a.src0 = (rk_view){RK_DT_F32, {kv->kv_dim, n, 1, 1}, (size_t)kv->kv_dim * sizeof(float), (void *)k};
    if ((st = rk_backend_run(kv->be, &a, err))) return st;
    a.dst.data = dv;
    a.src0.data = (void *)v;
    if ((st = rk_backend_run(kv->be, &a, err))) return st;
    if (pos0 + n > c->held[l] || pos0 < c->held[l]) c->held[l] = pos0 + n;
    if (s >= 0) { /* the new rows down to the host block, after the CPY_ROWS */
        const size_t off = (size_t)pos0 * kv->row_bytes, bytes = (size_t)n * kv->row_bytes;
        if ((st = rk_backend_lane_copy(kv->be, c->k[l] + off, c->sk[s] + off, bytes, false, err)) ||
            (st = rk_backend_lane_copy(kv->be, c->v[l] + off, c->sv[s] + off, bytes, false, err))) {
            c->slot_layer[s] = -1;
            return st;
        }
        c->st.bytes_spilled += 2 * bytes, c->st.bytes_spilled_stored += 2 * bytes;
    }
    return RK_OK;
}

static rk_status dt_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    devtier *c = kv->impl;
    uint8_t *dk = c->k[l], *dv = c->v[l];
    if (cold(c, l)) {
        int s;
        rk_status st = use_slot(kv, l, false, &s, err); /* after its append: held already */
        if (st) return st;
        dk = c->sk[s], dv = c->sv[s];
    }
    rk_op_args at = rk_kv_attn_args(kv, q, n_q, pos0, out);
    at.src1 = cache_view(kv, c->type, dk, pos0 + n_q);
    at.src2 = cache_view(kv, c->type, dv, pos0 + n_q);
    return rk_backend_run(kv->be, &at, err);
}

static void dt_truncate(rk_kv *kv, int64_t n) {
    devtier *c = kv->impl;
    rk_kv_rows_truncate(kv, n);
    for (int l = 0; l < kv->n_layer; l++)
        if (c->held[l] > n) c->held[l] = n;
}

static void dt_reset(rk_kv *kv) {
    devtier *c = kv->impl;
    rk_kv_rows_reset(kv);
    for (int l = 0; l < kv->n_layer; l++) c->held[l] = 0;
}

/* Rows [row0, row0 + n) of layer l as stored, into tmp (host). */
static rk_status rows_out(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, uint8_t *tmp, rk_err *err) {
    devtier *c = kv->impl;
    const size_t off = (size_t)row0 * kv->row_bytes, bytes = (size_t)n * kv->row_bytes;
    const uint8_t *src = (values ? c->v[l] : c->k[l]) + off;
    if (!cold(c, l)) return rk_backend_download(kv->be, tmp, src, bytes, err);
    rk_status st = lane_sync(kv, err);
    if (!st) memcpy(tmp, src, bytes);
    return st;
}

/* The reverse: a cold layer's slot no longer holds its rows. */
static rk_status rows_in(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const uint8_t *src, rk_err *err) {
    devtier *c = kv->impl;
    const size_t off = (size_t)row0 * kv->row_bytes, bytes = (size_t)n * kv->row_bytes;
    uint8_t *dst = (values ? c->v[l] : c->k[l]) + off;
    if (!cold(c, l)) return rk_backend_upload(kv->be, dst, src, bytes, err);
    rk_status st = lane_sync(kv, err);
    if (st) return st;
    memcpy(dst, src, bytes);
    for (int s = 0; s < 2; s++)
        if (c->slot_layer[s] == l) c->slot_layer[s] = -1, c->slot_pending[s] = false;
    return RK_OK;
}

static rk_status dt_read(const rk_kv *ckv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                         rk_err *err) {
    rk_kv *kv = (rk_kv *)ckv; /* a lane sync and the stall clock: no change a caller can see */
    const devtier *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, kv->n_ctx, err);
    if (st) return st;
    uint8_t *tmp = malloc(n ? (size_t)n * kv->row_bytes : 1);
    if (!tmp) return rk_err_set(err, RK_E_NOMEM, "kv: read of %lld rows", (long long)n);
    st = rows_out(kv, l, values, row0, n, tmp, err);
    if (!st) rk_kv_rows_to_f32(c->type, tmp, n, kv->kv_dim, dst);
    free(tmp);
    if (st) return st;
    if (!values && pre_rope)
        for (int64_t i = 0; i < n; i++) rk_kv_unrope(kv, dst + i * kv->kv_dim, row0 + i);
    return RK_OK;
}

static rk_status dt_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    const devtier *c = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, kv->n_ctx, err);
    if (st) return st;
    uint8_t *tmp = malloc(n ? (size_t)n * kv->row_bytes : 1);
    if (!tmp) return rk_err_set(err, RK_E_NOMEM, "kv: write of %lld rows", (long long)n);
    rk_kv_rows_from_f32(c->type, src, n, kv->kv_dim, tmp);
    st = rows_in(kv, l, values, row0, n, tmp, err);
    free(tmp);
    return st;
}

static void dt_bytes(const rk_kv *kv, rk_kv_bytes *o) {
    rk_kv_bytes_base(kv, o);
    o->n_exact_rows = kv->n_past;
    o->exact = (uint64_t)kv->n_past * 2ull * (uint64_t)kv->n_layer * kv->row_bytes;
    o->total = o->exact;
}

static int dt_params(const rk_kv *kv, rk_kv_param *out) {
    const devtier *c = kv->impl;
    out[0] = (rk_kv_param){"dtype", (double)c->type}; /* the plain cache's payload and parameters */
    return 1;
}

static rk_status dt_export(const rk_kv *ckv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    rk_kv *kv = (rk_kv *)ckv;
    const size_t len = (size_t)(row1 - row0) * kv->row_bytes;
    uint8_t *tmp = malloc(len ? len : 1);
    if (!tmp) return rk_err_set(err, RK_E_NOMEM, "kv: export of %lld rows", (long long)(row1 - row0));
    rk_status st = RK_OK;
    for (int l = 0; l < kv->n_layer && !st; l++)
        for (int part = 0; part < 2 && !st; part++)
            if (!(st = rows_out(kv, l, part, row0, row1 - row0, tmp, err))) rk_kv_put(out, tmp, len);
    free(tmp);
    return st;
}

static rk_status dt_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    devtier *c = kv->impl;
    uint64_t want;
    if (!rk_mul_u64((uint64_t)n_rows, kv->row_bytes, &want) || !rk_mul_u64(want, 2ull * (uint64_t)kv->n_layer, &want) ||
        want != n || row0 < 0 || n_rows > kv->n_ctx - row0)
        return rk_err_set(err, RK_E_FORMAT, "kv: plain payload of %zu bytes for %lld rows (expected %llu)", n,
                          (long long)n_rows, (unsigned long long)want);
    const size_t len = (size_t)n_rows * kv->row_bytes;
    rk_status st = RK_OK;
    for (int l = 0; l < kv->n_layer && !st; l++)
        for (int part = 0; part < 2 && !st; part++)
            st = rows_in(kv, l, part, row0, n_rows, p + (size_t)(2 * l + part) * len, err);
    if (st) return st;
    for (int l = 0; l < kv->n_layer; l++) c->held[l] = row0 + n_rows;
    kv->n_past = row0 + n_rows;
    return RK_OK;
}

static void dt_destroy(rk_kv *kv) {
    devtier *c = kv->impl;
    if (!c) return;
    rk_backend_lane_sync(kv->be, NULL); /* no copy may still touch what goes */
    for (int l = 0; c->k && c->v && l < kv->n_layer; l++) {
        if (cold(c, l)) {
            rk_backend_host_free(kv->be, c->k[l]);
            rk_backend_host_free(kv->be, c->v[l]);
        } else {
            rk_backend_free(kv->be, c->k[l]);
            rk_backend_free(kv->be, c->v[l]);
        }
    }
    for (int s = 0; s < 2; s++) rk_backend_free(kv->be, c->sk[s]), rk_backend_free(kv->be, c->sv[s]);
    free(c->k), free(c->v), free(c->held), free(c);
    kv->impl = NULL;
}

static void dt_tier_stats(const rk_kv *kv, rk_kv_tier_stats *out) {
    const devtier *c = kv->impl;
    *out = c->st;
    out->spilled_bytes = (uint64_t)c->n_cold * 2ull * (uint64_t)c->held[kv->n_layer - 1] * kv->row_bytes;
}

static const rk_kv_ops devtier_ops = {
    .name = "devtier",
    .append = dt_append,
    .attend = dt_attend,
    .commit = rk_kv_rows_commit,
    .truncate = dt_truncate,
    .reset = dt_reset,
    .read = dt_read,
    .write = dt_write,
    .bytes = dt_bytes,
    .stats = NULL,
    .params = dt_params,
    .export_rows = dt_export,
    .import_rows = dt_import,
    .destroy = dt_destroy,
    .tier_stats = dt_tier_stats,
};

static uint64_t layer_bytes(const rk_kv *kv, uint32_t type) {
    return 2ull * (uint64_t)kv->n_ctx * (uint64_t)kv->kv_dim * (type == RK_DT_F32 ? 4u : 2u);
}

bool rk_kv_dev_takes(const rk_kv *kv, uint32_t type, const rk_kv_params *p) {
    return kv->be && kv->be->ops->mem_alloc && (type == RK_DT_F16 || type == RK_DT_F32) && p->budget &&
           p->budget / layer_bytes(kv, type) >= 2;
}

rk_status rk_kv_dev_init(rk_kv *kv, uint32_t type, const rk_kv_params *p, rk_err *err) {
    if (!rk_kv_dev_takes(kv, type, p))
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: devtier: budget %llu bytes below two layers (%llu bytes each)",
                          (unsigned long long)p->budget, (unsigned long long)layer_bytes(kv, type));
    devtier *c = calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    kv->ops = &devtier_ops;
    kv->impl = c;
    c->type = type;
    kv->row_bytes = (size_t)kv->kv_dim * (type == RK_DT_F32 ? 4 : 2);
    c->arr_bytes = (size_t)kv->n_ctx * kv->row_bytes;
    const uint64_t fit = p->budget / layer_bytes(kv, type);
    c->n_res = fit >= (uint64_t)kv->n_layer ? kv->n_layer : (int)fit - 2;
    c->n_cold = kv->n_layer - c->n_res;
    c->slot_layer[0] = c->slot_layer[1] = -1;
    c->cur = -1;
    c->k = calloc((size_t)kv->n_layer, sizeof *c->k);
    c->v = calloc((size_t)kv->n_layer, sizeof *c->v);
    c->held = calloc((size_t)kv->n_layer, sizeof *c->held);
    if (!c->k || !c->v || !c->held) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    rk_status st = RK_OK;
    for (int l = 0; l < kv->n_layer && !st; l++) {
        void *pk = NULL, *pv = NULL;
        if (cold(c, l)) {
            if (!(st = rk_backend_host_alloc(kv->be, c->arr_bytes, &pk, err))) c->k[l] = pk;
            if (!st && !(st = rk_backend_host_alloc(kv->be, c->arr_bytes, &pv, err))) c->v[l] = pv;
        } else {
            if (!(st = rk_backend_alloc(kv->be, c->arr_bytes, &pk, err))) c->k[l] = pk;
            if (!st && !(st = rk_backend_alloc(kv->be, c->arr_bytes, &pv, err))) c->v[l] = pv;
        }
    }
    for (int s = 0; s < 2 && s < c->n_cold && !st; s++) {
        void *pk = NULL, *pv = NULL;
        if (!(st = rk_backend_alloc(kv->be, c->arr_bytes, &pk, err))) c->sk[s] = pk;
        if (!st && !(st = rk_backend_alloc(kv->be, c->arr_bytes, &pv, err))) c->sv[s] = pv;
    }
    if (st) return st;
    if (c->n_cold == 1) c->slot_layer[1] = -2; /* one slot: never filled */
    c->st.on = true;
    c->st.budget = p->budget;
    c->st.resident_bytes = (uint64_t)(c->n_res + (c->n_cold < 2 ? c->n_cold : 2)) * 2ull * c->arr_bytes;
    c->st.chunk_rows = (int32_t)kv->n_ctx; /* a "chunk" here: one layer's K or V rows */
    snprintf(c->st.backend, sizeof c->st.backend, "%s-lane", kv->be->ops->name);
    return RK_OK;
}
