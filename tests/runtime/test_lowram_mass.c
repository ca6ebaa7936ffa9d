/* LowRAM's question rows (vkeep) and pinned chunks (vpin): the fit gives residuals to the rows
 * and pins the chunks that the last prompt queries' attention points at, and sparse decode
 * attends the pinned chunks whatever their landmarks score. stories260K from ../shared. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "rk_kernels.h"
#include "rt_shared.h"
#include "session_impl.h"

/* Reference mass of (layer l, KV head h) over positions [sink, n) in double precision: for
 * each observed query of the head's group, the softmax of q·k / sqrt(hd) over the keys it
 * sees, added up; keys from a codec that has compressed nothing (exact rows). */
static void ref_mass(const rk_kv_codec *x, int l, int h, int64_t n, double *mass) {
    const int hd = x->hd, grp = x->n_head / x->n_head_kv, W = x->p.obs_window, qd = x->n_head * hd;
    const int64_t sink = x->p.n_sink;
    const int n_obs = x->obs_n[l] < W ? x->obs_n[l] : W;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    float *K = malloc((size_t)n * hd * sizeof(float));
    double *sc = malloc((size_t)n * sizeof(double));
    for (int64_t p = 0; p < n; p++)
        f16->to_f32((const uint16_t *)lr_exact_ptr(x, l, false, p) + (size_t)h * hd, K + p * hd, hd);
    for (int64_t p = sink; p < n; p++) mass[p - sink] = 0;
    for (int g = 0; g < grp; g++)
        for (int o = 0; o < n_obs; o++) {
            const float *q = x->obs_q + ((size_t)l * W + o) * qd + (size_t)(h * grp + g) * hd;
            const int64_t pq = x->obs_pos[(size_t)l * W + o];
            if (pq >= n) continue;
            double mx = -INFINITY, sum = 0;
            for (int64_t p = 0; p <= pq; p++) {
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)q[e] * K[p * hd + e];
                sc[p] = d / sqrt((double)hd);
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int64_t p = 0; p <= pq; p++) sum += sc[p] = exp(sc[p] - mx);
            for (int64_t p = sink; p <= pq; p++) mass[p - sink] += sc[p] / sum;
        }
    free(K), free(sc);
}

static int cmp_desc(const void *a, const void *b) {
    const double u = *(const double *)a, v = *(const double *)b;
    return (u < v) - (u > v);
}

/* k-th largest (1-based) of n values */
static double kth(const double *v, int64_t n, int64_t k) {
    double *t = malloc((size_t)n * sizeof(double));
    memcpy(t, v, (size_t)n * sizeof(double));
    qsort(t, (size_t)n, sizeof(double), cmp_desc);
    const double r = t[k - 1];
    free(t);
    return r;
}

/* With `nomass` and vkeep = resid, the residual rows of every (layer, KV head) are exactly
 * the rows of highest pooled mass (max over vpool rows either side), and the pinned chunks
 * the ones whose best pooled row is highest. The reference recomputes the mass from the exact
 * keys of a twin session that compressed nothing (window past the prompt) and the fitted
 * session's observed queries; the two rankings may differ only inside a tie band of 1e-3
 * (float against double sums). Without the forced choice the residual rows follow ||δ||²,
 * and without pins none are set: either fails. */
Test(lowram_mass, question_rows_get_residuals_and_pins) {
    rk_model *m = rt_stories_like(1);
    const int n_p = 300;
    int32_t *ids = rt_random_ids(m, (size_t)(n_p), 11);
    rk_session *a = rt_lowram_session(m, "window=64,chunk=16,start=0,nomass,resid=0.1,vkeep=0.1,vpin=3,vpool=2", 0);
    rk_session *b = rt_lowram_session(m, "window=400,chunk=16,start=0,nomass,resid=0.1,vkeep=0.1,vpin=3,vpool=2", 0);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(a, ids, n_p, NULL, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, ids, n_p, NULL, false, &e), RK_OK, "%s", e.msg);
    const rk_kv_codec *ca = a->kv->impl, *cb = b->kv->impl;
    cr_assert(ca->fitted && !cb->fitted, "the first session fits, its twin keeps every row exact");
    const int64_t sink = ca->p.n_sink, n_cand = ca->comp_end - sink, C = ca->p.chunk, w = 2;
    const int64_t n_ch = (n_cand + C - 1) / C, m_keep = llround(0.1 * (double)n_cand);
    cr_assert_eq(ca->g[0].n_rows, n_cand);
    double *ms = malloc((size_t)n_p * sizeof(double)), *pm = malloc((size_t)n_cand * sizeof(double));
    double *cm = malloc((size_t)n_ch * sizeof(double));
    int bad_res = 0, bad_pin = 0, checked = 0;
    for (int l = 0; l < ca->n_layer; l++)
        for (int h = 0; h < ca->n_head_kv; h++) {
            cr_assert_eq(memcmp(ca->obs_q, cb->obs_q,
                                sizeof(float) * (size_t)ca->n_layer * ca->p.obs_window * ca->n_head * ca->hd),
                         0, "the twins observed other queries");
            ref_mass(cb, l, h, n_p, ms);
            for (int64_t i = 0; i < n_cand; i++) {
                pm[i] = ms[i];
                for (int64_t d = i - w < 0 ? 0 : i - w; d <= i + w && d < n_cand; d++)
                    pm[i] = ms[d] > pm[i] ? ms[d] : pm[i];
            }
            const lr_head *H = &ca->ly[l].h[h];
            /* residual rows: the m_keep best pooled rows, up to ties within 1e-3 */
            const double th = kth(pm, n_cand, m_keep);
            int64_t n_bits = 0;
            for (int64_t i = 0; i < n_cand; i++) {
                const bool bit = (H->mask[i / C] >> (i % C)) & 1u;
                n_bits += bit;
                if (bit ? pm[i] < th * (1 - 1e-3) : pm[i] > th * (1 + 1e-3)) bad_res++;
            }
            cr_expect_eq(n_bits, m_keep, "layer %d head %d: %lld residual rows, %lld wanted", l, h, (long long)n_bits,
                         (long long)m_keep);
            /* pins: the 3 chunks whose best pooled row is highest */
            for (int64_t ch = 0; ch < n_ch; ch++) {
                cm[ch] = 0;
                for (int64_t i = ch * C; i < (ch + 1) * C && i < n_cand; i++) cm[ch] = pm[i] > cm[ch] ? pm[i] : cm[ch];
            }
            const double tc = kth(cm, n_ch, 3);
            cr_expect_eq(H->n_pin, 3, "layer %d head %d pins %d chunks", l, h, H->n_pin);
            for (int k = 0; k < H->n_pin; k++) {
                bool dup = false;
                for (int j = 0; j < k; j++) dup |= H->pin[j] == H->pin[k];
                if (dup || H->pin[k] < 0 || H->pin[k] >= n_ch || cm[H->pin[k]] < tc * (1 - 1e-3)) bad_pin++;
            }
            checked++;
        }
    cr_log_info("%d (layer, head) pairs, %lld candidate rows, %lld forced residual rows each", checked,
                (long long)n_cand, (long long)m_keep);
    cr_expect_eq(bad_res, 0, "%d residual rows outside the pooled-mass ranking", bad_res);
    cr_expect_eq(bad_pin, 0, "%d pinned chunks outside the pooled-mass ranking", bad_pin);
    free(ms), free(pm), free(cm), free(ids);
    rk_session_destroy(a), rk_session_destroy(b);
    rk_model_destroy(m);
}

/* A budget of exactly the pinned chunks attends the pins whatever the landmarks score:
 * changing the scores (spread) leaves every logit bit for bit, while without pins the same
 * change moves them (checked first, so the test can tell). */
Test(lowram_mass_shared, pinned_chunks_fill_the_budget_whatever_landmarks_score) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab, n_p = 300, n_dec = 12;
    int32_t *ids = rt_story_ids(m, n_p + n_dec);
    const char *spec[4] = {
        "window=64,chunk=16,start=0,budget=32,vpin=0", "window=64,chunk=16,start=0,budget=32,vpin=0,spread=3",
        "window=64,chunk=16,start=0,budget=32,vpin=2", "window=64,chunk=16,start=0,budget=32,vpin=2,spread=3"};
    float *lg[4];
    for (int k = 0; k < 4; k++) {
        rk_session *s = rt_lowram_session(m, spec[k], 0);
        lg[k] = rt_decode_trace(s, ids, n_p, n_dec, nv);
        rk_session_destroy(s);
    }
    const size_t n = (size_t)n_dec * nv;
    const double moved = rt_max_abs_diff(lg[0], lg[1], n), pinned = rt_max_abs_diff(lg[2], lg[3], n);
    const double by_pins = rt_max_abs_diff(lg[0], lg[2], n);
    cr_log_info("landmark change moves unpinned logits by %g, pinned by %g; pins move them by %g", moved, pinned,
                by_pins);
    cr_assert_gt(moved, 1e-4, "spread did not change the unpinned choice: the test cannot tell");
    cr_expect_eq(pinned, 0.0, "with the budget full of pins the landmarks still changed the logits by %g", pinned);
    cr_expect_gt(by_pins, 1e-4, "pins did not change the choice");
    for (int k = 0; k < 4; k++) free(lg[k]);
    free(ids);
    rk_model_destroy(m);
}
