/* LowRAM's per-thread work areas (lowram_impl.h: lr_scratch, lr_cwork), decode's key cache
 * and the batch of the LR_KEYS op: sized for the fitted ranks, allocated after the fit. */
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "rk_kernels.h"

static void cwork_free(rk_kv_codec *c) {
    for (int t = 0; c->cw && t < c->n_threads; t++) {
        lr_cwork *w = &c->cw[t];
        free(w->B), free(w->W), free(w->x), free(w->cf), free(w->v), free(w->vh), free(w->e2), free(w->crow),
            free(w->enc);
        free((void *)w->res);
    }
    free(c->cw);
    c->cw = NULL;
}

/* Compression work areas: f32 copies of one group's basis and predictors, row buffers. */
static bool cwork_alloc(rk_kv_codec *c, size_t *bytes) {
    const size_t R = (size_t)c->r_max, D = (size_t)c->D_max, G = (size_t)c->p.group, kvd = (size_t)c->kvd;
    const size_t nh = (size_t)c->n_head_kv;
    c->cw = calloc((size_t)c->n_threads, sizeof *c->cw);
    if (!c->cw) return false;
    for (int t = 0; t < c->n_threads; t++) {
        lr_cwork *w = &c->cw[t];
        w->B = malloc(R * D * sizeof(float));
        w->W = malloc(G * R * kvd * sizeof(float));
        w->x = malloc(LR_BLOCK * D * sizeof(float));
        w->cf = malloc(LR_BLOCK * R * sizeof(float));
        w->v = malloc(LR_BLOCK * kvd * sizeof(float));
        w->vh = malloc(LR_BLOCK * kvd * sizeof(float));
        w->e2 = malloc(LR_BLOCK * G * nh * sizeof(float));
        w->crow = malloc(LR_BLOCK * (4 * R + 2));
        w->enc = malloc(LR_BLOCK * G * nh * c->res_bytes);
        w->res = malloc(G * nh * sizeof *w->res);
        if (!w->B || !w->W || !w->x || !w->cf || !w->v || !w->vh || !w->e2 || !w->crow || !w->enc || !w->res)
            return false;
    }
    *bytes = (size_t)c->n_threads * ((R * D + G * R * kvd + LR_BLOCK * (D + R + 2 * kvd + G * nh)) * sizeof(float) +
                                     LR_BLOCK * (4 * R + 2 + G * nh * c->res_bytes) + G * nh * sizeof(void *));
    return true;
}

static void kcache_free(rk_kv_codec *c) {
    for (int l = 0; c->ly && l < c->n_layer; l++)
        for (int h = 0; c->ly[l].h && h < c->n_head_kv; h++) {
            lr_head *H = &c->ly[l].h[h];
            free(H->kc_ch), free(H->kc_rows), free(H->kc_epoch), free(H->kc_used), free(H->kc);
            H->kc_ch = H->kc_rows = NULL, H->kc_epoch = H->kc_used = NULL, H->kc = NULL, H->n_kc = 0;
        }
}

/* Decode's key cache: per (layer, KV head) room for the layer's budget in chunks and c->kc_spare more. */
static bool kcache_alloc(rk_kv_codec *c) {
    if (c->p.dense) return true;
    const size_t rows = (size_t)c->p.chunk * c->kc_row;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head_kv; h++) {
            const int n = (int)lr_n_sel(c, l) + c->kc_spare;
            lr_head *H = &c->ly[l].h[h];
            H->kc_ch = malloc((size_t)n * sizeof(int32_t));
            H->kc_rows = malloc((size_t)n * sizeof(int32_t));
            H->kc_epoch = calloc((size_t)n, sizeof(uint32_t));
            H->kc_used = calloc((size_t)n, sizeof(uint32_t));
            H->kc = malloc((size_t)n * rows);
            if (!H->kc_ch || !H->kc_rows || !H->kc_epoch || !H->kc_used || !H->kc) return false;
            for (int i = 0; i < n; i++) H->kc_ch[i] = -1;
            H->n_kc = n;
        }
    return true;
}

void lr_scratch_free(rk_kv_codec *c) {
    cwork_free(c);
    kcache_free(c);
    if (!c->scr) return;
    for (int t = 0; t < c->n_threads; t++) {
        lr_scratch *x = &c->scr[t];
        free(x->kb), free(x->vb), free(x->cf), free(x->sc), free(x->st_m), free(x->st_l), free(x->st_a);
        free(x->acc_v), free(x->acc_c), free(x->row), free(x->sel), free(x->csc), free(x->csc2), free(x->mark);
        free(x->bias), free(x->bsl), free(x->wsl), free(x->pm), free(x->ord), free(x->spr), free(x->ccs);
    }
    free(c->scr);
    c->scr = NULL;
    free(c->dec.kmap), free(c->dec.vic), free(c->dec.hq), c->dec.kmap = NULL, c->dec.vic = NULL, c->dec.hq = NULL;
    free(c->dec.sel), free(c->dec.slot), free(c->dec.n_sel), free(c->dec.bcf), free(c->dec.bkb), free(c->dec.bmw);
    free(c->dec.bpos), free(c->dec.bmiss), free(c->dec.bcs);
    c->dec.sel = c->dec.slot = NULL, c->dec.n_sel = NULL, c->dec.bcf = c->dec.bkb = c->dec.bmw = c->dec.bcs = NULL;
    c->dec.bpos = c->dec.bmiss = NULL;
    free(c->dec.parts), c->dec.parts = NULL;
    free(c->dec.qdot), c->dec.qdot = NULL;
    free(c->dec.score), c->dec.score = NULL;
    c->dec.keys_op = false;
    c->scratch_bytes = 0;
}

rk_status lr_scratch_alloc(rk_kv_codec *c, rk_err *err) {
    lr_scratch_free(c);
    c->r_max = 1;
    for (int gi = 0; gi < c->n_group; gi++) c->r_max = c->g[gi].r > c->r_max ? c->g[gi].r : c->r_max;
    c->scr = calloc((size_t)c->n_threads, sizeof *c->scr);
    if (!c->scr) return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for scratch");
    const size_t C = (size_t)c->p.chunk, hd = (size_t)c->hd, ns = (size_t)LR_TILE * (c->n_head / c->n_head_kv);
    c->sc_ld = c->p.chunk < LR_RUN ? LR_RUN : c->p.chunk;
    const size_t SL = (size_t)c->sc_ld;
    const size_t R = (size_t)c->r_max, nch = (size_t)c->cap_chunks;
    size_t floats = 2 * SL * hd + C * R + ns * SL + 3 * ns + ns * hd + ns * R + hd + 2 * nch + C + 2 * R * hd;
    for (int t = 0; t < c->n_threads; t++) {
        lr_scratch *x = &c->scr[t];
        x->kb = malloc(SL * hd * sizeof(float));
        x->vb = malloc(SL * hd * sizeof(float));
        x->cf = malloc(C * R * sizeof(float));
        x->sc = malloc(ns * SL * sizeof(float));
        x->st_m = malloc(ns * sizeof(float));
        x->st_l = malloc(ns * sizeof(float));
        x->st_a = malloc(ns * sizeof(float));
        x->acc_v = malloc(ns * hd * sizeof(float));
        x->acc_c = malloc(ns * R * sizeof(float));
        x->row = malloc(hd * sizeof(float));
        x->sel = malloc(nch * sizeof(int32_t));
        x->csc = malloc(nch * sizeof(float));
        x->csc2 = malloc(nch * sizeof(float));
        x->mark = malloc(nch);
        x->bias = malloc(C * sizeof(float));
        x->bsl = malloc(R * hd * sizeof(float));
        x->wsl = malloc(R * hd * sizeof(float));
        x->pm = malloc((size_t)LR_SPARSE_MAX_Q * (size_t)(c->n_head / c->n_head_kv) * nch * sizeof(float));
        x->ord = malloc(nch * sizeof *x->ord);
        x->ccs = malloc(2 * nch * sizeof(float));
        x->spr = malloc(((size_t)LR_SPARSE_MAX_Q * (size_t)(c->n_head / c->n_head_kv) + 2) * hd * sizeof(float));
        if (!x->ccs || !x->spr || !x->pm || !x->ord || !x->bsl || !x->wsl || !x->mark || !x->bias || !x->kb || !x->vb ||
            !x->cf || !x->sc || !x->st_m || !x->st_l || !x->st_a || !x->acc_v || !x->acc_c || !x->row || !x->sel ||
            !x->csc || !x->csc2) {
            lr_scratch_free(c);
            return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for scratch");
        }
    }
    floats += 2 * nch + (size_t)LR_SPARSE_MAX_Q * (size_t)(c->n_head / c->n_head_kv) * nch + 2 * nch +
              ((size_t)LR_SPARSE_MAX_Q * (size_t)(c->n_head / c->n_head_kv) + 2) * hd;
    size_t cw_bytes = 0;
    c->kc_spare = lr_kc_spare(c);
    if (!cwork_alloc(c, &cw_bytes) || !kcache_alloc(c)) {
        lr_scratch_free(c);
        return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for scratch");
    }
    /* sparse decode through the backend's LR_KEYS: per-head choices and one batch of rows */
    size_t dec_bytes = 0;
    rk_op kop = RK_OP_LR_KEYS;
    const rk_view probe = {RK_DT_F32, {1, 1}, 4, NULL};
    const rk_op_args pa = {.op = RK_OP_LR_KEYS,
                           .dst = probe,
                           .src0 = probe,
                           .src2 = probe,
                           .src1 = {c->wide ? RK_DT_F32 : RK_DT_F16, {1, 1}, 4, NULL}};
    if (!c->p.dense && c->be && !c->be->ops->mem_alloc && rk_backend_check_ops(c->be, &kop, 1, NULL) == RK_OK &&
        (!c->be->ops->supports || c->be->ops->supports(c->be, &pa))) {
        const size_t hk = (size_t)c->n_head_kv, ms = (size_t)lr_n_sel_max(c), bs = (size_t)lr_batch_chunks(c);
        c->dec.bch = (int64_t)bs;
        c->dec.sel = malloc(hk * nch * sizeof(int32_t));
        c->dec.slot = malloc(hk * nch * sizeof(int32_t));
        c->dec.n_sel = calloc(hk, sizeof(int64_t));
        /* one batch area per KV head (the heads choose and gather over the pool), one chunk
         * -> slot map per thread */
        const size_t nt = (size_t)c->n_threads, vc = ms + (size_t)c->kc_spare;
        c->dec.bcf = malloc(hk * bs * C * R * sizeof(float));
        c->dec.bkb = malloc(hk * bs * C * hd * sizeof(float));
        c->dec.bmw = malloc(2 * hd * sizeof(float));
        c->dec.bpos = malloc(hk * bs * C * sizeof(int32_t));
        c->dec.bcs = malloc(hk * bs * C * (size_t)(c->n_rot > 0 ? c->n_rot : 1) * sizeof(float));
        c->dec.bmiss = malloc(hk * bs * sizeof(int32_t));
        c->dec.kmap = malloc(nt * nch * sizeof(int32_t));
        c->dec.vic_cap = vc;
        c->dec.vic = malloc(hk * vc * sizeof *c->dec.vic);
        c->dec.hq = calloc(hk, sizeof *c->dec.hq);
        for (size_t i = 0; c->dec.kmap && i < nt * nch; i++) c->dec.kmap[i] = -1;
        if (!c->dec.kmap || !c->dec.vic || !c->dec.hq || !c->dec.sel || !c->dec.slot || !c->dec.n_sel || !c->dec.bcf ||
            !c->dec.bkb || !c->dec.bmw || !c->dec.bpos || !c->dec.bmiss || !c->dec.bcs) {
            lr_scratch_free(c);
            return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory for scratch");
        }
        c->dec.keys_op = true;
        dec_bytes = hk * nch * (2 * sizeof(int32_t)) + nt * nch * sizeof(int32_t) + hk * vc * sizeof *c->dec.vic +
                    hk * (8 + sizeof *c->dec.hq) + hk * bs * C * (R + hd + 1 + (size_t)c->n_rot) * sizeof(float) +
                    hk * bs * 4 + 8 * hd;
    }
    c->scratch_bytes =
        (size_t)c->n_threads * (floats * sizeof(float) + nch * (sizeof(int32_t) + 1)) + cw_bytes + dec_bytes;
    return RK_OK;
}
