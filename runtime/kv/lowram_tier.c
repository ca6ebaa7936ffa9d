/* LowRAM under a KV budget (rk_kv_params.budget with --kv lowram; docs/TIERS.md).
 *
 * The codec's arrays stay as lowram*.c keep them. What may leave memory are the rows that
 * dominate its bytes and that decode reads only for the chunks it selects: the key
 * coefficient rows of each layer group (g->coef) and the value residual rows of each
 * (layer, KV head) (H->res). Landmarks, bounds, chunk means, bases, predictors, positions,
 * masks, sinks and the exact window never move.
 *
 * Each such array is cut into spans of SPAN bytes on the page grid (the bytes before its
 * first page boundary never move). A span whose bytes are all final (rows of complete
 * chunks: a chunk's rows do not change until a truncation) may be released: its bytes go
 * to the block store as one frame (written once, the first time it is released), then
 * madvise(MADV_DONTNEED) gives its pages back. A released span is read back in place
 * (refilled: the same bytes at the same address) when attention needs it, so attention
 * runs on the arrays exactly as in memory and the logits are the same bit for bit.
 *
 * - Sparse decode (lowram_attn.c's sparse_decode) names per (layer, KV head) the chunks it
 *   selected (lr_tier_need): the spans holding their coefficient and residual rows are
 *   made resident before they are read. Any other attention (prefill, dense) makes every
 *   span of the layer resident (lr_tier_begin).
 * - After a layer's attention (lr_tier_end) the spans over budget are released, chosen by
 *   when they will probably be needed next: the chunks a (layer, head) selected at the
 *   previous step are its likely next selection (lr_tier counts how often that holds), so
 *   a span used at this step by layer L is next needed at the next step's layer L; the
 *   one needed farthest ahead goes first (Belady on the predicted order; with full cyclic
 *   reuse this keeps a fixed share resident instead of thrashing as LRU would).
 * - Then the next layer's spans of last step's selection are read ahead (up to the store's
 *   queue depth), so their reads overlap the rest of this layer.
 * - The budget covers the codec's whole state: the spans may use budget less everything
 *   that does not move (less than zero: every cold span is released after each use).
 * - Truncation into compressed rows, kv_rows, export and write first read every released
 *   span back; import and a new fit start the index again. A failed write keeps the span
 *   in memory (counted); a failed read is an error of that attention, nothing lost.
 */
#include "lowram_tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rk_blockstore.h"

enum { PAGE = 4096, SPAN = 4096, QD = 32 };

typedef struct span {
    uint8_t released;    /* the pages are given back: the bytes are in the store only */
    uint8_t in_store;    /* a frame holds the bytes */
    uint8_t get_pending, put_pending, sticky, prefetched;
    int32_t ri;          /* index in the resident list; -1 */
    uint32_t used_call;  /* last attention call that needed it */
    int32_t used_step;   /* its decode step */
} span;

typedef struct arr {
    uint8_t *base;       /* the codec's array when indexed */
    uintptr_t a1;        /* first page boundary at or after base */
    int layer;           /* the layer whose attention reads it first (group: its first layer) */
    int64_t n_span;      /* spans of the array's capacity */
    int64_t n_frozen;    /* spans wholly inside its final bytes (a prefix; registered) */
    span *s;
} arr;

typedef struct ref {
    int32_t a;
    int32_t k;
} ref;

struct lr_tier {
    const rk_kv_ops *inner;
    rk_kv *kv;
    uint64_t budget, cap;
    int n_arr;
    arr *a;
    ref *rl;             /* resident spans (registered, not released) */
    int64_t n_rl, cap_rl;
    ref *wl;             /* spans an attention waits for */
    int64_t n_wl, cap_wl;
    int64_t n_released, n_in_store;
    rk_bs *bs;
    rk_bs_params bp;
    char spill_dir[3072];
    rk_bs_stats acc;
    uint32_t call;
    int32_t step;
    int cur_layer;
    bool was_fitted;
    /* the previous step's selection per (layer, head): mark (cap_chunks) and list */
    uint8_t *pmark;
    int32_t *plist;
    int64_t *pn;
    rk_status io_st;
    char io_msg[240];
    rk_kv_tier_stats st;
};

static rk_kv_codec *CODEC(const rk_kv *kv) { return kv->impl; }
static lr_tier *TIER(const rk_kv *kv) { return CODEC(kv)->tier; }
static uint64_t ID(int a, int64_t k) { return ((uint64_t)(uint32_t)a << 32) | (uint64_t)k; }
static span *SP(lr_tier *t, ref r) { return &t->a[r.a].s[r.k]; }
static uint8_t *ADDR(const lr_tier *t, ref r) { return (uint8_t *)(t->a[r.a].a1 + (uintptr_t)r.k * SPAN); }

static bool push(ref **v, int64_t *n, int64_t *cap, ref r) {
    if (*n == *cap) {
        const int64_t nc = *cap ? *cap * 2 : 256;
        ref *p = realloc(*v, (size_t)nc * sizeof *p);
        if (!p) return false;
        *v = p, *cap = nc;
    }
    (*v)[(*n)++] = r;
    return true;
}

static void rl_add(lr_tier *t, ref r) {
    span *s = SP(t, r);
    if (s->ri >= 0) return;
    if (!push(&t->rl, &t->n_rl, &t->cap_rl, r)) {
        s->sticky = 1; /* cannot track it: it simply stays */
        return;
    }
    s->ri = (int32_t)(t->n_rl - 1);
}

static void rl_del(lr_tier *t, ref r) {
    span *s = SP(t, r);
    if (s->ri < 0) return;
    const ref last = t->rl[t->n_rl - 1];
    t->rl[s->ri] = last;
    SP(t, last)->ri = s->ri;
    t->n_rl--;
    s->ri = -1;
}

/* ---- the index of the codec's arrays ---- */

static void index_free(lr_tier *t) {
    for (int i = 0; t->a && i < t->n_arr; i++) free(t->a[i].s);
    free(t->a);
    t->a = NULL, t->n_arr = 0, t->n_rl = 0, t->n_released = 0, t->n_in_store = 0;
}

static bool add_arr(lr_tier *t, int i, uint8_t *base, size_t cap, int layer) {
    arr *A = &t->a[i];
    A->base = base;
    A->a1 = ((uintptr_t)base + PAGE - 1) / PAGE * PAGE;
    A->layer = layer;
    const uintptr_t end = (uintptr_t)base + cap;
    A->n_span = base && end > A->a1 ? (int64_t)((end - A->a1) / SPAN) : 0;
    A->n_frozen = 0;
    A->s = calloc((size_t)(A->n_span ? A->n_span : 1), sizeof *A->s);
    if (!A->s) return false;
    for (int64_t k = 0; k < A->n_span; k++) A->s[k].ri = -1;
    return true;
}

/* Indexes the codec's arrays as they are now; every span counts as present (a new fit or
 * import wrote them, or what they held is past the rows in use). */
static void index_build(lr_tier *t) {
    index_free(t);
    const rk_kv_codec *c = CODEC(t->kv);
    t->was_fitted = c->fitted;
    if (!c->fitted) return;
    const int nh = c->n_head_kv;
    const int n = c->n_group + c->n_layer * nh;
    t->a = calloc((size_t)n, sizeof *t->a);
    if (!t->a) return;
    t->n_arr = n;
    bool ok = true;
    for (int gi = 0; gi < c->n_group; gi++)
        ok &= add_arr(t, gi, c->g[gi].coef, (size_t)c->n_ctx * c->g[gi].coef_bytes, c->g[gi].l0);
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < nh; h++)
            ok &= add_arr(t, c->n_group + l * nh + h, c->ly[l].h[h].res, (size_t)c->n_ctx * c->res_bytes, l);
    if (!ok) index_free(t); /* out of memory: no span moves (the budget is not kept) */
}

/* Final bytes of array i: coefficient / residual rows of complete chunks. */
static size_t frozen_bytes(const lr_tier *t, int i) {
    const rk_kv_codec *c = CODEC(t->kv);
    const int64_t C = c->p.chunk;
    if (i < c->n_group) {
        const lr_group *g = &c->g[i];
        return (size_t)(g->n_rows / C * C) * g->coef_bytes;
    }
    const int l = (i - c->n_group) / c->n_head_kv, h = (i - c->n_group) % c->n_head_kv;
    const lr_group *g = &c->g[c->ly[l].grp];
    const lr_head *H = &c->ly[l].h[h];
    const int64_t full = g->n_rows / C;
    const int64_t slots = full * C == g->n_rows ? H->n_res : H->base[full];
    return (size_t)slots * c->res_bytes;
}

/* Registers spans that became final (rows are appended in order: a growing prefix). */
static void update_frozen(lr_tier *t) {
    for (int i = 0; i < t->n_arr; i++) {
        arr *A = &t->a[i];
        const uintptr_t end = (uintptr_t)A->base + frozen_bytes(t, i);
        int64_t nf = end > A->a1 ? (int64_t)((end - A->a1) / SPAN) : 0;
        if (nf > A->n_span) nf = A->n_span;
        for (int64_t k = A->n_frozen; k < nf; k++) {
            A->s[k].used_step = t->step - 1; /* not used yet */
            rl_add(t, (ref){i, (int32_t)k});
        }
        A->n_frozen = nf > A->n_frozen ? nf : A->n_frozen;
    }
}

static void update_cap(lr_tier *t) {
    rk_kv_bytes o;
    t->inner->bytes(t->kv, &o);
    uint64_t fz = 0;
    for (int i = 0; i < t->n_arr; i++) fz += (uint64_t)t->a[i].n_frozen * SPAN;
    const uint64_t fixed = o.total > fz ? o.total - fz : 0;
    t->cap = t->budget > fixed ? t->budget - fixed : 0;
}

/* ---- the store ---- */

static rk_status open_store(lr_tier *t, rk_err *err) {
    return rk_bs_renew_spill(&t->bs, t->spill_dir, &t->bp, &t->acc, err);
}

static void on_done(lr_tier *t, const rk_bs_done *d) {
    const ref r = {(int32_t)(d->id >> 32), (int32_t)(d->id & 0xffffffffu)};
    if (r.a < 0 || r.a >= t->n_arr || r.k < 0 || r.k >= t->a[r.a].n_span) return; /* from a forgotten index */
    span *s = SP(t, r);
    if (d->is_put) {
        if (!s->put_pending) return;
        s->put_pending = 0;
        if (d->status) {
            t->st.spill_errors++;
            s->sticky = 1; /* the bytes are still in memory: they stay */
            return;
        }
        s->in_store = 1;
        t->n_in_store++;
        t->st.bytes_spilled += SPAN;
    } else {
        if (!s->get_pending) return;
        s->get_pending = 0;
        if (d->status || d->len != SPAN) {
            if (!t->io_st) {
                t->io_st = d->status ? d->status : RK_E_FORMAT;
                snprintf(t->io_msg, sizeof t->io_msg, "%.200s", d->status ? d->msg : "a spilled span of another size");
            }
            return;
        }
        s->released = 0;
        t->n_released--;
        rl_add(t, r);
        t->st.bytes_read += SPAN;
    }
}

static void pump(lr_tier *t, bool block) {
    rk_bs_done d[32];
    const int n = rk_bs_wait(t->bs, block ? 1 : 0, d, 32);
    for (int i = 0; i < n; i++) on_done(t, &d[i]);
}

static void drain(lr_tier *t) {
    while (t->bs && rk_bs_in_flight(t->bs)) pump(t, true);
}

static rk_status take_io_error(lr_tier *t, rk_err *err) {
    if (!t->io_st) return RK_OK;
    const rk_status st = t->io_st;
    t->io_st = RK_OK;
    return rk_err_set(err, st, "kv tier (lowram): cannot read spilled rows back (%s)", t->io_msg);
}

/* Issues the read of a released span (not waiting). */
static rk_status fetch(lr_tier *t, ref r, rk_err *err) {
    span *s = SP(t, r);
    if (!s->released || s->get_pending) return RK_OK;
    rk_status st = rk_bs_get(t->bs, ID(r.a, r.k), ADDR(t, r), SPAN, NULL, err);
    if (st) return st;
    s->get_pending = 1;
    return RK_OK;
}

static rk_status wait_list(lr_tier *t, bool count, rk_err *err) {
    const double t0 = rk_time_now();
    for (int64_t i = 0; i < t->n_wl;) {
        if (!SP(t, t->wl[i])->get_pending) {
            i++;
            continue;
        }
        if (!rk_bs_in_flight(t->bs) && !t->io_st) {
            t->io_st = RK_E_INTERNAL;
            snprintf(t->io_msg, sizeof t->io_msg, "a read that is not in flight");
        }
        if (t->io_st) break;
        pump(t, true);
    }
    t->n_wl = 0;
    if (count) t->st.stall_s += rk_time_now() - t0;
    return take_io_error(t, err);
}

/* Spans of array i holding bytes [x, y): marks them used by this call; released ones are
 * read (or were read ahead) and go on the wait list. */
static rk_status touch(lr_tier *t, int i, size_t x, size_t y, rk_err *err) {
    arr *A = &t->a[i];
    const uintptr_t lo0 = (uintptr_t)A->base + x, hi = (uintptr_t)A->base + y;
    const uintptr_t lo = lo0 > A->a1 ? lo0 : A->a1;
    if (y <= x || hi <= lo) return RK_OK;
    const int64_t k0 = (int64_t)((lo - A->a1) / SPAN);
    int64_t k1 = (int64_t)((hi - 1 - A->a1) / SPAN) + 1;
    if (k1 > A->n_frozen) k1 = A->n_frozen;
    for (int64_t k = k0; k < k1; k++) {
        span *s = &A->s[k];
        if (s->used_call == t->call) continue; /* counted once per call */
        s->used_call = t->call, s->used_step = t->step;
        if (!s->released) {
            t->st.hits++;
            continue;
        }
        t->st.misses++;
        if (s->get_pending && s->prefetched) t->st.prefetched++;
        const ref r = {i, (int32_t)k};
        rk_status st = fetch(t, r, err);
        if (st) return st;
        if (!push(&t->wl, &t->n_wl, &t->cap_wl, r)) return rk_err_set(err, RK_E_NOMEM, "kv tier: out of memory");
    }
    return RK_OK;
}

static void chunk_ranges(const rk_kv_codec *c, int layer, int h, int64_t ch, size_t *cx, size_t *cy, size_t *rx,
                         size_t *ry) {
    const lr_layer *L = &c->ly[layer];
    const lr_group *g = &c->g[L->grp];
    const lr_head *H = &L->h[h];
    const int64_t C = c->p.chunk, r0 = ch * C, r1 = g->n_rows - r0 < C ? g->n_rows : r0 + C;
    *cx = (size_t)r0 * g->coef_bytes, *cy = (size_t)r1 * g->coef_bytes;
    const int64_t s0 = H->base[ch], s1 = s0 + __builtin_popcount(H->mask[ch]);
    *rx = (size_t)s0 * c->res_bytes, *ry = (size_t)s1 * c->res_bytes;
}

/* Keeps the index in step with the codec (a fit makes new arrays). */
static void sync_index(lr_tier *t) {
    const rk_kv_codec *c = CODEC(t->kv);
    if (c->fitted != t->was_fitted || (c->fitted && t->n_arr == 0)) {
        drain(t);
        index_build(t);
    }
    if (t->n_arr) update_frozen(t);
}

rk_status lr_tier_begin(rk_kv_codec *c, int layer, bool selective, rk_err *err) {
    lr_tier *t = c->tier;
    if (layer == 0) t->step++;
    t->call++;
    t->cur_layer = layer;
    sync_index(t);
    pump(t, false);
    if (selective || !t->n_arr) return RK_OK;
    /* every chunk of the layer: its group's coefficients, its heads' residuals */
    const int nh = c->n_head_kv;
    rk_status st = touch(t, c->ly[layer].grp, 0, frozen_bytes(t, c->ly[layer].grp), err);
    for (int h = 0; h < nh && !st; h++) {
        const int i = c->n_group + layer * nh + h;
        st = touch(t, i, 0, frozen_bytes(t, i), err);
    }
    const rk_status sw = wait_list(t, true, err);
    return st ? st : sw;
}

rk_status lr_tier_need(rk_kv_codec *c, int layer, int h, const int32_t *sel, int64_t n, rk_err *err) {
    lr_tier *t = c->tier;
    if (!t->n_arr) return RK_OK;
    const int nh = c->n_head_kv;
    const size_t po = ((size_t)layer * nh + h) * (size_t)c->cap_chunks;
    uint8_t *pm = t->pmark + po;
    int32_t *pl = t->plist + po;
    /* how well the previous step's selection predicts this one */
    if (t->pn[layer * nh + h] > 0) {
        for (int64_t i = 0; i < n; i++) t->st.sel_repeat += pm[sel[i]];
        t->st.sel_chunks += (uint64_t)n;
    }
    for (int64_t i = 0; i < t->pn[layer * nh + h]; i++) pm[pl[i]] = 0;
    for (int64_t i = 0; i < n; i++) pm[sel[i]] = 1, pl[i] = sel[i];
    t->pn[layer * nh + h] = n;
    rk_status st = RK_OK;
    const int gi = c->ly[layer].grp, ri = c->n_group + layer * nh + h;
    for (int64_t i = 0; i < n && !st; i++) {
        size_t cx, cy, rx, ry;
        chunk_ranges(c, layer, h, sel[i], &cx, &cy, &rx, &ry);
        st = touch(t, gi, cx, cy, err);
        if (!st) st = touch(t, ri, rx, ry, err);
    }
    const rk_status sw = wait_list(t, true, err);
    return st ? st : sw;
}

/* How far ahead (in attention calls of layers) span r is probably needed again. */
static int64_t distance(const lr_tier *t, ref r) {
    const span *s = &t->a[r.a].s[r.k];
    const int L = t->a[r.a].layer, nL = CODEC(t->kv)->n_layer, cur = t->cur_layer;
    if (s->used_step == t->step) return nL + L - cur;
    if (s->used_step == t->step - 1 && L > cur) return L - cur;
    return 2 * (int64_t)nL + (t->step - s->used_step);
}

typedef struct cand {
    int64_t d;
    ref r;
} cand;

static int by_distance(const void *a, const void *b) {
    const int64_t x = ((const cand *)a)->d, y = ((const cand *)b)->d;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int by_place(const void *a, const void *b) {
    const ref x = ((const cand *)a)->r, y = ((const cand *)b)->r;
    return x.a != y.a ? (x.a < y.a ? -1 : 1) : x.k < y.k ? -1 : x.k > y.k;
}

/* Releases n adjacent spans (of one array, consecutive): one madvise for those that may go. */
static void release_run(lr_tier *t, const cand *v, int64_t n) {
    for (int64_t i = 0; i < n;) {
        const span *s = SP(t, v[i].r);
        if (s->released || !s->in_store || s->sticky) {
            i++;
            continue;
        }
        int64_t j = i + 1;
        for (; j < n; j++) {
            const span *u = SP(t, v[j].r);
            if (u->released || !u->in_store || u->sticky) break;
        }
        madvise(ADDR(t, v[i].r), (size_t)(j - i) * SPAN, MADV_DONTNEED);
        for (int64_t k = i; k < j; k++) {
            span *u = SP(t, v[k].r);
            u->released = 1, u->prefetched = 0;
            rl_del(t, v[k].r);
            t->n_released++;
        }
        i = j;
    }
}

/* Releases spans until the resident ones fit the cap (with some slack, so that this runs
 * now and then, not at every call). Spans this call uses stay. */
static void evict(lr_tier *t) {
    const uint64_t res = (uint64_t)t->n_rl * SPAN, slack = t->cap / 8 > 16 * SPAN ? t->cap / 8 : 16 * SPAN;
    if (res <= t->cap + (t->cap ? slack : 0)) return;
    const uint64_t target = t->cap > slack ? t->cap - slack : 0;
    cand *cv = malloc((size_t)t->n_rl * sizeof *cv);
    if (!cv) return;
    int64_t n = 0;
    for (int64_t i = 0; i < t->n_rl; i++) {
        const span *s = SP(t, t->rl[i]);
        if (s->used_call == t->call || s->get_pending || s->put_pending || s->sticky) continue;
        cv[n++] = (cand){distance(t, t->rl[i]), t->rl[i]};
    }
    qsort(cv, (size_t)n, sizeof *cv, by_distance);
    int64_t m = 0;
    for (uint64_t r = res; m < n && r > target; m++) r -= SPAN;
    /* spans never written go to the store first; released once their write completed */
    rk_err e = {0};
    for (int64_t i = 0; i < m; i++) {
        span *s = SP(t, cv[i].r);
        if (s->in_store) continue;
        if (rk_bs_put(t->bs, ID(cv[i].r.a, cv[i].r.k), ADDR(t, cv[i].r), SPAN, NULL, &e)) {
            t->st.spill_errors++;
            s->sticky = 1;
            continue;
        }
        s->put_pending = 1;
    }
    drain(t);
    /* by address, so that a run of adjacent spans is one madvise */
    qsort(cv, (size_t)m, sizeof *cv, by_place);
    for (int64_t i = 0; i < m;) {
        int64_t j = i + 1;
        while (j < m && cv[j].r.a == cv[i].r.a && cv[j].r.k == cv[j - 1].r.k + 1) j++;
        release_run(t, cv + i, j - i);
        i = j;
    }
    free(cv);
}

/* Reads ahead the spans of the next layer's selection at the previous step. */
static void prefetch(lr_tier *t, rk_kv_codec *c, int layer) {
    const int ln = (layer + 1) % c->n_layer, nh = c->n_head_kv, gi = c->ly[ln].grp;
    rk_err e = {0};
    for (int h = 0; h < nh; h++) {
        const size_t po = ((size_t)ln * nh + h) * (size_t)c->cap_chunks;
        for (int64_t i = 0; i < t->pn[ln * nh + h]; i++) {
            size_t xs[4];
            const int64_t ch = t->plist[po + i];
            if (ch * c->p.chunk >= c->g[gi].n_rows) continue;
            chunk_ranges(c, ln, h, ch, &xs[0], &xs[1], &xs[2], &xs[3]);
            for (int w = 0; w < 2; w++) {
                arr *A = &t->a[w ? c->n_group + ln * nh + h : gi];
                const uintptr_t lo0 = (uintptr_t)A->base + xs[2 * w], hi = (uintptr_t)A->base + xs[2 * w + 1];
                const uintptr_t lo = lo0 > A->a1 ? lo0 : A->a1;
                if (hi <= lo) continue;
                int64_t k1 = (int64_t)((hi - 1 - A->a1) / SPAN) + 1;
                if (k1 > A->n_frozen) k1 = A->n_frozen;
                for (int64_t k = (int64_t)((lo - A->a1) / SPAN); k < k1; k++) {
                    span *s = &A->s[k];
                    if (!s->released || s->get_pending) continue;
                    if (rk_bs_in_flight(t->bs) >= QD) return; /* a full queue would block */
                    if (fetch(t, (ref){(int32_t)(A - t->a), (int32_t)k}, &e)) return;
                    s->prefetched = 1;
                    s->used_step = t->step;
                }
            }
        }
    }
}

void lr_tier_end(rk_kv_codec *c, int layer) {
    lr_tier *t = c->tier;
    if (!t->n_arr) return;
    pump(t, false);
    evict(t);
    prefetch(t, c, layer);
}

/* Reads every released span back (before a truncation, kv_rows, an export). */
static rk_status refill_all(lr_tier *t, rk_err *err) {
    rk_status st = RK_OK;
    for (int i = 0; i < t->n_arr && !st; i++)
        for (int64_t k = 0; k < t->a[i].n_frozen && !st; k++) {
            if (!t->a[i].s[k].released) continue;
            const ref r = {i, (int32_t)k};
            if ((st = fetch(t, r, err))) break;
            if (!push(&t->wl, &t->n_wl, &t->cap_wl, r)) st = rk_err_set(err, RK_E_NOMEM, "kv tier: out of memory");
        }
    const rk_status sw = wait_list(t, false, err);
    return st ? st : sw;
}

static void after_op(lr_tier *t) {
    sync_index(t);
    if (!t->n_arr) return;
    t->call++;
    update_cap(t);
    evict(t);
}

/* ---- the wrapped rk_kv ops ---- */

static rk_status w_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    lr_tier *t = TIER(kv);
    if (!CODEC(kv)->fitted) drain(t); /* a fit may make new arrays */
    rk_status st = t->inner->append(kv, l, pos0, k, v, n, err);
    sync_index(t);
    return st;
}

static rk_status w_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    return TIER(kv)->inner->attend(kv, l, q, n_q, pos0, out, err);
}

static rk_status w_commit(rk_kv *kv, int64_t n, rk_err *err) {
    lr_tier *t = TIER(kv);
    if (!CODEC(kv)->fitted) drain(t);
    rk_status st = t->inner->commit(kv, n, err);
    after_op(t);
    return st;
}

static void w_truncate(rk_kv *kv, int64_t n) {
    lr_tier *t = TIER(kv);
    const rk_kv_codec *c = CODEC(kv);
    drain(t);
    if (c->fitted && n < c->comp_end && t->n_arr) {
        rk_err e = {0};
        if (refill_all(t, &e)) {
            /* cannot read the rows back: forget them all (the session is cut to the sinks) */
            n = 0;
        }
        t->inner->truncate(kv, n);
        index_build(t); /* the stored rows changed: every frame is stale */
        after_op(t);
        return;
    }
    t->inner->truncate(kv, n);
    after_op(t);
}

static void w_reset(rk_kv *kv) {
    lr_tier *t = TIER(kv);
    drain(t);
    t->inner->reset(kv);
    index_build(t);
    rk_err e = {0};
    open_store(t, &e); /* every frame is dead: a new file (on failure the old one stays) */
    memset(t->pn, 0, (size_t)CODEC(kv)->n_layer * CODEC(kv)->n_head_kv * sizeof *t->pn);
    memset(t->pmark, 0, (size_t)CODEC(kv)->n_layer * CODEC(kv)->n_head_kv * (size_t)CODEC(kv)->cap_chunks);
}

static rk_status w_read(const rk_kv *kv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                        rk_err *err) {
    lr_tier *t = TIER(kv);
    drain(t);
    rk_status st = refill_all(t, err);
    if (!st) st = t->inner->read(kv, l, values, pre_rope, row0, n, dst, err);
    after_op(t);
    return st;
}

static rk_status w_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    lr_tier *t = TIER(kv);
    drain(t);
    rk_status st = refill_all(t, err);
    if (!st) st = t->inner->write(kv, l, values, row0, n, src, err);
    if (!st) index_build(t); /* rows may have changed under their frames */
    after_op(t);
    return st;
}

static void w_bytes(const rk_kv *kv, rk_kv_bytes *out) { TIER(kv)->inner->bytes(kv, out); }

static void w_stats(const rk_kv *kv, rk_lowram_stats *out) { TIER(kv)->inner->stats(kv, out); }

static int w_params(const rk_kv *kv, rk_kv_param *out) { return TIER(kv)->inner->params(kv, out); }

static rk_status w_export(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    lr_tier *t = TIER(kv);
    drain(t);
    rk_status st = refill_all(t, err);
    if (!st) st = t->inner->export_rows(kv, row0, row1, out, err);
    after_op(t);
    return st;
}

static rk_status w_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    lr_tier *t = TIER(kv);
    drain(t);
    rk_status st = t->inner->import_rows(kv, row0, n_rows, p, n, err);
    CODEC(kv)->tier = t; /* the import swapped the codec's state (and this pointer) */
    if (!st) index_build(t);
    after_op(t);
    return st;
}

static void tier_free(lr_tier *t) {
    if (!t) return;
    rk_bs_close(t->bs);
    index_free(t);
    free(t->rl), free(t->wl), free(t->pmark), free(t->plist), free(t->pn);
    free(t);
}

static void w_destroy(rk_kv *kv) {
    rk_kv_codec *c = CODEC(kv);
    lr_tier *t = c ? c->tier : NULL;
    if (t) {
        drain(t);
        c->tier = NULL;
        t->inner->destroy(kv);
        tier_free(t);
    }
}

static void w_tier_stats(const rk_kv *kv, rk_kv_tier_stats *o) {
    lr_tier *t = TIER(kv);
    *o = t->st;
    o->on = true;
    o->budget = t->budget;
    o->chunk_rows = CODEC(kv)->p.chunk;
    rk_kv_bytes b;
    t->inner->bytes(kv, &b);
    const uint64_t out = (uint64_t)t->n_released * SPAN;
    o->spilled_bytes = out;
    o->resident_bytes = b.total > out ? b.total - out : 0;
    rk_bs_stats bs;
    rk_bs_get_stats(t->bs, &bs);
    o->bytes_read_stored = t->acc.stored_read + bs.stored_read;
    o->bytes_spilled_stored = t->acc.stored_written + bs.stored_written;
    o->io_wait_s = t->acc.wait_s + bs.wait_s;
    snprintf(o->backend, sizeof o->backend, "%s", rk_bs_backend_name(rk_bs_backend_used(t->bs)));
}

static const rk_kv_ops tier_ops = {
    .name = "lowram",
    .append = w_append,
    .attend = w_attend,
    .commit = w_commit,
    .truncate = w_truncate,
    .reset = w_reset,
    .read = w_read,
    .write = w_write,
    .bytes = w_bytes,
    .stats = w_stats,
    .params = w_params,
    .export_rows = w_export,
    .import_rows = w_import,
    .destroy = w_destroy,
    .tier_stats = w_tier_stats,
};

rk_status rk_kv_lowram_tier_init(rk_kv *kv, const rk_model *m, const rk_kv_params *p, int n_threads, char *warning,
                                 size_t warning_cap, rk_err *err) {
    if (p->lowram.evict > 0)
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "kv: lowram with eviction (evict=) and a KV budget together are not supported (eviction "
                          "rewrites stored rows); drop one of them");
    rk_status st = rk_kv_lowram_init(kv, m, &p->lowram, n_threads, warning, warning_cap, err);
    if (st) return st;
    rk_kv_codec *c = CODEC(kv);
    lr_tier *t = calloc(1, sizeof *t);
    if (!t) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory for the tier");
    t->inner = kv->ops;
    t->kv = kv;
    t->budget = p->budget;
    const size_t nlh = (size_t)c->n_layer * (size_t)c->n_head_kv;
    t->pmark = calloc(nlh * (size_t)c->cap_chunks, 1);
    t->plist = malloc(nlh * (size_t)c->cap_chunks * sizeof *t->plist);
    t->pn = calloc(nlh, sizeof *t->pn);
    if (!t->pmark || !t->plist || !t->pn) {
        tier_free(t);
        return rk_err_set(err, RK_E_NOMEM, "kv: out of memory for the tier");
    }
    snprintf(t->spill_dir, sizeof t->spill_dir, "%s", p->spill_dir && *p->spill_dir ? p->spill_dir : "/tmp");
    t->bp = rk_bs_params_default();
    t->bp.max_block = SPAN;
    t->bp.queue_depth = QD;
    t->bp.zstd_level = p->spill_level > 0 ? p->spill_level : 1;
    t->bp.backend = (rk_bs_backend)p->spill_backend;
    t->bp.no_direct = p->spill_buffered;
    if ((st = open_store(t, err))) {
        tier_free(t);
        return st;
    }
    c->tier = t;
    kv->ops = &tier_ops;
    return RK_OK;
}
