/* LowRAM's full layers (full=N): the fit measures, per layer, the share of the last prompt
 * queries' attention that a budget-sized landmark selection leaves out (stats.sel_miss),
 * the N layers that lose most attend every chunk at decode, and an exported state carries
 * them. stories260K from ../shared. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "rk_kernels.h"
#include "rt_shared.h"
#include "session_impl.h"

/* Reference miss of layer l in double precision: per KV head and observed row o, the
 * landmarks (mean exact post-RoPE key of each full chunk of [sink, comp_end)) scored by the
 * best of the group's queries, the n_sel best kept, and the softmax weight of the other
 * chunks averaged over the group; the mean over heads and rows. Keys from the twin x that
 * compressed nothing, queries from the fitted session f (the same prompt: the same queries).
 * *tie: the smallest gap between the n_sel-th and the next score, relative to the scores'
 * spread (a float ranking may differ from this one below about 1e-5). */
static double ref_miss(const rk_kv_codec *f, const rk_kv_codec *x, int l, int64_t n, double *tie) {
    const int hd = x->hd, grp = x->n_head / x->n_head_kv, W = x->p.obs_window, qd = x->n_head * hd;
    const int64_t sink = x->p.n_sink, C = f->p.chunk, n_sel = (f->p.budget + C - 1) / C;
    const int64_t n_ch = (f->comp_end - sink) / C;
    const int n_obs = f->obs_n[l] < W ? f->obs_n[l] : W;
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    float *K = malloc((size_t)n * hd * sizeof(float));
    double *lm = calloc((size_t)n_ch * hd, sizeof(double)), *sc = malloc((size_t)n_ch * sizeof(double));
    double *wt = malloc((size_t)n * sizeof(double)), *cm = calloc((size_t)n_ch, sizeof(double));
    double *srt = malloc((size_t)n_ch * sizeof(double));
    double total = 0;
    int cnt = 0;
    for (int h = 0; h < x->n_head_kv; h++) {
        for (int64_t p = 0; p < n; p++)
            f16->to_f32((const uint16_t *)lr_exact_ptr(x, l, false, p) + (size_t)h * hd, K + p * hd, hd);
        memset(lm, 0, (size_t)n_ch * hd * sizeof(double));
        for (int64_t ch = 0; ch < n_ch; ch++)
            for (int64_t p = sink + ch * C; p < sink + (ch + 1) * C; p++)
                for (int e = 0; e < hd; e++) lm[ch * hd + e] += K[p * hd + e] / (double)C;
        for (int o = 0; o < n_obs; o++) {
            const int64_t pq = f->obs_pos[(size_t)l * W + o];
            if (pq >= n) continue;
            for (int64_t ch = 0; ch < n_ch; ch++) sc[ch] = -INFINITY, cm[ch] = 0;
            for (int g = 0; g < grp; g++) {
                const float *q = f->obs_q + ((size_t)l * W + o) * qd + (size_t)(h * grp + g) * hd;
                double mx = -INFINITY, sum = 0;
                for (int64_t p = 0; p <= pq; p++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)q[e] * K[p * hd + e];
                    wt[p] = d / sqrt((double)hd);
                    mx = wt[p] > mx ? wt[p] : mx;
                }
                for (int64_t p = 0; p <= pq; p++) sum += wt[p] = exp(wt[p] - mx);
                for (int64_t ch = 0; ch < n_ch; ch++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)q[e] * lm[ch * hd + e];
                    sc[ch] = d > sc[ch] ? d : sc[ch];
                    for (int64_t p = sink + ch * C; p < sink + (ch + 1) * C && p <= pq; p++)
                        cm[ch] += wt[p] / sum / grp;
                }
            }
            /* the n_sel-th best score by selection sort on a copy */
            memcpy(srt, sc, (size_t)n_ch * sizeof(double));
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t ch = 0; ch < n_ch; ch++) lo = sc[ch] < lo ? sc[ch] : lo, hi = sc[ch] > hi ? sc[ch] : hi;
            for (int64_t k = 0; k <= n_sel && k < n_ch; k++)
                for (int64_t j = k + 1; j < n_ch; j++)
                    if (srt[j] > srt[k]) {
                        const double t = srt[j];
                        srt[j] = srt[k], srt[k] = t;
                    }
            const double th = srt[n_sel - 1], gap = (srt[n_sel - 1] - srt[n_sel]) / (hi - lo + 1e-30);
            *tie = gap < *tie ? gap : *tie;
            double out = 0;
            for (int64_t ch = 0; ch < n_ch; ch++)
                if (sc[ch] < th) out += cm[ch];
            total += out;
            cnt++;
        }
    }
    free(K), free(lm), free(sc), free(wt), free(cm), free(srt);
    return cnt ? total / cnt : -1;
}

/* The fit's sel_miss is the reference's within float rounding (1e-4 absolute on a share
 * summed from at most 300 weights, each off by ~1e-7 relative), where no ranking sits on a
 * near tie; the full layers are the full_layers largest, each at least full_min, and exactly
 * those have ly[].full. */
Test(lowram_full, sel_miss_and_the_full_layers) {
    rk_model *m = rt_stories_like(1);
    const int n_p = 300;
    int32_t *ids = rt_random_ids(m, (size_t)(n_p), 11);
    rk_session *a = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=2", 0);
    rk_session *b = rt_lowram_session(m, "window=400,chunk=16,start=0,budget=32,full=2", 0);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(a, ids, n_p, NULL, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, ids, n_p, NULL, false, &e), RK_OK, "%s", e.msg);
    const rk_kv_codec *ca = a->kv->impl, *cb = b->kv->impl;
    cr_assert(ca->fitted && !cb->fitted, "the first session fits, its twin keeps every row exact");
    rk_lowram_stats st;
    rk_session_lowram_stats(a, &st);
    double ref[64];
    cr_assert_leq(ca->n_layer, 64);
    int checked = 0;
    for (int l = 0; l < ca->n_layer; l++) {
        double tie = INFINITY;
        ref[l] = ref_miss(ca, cb, l, n_p, &tie);
        cr_log_info("layer %d: sel_miss %.5f, reference %.5f (closest tie %.2g)", l, (double)st.sel_miss[l], ref[l],
                    tie);
        cr_expect_gt(ref[l], 0.0, "layer %d: the budget of 2 chunks holds all the attention: the test cannot tell", l);
        if (tie < 1e-4) continue;
        cr_expect(fabs(st.sel_miss[l] - ref[l]) < 1e-4, "layer %d: sel_miss %.6f, reference %.6f", l,
                  (double)st.sel_miss[l], ref[l]);
        checked++;
    }
    cr_expect_geq(checked, ca->n_layer - 1, "only %d layers away from ties", checked);
    /* the choice: the two largest (by the codec's own values), each >= full_min */
    cr_expect_eq(st.n_full, 2, "%d full layers", st.n_full);
    for (int f = 0; f < st.n_full; f++) {
        const int lf = st.full_l[f];
        cr_expect(ca->ly[lf].full, "layer %d listed but not full", lf);
        cr_expect_geq(st.sel_miss[lf], ca->p.full_min);
        for (int l = 0; l < ca->n_layer; l++)
            if (!ca->ly[l].full)
                cr_expect_geq(st.sel_miss[lf], st.sel_miss[l], "layer %d (%.5f) is full, layer %d (%.5f) is not", lf,
                              (double)st.sel_miss[lf], l, (double)st.sel_miss[l]);
    }
    int n_flag = 0;
    for (int l = 0; l < ca->n_layer; l++) n_flag += ca->ly[l].full;
    cr_expect_eq(n_flag, st.n_full);
    free(ids);
    rk_session_destroy(a), rk_session_destroy(b);
    rk_model_destroy(m);
}

/* A full layer attends every chunk: full=1 decodes bit for bit as full=0 with that layer's
 * budget raised past the context (el0/el1/ebudget), and differs from full=0 alone (so the
 * layer's selection mattered); fullmin=1 (no layer loses all) chooses none. */
Test(lowram_full, a_full_layer_attends_every_chunk) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n_p = 300, n_dec = 12;
    int32_t *ids = rt_random_ids(m, (size_t)(n_p + n_dec), 11);
    rk_session *f = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=1", 0);
    float *lf = rt_decode_trace(f, ids, n_p, n_dec, nv);
    rk_lowram_stats st;
    rk_session_lowram_stats(f, &st);
    cr_assert_eq(st.n_full, 1);
    const int L = st.full_l[0];
    char spec[160];
    snprintf(spec, sizeof spec, "window=64,chunk=16,start=0,budget=32,full=0,el0=%d,el1=%d,ebudget=100000", L, L + 1);
    rk_session *e = rt_lowram_session(m, spec, 0),
               *z = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=0", 0);
    rk_session *h = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=2,fullmin=1", 0);
    float *le = rt_decode_trace(e, ids, n_p, n_dec, nv), *lz = rt_decode_trace(z, ids, n_p, n_dec, nv),
          *lh = rt_decode_trace(h, ids, n_p, n_dec, nv);
    const size_t n = (size_t)n_dec * nv;
    cr_log_info("full layer %d (miss %.4f): vs its budget raised %g, vs none %g", L, (double)st.sel_miss[L],
                rt_max_abs_diff(lf, le, n), rt_max_abs_diff(lf, lz, n));
    cr_expect_eq(rt_max_abs_diff(lf, le, n), 0.0, "full layer %d differs from the same layer's budget past the context",
                 L);
    cr_expect_gt(rt_max_abs_diff(lf, lz, n), 1e-4, "making layer %d full changed nothing", L);
    /* the key cache: per (layer, KV head) the layer's chunks and kslots=36 spare ones, an f16
     * scale + head_dim int8 per row and 16 bytes of tags per slot; every chunk of the context
     * (n_ctx 512 / 16) in the full layer */
    const rk_hparams *hp = rk_model_hparams(m);
    const rk_kv_codec *cf = f->kv->impl;
    cr_assert_eq(cf->cap_chunks, 512 / 16);
    rk_kv_bytes kb;
    rk_session_kv_bytes(f, &kb);
    const uint64_t slot = 16ull * (hp->head_dim + 2) + 16;
    cr_expect_eq(kb.key_cache, (uint64_t)hp->n_head_kv * slot * ((uint64_t)(hp->n_layer - 1) * (2 + 36) + (32 + 36)),
                 "key cache %llu bytes", (unsigned long long)kb.key_cache);
    rk_session_lowram_stats(h, &st);
    cr_expect_eq(st.n_full, 0, "fullmin=1 chose %d layers", st.n_full);
    cr_expect_eq(rt_max_abs_diff(lh, lz, n), 0.0, "no full layer, yet the logits differ from full=0");
    free(lf), free(le), free(lz), free(lh), free(ids);
    rk_session_destroy(f), rk_session_destroy(e), rk_session_destroy(z), rk_session_destroy(h);
    rk_model_destroy(m);
}

/* A full layer's first decode step misses every chunk: its keys are rebuilt in batches of
 * kbatch chunks (default: the largest budgeted layer's choice, at least 64), so the batch's
 * work area does not grow with the context. Batches of 3 chunks (11 batches for the 32
 * chunks of a 512-row context) decode bit for bit as one batch, rebuild the same rows, and
 * the scratch shrinks by the (32 - 3) chunks' rows of coefficients, keys, angles, ids of
 * every KV head (each head has a batch area of its own). */
Test(lowram_full, a_full_layer_rebuilds_in_batches) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n_p = 300, n_dec = 12;
    int32_t *ids = rt_random_ids(m, (size_t)(n_p + n_dec), 11);
    rk_session *one = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=1,kbatch=32", 0);
    rk_session *few = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=1,kbatch=3", 0);
    rk_session *def = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=1", 0);
    float *l1 = rt_decode_trace(one, ids, n_p, n_dec, nv), *l3 = rt_decode_trace(few, ids, n_p, n_dec, nv);
    float *ld = rt_decode_trace(def, ids, n_p, n_dec, nv);
    const size_t n = (size_t)n_dec * nv;
    cr_expect_eq(rt_max_abs_diff(l1, l3, n), 0.0, "batches of 3 chunks decode otherwise than one batch");
    cr_expect_eq(rt_max_abs_diff(l1, ld, n), 0.0, "the default batch decodes otherwise than one batch");
    rk_lowram_stats s1, s3;
    rk_session_lowram_stats(one, &s1), rk_session_lowram_stats(few, &s3);
    cr_assert_eq(s1.n_full, 1);
    cr_expect_eq(s3.n_full, 1);
    cr_expect_eq(s3.full_l[0], s1.full_l[0]);
    cr_expect_eq(s1.rows_rebuilt, s3.rows_rebuilt, "rebuilt %llu vs %llu rows", (unsigned long long)s1.rows_rebuilt,
                 (unsigned long long)s3.rows_rebuilt);
    /* the first step of the full layer alone rebuilds every compressed row of each KV head */
    const rk_kv_codec *c1 = one->kv->impl, *c3 = few->kv->impl, *cd = def->kv->impl;
    cr_expect_geq(s1.rows_rebuilt, (uint64_t)rk_model_hparams(m)->n_head_kv * (uint64_t)(n_p - 64 - 16));
    cr_assert_eq(c1->cap_chunks, 32);
    cr_expect_eq(c1->dec.bch, 32);
    cr_expect_eq(c3->dec.bch, 3);
    cr_expect_eq(cd->dec.bch, 32, "default batch %lld", (long long)cd->dec.bch);
    const uint64_t per_chunk =
        16ull * ((uint64_t)c1->r_max + (uint64_t)c1->hd + 1 + (uint64_t)c1->n_rot) * sizeof(float) + 4;
    rk_kv_bytes b1, b3;
    rk_session_kv_bytes(one, &b1), rk_session_kv_bytes(few, &b3);
    cr_expect_eq(b1.scratch - b3.scratch, 29 * per_chunk * (uint64_t)rk_model_hparams(m)->n_head_kv,
                 "scratch %llu vs %llu bytes", (unsigned long long)b1.scratch, (unsigned long long)b3.scratch);
    free(l1), free(l3), free(ld), free(ids);
    rk_session_destroy(one), rk_session_destroy(few), rk_session_destroy(def);
    rk_model_destroy(m);
}

/* An exported state carries its full layers, most missed first: an importer with full=2
 * lists the exporter's in its order and decodes bit for bit as the exporter goes on; one
 * with full=1 takes the first only, one with full=0 none (and then decodes otherwise). */
Test(lowram_full, the_state_carries_its_full_layers) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n_p = 300, n_dec = 8;
    int32_t *ids = rt_random_ids(m, (size_t)(n_p + n_dec), 11);
    rk_session *a = rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=2", 0);
    rk_session *im[3] = {rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=2", 0),
                         rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=1", 0),
                         rt_lowram_session(m, "window=64,chunk=16,start=0,budget=32,full=0", 0)};
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(a, ids, n_p, NULL, false, &e), RK_OK, "%s", e.msg);
    void *blk;
    size_t n;
    cr_assert_eq(rk_session_kv_export(a, 0, n_p, &blk, &n, &e), RK_OK, "%s", e.msg);
    rk_lowram_stats sa, sb;
    rk_session_lowram_stats(a, &sa);
    cr_assert_eq(sa.n_full, 2);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(rk_session_kv_import(im[k], blk, n, &e), RK_OK, "%s", e.msg);
        rk_session_lowram_stats(im[k], &sb);
        cr_expect_eq(sb.n_full, 2 - k, "importer %d lists %d full layers", k, sb.n_full);
        for (int f = 0; f < sb.n_full && f < 2; f++)
            cr_expect_eq(sb.full_l[f], sa.full_l[f], "importer %d: full layer %d is %d, the exporter's %d", k, f,
                         sb.full_l[f], sa.full_l[f]);
        const rk_kv_codec *cb = im[k]->kv->impl;
        int n_flag = 0;
        for (int l = 0; l < cb->n_layer; l++) n_flag += cb->ly[l].full;
        cr_expect_eq(n_flag, 2 - k, "importer %d marks %d layers full", k, n_flag);
    }
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    int diff[3] = {0, 0, 0};
    for (int i = 0; i < n_dec; i++) {
        cr_assert_eq(rk_session_eval(a, &ids[n_p + i], 1, la, false, &e), RK_OK, "%s", e.msg);
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(rk_session_eval(im[k], &ids[n_p + i], 1, lb, false, &e), RK_OK, "%s", e.msg);
            diff[k] += memcmp(la, lb, (size_t)nv * sizeof(float)) != 0;
        }
    }
    cr_expect_eq(diff[0], 0, "%d of %d steps differ after the import with full=2", diff[0], n_dec);
    cr_expect_gt(diff[2], 0, "full=0 after the import decodes as the exporter: its full layers were kept");
    free(la), free(lb), free(ids);
    rk_session_destroy(a);
    for (int k = 0; k < 3; k++) rk_session_destroy(im[k]);
    rk_model_destroy(m);
    free(blk);
}
