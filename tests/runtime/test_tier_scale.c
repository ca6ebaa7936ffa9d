/* The scale test: a tiny generated model with n_ctx 131072 is prefilled
 * for real (every token through the model, in pieces of 4096 tokens: a chunked prefill,
 * each piece committed to the cache, as `ridgekv run` does with -b 4096) to RK_SCALE_TOKENS
 * tokens, once with the plain f16 cache all in memory and once under a budget of 1/32 of
 * its KV (most chunks spilled to the block store's file and read back by every piece's
 * attention), then 4 tokens are decoded: the logits of the last piece and of every decode
 * step are equal bit for bit (the tier hands the backend the same arrays).
 *
 * What it costs: causal attention over N tokens is N^2/2 scores per (layer, query head);
 * the model has 2 layers and one head of SCALE_D = 8 dims (n_embd 8), so at N = 100000
 * that is 1e10 scores per run. The CPU attention kernel does them at ~2 ns each on 2 idle
 * threads (3 ns with 16 dims), which is what bounds the run (docs/TIERS.md gives the
 * measured times). The release
 * build runs it at 100000 tokens (suite 'model', test 'runtime_tiers_scale'); the unit
 * suite (ASan in scripts/test.sh) runs the same code at 16384 tokens
 * ('runtime_tiers_scale_short'). RK_TIERS_SCALE_N=TOKENS overrides either by hand. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rk.h"
#include "tb.h"

#ifndef RK_SCALE_TOKENS
#define RK_SCALE_TOKENS 100000
#endif

enum { PIECE = 4096, N_DEC = 4, N_CTX = 131072 };
#ifndef SCALE_D
#define SCALE_D 8
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static rk_session *mk(rk_model *m, uint64_t budget) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = N_CTX;
    sp.n_threads = 2;
    sp.n_batch = PIECE;
    sp.kv.kind = RK_KV_F16;
    sp.kv.budget = budget;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

/* Prefills ids[0..n) in pieces of PIECE tokens (the logits of the last), then decodes
 * N_DEC tokens: (N_DEC + 1) rows of logits. */
static float *run(rk_session *s, const int32_t *ids, size_t n, int32_t nv, double *prefill_s) {
    float *lg = malloc((size_t)(N_DEC + 1) * (size_t)nv * sizeof(float));
    cr_assert(lg);
    rk_err e = {0};
    const double t0 = now_s();
    for (size_t p0 = 0; p0 < n; p0 += PIECE) {
        const size_t k = n - p0 < PIECE ? n - p0 : PIECE;
        cr_assert_eq(rk_session_eval(s, ids + p0, k, lg, false, &e), RK_OK, "piece at %zu: %s", p0, e.msg);
    }
    *prefill_s = now_s() - t0;
    for (int i = 0; i < N_DEC; i++)
        cr_assert_eq(rk_session_eval(s, &ids[n + (size_t)i], 1, lg + (size_t)(i + 1) * (size_t)nv, false, &e), RK_OK,
                     "%s", e.msg);
    return lg;
}

/* No Criterion .timeout: meson's per-binary timeout bounds a hang. */
Test(tiers_scale, real_prefill_mostly_on_disk_equal_logits) {
    const tb_tiny_spec spec = {.arch = TB_ARCH_LLAMA,
                               .n_layer = 2,
                               .n_embd = SCALE_D,
                               .n_head = 1,
                               .n_head_kv = 1,
                               .n_ff = 32,
                               .n_ctx_train = N_CTX,
                               .seed = 5};
    char path[512];
    cr_assert(tb_tiny_model(&spec, path, sizeof path), "%s", path);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(path, &m, &e), RK_OK, "%s", e.msg);
    const int32_t nv = rk_model_hparams(m)->n_vocab;
    const char *nenv = getenv("RK_TIERS_SCALE_N");
    size_t n = nenv && atol(nenv) > 0 ? (size_t)atol(nenv) : RK_SCALE_TOKENS;
    if (n > N_CTX - N_DEC) n = N_CTX - N_DEC;
    int32_t *ids = malloc((n + N_DEC) * sizeof *ids);
    uint64_t seed = 3;
    for (size_t i = 0; i < n + N_DEC; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)(nv - 8)) + 4;

    double pa = 0, pb = 0;
    const double t0 = now_s();
    rk_session *a = mk(m, 0);
    float *la = run(a, ids, n, nv, &pa);
    const double t1 = now_s();
    rk_kv_bytes kb;
    rk_session_kv_bytes(a, &kb);
    rk_session_destroy(a);
    /* the KV of n + N_DEC tokens: 2 layers x (K + V) x 16 dims x 2 bytes a token */
    cr_assert_geq(kb.total, (uint64_t)(n + N_DEC) * 2 * 2 * SCALE_D * 2, "KV %llu bytes", (unsigned long long)kb.total);
    const uint64_t budget = kb.total / 32;

    rk_session *b = mk(m, budget);
    float *lb = run(b, ids, n, nv, &pb);
    const double t2 = now_s();
    cr_expect_eq(rk_session_n_past(b), (int64_t)(n + N_DEC));
    cr_expect(!memcmp(la, lb, (size_t)(N_DEC + 1) * (size_t)nv * sizeof(float)),
              "%zu tokens prefilled: tiered logits equal the in-memory run's exactly", n);
    rk_kv_tier_stats st;
    rk_session_kv_tier_stats(b, &st);
    cr_assert(st.on);
    /* the hot chunks (the first of each layer and the last two, 256 rows of K and of V)
     * stay whatever the budget: at 16K tokens they are over 1/32 of the KV */
    const uint64_t hot = 3ull * 256 * 2 * 2 * SCALE_D * 2, cap = budget > hot ? budget : hot;
    cr_expect_leq(st.resident_bytes, cap, "resident %llu over the budget %llu (hot chunks %llu)",
                  (unsigned long long)st.resident_bytes, (unsigned long long)budget, (unsigned long long)hot);
    cr_expect_geq(st.spilled_bytes, kb.total * 9 / 10, "spilled %llu of %llu bytes",
                  (unsigned long long)st.spilled_bytes, (unsigned long long)kb.total);
    /* every piece's attention and every decode step read the spilled chunks back: at least
     * the decode steps' N_DEC full reads of what is out */
    cr_expect_geq(st.bytes_read, st.spilled_bytes * N_DEC, "read back %llu", (unsigned long long)st.bytes_read);
    cr_expect(st.misses > 0 && st.spill_errors == 0, "misses %llu, spill errors %llu", (unsigned long long)st.misses,
              (unsigned long long)st.spill_errors);
    cr_log_info("scale: %zu tokens prefilled in pieces of %d; in memory %.1f s (prefill %.1f s), tiered %.1f s "
                "(prefill %.1f s); KV %.1f MB, budget %.2f MB, resident %.2f MB, spilled %.1f MB, read back %.1f MB, "
                "hits %llu, misses %llu (read ahead %llu), stall %.2f s, %s",
                n, PIECE, t1 - t0, pa, t2 - t1, pb, kb.total / 1e6, budget / 1e6, st.resident_bytes / 1e6,
                st.spilled_bytes / 1e6, st.bytes_read / 1e6, (unsigned long long)st.hits, (unsigned long long)st.misses,
                (unsigned long long)st.prefetched, st.stall_s, st.backend);
    rk_session_destroy(b);
    free(la), free(lb), free(ids);
    rk_model_destroy(m);
    unlink(path);
}
