/* GPU KV tiers (docs/GPU.md "KV tiers on the device"): f16 / f32 rows
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
 * first pass. The disk step (host_budget): the cold layers share pinned frames, the others
 * live in the block store's spill file (devtier.n_pin below). Residency by chunk: the budget
 * past the layers and the slots buys device frames for each cold layer's hot chunks (the
 * sinks' and the newest; the devtier struct below), from which slots are assembled device to device.
 * What is not built: for LowRAM, moving only the selected chunks.
 * A budget below two layers (no room for the slots) takes the host tier (kv_tier.c) with
 * staged attention, as before. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_impl.h"
#include "rk_blockstore.h"

enum { DT_QD = 8 }; /* spill file operations in flight */

typedef struct devtier {
    uint32_t type;          /* RK_DT_F16 or RK_DT_F32 */
    int n_res, n_cold;      /* layers [0, n_res) resident, [n_res, n_layer) cold */
    size_t arr_bytes;       /* one K (or V) array: n_ctx rows */
    uint8_t **k, **v;       /* (n_layer) resident: device arrays; cold: pinned host blocks */
    uint8_t *sk[2], *sv[2]; /* staging slots (device) */
    int slot_layer[2];      /* the cold layer a slot holds (rows [0, held) valid once joined), -1 none */
    bool slot_pending[2];   /* a lane upload into the slot is queued and not joined yet */
    bool slot_ahead[2];     /* that upload was a prefetch (queued before its layer came) */
    int cur;                /* the slot of the layer being computed, -1 none */
    int64_t *held;          /* (n_layer) rows appended */
    rk_kv_tier_stats st;
    /* The disk step (host_budget): n_pin pinned frames of one layer (K and V) serve the
     * cold layers; c->k[l] / c->v[l] of a cold layer point into its frame, or are NULL when
     * its rows live only in the spill file (blocks of C rows, id (2 l + part) << 32 | chunk).
     * Rows [d0, d1) of a framed layer are newer than the file. Without a host budget
     * n_pin = n_cold and every cold layer keeps its frame. */
    int n_pin;
    uint8_t **fk, **fv; /* (n_pin) pinned frames */
    int *frame_layer;   /* (n_pin) the layer a frame holds, -1 none */
    int *layer_frame;   /* (n_layer) its frame, -1 on disk (cold layers) */
    uint64_t *last_use, tick;
    int64_t *d0, *d1; /* (n_layer) dirty rows */
    int64_t *on_disk; /* (n_layer) rows [0, on_disk) are in the spill file */
    int64_t C;        /* rows per spill block */
    rk_bs *bs;        /* NULL: no disk step */
    char spill_dir[1024];
    /* Residency by chunk: the budget past the resident layers and the two slots buys h
     * device frames of C rows (K and V) per cold layer, which hold its hot chunks (the sinks'
     * chunk 0 and the h - 1 newest). A slot is assembled from them (device to device) and
     * from the host block (the rest); the host block keeps every row (written through), so
     * a frame is only ever a copy. Frame f of layer l: chunk hch[l h + f] (-1 none), its rows
     * [0, hrows[l h + f]) valid; hmap[l nch + k]: the frame of chunk k, -1 none. */
    int h, nch;
    uint8_t **hk, **hv; /* (n_layer) cold layers with h > 0: h frames of C rows, device */
    int *hch, *hmap;
    int64_t *hrows;
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

/* Whether chunk k of a layer holding n chunks is hot: the sinks' chunk or one of the h - 1 newest. */
static bool hot_chunk(const devtier *c, int64_t n, int64_t k) { return k < n && (k == 0 || k >= n - (c->h - 1)); }

static uint8_t *frame_k(const rk_kv *kv, const devtier *c, int l, int f) {
    return c->hk[l] + (size_t)f * (size_t)c->C * kv->row_bytes;
}
static uint8_t *frame_v(const rk_kv *kv, const devtier *c, int l, int f) {
    return c->hv[l] + (size_t)f * (size_t)c->C * kv->row_bytes;
}

/* Rows from r0 on of cold layer l are no longer valid in its frames (rewritten or cut). */
static void hot_clamp(devtier *c, int l, int64_t r0) {
    for (int f = 0; f < c->h; f++) {
        const size_t i = (size_t)l * c->h + f;
        const int64_t k0 = (int64_t)c->hch[i] * c->C;
        if (c->hch[i] >= 0 && k0 + c->hrows[i] > r0) c->hrows[i] = r0 > k0 ? r0 - k0 : 0;
    }
}

/* The frames of cold layer l follow its hot chunks at held[l] rows: a frame whose chunk went
 * cold (or past held) is freed, each hot chunk without one gets a free one (no rows yet). */
static void hot_assign(devtier *c, int l) {
    if (!c->h) return;
    const int64_t held = c->held[l], n = (held + c->C - 1) / c->C;
    hot_clamp(c, l, held);
    int *ch = c->hch + (size_t)l * c->h, *map = c->hmap + (size_t)l * c->nch;
    for (int f = 0; f < c->h; f++)
        if (ch[f] >= 0 && !hot_chunk(c, n, ch[f])) map[ch[f]] = -1, ch[f] = -1, c->hrows[(size_t)l * c->h + f] = 0;
    for (int64_t k = 0; k < n; k = k ? k + 1 : (n - (c->h - 1) > 1 ? n - (c->h - 1) : 1)) {
        if (!hot_chunk(c, n, k) || map[k] >= 0) continue;
        for (int f = 0; f < c->h; f++)
            if (ch[f] < 0) {
                ch[f] = (int)k, map[k] = f, c->hrows[(size_t)l * c->h + f] = 0;
                break;
            }
    }
}

/* Queues on the lane the copies that bring cold layer l's frames up to its held rows from
 * slot s (which holds them: joined, or queued on the lane before these). */
static rk_status hot_catch_up(rk_kv *kv, int l, int s, rk_err *err) {
    devtier *c = kv->impl;
    rk_status st = RK_OK;
    for (int f = 0; f < c->h && !st; f++) {
        const size_t i = (size_t)l * c->h + f;
        if (c->hch[i] < 0) continue;
        const int64_t k0 = (int64_t)c->hch[i] * c->C, end = c->held[l] < k0 + c->C ? c->held[l] : k0 + c->C;
        const int64_t from = k0 + c->hrows[i];
        if (from >= end) continue;
        const size_t off = (size_t)(from - k0) * kv->row_bytes, bytes = (size_t)(end - from) * kv->row_bytes;
        st = rk_backend_lane_copy(kv->be, frame_k(kv, c, l, f) + off, c->sk[s] + (size_t)from * kv->row_bytes, bytes,
                                  true, err);
        if (!st)
            st = rk_backend_lane_copy(kv->be, frame_v(kv, c, l, f) + off, c->sv[s] + (size_t)from * kv->row_bytes,
                                      bytes, true, err);
        if (st) {
            c->hrows[i] = 0;
            break;
        }
        c->hrows[i] = end - k0;
        c->st.bytes_dev += 2 * bytes;
    }
    return st;
}

static uint64_t bs_id(int l, int part, int64_t ch) { return ((uint64_t)(2 * l + part) << 32) | (uint64_t)ch; }

/* Reaps every spill file operation in flight; the first failure goes to msg. */
static int bs_drain(devtier *c, char *msg, size_t cap) {
    int bad = 0;
    rk_bs_done d[32];
    while (rk_bs_in_flight(c->bs) > 0) {
        const int n = rk_bs_wait(c->bs, 1, d, 32);
        for (int i = 0; i < n; i++)
            if (d[i].status && !bad++) snprintf(msg, cap, "%s", d[i].msg);
    }
    return bad;
}

/* Frame f's layer goes to the spill file (its rows newer than the file written first);
 * on a failed write the layer keeps its frame (nothing lost) and the error names why. */
static rk_status evict(rk_kv *kv, int f, rk_err *err) {
    devtier *c = kv->impl;
    const int v = c->frame_layer[f];
    if (v < 0) return RK_OK;
    rk_status st = lane_sync(kv, err); /* no lane copy may still read or write the frame */
    if (st) return st;
    const int64_t hi = c->d1[v] < c->held[v] ? c->d1[v] : c->held[v];
    char msg[200] = "";
    int bad = 0;
    rk_bs_batch(c->bs, true);
    for (int64_t ch = c->d0[v] / c->C; ch * c->C < hi && !st; ch++) {
        const int64_t rows = c->held[v] - ch * c->C < c->C ? c->held[v] - ch * c->C : c->C;
        for (int part = 0; part < 2 && !st; part++) {
            if (rk_bs_in_flight(c->bs) >= DT_QD) bad += bs_drain(c, msg, sizeof msg);
            const uint8_t *src = (part ? c->fv[f] : c->fk[f]) + (size_t)(ch * c->C) * kv->row_bytes;
            st = rk_bs_put(c->bs, bs_id(v, part, ch), src, (size_t)rows * kv->row_bytes, NULL, err);
            if (!st) c->st.disk_writes++, c->st.disk_bytes_written += (uint64_t)rows * kv->row_bytes;
        }
    }
    rk_bs_batch(c->bs, false);
    bad += bs_drain(c, msg, sizeof msg);
    if (st) return rk_err_wrap(err, "kv: devtier: writing layer %d's rows to the spill file in %s", v, c->spill_dir);
    if (bad)
        return rk_err_set(err, RK_E_IO,
                          "kv: devtier: cannot write layer %d's rows to the spill file in %s (%s); they stay in memory",
                          v, c->spill_dir, msg);
    c->d0[v] = INT64_MAX, c->d1[v] = 0;
    c->on_disk[v] = c->held[v];
    c->frame_layer[f] = -1, c->layer_frame[v] = -1;
    c->k[v] = c->v[v] = NULL;
    return RK_OK;
}

/* Makes cold layer l's rows sit in a pinned frame (read back from the spill file when
 * they are there only), evicting the least recently used frame. */
static rk_status pin(rk_kv *kv, int l, rk_err *err) {
    devtier *c = kv->impl;
    c->last_use[l] = ++c->tick;
    if (c->layer_frame[l] >= 0) return RK_OK;
    int f = -1;
    for (int i = 0; i < c->n_pin && f < 0; i++)
        if (c->frame_layer[i] < 0) f = i;
    if (f < 0) { /* every frame holds a layer: the least recently used goes */
        f = 0;
        for (int i = 1; i < c->n_pin; i++)
            if (c->last_use[c->frame_layer[i]] < c->last_use[c->frame_layer[f]]) f = i;
    }
    rk_status st = evict(kv, f, err);
    if (st) return st;
    char msg[200] = "";
    int bad = 0;
    rk_bs_batch(c->bs, true);
    const int64_t back = c->on_disk[l] < c->held[l] ? c->on_disk[l] : c->held[l];
    for (int64_t ch = 0; ch * c->C < back && !st; ch++) {
        const int64_t cap = kv->n_ctx - ch * c->C < c->C ? kv->n_ctx - ch * c->C : c->C;
        for (int part = 0; part < 2 && !st; part++) {
            if (rk_bs_in_flight(c->bs) >= DT_QD) bad += bs_drain(c, msg, sizeof msg);
            uint8_t *dst = (part ? c->fv[f] : c->fk[f]) + (size_t)(ch * c->C) * kv->row_bytes;
            st = rk_bs_get(c->bs, bs_id(l, part, ch), dst, (size_t)cap * kv->row_bytes, NULL, err);
            if (!st) c->st.disk_reads++, c->st.disk_bytes_read += (uint64_t)cap * kv->row_bytes;
        }
    }
    rk_bs_batch(c->bs, false);
    bad += bs_drain(c, msg, sizeof msg);
    if (st)
        return rk_err_wrap(err, "kv: devtier: reading layer %d's rows back from the spill file in %s", l, c->spill_dir);
    if (bad)
        return rk_err_set(err, RK_E_IO, "kv: devtier: cannot read layer %d's rows back from the spill file in %s (%s)",
                          l, c->spill_dir, msg);
    c->frame_layer[f] = l, c->layer_frame[l] = f;
    c->k[l] = c->fk[f], c->v[l] = c->fv[f];
    return RK_OK;
}

static void mark_dirty(devtier *c, int l, int64_t r0, int64_t r1) {
    if (r0 < c->d0[l]) c->d0[l] = r0;
    if (r1 > c->d1[l]) c->d1[l] = r1;
}

/* Queues on the lane the rows [a, b) of cold layer l from its host block into slot s. */
static rk_status slot_up(rk_kv *kv, int s, int l, int64_t a, int64_t b, bool *pinned, rk_err *err) {
    devtier *c = kv->impl;
    if (a >= b) return RK_OK;
    rk_status st = *pinned ? RK_OK : pin(kv, l, err);
    if (st) return st;
    *pinned = true;
    const size_t off = (size_t)a * kv->row_bytes, bytes = (size_t)(b - a) * kv->row_bytes;
    st = rk_backend_lane_copy(kv->be, c->sk[s] + off, c->k[l] + off, bytes, true, err);
    if (!st) st = rk_backend_lane_copy(kv->be, c->sv[s] + off, c->v[l] + off, bytes, true, err);
    if (!st) c->st.bytes_read += 2 * bytes, c->st.bytes_read_stored += 2 * bytes;
    return st;
}

/* Queues the assembly of cold layer l's held rows in slot s on the lane: the rows its device
 * frames hold from there (device to device), the others (runs of them) up from its host
 * block; then the frames of its hot chunks catch up from the slot. */
static rk_status fill_slot(rk_kv *kv, int s, int l, bool ahead, rk_err *err) {
    devtier *c = kv->impl;
    const int64_t held = c->held[l];
    hot_assign(c, l);
    c->last_use[l] = ++c->tick;
    rk_status st = RK_OK;
    bool pinned = false;
    int64_t a = 0; /* the run of host rows [a, r) not queued yet */
    for (int64_t k = 0; k * c->C < held && !st; k++) {
        const int f = c->h ? c->hmap[(size_t)l * c->nch + k] : -1;
        const int64_t k0 = k * c->C, in = f >= 0 ? c->hrows[(size_t)l * c->h + f] : 0;
        const int64_t rows = held - k0 < c->C ? held - k0 : c->C, n = in < rows ? in : rows;
        if (n <= 0) continue;
        if ((st = slot_up(kv, s, l, a, k0, &pinned, err))) break;
        const size_t off = (size_t)k0 * kv->row_bytes, bytes = (size_t)n * kv->row_bytes;
        st = rk_backend_lane_copy(kv->be, c->sk[s] + off, frame_k(kv, c, l, f), bytes, true, err);
        if (!st) st = rk_backend_lane_copy(kv->be, c->sv[s] + off, frame_v(kv, c, l, f), bytes, true, err);
        if (!st) c->st.bytes_dev += 2 * bytes;
        a = k0 + n;
    }
    if (!st) st = slot_up(kv, s, l, a, held, &pinned, err);
    if (!st) st = hot_catch_up(kv, l, s, err);
    c->slot_layer[s] = st ? -1 : l; /* a failed copy leaves the slot unknown */
    c->slot_pending[s] = !st;
    c->slot_ahead[s] = ahead;
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
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "kv: devtier: append of rows [%lld, %lld) to layer %d (holding %lld of %lld)",
                          (long long)pos0, (long long)(pos0 + n), l,
                          (long long)(l >= 0 && l < kv->n_layer ? c->held[l] : 0), (long long)kv->n_ctx);
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
    if (s >= 0) { /* the new rows into the hot chunks' frames and down to the host block, after the CPY_ROWS */
        hot_clamp(c, l, pos0);
        hot_assign(c, l);
        if ((st = hot_catch_up(kv, l, s, err)) || (st = pin(kv, l, err))) {
            c->slot_layer[s] = -1;
            return st;
        }
        mark_dirty(c, l, pos0, pos0 + n);
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
    for (int l = c->n_res; c->h && l < kv->n_layer; l++) hot_clamp(c, l, n);
    for (int l = 0; c->on_disk && l < kv->n_layer; l++)
        if (c->on_disk[l] > n) c->on_disk[l] = n;
}

static void dt_reset(rk_kv *kv) {
    devtier *c = kv->impl;
    rk_kv_rows_reset(kv);
    for (int l = 0; l < kv->n_layer; l++) c->held[l] = 0, c->on_disk[l] = 0;
    for (int l = c->n_res; c->h && l < kv->n_layer; l++) hot_clamp(c, l, 0);
}

/* Rows [row0, row0 + n) of layer l as stored, into tmp (host). */
static rk_status rows_out(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, uint8_t *tmp, rk_err *err) {
    devtier *c = kv->impl;
    const size_t off = (size_t)row0 * kv->row_bytes, bytes = (size_t)n * kv->row_bytes;
    if (!cold(c, l)) return rk_backend_download(kv->be, tmp, (values ? c->v[l] : c->k[l]) + off, bytes, err);
    rk_status st = pin(kv, l, err);
    if (!st) st = lane_sync(kv, err);
    if (!st) memcpy(tmp, (values ? c->v[l] : c->k[l]) + off, bytes);
    return st;
}

/* The reverse: a cold layer's slot no longer holds its rows. */
static rk_status rows_in(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const uint8_t *src, rk_err *err) {
    devtier *c = kv->impl;
    const size_t off = (size_t)row0 * kv->row_bytes, bytes = (size_t)n * kv->row_bytes;
    if (!cold(c, l)) return rk_backend_upload(kv->be, (values ? c->v[l] : c->k[l]) + off, src, bytes, err);
    rk_status st = pin(kv, l, err);
    if (!st) st = lane_sync(kv, err);
    if (st) return st;
    memcpy((values ? c->v[l] : c->k[l]) + off, src, bytes);
    mark_dirty(c, l, row0, row0 + n);
    if (c->h) hot_clamp(c, l, row0);
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
    /* a layer's held rows first: a frame evicted to the spill file later in the loop writes
     * out the rows it holds (with held still 0 after a reset it wrote none: the rows were lost) */
    for (int l = 0; l < kv->n_layer && !st; l++) {
        c->held[l] = row0 + n_rows;
        for (int part = 0; part < 2 && !st; part++)
            st = rows_in(kv, l, part, row0, n_rows, p + (size_t)(2 * l + part) * len, err);
    }
    if (st) return st;
    kv->n_past = row0 + n_rows;
    return RK_OK;
}

static void dt_destroy(rk_kv *kv) {
    devtier *c = kv->impl;
    if (!c) return;
    rk_backend_lane_sync(kv->be, NULL); /* no copy may still touch what goes */
    for (int f = 0; c->fk && c->fv && f < c->n_pin; f++) {
        rk_backend_host_free(kv->be, c->fk[f]);
        rk_backend_host_free(kv->be, c->fv[f]);
    }
    rk_bs_close(c->bs);
    for (int l = 0; c->k && c->v && l < kv->n_layer; l++) {
        if (!cold(c, l)) {
            rk_backend_free(kv->be, c->k[l]);
            rk_backend_free(kv->be, c->v[l]);
        }
    }
    for (int s = 0; s < 2; s++) rk_backend_free(kv->be, c->sk[s]), rk_backend_free(kv->be, c->sv[s]);
    for (int l = 0; c->hk && c->hv && l < kv->n_layer; l++)
        rk_backend_free(kv->be, c->hk[l]), rk_backend_free(kv->be, c->hv[l]);
    free(c->hk), free(c->hv), free(c->hch), free(c->hmap), free(c->hrows);
    free(c->k), free(c->v), free(c->held), free(c->fk), free(c->fv), free(c->frame_layer), free(c->layer_frame);
    free(c->last_use), free(c->d0), free(c->d1), free(c->on_disk), free(c);
    kv->impl = NULL;
}

static void dt_tier_stats(const rk_kv *kv, rk_kv_tier_stats *out) {
    const devtier *c = kv->impl;
    *out = c->st;
    out->spilled_bytes = (uint64_t)c->n_cold * 2ull * (uint64_t)c->held[kv->n_layer - 1] * kv->row_bytes;
    out->host_bytes = (uint64_t)c->n_pin * 2ull * c->arr_bytes;
    out->dev_chunks = 0;
    for (int l = c->n_res; l < kv->n_layer; l++)
        for (int f = 0; f < c->h; f++)
            out->dev_chunks += c->hch[(size_t)l * c->h + f] >= 0 && c->hrows[(size_t)l * c->h + f] > 0;
}

static const rk_kv_ops devtier_ops = {
    .name = "devtier",
    .mem = RK_KV_MEM_BACKEND,
    .writable = false,
    .recordable = false, /* rows move between a step's ops on the copy lane */
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
    /* rows per chunk (a device frame, a spill block): about 256 KiB, at least 16 and at most
     * an eighth of n_ctx (>= 16) */
    c->C = (int64_t)((256u << 10) / kv->row_bytes);
    if (c->C > kv->n_ctx / 8) c->C = kv->n_ctx / 8;
    if (c->C < 16) c->C = 16;
    c->nch = (int)((kv->n_ctx + c->C - 1) / c->C);
    const uint64_t fit = p->budget / layer_bytes(kv, type);
    c->n_res = fit >= (uint64_t)kv->n_layer ? kv->n_layer : (int)fit - 2;
    c->n_cold = kv->n_layer - c->n_res;
    if (c->n_cold > 2) { /* what the budget leaves past the layers: chunk frames, as many per cold layer */
        const uint64_t frame = 2ull * (uint64_t)c->C * kv->row_bytes, left = p->budget - fit * layer_bytes(kv, type);
        const uint64_t h = left / ((uint64_t)c->n_cold * frame);
        c->h = h > (uint64_t)c->nch ? c->nch : (int)h;
    }
    c->slot_layer[0] = c->slot_layer[1] = -1;
    c->cur = -1;
    c->k = calloc((size_t)kv->n_layer, sizeof *c->k);
    c->v = calloc((size_t)kv->n_layer, sizeof *c->v);
    c->held = calloc((size_t)kv->n_layer, sizeof *c->held);
    if (!c->k || !c->v || !c->held) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    const uint64_t pin_bytes = 2ull * c->arr_bytes;
    c->n_pin = c->n_cold;
    if (p->host_budget && c->n_cold > 0 && p->host_budget / pin_bytes < (uint64_t)c->n_cold) {
        if (p->host_budget < pin_bytes)
            return rk_err_set(err, RK_E_INVALID_ARG,
                              "kv: devtier: host budget %llu bytes below one cold layer's pinned rows (%llu bytes)",
                              (unsigned long long)p->host_budget, (unsigned long long)pin_bytes);
        c->n_pin = (int)(p->host_budget / pin_bytes);
    }
    c->fk = calloc((size_t)c->n_pin + 1, sizeof *c->fk);
    c->fv = calloc((size_t)c->n_pin + 1, sizeof *c->fv);
    c->frame_layer = calloc((size_t)c->n_pin + 1, sizeof *c->frame_layer);
    c->layer_frame = calloc((size_t)kv->n_layer, sizeof *c->layer_frame);
    c->last_use = calloc((size_t)kv->n_layer, sizeof *c->last_use);
    c->d0 = calloc((size_t)kv->n_layer, sizeof *c->d0);
    c->d1 = calloc((size_t)kv->n_layer, sizeof *c->d1);
    c->on_disk = calloc((size_t)kv->n_layer, sizeof *c->on_disk);
    if (!c->fk || !c->fv || !c->frame_layer || !c->layer_frame || !c->last_use || !c->d0 || !c->d1 || !c->on_disk)
        return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    for (int l = 0; l < kv->n_layer; l++) c->layer_frame[l] = -1, c->d0[l] = INT64_MAX;
    for (int f = 0; f < c->n_pin; f++) c->frame_layer[f] = -1;
    rk_status st = RK_OK;
    for (int f = 0; f < c->n_pin && !st; f++) {
        void *pk = NULL, *pv = NULL;
        if (!(st = rk_backend_host_alloc(kv->be, c->arr_bytes, &pk, err))) c->fk[f] = pk;
        if (!st && !(st = rk_backend_host_alloc(kv->be, c->arr_bytes, &pv, err))) c->fv[f] = pv;
        if (!st) { /* the first cold layers start in the frames */
            const int l = c->n_res + f;
            c->frame_layer[f] = l, c->layer_frame[l] = f, c->k[l] = c->fk[f], c->v[l] = c->fv[f];
        }
    }
    if (!st && c->n_pin < c->n_cold) {
        snprintf(c->spill_dir, sizeof c->spill_dir, "%s", p->spill_dir && *p->spill_dir ? p->spill_dir : "/tmp");
        rk_bs_params bp = rk_bs_params_default();
        bp.max_block = (size_t)c->C * kv->row_bytes;
        bp.queue_depth = DT_QD;
        bp.zstd_level = p->spill_level > 0 ? p->spill_level : -1;
        bp.backend = (rk_bs_backend)p->spill_backend;
        bp.no_direct = p->spill_buffered;
        if ((st = rk_bs_open_spill(c->spill_dir, &bp, &c->bs, err)))
            return rk_err_wrap(err, "kv: devtier: the disk step (host budget %llu bytes)",
                               (unsigned long long)p->host_budget);
    }
    for (int l = 0; l < kv->n_layer && !st; l++) {
        void *pk = NULL, *pv = NULL;
        if (cold(c, l)) {
            continue;
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
    if (!st && c->h) {
        c->hk = calloc((size_t)kv->n_layer, sizeof *c->hk);
        c->hv = calloc((size_t)kv->n_layer, sizeof *c->hv);
        c->hch = malloc((size_t)kv->n_layer * (size_t)c->h * sizeof *c->hch);
        c->hrows = calloc((size_t)kv->n_layer * (size_t)c->h, sizeof *c->hrows);
        c->hmap = malloc((size_t)kv->n_layer * (size_t)c->nch * sizeof *c->hmap);
        if (!c->hk || !c->hv || !c->hch || !c->hrows || !c->hmap)
            return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
        memset(c->hch, 0xff, (size_t)kv->n_layer * (size_t)c->h * sizeof *c->hch);
        memset(c->hmap, 0xff, (size_t)kv->n_layer * (size_t)c->nch * sizeof *c->hmap);
        const size_t fb = (size_t)c->h * (size_t)c->C * kv->row_bytes;
        for (int l = c->n_res; l < kv->n_layer && !st; l++) {
            void *pk = NULL, *pv = NULL;
            if (!(st = rk_backend_alloc(kv->be, fb, &pk, err))) c->hk[l] = pk;
            if (!st && !(st = rk_backend_alloc(kv->be, fb, &pv, err))) c->hv[l] = pv;
        }
    }
    if (st) return st;
    if (c->n_cold == 1) c->slot_layer[1] = -2; /* one slot: never filled */
    c->st.on = true;
    c->st.budget = p->budget;
    c->st.dev_chunk_rows = (int32_t)c->C;
    c->st.dev_chunk_bytes = (uint64_t)c->n_cold * (uint64_t)c->h * 2ull * (uint64_t)c->C * kv->row_bytes;
    c->st.resident_bytes =
        (uint64_t)(c->n_res + (c->n_cold < 2 ? c->n_cold : 2)) * 2ull * c->arr_bytes + c->st.dev_chunk_bytes;
    c->st.chunk_rows = (int32_t)kv->n_ctx; /* a "chunk" here: one layer's K or V rows */
    snprintf(c->st.backend, sizeof c->st.backend, "%s-lane", kv->be->ops->name);
    return RK_OK;
}
