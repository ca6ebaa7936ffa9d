/* LowRAM under a KV budget (rk_kv_params.budget with --kv lowram; docs/TIERS.md).
 *
 * The codec's arrays stay as lowram*.c keep them. What may leave memory are the rows that
 * dominate its bytes and that decode reads only for the chunks it selects: the key
 * coefficient rows of each layer group (g->coef) and the value residual rows of each
 * (layer, KV head) (H->res). Landmarks, bounds, chunk means, bases, predictors, positions,
 * masks, sinks, the exact window and decode's key cache never move.
 *
 * The unit that moves is a cell: one complete chunk of one layer group, i.e. the chunk's
 * coefficient rows of the group and its residual rows of every (layer, KV head) of the
 * group. A cell is one frame in the block store (written once, when it first leaves
 * memory), so a selected chunk costs one read, whichever head of whichever layer of the
 * group selects it first; the others then find it resident.
 *
 * Memory goes back by pages: each page of the coefficient / residual arrays counts the
 * resident cells with bytes in it (pin); a page wholly inside the final rows whose count
 * falls to zero may be released (madvise(MADV_DONTNEED), adjacent pages in one call). A
 * cell read back is scattered into its places in the arrays (a released page comes back
 * zero-filled; only the resident cells' bytes in it are meaningful, and only those are
 * read), so attention runs on the codec's arrays as in memory: the logits are the same
 * bit for bit.
 *
 * - Sparse decode (lowram_attn.c's sparse_decode) names per (layer, KV head) the chunks it
 *   selected (lr_tier_need): their cells are read (one io_uring submission for the head's
 *   missing cells) before attention reads them. Any other attention (prefill, dense) makes
 *   every cell of the layer's group resident (lr_tier_begin).
 * - After a layer's attention (lr_tier_end) cells are released while the resident pages
 *   are over the budget, the one probably needed farthest ahead first: the chunks a (layer,
 *   head) selected at the previous step predict its next selection (lr_tier counts how
 *   often that holds), so each cell has a predicted next use (a later layer of its group
 *   in this step, else its group's first layer next step; Belady on the predicted order).
 *   When the part that never moves is alone over the budget, the cells predicted within
 *   the next PF_LAYERS layer calls (the working set: the group in progress and what is
 *   read ahead) stay: the budget cannot be kept then, and re-reading them would only cost.
 * - Then the cells the next PF_LAYERS layers selected at their previous step are read
 *   ahead (one submission; while they fit under the budget, or all of them when the
 *   budget is over anyway), so their reads overlap this and the next layers' compute.
 * - The budget bounds the movable rows (the pages of complete chunks' coefficient and
 *   residual rows); the per-step state that never moves stays resident on top of it and
 *   is reported (rk_kv_tier_stats.fixed_bytes). With rk_kv_params.budget_whole the budget
 *   covers the codec's whole state: the cells may use the budget less everything that
 *   does not move (less than zero: only the working set stays).
 * - Truncation into compressed rows, kv_rows, export and write first read every released
 *   cell back; import and a new fit start the index again. A failed write keeps the cell
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

enum { PAGE = 4096, QD = 64 };

typedef struct cell {
    uint8_t present;  /* its bytes are in place in the arrays */
    uint8_t in_store; /* a frame holds them */
    uint8_t get_pending, put_pending, sticky, prefetched;
    int16_t stage;      /* read slot of a pending get */
    int32_t ri;         /* index in the resident list; -1 */
    uint32_t used_call; /* last attention call that needed it */
    int64_t next_use;   /* predicted next layer call (step * n_layer + layer) that needs it */
} cell;

typedef struct arr {
    uint8_t *base;    /* the codec's array when indexed */
    uintptr_t a1;     /* first page boundary at or after base */
    int64_t n_page;   /* pages of the array's capacity from a1 */
    int64_t n_frozen; /* pages wholly inside its final bytes (a growing prefix) */
    uint16_t *pin;    /* (n_page) resident cells with bytes in the page */
    uint8_t *rel;     /* (n_page) released */
} arr;

typedef struct gix {
    int64_t n_cell;  /* chunks of the capacity */
    int64_t n_final; /* complete chunks: cells registered */
    cell *c;
} gix;

typedef struct ref {
    int32_t g;
    int32_t k;
} ref;

typedef struct pref {
    int32_t a;
    int32_t k;
} pref;

struct lr_tier {
    const rk_kv_ops *inner;
    rk_kv *kv;
    uint64_t budget, cap;
    bool whole; /* budget over the whole state (else over the movable rows) */
    int n_arr, n_grp;
    arr *a;
    gix *gx;
    ref *rl; /* resident cells (registered, present) */
    int64_t n_rl, cap_rl;
    ref *wl; /* cells an attention waits for */
    int64_t n_wl, cap_wl;
    pref *fl; /* pages whose pin fell to zero (release candidates) */
    int64_t n_fl, cap_fl;
    int64_t n_pages_frozen, n_pages_rel;
    uint64_t n_cells_out, peak;
    size_t cell_max; /* bytes of the largest cell */
    struct part *pv; /* (1 + n_l * n_head_kv) a cell's parts (one user at a time) */
    rk_bs_iov *iov;  /* (QD, 1 + n_l * n_head_kv) a pending get's places in the arrays */
    int iov_per;
    bool stage_busy[QD];
    size_t stage_len[QD]; /* bytes the pending get must bring */
    uint8_t *gather;      /* a cell's bytes for a put */
    rk_bs *bs;
    rk_bs_params bp;
    char spill_dir[3072];
    rk_bs_stats acc;
    uint32_t call;
    bool sel_call; /* this attention call names its chunks (sparse decode) */
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

enum { PF_LAYERS = 3 };

static rk_kv_codec *CODEC(const rk_kv *kv) { return kv->impl; }
static lr_tier *TIER(const rk_kv *kv) { return CODEC(kv)->tier; }
static uint64_t ID(int g, int64_t k) { return ((uint64_t)(uint32_t)g << 32) | (uint64_t)k; }
static cell *CL(lr_tier *t, ref r) { return &t->gx[r.g].c[r.k]; }
static int64_t NOW(const lr_tier *t) { return (int64_t)t->step * CODEC(t->kv)->n_layer + t->cur_layer; }

static bool grow(void **v, int64_t n, int64_t *cap, size_t el) {
    if (n < *cap) return true;
    const int64_t nc = *cap ? *cap * 2 : 256;
    void *p = realloc(*v, (size_t)nc * el);
    if (!p) return false;
    *v = p, *cap = nc;
    return true;
}

static void rl_add(lr_tier *t, ref r) {
    cell *s = CL(t, r);
    if (s->ri >= 0) return;
    if (!grow((void **)&t->rl, t->n_rl, &t->cap_rl, sizeof *t->rl)) {
        s->sticky = 1; /* cannot track it: it simply stays */
        return;
    }
    t->rl[t->n_rl] = r;
    s->ri = (int32_t)t->n_rl++;
}

static void rl_del(lr_tier *t, ref r) {
    cell *s = CL(t, r);
    if (s->ri < 0) return;
    const ref last = t->rl[t->n_rl - 1];
    t->rl[s->ri] = last;
    CL(t, last)->ri = s->ri;
    t->n_rl--;
    s->ri = -1;
}

/* ---- a cell's places in the arrays ---- */

typedef struct part part;
struct part {
    int a;       /* array */
    size_t x, y; /* bytes [x, y) of it */
};

/* The parts of cell (gi, ch): coefficient rows, then per (layer of the group, head) the
 * residual rows. Returns how many (at most 1 + n_l * n_head_kv). */
static int cell_parts(const rk_kv_codec *c, int gi, int64_t ch, part *out) {
    const lr_group *g = &c->g[gi];
    const int64_t C = c->p.chunk, r0 = ch * C, r1 = g->n_rows - r0 < C ? g->n_rows : r0 + C;
    int n = 0;
    out[n++] = (part){gi, (size_t)r0 * g->coef_bytes, (size_t)r1 * g->coef_bytes};
    const int nh = c->n_head_kv;
    for (int li = 0; li < g->n_l; li++)
        for (int h = 0; h < nh; h++) {
            const int l = g->l0 + li;
            const lr_head *H = &c->ly[l].h[h];
            const int64_t s0 = H->base[ch], s1 = s0 + __builtin_popcount(H->mask[ch]);
            if (s1 > s0)
                out[n++] = (part){c->n_group + l * nh + h, (size_t)s0 * c->res_bytes, (size_t)s1 * c->res_bytes};
        }
    return n;
}

static void page_span(const arr *A, size_t x, size_t y, int64_t *k0, int64_t *k1) {
    const uintptr_t lo0 = (uintptr_t)A->base + x, hi = (uintptr_t)A->base + y;
    const uintptr_t lo = lo0 > A->a1 ? lo0 : A->a1;
    if (y <= x || hi <= lo) {
        *k0 = *k1 = 0;
        return;
    }
    *k0 = (int64_t)((lo - A->a1) / PAGE);
    *k1 = (int64_t)((hi - 1 - A->a1) / PAGE) + 1;
    if (*k1 > A->n_page) *k1 = A->n_page;
}

/* The cell's pages gain (+1) or lose (-1) a resident cell; pages left with none inside
 * the final bytes become release candidates. */
static void pin_cell(lr_tier *t, int gi, int64_t ch, int d) {
    part *pv = t->pv;
    const int np = cell_parts(CODEC(t->kv), gi, ch, pv);
    for (int i = 0; i < np; i++) {
        arr *A = &t->a[pv[i].a];
        int64_t k0, k1;
        page_span(A, pv[i].x, pv[i].y, &k0, &k1);
        for (int64_t k = k0; k < k1; k++) {
            if (d > 0) {
                A->pin[k]++;
                continue;
            }
            if (A->pin[k]) A->pin[k]--;
            if (!A->pin[k] && k < A->n_frozen && !A->rel[k] &&
                grow((void **)&t->fl, t->n_fl, &t->cap_fl, sizeof *t->fl))
                t->fl[t->n_fl++] = (pref){pv[i].a, (int32_t)k};
        }
    }
}

static rk_status open_store(lr_tier *t, rk_err *err);

/* ---- the index of the codec's arrays ---- */

static void index_free(lr_tier *t) {
    for (int i = 0; t->a && i < t->n_arr; i++) free(t->a[i].pin), free(t->a[i].rel);
    for (int i = 0; t->gx && i < t->n_grp; i++) free(t->gx[i].c);
    free(t->a), free(t->gx);
    t->a = NULL, t->gx = NULL, t->n_arr = 0, t->n_grp = 0, t->n_rl = 0, t->n_fl = 0;
    t->n_pages_frozen = 0, t->n_pages_rel = 0, t->n_cells_out = 0;
    for (int i = 0; i < QD; i++) t->stage_busy[i] = false;
}

static bool add_arr(lr_tier *t, int i, uint8_t *base, size_t cap) {
    arr *A = &t->a[i];
    A->base = base;
    A->a1 = ((uintptr_t)base + PAGE - 1) / PAGE * PAGE;
    const uintptr_t end = (uintptr_t)base + cap;
    A->n_page = base && end > A->a1 ? (int64_t)((end - A->a1) / PAGE) + 1 : 0;
    A->n_frozen = 0;
    A->pin = calloc((size_t)(A->n_page ? A->n_page : 1), sizeof *A->pin);
    A->rel = calloc((size_t)(A->n_page ? A->n_page : 1), 1);
    return A->pin && A->rel;
}

/* Indexes the codec's arrays as they are now; every cell counts as present (a new fit or
 * import wrote them). */
static void index_build(lr_tier *t) {
    index_free(t);
    const rk_kv_codec *c = CODEC(t->kv);
    t->was_fitted = c->fitted;
    if (!c->fitted) return;
    const int nh = c->n_head_kv;
    const int n = c->n_group + c->n_layer * nh;
    t->a = calloc((size_t)n, sizeof *t->a);
    t->gx = calloc((size_t)c->n_group, sizeof *t->gx);
    if (!t->a || !t->gx) {
        free(t->a), free(t->gx);
        t->a = NULL, t->gx = NULL;
        return;
    }
    t->n_arr = n, t->n_grp = c->n_group;
    free(t->pv);
    t->pv = malloc((size_t)(1 + c->p.group * nh) * sizeof *t->pv);
    bool ok = t->pv != NULL;
    size_t cmax = 0;
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        ok &= add_arr(t, gi, g->coef, (size_t)c->n_ctx * g->coef_bytes);
        gix *G = &t->gx[gi];
        G->n_cell = c->cap_chunks;
        G->c = calloc((size_t)(G->n_cell ? G->n_cell : 1), sizeof *G->c);
        ok &= G->c != NULL;
        for (int64_t k = 0; G->c && k < G->n_cell; k++) G->c[k].ri = -1, G->c[k].stage = -1;
        const size_t cb = (size_t)c->p.chunk * (g->coef_bytes + (size_t)g->n_l * nh * c->res_bytes);
        cmax = cb > cmax ? cb : cmax;
    }
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < nh; h++)
            ok &= add_arr(t, c->n_group + l * nh + h, c->ly[l].h[h].res, (size_t)c->n_ctx * c->res_bytes);
    free(t->iov);
    t->iov_per = 1 + c->p.group * nh;
    t->iov = malloc((size_t)QD * (size_t)t->iov_per * sizeof *t->iov);
    ok &= t->iov != NULL;
    if (ok && cmax > t->cell_max) { /* buffers for the largest cell */
        free(t->gather);
        ok &= (t->gather = malloc(cmax)) != NULL;
        if (ok) {
            /* every frame is stale after a new index: a new spill file with buffers for a cell */
            t->bp.max_block = cmax;
            rk_err e = {0};
            ok = open_store(t, &e) == RK_OK;
            if (ok) t->cell_max = cmax;
        }
    }
    if (!ok) index_free(t); /* out of memory: nothing moves (the budget is not kept) */
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

/* Registers cells and pages that became final (rows are appended in order: growing
 * prefixes). A new cell is present. */
static void update_frozen(lr_tier *t) {
    const rk_kv_codec *c = CODEC(t->kv);
    for (int gi = 0; gi < t->n_grp; gi++) {
        gix *G = &t->gx[gi];
        int64_t nf = c->g[gi].n_rows / c->p.chunk;
        if (nf > G->n_cell) nf = G->n_cell;
        for (int64_t k = G->n_final; k < nf; k++) {
            G->c[k].present = 1;
            G->c[k].next_use = NOW(t) + 2 * (int64_t)c->n_layer; /* no use predicted */
            pin_cell(t, gi, k, +1);
            rl_add(t, (ref){gi, (int32_t)k});
        }
        G->n_final = nf > G->n_final ? nf : G->n_final;
    }
    for (int i = 0; i < t->n_arr; i++) {
        arr *A = &t->a[i];
        const uintptr_t end = (uintptr_t)A->base + frozen_bytes(t, i);
        int64_t nf = end > A->a1 ? (int64_t)((end - A->a1) / PAGE) : 0;
        if (nf > A->n_page) nf = A->n_page;
        if (nf > A->n_frozen) t->n_pages_frozen += nf - A->n_frozen, A->n_frozen = nf;
    }
}

static uint64_t resident_pages_bytes(const lr_tier *t) { return (uint64_t)(t->n_pages_frozen - t->n_pages_rel) * PAGE; }

static void update_cap(lr_tier *t) {
    rk_kv_bytes o;
    t->inner->bytes(t->kv, &o);
    const uint64_t fz = (uint64_t)t->n_pages_frozen * PAGE;
    const uint64_t fixed = o.total > fz ? o.total - fz : 0;
    if (!t->whole) t->cap = t->budget; /* the budget bounds the movable rows; the rest is fixed */
    else t->cap = t->budget > fixed ? t->budget - fixed : 0;
}

/* ---- the store ---- */

static rk_status open_store(lr_tier *t, rk_err *err) {
    rk_status st = rk_bs_renew_spill(&t->bs, t->spill_dir, &t->bp, &t->acc, err);
    if (st) rk_err_wrap(err, "kv: the KV budget cannot be kept without a spill file (spill_dir, TMPDIR)");
    return st;
}

static size_t gather_cell(lr_tier *t, ref r) {
    const rk_kv_codec *c = CODEC(t->kv);
    part *pv = t->pv;
    const int np = cell_parts(c, r.g, r.k, pv);
    size_t o = 0;
    for (int i = 0; i < np; i++) {
        memcpy(t->gather + o, t->a[pv[i].a].base + pv[i].x, pv[i].y - pv[i].x);
        o += pv[i].y - pv[i].x;
    }
    return o;
}

static void on_done(lr_tier *t, const rk_bs_done *d) {
    const ref r = {(int32_t)(d->id >> 32), (int32_t)(d->id & 0xffffffffu)};
    const int si = (int)(intptr_t)d->ud;
    if (!d->is_put && si >= 0 && si < QD) t->stage_busy[si] = false;
    if (r.g < 0 || r.g >= t->n_grp || r.k < 0 || r.k >= t->gx[r.g].n_final) return; /* from a forgotten index */
    cell *s = CL(t, r);
    if (d->is_put) {
        if (!s->put_pending) return;
        s->put_pending = 0;
        if (d->status) {
            if (!t->st.spill_errors++)
                snprintf(t->st.spill_error, sizeof t->st.spill_error, "writing to %.50s: %.90s", t->spill_dir, d->msg);
            s->sticky = 1; /* the bytes are still in memory: they stay */
            return;
        }
        s->in_store = 1;
        t->st.bytes_spilled += d->len;
    } else {
        if (!s->get_pending || s->stage != si) return;
        s->get_pending = 0, s->stage = -1;
        if (d->status) {
            if (!t->io_st) {
                t->io_st = d->status;
                snprintf(t->io_msg, sizeof t->io_msg, "%.200s", d->msg);
            }
            pin_cell(t, r.g, r.k, -1); /* the cell stays absent */
            return;
        }
        if (d->len != t->stage_len[si]) {
            if (!t->io_st) {
                t->io_st = RK_E_FORMAT;
                snprintf(t->io_msg, sizeof t->io_msg, "a spilled cell of %zu bytes where %zu were written", d->len,
                         t->stage_len[si]);
            }
            pin_cell(t, r.g, r.k, -1);
            return;
        }
        s->present = 1;
        t->n_cells_out--;
        rl_add(t, r);
        t->st.bytes_read += d->len;
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

static int free_stage(lr_tier *t) {
    for (int i = 0; i < QD; i++)
        if (!t->stage_busy[i]) return i;
    return -1;
}

/* Issues the read of an absent cell (not waiting; waits for a free buffer when block). */
static rk_status fetch(lr_tier *t, ref r, bool block, rk_err *err) {
    cell *s = CL(t, r);
    if (s->present || s->get_pending) return RK_OK;
    int si = free_stage(t);
    while (si < 0 && block && rk_bs_in_flight(t->bs)) {
        pump(t, true);
        si = free_stage(t);
    }
    if (si < 0) return block ? rk_err_set(err, RK_E_INTERNAL, "kv tier: no free read buffer") : RK_OK;
    /* the store writes the frame's bytes straight to their places; the pages are pinned
     * from now on, so that no release can take them before the read completes */
    rk_bs_iov *iov = t->iov + (size_t)si * (size_t)t->iov_per;
    part *pv = t->pv;
    const int np = cell_parts(CODEC(t->kv), r.g, r.k, pv);
    size_t len = 0;
    for (int i = 0; i < np; i++) {
        arr *A = &t->a[pv[i].a];
        iov[i] = (rk_bs_iov){A->base + pv[i].x, pv[i].y - pv[i].x};
        len += pv[i].y - pv[i].x;
        int64_t k0, k1;
        page_span(A, pv[i].x, pv[i].y, &k0, &k1);
        for (int64_t k = k0; k < k1; k++)
            if (A->rel[k]) A->rel[k] = 0, t->n_pages_rel--;
    }
    rk_status st = rk_bs_getv(t->bs, ID(r.g, r.k), iov, np, (void *)(intptr_t)si, err);
    if (st) return st;
    pin_cell(t, r.g, r.k, +1);
    t->stage_busy[si] = true;
    t->stage_len[si] = len;
    s->get_pending = 1, s->stage = (int16_t)si;
    return RK_OK;
}

static rk_status wait_list(lr_tier *t, bool count, rk_err *err) {
    const double t0 = rk_time_now();
    rk_bs_batch(t->bs, false);
    for (int64_t i = 0; i < t->n_wl;) {
        if (!CL(t, t->wl[i])->get_pending) {
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

/* Predicted next use of chunk ch of group gi after layer l's use: a later layer of the
 * group that selected it at its previous step, else the group's first layer next step. */
static int64_t predict(const lr_tier *t, int gi, int64_t ch, int l) {
    const rk_kv_codec *c = CODEC(t->kv);
    const lr_group *g = &c->g[gi];
    const int nh = c->n_head_kv;
    for (int m = l + 1; m < g->l0 + g->n_l; m++)
        for (int h = 0; h < nh; h++)
            if (t->pmark[((size_t)m * nh + h) * (size_t)c->cap_chunks + (size_t)ch])
                return (int64_t)t->step * c->n_layer + m;
    return (int64_t)(t->step + 1) * c->n_layer + g->l0;
}

/* Cell (gi, ch) is needed by this call: counted, read if absent, put on the wait list. */
static rk_status touch(lr_tier *t, int gi, int64_t ch, rk_err *err) {
    if (ch < 0 || ch >= t->gx[gi].n_final) return RK_OK; /* the open chunk never moves */
    cell *s = &t->gx[gi].c[ch];
    if (s->used_call == t->call) return RK_OK; /* counted once per call */
    s->used_call = t->call;
    s->next_use = predict(t, gi, ch, t->cur_layer);
    if (s->prefetched) t->st.prefetched++, s->prefetched = 0;
    if (s->present) {
        t->st.hits++;
        return RK_OK;
    }
    t->st.misses++;
    const ref r = {gi, (int32_t)ch};
    rk_status st = fetch(t, r, true, err);
    if (st) return st;
    if (!grow((void **)&t->wl, t->n_wl, &t->cap_wl, sizeof *t->wl))
        return rk_err_set(err, RK_E_NOMEM, "kv tier: out of memory");
    t->wl[t->n_wl++] = r;
    return RK_OK;
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
    t->sel_call = selective;
    sync_index(t);
    pump(t, false);
    if (selective || !t->n_arr) return RK_OK;
    /* every chunk of the layer's group */
    const int gi = c->ly[layer].grp;
    rk_status st = RK_OK;
    rk_bs_batch(t->bs, true);
    for (int64_t k = 0; k < t->gx[gi].n_final && !st; k++) st = touch(t, gi, k, err);
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
    const int gi = c->ly[layer].grp;
    rk_bs_batch(t->bs, true);
    for (int64_t i = 0; i < n && !st; i++) st = touch(t, gi, sel[i], err);
    /* with hysteresis decode also attends the chunks still in the key cache */
    const lr_head *H = &c->ly[layer].h[h];
    for (int k = 0; k < H->n_kc && c->p.hyst > 0 && !c->p.no_cache && !st; k++)
        if (H->kc_ch[k] >= 0) st = touch(t, gi, H->kc_ch[k], err);
    const rk_status sw = wait_list(t, true, err);
    return st ? st : sw;
}

typedef struct cand {
    int64_t d;
    ref r;
} cand;

static int by_distance(const void *a, const void *b) {
    const int64_t x = ((const cand *)a)->d, y = ((const cand *)b)->d;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int by_page(const void *a, const void *b) {
    const pref x = *(const pref *)a, y = *(const pref *)b;
    return x.a != y.a ? (x.a < y.a ? -1 : 1) : x.k < y.k ? -1 : x.k > y.k;
}

/* Releases the candidate pages still without a resident cell: one madvise per run. */
static void release_pages(lr_tier *t) {
    qsort(t->fl, (size_t)t->n_fl, sizeof *t->fl, by_page);
    for (int64_t i = 0; i < t->n_fl;) {
        const pref p = t->fl[i];
        arr *A = &t->a[p.a];
        if (A->pin[p.k] || A->rel[p.k] || p.k >= A->n_frozen) {
            i++;
            continue;
        }
        int64_t j = i + 1;
        while (j < t->n_fl && t->fl[j].a == p.a && t->fl[j].k == t->fl[j - 1].k + 1 && !A->pin[t->fl[j].k] &&
               !A->rel[t->fl[j].k])
            j++;
        madvise((void *)(A->a1 + (uintptr_t)p.k * PAGE), (size_t)(j - i) * PAGE, MADV_DONTNEED);
        for (int64_t k = i; k < j; k++) A->rel[t->fl[k].k] = 1;
        t->n_pages_rel += j - i;
        i = j;
    }
    t->n_fl = 0;
}

/* Releases cells until the resident pages fit the cap (with some slack, so that this runs
 * now and then, not at every call). Cells used by this call or in flight stay; when the
 * part that never moves is alone over the budget (cap 0) the working set (predicted
 * within PF_LAYERS calls) stays too. block: wait for the first writes of the cells
 * chosen (else they go at a later call). */
static uint64_t slack_of(const lr_tier *t) { return t->cap / 8 > 16 * PAGE ? t->cap / 8 : 16 * PAGE; }

static void evict(lr_tier *t, bool block) {
    const uint64_t res = resident_pages_bytes(t), slack = slack_of(t);
    if (t->sel_call && res > t->peak) t->peak = res; /* decode's working set (prefill makes a whole group resident) */
    if (res <= t->cap + (t->cap ? slack : 0)) return;
    const uint64_t target = t->cap > slack ? t->cap - slack : 0;
    cand *cv = malloc((size_t)(t->n_rl ? t->n_rl : 1) * sizeof *cv);
    if (!cv) return;
    const int64_t now = NOW(t), nL = CODEC(t->kv)->n_layer;
    int64_t n = 0;
    for (int64_t i = 0; i < t->n_rl; i++) {
        const cell *s = CL(t, t->rl[i]);
        if (s->used_call == t->call || s->get_pending || s->put_pending || s->sticky) continue;
        int64_t d = s->next_use - now;
        if (d < 0) d = 2 * nL - d;                    /* its predicted use passed: cold */
        else if (d <= PF_LAYERS && !t->cap) continue; /* over the budget anyway: the working set stays */
        cv[n++] = (cand){d, t->rl[i]};
    }
    if (target) qsort(cv, (size_t)n, sizeof *cv, by_distance); /* else every candidate goes: no order needed */
    /* cells never written go to the store first; released once their write completed */
    rk_err e = {0};
    int64_t m = 0;
    bool wrote = false;
    for (; m < n; m++) {
        cell *s = CL(t, cv[m].r);
        if (s->in_store) continue;
        const size_t len = gather_cell(t, cv[m].r);
        if (rk_bs_put(t->bs, ID(cv[m].r.g, cv[m].r.k), t->gather, len, (void *)(intptr_t)-1, &e)) {
            if (!t->st.spill_errors++)
                snprintf(t->st.spill_error, sizeof t->st.spill_error, "writing to %.50s: %.90s", t->spill_dir, e.msg);
            s->sticky = 1;
            continue;
        }
        s->put_pending = 1, wrote = true;
        if (!block && (uint64_t)(m + 1) * t->cell_max >= res - target) break; /* enough writes for now */
    }
    if (wrote && block)
        while (rk_bs_in_flight(t->bs)) pump(t, true);
    uint64_t r = res;
    for (int64_t i = 0; i < n && r > target; i++) {
        cell *s = CL(t, cv[i].r);
        if (!s->in_store || s->put_pending || s->sticky || !s->present) continue;
        const int64_t f0 = t->n_fl;
        s->present = 0, s->prefetched = 0;
        rl_del(t, cv[i].r);
        t->n_cells_out++;
        pin_cell(t, cv[i].r.g, cv[i].r.k, -1);
        r -= (uint64_t)(t->n_fl - f0) * PAGE < r ? (uint64_t)(t->n_fl - f0) * PAGE : r;
    }
    release_pages(t);
    free(cv);
}

/* Reads ahead the cells the next PF_LAYERS layers selected at their previous step. */
static void prefetch(lr_tier *t, rk_kv_codec *c, int layer) {
    const int nh = c->n_head_kv, nL = c->n_layer;
    rk_err e = {0};
    rk_bs_batch(t->bs, true);
    for (int j = 1; j <= PF_LAYERS && j < nL; j++) {
        const int ln = (layer + j) % nL, gi = c->ly[ln].grp;
        const int64_t when = (int64_t)(t->step + (layer + j >= nL)) * nL + ln;
        for (int h = 0; h < nh; h++) {
            const size_t po = ((size_t)ln * nh + h) * (size_t)c->cap_chunks;
            for (int64_t i = 0; i < t->pn[ln * nh + h]; i++) {
                const int64_t ch = t->plist[po + i];
                if (ch >= t->gx[gi].n_final) continue;
                cell *s = &t->gx[gi].c[ch];
                if (s->present || s->get_pending) {
                    if (s->next_use > when || s->next_use < NOW(t)) s->next_use = when;
                    continue;
                }
                if (free_stage(t) < 0) goto out; /* every buffer in flight */
                /* room: the budget plus the slack evict() keeps free below it (the cells
                 * predicted farthest ahead go at the next release) */
                if (t->cap && resident_pages_bytes(t) + t->cell_max > t->cap + slack_of(t)) goto out;
                if (fetch(t, (ref){gi, (int32_t)ch}, false, &e)) goto out;
                s->prefetched = 1;
                s->next_use = when;
            }
        }
    }
out:
    rk_bs_batch(t->bs, false);
}

void lr_tier_end(rk_kv_codec *c, int layer) {
    lr_tier *t = c->tier;
    if (!t->n_arr) return;
    pump(t, false);
    evict(t, false);
    prefetch(t, c, layer);
}

/* Reads every released cell back (before a truncation, kv_rows, an export). */
static rk_status refill_all(lr_tier *t, rk_err *err) {
    rk_status st = RK_OK;
    rk_bs_batch(t->bs, true);
    for (int gi = 0; gi < t->n_grp && !st; gi++)
        for (int64_t k = 0; k < t->gx[gi].n_final && !st; k++) {
            cell *s = &t->gx[gi].c[k];
            if (s->present) continue;
            const ref r = {gi, (int32_t)k};
            if ((st = fetch(t, r, true, err))) break;
            if (!grow((void **)&t->wl, t->n_wl, &t->cap_wl, sizeof *t->wl)) {
                st = rk_err_set(err, RK_E_NOMEM, "kv tier: out of memory");
                break;
            }
            t->wl[t->n_wl++] = r;
        }
    const rk_status sw = wait_list(t, false, err);
    return st ? st : sw;
}

static void after_op(lr_tier *t) {
    sync_index(t);
    if (!t->n_arr) return;
    t->call++;
    t->sel_call = false;
    update_cap(t);
    evict(t, true);
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
    free(t->gather), free(t->pv), free(t->iov);
    free(t->rl), free(t->wl), free(t->fl), free(t->pmark), free(t->plist), free(t->pn);
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
    const uint64_t out = (uint64_t)t->n_pages_rel * PAGE;
    o->spilled_bytes = out;
    o->resident_bytes = b.total > out ? b.total - out : 0;
    const uint64_t fz = (uint64_t)t->n_pages_frozen * PAGE;
    o->fixed_bytes = b.total > fz ? b.total - fz : 0;
    o->budget_peak = t->peak;
    o->resident_peak = t->peak;
    rk_bs_stats bs;
    rk_bs_get_stats(t->bs, &bs);
    o->bytes_read_stored = t->acc.stored_read + bs.stored_read;
    o->bytes_spilled_stored = t->acc.stored_written + bs.stored_written;
    o->io_wait_s = t->acc.wait_s + bs.wait_s;
    snprintf(o->backend, sizeof o->backend, "%s", rk_bs_backend_name(rk_bs_backend_used(t->bs)));
}

static const rk_kv_ops tier_ops = {
    .name = "lowram",
    .mem = RK_KV_MEM_HOST,
    .writable = false,
    .recordable = false,
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
        return rk_err_set(err, RK_E_INVALID_ARG,
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
    t->whole = p->budget_whole;
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
    t->bp.max_block = PAGE; /* grown to a cell's bytes once the fit sets the ranks */
    t->bp.queue_depth = QD;
    t->bp.zstd_level =
        p->spill_level > 0 ? p->spill_level : -1; /* raw frames unless asked (docs/TIERS.md: zstd does not pay here) */
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
