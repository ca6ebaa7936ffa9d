/* Prefill progress in cost-weighted tokens (runtime/prefill/cost.c, prefill.c) on a
 * generated stories260K-shaped model (5 layers): the (done, total) pairs a session reports
 * are monotone, total is the call's tokens throughout, and the last is (total, total);
 * a layer-major fill (layers 0..1 over every row first, then layers 2..4 where the bulk
 * rows are mostly filled: K and V only) reports past 2/5 of its tokens when its first
 * phase ends, since that phase is most of the work; an exact prefill reports fewer tokens
 * than it has read half-way, since its later rows attend to more. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "rk.h"
#include "rk_experimental.h"
#include "rt_shared.h"
#include "tb.h"

typedef struct rec {
    int64_t done[256], total[256];
    int n;
} rec;

static bool on_progress(void *ud, int64_t done, int64_t total) {
    rec *r = ud;
    if (r->n < 256) r->done[r->n] = done, r->total[r->n] = total, r->n++;
    return true;
}

static void run(const rk_fill_params *fp, size_t n, rec *r) {
    rk_model *m = rt_stories_like(3);
    int32_t *ids = rt_random_ids(m, n, 5);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = 32, sp.n_threads = 1;
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    if (fp) cr_assert_eq(rk_session_set_fill(s, fp, &e), RK_OK, "%s", e.msg);
    rk_session_set_progress(s, on_progress, r);
    cr_assert_eq(rk_session_eval(s, ids, n, NULL, false, &e), RK_OK, "%s", e.msg);
    rk_session_destroy(s);
    free(ids);
    rk_model_destroy(m);
}

static void check_monotone(const rec *r, int64_t n) {
    cr_assert(r->n > 0);
    for (int i = 0; i < r->n; i++) {
        cr_expect_eq(r->total[i], n, "call %d: total %lld", i, (long long)r->total[i]);
        cr_expect(r->done[i] >= 0 && r->done[i] <= n, "call %d: done %lld", i, (long long)r->done[i]);
        if (i)
            cr_expect(r->done[i] >= r->done[i - 1], "call %d: %lld after %lld", i, (long long)r->done[i],
                      (long long)r->done[i - 1]);
        if (i < r->n - 1) cr_expect(r->done[i] < n, "call %d reports the end early", i);
    }
    cr_expect_eq(r->done[r->n - 1], n, "the last call reports %lld of %lld", (long long)r->done[r->n - 1],
                 (long long)n);
}

Test(progress_cost, layer_major_fill_counts_its_first_phase_as_the_bulk_of_the_work) {
    const size_t n = 480; /* tail 96: bulk rows [0, 384), 12 + 3 chunks of 32 per phase */
    rk_fill_params f = {.mode = RK_FILL_IDENTITY, .tail = 96, .split = 2, .keep_share = 0.1f, .group = 8};
    rk_err e = {0};
    cr_assert_eq(rk_fill_params_set(&f, "layer_major", NULL, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_fill_params_set(&f, "question_aware", NULL, &e), RK_OK, "%s", e.msg);
    rec *r = calloc(1, sizeof *r);
    run(&f, n, r);
    cr_assert_eq(r->n, 30, "two phases of 15 chunks: %d calls", r->n);
    check_monotone(r, (int64_t)n);
    /* rows x layers would say 2/5 after the first phase */
    const double first = (double)r->done[14] / (double)n;
    cr_expect(first > 0.5 && first < 1.0, "after layers 0..1 of every row: %.3f of the tokens", first);
    free(r);
}

Test(progress_cost, chunk_major_fill_and_exact_prefill) {
    const size_t n = 480;
    rk_fill_params f = {.mode = RK_FILL_IDENTITY, .tail = 96, .split = 2};
    rec *r = calloc(1, sizeof *r);
    run(&f, n, r);
    cr_assert_eq(r->n, 15, "%d calls", r->n);
    check_monotone(r, (int64_t)n);
    free(r);
    r = calloc(1, sizeof *r);
    run(NULL, n, r);
    cr_assert_eq(r->n, 15, "%d calls", r->n);
    check_monotone(r, (int64_t)n);
    /* 8 chunks (256 of 480 rows) read: the later rows cost more, so less than 256 reported */
    cr_expect(r->done[7] < 256 && r->done[7] > 128, "half-way: %lld of 480", (long long)r->done[7]);
    free(r);
}
