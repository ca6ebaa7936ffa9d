/* LowRAM's staged prefill: the eval that fits runs layer group by layer group, each group
 * fitted and its exact rows given back as soon as the prefill has finished it. The result
 * must be the chunk-major prefill's bit for bit; a cancelled staged eval must lose nothing.
 * stories260K (5 layers) from ../shared, one layer per group so that it has stages. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lowram_impl.h"
#include "rt_shared.h"
#include "session_impl.h"

/* what the progress callback saw while layer 0's group was fitted early */
typedef struct probe {
    rk_session *s;
    int64_t n_before;       /* rows before the staged eval */
    int seen_prefit;        /* callbacks with group 0 fitted early and the codec not yet fitted */
    int64_t resident_pages; /* of layer 0's released rows, resident at those callbacks (mincore) */
    int64_t checked_pages;
    int64_t cancel_at; /* cancel once this many tokens are done (0: never) */
} probe;

static bool watch(void *ud, int64_t done, int64_t total) {
    probe *pr = ud;
    (void)total;
    const rk_kv_codec *c = pr->s->kv->impl;
    if (c->g[0].prefit && !c->fitted) {
        pr->seen_prefit++;
        const long pg = sysconf(_SC_PAGESIZE);
        const int64_t n_past = pr->s->n_past + total, sink = c->p.n_sink;
        const int64_t lo = pr->n_before > sink ? pr->n_before : sink, hi = n_past - c->p.window;
        for (int v = 0; v < 2; v++) {
            uintptr_t a = (uintptr_t)lr_exact_ptr(c, 0, v, lo), b = (uintptr_t)lr_exact_ptr(c, 0, v, hi - 1) + c->xrow;
            a = (a + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1), b &= ~((uintptr_t)pg - 1);
            if (b <= a) continue;
            const size_t np = (b - a) / (size_t)pg;
            unsigned char *vec = malloc(np);
            cr_assert_eq(mincore((void *)a, b - a, vec), 0);
            for (size_t i = 0; i < np; i++) pr->resident_pages += vec[i] & 1;
            pr->checked_pages += (int64_t)np;
            free(vec);
        }
    }
    return !(pr->cancel_at > 0 && done >= pr->cancel_at);
}

/* decode logits of n_dec teacher-forced steps after the session's prompt */
static float *steps(rk_session *s, const int32_t *ids, int n_dec, int nv) {
    float *lg = malloc((size_t)n_dec * nv * sizeof(float));
    rk_err e = {0};
    for (int i = 0; i < n_dec; i++)
        cr_assert_eq(rk_session_eval(s, &ids[i], 1, lg + (size_t)i * nv, false, &e), RK_OK, "%s", e.msg);
    return lg;
}

/* Staged against chunk-major (nostage): the same exact rows are fitted, so the stored state
 * and every decode logit agree bit for bit; while the staged eval ran, group 0 was fitted
 * early and the pages of its compressed rows were not resident. A first eval of 100 rows
 * (below the fit) then one of 220 that fits: the 100 earlier rows are never given back. */
Test(lowram_stage, staged_fit_equals_chunk_major_and_gives_pages_back) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n0 = 100, n1 = 220, n_dec = 16;
    int32_t *ids = rt_random_ids(m, (size_t)(n0 + n1 + n_dec), 11);
    rk_session *a = rt_lowram_session(m, "group=1,window=64,chunk=16,start=0", 32);
    rk_session *b = rt_lowram_session(m, "group=1,window=64,chunk=16,start=0,nostage", 32);
    rk_err e = {0};
    probe pr = {.s = a, .n_before = n0};
    for (int k = 0; k < 2; k++) {
        rk_session *s = k ? b : a;
        cr_assert_eq(rk_session_eval(s, ids, n0, NULL, false, &e), RK_OK, "%s", e.msg);
        cr_assert(!((rk_kv_codec *)s->kv->impl)->fitted, "100 rows must stay below the fit");
        if (!k) rk_session_set_progress(a, watch, &pr);
        cr_assert_eq(rk_session_eval(s, ids + n0, n1, NULL, false, &e), RK_OK, "%s", e.msg);
        rk_session_set_progress(s, NULL, NULL);
        cr_assert(((rk_kv_codec *)s->kv->impl)->fitted);
    }
    float *la = steps(a, ids + n0 + n1, n_dec, nv), *lb = steps(b, ids + n0 + n1, n_dec, nv);
    const double d = rt_max_abs_diff(la, lb, (size_t)n_dec * nv);
    void *ba, *bb;
    size_t na, nb;
    cr_assert_eq(rk_session_kv_export(a, 0, a->n_past, &ba, &na, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_kv_export(b, 0, b->n_past, &bb, &nb, &e), RK_OK, "%s", e.msg);
    cr_log_info("staged: %d progress calls with group 0 fitted early, %lld of %lld released pages resident; "
                "logits differ by %g, states %zu / %zu bytes",
                pr.seen_prefit, (long long)pr.resident_pages, (long long)pr.checked_pages, d, na, nb);
    cr_expect_gt(pr.seen_prefit, 0, "group 0 was never fitted before the eval ended: not staged");
    cr_expect_gt(pr.checked_pages, 0);
    cr_expect_eq(pr.resident_pages, 0, "%lld released pages still resident", (long long)pr.resident_pages);
    cr_expect_eq(d, 0.0, "staged and chunk-major decode differ by %g", d);
    cr_expect(na == nb && memcmp(ba, bb, na) == 0, "the exported states differ");
    free(ba), free(bb), free(la), free(lb), free(ids);
    rk_session_destroy(a), rk_session_destroy(b);
    rk_model_destroy(m);
}

/* A staged eval cancelled after its first early fits loses nothing: the session is back at
 * its 100 rows (unfitted, exact), and the same eval again gives the logits of a session that
 * was never cancelled, bit for bit. */
Test(lowram_stage, cancelled_staged_eval_loses_nothing) {
    rk_model *m = rt_stories_like(1);
    const int nv = rk_model_hparams(m)->n_vocab, n0 = 100, n1 = 220, n_dec = 12;
    int32_t *ids = rt_random_ids(m, (size_t)(n0 + n1 + n_dec), 11);
    rk_session *a = rt_lowram_session(m, "group=1,window=64,chunk=16,start=0", 32);
    rk_session *b = rt_lowram_session(m, "group=1,window=64,chunk=16,start=0", 32);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(a, ids, n0, NULL, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, ids, n0, NULL, false, &e), RK_OK, "%s", e.msg);
    /* 5 layers x 220 rows of work; stage 1 (layers 0-1) ends at 2/5 of it */
    probe pr = {.s = a, .n_before = n0, .cancel_at = n1 * 3 / 5};
    rk_session_set_progress(a, watch, &pr);
    const rk_status st = rk_session_eval(a, ids + n0, n1, NULL, false, &e);
    rk_session_set_progress(a, NULL, NULL);
    cr_assert_eq(st, RK_E_CANCELLED, "%s: %s", rk_status_name(st), e.msg);
    const rk_kv_codec *ca = a->kv->impl;
    cr_expect_gt(pr.seen_prefit, 0, "cancelled before any early fit: the test cannot tell");
    cr_expect_eq(a->n_past, n0);
    cr_expect(!ca->fitted && !ca->g[0].prefit && ca->g[0].n_rows == 0, "early fits not undone");
    cr_assert_eq(rk_session_eval(a, ids + n0, n1, NULL, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(b, ids + n0, n1, NULL, false, &e), RK_OK, "%s", e.msg);
    float *la = steps(a, ids + n0 + n1, n_dec, nv), *lb = steps(b, ids + n0 + n1, n_dec, nv);
    const double d = rt_max_abs_diff(la, lb, (size_t)n_dec * nv);
    cr_expect_eq(d, 0.0, "after the cancelled eval the logits differ by %g", d);
    free(la), free(lb), free(ids);
    rk_session_destroy(a), rk_session_destroy(b);
    rk_model_destroy(m);
}
