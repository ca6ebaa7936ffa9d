/* Memory tiers (runtime/kv/kv_tier.c): f16 / f32 / q8 caches under a byte budget give
 * bit-identical logits to the all-in-memory caches (prefill, decode, truncate into spilled
 * chunks, export / import both ways, kv_rows), keep at most the budget in memory, and count
 * what they read back; io_uring and the thread pool alike (the scale test
 * item 5 is test_tier_scale.c), and the document KV cache at the library level (save, load, a bad entry, list, remove, gc). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kv_impl.h"
#include "rk.h"
#include "rk_ext.h"
#include "session_impl.h"
#include "tb.h"

typedef struct tiny {
    char path[512];
    rk_model *m;
    int32_t nv;
} tiny;

static void tiny_open(tiny *t, const tb_tiny_spec *spec) {
    cr_assert(tb_tiny_model(spec, t->path, sizeof t->path), "%s", t->path);
    rk_err e = {0};
    cr_assert_eq(rk_model_load(t->path, &t->m, &e), RK_OK, "%s", e.msg);
    t->nv = rk_model_hparams(t->m)->n_vocab;
}

static void tiny_close(tiny *t) {
    rk_model_destroy(t->m);
    unlink(t->path);
}

static rk_session *mk(const tiny *t, const char *kind, int n_ctx, int n_batch, uint64_t budget, int backend) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = n_ctx;
    sp.n_threads = 2;
    sp.n_batch = n_batch;
    rk_err e = {0};
    cr_assert_eq(rk_kv_params_parse(kind, &sp.kv, &e), RK_OK, "%s", e.msg);
    sp.kv.budget = budget;
    sp.kv.spill_backend = backend;
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(t->m, &sp, &s, &e), RK_OK, "%s: %s", kind, e.msg);
    return s;
}

static int32_t *rand_ids(size_t n, int32_t nv, uint64_t seed) {
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)(nv - 8)) + 4;
    return ids;
}

/* Prefill n ids in one call (its last logits), then n_dec steps: (n_dec + 1) rows. */
static float *trace(rk_session *s, const int32_t *ids, size_t n, int n_dec, int32_t nv) {
    float *lg = malloc((size_t)(n_dec + 1) * (size_t)nv * sizeof(float));
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_OK, "%s", e.msg);
    for (int i = 0; i < n_dec; i++)
        cr_assert_eq(rk_session_eval(s, &ids[n + (size_t)i], 1, lg + (size_t)(i + 1) * (size_t)nv, false, &e), RK_OK,
                     "%s", e.msg);
    return lg;
}

static const tb_tiny_spec SMALL = {
    .arch = TB_ARCH_LLAMA, .n_layer = 2, .n_embd = 64, .n_head = 4, .n_head_kv = 2, .n_ctx_train = 4096, .seed = 7};

static void equal_to_memory(const char *kind, int backend) {
    tiny t;
    tiny_open(&t, &SMALL);
    const size_t n = 3000;
    const int n_dec = 6;
    int32_t *ids = rand_ids(n + (size_t)n_dec, t.nv, 11);
    rk_session *a = mk(&t, kind, 4096, 256, 0, 0);
    /* the hot chunks (sink + window: 3 of 256 rows per layer) and 256 rows more: most spill */
    const uint64_t budget = 4 * 256 * rk_session_kv_bytes_per_token(a);
    rk_session *b = mk(&t, kind, 4096, 256, budget, backend);
    float *la = trace(a, ids, n, n_dec, t.nv), *lb = trace(b, ids, n, n_dec, t.nv);
    cr_expect(!memcmp(la, lb, (size_t)(n_dec + 1) * (size_t)t.nv * sizeof(float)),
              "%s: logits under the budget equal the in-memory cache's bit for bit", kind);
    rk_kv_tier_stats st;
    rk_session_kv_tier_stats(b, &st);
    cr_assert(st.on);
    cr_expect_leq(st.resident_bytes, budget, "%s: %llu bytes resident over the budget %llu", kind,
                  (unsigned long long)st.resident_bytes, (unsigned long long)budget);
    /* the most rows held at once, over the prefill's 12 batches and decode: within the budget
     * (a chunk waiting for its write counts as held) */
    cr_log_info("%s: peak %llu budget %llu", kind, (unsigned long long)st.resident_peak, (unsigned long long)budget);
    cr_expect_leq(st.resident_peak, budget, "%s: peak %llu bytes held over the budget %llu", kind,
                  (unsigned long long)st.resident_peak, (unsigned long long)budget);
    cr_expect_geq(st.resident_peak, st.resident_bytes);
    rk_kv_bytes kb;
    rk_session_kv_bytes(a, &kb);
    cr_expect_geq(st.spilled_bytes, kb.total / 2, "%s: most rows spilled (%llu of %llu)", kind,
                  (unsigned long long)st.spilled_bytes, (unsigned long long)kb.total);
    cr_expect(st.misses > 0 && st.hits > 0 && st.bytes_read > 0 && st.prefetched > 0,
              "%s: hits %llu misses %llu read %llu prefetched %llu", kind, (unsigned long long)st.hits,
              (unsigned long long)st.misses, (unsigned long long)st.bytes_read, (unsigned long long)st.prefetched);
    cr_expect_eq(st.spill_errors, 0);
    cr_expect_str_eq(st.backend, backend == 2 ? "threads" : st.backend);
    rk_kv_tier_stats none;
    rk_session_kv_tier_stats(a, &none);
    cr_expect(!none.on && none.misses == 0);

    /* kv_rows across spilled chunks: what attention sees, the same as in memory */
    const int64_t r0 = 300, nr = 900;
    const int kvd = rk_model_hparams(t.m)->n_head_kv * rk_model_hparams(t.m)->head_dim;
    float *ra = malloc((size_t)(nr * kvd) * sizeof(float)), *rb = malloc((size_t)(nr * kvd) * sizeof(float));
    rk_err e = {0};
    for (int l = 0; l < 2; l++)
        for (int vals = 0; vals < 2; vals++) {
            cr_assert_eq(rk_session_kv_rows(a, l, vals, true, r0, nr, ra, &e), RK_OK, "%s", e.msg);
            cr_assert_eq(rk_session_kv_rows(b, l, vals, true, r0, nr, rb, &e), RK_OK, "%s", e.msg);
            cr_expect(!memcmp(ra, rb, (size_t)(nr * kvd) * sizeof(float)), "%s: rows of layer %d", kind, l);
        }

    /* truncate into the spilled part, then other tokens: still the same */
    cr_assert_eq(rk_session_truncate(a, 1100, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_truncate(b, 1100, &e), RK_OK, "%s", e.msg);
    int32_t *other = rand_ids(700, t.nv, 99);
    free(la), free(lb);
    la = trace(a, other, 690, 4, t.nv);
    lb = trace(b, other, 690, 4, t.nv);
    cr_expect(!memcmp(la, lb, 5 * (size_t)t.nv * sizeof(float)), "%s: after truncate", kind);

    /* export from the tiered cache into a plain one, and the other way */
    void *blk = NULL;
    size_t len = 0;
    cr_assert_eq(rk_session_kv_export(b, 0, rk_session_n_past(b), &blk, &len, &e), RK_OK, "%s", e.msg);
    rk_session *c = mk(&t, kind, 4096, 256, 0, 0), *d = mk(&t, kind, 4096, 256, budget, backend);
    cr_assert_eq(rk_session_kv_import(c, blk, len, &e), RK_OK, "%s", e.msg);
    free(blk);
    cr_assert_eq(rk_session_kv_export(a, 0, rk_session_n_past(a), &blk, &len, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_kv_import(d, blk, len, &e), RK_OK, "%s", e.msg);
    free(blk);
    float lc[4096], ld[4096];
    cr_assert_leq(t.nv, 4096);
    const int32_t nxt = other[694];
    cr_assert_eq(rk_session_eval(c, &nxt, 1, lc, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(d, &nxt, 1, ld, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(a, &nxt, 1, la, false, &e), RK_OK, "%s", e.msg);
    cr_expect(!memcmp(la, lc, (size_t)t.nv * sizeof(float)), "%s: tier -> plain block", kind);
    cr_expect(!memcmp(la, ld, (size_t)t.nv * sizeof(float)), "%s: plain -> tier block", kind);
    rk_session_kv_tier_stats(d, &st);
    cr_expect_gt(st.spilled_bytes, 0, "%s: an imported block spills too", kind);

    rk_session_reset(b);
    rk_session_kv_tier_stats(b, &st);
    cr_expect(st.resident_bytes == 0 && st.spilled_bytes == 0, "%s: reset frees both tiers", kind);
    free(la), free(lb), free(ra), free(rb), free(other), free(ids);
    rk_session_destroy(a), rk_session_destroy(b), rk_session_destroy(c), rk_session_destroy(d);
    tiny_close(&t);
}

Test(tiers, f16_equals_memory) { equal_to_memory("f16", 0); }
Test(tiers, f32_equals_memory) { equal_to_memory("f32", 0); }
Test(tiers, q8_equals_memory) { equal_to_memory("q8", 0); }
Test(tiers, f16_thread_pool_equals_memory) { equal_to_memory("f16", 2); }

/* LowRAM under a budget (runtime/kv/lowram_tier.c): the pages of cold coefficient and
 * residual rows go to the store and come back in place when decode selects their chunks,
 * so the logits equal the all-in-memory lowram run's bit for bit. 4 layers (2 groups),
 * head_dim 64, 3000 tokens: ~90 chunks of 32 rows per (layer, head), 16 selected. */
static const tb_tiny_spec LR = {
    .arch = TB_ARCH_LLAMA, .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 2, .n_ctx_train = 4096, .seed = 9};

/* No Criterion .timeout here or below: meson's per-binary timeout (tests/runtime/meson.build) bounds a
 * hang, and two Criterion timeouts in one binary leak 48 bytes inside Criterion (LeakSanitizer). */
/* the parameters this test's shares were written for (older defaults:
 * with ratio 6 and int4 residuals the fixed parts outweigh this tiny model's moving rows) */
#define LR_OLD "lowram:ratio=4,chunk=32,budget=512,rtype=int8"
Test(tiers, lowram_budget_equals_memory) {
    tiny t;
    tiny_open(&t, &LR);
    const size_t n = 3000;
    const int n_dec = 12;
    int32_t *ids = rand_ids(n + (size_t)n_dec + 8, t.nv, 5);
    rk_session *a = mk(&t, LR_OLD, 4096, 512, 0, 0);
    float *la = trace(a, ids, n, n_dec, t.nv);
    rk_kv_bytes kb;
    rk_session_kv_bytes(a, &kb);
    cr_assert_gt(kb.coef + kb.residuals, kb.total / 3, "coefficients and residuals are most of the state");
    /* the budget bounds the movable rows (the default): a quarter of them; the per-step
     * state stays resident on top and is reported as fixed_bytes */
    const uint64_t budget = (kb.coef + kb.residuals) / 4;
    rk_session *b = mk(&t, LR_OLD, 4096, 512, budget, 0);
    float *lb = trace(b, ids, n, n_dec, t.nv);
    cr_expect(!memcmp(la, lb, (size_t)(n_dec + 1) * (size_t)t.nv * sizeof(float)),
              "lowram: logits under the budget equal the in-memory run's bit for bit");
    rk_kv_tier_stats st;
    rk_session_kv_tier_stats(b, &st);
    cr_assert(st.on);
    /* fixed: everything but the complete chunks' coefficient / residual pages (a chunk of
     * 32 rows is not page-aligned: up to a page per array more is fixed) */
    cr_expect_geq(st.fixed_bytes, kb.total - kb.coef - kb.residuals, "fixed %llu", (unsigned long long)st.fixed_bytes);
    cr_expect_leq(st.fixed_bytes, kb.total - kb.coef - kb.residuals + (uint64_t)(2 + 4 * 2) * 3 * 4096 + 4096 * 4,
                  "fixed %llu of %llu", (unsigned long long)st.fixed_bytes, (unsigned long long)kb.total);
    /* the read-ahead may fill the budget plus the release slack (max(budget / 8, 16 pages)) */
    const uint64_t slack = budget / 8 > 16 * 4096 ? budget / 8 : 16 * 4096;
    cr_expect_leq(st.resident_bytes, st.fixed_bytes + budget + slack,
                  "%llu bytes resident over fixed %llu + budget %llu + slack %llu",
                  (unsigned long long)st.resident_bytes, (unsigned long long)st.fixed_bytes, (unsigned long long)budget,
                  (unsigned long long)slack);
    cr_expect_geq(st.budget_peak, st.resident_bytes - st.fixed_bytes, "peak of the movable rows");
    {
        /* budget_whole: the same budget share over the whole state (the fixed part counts) */
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = 4096, sp.n_threads = 2, sp.n_batch = 512;
        rk_err e0 = {0};
        cr_assert_eq(rk_kv_params_parse(LR_OLD, &sp.kv, &e0), RK_OK, "%s", e0.msg);
        const uint64_t bw = kb.total - (kb.coef + kb.residuals) * 3 / 4;
        sp.kv.budget = bw, sp.kv.budget_whole = true;
        rk_session *w = NULL;
        cr_assert_eq(rk_session_create(t.m, &sp, &w, &e0), RK_OK, "%s", e0.msg);
        float *lw = trace(w, ids, n, n_dec, t.nv);
        cr_expect(!memcmp(la, lw, (size_t)(n_dec + 1) * (size_t)t.nv * sizeof(float)), "budget_whole: same logits");
        rk_kv_tier_stats sw;
        rk_session_kv_tier_stats(w, &sw);
        /* the movable share is the budget less the fixed state; the read-ahead may fill the
         * release slack above it as in the default accounting */
        const uint64_t cap_w = bw > sw.fixed_bytes ? bw - sw.fixed_bytes : 0;
        const uint64_t slack_w = cap_w / 8 > 16 * 4096 ? cap_w / 8 : 16 * 4096;
        cr_expect_leq(sw.resident_bytes, bw + slack_w, "whole: %llu resident over %llu + slack %llu",
                      (unsigned long long)sw.resident_bytes, (unsigned long long)bw, (unsigned long long)slack_w);
        cr_expect_geq(sw.spilled_bytes, (kb.coef + kb.residuals) / 2);
        free(lw);
        rk_session_destroy(w);
    }
    cr_expect_geq(st.spilled_bytes, (kb.coef + kb.residuals) / 2,
                  "most coefficient / residual bytes out (%llu of %llu)", (unsigned long long)st.spilled_bytes,
                  (unsigned long long)(kb.coef + kb.residuals));
    cr_expect(st.misses > 0 && st.hits > 0 && st.bytes_read > 0, "hits %llu misses %llu read %llu",
              (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.bytes_read);
    cr_expect(st.sel_chunks > 0 && st.sel_repeat <= st.sel_chunks, "selection %llu, repeated %llu",
              (unsigned long long)st.sel_chunks, (unsigned long long)st.sel_repeat);
    cr_expect_eq(st.spill_errors, 0);
    cr_log_info("lowram tier: budget %llu of %llu, spilled %llu, hits %llu misses %llu (read ahead %llu), "
                "selection repeated %.1f%%, stall %.3f s",
                (unsigned long long)budget, (unsigned long long)kb.total, (unsigned long long)st.spilled_bytes,
                (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.prefetched,
                100.0 * (double)st.sel_repeat / (double)(st.sel_chunks ? st.sel_chunks : 1), st.stall_s);

    /* kv_rows over released spans: what attention sees, the same as in memory */
    const int64_t r0 = 200, nr = 1500;
    const int kvd = rk_model_hparams(t.m)->n_head_kv * rk_model_hparams(t.m)->head_dim;
    float *ra = malloc((size_t)(nr * kvd) * sizeof(float)), *rb = malloc((size_t)(nr * kvd) * sizeof(float));
    rk_err e = {0};
    for (int vals = 0; vals < 2; vals++) {
        cr_assert_eq(rk_session_kv_rows(a, 3, vals, true, r0, nr, ra, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_session_kv_rows(b, 3, vals, true, r0, nr, rb, &e), RK_OK, "%s", e.msg);
        cr_expect(!memcmp(ra, rb, (size_t)(nr * kvd) * sizeof(float)), "rows (values %d)", vals);
    }
    /* an export of the budgeted session imports into a plain one: the same next logits */
    void *blk = NULL;
    size_t len = 0;
    cr_assert_eq(rk_session_kv_export(b, 0, rk_session_n_past(b), &blk, &len, &e), RK_OK, "%s", e.msg);
    rk_session *c = mk(&t, LR_OLD, 4096, 512, 0, 0), *d = mk(&t, LR_OLD, 4096, 512, budget, 0);
    cr_assert_eq(rk_session_kv_import(c, blk, len, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_kv_import(d, blk, len, &e), RK_OK, "%s", e.msg);
    free(blk);
    float *l3 = malloc(4 * (size_t)t.nv * sizeof(float));
    const int32_t nxt = ids[n + (size_t)n_dec];
    cr_assert_eq(rk_session_eval(a, &nxt, 1, l3, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, &nxt, 1, l3 + t.nv, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(c, &nxt, 1, l3 + 2 * (size_t)t.nv, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(d, &nxt, 1, l3 + 3 * (size_t)t.nv, false, &e), RK_OK, "%s", e.msg);
    for (int k = 1; k < 4; k++)
        cr_expect(!memcmp(l3, l3 + (size_t)k * t.nv, (size_t)t.nv * sizeof(float)), "session %d after export", k);
    /* truncate into released rows, then other tokens: still the same */
    cr_assert_eq(rk_session_truncate(a, 1700, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_truncate(b, 1700, &e), RK_OK, "%s", e.msg);
    free(la), free(lb);
    la = trace(a, ids + 3, 400, 3, t.nv);
    lb = trace(b, ids + 3, 400, 3, t.nv);
    cr_expect(!memcmp(la, lb, 4 * (size_t)t.nv * sizeof(float)), "after truncate");
    rk_session_reset(b);
    rk_session_kv_tier_stats(b, &st);
    cr_expect_eq(st.spilled_bytes, 0, "reset forgets the spilled rows");
    free(la), free(lb), free(ra), free(rb), free(l3), free(ids);
    rk_session_destroy(a), rk_session_destroy(b), rk_session_destroy(c), rk_session_destroy(d);
    tiny_close(&t);
}

/* Fine chunks with the two-level selection (chunk=8,coarse=4; decode attends runs of
 * consecutive chunks as one block): the chunks a step selects are made resident before they are
 * read, runs included, so the logits under a budget equal the in-memory run's bit for bit. */
Test(tiers, lowram_fine_chunks_budget_equals_memory) {
    tiny t;
    tiny_open(&t, &LR);
    const size_t n = 3000;
    const int n_dec = 8;
    int32_t *ids = rand_ids(n + (size_t)n_dec + 8, t.nv, 7);
    rk_session *a = mk(&t, "lowram:chunk=8,coarse=4", 4096, 512, 0, 0);
    float *la = trace(a, ids, n, n_dec, t.nv);
    rk_kv_bytes kb;
    rk_session_kv_bytes(a, &kb);
    rk_session *b = mk(&t, "lowram:chunk=8,coarse=4", 4096, 512, (kb.coef + kb.residuals) / 4, 0);
    float *lb = trace(b, ids, n, n_dec, t.nv);
    cr_expect(!memcmp(la, lb, (size_t)(n_dec + 1) * (size_t)t.nv * sizeof(float)),
              "lowram chunk=8,coarse=4: logits under the budget equal the in-memory run's bit for bit");
    rk_kv_tier_stats st;
    rk_session_kv_tier_stats(b, &st);
    cr_expect(st.on && st.spilled_bytes > 0, "nothing spilled");
    free(la), free(lb), free(ids);
    rk_session_destroy(a), rk_session_destroy(b);
    tiny_close(&t);
}

Test(tiers, lowram_budget_with_eviction_refused_spill_dir_checked) {
    tiny t;
    tiny_open(&t, &SMALL);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 1024;
    rk_err e = {0};
    cr_assert_eq(rk_kv_params_parse("lowram:evict=0.5", &sp.kv, &e), RK_OK, "%s", e.msg);
    sp.kv.budget = 1 << 20;
    rk_session *s = NULL;
    cr_expect_eq(rk_session_create(t.m, &sp, &s, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "evict"), "%s", e.msg);
    sp.kv.lowram.evict = 0;
    sp.kv.spill_dir = "/nonexistent-dir";
    cr_expect_eq(rk_session_create(t.m, &sp, &s, &e), RK_E_IO);
    cr_expect(strstr(e.msg, "/nonexistent-dir"), "%s", e.msg);
    sp.kv.kind = RK_KV_F16;
    cr_expect_eq(rk_session_create(t.m, &sp, &s, &e), RK_E_IO);
    cr_expect(strstr(e.msg, "/nonexistent-dir"), "%s", e.msg);
    tiny_close(&t);
}

/* ---- the document KV cache (runtime/cache), at the library level (the CLI's end-to-end
 * tests are tests/cli/test_cache.c): save, load into a fresh session, the same logits;
 * a bad entry is refused, removed, and the session left empty; list, remove, gc. */
#include "rk_cache.h"

Test(doc_cache, save_load_same_logits_bad_entry_removed_list_gc) {
    tiny t;
    tiny_open(&t, &SMALL);
    char dir[512];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-dc"), "%s", dir);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/a/b/kv", dir); /* missing parents are made */
    rk_doc_cache_params p = rk_doc_cache_params_default();
    p.dir = sub;
    rk_doc_cache *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_doc_cache_open(&p, &c, &e), RK_OK, "%s", e.msg);
    const size_t n = 700;
    int32_t *ids = rand_ids(n + 1, t.nv, 5);
    rk_kv_params kvp = rk_kv_params_default();
    char key[65], key2[65];
    rk_doc_cache_key(t.m, &kvp, "fill=off", ids, n, key);
    rk_doc_cache_key(t.m, &kvp, "fill=off", ids, n - 1, key2);
    cr_expect(strlen(key) == 64 && strcmp(key, key2), "the key depends on the tokens");
    rk_doc_cache_key(t.m, &kvp, "fill=speed", ids, n, key2);
    cr_expect(strcmp(key, key2), "and on the extra");
    rk_session *a = mk(&t, "f16", 1024, 256, 0, 0), *b = mk(&t, "f16", 1024, 256, 0, 0);
    cr_assert_eq(rk_session_eval(a, ids, n, NULL, false, &e), RK_OK, "%s", e.msg);
    int64_t got = 0;
    cr_expect_eq(rk_doc_cache_load(c, key, b, &got, &e), RK_E_NOT_FOUND);
    cr_assert_eq(rk_doc_cache_save(c, key, t.m, &kvp, a, (int64_t)n, "doc.txt", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_cache_load(c, key, b, &got, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(got, (int64_t)n);
    float la[4096], lb[4096];
    cr_assert_leq(t.nv, 4096);
    cr_assert_eq(rk_session_eval(a, &ids[n], 1, la, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, &ids[n], 1, lb, false, &e), RK_OK, "%s", e.msg);
    cr_expect(!memcmp(la, lb, (size_t)t.nv * sizeof(float)), "loaded KV gives the same logits");
    rk_doc_cache_entry *v = NULL;
    size_t nv = 0;
    cr_assert_eq(rk_doc_cache_list(c, &v, &nv, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(nv, 1);
    cr_expect(!strcmp(v[0].key, key) && v[0].n_tokens == (int64_t)n && !strcmp(v[0].label, "doc.txt") &&
              !strcmp(v[0].kv, "f16") && !v[0].bad && v[0].raw_bytes > 0);
    free(v);
    void *blk = NULL;
    size_t len = 0;
    cr_assert_eq(rk_doc_cache_read(c, key, &blk, &len, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(len, (size_t)n * rk_session_kv_bytes_per_token(a) + 128 + 24 + 4 * n, "an RKKV block of %zu rows", n);
    free(blk);
    /* a corrupt byte in the file: refused, removed, the session left empty */
    char path[800];
    snprintf(path, sizeof path, "%s/%s.rkkv", sub, key);
    cr_assert(tb_flip_byte(path, 4096 + 64 + 100, 0x40));
    cr_expect_eq(rk_doc_cache_load(c, key, b, &got, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "corrupt") && strstr(e.msg, "removed"), "%s", e.msg);
    cr_expect_eq(rk_session_n_past(b), 0);
    cr_expect(access(path, F_OK) != 0, "the bad entry is removed");
    /* remove and gc */
    cr_assert_eq(rk_doc_cache_save(c, key, t.m, &kvp, a, (int64_t)n, "doc.txt", &e), RK_OK, "%s", e.msg);
    size_t nr = 0;
    uint64_t left = 0;
    cr_assert_eq(rk_doc_cache_gc(c, 1, &nr, &left, &e), RK_OK, "%s", e.msg);
    cr_expect(nr == 1 && left == 0, "gc to 1 byte removes the entry (%zu, %llu)", nr, (unsigned long long)left);
    cr_assert_eq(rk_doc_cache_save(c, key, t.m, &kvp, a, (int64_t)n, "doc.txt", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_cache_remove(c, "", &nr, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(nr, 1);
    cr_expect_eq(rk_doc_cache_load(c, "not-a-key", b, &got, &e), RK_E_INVALID_ARG);
    rk_doc_cache_close(c);
    rk_session_destroy(a), rk_session_destroy(b);
    free(ids);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert(system(cmd) == 0);
    tiny_close(&t);
}

/* An entry of several 4 MiB pieces (the save streams the block and writes its first piece,
 * which holds the block's checksum, last; the load streams it back into place): the file
 * holds the block rk_session_kv_export makes, byte for byte; a loaded session gives the same
 * logits; a corrupt byte in a middle piece is refused and removed, the session left empty. */
static void several_pieces(const char *kind) {
    static const tb_tiny_spec WIDE = {.arch = TB_ARCH_LLAMA,
                                      .n_layer = 4,
                                      .n_embd = 256,
                                      .n_head = 8,
                                      .n_head_kv = 8,
                                      .n_ctx_train = 8192,
                                      .seed = 9};
    tiny t;
    tiny_open(&t, &WIDE);
    char dir[512];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-dc"), "%s", dir);
    rk_doc_cache_params p = rk_doc_cache_params_default();
    p.dir = dir;
    rk_doc_cache *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_doc_cache_open(&p, &c, &e), RK_OK, "%s", e.msg);
    rk_session *a = mk(&t, kind, 8192, 512, 0, 0), *b = mk(&t, kind, 8192, 512, 0, 0);
    const size_t n = (size_t)((3 * (4u << 20)) / rk_session_kv_bytes_per_token(a) + 100); /* 4 pieces */
    int32_t *ids = rand_ids(n + 1, t.nv, 3);
    rk_kv_params kvp;
    cr_assert_eq(rk_kv_params_parse(kind, &kvp, &e), RK_OK, "%s", e.msg);
    char key[65];
    rk_doc_cache_key(t.m, &kvp, "fill=off", ids, n, key);
    cr_assert_eq(rk_session_eval(a, ids, n, NULL, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_cache_save(c, key, t.m, &kvp, a, (int64_t)n, "wide.txt", &e), RK_OK, "%s", e.msg);
    void *whole = NULL, *blk = NULL;
    size_t wn = 0, len = 0;
    cr_assert_eq(rk_session_kv_export(a, 0, (int64_t)n, &whole, &wn, &e), RK_OK, "%s", e.msg);
    cr_assert_gt(wn, 3u * (4u << 20), "%s: a block of %zu bytes spans 4 pieces", kind, wn);
    cr_assert_eq(rk_doc_cache_read(c, key, &blk, &len, &e), RK_OK, "%s", e.msg);
    cr_expect(len == wn && !memcmp(blk, whole, wn), "%s: the saved block differs from the exported one", kind);
    free(blk), free(whole);
    int64_t got = 0;
    cr_assert_eq(rk_doc_cache_load(c, key, b, &got, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(got, (int64_t)n);
    float *la = malloc((size_t)t.nv * sizeof(float)), *lb = malloc((size_t)t.nv * sizeof(float));
    cr_assert_eq(rk_session_eval(a, &ids[n], 1, la, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, &ids[n], 1, lb, false, &e), RK_OK, "%s", e.msg);
    cr_expect(!memcmp(la, lb, (size_t)t.nv * sizeof(float)), "%s: loaded KV gives the same logits", kind);
    free(la), free(lb);
    /* one byte of the stored bytes of the frame in the middle of the file */
    char path[800];
    snprintf(path, sizeof path, "%s/%s.rkkv", dir, key);
    cr_assert(tb_flip_byte(path, -1, 0x40));
    cr_expect_eq(rk_doc_cache_load(c, key, b, &got, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "removed"), "%s", e.msg);
    cr_expect_eq(rk_session_n_past(b), 0);
    cr_expect(access(path, F_OK) != 0, "the bad entry is removed");
    rk_doc_cache_close(c);
    rk_session_destroy(a), rk_session_destroy(b);
    free(ids);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert(system(cmd) == 0);
    tiny_close(&t);
}

Test(doc_cache, f32_entries_of_several_pieces_round_trip) { several_pieces("f32"); }
Test(doc_cache, q8_entries_of_several_pieces_round_trip) { several_pieces("q8"); }
