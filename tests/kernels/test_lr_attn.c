/* RK_OP_LR_ATTN on the CPU backends (cpu_ref, cpu): the fused LowRAM decode attention
 * against an independent formulation in double precision: the selection by sorting, every
 * attended row (sinks, rebuilt rows of the chosen chunks, one summary row per other chunk,
 * the causal window) gathered into one list, one softmax. Keys of chosen chunks are
 * rounded to f16 in both (the codec's key cache holds them so); the rest of the sums are
 * f32 in the kernel and double here: the bound is a few f32 roundings of sums of
 * O(r + rows) terms relative to the output's scale. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lr_attn_case.h"

static double h2d(const void *p, size_t i) {
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return (double)rk_f16_to_f32(h);
}

typedef struct {
    double s;
    double *v;
} row_t;

static int cmp_sc(const void *a, const void *b) {
    const double *u = a, *v = b;
    if (u[0] != v[0]) return u[0] < v[0] ? 1 : -1; /* descending score */
    return u[1] < v[1] ? -1 : u[1] > v[1];         /* ascending index */
}

/* out (n_q, n_head*hd) in double */
static void brute(const lr_case *c, double *out) {
    const rk_lr_attn_args *L = &c->L;
    const int hd = c->hd, kvd = c->n_kv * hd, grp = c->n_head / c->n_kv, r = c->r, C = c->C;
    const int64_t n_ch = (c->n_rows + C - 1) / C, last = c->pos0 + c->n_q;
    const double scale = (double)(1.0f / sqrtf((float)hd));
    const int64_t cap = c->n_sink + c->n_rows + n_ch + (last - c->x_lo) + 8;
    double *sv = malloc((size_t)cap * sizeof(double)), *vv = malloc((size_t)cap * hd * sizeof(double));
    double *key = malloc((size_t)hd * sizeof(double)), *cf = malloc((size_t)r * sizeof(double));
    double *ord = malloc((size_t)(n_ch + 1) * 2 * sizeof(double));
    uint8_t *chosen = calloc((size_t)n_ch + 1, 1);
    for (int h = 0; h < c->n_kv; h++) {
        /* selection: max over the KV head's state rows of q . landmark (f32 inputs, double sums) */
        for (int64_t ch = 0; ch < n_ch; ch++) {
            double best = -INFINITY;
            for (int64_t i = 0; i < c->n_q; i++)
                for (int g = 0; g < grp; g++) {
                    const float *qv = c->q + i * c->n_head * hd + (size_t)(h * grp + g) * hd;
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)qv[e] * h2d(L->lmk, (size_t)ch * kvd + (size_t)h * hd + e);
                    best = d > best ? d : best;
                }
            ord[2 * ch] = best, ord[2 * ch + 1] = (double)ch;
        }
        qsort(ord, (size_t)n_ch, 2 * sizeof(double), cmp_sc);
        memset(chosen, 0, (size_t)n_ch + 1);
        for (int64_t i = 0; i < n_ch && i < c->n_sel; i++) chosen[(int64_t)ord[2 * i + 1]] = 1;
        for (int64_t i = 0; i < c->n_q; i++)
            for (int g = 0; g < grp; g++) {
                const float *qv = c->q + i * c->n_head * hd + (size_t)(h * grp + g) * hd;
                int64_t n = 0;
                /* one row: key k (double), bias, value */
#define ADD_ROW(K, BIAS, V)                                       \
    do {                                                          \
        double d = 0;                                             \
        for (int e = 0; e < hd; e++) d += (double)qv[e] * (K)[e]; \
        sv[n] = d * scale + (BIAS);                               \
        for (int e = 0; e < hd; e++) vv[n * hd + e] = (V)[e];     \
        n++;                                                      \
    } while (0)
                double kr[256], vr[256];
                for (int64_t p = 0; p < c->n_sink && p <= c->pos0 + i; p++) {
                    for (int e = 0; e < hd; e++)
                        kr[e] = h2d(L->sk, (size_t)p * kvd + (size_t)h * hd + e),
                        vr[e] = h2d(L->sv, (size_t)p * kvd + (size_t)h * hd + e);
                    ADD_ROW(kr, 0.0, vr);
                }
                for (int64_t ch = 0; ch < n_ch; ch++) {
                    const int nb = c->n_rows - ch * C < C ? (int)(c->n_rows - ch * C) : C;
                    if (!chosen[ch]) {
                        if (!c->summaries) continue;
                        for (int t = 0; t < r; t++) cf[t] = h2d(L->cmean, (size_t)ch * r + t);
                        for (int e = 0; e < hd; e++) {
                            kr[e] = h2d(L->lmk, (size_t)ch * kvd + (size_t)h * hd + e);
                            double v = L->b[h * hd + e];
                            for (int t = 0; t < r; t++) v += cf[t] * h2d(L->W, (size_t)t * kvd + (size_t)h * hd + e);
                            vr[e] = v;
                        }
                        ADD_ROW(kr, log((double)nb), vr);
                        continue;
                    }
                    int64_t slot = L->base[h * L->mb_hstride + ch];
                    for (int k = 0; k < nb; k++) {
                        const int64_t row = ch * C + k;
                        const uint8_t *cr = L->coef + (size_t)row * L->coef_bytes;
                        for (int t = 0; t < r; t++) cf[t] = (double)((const int8_t *)(cr + 2))[t] * h2d(cr, 0);
                        for (int e = 0; e < hd; e++) {
                            double s = 0;
                            for (int t = 0; t < r; t++)
                                s += cf[t] * h2d(L->basis, (size_t)t * L->ldb + (size_t)h * hd + e);
                            key[e] = s * L->winv[h * hd + e] + L->mean[h * hd + e];
                        }
                        const int half = L->n_rot / 2;
                        for (int e = 0; e < half; e++) {
                            const int i0 = L->rope_mode == RK_ROPE_NEOX ? e : 2 * e;
                            const int i1 = L->rope_mode == RK_ROPE_NEOX ? e + half : 2 * e + 1;
                            const double th = (double)L->pos[row] * L->freq[e], x0 = key[i0], x1 = key[i1];
                            key[i0] = x0 * cos(th) - x1 * sin(th), key[i1] = x0 * sin(th) + x1 * cos(th);
                        }
                        if (L->key_int8) { /* the int8 key cache's rounding, from the f32 keys */
                            float mx = 0;
                            for (int e = 0; e < hd; e++) mx = fmaxf(mx, fabsf((float)key[e]));
                            const float ks = rk_f16_to_f32(rk_f32_to_f16(mx / 127.0f));
                            for (int e = 0; e < hd; e++) {
                                double q = ks > 0 ? nearbyint((double)((float)key[e] * (1.0f / ks))) : 0;
                                q = q > 127 ? 127 : q < -127 ? -127 : q;
                                kr[e] = q * (double)ks;
                            }
                        } else {
                            for (int e = 0; e < hd; e++) kr[e] = (double)rk_f16_to_f32(rk_f32_to_f16((float)key[e]));
                        }
                        const bool has = (L->mask[h * L->mb_hstride + ch] >> k) & 1u;
                        const uint8_t *rr =
                            has ? L->res + (size_t)h * L->res_hstride + (size_t)slot++ * L->res_bytes : NULL;
                        for (int e = 0; e < hd; e++) {
                            double v = L->b[h * hd + e];
                            for (int t = 0; t < r; t++) v += cf[t] * h2d(L->W, (size_t)t * kvd + (size_t)h * hd + e);
                            if (rr) v += (double)((const int8_t *)(rr + 2))[e] * h2d(rr, 0);
                            vr[e] = v;
                        }
                        ADD_ROW(kr, 0.0, vr);
                    }
                }
                for (int64_t p = c->x_lo; p <= c->pos0 + i; p++) {
                    const int64_t row = p % c->x_cap;
                    for (int e = 0; e < hd; e++)
                        kr[e] = h2d(L->xk, (size_t)row * kvd + (size_t)h * hd + e),
                        vr[e] = h2d(L->xv, (size_t)row * kvd + (size_t)h * hd + e);
                    ADD_ROW(kr, 0.0, vr);
                }
#undef ADD_ROW
                double m = -INFINITY, z = 0;
                for (int64_t k = 0; k < n; k++) m = sv[k] > m ? sv[k] : m;
                for (int64_t k = 0; k < n; k++) z += sv[k] = exp(sv[k] - m);
                double *o = out + i * c->n_head * hd + (size_t)(h * grp + g) * hd;
                for (int e = 0; e < hd; e++) {
                    double acc = 0;
                    for (int64_t k = 0; k < n; k++) acc += sv[k] * vv[k * hd + e];
                    o[e] = acc / z;
                }
            }
    }
    free(sv), free(vv), free(key), free(cf), free(ord), free(chosen);
}

/* normalised mean squared error of the backend's output against the double one */
static double nmse_of(const lr_case *c, const float *got, const double *want) {
    const int64_t n = c->n_q * c->n_head * c->hd;
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        e += d * d, s += want[i] * want[i];
    }
    return e / (s > 0 ? s : 1);
}

static void run_case(const char *be_name, int n_head, int n_kv, int hd, int C, int r, int64_t n_rows, int64_t n_sink,
                     int64_t n_win, int64_t n_q, int n_sel, bool summ, int mode, uint64_t seed, bool kint8) {
    lr_case c;
    lr_case_make(&c, n_head, n_kv, hd, C, r, n_rows, n_sink, n_win, n_q, n_sel, summ, mode, seed);
    c.L.key_int8 = kint8;
    rk_backend *be = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_backend_create_named(be_name, 2, &be, &e), RK_OK, "%s", e.msg);
    rk_op_args a = lr_case_args(&c, &c.L, c.q, c.out);
    cr_assert_eq(rk_backend_run(be, &a, &e), RK_OK, "%s: %s", be_name, e.msg);
    double *want = malloc((size_t)(c.n_q * n_head * hd) * sizeof(double));
    brute(&c, want);
    bool finite = true;
    for (int64_t i = 0; i < c.n_q * n_head * hd; i++) finite &= isfinite(c.out[i]);
    cr_expect(finite, "%s: non-finite output", be_name);
    /* f32 sums of up to ~r + rows terms of O(1) magnitude, then a division: NMSE well under
     * (64 u)^2 with u = 2^-24 per term; 1e-9 leaves room for the f16 key roundings that
     * land on the other side of a tie (a 2^-11 relative change of one key). An int8 key
     * code that lands on the other side moves one key element by a whole step, max|k| / 127
     * (16x the f16 step of the largest element): (2^11 / 127)^2 = 260 times the room, 3e-7 */
    const double nm = nmse_of(&c, c.out, want), bound = kint8 ? 3e-7 : 1e-9;
    fprintf(stderr, "lr_attn %s int8 %d: NMSE %.3g\n", be_name, kint8, nm);
    cr_expect(nm <= bound, "%s: NMSE %.3g (heads %d/%d hd %d C %d r %d rows %lld n_q %lld sel %d summ %d int8 %d)",
              be_name, nm, n_head, n_kv, hd, C, r, (long long)n_rows, (long long)n_q, n_sel, summ, kint8);
    free(want);
    rk_backend_destroy(be);
    lr_case_free(&c);
}

Test(lr_attn, matches_double_formulation_on_cpu_backends) {
    const char *bes[] = {"cpu_ref", "cpu"};
    for (int b = 0; b < 4; b++) { /* b >= 2: keys rounded as the int8 key cache (key_int8) */
        const char *be = bes[b & 1];
        const bool k8 = b >= 2;
        /* qwen2.5-1.5b's heads (12 / 2, hd 128), rank 96, 9 chunks of which 4 chosen + summaries */
        run_case(be, 12, 2, 128, 32, 96, 280, 4, 40, 1, 4, true, RK_ROPE_NEOX, 1, k8);
        /* four query rows (causal over the window), llama-style RoPE, a partial last chunk */
        run_case(be, 8, 2, 64, 32, 48, 203, 4, 70, 4, 3, true, RK_ROPE_NORM, 2, k8);
        /* every chunk chosen (n_sel past the chunk count), chunk 16, no sinks */
        run_case(be, 4, 4, 32, 16, 20, 100, 0, 10, 2, 50, true, RK_ROPE_NEOX, 3, k8);
        /* no summary rows (the ablation), one compressed row */
        run_case(be, 6, 3, 64, 32, 30, 1, 4, 5, 1, 0, false, RK_ROPE_NEOX, 4, k8);
        run_case(be, 6, 3, 64, 32, 30, 150, 4, 5, 1, 2, false, RK_ROPE_NEOX, 5, k8);
    }
}

Test(lr_attn, bad_arguments_are_named) {
    lr_case c;
    lr_case_make(&c, 4, 2, 32, 32, 16, 64, 4, 8, 1, 1, true, RK_ROPE_NEOX, 9);
    rk_backend *be = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_backend_cpu_ref_create(&be, &e), RK_OK);
    rk_op_args a = lr_case_args(&c, &c.L, c.q, c.out);
    a.lr = NULL;
    cr_expect_eq(rk_backend_run(be, &a, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "LR_ATTN"), "%s", e.msg);
    rk_lr_attn_args L = c.L;
    L.x_lo = c.pos0 + 1; /* the query's own row not in the window */
    a.lr = &L;
    cr_expect_eq(rk_backend_run(be, &a, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "exact"), "%s", e.msg);
    L = c.L;
    L.chunk = 33;
    cr_expect_eq(rk_backend_run(be, &a, &e), RK_E_INVALID_ARG);
    L = c.L;
    L.coef = NULL;
    cr_expect_eq(rk_backend_run(be, &a, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "NULL"), "%s", e.msg);
    a = lr_case_args(&c, &c.L, c.q, c.out);
    a.src0.ne[1] = 100; /* 100 rows x 2 heads per KV head: fine for state, but dst rows differ */
    cr_expect_eq(rk_backend_run(be, &a, &e), RK_E_INVALID_ARG);
    rk_backend_destroy(be);
    lr_case_free(&c);
}
