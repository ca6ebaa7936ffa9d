/* The runtime on generated tiny models (tests/tb, no downloads): loading every
 * architecture and weight type, logits against an independent double-precision forward
 * (tb_ref_logits), chunking / prefix / truncate / reset invariance, context and id
 * refusals that leave the session unchanged, cpu vs cpu_ref, f16 vs f32 KV, and greedy
 * generation checked a second way. (Vocabularies: test_tiny_vocab.c.)
 *
 * Tolerances. Both backends dequantise exactly (small integers times f16 scales), so
 * with an f32 cache the only differences from the oracle are f32 rounding: a dot product
 * of length k (k <= 128 here) is off by at most k * 2^-24 ~ 7.6e-6 of the sum of |terms|
 * and typically by sqrt(k) * 2^-24 ~ 7e-7; ~20 such steps in sequence with O(1) gains
 * give ~3e-6 of the logit scale typically. We allow TOL_F32 = 2e-5 * (1 + max |logit|)
 * (measured: <= 1.8e-5 absolute at a scale of ~12, i.e. ~1.4e-6 relative). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_gguf.h"
#include "rk_kernels.h"
#include "tb.h"

#define TOL_F32 2e-5
/* The cpu backend dots quantised weights with activations rounded to 8 bits per
 * block (|dx| <= amax/254, kernels' rk_qdot_fast), for decode (GEMV) on every
 * quantised type and for prefill on K-quants. Each matmul input then carries a
 * relative rms error up to ~(amax/sigma) / (127 sqrt 12) ~ 1.4% here (amax/sigma
 * <= 6 in these random models), about 15 of them reach a logit (2 layers x 7 +
 * output) and add in quadrature (~5% rms), and the largest of the 29 x vocab
 * entries is ~3 rms: 0.15 (1 + scale), 3x over the largest difference measured
 * (0.545 at scale 11). Wrong rows or scales move logits by O(scale). */
#define TOL_Q8 0.15

static const tb_arch k_arches[] = {TB_ARCH_LLAMA, TB_ARCH_QWEN2, TB_ARCH_QWEN3};
static const char *const k_arch_names[] = {"llama", "qwen2", "qwen3"};
static const uint32_t k_wtypes[] = {RK_DT_F32, RK_DT_F16, RK_DT_BF16, RK_DT_Q8_0, RK_DT_Q4_0, RK_DT_Q4_1};
#define N_ARCH 3
#define N_WTYPE 6

/* ---- helpers ------------------------------------------------------------------ */

typedef struct tiny {
    char path[512];
    tb_tiny_spec spec; /* resolved */
    rk_model *m;
    int32_t nv;
} tiny;

static void tiny_open(tiny *t, tb_tiny_spec spec) {
    memset(t, 0, sizeof *t);
    t->spec = tb_tiny_spec_resolve(&spec);
    cr_assert(tb_tiny_model(&spec, t->path, sizeof t->path), "%s", t->path);
    rk_err e = {0};
    rk_status st = rk_model_load(t->path, &t->m, &e);
    if (st != RK_OK) unlink(t->path);
    cr_assert_eq(st, RK_OK, "%s: %s", rk_status_name(st), e.msg);
    t->nv = rk_model_hparams(t->m)->n_vocab;
}

static void tiny_close(tiny *t) {
    rk_model_destroy(t->m);
    unlink(t->path);
    t->m = NULL;
}

static rk_session_params params(int32_t n_ctx, int32_t n_batch, uint32_t kv, rk_backend_kind be) {
    rk_session_params p = rk_session_params_default();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.kv.kind = kv == RK_DT_F32 ? RK_KV_F32 : kv == RK_DT_Q8_0 ? RK_KV_Q8 : RK_KV_F16;
    p.backend = be;
    p.n_threads = 1;
    return p;
}

static rk_session *session(const tiny *t, rk_session_params p) {
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(t->m, &p, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

/* n * n_vocab logits of one eval call over ids in a fresh session. */
static float *eval_all(const tiny *t, rk_session_params p, const int32_t *ids, size_t n) {
    rk_session *s = session(t, p);
    float *lg = malloc(n * (size_t)t->nv * sizeof *lg);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, n, lg, true, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_n_past(s), (int64_t)n);
    rk_session_destroy(s);
    return lg;
}

static void random_ids(int32_t *ids, size_t n, int32_t nv, uint64_t seed) {
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)nv);
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

/* max |a - b|; NaN or Inf anywhere gives +Inf (fails every bound). */
static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        m = fmax(m, fabs((double)a[i] - (double)b[i]));
    }
    return m;
}

static bool all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return false;
    return true;
}

static int32_t argmax(const float *x, int32_t n, float *margin) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    float second = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (i != best && x[i] > second) second = x[i];
    if (margin) *margin = x[best] - second;
    return best;
}

static float *reference(const tiny *t, const int32_t *ids, size_t n) {
    char why[512];
    int32_t nv = 0;
    float *lg = tb_ref_logits(t->path, ids, n, &nv, why, sizeof why);
    cr_assert(lg, "%s", why);
    cr_assert_eq(nv, t->nv);
    return lg;
}

/* ---- loading ------------------------------------------------------------------ */

Test(tiny, load_every_arch_dtype_and_vocab) {
    for (int a = 0; a < N_ARCH; a++)
        for (int w = 0; w < N_WTYPE; w++)
            for (int variant = 0; variant < 2; variant++) {
                /* variant 0: tied gpt2 vocab; 1: untied spm vocab, GQA 4:1, head_dim 32 */
                tb_tiny_spec sp = {.arch = k_arches[a], .wtype = k_wtypes[w], .seed = 11u + (uint64_t)w};
                if (variant) {
                    sp.untied = true;
                    sp.vocab = TB_VOCAB_SPM;
                    sp.n_layer = 3;
                    sp.n_head_kv = 1;
                    sp.head_dim = 32;
                    sp.n_ctx_train = 128;
                    sp.rope_base = 500000.0f;
                    sp.rms_eps = 1e-6f;
                }
                tiny t;
                tiny_open(&t, sp);
                const tb_tiny_spec *s = &t.spec;
                const rk_hparams *hp = rk_model_hparams(t.m);
                const char *what = rk_model_name(t.m);
                cr_expect_eq(hp->arch, (rk_arch)a, "%s", what);
                cr_expect_str_eq(hp->arch_name, k_arch_names[a]);
                cr_expect_eq(hp->n_layer, s->n_layer, "%s", what);
                cr_expect_eq(hp->n_embd, s->n_embd, "%s", what);
                cr_expect_eq(hp->n_head, s->n_head, "%s", what);
                cr_expect_eq(hp->n_head_kv, s->n_head_kv, "%s", what);
                cr_expect_eq(hp->head_dim, s->head_dim, "%s", what);
                cr_expect_eq(hp->n_ff, s->n_ff, "%s", what);
                cr_expect_eq(hp->n_ctx_train, s->n_ctx_train, "%s", what);
                cr_expect_eq(hp->n_rot, s->head_dim, "%s", what);
                cr_expect_eq(hp->n_vocab, tb_tiny_n_vocab(s), "%s", what);
                cr_expect_eq(hp->rope_base, s->rope_base, "%s", what);
                cr_expect_eq(hp->rms_eps, s->rms_eps, "%s", what);
                cr_expect_eq(hp->rope_mode, a == 0 ? RK_ROPE_NORM : RK_ROPE_NEOX, "%s", what);
                cr_expect_eq(hp->tied_output, !s->untied, "%s", what);
                cr_expect_eq(hp->has_qkv_bias, a == 1, "%s", what);
                cr_expect_eq(hp->has_qk_norm, a == 2, "%s", what);
                /* every tensor in the file is bound: weight bytes = sum over the file's tensors */
                const rk_gguf *g = rk_model_gguf(t.m);
                uint64_t sum = 0, n_matrix_typed = 0;
                for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
                    const rk_gguf_tensor *ten = rk_gguf_tensor_at(g, i);
                    sum += ten->n_bytes;
                    n_matrix_typed += ten->n_dims == 2 && ten->type == k_wtypes[w];
                }
                cr_expect_eq(rk_model_weight_bytes(t.m), sum, "%s: %llu vs %llu", what,
                             (unsigned long long)rk_model_weight_bytes(t.m), (unsigned long long)sum);
                /* matrices: token_embd (+ output) + 7 per layer, all in wtype */
                cr_expect_eq(n_matrix_typed, (uint64_t)(1 + s->untied + 7 * s->n_layer), "%s", what);
                cr_expect_eq(rk_model_add_bos(t.m), s->vocab == TB_VOCAB_SPM, "%s", what);
                cr_expect_eq(rk_model_token_bos(t.m), s->vocab == TB_VOCAB_SPM ? 1 : TB_GPT2_ENDOFTEXT);
                tiny_close(&t);
            }
}

Test(tiny, impossible_specs_are_refused_by_the_generator) {
    char why[256];
    size_t len;
    tb_tiny_spec sp = {.arch = TB_ARCH_LLAMA, .wtype = RK_DT_Q8_0, .n_embd = 48};
    cr_expect_null(tb_tiny_gguf(&sp, &len, why, sizeof why));
    cr_expect(strstr(why, "multiples"), "%s", why);
    sp = (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .n_head = 4, .n_head_kv = 3};
    cr_expect_null(tb_tiny_gguf(&sp, &len, why, sizeof why));
    sp = (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .wtype = RK_DT_Q4_K};
    cr_expect_null(tb_tiny_gguf(&sp, &len, why, sizeof why));
}

/* ---- the forward pass against the oracle ----------------------------------------- */

static void check_against_reference(tb_tiny_spec sp, size_t n) {
    tiny t;
    tiny_open(&t, sp);
    int32_t ids[64];
    cr_assert(n <= 64);
    random_ids(ids, n, t.nv, sp.seed + 100);
    float *want = reference(&t, ids, n);
    const size_t total = n * (size_t)t.nv;
    cr_assert(all_finite(want, total));
    const double scale = max_abs(want, total), tol = TOL_F32 * (1.0 + scale);
    /* the logits are not degenerate: a spread of a few units */
    cr_expect(scale > 0.5 && scale < 100, "%s: logit scale %g", rk_model_name(t.m), scale);
    for (int be = 0; be < 2; be++) {
        rk_session_params p = params(0, 0, RK_DT_F32, be ? RK_BACKEND_CPU : RK_BACKEND_CPU_REF);
        float *got = eval_all(&t, p, ids, n);
        cr_expect(all_finite(got, total), "%s: non-finite logits", rk_model_name(t.m));
        double d = max_diff(got, want, total);
        cr_expect(d <= tol, "%s %s vs oracle: max |dlogit| %.3g > %.3g (scale %.3g)", rk_model_name(t.m),
                  be ? "cpu" : "cpu_ref", d, tol, scale);
        free(got);
    }
    free(want);
    tiny_close(&t);
}

Test(tiny, logits_match_reference_forward_every_arch_and_dtype, .timeout = 120) {
    for (int a = 0; a < N_ARCH; a++)
        for (int w = 0; w < N_WTYPE; w++)
            check_against_reference((tb_tiny_spec){.arch = k_arches[a], .wtype = k_wtypes[w], .seed = 3}, 20);
}

/* Shapes off the default path: q_dim != n_embd, GQA 4:1, partial rotary, untied, 3 layers,
 * another RoPE base and epsilon; and MHA (n_head_kv = n_head). */
Test(tiny, logits_match_reference_forward_odd_shapes, .timeout = 120) {
    for (int a = 0; a < N_ARCH; a++) {
        check_against_reference((tb_tiny_spec){.arch = k_arches[a],
                                               .n_layer = 3,
                                               .n_head_kv = 1,
                                               .head_dim = 32,
                                               .n_rot = 16,
                                               .untied = true,
                                               .rope_base = 1e6f,
                                               .rms_eps = 1e-6f,
                                               .vocab = TB_VOCAB_SPM,
                                               .seed = 5},
                                40);
        check_against_reference(
            (tb_tiny_spec){
                .arch = k_arches[a], .n_head = 2, .n_head_kv = 2, .n_ff = 64, .wtype = RK_DT_Q8_0, .seed = 6},
            33);
    }
}

/* ---- eval invariances ------------------------------------------------------------ */

/* Chunking must not change the result: with cpu_ref every row is computed by the same
 * scalar code whatever the chunk (bit-identical); the cpu backend switches between its
 * gemv and gemm paths with the chunk size, so only f32 reordering noise is allowed on
 * F32 weights, and the 8-bit activation rounding of the GEMV (TOL_Q8) on Q4_0. */
Test(tiny, chunked_eval_equals_one_shot) {
    const size_t n = 29;
    for (int a = 0; a < N_ARCH; a++)
        for (int w = 0; w < 2; w++) {
            tiny t;
            tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .wtype = w ? RK_DT_Q4_0 : RK_DT_F32, .seed = 7});
            int32_t ids[29];
            random_ids(ids, n, t.nv, 70 + (uint64_t)a);
            const size_t total = n * (size_t)t.nv;
            for (int be = 0; be < 2; be++) {
                rk_backend_kind kind = be ? RK_BACKEND_CPU : RK_BACKEND_CPU_REF;
                float *one = eval_all(&t, params(0, 512, RK_DT_F32, kind), ids, n);
                /* quantised weights on cpu: GEMV (8-bit activations) vs f32 tiles */
                const double tol = be ? (w ? TOL_Q8 : TOL_F32) * (1.0 + max_abs(one, total)) : 0.0;
                const int32_t batches[] = {1, 3, 7};
                for (int b = 0; b < 3; b++) {
                    float *ch = eval_all(&t, params(0, batches[b], RK_DT_F32, kind), ids, n);
                    double d = max_diff(one, ch, total);
                    cr_expect(d <= tol, "%s %s n_batch %d: max |dlogit| %.3g > %.3g", rk_model_name(t.m),
                              be ? "cpu" : "cpu_ref", batches[b], d, tol);
                    /* the last-row form comes from the last chunk */
                    rk_session *s = session(&t, params(0, batches[b], RK_DT_F32, kind));
                    rk_err e = {0};
                    cr_assert_eq(rk_session_eval(s, ids, n, ch, false, &e), RK_OK, "%s", e.msg);
                    d = max_diff(one + (n - 1) * (size_t)t.nv, ch, (size_t)t.nv);
                    cr_expect(d <= tol, "%s n_batch %d: last row %.3g", rk_model_name(t.m), batches[b], d);
                    rk_session_destroy(s);
                    free(ch);
                }
                free(one);
            }
            tiny_close(&t);
        }
}

/* Two eval calls (prefix, then the rest) give the rows one call gives; the last-row form
 * (all_rows false) is the last of those rows. */
Test(tiny, prefix_then_rest_equals_one_eval) {
    for (int a = 0; a < N_ARCH; a++) {
        tiny t;
        tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .seed = 8});
        const size_t n = 16, k = 5, nv = (size_t)t.nv;
        int32_t ids[16];
        random_ids(ids, n, t.nv, 80);
        for (int be = 0; be < 2; be++) {
            rk_session_params p = params(32, 0, RK_DT_F32, be ? RK_BACKEND_CPU : RK_BACKEND_CPU_REF);
            float *one = eval_all(&t, p, ids, n);
            const double tol = be ? TOL_F32 * (1.0 + max_abs(one, n * nv)) : 0.0;
            rk_session *s = session(&t, p);
            float *two = malloc(n * nv * sizeof *two), *last = malloc(nv * sizeof *last);
            rk_err e = {0};
            cr_assert_eq(rk_session_eval(s, ids, k, two, true, &e), RK_OK, "%s", e.msg);
            cr_assert_eq(rk_session_n_past(s), (int64_t)k);
            cr_assert_eq(rk_session_eval(s, ids + k, n - k, two + k * nv, true, &e), RK_OK, "%s", e.msg);
            cr_assert_eq(rk_session_n_past(s), (int64_t)n);
            double d = max_diff(one, two, n * nv);
            cr_expect(d <= tol, "%s %s: prefix+rest vs one: %.3g > %.3g", rk_model_name(t.m), be ? "cpu" : "ref", d,
                      tol);
            rk_session_reset(s);
            cr_assert_eq(rk_session_eval(s, ids, n, last, false, &e), RK_OK, "%s", e.msg);
            d = max_diff(one + (n - 1) * nv, last, nv);
            cr_expect(d <= tol, "%s: last-row logits vs all rows: %.3g", rk_model_name(t.m), d);
            free(two), free(last), free(one);
            rk_session_destroy(s);
        }
        tiny_close(&t);
    }
}

/* truncate(n) forgets positions >= n: re-evaluating the same tokens gives the same logits,
 * even after other tokens were written over those cache rows in between. */
Test(tiny, truncate_then_reeval_gives_the_same_logits) {
    for (int a = 0; a < N_ARCH; a++) {
        tiny t;
        tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .seed = 9});
        const size_t n = 18, cut = 11, nv = (size_t)t.nv;
        int32_t ids[18], other[18];
        random_ids(ids, n, t.nv, 90);
        random_ids(other, n, t.nv, 91);
        rk_session *s = session(&t, params(32, 0, RK_DT_F32, RK_BACKEND_CPU_REF));
        float *full = malloc(n * nv * sizeof *full), *again = malloc(n * nv * sizeof *again);
        rk_err e = {0};
        cr_assert_eq(rk_session_eval(s, ids, n, full, true, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_truncate(s, (int64_t)cut, &e), RK_OK, "%s", e.msg);
        cr_expect_eq(rk_session_n_past(s), (int64_t)cut);
        cr_assert_eq(rk_session_eval(s, ids + cut, n - cut, again, true, &e), RK_OK, "%s", e.msg);
        cr_expect(max_diff(full + cut * nv, again, (n - cut) * nv) == 0.0, "%s: re-eval after truncate differs",
                  rk_model_name(t.m));
        /* overwrite the rows with other tokens, cut back, and the original tokens again */
        cr_assert_eq(rk_session_truncate(s, (int64_t)cut, &e), RK_OK);
        cr_assert_eq(rk_session_eval(s, other + cut, n - cut, again, true, &e), RK_OK, "%s", e.msg);
        cr_expect(max_diff(full + cut * nv, again, (n - cut) * nv) > 0.0, "other tokens give other logits");
        cr_assert_eq(rk_session_truncate(s, (int64_t)cut, &e), RK_OK);
        cr_assert_eq(rk_session_eval(s, ids + cut, n - cut, again, true, &e), RK_OK, "%s", e.msg);
        cr_expect(max_diff(full + cut * nv, again, (n - cut) * nv) == 0.0, "%s: stale rows were read",
                  rk_model_name(t.m));
        /* out of range: refused, nothing changes */
        cr_expect_eq(rk_session_truncate(s, (int64_t)n + 1, &e), RK_E_INVALID_ARG);
        cr_expect_eq(rk_session_truncate(s, -1, &e), RK_E_INVALID_ARG);
        cr_expect_eq(rk_session_n_past(s), (int64_t)n);
        cr_expect_eq(rk_session_truncate(s, (int64_t)n, &e), RK_OK);
        cr_expect_eq(rk_session_truncate(s, 0, &e), RK_OK);
        cr_expect_eq(rk_session_n_past(s), 0);
        free(full), free(again);
        rk_session_destroy(s);
        tiny_close(&t);
    }
}

Test(tiny, reset_starts_a_fresh_sequence) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_QWEN2, .seed = 10});
    const size_t nv = (size_t)t.nv;
    int32_t a[12], b[9];
    random_ids(a, 12, t.nv, 100);
    random_ids(b, 9, t.nv, 101);
    rk_session_params p = params(32, 0, RK_DT_F32, RK_BACKEND_CPU_REF);
    float *fresh = eval_all(&t, p, b, 9);
    rk_session *s = session(&t, p);
    float *lg = malloc(12 * nv * sizeof *lg);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, a, 12, lg, true, &e), RK_OK, "%s", e.msg);
    rk_session_reset(s);
    cr_expect_eq(rk_session_n_past(s), 0);
    cr_assert_eq(rk_session_eval(s, b, 9, lg, true, &e), RK_OK, "%s", e.msg);
    cr_expect(max_diff(fresh, lg, 9 * nv) == 0.0, "after reset the earlier tokens still count");
    free(fresh), free(lg);
    rk_session_destroy(s);
    tiny_close(&t);
}

/* Tokens that do not fit: RK_E_CONTEXT and the session exactly as before (the next
 * eval continues as if the refused call never happened). */
Test(tiny, context_overflow_is_refused_and_changes_nothing) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .seed = 12});
    const size_t nv = (size_t)t.nv;
    int32_t ids[17], junk[7];
    random_ids(ids, 17, t.nv, 120);
    random_ids(junk, 7, t.nv, 121);
    rk_session_params p = params(16, 0, RK_DT_F32, RK_BACKEND_CPU_REF);
    float *one = eval_all(&t, p, ids, 16);
    rk_session *s = session(&t, p);
    cr_expect_eq(rk_session_n_ctx(s), 16);
    float *lg = malloc(16 * nv * sizeof *lg);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, 10, lg, true, &e), RK_OK, "%s", e.msg);
    for (size_t i = 0; i < 16 * nv; i++) lg[i] = 12345.0f;
    cr_expect_eq(rk_session_eval(s, junk, 7, lg, true, &e), RK_E_CONTEXT, "%s", e.msg);
    cr_expect(strstr(e.msg, "context"), "%s", e.msg);
    cr_expect_eq(rk_session_n_past(s), 10);
    cr_expect_eq(lg[0], 12345.0f, "logits written by a refused eval");
    cr_assert_eq(rk_session_eval(s, ids + 10, 6, lg, true, &e), RK_OK, "%s", e.msg);
    cr_expect(max_diff(one + 10 * nv, lg, 6 * nv) == 0.0, "the refused eval changed the cache");
    cr_expect_eq(rk_session_n_past(s), 16);
    cr_expect_eq(rk_session_eval(s, ids, 1, NULL, false, &e), RK_E_CONTEXT, "full context takes no token");
    rk_session_reset(s);
    cr_expect_eq(rk_session_eval(s, ids, 17, NULL, false, &e), RK_E_CONTEXT);
    cr_expect_eq(rk_session_n_past(s), 0);
    rk_session_destroy(s);
    /* n_ctx 0: the training context */
    s = session(&t, params(0, 0, RK_DT_F16, RK_BACKEND_CPU));
    cr_expect_eq(rk_session_n_ctx(s), t.spec.n_ctx_train);
    rk_session_destroy(s);
    free(one), free(lg);
    tiny_close(&t);
}

Test(tiny, token_ids_out_of_range_are_rejected) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_QWEN3, .seed = 13});
    rk_session *s = session(&t, params(32, 0, RK_DT_F16, RK_BACKEND_CPU));
    rk_err e = {0};
    int32_t ok[3] = {1, 2, 3};
    cr_assert_eq(rk_session_eval(s, ok, 3, NULL, false, &e), RK_OK, "%s", e.msg);
    const int32_t bad[][3] = {{4, -1, 5}, {4, t.nv, 5}, {INT32_MAX, 4, 5}, {INT32_MIN, 4, 5}};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(rk_session_eval(s, bad[i], 3, NULL, false, &e), RK_E_INVALID_ARG, "case %d: %s", i, e.msg);
        cr_expect(strstr(e.msg, "outside vocab"), "%s", e.msg);
        cr_expect_eq(rk_session_n_past(s), 3);
    }
    cr_expect_eq(rk_session_eval(s, ok, 0, NULL, false, &e), RK_E_INVALID_ARG, "zero tokens");
    int32_t edge[2] = {0, t.nv - 1};
    cr_expect_eq(rk_session_eval(s, edge, 2, NULL, false, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_session_n_past(s), 5);
    rk_session_destroy(s);
    tiny_close(&t);
}

static bool cancel_at_8(void *ud, int64_t done, int64_t total) {
    int64_t *seen = ud;
    seen[seen[0] + 1] = done;
    seen[0]++;
    (void)total;
    return done < 8;
}

static bool count_calls(void *ud, int64_t done, int64_t total) {
    int64_t *seen = ud;
    seen[seen[0] + 1] = done * 1000 + total;
    seen[0]++;
    return true;
}

Test(tiny, cancelled_eval_leaves_session_unchanged) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .seed = 14});
    const size_t nv = (size_t)t.nv;
    int32_t ids[15];
    random_ids(ids, 15, t.nv, 140);
    rk_session_params p = params(32, 4, RK_DT_F32, RK_BACKEND_CPU_REF);
    float *one = eval_all(&t, p, ids, 15);
    rk_session *s = session(&t, p);
    rk_err e = {0};
    float *lg = malloc(15 * nv * sizeof *lg);
    cr_assert_eq(rk_session_eval(s, ids, 3, lg, true, &e), RK_OK);
    int64_t seen[16] = {0};
    rk_session_set_progress(s, cancel_at_8, seen);
    cr_expect_eq(rk_session_eval(s, ids + 3, 12, lg, true, &e), RK_E_CANCELLED, "%s", e.msg);
    cr_expect_eq(seen[0], 2, "called after chunks 1 and 2, cancelled at 2");
    cr_expect(seen[1] == 4 && seen[2] == 8, "%lld %lld", (long long)seen[1], (long long)seen[2]);
    cr_expect_eq(rk_session_n_past(s), 3);
    memset(seen, 0, sizeof seen);
    rk_session_set_progress(s, count_calls, seen);
    cr_assert_eq(rk_session_eval(s, ids + 3, 12, lg, true, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(seen[0], 3);
    cr_expect(seen[1] == 4012 && seen[2] == 8012 && seen[3] == 12012, "%lld %lld %lld", (long long)seen[1],
              (long long)seen[2], (long long)seen[3]);
    cr_expect(max_diff(one + 3 * nv, lg, 12 * nv) == 0.0, "the cancelled eval changed the cache");
    free(one), free(lg);
    rk_session_destroy(s);
    tiny_close(&t);
}

/* ---- backends, threads, KV types -------------------------------------------------- */

Test(tiny, cpu_matches_cpu_ref_and_threads_do_not_change_results) {
    for (int a = 0; a < N_ARCH; a++)
        for (int w = 0; w < N_WTYPE; w++) {
            tiny t;
            tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .wtype = k_wtypes[w], .seed = 15});
            const size_t n = 24, total = n * (size_t)t.nv;
            int32_t ids[24];
            random_ids(ids, n, t.nv, 150);
            for (int kv = 0; kv < 2; kv++) {
                const uint32_t kv_type = kv ? RK_DT_F16 : RK_DT_F32;
                float *ref = eval_all(&t, params(0, 0, kv_type, RK_BACKEND_CPU_REF), ids, n);
                rk_session_params p = params(0, 0, kv_type, RK_BACKEND_CPU);
                float *c1 = eval_all(&t, p, ids, n);
                p.n_threads = 2;
                float *c2 = eval_all(&t, p, ids, n);
                /* f32 cache: f32 reordering noise only. f16 cache: that noise flips the f16
                 * rounding of a few elements by one f16 ulp, at most twice the half-ulp
                 * rounding of every element, whose whole effect (f16_kv_close_to_f32_kv)
                 * stays below 1e-3 of the scale: allow 2e-3 (1 + scale). */
                const double tol = (kv ? 2e-3 : TOL_F32) * (1.0 + max_abs(ref, total));
                double d = max_diff(ref, c1, total);
                cr_expect(d <= tol, "%s kv %s: cpu vs cpu_ref %.3g > %.3g", rk_model_name(t.m), rk_dtype_name(kv_type),
                          d, tol);
                /* every output element is computed by one thread in a fixed order */
                cr_expect(max_diff(c1, c2, total) == 0.0, "%s: 1 vs 2 threads differ", rk_model_name(t.m));
                free(ref), free(c1), free(c2);
            }
            tiny_close(&t);
        }
}

/* An f16 cache rounds each K/V element by at most 2^-11 relative. Attention outputs are
 * convex combinations of V rows and scores move by <= 2^-11 |q||k|/sqrt(hd), so two layers
 * move the logits by ~1e-3 of their scale (measured 8e-4): we allow 1e-2 (1 + scale). The
 * difference must also not be zero: the f16 cache is really used. */
Test(tiny, f16_kv_close_to_f32_kv) {
    for (int a = 0; a < N_ARCH; a++) {
        tiny t;
        tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .seed = 16});
        const size_t n = 30, total = n * (size_t)t.nv;
        int32_t ids[30];
        random_ids(ids, n, t.nv, 160);
        for (int be = 0; be < 2; be++) {
            rk_backend_kind kind = be ? RK_BACKEND_CPU : RK_BACKEND_CPU_REF;
            float *f32 = eval_all(&t, params(0, 0, RK_DT_F32, kind), ids, n);
            float *f16 = eval_all(&t, params(0, 0, RK_DT_F16, kind), ids, n);
            const double scale = max_abs(f32, total), d = max_diff(f32, f16, total);
            cr_expect(d > 0.0, "%s: f16 cache gives bit-identical logits", rk_model_name(t.m));
            cr_expect(d <= 1e-2 * (1.0 + scale), "%s: f16 vs f32 KV %.3g (scale %.3g)", rk_model_name(t.m), d, scale);
            free(f32), free(f16);
        }
        const rk_hparams *hp = rk_model_hparams(t.m);
        const uint64_t kvd = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
        rk_session *s = session(&t, params(0, 0, RK_DT_F16, RK_BACKEND_CPU));
        cr_expect_eq(rk_session_kv_bytes_per_token(s), 2u * (uint64_t)hp->n_layer * kvd * 2u);
        rk_session_destroy(s);
        s = session(&t, params(0, 0, RK_DT_F32, RK_BACKEND_CPU));
        cr_expect_eq(rk_session_kv_bytes_per_token(s), 2u * (uint64_t)hp->n_layer * kvd * 4u);
        rk_session_destroy(s);
        tiny_close(&t);
    }
}

Test(tiny, unknown_kv_policy_is_refused) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .seed = 17});
    rk_session_params p = params(0, 0, RK_DT_F16, RK_BACKEND_CPU);
    p.kv.kind = (rk_kv_kind)77;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_expect_eq(rk_session_create(t.m, &p, &s, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "KV policy 77"), "%s", e.msg);
    cr_expect_null(s);
    rk_session_destroy(NULL);
    tiny_close(&t);
}

/* Rounding the same weights more coarsely moves the logits more. Per weight, f16 rounds
 * by <= 2^-11 relative (rms ~3e-4 of the weights' spread), q8_0 by half a step of
 * amax/127 per block of 32 (rms ~5e-3) and q4_0 by half a step of amax/8 (rms ~8e-2):
 * ratios of ~17 each. For perturbations this small the model responds about linearly,
 * so the rms logit errors against the f32 model of the same seed keep ratios of that
 * order; we require > 4 for each step (a type silently stored or read as another would
 * give ~1). */
Test(tiny, quantisation_error_grows_with_coarser_types) {
    const uint32_t types[] = {RK_DT_F32, RK_DT_F16, RK_DT_Q8_0, RK_DT_Q4_0};
    for (int a = 0; a < N_ARCH; a++) {
        int32_t ids[20];
        float *lg[4];
        size_t total = 0;
        for (int k = 0; k < 4; k++) {
            tiny t;
            tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .wtype = types[k], .seed = 18});
            random_ids(ids, 20, t.nv, 180);
            total = 20 * (size_t)t.nv;
            lg[k] = eval_all(&t, params(0, 0, RK_DT_F32, RK_BACKEND_CPU_REF), ids, 20);
            tiny_close(&t);
        }
        double ss = 0, err[4] = {0};
        for (size_t i = 0; i < total; i++) {
            ss += (double)lg[0][i] * lg[0][i];
            for (int k = 1; k < 4; k++) err[k] += ((double)lg[k][i] - lg[0][i]) * ((double)lg[k][i] - lg[0][i]);
        }
        for (int k = 1; k < 4; k++) err[k] = sqrt(err[k] / ss);
        cr_log_info("%s: rms relative logit error f16 %.3g q8_0 %.3g q4_0 %.3g", k_arch_names[a], err[1], err[2],
                    err[3]);
        cr_expect(err[1] > 0 && err[2] > 4 * err[1] && err[3] > 4 * err[2],
                  "%s: rms relative errors f16 %.3g q8_0 %.3g q4_0 %.3g", k_arch_names[a], err[1], err[2], err[3]);
        cr_expect(err[1] < 1e-2, "%s: f16 weights moved the logits by %.3g", k_arch_names[a], err[1]);
        for (int k = 0; k < 4; k++) free(lg[k]);
    }
}

/* ---- generation ---------------------------------------------------------------- */

static size_t greedy(const tiny *t, rk_backend_kind be, const int32_t *prompt, size_t n_prompt, size_t n_gen,
                     int32_t *out) {
    rk_session *s = session(t, params(64, 0, RK_DT_F32, be));
    float *lg = malloc((size_t)t->nv * sizeof *lg);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, prompt, n_prompt, lg, false, &e), RK_OK, "%s", e.msg);
    size_t k = 0;
    for (; k < n_gen; k++) {
        out[k] = argmax(lg, t->nv, NULL);
        if (k + 1 < n_gen) cr_assert_eq(rk_session_eval(s, &out[k], 1, lg, false, &e), RK_OK, "%s", e.msg);
    }
    free(lg);
    rk_session_destroy(s);
    return k;
}

/* Greedy decoding one token at a time is deterministic, and every step equals the argmax
 * of the oracle's logits over the whole generated sequence at once (checked where the
 * oracle's top-2 margin exceeds the float tolerance, so a near-tie cannot flip it). */
Test(tiny, greedy_generation_is_deterministic_and_matches_the_oracle) {
    for (int a = 0; a < N_ARCH; a++) {
        tiny t;
        /* F32 weights: the cpu backend's quantised-weight decode rounds activations to
         * 8 bits (TOL_Q8), far above the margins this oracle comparison relies on;
         * that path is bounded by the kernel tests (test_quant.c qdot_*). */
        tiny_open(&t, (tb_tiny_spec){.arch = k_arches[a], .wtype = RK_DT_F32, .untied = true, .seed = 19});
        int32_t seq[48];
        const size_t n_prompt = 8, n_gen = 32;
        random_ids(seq, n_prompt, t.nv, 190);
        int32_t g1[32], g2[32], g3[32];
        cr_assert_eq(greedy(&t, RK_BACKEND_CPU, seq, n_prompt, n_gen, g1), n_gen);
        greedy(&t, RK_BACKEND_CPU, seq, n_prompt, n_gen, g2);
        greedy(&t, RK_BACKEND_CPU_REF, seq, n_prompt, n_gen, g3);
        cr_expect(memcmp(g1, g2, sizeof g1) == 0, "%s: two greedy runs differ", k_arch_names[a]);
        memcpy(seq + n_prompt, g1, sizeof g1);
        float *ref = reference(&t, seq, n_prompt + n_gen - 1);
        const size_t nv = (size_t)t.nv;
        const double tol = TOL_F32 * (1.0 + max_abs(ref, (n_prompt + n_gen - 1) * nv));
        size_t checked = 0, distinct = 0;
        for (size_t k = 0; k < n_gen; k++) {
            float margin;
            int32_t want = argmax(ref + (n_prompt - 1 + k) * nv, t.nv, &margin);
            if (margin <= 2 * tol) continue;
            checked++;
            cr_expect_eq(g1[k], want, "%s step %zu: cpu %d vs oracle %d", k_arch_names[a], k, g1[k], want);
            cr_expect_eq(g3[k], want, "%s step %zu: cpu_ref %d vs oracle %d", k_arch_names[a], k, g3[k], want);
        }
        for (size_t k = 1; k < n_gen; k++) distinct += g1[k] != g1[0];
        cr_expect(checked >= n_gen - 2, "%s: only %zu of %zu steps had a clear margin", k_arch_names[a], checked,
                  n_gen);
        cr_expect(distinct > 0, "%s: the continuation is one repeated token", k_arch_names[a]);
        free(ref);
        tiny_close(&t);
    }
}
