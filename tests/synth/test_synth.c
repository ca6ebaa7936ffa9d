/* rk_synth: the files it writes load, match an independent reader, are
 * reproducible, carry the promised tensor types and weight statistics, and
 * bad parameters are refused with the parameter named. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_gguf.h"
#include "rk_kernels.h"
#include "rk_synth.h"
#include "tb.h"

static const char *const k_types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "q4_k_m"};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static void *build(const char *shape, const char *type, int64_t vocab, int layers, uint64_t seed, size_t *len) {
    rk_synth_params p = {shape, type, vocab, layers, seed};
    void *bytes = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_synth_build(&p, &bytes, len, &err), RK_OK, "%s %s: %s", shape, type, err.msg);
    return bytes;
}

static const char *write_tmp(const void *bytes, size_t len, char *path, size_t cap) {
    cr_assert(tb_tmp_path(path, cap, "synth", ".gguf"), "%s", path);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(bytes, 1, len, f) == len && fclose(f) == 0);
    return path;
}

/* mean and standard deviation of a tensor's dequantised values */
static void stats(const rk_gguf_tensor *t, double *mean, double *sd) {
    const rk_quant_fns *q = rk_quant_ref(t->type);
    cr_assert(q, "no reference for %s", rk_dtype_name(t->type));
    int64_t n = t->ne[0] * t->ne[1];
    float *f = malloc((size_t)n * sizeof(float));
    cr_assert(f);
    q->to_f32(t->data, f, n);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += f[i], s2 += (double)f[i] * f[i];
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
    free(f);
}

Test(synth, types_shapes_and_weight_statistics) {
    for (size_t k = 0; k < N_TYPES; k++) {
        size_t len = 0;
        void *bytes = build("smollm2-135m", k_types[k], 512, 2, 7, &len);
        rk_gguf *g = NULL;
        rk_err err = {0};
        cr_assert_eq(rk_gguf_parse(bytes, len, &g, &err), RK_OK, "%s: %s", k_types[k], err.msg);
        cr_assert_eq(rk_gguf_n_tensors(g), 2 + 2 * 9, "%s: tensor count", k_types[k]); /* llama, tied */
        for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
            const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            int layer = -1;
            sscanf(name, "blk.%d.", &layer);
            uint32_t want = RK_DT_F32;
            if (t->n_dims == 2) cr_assert(rk_synth_tensor_type(k_types[k], name, layer, 2, t->ne[0], &want));
            cr_expect_eq(t->type, want, "%s %s: %s vs %s", k_types[k], name, rk_dtype_name(t->type),
                         rk_dtype_name(want));
        }
        /* ffn_gate rows are 576 (K types fall back), ffn_down rows 1536 (K types stay): the
         * dequantised values have mean ~0 and sd within 10% of 1/sqrt(fan_in) (q4_K's and
         * q6_K's random sub-block scales add a few % of rms over their mean; f16 scales
         * round). sd of the sample sd over ~9e5 values is < 0.1%. */
        const char *mats[] = {"blk.1.ffn_gate.weight", "blk.1.ffn_down.weight", "blk.0.attn_v.weight"};
        for (int j = 0; j < 3; j++) {
            const rk_gguf_tensor *t = rk_gguf_find_tensor(g, mats[j]);
            cr_assert(t);
            double mean, sd, want = 1.0 / sqrt((double)t->ne[0]);
            stats(t, &mean, &sd);
            cr_expect(fabs(sd / want - 1.0) < 0.10, "%s %s (%s): sd %.4g vs %.4g", k_types[k], mats[j],
                      rk_dtype_name(t->type), sd, want);
            cr_expect(fabs(mean) < 0.04 * want, "%s %s (%s): mean %.3g (sd %.3g)", k_types[k], mats[j],
                      rk_dtype_name(t->type), mean, want);
        }
        if (!strcmp(k_types[k], "q4_k_m")) { /* q6_K where llama.cpp's mix puts it */
            cr_expect_eq(rk_gguf_find_tensor(g, "token_embd.weight")->type, RK_DT_Q8_0); /* 576: q6_K falls back */
            /* use_more_bits(i, 2): layer 1 only (i >= 7 * 2 / 8) */
            cr_expect_eq(rk_gguf_find_tensor(g, "blk.0.ffn_down.weight")->type, RK_DT_Q4_K);
            cr_expect_eq(rk_gguf_find_tensor(g, "blk.1.ffn_down.weight")->type, RK_DT_Q6_K);
            cr_expect_eq(rk_gguf_find_tensor(g, "blk.1.ffn_up.weight")->type, RK_DT_Q4_1);
        }
        rk_gguf_destroy(g);
        free(bytes);
    }
}

Test(synth, q4_k_m_mix_on_a_256_multiple) {
    uint32_t t = 0;
    cr_assert(rk_synth_tensor_type("q4_k_m", "blk.3.ffn_gate.weight", 3, 28, 1536, &t));
    cr_expect_eq(t, RK_DT_Q4_K);
    cr_assert(rk_synth_tensor_type("q4_k_m", "token_embd.weight", -1, 28, 1536, &t));
    cr_expect_eq(t, RK_DT_Q6_K);
    /* use_more_bits(i, 28): i < 3, i >= 24, (i - 3) % 3 == 2 */
    const bool six[28] = {1, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1};
    for (int i = 0; i < 28; i++) {
        cr_assert(rk_synth_tensor_type("q4_k_m", "blk.N.attn_v.weight", i, 28, 1536, &t));
        cr_expect_eq(t, six[i] ? RK_DT_Q6_K : RK_DT_Q4_K, "layer %d", i);
    }
    cr_expect_not(rk_synth_tensor_type("q5_0", "x", 0, 1, 256, &t));
}

/* Loads through the runtime and gives the logits of tests/tb's independent
 * double-precision forward (same tolerance as test_tiny.c: f32 KV, 2e-5 of the
 * logit scale), for every architecture the shapes use. */
Test(synth, loads_and_matches_the_reference_forward, .timeout = 240) {
    const struct {
        const char *shape, *type;
        int layers;
        const char *arch;
    } cases[] = {
        {"smollm2-135m", "q8_0", 2, "llama"},
        {"smollm2-135m", "f32", 1, "llama"},
        {"qwen2.5-1.5b", "q4_0", 1, "qwen2"},
        {"qwen3-0.6b", "q4_1", 1, "qwen3"},
        /* llama-3.2-1b is llama like smollm2: shapes_all_load loads it */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len = 0;
        void *bytes = build(cases[c].shape, cases[c].type, 400, cases[c].layers, 3, &len);
        char path[512];
        write_tmp(bytes, len, path, sizeof path);
        free(bytes);
        rk_model *m = NULL;
        rk_err err = {0};
        cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s: %s", cases[c].shape, err.msg);
        const rk_hparams *hp = rk_model_hparams(m);
        cr_expect_str_eq(hp->arch_name, cases[c].arch);
        cr_expect_eq(hp->n_vocab, 400);
        cr_expect_eq(hp->n_layer, cases[c].layers);
        const rk_synth_shape *sh = rk_synth_shapes();
        while (strcmp(sh->name, cases[c].shape)) sh++;
        cr_expect_eq(hp->n_embd, sh->n_embd);
        cr_expect_eq(hp->n_head, sh->n_head);
        cr_expect_eq(hp->n_head_kv, sh->n_head_kv);
        cr_expect_eq(hp->head_dim, sh->head_dim);
        cr_expect_eq(hp->n_ff, sh->n_ff);
        cr_expect_eq(hp->rope_base, sh->rope_base);
        /* text of any bytes tokenizes (byte fallback) */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        const char *text = "Hello, world: caf\xc3\xa9 42!";
        cr_assert_eq(rk_model_tokenize(m, text, strlen(text), true, false, &ids, &n_ids, &err), RK_OK, "%s", err.msg);
        cr_assert(n_ids >= 4, "%zu tokens", n_ids);
        if (n_ids > 5) n_ids = 5;
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = 64;
        cr_assert_eq(rk_kv_params_parse("f32", &sp.kv, &err), RK_OK, "%s", err.msg);
        rk_session *s = NULL;
        cr_assert_eq(rk_session_create(m, &sp, &s, &err), RK_OK, "%s", err.msg);
        float *got = malloc(n_ids * 400 * sizeof(float));
        cr_assert_eq(rk_session_eval(s, ids, n_ids, got, true, &err), RK_OK, "%s", err.msg);
        char why[512];
        int32_t nv = 0;
        float *want = tb_ref_logits(path, ids, n_ids, &nv, why, sizeof why);
        cr_assert(want, "%s", why);
        cr_assert_eq(nv, 400);
        double scale = 0, d = 0;
        for (size_t i = 0; i < n_ids * 400; i++) {
            cr_assert(isfinite(got[i]) && isfinite(want[i]), "%s: non-finite logit at %zu", cases[c].shape, i);
            scale = fmax(scale, fabs(want[i]));
            d = fmax(d, fabs((double)got[i] - want[i]));
        }
        /* logits are spread (std ~3 by construction) but not blown up */
        cr_expect(scale > 2 && scale < 100, "%s: logit scale %g", cases[c].shape, scale);
        cr_expect(d <= 2e-5 * (1 + scale), "%s %s: max |dlogit| %.3g vs oracle (scale %.3g)", cases[c].shape,
                  cases[c].type, d, scale);
        free(got);
        free(want);
        free(ids);
        rk_session_destroy(s);
        rk_model_destroy(m);
        unlink(path);
    }
}

/* Every shape loads at its full width (one layer, small vocab, q4_0). */
Test(synth, shapes_all_load) {
    for (const rk_synth_shape *sh = rk_synth_shapes(); sh->name; sh++) {
        size_t len = 0;
        void *bytes = build(sh->name, "q4_0", 320, 1, 2, &len);
        char path[512];
        write_tmp(bytes, len, path, sizeof path);
        free(bytes);
        rk_model *m = NULL;
        rk_err err = {0};
        cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s: %s", sh->name, err.msg);
        const rk_hparams *hp = rk_model_hparams(m);
        cr_expect_str_eq(hp->arch_name, sh->arch);
        cr_expect(hp->n_embd == sh->n_embd && hp->n_head == sh->n_head && hp->n_head_kv == sh->n_head_kv &&
                      hp->head_dim == sh->head_dim && hp->n_ff == sh->n_ff && hp->n_ctx_train == sh->n_ctx &&
                      hp->rope_base == sh->rope_base && hp->rms_eps == sh->rms_eps && hp->tied_output,
                  "%s: hparams differ from the shape", sh->name);
        rk_model_destroy(m);
        unlink(path);
    }
}

Test(synth, reproducible_from_the_seed) {
    size_t a_len, b_len, c_len;
    void *a = build("qwen3-0.6b", "q4_k", 320, 1, 5, &a_len);
    void *b = build("qwen3-0.6b", "q4_k", 320, 1, 5, &b_len);
    void *c = build("qwen3-0.6b", "q4_k", 320, 1, 6, &c_len);
    cr_assert_eq(a_len, b_len);
    cr_expect(memcmp(a, b, a_len) == 0, "same seed, different bytes");
    cr_assert_eq(a_len, c_len);
    cr_expect(memcmp(a, c, a_len) != 0, "another seed, same bytes");
    free(a), free(b), free(c);
}

Test(synth, bad_parameters_are_named) {
    struct {
        rk_synth_params p;
        const char *msg;
    } bad[] = {
        {{"gpt-5", "f32", 0, 1, 1}, "unknown shape \"gpt-5\""},
        {{NULL, "f32", 0, 1, 1}, "unknown shape"},
        {{"qwen3-0.6b", "q5_0", 0, 1, 1}, "unknown type \"q5_0\""},
        {{"qwen3-0.6b", "f32", 100, 1, 1}, "vocab 100 out of range"},
        {{"qwen3-0.6b", "f32", 0, 29, 1}, "layers 29 out of range (1 .. 28 for qwen3-0.6b)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *bytes = NULL;
        size_t len = 0;
        rk_err err = {0};
        cr_expect_eq(rk_synth_build(&bad[i].p, &bytes, &len, &err), RK_E_INVALID_ARG, "case %zu", i);
        cr_expect(strstr(err.msg, bad[i].msg), "case %zu: %s", i, err.msg);
        cr_expect_null(bytes);
    }
    rk_synth_params ok = {"smollm2-135m", "q8_0", 320, 1, 1};
    rk_err err = {0};
    cr_expect_eq(rk_synth_write(&ok, "/nonexistent-dir/x.gguf", &err), RK_E_IO);
    cr_expect(strstr(err.msg, "/nonexistent-dir/x.gguf"), "%s", err.msg);
}
