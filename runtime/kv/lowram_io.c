/* LowRAM state as a block payload: the whole state of rows [0, n_past) (export), and its
 * import into a new codec with every count, index and size checked before use (a block
 * passed its checksum, but the payload is still treated as untrusted input).
 *
 * Payload (scalars little-endian; arrays as the codec stores them, little-endian hosts):
 *   u32 fitted; u64 n_past, comp_end, n_evicted, rope_filled
 *   unfitted: f64 qsq (n_layer, kv_dim); u32 has_obs [u32 obs_n (n_layer),
 *             u64 obs_pos (n_layer, obs), f32 obs_q (n_layer, obs, q_dim)];
 *             per layer exact K rows [0, n_past), then V rows
 *   fitted:   per group: u32 r; f64 energy_total, energy_kept; u64 n_rows; f32 mean, wdim,
 *             winv (D); basis (r, D) f16|f32; u16 cmean (n_ch, r); f32 open_c (r);
 *             i32 pos (n_rows); coef (n_rows, coef_bytes)
 *             per layer: W (r, kv_dim) f16|f32; f32 b (kv_dim); u16 lmk (n_ch, kv_dim);
 *             f32 open_sum (kv_dim); bound: u16 lmin, lmax (n_ch, kv_dim), f32 open_min,
 *             open_max (kv_dim); per KV head: f32 tau, r2; u64 n_res; res (n_res,
 *             res_bytes); u32 mask (n_ch); i32 base (n_ch)
 *             per layer exact K rows [0, sinks), V rows; then K rows [comp_end, n_past), V rows
 *             then (optional: older states end above) u32 "PINS",
 *             per layer and KV head u32 n_pin (<= 32), i32 pin (n_pin) chunk indices < n_ch
 *             then (optional: older states have none) u32 "FULL", u32 n_full
 *             (<= 8), i32 layer (n_full) distinct, < n_layer: the layers that attend every
 *             chunk, most missed first
 * n_ch = ceil(n_rows / chunk) of the layer's group. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"

int lr_params(const rk_kv_codec *c, rk_kv_param *o) {
    const rk_lowram_params *p = &c->p;
    int n = 0;
#define P(nm, v) (o[n++] = (rk_kv_param){nm, (double)(v)})
    P("ratio", p->ratio), P("rank", p->rank), P("energy", p->energy), P("group", p->group), P("window", p->window);
    P("sinks", p->n_sink), P("chunk", p->chunk), P("resid", p->resid_share), P("mass", p->resid_mass);
    /* only what the stored state depends on: decode's selection knobs (budget, topp, minch,
     * krank, dense, nosumm, nocache, dl0/dl1, like kslots, kcache and hyst) are left out, so a
     * state decodes under other selection settings (lowram_study --reuse) */
    P("keys_only", p->values_exact), P("bound", p->bound), P("qpca", p->query_pca), P("coef", p->coef_type);
    P("rtype", p->resid_type), P("exact", p->exact_type), P("evict", p->evict), P("obs", p->obs_window);
    P("lambda", p->lambda), P("fitrows", p->max_fit_rows), P("pfit", p->prefill_fit);
    if (p->value_rank) P("vrank", p->value_rank); /* only when set: states exported before it still import */
#undef P
    return n;
}

static size_t elt(const rk_kv_codec *c) { return c->wide ? 4 : 2; }
static int64_t n_chunks(const rk_kv_codec *c, const lr_group *g) { return (g->n_rows + c->p.chunk - 1) / c->p.chunk; }

/* exact rows [p0, p1) of every layer: K rows, then V rows */
static void put_exact(const rk_kv_codec *c, rk_kv_buf *b, int64_t p0, int64_t p1) {
    for (int l = 0; l < c->n_layer; l++)
        for (int v = 0; v < 2 && p1 > p0; v++) rk_kv_put(b, lr_exact_ptr(c, l, v, p0), (size_t)(p1 - p0) * c->xrow);
}

rk_status lr_export(const rk_kv_codec *c, rk_kv_buf *b, rk_err *err) {
    const int64_t n = c->n_past;
    rk_kv_put_u32(b, c->fitted);
    rk_kv_put_u64(b, (uint64_t)n), rk_kv_put_u64(b, (uint64_t)c->comp_end);
    rk_kv_put_u64(b, (uint64_t)c->n_evicted), rk_kv_put_u64(b, (uint64_t)c->rope_filled);
    if (!c->fitted) {
        rk_kv_put(b, c->qsq, (size_t)c->n_layer * c->kvd * sizeof(double));
        rk_kv_put_u32(b, c->obs_q != NULL);
        if (c->obs_q) {
            const size_t W = (size_t)c->p.obs_window, qd = (size_t)c->n_head * c->hd;
            rk_kv_put(b, c->obs_n, (size_t)c->n_layer * sizeof(int32_t));
            rk_kv_put(b, c->obs_pos, (size_t)c->n_layer * W * sizeof(int64_t));
            rk_kv_put(b, c->obs_q, (size_t)c->n_layer * W * qd * sizeof(float));
        }
        put_exact(c, b, 0, n);
        return RK_OK;
    }
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        const size_t D = (size_t)g->D, r = (size_t)g->r, nch = (size_t)n_chunks(c, g);
        rk_kv_put_u32(b, (uint32_t)g->r);
        rk_kv_put_f64(b, g->energy_total), rk_kv_put_f64(b, g->energy_kept);
        rk_kv_put_u64(b, (uint64_t)g->n_rows);
        rk_kv_put(b, g->mean, D * 4), rk_kv_put(b, g->wdim, D * 4), rk_kv_put(b, g->winv, D * 4);
        rk_kv_put(b, g->basis, r * D * elt(c));
        if (c->cmean_on) {
            rk_kv_put(b, g->cmean, nch * r * 2);
        } else { /* not kept: the block still carries them (rebuilt), so every reader can import it */
            uint16_t *cm = malloc((nch ? nch : 1) * r * 2);
            if (!cm) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory exporting chunk means");
            rk_status st = lr_cmean_fill(c, g, cm, err);
            if (st) {
                free(cm);
                return st;
            }
            rk_kv_put(b, cm, nch * r * 2);
            free(cm);
        }
        rk_kv_put(b, g->open_c, r * 4);
        rk_kv_put(b, g->pos, (size_t)g->n_rows * 4);
        rk_kv_put(b, g->coef, (size_t)g->n_rows * g->coef_bytes);
        for (int li = 0; li < g->n_l; li++) {
            const lr_layer *L = &c->ly[g->l0 + li];
            const size_t kvd = (size_t)c->kvd;
            rk_kv_put(b, L->W, (size_t)lr_vr(c, g) * kvd * elt(c));
            rk_kv_put(b, L->b, kvd * 4);
            rk_kv_put(b, L->lmk, nch * kvd * 2);
            rk_kv_put(b, L->open_sum, kvd * 4);
            if (c->p.bound) {
                rk_kv_put(b, L->lmin, nch * kvd * 2), rk_kv_put(b, L->lmax, nch * kvd * 2);
                rk_kv_put(b, L->open_min, kvd * 4), rk_kv_put(b, L->open_max, kvd * 4);
            }
            for (int h = 0; h < c->n_head_kv; h++) {
                const lr_head *H = &L->h[h];
                rk_kv_put(b, &H->tau, 4), rk_kv_put(b, &H->r2, 4);
                rk_kv_put_u64(b, (uint64_t)H->n_res);
                rk_kv_put(b, H->res, (size_t)H->n_res * c->res_bytes);
                rk_kv_put(b, H->mask, nch * 4), rk_kv_put(b, H->base, nch * 4);
            }
        }
    }
    put_exact(c, b, 0, c->p.n_sink < n ? c->p.n_sink : n);
    put_exact(c, b, c->comp_end, n);
    /* trailer: the pinned chunks of every (layer, KV head) (mass_pin), so an imported state
     * decodes as the exported one did; states written before it end here and import unpinned */
    rk_kv_put_u32(b, LR_PIN_TAG);
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv; h++) {
            const lr_head *H = &c->ly[l].h[h];
            rk_kv_put_u32(b, (uint32_t)H->n_pin);
            rk_kv_put(b, H->pin, (size_t)H->n_pin * 4);
        }
    /* the full layers, most missed first (an importer with a smaller full= takes the first) */
    rk_kv_put_u32(b, LR_FULL_TAG);
    rk_kv_put_u32(b, (uint32_t)c->stats.n_full);
    rk_kv_put(b, c->stats.full_l, (size_t)c->stats.n_full * 4);
    return RK_OK;
}

/* ---- import ------------------------------------------------------------------------------ */

#define BAD(...) rk_err_set(err, RK_E_FORMAT, __VA_ARGS__)

/* copies count elements of size bytes from r into dst; false (r->fail) when short */
static bool take(rk_kv_rd *r, void *dst, uint64_t count, size_t size) {
    const uint8_t *p = rk_kv_get_n(r, count, size);
    if (!p) return false;
    if (count) memcpy(dst, p, (size_t)(count * size));
    return true;
}

/* the chunk means: into dst when the codec keeps them, else read past (not resident) */
static bool take_cmean(const rk_kv_codec *c, rk_kv_rd *r, uint16_t *dst, uint64_t count) {
    if (c->cmean_on) return take(r, dst, count, 2);
    return rk_kv_get_n(r, count, 2) != NULL || count == 0;
}

static bool take_exact(rk_kv_codec *c, rk_kv_rd *r, int64_t p0, int64_t p1) {
    for (int l = 0; l < c->n_layer; l++)
        for (int v = 0; v < 2 && p1 > p0; v++)
            if (!take(r, (uint8_t *)lr_exact_ptr(c, l, v, p0), (uint64_t)(p1 - p0), c->xrow)) return false;
    return true;
}

/* Residual masks and slots of one (layer, head) agree with n_res and the rows stored:
 * base[ch] counts the bits before chunk ch, no bit past the group's last row. */
static bool slots_ok(const rk_kv_codec *c, const lr_group *g, const lr_head *H) {
    const int64_t C = c->p.chunk, nch = n_chunks(c, g);
    int64_t sum = 0;
    for (int64_t ch = 0; ch < nch; ch++) {
        const int64_t rows = g->n_rows - ch * C < C ? g->n_rows - ch * C : C;
        if (H->base[ch] != sum || (rows < 32 && (H->mask[ch] >> rows) != 0)) return false;
        sum += __builtin_popcount(H->mask[ch]);
    }
    return sum == H->n_res;
}

static rk_status import_fitted(rk_kv_codec *c, rk_kv_rd *r, rk_err *err) {
    const int64_t sink = c->p.n_sink, n_comp = c->comp_end - sink;
    for (int gi = 0; gi < c->n_group; gi++) {
        lr_group *g = &c->g[gi];
        const uint32_t rank = rk_kv_get_u32(r);
        const double et = rk_kv_get_f64(r), ek = rk_kv_get_f64(r);
        const uint64_t n_rows = rk_kv_get_u64(r);
        if (r->fail) return BAD("lowram: payload ends in the header of group %d", gi);
        if (rank < 1 || rank > (uint32_t)g->D) return BAD("lowram: group %d has rank %u (1..%d)", gi, rank, g->D);
        if (n_rows > (uint64_t)n_comp)
            return BAD("lowram: group %d stores %llu rows of %lld compressed", gi, (unsigned long long)n_rows,
                       (long long)n_comp);
        g->r = (int)rank;
        if (!lr_group_alloc(c, g)) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory importing group %d", gi);
        g->energy_total = et, g->energy_kept = ek;
        g->n_rows = (int64_t)n_rows;
        const uint64_t D = (uint64_t)g->D, R = rank, nch = (uint64_t)n_chunks(c, g), kvd = (uint64_t)c->kvd;
        if (!take(r, g->mean, D, 4) || !take(r, g->wdim, D, 4) || !take(r, g->winv, D, 4) ||
            !take(r, g->basis, R * D, elt(c)) || !take_cmean(c, r, g->cmean, nch * R) || !take(r, g->open_c, R, 4) ||
            !take(r, g->pos, n_rows, 4) || !take(r, g->coef, n_rows, g->coef_bytes))
            return BAD("lowram: payload ends inside group %d", gi);
        for (uint64_t i = 0; i < n_rows; i++) /* positions index the RoPE table: strictly increasing, compressed */
            if (g->pos[i] < sink || g->pos[i] >= c->comp_end || (i && g->pos[i] <= g->pos[i - 1]))
                return BAD("lowram: group %d row %llu has position %d (increasing in [%lld, %lld))", gi,
                           (unsigned long long)i, g->pos[i], (long long)sink, (long long)c->comp_end);
        for (int li = 0; li < g->n_l; li++) {
            lr_layer *L = &c->ly[g->l0 + li];
            if (!take(r, L->W, (uint64_t)lr_vr(c, g) * kvd, elt(c)) || !take(r, L->b, kvd, 4) ||
                !take(r, L->lmk, nch * kvd, 2) || !take(r, L->open_sum, kvd, 4))
                return BAD("lowram: payload ends inside layer %d", g->l0 + li);
            if (c->p.bound && (!take(r, L->lmin, nch * kvd, 2) || !take(r, L->lmax, nch * kvd, 2) ||
                               !take(r, L->open_min, kvd, 4) || !take(r, L->open_max, kvd, 4)))
                return BAD("lowram: payload ends inside the bounds of layer %d", g->l0 + li);
            for (int h = 0; h < c->n_head_kv; h++) {
                lr_head *H = &L->h[h];
                if (!take(r, &H->tau, 1, 4) || !take(r, &H->r2, 1, 4))
                    return BAD("lowram: payload ends at layer %d head %d", g->l0 + li, h);
                const uint64_t n_res = rk_kv_get_u64(r);
                if (r->fail || n_res > n_rows)
                    return BAD("lowram: layer %d head %d has %llu residual rows of %llu", g->l0 + li, h,
                               (unsigned long long)n_res, (unsigned long long)n_rows);
                H->n_res = (int64_t)n_res;
                if (!take(r, H->res, n_res, c->res_bytes) || !take(r, H->mask, nch, 4) || !take(r, H->base, nch, 4))
                    return BAD("lowram: payload ends inside the residuals of layer %d head %d", g->l0 + li, h);
                if (!slots_ok(c, g, H))
                    return BAD("lowram: residual masks of layer %d head %d disagree with %lld rows", g->l0 + li, h,
                               (long long)H->n_res);
            }
        }
    }
    /* exact rows: sinks, then the window (and any rows not compressed yet) from comp_end */
    if (!lr_exact_sinks(c)) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for the sink rows");
    c->x0 = c->comp_end;
    const int64_t held = c->n_past - c->comp_end;
    int64_t cap = held + c->p.window + 2 * (int64_t)c->p.chunk;
    if (cap < sink) cap = sink;
    if (!lr_exact_reserve(c, c->x0 + cap)) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for exact rows");
    if (!take_exact(c, r, 0, sink < c->n_past ? sink : c->n_past))
        return BAD("lowram: payload ends inside the sink rows");
    if (!take_exact(c, r, c->comp_end, c->n_past)) return BAD("lowram: payload ends inside the window rows");
    for (int l = 0; l < c->n_layer; l++) c->x_hi[l] = c->n_past;
    /* the pinned chunks' trailer (absent in states exported before it: no pins) */
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv; h++) c->ly[l].h[h].n_pin = 0;
    if (r->off < r->n) {
        if (rk_kv_get_u32(r) != LR_PIN_TAG || r->fail) return BAD("lowram: unknown data after the window rows");
        for (int l = 0; l < c->n_layer; l++)
            for (int h = 0; h < c->n_head_kv; h++) {
                lr_head *H = &c->ly[l].h[h];
                const uint32_t np = rk_kv_get_u32(r);
                const int64_t nch = n_chunks(c, &c->g[c->ly[l].grp]);
                if (r->fail || np > LR_PIN_MAX || !take(r, H->pin, np, 4))
                    return BAD("lowram: pinned chunks of layer %d head %d: %u (at most %d) or truncated", l, h, np,
                               LR_PIN_MAX);
                for (uint32_t i = 0; i < np; i++)
                    if (H->pin[i] < 0 || H->pin[i] >= nch)
                        return BAD("lowram: layer %d head %d pins chunk %d of %lld", l, h, H->pin[i], (long long)nch);
                H->n_pin = (int)np;
            }
    }
    /* the full layers' trailer (absent in older states: none), most missed
     * first; this session takes the first full_layers of them (full=0: none) */
    for (int l = 0; l < c->n_layer; l++) c->ly[l].full = false;
    c->stats.n_full = 0;
    if (r->off < r->n) {
        const uint32_t nf = rk_kv_get_u32(r) == LR_FULL_TAG ? rk_kv_get_u32(r) : UINT32_MAX;
        if (r->fail || nf > LR_FULL_MAX)
            return BAD("lowram: full layers: a bad trailer (count %u, at most %d)", nf, LR_FULL_MAX);
        bool seen[256] = {false};
        for (uint32_t i = 0; i < nf; i++) {
            const uint32_t l = rk_kv_get_u32(r);
            if (r->fail || l >= (uint32_t)c->n_layer || l >= 256 || seen[l])
                return BAD("lowram: full layer %u of %d: out of range, repeated or truncated", l, c->n_layer);
            seen[l] = true;
            if ((int)i < c->p.full_layers) c->ly[l].full = true, c->stats.full_l[c->stats.n_full++] = (int32_t)l;
        }
        if (r->off < r->n) return BAD("lowram: %zu bytes of unknown data after the full layers", r->n - r->off);
    }
    c->fitted = true;
    rk_status st = lr_scratch_alloc(c, err);
    return st;
}

rk_status lr_import(rk_kv_codec *c, const rk_kv *kv, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    (void)kv;
    rk_kv_rd r = {p, n, 0, false};
    const uint32_t fitted = rk_kv_get_u32(&r);
    const uint64_t n_past = rk_kv_get_u64(&r), comp_end = rk_kv_get_u64(&r), n_evicted = rk_kv_get_u64(&r);
    const uint64_t rope_filled = rk_kv_get_u64(&r);
    const int64_t sink = c->p.n_sink;
    if (r.fail) return BAD("lowram: payload of %zu bytes ends inside its header", n);
    if (fitted > 1 || n_past != (uint64_t)n_rows || rope_filled < n_past || rope_filled > (uint64_t)c->n_ctx)
        return BAD("lowram: payload state (fitted %u, %llu rows, RoPE %llu) does not match the block (%lld rows, "
                   "n_ctx %lld)",
                   fitted, (unsigned long long)n_past, (unsigned long long)rope_filled, (long long)n_rows,
                   (long long)c->n_ctx);
    if (fitted ? comp_end <= (uint64_t)sink || comp_end > n_past || n_evicted > comp_end - (uint64_t)sink
               : comp_end != (uint64_t)sink || n_evicted != 0)
        return BAD("lowram: compressed range [%lld, %llu) (%llu evicted) impossible for %llu rows", (long long)sink,
                   (unsigned long long)comp_end, (unsigned long long)n_evicted, (unsigned long long)n_past);
    c->n_past = n_rows;
    c->comp_end = (int64_t)comp_end;
    c->n_evicted = (int64_t)n_evicted;
    rk_status st;
    if (fitted) {
        if ((st = import_fitted(c, &r, err))) return st;
    } else {
        if (!take(&r, c->qsq, (uint64_t)c->n_layer * c->kvd, sizeof(double)))
            return BAD("lowram: payload ends inside the query moments");
        const uint32_t has_obs = rk_kv_get_u32(&r);
        if (r.fail || has_obs != (c->obs_q != NULL))
            return BAD("lowram: observed queries %s in the payload but %s by the parameters",
                       has_obs ? "present" : "absent", c->obs_q ? "needed" : "not used");
        if (c->obs_q) {
            const uint64_t W = (uint64_t)c->p.obs_window, qd = (uint64_t)c->n_head * c->hd;
            if (!take(&r, c->obs_n, (uint64_t)c->n_layer, 4) || !take(&r, c->obs_pos, (uint64_t)c->n_layer * W, 8) ||
                !take(&r, c->obs_q, (uint64_t)c->n_layer * W * qd, 4))
                return BAD("lowram: payload ends inside the observed queries");
            for (int l = 0; l < c->n_layer; l++) /* the ring index is obs_n % W; rows < obs_n are read */
                if (c->obs_n[l] < 0 || c->obs_n[l] >= 2 * (int64_t)W)
                    return BAD("lowram: layer %d observed %d queries (ring of %llu)", l, c->obs_n[l],
                               (unsigned long long)W);
        }
        if (!lr_exact_reserve(c, n_rows)) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for exact rows");
        if (!take_exact(c, &r, 0, n_rows)) return BAD("lowram: payload ends inside the exact rows");
        for (int l = 0; l < c->n_layer; l++) c->x_hi[l] = n_rows;
    }
    if (r.off != r.n) return BAD("lowram: %zu bytes after the state", r.n - r.off);
    lr_rope_fill(c, (int64_t)rope_filled);
    return RK_OK;
}
