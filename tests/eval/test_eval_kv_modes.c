/* `ridgekv eval needle --kv-modes` (the needle line for KV policies): the list's
 * parsing in the eval library, the flags it refuses, a paired run on the tiny stories260K
 * model (a repeated policy answers as the reference, another policy does not), and the
 * results file's header refusing a file of other KV modes (suite cli). */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_eval.h"
#include "eval_test_util.h"
#include "tb.h"

Test(eval_kv, list_items_parse_into_modes) {
    const char *items[] = {"f16", "lowram:budget=1024,window=64", "q8", "f16"};
    ev_modes m = {.fill = {.tail = 700}};
    rk_err e = {0};
    cr_assert_eq(ev_parse_kv_modes(items, 4, &m, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(m.n, 4, "every item is a mode, the repeat included");
    cr_expect(m.by_kv);
    cr_expect_eq(m.fill.tail, 700, "the common fill (its tail places the needle) is left as it was");
    cr_expect_str_eq(ev_modes_label(&m, 0), "f16");
    cr_expect_str_eq(ev_modes_label(&m, 1), "lowram:budget=1024,window=64");
    cr_expect_str_eq(ev_modes_label(&m, 2), "q8");
    cr_expect_str_eq(ev_modes_label(&m, 3), "f16#2", "a repeat is told apart: answers are keyed by label");
    cr_expect(m.kv[0].kind == RK_KV_F16 && m.kv[1].kind == RK_KV_LOWRAM && m.kv[2].kind == RK_KV_Q8 &&
              m.kv[3].kind == RK_KV_F16);
    cr_expect(m.kv[1].lowram.budget == 1024 && m.kv[1].lowram.window == 64, "budget %d window %d",
              (int)m.kv[1].lowram.budget, (int)m.kv[1].lowram.window);
    for (int mi = 0; mi < 4; mi++) {
        rk_fill_params f;
        ev_modes_params(&m, mi, &f);
        cr_expect(f.mode == RK_FILL_OFF && f.tail == 700, "mode %d: fill off", mi);
    }
    /* refused, naming the item */
    const char *bad[][2] = {{"f16", "q3"}, {"f16", "lowram:bogus=1"}, {"f16", "lowram:window=x"}};
    for (int i = 0; i < 3; i++) {
        e = (rk_err){0};
        ev_modes b = {0};
        cr_expect_eq(ev_parse_kv_modes(bad[i], 2, &b, &e), RK_E_INVALID_ARG, "%s accepted", bad[i][1]);
        cr_expect(strstr(e.msg, "--kv-modes") && strstr(e.msg, bad[i][1]), "%s: %s", bad[i][1], e.msg);
        cr_expect_eq(b.n, 0, "*out untouched on failure");
    }
    const char *nine[] = {"f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16"};
    cr_expect_eq(ev_parse_kv_modes(nine, EV_MAX_MODES + 1, &m, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "at most"), "%s", e.msg);
    cr_expect_eq(ev_parse_kv_modes(nine, 0, &m, &e), RK_E_INVALID_ARG, "an empty list");
}

static tb_result run(const char *args) { return et_run(args); }

/* Refused before any model is loaded: a flag that picks a fill mode or one policy, a bad item. */
Test(eval_kv, flags_that_do_not_go_with_kv_modes) {
    const char *args[] = {"eval needle --kv-modes f16,q8 --fill off,identity --split 2",
                          "eval needle --kv-modes f16,q8 --ridgefill maps.gguf",
                          "eval needle --kv-modes f16,q8 --split 2",
                          "eval needle --kv-modes f16,q8 --kv q4",
                          "eval needle --kv-modes f16,q3",
                          "eval needle --kv-modes f16,lowram:window=32,bogus=2"};
    const char *why[][2] = {{"--fill", "--kv-modes"},  {"--ridgefill", "--kv-modes"},
                            {"--split", "--kv-modes"}, {"--kv ", "--kv-modes"},
                            {"q3", "--kv-modes"},      {"bogus", "lowram:window=32,bogus=2"}};
    for (int i = 0; i < 6; i++) {
        tb_result r = run(args[i]);
        cr_expect_eq(r.code, 2, "%s: exit %d", args[i], r.code);
        cr_expect(strstr(r.err, why[i][0]) && strstr(r.err, why[i][1]), "%s: %s", args[i], r.err);
        tb_result_free(&r);
    }
    tb_result r = run("eval needle --help");
    cr_expect_eq(r.code, 0);
    cr_expect(strstr(r.out, "--kv-modes") && strstr(r.out, "3072") && strstr(r.out, "4096"), "%s", r.out);
    tb_result_free(&r);
}


static int get_int(json_object *o, const char *k) {
    json_object *v = json_object_object_get(o, k);
    cr_assert(v, "no %s", k);
    return json_object_get_int(v);
}

static const char *answer(json_object *trial, const char *mode) {
    json_object *a = json_object_object_get(json_object_object_get(trial, "answers"), mode);
    cr_assert(a, "trial without mode %s", mode);
    return json_object_get_string(json_object_object_get(a, "answer"));
}

static bool need_tiny(char *sp, size_t cap) {
    char c[1024];
    if (!tb_shared_path(sp, cap, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(c, sizeof c, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", c);
    return true;
}

/* Paired on the same prompts, one session per policy: the repeated reference answers as
 * the reference in every trial (b = c = 0), while q4 answers differently in some trial,
 * so that equal answers are not what any two modes give. lowram:start=0 compresses on
 * this short prompt; its comma-separated options stay one item. */
Test(eval_kv, a_repeated_policy_answers_as_the_reference) {
    char sp[1024], args[2048];
    need_tiny(sp, sizeof sp);
    snprintf(args, sizeof args,
             "eval needle -m '%s' --ctx-overflow-ok --kv-modes f16,f16,lowram:start=0,window=32,q4 --lengths 1024 "
             "--depths 0.3,0.7 --trials 4 --gen 4 -t 1 --json",
             sp);
    tb_result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out);
    cr_assert(j, "%s", r.out);
    json_object *kv = json_object_object_get(j, "kv_modes");
    const char *want[] = {"f16", "f16#2", "lowram:start=0,window=32", "q4"};
    cr_assert_eq(json_object_array_length(kv), 4u);
    for (int i = 0; i < 4; i++) {
        cr_expect_str_eq(json_object_get_string(json_object_array_get_idx(kv, (size_t)i)), want[i]);
        cr_expect_eq(get_int(et_mode_obj(j, want[i]), "n"), 4, "%s: every trial", want[i]);
    }
    json_object *twin = et_mode_obj(j, "f16#2");
    cr_expect(get_int(twin, "b") == 0 && get_int(twin, "c") == 0, "f16#2: b %d c %d", get_int(twin, "b"),
              get_int(twin, "c"));
    cr_expect_eq(get_int(twin, "correct"), get_int(et_mode_obj(j, "f16"), "correct"));
    json_object *tr = json_object_object_get(j, "trial_results");
    cr_assert_eq(json_object_array_length(tr), 4u);
    int q4_differs = 0;
    for (size_t t = 0; t < 4; t++) {
        json_object *tj = json_object_array_get_idx(tr, t);
        cr_expect_str_eq(answer(tj, "f16#2"), answer(tj, "f16"), "trial %zu", t);
        q4_differs += strcmp(answer(tj, "q4"), answer(tj, "f16")) != 0;
        answer(tj, "lowram:start=0,window=32");
    }
    cr_expect(q4_differs > 0, "q4 answers as f16 in every trial: the sessions may not be the modes' own");
    json_object_put(j);
    tb_result_free(&r);
}


/* --results with --kv-modes: the header holds the policies; other ones are refused naming
 * kv_modes and the file is left alone; the same ones resume. */
Test(eval_kv, results_file_refuses_other_kv_modes) {
    char sp[1024], args[4096], dir[] = "/tmp/rk_needle_kv_XXXXXX", path[1100];
    need_tiny(sp, sizeof sp);
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/kv.jsonl", dir);
    const char *base = "eval needle -m '%s' --ctx-overflow-ok --kv-modes %s --lengths 1024 --depths 0.5 --gen 4 -t 1 "
                       "--json --trials %d --results '%s'";
    snprintf(args, sizeof args, base, sp, "f16,q8", 1, path);
    tb_result r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    cr_expect_eq(et_count_lines(path), 2, "header + 1 trial");
    snprintf(args, sizeof args, base, sp, "f16,q4", 2, path);
    r = run(args);
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "other settings") && strstr(r.err, "kv_modes") && strstr(r.err, "q4"), "%s", r.err);
    tb_result_free(&r);
    cr_expect_eq(et_count_lines(path), 2, "nothing appended");
    snprintf(args, sizeof args, base, sp, "f16,q8", 2, path);
    r = run(args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "2 trials (1 new in this run)"), "%s", r.err);
    json_object *j = json_tokener_parse(r.out);
    cr_assert(j, "%s", r.out);
    json_object *t0 = json_object_array_get_idx(json_object_object_get(j, "trial_results"), 0);
    cr_assert(t0);
    answer(t0, "f16"), answer(t0, "q8"); /* the file's trial, keyed by the policies */
    json_object_put(j);
    tb_result_free(&r);
    cr_expect_eq(et_count_lines(path), 3);
    unlink(path), rmdir(dir);
}
