/* Question-aware selection of the rows kept exact in late layers (SPEC §2, quality mode).
 * After the layer-major phase has run layers 0..S-1 over the whole prompt, the last `obs`
 * prompt rows (the question) have queries at the layers just below the split; each bulk
 * row is scored by the softmax attention those queries pay its key there (summed over
 * query heads, hence over the heads of each GQA group and over the groups, and over the
 * scoring layers), max-pooled over a few neighbouring rows so that a fact's whole span
 * goes together, and the top share of the bulk rows is kept exact. Unselected rows are
 * not dropped: they keep their predicted K/V. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"

void rk_plan_keep_queries(const rk_session *s, const rk_chunk_plan *p, int l) {
    if (!p->q_keep || l < p->q_lo || l >= p->q_hi) return;
    const int64_t qd = (int64_t)s->m->hp.n_head * s->m->hp.head_dim;
    for (int64_t r = 0; r < p->n; r++) {
        const int64_t i = p->pos0 + r - p->q_pos0;
        if (i < 0 || i >= p->q_n) continue;
        memcpy(p->q_keep + ((int64_t)(l - p->q_lo) * p->q_n + i) * qd, s->q + r * qd, (size_t)qd * sizeof(float));
    }
}

static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
    float t = 0;
    for (; i < n; i++) t += a[i] * b[i];
    return t + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

enum { TILE = 256 };

rk_status rk_select_score(rk_session *s, int l, const float *q, int64_t n_obs, int64_t obs_pos0, int64_t row0,
                          int64_t row1, float *score, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    const int nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim, group = nh / nkv;
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, n_keys = obs_pos0 + n_obs;
    if (n_obs <= 0 || row0 < 0 || row0 > row1 || row1 > obs_pos0 || l < 0 || l >= hp->n_layer)
        return rk_err_set(err, RK_E_INTERNAL, "prefill: scoring rows [%lld, %lld) at layer %d by %lld queries at %lld",
                          (long long)row0, (long long)row1, l, (long long)n_obs, (long long)obs_pos0);
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t nstate = (size_t)n_obs * (size_t)nh;
    float *mx = malloc(2 * nstate * sizeof(float) + (size_t)TILE * (size_t)kvd * sizeof(float));
    if (!mx) return rk_err_set(err, RK_E_NOMEM, "prefill: no memory to score rows for the question-aware selection");
    float *sum = mx + nstate, *kt = sum + nstate;
    for (size_t i = 0; i < nstate; i++) mx[i] = -INFINITY, sum[i] = 0.0f;
    rk_status st = RK_OK;
    /* pass 1: each query head's softmax normaliser over its causal keys (online max / sum) */
    for (int64_t j0 = 0; j0 < n_keys && !st; j0 += TILE) {
        const int64_t nt = n_keys - j0 < TILE ? n_keys - j0 : TILE;
        if ((st = s->kv->ops->read(s->kv, l, false, false, j0, nt, kt, err))) break;
        for (int64_t i = 0; i < n_obs; i++) {
            const int64_t jmax = obs_pos0 + i - j0; /* keys j0 + [0, jmax] are visible to row i */
            for (int h = 0; h < nh; h++) {
                const float *qv = q + i * qd + (int64_t)h * hd;
                const float *kb = kt + (int64_t)(h / group) * hd;
                float m = mx[i * nh + h], z = sum[i * nh + h];
                for (int64_t j = 0; j < nt && j <= jmax; j++) {
                    const float x = scale * dot(qv, kb + j * kvd, hd);
                    if (x > m) z = z * expf(m - x) + 1.0f, m = x;
                    else z += expf(x - m);
                }
                mx[i * nh + h] = m, sum[i * nh + h] = z;
            }
        }
    }
    /* pass 2: the weights of the scored rows (every scored row precedes every query row) */
    for (int64_t j0 = row0; j0 < row1 && !st; j0 += TILE) {
        const int64_t nt = row1 - j0 < TILE ? row1 - j0 : TILE;
        if ((st = s->kv->ops->read(s->kv, l, false, false, j0, nt, kt, err))) break;
        for (int64_t i = 0; i < n_obs; i++)
            for (int h = 0; h < nh; h++) {
                const float *qv = q + i * qd + (int64_t)h * hd;
                const float *kb = kt + (int64_t)(h / group) * hd;
                const float m = mx[i * nh + h], inv = 1.0f / sum[i * nh + h];
                for (int64_t j = 0; j < nt; j++)
                    score[j0 - row0 + j] += expf(scale * dot(qv, kb + j * kvd, hd) - m) * inv;
            }
    }
    free(mx);
    if (st) return rk_err_wrap(err, "prefill: scoring rows at layer %d", l);
    return RK_OK;
}

typedef struct ranked {
    float v;
    int64_t i;
} ranked;

static int by_score_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

rk_status rk_select_top(const float *score, int64_t n, int radius, int64_t n_keep, uint8_t *keep, rk_err *err) {
    if (n <= 0 || n_keep <= 0) return RK_OK;
    if (n_keep > n) n_keep = n;
    ranked *r = malloc((size_t)n * sizeof *r);
    if (!r) return rk_err_set(err, RK_E_NOMEM, "prefill: no memory to rank %lld rows", (long long)n);
    for (int64_t j = 0; j < n; j++) {
        const int64_t a = j - radius < 0 ? 0 : j - radius, b = j + radius >= n ? n - 1 : j + radius;
        float m = score[a];
        for (int64_t t = a + 1; t <= b; t++) m = score[t] > m ? score[t] : m;
        /* NaN (never expected) ranks last */
        r[j] = (ranked){isnan(m) ? -INFINITY : m, j};
    }
    qsort(r, (size_t)n, sizeof *r, by_score_desc);
    for (int64_t t = 0; t < n_keep; t++) keep[r[t].i] = 1;
    free(r);
    return RK_OK;
}

rk_status rk_select_rows(const float *score, int64_t n, int radius, int64_t n_keep, int64_t band, uint8_t *keep,
                         rk_err *err) {
    if (n <= 0 || n_keep <= 0) return RK_OK;
    if (n_keep > n) n_keep = n;
    /* the band is part of the share, so the number of exact rows (the cost) does not change */
    const int64_t nb = band < 0 ? 0 : band > n_keep ? n_keep : band;
    for (int64_t j = n - nb; j < n; j++) keep[j] = 1;
    return rk_select_top(score, n - nb, radius, n_keep - nb, keep, err);
}

rk_status rk_select_extra(const float *score, int64_t n, int radius, int after, const uint8_t *base, int64_t max_new,
                          uint8_t *keep, int64_t *n_new, rk_err *err) {
    *n_new = 0;
    if (n <= 0) return RK_OK;
    memcpy(keep, base, (size_t)n);
    if (max_new <= 0) return RK_OK;
    ranked *r = malloc((size_t)n * sizeof *r);
    if (!r) return rk_err_set(err, RK_E_NOMEM, "prefill: no memory to rank %lld rows", (long long)n);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) {
        if (base[j]) continue;
        const int64_t a = j - after < 0 ? 0 : j - after, b = j + radius >= n ? n - 1 : j + radius;
        float v = score[a];
        for (int64_t t = a + 1; t <= b; t++) v = score[t] > v ? score[t] : v;
        if (v > 0.0f) r[m++] = (ranked){v, j}; /* NaN and 0: nothing the question pays for */
    }
    qsort(r, (size_t)m, sizeof *r, by_score_desc);
    const int64_t k = m < max_new ? m : max_new;
    for (int64_t t = 0; t < k; t++) keep[r[t].i] = 1;
    free(r);
    *n_new = k;
    return RK_OK;
}
