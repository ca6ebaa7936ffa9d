/* LowRAM: the value predictor, dense == exact at full rank, byte accounting, predictor-file
 * refusal, selection, pfit on a generated model of stories260K's shape; the decode KL bounds
 * (lowram_shared) on the trained stories260K from ../shared. (The LR_KEYS op:
 * test_lowram_op.c; the AVX2 dots: test_lowram_dots.c; the eigensolver and Cholesky:
 * test_linalg.c.) */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lowram_impl.h"
#include "rk_kernels.h"
#include "rk_fitters.h"
#include "session_impl.h"
#include "rk_io.h"
#include "rt_shared.h"
#include "tb.h"

/* ---- sessions on stories260K ---------------------------------------------------------- */


/* A session with a plain kv_type cache, or (lowram != NULL) the LowRAM policy with that
 * spec, its exact rows of kv_type. */
static rk_session *session(const rk_model *m, uint32_t kv_type, const char *lowram) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.n_threads = 2;
    sp.kv.kind = kv_type == RK_DT_F32 ? RK_KV_F32 : RK_KV_F16;
    rk_err e = {0};
    if (lowram) {
        sp.kv.kind = RK_KV_LOWRAM;
        cr_assert_eq(rk_lowram_parse(lowram, &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
        sp.kv.lowram.exact_type = kv_type;
        /* these 512-row sessions test the compressed form: no default start threshold (the
         * default's resolution is tested in start_threshold_keeps_rows_exact) */
        if (sp.kv.lowram.fit_min == 0) sp.kv.lowram.fit_min = -1;
    }
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

static rk_kv_codec *codec(const rk_session *s) {
    cr_assert_eq(s->kv->kind, RK_KV_LOWRAM);
    return s->kv->impl;
}

/* Prefill n_prompt tokens, then n_dec teacher-forced decode steps; logits of every step
 * (n_dec + 1 rows: after the prompt and after each decode token). */
static float *trace(rk_session *s, const int32_t *ids, int n_prompt, int n_dec, int n_vocab) {
    float *lg = malloc((size_t)(n_dec + 1) * n_vocab * sizeof(float));
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, (size_t)n_prompt, lg, false, &e), RK_OK, "%s", e.msg);
    for (int i = 0; i < n_dec; i++)
        cr_assert_eq(rk_session_eval(s, &ids[n_prompt + i], 1, lg + (size_t)(i + 1) * n_vocab, false, &e), RK_OK, "%s",
                     e.msg);
    return lg;
}

/* Full rank, f32 coefficients, every residual kept (f16), every chunk rebuilt: the codec
 * loses only the f16 rounding of the residuals and fp32 rounding of the rebuild, the same
 * class of error as the f16 cache itself. Bound: the lowram logits stay within twice the
 * distance between the f16 and f32 plain caches (plus 1e-4 for rounding of order 1e-5). */
Test(lowram, dense_full_rank_all_residuals_equals_exact) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n_prompt = 300, n_dec = 24;
    int32_t *ids = rt_random_ids(m, (size_t)(n_prompt + n_dec), 11);
    rk_session *s16 = session(m, RK_DT_F16, NULL), *s32 = session(m, RK_DT_F32, NULL);
    rk_session *lr = session(m, RK_DT_F16, "rank=100000,resid=1,rtype=f16,coef=f32,dense,window=64");
    float *a = trace(s16, ids, n_prompt, n_dec, nv), *b = trace(s32, ids, n_prompt, n_dec, nv);
    float *c = trace(lr, ids, n_prompt, n_dec, nv);
    rk_lowram_stats st;
    rk_session_lowram_stats(lr, &st);
    cr_assert(st.fitted, "the codec should have compressed the prompt");
    cr_expect_lt(st.key_rel_err, 1e-6, "full rank keeps all key energy up to fp32 rounding (%g)", st.key_rel_err);
    rk_kv_bytes kb;
    rk_session_kv_bytes(lr, &kb);
    cr_assert_gt(kb.n_compressed_rows, 200, "rows compressed: %lld", (long long)kb.n_compressed_rows);
    const size_t n = (size_t)(n_dec + 1) * nv;
    double d16_32 = rt_max_abs_diff(a, b, n), dlr = rt_max_abs_diff(a, c, n);
    cr_expect(dlr <= 2 * d16_32 + 1e-4, "lowram vs f16 %g, f16 vs f32 %g", dlr, d16_32);
    free(a), free(b), free(c), free(ids);
    rk_session_destroy(s16), rk_session_destroy(s32), rk_session_destroy(lr);
    rk_model_destroy(m);
}

/* A synthetic cache where every value row is an exact linear function of the pre-RoPE
 * key rows of its layer: at full rank the ridge fit (λ tiny) predicts it with R² = 1 and
 * every stored residual is zero up to fp32 rounding. */
Test(lowram, linear_values_are_predicted_with_zero_residual) {
    rk_model *m = rt_stories_like(1);
    const rk_hparams *hp = rk_model_hparams(m);
    rk_session *s = session(m, RK_DT_F32, "rank=100000,coef=f32,window=32,lambda=1e-9");
    rk_kv_codec *c = codec(s);
    const int kvd = hp->n_head_kv * hp->head_dim, n = 400;
    uint64_t rng = 9;
    float *A = malloc((size_t)kvd * kvd * sizeof(float)), bias[64], k[64], v[64];
    rk_err e = {0};
    lr_rope_fill(c, n);
    for (int l = 0; l < hp->n_layer; l++) {
        for (int i = 0; i < kvd * kvd; i++) A[i] = tb_rand_normal(&rng) * 0.3f;
        for (int j = 0; j < kvd; j++) bias[j] = tb_rand_normal(&rng);
        for (int p = 0; p < n; p++) {
            for (int j = 0; j < kvd; j++) k[j] = tb_rand_normal(&rng) + (j % 5 == 0 ? 2.0f : 0.0f);
            for (int j = 0; j < kvd; j++) {
                double acc = bias[j];
                for (int i = 0; i < kvd; i++) acc += (double)k[i] * A[(size_t)i * kvd + j];
                v[j] = (float)acc;
            }
            lr_rope_row(c, k, hp->n_head_kv, p, false); /* the cache holds post-RoPE keys */
            cr_assert_eq(s->kv->ops->append(s->kv, l, p, k, v, 1, &e), RK_OK, "%s", e.msg);
        }
    }
    cr_assert_eq(lr_fit(c, n, &e), RK_OK, "%s", e.msg);
    float *d = malloc((size_t)hp->head_dim * sizeof(float));
    for (int l = 0; l < hp->n_layer; l++)
        for (int h = 0; h < hp->n_head_kv; h++) {
            const lr_head *H = &c->ly[l].h[h];
            cr_expect_gt(H->r2, 1.0f - 1e-5f, "layer %d head %d: R² %.9f", l, h, (double)H->r2);
            cr_expect_gt(H->n_res, 0);
            double mx = 0;
            for (int64_t j = 0; j < H->n_res; j++) {
                lr_res_row(c, H, j, d);
                for (int t = 0; t < hp->head_dim; t++) mx = fmax(mx, fabs(d[t]));
            }
            /* values are O(10): fp32 rounding of the fit leaves ~1e-5 */
            cr_expect_lt(mx, 1e-3, "layer %d head %d: largest residual %g", l, h, mx);
        }
    free(A), free(d);
    rk_session_destroy(s);
    rk_model_destroy(m);
}

/* Byte accounting: the parts sum to the total, and each part matches a count made from the
 * codec's own arrays (rows, ranks, residual masks walked bit by bit). */
Test(lowram, byte_accounting_adds_up) {
    rk_model *m = rt_stories_like(1);
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab;
    int32_t *ids = rt_random_ids(m, (size_t)(340), 11);
    /* kslots=2: the default 18 spare key-cache chunks would outweigh this tiny model's 340 rows */
    rk_session *s =
        session(m, RK_DT_F16, "rank=24,window=64,coef=int8,budget=64,kslots=2,summ,chunk=32,rtype=int8,full=0");
    rk_kv_bytes b;
    rk_session_kv_bytes(s, &b);
    cr_expect_eq(b.total, 0);
    float *lg = trace(s, ids, 300, 40, nv);
    rk_session_kv_bytes(s, &b);
    cr_expect_eq(b.total, b.exact + b.coef + b.bases + b.predictors + b.residuals + b.landmarks + b.meta + b.key_cache);
    /* key cache: (64/32 + 2) chunk slots of 32 rows (an f16 scale + head_dim int8: the default int8 cache)
     * per (layer, KV head), 16 bytes of tags */
    cr_expect_eq(b.key_cache,
                 (uint64_t)hp->n_layer * hp->n_head_kv * (64 / 32 + 2) * (32ull * (hp->head_dim + 2) + 16));
    const rk_kv_codec *c = codec(s);
    const int kvd = hp->n_head_kv * hp->head_dim, C = c->p.chunk;
    cr_expect_eq(b.n_tokens, 340);
    cr_expect_eq(b.f16_equiv, 340ull * 2 * hp->n_layer * kvd * 2);
    cr_expect_eq(b.n_exact_rows + b.n_compressed_rows + b.n_evicted_rows, 340);
    cr_expect(b.n_exact_rows >= 4 + 64 && b.n_exact_rows < 4 + 64 + C, "exact rows %lld", (long long)b.n_exact_rows);
    cr_expect_eq(b.exact, (uint64_t)b.n_exact_rows * 2 * hp->n_layer * kvd * 2);
    uint64_t coef = 0, bases = 0, pred = 0, res = 0, lmk = 0, meta = 0;
    for (int gi = 0; gi < c->n_group; gi++) {
        const lr_group *g = &c->g[gi];
        cr_expect_eq(g->r, 24);
        cr_expect_eq(g->n_rows, b.n_compressed_rows);
        const uint64_t n_ch = (uint64_t)(g->n_rows + C - 1) / C;
        coef += (uint64_t)g->n_rows * (24 + 2);      /* int8 + f16 scale */
        bases += 3ull * g->D * 4 + 24ull * g->D * 2; /* f16 basis */
        lmk += n_ch * 24 * 2 + 24 * 4;
        meta += (uint64_t)g->n_rows * 4;
        for (int li = 0; li < g->n_l; li++) {
            pred += 24ull * kvd * 2 + kvd * 4;
            lmk += n_ch * kvd * 2 + kvd * 4;
            /* decode's value summaries: per chunk and KV head an f16 scale + head_dim int8, counted
             * for every chunk (built up to the chunks of the last decode step: a commit after it
             * may have added one) */
            const lr_layer *L = &c->ly[g->l0 + li];
            cr_expect(L->vsm && (L->vs_n == (int64_t)n_ch || L->vs_n + 1 == (int64_t)n_ch),
                      "layer %d: %lld value summaries for %llu chunks", g->l0 + li, (long long)L->vs_n,
                      (unsigned long long)n_ch);
            lmk += n_ch * hp->n_head_kv * (hp->head_dim + 2);
            for (int h = 0; h < hp->n_head_kv; h++) {
                const lr_head *H = &c->ly[g->l0 + li].h[h];
                uint64_t bits = 0;
                for (uint64_t ch = 0; ch < n_ch; ch++) bits += (uint64_t)__builtin_popcount(H->mask[ch]);
                cr_expect_eq(bits, (uint64_t)H->n_res, "layer %d head %d: mask bits %llu vs %lld", g->l0 + li, h,
                             (unsigned long long)bits, (long long)H->n_res);
                res += bits * (uint64_t)(hp->head_dim + 2);
                meta += n_ch * 8 + 4;
            }
        }
    }
    meta += ((uint64_t)c->n_ctx / 64 + 1 + 64) * hp->n_rot * 4; /* RoPE angles: a row per 64 positions + 64 rows */
    cr_expect_eq(b.coef, coef);
    cr_expect_eq(b.bases, bases);
    cr_expect_eq(b.predictors, pred);
    cr_expect_eq(b.residuals, res);
    cr_expect_eq(b.landmarks, lmk);
    cr_expect_eq(b.meta, meta);
    cr_expect_lt(b.total, b.f16_equiv, "compressed KV should be smaller than f16: %llu vs %llu",
                 (unsigned long long)b.total, (unsigned long long)b.f16_equiv);
    /* without summary rows (the default) neither the chunk means nor the value summaries are
     * kept or counted; rebuilt from the coefficient rows they equal the kept ones bit for bit */
    rk_session *ns = session(m, RK_DT_F16, "rank=24,window=64,coef=int8,budget=64,kslots=2,chunk=32,rtype=int8");
    float *lg2 = trace(ns, ids, 300, 40, nv);
    rk_kv_bytes b2;
    rk_session_kv_bytes(ns, &b2);
    uint64_t cm = 0, vs = 0;
    for (int gi = 0; gi < c->n_group; gi++) {
        const uint64_t n_ch = (uint64_t)(c->g[gi].n_rows + C - 1) / C;
        cm += n_ch * 24 * 2, vs += c->g[gi].n_l * n_ch * hp->n_head_kv * (hp->head_dim + 2);
        uint16_t *re = malloc(n_ch * 24 * 2);
        rk_err e = {0};
        cr_assert_eq(lr_cmean_fill(c, &c->g[gi], re, &e), RK_OK, "%s", e.msg);
        cr_expect(!memcmp(re, c->g[gi].cmean, n_ch * 24 * 2), "group %d: rebuilt chunk means differ", gi);
        free(re);
    }
    cr_expect(!codec(ns)->cmean_on);
    cr_expect_eq(b2.landmarks, lmk - cm - vs, "landmarks %llu, with summaries %llu", (unsigned long long)b2.landmarks,
                 (unsigned long long)lmk);
    free(lg), free(lg2), free(ids);
    rk_session_destroy(s), rk_session_destroy(ns);
    rk_model_destroy(m);
}

/* Prompt = ids[0], a story, then the same story again (takes ids): predicting the second copy
 * leans on the first, which lies in the compressed rows (induction heads copy from far context). */
static int32_t *copy_of(int32_t *ids, int n_story, int n_prefix, int n_dec) {
    int32_t *out = malloc((size_t)(1 + n_story + n_prefix + n_dec) * sizeof(int32_t));
    out[0] = ids[0];
    memcpy(out + 1, ids + 1, (size_t)n_story * sizeof(int32_t));
    memcpy(out + 1 + n_story, ids + 1, (size_t)(n_prefix + n_dec) * sizeof(int32_t));
    free(ids);
    return out;
}

/* The copy prompt over the TinyStories sample (../shared), for the trained model. */
static int32_t *copy_prompt(const rk_model *m, int n_story, int n_prefix, int n_dec) {
    return copy_of(rt_story_ids(m, (size_t)n_story + 1), n_story, n_prefix, n_dec);
}

/* The same layout over pseudo-random ids (for a generated model: no story to copy). */
static int32_t *copy_prompt_random(const rk_model *m, int n_story, int n_prefix, int n_dec) {
    return copy_of(rt_random_ids(m, (size_t)n_story + 1, 11), n_story, n_prefix, n_dec);
}

/* Decode with the default codec (scaled to the tiny model) stays close to exact while
 * copying from compressed rows. Bound: mean KL(exact || lowram) under 0.02 nats per token
 * (at most ~2% perplexity) and top-1 agreement of at least 90%. For scale: the f16 cache's
 * own rounding costs ~1e-6 here, and this small model leans on far context so little that
 * keeping only 5% of the compressed rows costs ~0.006 (logged below); a codec that
 * scrambled keys or values would be far above 0.02. SmolLM2 numbers: docs/LOWRAM.md. */
Test(lowram_shared, decode_stays_close_to_exact) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 60;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    rk_session *lr = session(m, RK_DT_F16, "window=64,budget=96,chunk=16");
    rk_session *dr = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,evict=0.95,nosumm");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *b = trace(lr, ids, n_prompt, n_dec, nv);
    float *c = trace(dr, ids, n_prompt, n_dec, nv);
    const double kl = rt_mean_kl(a, b, n_dec + 1, nv), kl_drop = rt_mean_kl(a, c, n_dec + 1, nv);
    int agree = 0;
    for (int r = 0; r <= n_dec; r++) {
        int ta = 0, tb = 0;
        for (int v = 1; v < nv; v++) {
            if (a[(size_t)r * nv + v] > a[(size_t)r * nv + ta]) ta = v;
            if (b[(size_t)r * nv + v] > b[(size_t)r * nv + tb]) tb = v;
        }
        agree += ta == tb;
    }
    rk_kv_bytes kb;
    rk_session_kv_bytes(lr, &kb);
    cr_log_info("decode KL lowram %.5f (top-1 %d/%d), 95%% evicted %.5f; KV %llu of f16 %llu bytes", kl, agree,
                n_dec + 1, kl_drop, (unsigned long long)kb.total, (unsigned long long)kb.f16_equiv);
    cr_expect_gt(kb.n_compressed_rows, 200);
    cr_expect_lt(kl, 0.02, "KL %g", kl);
    cr_expect_geq(agree * 10, (n_dec + 1) * 9, "top-1 agreement %d of %d", agree, n_dec + 1);
    free(a), free(b), free(c), free(ids);
    rk_session_destroy(ex), rk_session_destroy(lr), rk_session_destroy(dr);
    rk_model_destroy(m);
}

/* The decode key cache changes what is rebuilt, never a result: more slots (kslots) give the
 * same logits bit for bit with fewer rebuilt rows. hyst (sticky selection) rebuilds fewer rows
 * than the default and stays as close to exact as the default's bound. */
Test(lowram_shared, key_cache_slots_and_hysteresis) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 40;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    /* kslots=2: a cache smaller than the 20 chunks (the default 6 + 18 slots would hold them all) */
    rk_session *d = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,kslots=2");
    rk_session *k = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,kslots=40");
    rk_session *h = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,kslots=2,hyst=1");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *ld = trace(d, ids, n_prompt, n_dec, nv);
    float *lk = trace(k, ids, n_prompt, n_dec, nv), *lh = trace(h, ids, n_prompt, n_dec, nv);
    rk_lowram_stats sd, sk, sh;
    rk_session_lowram_stats(d, &sd), rk_session_lowram_stats(k, &sk), rk_session_lowram_stats(h, &sh);
    const double diff = rt_max_abs_diff(ld, lk, (size_t)(n_dec + 1) * nv), kl = rt_mean_kl(a, lh, n_dec + 1, nv);
    cr_log_info("rebuilt rows: default %llu, kslots=40 %llu (logits differ by %g), hyst=1 %llu (KL %.5f)",
                (unsigned long long)sd.rows_rebuilt, (unsigned long long)sk.rows_rebuilt, diff,
                (unsigned long long)sh.rows_rebuilt, kl);
    cr_expect_eq(diff, 0.0, "kslots changed the logits by %g", diff);
    cr_expect_lt(sk.rows_rebuilt, sd.rows_rebuilt);
    cr_expect_lt(sh.rows_rebuilt, sd.rows_rebuilt);
    cr_expect_lt(kl, 0.02, "hyst=1 KL %g", kl);
    free(a), free(ld), free(lk), free(lh), free(ids);
    rk_session_destroy(ex), rk_session_destroy(d), rk_session_destroy(k), rk_session_destroy(h);
    rk_model_destroy(m);
}

/* kcache=int8: the key cache stores int8 rows (one f16 scale per row and head). A hit and a
 * miss give the same keys (a miss decodes what it stored), so the cache's size still never
 * changes a result (kslots: bit-identical logits); its bytes are (2 + hd) / (2 hd) of f16's
 * per row; and decode stays close to exact (the bound of decode_stays_close_to_exact). */
Test(lowram_shared, int8_key_cache) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab, n_story = 220, n_prefix = 100, n_dec = 40;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    rk_session *f = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,kcache=f16,kslots=2,full=0");
    rk_session *q = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,kcache=int8,kslots=2,full=0");
    rk_session *k = session(m, RK_DT_F16, "window=64,budget=96,chunk=16,kcache=int8,kslots=40,full=0");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *lf = trace(f, ids, n_prompt, n_dec, nv);
    float *lq = trace(q, ids, n_prompt, n_dec, nv), *lk = trace(k, ids, n_prompt, n_dec, nv);
    const double diff = rt_max_abs_diff(lq, lk, (size_t)(n_dec + 1) * nv);
    const double kl_f = rt_mean_kl(a, lf, n_dec + 1, nv), kl_q = rt_mean_kl(a, lq, n_dec + 1, nv);
    rk_kv_bytes bf, bq;
    rk_session_kv_bytes(f, &bf), rk_session_kv_bytes(q, &bq);
    rk_lowram_stats sq, sk;
    rk_session_lowram_stats(q, &sq), rk_session_lowram_stats(k, &sk);
    cr_expect_lt(sk.rows_rebuilt, sq.rows_rebuilt, "kslots=40 rebuilt no fewer rows");
    cr_log_info("int8 key cache: KL %.5f (f16 cache %.5f), key cache %llu B (f16 %llu B), kslots diff %g", kl_q, kl_f,
                (unsigned long long)bq.key_cache, (unsigned long long)bf.key_cache, diff);
    cr_expect_eq(diff, 0.0, "kslots changed the int8-cache logits by %g", diff);
    cr_expect_lt(kl_q, 0.02, "int8 key cache KL %g", kl_q);
    const uint64_t slots = (uint64_t)hp->n_layer * hp->n_head_kv * (96 / 16 + 2);
    cr_expect_eq(bf.key_cache, slots * (16ull * hp->head_dim * 2 + 16));
    cr_expect_eq(bq.key_cache, slots * (16ull * (hp->head_dim + 2) + 16));
    free(a), free(lf), free(lq), free(lk), free(ids);
    rk_session_destroy(ex), rk_session_destroy(f), rk_session_destroy(q), rk_session_destroy(k);
    rk_model_destroy(m);
}

/* Two-level selection (coarse=G). (1) Keeping every coarse group scores every chunk's landmark
 * and takes the same top budget / chunk chunks by the same scores and ties: the logits equal
 * the one-level selection's bit for bit (and so do the landmarks scored). (2) Keeping 1.5x the
 * groups that hold the budget scores at most that many groups' chunks per (step, layer, KV head)
 * (9 groups of 4 chunks here, of 60+ chunks) and stays as close to exact as the one-level bound
 * (KL < 0.02, decode_stays_close_to_exact); the logits differ from one level (the restriction
 * acts). (3) The coarse landmarks are counted: per group and KV head an f16 scale + head_dim int8. */
Test(lowram_shared, two_level_selection) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab, n_story = 220, n_prefix = 100, n_dec = 40;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    rk_session *one = session(m, RK_DT_F16, "window=64,budget=96,chunk=4,full=0");
    rk_session *all = session(m, RK_DT_F16, "window=64,budget=96,chunk=4,coarse=4,ckeep=1000,full=0");
    rk_session *two = session(m, RK_DT_F16, "window=64,budget=96,chunk=4,coarse=4,ckeep=1.5,full=0");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *lo = trace(one, ids, n_prompt, n_dec, nv);
    float *la = trace(all, ids, n_prompt, n_dec, nv), *lt = trace(two, ids, n_prompt, n_dec, nv);
    const size_t n = (size_t)(n_dec + 1) * nv;
    rk_lowram_stats so, sa, st;
    rk_session_lowram_stats(one, &so), rk_session_lowram_stats(all, &sa), rk_session_lowram_stats(two, &st);
    const double d_all = rt_max_abs_diff(lo, la, n), d_two = rt_max_abs_diff(lo, lt, n);
    const double kl_one = rt_mean_kl(a, lo, n_dec + 1, nv), kl_two = rt_mean_kl(a, lt, n_dec + 1, nv);
    const rk_kv_codec *c = codec(two);
    const int64_t n_ch = (c->g[0].n_rows + 3) / 4, calls = (int64_t)n_dec * hp->n_layer * hp->n_head_kv;
    cr_log_info("two-level: keep all differs by %g; ckeep=1.5: KL %.5f (one level %.5f), landmarks scored %llu "
                "(one level %llu, coarse %llu), %lld chunks at the end",
                d_all, kl_two, kl_one, (unsigned long long)st.lmk_scored, (unsigned long long)so.lmk_scored,
                (unsigned long long)st.lmk_coarse, (long long)n_ch);
    /* (1) */
    cr_expect_eq(d_all, 0.0, "keeping every coarse group changed the logits by %g", d_all);
    cr_expect_eq(sa.lmk_scored, so.lmk_scored);
    cr_expect_eq(so.lmk_coarse, 0);
    cr_expect_gt(sa.lmk_coarse, 0);
    /* (2): budget 96 / chunk 4 = 24 chunks, held by 6 groups of 4; ckeep 1.5: 9 groups, 36 chunks */
    cr_expect_gt(n_ch, 60);
    cr_expect_geq(so.lmk_scored, (uint64_t)(calls * 60), "one level scored %llu", (unsigned long long)so.lmk_scored);
    cr_expect_leq(st.lmk_scored, (uint64_t)(calls * 36), "two levels scored %llu", (unsigned long long)st.lmk_scored);
    cr_expect_leq(st.lmk_coarse, (uint64_t)(calls * ((n_ch + 3) / 4)));
    cr_expect_gt(d_two, 0.0, "ckeep=1.5 chose as one level does");
    cr_expect_lt(kl_two, 0.02, "two-level KL %g", kl_two);
    /* (3) */
    rk_kv_bytes bo, bt;
    rk_session_kv_bytes(one, &bo), rk_session_kv_bytes(two, &bt);
    uint64_t cl = 0;
    for (int gi = 0; gi < c->n_group; gi++)
        cl += (uint64_t)c->g[gi].n_l * (uint64_t)((c->g[gi].n_rows + 15) / 16) * hp->n_head_kv * (hp->head_dim + 2);
    cr_expect_eq(bt.landmarks, bo.landmarks + cl);
    cr_expect_eq(bt.total, bo.total + cl);
    /* coarse landmarks rank by the mean key: not with topp or bound (refused by name) */
    rk_session_params sp = rk_session_params_default();
    sp.kv.kind = RK_KV_LOWRAM;
    rk_err e = {0};
    rk_session *bad = NULL;
    cr_assert_eq(rk_lowram_parse("coarse=4,topp=0.9", &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_session_create(m, &sp, &bad, &e), RK_E_UNSUPPORTED);
    cr_expect(strstr(e.msg, "coarse=4") && strstr(e.msg, "topp"), "%s", e.msg);
    cr_expect_null(bad);
    free(a), free(lo), free(la), free(lt), free(ids);
    rk_session_destroy(ex), rk_session_destroy(one), rk_session_destroy(all), rk_session_destroy(two);
    rk_model_destroy(m);
}

/* start=N: no fit until the context holds N rows. Below it every row is exact and attention
 * is the backend's ATTN over the same f16 bits as a plain f16 cache: bit-identical logits;
 * the commit that reaches N fits and compresses (then decode stays close to exact). */
Test(lowram_shared, start_threshold_keeps_rows_exact) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 40;
    const int n_prompt = 1 + n_story + n_prefix, start = n_prompt + 19;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    char spec[64];
    snprintf(spec, sizeof spec, "window=64,budget=96,chunk=16,start=%d", start);
    rk_session *ex = session(m, RK_DT_F16, NULL), *s = session(m, RK_DT_F16, spec);
    float *lg = malloc((size_t)nv * sizeof(float));
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, (size_t)n_prompt, lg, false, &e), RK_OK, "%s", e.msg);
    cr_expect(!codec(s)->fitted, "fitted below start");
    rk_kv_bytes b;
    rk_session_kv_bytes(s, &b);
    cr_expect_eq(b.coef, 0u);
    cr_expect_eq(rk_session_truncate(s, 0, &e), RK_OK, "%s", e.msg);
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *l = trace(s, ids, n_prompt, n_dec, nv);
    /* rows 0 .. start - n_prompt were computed with n_past < start: nothing compressed */
    const int n_same = start - n_prompt + 1;
    const double diff = rt_max_abs_diff(a, l, (size_t)n_same * nv);
    const double kl = rt_mean_kl(a + (size_t)n_same * nv, l + (size_t)n_same * nv, n_dec + 1 - n_same, nv);
    cr_log_info("start=%d: first %d steps differ by %g, then KL %.5f", start, n_same, diff, kl);
    cr_expect_eq(diff, 0.0, "unfitted LowRAM differs from f16 by %g", diff);
    cr_expect(codec(s)->fitted, "not fitted after %d rows", n_prompt + n_dec);
    cr_expect_gt(codec(s)->comp_end, (int64_t)codec(s)->p.n_sink, "nothing compressed");
    cr_expect_lt(kl, 0.02, "KL after the fit %g", kl);
    /* the default start: LR_START_DEFAULT rows, at most half the model's context (stories260K:
     * 512), whatever the session's; spec start=0: none */
    const struct {
        const char *spec;
        int64_t n_ctx, want;
    } dflt[] = {{"", 512, 256}, {"", 300, 256}, {"", 8192, 256}, {"start=0", 8192, 0}, {"start=700", 512, 700}};
    for (size_t i = 0; i < sizeof dflt / sizeof dflt[0]; i++) {
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = dflt[i].n_ctx, sp.n_threads = 1, sp.kv.kind = RK_KV_LOWRAM, sp.ctx_overflow_ok = true;
        cr_assert_eq(rk_lowram_parse(dflt[i].spec, &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
        rk_session *d = NULL;
        cr_assert_eq(rk_session_create(m, &sp, &d, &e), RK_OK, "%s", e.msg);
        cr_expect_eq(codec(d)->p.fit_min, dflt[i].want, "'%s' at n_ctx %lld: start %d", dflt[i].spec,
                     (long long)dflt[i].n_ctx, codec(d)->p.fit_min);
        rk_session_destroy(d);
    }
    free(a), free(l), free(lg), free(ids);
    rk_session_destroy(ex), rk_session_destroy(s);
    rk_model_destroy(m);
}

/* Truncation: (1) a cut inside the compressed rows, with a lossless codec (full rank, f32
 * coefficients, all residuals f16): replaying the tokens through the compressed rows gives
 * the first run's logits to within twice the f16/f32 cache distance; wrong bookkeeping
 * (masks, slots, positions) would be far off. (2) A cut inside the exact window keeps the
 * stored rows. (3) A reset refits: the same logits again, bit for bit. */
Test(lowram_shared, truncate_and_replay) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab;
    int32_t *ids = rt_story_ids(m, 400);
    rk_err e = {0};
    float *lg = malloc((size_t)nv * sizeof(float));
    /* (1) */
    rk_session *s = session(m, RK_DT_F16, "rank=100000,resid=1,rtype=f16,coef=f32,window=32,chunk=8,budget=100000");
    rk_session *s16 = session(m, RK_DT_F16, NULL), *s32 = session(m, RK_DT_F32, NULL);
    float *a = trace(s, ids, 300, 40, nv), *r16 = trace(s16, ids, 300, 40, nv), *r32 = trace(s32, ids, 300, 40, nv);
    const double tol = 2 * rt_max_abs_diff(r16, r32, (size_t)41 * nv) + 1e-4;
    const int cut = 250;
    cr_assert_lt(cut, codec(s)->comp_end, "the cut must fall inside the compressed rows");
    cr_assert_eq(rk_session_truncate(s, cut, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(s, ids + cut, 300 - cut, lg, false, &e), RK_OK, "%s", e.msg);
    double d = rt_max_abs_diff(a, lg, (size_t)nv);
    for (int i = 0; i < 40; i++) {
        cr_assert_eq(rk_session_eval(s, &ids[300 + i], 1, lg, false, &e), RK_OK, "%s", e.msg);
        d = fmax(d, rt_max_abs_diff(a + (size_t)(i + 1) * nv, lg, (size_t)nv));
    }
    cr_expect_lt(d, tol, "replay through the compressed rows differs by %g (tolerance %g)", d, tol);
    rk_session_destroy(s), rk_session_destroy(s16), rk_session_destroy(s32);
    free(a), free(r16), free(r32);
    /* (2) a cut inside the window leaves the stored rows alone (rows compressed after the
     * first pass stay compressed on replay, so logits need not repeat bit for bit) */
    s = session(m, RK_DT_F16, "window=32,chunk=8");
    a = trace(s, ids, 300, 40, nv);
    rk_kv_bytes k0, k1;
    rk_session_kv_bytes(s, &k0);
    cr_assert_gt(335, codec(s)->comp_end, "the cut must fall inside the window");
    cr_assert_eq(rk_session_truncate(s, 335, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(s, &ids[335], 1, lg, false, &e), RK_OK, "%s", e.msg);
    rk_session_kv_bytes(s, &k1);
    cr_expect_eq(k1.n_compressed_rows, k0.n_compressed_rows);
    cr_expect_eq(k1.n_tokens, 336);
    d = rt_max_abs_diff(a + (size_t)36 * nv, lg, (size_t)nv);
    cr_expect(isfinite(d) && d < 5.0, "replayed step differs by %g", d);
    /* (3) */
    rk_session_reset(s);
    /* a reset gives back what the fit allocated (the stores, the decode work areas): the
     * next prompt's exact rows do not sit on top of the last prompt's stores */
    const rk_kv_codec *cr = codec(s);
    cr_expect(!cr->fitted && !cr->scr && !cr->g[0].coef && !cr->ly[0].h[0].res && !cr->ly[0].lmk,
              "the last fit's stores are still held after a reset");
    rk_session_kv_bytes(s, &k1);
    cr_expect_lt(k1.scratch, k0.scratch, "work areas %llu bytes after the reset, %llu before",
                 (unsigned long long)k1.scratch, (unsigned long long)k0.scratch);
    cr_expect_eq(k1.n_compressed_rows, 0);
    float *b = trace(s, ids, 300, 40, nv);
    cr_expect_eq(rt_max_abs_diff(a, b, (size_t)41 * nv), 0.0);
    free(a), free(b), free(lg), free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
}

/* ---- predictor files ------------------------------------------------------------------ */

static const char *write_predictor(const rk_model *m, char *path, size_t cap) {
    int32_t *ids = rt_random_ids(m, (size_t)(1200), 11);
    rk_lowram_calib_params cp = {.group = 3, .seg_len = 400, .stride = 1, .n_threads = 2};
    void *bytes = NULL;
    size_t n = 0;
    rk_err e = {0};
    cr_assert_eq(rk_lowram_calibrate(m, ids, 1200, &cp, NULL, NULL, &bytes, &n, &e), RK_OK, "%s", e.msg);
    snprintf(path, cap, "%s/rk-lowram-pred-%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, n, &e), RK_OK, "%s", e.msg);
    free(bytes), free(ids);
    return path;
}

/* The predictor file comes with the KV policy at session creation. */
Test(lowram, predictor_file_for_another_model_is_refused) {
    rk_model *m = rt_stories_like(1);
    rk_model *other = rt_stories_like(2);
    char path[1024];
    write_predictor(m, path, sizeof path);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.ctx_overflow_ok = true; /* room only: the model trains on 128 tokens */
    sp.kv.kind = RK_KV_LOWRAM;
    rk_lowram_params *lp = &sp.kv.lowram;
    rk_session *s = NULL, *so = NULL, *sx = NULL;
    rk_err e = {0};
    snprintf(lp->predictor, sizeof lp->predictor, "%s", path);
    rk_status st = rk_session_create(other, &sp, &so, &e);
    cr_expect_eq(st, RK_E_MISMATCH, "%s", rk_status_name(st));
    cr_expect(strstr(e.msg, "lowram predictor") && strstr(e.msg, rk_model_name(other)), "%s", e.msg);
    cr_expect_null(so, "no session on failure");
    /* the right model takes it, and decodes with the file's basis */
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    int32_t *ids = rt_random_ids(m, (size_t)(320), 11);
    float *lg = trace(s, ids, 300, 4, rk_model_hparams(m)->n_vocab);
    rk_lowram_stats ls;
    rk_session_lowram_stats(s, &ls);
    cr_expect(ls.fitted && ls.rank_max > 0);
    /* another group size than the file's is refused by name */
    lp->group = 2;
    st = rk_session_create(m, &sp, &sx, &e);
    cr_expect_eq(st, RK_E_MISMATCH, "%s", e.msg);
    cr_expect(strstr(e.msg, "group"), "%s", e.msg);
    /* a file of another kind (the model itself) is not a predictor file */
    char mp[1024];
    const tb_tiny_spec ms = tb_tiny_stories_spec(1);
    cr_assert(tb_tiny_model(&ms, mp, sizeof mp), "%s", mp);
    snprintf(lp->predictor, sizeof lp->predictor, "%s", mp);
    lp->group = 3;
    st = rk_session_create(m, &sp, &sx, &e);
    cr_expect_eq(st, RK_E_MISMATCH, "%s", e.msg);
    cr_expect(strstr(e.msg, "not a predictor file"), "%s", e.msg);
    cr_expect_null(sx);
    remove(path), remove(mp);
    free(lg), free(ids);
    rk_session_destroy(s), rk_session_destroy(so);
    rk_model_destroy(m), rk_model_destroy(other);
}

/* ---- parameters --------------------------------------------------------------------------- */

Test(lowram, spec_parsing) {
    rk_lowram_params p = rk_lowram_params_default();
    rk_err e = {0};
    cr_assert_eq(rk_lowram_parse("ratio=6,budget=256,window=64,rank=32,dense,coef=int8,sinks=0,pred=/a,b.gguf", &p, &e),
                 RK_OK, "%s", e.msg);
    cr_expect(p.ratio == 6.0f && p.budget == 256 && p.window == 64 && p.rank == 32 && p.dense);
    cr_expect_eq(p.coef_type, RK_DT_Q8_0);
    cr_expect_eq(p.n_sink, -1);
    cr_expect_str_eq(p.predictor, "/a,b.gguf");
    p = rk_lowram_params_default();
    cr_assert_eq(rk_lowram_parse("start=4096,kcache=int8", &p, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(p.fit_min, 4096);
    cr_expect_eq(p.kc_type, RK_DT_Q8_0);
    cr_expect_eq(rk_lowram_params_default().kc_type, RK_DT_Q8_0);
    p = rk_lowram_params_default();
    cr_assert_eq(rk_lowram_parse("chunk=8,coarse=4,ckeep=2.5", &p, &e), RK_OK, "%s", e.msg);
    cr_expect(p.chunk == 8 && p.coarse == 4 && p.coarse_keep == 2.5f);
    cr_expect_eq(rk_lowram_params_default().coarse, 0);
    const char *bad[] = {"ratio=0", "budget=x",   "chunk=64", "coef=q4",  "nonsense",    "ckeep=0.5",
                         "resid=2", "evict=0.99", "rank=1.5", "start=-1", "kcache=int4", "coarse=1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_lowram_params q = rk_lowram_params_default();
        cr_expect_eq(rk_lowram_parse(bad[i], &q, &e), RK_E_INVALID_ARG, "'%s' accepted", bad[i]);
    }
}

/* Top-p selection. (1) topp=1 with a budget above the compressed rows keeps every chunk:
 * the logits equal dense mode's up to the f16 rounding of the cached keys (bound: twice
 * the f16-vs-f32 plain cache distance + 1e-4, as for the lossless codec). (2) topp=0.9 on the
 * copy prompt stays within the same KL bound as the fixed budget (0.02) while choosing, per
 * (layer, head), a count between min_chunks and budget / chunk that varies (not a fixed k). */
Test(lowram_shared, topp_selection) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 30;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *f16 = session(m, RK_DT_F16, NULL), *f32 = session(m, RK_DT_F32, NULL);
    rk_session *dn = session(m, RK_DT_F16, "window=64,chunk=16,dense");
    rk_session *all = session(m, RK_DT_F16, "window=64,chunk=16,topp=1,budget=100000");
    rk_session *tp = session(m, RK_DT_F16, "window=64,chunk=16,topp=0.9,budget=96,full=0");
    float *a16 = trace(f16, ids, n_prompt, n_dec, nv), *a32 = trace(f32, ids, n_prompt, n_dec, nv);
    float *ld = trace(dn, ids, n_prompt, n_dec, nv), *la = trace(all, ids, n_prompt, n_dec, nv);
    const size_t n = (size_t)(n_dec + 1) * nv;
    const double cache = rt_max_abs_diff(a16, a32, n), d_all = rt_max_abs_diff(ld, la, n);
    cr_log_info("topp=1 vs dense %.3g (f16 vs f32 cache %.3g)", d_all, cache);
    cr_expect_leq(d_all, 2 * cache + 1e-4, "topp=1 vs dense %g (cache distance %g)", d_all, cache);
    /* (2): decode step by step, recording the chunk counts of every (layer, head) */
    rk_err e = {0};
    float *lt = malloc(n * sizeof(float));
    cr_assert_eq(rk_session_eval(tp, ids, (size_t)n_prompt, lt, false, &e), RK_OK, "%s", e.msg);
    const rk_kv_codec *c = codec(tp);
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < n_dec; i++) {
        cr_assert_eq(rk_session_eval(tp, &ids[n_prompt + i], 1, lt + (size_t)(i + 1) * nv, false, &e), RK_OK, "%s",
                     e.msg);
        cr_assert(c->dec.keys_op);
        for (int h = 0; h < c->n_head_kv; h++)
            lo = c->dec.n_sel[h] < lo ? c->dec.n_sel[h] : lo, hi = c->dec.n_sel[h] > hi ? c->dec.n_sel[h] : hi;
    }
    const double kl = rt_mean_kl(a16, lt, n_dec + 1, nv);
    cr_log_info("topp=0.9: KL %.5f, chunks per (layer, head) %lld..%lld of %lld", kl, (long long)lo, (long long)hi,
                (long long)((c->g[0].n_rows + 15) / 16));
    cr_expect_lt(kl, 0.02, "KL %g", kl);
    cr_expect_geq(lo, 2);
    cr_expect_leq(hi, 96 / 16);
    cr_expect_lt(lo, hi, "top-p chose the same count everywhere (%lld)", (long long)lo);
    free(a16), free(a32), free(ld), free(la), free(lt), free(ids);
    rk_session_destroy(f16), rk_session_destroy(f32), rk_session_destroy(dn), rk_session_destroy(all);
    rk_session_destroy(tp);
    rk_model_destroy(m);
}

/* The baseline build of the attention phases (lowram_task.h: lr_head_run, lr_select_*,
 * lr_score_range, the summaries; what a CPU without AVX2 runs) against the AVX2 build, on
 * sparse decode with summary rows and int8 and f16 key caches, and on dense mode. The two
 * differ only in float rounding (FMAs, the exp polynomial, the int8 key rows' scale applied
 * after the dot product): bound, as for the lossless codec, twice the f16-vs-f32 plain cache
 * distance + 1e-4; a wrong choice of chunks or a dropped block would exceed it. */
Test(lowram, baseline_build_matches_avx2) {
    if (!rk_cpu_has_avx2()) cr_skip_test("no AVX2: the baseline build is the only one");
    rk_model *m = rt_stories_like(36);
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 20;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt_random(m, n_story, n_prefix, n_dec);
    rk_session *f16 = session(m, RK_DT_F16, NULL), *f32 = session(m, RK_DT_F32, NULL);
    float *a16 = trace(f16, ids, n_prompt, n_dec, nv), *a32 = trace(f32, ids, n_prompt, n_dec, nv);
    const size_t n = (size_t)(n_dec + 1) * nv;
    const double cache = rt_max_abs_diff(a16, a32, n);
    const char *opts[] = {"window=64,chunk=16,budget=96,summ", "window=64,chunk=8,budget=64,summ,kcache=f16",
                          "window=64,chunk=16,budget=96,coarse=2", "window=64,chunk=16,dense"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        rk_session *va = session(m, RK_DT_F16, opts[i]), *vb = session(m, RK_DT_F16, opts[i]);
        codec(vb)->isa_base = true;
        float *la = trace(va, ids, n_prompt, n_dec, nv), *lb = trace(vb, ids, n_prompt, n_dec, nv);
        const double d = rt_max_abs_diff(la, lb, n);
        cr_log_info("%s: baseline vs AVX2 %.3g (f16 vs f32 cache %.3g)", opts[i], d, cache);
        cr_expect_leq(d, 2 * cache + 1e-4, "%s: baseline vs AVX2 %g (cache distance %g)", opts[i], d, cache);
        free(la), free(lb);
        rk_session_destroy(va), rk_session_destroy(vb);
    }
    free(a16), free(a32), free(ids);
    rk_session_destroy(f16), rk_session_destroy(f32);
    rk_model_destroy(m);
}

static bool cancel_after_250(void *ud, int64_t done, int64_t total) {
    (void)ud, (void)total;
    return done < 250;
}

/* pfit: a prompt fed as one eval in chunks of 32 rows is compressed while it is read: the
 * exact buffers never hold the whole prompt (at most pfit + one batch of rows, against all of it
 * without pfit), the logits after it and through decode stay within the decode bound of
 * decode_stays_close_to_exact (KL 0.02 against exact), and a failed eval's compressed rows are
 * forgotten (a cancelled eval, then the same prompt: bit-identical logits). */
Test(lowram_shared, prefill_compression_inside_one_eval) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 20;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    rk_session *late = session(m, RK_DT_F16, "window=32,chunk=16,topp=0.95,budget=96");
    rk_session *early = session(m, RK_DT_F16, "window=32,chunk=16,topp=0.95,budget=96,pfit=128");
    ex->p.n_batch = late->p.n_batch = early->p.n_batch = 32;
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *b = trace(late, ids, n_prompt, n_dec, nv);
    float *c = trace(early, ids, n_prompt, n_dec, nv);
    const rk_kv_codec *cl = codec(late), *ce = codec(early);
    const double kl_late = rt_mean_kl(a, b, n_dec + 1, nv), kl_early = rt_mean_kl(a, c, n_dec + 1, nv);
    cr_log_info("pfit: exact rows held at most %lld rows (fit at the end: %lld); KL %.5f (fit at the end %.5f)",
                (long long)ce->x_peak, (long long)cl->x_peak, kl_early, kl_late);
    cr_expect_geq(cl->x_peak, n_prompt);
    cr_expect_leq(ce->x_peak, 128 + 32, "exact rows held %lld of %d", (long long)ce->x_peak, n_prompt);
    cr_expect_gt(ce->g[0].n_rows, 200);
    cr_expect_lt(kl_early, 0.02, "KL %g", kl_early);
    /* an eval cancelled after rows were compressed inside it leaves nothing behind: the
     * same prompt again gives the same logits bit for bit */
    rk_err e = {0};
    float *d = malloc((size_t)nv * sizeof(float)), *d2 = malloc((size_t)nv * sizeof(float));
    cr_assert_eq(rk_session_truncate(early, 0, &e), RK_OK);
    rk_session_set_progress(early, cancel_after_250, NULL);
    cr_assert_eq(rk_session_eval(early, ids, (size_t)n_prompt, d, false, &e), RK_E_CANCELLED, "%s", e.msg);
    cr_expect_eq(rk_session_n_past(early), 0);
    rk_session_set_progress(early, NULL, NULL);
    cr_assert_eq(rk_session_eval(early, ids, (size_t)n_prompt, d2, false, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(memcmp(d2, c, (size_t)nv * sizeof(float)), 0, "replay after a cancelled eval differs");
    free(a), free(b), free(c), free(d), free(d2), free(ids);
    rk_session_destroy(ex), rk_session_destroy(late), rk_session_destroy(early);
    rk_model_destroy(m);
}

/* Value-space summaries: (1) every decoded summary row equals cmean·W (mean coefficients and
 * predictor as stored, in double) within the int8 rounding of lr_encode_row (half a step of
 * the f16-rounded scale, plus 127 steps of that scale's f16 rounding: 0.5 + 127·2^-11 < 0.6
 * steps) and fp32 accumulation; (2) decoding with them keeps the quality of the old
 * coefficient-space summaries (`csumm`): KL against exact within 10% + 1e-4 of it; (3) with
 * 3 codec threads for 4 KV heads each head's rows are split over tasks and merged: the
 * logits equal the unsplit decode's to float rounding (1e-3 of the logit range). */
Test(lowram, value_summaries_and_split_decode) {
    rk_model *m = rt_stories_like(1);
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab, n_story = 220, n_prefix = 100, n_dec = 24, hd = hp->head_dim;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt_random(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    rk_session *vs = session(m, RK_DT_F16, "window=32,chunk=16,budget=48,summ");
    rk_session *cs = session(m, RK_DT_F16, "window=32,chunk=16,budget=48,csumm,summ");
    rk_session *sp = session(m, RK_DT_F16, "window=32,chunk=16,budget=48,threads=3,summ");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *lv = trace(vs, ids, n_prompt, n_dec, nv);
    float *lc = trace(cs, ids, n_prompt, n_dec, nv), *ls = trace(sp, ids, n_prompt, n_dec, nv);
    const rk_kv_codec *c = codec(vs);
    double worst = 0;
    int64_t n_rows_checked = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const lr_layer *L = &c->ly[l];
        const lr_group *g = &c->g[L->grp];
        cr_assert(L->vsm, "layer %d: no value summaries", l);
        cr_expect_gt(L->vs_n, 2);
        for (int64_t ch = 0; ch < L->vs_n; ch++)
            for (int h = 0; h < c->n_head_kv; h++) {
                const uint8_t *rw = L->vsm + ((size_t)ch * c->n_head_kv + h) * (2u + hd);
                const float sc = rk_f16_to_f32((uint16_t)(rw[0] | (rw[1] << 8)));
                double mx = 0;
                for (int d = 0; d < hd; d++) {
                    double v = 0;
                    for (int k = 0; k < g->r; k++)
                        v += (double)rk_f16_to_f32(g->cmean[(size_t)ch * g->r + k]) *
                             rk_f16_to_f32(((const uint16_t *)L->W)[(size_t)k * c->kvd + (size_t)h * hd + d]);
                    const double err = fabs((double)((const int8_t *)(rw + 2))[d] * sc - v);
                    mx = fmax(mx, fabs(v));
                    worst = fmax(worst, err / (0.6 * sc + 1e-5 * (1 + fabs(v))));
                }
                cr_expect_leq(sc, mx / 127.0 * (1 + 1e-3) + 1e-7, "layer %d chunk %lld head %d: scale %g for max %g", l,
                              (long long)ch, h, sc, mx);
                n_rows_checked++;
            }
    }
    cr_log_info("value summaries: %lld rows, worst error %.3f of the bound", (long long)n_rows_checked, worst);
    cr_expect_leq(worst, 1.0, "a value summary is off by %.3f of its bound", worst);
    const double kv = rt_mean_kl(a, lv, n_dec + 1, nv), kc = rt_mean_kl(a, lc, n_dec + 1, nv);
    cr_log_info("KL value summaries %.5f, coefficient summaries %.5f", kv, kc);
    cr_expect_leq(fabs(kv - kc), 0.1 * kc + 1e-4, "KL %g (value summaries) vs %g (csumm)", kv, kc);
    cr_expect_gt(kc, 1e-5, "the summaries should matter here (budget 48 of %lld rows)", (long long)c->g[0].n_rows);
    cr_assert(codec(sp)->dec.parts, "the split decode did not run (4 KV heads on 3 threads)");
    const size_t n = (size_t)(n_dec + 1) * nv;
    double range = 0;
    for (size_t i = 0; i < n; i++) range = fmax(range, fabs(lv[i]));
    const double d = rt_max_abs_diff(lv, ls, n);
    cr_log_info("split vs unsplit decode: %.3g (logit range %.3g)", d, range);
    cr_expect_leq(d, 1e-3 * range, "split decode differs by %g (range %g)", d, range);
    free(a), free(lv), free(lc), free(ls), free(ids);
    rk_session_destroy(ex), rk_session_destroy(vs), rk_session_destroy(cs), rk_session_destroy(sp);
    rk_model_destroy(m);
}

/* Sparse decode scores the landmarks of every (KV head, share of its chunks) over the pool
 * before it chooses (score_worker), and attends each head's chosen chunks in shares that it
 * merges by log-sum-exp. On 3 threads (4 KV heads: 3 shares per head, 12 tasks) against one
 * thread, step by step until a decode step compresses a new chunk (after that, float
 * rounding of the new rows can flip an int8 coefficient and the runs may part): the same
 * landmarks scored and rows rebuilt (the same chunks chosen), and logits equal up to the
 * order of the merged sums (1e-5 of their range; measured ~3e-7). A share scored twice,
 * skipped or written to another head's scores would change the choice or the count; a share
 * attended twice or not at all would move the logits by far more than rounding. */
Test(lowram, pooled_chunk_scores_choose_as_one_thread) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n_story = 220, n_prefix = 100, n_dec = 24;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt_random(m, n_story, n_prefix, n_dec);
    rk_session *s[2] = {session(m, RK_DT_F16, "window=32,chunk=8,budget=48,threads=1"),
                        session(m, RK_DT_F16, "window=32,chunk=8,budget=48,threads=3")};
    float *lg[2] = {malloc((size_t)nv * sizeof(float)), malloc((size_t)nv * sizeof(float))};
    rk_err e = {0};
    for (int k = 0; k < 2; k++)
        cr_assert_eq(rk_session_eval(s[k], ids, (size_t)n_prompt, lg[k], false, &e), RK_OK, "%s", e.msg);
    rk_kv_bytes kb;
    rk_session_kv_bytes(s[0], &kb);
    const int64_t comp0 = kb.n_compressed_rows;
    int steps = 0;
    for (int i = 0; i < n_dec; i++) {
        for (int k = 0; k < 2; k++)
            cr_assert_eq(rk_session_eval(s[k], &ids[n_prompt + i], 1, lg[k], false, &e), RK_OK, "%s", e.msg);
        rk_session_kv_bytes(s[0], &kb);
        if (kb.n_compressed_rows != comp0) break; /* this step's commit compressed a chunk */
        rk_lowram_stats t1, t3;
        rk_session_lowram_stats(s[0], &t1);
        rk_session_lowram_stats(s[1], &t3);
        cr_expect_gt(t1.lmk_scored, 0);
        cr_expect_eq(t1.lmk_scored, t3.lmk_scored, "step %d: landmarks scored %llu on 1 thread, %llu on 3", i,
                     (unsigned long long)t1.lmk_scored, (unsigned long long)t3.lmk_scored);
        cr_expect_eq(t1.rows_rebuilt, t3.rows_rebuilt, "step %d: rows rebuilt %llu on 1 thread, %llu on 3", i,
                     (unsigned long long)t1.rows_rebuilt, (unsigned long long)t3.rows_rebuilt);
        double range = 0;
        for (int v = 0; v < nv; v++) range = fmax(range, fabs(lg[0][v]));
        const double d = rt_max_abs_diff(lg[0], lg[1], (size_t)nv);
        cr_expect_leq(d, 1e-5 * range, "step %d: logits differ by %g (range %g)", i, d, range);
        steps++;
    }
    cr_log_info("3 threads vs 1: %d decode steps compared before a new chunk", steps);
    cr_expect_geq(steps, 3, "only %d steps before the first compression: lengthen the prompt", steps);
    cr_assert(codec(s[0])->dec.score && codec(s[1])->dec.score, "the pooled scores were not used");
    cr_assert(codec(s[1])->dec.parts, "the heads' attention was not split (4 KV heads on 3 threads)");
    free(lg[0]), free(lg[1]), free(ids);
    rk_session_destroy(s[0]), rk_session_destroy(s[1]);
    rk_model_destroy(m);
}

/* vrank: the value predictor from the first value_rank coefficients only. Only those rows of
 * W are stored (the predictor bytes count them; the device copy pads the rest with 0 for the
 * op that sums all r), a vrank at or above the rank changes nothing bit
 * for bit, and decode stays within the default's bound of exact (KL < 0.02). */
Test(lowram_shared, value_rank_predictor) {
    rk_model *m = rt_load_shared("models/stories260K/stories260K-f32.gguf");
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab, n_story = 220, n_prefix = 100, n_dec = 24;
    const int n_prompt = 1 + n_story + n_prefix;
    int32_t *ids = copy_prompt(m, n_story, n_prefix, n_dec);
    rk_session *ex = session(m, RK_DT_F16, NULL);
    rk_session *df = session(m, RK_DT_F16, "window=32,chunk=16,budget=48,ratio=4");
    rk_session *vh = session(m, RK_DT_F16, "window=32,chunk=16,budget=48,vrank=100000,ratio=4");
    rk_session *vl = session(m, RK_DT_F16, "window=32,chunk=16,budget=48,vrank=12,ratio=4");
    float *a = trace(ex, ids, n_prompt, n_dec, nv), *ld = trace(df, ids, n_prompt, n_dec, nv);
    float *lh = trace(vh, ids, n_prompt, n_dec, nv), *ll = trace(vl, ids, n_prompt, n_dec, nv);
    const size_t n = (size_t)(n_dec + 1) * nv;
    cr_expect_eq(rt_max_abs_diff(ld, lh, n), 0.0, "vrank above the rank changed the logits");
    const rk_kv_codec *c = codec(vl);
    for (int l = 0; l < c->n_layer; l++) {
        const lr_group *g = &c->g[c->ly[l].grp];
        cr_assert_gt(g->r, 12, "layer %d: rank %d, the test needs more than vrank", l, g->r);
        cr_assert_eq(lr_vr(c, g), 12);
        /* only the first 12 rows of W are stored, and they are mostly nonzero */
        const uint16_t *W = c->ly[l].W;
        int nz_in = 0;
        for (int k = 0; k < 12; k++)
            for (int j = 0; j < c->kvd; j++) nz_in += rk_f16_to_f32(W[(size_t)k * c->kvd + j]) != 0.0f;
        cr_expect_gt(nz_in, 12 * c->kvd / 2, "layer %d: the first 12 rows are mostly 0 (%d nonzero)", l, nz_in);
    }
    /* the predictors' bytes: 12 f16 rows of W and the f32 bias per layer */
    rk_kv_bytes kb;
    rk_session_kv_bytes(vl, &kb);
    cr_expect_eq(kb.predictors, (uint64_t)c->n_layer * ((uint64_t)12 * c->kvd * 2 + (uint64_t)c->kvd * 4),
                 "predictor bytes %llu", (unsigned long long)kb.predictors);
    const double kd = rt_mean_kl(a, ld, n_dec + 1, nv), kl = rt_mean_kl(a, ll, n_dec + 1, nv);
    cr_log_info("decode KL default %.5f, vrank=12 %.5f (rank %d)", kd, kl, c->g[0].r);
    cr_expect_lt(kl, 0.02, "KL %g with vrank=12", kl);
    cr_expect_gt(rt_max_abs_diff(ld, ll, n), 0.0, "vrank=12 did not change anything");
    free(a), free(ld), free(lh), free(ll), free(ids);
    rk_session_destroy(ex), rk_session_destroy(df), rk_session_destroy(vh), rk_session_destroy(vl);
    rk_model_destroy(m);
}

/* The exported state does not depend on decode's selection knobs (budget, topp, dl0/dl1, ...):
 * it imports into a session with other ones and decodes exactly as a fresh prefill under
 * those knobs (lowram_study --reuse relies on it); a stored-state parameter still refuses. */
Test(lowram, state_decodes_under_other_selection_settings) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n_p = 300, n_dec = 12;
    int32_t *ids = rt_random_ids(m, (size_t)(n_p + n_dec + 1), 11);
    rk_session *a = session(m, RK_DT_F16, "rank=24,window=64,budget=64,kslots=2,full=0");
    rk_session *b = session(m, RK_DT_F16, "rank=24,window=64,budget=96,topp=0.9,dl0=1,dl1=3,kslots=2,full=0");
    rk_session *f = session(m, RK_DT_F16, "rank=24,window=64,budget=96,topp=0.9,dl0=1,dl1=3,kslots=2,full=0");
    rk_session *x = session(m, RK_DT_F16, "rank=20,window=64,budget=64,kslots=2,full=0");
    float *la = trace(a, ids, n_p, 0, nv), *lf = trace(f, ids, n_p, n_dec, nv);
    rk_err e = {0};
    void *blk;
    size_t n;
    cr_assert_eq(rk_session_kv_export(a, 0, n_p, &blk, &n, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_kv_import(b, blk, n, &e), RK_OK, "%s", e.msg);
    rk_status st = rk_session_kv_import(x, blk, n, &e);
    cr_expect_eq(st, RK_E_MISMATCH, "%s", rk_status_name(st));
    cr_expect(strstr(e.msg, "rank"), "%s", e.msg);
    float *lb = malloc((size_t)nv * sizeof(float));
    int diff = 0;
    for (int i = 0; i < n_dec; i++) {
        cr_assert_eq(rk_session_eval(b, &ids[n_p + i], 1, lb, false, &e), RK_OK, "%s", e.msg);
        diff += memcmp(lb, lf + (size_t)(i + 1) * nv, (size_t)nv * sizeof(float)) != 0;
    }
    cr_expect_eq(diff, 0, "%d of %d steps differ from a fresh prefill with the same knobs", diff, n_dec);
    free(blk), free(la), free(lf), free(lb), free(ids);
    rk_session_destroy(a), rk_session_destroy(b), rk_session_destroy(f), rk_session_destroy(x);
    rk_model_destroy(m);
}

/* pfit on a long eval: with `pfit=3072` an eval that passes 3072 rows fits there and
 * compresses as it streams, so the exact rows it holds never exceed that many plus one batch
 * and the window (the chunk-aligned remainder of a batch boundary); the default (and
 * `pfit=0`) keeps the end-of-eval fit, whose exact rows reach the whole prompt;
 * `pfit=1024,start=0` fits at 1024. A tiny generated model with a context of 8192 (no
 * ../shared), one eval of 3600 rows in batches of 512. */
static rk_session *long_session(const rk_model *m, const char *lowram) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 4096;
    sp.n_batch = 512;
    sp.n_threads = 2;
    sp.kv.kind = RK_KV_LOWRAM;
    rk_err e = {0};
    cr_assert_eq(rk_lowram_parse(lowram, &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

Test(lowram, pfit_streams_long_evals) {
    tb_tiny_spec spec = {.arch = TB_ARCH_LLAMA,
                         .n_layer = 2,
                         .n_embd = 64,
                         .n_head = 2,
                         .n_head_kv = 1,
                         .head_dim = 32,
                         .n_ctx_train = 8192,
                         .seed = 31};
    rk_model *m = rt_tiny_loaded(&spec);
    rk_err e = {0};
    const int n = 3600, nv = rk_model_hparams(m)->n_vocab;
    int32_t *ids = rt_random_ids(m, n, 7);
    const char *specs[] = {"pfit=3072", "", "pfit=0", "pfit=1024,start=0"};
    const int64_t want[] = {3072, 0, 0, 1024};
    float *lg = malloc((size_t)nv * sizeof(float));
    for (int i = 0; i < 4; i++) {
        rk_session *s = long_session(m, specs[i]);
        const rk_kv_codec *c = codec(s);
        cr_expect_eq(c->p.prefill_fit, want[i], "\"%s\": pfit %d", specs[i], c->p.prefill_fit);
        cr_assert_eq(rk_session_eval(s, ids, (size_t)n, lg, false, &e), RK_OK, "%s", e.msg);
        cr_expect(c->fitted, "\"%s\": not fitted after %d rows", specs[i], n);
        for (int v = 0; v < nv; v++) cr_assert(isfinite(lg[v]));
        /* the fit waits for the start threshold too (here 3072: half the context is more) */
        const int64_t at = want[i] > c->p.fit_min ? want[i] : c->p.fit_min;
        const int64_t bound = want[i] ? at + 512 + c->p.window + c->p.chunk : n;
        cr_log_info("\"%s\": exact rows held at most %lld (bound %lld)", specs[i], (long long)c->x_peak,
                    (long long)bound);
        if (want[i]) cr_expect_leq(c->x_peak, bound, "\"%s\": exact rows %lld", specs[i], (long long)c->x_peak);
        else cr_expect_geq(c->x_peak, n, "\"%s\": exact rows %lld", specs[i], (long long)c->x_peak);
        rk_session_destroy(s);
    }
    free(lg), free(ids);
    rk_model_destroy(m);
}
