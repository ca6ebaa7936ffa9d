/* Long evals over a fitted codec (a prompt compressed while it streams, `pfit`, or a long
 * chat turn after the fit): the layer's compressed rows are rebuilt once per call into a
 * plain buffer, K = RoPE(mean + (C·B)/s) and V̂ = C·W + b + δ as the dense path computes
 * them, and the backend's exact ATTN runs over [sinks | rebuilt rows | window and new rows].
 * The row-by-row dense path (lowram_attn.c) scores every (query, key) pair with a dot per
 * pair; the backend's kernel is the one exact prefill uses. The buffer holds one layer's
 * rows and lives for one eval (freed at commit), so a streaming prompt still never holds
 * the exact copy of every layer. */
#include <stdlib.h>
#include <string.h>

#include "kv_impl.h"
#include "lowram_impl.h"
#include "lowram_tier.h"
#include "rk_kernels.h"
#include "rk_linalg.h"

/* Fewer query rows than this keep the row-by-row path: rebuilding every compressed row costs
 * (key rank + value rank) · head_dim per row and head, the pairs it replaces n_q · group · 2 ·
 * head_dim, so it pays from a few tens of rows (64 leaves a margin for the buffer's copy). */
enum { LR_DENSE_MIN_Q = 64 };

bool lr_dense_wanted(const rk_kv_codec *c, int l, int64_t n_q) {
    if (!c->fitted || n_q < LR_DENSE_MIN_Q || c->p.row_attn || c->n_evicted) return false;
    const lr_group *g = &c->g[c->ly[l].grp];
    /* every position in [sink, comp_end) stored, in order: row index = position - sink */
    return g->n_rows == c->comp_end - c->p.n_sink && c->x0 == c->comp_end;
}

void lr_dense_free(rk_kv_codec *c) {
    free(c->dk), free(c->dv);
    c->dk = c->dv = NULL, c->d_cap = 0;
}

static void put_row(const rk_kv_codec *c, const float *src, uint8_t *dst) {
    if (c->exact_type == RK_DT_F32) {
        memcpy(dst, src, (size_t)c->hd * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (int e = 0; e < c->hd; e++) d[e] = rk_f32_to_f16(src[e]);
}

typedef struct dense_job {
    rk_kv_codec *c;
    int l, parts;
    int64_t n_ch;
} dense_job;

/* (KV head, range of chunks) items: the head's basis and predictor slices once per item. */
static void dense_worker(void *vp, int tid, int nt) {
    dense_job *a = vp;
    rk_kv_codec *c = a->c;
    const lr_layer *L = &c->ly[a->l];
    const lr_group *g = &c->g[L->grp];
    lr_scratch *x = &c->scr[tid];
    const int hd = c->hd, C = c->p.chunk, r = g->r, rv = lr_vr(c, g);
    const int kr = c->p.key_rank > 0 && c->p.key_rank < r ? c->p.key_rank : r;
    const bool use_c = !c->p.values_exact;
    const size_t esz = c->exact_type == RK_DT_F32 ? 4 : 2;
    for (int64_t it = tid; it < (int64_t)c->n_head_kv * a->parts; it += nt) {
        const int h = (int)(it / a->parts), part = (int)(it % a->parts);
        const int64_t ch0 = a->n_ch * part / a->parts, ch1 = a->n_ch * (part + 1) / a->parts;
        if (ch0 == ch1) continue;
        const lr_head *H = &L->h[h];
        const int off = L->li * c->kvd + h * hd;
        lr_mat_f32(c, g->basis, (size_t)g->D, 0, r, off, hd, x->bsl);
        if (use_c) lr_mat_f32(c, L->W, (size_t)c->kvd, 0, rv, h * hd, hd, x->wsl);
        const float *mu = g->mean + off, *wi = g->winv + off, *bias = L->b + (size_t)h * hd;
        for (int64_t ch = ch0; ch < ch1; ch++) {
            const int64_t r0 = ch * C;
            const int nb = g->n_rows - r0 < C ? (int)(g->n_rows - r0) : C;
            lr_coef_rows(c, g, r0, nb, x->cf);
            rk_linalg_matmul(nb, hd, kr, x->cf, r, x->bsl, hd, x->kb, hd);
            if (use_c) rk_linalg_matmul(nb, hd, rv, x->cf, r, x->wsl, hd, x->vb, hd);
            const uint32_t mask = H->mask[ch];
            int64_t slot = H->base[ch];
            for (int k = 0; k < nb; k++) {
                float *kk = x->kb + (size_t)k * hd, *vv = x->vb + (size_t)k * hd;
                for (int d = 0; d < hd; d++) kk[d] = kk[d] * wi[d] + mu[d];
                const int64_t p = g->pos[r0 + k];
                lr_rope_row(c, kk, 1, p, false);
                if (use_c)
                    for (int d = 0; d < hd; d++) vv[d] += bias[d];
                else memset(vv, 0, (size_t)hd * sizeof(float));
                if ((mask >> k) & 1u) {
                    lr_res_row(c, H, slot++, x->row);
                    for (int d = 0; d < hd; d++) vv[d] += x->row[d];
                }
                put_row(c, kk, c->dk + (size_t)p * c->xrow + (size_t)h * hd * esz);
                put_row(c, vv, c->dv + (size_t)p * c->xrow + (size_t)h * hd * esz);
            }
            x->n_rebuilt += (uint64_t)nb;
        }
    }
}

rk_status lr_dense_attend(const rk_kv *kv, rk_kv_codec *c, int l, const float *q, int64_t n_q, int64_t pos0, float *out,
                          rk_err *err) {
    const int64_t n = pos0 + n_q, sink = c->p.n_sink;
    if (n > c->d_cap) {
        uint8_t *k2 = realloc(c->dk, (size_t)n * c->xrow), *v2 = k2 ? realloc(c->dv, (size_t)n * c->xrow) : NULL;
        if (k2) c->dk = k2;
        if (!v2)
            return rk_err_set(err, RK_E_NOMEM, "lowram: no memory for %lld rebuilt rows of one layer", (long long)n);
        c->dv = v2, c->d_cap = n;
    }
    if (c->tier) {
        rk_status ts = lr_tier_begin(c, l, false, err);
        if (ts) return ts;
    }
    /* sinks, then the exact window and the eval's rows: contiguous in their stores */
    if (sink > 0) {
        memcpy(c->dk, lr_exact_ptr(c, l, false, 0), (size_t)sink * c->xrow);
        memcpy(c->dv, lr_exact_ptr(c, l, true, 0), (size_t)sink * c->xrow);
    }
    memcpy(c->dk + (size_t)c->comp_end * c->xrow, lr_exact_ptr(c, l, false, c->comp_end),
           (size_t)(n - c->comp_end) * c->xrow);
    memcpy(c->dv + (size_t)c->comp_end * c->xrow, lr_exact_ptr(c, l, true, c->comp_end),
           (size_t)(n - c->comp_end) * c->xrow);
    const lr_group *g = &c->g[c->ly[l].grp];
    dense_job a = {c, l, 1, (g->n_rows + c->p.chunk - 1) / c->p.chunk};
    const int nt = c->pool ? rk_pool_size(c->pool) : 1;
    a.parts = (2 * nt + c->n_head_kv - 1) / c->n_head_kv; /* >= 2 items per thread */
    if (c->pool) rk_pool_run(c->pool, dense_worker, &a);
    else dense_worker(&a, 0, 1);
    if (c->tier) lr_tier_end(c, l);
    rk_op_args at = rk_kv_attn_args(kv, q, n_q, pos0, out);
    at.src1 = (rk_view){c->exact_type, {c->kvd, n, 1, 1}, c->xrow, c->dk};
    at.src2 = (rk_view){c->exact_type, {c->kvd, n, 1, 1}, c->xrow, c->dv};
    c->n_calls++, c->n_dense++;
    return rk_backend_run(c->be, &at, err);
}
