/* LowRAM attention over the compressed cache (lr_attention): the work of a layer as head
 * tasks over the pool. Decode (sparse) runs in phases: the landmark scores of every chunk,
 * the per-head choice and key rebuild (lowram_keys.c), then attention; longer evals and
 * dense mode attend every chunk in query tiles. The tasks' code is built per ISA
 * (lowram_task.h) and chosen here after rk_cpu_has_avx2() (c->isa_base: the baseline). */
#include <stdlib.h>

#include "lowram_task.h"
#include "lowram_tier.h"

static void head_run(head_task *t, bool avx2) {
#ifdef RK_HAVE_AVX2
    if (avx2) {
        lr_head_run_avx2(t);
        return;
    }
#endif
    (void)avx2;
    lr_head_run(t);
}

typedef struct attn_job {
    rk_kv_codec *c;
    int l;
    const float *q;
    int64_t n_q, pos0, n_tiles, tile;
    float *out;
    bool sparse, avx2;
} attn_job;

static void attn_worker(void *vp, int tid, int nt) {
    attn_job *a = vp;
    rk_kv_codec *c = a->c;
    const int grp = c->n_head / c->n_head_kv;
    const int64_t n_items = a->n_tiles * c->n_head_kv;
    for (int64_t it = tid; it < n_items; it += nt) {
        const int64_t tile = it / c->n_head_kv, i0 = tile * a->tile;
        const int64_t ni = a->n_q - i0 < a->tile ? a->n_q - i0 : a->tile;
        head_task t = {.c = c,
                       .x = &c->scr[tid],
                       .l = a->l,
                       .h = (int)(it % c->n_head_kv),
                       .grp = grp,
                       .ns = (int)(ni * grp),
                       .i0 = i0,
                       .pos0 = a->pos0 + i0,
                       .q = a->q,
                       .out = a->out,
                       .sparse = a->sparse,
                       .use_c = !c->p.values_exact,
                       .n_part = 1};
        head_run(&t, a->avx2);
    }
}

typedef struct dec_job {
    rk_kv_codec *c;
    int l;
    const float *q;
    int64_t n_q, pos0;
    float *out;
    bool avx2, vsum;
    int n_part;        /* > 1: each head's rows in n_part tasks (balance over the threads) */
    float *pout;       /* (n_head_kv * n_part, ns, head_dim + 2) their states */
    const float *qdot; /* per head (qd_head floats apart) the selection's landmark dots, or NULL */
    size_t qd_head;
} dec_job;

/* Sparse decode, second phase: every KV head attends its preselected, rebuilt chunks. */
static void dec_worker(void *vp, int tid, int nt) {
    dec_job *a = vp;
    rk_kv_codec *c = a->c;
    const int grp = c->n_head / c->n_head_kv;
    const int np = a->n_part > 1 ? a->n_part : 1, ns = (int)(a->n_q * grp);
    for (int it = tid; it < c->n_head_kv * np; it += nt) {
        const int h = it / np;
        const size_t o = (size_t)h * (size_t)c->cap_chunks;
        head_task t = {.c = c,
                       .x = &c->scr[tid],
                       .l = a->l,
                       .h = h,
                       .grp = grp,
                       .ns = ns,
                       .pos0 = a->pos0,
                       .q = a->q,
                       .out = a->out,
                       .sparse = true,
                       .use_c = !c->p.values_exact,
                       .sel = c->dec.sel + o,
                       .slot = c->dec.slot + o,
                       .n_sel = c->dec.n_sel[h],
                       .vsum = a->vsum,
                       .n_part = 1,
                       .qdot = a->qdot ? a->qdot + (size_t)h * a->qd_head : NULL};
        if (np > 1) t.part = it % np, t.n_part = np, t.pout = a->pout + (size_t)it * ns * (c->hd + 2);
        head_run(&t, a->avx2);
    }
}

/* Sparse decode, first phase: the landmark scores of every (KV head, share of its chunks)
 * over the pool. Scoring is most of the selection, and as whole heads it would leave a thread
 * idle (3 KV heads on 2 threads); the scores are the ones lr_select_chunks would compute, so
 * the choice does not depend on the split. */
typedef struct score_job {
    rk_kv_codec *c;
    int l, grp, ns, n_part;
    int64_t n_ch, pos0;
    const float *q;
    bool avx2;
    float *qdot; /* c->dec.qdot (per head qd_head floats apart) or NULL */
    size_t qd_head;
} score_job;

static void score_worker(void *vp, int tid, int nt) {
    score_job *a = vp;
    rk_kv_codec *c = a->c;
    for (int it = tid; it < c->n_head_kv * a->n_part; it += nt) {
        const int h = it / a->n_part, p = it % a->n_part;
        const head_task t = {.c = c,
                             .x = &c->scr[tid],
                             .l = a->l,
                             .h = h,
                             .grp = a->grp,
                             .ns = a->ns,
                             .pos0 = a->pos0,
                             .q = a->q,
                             .sparse = true,
                             .use_c = !c->p.values_exact,
                             .n_part = 1,
                             .qdot = a->qdot ? a->qdot + (size_t)h * a->qd_head : NULL};
        const int64_t lo = a->n_ch * p / a->n_part, hi = a->n_ch * (p + 1) / a->n_part;
        float *out = c->dec.score + (size_t)h * (size_t)c->cap_chunks;
#ifdef RK_HAVE_AVX2
        if (a->avx2) {
            lr_score_range_avx2(&t, lo, hi, a->n_ch, out);
            continue;
        }
#endif
        lr_score_range(&t, lo, hi, a->n_ch, out);
    }
}

/* Tasks per KV head so that the tasks divide over the threads (at most 4; 1 when they
 * already do or there are few chunks to share). */
static int head_parts(int n_head_kv, int nthr, int64_t n_items, int64_t min_items) {
    if (nthr <= 1 || n_head_kv % nthr == 0 || n_items < 2 * min_items) return 1;
    int a = n_head_kv, b = nthr;
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    const int np = nthr / a;
    return np > 4 ? 4 : np;
}

/* Sparse decode (<= LR_SPARSE_MAX_Q query rows): landmark scores (over the pool); per KV head
 * (over the pool) the chosen chunks, their key-cache slots and the misses gathered; the
 * misses rebuilt by RK_OP_LR_KEYS on the backend (its threads) and encoded into their slots
 * (over the pool) (lowram_keys.c); then attention (heads over the pool). */
static rk_status sparse_decode(rk_kv_codec *c, int layer, const float *q, int64_t n_q, int64_t pos0, float *out,
                               rk_err *err) {
    const lr_group *g = &c->g[c->ly[layer].grp];
    const int grp = c->n_head / c->n_head_kv, C = c->p.chunk, hd = c->hd;
    const int64_t n_ch = (g->n_rows + C - 1) / C;
    const bool avx2 = !c->isa_base && rk_cpu_has_avx2();
    /* unselected chunks in value space (the summaries are built once per chunk), scored with
     * the selection's landmark dot products */
    const int ns = (int)(n_q * grp);
    const bool vsum = !c->wide && !c->p.values_exact && !c->p.no_summary && !c->p.coef_summary && ns <= LR_WMAX &&
                      lr_vsum_update(c, layer);
    const size_t qd_head = (size_t)LR_SPARSE_MAX_Q * grp * (size_t)c->cap_chunks;
    /* (two-level selection scores only some chunks: the summaries convert their own landmarks) */
    const bool sel_dots = vsum && c->p.topp <= 0 && !c->p.bound && !c->p.coarse;
    if (sel_dots && !c->dec.qdot) c->dec.qdot = malloc((size_t)c->n_head_kv * qd_head * sizeof(float));
    const bool qdot = sel_dots && c->dec.qdot;
    const int nthr = c->pool ? rk_pool_size(c->pool) : 1;
    /* the one-level landmark scores over the pool first (top-p, two-level and spread score
     * inside the selection, head by head) */
    const int64_t n_sel = lr_n_sel(c, layer);
    bool pre = c->p.topp <= 0 && c->p.coarse <= 1 && c->p.spread <= 0 && n_sel < n_ch;
    if (pre && !c->dec.score) {
        c->dec.score = malloc((size_t)c->n_head_kv * (size_t)c->cap_chunks * sizeof(float));
        if (c->dec.score) c->scratch_bytes += (size_t)c->n_head_kv * (size_t)c->cap_chunks * sizeof(float);
    }
    if ((pre = pre && c->dec.score)) {
        score_job sj = {c,      layer, grp, ns,   head_parts(c->n_head_kv, nthr, n_ch, 16),
                        n_ch,   pos0,  q,   avx2, qdot ? c->dec.qdot : NULL,
                        qd_head};
        if (c->pool) rk_pool_run(c->pool, score_worker, &sj);
        else score_worker(&sj, 0, 1);
    }
    /* choices and misses per head (over the pool, except under a tier: its reads), then the
     * misses rebuilt and encoded into their slots */
    rk_status st =
        lr_keys_choose(c, layer, ns, pos0, q, avx2, qdot ? c->dec.qdot : NULL, qd_head, pre ? c->dec.score : NULL, err);
    if (st == RK_OK) st = lr_keys_rebuild(c, layer, avx2, err);
    if (st != RK_OK) return st;
    /* heads that do not divide over the threads are split into parts (3 KV heads on 2
     * threads: 6 tasks, each a contiguous share of the head's chosen chunks), merged here */
    int np = ns < LR_VREBUILD_MIN ? head_parts(c->n_head_kv, nthr, 1, 0) : 1;
    if (np > 1 && !c->dec.parts) c->dec.parts = malloc((size_t)c->n_head_kv * 4 * LR_WMAX * (hd + 2) * sizeof(float));
    if (!c->dec.parts) np = 1;
    dec_job d = {c, layer, q, n_q, pos0, out, avx2, vsum, np, c->dec.parts, qdot ? c->dec.qdot : NULL, qd_head};
    if (c->pool) rk_pool_run(c->pool, dec_worker, &d);
    else dec_worker(&d, 0, 1);
    if (np > 1) { /* log-sum-exp merge of each head's parts */
        const int qd = c->n_head * hd;
        for (int h = 0; h < c->n_head_kv; h++)
            for (int j = 0; j < ns; j++) {
                float m = -INFINITY;
                for (int p = 0; p < np; p++) {
                    const float mp = c->dec.parts[((size_t)(h * np + p) * ns + j) * (hd + 2) + hd];
                    m = mp > m ? mp : m;
                }
                float *o = out + (size_t)(j / grp) * qd + (size_t)(h * grp + j % grp) * hd, l = 0;
                for (int e = 0; e < hd; e++) o[e] = 0;
                for (int p = 0; p < np; p++) {
                    const float *po = c->dec.parts + ((size_t)(h * np + p) * ns + j) * (hd + 2);
                    if (!(po[hd + 1] > 0)) continue;
                    const float w = expf(po[hd] - m);
                    l += w * po[hd + 1];
                    for (int e = 0; e < hd; e++) o[e] += w * po[e];
                }
                const float inv = 1.0f / l;
                for (int e = 0; e < hd; e++) o[e] *= inv;
            }
    }
    return RK_OK;
}

rk_status lr_attention(rk_kv_codec *c, int layer, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    if (!c->scr) return rk_err_set(err, RK_E_INTERNAL, "lowram: attention before the scratch exists");
    const bool sparse = !c->p.dense && n_q <= LR_SPARSE_MAX_Q && !(layer >= c->p.dense_l0 && layer < c->p.dense_l1);
    /* two-level selection: coarse landmarks up to the stored chunks (without them: one level) */
    if (sparse && c->p.coarse > 1) (void)lr_coarse_update(c, layer);
    if (c->tier) { /* lowram_tier.c: rows under a budget (every chunk resident unless selective) */
        rk_status ts = lr_tier_begin(c, layer, sparse && c->dec.keys_op, err);
        if (ts) return ts;
    }
    if (sparse && c->dec.keys_op) {
        c->n_calls++;
        rk_status st = sparse_decode(c, layer, q, n_q, pos0, out, err);
        if (c->tier) lr_tier_end(c, layer);
        return st;
    }
    attn_job a = {
        c, layer, q, n_q, pos0, 0, sparse ? LR_SPARSE_MAX_Q : LR_TILE, out, sparse, !c->isa_base && rk_cpu_has_avx2()};
    c->n_calls++;
    a.n_tiles = (n_q + a.tile - 1) / a.tile;
    /* decode stays on the caller's thread: a second pool spinning next to the backend's
     * costs more than the few heads of one step gain */
    if (c->pool && !sparse && n_q > LR_SPARSE_MAX_Q) rk_pool_run(c->pool, attn_worker, &a);
    else attn_worker(&a, 0, 1);
    if (c->tier) lr_tier_end(c, layer);
    return RK_OK;
}
