/* LowRAM sparse decode's key cache (lowram_task.h): per KV head the chunks chosen, their
 * hits in the key cache, the victims for the misses and the gather of the misses into the
 * head's batch area (one phase, over the pool); then the batches through the backend's
 * RK_OP_LR_KEYS and the rebuilt keys encoded into their slots (over the pool). */
#include <stdlib.h>

#include "lowram_task.h"
#include "lowram_tier.h"

/* Head h's batch area of sparse decode's key rebuild (per head, so that the heads gather over
 * the pool): coefficient rows, cos/sin rows, table rows, output rows, slots rebuilt. */
static size_t hb_rows(const rk_kv_codec *c) { return (size_t)(c->dec.bch * c->p.chunk); }
static float *hb_cf(const rk_kv_codec *c, int h) { return c->dec.bcf + (size_t)h * hb_rows(c) * (size_t)c->r_max; }
static float *hb_kb(const rk_kv_codec *c, int h) { return c->dec.bkb + (size_t)h * hb_rows(c) * (size_t)c->hd; }
static float *hb_cs(const rk_kv_codec *c, int h) {
    return c->dec.bcs + (size_t)h * hb_rows(c) * (size_t)(c->n_rot > 0 ? c->n_rot : 1);
}
static int32_t *hb_pos(const rk_kv_codec *c, int h) { return c->dec.bpos + (size_t)h * hb_rows(c); }
static int32_t *hb_miss(const rk_kv_codec *c, int h) { return c->dec.bmiss + (size_t)h * (size_t)c->dec.bch; }

/* n floats into f16 (round to nearest even, as rk_f32_to_f16) */
static void store_f16(const float *src, uint16_t *dst, int64_t n, bool avx2) {
#ifdef RK_HAVE_AVX2
    if (avx2) {
        lr_store_f16_avx2(src, dst, n);
        return;
    }
#endif
    (void)avx2;
    for (int64_t i = 0; i < n; i++) dst[i] = rk_f32_to_f16(src[i]);
}

/* The rebuilt keys of head h's batch (hb_kb, gathering order) into their key-cache slots
 * (q8_0 or f16): the misses m with m % nt == tid. */
static void keys_encode(rk_kv_codec *c, const lr_layer *L, int h, int tid, int nt, bool avx2) {
    const lr_head *H = &L->h[h];
    const int hd = c->hd, C = c->p.chunk, n_miss = c->dec.hq[h].n_miss;
    const int32_t *miss = hb_miss(c, h);
    const float *kb = hb_kb(c, h);
    int64_t r0 = 0;
    for (int m = 0; m < n_miss; m++) {
        const int s = miss[m], nb = H->kc_rows[s];
        if (m % nt == tid) {
            uint8_t *dst = H->kc + (size_t)s * C * c->kc_row;
            if (c->p.kc_type == RK_DT_Q8_0)
                for (int k = 0; k < nb; k++)
                    lr_encode_row(RK_DT_Q8_0, (float *)kb + (size_t)(r0 + k) * hd, hd, dst + (size_t)k * c->kc_row);
            else store_f16(kb + (size_t)r0 * hd, (uint16_t *)dst, (int64_t)nb * hd, avx2);
        }
        r0 += nb;
    }
}

/* One batch of sparse decode's key rebuild: the rows gathered in head h's batch area run
 * through the backend's RK_OP_LR_KEYS (its threads); encode: into their key-cache slots now
 * (else the caller encodes them over the pool). */
static rk_status keys_batch(rk_kv_codec *c, const lr_group *g, const lr_layer *L, int h, int kr, int r, bool encode,
                            bool avx2, rk_err *err) {
    const int hd = c->hd;
    const int64_t rows = c->dec.hq[h].rows;
    const size_t off = (size_t)L->li * c->kvd + (size_t)h * hd, el = c->wide ? 4 : 2;
    memcpy(c->dec.bmw, g->mean + off, (size_t)hd * sizeof(float));
    memcpy(c->dec.bmw + hd, g->winv + off, (size_t)hd * sizeof(float));
    rk_op_args a = {
        .op = RK_OP_LR_KEYS,
        .dst = {RK_DT_F32, {hd, rows}, (size_t)hd * sizeof(float), hb_kb(c, h)},
        .src0 = {RK_DT_F32, {kr, rows}, (size_t)r * sizeof(float), hb_cf(c, h)},
        .src1 = {c->wide ? RK_DT_F32 : RK_DT_F16, {hd, kr}, (size_t)g->D * el, (uint8_t *)g->basis + off * el},
        .src2 = {RK_DT_F32, {hd, 2}, (size_t)hd * sizeof(float), c->dec.bmw},
        .ids = hb_pos(c, h),
        .rope = c->rope, /* its angles; the rotation only (the codec's keys carry mscale) */
        .lr_rope_cs = hb_cs(c, h),
        .lr_rope_rows = rows};
    rk_status st = rk_backend_run(c->be, &a, err);
    if (st != RK_OK) return st;
    if (encode) keys_encode(c, L, h, 0, 1, avx2);
    c->scr[0].n_rebuilt += (uint64_t)rows;
    return RK_OK;
}

/* Gathers head h's missing chosen chunks from hq->next_i on into its batch area, each into
 * the next victim slot, until the area is full (hq->next_i: where it stopped; n: done).
 * False when no slot is left (hq->slot_err). */
static bool keys_gather(rk_kv_codec *c, const lr_group *g, lr_head *H, int h, int64_t n) {
    struct lr_hq *hq = &c->dec.hq[h];
    const int C = c->p.chunk, r = g->r;
    const size_t o = (size_t)h * (size_t)c->cap_chunks;
    const int32_t *sel = c->dec.sel + o;
    int32_t *slot = c->dec.slot + o, *bpos = hb_pos(c, h), *miss = hb_miss(c, h);
    const struct lr_vic *vic = c->dec.vic + (size_t)h * c->dec.vic_cap;
    float *cf = hb_cf(c, h), *cs = hb_cs(c, h);
    const int64_t cap = c->dec.bch * C; /* a full layer's misses can take several batches */
    hq->rows = 0, hq->n_miss = 0;
    for (int64_t i = hq->next_i; i < n; i++) {
        if (slot[i] >= 0) continue;
        const int64_t ch = sel[i];
        const int nb = g->n_rows - ch * C < C ? (int)(g->n_rows - ch * C) : C;
        if (hq->next >= hq->n_vic) {
            hq->slot_err = 1, hq->next_i = n;
            return false;
        }
        if (hq->rows + nb > cap) {
            hq->next_i = i;
            return true;
        }
        const int s = vic[hq->next++].k;
        H->kc_ch[s] = (int32_t)ch, H->kc_rows[s] = nb, H->kc_epoch[s] = c->epoch;
        lr_coef_rows(c, g, ch * C, nb, cf + (size_t)hq->rows * r);
        for (int k = 0; k < nb; k++) { /* the op reads row k's angles at table row bpos[k] = k */
            lr_rope_cs(c, g->pos[ch * C + k], cs + (size_t)(hq->rows + k) * c->n_rot);
            bpos[hq->rows + k] = (int32_t)(hq->rows + k);
        }
        miss[hq->n_miss++] = s;
        hq->rows += nb;
        H->kc_used[s] = c->n_calls;
        slot[i] = s;
    }
    hq->next_i = n;
    return true;
}

static int cmp_vic(const void *a, const void *b) {
    const struct lr_vic *u = a, *v = b;
    if (u->v != v->v) return u->v < v->v ? -1 : 1;
    if (u->used != v->used) return u->used < v->used ? -1 : 1;
    return (u->k > v->k) - (u->k < v->k);
}

/* Sparse decode, second step: head h chooses its chunks (x: the thread's scratch, kmap: the
 * thread's chunk -> slot map), finds them in the key cache, orders the victims for the misses
 * and gathers the first batch of them. */
static rk_status head_choose(rk_kv_codec *c, int layer, int h, lr_scratch *x, int32_t *kmap, const float *q, int ns,
                             int64_t pos0, bool avx2, const float *qdot, const float *pre, rk_err *err) {
    const lr_group *g = &c->g[c->ly[layer].grp];
    const int grp = c->n_head / c->n_head_kv, C = c->p.chunk;
    const int64_t n_ch = (g->n_rows + C - 1) / C;
    head_task t = {.c = c,
                   .x = x,
                   .l = layer,
                   .h = h,
                   .grp = grp,
                   .ns = ns,
                   .pos0 = pos0,
                   .q = q,
                   .sparse = true,
                   .use_c = !c->p.values_exact,
                   .n_part = 1,
                   .qdot = qdot,
                   .pre = pre};
    int64_t n;
#ifdef RK_HAVE_AVX2
    if (avx2) n = c->p.topp > 0 ? lr_select_topp_avx2(&t, n_ch) : lr_select_chunks_avx2(&t, n_ch);
    else
#endif
        n = c->p.topp > 0 ? lr_select_topp(&t, n_ch) : lr_select_chunks(&t, n_ch);
    const size_t o = (size_t)h * (size_t)c->cap_chunks;
    int32_t *sel = c->dec.sel + o, *slot = c->dec.slot + o;
    memcpy(sel, x->sel, (size_t)n * sizeof *sel);
    c->dec.n_sel[h] = n;
    struct lr_hq *hq = &c->dec.hq[h];
    *hq = (struct lr_hq){0};
    if (c->tier) { /* lowram_tier.c: the selected chunks' rows resident before they are read (serial) */
        rk_status ts = lr_tier_need(c, layer, h, sel, n, err);
        if (ts) return ts;
    }
    lr_head *H = &c->ly[layer].h[h];
    /* first the hits (so that no chosen chunk is evicted by another one's miss), through a
     * chunk -> slot map (kmap, -1 outside this block): O(chosen + slots), not their product;
     * of two slots holding the same valid chunk the lower one, as a scan would find */
    if (!c->p.no_cache) {
        for (int k = H->n_kc - 1; k >= 0; k--)
            if (kc_valid(c, g, H, k, n_ch)) kmap[H->kc_ch[k]] = k;
        for (int64_t i = 0; i < n; i++)
            if ((slot[i] = kmap[sel[i]]) >= 0) H->kc_used[slot[i]] = c->n_calls;
        for (int k = 0; k < H->n_kc; k++)
            if (H->kc_ch[k] >= 0 && H->kc_ch[k] < c->cap_chunks) kmap[H->kc_ch[k]] = -1;
    } else {
        for (int64_t i = 0; i < n; i++) slot[i] = -1;
    }
    /* then the misses, each over an empty or stale slot, else over the unchosen cached chunk
     * of the lowest score now (x->csc: this head's scores from the selection); the victims
     * in that order (score, then least recently used, then slot) sorted once */
    struct lr_vic *vic = c->dec.vic + (size_t)h * c->dec.vic_cap;
    for (int64_t i = 0; i < n && !hq->n_vic; i++) {
        if (slot[i] >= 0) continue;
        for (int k = 0; k < H->n_kc; k++) {
            if (H->kc_used[k] == c->n_calls) continue;
            const float v = c->p.topp > 0 || n >= n_ch || !kc_valid(c, g, H, k, n_ch) ? -INFINITY : x->csc[H->kc_ch[k]];
            vic[hq->n_vic++] = (struct lr_vic){v, H->kc_used[k], k};
        }
        qsort(vic, (size_t)hq->n_vic, sizeof *vic, cmp_vic);
        if (!hq->n_vic) hq->n_vic = -1;
    }
    keys_gather(c, g, H, h, n);
    return RK_OK;
}

typedef struct choose_job {
    rk_kv_codec *c;
    int l, ns;
    int64_t pos0;
    const float *q;
    bool avx2;
    const float *qdot, *pre; /* c->dec.qdot / c->dec.score or NULL */
    size_t qd_head;
    rk_err *err; /* serial runs only (a tier's reads) */
    rk_status st;
} choose_job;

static void choose_worker(void *vp, int tid, int nt) {
    choose_job *a = vp;
    rk_kv_codec *c = a->c;
    for (int h = tid; h < c->n_head_kv; h += nt) {
        rk_status st = head_choose(c, a->l, h, &c->scr[tid], c->dec.kmap + (size_t)tid * (size_t)c->cap_chunks, a->q,
                                   a->ns, a->pos0, a->avx2, a->qdot ? a->qdot + (size_t)h * a->qd_head : NULL,
                                   a->pre ? a->pre + (size_t)h * (size_t)c->cap_chunks : NULL, a->err);
        if (st) a->st = st;
    }
}

typedef struct encode_job {
    rk_kv_codec *c;
    const lr_layer *L;
    bool avx2;
} encode_job;

static void encode_worker(void *vp, int tid, int nt) {
    encode_job *a = vp;
    for (int h = 0; h < a->c->n_head_kv; h++)
        if (a->c->dec.hq[h].rows) keys_encode(a->c, a->L, h, tid, nt, a->avx2);
}

rk_status lr_keys_choose(rk_kv_codec *c, int layer, int ns, int64_t pos0, const float *q, bool avx2, const float *qdot,
                         size_t qd_head, const float *pre, rk_err *err) {
    choose_job cj = {c, layer, ns, pos0, q, avx2, qdot, pre, qd_head, NULL, RK_OK};
    if (c->pool && !c->tier && c->n_head_kv > 1) rk_pool_run(c->pool, choose_worker, &cj);
    else cj.err = err, choose_worker(&cj, 0, 1);
    return cj.st;
}

rk_status lr_keys_rebuild(rk_kv_codec *c, int layer, bool avx2, rk_err *err) {
    const lr_layer *L = &c->ly[layer];
    const lr_group *g = &c->g[L->grp];
    const int C = c->p.chunk, r = g->r;
    const int kr = c->p.key_rank > 0 && c->p.key_rank < r ? c->p.key_rank : r;
    const int64_t n_ch = (g->n_rows + C - 1) / C;
    int64_t rebuilt = 0;
    for (int h = 0; h < c->n_head_kv; h++) {
        lr_head *H = &c->ly[layer].h[h];
        struct lr_hq *hq = &c->dec.hq[h];
        const int64_t n = c->dec.n_sel[h];
        for (;;) {
            if (hq->slot_err) return rk_err_set(err, RK_E_INTERNAL, "lowram: no free key-cache slot (%d)", H->n_kc);
            if (hq->rows) {
                rk_status st = keys_batch(c, g, L, h, kr, r, hq->next_i < n, avx2, err);
                if (st != RK_OK) return st;
            }
            if (hq->next_i >= n) break;
            keys_gather(c, g, H, h, n); /* a full layer's misses past one batch */
        }
        rebuilt += hq->rows;
        /* with hyst: every other chunk still valid in the cache is attended exactly too (its
         * keys cost nothing now; it replaces that chunk's summary row). Like the hysteresis
         * itself this makes a step depend on the cache's history, not only on the stored rows
         * (an imported state or a replay after truncation may decode slightly differently). */
        const size_t o = (size_t)h * (size_t)c->cap_chunks;
        int32_t *sel = c->dec.sel + o, *slot = c->dec.slot + o;
        for (int k = 0; k < H->n_kc && !c->p.no_cache && c->p.hyst > 0; k++) {
            if (H->kc_used[k] == c->n_calls || !kc_valid(c, g, H, k, n_ch)) continue;
            sel[c->dec.n_sel[h]] = H->kc_ch[k], slot[c->dec.n_sel[h]] = k;
            c->dec.n_sel[h]++;
        }
    }
    /* the last batch of every head into its slots */
    if (rebuilt) {
        encode_job ej = {c, L, avx2};
        if (c->pool && rebuilt >= 2 * C) rk_pool_run(c->pool, encode_worker, &ej);
        else encode_worker(&ej, 0, 1);
    }
    return RK_OK;
}
