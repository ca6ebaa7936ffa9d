/* A random LowRAM decode state for RK_OP_LR_ATTN (tests/kernels/test_lr_attn.c on the
 * CPU backends, test_cuda.c on the device, tests/gpu/test_devsim.c): every buffer of
 * rk_lr_attn_args in host memory, shaped as the codec stores it (int8 coefficient rows
 * with an f16 scale, f16 basis / predictor / landmarks / chunk means, int8 residuals on
 * about a quarter of the rows), and lr_case_upload to put a copy in a backend's memory. */
#pragma once
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk_kernels.h"

typedef struct lr_case {
    int n_head, n_kv, hd, C, r, n_sel;
    int64_t n_rows, n_sink, n_q, pos0, x_lo, x_cap, D;
    bool summaries;
    rk_lr_attn_args L;
    float *q, *out;
    /* owned host buffers */
    void *buf[20];
    int n_buf;
} lr_case;

static uint64_t lr_rng_s = 88172645463325252ull;
static inline double lr_u(void) { /* xorshift, uniform in [0, 1) */
    lr_rng_s ^= lr_rng_s << 13, lr_rng_s ^= lr_rng_s >> 7, lr_rng_s ^= lr_rng_s << 17;
    return (double)(lr_rng_s >> 11) / 9007199254740992.0;
}
static inline float lr_n(void) { return (float)((lr_u() + lr_u() + lr_u() - 1.5) * 2.0); } /* ~N(0, 1) */

static inline void *lr_case_alloc(lr_case *c, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    c->buf[c->n_buf++] = p;
    return p;
}

static inline void lr_put_f16(void *p, size_t i, float v) {
    uint16_t h = rk_f32_to_f16(v);
    memcpy((uint8_t *)p + 2 * i, &h, 2);
}

/* window rows [x_lo, pos0 + n_q) exact; compressed rows at positions n_sink.. (every
 * `stride`-th position, as after eviction when stride > 1) */
static inline void lr_case_make(lr_case *c, int n_head, int n_kv, int hd, int C, int r, int64_t n_rows, int64_t n_sink,
                                int64_t n_win, int64_t n_q, int n_sel, bool summaries, int rope_mode, uint64_t seed) {
    memset(c, 0, sizeof *c);
    lr_rng_s = seed * 2654435761ull + 1;
    c->n_head = n_head, c->n_kv = n_kv, c->hd = hd, c->C = C, c->r = r, c->n_sel = n_sel;
    c->n_rows = n_rows, c->n_sink = n_sink, c->n_q = n_q, c->summaries = summaries;
    const int kvd = n_kv * hd, qd = n_head * hd;
    c->D = 3 * (int64_t)kvd; /* a group of three layers: this layer is the middle one */
    const int64_t stride = 2, comp_end = n_sink + n_rows * stride;
    c->x_lo = comp_end, c->pos0 = comp_end + n_win, c->x_cap = n_win + n_q + 5;
    const int64_t n_ch = (n_rows + C - 1) / C;
    rk_lr_attn_args *L = &c->L;
    L->chunk = C, L->r = r, L->n_sel = n_sel, L->summaries = summaries, L->n_rot = hd, L->rope_mode = rope_mode;
    L->n_sink = n_sink, L->x_lo = c->x_lo, L->x_cap = c->x_cap, L->n_rows = n_rows;
    double *freq = lr_case_alloc(c, (size_t)hd / 2 * sizeof(double));
    for (int i = 0; i < hd / 2; i++) freq[i] = pow(10000.0, -2.0 * i / hd);
    L->freq = freq;
    void *sk = lr_case_alloc(c, (size_t)(n_sink ? n_sink : 1) * kvd * 2),
         *sv = lr_case_alloc(c, (size_t)(n_sink ? n_sink : 1) * kvd * 2);
    void *xk = lr_case_alloc(c, (size_t)c->x_cap * kvd * 2), *xv = lr_case_alloc(c, (size_t)c->x_cap * kvd * 2);
    for (int64_t i = 0; i < n_sink * kvd; i++)
        lr_put_f16(sk, (size_t)i, lr_n() * 1.5f), lr_put_f16(sv, (size_t)i, lr_n());
    for (int64_t i = 0; i < c->x_cap * kvd; i++) lr_put_f16(xk, (size_t)i, lr_n()), lr_put_f16(xv, (size_t)i, lr_n());
    L->sk = sk, L->sv = sv, L->xk = xk, L->xv = xv;
    int32_t *pos = lr_case_alloc(c, (size_t)(n_rows + 1) * 4);
    for (int64_t i = 0; i < n_rows; i++) pos[i] = (int32_t)(n_sink + i * stride);
    L->pos = pos;
    L->coef_bytes = 2 + (size_t)r + 3; /* padded rows, as a stride check */
    uint8_t *coef = lr_case_alloc(c, (size_t)(n_rows + 1) * L->coef_bytes);
    for (int64_t i = 0; i < n_rows; i++) {
        uint8_t *row = coef + (size_t)i * L->coef_bytes;
        lr_put_f16(row, 0, (float)(0.02 + 0.03 * lr_u()));
        for (int t = 0; t < r; t++)
            ((int8_t *)(row + 2))[t] = (int8_t)(int)floor((lr_u() * 2 - 1) * 127.0 / (1 + t * 0.05));
    }
    L->coef = coef;
    /* basis: r rows of D, this layer's columns at kvd.. (ldb = D) */
    uint16_t *basis = lr_case_alloc(c, (size_t)r * (size_t)c->D * 2);
    for (int64_t i = 0; i < (int64_t)r * c->D; i++) lr_put_f16(basis, (size_t)i, lr_n() * 0.3f);
    L->basis = basis + kvd, L->ldb = c->D;
    float *mean = lr_case_alloc(c, (size_t)kvd * 4), *winv = lr_case_alloc(c, (size_t)kvd * 4),
          *b = lr_case_alloc(c, (size_t)kvd * 4);
    for (int i = 0; i < kvd; i++) mean[i] = lr_n() * 0.5f, winv[i] = (float)(0.5 + lr_u()), b[i] = lr_n() * 0.2f;
    L->mean = mean, L->winv = winv, L->b = b;
    uint16_t *lmk = lr_case_alloc(c, (size_t)(n_ch + 1) * kvd * 2),
             *cmean = lr_case_alloc(c, (size_t)(n_ch + 1) * r * 2);
    for (int64_t i = 0; i < n_ch * kvd; i++) lr_put_f16(lmk, (size_t)i, lr_n() * 1.2f);
    for (int64_t i = 0; i < n_ch * r; i++) lr_put_f16(cmean, (size_t)i, lr_n() * 0.5f);
    L->lmk = lmk, L->cmean = cmean;
    uint16_t *W = lr_case_alloc(c, (size_t)r * kvd * 2);
    for (int64_t i = 0; i < (int64_t)r * kvd; i++) lr_put_f16(W, (size_t)i, lr_n() * 0.1f);
    L->W = W;
    /* residuals: head h's slots in stored-row order, mask and base per chunk */
    L->res_bytes = 2 + (size_t)hd;
    L->res_hstride = (size_t)(n_rows + 1) * L->res_bytes;
    L->mb_hstride = n_ch + 1;
    uint8_t *res = lr_case_alloc(c, (size_t)n_kv * L->res_hstride);
    uint32_t *mask = lr_case_alloc(c, (size_t)n_kv * (size_t)L->mb_hstride * 4);
    int32_t *base = lr_case_alloc(c, (size_t)n_kv * (size_t)L->mb_hstride * 4);
    for (int h = 0; h < n_kv; h++) {
        int64_t slot = 0;
        for (int64_t ch = 0; ch < n_ch; ch++) {
            base[h * L->mb_hstride + ch] = (int32_t)slot;
            for (int k = 0; k < C && ch * C + k < n_rows; k++)
                if (lr_u() < 0.25) {
                    mask[h * L->mb_hstride + ch] |= 1u << k;
                    uint8_t *rr = res + (size_t)h * L->res_hstride + (size_t)slot++ * L->res_bytes;
                    lr_put_f16(rr, 0, (float)(0.002 + 0.004 * lr_u()));
                    for (int d = 0; d < hd; d++) ((int8_t *)(rr + 2))[d] = (int8_t)(int)floor((lr_u() * 2 - 1) * 127);
                }
        }
    }
    L->res = res, L->mask = mask, L->base = base;
    c->q = lr_case_alloc(c, (size_t)n_q * qd * 4);
    c->out = lr_case_alloc(c, (size_t)n_q * qd * 4);
    for (int64_t i = 0; i < n_q * qd; i++) c->q[i] = lr_n() * 0.6f;
}

static inline void lr_case_free(lr_case *c) {
    for (int i = 0; i < c->n_buf; i++) free(c->buf[i]);
    c->n_buf = 0;
}

static inline rk_op_args lr_case_args(const lr_case *c, const rk_lr_attn_args *L, float *q, float *out) {
    const int qd = c->n_head * c->hd;
    rk_op_args a = {.op = RK_OP_LR_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {qd, c->n_q, 1, 1}, (size_t)qd * 4, q};
    a.dst = (rk_view){RK_DT_F32, {qd, c->n_q, 1, 1}, (size_t)qd * 4, out};
    a.attn = (rk_attn_params){c->n_head, c->n_kv, c->hd, 1.0f / sqrtf((float)c->hd), c->pos0};
    a.lr = L;
    return a;
}

/* The same state in backend memory of be (rk_backend_alloc + upload); blocks in dev[] (n_dev). */
static inline rk_status lr_case_upload(const lr_case *c, rk_backend *be, rk_lr_attn_args *out, void **dev, int *n_dev,
                                       rk_err *err) {
    *out = c->L;
    const int kvd = c->n_kv * c->hd;
    const int64_t n_ch = (c->n_rows + c->C - 1) / c->C;
    struct {
        const void **slot;
        const void *src;
        size_t bytes;
    } m[] = {
        {(const void **)&out->freq, c->L.freq, (size_t)c->hd / 2 * 8},
        {&out->sk, c->L.sk, (size_t)(c->n_sink ? c->n_sink : 1) * kvd * 2},
        {&out->sv, c->L.sv, (size_t)(c->n_sink ? c->n_sink : 1) * kvd * 2},
        {&out->xk, c->L.xk, (size_t)c->x_cap * kvd * 2},
        {&out->xv, c->L.xv, (size_t)c->x_cap * kvd * 2},
        {(const void **)&out->pos, c->L.pos, (size_t)(c->n_rows + 1) * 4},
        {(const void **)&out->coef, c->L.coef, (size_t)(c->n_rows + 1) * c->L.coef_bytes},
        {(const void **)&out->basis, c->L.basis - kvd, (size_t)c->r * (size_t)c->D * 2},
        {(const void **)&out->mean, c->L.mean, (size_t)kvd * 4},
        {(const void **)&out->winv, c->L.winv, (size_t)kvd * 4},
        {(const void **)&out->b, c->L.b, (size_t)kvd * 4},
        {(const void **)&out->lmk, c->L.lmk, (size_t)(n_ch + 1) * kvd * 2},
        {(const void **)&out->cmean, c->L.cmean, (size_t)(n_ch + 1) * c->r * 2},
        {(const void **)&out->W, c->L.W, (size_t)c->r * kvd * 2},
        {(const void **)&out->res, c->L.res, (size_t)c->n_kv * c->L.res_hstride},
        {(const void **)&out->mask, c->L.mask, (size_t)c->n_kv * (size_t)c->L.mb_hstride * 4},
        {(const void **)&out->base, c->L.base, (size_t)c->n_kv * (size_t)c->L.mb_hstride * 4},
    };
    *n_dev = 0;
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        void *p = NULL;
        rk_status st = rk_backend_alloc(be, m[i].bytes, &p, err);
        if (st) return st;
        dev[(*n_dev)++] = p;
        if ((st = rk_backend_upload(be, p, m[i].src, m[i].bytes, err))) return st;
        *m[i].slot = p;
    }
    out->basis = (const uint16_t *)out->basis + kvd;
    return RK_OK;
}
