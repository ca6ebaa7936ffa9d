/* Block-sparse causal attention (rk_attn_sparse.h): the split into a sparse part and a
 * dense part, the online estimation of each head's vertical and slash lines, the block
 * mask, the calibration counters, and the compute over the selected blocks: in double for
 * cpu_ref (the masked-attention oracle), in f32 tiles with an online softmax for cpu. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"
#include "rk_attn_sparse.h"

#define SP_KT 64     /* keys per converted tile while estimating */
#define SP_BATCH 256 /* most rows of a block whose P x V is taken at once */

typedef struct sp_ctx {
    rk_backend *be;
    const rk_op_args *a;
    const rk_attn_sparse *sp;
    const rk_cpu_kern *kn; /* NULL: cpu_ref (scalar, double) */
    const rk_quant_fns *kq, *vq;
    rk_heads q, k, v, o;
    int n_head, group, hd;
    float scale;
    int64_t pos0, n_s, last; /* sparse rows pos0 .. last = pos0 + n_s - 1 */
    int64_t B, qb0, n_qb, n_kb, sink_b;
    uint8_t *mask; /* (n_qb, n_head, n_kb) */
    double *cal_cover, *cal_rows;
    float *const *tls; /* cpu: per-thread scratch of task_floats */
    atomic_int fail;
} sp_ctx;

/* ---- shapes ------------------------------------------------------------------------ */
/* rows [t0, t0 + n) of a q / dst view (2-D {heads*hd, n} or 3-D {hd, heads, n}) */
static rk_view shift_tokens(rk_view v, int n_heads, int head_dim, int64_t t0, int64_t n) {
    if (v.ne[0] == (int64_t)n_heads * head_dim) {
        v.data = (char *)v.data + (size_t)t0 * v.nb1;
        v.ne[1] = n, v.ne[2] = v.ne[3] = 1;
    } else {
        v.data = (char *)v.data + (size_t)t0 * (size_t)n_heads * v.nb1;
        v.ne[2] = n, v.ne[3] = 1;
    }
    return v;
}

/* first key block always seen by query block qb: the window's */
static int64_t win_lo(const sp_ctx *c, int64_t qb) {
    const int64_t lo = qb * c->B - c->sp->window;
    return lo <= 0 ? 0 : lo / c->B;
}

static bool forced(const sp_ctx *c, int64_t qb, int64_t jb) { return jb < c->sink_b || jb >= win_lo(c, qb); }

static const float *k_row(const sp_ctx *c, int hk, int64_t j, float *buf) {
    c->kq->to_f32(c->k.data + (size_t)j * c->k.tok_nb + (size_t)hk * c->k.head_nb, buf, c->hd);
    return buf;
}

/* S (n, nv) = scaled q rows t[i] of head h against keys 0..nv-1 (every key: the caller
 * masks the causal part); kbuf (SP_KT, hd), qs (n, hd) scratch. */
static void scores(const sp_ctx *c, int h, const int64_t *t, int64_t n, int64_t nv, float *S, float *qs, float *kbuf) {
    const int hd = c->hd, hk = h / c->group;
    for (int64_t i = 0; i < n; i++) {
        const float *qr = (const float *)(c->q.data + (size_t)t[i] * c->q.tok_nb + (size_t)h * c->q.head_nb);
        for (int d = 0; d < hd; d++) qs[i * hd + d] = qr[d] * c->scale;
    }
    for (int64_t j0 = 0; j0 < nv; j0 += SP_KT) {
        const int64_t kt = nv - j0 < SP_KT ? nv - j0 : SP_KT;
        for (int64_t j = 0; j < kt; j++) k_row(c, hk, j0 + j, kbuf + j * hd);
        if (c->kn) {
            c->kn->gemm_nt(n, kt, hd, qs, hd, kbuf, hd, S + j0, nv);
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < kt; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)qs[i * hd + d] * kbuf[j * hd + d];
                S[i * nv + j0 + j] = (float)s;
            }
    }
}

/* rows of S to probabilities over their visible keys [0, pos + 1); 0 beyond. cpu uses the
 * vector exp (exp_sub, f32 sums), cpu_ref libm's expf with double sums. */
static void probs(const rk_cpu_kern *kn, float *S, int64_t n, int64_t nv, const int64_t *pos) {
    for (int64_t i = 0; i < n; i++) {
        float *s = S + i * nv;
        const int64_t lim = pos[i] + 1 < nv ? pos[i] + 1 : nv;
        const float mx = rk_cpu_row_max(s, lim);
        double sum = 0;
        if (kn) {
            sum = kn->exp_sub(s, lim, mx);
        } else {
            for (int64_t j = 0; j < lim; j++) sum += (s[j] = expf(s[j] - mx));
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < lim; j++) s[j] *= inv;
        for (int64_t j = lim; j < nv; j++) s[j] = 0.0f;
    }
}

/* ---- the lazy greedy over vertical and slash lines ------------------------------------ */
typedef struct heap {
    float *g;
    int32_t *id;
    int64_t n;
} heap;

static void heap_down(heap *h, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->g[l] > h->g[m]) m = l;
        if (r < h->n && h->g[r] > h->g[m]) m = r;
        if (m == i) return;
        float tg = h->g[i];
        int32_t ti = h->id[i];
        h->g[i] = h->g[m], h->id[i] = h->id[m], h->g[m] = tg, h->id[m] = ti;
        i = m;
    }
}

static void heap_push(heap *h, float g, int32_t id) {
    int64_t i = h->n++;
    h->g[i] = g, h->id[i] = id;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (h->g[p] >= h->g[i]) break;
        float tg = h->g[i];
        int32_t ti = h->id[i];
        h->g[i] = h->g[p], h->id[i] = h->id[p], h->g[p] = tg, h->id[p] = ti;
        i = p;
    }
}

static void heap_pop(heap *h) {
    h->g[0] = h->g[--h->n], h->id[0] = h->id[h->n];
    heap_down(h, 0);
}

typedef struct est {
    int64_t e, nv, n_kb;
    int64_t *t, *pos;     /* (e) rows and positions of the estimating queries */
    float *P;             /* (e, nv) their probabilities */
    float *Pb;            /* (e, n_kb) each row's probability summed per key block */
    float *col, *diag;    /* each line's mass outside the always-computed blocks */
    uint8_t *colb, *doff; /* (n_kb each) the block columns and block offsets opened so far */
    int32_t *order;
    double *cov; /* (n_order + 1): the mask's covered mass before / after each pick */
    int64_t n_order;
    heap hp;
} est;

/* is key block jb computed for estimating row i: always, or opened by a pick of the kind
 * given (cols: a column; else a diagonal) */
static bool est_in(const sp_ctx *c, const est *E, int64_t i, int64_t jb, bool cols) {
    const int64_t qb = E->pos[i] / c->B;
    return forced(c, qb, jb) || (cols ? E->colb[jb] : E->doff[qb - jb]);
}

/* is key block jb computed for estimating row i at all */
static bool est_any(const sp_ctx *c, const est *E, int64_t i, int64_t jb) {
    const int64_t qb = E->pos[i] / c->B;
    return forced(c, qb, jb) || E->colb[jb] || E->doff[qb - jb];
}

/* The mass of line id (column j < nv, else diagonal id - nv) in the blocks that no line of
 * its kind has opened yet. Lines of the other kind do not count: the estimating rows sit
 * in one or two query blocks, where a column and a diagonal open the same block, but for
 * the chunk's other query blocks they open different ones, and which of them the attention
 * follows is what the line's own mass says. */
static double marginal(const sp_ctx *c, const est *E, int32_t id) {
    double g = 0;
    if (id < E->nv) {
        const int64_t j = id;
        if (E->colb[j / c->B]) return 0;
        for (int64_t i = 0; i < E->e; i++)
            if (E->pos[i] >= j && !est_in(c, E, i, j / c->B, true)) g += E->P[i * E->nv + j];
    } else {
        const int64_t d = id - E->nv;
        for (int64_t i = 0; i < E->e; i++) {
            const int64_t j = E->pos[i] - d;
            if (j >= 0 && !est_in(c, E, i, j / c->B, false)) g += E->P[i * E->nv + j];
        }
    }
    return g;
}

/* Opens block column jb (every query block computes key block jb) or block offset a (query
 * block qb computes key block qb - a); returns the estimating rows' mass newly inside. */
static double open_col(const sp_ctx *c, est *E, int64_t jb) {
    if (E->colb[jb]) return 0;
    double g = 0;
    for (int64_t i = 0; i < E->e; i++)
        if (jb <= E->pos[i] / c->B && !est_any(c, E, i, jb)) g += E->Pb[i * E->n_kb + jb];
    E->colb[jb] = 1;
    return g;
}

static double open_off(const sp_ctx *c, est *E, int64_t a) {
    if (a >= E->n_kb || E->doff[a]) return 0;
    double g = 0;
    for (int64_t i = 0; i < E->e; i++) {
        const int64_t jb = E->pos[i] / c->B - a;
        if (jb >= 0 && !est_any(c, E, i, jb)) g += E->Pb[i * E->n_kb + jb];
    }
    E->doff[a] = 1;
    return g;
}

/* Picks lines, the one with the most mass outside the blocks its kind has opened first,
 * until the blocks they open (a column its key block in every query block, a diagonal the
 * one or two block offsets it crosses) hold target of the estimating rows' mass (E->e in
 * all), or nothing is left; a target of E->e or more keeps every line with mass. Counting
 * the blocks' mass, not the lines', stops as soon as the mask itself holds the target: a
 * line's neighbours in its block come free. */
static void greedy(const sp_ctx *c, est *E, double target) {
    const int64_t nv = E->nv;
    double covered = 0;
    for (int64_t i = 0; i < E->e; i++) {
        /* row i's forced keys are [0, lo) (sinks) and [hi, lim) (its window): covered; the
         * keys between add to their column's and their diagonal's mass */
        const float *P = E->P + i * nv;
        float *Pb = E->Pb + i * E->n_kb;
        const int64_t pos = E->pos[i], lim = pos + 1 < nv ? pos + 1 : nv;
        const int64_t lo = c->sink_b * c->B < lim ? c->sink_b * c->B : lim;
        int64_t hi = win_lo(c, pos / c->B) * c->B;
        hi = hi < lo ? lo : hi > lim ? lim : hi;
        for (int64_t j = 0; j < lo; j++) covered += P[j];
        for (int64_t j = lo; j < hi; j++) E->col[j] += P[j], E->diag[pos - j] += P[j], Pb[j / c->B] += P[j];
        for (int64_t j = hi; j < lim; j++) covered += P[j];
    }
    /* the heap of every line with mass, built bottom-up */
    E->hp.n = 0;
    for (int64_t j = 0; j < nv; j++) {
        if (E->col[j] > 0) E->hp.g[E->hp.n] = E->col[j], E->hp.id[E->hp.n++] = (int32_t)j;
        if (E->diag[j] > 0) E->hp.g[E->hp.n] = E->diag[j], E->hp.id[E->hp.n++] = (int32_t)(nv + j);
    }
    for (int64_t i = E->hp.n / 2 - 1; i >= 0; i--) heap_down(&E->hp, i);
    E->n_order = 0;
    E->cov[0] = covered;
    const bool all = target >= (double)E->e; /* not left to the rounding of the sums */
    while ((all || covered < target) && E->hp.n > 0) {
        const int32_t id = E->hp.id[0];
        heap_pop(&E->hp);
        const double g = marginal(c, E, id);
        if (g <= 0) continue;
        /* compared in the heap's own precision: a double marginal a rounding below its float
         * key, against an equal float key on top, would otherwise trade places with it forever */
        if (E->hp.n > 0 && (float)g < E->hp.g[0]) {
            heap_push(&E->hp, (float)g, id);
            continue;
        }
        if (id < nv) {
            covered += open_col(c, E, id / c->B);
        } else {
            const int64_t d = id - nv;
            covered += open_off(c, E, d / c->B);
            if (d % c->B) covered += open_off(c, E, d / c->B + 1);
        }
        E->order[E->n_order++] = id;
        E->cov[E->n_order] = covered;
    }
}

/* lines picked before the covered mass first reached tau * e (all of them if never) */
static int64_t prefix_for(const est *E, double tau) {
    for (int64_t k = 0; k <= E->n_order; k++)
        if (E->cov[k] >= tau * (double)E->e) return k;
    return E->n_order;
}

/* colb (n_kb) and doff (n_kb) of the first k lines */
static void line_blocks(const sp_ctx *c, const est *E, int64_t k, uint8_t *colb, uint8_t *doff) {
    memset(colb, 0, (size_t)c->n_kb);
    memset(doff, 0, (size_t)c->n_kb);
    for (int64_t x = 0; x < k; x++) {
        const int64_t id = E->order[x];
        if (id < E->nv) {
            colb[id / c->B] = 1;
        } else {
            const int64_t d = id - E->nv, a = d / c->B;
            if (a < c->n_kb) doff[a] = 1;
            if (d % c->B && a + 1 < c->n_kb) doff[a + 1] = 1;
        }
    }
}

static bool sel_block(const sp_ctx *c, const uint8_t *colb, const uint8_t *doff, int64_t qb, int64_t jb) {
    return forced(c, qb, jb) || colb[jb] || doff[qb - jb];
}

static void est_free(est *E) {
    free(E->t), free(E->pos), free(E->P), free(E->Pb), free(E->col), free(E->diag), free(E->colb), free(E->order),
        free(E->cov);
    free(E->hp.g), free(E->hp.id);
}

/* The calibration counters of head h: exact mass inside each threshold's mask, over every
 * stride-th sparse row counted back from the last. */
static bool calibrate(sp_ctx *c, int h, est *E, float *qs, float *kbuf) {
    const rk_attn_sparse_cal *cal = c->sp->cal;
    const int nt = cal->n_tau;
    uint8_t *cb = malloc((size_t)(2 * nt) * (size_t)c->n_kb);
    if (!cb) return false;
    for (int t = 0; t < nt; t++)
        line_blocks(c, E, prefix_for(E, cal->tau[t]), cb + (size_t)(2 * t) * c->n_kb,
                    cb + (size_t)(2 * t + 1) * c->n_kb);
    const int64_t stride = cal->stride > 0 ? cal->stride : 1, nv = E->nv;
    int64_t n_rows = 0;
    for (int64_t r = c->n_s - 1; r >= 0;) {
        int64_t n = 0;
        for (; n < E->e && r >= 0; n++, r -= stride) E->t[n] = r, E->pos[n] = c->pos0 + r;
        scores(c, h, E->t, n, nv, E->P, qs, kbuf);
        probs(c->kn, E->P, n, nv, E->pos);
        for (int64_t i = 0; i < n; i++) {
            const int64_t qb = E->pos[i] / c->B;
            for (int t = 0; t < nt; t++) {
                const uint8_t *colb = cb + (size_t)(2 * t) * c->n_kb, *doff = colb + c->n_kb;
                double m = 0;
                for (int64_t jb = 0; jb <= qb; jb++) {
                    if (!sel_block(c, colb, doff, qb, jb)) continue;
                    const int64_t j1 = (jb + 1) * c->B < E->pos[i] + 1 ? (jb + 1) * c->B : E->pos[i] + 1;
                    for (int64_t j = jb * c->B; j < j1; j++) m += E->P[i * nv + j];
                }
                c->cal_cover[h * nt + t] += m;
            }
        }
        n_rows += n;
    }
    c->cal_rows[h] += (double)n_rows;
    free(cb);
    return true;
}

/* Estimates head h's lines and writes its rows of the mask. */
static void estimate_head(sp_ctx *c, int h) {
    const rk_attn_sparse *sp = c->sp;
    est E = {.e = sp->n_est < c->n_s ? sp->n_est : c->n_s, .nv = c->last + 1, .n_kb = c->n_kb};
    const int64_t nv = E.nv, cap = E.e > 64 ? E.e : 64;
    E.t = malloc((size_t)cap * sizeof *E.t);
    E.pos = malloc((size_t)cap * sizeof *E.pos);
    E.P = malloc((size_t)(cap * nv) * sizeof *E.P);
    E.col = calloc((size_t)nv, sizeof *E.col);
    E.diag = calloc((size_t)nv, sizeof *E.diag);
    E.Pb = calloc((size_t)(cap * c->n_kb), sizeof *E.Pb);
    E.colb = calloc((size_t)(2 * c->n_kb), 1), E.doff = E.colb ? E.colb + c->n_kb : NULL;
    E.order = malloc((size_t)(2 * nv) * sizeof *E.order);
    E.cov = malloc((size_t)(2 * nv + 1) * sizeof *E.cov);
    E.hp.g = malloc((size_t)(2 * nv) * sizeof *E.hp.g);
    E.hp.id = malloc((size_t)(2 * nv) * sizeof *E.hp.id);
    float *qs = malloc((size_t)(cap * c->hd) * sizeof *qs), *kbuf = malloc((size_t)(SP_KT * c->hd) * sizeof *kbuf);
    uint8_t *colb = malloc((size_t)(2 * c->n_kb));
    if (!E.t || !E.pos || !E.P || !E.col || !E.diag || !E.Pb || !E.colb || !E.order || !E.cov || !E.hp.g || !E.hp.id ||
        !qs || !kbuf || !colb) {
        atomic_store(&c->fail, 1);
        goto done;
    }
    for (int64_t i = 0; i < E.e; i++) E.t[i] = c->n_s - E.e + i, E.pos[i] = c->pos0 + E.t[i];
    scores(c, h, E.t, E.e, nv, E.P, qs, kbuf);
    probs(c->kn, E.P, E.e, nv, E.pos);
    double tau = sp->head_mass ? sp->head_mass[h] : sp->mass;
    double top = tau;
    if (sp->cal)
        for (int t = 0; t < sp->cal->n_tau; t++) top = sp->cal->tau[t] > top ? sp->cal->tau[t] : top;
    greedy(c, &E, top * (double)E.e);
    uint8_t *doff = colb + c->n_kb;
    line_blocks(c, &E, prefix_for(&E, tau), colb, doff);
    for (int64_t b = 0; b < c->n_qb; b++) {
        const int64_t qb = c->qb0 + b;
        uint8_t *m = c->mask + ((size_t)b * c->n_head + h) * c->n_kb;
        for (int64_t jb = 0; jb <= qb; jb++) m[jb] = sel_block(c, colb, doff, qb, jb);
    }
    if (sp->cal && !calibrate(c, h, &E, qs, kbuf)) atomic_store(&c->fail, 1);
done:
    est_free(&E);
    free(qs), free(kbuf), free(colb);
}

static void estimate_tasks(void *vp, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    for (int64_t h = i0; h < i1; h++) estimate_head(vp, (int)h);
}

/* ---- compute over the selected blocks --------------------------------------------- */
/* cpu_ref: per row and head, two-pass softmax in double over the selected keys. */
static void compute_ref(sp_ctx *c, float *row) {
    const int hd = c->hd;
    double *sc = malloc((size_t)(c->last + 1) * sizeof *sc), *acc = malloc((size_t)hd * sizeof *acc);
    if (!sc || !acc) {
        atomic_store(&c->fail, 1);
        free(sc), free(acc);
        return;
    }
    for (int64_t t = 0; t < c->n_s; t++) {
        const int64_t p = c->pos0 + t, qb = p / c->B;
        for (int h = 0; h < c->n_head; h++) {
            const uint8_t *m = c->mask + ((size_t)(qb - c->qb0) * c->n_head + h) * c->n_kb;
            const float *qr = (const float *)(c->q.data + (size_t)t * c->q.tok_nb + (size_t)h * c->q.head_nb);
            const int hk = h / c->group;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= p; j++) {
                if (!m[j / c->B]) continue;
                k_row(c, hk, j, row);
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)qr[d] * row[d];
                sc[j] = s * c->scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int d = 0; d < hd; d++) acc[d] = 0;
            for (int64_t j = 0; j <= p; j++) {
                if (!m[j / c->B]) continue;
                const double w = exp(sc[j] - mx);
                sum += w;
                c->vq->to_f32(c->v.data + (size_t)j * c->v.tok_nb + (size_t)hk * c->v.head_nb, row, hd);
                for (int d = 0; d < hd; d++) acc[d] += w * row[d];
            }
            float *out = (float *)(c->o.data + (size_t)t * c->o.tok_nb + (size_t)h * c->o.head_nb);
            for (int d = 0; d < hd; d++) out[d] = (float)(acc[d] / sum);
        }
    }
    free(sc), free(acc);
}

/* cpu: task = (query block, KV head): the query heads that share the KV head go together,
 * so that each key block any of them selects is converted once; per head and selected block
 * a (rows x B) score tile, an online softmax per row, P x V accumulated. Scratch floats: per
 * head of the group qs, acc (B, hd) and M, L (B); kb, vb (B, hd), sc (B, B). */
static size_t task_floats(const sp_ctx *c) {
    return (size_t)(c->group * (2 * c->B * c->hd + 2 * c->B) + 2 * c->B * c->hd + c->B * c->B + 16);
}

static void compute_tasks(void *vp, int64_t i0, int64_t i1, int tid) {
    sp_ctx *c = vp;
    const rk_cpu_kern *kn = c->kn;
    const int64_t B = c->B, hd = c->hd, G = c->group, n_kv = c->n_head / c->group;
    float *qs = c->tls[tid], *acc = qs + G * B * hd, *M = acc + G * B * hd, *L = M + G * B;
    float *kb = L + G * B, *vb = kb + B * hd, *sc = vb + B * hd;
    for (int64_t task = i0; task < i1; task++) {
        const int64_t b = task / n_kv, qb = c->qb0 + b;
        const int hk = (int)(task % n_kv), h0 = hk * (int)G;
        int64_t p0 = qb * B, p1 = p0 + B; /* rows' positions [p0, p1) */
        if (p0 < c->pos0) p0 = c->pos0;
        if (p1 > c->last + 1) p1 = c->last + 1;
        const int64_t nr = p1 - p0, t0 = p0 - c->pos0;
        for (int64_t g = 0; g < G; g++)
            for (int64_t r = 0; r < nr; r++) {
                kn->scale_mul(
                    qs + (g * B + r) * hd,
                    (const float *)(c->q.data + (size_t)(t0 + r) * c->q.tok_nb + (size_t)(h0 + g) * c->q.head_nb),
                    c->scale, NULL, hd);
                memset(acc + (g * B + r) * hd, 0, (size_t)hd * sizeof(float));
                M[g * B + r] = -INFINITY, L[g * B + r] = 0;
            }
        const uint8_t *m0 = c->mask + ((size_t)b * c->n_head + (size_t)h0) * c->n_kb;
        for (int64_t jb = 0; jb <= qb; jb++) {
            bool any = false;
            for (int64_t g = 0; g < G && !any; g++) any = m0[g * c->n_kb + jb] != 0;
            if (!any) continue;
            const int64_t j0 = jb * B, kt = p1 - j0 < B ? p1 - j0 : B;
            for (int64_t j = 0; j < kt; j++) {
                k_row(c, hk, j0 + j, kb + j * hd);
                c->vq->to_f32(c->v.data + (size_t)(j0 + j) * c->v.tok_nb + (size_t)hk * c->v.head_nb, vb + j * hd, hd);
            }
            for (int64_t g = 0; g < G; g++) {
                if (!m0[g * c->n_kb + jb]) continue;
                float *qg = qs + g * B * hd, *ag = acc + g * B * hd, *Mg = M + g * B, *Lg = L + g * B;
                kn->gemm_nt(nr, kt, hd, qg, hd, kb, hd, sc, B);
                /* a block below the diagonal: every row sees all its keys, P x V at once */
                const bool whole = kn->pv_rows && hd % 32 == 0 && p0 + 1 - j0 >= kt && nr <= SP_BATCH;
                float alphas[SP_BATCH];
                for (int64_t r = 0; r < nr; r++) {
                    int64_t lim = p0 + r + 1 - j0; /* causal */
                    if (lim <= 0) continue;
                    if (lim > kt) lim = kt;
                    float *sr = sc + r * B;
                    const float mx = rk_cpu_row_max(sr, lim);
                    const float m_new = mx > Mg[r] ? mx : Mg[r];
                    const float alpha = Mg[r] == -INFINITY ? 0.0f : expf(Mg[r] - m_new);
                    const float sum = kn->exp_sub(sr, lim, m_new);
                    Lg[r] = Lg[r] * alpha + sum;
                    Mg[r] = m_new;
                    if (whole) alphas[r] = alpha;
                    else kn->pv(ag + r * hd, alpha, sr, vb, hd, lim, hd);
                }
                if (whole)
                    kn->pv_rows(RK_DT_F32, (int)nr, ag, hd, alphas, sc, B, (const char *)vb, (size_t)hd * sizeof(float),
                                kt, hd, 0);
            }
        }
        for (int64_t g = 0; g < G; g++)
            for (int64_t r = 0; r < nr; r++)
                kn->scale_mul((float *)(c->o.data + (size_t)(t0 + r) * c->o.tok_nb + (size_t)(h0 + g) * c->o.head_nb),
                              acc + (g * B + r) * hd, 1.0f / L[g * B + r], NULL, hd);
    }
}

/* ---- the op ------------------------------------------------------------------------- */
static rk_status check(const rk_attn_sparse *sp, rk_err *err) {
    if (sp->block <= 0 || sp->block > 4096 || sp->n_est <= 0 || sp->n_sink < 0 || sp->window < 0 || sp->min_kv < 0 ||
        !(sp->mass > 0.0f && sp->mass <= 1.0f))
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "kernels: ATTN sparse: block %d (1..4096), n_est %d (> 0), sinks %d, window %d, min_kv %lld "
                          "(>= 0), mass %g (0..1]",
                          sp->block, sp->n_est, sp->n_sink, sp->window, (long long)sp->min_kv, (double)sp->mass);
    if (sp->cal && (sp->cal->n_tau < 1 || sp->cal->n_tau > RK_SPARSE_MAX_TAU || !sp->cal->tau || !sp->cal->cover ||
                    !sp->cal->rows))
        return rk_err_set(err, RK_E_INVALID_ARG, "kernels: ATTN sparse: calibration of %d thresholds (1..%d)",
                          sp->cal->n_tau, RK_SPARSE_MAX_TAU);
    return RK_OK;
}

rk_status rk_attn_sparse_run(rk_backend *be, const rk_op_args *a, bool ref, rk_op_fn dense, rk_err *err) {
    const rk_attn_sparse *sp = a->attn_sparse;
    const rk_attn_params *p = &a->attn;
    rk_op_args da = *a;
    da.attn_sparse = NULL;
    rk_status st = check(sp, err);
    if (st) return st;
    sp_ctx c = {.be = be,
                .a = a,
                .sp = sp,
                .kn = ref ? NULL : rk_cpu_kern_of(be),
                .n_head = p->n_head,
                .group = p->n_head / p->n_head_kv,
                .hd = p->head_dim,
                .scale = p->scale,
                .pos0 = p->pos0,
                .B = sp->block};
    rk_heads_of(&a->src0, p->n_head, p->head_dim, &c.q);
    rk_heads_of(&a->src1, p->n_head_kv, p->head_dim, &c.k);
    rk_heads_of(&a->src2, p->n_head_kv, p->head_dim, &c.v);
    rk_heads_of(&a->dst, p->n_head, p->head_dim, &c.o);
    const int64_t n_q = c.q.n_tok;
    int64_t n_s = sp->dense_from - p->pos0;
    n_s = n_s < 0 ? 0 : n_s > n_q ? n_q : n_s;
    if (a->attn_kv_pos || n_s <= sp->n_est || p->pos0 + n_s < sp->min_kv) {
        if (sp->stats) sp->stats->calls_dense++;
        return dense(be, &da, err);
    }
    c.n_s = n_s, c.last = p->pos0 + n_s - 1;
    c.qb0 = p->pos0 / c.B, c.n_qb = c.last / c.B - c.qb0 + 1, c.n_kb = c.last / c.B + 1;
    c.sink_b = (sp->n_sink + c.B - 1) / c.B;
    c.kq = ref ? rk_quant_ref(a->src1.type) : rk_quant_fast(a->src1.type);
    c.vq = ref ? rk_quant_ref(a->src2.type) : rk_quant_fast(a->src2.type);
    const size_t mask_bytes = (size_t)(c.n_qb * c.n_head) * (size_t)c.n_kb;
    c.mask = calloc(mask_bytes ? mask_bytes : 1, 1);
    if (sp->cal) {
        c.cal_cover = calloc((size_t)(c.n_head * sp->cal->n_tau), sizeof(double));
        c.cal_rows = calloc((size_t)c.n_head, sizeof(double));
    }
    float *row = malloc((size_t)c.hd * sizeof(float));
    if (!c.mask || !row || (sp->cal && (!c.cal_cover || !c.cal_rows))) {
        st = rk_err_set(err, RK_E_NOMEM, "kernels: ATTN sparse: no memory for the mask (%zu bytes)", mask_bytes);
        goto done;
    }
    if (sp->mask) {
        for (int64_t b = 0; b < c.n_qb; b++)
            for (int h = 0; h < c.n_head; h++) {
                const size_t o = ((size_t)b * c.n_head + h) * c.n_kb;
                for (int64_t jb = 0; jb <= c.qb0 + b; jb++)
                    c.mask[o + jb] = sp->mask[o + jb] || forced(&c, c.qb0 + b, jb);
            }
    } else if (ref) {
        estimate_tasks(&c, 0, c.n_head, 0);
    } else {
        rk_cpu_par_for(be, c.n_head, 1, estimate_tasks, &c);
    }
    if (atomic_load(&c.fail)) {
        st = rk_err_set(err, RK_E_NOMEM, "kernels: ATTN sparse: no memory to estimate over %lld keys",
                        (long long)(c.last + 1));
        goto done;
    }
    if (ref) {
        compute_ref(&c, row);
    } else {
        float *shared;
        if ((st = rk_cpu_scratch(be, task_floats(&c), 0, &c.tls, &shared, err))) goto done;
        rk_cpu_par_for(be, c.n_qb * (c.n_head / c.group), 1, compute_tasks, &c);
    }
    if (atomic_load(&c.fail)) {
        st = rk_err_set(err, RK_E_NOMEM, "kernels: ATTN sparse: no memory for the scores");
        goto done;
    }
    if (sp->stats) {
        sp->stats->calls_sparse++;
        for (int64_t b = 0; b < c.n_qb; b++)
            for (int h = 0; h < c.n_head; h++) {
                const uint8_t *m = c.mask + ((size_t)b * c.n_head + h) * c.n_kb;
                for (int64_t jb = 0; jb <= c.qb0 + b; jb++)
                    sp->stats->blocks_done += m[jb] != 0, sp->stats->blocks_forced += forced(&c, c.qb0 + b, jb);
                sp->stats->blocks_causal += (uint64_t)(c.qb0 + b + 1);
            }
    }
    if (sp->cal)
        for (int h = 0; h < c.n_head; h++) {
            sp->cal->rows[h] += c.cal_rows[h];
            for (int t = 0; t < sp->cal->n_tau; t++)
                sp->cal->cover[h * sp->cal->n_tau + t] += c.cal_cover[h * sp->cal->n_tau + t];
        }
    if (n_s < n_q) { /* the rows from dense_from on: the dense kernel */
        da.src0 = shift_tokens(a->src0, p->n_head, p->head_dim, n_s, n_q - n_s);
        da.dst = shift_tokens(a->dst, p->n_head, p->head_dim, n_s, n_q - n_s);
        da.attn.pos0 = p->pos0 + n_s;
        if (sp->stats) sp->stats->calls_dense++;
        st = dense(be, &da, err);
    }
done:
    free(c.mask), free(c.cal_cover), free(c.cal_rows), free(row);
    return st;
}
