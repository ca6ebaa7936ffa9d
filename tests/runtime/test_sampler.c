/* The sampler (runtime/generate/sampler.c) against the math: greedy argmax with ties to the lowest
 * id, top-k = 1 as greedy, seeded reproducibility, empirical frequencies of a known softmax
 * within a binomial 5-sigma bound, the exact candidate sets of top-p and min-p, and the
 * repetition penalty as llama.cpp applies it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"
#include "rk_gen.h"
#include "tb.h"

static rk_sampler *make(rk_sampler_params p, int32_t n_vocab) {
    rk_sampler *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_sampler_create(&p, n_vocab, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

/* Plain sampling: temperature t, every filter off. */
static rk_sampler_params plain(float temp, uint64_t seed) {
    rk_sampler_params p = rk_sampler_params_default();
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.dry_multiplier = 0.0f;
    p.seed = seed;
    return p;
}

/* Draws n tokens from (a copy of) logits each time; counts per id. */
static void draw(rk_sampler *s, const float *logits, int32_t nv, int n, int *count) {
    float *buf = malloc((size_t)nv * sizeof *buf);
    memset(count, 0, (size_t)nv * sizeof *count);
    for (int i = 0; i < n; i++) {
        memcpy(buf, logits, (size_t)nv * sizeof *buf);
        int32_t id = rk_sampler_sample(s, buf, NULL, 0);
        cr_assert(id >= 0 && id < nv, "id %d", id);
        count[id]++;
    }
    free(buf);
}

/* count ~ Binomial(n, p): |count - n p| <= 5 sqrt(n p (1 - p)) (a false alarm once in
 * ~1.7 million per token); p = 0 must give exactly 0. */
static void expect_binomial(const int *count, const double *p, int32_t nv, int n, const char *what) {
    for (int32_t i = 0; i < nv; i++) {
        if (p[i] == 0.0) {
            cr_expect_eq(count[i], 0, "%s: token %d is excluded but drawn %d times", what, i, count[i]);
            continue;
        }
        const double mean = n * p[i], sd = sqrt(n * p[i] * (1.0 - p[i]));
        cr_expect(fabs(count[i] - mean) <= 5.0 * sd + 1e-9, "%s: token %d drawn %d times, expected %.1f +- %.1f", what,
                  i, count[i], mean, 5.0 * sd);
    }
}

/* softmax(logits / temp) restricted to keep[] (NULL: all), renormalised. */
static void softmax(const float *logits, int32_t nv, double temp, const bool *keep, double *p) {
    double mx = -INFINITY, z = 0;
    for (int32_t i = 0; i < nv; i++) mx = fmax(mx, logits[i]);
    for (int32_t i = 0; i < nv; i++) z += p[i] = keep && !keep[i] ? 0.0 : exp((logits[i] - mx) / temp);
    for (int32_t i = 0; i < nv; i++) p[i] /= z;
}

Test(sampler, greedy_is_argmax_with_ties_to_the_lowest_id) {
    rk_sampler *s = make(plain(0.0f, 1), 6);
    float a[6] = {1, 3, 3, 2, -5, 3};
    cr_expect_eq(rk_sampler_sample(s, a, NULL, 0), 1);
    float b[6] = {-1, -1, -1, -1, -1, -1};
    cr_expect_eq(rk_sampler_sample(s, b, NULL, 0), 0);
    float c[6] = {0, 0, 0, 0, 0, 1e-6f};
    cr_expect_eq(rk_sampler_sample(s, c, NULL, 0), 5);
    float d[6] = {-INFINITY, -3e38f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    cr_expect_eq(rk_sampler_sample(s, d, NULL, 0), 1);
    rk_sampler_destroy(s);
    /* temp < 0 is greedy too */
    s = make(plain(-1.0f, 1), 6);
    cr_expect_eq(rk_sampler_sample(s, a, NULL, 0), 1);
    rk_sampler_destroy(s);
}

Test(sampler, top_k_1_equals_greedy) {
    uint64_t rng = 3;
    const int32_t nv = 50;
    rk_sampler_params p = plain(1.5f, 9);
    p.top_k = 1;
    rk_sampler *s = make(p, nv), *g = make(plain(0.0f, 9), nv);
    float lg[50], cp[50];
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < nv; i++) lg[i] = 2.0f * tb_rand_normal(&rng);
        if (trial % 4 == 0) lg[7] = lg[30] = 50.0f; /* a tie at the top */
        memcpy(cp, lg, sizeof lg);
        int32_t want = rk_sampler_sample(g, cp, NULL, 0);
        memcpy(cp, lg, sizeof lg);
        cr_expect_eq(rk_sampler_sample(s, cp, NULL, 0), want, "trial %d", trial);
        if (trial % 4 == 0) cr_expect_eq(want, 7);
    }
    rk_sampler_destroy(s);
    rk_sampler_destroy(g);
}

Test(sampler, a_fixed_seed_repeats_the_sequence) {
    const int32_t nv = 16;
    float lg[16];
    uint64_t rng = 4;
    for (int i = 0; i < nv; i++) lg[i] = tb_rand_normal(&rng);
    int32_t seq[3][100];
    const uint64_t seeds[3] = {42, 42, 43};
    for (int r = 0; r < 3; r++) {
        rk_sampler_params p = rk_sampler_params_default(); /* temp, top-k, top-p, min-p all on */
        p.seed = seeds[r];
        rk_sampler *s = make(p, nv);
        float cp[16];
        for (int i = 0; i < 100; i++) {
            memcpy(cp, lg, sizeof lg);
            seq[r][i] = rk_sampler_sample(s, cp, NULL, 0);
        }
        rk_sampler_destroy(s);
    }
    cr_expect(memcmp(seq[0], seq[1], sizeof seq[0]) == 0, "same seed, different sequences");
    /* another seed: equal by chance with probability <= max_p^100 (negligible here) */
    cr_expect(memcmp(seq[0], seq[2], sizeof seq[0]) != 0, "seed ignored");
    int distinct = 0;
    for (int i = 1; i < 100; i++) distinct += seq[0][i] != seq[0][0];
    cr_expect(distinct > 0, "sampling at temp 0.8 never moved");
}

/* Over N draws each token's count is Binomial(N, softmax(l / T)_i). */
Test(sampler, frequencies_follow_the_softmax) {
    const float lg[6] = {1.0f, 0.0f, -1.0f, 0.5f, 2.0f, -3.0f};
    const float temps[3] = {1.0f, 0.5f, 2.0f};
    const int N = 40000;
    for (int t = 0; t < 3; t++) {
        rk_sampler *s = make(plain(temps[t], 100 + (uint64_t)t), 6);
        int count[6];
        double p[6];
        draw(s, lg, 6, N, count);
        softmax(lg, 6, temps[t], NULL, p);
        char what[32];
        snprintf(what, sizeof what, "temp %.1f", (double)temps[t]);
        expect_binomial(count, p, 6, N, what);
        rk_sampler_destroy(s);
    }
}

/* top-k keeps the k largest logits and renormalises among them. */
Test(sampler, top_k_keeps_exactly_the_k_largest) {
    const float lg[8] = {0.1f, 2.0f, -1.0f, 1.5f, 0.3f, 1.0f, -2.0f, 0.0f};
    rk_sampler_params p = plain(1.0f, 7);
    p.top_k = 3; /* ids 1, 3, 5 */
    rk_sampler *s = make(p, 8);
    int count[8];
    double q[8];
    const bool keep[8] = {false, true, false, true, false, true, false, false};
    draw(s, lg, 8, 20000, count);
    softmax(lg, 8, 1.0, keep, q);
    expect_binomial(count, q, 8, 20000, "top_k 3");
    rk_sampler_destroy(s);
}

/* Probabilities 1/2, 1/4, 1/8, 1/16, 1/16 (logits = log p). top-p keeps the smallest
 * prefix (by probability) whose mass reaches p: 0.7 -> {0, 1} (0.5 < 0.7 <= 0.75),
 * 0.8 -> {0, 1, 2} (0.75 < 0.8 <= 0.875). min-p keeps p_i >= min_p * p_max:
 * 0.2 -> floor 0.1 -> {0, 1, 2}; 0.3 -> floor 0.15 -> {0, 1}; 0.1 -> floor 0.05 -> all. */
Test(sampler, top_p_and_min_p_keep_exactly_the_predicted_sets) {
    const float lg[5] = {logf(0.5f), logf(0.25f), logf(0.125f), logf(0.0625f), logf(0.0625f)};
    const struct {
        float top_p, min_p;
        bool keep[5];
    } cases[] = {
        {0.7f, 0.0f, {true, true, false, false, false}},  {0.8f, 0.0f, {true, true, true, false, false}},
        {0.4f, 0.0f, {true, false, false, false, false}}, {1.0f, 0.2f, {true, true, true, false, false}},
        {1.0f, 0.3f, {true, true, false, false, false}},  {1.0f, 0.1f, {true, true, true, true, true}},
        {0.8f, 0.3f, {true, true, false, false, false}}, /* both: the intersection */
    };
    const int N = 20000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_sampler_params p = plain(1.0f, 200 + c);
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        rk_sampler *s = make(p, 5);
        int count[5];
        double q[5];
        draw(s, lg, 5, N, count);
        softmax(lg, 5, 1.0, cases[c].keep, q);
        char what[64];
        snprintf(what, sizeof what, "top_p %.2f min_p %.2f", (double)cases[c].top_p, (double)cases[c].min_p);
        expect_binomial(count, q, 5, N, what);
        rk_sampler_destroy(s);
    }
}

/* llama.cpp's rule: each distinct id among the last repeat_last_n tokens once: a positive
 * logit is divided by the penalty, a non-positive one multiplied. */
Test(sampler, repetition_penalty_follows_llama_cpp) {
    rk_sampler_params p = plain(0.0f, 1);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 64;
    rk_sampler *s = make(p, 6);
    float lg[6] = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, 2.5f};
    const int32_t hist[] = {0, 1, 1, 3, 4, 4, 4};
    cr_expect_eq(rk_sampler_sample(s, lg, hist, 7), 5, "4 (3 -> 1.5) falls below 5 (2.5)");
    const float want[6] = {1.0f, -2.0f, 0.5f, 0.0f, 1.5f, 2.5f};
    for (int i = 0; i < 6; i++) cr_expect_eq(lg[i], want[i], "logit %d: %g vs %g", i, (double)lg[i], (double)want[i]);
    rk_sampler_destroy(s);
    /* only the last repeat_last_n tokens count */
    p.repeat_last_n = 2;
    s = make(p, 6);
    float lg2[6] = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, 2.5f};
    const int32_t hist2[] = {0, 1, 2, 5};
    rk_sampler_sample(s, lg2, hist2, 4);
    const float want2[6] = {2.0f, -1.0f, 0.25f, 0.0f, 3.0f, 1.25f};
    for (int i = 0; i < 6; i++) cr_expect_eq(lg2[i], want2[i], "window: logit %d: %g", i, (double)lg2[i]);
    rk_sampler_destroy(s);
    /* repeat_last_n 0 and penalty 1 both leave the logits alone; ids outside the vocab
     * in the history are ignored */
    p.repeat_last_n = 0;
    s = make(p, 6);
    float lg3[6] = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, 2.5f};
    const int32_t hist3[] = {0, 1, -4, 99};
    rk_sampler_sample(s, lg3, hist3, 4);
    cr_expect(lg3[0] == 2.0f && lg3[1] == -1.0f);
    rk_sampler_destroy(s);
    p.repeat_last_n = 64;
    p.repeat_penalty = 1.0f;
    s = make(p, 6);
    rk_sampler_sample(s, lg3, hist3, 4);
    cr_expect(lg3[0] == 2.0f && lg3[1] == -1.0f);
    rk_sampler_destroy(s);
    p.repeat_penalty = 2.0f;
    s = make(p, 6);
    rk_sampler_sample(s, lg3, hist3, 4);
    cr_expect(lg3[0] == 1.0f && lg3[1] == -2.0f && lg3[2] == 0.5f, "%g %g %g", (double)lg3[0], (double)lg3[1],
              (double)lg3[2]);
    rk_sampler_destroy(s);
}

/* With the penalty on, sampling draws from softmax of the penalised logits. */
Test(sampler, penalised_frequencies_follow_the_penalised_softmax) {
    const float lg[4] = {1.0f, 1.0f, -0.5f, 0.0f};
    rk_sampler_params p = plain(1.0f, 300);
    p.repeat_penalty = 1.5f;
    rk_sampler *s = make(p, 4);
    const int32_t hist[] = {0, 2};
    const float pen[4] = {1.0f / 1.5f, 1.0f, -0.75f, 0.0f};
    int count[4] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        float cp[4];
        memcpy(cp, lg, sizeof lg);
        count[rk_sampler_sample(s, cp, hist, 2)]++;
    }
    double q[4];
    softmax(pen, 4, 1.0, NULL, q);
    expect_binomial(count, q, 4, N, "penalty 1.5");
    rk_sampler_destroy(s);
}

Test(sampler, bad_parameters_are_refused) {
    rk_sampler_params p = plain(1.0f, 1);
    rk_sampler *s = NULL;
    rk_err e = {0};
    cr_expect_eq(rk_sampler_create(&p, 0, &s, &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_sampler_create(&p, -3, &s, &e), RK_E_INVALID_ARG);
    p.repeat_penalty = 0.0f;
    cr_expect_eq(rk_sampler_create(&p, 8, &s, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "penalty"), "%s", e.msg);
    p.repeat_penalty = NAN;
    cr_expect_eq(rk_sampler_create(&p, 8, &s, &e), RK_E_INVALID_ARG);
    cr_expect_null(s);
    rk_sampler_destroy(NULL);
}

/* Defaults as documented (llama.cpp's common defaults). */
Test(sampler, defaults) {
    rk_sampler_params p = rk_sampler_params_default();
    cr_expect_float_eq(p.temp, 0.8f, 1e-7);
    cr_expect_eq(p.top_k, 40);
    cr_expect_float_eq(p.top_p, 0.95f, 1e-7);
    cr_expect_float_eq(p.min_p, 0.05f, 1e-7);
    cr_expect_eq(p.repeat_penalty, 1.0f);
    cr_expect_eq(p.repeat_last_n, 64);
    cr_expect_eq(p.frequency_penalty, 0.0f);
    cr_expect_eq(p.presence_penalty, 0.0f);
    /* DRY on (docs/JSONL.md: the loop guard of the default model), on the answer only */
    cr_expect_float_eq(p.dry_multiplier, 0.8f, 1e-7);
    cr_expect_float_eq(p.dry_base, 1.75f, 1e-7);
    cr_expect_eq(p.dry_allowed_length, 2);
    cr_expect_eq(p.dry_penalty_last_n, -1);
    cr_expect(!p.penalize_prompt);
}

/* Filled RidgeFill rows carry NaN logits; a NaN never wins the draw when sampling.
 * (Found by this test: greedy used to start its argmax at a NaN id 0.) */
Test(sampler, nan_logits_are_never_picked) {
    float lg[4] = {NAN, 1.0f, 3.0f, NAN};
    rk_sampler *s = make(plain(0.0f, 1), 4);
    cr_expect_eq(rk_sampler_sample(s, lg, NULL, 0), 2, "greedy");
    rk_sampler_destroy(s);
    s = make(plain(1.0f, 1), 4);
    int count[4];
    draw(s, lg, 4, 2000, count);
    cr_expect(count[0] == 0 && count[3] == 0, "NaN drawn %d / %d times", count[0], count[3]);
    rk_sampler_destroy(s);
}

/* llama.cpp's default chain applies top-k, top-p and min-p to the raw logits and the
 * temperature last (common_sampler: ... top_k, typ_p, top_p, min_p, xtc, temperature,
 * dist). With p = (1/2, 1/4, 1/8, 1/16, 1/16) and top_p 0.7 that keeps {0, 1} at any
 * temperature, then draws them in proportion exp(l / T): at T = 2, sqrt(1/2) : sqrt(1/4). */
/* (Found by this test: the temperature used to be applied before top-p / min-p, keeping
 * {0, 1, 2} here.) */
Test(sampler, top_p_before_temperature_as_llama_cpp) {
    const float lg[5] = {logf(0.5f), logf(0.25f), logf(0.125f), logf(0.0625f), logf(0.0625f)};
    rk_sampler_params p = plain(2.0f, 77);
    p.top_p = 0.7f;
    rk_sampler *s = make(p, 5);
    int count[5];
    double q[5];
    const bool keep[5] = {true, true, false, false, false};
    draw(s, lg, 5, 20000, count);
    softmax(lg, 5, 2.0, keep, q);
    expect_binomial(count, q, 5, 20000, "top_p 0.7 at temp 2");
    rk_sampler_destroy(s);
}

/* OpenAI's frequency and presence penalties over the repeat_last_n window, after the
 * repeat penalty: logit -= count * f + [count > 0] * p, each id once. */
Test(sampler, frequency_and_presence_penalties) {
    rk_sampler_params p = plain(0.0f, 1);
    p.repeat_last_n = 5;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.repeat_penalty = 2.0f;
    rk_sampler *s = make(p, 6);
    float lg[6] = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, 2.5f};
    /* window: the last 5 ids {1, 4, 4, 4, 2}; id 0 is outside it */
    const int32_t hist[] = {0, 0, 1, 4, 4, 4, 2};
    rk_sampler_penalize(s, lg, hist, 7);
    const float want[6] = {2.0f, -1.0f * 2.0f - 0.5f - 0.25f, 0.25f - 0.5f - 0.25f, 0.0f, 1.5f - 1.5f - 0.25f, 2.5f};
    for (int i = 0; i < 6; i++)
        cr_expect_float_eq(lg[i], want[i], 1e-6, "logit %d: %g vs %g", i, (double)lg[i], (double)want[i]);
    rk_sampler_destroy(s);
}

/* DRY as llama.cpp: history "7 1 2 3 4 ... 1 2 3" ends with the 3-token repeat 1 2 3,
 * which was followed by 4: 4 loses multiplier * base^(3 - allowed); with allowed 2 that is
 * 0.8 * 1.75. The token after the shorter repeat "2 3" elsewhere (5 below) loses
 * 0.8 * 1.75^0; repeats shorter than allowed (the lone 3 before 6) go free. */
Test(sampler, dry_penalty_is_multiplier_times_base_to_the_excess) {
    rk_sampler_params p = plain(0.0f, 1);
    p.dry_multiplier = 0.8f;
    p.dry_base = 1.75f;
    p.dry_allowed_length = 2;
    p.dry_penalty_last_n = -1;
    const int32_t nv = 10;
    rk_sampler *s = make(p, nv);
    const int32_t hist[] = {7, 1, 2, 3, 4, 9, 2, 3, 5, 8, 3, 6, 0, 1, 2, 3};
    const size_t n = sizeof hist / sizeof hist[0];
    float lg[10];
    for (int i = 0; i < nv; i++) lg[i] = 1.0f;
    rk_sampler_penalize(s, lg, hist, n);
    for (int i = 0; i < nv; i++) {
        const double want = i == 4 ? 1.0 - 0.8 * 1.75 : i == 5 ? 1.0 - 0.8 : 1.0;
        cr_expect(fabs(lg[i] - want) < 1e-6, "token %d: %g vs %g", i, (double)lg[i], want);
    }
    /* a longer constructed repeat: a period-5 loop repeated; the suffix matches 2 periods + 3 */
    float lg2[10];
    for (int i = 0; i < nv; i++) lg2[i] = 0.0f;
    int32_t loop[18];
    for (int i = 0; i < 18; i++) loop[i] = 1 + i % 5; /* 1 2 3 4 5 1 2 3 4 5 ... ends with 3 */
    rk_sampler_penalize(s, lg2, loop, 18);
    /* the latest earlier 3 is at 12, its match runs back to the start: 13 tokens; the next token is 4 */
    const double want4 = -0.8 * pow(1.75, 13 - 2);
    cr_expect(fabs(lg2[4] - want4) < 1e-3 * fabs(want4), "token 4: %g vs %g", (double)lg2[4], want4);
    for (int i = 0; i < nv; i++)
        if (i != 4) cr_expect_eq(lg2[i], 0.0f, "token %d untouched", i);
    rk_sampler_destroy(s);
}

/* A breaker ends the repeat: with 9 a breaker, "9 2 3" cannot match across 9, so the
 * history's suffix stops at it and only shorter repeats count. */
Test(sampler, dry_sequence_breakers_cut_the_match) {
    rk_sampler_params p = plain(0.0f, 1);
    p.dry_multiplier = 1.0f;
    p.dry_base = 2.0f;
    p.dry_allowed_length = 2;
    rk_sampler *s = make(p, 10);
    rk_err e = {0};
    const int32_t brk[] = {9};
    cr_assert_eq(rk_sampler_set_dry_breakers(s, brk, 1, &e), RK_OK, "%s", e.msg);
    /* without the breaker the suffix 9 1 2 would match 3 long before 5 */
    const int32_t hist[] = {9, 1, 2, 5, 0, 9, 1, 2};
    float lg[10] = {0};
    rk_sampler_penalize(s, lg, hist, 8);
    cr_expect(fabs(lg[5] - -1.0) < 1e-6, "5: a 2-token repeat (1 2), 1 * 2^0: %g", (double)lg[5]);
    /* a history ending with a breaker has no repeat to extend */
    const int32_t hist2[] = {1, 2, 9, 1, 2, 9};
    float lg2[10] = {0};
    rk_sampler_penalize(s, lg2, hist2, 6);
    for (int i = 0; i < 10; i++) cr_expect_eq(lg2[i], 0.0f, "token %d", i);
    /* a breaker token itself is never penalised */
    const int32_t hist3[] = {1, 2, 9, 4, 1, 2};
    float lg3[10] = {0};
    rk_sampler_penalize(s, lg3, hist3, 6);
    cr_expect_eq(lg3[9], 0.0f, "breaker 9: %g", (double)lg3[9]);
    const int32_t bad[] = {10};
    cr_expect_eq(rk_sampler_set_dry_breakers(s, bad, 1, &e), RK_E_INVALID_ARG);
    rk_sampler_destroy(s);
    /* the window: with dry_penalty_last_n 4 the early occurrence is out of sight */
    p.dry_penalty_last_n = 4;
    s = make(p, 10);
    const int32_t hist4[] = {1, 2, 3, 7, 8, 0, 1, 2};
    float lg4[10] = {0};
    rk_sampler_penalize(s, lg4, hist4, 8);
    cr_expect_eq(lg4[3], 0.0f, "outside the window: %g", (double)lg4[3]);
    rk_sampler_destroy(s);
    s = make((p.dry_penalty_last_n = -1, p), 10);
    float lg5[10] = {0};
    rk_sampler_penalize(s, lg5, hist4, 8);
    cr_expect(fabs(lg5[3] - -1.0) < 1e-6, "inside: %g", (double)lg5[3]);
    rk_sampler_destroy(s);
}

Test(sampler, dry_parameters_are_checked) {
    rk_sampler_params p = plain(1.0f, 1);
    rk_sampler *s = NULL;
    rk_err e = {0};
    p.dry_multiplier = 0.5f;
    p.dry_base = 1.0f;
    cr_expect_eq(rk_sampler_create(&p, 8, &s, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "DRY base"), "%s", e.msg);
    p.dry_base = 1.75f;
    p.dry_allowed_length = 0;
    cr_expect_eq(rk_sampler_create(&p, 8, &s, &e), RK_E_INVALID_ARG);
    p.dry_allowed_length = 2;
    p.dry_multiplier = -1.0f;
    cr_expect_eq(rk_sampler_create(&p, 8, &s, &e), RK_E_INVALID_ARG);
    p.dry_multiplier = 0.0f;
    p.frequency_penalty = INFINITY;
    cr_expect_eq(rk_sampler_create(&p, 8, &s, &e), RK_E_INVALID_ARG);
    cr_expect_null(s);
}
