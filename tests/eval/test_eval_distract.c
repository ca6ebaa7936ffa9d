/* `ridgekv eval needle --distractors N`: the prompts hold the needle and N other facts of the
 * same form where the run says (ev_needle_run's on_prompt, checked token by token), answers
 * are classified against every key, and the results file records and checks them
 * (stories260K; skips without ../shared). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval_test_util.h"
#include "rk_eval.h"

#define N_TRIALS 12
#define LEN 2048

typedef struct prompts {
    int32_t *ids[N_TRIALS];
    size_t n[N_TRIALS];
} prompts;

static void keep_prompt(void *ud, int t, const int32_t *ids, size_t n) {
    prompts *p = ud;
    cr_assert(t >= 0 && t < N_TRIALS);
    p->ids[t] = malloc(n * sizeof *ids);
    memcpy(p->ids[t], ids, n * sizeof *ids);
    p->n[t] = n;
}

/* The text of prompt tokens [pos, pos + len). */
static void span_text(const rk_model *m, const int32_t *ids, int64_t pos, int64_t len, char *out, size_t cap) {
    size_t at = 0;
    out[0] = 0;
    for (int64_t i = pos; i < pos + len && at + 64 < cap; i++) {
        size_t k = rk_model_token_piece(m, ids[i], false, out + at, cap - at - 1);
        at += k < cap - at - 1 ? k : 0;
        out[at] = 0;
    }
}

/* Every sentence where the trial record says (exactly its wording's tokens with its key),
 * none overlapping another, all inside the bulk region; keys distinct; answers classified
 * against every key; distractor depths spread over the bulk region. */
Test(eval, distractors_sit_where_the_trial_says) {
    char sp[1024], c[1024];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(c, sizeof c, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", c);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(sp, &m, &e), RK_OK, "%s", e.msg);
    ev_corpus corp = {0};
    cr_assert_eq(ev_corpus_load(&corp, m, c, NULL, &e), RK_OK, "%s", e.msg);
    ev_needle_params p = {.n_lens = 1,
                          .lens = {LEN},
                          .n_depths = 3,
                          .depths = {0.1, 0.5, 0.9},
                          .n_trials = N_TRIALS,
                          .gen = 3,
                          .seed = 7,
                          .n_wordings = 4,
                          .n_distractors = 3};
    p.modes.n = 1;
    p.modes.mode[0] = RK_FILL_OFF;
    p.modes.fill.tail = 512;
    prompts pr = {0};
    p.on_prompt = keep_prompt, p.prompt_ud = &pr;
    int n_ctx = 0;
    cr_assert_eq(ev_needle_plan(m, &p, &n_ctx, &e), RK_OK, "%s", e.msg);
    rk_session_params sp_ = rk_session_params_default();
    sp_.n_ctx = n_ctx, sp_.n_threads = 2, sp_.ctx_overflow_ok = true;
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp_, &s, &e), RK_OK, "%s", e.msg);
    ev_needle_result r = {0};
    cr_assert_eq(ev_needle_run(m, &s, &corp, &p, &r, &e), RK_OK, "%s", e.msg);
    /* the wordings (eval_needle.c's sentences, the oracle here) */
    const char *sentence[EV_NEEDLE_WORDINGS] = {
        " The secret passkey is %d. Remember it.",
        " Note that the access code for the blue vault is %d.",
        " Important: the magic number you must remember is %d.",
        " The password of the server room is %d, and nobody else knows it.",
    };
    double depth_sum = 0;
    int n_d = 0;
    for (int t = 0; t < N_TRIALS; t++) {
        const ev_needle_trial *tr = &r.trials[t];
        cr_assert_eq(pr.n[t], (size_t)LEN, "trial %d: prompt of %zu tokens", t, pr.n[t]);
        cr_assert_eq(tr->n_distr, 3);
        int64_t pos[4] = {tr->needle_pos}, len[4] = {tr->needle_len};
        int key[4] = {tr->key}, wd[4] = {tr->wording};
        for (int d = 0; d < 3; d++)
            pos[d + 1] = tr->dpos[d], len[d + 1] = tr->dlen[d], key[d + 1] = tr->dkey[d], wd[d + 1] = tr->dwording[d];
        for (int i = 0; i < 4; i++) {
            char txt[512], want[160];
            span_text(m, pr.ids[t], pos[i], len[i], txt, sizeof txt);
            snprintf(want, sizeof want, sentence[wd[i]], key[i]);
            cr_expect(key[i] >= 10000 && key[i] <= 99999, "trial %d: key %d", t, key[i]);
            int32_t *ids = NULL;
            size_t n = 0;
            cr_assert_eq(rk_model_tokenize(m, want, strlen(want), false, false, &ids, &n, &e), RK_OK, "%s", e.msg);
            cr_expect(n == (size_t)len[i] && !memcmp(ids, pr.ids[t] + pos[i], n * sizeof *ids),
                      "trial %d sentence %d at %lld: '%s', not '%s'", t, i, (long long)pos[i], txt, want);
            free(ids);
            cr_expect(pos[i] > 0 && pos[i] + len[i] <= tr->bulk_end,
                      "trial %d sentence %d: [%lld, %lld) past bulk %lld", t, i, (long long)pos[i],
                      (long long)(pos[i] + len[i]), (long long)tr->bulk_end);
            for (int k = 0; k < i; k++) {
                cr_expect(key[k] != key[i] && wd[k] != wd[i], "trial %d: sentences %d and %d share a key or wording", t,
                          k, i);
                cr_expect(pos[k] + len[k] <= pos[i] || pos[i] + len[i] <= pos[k],
                          "trial %d: sentences %d and %d overlap", t, k, i);
            }
            if (i) depth_sum += (double)pos[i] / (double)tr->bulk_end, n_d++;
        }
        /* the answer against every key: lured iff a distractor's key is in it; correct iff the
         * needle's is and no other */
        const char *ans = r.answers + (size_t)t * EV_ANSWER_BYTES;
        bool any_d = false;
        for (int d = 1; d < 4; d++) {
            char ks[16];
            snprintf(ks, sizeof ks, "%d", key[d]);
            any_d = any_d || strstr(ans, ks);
        }
        char k0[16];
        snprintf(k0, sizeof k0, "%d", key[0]);
        cr_expect_eq(r.lured[t], any_d, "trial %d: '%s' lured %d", t, ans, r.lured[t]);
        cr_expect_eq(r.correct[t], strstr(ans, k0) && !any_d, "trial %d: '%s' correct %d", t, ans, r.correct[t]);
        free(pr.ids[t]);
    }
    /* depths uniform over 0.05..0.95 of the room (mean 0.5, sd 0.26 each): the mean of 36 is
     * within 4 sd (0.17) of 0.5 unless the draw is biased (the room ends ~0.04 before bulk_end,
     * sentences shift later ones by < 0.04: both inside the bound) */
    cr_expect(fabs(depth_sum / n_d - 0.5) < 0.17, "mean distractor depth %.3f of the bulk region", depth_sum / n_d);
    ev_needle_result_free(&r);
    rk_session_destroy(s);
    ev_corpus_deinit(&corp);
    rk_model_destroy(m);
}

/* The CLI: the count bounded, recorded in the results file (another count refused by name),
 * resumed to the answers of one run, and reported per trial and per mode. */
Test(eval, distractors_in_the_results_file) {
    char sp[1024], c[1024], args[4096], dir[] = "/tmp/rk_needle_distr_XXXXXX", path[1100], res[1200];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(c, sizeof c, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", c);
    tb_result r = et_run("eval needle --split 2 --fill off,identity --distractors 4");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "--distractors"), "%s", r.err);
    tb_result_free(&r);
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/needle.jsonl", dir);
    snprintf(res, sizeof res, "--results '%s'", path);
    const char *base = "eval needle -m '%s' --ctx-overflow-ok --split 2 --fill identity,plumb --lengths 1024 "
                       "--depths 0.3,0.7 --gen 4 -t 1 --json --trials %d --distractors %d %s";
    snprintf(args, sizeof args, base, sp, 3, 2, "");
    r = et_run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *ref = json_tokener_parse(r.out);
    cr_assert(ref, "%s", r.out);
    tb_result_free(&r);
    cr_expect_eq(json_object_get_int(json_object_object_get(ref, "distractors")), 2);
    json_object *t0 = json_object_array_get_idx(json_object_object_get(ref, "trial_results"), 0);
    cr_expect_eq(json_object_array_length(json_object_object_get(t0, "distractors")), 2);
    cr_expect(json_object_object_get(et_mode_obj(ref, "off"), "lured"), "per-mode lured count");
    snprintf(args, sizeof args, base, sp, 2, 2, res);
    r = et_run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, base, sp, 3, 1, res);
    r = et_run(args);
    cr_expect_eq(r.code, 2, "another count on the same file");
    cr_expect(strstr(r.err, "other settings") && strstr(r.err, "distractors"), "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, base, sp, 3, 2, res);
    r = et_run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *got = json_tokener_parse(r.out);
    cr_assert(got, "%s", r.out);
    json_object *a = json_object_object_get(ref, "trial_results"), *b = json_object_object_get(got, "trial_results");
    cr_assert_eq(json_object_array_length(a), 3);
    cr_assert_eq(json_object_array_length(b), 3);
    for (size_t i = 0; i < 3; i++) {
        json_object *x = json_object_array_get_idx(a, i), *y = json_object_array_get_idx(b, i);
        const char *keys[] = {"key", "needle_pos", "distractors", "answers"};
        for (int k = 0; k < 4; k++) {
            char *sx =
                strdup(json_object_to_json_string_ext(json_object_object_get(x, keys[k]), JSON_C_TO_STRING_PLAIN));
            const char *sy = json_object_to_json_string_ext(json_object_object_get(y, keys[k]), JSON_C_TO_STRING_PLAIN);
            if (!strcmp(keys[k], "answers")) { /* prefill_s differs; the rest is compared */
                json_object *ax = json_object_object_get(x, "answers"), *ay = json_object_object_get(y, "answers");
                json_object_object_foreach(ax, mode, v) {
                    json_object *w = json_object_object_get(ay, mode);
                    const char *f[] = {"answer", "correct", "lured"};
                    for (int q = 0; q < 3; q++) {
                        char *fx = strdup(json_object_to_json_string(json_object_object_get(v, f[q])));
                        cr_expect_str_eq(fx, json_object_to_json_string(json_object_object_get(w, f[q])),
                                         "trial %zu mode %s %s", i, mode, f[q]);
                        free(fx);
                    }
                }
            } else cr_expect_str_eq(sx, sy, "trial %zu: %s", i, keys[k]);
            free(sx);
        }
    }
    json_object_put(got), json_object_put(ref);
    tb_result_free(&r);
    unlink(path), rmdir(dir);
}
