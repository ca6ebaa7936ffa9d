/* RidgeFill's grouped attention (rk_fill_params.group; docs/RIDGEFILL.md). Filled rows carry
 * predicted K/V that say *that* there is text, not which words: in the late layers of a fill
 * prefill, the exact rows (the tail, the kept bulk rows, the sinks) pay them attention mostly
 * as background. Here each run of up to G consecutive filled rows of a chunk enters the late
 * layers' attention as one row: the run's mean K (after RoPE) and mean V, with score bias
 * log(count), which is exactly the attention that count copies of that row would get. The
 * cache keeps every filled row's own K/V (decode and later calls read them); only this call's
 * late-layer attention reads the grouped list, so its cost over the filled region falls by
 * about G. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "prefill_ckpt.h"

typedef struct fg_layer {
    uint8_t *k, *v; /* (cap) rows of row_bytes: f16, or q8_0 where the cache quantises its rows */
    int32_t *pos;   /* (cap) position of the row, or of the group's last row */
    float *bias;    /* (cap) 0, or log(count) */
    int64_t n, cap;
} fg_layer;

struct rk_fill_group {
    int split, n_layer, group, n_sink;
    int64_t kvd;
    uint32_t type;    /* RK_DT_F16 or RK_DT_Q8_0: the rows as the cache holds them (q8 for q8 and
                         q4 caches, heads of whole blocks), so the exact rows a chunk attends to here are the ones a
                         read without groups would see, at the cache's size per row */
    size_t row_bytes; /* of one K or V row of the list */
    float *mk, *mv;   /* (kv_dim) a group's sums */
    fg_layer *ly;     /* (n_layer - split) */
};

void rk_fill_group_end(rk_session *s) {
    rk_fill_group *g = s->pf->fg;
    if (!g) return;
    for (int i = 0; g->ly && i < g->n_layer - g->split; i++) {
        free(g->ly[i].k), free(g->ly[i].v), free(g->ly[i].pos), free(g->ly[i].bias);
    }
    free(g->ly), free(g->mk), free(g->mv), free(g);
    s->pf->fg = NULL;
}

rk_status rk_fill_group_begin(rk_session *s, int64_t start, int split, rk_err *err) {
    rk_fill_group_end(s);
    const rk_hparams *hp = &s->m->hp;
    if (s->fill.mode == RK_FILL_OFF || s->fill.group <= 0 || start != 0 || s->dev || split <= 0 ||
        split >= hp->n_layer || s->pf->splice_src)
        return RK_OK;
    rk_fill_group *g = calloc(1, sizeof *g);
    if (!g) return rk_err_set(err, RK_E_NOMEM, "fill group: no memory");
    g->split = split, g->n_layer = hp->n_layer, g->group = s->fill.group, g->n_sink = s->fill.n_sink;
    g->kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool quant = (s->kv->kind == RK_KV_Q8 || s->kv->kind == RK_KV_Q4) && hp->head_dim % RK_Q8_BLOCK == 0;
    g->type = quant ? RK_DT_Q8_0 : RK_DT_F16;
    g->row_bytes = quant ? (size_t)(g->kvd / RK_Q8_BLOCK) * RK_Q8_BLOCK_BYTES : (size_t)g->kvd * sizeof(uint16_t);
    g->ly = calloc((size_t)(hp->n_layer - split), sizeof *g->ly);
    g->mk = malloc((size_t)g->kvd * sizeof(float));
    g->mv = malloc((size_t)g->kvd * sizeof(float));
    s->pf->fg = g;
    if (!g->ly || !g->mk || !g->mv) {
        rk_fill_group_end(s);
        return rk_err_set(err, RK_E_NOMEM, "fill group: no memory");
    }
    return RK_OK;
}

bool rk_fill_group_on(const rk_session *s, int l) { return s->pf->fg && l >= s->pf->fg->split; }

static rk_status reserve(fg_layer *L, size_t row_bytes, int64_t need, rk_err *err) {
    if (need <= L->cap) return RK_OK;
    int64_t cap = L->cap ? L->cap : 1024;
    while (cap < need) cap *= 2;
    uint8_t *k = realloc(L->k, (size_t)cap * row_bytes);
    if (k) L->k = k;
    uint8_t *v = k ? realloc(L->v, (size_t)cap * row_bytes) : NULL;
    if (v) L->v = v;
    int32_t *pos = v ? realloc(L->pos, (size_t)cap * sizeof *pos) : NULL;
    if (pos) L->pos = pos;
    float *bias = pos ? realloc(L->bias, (size_t)cap * sizeof *bias) : NULL;
    if (!bias) return rk_err_set(err, RK_E_NOMEM, "fill group: no memory for %lld rows", (long long)cap);
    L->bias = bias;
    L->cap = cap;
    return RK_OK;
}

/* n consecutive rows of f32 K and V (n_kv positions pos0..) onto the list, with bias b: f16
 * through the backend's CPY_ROWS as the plain cache writes its rows, q8 as the q8 cache
 * quantises them */
static rk_status put(rk_session *s, fg_layer *L, int64_t kvd, const float *k, const float *v, int64_t n, int64_t pos0,
                     float b, rk_err *err) {
    const rk_fill_group *g = s->pf->fg;
    if (g->type == RK_DT_Q8_0) {
        rk_q8_quantize(k, n * kvd, L->k + (size_t)L->n * g->row_bytes);
        rk_q8_quantize(v, n * kvd, L->v + (size_t)L->n * g->row_bytes);
    } else {
        rk_op_args a = {.op = RK_OP_CPY_ROWS, .dst_row0 = L->n};
        a.dst = (rk_view){RK_DT_F16, {kvd, L->cap, 1, 1}, g->row_bytes, L->k};
        a.src0 = (rk_view){RK_DT_F32, {kvd, n, 1, 1}, (size_t)kvd * sizeof(float), (void *)k};
        rk_status st = rk_backend_run(s->be, &a, err);
        a.dst.data = L->v, a.src0.data = (void *)v;
        if (!st) st = rk_backend_run(s->be, &a, err);
        if (st) return st;
    }
    for (int64_t i = 0; i < n; i++) L->pos[L->n + i] = (int32_t)(pos0 + i), L->bias[L->n + i] = b;
    L->n += n;
    return RK_OK;
}

rk_status rk_fill_group_append(rk_session *s, const rk_chunk_plan *p, int l, bool filled, rk_err *err) {
    rk_fill_group *g = s->pf->fg;
    fg_layer *L = &g->ly[l - g->split];
    const int64_t kvd = g->kvd, n = p->n, nf = filled ? p->n_fill : 0;
    rk_status st = reserve(L, g->row_bytes, L->n + n, err);
    int64_t f = 0; /* next entry of fill_idx */
    for (int64_t i = 0; i < n && !st;) {
        /* a run of rows that stay as they are: exact rows, and filled ones not grouped */
        int64_t e = i;
        for (; e < n; e++) {
            const bool fill = f < nf && p->fill_idx[f] == e;
            if (fill && p->pos0 + e >= g->n_sink && g->group > 1) break;
            f += fill;
        }
        if (e > i && (st = put(s, L, kvd, s->k + i * kvd, s->v + i * kvd, e - i, p->pos0 + i, 0.0f, err))) break;
        if ((i = e) >= n) break;
        /* a run of consecutive filled rows, at most `group` of them, as their mean */
        int64_t c = 0;
        for (int64_t d = 0; d < kvd; d++) g->mk[d] = g->mv[d] = 0.0f;
        while (i < n && f < nf && p->fill_idx[f] == i && c < g->group) {
            for (int64_t d = 0; d < kvd; d++) g->mk[d] += s->k[i * kvd + d], g->mv[d] += s->v[i * kvd + d];
            c++, f++, i++;
        }
        const float inv = 1.0f / (float)c;
        for (int64_t d = 0; d < kvd; d++) g->mk[d] *= inv, g->mv[d] *= inv;
        st = put(s, L, kvd, g->mk, g->mv, 1, p->pos0 + i - 1, logf((float)c), err);
    }
    return st;
}

rk_status rk_fill_group_attend(rk_session *s, int l, const float *q, int64_t n_q, int64_t pos0, float *out,
                               rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    const fg_layer *L = &s->pf->fg->ly[l - s->pf->fg->split];
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim;
    rk_op_args a = {.op = RK_OP_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * sizeof(float), (void *)q};
    a.dst = (rk_view){RK_DT_F32, {qd, n_q, 1, 1}, (size_t)qd * sizeof(float), out};
    const rk_fill_group *g = s->pf->fg;
    a.src1 = (rk_view){g->type, {g->kvd, L->n, 1, 1}, g->row_bytes, L->k};
    a.src2 = (rk_view){g->type, {g->kvd, L->n, 1, 1}, g->row_bytes, L->v};
    a.attn = (rk_attn_params){hp->n_head, hp->n_head_kv, hp->head_dim, 1.0f / sqrtf((float)hp->head_dim), pos0};
    a.attn_kv_pos = L->pos, a.attn_kv_bias = L->bias, a.attn_n_kv = L->n;
    return rk_backend_run(s->be, &a, err);
}

/* ---- checkpoints (session/prefill_ckpt.h): per late layer u64 n, then n K rows, n V rows
 * (the list's own encoding), n i32 positions, n f32 biases (host byte order: a checkpoint
 * never leaves its machine's cache) */
uint64_t rk_fill_group_bytes(const rk_session *s) {
    const rk_fill_group *g = s->pf->fg;
    uint64_t n = 0;
    for (int i = 0; g && i < g->n_layer - g->split; i++) n += 8 + (uint64_t)g->ly[i].n * (2 * g->row_bytes + 8);
    return n;
}

void rk_fill_group_write(const rk_session *s, void (*put)(void *ctx, const void *p, size_t n), void *ctx) {
    const rk_fill_group *g = s->pf->fg;
    for (int i = 0; g && i < g->n_layer - g->split; i++) {
        const fg_layer *L = &g->ly[i];
        const uint64_t n = (uint64_t)L->n;
        put(ctx, &n, 8);
        if (!L->n) continue;
        put(ctx, L->k, (size_t)L->n * g->row_bytes);
        put(ctx, L->v, (size_t)L->n * g->row_bytes);
        put(ctx, L->pos, (size_t)L->n * 4);
        put(ctx, L->bias, (size_t)L->n * 4);
    }
}

rk_status rk_fill_group_read(rk_session *s, uint64_t n,
                             rk_status (*pull)(void *ctx, uint8_t *dst, size_t len, rk_err *err), void *ctx,
                             rk_err *err) {
    rk_fill_group *g = s->pf->fg;
    if (!g) return n ? rk_err_set(err, RK_E_FORMAT, "fill group: a checkpoint holds lists this call has not") : RK_OK;
    uint64_t o = 0;
    for (int i = 0; i < g->n_layer - g->split; i++) {
        fg_layer *L = &g->ly[i];
        uint64_t c;
        rk_status st;
        if (n - o < 8) return rk_err_set(err, RK_E_FORMAT, "fill group: checkpoint lists truncated");
        if ((st = pull(ctx, (uint8_t *)&c, 8, err))) return st;
        o += 8;
        const uint64_t per = 2 * (uint64_t)g->row_bytes + 8;
        if (c > (uint64_t)s->n_ctx || c * per > n - o)
            return rk_err_set(err, RK_E_FORMAT, "fill group: checkpoint list of layer %d claims %llu rows",
                              g->split + i, (unsigned long long)c);
        if ((st = reserve(L, g->row_bytes, (int64_t)c, err))) return st;
        const size_t kv = (size_t)c * g->row_bytes;
        L->n = 0;
        if (c && ((st = pull(ctx, L->k, kv, err)) || (st = pull(ctx, L->v, kv, err)) ||
                  (st = pull(ctx, (uint8_t *)L->pos, (size_t)c * 4, err)) ||
                  (st = pull(ctx, (uint8_t *)L->bias, (size_t)c * 4, err))))
            return st;
        L->n = (int64_t)c;
        o += c * per;
    }
    if (o != n)
        return rk_err_set(err, RK_E_FORMAT, "fill group: %llu bytes after the checkpoint lists",
                          (unsigned long long)(n - o));
    return RK_OK;
}
